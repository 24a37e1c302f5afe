"""CPU diagnostic: the allocation peak of ``remat.jit(runtime="inductor-graph")`` against remat's estimate.

``gpu_graph_memory.py`` measures the graph runtime's peak on a GPU; this script measures it on the CPU,
where no GPU is needed to see what Inductor's schedule does to remat's planned memory.  Inductor makes the
same decisions that matter here on both (which nodes it fuses into one kernel, when it frees or reuses a
buffer), with C++ kernels instead of Triton ones, so the CPU reproduces the GPU's excess over the estimate
(it found the two causes fixed on 2026-12-06, see ``remat/thunder/graph.py``), though not its size: kernels
and fusion choices differ between the two backends.

Peak: one training step (forward, then ``backward``) under ``torch.profiler`` with ``profile_memory=True``;
the largest sum of the CPU allocator's live bytes during the step, counted from the step's start (the
weights are not in it; their gradients are).  remat's estimate is the memory model's peak of the planned
trace, on the same basis.  The model is a bf16 LitGPT config with vocab 512, batch 1, the loss inside
(as ``gpu_memory.py``; ``--batch`` for more), run on the CPU: seq 2048 takes a minute or two a variant
on two cores.

    python benchmarks/cpu_graph_memory.py --model stablecode-completion-alpha-3b --seq 2048 \\
        --variants graph graph-reuse graph-fuse-regions [--budgets none 0.8] [--out benchmarks/results/cpu_graph_memory.jsonl]

Variants are ``gpu_graph_memory.VARIANTS`` (``InductorGraphTransform`` arguments).  A diagnostic: its
figures are quoted in docs/benchmarks.md ("The graph runtime's peak on the CPU"), with this command.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

MIB = 2**20
RUN = time.strftime("%Y-%m-%dT%H:%M")


def step_peak_bytes(fn, params, idx, targets) -> int:
    """The most bytes the CPU allocator held at once during one step, above what it held at the start."""
    for p in params:
        p.grad = None
    gc.collect()
    activity = torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity], profile_memory=True) as prof:
        fn(idx, targets).backward()
    changes = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
    )
    current = peak = 0
    for _, change in changes:  # allocations positive, frees negative
        current += change
        peak = max(peak, current)
    return peak


def _budget(text: str) -> float | str | None:
    """A ``--budgets`` value as ``remat.jit`` takes it: None, a fraction, or a size string."""
    if text == "none":
        return None
    try:
        return float(text)
    except ValueError:
        return text  # a size such as "1642MiB": remat's MemoryBudget.parse checks it


def main() -> None:
    import remat
    import remat.thunder  # noqa: F401  (before thunder)
    from gpu_graph_memory import VARIANTS
    from gpu_memory import build
    from remat.thunder.graph import InductorGraphTransform

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=512, help="the model's vocabulary (default 512: logits small next to activations)")
    parser.add_argument("--width", default="full", choices=("full", "demo"), help="demo: n_embd 128, fp32 (a real vocabulary's logits then dominate)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), help="the parameters' dtype (default: bf16 at full width, fp32 at demo width)")
    parser.add_argument("--variants", nargs="+", default=["graph", "graph-reuse", "graph-fuse-regions"], choices=sorted(VARIANTS))
    parser.add_argument("--budgets", nargs="+", default=[None], type=_budget,
                        help="remat memory budgets: fractions of the default plan's estimated peak, sizes such as "
                        "'1642MiB' (above the default plan too), or 'none' (no budget)")
    parser.add_argument("--out", type=Path, help="a .jsonl file the records are appended to")
    args = parser.parse_args()

    module, params, idx, targets = build(args.model, args.layers, args.seq, device="cpu", batch=args.batch, vocab=args.vocab, width=args.width,
        dtype={"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype),
    )
    for variant, budget in [(v, b) for b in args.budgets for v in args.variants]:
        start = time.perf_counter()
        transform = InductorGraphTransform(**VARIANTS[variant])
        fn = remat.jit(module, runtime="inductor", transforms=[transform], memory_budget=budget)
        step_peak_bytes(fn, params, idx, targets)  # compiles
        first_call_s = time.perf_counter() - start
        peaks = [step_peak_bytes(fn, params, idx, targets) for _ in range(2)]
        estimate = remat.executor_of(fn).last_result.after.peak_bytes
        record = dict(
            model=args.model, layers=args.layers, seq=args.seq, batch=args.batch, vocab=args.vocab, width=args.width, dtype=args.dtype, variant=variant, budget=budget, device="cpu", run=RUN,
            first_call_s=round(first_call_s, 1), peak_mib=round(max(peaks) / MIB, 1),
            estimated_peak_mib=round(estimate / MIB, 1), peak_over_estimate=round(max(peaks) / estimate, 4),
        )
        print(json.dumps(record), flush=True)
        if args.out is not None:
            with args.out.open("a") as f:
                f.write(json.dumps(record) + "\n")
        del fn


if __name__ == "__main__":
    main()
