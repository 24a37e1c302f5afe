"""remat.solve / remat.optimize: hand-solved cuts, the gelu-before-matmul case, solvers, numerics."""

import warnings

import networkx as nx
import pytest
import torch
import torch.nn.functional as F

import remat
from conftest import LLAMA_2, PYTHIA_2, traced
from remat.thunder.execute import execute_joint, example_inputs
from remat.planning.problem import build_problem
from remat.planning.flow import min_cut


def plain(nodes, edges):
    g = nx.DiGraph()
    for name, attrs in nodes.items():
        g.add_node(name, **attrs)
    g.add_edges_from(edges)
    return g


def fwd(nbytes, **kw):
    return dict(phase="forward", bytes=nbytes, **kw)


def bwd(**kw):
    return dict(phase="backward", bytes=kw.pop("nbytes", 1), **kw)


def mlp_graph(a_recompute=None):
    # x -> a (elementwise) -> m (matmul) -> g (gelu) -> out (matmul); the backward reads g, m, a, x.
    a_attrs = fwd(400, flops=400)
    if a_recompute:
        a_attrs["recompute"] = a_recompute
    nodes = {
        "x": fwd(1000, is_input=True),
        "a": a_attrs,
        "m": fwd(300, tags={"matmul"}, flops=10_000),
        "g": fwd(300, flops=300),
        "out": fwd(50, tags={"matmul"}),
        "d_out": bwd(),
        "d_g": bwd(),
        "d_m": bwd(),
        "d_a": bwd(),
    }
    edges = [("x", "a"), ("a", "m"), ("m", "g"), ("g", "out"), ("g", "d_out"), ("m", "d_g"), ("a", "d_m"), ("x", "d_a")]
    return plain(nodes, edges)


@pytest.mark.parametrize("solver", ["dinic", "preflow_push"])
def test_hand_solved_mlp(solver):
    plan = remat.solve(mlp_graph(), solver=solver)
    # a is recomputed from the input for free; the matmul output m must be kept; gelu is recomputed.
    assert plan.saved == ("m",)
    assert plan.saved_bytes == 300
    assert set(plan.recomputed_ops) == {"a", "g"}
    assert set(plan.recomputed_values) == {"a", "g"}
    assert plan.extra_flops == 700


@pytest.mark.parametrize("solver", ["dinic", "preflow_push"])
def test_hand_solved_mlp_when_a_may_not_be_recomputed(solver):
    plan = remat.solve(mlp_graph(a_recompute="never"), solver=solver)
    assert set(plan.saved) == {"a", "m"} and plan.saved_bytes == 700
    assert plan.recomputed_ops == ("g",)


@pytest.mark.parametrize("r_bytes, s_bytes, saved", [(30, 40, {"r", "s"}), (60, 50, {"q"})])
def test_two_small_reads_versus_one_large_producer(r_bytes, s_bytes, saved):
    # p (pinned) -> q -> {r, s}; the backward reads r and s.  Keep r and s when they are smaller together
    # than q; otherwise keep q (not p: equal bytes, and the sink-closest cut recomputes less).
    nodes = {
        "p": fwd(100, recompute="never"),
        "q": fwd(100),
        "r": fwd(r_bytes),
        "s": fwd(s_bytes),
        "b1": bwd(),
        "b2": bwd(),
    }
    g = plain(nodes, [("p", "q"), ("q", "r"), ("q", "s"), ("r", "b1"), ("s", "b2")])
    plans = [remat.solve(g, solver=b) for b in ("dinic", "preflow_push")]
    for plan in plans:
        assert set(plan.saved) == saved
    assert plans[0].saved_bytes == plans[1].saved_bytes == min(r_bytes + s_bytes, 100)


