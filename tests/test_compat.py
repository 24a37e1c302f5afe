import sys
import types

import pytest
import torch

from remat.thunder import _compat


def test_named_tensor_stubs_exist_with_thunder_visible_names():
    for name in _compat.NAMED_TENSOR_METHODS:
        method = getattr(torch.Tensor, name)
        assert method.__name__ == name
        # Thunder builds symbol names from these; torch's own methods use the same form.
        assert method.__qualname__.endswith(name)


def test_added_stubs_raise_a_clear_error_when_called():
    if not _compat.added_named_tensor_stubs:
        pytest.skip("this torch still has named-tensor methods; no stubs were added")
    name = _compat.added_named_tensor_stubs[0]
    with pytest.raises(RuntimeError, match="named tensors"):
        getattr(torch.zeros(1), name)()


def test_bridges_are_idempotent():
    before = {n: getattr(torch.Tensor, n) for n in _compat.NAMED_TENSOR_METHODS}
    assert _compat.install_named_tensor_stubs() == []
    _compat.apply()
    assert {n: getattr(torch.Tensor, n) for n in _compat.NAMED_TENSOR_METHODS} == before


def test_thunder_imports_after_the_bridge():
    thunder = _compat.import_thunder()
    assert thunder.__version__.startswith("0.2.6")


def test_nvfuser_alias_points_at_nvfuser_direct(monkeypatch):
    fake_direct = types.ModuleType("nvfuser_direct")
    fake_direct.compute_tensor_descriptor = lambda *a: None
    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake_direct)
    monkeypatch.delitem(sys.modules, "nvfuser", raising=False)
    monkeypatch.setattr(_compat, "nvfuser_aliased", False)

    def fake_find_spec(name):
        return object() if name == "nvfuser_direct" else None

    monkeypatch.setattr(_compat.importlib.util, "find_spec", fake_find_spec)
    assert _compat.alias_nvfuser_direct() is True
    from nvfuser import compute_tensor_descriptor  # noqa: F401  (what Thunder 0.2.6 imports)

    assert sys.modules["nvfuser"] is fake_direct


def test_nvfuser_alias_is_harmless_without_nvfuser(monkeypatch):
    monkeypatch.delitem(sys.modules, "nvfuser", raising=False)
    monkeypatch.setattr(_compat, "nvfuser_aliased", False)
    monkeypatch.setattr(_compat.importlib.util, "find_spec", lambda name: None)
    assert _compat.alias_nvfuser_direct() is False
    assert "nvfuser" not in sys.modules


# ThunderFX on torch >= 2.12: split_module's lazy pieces (see remat/thunder/_compat.py)


def _lazy_pieces_of(split_module) -> list[bool]:
    """Whether each piece ``split_module`` makes of a two-op graph is lazy, with lazy graph modules on
    (as while dynamo runs a backend)."""
    import operator

    from torch.fx import _lazy_graph_module as lazy

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    neg = graph.call_function(operator.neg, (x,))
    graph.output(graph.call_function(operator.mul, (neg, 2)))
    whole = torch.fx.GraphModule(torch.nn.Module(), graph)
    with lazy._use_lazy_graph_module(True):
        split = split_module(whole, None, lambda node: 0 if node.target is operator.neg else 1)
    return [isinstance(piece, lazy._LazyGraphModule) for piece in split.children()]


def test_thunderfx_splitter_makes_plain_graph_modules():
    """What Thunder's splitter hands to thunder.jit has its Python code already (torch 2.11's behaviour),
    on every torch; the bridge is in place exactly where torch's own split_module makes lazy pieces."""
    from thunder.dynamo import splitter
    from torch.fx.passes.split_module import split_module

    _compat.import_thunder()
    assert _lazy_pieces_of(splitter.split_module) == [False, False]
    torch_makes_lazy = any(_lazy_pieces_of(split_module))
    assert torch_makes_lazy == _compat.split_module_makes_lazy_pieces()
    assert _compat.thunderfx_split_module_bridged == torch_makes_lazy


