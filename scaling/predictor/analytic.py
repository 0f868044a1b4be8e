"""Analytic memory prediction: peak bytes per rank of one training step of the built-in family, by arithmetic alone.

`analytic_peak` breaks the step down per rank (parameters, gradients, optimizer states, the Llama block's
activations, logits and loss buffers, communication buffers, temporaries) on the model-state arithmetic of
scaling.predictor.model_state, and takes the largest of the step's phases (loss, the top blocks' backward, the end
of backward, the optimizer step, DDP's bucket rebuild). Activation bytes per token were read off the traced step.
Tens of microseconds per point, no tensor made; the pre-screen (scaling.predictor.prescreen) refines a prediction
near the capacity with the traced one. What each stage holds and when: docs/memory.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

from scaling.core.enums import FsdpGradReduce, Precision, Recompute, ZeroStage
from scaling.core.recompute import checkpointed, checkpointed_blocks
from scaling.core.schema import ExperimentConfig, HardwareConfig, ModelConfig, ParallelConfig, TrainConfig
from scaling.model.family import family_of
from scaling.model.llama.args import ModelArgs
from scaling.predictor.model_state import (
    BF16,
    FP32,
    Shapes,
    model_order_scratch,
    sharded_params,
    zero1_step_state,
    zero1_worst_rank,
)

ANALYTIC = "analytic"
CALIBRATION_MODELS = ("tiny", "small")
"""The model presets whose traced steps the activation coefficients below were read off: the analytic
model's agreement on them is in-sample (benchmarks/bench_predictor.py reports held-out shapes apart)."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes per rank at the step's peak, by what holds them."""

    params_bytes: int
    """Weights: fp32 (DDP), or fp32 shards plus the unsharded compute copies live at the peak (FSDP2)."""
    grads_bytes: int
    """Gradients live at the peak: DDP buckets, FSDP2 shards, accumulation copies."""
    optimizer_bytes: int
    """AdamW m, v and step counters of the parameters this rank updates."""
    activations_bytes: int
    """Tensors saved for backward by the decoder blocks, the embedding and the final norm."""
    logits_bytes: int
    """Logits, log-probabilities and their gradients (cross-entropy runs in fp32)."""
    comm_bytes: int
    """All-gather and reduce-scatter buffers of FSDP2 live at the peak."""
    temporaries_bytes: int
    """Short-lived tensors at the peak: weight gradients before they reach their buckets or shards,
    recomputed block activations, optimizer scratch."""
    overhead_bytes: int
    """Small fixed tensors: RoPE tables, token ids, scalars."""
    phase: str
    """Where the peak is: loss, output_backward, block_backward, reduce_scatter, next_block_backward,
    embedding_backward, root_reduce, optimizer or bucket_rebuild."""

    @property
    def total_bytes(self) -> int:
        """The predicted peak."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name.endswith("_bytes"))

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (with total) for JSON and records."""
        return {"method": ANALYTIC, "peak_mem_bytes": self.total_bytes, **asdict(self)}


def _norm_saved_on_cpu_only(s: Shapes, bf16: bool, fsdp: bool) -> int:
    """Bytes one RMSNorm saves for backward on CPU beyond what it saves on CUDA, per micro-step.

    `F.rms_norm` runs `aten._fused_rms_norm`. On CUDA that is one kernel, and its backward keeps only the input and
    the fp32 rstd. Elsewhere it decomposes (pow, mean, rsqrt, two muls), and those ops keep the fp32 input and the
    normalised fp32 result. With an fp32 input (fp32 training; autocast's fp32 residual stream) the extra is the
    normalised result: 4h per token. With a bf16 input (FSDP2's bf16 parameters) it is an fp32 upcast of the input
    and the normalised result (8h), less the bf16 input that only the fused kernel keeps (2h): 6h per token.
    (The dtypes match in every case here, which the fused path requires.)
    """
    return s.t * (6 if bf16 and fsdp else 4) * s.h


def _block_activation_bytes(s: Shapes, bf16: bool, fsdp: bool, fused_norm: bool = False) -> int:
    """Bytes one block saves for backward, without recomputation.

    Per token, fp32: 6 h-wide tensors (two RMSNorm outputs each with its normalised input, the residual sum, the
    block output), 3 of the attention's width qd = nh·hd (RoPE'd q, the attention output, its (B, T, qd) reshape;
    qd is h unless the model gives its head_dim), k and v (2 kvd), four f-wide SwiGLU tensors (w1 x, silu, w3 x,
    their product), the SDPA log-sum-exp (nh) and two RMSNorm rstd: 4·(6h + 3qd + 2kvd + 4f + nh + 2) bytes. bf16
    autocast (DDP) keeps the
    norms and the residual stream in fp32 and saves the bf16 weight copies (2 bytes x matmul
    weights); FSDP2's bf16 keeps the residual stream in bf16 and saves an fp32 RoPE table per block.
    These are the CPU's figures; `fused_norm` (CUDA) takes off what its two norms keep only on CPU.
    """
    t, tp = s.t, s.tp
    cpu_only = 2 * _norm_saved_on_cpu_only(s, bf16, fsdp) if fused_norm else 0
    # tensor parallelism: q, the attention output and its reshape (3 of the 9 h-wide tensors), k, v, the SwiGLU
    # tensors and the per-head log-sum-exp are split over the tp ranks; the norms and the residual stream are whole
    kvd, f, nh = s.kvd // tp, s.f // tp, s.nh // tp
    if not bf16:
        return t * (24 * s.h + 12 * s.qd // tp + 8 * kvd + 16 * f + 4 * nh + 8) - cpu_only
    if not fsdp:  # the attention's three qd-wide tensors are bf16 matmul and SDPA outputs
        return t * (26 * s.h + 6 * s.qd + 4 * kvd + 8 * f + 4 * nh + 8) + BF16 * s.block_matmul - cpu_only
    # a (T, hd/2) RoPE table
    # under tensor parallelism one of its bf16 h-wide tensors is whole on every rank where the fp32 count splits it:
    # the trace's per-block figure at tp 2 and 8 (CPU and CUDA) is 2·(h − h/tp) bytes a token above a 4·h/tp count
    return t * (20 * s.h + 6 * s.qd // tp + 4 * kvd + 8 * f + 4 * nh + 8) + FP32 * s.T * (s.hd // 2) - cpu_only


def _block_selective_bytes(s: Shapes, bf16: bool, fsdp: bool) -> int:
    """Bytes one block saves under selective recomputation (scaling.model.checkpoint): its input (the residual
    stream's dtype) and the outputs of its matmuls and attention, nothing between them.

    Per token: the input (h), q, k, v (qd + 2 kvd), the attention output and its log-sum-exp (qd, and nh in fp32),
    the two projections back to h (wo, w2: 2h), the gate and up projections (2f), in the compute's dtype. Under tensor
    parallelism the column-split outputs are a tp-th, the row-split ones whole, and kept twice (the partial sum and
    its all-reduce). FSDP2's bf16 keeps the fp32 RoPE table per block too, as without recomputation.
    """
    t, tp, h = s.t, s.tp, s.h
    cu, resid = (BF16 if bf16 else FP32), (BF16 if bf16 and fsdp else FP32)
    split = (2 * s.qd + 2 * s.kvd + 2 * s.f) // tp
    whole = 2 * h * (2 if tp > 1 else 1)
    rope = FP32 * s.T * (s.hd // 2) if bf16 and fsdp else 0
    return t * (resid * h + cu * (split + whole) + FP32 * (s.nh // tp)) + rope


def _block_saved_bytes(s: Shapes, bf16: bool, fsdp: bool, fused_norm: bool, recompute: str) -> int:
    """Bytes one block keeps from its forward to its backward under `recompute` (full: only its input)."""
    if recompute == Recompute.full:
        return (BF16 if bf16 and fsdp else FP32) * s.t * s.h
    if recompute == Recompute.selective:
        return _block_selective_bytes(s, bf16, fsdp)
    return _block_activation_bytes(s, bf16, fsdp, fused_norm)


@dataclass(frozen=True)
class _Phase:
    """What a phase of the step adds to (or frees from) the state and activations at the end of forward."""

    logits: float
    temps: float = 0
    comm: float = 0
    grads: float = 0
    freed: float = 0
    """Saved activations already released when the phase happens."""


def _phases(
    s: Shapes,
    dp: int,
    zero_stage: int,
    bf16: bool,
    top: str,
    grad_acc: int,
    accumulating: bool,
    head: float,
    fused_norm: bool = False,
) -> dict[str, _Phase]:
    """The candidate peaks of forward and backward, each relative to the memory at the end of forward; `top` is the
    recomputation of the top block (none when recompute_every leaves it out)."""
    fsdp = zero_stage >= ZeroStage.GRADIENTS
    t, h, V, cu = s.t, s.h, s.V, (BF16 if bf16 else FP32)
    tf, hf, th = t * s.f // s.tp, h * s.f // s.tp, t * h  # the MLP's width: its part on one tensor-parallel rank
    logits = (BF16 if bf16 else FP32) * t * V
    block_full = _block_activation_bytes(s, bf16, fsdp, fused_norm)
    top_saved = _block_saved_bytes(s, bf16, fsdp, fused_norm, top)
    full = top == Recompute.full
    phases = {
        # Logits, fp32 log-probabilities and both their gradients (bf16: the logits are bf16 and
        # cross-entropy works on an fp32 copy).
        "loss": _Phase(logits + 3 * FP32 * t * V if bf16 else 4 * FP32 * t * V),
        # The output weight's gradient exists in full before it reaches its bucket or shard.
        "output_backward": _Phase(2 * logits, temps=FP32 * V * h // s.tp + cu * th),
    }
    # Backward of the top block: the logits are still referenced by the step, the final norm's
    # tensors are freed; the SwiGLU backward adds (h, f) weight gradients and (t, f) input
    # gradients, recomputation the block's whole activations (selective: what it did not keep).
    if not bf16:
        scratch = (block_full + 4 * max(tf, hf) + 8 * th) if full else 4 * tf + 4 * max(tf, hf)
    else:
        scratch = (block_full + 2 * tf + 2 * th) if full else max(2 * tf + 2 * hf + 2 * th, 4 * hf)
    scratch += block_full - top_saved if top == Recompute.selective else 0
    if not fsdp:
        phases["block_backward"] = _Phase(logits, temps=scratch, freed=head)
        return phases
    # FSDP2: the root's unsharded gradients wait for the end of backward, a block's for its
    # reduce-scatter; accumulating unsharded, they already exist and backward adds into them.
    root_grads = 0 if accumulating else cu * s.root_params
    scratch += 0 if accumulating else cu * hf
    block_unsharded = cu * s.block_params
    regathered = block_unsharded if zero_stage == ZeroStage.PARAMETERS else 0
    phases["block_backward"] = _Phase(logits, temps=scratch, comm=regathered, grads=root_grads, freed=head)
    # End of a block's backward: its activations are freed, its gradients sit in the fp32
    # reduce-scatter buffer.
    phases["reduce_scatter"] = _Phase(
        logits, temps=FP32 * s.block_params, comm=regathered, grads=root_grads, freed=head + top_saved
    )
    if zero_stage == ZeroStage.PARAMETERS and s.L > 1:
        # The next block down: the one above is reduced (its gradient shard out, its
        # reduce-scatter buffer not yet released) while the one below is prefetched (none below block 0).
        block_sh, _ = sharded_params(s, dp)
        phases["next_block_backward"] = _Phase(
            logits,
            temps=scratch,
            grads=root_grads + (0 if grad_acc > 1 else FP32 * block_sh),
            comm=(2 if s.L > 2 else 1) * block_unsharded + FP32 * s.block_params,
            freed=head + top_saved,
        )
    return phases


def _end_of_backward(
    s: Shapes,
    dp: int,
    zero_stage: int,
    bf16: bool,
    grad_acc: int,
    gloo: bool,
    psi: int,
    params: float,
    grads: float,
    optimizer: float,
    overhead: float,
) -> list[MemoryBreakdown]:
    """FSDP2's last moments of a micro-step's backward, when every activation is freed and the step still holds the
    micro-step's logits:

    - `embedding_backward` (tied embeddings): the embedding's gradient is added to the one the output projection
      left on the shared weight, so both and their sum exist (3 x (V, h)), while the root is still gathered, the
      blocks' gradient shards are out and the last block's fp32 reduce-scatter input is still held (FSDP2 lets it go
      at the next reduce-scatter);
    - `root_reduce`: the root (embedding, final norm, output projection) reduce-scatters its gradients last
      (`foreach_reduce`), once resharded: an fp32 input of the root's padded size beside the unsharded gradients it
      copies in, then the fp32 output of its shard beside it, while an untied root's other (V, h) gradient is still
      referenced (the traced step shows it); on gloo (dp > 1) the collective reduces a copy of its whole input.

    ZeRO-2 keeps every parameter gathered until the last micro-step's backward: a micro-step before it ends beside
    them (from the third one on also beside the shards accumulated so far); the last one, and ZeRO-3's, beside the
    root's parameters only while they are gathered.
    """
    cu = BF16 if bf16 else FP32
    block_sh, root_sh = sharded_params(s, dp)
    root_padded, new_shards, vh = dp * root_sh, FP32 * s.L * block_sh, cu * s.V * s.h // s.tp
    logits = cu * s.t * s.V
    gloo_copy = FP32 * root_padded if gloo and dp > 1 else 0
    reduce = max(
        cu * s.root_params + FP32 * root_padded,
        FP32 * (root_padded + root_sh) + (0 if s.tied else vh) + gloo_copy,
    )
    embedding = 3 * vh + FP32 * s.block_params
    variants = [(0, grads if grad_acc > 1 else new_shards)]  # the last micro-step: the blocks resharded
    if zero_stage == ZeroStage.GRADIENTS and grad_acc > 1:
        variants.append((cu * psi, grads if grad_acc > 2 else new_shards))  # one before the last: all gathered
    ends = []
    for gathered, held_grads in variants:
        state = (int(held_grads), int(optimizer), 0, int(logits), 0)
        ends.append(MemoryBreakdown(int(params + gathered), *state, int(reduce), int(overhead), "root_reduce"))
        if s.tied:
            root = gathered or cu * s.root_params
            ends.append(
                MemoryBreakdown(int(params + root), *state, int(embedding), int(overhead), "embedding_backward")
            )
    return ends


def analytic_peak(
    model: ModelConfig,
    train: TrainConfig,
    parallel: ParallelConfig,
    hardware: HardwareConfig,
    grad_acc: int = 1,
) -> MemoryBreakdown:
    """Predicted peak bytes per rank of one training step of this project's model, by phase, at `grad_acc` micro-steps.

    The hardware decides three things: on CUDA AdamW steps every tensor in one fused kernel, with no scratch (the
    engine's choice), elsewhere one by one (see `adamw_scratch`); on CUDA RMSNorm runs torch's fused kernel, which
    keeps less for backward (see `_norm_saved_on_cpu_only`); on gloo the reduce-scatter works on a copy of its whole
    input."""
    a = model if isinstance(model, ModelArgs) else ModelArgs.of(model)
    seq_len, mbs, precision, recompute = train.seq_len, train.mbs, train.precision, train.recompute
    # `dp` below is the ranks a state is sharded over: dp, or dp_shard under hybrid sharding (the replicas hold copies)
    layout, fsdp_grad_reduce = parallel.layout, parallel.fsdp_grad_reduce
    dp, zero_stage = layout.shard_size, layout.zero_stage
    fused_optimizer = fused_norm = hardware.device == "cuda"
    gloo = hardware.backend == "gloo"
    if precision not in tuple(Precision):
        raise ValueError(f"train.precision={precision!r} is not valid: choose {' or '.join(Precision)}")
    if recompute not in tuple(Recompute):
        raise ValueError(f"train.recompute={recompute!r} is not valid: choose {' or '.join(Recompute)}")
    s = Shapes(
        a.n_layers,
        a.hidden,
        a.n_kv_heads * a.hd,
        a.ffn_hidden,
        a.n_heads,
        a.hd,
        a.vocab_size,
        a.tie_embeddings,
        seq_len,
        mbs,
        parallel.tp,
    )
    bf16, fsdp = precision == Precision.bf16, layout.fsdp
    checkpointed_n = checkpointed_blocks(s.L, train.recompute_every) if recompute != Recompute.none else 0
    top = recompute if checkpointed(s.L - 1, train.recompute_every) else Recompute.none
    psi, t, h, V = s.L * s.block_params + s.root_params, s.t, s.h, s.V  # a rank's part under tensor parallelism
    cu = BF16 if bf16 else FP32  # bytes of a weight's compute copy

    # Model state through forward and backward.
    accumulate_unsharded = fsdp and grad_acc > 1 and fsdp_grad_reduce == FsdpGradReduce.last_micro_step
    if not fsdp:
        params = FP32 * psi
        grads = FP32 * psi  # DDP's buckets; accumulation adds into them (gradients are views of the buckets)
        own_numel, own_tensors = zero1_worst_rank(s, dp) if zero_stage == ZeroStage.OPTIMIZER else (psi, s.n_tensors)
        optimizer = 2 * FP32 * own_numel + FP32 * own_tensors
        unsharded = 0
        step_grads = FP32 * psi
    else:
        block_sh, root_sh = sharded_params(s, dp)
        sharded = s.L * block_sh + root_sh
        params = FP32 * sharded
        # Accumulation: fp32 gradient shards from the first micro-step on (reduce-scatter every micro-step),
        # or whole unsharded gradients (fsdp_grad_reduce=last_micro_step).
        grads = 0 if grad_acc == 1 else FP32 * (psi if accumulate_unsharded else sharded)
        optimizer = 2 * FP32 * sharded + FP32 * s.n_tensors
        unsharded = cu * (psi if zero_stage == ZeroStage.GRADIENTS else s.root_params)
        step_grads = FP32 * sharded

    # Saved activations at the end of forward: the embedding output, every block, the final norm.
    resid = BF16 if (bf16 and fsdp) else FP32  # dtype of the residual stream
    block_saved = _block_saved_bytes(s, bf16, fsdp, fused_norm, recompute)
    block_plain = _block_activation_bytes(s, bf16, fsdp, fused_norm)
    head = t * (8 * h + 4) if not bf16 else t * (4 * h + 4) + BF16 * t * h
    head -= _norm_saved_on_cpu_only(s, bf16, fsdp) if fused_norm else 0  # the final norm
    head += BF16 * V * h if (bf16 and not fsdp) else 0  # autocast's bf16 copy of the output weight
    activations = resid * t * h + checkpointed_n * block_saved + (s.L - checkpointed_n) * block_plain + head
    overhead = 8 * mbs * (seq_len + 1) + FP32 * seq_len * s.hd + 64  # token ids, RoPE tables, scalars

    name, ph = max(
        _phases(s, dp, zero_stage, bf16, top, grad_acc, accumulate_unsharded, head, fused_norm).items(),
        key=lambda kv: kv[1].logits + kv[1].temps + kv[1].comm + kv[1].grads - kv[1].freed,
    )
    peak = MemoryBreakdown(
        params_bytes=int(params + unsharded),
        grads_bytes=int(grads + ph.grads),
        optimizer_bytes=int(optimizer),
        activations_bytes=int(activations - ph.freed),
        logits_bytes=int(ph.logits),
        comm_bytes=int(ph.comm),
        temporaries_bytes=int(ph.temps),
        overhead_bytes=int(overhead),
        phase=name,
    )
    # The optimizer step: weights, gradients, states and AdamW's scratch (`adamw_scratch`) in the order the rank
    # steps its tensors; the activations are gone. ZeroRedundancyOptimizer: the rank whose states and scratch
    # are largest together.
    if zero_stage == ZeroStage.OPTIMIZER:
        step_state = zero1_step_state(s.L, s.h, s.kvd, s.f, s.V, s.tied, dp, fused_optimizer, s.qd)
        scratch = step_state - optimizer  # the worst rank by elements is among them: never negative
    else:
        scratch = (
            0
            if fused_optimizer
            else FP32 * model_order_scratch(s.L, s.h, s.kvd, s.f, s.V, s.tied, dp if fsdp else 1, s.tp, s.qd)
        )
    if params + step_grads + optimizer + scratch + overhead > peak.total_bytes:
        peak = MemoryBreakdown(
            int(params), int(step_grads), int(optimizer), 0, 0, 0, int(scratch), int(overhead), "optimizer"
        )
    if fsdp and not accumulate_unsharded:  # last_micro_step with grad_acc > 1 holds whole gradients, counted above
        ends = _end_of_backward(s, dp, zero_stage, bf16, grad_acc, gloo, psi, params, grads, optimizer, overhead)
        peak = max([peak, *ends], key=lambda b: b.total_bytes)
    # DDP (stages 0-1) rebuilds its gradient buckets once, in the second step's forward, in the order the first
    # step's gradients came in: the new buckets are allocated while the gradients still live in the old ones.
    if not fsdp and params + 2 * grads + optimizer + overhead > peak.total_bytes:
        peak = MemoryBreakdown(
            int(params), int(grads), int(optimizer), 0, 0, 0, int(grads), int(overhead), "bucket_rebuild"
        )
    return peak


def predict_config(cfg: ExperimentConfig, grad_acc: Optional[int] = None) -> MemoryBreakdown:
    """`analytic_peak` of a point of the built-in family; grad_acc from scaling.core.validate unless given. A model
    the user brings has no closed form here: ValueError (scaling.predictor.trace predicts any model)."""
    if not family_of(cfg.model).closed_form:
        raise ValueError(
            f"model {cfg.model.name!r} ({cfg.model.source}) is not of the built-in family: the analytic predictor "
            "knows only its shapes; the traced predictor (scaling predict without --analytic) predicts any model"
        )
    if grad_acc is None:
        from scaling.core.validate import validate

        grad_acc = validate(cfg, host=False).grad_acc
    return analytic_peak(cfg.model, cfg.train, cfg.parallel, cfg.hardware, grad_acc)