@pytest.mark.parametrize("host", [False, True], ids=["own-region", "hosted"])
def test_gelu_is_recomputed_in_a_backward_region_before_the_backward_matmul(host):
    def mlp(x, w1, w2):
        return F.linear(F.gelu(F.linear(x, w1)), w2)

    x = torch.randn(2, 8, 16, dtype=torch.float64)
    w1 = torch.randn(64, 16, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(16, 64, dtype=torch.float64, requires_grad=True)
    fused = remat.fuse(remat.training_trace(mlp, x, w1, w2))
    res = remat.optimize(fused, strict=True, recompute=remat.RecomputePolicy(host_recompute=host))
    graph = res.graph
    # Only the first linear's output is kept; gelu's output is recomputed.
    assert len(res.plan.saved) == 1
    assert graph.nx.nodes[graph.tensors[res.plan.saved[0]].producer_node]["kind"] == "linear"

    bsyms = [b for b in res.trace.bound_symbols]
    names = [b.sym.name for b in bsyms]
    backward_start = names.index("get_grad")
    regions_after = [i for i, b in enumerate(bsyms) if b.sym.is_fusion and i > backward_start]
    recompute = [i for i in regions_after if any(s.sym.name == "erf" for s in bsyms[i].subsymbols)]
    assert len(recompute) == (1 if host else 2), "gelu is recomputed once, plus gelu's backward"
    first = recompute[0]
    # The region writes gelu under a fresh name, read (through a reshape view) by the weight-grad matmul
    # that comes after it. Own region: it writes only that. Hosted: gelu's backward (erf again) rides
    # in the same region, moved up to before the matmul, and the region writes the input-grad too.
    outs = bsyms[first].flat_proxy_outs
    assert len(outs) == (2 if host else 1)
    readers = {
        out.name: next((b for b in bsyms[first + 1 :] if out.name in {p.name for p in b.flat_proxy_args}), None)
        for out in outs
    }
    gelu_out = next(name for name, b in readers.items() if b is not None and b.sym.name == "reshape")
    assert all(gelu_out not in {p.name for p in b.flat_proxy_outs} for b in bsyms[:backward_start])
    view_out = readers[gelu_out].flat_proxy_outs[0].name
    consumer = next(b for b in bsyms if view_out in {p.name for p in b.flat_proxy_args})
    assert consumer.sym.name == "matmul"

    # Thunder's own pass cannot place gelu there and keeps more.
    from remat.thunder.execute import thunder_context
    from thunder.core.rematerialization import rematerialize

    with thunder_context():
        thunder_trace = rematerialize(fused)
    assert res.after.saved_bytes < remat.estimate_memory(thunder_trace).saved_bytes

    inputs = [x, w1.detach(), w2.detach()]
    expected = execute_joint(fused, inputs)
    got = execute_joint(res.trace, inputs)
    for a, b in zip(expected.outputs + expected.grads, got.outputs + got.grads):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.fixture(scope="module")
def fused_pythia():
    """2-layer tiny GPT-NeoX (pythia) on CPU, sequence 16, fused (the trace is shared: conftest.traced)."""
    return remat.fuse(traced(**PYTHIA_2))


def test_solvers_agree_on_a_litgpt_graph(fused_pythia):
    graph = remat.read_trace(fused_pythia)
    problem = build_problem(graph)
    cuts = {b: min_cut(problem, b) for b in ("dinic", "preflow_push")}
    assert cuts["dinic"].scale == 1
    assert cuts["dinic"].flow_value == cuts["preflow_push"].flow_value
    assert (cuts["dinic"].sink_side == cuts["preflow_push"].sink_side).all()
    plans = [remat.solve(graph.nx, solver=b) for b in ("dinic", "preflow_push")]
    assert plans[0].saved == plans[1].saved and plans[0].saved_bytes == plans[1].saved_bytes


def test_default_plan_recomputes_no_matmul_and_little_compute(fused_pythia):
    res = remat.optimize(fused_pythia, strict=True)
    nodes = res.graph.nx.nodes
    assert res.plan.recomputed_ops
    for op in res.plan.recomputed_ops:
        assert not nodes[op]["tags"] & {"matmul", "attention", "reduction", "rng"}
    assert res.after.saved_bytes < res.before.saved_bytes
    assert res.after.peak_bytes <= res.before.peak_bytes
    assert res.extra_flops <= 0.02 * res.step_flops


def relative_error(a, b):
    scale = a.abs().max().item() or 1.0
    return (a - b).abs().max().item() / scale


@pytest.mark.parametrize(
    "model",
    [
        PYTHIA_2,  # GPT-NeoX: parallel residual, LayerNorm, GELU MLP
        LLAMA_2,  # LLaMA: RMSNorm, SwiGLU MLP, grouped-query attention (2 query groups)
    ],
    ids=lambda model: model["name"],
)
def test_optimized_trace_matches_original_numerics(model):
    """2 layers each, sequence 16, float32, on CPU (traces shared with other files: conftest.traced)."""
    fused = remat.fuse(traced(**model))
    res = remat.optimize(fused, strict=True)
    assert res.applied and res.plan.recomputed_ops
    inputs = example_inputs(fused, int_high=128)  # float32, as the model
    expected = execute_joint(fused, inputs, seed=3)
    got = execute_joint(res.trace, inputs, seed=3)
    pairs = [(a, b) for a, b in zip(expected.outputs + expected.grads, got.outputs + got.grads) if a is not None]
    assert len(pairs) > 10
    assert max(relative_error(a, b) for a, b in pairs) <= 1e-6


def test_optimize_is_idempotent(fused_pythia):
    first = remat.optimize(fused_pythia, strict=True)
    second = remat.optimize(first.trace, strict=True)
    assert second.after.saved_bytes == first.after.saved_bytes
    assert second.after.peak_bytes == first.after.peak_bytes
    assert not second.plan.recomputed_ops


# ---------------------------------------------------------------- bad input


def test_plain_graph_errors():
    with pytest.raises(remat.GraphError, match="cycle"):
        remat.solve(plain({"a": fwd(1), "b": fwd(1)}, [("a", "b"), ("b", "a")]))
    with pytest.raises(remat.GraphError, match="'bytes'"):
        remat.solve(plain({"a": dict(phase="forward"), "b": bwd()}, [("a", "b")]))
    with pytest.raises(remat.GraphError, match="'phase'"):
        remat.solve(plain({"a": dict(bytes=3), "b": bwd()}, [("a", "b")]))
    with pytest.raises(remat.GraphError, match="does not know"):
        remat.solve(plain({"a": fwd(3, tags={"mystery"}), "b": bwd()}, [("a", "b")]))
    with pytest.raises(remat.GraphError, match="reads backward"):
        remat.solve(plain({"a": bwd(), "b": fwd(3)}, [("a", "b")]))
    with pytest.raises(remat.GraphError, match="empty"):
        remat.solve(nx.DiGraph())
    with pytest.raises(remat.GraphError, match="DiGraph"):
        remat.solve({"a": 1})


@pytest.mark.parametrize("solver", ["dinic", "preflow_push"])
def test_no_finite_cut_is_reported(solver):
    g = plain({"a": fwd(3, recompute="never", savable=False), "b": bwd()}, [("a", "b")])
    with pytest.raises(remat.InfeasibleError, match="no finite cut"):
        remat.solve(g, solver=solver)


def test_unknown_solver():
    with pytest.raises(ValueError, match="unknown solver"):
        remat.solve(mlp_graph(), solver="cplex")


def test_optimize_rejects_bad_traces(pythia_trace):
    with pytest.raises(TypeError, match="training_trace"):
        remat.optimize(lambda x: x)

    import thunder

    def fn(x):
        return x * 2

    jitted = thunder.jit(fn)
    jitted(torch.randn(3))
    with pytest.raises(remat.NoBackwardError):
        remat.optimize(thunder.last_traces(jitted)[-1])


def test_a_failing_rewrite_leaves_the_trace_as_it_was(fused_pythia, monkeypatch):
    import remat.pipeline as optimize_module

    def broken(*args, **kwargs):
        raise RuntimeError("simulated rewrite bug")

    monkeypatch.setattr(optimize_module, "apply_plan", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = remat.optimize(fused_pythia, thunder_baseline=False)
    assert not res.applied and res.trace is fused_pythia and res.chosen == "unplanned"
    assert res.after == res.before
    assert "simulated rewrite bug" in res.notes[0]
    assert [w.category for w in caught] == [remat.OptimizationWarning]
    assert caught[0].filename == __file__  # the warning points at the caller's line, not remat's
    with pytest.raises(RuntimeError, match="simulated"):
        remat.optimize(fused_pythia, strict=True)


def test_a_solver_is_a_name_or_a_function():
    """``solver=`` takes an algorithm's name or any function ``problem -> CutResult`` (as networkx's
    ``flow_func=``); the plan says which one cut it."""
    from remat.planning import flow

    calls = []

    def counting(problem):
        calls.append(problem.num_nodes)
        return flow.dinic.minimum_cut(problem)

    by_name = remat.solve(mlp_graph(), solver="dinic")
    by_function = remat.solve(mlp_graph(), solver=counting)
    assert calls and by_function.saved == by_name.saved and by_function.recomputed_ops == by_name.recomputed_ops
    assert by_name.solver == "dinic" and remat.solve(mlp_graph(), solver="preflow_push").solver == "preflow_push"
    assert set(flow.ALGORITHMS) == {"dinic", "preflow_push"}


def test_graphs_are_frozen(fused_pythia):
    import dataclasses

    graph = remat.read_trace(fused_pythia)
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.ops = ()
    with pytest.raises(TypeError):
        graph.tensors["x"] = None
    assert isinstance(graph.ops, tuple) and isinstance(graph.units, tuple)
    assert graph.mutation_hazards == {} and graph.view_ops  # derived facts, computed once by the graph itself


def test_extra_flops_mean_one_thing():
    """Issue 17: solve counted a recomputed op once, pareto once per consumer.  One definition now
    (docs/concepts.md, "Extra FLOPs"): what the rewritten step runs beyond the original, an op recomputed
    for two backward units counted twice; for a trace, the difference of the two traces' FLOPs."""
    g = nx.DiGraph()
    g.add_node("x", phase="forward", bytes=100, is_input=True)
    g.add_node("f", phase="forward", bytes=100, flops=7)
    g.add_node("loss", phase="forward", bytes=4, flops=1)
    g.add_node("b1", phase="backward", bytes=100, flops=1)
    g.add_node("b2", phase="backward", bytes=100, flops=1)
    g.add_edges_from([("x", "f"), ("f", "loss"), ("f", "b1"), ("f", "b2"), ("b1", "b2")])
    plan = remat.solve(g)
    assert plan.recomputed_ops == ("f",) and plan.extra_flops == 2 * 7
    assert [point.extra_flops for point in remat.pareto(g)][0] == plan.extra_flops
    res = remat.optimize(remat.fuse(traced(**PYTHIA_2)))
    assert res.applied and res.extra_flops > 0
    assert res.extra_flops == res.plan.extra_flops == res.after_graph.step_flops - res.graph.step_flops
