"""GPU micro-benchmark behind ``FusionPolicy.transposed_cat``: the qkv-gradient region with and without
its final cat.

LitGPT's attention backward ends by transposing the q, k, v gradients back to (batch, seq, heads, size)
and concatenating them into the qkv gradient.  This script fuses the same 2-layer training trace twice
(``transposed_cat=True``: the cat inside the nvFuser region; the default: the region ends before the cat
and ``torch.cat`` joins its outputs), takes the region feeding that cat in each, and times both on the
same random inputs (CUDA events around the calls, median of ``--repeats``, host overhead included as in a
training step).  It also checks that both give the same qkv gradient.

On the GPU machine:

    source .gpu/activate.sh; python benchmarks/gpu_cat.py --out $OUT

Without a GPU, ``--dry-run`` only finds the regions and prints their sizes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import remat  # noqa: E402
import remat.thunder  # noqa: E402,F401  (its compat bridge lets Thunder 0.2.6 import nvFuser >= 0.2.34)
from remat.models import litgpt_model  # noqa: E402
from remat.thunder.read import op_kind  # noqa: E402


def region_pair(name: str, layers: int, seq: int):
    """(region ending in the qkv-gradient cat, region ending before it, the stand-alone cat)."""
    model, idx = litgpt_model(name, layers, seq)  # bf16, vocab 512, on the meta device
    joint = remat.training_trace(model, idx)
    split = remat.optimize(remat.fuse(joint), strict=True).trace
    joined = remat.optimize(remat.fuse(joint, remat.FusionPolicy(transposed_cat=True)), strict=True).trace
    cat = next(b for b in split.bound_symbols if op_kind(b) == "cat")
    made_by = {p.name: b for b in split.bound_symbols for p in b.flat_proxy_outs}
    before = made_by[cat.args[0][0].name]
    with_cat = next(b for b in joined.bound_symbols if b.sym.is_fusion and cat.output.name in {p.name for p in b.flat_proxy_outs})
    return with_cat, before, cat


def time_calls(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def run(args) -> dict:
    from gpu_check import random_inputs

    with_cat, before, cat = region_pair(args.model, args.layers, args.seq)
    record = dict(
        model=args.model, layers=args.layers, seq=args.seq,
        region_with_cat=f"{with_cat.sym.name}: {len(with_cat.subsymbols)} prims, {len(with_cat.flat_proxy_outs)} outputs",
        region_before_cat=f"{before.sym.name}: {len(before.subsymbols)} prims, {len(before.flat_proxy_outs)} outputs",
        cat=f"{cat.output.name} = cat of {len(cat.args[0])} pieces {[tuple(p.shape) for p in cat.args[0]]} along {cat.args[1]}",
    )
    if args.dry_run:
        return record
    generator = torch.Generator(device="cuda").manual_seed(0)
    with_inputs = random_inputs(with_cat, generator)
    by_name = {p.name: v for p, v in zip(with_cat.args, with_inputs)}
    before_inputs = [by_name[p.name] for p in before.args]  # both regions read the same values

    def descriptors(values):
        return [remat.nvfuser.tensor_descriptor(v) if isinstance(v, torch.Tensor) else None for v in values]

    fd_with = remat.nvfuser.build(with_cat, descriptors(with_inputs))
    fd_before = remat.nvfuser.build(before, descriptors(before_inputs))
    out_with = [p.name for p in with_cat.flat_proxy_outs].index(cat.output.name)
    piece_index = [[p.name for p in before.flat_proxy_outs].index(piece.name) for piece in cat.args[0]]

    def joined():
        return fd_with.execute(with_inputs)[out_with]

    def split():
        outputs = fd_before.execute(before_inputs)
        return torch.cat([outputs[i] for i in piece_index], cat.args[1])

    record["max_abs_difference"] = (joined().float() - split().float()).abs().max().item()
    record["cat_in_region_us"] = time_calls(joined, args.repeats)
    record["region_then_torch_cat_us"] = time_calls(split, args.repeats)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=None)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    record = run(args)
    print(json.dumps(record), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with (Path(args.out) / "gpu_cat.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
