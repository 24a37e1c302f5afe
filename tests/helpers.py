"""Small hand-built FusionGraphs for tests whose answers are computed by hand."""

from __future__ import annotations

from remat.core.ir import FusionGraph, Op, TensorInfo, Unit, split_phases


def unit_graph(steps, sizes, *, params=(), inputs=(), forward_outputs=(), gradients=(), views=None):
    """Build a joint FusionGraph from unit records.

    ``steps``: list of (name, kind, inputs, outputs) in trace order; kind is "input", "region", "op",
    "cotangent" or "return".  ``sizes``: bytes of every tensor.  ``views``: {view_name: base_name}.
    Phases follow Thunder's rule (split_phases) seeded with ``forward_outputs`` and the inputs.
    """
    views = views or {}
    kinds = [s[1] for s in steps]
    phases = split_phases([s[3] for s in steps], [s[2] for s in steps], kinds, set(forward_outputs) | set(params) | set(inputs))
    tensors = {}
    units = []
    ops = []  # one op per unit, named as its unit
    for index, ((name, kind, ins, outs), phase) in enumerate(zip(steps, phases)):
        for out in outs:
            if out in params:
                tkind = "param"
            elif out in inputs:
                tkind = "input"
            elif kind == "cotangent":
                tkind = "cotangent"
            else:
                tkind = "activation"
            tensors[out] = TensorInfo(out, (sizes[out],), "u8", sizes[out], tkind, index, index, phase, views.get(out))
        units.append(Unit(index, name, kind, phase, tuple(ins), tuple(outs), (index,), 0))
        ops.append(Op(index, name, index, None, phase, tuple(ins), (None,) * len(ins), tuple(outs), tuple(sizes[o] for o in outs)))
    return FusionGraph(units, tensors, ops, forward_outputs=tuple(forward_outputs), gradients=tuple(gradients), is_joint=True)


#: A joint chain small enough to compute by hand: x -> a -> b -> out; the backward reads b then a.
CHAIN_STEPS = [
    ("x", "input", [], ["x"]),
    ("w", "input", [], ["w"]),
    ("f", "region", ["x", "w"], ["a"]),
    ("g", "region", ["a"], ["b"]),
    ("h", "region", ["b"], ["out"]),
    ("get_grad", "cotangent", [], ["gout"]),
    ("h_bwd", "region", ["gout", "b"], ["gb"]),
    ("g_bwd", "region", ["gb", "a"], ["ga"]),
    ("f_bwd", "region", ["ga", "x"], ["gw"]),
    ("return", "return", ["out", "gw"], []),
]
CHAIN_SIZES = dict(x=1000, w=50, a=100, b=200, out=10, gout=10, gb=200, ga=100, gw=50)


def chain_graph(steps=CHAIN_STEPS, **sizes):
    """:data:`CHAIN_STEPS` (or ``steps`` with its names) as a graph, ``sizes`` over :data:`CHAIN_SIZES`."""
    return unit_graph(steps, {**CHAIN_SIZES, **sizes}, params=["w"], inputs=["x"], forward_outputs=["out"], gradients=["gw"])
