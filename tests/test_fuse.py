"""remat.fuse choices that are remat's own (not Thunder's): the cat of transposed values, regions split into
connected parts, and the exact cast clean-up before grouping."""

import pytest
import torch

import remat
from conftest import LLAMA_2, PYTHIA_2, assert_same_loss_and_grads, tiny_litgpt, train_step, traced
from remat.core.ops import SHAPE_ONLY_KINDS as SHAPE_OPS
from remat.thunder.fuse import ATTENTION_VALUE_POSITIONS, copy_attention_values, simplify
from remat.thunder.read import op_kind


@pytest.fixture(scope="module")
def joint():
    """2-layer tiny GPT-NeoX (pythia), sequence 16 (the trace is shared with other files: conftest.traced)."""
    return traced(**PYTHIA_2)


def cats(trace):
    """(stand-alone cats, cats inside regions)."""
    outside = [b for b in trace.bound_symbols if op_kind(b) == "cat"]
    inside = [s for b in trace.bound_symbols if b.sym.is_fusion for s in b.subsymbols if op_kind(s) == "cat"]
    return outside, inside


def test_qkv_gradient_cat_runs_outside_regions_by_default(joint):
    fused = remat.fuse(joint)
    outside, inside = cats(fused)
    # one qkv-gradient cat per layer; RoPE's cats (rotate_half, rotary + pass-through) stay in regions
    assert len(outside) == 2
    assert inside
    made_by = {p.name: b for b in fused.bound_symbols for p in b.flat_proxy_outs}
    for cat in outside:
        assert cat.args[1] == -1 and len(cat.args[0]) == 3
        assert all(made_by[p.name].sym.is_fusion for p in cat.args[0])  # the pieces are region outputs
        for piece in cat.args[0]:  # each is a transposed gradient, reshaped back to (batch, seq, features)
            region = made_by[piece.name]
            producer = next(s for s in region.subsymbols if piece.name in {p.name for p in s.flat_proxy_outs})
            assert op_kind(producer) == "reshape"


def test_transposed_cat_policy_keeps_it_in_the_region(joint):
    outside_default, inside_default = cats(remat.fuse(joint))
    outside, inside = cats(remat.fuse(joint, remat.FusionPolicy(transposed_cat=True)))
    assert outside == []
    assert len(inside) == len(inside_default) + len(outside_default)


def test_default_policy_trains_like_eager():
    model = tiny_litgpt("pythia-14m", n_layer=2)
    idx = torch.randint(0, 128, (1, 64))

    jitted = remat.jit(model, runtime="torch")
    loss, grads = train_step(jitted, idx)
    trace = remat.executor_of(jitted).last_result.trace
    assert any(op_kind(b) == "cat" for b in trace.bound_symbols)  # the stand-alone cat ran
    # attention's values got a buffer of their own (the default since 2026-12-05; the bit-for-bit check
    # against the trace without the copy is test_attention_value_copy_saves_q_k_v_instead_of_recomputing_rope)
    assert any(op_kind(s) == "stride_order" for b in trace.bound_symbols if b.sym.is_fusion for s in b.subsymbols)
    eager_loss, eager_grads = train_step(model, idx)
    torch.testing.assert_close(loss, eager_loss)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def connected_parts(region) -> int:
    """How many parts that compute something the subsymbols of ``region`` fall into (linked by a tensor
    written and read, or read by both); parts made only of shape ops ride along and are not counted."""
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for i, s in enumerate(region.subsymbols):
        for p in (*s.flat_proxy_args, *s.flat_proxy_outs):
            if hasattr(p, "shape"):
                parent[find(("op", i))] = find(("tensor", p.name))
    computing = {find(("op", i)) for i, s in enumerate(region.subsymbols) if op_kind(s) not in SHAPE_OPS}
    return len(computing)


def test_regions_are_connected_by_default(joint):
    regions = [b for b in remat.fuse(joint).bound_symbols if b.sym.is_fusion]
    assert regions and all(connected_parts(r) == 1 for r in regions)
    # with independent_parts, a bias gradient shares the layer-norm backward's region, as in Thunder
    joined = [b for b in remat.fuse(joint, remat.FusionPolicy(independent_parts=True)).bound_symbols if b.sym.is_fusion]
    assert any(connected_parts(r) > 1 for r in joined)
    assert len(joined) < len(regions)
    # the same ops are fused either way
    assert sum(len(r.subsymbols) for r in joined) == sum(len(r.subsymbols) for r in regions)


