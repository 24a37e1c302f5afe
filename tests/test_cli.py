"""``python -m remat demo|report``: every argument is checked before any work, by one validator per kind
of argument that both commands use, and a mistake gives ``error: ...`` on stderr and exit status 2.

The commands' work (tracing, planning, writing) is replaced by a recorder here: these tests are about
what happens before it starts (tests/test_report.py runs the real report)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import remat
from remat import cli
from remat.cli import main


@pytest.fixture
def work(monkeypatch):
    """Replaces both commands' work with a recorder: the list of (command, args) that reached it."""
    started: list[tuple[str, object]] = []

    def recorder(command):
        def run(args):
            started.append((command, args))
            return 0

        return run

    monkeypatch.setattr(cli, "run_demo", recorder("demo"))
    monkeypatch.setattr(cli, "run_report", recorder("report"))
    return started


def report_argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["report", "--model", "pythia-14m", "--out", str(tmp_path / "report"), *extra]


def refused(argv: list[str], capsys) -> str:
    """What ``main(argv)`` printed to stderr, after checking it exited with 2 and printed nothing else."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err.strip()


# ---------------------------------------------------------------------- the same message in every command


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "no-such-model"], "error: --model: 'no-such-model' is not a LitGPT config name"),
        (["--layers", "0"], "error: --layers must be a positive integer, got 0"),
        (["--layers", "-2"], "error: --layers must be a positive integer, got -2"),
        (["--seq", "0"], "error: --seq must be a positive integer, got 0"),
    ],
)
def test_demo_and_report_refuse_a_mistake_with_the_same_message(tmp_path, capsys, work, extra, message):
    from_demo = refused(["demo", *extra], capsys)
    from_report = refused(report_argv(tmp_path, *extra), capsys)
    assert from_demo.startswith(message)
    assert from_report == from_demo
    assert work == []
    assert not (tmp_path / "report").exists()  # --out is checked (and created) only once the rest is right


# ---------------------------------------------------------------------- each argument


@pytest.mark.parametrize(
    "budget, message",
    [
        ("lots", "--budget: cannot read memory_budget='lots'"),
        ("1.5", "--budget: memory_budget=1.5 is neither a fraction"),
        ("1", "--budget: memory_budget=1 is ambiguous"),
        ("-2GiB", "--budget: memory_budget must be positive"),
        ("150%", "--budget: memory_budget='150%' is more than 100%"),
    ],
)
def test_a_budget_that_does_not_parse_is_refused(tmp_path, capsys, work, budget, message):
    assert message in refused(report_argv(tmp_path, f"--budget={budget}"), capsys)  # "=": "-2GiB" is no option
    assert work == []


def test_cuda_without_cuda_is_a_message_not_an_assertion(tmp_path, capsys, work, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:0"):
        err = refused(report_argv(tmp_path, "--device", device), capsys)
        assert f"--device '{device}': torch sees no CUDA device on this machine" in err
    assert work == []


def test_a_cuda_index_past_the_last_device_is_refused(tmp_path, capsys, work, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "this machine has 1 CUDA device(s)" in refused(report_argv(tmp_path, "--device", "cuda:3"), capsys)
    assert main(report_argv(tmp_path, "--device", "cuda:0")) == 0  # the one device there is
    assert [args.device for _, args in work] == ["cuda:0"]


@pytest.mark.parametrize(
    "device, message",
    [
        ("gpu", "--device 'gpu' is not a device name; use one of meta, cpu, cuda or cuda:N"),
        ("cuda:x", "--device 'cuda:x' is not a device name"),
        ("mps", "--device 'mps': models are built on meta, cpu or cuda[:N] here, not mps"),
    ],
)
def test_an_unknown_device_is_refused(tmp_path, capsys, work, device, message):
    assert message in refused(report_argv(tmp_path, "--device", device), capsys)
    assert work == []


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys, work):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    err = refused(["report", "--model", "pythia-14m", "--out", str(a_file)], capsys)
    assert err == f"error: --out '{a_file}' is a file, not a directory"
    err = refused(["report", "--model", "pythia-14m", "--out", str(a_file / "report")], capsys)
    assert err.startswith(f"error: --out '{a_file / 'report'}' cannot be created: ")
    assert work == []


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc (a directory nobody can write into, root included)")
def test_an_out_that_cannot_be_written_into_is_refused_before_any_work(capsys, work):
    # /proc exists, so creating it "succeeds"; only writing a file there fails (once after the tracing)
    err = refused(["report", "--model", "pythia-14m", "--out", "/proc"], capsys)
    assert err.startswith("error: --out '/proc' cannot be written into: ")
    assert work == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_out_is_refused(tmp_path, capsys, work):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        err = refused(["report", "--model", "pythia-14m", "--out", str(read_only)], capsys)
    finally:
        read_only.chmod(0o700)
    assert err.startswith(f"error: --out '{read_only}' cannot be written into: ")
    assert work == []


def test_argparse_mistakes_return_2_too(capsys, work):
    assert main(["demo", "--layers", "two"]) == 2
    assert "argument --layers: invalid int value: 'two'" in capsys.readouterr().err
    assert main(["report", "--out", "x"]) == 2  # --model is required
    assert "the following arguments are required: --model" in capsys.readouterr().err
    assert work == []


# ---------------------------------------------------------------------- good arguments reach the work, read


def test_good_arguments_reach_the_work_checked_and_read(tmp_path, work):
    out = tmp_path / "new" / "report"
    assert main(["report", "--model", "pythia-14m", "--budget", "600MiB", "--out", str(out), "--device", "cpu"]) == 0
    assert main(["demo", "--model", "pythia-14m", "--layers", "1", "--seq", "8"]) == 0
    (report_command, report_args), (demo_command, demo_args) = work
    assert report_command == "report" and demo_command == "demo"
    assert report_args.budget == remat.MemoryBudget(bytes=600 * 2**20)
    assert report_args.out == out and out.is_dir() and not any(out.iterdir())  # created, probe file gone
    assert report_args.device == "cpu" and report_args.layers == 2 and report_args.seq == 4096
    assert (demo_args.model, demo_args.layers, demo_args.seq) == ("pythia-14m", 1, 8)


def test_benchmark_litgpt_runs_thunders_script_with_remat_installed(monkeypatch, capsys):
    """``python -m remat benchmark-litgpt ARGS``: Thunder's shipped script (a stand-in here: the real one
    sets a CUDA device when imported) gets ARGS unchanged, with remat as Thunder's default fusion
    executor while it runs, and Thunder's defaults back afterwards (issue 16)."""
    import sys
    import types

    import remat.thunder  # noqa: F401
    import thunder

    seen = {}

    def benchmark_main(model_name: str = "x", n_layers: int = 1, compile: str = "eager") -> None:
        seen.update(model_name=model_name, n_layers=n_layers, compile=compile)
        seen["executors"] = [ex.name for ex in thunder.get_default_executors()]

    fake = types.ModuleType("thunder.benchmarks.benchmark_litgpt")
    fake.benchmark_main = benchmark_main
    monkeypatch.setitem(sys.modules, "thunder.benchmarks.benchmark_litgpt", fake)
    before = thunder.get_default_executors()
    args = ["--model_name", "Llama-2-7b-hf", "--n_layers", "4", "--compile", "thunder"]
    assert main(["benchmark-litgpt", *args]) == 0
    assert seen["model_name"] == "Llama-2-7b-hf" and seen["n_layers"] == 4 and seen["compile"] == "thunder"
    assert seen["executors"][-1] == "remat" and thunder.get_default_executors() == before
    assert main(["benchmark-litgpt", "--without-remat", *args]) == 0
    assert "remat" not in seen["executors"]
    assert main(["benchmark-litgpt", "--remat-budget", "lots", *args]) == 2
    assert "error:" in capsys.readouterr().err
    installed = {}
    real_install = remat.cli.install

    def spy(budget=None, **kwargs):
        installed.update(kwargs)
        return real_install(budget, **kwargs)

    monkeypatch.setattr(remat.cli, "install", spy)
    assert main(["benchmark-litgpt", "--remat-runtime", "torch", *args]) == 0
    assert installed == {"runtime": "torch"} and seen["executors"][-1] == "remat"
    assert main(["benchmark-litgpt", "--remat-runtime", "triton", *args]) == 2
