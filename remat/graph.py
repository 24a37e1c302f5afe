"""Stage 2, *graph*: a Thunder trace as a networkx producer/consumer graph of operations and regions.

:meth:`FusionGraph.from_trace` reads a trace once and produces plain data:

``FusionGraph.units``
    The trace's top-level bound symbols in trace order, one :class:`Unit` each: a fusion region, a single
    op (matmul, attention, ...), an input, a cotangent read (``get_grad``) or the return.  A unit is the
    granularity at which memory is allocated: a region allocates all its outputs when it runs, and its
    internal values are never materialized.
``FusionGraph.tensors``
    Every tensor (and number) proxy that crosses a unit boundary, as :class:`TensorInfo`.
``FusionGraph.nx``
    A ``networkx.DiGraph`` with one node per *operation*: the subsymbols of fusion regions and the
    other top-level ops.  Node ids are integers in execution order of the trace.  Node attributes:

    ===============  =============================================================================
    ``label``        readable text, e.g. ``"t597 = div"``
    ``kind``         op kind (:func:`op_kind`): a PrimIDs name (``"mul"``) or a symbol id
    ``region``       name of the fusion region holding the op, or None
    ``unit``         index of the unit (top-level bound symbol) holding the op
    ``phase``        ``"forward"`` or ``"backward"`` (see :func:`split_phases`)
    ``inputs``       tensor names read, ``outputs`` tensor names written
    ``bytes``        bytes of all outputs (numel x itemsize); ``output_bytes`` per output
    ``flops``        FLOP estimate (:func:`remat.ops.estimate_flops`)
    ``tags``         frozenset from {matmul, attention, reduction, rng, rng_stateless, view, shape}
    ``fusible``      True if nvFuser could take the op (:data:`remat.ops.NVFUSER_FUSIBLE_PRIMS`)
    ``is_input``     True for trace inputs (``unpack_trivial``), ``is_param`` for parameters
    ===============  =============================================================================

    ``graph.graph["tensors"]`` holds the TensorInfo dict and ``graph.graph["forward_outputs"]`` the names
    the forward returns, so the graph alone is enough for :func:`remat.solve`.

    Edge ``(u, v)`` means v reads something u wrote.  Edge attributes: ``tensors`` (names carried),
    ``bytes`` (their total), and for the largest carried tensor ``tensor``, ``shape``, ``dtype``,
    ``phase`` (of the producer), ``is_param`` and ``producer_tags``.

Forward and backward are told apart by :func:`split_phases`, the rule Thunder's
``split_into_forward_and_backward`` applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx

from remat import _compat
from remat._util import paused_gc
from remat.errors import UnsupportedTraceError
from remat.ops import (
    BOOKKEEPING_KINDS,
    COTANGENT_KIND,
    INPUT_KINDS,
    NVFUSER_FUSIBLE_PRIMS,
    RETURN_KIND,
    estimate_flops,
    op_tags,
)

_compat.import_thunder()

from thunder.core import prims  # noqa: E402
from thunder.core.proxies import NumberProxy, Proxy, ProxyTag, TensorProxy  # noqa: E402
from thunder.core.pytree import tree_flatten  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceTag  # noqa: E402

__all__ = ["FusionGraph", "TensorInfo", "Unit", "op_kind", "split_phases"]

FORWARD = "forward"
BACKWARD = "backward"


@dataclass(frozen=True)
class TensorInfo:
    """One value crossing a unit boundary.

    ``kind`` is ``"activation"`` (made by the step), ``"param"`` (a parameter or buffer: a trace input
    that requires grad or lives at a static memory location), ``"input"`` (another trace input),
    ``"cotangent"`` (a gradient handed to the backward) or ``"number"``.  ``alias_of`` names the tensor
    whose storage this one shares (set for outputs of stand-alone view ops, following chains to the
    base); None for fresh storage.
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


def op_kind(bsym: BoundSymbol) -> str:
    """The op kind remat classifies by: the lower-case PrimIDs name for prims, else the symbol id."""
    sym_id = bsym.sym.id
    if isinstance(sym_id, prims.PrimIDs):
        return sym_id.name.lower()
    if bsym.sym.is_fusion:
        return "fusion"
    return str(sym_id)


def _thunder_tags(bsym: BoundSymbol) -> tuple[str, ...]:
    tags = bsym.sym.tags or ()
    return tuple(t.name.lower() for t in tags if hasattr(t, "name"))


def _dtype_name(dtype: Any) -> str:
    short = getattr(dtype, "shortname", None)
    return short() if callable(short) else str(dtype)


