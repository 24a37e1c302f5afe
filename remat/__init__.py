"""remat: whole-trace, size-aware rematerialization for Lightning Thunder training traces."""

from remat import _compat

_compat.import_thunder()

from remat.errors import (  # noqa: E402
    GraphError,
    InfeasibleError,
    InPlaceError,
    NoBackwardError,
    OptimizationError,
    RematError,
    TraceCaptureError,
    UnknownOpError,
    UnsupportedTraceError,
)
from remat.trace import training_trace  # noqa: E402

__version__ = "0.1.0"
from remat.graph import FusionGraph, TensorInfo, Unit  # noqa: E402
from remat.memory import MemoryProfile, TimelinePoint, estimate_memory  # noqa: E402
from remat.fuse import NvFuserPolicy, fuse  # noqa: E402
from remat.problem import RecomputePolicy  # noqa: E402
from remat.plan import Plan, solve  # noqa: E402
from remat.pipeline import OptimizationWarning, Result, optimize  # noqa: E402
from remat.executor import RematExecutor, executor, executor_of, jit  # noqa: E402
from remat import nvfuser  # noqa: E402
from remat import viz  # noqa: E402
from remat.budget import ParetoPoint, pareto, plan_memory  # noqa: E402
