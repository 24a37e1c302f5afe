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
