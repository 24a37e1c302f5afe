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
    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
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


def test_plan_false_fuses_without_any_rematerialization():
    """``plan=False``: regions only (no remat cut, no Thunder rematerialize), to tell a region's
    numerics from the cut's; the step still matches eager."""
    model = tiny_litgpt()
    idx = torch.randint(0, 128, (1, 8))
    expected_loss, expected_grads = train_step(model, idx)
    jitted = remat.jit(model, runtime="torch", plan=False)
    loss, grads = train_step(jitted, idx)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    ex = remat.executor_of(jitted)
    assert ex.optimizer is None and ex.last_result is None
    with pytest.raises(ValueError, match="plan=False"):
        remat.jit(model, plan=False, memory_budget=0.5)
    with pytest.raises(TypeError, match="plan"):
        remat.executor(plan="no")


def test_executors_for_code_you_do_not_own():
    """``thunder.jit(model, executors=remat.executors())``: loss and gradients equal eager's, and remat
    planned the step (issue 16)."""
    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
    import thunder

    model = tiny_litgpt()
    idx = torch.randint(0, 128, (1, 8))
    expected_loss, expected_grads = train_step(model, idx)
    executors = remat.executors(runtime="torch")
    assert isinstance(executors[-1], remat.thunder.executor.RematExecutor)
    loss, grads = train_step(thunder.jit(model, executors=executors), idx)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert executors[-1].last_result is not None and executors[-1].last_result.plan is not None


def test_install_makes_remat_thunders_default_and_undoes_it():
    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
    import thunder

    before = thunder.get_default_executors()
    model = tiny_litgpt()
    idx = torch.randint(0, 128, (1, 8))
    expected_loss, expected_grads = train_step(model, idx)
    with remat.install(runtime="torch") as installed:
        assert thunder.get_default_executors() == tuple(installed.executors)
        jitted = thunder.jit(model)  # no executors=: a trainer you do not own
        loss, grads = train_step(jitted, idx)
    assert thunder.get_default_executors() == before and not installed.installed
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert installed.executors[-1].last_result is not None
    # a plain call, undone by hand; undoing twice does nothing
    installed = remat.install(runtime="torch")
    assert thunder.get_default_executors()[-1] is installed.executors[-1]
    installed.uninstall()
    installed.uninstall()
    assert thunder.get_default_executors() == before


def test_thunders_prologue_pruning_composes_with_remat():
    """The recipe of docs/api.md ("Host time before the first kernel"): Thunder's ``PrunePrologueChecks``
    next to remat's plan.  The step trains like eager, remat still plans it, and the prologue no longer
    checks the module's tensors or attributes; remat's guard (``remat.thunder.prologue``, next test) sees
    ``eval()`` instead."""
    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
    import thunder
    from thunder.transforms.prune_prologue_checks import PrunePrologueChecks

    model = tiny_litgpt()
    idx = torch.randint(0, 128, (1, 8))
    expected_loss, expected_grads = train_step(model, idx)
    jitted = remat.jit(model, runtime="torch", transforms=[PrunePrologueChecks()])
    loss, grads = train_step(jitted, idx)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert remat.executor_of(jitted).last_result is not None  # remat planned the step
    prologue = thunder.last_prologue_traces(jitted)[-1]
    checked = [b.args[0].name for b in prologue.bound_symbols if b.sym.name == "check_tensor_metadata"]
    assert checked == ["idx"]  # the input only, none of the module's parameters or buffers
    numbers = [b.args[0].name for b in prologue.bound_symbols if b.sym.name == "check_number_type_and_value"]
    assert numbers and all(name.startswith("cache_info") for name in numbers)  # autocast, grad mode: not the module's
    assert jitted._remat_prologue_guard is not None  # what sees eval() instead: the next test


def test_pruned_prologue_guard_sees_what_the_pruned_checks_no_longer_see():
    """``PrunePrologueChecks`` alone runs the trace compiled for the module as it was: after ``eval()``,
    dropout would still drop.  remat.jit's guard reads the module's state before each call (training
    flags, parameters' shapes, dtypes, ``requires_grad``) and gives Thunder the compilations of that
    state: the eval output is eager's, a frozen parameter gets no gradient, switching back compiles
    nothing new.  Without the transform there is no guard (Thunder's checks are all there)."""
    import remat.thunder  # noqa: F401  (the compat bridge, before Thunder is imported on torch 2.13)
    import thunder
    from thunder.transforms.prune_prologue_checks import PrunePrologueChecks

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    jitted = remat.jit(model, runtime="torch", transforms=[PrunePrologueChecks()])
    guard = jitted._remat_prologue_guard
    x = torch.randn(16, 8)
    jitted(x).sum().backward()
    assert thunder.cache_misses(jitted) == 1 and guard.switches == 0
    model.eval()
    torch.testing.assert_close(jitted(x), model(x))  # no dropout: eager's eval output exactly
    assert thunder.cache_misses(jitted) == 2 and guard.switches == 1
    model.train()
    model.zero_grad(set_to_none=True)
    out = jitted(x)
    assert (out == 0).any()  # dropout again, from the first compilation
    out.sum().backward()
    assert thunder.cache_misses(jitted) == 2 and guard.switches == 2 and guard.states_compiled == 2
    model[0].bias.requires_grad_(False)
    model.zero_grad(set_to_none=True)
    jitted(x).sum().backward()
    assert model[0].bias.grad is None and model[0].weight.grad is not None
    assert thunder.cache_misses(jitted) == 3 and guard.states_compiled == 3
    # a parameter replaced by assignment (a registration): the guard reads the new one
    model[0].weight = torch.nn.Parameter(model[0].weight.detach().double())
    assert guard.state() != guard._state
    assert remat.jit(model, runtime="torch")._remat_prologue_guard is None
