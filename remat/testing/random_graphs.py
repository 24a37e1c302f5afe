"""Seeded random training graphs in the plain schema (no hypothesis needed), for benchmarks.

:func:`layered_training_graph` builds a forward of ``layers`` layers of ``width`` single-output ops
(elementwise ops and, with probability ``matmul_fraction``, matmul-tagged ops, whose outputs are larger
and whose FLOPs are much higher), with skip edges to earlier layers, parameters feeding matmuls, and a
mirrored backward: one backward op per forward op, in reverse, reading the next backward op (the
incoming gradient), the forward op's inputs and, for non-linear ops, its output.  Sizes are in bytes.
"""

from __future__ import annotations

import random

import networkx as nx

__all__ = ["layered_training_graph"]


def layered_training_graph(
    seed: int,
    *,
    layers: int = 4,
    width: int = 4,
    matmul_fraction: float = 0.3,
    skip_probability: float = 0.3,
) -> nx.DiGraph:
    rng = random.Random(seed)
    g = nx.DiGraph()
    g.add_node("x", phase="forward", bytes=rng.randint(1, 4) * 256, is_input=True)
    previous = ["x"]
    earlier: list[str] = []
    forward: list[str] = []
    for layer in range(layers):
        current = []
        for i in range(width):
            name = f"f{layer}_{i}"
            is_matmul = rng.random() < matmul_fraction
            nbytes = rng.randint(1, 16) * 256
            attrs = dict(phase="forward", bytes=nbytes, flops=nbytes * (rng.randint(64, 256) if is_matmul else 1))
            if is_matmul:
                attrs["tags"] = {"matmul"}
                weight = f"w{layer}_{i}"
                g.add_node(weight, phase="forward", bytes=rng.randint(1, 8) * 256, is_param=True)
            g.add_node(name, **attrs)
            parents = rng.sample(previous, k=min(len(previous), rng.randint(1, 2)))
            if earlier and rng.random() < skip_probability:
                parents.append(rng.choice(earlier))
            for p in set(parents):
                g.add_edge(p, name)
            if is_matmul:
                g.add_edge(weight, name)
            current.append(name)
            forward.append(name)
        earlier.extend(previous)
        previous = current
    # the forward output: a small op reading the last layer
    g.add_node("out", phase="forward", bytes=64, flops=64)
    for p in previous:
        g.add_edge(p, "out")
    g.graph["forward_outputs"] = ("out",)
    # backward: gradient chain, reading forward values
    g.add_node("g_out", phase="backward", bytes=64, flops=64)
    g.add_edge("out", "g_out")
    upstream = "g_out"
    for name in reversed(forward):
        grad = f"g_{name}"
        g.add_node(grad, phase="backward", bytes=g.nodes[name]["bytes"], flops=2 * g.nodes[name].get("flops", 1))
        g.add_edge(upstream, grad)
        for p in g.predecessors(name):
            if not g.nodes[p].get("is_param") and not g.nodes[p].get("is_input") and g.nodes[p]["phase"] == "forward":
                g.add_edge(p, grad)
        if "matmul" not in g.nodes[name].get("tags", ()):
            g.add_edge(name, grad)  # a non-linear op's gradient reads its output
        upstream = grad
    return g
