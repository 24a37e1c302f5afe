"""Stage 7, *emit*: fusion regions as nvFuser ``FusionDefinition`` scripts.

:func:`definition_source` turns a region (a fusion bound symbol made by :func:`remat.fuse` /
:func:`remat.optimize`) into a runnable Python script for ``nvfuser_direct``: ``define_tensor`` with
shapes, contiguity and dtypes, one ``fd.ops.*`` call per prim, ``add_output``.  It needs no nvFuser, so
it is tested on CPU (structure and golden files).  :func:`build` runs that script and returns the live
``FusionDefinition`` where ``nvfuser_direct`` imports; :class:`NvFuserRegionCallable` runs a region with
it, building one definition per input layout and falling back to the torch reference (with one warning
naming the region) if nvFuser rejects it.  Regions whose definitions are equal up to proxy names (those
of identical layers: :func:`definition_key`) share one definition (:func:`shared_build`), so nvFuser
compiles their kernels once.

The script is the single source of truth: what ``build`` executes is exactly what a user reads (a
shared definition was built from the script of the first region that needed it, which differs from the
others' only in names).  Each op
kind has one emitter in :data:`EMITTERS` (the unary and binary prims are written from the op table's
sets, :data:`remat.core.ops.NVFUSER_UNARY_PRIMS` / ``NVFUSER_BINARY_PRIMS``); :func:`supported_kinds` is
that table's keys.

Shapes follow nvFuser's convention: ``-1`` for symbolic extents, ``1`` for broadcast (size-1) dims.
Division by a float is emitted as multiplication by the reciprocal, as Thunder's nvFuser executor does
(faster in nvFuser; not bit-identical to ``torch.div``).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from numbers import Number
from typing import Any

import torch
from looseversion import LooseVersion
from thunder.core import dtypes
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol

from remat.core.ops import NVFUSER_BINARY_PRIMS, NVFUSER_UNARY_PRIMS, STATELESS_RNG_KINDS
from remat.errors import RematError, warn
from remat.thunder.read import op_kind

__all__ = [
    "EMITTERS",
    "EmitError",
    "NvFuserRegionCallable",
    "available",
    "build",
    "clear_shared_definitions",
    "definition_key",
    "definition_source",
    "shared_build",
    "shared_definitions",
    "supported_kinds",
    "version",
    "MIN_LINEAR_VERSION",
]


class EmitError(RematError, NotImplementedError):
    """A region holds an op remat cannot write as an nvFuser definition."""


#: nvFuser versions from which ``fd.ops.linear`` / ``fd.ops.matmul`` run in fusions (Thunder 0.2.6 gates
#: its own ``nv_enable_linear`` on the same operations; the direct bindings arrived in 0.2.34).
MIN_LINEAR_VERSION = "0.2.34"

_DTYPES = {
    "f64": "DataType.Double",
    "f32": "DataType.Float",
    "f16": "DataType.Half",
    "bf16": "DataType.BFloat16",
    "i64": "DataType.Int",
    "i32": "DataType.Int32",
    "b8": "DataType.Bool",
    "c128": "DataType.ComplexDouble",
    "c64": "DataType.ComplexFloat",
}



def _dtype_short(dtype: Any) -> str:
    return dtype.shortname() if hasattr(dtype, "shortname") else str(dtype)


def _nv_dtype(dtype: Any) -> str:
    if dtype in (float,):
        return "DataType.Double"
    if dtype in (int,):
        return "DataType.Int"
    if dtype in (bool,):
        return "DataType.Bool"
    if dtype in (complex,):
        return "DataType.ComplexDouble"
    short = _dtype_short(dtypes.to_dtype(dtype) if not isinstance(dtype, dtypes.dtype) else dtype)
    short = short.rstrip("_")
    if short not in _DTYPES:
        raise EmitError(f"nvFuser has no data type for {dtype}")
    return _DTYPES[short]


def _python_literal(value: Any) -> str:
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return repr(value)


class _Writer:
    """Accumulates the lines of one definition function."""

    def __init__(self, canonical: bool = False) -> None:
        self.lines: list[str] = []
        self.names: dict[str, str] = {}  # proxy name -> python variable in the script
        self.scalars = 0
        self.temps = 0
        # canonical: variables are numbered in definition order instead of named after the proxies, so
        # two regions that differ only in proxy names (identical layers) give the same text
        self.canonical = canonical

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def scalar(self, value: Any) -> str:
        name = f"s{self.scalars}"
        self.scalars += 1
        if isinstance(value, bool):
            dtype = "DataType.Bool"
        elif isinstance(value, int):
            dtype = "DataType.Int"
        elif isinstance(value, float):
            dtype = "DataType.Double"
        elif isinstance(value, complex):
            dtype = "DataType.ComplexDouble"
        else:
            raise EmitError(f"cannot write {value!r} as an nvFuser scalar")
        self.emit(f"{name} = fd.define_scalar({_python_literal(value)}, {dtype})")
        return name

    def temp(self) -> str:
        name = f"v{self.temps}"
        self.temps += 1
        return name

    def value(self, x: Any) -> str:
        """The script expression for an op argument: a defined proxy or a new scalar constant."""
        if isinstance(x, Proxy):
            if x.name not in self.names:
                raise EmitError(f"{x.name} is used before it is defined in the region")
            return self.names[x.name]
        if isinstance(x, Number):
            return self.scalar(x)
        raise EmitError(f"cannot pass {type(x).__name__} {x!r} to an nvFuser op")

    def define(self, proxy: Proxy, expression: str) -> None:
        variable = f"p{len(self.names)}" if self.canonical else proxy.name
        self.names[proxy.name] = variable
        self.emit(f"{variable} = {expression}")


def _out(bsym: BoundSymbol) -> Proxy:
    outs = [p for p in bsym.flat_outs if isinstance(p, Proxy)]
    if len(outs) != 1:
        raise EmitError(f"{op_kind(bsym)} with {len(outs)} outputs")
    return outs[0]


def _ints(values: Sequence[Any]) -> str:
    if any(isinstance(v, Proxy) for v in values):
        raise EmitError("symbolic sizes are not supported")
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


Emitter = Callable[[_Writer, BoundSymbol], None]


def _unary(name: str) -> Emitter:
    def emit(w: _Writer, bsym: BoundSymbol) -> None:
        w.define(_out(bsym), f"fd.ops.{name}({w.value(bsym.args[0])})")

    return emit


def _binary(name: str) -> Emitter:
    def emit(w: _Writer, bsym: BoundSymbol) -> None:
        w.define(_out(bsym), f"fd.ops.{name}({w.value(bsym.args[0])}, {w.value(bsym.args[1])})")

    return emit


def _reduction(name: str) -> Emitter:
    def emit(w: _Writer, bsym: BoundSymbol) -> None:
        args = bsym.args
        dims = list(args[1])
        if name == "sum" and not dims:
            w.names[_out(bsym).name] = w.value(args[0])
        else:
            w.define(_out(bsym), f"fd.ops.{name}({w.value(args[0])}, {_ints(dims)})")

    return emit


def _emit_shallow_copy(w: _Writer, bsym: BoundSymbol) -> None:
    w.names[_out(bsym).name] = w.value(bsym.args[0])  # an alias, no operation


def _emit_div(w: _Writer, bsym: BoundSymbol) -> None:
    a, b = bsym.args
    if dtypes.is_exact_dtype(dtypes.to_dtype(a)) and dtypes.is_exact_dtype(dtypes.to_dtype(b)):
        w.define(_out(bsym), f"fd.ops.div({w.value(a)}, {w.value(b)})")
    else:
        w.define(_out(bsym), f"fd.ops.mul({w.value(a)}, fd.ops.reciprocal({w.value(b)}))")


def _emit_lerp(w: _Writer, bsym: BoundSymbol) -> None:
    args = bsym.args
    w.define(_out(bsym), f"fd.ops.lerp({w.value(args[0])}, {w.value(args[1])}, {w.value(args[2])})")


def _emit_where(w: _Writer, bsym: BoundSymbol) -> None:
    args, out = bsym.args, _out(bsym)
    # nvFuser does not promote scalar operands itself; cast to the result type Thunder computed.
    w.define(out, f"fd.ops.cast(fd.ops.where({w.value(args[0])}, {w.value(args[1])}, {w.value(args[2])}), {_nv_dtype(out.dtype)})")


def _emit_convert(w: _Writer, bsym: BoundSymbol) -> None:
    out = _out(bsym)
    w.define(out, f"fd.ops.cast({w.value(bsym.args[0])}, {_nv_dtype(out.dtype)})")


def _emit_var(w: _Writer, bsym: BoundSymbol) -> None:
    args = bsym.args
    w.define(_out(bsym), f"fd.ops.var({w.value(args[0])}, {_ints(args[1])}, {int(bsym.kwargs['correction'])})")


def _emit_var_mean(w: _Writer, bsym: BoundSymbol) -> None:
    args = bsym.args
    var, mean = [p for p in bsym.flat_outs if isinstance(p, Proxy)]
    pair = w.temp()
    w.emit(f"{pair} = fd.ops.var_mean({w.value(args[0])}, {_ints(args[1])}, {int(bsym.kwargs['correction'])})")
    w.define(var, f"{pair}[0]")
    w.define(mean, f"{pair}[1]")


def _emit_broadcast_in_dim(w: _Writer, bsym: BoundSymbol) -> None:
    args = bsym.args
    w.define(_out(bsym), f"fd.ops.broadcast_in_dim({w.value(args[0])}, {_ints(args[1])}, {_ints(args[2])})")


def _shape_op(name: str) -> Emitter:
    """``fd.ops.<name>(tensor, [ints])`` (reshape, permute, squeeze, stride_order)."""

    def emit(w: _Writer, bsym: BoundSymbol) -> None:
        w.define(_out(bsym), f"fd.ops.{name}({w.value(bsym.args[0])}, {_ints(bsym.args[1])})")

    return emit


def _slice_strides(bsym: BoundSymbol) -> list:
    args, kwargs = bsym.args, bsym.kwargs
    return args[3] if len(args) > 3 and args[3] is not None else kwargs.get("strides") or [1] * len(args[1])


def _emit_slice(w: _Writer, bsym: BoundSymbol) -> None:
    reason = refusal(bsym, "slice")
    if reason is not None:
        raise EmitError(reason)
    a, start, end = bsym.args[0], bsym.args[1], bsym.args[2]
    w.define(_out(bsym), f"fd.ops.slice({w.value(a)}, {_ints(start)}, {_ints(end)}, {_ints(_slice_strides(bsym))})")


def refusal(bsym: BoundSymbol, kind: str) -> str | None:
    """Why nvFuser cannot run this one bound symbol of a kind it otherwise supports (a rule on its
    arguments), or None.  :func:`remat.fuse` keeps such symbols out of regions, as Thunder's nvFuser
    executor does with its checkers."""
    if kind == "slice" and any(int(step) != 1 for step in _slice_strides(bsym)):
        # nvFuser 0.2.36: "All slice operation strides must be of const size 1" (found by tests/test_gpu.py)
        return "nvFuser slices with step 1 only"
    return None


def _emit_cat(w: _Writer, bsym: BoundSymbol) -> None:
    tensors, dim = bsym.args[0], bsym.args[1]
    w.define(_out(bsym), f"fd.ops.cat([{', '.join(w.value(t) for t in tensors)}], {int(dim)})")


def _emit_pad(w: _Writer, bsym: BoundSymbol) -> None:
    a, value, config = bsym.args
    widths: list[int] = []
    for low, high, dilation in reversed(config):
        if dilation != 0:
            raise EmitError("pad with interior dilation")
        widths += [low, high]
    w.define(_out(bsym), f"fd.ops.pad({w.value(a)}, {_ints(widths)}, {w.value(value)})")


def _emit_full(w: _Writer, bsym: BoundSymbol) -> None:
    args, kwargs = bsym.args, bsym.kwargs
    w.define(_out(bsym), f"fd.ops.full({_ints(args[0])}, {w.value(args[1])}, {_nv_dtype(kwargs['dtype'])})")


def _emit_iota(w: _Writer, bsym: BoundSymbol) -> None:
    args, kwargs = bsym.args, bsym.kwargs
    length, start, step = w.value(args[0]), w.value(kwargs["start"]), w.value(kwargs["step"])
    w.define(_out(bsym), f"fd.ops.iota({length}, {start}, {step}, {_nv_dtype(kwargs['dtype'])})")


def _uniform(stateless: bool) -> Emitter:
    """``uniform``, and ``uniform_philox`` (stateless: its seed and offset reproduce the numbers)."""

    def emit(w: _Writer, bsym: BoundSymbol) -> None:
        args, kwargs = bsym.args, bsym.kwargs
        shape = "[" + ", ".join(w.value(s) for s in args[0]) + "]"
        extra = f", rng_seed={w.value(kwargs['seed'])}, rng_offset={w.value(kwargs['offset'])}" if stateless else ""
        dtype = _nv_dtype(kwargs["dtype"])
        w.define(_out(bsym), f"fd.ops.uniform({w.value(args[1])}, {w.value(args[2])}, {shape}, dtype={dtype}{extra})")

    return emit


def _indexing(name: str) -> Emitter:
    """``fd.ops.<name>(tensor, index, dim)`` (take -> index_select, take_along_axis)."""

    def emit(w: _Writer, bsym: BoundSymbol) -> None:
        args = bsym.args
        w.define(_out(bsym), f"fd.ops.{name}({w.value(args[0])}, {w.value(args[1])}, {int(args[2])})")

    return emit


def _emit_embedding(w: _Writer, bsym: BoundSymbol) -> None:
    args = bsym.args
    indices, weight = args[0], args[1]
    if len(args) > 3 and args[3] is not None:
        raise EmitError("embedding with max_norm")
    out = _out(bsym)
    flat = w.temp()
    w.emit(f"{flat} = fd.ops.reshape({w.value(indices)}, [-1])")
    rows = w.temp()
    w.emit(f"{rows} = fd.ops.index_select({w.value(weight)}, {flat}, 0)")
    w.define(out, f"fd.ops.reshape({rows}, {_ints(out.shape)})")


def _emit_linear(w: _Writer, bsym: BoundSymbol) -> None:
    a, weight, bias = bsym.args
    bias_expr = "None" if bias is None else w.value(bias)
    if isinstance(weight, TensorProxy) and weight.ndim == 1:
        # nvFuser's linear wants a 2-D weight: treat a vector as one output feature, then drop it.
        wide = w.temp()
        w.emit(f"{wide} = fd.ops.broadcast_in_dim({w.value(weight)}, [1, {int(weight.shape[0])}], [1])")
        product = w.temp()
        w.emit(f"{product} = fd.ops.linear({w.value(a)}, {wide}, {bias_expr})")
        out = _out(bsym)
        w.define(out, f"fd.ops.squeeze({product}, [{len(out.shape)}])")
    else:
        w.define(_out(bsym), f"fd.ops.linear({w.value(a)}, {w.value(weight)}, {bias_expr})")


#: Op kind -> the function writing it into a definition: the one table of what remat can emit.
EMITTERS: dict[str, Emitter] = {
    **{name: _unary(name) for name in NVFUSER_UNARY_PRIMS},
    "clone": _unary("set"),
    **{name: _binary(name) for name in NVFUSER_BINARY_PRIMS},
    "shallow_copy": _emit_shallow_copy,
    "div": _emit_div,
    "lerp": _emit_lerp,
    "where": _emit_where,
    "convert_element_type": _emit_convert,
    **{kind: _reduction(name) for kind, name in {"amax": "max", "amin": "min", "prod": "prod", "sum": "sum"}.items()},
    "var": _emit_var,
    "var_mean": _emit_var_mean,
    "broadcast_in_dim": _emit_broadcast_in_dim,
    "reshape": _shape_op("reshape"),
    "transpose": _shape_op("permute"),
    "squeeze": _shape_op("squeeze"),
    "stride_order": _shape_op("stride_order"),
    "slice": _emit_slice,
    "cat": _emit_cat,
    "pad": _emit_pad,
    "full": _emit_full,
    "iota": _emit_iota,
    "uniform": _uniform(stateless=False),
    "uniform_philox": _uniform(stateless=True),
    "take": _indexing("index_select"),
    "take_along_axis": _indexing("take_along_axis"),
    "embedding": _emit_embedding,
    "linear": _emit_linear,
    "matmul": _binary("matmul"),
}


def _emit_op(w: _Writer, bsym: BoundSymbol) -> None:
    kind = op_kind(bsym)
    emitter = EMITTERS.get(kind)
    if emitter is None:
        raise EmitError(f"remat cannot write {kind!r} as an nvFuser op")
    emitter(w, bsym)


def supported_kinds() -> frozenset[str]:  # arguments may still be refused: see refusal()
    """Op kinds :func:`definition_source` can write (the keys of :data:`EMITTERS`)."""
    return frozenset(EMITTERS)


def contiguous_descriptor(proxy: TensorProxy) -> tuple[tuple[bool | None, ...], tuple[int, ...]]:
    """nvFuser contiguity and stride order of a contiguous tensor of the proxy's shape."""
    contiguity = tuple(None if size == 1 else True for size in proxy.shape)
    stride_order = tuple(range(len(proxy.shape) - 1, -1, -1))
    return contiguity, stride_order


