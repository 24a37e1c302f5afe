"""ThunderFX (``torch.compile(model, backend=thunder.dynamo.ThunderCompiler(...))``) with remat as the fusion
executor, on CPU: a training step matches eager PyTorch, also when dynamo hands Thunder several graphs
(issue 16).  On torch 2.13 this needs the compat bridge for ThunderFX (remat/thunder/_compat.py)."""

import pytest
import torch

import remat
from conftest import recorded_graphs, tiny_litgpt, train_step
from remat.thunder.executor import RematExecutor  # imports Thunder through the compat bridge

# after remat.thunder: on torch 2.13 Thunder imports only once the bridge is applied
import thunder
from thunder.dynamo import ThunderCompiler


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles LitGPT's code objects anew: dynamo's caches from another test (and its limit on
    recompilations, past which it silently runs eager) stay out of the comparison."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_step_matches_eager(model: torch.nn.Module, compiled: torch.nn.Module, idx: torch.Tensor) -> None:
    expected_loss, expected_grads = train_step(model, idx)
    loss, grads = train_step(compiled, idx)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(expected_grads)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def record_plans(ex: RematExecutor) -> list:
    """The remat executor's ``last_result`` after each of its compilations (one per Thunder function that
    Thunder compiles with it; None for an inference trace, which has nothing to rematerialize)."""
    results = []
    fusion_pass = ex.fusion_pass

    def recording_fusion_pass(trace):
        out = fusion_pass(trace)
        results.append(ex.last_result)
        return out

    ex.fusion_pass = recording_fusion_pass  # Thunder calls it on the instance (thunder/executors/passes.py)
    return results


def thunder_functions(backend: ThunderCompiler) -> list:
    """The thunder.jit functions ThunderFX made, over every graph dynamo handed it."""
    return [fn for info in backend.subgraph_infos for fn in info.thunder_compiled_fns]


def check_plain_litgpt(gpt) -> None:
    # the explicit forwards below follow GPT.forward for a config without these (pythia-14m has none)
    config = gpt.config
    assert not config.scale_embeddings and config.rope_indices is None and config.final_logit_softcapping is None


class GraphBreakGPT(torch.nn.Module):
    """A two-block LitGPT model whose forward asks dynamo for a graph break between the blocks (written out:
    dynamo gives up on a whole frame at a graph break inside a loop), so ThunderFX compiles two graphs."""

    def __init__(self, gpt) -> None:
        super().__init__()
        check_plain_litgpt(gpt)
        assert len(gpt.transformer.h) == 2
        self.gpt = gpt

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        gpt = self.gpt
        T = idx.size(1)
        cos, sin = gpt.cos[:T].unsqueeze(0), gpt.sin[:T].unsqueeze(0)
        x = gpt.transformer.h[0](gpt.transformer.wte(idx), cos, sin)
        torch._dynamo.graph_break()
        x = gpt.transformer.h[1](x, cos, sin)
        return gpt.lm_head(gpt.transformer.ln_f(x))


class GuardedGPT(torch.nn.Module):
    """A two-block LitGPT model with a data-dependent branch between the blocks (a guard against blow-ups
    that a training script might carry): dynamo cannot trace the branch and splits the graph there.  Its
    forward repeats GraphBreakGPT's on purpose: with the branch in a method of a shared base class, dynamo
    splits the frame into three graphs, not two."""

    def __init__(self, gpt) -> None:
        super().__init__()
        check_plain_litgpt(gpt)
        assert len(gpt.transformer.h) == 2
        self.gpt = gpt

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        gpt = self.gpt
        T = idx.size(1)
        cos, sin = gpt.cos[:T].unsqueeze(0), gpt.sin[:T].unsqueeze(0)
        x = gpt.transformer.h[0](gpt.transformer.wte(idx), cos, sin)
        if x.abs().max() > 1e4:  # not taken here; either way dynamo splits
            x = x.clamp(-1e4, 1e4)
        x = gpt.transformer.h[1](x, cos, sin)
        return gpt.lm_head(gpt.transformer.ln_f(x))


def test_graph_break_between_blocks_plans_each_thunder_function():
    gpt = tiny_litgpt(n_layer=2)
    model = GraphBreakGPT(gpt)
    idx = torch.randint(0, 128, (1, 8))
    executors = remat.executors(runtime="torch")
    plans = record_plans(executors[-1])
    backend = ThunderCompiler(executors=executors)
    assert_step_matches_eager(model, torch.compile(model, backend=backend), idx)
    assert len(backend.subgraph_infos) == 2 and len(thunder_functions(backend)) == 2
    # each Thunder function is a training trace of one block and was planned by remat on its own
    assert len(plans) == 2 and all(result is not None and result.plan is not None for result in plans)
    assert plans[0] is not plans[1] and executors[-1].last_result is plans[1]
    # (a model dynamo hands over whole, one Thunder function planned once: the install test below)


