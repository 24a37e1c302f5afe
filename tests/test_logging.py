"""What remat says while it works: ``logging.getLogger("remat")`` stage timings, and warnings that point
at the caller's line (issue 17)."""

import logging
import warnings

import torch

import remat
from conftest import tiny_litgpt, traced, PYTHIA_2


def _stages(caplog) -> list[str]:
    return [r.getMessage().split(":")[0] for r in caplog.records if r.name.startswith("remat") and r.levelno == logging.INFO]


def test_pipeline_stages_are_logged_with_their_time(caplog):
    joint = traced(**PYTHIA_2)
    with caplog.at_level(logging.INFO, logger="remat"):
        fused = remat.fuse(joint)
        remat.optimize(fused)
    stages = _stages(caplog)
    assert stages[:4] == ["fuse", "plan", "rewrite", "thunder baseline"], stages
    fuse_line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("fuse:"))
    assert " s (" in fuse_line and "regions)" in fuse_line  # "fuse: 0.05 s (26 regions)"


def test_nothing_is_logged_below_the_level_asked(caplog):
    joint = traced(**PYTHIA_2)
    with caplog.at_level(logging.WARNING, logger="remat"):
        remat.optimize(remat.fuse(joint))
    assert not [r for r in caplog.records if r.name.startswith("remat")]


def test_jit_logs_the_compile_stage(caplog):
    model = tiny_litgpt()
    with caplog.at_level(logging.INFO, logger="remat"):
        jitted = remat.jit(model, runtime="torch")
        jitted(torch.randint(0, 128, (1, 8))).sum().backward()
    assert "compile" in _stages(caplog)


def test_executor_warnings_point_at_the_callers_line(monkeypatch):
    """A warning from inside thunder.jit's first call names the user's line (here: this file), not
    remat's or Thunder's."""
    import remat.thunder.executor as executor_module

    def broken(*args, **kwargs):
        raise RuntimeError("simulated fusing bug")

    monkeypatch.setattr(executor_module, "fuse", broken)
    jitted = remat.jit(tiny_litgpt(), runtime="torch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jitted(torch.randint(0, 128, (1, 8))).sum().backward()
    ours = [w for w in caught if issubclass(w.category, remat.OptimizationWarning)]
    assert len(ours) == 1 and "simulated fusing bug" in str(ours[0].message)
    assert ours[0].filename == __file__


def test_tracing_is_logged(caplog):
    w = torch.randn(4, 4, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="remat"):
        remat.training_trace(lambda x, w: (x @ w).sin().sum(), torch.randn(2, 4), w)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("trace:"))
    assert line.endswith("symbols)")
