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
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import networkx as nx

from remat import _compat
from remat.errors import UnsupportedTraceError
from remat.strides import VIEW_KINDS, contiguous_strides, is_contiguous, view_strides
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
from thunder.core.symbol import BoundSymbol, has_tags  # noqa: E402
from thunder.core.trace import TraceCtx, TraceTag  # noqa: E402

__all__ = ["FusionGraph", "Op", "TensorInfo", "Unit", "op_kind", "split_phases"]

FORWARD = "forward"
BACKWARD = "backward"


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


_VIEWISH_KINDS = VIEW_KINDS | {"shallow_copy"}
_VIEW_PRIM_NAMES = {
    "reshape": "reshape", "transpose": "transpose", "slice_prim": "slice", "squeeze": "squeeze",
    "broadcast_in_dim": "broadcast_in_dim", "shallow_copy": "shallow_copy",
}


def op_kind(bsym: BoundSymbol) -> str:
    """The op kind remat classifies by: the lower-case PrimIDs name for prims, else the symbol id."""
    sym_id = bsym.sym.id
    if isinstance(sym_id, prims.PrimIDs):
        return sym_id.name.lower()
    if bsym.sym.is_fusion:
        return "fusion"
    return str(sym_id)


#: Ops that must stay even when nothing reads their outputs.
SIDE_EFFECT_KINDS = frozenset({"copy_", "get_and_update_rng_state", "update_aliases", "sink"})


_SIDE_EFFECT_TAGS = frozenset({prims.OpTags.DONT_DCE, prims.OpTags.IN_PLACE})


def _has_side_effect_tags(bsym: BoundSymbol) -> bool:
    if not bsym.subsymbols and not bsym.tags:  # the common case (a prim in a region): the symbol's tags
        tags = bsym.sym.tags
        return bool(tags) and not _SIDE_EFFECT_TAGS.isdisjoint(tags)
    return has_tags(bsym, set(_SIDE_EFFECT_TAGS))


_SYMBOL_FACTS: dict[Any, tuple[str, frozenset[str], bool]] = {}


def _symbol_facts(bsym: BoundSymbol) -> tuple[str, frozenset[str], bool]:
    """(kind, tags, fusible) of a bound symbol's symbol, cached per symbol."""
    sym = bsym.sym
    try:
        return _SYMBOL_FACTS[sym]
    except (KeyError, TypeError):
        pass
    kind = op_kind(bsym)
    facts = (kind, op_tags(kind, _thunder_tags(bsym)), kind in NVFUSER_FUSIBLE_PRIMS)
    if not sym.is_fusion:  # fusion symbols are made per region; don't keep them alive
        try:
            _SYMBOL_FACTS[sym] = facts
        except TypeError:
            pass
    return facts


def _thunder_tags(bsym: BoundSymbol) -> tuple[str, ...]:
    tags = bsym.sym.tags or ()
    return tuple(t.name.lower() for t in tags if hasattr(t, "name"))


def _tensor_facts(proxy: Proxy) -> tuple[tuple[int, ...], str, int]:
    if isinstance(proxy, TensorProxy):
        # ``_shape`` is what the public ``shape`` property returns outside symbolic tracing; reading it
        # directly skips a compile-data lookup per call (this runs for every tensor of every trace).
        shape = tuple(getattr(proxy, "_shape", None) or proxy.shape)
        numel = 1
        for d in shape:
            if type(d) is not int:
                dims = ", ".join(str(d) if type(d) is int else getattr(d, "name", "?") for d in shape)
                raise UnsupportedTraceError(
                    f"tensor {proxy.name} has a symbolic shape ({dims}); remat models static shapes only "
                    "(trace with thunder.jit's default cache option, not 'symbolic values')"
                )
            numel *= d
        dtype = proxy.dtype
        return shape, _dtype_name(dtype), numel * dtype.bytes
    return (), type(proxy).__name__, 0


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        short = getattr(dtype, "shortname", None)
        name = _DTYPE_NAMES[dtype] = short() if callable(short) else str(dtype)
    return name


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


