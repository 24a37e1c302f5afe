"""Environment bridges applied once, when remat first imports Thunder (``import remat.thunder``).

Four facts of the pinned environment need a small bridge (see docs/design.md):

* torch >= 2.12 removed the named-tensor methods ``Tensor.align_as``, ``align_to``, ``has_names``,
  ``refine_names`` and ``rename``.  lightning-thunder 0.2.6 lists them by attribute at import time
  (``thunder/torch/default_torch_ops.py``) and so fails to import.  We add stubs that raise if called;
  Thunder only needs the attributes to exist and to carry matching ``__name__``/``__qualname__``
  (it builds symbol names from them).
* nvFuser wheels from 0.2.34 on ship only the ``nvfuser_direct`` module, while Thunder 0.2.6 still does
  ``from nvfuser import compute_tensor_descriptor`` in one place.  Where ``nvfuser_direct`` imports and
  ``nvfuser`` does not, we alias the latter to the former.

* ThunderFX (``torch.compile(backend=thunder.dynamo.ThunderCompiler())``) splits dynamo's graph with
  ``torch.fx.passes.split_module`` and hands each Thunder-supported piece to ``thunder.jit``
  (``thunder/dynamo/splitter.py``, ``_splitter``).  torch 2.13's ``split_module`` builds those pieces
  with ``_make_graph_module``, which gives a ``_LazyGraphModule`` while dynamo compiles (dynamo turns
  lazy graph modules on around its backends); torch 2.11's built plain ``GraphModule`` objects, whose
  Python code exists from construction.  A lazy module writes its code on its first call, so
  Thunder's interpreter ends up tracing torch.fx's code generator, and fails in it on
  ``str.format(*(generator))`` ("object of type 'generator' has no len()", from
  ``thunder/core/interpreter.py`` ``wrap_args_from_list``).  Thunder forces the code of the graph it is
  given (``recompile_graph``) but not of the pieces.  The bridge makes ``split_module``, as
  ``thunder.dynamo.splitter`` calls it, build plain graph modules again (lazy graph modules off for that
  call only), i.e. what torch 2.11 does.  It is applied only where a probe shows ``split_module``
  returning lazy pieces under dynamo's setting (a feature check: torch 2.11 fails it and is left alone).

* Once Dynamo has run in a process (torch.compile, remat's Inductor runtimes), ``torch.nn.Module.__init__``
  is patched to tag every new module in ``GenerationTracker.generation_values``, a dictionary keyed by
  weak references (``torch/_dynamo/mutation_guard.py``).  A module built inside code Thunder traces has
  Thunder's interpreter run that tagging, and its dictionary bookkeeping iterates the whole dictionary;
  when a collection frees a tagged module mid-iteration, a weak reference's callback removes its entry
  and tracing fails with "dictionary changed size during iteration" (seen twice in this project's test
  suite, once in a ``training_trace``, once in a ``remat.jit`` of LitGPT's kv-cache path).  The bridge
  gives Thunder's interpreter a lookaside for ``GenerationTracker.tag``: it runs natively, as it would
  outside Thunder, and Thunder never iterates Dynamo's dictionary.  (A mitigation: the failure needs a
  collection at the wrong moment and was never reproduced on purpose.)

Every bridge is idempotent and does nothing where it is not needed.  ``import remat`` alone applies
none: they come with the first use of something that needs Thunder (see :mod:`remat.thunder`).
"""

from __future__ import annotations

import functools
import importlib.util
import operator
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

__all__ = [
    "NAMED_TENSOR_METHODS",
    "alias_nvfuser_direct",
    "apply",
    "bridge_thunderfx_split_module",
    "import_thunder",
    "install_named_tensor_stubs",
    "split_module_makes_lazy_pieces",
]

NAMED_TENSOR_METHODS: tuple[str, ...] = ("align_as", "align_to", "has_names", "refine_names", "rename")

#: Names of the stubs this module added (empty where torch still has the methods).
added_named_tensor_stubs: list[str] = []
#: True once ``sys.modules["nvfuser"]`` was pointed at ``nvfuser_direct`` by this module.
nvfuser_aliased: bool = False
#: True once ``thunder.dynamo.splitter.split_module`` was wrapped by this module.
thunderfx_split_module_bridged: bool = False


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


