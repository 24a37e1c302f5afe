"""Validation at the public API: wrong types, traces without a backward, empty inputs, bad budgets,
policies, solvers and runtimes give a clear error (type and message) before any work is done."""

import math

import networkx as nx
import pytest
import torch

import remat


@pytest.fixture(scope="module")
def forward_only():
    """A forward-only Thunder trace (no backward)."""
    import thunder

    jitted = thunder.jit(lambda x: x.sin() * 2)
    jitted(torch.randn(3))
    return thunder.last_traces(jitted)[0]


@pytest.fixture(scope="module")
def empty_trace():
    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
    from thunder.core.trace import TraceCtx

    return TraceCtx(None)


@pytest.fixture(scope="module")
def small_graph():
    g = nx.DiGraph()
    g.add_node("a", phase="forward", bytes=10)
    g.add_node("b", phase="backward", bytes=1)
    g.add_edge("a", "b")
    return g


@pytest.fixture(scope="module")
def fused_joint():
    w = torch.randn(4, 4, requires_grad=True)
    return remat.fuse(remat.training_trace(lambda x, w: (x @ w).sin().sum(), torch.randn(2, 4), w))


BAD_BUDGETS = [
    (-1, ValueError, "positive"),
    (0, ValueError, "positive"),
    (0.0, ValueError, "positive"),
    (-0.5, ValueError, "positive"),
    (math.nan, ValueError, "positive"),
    (math.inf, ValueError, "positive"),
    (1.5, ValueError, "neither a fraction in"),  # once silently one byte
    (1, ValueError, "ambiguous"),  # 100% or one byte?
    ("-2GiB", ValueError, "positive"),
    (True, TypeError, "got bool"),
    ([100], TypeError, "got list"),
]


# ------------------------------------------------------------------------------ tracing


def test_training_trace_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module or a callable, got int"):
        remat.training_trace(3)
    with pytest.raises(remat.NoBackwardError, match="nothing requires grad"):
        remat.training_trace(lambda x: x.sin(), torch.randn(3))


def test_training_trace_refuses_traces_and_jitted_functions(forward_only):
    import thunder

    with pytest.raises(TypeError, match="got a Thunder trace"):
        remat.training_trace(forward_only)
    with pytest.raises(TypeError, match="already wrapped by thunder.jit"):
        remat.training_trace(thunder.jit(lambda x: x), torch.randn(2, requires_grad=True))


# ------------------------------------------------------------------------------ fuse


def test_fuse_arguments(forward_only, empty_trace, fused_joint):
    with pytest.raises(TypeError, match=r"fuse expects a Thunder trace \(TraceCtx\), got NoneType"):
        remat.fuse(None)
    with pytest.raises(TypeError, match="Call remat.training_trace"):
        remat.fuse(lambda x: x)
    with pytest.raises(remat.UnsupportedTraceError, match="no bound symbols"):
        remat.fuse(empty_trace)
    with pytest.raises(TypeError, match="fusion= must be a remat.FusionPolicy, got str"):
        remat.fuse(forward_only, "fast")
    with pytest.raises(TypeError, match="executor must be a remat RegionExecutor"):
        remat.fuse(forward_only, executor="torch")
    with pytest.raises(ValueError, match="already fused"):
        remat.fuse(fused_joint)
    # a forward-only trace is fine (inference is fused without planning)
    assert len(remat.fuse(forward_only).bound_symbols) == len(forward_only.bound_symbols)


# ------------------------------------------------------------------------------ optimize


def test_optimize_arguments(forward_only, empty_trace, fused_joint):
    with pytest.raises(TypeError, match="got NoneType"):
        remat.optimize(None)
    with pytest.raises(TypeError, match="Call remat.training_trace"):
        remat.optimize(lambda x: x)
    with pytest.raises(remat.NoBackwardError, match="joint forward\\+backward"):
        remat.optimize(forward_only)
    with pytest.raises(remat.UnsupportedTraceError, match="no bound symbols"):
        remat.optimize(empty_trace)
    with pytest.raises(ValueError, match="unknown solver 'cplex'"):
        remat.optimize(fused_joint, solver="cplex")
    with pytest.raises(TypeError, match="solver= must be one of"):
        remat.optimize(fused_joint, solver=3)
    with pytest.raises(TypeError, match="recompute= must be a remat.RecomputePolicy, got FusionPolicy"):
        remat.optimize(fused_joint, recompute=remat.FusionPolicy())
    assert remat.optimize(fused_joint, strict=True).applied  # the good call works


