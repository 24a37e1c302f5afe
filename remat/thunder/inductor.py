"""Stage 7, *emit*, for TorchInductor: a fusion region compiled by ``torch.compile`` (``runtime="inductor"``).

The region's prims become the same small Thunder trace the torch reference runs
(:class:`remat.thunder.runtimes.TorchRegionCallable`), and that function is handed to ``torch.compile``
(``fullgraph=True``, static shapes), which writes Triton kernels on a GPU and C++ on a CPU.  Why a
second code generator next to nvFuser: measured on an H200 (docs/benchmarks.md), nvFuser's elementwise
and reduction kernels took about twice as long as torch.compile's Triton kernels on the same LitGPT
blocks, and ``FusionDefinition.execute`` costs about 100 us of host time a call; remat's plan is the
same whichever generator writes the kernels.

What is shared: regions of identical layers are traced by Dynamo once each (a few hundred milliseconds)
but compiled once, through Inductor's own FX-graph cache (the same graph gives the same key).

What differs from nvFuser: Inductor may split a region into several kernels with buffers between them,
which the memory model does not see (as for nvFuser's matmul segments, docs/memory-model.md); the GPU
benchmarks report the estimate next to the measured peak.  A region that draws random numbers runs with
the torch reference, never compiled: Inductor's random numbers are not eager PyTorch's, and a mask drawn
in one region must equal the one recomputed in another.  If ``torch.compile`` fails on a region, that
region runs with the torch reference from then on, with one warning naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from thunder.core.symbol import BoundSymbol

from remat.core.ops import RNG_KINDS, STATELESS_RNG_KINDS
from remat.errors import warn
from remat.thunder.read import op_kind

__all__ = ["InductorRegionCallable", "available"]


def available() -> bool:
    """Whether ``torch.compile`` can run here (it needs a C++ compiler on a CPU, Triton on a GPU; this only
    checks that Dynamo is supported by the installed torch)."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # pragma: no cover - torch builds without Dynamo
        return False
    return torch._dynamo.is_dynamo_supported()


class InductorRegionCallable:
    """Runs a region as one ``torch.compile``d function, built on its first call from ``reference``'s
    (a :class:`~remat.thunder.runtimes.TorchRegionCallable`) Python function.  Falls back to the
    reference itself, with one warning, if compiling fails; regions drawing random numbers always use it."""

    def __init__(self, region: BoundSymbol, reference: Any):
        self.region = region
        self.reference = reference
        self.failed: str | None = None
        self._compiled: Callable | None = None
        if any(op_kind(sub) in RNG_KINDS | STATELESS_RNG_KINDS for sub in region.subsymbols):
            self.failed = "draws random numbers (runs with the torch reference: Inductor's numbers are not eager's)"

    def _build(self) -> Callable:
        # fullgraph: a region is straight-line tensor code, so a graph break means a bug, not a fallback
        # to be hidden; dynamic=False: Thunder's prologue fixes every shape.  no_grad outside the compiled
        # function: regions never need autograd (Thunder's Function owns it), and one grad mode means
        # one Dynamo guard set, not a recompilation when the backward runs with grad mode on
        return torch.no_grad()(torch.compile(self.reference.build(), fullgraph=True, dynamic=False))

    def __call__(self, *args):
        if self.failed is not None:
            return self.reference(*args)
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = self._build()
        try:
            return compiled(*args)
        except Exception as exc:  # Dynamo or Inductor refused the region: it runs eagerly from now on
            self.failed = f"{type(exc).__name__}: {exc}"
            warn(
                f"torch.compile rejected region {self.region.sym.name}; it runs with the torch executor instead "
                f"({self.failed.splitlines()[0][:200]})",
                UserWarning,
            )
            return self.reference(*args)

    def __repr__(self) -> str:
        return f"InductorRegionCallable({self.region.sym.name}, {len(self.region.subsymbols)} ops)"
