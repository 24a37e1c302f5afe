"""Stage 1, *trace*: capture the joint forward+backward Thunder trace of a training step.

``training_trace(module_or_fn, *example_args)`` runs ``thunder.jit`` with a capture executor placed where
nvFuser sits on a GPU (after the ``sdpa`` operator executor).  Thunder calls a fusion executor's
``fusion_pass`` with the joint forward+backward trace, after autodiff and after operator executors
claimed what they execute, and before it splits the trace into a forward and a backward trace.  The
capture executor records that trace and stops compilation by raising a private exception, so nothing is
ever executed: no tensor math runs, and a model built on ``torch.device("meta")`` traces at full width
with almost no memory.

The capture executor claims exactly the operations nvFuser would (the prims listed in
:mod:`remat.ops`), and flattens every claimed bound symbol to those prims, as nvFuser's own pass does.
The returned trace therefore holds prims where nvFuser would fuse and torch-executor or sdpa symbols
elsewhere; :func:`remat.fuse` groups the prims into fusion regions.

Forward and backward parts are told apart the way Thunder's ``split_into_forward_and_backward`` does it
(see :func:`remat.graph.split_phases`): a bound symbol is *forward* when something the forward returns
(the ``fw_flat_out`` entry of the return) or one of its forward producers depends on it; everything else,
starting from the ``get_grad`` symbols that read the cotangents, is *backward*.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from remat import _compat
from remat.errors import NoBackwardError, TraceCaptureError
from remat.ops import NVFUSER_FUSIBLE_PRIMS

_compat.import_thunder()

import thunder  # noqa: E402
from thunder.core import prims  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, from_trace  # noqa: E402
from thunder.extend import FUEL_LEVEL, FusionExecutor  # noqa: E402

__all__ = ["training_trace", "is_joint_trace", "prim_name"]


def prim_name(bsym: BoundSymbol) -> str | None:
    """Lower-case PrimIDs name of a prim bound symbol (``"add"``), or None for non-prims."""
    sym_id = bsym.sym.id
    if isinstance(sym_id, prims.PrimIDs):
        return sym_id.name.lower()
    return None


class _Captured(Exception):
    """Raised by the capture executor to stop compilation once the joint trace is recorded."""


class _CaptureExecutor(FusionExecutor):
    """A fusion executor that claims what nvFuser would and records the trace it is handed."""

    def __init__(self) -> None:
        super().__init__("remat_capture")
        for name in NVFUSER_FUSIBLE_PRIMS:
            prim_id = getattr(prims.PrimIDs, name.upper(), None)
            if prim_id is not None:
                self.register_supported(prim_id)
        self.captured: TraceCtx | None = None

    def get_fuel(self, amount: int = 1, /) -> bool:
        return True

    def set_fuel(self, value: int | FUEL_LEVEL) -> None:
        pass

    def _flatten(self, bsym: BoundSymbol, out: list[BoundSymbol]) -> None:
        if self.can_execute(bsym):
            out.append(bsym)
            return
        for sub in bsym.subsymbols:
            self._flatten(sub, out)

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        flat: list[BoundSymbol] = []
        for bsym in trace.bound_symbols:
            if self.can_fuse(bsym) and not self.can_execute(bsym):
                self._flatten(bsym, flat)
            else:
                flat.append(bsym)
        captured = from_trace(trace)
        captured.bound_symbols = flat
        self.captured = captured
        raise _Captured()


def is_joint_trace(trace: TraceCtx) -> bool:
    """True when ``trace`` is a joint forward+backward trace (it reads cotangents with ``get_grad``)."""
    return any(bsym.sym.id == prims.PrimIDs.GET_GRAD for bsym in trace.bound_symbols)


def _requires_grad_anywhere(module_or_fn: Any, args: Sequence[Any]) -> bool:
    if isinstance(module_or_fn, torch.nn.Module) and any(p.requires_grad for p in module_or_fn.parameters()):
        return True
    leaves = []
    for a in args:
        if isinstance(a, (list, tuple)):
            leaves.extend(a)
        elif isinstance(a, dict):
            leaves.extend(a.values())
        else:
            leaves.append(a)
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in leaves)


def training_trace(
    module_or_fn: torch.nn.Module | Callable,
    *example_args: Any,
    executors: Sequence[Any] | None = None,
    **example_kwargs: Any,
) -> TraceCtx:
    """Return the joint forward+backward Thunder trace of ``module_or_fn(*example_args, **example_kwargs)``.

    Tracing uses proxies only; no tensor math runs (a model on ``torch.device("meta")`` works).  The
    backward part is Thunder's autodiff for cotangents of every differentiable output, so the function
    may return a loss or any tensor.

    Args:
        module_or_fn: a ``torch.nn.Module`` or a Python callable Thunder can trace.
        example_args, example_kwargs: example inputs; tensors may live on the meta device.
        executors: operator executors placed before the capture executor (default: Thunder's ``sdpa``
            executor, then remat's CPU attention executor (:mod:`remat.attention`), mirroring the GPU
            default ``[sdpa, nvfuser]``).

    Raises:
        TypeError: ``module_or_fn`` is not callable (or is already a Thunder-compiled object).
        NoBackwardError: nothing requires grad, so there is no backward part.
        TraceCaptureError: Thunder failed to trace; the message names Thunder's error.
    """
    if isinstance(module_or_fn, TraceCtx):
        raise TypeError("training_trace expects a torch.nn.Module or a function, got a Thunder trace")
    if not callable(module_or_fn):
        raise TypeError(f"training_trace expects a torch.nn.Module or a callable, got {type(module_or_fn).__name__}")
    if isinstance(module_or_fn, thunder.ThunderModule) or hasattr(module_or_fn, "_lc_cd"):
        raise TypeError("training_trace expects the plain module or function, not one already wrapped by thunder.jit")
    if not _requires_grad_anywhere(module_or_fn, example_args) and not _requires_grad_anywhere(
        None, tuple(example_kwargs.values())
    ):
        raise NoBackwardError(
            "nothing requires grad: no parameter or tensor argument has requires_grad=True, "
            "so the trace has no backward part"
        )

    capture = _CaptureExecutor()
    if executors is None:
        from remat.attention import attention_executor

        executors = [*(ex for ex in thunder.get_default_executors() if ex.name == "sdpa"), attention_executor]
    jitted = thunder.jit(module_or_fn, executors=[*executors, capture])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jitted(*example_args, **example_kwargs)
    except _Captured:
        pass
    except Exception as exc:  # Thunder's own errors: report the cause, not a deep traceback alone
        raise TraceCaptureError(
            f"Thunder could not trace {getattr(module_or_fn, '__name__', type(module_or_fn).__name__)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc

    trace = capture.captured
    if trace is None:
        raise TraceCaptureError("Thunder finished without handing a trace to the capture executor")
    if not is_joint_trace(trace):
        raise NoBackwardError(
            "the traced function has no backward part (no output depends on a tensor that requires grad)"
        )
    return trace
