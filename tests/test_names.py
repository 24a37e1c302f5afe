"""Names a person can read: the module each value and op of a trace comes from (issue 17).

``FusionGraph.module_names`` (worked out by ``remat.thunder.read.module_names``): exact parameter names
from Thunder's provenance, exact modules for ops reading a parameter or writing its gradient, inferred
modules for the rest; ``FusionGraph.value_module`` and ``describe_values`` show them."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from conftest import LLAMA_2, PYTHIA_2, tiny_litgpt, traced

import remat
from remat.core.units import format_bytes
from remat.core.ir import (
    ROOT_MODULE,
    common_module,
    describe_values,
    module_text,
    parameter_module,
)
from remat.core.plain import plain_graph
from remat.thunder.read import parameter_names

MODELS = {"pythia": PYTHIA_2, "llama": LLAMA_2}


def _model(config: dict) -> torch.nn.Module:
    overrides = {k: v for k, v in config.items() if k not in ("name", "seq", "device")}
    with torch.device("meta"):
        return tiny_litgpt(config["name"], **overrides)


@pytest.fixture(scope="module", params=sorted(MODELS))
def optimized(request):
    """(model, result of remat.optimize on the fused trace) for a 2-layer GPT-NeoX and LLaMA."""
    config = MODELS[request.param]
    return _model(config), remat.optimize(remat.fuse(traced(**config)))


# ---------------------------------------------------------------------------------------------- plain data
def test_common_module_is_the_deepest_shared_prefix_by_component():
    assert common_module("h.0.attn.qkv", "h.0.attn.proj") == "h.0.attn"
    assert common_module("h.0.mlp", "h.0.mlp") == "h.0.mlp"
    assert common_module("h.1.mlp", "h.10.mlp") == "h"  # components, not characters
    assert common_module("lm_head", "transformer.wte") == ROOT_MODULE


def test_parameter_module():
    assert parameter_module("transformer.h.0.mlp.fc.weight") == "transformer.h.0.mlp.fc"
    assert parameter_module("cos") == ROOT_MODULE


def test_plain_graphs_have_no_names():
    g = nx.DiGraph()
    g.add_node("a", phase="forward", bytes=8)
    g.add_node("b", phase="backward", bytes=8)
    g.add_edge("a", "b")
    graph = plain_graph(g)[0]
    assert graph.module_names is None
    name = next(iter(graph.tensors))
    assert graph.value_module(name) is None
    assert describe_values(graph, [name]) == [f"{name} ({format_bytes(graph.tensors[name].bytes)})"]
    with pytest.raises(KeyError, match="no value named 'nope'"):
        graph.value_module("nope")


def test_a_function_traced_on_plain_tensors_has_no_names():
    x = torch.randn(4, 4, requires_grad=True)
    graph = remat.read_trace(remat.training_trace(lambda t: (t.sin() * 2).sum(), x))
    assert graph.module_names is None
    assert graph.op_module(0) is None


# ---------------------------------------------------------------------------------------------- LitGPT
def test_parameter_names_are_the_modules_own_dotted_names(optimized):
    model, result = optimized
    names = parameter_names(result.original)
    expected = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    assert set(names.values()) == expected
    assert len(names) == len(expected)  # one proxy per parameter or buffer
    # read from Thunder's provenance, not guessed from the proxy name: an underscore is ambiguous
    # (LLaMA's mlp.fc_1), and Thunder names some proxies after local variables (a norm's "weight")
    if model.config.mlp_class_name == "LLaMAMLP":
        assert names["t_transformer_h_0_mlp_fc_1_weight"] == "transformer.h.0.mlp.fc_1.weight"
    assert dict(result.graph.module_names.parameters) == names


def test_saved_and_recomputed_values_map_to_modules_of_the_model(optimized):
    model, result = optimized
    modules = {name for name, _ in model.named_modules()}
    after = result.after_graph
    saved = [after.value_module(n) for n in result.after.saved_tensors]
    recomputed = [result.graph.value_module(n) for n in result.plan.recomputed_values]
    assert saved and recomputed
    assert set(saved) <= modules and set(recomputed) <= modules
    assert {m for m in saved if m.startswith("transformer.h.1.")}  # deeper than the block list
    described = describe_values(after, result.after.saved_tensors)
    for name, line in zip(result.after.saved_tensors, described):
        assert line.startswith(f"{name} ({module_text(after.value_module(name))}, ")


def test_ops_reading_a_parameter_belong_to_its_module(optimized):
    _, result = optimized
    graph = result.graph
    names = graph.module_names
    checked = 0
    for op in graph.ops:
        if op.is_input:
            continue
        owners = {parameter_module(names.parameters[n]) for n in op.inputs if n in names.parameters}
        owners -= {ROOT_MODULE}  # buffers held by the model itself (rotary tables) anchor nothing
        if len(owners) == 1:
            assert graph.op_module(op.id) == next(iter(owners)), op
            assert op.id in names.exact
            checked += 1
    assert checked


def test_gradients_are_written_by_their_parameters_module(optimized):
    _, result = optimized
    graph, trace = result.graph, result.original
    returned = trace.bound_symbols[-1].args[0]
    names = graph.module_names.parameters
    pairs = [(a.name, g.name) for a, g in zip(returned["flat_args"], returned["output"]) if g is not None and a.name in names]
    assert pairs
    for param, grad in pairs:
        assert graph.value_module(grad) == parameter_module(names[param])


def test_inferred_modules_of_attention_and_norms(optimized):
    """Ops between two parameterised ops take their common module (attention between qkv and proj);
    a norm's statistics share the norm's call with its weight multiply."""
    model, result = optimized
    graph = result.graph
    forward = [op for op in graph.ops if op.phase == "forward"]
    attention = [op for op in forward if "sdpa" in op.kind or "attention" in op.kind]
    assert [graph.op_module(op.id) for op in attention] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert all(op.id not in graph.module_names.exact for op in attention)
    norm_modules = {name for name, m in model.named_modules() if type(m).__name__ in ("LayerNorm", "RMSNorm")}
    statistics = {graph.op_module(op.id) for op in forward if op.kind in ("var_mean", "rsqrt")}
    assert statistics
    if model.config.norm_class_name == "LayerNorm":  # one F.layer_norm call: exactly the norm
        assert statistics <= norm_modules
    else:  # RMSNorm computes its statistics on other lines than its weight multiply: a module containing it
        assert all(any(n == m or n.startswith(m + ".") or m == "" for n in norm_modules) for m in statistics)


def test_the_rewritten_trace_keeps_the_names_of_forward_values(optimized):
    _, result = optimized
    for name in result.after.saved_tensors:
        assert result.after_graph.value_module(name) == result.graph.value_module(name)


def test_op_module_refuses_an_unknown_op(optimized):
    _, result = optimized
    with pytest.raises(KeyError, match="no op"):
        result.graph.op_module(len(result.graph.ops))
