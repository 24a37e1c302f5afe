"""Packaging (issue 16): a base install pulls neither LitGPT nor matplotlib and leaves torch in place;
features that need an extra say which one."""

from __future__ import annotations

import configparser
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _requirements(section: str, key: str) -> dict[str, Requirement]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = [line.strip() for line in config[section][key].splitlines()]
    requirements = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return {r.name: r for r in requirements}


def test_base_install_keeps_torch_and_leaves_out_the_extras():
    base = _requirements("options", "install_requires")
    assert "litgpt" not in base and "matplotlib" not in base
    torch_range = base["torch"].specifier
    # the GPU machine's 2.11 and this machine's torch, whatever its local build label
    assert Version("2.11.0") in torch_range and Version(torch.__version__.split("+")[0]) in torch_range
    assert Version("2.15.0") not in torch_range  # bounded by what the compat bridge is tested on
    extras = {name: _requirements("options.extras_require", name) for name in ("models", "demo", "viz", "test")}
    assert "litgpt" in extras["models"] and "litgpt" in extras["demo"] and "matplotlib" in extras["viz"]
    assert {"litgpt", "matplotlib", "pytest", "hypothesis"} <= set(extras["test"])


def test_without_litgpt_or_matplotlib_remat_works_and_names_the_extra():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["litgpt"] = None  # as if not installed
        sys.modules["matplotlib"] = None
        import torch
        import remat
        w = torch.randn(4, 4, requires_grad=True)
        res = remat.optimize(remat.fuse(remat.training_trace(lambda x, w: (x @ w).sin().sum(), torch.randn(2, 4), w)))
        assert res.after.peak_bytes > 0
        for call, extra in ((lambda: remat.models.litgpt_config("pythia-14m"), "remat[models]"), (lambda: remat.viz.draw(res), "remat[viz]")):
            try:
                call()
            except remat.errors.MissingExtraError as exc:
                assert extra in str(exc), exc
                assert isinstance(exc, ImportError)
            else:
                raise AssertionError("no error")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
