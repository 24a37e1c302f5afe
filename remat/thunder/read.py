"""Stage 2, *graph*: a Thunder trace read into the IR (:class:`remat.core.ir.FusionGraph`).

:func:`read_trace` (``remat.read_trace``) reads a trace once, in phases:

1. *units*: one per top-level bound symbol (comments and deletes carry no data), with what it reads and
   writes; the forward outputs and gradients from the return;
2. *phases*: forward or backward, by Thunder's split rule (:func:`remat.core.ir.split_phases`);
3. *tensors and operations*: every value as a :class:`~remat.core.ir.TensorInfo` (views resolved to the
   storage they keep alive by the rules of :mod:`remat.core.views`), every operation as an
   :class:`~remat.core.ir.Op`;
4. the frozen :class:`FusionGraph`, whose ``origin`` (:class:`TraceOrigin`) keeps the bound symbols
   behind its ops and units for the rewrite.

Names a person can read (:func:`module_names`, the graph's ``naming``) are worked out only when asked
for (``FusionGraph.module_names``), so planning does not pay for them: dotted parameter names from the
provenance Thunder records on each parameter proxy (exact), and the module of every op (exact for ops
that read a parameter or write its gradient, inferred for the others; docs/concepts.md, "Names").

The one place that maps a bound symbol to an op kind is :func:`op_kind`; its tags and fusibility come
from the op table (:mod:`remat.core.ops`) through :func:`symbol_facts`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import thunder  # noqa: F401  (remat.thunder applied the compat bridge first)
from thunder.core import prims
from thunder.core.interpreter import PseudoInst
from thunder.core.jit_ext import (
    EXT_FLAG_IS_MODULE,
    get_parameter_or_buffer_or_submodule_name_and_root,
)
from thunder.core.proxies import FutureTensorProxy, NumberProxy, Proxy, ProxyTag, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol, has_tags
from thunder.core.trace import TraceCtx, TraceTag
from thunder.distributed import prims as dist_prims
from thunder.executors import pythonex, torchex

from remat.core.donation import with_donations
from remat.core.ir import (
    BACKWARD,
    FORWARD,
    ROOT_MODULE,
    FusionGraph,
    ModuleNames,
    Op,
    TensorInfo,
    Unit,
    common_module,
    parameter_module,
    split_phases,
)
from remat.core.ops import (
    ALIASING_PRIMS,
    ALL_GATHER_KINDS,
    BOOKKEEPING_KINDS,
    COTANGENT_KIND,
    FUSION_KIND,
    INPUT_KINDS,
    NVFUSER_FUSIBLE_PRIMS,
    REGATHER_TAG,
    RETURN_KIND,
    SIDE_EFFECT_KINDS,
    WAIT_KINDS,
    estimate_flops,
    is_known_kind,
    op_tags,
    regather_tags,
)
from remat.core.views import (
    ViewFacts,
    alias_base,
    member_view,
    region_views,
    view_layout,
)
from remat.core.strides import is_contiguous, token_major_strides
from remat.errors import UnsupportedTraceError
from remat.thunder.attention import attention_operands

__all__ = [
    "TraceOrigin", "read_trace", "op_kind", "symbol_facts", "tensor_facts", "check_trace", "parameter_names",
    "module_names", "random_draws",
]


@dataclass(frozen=True, eq=False)
class TraceOrigin:
    """What a trace graph was read from: the trace, the bound symbol behind each op node (by node id)
    and each unit (by unit index), and caches a re-read of a rewritten trace may reuse (per-name tensor
    facts; the views of each region bound symbol, by ``id``)."""

    trace: TraceCtx
    op_bsyms: tuple[BoundSymbol, ...] | None
    unit_bsyms: tuple[BoundSymbol, ...]
    facts: dict[str, tuple[tuple[int, ...], str, int]] = field(default_factory=dict)
    region_views: dict[int, tuple[BoundSymbol, dict[str, str]]] = field(default_factory=dict)
    token_major_attention: bool = False  # read_trace's argument of that name
    donate_dying_inputs: bool = False  # read_trace's argument of that name


def op_kind(bsym: BoundSymbol) -> str:
    """The op kind remat classifies by: the lower-case PrimIDs name for prims (Thunder's distributed
    prims, an enum of their own, included: ``"all_gather"``, ``"wait"``), ``"fusion"`` for fusion
    regions, else the symbol id."""
    sym_id = bsym.sym.id
    if isinstance(sym_id, (prims.PrimIDs, dist_prims.PrimIDs)):
        return sym_id.name.lower()
    if bsym.sym.is_fusion:
        return FUSION_KIND
    return str(sym_id)


@functools.lru_cache(maxsize=1)
def thunder_kinds() -> frozenset[str]:
    """Names of Thunder's prims and of the operators its torch and Python executors register: ops whose
    meaning Thunder defines (functional, apart from the in-place family)."""
    return frozenset(p.name.lower() for p in prims.PrimIDs) | frozenset(torchex.ex.opmap) | frozenset(pythonex.ex.opmap)


_SYMBOL_FACTS: dict[Any, tuple[str, frozenset[str], bool]] = {}


def symbol_facts(bsym: BoundSymbol) -> tuple[str, frozenset[str], bool]:
    """``(kind, tags, fusible)`` of a bound symbol's symbol, from the op table; cached per symbol."""
    sym = bsym.sym
    try:
        return _SYMBOL_FACTS[sym]
    except (KeyError, TypeError):
        pass
    kind = op_kind(bsym)
    thunder_tags = tuple(t.name.lower() for t in (sym.tags or ()) if hasattr(t, "name"))
    known = is_known_kind(kind) or kind in thunder_kinds()
    facts = (kind, op_tags(kind, thunder_tags, known=known), kind in NVFUSER_FUSIBLE_PRIMS)
    if not sym.is_fusion:  # fusion symbols are made per region; don't keep them alive
        try:
            _SYMBOL_FACTS[sym] = facts
        except TypeError:
            pass
    return facts


