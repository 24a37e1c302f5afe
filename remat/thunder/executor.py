"""remat inside ``thunder.jit``: a fusion executor that forms regions, plans one global cut, and runs.

Thunder hands a fusion executor's ``fusion_pass`` the joint forward+backward trace, after autodiff and
before the split into forward and backward (see :mod:`remat.thunder.capture`).
``RematExecutor.fusion_pass``:

1. flattens the bound symbols it claimed to prims (as nvFuser does);
2. forms regions (:func:`remat.fuse`) with the executor's :class:`~remat.FusionPolicy`;
3. for a training trace, plans and applies one global rematerialization with the ``optimizer`` it was
   given (``remat.optimize`` with the user's budget and policy: :func:`remat.executor` binds them);
   an inference trace (no backward) is only fused;
4. returns the trace; regions run with the executor's runtime (nvFuser on a GPU, the torch reference on
   a CPU).

Linear and matmul: by default they stay outside regions (cuBLAS through Thunder's torch executor).
Measured on an H200 (docs/benchmarks.md), putting them into nvFuser regions raised remat's peak on
stablecode-3b from 674 to 850 MiB although the memory model predicted a lower one: nvFuser splits a
region with matmuls into several kernels and allocates the intermediate buffers between them, which the
model does not see.  ``FusionPolicy(linear=True, matmul=True)`` forces them in (where the installed
nvFuser runs them, see :func:`remat.nvfuser.linear_supported`); ``linear="auto"`` / ``matmul="auto"``
plans each variant and keeps the lowest *estimated* peak (per trace, not per region), so it inherits
that blind spot.

Nothing breaks ``thunder.jit`` (docs/robustness.md): a trace with symbolic shapes, or one that fusing
fails on, is returned as Thunder gave it (its prims then run with Thunder's torch executor); if planning
fails the fused trace is used; ops remat does not know, and ops reading a buffer written in place later,
stay as they are while the rest is optimized; each cause with one :class:`remat.OptimizationWarning`.
``strict=True`` raises a :class:`remat.RematError` subclass instead.  The last compilation's result
(a :class:`remat.Result`) is kept in ``executor.last_result`` (None after an inference or fallen-back one).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import thunder
from thunder.core.trace import TraceCtx, from_trace

from remat.core.policies import FusionPolicy, check_policy
from remat._logging import stage
from remat.errors import OptimizationError, OptimizationWarning, RematError, UnsupportedTraceError, warn
from remat.thunder import nvfuser
from remat.thunder.attention import attention_executor, cudnn_attention_executor
from remat.thunder.capture import is_joint_trace, is_thunder_compiled
from remat.thunder.fuse import fuse
from remat.thunder.read import check_trace
from remat.thunder.prologue import guard_pruned_prologue
from remat.thunder.regions import RegionExecutor

__all__ = ["RematExecutor", "ATTENTION_CHOICES", "DefaultsInstalled", "default_executors", "install_defaults", "jit_with"]

#: The values of ``attention=`` (see :func:`default_executors`).
ATTENTION_CHOICES = ("auto", "thunder")


class RematExecutor(RegionExecutor):
    """A Thunder fusion executor running remat's fusion + global rematerialization (module docstring).

    ``optimizer``: the planning step, a function of a fused joint trace returning an object with
    ``.trace``, ``.after.peak_bytes`` and ``.notes`` (:func:`remat.optimize` with its arguments bound; it
    warns with :class:`remat.OptimizationWarning` and raises only when strict), or None to fuse only
    (regions without any rematerialization: ``remat.jit(fn, plan=False)``, to tell a region's numerics
    from the cut's when results differ).  ``fusion``: which ops
    join regions; ``runtime``: what runs them; ``strict``: raise instead of falling back."""

    def __init__(
        self,
        optimizer: Callable[[TraceCtx], Any] | None,
        *,
        fusion: FusionPolicy | None = None,
        runtime: str = "auto",
        strict: bool = False,
        name: str = "remat",
    ) -> None:
        check_policy(fusion, FusionPolicy, "fusion")
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {type(strict).__name__}")
        if optimizer is not None and not callable(optimizer):
            raise TypeError(f"optimizer must be a function of a fused trace or None, got {type(optimizer).__name__}")
        super().__init__(name, runtime=runtime)
        if fusion is None:
            fusion = FusionPolicy()
        elif self.runtime == "nvfuser" and (fusion.linear or fusion.matmul) and not nvfuser.linear_supported():
            warn(
                f"nvFuser {nvfuser.version()} is older than {nvfuser.MIN_LINEAR_VERSION}: linear and matmul stay outside regions",
                UserWarning,
            )
            fusion = replace(fusion, linear=False, matmul=False)
        self.optimizer = optimizer
        self.fusion = fusion
        self.strict = strict
        self.last_result: Any = None
        self.last_seconds: float = 0.0
        self.notes: list[str] = []
        self.graph_transform: Any = None  # remat.jit(runtime="inductor-graph") puts its InductorGraphTransform here
        self._stage = "fusing"  # what fusion_pass is doing, for the fallback warning

    def __repr__(self) -> str:
        return f"RematExecutor(runtime={self.runtime!r}, fusion={self.fusion}, optimizer={self.optimizer!r})"

    # Thunder calls this with the joint trace
    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        """Thunder's hook: fuse and plan ``trace`` (module docstring); never raises unless ``strict``."""
        start = time.perf_counter()
        self.notes = []
        self.last_result = None
        flat = from_trace(trace)
        flat.bound_symbols = self.flatten(trace.bound_symbols)
        symbolic = check_trace(flat)
        if symbolic is not None:
            return self._left_as_thunder_made_it(flat, symbolic, UnsupportedTraceError(symbolic), start)
        try:
            with stage("compile") as compiling:
                result_trace = self._fuse_and_optimize(flat)
                regions = sum(1 for b in result_trace.bound_symbols if b.sym.is_fusion)
                compiling.detail = f"remat executor: {regions} regions"
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
        warn(f"remat left this trace as Thunder made it: {reason}")
        self.notes.append(reason)
        self.last_seconds = time.perf_counter() - start
        return flat

    def _fuse_and_optimize(self, flat: TraceCtx) -> TraceCtx:
        variants = _fusion_variants(self.fusion)
        if self.optimizer is None or not is_joint_trace(flat):  # fuse only, or inference: nothing to rematerialize
            self._stage = "fusing"
            return fuse(flat, variants[0], executor=self)
        best = None
        best_warnings: list[str] = []
        for variant in variants:
            self._stage = "fusing"
            fused = fuse(flat, variant, executor=self)
            self._stage = "planning"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", OptimizationWarning)
                result = self.optimizer(fused)
            for w in caught:  # other warnings pass through; remat's own are shown once, for the plan kept
                if not issubclass(w.category, OptimizationWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            result.notes.append(f"regions: {variant}")
            if best is None or result.after.peak_bytes < best.after.peak_bytes:
                best = result
                best_warnings = [str(w.message) for w in caught if issubclass(w.category, OptimizationWarning)]
        assert best is not None
        for message in dict.fromkeys(best_warnings):
            warn(message)
        self.last_result = best
        return best.trace


def _fusion_variants(fusion: FusionPolicy) -> list[FusionPolicy]:
    """Concrete policies to try for 'auto' fields: first without matmuls in regions (the fastest to
    plan and Thunder's default), then linear, then linear and matmul."""
    if fusion.linear != "auto" and fusion.matmul != "auto":
        return [fusion]
    first = replace(
        fusion,
        linear=False if fusion.linear == "auto" else fusion.linear,
        matmul=False if fusion.matmul == "auto" else fusion.matmul,
    )
    variants = [first]
    if fusion.linear == "auto":
        variants.append(replace(first, linear=True))
    if fusion.matmul == "auto":
        variants.append(replace(variants[-1], matmul=True))
    return variants


def default_executors(remat_executor: RematExecutor, attention: str = "auto") -> list[Any]:
    """The executors ``remat.jit`` passes to Thunder: Thunder's GPU default list with remat in nvFuser's
    place.  Attention: with ``attention="auto"``, remat's cuDNN attention executor first (it claims
    attention only where PyTorch's cuDNN fused attention runs: see :mod:`remat.thunder.attention`); then
    Thunder's attention executors (its ``cudnn`` where installed, then ``sdpa``); then remat's CPU
    attention executor.  ``attention="thunder"`` leaves out remat's cuDNN executor."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got {attention!r}")
    preferred = [ex for ex in thunder.get_default_executors() if ex.name in ("cudnn", "sdpa")]
    first = [cudnn_attention_executor] if attention == "auto" else []
    return [*first, *preferred, attention_executor, remat_executor]


def jit_with(fn: Callable, remat_executor: RematExecutor, attention: str = "auto", **jit_options: Any):
    """``thunder.jit(fn)`` with :func:`default_executors` around ``remat_executor`` (``remat.jit``); the
    executor is kept on the result (``remat.executor_of``)."""
    if not callable(fn):
        raise TypeError(f"remat.jit expects a torch.nn.Module or a callable, got {type(fn).__name__}")
    if is_thunder_compiled(fn):
        raise TypeError("remat.jit expects the plain module or function, not one already wrapped by thunder.jit")
    if "executors" in jit_options:
        raise TypeError("remat.jit chooses the executors; use thunder.jit(fn, executors=[..., remat.executor()]) to pick your own")
    jitted = thunder.jit(fn, executors=default_executors(remat_executor, attention), **jit_options)
    try:
        jitted._remat_executor = remat_executor
        # Thunder's PrunePrologueChecks no longer sees eval() or changed parameters: a cheap check does
        jitted._remat_prologue_guard = guard_pruned_prologue(jitted, jit_options.get("transforms"))
    except AttributeError:  # pragma: no cover - objects that refuse attributes
        pass
    return jitted


class DefaultsInstalled:
    """Thunder's default executors replaced by ``executors`` until :meth:`uninstall` (or the end of a
    ``with`` block): ``thunder.jit(fn)`` and ThunderFX without ``executors=`` then compile with them.
    ``transforms``: Thunder has no default transforms, so these are added to every call of ``thunder.jit``
    (the module attribute, which is what ``thunder.jit(...)`` in a script looks up, and ThunderFX's backend
    each time it compiles a graph) while installed; code that imported ``jit`` by name earlier does not see them.
    Undoing puts back exactly what was replaced; undoing twice does nothing."""

    def __init__(self, executors: Sequence[Any], transforms: Sequence[Any] = ()) -> None:
        self.executors = list(executors)
        self.transforms = list(transforms)
        self._replaced: list[Any] | None = list(thunder.extend.get_default_executors())
        thunder.extend.set_default_executors(list(self.executors))
        self._replaced_jit: Callable | None = None
        if self.transforms:
            self._replaced_jit = original = thunder.jit
            extra = self.transforms

            def jit(fn: Callable, *args: Any, transforms: Sequence[Any] | None = None, **kwargs: Any):
                return original(fn, *args, transforms=[*(transforms or ()), *extra], **kwargs)

            jit.__doc__ = original.__doc__
            self._jit = jit
            thunder.jit = jit

    @property
    def installed(self) -> bool:
        return self._replaced is not None

    def uninstall(self) -> None:
        if self._replaced is not None:
            thunder.extend.set_default_executors(self._replaced)
            self._replaced = None
        if self._replaced_jit is not None:
            if thunder.jit is self._jit:  # someone else's later patch stays theirs
                thunder.jit = self._replaced_jit
            self._replaced_jit = None

    def __enter__(self) -> "DefaultsInstalled":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        names = ", ".join(getattr(ex, "name", repr(ex)) for ex in self.executors)
        return f"DefaultsInstalled([{names}], {'installed' if self.installed else 'uninstalled'})"


def install_defaults(executors: Sequence[Any], transforms: Sequence[Any] = ()) -> DefaultsInstalled:
    """Make ``executors`` Thunder's default executor list, and add ``transforms`` to ``thunder.jit``'s
    (:class:`DefaultsInstalled`)."""
    return DefaultsInstalled(executors, transforms)
