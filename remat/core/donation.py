"""Donation: a region that writes an output into the storage of an input dying there.

Why: TorchInductor, given ``x.copy_(f(x, ...))`` for an elementwise ``f``, computes ``f`` and stores it
into ``x``'s buffer in one kernel, with no buffer of its own (checked on the CPU: the compiled call writes
into the input it was handed and allocates nothing).  The graph runtime (:mod:`remat.thunder.graph`)
writes a region's output that way where the input dies at that region: the output then needs no new
memory.  The largest case is the loss's gradient: the logits' gradient, as big as the logits, takes the
logits' storage, which the backward reads there for the last time (Llama-2-7b at vocabulary 32000,
batch 4 x seq 8192: 2000 MiB, the difference between the step's peak and what it saves).

The rule, in one place (:func:`find_donations`), read by the memory model (a donated output lives in
its donor's storage: :func:`remat.core.memory.lifetimes`) and by the graph runtime (which writes it
there).  A region output ``O`` takes the storage of a region input ``I`` when

* every operation of the region is elementwise, a broadcast, a reshape, or makes a constant
  (:data:`DONATING_KINDS`): each element of ``O`` is then computed from the same element of ``I``, so
  the kernel can write ``O`` over ``I`` as it goes;
* ``I`` and ``O`` have the same dtype and the same number of bytes, and both are contiguous; the storage
  ``I`` lives in (its base) is no bigger than ``I``;
* that storage belongs to the step (an activation: not a parameter, an input or a gradient handed in)
  and every value living in it is read for the last time at this region (in execution order);
* ``O`` is not returned by the step, not a view, and not one of ``pinned`` (values the runtime lays out
  otherwise: attention's query, key and value).

Approximate where the runtime disagrees: a region the graph runtime cannot take (a trace that stays
region by region) writes no output in place, and its peak is then above the estimate; the runtime
notes it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

from remat.core.ir import FusionGraph
from remat.core.ops import NVFUSER_ELEMENTWISE_PRIMS

__all__ = ["DONATING_KINDS", "find_donations", "with_donations", "storage_roots"]

#: Operations a region may hold for its outputs to be written over a dying input: elementwise ones, and
#: those that only broadcast a value, change the shape of a contiguous one, or make a constant.  No slice,
#: transpose, cat, pad or gather (an output element would be computed from other positions of the
#: input), and no reduction: Inductor 2.11's CPU code generator failed (``KeyError``) on a softmax written
#: with ``copy_`` over its own graph input.  Inductor does write such a region's output over a dying
#: intermediate by itself (its ``inplace_buffers``), which this rule does not model: there the measured
#: peak can be below the estimate (the forward's loss of a narrow model with a large vocabulary, on the
#: CPU: docs/benchmarks.md).
DONATING_KINDS = NVFUSER_ELEMENTWISE_PRIMS | frozenset({"broadcast_in_dim", "reshape", "squeeze", "iota", "full"})


def storage_roots(graph: FusionGraph) -> dict[str, str]:
    """For every value of ``graph`` whose storage is another's: that other value (a view's base, a
    donated output's donor's storage), followed to the end.  Values in their own storage are left out."""
    step = {name: info.alias_of for name, info in graph.tensors.items() if info.alias_of is not None}
    step.update(graph.donations)
    roots: dict[str, str] = {}
    for name in step:
        root = name
        while root in step:  # views and donations never form a cycle: each points to an earlier value
            root = step[root]
        roots[name] = root
    return roots


def find_donations(
    graph: FusionGraph, member_kinds: Mapping[int, Sequence[str]], pinned: Collection[str] = ()
) -> dict[str, str]:
    """``{output: input}`` for every region output that takes the storage of an input dying at its region
    (the module docstring's rule), in execution order.  ``member_kinds``: the op kinds inside each region
    unit, by unit index; ``pinned``: values that must have storage of their own."""
    tensors, units = graph.tensors, graph.units
    order = graph.execution_order()
    position = {unit_index: step for step, unit_index in enumerate(order)}
    last_read: dict[str, int] = {}
    for unit_index in order:
        unit = units[unit_index]
        step = len(order) if unit.kind == "return" else position[unit_index]
        for name in unit.inputs:
            last_read[name] = max(last_read.get(name, -1), step)
    kept = set(graph.forward_outputs) | set(graph.gradients) | set(pinned)

    root: dict[str, str] = {name: info.alias_of for name, info in tensors.items() if info.alias_of is not None}
    living: dict[str, list[str]] = {}  # storage -> the values living in it
    for name in tensors:
        living.setdefault(root.get(name, name), []).append(name)
    donations: dict[str, str] = {}
    for unit_index in order:
        unit = units[unit_index]
        kinds = member_kinds.get(unit_index)
        if unit.kind != "region" or not kinds or any(kind not in DONATING_KINDS for kind in kinds):
            continue
        step = position[unit_index]
        taken: set[str] = set()
        for output in unit.outputs:
            out = tensors.get(output)
            if out is None or out.kind != "activation" or out.alias_of is not None or output in kept or output in graph.strides:
                continue
            for donor in unit.inputs:
                if donor in unit.outputs:
                    continue
                storage = root.get(donor, donor)
                if storage in taken or not _fits(tensors, donor, storage, out, graph.strides):
                    continue
                values = living.get(storage, ())
                if any(name in kept or last_read.get(name, -1) > step for name in values):
                    continue
                donations[output] = donor
                taken.add(storage)
                root[output] = storage
                living[storage].append(output)
                break
    return donations


def with_donations(graph: FusionGraph, member_kinds: Mapping[int, Sequence[str]], pinned: Collection[str]) -> FusionGraph:
    """``graph``, just built and not yet read by anyone, marked as run where region outputs are written
    over dying inputs (``donating``: ``pinned``) and given its donations (:func:`find_donations`).  Set in
    place rather than copied: the reader and every plan a budget search simulates call this, and a copy
    of a frozen graph copies its tensor table."""
    object.__setattr__(graph, "donating", frozenset(pinned))
    object.__setattr__(graph, "donations", MappingProxyType(find_donations(graph, member_kinds, pinned)))
    return graph


def _fits(tensors: Mapping, donor: str, storage: str, out, strides: Mapping) -> bool:
    info, base = tensors.get(donor), tensors.get(storage)
    if info is None or base is None or base.kind != "activation":
        return False
    if donor in strides or storage in strides:  # a strided view: its elements are not the output's order
        return False
    return info.dtype == out.dtype and info.bytes == out.bytes == base.bytes
