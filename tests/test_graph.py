"""FusionGraph attributes on a LitGPT block, region views, and bad traces."""

import math

import pytest
import torch

import remat


@pytest.fixture(scope="module")
def graph(pythia_trace):
    return remat.read_trace(pythia_trace)


@pytest.fixture(scope="module")
def fused_graph(pythia_trace):
    return remat.read_trace(remat.fuse(pythia_trace))


def test_edges_carry_real_tensor_sizes(graph):
    itemsize = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "b8": 1}
    checked = 0
    for u, v, data in graph.nx.edges(data=True):
        total = 0
        for name in data["tensors"]:
            info = graph.tensors[name]
            if info.kind == "number":
                continue
            assert info.bytes == math.prod(info.shape) * itemsize[info.dtype]
            total += info.bytes
        assert data["bytes"] == total
        main = graph.tensors[data["tensor"]]
        assert data["shape"] == main.shape and data["dtype"] == main.dtype
        assert data["phase"] in ("forward", "backward")
        assert data["is_param"] == (main.kind == "param")
        checked += 1
    assert checked > 300


def test_op_tags_and_flops(graph):
    nodes = graph.nx.nodes
    linears = [n for n in graph.nx if nodes[n]["kind"] == "linear"]
    assert linears
    for n in linears:
        out = graph.tensors[nodes[n]["outputs"][0]]
        x = graph.tensors[nodes[n]["inputs"][0]]
        assert "matmul" in nodes[n]["tags"]
        assert nodes[n]["flops"] == 2 * math.prod(out.shape) * x.shape[-1]
        for _, _, data in graph.nx.out_edges(n, data=True):
            assert "matmul" in data["producer_tags"]
    reductions = [n for n in graph.nx if nodes[n]["kind"] == "var_mean"]
    assert reductions and all("reduction" in nodes[n]["tags"] for n in reductions)
    views = [n for n in graph.nx if nodes[n]["kind"] == "reshape"]
    assert views and all(nodes[n]["flops"] == 0 for n in views)
    attention = [n for n in graph.nx if nodes[n]["kind"] == "remat_sdpa_fwd"]
    assert attention and "attention" in nodes[attention[0]]["tags"]


def test_param_edges_and_phases(graph):
    params = {name for name, t in graph.tensors.items() if t.kind == "param"}
    assert any("weight" in p for p in params)
    param_edges = [d for _, _, d in graph.nx.edges(data=True) if d["tensor"] in params]
    assert param_edges and all(d["is_param"] for d in param_edges)
    forward_nodes = [n for n in graph.nx if graph.nx.nodes[n]["phase"] == "forward"]
    backward_nodes = [n for n in graph.nx if graph.nx.nodes[n]["phase"] == "backward"]
    assert forward_nodes and backward_nodes
    # nothing in the forward reads a value made by the backward
    for u, v in graph.nx.edges:
        if graph.nx.nodes[v]["phase"] == "forward":
            assert graph.nx.nodes[u]["phase"] == "forward"


def test_graph_is_acyclic_and_in_execution_order(graph):
    import networkx as nx

    assert nx.is_directed_acyclic_graph(graph.nx)
    assert all(u < v for u, v in graph.nx.edges)


def test_region_membership_and_region_graph(fused_graph):
    regions = [u for u in fused_graph.units if u.kind == "region"]
    assert len(regions) >= 5
    for unit in regions:
        assert all(fused_graph.nx.nodes[n]["region"] == unit.name for n in unit.nodes)
    rg = fused_graph.regions()
    assert {u.name for u in regions} <= set(rg.nodes)
    assert "linear" in {rg.nodes[n]["kind"] == "op" and n for n in rg.nodes}
    for u, v, data in rg.edges(data=True):
        assert data["bytes"] == sum(fused_graph.tensors[t].bytes for t in data["tensors"])


def test_symbolic_shapes_are_rejected_with_a_clear_error():
    import thunder

    def fn(x):
        return (x * 2).sum()

    jitted = thunder.jit(fn, cache="symbolic values")
    jitted(torch.randn(4, 3))
    trace = thunder.last_traces(jitted)[0]
    with pytest.raises(remat.UnsupportedTraceError, match="symbolic shape"):
        remat.read_trace(trace)
