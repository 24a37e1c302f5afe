"""Behaviour pinning: what remat decides on two fixed tiny models, asserted exactly.

Like Thunder's ``test_cse_rematerialization`` (which counts fusions), these fail on *any* change of
behaviour (regions formed, what is saved, bytes, estimated peaks), intended or not, and print a
readable diff.  When a change is intended, paste the "actual" block the failure prints over the model's
entry in ``EXPECTED`` and say why in the commit message.

Saved values are named ``"<unit>/<producer op> <dtype>[<shape>]"`` (the unit is the region, e.g.
``nvFusion3``, or the stand-alone op that writes the value), counted when repeated: proxy names
(``t251``) are deterministic but say nothing to a reader.  Traces are on the meta device, so nothing
runs; bytes come from the memory model.
"""

from __future__ import annotations

import difflib
import json
import pprint
from collections import Counter

import pytest

import remat
from conftest import traced
from remat.thunder.execute import split_joint, thunder_context

MODELS = {
    # tiny_litgpt defaults: 1 layer, n_embd 64, 4 heads, vocab 128; batch 1, sequence 32, float32
    "pythia-14m": {},
    "Llama-2-7b-hf": dict(n_query_groups=2, intermediate_size=128),
}

EXPECTED = {
    "pythia-14m": {
        "estimated peak: unplanned / Thunder's rematerialize / remat": (386816, 305920, 290560),
        "extra FLOPs": 69632,
        "new recompute regions": 1,
        "recomputed forward ops": 57,
        "regions after Thunder's split (forward, backward)": (5, 10),
        "regions formed by remat.fuse": 14,  # bias gradients apart from the layer-norm backward (FusionPolicy.independent_parts)
        "regions that recompute": 6,
        "saved by remat": [
            "linear/linear f32[1, 32, 256]",
            "nvFusion0/rsqrt f32[1, 32, 1]",
            "nvFusion0/var_mean f32[1, 32]",
            "nvFusion1/cat f32[1, 4, 32, 16] x2",
            "nvFusion1/stride_order f32[1, 4, 32, 16]",
            "nvFusion2/rsqrt f32[1, 32, 1]",
            "nvFusion2/var_mean f32[1, 32]",
            "nvFusion4/add f32[1, 32, 64]",
            "nvFusion4/rsqrt f32[1, 32, 1]",
            "nvFusion4/var_mean f32[1, 32]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32, 16]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32]",
        ],
        "saved bytes: unplanned / Thunder's rematerialize / remat": (263424, 148736, 75008),
        "saved unplanned": [
            "linear/linear f32[1, 32, 256]",
            "nvFusion0/mul f32[1, 32, 64]",
            "nvFusion0/reshape f32[1, 32, 64]",
            "nvFusion0/rsqrt f32[1, 32, 1]",
            "nvFusion0/shallow_copy f32[1, 32, 64]",
            "nvFusion0/sub f32[1, 32, 64]",
            "nvFusion0/var_mean f32[1, 32]",
            "nvFusion1/cat f32[1, 4, 32, 16] x2",
            "nvFusion1/stride_order f32[1, 4, 32, 16]",
            "nvFusion2/mul f32[1, 32, 64]",
            "nvFusion2/rsqrt f32[1, 32, 1]",
            "nvFusion2/shallow_copy f32[1, 32, 64]",
            "nvFusion2/sub f32[1, 32, 64]",
            "nvFusion2/var_mean f32[1, 32]",
            "nvFusion3/add f32[1, 32, 256]",
            "nvFusion3/div f32[1, 32, 256]",
            "nvFusion3/mul f32[1, 32, 256]",
            "nvFusion4/mul f32[1, 32, 64]",
            "nvFusion4/rsqrt f32[1, 32, 1]",
            "nvFusion4/shallow_copy f32[1, 32, 64] x2",
            "nvFusion4/sub f32[1, 32, 64]",
            "nvFusion4/var_mean f32[1, 32]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32, 16]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32]",
            "reshape/reshape f32[1, 32, 64]",
        ],
        "stand-alone ops after remat.fuse": 43,  # the qkv-gradient cat of each layer runs as torch.cat (FusionPolicy.transposed_cat)
    },
    "Llama-2-7b-hf": {
        "estimated peak: unplanned / Thunder's rematerialize / remat": (279552, 263168, 238720),
        "extra FLOPs": 53760,
        "new recompute regions": 3,
        "recomputed forward ops": 73,
        "regions after Thunder's split (forward, backward)": (5, 10),
        "regions formed by remat.fuse": 12,  # as above
        "regions that recompute": 9,
        "saved by remat": [
            "linear/linear f32[1, 32, 128] x3",
            "nvFusion0/rsqrt f32[1, 32, 1]",
            "nvFusion2/add f32[1, 32, 64]",
            "nvFusion2/rsqrt f32[1, 32, 1]",
            "nvFusion4/add f32[1, 32, 64]",
            "nvFusion4/rsqrt f32[1, 32, 1]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32, 16]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32]",
        ],
        "saved bytes: unplanned / Thunder's rematerialize / remat": (181120, 140160, 74624),
        "saved unplanned": [
            "linear/linear f32[1, 32, 128] x2",
            "nvFusion0/mul f32[1, 32, 64]",
            "nvFusion0/reshape f32[1, 32, 64]",
            "nvFusion0/rsqrt f32[1, 32, 1]",
            "nvFusion0/shallow_copy f32[1, 32, 64]",
            "nvFusion1/cat f32[1, 4, 32, 16]",
            "nvFusion1/reshape f32[1, 4, 32, 16] x2",
            "nvFusion2/add f32[1, 32, 64]",
            "nvFusion2/mul f32[1, 32, 64]",
            "nvFusion2/rsqrt f32[1, 32, 1]",
            "nvFusion2/shallow_copy f32[1, 32, 64]",
            "nvFusion3/mul f32[1, 32, 128] x2",
            "nvFusion4/add f32[1, 32, 64]",
            "nvFusion4/mul f32[1, 32, 64]",
            "nvFusion4/rsqrt f32[1, 32, 1]",
            "nvFusion4/shallow_copy f32[1, 32, 64]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32, 16]",
            "remat_sdpa_fwd/remat_sdpa_fwd f32[1, 4, 32]",
            "reshape/reshape f32[1, 32, 64]",
        ],
        "stand-alone ops after remat.fuse": 53,  # as above
    },
}