def split_module_makes_lazy_pieces() -> bool:
    """Whether ``torch.fx.passes.split_module`` returns lazy pieces (``_LazyGraphModule``, code written on
    first call) when lazy graph modules are on, as they are while dynamo runs a backend.  A probe on a
    one-node graph (about a millisecond), not a version test: True on torch 2.13, False on torch 2.11."""
    from torch.fx import _lazy_graph_module as lazy
    from torch.fx.passes.split_module import split_module

    if not (hasattr(lazy, "_use_lazy_graph_module") and hasattr(lazy, "_LazyGraphModule")):
        return False  # a torch without these private names has no lazy graph modules to bridge
    graph = torch.fx.Graph()
    graph.output(graph.call_function(operator.neg, (graph.placeholder("x"),)))
    whole = torch.fx.GraphModule(torch.nn.Module(), graph)
    with lazy._use_lazy_graph_module(True):
        pieces = split_module(whole, None, lambda node: 0)
    return any(isinstance(piece, lazy._LazyGraphModule) for piece in pieces.children())


def _with_eager_graph_modules(split_module: Callable[..., Any]) -> Callable[..., Any]:
    from torch.fx import _lazy_graph_module as lazy

    @functools.wraps(split_module)
    def split_module_with_eager_pieces(*args: Any, **kwargs: Any) -> Any:
        # plain GraphModules write their code now, outside Thunder's interpreter (see the module docstring)
        with lazy._use_lazy_graph_module(False):
            return split_module(*args, **kwargs)

    split_module_with_eager_pieces._remat_compat_bridge = True
    return split_module_with_eager_pieces


def bridge_thunderfx_split_module(splitter: ModuleType | None = None) -> bool:
    """Make ThunderFX's graph splitting build plain graph modules where ``split_module`` would build lazy
    ones (see the module docstring); returns True if ``splitter.split_module`` is bridged after the call.

    ``splitter``: the module whose ``split_module`` to wrap, ``thunder.dynamo.splitter`` by default
    (imported here, after Thunder).  Nothing is changed where the probe
    (:func:`split_module_makes_lazy_pieces`) finds plain pieces, or where the module has no
    ``split_module``; calling it again does nothing more.
    """
    global thunderfx_split_module_bridged
    if splitter is None:
        from thunder.dynamo import splitter
    current = getattr(splitter, "split_module", None)
    if current is None:
        return False
    if getattr(current, "_remat_compat_bridge", False):
        return True
    if not split_module_makes_lazy_pieces():
        return False
    splitter.split_module = _with_eager_graph_modules(current)
    thunderfx_split_module_bridged = True
    return True


dynamo_tagging_bridged = False


def bridge_dynamo_generation_tagging() -> bool:
    """Make Thunder's interpreter run Dynamo's ``GenerationTracker.tag`` natively (see the module's
    docstring); True when the lookaside was registered by this call."""
    global dynamo_tagging_bridged
    if dynamo_tagging_bridged:
        return False
    try:
        from thunder.core.interpreter import interpreter_needs_wrap
        from thunder.core.jit_ext import register_general_jit_lookaside
        from torch._dynamo.mutation_guard import GenerationTracker
    except ImportError:  # another torch or Thunder: nothing to bridge
        return False
    # Thunder's interpreter calls a bound method as its function with ``self`` first, and looks the
    # function up among lookasides: the classmethod's own function, called with the class
    tag = GenerationTracker.tag.__func__

    @register_general_jit_lookaside(tag)
    @interpreter_needs_wrap
    def native_tag(cls: type, obj: Any) -> None:
        tag(cls, obj)

    dynamo_tagging_bridged = True
    return True


def import_thunder() -> ModuleType:
    """Apply the bridges, then import Thunder without its notice about the optional TransformerEngine,
    then bridge ThunderFX (which needs Thunder imported)."""
    apply()
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        import thunder
    bridge_thunderfx_split_module()
    bridge_dynamo_generation_tagging()
    return thunder


def apply() -> None:
    """Apply the bridges Thunder's import needs (safe to call more than once); the ThunderFX bridge comes
    after Thunder's import, in :func:`import_thunder`."""
    install_named_tensor_stubs()
    alias_nvfuser_direct()
