"""An exact reference for small plain graphs: the lowest peak any plan can reach for a recompute budget.

:func:`milp_min_peak` solves a mixed-integer program (``scipy.optimize.milp``, HiGHS) in the spirit of
Checkmate (Jain et al., 2020), written for remat's plan space and memory model so that the two are
directly comparable:

* forward ops run once, in order; a forward value is kept for the backward (``s[v] = 1``) or not;
* before each backward op ``c`` a region may recompute forward ops (``x[c, u] = 1``): every forward value
  ``c`` reads is saved or recomputed there, and a recomputed op's forward inputs are saved or recomputed
  there too; pinned ops (by the recompute policy) are never recomputed;
* a forward op that neither the forward nor the saved set needs is not run (``r[v]``, it is dropped);
* memory, step by step as in :mod:`remat.core.memory`: forward values live from their op to their last reader
  (for saved values: the last backward reader, or recompute region, that reads them); a recompute region
  allocates fresh copies of what its backward op reads, alive through that op; backward values live as
  their readers say; gradients and forward outputs are held to the end;
* minimize the peak subject to ``sum(flops[u] * x[c, u]) <= flops budget``.

Every remat plan is a feasible point of this program (its ``s`` and its per-consumer recomputation), so
the program's optimum is a lower bound of remat's peak at the same recompute FLOPs, exact for the space.
Nodes must have one output each.  Sizes are scaled to MiB-like units internally for the solver's
numerics; the returned peak is in bytes.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_array

from remat.core.plain import plain_graph
from remat.core.policies import RecomputePolicy
from remat.errors import GraphError

__all__ = ["MilpResult", "milp_min_peak"]


@dataclass(frozen=True)
class MilpResult:
    """``peak_bytes``: the optimal peak; ``saved``: values kept; ``recompute``: (backward node, forward
    node) pairs recomputed; ``status``: HiGHS's message; ``optimal``: proven optimal (not a time-out)."""

    peak_bytes: float
    saved: tuple[Hashable, ...]
    recompute: tuple[tuple[Hashable, Hashable], ...]
    extra_flops: float
    optimal: bool
    status: str
    timeline: tuple[float, ...] = ()


