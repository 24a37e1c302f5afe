"""The memory model: the allocation timeline of one training step, from a trace or a FusionGraph.

What it counts (docs/memory-model.md has the full statement):

* Units run in execution order: the forward units of the joint trace in trace order, then the backward
  units (Thunder splits the joint trace exactly so; see :func:`remat.graph.split_phases`).
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

from dataclasses import dataclass

from remat.graph import BACKWARD, FORWARD, FusionGraph

__all__ = ["MemoryProfile", "TimelinePoint", "estimate_memory", "profile_graph", "lifetimes", "live_at"]


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


def _base(name: str, graph: FusionGraph) -> str:
    info = graph.tensors.get(name)
    if info is not None and info.alias_of is not None:
        return info.alias_of
    return name


def lifetimes(graph: FusionGraph) -> tuple[list[int], dict[str, int], dict[str, int]]:
    """Execution order (unit indices) and, for every counted base buffer, the first and last step at
    which it is alive (``start``, ``end``; ``end == len(order)`` means held to the end of the step)."""
    tensors = graph.tensors
    order = graph.execution_order()
    end_of_step = len(order)
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for step, unit_index in enumerate(order):
        unit = graph.units[unit_index]
        for name in unit.outputs:
            info = tensors.get(name)
            if info is None or info.kind in ("param", "input", "number"):
                continue
            base = _base(name, graph)
            base_info = tensors.get(base)
            if base_info is None or base_info.kind in ("param", "input", "number"):
                continue
            if base not in start:
                start[base] = step
                end[base] = step
        for name in unit.inputs:
            base = _base(name, graph)
            if base in start:
                last = end_of_step if unit.kind == "return" else step
                if last > end[base]:
                    end[base] = last
    return order, start, end


def live_at(graph: FusionGraph, step: int) -> list[tuple[str, int]]:
    """Base buffers alive at execution step ``step``, largest first: ``[(name, bytes), ...]``."""
    _, start, end = lifetimes(graph)
    alive = [(b, graph.tensors[b].bytes) for b, s in start.items() if s <= step <= end[b]]
    return sorted(alive, key=lambda item: -item[1])


def profile_graph(graph: FusionGraph) -> MemoryProfile:
    """Run the memory model on a :class:`~remat.graph.FusionGraph` (see the module docstring)."""
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
                base = _base(name, graph)
                base_info = tensors.get(base)
                if base_info is not None and base_info.kind == "activation":
                    saved.setdefault(base)
    elif graph.explicit_saved is not None:
        for name in graph.explicit_saved:
            base = _base(name, graph)
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
    return MemoryProfile(
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


def estimate_memory(trace_or_graph) -> MemoryProfile:
    """Memory profile of any Thunder trace (joint, fused, Thunder's own rematerialized traces included)
    or of a :class:`~remat.graph.FusionGraph`."""
    if isinstance(trace_or_graph, FusionGraph):
        graph = trace_or_graph
    else:
        graph = FusionGraph.from_trace(trace_or_graph, ops=False)
    return profile_graph(graph)
