"""The pipeline: trace -> graph -> problem -> solver -> plan -> rewrite, with memory before and after.

:func:`optimize` reads a fused joint trace (:func:`remat.thunder.read.read_trace`), plans it
(:func:`remat.planning.plan.plan_graph`, or with a budget :func:`remat.planning.budget.plan_for_budget`),
applies the plan (:func:`remat.thunder.rewrite.apply_plan`) and measures both traces with the memory
model.  Nothing is lost: if the plan cannot be applied (the solver fails, the rewrite fails, or the
rewritten trace would peak higher than the original), :func:`optimize` returns the trace as it came, with
the reason in ``Result.notes`` and one warning; ``strict=True`` raises instead.

:func:`pareto` and :func:`estimate_memory` take traces as well as graphs.
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field

import networkx as nx

from remat.core.ir import FORWARD, FusionGraph
from remat.core.memory import MemoryBudget, MemoryProfile, format_bytes, profile_graph
from remat.core.plain import plain_graph
from remat.core.policies import RecomputePolicy, check_policy
from remat.errors import (
    InPlaceError,
    NoBackwardError,
    OptimizationError,
    OptimizationWarning,
    RematError,
    UnknownOpError,
)
from remat.planning import budget as budgets
from remat.planning.budget import ParetoPoint
from remat.planning.flow import DEFAULT_SOLVER, Solver, resolve_solver
from remat.planning.plan import Plan, plan_graph
from remat.thunder import TraceCtx
from remat.thunder.read import read_trace
from remat.thunder.rewrite import apply_plan

__all__ = ["Result", "optimize", "pareto", "estimate_memory", "left_as_is"]


@dataclass
class Result:
    """What :func:`optimize` did.

    ``trace``: the optimized trace (on fallback, the original).  ``plan``: the :class:`~remat.Plan`
    (None on fallback).  ``before`` / ``after``: :class:`~remat.MemoryProfile` of the original and the
    optimized trace.  ``graph``: the :class:`~remat.FusionGraph` of the original trace (the plan's node
    ids refer to it); ``after_graph``: that of the optimized trace (read on first use).
    ``extra_flops``: FLOPs the backward now recomputes (counted per placement); ``step_flops``: FLOPs of
    the original step.  ``placements``: region -> recomputed op nodes.  ``applied``: False when the trace
    was left as it was; ``notes`` says why (or what else happened).  ``frontier``: with a memory budget,
    the Pareto frontier the plan was chosen from (see :func:`remat.pareto`).
    """

    trace: TraceCtx
    plan: Plan | None
    before: MemoryProfile
    after: MemoryProfile
    graph: FusionGraph
    extra_flops: int = 0
    step_flops: int = 0
    seconds: float = 0.0
    applied: bool = True
    notes: list[str] = field(default_factory=list)
    original: TraceCtx | None = None
    #: region of ``trace`` -> op nodes of ``graph`` it recomputes (new recompute regions included)
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)
    frontier: list[ParetoPoint] | None = None

    @functools.cached_property
    def after_graph(self) -> FusionGraph:
        """The :class:`~remat.FusionGraph` of :attr:`trace`, with operations (the one the pictures and the
        report draw)."""
        if self.trace is getattr(self.graph.origin, "trace", None):
            return self.graph
        return read_trace(self.trace, derived_from=self.graph)

    def summary(self) -> str:
        mib = 2**20
        lines = [
            f"saved activations: {self.before.saved_bytes / mib:.1f} MiB -> {self.after.saved_bytes / mib:.1f} MiB",
            f"estimated peak:    {self.before.peak_bytes / mib:.1f} MiB -> {self.after.peak_bytes / mib:.1f} MiB",
            f"extra FLOPs:       {self.extra_flops:.3g} ({100 * self.extra_flops / max(self.step_flops, 1):.2f}% of the step)",
            f"optimizer time:    {self.seconds * 1e3:.1f} ms",
        ]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        mib = 2**20
        return (
            f"Result(saved {self.before.saved_bytes / mib:.1f}->{self.after.saved_bytes / mib:.1f} MiB, "
            f"peak {self.before.peak_bytes / mib:.1f}->{self.after.peak_bytes / mib:.1f} MiB, "
            f"{'applied' if self.applied else 'not applied'})"
        )


def optimize(
    trace: TraceCtx,
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
) -> Result:
    """Plan and apply one global rematerialization of a (fused) joint Thunder trace.

    ``recompute`` says what may be recomputed (a :class:`~remat.RecomputePolicy`; default: no matmuls,
    attention, reductions or stateful RNG).  ``memory_budget`` (a :class:`~remat.MemoryBudget`: bytes as an
    int, a fraction in (0, 1] of the un-optimized estimated peak as a float, or a string like ``"600MiB"``
    or ``"70%"``) asks for more recomputation until the estimated peak fits; see
    :mod:`remat.planning.budget`.  ``solver`` picks the min-cut algorithm (``"dinic"``,
    ``"preflow_push"`` or a function; :mod:`remat.planning.flow`).

    What remat cannot handle is left as the trace has it, each cause with one
    :class:`OptimizationWarning` (docs/robustness.md): a failing solve or rewrite, or a plan that would
    raise the estimated peak, returns the input trace (``applied=False``); forward ops of a kind remat
    does not know, and ops reading a buffer that an in-place op writes later, are never recomputed (the
    rest is optimized).  With ``strict=True`` each of these raises a :class:`remat.RematError` subclass
    instead (:class:`~remat.OptimizationError`, :class:`~remat.UnknownOpError`,
    :class:`~remat.InPlaceError`).  ``Result.original`` is always the input trace, unchanged.

    Raises ``TypeError`` (not a trace; wrong budget or policy type), ``ValueError`` (unknown solver, a
    budget that is neither bytes nor a fraction), :class:`remat.NoBackwardError` (no backward),
    :class:`remat.UnsupportedTraceError` (empty trace, symbolic shapes).
    """
    if not isinstance(trace, TraceCtx):
        hint = " Call remat.training_trace(module, *args) first." if callable(trace) else ""
        raise TypeError(f"optimize expects a Thunder trace (TraceCtx), got {type(trace).__name__}.{hint}")
    budget = MemoryBudget.parse(memory_budget)
    check_policy(recompute, RecomputePolicy, "recompute")
    resolve_solver(solver)
    start = time.perf_counter()
    graph = read_trace(trace)
    if not graph.is_joint:
        raise NoBackwardError("optimize needs a joint forward+backward trace (from remat.training_trace)")
    before = profile_graph(graph)
    choice = None
    try:
        if budget is None:
            plan = plan_graph(graph, recompute, solver)
        else:
            choice = budgets.plan_for_budget(graph, budget, reference_peak=before.peak_bytes, recompute=recompute, solver=solver)
            plan = choice.plan
    except Exception as exc:  # a solver failure must never break the user's training step
        if strict:
            _raise_strict(f"solver failed: {type(exc).__name__}: {exc}", exc)
        reason = f"solver: {exc}" if isinstance(exc, RematError) else f"solver failed: {type(exc).__name__}: {exc}"
        return _fallback(trace, graph, before, reason, start)
    result = _apply(trace, graph, before, plan, strict=strict, start=start)
    if choice is not None:
        _note_budget(result, budget, choice, strict)
    return result


def _note_budget(result: Result, budget: MemoryBudget, choice: budgets.BudgetChoice, strict: bool) -> None:
    point, budget_bytes = choice.point, choice.budget_bytes
    if choice.fits:
        result.notes.append(
            f"budget {budget} ({format_bytes(budget_bytes)}): chose the plan with the fewest extra FLOPs whose estimated "
            f"peak ({format_bytes(point.peak_bytes)}) fits, out of {len(choice.frontier)} on the frontier"
        )
    else:
        message = (
            f"memory budget {budget} ({format_bytes(budget_bytes)}) is not reachable: the smallest estimated peak remat "
            f"finds is {format_bytes(point.peak_bytes)} (recomputing {point.extra_flops:.3g} FLOPs); using that plan"
        )
        if strict:
            raise OptimizationError(message)
        warnings.warn(message, OptimizationWarning, stacklevel=3)
        result.notes.append(message)
    result.frontier = choice.frontier


def _raise_strict(reason: str, exc: BaseException | None = None) -> None:
    """``strict=True``: a :class:`RematError` as it is, anything else as an :class:`OptimizationError`."""
    if isinstance(exc, RematError):
        raise exc
    raise OptimizationError(reason) from exc


def _count(kinds) -> str:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{kind} x{n}" if n > 1 else kind for kind, n in sorted(counts.items()))


def left_as_is(graph: FusionGraph) -> list[tuple[type[RematError], str]]:
    """What remat leaves as the trace has it in a joint trace it can otherwise plan: one
    ``(error class, message)`` per cause (unknown forward ops; forward ops reading a buffer an in-place op
    writes later).  Those ops are never recomputed (:func:`remat.planning.problem.build_problem` pins them)."""
    causes: list[tuple[type[RematError], str]] = []
    unknown = [op.kind for op in graph.ops if op.phase == FORWARD and "opaque" in op.tags]
    if unknown:
        causes.append(
            (
                UnknownOpError,
                f"remat does not know the forward op(s) {_count(unknown)}: left as the trace has them "
                "(stand-alone, never recomputed); the rest of the trace is optimized",
            )
        )
    hazards = graph.mutation_hazards
    if hazards:
        readers = [graph.ops[n].kind for n in hazards]
        writers = sorted(set(hazards.values()))
        causes.append(
            (
                InPlaceError,
                f"in-place op(s) {', '.join(writers)} write buffers that {len(readers)} earlier forward op(s) read "
                f"({_count(readers)}): those are left as the trace has them (never recomputed, since a "
                "recomputation would read the new contents); the rest of the trace is optimized",
            )
        )
    return causes


def _fallback(trace: TraceCtx, graph: FusionGraph, before: MemoryProfile, reason: str, start: float) -> Result:
    warnings.warn(f"remat left the trace as it was: {reason}", OptimizationWarning, stacklevel=4)
    return Result(trace, None, before, before, graph, 0, graph.step_flops, time.perf_counter() - start, False, [reason], trace)


def _apply(trace: TraceCtx, graph: FusionGraph, before: MemoryProfile, plan: Plan, *, strict: bool, start: float) -> Result:
    """Rewrite ``trace`` by ``plan`` and measure it; the input trace comes back if that fails or would
    raise the estimated peak.  Parts left as they are (:func:`left_as_is`) are warned about here, once."""
    notes: list[str] = []
    for error, message in left_as_is(graph):
        if strict:
            raise error(message)
        warnings.warn(message, OptimizationWarning, stacklevel=4)
        notes.append(message)
    try:
        rewritten = apply_plan(trace, graph, plan)
    except Exception as exc:  # a rewrite bug must never break the user's training step
        if strict:
            _raise_strict(f"rewrite failed: {type(exc).__name__}: {exc}", exc)
        return _fallback(trace, graph, before, f"rewrite failed: {type(exc).__name__}: {exc}", start)
    after = profile_graph(read_trace(rewritten.trace, ops=False, derived_from=graph))
    if after.peak_bytes > before.peak_bytes:
        reason = (
            f"the plan would raise the estimated peak ({before.peak_bytes / 2**20:.1f} -> "
            f"{after.peak_bytes / 2**20:.1f} MiB)"
        )
        if strict:
            raise OptimizationError(reason)
        return _fallback(trace, graph, before, reason, start)
    return Result(
        trace=rewritten.trace,
        plan=plan,
        before=before,
        after=after,
        graph=graph,
        extra_flops=rewritten.extra_flops,
        step_flops=graph.step_flops,
        seconds=time.perf_counter() - start,
        applied=True,
        notes=notes + rewritten.notes,
        original=trace,
        placements=rewritten.placements,
    )


def _graph_of(trace_or_graph: TraceCtx | FusionGraph | nx.DiGraph) -> FusionGraph:
    if isinstance(trace_or_graph, FusionGraph):
        return trace_or_graph
    if isinstance(trace_or_graph, nx.DiGraph):
        return plain_graph(trace_or_graph)[0]
    if isinstance(trace_or_graph, TraceCtx):
        return read_trace(trace_or_graph)
    raise TypeError(f"expected a Thunder trace, a FusionGraph or a networkx.DiGraph, got {type(trace_or_graph).__name__}")


def pareto(
    trace_or_graph: TraceCtx | FusionGraph | nx.DiGraph,
    *,
    recompute: RecomputePolicy | None = None,
    priced: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
) -> list[ParetoPoint]:
    """The (estimated peak, extra FLOPs) frontier of plans for a fused joint trace, a
    :class:`FusionGraph` or a plain networkx graph (:func:`remat.planning.budget.pareto`).  Plans of a plain
    graph name op positions of :func:`remat.core.plain.plain_graph`'s graph."""
    check_policy(recompute, RecomputePolicy, "recompute")
    check_policy(priced, RecomputePolicy, "priced")
    resolve_solver(solver)
    return budgets.pareto(_graph_of(trace_or_graph), recompute=recompute, priced=priced, solver=solver)


def estimate_memory(trace_or_graph: TraceCtx | FusionGraph) -> MemoryProfile:
    """Memory profile (docs/memory-model.md) of any Thunder trace (joint, fused, Thunder's own
    rematerialized traces included) or of a :class:`FusionGraph`."""
    if isinstance(trace_or_graph, FusionGraph):
        return profile_graph(trace_or_graph)
    return profile_graph(read_trace(trace_or_graph, ops=False))  # TypeError (with a hint) for anything else
