"""Memory budgets: the frontier, budget choice, monotonicity, RNG safety, the MILP reference."""

import warnings
from dataclasses import replace

import networkx as nx
import pytest
import torch
from hypothesis import given, note

import remat
from conftest import LLAMA_2, tiny_litgpt, traced
from remat.planning import budget as budgets
from remat.planning.budget import PRICED_POLICY, choose, plan_for_budget, plan_memory
from remat.planning.plan import plan_graph
from remat.planning.problem import build_problem
from remat.thunder.execute import example_inputs, execute_joint
from remat.core.plain import plain_graph
from remat.planning.reference import milp_min_peak
from remat.thunder.rewrite import apply_plan
from remat.testing.oracles import check_plan, graph_source
from remat.testing.random_graphs import layered_training_graph
from remat.testing.strategies import training_graphs

#: A tiny LLaMA whose activations outweigh its gradients (width 32, sequence 64), as at long sequences on
#: full-width models: there the price sweep alone jumps from the default plan to "recompute every layer".
WIDE_ACTIVATIONS = dict(
    name="Llama-2-7b-hf", n_layer=2, n_query_groups=2, n_embd=32, n_head=2, intermediate_size=128, block_size=64
)


@pytest.fixture(scope="module")
def fused_llama():
    """2-layer tiny LLaMA (2 query groups) on CPU, sequence 16, fused (the trace is shared: conftest.traced)."""
    return remat.fuse(traced(**LLAMA_2))


@pytest.fixture(scope="module")
def fused_wide():
    """2-layer tiny LLaMA with activations larger than its gradients, on CPU, sequence 64, with dropout on
    each MLP's output (LitGPT LLaMA blocks have none of their own), fused."""
    fields = {k: v for k, v in WIDE_ACTIVATIONS.items() if k != "name"}
    model = tiny_litgpt(WIDE_ACTIVATIONS["name"], **fields)
    for block in model.transformer.h:
        block.mlp.register_forward_hook(lambda module, args, out: torch.nn.functional.dropout(out, 0.3, training=True))
    return remat.fuse(remat.training_trace(model, torch.randint(0, 128, (1, 64))))


def same_plan(a, b):
    return (a.saved, a.recomputed_ops, a.saved_bytes, a.extra_flops) == (b.saved, b.recomputed_ops, b.saved_bytes, b.extra_flops)


def is_monotone(frontier):
    return all(b.extra_flops >= a.extra_flops and b.peak_bytes < a.peak_bytes for a, b in zip(frontier, frontier[1:]))


def symmetric_layers(layers: int) -> nx.DiGraph:
    """A plain graph of identical layers: a matmul writes a big value the backward reads, an op that is
    never recomputed makes the small input of the next layer.  Every matmul has the same bytes per FLOP."""
    graph = nx.DiGraph()
    graph.add_node("x", phase="forward", bytes=10, is_input=True)
    previous = "x"
    for i in range(layers):
        graph.add_node(f"mm{i}", phase="forward", bytes=100, tags=("matmul",), flops=1000)
        graph.add_node(f"h{i}", phase="forward", bytes=10, flops=10, recompute="never")
        graph.add_edge(previous, f"mm{i}")
        graph.add_edge(f"mm{i}", f"h{i}")
        previous = f"h{i}"
    graph.add_node("loss", phase="forward", bytes=1, flops=10)
    graph.add_edge(previous, "loss")
    later = None
    for i in reversed(range(layers)):
        graph.add_node(f"g{i}", phase="backward", bytes=10, flops=1000)
        graph.add_edge(f"mm{i}", f"g{i}")
        if later is not None:
            graph.add_edge(later, f"g{i}")
        later = f"g{i}"
    return graph


def test_identical_layers_are_recomputed_a_layer_at_a_time_not_all_at_once():
    """Issue 15: every layer crosses the same price, so the price sweep alone goes from the default plan
    straight to "recompute every layer"; the frontier now has a point per layer in between, cheapest
    (earliest layers) first, each on the straight line between the two vertices."""
    layers = 6
    graph, _ = plain_graph(symmetric_layers(layers))
    sweep = budgets.pareto(graph, max_interpolated=0)
    frontier = remat.pareto(graph)
    assert len(sweep) == 2  # default, everything recomputed
    # one point per layer; recomputing the last layer too does not lower the peak (its recomputation runs
    # at the start of the backward, where the peak is), so that vertex is beaten by the layer before
    assert len(frontier) == layers and is_monotone(frontier)
    assert all(p.found == "interpolated" for p in frontier[1:])
    default, lowest = frontier[0], frontier[-1]
    for k, point in enumerate(frontier):
        recomputed = {graph.ops[op].kind for op in point.plan.recomputed_ops}
        assert len([op for op in point.plan.recomputed_ops if "matmul" in graph.ops[op].tags]) == k
        line = default.extra_flops + (lowest.extra_flops - default.extra_flops) * (default.peak_bytes - point.peak_bytes) / (
            default.peak_bytes - lowest.peak_bytes
        )
        assert point.extra_flops <= line + 1e-6, recomputed
    first = frontier[1].plan.recomputed_ops
    assert [graph.ops[op].kind for op in first if "matmul" in graph.ops[op].tags] and min(first) == min(
        op.id for op in graph.ops if "matmul" in op.tags
    )  # the earliest layer first


