"""Validation in one place: is this experiment point possible, and what does it derive to?

`validate(cfg)` runs before any process starts. An impossible point raises `InvalidConfig`, whose
message names each offending field, its value and what would be valid; the job records it as
status `invalid`. A possible point returns its derived block (scaling.core.derived.Derived: the batch arithmetic and
the world; the job adds the model's counts).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from scaling.core.batch import (
    BatchError,
    derive_grad_acc,
    nodes_needed,
    target_gbs_samples,
)
from scaling.core.derived import Derived
from scaling.core.enums import FsdpGradReduce, PipelineSchedule, Precision, Recompute, ZeroStage
from scaling.core.host import usable_cores as host_cores
from scaling.core.model_group import HF_TARGET, CustomModel, ModelConfig
from scaling.core.recompute import every_error
from scaling.core.schema import (
    ExperimentConfig,
    HardwareConfig,
    ParallelConfig,
    TrainConfig,
)

DEVICES = ("cpu", "cuda")
BACKENDS = {"cpu": ("gloo",), "cuda": ("nccl", "gloo")}
DATA_SOURCES = ("synthetic", "file")
TOKEN_DTYPES = ("uint16", "int32")
FAULTS = ("none", "crash", "hang", "oom")
LOGGERS = ("none", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
RERUN = ("none", "failed", "all")
INTERLEAVED = (PipelineSchedule.interleaved_1f1b, PipelineSchedule.zero_bubble)
"""The pipeline schedules whose ranks each hold parallel.pp_virtual stages."""


class InvalidConfig(ValueError):
    """An impossible experiment point; str() is one line naming field, value and valid choices."""

    def __init__(self, errors: list[str], alone: Sequence[str] = ()):
        self.errors = errors
        # those of `errors` about a value wrong whatever the other fields hold (parallel.zero_stage=4, train.mbs=0):
        # what a search refuses of its space before any trial (hydra_plugins/scaling_optuna_sweeper)
        self.alone = list(alone)
        super().__init__("; ".join(errors))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Checker:
    """Collects every problem of a config instead of stopping at the first."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.alone: list[str] = []  # those of `positive` and `choice`: a value wrong whatever the other fields hold

    def require(self, ok: bool, message: str, alone: bool = False) -> bool:
        if not ok:
            self.errors.append(message)
            if alone:
                self.alone.append(message)
        return ok

    def positive(self, name: str, value: Any, *, allow_none: bool = False, integer: bool = True) -> bool:
        if value is None and allow_none:
            return True
        kind = "a positive integer" if integer else "a positive number"
        good = _is_int(value) if integer else isinstance(value, (int, float)) and not isinstance(value, bool)
        said = f"{name}={value!r} must be {kind}" + (" or null" if allow_none else "")
        return self.require(good and value > 0, said, alone=True)

    def choice(self, name: str, value: Any, valid: tuple) -> bool:
        said = f"{name}={value!r} is not valid: choose one of {', '.join(map(str, valid))}"
        return self.require(value in valid, said, alone=True)


def _check_train(c: _Checker, t: TrainConfig, max_seq_len: Any, n_blocks: Optional[int], whence: str = "") -> None:
    if c.positive("train.seq_len", t.seq_len) and _is_int(max_seq_len):
        c.require(
            t.seq_len <= max_seq_len,
            f"train.seq_len={t.seq_len} exceeds model.max_seq_len={max_seq_len}{whence}: use seq_len <= {max_seq_len}",
        )
    c.positive("train.mbs", t.mbs)
    ga = t.grad_acc
    c.require(ga == "auto" or (_is_int(ga) and ga >= 1), f"train.grad_acc={ga!r} must be an integer >= 1 or 'auto'")
    c.positive("train.gbs", t.gbs, allow_none=True)
    c.positive("train.gbs_tokens", t.gbs_tokens, allow_none=True)
    c.require(
        _is_int(t.warmup_steps) and t.warmup_steps >= 0,
        f"train.warmup_steps={t.warmup_steps!r} must be an integer >= 0",
    )
    c.positive("train.steps", t.steps)
    c.choice("train.precision", t.precision, tuple(Precision))
    c.choice("train.recompute", t.recompute, tuple(Recompute))
    error = every_error(t.recompute_every, n_blocks)
    c.require(error is None, error or "")
    c.positive("train.lr", t.lr, integer=False)
    c.require(t.weight_decay >= 0, f"train.weight_decay={t.weight_decay!r} must be >= 0")
    c.require(
        t.grad_clip >= 0,
        f"train.grad_clip={t.grad_clip!r} must be >= 0 (the largest gradient norm "
        "an optimizer step keeps; 0 turns clipping off)",
    )
    c.choice("train.fault", t.fault, FAULTS)
    data = t.data
    if c.choice("train.data.source", data.source, DATA_SOURCES) and data.source == "file":
        path = data.path
        c.require(
            bool(path) and os.path.isfile(str(path)),
            f"train.data.path={path!r} is not a readable file: give a flat binary token file for source=file",
        )
        c.choice("train.data.dtype", data.dtype, TOKEN_DTYPES)


