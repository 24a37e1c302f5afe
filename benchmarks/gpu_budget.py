"""GPU benchmark: memory budgets, remat's against torch.compile's, measured in one process (issue 15).

One bf16 LitGPT model at a setting where activations are most of the peak (default: Llama-2-7b-hf,
2 layers, batch 4, seq 8192, vocab 512, loss inside the compiled module), trained one step at a time
with, in one process and on the same weights and batch:

* eager PyTorch (the reference for the gradients) and Thunder's default (nvFuser + its rematerialization);
* ``remat.jit(module, memory_budget=f)`` for ``f`` in ``--fractions`` (a fraction of remat's *default
  plan's* estimated peak, docs/api.md) and ``"min"`` (a budget of one byte: the lowest plan remat
  finds, with the warning that the budget is not reachable);
* ``torch.compile(module)`` with ``torch._functorch.config.activation_memory_budget = f`` for the same
  fractions, plus ``--extra-compile-fractions`` (its own low end), each compiled afresh
  (``torch._dynamo.reset()``, Inductor's and AOTAutograd's caches off so that a budget cannot reuse
  another budget's partition).

Each mode: peak = ``torch.cuda.max_memory_allocated()`` over the step minus what was allocated at its
start (weights; gradients are set to None before each step), step time = median of ``--steps`` steps
after one warm-up, gradients' relative error against eager (bf16).  For remat also its own estimate
(the memory model's peak of the trace it ran) and the extra FLOPs the plan recomputes.  Modes run in
the order of the fractions, the two systems alternating, so a run cut short still pairs them.

On the GPU machine (one command; about 6 minutes for the default model):

    source .gpu/activate.sh; python benchmarks/gpu_budget.py --model Llama-2-7b-hf --layers 2 --out $OUT

``--runtime auto inductor`` measures each remat row twice in the same process, its regions run by nvFuser
and by Inductor (``remat.jit(..., runtime=...)``); the table, the checks and the plot show
``remat (inductor)`` as a system of its own.  ``inductor-graph`` (remat's whole forward and backward each
one Inductor graph) is a third; its records say how each graph ran (``graph_paths``).  Any runtime with
the suffix ``+prune`` (``inductor-graph+prune``) runs with Thunder's ``PrunePrologueChecks`` as well
(docs/api.md, "Recipe: less host time before the first kernel"), a system of its own again; the suffix
``+transposed-cat`` with ``FusionPolicy(transposed_cat=True)`` (``cpu_graph_traffic.py`` says why), the
suffix ``+aten-loss-gradient`` with ``FusionPolicy(loss_gradient=False)`` (the loss gradient as aten's op
between regions, as before remat fused it), the suffix ``+fused-loss-gradient`` with
``FusionPolicy(loss_gradient=True)`` (fused on nvFuser too, where ``"auto"`` keeps aten's op), the suffix
``+target-reads`` with ``FusionPolicy(target_reads=True)`` (nll_loss's read at the targets as a row
reduction; the default ``"auto"`` does it except under nvFuser), ``+gathered-targets`` with
``target_reads=False`` (Thunder's gather); and for ``inductor-graph`` only, ``+no-donation`` with
``InductorGraphTransform(donate_dying_inputs=False)`` (every region output in a buffer of its own) and
``+head-major`` with ``token_major_attention=False`` (attention's operands as their regions lay them out);
suffixes combine (``inductor-graph+transposed-cat+prune``).

``--vocab V`` (default 512) sets the model's vocabulary: at a real one (32000) the logits, their float32
log-softmax and its gradient set the peak at the start of the backward.

``--rounds R`` (default 1) fights the drift of the GPU over a sweep (clocks, temperature: torch.compile's
0.9-0.6 budgets, one and the same partition, measured 80.6-82.7 ms in one H100 sweep): after every mode has
been compiled and measured once, each is timed R - 1 times more, interleaved, in alternating order, without
compiling again (each torch.compile budget is its own backend, so Dynamo keeps all of them; each record
says whether anything recompiled).  A record's ``step_ms`` is then the median of its rounds
(``step_ms_rounds``), and the checks say in how many rounds each torch.compile point was dominated.

``--at-compile-peak-shares 1.0 0.8`` gives remat, after each torch.compile row of ``--at-compile-peaks``,
0.8 x that row's measured peak as well (budget label ``0.8 x peak of torch.compile 1.0``): issue 18 asks
for remat's step at most 1.00 x torch.compile's at most 0.80 x its memory, and the checks give that ratio
for each such row (round by round with ``--rounds``).

Each mode's record is appended to ``--out/gpu_budget.jsonl`` as soon as it is measured (with rounds, once
more at the end, rounds included).  Back here,
``python benchmarks/gpu_budget.py --render FILE.jsonl [--write]`` prints the table and the checks of
issue 15 (remat's measured peak monotone in the budget and within 5% of its estimate; every
torch.compile point dominated by some remat point) and draws peak against step time
(docs/images/gpu_budget_<model>.png, one line per system).
"""

