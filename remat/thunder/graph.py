"""Stage 7, *emit*, for a whole trace: remat's planned forward and backward each compiled by TorchInductor as
one graph (``runtime="inductor-graph"``).

Why: measured on H100s and an H200 (docs/benchmarks.md, "GPU diagnostics"), remat's kernels take about as
long on the GPU as torch.compile's, but a step calls 30-40 regions plus the matmuls and views between them
from Python, and each region call costs about 100 us of host time: the GPU waits on the host.  torch.compile
calls one generated function per forward and one per backward.  Here remat plans as always (which tensors
the forward saves, what the backward recomputes, in which order: the cut is remat's), and then the body of
each of Thunder's two execution traces (regions, matmuls, attention, views) is traced once with ``make_fx``
and handed to Inductor (``compile_fx_inner``) as one graph.  The trace keeps its unpacking and its return;
its body becomes one bound symbol.

Memory: Inductor frees each buffer after its last use, as Thunder's ``del`` statements do, and it frees the
graph's inputs too when the caller hands them over (its boxed calling convention).  So the backward's
saved tensors are not unpacked into local variables (which would keep each of them alive to the end of the
backward): the body takes the saved-tensor collection itself and empties it.  Inductor orders kernels by
its own scheduler, not by remat's schedule, and fuses across remat's regions, so the measured peak can
differ from remat's estimate: the GPU benchmarks report both.

What is left as it is (the trace runs with its regions, as ``runtime="inductor"``): a trace whose body
draws random numbers (Inductor's generator is not eager PyTorch's, and a dropout mask recomputed in the
backward must equal the forward's), writes into a tensor in place, or reads a value that is not a tensor
or a collection of saved tensors.  If tracing or compiling fails on the first call, the body runs as
Thunder made it from then on, with one warning.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from thunder.core import prims
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace
from thunder.core.transform_common import Transform
from torch.utils._pytree import tree_flatten, tree_unflatten

from remat._logging import logger
from remat.core.memory import headroom
from remat.core.ops import EMBEDDING_GRADIENT_KINDS, IN_PLACE_KINDS, RNG_KINDS, STATELESS_RNG_KINDS, MATMUL_KINDS
from remat.core.strides import token_major_strides
from remat.errors import warn
from remat.thunder.attention import attention_operands
from remat.thunder.read import op_kind
from remat.thunder.runtimes import TorchRegionCallable, region_trace

__all__ = [
    "InductorGraphTransform", "GraphCallable", "compile_trace_body", "token_major_strides", "INDUCTOR_OPTIONS", "EMBEDDING_SCRATCH_LIMIT",
    "embedding_scratch_room",
]

#: Bound symbols that frame a trace's body rather than compute: they stay outside the graph.
_FRAME = frozenset(
    {
        prims.PrimIDs.UNPACK_TRIVIAL,
        prims.PrimIDs.UNPACK_SEQUENCE,
        prims.PrimIDs.UNPACK_KEY,
        prims.PrimIDs.UNPACK_EMPTY_DICT,
        prims.PrimIDs.RETURN,
    }
)
#: Inductor settings while a graph compiles.  remat's trace order is already planned for memory:
#: Inductor's own peak-memory reordering raised the measured backward peak of stablecode-3b x2 from 697
#: to 773 MiB (H100, estimate 574 MiB; benchmarks/gpu_graph_memory.py).  Inductor's buffer reuse keeps a
#: dead buffer allocated until a later buffer of its size takes it over (its ``del`` is deferred), which
#: remat's estimate does not model and PyTorch's caching allocator does anyway on the GPU: on the CPU
#: (stablecode-3b x2, seq 2048) the backward's peak was 405 MiB with it, 365 without (estimate 363).
#: Size asserts cost host time.  Every cat is one pointwise kernel: with partial rotary embeddings (q and k
#: are a cat of their RoPE'd part and the rest) Inductor 2.11 otherwise writes a contiguous concat buffer,
#: which the token-major layout of attention's inputs (``token_major_attention``) then copies again (H100,
#: stablecode-3b x2: 116 against 65 us a layer for q, k and v).
INDUCTOR_OPTIONS: dict[str, Any] = {
    "size_asserts": False,
    "reorder_for_peak_memory": False,
    "allow_buffer_reuse": False,
    "force_pointwise_cat": True,
}
_UNGRAPHABLE_KINDS = RNG_KINDS | STATELESS_RNG_KINDS | IN_PLACE_KINDS

#: The most bytes of fp32 scratch Inductor's embedding gradient may take (see :func:`_decompositions`) where
#: no plan says how much room there is (``embedding_scratch_limit="auto"`` without a plan, or a graph
#: compiled outside ``remat.jit``): a LitGPT block's table (vocab 512) needs 5 MiB and keeps Inductor's
#: faster kernel; a real vocabulary (stablecode-3b: 49152 x 2560, 480 MiB) calls PyTorch's op instead.
EMBEDDING_SCRATCH_LIMIT = 16 * 2**20


@torch.library.custom_op("remat::embedding_backward", mutates_args=())
def _embedding_backward(
    grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int, scale_grad_by_freq: bool
) -> torch.Tensor:
    """PyTorch's embedding gradient, as an op Inductor does not decompose (:func:`_decompositions`)."""
    return torch.ops.aten.embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)


