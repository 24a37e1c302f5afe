"""Staged recomputation: ops that stand alone in the forward stay stand-alone when they are recomputed.

Measured on the H200 (Llama-2-7b, 2 layers, seq 8192): at budgets low enough that the plan recomputes
linears, the layout put each backward region's whole recompute closure into that region, linears
included; nvFuser then segments the region and materializes the matmul's output between its kernels,
which the memory model (a region's internals are free) did not see: the measured peak was one MLP fc_1
output above the estimate per recomputed fc_1.  The layout now stages such a closure
(:func:`remat.core.layout.stage_closure`), and both consumers of the layout (the memory model through
``layout_graph``, the rewrite through ``apply_plan``) follow the stages.
"""

from __future__ import annotations

from collections import Counter

import pytest

import remat
from conftest import WIDE_LLAMA, assert_same_loss_and_grads, traced
from remat.core.ir import BACKWARD, FORWARD, FusionGraph, Op
from remat.core.layout import _closure, plan_layout, stage_closure, stands_alone
from remat.planning.budget import plan_memory
from remat.planning.plan import plan_graph
from remat.thunder.rewrite import apply_plan

@pytest.fixture(scope="module")
def fused_wide():
    """The fused joint trace of ``conftest.WIDE_LLAMA`` on CPU (fp32): its lowest plans recompute linears."""
    return remat.fuse(traced(**WIDE_LLAMA))


def recomputes_a_matmul(graph: FusionGraph, plan) -> bool:
    return any("matmul" in graph.ops[n].tags for n in plan.recomputed_ops)


def regions_with_matmuls(trace) -> list[str]:
    return [
        b.sym.name
        for b in trace.bound_symbols
        if b.sym.is_fusion and any(s.sym.name in ("linear", "matmul") for s in b.subsymbols)
    ]


def same_profile(a, b) -> bool:
    return (a.peak_bytes, a.saved_bytes, [p.live_bytes for p in a.timeline]) == (
        b.peak_bytes, b.saved_bytes, [p.live_bytes for p in b.timeline]
    )


def test_recomputed_linears_stay_out_of_regions_and_the_estimate_is_the_rewritten_traces(fused_wide):
    assert not regions_with_matmuls(fused_wide), "the default FusionPolicy keeps linears out of regions"
    graph = remat.read_trace(fused_wide)
    points = [p for p in remat.pareto(graph) if recomputes_a_matmul(graph, p.plan)]
    assert points, "the lowest plans of this model recompute linears"
    for point in points:
        layout = point.plan.layout  # a plan carries the layout it was estimated with (per unit, or once)
        staged = [n for e in layout.edits for s in e.stages for n in s.ops]
        assert any("matmul" in graph.ops[n].tags for n in staged)
        rewritten = apply_plan(fused_wide, graph, point.plan, layout=layout)
        assert regions_with_matmuls(rewritten.trace) == []
        # the memory model's estimate of the layout is the estimate of the trace it becomes
        assert same_profile(plan_memory(graph, point.plan), remat.estimate_memory(rewritten.trace))
        # every recomputed op is placed once per unit that needs it: in a region, or as itself
        placed = sorted(n for ops in rewritten.placements.values() for n in ops)
        assert placed == sorted(n for e in layout.edits for n in e.recomputed)
        linears = [key for key in rewritten.placements if key.endswith("= linear")]
        assert linears and all(len(rewritten.placements[key]) == 1 for key in linears)
        assert rewritten.extra_flops == sum(graph.ops[n].flops for e in layout.edits for n in e.recomputed)


def test_staged_recomputation_gives_bit_identical_loss_and_gradients(fused_wide):
    graph = remat.read_trace(fused_wide)
    lowest = remat.pareto(graph)[-1]
    assert recomputes_a_matmul(graph, lowest.plan)
    optimized = apply_plan(fused_wide, graph, lowest.plan).trace
    assert assert_same_loss_and_grads(fused_wide, optimized) > 1


def test_without_stand_alone_ops_in_a_closure_nothing_is_staged(fused_wide):
    """The default plan recomputes no matmul: its layout places every closure whole, as before staging
    existed, although its closures hold stand-alone views (views fold into regions)."""
    graph = remat.read_trace(fused_wide)
    plan = plan_graph(graph)
    assert not recomputes_a_matmul(graph, plan)
    layout = plan_layout(graph, plan, host=False)  # per-unit closures, before hosting moves some (tests/test_host.py)
    recomputing = [e for e in layout.edits if e.action in ("recompute_into", "recompute_before")]
    assert recomputing
    saved = set(plan.saved)
    recomputed = set(plan.recomputed_values)
    closures = []
    for edit in recomputing:
        unit = graph.units[edit.index]
        closure = tuple(_closure(graph, saved, [n for n in unit.inputs if n in recomputed]))
        assert edit.stages == () and edit.recompute == closure and edit.recomputed == closure
        closures.append(closure)
    folded_views = [n for c in closures for n in c if graph.ops[n].region is None]
    assert folded_views and all(not stands_alone(graph.ops[n]) for n in folded_views)


