"""What remat knows about operations: which ones nvFuser fuses, which alias their input, which are
expensive, random, reductions or collectives, and roughly how many FLOPs each costs.

Everything here works on plain strings (an op's *kind*: a lower-case Thunder ``PrimIDs`` name such as
``"mul"``, or a symbol id such as ``"torch.matmul"``) and shapes; nothing here imports Thunder.  The one
place that maps a Thunder bound symbol to a kind is :func:`remat.thunder.read.op_kind`.

This module is the op table: every other module asks it which kinds fuse, alias, mutate or cost what,
rather than keeping a list of its own.

FLOP figures are estimates (documented in docs/memory-model.md): elementwise ops count one FLOP per
output element, reductions one per input element, matmul-like ops ``2*M*N*K``, attention ``4*B*H*T*S*D``
forward and twice that backward; collectives none, but a re-gather (tag ``regather``) is priced at
:data:`REGATHER_FLOPS_PER_BYTE` FLOP-equivalents per byte it gathers.  They are used to rank
recomputation choices, not to predict time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

__all__ = [
    "NVFUSER_UNARY_PRIMS",
    "NVFUSER_BINARY_PRIMS",
    "NVFUSER_ELEMENTWISE_PRIMS",
    "NVFUSER_REDUCTION_PRIMS",
    "NVFUSER_SHAPE_PRIMS",
    "NVFUSER_OTHER_PRIMS",
    "NVFUSER_MATMUL_PRIMS",
    "NVFUSER_FUSIBLE_PRIMS",
    "VIEW_PRIMS",
    "ALWAYS_VIEW_PRIMS",
    "ALIASING_PRIMS",
    "SHAPE_ONLY_KINDS",
    "VIEW_KINDS",
    "MATMUL_KINDS",
    "ATTENTION_MARKERS",
    "EMBEDDING_GRADIENT_KINDS",
    "RNG_KINDS",
    "STATELESS_RNG_KINDS",
    "REDUCTION_KINDS",
    "INPUT_KINDS",
    "COTANGENT_KIND",
    "RETURN_KIND",
    "FUSION_KIND",
    "BOOKKEEPING_KINDS",
    "MUTATING_KINDS",
    "IN_PLACE_KINDS",
    "SIDE_EFFECT_KINDS",
    "COLLECTIVE_KINDS",
    "DISTRIBUTED_BUCKET_KINDS",
    "DISTRIBUTED_KINDS",
    "ALL_GATHER_KINDS",
    "WAIT_KINDS",
    "REGATHER_TAG",
    "REGATHER_FLOPS_PER_BYTE",
    "TAGS",
    "NEVER_RECOMPUTE_TAGS",
    "is_known_kind",
    "is_attention",
    "op_tags",
    "regather_tags",
    "regather_flops",
    "numel",
    "estimate_flops",
]

# ------------------------------------------------------------------------------------------ fusible prims
# Prims that Thunder 0.2.6's nvFuser executor registers translators for (thunder/executors/nvfuserex_impl.py,
# the ``register_supported`` calls), as lower-case PrimIDs names.  The unary and binary ones are nvFuser
# ops of the same name (``fd.ops.<name>``): remat's emitter (remat.thunder.nvfuser) writes them from these
# sets.  ``linear`` and ``matmul`` are listed because nvFuser *can* take them; whether a region does is a
# fusion-policy decision (remat.FusionPolicy).
NVFUSER_UNARY_PRIMS = frozenset(
    """
    abs acos acosh asin asinh atan atanh bitwise_not ceil cos cosh erf erfc erfcinv erfinv exp exp2 expm1
    floor isfinite lgamma log log10 log1p log2 neg real imag reciprocal round rsqrt sign signbit sin sinh
    sqrt tan tanh trunc
    """.split()
)
NVFUSER_BINARY_PRIMS = frozenset(
    """
    add sub mul atan2 bitwise_and bitwise_or bitwise_xor eq ne ge gt le lt fmod pow remainder maximum minimum
    nextafter bitwise_left_shift bitwise_right_shift
    """.split()
)
NVFUSER_ELEMENTWISE_PRIMS = (
    NVFUSER_UNARY_PRIMS | NVFUSER_BINARY_PRIMS | frozenset("clone shallow_copy div lerp where convert_element_type".split())
)
NVFUSER_REDUCTION_PRIMS = frozenset("amax amin prod sum var var_mean".split())
NVFUSER_SHAPE_PRIMS = frozenset(
    "broadcast_in_dim cat pad reshape slice squeeze transpose stride_order shape".split()
)
# nvFuser also takes copy_, index_put and scatter; remat leaves these in-place / scattering ops outside
# regions (they run as stand-alone torch ops), so that regions stay pure functions it can move.
NVFUSER_OTHER_PRIMS = frozenset("full iota uniform uniform_philox take take_along_axis embedding".split())
NVFUSER_MATMUL_PRIMS = frozenset({"linear", "matmul"})
NVFUSER_FUSIBLE_PRIMS = (
    NVFUSER_ELEMENTWISE_PRIMS
    | NVFUSER_REDUCTION_PRIMS
    | NVFUSER_SHAPE_PRIMS
    | NVFUSER_OTHER_PRIMS
    | NVFUSER_MATMUL_PRIMS
)

# -------------------------------------------------------------------------------------------------- views
#: View prims: each returns a view of its first (tensor) input, with strides that
#: :func:`remat.core.strides.view_strides` computes (a ``reshape`` only where strides can express it).
VIEW_PRIMS = frozenset({"reshape", "transpose", "slice", "squeeze", "broadcast_in_dim"})
#: The view prims PyTorch always runs as views (a stand-alone ``reshape`` copies when no strides express it).
ALWAYS_VIEW_PRIMS = VIEW_PRIMS - {"reshape"}
#: Prims whose output may share its input's storage: the view prims and ``shallow_copy``.  Inside a region,
#: nvFuser returns such an output computed from a region input or output as an alias of it.
ALIASING_PRIMS = VIEW_PRIMS | {"shallow_copy"}
#: Ops that run no computation of their own: regions made of nothing else are not worth launching
#: (Thunder's ``SHAPE_OP`` tag, ``shallow_copy`` included).
SHAPE_ONLY_KINDS = NVFUSER_SHAPE_PRIMS | {"shallow_copy"}
# Ops whose output shares storage with their first input when run on their own (outside a fusion,
# where every output is a fresh buffer).  Kinds of Thunder's torch executor appear with their
# Python names (e.g. ``Tensor.expand``); prims with their PrimIDs name.
VIEW_KINDS = ALIASING_PRIMS | frozenset(
    """
    view
    torch.reshape torch.Tensor.reshape Tensor.reshape Tensor.view torch.Tensor.view Tensor.expand torch.Tensor.expand
    torch.unsqueeze Tensor.unsqueeze torch.squeeze Tensor.squeeze torch.permute Tensor.permute torch.transpose
    Tensor.transpose torch.flatten Tensor.flatten torch.split torch.chunk torch_slice_prim_impl
    Tensor.__getitem__ torch.Tensor.__getitem__ Tensor.view_as Tensor.expand_as torch.movedim torch.narrow
    Tensor.t torch.t torch.Tensor.t torch.Tensor.mT Tensor.mT torch.unflatten torch.detach Tensor.detach
    """.split()
)

# ------------------------------------------------------------------------------------- cost classes
MATMUL_KINDS = frozenset(
    """
    linear matmul _grouped_mm convolution torch.nn.functional.linear torch.matmul torch.bmm torch.mm
    torch.addmm torch.baddbmm torch.nn.functional.conv2d torch.nn.functional.conv1d torch.einsum
    """.split()
)
# Attention kernels (fused matmul-softmax-matmul); their names depend on the executor that claimed them.
ATTENTION_MARKERS = ("scaled_dot_product", "sdpa", "flash_attention", "efficient_attention", "cudnn_sdpa")
#: The embedding table's gradient (Thunder's prim and symbol, the torch executor's operator): the op whose
#: scratch the graph runtime sizes against the plan's headroom (:func:`remat.core.memory.headroom`).
EMBEDDING_GRADIENT_KINDS = frozenset({"embedding_backward", "torch.ops.aten.embedding_backward"})
RNG_KINDS = frozenset("uniform randn randint multinomial torch.randn torch.rand torch.randint".split())
# Stateless random ops: recomputing them with the same seed/offset reproduces the same numbers.
STATELESS_RNG_KINDS = frozenset({"uniform_philox"})
# Reductions when they appear as top-level ops of Thunder's torch executor.
REDUCTION_KINDS = NVFUSER_REDUCTION_PRIMS | frozenset(
    "argmax argmin topk sort torch.sum torch.amax torch.var_mean torch.mean torch.var torch.max torch.min".split()
)

# ----------------------------------------------------------------------------------------- bookkeeping
# Bookkeeping symbols: they produce or consume names but no data worth modelling.
INPUT_KINDS = frozenset({"unpack_trivial", "unpack_sequence", "unpack_key", "unpack_attr", "unpack_parameter"})
COTANGENT_KIND = "get_grad"
RETURN_KIND = "return"
FUSION_KIND = "fusion"
BOOKKEEPING_KINDS = frozenset({"comment", "python_del", "del", "print", "sink"})

# ---------------------------------------------------------------------------------------- distributed
# Thunder's distributed prims (thunder/distributed/prims.py: an enum of their own, which the reader maps
# to these lower-case names like core prims) and the operators of Thunder's torch executor that run them
# (``torch_<prim>_prim_impl``, the kinds remat sees in traces from ``thunder.distributed.fsdp``/``ddp``).
def _with_torch_impls(names: str) -> frozenset[str]:
    prim_names = names.split()
    return frozenset(prim_names) | frozenset(f"torch_{name}_prim_impl" for name in prim_names)


#: Collectives and their waits.  Every rank must issue the same collectives in the same order, and a
#: wait returns the buffer its collective filled: recomputing one in the backward would send the data
#: again (and, on a future kept alive, hold a buffer the memory model cannot see), putting one in a
#: region would hand it to nvFuser.  Tag ``distributed``: never recomputed, never fused, always kept.
COLLECTIVE_KINDS = _with_torch_impls(
    "all_gather all_reduce broadcast reduce_scatter wait"
) | frozenset({"synchronize", "synchronize_tensor_parallel_output", "synchronize_tensor_parallel_input"})
#: The bucketing ops around collectives (``bucketing_strategy`` of ``thunder.distributed.fsdp``/``ddp``):
#: ``pack`` returns a buffer cached across steps per bucket, ``unpack`` copies into its ``tensors``,
#: ``update_bucket_view`` into a cached bucket, ``stash_grad_for_fsdp`` accumulates onto the parameter
#: (these four are also in the in-place family); ``pack_for_fsdp``/``unpack_for_fsdp`` build a bucket and
#: return views of one.  Tag ``distributed`` as well: they feed or drain collectives.
DISTRIBUTED_BUCKET_KINDS = _with_torch_impls("pack unpack update_bucket_view stash_grad_for_fsdp pack_for_fsdp unpack_for_fsdp")
_STATEFUL_BUCKET_KINDS = _with_torch_impls("pack unpack update_bucket_view stash_grad_for_fsdp")
DISTRIBUTED_KINDS = COLLECTIVE_KINDS | DISTRIBUTED_BUCKET_KINDS
#: The all-gathers (prim and the torch executor's operator) and the waits that complete collectives: what a
#: re-gather (tag ``regather``, :func:`regather_tags`) is made of.
ALL_GATHER_KINDS = _with_torch_impls("all_gather")
WAIT_KINDS = _with_torch_impls("wait")
#: The tag of a *re-gather*: an all-gather whose input is a graph input (under ``thunder.distributed.fsdp``,
#: a parameter's shard; its output is the unsharded parameter) and the wait that completes it.  Running
#: both again in the backward gathers the same parameter again, so recomputing them is sound; every other
#: distributed op stays never-recomputed.  Whether a policy lets them be recomputed is the policy's
#: (``RecomputePolicy(regather_parameters=True)``); the tag says only that they are of that shape.
REGATHER_TAG = "regather"
#: The FLOP-equivalent price of one byte a re-gather brings in (its gathered tensor's bytes): a re-gather
#: costs communication, not FLOPs, and the planner prices recomputation in FLOPs.  Approximate: about an
#: H100/H200's dense bf16 peak (~1e15 FLOP/s) over its NVLink bandwidth one way (~450 GB/s), i.e. the FLOPs
#: the GPU could run in the time the bytes take to arrive, rounded to a power of two.  Across nodes
#: (slower links) a byte costs more; overlapped with compute (prefetching, as FSDP does) less.  Used by the
#: budget search (:mod:`remat.planning.budget`), which prices re-gathers, and counted in ``extra_flops``.
REGATHER_FLOPS_PER_BYTE = 2048

# ------------------------------------------------------------------------------------------- in place
# The in-place family: ops that write into an existing buffer (``copy_(src, dst)`` writes ``dst``), keep
# state (the RNG state, the distributed bucket caches), record aliasing (``update_aliases``), or scatter
# into a copy of a buffer.  They always stay stand-alone ops where the trace has them and are never
# recomputed (tag ``in_place``).
MUTATING_KINDS = frozenset({"copy_"})
IN_PLACE_KINDS = MUTATING_KINDS | frozenset(
    """
    update_aliases get_and_update_rng_state copy_with_setitem copy_with_setitem_impl setitem_
    index_put index_copy index_add scatter scatter_add index_fill masked_scatter slice_scatter select_scatter
    diagonal_scatter as_strided_scatter
    torch.index_put torch.index_copy torch.index_add torch.scatter torch.scatter_add torch.index_fill
    torch.Tensor.index_put_ torch.Tensor.index_copy_ torch.Tensor.index_add_ torch.Tensor.scatter_
    torch.Tensor.scatter_add_ torch.Tensor.index_fill_ torch.Tensor.copy_ torch.Tensor.__setitem__
    """.split()
) | _STATEFUL_BUCKET_KINDS

#: Ops that must stay even when nothing reads their outputs (besides ops Thunder tags ``DONT_DCE`` or
#: ``IN_PLACE``): collectives and waits (every rank runs them) and the stateful bucketing ops included.
SIDE_EFFECT_KINDS = (
    frozenset({"copy_", "get_and_update_rng_state", "update_aliases", "sink"}) | COLLECTIVE_KINDS | _STATEFUL_BUCKET_KINDS
)

# ------------------------------------------------------------------------------------------------ tags
#: Every tag :func:`op_tags` gives, and so every tag a plain graph may carry (docs/graph-schema.md).
TAGS = frozenset(
    {
        "matmul", "attention", "reduction", "rng", "rng_stateless", "view", "shape", "in_place", "mutates", "opaque",
        "no_recompute", "distributed", REGATHER_TAG,
    }
)
# Tags that forbid recomputation whatever the RecomputePolicy says (see :func:`op_tags`).
NEVER_RECOMPUTE_TAGS = frozenset({"in_place", "opaque", "no_recompute", "distributed"})
# remat's own kinds and Thunder's bookkeeping.
_REMAT_KNOWN_KINDS = frozenset({COTANGENT_KIND, RETURN_KIND, FUSION_KIND, "python_return"})
_TABLES = (
    NVFUSER_FUSIBLE_PRIMS | VIEW_KINDS | MATMUL_KINDS | RNG_KINDS | STATELESS_RNG_KINDS | REDUCTION_KINDS
    | INPUT_KINDS | BOOKKEEPING_KINDS | IN_PLACE_KINDS | DISTRIBUTED_KINDS | _REMAT_KNOWN_KINDS
)


@functools.lru_cache(maxsize=4096)
def is_known_kind(kind: str) -> bool:
    """Whether remat knows what an op of this kind does from its name alone: the kinds in this module's
    tables, attention kernels, remat's own ops (``remat_*``) and torch-language symbols (``torch.*``,
    ``Tensor.*``; of ``torch.ops`` only ``aten``).  The Thunder reader adds Thunder's prims and the
    operators of its torch and Python executors (:func:`remat.thunder.read.symbol_facts`).  Unknown ops
    (a custom executor's kernel, a user's ``torch.ops`` library) are left where the trace has them: never
    fused, never recomputed (tag ``opaque``)."""
    if kind in _TABLES or is_attention(kind) or kind.startswith("remat_"):
        return True
    if kind.startswith("torch.ops."):
        return kind.startswith("torch.ops.aten.")
    return kind.startswith(("torch.", "Tensor."))


def is_attention(kind: str) -> bool:
    """True for fused attention kernels (treated like matmuls: never recomputed by default)."""
    lowered = kind.lower()
    return any(marker in lowered for marker in ATTENTION_MARKERS)


def op_tags(kind: str, thunder_tags: Iterable[str] = (), *, known: bool | None = None) -> frozenset[str]:
    """Tags remat uses for an op: a subset of :data:`TAGS`.  ``thunder_tags`` are lower-case names of
    Thunder ``OpTags`` on the symbol; ``known`` whether remat knows the kind (default
    :func:`is_known_kind`).

    ``in_place``: the in-place family (:data:`IN_PLACE_KINDS`, or Thunder's ``IN_PLACE`` tag); ``mutates``:
    it writes into a buffer it reads (``copy_``, Thunder ``IN_PLACE`` symbols); ``opaque``: a kind remat
    does not know; ``no_recompute``: Thunder's ``DONT_RECOMPUTE_IN_BACKWARD``; ``distributed``: a
    collective, its wait or a bucketing op around them (:data:`DISTRIBUTED_KINDS`).  ``regather`` depends on
    an op's inputs, not its kind: the reader adds it (:func:`regather_tags`).
    Ops tagged ``in_place``, ``opaque``, ``no_recompute`` or ``distributed`` (:data:`NEVER_RECOMPUTE_TAGS`)
    are never recomputed and never join a region."""
    return _op_tags(kind, frozenset(thunder_tags), is_known_kind(kind) if known is None else known)


@functools.lru_cache(maxsize=4096)
def _op_tags(kind: str, thunder_tags: frozenset[str], known: bool) -> frozenset[str]:
    tags = set()
    if kind in MATMUL_KINDS or "matmul_op" in thunder_tags:
        tags.add("matmul")
    if is_attention(kind):
        tags.add("attention")
    if kind in REDUCTION_KINDS or "reduction_op" in thunder_tags:
        tags.add("reduction")
    if kind in STATELESS_RNG_KINDS:
        tags.add("rng_stateless")
    elif kind in RNG_KINDS or "random_op" in thunder_tags:
        tags.add("rng")
    if kind in VIEW_KINDS:
        tags.add("view")
    if kind in NVFUSER_SHAPE_PRIMS or "shape_op" in thunder_tags:
        tags.add("shape")
    if kind in IN_PLACE_KINDS or "in_place" in thunder_tags:
        tags.add("in_place")
    if kind in MUTATING_KINDS or "in_place" in thunder_tags:
        tags.add("mutates")
    if "dont_recompute_in_backward" in thunder_tags:
        tags.add("no_recompute")
    if kind in DISTRIBUTED_KINDS:
        tags.add("distributed")
    if not known:
        tags.add("opaque")
    return frozenset(tags)


def regather_tags(
    kind: str, tags: frozenset[str], *, reads_graph_input: bool = False, completes_regather: bool = False
) -> frozenset[str]:
    """``tags`` with :data:`REGATHER_TAG` added when the op is part of a re-gather: an all-gather
    (:data:`ALL_GATHER_KINDS`) whose tensor input is a graph input (``reads_graph_input``), or a wait
    (:data:`WAIT_KINDS`) whose input is the future of such an all-gather (``completes_regather``).  The
    graph facts are the reader's (:mod:`remat.thunder.read`; plain graphs carry the tag themselves); the
    rule is this one.  Any other op's tags come back unchanged."""
    if "distributed" not in tags:
        return tags
    if (kind in ALL_GATHER_KINDS and reads_graph_input) or (kind in WAIT_KINDS and completes_regather):
        return tags | {REGATHER_TAG}
    return tags


def regather_flops(gathered_bytes: int) -> int:
    """The FLOP-equivalent price of a re-gather bringing in ``gathered_bytes``
    (:data:`REGATHER_FLOPS_PER_BYTE` each; approximate, see there)."""
    if isinstance(gathered_bytes, bool) or not isinstance(gathered_bytes, int) or gathered_bytes < 0:
        raise ValueError(f"gathered_bytes must be a non-negative int, got {gathered_bytes!r}")
    return gathered_bytes * REGATHER_FLOPS_PER_BYTE


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def estimate_flops(
    kind: str,
    tags: frozenset[str],
    input_shapes: Sequence[Sequence[int]],
    output_shapes: Sequence[Sequence[int]],
    *,
    backward: bool = False,
    gathered_bytes: int = 0,
) -> int:
    """Rough FLOP count of one op from its kind, tags and tensor shapes (see module docstring).
    Distributed ops compute nothing (0), except a re-gather's all-gather, which is priced at the
    FLOP-equivalent of the ``gathered_bytes`` it brings in (:func:`regather_flops`)."""
    if "distributed" in tags:
        return regather_flops(gathered_bytes) if REGATHER_TAG in tags and kind in ALL_GATHER_KINDS else 0
    out_elems = sum(numel(s) for s in output_shapes)
    if "view" in tags or "shape" in tags or kind in INPUT_KINDS or kind in BOOKKEEPING_KINDS:
        return 0
    if "attention" in tags:
        if input_shapes and len(input_shapes[0]) >= 2 and len(input_shapes) >= 2 and len(input_shapes[1]) >= 2:
            query, key = input_shapes[0], input_shapes[1]
            *batch, target_len, head_dim = query
            source_len = key[-2]
            forward = 4 * numel(batch) * target_len * source_len * head_dim
            return 2 * forward if backward else forward
        return out_elems
    if "matmul" in tags:
        if input_shapes and input_shapes[0]:
            reduced_dim = input_shapes[0][-1]
            return 2 * out_elems * reduced_dim
        return 2 * out_elems
    if "reduction" in tags:
        return sum(numel(s) for s in input_shapes) if input_shapes else out_elems
    return out_elems
