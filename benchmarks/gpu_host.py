"""GPU diagnostic: how much of a training step is the host (Python) and how much the GPU, per phase.

``gpu_memory.py`` times a step as DESIGN.md says: synchronize, forward, synchronize, backward,
synchronize.  Every synchronize empties the GPU's queue, so whatever the host does before the first
kernel of a phase (Thunder's cache check and prologue, autograd's bookkeeping) and wherever the host
falls behind the GPU (many short kernels) shows up in the step time.  This script separates the two.

For each mode (same model and inputs as ``gpu_memory.py``), medians over ``--steps`` steps of:

* ``forward_call_ms`` / ``forward_ms``: until the forward call returns (host) / until the GPU is done;
* ``backward_call_ms`` / ``backward_ms``: the same for ``loss.backward()``;
* Thunder modes: ``cache_ms`` (cache lookup), ``prologue_ms`` (input checks), ``computation_host_ms``
  (the forward program's host time) from ``thunder.compile_stats``;
* remat: ``region_calls`` and ``region_host_ms`` (host time inside remat's region callables, nvFuser's
  or Inductor's, per step) and ``execute_host_ms`` (the part of that spent in ``FusionDefinition.execute``);

and from one profiled step (``torch.profiler``): per phase, the GPU busy time (union of kernel
intervals), the delay from the phase's start to its first kernel, the idle time between its first and
last kernel, and the largest gaps with the kernel that ended each.  From one more profiled step run as a
training loop runs it (no synchronization between forward and backward), ``blocking_calls``: the CUDA
calls that can make the host wait (synchronizations, copies, cudaMalloc/cudaFree), and
``sync_warnings``: what ``torch.cuda.set_sync_debug_mode("warn")`` reports in such a step, and ``unsynced``:
that step's timeline (first kernel's delay, GPU busy and idle, largest gaps).  ``unsynced_events``: medians
over ``--steps`` unprofiled steps of the same kind, timed with CUDA events (:func:`evented_step`).
``step_gaps``: eight such steps under a CUDA-only profile, each started by a marker kernel: how long the GPU
waits for the step's first kernel, then its busy and idle time (:func:`step_gaps`).

On the GPU machine:

    source .gpu/activate.sh; python benchmarks/gpu_host.py --model stablecode-completion-alpha-3b --modes torch.compile thunder remat --out $OUT

Results go to ``--out/gpu_host.jsonl``, a line per mode.  This is a diagnostic: the profiled step is
slower than an unprofiled one; the medians come from unprofiled steps.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import remat.thunder  # noqa: E402,F401  (compat bridge before Thunder)
from gpu_memory import RUN, build, make  # noqa: E402
from gpu_profile import kernel_union, trace_kernels  # noqa: E402


class RegionTimer:
    """Accumulates host time spent in remat's region callables (nvFuser's and Inductor's) and, inside
    nvFuser's, in ``nvfuser_direct.FusionDefinition.execute`` (the methods wrapped while the timer is active)."""

    def __init__(self):
        self.reset()
        self._restore = []

    def reset(self):
        self.calls = self.region_ns = self.execute_ns = 0

    def _wrap(self, cls, name, counter):
        original = getattr(cls, name)
        timer = self

        def timed(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                setattr(timer, counter, getattr(timer, counter) + time.perf_counter_ns() - start)
                if counter == "region_ns":
                    timer.calls += 1

        setattr(cls, name, timed)
        self._restore.append((cls, name, original))

    def __enter__(self):
        from remat import nvfuser

        from remat.thunder.inductor import InductorRegionCallable

        self._wrap(nvfuser.NvFuserRegionCallable, "__call__", "region_ns")
        self._wrap(InductorRegionCallable, "__call__", "region_ns")
        if nvfuser.available():
            import nvfuser_direct

            self._wrap(nvfuser_direct.FusionDefinition, "execute", "execute_ns")
        return self

    def __exit__(self, *exc):
        for cls, name, original in reversed(self._restore):
            setattr(cls, name, original)
        self._restore.clear()


def timed_step(fn, params, idx, targets, marks: bool = False) -> dict:
    """One step, synchronized like ``gpu_memory.step``, with host and GPU times per phase (ms)."""
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.record_function("phase::forward") if marks else _null():
        loss = fn(idx, targets)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    with torch.profiler.record_function("phase::backward") if marks else _null():
        loss.backward()
    t3 = time.perf_counter()
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    return dict(forward_call_ms=1e3 * (t1 - t0), forward_ms=1e3 * (t2 - t0), backward_call_ms=1e3 * (t3 - t2), backward_ms=1e3 * (t4 - t2), step_ms=1e3 * (t4 - t0))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def phase_timeline(chrome_trace: Path) -> dict:
    """Per phase (from the ``phase::*`` ranges): GPU busy, delay to the first kernel, idle inside the
    phase, and the five largest gaps (after which kernel, how long)."""
    events = json.loads(chrome_trace.read_text())["traceEvents"]
    # the host-side ranges: record_function also writes a GPU-side copy ("gpu_user_annotation") that
    # starts at the phase's first kernel
    phases = {
        e["name"].split("::")[1]: (e["ts"], e["ts"] + e["dur"])
        for e in events
        if str(e.get("name", "")).startswith("phase::") and "dur" in e and e.get("cat") != "gpu_user_annotation"
    }
    kernels = trace_kernels(events)
    result = {}
    ordered = sorted(phases.items(), key=lambda item: item[1][0])
    for i, (name, (start, _stop)) in enumerate(ordered):
        limit = ordered[i + 1][1][0] if i + 1 < len(ordered) else float("inf")
        mine = [k for k in kernels if start <= k[0] < limit]
        if not mine:
            continue
        busy, gaps = kernel_union(mine)
        gaps.sort(key=lambda g: -g[0])
        result[name] = dict(
            kernels=len(mine),
            busy_ms=busy / 1e3,
            first_kernel_delay_ms=(mine[0][0] - start) / 1e3,
            idle_between_kernels_ms=sum(g[0] for g in gaps) / 1e3,
            gaps_over_10us=sum(1 for g in gaps if g[0] > 10),
            largest_gaps=[dict(us=round(g[0], 1), after=g[1][:70], before=g[2][:70]) for g in gaps[:5]],
        )
    return result


#: CUDA runtime/driver calls that can make the host wait for the GPU (or for the driver) inside a step.
BLOCKING_CALLS = ("Synchronize", "Memcpy", "Malloc", "Free", "HostAlloc", "MemGetInfo")


def blocking_calls(chrome_trace: Path) -> dict:
    """From a profiled step run as a training loop runs it (no synchronization between forward and
    backward; the step's own final synchronize excluded): the CUDA runtime and driver calls that can
    block the host, by name: count, total host us, and when the first one started (ms from the step's
    start).  A wait here is GPU idle time that no kernel count shows."""
    events = json.loads(chrome_trace.read_text())["traceEvents"]
    step = [e for e in events if e.get("name") == "phase::step" and "dur" in e and e.get("cat") != "gpu_user_annotation"]
    if not step:
        return {}
    start, stop = step[0]["ts"], step[0]["ts"] + step[0]["dur"]
    calls: dict[str, dict] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or "dur" not in e or not start <= e["ts"] <= stop:
            continue
        if not any(word in name for word in BLOCKING_CALLS):
            continue
        entry = calls.setdefault(name, dict(count=0, host_us=0.0, first_ms=(e["ts"] - start) / 1e3))
        entry["count"] += 1
        entry["host_us"] = round(entry["host_us"] + e["dur"], 1)
    return calls


def evented_step(fn, params, idx, targets) -> dict:
    """A step as a training loop runs it, unprofiled, with CUDA events (ms from the step's start, on the GPU's
    clock): ``forward_done_ms`` when the forward's last kernel ended, ``step_gpu_ms`` when the backward's did;
    and on the host's clock ``forward_return_ms`` / ``backward_return_ms`` when each call returned.  Where
    ``step_gpu_ms`` is above the kernels' busy time plus the first kernel's delay, the GPU waited inside the
    step (the profiled ``unsynced`` timeline says where)."""
    for p in params:
        p.grad = None
    begin, forward_done, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    begin.record()
    loss = fn(idx, targets)
    forward_done.record()
    t1 = time.perf_counter()
    loss.backward()
    end.record()
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    return dict(
        forward_done_ms=begin.elapsed_time(forward_done),
        step_gpu_ms=begin.elapsed_time(end),
        forward_return_ms=1e3 * (t1 - t0),
        backward_return_ms=1e3 * (t2 - t0),
    )


#: The kernel that starts each step of :func:`marked_steps` (``torch.cuda._sleep``'s): a name no model's
#: kernels have.
MARKER_KERNEL = "spin_kernel"


def marked_steps(fn, params, idx, targets, steps: int, trace_file: Path) -> None:
    """``steps`` steps as a training loop runs them, each started (after a synchronize) by a tiny marker
    kernel, under a CUDA-only profile (no CPU-side tracing, so the host runs about as fast as unprofiled),
    exported to ``trace_file`` for :func:`step_gaps`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            unsynced_step(fn, params, idx, targets, around=_marker())
    prof.export_chrome_trace(str(trace_file))


@contextlib.contextmanager
def _marker():
    """Issues the marker kernel on entry: after the step's synchronize, so the GPU runs it at once."""
    torch.cuda._sleep(100)
    yield


def step_gaps(chrome_trace: Path) -> dict:
    """Where a step's GPU time goes, from :func:`marked_steps`'s trace (medians over its steps but the
    first, ms): ``first_kernel_wait_ms`` from the marker's end to the step's first kernel (the host's work
    before it: Thunder's cache check and prologue, Dynamo's guards), ``busy_ms`` (kernel time),
    ``idle_after_first_ms`` (the GPU idle between the first kernel and the last) and ``span_ms`` (marker to
    last kernel), plus ``kernels`` a step."""
    events = json.loads(chrome_trace.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"])
    steps: list[list[dict]] = []
    for k in kernels:
        if MARKER_KERNEL in k["name"]:
            steps.append([k])
        elif steps:
            steps[-1].append(k)
    steps = [s for s in steps[1:] if len(s) > 1]  # the first step may still warm caches
    if not steps:
        return {}
    first, busy, idle, span = [], [], [], []
    for marker, *body in steps:
        busy_us, gaps = kernel_union([(k["ts"], k["ts"] + k["dur"], k["name"]) for k in body])
        first.append(body[0]["ts"] - (marker["ts"] + marker["dur"]))
        busy.append(busy_us)
        idle.append(sum(g[0] for g in gaps))
        span.append(max(k["ts"] + k["dur"] for k in body) - marker["ts"])
    ms = lambda values: round(statistics.median(values) / 1e3, 4)  # noqa: E731
    return dict(first_kernel_wait_ms=ms(first), busy_ms=ms(busy), idle_after_first_ms=ms(idle), span_ms=ms(span), kernels=len(steps[0]) - 1, steps=len(steps))


def unsynced_step(fn, params, idx, targets, around=None) -> None:
    """A step as a training loop runs it (forward, then backward at once), inside ``around`` (a context
    manager; default: a ``phase::step`` profiler range), synchronized before and after, outside it."""
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    with torch.profiler.record_function("phase::step") if around is None else around:
        loss = fn(idx, targets)
        loss.backward()
    torch.cuda.synchronize()


@contextlib.contextmanager
def _sync_debug_warnings(caught: list):
    """``torch.cuda.set_sync_debug_mode("warn")`` while inside; the warnings it raised go to ``caught``."""
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
            caught.extend(recorded)


def sync_warnings(fn, params, idx, targets) -> list[str]:
    """What ``torch.cuda.set_sync_debug_mode("warn")`` reports during one unsynchronized step: each
    operation that synchronized the host with the GPU (first line of each distinct warning)."""
    caught: list = []
    unsynced_step(fn, params, idx, targets, around=_sync_debug_warnings(caught))
    seen: dict[str, int] = {}
    for w in caught:
        if "synchroniz" in str(w.message).lower():
            key = f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:120]}"
            seen[key] = seen.get(key, 0) + 1
    return [f"{count} x {key}" for key, count in seen.items()]