_SIDE_EFFECT_TAGS = frozenset({prims.OpTags.DONT_DCE, prims.OpTags.IN_PLACE})


def _has_side_effect(bsym: BoundSymbol, kind: str) -> bool:
    if kind in SIDE_EFFECT_KINDS:
        return True
    if not bsym.subsymbols and not bsym.tags:  # the common case (a prim in a region): the symbol's tags
        tags = bsym.sym.tags
        return bool(tags) and not _SIDE_EFFECT_TAGS.isdisjoint(tags)
    return has_tags(bsym, set(_SIDE_EFFECT_TAGS))


def _symbolic_shape_message(proxy: TensorProxy, shape: Sequence[Any]) -> str:
    """Why a tensor with a symbolic shape cannot be planned (one message for every place that refuses it)."""
    dims = ", ".join(str(d) if type(d) is int else getattr(d, "name", "?") for d in shape)
    return (
        f"tensor {proxy.name} has a symbolic shape ({dims}); remat plans static shapes only "
        "(trace with thunder.jit's default cache option, not 'symbolic values')"
    )


def tensor_facts(proxy: Proxy) -> tuple[tuple[int, ...], str, int]:
    """``(shape, dtype name, bytes)`` of a proxy (numbers: ``((), type name, 0)``; a collective's future:
    its tensor's shape and dtype, 0 bytes, since the memory model counts the buffer from its wait).
    Raises :class:`remat.UnsupportedTraceError` for symbolic shapes."""
    if isinstance(proxy, FutureTensorProxy):
        _future_bytes(proxy)  # refuses symbolic shapes
        return tuple(proxy.shape), _dtype_name(proxy.dtype), 0
    if isinstance(proxy, TensorProxy):
        # ``_shape`` is what the public ``shape`` property returns outside symbolic tracing; reading it
        # directly skips a compile-data lookup per call (this runs for every tensor of every trace).
        shape = tuple(getattr(proxy, "_shape", None) or proxy.shape)
        numel = 1
        for d in shape:
            if type(d) is not int:
                raise UnsupportedTraceError(_symbolic_shape_message(proxy, shape))
            numel *= d
        dtype = proxy.dtype
        return shape, _dtype_name(dtype), numel * dtype.bytes
    return (), type(proxy).__name__, 0


def _future_bytes(proxy: FutureTensorProxy) -> int:
    """Bytes of the tensor a collective's future will hold (the memory model counts the future itself
    as 0 bytes: its buffer is counted from its wait)."""
    shape = tuple(getattr(proxy, "_shape", None) or proxy.shape)
    if any(type(d) is not int for d in shape):
        raise UnsupportedTraceError(_symbolic_shape_message(proxy, shape))
    count = 1
    for d in shape:
        count *= d
    return count * proxy.dtype.bytes


def random_draws(trace: TraceCtx) -> list[str]:
    """The values drawn by stateful random ops (``"rng"`` tag: e.g. ``uniform`` on the CPU), in the order
    the trace draws them (inside regions too).  Two traces draw the same numbers from the same generator
    state only if these lists are equal: a pass that reorders them changes every mask after the first
    swap (stateless ``uniform_philox`` is not listed: its seed and offset fix its numbers)."""
    draws: list[str] = []
    for bsym in trace.bound_symbols:
        for sub in bsym.subsymbols if bsym.sym.is_fusion else (bsym,):
            if "rng" in symbol_facts(sub)[1]:
                draws.extend(p.name for p in sub.flat_proxy_outs)
    return draws


