"""What remat knows about operations: which ones nvFuser fuses, which alias their input, which are
expensive, random or reductions, and roughly how many FLOPs each costs.

Everything here works on plain strings (an op's *kind*, see :func:`op_kind`) and shapes, so that the
graph, memory and solver stages can be tested without Thunder.  :func:`op_kind` is the one place that
maps a Thunder bound symbol to such a string.

FLOP figures are estimates (documented in docs/memory-model.md): elementwise ops count one FLOP per
output element, reductions one per input element, matmul-like ops ``2*M*N*K``, attention ``4*B*H*T*S*D``
forward and twice that backward.  They are used to rank recomputation choices, not to predict time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

# Prims that Thunder 0.2.6's nvFuser executor registers translators for (thunder/executors/nvfuserex_impl.py,
# the ``register_supported`` calls), as lower-case PrimIDs names.  ``linear`` and ``matmul`` are listed
# because nvFuser *can* take them; whether a region does is a fusion-policy decision (NvFuserPolicy).
NVFUSER_ELEMENTWISE_PRIMS = frozenset(
    """
    abs acos acosh asin asinh atan atanh bitwise_not ceil cos cosh erf erfc erfcinv erfinv exp exp2 expm1
    floor isfinite lgamma log log10 log1p log2 neg real imag reciprocal round rsqrt sign signbit sin sinh
    sqrt tan tanh trunc clone shallow_copy add atan2 bitwise_and bitwise_or bitwise_xor div eq fmod ge gt
    le lt mul ne nextafter pow remainder sub maximum minimum bitwise_left_shift bitwise_right_shift lerp
    where convert_element_type
    """.split()
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

# Ops whose output shares storage with their first input when run on their own (outside a fusion,
# where every output is a fresh buffer).  Kinds of Thunder's torch executor appear with their
# Python names (e.g. ``Tensor.expand``); prims with their PrimIDs name.
VIEW_KINDS = frozenset(
    """
    reshape broadcast_in_dim squeeze transpose slice shallow_copy view
    torch.reshape torch.Tensor.reshape Tensor.reshape Tensor.view torch.Tensor.view Tensor.expand torch.Tensor.expand
    torch.unsqueeze Tensor.unsqueeze torch.squeeze Tensor.squeeze torch.permute Tensor.permute torch.transpose
    Tensor.transpose torch.flatten Tensor.flatten torch.split torch.chunk torch_slice_prim_impl
    Tensor.__getitem__ torch.Tensor.__getitem__ Tensor.view_as Tensor.expand_as torch.movedim torch.narrow
    Tensor.t torch.t torch.Tensor.t torch.Tensor.mT Tensor.mT torch.unflatten torch.detach Tensor.detach
    """.split()
)

MATMUL_KINDS = frozenset(
    """
    linear matmul _grouped_mm convolution torch.nn.functional.linear torch.matmul torch.bmm torch.mm
    torch.addmm torch.baddbmm torch.nn.functional.conv2d torch.nn.functional.conv1d torch.einsum
    """.split()
)
# Attention kernels (fused matmul-softmax-matmul); their names depend on the executor that claimed them.
ATTENTION_MARKERS = ("scaled_dot_product", "sdpa", "flash_attention", "efficient_attention", "cudnn_sdpa")
RNG_KINDS = frozenset("uniform randn randint multinomial torch.randn torch.rand torch.randint".split())
# Stateless random ops: recomputing them with the same seed/offset reproduces the same numbers.
STATELESS_RNG_KINDS = frozenset({"uniform_philox"})
# Reductions when they appear as top-level ops of Thunder's torch executor.
REDUCTION_KINDS = NVFUSER_REDUCTION_PRIMS | frozenset(
    "argmax argmin topk sort torch.sum torch.amax torch.var_mean torch.mean torch.var torch.max torch.min".split()
)
# Bookkeeping symbols: they produce or consume names but no data worth modelling.
INPUT_KINDS = frozenset({"unpack_trivial", "unpack_sequence", "unpack_key", "unpack_attr", "unpack_parameter"})
COTANGENT_KIND = "get_grad"
RETURN_KIND = "return"
BOOKKEEPING_KINDS = frozenset({"comment", "python_del", "del", "print", "sink"})

# The in-place family: ops that write into an existing buffer (``copy_(src, dst)`` writes ``dst``), keep
# state (the RNG state), record aliasing (``update_aliases``), or scatter into a copy of a buffer.  They
# always stay stand-alone ops where the trace has them and are never recomputed (tag ``in_place``).
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
)
# Tags that forbid recomputation whatever the RecomputePolicy says (see :func:`op_tags`).
NEVER_RECOMPUTE_TAGS = frozenset({"in_place", "opaque", "no_recompute"})
# remat's own kinds and Thunder's bookkeeping; Thunder's prims and the ops of its torch and Python
# executors are known too (:func:`is_known_kind`).
_REMAT_KNOWN_KINDS = frozenset({COTANGENT_KIND, RETURN_KIND, "fusion", "python_return"})


def _tables() -> frozenset[str]:
    return (
        NVFUSER_FUSIBLE_PRIMS | VIEW_KINDS | MATMUL_KINDS | RNG_KINDS | STATELESS_RNG_KINDS | REDUCTION_KINDS
        | INPUT_KINDS | BOOKKEEPING_KINDS | IN_PLACE_KINDS | _REMAT_KNOWN_KINDS
    )


@functools.lru_cache(maxsize=1)
def _thunder_kinds() -> frozenset[str]:
    """Names of Thunder's prims and of the operators its torch and Python executors register: ops whose
    meaning Thunder defines (functional, apart from the in-place family).  Empty without Thunder."""
    try:
        from thunder.core.prims import PrimIDs
        from thunder.executors import pythonex, torchex
    except Exception:  # pragma: no cover - remat.ops works on plain strings without Thunder
        return frozenset()
    return frozenset(p.name.lower() for p in PrimIDs) | frozenset(torchex.ex.opmap) | frozenset(pythonex.ex.opmap)


@functools.lru_cache(maxsize=4096)
def is_known_kind(kind: str) -> bool:
    """Whether remat knows what an op of this kind does.  Known: the kinds in this module's tables,
    attention kernels, remat's own ops (``remat_*``), Thunder's prims and torch-language symbols
    (``torch.*``, ``Tensor.*``; of ``torch.ops`` only ``aten``), and the operators of Thunder's torch and
    Python executors.  Unknown ops (a custom executor's kernel, a user's ``torch.ops`` library) are left
    where the trace has them: never fused, never recomputed (tag ``opaque``)."""
    if kind in _tables() or is_attention(kind) or kind.startswith("remat_"):
        return True
    if kind.startswith("torch.ops."):
        return kind.startswith("torch.ops.aten.")
    if kind.startswith(("torch.", "Tensor.")):
        return True
    return kind in _thunder_kinds()


def is_attention(kind: str) -> bool:
    """True for fused attention kernels (treated like matmuls: never recomputed by default)."""
    lowered = kind.lower()
    return any(marker in lowered for marker in ATTENTION_MARKERS)


def op_tags(kind: str, thunder_tags: Iterable[str] = ()) -> frozenset[str]:
    """Tags remat uses for an op: subset of {"matmul", "attention", "reduction", "rng", "rng_stateless",
    "view", "shape", "in_place", "mutates", "opaque", "no_recompute"}.  ``thunder_tags`` are lower-case
    names of Thunder ``OpTags`` on the symbol.

    ``in_place``: the in-place family (:data:`IN_PLACE_KINDS`, or Thunder's ``IN_PLACE`` tag); ``mutates``:
    it writes into a buffer it reads (``copy_``, Thunder ``IN_PLACE`` symbols); ``opaque``: a kind remat
    does not know (:func:`is_known_kind`); ``no_recompute``: Thunder's ``DONT_RECOMPUTE_IN_BACKWARD``.
    Ops with any of the last four tags except ``mutates`` alone are never recomputed."""
    return _op_tags(kind, frozenset(thunder_tags))


@functools.lru_cache(maxsize=4096)
def _op_tags(kind: str, thunder_tags: frozenset[str]) -> frozenset[str]:
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
    if not is_known_kind(kind):
        tags.add("opaque")
    return frozenset(tags)


def written_buffer(kind: str, tags: Iterable[str], inputs: Sequence[str]) -> str | None:
    """The name of the buffer an op writes in place: ``copy_(src, dst)`` writes ``dst``; a Thunder
    ``IN_PLACE`` symbol its first argument.  None for other ops."""
    if kind in MUTATING_KINDS:
        return inputs[1] if len(inputs) > 1 else None
    if "mutates" in tags and inputs:
        return inputs[0]
    return None


class _Storage:
    """Union-find over value names: names in one set may share storage."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        parent = self.parent
        root = name
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(name, name) != root:  # path compression
            parent[name], name = root, parent[name]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


OpRecord = tuple  # (kind, tags, inputs, outputs): plain data for the functions below


def _storage_and_writes(records: Sequence[OpRecord]) -> tuple[_Storage, dict[str, tuple[int, str]]]:
    """Storage sets and, per set (its root), the position and kind of the last op writing it in place."""
    storage = _Storage()
    writes: list[tuple[int, str, str]] = []
    for position, (kind, tags, inputs, outputs) in enumerate(records):
        written = written_buffer(kind, tags, inputs)
        if written is not None:
            writes.append((position, written, kind))
            for out in outputs:
                storage.union(out, written)  # copy_ returns its destination
        elif kind == "update_aliases" and inputs:  # its arguments may alias each other; outputs are them
            for name in (*inputs, *outputs):
                storage.union(name, inputs[0])
        elif "view" in tags and inputs:
            for out in outputs:
                storage.union(out, inputs[0])
    last: dict[str, tuple[int, str]] = {}
    for position, written, kind in writes:
        root = storage.find(written)
        if root not in last or last[root][0] < position:
            last[root] = (position, kind)
    return storage, last


def mutated_storage(records: Sequence[OpRecord]) -> set[str]:
    """Names (read or written by ``records``) that may share storage with a buffer some op writes in
    place.  ``records``: ``(kind, tags, inputs, outputs)`` per op, tags from :func:`op_tags`.  Views,
    ``update_aliases`` and ``copy_`` link storage; an over-approximation (views inside regions count too)."""
    if not any("mutates" in r[1] for r in records):
        return set()
    storage, last = _storage_and_writes(records)
    names = {n for r in records for n in (*r[2], *r[3])}
    return {n for n in names if storage.find(n) in last}


def mutation_hazards(records: Sequence[OpRecord]) -> dict[int, str]:
    """Positions of the ops that read a value sharing storage with a buffer that an op *later in*
    ``records`` writes in place, each with the kind of that op.  ``records`` are in execution order.
    Recomputing such an op after the write would read the new contents, so it must stay where it is.
    Ops of the in-place family themselves are left out (they are never recomputed anyway)."""
    if not any("mutates" in r[1] for r in records):
        return {}
    storage, last = _storage_and_writes(records)
    hazards: dict[int, str] = {}
    for position, (kind, tags, inputs, _outputs) in enumerate(records):
        if "in_place" in tags:
            continue
        for name in inputs:
            write = last.get(storage.find(name))
            if write is not None and write[0] > position:
                hazards[position] = write[1]
                break
    return hazards


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def estimate_flops(
    kind: str,
    tags: frozenset[str],
    input_shapes: Sequence[Sequence[int]],
    output_shapes: Sequence[Sequence[int]],
    *,
    backward: bool = False,
) -> int:
    """Rough FLOP count of one op from its kind, tags and tensor shapes (see module docstring)."""
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
