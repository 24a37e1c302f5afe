"""The IR: a training step as plain data (units, tensors, operations), and its networkx view.

A :class:`FusionGraph` is built once, by a reader, and never changed afterwards:
:func:`remat.thunder.read.read_trace` reads a Thunder trace (``remat.read_trace``),
:func:`remat.core.plain.plain_graph` adopts a plain ``networkx.DiGraph`` (``remat.solve``), and
:func:`remat.core.layout.layout_graph` simulates the units of a rewritten trace.  Nothing here imports
Thunder.

``FusionGraph.units``
    The trace's top-level bound symbols in trace order, one :class:`Unit` each: a fusion region, a single
    op (matmul, attention, ...), an input, a cotangent read (``get_grad``) or the return.  A unit is the
    granularity at which memory is allocated: a region allocates all its outputs when it runs, and its
    internal values are never materialized.
``FusionGraph.tensors``
    Every tensor (and number) proxy the graph knows, as :class:`TensorInfo` (read with operations: every
    op output; without: those crossing a unit boundary).
``FusionGraph.ops``
    One :class:`Op` per *operation* (the subsymbols of fusion regions and the other top-level ops), in
    trace order; an op's ``id`` is its index.  None for graphs read without operations (memory model only).
``FusionGraph.nx``
    A ``networkx.DiGraph`` with one node per operation, built on first use.  Node attributes:

    ===============  =============================================================================
    ``label``        readable text, e.g. ``"t597 = div"``
    ``kind``         op kind (:mod:`remat.core.ops`): a PrimIDs name (``"mul"``) or a symbol id
    ``region``       name of the fusion region holding the op, or None
    ``unit``         index of the unit (top-level bound symbol) holding the op
    ``phase``        ``"forward"`` or ``"backward"`` (see :func:`split_phases`)
    ``inputs``       tensor names read, ``outputs`` tensor names written
    ``bytes``        bytes of all outputs (numel x itemsize); ``output_bytes`` per output
    ``flops``        FLOP estimate (:func:`remat.core.ops.estimate_flops`)
    ``tags``         frozenset from :data:`remat.core.ops.TAGS`
    ``fusible``      True if nvFuser could take the op (:data:`remat.core.ops.NVFUSER_FUSIBLE_PRIMS`)
    ``is_input``     True for trace inputs (``unpack_trivial``), ``is_param`` for parameters
    ===============  =============================================================================

    ``graph.graph["tensors"]`` holds the TensorInfo mapping and ``graph.graph["forward_outputs"]`` the
    names the forward returns, so the graph alone is enough for :func:`remat.solve`.

    Edge ``(u, v)`` means v reads something u wrote.  Edge attributes: ``tensors`` (names carried),
    ``bytes`` (their total), and for the largest carried tensor ``tensor``, ``shape``, ``dtype``,
    ``phase`` (of the producer), ``is_param`` and ``producer_tags``.

Forward and backward are told apart by :func:`split_phases`, the rule Thunder's
``split_into_forward_and_backward`` applies.

``FusionGraph.module_names``
    Where the values and ops come from in the traced module (:class:`ModuleNames`): dotted parameter
    names (``transformer.h.0.mlp.fc.weight``) and the module path of each op (``transformer.h.0.mlp``),
    computed on first use by the reader that made the graph (None for plain graphs and for traces whose
    parameters Thunder did not load from a module).  :meth:`FusionGraph.value_module` and
    :func:`describe_values` read it; docs/concepts.md says which names are exact and which inferred.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import networkx as nx

from remat.core.ops import RETURN_KIND
from remat.core.storage import mutation_hazards
from remat.core.units import format_bytes
from remat.core.views import ViewFacts, member_view

__all__ = [
    "FORWARD", "BACKWARD", "ROOT_MODULE", "TensorInfo", "Unit", "Op", "FusionGraph", "ModuleNames", "split_phases",
    "common_module", "parameter_module", "describe_values", "module_text",
]

FORWARD = "forward"
BACKWARD = "backward"
#: the module path of the traced module itself (as in ``torch.nn.Module.named_modules()``)
ROOT_MODULE = ""


class TensorInfo(NamedTuple):
    """One value of the trace (a tensor or number proxy).

    ``kind`` is ``"activation"`` (made by the step), ``"param"`` (a parameter or buffer: a trace input
    that requires grad or lives at a static memory location), ``"input"`` (another trace input),
    ``"cotangent"`` (a gradient handed to the backward) or ``"number"``.  ``alias_of`` names the tensor
    whose storage this one shares (set for outputs of stand-alone view ops, following chains to the
    base); None for fresh storage.  ``producer_unit``/``producer_node`` locate the unit and op writing it.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    kind: str
    producer_unit: int | None
    producer_node: int | None
    phase: str
    alias_of: str | None = None


