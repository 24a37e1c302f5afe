"""Reference answers and checkers for remat's properties (no hypothesis needed).

Plain graphs (the schema of :mod:`remat.core.plain`) are read here independently of
:func:`remat.planning.problem.build_problem`:

:func:`read_graph`
    The forward values of a plain graph with their save costs, which may be saved, which may be
    recomputed, what each one's producer reads, and which ones the backward reads.
:func:`brute_force_min_saved_bytes`
    The minimum total save cost over *all* subsets of forward values that let the backward run (every
    value it reads is saved or recomputable from saved values, parameters and inputs), or ``None`` when
    no subset does.  Exponential: for graphs with a dozen values.
:func:`check_plan`
    Raises ``AssertionError`` unless a :class:`remat.Plan` is valid for a plain graph and its fields
    agree with one another.

Traces:

:func:`graph_source`
    Python source that rebuilds a plain graph, for failure reports and regression tests.
:func:`check_trace_well_formed`
    Raises ``AssertionError`` unless every proxy a trace reads (top level and inside each fusion region)
    is defined before it is read, each region reads only its declared inputs and writes its declared
    outputs, and no top-level name is defined twice.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import networkx as nx

__all__ = [
    "GraphValues",
    "read_graph",
    "is_pinned",
    "available_values",
    "brute_force_min_saved_bytes",
    "check_plan",
    "check_trace_well_formed",
    "graph_source",
]

_NEVER_BY_DEFAULT = {"matmul": "matmul", "attention": "attention", "reduction": "reductions", "rng": "random"}


@dataclass
class GraphValues:
    """The forward values of a plain graph, in a topological order of their producers.

    ``values``: names; ``cost``: save cost; ``producer``: node writing each; ``pinned``: values whose
    producer may not be recomputed; ``unsavable``: values that may not be saved; ``deps``: forward
    values (in ``values``) each value's producer reads; ``needed``: values the backward reads;
    ``flops``: recompute cost of each producer node.
    """

    values: list[str]
    cost: dict[str, int]
    producer: dict[str, Hashable]
    pinned: set[str]
    unsavable: set[str]
    deps: dict[str, set[str]]
    needed: set[str]
    flops: dict[Hashable, int]


def is_pinned(data: dict, policy=None) -> bool:
    """Whether a node's values may not be recomputed, by the schema: an explicit ``recompute``
    decides; else tags matmul/attention/reduction/rng forbid it unless the policy allows that class,
    and ``fusible=False`` forbids it (unless tagged view/matmul/attention, or the policy allows
    non-fusible recomputation)."""
    recompute = data.get("recompute")
    if recompute is not None:
        return recompute == "never"
    tags = set(data.get("tags", ()))
    for tag, flag in _NEVER_BY_DEFAULT.items():
        if tag in tags and not (policy is not None and getattr(policy, flag)):
            return True
    if data.get("fusible", True) is False and not tags & {"view", "matmul", "attention"}:
        return not (policy is not None and policy.non_fusible)
    return False


def _outputs(node: Hashable, data: dict) -> tuple[tuple, tuple[int, ...], tuple[int, ...]]:
    if "outputs" in data:
        outs = tuple(data["outputs"])
        sizes = tuple(int(b) for b in data["output_bytes"]) if "output_bytes" in data else (int(data["bytes"]),)
    else:
        outs, sizes = (node,), (int(data["bytes"]),)
    if "output_costs" in data:
        costs = tuple(int(c) for c in data["output_costs"])
    elif "save_cost" in data and len(outs) == 1:
        costs = (int(data["save_cost"]),)
    else:
        costs = sizes
    return outs, sizes, costs


def read_graph(graph: nx.DiGraph, policy=None) -> GraphValues:
    """Read a (valid) plain graph's forward values; see :class:`GraphValues`."""
    topo = {node: i for i, node in enumerate(nx.topological_sort(graph))}
    values: list[str] = []
    cost: dict[str, int] = {}
    producer: dict[str, Hashable] = {}
    pinned: set[str] = set()
    unsavable: set[str] = set()
    flops: dict[Hashable, int] = {}
    outputs_of = {node: _outputs(node, data)[0] for node, data in graph.nodes(data=True)}
    for node in sorted(graph.nodes, key=topo.__getitem__):
        data = graph.nodes[node]
        if data["phase"] != "forward" or data.get("is_input") or data.get("is_param"):
            continue
        outs, _, costs = _outputs(node, data)
        flops[node] = int(data.get("flops", 0))
        for name, c in zip(outs, costs):
            values.append(name)
            cost[name] = c
            producer[name] = node
            if is_pinned(data, policy):
                pinned.add(name)
            if data.get("savable", True) is False:
                unsavable.add(name)

    def carried(u: Hashable, v: Hashable) -> list[str]:
        names = graph.edges[u, v].get("tensors")
        names = outputs_of[u] if names is None else names
        return [n for n in names if n in producer and producer[n] == u]

    deps = {name: set() for name in values}
    needed: set[str] = set()
    for u, v in graph.edges:
        read = carried(u, v)
        if graph.nodes[v]["phase"] == "backward":
            needed.update(read)
        else:
            for out in outputs_of[v]:
                if out in deps:
                    deps[out].update(read)
    return GraphValues(values, cost, producer, pinned, unsavable, deps, needed, flops)


