"""Stage 5, *plan*: what to save and what to recompute, read off a minimum cut.

:func:`plan_from_cut` turns a :class:`~remat.solver.CutResult` into a :class:`Plan`; :func:`solve` runs
problem -> solver -> plan on a plain networkx graph.  A plan names values (tensor proxy names for trace
graphs) and op nodes; it holds no Thunder objects.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import networkx as nx

from remat.problem import FlowProblem, RecomputePolicy, build_problem
from remat.solver import CutResult, min_cut

__all__ = ["Plan", "plan_from_cut", "solve", "recompute_closure"]


@dataclass(frozen=True)
class Plan:
    """The decision for one trace or graph.

    ``saved``: forward values kept for the backward.  ``recomputed_ops``: forward op nodes run again in
    the backward (in forward order).  ``recomputed_values``: values the backward reads that it gets by
    recomputation.  ``saved_bytes``: what keeping ``saved`` costs (views of parameters and forward outputs
    cost nothing).  ``extra_flops``: FLOPs of the recomputed ops, each counted once.
    """

    saved: tuple[str, ...]
    recomputed_ops: tuple[Hashable, ...]
    recomputed_values: tuple[str, ...]
    saved_bytes: int
    extra_flops: int
    solve_seconds: float
    backend: str
    policy: RecomputePolicy = field(default_factory=RecomputePolicy)
    scale: int = 1

    def __repr__(self) -> str:
        return (
            f"Plan(saved={len(self.saved)} values / {self.saved_bytes / 2**20:.1f} MiB, "
            f"recomputed={len(self.recomputed_ops)} ops, extra_flops={self.extra_flops:.3g}, "
            f"{self.backend} {self.solve_seconds * 1e3:.1f} ms)"
        )


def recompute_closure(problem: FlowProblem, saved: set[str]) -> tuple[list[Hashable], list[str]]:
    """Forward ops the backward must run again when exactly ``saved`` is kept, and the values it reads
    that come from recomputation.  Walks from the backward's reads towards the inputs, stopping at saved
    values (parameters and inputs are outside the network, so always available)."""
    recomputed_values = sorted(
        (v for v in problem.backward_reads if v not in saved), key=problem.value_index.__getitem__
    )
    ops: dict[Hashable, None] = {}
    stack = list(recomputed_values)
    seen = set(stack)
    while stack:
        value = stack.pop()
        op = problem.producer[value]
        if op in ops:
            continue
        ops[op] = None
        for read in problem.reads.get(op, ()):
            if read not in saved and read not in seen:
                seen.add(read)
                stack.append(read)
    order = {problem.producer[v]: problem.value_index[v] for v in reversed(problem.values)}
    return sorted(ops, key=lambda op: order.get(op, 0)), recomputed_values


def plan_from_cut(problem: FlowProblem, cut: CutResult, policy: RecomputePolicy | None = None) -> Plan:
    """Saved values are those whose split edge crosses the cut (``in`` on the source side, ``out`` on
    the sink side); recomputation follows from them (:func:`recompute_closure`)."""
    sink_side = cut.sink_side
    saved = [
        name
        for name, i in problem.value_index.items()
        if not sink_side[2 + 2 * i] and sink_side[3 + 2 * i]
    ]
    saved_set = set(saved)
    ops, recomputed_values = recompute_closure(problem, saved_set)
    pinned_recomputed = [problem.producer[v] for v in problem.pinned if problem.producer[v] in set(ops)]
    if pinned_recomputed:  # cannot happen with a finite cut; a guard against solver bugs
        raise AssertionError(f"plan recomputes pinned ops {pinned_recomputed[:5]}")
    return Plan(
        saved=tuple(saved),
        recomputed_ops=tuple(ops),
        recomputed_values=tuple(recomputed_values),
        saved_bytes=sum(problem.save_cost[v] for v in saved),
        extra_flops=sum(problem.op_flops.get(op, 0) for op in ops),
        solve_seconds=cut.seconds,
        backend=cut.backend,
        policy=policy or RecomputePolicy(),
        scale=cut.scale,
    )


def solve(
    graph: nx.DiGraph,
    memory_budget: int | float | None = None,
    *,
    policy: RecomputePolicy | None = None,
    backend: str = "scipy",
) -> Plan:
    """Plan what a training graph saves and recomputes: one minimum cut over the whole forward.

    ``graph`` follows the schema of :mod:`remat.problem` (a :class:`remat.FusionGraph`'s ``.nx`` does).
    ``memory_budget`` (bytes, or a fraction of the plan's saved bytes with nothing recomputed) is not
    used by the default plan, which saves as little as it can under ``policy``; see
    :func:`remat.optimize` for budgets.  Raises :class:`remat.GraphError` for malformed graphs and
    :class:`remat.InfeasibleError` when no finite cut exists; ``TypeError``/``ValueError`` for a wrong
    budget, policy or backend.
    """
    from remat.validation import check_memory_budget, check_recompute_policy, check_solver_backend

    check_memory_budget(memory_budget)
    check_recompute_policy(policy)
    check_solver_backend(backend)
    if memory_budget is not None:
        from remat.budget import solve_with_budget

        return solve_with_budget(graph, memory_budget, policy=policy, backend=backend)
    start = time.perf_counter()
    policy = policy or RecomputePolicy()
    problem = build_problem(graph, policy)
    cut = min_cut(problem, backend)
    plan = plan_from_cut(problem, cut, policy)
    return _with_time(plan, time.perf_counter() - start)


def _with_time(plan: Plan, seconds: float) -> Plan:
    from dataclasses import replace

    return replace(plan, solve_seconds=seconds)
