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

With ``FusionPolicy(small_regions_in_torch=True)``, small regions run as ATen calls under every runtime: a
region made only of shape ops, dtype conversions and sums of a float32 conversion of an input (a bias
gradient: ``convert -> sum -> convert``; a layout copy: ``transpose -> reshape``) is one or two ATen kernels
either way, and nvFuser's ``FusionDefinition.execute`` (or Inductor's launch path) costs about 100 us of
host time a call against 5-20 us for an ATen call (docs/benchmarks.md): in a LitGPT backward the host is as
slow as the GPU. Each sum of a float32 conversion becomes ``torch.sum(x, dims, dtype=torch.float32)``, which
accumulates in float32 as the region did without materializing the float32 copy (:func:`aten_region`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


import thunder
import torch
import thunder.torch as ltorch
from thunder.core import dtypes, prims
from thunder.core.codeutils import SigInfo
from thunder.core.proxies import Proxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors.passes import _transform_for_operator_executor_execution, del_last_used

from remat.core.ops import SHAPE_ONLY_KINDS
from remat.errors import warn
from remat.thunder import inductor, nvfuser
from remat.thunder.execute import thunder_context
from remat.thunder.read import op_kind

__all__ = ["RUNTIMES", "resolve_runtime", "region_callable", "region_trace", "aten_region", "TorchRegionCallable"]

#: The values of ``runtime=``.
RUNTIMES = ("auto", "torch", "nvfuser", "inductor")


def resolve_runtime(runtime: str) -> str:
    """``"torch"``, ``"nvfuser"`` or ``"inductor"`` for a value of ``runtime=`` (see the module docstring).  Raises
    ``ValueError`` for an unknown name and ``RuntimeError`` for ``"nvfuser"`` where it cannot run."""
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


#: The most ATen calls a region may take to run as ATen calls (see :func:`aten_region`): past that, one
#: fused kernel beats the launches it saves.
ATEN_REGION_MAX_CALLS = 4


def aten_region(region: BoundSymbol) -> TorchRegionCallable | None:
    """A torch callable for a region small enough to run as a few ATen calls (module docstring), or None.

    It qualifies when every op is a shape op, ``shallow_copy``, ``convert_element_type`` or a ``sum`` whose
    operand is a float32 conversion of a region input read by nothing else, and at most
    :data:`ATEN_REGION_MAX_CALLS` of its ops launch work (conversions and sums; shape ops are views or one
    copy).  The sum and its conversion become one ``ltorch.sum(x, dims, dtype=float32)``, bound to the
    sum's own output, so the region's outputs and their names are unchanged."""
    bsyms = list(region.subsymbols)
    kinds = [op_kind(b) for b in bsyms]
    if not bsyms or any(k not in SHAPE_ONLY_KINDS and k not in ("convert_element_type", "sum") for k in kinds):
        return None
    inputs = {p.name for p in region.args if isinstance(p, Proxy)}
    readers: dict[str, int] = {}
    for b in bsyms:
        for p in b.flat_proxy_args:
            readers[p.name] = readers.get(p.name, 0) + 1
    outputs = {p.name for p in region.flat_proxy_outs}
    producer = {p.name: i for i, b in enumerate(bsyms) for p in b.flat_proxy_outs}
    rewritten: list[BoundSymbol | None] = list(bsyms)
    for i, (b, kind) in enumerate(zip(bsyms, kinds)):
        if kind != "sum":
            continue
        operand = b.args[0]
        j = producer.get(operand.name)
        if j is None or kinds[j] != "convert_element_type" or operand.dtype is not dtypes.float32:
            return None
        source = bsyms[j].args[0]
        if source.name not in inputs or readers.get(operand.name) != 1 or operand.name in outputs:
            return None
        if not dtypes.is_float_dtype(source.dtype):
            return None
        rewritten[j] = None
        # a torch dtype: the torch executor passes keyword arguments through to torch.sum as they are
        rewritten[i] = ltorch.sum.bind(source, tuple(b.args[1]), False, dtype=torch.float32, output=b.output)
    kept = [b for b in rewritten if b is not None]
    if sum(1 for b in kept if op_kind(b) not in SHAPE_ONLY_KINDS) > ATEN_REGION_MAX_CALLS:
        return None
    return TorchRegionCallable(region.sym.name, kept, region.args, region.output)


def region_callable(region: BoundSymbol, runtime: str, small_regions_in_torch: bool = False):
    """The callable that runs ``region`` with a resolved ``runtime`` (``"torch"``, ``"nvfuser"`` or
    ``"inductor"``); with ``small_regions_in_torch``, a region :func:`aten_region` takes runs as ATen calls."""
    if small_regions_in_torch and runtime != "torch":
        small = aten_region(region)
        if small is not None:
            return small
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
