"""Stage 6, *rewrite*: a plan layout made into a Thunder trace.

:func:`apply_plan` applies a :class:`remat.Plan` to the trace its graph was read from, following the
layout :func:`remat.core.layout.plan_layout` decides (the module docstring there says what changes).
Recomputed prims inside a region keep their forward names, as Thunder's own rematerialization does:
they are internal to the region and invisible to the split.  Changed regions keep the executor (and so
the runtime) that made them; new recompute regions use the trace's.

A recomputation that re-runs ops which stand alone in the forward (the layout's staging rule,
:func:`remat.core.layout.stands_alone`: a matmul kept out of regions, an attention kernel, a re-gather's
all-gather and wait) runs in the layout's stages before the unit: each stage's fusible ops in a new region
writing fresh copies (``shallow_copy``) of what later stages and the unit read, then each stand-alone op
re-issued as the bound symbol the forward ran (for a re-gather the torch executor's
``torch_all_gather_prim_impl`` and ``torch_wait_prim_impl``) with fresh output names; every later reader
reads the fresh names (a backward op writing a forward name would make Thunder's split treat it as
forward).  A stand-alone op is re-issued once, for the first unit that needs it: later edits read its
fresh outputs too (``reissued``, as the layout's memory model does).  A host region
(:func:`remat.core.layout.host_recomputations`) is written before the stand-alone op it hosts a
recomputation for, with ``shallow_copy`` exports of what that op reads, and not at its own place.  The order follows the plan layout,
which is deterministic, so every rank issues the same collectives in the same order.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field

from thunder.core import prims
from thunder.core.proxies import FutureTensorProxy, Proxy, TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx

from remat.core.ir import FusionGraph
from remat.core.layout import Layout, PlanLike, RegionNames, plan_layout
from remat.thunder.read import TraceOrigin
from remat.thunder.regions import RegionExecutor, default_region_executor, make_region, region_io

__all__ = ["RewriteResult", "apply_plan"]


@dataclass
class RewriteResult:
    """``placements`` says where each recomputed op now runs: it maps each region of the new trace that
    recomputes something to the op nodes (ids in the original graph) it recomputes, and each re-issued
    stand-alone op, keyed ``"<its first output> = <symbol>"`` (e.g. ``"t5021 = linear"``), to its own
    node; ``recompute_regions`` counts the new regions."""

    trace: TraceCtx
    extra_flops: int
    recompute_regions: int
    notes: list[str] = field(default_factory=list)
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)


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
    plan: PlanLike,
    *,
    executor: RegionExecutor | None = None,
    layout: Layout | None = None,
) -> RewriteResult:
    """Rewrite ``trace`` (the trace ``graph`` was built from) to follow ``plan``.  Changed regions keep
    the executor (and so the backend) that made them; new regions use ``executor``, by default the one
    that made the trace's regions."""
    origin = graph.origin
    if graph.ops is None or not isinstance(origin, TraceOrigin) or origin.op_bsyms is None:
        raise ValueError("apply_plan needs a FusionGraph read from a trace with its operations (remat.read_trace)")
    executor = executor or _trace_executor(trace) or default_region_executor()
    layout = layout or getattr(plan, "layout", None) or plan_layout(graph, plan)
    edit_of = {id(origin.unit_bsyms[e.index]): e for e in layout.edits}
    op_bsyms = origin.op_bsyms
    new_trace = from_trace(trace)
    names = RegionNames(b.sym.name for b in trace.bound_symbols if b.sym.is_fusion)
    new_bsyms: list[BoundSymbol] = []
    recompute_regions = 0
    hoisted_count = 0
    placements: dict[str, tuple[int, ...]] = {}
    # forward proxy -> fresh proxy of each output of a re-issued stand-alone op: the layout re-issues one
    # for the first unit that needs it, and later recompute edits read its fresh outputs
    reissued: dict = {}

    for bsym in trace.bound_symbols:
        edit = edit_of.get(id(bsym))
        if edit is None or edit.action == "keep":  # comments, deletes, unchanged units
            new_bsyms.append(bsym)
            continue
        if edit.action == "drop" or edit.moved_before is not None:  # a host region is written before its reader
            continue
        owner = _owner(bsym, executor)
        hoisted = set(edit.hoisted)
        # staged recomputation first (pre-regions and re-issued stand-alone ops); ``swap`` maps the forward
        # proxies they write again to the fresh ones every later reader reads
        swap: ChainMap = ChainMap({}, reissued) if edit.action in ("recompute_into", "recompute_before") else ChainMap()
        if edit.host is not None:  # the host region moves up here and writes fresh copies of what this unit reads
            host_bsym, host_edit = origin.unit_bsyms[edit.host], layout.edits[edit.host]
            members = _swapped([op_bsyms[n] for n in host_edit.recompute] + list(host_bsym.subsymbols), swap)
            outputs = [p.name for p in host_bsym.flat_proxy_outs if not _writes(op_bsyms, set(host_edit.hoisted), p.name)]
            region = _copying_region(
                _owner(host_bsym, executor), host_bsym.sym.name, members, host_edit.exports, swap.maps[0], new_trace, outputs
            )
            new_bsyms.append(region)
            placements[host_bsym.sym.name] = host_edit.recompute
            new_bsyms.extend(_swapped([op_bsyms[n] for n in host_edit.hoisted], swap))
            hoisted_count += len(host_edit.hoisted)
        for stage in edit.stages:
            if stage.region:
                members = _swapped([op_bsyms[n] for n in stage.region], swap)
                region = _copying_region(executor, names.new_name(), members, stage.exports, swap, new_trace)
                new_bsyms.append(region)
                placements[region.sym.name] = stage.region
                recompute_regions += 1
            for n in stage.ops:
                issued = _reissued(op_bsyms[n], swap, new_trace)
                new_bsyms.append(issued)
                reissued.update((variableify(out), swap[variableify(out)]) for out in op_bsyms[n].flat_proxy_outs)
                placements[f"{issued.flat_proxy_outs[0].name} = {issued.sym.name}"] = (n,)
        if edit.action == "rebuild":
            members = [op_bsyms[n] for n in edit.nodes]
            outputs = [name for name in edit.outputs if not _writes(op_bsyms, hoisted, name)]
            inputs, out_proxies = _thunder_region_io(members, outputs)
            new_bsyms.append(make_region(owner, bsym.sym.name, members, inputs, out_proxies))
        elif edit.action == "recompute_into":
            members = _swapped([op_bsyms[n] for n in edit.recompute] + list(bsym.subsymbols), swap)
            outputs = [p.name for p in bsym.flat_proxy_outs if not _writes(op_bsyms, hoisted, p.name)]
            inputs, out_proxies = _thunder_region_io(members, outputs)
            new_bsyms.append(make_region(owner, bsym.sym.name, members, inputs, out_proxies))
            if edit.recompute:
                placements[bsym.sym.name] = edit.recompute
        else:  # recompute_before: a new region hands the values out under fresh names (no-op copies)
            written_again = {v.proxy.name for v in swap}  # the stages wrote these already
            copied = [name for name in edit.reads if name not in written_again]
            if copied:
                members = _swapped([op_bsyms[n] for n in edit.recompute], swap)
                region = _copying_region(executor, names.new_name(), members, copied, swap, new_trace)
                new_bsyms.append(region)
                placements[region.sym.name] = edit.recompute
                recompute_regions += 1
            new_bsyms.append(bsym.from_bsym_swap_proxies(swap, skip_output=True))
            continue
        new_bsyms.extend(_swapped([op_bsyms[n] for n in edit.hoisted], swap))
        hoisted_count += len(edit.hoisted)

    new_trace.bound_symbols = new_bsyms
    new_trace.set_provenance(
        TraceProvenance(
            f"remat.optimize: saved {len(plan.saved)} values, recomputing {len(plan.recomputed_values)} in the backward"
        )
    )
    notes = [f"{hoisted_count} region outputs that were views of other outputs or inputs now alias them"] if hoisted_count else []
    return RewriteResult(new_trace, layout.extra_flops, recompute_regions, notes, placements)