def check_trace(trace: TraceCtx) -> str | None:
    """Why remat cannot plan ``trace`` (a tensor with a symbolic shape, from ``thunder.jit(...,
    cache="symbolic values")``), else None.  Reads only shapes: cheap enough to run before anything."""

    def check(proxy) -> str | None:
        if isinstance(proxy, TensorProxy):
            shape = getattr(proxy, "_shape", None) or ()
            if any(type(d) is not int for d in shape):
                return _symbolic_shape_message(proxy, shape)
        return None

    for proxy in trace.args:
        found = check(proxy)
        if found:
            return found
    for bsym in trace.bound_symbols:
        for proxy in bsym.flat_proxy_outs:
            found = check(proxy)
            if found:
                return found
    return None


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        short = getattr(dtype, "shortname", None)
        name = _DTYPE_NAMES[dtype] = short() if callable(short) else str(dtype)
    return name


def _static_shape(proxy: TensorProxy) -> tuple[int, ...]:
    return tuple(getattr(proxy, "_shape", None) or proxy.shape)


def _view_facts(bsym: BoundSymbol, kind: str, shape_of: Callable[[Proxy], tuple[int, ...]]) -> ViewFacts | None:
    """What the view rules need of an aliasing prim (view prims take the tensor first and shapes, dims
    or indices after, and write one tensor); None for other ops."""
    if kind not in ALIASING_PRIMS or not bsym.args:
        return None
    source, out = bsym.args[0], bsym.output
    if not isinstance(source, TensorProxy) or not isinstance(out, TensorProxy):
        return None
    return ViewFacts(source.name, out.name, shape_of(source), shape_of(out), (source.name, *bsym.args[1:]))


def _stand_alone_view_base(bsym: BoundSymbol, kind: str, source: str, tensors: dict, strides: dict, shape_of) -> str | None:
    """Storage a stand-alone view op's output lives in, following PyTorch: a view shares its input's
    storage, except a ``reshape`` that no strides over the input can express, which copies (None: fresh
    storage)."""
    out = next((p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)), None)
    inp = bsym.flat_proxy_args[0] if bsym.flat_proxy_args else None
    if out is None or not isinstance(inp, TensorProxy):
        return alias_base(source, tensors)
    if not view_layout(kind, ViewFacts(source, out.name, shape_of(inp), shape_of(out), tuple(bsym.args)), strides):
        return None
    return alias_base(source, tensors)


def _aliasing_members(bsyms: Iterable[BoundSymbol]) -> Iterator[tuple[str, tuple[str], tuple[str, BoundSymbol]]]:
    """``(source, (output,), (kind, bsym))`` for the aliasing prims among ``bsyms`` (names only: the
    layout facts are read later, and only for ops on a chain that matters)."""
    for bsym in bsyms:
        kind = symbol_facts(bsym)[0]
        if kind in ALIASING_PRIMS and bsym.args:
            source, out = bsym.args[0], bsym.output
            if isinstance(source, TensorProxy) and isinstance(out, TensorProxy):
                yield source.name, (out.name,), (kind, bsym)


_UNIT_KINDS = {RETURN_KIND: "return", COTANGENT_KIND: "cotangent"}