def test_independent_parts_is_type_checked():
    with pytest.raises(TypeError):
        remat.FusionPolicy(independent_parts="yes")


@pytest.fixture(scope="module")
def bf16_joint():
    model = tiny_litgpt("stablecode-completion-alpha-3b", n_layer=1).to(torch.bfloat16)
    return remat.training_trace(model, torch.randint(0, 128, (1, 32)))


def casts(trace):
    """(convert ops that undo an exact widening, rounding round trips f32 -> bf16 -> f32 of a float32
    value that is not itself a widened bfloat16 one)."""
    made_by = {p.name: b for b in trace.bound_symbols for p in b.flat_proxy_outs}
    undoing, rounding = 0, 0
    for b in trace.bound_symbols:
        if op_kind(b) != "convert_element_type" or not hasattr(b.args[0], "dtype"):
            continue
        source = made_by.get(b.args[0].name)
        if source is None or op_kind(source) != "convert_element_type" or not hasattr(source.args[0], "dtype"):
            continue
        start, middle, end = source.args[0].dtype, b.args[0].dtype, b.args[1]
        if start == end and str(middle).endswith("float32") and str(start).endswith("bfloat16"):
            undoing += 1
        if start == end and str(start).endswith("float32") and str(middle).endswith("bfloat16"):
            origin = made_by.get(getattr(source.args[0], "name", None))
            if origin is None or op_kind(origin) != "convert_element_type" or not str(getattr(origin.args[0], "dtype", "")).endswith("bfloat16"):
                rounding += 1
    return undoing, rounding


def test_simplify_drops_casts_that_undo_a_widening_and_keeps_rounding(bf16_joint):
    from remat.thunder.execute import example_inputs, execute_joint

    undoing, rounding = casts(bf16_joint)
    assert undoing > 0 and rounding > 0  # the bf16 LitGPT backward has both
    simplified = simplify(bf16_joint)
    undoing_after, rounding_after = casts(simplified)
    assert undoing_after == 0 and rounding_after > 0
    assert len(simplified.bound_symbols) < len(bf16_joint.bound_symbols)
    assert simplify(simplified) is simplified  # nothing left to do
    # exact: the same outputs and gradients, bit for bit
    inputs = example_inputs(bf16_joint, seed=3, int_high=128)
    before, after = execute_joint(bf16_joint, inputs, seed=4), execute_joint(simplified, inputs, seed=4)
    for a, b in zip((*before.outputs, *before.grads), (*after.outputs, *after.grads)):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_bf16_training_step_matches_eager():
    model = tiny_litgpt("stablecode-completion-alpha-3b", n_layer=2).to(torch.bfloat16)
    idx = torch.randint(0, 128, (1, 32))

    loss, grads = train_step(remat.jit(model, runtime="torch"), idx)
    eager_loss, eager_grads = train_step(model, idx)
    torch.testing.assert_close(loss, eager_loss, rtol=2e-2, atol=1e-3)
    for g, e in zip((g.float() for g in grads), (e.float() for e in eager_grads)):
        assert ((g - e).norm() / (e.norm() + 1e-12)).item() < 2e-2


def test_a_strided_slice_stays_out_of_regions():
    """Found by tests/test_gpu.py on the H200: nvFuser 0.2.36 refuses slices with a step other than 1
    ("All slice operation strides must be of const size 1"), so a region holding one fell back to torch.
    remat.fuse keeps such a slice stand-alone (as Thunder's nvFuser executor does) and the emitter refuses
    to write it."""
    from remat.thunder.nvfuser import EmitError, refusal

    w = torch.randn(4, 8, requires_grad=True)
    fused = remat.fuse(remat.training_trace(lambda x, w: (x * w)[:, ::2].sin().sum(), torch.randn(4, 8), w))
    strided = [b for b in fused.bound_symbols if op_kind(b) == "slice"]
    assert strided and all(refusal(b, "slice") for b in strided)
    for region in (b for b in fused.bound_symbols if b.sym.is_fusion):
        assert not any(op_kind(s) == "slice" and refusal(s, "slice") for s in region.subsymbols)
    assert remat.optimize(fused, strict=True).after.peak_bytes > 0  # and the trace still plans
    with pytest.raises(EmitError, match="step 1"):
        remat.nvfuser.definition_source(_region_of(strided[0]))


