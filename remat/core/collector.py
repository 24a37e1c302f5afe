"""Python's cyclic garbage collector, paused while remat plans.

A budget search lays out and simulates dozens of candidate plans; each simulation builds tens of
thousands of small objects (units, tensor records, timeline points) that live for milliseconds, long
enough to be promoted to the collector's oldest generation.  Promotions trigger full collections, and a
full collection walks every tracked object in the process, a traced model's included: on a 32-layer
Llama-2-7b trace one took 0.6-1.0 s, and a ``remat.optimize(..., memory_budget=0.8)`` ran one to three
of them.  Planning makes next to no cyclic garbage, so the collector is paused for the duration of a
search (and of :func:`remat.optimize`) and restored after: objects freed by reference counting go at
once, as always; cycles made meanwhile are collected once it runs again.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

__all__ = ["collector_paused"]

Function = TypeVar("Function", bound=Callable)


def collector_paused(function: Function) -> Function:
    """``function`` run with automatic garbage collection off; it is turned back on after, unless it was
    off before (nesting is harmless: only the outermost call restores it).  A plain wrapper, not a
    ``contextlib`` one: its frame is remat's, so :func:`remat.errors.warn` still names the caller's line."""

    @functools.wraps(function)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return function(*args, **kwargs)
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.enable()

    return paused  # type: ignore[return-value]
