"""A stand-in for ``nvfuser_direct`` that evaluates FusionDefinitions with eager PyTorch on the CPU.

It implements the part of nvFuser's Python API that remat's emitted scripts use, following nvFuser's
documented semantics (e.g. ``pad`` widths start at the last dimension, reductions drop the reduced
dimensions, ``var_mean`` returns ``(var, mean)``).  Tests install it as ``sys.modules["nvfuser_direct"]``
to check on a CPU that emitted definitions compute what the torch reference computes; the real nvFuser
is exercised on the GPU machine (benchmarks/gpu_check.py).
"""

from __future__ import annotations

import enum
import types

import torch


class DataType(enum.Enum):
    Double = torch.float64
    Float = torch.float32
    Half = torch.float16
    BFloat16 = torch.bfloat16
    Int = torch.int64
    Int32 = torch.int32
    Bool = torch.bool
    ComplexDouble = torch.complex128
    ComplexFloat = torch.complex64


class _Value:
    """A node of the definition: evaluated lazily against the inputs of one execution."""

    def __init__(self, fn, *parents):
        self.fn = fn
        self.parents = parents

    def __getitem__(self, index):
        return _Value(lambda pair: pair[index], self)


def _lift(x):
    return x if isinstance(x, _Value) else _Value(lambda: x)


def _op(fn):
    def make(*args, **kwargs):
        flat = [_lift(a) if isinstance(a, _Value) else a for a in args]
        values = [a for a in flat if isinstance(a, _Value)]
        kw_values = {k: v for k, v in kwargs.items() if isinstance(v, _Value)}

        def run(*evaluated):
            it = iter(evaluated[: len(values)])
            real_args = [next(it) if isinstance(a, _Value) else a for a in flat]
            kw_it = iter(evaluated[len(values) :])
            real_kwargs = {k: (next(kw_it) if k in kw_values else v) for k, v in kwargs.items()}
            return fn(*real_args, **real_kwargs)

        return _Value(run, *values, *kw_values.values())

    return make