from __future__ import annotations

import argparse
import functools
import gc
import dataclasses
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MIB = 2**20
RUN = time.strftime("%Y-%m-%dT%H:%M", time.gmtime())
FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
EXTRA_COMPILE_FRACTIONS = (0.2, 0.0)
ESTIMATE_TOLERANCE = 0.05  # issue 15: measured peak within 5% of remat's estimate


def build(name: str, layers: int, seq: int, batch: int, vocab: int):
    """gpu_memory's setup (bf16, loss inside, seed 0) at ``batch`` sequences of a ``vocab``-token vocabulary."""
    from gpu_memory import build as build_setup

    return build_setup(name, layers, seq, batch=batch, vocab=vocab)


#: remat rows given torch.compile's measured peak at these ``activation_memory_budget`` fractions as its
#: budget (bytes above the default plan's peak buy fewer kernels, :mod:`remat.planning.budget`)
AT_COMPILE_PEAKS = (1.0,)
#: the budget label of such a row, before the measured peak replaces it
AT_PEAK_PREFIX = "peak of torch.compile "
#: between a share and AT_PEAK_PREFIX in the label of a row given a share of torch.compile's peak
#: ("0.8 x peak of torch.compile 1.0": issue 18 asks for remat's step at <= 0.80 x torch.compile's memory)
SHARE_SEP = " x "


def at_peak_label(fraction: float, share: float = 1.0) -> str:
    """The budget label of remat at ``share`` x torch.compile's measured peak at ``fraction``."""
    label = f"{AT_PEAK_PREFIX}{fraction}"
    return label if share == 1.0 else f"{share}{SHARE_SEP}{label}"


def parse_at_peak(label) -> tuple[str, float] | None:
    """(torch.compile's fraction as text, share) of an :func:`at_peak_label`; None for any other budget."""
    if not isinstance(label, str):
        return None
    share, sep, rest = label.partition(SHARE_SEP)
    if not sep:
        share, rest = "1.0", label
    if not rest.startswith(AT_PEAK_PREFIX):
        return None
    return rest[len(AT_PEAK_PREFIX):], float(share)


def modes(
    fractions: tuple[float, ...],
    extra_compile: tuple[float, ...],
    at_compile_peaks: tuple[float, ...] = AT_COMPILE_PEAKS,
    peak_shares: tuple[float, ...] = (1.0,),
) -> list[tuple[str, float | str | None]]:
    """(system, budget) in measuring order: the anchors, then both systems at each fraction (and remat at
    each of ``peak_shares`` x torch.compile's measured peak right after that torch.compile row, for
    ``at_compile_peaks``)."""
    order: list[tuple[str, float | str | None]] = [("eager", None), ("thunder", None)]
    for fraction in fractions:
        order += [("remat", fraction), ("torch.compile", fraction)]
        if fraction in at_compile_peaks:
            order += [("remat", at_peak_label(fraction, share)) for share in peak_shares]
    order.append(("remat", "min"))
    order += [("torch.compile", fraction) for fraction in extra_compile]
    return order


#: A ``--runtime`` suffix: that runtime with Thunder's ``PrunePrologueChecks`` (no checks of the module's
#: members each call), e.g. ``inductor-graph+prune``: a remat system of its own in the tables.
PRUNED = "+prune"
#: A ``--runtime`` suffix: remat with ``FusionPolicy(transposed_cat=True)`` (attention's q, k, v gradients
#: concatenated in the region that computes them; fewer kernels and bytes under the graph runtime on the
#: CPU, ``cpu_graph_traffic.py``).  Suffixes combine: ``inductor-graph+transposed-cat+prune``.
TRANSPOSED_CAT = "+transposed-cat"
#: A ``--runtime`` suffix: remat with ``FusionPolicy(loss_gradient=False)``, the loss gradient as aten's
#: ``nll_loss_backward`` between regions (remat before it fused that gradient; matters at a real ``--vocab``).
ATEN_LOSS_GRADIENT = "+aten-loss-gradient"
#: A ``--runtime`` suffix: remat with ``FusionPolicy(loss_gradient=True)``, the loss gradient fused on every
#: runtime (``"auto"``, the default, keeps aten's op where regions run on nvFuser).
FUSED_LOSS_GRADIENT = "+fused-loss-gradient"
#: A ``--runtime`` suffix: remat with ``FusionPolicy(target_reads=True)``, nll_loss's read of the
#: log-probabilities at the targets as a row reduction, not a gather from a padded copy.
TARGET_READS = "+target-reads"
#: A ``--runtime`` suffix: remat with ``FusionPolicy(target_reads=False)``, Thunder's gather from a padded copy.
GATHERED_TARGETS = "+gathered-targets"
#: A ``--runtime`` suffix of ``inductor-graph``: the graph runtime without donation
#: (``InductorGraphTransform(donate_dying_inputs=False)``): every region output in a buffer of its own.
NO_DONATION = "+no-donation"
#: A ``--runtime`` suffix of ``inductor-graph``: attention's query, key and value left in the layout their
#: region gives them (``InductorGraphTransform(token_major_attention=False)``), not token by token.
HEAD_MAJOR = "+head-major"
#: The suffixes that set an ``InductorGraphTransform`` argument, and what they set
GRAPH_SUFFIXES = {NO_DONATION: {"donate_dying_inputs": False}, HEAD_MAJOR: {"token_major_attention": False}}
#: The suffixes that set a ``FusionPolicy`` field, and what they set (they add up, the last one winning)
FUSION_SUFFIXES = {
    TRANSPOSED_CAT: {"transposed_cat": True},
    ATEN_LOSS_GRADIENT: {"loss_gradient": False},
    FUSED_LOSS_GRADIENT: {"loss_gradient": True},
    TARGET_READS: {"target_reads": True},
    GATHERED_TARGETS: {"target_reads": False},
}


