"""Every fallback path (docs/robustness.md), triggered: what remat cannot handle is left as Thunder has it,
with one OptimizationWarning naming the cause; strict=True raises a RematError subclass; the step still
gives eager's numbers and the un-optimized trace stays usable.

| cause | what is left alone | test |
|---|---|---|
| symbolic shapes | the whole trace | test_symbolic_shapes_leave_the_trace_as_thunder_made_it |
| fusing, or planning, raises | the whole trace | test_fusing_failure_leaves_the_trace_as_thunder_made_it |
| solver fails / no finite cut | the fused trace, unplanned | test_solver_failure_keeps_the_fused_trace |
| rewrite fails | the fused trace, unplanned | test_rewrite_failure_keeps_the_fused_trace |
| plan raises the peak | the fused trace, unplanned | test_plan_raising_the_peak_keeps_the_fused_trace |
| unknown op | that op (stand-alone, never recomputed) | test_unknown_op_is_left_alone |
| in-place write after a read | the reading ops (never recomputed) | test_ops_reading_a_buffer_written_later_are_not_recomputed |
| buffers written in place | their ops stay out of regions | test_kv_cache_under_nvfuser_keeps_its_updates |
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

import fake_nvfuser
import remat
import remat.pipeline as pipeline
from conftest import tiny_litgpt
from remat.thunder.execute import execute_joint


def remat_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, remat.OptimizationWarning)]


def run_recording(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    return out, remat_warnings(caught)


def mlp(x, w1, w2):
    return F.gelu(x @ w1).sin() @ w2


def mlp_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, dtype=torch.float64, generator=g)
    w1 = torch.randn(8, 16, dtype=torch.float64, generator=g, requires_grad=True)
    w2 = torch.randn(16, 4, dtype=torch.float64, generator=g, requires_grad=True)
    return x, w1, w2


def step_matches_eager(jitted):
    """One training step of ``mlp`` under ``jitted`` equals eager (values and gradients)."""
    x, w1, w2 = mlp_inputs()
    out = jitted(x, w1, w2)
    out.sum().backward()
    x_, v1, v2 = mlp_inputs()
    expected = mlp(x_, v1, v2)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w1.grad, v1.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w2.grad, v2.grad, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def fused_mlp():
    return remat.fuse(remat.training_trace(mlp, *mlp_inputs()))


# ------------------------------------------------------------------------------ whole-trace fallbacks


@pytest.mark.filterwarnings("ignore:The 'symbolic values' cache option")
def test_symbolic_shapes_leave_the_trace_as_thunder_made_it():
    jitted = remat.jit(mlp, runtime="torch", cache="symbolic values")
    _, messages = run_recording(step_matches_eager, jitted)
    assert len(messages) == 1 and "symbolic shape" in messages[0], messages
    assert remat.executor_of(jitted).last_result is None
    strict = remat.jit(mlp, runtime="torch", strict=True, cache="symbolic values")
    with pytest.raises(remat.UnsupportedTraceError, match="symbolic shape"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strict(*mlp_inputs())


@pytest.mark.parametrize(
    "stage, module, function", [("fusing", "remat.thunder.executor", "fuse"), ("planning", "remat.compile", "optimize")]
)
def test_fusing_failure_leaves_the_trace_as_thunder_made_it(monkeypatch, stage, module, function):
    """``planning``: an exception escaping remat.optimize itself (optimize catches solver and rewrite
    failures; this stands for anything else, e.g. in the budget search)."""
    import importlib

    def broken(*args, **kwargs):
        raise RuntimeError(f"simulated {stage} bug")

    monkeypatch.setattr(importlib.import_module(module), function, broken)
    jitted = remat.jit(mlp, runtime="torch")
    _, messages = run_recording(step_matches_eager, jitted)
    assert messages == [f"remat left this trace as Thunder made it: {stage} failed: RuntimeError: simulated {stage} bug"]
    assert remat.executor_of(jitted).last_result is None
    strict = remat.jit(mlp, runtime="torch", strict=True)
    with pytest.raises(remat.OptimizationError, match=f"simulated {stage} bug") as info:
        strict(*mlp_inputs())
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    "error, strict_error, message",
    [
        (RuntimeError("simulated solver crash"), remat.OptimizationError, "solver failed: RuntimeError: simulated solver crash"),
        (remat.InfeasibleError("no finite cut (simulated)"), remat.InfeasibleError, "solver: no finite cut (simulated)"),
    ],
)
def test_solver_failure_keeps_the_best_other_trace(fused_mlp, monkeypatch, error, strict_error, message):
    """Nothing lost: when remat cannot plan, the result is the lower of Thunder's own rematerialize and
    the trace as it came (Thunder's is what Thunder would have run), with one warning naming the cause."""
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(pipeline, "plan_graph", broken)
    res, messages = run_recording(remat.optimize, fused_mlp)
    assert messages == [f"remat's plan was not applied: {message}; kept {pipeline._KEPT[res.chosen]}"]
    assert not res.applied and res.plan is None and res.notes == [message]
    assert set(res.candidates) == {"thunder", "unplanned"} and res.chosen in res.candidates
    assert res.after == res.candidates[res.chosen] and res.original is fused_mlp
    assert res.after.peak_bytes == min(p.peak_bytes for p in res.candidates.values())
    # without the Thunder baseline: the trace as it came
    res, messages = run_recording(remat.optimize, fused_mlp, thunder_baseline=False)
    assert messages == [f"remat's plan was not applied: {message}; kept the trace as it came"]
    assert res.trace is fused_mlp and res.after == res.before and res.chosen == "unplanned"
    with pytest.raises(strict_error):
        remat.optimize(fused_mlp, strict=True)
    # under thunder.jit the step still runs, and matches eager
    jitted = remat.jit(mlp, runtime="torch")
    _, messages = run_recording(step_matches_eager, jitted)
    assert len(messages) == 1 and message in messages[0]
    assert not remat.executor_of(jitted).last_result.applied


def test_rewrite_failure_keeps_the_fused_trace(fused_mlp, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("simulated rewrite bug")

    monkeypatch.setattr(pipeline, "apply_plan", broken)
    res, messages = run_recording(remat.optimize, fused_mlp, thunder_baseline=False)
    assert len(messages) == 1 and "rewrite failed: KeyError" in messages[0]
    assert not res.applied and res.trace is fused_mlp and res.original is fused_mlp
    with pytest.raises(remat.OptimizationError, match="rewrite failed") as info:
        remat.optimize(fused_mlp, strict=True)
    assert isinstance(info.value.__cause__, KeyError)
    # the trace handed back is the one that came in, and it runs
    x, w1, w2 = mlp_inputs()
    got = execute_joint(res.trace, [x, w1.detach(), w2.detach()])
    torch.testing.assert_close(got.outputs[0], mlp(x, w1, w2).detach())
    # with the baseline, whichever trace is kept runs to the same numbers
    res, _ = run_recording(remat.optimize, fused_mlp)
    got = execute_joint(res.trace, [x, w1.detach(), w2.detach()])
    torch.testing.assert_close(got.outputs[0], mlp(x, w1, w2).detach())


@pytest.mark.parametrize("strict", [False, True])
def test_a_plan_raising_the_peak_is_not_kept(fused_mlp, monkeypatch, strict):
    """Not a failure: by construction the kept trace is the lowest of remat's, Thunder's and the input;
    no warning, no error even when strict, and the notes say why."""
    from dataclasses import replace

    real = pipeline.profile_graph
    calls = []

    def inflating(graph):  # the second profile is the rewritten trace's
        profile = real(graph)
        calls.append(graph)
        return replace(profile, peak_bytes=profile.peak_bytes + 10**6) if len(calls) == 2 else profile

    monkeypatch.setattr(pipeline, "profile_graph", inflating)
    res, messages = run_recording(remat.optimize, fused_mlp, strict=strict)
    assert messages == []
    assert not res.applied and res.chosen in ("thunder", "unplanned") and res.plan is not None
    assert res.candidates["remat"].peak_bytes > res.after.peak_bytes
    assert res.notes[0].startswith(f"kept {pipeline._KEPT[res.chosen]}: its estimated peak")
    assert "remat's plan" in res.summary() and "Thunder's rematerialize" in res.summary(compare=True)


def test_the_original_trace_stays_usable(fused_mlp):
    """optimize never edits its input: Result.original is the input, unchanged, and runs to the same
    numbers as the optimized trace."""
    before = fused_mlp.python(include_decorators=False)
    res = remat.optimize(fused_mlp, strict=True)
    assert res.applied and res.original is fused_mlp
    assert fused_mlp.python(include_decorators=False) == before
    x, w1, w2 = mlp_inputs()
    inputs = [x, w1.detach(), w2.detach()]
    original = execute_joint(res.original, inputs, seed=1)
    optimized = execute_joint(res.trace, inputs, seed=1)
    for a, b in zip(original.outputs + original.grads, optimized.outputs + optimized.grads):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


# ------------------------------------------------------------------------------ partial fallbacks


def _custom_executor():
    """An operator executor with an op remat has never heard of (as a user's custom kernel would be)."""
    import thunder
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad, register_grad
    from thunder.extend import OperatorExecutor, register_executor

    custom = OperatorExecutor("remat_test_custom", version="0")
    register_executor(custom)
    op = custom.register_operator("test_custom_tanh", meta=lambda a: TensorProxy(like=a), fn=torch.tanh)

    def grad(a):
        out = op(a)
        put_grad(a, get_grad(out) * (1 - out * out))
        return out

    register_grad(op, grad)
    return thunder, custom, op


def test_unknown_op_is_left_alone():
    thunder, custom, custom_tanh = _custom_executor()

    def f(x, w):
        h = custom_tanh(w) * x
        return (h * h).sum()

    def eager(x, w):
        h = torch.tanh(w) * x
        return (h * h).sum()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, dtype=torch.float64, generator=g)
    w = torch.randn(4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = w.detach().clone().requires_grad_(True)
    # non_fusible=True would let the solver recompute stand-alone ops: never one it does not know
    ex = remat.executor(runtime="torch", recompute=remat.RecomputePolicy(non_fusible=True))
    jitted = thunder.jit(f, executors=[custom, ex])
    out, messages = run_recording(jitted, x, w)
    out.backward()
    expected = eager(x, v)
    expected.backward()
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(w.grad, v.grad, rtol=1e-12, atol=1e-14)
    assert len(messages) == 1 and "does not know the forward op(s) test_custom_tanh" in messages[0]
    res = ex.last_result
    assert res.applied  # the rest is still planned
    (node,) = [op.id for op in res.graph.ops if op.kind == "test_custom_tanh" and op.phase == "forward"]
    assert node not in res.plan.recomputed_ops
    assert res.graph.ops[node].outputs[0] in res.plan.saved
    # not fused either
    assert all(op.region is None for op in res.graph.ops if op.kind == "test_custom_tanh")
    strict = thunder.jit(f, executors=[custom, remat.executor(runtime="torch", strict=True)])
    with pytest.raises(remat.UnknownOpError, match="test_custom_tanh"):
        strict(x, w)


class CachedAdd(torch.nn.Module):
    """Reads a buffer, then overwrites it in place (a cache update), within one step."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 8, dtype=torch.float64, generator=g))
        self.register_buffer("cache", torch.randn(4, 8, dtype=torch.float64, generator=g))

    def forward(self, x):
        y = self.cache + self.w  # reads the buffer ...
        self.cache.copy_(x)  # ... which is then written in place
        return y.sin().sum()  # the backward needs y: saved, or recomputed from the *new* cache


def _cached_add_step(model):
    x = torch.linspace(-1, 1, 32, dtype=torch.float64).reshape(4, 8)
    out = model(x)
    out.backward()
    return out


@pytest.mark.parametrize("rule", ["on", "off"])
def test_ops_reading_a_buffer_written_later_are_not_recomputed(monkeypatch, rule):
    """y = cache + w is free to recompute from the cache (a buffer) and w: remat would keep nothing and
    recompute y in the backward, after copy_ has overwritten the cache.  With the rule off (simulated) the
    gradient is wrong; with it on, y is saved and the step equals eager, with one warning."""
    import remat.core.ir

    if rule == "off":  # FusionGraph.mutation_hazards finds none
        monkeypatch.setattr(remat.core.ir, "mutation_hazards", lambda records: {})
    model, reference = CachedAdd(), CachedAdd()
    jitted = remat.jit(model, runtime="torch")
    out, messages = run_recording(_cached_add_step, jitted)
    expected = _cached_add_step(reference)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(model.cache, reference.cache, rtol=0, atol=0)
    res = remat.executor_of(jitted).last_result
    if rule == "off":
        assert res.plan.recomputed_ops  # y recomputed from the overwritten cache ...
        assert not torch.allclose(model.w.grad, reference.w.grad)  # ... so the gradient is wrong
        return
    torch.testing.assert_close(model.w.grad, reference.w.grad, rtol=1e-12, atol=1e-14)
    assert not res.plan.recomputed_ops
    assert len(messages) == 1
    assert messages[0].startswith("in-place op(s) copy_ write buffers that 1 earlier forward op(s) read (add)")
    strict = remat.jit(CachedAdd(), runtime="torch", strict=True)
    with pytest.raises(remat.InPlaceError, match="copy_"):
        _cached_add_step(strict)


@pytest.mark.parametrize("mode", ["inference", "grad"])
def test_kv_cache_under_nvfuser_keeps_its_updates(monkeypatch, mode):
    """LitGPT's kv cache is a buffer updated in place (index_copy + copy_ into a view of it).  A region
    output is a fresh buffer under nvFuser: a view of the cache made inside a region would receive the
    update instead of the cache, and the next decode step would read zeros.  remat keeps every op that
    touches written storage out of regions.  Checked with the stand-in nvFuser (tests/fake_nvfuser.py);
    ``grad``: the user forgot inference mode, so the trace is a training one and the planner must also
    leave the cache reads alone."""
    import contextlib

    import remat.thunder.nvfuser

    fake_nvfuser.install(monkeypatch)
    monkeypatch.setattr(remat.thunder.nvfuser, "available", lambda: True)
    overrides = dict(n_layer=1, n_query_groups=2, intermediate_size=128)
    model = tiny_litgpt("Llama-2-7b-hf", **overrides).double()
    reference = tiny_litgpt("Llama-2-7b-hf", **overrides).double()
    reference.load_state_dict(model.state_dict())
    for m in (model, reference):
        m.eval()
        m.set_kv_cache(batch_size=1, max_seq_length=16, dtype=torch.float64)
    jitted = remat.jit(model, runtime="nvfuser")
    context = torch.inference_mode if mode == "inference" else contextlib.nullcontext
    prompt = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings(record=True) as caught, context():
        warnings.simplefilter("always")
        tokens, positions = [prompt], [torch.arange(5)]
        for position in range(5, 8):
            expected = reference(tokens[-1], positions[-1])
            logits = jitted(tokens[-1], positions[-1])
            torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-12)
            tokens.append(expected[:, -1:].argmax(-1))
            positions.append(torch.tensor([position]))
    torch.testing.assert_close(model.transformer.h[0].attn.kv_cache.k, reference.transformer.h[0].attn.kv_cache.k)
    messages = remat_warnings(caught)
    if mode == "inference":
        assert messages == []
    else:
        # one warning per compilation (the prefill shape, then the decode shape), for this one cause
        assert len(messages) == 2 and len(set(messages)) == 1, messages
        assert messages[0].startswith("in-place op(s) copy_ write buffers that 2 earlier forward op(s) read (shallow_copy x2)")
        res = remat.executor_of(jitted).last_result
        assert res.applied and not any("nvfuser rejected" in m.lower() for m in messages)
