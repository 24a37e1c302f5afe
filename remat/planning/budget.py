"""Memory budgets: trade recomputation for memory, peak-aware, along a Pareto frontier.

The default plan (:func:`remat.optimize` without a budget) saves as little as it can without recomputing
matmuls, attention, reductions or random ops.  To go lower, remat prices those ops instead of forbidding
them: in the flow network (:func:`remat.planning.problem.build_problem` with ``priced`` and ``recompute_price``) an
op of the *priced* policy may be recomputed if the cut pays ``price x FLOPs`` for it.  Sweeping the price
from infinity (the default plan) to zero (recompute everything the priced policy allows) gives plans that
trade FLOPs for bytes, cheapest FLOPs per byte first.

Peak-aware.  Saved bytes are not the peak: only tensors alive at the peak matter.  For each plan remat
estimates the peak with the memory model (:func:`plan_memory`, which simulates the rewritten trace
without building it), then re-solves with the values that are *not* alive at the peak made cheap to keep
(weight :data:`OFF_PEAK_WEIGHT`), which moves recomputation to where it lowers the peak; a few rounds per
price.  Every evaluated plan is a point (estimated peak, extra FLOPs); :func:`pareto` returns the points
no other point beats on both.

Budgets.  :func:`plan_for_budget` (what ``optimize(trace, memory_budget=B)`` and ``solve(graph,
memory_budget=B)`` use; B a :class:`remat.MemoryBudget`: bytes, or a fraction of the un-optimized
estimated peak) takes the frontier point with the fewest extra FLOPs whose estimated peak fits in B, or
the lowest point if none does.  Budgets return plans; the pipeline applies them.  The frontier does not depend on B, so a smaller budget never
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
from dataclasses import dataclass, replace

from remat.core.ir import FusionGraph
from remat.core.layout import layout_graph, plan_layout
from remat.core.memory import MemoryBudget, MemoryProfile, lifetimes, profile_graph, save_cost
from remat.core.policies import RecomputePolicy
from remat.core.views import alias_base
from remat.errors import GraphError
from remat.planning.flow import DEFAULT_SOLVER, Solver
from remat.planning.plan import Plan, plan_graph

__all__ = [
    "PRICED_POLICY",
    "OFF_PEAK_WEIGHT",
    "BudgetChoice",
    "ParetoPoint",
    "pareto",
    "plan_memory",
    "plan_for_budget",
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


@dataclass(frozen=True)
class BudgetChoice:
    """What :func:`plan_for_budget` chose: the frontier ``point`` (its plan), whether its estimated peak
    ``fits`` in ``budget_bytes``, and the ``frontier`` it was chosen from."""

    point: ParetoPoint
    fits: bool
    budget_bytes: int
    frontier: list[ParetoPoint]

    @property
    def plan(self) -> Plan:
        return self.point.plan


def plan_memory(graph: FusionGraph, plan: Plan) -> MemoryProfile:
    """Estimated memory of ``graph``'s trace rewritten by ``plan``, without rewriting it: the memory
    model on the units :func:`remat.thunder.rewrite.apply_plan` would produce (tested equal)."""
    return profile_graph(layout_graph(graph, plan_layout(graph, plan)))


def _peak_weights(graph: FusionGraph, simulated: FusionGraph, plan: Plan, peak_step: int) -> dict[str, float]:
    """Weights making the plan's saved values that are not alive at its peak cheap to keep."""
    _, start, end = lifetimes(simulated)
    alive = {b for b, s in start.items() if s <= peak_step <= end[b]}
    weights = {}
    for value in plan.saved:
        base = alias_base(value, graph.tensors)
        if base not in alive and value not in alive:
            weights[value] = OFF_PEAK_WEIGHT
    return weights


def pareto(
    graph: FusionGraph,
    *,
    recompute: RecomputePolicy | None = None,
    priced: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    prices: tuple[float, ...] = PRICES,
) -> list[ParetoPoint]:
    """The (estimated peak, extra FLOPs) frontier of plans for ``graph``: points sorted by extra FLOPs,
    each with a lower peak than the one before.  The first point is the default plan.  See the module
    docstring for how points are found."""
    if graph.ops is None:
        raise GraphError("this FusionGraph was read without operations; budgets need them (remat.read_trace(trace))")
    points = _frontier_points(graph, recompute or RecomputePolicy(), priced or PRICED_POLICY, solver, prices)
    return _pareto_filter(points)


def _frontier_points(graph, recompute, priced, solver, prices) -> list[ParetoPoint]:
    points: list[ParetoPoint] = []
    seen: set[tuple] = set()
    held = set(graph.forward_outputs)

    def evaluate(price: float, weights: dict[str, float]) -> tuple[ParetoPoint, dict[str, float]] | None:
        start = time.perf_counter()
        plan = plan_graph(graph, recompute, solver, priced=priced, recompute_price=price, weights=weights)
        # the plan's own cost is in true bytes, whatever the weights were
        plan = replace(
            plan,
            saved_bytes=sum(save_cost(graph, v, held=held) for v in plan.saved),
            solve_seconds=time.perf_counter() - start,
        )
        key = (frozenset(plan.saved), frozenset(plan.recomputed_values))
        if key in seen:
            return None
        seen.add(key)
        layout = plan_layout(graph, plan)
        simulated = layout_graph(graph, layout)
        profile = profile_graph(simulated)
        point = ParetoPoint(profile.peak_bytes, layout.extra_flops, plan, profile.saved_bytes, price)
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


def plan_for_budget(
    graph: FusionGraph,
    memory_budget: MemoryBudget,
    *,
    reference_peak: int | None = None,
    recompute: RecomputePolicy | None = None,
    priced: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
) -> BudgetChoice:
    """The cheapest frontier plan whose estimated peak fits ``memory_budget`` (a fraction is of
    ``reference_peak``, by default the estimated peak of ``graph`` as it is), or the lowest one."""
    if reference_peak is None:
        reference_peak = profile_graph(graph).peak_bytes
    budget_bytes = memory_budget.resolve(reference_peak)
    frontier = pareto(graph, recompute=recompute, priced=priced, solver=solver)
    point, fits = choose(frontier, budget_bytes)
    return BudgetChoice(point, fits, budget_bytes, frontier)