def read_trace(
    trace: TraceCtx,
    *,
    ops: bool = True,
    derived_from: FusionGraph | None = None,
    token_major_attention: bool | None = None,
    donate_dying_inputs: bool | None = None,
) -> FusionGraph:
    """Read a Thunder trace (joint forward+backward, forward-only, or fused) into a :class:`FusionGraph`.

    With ``ops=False`` only units and tensors are read (enough for the memory model, and faster).
    ``derived_from``: a graph of the trace this one was rewritten from (remat's own rewrite), whose
    per-name tensor facts and per-region views may be reused: a rewrite gives new values new names and
    keeps unchanged regions as the same bound symbols.
    ``token_major_attention``: the trace will run with attention's query, key and value laid out token by
    token where a region writes them (the graph runtime's layout, :func:`remat.core.strides.token_major_strides`):
    attention's output is then token-major too, so that the ``reshape`` of its transpose for the output
    projection is a view, not a copy.  None (the default): as ``derived_from`` was read, else False
    (every region output and attention output contiguous, as nvFuser's and Inductor's regions write them).
    ``donate_dying_inputs``: the trace will run where a region may write an output into the storage of an
    input that dies there (the graph runtime): the graph's ``donations`` say which
    (:func:`remat.core.donation.find_donations`), and the memory model counts no buffer for those outputs.
    None (the default): as ``derived_from`` was read, else False.

    Raises ``TypeError`` (not a trace) and :class:`remat.UnsupportedTraceError` (an empty trace, symbolic
    shapes)."""
    if not isinstance(trace, TraceCtx):
        hint = " Call remat.training_trace(module, *args) first." if callable(trace) else ""
        raise TypeError(f"expected a Thunder trace (thunder.core.trace.TraceCtx), got {type(trace).__name__}.{hint}")
    bsyms = list(trace.bound_symbols)
    if not bsyms:
        raise UnsupportedTraceError("the trace has no bound symbols")
    trace_args = {p.name: p for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)}

    # ---- phase 1: units, one per top-level bound symbol (comments and deletes carry no data)
    raw: list[tuple[BoundSymbol, str, str, tuple[str, ...], tuple[str, ...]]] = []
    for bsym in bsyms:
        kind = op_kind(bsym)
        if kind in BOOKKEEPING_KINDS:
            continue
        if kind in _UNIT_KINDS:
            unit_kind = _UNIT_KINDS[kind]
        elif kind in INPUT_KINDS:
            unit_kind = "input"
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
            explicit_saved = tuple(p.name for p in tree_flatten(return_bsym.args[1])[0] if isinstance(p, TensorProxy))
        except (IndexError, TypeError):
            explicit_saved = None

    # ---- phase 2: forward or backward
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

    # ---- phase 3: tensors and operations
    derived_origin = derived_from.origin if derived_from is not None else None
    if token_major_attention is None:
        token_major_attention = bool(getattr(derived_origin, "token_major_attention", False))
    if donate_dying_inputs is None:
        donate_dying_inputs = bool(getattr(derived_origin, "donate_dying_inputs", False))
    reader = _Reader(derived_from)
    for name, proxy in trace_args.items():
        is_param = isinstance(proxy, TensorProxy) and (
            proxy.requires_grad or ProxyTag.STATIC_MEMORY_LOCATION in getattr(proxy, "tags", ())
        )
        reader.register(proxy, "param" if is_param else "input", None, None, FORWARD)
    for unit_index, ((bsym, kind, unit_kind, ins, outs), phase) in enumerate(zip(raw, phases)):
        if ops:
            reader.read_unit_ops(unit_index, bsym, unit_kind, ins, outs, phase)
        else:
            reader.read_unit(unit_index, bsym, kind, unit_kind, ins, outs, phase)
        if token_major_attention and unit_kind == "op":
            reader.lay_out_attention_output(bsym)

    # ---- phase 4: the graph
    origin = TraceOrigin(
        trace,
        tuple(reader.op_bsyms) if ops else None,
        tuple(r[0] for r in raw),
        reader.facts_cache,
        reader.region_views_by_id,
        token_major_attention,
        donate_dying_inputs,
    )
    graph = FusionGraph(
        reader.units,
        reader.tensors,
        reader.ops if ops else None,
        forward_outputs=forward_outputs,
        gradients=gradients,
        is_joint=is_joint,
        explicit_saved=explicit_saved,
        strides=reader.strides,
        origin=origin,
        naming=module_names if ops else None,
    )
    if donate_dying_inputs:
        member_kinds = {i: tuple(op_kind(m) for m in r[0].subsymbols) for i, r in enumerate(raw) if r[2] == "region"}
        pinned = {p.name for r in raw for p in attention_operands(r[0])[1] if isinstance(p, TensorProxy)}
        with_donations(graph, member_kinds, pinned)
    return graph


