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


def tiny_litgpt(name="pythia-14m", **overrides):
    from litgpt import GPT, Config

    fields = dict(n_layer=1, n_embd=64, n_head=4, block_size=64, padded_vocab_size=128, vocab_size=128)
    fields.update(overrides)
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


@pytest.fixture(scope="session")
def pythia_trace():
    """Joint trace of a 1-layer tiny GPT-NeoX (pythia) model on the meta device."""
    with torch.device("meta"):
        model = tiny_litgpt()
    idx = torch.zeros(1, 32, dtype=torch.long, device="meta")
    return remat.training_trace(model, idx)
