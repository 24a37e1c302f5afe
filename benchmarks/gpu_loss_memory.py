"""GPU diagnostic: what is alive at the peak of a training step with a real vocabulary, per runtime.

Under nvFuser, remat's plan for Llama-2-7b x2 (batch 4, seq 8192, vocab 32000, loss inside) measured
15832.88 MiB against an estimate of 9832.75 whether the loss gradient was fused or not; the excess is, to
the byte, a float32 buffer of the logits' size and one of their copy padded by one class (Thunder's
``nll_loss`` gathers each row's log-probability at its target from that copy).  This script runs one step
per ``--runtime`` (``gpu_budget.py``'s runtimes and suffixes, e.g. ``auto+fused-loss-gradient+target-reads``)
with the allocator's history recorded, replays it (``gpu_graph_memory.replay``) and writes, per runtime:
the measured peak, the forward's peak, remat's estimate, the median step time of ``--steps`` steps, and
the largest blocks alive at the peak with the frames that allocated them (Thunder's generated code names
the region; the traces are written next to the records, ``<runtime>_fw.py`` / ``_bw.py``, ``+`` written ``_``).

    source .gpu/activate.sh; python benchmarks/gpu_loss_memory.py --runtime auto+fused-loss-gradient auto+fused-loss-gradient+target-reads inductor-graph+gathered-targets inductor-graph --out $OUT

Records go to ``--out/gpu_loss_memory.jsonl``.  A diagnostic: its figures are quoted in
docs/benchmarks.md with this command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Llama-2-7b-hf")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--runtime", nargs="+", default=["auto+fused-loss-gradient", "auto+fused-loss-gradient+target-reads"])
    parser.add_argument("--out", default="out")
    args = parser.parse_args()

    import torch

    import remat
    import thunder
    from gpu_budget import runtime_options
    from gpu_graph_memory import replay
    from gpu_memory import build, step
    from remat.thunder import nvfuser

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    module, params, idx, targets = build(args.model, args.layers, args.seq, batch=args.batch, vocab=args.vocab)
    run = time.strftime("%Y-%m-%dT%H:%M", time.gmtime())
    for name in args.runtime:
        nvfuser.clear_shared_definitions()
        runtime, options = runtime_options(name)
        fn = remat.jit(module, runtime=runtime, **options)
        step(fn, params, idx, targets)  # compiles
        step(fn, params, idx, targets)
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        _, _, peak, after_forward, _, forward_peak = step(fn, params, idx, targets)
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        times = [step(fn, params, idx, targets, phase_sync=False)[1] * 1e3 for _ in range(args.steps)]
        result = remat.executor_of(fn).last_result
        record = dict(
            model=args.model, layers=args.layers, seq=args.seq, batch=args.batch, vocab=args.vocab, runtime=name, run=run,
            device=torch.cuda.get_device_name(), step_ms=statistics.median(times), peak_mib=peak / MIB,
            forward_peak_mib=forward_peak / MIB, after_forward_mib=after_forward / MIB,
            estimated_peak_mib=result.after.peak_bytes / MIB, estimate=str(result.after),
            replay=replay(snapshot["device_traces"][0], top=14),
        )
        with open(out / "gpu_loss_memory.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        print(json.dumps({k: v for k, v in record.items() if k != "replay"}), flush=True)
        print(json.dumps(record["replay"]["live_by_site"], indent=1), flush=True)
        (out / f"{name.replace('+', '_')}_fw.py").write_text(str(thunder.last_traces(fn)[-1]))
        (out / f"{name.replace('+', '_')}_bw.py").write_text(str(thunder.last_backward_traces(fn)[-1]))
        del fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