@dataclass(frozen=True)
class Unit:
    """One top-level bound symbol: the unit in which memory is allocated and freed."""

    index: int
    name: str
    kind: str  # "region", "op", "input", "cotangent", "return" or "other"
    phase: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[int, ...]
    flops: int
    tags: frozenset[str] = field(default_factory=frozenset)


class Op(NamedTuple):
    """One operation: a node of :attr:`FusionGraph.nx` (see the module docstring for the fields).

    ``input_nodes[i]`` is the node that wrote ``inputs[i]`` (None where no node did).  ``recompute``,
    ``savable`` and ``output_costs`` are only set for plain graphs given to :func:`remat.solve`.
    ``side_effect``: the op must run even when nothing reads its outputs (in-place updates, RNG state).
    ``view``: for aliasing prims read from a trace, what the view rules need (:mod:`remat.core.views`).
    """

    id: Any
    kind: str
    unit: int
    region: str | None
    phase: str
    inputs: tuple[str, ...]
    input_nodes: tuple[Any, ...]
    outputs: tuple[str, ...]
    output_bytes: tuple[int, ...]
    flops: int = 0
    tags: frozenset[str] = frozenset()
    fusible: bool = True
    is_input: bool = False
    is_param: bool = False
    recompute: str | None = None
    savable: bool = True
    output_costs: tuple[int, ...] | None = None
    side_effect: bool = False
    view: ViewFacts | None = None

    @property
    def label(self) -> str:
        if not self.outputs:
            return self.kind
        shown = ", ".join(self.outputs[:2]) + (", ..." if len(self.outputs) > 2 else "")
        return f"{shown} = {self.kind}"


def split_phases(
    unit_outputs: Sequence[Sequence[str]],
    unit_inputs: Sequence[Sequence[str]],
    unit_kinds: Sequence[str],
    forward_seed: Iterable[str],
    copy_targets: Sequence[str | None] | None = None,
) -> list[str]:
    """Label each unit ``"forward"`` or ``"backward"`` with the rule of Thunder's
    ``split_into_forward_and_backward``: walking the units backwards from the return, a unit is forward
    if it writes a name the forward needs (seeded with the forward outputs and the trace inputs) or is an
    input unpack; its inputs then become needed too.  ``get_grad`` units (cotangent reads) and the
    return, which ends the step, are backward.
    An in-place ``copy_`` into a forward name is forward (``copy_targets[i]`` is its destination)."""
    needed = set(forward_seed)
    phases = [BACKWARD] * len(unit_kinds)
    for i in range(len(unit_kinds) - 1, -1, -1):
        kind = unit_kinds[i]
        if kind in ("return", "cotangent"):
            continue  # the return ends the step (after the backward); get_grad starts the backward
        inputs = unit_inputs[i]
        written = [o for o in unit_outputs[i] if o not in inputs]
        if kind == "input" or any(o in needed for o in written):
            phases[i] = FORWARD
            needed.update(inputs)
            needed.update(written)
        elif copy_targets is not None and copy_targets[i] is not None and copy_targets[i] in needed:
            phases[i] = FORWARD
            needed.update(inputs)
    return phases


def common_module(a: str, b: str) -> str:
    """The deepest module containing both dotted module paths (``"h.0.attn.qkv"`` and ``"h.0.attn.proj"``:
    ``"h.0.attn"``; :data:`ROOT_MODULE` when they share nothing)."""
    if a == b:
        return a
    a_parts, b_parts = a.split("."), b.split(".")
    shared = 0
    for x, y in zip(a_parts, b_parts):
        if x != y:
            break
        shared += 1
    return ".".join(a_parts[:shared])


def parameter_module(parameter: str) -> str:
    """The module owning a dotted parameter or buffer name (``"h.0.mlp.fc.weight"`` -> ``"h.0.mlp.fc"``;
    a parameter of the traced module itself -> :data:`ROOT_MODULE`)."""
    return parameter.rpartition(".")[0]


