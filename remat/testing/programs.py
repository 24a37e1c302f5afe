"""Small torch programs as plain data: what :func:`remat.testing.strategies.programs` draws.

A :class:`Program` is a list of inputs (shape, dtype, requires_grad) and a list of operations, each
applied to earlier values by name (``"i0"``, ``"i1"``, ... for inputs, ``"t0"``, ``"t1"``, ... for op
results).  Values no later op reads (the *sinks*) make the output: the sum of their sums (``output="loss"``,
a scalar loss) or the sinks themselves (``output="tensors"``, a tuple).  Every value flows into the
output, and input ``i0`` (always read by the first op and always ``requires_grad``) gives the program a
backward part.

A program is hashable and its ``repr`` is a constructor call, so a failing example found by hypothesis
can be pasted into a regression test as it is::

    Program(inputs=(TensorSpec((2, 3)),), ops=(OpSpec("sin", ("i0",)),))

Operations (:data:`OPS`; ``a``, ``b`` are value names, params in brackets)::

    unary       sin cos tanh sigmoid relu gelu silu exp neg abs square          a
    scale       a * c                                                          a [c]
    binary      add sub mul maximum, safe_div = a / (1 + b*b)                  a b   (broadcasting)
    cat         torch.cat((a, b), dim)                                         a b [dim]
    reductions  sum mean amax var over one dim                                  a [dim, keepdim]
    softmax log_softmax                                                         a [dim]
    layer_norm  F.layer_norm over the last dim (no affine)                      a
    permute transpose flatten (reshape -1) merge (last two dims) unsqueeze      a [...]
    expand      a.unsqueeze(0).expand(k, ...)                                  a [k]
    slice       a.narrow(dim, start, length)                                   a [dim, start, length]
    matmul      a @ b, b a 2-D value or a weight input                          a b
    linear      F.linear(a, w), w a weight input                                a w
    where       torch.where(a > 0, a, b)                                        a b
    cast        a.to(dtype)                                                     a [dtype name]
    dropout     F.dropout(a, p, training=True)                                  a [p]
    cross_entropy  F.cross_entropy over the last dim (classes), each row's        a [ignore_index]
                target its argmax, reduction "none" (rank >= 2; a row whose
                argmax is ignore_index gets no gradient)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import remat

__all__ = ["TensorSpec", "OpSpec", "Program", "OPS", "UNARY_OPS", "BINARY_OPS", "apply_op", "op_expression"]

#: Unary ops: name -> Python expression template (``{a}`` is the operand).
UNARY_OPS: dict[str, str] = {
    "sin": "torch.sin({a})",
    "cos": "torch.cos({a})",
    "tanh": "torch.tanh({a})",
    "sigmoid": "torch.sigmoid({a})",
    "relu": "torch.relu({a})",
    "gelu": "F.gelu({a})",
    "silu": "F.silu({a})",
    "exp": "torch.exp({a})",
    "neg": "torch.neg({a})",
    "abs": "torch.abs({a})",
    "square": "{a} * {a}",
}
#: Binary (broadcasting) ops: name -> expression template.
BINARY_OPS: dict[str, str] = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "maximum": "torch.maximum({a}, {b})",
    "safe_div": "{a} / (1 + {b} * {b})",
}
_OTHER_TEMPLATES: dict[str, str] = {
    "scale": "{a} * {p0!r}",
    "cat": "torch.cat(({a}, {b}.to({a}.dtype)), {p0})",
    "sum": "torch.sum({a}, {p0}, keepdim={p1})",
    "mean": "torch.mean({a}, {p0}, keepdim={p1})",
    "amax": "torch.amax({a}, {p0}, keepdim={p1})",
    "var": "torch.var({a}, {p0}, keepdim={p1})",
    "softmax": "torch.softmax({a}, {p0})",
    "log_softmax": "torch.log_softmax({a}, {p0})",
    "layer_norm": "F.layer_norm({a}, ({a}.shape[-1],))",
    "permute": "{a}.permute{p0}",
    "transpose": "{a}.transpose({p0}, {p1})",
    "flatten": "{a}.reshape(-1)",
    "merge": "{a}.reshape(*{a}.shape[:-2], {a}.shape[-2] * {a}.shape[-1])",
    "unsqueeze": "{a}.unsqueeze({p0})",
    "expand": "{a}.unsqueeze(0).expand({p0}, *{a}.shape)",
    "slice": "{a}.narrow({p0}, {p1}, {p2})",
    "matmul": "{a} @ {b}.to({a}.dtype)",
    "linear": "F.linear({a}, {b}.to({a}.dtype))",
    "where": "torch.where({a} > 0, {a}, {b}.to({a}.dtype))",
    "cast": "{a}.to(torch.{p0})",
    "dropout": "F.dropout({a}, {p0!r}, training=True)",
    "cross_entropy": (
        "F.cross_entropy({a}.reshape(-1, {a}.shape[-1]), {a}.reshape(-1, {a}.shape[-1]).argmax(-1), "
        "reduction='none', ignore_index={p0}).reshape({a}.shape[:-1])"
    ),
}
REDUCTION_OPS = ("sum", "mean", "amax", "var")
SHAPE_OPS = ("permute", "transpose", "flatten", "merge", "unsqueeze", "expand", "slice")
OTHER_OPS = ("scale", "cat", "softmax", "log_softmax", "layer_norm", "matmul", "linear", "where", "cast", "dropout", "cross_entropy")
#: Every operation a program may use.
OPS: tuple[str, ...] = (*UNARY_OPS, *BINARY_OPS, *REDUCTION_OPS, *SHAPE_OPS, *OTHER_OPS)
_TEMPLATES = {**UNARY_OPS, **BINARY_OPS, **_OTHER_TEMPLATES}
_NAMESPACE = {"torch": torch, "F": F}

@dataclass(frozen=True)
class TensorSpec:
    """One program input: shape, dtype name (``"float64"``, ``"float32"``, ``"bfloat16"``) and whether
    it requires grad (parameters and weights do)."""

    shape: tuple[int, ...]
    dtype: str = "float64"
    requires_grad: bool = True


@dataclass(frozen=True)
class OpSpec:
    """One operation: its name in :data:`OPS`, the names of the values it reads, and its parameters."""

    op: str
    args: tuple[str, ...]
    params: tuple[Any, ...] = ()


def op_expression(op: OpSpec) -> str:
    """The Python expression computing ``op`` from the values it reads (by name)."""
    template = _TEMPLATES.get(op.op)
    if template is None:
        raise ValueError(f"unknown program op {op.op!r}; known: {OPS}")
    fields = {f"p{k}": v for k, v in enumerate(op.params)}
    return template.format(a=op.args[0], b=op.args[1] if len(op.args) > 1 else None, **fields)


def apply_op(op: OpSpec, args: Sequence[torch.Tensor]) -> torch.Tensor:
    """Run one operation on torch tensors (real or meta)."""
    return eval(op_expression(op), dict(_NAMESPACE), dict(zip(op.args, args)))  # noqa: S307 - our own templates


_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Program:
    """A small torch program (see the module docstring).  Call it on tensors matching ``inputs``."""

    inputs: tuple[TensorSpec, ...]
    ops: tuple[OpSpec, ...]
    output: str = "loss"

    def __post_init__(self) -> None:
        if not self.ops:
            raise ValueError("a program needs at least one op")
        if self.output not in ("loss", "tensors"):
            raise ValueError(f"output must be 'loss' or 'tensors', got {self.output!r}")

    @property
    def sinks(self) -> tuple[str, ...]:
        """Names of the op results no later op reads: they make the output."""
        read = {a for op in self.ops for a in op.args}
        return tuple(f"t{j}" for j in range(len(self.ops)) if f"t{j}" not in read)

    def source(self) -> str:
        """The program as a straight-line Python function ``program(i0, i1, ...)`` using ``torch`` and
        ``F`` (``torch.nn.functional``).  Thunder traces straight-line code much faster than the
        interpreter loop of :meth:`__call__` would be."""
        lines = [f"def program({', '.join(f'i{k}' for k in range(len(self.inputs)))}):"]
        for k, spec in enumerate(self.inputs):
            grad = " requires_grad" if spec.requires_grad else ""
            lines.append(f"    # i{k}: {spec.dtype}{list(spec.shape)}{grad}")
        for j, op in enumerate(self.ops):
            lines.append(f"    t{j} = {op_expression(op)}")
        sinks = self.sinks
        if self.output == "tensors":
            lines.append(f"    return ({', '.join(sinks)},)")
        else:
            lines.append(f"    return {' + '.join(f'{s}.sum()' for s in sinks)}")
        return "\n".join(lines) + "\n"

    def function(self) -> Callable[..., Any]:
        """The program as a plain Python function (what :func:`remat.training_trace` is given)."""
        namespace = dict(_NAMESPACE)
        exec(compile(self.source(), "<remat.testing.Program>", "exec"), namespace)  # noqa: S102
        return namespace["program"]

    def __call__(self, *tensors: torch.Tensor) -> Any:
        return self.function()(*tensors)

    def example_args(self, *, seed: int = 0, device: str | torch.device = "cpu") -> list[torch.Tensor]:
        """Random inputs (standard normal, ``requires_grad`` as specified)."""
        generator = torch.Generator().manual_seed(seed)
        args = []
        for spec in self.inputs:
            t = torch.randn(spec.shape, dtype=torch.float64, generator=generator).to(_DTYPES[spec.dtype])
            if device != "cpu":
                t = t.to(device)
            args.append(t.requires_grad_(spec.requires_grad))
        return args

    def training_trace(self):
        """The joint forward+backward Thunder trace of the program (:func:`remat.training_trace`)."""
        return remat.training_trace(self.function(), *self.example_args())
