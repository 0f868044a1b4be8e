"""Peak memory per pipeline stage (parallel.pp > 1): each stage's share of the weights, gradients and optimizer states
(its blocks by scaling.core.stages.split_blocks, the embedding with the first stage, the final norm and head with the
last) and the activations of the micro-batches its schedule keeps in flight (1F1B: pp − s on stage s; GPipe: all of
them; interleaved: torch's warm-up count). The same per-token terms as the whole step's (scaling.predictor.analytic);
at pp 1 the whole step's own prediction. What each schedule keeps and why: docs/memory.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Optional

from scaling.core.enums import PipelineSchedule, Precision, Recompute, ZeroStage
from scaling.core.recompute import checkpointed
from scaling.core.schema import ExperimentConfig, HardwareConfig, ModelConfig, ParallelConfig, TrainConfig
from scaling.core.stages import split_blocks
from scaling.model.llama.args import ModelArgs, param_shapes_of
from scaling.model.llama.flops import stage_costs
from scaling.predictor.analytic import (
    MemoryBreakdown,
    _block_activation_bytes,
    _block_saved_bytes,
    _norm_saved_on_cpu_only,
    _phases,
    analytic_peak,
    predict_config,
)
from scaling.predictor.model_state import BF16, FP32, Shapes, adamw_scratch, local_shapes, shard

INTERLEAVED = (PipelineSchedule.interleaved_1f1b, PipelineSchedule.zero_bubble)
"""Schedules with several model chunks (virtual stages) per pipeline rank."""


def in_flight(schedule: PipelineSchedule | str, pp: int, rank: int, microbatches: int, virtual: int = 1) -> float:
    """Micro-batches whose activations pipeline rank `rank` holds at its peak, in units of its whole model part (a
    chunk of an interleaved schedule is 1/virtual of it): GPipe all m (every forward before any backward); 1F1B
    min(pp − rank, m) (torch's Schedule1F1B warms up that many forwards, then alternates one backward, one forward);
    interleaved 1F1B (and zero-bubble, charged the same) torch's warm-up of (v − 1)·m_round + 2·(pp − 1 − rank)
    chunk forwards plus the first steady-state one, capped at m·v chunks (ScheduleInterleaved1F1B)."""
    m = microbatches
    if pp <= 1:
        return 1.0
    if PipelineSchedule(schedule) == PipelineSchedule.gpipe:
        return float(m)
    if PipelineSchedule(schedule) in INTERLEAVED:
        per_round = m // max(1, m // pp)
        warmup = min((virtual - 1) * per_round + 2 * (pp - 1 - rank), m * virtual)
        return min(warmup + 1, m * virtual) / virtual
    return float(min(pp - rank, m))


def stage_blocks(a: ModelArgs, seq_len: int, stages: int) -> list[range]:
    """The blocks of each of `stages` stages (pp × virtual stages for interleaved schedules, in stage order): the
    engine's own split (the built-in family's `stages`: scaling.model.llama.flops.stage_costs over
    scaling.core.stages.split_blocks)."""
    blocks, first, last = stage_costs(a, seq_len)
    return _split(blocks[0], len(blocks), first, last, stages)


@functools.lru_cache(maxsize=1024)
def _split(block: float, n_blocks: int, first: float, last: float, stages: int) -> list[range]:
    # kept: the recipe's mbs search asks the same split at every mbs and GPU count (the blocks cost alike)
    return split_blocks([block] * n_blocks, stages, first, last)


@dataclass(frozen=True)
class StageMemory:
    """One pipeline rank's predicted peak: its blocks, the micro-batches it keeps in flight and the breakdown."""

    rank: int
    """The pipeline rank (stage index at one chunk per rank)."""
    blocks: tuple[int, ...]
    """The decoder blocks it holds (every chunk's under an interleaved schedule)."""
    in_flight: float
    """Micro-batches of activations held at the peak (`in_flight`)."""
    breakdown: MemoryBreakdown

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON: the breakdown's fields with the stage's."""
        first, last = (self.blocks[0], self.blocks[-1]) if self.blocks else (None, None)
        return {
            "stage": self.rank,
            "blocks": f"{first}-{last}",
            "in_flight": self.in_flight,
            **self.breakdown.as_dict(),
        }


def stage_peaks(
    model: ModelConfig | ModelArgs,
    train: TrainConfig,
    parallel: ParallelConfig,
    hardware: HardwareConfig,
    grad_acc: int = 1,
) -> list[StageMemory]:
    """Each pipeline rank's predicted peak bytes per GPU, first to last (one entry, the whole step, at pp 1).

    A stage's state is that of its own parameters, sharded as the whole model's is (ZeRO over its dp ranks, tp within
    a node); its activations are `in_flight` micro-batches of its blocks' saved tensors, its input (the embedding's
    output on the first stage, the received activations elsewhere) and, on the last, the final norm's; the last stage
    adds the loss's logits phase, the others one block's backward scratch and the received gradient. Tied embeddings
    are held twice under pp (the first stage's embedding, the last's head). The micro-batches are grad_acc."""
    a = model if isinstance(model, ModelArgs) else ModelArgs.of(model)
    pp, virtual = parallel.pp, (parallel.pp_virtual if parallel.pp_schedule in INTERLEAVED else 1)
    if pp <= 1:
        return [StageMemory(0, tuple(range(a.n_layers)), 1.0, analytic_peak(a, train, parallel, hardware, grad_acc))]
    chunks = stage_blocks(a, train.seq_len, pp * virtual)
    return [
        _stage_peak(a, train, parallel, hardware, grad_acc, rank, [chunks[rank + pp * v] for v in range(virtual)])
        for rank in range(pp)
    ]


def _stage_peak(
    a: ModelArgs,
    train: TrainConfig,
    parallel: ParallelConfig,
    hardware: HardwareConfig,
    grad_acc: int,
    rank: int,
    chunks: list[range],
) -> StageMemory:
    layout, pp = parallel.layout, parallel.pp
    dp, zero_stage, tp = layout.shard_size, layout.zero_stage, parallel.tp
    bf16, fsdp, fused = train.precision == Precision.bf16, layout.fsdp, hardware.device == "cuda"
    first, last = rank == 0 and 0 in chunks[0], any(r.stop == a.n_layers for r in chunks)
    blocks = [i for r in chunks for i in r]
    kvd = a.n_kv_heads * a.hd
    # tied=True: a root of one (V, h) matrix and the norm, as the last stage's head is (the first's has no norm)
    s = Shapes(
        len(blocks),
        a.hidden,
        kvd,
        a.ffn_hidden,
        a.n_heads,
        a.hd,
        a.vocab_size,
        True,
        train.seq_len,
        train.mbs,
        tp,
    )
    h, V, t, cu = s.h, s.V, s.t, (BF16 if bf16 else FP32)
    # The stage's tensors as one tp rank holds them: the embedding first, its blocks, the final norm and head last.
    one = local_shapes(param_shapes_of(1, h, kvd, a.ffn_hidden, V, False, a.q_dim), tp)
    tensors = ([one[0]] if first else []) + list(one[1:10]) * len(blocks) + (list(one[10:]) if last else [])
    psi = sum(rows * cols for _, _, rows, cols in tensors)
    own = [shard(rows, cols, dp) if fsdp else rows * cols for _, _, rows, cols in tensors]
    if zero_stage == ZeroStage.OPTIMIZER:  # ZeroRedundancyOptimizer: about a dp-th of the stage's states
        optimizer = 2 * FP32 * -(-psi // dp) + FP32 * -(-len(tensors) // dp)
    else:
        optimizer = 2 * FP32 * sum(own) + FP32 * len(tensors)
    root = (V * h // tp if first else 0) + ((V * h // tp + h) if last else 0)
    if fsdp:
        params = FP32 * sum(own) + cu * (psi if zero_stage == ZeroStage.GRADIENTS else root + 2 * s.block_params)
        grads, step_grads = (FP32 * sum(own) if grad_acc > 1 else 0), FP32 * sum(own)
    else:
        params, grads, step_grads = FP32 * psi, FP32 * psi, FP32 * psi
    scratch = 0 if fused else FP32 * adamw_scratch(own)

    # Activations of one micro-batch on this rank: its input, each block's saved tensors, the final norm's on the last.
    resid = BF16 if (bf16 and fsdp) else FP32
    head = (t * (8 * h + 4) if not bf16 else t * (4 * h + 4) + BF16 * t * h) if last else 0
    head -= _norm_saved_on_cpu_only(s, bf16, fsdp) if (fused and last) else 0
    head += BF16 * V * h // tp if (bf16 and not fsdp and last) else 0
    per_block = [
        _block_saved_bytes(s, bf16, fsdp, fused, train.recompute)
        if train.recompute != Recompute.none and checkpointed(i, train.recompute_every)
        else _block_activation_bytes(s, bf16, fsdp, fused)
        for i in blocks
    ]
    per_micro = len(chunks) * resid * t * h + sum(per_block) + head
    held = in_flight(parallel.pp_schedule, pp, rank, grad_acc, len(chunks))
    activations = held * per_micro

    top_block = blocks[-1]
    top = train.recompute if checkpointed(top_block, train.recompute_every) else Recompute.none
    phases = _phases(s, dp, zero_stage, bf16, top, grad_acc, False, head, fused)
    if not last:  # no logits: one block's backward beside the gradient received from the next stage
        grads_of_root = cu * root if fsdp else 0  # the embedding's unsharded gradient waits for the end of backward
        phases = {
            "block_backward": replace(phases["block_backward"], logits=resid * t * h, grads=grads_of_root, freed=0)
        }
    name, ph = max(phases.items(), key=lambda kv: kv[1].logits + kv[1].temps + kv[1].comm + kv[1].grads - kv[1].freed)
    overhead = 8 * train.mbs * (train.seq_len + 1) + FP32 * train.seq_len * s.hd + 64
    peak = MemoryBreakdown(
        int(params),
        int(grads + ph.grads),
        int(optimizer),
        int(activations - ph.freed),
        int(ph.logits),
        int(ph.comm),
        int(ph.temps),
        int(overhead),
        f"stage {rank}: {name}",
    )
    if params + step_grads + optimizer + scratch + overhead > peak.total_bytes:
        at = f"stage {rank}: optimizer"
        peak = MemoryBreakdown(int(params), int(step_grads), int(optimizer), 0, 0, 0, int(scratch), int(overhead), at)
    return StageMemory(rank, tuple(blocks), held, peak)


def fullest_stage(stages: list[StageMemory]) -> StageMemory:
    """The stage whose peak is largest (the first of equals): the one that decides whether the point fits."""
    return max(stages, key=lambda st: st.breakdown.total_bytes)


NO_STAGES = "a pipeline stage's memory is predicted for the built-in family only (the traced predictor runs no stages)"
"""Why a pipelined point of a model of another family has no predicted memory (scaling predict, the recipe)."""


def require_stage_predictor(cfg: ExperimentConfig, command: str) -> None:
    """Refuse (InvalidConfig) a pipelined point whose model the stage predictor does not describe: `command`
    (scaling predict, find-mbs) has nothing to answer it with."""
    from scaling.core.validate import InvalidConfig
    from scaling.model.family import family_of

    if cfg.parallel.pp > 1 and not family_of(cfg.model).closed_form:
        raise InvalidConfig(
            [
                f"parallel.pp={cfg.parallel.pp} with model {cfg.model.name!r}: {NO_STAGES}; {command} it at "
                "parallel.pp=1, or run the point (scaling run), which measures each stage's peak"
            ]
        )


def predict_stages(cfg: ExperimentConfig, grad_acc: Optional[int] = None) -> list[StageMemory]:
    """`stage_peaks` of a point of the built-in family; grad_acc from `micro_batches` unless given."""
    grad_acc = micro_batches(cfg) if grad_acc is None else grad_acc
    return stage_peaks(cfg.model, cfg.train, cfg.parallel, cfg.hardware, grad_acc)


def micro_batches(cfg: ExperimentConfig) -> int:
    """A pipelined point's micro-batches per step: its grad_acc, from the batch split of the same point at pp 1
    (scaling.core.validate; the split of the batch over dp and micro-steps does not depend on pp)."""
    from scaling.core.validate import validate

    return validate(cfg.changed(parallel={"pp": 1}), host=False).grad_acc


def predict_peak(cfg: ExperimentConfig, grad_acc: Optional[int] = None) -> MemoryBreakdown:
    """A point's predicted peak per GPU: `predict_config`'s, or with pipeline stages that of the fullest stage (the
    one the pre-screen, find-mbs and the recipe judge)."""
    if cfg.parallel.pp > 1:
        return fullest_stage(predict_stages(cfg, grad_acc)).breakdown
    return predict_config(cfg, grad_acc)
