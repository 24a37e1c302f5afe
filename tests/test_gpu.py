"""GPU tests: remat's nvFuser emitter on real nvFuser, and ``remat.jit`` on CUDA against eager PyTorch.

Every test carries the ``gpu`` marker; ``tests/conftest.py`` skips them where there is no CUDA device or
no nvFuser (``nvfuser_direct``), so a CPU run reports them skipped.  How to run them on the GPU machine,
and the last counts: docs/testing.md ("GPU tests").

1. Every op kind the emitter supports (``remat.nvfuser.supported_kinds()``): a small region per recipe in
   :data:`RECIPES`, built with ``remat.nvfuser.build`` and run by real nvFuser, against the same region run
   by the torch reference runtime (``remat.thunder.runtimes``).  The programs of tests/test_nvfuser.py (tiny
   LitGPT traces) cover only about a quarter of the kinds, so each kind has its own recipe here; the regions
   of two of those traces run as well.
2. ``remat.jit(runtime="nvfuser")`` end to end on a Llama-style and a GPT-NeoX (stablecode) LitGPT model:
   loss and gradients against eager, every region run by nvFuser (none fell back to torch).
3. kv-cache decode: LitGPT's prefill, then one token at a time, under ``remat.jit``; logits against eager.

Tolerances are choices, not measurements: nvFuser reorders float reductions and writes division by a
float as multiplication by the reciprocal (as Thunder does), so float results agree to rounding, not bit
for bit; integer and boolean results must be equal.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import remat
import remat.thunder  # noqa: F401  (remat's compat bridge, then Thunder: before any thunder import)
import thunder
from conftest import LLAMA_2, PYTHIA_2, traced, train_step
from remat.models import litgpt_model
from remat.nvfuser import NvFuserRegionCallable, build, supported_kinds, tensor_descriptor
from remat.thunder.read import op_kind
from remat.thunder.regions import default_region_executor, make_region
from test_nvfuser import random_inputs, regions_of
from thunder.core import devices, dtypes, prims
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, tracectx

pytestmark = pytest.mark.gpu

DEVICE = "cuda"

# relative error allowed (largest absolute difference over the largest reference magnitude, at least 1)
FLOAT_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}


# ------------------------------------------------------------------------------------------ region recipes


@dataclass(frozen=True)
class Input:
    """A region input: its shape, dtype and where its values lie.

    ``values``: ``"range"`` uniform in [low, high) (integers: ``randint(low, high)``); ``"whole"`` integer
    valued floats in [low, high) (ties, for comparisons); ``"nonzero"`` magnitude in [low, high) with a
    random sign (divisors)."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    low: float = -2.0
    high: float = 2.0
    values: str = "range"

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        if self.dtype == torch.bool:
            return torch.randint(0, 2, self.shape, generator=generator).bool()
        if not (self.dtype.is_floating_point or self.dtype.is_complex):
            magnitude = torch.randint(int(self.low), int(self.high), self.shape, generator=generator, dtype=self.dtype)
            if self.values == "nonzero":
                sign = torch.randint(0, 2, self.shape, generator=generator, dtype=self.dtype) * 2 - 1
                return magnitude * sign
            return magnitude
        if self.dtype.is_complex:
            parts = torch.rand(self.shape + (2,), generator=generator) * (self.high - self.low) + self.low
            return torch.view_as_complex(parts).to(self.dtype)
        x = torch.rand(self.shape, generator=generator, dtype=torch.float64) * (self.high - self.low) + self.low
        if self.values == "whole":
            x = x.floor()
        elif self.values == "nonzero":
            x = x * (torch.randint(0, 2, self.shape, generator=generator) * 2 - 1)
        return x.to(self.dtype)


@dataclass(frozen=True)
class Recipe:
    """A region to run: ``build(*input proxies, device)`` calls Thunder prims and returns the output
    proxy (or a tuple of them).  ``check``: how nvFuser's outputs are compared with the reference's
    (``"close"``; ``"random"`` and ``"philox"`` for the random-number kinds, see
    :func:`test_random_kind_on_nvfuser`)."""

    name: str
    inputs: tuple[Input, ...]
    build: Callable
    check: str = "close"
    reference: Callable | None = None  # torch on the inputs, where the torch reference runtime cannot run the prims


