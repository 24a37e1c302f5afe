"""What every min-cut algorithm returns, and the network preparation they share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from remat.errors import InfeasibleError
from remat.planning.problem import INFINITE, FlowProblem

__all__ = ["CutResult", "merged_edges", "raise_infeasible"]


@dataclass(frozen=True)
class CutResult:
    """``sink_side[i]`` is True for flow-network nodes on the sink side of the *sink-closest* minimum
    cut: the nodes that can still reach the sink in the residual network of a maximum flow (the same set
    for every maximum flow; among cuts of equal bytes it keeps values as late as possible and so
    recomputes least).  ``flow_value`` is in the algorithm's (possibly scaled) units; ``scale`` is the
    bytes per unit; ``solver`` names the algorithm."""

    sink_side: np.ndarray
    flow_value: int
    scale: int
    seconds: float
    solver: str


def merged_edges(problem: FlowProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The problem's edges with parallel edges merged: ``(tails, heads, finite capacity sums, infinite)``."""
    n = problem.num_nodes
    keys = problem.tails * n + problem.heads
    unique, inverse = np.unique(keys, return_inverse=True)
    infinite = np.zeros(len(unique), dtype=bool)
    np.logical_or.at(infinite, inverse, problem.capacities == INFINITE)
    finite_caps = np.where(problem.capacities == INFINITE, 0, problem.capacities)
    summed = np.zeros(len(unique), dtype=np.int64)
    np.add.at(summed, inverse, finite_caps)
    return unique // n, unique % n, summed, infinite


def raise_infeasible(problem: FlowProblem) -> None:
    """Raise :class:`remat.InfeasibleError` naming values the backward reads that can be neither saved
    nor recomputed (the flow is unbounded)."""
    culprits = sorted(problem.backward_reads & problem.unsavable & problem.pinned)
    hint = f" (e.g. {', '.join(map(str, culprits[:5]))})" if culprits else ""
    raise InfeasibleError("no finite cut: the backward reads values that can be neither saved nor recomputed" + hint)
