"""remat.nvfuser: the source form on CPU (structure, golden file, numerics through a stand-in nvFuser)."""

import itertools
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fake_nvfuser
import remat
from conftest import LLAMA_2, PYTHIA_2, traced
import remat.thunder  # noqa: F401  (Thunder, with remat's compat bridge)
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy
from remat.nvfuser import EmitError, NvFuserRegionCallable, build, definition_source, supported_kinds, tensor_descriptor

GOLDEN = Path(__file__).parent / "golden"
# tiny models on CPU, sequence 16 (conftest.traced; pythia and LLaMA are the 2-layer traces other files share)
FAMILIES = [
    PYTHIA_2,  # GPT-NeoX: LayerNorm, tanh-free GELU (erf), partial rotary
    LLAMA_2,  # RMSNorm, SwiGLU, grouped-query attention
    dict(name="gemma-2b", n_query_groups=1, intermediate_size=128, head_size=16, seq=16, device="cpu"),  # GeGLU (tanh)
    dict(name="phi-2", n_query_groups=4, intermediate_size=128, seq=16, device="cpu"),  # partial rotary, parallel residual
]


def regions_of(trace):
    return [b for b in trace.bound_symbols if b.sym.is_fusion]


@pytest.fixture(scope="module")
def family_traces():
    return {model["name"]: traced(**model) for model in FAMILIES}


def random_inputs(region, seed=0):
    generator = torch.Generator().manual_seed(seed)
    values = []
    for proxy in region.args:
        if isinstance(proxy, TensorProxy):
            dtype = dtypes.to_torch_dtype(proxy.dtype)
            shape = tuple(proxy.shape)
            if dtype.is_floating_point:
                values.append(torch.randn(shape, dtype=dtype, generator=generator))
            elif dtype == torch.bool:
                values.append(torch.randint(0, 2, shape, generator=generator).bool())
            else:
                values.append(torch.randint(0, 8, shape, generator=generator, dtype=dtype))
        else:
            values.append(proxy.value)
    return values


def test_source_structure_on_every_region(family_traces):
    for name, joint in family_traces.items():
        for fusion in (remat.FusionPolicy(), remat.FusionPolicy(linear=True, matmul=True)):
            res = remat.optimize(remat.fuse(joint, fusion), strict=True)
            for region in regions_of(res.trace):
                source = definition_source(region)
                compile(source, region.sym.name, "exec")  # valid Python
                tensor_inputs = [p for p in region.args if isinstance(p, TensorProxy)]
                assert source.count("fd.define_tensor(") == len(tensor_inputs)
                assert source.count("fd.add_output(") == len(region.output)
                assert f"def {region.sym.name}(fd: FusionDefinition)" in source
                assert "from nvfuser_direct import DataType, FusionDefinition" in source


def test_every_prim_remat_fuses_can_be_written():
    from remat.core.ops import NVFUSER_FUSIBLE_PRIMS

    missing = NVFUSER_FUSIBLE_PRIMS - supported_kinds() - {"shape"}
    # ``shape`` returns sizes (numbers), which nvFuser cannot output; Thunder declines it as well.
    assert not missing


def test_golden_definition():
    def norm_gelu(x, w):
        h = F.layer_norm(x, (8,), w)
        return F.gelu(h).sum()

    x = torch.randn(2, 4, 8)
    w = torch.randn(8, requires_grad=True)
    fused = remat.fuse(remat.training_trace(norm_gelu, x, w))
    source = definition_source(regions_of(fused)[0])
    path = GOLDEN / "layer_norm_gelu_forward.py"
    if os.environ.get("REMAT_UPDATE_GOLDEN"):
        path.write_text(source)
    assert source == path.read_text(), "emitted definition changed; rerun with REMAT_UPDATE_GOLDEN=1 if intended"


def test_emitted_definitions_compute_what_the_torch_reference_computes(family_traces, monkeypatch):
    fake_nvfuser.install(monkeypatch)
    checked = 0
    for name, joint in family_traces.items():
        for fusion in (remat.FusionPolicy(), remat.FusionPolicy(linear=True, matmul=True)):
            res = remat.optimize(remat.fuse(joint, fusion), strict=True)
            for region in regions_of(res.trace):
                inputs = random_inputs(region)
                expected = region._call_ctx[region.sym.name](*inputs)
                fd = build(region, [tensor_descriptor(a) if isinstance(a, torch.Tensor) else None for a in inputs])
                got = fd.execute(inputs)
                assert len(got) == len(expected)
                for a, b in zip(expected, got):
                    assert a.shape == b.shape and a.dtype == b.dtype, region.sym.name
                    scale = a.double().abs().max().item() or 1.0
                    # float division is written as multiplication by the reciprocal (as Thunder does)
                    assert (a.double() - b.double()).abs().max().item() / scale < 1e-5, region.sym.name
                checked += 1
    assert checked > 40


def test_region_falls_back_to_torch_when_nvfuser_rejects_it(family_traces, monkeypatch):
    module = fake_nvfuser.install(monkeypatch)

    class Rejecting(module.FusionDefinition):
        def execute(self, inputs):
            raise RuntimeError("unsupported by this nvFuser")

    monkeypatch.setattr(module, "FusionDefinition", Rejecting)
    fused = remat.fuse(family_traces["pythia-14m"])
    region = regions_of(fused)[0]
    reference = region._call_ctx[region.sym.name]
    callable_ = NvFuserRegionCallable(region, fallback=reference)
    inputs = random_inputs(region)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out1 = callable_(*inputs)
        out2 = callable_(*inputs)
    assert len(caught) == 1 and region.sym.name in str(caught[0].message)
    for a, b in zip(out1, reference(*inputs)):
        torch.testing.assert_close(a, b)
    assert out2 is not None and callable_.failed