F = Input((3, 5, 8))  # a float32 tensor in [-2, 2)
F2 = Input((3, 5, 8), low=-1.0, high=1.0)
POSITIVE = Input((3, 5, 8), low=0.1, high=4.0)
WHOLE = Input((3, 5, 8), values="whole")  # integer-valued floats: comparisons see ties
DIVISOR = Input((3, 5, 8), low=0.5, high=3.0, values="nonzero")
INT = Input((3, 5, 8), torch.int32, -1000, 1000)
SHIFT = Input((3, 5, 8), torch.int32, 0, 8)
BOOL = Input((3, 5, 8), torch.bool)
COMPLEX = Input((3, 5, 8), torch.complex64)

# unary prims: the input range keeps each inside its domain (and away from poles)
UNARY_INPUTS = {
    **{name: F for name in "abs neg sign signbit ceil floor round trunc sin cos tanh atan asinh erf erfc isfinite".split()},
    **{name: Input((3, 5, 8), low=-3.0, high=3.0) for name in "sinh cosh exp exp2 expm1".split()},
    "tan": Input((3, 5, 8), low=-1.2, high=1.2),
    **{name: Input((3, 5, 8), low=-0.95, high=0.95) for name in "asin acos".split()},
    "atanh": Input((3, 5, 8), low=-0.9, high=0.9),
    "erfinv": Input((3, 5, 8), low=-0.9, high=0.9),
    "acosh": Input((3, 5, 8), low=1.1, high=4.0),
    "erfcinv": Input((3, 5, 8), low=0.1, high=1.9),
    "lgamma": Input((3, 5, 8), low=0.1, high=5.0),
    "reciprocal": DIVISOR,
    **{name: POSITIVE for name in "sqrt rsqrt log log10 log1p log2".split()},
    "bitwise_not": INT,
    "real": COMPLEX,
    "imag": COMPLEX,
}
BINARY_INPUTS = {
    **{name: (F, F) for name in "add sub mul atan2 maximum minimum nextafter".split()},
    **{name: (WHOLE, WHOLE) for name in "eq ne ge gt le lt".split()},
    **{name: (Input((3, 5, 8), low=-5.0, high=5.0), DIVISOR) for name in "fmod remainder".split()},
    "pow": (Input((3, 5, 8), low=0.1, high=3.0), F),
    **{name: (INT, INT) for name in "bitwise_and bitwise_or bitwise_xor".split()},
    "bitwise_left_shift": (Input((3, 5, 8), torch.int32, 0, 1000), SHIFT),
    "bitwise_right_shift": (INT, SHIFT),
}


def _device(proxy: TensorProxy) -> devices.Device:
    return proxy.device