def _region_of(bsym):
    from remat.thunder.regions import default_region_executor, make_region, region_io

    inputs, outputs = region_io([bsym], None)
    return make_region(default_region_executor(), "nvFusion0", [bsym], inputs, outputs)


@pytest.mark.parametrize("family", [PYTHIA_2, dict(LLAMA_2, n_query_groups=4)], ids=["pythia", "llama"])
def test_attention_value_copy_saves_q_k_v_instead_of_recomputing_rope(family):
    """``FusionPolicy(attention_value_copy=True)`` (the default): LitGPT's ``v`` (a view of the qkv projection) is copied
    into its own buffer, which both attention ops read; the plan then saves as many bytes at no higher
    estimated peak and recomputes fewer FLOPs (no rotary embeddings before the attention backward), and a
    training step through it gives the reference's loss and gradients bit for bit."""
    joint = traced(**family)
    plain = remat.optimize(remat.fuse(joint, remat.FusionPolicy(attention_value_copy=False)), strict=True, thunder_baseline=False)
    fused = remat.fuse(joint, remat.FusionPolicy(attention_value_copy=True))
    copied = remat.optimize(fused, strict=True, thunder_baseline=False)
    attention = [b for b in joint.bound_symbols if b.sym.name in ATTENTION_VALUE_POSITIONS]
    assert len(attention) == 2 * family["n_layer"]  # forward and backward per layer
    flat = [s for b in fused.bound_symbols for s in (b.subsymbols if b.sym.is_fusion else [b])]
    copies = {s.output.name: s for s in flat if op_kind(s) == "stride_order"}
    assert len(copies) == family["n_layer"]
    for b in fused.bound_symbols:
        if b.sym.name in ATTENTION_VALUE_POSITIONS:
            assert b.args[ATTENTION_VALUE_POSITIONS[b.sym.name]].name in copies
    assert copied.after.saved_bytes == plain.after.saved_bytes
    assert copied.after.peak_bytes <= plain.after.peak_bytes
    assert copied.extra_flops < plain.extra_flops
    assert assert_same_loss_and_grads(joint, copied.trace) > 1  # the copy changes no number
    # values already in their own buffers: nothing more to copy, the trace comes back as it was
    once = copy_attention_values(joint)
    assert copy_attention_values(once) is once


def test_attention_value_copy_leaves_grouped_query_values_alone():
    """With grouped-query attention LitGPT expands ``v`` to every head before attention: a copy of that
    would be larger than the qkv buffer, so nothing is copied."""
    joint = traced(**LLAMA_2)  # 2 query groups for 4 heads
    assert copy_attention_values(joint) is joint


def test_attention_value_copy_leaves_inference_traces_alone():
    """Without a backward nothing is recomputed, so a copy would only cost time: an inference trace (here
    the forward of a training trace alone, no backward attention op) comes back as it was."""
    from thunder.core.trace import from_trace

    joint = traced(**PYTHIA_2)
    forward = from_trace(joint)
    forward.bound_symbols = [b for b in joint.bound_symbols if not b.sym.name.endswith("_bwd")]
    assert any(b.sym.name == "remat_sdpa_fwd" for b in forward.bound_symbols)
    assert copy_attention_values(forward) is forward


#: (input shape, reduction, weighted, ignore_index): LitGPT's case (2-d, mean, ignored targets), a 1-d
#: input with "none", and a 3-d input with class weights and "sum" (the last two Thunder's own
#: nll_loss_backward fails on: "expected scalar type Float but found Double")
LOSS_CASES = [((12, 7), "mean", False, 2), ((7,), "none", True, -100), ((3, 7, 4), "sum", True, 1)]


def loss_inputs(shape, weighted, ignore_index):
    generator = torch.Generator().manual_seed(0)
    classes = shape[1] if len(shape) > 1 else shape[0]
    logits = torch.randn(*shape, generator=generator)
    target = torch.randint(0, classes, (shape[0], *shape[2:]) if len(shape) > 1 else (), generator=generator)
    if target.ndim:
        target.view(-1)[::3] = ignore_index  # some targets ignored
    weight = torch.rand(classes, generator=generator) if weighted else None
    return logits, target, weight


