"""The GPU benchmark's table: every ratio compares measurements of one run."""

import importlib.util
import json
from pathlib import Path

import pytest

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
    assert remat_row[6].strip() == "-"  # held: not recorded by runs before that column
    assert remat_row[8].strip() == "0.600" and remat_row[9].strip() == "0.917"  # against the same run's Thunder
    assert "started 2026-12-02T15:20 UTC" in table


def test_the_step_without_a_sync_between_forward_and_backward_has_its_own_ratio(tmp_path):
    """``step_ms_one_sync`` (as a training loop runs a step) is compared with torch.compile's of the same
    run; runs before that column show '-'."""
    run = "2026-12-06T04:12"
    compiled = dict(record("torch.compile", 10.0, 800.0, run=run), step_ms_one_sync=9.0)
    remat_row = dict(record("remat-graph", 10.5, 570.0, run=run), step_ms_one_sync=9.45)
    older = record("remat", 11.0, 570.0, run=run)
    path = tmp_path / "gpu_memory.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (compiled, remat_row, older)))
    rows = {line.split("|")[3].strip(): line.split("|") for line in load_gpu_memory().render(str(path)).splitlines() if line.startswith("| m |")}
    assert rows["**remat-graph**"][10].strip() == "1.050"  # synchronized between the phases
    assert rows["**remat-graph**"][11].strip() == "9.45" and rows["**remat-graph**"][12].strip() == "1.050"
    assert rows["torch.compile"][12].strip() == "1.000"
    assert rows["**remat**"][11].strip() == "-" and rows["**remat**"][12].strip() == "-"


def test_held_memory_counts_a_cuda_graph_pool_that_peak_does_not(tmp_path):
    graphs = record("remat+cudagraphs", 9.0, 5.0, run="2026-12-04T18:00")
    graphs["held_mib"] = 80.0  # the pool, reserved at capture: in held, not in the step's peak
    plain = record("remat", 10.0, 60.0, run="2026-12-04T18:00")
    plain["held_mib"] = 64.0
    path = tmp_path / "gpu_memory.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (plain, graphs)))
    table = load_gpu_memory().render(str(path))
    rows = {row.split("|")[3].strip(): row.split("|") for row in table.splitlines() if row.startswith("| m |")}
    assert rows["**remat+cudagraphs**"][5].strip() == "5.0" and rows["**remat+cudagraphs**"][6].strip() == "80.0"
    assert rows["**remat**"][6].strip() == "64.0"
    assert "*held* (below) counts it" in table


def load_benchmark(name):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_host_diagnostic_splits_kernels_by_phase(tmp_path):
    gpu_host = load_benchmark("gpu_host")
    kernel = lambda ts, dur, name: dict(cat="kernel", ts=ts, dur=dur, name=name)  # noqa: E731
    events = [
        dict(name="phase::forward", ts=0.0, dur=50.0, ph="X"),
        kernel(10.0, 20.0, "a"),
        kernel(25.0, 10.0, "b"),  # overlaps a: busy counts the union
        kernel(45.0, 5.0, "c"),  # 10 us after b ends
        dict(name="phase::backward", ts=100.0, dur=40.0, ph="X"),
        kernel(130.0, 10.0, "d"),  # 30 us after the backward starts
    ]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    phases = gpu_host.phase_timeline(trace)
    forward, backward = phases["forward"], phases["backward"]
    assert forward["kernels"] == 3 and abs(forward["busy_ms"] - 0.030) < 1e-9
    assert abs(forward["first_kernel_delay_ms"] - 0.010) < 1e-9
    assert abs(forward["idle_between_kernels_ms"] - 0.010) < 1e-9
    assert forward["largest_gaps"][0] == dict(us=10.0, after="b", before="c")
    assert backward["kernels"] == 1 and abs(backward["first_kernel_delay_ms"] - 0.030) < 1e-9


