"""Plain graphs: a ``networkx.DiGraph`` in the schema of docs/graph-schema.md, adopted as a FusionGraph.

:func:`plain_graph` is the one adapter from a user's (or a benchmark's) networkx graph to the IR, so that
the planner, the memory model and the plan layout apply to graphs that never came from Thunder.

Schema (node attributes; docs/graph-schema.md has the full statement):

``phase`` (required)
    ``"forward"`` or ``"backward"``.
``bytes`` (required unless ``outputs`` is given)
    size of the node's output value.
``outputs`` (optional)
    tuple of value names written by the node; then ``output_bytes`` (tuple, aligned) gives their sizes.
    Default: one value named by the node id.
``save_cost`` / ``output_costs`` (optional)
    cost of keeping the value(s) for the backward; default: the bytes.
``recompute`` (optional)
    ``"allowed"`` or ``"never"``; default from ``tags`` and the :class:`remat.RecomputePolicy`.
``tags`` (optional)
    iterable of strings from :data:`remat.core.ops.TAGS`; ``matmul``, ``attention``, ``rng``,
    ``reduction`` are never recomputed by default; ``in_place``, ``opaque``, ``no_recompute`` never are,
    whatever the policy.
``is_input`` / ``is_param`` (optional)
    the node's values are always available (free, never in the network).
``savable`` (optional, default True)
    False if the value can never be kept for the backward.
``flops`` (optional)
    cost of recomputing the node, used to report extra FLOPs.

Edge ``(u, v)`` means ``v`` reads ``u``'s values; an optional ``tensors`` attribute names which ones.
A graph made by ``FusionGraph.nx`` carries its trace's tensors in ``graph.graph["tensors"]`` and its
forward outputs in ``graph.graph["forward_outputs"]``; save costs then follow the trace's memory model.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import networkx as nx

from remat.core.ir import BACKWARD, FORWARD, FusionGraph, Op, TensorInfo, Unit
from remat.core.memory import tensor_save_cost
from remat.core.ops import TAGS
from remat.errors import GraphError

__all__ = ["plain_graph", "validate_graph", "records_from_nx"]


def _byte_counts(node: Hashable, key: str, raw) -> tuple[int, ...]:
    """``raw`` (one number, or an iterable of numbers for the tuple-valued attributes) as ints; a
    :class:`GraphError` naming the node and attribute when it is not."""
    try:
        return tuple(int(b) for b in raw) if key in ("output_bytes", "output_costs") else (int(raw),)
    except (TypeError, ValueError):
        raise GraphError(f"node {node!r}: {key!r} must hold integer byte counts, got {raw!r}") from None


def _node_outputs(node: Hashable, data: dict) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if "outputs" in data:
        outputs = tuple(data["outputs"])
        if "output_bytes" in data:
            sizes = _byte_counts(node, "output_bytes", data["output_bytes"])
        elif len(outputs) == 1 and "bytes" in data:
            sizes = _byte_counts(node, "bytes", data["bytes"])
        else:
            raise GraphError(f"node {node!r} lists outputs {outputs} but no 'output_bytes'")
        if len(sizes) != len(outputs):
            raise GraphError(f"node {node!r}: 'output_bytes' has {len(sizes)} entries for {len(outputs)} outputs")
        return outputs, sizes
    if "bytes" not in data:
        raise GraphError(f"node {node!r} has no 'bytes' attribute (size of its output)")
    return (node,), _byte_counts(node, "bytes", data["bytes"])


def validate_graph(graph: nx.DiGraph) -> None:
    """Raise :class:`GraphError` for graphs the planner cannot take (see the module docstring)."""
    if not isinstance(graph, nx.DiGraph):
        raise GraphError(f"expected a networkx.DiGraph, got {type(graph).__name__}")
    if graph.number_of_nodes() == 0:
        raise GraphError("the graph is empty")
    if isinstance(graph, nx.MultiDiGraph):
        raise GraphError("multigraphs are not supported; put several values on one edge with 'tensors'")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise GraphError(f"the graph has a cycle: {cycle}")
    for node, data in graph.nodes(data=True):
        phase = data.get("phase")
        if phase not in ("forward", "backward"):
            raise GraphError(f"node {node!r}: 'phase' must be 'forward' or 'backward', got {phase!r}")
        unknown = set(data.get("tags", ())) - TAGS
        if unknown and data.get("recompute") is None:
            raise GraphError(
                f"node {node!r} has tags {sorted(unknown)} the solver does not know; "
                f"known tags: {sorted(TAGS)} (or set recompute='allowed'/'never')"
            )
        recompute = data.get("recompute")
        if recompute not in (None, "allowed", "never"):
            raise GraphError(f"node {node!r}: 'recompute' must be 'allowed' or 'never', got {recompute!r}")
    for u, v in graph.edges:
        if graph.nodes[u]["phase"] == "backward" and graph.nodes[v]["phase"] == "forward":
            raise GraphError(f"forward node {v!r} reads backward node {u!r}")


def _forward_order(graph: nx.DiGraph) -> list[Hashable]:
    position = {node: i for i, node in enumerate(graph)}
    if all(position[u] < position[v] for u, v in graph.edges):
        return list(position)
    try:
        return list(nx.lexicographical_topological_sort(graph, key=position.__getitem__))
    except nx.NetworkXUnfeasible:  # a cycle: only reachable with validate=False
        return list(position)


def records_from_nx(graph: nx.DiGraph) -> list[Op]:
    """Operation records of a plain graph (the same records a FusionGraph keeps), in a topological
    order: the graph's node order when that is one, else the topological order closest to it (the
    plan's "forward order" of recomputed ops follows it)."""
    outputs_of: dict[Hashable, tuple[str, ...]] = {}
    records = []
    for node in _forward_order(graph):
        data = graph.nodes[node]
        outputs, sizes = _node_outputs(node, data)
        outputs_of[node] = outputs
        costs = data.get("output_costs")
        if costs is not None:
            costs = _byte_counts(node, "output_costs", costs)
        elif "save_cost" in data and len(outputs) == 1:
            costs = _byte_counts(node, "save_cost", data["save_cost"])
        inputs: list[str] = []
        input_nodes: list[Hashable] = []
        for pred in graph.predecessors(node):
            carried = graph.edges[pred, node].get("tensors")
            for name in carried if carried is not None else _node_outputs(pred, graph.nodes[pred])[0]:
                inputs.append(name)
                input_nodes.append(pred)
        records.append(
            Op(
                id=node,
                kind=data.get("kind", ""),
                unit=data.get("unit", -1),
                region=data.get("region"),
                phase=data["phase"],
                inputs=tuple(inputs),
                input_nodes=tuple(input_nodes),
                outputs=outputs,
                output_bytes=sizes,
                flops=int(data.get("flops", 0)),
                tags=frozenset(data.get("tags", ())),
                fusible=data.get("fusible", True),
                is_input=bool(data.get("is_input", False)),
                is_param=bool(data.get("is_param", False)),
                recompute=data.get("recompute"),
                savable=data.get("savable", True) is not False,
                output_costs=tuple(int(c) for c in costs) if costs is not None else None,
            )
        )
    return records


