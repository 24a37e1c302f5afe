"""Planning benchmark (CPU, analytic): what donation (``remat.core.donation``) does to the graph runtime's
estimates and budgets.

For LitGPT configs at batch 4 x seq 8192 (bf16, meta device; with the loss inside where the vocabulary is
real, as ``gpu_memory.build``), ``remat.optimize`` plans the fused trace as ``remat.jit(runtime=
"inductor-graph")`` does (``token_major_attention=True``), with ``donate_dying_inputs`` off and on, at the
default plan and at budgets of 0.9, 0.8 and 0.7 x the default plan's estimate.  Printed per row: the
estimated peak, the extra FLOPs, the planning time, the donations (output, bytes, region) at the default
plan.  With ``--layers 32``: the budget search's time on a deep trace with donations on (issue 15's
target: under 5 s).  Figures are the memory model's, not measurements: docs/benchmarks.md quotes them
with this command.

    python benchmarks/plan_donation.py [--models Llama-2-7b-hf:32000 stablecode-completion-alpha-3b:49152] [--layers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import remat  # noqa: E402
import remat.thunder  # noqa: E402,F401  (before Thunder)
from remat.models import litgpt_model  # noqa: E402

MIB = 2**20
BATCH, SEQ = 4, 8192


def fused_trace(name: str, layers: int, vocab: int):
    from gpu_memory import WithLoss

    model, idx = litgpt_model(name, layers, SEQ, batch=BATCH, vocab=vocab)  # bf16, meta device
    module = WithLoss(model)
    return remat.fuse(remat.training_trace(module, idx, idx.new_zeros(idx.shape)))


def rows(fused, budgets=(None, 0.9, 0.8, 0.7)) -> list[str]:
    lines = []
    for donate in (False, True):
        for budget in budgets:
            start = time.perf_counter()
            result = remat.optimize(fused, memory_budget=budget, token_major_attention=True, donate_dying_inputs=donate)
            seconds = time.perf_counter() - start
            lines.append(
                f"| {'on' if donate else 'off'} | {'default' if budget is None else budget} | "
                f"{result.after.peak_bytes / MIB:.1f} | {result.extra_flops / 1e12:.2f} | {seconds:.2f} |"
            )
            if donate and budget is None:
                graph = result.after_graph
                donated = [
                    f"{output} ({graph.tensors[output].bytes / MIB:.0f} MiB, {graph.units[graph.tensors[output].producer_unit].name})"
                    for output in graph.donations
                ]
                lines.append(f"|  | donations at the default plan: {', '.join(donated) or 'none'} | | | |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["Llama-2-7b-hf:32000", "stablecode-completion-alpha-3b:49152"],
                        help="name:vocabulary pairs")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    for spec in args.models:
        name, vocab = spec.split(":")
        fused = fused_trace(name, args.layers, int(vocab))
        print(f"\n{name} x{args.layers}, batch {BATCH}, seq {SEQ}, vocab {vocab} (graph runtime's planning)\n")
        print("| donation | budget | estimated peak MiB | extra TFLOP | planning s |")
        print("|---|---|---|---|---|")
        budgets = (None, 0.9, 0.8, 0.7) if args.layers <= 4 else (0.8,)
        for line in rows(fused, budgets):
            print(line, flush=True)


if __name__ == "__main__":
    main()
