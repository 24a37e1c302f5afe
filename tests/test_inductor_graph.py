"""``runtime="inductor-graph"``: remat's planned forward and backward each run as one Inductor graph
(``remat.thunder.graph``; C++ on this CPU, Triton on a GPU, where ``benchmarks/gpu_memory.py`` mode
``remat-graph`` measures it)."""

import gc
import warnings
import weakref

import pytest
import torch

import remat
import remat.thunder  # noqa: F401  (its compat bridge first: then Thunder imports on torch 2.13)
import thunder
from conftest import recorded_graphs, train_step
from remat.thunder.graph import REGION_KEY, GraphCallable, InductorGraphTransform, _annotate, _materialized, _regions_of
from remat.thunder.inductor import InductorRegionCallable
from test_inductor import Block


def graphs_of(trace) -> list:
    return [b for b in trace.bound_symbols if b.sym.name.startswith("remat_graph")]


def no_region_compilation(monkeypatch):
    """Regions (the graph's fallback) run with the torch reference: no C++ build in tests that do not need one."""
    monkeypatch.setattr(InductorRegionCallable, "_build", lambda self: self.reference.build())
    monkeypatch.setattr(InductorRegionCallable, "_direct_for", lambda self, args: None)


def test_forward_and_backward_each_run_as_one_graph_and_train_like_eager():
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    jitted = remat.jit(block, runtime="inductor-graph")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback
        for _ in range(2):  # the second step reuses the compiled graphs
            loss, grads = train_step(jitted, x)
            torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
            for got, want in zip(grads, expected_grads):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    forward, backward = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    for trace in (forward, backward):
        (graph,) = graphs_of(trace)
        callable_ = graph._call_ctx[graph.sym.name]
        assert callable_.path == "inductor" and callable_.failed is None and len(callable_._compiled) == 1
        # nothing but the graph computes: the rest unpacks, clears collections and returns
        assert not any(b.sym.is_fusion and b is not graph for b in trace.bound_symbols)
    # remat planned as always: the plan's regions are inside the graphs
    assert remat.executor_of(jitted).last_result is not None
    # the backward takes the saved tensors as their collection (emptied by the call), not unpacked names
    (graph,) = graphs_of(backward)
    assert type(graph.args[0]).__name__ == "CollectionProxy"
    assert not any(b.sym.name == "unpack_sequence" and b.args[0].name == graph.args[0].name for b in backward.bound_symbols)


@pytest.mark.parametrize("materialize", [True, False])
def test_region_outputs_are_buffers_of_their_own_in_the_graph_inductor_compiles(monkeypatch, materialize):
    """As remat's memory model counts them: without that, Inductor inlines a region's output into each
    reader and may compute and store it once per layout its readers want (measured on the GPU: +340 MiB
    of peak on stablecode-3b x2).  Inductor's peak-memory reordering is off while it compiles (remat's
    order is planned for memory), unless the transform is told otherwise, and so is its buffer reuse."""
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as inductor_config

    from remat.thunder.graph import InductorGraphTransform

    compiled: list = []

    def record(graph, example_inputs, **kwargs):  # runs the FX graph itself: no C++ build
        compiled.append((graph, inductor_config.reorder_for_peak_memory, inductor_config.allow_buffer_reuse))
        return lambda args: graph(*args)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", record)
    no_region_compilation(monkeypatch)
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    options = {} if materialize else {"reorder_for_peak_memory": True}
    transform = InductorGraphTransform(materialize_region_outputs=materialize, inductor_options=options)
    jitted = remat.jit(block, runtime="inductor", transforms=[transform])
    loss, grads = train_step(jitted, x)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert len(compiled) == 2  # the forward and the backward
    for (graph, reorder, reuse), trace in zip(compiled, (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1])):
        (whole,) = graphs_of(trace)
        region_outputs = sum(len(b.flat_proxy_outs) for b in whole.subsymbols if b.sym.is_fusion)
        barriers = [n for n in graph.graph.nodes if "inductor_force_stride_order" in str(n.target)]
        donated = whole._call_ctx[whole.sym.name].donated  # written over a dying input: copy_, a buffer already
        assert region_outputs > 0
        assert len(barriers) == (region_outputs - len(donated) if materialize else 0)
        assert reorder is (not materialize)
        assert reuse is False  # a dead buffer is freed, not held for a later one of its size
        # every region's FX nodes carry its number (>= 0), every run of ops between regions one of its
        # own (< 0): the barrier against fusion across regions
        computing = [n for n in graph.graph.nodes if n.op == "call_function"]
        tags = [(n.meta.get("custom") or {}).get(REGION_KEY) for n in computing]
        assert None not in tags
        assert len({t for t in tags if t >= 0}) == sum(1 for b in whole.subsymbols if b.sym.is_fusion)
        assert any(t < 0 for t in tags)  # the matmuls outside the regions


