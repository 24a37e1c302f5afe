"""Memory budgets: trade recomputation for memory, peak-aware, along a Pareto frontier.

The default plan (:func:`remat.optimize` without a budget) saves as little as it can without recomputing
matmuls, attention, reductions or random ops.  To go lower, remat prices those ops instead of forbidding
them: in the flow network (:func:`remat.problem.build_problem` with ``priced`` and ``recompute_price``) an
op of the *priced* policy may be recomputed if the cut pays ``price x FLOPs`` for it.  Sweeping the price
from infinity (the default plan) to zero (recompute everything the priced policy allows) gives plans that
trade FLOPs for bytes, cheapest FLOPs per byte first.

Peak-aware.  Saved bytes are not the peak: only tensors alive at the peak matter.  For each plan remat
estimates the peak with the memory model (:func:`plan_memory`, which simulates the rewritten trace
without building it), then re-solves with the values that are *not* alive at the peak made cheap to keep
(weight :data:`OFF_PEAK_WEIGHT`), which moves recomputation to where it lowers the peak; a few rounds per
price.  Every evaluated plan is a point (estimated peak, extra FLOPs); :func:`pareto` returns the points
no other point beats on both.

Budgets.  ``optimize(trace, memory_budget=B)`` (B in bytes, or a fraction in (0, 1] of the trace's own
estimated peak) takes the frontier point with the fewest extra FLOPs whose estimated peak fits in B, or
the lowest point with a note if none does.  The frontier does not depend on B, so a smaller budget never
gives a higher estimated peak (the choice for a smaller budget is either the same point or one whose peak
is below the larger budget's choice).

Random ops.  Stateful RNG (``uniform`` off CUDA) is never priced: recomputing it would draw new numbers
(PyTorch issue 190758).  Thunder's stateless ``uniform_philox`` (what :func:`remat.fuse` turns dropout
into on CUDA) is recomputable at any budget and reproduces the same mask.

Attention kernels are not priced either: remat recomputes inside fusion regions, which cannot hold them.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Hashable
from dataclasses import dataclass, replace

import networkx as nx

from remat.errors import GraphError, OptimizationError
from remat.graph import FusionGraph
from remat.memory import MemoryProfile, lifetimes, profile_graph
from remat.plan import Plan, plan_from_cut
from remat.problem import RecomputePolicy, build_problem, plain_fusion_graph
from remat.rewrite import layout_graph, plan_layout
from remat.solver import min_cut

__all__ = [
    "PRICED_POLICY",
    "OFF_PEAK_WEIGHT",
    "ParetoPoint",
    "pareto",
    "plan_memory",
    "resolve_budget",
    "choose",
]

#: What may be recomputed at a price: matmuls and reductions (never attention or stateful RNG).
PRICED_POLICY = RecomputePolicy(matmul=True, reductions=True, attention=False, random=False)
#: Save-cost weight of values not alive at the current peak, in the peak-aware rounds.
OFF_PEAK_WEIGHT = 0.05
#: Prices (bytes per FLOP) swept by :func:`pareto`: from "the default plan" to "recompute all allowed".
PRICES = (math.inf,) + tuple(10.0 ** (-k / 4) for k in range(0, 33)) + (0.0,)
PEAK_ROUNDS = 2


@dataclass(frozen=True)
class ParetoPoint:
    """One plan on the frontier: its estimated peak, the FLOPs it recomputes, and the plan."""

    peak_bytes: int
    extra_flops: int
    plan: Plan
    saved_bytes: int
    price: float

    def __iter__(self):  # unpacks as (peak_bytes, extra_flops, plan)
        return iter((self.peak_bytes, self.extra_flops, self.plan))


def plan_memory(graph: FusionGraph, plan: Plan) -> MemoryProfile:
    """Estimated memory of ``graph``'s trace rewritten by ``plan``, without rewriting it: the memory
    model on the units :func:`remat.rewrite.apply_plan` would produce (tested equal)."""
    return profile_graph(layout_graph(graph, plan_layout(graph, plan)))


def resolve_budget(memory_budget: int | float, reference_peak: int) -> int:
    """Bytes from a budget given in bytes (an int, or a float > 1) or as a fraction in (0, 1] of
    ``reference_peak``."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float)):
        raise TypeError(f"memory_budget must be a number of bytes or a fraction, got {type(memory_budget).__name__}")
    if not math.isfinite(memory_budget) or memory_budget <= 0:
        raise ValueError(f"memory_budget must be positive, got {memory_budget!r}")
    if isinstance(memory_budget, float) and memory_budget <= 1.0:
        return int(memory_budget * reference_peak)
    return int(memory_budget)