@_embedding_backward.register_fake
def _(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int, scale_grad_by_freq: bool):
    return grad_output.new_empty((num_weights, *grad_output.shape[indices.ndim :]))


def _decompositions(embedding_scratch_limit: int) -> dict:
    """Inductor's decomposition table for ``make_fx``, except for large embedding gradients.

    Inductor decomposes ``embedding_dense_backward`` of a bf16/fp16 gradient into an fp32 table of zeros
    (vocabulary x width, 4 bytes an element), an index_put that accumulates into it, and a cast: besides
    the gradient remat's memory model counts, a scratch table twice its size is alive at once (measured on
    the CPU: +480 MiB over the estimate for stablecode-3b's 49152 x 2560 table).  Where that scratch is
    above ``embedding_scratch_limit`` bytes, the op is left whole and Inductor calls PyTorch's kernel, which
    remat's other runtimes run too (its scratch grows with the number of tokens, not the vocabulary).  The
    op is left whole as :func:`_embedding_backward`, a custom op: Inductor calls custom ops as they are,
    while for ``aten.embedding_dense_backward`` itself it insists on its decomposition."""
    from torch._inductor.decomposition import select_decomp_table

    table = dict(select_decomp_table())
    op = torch.ops.aten.embedding_dense_backward.default
    decomposed = table.get(op)
    if decomposed is None:  # pragma: no cover - a torch without the decomposition: nothing to limit
        return table

    def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
        width = math.prod(grad_output.shape[indices.ndim :])
        low_precision = grad_output.dtype in (torch.bfloat16, torch.float16)
        if low_precision and num_weights * width * 4 > embedding_scratch_limit:
            return _embedding_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
        return decomposed(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)

    table[op] = embedding_dense_backward
    return table


def embedding_scratch_room(result: Any) -> int | None:
    """The most bytes of scratch the embedding gradient can take without raising the estimated peak of
    ``result`` (a :class:`remat.Result`, the plan of the trace being compiled): the headroom under its
    peak while the embedding gradient runs (:func:`remat.core.memory.headroom`); None without a plan or
    without an embedding gradient.  Why it matters: Inductor's decomposition of the gradient (an fp32
    table, an accumulating scatter, a cast) took 0.4 ms where PyTorch's sort-based kernel took 1.9 ms
    (Llama-2-7b x2, vocab 32000, batch 4, seq 8192; H100 profile, docs/benchmarks.md), and at the end of
    the backward, where the gradient runs, the step's live bytes are usually far below its peak."""
    if result is None:
        return None
    return headroom(result.after, result.after_graph, EMBEDDING_GRADIENT_KINDS)


def _is_frame(bsym: BoundSymbol) -> bool:
    return bsym.sym.id in _FRAME or bsym.sym.id == "clear_mutable_collection" or bsym.sym.name == "clear_mutable_collection"


def _is_del(bsym: BoundSymbol) -> bool:
    return bsym.sym.id == prims.PrimIDs.DEL


def _why_not_graphable(bsym: BoundSymbol) -> str | None:
    """Why this body symbol keeps the trace out of one graph, or None."""
    stack = [bsym]
    while stack:
        current = stack.pop()
        kind = op_kind(current)
        if kind in _UNGRAPHABLE_KINDS:
            return f"{bsym.sym.name} {'draws random numbers' if kind not in IN_PLACE_KINDS else 'writes in place'} ({kind})"
        stack.extend(current.subsymbols)
    return None


def lays_out_token_major(token_major_attention: bool, materialize_region_outputs: bool) -> bool:
    """Whether the graph lays attention's operands (and so its output) out token by token: only region
    outputs that are buffers of their own get a layout (:func:`_laid_out`).  :func:`compile_trace_body`
    applies it; the planner asks it before counting on that layout (``remat.compile``)."""
    return token_major_attention and materialize_region_outputs


