"""``remat.solve``: plan a plain networkx training graph (no trace, no Thunder).

The graph follows the schema of :mod:`remat.core.plain` (docs/graph-schema.md); a
:class:`remat.FusionGraph`'s ``.nx`` does too.  Without a budget the plan is the one minimum cut
(:func:`~remat.planning.plan.plan_graph`); with one, the cheapest plan of the Pareto frontier whose
estimated peak fits (:func:`~remat.planning.budget.plan_for_budget`; a fraction is of the plan without a
budget), the memory model running on one unit per node.  The returned plan names the graph's nodes.
"""

from __future__ import annotations

import time
from dataclasses import replace

import networkx as nx

from remat.core.memory import MemoryBudget
from remat.core.plain import plain_graph
from remat.core.policies import RecomputePolicy, check_policy
from remat.errors import warn
from remat.planning.budget import plan_for_budget
from remat.planning.flow import DEFAULT_SOLVER, Solver, resolve_solver
from remat.planning.plan import Plan, plan_graph

__all__ = ["solve"]


def solve(
    graph: nx.DiGraph,
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
) -> Plan:
    """Plan what a training graph saves and recomputes: one minimum cut over the whole forward.

    ``memory_budget`` (see :class:`remat.MemoryBudget`; a fraction is of the estimated peak of the plan
    ``solve`` returns without a budget; with ``regather_parameters=True``, of the plan that re-gathers
    nothing, see :func:`remat.planning.budget.plan_for_budget`) asks for the cheapest plan on the Pareto frontier whose estimated
    peak fits; a warning says when none does, with the smallest estimated peak reachable (that plan is
    returned).  ``recompute``: what may be recomputed;
    ``solver``: the min-cut algorithm (a name from ``remat.planning.flow.ALGORITHMS`` or a function).
    Raises :class:`remat.GraphError` for malformed graphs and :class:`remat.InfeasibleError` when no
    finite cut exists; ``TypeError``/``ValueError`` for a wrong budget, policy or solver.
    """
    budget = MemoryBudget.parse(memory_budget)
    check_policy(recompute, RecomputePolicy, "recompute")
    resolve_solver(solver)
    start = time.perf_counter()
    fusion_graph, node_ids = plain_graph(graph)
    if budget is None:
        plan = plan_graph(fusion_graph, recompute, solver)
    else:
        choice = plan_for_budget(fusion_graph, budget, recompute=recompute, solver=solver)
        if not choice.fits:
            warn(
                f"memory budget {budget} ({choice.budget_bytes} bytes) is not reachable; the smallest estimated "
                f"peak remat finds is {choice.point.peak_bytes} bytes (using that plan)"
            )
        plan = choice.plan
    return replace(
        plan,
        recomputed_ops=tuple(node_ids[i] for i in plan.recomputed_ops),
        solve_seconds=time.perf_counter() - start,
        layout=None,  # laid out on the internal graph's op positions, not on these node ids
    )
