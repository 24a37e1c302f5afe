"""ZeRO3's re-gather as a choice of the cut, on plain data (docs/robustness.md, "Distributed").

``RecomputePolicy(regather_parameters=True)`` lets exactly the ops the op table tags ``regather`` be
recomputed: an all-gather of a graph input and the wait completing it.  These tests check that rule,
that the future of a re-gather is never kept (it counts 0 bytes but holds the gathered buffer), and how
a re-gather is priced: free without a budget, its FLOP-equivalent under one.  The end-to-end test with
``thunder.distributed.fsdp`` on two gloo processes is ``test_zero3_regather_parameters_matches_thunder``
in tests/test_distributed.py.
"""

from __future__ import annotations

import math

import networkx as nx
import pytest

import remat
from remat.core.ops import (
    ALL_GATHER_KINDS,
    DISTRIBUTED_KINDS,
    REGATHER_FLOPS_PER_BYTE,
    REGATHER_TAG,
    TAGS,
    WAIT_KINDS,
    estimate_flops,
    op_tags,
    regather_flops,
    regather_tags,
)
from remat.core.plain import plain_graph
from remat.core.policies import RecomputePolicy
from remat.planning.budget import PRICED_POLICY
from remat.planning.plan import plan_graph
from remat.planning.problem import INFINITE, SOURCE, build_problem

REGATHER = RecomputePolicy(regather_parameters=True)
#: every switch remat has (stateful random ops aside)
EVERYTHING = RecomputePolicy(matmul=True, attention=True, reductions=True, non_fusible=True, regather_parameters=True)


# ----------------------------------------------------------------------------- the op table and the policy
def test_only_an_all_gather_of_a_graph_input_and_its_wait_are_tagged_regather():
    for kind in sorted(DISTRIBUTED_KINDS):
        tags = op_tags(kind)
        assert REGATHER_TAG not in tags, kind  # the kind alone never makes a re-gather: the inputs do
        tagged = regather_tags(kind, tags, reads_graph_input=True, completes_regather=True)
        assert (REGATHER_TAG in tagged) == (kind in ALL_GATHER_KINDS | WAIT_KINDS), kind
    for kind in ALL_GATHER_KINDS:
        assert REGATHER_TAG in regather_tags(kind, op_tags(kind), reads_graph_input=True)
        assert REGATHER_TAG not in regather_tags(kind, op_tags(kind), reads_graph_input=False), kind
        assert REGATHER_TAG not in regather_tags(kind, op_tags(kind), completes_regather=True), kind
    for kind in WAIT_KINDS:
        assert REGATHER_TAG in regather_tags(kind, op_tags(kind), completes_regather=True)
        assert REGATHER_TAG not in regather_tags(kind, op_tags(kind), reads_graph_input=True), kind
    # only distributed ops: an op that merely reads a parameter is not a re-gather
    assert regather_tags("mul", op_tags("mul"), reads_graph_input=True, completes_regather=True) == op_tags("mul")
    assert REGATHER_TAG in TAGS  # plain graphs may carry it


def test_regather_parameters_makes_exactly_the_regather_ops_recomputable():
    regather_ops = [
        regather_tags(kind, op_tags(kind), reads_graph_input=True, completes_regather=True)
        for kind in sorted(ALL_GATHER_KINDS | WAIT_KINDS)
    ]
    for tags in regather_ops:
        assert REGATHER.allows(tags, fusible=False), tags
        assert EVERYTHING.allows(tags, fusible=False), tags
        # without the switch, even the most permissive policy refuses them
        assert not RecomputePolicy(matmul=True, attention=True, reductions=True, non_fusible=True).allows(tags, fusible=False)
        assert not RecomputePolicy().allows(tags, fusible=False)
        # another never-recompute tag still wins
        for other in ("in_place", "opaque", "no_recompute"):
            assert not EVERYTHING.allows(tags | {other}, fusible=False), (tags, other)
    # every other distributed op stays never-recomputed, switch on and everything allowed
    for kind in sorted(DISTRIBUTED_KINDS):
        tags = op_tags(kind)
        if kind in ALL_GATHER_KINDS | WAIT_KINDS:
            tags = regather_tags(kind, tags)  # an all-gather of an activation, a wait of another collective
        assert not EVERYTHING.allows(tags, fusible=False), kind