def runs_as_graphs(trace: TraceCtx) -> bool:
    """Whether nothing in ``trace`` (a joint trace, as remat plans it) keeps Thunder's forward or backward
    out of one graph (:func:`_why_not_graphable`): what the planner needs to know before it counts on the
    graph's layout (``remat.optimize(..., token_major_attention=True)``).  An Inductor failure at the first
    call still sends a trace region by region; the warning then says so."""
    return all(_why_not_graphable(bsym) is None for bsym in trace.bound_symbols)


#: The key under ``node.meta["custom"]`` of the FX nodes a region's call made: the region's number.
REGION_KEY = "remat_region"

try:  # torch >= 2.9: tags the FX nodes made under it (kept by make_fx under preserve_node_meta)
    from torch.fx.traceback import annotate as _annotate
except ImportError:  # pragma: no cover - older torch: no barrier (Inductor may fuse across regions)
    _annotate = None


def _materialized(tensor: torch.Tensor, stride: Sequence[int] | None = None) -> torch.Tensor:
    """``tensor``, which Inductor must store as a buffer of its own (with ``stride``, default its own
    strides) rather than inline into each reader.  In eager mode the same tensor when the strides already
    match, else a copy with those strides."""
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims.inductor_force_stride_order)

    return torch.ops.prims.inductor_force_stride_order(tensor, tuple(tensor.stride()) if stride is None else tuple(stride))


