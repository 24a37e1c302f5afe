"""Small helpers shared by the stages."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while a pass builds many small objects.

    Thunder traces hold millions of objects; while remat builds its graph the collector would walk them
    all, again and again (it made graph construction 15x slower on a 32-layer trace).  Nothing remat
    creates needs the cycle collector to be freed promptly, so it runs once at the end instead.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