def loss_gradient(fn, logits, target, weight):
    x = logits.clone().requires_grad_()
    fn(x, target, weight).backward()
    return x.grad


@pytest.mark.parametrize("shape, reduction, weighted, ignore_index", LOSS_CASES)
def test_loss_gradient_joins_the_log_softmax_gradient_region(shape, reduction, weighted, ignore_index):
    def loss_fn(x, target, weight):
        loss = torch.nn.functional.cross_entropy(x, target, weight=weight, reduction=reduction, ignore_index=ignore_index)
        return (loss * 3.0).sum()  # a gradient other than one for "none"

    inputs = loss_inputs(shape, weighted, ignore_index)
    jitted = remat.jit(loss_fn, runtime="torch")
    grad = loss_gradient(jitted, *inputs)
    torch.testing.assert_close(grad, loss_gradient(loss_fn, *inputs))
    trace = remat.executor_of(jitted).last_result.trace
    assert not any("nll_loss_backward" in op_kind(b) for b in trace.bound_symbols)
    # the class comparison runs in the region that also computes the log-softmax gradient (its exp)
    # the last region comparing class indices (the forward's reads at the targets compare them too)
    region = [b for b in trace.bound_symbols if b.sym.is_fusion and any(op_kind(s) == "iota" for s in b.subsymbols)][-1]
    assert any(op_kind(s) == "exp" for s in region.subsymbols)
    # and the log-softmax gradient does not sum it over the classes: that sum is the target's value,
    # known, so the region has one reduction fewer (nvFuser splits a region at a reduction)
    assert one_hot_names(region)  # the decomposed gradient is in it
    assert not [s for s in region.subsymbols if op_kind(s) == "sum" and one_hot_names(region) & {a.name for a in s.flat_proxy_args}]


def one_hot_names(region) -> set[str]:
    """The names, in ``region``, of the decomposed loss gradient (a selection by a class comparison) and
    its copies."""
    compared = {s.output.name for s in region.subsymbols if op_kind(s) == "eq"}
    names = {s.output.name for s in region.subsymbols if op_kind(s) == "where" and s.args[0].name in compared}
    for s in region.subsymbols:
        if op_kind(s) == "shallow_copy" and s.args[0].name in names:
            names.add(s.output.name)
    return names


def test_loss_gradient_is_bit_identical_to_atens():
    def loss_fn(x, target, weight):
        return torch.nn.functional.cross_entropy(x, target, ignore_index=2)

    inputs = loss_inputs((12, 7), False, 2)
    fused = loss_gradient(remat.jit(loss_fn, runtime="torch"), *inputs)
    jitted = remat.jit(loss_fn, runtime="torch", fusion=remat.FusionPolicy(loss_gradient=False))
    aten = loss_gradient(jitted, *inputs)
    trace = remat.executor_of(jitted).last_result.trace
    assert any("nll_loss_backward" in op_kind(b) for b in trace.bound_symbols)  # aten's op, between regions
    assert torch.equal(fused, aten)


def test_loss_gradient_lowers_the_estimated_peak_by_a_logits_buffer():
    tokens, width, vocab = 64, 16, 1000

    def step(hidden, head, target):
        return torch.nn.functional.cross_entropy((hidden @ head).float(), target)

    joint = remat.training_trace(
        step, torch.randn(tokens, width, requires_grad=True), torch.randn(width, vocab, requires_grad=True), torch.randint(0, vocab, (tokens,))
    )
    peaks = {on: remat.optimize(remat.fuse(joint, remat.FusionPolicy(loss_gradient=on))).after.peak_bytes for on in (False, True)}
    # aten's op writes a float32 buffer of the logits' size, alive with the log-softmax and its gradient
    # (less a few bytes: the fused region's scalar operands)
    assert peaks[False] - peaks[True] >= 0.99 * tokens * vocab * 4


