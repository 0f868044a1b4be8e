"""Typed configuration schema: one dataclass per config group (scaling.launch.resolvers registers it with Hydra's
ConfigStore), the `model` group's two kinds in scaling.core.model_group. Standard library only: every layer takes
these types, the ranks included, and JSON appears only where a config crosses a process or a file.

The groups model, train, parallel and hardware define an experiment (and its `job_key`); logger and launch say how
it is run. `config_fields` is the one definition of what a configuration is (the analysis's columns and axes).
A field added to an experiment group declares its neutral value (`metadata={NEUTRAL: ...}`, the value that changes
nothing measured before it existed), so every existing job key stays as it was (docs/record.md). Checks across
fields live in scaling.core.validate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, Mapping, Optional

from scaling.core.enums import FsdpGradReduce, PipelineSchedule, Precision, Recompute
from scaling.core.field_meta import COLUMN, GROUP, NEUTRAL, RUN_ONLY
from scaling.core.files import CONF_DIR as CONF_DIR  # where the shipped configs are, for schema's importers
from scaling.core.files import config_dirs
from scaling.core.layout import Layout
from scaling.core.model_group import ModelConfig, UnknownKey, model_dict, model_of, unknown_key

EXPERIMENT_GROUPS = ("model", "train", "parallel", "hardware")


def searchpath_override() -> str:
    """`hydra.searchpath=[...]` of `config_dirs` (Hydra looks in the primary config's directory first, then in these,
    in order)."""
    return "hydra.searchpath=[" + ",".join(f"file://{d}" for d in config_dirs()) + "]"


@dataclass
class DataConfig:
    """Where training tokens come from."""

    source: str = "synthetic"
    """`synthetic` (seeded random tokens) or `file` (a flat binary token file, memory-mapped)."""
    path: Optional[str] = None
    """Token file for `source: file`."""
    dtype: str = "uint16"
    """Element type of the token file: uint16 or int32."""


@dataclass
class TrainConfig:
    """What one short training run does."""

    seq_len: int = 64
    """Tokens per sample."""
    mbs: int = 2
    """Micro-batch size: samples per rank per forward/backward."""
    grad_acc: Any = 1
    """Gradient-accumulation steps (an int >= 1) or `auto` to derive it from gbs or gbs_tokens."""
    gbs: Optional[int] = field(default=None, metadata={COLUMN: "target_gbs"})
    """Global batch in samples; fixes grad_acc when grad_acc is `auto`."""
    gbs_tokens: Optional[int] = field(default=None, metadata={COLUMN: "target_gbs_tokens"})
    """Global batch in tokens (gbs x seq_len); fixes grad_acc when grad_acc is `auto`."""
    warmup_steps: int = field(default=3, metadata={RUN_ONLY: True})
    """Untimed optimizer steps before timing starts. On CPU at least 2: the last one is measured
    under the memory tracker, after a first step has created the optimizer states."""
    steps: int = field(default=8, metadata={RUN_ONLY: True})
    """Optimizer steps that are timed (their median is the step time, their spread the within-run noise)."""
    precision: Precision = Precision.fp32
    """fp32, or bf16 mixed precision (bf16 compute, fp32 master weights and optimizer states)."""
    recompute: Recompute = Recompute.none
    """Activation recomputation of the checkpointed blocks: `none`, `selective` (per op: matmul and attention outputs
    kept, the cheap ops between them run again in backward) or `full` (only each block's input kept)."""
    recompute_every: int = field(default=1, metadata={NEUTRAL: 1})
    """Checkpoint every k-th block (the k-th, 2k-th, ...; torchtitan's layer mode), 1: every block. Ignored at
    recompute=none. Neutral at 1 (the job key leaves it out): points recorded before the field existed checkpointed
    every block."""
    compile: bool = False
    """Wrap each decoder block with torch.compile."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = field(default=1.0, metadata={NEUTRAL: 0.0})
    """Clip the global gradient norm to this value before each optimizer step, as real runs do
    (`torch.nn.utils.clip_grad_norm_`, one all-reduce of the norm at ZeRO-2/3); 0 turns clipping off. Neutral at
    0 (the job key leaves it out): points recorded before the field existed ran without clipping."""
    seed: int = field(default=0, metadata={RUN_ONLY: True})
    """Seeds the initial weights and the data: step t's global batch is a function of (seed, t)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Token source."""
    fault: str = field(default="none", metadata={RUN_ONLY: True})
    """Fault injection for testing a sweep's resilience: none, crash, hang or oom (on the last rank, at its
    first step, while the other ranks go on into their first collective)."""


@dataclass
class ParallelConfig:
    """How the global batch and the model state are spread over ranks."""

    dp: int = 1
    """Data-parallel degree: the ranks that split the batch (the world is dp × tp × pp: scaling.core.layout)."""
    zero_stage: int = 0
    """0 plain DDP, 1 shards optimizer states, 2 also gradients, 3 also parameters."""
    bucket_mb: float = 25.0
    """DDP gradient bucket size in MiB (stages 0 and 1)."""
    tp: int = field(default=1, metadata={NEUTRAL: 1})
    """Tensor-parallel degree: each block's matmuls split over tp consecutive ranks (within a node) on DTensor plans,
    composed with ZeRO-2/3 over the dp groups; world size = dp × tp. 1: none, as before the field existed."""
    dp_shard: Optional[int] = field(default=None, metadata={NEUTRAL: None})
    """Ranks each ZeRO-1/2/3 shard spans: null (or dp) shards over every rank, as before the field existed; a divisor
    of dp shards within groups of that many consecutive ranks (within a node where it fits) and replicates across
    the dp / dp_shard groups: hybrid sharding (FSDP2's 2-D mesh, ZeRO++ hpZ)."""
    pp: int = field(default=1, metadata={NEUTRAL: 1})
    """Pipeline stages: the blocks split over pp ranks (across nodes; tp within), balanced by FLOPs, the embedding
    with the first stage and the norm and head with the last; world size = dp × tp × pp. 1: none, as before the field
    existed."""
    pp_schedule: PipelineSchedule = field(
        default=PipelineSchedule.one_f_one_b, metadata={NEUTRAL: PipelineSchedule.one_f_one_b}
    )
    """With pp > 1: the schedule (gpipe, one_f_one_b, interleaved_1f1b, zero_bubble); the step's micro-batches are its
    grad_acc micro-batches of mbs samples."""
    pp_virtual: int = field(default=1, metadata={NEUTRAL: 1})
    """Interleaved schedules: stages (model chunks) per pipeline rank; 1 otherwise."""
    fsdp_grad_reduce: FsdpGradReduce = FsdpGradReduce.every_micro_step
    """Stages 2-3 with grad_acc > 1: reduce-scatter gradients on every micro-step into shards (ZeRO's way,
    the default), or only on the last one, accumulating unsharded gradients (`last_micro_step`: 4Ψ more
    memory per rank, less communication)."""

    def __post_init__(self) -> None:
        if self.dp_shard == self.dp:  # sharding over every rank is full sharding: one experiment, one job key
            self.dp_shard = None

    @property
    def layout(self) -> Layout:
        """The point's parallel layout (scaling.core.layout): world size, shard group, name, identity."""
        return Layout.of(self)


@dataclass
class HardwareConfig:
    """The device a rank runs on and what it can do."""

    name: str = field(default="cpu", metadata={COLUMN: "hardware"})
    """Profile name: cpu, a100, h100, h200."""
    device: str = "cpu"
    """`cpu` or `cuda`."""
    backend: str = "gloo"
    """Collective backend: gloo (CPU) or nccl (CUDA)."""
    peak_tflops_bf16: Optional[float] = None
    """Dense bf16 peak per device in TFLOP/s; null means measure it once per host (CPU)."""
    peak_tflops_fp32: Optional[float] = None
    """Dense fp32 peak per device in TFLOP/s; null means measure it once per host (CPU)."""
    memory_gb: Optional[float] = None
    """Device memory per rank in GiB. On CUDA a value below the card's caps the process; on CPU
    it is an emulated capacity (exceeding it raises torch.OutOfMemoryError). null: no limit."""
    devices_per_node: Optional[int] = None
    """Accelerators per node; dp above it spans several nodes. null: one node (CPU)."""
    links_per_node: Optional[int] = field(default=None, metadata={NEUTRAL: None})
    """Inter-node links (NICs) a node's devices send through. null: one per device (rails, as on DGX/HGX nodes),
    so the rings of one collective that cross nodes at once never share a link. Below devices_per_node, the
    rings that run at once (a dp ring per tensor-parallel rank, hybrid sharding's replica ring per shard) share
    each link's bandwidth in the step model (scaling.perf.network.Network.flows)."""
    reserve_gb: float = 0.0
    """Device memory the tensors cannot use, in GiB: the CUDA context, NCCL's buffers and the allocator's
    slack. The pre-screen predicts against memory_gb - reserve_gb. 0 on CPU (nothing but tensors counts)."""
    threads_per_device: int = 1
    """CPU only: threads of one rank, pinned to cores of its own. One CPU rank stands for one GPU: a fixed
    compute unit, never a share of the host, so DP curves measure communication, not thread division."""
    oversubscribe: bool = False
    """CPU only: allow dp x threads_per_device above the usable cores (ranks then share cores; recorded
    and shown as oversubscribed). Without it such a point is invalid."""


@dataclass
class LoggerConfig:
    """Weights & Biases logging; the job's own result.json is written either way."""

    name: str = "none"
    """`none` or `wandb`."""
    project: str = "scaling"
    """W&B project (conf/logger/wandb.yaml: $WANDB_PROJECT, else scaling)."""
    entity: Optional[str] = None
    """W&B entity (team or user); null for the default (conf/logger/wandb.yaml: $WANDB_ENTITY)."""
    mode: str = "offline"
    """W&B mode: offline (default, nothing leaves the machine), online or disabled
    (conf/logger/wandb.yaml: $WANDB_MODE, else offline)."""
    dir: Optional[str] = None
    """Where W&B writes its files; null: the sweep directory."""


@dataclass
class LaunchConfig:
    """How a point is started; none of it changes what is measured, so none of it is in job_key."""

    timeout_s: float = 600.0
    """Wall-clock limit of one torchrun job; past it every rank is killed and the status is timeout."""
    collective_timeout_s: Optional[float] = None
    """The ranks' collective (process-group) timeout: a rank left waiting this long in a collective for a hung or
    dead peer fails with its own error, so the point ends as `timeout` before the driver's kill. null: half of
    timeout_s, at least 10 s. Set it below that to detect a hang in seconds; it must stay under timeout_s and above
    the longest a healthy rank waits for its peers (their model build, a slow first step)."""
    rerun: str = "none"
    """Which recorded points to run again: none, failed (failed and timeout) or all."""
    prescreen: bool = True
    """Skip points the memory predictor says cannot fit (status predicted_oom)."""
    prescreen_margin: float = 0.1
    """Safety margin of the pre-screen: skip only when predicted bytes > (1 + margin) x capacity."""
    prescreen_sample: float = 0.0
    """Fraction of the points the pre-screen would skip that run anyway (chosen by job key, so the same
    ones on every re-run), to measure how often the pre-screen is wrong; their record says `predicted.sampled`."""
    devices: Optional[str] = None
    """CUDA_VISIBLE_DEVICES for this point (partitioning one node between concurrent points)."""
    master_port: Optional[int] = None
    """Rendezvous port for torchrun; null: a free port is picked."""
    repeats: int = 1
    """Independent launches of the point (a fresh torchrun each), all kept in its one record; its
    figures are the median over them with their spread. A point with fewer ok launches is not done."""
    reuse: bool = False
    """Warm ranks: points of one shape (world size, hardware, devices) run one after another on the same ranks
    of one torchrun job, each built, warmed up, measured and freed on its own (scaling.launch.warm); repeats
    then run on the same ranks too. Off: every launch is a fresh torchrun."""
    reuse_idle_s: float = 30.0
    """A warm job with no new point for this long ends and gives its devices back (at once when another process
    waits for them); one whose devices another process has waited this long for gives them back after its turn."""
    lease_wait_s: Optional[float] = 3600.0
    """Longest wait for what another driver holds: the point's devices, or the point itself (its claim); past it the
    point is not run and not recorded (the run exits 1 naming it; a re-run runs it), and the message names the holder
    (pid, command, since when). null: no limit."""
    stalled_wait_s: Optional[float] = 120.0
    """Longest wait behind a holder that lives but has stalled (its process stopped, or its claim's heartbeat 30 s
    old): past it a stopped holder's CPU slot is run beside (a stopped process uses no core; on CUDA its memory stays
    taken, so the point is not run), and a stalled claim's point is not run (the run exits 1 naming the holder).
    null: as lease_wait_s."""
    memory_snapshot: bool = False
    """On CUDA, rank 0 records the caching allocator's history (every allocation with its Python stack) from the
    build to the end of the warm-up steps and writes it to <job_dir>/memory_snapshot.pickle, for
    https://pytorch.org/memory_viz or `make gpu-check`'s part (f). The timed steps run after the recording
    stops; the build and the warm-up run slower. Nothing on CPU, where the record has the tracker's breakdown."""


@dataclass
class ExperimentConfig:
    """The primary config: one experiment point and how to run it."""

    model: Any = field(default=None, metadata={GROUP: ModelConfig})
    """A model config of either kind (scaling.core.model_group.ModelGroup: the built-in family's, or the user's module
    or an HF config); None: ModelConfig().
    Typed Any for Hydra, so that a model file with `_target_` and its own keys composes; the built-in presets
    take ModelConfig's schema in their defaults list (`/llama_schema@_here_`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    sweep: str = "adhoc"
    """Sweep name: the W&B group and the folder under `runs/`."""
    sweep_dir: str = "runs/${sweep}"
    """Where this sweep's records go: <sweep_dir>/<job_key>/result.json."""

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> ExperimentConfig:
        """The typed config of a resolved plain one (what Hydra composes, a job's config.json, or a record's
        experiment groups: the groups and fields it lacks take their defaults); a key the schema lacks raises
        UnknownKey (a TypeError). A subclass (a schema with a field added) reads its own fields."""
        return _build(cls, cfg)

    def __post_init__(self) -> None:
        if self.model is None:
            self.model = ModelConfig()
        elif isinstance(self.model, Mapping):
            self.model = model_of(self.model)

    def to_dict(self) -> dict[str, Any]:
        """The plain config, for a file or another process (`from_dict` reads it back to an equal config)."""
        return {**asdict(self), "model": model_dict(self.model)}

    def experiment(self) -> dict[str, dict[str, Any]]:
        """The groups that define what is measured (model, train, parallel, hardware), as plain dicts: the
        record's `config` and what `job_key` hashes."""
        return {
            group: model_dict(self.model) if group == "model" else asdict(getattr(self, group))
            for group in EXPERIMENT_GROUPS
        }

    def changed(self, **groups: Mapping[str, Any]) -> ExperimentConfig:
        """A copy with some fields of some groups set, e.g. `c.changed(train={"mbs": 2}, parallel={"dp": 4})`;
        a field the group lacks raises TypeError."""
        return replace(self, **{group: replace(getattr(self, group), **values) for group, values in groups.items()})


class ConfigRefused(BaseException):
    """The command line composes no config the schema takes (an unknown config choice, key or override): one line,
    and `scaling` exits 2 before anything runs. A BaseException, as scaling.core.files.StoreUnwritable is: Hydra takes
    a job's Exception for that job's failure (a traceback, exit 1) and goes on with the next, which would fail alike."""


def _build(kind: type, values: Mapping[str, Any], where: str = "") -> Any:
    """The dataclass `kind` of a plain dict, its nested groups (fields made by a dataclass default_factory) built too;
    UnknownKey for a key `kind` lacks (`where`: the group's dotted name)."""
    nested = {f.name: f.default_factory for f in fields(kind) if is_dataclass(f.default_factory)}
    known = {f.name for f in fields(kind)}
    for name in values:
        if name not in known:
            if where:
                raise unknown_key(where, name, known)
            raise UnknownKey(f"{name} is not a config group or field: they are {', '.join(sorted(known))}")
    # the model group: a mapping that __post_init__ turns into the kind its keys say (model_group.model_of)
    return kind(
        **{
            name: _build(nested[name], value, f"{where}.{name}" if where else name)
            if name in nested and isinstance(value, Mapping)
            else value
            for name, value in values.items()
        }
    )


def without_neutral(values: Mapping[str, Any], group: type) -> dict[str, Any]:
    """A config group's values (plain dict) less the fields of the dataclass `group` that are at their declared
    NEUTRAL value, nested groups (a dataclass built by default_factory, as train.data) included."""
    out = dict(values)
    for f in fields(group):
        if f.name not in out:
            continue
        if NEUTRAL in f.metadata and out[f.name] == f.metadata[NEUTRAL]:
            del out[f.name]
        elif is_dataclass(f.default_factory) and isinstance(out[f.name], dict):
            out[f.name] = without_neutral(out[f.name], f.default_factory)
    return out


@dataclass(frozen=True)
class ConfigField:
    """One field of the experiment config as the analysis sees it: its column and where the record keeps it."""

    column: str
    """Column name: the field's name, a nested group's field prefixed (`data_source`), or its COLUMN metadata."""
    path: tuple[str, ...]
    """Keys under the record's `config`: (group, field) or (group, field, nested field)."""
    type: str
    """The annotation as written (`int`, `Optional[float]`, ...)."""
    neutral: Any
    """What a record without the field measured (its NEUTRAL metadata), else None."""
    axis: bool
    """A configuration axis: every field but the run-only ones (dp and grad_acc are axes that split a batch)."""


def _fields_of(group: type, path: tuple[str, ...], prefix: str) -> list[ConfigField]:
    out = []
    for f in fields(group):
        if is_dataclass(f.default_factory):
            out += _fields_of(f.default_factory, (*path, f.name), f"{prefix}{f.name}_")
            continue
        column = f.metadata.get(COLUMN, prefix + f.name)
        neutral = f.metadata.get(NEUTRAL)
        out.append(ConfigField(column, (*path, f.name), str(f.type), neutral, not f.metadata.get(RUN_ONLY, False)))
    return out


def config_fields() -> tuple[ConfigField, ...]:
    """Every field of the experiment groups (EXPERIMENT_GROUPS), in schema order: the one definition of what a
    configuration is, from which the analysis takes its columns, axes and DP-scaling groups."""
    types = group_types()
    return tuple(c for group in EXPERIMENT_GROUPS for c in _fields_of(types[group], (group,), ""))


def group_types(schema: type | None = None) -> dict[str, type]:
    """The dataclass of each group of `schema` (default ExperimentConfig): its default_factory, or its GROUP metadata
    (the model group: the built-in family's ModelConfig)."""
    return {
        f.name: f.metadata.get(GROUP, f.default_factory)
        for f in fields(schema or ExperimentConfig)
        if GROUP in f.metadata or is_dataclass(f.default_factory)
    }


BATCH_SPLIT = ("dp", "grad_acc")
"""The axes that split one global batch: what DP scaling varies inside a configuration."""