def test_regather_parameters_is_validated():
    with pytest.raises(TypeError, match="regather_parameters must be True or False"):
        RecomputePolicy(regather_parameters="yes")
    with pytest.raises(TypeError, match="regather_parameters"):
        RecomputePolicy(regather_parameters=1)
    assert RecomputePolicy().regather_parameters is False


# ---------------------------------------------------------------------------------------------- pricing
def test_a_regather_is_priced_by_the_bytes_it_gathers():
    tagged = regather_tags("torch_all_gather_prim_impl", op_tags("torch_all_gather_prim_impl"), reads_graph_input=True)
    gathered = 3 * 1024
    assert estimate_flops("torch_all_gather_prim_impl", tagged, [(384,)], [], gathered_bytes=gathered) == gathered * REGATHER_FLOPS_PER_BYTE
    assert regather_flops(gathered) == gathered * REGATHER_FLOPS_PER_BYTE
    # collectives compute nothing: other distributed ops (and a wait) cost no FLOPs
    wait = regather_tags("torch_wait_prim_impl", op_tags("torch_wait_prim_impl"), completes_regather=True)
    assert estimate_flops("torch_wait_prim_impl", wait, [], [(768,)], gathered_bytes=gathered) == 0
    scatter = op_tags("torch_reduce_scatter_prim_impl")
    assert estimate_flops("torch_reduce_scatter_prim_impl", scatter, [(768,)], [], gathered_bytes=gathered) == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="gathered_bytes"):
            regather_flops(bad)


GATHERED = 4096  # bytes of one unsharded parameter
ACTIVATION = 1024