class _Reader:
    """The state of phase 3 of :func:`read_trace`: tensors, ops and units as they are read."""

    def __init__(self, derived_from: FusionGraph | None) -> None:
        self.tensors: dict[str, TensorInfo] = {}
        self.ops: list[Op] = []
        self.op_bsyms: list[BoundSymbol] = []  # node id -> the bound symbol it stands for
        self.units: list[Unit] = []
        self.producer_node: dict[str, int] = {}  # producers visible at unit level
        self.facts_cache: dict[str, tuple[tuple[int, ...], str, int]] = {}
        self.strides: dict[str, tuple[int, ...]] = {}  # views that are not contiguous in memory
        self.known_views: dict[int, tuple[BoundSymbol, dict[str, str]]] = {}  # id(region) -> (region, views)
        self.region_views_by_id: dict[int, tuple[BoundSymbol, dict[str, str]]] = {}
        self.regather_futures: set[str] = set()  # futures of all-gathers tagged ``regather``
        origin = derived_from.origin if derived_from is not None else None
        if isinstance(origin, TraceOrigin):
            self.facts_cache.update(origin.facts)
            self.strides.update(derived_from.strides)
            self.known_views = origin.region_views

    def facts(self, proxy: Proxy) -> tuple[tuple[int, ...], str, int]:
        cached = self.facts_cache.get(proxy.name)
        if cached is None:
            cached = self.facts_cache[proxy.name] = tensor_facts(proxy)
        return cached

    def shape_of(self, proxy: Proxy) -> tuple[int, ...]:
        cached = self.facts_cache.get(proxy.name)
        # region-internal values are not always registered: read their shape without the other facts
        return cached[0] if cached is not None else _static_shape(proxy)

    def register(self, proxy: Proxy, kind: str, unit_index: int | None, node: int | None, phase: str, alias_of=None) -> None:
        # Futures are values too (0 bytes): the layout must see that a recomputed wait needs its future.
        if not isinstance(proxy, (TensorProxy, NumberProxy, FutureTensorProxy)):
            return
        shape, dtype, nbytes = self.facts(proxy)
        if isinstance(proxy, NumberProxy):
            kind = "number"
        self.tensors[proxy.name] = TensorInfo(proxy.name, shape, dtype, nbytes, kind, unit_index, node, phase, alias_of)

    def regather_facts(self, bsym: BoundSymbol, kind: str, tags: frozenset[str]) -> tuple[frozenset[str], int]:
        """The tags of a stand-alone op with ``regather`` added where the op table's rule
        (:func:`remat.core.ops.regather_tags`) says so, from this graph's facts: an all-gather whose tensor
        input is a trace input, or the wait reading such an all-gather's future.  Also the bytes that
        all-gather brings in (its future's tensor: what the FLOP-equivalent price is of), else 0."""
        if kind in ALL_GATHER_KINDS:
            sources = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
            source = self.tensors.get(sources[0].name) if len(sources) == 1 else None
            reads_input = source is not None and source.kind in ("param", "input")
            tags = regather_tags(kind, tags, reads_graph_input=reads_input)
            if REGATHER_TAG not in tags:
                return tags, 0
            futures = [p for p in bsym.flat_proxy_outs if isinstance(p, FutureTensorProxy)]
            self.regather_futures.update(p.name for p in futures)
            return tags, sum(_future_bytes(p) for p in futures)
        if kind in WAIT_KINDS:
            futures = [p.name for p in bsym.flat_proxy_args if isinstance(p, FutureTensorProxy)]
            completes = len(futures) == 1 and futures[0] in self.regather_futures
            return regather_tags(kind, tags, completes_regather=completes), 0
        return tags, 0

    def lay_out_attention_output(self, bsym: BoundSymbol) -> None:
        """Under ``token_major_attention``: an attention forward whose query a region writes (laid out token
        by token by the runtime) writes its output in the query's layout (cuDNN and PyTorch's CPU flash
        attention allocate it so): its strides are recorded for the view rules that read it."""
        kind, operands = attention_operands(bsym)
        if kind != "forward" or not isinstance(operands[0], TensorProxy):
            return
        query = self.tensors.get(operands[0].name)
        if query is None or query.producer_unit is None or self.units[query.producer_unit].kind != "region":
            return
        out = bsym.flat_proxy_outs[0] if bsym.flat_proxy_outs else None
        shape = self.shape_of(out) if isinstance(out, TensorProxy) else ()
        if len(shape) == 4 and not is_contiguous(shape, token_major_strides(shape)):
            self.strides[out.name] = token_major_strides(shape)

    def _stand_alone_base(self, bsym: BoundSymbol, kind: str, tags: frozenset[str], ins: Sequence[str]) -> str | None:
        if "view" in tags and ins:
            return _stand_alone_view_base(bsym, kind, ins[0], self.tensors, self.strides, self.shape_of)
        return None

    def _views_of(self, region: BoundSymbol, ins, outs, view_facts: dict[int, ViewFacts] | None = None) -> dict[str, str]:
        """The region rule (:func:`remat.core.views.region_views`) on a region: reused from the graph
        this trace was rewritten from where the region is the same bound symbol.  ``view_facts``: the
        facts already read per member (by ``id``), else they are read when needed."""
        known = self.known_views.get(id(region))
        if known is not None and known[0] is region:
            views = known[1]
        else:
            strides, shape_of, tensors = self.strides, self.shape_of, self.tensors

            def is_view(member: tuple[str, BoundSymbol]) -> bool:
                kind, bsym = member
                facts = view_facts.get(id(bsym)) if view_facts is not None else _view_facts(bsym, kind, shape_of)
                return member_view(kind, facts, strides)

            views = region_views(
                _aliasing_members(region.subsymbols), set(ins) | set(outs), lambda name: alias_base(name, tensors), is_view
            )
        self.region_views_by_id[id(region)] = (region, views)
        return views

    def read_unit(self, unit_index: int, bsym: BoundSymbol, kind: str, unit_kind: str, ins, outs, phase: str) -> None:
        """Units and tensors only (``ops=False``: what the memory model reads)."""
        alias = None
        region_views: dict[str, str] = {}
        if unit_kind == "op":
            alias = self._stand_alone_base(bsym, kind, symbol_facts(bsym)[1], ins)
        elif unit_kind == "region":
            region_views = self._views_of(bsym, ins, outs)
        for p in bsym.flat_proxy_outs:
            if p.name in ins:
                continue
            if unit_kind == "input":
                existing = self.tensors.get(p.name)
                if existing is not None:
                    self.tensors[p.name] = existing._replace(producer_unit=unit_index)
                    continue
                self.register(p, "input", unit_index, None, phase)
            elif unit_kind == "cotangent":
                self.register(p, "cotangent", unit_index, None, phase)
            else:
                self.register(p, "activation", unit_index, None, phase, alias or region_views.get(p.name))
        self.units.append(Unit(unit_index, bsym.sym.name, unit_kind, phase, ins, outs, (), 0))

    def read_unit_ops(self, unit_index: int, bsym: BoundSymbol, unit_kind: str, ins, outs, phase: str) -> None:
        """Units, tensors and one :class:`Op` per operation."""
        tensors, facts_cache = self.tensors, self.facts_cache
        is_region = unit_kind == "region"
        members = list(bsym.subsymbols) if is_region else [bsym]
        member_facts = [symbol_facts(m) for m in members]
        member_views = [_view_facts(m, f[0], self.shape_of) if is_region else None for m, f in zip(members, member_facts)]
        region_name = bsym.sym.name if is_region else None
        if is_region:
            region_views = self._views_of(bsym, ins, outs, {id(m): v for m, v in zip(members, member_views) if v is not None})
        else:
            region_views = {}
        local_producer: dict[str, int] = {}
        nodes: list[int] = []
        unit_flops = 0
        unit_tags: set[str] = set()
        for op, (okind, tags, fusible), view in zip(members, member_facts, member_views):
            if (okind in BOOKKEEPING_KINDS or okind == RETURN_KIND) and unit_kind != "return":
                continue
            gathered_bytes = 0
            if unit_kind == "op" and "distributed" in tags:  # collectives are never inside regions
                tags, gathered_bytes = self.regather_facts(op, okind, tags)
            node_id = len(self.ops)
            arg_proxies = op.flat_proxy_args  # (proxy names are a property: read each once)
            arg_names = [p.name for p in arg_proxies]
            op_ins = ins if unit_kind in ("input", "cotangent") else tuple(dict.fromkeys(arg_names))
            op_out_proxies = []
            out_sizes = {}
            out_shapes = []
            for p in op.flat_proxy_outs:
                name = p.name
                if name in op_ins:
                    continue
                op_out_proxies.append(p)
                known = facts_cache.get(name) or self.facts(p)
                out_sizes[name] = known[2]
                if isinstance(p, TensorProxy):
                    out_shapes.append(known[0])
            op_outs = tuple(out_sizes)
            in_shapes = [
                (facts_cache.get(n) or self.facts(p))[0] for p, n in zip(arg_proxies, arg_names) if isinstance(p, TensorProxy)
            ]
            flops = estimate_flops(okind, tags, in_shapes, out_shapes, backward=phase == BACKWARD, gathered_bytes=gathered_bytes)
            is_input = unit_kind == "input"
            self.ops.append(
                Op(
                    id=node_id,
                    kind=okind,
                    unit=unit_index,
                    region=region_name,
                    phase=phase,
                    inputs=op_ins,
                    input_nodes=tuple(local_producer.get(n, self.producer_node.get(n)) for n in op_ins),
                    outputs=op_outs,
                    output_bytes=tuple(out_sizes.values()),
                    flops=flops,
                    tags=tags,
                    fusible=fusible,
                    is_input=is_input,
                    is_param=is_input and any(t in tensors and tensors[t].kind == "param" for t in op_outs),
                    side_effect=_has_side_effect(op, okind),
                    view=view,
                )
            )
            self.op_bsyms.append(op)
            for name in op_outs:
                local_producer[name] = node_id
            alias = self._stand_alone_base(op, okind, tags, op_ins) if unit_kind == "op" else None
            for p in op_out_proxies:
                if unit_kind == "input":
                    existing = tensors.get(p.name)
                    if existing is not None:
                        tensors[p.name] = existing._replace(producer_unit=unit_index, producer_node=node_id)
                        continue
                    self.register(p, "input", unit_index, node_id, phase)
                elif unit_kind == "cotangent":
                    self.register(p, "cotangent", unit_index, node_id, phase)
                elif is_region and p.name in tensors:
                    # Thunder's own rematerialization recomputes values under their original names
                    # inside backward regions; the first (visible) producer keeps the name.
                    continue
                else:
                    self.register(p, "activation", unit_index, node_id, phase, alias or region_views.get(p.name))
            nodes.append(node_id)
            unit_flops += flops
            unit_tags |= tags
        if is_region:
            for p in bsym.flat_proxy_outs:
                info = tensors.get(p.name)
                if info is None or info.producer_unit != unit_index:
                    self.register(p, "activation", unit_index, local_producer.get(p.name), phase, region_views.get(p.name))
        for name in outs:
            if name in local_producer:
                self.producer_node[name] = local_producer[name]
        self.units.append(Unit(unit_index, bsym.sym.name, unit_kind, phase, ins, outs, tuple(nodes), unit_flops, frozenset(unit_tags)))