def runtime_options(runtime: str) -> tuple[str, dict]:
    """A ``--runtime`` value as remat's ``runtime=`` and the ``remat.jit`` options its suffixes add."""
    import remat

    base, *suffixes = runtime.split("+")
    options: dict = {"transforms": []}
    graph_arguments: dict = {}
    for suffix in ("+" + s for s in suffixes):
        if suffix == PRUNED:  # docs/api.md, "Recipe: less host time before the first kernel"
            from thunder.transforms.prune_prologue_checks import PrunePrologueChecks

            options["transforms"].append(PrunePrologueChecks())
        elif suffix in FUSION_SUFFIXES:
            options["fusion"] = dataclasses.replace(options.get("fusion", remat.FusionPolicy()), **FUSION_SUFFIXES[suffix])
        elif suffix in GRAPH_SUFFIXES and base == "inductor-graph":
            graph_arguments.update(GRAPH_SUFFIXES[suffix])
        else:
            known = ", ".join((PRUNED, *FUSION_SUFFIXES, *(f"{s} (inductor-graph only)" for s in GRAPH_SUFFIXES)))
            raise ValueError(f"unknown --runtime suffix {suffix} for {base} (known: {known})")
    if graph_arguments:  # the graph runtime spelled out: Inductor regions and a graph transform of one's own
        from remat.thunder.graph import InductorGraphTransform

        base = "inductor"
        options["transforms"].append(InductorGraphTransform(**graph_arguments))
    if not options["transforms"]:
        del options["transforms"]
    return base, options


def make(system: str, budget, module, runtime: str = "auto"):
    import torch

    import remat

    if system == "eager":
        return module, None
    if system == "thunder":
        import thunder

        return thunder.jit(module), None
    if system == "remat":
        from remat.thunder import nvfuser

        nvfuser.clear_shared_definitions()  # each row's first call compiles its own kernels
        runtime, options = runtime_options(runtime)
        jitted = remat.jit(module, memory_budget="1B" if budget == "min" else budget, runtime=runtime, **options)
        return jitted, remat.executor_of(jitted)
    if system == "torch.compile":
        # Inductor as torch.compile's default backend, with the budget in force while AOTAutograd partitions
        # (on the first call); a backend of its own per budget keeps each budget's compiled graph in Dynamo's
        # cache beside the others (its entries are per backend), so --rounds can call every row again
        return torch.compile(module, backend=functools.partial(inductor_at_budget, float(budget))), None
    raise ValueError(system)


def inductor_at_budget(budget: float, graph_module, example_inputs):
    """torch.compile's default backend (Inductor) with ``activation_memory_budget = budget`` while it
    partitions the joint graph: the forward's compilation, where AOTAutograd partitions forward and backward."""
    import torch._functorch.config
    from torch._inductor.compile_fx import compile_fx

    with torch._functorch.config.patch(activation_memory_budget=budget):
        return compile_fx(graph_module, example_inputs)