class _Scheduled(Exception):
    """Stops a compilation once Inductor's scheduler has fused: no C++ build."""


def _scheduled_regions(monkeypatch, body, separate: bool, *inputs) -> list[set]:
    """The regions of each node Inductor's scheduler made of ``body`` once it has fused (compilation
    stops there: no C++ build)."""
    from torch._inductor import scheduler

    fused: list[list[set]] = []
    original = scheduler.Scheduler.__init__

    def schedule_then_stop(self, *args, **kwargs):
        original(self, *args, **kwargs)
        fused.append([_regions_of(node) for node in self.nodes])
        raise _Scheduled

    monkeypatch.setattr(scheduler.Scheduler, "__init__", schedule_then_stop)
    graph = GraphCallable("g", 0, body, body, separate_regions=separate)
    with pytest.raises(Exception, match="_Scheduled"):  # Inductor wraps it in its own error
        graph._build(list(inputs))
    (nodes,) = fused
    return nodes


@pytest.mark.parametrize("separate", [True, False])
def test_inductor_does_not_fuse_independent_regions_into_one_kernel(monkeypatch, separate):
    """Two regions that read the same input and not each other's outputs: Inductor fuses them into one
    loop ("horizontal" fusion), which computes the later one's outputs early.  The graph runtime refuses
    that across regions (``separate_regions=True``, the default), not inside one."""

    def body(x):
        with _annotate({REGION_KEY: 0}):
            first = (torch.sigmoid(x) * 2).sum(0)  # two ops of one region: fused (vertically)
        with _annotate({REGION_KEY: 1}):
            second = (torch.tanh(x) + 1).sum(0)
        return first, second

    nodes = _scheduled_regions(monkeypatch, body, separate, torch.randn(64, 64))
    assert {0} in nodes and {1} in nodes if separate else {0, 1} in nodes, nodes


@pytest.mark.parametrize("separate", [True, False])
def test_inductor_does_not_fuse_a_region_into_the_region_that_reads_it(monkeypatch, separate):
    """A region whose output a later region reads, and a matmul too: Inductor fuses the first into the
    second's kernel ("vertical" fusion), so the first region's output (and the matmul waiting for it)
    comes only where the second runs.  Refused across regions by default; an op outside every region
    (the matmul) gets a tag of its own (< 0)."""

    def body(x, w):  # region outputs are buffers of their own, as compile_trace_body makes them
        with _annotate({REGION_KEY: 0}):
            first = _materialized(torch.sigmoid(x) * 2)
        product = first @ w  # outside the regions: an extern matmul
        with _annotate({REGION_KEY: 1}):
            second = _materialized(torch.tanh(first) + 1)
        return product, second

    nodes = _scheduled_regions(monkeypatch, body, separate, torch.randn(64, 64), torch.randn(64, 64))
    if separate:
        assert {0} in nodes and {1} in nodes, nodes
        assert all(len(regions) == 1 for regions in nodes), nodes
        assert any(tag < 0 for regions in nodes for tag in regions), nodes
    else:
        assert {0, 1} in nodes, nodes


