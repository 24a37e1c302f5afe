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