def test_step_gaps_split_a_marked_step_into_wait_busy_and_idle(tmp_path):
    """Each step starts with the marker kernel; the first marked step is left out (warm-up)."""
    gpu_host = load_benchmark("gpu_host")
    kernel = lambda ts, dur, name: dict(cat="kernel", ts=ts, dur=dur, name=name)  # noqa: E731
    marker = gpu_host.MARKER_KERNEL
    events = [kernel(0.0, 1.0, "before any marker"), kernel(10.0, 1.0, marker), kernel(500.0, 50.0, "slow first step")]
    for start, wait in ((1000.0, 300.0), (2000.0, 100.0), (3000.0, 200.0)):
        first = start + 1.0 + wait
        events += [
            kernel(start, 1.0, marker),
            kernel(first, 40.0, "a"),
            kernel(first + 30.0, 20.0, "b"),  # overlaps a: busy counts the union (50 us)
            kernel(first + 60.0, 10.0, "c"),  # 10 us after b
        ]
    trace = tmp_path / "marked.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    gaps = gpu_host.step_gaps(trace)
    assert gaps["steps"] == 3 and gaps["kernels"] == 3
    assert abs(gaps["first_kernel_wait_ms"] - 0.2) < 1e-9  # median of 300, 100, 200 us
    assert abs(gaps["busy_ms"] - 0.06) < 1e-9 and abs(gaps["idle_after_first_ms"] - 0.01) < 1e-9
    assert abs(gaps["span_ms"] - (201.0 + 70.0) / 1e3) < 1e-9
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": [kernel(0.0, 1.0, "a")]}))
    assert gpu_host.step_gaps(empty) == {}


def test_the_profile_sums_kernel_time_by_kind_for_forward_and_backward(tmp_path):
    gpu_profile = load_benchmark("gpu_profile")
    kernel = lambda ts, dur, name: dict(cat="kernel", ts=ts, dur=dur, name=name)  # noqa: E731
    events = [
        kernel(0.0, 10.0, "triton_red_fused_layer_norm_0"),
        kernel(10.0, 100.0, "nvjet_sm90_tst_192x192_TNN"),
        kernel(110.0, 50.0, "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_kernel0"),
        kernel(200.0, 1.0, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"),
        kernel(300.0, 80.0, "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_kernel0"),
        kernel(380.0, 5.0, "void cudnn::fusion::convert_dq_to_16bits<true>"),
        kernel(390.0, 20.0, "nvjet_sm90_tst_320x128_NNT"),
        kernel(410.0, 4.0, "triton_poi_fused_cat_1"),
    ]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [*events, dict(cat="cpu_op", ts=0.0, dur=500.0, name="aten::mm")]}))
    kinds = gpu_profile.kernel_kinds(gpu_profile.trace_kernels(json.loads(trace.read_text())["traceEvents"]))
    assert kinds["forward"] == {
        "triton": {"us": 10.0, "kernels": 1},
        "matmul": {"us": 100.0, "kernels": 1},
        "attention forward": {"us": 50.0, "kernels": 1},
        "total_us": 160.0,
    }
    assert kinds["backward"]["attention backward"] == {"us": 80.0, "kernels": 1}
    assert kinds["backward"]["attention (cuDNN helpers)"] == {"us": 5.0, "kernels": 1}
    assert kinds["backward"]["total_us"] == 109.0  # the loss gradient's fill splits the phases, counted in neither