@dataclass(frozen=True)
class ModuleNames:
    """Where a graph's values and ops come from in the traced ``torch.nn.Module``.

    ``parameters``: proxy name -> dotted parameter or buffer name as ``named_parameters()`` /
    ``named_buffers()`` spell it (``"t_transformer_h_0_mlp_fc_weight"`` -> ``"transformer.h.0.mlp.fc.weight"``).
    ``op_modules[op_id]``: the dotted path of the module the op belongs to (:data:`ROOT_MODULE` for the
    traced module itself), or None where nothing is known (trace inputs, cotangent reads, the return).
    ``exact``: op ids whose module is read, not inferred: the op reads a parameter (or a value computed
    from parameters alone) or writes a parameter's gradient, and belongs to the module owning that
    parameter (the deepest common module of several).  The other ops' modules are inferred
    (docs/concepts.md, "Names"): they contain the op's true module when the module calls run in trace
    order, but may be coarser than it.
    """

    parameters: Mapping[str, str]
    op_modules: tuple[str | None, ...]
    exact: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))
        object.__setattr__(self, "op_modules", tuple(self.op_modules))
        object.__setattr__(self, "exact", frozenset(self.exact))


@dataclass(frozen=True, eq=False)
class FusionGraph:
    """The producer/consumer structure of a training step (see the module docstring).

    ``forward_outputs``: values the forward returns; ``gradients``: what the backward returns;
    ``is_joint``: a joint forward+backward step (else a single phase); ``explicit_saved``: for Thunder's
    forward trace after the split, the values it hands the backward.  ``strides``: strides of the values
    that are non-contiguous views (:mod:`remat.core.strides`; the others are contiguous).
    ``save_costs``: for plain graphs (not read from a trace), the cost of keeping each value as the
    graph gives it; None for traces, whose costs follow from the memory model
    (:func:`remat.core.memory.save_cost`).  ``donations``: region outputs written into the storage of an
    input that dies at their region, output -> input (:mod:`remat.core.donation`; only for traces read
    for the graph runtime); the memory model counts no new buffer for them.  ``donating``: None where
    every region output gets a buffer of its own; else the runtime writes outputs over dying inputs, and
    these values (attention's operands) are never written so: graphs simulated from this one for a plan
    (:func:`remat.core.layout.layout_graph`, what budget searches measure) find their own donations.  ``origin``: what the reader read the graph from (for traces,
    :class:`remat.thunder.read.TraceOrigin`: the trace and its bound symbols); the core never looks inside.
    ``naming``: how the reader that made the graph works out :attr:`module_names` (called once, on first
    use, with the graph; None: no names).
    """

    units: tuple[Unit, ...]
    tensors: Mapping[str, TensorInfo]
    ops: tuple[Op, ...] | None = None
    forward_outputs: tuple[str, ...] = ()
    gradients: tuple[str, ...] = ()
    is_joint: bool = False
    explicit_saved: tuple[str, ...] | None = None
    strides: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    save_costs: Mapping[Hashable, int] | None = None
    origin: Any = None
    naming: Callable[[FusionGraph], ModuleNames | None] | None = None
    donations: Mapping[str, str] = field(default_factory=dict)
    donating: frozenset[str] | None = None

    def __post_init__(self) -> None:
        # frozen: the containers are read-only views or tuples, so no stage can change a shared graph
        object.__setattr__(self, "units", tuple(self.units))
        tensors = self.tensors if isinstance(self.tensors, dict) else dict(self.tensors)  # readers hand theirs over
        object.__setattr__(self, "tensors", MappingProxyType(tensors))
        if self.ops is not None:
            object.__setattr__(self, "ops", tuple(self.ops))
        strides = self.strides if isinstance(self.strides, dict) else dict(self.strides)
        object.__setattr__(self, "strides", MappingProxyType(strides))
        object.__setattr__(self, "donations", MappingProxyType(dict(self.donations)))

    def __repr__(self) -> str:
        regions = sum(1 for u in self.units if u.kind == "region")
        ops = len(self.ops) if self.ops is not None else "?"
        return (
            f"FusionGraph({ops} ops, {regions} regions, {len(self.units)} units, "
            f"{'joint' if self.is_joint else 'single-phase'}{', plain' if self.plain else ''})"
        )

    @property
    def plain(self) -> bool:
        """True for graphs that did not come from a trace (their phases and save costs are given)."""
        return self.save_costs is not None

    @functools.cached_property
    def nx(self) -> nx.DiGraph:
        """The op-level ``networkx.DiGraph`` (built on first use from :attr:`ops`)."""
        if self.ops is None:
            raise ValueError("this FusionGraph was read without operations; read it with remat.read_trace(trace)")
        return _build_nx(self.ops, self.tensors, self.forward_outputs)

    @functools.cached_property
    def view_ops(self) -> frozenset[int]:
        """Op nodes that return a view of their one tensor input rather than fresh storage
        (:mod:`remat.core.views`): stand-alone views whose output aliases, and view ops inside regions.
        What decides which outputs of a rewritten region alias other values."""
        found: set[int] = set()
        if self.ops is not None:
            strides = dict(self.strides)  # chains inside regions record their strides here
            for op in self.ops:
                if op.region is None:
                    if "view" in op.tags and any(
                        self.tensors.get(o) is not None and self.tensors[o].alias_of is not None for o in op.outputs
                    ):
                        found.add(op.id)
                elif member_view(op.kind, op.view, strides):
                    found.add(op.id)
        return frozenset(found)

    @functools.cached_property
    def mutation_hazards(self) -> Mapping[Hashable, str]:
        """Forward op nodes that read a value sharing storage with a buffer an op writes in place *later*
        in the step (a kv cache updated by ``copy_``), each with the kind of that op
        (:func:`remat.core.storage.mutation_hazards`).  Recomputing them in the backward would read the
        new contents, so they are never recomputed.  Empty for plain graphs."""
        if self.ops is None or self.plain:
            return MappingProxyType({})
        ops = self.ops
        order = sorted(range(len(ops)), key=lambda i: (ops[i].phase != FORWARD, i))  # execution order
        found = mutation_hazards([(ops[i].kind, ops[i].tags, ops[i].inputs, ops[i].outputs) for i in order])
        return MappingProxyType({ops[order[k]].id: kind for k, kind in found.items() if ops[order[k]].phase == FORWARD})

    @functools.cached_property
    def module_names(self) -> ModuleNames | None:
        """Parameter names and the module of each op (:class:`ModuleNames`), worked out on first use so
        that planning never pays for them; None for graphs without them (plain graphs, graphs read
        without operations, traces whose parameters did not come from a module)."""
        if self.naming is None or self.ops is None:
            return None
        names = self.naming(self)
        if names is not None and len(names.op_modules) != len(self.ops):
            raise ValueError(f"naming gave modules for {len(names.op_modules)} ops; the graph has {len(self.ops)}")
        return names

    def parameter_name(self, name: str) -> str | None:
        """The dotted name (``"transformer.h.0.mlp.fc.weight"``) of the parameter or buffer a proxy
        stands for, or None (not a parameter, or no names known)."""
        names = self.module_names
        return names.parameters.get(name) if names is not None else None

    def op_module(self, op_id: int) -> str | None:
        """The dotted path of the module op ``op_id`` belongs to (:data:`ROOT_MODULE` for the traced
        module itself), or None when unknown; see :class:`ModuleNames` for what is exact."""
        names = self.module_names
        if names is None:
            return None
        if not isinstance(op_id, int) or not 0 <= op_id < len(names.op_modules):
            raise KeyError(f"no op {op_id!r} in this graph (op ids are 0..{len(names.op_modules) - 1})")
        return names.op_modules[op_id]

    def value_module(self, name: str) -> str | None:
        """The dotted path of the module a value comes from: for a parameter or buffer, the module owning
        it (exact); for another value, the module of the op that writes it (:meth:`op_module`); None for
        trace inputs, cotangents and graphs without names.  Raises KeyError for a name the graph does
        not know."""
        if name not in self.tensors:
            raise KeyError(f"the graph has no value named {name!r}")
        names = self.module_names
        if names is None:
            return None
        parameter = names.parameters.get(name)
        if parameter is not None:
            return parameter_module(parameter)
        node = self.tensors[name].producer_node
        if not isinstance(node, int) or not 0 <= node < len(names.op_modules):
            return None
        return names.op_modules[node]

    @property
    def step_flops(self) -> int:
        """FLOPs of all operations (the step as read)."""
        return sum(op.flops for op in self.ops) if self.ops is not None else sum(u.flops for u in self.units)

    def regions(self) -> nx.DiGraph:
        """The unit-level producer/consumer graph: one node per fusion region or stand-alone op (inputs,
        cotangent reads and the return are left out).  Node attributes: ``kind``, ``phase``, ``ops``
        (number of ops), ``flops``, ``output_bytes``; edge attributes: ``tensors`` and ``bytes``."""
        g = nx.DiGraph()
        producer_unit: dict[str, int] = {}
        for unit in self.units:
            if unit.kind in ("input", "cotangent", RETURN_KIND):
                for name in unit.outputs:
                    producer_unit[name] = -1
                continue
            g.add_node(
                unit.name,
                index=unit.index,
                kind=unit.kind,
                phase=unit.phase,
                ops=len(unit.nodes),
                flops=unit.flops,
                output_bytes=sum(self.tensors[o].bytes for o in unit.outputs if o in self.tensors),
            )
            for name in unit.inputs:
                src = producer_unit.get(name)
                if src is None or src < 0:
                    continue
                src_name = self.units[src].name
                nbytes = self.tensors[name].bytes if name in self.tensors else 0
                if g.has_edge(src_name, unit.name):
                    g.edges[src_name, unit.name]["tensors"] += (name,)
                    g.edges[src_name, unit.name]["bytes"] += nbytes
                else:
                    g.add_edge(src_name, unit.name, tensors=(name,), bytes=nbytes)
            for name in unit.outputs:
                producer_unit[name] = unit.index
        return g

    def execution_order(self) -> list[int]:
        """Unit indices in the order they run: forward units (trace order), then backward units."""
        forward = [u.index for u in self.units if u.phase == FORWARD and u.kind != RETURN_KIND]
        backward = [u.index for u in self.units if u.phase == BACKWARD and u.kind != RETURN_KIND]
        tail = [u.index for u in self.units if u.kind == RETURN_KIND]
        return forward + backward + tail


