"""The project's closed vocabularies, one enum each: a point's status, train.precision, train.recompute,
parallel.fsdp_grad_reduce and parallel.zero_stage.

The standard library only, and nothing of the project: core is the bottom layer, so every other layer
(engine, store, predictor, launch, job, sweep, cli, analysis, the plugins) may import this module. The enums
are str-valued (ZeroStage int-valued): a member equals, hashes and formats as its plain value, so f-strings,
json.dumps and pandas see `ok`, `bf16`, `2`, and records on disk hold plain strings and integers. The enums a config
field is typed with (Precision, Recompute, FsdpGradReduce) name their members by their values: Hydra takes a
member by name, so `train.precision=bf16` is the member and a wrong value is refused naming the valid ones.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class Status(str, Enum):
    """What became of an experiment point (DESIGN.md, Statuses); the order is the reports' order."""

    OK = "ok"
    OOM = "oom"
    """Measured out of memory."""
    PREDICTED_OOM = "predicted_oom"
    """Not launched: the pre-screen predicts it cannot fit."""
    TIMEOUT = "timeout"
    FAILED = "failed"
    """A crash, a hang, anything else: the record keeps the error's last line."""
    INVALID = "invalid"
    """An impossible configuration, rejected before any process starts."""

    __str__ = str.__str__


FINAL = frozenset({Status.OK, Status.OOM, Status.PREDICTED_OOM, Status.INVALID})
"""A re-run skips these; `failed` and `timeout` are retried only when asked (launch.rerun)."""
LAUNCHED = frozenset({Status.OK, Status.OOM, Status.TIMEOUT, Status.FAILED})
"""Statuses of points that ran torchrun: their wall time says what a launch costs."""


class Precision(str, Enum):
    """train.precision: the dtype of the compute (bf16 keeps fp32 master weights and optimizer states)."""

    fp32 = "fp32"
    bf16 = "bf16"

    __str__ = str.__str__


class Recompute(str, Enum):
    """train.recompute: activation recomputation of the decoder blocks (scaling.core.recompute: which, and what it
    runs again); the members in order of the work they recompute."""

    none = "none"
    selective = "selective"
    full = "full"

    __str__ = str.__str__


class FsdpGradReduce(str, Enum):
    """parallel.fsdp_grad_reduce: when ZeRO-2/3 reduce-scatter gradients under gradient accumulation."""

    every_micro_step = "every_micro_step"
    """Into fp32 gradient shards on every micro-step (ZeRO's semantics, the default)."""
    last_micro_step = "last_micro_step"
    """Once, on the last micro-step, accumulating unsharded gradients (4Ψ more memory per rank)."""

    __str__ = str.__str__


class PipelineSchedule(str, Enum):
    """parallel.pp_schedule: how a step's micro-batches flow through the pipeline stages (torch.distributed.pipelining's
    schedules); only read where parallel.pp > 1."""

    gpipe = "gpipe"
    """Every micro-batch forward, then every backward: all m micro-batches' activations held at once."""
    one_f_one_b = "one_f_one_b"
    """One forward, one backward in steady state: at most pp micro-batches in flight on the first stage."""
    interleaved_1f1b = "interleaved_1f1b"
    """1F1B over virtual stages (parallel.pp_virtual per rank): the bubble divided by them, more sends."""
    zero_bubble = "zero_bubble"
    """Interleaved zero-bubble (backward split into input and weight gradients), where torch offers it."""

    __str__ = str.__str__


class ZeroStage(IntEnum):
    """parallel.zero_stage: what data parallelism shards (scaling.engine.parallel)."""

    NONE = 0
    """Nothing: DDP."""
    OPTIMIZER = 1
    """Optimizer states: DDP + ZeroRedundancyOptimizer."""
    GRADIENTS = 2
    """Optimizer states and gradients: FSDP2, parameters kept gathered after forward."""
    PARAMETERS = 3
    """Optimizer states, gradients and parameters: FSDP2, parameters resharded after forward."""

    __str__ = int.__repr__
