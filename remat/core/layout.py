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
  split treat the region as forward), unless a later backward region that recomputes from the same
  saved inputs can move up before it and write those values too (:func:`host_recomputations`);
* recomputation is placed per consuming unit, so a recomputed value never lives longer than the unit
  that reads it (the price is repeated FLOPs when several units read it, reported in ``extra_flops``),
  except for ops that stand alone (next point): one is re-issued once, for the first backward unit in
  layout order whose recomputation needs it, and later units read its fresh outputs (their closures stop
  there as at a saved value), which then live until their last reader;
* a recomputation that re-runs ops which *stand alone* in the forward (:func:`stands_alone`: a matmul
  the fusion policy kept out of regions, an attention kernel, a re-gather's all-gather and wait) runs in
  *stages* before the unit (:func:`stage_closure`): each stand-alone op is re-issued as a stand-alone op,
  the fusible ops feeding it run in a new region before it, and only the rest joins the unit as above.
  A region holding a matmul is segmented by nvFuser, which materializes the matmul's inputs and output
  between its kernels: the memory model (which treats a region's internals as free) would not see them;
  staged, it does.  Every value a stage hands to a later stage or to the unit gets a fresh name
  (as above);
* a region output that is a view of another output (``reshape(a)`` beside ``a``) or of an input is
  written after the region as a stand-alone view, which costs no memory.

Regions keep their names (so a plan reads as "nvFusion12 now also recomputes ..."); new recompute
regions are numbered after the largest one (:class:`RegionNames`).
"""

from __future__ import annotations

import re
import weakref
from collections import ChainMap
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from remat.core.donation import with_donations
from remat.core.ir import BACKWARD, FORWARD, FusionGraph, Op, TensorInfo, Unit, split_phases
from remat.core.memory import profile_with_lifetimes
from remat.core.ops import ALWAYS_VIEW_PRIMS, RETURN_KIND, VIEW_PRIMS
from remat.core.views import alias_base, region_views

__all__ = [
    "UnitEdit", "RecomputeStage", "Layout", "PlanLike", "plan_layout", "layout_graph", "region_io",
    "recompute_closure", "stands_alone", "stage_closure", "RegionNames", "region_name",
    "read_outside_regions", "host_recomputations",
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
class RecomputeStage:
    """One stage of a staged recomputation (:func:`stage_closure`), run before the unit it serves:
    first a new region running the fusible op nodes ``region`` (none: no region) and writing fresh
    copies of ``exports`` (the values of ``region`` that later stages or the unit read), then the
    stand-alone op nodes ``ops`` re-issued one by one, each writing fresh copies of its outputs."""

    region: tuple[int, ...]
    exports: tuple[str, ...]
    ops: tuple[int, ...]


@dataclass(frozen=True)
class UnitEdit:
    """What happens to one unit of the original trace.

    ``action``: ``"keep"`` (unchanged), ``"drop"`` (no longer needed), ``"rebuild"`` (a forward region
    reduced to ``nodes`` writing ``outputs``), ``"recompute_into"`` (a backward region that first runs
    the ``recompute`` op nodes), ``"recompute_before"`` (a stand-alone backward op preceded by a new
    region running ``recompute`` and writing fresh copies of the ``reads`` no stage wrote, of this edit or,
    for the outputs of re-issued stand-alone ops, of an earlier one).  ``stages``:
    for the two recompute actions, what runs before the unit (and before that new region) when the
    recomputation re-runs stand-alone ops; ``recompute`` is then the rest (:func:`stage_closure`).
    ``hoisted``: op nodes of the (resulting) region written after it as stand-alone views.

    Hosted recomputation (:func:`host_recomputations`): a ``recompute_before`` edit with ``host`` set runs
    no region of its own; the backward region ``host`` (a unit index) runs first, moved up to just
    before this unit, and writes fresh copies of this edit's ``reads`` besides its own outputs.  That
    region's edit is a ``recompute_into`` whose ``recompute`` holds both recomputations (shared ops
    once), whose ``exports`` are the values it copies out and whose ``moved_before`` is this unit's
    index (it is written there, not at its own place).
    """

    index: int
    action: str
    nodes: tuple[int, ...] = ()
    outputs: tuple[str, ...] = ()
    recompute: tuple[int, ...] = ()
    reads: tuple[str, ...] = ()
    hoisted: tuple[int, ...] = ()
    stages: tuple[RecomputeStage, ...] = ()
    host: int | None = None
    exports: tuple[str, ...] = ()
    moved_before: int | None = None

    @property
    def recomputed(self) -> tuple[int, ...]:
        """Every op node this edit runs again (the stages' and ``recompute``), in node order."""
        staged = [n for stage in self.stages for n in stage.region + stage.ops]
        return tuple(sorted(staged + list(self.recompute)))


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


#: Per graph (dropped with it): the op nodes that stand alone, staged closures, region inputs, the values
#: read outside regions and plan layouts already computed (the budget search lays out dozens of plans of one graph).
_MEMO: weakref.WeakKeyDictionary[FusionGraph, dict] = weakref.WeakKeyDictionary()

#: Tags of ops that may fold into a region in the backward although they stood alone in the forward.
FOLDABLE_TAGS = frozenset({"view", "shape"})


def stands_alone(op: Op) -> bool:
    """Whether a recomputed op must run again as a stand-alone op, not inside a region: it ran outside
    every region in the forward (linears and matmuls the fusion policy keeps out, attention kernels,
    collectives and their waits, other ops no region takes) and is not a view or shape op (those fold
    into a region as they always did).  The one rule :func:`stage_closure` stages by."""
    return op.region is None and not op.tags & FOLDABLE_TAGS


def read_outside_regions(graph: FusionGraph) -> frozenset[str]:
    """Forward values that a backward op outside every region reads (a matmul, an attention backward, a
    stand-alone view), each taken to the value whose storage it shares (:func:`alias_base`: a transposed
    ``v`` reads as the ``qkv`` it views).  Recomputing one of them cannot fuse into its reader: the
    layout gives it a region of its own before that op (module docstring), one more kernel that writes
    it to memory for the reader to load back.  ``RecomputePolicy(unfused_readers=False)`` keeps them
    saved instead (:func:`remat.planning.problem.build_problem`).  Once per graph (a budget search
    builds many problems of it)."""
    cache = _MEMO.setdefault(graph, {})
    if "outside" not in cache:
        producer_phase = {name: op.phase for op in graph.ops for name in op.outputs}
        cache["outside"] = frozenset(
            alias_base(name, graph.tensors)
            for op in graph.ops
            if op.phase == BACKWARD and op.region is None and op.kind != RETURN_KIND
            for name in op.inputs
            if producer_phase.get(name) == FORWARD
        )
    return cache["outside"]


def stage_closure(
    graph: FusionGraph, closure: Sequence[int], unit_reads: Iterable[str]
) -> tuple[tuple[RecomputeStage, ...], tuple[int, ...]]:
    """Split the recompute closure of one backward unit (op nodes in node order) into stages and the
    rest, when it holds ops that stand alone (:func:`stands_alone`); ``unit_reads``: the names the unit
    itself reads.

    A stand-alone op's stage is the number of stand-alone ops on the longest chain of closure ops
    before it.  A fusible op goes to the pre-region of stage ``d`` when it feeds, through fusible ops
    of the closure, a stand-alone op of stage ``d`` (the lowest ``d`` when several); the other fusible
    ops are the rest, placed as an unstaged closure is.  They run in the order stage 0's region, stage
    0's stand-alone ops, stage 1's region, ..., then the rest with the unit.  A closure without
    stand-alone ops, and any closure of a plain graph (whose ops record no regions), is not staged:
    ``((), closure)``."""
    ops = graph.ops
    cache = _MEMO.setdefault(graph, {})
    standing = cache.get("alone")
    if standing is None:  # once per graph: the budget search lays out dozens of plans of the same graph
        standing = cache["alone"] = frozenset() if graph.plain else frozenset(n for n, op in enumerate(ops) if stands_alone(op))
    if standing.isdisjoint(closure):
        return (), tuple(closure)
    unit_reads = tuple(unit_reads)
    key = (tuple(closure), unit_reads)
    if key in cache:  # the same unit recomputing the same ops in another candidate plan
        return cache[key]
    cache[key] = staged = _stage(graph, closure, unit_reads, standing)
    return staged


def _stage(
    graph: FusionGraph, closure: Sequence[int], unit_reads: tuple[str, ...], standing: frozenset[int]
) -> tuple[tuple[RecomputeStage, ...], tuple[int, ...]]:
    ops = graph.ops
    members = set(closure)
    alone = {n: n in standing for n in closure}
    readers: dict[int, list[int]] = {n: [] for n in closure}
    depth: dict[int, int] = {}  # stand-alone ops on the longest chain before the op
    for n in closure:  # node order is a topological order
        before = [p for p in ops[n].input_nodes if p in members]
        depth[n] = max((depth[p] + alone[p] for p in before), default=0)
        for p in before:
            readers[p].append(n)
    target: dict[int, int | None] = {}  # the lowest stage a fusible op feeds through fusible ops
    for n in reversed(closure):
        if alone[n]:
            continue
        fed = [depth[r] if alone[r] else target[r] for r in readers[n]]
        target[n] = min((d for d in fed if d is not None), default=None)
    last = max(depth[n] for n in closure if alone[n])
    regions: list[list[int]] = [[] for _ in range(last + 1)]
    standalone: list[list[int]] = [[] for _ in range(last + 1)]
    rest: list[int] = []
    for n in closure:
        if alone[n]:
            standalone[depth[n]].append(n)
        elif target[n] is None:
            rest.append(n)
        else:
            regions[target[n]].append(n)
    # what each pre-region hands out: its values read by the stages after it, the rest or the unit
    read_later: set[str] = set(unit_reads)
    for n in rest:
        read_later.update(ops[n].inputs)
    stages: list[RecomputeStage] = []
    for d in range(last, -1, -1):
        for n in standalone[d]:
            read_later.update(ops[n].inputs)
        written = [o for n in regions[d] for o in ops[n].outputs]
        exports = tuple(dict.fromkeys(o for o in written if o in read_later))
        stages.append(RecomputeStage(tuple(regions[d]), exports, tuple(standalone[d])))
        for n in regions[d]:
            read_later.update(ops[n].inputs)
    return tuple(reversed(stages)), tuple(rest)


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


def _inputs_of(graph: FusionGraph, nodes: tuple[int, ...]) -> list[str]:
    """What a group of op nodes reads and does not write, remembered per graph: the budget search lays
    out the same recomputations in many candidate plans.  Callers must not change the list."""
    cache = _MEMO.setdefault(graph, {})
    key = ("inputs", nodes)
    if key not in cache:
        cache[key] = _op_io(graph, nodes)[0]
    return cache[key]


def _forward_activation_reads(graph: FusionGraph) -> list[tuple[str, ...]]:
    """For every op node, the values it reads that forward units made as activations (what a closure
    recomputes unless saved), in read order; once per graph."""
    cache = _MEMO.setdefault(graph, {})
    reads = cache.get("activation reads")
    if reads is None:
        tensors, units = graph.tensors, graph.units

        def made_in_forward(name: str) -> bool:
            info = tensors.get(name)
            return (
                info is not None and info.kind == "activation" and info.producer_unit is not None
                and units[info.producer_unit].phase == FORWARD
            )

        reads = cache["activation reads"] = [tuple(r for r in op.inputs if made_in_forward(r)) for op in graph.ops]
    return reads


def _closure(graph: FusionGraph, saved: set[str], values: Sequence[str]) -> list[int]:
    """Forward op nodes recomputing ``values`` from saved values, parameters and inputs (node order):
    :func:`recompute_closure` written out on the graph's tables (it runs for every backward unit of
    every plan a budget search lays out)."""
    tensors = graph.tensors
    activation_reads = _forward_activation_reads(graph)
    chosen: set[int] = set()
    stack = list(values)
    seen = set(stack)
    while stack:
        name = stack.pop()
        info = tensors.get(name)
        if info is None or info.producer_node is None:
            raise AssertionError(f"no producer for recomputed value {name}")
        node = info.producer_node
        if node in chosen:
            continue
        chosen.add(node)
        for read in activation_reads[node]:
            if read not in seen and read not in saved:
                seen.add(read)
                stack.append(read)
    return sorted(chosen)


def _single_tensor_inputs(graph: FusionGraph) -> list[str | None]:
    """For every op node, its one tensor input (None when it reads none or several); once per graph."""
    cache = _MEMO.setdefault(graph, {})
    single = cache.get("single input")
    if single is None:
        tensors = graph.tensors
        single = []
        for op in graph.ops:
            tensor_inputs = [a for a in op.inputs if a in tensors and tensors[a].kind != "number"]
            single.append(tensor_inputs[0] if len(tensor_inputs) == 1 else None)
        cache["single input"] = single
    return single


def _region_views(graph: FusionGraph, nodes: Iterable[int], inputs: Iterable[str], outputs: Iterable[str], base_of) -> dict[str, str]:
    """The region rule of :func:`remat.core.views.region_views` on op nodes of ``graph``.

    Which values are views, and of which region input or output each chain starts from, depends on the
    nodes and the region's signature alone: it is remembered per graph (a budget search lays out the
    same regions in every candidate plan); only the storage of those starts (``base_of``) is asked anew."""
    cache = _MEMO.setdefault(graph, {})
    nodes = tuple(nodes)
    key = ("views", nodes, tuple(inputs), tuple(outputs))
    starts = cache.get(key)
    if starts is None:
        ops, single = graph.ops, _single_tensor_inputs(graph)
        members = ((single[n], ops[n].outputs, n) for n in nodes if single[n] is not None)
        starts = cache[key] = region_views(members, set(key[2]) | set(key[3]), lambda name: name, graph.view_ops.__contains__)
    if not starts:
        return {}
    bases = {start: base_of(start) for start in dict.fromkeys(starts.values())}
    return {name: bases[start] for name, start in starts.items()}


def _hoisted_views(graph: FusionGraph, nodes: tuple[int, ...], outputs: tuple[str, ...]) -> tuple[int, ...]:
    """:func:`_hoistable` for a region of ``nodes`` writing ``outputs``, remembered per graph (most
    regions are the same in every plan a budget search lays out)."""
    cache = _MEMO.setdefault(graph, {})
    key = ("hoisted", nodes, outputs)
    hoisted = cache.get(key)
    if hoisted is None:
        hoisted = cache[key] = _hoistable(graph, nodes, outputs, _inputs_of(graph, nodes))
    return hoisted


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


def plan_layout(graph: FusionGraph, plan: PlanLike, *, reissue_once: bool = True, host: bool | None = None) -> Layout:
    """Decide, unit by unit, how the trace changes under ``plan`` (see :class:`UnitEdit`).

    ``reissue_once``: a recomputed stand-alone op runs once, for the first backward unit that needs it,
    and its output lives until its last reader (fewer FLOPs); False re-issues it for every unit that
    needs it, so no output outlives its unit (a lower peak where such outputs would span the peak; the
    budget search keeps both for the plan with the lowest peak).  ``host``: run recomputations for
    stand-alone readers inside a later backward region that reads the same inputs
    (:func:`host_recomputations`); by default the plan's ``RecomputePolicy.host_recompute`` (True)."""
    if graph.ops is None:
        raise ValueError("plan_layout needs a FusionGraph with operations (remat.read_trace(trace))")
    if host is None:
        host = getattr(getattr(plan, "recompute", None), "host_recompute", True)
    saved, recomputed = frozenset(plan.saved), frozenset(plan.recomputed_values)
    # the budget search meets the same plan several times (sweep, peak rounds, interpolation); a layout
    # depends on nothing else, and is immutable
    cache = _MEMO.setdefault(graph, {})
    key = ("layout", saved, recomputed, reissue_once, host)
    if key not in cache:
        layout = _lay_out(graph, saved, recomputed, reissue_once)
        cache[key] = host_recomputations(graph, layout, saved) if host else layout
    return cache[key]


def _lay_out(graph: FusionGraph, saved: frozenset[str], recomputed: frozenset[str], reissue_once: bool) -> Layout:
    ops = graph.ops

    # forward: keep what the forward, the return and the backward's remaining reads need (reverse sweep)
    needed: set[str] = set(saved) | set(graph.forward_outputs)
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

    # backward: bring back what the plan recomputes, per consuming unit; a stand-alone op only for the
    # first unit (in layout order) that needs it: its outputs are then ``available`` to later closures,
    # like saved values, and later units read its fresh outputs (see ``layout_graph``)
    extra_flops = 0
    available: set[str] = set(saved)
    for unit in graph.units:
        if unit.index in edits:
            continue
        reads = tuple(name for name in unit.inputs if name in recomputed)
        if not reads or unit.kind == "return":
            edits[unit.index] = UnitEdit(unit.index, "keep")
            continue
        if unit.phase != BACKWARD:  # forward units have their edits already; recomputation serves the backward
            raise AssertionError(f"unit {unit.name} ({unit.phase}) reads recomputed values {list(reads)}")
        closure = tuple(_closure(graph, available, [name for name in reads if name not in available]))
        extra_flops += sum(ops[n].flops for n in closure)
        stages, rest = stage_closure(graph, closure, unit.inputs)
        if reissue_once:
            available.update(o for stage in stages for n in stage.ops for o in ops[n].outputs)
        if unit.kind == "region":
            edits[unit.index] = UnitEdit(unit.index, "recompute_into", recompute=rest, stages=stages)
        else:
            edits[unit.index] = UnitEdit(unit.index, "recompute_before", recompute=rest, reads=reads, stages=stages)

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
        hoisted = _hoisted_views(graph, tuple(nodes), tuple(outputs))
        if hoisted:
            action = "rebuild" if edit.action == "keep" else edit.action
            edits[index] = replace(edit, action=action, nodes=nodes or unit.nodes, outputs=outputs, hoisted=hoisted)
    return Layout(tuple(edits[u.index] for u in graph.units), extra_flops)


#: How many units after a stand-alone reader :func:`host_recomputations` looks for a host region (in
#: LitGPT the region that shares the reader's recomputation comes two to four units later).
HOST_WINDOW = 8


def host_recomputations(graph: FusionGraph, layout: Layout, saved: Collection[str]) -> Layout:
    """``layout`` with recomputations for stand-alone backward readers run inside a backward region
    that follows the reader and recomputes from the same inputs, when that region can move up to just
    before the reader (see :class:`UnitEdit`), and the estimated peak does not rise.

    Why: a value recomputed for a reader outside every region (a weight gradient's matmul reading a
    layer norm's or an activation function's output) gets a region of its own, which reads the saved
    inputs, writes the value and is one more kernel to launch.  The next backward region usually
    recomputes from the very same inputs (the layer norm's or the activation's backward): run there,
    the recomputation shares that region's loads and launch, and only the written value costs memory
    traffic (what torch.compile's partitioner gets from fusing recomputation into the backward's
    kernels).  Moving the region up is sound when it reads nothing written by the units it jumps
    over (the reader, the units between) and none of them has a side effect.

    The region then runs earlier: its outputs are alive during the units it jumped over (its dying
    inputs are freed earlier).  Each candidate is kept only if the memory model's live bytes over
    those units, plus that difference, stay within the peak of ``layout`` (checked greedily in trace
    order on ``layout``'s timeline; the returned layout's estimate is computed on it anyway)."""
    ops, units, tensors = graph.ops, graph.units, graph.tensors
    edits = list(layout.edits)
    candidates: list[tuple[int, int, tuple[int, ...], int]] = []  # (reader, host, merged recompute, shared FLOPs)
    hosts: set[int] = set()
    for unit in units:
        edit = edits[unit.index]
        if edit.action != "recompute_before" or edit.stages or not edit.recompute or unit.phase != BACKWARD:
            continue
        closure_inputs = _inputs_of(graph, edit.recompute)
        if any(_activation(tensors, n) and n not in saved for n in closure_inputs):
            continue  # it reads what another edit recomputes or re-issues
        views = _region_views(graph, edit.recompute, closure_inputs, (), lambda name: alias_base(name, tensors))
        if any(name in views for name in edit.reads):
            # a copy of a view of an input: nvFuser 0.2.36 gave such an output a segment of its own and
            # split the rest of the region (:func:`_hoistable`); its own small region costs less
            continue
        produced: set[str] = set(unit.outputs)
        for later in units[unit.index + 1 : unit.index + 1 + HOST_WINDOW]:
            if later.phase != BACKWARD or later.kind == "return" or any(ops[n].side_effect for n in later.nodes):
                break
            later_edit = edits[later.index]
            movable = later_edit.action in ("keep", "recompute_into") or (later_edit.action == "rebuild" and later_edit.nodes == later.nodes)
            own = tuple(later_edit.recompute)
            # its own recomputation must read only saved values: a stand-alone op's output that an edit
            # between re-issued would not exist yet where the region moves to
            own_reads_saved = not any(_activation(tensors, n) and n not in saved for n in _inputs_of(graph, own))
            if later.kind == "region" and later.index not in hosts and movable and not later_edit.stages and own_reads_saved:
                merged = tuple(sorted(set(own) | set(edit.recompute)))
                inputs = _inputs_of(graph, merged + later.nodes)
                own_inputs = set(_inputs_of(graph, own + later.nodes))
                shares = not any(_activation(tensors, n) for n in inputs if n not in own_inputs)
                if shares and produced.isdisjoint(inputs):
                    shared = set(own) & set(edit.recompute)
                    candidates.append((unit.index, later.index, merged, sum(ops[n].flops for n in shared)))
                    hosts.add(later.index)
                    break
            produced.update(later.outputs)
    if not candidates:
        return layout

    # memory: moving host region R up to reader U (to the step of U's recompute region, which it
    # replaces) keeps R's outputs alive over the steps in between and frees the inputs R reads last
    # earlier; accepted while the live bytes there stay within the peak of ``layout``
    simulated, unit_row = _layout_rows(graph, layout, donations=False)  # planning counts every output a buffer
    profile, _, end = profile_with_lifetimes(simulated)
    step_of = {point.unit: point.step for point in profile.timeline}
    live = [point.live_bytes for point in profile.timeline]
    sim_tensors = simulated.tensors
    extra_flops = layout.extra_flops
    for reader, host, merged, shared_flops in candidates:
        row = simulated.units[unit_row[host]]
        first, stop = step_of[unit_row[reader]] - 1, step_of[unit_row[host]]  # U's region, R
        bases = {alias_base(o, sim_tensors) for o in row.outputs}
        out_bytes = sum(sim_tensors[b].bytes for b in bases if b in row.outputs)
        dying = sum(
            sim_tensors[b].bytes for b in {alias_base(i, sim_tensors) for i in row.inputs} if end.get(b) == stop
        )
        after = out_bytes - dying
        if live[first] + out_bytes > profile.peak_bytes or max(live[first + 1 : stop], default=0) + after > profile.peak_bytes:
            continue
        live[first] += out_bytes
        for step in range(first + 1, stop):
            live[step] += after
        edits[host] = replace(edits[host], action="recompute_into", recompute=merged, exports=edits[reader].reads, moved_before=reader)
        edits[reader] = replace(edits[reader], recompute=(), host=host)
        extra_flops -= shared_flops
    return Layout(tuple(edits), extra_flops)


def _activation(tensors: dict[str, TensorInfo], name: str) -> bool:
    info = tensors.get(name)
    return info is not None and info.kind not in ("param", "input", "number")


def _split_seed(graph: FusionGraph) -> frozenset[str]:
    """What Thunder's split starts from (:func:`split_phases`): the forward outputs, parameters and
    inputs; once per graph."""
    cache = _MEMO.setdefault(graph, {})
    seed = cache.get("split seed")
    if seed is None:
        seed = cache["split seed"] = frozenset(graph.forward_outputs).union(
            n for n, t in graph.tensors.items() if t.kind in ("param", "input")
        )
    return seed


def layout_graph(graph: FusionGraph, layout: Layout) -> FusionGraph:
    """The units and tensors the rewritten trace would have (no Thunder objects are made), for the
    memory model: ``profile_graph(layout_graph(graph, plan_layout(graph, plan)))`` equals the profile of
    the rewritten trace (:func:`remat.thunder.rewrite.apply_plan`)."""
    return _layout_rows(graph, layout)[0]


def _layout_rows(graph: FusionGraph, layout: Layout, donations: bool = True) -> tuple[FusionGraph, dict[int, int]]:
    """:func:`layout_graph`, and for every unit of ``graph`` still written, the index of its own unit
    in the result.  ``donations=False``: none found, even where ``graph.donating`` asks for them."""
    ops, tensors = graph.ops, dict(graph.tensors)
    rows: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []  # (name, kind, inputs, outputs)
    row_phases: list[str] = []  # for plain graphs, whose phases are given
    row_members: dict[int, tuple[int, ...]] = {}  # region rows -> their op nodes (for donations)
    unit_row: dict[int, int] = {}
    aliases: dict[str, str] = {}
    # forward name -> fresh name of each output of a re-issued stand-alone op, for every later edit
    reissued: dict[str, str] = {}
    fresh_count = 0
    new_names = RegionNames(u.name for u in graph.units if u.kind == "region")

    def base_of(name: str) -> str:
        return aliases.get(name) or alias_base(name, tensors)

    def fresh_name(name: str, *, copy: bool) -> str:
        """A new name for ``name`` written again in the backward: a region's copy (an activation of its
        own storage) or the output of a re-issued stand-alone op (its kind kept: a number stays one)."""
        nonlocal fresh_count
        fresh = f"{name}__recomputed{fresh_count}"
        fresh_count += 1
        info = tensors[name]
        tensors[fresh] = TensorInfo(
            fresh, info.shape, info.dtype, info.bytes, "activation" if copy else info.kind, info.producer_unit,
            info.producer_node, info.phase, None,
        )
        return fresh

    def emit(edit: UnitEdit, given: Mapping[str, str] | None = None) -> dict[str, str]:
        """Append the rows of one edit; ``given``: fresh copies a host region wrote for it.  Returns the
        fresh copies this edit exports (a host region's)."""
        unit = graph.units[edit.index]
        if edit.action == "drop":
            return {}
        if edit.action == "keep":
            if unit.kind == "region":
                views = _region_views(graph, unit.nodes, unit.inputs, unit.outputs, base_of)
                aliases.update((name, base) for name, base in views.items() if name in unit.outputs)
            unit_row[edit.index] = len(rows)
            if unit.kind == "region":
                row_members[len(rows)] = unit.nodes
            rows.append((unit.name, unit.kind, unit.inputs, unit.outputs))
            row_phases.append(unit.phase)
            return {}
        # staged recomputation first: each value it hands on gets a fresh name (``renamed``); a recompute
        # edit also reads the outputs of stand-alone ops earlier edits re-issued under their fresh names
        # (a view of ``reissued``, not a copy: edits are many, and this runs for every plan a budget tries)
        renamed: ChainMap[str, str] = ChainMap(dict(given or {}), reissued) if edit.action in ("recompute_into", "recompute_before") else ChainMap()

        def renamed_base_of(name: str) -> str:
            return base_of(renamed.get(name, name))

        for stage in edit.stages:
            if stage.region:
                inputs = _inputs_of(graph, stage.region)
                views = _region_views(graph, stage.region, inputs, (), renamed_base_of)
                exported = {name: fresh_name(name, copy=True) for name in stage.exports}
                for name, fresh in exported.items():
                    if name in views:  # a copy of a view of a region input is an alias of that input (nvFuser)
                        aliases[fresh] = views[name]
                row_members[len(rows)] = tuple(stage.region)
                rows.append((new_names.new_name(), "region", tuple(renamed.get(n, n) for n in inputs), tuple(exported.values())))
                row_phases.append(BACKWARD)
                renamed.update(exported)
            for n in stage.ops:
                op = ops[n]
                inputs = tuple(renamed.get(a, a) for a in op.inputs)
                written = {name: fresh_name(name, copy=False) for name in op.outputs}
                tensor_inputs = [a for a in inputs if a in tensors and tensors[a].kind != "number"]
                for name, fresh in written.items():
                    if tensors[name].alias_of is not None and tensor_inputs:  # an aliasing op aliases its new input
                        aliases[fresh] = base_of(tensor_inputs[0])
                rows.append((graph.units[op.unit].name, "op", inputs, tuple(written.values())))
                row_phases.append(BACKWARD)
                renamed.update(written)
                reissued.update(written)
        if edit.action == "recompute_before":
            inputs = _inputs_of(graph, tuple(edit.recompute))
            views = _region_views(graph, edit.recompute, inputs, (), renamed_base_of)
            fresh_reads: dict[str, str] = {}
            for name in edit.reads:
                if name in renamed:  # a stage or the host region wrote it already
                    continue
                fresh = fresh_reads[name] = fresh_name(name, copy=True)
                # a copy of a view of a region input is written as an alias of that input (nvFuser)
                if name in views:
                    aliases[fresh] = views[name]
            if fresh_reads:
                region_inputs = tuple(renamed.get(n, n) for n in inputs)
                row_members[len(rows)] = tuple(edit.recompute)
                rows.append((new_names.new_name(), "region", region_inputs, tuple(fresh_reads.values())))
                row_phases.append(BACKWARD)
            renamed.update(fresh_reads)
            swapped = tuple(renamed.get(n, n) for n in unit.inputs)
            unit_row[edit.index] = len(rows)
            if unit.kind == "region":
                row_members[len(rows)] = unit.nodes
            rows.append((unit.name, unit.kind, swapped, unit.outputs))
            row_phases.append(unit.phase)
            if unit.inputs and unit.inputs[0] in renamed:  # a view of a recomputed value aliases the new copy
                for out in unit.outputs:
                    if tensors.get(out) is not None and tensors[out].alias_of is not None:
                        aliases[out] = base_of(renamed[unit.inputs[0]])
            return {}
        if edit.action == "rebuild":
            nodes, outputs = edit.nodes, edit.outputs
        else:  # recompute_into
            nodes, outputs = edit.recompute + unit.nodes, unit.outputs
        hoisted_outputs = {ops[n].outputs[0] for n in edit.hoisted}
        inputs = _inputs_of(graph, tuple(nodes))
        region_outputs = tuple(o for o in outputs if o not in hoisted_outputs)
        views = _region_views(graph, [n for n in nodes if n not in edit.hoisted], inputs, region_outputs, renamed_base_of)
        aliases.update((name, base) for name, base in views.items() if name in region_outputs)
        exported: dict[str, str] = {}
        if edit.exports:  # a host region: fresh copies of what the stand-alone reader it moved before reads
            recompute_views = _region_views(graph, edit.recompute, _inputs_of(graph, tuple(edit.recompute)), (), renamed_base_of)
            for name in edit.exports:
                exported[name] = fresh_name(name, copy=True)
                if name in recompute_views:
                    aliases[exported[name]] = recompute_views[name]
        unit_row[edit.index] = len(rows)
        row_members[len(rows)] = tuple(n for n in nodes if n not in edit.hoisted)
        rows.append((unit.name, "region", tuple(renamed.get(n, n) for n in inputs), region_outputs + tuple(exported.values())))
        row_phases.append(unit.phase)
        for n in edit.hoisted:
            op = ops[n]
            base = next(a for a in op.inputs if a in tensors and tensors[a].kind != "number")
            base = renamed.get(base, base)
            view = op.outputs[0]
            aliases[view] = aliases.get(base) or alias_base(base, tensors)
            rows.append((op.kind, "op", (base,), (view,)))
            row_phases.append(unit.phase)
        return exported

    for edit in layout.edits:
        if edit.moved_before is not None:  # written before the stand-alone reader it hosts a recomputation for
            continue
        given = emit(layout.edits[edit.host]) if edit.host is not None else None
        emit(edit, given)

    kinds = [row[1] for row in rows]
    if graph.plain:  # phases of plain graphs are given
        phases = row_phases
    elif graph.is_joint:  # what Thunder's split will decide for the rewritten trace
        phases = split_phases([r[3] for r in rows], [r[2] for r in rows], kinds, _split_seed(graph))
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
            if info.producer_unit == index and info.phase == phase and info.alias_of == alias:
                continue  # unchanged (most forward values): the graph's own record, one allocation fewer
            if info.kind in ("param", "input"):
                tensors[out] = info._replace(producer_unit=index)
            else:
                # built field by field: NamedTuple._replace's generic path was a third of a 32-layer
                # budget search (one value per row per candidate plan)
                tensors[out] = TensorInfo(
                    info.name, info.shape, info.dtype, info.bytes, info.kind, index, info.producer_node, phase, alias
                )
    donating = graph.donating if ops is not None and donations else None  # the runtime writes outputs over dying inputs
    simulated = FusionGraph(
        units,
        tensors,
        None,
        forward_outputs=graph.forward_outputs,
        gradients=graph.gradients,
        is_joint=graph.is_joint,
        explicit_saved=graph.explicit_saved,
        save_costs=graph.save_costs,
        strides=graph.strides if donating is not None else {},
    )
    if donating is not None:
        with_donations(simulated, {row: tuple(ops[n].kind for n in nodes) for row, nodes in row_members.items()}, donating)
    return simulated, unit_row