def test_tiny_llama_frontier_is_denser_than_the_price_sweep(fused_wide):
    graph = remat.read_trace(fused_wide)
    sweep = budgets.pareto(graph, max_interpolated=0)
    frontier = remat.pareto(graph)
    assert is_monotone(frontier) and frontier[0].found == "default"
    assert len(frontier) >= len(sweep) + 2 * WIDE_ACTIVATIONS["n_layer"]
    assert frontier[-1].peak_bytes <= sweep[-1].peak_bytes
    for point in frontier:  # every point's estimate is the estimate of its rewritten trace
        assert point.peak_bytes == remat.estimate_memory(apply_plan(fused_wide, graph, point.plan).trace).peak_bytes


def test_cheapest_steps_first_give_budgets_just_below_the_default_plan_a_cheaper_plan(fused_wide, monkeypatch):
    """Between two price vertices the steps are walked in forward order and again cheapest first
    (``_Search.orders``): forward order recomputes a layer's qkv projection before its cheaper output
    projection, so a budget a little below the default plan paid for the larger matmul.  With both
    orders no budget costs more FLOPs than with forward order alone, and some cost fewer."""
    graph = remat.read_trace(fused_wide)
    both = remat.pareto(graph)
    monkeypatch.setattr(budgets._Search, "orders", lambda self, chains: list(chains))
    forward_only = remat.pareto(graph)
    assert is_monotone(both) and len(both) > len(forward_only)
    cheaper = 0
    for point in both + forward_only:
        budget = point.peak_bytes
        assert choose(both, budget)[0].extra_flops <= choose(forward_only, budget)[0].extra_flops
        cheaper += choose(both, budget)[0].extra_flops < choose(forward_only, budget)[0].extra_flops
    assert cheaper
    # the highest point only the cheapest-first order finds (on this model: the output projections
    # alone, below the default plan): forward order's cheapest plan under it recomputes more
    budget = max(p.peak_bytes for p in both if p.peak_bytes not in {q.peak_bytes for q in forward_only})
    assert choose(both, budget)[0].extra_flops < choose(forward_only, budget)[0].extra_flops


