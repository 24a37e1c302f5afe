"""Stage 1b, *regions*: group a joint trace's prims into fusion regions the way nvFuser would.

:func:`fuse` is remat's CPU stand-in for Thunder's nvFuser fusion pass (``nvFuserExecutor.fusion_pass``
in Thunder 0.2.6).  It mirrors that pass where it decides regions:

* ``uniform`` is replaced by the stateless ``uniform_philox`` plus explicit RNG-state ops
  (Thunder's ``replace_uniform``), so dropout masks can be recomputed exactly; on CUDA traces only
  (Thunder's RNG-state prim is CUDA-only): on CPU/meta traces ``uniform`` stays stateful and its mask
  is saved;
* regions are runs of *consecutive* fusible bound symbols in trace order (Thunder's default
  ``fusion_type="consecutive"``); a non-fusible op (a matmul, attention, an input or cotangent read) ends
  the run;
* a run is split into its connected parts, one region each, unless ``independent_parts=True`` (a remat
  choice, not Thunder's; see :class:`remat.FusionPolicy`);
* a run (or part) made only of shape ops (reshape, broadcast, transpose, shallow_copy, ...) is not
  fused;
* linear and matmul join regions only when the fusion policy (:class:`remat.FusionPolicy`) says so (nvFuser's ``nv_enable_linear`` /
  ``nv_enable_matmul``), attention only with ``sdpa=True``;
* a ``cat`` of transposed values (every operand a transpose, possibly reshaped, made in the trace) ends a
  run and runs as ``torch.cat`` unless ``transposed_cat=True`` (a remat choice, not Thunder's; see
  :class:`remat.FusionPolicy`);
* ops that may read or write storage some op writes in place (a kv cache updated by ``copy_``, its
  views, ``update_aliases``) stay stand-alone, as do the in-place family and ops remat does not know
  (:func:`remat.core.ops.is_known_kind`).  A region's outputs are fresh buffers under nvFuser, so a view of
  such a buffer made inside a region would be written into a copy and the update lost.

Before grouping, the trace is simplified exactly (:func:`simplify`): a float cast that undoes a widening
cast (``bf16 -> f32 -> bf16``) is replaced by the value it started from, so a region does not write a
copy of its own input; then ops repeated inside a run are merged (within the run only).  Thunder's
nvFuser pass does both after fusing, with one difference: its ``remove_redundant_casts`` also drops
rounding casts (``f32 -> bf16 -> f32``), which changes results; remat keeps those.

Differences (documented in docs/design.md): nvFuser also declines ops on CPU tensors and checks
per-op dtype support; the stand-in does neither, since CPU/meta traces stand for GPU runs.  It does not
run Thunder's rematerialization: :func:`remat.optimize` (or Thunder's ``rematerialize``) is applied to
its result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from thunder.core import dtypes, prims
from thunder.core.devices import DeviceType
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.rematerialization import replace_uniform
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx
from thunder.core.transform_common import NON_FUNCTIONAL_OPS, dce

from remat.core.layout import region_name
from remat.core.ops import ALIASING_PRIMS, NEVER_RECOMPUTE_TAGS, NVFUSER_ELEMENTWISE_PRIMS, SHAPE_ONLY_KINDS
from remat.core.policies import FusionPolicy, check_policy
from remat.core.storage import mutated_storage
from remat._logging import logger, stage
from remat.errors import UnsupportedTraceError
from remat.thunder.execute import thunder_context
from remat.thunder.nvfuser import refusal
from remat.thunder.read import op_kind, symbol_facts
from remat.thunder.regions import RegionExecutor, default_region_executor, make_region, region_io

__all__ = ["fuse", "simplify"]


def _uniform_replaceable(trace: TraceCtx) -> bool:
    """Whether Thunder's ``replace_uniform`` can run: the RNG-state prim it inserts
    (``get_and_update_rng_state``) exists for CUDA only, so on CPU or meta traces with dropout it raises.
    There ``uniform`` stays stateful: tagged ``rng``, it is never recomputed and its mask is saved."""
    for bsym in trace.bound_symbols:
        if bsym.sym.id == prims.PrimIDs.UNIFORM:
            device = bsym.kwargs.get("device")
            if getattr(device, "devicetype", None) != DeviceType.CUDA:
                return False
    return True


def _stand_alone(bsyms, kinds: list[str]) -> set[int]:
    """Positions of bound symbols that must not join a region: the in-place family, unknown ops, ops
    whose arguments nvFuser refuses (:func:`remat.thunder.nvfuser.refusal`, e.g. a strided slice), and
    ops reading or writing storage that an op writes in place (see the module docstring)."""
    tags = [symbol_facts(bsym)[1] for bsym in bsyms]
    stand_alone = {i for i, t in enumerate(tags) if t & NEVER_RECOMPUTE_TAGS}
    stand_alone |= {i for i, (bsym, kind) in enumerate(zip(bsyms, kinds)) if refusal(bsym, kind)}
    if not any("mutates" in t for t in tags):  # the common case: nothing is written in place
        return stand_alone
    names = [
        (tuple(p.name for p in bsym.flat_proxy_args), tuple(p.name for p in bsym.flat_proxy_outs)) for bsym in bsyms
    ]
    mutated = mutated_storage([(kind, t, ins, outs) for kind, t, (ins, outs) in zip(kinds, tags, names)])
    return stand_alone | {i for i, (ins, outs) in enumerate(names) if any(n in mutated for n in (*ins, *outs))}


def _cat_of_transposes(cat, bsyms, kinds: list[str], producer: dict[str, int]) -> bool:
    """Whether every tensor operand of ``cat`` is made in the trace by a transpose that really moves
    dimensions, possibly followed by reshapes (see ``FusionPolicy.transposed_cat``)."""
    operands = [p for p in cat.flat_proxy_args if hasattr(p, "shape")]
    if not operands:
        return False
    for operand in operands:
        index = producer.get(operand.name)
        while index is not None and kinds[index] == "reshape":
            source = bsyms[index].args[0]
            index = producer.get(getattr(source, "name", None))
        if index is None or kinds[index] != "transpose":
            return False
        source, permutation = bsyms[index].args[0], tuple(bsyms[index].args[1])
        moved = [d for d in permutation if source.shape[d] != 1]  # size-1 dims move no data
        if moved == sorted(moved):
            return False
    return True


def _exact_widening(source, target) -> bool:
    """Whether every value of float dtype ``source`` is exactly a value of float dtype ``target``."""
    if not (dtypes.is_float_dtype(source) and dtypes.is_float_dtype(target)):
        return False
    if dtypes.is_complex_dtype(source) or dtypes.is_complex_dtype(target):
        return False
    a, b = torch.finfo(dtypes.to_torch_dtype(source)), torch.finfo(dtypes.to_torch_dtype(target))
    return b.eps <= a.eps and b.max >= a.max and b.tiny <= a.tiny


def simplify(trace: TraceCtx) -> TraceCtx:
    """``trace`` with every cast that undoes an exact widening cast (``b = f32(a: bf16); c = bf16(b)``:
    ``c`` is ``a``), or converts to the dtype a value already has, replaced by the value it started
    from (later readers read that value; ops left unread are removed).  Exact: no result changes."""
    replaced: dict = {}
    widened: dict[str, TensorProxy] = {}  # name of an exactly widened value -> the value it came from
    new_bsyms = []
    for bsym in trace.bound_symbols:
        bsym = _swap(bsym, replaced)
        if bsym.sym.id is prims.PrimIDs.CONVERT_ELEMENT_TYPE and len(bsym.args) == 2 and isinstance(bsym.args[0], TensorProxy):
            source, dtype = bsym.args
            out = bsym.output
            origin = widened.get(source.name)
            if source.dtype == dtype:
                replaced[variableify(out)] = source
            elif origin is not None and origin.dtype == dtype:
                replaced[variableify(out)] = origin
            elif _exact_widening(source.dtype, dtype):
                widened[out.name] = origin if origin is not None else source
        new_bsyms.append(bsym)
    if not replaced:
        return trace
    simplified = from_trace(trace)
    simplified.bound_symbols = new_bsyms
    with thunder_context():
        simplified = dce(simplified)
    simplified.set_provenance(TraceProvenance(f"remat.simplify ({len(replaced)} casts that undo a widening)"))
    return simplified


#: nll_loss's gradient: Thunder's symbol (a prim of ``thunder.torch``) and its torch executor's operator.
NLL_LOSS_GRADIENT_KINDS = frozenset({"nll_loss_backward", "torch_nll_loss_backward_impl"})


def _recorded_in_place_of(trace: TraceCtx, output: TensorProxy, build: Callable[[], Any]) -> tuple[list, Any]:
    """The prims ``build()`` records into ``trace``, the last one renamed to write ``output`` (the output
    of the op they replace), and what ``build`` returned.  The scope is popped whatever happens, so the
    trace stays usable for the op kept where ``build`` fails."""
    with tracectx(trace):
        trace.push_scope([])
        try:
            returned = build()
        finally:
            ops = trace.pop_scope()
    last = ops[-1]
    ops[-1] = last.from_bsym_swap_proxies({variableify(last.output): output}, skip_inputs=True, skip_output=False)
    return ops, returned


def _class_hit(shape: tuple, class_dim: int, target: TensorProxy, target_dims: tuple, device) -> TensorProxy:
    """Where, in a tensor of ``shape``, the class index along ``class_dim`` equals ``target`` (broadcast
    along ``target_dims``): the comparison both loss decompositions select by."""
    classes = prims.iota(shape[class_dim], start=0, step=1, device=device, dtype=target.dtype)
    return prims.eq(prims.broadcast_in_dim(classes, shape, (class_dim,)), prims.broadcast_in_dim(target, shape, target_dims))


def _nll_loss_gradient_prims(trace: TraceCtx, bsym) -> tuple[list, TensorProxy, int] | None:
    """The prims computing the gradient of ``nll_loss`` that ``bsym`` (``nll_loss_backward(g, a, target,
    weight, reduction, ignore_index, total_weight)``) computes, the last one writing its output, with the
    value each target's class receives (target-shaped: the sum of the gradient over the class dimension)
    and that dimension; or None where its arguments are not the tensors and constants this covers.

    What aten's kernel does, elementwise: the gradient is zero but at each target's class, where it is
    ``-g`` (``-g / total_weight`` for ``"mean"``; ``-g[i]`` for ``"none"``), times the target's weight
    (with ``weight``), and zero where the target is ``ignore_index``."""
    if len(bsym.args) != 7 or bsym.kwargs:
        return None
    g, a, target, weight, reduction, ignore_index, total_weight = bsym.args
    out = bsym.output
    if not all(isinstance(t, TensorProxy) for t in (g, a, target, out)) or reduction not in ("none", "sum", "mean"):
        return None
    if not isinstance(ignore_index, int) or not dtypes.is_integer_dtype(target.dtype) or a.ndim != target.ndim + 1:
        return None
    if (weight is not None and not (isinstance(weight, TensorProxy) and weight.ndim == 1)) or (
        reduction == "mean" and not isinstance(total_weight, TensorProxy)
    ):
        return None
    if (reduction == "none" and tuple(g.shape) != tuple(target.shape)) or (reduction != "none" and g.ndim != 0):
        return None
    class_dim = 1 if a.ndim >= 2 else 0
    other_dims = tuple(d for d in range(a.ndim) if d != class_dim)
    dtype = out.dtype

    def build() -> TensorProxy:
        value = prims.convert_element_type(g, dtype) if g.dtype != dtype else g
        if reduction == "mean":
            value = prims.div(value, prims.convert_element_type(total_weight, dtype))
        value = prims.neg(value)
        if reduction != "none":  # one scalar for every target
            value = prims.broadcast_in_dim(value, tuple(target.shape), ())
        valid = prims.ne(target, ignore_index)
        if weight is not None:  # the target's class weight; an ignored target reads class 0 and is zeroed below
            index = prims.where(valid, target, 0)
            flat_index = index if index.ndim == 1 else prims.reshape(index, (math.prod(target.shape),))
            weights = prims.take(prims.convert_element_type(weight, dtype) if weight.dtype != dtype else weight, flat_index, 0)
            if target.ndim != 1:
                weights = prims.reshape(weights, tuple(target.shape))
            value = prims.mul(value, weights)
        zero = dtypes.dtype_to_numbertype(dtype)(0)
        value = prims.where(valid, value, zero)
        hit = _class_hit(tuple(a.shape), class_dim, target, other_dims, a.device)
        prims.where(hit, prims.broadcast_in_dim(value, tuple(a.shape), other_dims), zero)
        return value

    ops, value = _recorded_in_place_of(trace, out, build)
    return ops, value, class_dim


def _known_row_sum(bsym, one_hot: dict[str, tuple[TensorProxy, int]]) -> TensorProxy | None:
    """The value of ``bsym`` when it sums a decomposed loss gradient (a name in ``one_hot``) over its
    class dimension: each row holds one nonzero value at most, the target's, so the sum is that value
    (exact: adding zeros changes no value; only a zero's sign may differ, where the value is -0.0)."""
    if bsym.sym.id is not prims.PrimIDs.SUM or len(bsym.args) != 2 or bsym.kwargs.get("output_dtype") is not None:
        return None
    source, dims = bsym.args
    known = one_hot.get(getattr(source, "name", None))
    if known is None:
        return None
    value, class_dim = known
    out = bsym.output
    if tuple(dims) != (class_dim,) or not isinstance(out, TensorProxy) or out.dtype != value.dtype:
        return None
    return value if tuple(out.shape) == tuple(value.shape) else None


def decompose_loss_gradients(trace: TraceCtx) -> TraceCtx:
    """``trace`` with each ``nll_loss_backward`` (the gradient of ``cross_entropy`` and ``nll_loss``)
    replaced by fusible prims (:func:`_nll_loss_gradient_prims`): a comparison of each class index with
    the target, selecting ``-g`` (scaled) or zero: the values of aten's CPU kernel bit for bit (tested;
    on a GPU within rounding).  A gradient whose arguments this does not cover, or whose prims fail to
    record, stays aten's op.

    Why: as one op, the gradient runs outside every region: aten fills a buffer of the logits' size with
    zeros and scatters into it, and the log-softmax gradient's region reads that buffer back (twice).
    As prims it joins that region, so the buffer is never written: one logits-sized float32 buffer fewer
    alive at the start of the backward (where a model with a large vocabulary has its peak) and two
    kernels fewer (torch.compile reaches the same by its ``scatter_upon_const_tensor`` pass).  The memory
    model sees regions, so the estimate follows, where one region runs as one kernel (Inductor); nvFuser
    splits this one, so :func:`fuse` applies it by ``FusionPolicy.loss_gradient`` and the runtime."""
    result = None  # made at the first gradient: a trace without one (most inference) costs one scan
    new_bsyms = []
    count = 0
    one_hot: dict[str, tuple[TensorProxy, int]] = {}  # a decomposed gradient (or a copy) -> (row value, class dim)
    replaced: dict = {}  # a row sum of one of them -> its row value
    for bsym in trace.bound_symbols:
        bsym = _swap(bsym, replaced)
        decomposed = None
        if op_kind(bsym) in NLL_LOSS_GRADIENT_KINDS:
            if result is None:
                result = from_trace(trace)
            try:
                decomposed = _nll_loss_gradient_prims(result, bsym)
            except Exception as exc:  # an argument Thunder's meta functions refuse: aten's op stays
                logger.info("kept nll_loss_backward as it is: %s: %s", type(exc).__name__, exc)
        elif one_hot:
            row_value = _known_row_sum(bsym, one_hot)
            if row_value is not None:
                replaced[variableify(bsym.output)] = row_value
                continue
            if bsym.sym.id is prims.PrimIDs.SHALLOW_COPY and getattr(bsym.args[0], "name", None) in one_hot:
                one_hot[bsym.output.name] = one_hot[bsym.args[0].name]
        if decomposed is None:
            new_bsyms.append(bsym)
            continue
        ops, row_value, class_dim = decomposed
        new_bsyms.extend(ops)
        one_hot[bsym.output.name] = (row_value, class_dim)
        count += 1
    if not count:
        return trace
    result.bound_symbols = new_bsyms
    if replaced:  # the log-softmax gradient's row sum, read from the target's value instead
        with thunder_context():
            result = dce(result)
    result.set_provenance(
        TraceProvenance(f"remat.decompose_loss_gradients ({count} nll_loss gradients, {len(replaced)} row sums known)")
    )
    return result


#: Elementwise prims a read at the targets passes through (:func:`_read_at_targets`): the same operation on
#: the values read is the value the operation gives there, bit for bit.
_READ_THROUGH = frozenset(NVFUSER_ELEMENTWISE_PRIMS) - {"clone", "shallow_copy"}
_ROW_STATISTIC = object()  # a key of _read_at_targets' cache: whether the read passed a row-constant value


def _read_at_targets(value: TensorProxy, index: TensorProxy, dim: int, producers: dict, cache: dict) -> TensorProxy:
    """``value`` read at ``index`` along ``dim`` (``index`` of ``value``'s shape but 1 along ``dim``; every
    entry a class, in range), recorded into the current trace scope.  Elementwise ops are read through
    (the op applied to its operands' reads, a tensor broadcast along ``dim`` read as itself), so the read
    reaches values that no reduction made; there each row's value at its target is the sum over ``dim`` of
    the value where the class equals the target and zero elsewhere: a row reduction as a region's others
    (no gather, no padded copy; exact, as one value plus zeros)."""
    if value.name in cache:  # names are strings: no clash with _ROW_STATISTIC
        return cache[value.name]
    producer = producers.get(value.name)
    kind = op_kind(producer) if producer is not None else None
    shape = tuple(value.shape)
    if kind == "shallow_copy":
        read = _read_at_targets(producer.args[0], index, dim, producers, cache)
    elif kind == "broadcast_in_dim" and isinstance(producer.args[0], TensorProxy) and (
        dim not in producer.args[2] or producer.args[0].shape[list(producer.args[2]).index(dim)] == 1
    ):
        source, _, dims = producer.args[:3]
        read = prims.broadcast_in_dim(source, tuple(index.shape), tuple(dims))
        cache[_ROW_STATISTIC] = True  # a value constant along the row: what makes the gather worth replacing
    elif (
        kind in _READ_THROUGH
        and not producer.kwargs
        and all(tuple(a.shape) == shape for a in producer.args if isinstance(a, TensorProxy))
        and any(isinstance(a, TensorProxy) for a in producer.args)
    ):
        args = [_read_at_targets(a, index, dim, producers, cache) if isinstance(a, TensorProxy) else a for a in producer.args]
        read = producer.sym(*args)
    else:
        hit = _class_hit(shape, dim, index, tuple(range(len(shape))), value.device)
        zero = dtypes.dtype_to_numbertype(value.dtype)(0)
        row = prims.sum(prims.where(hit, value, zero), (dim,))
        read = prims.broadcast_in_dim(row, tuple(index.shape), tuple(d for d in range(len(shape)) if d != dim))
    cache[value.name] = read
    return read


def _target_gather_prims(trace: TraceCtx, bsym, producers: dict) -> list | None:
    """The prims of :func:`_read_at_targets` for ``bsym``, a ``take_along_axis(x, index, dim)`` reading one
    class per row (``index`` is 1 along ``dim``) of a value computed from a statistic of its row, as
    Thunder's ``nll_loss`` reads the log-probabilities at the targets; ``x`` may be ``pad(y, 0, one more
    class)``, where an ignored target points at the padded class and reads zero.  The last prim writes
    ``bsym``'s output.  None for any other gather: reading a value no row statistic made costs a gather
    of one element a row, cheaper than the row reduction."""
    source, index, dim = bsym.args[:3] if len(bsym.args) >= 3 else (None, None, None)
    if not (isinstance(source, TensorProxy) and isinstance(index, TensorProxy) and isinstance(dim, int)) or bsym.kwargs:
        return None
    if not dtypes.is_integer_dtype(index.dtype):
        return None
    value, padded = source, False
    pad = producers.get(source.name)
    if pad is not None and op_kind(pad) == "pad" and len(pad.args) == 3 and isinstance(pad.args[0], TensorProxy):
        inner, pad_value, config = pad.args
        expected = [(0, 1, 0) if d == dim else (0, 0, 0) for d in range(inner.ndim)]
        if [tuple(c) for c in config] != expected or pad_value != 0:
            return None
        value, padded = inner, True
    if tuple(index.shape) != tuple(1 if d == dim else n for d, n in enumerate(value.shape)):
        return None
    cache: dict = {}

    def build() -> None:
        read = _read_at_targets(value, index, dim, producers, cache)
        if padded:  # the padded class (an ignored target) reads the pad's zero
            prims.where(prims.lt(index, value.shape[dim]), read, dtypes.dtype_to_numbertype(bsym.output.dtype)(0))

    ops, _ = _recorded_in_place_of(trace, bsym.output, build)
    return ops if cache.get(_ROW_STATISTIC) else None


def decompose_target_gathers(trace: TraceCtx) -> TraceCtx:
    """``trace`` with each gather of :func:`_target_gather_prims` (``nll_loss``'s read of the
    log-probabilities at the targets) computed as a row reduction instead: no logits-sized padded copy,
    and no gather of a value computed from the row's own statistics (the log-softmax), which a region
    that computes both would have to write out first."""
    producers: dict | None = None  # name -> the op writing it; made at the first gather (one scan otherwise)
    result = None
    new_bsyms = []
    count = 0
    for bsym in trace.bound_symbols:
        ops = None
        if op_kind(bsym) == "take_along_axis":
            if result is None:
                result = from_trace(trace)
                producers = {out.name: op for op in new_bsyms for out in op.flat_proxy_outs}
            try:
                ops = _target_gather_prims(result, bsym, producers)
            except Exception as exc:  # an argument Thunder's meta functions refuse: the gather stays
                logger.info("kept take_along_axis as it is: %s: %s", type(exc).__name__, exc)
        written = [bsym] if ops is None else ops
        if producers is not None:
            producers.update((out.name, op) for op in written for out in op.flat_proxy_outs)
        new_bsyms.extend(written)
        count += ops is not None
    if not count:
        return trace
    result.bound_symbols = new_bsyms
    with thunder_context():
        result = dce(result)
    result.set_provenance(TraceProvenance(f"remat.decompose_target_gathers ({count} gathers)"))
    return result


#: remat's attention operators and the position of their value operand (remat/thunder/attention.py)
ATTENTION_VALUE_POSITIONS = {"remat_cudnn_sdpa_fwd": 2, "remat_cudnn_sdpa_bwd": 3, "remat_sdpa_fwd": 2, "remat_sdpa_bwd": 3}


def copy_attention_values(trace: TraceCtx) -> TraceCtx:
    """``trace`` where attention's value operand, when it is a view into a larger buffer (LitGPT's ``v`` is
    a slice of the fused qkv projection), is first copied into a buffer of its own (``stride_order``, a
    fusible copy), which the forward and backward attention ops read instead.

    Why: a view keeps its whole base alive, so saving ``v`` for the backward costs all of ``qkv``, and the
    cheapest cut saves ``qkv`` and recomputes the rotary embeddings of q and k before the attention
    backward.  With ``v`` in its own buffer, saving q, k and v costs the same bytes as ``qkv``, and the cut
    can keep them instead (on LitGPT stablecode-3b and Llama-2-7b it does: same saved bytes and estimated
    peak, no RoPE recomputation).  The copy joins the forward region beside it.  A value expanded from
    fewer heads (grouped-query attention) is left alone: its copy would hold every head; so is a value no
    backward attention op reads (inference: a kv cache's ``v`` is a view of the whole cache)."""
    bsyms = list(trace.bound_symbols)
    # Only values a backward attention op reads: the copy pays by what the backward no longer recomputes;
    # in an inference trace (a kv cache's v is a view of the whole cache) it would only cost a copy.
    read_backward = {
        b.args[position].name
        for b in bsyms
        if b.sym.name.endswith("_bwd")
        and (position := ATTENTION_VALUE_POSITIONS.get(b.sym.name)) is not None
        and len(b.args) > position
        and isinstance(b.args[position], TensorProxy)
    }
    if not read_backward:  # inference, or no attention: nothing to index
        return trace
    producer = {p.name: i for i, b in enumerate(bsyms) for p in b.flat_proxy_outs}

    def view_of_larger(value: TensorProxy) -> bool:
        current = value
        while (i := producer.get(current.name)) is not None and op_kind(bsyms[i]) in ALIASING_PRIMS:
            if op_kind(bsyms[i]) == "broadcast_in_dim":  # grouped-query attention's expanded v: a copy would be larger
                return False
            base = bsyms[i].args[0]
            if not isinstance(base, TensorProxy):
                return False
            if base.numel > value.numel:
                return True
            current = base
        return False

    copies: dict[str, TensorProxy] = {}
    inserted: dict[int, list] = {}  # index of the value's producer -> the copies to put after it
    swaps: dict[int, dict] = {}
    result = from_trace(trace)
    for index, bsym in enumerate(bsyms):
        position = ATTENTION_VALUE_POSITIONS.get(bsym.sym.name)
        if position is None or len(bsym.args) <= position:
            continue
        value = bsym.args[position]
        if not isinstance(value, TensorProxy) or value.name not in producer or value.name not in read_backward:
            continue
        if value.name not in copies:
            if not view_of_larger(value):
                continue
            with tracectx(result):
                copy = TensorProxy(like=value)
            order = tuple(range(value.ndim - 1, -1, -1))
            copies[value.name] = copy
            inserted.setdefault(producer[value.name], []).append(prims.stride_order.bind(value, order, output=copy))
        swaps[index] = {variableify(value): copies[value.name]}
    if not copies:
        return trace
    new_bsyms = []
    for index, bsym in enumerate(bsyms):
        if index in swaps:
            bsym = bsym.from_bsym_swap_proxies(swaps[index], skip_inputs=False, skip_output=True)
        new_bsyms.append(bsym)
        new_bsyms.extend(inserted.get(index, ()))
    result.bound_symbols = new_bsyms
    result.set_provenance(TraceProvenance(f"remat.copy_attention_values ({len(copies)} values)"))
    return result


def _swap(bsym, replaced: dict):
    """``bsym`` reading, for each name in ``replaced``, the value it maps to."""
    if replaced and any(variableify(p) in replaced for p in bsym.flat_proxy_args):
        return bsym.from_bsym_swap_proxies(replaced, skip_inputs=False, skip_output=True)
    return bsym


def _merge_duplicates(run: list, replaced: dict) -> list:
    """``run`` ((bound symbol, kind) pairs of consecutive ops that will share regions) with each op that
    repeats an earlier op of the run (same symbol, same arguments) dropped and its outputs recorded in
    ``replaced`` as the earlier op's, so later readers read those.  Within a run only, like Thunder's
    nvFuser pass: merging across regions would turn a cheap recomputation inside a kernel into a
    buffer written by one region and read by another."""
    seen: dict = {}
    kept = []
    for bsym, kind in run:
        bsym = _swap(bsym, replaced)
        if bsym.sym.id in NON_FUNCTIONAL_OPS:
            kept.append((bsym, kind))
            continue
        try:
            key = bsym.rhs
            earlier = seen.get(key)
        except TypeError:  # an argument that cannot be hashed: keep the op
            kept.append((bsym, kind))
            continue
        if earlier is None:
            seen[key] = bsym
            kept.append((bsym, kind))
            continue
        for out, prior in zip(bsym.flat_outs, earlier.flat_outs):
            if hasattr(out, "name") and hasattr(prior, "name") and out.name != prior.name:
                replaced[variableify(out)] = prior
    return kept


def _connected_parts(group: list) -> list[list]:
    """``group`` ((bound symbol, kind) pairs) split into connected parts (linked by a tensor one writes
    and another reads, or one both read), each in trace order; parts ordered by their first member.
    Parts made only of shape ops join the first other part: alone they would not be fused, and a
    reshape of a transposed value would then be copied by PyTorch instead of written by the region
    (the value gradient's part of the attention backward is such a part)."""
    parent = list(range(len(group)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    touched: dict[str, int] = {}  # tensor name -> a member that reads or writes it
    for i, (bsym, _) in enumerate(group):
        for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs):
            if not hasattr(p, "shape"):  # numbers link nothing
                continue
            j = touched.setdefault(p.name, i)
            if j != i:
                parent[find(i)] = find(j)
    parts: dict[int, list] = {}
    for i, pair in enumerate(group):
        parts.setdefault(find(i), []).append(pair)
    computing = [root for root, p in parts.items() if not all(kind in SHAPE_ONLY_KINDS for _, kind in p)]
    if not computing or len(computing) == len(parts):
        return list(parts.values())
    host = computing[0]
    # members in trace order: the host part and every shape-only part, as one
    merged = [pair for i, pair in enumerate(group) if find(i) == host or find(i) not in computing]
    return [merged if root == host else parts[root] for root in computing]


def fuse(
    trace: TraceCtx,
    fusion: FusionPolicy | None = None,
    *,
    executor: RegionExecutor | None = None,
) -> TraceCtx:
    """Return ``trace`` with its fusible prims grouped into fusion regions (``sym.is_fusion``), as
    ``fusion`` (a :class:`remat.FusionPolicy`; default ``FusionPolicy()``) allows.

    The result is a Thunder trace: Thunder's ``rematerialize`` accepts it, and so does
    :func:`remat.optimize`.  Regions are named ``nvFusion0``, ``nvFusion1``, ... in trace order and run
    with ``executor``'s runtime (default: the torch reference).
    """
    if not isinstance(trace, TraceCtx):
        hint = " Call remat.training_trace(module, *args) first." if callable(trace) else ""
        raise TypeError(f"fuse expects a Thunder trace (TraceCtx), got {type(trace).__name__}.{hint}")
    if not trace.bound_symbols:
        raise UnsupportedTraceError("the trace has no bound symbols")
    check_policy(fusion, FusionPolicy, "fusion")
    policy = fusion or FusionPolicy()
    if executor is not None and not isinstance(executor, RegionExecutor):
        raise TypeError(f"executor must be a remat RegionExecutor (e.g. remat.executor()), got {type(executor).__name__}")
    executor = executor or default_region_executor()
    with stage("fuse") as fusing:
        fused = _form_regions(trace, policy, executor)
        fusing.detail = f"{sum(1 for b in fused.bound_symbols if b.sym.is_fusion)} regions"
    return fused


def _form_regions(trace: TraceCtx, policy: FusionPolicy, executor: RegionExecutor) -> TraceCtx:
    if _uniform_replaceable(trace):
        with thunder_context():
            trace = replace_uniform(trace)
    trace = simplify(trace)
    if policy.reads_targets_by_reduction(executor.runtime):
        trace = decompose_target_gathers(trace)
    if policy.fuses_loss_gradient(executor.runtime):
        trace = decompose_loss_gradients(trace)
    if policy.attention_value_copy:
        trace = copy_attention_values(trace)

    bsyms = list(trace.bound_symbols)
    kinds = [op_kind(b) for b in bsyms]
    if any(b.sym.is_fusion for b in bsyms):
        raise ValueError("the trace is already fused; remat.fuse expects an unfused joint trace")
    stand_alone = _stand_alone(bsyms, kinds)
    if not policy.transposed_cat and "cat" in kinds:
        producer = {p.name: i for i, b in enumerate(bsyms) for p in b.flat_proxy_outs}
        stand_alone = stand_alone | {
            i for i, kind in enumerate(kinds) if kind == "cat" and _cat_of_transposes(bsyms[i], bsyms, kinds, producer)
        }

    def fusible(i: int) -> bool:
        return policy.can_fuse_kind(kinds[i]) and i not in stand_alone

    # Runs of consecutive fusible ops (Thunder's "consecutive" fusion), repeated ops merged inside each;
    # an item is a stand-alone bound symbol or a run, a list of (bound symbol, kind).
    items: list = []
    replaced: dict = {}
    index = 0
    while index < len(bsyms):
        if not fusible(index):
            items.append(_swap(bsyms[index], replaced))
            index += 1
            continue
        end = index
        while end + 1 < len(bsyms) and fusible(end + 1):
            end += 1
        items.append(_merge_duplicates(list(zip(bsyms[index : end + 1], kinds[index : end + 1])), replaced))
        index = end + 1

    # Last position at which each name is read; a region's outputs are names read after its run.
    last_read: dict[str, int] = {}
    for position, item in enumerate(items):
        for bsym in (b for b, _ in item) if isinstance(item, list) else (item,):
            for p in bsym.flat_proxy_args:
                last_read[p.name] = position

    new_bsyms = []
    counter = 0
    for position, item in enumerate(items):
        if not isinstance(item, list):
            new_bsyms.append(item)
            continue
        for part in [item] if policy.independent_parts else _connected_parts(item):
            group = [b for b, _ in part]
            if not policy.shape_only_regions and all(kind in SHAPE_ONLY_KINDS for _, kind in part):
                new_bsyms.extend(group)
                continue
            produced = {p.name for b in group for p in b.flat_proxy_outs}
            needed_after = {name for name in produced if last_read.get(name, -1) > position}
            inputs, outputs = region_io(group, needed_after)
            if outputs:
                new_bsyms.append(make_region(executor, region_name(counter), group, inputs, outputs))
                counter += 1

    fused = from_trace(trace)
    fused.bound_symbols = new_bsyms
    fused.set_provenance(TraceProvenance(f"remat.fuse ({counter} regions, {policy})"))
    return fused
