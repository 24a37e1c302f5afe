"""remat's log: ``logging.getLogger("remat")``, one INFO line per stage of the pipeline with its time.

Stages: ``trace`` (capturing the joint trace), ``fuse`` (forming regions), ``plan`` (reading the trace and
solving the cut), ``rewrite`` (applying the plan), ``thunder baseline`` (Thunder's own rematerialize, which
:func:`remat.optimize` compares with), ``compile`` (remat's executor inside ``thunder.jit``).  Nothing is
printed unless the application configures logging (``logging.basicConfig(level=logging.INFO)``); the CLI
shows these lines as its progress.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["logger", "stage"]

logger = logging.getLogger("remat")


@dataclass
class StageInfo:
    """What a stage says about itself at the end (``detail``), and how long it took (``seconds``)."""

    name: str
    detail: str = ""
    seconds: float = 0.0


@contextlib.contextmanager
def stage(name: str) -> Iterator[StageInfo]:
    """Time a stage and log it at INFO when it ends (and at DEBUG when it starts, for long ones); the
    caller may set ``info.detail`` (e.g. "34 regions").  A stage that raises is logged as failed."""
    info = StageInfo(name)
    logger.debug("%s ...", name)
    start = time.perf_counter()
    try:
        yield info
    except BaseException:
        info.seconds = time.perf_counter() - start
        logger.info("%s failed after %.2f s", name, info.seconds)
        raise
    info.seconds = time.perf_counter() - start
    logger.info("%s: %.2f s%s", name, info.seconds, f" ({info.detail})" if info.detail else "")
