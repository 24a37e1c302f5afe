"""Pictures of a plan: the cut, the memory timeline, and Graphviz source.

* :func:`draw` -- a matplotlib figure of the region graph of the optimized trace: the forward units in
  the left panel (running top to bottom), the backward units in the right panel (running bottom to top,
  so that a layer's backward sits level with its forward), and between them the tensors kept for the
  backward -- the cut -- as edges labelled with their names and sizes.  Backward units that recompute
  forward ops are drawn in orange with the number of ops they recompute; forward units whose ops are
  recomputed later carry an orange ``↻`` mark.
* :func:`memory_timeline` -- live activation bytes along the trace (the memory model's timeline), before
  and after, each peak marked.
* :func:`to_dot` -- the same graph as Graphviz DOT source (no Graphviz needed to produce it).

Figures are plain :class:`matplotlib.figure.Figure` objects made without ``pyplot``: nothing is shown
and no GUI backend is needed; save them with ``fig.savefig(path)``.  In Jupyter they display inline.

How large traces stay legible (``collapse=``):

``"none"``
    every unit of the trace (fusion region or stand-alone op) is a row.
``"compact"``
    stand-alone *view* ops (reshape, transpose, ...: they alias their input and cost nothing) are
    folded away, their edges drawn from the tensor's base; a new recompute region that remat placed
    right before a backward op is shown on that op's row; consecutive identical stand-alone ops (the
    two matmuls of a linear's backward) share one row.
``"layer"``
    one row per layer on each side.  LitGPT-style traces do not record layers, so membership is
    inferred from parameter names: a unit belongs to the layer whose parameters it reads (names such
    as ``t_transformer_h_3_attn_qkv_weight``: ``h_3``, ``layers_3``, ``blocks_3``, ...; a unit reading
    several layers' parameters belongs to the last of them); a unit reading no parameter belongs to the
    layer of the unit before it in execution order (a new recompute region: of the unit after it, the
    one it feeds).  Parameters without a layer number that are first read before the first layer form
    an "embedding" group, the others a "head" group.  With no layer numbers at all everything is one
    group.
``"auto"`` (default)
    ``"compact"`` when that fits in ``max_rows`` rows, else ``"layer"``.

The same layer groups are the horizontal bands of ``"compact"`` and ``"none"`` pictures.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from remat.errors import require_extra
from remat.core.ir import BACKWARD, FORWARD, FusionGraph, Unit, describe_values, module_text
from remat.core.memory import MemoryProfile, format_bytes
from remat.core.ops import INPUT_KINDS
from remat.pipeline import Result

if TYPE_CHECKING:  # matplotlib is imported lazily: `import remat` stays light
    from matplotlib.figure import Figure

__all__ = [
    "draw", "memory_timeline", "pareto_curve", "to_dot", "cut_rows", "layer_of_units", "format_bytes",
    "CutLayout", "CutRow", "CutEdge", "LayerGroups",
]

COLLAPSE_MODES = ("auto", "none", "compact", "layer")

# Colours (colour-blind safe pairs: blue/orange, grey/crimson).
_REGION_FILL = "#dbe8f6"
_REGION_EDGE = "#4a7ab5"
_OP_FILL = "#ececec"
_OP_EDGE = "#7a7a7a"
_RECOMPUTE_FILL = "#fde3c8"
_RECOMPUTE_EDGE = "#e07b00"
_SAVED = "#c0262d"
_FLOW = "#8c8c8c"
_BAND = "#f4f4f4"


# ---------------------------------------------------------------------------------------------- helpers
def _check_result(res: object, fn: str) -> Result:
    if not isinstance(res, Result):
        hint = ""
        if type(res).__name__ == "TraceCtx":
            hint = " Call remat.optimize(trace) first and pass its Result."
        raise TypeError(f"remat.viz.{fn} expects a remat.Result (from remat.optimize), got {type(res).__name__}.{hint}")
    return res


def _short_op_name(name: str) -> str:
    for prefix in ("torch.ops.aten.", "torch.nn.functional.", "torch.", "remat_"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _is_view_unit(unit: Unit) -> bool:
    return unit.kind == "op" and "view" in unit.tags and not ({"matmul", "attention"} & unit.tags)


def _drawn_units(graph: FusionGraph) -> list[Unit]:
    return [u for u in graph.units if u.kind in ("region", "op", "other")]


# ---------------------------------------------------------------------------------------------- layers
_LAYER_PATTERN = re.compile(r"(?:^|_)(?:h|layers?|blocks?|block_list)_(\d+)(?:_|$)")
PRE_GROUP = -1


@dataclass(frozen=True)
class LayerGroups:
    """Layer membership of units: ``rank[unit_index]`` (``-1`` embedding, ``0..L-1`` layers, ``L`` head)
    and a label per rank."""

    rank: dict[int, int]
    labels: dict[int, str]


def layer_of_units(graph: FusionGraph, new_regions: Sequence[int] = ()) -> LayerGroups:
    """Infer which layer each drawn unit of ``graph`` belongs to, from the parameter names it reads (see
    the module docstring for the rule).  ``new_regions``: unit indices that take the layer of the unit
    after them (remat's new recompute regions)."""
    params = {n for n, t in graph.tensors.items() if t.kind in ("param", "input") and t.shape}
    layer_of_param: dict[str, int] = {}
    for name in params:
        match = _LAYER_PATTERN.search(name)
        if match:
            layer_of_param[name] = int(match.group(1))
    order = [graph.units[i] for i in graph.execution_order() if graph.units[i].kind in ("region", "op", "other")]
    if not layer_of_param:
        return LayerGroups({u.index: 0 for u in order}, {0: "all units"})
    layers = sorted(set(layer_of_param.values()))
    dense = {layer: k for k, layer in enumerate(layers)}
    head_rank = len(layers)
    # Unnumbered parameters and inputs: embedding if first read before any layer parameter, else head.
    # Only those read by exactly one forward unit that reads no layer parameter say anything (a rotary
    # cos/sin table is shared by all layers; an embedding fused with layer 0's norm belongs to layer 0).
    forward_readers: Counter = Counter()
    impure: set[str] = set()
    for unit in order:
        if unit.phase == FORWARD:
            unnumbered = {n for n in unit.inputs if n in params and n not in layer_of_param}
            forward_readers.update(unnumbered)
            if any(n in layer_of_param for n in unit.inputs):
                impure |= unnumbered
    seen_layer = False
    unnumbered_rank: dict[str, int] = {}
    pre_names: list[str] = []
    post_names: list[str] = []
    for unit in order:
        if unit.phase != FORWARD:
            continue
        reads = [n for n in unit.inputs if n in params]
        for n in reads:
            if n not in layer_of_param and n not in unnumbered_rank and forward_readers[n] == 1 and n not in impure:
                unnumbered_rank[n] = head_rank if seen_layer else PRE_GROUP
                (post_names if seen_layer else pre_names).append(n)
        if any(n in layer_of_param for n in reads):
            seen_layer = True
    rank: dict[int, int | None] = {}
    strong: set[int] = set()
    for unit in order:
        ranks = [dense[layer_of_param[n]] for n in unit.inputs if n in layer_of_param]
        if ranks:
            strong.add(unit.index)
        ranks += [unnumbered_rank[n] for n in unit.inputs if n in unnumbered_rank]
        rank[unit.index] = max(ranks) if ranks else None
    new = set(new_regions)
    for phase in (FORWARD, BACKWARD):
        seq = [u.index for u in order if u.phase == phase and u.index not in new]
        # Evidence from unnumbered parameters alone must respect the order of the phase (forward:
        # layers ascending, backward: descending); where it does not (a table shared by all layers,
        # read again in each layer's backward), the unit inherits instead.
        later_low: int | None = None  # lowest / highest layer read by a later unit
        later_high: int | None = None
        for index in reversed(seq):
            value = rank[index]
            if index in strong:
                later_low = value if later_low is None else min(later_low, value)
                later_high = value if later_high is None else max(later_high, value)
            elif value is not None and later_low is not None:
                if (phase == FORWARD and value > later_low) or (phase != FORWARD and value < later_high):
                    rank[index] = None
        previous = None
        for index in seq:
            if rank[index] is None:
                rank[index] = previous
            previous = rank[index]
        following = None
        for index in reversed(seq):  # leading units with no parameter read: the next one's rank
            if rank[index] is None:
                rank[index] = following
            following = rank[index]
        # New recompute regions read forward parameters of whatever they recompute; they belong with
        # the unit they feed (the next one), or else the one before them.
        following = None
        for unit in reversed(order):
            if unit.phase != phase:
                continue
            if unit.index in new:
                rank[unit.index] = following
            else:
                following = rank[unit.index]
        previous = None
        for unit in order:
            if unit.phase != phase:
                continue
            if rank[unit.index] is None:
                rank[unit.index] = previous
            previous = rank[unit.index]
    final = {k: (v if v is not None else 0) for k, v in rank.items()}
    labels = {k: f"layer {layer}" for layer, k in dense.items()}

    def group_label(names: list[str], default: str, keywords: tuple[str, ...], word: str) -> str:
        return word if any(any(k in n for k in keywords) for n in names) else default

    if any(v == PRE_GROUP for v in final.values()):
        labels[PRE_GROUP] = group_label(pre_names, "before layers", ("wte", "embed", "tok"), "embedding")
    if any(v == head_rank for v in final.values()):
        labels[head_rank] = group_label(post_names, "after layers", ("lm_head", "ln_f", "head", "norm"), "head")
    return LayerGroups(final, labels)


# ---------------------------------------------------------------------------------------------- rows
@dataclass
class CutRow:
    """One box of the picture: a unit, several units shown together, or a whole layer on one side.

    ``units``: unit indices of the optimized trace's graph.  ``recomputes``: op node ids (of
    ``res.graph``) recomputed by the recompute regions in this row; ``recompute_regions``: their names.
    ``recomputed_later``: how many of this (forward) row's ops the backward recomputes.
    """

    key: str
    phase: str
    band: int
    title: str
    kind: str  # "region", "op", "layer"
    units: list[int] = field(default_factory=list)
    ops: int = 0
    recomputes: list[int] = field(default_factory=list)
    recompute_regions: list[str] = field(default_factory=list)
    new_recompute_region: bool = False
    recomputed_later: int = 0
    peak: bool = False
    y: float = 0.0


@dataclass
class CutEdge:
    """Data from row ``src`` to row ``dst``: ``tensors`` (base buffer names) and their total ``bytes``.
    ``saved`` edges cross from the forward to the backward (the cut)."""

    src: str
    dst: str
    tensors: list[str]
    bytes: int
    saved: bool


@dataclass
class CutLayout:
    """What :func:`draw` and :func:`to_dot` draw: ``rows`` (with their y positions), ``edges``, layer
    ``bands`` (rank -> label) and their y extents, the ``collapse`` mode used, the optimized trace's
    ``graph`` (row unit indices refer to it), and the saved tensors and bytes of ``res.after``."""

    rows: list[CutRow]
    edges: list[CutEdge]
    bands: dict[int, str]
    band_spans: dict[int, tuple[float, float]]
    collapse: str
    graph: FusionGraph
    saved_tensors: tuple[str, ...]
    saved_bytes: int

    def row(self, key: str) -> CutRow:
        return self._by_key[key]

    def __post_init__(self) -> None:
        self._by_key = {r.key: r for r in self.rows}


def _region_names(graph: FusionGraph) -> set[str]:
    return {u.name for u in graph.units if u.kind == "region"}


def cut_rows(res: Result, collapse: str = "auto", max_rows: int = 60) -> CutLayout:
    """The rows and edges :func:`draw` and :func:`to_dot` draw (see the module docstring for
    ``collapse``).  Rows carry their y position: forward rows top to bottom, backward rows bottom to top
    within each layer band."""
    res = _check_result(res, "cut_rows")
    if collapse not in COLLAPSE_MODES:
        raise ValueError(f"collapse must be one of {COLLAPSE_MODES}, got {collapse!r}")
    if not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive int, got {max_rows!r}")
    graph = res.after_graph
    original_regions = _region_names(res.graph)
    placements = res.placements if res.applied else {}
    new_region_units = [
        u.index for u in graph.units if u.kind == "region" and u.name in placements and u.name not in original_regions
    ]
    groups = layer_of_units(graph, new_region_units)
    if collapse == "auto":
        layout = _build_layout(res, graph, groups, "compact", placements, set(new_region_units))
        if _height_rows(layout) > max_rows:
            layout = _build_layout(res, graph, groups, "layer", placements, set(new_region_units))
        return layout
    return _build_layout(res, graph, groups, collapse, placements, set(new_region_units))


def _height_rows(layout: CutLayout) -> float:
    return max((r.y for r in layout.rows), default=0) + 1


def _recomputed_by_original_unit(res: Result) -> Counter:
    counts: Counter = Counter()
    if not res.applied or res.plan is None or res.graph.ops is None:
        return counts
    for op_id in res.plan.recomputed_ops:
        if isinstance(op_id, int) and 0 <= op_id < len(res.graph.ops):
            counts[res.graph.ops[op_id].unit] += 1
    return counts


def _build_layout(
    res: Result,
    graph: FusionGraph,
    groups: LayerGroups,
    collapse: str,
    placements: Mapping[str, tuple[int, ...]],
    new_units: set[int],
) -> CutLayout:
    order = [graph.units[i] for i in graph.execution_order()]
    drawn = [u for u in order if u.kind in ("region", "op", "other")]

    # Map original forward units to their counterparts in the optimized graph (regions keep their names;
    # stand-alone ops are matched by an output name) to mark what the backward recomputes.
    recomputed_counts = _recomputed_by_original_unit(res)
    later_by_unit: Counter = Counter()
    if recomputed_counts:
        by_name = {u.name: u.index for u in graph.units if u.kind == "region"}
        by_output = {}
        for u in graph.units:
            for o in u.outputs:
                by_output.setdefault(o, u.index)
        for orig_index, count in recomputed_counts.items():
            orig = res.graph.units[orig_index]
            target = by_name.get(orig.name) if orig.kind == "region" else None
            if target is None:
                target = next((by_output[o] for o in orig.outputs if o in by_output), None)
            if target is not None:
                later_by_unit[target] += count

    rows: list[CutRow] = []
    row_of_unit: dict[int, str] = {}

    def new_row(unit: Unit, key: str, title: str, kind: str) -> CutRow:
        row = CutRow(key=key, phase=unit.phase, band=groups.rank.get(unit.index, 0), title=title, kind=kind)
        rows.append(row)
        return row

    def add_unit(row: CutRow, unit: Unit) -> None:
        row.units.append(unit.index)
        row_of_unit[unit.index] = row.key
        row.ops += len(unit.nodes) if unit.kind == "region" else 1
        if unit.name in placements and unit.kind == "region":
            row.recomputes.extend(placements[unit.name])
            row.recompute_regions.append(unit.name)
            if unit.index in new_units:
                row.new_recompute_region = True
        row.recomputed_later += later_by_unit.get(unit.index, 0)

    if collapse == "layer":
        for unit in drawn:
            if _is_view_unit(unit):
                continue
            band = groups.rank.get(unit.index, 0)
            key = f"{unit.phase[0].upper()}:{groups.labels.get(band, band)}"
            row = next((r for r in rows if r.key == key), None)
            if row is None:
                row = new_row(unit, key, groups.labels.get(band, str(band)), "layer")
                row.band = band
            add_unit(row, unit)
        # Views are attributed to the row of their group too (for edges and the peak).
        for unit in drawn:
            if unit.index not in row_of_unit:
                band = groups.rank.get(unit.index, 0)
                key = f"{unit.phase[0].upper()}:{groups.labels.get(band, band)}"
                if key in {r.key for r in rows}:
                    row_of_unit[unit.index] = key
    else:
        pending_recompute: list[Unit] = []
        previous: CutRow | None = None
        for unit in drawn:
            if collapse == "compact" and _is_view_unit(unit):
                continue
            if collapse == "compact" and unit.index in new_units:
                pending_recompute.append(unit)
                continue
            if unit.kind == "region":
                row = new_row(unit, f"{unit.phase[0].upper()}:{unit.name}", unit.name, "region")
            else:
                title = _short_op_name(unit.name)
                mergeable = (
                    collapse == "compact"
                    and previous is not None
                    and previous.kind == "op"
                    and previous.phase == unit.phase
                    and previous.band == groups.rank.get(unit.index, 0)
                    and graph.units[previous.units[-1]].name == unit.name
                )
                if mergeable:
                    row = previous
                else:
                    row = new_row(unit, f"{unit.phase[0].upper()}:{unit.name}#{unit.index}", title, "op")
            for pending in pending_recompute:
                add_unit(row, pending)
            pending_recompute = []
            add_unit(row, unit)
            previous = row
        for pending in pending_recompute:  # a recompute region with nothing after it (not expected)
            row = new_row(pending, f"{pending.phase[0].upper()}:{pending.name}", pending.name, "region")
            add_unit(row, pending)
        for row in rows:
            same = Counter(graph.units[i].name for i in row.units if i not in new_units)
            if row.kind == "op" and same:
                name, count = same.most_common(1)[0]
                row.title = _short_op_name(name) + (f" ×{count}" if count > 1 else "")
        # Folded view units: their outputs alias a base, edges go through the base.  For the peak
        # marker, a view unit belongs to the row drawn just before it.
        last_key = None
        for unit in drawn:
            if unit.index in row_of_unit:
                last_key = row_of_unit[unit.index]
            elif last_key is not None:
                row_of_unit.setdefault(unit.index, last_key)

    # ---- positions: bands in rank order; forward top-down, backward bottom-up within a band.
    bands = sorted({r.band for r in rows})
    y = 0.0
    band_spans: dict[int, tuple[float, float]] = {}
    for band in bands:
        fwd = [r for r in rows if r.band == band and r.phase == FORWARD]
        bwd = [r for r in rows if r.band == band and r.phase == BACKWARD]
        height = max(len(fwd), len(bwd), 1)
        for i, r in enumerate(fwd):
            r.y = y + i
        for i, r in enumerate(bwd):
            r.y = y + height - 1 - i
        band_spans[band] = (y - 0.5, y + height - 0.5)
        y += height + 0.6

    # ---- edges, through alias bases where the producing unit is not drawn
    tensors = graph.tensors
    saved_set = set(res.after.saved_tensors)
    keyed = {r.key: r for r in rows}
    agg: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for unit in drawn:
        dst = row_of_unit.get(unit.index)
        if dst is None or unit.index not in {i for i in keyed[dst].units}:
            # inputs of folded views are carried by the view's consumers
            continue
        for name in unit.inputs:
            info = tensors.get(name)
            if info is None or info.kind not in ("activation",):
                continue
            base = info.alias_of or name
            base_info = tensors.get(base)
            if base_info is None or base_info.kind != "activation":
                continue
            producer = info.producer_unit
            src = row_of_unit.get(producer) if producer is not None else None
            if src is None or producer not in keyed[src].units:
                producer = base_info.producer_unit
                src = row_of_unit.get(producer) if producer is not None else None
            if src is None or src == dst:
                continue
            agg[(src, dst)][base] = base_info.bytes
    edges = []
    for (src, dst), named in agg.items():
        saved = keyed[src].phase == FORWARD and keyed[dst].phase == BACKWARD
        names = sorted(named, key=lambda n: -named[n])
        if saved:
            names = [n for n in names if n in saved_set] or names
        edges.append(CutEdge(src, dst, names, sum(named[n] for n in names), saved))

    # ---- the peak
    peak_step = res.after.peak_step
    if 0 <= peak_step < len(res.after.timeline):
        peak_unit = res.after.timeline[peak_step].unit
        key = row_of_unit.get(peak_unit)
        if key is not None:
            keyed[key].peak = True
    return CutLayout(
        rows=rows,
        edges=edges,
        bands={b: groups.labels.get(b, str(b)) for b in bands},
        band_spans=band_spans,
        collapse=collapse,
        graph=graph,
        saved_tensors=tuple(res.after.saved_tensors),
        saved_bytes=res.after.saved_bytes,
    )


# ---------------------------------------------------------------------------------------------- draw
def _row_detail(row: CutRow) -> str:
    if row.kind == "layer":
        return f"{len(row.units)} units, {row.ops} ops"
    if row.kind == "region":
        return f"{row.ops} ops"
    return ""


def _recompute_text(row: CutRow) -> str:
    if not row.recomputes:
        return ""
    n = len(row.recomputes)
    if row.new_recompute_region and row.kind == "region":
        return f"↻ {n} ops (new region)"
    if row.new_recompute_region and row.kind == "op":
        names = row.recompute_regions
        return f"↻ {n} ops in {names[0]}" + (f" +{len(names) - 1}" if len(names) > 1 else "")
    return f"↻ {n} ops"


def _summary_lines(res: Result, layout: CutLayout) -> list[str]:
    before, after = res.before, res.after
    lines = [
        f"saved for the backward: {format_bytes(before.saved_bytes)} in {len(before.saved_tensors)} tensors "
        f"→ {format_bytes(after.saved_bytes)} in {len(after.saved_tensors)}    "
        f"est. peak: {format_bytes(before.peak_bytes)} → {format_bytes(after.peak_bytes)}"
    ]
    if res.applied:
        pct = 100 * res.extra_flops / max(res.step_flops, 1)
        lines.append(
            f"{len(res.plan.recomputed_ops)} forward ops recomputed in the backward (+{pct:.2f}% FLOPs); "
            f"memory figures are the analytic model's (docs/memory-model.md)"
        )
    else:
        reason = res.notes[0] if res.notes else "no plan"
        lines.append(f"no plan applied ({reason}): the picture shows the trace as it was")
    return lines


def draw(
    res: Result,
    *,
    collapse: str = "auto",
    max_rows: int = 60,
    title: str | None = None,
    label_names: int = 2,
) -> Figure:
    """A matplotlib :class:`~matplotlib.figure.Figure` of the cut ``res`` made (see the module docstring).

    Three panels share the vertical axis: ``fig.axes[0]`` the forward (title starts with "forward"),
    ``fig.axes[1]`` the saved tensors crossing from forward to backward (title starts with "saved"),
    ``fig.axes[2]`` the backward (title starts with "backward").  Each saved edge is labelled at its
    forward end with the ``label_names`` largest tensors it carries and the total size.  Works on a
    Result whose plan is None (the trace as it was, with a note).  Raises TypeError for anything but a
    :class:`remat.Result` and ValueError for an unknown ``collapse``.
    """
    res = _check_result(res, "draw")
    if not isinstance(label_names, int) or label_names < 0:
        raise ValueError(f"label_names must be a non-negative int, got {label_names!r}")
    layout = cut_rows(res, collapse, max_rows)
    require_extra("matplotlib", "remat.viz pictures")
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, Patch
    from matplotlib.lines import Line2D

    rows = layout.rows
    n_rows = _height_rows(layout)
    row_inch = 0.3
    head_inch, foot_inch = 1.15, 0.75
    height = max(n_rows * row_inch + head_inch + foot_inch, 4.0)
    width = 12.5
    fig = Figure(figsize=(width, height), dpi=110)
    grid = fig.add_gridspec(
        1, 3, width_ratios=[1.42, 1.0, 1.42], wspace=0.0,
        left=0.075, right=0.925, top=1 - head_inch / height, bottom=foot_inch / height,
    )
    ax_f = fig.add_subplot(grid[0, 0])
    ax_c = fig.add_subplot(grid[0, 1], sharey=ax_f)
    ax_b = fig.add_subplot(grid[0, 2], sharey=ax_f)
    ymin, ymax = -0.8, n_rows - 0.2
    for ax in (ax_f, ax_c, ax_b):
        ax.set_ylim(ymax, ymin)  # rows run downwards
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.tick_params(length=0)
        ax.set_xticks([])
    ax_f.set_xlim(-0.42, 1.0)
    ax_c.set_xlim(0.0, 1.0)
    ax_b.set_xlim(0.0, 1.42)

    # Bands (layers): shaded stripes, labels on the outer y axes.
    centers, labels = [], []
    for k, (band, (lo, hi)) in enumerate(sorted(layout.band_spans.items())):
        if k % 2 == 0:
            for ax in (ax_f, ax_c, ax_b):
                ax.axhspan(lo - 0.2, hi + 0.2, color=_BAND, zorder=0, lw=0)
        centers.append((lo + hi) / 2)
        labels.append(layout.bands[band])
    ax_f.set_yticks(centers, labels, fontsize=8)
    ax_b.yaxis.tick_right()
    ax_b.set_yticks(centers, labels, fontsize=8)
    ax_c.tick_params(labelleft=False)

    by_key = {r.key: r for r in rows}
    max_flow = max((e.bytes for e in layout.edges if not e.saved), default=1) or 1
    max_saved = max((e.bytes for e in layout.edges if e.saved), default=1) or 1

    from matplotlib.path import Path
    from matplotlib.patches import PathPatch

    def arc(ax, x0, y0, y1, side):
        bulge = side * min(0.38, 0.06 + 0.035 * abs(y1 - y0))
        verts = [(x0, y0), (x0 + bulge, y0), (x0 + bulge, y1), (x0, y1)]
        return Path(verts, [Path.MOVETO, Path.CURVE4, Path.CURVE4, Path.CURVE4])

    # Flow inside each phase: arcs on the outer side.
    for edge in layout.edges:
        if edge.saved:
            continue
        src, dst = by_key[edge.src], by_key[edge.dst]
        if src.phase != dst.phase:
            continue
        ax, x0, side = (ax_f, 0.0, -1) if src.phase == FORWARD else (ax_b, 1.0, 1)
        lw = 0.4 + 2.2 * (edge.bytes / max_flow) ** 0.5
        ax.add_patch(PathPatch(arc(ax, x0, src.y, dst.y, side), fill=False, ec=_FLOW, lw=lw, alpha=0.45, zorder=1))

    # Boxes.
    def box(ax, row: CutRow):
        recompute = bool(row.recomputes)
        if recompute:
            face, edge = _RECOMPUTE_FILL, _RECOMPUTE_EDGE
        elif row.kind == "op":
            face, edge = _OP_FILL, _OP_EDGE
        else:
            face, edge = _REGION_FILL, _REGION_EDGE
        ax.add_patch(
            FancyBboxPatch(
                (0.02, row.y - 0.36), 0.96, 0.72, boxstyle="round,pad=0,rounding_size=0.12",
                fc=face, ec=edge, lw=1.3 if recompute else 0.8, zorder=3, mutation_aspect=1 / 3,
            )
        )
        detail = _row_detail(row)
        text = detail if row.kind == "layer" else row.title + (f"  · {detail}" if detail else "")
        ax.text(0.05, row.y, text, va="center", ha="left",
                fontsize=7.5, zorder=4, clip_on=True)
        right = _recompute_text(row)
        if right:
            ax.text(0.955, row.y, right, va="center", ha="right", fontsize=7.5, color="#a85200",
                    fontweight="bold", zorder=4)
        elif row.recomputed_later:
            ax.text(0.955, row.y, f"↻ {row.recomputed_later} later", va="center", ha="right", fontsize=7,
                    color="#a85200", zorder=4)
        if row.peak:
            x, ha = (-0.02, "right") if ax is ax_f else (1.02, "left")
            ax.text(x, row.y, "◀ peak" if ax is ax_b else "peak ▶", va="center", ha=ha, fontsize=7.5,
                    color=_SAVED, fontweight="bold", zorder=5,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))

    for row in rows:
        box(ax_f if row.phase == FORWARD else ax_b, row)

    # The cut: saved edges as S-curves, one label per forward row at its start.
    saved_by_src: dict[str, list[CutEdge]] = defaultdict(list)
    for edge in layout.edges:
        if edge.saved:
            saved_by_src[edge.src].append(edge)
            src, dst = by_key[edge.src], by_key[edge.dst]
            lw = 0.5 + 3.0 * (edge.bytes / max_saved) ** 0.5
            verts = [(0.0, src.y), (0.45, src.y), (0.55, dst.y), (1.0, dst.y)]
            path = Path(verts, [Path.MOVETO, Path.CURVE4, Path.CURVE4, Path.CURVE4])
            ax_c.add_patch(PathPatch(path, fill=False, ec=_SAVED, lw=lw, alpha=0.55, zorder=2))
    for key, edges in saved_by_src.items():
        src = by_key[key]
        sizes: dict[str, int] = {}
        for e in edges:
            for name in e.tensors:
                sizes[name] = layout.graph.tensors[name].bytes
        names = sorted(sizes, key=lambda n: -sizes[n])
        total = sum(sizes.values())
        if label_names == 0 or len(names) == 0:
            text = format_bytes(total)
        elif len(names) <= label_names:
            text = ", ".join(f"{n} {format_bytes(sizes[n])}" for n in names)
        else:
            shown = ", ".join(names[:label_names])
            text = f"{shown} +{len(names) - label_names}: {format_bytes(total)}"
        ax_c.text(0.015, src.y, text, va="center", ha="left", fontsize=7, color="#7a1016", zorder=4,
                  bbox=dict(boxstyle="round,pad=0.12", fc="white", ec="none", alpha=0.9))

    n_saved = len(layout.saved_tensors)
    ax_f.set_title("forward  (runs ↓)", fontsize=10, loc="center")
    ax_c.set_title(f"saved for the backward: {n_saved} tensors, {format_bytes(layout.saved_bytes)}",
                   fontsize=10, color=_SAVED)
    ax_b.set_title("backward  (runs ↑)", fontsize=10, loc="center")

    header = title or "remat: what the backward keeps (the cut) and what it recomputes"
    fig.text(0.5, 1 - 0.18 / height, header, ha="center", va="top", fontsize=12, fontweight="bold")
    for i, line in enumerate(_summary_lines(res, layout)):
        fig.text(0.5, 1 - (0.45 + 0.2 * i) / height, line, ha="center", va="top", fontsize=8.5, color="#333333")

    legend = [
        Patch(fc=_REGION_FILL, ec=_REGION_EDGE, label="fusion region"),
        Patch(fc=_OP_FILL, ec=_OP_EDGE, label="stand-alone op (matmul, attention, ...)"),
        Patch(fc=_RECOMPUTE_FILL, ec=_RECOMPUTE_EDGE, label="recomputes forward ops (↻ n ops)"),
        Line2D([], [], color=_SAVED, lw=2, label="saved tensor (name, size)"),
        Line2D([], [], color=_FLOW, lw=2, alpha=0.6, label="data flow within a phase"),
    ]
    mode = {"compact": "view ops folded", "none": "every unit", "layer": "one row per layer"}[layout.collapse]
    fig.legend(handles=legend, loc="lower center", ncol=5, fontsize=7.5, frameon=False,
               bbox_to_anchor=(0.5, 0.22 / height))
    fig.text(0.5, 0.08 / height, f"rows: {mode}; ↻ n later = n of this unit's ops are recomputed in the backward",
             ha="center", va="bottom", fontsize=7, color="#555555")
    fig.remat_layout = layout  # what was drawn, for tests and callers
    return fig


