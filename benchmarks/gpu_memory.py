"""GPU benchmark: peak memory and step time of one training step, remat against its anchors.

Modes, all in one process on the same model and inputs: eager, torch.compile, Thunder default
(nvFuser + its rematerialization), Thunder with nvFuser linear (and matmul), remat (``remat.jit``,
cuDNN attention where it applies), ``remat-thunder-attention`` (remat's plan with Thunder's attention
kernels, to separate the two effects), ``remat-transposed-cat`` (the qkv-gradient cat left inside the
nvFuser region, see ``FusionPolicy.transposed_cat``), ``remat-independent-parts`` (a run of fusible
ops kept as one region even where it holds independent computations, as Thunder does, see
``FusionPolicy.independent_parts``), ``remat-no-linear`` (the default policy spelled out) and
``remat+cudagraphs`` (remat's trace under Thunder's ``CUDAGraphTransform``, which replays the step's
kernels as CUDA graphs to remove host overhead; its graphs keep a memory pool of their own) and
``remat-nosplit`` (Thunder's ``thunderfx_disable_split_autograd``: its autograd glue as one
``torch.autograd.Function`` instead of two, which spares a meta-device ``randn`` each way) and
``remat-inductor`` (remat's plan with its regions compiled by ``torch.compile``, Triton kernels, instead of
nvFuser: ``runtime="inductor"``) and ``remat-nohost`` / ``remat-inductor-nohost`` (the same with
``RecomputePolicy(host_recompute=False)``: every recomputation for a stand-alone backward reader in a
region of its own, as before hosting) and
``remat@0.8x-torch.compile-peak`` (remat with a memory budget of 0.8 x torch.compile's measured peak, the
most issue 18 lets remat use: the room above remat's default plan buys fewer kernels; list it after
``torch.compile``) and ``remat-graph`` (``runtime="inductor-graph"``: the planned forward and backward as
one Inductor graph each) and ``remat-graph:<variant>`` (that runtime with the settings of
``gpu_graph_memory.VARIANTS[variant]``, e.g. ``graph-as-traced``, the runtime before attention's inputs were
laid out token-major, to measure what one setting is worth in the same process).

Measured as ../shared/DESIGN.md says: bf16 LitGPT config, batch 1, vocab 512 (so logits do not set the
peak), loss = cross entropy inside the compiled module; gradients set to None before each step;
``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()`` minus memory allocated at step
start; "held" = ``torch.cuda.max_memory_reserved()`` during a step minus what was reserved before the
mode's first call (the device memory the mode takes, CUDA graph pools included, which "peak" misses:
they are reserved at capture); "saved" = memory allocated after the forward minus at step start; medians of ``--steps`` steps
after 2 warm-up steps.  Those steps synchronize between the forward and the backward (to read what the
forward leaves), so the GPU idles while the host starts the backward (Thunder's autograd glue: about
0.4 ms more than torch.compile's, docs/benchmarks.md); "step ms, one sync" times ``--steps`` more steps
without that synchronization, as a training loop runs them (only the step's end is synchronized).  Loss and gradients are compared with eager (bf16: relative norm error).

On the GPU machine:

    source .gpu/activate.sh; python benchmarks/gpu_memory.py --model stablecode-completion-alpha-3b --layers 2 --out $OUT

``--rounds R`` (issue 18: the 1-2% that decide its targets are the size of the drift between modes measured
minutes apart): after every mode has been compiled and measured, each mode's one-sync step is timed R - 1
times more, interleaved, in alternating order, without compiling again; ``step_ms_one_sync`` becomes the
median of the rounds, and the table's notes give each mode's ratio to torch.compile round by round.

Each mode's result is appended to ``--out/gpu_memory.jsonl`` as soon as it is measured (with rounds, once
more at the end, rounds included).  Back here,
``python benchmarks/gpu_memory.py --render FILE.jsonl [--write]`` prints the table (and puts it into
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import remat  # noqa: E402
import remat.thunder  # noqa: E402,F401  (its compat bridge lets Thunder 0.2.6 import nvFuser >= 0.2.34)
from remat.models import VOCAB, litgpt_model  # noqa: E402

MIB = 2**20
RUN = time.strftime("%Y-%m-%dT%H:%M", time.gmtime())  # one table group = one run: anchors and remat side by side
#: remat with a memory budget of 0.8 x torch.compile's measured peak (issue 18 keeps remat's peak at most
#: there): room above remat's default plan buys fewer kernels (remat.planning.budget); needs the
#: torch.compile mode measured earlier in the same run
AT_COMPILE_PEAK = "remat@0.8x-torch.compile-peak"
#: the same budget with runtime="inductor-graph" (remat's forward and backward each one Inductor graph)
GRAPH_AT_COMPILE_PEAK = "remat-graph@0.8x-torch.compile-peak"
#: ``remat-graph@<budget>``: the graph runtime with ``memory_budget=<budget>`` (a size such as ``10290MiB``,
#: torch.compile's peak in an earlier run, or a fraction); any such mode is accepted besides ``MODES``
#: and listed after them in the table (issue 15's contested point, profiled with ``gpu_profile.py``)
GRAPH_AT_BUDGET = "remat-graph@"
MODES = ("eager", "thunder", "remat", "remat-transposed-cat", "remat-independent-parts", "remat-thunder-attention", "remat-no-linear", "remat+cudagraphs", "remat-nosplit", "remat-inductor", "remat-nohost", "remat-inductor-nohost", "remat-value-copy", "remat-no-value-copy", "remat-graph", "remat-graph-transposed-cat", "remat-graph-nosplit", "remat-graph-prune", "remat-graph-thunderfx", "torch.compile", AT_COMPILE_PEAK, GRAPH_AT_COMPILE_PEAK, "thunder+linear", "thunder+linear+matmul")


def ordered(modes: dict) -> list[str]:
    """The modes of one table group in ``MODES`` order, then any others (``remat-graph@<budget>``) as measured."""
    return [m for m in MODES if m in modes] + [m for m in modes if m not in MODES]


def budget_of(mode: str) -> float | str:
    """The budget of a ``remat-graph@<budget>`` mode: a fraction as a float, else the text (a size)."""
    text = mode[len(GRAPH_AT_BUDGET) :]
    try:
        return float(text)
    except ValueError:
        return text


class WithLoss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        logits = self.model(idx)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def build(
    name: str, layers: int, seq: int, device: str = "cuda", batch: int = 1, vocab: int = VOCAB, width: str = "full", dtype=None
):
    """The measured setup: a bf16 LitGPT config with vocab 512 (``vocab``) and the loss inside, its
    trainable parameters, and one batch of token ids and targets (seeded).  ``width="demo"``: shrunk to
    n_embd 128, fp32 unless ``dtype`` says otherwise (``remat.models.litgpt_model``)."""
    model, idx = litgpt_model(name, layers, seq, batch=batch, device=device, vocab=vocab, width=width, dtype=dtype)  # seed 0; idx drawn right after the weights
    module = WithLoss(model)
    params = [p for p in module.parameters() if p.requires_grad]
    targets = torch.randint(0, vocab, (batch, seq), device=device)
    return module, params, idx, targets


def make(mode: str, module: torch.nn.Module, compile_peak_mib: float | None = None):
    import thunder

    from remat.thunder import nvfuser

    # each mode compiles its regions afresh: a first call must not reuse kernels an earlier mode built
    nvfuser.clear_shared_definitions()
    if mode == "eager":
        return module, None
    if mode == "torch.compile":
        return torch.compile(module), None
    if mode == "thunder":
        return thunder.jit(module), None
    if mode == "thunder+linear":
        return thunder.jit(module, nv_enable_linear=True), None
    if mode == "thunder+linear+matmul":
        return thunder.jit(module, nv_enable_linear=True, nv_enable_matmul=True), None
    if mode == "remat+cudagraphs":  # issue 18's host-overhead candidate: Thunder's CUDA graph transform over remat's trace
        from thunder.transforms.cudagraph import CUDAGraphTransform

        jitted = remat.jit(module, transforms=[CUDAGraphTransform()])
        return jitted, remat.executor_of(jitted)
    if mode in (AT_COMPILE_PEAK, GRAPH_AT_COMPILE_PEAK):
        if compile_peak_mib is None:
            raise ValueError(f"{mode} needs torch.compile measured first in the same run (put it before in --modes)")
        runtime = "inductor-graph" if mode == GRAPH_AT_COMPILE_PEAK else "auto"
        jitted = remat.jit(module, memory_budget=f"{int(0.8 * compile_peak_mib)}MiB", runtime=runtime)
        return jitted, remat.executor_of(jitted)
    if mode.startswith(GRAPH_AT_BUDGET):  # the graph runtime at a budget of its own (remat-graph@10290MiB, remat-graph@0.9)
        jitted = remat.jit(module, memory_budget=budget_of(mode), runtime="inductor-graph")
        return jitted, remat.executor_of(jitted)
    if mode == "remat-nosplit":  # Thunder's autograd glue in one Function (a meta randn less each way)
        jitted = remat.jit(module, thunderfx_disable_split_autograd=True)
        return jitted, remat.executor_of(jitted)
    if mode in ("remat-value-copy", "remat-no-value-copy"):  # attention's v in its own buffer (or not): q, k, v saved, no RoPE recomputation
        jitted = remat.jit(module, fusion=remat.FusionPolicy(attention_value_copy=mode == "remat-value-copy"))
        return jitted, remat.executor_of(jitted)
    if mode == "remat-graph":  # issue 18: remat's planned forward and backward each one Inductor graph
        jitted = remat.jit(module, runtime="inductor-graph")
        return jitted, remat.executor_of(jitted)
    if mode == "remat-graph-transposed-cat":  # the graph runtime with attention's q, k, v gradients concatenated in their region (cpu_graph_traffic.py)
        jitted = remat.jit(module, runtime="inductor-graph", fusion=remat.FusionPolicy(transposed_cat=True))
        return jitted, remat.executor_of(jitted)
    if mode == "remat-graph-nosplit":  # the graph runtime with Thunder's autograd glue in one Function (no meta randn either way)
        jitted = remat.jit(module, runtime="inductor-graph", thunderfx_disable_split_autograd=True)
        return jitted, remat.executor_of(jitted)
    if mode == "remat-graph-prune":  # the graph runtime without Thunder's checks of the module's members each call (PrunePrologueChecks)
        from thunder.transforms.prune_prologue_checks import PrunePrologueChecks

        jitted = remat.jit(module, runtime="inductor-graph", transforms=[PrunePrologueChecks()])
        return jitted, remat.executor_of(jitted)
    if mode == "remat-graph-thunderfx":  # ThunderFX, remat installed: Dynamo's guards instead of Thunder's checks of the module
        return _thunderfx_installed(module)
    if mode.startswith("remat-graph:"):  # the graph runtime under one of gpu_graph_memory.VARIANTS (what each constraint costs in time)
        from gpu_graph_memory import VARIANTS

        from remat.thunder.graph import InductorGraphTransform

        transform = InductorGraphTransform(**VARIANTS[mode.split(":", 1)[1]])
        jitted = remat.jit(module, runtime="inductor", transforms=[transform])
        return jitted, remat.executor_of(jitted)
    if mode == "remat-inductor":  # issue 18: Triton kernels for remat's regions
        jitted = remat.jit(module, runtime="inductor")
        return jitted, remat.executor_of(jitted)
    if mode in ("remat-nohost", "remat-inductor-nohost"):  # every recomputation for a stand-alone reader in a region of its own
        runtime = "inductor" if "inductor" in mode else "auto"
        jitted = remat.jit(module, recompute=remat.RecomputePolicy(host_recompute=False), runtime=runtime)
        return jitted, remat.executor_of(jitted)
    if mode == "remat-thunder-attention":  # remat's plan with Thunder's attention kernels (flash)
        jitted = remat.jit(module, attention="thunder")
        return jitted, remat.executor_of(jitted)
    if mode in ("remat", "remat-no-linear", "remat-transposed-cat", "remat-independent-parts"):
        fusion = {
            "remat": None,
            "remat-no-linear": remat.FusionPolicy(),
            "remat-transposed-cat": remat.FusionPolicy(transposed_cat=True),
            "remat-independent-parts": remat.FusionPolicy(independent_parts=True),
        }[mode]
        jitted = remat.jit(module, fusion=fusion)
        return jitted, remat.executor_of(jitted)
    raise ValueError(mode)


class _FirstCallExecutor:
    """The remat executor of the install a ThunderFX mode compiled under (known after its first call)."""

    def __init__(self):
        self.executor = None

    def __getattr__(self, name):
        return getattr(self.executor, name) if self.executor is not None else None


def _thunderfx_installed(module: torch.nn.Module):
    """``torch.compile(module, backend=ThunderCompiler())`` whose first call (where Dynamo hands Thunder its
    graph, forward and backward compiled) runs inside ``remat.install(runtime="inductor-graph")``, as a
    trainer you do not own would run under it; later calls keep remat (docs/api.md, ``remat.install``)."""
    from thunder.dynamo import ThunderCompiler

    backend = ThunderCompiler()
    compiled = torch.compile(module, backend=backend)
    executor = _FirstCallExecutor()

    def fn(*args):
        if executor.executor is not None:
            return compiled(*args)
        with remat.install(runtime="inductor-graph") as installed:
            executor.executor = installed.executors[-1]
            return compiled(*args)

    # what graph_paths reads: the Thunder functions ThunderFX compiled (one per graph Dynamo handed it)
    fn.thunder_fns = lambda: [f for info in backend.subgraph_infos for f in info.thunder_compiled_fns or ()]
    return fn, executor


def allocator_settings() -> dict:
    """``{"alloc_conf": ...}`` when ``PYTORCH_CUDA_ALLOC_CONF`` is set: it changes what a step holds
    (``held_mib``; expandable segments kept it within 5% of the peak on an H200, docs/memory-model.md)."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    return {"alloc_conf": conf} if conf else {}