def _peak_weights(graph: FusionGraph, profile_graph_: FusionGraph, plan: Plan, peak_step: int) -> dict[str, float]:
    """Weights making the plan's saved values that are not alive at its peak cheap to keep."""
    _, start, end = lifetimes(profile_graph_)
    alive = {b for b, s in start.items() if s <= peak_step <= end[b]}
    weights = {}
    for value in plan.saved:
        info = graph.tensors.get(value)
        base = (info.alias_of or value) if info is not None else value
        if base not in alive and value not in alive:
            weights[value] = OFF_PEAK_WEIGHT
    return weights


def _evaluate(graph: FusionGraph, plan: Plan) -> tuple[MemoryProfile, FusionGraph, int]:
    layout = plan_layout(graph, plan)
    simulated = layout_graph(graph, layout)
    return profile_graph(simulated), simulated, layout.extra_flops


def pareto(
    trace_or_graph,
    *,
    policy: RecomputePolicy | None = None,
    priced: RecomputePolicy | None = None,
    backend: str = "scipy",
    prices: tuple[float, ...] = PRICES,
) -> list[ParetoPoint]:
    """The (estimated peak, extra FLOPs) frontier of plans for a trace, a :class:`FusionGraph` or a
    plain networkx graph: points sorted by extra FLOPs, each with a lower peak than the one before.
    The first point is the default plan.  See the module docstring for how points are found."""
    graph, _ = _as_fusion_graph(trace_or_graph)
    points = _frontier_points(graph, policy or RecomputePolicy(), priced or PRICED_POLICY, backend, prices)
    return _pareto_filter(points)


def _as_fusion_graph(trace_or_graph) -> tuple[FusionGraph, list[Hashable] | None]:
    if isinstance(trace_or_graph, FusionGraph):
        if trace_or_graph.ops is None:
            raise GraphError("this FusionGraph was built with ops=False; budgets need its operations")
        return trace_or_graph, None
    if isinstance(trace_or_graph, nx.DiGraph):
        return plain_fusion_graph(trace_or_graph)
    from thunder.core.trace import TraceCtx

    if isinstance(trace_or_graph, TraceCtx):
        return FusionGraph.from_trace(trace_or_graph), None
    raise TypeError(f"expected a Thunder trace, a FusionGraph or a networkx.DiGraph, got {type(trace_or_graph).__name__}")


def _frontier_points(graph, policy, priced, backend, prices) -> list[ParetoPoint]:
    points: list[ParetoPoint] = []
    seen: set[tuple] = set()

    def evaluate(price: float, weights: dict[str, float]) -> tuple[ParetoPoint, dict[str, float]] | None:
        start = time.perf_counter()
        problem = build_problem(graph, policy, priced=priced, recompute_price=price, weights=weights)
        plan = plan_from_cut(problem, min_cut(problem, backend), policy)
        # the plan's own cost is in true bytes, whatever the weights were
        plan = replace(
            plan,
            saved_bytes=sum(_true_save_cost(graph, v) for v in plan.saved),
            solve_seconds=time.perf_counter() - start,
        )
        key = (frozenset(plan.saved), frozenset(plan.recomputed_values))
        if key in seen:
            return None
        seen.add(key)
        profile, simulated, extra_flops = _evaluate(graph, plan)
        point = ParetoPoint(profile.peak_bytes, extra_flops, plan, profile.saved_bytes, price)
        points.append(point)
        return point, _peak_weights(graph, simulated, plan, profile.peak_step)

    # The default plan, and where its peak is: each price is tried with uniform weights and with the
    # default plan's off-peak values made cheap, then re-weighted by its own plan's peak.
    first = evaluate(math.inf, {})
    default_weights = first[1] if first is not None else {}
    for price in prices:
        if math.isinf(price):
            continue
        for weights in ({}, default_weights):
            for _ in range(1 + PEAK_ROUNDS):
                outcome = evaluate(price, weights)
                if outcome is None or not outcome[1]:
                    break
                weights = outcome[1]
    return points