@pytest.mark.parametrize("separate", [True, False])
def test_two_regions_reading_one_view_between_regions_stay_apart(monkeypatch, separate):
    """A matmul between regions, reshaped, read by two regions: Inductor inlines the reshape into both
    readers, so both scheduler nodes have the reshape's run among their origins.  That shared run must not
    make the two regions look alike (it did: Llama-2-7b's recomputed SwiGLU fused with its gradient under
    a budget, on an H100)."""

    def body(x, w):
        product = (x @ w).reshape(4, 16, 64)  # outside the regions: the view is inlined into each reader
        with _annotate({REGION_KEY: 0}):
            first = _materialized(torch.sigmoid(product) * 2)
        with _annotate({REGION_KEY: 1}):
            second = _materialized(torch.tanh(product) + 1)
        return first, second

    nodes = _scheduled_regions(monkeypatch, body, separate, torch.randn(64, 64), torch.randn(64, 64))
    if separate:
        assert {0} in nodes and {1} in nodes, nodes
    else:
        assert {0, 1} in nodes, nodes


def test_the_graph_owns_the_saved_tensors_it_is_handed():
    """Each saved tensor can be freed inside the graph at its last use: once the graph has taken them, no
    one else (not the caller, not the collection) refers to them."""
    saved = [torch.ones(3), torch.full((3,), 2.0)]
    first = weakref.ref(saved[0])
    seen = {}

    def boxed(args):  # what Inductor's generated code does with its inputs
        a, b, c = args
        args.clear()
        total = a + b
        del a
        gc.collect()
        seen["first_alive"] = first() is not None
        return [total + c]

    callable_ = GraphCallable("remat_graph_test", 1, traced=None, fallback=None)
    callable_._build = lambda flat: boxed
    (out,) = callable_(saved, torch.full((3,), 4.0))
    assert saved == [] and seen["first_alive"] is False
    torch.testing.assert_close(out, torch.full((3,), 7.0))


def test_a_graph_inductor_cannot_compile_runs_region_by_region(monkeypatch):
    no_region_compilation(monkeypatch)

    def refuse(self, flat):
        raise RuntimeError("Inductor cannot lower this graph")

    monkeypatch.setattr(GraphCallable, "_build", refuse)
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    jitted = remat.jit(block, runtime="inductor-graph")
    with pytest.warns(UserWarning, match="could not compile remat_graph.*Inductor cannot lower this graph"):
        loss, grads = train_step(jitted, x)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]):
        (graph,) = graphs_of(trace)
        assert graph._call_ctx[graph.sym.name].path == "fallback"


@pytest.mark.parametrize("laid_out_attention", [False, True])
def test_a_fallback_warning_says_when_the_estimate_assumed_the_graphs_attention_layout(monkeypatch, laid_out_attention):
    """A plan made for the graph's token-major attention counts the reshape of attention's output as a
    view; run region by region after a failed compilation, it is a copy, and the warning says the peak
    can be above the estimate."""

    def refuse(self, flat):
        raise RuntimeError("Inductor cannot lower this graph")

    monkeypatch.setattr(GraphCallable, "_build", refuse)
    graph = GraphCallable("remat_graph", 0, traced=None, fallback=lambda x: x + 1, laid_out_attention=laid_out_attention)
    with pytest.warns(UserWarning, match="runs region by region instead") as caught:
        out = graph(torch.zeros(2))
    torch.testing.assert_close(out, torch.ones(2))
    assert graph.path == "fallback"
    message = str(caught[0].message)
    assert ("above the estimate by up to one such output per layer" in message) == laid_out_attention


