"""remat in Thunder's compile path: ``remat.executor`` (for ``thunder.jit(fn, executors=[...])``) and
``remat.jit`` (``thunder.jit`` with remat in nvFuser's place).

The executor (:class:`remat.thunder.executor.RematExecutor`) fuses and plans inside ``thunder.jit``;
what it plans with is :func:`remat.optimize`, bound here to the user's budget, recompute policy and
solver (the adapter never imports the pipeline: the pipeline is passed in).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from remat.core.memory import MemoryBudget
from remat.core.policies import FusionPolicy, RecomputePolicy, check_policy
from remat.errors import warn
from remat.pipeline import optimize
from remat.planning.flow import DEFAULT_SOLVER, Solver, resolve_solver
from remat.thunder.graph import InductorGraphTransform, lays_out_token_major, runs_as_graphs
from remat.thunder.runtimes import GRAPH_RUNTIME
from remat.thunder.executor import DefaultsInstalled, RematExecutor, default_executors, install_defaults, jit_with

__all__ = ["executor", "executors", "install", "jit", "executor_of"]

#: Keywords of remat 0.1 that meant two things each (docs/api.md lists the renames).
_RENAMED = {
    "policy": "fusion= (a remat.FusionPolicy) or recompute= (a remat.RecomputePolicy)",
    "backend": "runtime= (what runs regions) or solver= (the min-cut algorithm)",
}


def executor(
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    runtime: str = "auto",
    fusion: FusionPolicy | None = None,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
    plan: bool = True,
) -> RematExecutor:
    """A :class:`RematExecutor` for ``thunder.jit(fn, executors=[..., remat.executor()])``.

    ``runtime``: what runs the regions, ``"auto"`` (nvFuser on CUDA, else the torch reference),
    ``"nvfuser"``, ``"inductor"`` (each region compiled by ``torch.compile``) or ``"torch"``.  ``fusion``: which ops join regions (default ``FusionPolicy()``,
    matmuls outside regions).  ``memory_budget``, ``recompute``, ``solver``, ``strict``: as for
    :func:`remat.optimize`.  ``plan=False`` only forms and runs regions, with no rematerialization at
    all (neither remat's nor Thunder's): when numbers differ from eager, it tells whether the regions or
    the cut are the cause.  Arguments are checked here, before any tracing.
    """
    budget = MemoryBudget.parse(memory_budget)
    check_policy(recompute, RecomputePolicy, "recompute")
    resolve_solver(solver)
    if not isinstance(plan, bool):
        raise TypeError(f"plan must be True or False, got {type(plan).__name__}")
    if not plan and (budget is not None or recompute is not None):
        raise ValueError("plan=False fuses only: memory_budget= and recompute= have nothing to apply to")
    optimizer = (
        functools.partial(optimize, memory_budget=budget, recompute=recompute, solver=solver, strict=strict) if plan else None
    )
    return RematExecutor(optimizer, fusion=fusion, runtime=runtime, strict=strict)


def executors(
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    runtime: str = "auto",
    fusion: FusionPolicy | None = None,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
    attention: str = "auto",
    plan: bool = True,
) -> list[Any]:
    """The executor list for code you do not own: ``thunder.jit(fn, executors=remat.executors())``, or
    ThunderFX's ``ThunderCompiler(executors=remat.executors())``.  It is what :func:`jit` uses: Thunder's
    attention executors, then remat's (:func:`executor`, with these arguments) in nvFuser's place; see
    :func:`jit` for ``attention``.  The remat executor is the last element."""
    ex = executor(memory_budget, runtime=runtime, fusion=fusion, recompute=recompute, solver=solver, strict=strict, plan=plan)
    return default_executors(ex, attention)


def install(
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    runtime: str = "auto",
    fusion: FusionPolicy | None = None,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
    attention: str = "auto",
    plan: bool = True,
    transforms: Sequence[Any] = (),
) -> DefaultsInstalled:
    """Make remat Thunder's default fusion executor (:func:`executors` with these arguments), so that
    ``thunder.jit(fn)`` and ThunderFX without ``executors=``, e.g. in a trainer you do not own, compile
    with remat.  Scoped: ``with remat.install(): ...`` puts Thunder's defaults back at the end, or call
    ``.uninstall()`` on the returned object.  Functions jitted while installed keep remat.
    ``runtime="inductor-graph"``: ``"inductor"`` regions, and remat's graph transform added to every
    ``thunder.jit`` call while installed (:class:`~remat.thunder.executor.DefaultsInstalled`), ThunderFX's
    included: its backend looks ``thunder.jit`` up when it compiles a graph.  ``transforms``: Thunder
    transforms added to every ``thunder.jit`` call while installed; an ``InductorGraphTransform`` among
    them is the graph runtime's, with its arguments, instead of a default one (as in :func:`jit`)."""
    runtime, transforms, _ = _with_graph_transform(runtime, transforms)
    chosen = executors(
        memory_budget,
        runtime=runtime,
        fusion=fusion,
        recompute=recompute,
        solver=solver,
        strict=strict,
        attention=attention,
        plan=plan,
    )
    _plan_for_graph_layout(chosen[-1], transforms)
    return install_defaults(chosen, transforms)


