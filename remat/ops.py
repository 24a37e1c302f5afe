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


def is_attention(kind: str) -> bool:
    """True for fused attention kernels (treated like matmuls: never recomputed by default)."""
    lowered = kind.lower()
    return any(marker in lowered for marker in ATTENTION_MARKERS)


def op_tags(kind: str, thunder_tags: Iterable[str] = ()) -> frozenset[str]:
    """Tags remat uses for an op: subset of {"matmul", "attention", "reduction", "rng", "rng_stateless",
    "view", "shape"}.  ``thunder_tags`` are lower-case names of Thunder ``OpTags`` on the symbol."""
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
    return frozenset(tags)


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