def _recipes() -> list[Recipe]:
    recipes = [Recipe(name, (spec,), lambda a, name=name: getattr(prims, name)(a)) for name, spec in UNARY_INPUTS.items()]
    recipes += [Recipe(name, specs, lambda a, b, name=name: getattr(prims, name)(a, b)) for name, specs in BINARY_INPUTS.items()]
    f32 = dtypes.float32
    recipes += [
        Recipe("add(tensor, number)", (F,), lambda a: prims.add(a, 0.5)),  # a number becomes an nvFuser scalar
        Recipe("clone", (F,), lambda a: prims.clone(a)),
        Recipe("shallow_copy", (F,), lambda a: prims.shallow_copy(a)),  # an output that is an input: a copy
        Recipe("div", (F, DIVISOR), lambda a, b: prims.div(a, b)),  # a * reciprocal(b)
        Recipe("div(int)", (INT, Input((3, 5, 8), torch.int32, 1, 50, "nonzero")), lambda a, b: prims.div(a, b)),
        # Thunder 0.2.6's torch executor has no implementation of prims.lerp (only of torch.lerp), so the
        # torch reference runtime cannot run these regions: torch.lerp is the reference
        Recipe("lerp", (F, F, Input((3, 5, 8), low=0.0, high=1.0)), lambda a, b, w: prims.lerp(a, b, w), reference=torch.lerp),
        Recipe("lerp(number)", (F, F), lambda a, b: prims.lerp(a, b, 0.3), reference=lambda a, b: torch.lerp(a, b, 0.3)),
        Recipe("where", (BOOL, F, F), lambda p, a, b: prims.where(p, a, b)),
        Recipe("where(number)", (BOOL, F), lambda p, a: prims.where(p, a, 0.0)),
        Recipe("convert_element_type", (F,), lambda a: prims.convert_element_type(a, dtypes.bfloat16)),
        Recipe("convert_element_type(int)", (INT,), lambda a: prims.convert_element_type(a, f32)),
        Recipe("convert_element_type(bool)", (BOOL,), lambda a: prims.convert_element_type(a, f32)),
        Recipe("amax", (F,), lambda a: prims.amax(a, (1,))),
        Recipe("amin", (F,), lambda a: prims.amin(a, (0, 2))),
        Recipe("prod", (Input((3, 5, 8), low=0.8, high=1.2),), lambda a: prims.prod(a, (1,))),
        Recipe("sum", (F,), lambda a: prims.sum(a, (1,))),
        Recipe("sum(no dims)", (Input(()),), lambda a: prims.sum(a, ())),  # 0-dim: written as an alias, then a copy
        Recipe("var", (F,), lambda a: prims.var(a, (2,), correction=1)),
        Recipe("var_mean", (F,), lambda a: prims.var_mean(a, (2,), correction=0)),
        Recipe("broadcast_in_dim", (Input((8,)),), lambda a: prims.broadcast_in_dim(a, (3, 5, 8), (2,))),
        Recipe("broadcast_in_dim(size 1)", (Input((5, 1)),), lambda a: prims.broadcast_in_dim(a, (3, 5, 4), (1, 2))),
        Recipe("reshape", (F,), lambda a: prims.reshape(a, (15, 8))),
        Recipe("transpose", (F,), lambda a: prims.transpose(a, (2, 0, 1))),
        Recipe("transpose then reshape", (F,), lambda a: prims.reshape(prims.transpose(a, (1, 0, 2)), (5, 24))),
        Recipe("squeeze", (Input((3, 1, 8)),), lambda a: prims.squeeze(a, (1,))),
        Recipe("stride_order", (F,), lambda a: prims.stride_order(a, (1, 2, 0))),
        Recipe("slice", (F,), lambda a: prims.slice_prim(a, (0, 1, 2), (3, 4, 8))),
        Recipe("cat", (F, Input((3, 2, 8))), lambda a, b: prims.cat([a, b], 1)),
        Recipe("pad", (F,), lambda a: prims.pad(a, 0.5, ((1, 2, 0), (0, 0, 0), (2, 1, 0)))),
        Recipe("full", (F,), lambda a: prims.mul(a, prims.full((3, 5, 8), 2.5, device=_device(a), dtype=f32))),
        Recipe(
            "iota",
            (Input((5, 8)),),
            lambda a: prims.add(
                a,
                prims.broadcast_in_dim(
                    prims.convert_element_type(prims.iota(8, start=2, step=3, device=_device(a), dtype=dtypes.int64), f32),
                    (5, 8),
                    (1,),
                ),
            ),
        ),
        Recipe("uniform", (), lambda: prims.uniform((64, 64), -1.0, 2.0, device=devices.Device(DEVICE), dtype=f32), "random"),
        # the torch reference runtime cannot run this region outside thunder.jit (Thunder's torch executor
        # makes tensors of number seeds with ltorch.tensor, which needs a jit context): torch's philox gives
        # the reference's shape and dtype (not its numbers: see test_random_kind_on_nvfuser)
        Recipe(
            "uniform_philox",
            (),
            lambda: prims.uniform_philox((64, 64), 0.0, 1.0, device=devices.Device(DEVICE), dtype=f32, seed=42, offset=0),
            "philox",
            reference=lambda: torch.ops.rngprims.philox_rand(
                [64, 64], torch.tensor(42), torch.tensor(0), None, torch.device(DEVICE), torch.float32
            )[0],
        ),
        Recipe("take", (Input((10, 8)), Input((6,), torch.int64, 0, 10)), lambda a, i: prims.take(a, i, 0)),
        Recipe("take_along_axis", (Input((5, 8)), Input((5, 3), torch.int64, 0, 8)), lambda a, i: prims.take_along_axis(a, i, 1)),
        Recipe("embedding", (Input((2, 6), torch.int64, 0, 16), Input((16, 8))), lambda i, w: prims.embedding(i, w)),
        Recipe("linear", (Input((4, 16)), Input((8, 16)), Input((8,))), lambda a, w, b: prims.linear(a, w, b)),
        Recipe("linear(no bias)", (Input((2, 4, 16)), Input((8, 16))), lambda a, w: prims.linear(a, w, None)),
        Recipe("matmul", (Input((2, 4, 16)), Input((2, 16, 8))), lambda a, b: prims.matmul(a, b)),
        Recipe("matmul(bf16)", (Input((4, 32), torch.bfloat16), Input((32, 16), torch.bfloat16)), lambda a, b: prims.matmul(a, b)),
    ]
    return recipes


