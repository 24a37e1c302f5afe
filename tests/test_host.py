"""Hosted recomputation (``RecomputePolicy.host_recompute``, :func:`remat.core.layout.host_recomputations`).

A value recomputed for a stand-alone backward reader (a weight gradient's matmul reading a layer norm's
or an MLP activation's output) used to get a region of its own.  With hosting, the next backward region
that recomputes from the same inputs moves up before the reader and writes the value too: one region
fewer, the shared ops run once.  These tests check the rule, the numbers and the estimate; whether it
is faster is the GPU's to say (docs/benchmarks.md).
"""

from __future__ import annotations

import pytest

import remat
from conftest import PYTHIA_2, WIDE_LLAMA, assert_same_loss_and_grads, traced
from remat.core.layout import _closure, layout_graph, plan_layout
from remat.core.memory import profile_graph
from remat.planning.budget import plan_memory
from remat.planning.plan import plan_graph
from remat.thunder.rewrite import apply_plan

#: GPT-NeoX like stablecode (biases, GELU, LayerNorm), at sequence 64 so that its lowest plan recomputes
#: matmuls (at conftest's 16 it does not)
PYTHIA = dict(PYTHIA_2, seq=64)
NO_HOST = remat.RecomputePolicy(host_recompute=False)


@pytest.fixture(scope="module", params=["llama", "pythia"])
def fused(request):
    return remat.fuse(traced(**(WIDE_LLAMA if request.param == "llama" else PYTHIA)))


def regions(trace) -> int:
    return sum(1 for bsym in trace.bound_symbols if bsym.sym.is_fusion)


def test_a_recomputation_for_a_stand_alone_reader_moves_into_a_later_region_that_reads_its_inputs(fused):
    graph = remat.read_trace(fused)
    plan = plan_graph(graph)
    plain = plan_layout(graph, plan, host=False)
    hosted = plan_layout(graph, plan)
    readers = [e for e in hosted.edits if e.host is not None]
    assert readers, "LitGPT's weight-gradient matmuls read recomputed norm / activation outputs"
    saved = set(plan.saved)
    for reader in readers:
        host = hosted.edits[reader.host]
        unit, host_unit = graph.units[reader.index], graph.units[reader.host]
        assert unit.kind == "op" and host_unit.kind == "region" and reader.index < reader.host
        assert reader.action == "recompute_before" and reader.recompute == () and reader.reads
        assert host.action == "recompute_into" and host.moved_before == reader.index and host.exports == reader.reads
        # the host runs the reader's whole closure (shared ops once) besides its own recomputation
        before = plain.edits[reader.index]
        assert set(before.recompute) <= set(host.recompute)
        assert set(host.recompute) == set(before.recompute) | set(plain.edits[reader.host].recompute)
        assert tuple(_closure(graph, saved, list(reader.reads))) == before.recompute
        # it reads nothing written by the units it moves over
        jumped = {o for u in graph.units[reader.index : reader.host] for o in u.outputs}
        assert jumped.isdisjoint(host_unit.inputs)
    # same cut; fewer FLOPs (shared ops once) and no higher estimated peak
    assert hosted.extra_flops < plain.extra_flops
    peak = profile_graph(layout_graph(graph, hosted)).peak_bytes
    assert peak <= profile_graph(layout_graph(graph, plain)).peak_bytes


def test_hosting_gives_bit_identical_loss_and_gradients_with_fewer_regions(fused):
    graph = remat.read_trace(fused)
    hosted_plan = plan_graph(graph)
    plain_plan = plan_graph(graph, NO_HOST)
    assert hosted_plan.saved == plain_plan.saved  # the layout changes, not the cut
    hosted = apply_plan(fused, graph, hosted_plan).trace
    plain = apply_plan(fused, graph, plain_plan).trace
    moved = sum(1 for e in hosted_plan.layout.edits if e.host is not None)
    assert moved and regions(hosted) == regions(plain) - moved
    assert assert_same_loss_and_grads(fused, hosted) > 1


def test_the_estimate_of_a_hosted_layout_is_the_estimate_of_its_rewritten_trace(fused):
    graph = remat.read_trace(fused)
    plan = plan_graph(graph)
    assert any(e.host is not None for e in plan.layout.edits)
    rewritten = apply_plan(fused, graph, plan).trace
    assert remat.estimate_memory(rewritten).peak_bytes == plan_memory(graph, plan).peak_bytes


def test_the_switch_turns_it_off_and_takes_only_a_bool(fused):
    graph = remat.read_trace(fused)
    plan = plan_graph(graph, NO_HOST)
    assert plan.recompute.host_recompute is False
    assert not any(e.host is not None or e.moved_before is not None for e in plan.layout.edits)
    with pytest.raises(TypeError, match="host_recompute"):
        remat.RecomputePolicy(host_recompute="yes")


def test_no_point_of_a_budget_frontier_gets_a_higher_peak_from_hosting(fused):
    graph = remat.read_trace(fused)
    for point in remat.pareto(graph):
        plain = plan_layout(graph, point.plan, host=False, reissue_once=point.found != "per-unit")
        hosted = plan_layout(graph, point.plan, reissue_once=point.found != "per-unit")
        assert profile_graph(layout_graph(graph, hosted)).peak_bytes <= profile_graph(layout_graph(graph, plain)).peak_bytes


def test_a_plan_that_recomputes_matmuls_hosts_too_with_bit_identical_gradients(fused):
    """At the bottom of the frontier matmuls are re-issued in stages; hosting still applies where the
    host's own recomputation reads only saved values, and the numbers do not change."""
    graph = remat.read_trace(fused)
    lowest = remat.pareto(graph)[-1]
    layout = lowest.plan.layout or plan_layout(graph, lowest.plan)
    assert any(e.stages for e in layout.edits), "the lowest plan re-issues a matmul"
    assert any(e.host is not None for e in layout.edits)
    rewritten = apply_plan(fused, graph, lowest.plan).trace
    assert remat.estimate_memory(rewritten).peak_bytes == lowest.peak_bytes
    assert assert_same_loss_and_grads(fused, rewritten) > 1
