"""Stage 6, *rewrite*: apply a :class:`~remat.plan.Plan` to the Thunder trace it was made from.

The rewrite is decided on plain data first (:func:`plan_layout`, one :class:`UnitEdit` per unit of the
trace), then either materialized as a Thunder trace (:func:`apply_plan`) or simulated as units for the
memory model (:func:`layout_graph`, what :func:`remat.plan_memory` uses to price many plans quickly).
Both read the same layout, so the estimate of a plan is the estimate of its rewritten trace.

The new joint trace is such that

* forward units compute only what the forward still needs: values read by later forward units, the
  forward outputs, and the plan's saved values (a region gains an output for a value saved from inside
  it, and loses the outputs and ops only the backward used to read);
* every backward unit that read a value the plan recomputes gets that value back from the saved ones:
  a backward *region* takes the recomputing prims at its start (they are fused with it); a stand-alone
  backward op (a matmul, an attention backward, a view) gets a new small region placed right before
  it, whose outputs carry fresh names (a region output reusing a forward name would make Thunder's
  split treat the region as forward);
* recomputation is placed per consuming unit, so a recomputed value never lives longer than the unit
  that reads it (the price is repeated FLOPs when several units read it, reported in ``extra_flops``);
* a region output that is a view of another output (``reshape(a)`` beside ``a``) or of an input is
  written after the region as a stand-alone view, which costs no memory.

Recomputed prims inside a region keep their forward names, as Thunder's own rematerialization does:
they are internal to the region and invisible to the split.  Regions keep their names (so a plan reads
as "nvFusion12 now also recomputes ..."); new recompute regions are numbered after the largest one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from remat import _compat
from remat.graph import BACKWARD, FORWARD, FusionGraph, TensorInfo, Unit, region_view_outputs, split_phases
from remat.plan import Plan
from remat.regions import RegionExecutor, default_region_executor, make_region, region_io

_compat.import_thunder()

from thunder.core import prims  # noqa: E402
from thunder.core.proxies import Proxy, TensorProxy, variableify  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx  # noqa: E402

__all__ = ["RewriteResult", "UnitEdit", "Layout", "plan_layout", "apply_plan", "layout_graph"]

# Shape prims that PyTorch always runs as views, and reshape, a view of a contiguous tensor.
_ALWAYS_VIEW = frozenset({"squeeze", "transpose", "slice", "broadcast_in_dim"})


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


@dataclass
class Layout:
    edits: list[UnitEdit]
    extra_flops: int


@dataclass
class RewriteResult:
    """``placements`` maps each region of the new trace that recomputes something to the op nodes (ids
    in the original graph) it recomputes; ``recompute_regions`` counts the new regions."""

    trace: TraceCtx
    extra_flops: int
    recompute_regions: int
    notes: list[str] = field(default_factory=list)
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- layout


def _region_io(ops, nodes: Sequence[int], wanted: set[str] | None = None) -> tuple[list[str], list[str]]:
    """Names read by ``nodes`` and not written by them (order of first use); names written (in order)."""
    produced: dict[str, None] = {}
    inputs: dict[str, None] = {}
    for n in nodes:
        op = ops[n]
        for name in op.inputs:
            if name not in produced and name not in inputs:
                inputs[name] = None
        for name in op.outputs:
            produced.setdefault(name)
    written = [name for name in produced if (wanted is None or name in wanted) and name not in inputs]
    return list(inputs), written


def _closure(graph: FusionGraph, saved: set[str], values: Sequence[str]) -> list[int]:
    """Forward op nodes recomputing ``values`` from saved values, parameters and inputs (node order)."""
    ops, tensors = graph.ops, graph.tensors
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
        for read in ops[node].inputs:
            read_info = tensors.get(read)
            if read_info is None or read_info.kind != "activation" or read in saved or read in seen:
                continue
            if graph.units[read_info.producer_unit].phase != FORWARD:
                continue
            seen.add(read)
            stack.append(read)
    return sorted(chosen)


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
        if len(op.outputs) != 1 or (op.kind not in _ALWAYS_VIEW and op.kind != "reshape"):
            continue
        tensor_args = [a for a in op.inputs if a in tensors and tensors[a].kind != "number"]
        if len(tensor_args) != 1:
            continue
        base = tensor_args[0]
        base_is_output = base in output_names and base not in hoisted_names
        view_of_input = base in input_names and (op.kind in _ALWAYS_VIEW or n in graph.view_ops)
        if not (base_is_output or view_of_input):
            continue
        hoisted.append(n)
        hoisted_names.add(name)
    if len(hoisted_names) == len(outputs):
        return ()
    return tuple(hoisted)


def plan_layout(graph: FusionGraph, plan: Plan) -> Layout:
    """Decide, unit by unit, how the trace changes under ``plan`` (see :class:`UnitEdit`)."""
    if graph.ops is None:
        raise ValueError("plan_layout needs a FusionGraph with op records (FusionGraph.from_trace(trace))")
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
        _, written = _region_io(ops, kept, needed_after)
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
        inputs, _ = _region_io(ops, nodes)
        hoisted = _hoistable(graph, nodes, outputs, inputs)
        if hoisted:
            action = "rebuild" if edit.action == "keep" else edit.action
            edits[index] = UnitEdit(index, action, nodes or unit.nodes, outputs, edit.recompute, edit.reads, hoisted)
    return Layout([edits[u.index] for u in graph.units], extra_flops)


# -------------------------------------------------------------------------------- Thunder trace


class _RegionNames:
    """Regions keep their names; new recompute regions get fresh ``nvFusionN`` names after the largest
    existing N (fusion names must be unique within a trace: they key its call context)."""

    def __init__(self, trace: TraceCtx):
        taken = [int(m.group(1)) for b in trace.bound_symbols if b.sym.is_fusion for m in [re.search(r"(\d+)$", b.sym.name)] if m]
        self.next = max(taken, default=-1) + 1

    def new_name(self) -> str:
        name = f"nvFusion{self.next}"
        self.next += 1
        return name


def _owner(region: BoundSymbol, default: RegionExecutor) -> RegionExecutor:
    """The executor that made ``region`` (so a rebuilt region keeps its backend, e.g. nvFuser)."""
    owner = region.sym.executor
    return owner if isinstance(owner, RegionExecutor) else default


def _trace_executor(trace: TraceCtx) -> RegionExecutor | None:
    for bsym in trace.bound_symbols:
        if bsym.sym.is_fusion and isinstance(bsym.sym.executor, RegionExecutor):
            return bsym.sym.executor
    return None


def _proxy_map(bsyms: Sequence[BoundSymbol]) -> dict[str, Proxy]:
    found: dict[str, Proxy] = {}
    for bsym in bsyms:
        for p in bsym.flat_proxy_args:
            found.setdefault(p.name, p)
        for p in bsym.flat_proxy_outs:
            found.setdefault(p.name, p)
    return found


def _thunder_region_io(bsyms: Sequence[BoundSymbol], outputs: Sequence[str]) -> tuple[list[Proxy], list[Proxy]]:
    """Region inputs, and the proxies of ``outputs`` in that order."""
    inputs, written = region_io(bsyms, outputs)
    by_name = {p.name: p for p in written}
    return inputs, [by_name[name] for name in outputs]


def apply_plan(
    trace: TraceCtx,
    graph: FusionGraph,
    plan: Plan,
    *,
    executor: RegionExecutor | None = None,
    layout: Layout | None = None,
) -> RewriteResult:
    """Rewrite ``trace`` (the trace ``graph`` was built from) to follow ``plan``.  Changed regions keep
    the executor (and so the backend) that made them; new regions use ``executor``, by default the one
    that made the trace's regions."""
    if graph.ops is None or graph.op_bsyms is None or graph.unit_bsyms is None:
        raise ValueError("apply_plan needs a FusionGraph built from a trace (FusionGraph.from_trace)")
    executor = executor or _trace_executor(trace) or default_region_executor()
    layout = layout or plan_layout(graph, plan)
    edit_of = {id(graph.unit_bsyms[e.index]): e for e in layout.edits}
    op_bsyms = graph.op_bsyms
    new_trace = from_trace(trace)
    names = _RegionNames(trace)
    new_bsyms: list[BoundSymbol] = []
    recompute_regions = 0
    hoisted_count = 0
    placements: dict[str, tuple[int, ...]] = {}

    for bsym in trace.bound_symbols:
        edit = edit_of.get(id(bsym))
        if edit is None or edit.action == "keep":  # comments, deletes, unchanged units
            new_bsyms.append(bsym)
            continue
        if edit.action == "drop":
            continue
        owner = _owner(bsym, executor)
        hoisted = set(edit.hoisted)
        if edit.action == "rebuild":
            members = [op_bsyms[n] for n in edit.nodes]
            outputs = [name for name in edit.outputs if not _writes(op_bsyms, hoisted, name)]
            inputs, out_proxies = _thunder_region_io(members, outputs)
            new_bsyms.append(make_region(owner, bsym.sym.name, members, inputs, out_proxies))
        elif edit.action == "recompute_into":
            members = [op_bsyms[n] for n in edit.recompute] + list(bsym.subsymbols)
            outputs = [p.name for p in bsym.flat_proxy_outs if not _writes(op_bsyms, hoisted, p.name)]
            inputs, out_proxies = _thunder_region_io(members, outputs)
            new_bsyms.append(make_region(owner, bsym.sym.name, members, inputs, out_proxies))
            placements[bsym.sym.name] = edit.recompute
        else:  # recompute_before: a new region hands the values out under fresh names (no-op copies)
            members = [op_bsyms[n] for n in edit.recompute]
            proxies = _proxy_map(members)
            swap: dict = {}
            copies: list[BoundSymbol] = []
            with tracectx(new_trace):
                for name in edit.reads:
                    original = proxies[name]
                    fresh = TensorProxy(like=original)
                    copies.append(prims.shallow_copy.bind(original, output=fresh))
                    swap[variableify(original)] = fresh
            region_members = members + copies
            inputs, out_proxies = _thunder_region_io(region_members, [c.output.name for c in copies])
            region = make_region(executor, names.new_name(), region_members, inputs, out_proxies)
            new_bsyms.append(region)
            placements[region.sym.name] = edit.recompute
            recompute_regions += 1
            new_bsyms.append(bsym.from_bsym_swap_proxies(swap, skip_output=True))
            continue
        new_bsyms.extend(op_bsyms[n] for n in edit.hoisted)
        hoisted_count += len(edit.hoisted)

    new_trace.bound_symbols = new_bsyms
    new_trace.set_provenance(
        TraceProvenance(
            f"remat.optimize: saved {len(plan.saved)} values ({plan.saved_bytes / 2**20:.1f} MiB), "
            f"recomputed {len(plan.recomputed_ops)} ops"
        )
    )
    notes = [f"{hoisted_count} region outputs that were views of other outputs or inputs now alias them"] if hoisted_count else []
    return RewriteResult(new_trace, layout.extra_flops, recompute_regions, notes, placements)