def available_values(info: GraphValues, saved: set[str]) -> set[str]:
    """Values the backward can have when exactly ``saved`` is kept: saved ones, and unpinned ones whose
    producer reads only available values (parameters and inputs are always available)."""
    available = set()
    for name in info.values:  # topological order
        if name in saved or (name not in info.pinned and info.deps[name] <= available):
            available.add(name)
    return available


def brute_force_min_saved_bytes(graph: nx.DiGraph, policy=None, *, max_values: int = 16) -> int | None:
    """Minimum total save cost of a valid saved set, by enumerating every subset of forward values
    (``None`` when no subset is valid).  Refuses graphs with more than ``max_values`` values."""
    info = read_graph(graph, policy)
    names = info.values
    if len(names) > max_values:
        raise ValueError(f"{len(names)} values: too many to enumerate (max_values={max_values})")
    index = {n: i for i, n in enumerate(names)}
    pinned = [n in info.pinned for n in names]
    deps = [sum(1 << index[d] for d in info.deps[n]) for n in names]
    cost = [info.cost[n] for n in names]
    need = sum(1 << index[n] for n in info.needed)
    unsavable = sum(1 << index[n] for n in info.unsavable)
    best: int | None = None
    for subset in range(1 << len(names)):
        if subset & unsavable:
            continue
        total = sum(c for i, c in enumerate(cost) if subset >> i & 1)
        if best is not None and total >= best:
            continue
        available = subset
        for i in range(len(names)):
            if not available >> i & 1 and not pinned[i] and deps[i] & ~available == 0:
                available |= 1 << i
        if need & ~available == 0:
            best = total
    return best


def check_plan(graph: nx.DiGraph, plan, policy=None) -> None:
    """Assert that ``plan`` (from :func:`remat.solve`) is valid for ``graph``: it saves only savable
    forward values, every value the backward reads is saved or recomputable from saved values,
    parameters and inputs without recomputing a pinned op; ``recomputed_values`` are exactly the read
    values not saved, ``recomputed_ops`` exactly the producers the backward must run again (in a
    topological order), and ``saved_bytes``/``extra_flops`` add up."""
    info = read_graph(graph, policy if policy is not None else plan.recompute)
    saved = set(plan.saved)
    assert len(saved) == len(plan.saved), f"a value is saved twice: {plan.saved}"
    assert saved <= set(info.values), f"saved values that are not forward values: {saved - set(info.values)}"
    assert not saved & info.unsavable, f"saves unsavable values {saved & info.unsavable}"
    available = available_values(info, saved)
    missing = info.needed - available
    assert not missing, f"the backward reads {sorted(missing)}, neither saved nor recomputable"
    assert plan.saved_bytes == sum(info.cost[v] for v in saved), "saved_bytes is not the saved values' cost"
    assert set(plan.recomputed_values) == info.needed - saved, (
        f"recomputed_values {sorted(plan.recomputed_values)} != backward reads not saved {sorted(info.needed - saved)}"
    )
    # The producers the backward must run: walk from the recomputed values through unsaved inputs.
    ops: set[Hashable] = set()
    stack = list(info.needed - saved)
    seen = set(stack)
    while stack:
        value = stack.pop()
        ops.add(info.producer[value])
        for dep in info.deps[value]:
            if dep not in saved and dep not in seen:
                seen.add(dep)
                stack.append(dep)
    assert set(plan.recomputed_ops) == ops, f"recomputed_ops {plan.recomputed_ops} != needed producers {sorted(ops)}"
    assert len(plan.recomputed_ops) == len(ops), "an op is recomputed twice"
    pinned_ops = {info.producer[v] for v in info.pinned}
    assert not ops & pinned_ops, f"recomputes pinned ops {ops & pinned_ops}"
    # extra FLOPs count each recomputation every time it runs: at least each recomputed op once
    assert plan.extra_flops >= sum(info.flops[op] for op in ops)
    position = {op: i for i, op in enumerate(plan.recomputed_ops)}
    for u, v in graph.edges:
        if u in position and v in position:
            assert position[u] < position[v], f"recomputed_ops are not in forward order: {u!r} feeds {v!r}"


