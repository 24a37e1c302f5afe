"""Property tests on random plain graphs (remat.solve, the flow problem, the solvers).

Examples come from remat.testing.strategies; the hypothesis profile (``ci`` by default, ``nightly`` for
many more examples) is chosen in conftest.py; see docs/testing.md.  Random Thunder traces are in
tests/test_trace_properties.py.
"""

import networkx as nx
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import remat
from remat.core.plain import plain_graph
from remat.planning.flow import min_cut
from remat.planning.problem import build_problem
from remat.testing.oracles import available_values, brute_force_min_saved_bytes, check_plan, graph_source, read_graph
from remat.testing.strategies import GRAPH_DEFECTS, bad_graphs, training_graphs

SOLVERS = ("dinic", "preflow_push")


def solve_or_none(graph, **kwargs):
    """The plan, or None when remat reports that no finite cut exists."""
    try:
        return remat.solve(graph, **kwargs)
    except remat.InfeasibleError:
        return None


@given(training_graphs(max_nodes=24, unsavable=True), st.sampled_from(SOLVERS))
def test_plan_is_valid(graph, solver):
    """Every value the backward reads is saved or recomputable from saved values, parameters and
    inputs without recomputing a pinned op; the plan's other fields agree with its saved set."""
    note(graph_source(graph))
    plan = solve_or_none(graph, solver=solver)
    if plan is None:
        # Infeasible must mean: some backward read cannot be had even when everything savable is saved.
        info = read_graph(graph)
        assert info.needed - available_values(info, set(info.values) - info.unsavable)
        return
    check_plan(graph, plan)


@given(training_graphs(max_nodes=12, max_values=12, unsavable=True))
def test_min_cut_equals_brute_force(graph):
    """On graphs of <= 12 nodes (<= 12 forward values) the min-cut's saved bytes equal the minimum
    over all subsets of forward values that let the backward run; infeasible exactly when none does."""
    note(graph_source(graph))
    expected = brute_force_min_saved_bytes(graph)
    plan = solve_or_none(graph)
    if expected is None:
        assert plan is None, f"remat found a plan ({plan.saved}) where no valid saved set exists"
        return
    assert plan is not None, f"remat reports no finite cut; brute force saves {expected} bytes"
    assert plan.saved_bytes == expected


@given(training_graphs(max_nodes=30, unsavable=True))
def test_dinic_and_preflow_push_agree(graph):
    """Both solvers give the same cut value and (the sink-closest cut being unique) the same cut,
    hence the same plan; infeasible for both or neither."""
    note(graph_source(graph))
    problem = build_problem(plain_graph(graph)[0])
    cuts = {}
    for solver in SOLVERS:
        try:
            cuts[solver] = min_cut(problem, solver)
        except remat.InfeasibleError:
            cuts[solver] = None
    if cuts["dinic"] is None or cuts["preflow_push"] is None:
        assert cuts["dinic"] is cuts["preflow_push"] is None
        return
    assert cuts["dinic"].scale == 1
    assert cuts["dinic"].flow_value == cuts["preflow_push"].flow_value
    assert (cuts["dinic"].sink_side == cuts["preflow_push"].sink_side).all()
    plans = [remat.solve(graph, solver=b) for b in SOLVERS]
    assert plans[0].saved == plans[1].saved
    assert plans[0].recomputed_ops == plans[1].recomputed_ops
    assert plans[0].saved_bytes == plans[1].saved_bytes == cuts["preflow_push"].flow_value


@given(training_graphs(max_nodes=20, max_bytes=2**40))
def test_scaled_dinic_cut_is_near_optimal(graph):
    """Byte counts past scipy's 32-bit capacities are scaled down by ``scale`` (documented in
    remat/planning/flow/dinic.py), so the solvers need not agree exactly.  The strongest true statement:
    Dinic's plan is valid and costs at most the exact optimum plus ``scale`` per value that optimum saves."""
    note(graph_source(graph))
    exact = remat.solve(graph, solver="preflow_push")
    scaled = remat.solve(graph, solver="dinic")
    check_plan(graph, scaled)
    assert exact.saved_bytes <= scaled.saved_bytes <= exact.saved_bytes + scaled.scale * len(exact.saved)


@given(training_graphs(max_nodes=16, shuffle=False), st.randoms(use_true_random=False))
def test_plan_does_not_depend_on_node_order(graph, random):
    """The sink-closest minimum cut is unique, so inserting the same nodes and edges in another order
    gives the same saved set and the same recomputation."""
    note(graph_source(graph))
    nodes = list(graph.nodes(data=True))
    edges = list(graph.edges(data=True))
    random.shuffle(nodes)
    random.shuffle(edges)
    shuffled = nx.DiGraph()
    shuffled.add_nodes_from(nodes)
    shuffled.add_edges_from(edges)
    first, second = solve_or_none(graph), solve_or_none(shuffled)
    if first is None or second is None:
        assert first is second is None
        return
    assert set(first.saved) == set(second.saved)
    assert set(first.recomputed_ops) == set(second.recomputed_ops)
    assert first.saved_bytes == second.saved_bytes


@pytest.mark.parametrize("defect", sorted(GRAPH_DEFECTS))
@settings(max_examples=max(1, settings().max_examples // 10))
@given(data=st.data())
def test_bad_graphs_raise_graph_error(defect, data):
    """Cycles, missing or malformed attributes, multigraphs, empty graphs, non-graphs: GraphError with
    a message naming the problem, from both solvers."""
    graph, defect, message = data.draw(bad_graphs(defects=[defect]))
    if isinstance(graph, nx.DiGraph) and graph.number_of_nodes():
        note(graph_source(graph))
    for solver in SOLVERS:
        with pytest.raises(remat.GraphError, match=message):
            remat.solve(graph, solver=solver)



def test_strategies_without_hypothesis_say_how_to_install_it(monkeypatch):
    """remat.testing imports without hypothesis; its strategies module names the extra to install."""
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "hypothesis", None)  # import hypothesis now raises ImportError
    monkeypatch.delitem(sys.modules, "remat.testing.strategies", raising=False)
    importlib.import_module("remat.testing.oracles")
    with pytest.raises(ImportError, match=r"pip install 'remat\[test\]'"):
        importlib.import_module("remat.testing.strategies")
