"""GPU diagnostic: where the peak of ``remat.jit(runtime="inductor-graph")`` comes from.

With ``runtime="inductor-graph"`` Inductor compiles remat's whole forward and whole backward as one graph
each, and schedules them itself: it fuses, reorders (``reorder_for_locality``, ``reorder_for_peak_memory``)
and reuses buffers.  remat's estimate assumes the trace's order.  This script measures, for remat's
region-by-region runtime (``regions``) and for the graph runtime under several Inductor settings:

* the graph runtime's variants (``VARIANTS``): region outputs materialized (the default) or inlined by
  Inductor into their readers, Inductor's reordering passes on or off, and independent regions kept
  apart (the default) or fused horizontally;
* ``step_ms``, ``peak_mib`` (as ``gpu_memory.py``), ``forward_peak_mib`` (highest allocation during the
  forward, above the step's start), ``after_forward_mib`` (what the forward leaves: saved tensors and the
  loss), ``backward_peak_mib`` (the step's peak: where it is above the forward's, the backward's);
  remat's estimate;
* for the first graph variant: the blocks alive at the step's peak (from ``torch.cuda.memory._snapshot``),
  largest first, each with the frames that allocated it (Inductor's generated code, remat, Thunder), and
  copies of the generated files named there under ``--out/code``.

On the GPU machine:

    source .gpu/activate.sh; python benchmarks/gpu_graph_memory.py --model stablecode-completion-alpha-3b --out $OUT

A budget plan (``--budget``, with ``--batch``), e.g. the Llama-2-7b plan that measured 24% above its
estimate with the graph runtime (docs/benchmarks.md, "Memory budgets on the GPU"):

    python benchmarks/gpu_graph_memory.py --model Llama-2-7b-hf --seq 8192 --batch 4 --budget 0.6 --variants regions graph --out $OUT

Records go to ``--out/gpu_graph_memory.jsonl``, a line per variant (kept: benchmarks/results/gpu_graph_memory_h100.jsonl).  A diagnostic: its figures are not
in docs/benchmarks.md's tables (``gpu_memory.py`` mode ``remat-graph`` is).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

MIB = 2**20
RUN = time.strftime("%Y-%m-%dT%H:%M")
# The graph runtime's variants: InductorGraphTransform's arguments (Inductor settings over remat's
# INDUCTOR_OPTIONS, which turn Inductor's peak-memory reordering off)
VARIANTS: dict[str, dict] = {
    "graph": {},
    "graph-inlined": {"materialize_region_outputs": False},
    "graph-peak-reorder": {"inductor_options": {"reorder_for_peak_memory": True}},
    "graph-inlined-peak-reorder": {"materialize_region_outputs": False, "inductor_options": {"reorder_for_peak_memory": True}},
    "graph-no-locality": {"inductor_options": {"reorder_for_locality": False}},
    "graph-fuse-regions": {"separate_regions": False},  # Inductor may fuse across regions (horizontally and vertically)
    "graph-no-donation": {"donate_dying_inputs": False},  # every region output in a buffer of its own (remat.core.donation)
    "graph-reuse": {"inductor_options": {"allow_buffer_reuse": True}},  # Inductor keeps a dead buffer for a later one of its size (off by default)
    # issue 18: Inductor's own choice between a pointwise cat and a concat buffer (pointwise is remat's default since 2026-12-06)
    "graph-concat-kernel": {"inductor_options": {"force_pointwise_cat": False}},
    # issue 18: the graph runtime before 2026-12-06: attention's q, k, v as their regions compute them (contiguous), Inductor's cats
    "graph-as-traced": {"token_major_attention": False, "inductor_options": {"force_pointwise_cat": False}},
}


def phased_step(fn, params, idx, targets) -> dict:
    """``gpu_memory.step``'s figures by phase.  The backward's peak is the step's where that is above the
    forward's; otherwise the backward stayed at or below it (recorded as the forward's)."""
    from gpu_memory import step

    _, seconds, peak, after_forward, _, forward_peak = step(fn, params, idx, targets)
    return dict(seconds=seconds, forward_peak=forward_peak, after_forward=after_forward, backward_peak=peak)


def frames_of(frames: list[dict], keep: int = 4) -> list[str]:
    """The allocating frames worth reading: generated code (Inductor's, Thunder's) and remat's own."""
    chosen = []
    for frame in frames:
        name = frame.get("filename", "")
        if any(k in name for k in ("torchinductor", "/remat/", "thunder.", "<string>")) or name.startswith("/tmp"):
            chosen.append(f"{name}:{frame.get('line')} {frame.get('name')}")
        if len(chosen) == keep:
            break
    return chosen


