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
    assert all(c.failed is None and c._compiled is not None for c in callables)


def test_a_region_torch_compile_rejects_runs_with_the_reference(monkeypatch):
    def refuse(self):
        def compiled(*args):
            raise RuntimeError("Inductor cannot lower this op")

        return compiled

    monkeypatch.setattr(InductorRegionCallable, "_build", refuse)
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    jitted = remat.jit(block, runtime="inductor")
    with pytest.warns(UserWarning, match="torch.compile rejected region .*Inductor cannot lower this op"):
        loss, grads = train_step(jitted, x)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert all(c.failed for c in region_callables(jitted))


def test_a_region_drawing_random_numbers_is_never_compiled(monkeypatch):
    """Inductor's random numbers are not eager's: a dropout mask drawn in one region and recomputed in
    another must be the same, so such regions run with the torch reference (and its numbers)."""
    monkeypatch.setattr(InductorRegionCallable, "_build", lambda self: self.reference.build())  # no C++ build needed here
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