def measure(system: str, budget, module, params, idx, targets, steps: int, eager_grads, runtime: str = "auto") -> tuple[dict, list, object]:
    """One mode's record, its gradients, and the compiled function (kept for --rounds)."""
    import torch
    from gpu_memory import grads_of, graph_paths, relative, step

    record: dict = {}
    for p in params:  # the previous mode's gradients are not this mode's memory (each mode starts empty)
        p.grad = None
    gc.collect()
    torch.cuda.empty_cache()
    reserved_at_start = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn, remat_executor = make(system, budget, module, runtime)
        if system == "remat" and runtime.startswith("inductor"):
            # regions run under no_grad (no partitioner, no budget in play): Inductor's FX-graph cache only
            # lets identical layers' regions share kernels, as they do by default; later inductor rows of a
            # run also find earlier rows' kernels there, so their first call is not a cold compile
            with torch._inductor.config.patch(fx_graph_cache=True):
                step(fn, params, idx, targets)
        else:
            step(fn, params, idx, targets)
    record["first_call_s"] = time.perf_counter() - t0
    record["warnings"] = sorted({str(w.message)[:300] for w in caught if "remat" in type(w.message).__module__ or "budget" in str(w.message)})
    grads = grads_of(params)
    if eager_grads is not None:
        record["grad_rel_error"] = max(relative(g, e) for g, e in zip(grads, eager_grads) if e is not None)
    step(fn, params, idx, targets)  # warm-up
    samples = [step(fn, params, idx, targets) for _ in range(steps)]
    record["step_ms"] = 1e3 * statistics.median(s[1] for s in samples)
    record["peak_mib"] = statistics.median(s[2] for s in samples) / MIB
    record["peak_spread_mib"] = (max(s[2] for s in samples) - min(s[2] for s in samples)) / MIB
    record["saved_mib"] = statistics.median(s[3] for s in samples) / MIB
    # device memory the step holds (the allocator's reserved peak, CUDA graph pools included; gpu_memory.step)
    record["held_mib"] = (statistics.median(s[4] for s in samples) - reserved_at_start) / MIB
    if remat_executor is not None and remat_executor.last_result is not None:
        result = remat_executor.last_result
        record["estimated_peak_mib"] = result.after.peak_bytes / MIB
        record["estimated_saved_mib"] = result.after.saved_bytes / MIB
        record["extra_tflop"] = result.extra_flops / 1e12
        record["step_tflop"] = result.step_flops / 1e12
        record["chosen"] = result.chosen
        record["notes"] = result.notes
        if runtime.split("+")[0] == "inductor-graph":  # the base runtime, without its suffixes
            record["graph_paths"] = graph_paths(fn)
    return record, grads, fn


def compilations(fn) -> int:
    """How often ``fn`` has compiled so far: Thunder's cache misses for Thunder functions, Dynamo's
    unique graphs (all of them) otherwise; a round that raises it did not time what was measured first."""
    import thunder
    from torch._dynamo.utils import counters

    try:
        return thunder.cache_misses(fn)
    except Exception:  # not a Thunder function: eager (never compiles) or torch.compile
        return counters["stats"]["unique_graphs"]


def add_rounds(records: list[dict], timings: list[list[float]], recompiled: list[bool]) -> None:
    """Fold the rounds into each record: ``step_ms_rounds`` (round 1 is the first measurement), ``step_ms``
    their median, ``step_ms_first_round`` what the single-round form reports, ``recompiled_in_rounds``."""
    from gpu_memory import fold_rounds

    for record, times, again in zip(records, timings, recompiled):
        fold_rounds(record, "step_ms", times)
        record["recompiled_in_rounds"] = again


