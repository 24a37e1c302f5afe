"""Stage 4, *solver*: minimum s-t cut of a :class:`~remat.problem.FlowProblem`.

Two backends compute the same cut:

``"scipy"`` (default)
    ``scipy.sparse.csgraph.maximum_flow`` with Dinic's algorithm, in compiled code.  It takes only
    32-bit integer capacities, so byte counts are scaled down by a power of two when their sum does not fit
    (``scale`` in the result; the scaled sizes are rounded up, so a value never becomes free).  With
    ``scale == 1`` the cut is exact; otherwise it is optimal for the scaled sizes, which differ from the
    true ones by less than ``scale`` bytes per value.
``"networkx"``
    ``networkx``'s preflow-push on the unscaled network: slow, exact, the reference in tests.

Both return the *sink-closest* minimum cut: the sink side is the set of nodes that can still reach the
sink in the residual network of a maximum flow (it is the same for every maximum flow).  Among cuts of
equal bytes this keeps values as late as possible and so recomputes least.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from remat.errors import InfeasibleError
from remat.problem import INFINITE, SINK, SOURCE, FlowProblem

__all__ = ["CutResult", "min_cut", "BACKENDS"]

BACKENDS = ("scipy", "networkx")
_INT32_BUDGET = 2**29  # total finite capacity after scaling; leaves room for "infinity" within int32
_SCIPY_INFINITY = 2**30


@dataclass(frozen=True)
class CutResult:
    """``sink_side[i]`` is True for flow-network nodes on the sink side.  ``flow_value`` is in the
    backend's (possibly scaled) units; ``scale`` is the bytes per unit."""

    sink_side: np.ndarray
    flow_value: int
    scale: int
    seconds: float
    backend: str


def _merge_parallel_edges(problem: FlowProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = problem.num_nodes
    keys = problem.tails * n + problem.heads
    unique, inverse = np.unique(keys, return_inverse=True)
    infinite = np.zeros(len(unique), dtype=bool)
    np.logical_or.at(infinite, inverse, problem.capacities == INFINITE)
    finite_caps = np.where(problem.capacities == INFINITE, 0, problem.capacities)
    summed = np.zeros(len(unique), dtype=np.int64)
    np.add.at(summed, inverse, finite_caps)
    return unique // n, unique % n, summed, infinite


def _raise_infeasible(problem: FlowProblem) -> None:
    culprits = sorted(problem.backward_reads & problem.unsavable & problem.pinned)
    hint = f" (e.g. {', '.join(map(str, culprits[:5]))})" if culprits else ""
    raise InfeasibleError(
        "no finite cut: the backward reads values that can be neither saved nor recomputed" + hint
    )


def _scipy_cut(problem: FlowProblem) -> CutResult:
    start = time.perf_counter()
    n = problem.num_nodes
    tails, heads, caps, infinite = _merge_parallel_edges(problem)
    total = int(caps[~infinite].sum())
    scale = 1
    if total > _INT32_BUDGET:
        scale = 2 ** math.ceil(math.log2(total / _INT32_BUDGET))
    scaled = np.where(caps > 0, -(-caps // scale), 0)  # ceil division keeps nonzero sizes nonzero
    scaled = np.where(infinite, _SCIPY_INFINITY, scaled).astype(np.int32)
    capacity = sp.csr_array((scaled, (tails, heads)), shape=(n, n))
    result = maximum_flow(capacity, SOURCE, SINK, method="dinic")
    if result.flow_value >= _SCIPY_INFINITY:
        _raise_infeasible(problem)
    residual = (capacity - result.flow).tocsr()
    residual.data[residual.data < 0] = 0
    residual.eliminate_zeros()
    # Nodes that can reach the sink through residual capacity: BFS from the sink on reversed edges.
    reverse = residual.T.tocsr()
    reached = breadth_first_order(reverse, SINK, directed=True, return_predecessors=False)
    sink_side = np.zeros(n, dtype=bool)
    sink_side[reached] = True
    return CutResult(sink_side, int(result.flow_value), scale, time.perf_counter() - start, "scipy")


def _networkx_cut(problem: FlowProblem) -> CutResult:
    start = time.perf_counter()
    n = problem.num_nodes
    tails, heads, caps, infinite = _merge_parallel_edges(problem)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    for t, h, c, inf in zip(tails.tolist(), heads.tolist(), caps.tolist(), infinite.tolist()):
        if inf:
            graph.add_edge(t, h)  # no 'capacity' attribute: infinite for networkx
        else:
            graph.add_edge(t, h, capacity=c)
    try:
        residual = nx.algorithms.flow.preflow_push(graph, SOURCE, SINK)
    except nx.NetworkXUnbounded:
        _raise_infeasible(problem)
    flow_value = residual.graph["flow_value"]
    can_reach_sink = {SINK}
    stack = [SINK]
    while stack:
        v = stack.pop()
        for u in residual.predecessors(v):
            if u in can_reach_sink:
                continue
            edge = residual[u][v]
            if edge["capacity"] - edge["flow"] > 0:
                can_reach_sink.add(u)
                stack.append(u)
    sink_side = np.zeros(n, dtype=bool)
    sink_side[list(can_reach_sink)] = True
    return CutResult(sink_side, int(flow_value), 1, time.perf_counter() - start, "networkx")


def min_cut(problem: FlowProblem, backend: str = "scipy") -> CutResult:
    """Sink-closest minimum cut of ``problem`` with the chosen backend (see the module docstring)."""
    if backend == "scipy":
        return _scipy_cut(problem)
    if backend == "networkx":
        return _networkx_cut(problem)
    raise ValueError(f"unknown solver backend {backend!r}; choose one of {BACKENDS}")
