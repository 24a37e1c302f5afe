"""remat.jit / remat.executor on CPU: a training step under thunder.jit matches eager PyTorch."""

import warnings

import pytest
import torch

import remat
from conftest import tiny_litgpt


def train_step(model, idx):
    for p in model.parameters():
        p.grad = None
    loss = model(idx).float().pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("pythia-14m", dict(n_layer=2)),
        ("Llama-2-7b-hf", dict(n_layer=2, n_embd=64, n_head=4, n_query_groups=2, intermediate_size=128)),
    ],
)
def test_training_step_matches_eager(name, overrides):
    model = tiny_litgpt(name, **overrides).double()
    reference = tiny_litgpt(name, **overrides).double()
    reference.load_state_dict(model.state_dict())
    idx = torch.randint(0, 128, (2, 16))
    jitted = remat.jit(model)
    for step in range(2):  # the second call reuses the compiled step
        loss, grads = train_step(jitted, idx)
        expected_loss, expected_grads = train_step(reference, idx)
        torch.testing.assert_close(loss, expected_loss, rtol=1e-10, atol=0)
        for g, e in zip(grads, expected_grads):
            torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-12)
    result = remat.executor_of(jitted).last_result
    assert result is not None and result.applied
    assert result.after.saved_bytes < result.before.saved_bytes


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

    ex = remat.executor(backend="torch")
    model = tiny_litgpt()
    jitted = thunder.jit(model, executors=[ex])
    loss = jitted(torch.randint(0, 128, (1, 8))).sum()
    loss.backward()
    assert ex.last_result is not None
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_linear_auto_keeps_the_lower_peak():
    model = tiny_litgpt(n_layer=2)
    jitted = remat.jit(model, policy=remat.NvFuserPolicy(linear="auto", matmul="auto"), backend="torch")
    train_step(jitted, torch.randint(0, 128, (1, 16)))
    chosen = remat.executor_of(jitted).last_result
    peaks = {}
    joint = remat.training_trace(model, torch.randint(0, 128, (1, 16)))
    for linear, matmul in ((False, False), (True, False), (True, True)):
        res = remat.optimize(remat.fuse(joint, remat.NvFuserPolicy(linear=linear, matmul=matmul)))
        peaks[(linear, matmul)] = res.after.peak_bytes
    assert chosen.after.peak_bytes == min(peaks.values())


def test_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        remat.jit(42)
    with pytest.raises(ValueError, match="memory_budget"):
        remat.executor(memory_budget=-1)
    with pytest.raises(ValueError, match="unknown region backend"):
        remat.executor(backend="tpu")
    with pytest.raises(TypeError, match="NvFuserPolicy"):
        remat.executor(policy="fast")
    with pytest.raises(ValueError, match="linear"):
        remat.NvFuserPolicy(linear="sometimes")
    with pytest.raises(TypeError, match="executors"):
        remat.jit(tiny_litgpt(), executors=[])
    with pytest.raises(TypeError, match="remat.jit"):
        remat.executor_of(lambda x: x)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            remat.executor(backend="nvfuser")


def test_a_failing_plan_keeps_the_step_running(monkeypatch):
    import remat.pipeline as pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("simulated solver crash")

    monkeypatch.setattr(pipeline, "min_cut", broken)
    model = tiny_litgpt()
    jitted = remat.jit(model, backend="torch", policy=remat.NvFuserPolicy())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_step(jitted, torch.randint(0, 128, (1, 8)))
    messages = [str(w.message) for w in caught if issubclass(w.category, remat.OptimizationWarning)]
    assert any("simulated solver crash" in m for m in messages)
    assert not remat.executor_of(jitted).last_result.applied
