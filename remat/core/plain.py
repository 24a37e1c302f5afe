"""Plain graphs: a ``networkx.DiGraph`` in the schema of docs/graph-schema.md, adopted as a FusionGraph.

:func:`plain_graph` is the one adapter from a user's (or a benchmark's) networkx graph to the IR, so that
the planner, the memory model and the plan layout apply to graphs that never came from Thunder.

Schema (node attributes; docs/graph-schema.md has the full statement).  Every rule below is checked by
:func:`validate_graph`, which raises :class:`remat.GraphError` naming the node or edge.  Counts (sizes,
costs, FLOPs) are finite, non-negative whole numbers: ints (numpy's too), or floats with a whole value
such as ``400.0`` (exact, as a file reader or arithmetic may give them); strings, bools and fractional
floats are refused, never rounded.  A graph's byte counts, and its FLOPs, add up to less than
:data:`MAX_TOTAL` (the planner's sums are 64-bit).

``phase`` (required)
    ``"forward"`` or ``"backward"``.
``bytes`` (required unless ``outputs`` is given)
    size of the node's output value (a count); with ``outputs`` and ``output_bytes``, their sum if given.
``outputs`` (optional)
    tuple or list of value names written by the node (distinct, not None; no value is written by two
    nodes); then ``output_bytes`` (tuple or list of counts, aligned) gives their sizes.
    Default: one value named by the node id.
``save_cost`` / ``output_costs`` (optional, not both)
    cost of keeping the value(s) for the backward (counts; ``save_cost`` for a single-output node,
    ``output_costs`` aligned with ``outputs``); default: the bytes.
``recompute`` (optional)
    ``"allowed"`` or ``"never"``; default from ``tags`` and the :class:`remat.RecomputePolicy`.
``tags`` (optional)
    a set, tuple or list of strings from :data:`remat.core.ops.TAGS` (others only with ``recompute``);
    ``matmul``, ``attention``, ``rng``, ``reduction`` are never recomputed by default; ``in_place``,
    ``opaque``, ``no_recompute`` never are, whatever the policy.
``is_input`` / ``is_param`` (optional, True or False)
    the node's values are always available (free, never in the network).
``savable`` (optional, True or False, default True)
    False if the value can never be kept for the backward.
``fusible`` (optional, True or False, default True)
    False for an op that cannot join a fusion region.
``flops`` (optional)
    cost of recomputing the node (a count), used to report extra FLOPs.
``kind`` (a string), ``unit`` (an int), ``region`` (a string or None) (optional)
    carried into the op records; not used by the solver.

Edge ``(u, v)`` means ``v`` reads ``u``'s values; an optional ``tensors`` attribute (a non-empty tuple,
list or set) names which ones, each a value ``u`` writes.  A forward node never reads a backward node.
A graph made by ``FusionGraph.nx`` carries its trace's tensors in ``graph.graph["tensors"]`` (a mapping)
and its forward outputs in ``graph.graph["forward_outputs"]`` (a tuple or list of values forward nodes
write); save costs then follow the trace's memory model.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping

import networkx as nx

from remat.core.ir import BACKWARD, FORWARD, FusionGraph, Op, TensorInfo, Unit
from remat.core.memory import held_storage, tensor_save_cost
from remat.core.ops import TAGS
from remat.errors import GraphError

__all__ = ["plain_graph", "validate_graph", "records_from_nx", "MAX_TOTAL"]


# Collections accepted where order matters (aligned with ``outputs``) and where it does not.
_SEQUENCES = (tuple, list)
_COLLECTIONS = (tuple, list, set, frozenset)
#: Bound on a graph's total bytes and total FLOPs: the planner sums them in 64-bit integers.
MAX_TOTAL = 2**62
_COUNT_RULE = "an int, or a float with a whole value such as 400.0"


def _count(where: str, key: str, value: object, what: str) -> int:
    """``value`` as a non-negative int; a :class:`GraphError` naming ``where`` and ``key`` when it is not a
    whole, finite, non-negative number.  Floats with a whole value (400.0, from arithmetic or a file
    reader) are exact and accepted; strings, bools and fractional floats are refused, never rounded."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        reason = f"got {type(value).__name__} {value!r}"
    elif not isinstance(value, numbers.Integral) and not math.isfinite(value):  # ints: any size is fine
        reason = f"got {value!r}, which is not finite"
    elif not isinstance(value, numbers.Integral) and not float(value).is_integer():
        reason = f"got {value!r}, which is not a whole number"
    else:
        count = int(value)
        if count < 0:
            noun = "size" if what == "byte count" else what
            raise GraphError(f"{where}: negative {noun} {value!r} in {key!r}")
        return count
    raise GraphError(f"{where}: {key!r} must hold integer {what}s ({_COUNT_RULE}), {reason}")


