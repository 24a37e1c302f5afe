"""Exceptions and warnings remat raises.  Every error derives from :class:`RematError`."""

from __future__ import annotations

__all__ = [
    "RematError",
    "TraceCaptureError",
    "NoBackwardError",
    "UnsupportedTraceError",
    "GraphError",
    "InfeasibleError",
    "UnknownOpError",
    "InPlaceError",
    "OptimizationError",
    "OptimizationWarning",
]


class RematError(Exception):
    """Base class of every error remat raises on purpose."""


class TraceCaptureError(RematError, RuntimeError):
    """Thunder could not trace the given module or function."""


class NoBackwardError(RematError, ValueError):
    """The trace or function has no backward part (nothing requires grad)."""


class UnsupportedTraceError(RematError, ValueError):
    """The trace holds something remat cannot model (symbolic shapes, a non-Thunder object, ...)."""


class GraphError(RematError, ValueError):
    """A plain graph given to :func:`remat.solve` is malformed (cycle, missing attribute, ...)."""


class InfeasibleError(RematError, ValueError):
    """No finite cut exists: the backward needs a value that may neither be saved nor recomputed."""


class UnknownOpError(UnsupportedTraceError):
    """``strict=True``: the forward holds an op remat does not know (it would be left as it is)."""


class InPlaceError(UnsupportedTraceError):
    """``strict=True``: an in-place op writes a buffer that earlier ops read, so those ops would be left as
    they are (recomputing them after the write would read the new contents)."""


class OptimizationError(RematError, RuntimeError):
    """``strict=True``: fusing, solving or rewriting failed, or the plan would raise the estimated peak.
    Without ``strict`` remat keeps the trace as it was and warns (:class:`remat.OptimizationWarning`)."""


class OptimizationWarning(UserWarning):
    """remat left (part of) a trace as it was, or could not meet a request (a budget); the message says why."""
