"""remat.viz: the cut picture, the memory timeline and the DOT source, checked for structure."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from conftest import PYTHIA_2, traced  # noqa: E402
from matplotlib.patches import FancyBboxPatch, PathPatch  # noqa: E402

import remat  # noqa: E402
from remat import viz  # noqa: E402

SIZE = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)")


@pytest.fixture(scope="module")
def result(pythia_trace):
    """1-layer tiny GPT-NeoX, optimized."""
    return remat.optimize(remat.fuse(pythia_trace))


@pytest.fixture(scope="module")
def two_layer_result():
    """2-layer tiny GPT-NeoX, optimized (for layer bands); the trace is shared with other files (conftest.traced)."""
    return remat.optimize(remat.fuse(traced(**PYTHIA_2)))


@pytest.fixture(scope="module")
def unplanned(result):
    """The same trace as if optimize had fallen back: no plan, after == before."""
    return dataclasses.replace(
        result, trace=result.original, plan=None, after=result.before, placements={}, applied=False,
        extra_flops=0, notes=["solver: pretend failure"],
    )


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def _boxes(ax):
    return [p for p in ax.patches if isinstance(p, FancyBboxPatch)]


# ---------------------------------------------------------------------------------------------- draw
def test_draw_has_forward_cut_and_backward_panels(result):
    fig = viz.draw(result)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 3
    assert titles[0].startswith("forward")
    assert titles[1].startswith("saved for the backward")
    assert titles[2].startswith("backward")
    layout = fig.remat_layout
    forward_rows = [r for r in layout.rows if r.phase == "forward"]
    backward_rows = [r for r in layout.rows if r.phase == "backward"]
    assert len(_boxes(fig.axes[0])) == len(forward_rows) > 0
    assert len(_boxes(fig.axes[2])) == len(backward_rows) > 0
    forward_texts = " | ".join(_texts(fig.axes[0]))
    backward_texts = " | ".join(_texts(fig.axes[2]))
    assert all(r.title in forward_texts for r in forward_rows)
    assert all(r.title in backward_texts for r in backward_rows)


def test_saved_edges_carry_names_and_sizes(result):
    fig = viz.draw(result)
    layout = fig.remat_layout
    saved_edges = [e for e in layout.edges if e.saved]
    assert saved_edges, "a training step keeps something for the backward"
    # one curve per saved edge in the middle panel
    assert len([p for p in fig.axes[1].patches if isinstance(p, PathPatch)]) == len(saved_edges)
    # every saved tensor (memory model) is on some saved edge
    on_edges = {name for e in saved_edges for name in e.tensors}
    assert set(result.after.saved_tensors) <= on_edges
    labels = _texts(fig.axes[1])
    assert labels and all(SIZE.search(text) for text in labels)
    biggest = max(result.after.saved_tensors, key=lambda n: result.graph.tensors[n].bytes)
    assert any(biggest in text for text in labels)
    # label sizes add up to the saved total: each label ends with its row's total (or lists every size)
    assert viz.format_bytes(result.after.saved_bytes) in fig.axes[1].get_title()


def test_recomputing_rows_are_highlighted(result):
    assert result.plan is not None and result.placements, "the tiny model recomputes something"
    fig = viz.draw(result)
    layout = fig.remat_layout
    recompute_rows = [r for r in layout.rows if r.recomputes]
    assert recompute_rows and all(r.phase == "backward" for r in recompute_rows)
    # every placement appears on exactly one row
    placed = sorted(op for ops in result.placements.values() for op in ops)
    assert sorted(op for r in layout.rows for op in r.recomputes) == placed
    orange = [b for b in _boxes(fig.axes[2]) if matplotlib.colors.to_hex(b.get_edgecolor()) == "#e07b00"]
    assert len(orange) == len(recompute_rows)
    marks = [t for t in _texts(fig.axes[2]) if t.startswith("↻")]
    assert len(marks) == len(recompute_rows)
    assert all(re.search(r"↻ \d+ ops", t) for t in marks)
    # forward units whose ops are recomputed are marked too
    assert any(t.startswith("↻") and "later" in t for t in _texts(fig.axes[0]))


def test_peak_is_marked(result):
    fig = viz.draw(result)
    assert sum(r.peak for r in fig.remat_layout.rows) == 1
    assert any("peak" in t for ax in (fig.axes[0], fig.axes[2]) for t in _texts(ax))


def test_collapse_modes(two_layer_result):
    compact = viz.cut_rows(two_layer_result, "compact")
    everything = viz.cut_rows(two_layer_result, "none")
    layers = viz.cut_rows(two_layer_result, "layer")
    assert len(everything.rows) > len(compact.rows) > len(layers.rows)
    # compact folds every stand-alone view op
    graph = compact.graph
    assert not any(viz._is_view_unit(graph.units[i]) for r in compact.rows for i in r.units)
    assert {"layer 0", "layer 1"} <= set(layers.bands.values())
    for phase in ("forward", "backward"):  # one row per layer and phase
        bands = [r.band for r in layers.rows if r.phase == phase]
        assert len(bands) == len(set(bands))
    # the same saved tensors whatever the layout
    for layout in (compact, everything, layers):
        assert {n for e in layout.edges if e.saved for n in e.tensors} >= set(two_layer_result.after.saved_tensors)
    assert viz.cut_rows(two_layer_result, "auto", max_rows=3).collapse == "layer"
    assert viz.cut_rows(two_layer_result, "auto", max_rows=500).collapse == "compact"


def test_layers_follow_parameter_names(two_layer_result):
    graph = viz.cut_rows(two_layer_result, "compact").graph
    groups = viz.layer_of_units(graph)
    labels = groups.labels
    checked = 0
    for unit in graph.units:
        numbers = [int(m.group(1)) for n in unit.inputs for m in [re.search(r"_h_(\d+)_", n)] if m]
        if numbers and unit.index in groups.rank:
            assert labels[groups.rank[unit.index]] == f"layer {max(numbers)}", unit
            checked += 1
    assert checked >= 8  # the linears, norms and their backward matmuls
    # the forward runs through the layers in order
    forward = [groups.rank[i] for i in graph.execution_order() if i in groups.rank and graph.units[i].phase == "forward"]
    assert forward == sorted(forward)
    backward = [groups.rank[i] for i in graph.execution_order() if i in groups.rank and graph.units[i].phase == "backward"]
    assert backward == sorted(backward, reverse=True)


def test_layer_picture_draws(two_layer_result, tmp_path):
    fig = viz.draw(two_layer_result, collapse="layer")
    assert fig.remat_layout.collapse == "layer"
    fig.savefig(tmp_path / "cut.png")
    assert (tmp_path / "cut.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draw_without_plan_notes_it(unplanned, tmp_path):
    fig = viz.draw(unplanned)
    assert any("no plan applied" in t.get_text() and "pretend failure" in t.get_text() for t in fig.texts)
    assert not any(r.recomputes for r in fig.remat_layout.rows)
    fig.savefig(tmp_path / "cut.svg")
    assert b"<svg" in (tmp_path / "cut.svg").read_bytes()[:500]


def test_bad_input(result, pythia_trace):
    for fn in (viz.draw, viz.memory_timeline, viz.to_dot):
        with pytest.raises(TypeError, match="remat.Result"):
            fn(pythia_trace)
        with pytest.raises(TypeError):
            fn(None)
    with pytest.raises(ValueError, match="collapse"):
        viz.draw(result, collapse="by-magic")
    with pytest.raises(ValueError, match="max_rows"):
        viz.draw(result, max_rows=0)
    with pytest.raises(TypeError, match="MemoryProfile"):
        viz.memory_timeline(result, others={"x": 3})


# ---------------------------------------------------------------------------------------------- timeline
def _labelled_lines(ax):
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_timeline_has_before_after_and_peaks(result):
    fig = viz.memory_timeline(result)
    ax = fig.axes[0]
    lines = _labelled_lines(ax)
    assert [line.get_label().split(" ")[0] for line in lines] == ["before", "after"]
    assert viz.format_bytes(result.before.peak_bytes) in lines[0].get_label()
    assert viz.format_bytes(result.after.peak_bytes) in lines[1].get_label()
    peaks = {line.get_gid(): line for line in ax.get_lines() if (line.get_gid() or "").startswith("peak:")}
    assert len(peaks) == 2
    # each peak marker sits at the top of its line
    for line, (gid, marker) in zip(lines, peaks.items()):
        assert marker.get_ydata()[0] == pytest.approx(max(line.get_ydata()))
    assert ax.get_ylabel().startswith("live activation bytes (KiB)")


def test_timeline_with_another_profile(result, unplanned):
    fig = viz.memory_timeline(result, others={"Thunder": result.before})
    assert len(_labelled_lines(fig.axes[0])) == 3
    fig = viz.memory_timeline(unplanned)
    assert "not applied" in _labelled_lines(fig.axes[0])[1].get_label()


# ---------------------------------------------------------------------------------------------- dot
def test_to_dot_structure(result):
    dot = viz.to_dot(result)
    assert dot.startswith("digraph remat_cut {") and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    assert "subgraph cluster_forward" in dot and "subgraph cluster_backward" in dot
    declared = set(re.findall(r"^\s+(n\d+) \[", dot, re.M))
    used = set(re.findall(r"(n\d+) -> (n\d+)", dot))
    assert used and all(a in declared and b in declared for a, b in used)
    for name in result.after.saved_tensors:
        assert re.search(rf"\b{name}\b", dot)
    layout = viz.cut_rows(result, "compact")
    assert dot.count('class="recompute"') == sum(1 for r in layout.rows if r.recomputes) > 0
    assert dot.count('class="saved"') == sum(1 for e in layout.edges if e.saved)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_to_dot_renders(result, tmp_path):
    path = tmp_path / "cut.dot"
    path.write_text(viz.to_dot(result))
    done = subprocess.run(["dot", "-Tsvg", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "<svg" in done.stdout


def test_format_bytes():
    assert viz.format_bytes(0) == "0 B"
    assert viz.format_bytes(1536) == "1.5 KiB"
    assert viz.format_bytes(80 * 2**20) == "80 MiB"
    assert viz.format_bytes(361.2 * 2**20) == "361 MiB"
    assert viz.format_bytes(2.47 * 2**30) == "2.47 GiB"


def test_to_dot_names_the_module_of_saved_tensors(result):
    dot = viz.to_dot(result)
    graph = result.after_graph
    saved_edges = [line for line in dot.splitlines() if 'class="saved"' in line]
    assert saved_edges
    for name in result.after.saved_tensors:
        module = graph.value_module(name)
        if module:  # each saved tensor appears in a tooltip with its module: "t57 (transformer.h.0.mlp, ...)"
            assert any(f"{name} ({module}, " in line for line in saved_edges), name