def _counts(where: str, key: str, value: object, what: str) -> tuple[int, ...]:
    """A tuple-valued count attribute (``output_bytes``, ``output_costs``) as ints."""
    if not isinstance(value, _SEQUENCES):
        raise GraphError(
            f"{where}: {key!r} must hold integer {what}s in a tuple or list aligned with 'outputs', "
            f"got {type(value).__name__} {value!r}"
        )
    return tuple(_count(where, f"{key}[{i}]", item, what) for i, item in enumerate(value))


def _check_bool(where: str, data: dict, key: str) -> None:
    if key in data and not isinstance(data[key], bool):
        raise GraphError(f"{where}: {key!r} must be True or False, got {type(data[key]).__name__} {data[key]!r}")


def _node_outputs(node: Hashable, data: dict) -> tuple[tuple[Hashable, ...], tuple[int, ...]]:
    """The values a node writes and their sizes: a :class:`GraphError` naming the node when the
    ``bytes`` / ``outputs`` / ``output_bytes`` attributes are missing, malformed or disagree."""
    where = f"node {node!r}"
    if "outputs" not in data:
        if "bytes" not in data:
            raise GraphError(f"{where} has no 'bytes' attribute (size of its output)")
        if "output_bytes" in data:
            raise GraphError(f"{where} has 'output_bytes' but no 'outputs' (the values they are the sizes of)")
        return (node,), (_count(where, "bytes", data["bytes"], "byte count"),)
    outputs = data["outputs"]
    if not isinstance(outputs, _SEQUENCES):
        raise GraphError(f"{where}: 'outputs' must be a tuple or list of value names, got {type(outputs).__name__} {outputs!r}")
    outputs = tuple(outputs)
    for name in outputs:
        if name is None or not isinstance(name, Hashable):
            raise GraphError(f"{where}: 'outputs' holds {name!r}, which cannot name a value")
    if len(set(outputs)) != len(outputs):
        raise GraphError(f"{where}: 'outputs' names a value twice: {outputs}")
    total = _count(where, "bytes", data["bytes"], "byte count") if "bytes" in data else None
    if "output_bytes" in data:
        sizes = _counts(where, "output_bytes", data["output_bytes"], "byte count")
        if len(sizes) != len(outputs):
            raise GraphError(f"{where}: 'output_bytes' has {len(sizes)} entries for {len(outputs)} outputs")
        if total is not None and total != sum(sizes):
            raise GraphError(
                f"{where}: 'bytes' ({total}) is not the sum of 'output_bytes' {sizes}; give one of them, or both agreeing"
            )
    elif len(outputs) == 1 and total is not None:
        sizes = (total,)
    else:
        raise GraphError(f"{where} lists outputs {outputs} but no 'output_bytes'")
    return outputs, sizes


