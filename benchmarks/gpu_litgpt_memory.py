"""GPU diagnostic: where the memory of a ``benchmark_litgpt``-shaped step goes, per remat runtime.

``gpu_litgpt.py`` runs Thunder's ``benchmark_litgpt`` and reports one figure, ``memory_used_GB`` (the
allocator's highest allocation over the whole run, compilation included).  This script rebuilds that step
in one process so the figure can be taken apart: the full LitGPT config (its real vocabulary), bf16,
batch 1, the loss computed outside the compiled model, AdamW, gradients set to None after each step, and
``logits``/``loss`` kept alive into the next iteration, as the benchmark's loop does.  For each runtime:

* ``first_call_peak_mib``: the highest allocation during the first step (compilation included);
* ``step_peak_mib``: during a later step (median of ``--steps``), both above what was allocated before;
* ``memory_used_gb``: the highest allocation of any step, absolute (weights, optimizer state and all), in
  GB as ``benchmark_litgpt`` prints it;
* remat's estimate of the planned trace (which does not see the loss outside it, nor the optimizer);
* for ``--snapshot`` runtimes: the largest blocks alive at a later step's peak, with their allocating
  frames (``torch.cuda.memory._snapshot``).

    source .gpu/activate.sh; python benchmarks/gpu_litgpt_memory.py --model stablecode-completion-alpha-3b \\
        --layers 4 --seq 16384 --runtimes auto inductor-graph --out $OUT

A diagnostic: records go to ``--out/gpu_litgpt_memory.jsonl``; its figures are quoted in
docs/benchmarks.md with this command.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 2**20
RUN = time.strftime("%Y-%m-%dT%H:%M")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--runtimes", nargs="+", default=["auto", "inductor-graph"])
    parser.add_argument("--snapshot", nargs="*", default=["inductor-graph"], help="runtimes whose peak is taken apart")
    parser.add_argument("--install", action="store_true",
                        help="compile as benchmark_litgpt does: thunder.jit(model, executors=Thunder's defaults) "
                        "inside remat.install(runtime=...), instead of remat.jit")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import remat
    import remat.thunder  # noqa: F401  (its compat bridge before thunder)
    from gpu_graph_memory import live_at_peak
    from litgpt import Config

    from remat.models import litgpt_model

    args.out.mkdir(parents=True, exist_ok=True)
    vocab = Config.from_name(args.model).padded_vocab_size  # the config's own, as benchmark_litgpt uses
    model, idx = litgpt_model(args.model, args.layers, args.seq, device="cuda", vocab=vocab)
    targets = torch.randint(0, vocab, (1, args.seq), device="cuda")

    for runtime in args.runtimes:
        record: dict = dict(model=args.model, layers=args.layers, seq=args.seq, runtime=runtime,
                            device=torch.cuda.get_device_name(), run=RUN)
        try:
            for p in model.parameters():
                p.grad = None
            torch.cuda.reset_peak_memory_stats()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            if args.install:
                import thunder

                with remat.install(runtime=runtime):
                    fn = thunder.jit(model, executors=list(thunder.get_default_executors()), transforms=[])
            else:
                fn = remat.jit(model, runtime=runtime)

            # benchmark_litgpt's loop, as it is written: ``logits`` and ``loss`` stay alive into the next
            # iteration, the autograd node's saved tensors are read once, gradients are set to None
            state: dict = {}

            def step() -> tuple[float, float]:
                """(the iteration's peak above what was allocated at its start, its absolute peak) in MiB."""
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                state["logits"] = fn(idx)
                saved = getattr(state["logits"].grad_fn, "saved_tensors", None)
                del saved
                state["logits"] = state["logits"].reshape(-1, state["logits"].size(-1))
                state["loss"] = torch.nn.functional.cross_entropy(state["logits"], targets.reshape(-1), ignore_index=-1)
                state["loss"].backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                return (torch.cuda.max_memory_allocated() - base) / MIB, torch.cuda.max_memory_allocated() / MIB

            start = time.perf_counter()
            record["first_call_peak_mib"], first_absolute = step()
            record["first_call_s"] = time.perf_counter() - start
            later = [step() for _ in range(args.steps)]
            record["step_peak_mib"] = statistics.median(p for p, _ in later)
            # what benchmark_litgpt reports as memory_used_GB (there over the whole process)
            record["memory_used_gb"] = max(first_absolute, *(a for _, a in later)) * MIB / 1e9
            record["held_after_mib"] = torch.cuda.memory_allocated() / MIB
            record["install"] = args.install
            if not args.install:
                record["estimated_peak_mib"] = remat.executor_of(fn).last_result.after.peak_bytes / MIB
            if runtime in args.snapshot:
                torch.cuda.memory._record_memory_history(max_entries=200_000)
                step()
                snapshot = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                record["snapshot_peak_mib"], record["live_at_peak"] = live_at_peak(snapshot)
            del fn, optimizer, state
        except Exception as exc:  # one broken runtime must not lose the others
            record["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        line = json.dumps(record)
        print(line, flush=True)
        with (args.out / "gpu_litgpt_memory.jsonl").open("a") as handle:
            handle.write(line + "\n")
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
