"""Shrunk failures found by the property tests (tests/test_properties.py, tests/test_trace_properties.py).

Each test is the minimal example hypothesis shrank a failure to.  remat bugs are fixed (the test passes);
bugs of Thunder 0.2.6 itself are ``xfail(strict=True)``: the strategies leave those patterns out, and an
XPASS after a Thunder upgrade says the strategy may take them back.
"""

import torch

import remat
from remat.execute import execute_joint, example_inputs
from remat.testing.programs import OpSpec, Program, TensorSpec


def test_fuse_accepts_dropout_on_cpu():
    """remat.fuse called Thunder's replace_uniform unconditionally; its RNG-state prim exists for CUDA
    only, so any CPU (or meta) trace with dropout raised NotImplementedError.  Found by the program
    strategy (first example with dropout).  Now uniform stays stateful off CUDA, its mask is saved, and
    the optimized trace reproduces the fused one from the same torch seed."""
    program = Program(
        inputs=(TensorSpec((3, 4)),),
        ops=(OpSpec("sin", ("i0",)), OpSpec("dropout", ("t0",), (0.5,)), OpSpec("mul", ("t1", "t0"))),
    )
    fused = remat.fuse(program.training_trace())
    kinds = [sub.sym.name for b in fused.bound_symbols if b.sym.is_fusion for sub in b.subsymbols]
    assert "uniform" in kinds and "uniform_philox" not in kinds
    res = remat.optimize(fused, strict=True)
    nodes = {op.id: op for op in res.graph.ops}
    assert res.plan.recomputed_ops and not any("rng" in nodes[n].tags for n in res.plan.recomputed_ops)
    inputs = example_inputs(fused, dtype=torch.float64)
    runs = []
    for trace in (fused, res.trace):
        torch.manual_seed(7)
        runs.append(execute_joint(trace, inputs, seed=7))
    for a, b in zip(runs[0].outputs + runs[0].grads, runs[1].outputs + runs[1].grads):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
