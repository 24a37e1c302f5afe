"""Stage 1, *trace*: capture the joint forward+backward Thunder trace of a training step.

``training_trace(module_or_fn, *example_args)`` runs ``thunder.jit`` with a capture executor placed where
nvFuser sits on a GPU (after the ``sdpa`` operator executor).  Thunder calls a fusion executor's
``fusion_pass`` with the joint forward+backward trace, after autodiff and after operator executors
claimed what they execute, and before it splits the trace into a forward and a backward trace.  The
capture executor records that trace and stops compilation by raising a private exception, so nothing is
ever executed: no tensor math runs, and a model built on ``torch.device("meta")`` traces at full width
with almost no memory.

The capture executor claims exactly the operations nvFuser would and flattens every claimed bound symbol
to those prims, as nvFuser's own pass does (:class:`remat.thunder.regions.ClaimingExecutor`).
The returned trace therefore holds prims where nvFuser would fuse and torch-executor or sdpa symbols
elsewhere; :func:`remat.fuse` groups the prims into fusion regions.

Forward and backward parts are told apart the way Thunder's ``split_into_forward_and_backward`` does it
(see :func:`remat.core.ir.split_phases`): a bound symbol is *forward* when something the forward returns
(the ``fw_flat_out`` entry of the return) or one of its forward producers depends on it; everything else,
starting from the ``get_grad`` symbols that read the cotangents, is *backward*.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

import thunder
from thunder.core import prims
from thunder.core.trace import TraceCtx, from_trace

from remat._logging import stage
from remat.errors import NoBackwardError, TraceCaptureError
from remat.thunder.attention import attention_executor
from remat.thunder.regions import ClaimingExecutor

__all__ = ["training_trace", "is_joint_trace", "is_thunder_compiled"]


def is_thunder_compiled(obj: Any) -> bool:
    """Whether ``obj`` was already made by ``thunder.jit`` (a ThunderModule or a jitted function)."""
    return isinstance(obj, thunder.ThunderModule) or hasattr(obj, "_lc_cd")


class _Captured(Exception):
    """Raised by the capture executor to stop compilation once the joint trace is recorded."""


class _CaptureExecutor(ClaimingExecutor):
    """A fusion executor that claims what nvFuser would and records the trace it is handed."""

    def __init__(self) -> None:
        super().__init__("remat_capture")
        self.captured: TraceCtx | None = None

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        captured = from_trace(trace)
        captured.bound_symbols = self.flatten(trace.bound_symbols)
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
            executor, then remat's CPU attention executor (:mod:`remat.thunder.attention`), mirroring the GPU
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
    if is_thunder_compiled(module_or_fn):
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
        executors = [*(ex for ex in thunder.get_default_executors() if ex.name == "sdpa"), attention_executor]
    jitted = thunder.jit(module_or_fn, executors=[*executors, capture])
    try:
        with stage("trace") as tracing, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                jitted(*example_args, **example_kwargs)
            except _Captured:
                tracing.detail = f"{len(capture.captured.bound_symbols)} symbols"
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
