"""The record's `metrics` block, typed (the `derived` block is scaling.core.derived's, typed from validation on), and
the analysis's columns of both: one field per figure, its unit in its name. The job writes them (scaling.job.run,
scaling.job.throughput) and the analysis, the report and W&B read their fields (analysis.collect takes its columns
from them), so a field added here is written and read. On disk they are JSON objects: `to_dict`
and `from_dict` cross that boundary. A field marked `COLUMN: None` stays in the record and out of the analysis's
table. Standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Optional

from scaling.core.derived import NOT_A_COLUMN, Derived, ParamTensors, nested_block
from scaling.core.field_meta import COLUMN


def derived_columns() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(column, path under the record's `derived`) of each field of Derived (and of its model) the table has."""
    return tuple(_columns(Derived, ()))


def _columns(kind: type, path: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    out = []
    for f in fields(kind):
        nested = nested_block(kind, f.name)
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
    pipeline_idle_frac_per_rank: Optional[list[float]] = None
    """With pipeline stages: each rank's share of the timed steps' schedule time it did not compute (waits on the other
    stages and the sends between them: the bubble as measured; the optimizer's step is outside it)."""
    peak_mem_stage: Optional[int] = None
    """With pipeline stages (parallel.pp > 1): the stage of the rank with the largest peak (Layout.stage_of); None
    at pp 1."""
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
