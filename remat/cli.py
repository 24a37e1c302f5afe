"""Command line: ``python -m remat demo`` and ``python -m remat report``.

Arguments are checked before any work (tracing a 7B config takes minutes), each kind by one validator
that every command uses, so the same mistake gives the same message everywhere: ``error: ...`` on stderr
and exit status 2, as argparse does for what it checks itself.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from remat._logging import logger
from remat.compile import install
from remat.errors import MissingExtraError, require_extra
from remat.core.memory import MemoryBudget, format_bytes
from remat.models import check_config_name, demo_model
from remat.pipeline import optimize
from remat.report import run as run_report
from remat.thunder.capture import training_trace
from remat.thunder.execute import example_inputs, execute_joint
from remat.thunder.fuse import fuse

__all__ = ["main", "run_demo", "validate_args", "UsageError", "check_model", "check_positive", "check_budget", "check_device", "check_out_dir"]

#: Devices a model can be built and traced on here (meta: proxies only, no memory, no math).
DEVICE_TYPES = ("meta", "cpu", "cuda")


class UsageError(ValueError):
    """A command-line argument is wrong; the message names the argument (printed as ``error: ...``)."""


# ---------------------------------------------------------------------------------------- validators


def check_model(name: str) -> str:
    """``--model``: a LitGPT config name (:func:`remat.models.check_config_name`, the one rule)."""
    try:
        check_config_name(name)
    except ValueError as exc:
        raise UsageError(f"--model: {exc}") from None
    return name


def check_positive(flag: str, value: int) -> int:
    """``--layers`` / ``--seq``: a positive integer (argparse has made it an int)."""
    if value < 1:
        raise UsageError(f"{flag} must be a positive integer, got {value}")
    return value


def check_budget(text: str | None) -> MemoryBudget | None:
    """``--budget``: what :meth:`remat.MemoryBudget.parse` reads (the one rule for budgets)."""
    try:
        return MemoryBudget.parse(text)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--budget: {exc}") from None


def check_device(text: str) -> str:
    """``--device``: ``meta``, ``cpu`` or ``cuda[:N]``, and a CUDA device only where there is one."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {text!r} is not a device name; use one of meta, cpu, cuda or cuda:N") from None
    if device.type not in DEVICE_TYPES:
        raise UsageError(f"--device {text!r}: models are built on meta, cpu or cuda[:N] here, not {device.type}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"--device {text!r}: torch sees no CUDA device on this machine; use --device meta (tracing only, "
                "no memory or math) or cpu"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise UsageError(f"--device {text!r}: this machine has {count} CUDA device(s), numbered from 0")
    return text


def check_out_dir(text: str) -> Path:
    """``--out``: a directory that exists or can be created, and that a file can be written into.  It is
    created here (an empty directory is all a failed check can leave), and probed with a temporary file
    (deleted at once), because permission bits do not tell (root, read-only mounts)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {text!r} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {text!r} cannot be created: {exc.strerror or exc}") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise UsageError(f"--out {text!r} cannot be written into: {exc.strerror or exc}") from None
    return path


#: Each argument kind and its validator, in the order they are checked: what only reads the arguments
#: first, ``--out`` (which creates the directory) last.  A command checks the arguments it has.
_VALIDATORS: tuple[tuple[str, Callable[[object], object]], ...] = (
    ("model", check_model),
    ("layers", lambda value: check_positive("--layers", value)),
    ("seq", lambda value: check_positive("--seq", value)),
    ("budget", check_budget),
    ("remat_budget", check_budget),
    ("device", check_device),
    ("out", check_out_dir),
)


def validate_args(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with every argument checked (and read: ``budget`` as a :class:`remat.MemoryBudget`,
    ``out`` as a ``Path``); :class:`UsageError` naming the first wrong one."""
    for name, check in _VALIDATORS:
        if hasattr(args, name):
            setattr(args, name, check(getattr(args, name)))
    return args


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    """``python -m remat demo`` on arguments :func:`validate_args` accepted."""
    started = time.perf_counter()
    print(
        f"remat demo: LitGPT {args.model} shrunk to n_embd 128, {args.layers} layers, seq {args.seq}, "
        "fp32 on CPU"
    )
    model, idx = demo_model(args.model, args.layers, args.seq, device="cpu")

    t = time.perf_counter()
    joint = training_trace(model, idx)
    print(f"  traced the joint forward+backward trace in {time.perf_counter() - t:.1f} s (no tensor math ran)")
    fused = fuse(joint)

    result = optimize(fused)  # compares with Thunder's own rematerialize of the same trace
    thunder_profile, thunder_seconds = result.candidates["thunder"], result.baseline_seconds
    graph = result.graph
    regions = sum(1 for u in graph.units if u.kind == "region")
    saved_count = len(result.plan.saved) if result.plan else 0
    print(f"  {len(graph.ops)} ops in {regions} nvFuser-style regions; one min-cut over the whole forward keeps {saved_count} values")

    rows = [("plan", "saved", "est. peak", "recomputed ops", "plan time")]
    rows.append(("no rematerialization", format_bytes(result.before.saved_bytes), format_bytes(result.before.peak_bytes), "-", "-"))
    rows.append(("Thunder 0.2.6 rematerialize", format_bytes(thunder_profile.saved_bytes), format_bytes(thunder_profile.peak_bytes), "-", f"{thunder_seconds * 1e3:.0f} ms"))
    recomputed = str(len(result.plan.recomputed_ops)) if result.plan else "-"
    kept = "remat.optimize" if result.applied else f"remat.optimize (kept {result.chosen})"
    rows.append((kept, format_bytes(result.after.saved_bytes), format_bytes(result.after.peak_bytes), recomputed, f"{result.seconds * 1e3:.0f} ms"))
    print()
    print(_table(rows))
    print(
        f"\nremat vs Thunder: saved x{result.after.saved_bytes / max(thunder_profile.saved_bytes, 1):.2f}, "
        f"estimated peak x{result.after.peak_bytes / max(thunder_profile.peak_bytes, 1):.2f}; "
        f"extra compute {100 * result.extra_flops / max(result.step_flops, 1):.2f}% of the step's FLOPs"
    )
    for note in result.notes:
        print(f"note: {note}")

    # The optimized trace computes the same thing: run both on the CPU.
    inputs = example_inputs(fused, int_high=512)
    expected = execute_joint(fused, inputs, seed=1)
    got = execute_joint(result.trace, inputs, seed=1)
    pairs = [(a, b) for a, b in zip(expected.outputs + expected.grads, got.outputs + got.grads) if isinstance(a, torch.Tensor)]
    worst = max((a - b).abs().max().item() / (a.abs().max().item() or 1.0) for a, b in pairs)
    print(f"checked on CPU: outputs and {len(pairs) - len(expected.outputs)} gradients match (max relative difference {worst:.1e})")
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    return 0 if worst <= 1e-5 else 1


def main(argv: list[str] | None = None) -> int:
    """Run one command (``argv`` defaults to ``sys.argv[1:]``) and return its exit status: 2, with
    ``error: ...`` on stderr, for a wrong argument, before any work."""
    parser = argparse.ArgumentParser(prog="python -m remat", description="remat on LitGPT models: a demo, and a report.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="trace a small LitGPT model on CPU and show what remat does")
    demo.add_argument("--model", default="stablecode-completion-alpha-3b", help="LitGPT config name")
    demo.add_argument("--layers", type=int, default=2)
    demo.add_argument("--seq", type=int, default=256)
    demo.set_defaults(func=run_demo)
    report = sub.add_parser(
        "report",
        help="write report.md, pictures and nvFuser definitions for a LitGPT config",
        description="Trace a LitGPT config (full width on the meta device: no memory, no math), optimize it, "
        "and write report.md (before/after table), cut.png/svg, timeline.png/svg, cut.dot and "
        "definitions/<region>.py into --out.",
    )
    report.add_argument("--model", required=True, help="LitGPT config name, e.g. stablecode-completion-alpha-3b")
    report.add_argument("--layers", type=int, default=2)
    report.add_argument("--seq", type=int, default=4096)
    report.add_argument("--budget", default=None, help="memory budget: a fraction of the default plan's estimated peak (0.8) or a size (600MiB)")
    report.add_argument("--out", required=True, help="directory to write into (created if needed)")
    report.add_argument("--width", choices=("full", "demo"), default="full", help="full config, or shrunk to n_embd 128 (fast)")
    report.add_argument("--device", default="meta", help="meta, cpu or cuda[:N]: where the model is built (meta: tracing only)")
    report.set_defaults(func=run_report)
    bench = sub.add_parser(
        "benchmark-litgpt",
        help="run Thunder's own benchmark_litgpt, unchanged, with remat as Thunder's default fusion executor",
        description="Thunder's thunder/benchmarks/benchmark_litgpt.py (shipped in lightning-thunder) with remat installed "
        "(remat.install()) in nvFuser's place; every argument other than remat's own goes to the script, e.g. "
        "--model_name Llama-2-7b-hf --n_layers 4 --compile thunder (or dynamo_thunder). Needs a CUDA device.",
    )
    bench.add_argument("--remat-budget", default=None, help="remat's memory budget (as --budget); default: none")
    bench.add_argument(
        "--remat-runtime", default="auto", choices=("auto", "nvfuser", "inductor", "inductor-graph", "torch"),
        help="what runs remat's regions (remat.install(runtime=...)); default auto: nvFuser on a GPU",
    )
    bench.add_argument("--without-remat", action="store_true", help="run the script as Thunder ships it (the anchor)")
    bench.set_defaults(func=run_benchmark_litgpt)
    try:
        args, rest = parser.parse_known_args(argv)
        if rest and args.command != "benchmark-litgpt":
            parser.parse_args(argv)  # argparse's own message for unknown arguments
        args.script_args = rest
    except SystemExit as exc:  # argparse has printed its usage error (status 2) or --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        validate_args(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with _progress():
        try:
            return args.func(args)
        except MissingExtraError as exc:  # e.g. report's pictures without matplotlib
            print(f"error: {exc}", file=sys.stderr)
            return 2


def run_benchmark_litgpt(args: argparse.Namespace) -> int:
    """Thunder's ``benchmark_litgpt`` as shipped, its arguments passed through; with remat installed as
    Thunder's default fusion executor unless ``--without-remat`` (the script builds its executor list from
    ``thunder.get_default_executors()``, for ``--compile thunder`` and ``dynamo_thunder`` alike)."""
    # the compat bridge and the nvfuser alias are in place: this module imports remat.thunder
    jsonargparse = require_extra("jsonargparse", "benchmark-litgpt")
    scope = contextlib.nullcontext() if args.without_remat else install(args.remat_budget, runtime=args.remat_runtime)
    with scope:
        try:
            script = importlib.import_module("thunder.benchmarks.benchmark_litgpt")  # sets a CUDA device on import
        except Exception:
            if torch.cuda.is_available():
                raise
            print("error: benchmark-litgpt runs Thunder's GPU benchmark: it needs a CUDA device", file=sys.stderr)
            return 2
        jsonargparse.CLI(script.benchmark_main, args=list(args.script_args))
    return 0


@contextlib.contextmanager
def _progress():
    """remat's stage log (:mod:`remat._logging`) as the command's progress on stderr, one line per stage,
    unless the application configured logging itself."""
    if logger.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  [remat] %(message)s"))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


if __name__ == "__main__":
    sys.exit(main())
