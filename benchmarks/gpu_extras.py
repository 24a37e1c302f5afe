"""GPU checks of two paths the CPU tests can only run with the torch runtime or a stand-in nvFuser.

1. kv-cache inference under ``remat.jit`` with real nvFuser regions (LitGPT's generation loop: prefill,
   then decode steps), against eager, with the cache the compiled model wrote compared to eager's.  This
   is the path where a view of the cache made inside an nvFuser region would lose the cache update.
   ``kv-llama-batch1`` runs it with batch 1 and ``kv-llama-thunder`` with plain ``thunder.jit`` (batch 2
   failed inside Thunder's own sdpa executor under ``remat.jit``; these tell whether Thunder alone does).
2. A training step under ``remat.jit(memory_budget=...)`` on the GPU against eager.

    source .gpu/activate.sh; python benchmarks/gpu_extras.py --out $OUT

Tiny float32 LitGPT models (TF32 off), so tolerances are fp32's.  Results: stdout and
``--out/gpu_extras.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import remat  # noqa: E402
import remat.thunder  # noqa: E402,F401  (its compat bridge before plain thunder.jit: Thunder 0.2.6 with nvFuser >= 0.2.34)
from remat.models import litgpt_model  # noqa: E402


def tiny(name: str, **overrides):
    """A 2-layer fp32 LitGPT ``name`` with n_embd 128, 4 heads, seq 64, vocab 256, seeded, on the GPU."""
    fields = dict(n_embd=128, n_head=4)
    fields.update(overrides)
    return litgpt_model(name, 2, 64, device="cuda", dtype=torch.float32, vocab=256, seed=0, **fields).model


def pair(name: str, **overrides):
    model, reference = tiny(name, **overrides), tiny(name, **overrides)
    reference.load_state_dict(model.state_dict())
    return model, reference


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-12)).item()


def kv_cache(name: str, batch: int = 2, compiler: str = "remat") -> dict:
    """``compiler="thunder"``: plain ``thunder.jit`` on the same path, to tell remat's failures from
    Thunder's own."""
    import thunder

    model, reference = pair(name)
    for m in (model, reference):
        m.eval()
        m.set_kv_cache(batch_size=batch, max_seq_length=32, device=torch.device("cuda"))
    jitted = remat.jit(model) if compiler == "remat" else thunder.jit(model)
    prompt = torch.randint(0, 256, (batch, 8), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    errors = []
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
        warnings.simplefilter("always")
        position = torch.arange(8, device="cuda")
        logits, expected = jitted(prompt, position), reference(prompt, position)
        errors.append(max_error(logits, expected))
        for step in range(8, 12):
            token = expected[:, -1:].argmax(-1)
            position = torch.tensor([step], device="cuda")
            logits, expected = jitted(token, position), reference(token, position)
            errors.append(max_error(logits, expected))
    cache_errors = [
        max(max_error(b.attn.kv_cache.k, r.attn.kv_cache.k), max_error(b.attn.kv_cache.v, r.attn.kv_cache.v))
        for b, r in zip(model.transformer.h, reference.transformer.h)
    ]
    regions = [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.is_fusion]
    return dict(
        check="kv-cache", model=name, batch=batch, compiler=compiler, logits_max_rel_error=max(errors), cache_max_rel_error=max(cache_errors),
        regions=len(regions), region_backends=sorted({type(b._call_ctx[b.sym.name]).__name__ for b in regions}),
        warnings=sorted({str(w.message)[:200] for w in caught if issubclass(w.category, remat.OptimizationWarning)}),
    )


def budget_step(name: str, budget: float) -> dict:
    model, reference = pair(name)
    jitted = remat.jit(model, memory_budget=budget)
    idx = torch.randint(0, 256, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    results = []
    for m, fn in ((model, jitted), (reference, reference)):
        for p in m.parameters():
            p.grad = None
        loss = fn(idx).float().pow(2).mean()
        loss.backward()
        results.append((loss.detach(), [p.grad for p in m.parameters()]))
    (loss, grads), (ref_loss, ref_grads) = results
    res = remat.executor_of(jitted).last_result
    return dict(
        check="memory_budget", model=name, budget=budget, loss_rel_error=max_error(loss, ref_loss),
        grad_max_rel_error=max(max_error(g, r) for g, r in zip(grads, ref_grads)),
        estimated_peak_before=res.before.peak_bytes, estimated_peak_after=res.after.peak_bytes,
        extra_flops=res.extra_flops, notes=res.notes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".")
    parser.add_argument("--checks", nargs="+", default=["kv-llama", "kv-llama-batch1", "kv-llama-thunder", "kv-pythia", "budget"])
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    records = []
    checks = {
        "kv-llama": (kv_cache, ("Llama-2-7b-hf",)),
        "kv-llama-batch1": (kv_cache, ("Llama-2-7b-hf", 1)),
        "kv-llama-thunder": (kv_cache, ("Llama-2-7b-hf", 2, "thunder")),
        "kv-pythia": (kv_cache, ("pythia-14m",)),
        "budget": (budget_step, ("Llama-2-7b-hf", 0.6)),
    }
    for check, fn_args in (checks[name] for name in args.checks):
        try:
            record = check(*fn_args)
        except Exception:
            record = dict(check=check.__name__, args=fn_args, error=traceback.format_exc()[-2000:])
        print(json.dumps(record, default=str), flush=True)
        records.append(record)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_extras.json").write_text(json.dumps(records, indent=1, default=str))


if __name__ == "__main__":
    main()
