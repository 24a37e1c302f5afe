"""Property tests on random Thunder training traces: remat.fuse -> remat.optimize on small torch programs.

Programs come from remat.testing.strategies.programs (elementwise ops, reductions, reshape/permute,
matmul/linear, where, casts, dropout; small shapes, float64 inputs).  Tracing a program takes about a
tenth of a second, so the tests share the traced and optimized pipeline through a cache; under the
``ci`` profile every test of the shared sequence draws the same cases (one seed, one strategy: a program
and a recompute policy), so each program is traced once.  See docs/testing.md.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, event, given, note, seed, settings
from hypothesis import strategies as st

import remat
from remat.thunder.execute import example_inputs, execute_joint, split_joint, thunder_context
from remat.planning.flow import min_cut
from remat.planning.problem import build_problem
from remat.testing.oracles import check_trace_well_formed
from remat.testing.programs import OPS, Program
from remat.testing.strategies import programs
from remat.thunder.read import random_draws, read_trace
from remat.thunder.rewrite import apply_plan

CI = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci"
# ci: 60 programs per property (100 until 2026-12-07: each is a Thunder trace, and the suite keeps to 5
# minutes on 2 cores); nightly: 500 (each test traces its own programs there).
TRACE_EXAMPLES = 60 if CI else min(settings().max_examples, 500)
trace_settings = settings(
    max_examples=TRACE_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # the explain phase reruns a failing example ~100 times: minutes with traces, for little news
    phases=[p for p in Phase if p != Phase.explain],
)
# Tests that trace programs of their own (not the shared cases below) take 30 under ci: each example is a
# Thunder trace of its own, and the suite keeps to 5 minutes on 2 cores; nightly takes them all.
own_trace_settings = settings(trace_settings, max_examples=min(TRACE_EXAMPLES, 30) if CI else TRACE_EXAMPLES)
# Under ci every shared trace test draws the same cases, so the cache below traces each program once.
shared_examples = seed(20261202) if CI else (lambda test: test)
PROGRAMS = programs(max_ops=12)
POLICIES = st.builds(
    remat.RecomputePolicy, matmul=st.booleans(), reductions=st.booleans(), non_fusible=st.booleans(), unfused_readers=st.booleans()
)
# What the shared tests draw: a program and a recompute policy.  Only test_any_safe_policy_keeps_numerics
# reads the policy; the others draw one too, so that all of them draw the same sequence of programs (were
# the policy test alone to draw a policy, its programs would differ and it would trace its own 100).
CASES = st.tuples(PROGRAMS, POLICIES)


@dataclass(frozen=True)
class Pipeline:
    program: Program
    joint: object
    fused: object
    result: remat.Result

    @functools.cached_property
    def thunder_trace(self):
        """Thunder's own rematerialize of the fused trace, computed here, apart from remat.optimize."""
        from thunder.core.rematerialization import rematerialize

        with thunder_context():
            return rematerialize(self.fused)


@functools.lru_cache(maxsize=1024)
def pipeline(program: Program) -> Pipeline:
    """Trace, fuse and optimize (strict: a fallback fails the test) one program."""
    joint = program.training_trace()
    fused = remat.fuse(joint)
    return Pipeline(program, joint, fused, remat.optimize(fused, strict=True))


def _bucket(n: int) -> str:
    return "1-2" if n <= 2 else "3-5" if n <= 5 else "6+"


def run(case: Program | tuple[Program, remat.RecomputePolicy]) -> Pipeline:
    """The pipeline of a program, or of a case's program."""
    program = case[0] if isinstance(case, tuple) else case
    note(program.source())
    note(repr(program))
    event(f"ops: {_bucket(len(program.ops))}")
    if any(op.op == "dropout" for op in program.ops):
        event("has dropout")
    result = pipeline(program)
    event("recomputes" if result.result.plan.recomputed_ops else "recomputes nothing")
    event(f"kept: {result.result.chosen}")
    return result


