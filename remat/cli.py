"""Command line: ``python -m remat demo`` and ``python -m remat report``."""

from __future__ import annotations

import argparse
import sys
import time

MIB = 1024 * 1024


def _fmt_bytes(n: int) -> str:
    if n >= MIB:
        return f"{n / MIB:.2f} MiB"
    return f"{n / 1024:.1f} KiB"


def demo_model(name: str = "stablecode-completion-alpha-3b", layers: int = 2, seq: int = 256, device: str = "meta"):
    """The demo's model: a LitGPT config shrunk to n_embd 128 (real architecture, tiny width)."""
    import torch
    from litgpt import GPT, Config

    config = Config.from_name(
        name,
        n_layer=layers,
        n_embd=128,
        n_head=4,
        n_query_groups=4,
        intermediate_size=512,
        block_size=seq,
        vocab_size=512,
        padded_vocab_size=512,
    )
    with torch.device(device):
        torch.manual_seed(0)
        model = GPT(config)
        idx = torch.randint(0, 512, (1, seq))
    return model, idx


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    import remat

    started = time.perf_counter()
    print(f"remat demo: LitGPT {args.model} shrunk to n_embd 128, {args.layers} layers, seq {args.seq} (CPU, meta tensors)")
    model, idx = demo_model(args.model, args.layers, args.seq)

    t = time.perf_counter()
    joint = remat.training_trace(model, idx)
    print(f"  traced the joint forward+backward trace in {time.perf_counter() - t:.1f} s")
    fused = remat.fuse(joint)

    rows = [("trace", "ops", "regions", "saved", "est. peak")]
    for label, trace in (("joint (unfused)", joint), ("fused (nvFuser-style regions)", fused)):
        graph = remat.FusionGraph.from_trace(trace)
        profile = remat.estimate_memory(graph)
        regions = sum(1 for u in graph.units if u.kind == "region")
        rows.append((label, str(len(graph.ops)), str(regions), _fmt_bytes(profile.saved_bytes), _fmt_bytes(profile.peak_bytes)))
    print()
    print(_table(rows))
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="trace a small LitGPT model on CPU and show what remat does")
    demo.add_argument("--model", default="stablecode-completion-alpha-3b", help="LitGPT config name")
    demo.add_argument("--layers", type=int, default=2)
    demo.add_argument("--seq", type=int, default=256)
    demo.set_defaults(func=run_demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