def _true_save_cost(graph: FusionGraph, value: str) -> int:
    from remat.problem import _trace_save_cost

    if graph.plain:
        info = graph.tensors.get(value)
        op = graph.ops[info.producer_node] if info is not None else None
        if op is not None and op.output_costs is not None:
            return op.output_costs[op.outputs.index(value)]
        return info.bytes if info is not None else 0
    return _trace_save_cost(value, graph.tensors, set(graph.forward_outputs))


def _pareto_filter(points: list[ParetoPoint]) -> list[ParetoPoint]:
    frontier: list[ParetoPoint] = []
    for point in sorted(points, key=lambda p: (p.extra_flops, p.peak_bytes, p.saved_bytes)):
        if not frontier or point.peak_bytes < frontier[-1].peak_bytes:
            frontier.append(point)
    return frontier


def choose(frontier: list[ParetoPoint], budget_bytes: int) -> tuple[ParetoPoint, bool]:
    """The point with the fewest extra FLOPs whose estimated peak fits the budget (True), or the lowest
    point (False) when none fits."""
    for point in frontier:  # sorted by FLOPs, peaks decreasing
        if point.peak_bytes <= budget_bytes:
            return point, True
    return frontier[-1], False


def optimize_with_budget(trace, memory_budget, *, policy=None, backend="scipy", strict=False, priced=None):
    """:func:`remat.optimize` with a memory budget (see the module docstring)."""
    from remat.pipeline import OptimizationWarning, Result, _optimize_with_plan

    start = time.perf_counter()
    graph = FusionGraph.from_trace(trace)
    if not graph.is_joint:
        from remat.errors import NoBackwardError

        raise NoBackwardError("optimize needs a joint forward+backward trace (from remat.training_trace)")
    before = profile_graph(graph)
    budget_bytes = resolve_budget(memory_budget, before.peak_bytes)
    frontier = pareto(graph, policy=policy, priced=priced, backend=backend)
    point, fits = choose(frontier, budget_bytes)
    result: Result = _optimize_with_plan(trace, graph, before, point.plan, strict=strict, start=start)
    mib = 2**20
    if fits:
        result.notes.append(
            f"budget {budget_bytes / mib:.1f} MiB: chose the plan with the fewest extra FLOPs whose estimated peak "
            f"({point.peak_bytes / mib:.1f} MiB) fits, out of {len(frontier)} on the frontier"
        )
    else:
        message = (
            f"memory budget {budget_bytes / mib:.1f} MiB is not reachable: the smallest estimated peak remat finds is "
            f"{point.peak_bytes / mib:.1f} MiB (recomputing {point.extra_flops:.3g} FLOPs); using that plan"
        )
        if strict:
            raise OptimizationError(message)
        warnings.warn(message, OptimizationWarning, stacklevel=3)
        result.notes.append(message)
    result.frontier = frontier
    return result


def solve_with_budget(graph: nx.DiGraph, memory_budget, *, policy=None, backend="scipy", priced=None) -> Plan:
    """:func:`remat.solve` with a memory budget, on a plain graph: the memory model runs on one unit per
    node (see :func:`remat.problem.plain_fusion_graph`).  The returned plan names the graph's nodes."""
    fusion_graph, node_ids = plain_fusion_graph(graph)
    before = profile_graph(fusion_graph)
    budget_bytes = resolve_budget(memory_budget, before.peak_bytes)
    frontier = pareto(fusion_graph, policy=policy, priced=priced, backend=backend)
    point, fits = choose(frontier, budget_bytes)
    if not fits:
        warnings.warn(
            f"memory budget {budget_bytes} bytes is not reachable; the smallest estimated peak is {point.peak_bytes} bytes",
            stacklevel=3,
        )
    plan = point.plan
    return replace(plan, recomputed_ops=tuple(node_ids[i] for i in plan.recomputed_ops))
