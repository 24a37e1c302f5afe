"""Stage 6, *rewrite*: apply a :class:`~remat.plan.Plan` to the Thunder trace it was made from.

:func:`apply_plan` returns a new joint trace in which

* forward units compute only what the forward still needs: values read by later forward units, the
  forward outputs, and the plan's saved values (a region gains an output for a value saved from inside
  it, and loses the outputs and ops only the backward used to read);
* every backward unit that read a value the plan recomputes gets that value back from the saved ones:
  a backward *region* takes the recomputing prims at its start (they are fused with it); a stand-alone
  backward op (a matmul, an attention backward, a view) gets a new small region placed right before
  it, whose outputs carry fresh names (a region output reusing a forward name would make Thunder's
  split treat the region as forward);
* recomputation is placed per consuming unit, so a recomputed value never lives longer than the unit
  that reads it (the price is repeated FLOPs when several units read it, reported in ``extra_flops``).

Recomputed prims inside a region keep their forward names, as Thunder's own rematerialization does:
they are internal to the region and invisible to the split.  Regions keep their names (so a plan reads
as "nvFusion12 now also recomputes ..."); new recompute regions are numbered after the largest one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from remat import _compat
from remat.graph import BACKWARD, FORWARD, FusionGraph, op_kind
from remat.plan import Plan
from remat.regions import RegionExecutor, default_region_executor, make_region, region_io

_compat.import_thunder()

from thunder.core import prims  # noqa: E402
from thunder.core.proxies import Proxy, TensorProxy, variableify  # noqa: E402
from thunder.core.symbol import BoundSymbol, has_tags  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx  # noqa: E402

__all__ = ["RewriteResult", "apply_plan"]

# Ops that must stay even when nothing reads their outputs.
_SIDE_EFFECT_KINDS = frozenset({"copy_", "get_and_update_rng_state", "update_aliases", "sink"})


@dataclass
class RewriteResult:
    """``placements`` maps each region of the new trace that recomputes something to the op nodes (ids
    in the original graph) it recomputes; ``recompute_regions`` counts the new regions."""

    trace: TraceCtx
    extra_flops: int
    recompute_regions: int
    notes: list[str] = field(default_factory=list)
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _keeps_side_effects(bsym: BoundSymbol, kind: str) -> bool:
    return kind in _SIDE_EFFECT_KINDS or has_tags(bsym, {prims.OpTags.DONT_DCE, prims.OpTags.IN_PLACE})


class _RegionNames:
    """Regions keep their names; new recompute regions get fresh ``nvFusionN`` names after the largest
    existing N (fusion names must be unique within a trace: they key its call context)."""

    def __init__(self, executor: RegionExecutor, trace: TraceCtx):
        self.executor = executor
        taken = [int(m.group(1)) for b in trace.bound_symbols if b.sym.is_fusion for m in [re.search(r"(\d+)$", b.sym.name)] if m]
        self.next = max(taken, default=-1) + 1

    def new_region(self, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]) -> BoundSymbol:
        name = f"nvFusion{self.next}"
        self.next += 1
        return make_region(self.executor, name, bsyms, inputs, outputs)

    def rebuild(self, original: BoundSymbol, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]) -> BoundSymbol:
        return make_region(_owner(original, self.executor), original.sym.name, bsyms, inputs, outputs)


def _owner(region: BoundSymbol, default: RegionExecutor) -> RegionExecutor:
    """The executor that made ``region`` (so a rebuilt region keeps its backend, e.g. nvFuser)."""
    owner = region.sym.executor
    return owner if isinstance(owner, RegionExecutor) else default


def _trace_executor(trace: TraceCtx) -> RegionExecutor | None:
    for bsym in trace.bound_symbols:
        if bsym.sym.is_fusion and isinstance(bsym.sym.executor, RegionExecutor):
            return bsym.sym.executor
    return None


def apply_plan(
    trace: TraceCtx,
    graph: FusionGraph,
    plan: Plan,
    *,
    executor: RegionExecutor | None = None,
) -> RewriteResult:
    """Rewrite ``trace`` (the trace ``graph`` was built from) to follow ``plan``.  Changed regions keep
    the executor (and so the backend) that made them; new regions use ``executor``, by default the one
    that made the trace's regions."""
    if graph.ops is None or graph.op_bsyms is None or graph.unit_bsyms is None:
        raise ValueError("apply_plan needs a FusionGraph built from a trace (FusionGraph.from_trace)")
    executor = executor or _trace_executor(trace) or default_region_executor()
    ops_by_id = graph.ops
    tensors = graph.tensors
    saved = set(plan.saved)
    recomputed = set(plan.recomputed_values)

    # ---- forward: keep what the forward, the return and the plan's saved set need (reverse sweep)
    needed: set[str] = set(saved) | set(graph.forward_outputs)
    for unit in graph.units:
        if unit.kind == "return":
            needed.update(unit.inputs)
        elif unit.phase == BACKWARD:
            # values the backward still reads from the forward: saved ones, and anything the plan did not
            # cover (non-network values such as parameters are harmless here)
            needed.update(name for name in unit.inputs if name not in recomputed)
    forward_keep: dict[int, tuple[list[BoundSymbol], list[str]] | None] = {}
    for unit in reversed(graph.units):
        if unit.phase != FORWARD or unit.kind == "return":
            continue
        bsym = graph.unit_bsyms[unit.index]
        if unit.kind != "region":
            kind = ops_by_id[unit.nodes[0]].kind if unit.nodes else ""
            if unit.kind in ("input",) or _keeps_side_effects(bsym, kind) or any(o in needed for o in unit.outputs):
                forward_keep[unit.index] = None  # keep as is
                needed.update(p.name for p in bsym.flat_proxy_args)
            else:
                forward_keep[unit.index] = ([], [])  # dropped
            continue
        needed_after = set(needed)
        kept: list[BoundSymbol] = []
        for sub in reversed(bsym.subsymbols):
            outs = [p.name for p in sub.flat_proxy_outs]
            if _keeps_side_effects(sub, op_kind(sub)) or any(o in needed for o in outs):
                kept.append(sub)
                needed.update(p.name for p in sub.flat_proxy_args)
        kept.reverse()
        produced = {p.name for sub in kept for p in sub.flat_proxy_outs}
        forward_keep[unit.index] = (kept, [n for n in produced if n in needed_after])

    # ---- backward: which recomputed values each unit reads
    def closure(values: Sequence[str]) -> list[int]:
        """Forward op nodes recomputing ``values`` from saved values, parameters and inputs."""
        ops: set[int] = set()
        stack = list(values)
        seen = set(stack)
        while stack:
            name = stack.pop()
            info = tensors.get(name)
            if info is None or info.producer_node is None:
                raise AssertionError(f"no producer for recomputed value {name}")
            node = info.producer_node
            if node in ops:
                continue
            ops.add(node)
            for read in ops_by_id[node].inputs:
                read_info = tensors.get(read)
                if read_info is None or read_info.kind != "activation" or read in saved or read in seen:
                    continue
                if graph.units[read_info.producer_unit].phase != FORWARD:
                    continue
                seen.add(read)
                stack.append(read)
        return sorted(ops)

    new_trace = from_trace(trace)
    names = _RegionNames(executor, trace)
    new_bsyms: list[BoundSymbol] = []
    extra_flops = 0
    recompute_regions = 0
    placements: dict[str, tuple[int, ...]] = {}
    unit_of_bsym = {id(b): i for i, b in enumerate(graph.unit_bsyms)}

    for bsym in trace.bound_symbols:
        index = unit_of_bsym.get(id(bsym))
        if index is None:  # comments, deletes: keep
            new_bsyms.append(bsym)
            continue
        unit = graph.units[index]
        if unit.phase == FORWARD and unit.kind != "return":
            keep = forward_keep.get(index)
            if unit.kind != "region":
                if keep is None:
                    new_bsyms.append(bsym)
                continue
            kept, outputs = keep
            if not kept or not outputs:
                continue
            out_proxies = _proxies_by_name(kept, outputs, order_from=bsym)
            if len(kept) == len(bsym.subsymbols) and [p.name for p in out_proxies] == [p.name for p in bsym.flat_proxy_outs]:
                new_bsyms.append(bsym)  # unchanged
                continue
            inputs, _ = region_io(kept, outputs)
            new_bsyms.append(names.rebuild(bsym, kept, inputs, out_proxies))
            continue

        reads = [name for name in unit.inputs if name in recomputed]
        if not reads:
            new_bsyms.append(bsym)
            continue

        ops = closure(reads)
        recompute_bsyms = [graph.op_bsyms[n] for n in ops]
        extra_flops += sum(ops_by_id[n].flops for n in ops)
        if unit.kind == "region":
            subsymbols = recompute_bsyms + list(bsym.subsymbols)
            outputs = list(bsym.output)
            inputs, _ = region_io(subsymbols, [p.name for p in outputs])
            new_bsyms.append(names.rebuild(bsym, subsymbols, inputs, outputs))
            placements[bsym.sym.name] = tuple(ops)
            continue

        # A stand-alone backward op: recompute in a new region right before it.  The region hands each
        # value out under a fresh name (a no-op shallow copy), since a region writing a forward name would
        # be taken for a forward unit by Thunder's split.
        swap: dict = {}
        copies: list[BoundSymbol] = []
        with tracectx(new_trace):
            for name in reads:
                original = _find_proxy(recompute_bsyms, name)
                fresh = TensorProxy(like=original)
                copies.append(prims.shallow_copy.bind(original, output=fresh))
                swap[variableify(original)] = fresh
        region_bsyms = recompute_bsyms + copies
        fresh_outputs = [c.output for c in copies]
        inputs, _ = region_io(region_bsyms, [p.name for p in fresh_outputs])
        region = names.new_region(region_bsyms, inputs, fresh_outputs)
        new_bsyms.append(region)
        placements[region.sym.name] = tuple(ops)
        recompute_regions += 1
        new_bsyms.append(bsym.from_bsym_swap_proxies(swap, skip_output=True))

    new_bsyms, hoisted = hoist_view_outputs(new_bsyms, executor)
    new_trace.bound_symbols = new_bsyms
    new_trace.set_provenance(
        TraceProvenance(
            f"remat.optimize: saved {len(plan.saved)} values ({plan.saved_bytes / 2**20:.1f} MiB), "
            f"recomputed {len(plan.recomputed_ops)} ops"
        )
    )
    notes = [f"{hoisted} region outputs that were views of other outputs now alias them"] if hoisted else []
    return RewriteResult(new_trace, extra_flops, recompute_regions, notes, placements)