def test_bad_input():
    with pytest.raises(TypeError, match="fusion region"):
        definition_source(object.__new__(type("B", (), {"sym": type("S", (), {"name": "x", "is_fusion": False})()})))


def test_unsupported_op_is_an_emit_error(family_traces):
    from remat.thunder.regions import default_region_executor, make_region

    joint = family_traces["pythia-14m"]
    sdpa = next(b for b in joint.bound_symbols if b.sym.name == "remat_sdpa_fwd")
    region = make_region(default_region_executor(), "nvFusion99", [sdpa], list(sdpa.flat_proxy_args), list(sdpa.flat_proxy_outs))
    with pytest.raises(EmitError, match="remat_sdpa_fwd"):
        definition_source(region)


def test_build_without_nvfuser_is_a_clear_error(family_traces):
    if remat.nvfuser.version() is not None:
        pytest.skip("nvFuser is installed here")
    region = regions_of(remat.fuse(family_traces["pythia-14m"]))[0]
    with pytest.raises(remat.RematError, match="not installed"):
        build(region)
    assert re.search(r"fd\.ops\.\w+\(", definition_source(region))


def test_a_random_region_never_falls_back_to_torch(monkeypatch):
    """Found by tests/test_gpu.py: nvFuser's philox numbers are not torch's, so a dropout mask drawn by
    nvFuser in one region and recomputed by torch in another (after a per-region fallback) would differ.
    A region drawing uniform_philox that nvFuser rejects raises instead of falling back."""
    from thunder.core import devices, dtypes, prims
    from thunder.core.trace import TraceCtx, tracectx

    from remat.thunder.regions import default_region_executor, make_region

    module = fake_nvfuser.install(monkeypatch)

    class Rejecting(module.FusionDefinition):
        def execute(self, inputs):
            raise RuntimeError("unsupported by this nvFuser")

    monkeypatch.setattr(module, "FusionDefinition", Rejecting)
    trace = TraceCtx(None)
    with tracectx(trace):
        mask = prims.uniform_philox((4, 4), 0.0, 1.0, device=devices.Device("cpu"), dtype=dtypes.float32, seed=7, offset=0)
    region = make_region(default_region_executor(), "nvFusion0", list(trace.bound_symbols), [], [mask])
    callable_ = NvFuserRegionCallable(region, fallback=lambda *args: pytest.fail("fell back to torch"))
    with pytest.raises(remat.RematError, match="uniform_philox"):
        callable_()


def test_regions_of_identical_layers_share_one_definition(family_traces, monkeypatch):
    """Compile time (issue 18): a region whose definition equals another's up to proxy names reuses
    that region's FusionDefinition, so nvFuser compiles the kernels of identical layers once."""
    fake_nvfuser.install(monkeypatch)
    from remat.thunder import nvfuser as emit

    res = remat.optimize(family_traces[LLAMA_2["name"]], strict=True)
    regions = regions_of(res.trace)
    keys = [emit.definition_key(region) for region in regions]
    # the canonical text names no proxy, so regions differ in it only by what they compute
    for region, key in zip(regions, keys):
        for proxy in region.args:
            assert not re.search(rf"\b{re.escape(proxy.name)}\b", key), (region.sym.name, proxy.name)
    callables = [NvFuserRegionCallable(region, fallback=region._call_ctx[region.sym.name]) for region in regions]
    for region, callable_ in zip(regions, callables):
        inputs = random_inputs(region)
        for a, b in zip(callable_(*inputs), region._call_ctx[region.sym.name](*inputs)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    distinct = len(set(keys))
    assert emit.shared_definitions() == distinct < len(regions)  # two identical layers: shared
    for (i, a), (j, b) in itertools.combinations(enumerate(callables), 2):
        (fd_a,), (fd_b,) = a.definitions.values(), b.definitions.values()
        assert (fd_a is fd_b) == (keys[i] == keys[j]), (regions[i].sym.name, regions[j].sym.name)
    # the readable script still names the proxies
    assert regions[0].args[0].name in definition_source(regions[0])


def test_a_different_layout_or_constant_gets_its_own_definition(monkeypatch):
    fake_nvfuser.install(monkeypatch)
    from remat.thunder import nvfuser as emit

    def scaled(factor):
        def f(x, w):
            return (torch.tanh(x * factor) * w).sum()

        return f

    x = torch.randn(4, 8)
    w = torch.randn(8, requires_grad=True)

    def first_region(factor):
        return regions_of(remat.fuse(remat.training_trace(scaled(factor), x, w)))[0]

    twice, twice_again, thrice = first_region(2.0), first_region(2.0), first_region(3.0)
    assert emit.definition_key(twice) == emit.definition_key(twice_again)
    assert emit.definition_key(twice) != emit.definition_key(thrice)  # constants are part of the definition
    transposed = [((True, True), (0, 1)) if isinstance(p, TensorProxy) and len(p.shape) == 2 else None for p in twice.args]
    assert emit.definition_key(twice) != emit.definition_key(twice, transposed)  # so is the input layout
    assert emit.shared_build(twice) is emit.shared_build(twice_again)
    assert emit.shared_build(thrice) is not emit.shared_build(twice)
    emit.clear_shared_definitions()
    assert emit.shared_definitions() == 0
