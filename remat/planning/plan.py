"""Stage 5, *plan*: what to save and what to recompute, read off a minimum cut.

:func:`plan_graph` is the one path from a graph to a plan: problem (:func:`build_problem`) -> minimum
cut (:func:`~remat.planning.flow.min_cut`) -> plan (:func:`plan_from_cut`).  A plan names values (tensor
proxy names for trace graphs) and op nodes; it holds no Thunder objects.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace

from remat.core.ir import FusionGraph
from remat.core.layout import Layout, plan_layout, recompute_closure
from remat.core.policies import RecomputePolicy
from remat.planning.flow import DEFAULT_SOLVER, CutResult, Solver, min_cut
from remat.planning.problem import FlowProblem, build_problem

__all__ = ["Plan", "plan_from_cut", "plan_graph"]


@dataclass(frozen=True)
class Plan:
    """The decision for one trace or graph.

    ``saved``: forward values kept for the backward.  ``recomputed_ops``: forward op nodes run again in
    the backward (in forward order).  ``recomputed_values``: values the backward reads that it gets by
    recomputation.  ``saved_bytes``: what keeping ``saved`` costs (views of parameters and forward outputs
    cost nothing).  ``extra_flops``: FLOPs the rewritten step runs beyond the original, each recomputed
    op counted every time it runs (a fusible prim once per unit it is recomputed for, a stand-alone op
    such as a matmul once, as :func:`remat.core.layout.plan_layout` places them; docs/concepts.md).  ``solver``: the
    min-cut algorithm; ``recompute``: the :class:`~remat.RecomputePolicy` planned with; ``scale``: bytes per
    unit of the cut (1: exact).  ``layout``: the :class:`~remat.core.layout.Layout` the extra FLOPs were
    counted on, for the graph the plan was made for (the rewrite and the memory model reuse it instead
    of laying the plan out again; not part of the plan's value).
    """

    saved: tuple[str, ...]
    recomputed_ops: tuple[Hashable, ...]
    recomputed_values: tuple[str, ...]
    saved_bytes: int
    extra_flops: int
    solve_seconds: float
    solver: str
    recompute: RecomputePolicy = field(default_factory=RecomputePolicy)
    scale: int = 1
    layout: Layout | None = field(default=None, compare=False, repr=False)

    def __repr__(self) -> str:
        return (
            f"Plan(saved={len(self.saved)} values / {self.saved_bytes / 2**20:.1f} MiB, "
            f"recomputed={len(self.recomputed_ops)} ops, extra_flops={self.extra_flops:.3g}, "
            f"{self.solver} {self.solve_seconds * 1e3:.1f} ms)"
        )


def plan_from_cut(problem: FlowProblem, cut: CutResult, recompute: RecomputePolicy | None = None) -> Plan:
    """Saved values are those whose split edge crosses the cut (``in`` on the source side, ``out`` on
    the sink side); recomputation follows from them (:func:`remat.core.layout.recompute_closure`).  The
    plan carries its layout (``Plan.layout``), which counts its extra FLOPs."""
    sink_side = cut.sink_side
    saved = [name for name, i in problem.value_index.items() if not sink_side[2 + 2 * i] and sink_side[3 + 2 * i]]
    saved_set = set(saved)
    recomputed_values = sorted((v for v in problem.backward_reads if v not in saved_set), key=problem.value_index.__getitem__)
    ops = recompute_closure(
        recomputed_values,
        problem.producer.__getitem__,
        lambda op: (read for read in problem.reads.get(op, ()) if read not in saved_set),
    )
    order = {problem.producer[v]: problem.value_index[v] for v in reversed(problem.values)}
    ops.sort(key=lambda op: order.get(op, 0))
    recomputed = set(ops)
    pinned_recomputed = [problem.producer[v] for v in problem.pinned if problem.producer[v] in recomputed]
    if pinned_recomputed:  # cannot happen with a finite cut; a guard against solver bugs
        raise AssertionError(f"plan recomputes pinned ops {pinned_recomputed[:5]}")
    plan = Plan(
        saved=tuple(saved),
        recomputed_ops=tuple(ops),
        recomputed_values=tuple(recomputed_values),
        saved_bytes=sum(problem.save_cost[v] for v in saved),
        extra_flops=0,
        solve_seconds=cut.seconds,
        solver=cut.solver,
        recompute=recompute or RecomputePolicy(),
        scale=cut.scale,
    )
    if problem.graph is None:
        raise ValueError("plan_from_cut needs the problem's graph (build it with build_problem)")
    # the one count of extra FLOPs: the layout's, where an op recomputed for two units runs twice
    layout = plan_layout(problem.graph, plan)
    return replace(plan, extra_flops=layout.extra_flops, layout=layout)


def plan_graph(
    graph: FusionGraph,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    *,
    priced: RecomputePolicy | None = None,
    recompute_price: float = 0.0,
    weights: Mapping[str, float] | None = None,
) -> Plan:
    """One minimum cut over the whole forward of ``graph``: the plan that saves as little as it can
    under ``recompute`` (see :func:`~remat.planning.problem.build_problem` for ``priced``,
    ``recompute_price`` and ``weights``).  ``solve_seconds`` covers building the problem and the cut.
    Raises :class:`remat.InfeasibleError` when no finite cut exists."""
    start = time.perf_counter()
    recompute = recompute or RecomputePolicy()
    problem = build_problem(graph, recompute, priced=priced, recompute_price=recompute_price, weights=weights)
    plan = plan_from_cut(problem, min_cut(problem, solver), recompute)
    return replace(plan, solve_seconds=time.perf_counter() - start)
