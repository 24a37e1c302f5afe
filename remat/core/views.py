"""Which values are views, and whose storage they keep alive: the one place that decides it.

Two rules, both on plain data (names, shapes, the arguments of view prims):

* a *stand-alone* view op shares its input's storage as PyTorch does: ``transpose``, ``slice``,
  ``squeeze``, ``broadcast_in_dim`` always; ``reshape`` when strides over the input can express the new
  shape, else it copies (:func:`view_layout`, :mod:`remat.core.strides`);
* a *region* output computed by view ops alone from a region input or from another region output is
  returned by nvFuser as an alias of it, not as a new buffer (:func:`region_views`).  Measured on the H200:
  the ``v`` of a fused qkv split (slice, reshape, transpose) kept the whole qkv buffer alive.

The Thunder reader (:mod:`remat.thunder.read`) applies both while reading a trace; the plan layout
(:mod:`remat.core.layout`) applies the region rule to the regions a plan rewrites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, NamedTuple, TypeVar

from remat.core.ops import ALIASING_PRIMS, VIEW_PRIMS
from remat.core.strides import contiguous_strides, is_contiguous, view_strides

__all__ = ["ViewFacts", "alias_base", "view_layout", "member_view", "region_views"]

Strides = MutableMapping[str, tuple[int, ...]]
Member = TypeVar("Member")


class ViewFacts(NamedTuple):
    """What the layout rules need of an aliasing prim (:data:`remat.core.ops.ALIASING_PRIMS`): the name
    and shape of its tensor input, its output's name and shape, and its arguments (the input's place
    holding its name; the rest are plain shapes, dims or indices, as the prim takes them)."""

    source: str
    output: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    args: tuple[Any, ...]


def alias_base(name: str, tensors: Mapping[str, Any]) -> str:
    """The value whose storage ``name`` lives in (``tensors[name].alias_of``, or ``name`` itself)."""
    info = tensors.get(name)
    return (info.alias_of or name) if info is not None else name


def view_layout(kind: str, facts: ViewFacts, strides: Strides) -> bool:
    """Whether aliasing prim ``kind`` returns a view of its input (False: a reshape no strides can
    express, which copies).  ``strides`` holds the strides of non-contiguous values (others are
    contiguous); the output's are recorded there when they are not contiguous."""
    in_strides = strides.get(facts.source)
    if in_strides is None:  # a contiguous input: these stay contiguous views
        if kind in ("reshape", "squeeze", "shallow_copy"):
            return True
        in_strides = contiguous_strides(facts.in_shape)
    if kind in VIEW_PRIMS:
        out_strides = view_strides(kind, facts.args, facts.in_shape, in_strides, facts.out_shape)
        if out_strides is None:
            return False
    else:  # other aliasing ops (shallow_copy) keep the layout
        out_strides = in_strides if tuple(facts.in_shape) == tuple(facts.out_shape) else contiguous_strides(facts.out_shape)
    if not is_contiguous(facts.out_shape, out_strides):
        strides[facts.output] = out_strides
    return True


def member_view(kind: str, facts: ViewFacts | None, strides: Strides) -> bool:
    """Whether an op inside a region returns a view of its one tensor input (see :func:`view_layout`)."""
    if kind not in ALIASING_PRIMS or facts is None or facts.output == facts.source:
        return False
    return view_layout(kind, facts, strides)


def region_views(
    members: Iterable[tuple[str, Sequence[str], Member]],
    sources: set[str],
    base_of: Callable[[str], str],
    is_view: Callable[[Member], bool],
) -> dict[str, str]:
    """The values a region computes by view ops alone from ``sources`` (its inputs and outputs), each with
    the storage it lives in (``base_of(name)`` for the name a chain starts from).

    ``members``: ``(source, outputs, member)`` for the region's ops that read one tensor, in order;
    ``is_view(member)`` says whether that op returns a view of ``source``.  It is asked only for ops on a
    chain that starts at a source (the reader's test is the costly part)."""
    views: dict[str, str] = {}
    for source, outputs, member in members:
        if source in views:
            base = views[source]
        elif source in sources:
            base = None
        else:
            continue
        if not is_view(member):
            continue
        if base is None:
            base = base_of(source)
        for out in outputs:
            views[out] = base
    return views
