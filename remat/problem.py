"""Stage 3, *problem*: one flow network over the whole forward part of a training graph.

:func:`build_problem` turns a producer/consumer graph (a :class:`remat.FusionGraph`'s ``.nx``, or any plain
``networkx.DiGraph`` following the schema below) into a :class:`FlowProblem`: a capacitated network whose
minimum s-t cut is the cheapest set of forward values to save so that everything the backward reads is
either saved or recomputable from saved values, parameters and inputs.

Construction (the classical split-node formulation, over the *whole* forward at once):

* every forward value ``t`` (an output of a forward op) becomes two nodes ``in(t) -> out(t)`` joined by an
  edge of capacity ``save_cost(t)``: its bytes, or 0 when keeping it costs nothing extra (a forward output,
  which the caller holds anyway; a view of a parameter or input; a number);
* an op that reads ``s`` and writes ``t`` adds ``out(s) -> in(t)`` with infinite capacity (to have ``t`` in
  the backward without saving it, its inputs must be there);
* values of ops that must not be recomputed are pinned to the source: ``SOURCE -> in(t)``, infinite;
* a forward value read by a backward op is pinned to the sink: ``out(t) -> SINK``, infinite;
* parameters and inputs are always available and are left out of the network.

A value whose split edge is cut is *saved*; a forward op whose value sits wholly on the sink side and is
needed by the backward is *recomputed* there.

Plain-graph schema (documented in docs/graph-schema.md):

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
    ``"allowed"`` or ``"never"``; default from ``tags`` and the :class:`RecomputePolicy`.
``tags`` (optional)
    iterable of strings; ``matmul``, ``attention``, ``rng``, ``reduction`` are never recomputed by default;
    ``in_place``, ``opaque``, ``no_recompute`` never are, whatever the policy.
``is_input`` / ``is_param`` (optional)
    the node's values are always available (free, never in the network).
``savable`` (optional, default True)
    False if the value can never be kept for the backward.
``flops`` (optional)
    cost of recomputing the node, used to report extra FLOPs.

Edge ``(u, v)`` means ``v`` reads ``u``'s values; an optional ``tensors`` attribute names which ones.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from remat.errors import GraphError
from remat.graph import FusionGraph, Op
from remat.ops import NEVER_RECOMPUTE_TAGS, mutation_hazards

__all__ = [
    "RecomputePolicy",
    "FlowProblem",
    "build_problem",
    "mutation_hazard_ops",
    "plain_fusion_graph",
    "SOURCE",
    "SINK",
    "INFINITE",
]

SOURCE = 0
SINK = 1
#: Marker for infinite capacity in :attr:`FlowProblem.capacities` (solvers map it to their own infinity).
INFINITE = -1

KNOWN_TAGS = frozenset(
    {"matmul", "attention", "reduction", "rng", "rng_stateless", "view", "shape", "in_place", "mutates", "opaque", "no_recompute"}
)


@dataclass(frozen=True)
class RecomputePolicy:
    """What the solver may recompute in the backward.  A value you pass, not a global setting.

    ``matmul`` / ``attention``: allow recomputing matmuls, linears and attention kernels.
    ``reductions``: allow recomputing reductions (norm statistics, sums; they shrink their input, so
    saving their output is cheap anyway).  ``random``: allow recomputing *stateful* random ops; never
    safe, kept for experiments only (stateless ``uniform_philox`` is always recomputable: it reproduces the
    same numbers).  ``non_fusible``: allow recomputing ops that cannot join a fusion region (they would
    run as stand-alone kernels in the backward).  Whatever the policy, ops tagged ``in_place``,
    ``opaque`` or ``no_recompute`` (:func:`remat.ops.op_tags`) are never recomputed.
    """

    matmul: bool = False
    attention: bool = False
    reductions: bool = False
    random: bool = False
    non_fusible: bool = False

    def allows(self, tags: Iterable[str], fusible: bool = True) -> bool:
        tags = set(tags)
        if tags & NEVER_RECOMPUTE_TAGS:
            return False
        if "matmul" in tags and not self.matmul:
            return False
        if "attention" in tags and not self.attention:
            return False
        if "reduction" in tags and not self.reductions:
            return False
        if "rng" in tags and not self.random:
            return False
        if not fusible and "view" not in tags and not ({"matmul", "attention"} & tags) and not self.non_fusible:
            return False
        return True


@dataclass
class FlowProblem:
    """A flow network with nodes ``0`` (source), ``1`` (sink), then ``in``/``out`` nodes of each value.

    ``tails``/``heads``/``capacities`` list the edges (capacity :data:`INFINITE` for pinned and data
    edges).  ``values[i]`` is the name of the value whose split nodes are ``2 + 2*i`` (in) and
    ``3 + 2*i`` (out).  ``producer[name]`` is the op node writing a value; ``reads[op]`` the network values
    an op reads; ``backward_reads`` the values read by backward ops; ``pinned`` the values that may not be
    recomputed.
    """

    values: list[str]
    value_index: dict[str, int]
    tails: np.ndarray
    heads: np.ndarray
    capacities: np.ndarray
    save_cost: dict[str, int]
    value_bytes: dict[str, int]
    producer: dict[str, Hashable]
    reads: dict[Hashable, tuple[str, ...]]
    backward_reads: set[str]
    pinned: set[str]
    op_flops: dict[Hashable, int] = field(default_factory=dict)
    unsavable: set[str] = field(default_factory=set)

    @property
    def num_nodes(self) -> int:
        return 2 + 2 * len(self.values)

    def in_node(self, name: str) -> int:
        return 2 + 2 * self.value_index[name]

    def out_node(self, name: str) -> int:
        return 3 + 2 * self.value_index[name]


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
    """Raise :class:`GraphError` for graphs :func:`build_problem` cannot take."""
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
        unknown = set(data.get("tags", ())) - KNOWN_TAGS
        if unknown and data.get("recompute") is None:
            raise GraphError(
                f"node {node!r} has tags {sorted(unknown)} the solver does not know; "
                f"known tags: {sorted(KNOWN_TAGS)} (or set recompute='allowed'/'never')"
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


def build_problem(
    graph: nx.DiGraph | FusionGraph,
    policy: RecomputePolicy | None = None,
    *,
    validate: bool = True,
    priced: RecomputePolicy | None = None,
    recompute_price: float = 0.0,
    weights: dict[str, float] | None = None,
) -> FlowProblem:
    """Build the flow network of ``graph`` (see the module docstring): a plain ``networkx.DiGraph``
    (validated unless ``validate=False``; raises :class:`GraphError` when malformed) or a
    :class:`remat.FusionGraph` (its op records are used directly).  Graphs made by
    :meth:`remat.FusionGraph.from_trace` carry their tensors in ``graph.graph["tensors"]`` and their
    forward outputs in ``graph.graph["forward_outputs"]``; sizes and save costs then come from there.

    Trading compute for memory (used by :mod:`remat.budget`): ops that ``policy`` does not allow but
    ``priced`` does may be recomputed at a price: ``SOURCE -> in(t)`` gets capacity
    ``recompute_price * flops`` (bytes per FLOP; split evenly over the op's outputs), so the cut pays for
    their FLOPs instead of being forbidden them.  ``weights`` scales the save cost of named values (the
    peak-aware search makes values that are not alive at the peak cheap to keep).
    """
    policy = policy or RecomputePolicy()
    pricing = (priced, recompute_price, weights or {})
    if isinstance(graph, FusionGraph):
        if graph.ops is None:
            raise GraphError("this FusionGraph was built with ops=False; the solver needs its operations")
        tensors = None if graph.plain else graph.tensors
        ops = graph.ops
        hazards = mutation_hazard_ops(graph)
        if hazards:  # ops reading a buffer that is written in place later: never recomputed
            ops = [op._replace(recompute="never") if op.id in hazards else op for op in ops]
        return _build(ops, tensors, set(graph.forward_outputs), policy, *pricing)
    if validate:
        validate_graph(graph)
    held = set(graph.graph.get("forward_outputs", ()))
    return _build(records_from_nx(graph), graph.graph.get("tensors"), held, policy, *pricing)


def mutation_hazard_ops(graph: FusionGraph) -> dict[Hashable, str]:
    """Forward op nodes of a trace graph that read a value sharing storage with a buffer an op writes in
    place *later* in the step (a kv cache updated by ``copy_``), each with the kind of that op
    (:func:`remat.ops.mutation_hazards`).  Recomputing them in the backward would read the new contents,
    so :func:`build_problem` never recomputes them.  Empty for plain graphs; cached on the graph."""
    cached = graph.__dict__.get("_mutation_hazards")
    if cached is not None:
        return cached
    hazards: dict[Hashable, str] = {}
    if graph.ops is not None and not graph.plain:
        ops = graph.ops
        order = sorted(range(len(ops)), key=lambda i: (ops[i].phase != "forward", i))  # execution order
        found = mutation_hazards([(ops[i].kind, ops[i].tags, ops[i].inputs, ops[i].outputs) for i in order])
        hazards = {ops[order[k]].id: kind for k, kind in found.items() if ops[order[k]].phase == "forward"}
    graph.__dict__["_mutation_hazards"] = hazards
    return hazards


def _build(
    ops: list[Op],
    tensors: dict | None,
    held: set[str],
    policy: RecomputePolicy,
    priced: RecomputePolicy | None = None,
    recompute_price: float = 0.0,
    weights: dict[str, float] | None = None,
) -> FlowProblem:
    values: list[str] = []
    value_index: dict[str, int] = {}
    save_cost: dict[str, int] = {}
    value_bytes: dict[str, int] = {}
    producer: dict[str, Hashable] = {}
    pinned: set[str] = set()
    unsavable: set[str] = set()
    op_flops: dict[Hashable, int] = {}

    price: dict[str, int] = {}  # value -> capacity of SOURCE -> in(value) for priced recomputation
    weights = weights or {}
    for op in ops:
        if op.phase != "forward" or op.kind == "return" or op.is_input or op.is_param:
            continue
        if op.recompute is None:
            allowed = policy.allows(op.tags, op.fusible)
            if not allowed and priced is not None and priced.allows(op.tags, op.fusible) and math.isfinite(recompute_price):
                share = recompute_price * op.flops / max(len(op.outputs), 1)
                for name in op.outputs:
                    price[name] = max(int(round(share)), 1)
                allowed = True
        else:
            allowed = op.recompute == "allowed"
        op_flops[op.id] = op.flops
        for k, (name, nbytes) in enumerate(zip(op.outputs, op.output_bytes)):
            if tensors is not None:
                info = tensors.get(name)
                if info is not None and info.kind in ("param", "input"):
                    continue
                cost = _trace_save_cost(name, tensors, held)
            else:
                cost = op.output_costs[k] if op.output_costs is not None else nbytes
            if cost < 0 or nbytes < 0:
                raise GraphError(f"node {op.id!r}: negative size for value {name!r}")
            if name in weights:
                cost = int(round(cost * weights[name]))
            value_index[name] = len(values)
            values.append(name)
            save_cost[name] = cost
            value_bytes[name] = nbytes
            producer[name] = op.id
            if not allowed:
                pinned.add(name)
            if not op.savable:
                unsavable.add(name)

    tails: list[int] = []
    heads: list[int] = []
    caps: list[int] = []
    for name, i in value_index.items():
        tails.append(2 + 2 * i)
        heads.append(3 + 2 * i)
        caps.append(INFINITE if name in unsavable else save_cost[name])
        if name in pinned:
            tails.append(SOURCE)
            heads.append(2 + 2 * i)
            caps.append(INFINITE)
        elif name in price:
            tails.append(SOURCE)
            heads.append(2 + 2 * i)
            caps.append(price[name])

    reads: dict[Hashable, tuple[str, ...]] = {}
    backward_reads: set[str] = set()
    for op in ops:
        if op.kind == "return":
            continue
        # Names are matched with their producer: a backward region may recompute a forward value under
        # the forward's name (Thunder does this); reading that copy is not a read of the forward value.
        read = tuple(
            dict.fromkeys(
                name
                for name, src in zip(op.inputs, op.input_nodes)
                if name in value_index and producer[name] == src
            )
        )
        if not read:
            continue
        if op.phase == "forward":
            reads[op.id] = read
            for out in op.outputs:
                j = value_index.get(out)
                if j is None:
                    continue
                for name in read:
                    tails.append(3 + 2 * value_index[name])
                    heads.append(2 + 2 * j)
                    caps.append(INFINITE)
        else:
            for name in read:
                backward_reads.add(name)
                tails.append(3 + 2 * value_index[name])
                heads.append(SINK)
                caps.append(INFINITE)

    return FlowProblem(
        values=values,
        value_index=value_index,
        tails=np.asarray(tails, dtype=np.int64),
        heads=np.asarray(heads, dtype=np.int64),
        capacities=np.asarray(caps, dtype=np.int64),
        save_cost=save_cost,
        value_bytes=value_bytes,
        producer=producer,
        reads=reads,
        backward_reads=backward_reads,
        pinned=pinned,
        op_flops=op_flops,
        unsavable=unsavable,
    )


def _trace_save_cost(name: str, tensors: dict, held: set[str]) -> int:
    """Bytes that keeping a trace tensor for the backward adds: none for forward outputs (held by the
    caller anyway), numbers, parameters and inputs; else its storage.  A view of a parameter or input
    costs one byte: no memory, but recomputing it is free too, and that spares the regions an output
    and an input (and the trace a stand-alone view op) for nothing."""
    info = tensors.get(name)
    if info is None:
        return 0
    if name in held or info.kind in ("number", "param", "input"):
        return 0
    if info.alias_of is not None:
        base = tensors.get(info.alias_of)
        if base is None or base.name in held:
            return 0
        if base.kind in ("param", "input"):
            return 1
        return base.bytes
    return info.bytes


def plain_fusion_graph(graph: nx.DiGraph) -> tuple[FusionGraph, list[Hashable]]:
    """A :class:`FusionGraph` for a plain graph, so that the memory model and the plan layout apply to
    it: one unit per node (forward nodes, then backward nodes, in topological order), one value per
    output; backward values nobody reads are gradients, held to the end of the step like a trace's
    return; ``graph.graph["forward_outputs"]`` (optional) names values the forward returns.  Op ids are
    positions; the returned list maps them back to the graph's nodes."""
    from remat.graph import TensorInfo, Unit

    validate_graph(graph)
    records = records_from_nx(graph)
    order = sorted(range(len(records)), key=lambda i: (records[i].phase != "forward", i))
    node_ids = [records[i].id for i in order]
    position = {node: k for k, node in enumerate(node_ids)}
    ops: list[Op] = []
    units: list[Unit] = []
    tensors: dict[Hashable, TensorInfo] = {}
    read: set[Hashable] = set()
    for k, i in enumerate(order):
        record = records[i]
        op = record._replace(id=k, unit=k, input_nodes=tuple(position[n] for n in record.input_nodes))
        ops.append(op)
        read.update(op.inputs)
        kind = "input" if (op.is_input or op.is_param) else "op"
        units.append(Unit(k, str(node_ids[k]), kind, op.phase, () if kind == "input" else op.inputs, op.outputs, (k,), op.flops, op.tags))
        value_kind = "param" if op.is_param else "input" if op.is_input else "activation"
        for name, nbytes in zip(op.outputs, op.output_bytes):
            tensors[name] = TensorInfo(name, (), "bytes", nbytes, value_kind, k, k, op.phase)
    forward_outputs = tuple(graph.graph.get("forward_outputs", ()))
    gradients = tuple(
        name for op in ops if op.phase == "backward" for name in op.outputs if name not in read
    )
    units.append(Unit(len(units), "return", "return", "backward", forward_outputs + gradients, (), (), 0))
    fusion_graph = FusionGraph(units, tensors, ops, forward_outputs=forward_outputs, gradients=gradients, is_joint=True)
    fusion_graph.plain = True
    return fusion_graph, node_ids
