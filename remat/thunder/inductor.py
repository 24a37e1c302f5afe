"""Stage 7, *emit*, for TorchInductor: a fusion region compiled by ``torch.compile`` (``runtime="inductor"``).

The region's prims become the same small Thunder trace the torch reference runs
(:class:`remat.thunder.runtimes.TorchRegionCallable`), and that function is handed to ``torch.compile``
(``fullgraph=True``, static shapes), which writes Triton kernels on a GPU and C++ on a CPU.  Why a
second code generator next to nvFuser: measured on an H200 (docs/benchmarks.md), nvFuser's elementwise
and reduction kernels took about twice as long as torch.compile's Triton kernels on the same LitGPT
blocks, and ``FusionDefinition.execute`` costs about 100 us of host time a call; remat's plan is the
same whichever generator writes the kernels.

How a region is called: a region whose arguments are all tensors and that writes into none of them is
traced once per input layout (strides) with ``make_fx`` (Inductor's decompositions, fake tensors) and
handed straight to Inductor (``compile_fx_inner``), so that a call is Inductor's generated ``call`` and
nothing else: no Dynamo frame evaluation or guards, no AOTAutograd wrappers.  Those cost about 25 us a call
on this project's CPU (5.7 against 30.8 us for a three-output region; ``benchmarks/gpu_host.py`` measures
region host time on the GPU, docs/benchmarks.md), and a LitGPT training step calls 30-40 regions.  These are private entry points
of torch; if they are missing or fail on a region, that region goes through ``torch.compile``
(``fullgraph=True``, static shapes) as before, and :attr:`InductorRegionCallable.path` says which one ran.

What is shared: regions of identical layers are traced once each (a few hundred milliseconds)
but compiled once, through Inductor's own FX-graph cache (the same graph gives the same key).

What differs from nvFuser: Inductor may split a region into several kernels with buffers between them,
which the memory model does not see (as for nvFuser's matmul segments, docs/memory-model.md); the GPU
benchmarks report the estimate next to the measured peak.  A region that draws random numbers runs with
the torch reference, never compiled: Inductor's random numbers are not eager PyTorch's, and a mask drawn
in one region must equal the one recomputed in another.  If ``torch.compile`` fails on a region, that
region runs with the torch reference from then on, with one warning naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol

from remat.core.ops import IN_PLACE_KINDS, RNG_KINDS, STATELESS_RNG_KINDS
from remat._logging import logger
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
    """Runs a region as Inductor-compiled code, built on its first call (per input layout) from
    ``reference``'s (a :class:`~remat.thunder.runtimes.TorchRegionCallable`) Python function: directly
    through Inductor where it can (see the module docstring), else as one ``torch.compile``d function.
    Falls back to the reference itself, with one warning, if compiling fails; regions drawing random
    numbers always use it.

    ``path`` is ``"inductor"`` (the direct call), ``"torch.compile"``, ``"reference"`` or ``None`` before
    the first call."""

    def __init__(self, region: BoundSymbol, reference: Any):
        self.region = region
        self.reference = reference
        self.failed: str | None = None
        self.path: str | None = None
        self._compiled: Callable | None = None  # the torch.compile'd function, when that path runs
        self._direct: dict[tuple, Callable] = {}  # input strides -> Inductor's compiled graph
        if any(op_kind(sub) in RNG_KINDS | STATELESS_RNG_KINDS for sub in region.subsymbols):
            self.failed = "draws random numbers (runs with the torch reference: Inductor's numbers are not eager's)"
            self.path = "reference"
        # The direct path bakes every non-tensor argument into the graph and compiles a functional graph,
        # so it is only taken for regions of tensor arguments that write into none of them.
        self._direct_possible = all(isinstance(a, TensorProxy) for a in region.args) and not any(
            op_kind(sub) in IN_PLACE_KINDS for sub in region.subsymbols
        )

    def _build(self) -> Callable:
        # fullgraph: a region is straight-line tensor code, so a graph break means a bug, not a fallback
        # to be hidden; dynamic=False: Thunder's prologue fixes every shape.  no_grad outside the compiled
        # function: regions never need autograd (Thunder's Function owns it), and one grad mode means
        # one Dynamo guard set, not a recompilation when the backward runs with grad mode on
        return torch.no_grad()(torch.compile(self.reference.build(), fullgraph=True, dynamic=False))

    def _build_direct(self, args: Sequence[Any]) -> Callable:
        """Inductor's compiled graph for these arguments' layout (raises if any step fails)."""
        from torch._inductor.compile_fx import compile_fx_inner
        from torch._inductor.decomposition import select_decomp_table
        from torch.fx.experimental.proxy_tensor import make_fx

        import torch._inductor.config as inductor_config

        with torch.no_grad():
            graph = make_fx(self.reference.build(), decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
            # no size/stride assertions in the generated code (about 0.5 us an argument a call, measured on a
            # CPU): Thunder's prologue fixes the shapes and each layout has its own compiled graph here
            with inductor_config.patch(size_asserts=False):
                return compile_fx_inner(graph, list(args))

    def _direct_for(self, args: tuple) -> Callable | None:
        """The direct path's compiled graph for these arguments' layout, or ``None`` (from now on) where
        it cannot be built."""
        key = tuple(a.stride() for a in args)
        compiled = self._direct.get(key)
        if compiled is None:
            try:
                compiled = self._direct[key] = self._build_direct(args)
            except Exception as exc:  # private API moved or a graph Inductor cannot take: use torch.compile
                logger.info("region %s goes through torch.compile (%s: %s)", self.region.sym.name, type(exc).__name__, str(exc)[:200])
                self._direct_possible = False
        return compiled

    def __call__(self, *args):
        if self.failed is not None:
            return self.reference(*args)
        try:
            direct = self._direct_for(args) if self._direct_possible else None
            if direct is not None:
                self.path = "inductor"
                with torch.no_grad():
                    return direct(list(args))  # Inductor's boxed calling convention: it may clear the list
            compiled = self._compiled
            if compiled is None:
                compiled = self._compiled = self._build()
            self.path = "torch.compile"
            return compiled(*args)
        except Exception as exc:  # Dynamo or Inductor refused the region: it runs eagerly from now on
            self.failed = f"{type(exc).__name__}: {exc}"
            self.path = "reference"
            warn(
                f"torch.compile rejected region {self.region.sym.name}; it runs with the torch executor instead "
                f"({self.failed.splitlines()[0][:200]})",
                UserWarning,
            )
            return self.reference(*args)

    def __repr__(self) -> str:
        return f"InductorRegionCallable({self.region.sym.name}, {len(self.region.subsymbols)} ops)"