def definition_source(
    region: BoundSymbol,
    input_descriptors: Sequence[Any] | None = None,
    *,
    example: bool = True,
) -> str:
    """A runnable Python script defining ``region`` as an ``nvfuser_direct.FusionDefinition``.

    ``input_descriptors[i]`` is ``(contiguity, stride_order)`` for tensor inputs (from
    :func:`tensor_descriptor` at run time; contiguous by default) and ignored for numbers.  With
    ``example=True`` the script ends with a ``__main__`` block that runs the fusion on random CUDA inputs.
    Raises :class:`EmitError` for ops remat cannot write.
    """
    if not isinstance(region, BoundSymbol):
        hint = " (take one from trace.bound_symbols where bsym.sym.is_fusion)" if hasattr(region, "bound_symbols") else ""
        raise TypeError(f"definition_source expects a fusion region (a BoundSymbol), got {type(region).__name__}{hint}")
    if not getattr(region.sym, "is_fusion", False):
        raise TypeError(f"definition_source expects a fusion region (bsym.sym.is_fusion), got {region.sym.name}")
    if input_descriptors is not None and len(input_descriptors) != len(region.args):
        raise ValueError(
            f"input_descriptors has {len(input_descriptors)} entries for the {len(region.args)} inputs of {region.sym.name}"
        )
    name = region.sym.name
    inputs = list(region.args)
    outputs = [p for p in region.flat_outs if isinstance(p, Proxy)]
    w = _definition_body(region, input_descriptors)

    input_list = ", ".join(f"{p.name}: {_describe(p)}" for p in inputs)
    output_list = ", ".join(f"{p.name}: {_describe(p)}" for p in outputs)
    lines = [
        f"# {name}: {len(region.subsymbols)} prims, emitted by remat",
        f"#   inputs:  {input_list}",
        f"#   outputs: {output_list}",
        "import torch",
        "from nvfuser_direct import DataType, FusionDefinition",
        "",
        "",
        f"def {_identifier(name)}(fd: FusionDefinition) -> None:",
        *w.lines,
        "",
        "",
        "with FusionDefinition() as fd:",
        f"    {_identifier(name)}(fd)",
    ]
    if example:
        lines += [
            "",
            'if __name__ == "__main__":',
            "    inputs = [",
            *[f"        {_example_input(p)}," for p in inputs],
            "    ]",
            "    outputs = fd.execute(inputs)",
            "    print([tuple(o.shape) for o in outputs])",
        ]
    return "\n".join(lines) + "\n"