@pytest.mark.parametrize("setting", ["auto", True])
def test_loss_gradient_under_nvfuser_only_when_asked(monkeypatch, setting):
    """``"auto"`` (the default) keeps aten's op where regions run on nvFuser, whose kernels for the fused
    gradient hold buffers the memory model does not see (measured on an H200); ``True`` fuses it there
    too.  The same for ``target_reads``.  Checked with the stand-in nvFuser (tests/fake_nvfuser.py), which computes the same gradients."""
    import fake_nvfuser

    import remat.thunder.nvfuser

    fake_nvfuser.install(monkeypatch)
    monkeypatch.setattr(remat.thunder.nvfuser, "available", lambda: True)

    def loss_fn(x, target, weight):
        return torch.nn.functional.cross_entropy(x, target, ignore_index=2)

    inputs = loss_inputs((12, 7), False, 2)
    jitted = remat.jit(loss_fn, runtime="nvfuser", fusion=remat.FusionPolicy(loss_gradient=setting, target_reads=setting))
    torch.testing.assert_close(loss_gradient(jitted, *inputs), loss_gradient(loss_fn, *inputs))
    trace = remat.executor_of(jitted).last_result.trace
    assert any("nll_loss_backward" in op_kind(b) for b in trace.bound_symbols) == (setting == "auto")
    # target_reads follows the same rule: the forward's gather stays under nvFuser unless asked
    ops = [op_kind(s) for b in trace.bound_symbols for s in (b.subsymbols if b.sym.is_fusion else [b])]
    assert ("take_along_axis" in ops) == (setting == "auto")


def test_loss_gradient_is_type_checked():
    for value in (None, 1, "yes"):
        with pytest.raises(TypeError):
            remat.FusionPolicy(loss_gradient=value)


@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_target_reads_of_the_log_softmax_become_row_reductions(ignore_index):
    """nll_loss reads each row's log-probability at its target by a gather (of a padded copy with Thunder's
    default ignore_index); as a row reduction of the logits it joins the log-softmax's other reductions,
    bit for bit (the same operations on the same values)."""
    from remat.thunder.fuse import decompose_target_gathers

    def loss_fn(x, target):
        return torch.nn.functional.cross_entropy((x * 2.0).float(), target, ignore_index=ignore_index)

    joint = remat.training_trace(loss_fn, torch.randn(12, 128, requires_grad=True), torch.randint(0, 128, (12,)))
    rewritten = decompose_target_gathers(joint)
    kinds = [op_kind(b) for b in rewritten.bound_symbols]
    assert "take_along_axis" in [op_kind(b) for b in joint.bound_symbols]
    assert "take_along_axis" not in kinds and "pad" not in kinds
    assert assert_same_loss_and_grads(joint, rewritten) >= 2  # the loss and the input's gradient


@pytest.mark.parametrize("shape, reduction, weighted, ignore_index", LOSS_CASES)
def test_target_reads_train_like_eager(shape, reduction, weighted, ignore_index):
    """``FusionPolicy(target_reads=True)``: the loss and its gradient as eager's (ignored targets among
    them), with no gather or pad left in the trace remat runs."""

    def loss_fn(x, target, weight):
        loss = torch.nn.functional.cross_entropy(x, target, weight=weight, reduction=reduction, ignore_index=ignore_index)
        return (loss * 3.0).sum()

    inputs = loss_inputs(shape, weighted, ignore_index)
    jitted = remat.jit(loss_fn, runtime="torch", fusion=remat.FusionPolicy(target_reads=True))
    torch.testing.assert_close(jitted(inputs[0], *inputs[1:]), loss_fn(*inputs))
    torch.testing.assert_close(loss_gradient(jitted, *inputs), loss_gradient(loss_fn, *inputs))
    trace = remat.executor_of(jitted).last_result.trace
    ops = [op_kind(s) for b in trace.bound_symbols for s in (b.subsymbols if b.sym.is_fusion else [b])]
    assert "take_along_axis" not in ops and "pad" not in ops
    with pytest.raises(TypeError):
        remat.FusionPolicy(target_reads="yes")


def test_a_gather_of_a_value_no_row_statistic_made_stays():
    """A gather of an input (or of what pointwise ops make of it) reads one element a row: cheaper than
    the row reduction, so it stays."""
    from remat.thunder.fuse import decompose_target_gathers

    def fn(x, index):
        return torch.gather(x.exp(), 1, index).sum()

    joint = remat.training_trace(fn, torch.randn(12, 128, requires_grad=True), torch.randint(0, 128, (12, 1)))
    assert decompose_target_gathers(joint) is joint