def _check_node(node: Hashable, data: dict) -> tuple[tuple[Hashable, ...], int, int]:
    """Every attribute of one node (the module docstring); returns the values it writes, the sum of its
    byte counts (sizes and save costs) and its FLOPs."""
    where = f"node {node!r}"
    phase = data.get("phase")
    if phase not in ("forward", "backward"):
        raise GraphError(f"{where}: 'phase' must be 'forward' or 'backward', got {phase!r}")
    outputs, sizes = _node_outputs(node, data)
    byte_total, flops = sum(sizes), 0
    recompute = data.get("recompute")
    if recompute not in (None, "allowed", "never"):
        raise GraphError(f"{where}: 'recompute' must be 'allowed' or 'never', got {recompute!r}")
    tags = data.get("tags", ())
    if not isinstance(tags, _COLLECTIONS) or not all(isinstance(tag, str) for tag in tags):
        raise GraphError(f"{where}: 'tags' must be a set, tuple or list of strings, got {type(tags).__name__} {tags!r}")
    unknown = set(tags) - TAGS
    if unknown and recompute is None:
        raise GraphError(
            f"{where} has tags {sorted(unknown)} the solver does not know; "
            f"known tags: {sorted(TAGS)} (or set recompute='allowed'/'never')"
        )
    for key in ("is_input", "is_param", "savable", "fusible"):
        _check_bool(where, data, key)
    if "save_cost" in data:
        if "output_costs" in data:
            raise GraphError(f"{where} has both 'save_cost' and 'output_costs'; give one")
        if len(outputs) != 1:
            raise GraphError(f"{where} writes {len(outputs)} values: give their save costs as 'output_costs', not 'save_cost'")
        byte_total += _count(where, "save_cost", data["save_cost"], "byte count")
    if "output_costs" in data:
        costs = _counts(where, "output_costs", data["output_costs"], "byte count")
        if len(costs) != len(outputs):
            raise GraphError(f"{where}: 'output_costs' has {len(costs)} entries for {len(outputs)} outputs")
        byte_total += sum(costs)
    if "flops" in data:
        flops = _count(where, "flops", data["flops"], "FLOP count")
    if "kind" in data and not isinstance(data["kind"], str):
        raise GraphError(f"{where}: 'kind' must be a string, got {type(data['kind']).__name__} {data['kind']!r}")
    if "region" in data and data["region"] is not None and not isinstance(data["region"], str):
        raise GraphError(f"{where}: 'region' must be a string or None, got {type(data['region']).__name__} {data['region']!r}")
    if "unit" in data and (isinstance(data["unit"], bool) or not isinstance(data["unit"], numbers.Integral)):
        raise GraphError(f"{where}: 'unit' must be an int, got {type(data['unit']).__name__} {data['unit']!r}")
    return outputs, byte_total, flops


def validate_graph(graph: nx.DiGraph) -> None:
    """Raise :class:`GraphError`, naming the node or edge, for graphs the planner cannot take: every rule
    of the schema (the module docstring, docs/graph-schema.md) is checked here and nowhere else."""
    if not isinstance(graph, nx.DiGraph):
        raise GraphError(f"expected a networkx.DiGraph, got {type(graph).__name__}")
    if graph.number_of_nodes() == 0:
        raise GraphError("the graph is empty")
    if isinstance(graph, nx.MultiDiGraph):
        raise GraphError("multigraphs are not supported; put several values on one edge with 'tensors'")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise GraphError(f"the graph has a cycle: {cycle}")
    writer: dict[Hashable, Hashable] = {}  # value name -> the node writing it
    byte_total = flop_total = 0
    for node, data in graph.nodes(data=True):
        outputs, node_bytes, node_flops = _check_node(node, data)
        for name in outputs:
            if name in writer:
                raise GraphError(f"value {name!r} is written by two nodes, {writer[name]!r} and {node!r}")
            writer[name] = node
        byte_total += node_bytes
        flop_total += node_flops
    for total, what in ((byte_total, "byte counts (sizes and save costs)"), (flop_total, "FLOP counts")):
        if total >= MAX_TOTAL:
            # the flow network and the memory model hold capacities and sums in 64-bit integers (numpy)
            raise GraphError(f"the graph's {what} add up to {total}, more than remat's 64-bit arithmetic holds (2**62)")
    for u, v, data in graph.edges(data=True):
        if graph.nodes[u]["phase"] == "backward" and graph.nodes[v]["phase"] == "forward":
            raise GraphError(f"forward node {v!r} reads backward node {u!r}")
        if "tensors" in data:
            _check_edge_tensors(u, v, data["tensors"], writer)
    _check_graph_attributes(graph, writer)


def _check_edge_tensors(u: Hashable, v: Hashable, tensors: object, writer: Mapping[Hashable, Hashable]) -> None:
    where = f"edge {u!r} -> {v!r}"
    if not isinstance(tensors, _COLLECTIONS):
        raise GraphError(f"{where}: 'tensors' must be a tuple, list or set of value names, got {type(tensors).__name__} {tensors!r}")
    if not tensors:
        # the edge would carry nothing: the planner would drop it without a word
        raise GraphError(f"{where}: 'tensors' is empty; name the values {v!r} reads from {u!r}, or remove the edge")
    for name in tensors:
        source = writer.get(name) if isinstance(name, Hashable) else None
        if source != u:
            made_by = f"node {source!r} writes it" if source is not None else "no node writes it"
            raise GraphError(f"{where}: 'tensors' names {name!r}, which {u!r} does not write ({made_by})")