def _definition_body(region: BoundSymbol, input_descriptors: Sequence[Any] | None, canonical: bool = False) -> _Writer:
    """The lines of the definition function of ``region`` (see :func:`definition_source`)."""
    inputs = list(region.args)
    outputs = [p for p in region.flat_outs if isinstance(p, Proxy)]
    w = _Writer(canonical)
    for index, proxy in enumerate(inputs):
        if isinstance(proxy, TensorProxy):
            if input_descriptors is not None and input_descriptors[index] is not None:
                contiguity, stride_order = input_descriptors[index]
            else:
                contiguity, stride_order = contiguous_descriptor(proxy)
            shape = [1 if size == 1 else -1 for size in proxy.shape]
            w.define(
                proxy,
                f"fd.define_tensor(shape={shape}, contiguity={list(contiguity)}, dtype={_nv_dtype(proxy.dtype)}, "
                f"is_cpu=False, stride_order={list(stride_order)})",
            )
        elif isinstance(proxy, NumberProxy):
            w.define(proxy, f"fd.define_scalar({_nv_dtype(proxy.python_type)})")
        else:
            raise EmitError(f"region input {proxy!r} is neither a tensor nor a number")
    input_variables = {w.names[p.name] for p in inputs}
    for bsym in region.subsymbols:
        _emit_op(w, bsym)
    emitted: set[str] = set()
    for proxy in outputs:
        if not isinstance(proxy, TensorProxy):
            raise EmitError(f"nvFuser cannot output the number {proxy.name}")
        expression = w.value(proxy)
        if expression in input_variables or expression in emitted:
            # an output that is an input (or another output) needs its own buffer
            copy = w.temp()
            w.emit(f"{copy} = fd.ops.set({expression})")
            expression = copy
        emitted.add(expression)
        w.emit(f"fd.add_output({expression})")

    return w


