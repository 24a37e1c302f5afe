"""Fusion regions as Thunder bound symbols, and the executors that claim nvFuser's prims.

A region is a Thunder fusion bound symbol (``bsym.sym.is_fusion``) whose subsymbols are prims, whose
``args`` are the values it reads from outside and whose ``output`` is the values it writes for later
units.  The symbol's executor is a :class:`RegionExecutor`, a Thunder ``FusionExecutor`` that claims the
prims nvFuser claims, so Thunder's own passes (``rematerialize``, ``update_fusion_call_ctx``) accept
traces made of these regions.  Each region carries a callable chosen by its runtime
(:mod:`remat.thunder.runtimes`: the torch reference, or nvFuser).

:class:`ClaimingExecutor` is the one place that says what remat claims from Thunder (nvFuser's prims,
:data:`remat.core.ops.NVFUSER_FUSIBLE_PRIMS`) and how claimed symbols are flattened to those prims; the
capture executor (:mod:`remat.thunder.capture`) and the executor inside ``thunder.jit``
(:mod:`remat.thunder.executor`) are both ClaimingExecutors.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

from thunder.core import prims
from thunder.core.proxies import Proxy, unvariableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.extend import FUEL_LEVEL, FusionExecutor

from remat._version import __version__
from remat.core.layout import region_io as core_region_io
from remat.core.layout import region_name
from remat.core.ops import NVFUSER_FUSIBLE_PRIMS
from remat.thunder.runtimes import region_callable, resolve_runtime

__all__ = ["ClaimingExecutor", "RegionExecutor", "make_region", "region_io", "default_region_executor"]

_NAME = operator.attrgetter("name")


class ClaimingExecutor(FusionExecutor):
    """A fusion executor that claims the prims nvFuser claims and never runs out of fuel."""

    def __init__(self, name: str) -> None:
        super().__init__(name, version=__version__)
        for prim in NVFUSER_FUSIBLE_PRIMS:
            prim_id = getattr(prims.PrimIDs, prim.upper(), None)
            if prim_id is not None:
                self.register_supported(prim_id)

    def get_fuel(self, amount: int = 1, /) -> bool:
        return True

    def set_fuel(self, value: int | FUEL_LEVEL) -> None:
        pass

    def flatten(self, bsyms: Iterable[BoundSymbol]) -> list[BoundSymbol]:
        """``bsyms`` with each symbol this executor claimed whole (e.g. ``ltorch.gelu``) replaced by the
        prims it can run, as nvFuser's own pass does; leaves it cannot run stay as they are."""
        flat: list[BoundSymbol] = []

        def visit(bsym: BoundSymbol) -> None:
            if self.can_execute(bsym) or not bsym.subsymbols:
                flat.append(bsym)
                return
            for sub in bsym.subsymbols:
                visit(sub)

        for bsym in bsyms:
            if self.can_fuse(bsym) and not self.can_execute(bsym):
                visit(bsym)
            else:
                flat.append(bsym)
        return flat


class RegionExecutor(ClaimingExecutor):
    """The executor owning remat's regions.  ``runtime`` picks what runs them (see
    :func:`remat.thunder.runtimes.resolve_runtime`): ``"torch"`` (the CPU reference), ``"nvfuser"`` or
    ``"auto"``."""

    def __init__(self, name: str = "remat", *, runtime: str = "torch") -> None:
        runtime = resolve_runtime(runtime)
        super().__init__(name)
        self.runtime = runtime

    def region_callable(self, region: BoundSymbol):
        return region_callable(region, self.runtime)

    def fuse(self, region, fusion_counter: int) -> BoundSymbol:
        """Thunder's hook (``update_fusion_call_ctx``): rebuild a region from its parts."""
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        return make_region(self, region_name(fusion_counter), region.bound_symbols, inputs, outputs)


_default: RegionExecutor | None = None


def default_region_executor() -> RegionExecutor:
    """The executor of regions made without one (the torch reference runtime)."""
    global _default
    if _default is None:
        _default = RegionExecutor()
    return _default


def make_region(
    executor: RegionExecutor,
    name: str,
    bsyms: Sequence[BoundSymbol],
    inputs: Sequence[Proxy],
    outputs: Sequence[Proxy],
) -> BoundSymbol:
    """A fusion bound symbol ``outputs = name(*inputs)`` running ``bsyms``."""
    sym = Symbol(name, meta=None, is_fusion=True, executor=executor)
    call_ctx: dict = {}
    region = BoundSymbol(sym, tuple(inputs), {}, tuple(outputs), tuple(bsyms), _call_ctx=call_ctx)
    call_ctx[name] = executor.region_callable(region)  # the callable needs the region it runs
    return region


def region_io(bsyms: Sequence[BoundSymbol], needed_after: Iterable[str] | None) -> tuple[list[Proxy], list[Proxy]]:
    """Inputs (read, not written inside, in order of first use) and outputs (written inside and in
    ``needed_after``, in order of definition) of a group of bound symbols, as proxies
    (:func:`remat.core.layout.region_io`)."""
    wanted = set(needed_after) if needed_after is not None else None
    return core_region_io(((b.flat_proxy_args, b.flat_proxy_outs) for b in bsyms), wanted, _NAME)
