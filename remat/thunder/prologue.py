"""A guard for Thunder's ``PrunePrologueChecks`` under :func:`remat.jit`.

Each call, Thunder's prologue checks every tensor and attribute of the module the trace reads before the
step runs (0.15 ms on a 2-layer LitGPT block on an H100, which the GPU waits for: docs/api.md, "Recipe: less
host time before the first kernel").  Thunder's ``PrunePrologueChecks`` drops those checks, and with them
Thunder's way of noticing that the module changed: after ``model.eval()``, ``requires_grad_(False)`` on a
parameter, or a parameter replaced by one of another shape or dtype, the trace compiled for the module as it
was runs anyway (dropout still on in eval, say).

:class:`PrunedPrologueGuard` puts the cheapest part of that check back.  Before each call of a ThunderModule
compiled with pruned checks it reads the module's *state*: every submodule's ``training`` flag and every
parameter's and buffer's shape, dtype and ``requires_grad`` (lists of the objects are kept between calls and
rebuilt only after a parameter, buffer or submodule is registered anywhere, which torch's registration hooks
report).  When the state differs from the last call's, the guard files Thunder's cache entries away under the
old state and gives Thunder those of the new state (none the first time, so Thunder traces and compiles
again, as it would have without the pruning); switching back finds the entries compiled before.  So
``eval()``/``train()`` costs one compilation per state, as in plain Thunder.

Approximate, by design: other attributes the trace reads (a config number such as ``max_seq_length``, a
tensor that is an attribute but not a registered buffer, a tensor's device) are not read; Thunder's own
checks of the call's inputs, grad mode and autocast stay in the pruned prologue unless
``PrunePrologueChecks(prune_all_checks=True)`` drops them too.  Cost: about 10 us a call for a 2-layer
LitGPT model and 70 us for 32 layers on this project's CPU (a throwaway timing of the state alone;
docs/api.md has the step times).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["PrunedPrologueGuard", "prunes_module_checks", "guard_pruned_prologue"]

# Bumped by torch's global registration hooks whenever any module registers a parameter, buffer or
# submodule (including replacing one by assignment): the guards' cached lists of objects may be stale then.
_registration_epoch = 0


def _registered(*_: Any) -> None:
    global _registration_epoch
    _registration_epoch += 1


@functools.cache  # once per process: the hooks are global
def _install_registration_hooks() -> None:
    from torch.nn.modules import module as torch_module

    # each returns None: the registered object is kept as it is
    torch_module.register_module_parameter_registration_hook(_registered)
    torch_module.register_module_buffer_registration_hook(_registered)
    torch_module.register_module_module_registration_hook(_registered)


def prunes_module_checks(transforms: Iterable[Any] | None) -> bool:
    """Whether ``transforms`` hold Thunder's ``PrunePrologueChecks`` (which drops the module's checks)."""
    try:
        from thunder.transforms.prune_prologue_checks import PrunePrologueChecks
    except ImportError:  # pragma: no cover - a Thunder without the transform
        return False
    return any(isinstance(t, PrunePrologueChecks) for t in transforms or ())


class PrunedPrologueGuard:
    """A forward pre-hook for a ThunderModule compiled with ``PrunePrologueChecks`` (module docstring).

    ``module``: the user's module (what the ThunderModule reads its parameters from).  ``compile_stats``:
    Thunder's ``CompileStats`` of the jitted module, whose ``interpreter_cache`` is the list of compiled
    entries Thunder tries each call.  ``states_compiled`` counts the distinct states Thunder was given
    entries for (1 after the first call); ``switches`` how often the state changed between calls."""

    def __init__(self, module: torch.nn.Module, compile_stats: Any) -> None:
        _install_registration_hooks()
        self.module = module
        self.compile_stats = compile_stats
        self._epoch = -1
        self._modules: list[torch.nn.Module] = []
        self._tensors: list[torch.Tensor] = []
        self._state: tuple | None = None
        self._filed: dict[tuple, list] = {}  # state -> Thunder's cache entries compiled for it
        self.switches = 0

    @property
    def states_compiled(self) -> int:
        return len(self._filed) + (self._state is not None)

    def state(self) -> tuple:
        """What the pruned checks no longer look at, as one comparable value."""
        if self._epoch != _registration_epoch:  # something was registered somewhere: walk the module again
            self._epoch = _registration_epoch
            self._modules = list(self.module.modules())
            self._tensors = [*self.module.parameters(), *self.module.buffers()]
        return (
            tuple(m.training for m in self._modules),
            tuple((t.shape, t.dtype, t.requires_grad) for t in self._tensors),
        )

    def __call__(self, *_: Any) -> None:
        state = self.state()
        if state == self._state:
            return
        cache = self.compile_stats.interpreter_cache
        if self._state is not None:
            self.switches += 1
            self._filed[self._state] = list(cache)
        cache[:] = self._filed.pop(state, [])
        self._state = state


def guard_pruned_prologue(jitted: Any, transforms: Iterable[Any] | None) -> PrunedPrologueGuard | None:
    """Give ``jitted`` (what ``thunder.jit`` returned) a :class:`PrunedPrologueGuard` when ``transforms``
    prune the module's checks and ``jitted`` is a ThunderModule; the guard, or None."""
    if not prunes_module_checks(transforms) or not isinstance(jitted, torch.nn.Module):
        return None
    import thunder

    module = getattr(jitted, "_model", None)
    if not isinstance(module, torch.nn.Module):  # pragma: no cover - a ThunderModule of another shape
        return None
    guard = PrunedPrologueGuard(module, thunder.compile_stats(jitted))
    jitted.register_forward_pre_hook(guard)
    return guard
