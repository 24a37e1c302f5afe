"""Storage layout of view ops: which views share their input's storage, and with what strides.

The memory model needs to know when a value is a *view* (it keeps its base's storage alive, whatever its
own size) and when it is fresh storage.  Two runtimes decide this the same way:

* PyTorch: ``transpose``/``slice``/``squeeze``/``broadcast_in_dim`` (expand) always return views;
  ``reshape`` returns a view when the new shape can be expressed with strides over the old storage, and
  copies otherwise.
* nvFuser: a fusion output computed from a fusion *input* by view ops alone is returned as an alias of
  that input (nvFuser's alias analysis), not as a new buffer.  Measured on the H200: the ``v`` of a
  fused qkv split (slice, reshape, transpose) kept the whole 60 MiB qkv buffer alive.

The layout of attention's tensors is a third fact, of the runtime: where attention's query, key and
value are laid out token by token (:func:`token_major_strides`; the graph runtime does it), attention's
output is too, and its ``transpose(1, 2)`` + ``reshape`` for the output projection is a view, not a copy.

Strides are tracked in elements; the storage offset is irrelevant to aliasing and ignored.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

__all__ = ["contiguous_strides", "is_contiguous", "reshape_strides", "token_major_strides", "view_strides"]


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of a fresh tensor of ``shape``."""
    return _contiguous_strides(tuple(shape))


@functools.lru_cache(maxsize=8192)  # a trace has few distinct shapes, read many times
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def token_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Strides of a ``(batch, heads, tokens, head_dim)`` tensor laid out token by token in memory, as
    ``(batch, tokens, heads, head_dim)``: the layout in which a qkv projection's output already is, so that
    ``q``, ``k`` and ``v`` are written with unit-stride rows and the attention output, which cuDNN (and
    PyTorch's CPU flash attention) allocates in its query's layout, is a free view of ``(batch, tokens,
    heads * head_dim)`` for the output projection (forward and backward) instead of a transposing copy."""
    batch, heads, tokens, head_dim = shape
    return (tokens * heads * head_dim, head_dim, heads * head_dim, 1)


def reshape_strides(shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]) -> tuple[int, ...] | None:
    """Strides of ``reshape(new_shape)`` as a view over a tensor of ``shape``/``strides``, or None when no
    view exists (PyTorch then copies).

    Dimensions of the old shape are grouped into runs that are contiguous with each other; a view exists
    when the new shape splits and merges within those runs only (size-1 dimensions are free)."""
    shape, strides, new_shape = tuple(shape), tuple(strides), tuple(new_shape)
    if math.prod(shape) != math.prod(new_shape):
        return None
    if not shape or math.prod(shape) == 0:
        return contiguous_strides(new_shape)
    result = [0] * len(new_shape)
    view_dim = len(new_shape) - 1
    run_stride = strides[-1]  # stride of the innermost dimension of the current run
    run_numel = 1
    view_numel = 1
    for dim in range(len(shape) - 1, -1, -1):
        run_numel *= shape[dim]
        run_ends = dim == 0 or (shape[dim - 1] != 1 and strides[dim - 1] != run_numel * run_stride)
        if not run_ends:
            continue
        # give the new dimensions that cover this run their strides
        while view_dim >= 0 and (view_numel < run_numel or new_shape[view_dim] == 1):
            result[view_dim] = view_numel * run_stride
            view_numel *= new_shape[view_dim]
            view_dim -= 1
        if view_numel != run_numel:
            return None
        if dim > 0:
            run_stride = strides[dim - 1]
            run_numel = 1
            view_numel = 1
    if view_dim != -1:
        return None
    return tuple(result)


def view_strides(kind: str, args: Sequence, in_shape: Sequence[int], in_strides: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...] | None:
    """Strides of the output of view op ``kind`` (a prim name from :data:`remat.core.ops.VIEW_PRIMS`, with the bound
    symbol's ``args``) applied to an input of ``in_shape``/``in_strides``; None when the op copies."""
    in_shape, in_strides, out_shape = tuple(in_shape), tuple(in_strides), tuple(out_shape)
    if kind == "reshape":
        return reshape_strides(in_shape, in_strides, out_shape)
    if kind == "transpose":
        permutation = tuple(args[1])
        return tuple(in_strides[d] for d in permutation)
    if kind == "slice":
        steps = args[3] if len(args) > 3 and args[3] is not None else (1,) * len(in_shape)
        return tuple(s * int(step) for s, step in zip(in_strides, steps))
    if kind == "squeeze":
        dims = {d % max(len(in_shape), 1) for d in (args[1] if len(args) > 1 else ())}
        return tuple(s for d, s in enumerate(in_strides) if d not in dims)
    if kind == "broadcast_in_dim":
        broadcast_dims = tuple(args[2]) if len(args) > 2 else tuple(range(len(out_shape) - len(in_shape), len(out_shape)))
        result = [0] * len(out_shape)
        for in_dim, out_dim in enumerate(broadcast_dims):
            if in_shape[in_dim] == out_shape[out_dim]:
                result[out_dim] = in_strides[in_dim]
        return tuple(result)
    return None


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``strides`` are row-major for ``shape`` (size-1 dimensions may have any stride)."""
    expected = _contiguous_strides(tuple(shape))
    if tuple(strides) == expected:
        return True
    return all(size == 1 or s == e for size, s, e in zip(shape, strides, expected))
