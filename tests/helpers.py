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
