"""CPU diagnostic: the kernels Inductor makes of each compiled graph, and the bytes they read and write.

Issue 18 asks why remat's graph runtime (``remat.jit(runtime="inductor-graph")``) is not faster than
torch.compile where both keep about the same tensors (torch.compile's default budget on LitGPT blocks,
docs/benchmarks.md).  Their matmuls and attention kernels are the same; what can differ is the rest:
how many pointwise and reduction kernels each makes and how many bytes those move.  Inductor decides that
(which nodes it fuses into one kernel) the same way for a CPU as for a GPU, so the CPU can count it; how
long the kernels take is a GPU question (``gpu_memory.py``, ``gpu_budget.py``).

For each mode, one training step on the CPU (bf16 LitGPT config, vocab 512, loss inside, as
``gpu_memory.py``) with Inductor's caches off, and for every graph Inductor compiles (the forward, then
the backward): its kernels (fused scheduler nodes), the bytes each reads and writes (Inductor's own count,
``get_read_write_buffers_sizes``: every buffer a kernel touches counted once, at its full size), and the
same for the extern kernels (matmuls, attention) apart.  For remat's modes also its estimated peak, the
CPU allocator's measured peak of the step (``cpu_graph_memory.step_peak_bytes``); for every mode the
gradients' relative error against the same model in float64 (eager bf16 is no reference on the CPU: it
accumulates layer-norm gradients in bf16).  Bytes are an upper bound of a kernel's traffic (a buffer it reads twice
counts once; one it reads only in part counts whole), equal for both systems: compare, do not time.

Modes: ``torch.compile`` (its default budget); ``remat`` (the graph runtime, remat's defaults);
``remat-transposed-cat`` (the same with ``FusionPolicy(transposed_cat=True)``: attention's q, k, v
gradients concatenated inside the region that computes them); ``remat-target-reads`` (with
``FusionPolicy(target_reads=True)``: nll_loss's read at the targets as a row reduction; matters at a
real ``--vocab``); any remat mode with ``@BUDGET``
(``remat@100GiB``: the plan a budget above the default keeps).

    python benchmarks/cpu_graph_traffic.py --model Llama-2-7b-hf --seq 1024 \\
        --modes torch.compile remat remat@100GiB remat-transposed-cat@100GiB [--kernels]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

MIB = 2**20
RUN = time.strftime("%Y-%m-%dT%H:%M")
MODES = ("torch.compile", "remat", "remat-transposed-cat", "remat-target-reads")
#: remat modes and the fusion policy each runs with (None: remat's default)
POLICIES = {"remat-transposed-cat": dict(transposed_cat=True), "remat-target-reads": dict(target_reads=True)}


@contextlib.contextmanager
def recording_kernels():
    """Yields a list that gets, for each graph Inductor schedules while the block runs, a dict: its
    ``kernels`` (each ``{"bytes": ..., "ops": [...]}``, the aten ops the kernel computes) and ``extern``
    (the same for extern kernels).  Patches ``Scheduler.codegen``: it sees the scheduler's final nodes,
    after fusion."""
    from torch._inductor import scheduler

    graphs: list[dict] = []
    codegen = scheduler.Scheduler.codegen

    def recorded(self):
        kernels, extern = [], []
        for node in self.nodes:
            if isinstance(node, scheduler.NopKernelSchedulerNode):
                continue  # views and other nodes that launch nothing
            ops = sorted({_op_name(origin) for sub in node.get_nodes() for origin in getattr(sub.node, "origins", ())})
            entry = {"bytes": node.get_read_write_buffers_sizes(), "ops": ops}
            (extern if isinstance(node, scheduler.ExternKernelSchedulerNode) else kernels).append(entry)
        graphs.append({"kernels": kernels, "extern": extern})
        return codegen(self)

    scheduler.Scheduler.codegen = recorded
    try:
        yield graphs
    finally:
        scheduler.Scheduler.codegen = codegen


def _op_name(origin) -> str:
    return str(getattr(origin, "target", origin)).replace("aten.", "").replace(".default", "")


def summary(graph: dict) -> dict:
    """Kernel counts and MiB of one recorded graph."""
    return {
        "kernels": len(graph["kernels"]),
        "kernel_mib": round(sum(k["bytes"] for k in graph["kernels"]) / MIB, 1),
        "extern": len(graph["extern"]),
        "extern_mib": round(sum(k["bytes"] for k in graph["extern"]) / MIB, 1),
    }


def parse_mode(text: str) -> tuple[str, str | None]:
    """``remat-transposed-cat@100GiB`` -> (``remat-transposed-cat``, ``100GiB``)."""
    mode, _, budget = text.partition("@")
    if mode not in MODES:
        raise argparse.ArgumentTypeError(f"unknown mode {mode!r}: one of {', '.join(MODES)}, a remat one with @BUDGET")
    if budget and not mode.startswith("remat"):
        raise argparse.ArgumentTypeError(f"{mode} takes no budget")
    return mode, budget or None


def make(mode: str, budget: str | None, module: torch.nn.Module):
    import remat

    if mode == "torch.compile":
        return torch.compile(module)
    fusion = remat.FusionPolicy(**POLICIES[mode]) if mode in POLICIES else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph runtime's note that a budget is planned, not bound
        return remat.jit(module, runtime="inductor-graph", memory_budget=budget, fusion=fusion)


def main() -> None:
    import remat
    import remat.thunder  # noqa: F401  (before thunder)
    from cpu_graph_memory import step_peak_bytes
    from gpu_memory import build, grads_of, relative

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Llama-2-7b-hf")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=512, help="the vocabulary size (the loss and embedding paths at scale)")
    parser.add_argument("--modes", nargs="+", type=parse_mode, default=[parse_mode(m) for m in ("torch.compile", "remat", "remat-transposed-cat")])
    parser.add_argument("--kernels", action="store_true", help="print every kernel of every graph (bytes, aten ops)")
    parser.add_argument("--out", type=Path, help="a .jsonl file the records are appended to")
    args = parser.parse_args()

    torch._inductor.config.fx_graph_cache = False  # every mode compiles: a cache hit schedules nothing
    if hasattr(torch._functorch.config, "enable_autograd_cache"):
        torch._functorch.config.enable_autograd_cache = False
    module, params, idx, targets = build(args.model, args.layers, args.seq, device="cpu", batch=args.batch, vocab=args.vocab)
    # the gradients' reference: the same model in float64 (eager bf16 on the CPU accumulates layer-norm
    # gradients in bf16: 0.17 off float64 for stablecode-3b's norm biases, where remat's are 4e-3 off)
    reference = copy.deepcopy(module).double()
    reference(idx, targets).backward()
    exact_grads = [p.grad.float() if p.grad is not None else None for p in reference.parameters() if p.requires_grad]
    del reference
    for mode, budget in args.modes:
        torch._dynamo.reset()
        for p in params:
            p.grad = None
        fn = make(mode, budget, module)
        record = dict(model=args.model, layers=args.layers, seq=args.seq, batch=args.batch, vocab=args.vocab, mode=mode, budget=budget,
                      device="cpu", run=RUN)
        try:
            with recording_kernels() as graphs:
                fn(idx, targets).backward()
        except Exception as exc:  # Inductor's CPU code generation fails on some graphs: say so, go on
            record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            emit(record, args.out)
            continue
        record["graphs"] = [summary(g) for g in graphs]
        record["grad_rel_error_fp64"] = max(relative(g, e) for g, e in zip(grads_of(params), exact_grads) if e is not None)
        if mode.startswith("remat"):
            record["estimated_peak_mib"] = round(remat.executor_of(fn).last_result.after.peak_bytes / MIB, 1)
            record["peak_mib"] = round(step_peak_bytes(fn, params, idx, targets) / MIB, 1)
        emit(record, args.out)
        if args.kernels:
            for number, graph in enumerate(graphs):
                for kernel in graph["kernels"]:
                    print(f"  graph {number}  {kernel['bytes'] / MIB:8.1f} MiB  {' '.join(kernel['ops'])}")
        del fn


def emit(record: dict, out: Path | None) -> None:
    print(json.dumps(record), flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
