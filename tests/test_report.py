"""``python -m remat report``: the files it writes, on two LitGPT architectures at demo width."""

from __future__ import annotations

import contextlib
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
    text, suffix = report.region_definition(region)
    assert suffix == ".py" and "FusionDefinition" in text

    def refuse(region):
        raise remat.nvfuser.EmitError("no such op")

    monkeypatch.setattr(report, "definition_source", refuse)
    text, suffix = report.region_definition(region)
    assert suffix == ".txt" and "EmitError: no such op" in text.splitlines()[0]
    assert region.sym.name in text


def test_bad_arguments_exit_with_a_message(tmp_path, capsys):
    assert main(["report", "--model", "no-such-model", "--out", str(tmp_path)]) == 2
    assert "not a LitGPT config name" in capsys.readouterr().err
    assert main(["report", "--model", "pythia-14m", "--budget", "lots", "--out", str(tmp_path)]) == 2
    assert "cannot read memory_budget='lots'" in capsys.readouterr().err
    assert main(["report", "--model", "pythia-14m", "--budget", "1.5", "--out", str(tmp_path)]) == 2
    assert "neither a fraction" in capsys.readouterr().err
    assert main(["report", "--model", "pythia-14m", "--layers", "0", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert main(["report", "--model", "pythia-14m", "--out", str(blocked / "report")]) == 2  # before any tracing
    assert "error:" in capsys.readouterr().err
    assert main(["demo", "--model", "no-such-model"]) == 2
    assert "not a LitGPT config name" in capsys.readouterr().err


def test_report_with_a_budget_draws_the_frontier(tmp_path):
    from remat.report import write_report

    files = write_report("pythia-14m", 1, 32, tmp_path, budget="1.0", width="demo", log=lambda line: None)  # of the default plan
    text = files.report.read_text()
    assert "budget" in text
    assert (tmp_path / "pareto.png").exists() and (tmp_path / "pareto.svg").exists()
    assert files.result.frontier and files.result.after.peak_bytes <= files.result.before.peak_bytes


def test_pareto_curve_is_a_staircase_with_floor_and_budget():
    from types import SimpleNamespace

    from remat import viz

    points = [SimpleNamespace(peak_bytes=600 * 2**20, extra_flops=0), SimpleNamespace(peak_bytes=400 * 2**20, extra_flops=10**9)]
    fig = viz.pareto_curve(points, step_flops=10**10, gradient_bytes=300 * 2**20, budget_bytes=500 * 2**20, chosen=points[1])
    ax = fig.axes[0]
    staircase = ax.get_lines()[0]
    assert list(staircase.get_xdata())[:2] == [0.0, 10.0] and list(staircase.get_ydata())[:2] == [600.0, 400.0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert any("gradients" in label for label in labels) and any("budget" in label for label in labels)
    assert "chosen plan" in labels
    with pytest.raises(ValueError, match="empty"):
        viz.pareto_curve([])
    with pytest.raises(TypeError, match="remat.pareto"):
        viz.pareto_curve([(1, 2)])




def test_report_names_the_modules_of_saved_and_recomputed_tensors(written):
    from remat.models import litgpt_model

    name, out, _, _ = written
    text = (out / "report.md").read_text()
    known = {path or "<root>" for path, _ in litgpt_model(name, 1, 32, width="demo", device="meta").model.named_modules()}
    for section in ("## Largest saved tensors", "## Largest recomputed tensors"):
        body = text.split(section, 1)[1].split("\n## ", 1)[0]
        rows = [line.split("|") for line in body.splitlines() if line.startswith("| t") and not line.startswith("| tensor")]
        modules = {row[2].strip() for row in rows}
        assert rows and modules <= known, (section, modules - known)
        assert any(m.startswith("transformer.h.0.") for m in modules), section
    placements = text.split("## Where recomputation runs", 1)[1].split("\n## ", 1)[0]
    assert "| from modules |" in placements and "transformer.h.0" in placements
