"""LitGPT models for the demo, the report, the benchmarks and the examples: one place that builds them.

Real LitGPT architectures from their config names (``litgpt.Config.from_name``); weights are random (never
downloaded).  Needs the ``litgpt`` extra.

``litgpt_model(name, layers=2, seq=4096)``
    the config at full width (bf16, vocab 512 as in the DESIGN anchors), ``layers`` layers, on the meta
    device by default (tracing only: no memory, no math);
``litgpt_model(name, width="demo")``
    the demo's width: n_embd 128, 4 heads, MLP 512, fp32 (fast to trace and to run on a CPU);
``demo_model()``
    the model ``python -m remat demo`` traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from remat.errors import require_extra

__all__ = ["LitGPTModel", "VOCAB", "check_config_name", "litgpt_config", "litgpt_model", "demo_model"]

#: The vocabulary size of every model built here (the anchors in DESIGN.md use vocab 512).
VOCAB = 512
WIDTHS = ("full", "demo")
_DEMO_WIDTH = dict(n_embd=128, n_head=4, n_query_groups=4, intermediate_size=512)


@dataclass
class LitGPTModel:
    """A built model, a batch of token ids for it, its config and a line describing both."""

    model: torch.nn.Module
    idx: torch.Tensor
    config: Any
    description: str

    def __iter__(self):  # unpacks as (model, idx)
        return iter((self.model, self.idx))


def check_config_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a LitGPT config name."""
    Config = require_extra("litgpt", "LitGPT models (remat.models)").Config

    try:
        Config.from_name(name)
    except Exception as exc:  # litgpt raises ValueError with a message listing every name
        raise ValueError(f"{name!r} is not a LitGPT config name (see litgpt.Config.from_name)") from exc


def litgpt_config(name: str, layers: int = 2, seq: int = 4096, *, width: str = "full", vocab: int = VOCAB, **overrides: Any):
    """The ``litgpt.Config`` of :func:`litgpt_model` (``overrides`` go to ``Config.from_name``)."""
    Config = require_extra("litgpt", "LitGPT models (remat.models)").Config

    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1 or isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"layers and seq must be positive integers, got layers={layers!r}, seq={seq!r}")
    if width not in WIDTHS:
        raise ValueError(f"width must be one of {WIDTHS}, got {width!r}")
    check_config_name(name)
    fields = dict(n_layer=layers, block_size=seq, vocab_size=vocab, padded_vocab_size=vocab)
    if width == "demo":
        fields.update(_DEMO_WIDTH)
    fields.update(overrides)
    return Config.from_name(name, **fields)


def litgpt_model(
    name: str,
    layers: int = 2,
    seq: int = 4096,
    *,
    width: str = "full",
    batch: int = 1,
    device: str | torch.device = "meta",
    dtype: torch.dtype | None = None,
    vocab: int = VOCAB,
    seed: int = 0,
    **overrides: Any,
) -> LitGPTModel:
    """A LitGPT ``GPT`` for config ``name`` and a ``(batch, seq)`` batch of token ids on ``device``.

    ``dtype``: the parameters' dtype (default: bf16 at full width, fp32 at demo width).  Raises
    ``ValueError`` for an unknown config name, width or a non-positive layer count or sequence length."""
    GPT = require_extra("litgpt", "LitGPT models (remat.models)").GPT

    config = litgpt_config(name, layers, seq, width=width, vocab=vocab, **overrides)
    dtype = dtype or (torch.bfloat16 if width == "full" else torch.float32)
    with torch.device(device):
        torch.manual_seed(seed)
        model = GPT(config).to(dtype)
        idx = torch.randint(0, vocab, (batch, seq))
    sizes = f"n_embd {config.n_embd}, {config.n_head} heads, {config.n_query_groups} query groups, MLP {config.intermediate_size}"
    if overrides:
        shape = f"a custom width ({sizes})"
    elif width == "full":
        shape = f"full width ({sizes})"
    else:
        shape = "shrunk to n_embd 128 (demo width)"
    description = (
        f"LitGPT `{name}` at {shape}, {layers} layers, {str(dtype).removeprefix('torch.')}, batch {batch}, seq {seq}, "
        f"vocab {vocab}"
    )
    return LitGPTModel(model, idx, config, description)


def demo_model(name: str = "stablecode-completion-alpha-3b", layers: int = 2, seq: int = 256, device: str = "meta") -> LitGPTModel:
    """The demo's model: a LitGPT config shrunk to n_embd 128 (real architecture, tiny width), fp32."""
    return litgpt_model(name, layers, seq, width="demo", device=device)