# -------------------------------------------------------------------------------------- the staging rule
def _op(node: int, kind: str, inputs: tuple[str, ...], outputs: tuple[str, ...], producers: dict[str, int], *, region=None, tags=()) -> Op:
    return Op(
        id=node, kind=kind, unit=node, region=region, phase=FORWARD, inputs=inputs,
        input_nodes=tuple(producers.get(name) for name in inputs), outputs=outputs, output_bytes=(4,) * len(outputs),
        tags=frozenset(tags), fusible=region is not None or "view" in tags,
    )


def staging_graph() -> FusionGraph:
    """A forward whose recomputation crosses two stand-alone linears and a stand-alone view::

        a = neg(x)          region          (feeds linear b and linear e: stage 0's region)
        b = linear(a, w)    stand-alone     stage 0
        c = exp(b)          region          (feeds e through the view d: stage 1's region)
        d = reshape(c)      stand-alone view, folds into stage 1's region
        e = linear(d, a)    stand-alone     stage 1 (after b on the chain a -> b -> c -> d -> e)
        f = sin(e)          region          (feeds no stand-alone op: the rest, with the unit)
        g = cos(b)          region          (read by the unit only: the rest)
    """
    steps = [
        ("neg", ("x",), ("a",), "nvFusion0", ()),
        ("linear", ("a", "w"), ("b",), None, ("matmul",)),
        ("exp", ("b",), ("c",), "nvFusion1", ()),
        ("reshape", ("c",), ("d",), None, ("view",)),
        ("linear", ("d", "a"), ("e",), None, ("matmul",)),
        ("sin", ("e",), ("f",), "nvFusion2", ()),
        ("cos", ("b",), ("g",), "nvFusion2", ()),
    ]
    producers: dict[str, int] = {}
    ops = []
    for node, (kind, inputs, outputs, region, tags) in enumerate(steps):
        ops.append(_op(node, kind, inputs, outputs, producers, region=region, tags=tags))
        producers.update((name, node) for name in outputs)
    return FusionGraph((), {}, ops)


def test_the_staging_rule_on_a_hand_built_closure():
    graph = staging_graph()
    ops = graph.ops
    assert [stands_alone(op) for op in ops] == [False, True, False, False, True, False, False]
    stages, rest = stage_closure(graph, range(len(ops)), unit_reads=("f", "g", "b"))
    assert [s.ops for s in stages] == [(1,), (4,)]  # linear b is stage 0, linear e stage 1
    assert [s.region for s in stages] == [(0,), (2, 3)]  # a feeds both linears: the lowest stage takes it
    assert rest == (5, 6)
    # stage 0's region hands out a (read by both linears); stage 1's hands out d (read by e), not c
    assert [s.exports for s in stages] == [("a",), ("d",)]


def test_a_closure_without_stand_alone_ops_or_of_a_plain_graph_is_not_staged():
    graph = staging_graph()
    assert stage_closure(graph, (0, 2, 3), unit_reads=("d",)) == ((), (0, 2, 3))
    plain = FusionGraph((), {}, graph.ops, save_costs={})  # plain graphs record no regions
    assert plain.plain
    assert stage_closure(plain, range(len(graph.ops)), unit_reads=("f",)) == ((), tuple(range(len(graph.ops))))


def test_a_stage_without_fusible_ops_has_no_region():
    graph = staging_graph()
    # recomputing e from a saved a and b: reshape d and exp c feed e, linear b is not in the closure
    stages, rest = stage_closure(graph, (2, 3, 4, 5), unit_reads=("f",))
    assert [(s.region, s.exports, s.ops) for s in stages] == [((2, 3), ("d",), (4,))]
    assert rest == (5,)
    stages, rest = stage_closure(graph, (4, 5), unit_reads=("f",))
    assert [(s.region, s.exports, s.ops) for s in stages] == [((), (), (4,))]
    assert rest == (5,)


