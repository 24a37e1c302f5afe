"""Fusion regions as Thunder bound symbols.

A region is a Thunder fusion bound symbol (``bsym.sym.is_fusion``) whose subsymbols are prims, whose
``args`` are the values it reads from outside and whose ``output`` is the values it writes for later
units.  The symbol's executor is a :class:`RegionExecutor`, a Thunder ``FusionExecutor`` that claims the
prims nvFuser claims, so Thunder's own passes (``rematerialize``, ``update_fusion_call_ctx``) accept
traces made of these regions.  Each region carries a callable chosen by its backend (the torch
reference by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from remat import _compat
from remat.ops import NVFUSER_FUSIBLE_PRIMS

_compat.import_thunder()

from thunder.core import prims  # noqa: E402
from thunder.core.proxies import Proxy, unvariableify  # noqa: E402
from thunder.core.symbol import BoundSymbol, Symbol  # noqa: E402
from thunder.extend import FUEL_LEVEL, FusionExecutor  # noqa: E402

__all__ = ["RegionExecutor", "make_region", "region_io", "default_region_executor"]


BACKENDS = ("auto", "torch", "nvfuser")


class RegionExecutor(FusionExecutor):
    """The executor owning remat's regions.  ``backend`` picks what runs them: ``"torch"`` (the CPU
    reference: Thunder's torch executor, op by op), ``"nvfuser"`` (emitted FusionDefinitions, see
    :mod:`remat.nvfuser`) or ``"auto"`` (nvFuser where it imports and CUDA is available, else torch;
    with one warning when nvFuser is installed but unusable)."""

    def __init__(self, name: str = "remat", *, backend: str = "torch") -> None:
        from remat import __version__

        if backend not in BACKENDS:
            raise ValueError(f"unknown region backend {backend!r}; choose one of {BACKENDS}")
        super().__init__(name, version=__version__)
        self.backend = _resolve_backend(backend)
        for prim in NVFUSER_FUSIBLE_PRIMS:
            prim_id = getattr(prims.PrimIDs, prim.upper(), None)
            if prim_id is not None:
                self.register_supported(prim_id)

    def get_fuel(self, amount: int = 1, /) -> bool:
        return True

    def set_fuel(self, value: int | FUEL_LEVEL) -> None:
        pass

    def region_callable(self, region: BoundSymbol):
        from remat.backends import TorchRegionCallable

        reference = TorchRegionCallable(region.sym.name, region.subsymbols, region.args, region.output)
        if self.backend == "nvfuser":
            from remat.nvfuser import NvFuserRegionCallable

            return NvFuserRegionCallable(region, fallback=reference)
        return reference

    def fuse(self, region, fusion_counter: int) -> BoundSymbol:
        """Thunder's hook (``update_fusion_call_ctx``): rebuild a region from its parts."""
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        return make_region(self, f"nvFusion{fusion_counter}", region.bound_symbols, inputs, outputs)


_default: RegionExecutor | None = None


def default_region_executor() -> RegionExecutor:
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


def _resolve_backend(backend: str) -> str:
    if backend != "auto":
        if backend == "nvfuser":
            from remat.nvfuser import available

            if not available():
                raise RuntimeError("backend='nvfuser' needs nvfuser_direct and a CUDA device; use backend='auto' or 'torch'")
        return backend
    from remat.nvfuser import available, version

    if available():
        return "nvfuser"
    if version() is not None:
        import warnings

        warnings.warn("nvFuser is installed but CUDA is not available: remat runs regions with the torch executor", stacklevel=3)
    return "torch"


def region_io(
    bsyms: Sequence[BoundSymbol], needed_after: Iterable[str] | None
) -> tuple[list[Proxy], list[Proxy]]:
    """Inputs (read, not written inside, in order of first use) and outputs (written inside and in
    ``needed_after``, in order of definition) of a group of bound symbols."""
    produced: dict[str, Proxy] = {}
    inputs: dict[str, Proxy] = {}
    for bsym in bsyms:
        for p in bsym.flat_proxy_args:
            if p.name not in produced and p.name not in inputs:
                inputs[p.name] = p
        for p in bsym.flat_proxy_outs:
            produced.setdefault(p.name, p)
    needed = set(needed_after) if needed_after is not None else set(produced)
    outputs = [p for name, p in produced.items() if name in needed and name not in inputs]
    return list(inputs.values()), outputs
