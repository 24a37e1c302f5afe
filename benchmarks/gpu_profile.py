"""GPU diagnostic: where one training step's memory peak and time go, line by line of the executed traces.

For each mode (same model and inputs as ``gpu_memory.py``) this records one step with PyTorch's CUDA
allocator history (Python stacks), replays the allocation events, and attributes every allocation to the
line of Thunder's generated forward/backward program that made it (Thunder registers those programs in
``linecache``, so the frames name ``thunder.computation_N`` / ``thunder.backward_fn_N`` lines).  It writes:

* ``kernels_<mode>.json``: the ``torch.profiler`` trace of one step (open in Perfetto / chrome://tracing);

* ``profile_<mode>.json``: the measured peak (bytes above step start), the executed line at the peak,
  every block alive at the peak with the line that allocated it, the per-line memory curve, and the
  CUDA kernel time of one step (``torch.profiler``) beside its wall time;
* ``traces_<mode>.txt``: the executed forward and backward traces.

On the GPU machine:

    source .gpu/activate.sh; python benchmarks/gpu_profile.py --model stablecode-completion-alpha-3b --modes thunder remat --out $OUT

This is a diagnostic, not a benchmark: recording stacks slows the recorded step down.
"""

from __future__ import annotations

import argparse
import json
import linecache
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import remat.thunder  # noqa: E402,F401  (compat bridge before Thunder)
from gpu_memory import build, make, step  # noqa: E402

MIB = 2**20


def _site(frames: list[dict]) -> tuple[str, int, str]:
    """The innermost frame in a Thunder-generated program, else the innermost Python frame."""
    for frame in frames:
        if frame["filename"].startswith("thunder."):
            text = linecache.getline(frame["filename"], frame["line"]).strip()
            return frame["filename"], frame["line"], text
    if frames:
        f = frames[0]
        return f["filename"], f["line"], f["name"]
    return "?", 0, ""


def replay(snapshot: dict, start_bytes: int) -> dict:
    """Replay allocator events of device 0: the peak, what is alive there, and the per-line curve."""
    events = snapshot["device_traces"][0]
    alive: dict[int, tuple[int, tuple]] = {}
    allocated = start_bytes
    peak, peak_alive, peak_site = allocated, {}, None
    curve: list[dict] = []
    for event in events:
        action = event["action"]
        if action == "alloc":
            site = _site(event.get("frames", []))
            alive[event["addr"]] = (event["size"], site)
            allocated += event["size"]
            if allocated > peak:
                peak, peak_alive, peak_site = allocated, dict(alive), site
        elif action == "free_completed":
            entry = alive.pop(event["addr"], None)
            allocated -= entry[0] if entry else event["size"]
            site = _site(event.get("frames", []))
        else:
            continue
        key = f"{site[0]}:{site[1]}"
        if curve and curve[-1]["site"] == key:
            curve[-1]["max_mib"] = max(curve[-1]["max_mib"], (allocated - start_bytes) / MIB)
            curve[-1]["after_mib"] = (allocated - start_bytes) / MIB
        else:
            curve.append(dict(site=key, text=site[2][:160], max_mib=(allocated - start_bytes) / MIB, after_mib=(allocated - start_bytes) / MIB))
    by_site: dict[tuple, int] = {}
    for size, site in peak_alive.values():
        by_site[site] = by_site.get(site, 0) + size
    live = sorted(({"mib": b / MIB, "site": f"{s[0]}:{s[1]}", "text": s[2][:200]} for s, b in by_site.items()), key=lambda r: -r["mib"])
    return dict(
        peak_mib=(peak - start_bytes) / MIB,
        peak_site=None if peak_site is None else f"{peak_site[0]}:{peak_site[1]} {peak_site[2][:200]}",
        alive_at_peak=live,
        curve=curve,
    )


def kernel_union(kernels: list[tuple[float, float, str]]) -> tuple[float, list[tuple[float, str, str]]]:
    """For kernels ``(start, stop, name)`` sorted by start: the GPU busy time (the union of their
    intervals) and the gaps in it, each ``(length, kernel that ended before it, kernel after it)``."""
    busy, end, end_name, gaps = 0.0, None, "", []
    for start, stop, name in kernels:
        if end is not None and start > end:
            gaps.append((start - end, end_name, name))
        if end is None or start >= end:
            busy += stop - start
            end, end_name = stop, name
        elif stop > end:
            busy += stop - end
            end, end_name = stop, name
    return busy, gaps


def trace_kernels(events: list[dict]) -> list[tuple[float, float, str]]:
    """The GPU kernels of an exported profiler trace's ``traceEvents``: ``(start, stop, name)`` in us,
    sorted by start."""
    return sorted((e["ts"], e["ts"] + e["dur"], e.get("name", "")) for e in events if e.get("cat") == "kernel" and "dur" in e)


