"""Region runtimes: what runs a fusion region (keyword ``runtime=`` of ``remat.jit`` / ``remat.executor``).

``"torch"``: the region's prims become a small Thunder trace, mapped to Thunder's torch executor and
turned into a Python function (no compilation).  It is the CPU reference: exact eager PyTorch
numerics, no fusion speed-up.  The function is built on the region's first call, so forming regions and
planning stay cheap.
``"nvfuser"``: the region as an nvFuser FusionDefinition (:mod:`remat.thunder.nvfuser`), with the torch
reference as its fallback.
``"inductor"``: the region as one ``torch.compile``d function (:mod:`remat.thunder.inductor`: Triton
kernels on a GPU, C++ on a CPU), with the torch reference as its fallback.
``"auto"``: nvFuser where it imports and CUDA is available, else torch (with one warning when nvFuser is
installed but unusable).

``"inductor-graph"`` (:data:`GRAPH_RUNTIME`) is not a region runtime but a whole-trace one: the planned
forward and backward each run as one Inductor graph (:mod:`remat.thunder.graph`), with ``"inductor"``
regions as the fallback.  It needs a Thunder transform next to the executor, so only ``remat.jit`` (which
passes both to ``thunder.jit``) takes it; an executor alone refuses it with a message saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


import thunder
from thunder.core import prims
from thunder.core.codeutils import SigInfo
from thunder.core.proxies import Proxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors.passes import _transform_for_operator_executor_execution, del_last_used

from remat.errors import warn
from remat.thunder import inductor, nvfuser
from remat.thunder.execute import thunder_context

__all__ = ["RUNTIMES", "GRAPH_RUNTIME", "resolve_runtime", "region_callable", "region_trace", "TorchRegionCallable"]

#: The values of ``runtime=`` for regions (what a :class:`~remat.thunder.regions.RegionExecutor` takes).
RUNTIMES = ("auto", "torch", "nvfuser", "inductor")
#: The value of ``remat.jit(runtime=...)`` compiling each planned trace as one Inductor graph.
GRAPH_RUNTIME = "inductor-graph"


def resolve_runtime(runtime: str) -> str:
    """``"torch"``, ``"nvfuser"`` or ``"inductor"`` for a value of ``runtime=`` (see the module docstring).  Raises
    ``ValueError`` for an unknown name and ``RuntimeError`` for ``"nvfuser"`` where it cannot run."""
    if runtime == GRAPH_RUNTIME:
        raise ValueError(
            f"runtime={GRAPH_RUNTIME!r} compiles whole traces, which an executor alone cannot do: use "
            f"remat.jit(fn, runtime={GRAPH_RUNTIME!r}); thunder.jit(fn, executors=remat.executors(runtime='inductor'), "
            "transforms=[remat.thunder.graph.InductorGraphTransform()]) (ThunderCompiler takes the same two arguments); "
            f"or, for a trainer you do not own (ThunderFX included), remat.install(runtime={GRAPH_RUNTIME!r})"
        )
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")
    if runtime == "nvfuser":
        if not nvfuser.available():
            raise RuntimeError("runtime='nvfuser' needs nvfuser_direct and a CUDA device; use runtime='auto' or 'torch'")
        return runtime
    if runtime == "inductor":
        if not inductor.available():
            raise RuntimeError("runtime='inductor' needs a torch build with torch.compile; use runtime='auto' or 'torch'")
        return runtime
    if runtime == "torch":
        return runtime
    if nvfuser.available():
        return "nvfuser"
    if nvfuser.version() is not None:
        warn("nvFuser is installed but CUDA is not available: remat runs regions with the torch executor", UserWarning)
    return "torch"


def region_callable(region: BoundSymbol, runtime: str):
    """The callable that runs ``region`` with a resolved ``runtime`` (``"torch"``, ``"nvfuser"`` or ``"inductor"``)."""
    reference = TorchRegionCallable(region.sym.name, region.subsymbols, region.args, region.output)
    if runtime == "nvfuser":
        return nvfuser.NvFuserRegionCallable(region, fallback=reference)
    if runtime == "inductor":
        return inductor.InductorRegionCallable(region, reference)
    return reference


def region_trace(bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]) -> TraceCtx:
    """A stand-alone trace ``(inputs) -> outputs`` holding the region's bound symbols."""
    trace = TraceCtx(None)
    trace.args = list(inputs)
    trace.kwargs = {}
    with tracectx(trace):
        for proxy in inputs:
            prims.unpack_trivial(proxy, name=proxy.name)
    trace.bound_symbols += list(bsyms)
    trace.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    for bsym in trace.bound_symbols:
        for out in bsym.flat_outs:
            if isinstance(out, Proxy) and out.name not in trace.names:
                trace.add_name(out.name)
    siginfo = SigInfo("remat_region")
    siginfo.args = [(p.name, None) for p in inputs]
    trace._siginfo = siginfo
    return trace


class TorchRegionCallable:
    """Runs a region's prims with Thunder's torch executor; built on first call."""

    def __init__(self, name: str, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]):
        self.name = name
        self.bsyms = tuple(bsyms)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self._fn: Callable | None = None

    def build(self) -> Callable:
        if self._fn is None:
            trace = region_trace(self.bsyms, self.inputs, self.outputs)
            with thunder_context():
                extrace = _transform_for_operator_executor_execution(trace, thunder.get_always_executors())
                # free each intermediate after its last use, as Thunder does for whole traces
                extrace = del_last_used(extrace)
            self._fn = extrace.python_callable(include_decorators=False)
        return self._fn

    def __call__(self, *args):
        return self.build()(*args)

    def __repr__(self) -> str:
        return f"TorchRegionCallable({self.name}, {len(self.bsyms)} ops)"
