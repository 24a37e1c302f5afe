"""Stage 4, *solver*: minimum s-t cuts of a :class:`~remat.planning.problem.FlowProblem`.

One algorithm per module, each a function ``minimum_cut(problem) -> CutResult``, chosen with
``solver=`` (as networkx's ``flow_func=``): a name from :data:`ALGORITHMS`, or any function with that
signature.  Every algorithm returns the *sink-closest* minimum cut (:class:`~remat.planning.flow.cut.CutResult`).

``"dinic"`` (default)
    :mod:`remat.planning.flow.dinic`: scipy's compiled Dinic; capacities scaled to 32 bits when needed.
``"preflow_push"``
    :mod:`remat.planning.flow.preflow_push`: networkx, exact and slow; the reference in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

from remat.planning.flow import dinic, preflow_push
from remat.planning.flow.cut import CutResult
from remat.planning.problem import FlowProblem

__all__ = ["ALGORITHMS", "DEFAULT_SOLVER", "CutFunction", "Solver", "CutResult", "min_cut", "resolve_solver"]

CutFunction = Callable[[FlowProblem], CutResult]
#: What ``solver=`` takes: an algorithm's name or a cut function.
Solver = Union[str, CutFunction]

ALGORITHMS: dict[str, CutFunction] = {"dinic": dinic.minimum_cut, "preflow_push": preflow_push.minimum_cut}
DEFAULT_SOLVER = "dinic"


def resolve_solver(solver: Solver) -> CutFunction:
    """The cut function ``solver`` names (or is); ``ValueError`` for an unknown name, ``TypeError`` for
    something that is neither a name nor callable."""
    if isinstance(solver, str):
        try:
            return ALGORITHMS[solver]
        except KeyError:
            raise ValueError(f"unknown solver {solver!r}; choose one of {tuple(ALGORITHMS)} or pass a cut function") from None
    if callable(solver):
        return solver
    raise TypeError(f"solver= must be one of {tuple(ALGORITHMS)} or a function problem -> CutResult, got {type(solver).__name__}")


def min_cut(problem: FlowProblem, solver: Solver = DEFAULT_SOLVER) -> CutResult:
    """The sink-closest minimum cut of ``problem`` by ``solver`` (see the module docstring)."""
    return resolve_solver(solver)(problem)