def run(args) -> None:
    import torch
    import torch._functorch.config
    import torch._inductor.config

    import remat.thunder  # noqa: F401  (its compat bridge lets Thunder 0.2.6 import nvFuser >= 0.2.34)
    from gpu_memory import allocator_settings, emit

    for config, name in ((torch._inductor.config, "fx_graph_cache"), (torch._functorch.config, "enable_autograd_cache")):
        if hasattr(config, name):  # a cached partition of another budget must not be reused
            setattr(config, name, False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_budget.jsonl"
    module, params, idx, targets = build(args.model, args.layers, args.seq, args.batch, args.vocab)
    eager_grads = None
    started = time.perf_counter()
    compile_peaks: dict[str, float] = {}  # fraction (as text) -> torch.compile's measured peak, MiB
    kept: list[tuple[dict, object]] = []  # --rounds: each measured mode's record and compiled function
    if args.rounds > 1:  # one Dynamo cache entry per torch.compile budget (each its own backend)
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)

    for system, budget in modes(tuple(args.fractions), tuple(args.extra_compile_fractions), tuple(args.at_compile_peaks), tuple(args.at_compile_peak_shares)):
        if args.only and f"{system}:{budget}" not in args.only and system not in args.only:
            continue
        budget_from = None
        at_peak = parse_at_peak(budget)
        if at_peak is not None:
            peak = compile_peaks.get(at_peak[0])
            if peak is None:
                continue  # that torch.compile row was not measured
            budget_from, budget = budget, f"{int(peak * at_peak[1])}MiB"  # rounded down: remat may not exceed it
        if time.perf_counter() - started > args.deadline:
            print(json.dumps(dict(system=system, budget=budget, skipped=f"past --deadline {args.deadline:.0f} s")), flush=True)
            continue
        record = dict(
            model=args.model, layers=args.layers, seq=args.seq, batch=args.batch, vocab=args.vocab, system=system, budget=budget,
            device=torch.cuda.get_device_name(), run=RUN, **allocator_settings(),
        )
        if budget_from is not None:
            record["budget_from"] = budget_from
        base = record
        for runtime in args.runtime if system == "remat" else [None]:
            record = base if runtime is None else dict(base, runtime=runtime)
            try:
                measured, grads, fn = measure(system, budget, module, params, idx, targets, args.steps, eager_grads, runtime or "auto")
                record.update(measured)
                if system == "eager":
                    eager_grads = grads
                if system == "torch.compile":
                    compile_peaks[str(budget)] = measured["peak_mib"]
                if args.rounds > 1:
                    kept.append((record, fn))
                del fn
            except Exception as exc:  # one broken mode must not lose the others
                record["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            if args.rounds == 1:  # with rounds, Dynamo's cache keeps each torch.compile budget's graph
                torch._dynamo.reset()
            emit(record, log)
    if kept:
        # the drift of the GPU over a sweep (clocks, temperature) is as large as the differences measured:
        # every mode again, interleaved, the order reversed every other round
        from gpu_memory import interleaved_rounds, median_step_ms

        before = [compilations(fn) for _, fn in kept]
        timings = interleaved_rounds(len(kept), args.rounds, lambda i: median_step_ms(kept[i][1], params, idx, targets, args.steps))
        recompiled = [compilations(fn) != b for (_, fn), b in zip(kept, before)]
        add_rounds([r for r, _ in kept], timings, recompiled)
        for record, _ in kept:
            emit(record, log)  # the same mode again, with its rounds: latest_group keeps this line


# ------------------------------------------------------------------------------------------------ render
def _order(budget, default_mib: float | None = None) -> float:
    """Sort key: anchors first, then budgets falling, the lowest plan ("min") last.  A fraction is of
    remat's default plan's estimated peak: with that peak (``default_mib``, the ``1.0`` row's estimate)
    sizes such as "7894MiB" sort among the fractions by their bytes; without it a size is taken as above
    the default plan (what a share of torch.compile's peak usually is) and sorts before every fraction."""
    if budget is None:
        return -math.inf
    if budget == "min":
        return math.inf
    if isinstance(budget, str) and budget.endswith("MiB"):
        mib = float(budget[:-3])
        return -mib if default_mib else -1e12 - mib
    return -float(budget) * (default_mib or 1.0)


def default_row(records: list[dict]) -> dict | None:
    """The measured row of remat's default plan (budget ``1.0``): nvFuser's, else another runtime's (every
    runtime plans the same); None without one."""
    defaults = [r for r in records if r["system"] == "remat" and r["budget"] == 1.0 and "peak_mib" in r]
    return next((r for r in defaults if variant(r) == "remat"), defaults[0] if defaults else None)


def outdated(records: list[dict]) -> list[dict]:
    """remat rows whose estimated peak is below that of the lowest plan remat now reaches (the latest
    "min" row): plans of an earlier layout that the current code no longer makes.  Until 2026-12-03 the
    layout put recomputed matmuls inside the consuming nvFuser region, where nvFuser materializes their
    outputs unseen by the memory model; those plans' estimates were 18-43% low."""
    lowest = max((r for r in records if r["system"] == "remat" and r["budget"] == "min" and "estimated_peak_mib" in r),
                 key=lambda r: r.get("run", ""), default=None)
    if lowest is None:
        return []
    return [r for r in records if r["system"] == "remat" and r.get("estimated_peak_mib", float("inf")) < 0.999 * lowest["estimated_peak_mib"]]


def variant(record: dict) -> str:
    """The row's system as the table and the plot name it: remat rows whose regions ran on another
    runtime than nvFuser (``--runtime inductor``) are a system of their own, ``remat (inductor)``."""
    runtime = record.get("runtime") or "auto"
    return record["system"] if record["system"] != "remat" or runtime == "auto" else f"remat ({runtime})"


def _label(record: dict) -> str:
    budget = record["budget"]
    if budget is None:
        return "-"
    return f"{budget} ({record['budget_from']})" if record.get("budget_from") else str(budget)


def _short_label(record: dict) -> str:
    """The plot's label: a budget given as torch.compile's peak reads "=tc 1.0", a share of it
    "0.8 x tc 1.0" (the full label overlaps)."""
    at_peak = parse_at_peak(record.get("budget_from"))
    if at_peak is not None:
        fraction, share = at_peak
        return f"=tc {fraction}" if share == 1.0 else f"{share} x tc {fraction}"
    return _label(record)


def checks(records: list[dict]) -> list[str]:
    """Issue 15's GPU targets, each stated with what was measured."""
    stale = outdated(records)
    remat_points = [r for r in records if r["system"] == "remat" and "peak_mib" in r and r not in stale]
    compiled = [r for r in records if r["system"] == "torch.compile" and "peak_mib" in r]
    lines = []
    # remat: monotone in the budget (budgets in falling order; "min" last)
    for name in dict.fromkeys(variant(r) for r in remat_points):  # each runtime is a frontier of its own
        mine = [r for r in remat_points if variant(r) == name]
        default_mib = (default_row(mine) or {}).get("estimated_peak_mib")
        ordered = sorted(mine, key=lambda r: _order(r["budget"], default_mib))
        rises = [(a, b) for a, b in zip(ordered, ordered[1:]) if b["peak_mib"] > a["peak_mib"] * 1.001]
        lines.append(
            f"- {name}: measured peak "
            + ("**monotone** in the budget (a rise of up to 0.1% is read as allocator rounding)" if not rises else "**not monotone**: " + "; ".join(
                f"{_label(b)} ({b['peak_mib']:.0f} MiB) above {_label(a)} ({a['peak_mib']:.0f} MiB)" for a, b in rises))
            + f" ({len(ordered)} budgets)."
        )
    errors = [(r, r["peak_mib"] / r["estimated_peak_mib"] - 1) for r in remat_points if r.get("estimated_peak_mib")]
    worst = max(errors, key=lambda item: abs(item[1]), default=None)
    if worst is not None:
        outside = [r for r, e in errors if abs(e) > ESTIMATE_TOLERANCE]
        lines.append(
            f"- measured against estimated peak: worst {100 * worst[1]:+.2f}% ({variant(worst[0])}, budget {_label(worst[0])}); "
            + ("**every point within 5%**." if not outside else f"**{len(outside)} point(s) outside 5%**: " + ", ".join(f"{variant(r)} {_label(r)}" for r in outside) + ".")
        )
    # domination: every torch.compile point has a remat point no higher and no slower
    beaten, unbeaten = [], []
    for c in compiled:
        winners = [r for r in remat_points if r["peak_mib"] <= c["peak_mib"] and r["step_ms"] <= c["step_ms"]]
        (beaten if winners else unbeaten).append((c, winners))
    rounds = [line for c in compiled if (line := _rounds_line(c, remat_points))]
    lines.append(
        "- torch.compile points dominated by a remat point (peak <= and step time <="
        + (", step times the medians of the rounds" if rounds else "") + f"): **{len(beaten)}/{len(compiled)}**"
        + (
            ". Not dominated: " + "; ".join(
                f"budget {_label(c)} ({c['peak_mib']:.0f} MiB, {c['step_ms']:.1f} ms; remat's nearest in step time "
                + _nearest(c, remat_points) + ")" for c, _ in unbeaten)
            if unbeaten else "."
        )
    )
    if rounds:
        lines.append("- round by round (each round times every mode once, in one process): " + "; ".join(rounds) + ".")
    lines += _share_lines(remat_points, compiled)
    errors = [r.get("grad_rel_error") for r in records if r.get("grad_rel_error") is not None and r["system"] != "eager"]
    if errors:
        lines.append(f"- gradients against eager (bf16, relative norm error): at most {max(errors):.1e} over every mode.")
    return lines


def _share_lines(remat_points: list[dict], compiled: list[dict]) -> list[str]:
    """Issue 18's ratio for each remat row given a share of torch.compile's peak (``--at-compile-peak-shares``):
    its step time over that torch.compile row's, at its measured share of the memory (target: <= 1.00 x
    at <= 0.80 x), the medians of the rounds and the rounds one by one when there are rounds."""
    lines = []
    for r in remat_points:
        at_peak = parse_at_peak(r.get("budget_from"))
        if at_peak is None or at_peak[1] == 1.0:
            continue
        anchor = next((c for c in compiled if str(c["budget"]) == at_peak[0] and c.get("run") == r.get("run")), None)
        if anchor is None:
            continue
        line = (
            f"- {variant(r)} at {_label(r)}: step {r['step_ms']:.1f} ms at {r['peak_mib']:.0f} MiB = "
            f"**{r['step_ms'] / anchor['step_ms']:.3f} x** torch.compile {anchor['budget']}'s step at "
            f"{r['peak_mib'] / anchor['peak_mib']:.3f} x its peak (issue 18: <= 1.00 x at <= 0.80 x)"
        )
        ours, theirs = r.get("step_ms_rounds"), anchor.get("step_ms_rounds")
        if ours and theirs and len(ours) == len(theirs):
            line += "; round by round " + ", ".join(f"{a / b:.3f}" for a, b in zip(ours, theirs))
        lines.append(line + ".")
    return lines


def _rounds_line(target: dict, points: list[dict]) -> str | None:
    """In how many of the rounds (``--rounds``) some remat point at or below ``target``'s peak was at least
    as fast as ``target`` in that same round; None without rounds."""
    times = target.get("step_ms_rounds")
    if not times:
        return None
    below = [r for r in points if r["peak_mib"] <= target["peak_mib"] and r.get("run") == target.get("run")
             and len(r.get("step_ms_rounds", ())) == len(times)]
    held = sum(any(r["step_ms_rounds"][k] <= t for r in below) for k, t in enumerate(times))
    return f"torch.compile {_label(target)} dominated in {held} of {len(times)}"


def _nearest(target: dict, points: list[dict]) -> str:
    below = [r for r in points if r["peak_mib"] <= target["peak_mib"]]
    if not below:
        return "none at or below its peak"
    best = min(below, key=lambda r: r["step_ms"])
    return f"at or below its peak: {variant(best)} budget {_label(best)}, {best['peak_mib']:.0f} MiB, {best['step_ms']:.1f} ms, {best['step_ms'] / target['step_ms']:.3f} x"


def latest_group(records: list[dict]) -> list[dict]:
    """Each (system, budget) measured last: a mode re-measured (or measured later because a run was cut
    short) replaces the older record; ``run`` says which process each row came from."""
    latest: dict[tuple, dict] = {}
    for r in records:
        if "skipped" in r:
            continue
        key = (variant(r), str(r["budget"]))
        if key not in latest or r.get("run", "") >= latest[key].get("run", ""):
            latest[key] = r
    return list(latest.values())


def render(records: list[dict], image: str | None) -> str:
    first = records[0]
    anchors = {r["system"]: r for r in records if r["system"] in ("eager", "thunder") and "peak_mib" in r}
    default = default_row(records)
    lines = [
        f"{first['model']}, {first['layers']} layers, batch {first['batch']}, seq {first['seq']}, vocab {first.get('vocab', 512)}, bf16, loss inside; "
        f"{first['device']}; " + _runs(records) + _rounds_note(records) + " remat's budget is a fraction of its default plan's "
        "estimated peak; torch.compile's is `activation_memory_budget` (a fraction of the saved bytes of its default "
        "partition). Peak = max allocated during the step minus allocated at its start (the weights); held = the "
        "allocator's reserved peak during a step minus what it reserved before the mode (its caching included; '-': "
        "runs before that column).",
        "",
        "| system | budget | peak MiB | held MiB | x remat default | step ms | x torch.compile 1.0 | remat's estimate MiB | measured / estimate | extra TFLOP (estimated) | grad rel. error | first call s | run (UTC) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    compiled_default = next((r for r in records if r["system"] == "torch.compile" and r["budget"] == 1.0 and "step_ms" in r), None)
    order = {"eager": 0, "thunder": 1, "torch.compile": 2, "remat": 3}
    stale = outdated(records)
    default_mib = (default or {}).get("estimated_peak_mib")
    for r in sorted(records, key=lambda r: (order.get(r["system"], 9), variant(r), _order(r["budget"], default_mib))):
        if "error" in r:
            lines.append(f"| {variant(r)} | {_label(r)} | failed: {r['error'][:100]} | | | | | | | | | | {r.get('run', '')[-5:]} |")
            continue
        x_default = f"{r['peak_mib'] / default['peak_mib']:.3f}" if default else "-"
        x_compiled = f"{r['step_ms'] / compiled_default['step_ms']:.3f}" if compiled_default else "-"
        estimate = f"{r['estimated_peak_mib']:.0f}" if r.get("estimated_peak_mib") else "-"
        ratio = f"{r['peak_mib'] / r['estimated_peak_mib']:.4f}" if r.get("estimated_peak_mib") else "-"
        extra = f"{r['extra_tflop']:.1f} ({100 * r['extra_tflop'] / r['step_tflop']:.0f}%)" if r.get("extra_tflop") is not None else "-"
        error = f"{r['grad_rel_error']:.1e}" if r.get("grad_rel_error") is not None else "-"
        held = f"{r['held_mib']:.0f}" if "held_mib" in r else "-"
        name = f"**{variant(r)}**" if r["system"] == "remat" else r["system"]
        if r in stale:
            name = "remat (earlier layout, see below)"
        lines.append(
            f"| {name} | {_label(r)} | {r['peak_mib']:.0f} | {held} | {x_default} | {r['step_ms']:.1f} | {x_compiled} | {estimate} | {ratio} | {extra} | {error} | {r['first_call_s']:.0f} | {r.get('run', '')[-5:]} |"
        )
    if stale:
        lines += ["", "Rows marked *earlier layout* (" + ", ".join(_label(r) for r in stale) + ") are plans the current code no longer "
            "makes: their estimated peak is below that of the lowest plan it reaches (row `min`). An earlier layout put recomputed "
            "matmuls inside the consuming nvFuser region, where nvFuser materializes their outputs unseen by the memory model, so "
            "those estimates were low. The current layout runs such recomputation in stages outside regions (docs/memory-model.md); "
            "they are left out of the checks. Other remat rows of a run before that change ran the earlier layout too: same "
            "plans and estimates, traces differing only where a matmul is recomputed (rows 0.6 and `min` are the same plan, before and after)."]
    lines += ["", "Checks (issue 15's GPU targets):", "", *checks(records)]
    if anchors.get("thunder") and default:
        lines.append(f"- Thunder default: {anchors['thunder']['peak_mib']:.0f} MiB, {anchors['thunder']['step_ms']:.1f} ms.")
    if image:
        lines += ["", f"![peak against step time]({image})"]
    return "\n".join(lines)


def _rounds_note(records: list[dict]) -> str:
    counts = sorted({len(r["step_ms_rounds"]) for r in records if r.get("step_ms_rounds")})
    if not counts:
        return ""
    again = [f"{variant(r)} {_label(r)}" for r in records if r.get("recompiled_in_rounds")]
    return (f" Step ms: the median of {'/'.join(map(str, counts))} rounds (each the median of its steps; after every mode "
            "was compiled and measured once, every mode timed again, interleaved, in alternating order)"
            + (f"; something recompiled during the rounds of: {', '.join(again)}" if again else "; nothing recompiled during them") + ".")


def _runs(records: list[dict]) -> str:
    runs = sorted({r.get("run", "") for r in records})
    if len(runs) == 1:
        return f"all rows from one process (run {runs[0]} UTC)."
    return "rows from " + str(len(runs)) + " processes on the same machine and model (runs " + ", ".join(runs) + " UTC; each row from the latest run that measured it)."


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    stale = outdated(records)
    records = [r for r in records if r not in stale]
    systems = list(dict.fromkeys(variant(r) for r in records if r["system"] == "remat")) + ["torch.compile"]
    for system in systems:
        style = "s--" if system == "torch.compile" else ("o-" if system == "remat" else "D-.")
        points = sorted((r for r in records if variant(r) == system and "peak_mib" in r), key=lambda r: r["step_ms"])
        if points:
            ax.plot([r["step_ms"] for r in points], [r["peak_mib"] / 1024 for r in points], style, label=f"{system} (budgets)")
            for r in points:
                ax.annotate(_short_label(r), (r["step_ms"], r["peak_mib"] / 1024), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for system, marker in (("thunder", "^"), ("eager", "x")):
        r = next((r for r in records if r["system"] == system and "peak_mib" in r), None)
        if r:
            ax.plot([r["step_ms"]], [r["peak_mib"] / 1024], marker, markersize=9, label=f"{system} default")
    first = records[0]
    ax.set_xlabel("step time (ms, median)")
    ax.set_ylabel("peak memory of the step (GiB, measured)")
    ax.set_title(f"{first['model']} x{first['layers']}, batch {first['batch']}, seq {first['seq']} ({first['device']})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Llama-2-7b-hf")
    parser.add_argument("--runtime", nargs="+", default=["auto"],
                        help="remat's runtime= (what runs its regions): auto (nvFuser), inductor, inductor-graph, each also with the suffixes +prune "
                        "(Thunder's PrunePrologueChecks), +transposed-cat (FusionPolicy(transposed_cat=True)), +aten-loss-gradient (FusionPolicy(loss_gradient=False)), +fused-loss-gradient (loss_gradient=True), +target-reads (target_reads=True) and +gathered-targets (target_reads=False); inductor-graph also with +no-donation and +head-major (InductorGraphTransform arguments); "
                        "several: each remat row once per runtime")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512, help="the model's vocabulary (default 512: logits small next to activations)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="after the sweep, time every mode again this many times in all (interleaved, in alternating order); "
                        "step_ms becomes the median of the rounds and the domination check counts the rounds it holds in")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--extra-compile-fractions", type=float, nargs="*", default=list(EXTRA_COMPILE_FRACTIONS))
    parser.add_argument("--at-compile-peaks", type=float, nargs="*", default=list(AT_COMPILE_PEAKS),
                        help="after torch.compile at these fractions, remat with its measured peak as the budget")
    parser.add_argument("--at-compile-peak-shares", type=float, nargs="+", default=[1.0],
                        help="the remat rows of --at-compile-peaks at these shares of torch.compile's measured peak "
                        "(0.8: issue 18's memory target, remat's step at <= 0.80 x torch.compile's peak)")
    parser.add_argument("--deadline", type=float, default=450.0, help="seconds after which the remaining modes are skipped")
    parser.add_argument("--only", nargs="*", help="measure only these modes, as system or system:budget (eager:None, torch.compile:0.2, remat:min)")
    parser.add_argument("--out", default="out")
    parser.add_argument("--render", help="print the table of a gpu_budget.jsonl instead of measuring")
    parser.add_argument("--write", action="store_true", help="with --render: put the table and the plot into docs/")
    parser.add_argument("--runs", nargs="*", help="with --render: only the records of these runs (their `run` stamps, "
                        "e.g. 2026-12-07T14:25), not each row's latest run")
    args = parser.parse_args()
    if args.render:
        all_records = [json.loads(line) for line in Path(args.render).read_text().splitlines() if line.strip()]
        if args.runs:
            all_records = [r for r in all_records if r.get("run") in args.runs]
            if not all_records:
                raise SystemExit(f"no records of runs {' '.join(args.runs)} in {args.render}")
        sections = []
        for model in dict.fromkeys(r["model"] for r in all_records):
            records = latest_group([r for r in all_records if r["model"] == model])
            image = f"images/gpu_budget_{model}.png"
            if args.write:
                plot(records, ROOT / "docs" / image)
            sections.append(render(records, image if args.write else None))
        markdown = "\n\n".join(sections)
        print(markdown)
        if args.write:
            from plan_cpu import write_section

            write_section(
                markdown + "\n\nCommand: `source .gpu/activate.sh; python benchmarks/gpu_budget.py --model <config> --layers <N> --out $OUT` "
                f"on the GPU machine; raw records: `{args.render}`; table and plot: `python benchmarks/gpu_budget.py --render {args.render}"
                + (f" --runs {' '.join(args.runs)}" if args.runs else "") + " --write`.",
                marker="gpu_budget",
                heading="Memory budgets on the GPU (measured)",
            )
        return
    run(args)


if __name__ == "__main__":
    main()