@pytest.mark.parametrize("budget, error, message", BAD_BUDGETS)
def test_bad_budgets_are_refused_everywhere(fused_joint, small_graph, budget, error, message):
    """Before any work, the same error from every entry point (one parser: remat.MemoryBudget)."""
    with pytest.raises(error, match=f"memory_budget.*{message}"):
        remat.optimize(fused_joint, budget)
    with pytest.raises(error, match=f"memory_budget.*{message}"):
        remat.solve(small_graph, budget)
    with pytest.raises(error, match=f"memory_budget.*{message}"):
        remat.executor(memory_budget=budget)
    with pytest.raises(error, match=f"memory_budget.*{message}"):
        remat.jit(lambda x: x, memory_budget=budget)


# ------------------------------------------------------------------------------ solve and graphs


def test_solve_arguments(small_graph, fused_joint):
    with pytest.raises(remat.GraphError, match="expected a networkx.DiGraph, got TraceCtx"):
        remat.solve(fused_joint)
    with pytest.raises(remat.GraphError, match="expected a networkx.DiGraph, got NoneType"):
        remat.solve(None)
    with pytest.raises(remat.GraphError, match="empty"):
        remat.solve(nx.DiGraph())
    with pytest.raises(ValueError, match="unknown solver 'gurobi'"):
        remat.solve(small_graph, solver="gurobi")
    with pytest.raises(TypeError, match="recompute= must be a remat.RecomputePolicy, got dict"):
        remat.solve(small_graph, recompute={"matmul": True})
    assert remat.solve(small_graph).recomputed_ops == ("a",)  # the good call works


def test_graph_and_memory_arguments(empty_trace, small_graph):
    with pytest.raises(TypeError, match="expected a Thunder trace"):
        remat.read_trace(small_graph)
    with pytest.raises(TypeError, match="Call remat.training_trace"):
        remat.read_trace(lambda x: x)
    with pytest.raises(remat.UnsupportedTraceError, match="no bound symbols"):
        remat.read_trace(empty_trace)
    with pytest.raises(TypeError, match="expected a Thunder trace"):
        remat.estimate_memory(None)
    with pytest.raises(remat.UnsupportedTraceError, match="no bound symbols"):
        remat.estimate_memory(empty_trace)


# ------------------------------------------------------------------------------ jit, executor, nvFuser


def test_jit_and_executor_arguments():
    import thunder

    with pytest.raises(TypeError, match="callable, got int"):
        remat.jit(3)
    with pytest.raises(TypeError, match="already wrapped by thunder.jit"):
        remat.jit(thunder.jit(lambda x: x))
    with pytest.raises(TypeError, match="strict must be True or False"):
        remat.executor(strict="yes")
    with pytest.raises(TypeError, match="recompute= must be a remat.RecomputePolicy"):
        remat.executor(recompute=remat.FusionPolicy())
    with pytest.raises(TypeError, match="fusion= must be a remat.FusionPolicy"):
        remat.jit(lambda x: x, fusion=remat.RecomputePolicy())
    with pytest.raises(ValueError, match="unknown runtime 'cuda'"):
        remat.jit(lambda x: x, runtime="cuda")
    # the keywords of remat 0.1 would reach thunder.jit as compile options: they are refused by name
    with pytest.raises(TypeError, match="policy= was renamed: fusion="):
        remat.jit(lambda x: x, policy=remat.FusionPolicy())
    with pytest.raises(TypeError, match="backend= was renamed: runtime="):
        remat.jit(lambda x: x, backend="torch")


def test_definition_source_arguments(fused_joint):
    from remat.nvfuser import definition_source

    with pytest.raises(TypeError, match="got NoneType"):
        definition_source(None)
    with pytest.raises(TypeError, match="got TraceCtx .take one from trace.bound_symbols"):
        definition_source(fused_joint)
    stand_alone = next(b for b in fused_joint.bound_symbols if not b.sym.is_fusion)
    with pytest.raises(TypeError, match="fusion region"):
        definition_source(stand_alone)
    region = next(b for b in fused_joint.bound_symbols if b.sym.is_fusion)
    with pytest.raises(ValueError, match="input_descriptors has 0 entries"):
        definition_source(region, [])
    assert "FusionDefinition" in definition_source(region)


# ------------------------------------------------------------------------------ plain-graph schema


def chain(**attrs):
    """``x -> m -> dm``: an input, a forward node ``m`` (with ``attrs`` on top of valid ones) and a backward
    node reading it."""
    g = nx.DiGraph()
    g.add_node("x", phase="forward", bytes=8, is_input=True)
    g.add_node("m", phase="forward", bytes=16, flops=10)
    g.nodes["m"].update(attrs)
    g.add_node("dm", phase="backward", bytes=8)
    g.add_edges_from([("x", "m"), ("m", "dm")])
    return g


