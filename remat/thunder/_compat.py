"""Environment bridges applied once, when remat first imports Thunder (``import remat.thunder``).

Two facts of the pinned environment need a small bridge (see docs/design.md):

* torch >= 2.12 removed the named-tensor methods ``Tensor.align_as``, ``align_to``, ``has_names``,
  ``refine_names`` and ``rename``.  lightning-thunder 0.2.6 lists them by attribute at import time
  (``thunder/torch/default_torch_ops.py``) and so fails to import.  We add stubs that raise if called;
  Thunder only needs the attributes to exist and to carry matching ``__name__``/``__qualname__``
  (it builds symbol names from them).
* nvFuser wheels from 0.2.34 on ship only the ``nvfuser_direct`` module, while Thunder 0.2.6 still does
  ``from nvfuser import compute_tensor_descriptor`` in one place.  Where ``nvfuser_direct`` imports and
  ``nvfuser`` does not, we alias the latter to the former.

Both bridges are idempotent and do nothing where they are not needed.  ``import remat`` alone applies
neither: they come with the first use of something that needs Thunder (see :mod:`remat.thunder`).
"""

from __future__ import annotations

import importlib.util
import sys

import torch

__all__ = ["NAMED_TENSOR_METHODS", "apply", "import_thunder", "install_named_tensor_stubs", "alias_nvfuser_direct"]

NAMED_TENSOR_METHODS: tuple[str, ...] = ("align_as", "align_to", "has_names", "refine_names", "rename")

#: Names of the stubs this module added (empty where torch still has the methods).
added_named_tensor_stubs: list[str] = []
#: True once ``sys.modules["nvfuser"]`` was pointed at ``nvfuser_direct`` by this module.
nvfuser_aliased: bool = False


def _make_removed_method_stub(name: str):
    def stub(self, *args, **kwargs):
        raise RuntimeError(
            f"torch.Tensor.{name} was removed from PyTorch (named tensors); "
            "remat only provides this name so that lightning-thunder 0.2.6 can import."
        )

    stub.__name__ = name
    stub.__qualname__ = f"Tensor.{name}"
    stub._remat_compat_stub = True
    return stub


def install_named_tensor_stubs() -> list[str]:
    """Add stubs for removed named-tensor methods; returns the names added by this call."""
    added = []
    for name in NAMED_TENSOR_METHODS:
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, _make_removed_method_stub(name))
            added.append(name)
    added_named_tensor_stubs.extend(added)
    return added


def alias_nvfuser_direct() -> bool:
    """Point ``import nvfuser`` at ``nvfuser_direct`` when only the latter exists; returns True if aliased."""
    global nvfuser_aliased
    if "nvfuser" in sys.modules:
        return nvfuser_aliased
    try:
        has_direct = importlib.util.find_spec("nvfuser_direct") is not None
        has_legacy = importlib.util.find_spec("nvfuser") is not None
    except (ImportError, ValueError):
        return False
    if has_direct and not has_legacy:
        import nvfuser_direct

        sys.modules["nvfuser"] = nvfuser_direct
        nvfuser_aliased = True
    return nvfuser_aliased


def import_thunder():
    """Apply the bridges, then import Thunder without its notice about the optional TransformerEngine."""
    apply()
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        import thunder
    return thunder


def apply() -> None:
    """Apply every bridge (safe to call more than once)."""
    install_named_tensor_stubs()
    alias_nvfuser_direct()
