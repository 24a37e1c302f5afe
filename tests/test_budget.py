"""Memory budgets: the frontier, budget choice, monotonicity, RNG safety, the MILP reference."""

import warnings

import networkx as nx
import pytest
import torch

import remat
from conftest import LLAMA_2, tiny_litgpt, traced
from remat.planning.budget import PRICED_POLICY, choose, plan_memory
from remat.thunder.execute import example_inputs, execute_joint
from remat.core.plain import plain_graph
from remat.planning.reference import milp_min_peak
from remat.thunder.rewrite import apply_plan
from remat.testing.random_graphs import layered_training_graph


@pytest.fixture(scope="module")
def fused_llama():
    """2-layer tiny LLaMA (2 query groups) on CPU, sequence 16, fused (the trace is shared: conftest.traced)."""
    return remat.fuse(traced(**LLAMA_2))


def same_profile(a, b):
    return a.peak_bytes == b.peak_bytes and a.saved_bytes == b.saved_bytes and [p.live_bytes for p in a.timeline] == [
        p.live_bytes for p in b.timeline
    ]


def test_plan_memory_is_the_memory_of_the_rewritten_trace(fused_llama):
    graph = remat.read_trace(fused_llama)
    frontier = remat.pareto(graph)
    assert frontier
    for point in frontier:
        simulated = plan_memory(graph, point.plan)
        rewritten = remat.estimate_memory(apply_plan(fused_llama, graph, point.plan).trace)
        assert same_profile(simulated, rewritten)
        assert point.peak_bytes == rewritten.peak_bytes


def test_frontier_starts_at_the_default_plan_and_trades_flops_for_peak(fused_llama):
    frontier = remat.pareto(fused_llama)
    default = remat.optimize(fused_llama, strict=True)
    assert frontier[0].peak_bytes == default.after.peak_bytes
    for earlier, later in zip(frontier, frontier[1:]):
        assert later.extra_flops >= earlier.extra_flops and later.peak_bytes < earlier.peak_bytes
    peak, flops, plan = frontier[0]  # unpacks as (peak_bytes, extra_flops, plan)
    assert isinstance(plan, remat.Plan) and peak == frontier[0].peak_bytes


def test_frontier_of_a_full_width_model_recomputes_matmuls_to_go_lower():
    from remat.models import litgpt_model

    model, idx = litgpt_model("Llama-2-7b-hf", layers=2, seq=4096)  # full width, bf16, vocab 512, meta device
    graph = remat.read_trace(remat.fuse(remat.training_trace(model, idx)))
    frontier = remat.pareto(graph)
    assert len(frontier) >= 2 and frontier[-1].peak_bytes < 0.95 * frontier[0].peak_bytes
    nodes = graph.ops
    assert any(nodes[op].tags & {"matmul"} for op in frontier[-1].plan.recomputed_ops)
    assert not any(nodes[op].tags & {"matmul"} for op in frontier[0].plan.recomputed_ops)


def test_budget_picks_the_cheapest_plan_that_fits_and_is_monotone(fused_llama):
    frontier = remat.pareto(fused_llama)
    peaks = sorted({p.peak_bytes for p in frontier})
    budgets = sorted({int(x) for p in peaks for x in (p, p + 1, p - 1)} | {peaks[-1] * 2})
    chosen = [choose(frontier, b)[0].peak_bytes for b in budgets]
    for small, large in zip(chosen, chosen[1:]):
        assert small <= large  # a smaller budget never gives a higher estimated peak
    for budget in (peaks[-1], peaks[0]):
        res = remat.optimize(fused_llama, memory_budget=budget, strict=True)
        assert res.after.peak_bytes <= budget
        cheapest = min((p for p in frontier if p.peak_bytes <= budget), key=lambda p: p.extra_flops)
        assert res.after.peak_bytes == cheapest.peak_bytes


def test_fractional_budget_and_unreachable_budget(fused_llama):
    res = remat.optimize(fused_llama, memory_budget=1.0, strict=True)
    assert res.after.peak_bytes <= res.before.peak_bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        low = remat.optimize(fused_llama, memory_budget=1024)
    assert any("not reachable" in str(w.message) for w in caught)
    assert low.applied and low.after.peak_bytes == low.frontier[-1].peak_bytes
    with pytest.raises(remat.RematError, match="not reachable"):
        remat.optimize(fused_llama, memory_budget=1024, strict=True)