def sharded_layers(layers: int) -> nx.DiGraph:
    """A plain graph of ``layers`` FSDP layers: a parameter shard is all-gathered (its future, 0 bytes),
    waited on (the unsharded parameter, :data:`GATHERED` bytes), used by the layer's matmul, and read
    again by the layer's backward."""
    graph = nx.DiGraph()
    graph.add_node("x", phase="forward", bytes=ACTIVATION, is_input=True)
    previous = "x"
    tags = ("distributed", REGATHER_TAG)
    for i in range(layers):
        graph.add_node(f"shard{i}", phase="forward", bytes=GATHERED // 2, is_param=True)
        graph.add_node(f"gather{i}", phase="forward", bytes=0, kind="torch_all_gather_prim_impl", tags=tags,
                       fusible=False, flops=regather_flops(GATHERED))
        graph.add_node(f"wait{i}", phase="forward", bytes=GATHERED, kind="torch_wait_prim_impl", tags=tags,
                       fusible=False, flops=0)
        graph.add_node(f"mm{i}", phase="forward", bytes=ACTIVATION, tags=("matmul",), fusible=False, flops=32 * ACTIVATION)
        graph.add_edges_from([(f"shard{i}", f"gather{i}"), (f"gather{i}", f"wait{i}"), (f"wait{i}", f"mm{i}"), (previous, f"mm{i}")])
        previous = f"mm{i}"
    later = None
    for i in reversed(range(layers)):
        graph.add_node(f"grad{i}", phase="backward", bytes=ACTIVATION, fusible=False, flops=32 * ACTIVATION)
        graph.add_edges_from([(f"wait{i}", f"grad{i}"), (f"mm{i - 1}" if i else "x", f"grad{i}")])
        if later is not None:
            graph.add_edge(later, f"grad{i}")
        later = f"grad{i}"
    return graph


def test_without_a_budget_the_switch_regathers_every_parameter_and_never_keeps_a_future():
    graph, _ = plain_graph(sharded_layers(3))
    kept = plan_graph(graph, RecomputePolicy())
    assert {f"wait{i}" for i in range(3)} <= set(kept.saved)
    assert not any(graph.ops[i].tags & {"distributed"} for i in kept.recomputed_ops)
    regathered = plan_graph(graph, REGATHER)
    assert not set(regathered.saved) & {f"wait{i}" for i in range(3)}
    assert regathered.saved_bytes < kept.saved_bytes
    # the future counts 0 bytes: keeping it and re-running only the wait would look free, but the future
    # holds the gathered buffer; the all-gather itself is re-issued
    assert not set(regathered.saved) & {f"gather{i}" for i in range(3)}
    kinds = [graph.ops[i].kind for i in regathered.recomputed_ops]
    assert kinds.count("torch_all_gather_prim_impl") == kinds.count("torch_wait_prim_impl") == 3
    # the extra cost is the FLOP-equivalent of the bytes gathered again
    assert regathered.extra_flops == 3 * regather_flops(GATHERED)


def test_under_a_price_a_regather_costs_its_flop_equivalent():
    graph, _ = plain_graph(sharded_layers(1))
    gathers = [op.id for op in graph.ops if op.kind in ALL_GATHER_KINDS]
    problem = build_problem(graph, REGATHER, priced=PRICED_POLICY, recompute_price=1e-3)
    assert set(gathers) <= problem.priced_ops
    future = graph.ops[gathers[0]].outputs[0]
    capacities = {
        (int(t), int(h)): int(c) for t, h, c in zip(problem.tails, problem.heads, problem.capacities)
    }
    assert capacities[(SOURCE, problem.in_node(future))] == round(1e-3 * regather_flops(GATHERED))
    assert capacities[(problem.in_node(future), problem.out_node(future))] == INFINITE  # never saved
    # at an infinite price (the budget search's first point) nothing is re-gathered
    pinned = build_problem(graph, REGATHER, priced=PRICED_POLICY, recompute_price=math.inf)
    assert future in pinned.pinned
    # the cut re-gathers when saving the parameter costs more than gathering it again: below
    # 1 / REGATHER_FLOPS_PER_BYTE bytes per FLOP
    above = plan_graph(graph, REGATHER, priced=PRICED_POLICY, recompute_price=4 / REGATHER_FLOPS_PER_BYTE)
    below = plan_graph(graph, REGATHER, priced=PRICED_POLICY, recompute_price=1 / (4 * REGATHER_FLOPS_PER_BYTE))
    assert "wait0" in above.saved
    assert "wait0" not in below.saved and set(gathers) <= set(below.recomputed_ops)


def test_with_a_budget_the_price_decides_what_is_regathered():
    """A generous budget keeps every parameter gathered (no communication); a tighter one re-gathers
    some layers, earliest first (their gathered parameters live longest)."""
    graph = sharded_layers(3)
    everything_kept = remat.solve(graph, 1.0, recompute=REGATHER)
    assert {f"wait{i}" for i in range(3)} <= set(everything_kept.saved)
    tighter = remat.solve(graph, 0.8, recompute=REGATHER)
    regathered = {f"wait{i}" for i in range(3)} - set(tighter.saved)
    assert regathered and "wait0" in regathered
    assert tighter.extra_flops >= regather_flops(GATHERED) * len(regathered)
    assert {f"gather{i}" for i in range(3)} - set(tighter.recomputed_ops) == {f"gather{i}" for i in range(3)} - {
        f"gather{name[len('wait'):]}" for name in regathered
    }
    # without the switch a budget never re-gathers (0.5 is out of reach then: remat says so)
    with pytest.warns(remat.OptimizationWarning, match="not reachable"):
        plan = remat.solve(graph, 0.5, recompute=RecomputePolicy())
    assert not any("distributed" in graph.nodes[node].get("tags", ()) for node in plan.recomputed_ops)