def _tensor_facts(proxy: Proxy) -> tuple[tuple[int, ...], str, int]:
    if isinstance(proxy, TensorProxy):
        shape = tuple(proxy.shape)
        if not all(type(d) is int for d in shape):
            dims = ", ".join(str(d) if type(d) is int else getattr(d, "name", "?") for d in shape)
            raise UnsupportedTraceError(
                f"tensor {proxy.name} has a symbolic shape ({dims}); remat models static shapes only "
                "(trace with thunder.jit's default cache option, not 'symbolic values')"
            )
        numel = 1
        for d in shape:
            numel *= d
        return shape, _dtype_name(proxy.dtype), numel * proxy.dtype.bytes
    return (), type(proxy).__name__, 0


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


class FusionGraph:
    """The producer/consumer structure of a Thunder trace (see the module docstring for attributes)."""

    def __init__(
        self,
        units: list[Unit],
        tensors: dict[str, TensorInfo],
        graph: nx.DiGraph,
        *,
        forward_outputs: tuple[str, ...] = (),
        gradients: tuple[str, ...] = (),
        is_joint: bool = False,
        explicit_saved: tuple[str, ...] | None = None,
        trace: TraceCtx | None = None,
        op_bsyms: list[BoundSymbol] | None = None,
        unit_bsyms: list[BoundSymbol] | None = None,
    ) -> None:
        self.units = units
        self.tensors = tensors
        self.nx = graph
        self.forward_outputs = forward_outputs
        self.gradients = gradients
        self.is_joint = is_joint
        self.explicit_saved = explicit_saved
        self.trace = trace
        #: Thunder bound symbols behind op nodes (by node id) and units (by unit index); None for plain graphs.
        self.op_bsyms = op_bsyms
        self.unit_bsyms = unit_bsyms

    def __repr__(self) -> str:
        regions = sum(1 for u in self.units if u.kind == "region")
        return (
            f"FusionGraph({self.nx.number_of_nodes()} ops, {regions} regions, {len(self.units)} units, "
            f"{'joint' if self.is_joint else 'single-phase'})"
        )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_trace(cls, trace: TraceCtx) -> FusionGraph:
        """Build the graph of a Thunder trace (joint forward+backward, forward-only, or fused)."""
        with paused_gc():
            return cls._from_trace(trace)

    @classmethod
    def _from_trace(cls, trace: TraceCtx) -> FusionGraph:
        if not isinstance(trace, TraceCtx):
            hint = " Call remat.training_trace(module, *args) first." if callable(trace) else ""
            raise TypeError(f"expected a Thunder trace (thunder.core.trace.TraceCtx), got {type(trace).__name__}.{hint}")
        bsyms = list(trace.bound_symbols)
        if not bsyms:
            raise UnsupportedTraceError("the trace has no bound symbols")

        trace_args = {p.name: p for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)}

        # ---- units: one per top-level bound symbol (comments and deletes carry no data)
        raw: list[tuple[BoundSymbol, str, str, tuple[str, ...], tuple[str, ...]]] = []
        for bsym in bsyms:
            kind = op_kind(bsym)
            if kind in BOOKKEEPING_KINDS:
                continue
            if kind == RETURN_KIND:
                unit_kind = "return"
            elif kind in INPUT_KINDS:
                unit_kind = "input"
            elif kind == COTANGENT_KIND:
                unit_kind = "cotangent"
            elif bsym.sym.is_fusion:
                unit_kind = "region"
            else:
                unit_kind = "op"
            ins = tuple(dict.fromkeys(p.name for p in bsym.flat_proxy_args))
            outs = tuple(dict.fromkeys(p.name for p in bsym.flat_proxy_outs))
            if unit_kind in ("input", "cotangent"):
                # unpack_trivial "reads" the name it defines; get_grad names the forward output whose
                # cotangent it reads, but does not read that output's data.
                ins = ()
            raw.append((bsym, kind, unit_kind, ins, outs))

        return_bsym = raw[-1][0] if raw and raw[-1][2] == "return" else None
        forward_outputs: tuple[str, ...] = ()
        gradients: tuple[str, ...] = ()
        explicit_saved: tuple[str, ...] | None = None
        is_joint = False
        if return_bsym is not None and return_bsym.args and isinstance(return_bsym.args[0], dict):
            ret = return_bsym.args[0]
            if "fw_flat_out" in ret:
                is_joint = True
                forward_outputs = tuple(p.name for p in tree_flatten(ret["fw_flat_out"])[0] if isinstance(p, Proxy))
                gradients = tuple(p.name for p in tree_flatten(ret.get("output", ()))[0] if isinstance(p, Proxy))
        if not is_joint and TraceTag.AUGMENTED_FORWARD in getattr(trace, "tags", set()) and return_bsym is not None:
            # Thunder's forward trace after the split returns (outputs, (saved_tensors, saved_other)).
            try:
                saved_part = return_bsym.args[1]
                explicit_saved = tuple(p.name for p in tree_flatten(saved_part)[0] if isinstance(p, TensorProxy))
            except (IndexError, TypeError):
                explicit_saved = None

        kinds = [r[2] for r in raw]
        if is_joint:
            seed = set(forward_outputs) | set(trace_args)
            copy_targets = [
                (r[0].args[1].name if r[1] == "copy_" and len(r[0].args) > 1 and isinstance(r[0].args[1], Proxy) else None)
                for r in raw
            ]
            phases = split_phases([r[4] for r in raw], [r[3] for r in raw], kinds, seed, copy_targets)
        else:
            phases = [FORWARD] * len(raw)

        # ---- tensors and op nodes
        graph = nx.DiGraph()
        tensors: dict[str, TensorInfo] = {}
        op_bsyms: list[BoundSymbol] = []  # node id -> the bound symbol it stands for
        producer_node: dict[str, int] = {}  # unit-level visible producers
        units: list[Unit] = []
        node_id = 0

        facts_cache: dict[str, tuple[tuple[int, ...], str, int]] = {}

        def facts(proxy: Proxy) -> tuple[tuple[int, ...], str, int]:
            cached = facts_cache.get(proxy.name)
            if cached is None:
                cached = facts_cache[proxy.name] = _tensor_facts(proxy)
            return cached

        def register_tensor(proxy: Proxy, kind: str, unit_index: int | None, node: int | None, phase: str, alias_of=None):
            if not isinstance(proxy, (TensorProxy, NumberProxy)):
                return
            shape, dtype, nbytes = facts(proxy)
            if isinstance(proxy, NumberProxy):
                kind = "number"
            tensors[proxy.name] = TensorInfo(proxy.name, shape, dtype, nbytes, kind, unit_index, node, phase, alias_of)

        for name, proxy in trace_args.items():
            is_param = isinstance(proxy, TensorProxy) and (
                proxy.requires_grad or ProxyTag.STATIC_MEMORY_LOCATION in getattr(proxy, "tags", ())
            )
            register_tensor(proxy, "param" if is_param else "input", None, None, FORWARD)

        for unit_index, ((bsym, kind, unit_kind, ins, outs), phase) in enumerate(zip(raw, phases)):
            nodes: list[int] = []
            if unit_kind == "region":
                ops = list(bsym.subsymbols)
                region_name = bsym.sym.name
            else:
                ops = [bsym]
                region_name = None
            local_producer: dict[str, int] = {}
            unit_flops = 0
            unit_tags: set[str] = set()
            for op in ops:
                okind = op_kind(op) if op is not bsym or unit_kind != "region" else "fusion"
                if okind in BOOKKEEPING_KINDS or okind == RETURN_KIND:
                    if unit_kind != "return":
                        continue
                op_ins = ins if unit_kind in ("input", "cotangent") else tuple(dict.fromkeys(p.name for p in op.flat_proxy_args))
                op_out_proxies = [p for p in op.flat_proxy_outs if p.name not in op_ins]
                op_outs = tuple(dict.fromkeys(p.name for p in op_out_proxies))
                tags = op_tags(okind, _thunder_tags(op))
                in_shapes = [facts(p)[0] for p in op.flat_proxy_args if isinstance(p, TensorProxy)]
                out_shapes = [facts(p)[0] for p in op_out_proxies if isinstance(p, TensorProxy)]
                flops = estimate_flops(okind, tags, in_shapes, out_shapes, backward=phase == BACKWARD)
                out_sizes = {p.name: facts(p)[2] for p in op_out_proxies}
                out_bytes = sum(out_sizes.values())
                is_input = unit_kind == "input"
                is_param = is_input and any(
                    tensors.get(o) is not None and tensors[o].kind == "param" for o in op_outs
                )
                label_outs = ", ".join(op_outs[:2]) + (", ..." if len(op_outs) > 2 else "")
                graph.add_node(
                    node_id,
                    label=f"{label_outs} = {okind}" if op_outs else okind,
                    kind=okind,
                    region=region_name,
                    unit=unit_index,
                    phase=phase,
                    inputs=op_ins,
                    outputs=op_outs,
                    output_bytes=tuple(out_sizes[name] for name in op_outs),
                    bytes=out_bytes,
                    flops=flops,
                    tags=tags,
                    fusible=okind in NVFUSER_FUSIBLE_PRIMS,
                    is_input=is_input,
                    is_param=is_param,
                )
                for name in op_ins:
                    src = local_producer.get(name, producer_node.get(name))
                    if src is None or src == node_id:
                        continue
                    info = tensors.get(name)
                    nbytes = info.bytes if info is not None else 0
                    if graph.has_edge(src, node_id):
                        data = graph.edges[src, node_id]
                        data["tensors"] = data["tensors"] + (name,)
                        data["bytes"] += nbytes
                        if info is not None and nbytes > _edge_main_bytes(data, tensors):
                            _set_main_tensor(data, info, graph.nodes[src])
                    else:
                        data = {"tensors": (name,), "bytes": nbytes}
                        if info is not None:
                            _set_main_tensor(data, info, graph.nodes[src])
                        graph.add_edge(src, node_id, **data)
                for name in op_outs:
                    local_producer[name] = node_id
                alias_base = None
                if unit_kind == "op" and "view" in tags and op_ins:
                    # A stand-alone view shares its input's storage (inside a region every output is fresh).
                    base_info = tensors.get(op_ins[0])
                    alias_base = (base_info.alias_of or op_ins[0]) if base_info is not None else op_ins[0]
                for p in op_out_proxies:
                    if unit_kind == "input":
                        existing = tensors.get(p.name)
                        if existing is not None:
                            tensors[p.name] = replace(existing, producer_unit=unit_index, producer_node=node_id)
                            continue
                        register_tensor(p, "input", unit_index, node_id, phase)
                    elif unit_kind == "cotangent":
                        register_tensor(p, "cotangent", unit_index, node_id, phase)
                    elif unit_kind == "region" and p.name in tensors:
                        # Thunder's own rematerialization recomputes values under their original names
                        # inside backward regions; the first (visible) producer keeps the name.
                        continue
                    else:
                        register_tensor(p, "activation", unit_index, node_id, phase, alias_base)
                nodes.append(node_id)
                op_bsyms.append(op)
                unit_flops += flops
                unit_tags |= tags
                node_id += 1
            if unit_kind == "region":
                for p in bsym.flat_proxy_outs:
                    info = tensors.get(p.name)
                    if info is None or info.producer_unit != unit_index:
                        register_tensor(p, "activation", unit_index, local_producer.get(p.name), phase)
            for name in outs:
                if name in local_producer:
                    producer_node[name] = local_producer[name]
            units.append(
                Unit(
                    index=unit_index,
                    name=bsym.sym.name,
                    kind=unit_kind,
                    phase=phase,
                    inputs=ins,
                    outputs=outs,
                    nodes=tuple(nodes),
                    flops=unit_flops,
                    tags=frozenset(unit_tags),
                )
            )

        graph.graph["tensors"] = tensors
        graph.graph["forward_outputs"] = forward_outputs
        return cls(
            units,
            tensors,
            graph,
            forward_outputs=forward_outputs,
            gradients=gradients,
            is_joint=is_joint,
            explicit_saved=explicit_saved,
            trace=trace,
            op_bsyms=op_bsyms,
            unit_bsyms=[r[0] for r in raw],
        )

    # ------------------------------------------------------------------ views
    def regions(self) -> nx.DiGraph:
        """The unit-level producer/consumer graph: one node per fusion region or stand-alone op (inputs,
        cotangent reads and the return are left out).  Node attributes: ``kind``, ``phase``, ``ops``
        (number of ops), ``flops``, ``output_bytes``; edge attributes: ``tensors`` and ``bytes``."""
        g = nx.DiGraph()
        producer_unit: dict[str, int] = {}
        for unit in self.units:
            if unit.kind in ("input", "cotangent", "return"):
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
        forward = [u.index for u in self.units if u.phase == FORWARD and u.kind != "return"]
        backward = [u.index for u in self.units if u.phase == BACKWARD and u.kind != "return"]
        tail = [u.index for u in self.units if u.kind == "return"]
        return forward + backward + tail


def _edge_main_bytes(data: dict, tensors: dict[str, TensorInfo]) -> int:
    main = data.get("tensor")
    return tensors[main].bytes if main in tensors else 0


def _set_main_tensor(data: dict, info: TensorInfo, producer: dict) -> None:
    data["tensor"] = info.name
    data["shape"] = info.shape
    data["dtype"] = info.dtype
    data["phase"] = info.phase
    data["is_param"] = info.kind == "param"
    data["producer_tags"] = producer.get("tags", frozenset())