def test_a_forward_drawing_random_numbers_stays_region_by_region(monkeypatch):
    """Inductor's random numbers are not eager's: a trace that draws any keeps its regions (and their
    numbers), so a dropout mask recomputed in the backward equals the forward's."""
    no_region_compilation(monkeypatch)
    block = Block(dropout=0.5)
    x = torch.randn(4, 16)
    torch.manual_seed(3)
    expected_loss, expected_grads = train_step(remat.jit(block, runtime="torch"), x)
    torch.manual_seed(3)
    jitted = remat.jit(block, runtime="inductor-graph")
    loss, grads = train_step(jitted, x)
    assert torch.equal(loss, expected_loss)
    for got, want in zip(grads, expected_grads):  # the backward may be one graph (other rounding), same mask
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    forward = thunder.last_traces(jitted)[-1]
    assert not graphs_of(forward) and any(b.sym.is_fusion for b in forward.bound_symbols)
    notes = remat.executor_of(jitted).graph_transform.notes  # nothing lost silently: the reason is kept
    assert any(note.startswith("computation: left region by region") and "random" in note for note in notes)


def test_a_budget_with_the_graph_runtime_warns_that_the_peak_may_exceed_it():
    """The budget is planned against remat's estimate, which Inductor's own schedule is not bound to."""
    with pytest.warns(UserWarning, match="memory_budget is planned against remat's estimate.*region by region"):
        jitted = remat.jit(Block(), memory_budget=0.8, runtime="inductor-graph")
    assert remat.executor_of(jitted).graph_transform is not None
    # the graph runtime spelled out (Inductor regions and a transform of one's own) is the same runtime
    transform = InductorGraphTransform(donate_dying_inputs=False)
    with pytest.warns(UserWarning, match="memory_budget is planned against remat's estimate"):
        jitted = remat.jit(Block(), memory_budget=0.8, runtime="inductor", transforms=[transform])
    assert remat.executor_of(jitted).graph_transform is transform


def test_jit_and_install_take_one_graph_transform_at_most():
    two = [InductorGraphTransform(), InductorGraphTransform()]
    with pytest.raises(ValueError, match="at most one InductorGraphTransform"):
        remat.jit(Block(), runtime="inductor-graph", transforms=two)
    with pytest.raises(ValueError, match="at most one InductorGraphTransform"):
        remat.install(runtime="inductor-graph", transforms=two)
    assert thunder.jit.__module__.startswith("thunder")  # nothing was installed


def test_install_uses_the_graph_transform_given():
    """``remat.install(runtime="inductor-graph", transforms=[InductorGraphTransform(...)])``: that transform,
    with its arguments, is the one every ``thunder.jit`` gets while installed (not one more beside it)."""
    transform = InductorGraphTransform(donate_dying_inputs=False)
    with remat.install(runtime="inductor-graph", transforms=[transform]) as installed:
        assert list(installed.transforms) == [transform]
        assert transform.plan_source is not None  # reads the installed executor's plan
    with remat.install(runtime="inductor-graph") as installed:
        (default,) = installed.transforms
        assert isinstance(default, InductorGraphTransform) and default is not transform


def test_an_executor_alone_refuses_the_graph_runtime():
    with pytest.raises(ValueError, match=r"remat\.jit\(fn, runtime='inductor-graph'\).*remat\.install\(runtime='inductor-graph'\)"):
        remat.executor(runtime="inductor-graph")


def test_install_adds_the_graph_transform_to_thunder_jit_while_installed(monkeypatch):
    """Scripts that call ``thunder.jit`` themselves (Thunder's benchmark_litgpt) get the graphs too, planned
    with the graph's layout of attention (``token_major_attention``)."""
    import remat.compile as remat_compile

    monkeypatch.setattr(GraphCallable, "_build", lambda self, flat: lambda args: self.traced(*args))  # no C++ build
    planned_with: list = []
    plan = remat_compile.optimize
    monkeypatch.setattr(
        remat_compile, "optimize", lambda *args, **kwargs: planned_with.append(kwargs.get("token_major_attention")) or plan(*args, **kwargs)
    )
    original = thunder.jit
    block = Block()
    x = torch.randn(4, 16)
    expected_loss, expected_grads = train_step(block, x)
    with remat.install(runtime="inductor-graph") as installed:
        assert thunder.jit is not original and len(installed.transforms) == 1
        jitted = thunder.jit(block)
        loss, grads = train_step(jitted, x)
    assert thunder.jit is original
    assert planned_with == [True]
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]):
        (graph,) = graphs_of(trace)
        assert graph._call_ctx[graph.sym.name].path == "inductor"


