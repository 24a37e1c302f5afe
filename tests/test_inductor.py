"""``runtime="inductor"``: remat's regions compiled by torch.compile (C++ kernels on this CPU, Triton on a
GPU, where tests/test_gpu.py runs the same checks on LitGPT blocks)."""

import warnings

import pytest
import torch

import remat
from conftest import train_step
from remat.thunder.inductor import InductorRegionCallable


class Block(torch.nn.Module):
    """A layer norm, a linear and a gelu: two fusion regions each way, small enough that Inductor's C++
    compilation stays a few seconds."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(torch.nn.functional.gelu(self.fc(self.norm(x)))) * 2.0


def region_callables(jitted) -> list:
    result = remat.executor_of(jitted).last_result
    return [b._call_ctx[b.sym.name] for b in result.trace.bound_symbols if b.sym.is_fusion]


def test_inductor_regions_train_like_eager():
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    jitted = remat.jit(block, runtime="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no region may fall back to the reference
        for _ in range(2):  # the second step reuses the compiled regions
            loss, grads = train_step(jitted, x)
            torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
            for got, want in zip(grads, expected_grads):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    callables = region_callables(jitted)
    assert callables and all(isinstance(c, InductorRegionCallable) for c in callables)
    # every region here takes tensors only: each is called straight through Inductor, without Dynamo
    assert all(c.failed is None and c.path == "inductor" and c._compiled is None for c in callables)
    assert all(len(c._direct) == 1 for c in callables)  # one layout each, compiled once over two steps


def test_a_region_called_with_another_layout_gets_its_own_compiled_graph():
    """Inductor's code asserts its inputs' strides, so a region called with a transposed input is compiled
    again for that layout, and gives the same values."""
    block = Block()
    jitted = remat.jit(block, runtime="inductor")
    train_step(jitted, torch.randn(4, 16))
    captured = {}
    callable_ = next(c for c in region_callables(jitted) if any(p.ndim >= 2 for p in c.region.args))
    real = callable_._build_direct

    def spy(args):
        captured["strides"] = [a.stride() for a in args]
        return real(args)

    def column_major(proxy):  # same shape, reversed strides
        dims = tuple(reversed(range(proxy.ndim)))
        return torch.randn(tuple(reversed(proxy.shape))).permute(dims)

    callable_._build_direct = spy
    args = [column_major(p) if p.ndim >= 2 else torch.randn(p.shape) for p in callable_.region.args]
    got = callable_(*args)
    want = callable_.reference(*args)
    for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, (list, tuple)) else [want]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert len(callable_._direct) == 2 and captured["strides"] == [a.stride() for a in args]


def test_the_direct_path_failing_falls_back_to_torch_compile(monkeypatch):
    def refuse(self, args):
        raise RuntimeError("no such private API")

    monkeypatch.setattr(InductorRegionCallable, "_build_direct", refuse)
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    jitted = remat.jit(block, runtime="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a quiet fallback: torch.compile still compiles it
        loss, grads = train_step(jitted, x)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    callables = region_callables(jitted)
    assert all(c.path == "torch.compile" and c._compiled is not None and not c._direct_possible for c in callables)


def test_a_region_torch_compile_rejects_runs_with_the_reference(monkeypatch):
    def refuse(self):
        def compiled(*args):
            raise RuntimeError("Inductor cannot lower this op")

        return compiled

    monkeypatch.setattr(InductorRegionCallable, "_build", refuse)
    monkeypatch.setattr(InductorRegionCallable, "_build_direct", lambda self, args: refuse(self)(*args))
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    jitted = remat.jit(block, runtime="inductor")
    with pytest.warns(UserWarning, match="torch.compile rejected region .*Inductor cannot lower this op"):
        loss, grads = train_step(jitted, x)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert all(c.failed and c.path == "reference" for c in region_callables(jitted))


def test_a_region_drawing_random_numbers_is_never_compiled(monkeypatch):
    """Inductor's random numbers are not eager's: a dropout mask drawn in one region and recomputed in
    another must be the same, so such regions run with the torch reference (and its numbers)."""
    monkeypatch.setattr(InductorRegionCallable, "_build", lambda self: self.reference.build())  # no C++ build needed here
    monkeypatch.setattr(InductorRegionCallable, "_direct_for", lambda self, args: None)
    block = Block(dropout=0.5)
    x = torch.randn(4, 16)
    torch.manual_seed(3)
    reference = remat.jit(block, runtime="torch")
    expected_loss, expected_grads = train_step(reference, x)
    torch.manual_seed(3)
    jitted = remat.jit(block, runtime="inductor")
    loss, grads = train_step(jitted, x)
    assert torch.equal(loss, expected_loss)
    assert all(torch.equal(g, e) for g, e in zip(grads, expected_grads))
    random_regions = [c for c in region_callables(jitted) if c.failed is not None]
    assert random_regions and all("random" in c.failed and c._compiled is None for c in random_regions)


def test_unknown_runtime_lists_inductor():
    with pytest.raises(ValueError, match="'inductor'"):
        remat.executor(runtime="triton")