RECIPES = {recipe.name: recipe for recipe in _recipes()}

#: Kinds of supported_kinds() that no region here runs, with the reason.  Empty: every kind runs.
NOT_EXERCISED: dict[str, str] = {}


def recipe_region(recipe: Recipe, seed: int = 0):
    """``(region, inputs)``: the recipe's prims as one fusion region (run by the torch reference through
    its call context) and random CUDA inputs for it."""
    trace = TraceCtx(None)
    generator = torch.Generator().manual_seed(seed)
    values = [spec.sample(generator).to(DEVICE) for spec in recipe.inputs]
    with tracectx(trace):
        proxies = [
            TensorProxy(shape=spec.shape, device=devices.Device(DEVICE), dtype=dtypes.to_dtype(spec.dtype))
            for spec in recipe.inputs
        ]
        outputs = recipe.build(*proxies)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    region = make_region(default_region_executor(), "nvFusion0", list(trace.bound_symbols), proxies, outputs)
    return region, values


def run_on_nvfuser(region, inputs):
    """The region built by ``remat.nvfuser.build`` (as the region runtime builds it) and run by nvFuser."""
    descriptors = [tensor_descriptor(a) if isinstance(a, torch.Tensor) else None for a in inputs]
    return build(region, descriptors).execute(list(inputs))


def run_reference(region, inputs, recipe: Recipe | None = None):
    """The region run by the torch reference runtime (``TorchRegionCallable``), or the recipe's own
    torch reference where it has one."""
    if recipe is not None and recipe.reference is not None:
        return [recipe.reference(*inputs)]
    return region._call_ctx[region.sym.name](*inputs)


def assert_outputs_match(expected, got, what: str) -> float:
    """Same count, shapes and dtypes; integers and booleans equal, floats within FLOAT_TOLERANCE.
    Returns the worst relative float error."""
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    assert len(got) == len(expected), f"{what}: nvFuser returned {len(got)} outputs, the reference {len(expected)}"
    worst = 0.0
    for index, (e, g) in enumerate(zip(expected, got)):
        assert g.shape == e.shape and g.dtype == e.dtype, f"{what} output {index}: {g.dtype}{list(g.shape)} vs {e.dtype}{list(e.shape)}"
        if e.dtype.is_floating_point:
            assert torch.equal(e.isnan(), g.isnan()), f"{what} output {index}: NaNs differ"
            scale = max(e.nan_to_num().abs().max().item(), 1.0) if e.numel() else 1.0
            error = (e.double() - g.double()).nan_to_num().abs().max().item() / scale if e.numel() else 0.0
            assert error <= FLOAT_TOLERANCE[e.dtype], f"{what} output {index}: relative error {error:.3g}"
            worst = max(worst, error)
        else:
            assert torch.equal(e, g), f"{what} output {index}: {e.dtype} values differ"
    return worst


#: A strided slice (step 2), which nvFuser 0.2.36 refuses, is no recipe: remat.fuse keeps it out of regions
#: and the emitter refuses it (tests/test_fuse.py::test_a_strided_slice_stays_out_of_regions).
CLOSE_RECIPES = [name for name, recipe in RECIPES.items() if recipe.check == "close"]
RANDOM_RECIPES = [name for name, recipe in RECIPES.items() if recipe.check != "close"]