class Embedded(torch.nn.Module):
    """A bf16 embedding (whose gradient Inductor would accumulate in an fp32 copy of the table) and a head."""

    def __init__(self, vocab: int = 64, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(vocab, width, dtype=torch.bfloat16)
        self.head = torch.nn.Linear(width, width, bias=False, dtype=torch.bfloat16)

    def forward(self, idx):
        return self.head(torch.nn.functional.gelu(self.wte(idx)))


@pytest.mark.parametrize("limit, kept_whole", [(0, True), (2**30, False)])
def test_an_embedding_gradient_above_the_scratch_limit_runs_pytorchs_op(monkeypatch, limit, kept_whole):
    """Inductor's own embedding gradient holds an fp32 table of zeros beside the bf16 gradient (+480 MiB over
    remat's estimate on stablecode-3b's 49152 x 2560 table, measured on the CPU): above the limit the graph
    calls PyTorch's op (a custom op Inductor leaves whole), below it Inductor's decomposition stays."""
    from remat.thunder.graph import InductorGraphTransform

    graphs = recorded_graphs(monkeypatch)
    no_region_compilation(monkeypatch)
    model = Embedded()
    idx = torch.randint(0, 64, (2, 8))
    _, expected_grads = train_step(model, idx)
    jitted = remat.jit(model, runtime="inductor", transforms=[InductorGraphTransform(embedding_scratch_limit=limit)])
    _, grads = train_step(jitted, idx)
    backward = graphs[-1].graph
    targets = {str(node.target) for node in backward.nodes if node.op == "call_function"}
    assert ("remat.embedding_backward.default" in targets) is kept_whole
    assert any("index_put" in target for target in targets) is not kept_whole
    for got, want in zip(grads, expected_grads):  # both accumulate in fp32: the same bf16 gradient
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


class EmbeddedWide(torch.nn.Module):
    """:class:`Embedded` with a wide hidden layer in between, whose saved activations set the step's peak
    (so that at the end of the backward, where the embedding gradient runs, there is room under it)."""

    def __init__(self, vocab: int = 64, width: int = 16, hidden: int = 4096):
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(vocab, width, dtype=torch.bfloat16)
        self.up = torch.nn.Linear(width, hidden, bias=False, dtype=torch.bfloat16)
        self.down = torch.nn.Linear(hidden, width, bias=False, dtype=torch.bfloat16)

    def forward(self, idx):
        return self.down(torch.nn.functional.gelu(self.up(self.wte(idx))))


@pytest.mark.parametrize(
    "model, kept_whole",
    [
        (EmbeddedWide(), False),  # activations set the peak: the fp32 table fits under it
        (Embedded(vocab=8192), True),  # the table's gradient sets the peak: no room for its fp32 copy
    ],
    ids=["room-under-the-peak", "peak-at-the-gradient"],
)
def test_auto_embedding_scratch_takes_the_room_under_the_plans_peak(monkeypatch, model, kept_whole):
    """``embedding_scratch_limit="auto"`` (the default): Inductor's faster embedding gradient, with its
    fp32 table, where the table fits under remat's estimated peak at the point where the gradient runs;
    PyTorch's op where it would raise that peak."""
    from remat.core.memory import headroom
    from remat.core.ops import EMBEDDING_GRADIENT_KINDS
    from remat.thunder.graph import InductorGraphTransform, embedding_scratch_room

    graphs = recorded_graphs(monkeypatch)
    no_region_compilation(monkeypatch)
    idx = torch.randint(0, model.wte.num_embeddings, (2, 8))
    _, expected_grads = train_step(model, idx)
    jitted = remat.jit(model, runtime="inductor-graph")
    transform = remat.executor_of(jitted).graph_transform
    assert transform.embedding_scratch_limit == "auto"
    _, grads = train_step(jitted, idx)
    result = remat.executor_of(jitted).last_result
    room = embedding_scratch_room(result)
    assert room == headroom(result.after, result.after_graph, EMBEDDING_GRADIENT_KINDS) is not None
    table_scratch = model.wte.weight.numel() * 4
    assert (table_scratch > room) is kept_whole
    targets = {str(node.target) for node in graphs[-1].graph.nodes if node.op == "call_function"}
    assert ("remat.embedding_backward.default" in targets) is kept_whole
    assert any("index_put" in target for target in targets) is not kept_whole
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_embedding_scratch_limit_is_auto_or_bytes():
    from remat.thunder.graph import InductorGraphTransform

    for bad in (-1, 1.5, True, "all"):
        with pytest.raises(ValueError, match="embedding_scratch_limit"):
            InductorGraphTransform(embedding_scratch_limit=bad)


def test_inductor_compiles_a_graph_with_the_embedding_gradient_kept_whole():
    """Inductor refuses a fallback for ``aten.embedding_dense_backward`` (it has a decomposition), so the op
    is kept whole as remat's custom op, which Inductor calls as it is."""
    from remat.thunder.graph import InductorGraphTransform

    model = Embedded()
    idx = torch.randint(0, 64, (2, 8))
    _, expected_grads = train_step(model, idx)
    transform = InductorGraphTransform(embedding_scratch_limit=0)
    jitted = remat.jit(model, runtime="inductor", transforms=[transform])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback
        _, grads = train_step(jitted, idx)
    (graph,) = graphs_of(thunder.last_backward_traces(jitted)[-1])
    assert graph._call_ctx[graph.sym.name].path == "inductor"
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


class _Attention(torch.nn.Module):
    """A causal self-attention with LitGPT's layout: one qkv projection, heads split out and moved before
    the tokens, a rotary embedding on the first quarter of each head (q and k are cats), an output projection."""

    def __init__(self, width: int = 32, heads: int = 2, multi_query: bool = False):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.kv_heads = 1 if multi_query else heads  # one key/value head expanded over the query heads (Falcon)
        self.qkv = torch.nn.Linear(width, width + 2 * self.kv_heads * self.head_dim)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).split((width, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim), dim=-1)
        q = q.reshape(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k, v = (t.reshape(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))
        if self.kv_heads != self.heads:
            k, v = (t.expand(batch, self.heads, tokens, self.head_dim) for t in (k, v))
        rotary = self.head_dim // 4
        angle = torch.arange(tokens, dtype=x.dtype)[:, None] / (1 + torch.arange(rotary, dtype=x.dtype))
        half = rotary // 2

        def rope(t):  # LitGPT's: x * cos + rotate_half(x) * sin on the first ``rotary`` features
            part = t[..., :rotary]
            rotated = torch.cat((-part[..., half:], part[..., :half]), -1)
            return torch.cat((part * angle.cos() + rotated * angle.sin(), t[..., rotary:]), -1)

        q, k = rope(q), rope(k)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, tokens, width))


