"""``remat.optimize``: trace -> graph -> problem -> solver -> plan -> rewrite, with memory before/after.

Nothing is lost: if the plan cannot be applied (the solver fails, the rewrite fails, or the rewritten
trace would peak higher than the original), :func:`optimize` returns the trace as it came, with the
reason in ``Result.notes`` and one warning; ``strict=True`` raises instead.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

from remat import _compat
from remat.errors import InPlaceError, OptimizationError, RematError, UnknownOpError
from remat.graph import FusionGraph
from remat.memory import MemoryProfile, profile_graph
from remat.plan import Plan, plan_from_cut
from remat.problem import RecomputePolicy, build_problem, mutation_hazard_ops
from remat.rewrite import apply_plan
from remat.solver import min_cut
from remat.validation import check_memory_budget, check_recompute_policy, check_solver_backend

_compat.import_thunder()

from thunder.core.trace import TraceCtx  # noqa: E402

__all__ = ["Result", "optimize", "OptimizationWarning", "left_as_is"]


class OptimizationWarning(UserWarning):
    """remat left (part of) a trace as it was; the message says why."""


@dataclass
class Result:
    """What :func:`optimize` did.

    ``trace``: the optimized trace (on fallback, the original).  ``plan``: the :class:`~remat.Plan`
    (None on fallback).  ``before`` / ``after``: :class:`~remat.MemoryProfile` of the original and the
    optimized trace.  ``graph``: the :class:`~remat.FusionGraph` of the original trace (the plan's node
    ids refer to it).  ``extra_flops``: FLOPs the backward now recomputes (counted per placement);
    ``step_flops``: FLOPs of the original step.  ``placements``: region -> recomputed op nodes.
    ``applied``: False when the trace was left as it was; ``notes`` says why (or what else happened).
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
    #: with a memory budget: the Pareto frontier the plan was chosen from (see :func:`remat.pareto`)
    frontier: list | None = None

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
    memory_budget: int | float | None = None,
    *,
    policy: RecomputePolicy | None = None,
    backend: str = "scipy",
    strict: bool = False,
) -> Result:
    """Plan and apply one global rematerialization of a (fused) joint Thunder trace.

    ``policy`` says what may be recomputed (default: no matmuls, attention, reductions or stateful RNG).
    ``memory_budget`` (bytes, or a fraction of the un-optimized estimated peak) asks for more
    recomputation until the estimated peak fits; see :mod:`remat.budget`.  ``backend`` picks the min-cut
    solver (``"scipy"`` or ``"networkx"``).

    What remat cannot handle is left as the trace has it, each cause with one
    :class:`OptimizationWarning` (docs/robustness.md): a failing solve or rewrite, or a plan that would
    raise the estimated peak, returns the input trace (``applied=False``); forward ops of a kind remat
    does not know, and ops reading a buffer that an in-place op writes later, are never recomputed (the
    rest is optimized).  With ``strict=True`` each of these raises a :class:`remat.RematError` subclass
    instead (:class:`~remat.OptimizationError`, :class:`~remat.UnknownOpError`,
    :class:`~remat.InPlaceError`).  ``Result.original`` is always the input trace, unchanged.

    Raises ``TypeError`` (not a trace; wrong budget or policy type), ``ValueError`` (unknown backend,
    non-positive budget), :class:`remat.NoBackwardError` (no backward),
    :class:`remat.UnsupportedTraceError` (empty trace, symbolic shapes).
    """
    if not isinstance(trace, TraceCtx):
        hint = " Call remat.training_trace(module, *args) first." if callable(trace) else ""
        raise TypeError(f"optimize expects a Thunder trace (TraceCtx), got {type(trace).__name__}.{hint}")
    check_memory_budget(memory_budget)
    check_recompute_policy(policy)
    check_solver_backend(backend)
    return _optimize(trace, memory_budget, policy=policy, backend=backend, strict=strict)


def _optimize(
    trace: TraceCtx,
    memory_budget: int | float | None,
    *,
    policy: RecomputePolicy | None,
    backend: str,
    strict: bool,
) -> Result:
    start = time.perf_counter()
    if memory_budget is not None:
        from remat.budget import optimize_with_budget, resolve_budget

        resolve_budget(memory_budget, 1)  # validate before any work
        return optimize_with_budget(trace, memory_budget, policy=policy, backend=backend, strict=strict)
    graph = FusionGraph.from_trace(trace)
    if not graph.is_joint:
        from remat.errors import NoBackwardError

        raise NoBackwardError("optimize needs a joint forward+backward trace (from remat.training_trace)")
    before = profile_graph(graph)
    policy = policy or RecomputePolicy()
    try:
        problem = build_problem(graph, policy)
        cut = min_cut(problem, backend)
        plan = plan_from_cut(problem, cut, policy)
    except Exception as exc:  # a solver failure must never break the user's training step
        if strict:
            _raise_strict(f"solver failed: {type(exc).__name__}: {exc}", exc)
        reason = f"solver: {exc}" if isinstance(exc, RematError) else f"solver failed: {type(exc).__name__}: {exc}"
        return _fallback(trace, graph, before, reason, start)
    return _optimize_with_plan(trace, graph, before, plan, strict=strict, start=start)


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
    writes later).  Those ops are never recomputed (:func:`remat.problem.build_problem` pins them)."""
    causes: list[tuple[type[RematError], str]] = []
    unknown = [op.kind for op in graph.ops if op.phase == "forward" and "opaque" in op.tags]
    if unknown:
        causes.append(
            (
                UnknownOpError,
                f"remat does not know the forward op(s) {_count(unknown)}: left as the trace has them "
                "(stand-alone, never recomputed); the rest of the trace is optimized",
            )
        )
    hazards = mutation_hazard_ops(graph)
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
    step_flops = sum(op.flops for op in graph.ops)
    return Result(trace, None, before, before, graph, 0, step_flops, time.perf_counter() - start, False, [reason], trace)


def _optimize_with_plan(
    trace: TraceCtx, graph: FusionGraph, before: MemoryProfile, plan: Plan, *, strict: bool, start: float
) -> Result:
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
    after = profile_graph(FusionGraph._from_trace(rewritten.trace, False, derived_from=graph))
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
        step_flops=sum(op.flops for op in graph.ops),
        seconds=time.perf_counter() - start,
        applied=True,
        notes=notes + rewritten.notes,
        original=trace,
        placements=rewritten.placements,
    )