# Shape prims that PyTorch always runs as views, and reshape, a view of a contiguous tensor.
_ALWAYS_VIEW = frozenset({"squeeze", "transpose", "slice", "broadcast_in_dim"})


def hoist_view_outputs(bsyms: Sequence[BoundSymbol], executor: RegionExecutor) -> tuple[list[BoundSymbol], int]:
    """Stop regions from writing outputs that are views of their other outputs.

    A region that writes both ``a`` and ``reshape(a)`` allocates both; written outside the region as a
    stand-alone view, ``reshape(a)`` costs no memory.  For every region output made by one shape prim
    from another (kept) output, or by an always-view prim from a region input, the prim moves to right
    after the region.  ``reshape`` is moved only when its input is a region output (fresh, contiguous
    storage), so PyTorch runs it as a view.  Regions keep their names.
    """
    result: list[BoundSymbol] = []
    hoisted_count = 0
    for bsym in bsyms:
        if not bsym.sym.is_fusion or not isinstance(bsym.sym.executor, RegionExecutor):
            result.append(bsym)
            continue
        producer = {}
        for sub in bsym.subsymbols:
            for p in sub.flat_proxy_outs:
                producer.setdefault(p.name, sub)
        outputs = [p for p in bsym.flat_proxy_outs]
        output_names = {p.name for p in outputs}
        input_names = {p.name for p in bsym.flat_proxy_args}
        hoisted: list[BoundSymbol] = []
        hoisted_names: set[str] = set()
        for p in outputs:
            sub = producer.get(p.name)
            if sub is None or len(sub.flat_proxy_outs) != 1:
                continue
            kind = op_kind(sub)
            tensor_args = [a for a in sub.flat_proxy_args if isinstance(a, TensorProxy)]
            if kind not in _ALWAYS_VIEW and kind != "reshape" or len(tensor_args) != 1:
                continue
            base = tensor_args[0].name
            base_is_output = base in output_names and base not in hoisted_names
            if not (base_is_output or (kind in _ALWAYS_VIEW and base in input_names)):
                continue
            hoisted.append(sub)
            hoisted_names.add(p.name)
        if not hoisted or len(hoisted_names) == len(outputs):
            result.append(bsym)
            continue
        kept_outputs = [p for p in outputs if p.name not in hoisted_names]
        name = bsym.sym.name
        result.append(make_region(_owner(bsym, executor), name, bsym.subsymbols, list(bsym.args), kept_outputs))
        result.extend(hoisted)
        hoisted_count += len(hoisted)
    return result, hoisted_count


def _find_proxy(bsyms: Sequence[BoundSymbol], name: str) -> Proxy:
    for bsym in bsyms:
        for p in bsym.flat_proxy_outs:
            if p.name == name:
                return p
    raise KeyError(name)


def _proxies_by_name(bsyms: Sequence[BoundSymbol], names: Sequence[str], *, order_from: BoundSymbol) -> list[Proxy]:
    """Proxies written by ``bsyms`` named in ``names``: the region's old outputs first, in their order,
    then new ones in definition order."""
    wanted = set(names)
    found: dict[str, Proxy] = {}
    for bsym in bsyms:
        for p in bsym.flat_proxy_outs:
            if p.name in wanted and p.name not in found:
                found[p.name] = p
    ordered = [p for p in order_from.flat_proxy_outs if p.name in found]
    seen = {p.name for p in ordered}
    ordered += [p for name, p in found.items() if name not in seen]
    return ordered
