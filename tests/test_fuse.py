"""remat.fuse region choices that are remat's own (not Thunder's): the cat of transposed values."""

import pytest
import torch

import remat
from conftest import tiny_litgpt
from remat.graph import op_kind


@pytest.fixture(scope="module")
def joint():
    model = tiny_litgpt("pythia-14m", n_layer=2)
    return remat.training_trace(model, torch.randint(0, 128, (1, 64)))


def cats(trace):
    """(stand-alone cats, cats inside regions)."""
    outside = [b for b in trace.bound_symbols if op_kind(b) == "cat"]
    inside = [s for b in trace.bound_symbols if b.sym.is_fusion for s in b.subsymbols if op_kind(s) == "cat"]
    return outside, inside


def test_qkv_gradient_cat_runs_outside_regions_by_default(joint):
    fused = remat.fuse(joint)
    outside, inside = cats(fused)
    # one qkv-gradient cat per layer; RoPE's cats (rotate_half, rotary + pass-through) stay in regions
    assert len(outside) == 2
    assert inside
    made_by = {p.name: b for b in fused.bound_symbols for p in b.flat_proxy_outs}
    for cat in outside:
        assert cat.args[1] == -1 and len(cat.args[0]) == 3
        assert all(made_by[p.name].sym.is_fusion for p in cat.args[0])  # the pieces are region outputs
        for piece in cat.args[0]:  # each is a transposed gradient, reshaped back to (batch, seq, features)
            region = made_by[piece.name]
            producer = next(s for s in region.subsymbols if piece.name in {p.name for p in s.flat_proxy_outs})
            assert op_kind(producer) == "reshape"


def test_transposed_cat_policy_keeps_it_in_the_region(joint):
    outside_default, inside_default = cats(remat.fuse(joint))
    outside, inside = cats(remat.fuse(joint, remat.NvFuserPolicy(transposed_cat=True)))
    assert outside == []
    assert len(inside) == len(inside_default) + len(outside_default)


def test_default_policy_trains_like_eager():
    model = tiny_litgpt("pythia-14m", n_layer=2)
    idx = torch.randint(0, 128, (1, 64))

    def step(fn):
        for p in model.parameters():
            p.grad = None
        loss = fn(idx).float().pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    jitted = remat.jit(model, backend="torch")
    loss, grads = step(jitted)
    trace = remat.executor_of(jitted).last_result.trace
    assert any(op_kind(b) == "cat" for b in trace.bound_symbols)  # the stand-alone cat ran
    eager_loss, eager_grads = step(model)
    torch.testing.assert_close(loss, eager_loss)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