def check_trace_well_formed(trace) -> None:
    """Assert that a Thunder trace is in a valid order: every proxy read at the top level is a trace
    argument or written by an earlier bound symbol; inside a fusion region every subsymbol reads only
    the region's inputs or values written by earlier subsymbols, the region's inputs are exactly what it
    reads from outside and its outputs are written inside; no top-level name is written twice."""
    from thunder.core.proxies import Proxy
    from thunder.core.pytree import tree_flatten

    defined = {p.name for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)}
    for index, bsym in enumerate(trace.bound_symbols):
        name = bsym.sym.name
        if name.startswith("unpack_"):  # unpacking the arguments (their proxies are already known)
            for p in bsym.flat_proxy_outs:
                defined.add(p.name)
            continue
        reads = [p.name for p in bsym.flat_proxy_args]
        undefined = [r for r in reads if r not in defined]
        assert not undefined, f"bound symbol {index} ({name}) reads {undefined} before they are defined"
        if bsym.sym.is_fusion:
            inputs = set(reads)
            local = set(inputs)
            read_inside: set[str] = set()
            for sub in bsym.subsymbols:
                sub_reads = [p.name for p in sub.flat_proxy_args]
                bad = [r for r in sub_reads if r not in local]
                assert not bad, f"region {name}: {sub.sym.name} reads {bad}, not region inputs nor written before"
                read_inside.update(r for r in sub_reads if r in inputs)
                local.update(p.name for p in sub.flat_proxy_outs)
            unused = inputs - read_inside
            assert not unused, f"region {name} declares inputs it never reads: {sorted(unused)}"
            outs = [p.name for p in bsym.flat_proxy_outs]
            not_written = [o for o in outs if o not in local or o in inputs]
            assert not not_written, f"region {name} declares outputs it does not write: {not_written}"
        for p in bsym.flat_proxy_outs:
            if p.name in reads:
                continue  # ops that hand back an argument do not define it anew
            assert p.name not in defined, f"bound symbol {index} ({name}) writes {p.name}, already defined"
            defined.add(p.name)


def graph_source(graph: nx.DiGraph) -> str:
    """Python source rebuilding a plain graph (nodes with attributes, edges with attributes), for
    failure reports (``hypothesis.note``) and regression tests."""
    lines = ["g = nx.DiGraph()"]
    for node, data in graph.nodes(data=True):
        attrs = ", ".join(f"{k}={_literal(v)}" for k, v in data.items())
        lines.append(f"g.add_node({node!r}{', ' if attrs else ''}{attrs})")
    for u, v, data in graph.edges(data=True):
        attrs = ", ".join(f"{k}={_literal(val)}" for k, val in data.items())
        lines.append(f"g.add_edge({u!r}, {v!r}{', ' if attrs else ''}{attrs})")
    return "\n".join(lines)


def _literal(value) -> str:
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(repr(v) for v in sorted(value)) + "}" if value else "frozenset()"
    return repr(value)