def _copying_region(
    executor: RegionExecutor,
    name: str,
    members: list[BoundSymbol],
    exports: Sequence[str],
    swap: MutableMapping,
    new_trace: TraceCtx,
    outputs: Sequence[str] = (),
) -> BoundSymbol:
    """A region running ``members`` and writing ``outputs`` (names of its own values) and a fresh copy
    (``shallow_copy``, a no-op in nvFuser) of each value named in ``exports``; ``swap`` learns the
    copies.  A backward region writing a forward name would make Thunder's split treat it as forward."""
    proxies = _proxy_map(members)
    copies: list[BoundSymbol] = []
    with tracectx(new_trace):
        for export in exports:
            original = proxies[export]
            fresh = TensorProxy(like=original)
            copies.append(prims.shallow_copy.bind(original, output=fresh))
            swap[variableify(original)] = fresh
    region_members = members + copies
    inputs, out_proxies = _thunder_region_io(region_members, list(outputs) + [c.output.name for c in copies])
    return make_region(executor, name, region_members, inputs, out_proxies)


def _reissued(bsym: BoundSymbol, swap: MutableMapping, new_trace: TraceCtx) -> BoundSymbol:
    """``bsym`` (a forward op that stands alone) issued again: reading the fresh proxies of ``swap`` and
    writing fresh proxies (a future for a future), which ``swap`` learns."""
    with tracectx(new_trace):
        for out in bsym.flat_proxy_outs:
            if isinstance(out, FutureTensorProxy):
                fresh = FutureTensorProxy(like=out)
            elif isinstance(out, TensorProxy):
                fresh = TensorProxy(like=out)
            else:  # a number the op returns (e.g. an RNG seed)
                fresh = out.replace(name=new_trace.make_name())
            swap[variableify(out)] = fresh
    return bsym.from_bsym_swap_proxies(swap)


def _swapped(bsyms: Sequence[BoundSymbol], swap: MutableMapping) -> list[BoundSymbol]:
    """``bsyms`` reading the fresh proxies of ``swap`` (their outputs unchanged)."""
    if not swap:
        return list(bsyms)
    return [b.from_bsym_swap_proxies(swap, skip_output=True) for b in bsyms]


def _writes(op_bsyms, nodes: set[int], name: str) -> bool:
    return any(name in (p.name for p in op_bsyms[n].flat_proxy_outs) for n in nodes)


