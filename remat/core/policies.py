"""Policies: values you pass, not global settings.

:class:`RecomputePolicy` (keyword ``recompute=``) says what the planner may recompute in the backward;
:class:`FusionPolicy` (keyword ``fusion=``) says which operations may join a fusion region, whatever
runtime then runs the regions (nvFuser on a GPU, the torch reference on a CPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from remat.core.ops import NEVER_RECOMPUTE_TAGS, NVFUSER_FUSIBLE_PRIMS, NVFUSER_MATMUL_PRIMS, REGATHER_TAG, is_attention

__all__ = ["RecomputePolicy", "FusionPolicy", "check_policy"]


@dataclass(frozen=True)
class RecomputePolicy:
    """What the solver may recompute in the backward.

    ``matmul`` / ``attention``: allow recomputing matmuls, linears and attention kernels.
    ``reductions``: allow recomputing reductions (norm statistics, sums; they shrink their input, so
    saving their output is cheap anyway).  ``non_fusible``: allow recomputing ops that cannot join a
    fusion region (they would run as stand-alone kernels in the backward).  Whatever the policy, ops
    tagged ``in_place``, ``opaque``, ``no_recompute`` or ``distributed`` (:func:`remat.core.ops.op_tags`) are never
    recomputed (a re-gather aside, when ``regather_parameters`` asks for it).  Stateless random ops
    (``uniform_philox``) are always recomputable: run again, they reproduce the same numbers.

    ``unsafe_stateful_random``: allow recomputing *stateful* random ops (dropout on CPU, torch's RNG).
    This CHANGES RESULTS: run again in the backward, such an op draws new numbers, so the backward
    differentiates a different mask than the forward used and the gradients are wrong (off by 100% for
    dropout).  For experiments only.  ``random=True``, this switch's old name, raises a ``ValueError``
    saying so: a setting that changes results is only taken under a name that says it does.

    ``unfused_readers``: allow recomputing a value that a backward op outside every region reads (a
    matmul's weight gradient, an attention backward): such a recomputation cannot fuse into its reader,
    so it runs as a region of its own, one more kernel that writes the value to memory and the reader
    loads it back (:func:`remat.core.layout.read_outside_regions`; in LitGPT, the RoPE'd queries and
    keys recomputed from ``qkv`` before the attention backward).  ``False`` keeps such values saved
    instead: more memory, fewer kernels in the backward; exact in the cut (their producers may not be
    recomputed, not even under a budget).  Whether that is faster is the GPU's to say (issue 18 in
    docs/benchmarks.md); the default is the lower peak.  The rule reads the trace's regions, which the
    rewrite changes: optimizing an already optimized trace again may recompute values the first pass
    kept (the default policy plans such a trace to recompute nothing more).

    ``host_recompute``: run a recomputation for such a reader inside the next backward region that
    recomputes from the same inputs (a layer norm's or an activation's backward), moved up to just
    before the reader, instead of a region of its own: one kernel fewer and one read of the inputs
    fewer; only where the move is sound and the estimated peak does not rise
    (:func:`remat.core.layout.host_recomputations`).  ``False``: every such recomputation gets its own
    region, as before.  Changes the layout, not the cut: the same values are saved either way.

    ``regather_parameters``: allow re-gathering parameters in the backward instead of keeping them
    unsharded from the forward: ZeRO3's meaning, for ``thunder.distributed.fsdp`` traces.  Exactly the ops
    the op table tags ``regather`` become recomputable (:func:`remat.core.ops.regather_tags`): an all-gather
    whose input is a graph input (a parameter's shard) and the wait that completes it.  They are re-issued
    in the backward as stand-alone ops (never in a region), on every rank in the same order.  Every other
    distributed op (reduce-scatters, all-reduces, bucketing, their waits) stays never-recomputed.  Without
    a budget the plan saves as few bytes as it can, so it re-gathers every parameter whose gathered
    value the backward reads (and recomputes what is cheap to make from it); with a memory budget a
    re-gather is priced at the FLOP-equivalent of the bytes it moves
    (:data:`remat.core.ops.REGATHER_FLOPS_PER_BYTE`, approximate) and the budget search decides.
    """

    matmul: bool = False
    attention: bool = False
    reductions: bool = False
    random: bool = False
    non_fusible: bool = False
    unsafe_stateful_random: bool = False
    regather_parameters: bool = False
    unfused_readers: bool = True
    host_recompute: bool = True

    def __post_init__(self) -> None:
        for field_name in (
            "matmul", "attention", "reductions", "random", "non_fusible", "unsafe_stateful_random", "regather_parameters",
            "unfused_readers", "host_recompute",
        ):
            value = getattr(self, field_name)
            if not isinstance(value, bool):
                raise TypeError(f"RecomputePolicy.{field_name} must be True or False, got {type(value).__name__} {value!r}")
        if self.random:
            raise ValueError(
                "RecomputePolicy(random=True) would let the backward re-run stateful random ops (dropout on CPU, "
                "torch's RNG), which draw new numbers: the gradients would then be computed for a different "
                "random mask than the forward used, i.e. wrong. Stateless random ops (uniform_philox) are "
                "recomputed without it. If you want wrong-but-cheaper gradients for an experiment, ask for it "
                "by name: RecomputePolicy(unsafe_stateful_random=True)"
            )

    def allows(self, tags: Iterable[str], fusible: bool = True) -> bool:
        """Whether an op with these tags (:func:`remat.core.ops.op_tags`) may be recomputed; ``fusible``:
        whether it can join a fusion region."""
        tags = set(tags)
        if REGATHER_TAG in tags:
            # a re-gather (all-gather of a graph input, or its wait): exactly when asked for; it runs
            # stand-alone in the backward, so ``non_fusible`` does not apply.  "distributed" is the one
            # never-recompute tag this switch lifts.
            return self.regather_parameters and not (tags & (NEVER_RECOMPUTE_TAGS - {"distributed"}))
        if tags & NEVER_RECOMPUTE_TAGS:
            return False
        if "matmul" in tags and not self.matmul:
            return False
        if "attention" in tags and not self.attention:
            return False
        if "reduction" in tags and not self.reductions:
            return False
        if "rng" in tags and not self.unsafe_stateful_random:
            return False
        if not fusible and "view" not in tags and not ({"matmul", "attention"} & tags) and not self.non_fusible:
            return False
        return True


@dataclass(frozen=True)
class FusionPolicy:
    """Which operations may join a fusion region (remat forms regions the way nvFuser would; see
    :func:`remat.fuse`).

    ``linear`` / ``matmul``: let regions take linear layers / matmuls (nvFuser's ``nv_enable_linear`` and
    ``nv_enable_matmul`` options); ``"auto"`` lets :func:`remat.jit` / :func:`remat.executor` try both
    and keep the lower estimated peak (:func:`remat.fuse` itself treats ``"auto"`` as False).  ``sdpa``:
    let regions take attention kernels.  ``shape_only_regions``: fuse runs made only of shape ops
    (nvFuser's ``nv_enable_shape_only_fusion``).

    ``transposed_cat``: let a region take a ``cat`` whose operands are all transposed values.  Off by
    default: the backward of LitGPT's attention ends in such a cat (the q, k, v gradients transposed
    back and concatenated into the qkv gradient), and nvFuser 0.2.36's resize scheduler ran that region
    in 392 us on an H200 against 210 us for the same region ending before the cat plus ``torch.cat``
    (stablecode-3b, seq 4096; ``benchmarks/gpu_cat.py``, docs/benchmarks.md).  The region then outputs
    the transposed pieces (written contiguously by nvFuser) and ``torch.cat`` joins them: one more
    buffer of the cat's size is alive for that op, which the memory model sees.

    ``independent_parts``: let one region hold computations that share no tensor (Thunder's regions
    do: a run of consecutive fusible ops is one region).  Off by default: a run is split into its
    connected parts (ops linked by a tensor one writes and another reads, or by a tensor both read),
    one region each.  In LitGPT's backward a bias gradient (a sum over tokens of a linear's output
    gradient) falls into the run of the layer-norm backward beside it; no single nvFuser scheduler
    takes both, and nvFuser 0.2.36's segmenter then split the layer-norm backward itself into three
    kernels where it alone runs as one (see docs/benchmarks.md).

    ``attention_value_copy`` (on by default): where attention's value operand is a view into a larger
    buffer (LitGPT's ``v``, a slice of the qkv projection), copy it into its own buffer first
    (:func:`remat.thunder.fuse.copy_attention_values`), so that the cut can save q, k and v for the
    backward at the bytes of qkv instead of saving qkv and recomputing the rotary embeddings (same saved
    bytes and estimated peak on LitGPT stablecode-3b and Llama-2-7b; measured on an H100, stablecode-3b
    x2: 10.64 against 10.84 ms a step, the same peak; docs/benchmarks.md).

    ``loss_gradient``: compute the gradient of ``nll_loss`` (``cross_entropy``'s last step) from fusible
    ops (:func:`remat.thunder.fuse.decompose_loss_gradients`), so it joins the log-softmax gradient's
    region instead of running as aten's op, which writes a zero-filled buffer of the logits' size
    (float32) and scatters into it.  With a large vocabulary that buffer is alive where the step has its
    peak, at the start of the backward.  ``"auto"`` (the default): wherever the regions do not run on
    nvFuser.  Why not there: measured on an H200 and an H100 (Llama-2-7b x2, batch 4, seq 8192, vocab
    32000), the peak under nvFuser stayed at 15833 MiB where remat estimated 9833, while Inductor's
    single kernel measured 9833 (docs/benchmarks.md).  The backward's region is not the cause (since
    ``e00560e`` it has no reduction: the gradient's row sum is the target's value, known, and the H100
    measured the same peak); the forward's is (see ``target_reads``).  ``True`` / ``False``: always /
    never (``False`` is Thunder's way).

    ``target_reads`` (``"auto"`` by default: wherever the regions do not run on nvFuser, the rule of
    ``loss_gradient``; not yet measured on a GPU): compute ``nll_loss``'s read of each
    row's log-probability at its target as a row reduction of the logits
    (:func:`remat.thunder.fuse.decompose_target_gathers`) instead of Thunder's gather from a padded copy
    of the log-probabilities (exact).  Why: under nvFuser the measured peak of the fused loss gradient,
    15832.88 MiB, is remat's estimate (9832.75) plus one float32 buffer of the logits' size and one of
    the padded copy's (4000 + 4000.125 MiB, Llama-2-7b x2, batch 4, seq 8192, vocab 32000): to the byte
    what nvFuser would write if it splits the forward's loss region at that gather of values computed
    from the row's reductions (an inference from the figures, not yet seen in a profile).  As a
    reduction beside the log-softmax's own, no such buffer is needed; nothing changes in remat's
    estimate, which does not see inside regions.  Under Inductor the forward's loss then reads the logits
    once instead of twice (the CPU count of ``cpu_graph_traffic.py``: Llama-2-7b x1, seq 256, vocab
    32000, the forward's kernels 331.5 -> 315.9 MiB, as many kernels, the same gradients and peak), hence
    ``"auto"``; under nvFuser it stays off until a GPU measures it (``True`` asks for it there).
    """

    linear: bool | str = False
    matmul: bool | str = False
    sdpa: bool = False
    shape_only_regions: bool = False
    transposed_cat: bool = False
    independent_parts: bool = False
    attention_value_copy: bool = True
    loss_gradient: bool | str = "auto"
    target_reads: bool | str = "auto"

    def __post_init__(self) -> None:
        for field_name in ("linear", "matmul"):
            if getattr(self, field_name) not in (True, False, "auto"):
                raise ValueError(f"FusionPolicy.{field_name} must be True, False or 'auto'")
        for field_name in ("loss_gradient", "target_reads"):
            value = getattr(self, field_name)
            if not (isinstance(value, bool) or value == "auto"):
                raise TypeError(f"FusionPolicy.{field_name} must be True, False or 'auto', got {value!r}")
        for field_name in ("sdpa", "shape_only_regions", "transposed_cat", "independent_parts", "attention_value_copy"):
            if not isinstance(getattr(self, field_name), bool):
                raise TypeError(f"FusionPolicy.{field_name} must be True or False, got {getattr(self, field_name)!r}")

    def fuses_loss_gradient(self, runtime: str) -> bool:
        """Whether ``loss_gradient`` asks for the fused loss gradient where regions run on ``runtime``
        (``"torch"``, ``"nvfuser"`` or ``"inductor"``)."""
        return _auto_except_nvfuser(self.loss_gradient, runtime)

    def reads_targets_by_reduction(self, runtime: str) -> bool:
        """Whether ``target_reads`` asks for ``nll_loss``'s reads at the targets as row reductions where
        regions run on ``runtime``."""
        return _auto_except_nvfuser(self.target_reads, runtime)

    def can_fuse_kind(self, kind: str) -> bool:
        if kind in NVFUSER_MATMUL_PRIMS:
            return (self.linear if kind == "linear" else self.matmul) is True
        if kind in NVFUSER_FUSIBLE_PRIMS:
            return True
        return self.sdpa and is_attention(kind)


def _auto_except_nvfuser(setting: bool | str, runtime: str) -> bool:
    """``True``/``False`` as they are; ``"auto"``: on wherever regions do not run on nvFuser, whose
    kernels for the loss's regions were measured to hold buffers the memory model does not see."""
    return setting is True or (setting == "auto" and runtime != "nvfuser")


def check_policy(value: object, cls: type, keyword: str) -> None:
    """``None`` or an instance of ``cls``; else a ``TypeError`` naming the keyword (``recompute=`` takes
    a RecomputePolicy, ``fusion=`` a FusionPolicy)."""
    if value is not None and not isinstance(value, cls):
        raise TypeError(f"{keyword}= must be a remat.{cls.__name__}, got {type(value).__name__}")