# ---------------------------------------------------------------------------------------------- names
def _parameter_path(proxy: Proxy) -> tuple[str, str] | None:
    """``(kind, dotted name)`` of a parameter or buffer proxy, kind ``"_parameters"`` or ``"_buffers"``,
    from the provenance Thunder's interpreter recorded when it loaded the tensor from the module
    (``module._modules['h']._modules['0']..._parameters['weight']``: the record Thunder's prologue turns
    into ``module.get_parameter('h.0....weight')``); None for anything else."""
    record = getattr(proxy, "history", None)
    try:  # the shape Thunder's decoder expects (checked first: it asserts, and asserts may be off)
        if not (
            record.inst is PseudoInst.BINARY_SUBSCR
            and record.inputs[1].inst is PseudoInst.CONSTANT
            and record.inputs[0].inst is PseudoInst.LOAD_ATTR
            and record.inputs[0].inputs[0].ext_flag & EXT_FLAG_IS_MODULE
        ):
            return None
        kind, parts, _root = get_parameter_or_buffer_or_submodule_name_and_root(record)
    except (AttributeError, IndexError, TypeError, AssertionError):
        return None
    if kind not in ("_parameters", "_buffers") or not parts or not all(isinstance(p, str) for p in parts):
        return None
    return kind, ".".join(parts)


