"""Callables that run a fusion region.

``torch`` backend: the region's prims become a small Thunder trace, mapped to Thunder's torch executor
and turned into a Python function (no compilation).  It is the CPU reference: exact eager PyTorch
numerics, no fusion speed-up.  The function is built on the region's first call, so forming regions and
planning stay cheap.  The nvFuser backend lives in :mod:`remat.nvfuser`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from remat import _compat

_compat.import_thunder()

import thunder  # noqa: E402
from thunder.core import prims  # noqa: E402
from thunder.core.proxies import Proxy  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, tracectx  # noqa: E402

__all__ = ["region_trace", "TorchRegionCallable"]


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
    from thunder.core.codeutils import SigInfo

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
            from remat.execute import thunder_context
            from thunder.executors.passes import _transform_for_operator_executor_execution

            from thunder.executors.passes import del_last_used

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