def step(fn, params, idx, targets, phase_sync: bool = True):
    """One training step.  ``phase_sync``: synchronize between the forward and the backward too (to read
    what the forward left and its own peak); the GPU then idles while the host starts the backward, which a
    training loop that calls ``backward`` right after the forward hides behind the forward's kernels.
    Without it the figures of the forward are None."""
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    start_mem = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss = fn(idx, targets)
    after_forward = forward_peak = None
    if phase_sync:
        torch.cuda.synchronize()
        after_forward = torch.cuda.memory_allocated() - start_mem
        forward_peak = torch.cuda.max_memory_allocated() - start_mem
    loss.backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - start_mem
    # what the caching allocator held at most during the step, CUDA graph pools included (those are
    # reserved at capture and stay so: they are not in ``peak``, which counts from the step's start)
    held = torch.cuda.max_memory_reserved()
    # (loss, seconds, peak, what the forward left, held, the forward's own peak: where ``peak`` is higher,
    # the backward reached it)
    return loss.detach(), seconds, peak, after_forward, held, forward_peak


def grads_of(params):
    return [p.grad.detach().float().clone() if p.grad is not None else None for p in params]


def nvfuser_definitions() -> int:
    """FusionDefinitions built so far in this mode (regions of identical layers share one)."""
    from remat.thunder import nvfuser

    return nvfuser.shared_definitions()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / (b.norm() + 1e-12)).item()


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_memory.jsonl"
    module, params, idx, targets = build(args.model, args.layers, args.seq)
    eager_loss, eager_grads = None, None
    compile_peak_mib = None
    kept: list[tuple[dict, object]] = []  # --rounds: each measured mode's record and compiled function
    for mode in args.modes:
        for p in params:  # the previous mode's gradients: freed, not counted in this mode's start
            p.grad = None
        gc.collect()
        torch.cuda.empty_cache()
        reserved_at_start = torch.cuda.memory_reserved()  # the weights (and inputs), nothing cached
        record = dict(model=args.model, layers=args.layers, seq=args.seq, mode=mode, device=torch.cuda.get_device_name(), run=RUN, **allocator_settings())
        try:
            t0 = time.perf_counter()
            fn, remat_executor = make(mode, module, compile_peak_mib)
            loss, *_ = step(fn, params, idx, targets)  # compiles
            record["first_call_s"] = time.perf_counter() - t0
            grads = grads_of(params)
            if mode == "eager":
                eager_loss, eager_grads = loss.float(), grads
            elif eager_grads is not None:
                record["loss_rel_error"] = abs((loss.float() - eager_loss) / eager_loss).item()
                record["grad_rel_error"] = max(relative(g, e) for g, e in zip(grads, eager_grads) if e is not None)
            step(fn, params, idx, targets)  # warm-up
            samples = [step(fn, params, idx, targets) for _ in range(args.steps)]
            record["step_ms"] = 1e3 * statistics.median(s[1] for s in samples)
            # as a training loop runs it: no synchronization between the forward and the backward
            unsynced = [step(fn, params, idx, targets, phase_sync=False) for _ in range(args.steps)]
            record["step_ms_one_sync"] = 1e3 * statistics.median(s[1] for s in unsynced)
            record["peak_mib"] = statistics.median(s[2] for s in samples) / MIB
            record["saved_mib"] = statistics.median(s[3] for s in samples) / MIB
            record["held_mib"] = (statistics.median(s[4] for s in samples) - reserved_at_start) / MIB
            if mode == "torch.compile":
                compile_peak_mib = record["peak_mib"]
            if remat_executor is not None and remat_executor.last_result is not None:
                res = remat_executor.last_result
                regions = [b for b in res.trace.bound_symbols if b.sym.is_fusion]
                record["regions"] = len(regions)
                record["nvfuser_fallbacks"] = [b.sym.name for b in regions if getattr(b._call_ctx[b.sym.name], "failed", None)]
                record["region_backends"] = sorted({type(b._call_ctx[b.sym.name]).__name__ for b in regions})
                paths = [getattr(b._call_ctx[b.sym.name], "path", None) for b in regions]
                if any(paths):  # Inductor's regions: how each was called (direct, torch.compile, reference)
                    record["region_paths"] = {path: paths.count(path) for path in sorted(set(paths), key=str)}
                record["distinct_definitions"] = nvfuser_definitions()
                if paths_of_graphs := graph_paths(fn):  # whole-trace Inductor graphs: how each ran
                    record["graph_paths"] = paths_of_graphs
                record["plan_seconds"] = remat_executor.last_seconds
                record["estimated_peak_mib"] = res.after.peak_bytes / MIB
                record["estimated_saved_mib"] = res.after.saved_bytes / MIB
                record["notes"] = res.notes
                record["attention_ops"] = sorted({b.sym.name for b in res.trace.bound_symbols if "sdpa" in b.sym.name or "attention" in b.sym.name})
            if args.rounds > 1:
                kept.append((record, fn))
            del fn
        except Exception as exc:  # one broken mode must not lose the others
            record["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        emit(record, log)
    if kept:
        one_sync_rounds(kept, params, idx, targets, args.steps, args.rounds)
        for record, _ in kept:
            emit(record, log)  # again, with its rounds: the render keeps a mode's latest line of the run


def emit(record: dict, log: Path) -> None:
    """Prints ``record`` and appends it to ``log`` (a JSON line), as soon as it is measured."""
    print(json.dumps(record), flush=True)
    with log.open("a") as f:
        f.write(json.dumps(record) + "\n")


def one_sync_rounds(kept: list[tuple[dict, object]], params, idx, targets, steps: int, rounds: int) -> None:
    """``--rounds``: after every mode was compiled and measured, time each again ``rounds - 1`` times,
    ``steps`` one-sync steps a round (after a warm-up step), interleaved, the order reversed every other
    round, so that the GPU's drift over the run (clocks, temperature) falls on every mode alike.  Each
    record gets ``step_ms_one_sync_rounds`` (the first measurement first) and ``step_ms_one_sync``, their
    median; ``step_ms_one_sync_first_round`` keeps what a run without rounds reports."""
    time_one = lambda i: median_step_ms(kept[i][1], params, idx, targets, steps, phase_sync=False)  # noqa: E731
    for (record, _), later in zip(kept, interleaved_rounds(len(kept), rounds, time_one)):
        fold_rounds(record, "step_ms_one_sync", later)


def median_step_ms(fn, params, idx, targets, steps: int, phase_sync: bool = True) -> float:
    """One more round of a compiled mode: a warm-up step, then the median of ``steps`` steps, in ms."""
    gc.collect()
    step(fn, params, idx, targets, phase_sync=phase_sync)  # warm-up
    return 1e3 * statistics.median(step(fn, params, idx, targets, phase_sync=phase_sync)[1] for _ in range(steps))


def fold_rounds(record: dict, key: str, later: list[float]) -> None:
    """``record[key]`` (the first round) with ``later`` rounds: ``<key>_rounds`` all of them,
    ``<key>_first_round`` what a run without rounds reports, ``key`` their median.  Shared with gpu_budget.py."""
    record[f"{key}_first_round"] = record[key]
    record[f"{key}_rounds"] = [record[key], *later]
    record[key] = statistics.median(record[f"{key}_rounds"])


def interleaved_rounds(count: int, rounds: int, time_one) -> list[list[float]]:
    """Rounds 2 to ``rounds`` of ``count`` modes (the first is each mode's own measurement): every round
    times every mode once (``time_one(i)``), the order reversed every other round so that a drift of the
    GPU falls on all modes alike.  One list of times per mode.  Shared with gpu_budget.py."""
    times: list[list[float]] = [[] for _ in range(count)]
    for round_index in range(1, rounds):
        for i in list(range(count))[:: -1 if round_index % 2 else 1]:
            times[i].append(time_one(i))
    return times


def round_ratios(record: dict, base: dict) -> list[float] | None:
    """``record``'s one-sync step over ``base``'s, round by round (the same round of one run: what the
    GPU's drift touches alike), or None without rounds of the same count."""
    mine, theirs = record.get("step_ms_one_sync_rounds"), base.get("step_ms_one_sync_rounds")
    if not mine or not theirs or len(mine) != len(theirs) or record.get("run") != base.get("run"):
        return None
    return [a / b for a, b in zip(mine, theirs)]


def _held(record: dict) -> str:
    return f"{record['held_mib']:.1f}" if "held_mib" in record else "-"


def render(path: str) -> str:
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    # each (config, layers, seq) shows the modes of its latest run only, so every ratio compares
    # measurements of one process (records from before runs were labelled have run "")
    latest: dict[tuple, str] = {}
    for r in records:
        key = (r["model"], r["layers"], r["seq"])
        latest[key] = max(latest.get(key, ""), r.get("run", ""))
    groups: dict[tuple, dict] = {}
    for r in records:
        key = (r["model"], r["layers"], r["seq"])
        if r.get("run", "") == latest[key]:
            groups.setdefault(key, {})[r["mode"]] = r
    groups = dict(sorted(groups.items(), key=lambda item: (item[0][1], item[0][0] != "stablecode-completion-alpha-3b", item[0][0])))
    lines = [
        "| config | layers | mode | step ms | peak MiB | held MiB | saved MiB | peak x Thunder | step x Thunder | step x torch.compile | step ms, one sync | x torch.compile, one sync | first call s | first call x Thunder | loss / grad rel. error vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (model, layers, seq), modes in groups.items():
        thunder = modes.get("thunder", {})
        compiled = modes.get("torch.compile", {})
        for mode in ordered(modes):
            r = modes.get(mode)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {model} | {layers} | {mode} | failed: {r['error'][:80]} | | | | | | | | | | | |")
                continue

            def ratio(key, base):
                return f"{r[key] / base[key]:.3f}" if base.get(key) else "-"

            # '-': eager itself, or a run without an eager row to compare with
            errors = "-" if mode == "eager" or "loss_rel_error" not in r else f"{r['loss_rel_error']:.1e} / {r.get('grad_rel_error', float('nan')):.1e}"
            name = f"**{mode}**" if mode.startswith("remat") else mode
            first_call = f"{r['first_call_s']:.1f} | {ratio('first_call_s', thunder)}" if "first_call_s" in r else "- | -"
            one_sync = f"{r['step_ms_one_sync']:.2f}" if "step_ms_one_sync" in r else "-"  # '-': runs before that column
            lines.append(
                f"| {model} | {layers} | {name} | {r['step_ms']:.2f} | {r['peak_mib']:.1f} | {_held(r)} | {r['saved_mib']:.1f} "
                f"| {ratio('peak_mib', thunder)} | {ratio('step_ms', thunder)} | {ratio('step_ms', compiled)} "
                f"| {one_sync} | {ratio('step_ms_one_sync', compiled) if 'step_ms_one_sync' in r else '-'} "
                f"| {first_call} | {errors} |"
            )
    notes = []
    for (model, layers, seq), modes in groups.items():
        for remat_mode in [m for m in ordered(modes) if m.startswith("remat")]:
            r = modes.get(remat_mode)
            if r and "error" not in r:
                notes.append(
                    f"- {remat_mode} on {model} x{layers}: {r.get('regions')} regions, nvFuser fallbacks: "
                    f"{r.get('nvfuser_fallbacks') or 'none'}; attention: {', '.join(r.get('attention_ops', [])) or '?'}; "
                    f"plan + fusion {r.get('plan_seconds', 0):.2f} s; estimated peak {r.get('estimated_peak_mib', 0):.1f} MiB, "
                    f"estimated saved {r.get('estimated_saved_mib', 0):.1f} MiB (memory model); "
                    + (f"{r['distinct_definitions']} distinct nvFuser definitions (regions of identical layers share one); " if r.get("distinct_definitions") else "")
                    + ("Inductor regions called " + ", ".join(f"{path}: {n}" for path, n in r["region_paths"].items()) + "; " if r.get("region_paths") else "")
                    + "; ".join(r.get("notes", []))
                )
    for (model, layers, seq), modes in groups.items():
        compiled = modes.get("torch.compile", {})
        for mode in ordered(modes):
            r = modes.get(mode)
            ratios = round_ratios(r, compiled) if r and mode != "torch.compile" and "error" not in r else None
            if ratios:
                notes.append(
                    f"- {mode} on {model} x{layers}, one-sync step x torch.compile's round by round ({len(ratios)} interleaved rounds): "
                    + ", ".join(f"{x:.3f}" for x in ratios)
                    + f"; median {statistics.median(ratios):.3f}, at most 1.000 in {sum(x <= 1.0 for x in ratios)} of {len(ratios)}"
                )
    for (model, layers, seq), modes in groups.items():
        run = next(iter(modes.values())).get("run")
        notes.append(f"- {model} x{layers}: all rows from one run, " + (f"started {run} UTC" if run else "an earlier one, with the code before FusionPolicy.transposed_cat (run labels came with it)"))
    if any("remat+cudagraphs" in modes for modes in groups.values()):
        notes.append(
            "- remat+cudagraphs: its peak is not comparable with the other rows: the CUDA graphs' memory pool is "
            "allocated when the graphs are captured (first call) and stays allocated, so most of the step's "
            "memory is already counted at step start and not in the peak above it; *held* (below) counts it"
        )
    if any("held_mib" in r for modes in groups.values() for r in modes.values()):
        notes.append(
            "- held MiB: the most the caching allocator reserved during a step (CUDA graph pools included) minus what "
            "it reserved before the mode's first call (the weights): the device memory the step takes from others, "
            "comparable across every mode; above peak by the allocator's caching and fragmentation ('-': a run before "
            "this column)"
        )
    device = records[0].get("device", "GPU") if records else "GPU"
    header = f"Measured on {device}, bf16, batch 1, seq {records[0]['seq'] if records else '?'}, vocab 512, loss inside the compiled module."
    return "\n".join([header, "", *lines, "", *notes])


def graph_paths(fn) -> list[str]:
    """How each whole-trace Inductor graph of ``remat.jit(runtime="inductor-graph")`` ran ("inductor" or
    "fallback"), forward first; empty for other runtimes.  ``fn`` is a Thunder function, or the ThunderFX
    wrapper of :func:`_thunderfx_installed` (each Thunder function it compiled, in turn)."""
    import thunder

    return [
        b._call_ctx[b.sym.name].path
        for thunder_fn in (fn.thunder_fns() if hasattr(fn, "thunder_fns") else [fn])
        for t in (thunder.last_traces(thunder_fn)[-1], thunder.last_backward_traces(thunder_fn)[-1])
        for b in t.bound_symbols
        if b.sym.name.startswith("remat_graph")
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stablecode-completion-alpha-3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--rounds", type=int, default=1,
                        help="after every mode is measured, time each mode's one-sync step again, this many rounds in all, interleaved "
                        "(step_ms_one_sync becomes their median; the table's notes give the ratio to torch.compile round by round)")
    parser.add_argument("--out", default="out")
    parser.add_argument("--render", help="print the table of a gpu_memory.jsonl instead of measuring")
    parser.add_argument("--write", action="store_true", help="with --render: put the table into docs/benchmarks.md")
    args = parser.parse_args()
    if args.render:
        markdown = render(args.render)
        print(markdown)
        if args.write:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from plan_cpu import write_section

            write_section(markdown + "\n\nCommand: `source .gpu/activate.sh; python benchmarks/gpu_memory.py --model <config> --layers <N> --steps 10 --modes <modes> --out $OUT` on the GPU machine; raw records: `benchmarks/results/gpu_memory_h200.jsonl`; table: `python benchmarks/gpu_memory.py --render benchmarks/results/gpu_memory_h200.jsonl --write`.", marker="gpu_memory", heading="Training step on the GPU (measured)")
        return
    run(args)


if __name__ == "__main__":
    main()
