"""The plan layout: how a trace changes under a plan, decided unit by unit on plain data.

:func:`plan_layout` gives one :class:`UnitEdit` per unit of a :class:`~remat.core.ir.FusionGraph`.  The
layout is then either materialized as a Thunder trace (:func:`remat.thunder.rewrite.apply_plan`) or
simulated as units for the memory model (:func:`layout_graph`, what :func:`remat.plan_memory` uses to
price many plans quickly).  Both read the same layout, so the estimate of a plan is the estimate of its
rewritten trace.

The new joint trace is such that

* forward units compute only what the forward still needs: values read by later forward units, the
  forward outputs, and the plan's saved values (a region gains an output for a value saved from inside
  it, and loses the outputs and ops only the backward used to read);
* every backward unit that read a value the plan recomputes gets that value back from the saved ones:
  a backward *region* takes the recomputing ops at its start (they are fused with it); a stand-alone
  backward op (a matmul, an attention backward, a view) gets a new small region placed right before
  it, whose outputs carry fresh names (a region output reusing a forward name would make Thunder's
  split treat the region as forward);
* recomputation is placed per consuming unit, so a recomputed value never lives longer than the unit
  that reads it (the price is repeated FLOPs when several units read it, reported in ``extra_flops``);
* a region output that is a view of another output (``reshape(a)`` beside ``a``) or of an input is
  written after the region as a stand-alone view, which costs no memory.

Regions keep their names (so a plan reads as "nvFusion12 now also recomputes ..."); new recompute
regions are numbered after the largest one (:class:`RegionNames`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from remat.core.ir import BACKWARD, FORWARD, FusionGraph, TensorInfo, Unit, split_phases
from remat.core.ops import ALWAYS_VIEW_PRIMS, VIEW_PRIMS
from remat.core.views import alias_base, region_views

__all__ = [
    "UnitEdit", "Layout", "PlanLike", "plan_layout", "layout_graph", "region_io", "recompute_closure",
    "RegionNames", "region_name",
]

Node = TypeVar("Node", bound=Hashable)

#: Fusion regions are named ``nvFusion<N>``, as Thunder's nvFuser executor names them.
REGION_PREFIX = "nvFusion"


def region_name(number: int) -> str:
    """The name of the ``number``-th fusion region."""
    return f"{REGION_PREFIX}{number}"


class RegionNames:
    """Fresh region names after the largest number in ``taken`` (fusion names must be unique within a
    trace: they key its call context)."""

    def __init__(self, taken: Iterable[str]):
        numbers = [int(m.group(1)) for name in taken for m in [re.search(r"(\d+)$", name)] if m]
        self.next = max(numbers, default=-1) + 1

    def new_name(self) -> str:
        name = region_name(self.next)
        self.next += 1
        return name


class PlanLike(Protocol):
    """What the layout reads of a plan (a :class:`remat.Plan`)."""

    saved: Collection[str]
    recomputed_values: Collection[str]


@dataclass(frozen=True)
class UnitEdit:
    """What happens to one unit of the original trace.

    ``action``: ``"keep"`` (unchanged), ``"drop"`` (no longer needed), ``"rebuild"`` (a forward region
    reduced to ``nodes`` writing ``outputs``), ``"recompute_into"`` (a backward region that first runs
    the ``recompute`` op nodes), ``"recompute_before"`` (a stand-alone backward op preceded by a new
    region running ``recompute`` and writing fresh copies of ``reads``).  ``hoisted``: op nodes of the
    (resulting) region written after it as stand-alone views.
    """

    index: int
    action: str
    nodes: tuple[int, ...] = ()
    outputs: tuple[str, ...] = ()
    recompute: tuple[int, ...] = ()
    reads: tuple[str, ...] = ()
    hoisted: tuple[int, ...] = ()


@dataclass(frozen=True)
class Layout:
    edits: tuple[UnitEdit, ...]
    extra_flops: int


def recompute_closure(
    wanted: Iterable[str], producer: Callable[[str], Node], reads: Callable[[Node], Iterable[str]]
) -> list[Node]:
    """The ops to run again so that ``wanted`` values exist: their producers, and, for every value such
    a producer reads that ``reads(op)`` yields (the ones not available: neither saved nor a parameter or
    input), its producer too.  In the order found; callers order them."""
    chosen: dict[Node, None] = {}
    stack = list(wanted)
    seen = set(stack)
    while stack:
        node = producer(stack.pop())
        if node in chosen:
            continue
        chosen[node] = None
        for read in reads(node):
            if read not in seen:
                seen.add(read)
                stack.append(read)
    return list(chosen)


Item = TypeVar("Item")


def region_io(
    steps: Iterable[tuple[Iterable[Item], Iterable[Item]]],
    wanted: Collection[str] | None = None,
    name: Callable[[Item], str] | None = None,
) -> tuple[list[Item], list[Item]]:
    """For a group of ops given as ``(reads, writes)`` in order: what they read and did not write before
    (order of first use), and what they write (order of definition) that is in ``wanted`` (all when None)
    and is not an input.  The rule a region's signature follows.  Items are names, or anything whose
    name ``name(item)`` gives (the Thunder adapter passes proxies); the first item of a name is kept."""
    produced: dict[str, Item] = {}
    inputs: dict[str, Item] = {}
    for reads, writes in steps:
        for item in reads:
            key = item if name is None else name(item)
            if key not in produced and key not in inputs:
                inputs[key] = item
        for item in writes:
            produced.setdefault(item if name is None else name(item), item)
    written = [item for key, item in produced.items() if (wanted is None or key in wanted) and key not in inputs]
    return list(inputs.values()), written


def _op_io(graph: FusionGraph, nodes: Sequence[int], wanted: Collection[str] | None = None) -> tuple[list[str], list[str]]:
    ops = graph.ops
    return region_io(((ops[n].inputs, ops[n].outputs) for n in nodes), wanted)


def _closure(graph: FusionGraph, saved: set[str], values: Sequence[str]) -> list[int]:
    """Forward op nodes recomputing ``values`` from saved values, parameters and inputs (node order)."""
    ops, tensors, units = graph.ops, graph.tensors, graph.units

    def producer(name: str) -> int:
        info = tensors.get(name)
        if info is None or info.producer_node is None:
            raise AssertionError(f"no producer for recomputed value {name}")
        return info.producer_node

    def missing(node: int) -> Iterable[str]:
        for read in ops[node].inputs:
            info = tensors.get(read)
            if info is not None and info.kind == "activation" and read not in saved and units[info.producer_unit].phase == FORWARD:
                yield read

    return sorted(recompute_closure(values, producer, missing))


def _region_views(graph: FusionGraph, nodes: Iterable[int], inputs: Iterable[str], outputs: Iterable[str], base_of) -> dict[str, str]:
    """The region rule of :func:`remat.core.views.region_views` on op nodes of ``graph``."""
    ops, tensors = graph.ops, graph.tensors

    def members():
        for n in nodes:
            op = ops[n]
            tensor_inputs = [a for a in op.inputs if a in tensors and tensors[a].kind != "number"]
            if len(tensor_inputs) == 1:
                yield tensor_inputs[0], op.outputs, n

    return region_views(members(), set(inputs) | set(outputs), base_of, graph.view_ops.__contains__)


def _hoistable(graph: FusionGraph, nodes: Sequence[int], outputs: Sequence[str], inputs: Sequence[str]) -> tuple[int, ...]:
    """Op nodes of a region that write an output which is a view of another output or of an input (a
    ``reshape`` of an input only where the strides make it a view): see the module docstring.  Besides
    costing nothing outside, a view of an input kept as a region output made nvFuser 0.2.36 give it a
    segment of its own and split the rest of the region (a layer-norm backward into four kernels
    instead of one)."""
    ops, tensors = graph.ops, graph.tensors
    producer: dict[str, int] = {}
    for n in nodes:
        for name in ops[n].outputs:
            producer.setdefault(name, n)
    output_names = set(outputs)
    input_names = set(inputs)
    hoisted: list[int] = []
    hoisted_names: set[str] = set()
    for name in outputs:
        n = producer.get(name)
        if n is None:
            continue
        op = ops[n]
        if len(op.outputs) != 1 or op.kind not in VIEW_PRIMS:
            continue
        tensor_args = [a for a in op.inputs if a in tensors and tensors[a].kind != "number"]
        if len(tensor_args) != 1:
            continue
        base = tensor_args[0]
        base_is_output = base in output_names and base not in hoisted_names
        view_of_input = base in input_names and (op.kind in ALWAYS_VIEW_PRIMS or n in graph.view_ops)
        if not (base_is_output or view_of_input):
            continue
        hoisted.append(n)
        hoisted_names.add(name)
    if len(hoisted_names) == len(outputs):
        return ()
    return tuple(hoisted)


def plan_layout(graph: FusionGraph, plan: PlanLike) -> Layout:
    """Decide, unit by unit, how the trace changes under ``plan`` (see :class:`UnitEdit`)."""
    if graph.ops is None:
        raise ValueError("plan_layout needs a FusionGraph with operations (remat.read_trace(trace))")
    ops = graph.ops
    saved = set(plan.saved)
    recomputed = set(plan.recomputed_values)

    # forward: keep what the forward, the return and the backward's remaining reads need (reverse sweep)
    needed: set[str] = saved | set(graph.forward_outputs)
    for unit in graph.units:
        if unit.kind == "return":
            needed.update(unit.inputs)
        elif unit.phase == BACKWARD:
            needed.update(name for name in unit.inputs if name not in recomputed)
    edits: dict[int, UnitEdit] = {}
    for unit in reversed(graph.units):
        if unit.phase != FORWARD or unit.kind == "return":
            continue
        if unit.kind != "region":
            side_effect = any(ops[n].side_effect for n in unit.nodes)
            if unit.kind == "input" or side_effect or any(o in needed for o in unit.outputs):
                edits[unit.index] = UnitEdit(unit.index, "keep")
                needed.update(unit.inputs)
            else:
                edits[unit.index] = UnitEdit(unit.index, "drop")
            continue
        needed_after = set(needed)
        kept: list[int] = []
        for n in reversed(unit.nodes):
            op = ops[n]
            if op.side_effect or any(o in needed for o in op.outputs):
                kept.append(n)
                needed.update(op.inputs)
        kept.reverse()
        _, written = _op_io(graph, kept, needed_after)
        if not kept or not written:
            edits[unit.index] = UnitEdit(unit.index, "drop")
            continue
        order = {name: i for i, name in enumerate(unit.outputs)}
        outputs = sorted(written, key=lambda name: (order.get(name, len(order)), written.index(name)))
        if len(kept) == len(unit.nodes) and tuple(outputs) == unit.outputs:
            edits[unit.index] = UnitEdit(unit.index, "keep")
        else:
            edits[unit.index] = UnitEdit(unit.index, "rebuild", nodes=tuple(kept), outputs=tuple(outputs))

    # backward: bring back what the plan recomputes, per consuming unit
    extra_flops = 0
    for unit in graph.units:
        if unit.index in edits:
            continue
        reads = tuple(name for name in unit.inputs if name in recomputed)
        if not reads or unit.kind == "return":
            edits[unit.index] = UnitEdit(unit.index, "keep")
            continue
        closure = tuple(_closure(graph, saved, reads))
        extra_flops += sum(ops[n].flops for n in closure)
        if unit.kind == "region":
            edits[unit.index] = UnitEdit(unit.index, "recompute_into", recompute=closure)
        else:
            edits[unit.index] = UnitEdit(unit.index, "recompute_before", recompute=closure, reads=reads)

    # views of region outputs are written after their region
    for index, edit in list(edits.items()):
        unit = graph.units[index]
        if unit.kind != "region" or edit.action == "drop":
            continue
        if edit.action == "rebuild":
            nodes, outputs = edit.nodes, edit.outputs
        elif edit.action == "recompute_into":
            nodes, outputs = edit.recompute + unit.nodes, unit.outputs
        else:
            nodes, outputs = unit.nodes, unit.outputs
        inputs, _ = _op_io(graph, nodes)
        hoisted = _hoistable(graph, nodes, outputs, inputs)
        if hoisted:
            action = "rebuild" if edit.action == "keep" else edit.action
            edits[index] = UnitEdit(index, action, nodes or unit.nodes, outputs, edit.recompute, edit.reads, hoisted)
    return Layout(tuple(edits[u.index] for u in graph.units), extra_flops)


def layout_graph(graph: FusionGraph, layout: Layout) -> FusionGraph:
    """The units and tensors the rewritten trace would have (no Thunder objects are made), for the
    memory model: ``profile_graph(layout_graph(graph, plan_layout(graph, plan)))`` equals the profile of
    the rewritten trace (:func:`remat.thunder.rewrite.apply_plan`)."""
    ops, tensors = graph.ops, dict(graph.tensors)
    rows: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []  # (name, kind, inputs, outputs)
    row_phases: list[str] = []  # for plain graphs, whose phases are given
    aliases: dict[str, str] = {}
    fresh_count = 0
    new_names = RegionNames(u.name for u in graph.units if u.kind == "region")

    def base_of(name: str) -> str:
        return aliases.get(name) or alias_base(name, tensors)

    for edit in layout.edits:
        unit = graph.units[edit.index]
        if edit.action == "drop":
            continue
        if edit.action == "keep":
            if unit.kind == "region":
                views = _region_views(graph, unit.nodes, unit.inputs, unit.outputs, base_of)
                aliases.update((name, base) for name, base in views.items() if name in unit.outputs)
            rows.append((unit.name, unit.kind, unit.inputs, unit.outputs))
            row_phases.append(unit.phase)
            continue
        if edit.action == "recompute_before":
            inputs, _ = _op_io(graph, edit.recompute)
            views = _region_views(graph, edit.recompute, inputs, (), base_of)
            fresh: dict[str, str] = {}
            for name in edit.reads:
                fresh_name = f"{name}__recomputed{fresh_count}"
                fresh_count += 1
                fresh[name] = fresh_name
                # a copy of a view of a region input is written as an alias of that input (nvFuser)
                tensors[fresh_name] = tensors[name]._replace(name=fresh_name, alias_of=None, kind="activation")
                if name in views:
                    aliases[fresh_name] = views[name]
            rows.append((new_names.new_name(), "region", tuple(inputs), tuple(fresh.values())))
            swapped = tuple(fresh.get(n, n) for n in unit.inputs)
            rows.append((unit.name, unit.kind, swapped, unit.outputs))
            row_phases += [BACKWARD, unit.phase]
            if unit.inputs and unit.inputs[0] in fresh:  # a view of a recomputed value aliases the new copy
                for out in unit.outputs:
                    if tensors.get(out) is not None and tensors[out].alias_of is not None:
                        aliases[out] = fresh[unit.inputs[0]]
            continue
        if edit.action == "rebuild":
            nodes, outputs = edit.nodes, edit.outputs
        else:  # recompute_into
            nodes, outputs = edit.recompute + unit.nodes, unit.outputs
        hoisted_outputs = {ops[n].outputs[0] for n in edit.hoisted}
        inputs, _ = _op_io(graph, nodes)
        region_outputs = tuple(o for o in outputs if o not in hoisted_outputs)
        views = _region_views(graph, [n for n in nodes if n not in edit.hoisted], inputs, region_outputs, base_of)
        aliases.update((name, base) for name, base in views.items() if name in region_outputs)
        rows.append((unit.name, "region", tuple(inputs), region_outputs))
        row_phases.append(unit.phase)
        for n in edit.hoisted:
            op = ops[n]
            base = next(a for a in op.inputs if a in tensors and tensors[a].kind != "number")
            view = op.outputs[0]
            aliases[view] = aliases.get(base) or alias_base(base, tensors)
            rows.append((op.kind, "op", (base,), (view,)))
            row_phases.append(unit.phase)

    kinds = [row[1] for row in rows]
    if graph.plain:  # phases of plain graphs are given
        phases = row_phases
    elif graph.is_joint:  # what Thunder's split will decide for the rewritten trace
        seed = set(graph.forward_outputs) | {n for n, t in graph.tensors.items() if t.kind in ("param", "input")}
        phases = split_phases([r[3] for r in rows], [r[2] for r in rows], kinds, seed)
    else:
        phases = [FORWARD] * len(rows)
    units: list[Unit] = []
    for index, ((name, kind, inputs, outputs), phase) in enumerate(zip(rows, phases)):
        units.append(Unit(index, name, kind, phase, inputs, outputs, (), 0))
        for out in outputs:
            info: TensorInfo | None = tensors.get(out)
            if info is None:
                continue
            # region outputs are fresh buffers unless they are views of the region's inputs or outputs;
            # stand-alone views keep (or, when hoisted, get) their base
            alias = aliases.get(out, info.alias_of if kind == "op" else None)
            if info.kind in ("param", "input"):
                tensors[out] = info._replace(producer_unit=index)
            else:
                tensors[out] = info._replace(producer_unit=index, phase=phase, alias_of=alias)
    return FusionGraph(
        units,
        tensors,
        None,
        forward_outputs=graph.forward_outputs,
        gradients=graph.gradients,
        is_joint=graph.is_joint,
        explicit_saved=graph.explicit_saved,
        save_costs=graph.save_costs,
    )
