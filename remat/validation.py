"""Argument checks shared by the public entry points (``optimize``, ``solve``, ``executor``/``jit``).

They run before any work (and before :mod:`remat.budget` is imported), so a wrong argument gives the
same clear error whether or not a version of remat plans budgets.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_memory_budget", "check_recompute_policy", "check_solver_backend"]

SOLVER_BACKENDS = ("scipy", "networkx")


def check_memory_budget(memory_budget: Any) -> None:
    """``None``, or a positive finite number: bytes (an int, or a float > 1) or a fraction in (0, 1] of
    the un-optimized estimated peak.  Raises ``TypeError`` (not a number; ``True``/``False``) or
    ``ValueError`` (zero, negative, NaN, infinite)."""
    if memory_budget is None:
        return
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float)):
        raise TypeError(
            "memory_budget must be a number of bytes (int, or float > 1) or a fraction in (0, 1] of the "
            f"estimated peak, got {type(memory_budget).__name__} {memory_budget!r}"
        )
    if not math.isfinite(memory_budget) or memory_budget <= 0:
        raise ValueError(
            f"memory_budget must be a positive number of bytes or a fraction in (0, 1], got {memory_budget!r}"
        )


def check_recompute_policy(policy: Any, argument: str = "policy") -> None:
    """``None`` or a :class:`remat.RecomputePolicy`; else ``TypeError`` naming ``argument``."""
    from remat.problem import RecomputePolicy

    if policy is not None and not isinstance(policy, RecomputePolicy):
        raise TypeError(f"{argument} must be a remat.RecomputePolicy, got {type(policy).__name__}")


def check_solver_backend(backend: Any) -> None:
    """One of :data:`SOLVER_BACKENDS`; else ``ValueError``."""
    if backend not in SOLVER_BACKENDS:
        raise ValueError(f"unknown solver backend {backend!r}; choose one of {SOLVER_BACKENDS}")