# ------------------------------------------------------------------ a stand-alone op is re-issued once
def per_unit_closures(graph: FusionGraph, plan) -> list[list[int]]:
    """The recompute closure of every backward unit reading a recomputed value, each from the saved
    values alone: what the layout re-ran when it recomputed everything per consuming unit."""
    saved, recomputed = set(plan.saved), set(plan.recomputed_values)
    closures = []
    for unit in graph.units:
        reads = [name for name in unit.inputs if name in recomputed]
        if unit.phase == BACKWARD and unit.kind != "return" and reads:
            closures.append(_closure(graph, saved, reads))
    return closures


def test_a_recomputed_linear_read_by_several_backward_units_is_re_issued_once(fused_wide):
    """Per consuming unit, the lowest plans re-ran one linear for each backward unit whose closure held
    it (five times for a layer's attention projection).  It is now re-issued once, for the first such
    unit, and the later ones read its fresh output, which the memory model keeps alive until then."""
    graph = remat.read_trace(fused_wide)
    lowest = [p for p in remat.pareto(graph) if p.found != "per-unit"][-1]
    closures = per_unit_closures(graph, lowest.plan)
    needed_by = Counter(n for closure in closures for n in closure)
    shared_linears = {n for n, count in needed_by.items() if count > 1 and "matmul" in graph.ops[n].tags}
    assert shared_linears, "the lowest plan of this model needs a linear in several backward units"

    layout = plan_layout(graph, lowest.plan)
    reissued = Counter(n for e in layout.edits for s in e.stages for n in s.ops)
    assert shared_linears <= set(reissued) and set(reissued.values()) == {1}
    rewritten = apply_plan(fused_wide, graph, lowest.plan, layout=layout)
    # in the rewritten trace: the forward's linears, and each recomputed linear once
    forward_linears = {b.flat_proxy_outs[0].name for b in fused_wide.bound_symbols if b.sym.name == "linear"}
    linears_after = [b.flat_proxy_outs[0].name for b in rewritten.trace.bound_symbols if b.sym.name == "linear"]
    fresh = [name for name in linears_after if name not in forward_linears]
    assert len(linears_after) == len(forward_linears) + len(fresh)
    assert len(fresh) == len({n for n in reissued if graph.ops[n].kind == "linear"})
    # several units read one re-issued output
    readers = Counter(name for b in rewritten.trace.bound_symbols for name in {p.name for p in b.flat_proxy_args} if name in fresh)
    assert max(readers.values()) > 1
    assert same_profile(plan_memory(graph, lowest.plan), remat.estimate_memory(rewritten.trace))
    # each re-issued op is counted once: fewer extra FLOPs than re-running every closure whole
    per_unit_flops = sum(graph.ops[n].flops for closure in closures for n in closure)
    repeats = sum(graph.ops[n].flops * (needed_by[n] - 1) for n in reissued)
    assert rewritten.extra_flops == lowest.plan.extra_flops == layout.extra_flops
    assert layout.extra_flops <= per_unit_flops - repeats < per_unit_flops

    assert assert_same_loss_and_grads(fused_wide, rewritten.trace) > 1


def test_the_lowest_plan_is_also_offered_re_issuing_per_unit_when_that_lowers_its_peak(fused_wide):
    """Re-issuing a stand-alone op once keeps its output alive until its last reader, which can raise the
    lowest plan's peak; the frontier then also holds that plan laid out per consuming unit (more FLOPs,
    lower peak), so the lowest reachable peak is never lost.  That plan, applied with its own layout, is
    exact to its estimate and bit-identical to the unoptimized trace."""
    graph = remat.read_trace(fused_wide)
    frontier = remat.pareto(graph)
    once = [p for p in frontier if p.found != "per-unit"]
    per_unit = plan_layout(graph, once[-1].plan, reissue_once=False)
    per_unit_peak = remat.core.memory.profile_graph(remat.core.layout.layout_graph(graph, per_unit)).peak_bytes
    assert frontier[-1].peak_bytes <= min(once[-1].peak_bytes, per_unit_peak)
    variants = [p for p in frontier if p.found == "per-unit"]
    if per_unit_peak < once[-1].peak_bytes:
        assert variants and variants[-1].peak_bytes == per_unit_peak
    for point in variants:  # applied with the layout it was estimated with
        assert point.plan.layout is not None and point.extra_flops == point.plan.layout.extra_flops
        rewritten = apply_plan(fused_wide, graph, point.plan, layout=point.plan.layout)
        assert same_profile(plan_memory(graph, point.plan), remat.estimate_memory(rewritten.trace))
        assert rewritten.trace.bound_symbols  # the trace was built
        assert assert_same_loss_and_grads(fused_wide, rewritten.trace) > 1
