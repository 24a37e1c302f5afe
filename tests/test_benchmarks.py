"""The GPU benchmark's table: every ratio compares measurements of one run."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_gpu_memory():
    spec = importlib.util.spec_from_file_location("gpu_memory", ROOT / "benchmarks" / "gpu_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(mode, step_ms, peak_mib, run=None):
    r = dict(model="m", layers=2, seq=8, mode=mode, step_ms=step_ms, peak_mib=peak_mib, saved_mib=1.0, device="GPU")
    if run:
        r["run"] = run
    return r


def test_each_group_shows_its_latest_run_only(tmp_path):
    records = [
        record("thunder", 10.0, 100.0),  # an unlabelled, older run
        record("remat", 9.0, 70.0),
        record("thunder+linear", 10.0, 90.0),
        record("thunder", 12.0, 100.0, run="2026-12-02T15:20"),
        record("remat", 11.0, 60.0, run="2026-12-02T15:20"),
    ]
    path = tmp_path / "gpu_memory.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    table = load_gpu_memory().render(str(path))
    rows = [line for line in table.splitlines() if line.startswith("| m |")]
    assert [row.split("|")[3].strip() for row in rows] == ["thunder", "**remat**"]  # no row of the older run
    remat_row = rows[1].split("|")
    assert remat_row[4].strip() == "11.00"
    assert remat_row[7].strip() == "0.600" and remat_row[8].strip() == "0.917"  # against the same run's Thunder
    assert "started 2026-12-02T15:20 UTC" in table