def test_thunderfx_trains_a_function_without_remat():
    """Plain ThunderFX (Thunder's default executors, no remat) compiles and differentiates a small
    function; on torch 2.13 without the bridge this failed in Thunder's interpreter with "object of type
    'generator' has no len()" while tracing the GraphModule."""
    thunder = _compat.import_thunder()
    from thunder.dynamo import ThunderCompiler

    def step(x, w):
        return (x @ w * 2 + 1).sin().sum()

    torch._dynamo.reset()
    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    expected = step(x, w)
    (expected_grad,) = torch.autograd.grad(expected, w)
    backend = ThunderCompiler()
    got = torch.compile(step, backend=backend)(x, w)
    (got_grad,) = torch.autograd.grad(got, w)
    torch._dynamo.reset()
    assert [len(info.thunder_compiled_fns) for info in backend.subgraph_infos] == [1]  # Thunder ran it
    assert thunder.last_traces(backend.subgraph_infos[0].thunder_compiled_fns[0])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_grad, expected_grad)


def test_split_module_bridge_keeps_the_lazy_setting_and_errors():
    """The wrapped split_module turns lazy graph modules off for its own call only, and lets errors out."""
    from torch.fx import _lazy_graph_module as lazy

    seen = []

    def fake_split_module(*args, **kwargs):
        seen.append(lazy._get_graph_module_cls())
        if kwargs.get("fail"):
            raise ValueError("split failed")
        return args

    wrapped = _compat._with_eager_graph_modules(fake_split_module)
    with lazy._use_lazy_graph_module(True):
        assert wrapped(1, 2) == (1, 2)
        assert lazy._get_graph_module_cls() is lazy._LazyGraphModule
        with pytest.raises(ValueError, match="split failed"):
            wrapped(fail=True)
        assert lazy._get_graph_module_cls() is lazy._LazyGraphModule
    assert seen == [torch.fx.GraphModule, torch.fx.GraphModule]


def test_split_module_bridge_is_idempotent_and_skipped_where_not_needed(monkeypatch):
    def original(*args, **kwargs):
        return None

    not_needed = types.ModuleType("fake_splitter")
    not_needed.split_module = original
    monkeypatch.setattr(_compat, "split_module_makes_lazy_pieces", lambda: False)
    assert _compat.bridge_thunderfx_split_module(not_needed) is False
    assert not_needed.split_module is original  # torch 2.11: left alone

    needed = types.ModuleType("fake_splitter")
    needed.split_module = original
    monkeypatch.setattr(_compat, "split_module_makes_lazy_pieces", lambda: True)
    monkeypatch.setattr(_compat, "thunderfx_split_module_bridged", False)
    assert _compat.bridge_thunderfx_split_module(needed) is True
    bridged = needed.split_module
    assert bridged is not original and bridged.__wrapped__ is original
    assert _compat.bridge_thunderfx_split_module(needed) is True
    assert needed.split_module is bridged  # not wrapped twice

    assert _compat.bridge_thunderfx_split_module(types.ModuleType("no_split_module")) is False


def test_thunder_runs_dynamos_module_tagging_natively(monkeypatch):
    """Once Dynamo has run, every new module is tagged in a weak-key dictionary of Dynamo's; a module built
    inside traced code must not have Thunder's interpreter iterate that dictionary (a collection during
    the iteration failed tracing twice in this suite: "dictionary changed size during iteration"), and
    the module is still tagged, as outside Thunder."""
    import thunder.core.interpreter as interpreter
    from torch._dynamo import mutation_guard
    from torch._dynamo.mutation_guard import GenerationTracker

    thunder = _compat.import_thunder()
    assert _compat.bridge_dynamo_generation_tagging() is False  # applied once, by import_thunder
    mutation_guard.install_generation_tagging_init()  # what torch.compile does on its first run
    iterations = []
    populate = interpreter.populate_item_wrappers

    def counting(wrapped):
        if wrapped.value is GenerationTracker.generation_values.values:
            iterations.append(wrapped)
        return populate(wrapped)

    monkeypatch.setattr(interpreter, "populate_item_wrappers", counting)
    built = []

    def fn(x):
        module = torch.nn.Identity()
        built.append(module)
        return module(x).sin().sum()

    thunder.jit(fn)(torch.randn(4, requires_grad=True))
    assert len(built) == 1 and GenerationTracker.get_generation_value(built[0]) >= 0  # tagged
    assert iterations == []