def parameter_names(trace: TraceCtx) -> dict[str, str]:
    """Proxy name -> dotted parameter or buffer name (``"t_transformer_h_0_mlp_fc_weight"`` ->
    ``"transformer.h.0.mlp.fc.weight"``), as ``named_parameters()`` of the module Thunder loaded it from
    spells it (normally the traced module).  Exact: read from the provenance Thunder keeps on each trace
    input, not guessed from the proxy name; inputs that are not a module's parameters or buffers are left
    out.  Remat's own traces (``fuse``, the rewrite) keep the input proxies, so they keep the names."""
    if not isinstance(trace, TraceCtx):
        raise TypeError(f"expected a Thunder trace (thunder.core.trace.TraceCtx), got {type(trace).__name__}")
    found: dict[str, str] = {}
    for proxy in tree_flatten((trace.args, trace.kwargs))[0]:
        if isinstance(proxy, TensorProxy):
            path = _parameter_path(proxy)
            if path is not None:
                found[proxy.name] = path[1]
    return found


def _gradient_owners(trace: TraceCtx, learnable: dict[str, str]) -> dict[str, str]:
    """Gradient name -> the module whose parameter it is the gradient of: a joint trace returns
    ``output`` (the gradients) aligned with ``flat_args`` (the inputs)."""
    if not trace.bound_symbols:
        return {}
    ret = trace.bound_symbols[-1]
    if op_kind(ret) != RETURN_KIND or not ret.args or not isinstance(ret.args[0], dict):
        return {}
    returned = ret.args[0]
    args, grads = returned.get("flat_args"), returned.get("output")
    if not isinstance(args, (list, tuple)) or not isinstance(grads, (list, tuple)) or len(args) != len(grads):
        return {}
    owners: dict[str, str] = {}
    for arg, grad in zip(args, grads):
        if isinstance(arg, Proxy) and isinstance(grad, Proxy) and arg.name in learnable:
            owners[grad.name] = learnable[arg.name]
    return owners


def _source_key(bsym: BoundSymbol) -> tuple[str, Any] | None:
    """Where in the user's source the forward op was traced (file and expression), or None."""
    filename = getattr(bsym, "source_filename", None)
    positions = getattr(bsym, "source_positions", None)
    if not filename or positions is None:
        return None
    return filename, positions