def _writes(op_bsyms, nodes: set[int], name: str) -> bool:
    return any(name in (p.name for p in op_bsyms[n].flat_proxy_outs) for n in nodes)


# ----------------------------------------------------------------------------- simulated units


def layout_graph(graph: FusionGraph, layout: Layout) -> FusionGraph:
    """The units and tensors the rewritten trace would have (no Thunder objects are made), for the
    memory model: ``profile_graph(layout_graph(graph, plan_layout(graph, plan)))`` equals the profile of
    ``apply_plan(...)``'s trace."""
    ops, tensors = graph.ops, dict(graph.tensors)
    rows: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []  # (name, kind, inputs, outputs)
    row_phases: list[str] = []  # for plain graphs, whose phases are given
    aliases: dict[str, str] = {}
    fresh_count = 0
    new_names = _RegionNames.__new__(_RegionNames)
    taken = [int(m.group(1)) for u in graph.units if u.kind == "region" for m in [re.search(r"(\d+)$", u.name)] if m]
    new_names.next = max(taken, default=-1) + 1

    def base_of(name: str) -> str:
        return aliases.get(name, tensors[name].alias_of or name) if name in tensors else name

    for edit in layout.edits:
        unit = graph.units[edit.index]
        if edit.action == "drop":
            continue
        if edit.action == "keep":
            if unit.kind == "region":
                views = region_view_outputs(graph, unit.nodes, unit.inputs, unit.outputs, base_of)
                aliases.update((name, base) for name, base in views.items() if name in unit.outputs)
            rows.append((unit.name, unit.kind, unit.inputs, unit.outputs))
            row_phases.append(unit.phase)
            continue
        if edit.action == "recompute_before":
            inputs, _ = _region_io(ops, edit.recompute)
            views = region_view_outputs(graph, edit.recompute, inputs, (), base_of)
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
        inputs, _ = _region_io(ops, nodes)
        region_outputs = tuple(o for o in outputs if o not in hoisted_outputs)
        views = region_view_outputs(graph, [n for n in nodes if n not in edit.hoisted], inputs, region_outputs, base_of)
        aliases.update((name, base) for name, base in views.items() if name in region_outputs)
        rows.append((unit.name, "region", tuple(inputs), region_outputs))
        row_phases.append(unit.phase)
        for n in edit.hoisted:
            op = ops[n]
            base = next(a for a in op.inputs if a in tensors and tensors[a].kind != "number")
            view = op.outputs[0]
            aliases[view] = aliases.get(base, tensors[base].alias_of or base)
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
            info = tensors.get(out)
            if info is None:
                continue
            # region outputs are fresh buffers unless they are views of the region's inputs or outputs;
            # stand-alone views keep (or, when hoisted, get) their base
            alias = aliases.get(out, info.alias_of if kind == "op" else None)
            if info.kind in ("param", "input"):
                tensors[out] = info._replace(producer_unit=index)
            else:
                tensors[out] = info._replace(producer_unit=index, phase=phase, alias_of=alias)
    simulated = FusionGraph(
        units,
        tensors,
        None,
        forward_outputs=graph.forward_outputs,
        gradients=graph.gradients,
        is_joint=graph.is_joint,
        explicit_saved=graph.explicit_saved,
    )
    simulated.plain = graph.plain
    return simulated