def test_memory_budget_tells_fractions_from_bytes():
    parse = remat.MemoryBudget.parse
    assert parse(0.5).resolve(1000) == 500 and parse(1.0).resolve(1000) == 1000
    assert parse(2048).resolve(1) == 2048 and parse(2048).fraction is None
    assert parse("70%").fraction == 0.7 and parse("0.25").fraction == 0.25
    assert parse("600MiB").bytes == 600 * 2**20 and parse("1.5 GiB").bytes == 3 * 2**29
    assert parse("2GB").bytes == 2 * 10**9 and parse("4096").bytes == 4096 and parse("1B").bytes == 1
    assert parse(None) is None
    budget = parse(0.5)
    assert parse(budget) is budget
    assert str(parse(0.7)) == "70%" and str(parse("600MiB")) == "600 MiB"
    for bad in (0, -1, -0.5, float("nan"), float("inf"), "0", "-3MiB"):
        with pytest.raises(ValueError, match="positive"):
            parse(bad)
    for bad in (1.5, 3.5, "2.5"):  # once read as bytes: now neither a fraction nor a byte count
        with pytest.raises(ValueError, match="neither a fraction in \\(0, 1\\] nor a byte count"):
            parse(bad)
    for bad in (1, "1"):
        with pytest.raises(ValueError, match="ambiguous"):
            parse(bad)
    for bad in ("lots", "12 parsecs", "150%"):
        with pytest.raises(ValueError, match="memory_budget"):
            parse(bad)
    for bad in (True, [1], {"bytes": 1}):
        with pytest.raises(TypeError, match="memory_budget"):
            parse(bad)
    with pytest.raises(ValueError, match="either bytes or a fraction"):
        remat.MemoryBudget(bytes=1, fraction=0.5)


@pytest.mark.parametrize("seed", range(6))
def test_monotone_on_random_graphs(seed):
    graph = layered_training_graph(seed, layers=3, width=3)
    fusion_graph, _ = plain_graph(graph)
    frontier = remat.pareto(fusion_graph)
    top = frontier[0].peak_bytes
    previous = None
    for budget in range(top + 1, frontier[-1].peak_bytes - 2, -max(top // 40, 1)):
        point, _ = choose(frontier, budget)
        if previous is not None:
            assert point.peak_bytes <= previous
        previous = point.peak_bytes


def test_solve_with_a_budget_on_a_plain_graph():
    graph = layered_training_graph(3, layers=4, width=4)
    default = remat.solve(graph)
    fusion_graph, node_ids = plain_graph(graph)
    frontier = remat.pareto(fusion_graph)
    plan = remat.solve(graph, memory_budget=frontier[-1].peak_bytes)
    assert set(plan.recomputed_ops) <= set(graph.nodes)
    assert plan.extra_flops >= default.extra_flops
    assert set(plan.saved) != set(default.saved)


@pytest.mark.parametrize("seed", range(8))
def test_frontier_points_are_close_to_the_milp_optimum(seed):
    """Checkmate-style MILP over remat's plan space: remat's frontier points are within 5% of the optimal
    peak at the same recompute FLOPs (here: equal on most graphs), and the MILP prices remat's own plan
    exactly as the memory model does."""
    graph = layered_training_graph(seed, layers=3, width=4)
    fusion_graph, _ = plain_graph(graph)
    within = 0
    frontier = remat.pareto(fusion_graph)
    for point in frontier:
        evaluated = milp_min_peak(graph, point.extra_flops, recompute=PRICED_POLICY, fix_plan=point.plan)
        assert abs(evaluated.peak_bytes - point.peak_bytes) < 1
        best = milp_min_peak(graph, point.extra_flops, recompute=PRICED_POLICY)
        assert best.optimal and best.peak_bytes <= point.peak_bytes + 1
        within += point.peak_bytes <= 1.05 * best.peak_bytes
    assert within >= len(frontier) - 1


def test_dropout_gradients_are_identical_with_and_without_remat_at_every_budget():
    """On CPU the dropout mask comes from a stateful uniform, which is never recomputed (its mask is
    saved); with the same seed the optimized trace's gradients equal the original's bit for bit at every
    budget.  (On CUDA, remat.fuse turns it into Thunder's stateless uniform_philox, recomputable.)"""
    model = tiny_litgpt("pythia-14m", n_layer=2)
    for block in model.transformer.h:  # LitGPT GPT-NeoX blocks have no dropout of their own: add one
        block.mlp.register_forward_hook(lambda module, args, out: torch.nn.functional.dropout(out, 0.3, training=True))
    fused = remat.fuse(remat.training_trace(model, torch.randint(0, 128, (1, 16))))
    assert any(b.sym.name == "uniform" for r in fused.bound_symbols for b in (r.subsymbols or [r]))
    inputs = example_inputs(fused, int_high=128, dtype=torch.float64)
    torch.manual_seed(7)
    expected = execute_joint(fused, inputs, seed=1)
    frontier = remat.pareto(fused)
    graph = remat.read_trace(fused)
    for point in frontier:
        for op in point.plan.recomputed_ops:
            assert "rng" not in graph.ops[op].tags
        optimized = apply_plan(fused, graph, point.plan).trace
        torch.manual_seed(7)
        got = execute_joint(optimized, inputs, seed=1)
        for a, b in zip(expected.outputs + expected.grads, got.outputs + got.grads):
            if a is not None:
                assert torch.equal(a, b)


def test_milp_rejects_multi_output_nodes():
    graph = nx.DiGraph()
    graph.add_node("a", phase="forward", outputs=("a0", "a1"), output_bytes=(4, 4))
    graph.add_node("b", phase="backward", bytes=1)
    graph.add_edge("a", "b")
    with pytest.raises(remat.GraphError, match="one output"):
        milp_min_peak(graph, 0)