def load_gpu_budget():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_budget imports gpu_memory
    spec = importlib.util.spec_from_file_location("gpu_budget", ROOT / "benchmarks" / "gpu_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_budget_benchmark_gives_remat_torch_compiles_measured_peak_right_after_measuring_it():
    gpu_budget = load_gpu_budget()
    order = gpu_budget.modes((1.0, 0.9), (0.2,), at_compile_peaks=(1.0,))
    at_peak = order.index(("remat", gpu_budget.AT_PEAK_PREFIX + "1.0"))
    assert order[at_peak - 1] == ("torch.compile", 1.0)
    assert not any(b == gpu_budget.AT_PEAK_PREFIX + "0.9" for _, b in order)
    # a share of that peak (issue 18's 0.80 x), right after it, and read back
    order = gpu_budget.modes((1.0, 0.9), (0.2,), at_compile_peaks=(1.0,), peak_shares=(1.0, 0.8))
    at_share = order.index(("remat", "0.8 x " + gpu_budget.AT_PEAK_PREFIX + "1.0"))
    assert order[at_share - 2 : at_share] == [("torch.compile", 1.0), ("remat", gpu_budget.AT_PEAK_PREFIX + "1.0")]
    assert gpu_budget.parse_at_peak(order[at_share][1]) == ("1.0", 0.8)
    assert gpu_budget.parse_at_peak(gpu_budget.AT_PEAK_PREFIX + "0.7") == ("0.7", 1.0)
    assert gpu_budget.parse_at_peak("10291MiB") is None and gpu_budget.parse_at_peak(0.9) is None
    # without the default plan's size, sizes sort between the anchors and the fractions ...
    budgets = [None, "min", 1.0, 0.9, "10291MiB", "9000MiB"]
    assert sorted(budgets, key=gpu_budget._order) == [None, "10291MiB", "9000MiB", 1.0, 0.9, "min"]
    # ... with it (a default plan of 9500 MiB), by their bytes: 0.8 x torch.compile 0.8's peak fell below it
    # in an H100 sweep (7894 MiB against a 7987 MiB default plan), and the monotonicity check read a fall as a rise
    assert sorted(budgets, key=lambda b: gpu_budget._order(b, 9500.0)) == [None, "10291MiB", 1.0, "9000MiB", 0.9, "min"]


def test_runtime_suffixes_of_the_budget_benchmark_set_the_graph_transform_and_the_fusion_policy():
    import remat
    from remat.thunder.graph import InductorGraphTransform

    gpu_budget = load_gpu_budget()
    assert gpu_budget.runtime_options("inductor-graph") == ("inductor-graph", {})
    base, options = gpu_budget.runtime_options("inductor-graph+no-donation+head-major+transposed-cat")
    (transform,) = options["transforms"]
    assert base == "inductor" and isinstance(transform, InductorGraphTransform)
    assert transform.donate_dying_inputs is False and transform.token_major_attention is False
    assert options["fusion"] == remat.FusionPolicy(transposed_cat=True)
    # the graph's own arguments mean nothing to region-by-region runtimes: refused, not ignored
    with pytest.raises(ValueError, match=r"\+no-donation for auto"):
        gpu_budget.runtime_options("auto+no-donation")
    with pytest.raises(ValueError, match="unknown --runtime suffix"):
        gpu_budget.runtime_options("inductor-graph+fast")


def test_the_budget_table_keeps_each_runtime_of_remat_a_system_of_its_own():
    gpu_budget = load_gpu_budget()

    def row(system, budget, peak, ms, runtime=None, estimate=None):
        record = dict(model="m", layers=2, batch=4, seq=8192, device="d", run="2026-12-04T18:00", system=system,
                      budget=budget, peak_mib=peak, step_ms=ms, first_call_s=1.0)
        if runtime is not None:
            record.update(runtime=runtime, estimated_peak_mib=estimate or peak)
        return record

    records = [
        row("torch.compile", 1.0, 100.0, 10.0),
        row("remat", 1.0, 60.0, 11.0, "auto"),
        row("remat", 1.0, 61.0, 9.5, "inductor"),  # same plan, other kernels: must not replace the nvFuser row
        row("remat", 0.8, 50.0, 12.0, "auto"),
        row("remat", 0.8, 62.0, 9.8, "inductor"),  # a rise: inductor's frontier is not monotone here
    ]
    latest = gpu_budget.latest_group(records)
    assert sorted(gpu_budget.variant(r) for r in latest if r["system"] == "remat") == ["remat", "remat", "remat (inductor)", "remat (inductor)"]
    checks = "\n".join(gpu_budget.checks(latest))
    assert "- remat: measured peak **monotone**" in checks
    assert "- remat (inductor): measured peak **not monotone**" in checks
    assert "dominated by a remat point (peak <= and step time <=): **1/1**" in checks
    table = gpu_budget.render(latest, None)
    assert "| **remat (inductor)** | 1.0 | 61 | - | 1.017 | 9.5 | 0.950 |" in table  # x remat default: nvFuser's 1.0 row


def test_budget_rounds_call_each_torch_compile_budget_again_without_recompiling(monkeypatch):
    """``gpu_budget.py --rounds``: torch.compile's rows stay compiled side by side (a backend per budget, the
    budget in force while AOTAutograd partitions), and the check counts the rounds a point is dominated in."""
    import torch
    import torch._functorch.config
    import torch._inductor.compile_fx

    gpu_budget = load_gpu_budget()
    partitioned_at = []

    def fake_compile_fx(graph_module, example_inputs):  # Inductor's place: read the budget, run the graph
        partitioned_at.append(torch._functorch.config.activation_memory_budget)
        return graph_module.forward

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", fake_compile_fx)
    torch._dynamo.reset()
    module, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    compiled = {budget: gpu_budget.make("torch.compile", budget, module)[0] for budget in (1.0, 0.5)}
    for budget in (1.0, 0.5, 1.0, 0.5):
        torch.testing.assert_close(compiled[budget](x), module(x))
    assert partitioned_at == [1.0, 0.5]  # each compiled once, under its own budget
    torch._dynamo.reset()

    def row(system, peak, first, *later, budget=1.0):
        return dict(model="m", layers=2, batch=4, seq=8192, device="d", run="r", system=system, budget=budget,
                    peak_mib=peak, step_ms=first, first_call_s=1.0, **({"runtime": "auto", "estimated_peak_mib": peak} if system == "remat" else {}))

    records = [row("torch.compile", 100.0, 10.0), row("remat", 90.0, 10.2, budget="100MiB")]
    gpu_budget.add_rounds(records, [[9.9, 10.1], [9.8, 10.0]], [False, False])
    assert records[1]["step_ms_rounds"] == [10.2, 9.8, 10.0] and records[1]["step_ms"] == 10.0
    assert records[0]["step_ms"] == 10.0 and records[0]["step_ms_first_round"] == 10.0
    checks = "\n".join(gpu_budget.checks(records))
    assert "step times the medians of the rounds): **1/1**" in checks  # 10.0 <= 10.0
    assert "torch.compile 1.0 dominated in 2 of 3" in checks  # lost round 1 (10.2 > 10.0), won rounds 2, 3
    assert "median of 3 rounds" in gpu_budget.render(records, None)
    # a row at 0.8 x torch.compile's peak: issue 18's ratio, round by round
    share = row("remat", 80.0, 10.5, budget="80MiB")
    share["budget_from"] = "0.8 x " + gpu_budget.AT_PEAK_PREFIX + "1.0"
    gpu_budget.add_rounds([share], [[10.4, 10.0]], [False])
    checks = "\n".join(gpu_budget.checks([*records, share]))
    assert "**1.040 x** torch.compile 1.0's step at 0.800 x its peak" in checks  # 10.4 / 10.0
    assert "round by round 1.050, 1.051, 0.990" in checks  # against 10.0, 9.9, 10.1
    assert gpu_budget._short_label(share) == "0.8 x tc 1.0"


def test_memory_rounds_time_every_mode_again_interleaved_and_give_ratios_round_by_round(monkeypatch, tmp_path):
    """``gpu_memory.py --rounds``: after the run, each kept mode's one-sync step is timed again, the order
    reversed every other round; the record's figure is the median, and the table's notes give the ratio to
    torch.compile round by round."""
    gpu_memory = load_benchmark("gpu_memory")
    calls = []

    def fake_step(fn, params, idx, targets, phase_sync=True):
        calls.append((fn.__name__, phase_sync))
        return None, fn() / 1e3, 0, 0, 0, None

    monkeypatch.setattr(gpu_memory, "step", fake_step)

    def compiled():
        return 9.0

    def remat_graph():
        return 9.18

    records = [
        dict(model="m", layers=2, seq=8, mode=mode, run="r", step_ms=10.0, step_ms_one_sync=first, peak_mib=peak, saved_mib=1.0, first_call_s=1.0)
        for mode, first, peak in (("torch.compile", 9.5, 800.0), ("remat-graph", 9.0, 574.0))
    ]
    gpu_memory.one_sync_rounds(list(zip(records, [compiled, remat_graph])), [], None, None, steps=2, rounds=3)
    assert records[0]["step_ms_one_sync_rounds"] == [9.5, 9.0, 9.0] and records[0]["step_ms_one_sync"] == 9.0
    assert records[1]["step_ms_one_sync_rounds"] == [9.0, 9.18, 9.18] and records[1]["step_ms_one_sync_first_round"] == 9.0
    assert not any(sync for _, sync in calls)  # steps as a training loop runs them
    assert [name for name, _ in calls] == ["remat_graph"] * 3 + ["compiled"] * 6 + ["remat_graph"] * 3  # warm-up + 2, reversed, then forward
    path = tmp_path / "gpu_memory.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "round by round (3 interleaved rounds): 0.947, 1.020, 1.020; median 1.020, at most 1.000 in 1 of 3" in gpu_memory.render(str(path))


def test_the_cpu_graph_memory_diagnostic_reads_the_allocators_peak_of_one_step():
    """``benchmarks/cpu_graph_memory.py`` measures a step's peak from the profiler's allocation events:
    a step that holds a 1 MiB product and then its gradients reads at least that, and not the weights."""
    import torch

    spec = importlib.util.spec_from_file_location("cpu_graph_memory", ROOT / "benchmarks" / "cpu_graph_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weight = torch.ones(512, 512, requires_grad=True)  # 1 MiB, allocated before the step: not counted

    def loss(idx, targets):
        return (weight * idx).sum()  # a 1 MiB product, freed once the backward has used it

    peak = module.step_peak_bytes(loss, [weight], torch.tensor(2.0), None)
    assert 2**20 <= peak <= 4 * 2**20, peak
    assert weight.grad is not None and float(weight.grad[0, 0]) == 2.0


def test_benchmark_litgpt_tables_compare_modes_of_one_command_only():
    """Each command of ``gpu_litgpt.py`` runs on a machine of its own: a re-run of two modes must not put
    its inductor row under an older run's remat row."""
    spec = importlib.util.spec_from_file_location("gpu_litgpt", ROOT / "benchmarks" / "gpu_litgpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def litgpt(mode, ms, gb, run):
        return dict(mode=mode, args=["--model_name", "m"], average_iter_time=ms, memory_used_GB=gb, device="H100", run=run)

    table = module.render([
        litgpt("remat", 11.0, 8.0, "2026-12-06T05:17"),
        litgpt("inductor", 10.0, 10.0, "2026-12-06T05:17"),
        litgpt("inductor", 5.0, 10.0, "2026-12-06T06:27"),
    ])
    first, second = table.split("Thunder's `benchmark_litgpt`")[1:]
    assert "runs 2026-12-06T05:17 UTC" in first and "runs 2026-12-06T06:27 UTC" in second
    remat_row = next(line for line in first.splitlines() if line.startswith("| **remat**"))
    assert remat_row.split("|")[5].strip() == "1.100"  # against its own command's inductor, not the later one
    assert "remat" not in second

    # modes of one command ran minutes apart: the command's start keeps them in one table
    one_command = [dict(r, command="2026-12-06T07:21") for r in (
        litgpt("inductor", 10.0, 10.0, "2026-12-06T07:21"), litgpt("remat", 11.0, 8.0, "2026-12-06T07:22"))]
    (table,) = module.render(one_command).split("Thunder's `benchmark_litgpt`")[1:]
    remat_row = next(line for line in table.splitlines() if line.startswith("| **remat**"))
    assert remat_row.split("|")[5].strip() == "1.100"


def test_the_snapshot_replay_finds_the_peak_and_what_is_alive_then():
    """The replay of an allocator history (gpu_graph_memory's, which gpu_litgpt_snapshot uses): a block
    freed before the peak is not alive at it; the peak's event and the bytes per allocating site are
    reported."""
    module = load_benchmark("gpu_graph_memory")
    mib = 2**20
    site = lambda line: [{"filename": "/tmp/torchinductor_root/ab/cab.py", "line": line, "name": "call"}]
    trace = [
        {"action": "alloc", "addr": 1, "size": 4 * mib, "frames": site(10)},
        {"action": "alloc", "addr": 2, "size": 2 * mib, "frames": site(20)},
        {"action": "free_requested", "addr": 2, "size": 2 * mib},
        {"action": "free_completed", "addr": 2, "size": 2 * mib},
        {"action": "alloc", "addr": 3, "size": 3 * mib, "frames": site(30)},
        {"action": "alloc", "addr": 4, "size": 1 * mib, "frames": site(30)},
        {"action": "free_completed", "addr": 1, "size": 4 * mib},
    ]
    result = module.replay(trace)
    assert result["peak_mib"] == 8.0
    assert result["peak_event"]["index"] == 5 and result["peak_event"]["of"] == 7
    assert [b["mib"] for b in result["live_at_peak"]] == [4.0, 3.0, 1.0]
    assert result["live_by_site"] == {"/tmp/torchinductor_root/ab/cab.py:10 call": 4.0, "/tmp/torchinductor_root/ab/cab.py:30 call": 4.0}


def test_the_budget_benchmark_runs_a_pruned_runtime_as_remat_with_thunders_prologue_pruning():
    """``--runtime <runtime>+prune``: remat with that runtime and Thunder's ``PrunePrologueChecks``; the
    tables keep it apart from the same runtime unpruned."""
    import torch

    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
    import thunder

    from conftest import tiny_litgpt

    gpu_budget = load_gpu_budget()
    model = tiny_litgpt()
    jitted, executor = gpu_budget.make("remat", 1.0, model, runtime="torch" + gpu_budget.PRUNED)
    jitted(torch.randint(0, 128, (1, 8))).sum().backward()
    assert executor.last_result is not None
    prologue = thunder.last_prologue_traces(jitted)[-1]
    assert [b.args[0].name for b in prologue.bound_symbols if b.sym.name == "check_tensor_metadata"] == ["idx"]
    record = dict(system="remat", runtime="inductor-graph" + gpu_budget.PRUNED)
    assert gpu_budget.variant(record) == "remat (inductor-graph+prune)" != gpu_budget.variant(dict(record, runtime="inductor-graph"))


def test_the_thunderfx_mode_compiles_forward_and_backward_as_remat_graphs_inside_the_install(monkeypatch):
    """``gpu_memory.py --modes remat-graph-thunderfx``: the first call (ThunderFX's compilation) runs inside
    ``remat.install(runtime="inductor-graph")``, so the forward and the backward each run as one of remat's
    graphs, planned by remat (Inductor's compilation replaced by running the FX graph: no C++ build); the
    install is gone afterwards and later calls keep remat."""
    import torch

    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
    import thunder

    from conftest import recorded_graphs, tiny_litgpt

    handed = recorded_graphs(monkeypatch)
    gpu_memory = load_benchmark("gpu_memory")
    torch._dynamo.reset()
    before = thunder.get_default_executors()
    module = gpu_memory.WithLoss(tiny_litgpt())
    idx, targets = torch.randint(0, 128, (1, 8)), torch.randint(0, 128, (1, 8))
    fn, executor = gpu_memory.make("remat-graph-thunderfx", module)
    assert executor.last_result is None  # nothing compiled yet
    for _ in range(2):
        for p in module.parameters():
            p.grad = None
        fn(idx, targets).backward()
        assert thunder.get_default_executors() == before  # installed only during the first call
    assert executor.last_result is not None and executor.last_result.plan is not None
    assert len(handed) == 2  # remat's forward graph and backward graph, compiled once
    assert len(gpu_memory.graph_paths(fn)) == 2  # the record's graph_paths reads them through ThunderFX
    assert all(p.grad is not None for p in module.parameters())
    torch._dynamo.reset()


def test_budget_runtime_suffixes_combine_and_an_unknown_one_is_refused():
    """``gpu_budget.py --runtime inductor-graph+transposed-cat+prune``: remat's graph runtime with
    ``FusionPolicy(transposed_cat=True)`` and Thunder's prologue pruning, a system of its own."""
    import pytest

    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)

    gpu_budget = load_gpu_budget()
    runtime, options = gpu_budget.runtime_options("inductor-graph" + gpu_budget.TRANSPOSED_CAT + gpu_budget.PRUNED)
    assert runtime == "inductor-graph"
    assert options["fusion"].transposed_cat and not options["fusion"].independent_parts
    assert [type(t).__name__ for t in options["transforms"]] == ["PrunePrologueChecks"]
    assert gpu_budget.runtime_options("auto") == ("auto", {})
    _, options = gpu_budget.runtime_options("auto" + gpu_budget.ATEN_LOSS_GRADIENT + gpu_budget.TRANSPOSED_CAT)
    assert options["fusion"].transposed_cat and not options["fusion"].loss_gradient  # suffixes add up
    fusion = gpu_budget.runtime_options("auto" + gpu_budget.FUSED_LOSS_GRADIENT + gpu_budget.TARGET_READS)[1]["fusion"]
    assert fusion.loss_gradient is True and fusion.target_reads
    assert gpu_budget.runtime_options("inductor-graph" + gpu_budget.GATHERED_TARGETS)[1]["fusion"].target_reads is False
    with pytest.raises(ValueError, match=r"\+fast"):
        gpu_budget.runtime_options("auto+fast")
    record = dict(system="remat", runtime="inductor-graph" + gpu_budget.TRANSPOSED_CAT)
    assert gpu_budget.variant(record) == "remat (inductor-graph+transposed-cat)"


def test_traffic_diagnostic_reads_modes_with_budgets():
    import argparse

    import pytest

    traffic = load_benchmark("cpu_graph_traffic")
    assert traffic.parse_mode("remat-transposed-cat@100GiB") == ("remat-transposed-cat", "100GiB")
    assert traffic.parse_mode("torch.compile") == ("torch.compile", None)
    assert traffic.parse_mode("remat-target-reads@100GiB") == ("remat-target-reads", "100GiB")
    assert traffic.POLICIES["remat-target-reads"] == {"target_reads": True}
    with pytest.raises(argparse.ArgumentTypeError, match="no budget"):
        traffic.parse_mode("torch.compile@0.5")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown mode"):
        traffic.parse_mode("remat-fast")
    graph = {"kernels": [{"bytes": 3 * 2**20, "ops": ["add"]}, {"bytes": 2**19, "ops": ["mul"]}], "extern": [{"bytes": 2**21, "ops": ["mm"]}]}
    assert traffic.summary(graph) == {"kernels": 2, "kernel_mib": 3.5, "extern": 1, "extern_mib": 2.0}


def test_memory_benchmark_takes_the_graph_runtime_at_a_budget_of_its_own():
    """``gpu_memory.py`` / ``gpu_profile.py --modes remat-graph@10290MiB``: the graph runtime at a given
    budget (issue 15's contested point, torch.compile's peak), a mode besides ``MODES``, listed after them."""
    gpu_memory = load_gpu_memory()
    assert gpu_memory.budget_of("remat-graph@10290MiB") == "10290MiB"
    assert gpu_memory.budget_of("remat-graph@0.9") == 0.9
    modes = {"remat-graph@10290MiB": {}, "torch.compile": {}, "remat-graph": {}}
    assert gpu_memory.ordered(modes) == ["remat-graph", "torch.compile", "remat-graph@10290MiB"]
    assert gpu_memory.GRAPH_AT_COMPILE_PEAK in gpu_memory.MODES  # its own branch, before the general one


def test_budget_benchmark_prints_other_vocabularies_only(monkeypatch, capsys):
    """``budget.py --vocab``: another vocabulary is printed, never written over the vocab-512 tables of
    docs/benchmarks.md."""
    import sys

    import pytest

    budget = load_benchmark("budget")
    monkeypatch.setattr(sys, "argv", ["budget.py", "--vocab", "32000", "--write"])
    with pytest.raises(SystemExit):
        budget.main()
    assert "--write puts the vocab-512 tables" in capsys.readouterr().err
