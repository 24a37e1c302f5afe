"""remat.jit / remat.executor on CPU: a training step under thunder.jit matches eager PyTorch."""

import pytest
import torch

import remat
from conftest import PYTHIA_2, tiny_litgpt, train_step, traced


# The training step against eager for every LitGPT family: tests/test_families.py.


def test_inference_call_is_fused_without_planning():
    model = tiny_litgpt()
    jitted = remat.jit(model)
    idx = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        out = jitted(idx)
        expected = model(idx)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert remat.executor_of(jitted).last_result is None


def test_executor_for_thunder_jit():
    import thunder

    ex = remat.executor(runtime="torch")
    model = tiny_litgpt()
    jitted = thunder.jit(model, executors=[ex])
    loss = jitted(torch.randint(0, 128, (1, 8))).sum()
    loss.backward()
    assert ex.last_result is not None
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_linear_auto_keeps_the_lower_peak():
    model = tiny_litgpt(n_layer=2)
    jitted = remat.jit(model, fusion=remat.FusionPolicy(linear="auto", matmul="auto"), runtime="torch")
    train_step(jitted, torch.randint(0, 128, (1, 16)))
    chosen = remat.executor_of(jitted).last_result
    peaks = {}
    joint = traced(**PYTHIA_2)  # the same model (tiny_litgpt(n_layer=2), batch (1, 16)), traced once per run
    for linear, matmul in ((False, False), (True, False), (True, True)):
        res = remat.optimize(remat.fuse(joint, remat.FusionPolicy(linear=linear, matmul=matmul)))
        peaks[(linear, matmul)] = res.after.peak_bytes
    assert chosen.after.peak_bytes == min(peaks.values())


def test_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        remat.jit(42)
    with pytest.raises(ValueError, match="memory_budget"):
        remat.executor(memory_budget=-1)
    with pytest.raises(ValueError, match="unknown runtime"):
        remat.executor(runtime="tpu")
    with pytest.raises(TypeError, match="FusionPolicy"):
        remat.executor(fusion="fast")
    with pytest.raises(ValueError, match="linear"):
        remat.FusionPolicy(linear="sometimes")
    with pytest.raises(TypeError, match="transposed_cat"):
        remat.FusionPolicy(transposed_cat="yes")
    with pytest.raises(TypeError, match="executors"):
        remat.jit(tiny_litgpt(), executors=[])
    with pytest.raises(TypeError, match="remat.jit"):
        remat.executor_of(lambda x: x)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            remat.executor(runtime="nvfuser")


# Fallbacks (a failing plan, fusing, symbolic shapes, unknown and in-place ops): tests/test_fallbacks.py.