def _check_parallel(c: _Checker, p: ParallelConfig, per_node: Any) -> None:
    c.positive("parallel.dp", p.dp)
    c.choice("parallel.zero_stage", p.zero_stage, tuple(ZeroStage))
    c.positive("parallel.bucket_mb", p.bucket_mb, integer=False)
    c.choice("parallel.fsdp_grad_reduce", p.fsdp_grad_reduce, tuple(FsdpGradReduce))
    if p.dp_shard is not None and c.positive("parallel.dp_shard", p.dp_shard, allow_none=True) and _is_int(p.dp):
        _check_dp_shard(c, p, per_node)


def _check_dp_shard(c: _Checker, p: ParallelConfig, per_node: Any) -> None:
    """Hybrid sharding: a divisor of dp, a stage that shards, groups that do not straddle nodes."""
    divisors = [d for d in range(1, p.dp + 1) if p.dp % d == 0]
    if not c.require(
        p.dp_shard <= p.dp and p.dp % p.dp_shard == 0,
        f"parallel.dp_shard={p.dp_shard} does not divide parallel.dp={p.dp}: try dp_shard in "
        f"{{{', '.join(map(str, divisors))}}} (dp or null: full sharding)",
    ):
        return
    c.require(
        p.zero_stage != ZeroStage.NONE,
        f"parallel.dp_shard={p.dp_shard} with parallel.zero_stage=0: ZeRO-0 shards nothing; dp_shard applies to "
        "ZeRO-1, 2 and 3 (or leave it null)",
    )
    if _is_int(per_node) and per_node > 0 and p.dp > per_node:
        c.require(
            per_node % p.dp_shard == 0 or p.dp_shard % per_node == 0,
            f"parallel.dp_shard={p.dp_shard}: a shard group of {p.dp_shard} consecutive ranks would straddle nodes "
            f"of hardware.devices_per_node={per_node}: use a divisor of {per_node} (within a node) or a multiple "
            f"of it (whole nodes)",
        )


def _check_tp(c: _Checker, cfg: ExperimentConfig) -> None:
    """Tensor parallelism: a degree that splits every head and width, within a node, on a stage that composes."""
    tp, m, per_node = cfg.parallel.tp, cfg.model, cfg.hardware.devices_per_node
    c.require(
        cfg.parallel.zero_stage >= ZeroStage.GRADIENTS,
        f"parallel.tp={tp} with parallel.zero_stage={cfg.parallel.zero_stage}: tensor parallelism composes with "
        "ZeRO-2 and 3 (FSDP2 over the dp groups); DDP (ZeRO-0, 1) takes no DTensor parameters: use zero_stage 2 or 3",
    )
    if _is_int(per_node) and per_node > 0:
        c.require(
            tp <= per_node and per_node % tp == 0,
            f"parallel.tp={tp}: a tensor-parallel group stays within a node of hardware.devices_per_node={per_node}: "
            f"try tp in {{{', '.join(str(d) for d in range(1, per_node + 1) if per_node % d == 0)}}}",
        )
    m.check_tp(c, tp)