def _check_graph_attributes(graph: nx.DiGraph, writer: Mapping[Hashable, Hashable]) -> None:
    tensors = graph.graph.get("tensors")
    if tensors is not None and not isinstance(tensors, Mapping):
        raise GraphError(f"graph.graph['tensors'] must map value names to remat.TensorInfo, got {type(tensors).__name__}")
    forward_outputs = graph.graph.get("forward_outputs", ())
    if not isinstance(forward_outputs, _SEQUENCES):
        raise GraphError(
            f"graph.graph['forward_outputs'] must be a tuple or list of value names, got {type(forward_outputs).__name__} {forward_outputs!r}"
        )
    for name in forward_outputs:
        if not isinstance(name, Hashable) or name not in writer:
            raise GraphError(f"graph.graph['forward_outputs'] names {name!r}, which no node writes")
        if graph.nodes[writer[name]]["phase"] != "forward":
            raise GraphError(f"graph.graph['forward_outputs'] names {name!r}, written by backward node {writer[name]!r}")


def _forward_order(graph: nx.DiGraph) -> list[Hashable]:
    position = {node: i for i, node in enumerate(graph)}
    if all(position[u] < position[v] for u, v in graph.edges):
        return list(position)
    try:
        return list(nx.lexicographical_topological_sort(graph, key=position.__getitem__))
    except nx.NetworkXUnfeasible:  # a cycle: validate_graph refuses it first
        return list(position)


def records_from_nx(graph: nx.DiGraph) -> list[Op]:
    """Operation records of a plain graph (the same records a FusionGraph keeps), in a topological
    order: the graph's node order when that is one, else the topological order closest to it (the
    plan's "forward order" of recomputed ops follows it).  The graph is validated first
    (:func:`validate_graph`), so the conversions below are exact."""
    validate_graph(graph)
    outputs_of: dict[Hashable, tuple[Hashable, ...]] = {}
    records = []
    for node in _forward_order(graph):
        data = graph.nodes[node]
        outputs, sizes = _node_outputs(node, data)
        outputs_of[node] = outputs
        if "output_costs" in data:
            costs: tuple[int, ...] | None = tuple(int(c) for c in data["output_costs"])
        elif "save_cost" in data:
            costs = (int(data["save_cost"]),)
        else:
            costs = None
        inputs: list[Hashable] = []
        input_nodes: list[Hashable] = []
        for pred in graph.predecessors(node):
            carried = graph.edges[pred, node].get("tensors")
            for name in carried if carried is not None else outputs_of[pred]:
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
                is_input=data.get("is_input", False),
                is_param=data.get("is_param", False),
                recompute=data.get("recompute"),
                savable=data.get("savable", True),
                output_costs=costs,
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
    records = records_from_nx(graph)  # validates
    order = sorted(range(len(records)), key=lambda i: (records[i].phase != FORWARD, i))
    node_ids = [records[i].id for i in order]
    position = {node: k for k, node in enumerate(node_ids)}
    trace_tensors: Mapping | None = graph.graph.get("tensors")
    forward_outputs = tuple(graph.graph.get("forward_outputs", ()))
    held = held_storage(trace_tensors, forward_outputs) if trace_tensors is not None else frozenset()
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
            tensors[name] = TensorInfo(name, (), "bytes", nbytes, value_kind, k, k, op.phase)
            if op.output_costs is not None:
                cost = op.output_costs[j]
            elif trace_tensors is not None:
                cost = tensor_save_cost(name, trace_tensors, held)
            else:
                cost = nbytes
            save_costs[name] = cost
    gradients = tuple(name for op in ops if op.phase == BACKWARD for name in op.outputs if name not in read)
    units.append(Unit(len(units), "return", "return", BACKWARD, forward_outputs + gradients, (), (), 0))
    fusion_graph = FusionGraph(
        units, tensors, ops, forward_outputs=forward_outputs, gradients=gradients, is_joint=True, save_costs=save_costs
    )
    return fusion_graph, node_ids
