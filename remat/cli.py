"""Command line: ``python -m remat demo`` and ``python -m remat report``."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from remat.core.memory import format_bytes
from remat.models import check_config_name, demo_model
from remat.pipeline import estimate_memory, optimize
from remat.report import run as run_report
from remat.thunder.capture import training_trace
from remat.thunder.execute import example_inputs, execute_joint, thunder_rematerialize
from remat.thunder.fuse import fuse

__all__ = ["main", "run_demo"]


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    try:  # a message, not litgpt's traceback
        check_config_name(args.model)
        if args.layers < 1 or args.seq < 1:
            raise ValueError(f"--layers and --seq must be positive, got {args.layers} and {args.seq}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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

    thunder_trace, thunder_seconds = thunder_rematerialize(fused)
    thunder_profile = estimate_memory(thunder_trace)
    result = optimize(fused)
    graph = result.graph
    regions = sum(1 for u in graph.units if u.kind == "region")
    saved_count = len(result.plan.saved) if result.plan else 0
    print(f"  {len(graph.ops)} ops in {regions} nvFuser-style regions; one min-cut over the whole forward keeps {saved_count} values")

    rows = [("plan", "saved", "est. peak", "recomputed ops", "plan time")]
    rows.append(("no rematerialization", format_bytes(result.before.saved_bytes), format_bytes(result.before.peak_bytes), "-", "-"))
    rows.append(("Thunder 0.2.6 rematerialize", format_bytes(thunder_profile.saved_bytes), format_bytes(thunder_profile.peak_bytes), "-", f"{thunder_seconds * 1e3:.0f} ms"))
    recomputed = str(len(result.plan.recomputed_ops)) if result.plan else "-"
    rows.append(("remat.optimize", format_bytes(result.after.saved_bytes), format_bytes(result.after.peak_bytes), recomputed, f"{result.seconds * 1e3:.0f} ms"))
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
    parser = argparse.ArgumentParser(prog="python -m remat", description=__doc__)
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
    report.add_argument("--budget", default=None, help="memory budget: a fraction of the estimated peak (0.8) or a size (600MiB)")
    report.add_argument("--out", required=True, help="directory to write into (created if needed)")
    report.add_argument("--width", choices=("full", "demo"), default="full", help="full config, or shrunk to n_embd 128 (fast)")
    report.add_argument("--device", default="meta", help="device the model is built on (meta: tracing only)")
    report.set_defaults(func=run_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
