"""Memory budgets: trade recomputation for memory, peak-aware, along a dense Pareto frontier.

The default plan (:func:`remat.optimize` without a budget) saves as little as it can without recomputing
matmuls, attention, reductions or random ops.  To go lower, remat prices those ops instead of forbidding
them: in the flow network (:func:`remat.planning.problem.build_problem` with ``priced`` and ``recompute_price``) an
op of the *priced* policy may be recomputed if the cut pays ``price x FLOPs`` for it.

How :func:`pareto` finds points (docs/memory-model.md, "Memory budgets", says the same for users):

1. **Price vertices (exact for the cut).**  Sweeping the price from infinity (the default plan) to zero
   (recompute everything the priced policy allows) gives the plans that minimize ``saved bytes + price x
   FLOPs``: the vertices of the convex hull of (saved bytes, FLOPs).  Lowering the price only lowers
   source capacities, so the minimum cuts are nested (parametric max-flow, Gallo, Grigoriadis and Tarjan
   1989) and the sweep bisects the price grid (:data:`PRICES`), solving only where the cut changes.
   A sweep alone is coarse: identical layers cross the same price together (LitGPT Llama-2-7b, 2 layers,
   batch 4, seq 8192: one step from the default plan to "recompute every layer's matmuls").
2. **Peak-aware rounds (heuristic).**  Saved bytes are not the peak: only tensors alive at the peak
   matter.  Each vertex is re-solved with the values that are *not* alive at its peak (from the memory
   model) made cheap to keep (weight :data:`OFF_PEAK_WEIGHT`), a few rounds; the sweep is also run once
   with the default plan's off-peak values made cheap.
3. **Interpolation between neighbouring vertices (heuristic order).**  For vertices ``a`` and ``b`` (lower
   price), the priced ops ``b`` recomputes and ``a`` does not are allowed a prefix at a time, in forward
   order, at ``b``'s price (``build_problem(priced_ops=...)``): the cut still decides exactly what to save
   given what may be recomputed.  Identical layers come one after another in forward order, so a prefix
   is "the first k layers" and, within a layer, its ops one at a time (a layer's qkv projection alone,
   its MLP inputs alone, as Megatron's selective recompute and PyTorch's SAC policies allow).  Earliest
   first because their saved values live longest (across the peak at the start of the backward) and
   their recomputation runs last, when little else is alive.  The same steps are walked a second time
   cheapest first (rising FLOPs, forward order among equals): forward order takes a layer's qkv
   projection before its smaller output projection, so without it a budget a little below the default
   plan paid for the larger matmul (Llama-2-7b, 2 layers, batch 4, seq 8192: 3.3 TFLOP where 1.2 do).
   Every step of such a chain trades FLOPs for bytes at about the vertices' rate, so the points lie near
   the straight line between them instead of jumping to ``b``.  At most :data:`MAX_INTERPOLATED` plans
   are evaluated in all (spread over the FLOPs, in proportion to how much each pair of vertices lowers
   the peak): every step of both orders for a few layers, fewer than one per layer on a 32-layer model,
   where a budget search bisects forward order alone (:meth:`_Search.refine`).

Every candidate is evaluated by the memory model (:func:`plan_memory`: the rewritten trace simulated
without building it); :func:`pareto` returns the default plan, then the points below its peak that no
other point beats on both estimated peak and extra FLOPs.  What is exact: each plan's cut (fewest saved
bytes given what may be recomputed and at what price), its estimated peak and FLOPs, and the hull
vertices on the price grid.  What is not: which subset of ops to allow between vertices (prefixes of
two orders, not a search), so a frontier point may have a higher peak than the best plan with its FLOPs;
``remat.planning.reference.milp_min_peak`` gives that optimum for small plain graphs
(benchmarks/budget.py compares).

Budgets.  :func:`plan_for_budget` (what ``optimize(trace, memory_budget=B)`` and ``solve(graph,
memory_budget=B)`` use; B a :class:`remat.MemoryBudget`: bytes, or a fraction of the *default plan's*
estimated peak, the frontier's first point) takes the frontier point with the fewest extra FLOPs whose
estimated peak fits in B, or the lowest point if none does (``fits`` is False; the caller says so, with
that smallest reachable peak).  Budgets return plans; the pipeline applies them.  The frontier does not
depend on B, so a smaller budget never gives a higher estimated peak (the choice for a smaller budget is
either the same point or one whose peak is below the larger budget's choice).

Budgets above the default plan's peak (bytes or a size such as ``"12GiB"``: a fraction is at most 1)
buy speed with memory (:func:`_kept_side`).  The default plan recomputes some values for backward ops
outside every region (the RoPE'd queries and keys for the attention backward, a layer norm's output for a
weight gradient): each such recomputation is a region of its own, one more kernel, while the forward wrote
the value anyway for its own reader.  Above the default peak, remat keeps such values instead, latest
layers first, as many as fit: fewer extra FLOPs and kernels at a higher peak.  How much time that saves
is measured on the GPU (docs/benchmarks.md), not modelled.  On deep models (more than
:data:`MAX_INTERPOLATED` such values) the kept plans are bisected for the budget, so that side of the
frontier depends on it.

Random ops.  Stateful RNG (``uniform`` off CUDA) is never priced: recomputing it would draw new numbers
(PyTorch issue 190758).  Thunder's stateless ``uniform_philox`` (what :func:`remat.fuse` turns dropout
into on CUDA) is recomputable at any budget and reproduces the same mask.

Attention kernels are not priced either.  Recomputed ops that stood alone in the forward (priced matmuls)
run again stand-alone, in stages before the unit that reads them (:func:`remat.core.layout.stage_closure`),
so the estimate of a plan that recomputes them counts their outputs; attention could be re-issued the same
way, but pricing it is not done (its backward reads its forward's statistics, which would be recomputed
too) and not measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

from remat.core.collector import collector_paused
from remat.core.ir import FORWARD, FusionGraph
from remat.core.layout import layout_graph, plan_layout, read_outside_regions
from remat.core.memory import MemoryBudget, MemoryProfile, held_storage, profile_graph, profile_with_lifetimes, save_cost
from remat.core.policies import RecomputePolicy
from remat.core.views import alias_base
from remat.errors import GraphError
from remat.planning.flow import DEFAULT_SOLVER, CutResult, Solver, min_cut
from remat.planning.plan import Plan, plan_from_cut
from remat.planning.problem import FlowProblem, build_problem

__all__ = [
    "PRICED_POLICY",
    "OFF_PEAK_WEIGHT",
    "MAX_INTERPOLATED",
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
#: At most this many plans are evaluated between neighbouring price vertices by :func:`pareto`, over the
#: whole frontier: every step of the interpolation when there are no more steps than this (a few layers),
#: else this many spread over the recomputed FLOPs.  Past it, :func:`plan_for_budget` bisects the one
#: chain that brackets the budget instead (what keeps a 32-layer search within seconds).
MAX_INTERPOLATED = 40

#: How a frontier point was found (:attr:`ParetoPoint.found`).
FOUND = ("default", "price", "peak-aware", "interpolated", "per-unit", "kept")


@dataclass(frozen=True)
class ParetoPoint:
    """One plan on the frontier: its estimated peak, the FLOPs it recomputes (per placement, as the
    rewrite runs them), and the plan.  ``price``: the bytes-per-FLOP price it was solved at (``inf`` for
    the default plan); ``found``: how (one of :data:`FOUND`: the default plan, a price of the sweep, a
    peak-aware re-solve, an interpolation between two price vertices, the lowest plan laid out with
    its recomputed matmuls re-issued for every unit that reads them: :func:`_per_unit_variant`, or, for
    a budget above the default plan's peak, the default plan keeping some values it recomputed for
    readers outside regions: :func:`_kept_side`)."""

    peak_bytes: int
    extra_flops: int
    plan: Plan
    saved_bytes: int
    price: float
    found: str = "price"

    def __iter__(self):  # unpacks as (peak_bytes, extra_flops, plan)
        return iter((self.peak_bytes, self.extra_flops, self.plan))


@dataclass(frozen=True)
class BudgetChoice:
    """What :func:`plan_for_budget` chose: the frontier ``point`` (its plan), whether its estimated peak
    ``fits`` in ``budget_bytes``, the ``frontier`` it was chosen from, and ``reference_bytes``: what a
    fractional budget was a fraction of (the default plan's estimated peak unless the caller gave one)."""

    point: ParetoPoint
    fits: bool
    budget_bytes: int
    frontier: list[ParetoPoint]
    reference_bytes: int = 0

    @property
    def plan(self) -> Plan:
        return self.point.plan


def plan_memory(graph: FusionGraph, plan: Plan) -> MemoryProfile:
    """Estimated memory of ``graph``'s trace rewritten by ``plan``, without rewriting it: the memory
    model on the units :func:`remat.thunder.rewrite.apply_plan` would produce (tested equal)."""
    return profile_graph(layout_graph(graph, getattr(plan, "layout", None) or plan_layout(graph, plan)))


def _peak_weights(graph: FusionGraph, plan: Plan, start: Mapping[str, int], end: Mapping[str, int], peak_step: int) -> dict[str, float]:
    """Weights making the plan's saved values that are not alive at its peak cheap to keep (``start``,
    ``end``: the lifetimes of its simulated trace, :func:`remat.core.memory.lifetimes`)."""
    alive = {b for b, s in start.items() if s <= peak_step <= end[b]}
    weights = {}
    for value in plan.saved:
        base = alias_base(value, graph.tensors)
        if base not in alive and value not in alive:
            weights[value] = OFF_PEAK_WEIGHT
    return weights


class _Search:
    """Solves and evaluates plans for one graph; remembers every distinct plan it evaluated."""

    def __init__(self, graph: FusionGraph, recompute: RecomputePolicy, priced: RecomputePolicy, solver: Solver):
        self.graph = graph
        self.recompute = recompute
        self.priced = priced
        self.solver = solver
        self.held = held_storage(graph.tensors, graph.forward_outputs)
        self.points: list[ParetoPoint] = []
        self.evaluated: dict[tuple, ParetoPoint] = {}  # every plan evaluated, by what it saves and recomputes
        self.position = {op.id: i for i, op in enumerate(graph.ops)}
        self.priceable: frozenset[Hashable] = frozenset()  # ops recomputable at a price (set by a finite, unrestricted solve)

    def solve(
        self,
        price: float,
        weights: Mapping[str, float] | None = None,
        priced_ops: Collection[Hashable] | None = None,
        keep: Collection[str] = (),
    ) -> tuple[Plan, bytes]:
        """The plan of one minimum cut, and the cut itself (its sink side, as bytes) to compare cuts."""
        return self.plan_of(*self.cut(price, weights, priced_ops, keep))

    def cut(
        self,
        price: float,
        weights: Mapping[str, float] | None = None,
        priced_ops: Collection[Hashable] | None = None,
        keep: Collection[str] = (),
    ) -> tuple[FlowProblem, CutResult, float]:
        """One minimum cut (without reading a plan off it: the sweep compares cuts first)."""
        start = time.perf_counter()
        problem = build_problem(
            self.graph, self.recompute, priced=self.priced, recompute_price=price, weights=weights,
            priced_ops=priced_ops, keep=keep,
        )
        if priced_ops is None and math.isfinite(price):
            self.priceable = frozenset(problem.priced_ops)
        return problem, min_cut(problem, self.solver), start

    def plan_of(self, problem: FlowProblem, cut: CutResult, start: float) -> tuple[Plan, bytes]:
        """The plan read off ``cut`` (``start``: when solving began, for ``solve_seconds``)."""
        plan = plan_from_cut(problem, cut, self.recompute)
        # the plan's own cost is in true bytes, whatever the weights were
        plan = replace(
            plan,
            saved_bytes=sum(save_cost(self.graph, v, held=self.held) for v in plan.saved),
            solve_seconds=time.perf_counter() - start,
        )
        return plan, cut.sink_side.tobytes()

    def evaluate(self, plan: Plan, price: float, found: str) -> tuple[ParetoPoint, dict[str, float]] | None:
        """Add ``plan`` as a point (None if an equal plan was evaluated before), with the weights that
        make its off-peak saved values cheap (for the next peak-aware round)."""
        key = _plan_key(plan)
        if key in self.evaluated:
            return None
        layout = plan.layout or plan_layout(self.graph, plan)
        profile, start, end = profile_with_lifetimes(layout_graph(self.graph, layout))
        point = ParetoPoint(profile.peak_bytes, layout.extra_flops, plan, profile.saved_bytes, price, found)
        self.points.append(point)
        self.evaluated[key] = point
        return point, _peak_weights(self.graph, plan, start, end, profile.peak_step)

    def peak(self, plan: Plan, price: float, found: str) -> int:
        """The estimated peak of ``plan``, evaluating it if it is new."""
        self.evaluate(plan, price, found)
        return self.evaluated[_plan_key(plan)].peak_bytes

    def sweep(self, prices: Sequence[float], weights: Mapping[str, float] | None) -> list[tuple[float, Plan]]:
        """The distinct plans of the finite ``prices`` (highest price first), each with the highest price
        giving it.  Lowering the price only lowers source capacities, so the minimum cuts are nested
        (Gallo, Grigoriadis and Tarjan's parametric max-flow): where two prices give the same cut, every
        price between them does too, and is not solved."""
        finite = sorted({p for p in prices if math.isfinite(p)}, reverse=True)
        if not finite:
            return []
        solved: dict[int, tuple[FlowProblem, CutResult, float]] = {}

        def side(i: int) -> bytes:
            if i not in solved:
                solved[i] = self.cut(finite[i], weights)
            return solved[i][1].sink_side.tobytes()

        def explore(lo: int, hi: int) -> None:
            if hi - lo <= 1 or side(lo) == side(hi):
                return
            mid = (lo + hi) // 2
            side(mid)
            explore(lo, mid)
            explore(mid, hi)

        side(0)
        explore(0, len(finite) - 1)
        distinct: list[tuple[float, Plan]] = []
        previous = None
        for i in sorted(solved):
            cut = side(i)
            if cut != previous:
                distinct.append((finite[i], self.plan_of(*solved[i])[0]))
            previous = cut
        return distinct

    def with_peak_rounds(self, price: float, plan: Plan, found: str) -> None:
        """Evaluate ``plan``, then re-solve at its price with its off-peak values made cheap, a few rounds."""
        outcome = self.evaluate(plan, price, found)
        for _ in range(PEAK_ROUNDS):
            if outcome is None or not outcome[1]:
                return
            plan, _ = self.solve(price, outcome[1])
            outcome = self.evaluate(plan, price, "peak-aware")

    def priced_recomputed(self, plan: Plan) -> set[Hashable]:
        return self.priceable.intersection(plan.recomputed_ops)

    def chains(self, vertices: list[tuple[float, Plan]]) -> list[_Chain]:
        """For neighbouring price vertices ``a`` (higher price) and ``b``: the priced ops ``b`` recomputes
        and ``a`` does not, in forward order (see :meth:`interpolate`)."""
        chains = []
        for (_, plan_a), (price_b, plan_b) in zip(vertices, vertices[1:]):
            base = self.priced_recomputed(plan_a)
            steps = sorted(self.priced_recomputed(plan_b) - base, key=self.position.__getitem__)
            if len(steps) > 1:
                peak_a = self.evaluated[_plan_key(plan_a)].peak_bytes
                peak_b = self.evaluated[_plan_key(plan_b)].peak_bytes
                chains.append(_Chain(price_b, frozenset(base), tuple(steps), peak_a, peak_b))
        return chains

    def step(self, chain: _Chain, k: int) -> Plan:
        """The plan allowing ``a``'s priced ops and the first ``k`` steps of ``chain``, at ``b``'s price."""
        plan, _ = self.solve(chain.price, None, chain.base.union(chain.steps[:k]))
        return plan

    def interpolate(self, chains: list[_Chain], max_plans: int) -> None:
        """Plans between neighbouring price vertices ``a`` and ``b``: ``a``'s priced ops and a prefix of
        the chain's steps allowed at ``b``'s price, the steps in two orders (:meth:`orders`).  Identical
        layers come one after another in forward order, so a prefix is "the first k layers" (down to
        single ops within a layer): the earliest layers' saved values live longest, across the peak at the
        start of the backward, and their recomputation runs last, when little else is alive.  When there
        are more steps than ``max_plans``, each order gets a share in proportion to how much lower ``b``'s
        estimated peak is than ``a``'s, spread evenly over its FLOPs."""
        orders = self.orders(chains)
        interior = sum(len(order.steps) - 1 for order in orders)
        if interior == 0 or max_plans <= 0:
            return
        total_drop = sum(order.drop for order in orders)
        for order in orders:
            count = len(order.steps) - 1
            if interior > max_plans:
                share = order.drop / total_drop if total_drop else (len(order.steps) - 1) / interior
                count = min(count, round(max_plans * share))
            for k in _prefix_lengths([self.flops(op) for op in order.steps], count):
                self.evaluate(self.step(order, k), order.price, "interpolated")

    def orders(self, chains: list[_Chain]) -> list[_Chain]:
        """Each chain in forward order, and again cheapest step first (rising FLOPs, forward order among
        equals) where that order differs.  Forward order takes a whole layer's projections before the
        next layer's; near the default plan that skips the cheapest steps (LitGPT Llama-2-7b, 2 layers,
        batch 4, seq 8192: its first prefix recomputes a qkv projection, 3.3 TFLOP for 768 MiB, where
        a layer's attention output projection alone gives 256 MiB for 1.1 TFLOP, so a budget a little
        below the default plan paid nearly three times what it needed)."""
        orders = []
        for chain in chains:
            orders.append(chain)
            cheapest = tuple(sorted(chain.steps, key=lambda op: (self.flops(op), self.position[op])))
            if cheapest != chain.steps:
                orders.append(replace(chain, steps=cheapest))
        return orders

    def flops(self, op: Hashable) -> int:
        return self.graph.ops[self.position[op]].flops

    def refine(self, chains: list[_Chain], budget_bytes: int) -> None:
        """Bisect the chain whose vertices bracket ``budget_bytes`` for its shortest prefix that fits
        (about log2(steps) plans instead of all of them; assumes the peak falls along the chain, as it
        does when each step recomputes one more layer's ops).  Forward order only: on a deep model one
        layer's step is a small part of the peak.  Measured on 32 Llama-2-7b layers, a second bisection
        cheapest first chose the same plans at budgets 0.95 and 0.8-0.6, 0.3% cheaper at 0.9, 14% at 0.98
        (9.05 against 10.56 TFLOP of about 1700), for 0.3-0.5 s more per search (docs/memory-model.md)."""
        for chain in chains:
            if not chain.peak_b <= budget_bytes < chain.peak_a:
                continue
            low, high = 0, len(chain.steps)  # prefix ``low`` does not fit, ``high`` does
            while high - low > 1:
                middle = (low + high) // 2
                if self.peak(self.step(chain, middle), chain.price, "interpolated") <= budget_bytes:
                    high = middle
                else:
                    low = middle


@dataclass(frozen=True)
class _Chain:
    price: float
    base: frozenset
    steps: tuple
    peak_a: int
    peak_b: int

    @property
    def drop(self) -> int:
        return max(self.peak_a - self.peak_b, 0)


def _plan_key(plan: Plan) -> tuple:
    return frozenset(plan.saved), frozenset(plan.recomputed_values)


def _prefix_lengths(flops: list[int], count: int) -> list[int]:
    """``count`` prefix lengths in 1..len(flops)-1, spread evenly over the cumulative FLOPs (all of them
    when ``count`` covers them)."""
    inner = len(flops) - 1
    if count >= inner:
        return list(range(1, inner + 1))
    if count <= 0:
        return []
    total = sum(flops) or 1
    cumulative = []
    running = 0
    for f in flops:
        running += f
        cumulative.append(running)
    lengths: list[int] = []
    for j in range(1, count + 1):
        target = total * j / (count + 1)
        k = next((i + 1 for i, c in enumerate(cumulative) if c >= target), inner)
        k = min(max(k, 1), inner)
        if k not in lengths:
            lengths.append(k)
    return lengths


@collector_paused  # dozens of simulated plans: see remat.core.collector
def pareto(
    graph: FusionGraph,
    *,
    recompute: RecomputePolicy | None = None,
    priced: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    prices: tuple[float, ...] = PRICES,
    max_interpolated: int = MAX_INTERPOLATED,
) -> list[ParetoPoint]:
    """The (estimated peak, extra FLOPs) frontier of plans for ``graph``.  The first point is the default
    plan (what :func:`remat.optimize` uses without a budget; with ``regather_parameters=True``, the plan
    that re-gathers nothing, see :func:`plan_for_budget`); the others have lower peaks, sorted by
    extra FLOPs, each with a lower peak than the one before.  ``max_interpolated`` caps the plans
    evaluated between price vertices (:data:`MAX_INTERPOLATED`; 0: the price sweep alone).  See the
    module docstring for how points are found and what is exact."""
    _check_interpolated(max_interpolated)
    search, default, vertices = _vertices(graph, recompute, priced, solver, prices)
    search.interpolate(search.chains(vertices), max_interpolated)
    _per_unit_variant(search)
    return _pareto_filter(default, search.points)


def _check_interpolated(max_interpolated: object) -> None:
    if isinstance(max_interpolated, bool) or not isinstance(max_interpolated, int) or max_interpolated < 0:
        raise ValueError(f"max_interpolated must be a non-negative int, got {max_interpolated!r}")


def _vertices(graph, recompute, priced, solver, prices) -> tuple[_Search, ParetoPoint, list[tuple[float, Plan]]]:
    """The default plan, the price sweeps with their peak-aware rounds; the uniform sweep's vertices."""
    if graph.ops is None:
        raise GraphError("this FusionGraph was read without operations; budgets need them (remat.read_trace(trace))")
    search = _Search(graph, recompute or RecomputePolicy(), priced or PRICED_POLICY, solver)
    default_plan, _ = search.solve(math.inf)
    default, default_weights = search.evaluate(default_plan, math.inf, "default")
    vertices = [(math.inf, default_plan)] + search.sweep(prices, None)
    for price, plan in vertices[1:]:
        search.with_peak_rounds(price, plan, "price")
    if default_weights:  # the same sweep with the default plan's off-peak values made cheap
        for price, plan in search.sweep(prices, default_weights):
            search.with_peak_rounds(price, plan, "price")
    return search, default, vertices


def _per_unit_variant(search: _Search) -> None:
    """Add the lowest plan found, laid out with each recomputed stand-alone op (a matmul) re-issued for
    every backward unit that reads it (``plan_layout(..., reissue_once=False)``), when that lowers its
    estimated peak.  Every plan is laid out re-issuing such an op once (fewer FLOPs), which keeps its
    output alive until its last reader; at the bottom of the frontier that can raise the peak (Llama-2-7b
    x2, batch 4, seq 8192: 4720 MiB at 14.7 extra TFLOP, against 4594 MiB at 27.2 TFLOP per unit), and the
    lowest reachable peak is what a tight budget needs.  One more evaluation per search."""
    if not search.points:
        return
    lowest = min(search.points, key=lambda p: (p.peak_bytes, p.extra_flops))
    layout = plan_layout(search.graph, lowest.plan, reissue_once=False)
    if layout.extra_flops == lowest.extra_flops:  # nothing is re-issued twice: the same layout
        return
    profile = profile_graph(layout_graph(search.graph, layout))
    if profile.peak_bytes < lowest.peak_bytes:
        plan = replace(lowest.plan, extra_flops=layout.extra_flops, layout=layout)
        search.points.append(ParetoPoint(profile.peak_bytes, layout.extra_flops, plan, profile.saved_bytes, lowest.price, "per-unit"))


def _kept_side(search: _Search, default: ParetoPoint, budget_bytes: int) -> list[ParetoPoint]:
    """Plans above the default plan, for a budget above its estimated peak: the default plan with some of
    the values it recomputes for a backward op outside every region kept instead
    (:func:`remat.core.layout.read_outside_regions`: each such recomputation is a region of its own, one
    more kernel writing the value to memory; the forward wrote the value anyway, for its own reader
    outside regions, so keeping it costs memory and no work).  Latest layers first: the backward reads
    their values first, so keeping them holds memory for the shortest time.  Every prefix is evaluated
    when there are at most :data:`MAX_INTERPOLATED` (a few layers); on deeper models the largest prefix
    that fits the budget is found by bisection (assuming the peak rises along the prefixes; every plan
    returned was evaluated).  Points, most kept first, each with fewer extra FLOPs than the next."""
    graph = search.graph
    unfused = read_outside_regions(graph)
    candidates = [v for v in dict.fromkeys(alias_base(v, graph.tensors) for v in default.plan.recomputed_values) if v in unfused]
    if not candidates:
        return []
    first_reader: dict[str, int] = {}
    for op in graph.ops:
        if op.phase != FORWARD:
            for name in op.inputs:
                base = alias_base(name, graph.tensors)
                if base in unfused:
                    first_reader.setdefault(base, search.position[op.id])
    candidates.sort(key=lambda v: first_reader.get(v, len(graph.ops)))

    def point(count: int) -> ParetoPoint:
        plan, _ = search.solve(math.inf, keep=candidates[:count])
        search.evaluate(plan, math.inf, "kept")
        return search.evaluated[_plan_key(plan)]

    if len(candidates) <= MAX_INTERPOLATED:  # every prefix: the side does not depend on the budget
        evaluated = [point(count) for count in range(len(candidates), 0, -1)]
    else:  # deep models: bisect for the largest prefix that fits, as plan_for_budget does below
        evaluated = [point(len(candidates))]
        low, high = 0, len(candidates)  # prefix ``low`` fits (the default plan), ``high`` may not
        if evaluated[0].peak_bytes <= budget_bytes:
            low = high
        while high - low > 1:
            middle = (low + high) // 2
            evaluated.append(point(middle))
            if evaluated[-1].peak_bytes <= budget_bytes:
                low = middle
            else:
                high = middle
    above = sorted(
        (p for p in evaluated if p.peak_bytes > default.peak_bytes and p.extra_flops < default.extra_flops),
        key=lambda p: (p.peak_bytes, p.extra_flops),
    )
    side: list[ParetoPoint] = []
    for p in above:  # lowest peak first: a point stays only if no lower-peak point recomputes as little
        if not side or p.extra_flops < side[-1].extra_flops:
            side.append(p)
    return side[::-1]


def _pareto_filter(default: ParetoPoint, points: list[ParetoPoint]) -> list[ParetoPoint]:
    """The default plan, then the points below its peak that no other point beats on both counts."""
    frontier = [default]
    lower = (p for p in points if p is not default and p.peak_bytes < default.peak_bytes)
    for point in sorted(lower, key=lambda p: (p.extra_flops, p.peak_bytes, p.saved_bytes)):
        if point.peak_bytes < frontier[-1].peak_bytes:
            frontier.append(point)
    return frontier


def choose(frontier: list[ParetoPoint], budget_bytes: int) -> tuple[ParetoPoint, bool]:
    """The point with the fewest extra FLOPs whose estimated peak fits the budget (True), or the lowest
    point (False) when none fits."""
    for point in frontier:  # sorted by FLOPs, peaks decreasing
        if point.peak_bytes <= budget_bytes:
            return point, True
    return frontier[-1], False


@collector_paused
def plan_for_budget(
    graph: FusionGraph,
    memory_budget: MemoryBudget,
    *,
    reference_peak: int | None = None,
    recompute: RecomputePolicy | None = None,
    priced: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
) -> BudgetChoice:
    """The cheapest frontier plan whose estimated peak fits ``memory_budget``, or the lowest one (then
    ``fits`` is False).  A fraction is of ``reference_peak``, by default the estimated peak of the
    default plan (the frontier's first point: what remat uses without a budget), so ``1.0`` is the
    default plan and ``0.7`` asks for 30% less than it.  One exception: with
    ``RecomputePolicy(regather_parameters=True)`` the frontier's first point is the infinite-price plan,
    which re-gathers nothing (every gathered parameter kept, as Thunder's ZeRO3 does), while the plan
    without a budget re-gathers every parameter it can; a budget then trades re-gathers, priced per
    gathered byte, against memory from the first point.

    The frontier is :func:`pareto`'s when its interpolation has at most :data:`MAX_INTERPOLATED` steps
    (a few layers).  On deeper models, instead of evaluating a capped, evenly spread subset, the one
    interpolation chain whose vertices bracket the budget is bisected for its cheapest plan that fits
    (about log2(steps) plans: what keeps a 32-layer search within seconds); ``frontier`` then holds the
    points evaluated."""
    search, default, vertices = _vertices(graph, recompute, priced, solver, PRICES)
    if reference_peak is None:
        reference_peak = default.peak_bytes
    budget_bytes = memory_budget.resolve(reference_peak)
    chains = search.chains(vertices)
    if sum(len(chain.steps) - 1 for chain in chains) <= MAX_INTERPOLATED:
        search.interpolate(chains, MAX_INTERPOLATED)
    else:  # below every vertex: the cheapest plan reaching the lowest of them
        search.refine(chains, max(budget_bytes, min(point.peak_bytes for point in search.points)))
    _per_unit_variant(search)
    frontier = _pareto_filter(default, search.points)
    if budget_bytes > default.peak_bytes:  # room above the default plan: keep what it recomputes unfused
        frontier = _kept_side(search, default, budget_bytes) + frontier
    point, fits = choose(frontier, budget_bytes)
    return BudgetChoice(point, fits, budget_bytes, frontier, reference_peak)
