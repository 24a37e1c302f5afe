"""remat under FSDP, on existing engines only (docs/robustness.md, "Distributed").

* ``thunder.distributed.fsdp`` (ZeRO2 and ZeRO3): its all-gathers, reduce-scatters and their waits are
  in the trace remat plans.  Two processes with the gloo backend on the CPU train one step of a small
  pre-norm MLP stack (fp32) three ways: Thunder's default executors, ``remat.executors()`` and remat
  with the most permissive ``RecomputePolicy``; losses and every sharded gradient must agree with
  Thunder's, and with eager PyTorch on the unsharded model; no collective, wait or bucketing op may be
  recomputed or put into a region, and the executed traces run exactly Thunder's collectives.  (A
  2-layer tiny LitGPT passes the same test, checked by hand: at about a minute per sharding strategy on
  the CPU machine it is too slow for the suite; Thunder's tracing of LitGPT dominates.)
  The same processes run ZeRO3 with ``RecomputePolicy(regather_parameters=True)``
  (``test_zero3_regather_parameters_matches_thunder``): parameters are re-gathered in the backward, with
  Thunder's numbers; the rule and the pricing alone are in tests/test_regather.py.
* PyTorch FSDP2 (``fully_shard`` per block) under ThunderFX: ``test_fsdp2_thunderfx_with_remat_matches_thunderfx``.

Workers run in spawned processes and hand their results back through files (``torch.save``); the
assertions run here, in the pytest process, so a failure names the rank and the tensor.
"""

from __future__ import annotations

import os
import socket
import tempfile
import types
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from remat.core.ops import COLLECTIVE_KINDS, DISTRIBUTED_KINDS, NVFUSER_FUSIBLE_PRIMS, is_known_kind, op_tags
from remat.core.policies import RecomputePolicy

WORLD_SIZE = 2
# The most permissive policy remat has (stateful random ops aside): every kind it may recompute is
# allowed, so only the never-recompute rule keeps collectives in place.
PERMISSIVE = dict(matmul=True, attention=True, reductions=True, non_fusible=True)

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with the gloo backend"
)


# ------------------------------------------------------------------------------------------ the op table
def test_distributed_kinds_are_known_never_recomputed_never_fused():
    """Every collective, wait and bucketing kind: known (not ``opaque``), tagged ``distributed``, refused
    by the most permissive policy, not fusible, and kept even when nothing reads it."""
    from remat.core.ops import SIDE_EFFECT_KINDS

    permissive = RecomputePolicy(**PERMISSIVE)
    for kind in ("all_gather", "torch_all_gather_prim_impl", "reduce_scatter", "torch_reduce_scatter_prim_impl",
                 "all_reduce", "torch_all_reduce_prim_impl", "wait", "torch_wait_prim_impl", "torch_pack_prim_impl",
                 "torch_unpack_for_fsdp_prim_impl", "torch_stash_grad_for_fsdp_prim_impl", "synchronize"):
        assert kind in DISTRIBUTED_KINDS, kind
        tags = op_tags(kind)
        assert is_known_kind(kind) and "opaque" not in tags, kind
        assert "distributed" in tags, kind
        assert not permissive.allows(tags, fusible=False), kind
        assert kind not in NVFUSER_FUSIBLE_PRIMS, kind
    for kind in ("torch_all_gather_prim_impl", "torch_reduce_scatter_prim_impl", "torch_wait_prim_impl"):
        assert kind in SIDE_EFFECT_KINDS, kind


def test_every_thunder_distributed_prim_is_in_the_op_table():
    """Thunder 0.2.6's distributed prims (their own PrimIDs enum) and the torch executor's operators for
    them, as the reader names them: all in the table, so a Thunder upgrade adding one fails here."""
    import remat.thunder  # noqa: F401  (the compat bridge before Thunder)
    from thunder.distributed import prims as dist_prims
    from thunder.executors import torchex

    from remat.thunder.read import op_kind, symbol_facts

    for prim_id in dist_prims.PrimIDs:
        symbol = getattr(dist_prims, prim_id.name.lower())
        bsym = types.SimpleNamespace(sym=symbol)  # op_kind and symbol_facts read only the symbol
        kind = op_kind(bsym)
        assert kind == prim_id.name.lower(), (prim_id, kind)
        assert "distributed" in symbol_facts(bsym)[1], kind
        impl = f"torch_{kind}_prim_impl"
        if impl in torchex.ex.opmap:
            assert impl in DISTRIBUTED_KINDS, impl