def execute(trace, inputs, rng_seed=0):
    torch.manual_seed(rng_seed)  # dropout draws from torch's global generator on the CPU
    return execute_joint(trace, inputs, seed=rng_seed)


def assert_same_results(expected, got) -> None:
    """Every output and gradient of two executions equal bit for bit (NaNs in the same places); a value
    missing (None) in one is missing in the other."""
    for a, b in zip(expected.outputs + expected.grads, got.outputs + got.grads, strict=True):
        if a is None:
            assert b is None
            continue
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)


@shared_examples
@trace_settings
@given(CASES)
def test_plan_is_valid_on_traces(case):
    """Every forward value a backward op reads is saved, or recomputable from saved values and
    parameters/inputs through ops the policy lets remat recompute (no matmul, reduction, stateful RNG);
    and the rewritten trace's backward reads only saved values and forward outputs from the forward."""
    p = run(case)
    res = p.result
    plan = res.plan
    problem = build_problem(res.graph)
    saved = set(plan.saved)
    assert not saved & problem.unsavable
    available: set[str] = set()
    for name in problem.values:  # forward order
        op = problem.producer[name]
        if name in saved or (name not in problem.pinned and set(problem.reads.get(op, ())) <= available):
            available.add(name)
    assert problem.backward_reads <= available, sorted(problem.backward_reads - available)
    ops = {op.id: op for op in res.graph.ops}
    for node in plan.recomputed_ops:
        assert not ops[node].tags & {"matmul", "attention", "reduction", "rng"}, ops[node]
        assert ops[node].phase == "forward"

    if not res.applied:  # another trace had a lower estimated peak (test_never_worse_than_thunder)
        return
    rewritten = read_trace(res.trace, ops=False)

    def base(name):
        info = rewritten.tensors.get(name)
        return info.alias_of or name if info is not None else name

    allowed = {base(v) for v in saved | set(res.graph.forward_outputs)}
    kept = set(remat.estimate_memory(res.trace).saved_tensors)
    assert kept <= allowed, f"the backward reads forward values the plan did not save: {sorted(kept - allowed)}"


@shared_examples
@trace_settings
@given(CASES)
def test_estimated_peak_is_not_higher(case):
    """The optimized trace's estimated peak is at most the fused trace's, and Result.before/after are the
    memory model of the two traces."""
    p = run(case)
    before, after = remat.estimate_memory(p.fused), remat.estimate_memory(p.result.trace)
    assert after.peak_bytes <= before.peak_bytes
    assert (before.peak_bytes, before.saved_bytes) == (p.result.before.peak_bytes, p.result.before.saved_bytes)
    assert (after.peak_bytes, after.saved_bytes) == (p.result.after.peak_bytes, p.result.after.saved_bytes)


@shared_examples
@trace_settings
@given(CASES)
def test_saved_bytes_at_most_thunders_rematerialize(case):
    """remat's plan saves no more activation bytes than Thunder's own rematerialize on the same fused trace
    (both measured by the memory model; forward outputs, which the step returns anyway, not counted: remat
    may keep one to recompute a cheaper value from it).  The plan's rewrite is measured even where
    optimize keeps another trace for its lower peak (a tiny program can peak at a recomputation while
    saving less: the unplanned trace then wins on peak and saves more)."""
    p = run(case)
    thunder_trace = p.thunder_trace
    if p.result.chosen == "remat":
        ours_trace = p.result.trace
    else:
        ours_trace = apply_plan(p.fused, p.result.graph, p.result.plan, layout=p.result.plan.layout).trace
    ours, theirs = activation_bytes(ours_trace), activation_bytes(thunder_trace)
    if ours < theirs:
        event("remat saves less than Thunder")
    assert ours <= theirs


