"""The record's `derived` and `metrics` blocks, typed: one field per figure, its unit in its name. The job writes them
(scaling.job.run, scaling.job.throughput) and the analysis, the report and W&B read their fields (analysis.collect
takes its columns from them), so a field added here is written and read. On disk they are JSON objects: `to_dict`
and `from_dict` cross that boundary. A field marked `COLUMN: None` stays in the record and out of the analysis's
table. Standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Mapping, Optional, get_args, get_type_hints

from scaling.core.field_meta import COLUMN

NOT_A_COLUMN = {COLUMN: None}


@dataclass(kw_only=True)
class ParamTensors:
    """A model's parameter tensors in `parameters()` order, one entry per tensor in each list (what the step model's
    collectives are made of: scaling.model.shape.ModelShape.from_record)."""

    module: list[str]
    """`root` or `block` (scaling.model.shape.ROOT, BLOCK): the FSDP2 module that holds it."""
    rows: list[int]
    """Its dim 0 (what FSDP2 shards)."""
    cols: list[int]
    """The product of its other dims."""


@dataclass(kw_only=True)
class DerivedModel:
    """What a model the user brings is, counted on fake tensors (the built-in family's follows from its config)."""

    name: str = field(metadata=NOT_A_COLUMN)
    source: str = field(metadata=NOT_A_COLUMN)
    """What builds it: the target's dotted path."""
    block: str = field(metadata=NOT_A_COLUMN)
    """The block class's name."""
    n_blocks: int
    init: Optional[str] = field(default=None, metadata=NOT_A_COLUMN)
    """What initialised it: its init_weights(), its own __init__ run for real, or reset_parameters()."""
    attention: Optional[str] = field(default=None, metadata=NOT_A_COLUMN)
    """A Hugging Face model's attention implementation."""
    config_hash: str = field(metadata=NOT_A_COLUMN)
    """A hash of its config (two models of one name differ)."""
    param_tensors: ParamTensors


@dataclass(kw_only=True)
class Derived:
    """What a valid point's config implies: the batch arithmetic, the world, the model's size and FLOPs per token."""

    gbs: int
    """Global batch in samples: mbs × grad_acc × dp."""
    gbs_tokens: int
    """gbs × seq_len."""
    grad_acc: int
    """Gradient-accumulation steps (`auto` resolved)."""
    world_size: int
    """Ranks (devices): dp × tp (scaling.core.schema.ParallelConfig.world_size)."""
    nnodes: int = field(default=1, metadata=NOT_A_COLUMN)
    """Nodes the ranks span (hardware.devices_per_node)."""
    n_params: int
    """Distinct parameters (a tied weight once)."""
    flops_per_token: float
    """Model FLOPs per trained token, forward and backward: the numerator of MFU."""
    hw_flops_per_token: float
    """The same with recomputation counted: the numerator of HFU."""
    flops_source: Optional[str] = field(default=None, metadata=NOT_A_COLUMN)
    """`counted` for a model the user brings (None: the built-in family's closed form)."""
    uncounted_ops: Optional[list[str]] = field(default=None, metadata=NOT_A_COLUMN)
    """Matmul-like operators the FLOP counter has no formula for (their FLOPs are missing from MFU)."""
    model: Optional[DerivedModel] = None
    """A model the user brings (None: the built-in family)."""

    def to_dict(self) -> dict[str, Any]:
        """The block as the record holds it (what is None is left out, as in records written before it was typed)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Derived:
        """A block read back (keys it does not know are left out)."""
        return _typed(cls, data)


def _nested(kind: type, name: str) -> Optional[type]:
    """The dataclass a field of `kind` holds (Optional or not), None for a plain value."""
    hint = get_type_hints(kind)[name]
    return next((t for t in (get_args(hint) or (hint,)) if is_dataclass(t)), None)


def _typed(kind: type, data: Mapping[str, Any]) -> Any:
    """The dataclass `kind` of a plain dict, nested blocks typed too; keys it does not know are left out."""
    out = {}
    for f in fields(kind):
        if f.name in data:
            nested, value = _nested(kind, f.name), data[f.name]
            out[f.name] = _typed(nested, value) if nested is not None and isinstance(value, Mapping) else value
    return kind(**out)


def derived_columns() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(column, path under the record's `derived`) of each field of Derived (and of its model) the table has."""
    return tuple(_columns(Derived, ()))


def _columns(kind: type, path: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    out = []
    for f in fields(kind):
        nested = _nested(kind, f.name)
        if nested is not None and nested is not ParamTensors:  # the tensors are one column: a dict of lists
            out += _columns(nested, (*path, f.name))
        elif f.metadata.get(COLUMN, 1):
            out.append((f.metadata.get(COLUMN, f.name), (*path, f.name)))
    return out


@dataclass(kw_only=True)
class Metrics:
    """Throughput, efficiency and memory of a point (or of one of its launches), with their noise."""

    tokens_per_s: float
    """gbs_tokens / the median step time (timed steps only)."""
    tokens_per_s_per_gpu: float
    """tokens_per_s / world_size."""
    mfu: float
    """flops_per_token × tokens_per_s_per_gpu / peak_flops_per_s."""
    hfu: float
    """As mfu, with the hardware's FLOPs (recomputation counted)."""
    peak_flops_per_s: float
    """The peak MFU divides by: the hardware profile's, or measured on this host (CPU)."""
    peak_flops_source: Optional[str] = None
    """`config`, `measured` or `cache`."""
    peak_flops_measured_at: Optional[str] = None
    """When a measured peak was measured."""
    peak_flops_spread: Optional[float] = field(default=None, metadata=NOT_A_COLUMN)
    """The measured peak's spread."""
    step_time_s: float
    """The median timed step (over launches: the median of their medians)."""
    step_times_s: list[float]
    """Every timed step, of every launch in order."""
    step_time_spread_frac: float
    """Within a launch: the relative half-range of its timed steps (over launches: their median)."""
    repeat_spread_frac: Optional[float] = None
    """Across launches: the relative half-range of their tokens/s per GPU; None for one launch."""
    noise_band_frac: float
    """The larger of the two: the band within which two figures are not told apart."""
    repeats_ok: int = 1
    """Ok launches behind the figures."""
    tokens_per_s_per_gpu_repeats: list[float] = field(default_factory=list)
    """Each ok launch's tokens/s per GPU."""
    warmup_step_times_s: list[float] = field(default_factory=list, metadata=NOT_A_COLUMN)
    """The untimed warm-up steps (the first launch's)."""
    compile_s: Optional[float] = field(default=None, metadata=NOT_A_COLUMN)
    """With train.compile: the first warm-up step's excess over a timed step."""
    recompiles_after_warmup: Optional[int] = field(default=None, metadata=NOT_A_COLUMN)
    """Compiled graphs made during the timed steps (0 when compile settled in the warm-up)."""
    measured_window_s: float = field(default=0.0, metadata=NOT_A_COLUMN)
    """Wall time of the timed steps (summed over launches)."""
    peak_mem_bytes: int
    """The largest rank's peak (the headline)."""
    peak_mem_bytes_per_rank: list[int]
    """Each rank's peak: CUDA's max allocated over the training steps, or live tensor bytes under the tracker."""
    peak_mem_source: Optional[str] = None
    """What measured the peak: `cuda_max_memory_allocated` or `mem_tracker`."""
    peak_mem_reserved_bytes: Optional[int] = None
    """CUDA's max reserved bytes; None on CPU."""
    peak_mem_reserved_bytes_per_rank: Optional[list[int]] = field(default=None, metadata=NOT_A_COLUMN)
    device_used_bytes: Optional[int] = field(default=None, metadata=NOT_A_COLUMN)
    """Bytes in use on the CUDA device after the last step; None on CPU."""
    device_used_bytes_per_rank: Optional[list[int]] = field(default=None, metadata=NOT_A_COLUMN)
    build_peak_mem_bytes: Optional[int] = field(default=None, metadata=NOT_A_COLUMN)
    """Peak bytes of building the model (recorded apart from the steps')."""
    build_peak_mem_bytes_per_rank: Optional[list[int]] = field(default=None, metadata=NOT_A_COLUMN)
    peak_rss_growth_bytes: Optional[int] = None
    """Growth of peak resident memory over the steps (an independent measure beside the tracker's)."""
    peak_rss_growth_bytes_per_rank: Optional[list[int]] = None
    optimizer_state_bytes_per_rank: Optional[list[int]] = field(default=None, metadata=NOT_A_COLUMN)
    num_ooms: int = field(default=0, metadata=NOT_A_COLUMN)
    """CUDA allocator out-of-memory events, summed over ranks and launches."""
    num_alloc_retries: int = field(default=0, metadata=NOT_A_COLUMN)
    """CUDA allocator retries after freeing its cache, summed over ranks and launches."""
    peak_mem_breakdown_rank0: Optional[dict[str, Any]] = field(default=None, metadata=NOT_A_COLUMN)
    """Rank 0's peak by what holds it (the tracker's categories, CPU)."""
    losses: list[float] = field(default_factory=list)
    """One per optimizer step (the first launch's: the data is seeded)."""
    grad_norms: Optional[list[float]] = field(default=None, metadata=NOT_A_COLUMN)
    """The global gradient norm before clipping, one per optimizer step; None with clipping off."""
    rows_built_in_timed_window: Optional[int] = field(default=None, metadata=NOT_A_COLUMN)
    """Data rows built during the timed steps: 0, every batch is built before the window."""
    final_param_norm: Optional[float] = field(default=None, metadata=NOT_A_COLUMN)
    """The weights' norm after the last step (the same for every split of one batch)."""

    def to_dict(self) -> dict[str, Any]:
        """The block as the record holds it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        """A block read back (keys it does not know are left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def metric_columns() -> tuple[tuple[str, str], ...]:
    """(column, annotation) of each field the analysis's table has, in order."""
    return tuple((f.metadata.get(COLUMN, f.name), str(f.type)) for f in fields(Metrics) if f.metadata.get(COLUMN, 1))
