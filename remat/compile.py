"""remat in Thunder's compile path: ``remat.executor`` (for ``thunder.jit(fn, executors=[...])``) and
``remat.jit`` (``thunder.jit`` with remat in nvFuser's place).

The executor (:class:`remat.thunder.executor.RematExecutor`) fuses and plans inside ``thunder.jit``;
what it plans with is :func:`remat.optimize`, bound here to the user's budget, recompute policy and
solver (the adapter never imports the pipeline: the pipeline is passed in).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from remat.core.memory import MemoryBudget
from remat.core.policies import FusionPolicy, RecomputePolicy, check_policy
from remat.pipeline import optimize
from remat.planning.flow import DEFAULT_SOLVER, Solver, resolve_solver
from remat.thunder.executor import RematExecutor, jit_with

__all__ = ["executor", "jit", "executor_of"]

#: Keywords of remat 0.1 that meant two things each (docs/api.md lists the renames).
_RENAMED = {
    "policy": "fusion= (a remat.FusionPolicy) or recompute= (a remat.RecomputePolicy)",
    "backend": "runtime= (what runs regions) or solver= (the min-cut algorithm)",
}


def executor(
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    runtime: str = "auto",
    fusion: FusionPolicy | None = None,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
) -> RematExecutor:
    """A :class:`RematExecutor` for ``thunder.jit(fn, executors=[..., remat.executor()])``.

    ``runtime``: what runs the regions, ``"auto"`` (nvFuser on CUDA, else the torch reference),
    ``"nvfuser"`` or ``"torch"``.  ``fusion``: which ops join regions (default ``FusionPolicy()``,
    matmuls outside regions).  ``memory_budget``, ``recompute``, ``solver``, ``strict``: as for
    :func:`remat.optimize`.  Arguments are checked here, before any tracing.
    """
    budget = MemoryBudget.parse(memory_budget)
    check_policy(recompute, RecomputePolicy, "recompute")
    resolve_solver(solver)
    optimizer = functools.partial(optimize, memory_budget=budget, recompute=recompute, solver=solver, strict=strict)
    return RematExecutor(optimizer, fusion=fusion, runtime=runtime, strict=strict)


def jit(
    fn: Callable,
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    runtime: str = "auto",
    fusion: FusionPolicy | None = None,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
    attention: str = "auto",
    **jit_options: Any,
):
    """``thunder.jit(fn)`` with remat's executor in place of nvFuser (see :func:`executor`).

    ``attention``: ``"auto"`` runs attention with cuDNN's fused kernels where PyTorch's cuDNN attention
    applies (Hopper GPUs; what PyTorch and torch.compile pick there), else as Thunder would;
    ``"thunder"`` always as Thunder would (see :func:`remat.thunder.executor.default_executors`).
    Extra keyword arguments go to ``thunder.jit``.  The executor is reachable as
    ``remat.executor_of(jitted)`` to inspect ``last_result`` (the plan of the last compilation).
    """
    if not callable(fn):
        raise TypeError(f"remat.jit expects a torch.nn.Module or a callable, got {type(fn).__name__}")
    for old, new in _RENAMED.items():  # thunder.jit would take them as compile options, silently
        if old in jit_options:
            raise TypeError(f"remat.jit: {old}= was renamed: {new}")
    ex = executor(memory_budget, runtime=runtime, fusion=fusion, recompute=recompute, solver=solver, strict=strict)
    return jit_with(fn, ex, attention, **jit_options)


def executor_of(jitted: Any) -> RematExecutor:
    """The :class:`RematExecutor` behind a function or module made by :func:`jit`."""
    ex = getattr(jitted, "_remat_executor", None)
    if ex is None:
        raise TypeError("this object was not made by remat.jit")
    return ex