def test_dynamo_splits_at_a_data_dependent_branch():
    model = GuardedGPT(tiny_litgpt(n_layer=2))
    idx = torch.randint(0, 128, (1, 8))
    executors = remat.executors(runtime="torch")
    plans = record_plans(executors[-1])
    backend = ThunderCompiler(executors=executors)
    assert_step_matches_eager(model, torch.compile(model, backend=backend), idx)
    # dynamo split the model on its own: up to the branch (its test an output), and after it
    assert len(backend.subgraph_infos) == 2 and len(thunder_functions(backend)) == 2
    assert len(plans) == 2 and all(result is not None and result.plan is not None for result in plans)


def test_litgpt_blocks_compiled_on_their_own_when_dynamo_gives_up_on_the_model():
    """A hook with a data-dependent branch on a LitGPT block: the graph break sits inside GPT.forward's
    loop over blocks, so dynamo (torch 2.13) runs GPT.forward eagerly and compiles the blocks' forward on
    its own (one graph for both blocks here); the hook's test becomes a graph of its own, without
    gradients.  The counts are dynamo's choice, so only their kinds are checked."""
    model = tiny_litgpt(n_layer=2)

    def clamp_blow_ups(module, args, output):
        if output.abs().max() > 1e4:
            return output.clamp(-1e4, 1e4)
        return output

    model.transformer.h[0].register_forward_hook(clamp_blow_ups)
    idx = torch.randint(0, 128, (1, 8))
    executors = remat.executors(runtime="torch")
    plans = record_plans(executors[-1])
    backend = ThunderCompiler(executors=executors)
    assert_step_matches_eager(model, torch.compile(model, backend=backend), idx)
    assert len(thunder_functions(backend)) >= 2
    assert any(result is not None and result.plan is not None for result in plans)  # the block's
    assert any(result is None for result in plans)  # the hook's comparison: inference, nothing to plan


def test_install_makes_thunderfx_use_remat_without_executors():
    model = tiny_litgpt(n_layer=2)
    idx = torch.randint(0, 128, (1, 8))
    before = thunder.get_default_executors()
    with remat.install(runtime="torch") as installed:
        plans = record_plans(installed.executors[-1])
        backend = ThunderCompiler()  # no executors=: a trainer you do not own
        assert "executors" not in backend.thunder_options
        compiled = torch.compile(model, backend=backend)
        assert_step_matches_eager(model, compiled, idx)  # ThunderFX compiles on this first call, installed
    assert thunder.get_default_executors() == before
    assert len(thunder_functions(backend)) == 1
    assert len(plans) == 1 and plans[0] is not None and plans[0].plan is not None
    # compiled while installed, it keeps remat: a second step runs the same Thunder function
    assert_step_matches_eager(model, compiled, idx)
    assert len(plans) == 1 and len(thunder_functions(backend)) == 1


def test_install_with_the_graph_runtime_reaches_thunderfx(monkeypatch):
    """``remat.install(runtime="inductor-graph")`` adds remat's graph transform to ``thunder.jit`` while
    installed, and ThunderFX's backend looks ``thunder.jit`` up when it compiles a graph: its forward and
    backward each run as one graph (Inductor's compilation replaced by running the FX graph, as in
    tests/test_inductor_graph.py: no C++ build), and the step matches eager."""
    handed = recorded_graphs(monkeypatch)
    model = tiny_litgpt()
    idx = torch.randint(0, 128, (1, 8))
    with remat.install(runtime="inductor-graph"):
        backend = ThunderCompiler()
        compiled = torch.compile(model, backend=backend)
        assert_step_matches_eager(model, compiled, idx)
    (fn,) = thunder_functions(backend)
    forward, backward = thunder.last_traces(fn)[-1], thunder.last_backward_traces(fn)[-1]
    graphs = [b for trace in (forward, backward) for b in trace.bound_symbols if b.sym.name.startswith("remat_graph")]
    assert len(graphs) == 2 and len(handed) == 2
    assert all(b._call_ctx[b.sym.name].path == "inductor" for b in graphs)
    # and Thunder leaves the module's checks to Dynamo's guards under torch.compile (docs/api.md's recipe)
    prologue = thunder.last_prologue_traces(fn)[-1]
    assert not [b for b in prologue.bound_symbols if b.sym.name == "check_tensor_metadata"]