def module_names(graph: FusionGraph) -> ModuleNames | None:
    """The :class:`remat.core.ir.ModuleNames` of a graph read from a trace (its ``naming``); None when the
    trace's inputs carry no parameter names (a function traced on plain tensors).

    Exact:

    * parameter and buffer names (:func:`parameter_names`);
    * *anchors*: an op that reads a parameter, or a value computed from parameters alone (a broadcast or
      cast of a weight), belongs to the module owning it; an op that writes a parameter's gradient
      belongs to that parameter's module (several modules: their deepest common module).  Buffers
      (a rotary cos/sin table held by the model) name values but anchor nothing: the module holding a
      buffer is not the one computing with it.

    Inferred (a heuristic, linear in the ops):

    * *same call*: consecutive forward ops (skipping ops without a source position) traced at the same
      source position (file and expression, e.g. the ``F.layer_norm(...)`` line of one LayerNorm) are
      one call; if the call holds an anchor, its other ops take the anchors' module;
    * *between*: every other op takes the deepest common module of the nearest anchor before it and the
      nearest anchor after it in trace order within its phase (the traced module itself before the first
      and after the last).  Thunder records forward ops in execution order, so an op run between two
      module calls ran in a module on the path between them: the common module contains the true one
      but may be coarser (a residual add between two blocks is named after the block list).  The
      backward is Thunder's reverse-order autodiff, for which the same rule is an approximation;
    * *backward reads*: a backward op that reads forward values (not parameters) takes the deepest
      common module of those values' modules when it lies inside the module the rule above gives (the
      values a gradient reads are mostly those of the op it differentiates).
    """
    origin = graph.origin
    if not isinstance(origin, TraceOrigin) or origin.op_bsyms is None or graph.ops is None:
        return None
    trace = origin.trace
    learnable: dict[str, str] = {}
    parameters: dict[str, str] = {}
    for proxy in tree_flatten((trace.args, trace.kwargs))[0]:
        if isinstance(proxy, TensorProxy):
            path = _parameter_path(proxy)
            if path is not None:
                parameters[proxy.name] = path[1]
                if path[0] == "_parameters":
                    learnable[proxy.name] = parameter_module(path[1])
    if not parameters:
        return None
    gradient_owner = _gradient_owners(trace, learnable)
    ops, bsyms, tensors = graph.ops, origin.op_bsyms, graph.tensors
    modules: list[str | None] = [None] * len(ops)
    exact: set[int] = set()
    # anchors, and values computed from parameters alone (they carry their parameter's module)
    derived: dict[str, str] = dict(learnable)
    steps: dict[str, list[int]] = {FORWARD: [], BACKWARD: []}
    for op in ops:
        if op.is_input:
            owners = [learnable.get(n) or parameter_module(parameters[n]) for n in op.outputs if n in parameters]
            if owners:
                modules[op.id] = functools.reduce(common_module, owners)
                exact.add(op.id)
            continue
        if op.kind in (COTANGENT_KIND, RETURN_KIND):
            continue
        steps[op.phase].append(op.id)
        read = [derived[n] for n in op.inputs if n in derived]
        written = [gradient_owner[n] for n in op.outputs if n in gradient_owner]
        if not read and not written:
            continue
        module = functools.reduce(common_module, read + written)
        modules[op.id] = module
        exact.add(op.id)
        if read and all(n in derived or (n in tensors and tensors[n].kind == "number") for n in op.inputs):
            for name in op.outputs:
                derived[name] = module
    # same call: runs of forward ops at one source position that hold an anchor
    anchored = set(exact)
    run: list[int] = []
    run_key = None

    def close_run() -> None:
        found = [modules[i] for i in run if i in exact]
        if found:
            module = functools.reduce(common_module, found)
            for i in run:
                if i not in exact:
                    modules[i] = module
                    anchored.add(i)

    for i in steps[FORWARD]:
        key = _source_key(bsyms[i])
        if key is None:
            continue
        if key != run_key:
            close_run()
            run, run_key = [], key
        run.append(i)
    close_run()
    # between: the deepest module containing the nearest anchors before and after, per phase
    for phase_ops in steps.values():
        after: list[str] = [ROOT_MODULE] * len(phase_ops)
        following = ROOT_MODULE
        for k in range(len(phase_ops) - 1, -1, -1):
            after[k] = following
            if phase_ops[k] in anchored:
                following = modules[phase_ops[k]]
        previous = ROOT_MODULE
        for k, i in enumerate(phase_ops):
            if i in anchored:
                previous = modules[i]
            else:
                modules[i] = common_module(previous, after[k])
    # a backward op reading forward values most often differentiates the op that made them: their
    # module, where it lies inside the one the rule above gives
    for i in steps[BACKWARD]:
        if i in anchored:
            continue
        bound = modules[i]
        read = [
            modules[info.producer_node]
            for info in (tensors.get(n) for n in ops[i].inputs)
            if info is not None and info.phase == FORWARD and isinstance(info.producer_node, int)
            and info.name not in parameters and modules[info.producer_node] is not None
        ]
        if read:
            hint = functools.reduce(common_module, read)
            if _inside(hint, bound):
                modules[i] = hint
    return ModuleNames(parameters, tuple(modules), frozenset(exact))


def _inside(module: str, outer: str) -> bool:
    """Whether dotted module path ``module`` is ``outer`` or lies inside it."""
    return outer == ROOT_MODULE or module == outer or module.startswith(outer + ".")
