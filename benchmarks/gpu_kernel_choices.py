"""GPU diagnostic: two kernel choices of the graph runtime, timed alone (issue 18).

1. cuDNN attention (``aten._scaled_dot_product_cudnn_attention`` and its backward, what remat's attention
   operator runs) with its query, key and value in three layouts: all ``(batch, heads, tokens, head_dim)``
   contiguous ("head-major"), all token by token (``remat.core.strides.token_major_strides``, what the graph
   runtime lays out), and query/key token by token with the value head-major (the value copy of
   ``FusionPolicy(attention_value_copy=True)`` inside a region that fixes its stride order), and the reverse
   (torch.compile's value is a token-major view of the qkv projection's output).  The profile
   of Llama-2-7b x2 (batch 4, seq 8192) showed the same cuDNN kernel at 3.75-3.87 ms a layer under remat's
   graph runtime and 3.35-3.41 ms under torch.compile.
2. The embedding gradient: PyTorch's ``embedding_dense_backward`` (sort based, what remat calls for large
   tables, ``remat.thunder.graph.EMBEDDING_SCRATCH_LIMIT``) against Inductor's decomposition compiled by
   ``torch.compile`` (an fp32 table, an accumulating index_put, a cast), which torch.compile runs.

Each time is the median of ``--repeats`` CUDA-event timings after warm-up; one process, one GPU.

    source .gpu/activate.sh; python benchmarks/gpu_kernel_choices.py --out $OUT

Records go to ``--out/gpu_kernel_choices.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remat.core.strides import token_major_strides  # noqa: E402

#: (name, batch, heads, tokens, head_dim): the attention of the measured blocks.
ATTENTION_SHAPES = (
    ("Llama-2-7b-hf", 4, 32, 8192, 128),
    ("stablecode-completion-alpha-3b", 4, 32, 8192, 80),
)
#: (name, tokens, vocabulary, width): the embedding tables of the measured blocks.
EMBEDDING_SHAPES = (
    ("Llama-2-7b-hf", 4 * 8192, 32000, 4096),
    ("stablecode-completion-alpha-3b", 4 * 8192, 49152, 2560),
)


def timed(fn, repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls, after three warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def laid_out(shape: tuple[int, ...], token_major: bool) -> torch.Tensor:
    tensor = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if not token_major:
        return tensor
    return tensor.as_strided(shape, token_major_strides(shape)).copy_(tensor)


def attention_layouts(repeats: int) -> list[dict]:
    records = []
    layouts = {
        "head-major": (False, False),
        "token-major": (True, True),
        "qk token-major, v head-major": (True, False),
        "qk head-major, v token-major": (False, True),
    }
    for name, batch, heads, tokens, head_dim in ATTENTION_SHAPES:
        shape = (batch, heads, tokens, head_dim)
        scale = head_dim**-0.5
        for layout, (qk_token_major, v_token_major) in layouts.items():
            torch.manual_seed(0)
            q, k = laid_out(shape, qk_token_major), laid_out(shape, qk_token_major)
            v = laid_out(shape, v_token_major)

            def forward():
                return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)

            out, logsumexp, _, _, _, _, seed, offset, _ = forward()
            grad_out = torch.randn_like(out)

            def backward():
                return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
                    grad_out, q, k, v, out, logsumexp, seed, offset, None, None, None, tokens, tokens, 0.0, True, scale=scale
                )

            records.append(
                dict(
                    kind="attention", model=name, shape=list(shape), layout=layout, out_stride=list(out.stride()),
                    forward_ms=timed(forward, repeats), backward_ms=timed(backward, repeats),
                )
            )
            print(json.dumps(records[-1]), flush=True)
            del q, k, v, out, logsumexp, grad_out
            torch.cuda.empty_cache()
    return records


def embedding_gradients(repeats: int) -> list[dict]:
    records = []
    for name, tokens, vocab, width in EMBEDDING_SHAPES:
        torch.manual_seed(0)
        grad = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
        indices = torch.randint(0, vocab, (tokens,), device="cuda")

        def eager():
            return torch.ops.aten.embedding_dense_backward(grad, indices, vocab, -1, False)

        compiled_fn = torch.compile(lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, vocab, -1, False))

        def compiled():
            return compiled_fn(grad, indices)

        reference = eager().float()
        error = ((compiled().float() - reference).norm() / reference.norm()).item()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        compiled()
        torch.cuda.synchronize()
        compiled_extra = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        eager()
        torch.cuda.synchronize()
        eager_extra = torch.cuda.max_memory_allocated() - base
        records.append(
            dict(
                kind="embedding_backward", model=name, tokens=tokens, vocab=vocab, width=width,
                eager_ms=timed(eager, repeats), inductor_ms=timed(compiled, repeats),
                eager_peak_mib=eager_extra / 2**20, inductor_peak_mib=compiled_extra / 2**20,
                gradient_mib=vocab * width * 2 / 2**20, inductor_rel_error=error,
            )
        )
        print(json.dumps(records[-1]), flush=True)
        del grad, indices
        torch.cuda.empty_cache()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = time.strftime("%Y-%m-%dT%H:%M", time.gmtime())
    device = torch.cuda.get_device_name()
    records = attention_layouts(args.repeats) + embedding_gradients(args.repeats)
    with open(out / "gpu_kernel_choices.jsonl", "a") as log:
        for record in records:
            log.write(json.dumps({**record, "run": run, "device": device}) + "\n")


if __name__ == "__main__":
    main()