def test_a_fraction_is_of_the_default_plan_not_of_the_unoptimized_trace(fused_wide):
    """Issue 15: ``memory_budget=0.7`` once meant 70% of the un-optimized trace's estimated peak, which is
    above the default plan's, so budgets changed nothing; it is 70% of the default plan's peak."""
    graph = remat.read_trace(fused_wide)
    frontier = remat.pareto(graph)
    default = remat.optimize(fused_wide, strict=True)
    assert frontier[0].peak_bytes == default.after.peak_bytes < default.before.peak_bytes
    whole = plan_for_budget(graph, remat.MemoryBudget(fraction=1.0))
    assert whole.reference_bytes == default.after.peak_bytes and same_plan(whole.point.plan, frontier[0].plan)
    target = frontier[len(frontier) // 2]
    fraction = (target.peak_bytes + 0.5) / frontier[0].peak_bytes
    choice = plan_for_budget(graph, remat.MemoryBudget(fraction=fraction))
    assert choice.fits and choice.budget_bytes == int(fraction * frontier[0].peak_bytes)
    assert choice.point.peak_bytes == target.peak_bytes == choose(frontier, choice.budget_bytes)[0].peak_bytes
    result = remat.optimize(fused_wide, memory_budget=fraction, strict=True)
    assert result.after.peak_bytes == target.peak_bytes
    given = plan_for_budget(graph, remat.MemoryBudget(fraction=0.5), reference_peak=1000)
    assert given.reference_bytes == 1000 and given.budget_bytes == 500


def test_a_fraction_is_of_the_default_plan_on_plain_graphs_too():
    graph = symmetric_layers(4)
    default = remat.solve(graph)
    assert remat.solve(graph, memory_budget=1.0).saved == default.saved
    fusion_graph, _ = plain_graph(graph)
    frontier = remat.pareto(fusion_graph)
    half = remat.solve(graph, memory_budget=frontier[2].peak_bytes / frontier[0].peak_bytes)
    assert set(half.saved) == set(frontier[2].plan.saved)


def test_unreachable_budget_names_the_smallest_reachable_peak():
    graph = symmetric_layers(3)
    lowest = remat.pareto(plain_graph(graph)[0])[-1]
    with pytest.warns(remat.OptimizationWarning, match=f"smallest estimated peak remat finds is {lowest.peak_bytes} bytes"):
        remat.solve(graph, memory_budget=2)


def test_deep_models_bisect_the_chain_that_brackets_the_budget(fused_wide, monkeypatch):
    """Past MAX_INTERPOLATED steps, plan_for_budget bisects one chain instead of evaluating the frontier
    (what keeps 32 layers within seconds): it chooses what the full frontier in forward order would (the
    bisection walks forward order alone, not cheapest first as well), evaluating fewer plans."""
    graph = remat.read_trace(fused_wide)
    with monkeypatch.context() as forward_only:
        forward_only.setattr(budgets._Search, "orders", lambda self, chains: list(chains))
        frontier = remat.pareto(graph)
    monkeypatch.setattr(budgets, "MAX_INTERPOLATED", 2)
    for point in frontier:
        for budget in (point.peak_bytes, point.peak_bytes + 1):
            choice = plan_for_budget(graph, remat.MemoryBudget(bytes=budget))
            assert choice.fits and choice.point.peak_bytes == choose(frontier, budget)[0].peak_bytes
            assert len(choice.frontier) < len(frontier) or budget >= frontier[0].peak_bytes
    below = plan_for_budget(graph, remat.MemoryBudget(bytes=2))
    assert not below.fits and below.point.peak_bytes == frontier[-1].peak_bytes


def test_priced_ops_restrict_pricing_and_default_is_unchanged():
    graph, _ = plain_graph(symmetric_layers(3))
    everything = build_problem(graph, priced=PRICED_POLICY, recompute_price=0.0)
    same = build_problem(graph, priced=PRICED_POLICY, recompute_price=0.0, priced_ops=None)
    assert everything.priced_ops == {op.id for op in graph.ops if "matmul" in op.tags}
    assert (everything.capacities == same.capacities).all() and (everything.tails == same.tails).all()
    first = min(everything.priced_ops)
    only_first = build_problem(graph, priced=PRICED_POLICY, recompute_price=0.0, priced_ops={first})
    assert only_first.priced_ops == {first}
    unpriced = build_problem(graph)
    assert unpriced.priced_ops == set()
    pinned = {graph.ops[op].outputs[0] for op in everything.priced_ops - {first}}
    assert pinned <= only_first.pinned and not pinned & everything.pinned


@given(training_graphs(max_nodes=14))
def test_every_frontier_plan_is_valid_and_the_choice_is_monotone(graph):
    note(graph_source(graph))
    fusion_graph, node_ids = plain_graph(graph)
    try:
        frontier = remat.pareto(fusion_graph)
    except remat.InfeasibleError:
        return
    assert same_plan(frontier[0].plan, plan_graph(fusion_graph))
    assert is_monotone(frontier)
    for point in frontier:
        check_plan(graph, replace(point.plan, recomputed_ops=tuple(node_ids[i] for i in point.plan.recomputed_ops)), PRICED_POLICY)
    chosen = [choose(frontier, b)[0].peak_bytes for b in sorted({p.peak_bytes + d for p in frontier for d in (-1, 0, 1)})]
    assert chosen == sorted(chosen)


@given(training_graphs(max_nodes=14))
def test_budgets_above_the_default_plan_are_valid_fit_and_trade_monotonically(graph):
    """Above the default plan's peak a budget buys fewer extra FLOPs (values kept instead of recomputed
    for readers outside regions: every backward op of a plain graph is one); each choice is a valid
    plan that fits, and more room never means a lower peak or more recomputation."""
    note(graph_source(graph))
    fusion_graph, node_ids = plain_graph(graph)
    try:
        default = plan_for_budget(fusion_graph, remat.MemoryBudget(fraction=1.0)).point
    except remat.InfeasibleError:
        return
    previous = default
    for factor in (1.05, 1.3, 2.0, 4.0):
        budget = int(default.peak_bytes * factor) + 1
        choice = plan_for_budget(fusion_graph, remat.MemoryBudget(bytes=budget))
        assert choice.fits and choice.point.peak_bytes <= budget
        assert choice.point.peak_bytes >= previous.peak_bytes and choice.point.extra_flops <= previous.extra_flops
        assert plan_memory(fusion_graph, choice.plan).peak_bytes == choice.point.peak_bytes
        check_plan(graph, replace(choice.plan, recomputed_ops=tuple(node_ids[i] for i in choice.plan.recomputed_ops)), remat.RecomputePolicy())
        previous = choice.point


def test_memory_budget_from_free_device_memory():
    """The budget for "what this GPU has": free memory, less what is allocated later outside the step,
    less a headroom for what the memory model does not count."""
    gib = 2**30
    budget = remat.MemoryBudget.from_free_memory(20 * gib, outside_step_bytes=4 * gib, headroom=0.25)
    assert budget.bytes == 12 * gib and budget.fraction is None and budget.resolve(123) == 12 * gib
    assert remat.MemoryBudget.from_free_memory(1000).bytes == 1000
    assert remat.MemoryBudget.from_free_memory(1001, headroom=0.5).bytes == 500  # rounded down
    with pytest.raises(ValueError, match="nothing is left for the step: 1 GiB free - 2 GiB outside"):
        remat.MemoryBudget.from_free_memory(gib, outside_step_bytes=2 * gib)
    with pytest.raises(ValueError, match="headroom must be a fraction in \\[0, 1\\)"):
        remat.MemoryBudget.from_free_memory(gib, headroom=1.0)
    with pytest.raises(ValueError, match="outside_step_bytes must be >= 0"):
        remat.MemoryBudget.from_free_memory(gib, outside_step_bytes=-1)
    for bad in (1.5 * gib, "1GiB", True):
        with pytest.raises(TypeError, match="free_bytes must be an int"):
            remat.MemoryBudget.from_free_memory(bad)
    with pytest.raises(TypeError, match="headroom"):
        remat.MemoryBudget.from_free_memory(gib, headroom="10%")


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


def test_plan_memory_counts_the_donations_of_the_rewritten_trace(fused_llama):
    """Under the graph runtime (``donate_dying_inputs``) the budget search measures plans with the
    donations their rewritten traces will have (:mod:`remat.core.donation`): the simulated graph finds the
    same ones as a read of the rewritten trace, and the same profile."""
    from remat.core.layout import layout_graph, plan_layout
    from remat.core.memory import profile_graph

    graph = remat.read_trace(fused_llama, donate_dying_inputs=True)
    assert graph.donating is not None
    frontier = remat.pareto(graph)
    donated = 0
    for point in frontier:
        simulated = layout_graph(graph, plan_layout(graph, point.plan))
        rewritten = remat.read_trace(apply_plan(fused_llama, graph, point.plan).trace, ops=False, donate_dying_inputs=True)
        assert len(simulated.donations) == len(rewritten.donations)
        assert same_profile(profile_graph(simulated), profile_graph(rewritten))
        donated += len(rewritten.donations)
    assert donated > 0


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


def test_budget_picks_the_cheapest_plan_that_fits_and_is_monotone(fused_wide):
    frontier = remat.pareto(fused_wide)
    peaks = sorted({p.peak_bytes for p in frontier})
    budget_bytes = sorted({int(x) for p in peaks for x in (p, p + 1, p - 1)} | {peaks[-1] * 2})
    chosen = [choose(frontier, b)[0].peak_bytes for b in budget_bytes]
    for small, large in zip(chosen, chosen[1:]):
        assert small <= large  # a smaller budget never gives a higher estimated peak
    for budget in (peaks[-1], peaks[0]):
        res = remat.optimize(fused_wide, memory_budget=budget, strict=True)
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


def test_every_frontier_plan_gives_bit_identical_gradients_in_fp32_with_dropout(fused_wide):
    """Every point of the dense frontier (interpolated ones included) is a valid plan: on CPU in fp32 with
    dropout on, the optimized trace's outputs and gradients equal the original's bit for bit.  On CPU the
    dropout mask comes from a stateful uniform, which is never recomputed (its mask is saved) at any
    budget.  (On CUDA, remat.fuse turns it into Thunder's stateless uniform_philox, recomputable.)"""
    fused = fused_wide
    assert any(b.sym.name == "uniform" for r in fused.bound_symbols for b in (r.subsymbols or [r]))
    inputs = example_inputs(fused, int_high=128, dtype=torch.float32)
    torch.manual_seed(7)
    expected = execute_joint(fused, inputs, seed=1)
    graph = remat.read_trace(fused)
    frontier = remat.pareto(graph)
    assert len(frontier) > len(budgets.pareto(graph, max_interpolated=0))
    assert any(graph.ops[op].tags & {"matmul"} for op in frontier[-1].plan.recomputed_ops)
    for point in frontier:
        assert not any("rng" in graph.ops[op].tags for op in point.plan.recomputed_ops)
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