def test_recipes_cover_every_supported_kind():
    """The union of the kinds the recipes' regions hold covers the emitter's table, and each recipe holds
    the kind it is named after (its name up to the first parenthesis)."""
    exercised = set()
    for name, recipe in RECIPES.items():
        region, _ = recipe_region(recipe)
        kinds = {op_kind(b) for b in region.subsymbols}
        own = name.split("(")[0].split(" ")[0]
        assert own in kinds, f"recipe {name!r} holds {sorted(kinds)}"
        exercised |= kinds
    missing = supported_kinds() - exercised - set(NOT_EXERCISED)
    assert not missing, f"kinds the emitter supports but no GPU test runs: {sorted(missing)}"
    assert set(NOT_EXERCISED) <= supported_kinds()


@pytest.mark.parametrize("name", CLOSE_RECIPES)
def test_kind_on_nvfuser_matches_the_torch_reference(name):
    region, inputs = recipe_region(RECIPES[name])
    expected = run_reference(region, inputs, RECIPES[name])
    got = run_on_nvfuser(region, inputs)
    assert_outputs_match(expected, got, name)
    if name == "stride_order":  # the layout is the point of this prim: nvFuser must write it
        assert got[0].stride() == expected[0].stride(), f"stride_order: {got[0].stride()} vs {expected[0].stride()}"


@pytest.mark.parametrize("name", RANDOM_RECIPES)
def test_random_kind_on_nvfuser(name):
    """``uniform`` (stateful): nvFuser and torch draw from different generators, so only the shape, dtype,
    range and mean are compared.  ``uniform_philox`` (stateless): its seed and offset fix the numbers, so
    two runs are equal as well.  They are not torch's numbers for the same seed and offset
    (``torch.ops.rngprims.philox_rand``): on the H200 nearly every element differed, so nvFuser's philox
    stream is its own (docs/testing.md, "GPU tests")."""
    region, inputs = recipe_region(RECIPES[name])
    expected = run_reference(region, inputs, RECIPES[name])
    expected = expected[0] if isinstance(expected, (list, tuple)) else expected
    fd = build(region, [])
    first, second = fd.execute([])[0], fd.execute([])[0]
    assert first.shape == expected.shape and first.dtype == expected.dtype
    low, high = (-1.0, 2.0) if name == "uniform" else (0.0, 1.0)
    assert low <= first.min().item() and first.max().item() < high
    # 4096 draws: the mean's standard deviation is (high - low) / sqrt(12 * 4096), under 0.014 here
    assert abs(first.mean().item() - (low + high) / 2) < 0.1
    if name == "uniform_philox":
        torch.testing.assert_close(first, second, rtol=0, atol=0)


# ------------------------------------------------------------------------------- regions of LitGPT traces


@pytest.mark.parametrize("model", [PYTHIA_2, LLAMA_2], ids=["pythia", "llama"])
@pytest.mark.parametrize("fusion", [remat.FusionPolicy(), remat.FusionPolicy(linear=True, matmul=True)], ids=["default", "linear+matmul"])
def test_litgpt_regions_on_nvfuser(model, fusion):
    """Every region remat makes of a tiny LitGPT training trace (the programs of tests/test_nvfuser.py,
    traced on CUDA) builds under real nvFuser and computes what the torch reference computes."""
    joint = traced(**{**model, "device": DEVICE})
    result = remat.optimize(remat.fuse(joint, fusion), strict=True)
    regions = regions_of(result.trace)
    assert regions
    for region in regions:
        inputs = [v.to(DEVICE) if isinstance(v, torch.Tensor) else v for v in random_inputs(region)]
        assert_outputs_match(run_reference(region, inputs), run_on_nvfuser(region, inputs), region.sym.name)


# ------------------------------------------------------------------------------------- remat.jit on CUDA


def region_runners(trace) -> list:
    return [b._call_ctx[b.sym.name] for b in regions_of(trace)]


