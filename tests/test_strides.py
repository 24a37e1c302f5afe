"""remat.strides against PyTorch, and what it means for the graph: region outputs that are views."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import remat
from remat.core.strides import contiguous_strides, is_contiguous, reshape_strides, view_strides


@st.composite
def strided_tensors(draw):
    """A tensor that is a permuted, sliced, stepped view of a contiguous base."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    t = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    t = t.permute(*draw(st.permutations(range(len(shape)))))
    for dim in range(t.dim()):
        if t.shape[dim] > 1 and draw(st.booleans()):
            start = draw(st.integers(0, t.shape[dim] - 1))
            step = draw(st.integers(1, 2))
            t = t.narrow(dim, start, t.shape[dim] - start)[(slice(None),) * dim + (slice(None, None, step),)]
    return t


def factor_shapes(numel: int):
    """Shapes with ``numel`` elements (size-1 dimensions included)."""
    divisors = [d for d in range(1, numel + 1) if numel % d == 0] or [1]

    @st.composite
    def shapes(draw):
        dims, rest = [], numel
        for _ in range(draw(st.integers(0, 3))):
            d = draw(st.sampled_from([d for d in divisors if rest % d == 0]))
            dims.append(d)
            rest //= d
        dims.append(rest)
        return draw(st.permutations(dims))

    return shapes()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_reshape_is_a_view_exactly_when_torch_view_succeeds(data):
    t = data.draw(strided_tensors())
    new_shape = data.draw(factor_shapes(t.numel()))
    try:
        expected = tuple(t.view(new_shape).stride())
    except RuntimeError:
        expected = None
    got = reshape_strides(t.shape, t.stride(), new_shape)
    if expected is None:
        assert got is None
    else:  # size-1 dimensions may carry any stride
        assert got is not None and all(n == 1 or a == b for n, a, b in zip(new_shape, got, expected))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_transpose_slice_squeeze_and_expand_follow_torch(data):
    t = data.draw(strided_tensors())
    perm = data.draw(st.permutations(range(t.dim())))
    assert view_strides("transpose", (None, perm), t.shape, t.stride(), ()) == t.permute(*perm).stride()
    dim = data.draw(st.integers(0, t.dim() - 1))
    step = data.draw(st.integers(1, 3))
    sliced = t[(slice(None),) * dim + (slice(None, None, step),)]
    steps = [1] * t.dim()
    steps[dim] = step
    assert view_strides("slice", (None, None, None, steps), t.shape, t.stride(), sliced.shape) == sliced.stride()
    ones = [d for d in range(t.dim()) if t.shape[d] == 1]
    squeezed = t.squeeze(ones) if ones else t
    assert view_strides("squeeze", (None, ones), t.shape, t.stride(), squeezed.shape) == squeezed.stride()
    expanded = t.unsqueeze(0).expand(3, *t.shape)
    got = view_strides("broadcast_in_dim", (None, expanded.shape, tuple(range(1, t.dim() + 1))), t.shape, t.stride(), expanded.shape)
    assert got == expanded.stride()


def test_contiguity():
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert is_contiguous((2, 1, 4), (4, 99, 1))
    assert not is_contiguous((2, 4), (1, 2))
    assert reshape_strides((2, 3), (1, 2), (6,)) is None  # a transpose cannot be flattened without a copy


def _split_heads(x, w):
    qkv = torch.nn.functional.linear(x, w)  # (1, 8, 24): a stand-alone matmul
    q, k, v = qkv.split(8, dim=-1)
    v = v.reshape(1, 8, 2, 4).transpose(1, 2)  # a view of qkv, as LitGPT's attention makes v
    return (q.sin() * k).sum() + (v * v).sum()


def test_a_region_output_made_of_views_of_an_input_aliases_that_input():
    x = torch.randn(1, 8, 16, requires_grad=True)
    w = torch.randn(24, 16, requires_grad=True)
    fused = remat.fuse(remat.training_trace(_split_heads, x, w))
    graph = remat.read_trace(fused)
    qkv = next(u.outputs[0] for u in graph.units if u.kind == "op" and u.name == "linear")
    region = next(u for u in graph.units if u.kind == "region" and qkv in u.inputs)
    views = [o for o in region.outputs if graph.tensors[o].alias_of == qkv]
    computed = [o for o in region.outputs if graph.tensors[o].alias_of is None]
    # the q and k slices and v (slice, reshape, transpose) alias qkv; sin(q) is fresh
    assert sorted(graph.tensors[o].shape for o in views) == [(1, 2, 8, 4), (1, 8, 8), (1, 8, 8)]
    assert [graph.tensors[o].shape for o in computed if graph.tensors[o].shape] == [(1, 8, 8)]
    # the memory model keeps qkv alive for as long as v is read, and counts v no bytes of its own
    assert remat.estimate_memory(fused).saved_bytes == remat.estimate_memory(graph).saved_bytes
    profile = remat.estimate_memory(graph)
    assert qkv in profile.saved_tensors and not set(views) & set(profile.saved_tensors)


def test_the_plan_saves_the_base_rather_than_pieces_that_keep_it_alive():
    x = torch.randn(1, 8, 16, requires_grad=True)
    w = torch.randn(24, 16, requires_grad=True)
    fused = remat.fuse(remat.training_trace(_split_heads, x, w))
    result = remat.optimize(fused)
    graph = remat.read_trace(fused)
    qkv = next(u.outputs[0] for u in graph.units if u.kind == "op" and u.name == "linear")
    # q and k (fresh pieces) are recomputed from qkv, which v keeps alive anyway
    assert result.after.saved_bytes == graph.tensors[qkv].bytes


def test_optimize_reports_the_memory_of_the_trace_it_returns(pythia_trace):
    # optimize re-reads its rewritten trace reusing facts of the input's graph: that must not change them
    result = remat.optimize(remat.fuse(pythia_trace))
    fresh = remat.estimate_memory(result.trace)
    assert (result.after.peak_bytes, result.after.saved_bytes, result.after.saved_tensors) == (
        fresh.peak_bytes, fresh.saved_bytes, fresh.saved_tensors,
    )
    assert [p.live_bytes for p in result.after.timeline] == [p.live_bytes for p in fresh.timeline]