BAD_NODES = [
    # numbers: finite, whole, non-negative; no strings, no bools, never rounded
    (dict(bytes=math.inf), "node 'm': 'bytes' must hold integer byte counts .*got inf, which is not finite"),
    (dict(bytes=math.nan), "node 'm': 'bytes' must hold integer byte counts .*got nan, which is not finite"),
    (dict(bytes="400"), "node 'm': 'bytes' must hold integer byte counts .*got str '400'"),
    (dict(bytes=400.7), "node 'm': 'bytes' must hold integer byte counts .*got 400.7, which is not a whole number"),
    (dict(bytes=True), "node 'm': 'bytes' must hold integer byte counts .*got bool True"),
    (dict(bytes=-1), "node 'm': negative size -1 in 'bytes'"),
    (dict(flops="x"), "node 'm': 'flops' must hold integer FLOP counts .*got str 'x'"),
    (dict(flops=-1), "node 'm': negative FLOP count -1 in 'flops'"),
    (dict(flops=math.inf), "node 'm': 'flops' .*not finite"),
    (dict(flops=2.5), "node 'm': 'flops' .*not a whole number"),
    (dict(save_cost=-3), "node 'm': negative size -3 in 'save_cost'"),
    (dict(bytes=10**30), r"byte counts .* add up to 1000000000000000000000000000016, more than .* 64-bit arithmetic"),
    (dict(flops=2**62), r"FLOP counts add up to 4611686018427387904, more than .* 64-bit arithmetic"),
    (dict(save_cost="0"), "node 'm': 'save_cost' must hold integer byte counts"),
    # outputs and their sizes and costs, aligned
    (dict(outputs=("a", "b"), output_bytes=(4, 4.5)), r"node 'm': 'output_bytes\[1\]' .*not a whole number"),
    (dict(outputs=("a", "b"), output_bytes=(4, -4)), r"node 'm': negative size -4 in 'output_bytes\[1\]'"),
    (dict(outputs=("a", "b"), output_bytes="44"), "node 'm': 'output_bytes' must hold integer byte counts in a tuple or list"),
    (dict(outputs="ab", output_bytes=(4, 4)), "node 'm': 'outputs' must be a tuple or list of value names, got str"),
    (dict(outputs=("a", "a"), output_bytes=(4, 4)), "node 'm': 'outputs' names a value twice"),
    (dict(outputs=("a", None), output_bytes=(4, 4)), "node 'm': 'outputs' holds None"),
    (dict(outputs=("a", "b"), output_bytes=(8, 8), output_costs=(1,)), "node 'm': 'output_costs' has 1 entries for 2 outputs"),
    (dict(outputs=("a", "b"), output_bytes=(8, 8), output_costs=(1, math.inf)), r"node 'm': 'output_costs\[1\]' .*not finite"),
    (dict(outputs=("a", "b"), output_bytes=(8, 8), save_cost=2), "node 'm' writes 2 values: give their save costs as 'output_costs'"),
    (dict(outputs=("a",), output_bytes=(4,), bytes=5), r"node 'm': 'bytes' \(5\) is not the sum of 'output_bytes'"),
    (dict(output_bytes=(4,)), "node 'm' has 'output_bytes' but no 'outputs'"),
    (dict(save_cost=1, output_costs=(1,)), "node 'm' has both 'save_cost' and 'output_costs'"),
    # the other fields' types
    (dict(phase="fwd"), "node 'm': 'phase' must be 'forward' or 'backward', got 'fwd'"),
    (dict(recompute=True), "node 'm': 'recompute' must be 'allowed' or 'never', got True"),
    (dict(tags="matmul"), "node 'm': 'tags' must be a set, tuple or list of strings, got str 'matmul'"),
    (dict(tags=("matmul", 3)), "node 'm': 'tags' must be a set, tuple or list of strings"),
    (dict(is_input="no"), "node 'm': 'is_input' must be True or False, got str 'no'"),
    (dict(is_param=1), "node 'm': 'is_param' must be True or False, got int 1"),
    (dict(savable=0), "node 'm': 'savable' must be True or False, got int 0"),
    (dict(fusible=None), "node 'm': 'fusible' must be True or False, got NoneType None"),
    (dict(kind=3), "node 'm': 'kind' must be a string, got int 3"),
    (dict(region=7), "node 'm': 'region' must be a string or None, got int 7"),
    (dict(unit="0"), "node 'm': 'unit' must be an int, got str '0'"),
]


