"""``python -m remat report``: the files it writes, on two LitGPT architectures at demo width."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import xml.etree.ElementTree as ET

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import remat  # noqa: E402
from remat import report  # noqa: E402
from remat.cli import main  # noqa: E402

CONFIGS = ("pythia-14m", "Llama-2-7b-hf")  # GPT-NeoX (LayerNorm, GELU MLP) and LLaMA (RMSNorm, SwiGLU)


@pytest.fixture(scope="module", params=CONFIGS)
def written(request, tmp_path_factory):
    """Run the CLI once per config (1 layer, demo width, seq 32) and keep what it printed."""
    out = tmp_path_factory.mktemp(request.param)
    argv = ["report", "--model", request.param, "--layers", "1", "--seq", "32", "--width", "demo", "--out", str(out)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(argv)
    return request.param, out, rc, stdout.getvalue()


def test_report_command_succeeds_and_shows_progress(written):
    _, _, rc, printed = written
    assert rc == 0
    steps = re.findall(r"^\[\s*\d+\.\d s\] (.+)$", printed, re.M)
    assert len(steps) >= 6
    assert any(s.startswith("tracing") for s in steps)
    assert "saved activations:" in printed  # the summary at the end


def test_report_md_has_the_before_after_table(written):
    name, out, _, _ = written
    text = (out / "report.md").read_text()
    assert text.startswith(f"# remat report: {name}")
    assert "analytic" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    plans = [line.split("|")[1].strip() for line in table]
    assert any(p.startswith("no rematerialization") for p in plans)
    assert any("Thunder" in p for p in plans)
    assert any("remat.optimize" in p for p in plans)
    remat_row = next(line for line in table if "remat.optimize" in line)
    saved_mib = float(remat_row.split("|")[2])
    none_row = next(line for line in table if "no rematerialization" in line)
    assert saved_mib < float(none_row.split("|")[2])
    for picture in ("cut.png", "timeline.png"):
        assert f"({picture})" in text


def test_pictures_are_png_and_svg(written):
    _, out, _, _ = written
    for stem in ("cut", "timeline"):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        root = ET.parse(out / f"{stem}.svg").getroot()
        assert root.tag.endswith("svg")
    dot = (out / "cut.dot").read_text()
    assert dot.startswith("digraph") and "cluster_backward" in dot


def test_one_definition_per_region(written):
    _, out, _, _ = written
    text = (out / "report.md").read_text()
    count = int(re.search(r"(\d+) fusion regions of the optimized trace", text).group(1))
    files = sorted((out / "definitions").iterdir())
    assert len(files) == count > 0
    for path in files:
        assert re.fullmatch(r"nvFusion\d+\.(py|txt)", path.name)
        assert f"(definitions/{path.name})" in text
        if path.suffix == ".py":
            source = path.read_text()
            compile(source, str(path), "exec")  # a valid script
            assert "FusionDefinition" in source and "fd.add_output" in source
        else:
            assert path.read_text().startswith("# ")  # the note saying why


def test_recompute_regions_are_listed(written):
    _, out, _, _ = written
    text = (out / "report.md").read_text()
    section = text.split("## Where recomputation runs", 1)[1].split("##", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| [nvFusion")]
    assert rows, "the tiny models recompute something"
    assert any("| yes |" in r for r in rows)  # at least one new recompute region


def test_region_definition_falls_back_to_subsymbols(monkeypatch, pythia_trace):
    region = next(b for b in remat.fuse(pythia_trace).bound_symbols if b.sym.is_fusion)
    if hasattr(remat, "nvfuser"):
        text, suffix = report.region_definition(region)
        assert suffix == ".py" and "FusionDefinition" in text

        def refuse(region):
            raise remat.nvfuser.EmitError("no such op")

        monkeypatch.setattr(remat.nvfuser, "definition_source", refuse)
        text, suffix = report.region_definition(region)
        assert suffix == ".txt" and "EmitError: no such op" in text.splitlines()[0]
        assert region.sym.name in text
        monkeypatch.delattr(remat, "nvfuser")
    text, suffix = report.region_definition(region)
    assert suffix == ".txt"
    assert text.startswith("# remat.nvfuser.definition_source is not available")
    assert region.sym.name in text


def test_parse_budget():
    assert report.parse_budget(None) is None
    assert report.parse_budget("0.8") == 0.8
    assert report.parse_budget("600MiB") == 600 * 2**20
    assert report.parse_budget("1.5GiB") == int(1.5 * 2**30)
    assert report.parse_budget("629145600") == 629145600
    for bad in ("lots", "-3", "0", "12 parsecs"):
        with pytest.raises(ValueError):
            report.parse_budget(bad)


def test_bad_arguments_exit_with_a_message(tmp_path, capsys):
    assert main(["report", "--model", "no-such-model", "--out", str(tmp_path)]) == 2
    assert "not a LitGPT config name" in capsys.readouterr().err
    assert main(["report", "--model", "pythia-14m", "--budget", "lots", "--out", str(tmp_path)]) == 2
    assert "cannot read budget" in capsys.readouterr().err
    assert main(["report", "--model", "pythia-14m", "--layers", "0", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("remat.budget") is not None, reason="remat.budget exists")
def test_budget_without_budget_planning_is_reported(tmp_path, capsys):
    argv = ["report", "--model", "pythia-14m", "--layers", "1", "--seq", "32", "--width", "demo", "--budget", "0.8",
            "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "remat.budget" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_pareto_figure_uses_remat_pareto_where_it_exists(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.delattr(remat, "pareto", raising=False)
    with pytest.raises(AttributeError, match="no remat.pareto"):
        report.pareto_figure(object())
    points = [SimpleNamespace(peak_bytes=600 * 2**20, extra_flops=0), SimpleNamespace(peak_bytes=400 * 2**20, extra_flops=10**9)]
    monkeypatch.setattr(remat, "pareto", lambda fused: points, raising=False)
    fig = report.pareto_figure(object())
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [600.0, 400.0]
    assert list(line.get_ydata()) == [0, 10**9]