def activation_bytes(trace) -> int:
    """Bytes the backward keeps from the forward, forward outputs (and views of them) left out."""
    graph = read_trace(trace, ops=False)

    def base(name):
        info = graph.tensors.get(name)
        return info.alias_of or name if info is not None else name

    outputs = {base(name) for name in graph.forward_outputs}
    return sum(graph.tensors[name].bytes for name in remat.estimate_memory(trace).saved_tensors if base(name) not in outputs)


@shared_examples
@trace_settings
@given(CASES)
def test_never_worse_than_thunder(case):
    """By construction: the trace optimize returns has an estimated peak at most that of Thunder's own
    rematerialize of the same fused trace (computed here on its own) and of the fused trace itself."""
    p = run(case)
    thunder_trace = p.thunder_trace
    ours = remat.estimate_memory(p.result.trace).peak_bytes
    if random_draws(thunder_trace) != random_draws(p.fused):
        # the documented exception: Thunder's pass reordered stateful random draws (other dropout masks),
        # so optimize does not take its trace (test_dropout_programs_keep_their_masks)
        event("Thunder reorders random draws")
        assert "thunder" not in p.result.candidates
        return
    assert ours <= remat.estimate_memory(thunder_trace).peak_bytes
    assert ours <= remat.estimate_memory(p.fused).peak_bytes
    assert ours == min(profile.peak_bytes for profile in p.result.candidates.values())


@shared_examples
@trace_settings
@given(CASES)
def test_target_reads_keep_numerics(case):
    """``FusionPolicy(target_reads=True)``'s rewrite (:func:`remat.thunder.fuse.decompose_target_gathers`)
    computes what the gathers it replaces compute, bit for bit (float64 inputs), on every program; those
    drawing ``cross_entropy`` are the ones it rewrites."""
    from remat.thunder.fuse import decompose_target_gathers

    p = run(case)
    rewritten = decompose_target_gathers(p.joint)
    if rewritten is p.joint:
        event("no read at targets")
        return
    event("reads at targets rewritten")
    assert not any(b.sym.name == "take_along_axis" for b in rewritten.bound_symbols)
    inputs = example_inputs(p.joint, dtype=torch.float64)
    expected, got = execute(p.joint, inputs), execute(rewritten, inputs)
    assert_same_results(expected, got)


@settings(own_trace_settings, max_examples=10 if CI else TRACE_EXAMPLES)
@given(
    programs(ops=("cross_entropy", "scale", "layer_norm", "cast", "where"), max_ops=5).filter(
        lambda program: any(op.op == "cross_entropy" for op in program.ops)
    )
)
def test_target_reads_keep_numerics_with_cross_entropy(program):
    """The same on programs that all draw ``cross_entropy`` (few of the shared cases do), through the
    whole pipeline: ``fuse(target_reads=True)`` then ``optimize`` against the trace as Thunder gave it."""
    note(program.source())
    joint = program.training_trace()
    policy = remat.FusionPolicy(target_reads=True)
    optimized = remat.optimize(remat.fuse(joint, policy), strict=True).trace
    assert not any(b.sym.name == "take_along_axis" for top in optimized.bound_symbols for b in [top, *top.subsymbols])
    inputs = example_inputs(joint, dtype=torch.float64)
    expected, got = execute(joint, inputs), execute(optimized, inputs)
    assert_same_results(expected, got)