# ---------------------------------------------------------------------------------------------- timeline
def memory_timeline(
    res: Result,
    *,
    others: Mapping[str, MemoryProfile] | None = None,
    title: str | None = None,
) -> Figure:
    """Live activation bytes along the trace, before and after ``res``'s plan, each peak marked.

    The x axis is the position in execution order as a fraction of each trace's units (the optimized
    trace has more units: its recompute regions), so the forward/backward boundary lines up.
    ``fig.axes[0]`` holds one line per profile (labels start with "before" and "after", then the keys of
    ``others``) and one marker per peak (``gid`` "peak:<label>").  Figures are the memory model's
    (analytic).  Raises TypeError for anything but a :class:`remat.Result`.
    """
    res = _check_result(res, "memory_timeline")
    if others is not None and not all(isinstance(p, MemoryProfile) for p in others.values()):
        raise TypeError("others must map labels to remat.MemoryProfile (from remat.estimate_memory)")
    require_extra("matplotlib", "remat.viz pictures")
    from matplotlib.figure import Figure

    profiles: list[tuple[str, MemoryProfile, str, str]] = [
        ("before (nothing recomputed)", res.before, "#7a7a7a", "-"),
        ("after (remat)" if res.applied else f"after ({res.chosen}: remat plan not applied)", res.after, _RECOMPUTE_EDGE, "-"),
    ]
    palette = ["#4a7ab5", "#6a3d9a", "#33a02c", "#b15928"]
    for i, (label, profile) in enumerate((others or {}).items()):
        profiles.append((label, profile, palette[i % len(palette)], "--"))

    values = [p.peak_bytes for _, p, _, _ in profiles if p.timeline]
    top = max(values, default=1) or 1
    scale, unit = 1.0, "B"
    for s, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= s:
            scale, unit = float(s), u
            break

    fig = Figure(figsize=(10, 4.6), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    # Each trace's forward units share [0, split], its backward units [split, 1], so the phases line up
    # although the optimized trace has more units (its recompute regions).
    after_points = [p for p in res.after.timeline if p.name not in INPUT_KINDS]
    forward_count = sum(1 for p in after_points if p.phase == FORWARD)
    split = forward_count / len(after_points) if after_points else 0.5
    boundary = split if 0 < forward_count < len(after_points) else None
    for label, profile, color, style in profiles:
        # Input unpacks allocate nothing: leave them off the axis.
        points = [p for p in profile.timeline if p.name not in INPUT_KINDS]
        if not points:
            continue
        xs = _phase_positions(points, split)
        ys = [p.live_bytes / scale for p in points]
        peak_index = max(range(len(points)), key=lambda i: points[i].live_bytes)
        peak = points[peak_index]
        full = f"{label}: peak {format_bytes(peak.live_bytes)} at {_short_op_name(peak.name)}"
        ax.plot(xs, ys, color=color, ls=style, lw=1.8, label=full, drawstyle="steps-mid")
        ax.plot([xs[peak_index]], [peak.live_bytes / scale], marker="v", ms=9, color=color, mec="black", mew=0.6,
                ls="none", gid=f"peak:{label}", zorder=5)
        ax.axhline(peak.live_bytes / scale, color=color, lw=0.7, ls=":", zorder=1)
    if boundary is not None:
        ax.axvspan(0, boundary, color=_BAND, zorder=0)
        ax.text(boundary / 2, 0.98, "forward", transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=9,
                color="#555555")
        ax.text((1 + boundary) / 2, 0.98, "backward", transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=9, color="#555555")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, top / scale * 1.18)
    ax.set_xlabel("execution order: forward units, then backward units (each trace's own units, evenly spaced)")
    ax.set_ylabel(f"live activation bytes ({unit})")
    ax.set_title(title or "memory along one training step (memory model, parameters not counted)", fontsize=11)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14), fontsize=8.5, frameon=False, ncol=1)
    ax.grid(axis="y", color="#dddddd", lw=0.6)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.22 + 0.05 * max(len(profiles) - 2, 0))
    return fig