def describe_values(graph: FusionGraph, names: Iterable[str]) -> list[str]:
    """One readable line per value: ``"t57 (transformer.h.0.mlp.fc, 8.0 MiB)"`` -- the proxy name, the
    module it comes from (:meth:`FusionGraph.value_module`; ``<root>`` for the traced module itself,
    left out where unknown) and its size (numel x itemsize, :func:`remat.core.units.format_bytes`).  Raises KeyError for a name the
    graph does not know."""
    lines = []
    for name in names:
        module = graph.value_module(name)
        where = "" if module is None else f"{module_text(module)}, "
        lines.append(f"{name} ({where}{format_bytes(graph.tensors[name].bytes)})")
    return lines


def module_text(module: str | None) -> str:
    """A module path as shown to people: ``<root>`` for the traced module itself, ``-`` for unknown."""
    if module is None:
        return "-"
    return module or "<root>"


def _build_nx(ops: Sequence[Op], tensors: Mapping[str, TensorInfo], forward_outputs: tuple[str, ...]) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.graph["tensors"] = tensors
    graph.graph["forward_outputs"] = forward_outputs
    for op in ops:
        graph.add_node(
            op.id,
            label=op.label,
            kind=op.kind,
            region=op.region,
            unit=op.unit,
            phase=op.phase,
            inputs=op.inputs,
            outputs=op.outputs,
            output_bytes=op.output_bytes,
            bytes=sum(op.output_bytes),
            flops=op.flops,
            tags=op.tags,
            fusible=op.fusible,
            is_input=op.is_input,
            is_param=op.is_param,
        )
    nodes = graph.nodes
    for op in ops:
        for name, src in zip(op.inputs, op.input_nodes):
            if src is None or src == op.id:
                continue
            info = tensors.get(name)
            nbytes = info.bytes if info is not None else 0
            if graph.has_edge(src, op.id):
                data = graph.edges[src, op.id]
                data["tensors"] = data["tensors"] + (name,)
                data["bytes"] += nbytes
                if info is not None and nbytes > _edge_main_bytes(data, tensors):
                    _set_main_tensor(data, info, nodes[src])
            else:
                data = {"tensors": (name,), "bytes": nbytes}
                if info is not None:
                    _set_main_tensor(data, info, nodes[src])
                graph.add_edge(src, op.id, **data)
    return graph


def _edge_main_bytes(data: dict, tensors: Mapping[str, TensorInfo]) -> int:
    main = data.get("tensor")
    return tensors[main].bytes if main in tensors else 0


def _set_main_tensor(data: dict, info: TensorInfo, producer: dict) -> None:
    data["tensor"] = info.name
    data["shape"] = info.shape
    data["dtype"] = info.dtype
    data["phase"] = info.phase
    data["is_param"] = info.kind == "param"
    data["producer_tags"] = producer.get("tags", frozenset())
