"""remat: whole-trace, size-aware rematerialization for Lightning Thunder training traces.

``import remat`` is light: it imports neither Thunder nor torch.  Each public name below is loaded on
first use (PEP 562), from the module that owns it; Thunder (with its environment bridges,
:mod:`remat.thunder._compat`) is imported only by names that read or write traces.  Planning a plain
networkx graph (:func:`remat.solve`) never imports Thunder.

Layers (docs/design.md): :mod:`remat.core` (plain data), :mod:`remat.planning` (on the core),
:mod:`remat.thunder` (the only code that imports Thunder), and on top :mod:`remat.pipeline`,
:mod:`remat.compile`, :mod:`remat.viz`, :mod:`remat.report`, :mod:`remat.cli`, :mod:`remat.models`.
"""

from __future__ import annotations

import importlib
from typing import Any

from remat._version import __version__
from remat.errors import (
    GraphError,
    InfeasibleError,
    InPlaceError,
    NoBackwardError,
    OptimizationError,
    OptimizationWarning,
    RematError,
    TraceCaptureError,
    UnknownOpError,
    UnsupportedTraceError,
)

#: public name -> the module that owns it
_LAZY = {
    # the IR, memory model, policies (remat.core)
    "FusionGraph": "remat.core.ir",
    "Op": "remat.core.ir",
    "TensorInfo": "remat.core.ir",
    "Unit": "remat.core.ir",
    "MemoryBudget": "remat.core.memory",
    "MemoryProfile": "remat.core.memory",
    "TimelinePoint": "remat.core.memory",
    "FusionPolicy": "remat.core.policies",
    "RecomputePolicy": "remat.core.policies",
    # planning (remat.planning)
    "Plan": "remat.planning.plan",
    "ParetoPoint": "remat.planning.budget",
    "plan_memory": "remat.planning.budget",
    "solve": "remat.planning.solve",
    # traces (remat.thunder)
    "training_trace": "remat.thunder.capture",
    "read_trace": "remat.thunder.read",
    "fuse": "remat.thunder.fuse",
    "RematExecutor": "remat.thunder.executor",
    # the pipeline and Thunder's compile path
    "Result": "remat.pipeline",
    "optimize": "remat.pipeline",
    "pareto": "remat.pipeline",
    "estimate_memory": "remat.pipeline",
    "executor": "remat.compile",
    "executors": "remat.compile",
    "install": "remat.compile",
    "executor_of": "remat.compile",
    "jit": "remat.compile",
}
#: public submodules, loaded on first use
_SUBMODULES = ("nvfuser", "viz", "models", "testing")

__all__ = [
    "__version__",
    "GraphError",
    "InfeasibleError",
    "InPlaceError",
    "NoBackwardError",
    "OptimizationError",
    "OptimizationWarning",
    "RematError",
    "TraceCaptureError",
    "UnknownOpError",
    "UnsupportedTraceError",
    *_LAZY,
    *_SUBMODULES,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"remat.{name}")
    raise AttributeError(f"module 'remat' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