def pareto_curve(
    frontier: Sequence,
    *,
    step_flops: int | None = None,
    gradient_bytes: int | None = None,
    budget_bytes: int | None = None,
    chosen: object | None = None,
    title: str | None = None,
) -> Figure:
    """The memory / recomputation trade-off of :func:`remat.pareto`: estimated peak (y) against extra
    FLOPs (x, as % of the step when ``step_flops`` is given), drawn as the staircase a frontier is (a
    plan stays the best until the next one is affordable).  The default plan is labelled; optional dashed
    lines mark ``gradient_bytes`` (the gradients every plan holds at the end of the step, a floor no
    plan goes below) and ``budget_bytes``; ``chosen`` (a point) is circled.  Figures are the memory
    model's (analytic)."""
    require_extra("matplotlib", "remat.viz pictures")
    from matplotlib.figure import Figure

    points = list(frontier)
    if not points:
        raise ValueError("the frontier is empty")
    if not all(hasattr(p, "peak_bytes") and hasattr(p, "extra_flops") for p in points):
        raise TypeError("pareto_curve expects the points of remat.pareto (with peak_bytes and extra_flops)")
    top = max(p.peak_bytes for p in points)
    scale, unit = 1.0, "B"
    for s_, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= s_:
            scale, unit = float(s_), u
            break
    xs = [100.0 * p.extra_flops / step_flops if step_flops else float(p.extra_flops) for p in points]
    ys = [p.peak_bytes / scale for p in points]
    fig = Figure(figsize=(7, 4.2), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    right = max(xs) * 1.15 if max(xs) > 0 else 1.0
    ax.step(xs + [right], ys + [ys[-1]], where="post", color=_RECOMPUTE_EDGE, lw=2, label="best plan for the FLOPs spent")
    ax.plot(xs, ys, "o", color=_RECOMPUTE_EDGE, mec="black", mew=0.6, zorder=5)
    # the default plan is the first point, unless a budget above it put kept plans first (found="kept")
    first = next((i for i, p in enumerate(points) if getattr(p, "found", "default") == "default"), 0)
    ax.annotate(f"default plan\n{format_bytes(points[first].peak_bytes)}", (xs[first], ys[first]), textcoords="offset points",
                xytext=(8, 8), fontsize=8.5)
    if len(points) > 1:
        ax.annotate(format_bytes(points[-1].peak_bytes), (xs[-1], ys[-1]), textcoords="offset points", xytext=(6, -14),
                    fontsize=8.5)
    low = min(ys)
    if gradient_bytes:
        ax.axhline(gradient_bytes / scale, color="#4a7ab5", ls="--", lw=1, label=f"gradients held at the end ({format_bytes(gradient_bytes)})")
        low = min(low, gradient_bytes / scale)
    if budget_bytes:
        ax.axhline(budget_bytes / scale, color=_SAVED, ls=":", lw=1.2, label=f"budget ({format_bytes(budget_bytes)})")
        low = min(low, budget_bytes / scale)
    if chosen is not None and chosen in points:
        i = points.index(chosen)
        ax.plot([xs[i]], [ys[i]], "o", ms=14, mfc="none", mec=_SAVED, mew=1.5, label="chosen plan", zorder=6)
    ax.set_xlim(-right * 0.03, right)
    ax.set_ylim(low * 0.9, max(ys) * 1.12)
    ax.set_xlabel("extra FLOPs recomputed (% of the step)" if step_flops else "extra FLOPs recomputed")
    ax.set_ylabel(f"estimated peak ({unit})")
    ax.set_title(title or "memory / recomputation trade-off (memory model)", fontsize=11)
    ax.grid(color="#dddddd", lw=0.6)
    ax.legend(loc="upper right", fontsize=8.5, frameon=False)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    fig.tight_layout()
    return fig


def _phase_positions(points: Sequence, split: float) -> list[float]:
    forward = [i for i, p in enumerate(points) if p.phase == FORWARD]
    backward = [i for i, p in enumerate(points) if p.phase != FORWARD]
    xs = [0.0] * len(points)
    for k, i in enumerate(forward):
        xs[i] = split * (k + 0.5) / len(forward)
    for k, i in enumerate(backward):
        xs[i] = split + (1 - split) * (k + 0.5) / len(backward)
    return xs


# ---------------------------------------------------------------------------------------------- dot
def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(res: Result, *, collapse: str = "compact", max_rows: int = 60) -> str:
    """Graphviz DOT source of the same graph :func:`draw` shows (``dot -Tsvg`` renders it; producing the
    text needs no Graphviz).  Two clusters, ``cluster_forward`` and ``cluster_backward``; saved edges are
    red and labelled with the largest tensor, the module it comes from (where the trace names modules:
    :meth:`remat.FusionGraph.value_module`) and the total size, with every tensor, its module and size in
    the edge's ``tooltip``; rows that recompute forward ops are orange with ``class="recompute"`` and the number of
    ops in their label.  Raises TypeError for anything but a :class:`remat.Result`."""
    res = _check_result(res, "to_dot")
    layout = cut_rows(res, collapse, max_rows)
    ids = {r.key: f"n{i}" for i, r in enumerate(layout.rows)}
    lines = [
        "digraph remat_cut {",
        "  rankdir=TB; newrank=true; compound=true;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [color="#8c8c8c", arrowsize=0.6];',
        f"  label={_dot_quote(chr(10).join(_summary_lines(res, layout)))}; labelloc=t; fontname=\"Helvetica\";",
    ]
    for phase in (FORWARD, BACKWARD):
        lines.append(f"  subgraph cluster_{phase} {{")
        lines.append(f"    label={_dot_quote(phase)}; style=dashed; color=\"#999999\";")
        for row in layout.rows:
            if row.phase != phase:
                continue
            detail = _row_detail(row)
            label = row.title + (f"\n{detail}" if detail else "")
            attrs = {}
            if row.recomputes:
                label += f"\nrecomputes {len(row.recomputes)} forward ops"
                if row.new_recompute_region:
                    label += f" ({', '.join(row.recompute_regions)})"
                attrs.update(fillcolor=_RECOMPUTE_FILL, color=_RECOMPUTE_EDGE, penwidth="2", **{"class": "recompute"})
            elif row.kind == "op":
                attrs.update(fillcolor=_OP_FILL, color=_OP_EDGE)
            else:
                attrs.update(fillcolor=_REGION_FILL, color=_REGION_EDGE)
            if row.recomputed_later:
                label += f"\n{row.recomputed_later} ops recomputed later"
            if row.peak:
                label += "\n(peak)"
                attrs["peripheries"] = "2"
            attrs["label"] = label
            attrs["tooltip"] = f"{layout.bands.get(row.band, '')}: {row.title}"
            body = ", ".join(f"{k}={_dot_quote(str(v))}" for k, v in attrs.items())
            lines.append(f"    {ids[row.key]} [{body}];")
        lines.append("  }")
    max_saved = max((e.bytes for e in layout.edges if e.saved), default=1) or 1
    for edge in layout.edges:
        a, b = ids[edge.src], ids[edge.dst]
        if edge.saved:
            first = edge.tensors[0] if edge.tensors else ""
            more = f" +{len(edge.tensors) - 1}" if len(edge.tensors) > 1 else ""
            known = [n for n in edge.tensors if n in layout.graph.tensors]
            module = layout.graph.value_module(first) if first in layout.graph.tensors else None
            where = f"\n{module_text(module)}" if module is not None else ""
            label = f"{first}{more}{where}\n{format_bytes(edge.bytes)}"
            width = 1 + 3 * (edge.bytes / max_saved) ** 0.5
            tooltip = "saved: " + ", ".join(describe_values(layout.graph, known) if known else edge.tensors)
            lines.append(
                f"  {a} -> {b} [color={_dot_quote(_SAVED)}, penwidth={width:.2f}, constraint=false, "
                f"label={_dot_quote(label)}, fontcolor={_dot_quote(_SAVED)}, fontsize=8, "
                f"tooltip={_dot_quote(tooltip)}, class=\"saved\"];"
            )
        else:
            lines.append(f"  {a} -> {b} [tooltip={_dot_quote(format_bytes(edge.bytes))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