def gpu_busy(kernels: list[tuple[float, float, str]]) -> dict:
    """From a trace's kernels (:func:`trace_kernels`): kernel count, GPU busy time (union of kernel
    intervals) and the span from first to last kernel, so idle = span - busy is time the GPU waited
    (mostly on launches)."""
    busy, _ = kernel_union(kernels)
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    return dict(kernels=len(kernels), gpu_busy_ms=busy / 1e3, kernel_span_ms=span / 1e3, gpu_idle_ms=(span - busy) / 1e3)


def _kernel_kind(name: str) -> str:
    if name.startswith(("nvjet", "sm90_xmma", "cutlass")) or "gemm" in name:
        return "matmul"
    if "sdpa" in name or "fmha" in name or "flash" in name:
        return "attention backward" if "bprop" in name or "bwd" in name else "attention forward"
    if name.startswith("void cudnn"):
        return "attention (cuDNN helpers)"
    if name.startswith("triton"):
        return "triton"
    if name.startswith("nvfuser"):
        return "nvfuser"
    return "other"


def kernel_kinds(kernels: list[tuple[float, float, str]]) -> dict:
    """GPU time (us) and kernel count by kind of kernel (matmul, attention, Triton, ...) of a trace's
    kernels (:func:`trace_kernels`), for the forward and the backward apart: the step's kernels split at
    the loss gradient's fill (the first ``FillFunctor`` kernel, which starts the backward), or all under
    ``step`` where there is none."""
    fills = [i for i, k in enumerate(kernels) if "FillFunctor" in k[2]]
    phases = {"forward": kernels[: fills[0]], "backward": kernels[fills[0] + 1 :]} if fills else {"step": kernels}
    table: dict = {}
    for phase, part in phases.items():
        kinds: dict[str, dict] = {}
        for start, stop, name in part:
            row = kinds.setdefault(_kernel_kind(name), {"us": 0.0, "kernels": 0})
            row["us"] += stop - start
            row["kernels"] += 1
        table[phase] = {kind: {"us": round(row["us"], 1), "kernels": row["kernels"]} for kind, row in sorted(kinds.items())}
        table[phase]["total_us"] = round(sum(stop - start for start, stop, _ in part), 1)
    return table


def kernel_time(fn, params, idx, targets, chrome_trace: Path | None = None) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, seconds, *_ = step(fn, params, idx, targets)
    busy = {}
    if chrome_trace is not None:
        prof.export_chrome_trace(str(chrome_trace))
        kernels = trace_kernels(json.loads(chrome_trace.read_text())["traceEvents"])
        busy = {**gpu_busy(kernels), "kernel_kinds": kernel_kinds(kernels)}
    events = prof.key_averages()
    rows = []
    total_us = 0.0
    for e in events:
        device_us = getattr(e, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "self_cuda_time_total", 0.0)
        if device_us > 0:
            total_us += device_us
            rows.append(dict(name=e.key[:120], device_ms=device_us / 1e3, calls=e.count))
    rows.sort(key=lambda r: -r["device_ms"])
    return dict(wall_ms_profiled=1e3 * seconds, kernel_ms=total_us / 1e3, **busy, top_kernels=rows[:40])


def run(args) -> None:
    import thunder

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    module, params, idx, targets = build(args.model, args.layers, args.seq, batch=args.batch, vocab=args.vocab)
    for mode in args.modes:
        record: dict = dict(model=args.model, layers=args.layers, seq=args.seq, batch=args.batch, vocab=args.vocab, mode=mode)
        try:
            t0 = time.perf_counter()
            fn, remat_executor = make(mode, module)
            step(fn, params, idx, targets)
            record["first_call_s"] = time.perf_counter() - t0
            samples = [step(fn, params, idx, targets) for _ in range(5)]
            record["step_ms"] = sorted(1e3 * s[1] for s in samples)[2]
            record["peak_mib"] = sorted(s[2] / MIB for s in samples)[2]
            for p in params:
                p.grad = None
            torch.cuda.synchronize()
            start_bytes = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
            step(fn, params, idx, targets)
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            record.update(replay(snapshot, start_bytes))
            record.update(kernel_time(fn, params, idx, targets, out / f"kernels_{mode}.json"))
            if remat_executor is not None and remat_executor.last_result is not None:
                res = remat_executor.last_result
                record["estimated_peak_mib"] = res.after.peak_bytes / MIB
                record["estimated_peak_unit"] = res.after.peak_unit_name
            if mode != "torch.compile" and mode != "eager":
                with open(out / f"traces_{mode}.txt", "w") as f:
                    f.write("# forward\n" + str(thunder.last_traces(fn)[-1]) + "\n\n# backward\n" + str(thunder.last_backward_traces(fn)[-1]))
            del fn
        except Exception:
            import traceback

            record["error"] = traceback.format_exc()[-3000:]
        (out / f"profile_{mode}.json").write_text(json.dumps(record, indent=1))
        print(json.dumps({k: v for k, v in record.items() if k not in ("curve", "alive_at_peak", "top_kernels")}), flush=True)
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=512, help="the model's vocabulary (gpu_memory.build's default 512)")
    parser.add_argument("--modes", nargs="+", default=["thunder", "remat"])
    parser.add_argument("--out", default="gpu_profile_out")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