@pytest.mark.parametrize("attrs, message", BAD_NODES, ids=[repr(attrs) for attrs, _ in BAD_NODES])
def test_every_node_field_is_checked_and_the_node_named(attrs, message):
    """Once raw OverflowError/ValueError without the node (inf, 'x'), or accepted (-1 FLOPs reported as -1,
    '400' and 400.7 coerced to ints)."""
    with pytest.raises(remat.GraphError, match=message):
        remat.solve(chain(**attrs))


def test_whole_floats_are_exact_byte_counts():
    """400.0 (from arithmetic or a file reader) is 400 bytes; numpy integers are integers."""
    import numpy as np

    plan = remat.solve(chain(bytes=400.0, flops=np.int64(10), save_cost=np.float64(16.0)))
    assert plan.recomputed_ops == ("m",) and plan.extra_flops == 10 and isinstance(plan.extra_flops, int)


def test_edge_tensors_must_be_written_by_the_source():
    g = chain()
    g.edges["m", "dm"]["tensors"] = ("nowhere",)
    with pytest.raises(remat.GraphError, match=r"edge 'm' -> 'dm': 'tensors' names 'nowhere', which 'm' does not write \(no node writes it\)"):
        remat.solve(g)
    g.edges["m", "dm"]["tensors"] = ("x",)
    with pytest.raises(remat.GraphError, match=r"edge 'm' -> 'dm': 'tensors' names 'x', which 'm' does not write \(node 'x' writes it\)"):
        remat.solve(g)
    g.edges["m", "dm"]["tensors"] = ()
    with pytest.raises(remat.GraphError, match="edge 'm' -> 'dm': 'tensors' is empty"):
        remat.solve(g)
    g.edges["m", "dm"]["tensors"] = "m"
    with pytest.raises(remat.GraphError, match="edge 'm' -> 'dm': 'tensors' must be a tuple, list or set of value names, got str"):
        remat.solve(g)
    g.edges["m", "dm"]["tensors"] = ("m",)
    assert remat.solve(g).recomputed_ops == ("m",)


def test_a_value_has_one_writer_and_forward_outputs_exist():
    g = chain(outputs=("x",), output_bytes=(16,))  # 'x' is the input node's value
    with pytest.raises(remat.GraphError, match="value 'x' is written by two nodes, 'x' and 'm'"):
        remat.solve(g)
    g = chain()
    g.graph["forward_outputs"] = ("y",)
    with pytest.raises(remat.GraphError, match=r"graph.graph\['forward_outputs'\] names 'y', which no node writes"):
        remat.solve(g)
    g.graph["forward_outputs"] = ("dm",)
    with pytest.raises(remat.GraphError, match=r"graph.graph\['forward_outputs'\] names 'dm', written by backward node 'dm'"):
        remat.solve(g)
    g.graph["forward_outputs"] = "m"
    with pytest.raises(remat.GraphError, match=r"graph.graph\['forward_outputs'\] must be a tuple or list"):
        remat.solve(g)
    g.graph["forward_outputs"] = ("m",)
    g.graph["tensors"] = ["m"]
    with pytest.raises(remat.GraphError, match=r"graph.graph\['tensors'\] must map value names"):
        remat.solve(g)


def test_graphs_read_from_traces_pass_the_schema(pythia_trace):
    from remat.core.plain import validate_graph

    validate_graph(remat.read_trace(remat.fuse(pythia_trace)).nx)  # every FusionGraph.nx is a valid plain graph


# ------------------------------------------------------------------------------ policies


def test_recomputing_stateful_random_ops_is_refused_unless_asked_for_by_name():
    """random=True once let the planner recompute dropout on CPU: gradients off by 100%, silently."""
    with pytest.raises(ValueError, match=r"random=True.*draw new numbers.*RecomputePolicy\(unsafe_stateful_random=True\)"):
        remat.RecomputePolicy(random=True)
    g = chain(tags={"rng"})
    assert remat.solve(g).recomputed_ops == ()  # the mask is saved
    unsafe = remat.RecomputePolicy(unsafe_stateful_random=True)
    assert remat.solve(g, recompute=unsafe).recomputed_ops == ("m",)
    assert remat.solve(chain(tags={"rng_stateless"})).recomputed_ops == ("m",)  # philox: same numbers again


@pytest.mark.parametrize("field", ["matmul", "attention", "reductions", "random", "non_fusible", "unsafe_stateful_random"])
def test_policy_fields_are_booleans(field):
    with pytest.raises(TypeError, match=f"RecomputePolicy.{field} must be True or False, got str 'yes'"):
        remat.RecomputePolicy(**{field: "yes"})