def assert_ran_on_nvfuser(runners: list, caught) -> None:
    """Every region ran under nvFuser: an nvFuser callable, a definition built, no fallback to torch."""
    assert runners, "no regions"
    rejected = [str(w.message) for w in caught if "nvFuser rejected" in str(w.message)]
    assert not rejected, rejected
    for runner in runners:
        assert isinstance(runner, NvFuserRegionCallable), type(runner).__name__
        assert runner.failed is None, f"{runner.region.sym.name} fell back to torch: {runner.failed}"
        assert runner.definitions, f"{runner.region.sym.name} never ran"


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Norm of the difference over the reference's norm."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# fp32 on CUDA: cuBLAS and the attention kernels are the same as eager's; nvFuser regroups elementwise ops
# and reductions, so results agree to float32 rounding carried through two layers.
JIT_TOLERANCE = 1e-4

JIT_MODELS = {
    # RMSNorm, SwiGLU, rotary, grouped-query attention (4 heads, 2 groups)
    "llama": ("Llama-2-7b-hf", dict(n_query_groups=2)),
    # GPT-NeoX: LayerNorm, erf GELU, rotary on a quarter of the head, parallel residual
    "stablecode": ("stablecode-completion-alpha-3b", {}),
}


def model_pair(family: str, seq: int, batch: int = 2):
    """A tiny fp32 LitGPT model on CUDA (``remat.models`` demo width: n_embd 128, 4 heads, 2 layers), an
    eager copy with the same weights, and a batch of token ids."""
    name, overrides = JIT_MODELS[family]
    built = litgpt_model(name, 2, seq, width="demo", batch=batch, device=DEVICE, dtype=torch.float32, **overrides)
    reference = litgpt_model(name, 2, seq, width="demo", batch=batch, device=DEVICE, dtype=torch.float32, **overrides).model
    reference.load_state_dict(built.model.state_dict())
    return built.model, reference, built.idx.to(DEVICE)


