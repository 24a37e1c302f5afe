"""Estimated memory of one training step of a full-width LitGPT config, on a CPU, in seconds.

    python examples/estimate_memory.py --model Llama-2-7b-hf --layers 2 --seq 4096

The model is built on the meta device (no memory, no math); the joint forward+backward trace comes from
Thunder; the figures are remat's memory model (docs/memory-model.md) for the raw joint trace, the
nvFuser-style fused trace, Thunder 0.2.6's own rematerialization of it, and remat's plan.
"""

import argparse

import remat
from remat.models import litgpt_model
from remat.thunder.execute import thunder_rematerialize

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=512)
    args = parser.parse_args()
    model, idx = litgpt_model(args.model, args.layers, args.seq, vocab=args.vocab)  # bf16, on the meta device
    joint = remat.training_trace(model, idx)
    fused = remat.fuse(joint)
    thunder_trace, _ = thunder_rematerialize(fused)
    result = remat.optimize(fused)
    print(f"{args.model}, {args.layers} layers, seq {args.seq}, bf16 (parameters: {remat.estimate_memory(joint).param_bytes / MIB:.1f} MiB)")
    for label, profile in (
        ("joint trace (unfused)", remat.estimate_memory(joint)),
        ("fused, no rematerialization", result.before),
        ("Thunder 0.2.6 rematerialize", remat.estimate_memory(thunder_trace)),
        ("remat.optimize", result.after),
    ):
        print(f"  {label:30s} estimated peak {profile.peak_bytes / MIB:8.1f} MiB   saved {profile.saved_bytes / MIB:8.1f} MiB")


if __name__ == "__main__":
    main()