@shared_examples
@trace_settings
@given(CASES)
def test_donations_only_take_storage_that_dies_there(case):
    """Donation (:mod:`remat.core.donation`) on the optimized trace: each donated output takes the storage
    of an input of its own region, of its dtype and bytes, that nothing reads after that region; and the
    estimated peak with donations is never above the peak without."""
    import dataclasses

    from remat.core.donation import storage_roots
    from remat.core.memory import profile_graph

    p = run(case)
    graph = read_trace(p.result.trace, ops=False, donate_dying_inputs=True)
    event("donates" if graph.donations else "donates nothing")
    order = graph.execution_order()
    position = {unit: step for step, unit in enumerate(order)}
    roots = storage_roots(graph)
    for output, donor in graph.donations.items():
        unit = graph.tensors[output].producer_unit
        assert donor in graph.units[unit].inputs
        assert graph.tensors[donor].dtype == graph.tensors[output].dtype
        assert graph.tensors[donor].bytes == graph.tensors[output].bytes
        storage = roots.get(donor, donor)
        assert graph.tensors[storage].kind == "activation"
        for name, info in graph.tensors.items():
            # what lived in the storage before the donation (made earlier) is read there for the last time;
            # what is made there or later (the output, views of it) lives in it from then on
            if name != output and roots.get(name, name) == storage and info.producer_unit is not None:
                if position[info.producer_unit] >= position[unit]:
                    continue
                readers = [position[u.index] for u in graph.units if name in u.inputs and u.kind != "return"]
                assert all(step <= position[unit] for step in readers)
                assert not any(name in u.inputs for u in graph.units if u.kind == "return")
    without = profile_graph(dataclasses.replace(graph, donations={}))
    assert profile_graph(graph).peak_bytes <= without.peak_bytes


@shared_examples
@trace_settings
@given(CASES)
def test_solvers_agree_on_traces(case):
    """Dinic (scipy) and preflow-push (networkx) find the same cut value and the same cut on the trace's
    flow problem."""
    p = run(case)
    problem = build_problem(p.result.graph)
    dinic, preflow_push = min_cut(problem, "dinic"), min_cut(problem, "preflow_push")
    assert dinic.scale == 1
    assert dinic.flow_value == preflow_push.flow_value == p.result.plan.saved_bytes
    assert (dinic.sink_side == preflow_push.sink_side).all()


@shared_examples
@trace_settings
@given(CASES)
def test_optimized_trace_matches_original_numerics(case):
    """Same outputs and gradients, bit for bit, from the fused and the optimized trace on CPU with
    float64 inputs.  Dropout: on CPU remat.fuse keeps the stateful uniform (Thunder's RNG-state prim is
    CUDA-only), the mask is saved, never recomputed; both runs start from the same torch seed."""
    p = run(case)
    inputs = example_inputs(p.fused, dtype=torch.float64)
    expected = execute(p.fused, inputs)
    got = execute(p.result.trace, inputs)
    assert len(expected.outputs) == len(got.outputs) and len(expected.grads) == len(got.grads)
    assert_same_results(expected, got)


@shared_examples
@trace_settings
@given(CASES)
def test_any_safe_policy_keeps_numerics(case):
    """Whatever the policy lets remat recompute (matmuls, reductions, non-fusible ops; not stateful
    RNG, documented unsafe), the optimized trace is well formed and computes the same outputs and
    gradients bit for bit, and re-optimizing it recomputes nothing more."""
    _, policy = case
    p = run(case)
    res = remat.optimize(p.fused, recompute=policy, strict=True)
    check_trace_well_formed(res.trace)
    inputs = example_inputs(p.fused, dtype=torch.float64)
    expected, got = execute(p.fused, inputs), execute(res.trace, inputs)
    assert_same_results(expected, got)
    # Re-planning another trace (Thunder's, or the input) may well recompute.  So may re-planning under
    # unfused_readers=False: which values a backward op outside every region reads depends on the regions,
    # and the rewrite moves readers into regions (a value kept for a stand-alone view becomes one that a
    # recompute region reads), so the second pass may recompute what the first kept (documented).
    if res.applied and policy.unfused_readers:
        assert not remat.optimize(res.trace, recompute=policy, strict=True).plan.recomputed_ops


NO_RANDOM_OR_CAST = [op for op in OPS if op not in ("dropout", "cast")]


