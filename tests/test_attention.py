"""remat's attention executors: the CPU one (memory-faithful traces) and the cuDNN one (GPU speed).

The cuDNN kernels need a Hopper GPU (benchmarks/gpu_memory.py measures them against eager there); on a
CPU these tests check what can be checked: output shapes against PyTorch's own meta kernels, and which
calls the executor claims."""

import pytest
import torch

import remat
from remat.thunder import attention
from remat.thunder.execute import thunder_context

from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, tracectx


def proxies(*shapes, device="cuda:0", dtype=dtypes.bfloat16):
    return [TensorProxy(shape=shape, device=devices.to_device(device), dtype=dtype, requires_grad=True) for shape in shapes]


def test_cudnn_meta_matches_pytorchs_meta_kernels():
    q = torch.empty(2, 4, 64, 80, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(2, 4, 48, 80, device="meta", dtype=torch.bfloat16)
    real = attention._cudnn_forward_impl(q, kv, kv, True, None)
    grads = attention._cudnn_backward_impl(real[0], q, kv, kv, *real, True, None)
    with thunder_context(), tracectx(TraceCtx()):
        pq, pk, pv = proxies((2, 4, 64, 80), (2, 4, 48, 80), (2, 4, 48, 80))
        meta = attention._cudnn_forward_meta(pq, pk, pv, True, None)
        grad_meta = attention._cudnn_backward_meta(meta[0], pq, pk, pv, *meta, True, None)
    for proxy, tensor in zip((*meta, *grad_meta), (*real, *grads)):
        assert tuple(proxy.shape) == tuple(tensor.shape)
        assert dtypes.to_torch_dtype(proxy.dtype) == tensor.dtype


@pytest.mark.parametrize(
    "case, claimed",
    [
        (dict(), True),
        (dict(attn_mask=True), False),
        (dict(dropout_p=0.1), False),
        (dict(dtype=dtypes.float32), False),
        (dict(head_size=84), False),
        (dict(head_size=256), False),
        (dict(kv_heads=2), False),
        (dict(device="cpu"), False),
    ],
)
def test_cudnn_executor_claims_only_what_cudnn_attention_runs(monkeypatch, case, claimed):
    monkeypatch.setattr(attention, "cudnn_attention_available", lambda index=None: True)
    head = case.get("head_size", 64)
    with thunder_context(), tracectx(TraceCtx()):
        q, k, v = proxies(
            (1, 4, 32, head), (1, case.get("kv_heads", 4), 32, head), (1, case.get("kv_heads", 4), 32, head),
            device=case.get("device", "cuda:0"), dtype=case.get("dtype", dtypes.bfloat16),
        )
        mask = proxies((32, 32), dtype=dtypes.bool8)[0] if case.get("attn_mask") else None
        assert attention._cudnn_checker(q, k, v, mask, case.get("dropout_p", 0.0), True) is claimed


def test_cudnn_executor_declines_without_a_hopper_gpu():
    with thunder_context(), tracectx(TraceCtx()):
        q, k, v = proxies((1, 4, 32, 64), (1, 4, 32, 64), (1, 4, 32, 64))
        assert attention._cudnn_checker(q, k, v, None, 0.0, True) is (attention.cudnn_attention_available() is True)


def test_jit_puts_the_cudnn_executor_first_unless_told_not_to():
    from remat.thunder.executor import default_executors

    ex = remat.executor()
    names = [e.name for e in default_executors(ex)]
    assert names[0] == "remat_cudnn_sdpa" and names[-1] == ex.name
    assert "remat_cudnn_sdpa" not in [e.name for e in default_executors(ex, attention="thunder")]
    with pytest.raises(ValueError, match="attention must be one of"):
        remat.jit(torch.nn.Linear(2, 2), attention="flash")