def milp_min_peak(
    graph: nx.DiGraph,
    flops_budget: float,
    *,
    recompute: RecomputePolicy | None = None,
    time_limit: float = 60.0,
    fix_plan=None,
) -> MilpResult:
    """The minimum estimated peak of ``graph`` (plain schema, single-output nodes) when at most
    ``flops_budget`` FLOPs are recomputed (see the module docstring).  ``fix_plan`` (a
    :class:`remat.Plan` of this graph) pins the saved set to that plan's, to evaluate it in the same
    model."""
    policy = recompute or RecomputePolicy()
    fg, node_ids = plain_graph(graph)
    ops = fg.ops
    if any(len(op.outputs) != 1 for op in ops):
        raise GraphError("milp_min_peak needs nodes with exactly one output each")
    value_of = [op.outputs[0] for op in ops]
    held = set(fg.forward_outputs) | set(fg.gradients)
    forward = [k for k, op in enumerate(ops) if op.phase == "forward" and not (op.is_input or op.is_param)]
    backward = [k for k, op in enumerate(ops) if op.phase == "backward"]
    fwd_set = set(forward)

    def pinned(op) -> bool:
        if op.recompute is not None:
            return op.recompute == "never"
        return not policy.allows(op.tags, op.fusible)

    # Timeline: forward ops in order, then for each backward op its recompute region and itself.
    step_of_forward = {k: i for i, k in enumerate(forward)}
    step = len(forward)
    region_step, op_step = {}, {}
    for c in backward:
        region_step[c] = step
        op_step[c] = step + 1
        step += 2
    end = step  # held values live through the end
    steps = end

    # Variables: P, s[v], r[v], x[c,u], a[v,t]
    index: dict[tuple, int] = {}

    def var(key) -> int:
        if key not in index:
            index[key] = len(index)
        return index[key]

    var(("P",))
    for k in forward:
        var(("s", k))
        var(("r", k))
    readers: dict[int, list[int]] = {k: [] for k in range(len(ops))}
    for k, op in enumerate(ops):
        for name, src in zip(op.inputs, op.input_nodes):
            readers[src].append(k)
    for c in backward:
        for u in forward:
            if not pinned(ops[u]):
                var(("x", c, u))
    for k in forward:
        for t in range(steps):
            var(("a", k, t))
    n = len(index)
    integrality = np.zeros(n)
    lower = np.zeros(n)
    upper = np.ones(n)
    upper[index[("P",)]] = np.inf
    for key, i in index.items():
        if key[0] in ("s", "r", "x"):
            integrality[i] = 1
    scale = max(max((b for op in ops for b in op.output_bytes), default=1), 1) / 1000.0
    size = {k: ops[k].output_bytes[0] / scale for k in range(len(ops))}

    rows: list[tuple[dict[int, float], float, float]] = []  # (coefficients, low, high)

    def add(coefs: dict[int, float], low: float, high: float) -> None:
        rows.append((coefs, low, high))

    # held forward values (forward outputs) count as saved; inputs/params are free and not modelled
    for k in forward:
        if value_of[k] in held:
            lower[index[("s", k)]] = 1
    # run-in-forward: r[v] >= s[v]; r[v] >= r[w] for forward readers w; r = 1 if held or read by a held op
    for k in forward:
        add({index[("r", k)]: 1, index[("s", k)]: -1}, 0, np.inf)
        for w in readers[k]:
            if w in fwd_set:
                add({index[("r", k)]: 1, index[("r", w)]: -1}, 0, np.inf)
    # availability for each backward op c: each forward value it reads is saved or recomputed at c
    for c in backward:
        for name, src in zip(ops[c].inputs, ops[c].input_nodes):
            if src not in fwd_set:
                continue
            coefs = {index[("s", src)]: 1}
            if ("x", c, src) in index:
                coefs[index[("x", c, src)]] = 1
            add(coefs, 1, np.inf)
        for u in forward:
            if ("x", c, u) not in index:
                continue
            for name, src in zip(ops[u].inputs, ops[u].input_nodes):
                if src not in fwd_set:
                    continue
                coefs = {index[("s", src)]: 1, index[("x", c, u)]: -1}
                if ("x", c, src) in index:
                    coefs[index[("x", c, src)]] = 1
                add(coefs, 0, np.inf)
    # recompute FLOPs budget
    flops_row = {index[key]: float(ops[key[2]].flops) for key in index if key[0] == "x"}
    if flops_row:
        add(flops_row, -np.inf, float(flops_budget))

    # liveness of forward values a[v, t]
    for k in forward:
        produced = step_of_forward[k]
        for t in range(steps):
            ia = index[("a", k, t)]
            if t < produced:
                upper[ia] = 0
                continue
            if t == produced:
                add({ia: 1, index[("r", k)]: -1}, 0, np.inf)  # alive where it is made, if it is made
            # read by a forward op w at step t' >= t: alive if w runs
            for w in readers[k]:
                if w in fwd_set and step_of_forward[w] >= t:
                    add({ia: 1, index[("r", w)]: -1}, 0, np.inf)
            if value_of[k] in held:
                lower[ia] = 1
                continue
            # saved: alive from production to the end of the forward, and to its last backward reader
            if t <= len(forward) - 1:
                add({ia: 1, index[("s", k)]: -1}, 0, np.inf)
            for c in readers[k]:
                if c in fwd_set:
                    continue
                if t <= op_step[c]:
                    add({ia: 1, index[("s", k)]: -1}, 0, np.inf)
            for c in backward:
                if t > region_step[c]:
                    continue
                for u in forward:
                    if ("x", c, u) in index and k in ops[u].input_nodes:
                        # read by c's recompute region when u is recomputed there and k is saved
                        add({ia: 1, index[("x", c, u)]: -1, index[("s", k)]: -1}, -1, np.inf)

    # constant liveness of backward values (and inputs are not counted)
    const = np.zeros(steps)
    for c in backward:
        value = value_of[c]
        start = op_step[c]
        last = start
        for w in readers[c]:
            last = max(last, op_step.get(w, last), region_step.get(w, last))
        if value in held:
            last = steps - 1
        const[start : last + 1] += size[c]

    # peak: P >= const[t] + sum a[v,t] size + recompute copies at region/op steps
    P = index[("P",)]
    for t in range(steps):
        coefs = {P: 1.0}
        for k in forward:
            coefs[index[("a", k, t)]] = -size[k]
        low = const[t]
        for c in backward:
            if t in (region_step[c], op_step[c]):
                for name, src in zip(ops[c].inputs, ops[c].input_nodes):
                    if src in fwd_set and value_of[src] not in held:
                        # fresh copy of a recomputed read: size * (1 - s)
                        coefs[index[("s", src)]] = coefs.get(index[("s", src)], 0.0) + size[src]
                        low += size[src]
        add(coefs, low, np.inf)

    if fix_plan is not None:
        kept = set(fix_plan.saved)
        for k in forward:
            i = index[("s", k)]
            lower[i] = upper[i] = 1.0 if value_of[k] in kept or value_of[k] in held else 0.0

    matrix = lil_array((len(rows), n))
    lows, highs = np.empty(len(rows)), np.empty(len(rows))
    for i, (coefs, low, high) in enumerate(rows):
        for j, value in coefs.items():
            matrix[i, j] = value
        lows[i], highs[i] = low, high
    objective = np.zeros(n)
    objective[P] = 1.0
    result = milp(
        objective,
        integrality=integrality,
        bounds=Bounds(lower, upper),
        constraints=LinearConstraint(matrix.tocsr(), lows, highs),
        options={"time_limit": time_limit, "disp": False},
    )
    if result.x is None:
        raise GraphError(f"the MILP found no solution: {result.message}")
    x = result.x
    loads = []
    for coefs, low, _ in rows[-steps:]:  # the peak rows: P - sum(...) >= low
        load = low - sum(value * x[j] for j, value in coefs.items() if j != P)
        loads.append(load * scale)
    saved = tuple(node_ids[k] for k in forward if x[index[("s", k)]] > 0.5)
    recompute = tuple((node_ids[c], node_ids[u]) for key, i in index.items() if key[0] == "x" and x[i] > 0.5 for c, u in [key[1:]])
    extra = sum(ops[key[2]].flops for key, i in index.items() if key[0] == "x" and x[i] > 0.5)
    return MilpResult(float(x[P]) * scale, saved, recompute, float(extra), result.status == 0, str(result.message), tuple(loads))
