"""The memory model on traces small enough to compute by hand, and against Thunder's own split."""

import pytest

import remat
from helpers import CHAIN_STEPS, chain_graph, unit_graph
from remat.core.memory import headroom, profile_graph


def live(profile):
    return [p.live_bytes for p in profile.timeline]


def test_chain():
    g = chain_graph()
    p = profile_graph(g)
    # step:            x  w  f    g    h    get_grad h_bwd g_bwd f_bwd return
    assert live(p) == [0, 0, 100, 300, 310, 320, 520, 410, 160, 60]
    assert p.peak_bytes == 520 and p.peak_unit_name == "h_bwd"
    assert set(p.saved_tensors) == {"a", "b"} and p.saved_bytes == 300
    assert p.param_bytes == 50 and p.input_bytes == 1000
    assert p.forward_peak_bytes == 310 and p.backward_peak_bytes == 520


def test_headroom_is_the_peak_less_the_live_bytes_where_the_op_runs():
    # The chain with its last backward step an embedding gradient: live 160 there, peak 520.
    steps = [step if step[0] != "f_bwd" else ("embedding_backward", "op", ["ga", "x"], ["gw"]) for step in CHAIN_STEPS]
    g = chain_graph(steps)
    p = profile_graph(g)
    assert headroom(p, g, {"embedding_backward"}) == 520 - 160
    assert headroom(p, g, {"h_bwd"}) == 0  # the op that sets the peak leaves no room
    assert headroom(p, g, {"matmul"}) is None  # no unit runs one


def test_diamond_frees_the_shared_input_after_its_last_reader():
    # a feeds b and c, which meet in d; nothing is read by a backward except d's input c.
    steps = [
        ("x", "input", [], ["x"]),
        ("f", "op", ["x"], ["a"]),
        ("left", "op", ["a"], ["b"]),
        ("right", "op", ["a"], ["c"]),
        ("join", "op", ["b", "c"], ["d"]),
        ("get_grad", "cotangent", [], ["gd"]),
        ("join_bwd", "op", ["gd", "c"], ["gx"]),
        ("return", "return", ["d", "gx"], []),
    ]
    sizes = dict(x=8, a=40, b=30, c=20, d=10, gd=10, gx=8)
    g = unit_graph(steps, sizes, params=["x"], forward_outputs=["d"], gradients=["gx"])
    p = profile_graph(g)
    # a lives f..right; b lives left..join; c lives right..join_bwd; d to the end.
    assert live(p) == [0, 40, 70, 90, 60, 40, 48, 18]
    assert p.peak_bytes == 90
    assert p.saved_tensors == ("c",) and p.saved_bytes == 20


def test_residual_add_keeps_the_skip_input_alive():
    steps = [
        ("x", "input", [], ["x"]),
        ("norm", "region", ["x"], ["h"]),
        ("mlp", "op", ["h"], ["m"]),
        ("residual", "region", ["m", "h"], ["y"]),
        ("get_grad", "cotangent", [], ["gy"]),
        ("mlp_bwd", "op", ["gy", "h"], ["gx"]),
        ("return", "return", ["y", "gx"], []),
    ]
    sizes = dict(x=64, h=64, m=256, y=64, gy=64, gx=64)
    g = unit_graph(steps, sizes, params=["x"], forward_outputs=["y"], gradients=["gx"])
    p = profile_graph(g)
    # h is alive from norm through mlp_bwd (the skip read and the backward read).
    assert live(p) == [0, 64, 320, 384, 192, 256, 128]
    assert p.peak_bytes == 384 and p.peak_unit_name == "residual"
    assert p.saved_tensors == ("h",)


def test_a_fusion_allocates_all_its_outputs_together():
    # One region writes p (read late) and q (read at once): both are allocated when it runs.
    steps = [
        ("x", "input", [], ["x"]),
        ("fusion", "region", ["x"], ["p", "q"]),
        ("use_q", "op", ["q"], ["r"]),
        ("use_p", "op", ["p", "r"], ["out"]),
        ("get_grad", "cotangent", [], ["gout"]),
        ("bwd", "op", ["gout"], ["gx"]),
        ("return", "return", ["out", "gx"], []),
    ]
    sizes = dict(x=4, p=100, q=50, r=10, out=1, gout=1, gx=4)
    g = unit_graph(steps, sizes, params=["x"], forward_outputs=["out"], gradients=["gx"])
    p = profile_graph(g)
    assert live(p) == [0, 150, 160, 111, 2, 6, 5]
    assert p.peak_bytes == 160
    assert p.saved_bytes == 0


def test_a_view_aliases_its_base():
    steps = [
        ("x", "input", [], ["x"]),
        ("f", "region", ["x"], ["a"]),
        ("reshape", "op", ["a"], ["v"]),
        ("g", "region", ["v"], ["out"]),
        ("get_grad", "cotangent", [], ["gout"]),
        ("g_bwd", "region", ["gout", "v"], ["gx"]),
        ("return", "return", ["out", "gx"], []),
    ]
    sizes = dict(x=4, a=100, v=100, out=4, gout=4, gx=4)
    g = unit_graph(steps, sizes, params=["x"], forward_outputs=["out"], gradients=["gx"], views={"v": "a"})
    p = profile_graph(g)
    # v adds no bytes; a (its base) stays alive until g_bwd reads v.
    assert live(p) == [0, 100, 100, 104, 108, 112, 8]
    assert p.saved_tensors == ("a",) and p.saved_bytes == 100


def test_saved_set_matches_thunders_own_split(pythia_trace):
    from remat.thunder.execute import split_joint

    graph = remat.read_trace(pythia_trace)
    profile = remat.estimate_memory(graph)
    forward, _ = split_joint(pythia_trace)
    saved_tensors = forward.bound_symbols[-1].args[1][0]
    thunder_saved = set()
    for proxy in saved_tensors:
        info = graph.tensors[proxy.name]
        base = graph.tensors[info.alias_of] if info.alias_of else info
        if base.kind == "activation":
            thunder_saved.add(base.name)
    assert set(profile.saved_tensors) == thunder_saved
    assert profile.saved_bytes == sum(graph.tensors[n].bytes for n in thunder_saved)


def test_peak_is_at_least_saved_and_timeline_covers_every_unit(pythia_trace):
    profile = remat.estimate_memory(pythia_trace)
    graph = remat.read_trace(pythia_trace)
    assert len(profile.timeline) == len(graph.units)
    assert profile.peak_bytes >= profile.saved_bytes > 0
    assert profile.peak_bytes == max(p.live_bytes for p in profile.timeline)


def test_estimate_memory_rejects_non_traces():
    with pytest.raises(TypeError, match="Thunder trace"):
        remat.estimate_memory("not a trace")
    with pytest.raises(TypeError, match="training_trace"):
        remat.estimate_memory(lambda x: x)
