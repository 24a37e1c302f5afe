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
from dataclasses import dataclass, field

import networkx as nx

from remat.core.collector import collector_paused
from remat.core.ir import FORWARD, FusionGraph, describe_values
from remat.core.memory import MemoryBudget, MemoryProfile, profile_graph
from remat.core.units import format_bytes, format_flops, format_seconds, format_share
from remat.core.plain import plain_graph
from remat.core.policies import RecomputePolicy, check_policy
from remat.errors import (
    InPlaceError,
    NoBackwardError,
    OptimizationError,
    RematError,
    UnknownOpError,
    warn,
)
from remat._logging import logger, stage
from remat.planning import budget as budgets
from remat.planning.budget import ParetoPoint
from remat.planning.flow import DEFAULT_SOLVER, Solver, resolve_solver
from remat.planning.plan import Plan, plan_graph
from remat.thunder import TraceCtx
from remat.thunder.execute import rebuild_regions, thunder_rematerialize
from remat.thunder.read import random_draws, read_trace
from remat.thunder.rewrite import apply_plan

__all__ = ["CANDIDATES", "Result", "optimize", "pareto", "estimate_memory", "left_as_is"]


#: What :attr:`Result.chosen` may name: remat's plan, Thunder's own ``rematerialize``, or the trace as it came.
CANDIDATES = ("remat", "thunder", "unplanned")


