"""remat inside ``thunder.jit``: a fusion executor that forms regions, plans one global cut, and runs.

``remat.executor(...)`` returns a :class:`RematExecutor` for ``thunder.jit(fn, executors=[...])``;
``remat.jit(fn, ...)`` is ``thunder.jit`` with it (and the attention executors) in place of nvFuser.

Thunder hands a fusion executor's ``fusion_pass`` the joint forward+backward trace, after autodiff and
before the split into forward and backward (see :mod:`remat.trace`).  ``RematExecutor.fusion_pass``:

1. flattens the bound symbols it claimed to prims (as nvFuser does);
2. forms regions (:func:`remat.fuse`) with the executor's :class:`~remat.NvFuserPolicy`;
3. for a training trace, plans and applies one global rematerialization (:func:`remat.optimize`);
   an inference trace (no backward) is only fused;
4. returns the trace; regions run with nvFuser (GPU) or the torch reference (CPU).

Linear and matmul: by default they stay outside regions (cuBLAS through Thunder's torch executor).
Measured on an H200 (docs/benchmarks.md), putting them into nvFuser regions raised remat's peak on
stablecode-3b from 674 to 850 MiB although the memory model predicted a lower one: nvFuser splits a
region with matmuls into several kernels and allocates the intermediate buffers between them, which the
model does not see.  ``NvFuserPolicy(linear=True, matmul=True)`` forces them in (where the installed
nvFuser runs them, see :func:`remat.nvfuser.linear_supported`); ``linear="auto"`` / ``matmul="auto"``
plans each variant and keeps the lowest *estimated* peak (per trace, not per region), so it inherits
that blind spot.

Nothing breaks ``thunder.jit`` (docs/robustness.md): a trace with symbolic shapes, or one that fusing
fails on, is returned as Thunder gave it (its prims then run with Thunder's torch executor); if planning
fails the fused trace is used; ops remat does not know, and ops reading a buffer written in place later,
stay as they are while the rest is optimized; each cause with one :class:`remat.OptimizationWarning`.
``strict=True`` raises a :class:`remat.RematError` subclass instead.  The last compilation's
:class:`remat.Result` is kept in ``executor.last_result`` (None after an inference or fallen-back one).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from remat import _compat
from remat.errors import OptimizationError, RematError, UnsupportedTraceError
from remat.fuse import NvFuserPolicy, fuse
from remat.pipeline import OptimizationWarning, Result, optimize
from remat.problem import RecomputePolicy
from remat.nvfuser import MIN_LINEAR_VERSION
from remat.nvfuser import version as remat_nvfuser_version
from remat.regions import RegionExecutor

_compat.import_thunder()

import thunder  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, from_trace  # noqa: E402

__all__ = ["RematExecutor", "executor", "executor_of", "jit"]


class RematExecutor(RegionExecutor):
    """A Thunder fusion executor running remat's fusion + global rematerialization (module docstring)."""

    def __init__(
        self,
        *,
        memory_budget: int | float | None = None,
        backend: str = "auto",
        policy: NvFuserPolicy | None = None,
        recompute: RecomputePolicy | None = None,
        strict: bool = False,
        name: str = "remat",
    ) -> None:
        from remat.validation import check_memory_budget, check_recompute_policy

        check_memory_budget(memory_budget)
        if policy is not None and not isinstance(policy, NvFuserPolicy):
            raise TypeError(f"policy must be a remat.NvFuserPolicy, got {type(policy).__name__}")
        check_recompute_policy(recompute, "recompute")
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {type(strict).__name__}")
        super().__init__(name, backend=backend)
        if policy is None:
            policy = NvFuserPolicy()
        elif self.backend == "nvfuser" and (policy.linear or policy.matmul):
            from remat.nvfuser import linear_supported

            if not linear_supported():
                warnings.warn(
                    f"nvFuser {remat_nvfuser_version()} is older than {MIN_LINEAR_VERSION}: linear and matmul stay outside regions",
                    stacklevel=2,
                )
                policy = replace(policy, linear=False, matmul=False)
        self.policy = policy
        self.recompute = recompute
        self.memory_budget = memory_budget
        self.strict = strict
        self.last_result: Result | None = None
        self.last_seconds: float = 0.0
        self.notes: list[str] = []
        self._stage = "fusing"  # what fusion_pass is doing, for the fallback warning

    def __repr__(self) -> str:
        return f"RematExecutor(backend={self.backend!r}, policy={self.policy}, memory_budget={self.memory_budget})"

    # Thunder calls this with the joint trace
    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        """Thunder's hook: fuse and plan ``trace`` (module docstring); never raises unless ``strict``."""
        start = time.perf_counter()
        self.notes = []
        self.last_result = None
        flat = from_trace(trace)
        flat.bound_symbols = _flatten_claimed(self, trace.bound_symbols)
        symbolic = _symbolic_shape(flat)
        if symbolic is not None:
            return self._left_as_thunder_made_it(flat, symbolic, UnsupportedTraceError(symbolic), start)
        try:
            result_trace = self._fuse_and_optimize(flat)
        except Exception as exc:
            if self.strict:
                if isinstance(exc, RematError):
                    raise
                raise OptimizationError(f"remat failed on this trace ({self._stage}): {type(exc).__name__}: {exc}") from exc
            reason = f"{self._stage} failed: {type(exc).__name__}: {exc}"
            return self._left_as_thunder_made_it(flat, reason, None, start)
        self.last_seconds = time.perf_counter() - start
        return result_trace

    def _left_as_thunder_made_it(self, flat: TraceCtx, reason: str, error: Exception | None, start: float) -> TraceCtx:
        """Whole-trace fallback: the trace as Thunder handed it (claimed symbols flattened to prims, which
        Thunder's torch executor runs), with one warning; ``strict`` raises ``error`` instead."""
        if self.strict and error is not None:
            raise error
        warnings.warn(f"remat left this trace as Thunder made it: {reason}", OptimizationWarning, stacklevel=3)
        self.notes.append(reason)
        self.last_seconds = time.perf_counter() - start
        return flat

    def _fuse_and_optimize(self, flat: TraceCtx) -> TraceCtx:
        from remat.trace import is_joint_trace

        variants = _policy_variants(self.policy)
        if not is_joint_trace(flat):  # inference: nothing to rematerialize
            self._stage = "fusing"
            return fuse(flat, variants[0], executor=self)
        best: Result | None = None
        best_warnings: list[str] = []
        for variant in variants:
            self._stage = "fusing"
            fused = fuse(flat, variant, executor=self)
            self._stage = "planning"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", OptimizationWarning)
                result = optimize(fused, self.memory_budget, policy=self.recompute, strict=self.strict)
            for w in caught:  # other warnings pass through; remat's own are shown once, for the plan kept
                if not issubclass(w.category, OptimizationWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            result.notes.append(f"regions: {variant}")
            if best is None or result.after.peak_bytes < best.after.peak_bytes:
                best = result
                best_warnings = [str(w.message) for w in caught if issubclass(w.category, OptimizationWarning)]
        assert best is not None
        for message in dict.fromkeys(best_warnings):
            warnings.warn(message, OptimizationWarning, stacklevel=4)
        self.last_result = best
        return best.trace


def _symbolic_shape(trace: TraceCtx) -> str | None:
    """Why remat cannot plan ``trace`` when a tensor in it has a symbolic shape (``thunder.jit(...,
    cache="symbolic values")``), else None."""
    from thunder.core.proxies import TensorProxy

    def check(proxy) -> str | None:
        if isinstance(proxy, TensorProxy):
            shape = getattr(proxy, "_shape", None) or ()
            if any(type(d) is not int for d in shape):
                dims = ", ".join(str(d) if type(d) is int else getattr(d, "name", "?") for d in shape)
                return (
                    f"tensor {proxy.name} has a symbolic shape ({dims}); remat plans static shapes only "
                    "(thunder.jit's default cache option)"
                )
        return None

    for proxy in trace.args:
        found = check(proxy)
        if found:
            return found
    for bsym in trace.bound_symbols:
        for proxy in bsym.flat_proxy_outs:
            found = check(proxy)
            if found:
                return found
    return None


def _policy_variants(policy: NvFuserPolicy) -> list[NvFuserPolicy]:
    """Concrete policies to try for 'auto' fields: first without matmuls in regions (the fastest to
    plan and Thunder's default), then linear, then linear and matmul."""
    if policy.linear != "auto" and policy.matmul != "auto":
        return [policy]
    variants = [replace(policy, linear=False if policy.linear == "auto" else policy.linear, matmul=False if policy.matmul == "auto" else policy.matmul)]
    if policy.linear == "auto":
        variants.append(replace(variants[0], linear=True))
    if policy.matmul == "auto":
        variants.append(replace(variants[-1], matmul=True))
    return variants


def _flatten_claimed(ex: RegionExecutor, bsyms: Sequence[BoundSymbol]) -> list[BoundSymbol]:
    """Replace bound symbols the executor claimed whole (e.g. ``ltorch.gelu``) by the prims it can run."""
    flat: list[BoundSymbol] = []

    def visit(bsym: BoundSymbol) -> None:
        if ex.can_execute(bsym) or not bsym.subsymbols:
            flat.append(bsym)
            return
        for sub in bsym.subsymbols:
            visit(sub)

    for bsym in bsyms:
        if ex.can_fuse(bsym) and not ex.can_execute(bsym):
            visit(bsym)
        else:
            flat.append(bsym)
    return flat


def executor(
    memory_budget: int | float | None = None,
    backend: str = "auto",
    policy: NvFuserPolicy | None = None,
    *,
    recompute: RecomputePolicy | None = None,
    strict: bool = False,
) -> RematExecutor:
    """A :class:`RematExecutor` for ``thunder.jit(fn, executors=[..., remat.executor()])``.

    ``backend``: ``"auto"`` (nvFuser on CUDA, else the torch reference), ``"nvfuser"`` or ``"torch"``.
    ``policy``: which ops join regions (default: ``NvFuserPolicy()``, matmuls outside regions).  ``recompute``: what may be recomputed (:class:`remat.RecomputePolicy`).
    ``memory_budget``: see :func:`remat.optimize`.
    """
    return RematExecutor(memory_budget=memory_budget, backend=backend, policy=policy, recompute=recompute, strict=strict)


ATTENTION_CHOICES = ("auto", "thunder")


def default_executors(remat_executor: RematExecutor, attention: str = "auto") -> list[Any]:
    """The executors :func:`jit` passes to Thunder: Thunder's GPU default list with remat in nvFuser's
    place.  Attention: with ``attention="auto"``, remat's cuDNN attention executor first (it claims
    attention only where PyTorch's cuDNN fused attention runs: see :mod:`remat.attention`); then
    Thunder's attention executors (its ``cudnn`` where installed, then ``sdpa``); then remat's CPU
    attention executor.  ``attention="thunder"`` leaves out remat's cuDNN executor."""
    from remat.attention import attention_executor, cudnn_attention_executor

    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got {attention!r}")
    preferred = [ex for ex in thunder.get_default_executors() if ex.name in ("cudnn", "sdpa")]
    first = [cudnn_attention_executor] if attention == "auto" else []
    return [*first, *preferred, attention_executor, remat_executor]


def jit(
    fn: Callable,
    memory_budget: int | float | None = None,
    backend: str = "auto",
    policy: NvFuserPolicy | None = None,
    *,
    recompute: RecomputePolicy | None = None,
    strict: bool = False,
    attention: str = "auto",
    **jit_options: Any,
):
    """``thunder.jit(fn)`` with remat's executor in place of nvFuser (see :func:`executor`).

    ``attention``: ``"auto"`` runs attention with cuDNN's fused kernels where PyTorch's cuDNN attention
    applies (Hopper GPUs; what PyTorch and torch.compile pick there), else as Thunder would;
    ``"thunder"`` always as Thunder would (see :func:`default_executors`).
    Extra keyword arguments go to ``thunder.jit``.  The executor is reachable as
    ``remat.executor_of(jitted)`` to inspect ``last_result`` (the plan of the last compilation).
    """
    if not callable(fn):
        raise TypeError(f"remat.jit expects a torch.nn.Module or a callable, got {type(fn).__name__}")
    if isinstance(fn, thunder.ThunderModule) or hasattr(fn, "_lc_cd"):
        raise TypeError("remat.jit expects the plain module or function, not one already wrapped by thunder.jit")
    if "executors" in jit_options:
        raise TypeError("remat.jit chooses the executors; use thunder.jit(fn, executors=[..., remat.executor()]) to pick your own")
    ex = executor(memory_budget, backend, policy, recompute=recompute, strict=strict)
    jitted = thunder.jit(fn, executors=default_executors(ex, attention), **jit_options)
    try:
        jitted._remat_executor = ex
    except AttributeError:  # pragma: no cover - objects that refuse attributes
        pass
    return jitted


def executor_of(jitted: Any) -> RematExecutor:
    """The :class:`RematExecutor` behind a function or module made by :func:`jit`."""
    ex = getattr(jitted, "_remat_executor", None)
    if ex is None:
        raise TypeError("this object was not made by remat.jit")
    return ex