def _attention_output_reshape(graph):
    """The attention forward's output and the tensor of the ``reshape`` that reads its transpose (the
    output projection's input), in a graph remat planned on."""
    (attention,) = [op for op in graph.ops if "sdpa" in op.kind and "bwd" not in op.kind and "backward" not in op.kind]
    output = attention.outputs[0]
    (transposed,) = [op.outputs[0] for op in graph.ops if op.kind == "transpose" and op.inputs[:1] == (output,)]
    (reshaped,) = [op.outputs[0] for op in graph.ops if op.kind == "reshape" and op.inputs[:1] == (transposed,)]
    return output, graph.tensors[reshaped]


def test_attention_reads_token_major_query_key_and_value_and_trains_as_before(monkeypatch):
    """Attention's q, k and v are laid out token by token (the qkv projection's layout; on a GPU cuDNN then
    allocates its output so, and the output projection reads it as a view), with the gradients of eager
    PyTorch; without ``token_major_attention``, as the regions compute them (contiguous).

    The attention output comes out in that layout too (read off the FX graph), so the reshape feeding the
    output projection is a view of it, and the plan's memory model counts it so (measured on an H100:
    remat's estimate was 319 and 512 MiB above the step's peak on stablecode-3b and Llama-2-7b at budgets
    above the default plan, one such reshape kept per layer).  Without the layout the reshape copies, in
    the graph as in the model."""
    from remat.core.strides import is_contiguous
    from remat.thunder.graph import InductorGraphTransform, token_major_strides

    compiled = {"inductor": True}
    graphs = recorded_graphs(monkeypatch, compile=lambda: compiled["inductor"])  # one C++ build, not two
    torch.manual_seed(0)
    module, x = _Attention(), torch.randn(2, 8, 32)
    expected_loss, expected_grads = train_step(module, x)
    for token_major in (True, False):
        graphs.clear()
        compiled["inductor"] = token_major
        jitted = remat.jit(module, runtime="inductor", transforms=[InductorGraphTransform(token_major_attention=token_major)])
        loss, grads = train_step(jitted, x)
        torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        reads = [
            node.args[:3]
            for graph in graphs
            for node in graph.graph.nodes
            if node.op == "call_function" and "flash_attention_for_cpu" in str(node.target) and "backward" not in str(node.target)
        ]
        assert len(reads) == 1
        for operand in reads[0]:
            value = operand.meta["val"]
            laid_out = tuple(value.stride()) == token_major_strides(value.shape)
            assert laid_out == token_major, (token_major, tuple(value.shape), tuple(value.stride()))
        (forward_attention,) = [node for graph in graphs for node in graph.graph.nodes if node.args[:3] == reads[0]]
        out = forward_attention.meta["val"][0]
        assert (tuple(out.stride()) == token_major_strides(out.shape)) == token_major  # the runtime's layout
        assert token_major or is_contiguous(out.shape, out.stride())
        output, reshaped = _attention_output_reshape(remat.executor_of(jitted).last_result.graph)
        assert (reshaped.alias_of == output) == token_major, reshaped  # the model's
        (graph_bsym,) = graphs_of(thunder.last_traces(jitted)[-1])
        assert graph_bsym._call_ctx[graph_bsym.sym.name].laid_out_attention == token_major  # what a fallback would warn of