def replay(trace: list[dict], top: int = 20) -> dict:
    """The highest sum of live blocks over ``trace`` (one device's events), the event that reached it and
    the blocks alive then."""
    live: dict[int, dict] = {}
    current = peak = 0
    peak_index = -1
    at_peak: list[dict] = []
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            current += event["size"]
            if current > peak:
                peak, peak_index = current, index
                at_peak = list(live.values())
        elif event["action"] == "free_completed" and event["addr"] in live:
            current -= live.pop(event["addr"])["size"]
    at_peak.sort(key=lambda e: -e["size"])
    by_site: dict[str, int] = {}
    for event in at_peak:
        site = (frames_of(event.get("frames", []), keep=1) or ["(no frame worth reading)"])[0]
        by_site[site] = by_site.get(site, 0) + event["size"]
    return {
        "peak_mib": peak / MIB,
        "peak_event": {
            "index": peak_index,
            "of": len(trace),
            "frames": frames_of(trace[peak_index].get("frames", []), keep=8) if peak_index >= 0 else [],
        },
        "live_at_peak": [dict(mib=round(e["size"] / MIB, 2), frames=frames_of(e.get("frames", []))) for e in at_peak[:top]],
        "live_by_site": {site: round(size / MIB, 2) for site, size in sorted(by_site.items(), key=lambda kv: -kv[1])[:top]},
        "live_blocks": len(at_peak),
    }


def live_at_peak(snapshot: dict, top: int = 15) -> tuple[float, list[dict]]:
    """Replays the allocator's trace of one step (:func:`replay`): the highest sum of blocks allocated
    during it, and the largest blocks alive at that moment."""
    result = replay(snapshot["device_traces"][0], top)
    return result["peak_mib"], result["live_at_peak"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=512, help="the model's vocabulary (default 512)")
    parser.add_argument("--budget", type=float, default=None,
                        help="remat's memory_budget (a fraction of the default plan's estimated peak) for every variant")
    parser.add_argument("--variants", nargs="+", default=["regions", *VARIANTS])
    parser.add_argument("--out", default="out")
    args = parser.parse_args()

    import remat
    import remat.thunder  # noqa: F401  (its compat bridge first)
    from gpu_memory import build
    from remat.thunder import nvfuser
    from remat.thunder.graph import InductorGraphTransform

    out = Path(args.out)
    (out / "code").mkdir(parents=True, exist_ok=True)
    log = out / "gpu_graph_memory.jsonl"
    module, params, idx, targets = build(args.model, args.layers, args.seq, batch=args.batch, vocab=args.vocab)
    snapshot_taken = False
    for variant in args.variants:
        record: dict = dict(model=args.model, layers=args.layers, seq=args.seq, batch=args.batch, budget=args.budget,
                            variant=variant, device=torch.cuda.get_device_name(), run=RUN)
        try:
            nvfuser.clear_shared_definitions()
            gc.collect()
            torch.cuda.empty_cache()
            if variant == "regions":
                fn = remat.jit(module, memory_budget=args.budget)
            else:
                transform = InductorGraphTransform(**VARIANTS[variant])
                fn = remat.jit(module, runtime="inductor", transforms=[transform], memory_budget=args.budget)
            t0 = time.perf_counter()
            phased_step(fn, params, idx, targets)
            record["first_call_s"] = time.perf_counter() - t0
            phased_step(fn, params, idx, targets)
            samples = [phased_step(fn, params, idx, targets) for _ in range(args.steps)]
            record["step_ms"] = 1e3 * statistics.median(s["seconds"] for s in samples)
            for key in ("forward_peak", "after_forward", "backward_peak"):
                record[f"{key}_mib"] = statistics.median(s[key] for s in samples) / MIB
            record["peak_mib"] = record["backward_peak_mib"]  # the step's
            result = remat.executor_of(fn).last_result
            record["estimated_peak_mib"] = result.after.peak_bytes / MIB
            record["estimated_saved_mib"] = result.after.saved_bytes / MIB
            if variant != "regions" and not snapshot_taken:
                snapshot_taken = True
                torch.cuda.memory._record_memory_history(max_entries=200_000)
                phased_step(fn, params, idx, targets)
                snapshot = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                record["snapshot_peak_mib"], record["live_at_peak"] = live_at_peak(snapshot)
                for block in record["live_at_peak"]:
                    for frame in block["frames"]:
                        path = Path(frame.split(":")[0])
                        if path.suffix == ".py" and path.exists() and "torchinductor" in str(path):
                            shutil.copy(path, out / "code" / path.name)
                import thunder

                for kind, trace in (("forward", thunder.last_traces(fn)[-1]), ("backward", thunder.last_backward_traces(fn)[-1])):
                    (out / f"{variant}_{kind}_trace.py").write_text(str(trace))
                    body = [b for b in trace.bound_symbols if b.sym.name.startswith("remat_graph")]
                    if body:
                        (out / f"{variant}_{kind}_regions.py").write_text("\n".join(str(b) for b in body[0].subsymbols))
            del fn
        except Exception as exc:  # one broken variant must not lose the others
            record["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        line = json.dumps(record)
        print(line, flush=True)
        with log.open("a") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()
