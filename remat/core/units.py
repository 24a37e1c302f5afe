"""Human units: the one place that says how bytes, FLOPs and seconds are written for people.

Binary units for bytes (``1536 -> "1.5 KiB"``), decimal for FLOPs (``4.1e10 -> "41 GFLOP"``), milliseconds
below a second.  Three significant digits at any size, so a small model never reads as ``0.0 MiB``.
"""

from __future__ import annotations

__all__ = ["format_bytes", "format_flops", "format_seconds", "format_share"]


def format_bytes(n: int | float) -> str:
    """``1536 -> '1.5 KiB'``: binary units, three significant digits."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.3g} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_flops(n: int | float) -> str:
    """``4.13e10 -> '41.3 GFLOP'``: decimal units, three significant digits."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} FLOP"


def format_seconds(seconds: float) -> str:
    """``0.0123 -> '12.3 ms'``, ``2.5 -> '2.50 s'``."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_share(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole`` with two decimals, or two significant digits when smaller
    than 0.01% (so a tiny share never reads as ``0.00%``)."""
    if not whole:
        return "0%"
    share = 100 * part / whole
    return f"{share:.2g}%" if 0 < abs(share) < 0.01 else f"{share:.2f}%"
