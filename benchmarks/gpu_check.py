"""GPU check: every region remat emits builds and runs under nvFuser, matching the torch reference.

Run on the GPU machine (see ../shared/gpu/README.md):

    source .gpu/activate.sh; python benchmarks/gpu_check.py --out $OUT

1. Environment: torch, CUDA device, nvFuser version, whether linear/matmul go to nvFuser.
2. End to end: a tiny LitGPT model trained one step under ``remat.jit`` (``runtime="nvfuser"``) against eager
   PyTorch in fp32.
3. Region by region, for the full-width 2-layer LitGPT configs (bf16): every region of
   ``remat.optimize(remat.fuse(trace, fusion))`` for the default fusion policy and for linear+matmul in regions,
   built with ``remat.nvfuser.build`` and run on random CUDA inputs, against the same region run by the
   torch reference.  Results go to stdout and ``--out/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import remat  # noqa: E402
import remat.thunder  # noqa: E402,F401  (its compat bridge, then Thunder)
from remat.models import litgpt_config, litgpt_model  # noqa: E402
from remat.thunder.runtimes import TorchRegionCallable  # noqa: E402
from thunder.core import dtypes  # noqa: E402
from thunder.core.proxies import TensorProxy  # noqa: E402

CONFIGS = ("stablecode-completion-alpha-3b", "Llama-2-7b-hf")
POLICIES = {"default": remat.FusionPolicy(), "linear+matmul": remat.FusionPolicy(linear=True, matmul=True)}


def random_inputs(region, generator):
    values = []
    for proxy in region.args:
        if isinstance(proxy, TensorProxy):
            dtype = dtypes.to_torch_dtype(proxy.dtype)
            shape = tuple(proxy.shape)
            if dtype.is_floating_point:
                values.append(torch.randn(shape, dtype=dtype, device="cuda", generator=generator))
            elif dtype == torch.bool:
                values.append(torch.randint(0, 2, shape, device="cuda", generator=generator).bool())
            else:
                values.append(torch.randint(0, 8, shape, dtype=dtype, device="cuda", generator=generator))
        else:
            values.append(proxy.value)
    return values


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / (a.norm() + 1e-12)).item()


def check_regions(name: str, layers: int, seq: int, fusion) -> dict:
    model, idx = litgpt_model(name, layers, seq, device="cuda")  # bf16, vocab 512, random token ids
    joint = remat.training_trace(model, idx)
    result = remat.optimize(remat.fuse(joint, fusion), strict=True)
    regions = [b for b in result.trace.bound_symbols if b.sym.is_fusion]
    generator = torch.Generator(device="cuda").manual_seed(0)
    report = dict(model=name, layers=layers, seq=seq, policy=str(fusion), regions=len(regions), ok=0, failures=[], worst=0.0)
    start = time.perf_counter()
    for region in regions:
        inputs = random_inputs(region, generator)
        reference = TorchRegionCallable(region.sym.name, region.subsymbols, region.args, region.output)
        try:
            expected = reference(*inputs)
            fd = remat.nvfuser.build(region, [remat.nvfuser.tensor_descriptor(a) if isinstance(a, torch.Tensor) else None for a in inputs])
            got = fd.execute(inputs)
        except Exception as exc:  # record and go on: the report lists every failing region
            report["failures"].append(dict(region=region.sym.name, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
            continue
        errors = [relative_error(a, b) for a, b in zip(expected, got)]
        worst = max(errors, default=0.0)
        report["worst"] = max(report["worst"], worst)
        if len(got) == len(expected) and worst < 2e-2:
            report["ok"] += 1
        else:
            report["failures"].append(dict(region=region.sym.name, error=f"mismatch {worst:.3g}"))
    report["seconds"] = time.perf_counter() - start
    del model, joint, result
    torch.cuda.empty_cache()
    return report


def end_to_end() -> dict:
    from litgpt import GPT

    # a tiny fp32 Llama (2 query groups, MLP 256) and an eager copy with the same weights as the reference
    config = litgpt_config("Llama-2-7b-hf", 2, 64, n_embd=128, n_head=4, n_query_groups=2, intermediate_size=256)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT(config)
        reference = GPT(config)
    reference.load_state_dict(model.state_dict())
    idx = torch.randint(0, 512, (2, 64), device="cuda")
    jitted = remat.jit(model, runtime="nvfuser")
    loss = jitted(idx).pow(2).mean()
    loss.backward()
    expected = reference(idx).pow(2).mean()
    expected.backward()
    grad_error = max(relative_error(q.grad, p.grad) for p, q in zip(model.parameters(), reference.parameters()))
    ex = remat.executor_of(jitted)
    regions = [b for b in ex.last_result.trace.bound_symbols if b.sym.is_fusion]
    fallbacks = [b.sym.name for b in regions if getattr(b._call_ctx[b.sym.name], "failed", None)]
    backends = sorted({type(b._call_ctx[b.sym.name]).__name__ for b in regions})
    return dict(loss=loss.item(), expected=expected.item(), grad_error=grad_error, regions=len(regions), fallbacks=fallbacks, backends=backends)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--skip-end-to-end", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    env = dict(
        torch=torch.__version__,
        device=torch.cuda.get_device_name(),
        nvfuser=remat.nvfuser.version(),
        available=remat.nvfuser.available(),
        linear_supported=remat.nvfuser.linear_supported(),
    )
    print(json.dumps(env), flush=True)
    results = dict(env=env)
    if not args.skip_end_to_end:
        t = time.perf_counter()
        results["end_to_end"] = end_to_end()
        print("end to end", json.dumps(results["end_to_end"]), f"{time.perf_counter() - t:.0f} s", flush=True)
    results["regions"] = []
    for name in args.configs:
        for fusion in (POLICIES[p] for p in args.policies):
            t = time.perf_counter()
            report = check_regions(name, args.layers, args.seq, fusion)
            results["regions"].append(report)
            print(f"{name} {fusion}: {report['ok']}/{report['regions']} regions match "
                  f"(worst relative error {report['worst']:.2e}), {time.perf_counter() - t:.0f} s", flush=True)
            for failure in report["failures"]:
                print("   FAIL", failure, flush=True)
            (out / "gpu_check.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