@dataclass
class Result:
    """What :func:`optimize` did.

    ``trace``: the trace to run: remat's rewrite, or (when that would not lower the estimated peak)
    Thunder's own ``rematerialize`` of the same trace, or the trace as it came; ``chosen`` says which
    (``"remat"``, ``"thunder"`` or ``"unplanned"``) and ``notes`` why.  ``plan``: remat's
    :class:`~remat.Plan` (None only when planning failed); ``applied``: True when ``trace`` is remat's
    rewrite by it.  ``before`` / ``after``:
    :class:`~remat.MemoryProfile` of the input trace and of ``trace``.  ``candidates``: the memory
    profile of every trace compared (the same names as ``chosen``).  ``graph``: the
    :class:`~remat.FusionGraph` of the input trace (the plan's node ids refer to it); ``after_graph``:
    that of ``trace`` (read on first use).  ``extra_flops``: FLOPs the step runs beyond the input
    trace's (docs/concepts.md, "extra FLOPs": each recomputation counted every time it runs);
    ``step_flops``: FLOPs of the input step.  ``seconds``: remat's own time (reading, planning,
    rewriting); ``baseline_seconds``: Thunder's ``rematerialize``, run for the comparison.
    ``placements``: where each recomputation runs (empty unless applied): a region's name -> the op nodes
    it recomputes, and, for an op re-issued stand-alone (a recomputed matmul, a re-gather; see
    :mod:`remat.core.layout`), ``"<first output> = <symbol>"`` -> its node.  ``frontier``: with a memory budget, the Pareto frontier the plan was chosen from (see
    :func:`remat.pareto`).
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
    chosen: str = "remat"
    candidates: dict[str, MemoryProfile] = field(default_factory=dict)
    baseline_seconds: float = 0.0

    @functools.cached_property
    def after_graph(self) -> FusionGraph:
        """The :class:`~remat.FusionGraph` of :attr:`trace`, with operations (the one the pictures and the
        report draw)."""
        if self.trace is getattr(self.graph.origin, "trace", None):
            return self.graph
        return read_trace(self.trace, derived_from=self.graph)

    def summary(self, compare: bool = False) -> str:
        """A few lines in human units: memory before -> after, extra FLOPs, time, notes.  ``compare=True``
        adds a table of every trace compared (the input, Thunder's ``rematerialize``, remat's plan)."""
        extra = f"{format_flops(self.extra_flops)} ({format_share(self.extra_flops, self.step_flops)} of the step)"
        lines = [
            f"kept:              {_KEPT[self.chosen]}",
            f"saved activations: {format_bytes(self.before.saved_bytes)} -> {format_bytes(self.after.saved_bytes)}",
            f"estimated peak:    {format_bytes(self.before.peak_bytes)} -> {format_bytes(self.after.peak_bytes)}",
            f"extra FLOPs:       {extra}",
            f"optimizer time:    {format_seconds(self.seconds)}"
            + (f" (+ {format_seconds(self.baseline_seconds)} for Thunder's rematerialize)" if self.baseline_seconds else ""),
        ]
        lines += self._largest_values()
        if compare and self.candidates:
            rows = [("trace", "saved", "est. peak", "")]
            for name in CANDIDATES:
                if name in self.candidates:
                    profile = self.candidates[name]
                    rows.append((_KEPT[name], format_bytes(profile.saved_bytes), format_bytes(profile.peak_bytes), "kept" if name == self.chosen else ""))
            widths = [max(len(row[i]) for row in rows) for i in range(4)]
            lines.append("")
            lines += ["  ".join(cell.ljust(w) if i in (0, 3) else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _largest_values(self, count: int = 3) -> list[str]:
        """The largest saved and recomputed values, with the module each comes from (where known)."""
        lines = []
        graph = self.after_graph
        saved = sorted(self.after.saved_tensors, key=lambda name: -graph.tensors[name].bytes)[:count]
        if saved:
            lines.append(f"largest saved:     {'; '.join(describe_values(graph, saved))}")
        if self.applied and self.plan.recomputed_values:
            values = sorted(self.plan.recomputed_values, key=lambda name: -self.graph.tensors[name].bytes)
            shown = "; ".join(describe_values(self.graph, values[:count]))
            lines.append(f"recomputed:        {len(values)} values, largest {shown}")
        if graph.donations:  # the graph runtime writes these over inputs dying at their regions
            donated = sorted(graph.donations, key=lambda name: -graph.tensors[name].bytes)
            total = format_bytes(sum(graph.tensors[name].bytes for name in donated))
            shown = "; ".join(f"{line} over {graph.donations[name]}" for name, line in zip(donated[:count], describe_values(graph, donated[:count])))
            lines.append(f"written in place:  {len(donated)} outputs ({total}), largest {shown}")
        return lines

    def __repr__(self) -> str:
        return (
            f"Result(saved {format_bytes(self.before.saved_bytes)} -> {format_bytes(self.after.saved_bytes)}, "
            f"peak {format_bytes(self.before.peak_bytes)} -> {format_bytes(self.after.peak_bytes)}, kept {self.chosen})"
        )


_KEPT = {"remat": "remat's plan", "thunder": "Thunder's rematerialize", "unplanned": "the trace as it came"}


@collector_paused  # the stages allocate heavily and make next to no cyclic garbage: remat.core.collector
def optimize(
    trace: TraceCtx,
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
    thunder_baseline: bool = True,
    token_major_attention: bool = False,
    donate_dying_inputs: bool = False,
) -> Result:
    """Plan and apply one global rematerialization of a (fused) joint Thunder trace.

    ``recompute`` says what may be recomputed (a :class:`~remat.RecomputePolicy`; default: no matmuls,
    attention, reductions or stateful RNG).  ``memory_budget`` (a :class:`~remat.MemoryBudget`: bytes as an
    int, a fraction in (0, 1] of the default plan's estimated peak (what remat uses without a budget) as a
    float, or a string like ``"600MiB"`` or ``"70%"``) asks for more recomputation until the estimated
    peak fits; see :mod:`remat.planning.budget`.  ``solver`` picks the
    min-cut algorithm (``"dinic"``, ``"preflow_push"`` or a function; :mod:`remat.planning.flow`).
    ``token_major_attention``: the trace will run with attention's query, key and value laid out token
    by token (what ``remat.jit(runtime="inductor-graph")`` does), which makes attention's output
    token-major and the reshape feeding the output projection a view: the memory model counts it so
    (:func:`remat.read_trace`).  ``donate_dying_inputs``: the trace will run where a region writes an
    output into the storage of an input dying there (the graph runtime, :mod:`remat.core.donation`): the
    memory model counts no buffer for those outputs.  Planning itself does not use it (its cut and save
    costs are as without), only the estimates of the traces compared and returned.

    Never worse than Thunder, by construction: the trace returned has the lowest estimated peak of remat's
    rewrite, Thunder's own ``rematerialize`` of the same trace (with ``thunder_baseline=True``, the
    default) and the trace as it came; remat's wins ties.  With a memory budget, remat's rewrite is kept
    whenever its estimated peak fits the budget: the budget is what the user allows, and a budget above
    the default plan's peak buys fewer kernels with memory (:mod:`remat.planning.budget`).  ``Result.chosen`` says which was kept and
    ``Result.notes`` why; keeping another trace is not a failure and does not warn.

    What remat cannot handle is left as the trace has it, each cause with one
    :class:`OptimizationWarning` (docs/robustness.md): a failing solve or rewrite returns the best of the
    other traces (``applied=False``); forward ops of a kind remat does not know, and ops reading a buffer
    that an in-place op writes later, are never recomputed (the rest is optimized).  With ``strict=True``
    each of these raises a :class:`remat.RematError` subclass instead (:class:`~remat.OptimizationError`,
    :class:`~remat.UnknownOpError`, :class:`~remat.InPlaceError`).  ``Result.original`` is always the
    input trace, unchanged.

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
    if not isinstance(thunder_baseline, bool):
        raise TypeError(f"thunder_baseline must be True or False, got {type(thunder_baseline).__name__}")
    for flag, value in (("token_major_attention", token_major_attention), ("donate_dying_inputs", donate_dying_inputs)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, got {type(value).__name__}")
    start = time.perf_counter()
    with stage("plan") as planning:
        graph = read_trace(trace, token_major_attention=token_major_attention, donate_dying_inputs=donate_dying_inputs)
        if not graph.is_joint:
            raise NoBackwardError("optimize needs a joint forward+backward trace (from remat.training_trace)")
        before = profile_graph(graph)
        causes = left_as_is(graph)
        if strict and causes:
            error, message = causes[0]
            raise error(message)
        plan, choice, failure = None, None, None
        try:
            if budget is None:
                plan = plan_graph(graph, recompute, solver)
            else:
                choice = budgets.plan_for_budget(graph, budget, recompute=recompute, solver=solver)
                plan = choice.plan
            planning.detail = f"{len(plan.saved)} values saved, {len(plan.recomputed_ops)} ops recomputed"
        except Exception as exc:  # a solver failure must never break the user's training step
            if strict:
                _raise_strict(f"solver failed: {type(exc).__name__}: {exc}", exc)
            failure = f"solver: {exc}" if isinstance(exc, RematError) else f"solver failed: {type(exc).__name__}: {exc}"
    rewritten = None
    if plan is not None:
        with stage("rewrite") as rewriting:
            try:
                rewritten = apply_plan(trace, graph, plan, layout=plan.layout)  # laid out once, when planned
                remat_profile = profile_graph(read_trace(rewritten.trace, ops=False, derived_from=graph))
                rewriting.detail = f"estimated peak {format_bytes(before.peak_bytes)} -> {format_bytes(remat_profile.peak_bytes)}"
            except Exception as exc:  # a rewrite bug must never break the user's training step
                if strict:
                    _raise_strict(f"rewrite failed: {type(exc).__name__}: {exc}", exc)
                failure = f"rewrite failed: {type(exc).__name__}: {exc}"
                rewritten = None
    seconds = time.perf_counter() - start

    candidates: dict[str, MemoryProfile] = {}
    if rewritten is not None:
        candidates["remat"] = remat_profile
    thunder_trace, baseline_seconds, notes = None, 0.0, []
    if thunder_baseline:
        draws_random = any("rng" in op.tags for op in graph.ops)
        thunder_trace, baseline_seconds, thunder_note = _thunder_baseline(trace, draws_random)
        if thunder_trace is not None:
            candidates["thunder"] = profile_graph(
                read_trace(thunder_trace, ops=False, token_major_attention=token_major_attention, donate_dying_inputs=donate_dying_inputs)
            )
        else:
            notes.append(thunder_note)
    candidates["unplanned"] = before
    chosen = min(candidates, key=lambda name: candidates[name].peak_bytes)  # insertion order breaks ties: remat first
    if choice is not None and choice.fits and "remat" in candidates and candidates["remat"].peak_bytes <= choice.budget_bytes:
        # a budget is what the user allows: remat's plan, the cheapest that fits, is kept when it fits
        # (above the default plan it keeps values to save kernels, and may peak above Thunder's trace)
        chosen = "remat"

    if failure is not None:
        warn(f"remat's plan was not applied: {failure}; kept {_KEPT[chosen]}")
        notes.insert(0, failure)
    elif chosen != "remat":
        notes.insert(
            0,
            f"kept {_KEPT[chosen]}: its estimated peak ({format_bytes(candidates[chosen].peak_bytes)}) is below that of "
            f"remat's plan ({format_bytes(candidates['remat'].peak_bytes)})",
        )
        logger.info("kept %s: lower estimated peak than remat's plan", _KEPT[chosen])
    if chosen == "remat":
        for _, message in causes:
            warn(message)
            notes.append(message)
        notes += rewritten.notes
        result = Result(
            trace=rewritten.trace,
            plan=plan,
            before=before,
            after=candidates["remat"],
            graph=graph,
            extra_flops=rewritten.extra_flops,
            placements=rewritten.placements,
            applied=True,
        )
    elif chosen == "thunder":
        thunder_trace = rebuild_regions(thunder_trace)  # rematerialize edits regions, not their callables
        thunder_graph = read_trace(thunder_trace, token_major_attention=token_major_attention, donate_dying_inputs=donate_dying_inputs)
        result = Result(
            trace=thunder_trace,
            plan=plan,
            before=before,
            after=candidates["thunder"],
            graph=graph,
            extra_flops=max(thunder_graph.step_flops - graph.step_flops, 0),
            applied=False,
        )
        result.__dict__["after_graph"] = thunder_graph  # already read: the cached property's slot
    else:
        result = Result(trace=trace, plan=plan, before=before, after=before, graph=graph, applied=False)
    result.step_flops = graph.step_flops
    result.seconds = seconds
    result.baseline_seconds = baseline_seconds
    result.notes = notes
    result.original = trace
    result.chosen = chosen
    result.candidates = candidates
    if choice is not None:
        _note_budget(result, budget, choice, strict)
    return result


def _thunder_baseline(trace: TraceCtx, draws_random: bool) -> tuple[TraceCtx | None, float, str]:
    """Thunder's own ``rematerialize`` of ``trace`` (the plan :func:`optimize` must never be worse than),
    its time, and why it is missing if it failed (Thunder's pass, not remat's: a note, not a warning).
    ``draws_random``: whether the trace holds stateful random ops, whose order Thunder's pass must keep."""
    with stage("thunder baseline"):
        start = time.perf_counter()
        try:
            thunder_trace, _ = thunder_rematerialize(trace)
        except Exception as exc:
            logger.info("Thunder's rematerialize failed on this trace: %s: %s", type(exc).__name__, exc)
            return None, time.perf_counter() - start, f"Thunder's rematerialize failed ({type(exc).__name__}: {exc}); not compared"
        if draws_random and random_draws(thunder_trace) != random_draws(trace):
            # Thunder's pass may reorder ops inside a region: with stateful RNG (dropout on the CPU) that
            # draws other masks than the input trace would; remat's rewrite keeps the order
            return None, time.perf_counter() - start, "Thunder's rematerialize reorders random draws (other dropout masks); not compared"
    return thunder_trace, time.perf_counter() - start, ""


def _note_budget(result: Result, budget: MemoryBudget, choice: budgets.BudgetChoice, strict: bool) -> None:
    point, budget_bytes = choice.point, choice.budget_bytes
    if choice.fits:
        result.notes.append(
            f"budget {budget} ({format_bytes(budget_bytes)}"
            + (f" of the default plan's {format_bytes(choice.reference_bytes)}" if budget.fraction is not None else "")
            + "): chose the plan with the fewest extra FLOPs whose estimated "
            f"peak ({format_bytes(point.peak_bytes)}) fits, out of {len(choice.frontier)} on the frontier"
        )
    else:
        message = (
            f"memory budget {budget} ({format_bytes(budget_bytes)}) is not reachable: the smallest estimated peak remat "
            f"finds is {format_bytes(point.peak_bytes)} (recomputing {format_flops(point.extra_flops)}); using that plan"
        )
        if strict:
            raise OptimizationError(message)
        warn(message)
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
    max_interpolated: int = budgets.MAX_INTERPOLATED,
) -> list[ParetoPoint]:
    """The (estimated peak, extra FLOPs) frontier of plans for a fused joint trace, a
    :class:`FusionGraph` or a plain networkx graph (:func:`remat.planning.budget.pareto`).  Plans of a plain
    graph name op positions of :func:`remat.core.plain.plain_graph`'s graph."""
    check_policy(recompute, RecomputePolicy, "recompute")
    check_policy(priced, RecomputePolicy, "priced")
    resolve_solver(solver)
    return budgets.pareto(
        _graph_of(trace_or_graph), recompute=recompute, priced=priced, solver=solver, max_interpolated=max_interpolated
    )


def estimate_memory(trace_or_graph: TraceCtx | FusionGraph) -> MemoryProfile:
    """Memory profile (docs/memory-model.md) of any Thunder trace (joint, fused, Thunder's own
    rematerialized traces included) or of a :class:`FusionGraph`."""
    if isinstance(trace_or_graph, FusionGraph):
        return profile_graph(trace_or_graph)
    return profile_graph(read_trace(trace_or_graph, ops=False))  # TypeError (with a hint) for anything else