@own_trace_settings
@given(programs(ops=NO_RANDOM_OR_CAST))
def test_fused_trace_matches_eager_pytorch(program):
    """The fused trace (the optimizer's input) computes what eager PyTorch computes: outputs and
    input gradients within float64 rounding.  Programs without dropout (different RNG streams) and
    casts (rounding to bfloat16 amplifies decomposition differences)."""
    note(program.source())
    fused = remat.fuse(program.training_trace())
    args = program.example_args(seed=5)
    by_name = {f"i{k}": a for k, a in enumerate(args)}
    traced = [by_name[proxy.name] for proxy in fused.args]  # Thunder drops unused inputs
    inputs = [a.detach() for a in traced]
    outputs = program(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    generator = torch.Generator().manual_seed(9)
    cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in outputs]
    got = execute_joint(fused, inputs, cotangents=cotangents)
    assert len(got.outputs) == len(outputs)
    for a, b in zip(outputs, got.outputs):
        torch.testing.assert_close(b, a.detach(), rtol=1e-9, atol=1e-12, equal_nan=True)
    wanted = [a for a in args if a.requires_grad]
    pairs = [(o, c) for o, c in zip(outputs, cotangents) if o.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], wanted, [c for _, c in pairs], allow_unused=True)
    got_grads = dict(zip((id(a) for a in traced), got.grads))
    for arg, expected in zip(wanted, grads):
        actual = got_grads.get(id(arg))
        if expected is None:  # eager: the output does not depend on it; Thunder: no grad or zeros
            assert actual is None or not actual.abs().max().item()
            continue
        torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-12, equal_nan=True)


@shared_examples
@trace_settings
@given(CASES)
def test_optimize_is_idempotent(case):
    """Planning the optimized trace again changes nothing: same saved bytes and peak, nothing
    recomputed.  (remat's own planner: Thunder's rematerialize of remat's trace may still move an op
    between neighbouring regions and lower the peak a little, so the baseline is off here.)"""
    p = run(case)
    if not p.result.applied:
        return
    again = remat.optimize(p.result.trace, strict=True, thunder_baseline=False)
    assert again.after.saved_bytes == p.result.after.saved_bytes
    assert again.after.peak_bytes == p.result.after.peak_bytes
    # The cut's own count may fall: the rewrite writes a region output that is a view of another output
    # after the region, so a saved value whose view is a forward output is free to keep in the rewritten
    # trace (the caller holds its storage) but was not yet seen as such in the fused one.
    assert again.plan.saved_bytes <= p.result.plan.saved_bytes
    assert not again.plan.recomputed_ops


@shared_examples
@trace_settings
@given(CASES)
def test_rewritten_trace_is_well_formed(case):
    """The fused and the optimized trace are topologically ordered: every proxy is defined before it
    is read (inside regions too), regions read only their inputs; Thunder splits the optimized trace
    and both halves are well formed."""
    p = run(case)
    check_trace_well_formed(p.fused)
    check_trace_well_formed(p.result.trace)
    forward, backward = split_joint(p.result.trace)
    check_trace_well_formed(forward)
    assert backward is not None
    check_trace_well_formed(backward)


DROPOUT_MIX = ("dropout", "dropout", "dropout", "sin", "mul", "add", "sum", "linear", "softmax", "permute", "cast")


@shared_examples
@own_trace_settings
@given(programs(ops=DROPOUT_MIX, max_ops=8))
def test_dropout_programs_keep_their_masks(program):
    """Programs rich in dropout: optimized and fused traces agree bit for bit when both runs start from
    the same torch seed, and the random op is never recomputed (on CPU it stays the stateful
    ``uniform``, whose mask is saved)."""
    p = run(program)
    nodes = {op.id: op for op in p.result.graph.ops}
    assert not any("rng" in nodes[n].tags for n in p.result.plan.recomputed_ops)
    inputs = example_inputs(p.fused, dtype=torch.float64)
    for rng_seed in (0, 1):
        expected = execute(p.fused, inputs, rng_seed)
        got = execute(p.result.trace, inputs, rng_seed)
        for a, b in zip(expected.outputs + expected.grads, got.outputs + got.grads):
            if a is not None:
                torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)