class Op(NamedTuple):
    """One operation: a node of :attr:`FusionGraph.nx` (see the module docstring for the fields).

    ``input_nodes[i]`` is the node that wrote ``inputs[i]`` (None where no node did).  ``recompute``,
    ``savable`` and ``output_costs`` are only set for plain graphs given to :func:`remat.solve`.
    ``side_effect``: the op must run even when nothing reads its outputs (in-place updates, RNG state).
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

    @property
    def label(self) -> str:
        if not self.outputs:
            return self.kind
        shown = ", ".join(self.outputs[:2]) + (", ..." if len(self.outputs) > 2 else "")
        return f"{shown} = {self.kind}"


class FusionGraph:
    """The producer/consumer structure of a Thunder trace (see the module docstring for attributes)."""

    def __init__(
        self,
        units: list[Unit],
        tensors: dict[str, TensorInfo],
        ops: list[Op] | None = None,
        *,
        forward_outputs: tuple[str, ...] = (),
        gradients: tuple[str, ...] = (),
        is_joint: bool = False,
        explicit_saved: tuple[str, ...] | None = None,
        trace: TraceCtx | None = None,
        op_bsyms: list[BoundSymbol] | None = None,
        unit_bsyms: list[BoundSymbol] | None = None,
        strides: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.units = units
        self.tensors = tensors
        #: Operation records in execution order of the trace (node id == index); None when built with
        #: ``ops=False`` (memory model only).
        self.ops = ops
        self.forward_outputs = forward_outputs
        self.gradients = gradients
        self.is_joint = is_joint
        self.explicit_saved = explicit_saved
        self.trace = trace
        #: Thunder bound symbols behind op nodes (by node id) and units (by unit index); None for plain graphs.
        self.op_bsyms = op_bsyms
        self.unit_bsyms = unit_bsyms
        #: Strides of the values that are non-contiguous views (:mod:`remat.strides`); others are contiguous.
        self.strides = strides or {}
        self._view_ops: frozenset[int] | None = None
        self._facts: dict[str, tuple] = {}  # per-name shape/dtype/bytes read from the trace
        self._region_views: dict[int, tuple] = {}  # id(region bsym) -> (bsym, {view: base}); see _from_trace
        #: True for graphs made from a plain networkx graph (save costs then come from op records)
        self.plain = False
        self._nx: nx.DiGraph | None = None

    def __repr__(self) -> str:
        regions = sum(1 for u in self.units if u.kind == "region")
        ops = len(self.ops) if self.ops is not None else "?"
        return (
            f"FusionGraph({ops} ops, {regions} regions, {len(self.units)} units, "
            f"{'joint' if self.is_joint else 'single-phase'})"
        )

    @property
    def view_ops(self) -> frozenset[int]:
        """Op nodes that return a view of their one tensor input rather than fresh storage
        (:mod:`remat.strides`): stand-alone views whose output aliases, and view ops inside regions.  What
        decides which outputs of a rewritten region alias other values (computed on first use)."""
        if self._view_ops is None:
            found: set[int] = set()
            if self.ops is not None and self.op_bsyms is not None:
                strides = dict(self.strides)
                for op in self.ops:
                    if op.region is None:
                        if "view" in op.tags and any(self.tensors.get(o) is not None and self.tensors[o].alias_of is not None for o in op.outputs):
                            found.add(op.id)
                    elif op.kind in _VIEWISH_KINDS and _member_view(self.op_bsyms[op.id], op.kind, strides, _static_shape) is not None:
                        found.add(op.id)
            self._view_ops = frozenset(found)
        return self._view_ops

    @property
    def nx(self) -> nx.DiGraph:
        """The op-level ``networkx.DiGraph`` (built on first use from :attr:`ops`)."""
        if self._nx is None:
            if self.ops is None:
                raise ValueError("this FusionGraph was built with ops=False; build it with FusionGraph.from_trace(trace)")
            self._nx = _build_nx(self.ops, self.tensors, self.forward_outputs)
        return self._nx

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_trace(cls, trace: TraceCtx, *, ops: bool = True) -> FusionGraph:
        """Build the graph of a Thunder trace (joint forward+backward, forward-only, or fused).
        With ``ops=False`` only units and tensors are read (enough for the memory model, and faster)."""
        return cls._from_trace(trace, ops)

    @classmethod
    def _from_trace(cls, trace: TraceCtx, with_ops: bool, derived_from: FusionGraph | None = None) -> FusionGraph:
        """``derived_from``: a graph of the trace this one was rewritten from (remat's own rewrite), whose
        per-name tensor facts and per-region views it may reuse: a rewrite gives new values new names and
        keeps unchanged regions as the same bound symbols."""
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
            outs = tuple(dict.fromkeys(p.name for p in bsym.flat_proxy_outs))
            if unit_kind in ("input", "cotangent"):
                # unpack_trivial "reads" the name it defines; get_grad names the forward output whose
                # cotangent it reads, but does not read that output's data.
                ins: tuple[str, ...] = ()
            else:
                ins = tuple(dict.fromkeys(p.name for p in bsym.flat_proxy_args))
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

        # ---- tensors and op records
        tensors: dict[str, TensorInfo] = {}
        ops: list[Op] = []
        op_bsyms: list[BoundSymbol] = []  # node id -> the bound symbol it stands for
        producer_node: dict[str, int] = {}  # producers visible at unit level
        units: list[Unit] = []
        facts_cache: dict[str, tuple[tuple[int, ...], str, int]] = {}
        strides: dict[str, tuple[int, ...]] = {}  # views that are not contiguous in memory (see remat.strides)
        known_views: dict[int, tuple[BoundSymbol, dict[str, str]]] = {}  # id(region bsym) -> (bsym, views)
        if derived_from is not None:
            facts_cache.update(derived_from._facts)
            strides.update(derived_from.strides)
            known_views = derived_from._region_views
        region_views_by_id: dict[int, tuple[BoundSymbol, dict[str, str]]] = {}

        def facts(proxy: Proxy) -> tuple[tuple[int, ...], str, int]:
            cached = facts_cache.get(proxy.name)
            if cached is None:
                cached = facts_cache[proxy.name] = _tensor_facts(proxy)
            return cached

        def shape_of(proxy: Proxy) -> tuple[int, ...]:
            cached = facts_cache.get(proxy.name)
            # region-internal values are never registered: read their shape without the other facts
            return cached[0] if cached is not None else tuple(getattr(proxy, "_shape", None) or proxy.shape)

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
            if not with_ops:
                known = known_views.get(id(bsym))
                views = known[1] if known is not None and known[0] is bsym else None
                cls._register_unit_outputs(bsym, kind, unit_kind, ins, unit_index, phase, tensors, register_tensor, strides, shape_of, views)
                units.append(Unit(unit_index, bsym.sym.name, unit_kind, phase, ins, outs, (), 0))
                continue
            nodes: list[int] = []
            members = list(bsym.subsymbols) if unit_kind == "region" else [bsym]
            region_name = bsym.sym.name if unit_kind == "region" else None
            local_producer: dict[str, int] = {}
            region_views = _region_views(members, ins, outs, tensors, strides, shape_of) if unit_kind == "region" else {}
            unit_flops = 0
            unit_tags: set[str] = set()
            for op in members:
                okind, tags, fusible = _symbol_facts(op)
                if (okind in BOOKKEEPING_KINDS or okind == RETURN_KIND) and unit_kind != "return":
                    continue
                node_id = len(ops)
                # (proxy names are a property: read each once)
                arg_proxies = op.flat_proxy_args
                arg_names = [p.name for p in arg_proxies]
                if unit_kind in ("input", "cotangent"):
                    op_ins = ins
                else:
                    op_ins = tuple(dict.fromkeys(arg_names))
                op_out_proxies = []
                out_sizes = {}
                out_shapes = []
                for p in op.flat_proxy_outs:
                    name = p.name
                    if name in op_ins:
                        continue
                    op_out_proxies.append(p)
                    known = facts_cache.get(name) or facts(p)
                    out_sizes[name] = known[2]
                    if isinstance(p, TensorProxy):
                        out_shapes.append(known[0])
                op_outs = tuple(out_sizes)
                in_shapes = [
                    (facts_cache.get(n) or facts(p))[0] for p, n in zip(arg_proxies, arg_names) if isinstance(p, TensorProxy)
                ]
                flops = estimate_flops(okind, tags, in_shapes, out_shapes, backward=phase == BACKWARD)
                is_input = unit_kind == "input"
                ops.append(
                    Op(
                        id=node_id,
                        kind=okind,
                        unit=unit_index,
                        region=region_name,
                        phase=phase,
                        inputs=op_ins,
                        input_nodes=tuple(local_producer.get(n, producer_node.get(n)) for n in op_ins),
                        outputs=op_outs,
                        output_bytes=tuple(out_sizes.values()),
                        flops=flops,
                        tags=tags,
                        fusible=fusible,
                        is_input=is_input,
                        is_param=is_input and any(t in tensors and tensors[t].kind == "param" for t in op_outs),
                        side_effect=okind in SIDE_EFFECT_KINDS or _has_side_effect_tags(op),
                    )
                )
                op_bsyms.append(op)
                for name in op_outs:
                    local_producer[name] = node_id
                alias_base = None
                if unit_kind == "op" and "view" in tags and op_ins:
                    alias_base = _view_base(op, okind, op_ins[0], tensors, strides, shape_of)
                for p in op_out_proxies:
                    if unit_kind == "input":
                        existing = tensors.get(p.name)
                        if existing is not None:
                            tensors[p.name] = existing._replace(producer_unit=unit_index, producer_node=node_id)
                            continue
                        register_tensor(p, "input", unit_index, node_id, phase)
                    elif unit_kind == "cotangent":
                        register_tensor(p, "cotangent", unit_index, node_id, phase)
                    elif unit_kind == "region" and p.name in tensors:
                        # Thunder's own rematerialization recomputes values under their original names
                        # inside backward regions; the first (visible) producer keeps the name.
                        continue
                    else:
                        register_tensor(p, "activation", unit_index, node_id, phase, alias_base or region_views.get(p.name))
                nodes.append(node_id)
                unit_flops += flops
                unit_tags |= tags
            if unit_kind == "region":
                for p in bsym.flat_proxy_outs:
                    info = tensors.get(p.name)
                    if info is None or info.producer_unit != unit_index:
                        register_tensor(p, "activation", unit_index, local_producer.get(p.name), phase, region_views.get(p.name))
            if unit_kind == "region":
                region_views_by_id[id(bsym)] = (bsym, region_views)
            for name in outs:
                if name in local_producer:
                    producer_node[name] = local_producer[name]
            units.append(
                Unit(unit_index, bsym.sym.name, unit_kind, phase, ins, outs, tuple(nodes), unit_flops, frozenset(unit_tags))
            )

        graph = cls(
            units,
            tensors,
            ops if with_ops else None,
            forward_outputs=forward_outputs,
            gradients=gradients,
            is_joint=is_joint,
            explicit_saved=explicit_saved,
            trace=trace,
            op_bsyms=op_bsyms if with_ops else None,
            unit_bsyms=[r[0] for r in raw],
            strides=strides,
        )
        graph._facts = facts_cache
        graph._region_views = region_views_by_id
        return graph

    @staticmethod
    def _register_unit_outputs(bsym, kind, unit_kind, ins, unit_index, phase, tensors, register_tensor, strides, shape_of, known_views=None) -> None:
        """Unit-level tensor registration for ``ops=False`` graphs (what the memory model reads)."""
        alias_base = None
        region_views: dict[str, str] = {}
        if unit_kind == "op" and ins and "view" in op_tags(kind, _thunder_tags(bsym)):
            alias_base = _view_base(bsym, kind, ins[0], tensors, strides, shape_of)
        elif unit_kind == "region" and known_views is not None:
            region_views = known_views
        elif unit_kind == "region":
            region_views = _region_views(bsym.subsymbols, ins, (p.name for p in bsym.flat_proxy_outs), tensors, strides, shape_of)
        for p in bsym.flat_proxy_outs:
            if p.name in ins:
                continue
            if unit_kind == "input":
                existing = tensors.get(p.name)
                if existing is not None:
                    tensors[p.name] = existing._replace(producer_unit=unit_index)
                    continue
                register_tensor(p, "input", unit_index, None, phase)
            elif unit_kind == "cotangent":
                register_tensor(p, "cotangent", unit_index, None, phase)
            else:
                register_tensor(p, "activation", unit_index, None, phase, alias_base or region_views.get(p.name))

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


def _alias_base(name: str, tensors: dict[str, TensorInfo]) -> str:
    """The tensor whose storage ``name`` lives in (following earlier aliases)."""
    info = tensors.get(name)
    return (info.alias_of or name) if info is not None else name


def _static_shape(proxy: TensorProxy) -> tuple[int, ...]:
    return tuple(getattr(proxy, "_shape", None) or proxy.shape)


def _view_layout(kind: str, args: Sequence, source: str, out_name: str, in_shape, out_shape, strides: dict) -> bool:
    """Whether view-kind op ``kind`` returns a view of its input ``source`` (False: a reshape no strides
    can express, which copies).  Records in ``strides`` the strides of a non-contiguous output."""
    in_strides = strides.get(source)
    if in_strides is None:  # a contiguous input: these stay contiguous views
        if kind in ("reshape", "squeeze", "shallow_copy"):
            return True
        in_strides = contiguous_strides(in_shape)
    if kind in VIEW_KINDS:
        out_strides = view_strides(kind, args, in_shape, in_strides, out_shape)
        if out_strides is None:
            return False
    else:  # other aliasing ops (shallow_copy, ...) keep the layout
        out_strides = in_strides if tuple(in_shape) == tuple(out_shape) else contiguous_strides(out_shape)
    if not is_contiguous(out_shape, out_strides):
        strides[out_name] = out_strides
    return True


def _view_base(bsym: BoundSymbol, kind: str, source: str, tensors: dict[str, TensorInfo], strides: dict, shape_of) -> str | None:
    """Storage a stand-alone view op's output lives in, following PyTorch: a view shares its input's
    storage, except a ``reshape`` that no strides over the input can express, which copies (returns
    None: fresh storage).  ``shape_of(proxy)`` gives static shapes."""
    out = next((p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)), None)
    inp = bsym.flat_proxy_args[0] if bsym.flat_proxy_args else None
    if out is None or not isinstance(inp, TensorProxy):
        return _alias_base(source, tensors)
    if not _view_layout(kind, bsym.args, source, out.name, shape_of(inp), shape_of(out), strides):
        return None
    return _alias_base(source, tensors)


def _member_view(op: BoundSymbol, kind: str, strides: dict, shape_of) -> tuple[str, list[str]] | None:
    """For a view-kind op inside a region that returns a view of its one tensor input: (that input's
    name, the output names); else None."""
    if kind not in _VIEWISH_KINDS:
        return None
    # view prims take the tensor first and shapes, dims or indices after; they write one tensor
    source, out = (op.args[0] if op.args else None), op.output
    if not isinstance(source, TensorProxy) or not isinstance(out, TensorProxy) or out.name == source.name:
        return None
    if not _view_layout(kind, op.args, source.name, out.name, shape_of(source), shape_of(out), strides):
        return None
    return source.name, [out.name]


def region_view_outputs(
    graph: FusionGraph, nodes: Sequence[int], inputs: Iterable[str], outputs: Iterable[str], base_of
) -> dict[str, str]:
    """For a region made of op ``nodes`` (in order) of ``graph``: the values it computes by view ops
    alone from its ``inputs`` or ``outputs``, each with the storage it lives in (``base_of(name)`` for
    the name a chain starts from).  The op-level counterpart of the rule in :func:`_region_views`."""
    sources = set(inputs) | set(outputs)
    views: dict[str, str] = {}
    for n in nodes:
        if n not in graph.view_ops:
            continue
        op = graph.ops[n]
        tensor_inputs = [a for a in op.inputs if a in graph.tensors and graph.tensors[a].kind != "number"]
        if len(tensor_inputs) != 1:
            continue
        source = tensor_inputs[0]
        if source in views:
            base = views[source]
        elif source in sources:
            base = base_of(source)
        else:
            continue
        for out in op.outputs:
            views[out] = base
    return views


def _region_views(
    members: Sequence[BoundSymbol],
    region_inputs: Iterable[str],
    region_outputs: Iterable[str],
    tensors: dict[str, TensorInfo],
    strides: dict,
    shape_of,
) -> dict[str, str]:
    """Values a fusion region computes by view ops alone from its inputs or from its other outputs, with
    the storage each lives in (``name -> base``).  nvFuser returns such an output as an alias of that
    input or output rather than a new buffer (so does the torch reference backend), so keeping it keeps
    the base's storage alive; see :mod:`remat.strides`."""
    sources = set(region_inputs) | set(region_outputs)
    views: dict[str, str] = {}
    for op in members:
        # the view prims by symbol name (a plain attribute; op_kind reads an enum, slower at this volume)
        kind = _VIEW_PRIM_NAMES.get(op.sym.name)
        if kind is None or not op.args or not isinstance(op.sym.id, prims.PrimIDs):
            continue
        source = op.args[0]
        # only chains that start at an input or output matter here: test that before the layout
        if not isinstance(source, TensorProxy) or (source.name not in views and source.name not in sources):
            continue
        found = _member_view(op, kind, strides, shape_of)
        if found is None:
            continue
        base = views.get(found[0]) or _alias_base(found[0], tensors)
        for name in found[1]:
            views[name] = base
    return views


def _build_nx(ops: list[Op], tensors: dict[str, TensorInfo], forward_outputs: tuple[str, ...]) -> nx.DiGraph:
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