def test_a_trace_drawing_random_numbers_is_planned_as_regions_lay_it_out(monkeypatch):
    """Dropout keeps the forward region by region (contiguous region outputs): the planner does not count
    on the graph's layout there."""
    recorded_graphs(monkeypatch)
    no_region_compilation(monkeypatch)

    class WithDropout(_Attention):
        def forward(self, x):
            return super().forward(torch.nn.functional.dropout(x, 0.5))

    torch.manual_seed(0)
    jitted = remat.jit(WithDropout(), runtime="inductor-graph")
    train_step(jitted, torch.randn(2, 8, 32))
    output, reshaped = _attention_output_reshape(remat.executor_of(jitted).last_result.graph)
    assert reshaped.alias_of is None


@pytest.mark.parametrize("token_major", [True, False])
def test_keys_expanded_over_query_heads_stay_views_in_the_graph(monkeypatch, token_major):
    """Multi-query attention: one key/value head expanded over the query heads, a view with stride 0 over
    the heads, as a region's output.  It stays a view: a buffer of its own with those strides cannot exist
    (tracing failed and the graph ran region by region), and a dense (or token-major) copy would be bytes
    the memory model does not count."""
    from remat.thunder.graph import InductorGraphTransform

    recorded_graphs(monkeypatch)  # run eagerly: a buffer with the view's strides fails there as in Inductor
    torch.manual_seed(0)
    module, x = _Attention(multi_query=True), torch.randn(2, 8, 32)
    expected_loss, expected_grads = train_step(module, x)
    jitted = remat.jit(module, runtime="inductor", transforms=[InductorGraphTransform(token_major_attention=token_major)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback to region by region
        loss, grads = train_step(jitted, x)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]):
        (graph,) = graphs_of(trace)
        assert graph._call_ctx[graph.sym.name].path == "inductor"
