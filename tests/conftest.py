import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

import remat  # noqa: E402

try:  # hypothesis profiles for the property tests (docs/testing.md)
    from hypothesis import settings as _hypothesis_settings

    # ci: bounded and derandomized (same examples every run), fits the suite's time budget.
    _hypothesis_settings.register_profile("ci", max_examples=100, derandomize=True, deadline=None, print_blob=True)
    # nightly: many more, random examples; failures are saved in .hypothesis/ and replayed first.
    _hypothesis_settings.register_profile("nightly", max_examples=2000, deadline=None, print_blob=True)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass


def assert_same_loss_and_grads(reference, optimized, *, seed: int = 1) -> int:
    """Run two joint traces on the same fp32 example inputs (token ids below 128, seeded) and assert every
    output and gradient equal bit for bit; returns how many were compared (None entries are skipped)."""
    from remat.thunder.execute import example_inputs, execute_joint

    inputs = example_inputs(reference, int_high=128, dtype=torch.float32)
    expected = execute_joint(reference, inputs, seed=seed)
    got = execute_joint(optimized, inputs, seed=seed)
    assert len(expected.outputs + expected.grads) == len(got.outputs + got.grads)
    compared = 0
    for a, b in zip(expected.outputs + expected.grads, got.outputs + got.grads):
        if a is not None:
            assert torch.equal(a, b)
            compared += 1
    return compared


#: what ``tiny_litgpt`` overrides in every LitGPT config unless asked otherwise
TINY_FIELDS = dict(n_layer=1, n_embd=64, n_head=4, block_size=64, padded_vocab_size=128, vocab_size=128)


def tiny_litgpt(name="pythia-14m", **overrides):
    from litgpt import GPT, Config

    fields = {**TINY_FIELDS, **overrides}
    config = Config.from_name(name, **fields)
    torch.manual_seed(0)
    return GPT(config)


def train_step(model, idx):
    """One training step from zero gradients: the loss and a copy of every parameter's gradient."""
    for p in model.parameters():
        p.grad = None
    loss = model(idx).float().pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def recorded_graphs(monkeypatch, compile=lambda: False) -> list:
    """The FX graphs remat's graph runtime hands to Inductor, in order.  Inductor compiles each while
    ``compile()`` is true; otherwise the graph runs eagerly (the same values, no C++ build)."""
    import torch._inductor.compile_fx as compile_fx

    graphs: list = []
    compile_inner = compile_fx.compile_fx_inner

    def record(graph, example_inputs, **kwargs):
        graphs.append(graph)
        return compile_inner(graph, example_inputs, **kwargs) if compile() else (lambda args: graph(*args))

    monkeypatch.setattr(compile_fx, "compile_fx_inner", record)
    return graphs


def _gpu_missing() -> str | None:
    """Why the ``gpu`` tests cannot run here (no CUDA device, or no nvFuser), or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if importlib.util.find_spec("nvfuser_direct") is None:  # looked up without importing Thunder
        return "needs nvFuser (nvfuser_direct); see ../shared/gpu/README.md"
    return None


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` (tests/test_gpu.py) are skipped, with the reason, where they cannot run: a CPU
    run reports them skipped, not failed."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _gpu_missing() if gpu_items else None
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


_TRACES: dict = {}


def traced(name="pythia-14m", *, seq=32, device="meta", **overrides):
    """The joint trace (``remat.training_trace``) of ``tiny_litgpt(name, **overrides)`` on a (1, seq) batch
    of token ids on ``device``, traced once per test run and shared by every test that asks for it.

    Tracing a tiny LitGPT model costs seconds (Thunder interprets the model's Python), so the test files
    share these traces rather than each tracing the same model.  Sharing is safe because nothing mutates a
    trace: remat never edits its input trace (tests/test_fallbacks.py checks that), and tests only read
    them.  ``device="meta"``: nothing can run; ``"cpu"``: the trace can be executed
    (``remat.thunder.execute``).  Token ids are zeros: a trace does not depend on their values."""
    # the fields as tiny_litgpt uses them: an override equal to its default is the same model
    key = (name, seq, str(device), tuple(sorted({**TINY_FIELDS, **overrides}.items())))
    if key not in _TRACES:
        with torch.device(device):
            model = tiny_litgpt(name, **overrides)
        idx = torch.zeros(1, seq, dtype=torch.long, device=device)
        _TRACES[key] = remat.training_trace(model, idx)
    return _TRACES[key]


# The shared tiny models (see ``traced``): a 1-layer pythia on meta, and the 2-layer pythia and LLaMAs on CPU
# that several files execute, plan and draw.
PYTHIA_2 = dict(name="pythia-14m", n_layer=2, seq=16, device="cpu")
LLAMA_2 = dict(name="Llama-2-7b-hf", n_layer=2, n_query_groups=2, intermediate_size=128, seq=16, device="cpu")
# A 2-layer tiny LLaMA whose activations outweigh its weights (width 32, sequence 64), as at long sequences
# on full-width models: its lowest plans recompute linears (test_stages, test_host, test_unfused_readers).
WIDE_LLAMA = dict(name="Llama-2-7b-hf", n_layer=2, n_query_groups=2, n_embd=32, n_head=2, intermediate_size=128, seq=64,
                  device="cpu")


@pytest.fixture(scope="session")
def pythia_trace():
    """Joint trace of a 1-layer tiny GPT-NeoX (pythia) model on the meta device (sequence 32)."""
    return traced("pythia-14m", seq=32, device="meta")
