"""The memory model: the allocation timeline of one training step, from a trace or a FusionGraph.

What it counts (docs/memory-model.md has the full statement):

* Units run in execution order: the forward units of the joint trace in trace order, then the backward
  units (Thunder splits the joint trace exactly so; see :func:`remat.core.ir.split_phases`).
* A unit allocates all its outputs when it runs (a fusion region's outputs are allocated together; its
  internal values are never materialized).  A buffer is freed after its last reader has run.
* Outputs of stand-alone view ops (reshape, expand, transpose, slice, ...) alias their input: no new
  bytes, and the base buffer stays alive while any alias is alive.
* Values returned by the step (forward outputs, gradients) stay alive until the end of the step.
* Parameters and other trace inputs are not counted in the timeline; they are reported apart
  (``param_bytes``, ``input_bytes``).  Cotangents handed to the backward are counted from the point the
  backward reads them.
* ``saved_bytes`` is the storage of activations made by forward units and read by backward units
  (each base buffer once).

What it ignores: allocator fragmentation and caching, workspace of matmul/attention kernels, temporary
buffers inside a kernel, and the loss computation outside the traced function.  The figure is therefore
a model of *live tensor bytes*, comparable between plans of the same trace, not a prediction of
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from remat.core.donation import storage_roots
from remat.core.ir import BACKWARD, FORWARD, FusionGraph
from remat.core.units import format_bytes  # noqa: F401  (re-exported: remat.core.memory.format_bytes)
from remat.core.views import alias_base

__all__ = [
    "MemoryBudget", "MemoryProfile", "TimelinePoint", "profile_graph", "profile_with_lifetimes", "lifetimes", "live_at", "headroom", "save_cost", "held_storage", "tensor_save_cost",
    "format_bytes",
]



@dataclass(frozen=True)
class TimelinePoint:
    """Live activation bytes while one unit runs (its outputs allocated, its dying inputs not yet freed)."""

    step: int  # position in execution order
    unit: int  # index into FusionGraph.units
    name: str
    phase: str
    live_bytes: int
    allocated_bytes: int


@dataclass(frozen=True)
class MemoryProfile:
    """Result of the memory model.  ``peak_bytes`` and ``saved_bytes`` exclude parameters and inputs."""

    peak_bytes: int
    saved_bytes: int
    timeline: tuple[TimelinePoint, ...]
    saved_tensors: tuple[str, ...] = ()
    param_bytes: int = 0
    input_bytes: int = 0
    peak_step: int = -1
    peak_unit_name: str = ""
    forward_peak_bytes: int = 0
    backward_peak_bytes: int = 0

    def __repr__(self) -> str:
        mib = 1024 * 1024
        return (
            f"MemoryProfile(peak={self.peak_bytes / mib:.1f} MiB at {self.peak_unit_name!r}, "
            f"saved={self.saved_bytes / mib:.1f} MiB in {len(self.saved_tensors)} tensors, "
            f"params={self.param_bytes / mib:.1f} MiB)"
        )


#: Kinds of values the timeline does not count.
_UNCOUNTED = frozenset({"param", "input", "number"})


def lifetimes(graph: FusionGraph) -> tuple[list[int], dict[str, int], dict[str, int]]:
    """Execution order (unit indices) and, for every counted base buffer, the first and last step at
    which it is alive (``start``, ``end``; ``end == len(order)`` means held to the end of the step)."""
    tensors, units = graph.tensors, graph.units
    order = graph.execution_order()
    end_of_step = len(order)
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    # a donated output lives in its donor's storage (remat.core.donation), views of it too
    roots = storage_roots(graph) if graph.donations else None
    # alias_base inlined: this runs for every unit of every plan a budget search evaluates
    for step, unit_index in enumerate(order):
        unit = units[unit_index]
        for name in unit.outputs:
            info = tensors.get(name)
            if info is None or info.kind in _UNCOUNTED:
                continue
            base = roots.get(name, name) if roots is not None else (info.alias_of or name)
            base_info = info if base == name else tensors.get(base)
            if base_info is None or base_info.kind in _UNCOUNTED:
                continue
            if base not in start:
                start[base] = step
                end[base] = step
        last = end_of_step if unit.kind == "return" else step
        for name in unit.inputs:
            if roots is not None:
                base = roots.get(name, name)
            else:
                info = tensors.get(name)
                base = (info.alias_of or name) if info is not None else name
            if base in start and last > end[base]:
                end[base] = last
    return order, start, end


def live_at(graph: FusionGraph, step: int) -> list[tuple[str, int]]:
    """Base buffers alive at execution step ``step``, largest first: ``[(name, bytes), ...]``."""
    _, start, end = lifetimes(graph)
    alive = [(b, graph.tensors[b].bytes) for b, s in start.items() if s <= step <= end[b]]
    return sorted(alive, key=lambda item: -item[1])


def headroom(profile: MemoryProfile, graph: FusionGraph, kinds: Collection[str]) -> int | None:
    """Bytes a buffer alive only while an op of one of ``kinds`` runs can take without raising ``profile``'s
    peak: the peak less the live bytes while that op's unit runs (its outputs allocated, its inputs not yet
    freed), the least over all such units; None where no unit runs one.  ``graph`` is the graph
    ``profile`` was computed on (the units of its timeline).  What a runtime uses to size a kernel's scratch
    that the model does not count (the graph runtime's embedding gradient, :mod:`remat.thunder.graph`)."""
    if graph.ops is None:
        return None
    rooms = [
        profile.peak_bytes - point.live_bytes
        for point in profile.timeline
        if any(graph.ops[node].kind in kinds for node in graph.units[point.unit].nodes)
    ]
    return max(0, min(rooms)) if rooms else None


def profile_graph(graph: FusionGraph) -> MemoryProfile:
    """Run the memory model on a :class:`~remat.core.ir.FusionGraph` (see the module docstring)."""
    return profile_with_lifetimes(graph)[0]


def profile_with_lifetimes(graph: FusionGraph) -> tuple[MemoryProfile, dict[str, int], dict[str, int]]:
    """:func:`profile_graph` and the ``start`` / ``end`` steps of :func:`lifetimes` it was computed from,
    for callers that need both (the budget search asks what is alive at a plan's peak)."""
    tensors = graph.tensors
    order, start, end = lifetimes(graph)
    end_of_step = len(order)

    # Sweep: bytes alive at each step.
    delta = [0] * (end_of_step + 2)
    allocated = [0] * (end_of_step + 1)
    for base, s in start.items():
        nbytes = tensors[base].bytes
        delta[s] += nbytes
        delta[end[base] + 1] -= nbytes
        allocated[s] += nbytes
    timeline = []
    live = 0
    for step, unit_index in enumerate(order):
        live += delta[step]
        unit = graph.units[unit_index]
        timeline.append(TimelinePoint(step, unit_index, unit.name, unit.phase, live, allocated[step]))

    saved: dict[str, None] = {}
    if graph.is_joint:
        for unit_index in order:
            unit = graph.units[unit_index]
            if unit.phase != BACKWARD or unit.kind == "return":
                continue
            for name in unit.inputs:
                info = tensors.get(name)
                if info is None or info.producer_unit is None:
                    continue
                if graph.units[info.producer_unit].phase != FORWARD:
                    continue
                base = alias_base(name, graph.tensors)
                base_info = tensors.get(base)
                if base_info is not None and base_info.kind == "activation":
                    saved.setdefault(base)
    elif graph.explicit_saved is not None:
        for name in graph.explicit_saved:
            base = alias_base(name, graph.tensors)
            base_info = tensors.get(base)
            if base_info is not None and base_info.kind == "activation":
                saved.setdefault(base)
    saved_bytes = sum(tensors[b].bytes for b in saved)

    param_bytes = sum(t.bytes for t in tensors.values() if t.kind == "param")
    input_bytes = sum(t.bytes for t in tensors.values() if t.kind == "input")

    if timeline:
        peak_point = max(timeline, key=lambda p: p.live_bytes)
        peak_bytes, peak_step, peak_name = peak_point.live_bytes, peak_point.step, peak_point.name
    else:
        peak_bytes, peak_step, peak_name = 0, -1, ""
    forward_peak = max((p.live_bytes for p in timeline if p.phase == FORWARD), default=0)
    backward_peak = max((p.live_bytes for p in timeline if p.phase == BACKWARD), default=0)
    profile = MemoryProfile(
        peak_bytes=peak_bytes,
        saved_bytes=saved_bytes,
        timeline=tuple(timeline),
        saved_tensors=tuple(saved),
        param_bytes=param_bytes,
        input_bytes=input_bytes,
        peak_step=peak_step,
        peak_unit_name=peak_name,
        forward_peak_bytes=forward_peak,
        backward_peak_bytes=backward_peak,
    )
    return profile, start, end


def save_cost(graph: FusionGraph, name: Hashable, *, held: Collection[str] | None = None) -> int:
    """Bytes that keeping value ``name`` for the backward adds to the step.

    Plain graphs give their costs (:attr:`FusionGraph.save_costs`).  For traces: nothing for what the
    caller holds anyway (``held``, from :func:`held_storage`; default: the graph's forward outputs and
    the storage they share, since a held view keeps its base alive), numbers,
    parameters and inputs; a view costs its base's storage; a view of a parameter or input costs one
    byte: no memory, but recomputing it is free too, and that spares the regions an output and an input
    (and the trace a stand-alone view op) for nothing."""
    if graph.save_costs is not None:
        return graph.save_costs.get(name, 0)
    return tensor_save_cost(name, graph.tensors, held_storage(graph.tensors, graph.forward_outputs) if held is None else held)


def held_storage(tensors: Mapping[Hashable, Any], held: Collection[str]) -> frozenset:
    """``held`` and the values whose storage a held view shares: what :func:`save_cost` counts as free.
    Computed once per graph by its callers (the cost itself runs for every value of a plan)."""
    bases = (tensors[h].alias_of for h in held if h in tensors)
    return frozenset(held).union(base for base in bases if base is not None)


def tensor_save_cost(name: Hashable, tensors: Mapping[Hashable, Any], held: Collection[str]) -> int:
    """The trace rule of :func:`save_cost`, on a tensor mapping and what the caller holds (``held``, from
    :func:`held_storage`: with it, keeping the base of a held view, or another view of that base, is free)."""
    info = tensors.get(name)
    if info is None:
        return 0
    if name in held or info.kind in ("number", "param", "input"):
        return 0
    if info.alias_of is not None:
        base = tensors.get(info.alias_of)
        if base is None or base.name in held:
            return 0
        if base.kind in ("param", "input"):
            return 1
        return base.bytes
    return info.bytes


_SIZE = re.compile(r"\s*(-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(%|[KMGT]i?B|B)?\s*")
_FACTORS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@dataclass(frozen=True)
class MemoryBudget:
    """A memory budget: a byte count or a fraction of a reference peak, never ambiguous between them.

    :meth:`parse` reads what users write for ``memory_budget=``:

    * a ``float`` in (0, 1]: a fraction (``0.7``, ``1.0``);
    * an ``int``: bytes (``6 * 2**30``); ``1`` is refused as ambiguous (write ``1.0`` or ``"1B"``);
    * a string: ``"70%"`` or ``"0.7"`` (a fraction), ``"600MiB"``, ``"1.5 GiB"``, ``"2GB"``, ``"629145600"``
      or ``"629145600B"`` (bytes);
    * a :class:`MemoryBudget` as it is.

    Anything else raises ``TypeError`` (not a number or string; ``True``/``False``) or ``ValueError``
    (zero, negative, infinite, NaN, a float above 1, an unreadable string).  What a fraction is of is
    the caller's: :func:`remat.optimize`, :func:`remat.solve` and :func:`remat.jit` read it against the
    estimated peak of the *default plan* (what remat uses without a budget), so ``0.7`` asks for 30% less
    than remat's own plan, as PyTorch's ``activation_memory_budget`` is relative to its default.

    To fit what a GPU has, :meth:`from_free_memory` makes a byte budget from the device's free memory
    minus what lives outside the step (docs/memory-model.md has the recipe)."""

    bytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise ValueError("a MemoryBudget is either bytes or a fraction")

    @classmethod
    def parse(cls, value: object) -> MemoryBudget | None:
        """The budget ``value`` stands for (None for None); see the class docstring."""
        if value is None or isinstance(value, MemoryBudget):
            return value
        if isinstance(value, str):
            return cls._parse_text(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                "memory_budget must be a fraction in (0, 1] (a float), bytes (an int), or a string such as "
                f"'70%' or '600MiB'; got {type(value).__name__} {value!r}"
            )
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"memory_budget must be positive and finite, got {value!r}")
        if isinstance(value, numbers.Integral):
            if value == 1:
                raise ValueError(
                    "memory_budget=1 is ambiguous: write 1.0 for the whole reference peak, or '1B' for one byte"
                )
            return cls(bytes=int(value))
        if value > 1:
            raise ValueError(
                f"memory_budget={value!r} is neither a fraction in (0, 1] nor a byte count: give a fraction "
                "like 0.7, bytes as an int, or a string like '1.5GiB' or '70%'"
            )
        return cls(fraction=float(value))

    @classmethod
    def _parse_text(cls, text: str) -> MemoryBudget:
        match = _SIZE.fullmatch(text)
        if not match:
            raise ValueError(f"cannot read memory_budget={text!r}: give a fraction like 0.7 or 70%, or a size like 600MiB")
        number, suffix = match.group(1), match.group(2)
        value = float(number)
        if value <= 0 or not math.isfinite(value):
            raise ValueError(f"memory_budget must be positive, got {text!r}")
        if suffix == "%":
            if value > 100:
                raise ValueError(f"memory_budget={text!r} is more than 100%")
            return cls(fraction=value / 100)
        if suffix is None:
            if "." in number or "e" in number.lower():  # "0.7": a fraction, as the float would be
                return cls.parse(value)
            return cls.parse(int(number))
        return cls(bytes=max(int(value * _FACTORS[suffix]), 1))

    @classmethod
    def from_free_memory(cls, free_bytes: int, *, outside_step_bytes: int = 0, headroom: float = 0.0) -> MemoryBudget:
        """A byte budget for one training step on a device with ``free_bytes`` free: what is left after
        ``outside_step_bytes`` (memory that is not free yet but will be taken outside the step: optimizer
        state allocated at its first step, gradients kept between steps, another model) and after
        ``headroom``, a fraction in [0, 1) kept back for what the memory model does not count (allocator
        fragmentation, kernel workspaces; about 0.1 is a reasonable start).  Budget = ``(free_bytes -
        outside_step_bytes) * (1 - headroom)``, rounded down.

        The step's peak (what a budget bounds) counts activations and the gradients it returns, not
        parameters or inputs: take ``free_bytes`` (``torch.cuda.mem_get_info()[0]``) after the model is on
        the device, and subtract only what will be allocated later.  Raises ``TypeError`` for non-integer
        bytes or a non-number headroom, ``ValueError`` for negative bytes, a headroom outside [0, 1), or
        nothing left for the step."""
        for name, value in (("free_bytes", free_bytes), ("outside_step_bytes", outside_step_bytes)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int (bytes), got {type(value).__name__} {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if isinstance(headroom, bool) or not isinstance(headroom, numbers.Real):
            raise TypeError(f"headroom must be a fraction in [0, 1), got {type(headroom).__name__} {headroom!r}")
        if not 0 <= headroom < 1:
            raise ValueError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
        left = int((int(free_bytes) - int(outside_step_bytes)) * (1 - float(headroom)))
        if left <= 0:
            raise ValueError(
                f"nothing is left for the step: {format_bytes(free_bytes)} free - {format_bytes(outside_step_bytes)} outside "
                f"the step, with {100 * headroom:g}% headroom, leaves {format_bytes(left)}"
            )
        return cls(bytes=left)

    def resolve(self, reference_bytes: int) -> int:
        """The budget in bytes: itself, or its fraction of ``reference_bytes``."""
        if self.bytes is not None:
            return self.bytes
        return int(self.fraction * reference_bytes)

    def __str__(self) -> str:
        if self.bytes is not None:
            return format_bytes(self.bytes)
        return f"{100 * self.fraction:g}%"
