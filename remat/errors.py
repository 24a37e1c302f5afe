"""Exceptions and warnings remat raises.  Every error derives from :class:`RematError`."""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from types import ModuleType

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
    "warn",
    "MissingExtraError",
    "require_extra",
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
    """``strict=True``: fusing, solving or rewriting failed, or a memory budget cannot be met.  Without
    ``strict`` remat keeps the best trace it has (Thunder's rematerialize or the input) and warns
    (:class:`remat.OptimizationWarning`)."""


class MissingExtraError(RematError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the extra."""


#: optional dependency -> the extra of setup.cfg that installs it
EXTRAS = {"litgpt": "models", "jsonargparse": "models", "matplotlib": "viz", "nvfuser_direct": "gpu"}


def require_extra(module: str, feature: str) -> ModuleType:
    """Import an optional dependency for ``feature``, or raise :class:`MissingExtraError` naming the
    ``pip install 'remat[...]'`` that brings it (a base install pulls neither LitGPT nor matplotlib)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:
            raise  # the dependency is there but something it imports is not: its own error
        extra = EXTRAS.get(module.split(".")[0], "test")
        raise MissingExtraError(f"{feature} needs {module.split('.')[0]}: pip install 'remat[{extra}]'") from exc


class OptimizationWarning(UserWarning):
    """remat left (part of) a trace as it was, or could not meet a request (a budget); the message says why."""


#: Packages whose frames are never "the caller's line": remat's own, and Thunder's and torch's, through which
#: ``thunder.jit`` calls remat's executor on the first call of a jitted function.
_LIBRARY_PACKAGES = ("remat", "thunder", "torch")


def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _LIBRARY_PACKAGES:
        module = sys.modules.get(name)  # a package that is not imported has no frame on the stack
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def warn(message: str, category: type[Warning] = OptimizationWarning) -> None:
    """``warnings.warn`` attributed to the user's line: the first frame outside remat, Thunder and torch
    (for ``remat.jit``, the line that called the jitted function), whatever depth remat warns from."""
    dirs = _library_dirs()
    frame = sys._getframe(1)
    level = 2  # stacklevel 2 is warn()'s caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(dirs):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
