"""``solver="preflow_push"``: networkx's preflow-push on the unscaled network.

Slow (pure Python) and exact: the reference in tests.  Thunder 0.2.6 and torch's older partitioner use
this algorithm.
"""

from __future__ import annotations

import time

import networkx as nx
import numpy as np

from remat.planning.flow.cut import CutResult, merged_edges, raise_infeasible
from remat.planning.problem import SINK, SOURCE, FlowProblem

__all__ = ["minimum_cut"]


def minimum_cut(problem: FlowProblem) -> CutResult:
    """The sink-closest minimum cut of ``problem`` (see :class:`~remat.planning.flow.cut.CutResult`)."""
    start = time.perf_counter()
    n = problem.num_nodes
    tails, heads, caps, infinite = merged_edges(problem)
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
        raise_infeasible(problem)
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
    return CutResult(sink_side, int(flow_value), 1, time.perf_counter() - start, "preflow_push")