# ------------------------------------------------------------------------------- thunder.distributed.fsdp
class _Block(torch.nn.Module):
    """A pre-norm residual MLP block: layer norm, linear, GELU, linear (what remat plans in LitGPT's MLP)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.proj = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


def _model() -> torch.nn.Module:
    """Two blocks of width 16, the same weights on every call (every first dimension divides by 2, as
    Thunder's FSDP needs without padding)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(_Block(16), _Block(16))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(worker, *args) -> list[dict]:
    """Run ``worker(rank, world_size, port, out_dir, *args)`` in two processes (a free port on localhost
    for the rendezvous); the result each rank saved as ``out_dir/rank<N>.pt``, by rank."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(WORLD_SIZE, _free_port(), out_dir, *args), nprocs=WORLD_SIZE, join=True)
        return [torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False) for rank in range(WORLD_SIZE)]


def _collective_facts(traces) -> tuple[list[tuple[str, tuple[int, ...]]], list[str]]:
    """The distributed ops run at top level of ``traces``, in order, as ``(kind, output shape)``, and the
    kinds of those found inside regions."""
    from remat.thunder.read import op_kind

    run: list[tuple[str, tuple[int, ...]]] = []
    in_regions: list[str] = []
    for trace in traces:
        for bsym in trace.bound_symbols:
            if bsym.sym.is_fusion:
                in_regions += [op_kind(sub) for sub in bsym.subsymbols if op_kind(sub) in DISTRIBUTED_KINDS]
            elif op_kind(bsym) in DISTRIBUTED_KINDS:
                run.append((op_kind(bsym), tuple(getattr(bsym.output, "shape", ()))))
    return run, in_regions


def _worker(rank: int, world_size: int, port: int, out_dir: str, strategies: tuple[str, ...]) -> None:
    """Every distributed run of this file in one pair of processes (spawning them and importing Thunder is
    most of the time): ``thunder.distributed.fsdp`` with both strategies, then FSDP2 under ThunderFX."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    import warnings

    import remat.thunder  # noqa: F401  (the compat bridge before Thunder: torch 2.13 needs it)

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's all_gather_into_tensor renaming
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = {"thunder_fsdp": _thunder_fsdp_facts(rank, world_size, strategies), "fsdp2": _fsdp2_facts(rank, world_size)}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _thunder_fsdp_facts(rank: int, world_size: int, strategies: tuple[str, ...]) -> dict:
    import thunder
    from thunder.distributed import FSDPType, fsdp

    import remat
    from remat.planning.budget import plan_memory

    torch.manual_seed(100 + rank)  # each rank its own batch
    x = torch.randn(2, 8, 16)

    # eager PyTorch on the unsharded model: the gradient FSDP shards is the mean over ranks
    eager = _model()
    loss = eager(x).pow(2).mean()
    loss.backward()
    result: dict = {"eager": {"loss": loss.detach()}}
    grads = {}
    for name, p in eager.named_parameters():
        g = p.grad.detach().clone()
        dist.all_reduce(g)
        shard = g.shape[0] // world_size  # Thunder's FSDP shards dimension 0 in contiguous chunks
        grads[name] = (g / world_size).narrow(0, shard * rank, shard)
    result["eager"]["grads"] = grads

    variants = {
        "thunder": None,
        "remat": remat.executors(runtime="torch"),
        "remat_permissive": remat.executors(runtime="torch", recompute=remat.RecomputePolicy(**PERMISSIVE)),
        # ZeRO3's meaning: re-gather parameters in the backward instead of keeping them unsharded
        "remat_regather": remat.executors(runtime="torch", recompute=remat.RecomputePolicy(regather_parameters=True)),
    }
    runs = [(s, v) for s in strategies for v in variants if v != "remat_regather" or s == "ZERO3"]
    for strategy, variant in runs:
        executors = variants[variant]
        options = {} if executors is None else {"executors": executors}
        model = fsdp(thunder.jit(_model(), **options), device=torch.device("cpu"),
                     sharding_strategy=getattr(FSDPType, strategy))
        loss = model(x).pow(2).mean()
        loss.backward()
        run, in_regions = _collective_facts([thunder.last_traces(model)[-1], thunder.last_backward_traces(model)[-1]])
        facts = {
            "loss": loss.detach(),
            "grads": {name: p.grad.detach().clone() for name, p in model.named_parameters()},
            "collectives_run": run,
            "collectives_in_regions": in_regions,
        }
        if executors is not None:
            planned = executors[-1].last_result  # remat's executor is the last of remat.executors()
            graph = planned.graph
            distributed_ops = [op for op in graph.ops if op.kind in DISTRIBUTED_KINDS]
            facts.update(
                chosen=planned.chosen,
                recomputed=[(graph.ops[i].kind, sorted(graph.ops[i].tags)) for i in planned.plan.recomputed_ops],
                distributed_ops=[(op.kind, sorted(op.tags), op.side_effect, op.fusible) for op in distributed_ops],
                # each distributed op with the kind of what it reads (a parameter, an activation, a future)
                distributed_reads=[
                    (op.kind, "regather" in op.tags, [graph.tensors[n].kind if n in graph.tensors else None for n in op.inputs])
                    for op in distributed_ops
                ],
                saved_bytes=planned.after.saved_bytes,
                # the budget search's estimate of the plan (the layout simulated) and the rewritten trace's
                simulated_peak=plan_memory(graph, planned.plan).peak_bytes,
                trace_peak=planned.after.peak_bytes,
            )
        result[(strategy, variant)] = facts
    return result


@pytest.fixture(scope="module")
def spawned_runs() -> list[dict]:
    """One pair of processes for every distributed test (:func:`_worker`); each rank's facts, by rank."""
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with the gloo backend")
    return _spawn(_worker, ("ZERO2", "ZERO3"))


@pytest.fixture(scope="module")
def thunder_fsdp_runs(spawned_runs) -> list[dict]:
    """``thunder.distributed.fsdp``: both strategies with Thunder's executors and remat's, and ZeRO3 with
    ``RecomputePolicy(regather_parameters=True)``; each rank's facts, by rank."""
    return [r["thunder_fsdp"] for r in spawned_runs]


@needs_gloo
def test_thunder_fsdp_with_remat_matches_thunder(thunder_fsdp_runs):
    """``thunder.distributed.fsdp`` (ZeRO2 and ZeRO3) with remat's executors: the numbers of Thunder's own
    executors, and Thunder's collectives, in Thunder's order, none recomputed (module docstring)."""
    for strategy in ("ZERO2", "ZERO3"):
        _check_thunder_fsdp(strategy, thunder_fsdp_runs)


@needs_gloo
def test_zero3_regather_parameters_matches_thunder(thunder_fsdp_runs):
    """ZeRO3 with ``RecomputePolicy(regather_parameters=True)``: remat re-gathers parameters in the
    backward (all-gather + wait of a parameter's shard, stand-alone, before the first use) instead of
    keeping them unsharded from the forward.  Loss and gradient shards equal Thunder's; the executed
    backward issues all-gathers, more than without the switch, none in a region, the same on every rank;
    the estimated saved bytes drop.  Only all-gathers of parameters and their waits are re-run."""
    ranks = [{key[1]: facts for key, facts in r.items() if isinstance(key, tuple) and key[0] == "ZERO3"} for r in thunder_fsdp_runs]
    for rank, result in enumerate(ranks):
        reference, without, facts = result["thunder"], result["remat"], result["remat_regather"]
        where = f"ZERO3, rank {rank}, regather_parameters=True"
        assert facts["chosen"] == "remat", f"{where}: remat's plan was not kept ({facts['chosen']})"
        torch.testing.assert_close(facts["loss"], reference["loss"], rtol=1e-6, atol=1e-8)
        assert facts["grads"].keys() == reference["grads"].keys()
        for name, grad in reference["grads"].items():
            torch.testing.assert_close(facts["grads"][name], grad, rtol=1e-6, atol=1e-8, msg=lambda m, name=name: f"{where} {name}: {m}")
        # the op table's rule, on the real trace: exactly the all-gathers of parameters and their waits
        # are re-gathers; reduce-scatters and their waits are not
        tagged = [(kind, reads) for kind, regather, reads in facts["distributed_reads"] if regather]
        assert tagged, f"{where}: no op tagged regather"
        for kind, regather, reads in facts["distributed_reads"]:
            if kind == "torch_all_gather_prim_impl":
                assert regather == (reads == ["param"]), (where, kind, reads)
            elif kind == "torch_reduce_scatter_prim_impl":
                assert not regather, (where, kind)
        # what ran: more all-gathers than without the switch (the backward's re-gathers), all through the
        # torch executor's operators, none in a region, the same collectives in the same order on every rank
        gathers = Counter(kind for kind, _ in facts["collectives_run"])["torch_all_gather_prim_impl"]
        gathers_without = Counter(kind for kind, _ in without["collectives_run"])["torch_all_gather_prim_impl"]
        assert gathers > gathers_without, (where, gathers, gathers_without)
        assert facts["collectives_in_regions"] == [], where
        # the budget search's estimate (the layout, simulated) counts the re-gathered buffers as the trace has them
        assert facts["simulated_peak"] == facts["trace_peak"], (where, facts["simulated_peak"], facts["trace_peak"])
        assert facts["collectives_run"] == ranks[0]["remat_regather"]["collectives_run"], where
        # Thunder's collectives all still run, in Thunder's order; what is added are all-gathers and waits
        added = _added_to(reference["collectives_run"], facts["collectives_run"])
        assert added is not None, f"{where}: Thunder's collectives are not all run in Thunder's order"
        assert added and {kind for kind, _ in added} == {"torch_all_gather_prim_impl", "torch_wait_prim_impl"}, (where, added)
        recomputed_distributed = [(kind, tags) for kind, tags in facts["recomputed"] if "distributed" in tags]
        assert recomputed_distributed, f"{where}: nothing re-gathered"
        assert all("regather" in tags for _, tags in recomputed_distributed), (where, recomputed_distributed)
        assert {kind for kind, _ in recomputed_distributed} == {"torch_all_gather_prim_impl", "torch_wait_prim_impl"}, where
        # the estimate: parameters are no longer kept unsharded for the backward
        assert facts["saved_bytes"] < without["saved_bytes"], (where, facts["saved_bytes"], without["saved_bytes"])


def _check_thunder_fsdp(strategy: str, spawned: list[dict]) -> None:
    results = [
        {"eager": r["eager"], **{key[1]: facts for key, facts in r.items() if isinstance(key, tuple) and key[0] == strategy}}
        for r in spawned
    ]
    for rank, result in enumerate(results):
        reference = result["thunder"]
        kinds_run = Counter(kind for kind, _ in reference["collectives_run"])
        assert kinds_run["torch_all_gather_prim_impl"] > 0, "the trace has no all-gather"
        assert kinds_run["torch_reduce_scatter_prim_impl"] > 0, "the trace has no reduce-scatter"
        # Thunder itself against eager (the setup is right), then remat against Thunder
        torch.testing.assert_close(reference["loss"], result["eager"]["loss"], rtol=1e-5, atol=1e-6)
        for name, grad in result["eager"]["grads"].items():
            torch.testing.assert_close(reference["grads"][name], grad, rtol=1e-5, atol=1e-6, msg=lambda m, rank=rank, name=name: f"rank {rank} {name}: {m}")
        for variant in ("remat", "remat_permissive"):
            facts = result[variant]
            where = f"{strategy}, rank {rank}, {variant}"
            assert facts["chosen"] == "remat", f"{where}: remat's plan was not kept ({facts['chosen']})"
            # Tight: the same ops on the same CPU (recomputation runs them again); equal bit for bit when measured.
            torch.testing.assert_close(facts["loss"], reference["loss"], rtol=1e-6, atol=1e-8)
            assert facts["grads"].keys() == reference["grads"].keys()
            for name, grad in reference["grads"].items():
                torch.testing.assert_close(facts["grads"][name], grad, rtol=1e-6, atol=1e-8, msg=lambda m, where=where, name=name: f"{where} {name}: {m}")
            # the traces that ran issue exactly Thunder's collectives in Thunder's order (every rank the
            # same order: a rank waiting on another collective than its peers deadlocks), none inside a
            # region, none recomputed
            assert facts["collectives_run"] == reference["collectives_run"], where
            assert facts["collectives_run"] == results[0][variant]["collectives_run"], where
            assert facts["collectives_in_regions"] == [], where
            assert facts["recomputed"], f"{where}: nothing recomputed, the check below would be empty"
            assert not [k for k, tags in facts["recomputed"] if k in DISTRIBUTED_KINDS or "distributed" in tags], where
        for variant in ("remat", "remat_permissive"):
            # the planner saw the collectives as what they are
            where = f"rank {rank}, {variant}"
            assert result[variant]["distributed_ops"], f"{where}: remat's graph has no distributed op"
            for kind, tags, side_effect, fusible in result[variant]["distributed_ops"]:
                assert "distributed" in tags and not fusible, (where, kind, tags)
                assert side_effect or kind not in COLLECTIVE_KINDS, (where, kind, "a collective must always run")


def _added_to(base: list, extended: list) -> list | None:
    """The items of ``extended`` left over once ``base`` is matched in order (a subsequence), or None
    when ``base`` is not a subsequence of ``extended``."""
    added, position = [], 0
    for item in extended:
        if position < len(base) and item == base[position]:
            position += 1
        else:
            added.append(item)
    return added if position == len(base) else None


# ----------------------------------------------------------------------------- PyTorch FSDP2 + ThunderFX
def _fsdp2_facts(rank: int, world_size: int) -> dict:
    import torch._dynamo
    from thunder.dynamo import ThunderCompiler
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import remat

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(100 + rank)
    x = torch.randn(2, 8, 16)
    result: dict = {}
    for reshard in (False, True):  # ZeRO2-like (keep unsharded after forward) and ZeRO3-like
        for variant in ("eager", "thunderfx", "remat"):
            model = _model()
            for block in model:  # one FSDP2 unit per block, as Thunder's benchmark_litgpt does
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
            planned: list = []
            if variant == "eager":
                run = model
            else:
                torch._dynamo.reset()
                executors = remat.executors(runtime="torch") if variant == "remat" else None
                if executors is not None:  # keep every graph's Result (the executor keeps the last only)
                    ex, optimize = executors[-1], executors[-1].optimizer
                    ex.optimizer = lambda trace, optimize=optimize, planned=planned: planned.append(optimize(trace)) or planned[-1]
                backend = ThunderCompiler(**({} if executors is None else {"executors": executors}))
                run = torch._dynamo.optimize(backend=backend)(model)
            loss = run(x).pow(2).mean()
            loss.backward()
            facts = {
                "loss": loss.detach(),
                "grads": {name: p.grad.to_local().detach().clone() for name, p in model.named_parameters()},
            }
            if variant == "remat":
                facts["graphs"] = [
                    {
                        "chosen": r.chosen,
                        "recomputed": len(r.plan.recomputed_ops),
                        "saved_inputs": [n for n in r.plan.saved if r.graph.tensors[n].kind in ("param", "input")],
                        "inputs": sum(1 for t in r.graph.tensors.values() if t.kind in ("param", "input")),
                    }
                    for r in planned
                ]
            result[(reshard, variant)] = facts
    return result


@needs_gloo
def test_fsdp2_thunderfx_with_remat_matches_thunderfx(spawned_runs):
    """PyTorch FSDP2 (``fully_shard`` per block, resharding after forward or not) under ThunderFX: remat
    plans each block's graph (parameters arrive unsharded as graph inputs and are never counted as saved
    by remat); loss and gradient shards equal ThunderFX without remat, and eager FSDP2."""
    results = [r["fsdp2"] for r in spawned_runs]
    for rank, result in enumerate(results):
        for reshard in (False, True):
            where = f"rank {rank}, reshard_after_forward={reshard}"
            eager, reference, planned = (result[(reshard, v)] for v in ("eager", "thunderfx", "remat"))
            torch.testing.assert_close(reference["loss"], eager["loss"], rtol=1e-5, atol=1e-6)
            for name, grad in eager["grads"].items():
                torch.testing.assert_close(reference["grads"][name], grad, rtol=1e-5, atol=1e-6, msg=lambda m, where=where, name=name: f"{where} {name}: {m}")
            torch.testing.assert_close(planned["loss"], reference["loss"], rtol=1e-6, atol=1e-8)
            for name, grad in reference["grads"].items():
                torch.testing.assert_close(planned["grads"][name], grad, rtol=1e-6, atol=1e-8, msg=lambda m, where=where, name=name: f"{where} {name}: {m}")
            graphs = planned["graphs"]
            assert len(graphs) == 2, f"{where}: expected one graph per FSDP2 block, got {len(graphs)}"
            for graph in graphs:
                assert graph["chosen"] == "remat" and graph["recomputed"] > 0, (where, graph)
                assert graph["inputs"] > 0 and graph["saved_inputs"] == [], (where, graph)
