"""Running joint traces on the CPU, the way Thunder runs them: split, then forward, then backward.

A joint forward+backward trace reads its cotangents with ``get_grad`` and so cannot be called directly.
:func:`execute_joint` splits it with Thunder's own ``split_into_forward_and_backward``, maps the
remaining prims to Thunder's torch executor, and runs the forward on ``inputs`` and the backward on
``cotangents``; fusion regions run with their own callables (remat's torch reference backend for
regions made by :func:`remat.fuse`).  Tests use it to check that an optimized trace computes the same
outputs and gradients as the original.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import thunder
import torch
from thunder.common import CompileData, CompileStats
from thunder.core import dtypes
from thunder.core.compile_data import compile_data_and_stats, get_compile_data
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.rematerialization import rematerialize
from thunder.core.trace import TraceCtx
from thunder.executors.passes import _transform_for_operator_executor_execution, update_fusion_call_ctx
from thunder.transforms.autodiff import split_into_forward_and_backward

from remat.errors import NoBackwardError

__all__ = [
    "JointResult",
    "execute_joint",
    "example_inputs",
    "rebuild_regions",
    "split_joint",
    "thunder_context",
    "thunder_rematerialize",
]


@contextlib.contextmanager
def thunder_context(executors: Sequence[Any] | None = None):
    """Compile data for Thunder passes called outside ``thunder.jit`` (some read it unconditionally)."""
    if get_compile_data() is not None:
        yield
        return
    executors = tuple(executors) if executors is not None else thunder.get_always_executors()
    cd = CompileData(fn=lambda: None, executors_list=executors, disable_preprocessing=True)
    with compile_data_and_stats(cd, CompileStats()):
        yield


def thunder_rematerialize(trace: TraceCtx) -> tuple[TraceCtx, float]:
    """Thunder 0.2.6's own ``rematerialize`` on a fused trace (the baseline remat is compared with), and
    the seconds it took.  To run the result, rebuild its regions' callables (:func:`rebuild_regions`)."""
    start = time.perf_counter()
    with thunder_context():
        result = rematerialize(trace)
    return result, time.perf_counter() - start


def rebuild_regions(trace: TraceCtx) -> TraceCtx:
    """``trace`` with every region's callable made anew from its current inputs, outputs and subsymbols
    (Thunder's ``update_fusion_call_ctx``, which Thunder's nvFuser pass runs after ``rematerialize``:
    that pass edits regions' inputs and outputs but not the callables that run them)."""
    with thunder_context():
        return update_fusion_call_ctx(trace)


def split_joint(trace: TraceCtx) -> tuple[TraceCtx, TraceCtx | None]:
    """Thunder's forward/backward split of a joint trace."""
    with thunder_context():
        return split_into_forward_and_backward(trace)


def _executable(trace: TraceCtx):
    with thunder_context():
        extrace = _transform_for_operator_executor_execution(trace, thunder.get_always_executors())
        return extrace.python_callable()


@dataclass
class JointResult:
    """Outputs of the forward and gradients from the backward (``None`` where an input gets none)."""

    outputs: tuple[Any, ...]
    grads: tuple[Any, ...]


def _make_tensor(proxy: TensorProxy, generator: torch.Generator, int_high: int) -> torch.Tensor:
    dtype = dtypes.to_torch_dtype(proxy.dtype)
    shape = tuple(proxy.shape)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=generator)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    return torch.randint(0, int_high, shape, dtype=dtype, generator=generator)


def example_inputs(trace: TraceCtx, *, seed: int = 0, int_high: int = 8, dtype: torch.dtype | None = None) -> list[Any]:
    """Random CPU inputs matching the trace's argument proxies (integers drawn below ``int_high``).
    With ``dtype``, floating inputs are made in that dtype (e.g. float64 for exact comparisons)."""
    generator = torch.Generator().manual_seed(seed)
    values = []
    for proxy in trace.args:
        if isinstance(proxy, TensorProxy):
            t = _make_tensor(proxy, generator, int_high)
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            values.append(t)
        elif isinstance(proxy, NumberProxy):
            values.append(proxy.value)
        else:
            values.append(proxy)
    return values


def execute_joint(
    trace: TraceCtx,
    inputs: Sequence[Any],
    cotangents: Sequence[Any] | None = None,
    *,
    seed: int = 0,
) -> JointResult:
    """Run a joint trace: forward on ``inputs`` (ordered as ``trace.args``), backward on ``cotangents``
    (one per forward output; random with ``seed`` when omitted)."""
    forward, backward = split_joint(trace)
    if backward is None:
        raise NoBackwardError("the trace has no backward part to execute")
    forward_fn = _executable(forward)
    backward_fn = _executable(backward)
    result, (saved_tensors, saved_other) = forward_fn(*inputs)
    flat_outputs = tuple(result["flat_output"]) if isinstance(result, dict) and "flat_output" in result else tuple(result["output"])
    if cotangents is None:
        generator = torch.Generator().manual_seed(seed + 1)
        cotangents = [
            torch.randn(o.shape, dtype=o.dtype, generator=generator) if isinstance(o, torch.Tensor) and o.is_floating_point() else None
            for o in flat_outputs
        ]
    grads = backward_fn([list(saved_tensors), list(saved_other)], list(cotangents))
    return JointResult(outputs=flat_outputs, grads=tuple(grads))
