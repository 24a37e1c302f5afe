"""Testing helpers for remat and for code built on it.

``remat.testing.strategies``
    Hypothesis strategies: random plain training graphs in the schema of :mod:`remat.core.plain`
    (:func:`~remat.testing.strategies.training_graphs`), malformed graphs with the error they must raise
    (:func:`~remat.testing.strategies.bad_graphs`), and random small torch programs whose Thunder training
    traces exercise the whole pipeline (:func:`~remat.testing.strategies.programs`).  Needs hypothesis:
    ``pip install 'remat[test]'``.
``remat.testing.oracles``
    Reference answers and checkers that need no hypothesis: brute-force minimum saved bytes of a small
    plain graph, plan validity, and well-formedness of a (rewritten) Thunder trace.
``remat.testing.programs``
    :class:`~remat.testing.programs.Program`, a small torch program as plain data (what the program
    strategy draws), runnable and traceable; its ``repr`` is a constructor call, so a shrunk failing
    example can be pasted into a regression test.

Only ``strategies`` imports hypothesis; importing this package does not.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["strategies", "oracles", "programs"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"remat.testing.{name}")
    raise AttributeError(f"module 'remat.testing' has no attribute {name!r}")