def plain_graph(graph: nx.DiGraph) -> tuple[FusionGraph, list[Hashable]]:
    """The :class:`FusionGraph` of a plain graph (validated; :class:`remat.GraphError` when malformed),
    and the list mapping its op ids back to the graph's nodes.

    One unit per node (forward nodes, then backward nodes, in topological order), one value per output;
    backward values nobody reads are gradients, held to the end of the step like a trace's return;
    ``graph.graph["forward_outputs"]`` (optional) names values the forward returns.  Op ids are
    positions.  Save costs are the graph's (``save_cost``/``output_costs``, else the bytes; for a
    ``FusionGraph.nx`` the trace's memory model)."""
    validate_graph(graph)
    records = records_from_nx(graph)
    order = sorted(range(len(records)), key=lambda i: (records[i].phase != FORWARD, i))
    node_ids = [records[i].id for i in order]
    position = {node: k for k, node in enumerate(node_ids)}
    trace_tensors: Mapping | None = graph.graph.get("tensors")
    forward_outputs = tuple(graph.graph.get("forward_outputs", ()))
    ops: list[Op] = []
    units: list[Unit] = []
    tensors: dict[Hashable, TensorInfo] = {}
    save_costs: dict[Hashable, int] = {}
    read: set[Hashable] = set()
    for k, i in enumerate(order):
        record = records[i]
        op = record._replace(id=k, unit=k, input_nodes=tuple(position[n] for n in record.input_nodes))
        ops.append(op)
        read.update(op.inputs)
        kind = "input" if (op.is_input or op.is_param) else "op"
        units.append(Unit(k, str(node_ids[k]), kind, op.phase, () if kind == "input" else op.inputs, op.outputs, (k,), op.flops, op.tags))
        value_kind = "param" if op.is_param else "input" if op.is_input else "activation"
        for j, (name, nbytes) in enumerate(zip(op.outputs, op.output_bytes)):
            if nbytes < 0:
                raise GraphError(f"node {node_ids[k]!r}: negative size for value {name!r}")
            tensors[name] = TensorInfo(name, (), "bytes", nbytes, value_kind, k, k, op.phase)
            if op.output_costs is not None:
                cost = op.output_costs[j]
            elif trace_tensors is not None:
                cost = tensor_save_cost(name, trace_tensors, forward_outputs)
            else:
                cost = nbytes
            if cost < 0:
                raise GraphError(f"node {node_ids[k]!r}: negative size for value {name!r}")
            save_costs[name] = cost
    gradients = tuple(name for op in ops if op.phase == BACKWARD for name in op.outputs if name not in read)
    units.append(Unit(len(units), "return", "return", BACKWARD, forward_outputs + gradients, (), (), 0))
    fusion_graph = FusionGraph(
        units, tensors, ops, forward_outputs=forward_outputs, gradients=gradients, is_joint=True, save_costs=save_costs
    )
    return fusion_graph, node_ids