def _t(x):
    """Scalars become 0-dim tensors (float64 for floats); like nvFuser scalars, 0-dim tensors do not
    change the dtype of the tensors they meet."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(x, dtype=torch.float64) if isinstance(x, float) else torch.as_tensor(x)


def _reduce(torch_fn):
    def run(a, dims):
        return torch_fn(a, dim=tuple(dims)) if dims else a

    return run


def _pad(a, widths, value):
    return torch.nn.functional.pad(a, list(widths), value=float(value) if not isinstance(value, bool) else value)


def _slice(a, start, end, strides):
    index = tuple(slice(s, e, st) for s, e, st in zip(start, end, strides))
    return a[index]


def _broadcast_in_dim(a, shape, bdims):
    view_shape = [1] * len(shape)
    for i, d in enumerate(bdims):
        view_shape[d] = a.shape[i]
    return a.reshape(view_shape).expand(shape)


def _var_mean(a, dims, correction):
    var, mean = torch.var_mean(a, dim=tuple(dims), correction=correction)
    return var, mean


def _uniform(low, high, shape, dtype, rng_seed=None, rng_offset=None):
    generator = torch.Generator().manual_seed(int(rng_seed) * 1000003 + int(rng_offset)) if rng_seed is not None else None
    return torch.rand(tuple(shape), generator=generator, dtype=dtype.value) * (high - low) + low


def _binary(fn):
    """Apply a torch binary function with nvFuser's rule for scalars: they take the tensor's dtype."""

    def run(a, b):
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            return fn(_t(a), _t(b))
        if not isinstance(a, torch.Tensor):
            a = torch.as_tensor(a, dtype=b.dtype) if (b.is_floating_point() or not isinstance(a, float)) else torch.as_tensor(a)
        if not isinstance(b, torch.Tensor):
            b = torch.as_tensor(b, dtype=a.dtype) if (a.is_floating_point() or not isinstance(b, float)) else torch.as_tensor(b)
        return fn(a, b)

    return run


def _make_ops():
    ops = types.SimpleNamespace()
    unary = """abs acos acosh asin asinh atan atanh bitwise_not ceil cos cosh erf erfc erfinv exp exp2 expm1 floor
    isfinite lgamma log log10 log1p log2 neg real imag reciprocal round rsqrt sign signbit sin sinh sqrt tan tanh
    trunc""".split()
    for name in unary:
        setattr(ops, name, _op(lambda a, fn=getattr(torch, name): fn(_t(a))))
    ops.erfcinv = _op(lambda a: torch.erfinv(1 - a))
    ops.set = _op(lambda a: a.clone())
    for name in """add sub mul atan2 bitwise_and bitwise_or bitwise_xor eq ne ge gt le lt fmod pow remainder
    maximum minimum nextafter bitwise_left_shift bitwise_right_shift""".split():
        setattr(ops, name, _op(_binary(getattr(torch, name))))
    ops.div = _op(_binary(lambda a, b: torch.div(a, b, rounding_mode="trunc") if not (a.is_floating_point() or b.is_floating_point()) else a / b))
    ops.lerp = _op(lambda a, b, w: torch.lerp(a, b, w))
    ops.where = _op(lambda p, a, b: torch.where(_t(p), _t(a), _t(b)))
    ops.cast = _op(lambda a, dtype: _t(a).to(dtype.value))
    ops.max = _op(_reduce(torch.amax))
    ops.min = _op(_reduce(torch.amin))
    ops.sum = _op(_reduce(torch.sum))
    ops.prod = _op(lambda a, dims: torch.prod(a, dim=dims[0]) if len(dims) == 1 else a.flatten(min(dims), max(dims)).prod(min(dims)))
    ops.var = _op(lambda a, dims, correction: torch.var(a, dim=tuple(dims), correction=correction))
    ops.var_mean = _op(_var_mean)
    ops.broadcast_in_dim = _op(_broadcast_in_dim)
    ops.reshape = _op(lambda a, shape: a.reshape(shape))
    ops.permute = _op(lambda a, dims: a.permute(dims))
    ops.squeeze = _op(lambda a, dims: a.squeeze(tuple(dims)) if dims else a)
    ops.slice = _op(_slice)
    ops.cat = lambda tensors, dim: _Value(lambda *ts: torch.cat(ts, dim), *tensors)
    ops.pad = _op(_pad)
    ops.stride_order = _op(lambda a, order: a.contiguous())
    ops.full = _op(lambda shape, value, dtype: torch.full(tuple(shape), value, dtype=dtype.value))
    ops.iota = _op(lambda length, start, step, dtype: torch.arange(start, start + length * step, step, dtype=dtype.value)[:length])
    ops.uniform = _op(_uniform)
    ops.index_select = _op(lambda a, index, dim: torch.index_select(a, dim, index))
    ops.take_along_axis = _op(lambda a, index, dim: torch.take_along_dim(a, index, dim))
    ops.linear = _op(lambda a, w, b=None: torch.nn.functional.linear(a, w, b))
    ops.matmul = _op(torch.matmul)
    return ops


class FusionDefinition:
    def __init__(self):
        self.ops = _make_ops()
        self.inputs: list[_Value] = []
        self.outputs: list[_Value] = []
        self.executions = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def define_tensor(self, shape, contiguity, dtype, is_cpu=False, stride_order=None):
        position = len(self.inputs)
        value = _Value(lambda: self._current[position])
        value.declared = (tuple(shape), tuple(contiguity), dtype, tuple(stride_order or ()))
        self.inputs.append(value)
        return value

    def define_scalar(self, value=None, dtype=None):
        if isinstance(value, DataType):  # fd.define_scalar(dtype): a symbolic input
            value, dtype = None, value
        if value is None:  # a symbolic input
            position = len(self.inputs)
            node = _Value(lambda: self._current[position])
            self.inputs.append(node)
            return node
        return _Value(lambda: value)

    def add_output(self, value):
        self.outputs.append(value)

    def execute(self, inputs):
        self.executions += 1
        self._current = list(inputs)
        cache: dict[int, object] = {}

        def evaluate(v):
            if id(v) not in cache:
                cache[id(v)] = v.fn(*[evaluate(p) for p in v.parents])
            return cache[id(v)]

        results = [evaluate(o) for o in self.outputs]
        for r in results:
            if not isinstance(r, torch.Tensor):
                raise TypeError("fake nvFuser: an output is not a tensor")
        return [r.contiguous() for r in results]


def compute_tensor_descriptor(sizes, strides):
    contiguity = []
    order = sorted(range(len(sizes)), key=lambda i: -strides[i])
    stride_order = [0] * len(sizes)
    for rank, dim in enumerate(reversed(order)):
        stride_order[dim] = rank
    for i, (size, stride) in enumerate(zip(sizes, strides)):
        contiguity.append(None if size == 1 or stride == 0 else True)
    return contiguity, stride_order


def version():
    return "0.2.36-fake"


def install(monkeypatch) -> types.ModuleType:
    """Make ``import nvfuser_direct`` return this fake for the test's duration, with remat's shared
    definitions (built by another test's nvFuser, real or fake) set aside for that time."""
    import sys

    from remat.thunder import nvfuser as emit

    monkeypatch.setattr(emit, "_SHARED", {})

    module = types.ModuleType("nvfuser_direct")
    module.DataType = DataType
    module.FusionDefinition = FusionDefinition
    module.compute_tensor_descriptor = compute_tensor_descriptor
    module.version = version
    monkeypatch.setitem(sys.modules, "nvfuser_direct", module)
    return module
