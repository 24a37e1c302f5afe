"""GPU diagnostic: the allocator's history of one whole ``benchmark_litgpt`` run, and what is alive at its peak.

``gpu_litgpt.py`` reports Thunder's ``memory_used_GB``: ``torch.cuda.max_memory_allocated()`` over the
whole run, compilation included.  When that figure differs between remat's runtimes and a one-process
replica (``gpu_litgpt_memory.py``) does not show the difference, this script looks at the run itself: it
records the caching allocator's history from the start of the process (``torch.cuda.memory``'s
``_record_memory_history``), runs ``python -m remat benchmark-litgpt`` in-process with the given
arguments, then replays the history and writes, per run:

* ``peak_mib`` (from the replay) and ``max_allocated_mib`` (the allocator's own figure; the two agree when
  the history holds every allocation of the run);
* ``peak_event``: the position of the peak in the history (event index, out of how many) and the frames
  of the allocation that reached it (where the program was at the peak);
* ``live_at_peak``: the largest blocks alive at that moment, each with its allocating frames, and
  ``live_by_site``: the bytes alive at the peak summed by allocating site (first frame worth reading).

    source .gpu/activate.sh; python benchmarks/gpu_litgpt_snapshot.py --out $OUT -- \\
        --remat-runtime inductor-graph --model_name stablecode-completion-alpha-3b --n_layers 4 \\
        --compile thunder --max_iters 6 --warmup_iters 3

Everything after ``--`` goes to ``python -m remat benchmark-litgpt``.  Records go to
``--out/gpu_litgpt_snapshot.jsonl``.  A diagnostic: its figures are quoted in docs/benchmarks.md with this
command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gpu_graph_memory import replay

MIB = 2**20


def main() -> None:
    argv = sys.argv[1:]
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-entries", type=int, default=3_000_000)
    args = parser.parse_args(own)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from remat.cli import main as remat_main

    torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks="python")
    start = time.perf_counter()
    code = remat_main(["benchmark-litgpt", *script_args])
    record: dict = {
        "args": script_args,
        "device": torch.cuda.get_device_name(),
        "run": time.strftime("%Y-%m-%dT%H:%M"),
        "returncode": code,
        "wall_seconds": time.perf_counter() - start,
        "max_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
    }
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    record.update(replay(snapshot["device_traces"][torch.cuda.current_device()]))
    line = json.dumps(record)
    print(line, flush=True)
    with (out / "gpu_litgpt_snapshot.jsonl").open("a") as handle:
        handle.write(line + "\n")


if __name__ == "__main__":
    main()
