"""``RecomputePolicy(unfused_readers=False)``: values a backward op outside every region reads stay saved.

A recomputed value read by a stand-alone backward op (an attention backward, a weight-gradient matmul)
cannot fuse into its reader: the layout gives it a region of its own, one more kernel writing it to
memory (in LitGPT: the RoPE'd queries and keys recomputed from ``qkv`` before the attention backward).
The switch trades that kernel for memory; these tests check the rule, not the speed (a GPU question).
"""

from __future__ import annotations

import pytest

import remat
from conftest import WIDE_LLAMA, assert_same_loss_and_grads, traced
from remat.core.layout import read_outside_regions
from remat.core.views import alias_base
from remat.planning.budget import plan_for_budget, plan_memory
from remat.planning.plan import plan_graph
from remat.thunder.rewrite import apply_plan

KEEP = remat.RecomputePolicy(unfused_readers=False)


@pytest.fixture(scope="module")
def fused():
    return remat.fuse(traced(**WIDE_LLAMA))


def recomputed_unfused_reads(graph, plan) -> set[str]:
    """Recomputed values (taken to their storage) that a backward op outside every region reads."""
    kept = read_outside_regions(graph)
    return {alias_base(v, graph.tensors) for v in plan.recomputed_values} & kept


def test_the_default_recomputes_values_unfused_ops_read_and_the_switch_keeps_them(fused):
    graph = remat.read_trace(fused)
    default = plan_graph(graph)
    assert recomputed_unfused_reads(graph, default), "the default plan recomputes RoPE'd q/k for the attention backward"
    keep = plan_graph(graph, KEEP)
    assert recomputed_unfused_reads(graph, keep) == set()
    assert keep.recompute == KEEP
    # it still recomputes what fuses into its readers, and keeps more bytes for it
    assert keep.recomputed_values and keep.saved_bytes > default.saved_bytes
    assert plan_memory(graph, keep).peak_bytes >= plan_memory(graph, default).peak_bytes
    assert keep.extra_flops < default.extra_flops


def test_it_holds_under_a_budget_too(fused):
    graph = remat.read_trace(fused)
    choice = plan_for_budget(graph, remat.MemoryBudget.parse(0.7), recompute=KEEP)
    assert recomputed_unfused_reads(graph, choice.plan) == set()


def test_the_kept_plan_gives_bit_identical_loss_and_gradients(fused):
    graph = remat.read_trace(fused)
    keep = plan_graph(graph, KEEP)
    assert assert_same_loss_and_grads(fused, apply_plan(fused, graph, keep).trace) > 1


def test_optimize_and_jit_take_it(fused):
    result = remat.optimize(fused, recompute=KEEP, thunder_baseline=False, strict=True)
    assert result.plan.recompute == KEEP
    assert recomputed_unfused_reads(remat.read_trace(fused), result.plan) == set()


def test_a_non_bool_is_refused():
    with pytest.raises(TypeError, match="unfused_readers"):
        remat.RecomputePolicy(unfused_readers="no")


# ------------------------------------------------------------------------ budgets above the default plan
def test_a_budget_above_the_default_peak_buys_fewer_flops_with_memory(fused):
    graph = remat.read_trace(fused)
    default = plan_for_budget(graph, remat.MemoryBudget.parse(1.0))
    assert default.point.found == "default"
    exactly = plan_for_budget(graph, remat.MemoryBudget(bytes=default.point.peak_bytes))
    # the default plan fits its own peak: nothing above it is chosen
    assert (exactly.plan.saved, exactly.plan.recomputed_ops) == (default.plan.saved, default.plan.recomputed_ops)
    previous_flops = default.point.extra_flops
    chosen = []
    for factor in (1.02, 1.1, 1.25, 3.0):
        budget = int(default.point.peak_bytes * factor)
        choice = plan_for_budget(graph, remat.MemoryBudget(bytes=budget))
        assert choice.fits and choice.point.peak_bytes <= budget
        assert choice.point.extra_flops <= previous_flops  # more room, never more recomputation
        previous_flops = choice.point.extra_flops
        # the plan is the one evaluated: its estimate is the memory model's of its layout
        assert plan_memory(graph, choice.plan).peak_bytes == choice.point.peak_bytes
        chosen.append(choice)
    assert chosen[-1].point.found == "kept" and chosen[-1].point.extra_flops < default.point.extra_flops
    assert recomputed_unfused_reads(graph, chosen[-1].plan) == set()  # room for all: every one kept
    # the kept side is a frontier: fewer FLOPs at a higher peak, point after point
    side = [p for p in chosen[-1].frontier if p.found == "kept"]
    assert len(side) > 2
    assert all(a.extra_flops < b.extra_flops and a.peak_bytes > b.peak_bytes for a, b in zip(side, side[1:]))
    assert side[-1].peak_bytes > default.point.peak_bytes


def test_the_latest_layers_values_are_kept_first(fused):
    """The backward reads the last layer's values first, so keeping them holds memory the shortest."""
    graph = remat.read_trace(fused)
    default = plan_graph(graph)
    side = [p for p in plan_for_budget(graph, remat.MemoryBudget(bytes=10**12)).frontier if p.found == "kept"]
    fewest_kept = side[-1].plan  # the highest-FLOPs point above the default plan keeps the fewest values
    kept = recomputed_unfused_reads(graph, default) - recomputed_unfused_reads(graph, fewest_kept)
    assert kept
    modules = {graph.value_module(v) or "" for v in kept}  # "": the top module (the final norm, after the layers)
    assert any(m.startswith("transformer.h.1") for m in modules), modules  # the last of layers 0 and 1 ...
    assert not any(m.startswith("transformer.h.0") for m in modules), modules  # ... before the first


def test_optimize_applies_a_plan_above_the_default_and_it_is_exact(fused):
    graph = remat.read_trace(fused)
    default_peak = plan_for_budget(graph, remat.MemoryBudget.parse(1.0)).point.peak_bytes
    result = remat.optimize(fused, memory_budget=int(default_peak * 3))
    assert result.chosen == "remat" and result.applied
    assert result.after.peak_bytes <= default_peak * 3 and result.after.peak_bytes > default_peak
    assert any("chose the plan with the fewest extra FLOPs" in note for note in result.notes)
    assert_same_loss_and_grads(fused, result.trace)