def saved_names(graph: remat.FusionGraph, names) -> list[str]:
    labels = []
    for name in names:
        info = graph.tensors[name]
        unit = graph.units[info.producer_unit].name
        kind = graph.ops[info.producer_node].kind if info.producer_node is not None else "?"
        labels.append(f"{unit}/{kind} {info.dtype}{list(info.shape)}")
    counts = Counter(labels)
    return [f"{label} x{n}" if n > 1 else label for label, n in sorted(counts.items())]


def regions(trace) -> int:
    return sum(1 for b in trace.bound_symbols if b.sym.is_fusion)


def behaviour(name: str, overrides: dict) -> dict:
    """Everything the pinning asserts for one model."""
    from thunder.core.rematerialization import rematerialize

    joint = traced(name, seq=32, device="meta", **overrides)  # pythia: the session's pythia_trace
    fused = remat.fuse(joint)
    res = remat.optimize(fused, strict=True)
    with thunder_context():
        thunder_plan = remat.estimate_memory(rematerialize(fused))
    forward, backward = split_joint(res.trace)
    new_regions = [r for r in res.placements if r not in {b.sym.name for b in fused.bound_symbols}]
    return {
        "regions formed by remat.fuse": regions(fused),
        "stand-alone ops after remat.fuse": sum(1 for u in res.graph.units if u.kind == "op"),
        "regions after Thunder's split (forward, backward)": (regions(forward), regions(backward)),
        "new recompute regions": len(new_regions),
        "regions that recompute": len(res.placements),
        "recomputed forward ops": len(res.plan.recomputed_ops),
        "extra FLOPs": res.extra_flops,
        "saved bytes: unplanned / Thunder's rematerialize / remat": (
            res.before.saved_bytes,
            thunder_plan.saved_bytes,
            res.after.saved_bytes,
        ),
        "estimated peak: unplanned / Thunder's rematerialize / remat": (
            res.before.peak_bytes,
            thunder_plan.peak_bytes,
            res.after.peak_bytes,
        ),
        "saved by remat": saved_names(res.graph, res.plan.saved),
        "saved unplanned": saved_names(res.graph, res.before.saved_tensors),
    }


def as_source(name: str, actual: dict) -> str:
    """``actual`` written as its entry of ``EXPECTED`` (what to paste when a change is intended)."""
    lines = [f"    {json.dumps(name)}: {{"]
    for key in sorted(actual):
        value = actual[key]
        if isinstance(value, list):
            lines.append(f"        {json.dumps(key)}: [")
            lines += [f"            {json.dumps(item)}," for item in value]
            lines.append("        ],")
        else:
            lines.append(f"        {json.dumps(key)}: {value!r},")
    lines.append("    },")
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(MODELS))
def test_behaviour_is_pinned(name):
    actual = behaviour(name, MODELS[name])
    expected = EXPECTED[name]
    if actual != expected:
        diff = "\n".join(
            difflib.unified_diff(
                pprint.pformat(expected, width=110).splitlines(),
                pprint.pformat(actual, width=110).splitlines(),
                "expected",
                "actual",
                lineterm="",
            )
        )
        pytest.fail(
            f"remat's behaviour on {name} changed:\n{diff}\n\n"
            f"If intended, replace EXPECTED[{name!r}] in tests/test_pinning.py with:\n{as_source(name, actual)}",
            pytrace=False,
        )