def _dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s elements fill its storage span once each (a permutation of a contiguous
    layout), unlike a view expanded over a dimension (stride 0)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(tensor.stride(), tensor.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _laid_out(value: Any, name: str | None, token_major: frozenset[str]) -> Any:
    """A region's output as a buffer of its own (:func:`_materialized`), token-major if ``name`` is in
    ``token_major`` and the tensor is 4-D; a view that is not dense stays as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    if not _dense(value):
        # A view expanded over a dimension (keys and values of multi-query attention expanded over the
        # query heads): a buffer with its strides cannot exist, and a dense copy is bytes the memory
        # model does not count.  It stays the view it is.
        return value
    if name in token_major and value.ndim == 4:
        return _materialized(value, token_major_strides(value.shape))
    return _materialized(value)


def _attention_inputs(bsyms: Sequence[BoundSymbol]) -> set[str]:
    """Names of the 4-D query, key and value tensors that remat's attention operators (cuDNN's on a GPU,
    PyTorch's CPU flash attention elsewhere) read, forward and backward, in ``bsyms``."""
    return {p.name for bsym in bsyms for p in attention_operands(bsym)[1] if isinstance(p, TensorProxy) and p.ndim == 4}


def _traceable(
    bsym: BoundSymbol,
    materialize_outputs: bool,
    region: int | None = None,
    token_major: frozenset[str] = frozenset(),
    donated: Mapping[str, int] | None = None,
) -> BoundSymbol:
    """``bsym`` as ``make_fx`` can trace it: a remat region runs its prims with the torch reference (its
    own callable may be compiled code that fake tensors cannot enter); other symbols are plain torch calls.

    ``region``: a number tagging the FX nodes the region's call makes (``node.meta["custom"]``, see
    :data:`REGION_KEY`), so that Inductor can be kept from fusing independent regions together.

    ``materialize_outputs``: each region output becomes a buffer in Inductor's graph, as remat's memory
    model counts it.  Without that, Inductor inlines a region's pointwise output into every reader: one
    that two readers need in different layouts (a matmul and a transposed matmul, as in a linear layer's
    backward) is then computed and stored twice, and both copies live at once (measured: +340 MiB on
    stablecode-3b x2's backward, H100; docs/benchmarks.md).

    ``token_major``: names of region outputs to lay out with :func:`token_major_strides` (attention's
    inputs; needs ``materialize_outputs``).  ``donated``: region outputs written into the storage of an
    input dying here, output name -> the input's position among the region's arguments
    (:mod:`remat.core.donation`; needs ``materialize_outputs``): ``input.copy_(output)``, which Inductor
    computes straight into the input's buffer."""
    if not bsym.sym.is_fusion:
        return bsym
    reference = TorchRegionCallable(bsym.sym.name, bsym.subsymbols, bsym.args, bsym.output).build()
    if materialize_outputs:
        run_region = reference
        output_names = [getattr(p, "name", None) for p in tree_flatten(bsym.output)[0]]
        donated = dict(donated or {})

        def written(value: Any, name: str | None, args: tuple) -> Any:
            position = donated.get(name)
            if position is None or not isinstance(value, torch.Tensor):
                return _laid_out(value, name, token_major)
            storage = args[position]  # same dtype and bytes, both contiguous (the donation rule)
            return torch.ops.aten.copy_.default(storage, value.reshape(storage.shape)).view(value.shape)

        def reference(*args: Any) -> Any:
            values, spec = tree_flatten(run_region(*args))  # as the symbol's output: one name per value
            return tree_unflatten([written(value, name, args) for value, name in zip(values, output_names)], spec)

    if region is not None and _annotate is not None:
        untagged = reference

        def reference(*args: Any) -> Any:
            with _annotate({REGION_KEY: region}):
                return untagged(*args)

    return bsym.from_bsym(_call_ctx={bsym.sym.name: reference})


def _regions_of(node: Any) -> set[int]:
    """The remat regions whose FX nodes an Inductor scheduler node (fused or not) computes: their tags
    (>= 0); for a node that computes no region's op, the tags of the runs of ops between regions (< 0).

    Why the runs count only then: Inductor inlines a view (a reshape between regions) into every node
    that reads it, so the view's run shows up among the origins of nodes of several regions.  Counted,
    it made two regions reading the same recomputed matmul output look alike, and Inductor fused them
    (Llama-2-7b's SwiGLU recomputation with its gradient under a budget, on an H100: six 688 MiB
    buffers alive where the plan has five)."""
    found: set[int] = set()
    for part in node.get_nodes():
        if getattr(part, "node", None) is None:
            continue
        for origin in part.node.get_origins():
            tag = (origin.meta.get("custom") or {}).get(REGION_KEY)
            if tag is not None:
                found.add(tag)
    regions = {tag for tag in found if tag >= 0}
    return regions or found


def _tag_stand_alone_ops(graph: torch.fx.GraphModule) -> None:
    """Tags each run of FX nodes that no region made (the ops remat runs between regions: matmuls,
    attention, the embedding's gradient) with a number of its own, negative to stay apart from the
    regions'.  Untagged, such a node could still be fused with any region (the embedding's gradient, at
    the end of the backward, with the first layer's layer-norm backward: seen on the CPU)."""
    run, in_region = 0, True
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        custom = node.meta.get("custom") or {}
        if REGION_KEY in custom:
            in_region = True
            continue
        if in_region:
            run -= 1
            in_region = False
        node.meta["custom"] = {**custom, REGION_KEY: run}


def _separate_regions_choices() -> Any | None:
    """An Inductor heuristics object (``InductorChoices``, of the class in use) that refuses to fuse two
    scheduler nodes from different remat regions into one kernel, or None where this torch has no such
    hook.

    Why: remat's estimate assumes each region runs as a unit at its place in the trace.  Inductor fuses
    across them in two ways, and both move a region's outputs away from that place:

    * "horizontal": nodes that do not depend on each other but read the same buffer, in one loop, which
      computes a later region's outputs early.  Measured on an H100: a recomputed GELU fused with the MLP's
      input gradient, SwiGLU's three outputs fused together, above remat's estimate;
    * "vertical": a region's nodes fused into the kernel of a later region that reads them, which computes
      the earlier region's outputs late.  Measured on the CPU (stablecode-3b x2, seq 2048): the first
      layer's layer-norm backward, whose region also recomputes the layer norm's output for the MLP's
      weight gradient, was fused into the next layer-norm backward after the attention backward, so the
      weight gradient's matmul waited there and the 40 MiB MLP gradient it reads stayed alive across the
      attention backward (docs/benchmarks.md, "The graph runtime's peak on the CPU").

    Fusion inside a region stays allowed; ops outside every region are tagged by runs
    (:func:`_tag_stand_alone_ops`) and kept apart the same way."""
    try:
        from torch._inductor.choices import InductorChoices
        from torch._inductor.virtualized import V
    except ImportError:  # pragma: no cover
        return None
    if _annotate is None:  # pragma: no cover - regions are not tagged: nothing to tell apart
        return None
    base = type(V.choices)
    if not issubclass(base, InductorChoices) or not hasattr(base, "can_fuse"):
        return None

    class SeparateRegions(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def can_fuse(scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
            first, second = _regions_of(node1), _regions_of(node2)
            if first and second and not first & second:
                return False
            return base.can_fuse(scheduler, node1, node2, shared_data_score)

    return SeparateRegions()


class GraphCallable:
    """Runs a trace body as one Inductor graph, built on the first call.

    Arguments: ``drained`` collections first (lists of tensors, emptied on each call so that Inductor may
    free each tensor after its last use), then tensors.  ``traced`` is the body as plain torch calls (for
    ``make_fx``), ``fallback`` the body as Thunder made it (regions with their own runtime).  ``path`` is
    ``"inductor"``, ``"fallback"`` or ``None`` before the first call."""

    def __init__(
        self,
        name: str,
        drained: int,
        traced: Callable,
        fallback: Callable,
        inductor_options: dict[str, Any] | None = None,
        separate_regions: bool = True,
        embedding_scratch_limit: int = EMBEDDING_SCRATCH_LIMIT,
        laid_out_attention: bool = False,
    ):
        self.name = name
        # attention's operands laid out token-major in the graph: a plan made for it (``token_major_attention``)
        # counts the reshape of attention's output as a view, which region by region is a copy
        self.laid_out_attention = laid_out_attention
        self.embedding_scratch_limit = embedding_scratch_limit
        self.inductor_options = dict(inductor_options or {})  # over INDUCTOR_OPTIONS
        self.separate_regions = separate_regions  # no horizontal fusion across regions (_separate_regions_choices)
        self.drained = drained
        self.traced = traced
        self.fallback = fallback
        self.failed: str | None = None
        self.donated: tuple[str, ...] = ()  # region outputs written over a dying input (compile_trace_body)
        self.undonated: tuple[str, ...] = ()  # planned so, but not carried out (the estimate is low by them)
        # planned so over a matmul's output made in the graph: no copy_, Inductor's own in-place reuse writes it
        self.left_to_inductor: tuple[str, ...] = ()
        self.path: str | None = None
        self._compiled: dict[tuple, Callable] = {}  # input strides -> compiled graph

    def _flat(self, args: tuple) -> list:
        flat: list = []
        for collection in args[: self.drained]:
            flat.extend(collection)
            collection.clear()  # the graph owns these tensors now
        flat.extend(args[self.drained :])
        return flat

    def _build(self, flat: list) -> Callable:
        from torch._inductor.compile_fx import compile_fx_inner
        from torch.fx.experimental.proxy_tensor import make_fx

        import torch._inductor.config as inductor_config

        from torch.fx.traceback import preserve_node_meta
        from torch._inductor.virtualized import V

        with torch.no_grad():
            with preserve_node_meta():  # keeps the region tags of _traceable on the FX nodes
                decompositions = _decompositions(self.embedding_scratch_limit)
                graph = make_fx(self.traced, decomposition_table=decompositions, tracing_mode="fake")(*flat)
            choices = _separate_regions_choices() if self.separate_regions else None
            options = {**INDUCTOR_OPTIONS, **self.inductor_options}
            if choices is not None:
                _tag_stand_alone_ops(graph)
                options["fx_graph_cache"] = False  # the FX-graph cache's key does not see the heuristics object
            with inductor_config.patch(options), (
                V.set_choices_handler(choices) if choices is not None else contextlib.nullcontext()
            ):
                return compile_fx_inner(graph, list(flat))

    def __call__(self, *args):
        flat = self._flat(args)
        del args
        if self.failed is None:
            key = tuple(a.stride() if isinstance(a, torch.Tensor) else None for a in flat)
            compiled = self._compiled.get(key)
            try:
                if compiled is None:
                    compiled = self._compiled[key] = self._build(flat)
                self.path = "inductor"
                with torch.no_grad():
                    return compiled(flat)  # boxed: Inductor empties ``flat`` and frees inputs after last use
            except Exception as exc:
                self.failed = f"{type(exc).__name__}: {exc}"
                estimate = (
                    "; remat's estimated peak was made for the graph's layout, where the reshape of each attention "
                    "output for the output projection is a view: region by region it is a copy, so the measured "
                    "peak can be above the estimate by up to one such output per layer"
                    if self.laid_out_attention
                    else ""
                )
                if self.donated:
                    estimate += (
                        f"; the estimate counted {len(self.donated)} region outputs written over inputs dying there "
                        "(remat.core.donation), which region by region get buffers of their own: the measured peak "
                        "can be above it by those"
                    )
                warn(
                    f"Inductor could not compile {self.name} as one graph; it runs region by region instead "
                    f"({self.failed.splitlines()[0][:200]}){estimate}",
                    UserWarning,
                )
        self.path = "fallback"
        return self.fallback(*flat)

    def __repr__(self) -> str:
        return f"GraphCallable({self.name}, path={self.path})"


def compile_trace_body(
    trace: TraceCtx,
    name: str,
    materialize_region_outputs: bool = True,
    inductor_options: dict[str, Any] | None = None,
    separate_regions: bool = True,
    embedding_scratch_limit: int = EMBEDDING_SCRATCH_LIMIT,
    token_major_attention: bool = True,
    donations: Mapping[tuple[str, str], int] | None = None,
) -> tuple[TraceCtx, str | None]:
    """``trace`` with its body (everything but unpacking, collection clearing and the return) replaced by
    one bound symbol running a :class:`GraphCallable`, and None; or ``trace`` itself and the reason it was
    left as it is.  ``materialize_region_outputs``: see :func:`_traceable`; ``inductor_options``: Inductor
    settings over :data:`INDUCTOR_OPTIONS`; ``separate_regions``: no fusion across regions
    (:func:`_separate_regions_choices`); ``embedding_scratch_limit``: see :func:`_decompositions`;
    ``token_major_attention``: region outputs that attention reads as query, key or value are laid out
    token-major (:func:`token_major_strides`).  ``donations``: region outputs to write into the storage
    of an input dying at their region, (region name, output name) -> that input's position among the
    region's distinct inputs (the plan's, :mod:`remat.core.donation`); one
    whose input the graph does not own (a tensor it is handed and does not drain) or reads again is
    written into a buffer of its own instead (:func:`_donated_positions`)."""
    bsyms = list(trace.bound_symbols)
    body_positions = [i for i, b in enumerate(bsyms) if not _is_frame(b) and not _is_del(b)]
    if not body_positions:
        return trace, "nothing to compile"
    first, last = body_positions[0], body_positions[-1]
    if any(_is_frame(b) for b in bsyms[first:last]):
        return trace, "the body is interleaved with unpacking"
    body = [b for b in bsyms[first : last + 1] if not _is_del(b)]
    for bsym in body:
        reason = _why_not_graphable(bsym)
        if reason is not None:
            return trace, reason

    defined = {p.name for b in body for p in b.flat_proxy_outs}
    read: dict[str, Proxy] = {}
    for bsym in body:
        for proxy in bsym.flat_proxy_args:
            if proxy.name not in defined and proxy.name not in read:
                read[proxy.name] = proxy
    after = bsyms[last + 1 :]
    needed_after = {p.name for b in after if not _is_del(b) for p in b.flat_proxy_args}
    outputs: list[Proxy] = []
    for bsym in body:
        for proxy in bsym.flat_proxy_outs:
            if proxy.name in needed_after and proxy.name not in {o.name for o in outputs}:
                outputs.append(proxy)
    if any(not isinstance(p, TensorProxy) for p in (*read.values(), *outputs)):
        return trace, "the body reads or returns values that are not tensors"

    # Saved tensors unpacked from a collection just before the body: the body takes the collection instead
    # (and empties it), so that each saved tensor can die at its last use inside the graph.
    head = bsyms[:first]
    drained_unpacks = [
        b
        for b in head
        if b.sym.id == prims.PrimIDs.UNPACK_SEQUENCE
        and b.flat_proxy_outs
        and all(isinstance(o, TensorProxy) for o in b.flat_proxy_outs)
        and len(b.flat_proxy_outs) == len(b.output)
        and all(o.name in read for o in b.flat_proxy_outs)
    ]
    drained_names = {o.name for b in drained_unpacks for o in b.flat_proxy_outs}
    collections = [b.args[0] for b in drained_unpacks]
    collection_names = {c.name for c in collections}
    tensor_inputs = [p for n, p in read.items() if n not in drained_names]
    flat_inputs = [o for b in drained_unpacks for o in b.flat_proxy_outs] + tensor_inputs

    with_dels = bsyms[first : last + 1]  # Thunder's ``del`` statements free intermediates in the fallback
    token_major = frozenset(_attention_inputs(with_dels)) if lays_out_token_major(token_major_attention, materialize_region_outputs) else frozenset()
    skipped: list[str] = []
    left_to_inductor: list[str] = []
    donated = (
        _donated_positions(with_dels, donations or {}, drained_names, defined, needed_after, skipped, left_to_inductor)
        if materialize_region_outputs
        else {}
    )
    traceable = [
        _traceable(b, materialize_region_outputs, region, token_major, donated.get(region)) for region, b in enumerate(with_dels)
    ]
    traced = region_trace(traceable, flat_inputs, outputs).python_callable(include_decorators=False)
    fallback = region_trace(with_dels, flat_inputs, outputs).python_callable(include_decorators=False)
    callable_ = GraphCallable(
        name, len(collections), traced, fallback, inductor_options, separate_regions, embedding_scratch_limit,
        laid_out_attention=bool(token_major),
    )
    callable_.donated = tuple(name for positions in donated.values() for name in positions)
    callable_.undonated = tuple(skipped)
    callable_.left_to_inductor = tuple(left_to_inductor)
    sym = Symbol(name, meta=None, is_fusion=True, executor=None)
    graph_bsym = BoundSymbol(sym, (*collections, *tensor_inputs), {}, tuple(outputs), tuple(body), _call_ctx={name: callable_})

    new_head = [
        b
        for b in head
        if b not in drained_unpacks
        # the body empties the drained collections itself; their names stay defined for it
        and not (
            (b.sym.name == "clear_mutable_collection" or _is_del(b))
            and any(getattr(a, "name", None) in collection_names for a in b.flat_args)
        )
    ]
    new_trace = from_trace(trace)
    new_trace.bound_symbols = [*new_head, graph_bsym, *[b for b in after if not _is_del(b)]]  # the graph frees its own
    new_trace.set_provenance(TraceProvenance(f"remat: body compiled as one Inductor graph ({len(body)} symbols)"))
    return new_trace, None


def _donated_positions(
    bsyms: Sequence[BoundSymbol],
    donations: Mapping[tuple[str, str], int],
    drained: set[str],
    defined: set[str],
    needed_after: set[str],
    skipped: list[str] | None = None,
    left_to_inductor: list[str] | None = None,
) -> dict[int, dict[str, int]]:
    """The donations the graph carries out, by position of the region in ``bsyms``: output name -> the
    position of its donor among the region's arguments.  ``donations``: (region name, output name) -> the
    donor's position among the region's distinct inputs; those not carried out are appended to
    ``skipped``.  A donor must be a tensor the graph owns (made in the
    body or drained from a saved-tensor collection: ``drained``/``defined``) that no later symbol of the
    body reads and nothing after the body needs, with the output's dtype and size; the plan's rule
    (:func:`remat.core.donation.find_donations`) already holds that on the joint trace: this is the
    runtime's own check that the execution trace agrees.

    A donor a matmul computes in the body (the logits a budget plan recomputes in the backward) is left to
    Inductor: ``copy_`` into the output of such an extern kernel made Inductor allocate the region's output
    and copy it, while its own in-place reuse (``inplace_buffers``) writes the elementwise output
    over that dying buffer by itself (CPU, Llama-2-7b x2 at demo width, bf16, vocab 32000, a budget plan
    recomputing the logits: 1006.3 MiB measured with ``copy_``, 517.6 without, estimate 516.1).  Every
    other donor is written with ``copy_``: there it is the other way round (the default plan there, whose
    donors are drained saved tensors and reshapes: 567.7 MiB with ``copy_``, 1056.4 without, estimate
    566.2).  Outputs left to Inductor are appended to ``left_to_inductor``: counted as donated by the
    estimate, carried out as Inductor decides (approximate: measured on the CPU only)."""
    if not donations:
        return {}
    last_read: dict[str, int] = {}
    for position, bsym in enumerate(bsyms):
        if not _is_del(bsym):
            for proxy in bsym.flat_proxy_args:
                last_read[proxy.name] = position
    # donors a matmul makes in the body (an extern kernel's output: measured so; other ops are not)
    made_by_extern = {o.name for b in bsyms if op_kind(b) in MATMUL_KINDS for o in b.flat_proxy_outs}
    result: dict[int, dict[str, int]] = {}
    for position, bsym in enumerate(bsyms):
        if not bsym.sym.is_fusion:
            continue
        inputs = list(dict.fromkeys(p.name for p in bsym.flat_proxy_args))  # as the reader lists a unit's inputs
        arguments = [a.name if isinstance(a, TensorProxy) else None for a in bsym.args]
        for proxy in tree_flatten(bsym.output)[0]:
            index = donations.get((bsym.sym.name, getattr(proxy, "name", None)))
            if index is None or not isinstance(proxy, TensorProxy):
                continue
            donor = inputs[index] if index < len(inputs) else None
            argument = arguments.index(donor) if donor in arguments else None
            owned = donor in drained or donor in defined
            if (
                argument is not None
                and owned
                and last_read.get(donor) == position
                and donor not in needed_after
                and bsym.args[argument].dtype == proxy.dtype
                and bsym.args[argument].numel == proxy.numel
            ):
                if donor not in made_by_extern:
                    result.setdefault(position, {})[proxy.name] = argument
                elif left_to_inductor is not None:
                    left_to_inductor.append(proxy.name)
            else:
                logger.info("remat inductor-graph: %s is not written over %s (the graph does not own it here)", proxy.name, donor)
                if skipped is not None:
                    skipped.append(proxy.name)
    return result


class InductorGraphTransform(Transform):
    """A Thunder transform compiling the forward and backward execution traces' bodies as one Inductor
    graph each (:func:`compile_trace_body`), after Thunder's and remat's passes.

    ``materialize_region_outputs`` (default True): every region output is a buffer of its own in the graph,
    as remat's memory model assumes; False lets Inductor inline region outputs into their readers (more
    fusion, and a peak that can exceed remat's estimate).  ``inductor_options``: ``torch._inductor.config``
    settings while the graphs compile, over :data:`INDUCTOR_OPTIONS`.  ``separate_regions`` (default True):
    Inductor does not fuse nodes of two regions (or of a region and the ops between regions) into one
    kernel, which would compute a region's outputs earlier or later than remat's plan has them
    (:func:`_separate_regions_choices`); False lets it.  ``embedding_scratch_limit``: the most bytes of fp32
    scratch Inductor's embedding gradient may take; above it the graph calls PyTorch's embedding backward
    (:func:`_decompositions`).  ``"auto"`` (default): the room under the estimated peak of the plan the
    graph runs (:func:`embedding_scratch_room`, read through ``plan_source``, which ``remat.jit`` and
    ``remat.install`` set to their executor's last plan), or :data:`EMBEDDING_SCRATCH_LIMIT` without one.
    ``token_major_attention``: attention's query, key and value, where a region computes them, are laid
    out token by token (:func:`token_major_strides`).  ``donate_dying_inputs`` (default True): a region
    writes an output into the storage of an input that dies there, where the plan says so
    (:mod:`remat.core.donation`; ``remat.jit`` plans with it then); False: every region output has a
    buffer of its own."""

    def __init__(
        self,
        materialize_region_outputs: bool = True,
        inductor_options: dict[str, Any] | None = None,
        separate_regions: bool = True,
        embedding_scratch_limit: int | str = "auto",
        token_major_attention: bool = True,
        donate_dying_inputs: bool = True,
    ) -> None:
        super().__init__()
        self.donate_dying_inputs = donate_dying_inputs
        if embedding_scratch_limit != "auto" and (
            isinstance(embedding_scratch_limit, bool) or not isinstance(embedding_scratch_limit, int) or embedding_scratch_limit < 0
        ):
            raise ValueError(f"embedding_scratch_limit must be 'auto' or a number of bytes >= 0, got {embedding_scratch_limit!r}")
        self.token_major_attention = token_major_attention
        self.embedding_scratch_limit = embedding_scratch_limit
        #: A callable returning the plan (:class:`remat.Result`) of the trace being compiled, or None.
        self.plan_source: Callable[[], Any] | None = None
        self.materialize_region_outputs = materialize_region_outputs
        self.separate_regions = separate_regions
        self.inductor_options = dict(inductor_options or {})
        self.notes: list[str] = []
        self._count = 0

    def planned_donations(self) -> Mapping[tuple[str, str], int]:
        """The donations of the plan being compiled (:mod:`remat.core.donation`; the plan's memory estimate
        counts them), or none without a plan: (region name, output name) -> the donor's position among
        the region's inputs.  By position: Thunder's split gives the backward's regions new names for
        their inputs (the saved tensors), while the regions and their outputs keep theirs."""
        result = self.plan_source() if self.plan_source is not None and self.donate_dying_inputs else None
        if result is None or not result.after_graph.donations:
            return {}
        graph = result.after_graph
        positions = {}
        for output, donor in graph.donations.items():
            unit = graph.units[graph.tensors[output].producer_unit]
            positions[(unit.name, output)] = unit.inputs.index(donor)
        return positions

    def scratch_limit(self, trace: TraceCtx) -> int:
        """The embedding gradient's scratch limit for ``trace``, compiled now (``embedding_scratch_limit``)."""
        if self.embedding_scratch_limit != "auto":
            return self.embedding_scratch_limit
        if self.plan_source is None or not any(op_kind(b) in EMBEDDING_GRADIENT_KINDS for b in trace.bound_symbols):
            return EMBEDDING_SCRATCH_LIMIT  # nothing to size (and no need to read the plan's trace back)
        room = embedding_scratch_room(self.plan_source())
        return EMBEDDING_SCRATCH_LIMIT if room is None else room

    def transform_trace_post_optimization(self, computation_trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        name = f"remat_graph{self._count}"
        new_trace, reason = compile_trace_body(
            computation_trace,
            name,
            self.materialize_region_outputs,
            self.inductor_options,
            self.separate_regions,
            self.scratch_limit(computation_trace),
            self.token_major_attention,
            self.planned_donations(),
        )
        if reason is not None:
            note = f"{computation_trace.siginfo().name}: left region by region ({reason})"
            logger.info("remat inductor-graph: %s", note)
            self.notes.append(note)
        else:
            self._count += 1
            (graph,) = [b for b in new_trace.bound_symbols if b.sym.name == name]
            undonated = graph._call_ctx[name].undonated
            if undonated:
                self.notes.append(
                    f"{computation_trace.siginfo().name}: {len(undonated)} region outputs the plan writes over dying inputs "
                    f"get buffers of their own ({', '.join(undonated[:4])}): the graph does not own those inputs; the "
                    "measured peak can be above the estimate by them"
                )
            left = graph._call_ctx[name].left_to_inductor
            if left:
                logger.info(
                    "remat inductor-graph: %s: %d region outputs the plan writes over matmul outputs made in the graph are left to "
                    "Inductor's own in-place reuse (no copy_): %s", computation_trace.siginfo().name, len(left), ", ".join(left[:4]),
                )
        return new_trace