def trains_like_eager(jitted, model, reference, idx) -> list:
    """Two training steps (the second reuses the compiled one): loss and every gradient within
    ``JIT_TOLERANCE`` of the eager reference's.  Returns the warnings the steps raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            loss, grads = train_step(jitted, idx)
            expected_loss, expected_grads = train_step(reference, idx)
            assert relative_error(loss, expected_loss) < JIT_TOLERANCE, (loss.item(), expected_loss.item())
            for (name, _), g, e in zip(model.named_parameters(), grads, expected_grads):
                assert relative_error(g, e) < JIT_TOLERANCE, f"{name}: gradient relative error {relative_error(g, e):.3g}"
    return caught


@pytest.mark.parametrize("family", list(JIT_MODELS))
def test_jit_training_step_matches_eager(family):
    model, reference, idx = model_pair(family, seq=64)
    jitted = remat.jit(model, runtime="nvfuser")
    caught = trains_like_eager(jitted, model, reference, idx)
    assert not [str(w.message) for w in caught if issubclass(w.category, remat.OptimizationWarning)]
    result = remat.executor_of(jitted).last_result
    assert result is not None and result.applied, result and result.notes
    assert_ran_on_nvfuser(region_runners(result.trace), caught)


@pytest.mark.parametrize("family", list(JIT_MODELS))
def test_jit_inductor_training_step_matches_eager(family):
    """``runtime="inductor"``: every region compiled by Inductor (Triton) and called without Dynamo, none fell back."""
    from remat.thunder.inductor import InductorRegionCallable

    model, reference, idx = model_pair(family, seq=64)
    jitted = remat.jit(model, runtime="inductor")
    caught = trains_like_eager(jitted, model, reference, idx)
    assert not [str(w.message) for w in caught if "rejected" in str(w.message) or issubclass(w.category, remat.OptimizationWarning)]
    result = remat.executor_of(jitted).last_result
    assert result is not None and result.applied, result and result.notes
    runners = region_runners(result.trace)
    # tensor-only regions are called straight through Inductor (no Dynamo): path "inductor"
    assert runners and all(isinstance(r, InductorRegionCallable) and r.failed is None and r.path == "inductor" for r in runners), [
        (r, getattr(r, "path", None)) for r in runners
    ]


@pytest.mark.parametrize("transposed_cat", [False, True], ids=["default", "transposed-cat"])
@pytest.mark.parametrize("family", list(JIT_MODELS))
def test_jit_inductor_graph_training_step_matches_eager(family, transposed_cat):
    """``runtime="inductor-graph"``: the planned forward and backward each one Inductor graph, none fell back;
    also with the qkv gradient's cat inside its region (``FusionPolicy(transposed_cat=True)``, the candidate
    of benchmarks/cpu_graph_traffic.py)."""
    import thunder

    model, reference, idx = model_pair(family, seq=64)
    fusion = remat.FusionPolicy(transposed_cat=True) if transposed_cat else None
    jitted = remat.jit(model, runtime="inductor-graph", fusion=fusion)
    caught = trains_like_eager(jitted, model, reference, idx)
    assert not [str(w.message) for w in caught if "could not compile" in str(w.message) or issubclass(w.category, remat.OptimizationWarning)]
    assert remat.executor_of(jitted).last_result is not None
    for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]):
        graphs = [b._call_ctx[b.sym.name] for b in trace.bound_symbols if b.sym.name.startswith("remat_graph")]
        assert len(graphs) == 1 and graphs[0].path == "inductor", (graphs, remat.executor_of(jitted).graph_transform.notes)


@pytest.mark.parametrize("donate", [True, False], ids=["donating", "not-donating"])
def test_inductor_graph_donations_measure_their_estimate(donate):
    """The graph runtime's donations on CUDA (:mod:`remat.core.donation`): a bf16 demo-width Llama with a
    real vocabulary, whose logits' gradient sets the backward's peak; the graph compiles (no fallback),
    carries out every planned donation, trains like eager, and its measured peak is within 5% of remat's
    estimate with and without donations (on the CPU: 567.7 against 566.2 MiB, docs/benchmarks.md)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_memory import WithLoss
    from remat.thunder.graph import InductorGraphTransform

    built = litgpt_model("Llama-2-7b-hf", 2, 512, width="demo", batch=2, device=DEVICE, dtype=torch.bfloat16, vocab=32000)
    module = WithLoss(built.model)
    idx = built.idx.to(DEVICE)
    targets = torch.randint(0, 32000, idx.shape, device=DEVICE)
    transform = InductorGraphTransform(donate_dying_inputs=donate)
    jitted = remat.jit(module, runtime="inductor", transforms=[transform])
    params = [p for p in module.parameters() if p.requires_grad]

    def step(fn):
        for p in params:
            p.grad = None
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = fn(idx, targets)
        loss.backward()
        torch.cuda.synchronize()
        return loss.detach().float(), [p.grad.float().clone() for p in params], torch.cuda.max_memory_allocated() - start

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(jitted)  # compiles
        loss, grads, peak = step(jitted)
    assert not [str(w.message) for w in caught if "could not compile" in str(w.message)]
    expected_loss, expected_grads, _ = step(module)
    assert relative_error(loss, expected_loss) < 1e-2
    for g, e in zip(grads, expected_grads):
        assert relative_error(g, e) < 2e-2
    result = remat.executor_of(jitted).last_result
    graphs = [
        b._call_ctx[b.sym.name]
        for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1])
        for b in trace.bound_symbols
        if b.sym.name.startswith("remat_graph")
    ]
    assert graphs and all(g.path == "inductor" and g.undonated == () for g in graphs)
    assert bool(result.after_graph.donations) is donate
    # drained donors written with copy_, donors made in the graph left to Inductor's own in-place reuse
    assert sum(len(g.donated) + len(g.left_to_inductor) for g in graphs) == len(result.after_graph.donations)
    estimate = result.after.peak_bytes
    assert abs(peak - estimate) <= 0.05 * estimate, (peak / 2**20, estimate / 2**20)


