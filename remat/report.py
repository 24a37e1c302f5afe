"""``python -m remat report``: what remat does to one LitGPT config, as files a person can read.

:func:`write_report` traces the model (on the meta device by default: proxies only, no memory, no math),
forms nvFuser-style regions, runs Thunder 0.2.6's own ``rematerialize`` and :func:`remat.optimize` on the
same fused trace, and writes into ``out``:

``report.md``
    the before/after table (no rematerialization, Thunder, remat), the pictures, the largest saved and
    recomputed tensors with the module each comes from (``transformer.h.0.mlp``: exact for parameters
    and the ops reading them, inferred for the others, docs/concepts.md "Names"), where recomputation
    was placed, and the list of emitted definitions.
``cut.png`` / ``cut.svg``
    :func:`remat.viz.draw` of the result.
``timeline.png`` / ``timeline.svg``
    :func:`remat.viz.memory_timeline` with Thunder's plan as a third line.
``pareto.png`` / ``pareto.svg``
    the memory / recompute frontier (:func:`remat.pareto`).
``cut.dot``
    :func:`remat.viz.to_dot` (render with ``dot -Tsvg cut.dot``).
``definitions/<region>.py``
    each fusion region of the optimized trace as an nvFuser ``FusionDefinition`` script
    (:func:`remat.nvfuser.definition_source`); a region remat cannot write that way gets
    ``definitions/<region>.txt`` with its Thunder subsymbols and a note.

All memory figures are the analytic memory model's (docs/memory-model.md), not GPU measurements.
Progress goes to ``log`` (one line per step, with the elapsed time).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remat import viz
from remat.core.ir import module_text
from remat.core.memory import MemoryBudget, format_bytes
from remat.core.views import alias_base
from remat.models import litgpt_model
from remat.pipeline import Result, optimize, pareto
from remat.thunder.capture import training_trace
from remat.thunder.fuse import fuse
from remat.thunder.nvfuser import EmitError, definition_source
from remat.thunder.read import read_trace

__all__ = ["ReportFiles", "pareto_figure", "region_definition", "write_report", "run"]


@dataclass
class ReportFiles:
    """What :func:`write_report` wrote (paths) and the result it drew."""

    out: Path
    report: Path
    pictures: list[Path] = field(default_factory=list)
    definitions: list[Path] = field(default_factory=list)
    dot: Path | None = None
    result: Any = None
    notes: list[str] = field(default_factory=list)


def region_definition(region) -> tuple[str, str]:
    """``(text, suffix)`` for one fusion region: its nvFuser definition script (``".py"``) from
    :func:`remat.nvfuser.definition_source` where remat can write the region, else the region's Thunder
    subsymbols (``".txt"``) with a first line saying why."""
    try:
        return definition_source(region), ".py"
    except EmitError as exc:  # ops remat cannot write: report, don't fail
        reason = f"remat.nvfuser could not write this region ({type(exc).__name__}: {exc})"
    return f"# {reason}; its Thunder subsymbols:\n{region}\n", ".txt"


def _progress(log: Callable[[str], None], started: float) -> Callable[[str], None]:
    def say(message: str) -> None:
        log(f"[{time.perf_counter() - started:6.1f} s] {message}")

    return say


def write_report(
    model_name: str,
    layers: int,
    seq: int,
    out: str | Path,
    *,
    budget: MemoryBudget | str | int | float | None = None,
    width: str = "full",
    device: str = "meta",
    log: Callable[[str], None] = print,
    command: str | None = None,
) -> ReportFiles:
    """Write the report for LitGPT config ``model_name`` into directory ``out`` (created if needed; see the
    module docstring for the files).  ``budget`` (see :class:`remat.MemoryBudget`) is passed to
    :func:`remat.optimize` as ``memory_budget`` (an unreachable budget gives the lowest plan remat finds,
    with a note).  Raises ValueError for a bad config name, width, layer count or budget, before any
    tracing, and OSError when ``out`` cannot be written."""
    memory_budget = MemoryBudget.parse(budget)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)  # an unwritable place fails now, not after the tracing
    started = time.perf_counter()
    say = _progress(log, started)
    files = ReportFiles(out=out, report=out / "report.md")

    say(f"building {model_name} ({width} width, {layers} layers, seq {seq}) on {device}")
    built = litgpt_model(model_name, layers, seq, width=width, device=device)
    description = built.description
    say("tracing the joint forward+backward trace with Thunder (several seconds at full width) ...")
    t = time.perf_counter()
    joint = training_trace(built.model, built.idx)
    trace_seconds = time.perf_counter() - t
    say(f"traced in {trace_seconds:.1f} s; forming nvFuser-style regions")
    fused = fuse(joint)

    result = optimize(fused, memory_budget)  # compares with Thunder's own rematerialize of the same trace
    files.result = result
    thunder_profile, thunder_seconds = result.candidates["thunder"], result.baseline_seconds
    say(f"Thunder 0.2.6 rematerialize: {thunder_seconds * 1e3:.0f} ms")
    applied = "applied" if result.applied else f"NOT applied (kept {result.chosen})"
    say(f"remat.optimize: {result.seconds * 1e3:.0f} ms, plan {applied}")

    fig = viz.draw(result, title=f"remat on {model_name}: what the backward keeps and what it recomputes")
    for suffix in ("png", "svg"):
        path = out / f"cut.{suffix}"
        fig.savefig(path)
        files.pictures.append(path)
    collapse = fig.remat_layout.collapse
    fig = viz.memory_timeline(
        result,
        others={"Thunder 0.2.6 rematerialize": thunder_profile},
        title=f"{model_name}: live activation bytes along one step (memory model)",
    )
    for suffix in ("png", "svg"):
        path = out / f"timeline.{suffix}"
        fig.savefig(path)
        files.pictures.append(path)
    files.dot = out / "cut.dot"
    files.dot.write_text(viz.to_dot(result))
    budget_bytes = memory_budget.resolve(result.before.peak_bytes) if memory_budget is not None else None
    pareto_note = _pareto(result, out, files, say, budget_bytes)
    say(f"pictures written ({collapse} layout)")

    definitions = out / "definitions"
    definitions.mkdir(exist_ok=True)
    for stale in list(definitions.glob("*.py")) + list(definitions.glob("*.txt")):
        stale.unlink()
    written_as: dict[str, str] = {}
    for bsym in result.trace.bound_symbols:
        if not bsym.sym.is_fusion:
            continue
        text, suffix = region_definition(bsym)
        path = definitions / f"{bsym.sym.name}{suffix}"
        path.write_text(text)
        files.definitions.append(path)
        written_as[bsym.sym.name] = path.name
    say(f"{len(files.definitions)} region definitions written")

    markdown = _markdown(
        model_name, description, result, thunder_profile, thunder_seconds, trace_seconds, files, written_as,
        collapse=collapse, pareto_note=pareto_note, budget=memory_budget, command=command,
    )
    files.report.write_text(markdown)
    say(f"wrote {files.report}")
    return files


def pareto_figure(fused_or_result, *, budget_bytes: int | None = None):
    """The Pareto curve (estimated peak against recomputed FLOPs) of a fused trace (or of the trace a
    :class:`remat.Result` planned), drawn by :func:`remat.viz.pareto_curve` with the step's FLOPs, the
    gradient floor and ``budget_bytes``."""
    if isinstance(fused_or_result, Result):
        graph, frontier = fused_or_result.graph, fused_or_result.frontier
    else:
        graph, frontier = read_trace(fused_or_result), None
    if frontier is None:
        frontier = pareto(graph)
    step_flops = graph.step_flops
    gradient_bytes = sum(graph.tensors[g].bytes for g in graph.gradients if g in graph.tensors)
    return viz.pareto_curve(frontier, step_flops=step_flops, gradient_bytes=gradient_bytes, budget_bytes=budget_bytes)


def _pareto(result: Result, out: Path, files: ReportFiles, say: Callable[[str], None], budget_bytes: int | None = None) -> str | None:
    """Draw the Pareto curve; returns a note for report.md."""
    try:
        fig = pareto_figure(result, budget_bytes=budget_bytes)
        for suffix in ("png", "svg"):
            path = out / f"pareto.{suffix}"
            fig.savefig(path)
            files.pictures.append(path)
        say("Pareto curve drawn")
        return "pareto.png"
    except Exception as exc:  # a picture must not break the report
        note = f"Pareto curve skipped: {type(exc).__name__}: {exc}"
        files.notes.append(note)
        say(note)
        return None


def _markdown(
    model_name, description, result, thunder_profile, thunder_seconds, trace_seconds, files, written_as, *,
    collapse, pareto_note, budget, command,
) -> str:
    before, after = result.before, result.after
    mib = 2**20
    plan = result.plan
    graph = result.graph
    regions = sum(1 for u in graph.units if u.kind == "region")
    recomputed = len(plan.recomputed_ops) if plan is not None else 0
    pct = 100 * result.extra_flops / max(result.step_flops, 1)

    def row(name, profile, ops, flops, seconds):
        return (
            f"| {name} | {profile.saved_bytes / mib:.1f} | {len(profile.saved_tensors)} | {profile.peak_bytes / mib:.1f} "
            f"| {_short(profile.peak_unit_name)} | {ops} | {flops} | {seconds} |"
        )

    lines = [
        f"# remat report: {model_name}",
        "",
        f"{description}; traced with Thunder 0.2.6 in {trace_seconds:.1f} s, {len(graph.ops)} ops in {regions} "
        f"nvFuser-style regions (`remat.fuse`).",
        "",
        f"Command: `{command}`" if command else "",
        "",
        "**All memory figures are analytic**: the memory model of docs/memory-model.md (live tensor bytes "
        "along the step; parameters, allocator caching and kernel workspace not counted), computed on the "
        "trace, not measured on a GPU.",
        "",
        "## Before and after",
        "",
        "| plan | saved for the backward (MiB) | saved tensors | est. peak (MiB) | peak at | recomputed ops | extra FLOPs | planning time |",
        "|---|---|---|---|---|---|---|---|",
        row("no rematerialization (fused trace)", before, "-", "-", "-"),
        row("Thunder 0.2.6 `rematerialize`", thunder_profile, "-", "-", f"{thunder_seconds * 1e3:.0f} ms"),
        row("**remat.optimize**" + (f" (budget {budget})" if budget is not None else ""), after, recomputed,
            f"{pct:.3f}% of the step", f"{result.seconds * 1e3:.0f} ms"),
        "",
        f"remat against Thunder: saved x{after.saved_bytes / max(thunder_profile.saved_bytes, 1):.3f}, "
        f"estimated peak x{after.peak_bytes / max(thunder_profile.peak_bytes, 1):.3f}.",
        "",
    ]
    if not result.applied:
        lines += [f"**The plan was not applied**: {'; '.join(result.notes)}", ""]
    elif result.notes:
        lines += ["Notes from the rewrite: " + "; ".join(result.notes), ""]

    lines += [
        "## The cut",
        "",
        "![the cut](cut.png)",
        "",
        "Forward units on the left run top to bottom, backward units on the right run bottom to top, so a "
        "layer's backward sits level with its forward (bands: layers, inferred from parameter names). Red "
        "edges are the tensors kept for the backward, labelled at their forward end with the largest names "
        "and the size. Orange boxes recompute forward ops (`↻ n ops`; `in nvFusionN`: a new region remat "
        "placed before that op); `↻ n later` on a forward box: n of its ops are recomputed in the backward. "
        f"Rows: {collapse} layout. Also as [cut.svg](cut.svg) and Graphviz source [cut.dot](cut.dot).",
        "",
        "## Memory along the step",
        "",
        "![memory timeline](timeline.png)",
        "",
        "Live activation bytes while each unit runs (memory model), before (nothing recomputed), after remat, "
        "and with Thunder's own plan; triangles mark the peaks. Also as [timeline.svg](timeline.svg).",
        "",
    ]
    if pareto_note:
        lines += ["## Memory / recompute trade-off", "", f"![Pareto curve]({pareto_note})", ""]

    lines += [
        "## Largest saved tensors (after remat)",
        "",
        "Module: where the tensor comes from in the model (`FusionGraph.value_module`): exact for "
        "parameters and ops that read them, inferred from the nearest such ops for the others (it contains "
        "the true module but may be coarser; docs/concepts.md, \"Names\").",
        "",
        "| tensor | module | shape | dtype | size | made by | read by |",
        "|---|---|---|---|---|---|---|",
    ]
    after_graph = result.after_graph
    readers: dict[str, list[str]] = {}
    for unit in after_graph.units:
        if unit.phase == "backward" and unit.kind in ("region", "op"):
            for name in unit.inputs:
                base = alias_base(name, after_graph.tensors)
                readers.setdefault(base, [])
                if unit.name not in readers[base]:
                    readers[base].append(unit.name)
    saved = sorted(after.saved_tensors, key=lambda n: -after_graph.tensors[n].bytes)
    for name in saved[:15]:
        info = after_graph.tensors[name]
        made_by = after_graph.units[info.producer_unit].name if info.producer_unit is not None else "-"
        read_by = ", ".join(_short(r) for r in readers.get(name, [])[:4])
        module = module_text(after_graph.value_module(name))
        lines.append(
            f"| {name} | {module} | {tuple(info.shape)} | {info.dtype} | {format_bytes(info.bytes)} | {_short(made_by)} "
            f"| {read_by} |"
        )
    if len(saved) > 15:
        rest = sum(after_graph.tensors[n].bytes for n in saved[15:])
        lines.append(f"| ... {len(saved) - 15} more | | | | {format_bytes(rest)} | | |")
    lines.append("")

    lines += _recomputed_values_table(result)

    lines += ["## Where recomputation runs", ""]
    if result.placements:
        original_regions = {u.name for u in graph.units if u.kind == "region"}
        lines += [
            "| where (optimized trace) | new region? | recomputed ops | from forward units | from modules |",
            "|---|---|---|---|---|",
        ]
        for region, op_ids in result.placements.items():
            sources: dict[str, int] = {}
            modules: dict[str, int] = {}
            for op_id in op_ids:
                op = graph.ops[op_id]
                source = op.region or _short(graph.units[op.unit].name)
                sources[source] = sources.get(source, 0) + 1
                module = module_text(graph.op_module(op_id))
                modules[module] = modules.get(module, 0) + 1
            source_text = ", ".join(f"{k} ({v})" for k, v in sources.items())
            module_counts = ", ".join(f"{k} ({v})" for k, v in modules.items())
            link = f"[{region}](definitions/{written_as[region]})" if region in written_as else region
            # a re-issued stand-alone op (a recomputed matmul, a re-gather) is keyed "<output> = <symbol>"
            new = "stand-alone op" if " = " in region else ("yes" if region not in original_regions else "no")
            lines.append(f"| {link} | {new} | {len(op_ids)} | {source_text} | {module_counts} |")
    else:
        lines.append("Nothing is recomputed.")
    lines.append("")

    py = [p for p in files.definitions if p.suffix == ".py"]
    txt = [p for p in files.definitions if p.suffix == ".txt"]
    lines += [
        "## Emitted nvFuser definitions",
        "",
        f"{len(files.definitions)} fusion regions of the optimized trace, one file each in "
        f"[definitions/](definitions/): {len(py)} nvFuser `FusionDefinition` scripts "
        "(`remat.nvfuser.definition_source`; run one with `python definitions/<region>.py` on a machine "
        "with nvFuser and CUDA)"
        + (f", {len(txt)} as Thunder subsymbols (first line says why)" if txt else "")
        + ".",
        "",
    ]
    lines += [f"- [{p.name}](definitions/{p.name})" for p in files.definitions]
    lines.append("")
    if files.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in files.notes] + [""]
    return "\n".join(lines)


def _recomputed_values_table(result: Result, largest: int = 15) -> list[str]:
    """Markdown lines: the largest values the backward gets by recomputation, with their modules."""
    plan = result.plan
    if plan is None or not plan.recomputed_values:
        return []
    graph = result.graph
    values = sorted(plan.recomputed_values, key=lambda n: -graph.tensors[n].bytes)
    lines = [
        "## Largest recomputed tensors",
        "",
        "What the backward reads without it being kept: the forward ops that make these run again in the "
        "backward (module as above).",
        "",
        "| tensor | module | shape | dtype | size | made by (forward op) |",
        "|---|---|---|---|---|---|",
    ]
    for name in values[:largest]:
        info = graph.tensors[name]
        made_by = graph.ops[info.producer_node].kind if info.producer_node is not None else "-"
        lines.append(
            f"| {name} | {module_text(graph.value_module(name))} | {tuple(info.shape)} | {info.dtype} "
            f"| {format_bytes(info.bytes)} | {_short(made_by)} |"
        )
    if len(values) > largest:
        rest = sum(graph.tensors[n].bytes for n in values[largest:])
        lines.append(f"| ... {len(values) - largest} more | | | | {format_bytes(rest)} | |")
    lines.append("")
    return lines


def _short(name: str) -> str:
    for prefix in ("torch.ops.aten.", "torch."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def run(args) -> int:
    """Entry point for ``python -m remat report``: the work, on ``args`` that :func:`remat.cli.main` has
    checked (:func:`remat.cli.validate_args`: every argument, ``--out`` created and writable)."""
    command = "python -m remat report " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "report" else None
    files = write_report(
        args.model, args.layers, args.seq, args.out, budget=args.budget, width=args.width, device=args.device,
        command=command,
    )
    result = files.result
    print()
    print(result.summary())
    print(f"\nreport: {files.report}")
    print("pictures: " + ", ".join(p.name for p in files.pictures))
    print(f"definitions: {len(files.definitions)} files in {files.out / 'definitions'}")
    return 0