def thunder_host(fn) -> dict:
    import thunder

    try:
        cs = thunder.compile_stats(fn)
    except Exception:
        return {}
    if cs is None or not getattr(cs, "last_trace_host_stop", None):
        return {}

    def ms(start, stop):
        a, b = getattr(cs, start, None), getattr(cs, stop, None)
        return (b - a) / 1e6 if a and b and b >= a else None

    return dict(
        cache_ms=ms("last_trace_cache_start", "last_trace_cache_stop"),
        prologue_ms=ms("last_prologue_execution_start", "last_prologue_execution_stop"),
        computation_host_ms=ms("last_trace_host_execution_start", "last_trace_host_execution_stop"),
        thunder_call_ms=ms("last_trace_host_start", "last_trace_host_stop"),
    )


def run(args) -> None:
    from torch.profiler import ProfilerActivity, profile

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_host.jsonl"
    module, params, idx, targets = build(args.model, args.layers, args.seq, batch=args.batch)
    for mode in args.modes:
        gc.collect()
        torch.cuda.empty_cache()
        record = dict(model=args.model, layers=args.layers, seq=args.seq, batch=args.batch, mode=mode, run=RUN, device=torch.cuda.get_device_name())
        try:
            fn, _executor = make(mode, module)
            timed_step(fn, params, idx, targets)  # compiles
            timed_step(fn, params, idx, targets)
            samples, host = [], []
            timer = RegionTimer()
            with timer:
                for _ in range(args.steps):
                    timer.reset()
                    samples.append(timed_step(fn, params, idx, targets))
                    host.append(dict(thunder_host(fn), region_calls=timer.calls, region_host_ms=timer.region_ns / 1e6, execute_host_ms=timer.execute_ns / 1e6))
            for key in samples[0]:
                record[key] = statistics.median(s[key] for s in samples)
            for key in host[0]:
                values = [h[key] for h in host if h.get(key) is not None]
                if values:
                    record[key] = statistics.median(values)
            trace_file = out / f"host_{mode}.json"
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                record["profiled_step_ms"] = timed_step(fn, params, idx, targets, marks=True)["step_ms"]
            prof.export_chrome_trace(str(trace_file))
            record["phases"] = phase_timeline(trace_file)
            unsynced_file = out / f"host_{mode}_unsynced.json"
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                unsynced_step(fn, params, idx, targets)
            prof.export_chrome_trace(str(unsynced_file))
            record["blocking_calls"] = blocking_calls(unsynced_file)
            # where the GPU waited in that step (profiled: the host is slower than unprofiled)
            record["unsynced"] = phase_timeline(unsynced_file).get("step")
            evented = [evented_step(fn, params, idx, targets) for _ in range(args.steps)]
            record["unsynced_events"] = {key: statistics.median(e[key] for e in evented) for key in evented[0]}
            marked_file = out / f"host_{mode}_marked.json"
            marked_steps(fn, params, idx, targets, 8, marked_file)
            record["step_gaps"] = step_gaps(marked_file)
            record["sync_warnings"] = sync_warnings(fn, params, idx, targets)
            del fn
        except Exception:
            import traceback

            record["error"] = traceback.format_exc()[-2000:]
        print(json.dumps(record), flush=True)
        with log.open("a") as f:
            f.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--modes", nargs="+", default=["torch.compile", "thunder", "remat"])
    parser.add_argument("--out", default="gpu_host_out")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