@pytest.mark.parametrize("runtime", ["nvfuser", "inductor-graph"])
def test_loss_gradient_region_matches_eager(runtime):
    """Cross-entropy's gradient as fusible ops (the class comparison with iota) runs in the log-softmax
    gradient's region, in the graph runtime's Inductor graph (``FusionPolicy(loss_gradient="auto")``, the
    default) and under nvFuser when asked for (``loss_gradient=True``; "auto" keeps aten's op there), with
    the gradients of eager's aten op (bf16 logits, float32 loss, ignored targets)."""
    import thunder

    torch.manual_seed(0)
    head = torch.nn.Linear(64, 1000, bias=False, device=DEVICE, dtype=torch.bfloat16)
    hidden = torch.randn(2, 128, 64, device=DEVICE, dtype=torch.bfloat16)
    target = torch.randint(0, 1000, (2 * 128,), device=DEVICE)
    target[::5] = -100

    def loss_fn(hidden):
        return torch.nn.functional.cross_entropy(head(hidden).reshape(-1, 1000).float(), target)

    def gradients(fn):
        head.weight.grad = None
        x = hidden.clone().requires_grad_()
        loss = fn(x)
        loss.backward()
        return loss.detach(), x.grad, head.weight.grad.clone()

    fusion = remat.FusionPolicy(loss_gradient=True) if runtime == "nvfuser" else None
    jitted = remat.jit(loss_fn, runtime=runtime, fusion=fusion)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = gradients(jitted)
    for g, e in zip(got, gradients(loss_fn)):
        assert relative_error(g, e) < 1e-2
    trace = remat.executor_of(jitted).last_result.trace
    assert not any("nll_loss_backward" in b.sym.name for b in trace.bound_symbols)
    if runtime == "nvfuser":
        assert_ran_on_nvfuser(region_runners(trace), caught)
    else:
        (graph,) = [b._call_ctx[b.sym.name] for b in thunder.last_backward_traces(jitted)[-1].bound_symbols if b.sym.name.startswith("remat_graph")]
        assert graph.path == "inductor"


def kv_cache_models(family: str, batch: int):
    model, reference, idx = model_pair(family, seq=32, batch=batch)
    for m in (model, reference):
        m.eval()
        m.set_kv_cache(batch_size=batch, max_seq_length=32, device=torch.device(DEVICE))
    return model, reference, idx


@pytest.mark.parametrize("family", list(JIT_MODELS))
def test_jit_kv_cache_decode_matches_eager(family):
    """LitGPT's generation loop (litgpt/generate/base.py): set_kv_cache for one sequence (as LitGPT's
    generate does; batch 2 fails in Thunder itself, see :func:`test_thunder_itself_fails_kv_cache_at_batch_2`),
    prefill at positions 0..7, then one token at a time (the eager model's greedy choice) under inference
    mode."""
    model, reference, idx = kv_cache_models(family, batch=1)
    jitted = remat.jit(model, runtime="nvfuser")
    runners = []
    prompt = idx[:, :8]
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
        warnings.simplefilter("always")
        positions = torch.arange(8, device=DEVICE)
        logits, expected = jitted(prompt, positions), reference(prompt, positions)
        assert relative_error(logits, expected) < JIT_TOLERANCE, "prefill"
        runners += region_runners(thunder.last_traces(jitted)[-1])
        for position in range(8, 12):
            token = expected[:, -1:].argmax(-1)
            at = torch.tensor([position], device=DEVICE)
            logits, expected = jitted(token, at), reference(token, at)
            assert relative_error(logits, expected) < JIT_TOLERANCE, f"decode at position {position}"
        runners += region_runners(thunder.last_traces(jitted)[-1])
    assert not [str(w.message) for w in caught if issubclass(w.category, remat.OptimizationWarning)]
    assert_ran_on_nvfuser(runners, caught)
    for block, ref_block in zip(model.transformer.h, reference.transformer.h):
        assert relative_error(block.attn.kv_cache.k, ref_block.attn.kv_cache.k) < JIT_TOLERANCE
        assert relative_error(block.attn.kv_cache.v, ref_block.attn.kv_cache.v) < JIT_TOLERANCE


def test_thunder_itself_fails_kv_cache_at_batch_2():
    """Why the kv-cache test uses one sequence: at batch 2 Thunder 0.2.6's sdpa executor claims the
    attention (the cached mask has batch 1) and then fails its own shape check, and plain ``thunder.jit``
    (its default executors, no remat) fails the same way on CUDA."""
    model, _, idx = kv_cache_models("llama", batch=2)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="same batch_size"):
            thunder.jit(model)(idx[:, :8], torch.arange(8, device=DEVICE))