def _check_pp(c: _Checker, cfg: ExperimentConfig) -> None:
    """Pipeline stages: a model whose forward is cut between blocks, at least one block per stage, virtual stages only
    where the schedule interleaves, and the data parallelism torch's stages compose with."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    pp, schedule, virtual = p.pp, p.pp_schedule, p.pp_virtual
    if not c.choice("parallel.pp_schedule", schedule, tuple(PipelineSchedule)) or not c.positive(
        "parallel.pp_virtual", virtual
    ):
        return
    interleaved = PipelineSchedule(schedule) in INTERLEAVED
    if interleaved:
        c.require(
            virtual > 1 or PipelineSchedule(schedule) == PipelineSchedule.zero_bubble,
            f"parallel.pp_virtual={virtual} with parallel.pp_schedule={schedule}: interleaving needs pp_virtual > 1 "
            "stages per rank (or use one_f_one_b)",
        )
    else:
        c.require(
            virtual == 1,
            f"parallel.pp_virtual={virtual} with parallel.pp_schedule={schedule}: virtual stages need an interleaved "
            f"schedule ({', '.join(s.value for s in INTERLEAVED)}); valid: pp_virtual=1",
        )
    if isinstance(m, ModelConfig):  # a model one brings is checked once built (scaling.model.family.checked)
        stages = pp * (virtual if interleaved else 1)
        if _is_int(m.n_layers) and m.n_layers > 0:
            fits = [d for d in range(1, m.n_layers + 1) if d * (virtual if interleaved else 1) <= m.n_layers]
            c.require(
                stages <= m.n_layers,
                f"parallel.pp={pp}" + (f" x parallel.pp_virtual={virtual}" if interleaved else "") + f" = {stages} "
                f"stages but model.n_layers={m.n_layers} blocks: each stage holds at least one block; try pp <= "
                f"{max(fits) if fits else 1}",
            )
        c.require(
            not m.tie_embeddings,
            f"model.tie_embeddings=true with parallel.pp={pp}: the embedding (first stage) and the head (last stage) "
            "would share one weight across stages; use tie_embeddings=false or pp=1",
        )
    c.require(
        p.dp_shard is None or p.dp_shard == p.dp,
        f"parallel.dp_shard={p.dp_shard} with parallel.pp={pp}: hybrid sharding is not run under pipeline stages "
        "here; use dp_shard=null (full sharding within each stage)",
    )
    if p.zero_stage in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        c.require(
            p.fsdp_grad_reduce == FsdpGradReduce.last_micro_step,
            f"parallel.fsdp_grad_reduce={p.fsdp_grad_reduce} with parallel.pp={pp} and zero_stage={p.zero_stage}: "
            "torch's pipeline stages reduce-scatter FSDP2 gradients once, after the step's last backward; set "
            "parallel.fsdp_grad_reduce=last_micro_step (what runs)",
        )
    if PipelineSchedule(schedule) == PipelineSchedule.zero_bubble:
        c.require(
            not t.compile,
            "train.compile=true with parallel.pp_schedule=zero_bubble: torch's zero-bubble schedules split each "
            "backward into input and weight parts, which compiled blocks do not; use compile=false or one_f_one_b",
        )


def pipeline_stages(p: ParallelConfig) -> int:
    """The pipeline stages a point splits its blocks into: pp, times pp_virtual under an interleaved schedule."""
    return p.pp * (p.pp_virtual if p.pp > 1 and PipelineSchedule(p.pp_schedule) in INTERLEAVED else 1)


def _check_microbatches(c: _Checker, p: ParallelConfig, grad_acc: int) -> None:
    """What torch's schedules ask of a step's micro-batches (its grad_acc): 1F1B at least one per stage, the
    interleaved ones a whole number of rounds (rounds = max(1, grad_acc // pp))."""
    pp, schedule = p.pp, PipelineSchedule(p.pp_schedule)
    if schedule == PipelineSchedule.one_f_one_b:
        c.require(
            grad_acc >= pp,
            f"train.grad_acc={grad_acc} with parallel.pp={pp} and pp_schedule=one_f_one_b: 1F1B runs at least one "
            f"micro-batch per stage; use grad_acc >= {pp} (or pp_schedule=gpipe)",
        )
    elif schedule in INTERLEAVED:
        rounds = max(1, grad_acc // pp)
        valid = [m for m in range(1, 2 * grad_acc + 1) if m % max(1, m // pp) == 0]
        c.require(
            grad_acc % rounds == 0,
            f"train.grad_acc={grad_acc} with parallel.pp={pp} and pp_schedule={schedule.value}: the interleaved "
            f"schedule runs max(1, grad_acc // pp) = {rounds} rounds of equal micro-batches; try grad_acc in "
            f"{{{', '.join(map(str, valid[-6:]))}}}",
        )


def _check_hardware(c: _Checker, hw: HardwareConfig, precision: Any) -> None:
    if c.choice("hardware.device", hw.device, DEVICES):
        c.choice("hardware.backend", hw.backend, BACKENDS[hw.device])
    if c.positive("hardware.memory_gb", hw.memory_gb, allow_none=True, integer=False) and hw.memory_gb:
        c.require(
            0 <= hw.reserve_gb < hw.memory_gb,
            f"hardware.reserve_gb={hw.reserve_gb!r} must be >= 0 and below hardware.memory_gb={hw.memory_gb!r}",
        )
    per_node = c.positive("hardware.devices_per_node", hw.devices_per_node, allow_none=True)
    if c.positive("hardware.links_per_node", hw.links_per_node, allow_none=True) and per_node:
        c.require(
            hw.links_per_node is None or (hw.devices_per_node is not None and hw.links_per_node <= hw.devices_per_node),
            f"hardware.links_per_node={hw.links_per_node} must be null (one link per device) or between 1 and "
            f"hardware.devices_per_node={hw.devices_per_node}: a node has no more links than devices that use them",
        )
    c.positive("hardware.threads_per_device", hw.threads_per_device)
    for key in ("peak_tflops_bf16", "peak_tflops_fp32"):
        c.positive(f"hardware.{key}", getattr(hw, key), allow_none=True, integer=False)
    if hw.device == "cuda" and precision in tuple(Precision):
        key = f"peak_tflops_{precision}"
        c.require(getattr(hw, key) is not None, f"hardware.{key}=null: a CUDA profile needs its peak TFLOP/s for MFU")


def _check_kernels(c: _Checker, cfg: ExperimentConfig) -> None:
    """CUDA runs attention only on fused kernels (scaling.engine.kernels): refuse what none of them runs."""
    m, precision = cfg.model, cfg.train.precision
    if cfg.hardware.device == "cuda" and precision == Precision.fp32 and m.grouped_query:
        c.errors.append(
            f"train.precision=fp32 on hardware.device=cuda with grouped-query attention (model.n_kv_heads="
            f"{m.n_kv_heads} < model.n_heads={m.n_heads}): no fused attention kernel runs it in fp32 (flash "
            "and cuDNN need bf16, memory-efficient attention has no GQA), and the math kernel would hold a "
            "seq_len x seq_len matrix per head: use train.precision=bf16"
        )


def _check_cores(c: _Checker, cfg: ExperimentConfig, usable_cores: int) -> None:
    """On CPU every rank of a node is a device of threads_per_device cores of its own."""
    hw, layout = cfg.hardware, cfg.parallel.layout
    world = layout.world_size
    if hw.device != "cpu" or hw.oversubscribe:
        return
    per_node = hw.devices_per_node
    ranks = min(world, per_node) if per_node else world
    threads = hw.threads_per_device
    ranks_of = layout.ranks(total=False)
    fit = usable_cores // threads
    largest = (
        f"the largest dp that fits is {fit // layout.model_parallel}"
        if fit >= layout.model_parallel
        else f"one dp rank alone is {layout.model_parallel} ranks (its model-parallel degrees), and {fit} fit"
    )
    c.require(
        ranks * threads <= usable_cores,
        f"{ranks_of} x hardware.threads_per_device={threads} = {ranks * threads} threads on one host "
        f"but this host has {usable_cores} usable cores: {largest} (or set hardware.oversubscribe=true to let ranks "
        "share cores; the record and the report then say so)",
    )


def _check_run(c: _Checker, cfg: ExperimentConfig) -> None:
    log, launch = cfg.logger, cfg.launch
    c.choice("logger.name", log.name, LOGGERS)
    c.choice("logger.mode", log.mode, WANDB_MODES)
    if c.positive("launch.timeout_s", launch.timeout_s, integer=False) and c.positive(
        "launch.collective_timeout_s", launch.collective_timeout_s, integer=False, allow_none=True
    ):
        c.require(
            launch.collective_timeout_s is None or launch.collective_timeout_s < launch.timeout_s,
            f"launch.collective_timeout_s={launch.collective_timeout_s!r} must be below launch.timeout_s="
            f"{launch.timeout_s!r} (a rank waiting on a hung peer must fail before the point is killed), or null",
        )
    c.choice("launch.rerun", launch.rerun, RERUN)
    c.require(
        0 <= launch.prescreen_sample <= 1,
        f"launch.prescreen_sample={launch.prescreen_sample!r} must be a fraction in [0, 1]",
    )
    c.positive("launch.repeats", launch.repeats)
    c.positive("launch.reuse_idle_s", launch.reuse_idle_s, integer=False)
    c.positive("launch.lease_wait_s", launch.lease_wait_s, integer=False, allow_none=True)
    c.require(
        0 <= launch.prescreen_margin < 10,
        f"launch.prescreen_margin={launch.prescreen_margin!r} must be in [0, 10)",
    )


def _derive(c: _Checker, cfg: ExperimentConfig) -> Derived | None:
    t, p, hw = cfg.train, cfg.parallel, cfg.hardware
    seq, mbs, dp, ga = t.seq_len, t.mbs, p.dp, t.grad_acc
    try:
        if ga == "auto":
            gbs = target_gbs_samples(seq, t.gbs, t.gbs_tokens)
            ga = derive_grad_acc(gbs, mbs, dp)
        else:
            gbs = mbs * ga * dp
            if t.gbs is not None or t.gbs_tokens is not None:
                target = target_gbs_samples(seq, t.gbs, t.gbs_tokens)
                c.require(
                    target == gbs,
                    f"train.grad_acc={ga} gives gbs = mbs x grad_acc x dp = {mbs} x {ga} x {dp} = "
                    f"{gbs} samples, but train.gbs/gbs_tokens ask for {target}: set train.grad_acc=auto",
                )
    except BatchError as e:
        c.errors.append(str(e))
        return None
    try:
        nnodes = nodes_needed(p.layout.world_size, hw.devices_per_node)
    except ValueError as e:
        c.errors.append(str(e))
        return None
    return Derived(gbs=gbs, gbs_tokens=gbs * seq, grad_acc=ga, world_size=p.layout.world_size, nnodes=nnodes)


def validate(cfg: ExperimentConfig, usable_cores: Optional[int] = None, host: bool = True) -> Derived:
    """Check a config; return its derived layout or raise InvalidConfig.

    With `host`, a CPU point must also fit this host: `usable_cores` (default: this process's CPU
    affinity) hold dp x threads_per_device. The memory predictors, which need only the batch layout of
    a point that may run elsewhere, pass host=False.
    """
    c = _Checker()
    cfg.model.check(c)  # its kind's own checks (scaling.core.model_group)
    n_layers = getattr(cfg.model, "n_layers", None)  # the built-in family's; a model one brings: once counted
    m = cfg.model
    whence = (
        f" (the model file's, else max_position_embeddings of its hf_config={m.kwargs.get('config')!r})"
        if isinstance(m, CustomModel) and m.target == HF_TARGET
        else ""
    )
    _check_train(c, cfg.train, m.max_seq_len, n_layers if _is_int(n_layers) else None, whence)
    _check_parallel(c, cfg.parallel, cfg.hardware.devices_per_node)
    if cfg.parallel.tp != 1 and c.positive("parallel.tp", cfg.parallel.tp):
        _check_tp(c, cfg)
    if cfg.parallel.pp != 1 and c.positive("parallel.pp", cfg.parallel.pp):
        _check_pp(c, cfg)
    _check_hardware(c, cfg.hardware, cfg.train.precision)
    _check_run(c, cfg)
    if c.errors:
        raise InvalidConfig(c.errors, c.alone)
    derived = _derive(c, cfg)
    if derived is not None and cfg.parallel.pp > 1:
        _check_microbatches(c, cfg.parallel, derived.grad_acc)
    _check_kernels(c, cfg)
    if host:
        _check_cores(c, cfg, usable_cores if usable_cores is not None else host_cores())
    if c.errors or derived is None:
        raise InvalidConfig(c.errors, c.alone)
    return derived
