"""GPU benchmark: Thunder's own ``benchmark_litgpt`` (shipped in lightning-thunder 0.2.6), unchanged, with and
without remat, beside torch.compile (inductor), in one command.

Each mode runs ``python -m remat benchmark-litgpt`` in its own process (the script keeps state per
process), with the script's own arguments; remat is put in nvFuser's place through the public API
(``remat.install()``), not a patch:

* ``thunder``: ``--without-remat --compile thunder`` (Thunder as shipped: nvFuser + its rematerialization)
* ``remat``: ``--compile thunder`` with remat installed
* ``remat-inductor``: the same, remat's regions compiled by Inductor (``--remat-runtime inductor``)
* ``remat-graph``: the same, remat's planned forward and backward each one Inductor graph
  (``--remat-runtime inductor-graph``: ``remat.install`` adds remat's graph transform to ``thunder.jit``)
* ``dynamo_thunder``: ``--without-remat --compile dynamo_thunder`` (ThunderFX)
* ``dynamo_thunder+remat``: ``--compile dynamo_thunder`` with remat installed
* ``inductor``: ``--without-remat --compile inductor`` (torch.compile)

On the GPU machine (``--n_layers`` as one command's time allows: Thunder's first call compiles for
40-100 s at 2-4 layers):

    source .gpu/activate.sh; python benchmarks/gpu_litgpt.py --model_name Llama-2-7b-hf --n_layers 4 --out $OUT

Each mode's metrics (the script's own JSON: ``average_iter_time`` ms, ``memory_used_GB``,
``tokens_per_sec``) are appended to ``--out/gpu_litgpt.jsonl`` as soon as the mode ends.  Back here,
``python benchmarks/gpu_litgpt.py --render FILE.jsonl [--write]`` prints the table (and puts it into
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: when this command started: every record of one command carries it, so that its modes share a table
#: (each record's own "run" is when that mode ran, minutes apart)
COMMAND = time.strftime("%Y-%m-%dT%H:%M")

#: mode -> (remat installed, the script's --compile)
MODES = {
    "thunder": (False, "thunder"),
    "remat": (True, "thunder"),
    "remat-inductor": (True, "thunder"),
    "remat-graph": (True, "thunder"),
    "dynamo_thunder": (False, "dynamo_thunder"),
    "dynamo_thunder+remat": (True, "dynamo_thunder"),
    "inductor": (False, "inductor"),
}


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def run_mode(mode: str, script_args: list[str], out: Path, timeout: float) -> dict:
    with_remat, compile_mode = MODES[mode]
    metrics = out / f"metrics_{mode.replace('+', '_')}.json"
    command = [sys.executable, "-m", "remat", "benchmark-litgpt"]
    if not with_remat:
        command.append("--without-remat")
    if mode in ("remat-inductor", "remat-graph"):
        command += ["--remat-runtime", {"remat-inductor": "inductor", "remat-graph": "inductor-graph"}[mode]]
    command += [*script_args, "--compile", compile_mode, "--return_metrics_as_json", "true", "--json_path", str(metrics)]
    start = time.perf_counter()
    record: dict = {"mode": mode, "args": script_args, "device": _device_name(), "run": time.strftime("%Y-%m-%dT%H:%M"), "command": COMMAND}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        (out / f"log_{mode.replace('+', '_')}.txt").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
        record["returncode"] = done.returncode
        if done.returncode == 0 and metrics.exists():
            record.update(json.loads(metrics.read_text()))
        else:
            record["error"] = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    except subprocess.TimeoutExpired:
        record["error"] = [f"timed out after {timeout:.0f} s"]
    record["wall_seconds"] = time.perf_counter() - start
    return record


def render(records: list[dict]) -> str:
    """One table per argument list (model, layers) and command (its start, ``command``: ratios compare
    modes of one command on one machine), each mode's latest record, ratios to that table's inductor row."""
    groups: dict[tuple[str, str | None], dict[str, dict]] = {}
    for r in records:
        # one table per command (its start, "command"; records before 2026-12-06T07:30 have only their own "run")
        groups.setdefault((" ".join(r["args"]), r.get("command", r.get("run"))), {})[r["mode"]] = r  # later records replace earlier ones
    return "\n\n".join(_table(args, modes) for (args, _), modes in groups.items())


def _table(args: str, by_mode: dict[str, dict]) -> str:
    lines = [
        f"Thunder's `benchmark_litgpt` (unchanged), `{args}`; one process per mode, {_devices(by_mode)}.",
        "",
        "| mode | iter ms | memory used GB | tokens/s | iter x inductor | memory x inductor | wall s (compile included) |",
        "|---|---|---|---|---|---|---|",
    ]
    anchor = by_mode.get("inductor") if "average_iter_time" in by_mode.get("inductor", {}) else None
    for mode in MODES:
        r = by_mode.get(mode)
        if r is None:
            continue
        if "average_iter_time" not in r:
            lines.append(f"| {mode} | failed: {' '.join(r.get('error', []))[:120]} | | | | | |")
            continue
        ratio_t = f"{r['average_iter_time'] / anchor['average_iter_time']:.3f}" if anchor else "-"
        ratio_m = f"{r['memory_used_GB'] / anchor['memory_used_GB']:.3f}" if anchor else "-"
        tokens = f"{r['tokens_per_sec'] / 1e3:.1f}k" if r.get("tokens_per_sec") else "-"
        name = f"**{mode}**" if "remat" in mode else mode
        lines.append(
            f"| {name} | {r['average_iter_time']:.2f} | {r['memory_used_GB']:.2f} | {tokens} | {ratio_t} | {ratio_m} | {r.get('wall_seconds', 0):.0f} |"
        )
    return "\n".join(lines)


def _devices(by_mode: dict[str, dict]) -> str:
    """The cards of a table's records and their runs (records before 2026-12-06 did not say: an H200)."""
    devices = sorted({r.get("device", "NVIDIA H200") for r in by_mode.values()})
    runs = sorted({r["run"] for r in by_mode.values() if "run" in r})
    return ", ".join(devices) + (f" (runs {', '.join(runs)} UTC)" if runs else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="directory for the records and logs")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {list(MODES)}")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mode")
    parser.add_argument("--render", type=Path, help="print the table of a gpu_litgpt.jsonl file")
    parser.add_argument("--write", action="store_true", help="with --render: put the table into docs/benchmarks.md")
    args, script_args = parser.parse_known_args()
    if args.render:
        records = [json.loads(line) for line in args.render.read_text().splitlines() if line.strip()]
        markdown = render(records)
        print(markdown)
        if args.write:
            from plan_cpu import write_section

            command = "`source .gpu/activate.sh; python benchmarks/gpu_litgpt.py <the arguments above> --out $OUT`"
            write_section(
                markdown + f"\n\nCommand: {command} (`--modes` picks modes); raw records: `{args.render}`; tables: "
                f"`python benchmarks/gpu_litgpt.py --render {args.render} --write`.",
                marker="gpu_litgpt",
                heading="Thunder's benchmark_litgpt (measured)",
            )
        return
    if args.out is None:
        parser.error("--out is required to run (or use --render)")
    args.out.mkdir(parents=True, exist_ok=True)
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}; choose from {list(MODES)}")
        record = run_mode(mode, script_args, args.out, args.timeout)
        with open(args.out / "gpu_litgpt.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps({k: v for k, v in record.items() if k != "args"}), flush=True)


if __name__ == "__main__":
    main()