def jit(
    fn: Callable,
    memory_budget: MemoryBudget | int | float | str | None = None,
    *,
    runtime: str = "auto",
    fusion: FusionPolicy | None = None,
    recompute: RecomputePolicy | None = None,
    solver: Solver = DEFAULT_SOLVER,
    strict: bool = False,
    attention: str = "auto",
    plan: bool = True,
    **jit_options: Any,
):
    """``thunder.jit(fn)`` with remat's executor in place of nvFuser (see :func:`executor`).

    ``attention``: ``"auto"`` runs attention with cuDNN's fused kernels where PyTorch's cuDNN attention
    applies (Hopper GPUs; what PyTorch and torch.compile pick there), else as Thunder would;
    ``"thunder"`` always as Thunder would (see :func:`remat.thunder.executor.default_executors`).
    ``plan=False``: regions only, no rematerialization (see :func:`executor`).
    ``runtime="inductor-graph"`` (only here, not in :func:`executor`): remat plans as always, then the
    planned forward and the planned backward each run as one Inductor graph instead of region by region
    (:mod:`remat.thunder.graph`: one host call each way instead of 30-40); traces it cannot take (random
    numbers, in-place writes) run with ``"inductor"`` regions.  To set the graph's own arguments, pass
    ``transforms=[remat.thunder.graph.InductorGraphTransform(...)]`` with it: that transform is used
    instead of a default one (at most one per call).
    Extra keyword arguments go to ``thunder.jit``.  The executor is reachable as
    ``remat.executor_of(jitted)`` to inspect ``last_result`` (the plan of the last compilation).
    """
    if not callable(fn):
        raise TypeError(f"remat.jit expects a torch.nn.Module or a callable, got {type(fn).__name__}")
    for old, new in _RENAMED.items():  # thunder.jit would take them as compile options, silently
        if old in jit_options:
            raise TypeError(f"remat.jit: {old}= was renamed: {new}")
    # Inductor regions, then each planned trace as one graph (a Thunder transform: the user's, if given)
    runtime, transforms, graph_transform = _with_graph_transform(runtime, jit_options.pop("transforms", None))
    if transforms:
        jit_options["transforms"] = transforms
    if graph_transform is not None and memory_budget is not None:
        warn(
            f"remat.jit(runtime={GRAPH_RUNTIME!r}): memory_budget is planned against remat's estimate, and "
            "Inductor schedules the whole graph itself; its peak measured at the estimate (within 0.2%) for the "
            "budget plans tried on LitGPT blocks, on the GPU and the CPU, but nothing binds it there "
            "(docs/benchmarks.md); where the budget must hold, run region by region (runtime='auto' or 'inductor')",
            UserWarning,
        )
    ex = executor(memory_budget, runtime=runtime, fusion=fusion, recompute=recompute, solver=solver, strict=strict, plan=plan)
    _plan_for_graph_layout(ex, transforms)
    ex.graph_transform = graph_transform  # its ``notes`` say why a trace stayed region by region
    return jit_with(fn, ex, attention, **jit_options)


def _with_graph_transform(runtime: str, transforms: Any) -> tuple[str, list[Any], InductorGraphTransform | None]:
    """``runtime`` and ``transforms`` as Thunder takes them, and the graph transform among them: for
    ``runtime="inductor-graph"``, Inductor regions and the ``InductorGraphTransform`` given in
    ``transforms`` (with its arguments), else a default one added at the end.  At most one may be given."""
    transforms = list(transforms or ())
    given = [t for t in transforms if isinstance(t, InductorGraphTransform)]
    if len(given) > 1:
        raise ValueError(f"at most one InductorGraphTransform in transforms=, got {len(given)}")
    graph_transform = given[0] if given else None
    if runtime == GRAPH_RUNTIME:
        runtime = "inductor"
        if graph_transform is None:
            graph_transform = InductorGraphTransform()
            transforms.append(graph_transform)
    return runtime, transforms, graph_transform


def _plan_for_graph_layout(ex: RematExecutor, transforms: Any) -> None:
    """Where a graph transform among ``transforms`` lays attention's operands out token by token, the
    executor plans with that layout's memory model (``optimize(..., token_major_attention=True)``) for
    traces that will run as graphs (:func:`remat.thunder.graph.runs_as_graphs`): the reshape of attention's
    output for the output projection is a view there, not a copy; and regions write outputs over inputs
    dying there (``donate_dying_inputs=True``, :mod:`remat.core.donation`).  Each graph transform reads
    the plan of the trace it compiles from ``ex`` (``plan_source``: the donations to carry out, the room
    for the embedding gradient's scratch)."""
    graphs = [t for t in transforms or () if isinstance(t, InductorGraphTransform)]
    for transform in graphs:
        if transform.plan_source is None:
            transform.plan_source = lambda: ex.last_result
    token_major = any(lays_out_token_major(t.token_major_attention, t.materialize_region_outputs) for t in graphs)
    donating = any(t.donate_dying_inputs and t.materialize_region_outputs for t in graphs)
    if (token_major or donating) and ex.optimizer is not None:
        planned = ex.optimizer

        def optimizer(fused: Any) -> Any:  # a trace drawing random numbers runs region by region: as traced
            as_graphs = runs_as_graphs(fused)
            return planned(fused, token_major_attention=token_major and as_graphs, donate_dying_inputs=donating and as_graphs)

        ex.optimizer = optimizer


def executor_of(jitted: Any) -> RematExecutor:
    """The :class:`RematExecutor` behind a function or module made by :func:`jit`."""
    ex = getattr(jitted, "_remat_executor", None)
    if ex is None:
        raise TypeError("this object was not made by remat.jit")
    return ex