def definition_key(region: BoundSymbol, input_descriptors: Sequence[Any] | None = None) -> str:
    """The text of ``region``'s definition with variables numbered instead of named: equal for two
    regions exactly when their definitions are the same up to the names of the proxies (the regions
    of identical layers), so they can share one compiled ``FusionDefinition`` (see :func:`build`)."""
    return "\n".join(_definition_body(region, input_descriptors, canonical=True).lines)


def _identifier(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"region_{cleaned}"


def _describe(p: Proxy) -> str:
    if isinstance(p, TensorProxy):
        return f"{_dtype_short(p.dtype)}{list(p.shape)}"
    return type(p).__name__


def _example_input(p: Proxy) -> str:
    if isinstance(p, TensorProxy):
        torch_dtype = dtypes.to_torch_dtype(p.dtype)
        shape = tuple(p.shape)
        if torch_dtype.is_floating_point:
            return f'torch.randn({shape}, dtype={torch_dtype}, device="cuda")'
        if torch_dtype == torch.bool:
            return f'torch.randint(0, 2, {shape}, device="cuda").bool()'
        return f'torch.randint(0, 8, {shape}, dtype={torch_dtype}, device="cuda")'
    if isinstance(p, NumberProxy):
        return repr(p.value)
    return repr(p)


# ---------------------------------------------------------------------------------------------- live


def _installed() -> bool:
    if "nvfuser_direct" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("nvfuser_direct") is not None
    except (ImportError, ValueError):
        return False


def available() -> bool:
    """True where ``nvfuser_direct`` can be imported and CUDA is available."""
    return torch.cuda.is_available() and _installed()


def version() -> str | None:
    """The installed nvFuser version, or None."""
    if not _installed():
        return None
    import nvfuser_direct

    return str(nvfuser_direct.version()) if hasattr(nvfuser_direct, "version") else "0.0.0"


def linear_supported() -> bool:
    """Whether the installed nvFuser takes linear/matmul inside fusions (see :data:`MIN_LINEAR_VERSION`)."""
    v = version()
    return v is not None and LooseVersion(v) >= LooseVersion(MIN_LINEAR_VERSION)


def build(region: BoundSymbol, input_descriptors: Sequence[Any] | None = None):
    """The live ``nvfuser_direct.FusionDefinition`` of ``region`` (requires nvFuser): the script of
    :func:`definition_source`, executed."""
    if not _installed():
        raise RematError("nvFuser (nvfuser_direct) is not installed; definition_source(region) works without it")
    source = definition_source(region, input_descriptors, example=False)
    namespace: dict[str, Any] = {"__name__": f"remat_region_{region.sym.name}"}
    exec(compile(source, f"<remat {region.sym.name}>", "exec"), namespace)
    return namespace["fd"]


#: FusionDefinitions by :func:`definition_key`, shared by every region of the process with the same
#: definition: nvFuser compiles kernels per FusionDefinition object (on its first execution for each
#: input shape), so the regions of identical layers would otherwise each compile the same kernels, and
#: compilation is most of a first call's time on the GPU.  Kept for the process's life, as nvFuser's
#: own kernel caches are; :func:`clear_shared_definitions` empties it.
_SHARED: dict[str, Any] = {}


def shared_build(region: BoundSymbol, input_descriptors: Sequence[Any] | None = None):
    """:func:`build`, but a region whose definition equals an earlier region's up to proxy names gets
    that region's ``FusionDefinition`` (and so its compiled kernels)."""
    key = definition_key(region, input_descriptors)
    fd = _SHARED.get(key)
    if fd is None:
        fd = _SHARED[key] = build(region, input_descriptors)
    return fd


def shared_definitions() -> int:
    """How many distinct FusionDefinitions the regions of this process share (see :func:`shared_build`)."""
    return len(_SHARED)


def clear_shared_definitions() -> None:
    """Forget the shared FusionDefinitions (their kernels are compiled again on next use)."""
    _SHARED.clear()


def tensor_descriptor(tensor) -> tuple[tuple[bool | None, ...], tuple[int, ...]]:
    """nvFuser (contiguity, stride_order) of a runtime tensor."""
    try:
        from nvfuser_direct import compute_tensor_descriptor

        contiguity, stride_order = compute_tensor_descriptor(tensor.shape, tensor.stride())
        return tuple(contiguity), tuple(stride_order)
    except ImportError:  # pragma: no cover - only without nvFuser
        return contiguous_descriptor(tensor)


class NvFuserRegionCallable:
    """Runs a region with nvFuser: one FusionDefinition per input layout, built on first use (or shared
    with an equal region's, :func:`shared_build`).  If
    nvFuser rejects the region, it runs with ``fallback`` (the torch reference) from then on, and one
    warning names the region; except a region drawing random numbers (``uniform_philox``), which raises
    :class:`remat.RematError`: torch's philox numbers are not nvFuser's."""

    def __init__(self, region: BoundSymbol, fallback: Callable):
        self.region = region
        self.fallback = fallback
        self.definitions: dict[tuple, Any] = {}
        self.failed: str | None = None
        # Positions of tensor arguments.  Shapes and dtypes are fixed by the trace (Thunder's prologue
        # checks them), so the strides alone tell layouts apart; this key is built on every call, and
        # the step's host time matters (nvFuser's own execute costs 50-100 us per call).
        self._tensor_positions = tuple(i for i, p in enumerate(region.args) if isinstance(p, TensorProxy))

    def _key(self, args: Sequence[Any]) -> tuple:
        return tuple(args[i].stride() for i in self._tensor_positions)

    def __call__(self, *args):
        if self.failed is not None:
            return self.fallback(*args)
        key = self._key(args)
        fd = self.definitions.get(key)
        try:
            if fd is None:
                descriptors = [tensor_descriptor(a) if hasattr(a, "stride") else None for a in args]
                fd = self.definitions[key] = shared_build(self.region, descriptors)
            return fd.execute(list(args))
        except Exception as exc:  # nvFuser refused the definition: this region runs in torch from now on
            if any(op_kind(sub) in STATELESS_RNG_KINDS for sub in self.region.subsymbols):
                # nvFuser's philox stream is not torch's (tests/test_gpu.py): a mask drawn by nvFuser in
                # one region and recomputed by torch in another would differ, so no silent fallback
                raise RematError(
                    f"nvFuser rejected region {self.region.sym.name}, which draws random numbers "
                    f"(uniform_philox); running it with torch would give other numbers than the regions nvFuser "
                    f"runs ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
                ) from exc
            self.failed = f"{type(exc).__name__}: {exc}"
            warn(
                f"nvFuser rejected region {self.region.sym.name}; it runs with the torch executor instead "
                f"({self.failed.splitlines()[0][:200]})",
                UserWarning,
            )
            return self.fallback(*args)
