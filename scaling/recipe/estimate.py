"""Where a recipe row's figure comes from: a record measured at exactly the split, else the step model of the
candidate fitted on its measured points at the split's mbs (scaling.perf.extrapolation, under one network source), else, with
nothing measured at that mbs, a predicted figure (scaling.recipe.predicted)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from scaling.core.enums import Status
from scaling.core.layout import Layout
from scaling.core.schema import ExperimentConfig
from scaling.model.family import family_of
from scaling.model.shape import ModelShape
from scaling.perf.extrapolation import MISFIT_WARNING, Extrapolation, extrapolate, rate_band, wide_because
from scaling.perf.network import NetworkEstimate
from scaling.perf.step_model import Point, Workload, host_blocking_backend
from scaling.recipe.options import EXTRAPOLATED, MEASURED, Beyond, Candidate, Estimate, Split


def _matches(record: Mapping[str, Any], c: Candidate, mbs: int) -> bool:
    cfg = record["config"]
    return (
        record.get("status") == Status.OK
        and cfg["train"]["mbs"] == mbs
        and c.runs(Layout.of(cfg["parallel"]), cfg["train"]["recompute"])
    )


def measured_points(records: Sequence[Mapping[str, Any]], c: Candidate, mbs: int) -> list[Point]:
    """The ok records of a candidate at `mbs` as the step model's points (one per dp and grad_acc)."""
    points = {}
    for r in records:
        if _matches(r, c, mbs):
            m = r["metrics"]
            times = tuple(float(t) for t in (m.get("step_times_s") or [m["step_time_s"]]))
            dp = r["config"]["parallel"]["dp"]
            points[dp, r["derived"]["grad_acc"]] = Point(dp, r["derived"]["grad_acc"], times)
    return [points[k] for k in sorted(points)]


def measured_at(records: Sequence[Mapping[str, Any]], c: Candidate, s: Split) -> Optional[Estimate]:
    """The record of a candidate at exactly this split, as an estimate (its band: the record's noise band)."""
    for r in records:
        if _matches(r, c, s.mbs) and r["config"]["parallel"]["dp"] == s.dp and r["derived"]["grad_acc"] == s.grad_acc:
            m = r["metrics"]
            tps, band = float(m["tokens_per_s_per_gpu"]), float(m.get("noise_band_frac") or 0.0)
            return Estimate(
                tps,
                tps * (1 - band),
                tps * (1 + band),
                float(m["step_time_s"]),
                MEASURED,
                f"record {r['job_key']}",
                m.get("peak_mem_bytes"),
            )
    return None


@dataclass
class Model:
    """The step model of one candidate at one mbs, fitted on its measured points under one network source."""

    workload: Workload
    extrapolation: Optional[Extrapolation]
    source: str
    """The network source's label, or why there is no fit."""

    def estimate(self, dp: int, grad_acc: int) -> Optional[Estimate | Beyond]:
        """Tokens/s per GPU at `dp` and `grad_acc`, nominal and its band over the draws (None: the source has no
        figures for that many GPUs, or nothing was measured; Beyond: past the extrapolation's horizon)."""
        ex = self.extrapolation
        if ex is None or not ex.fit.network.reaches(self.workload.layout_at(dp).world_size):
            return None
        if not ex.within(dp):
            return Beyond(ex.horizon_reason)
        step, rate, lo, hi = rate_band(self.workload, ex.fit, ex.draws, dp, grad_acc)
        measured = ", ".join(str(d) for d in sorted(ex.measured))
        why = wide_because(self.workload, ex.fit, ex.draws, dp, grad_acc) if dp > max(ex.measured) else None
        detail = f"{self.source}; fitted on measured dp {measured}" + (f"; {why}" if why else "")
        if ex.misfit > MISFIT_WARNING:
            detail += f"; the fit misses the measured step times by up to {ex.misfit:.0%}"
        below = max((d for d in ex.measured if d < dp), default=None)
        if below is not None and rate > ex.measured[below]:
            # More data-parallel ranks on the same global batch never run faster per GPU in the step model (fewer
            # micro-steps to share each step's optimizer and collectives): a fit that says so misses the points.
            bound = ex.measured[below]
            detail += f"; at most dp={below}'s measured {bound:,.0f} (the fit gave {rate:,.0f})"
            scale = bound / rate  # the band's lower side kept in proportion; the measured figure its top
            step, lo, hi, rate = step / scale, lo * scale, bound, bound
        return Estimate(rate, lo, hi, step, EXTRAPOLATED, detail)


def fit_model(
    workload: Workload,
    points: Sequence[Point],
    devices_per_node: Optional[int],
    source: Optional[NetworkEstimate],
    n_draws: int,
) -> Model:
    """Fit one candidate's measured points under `source` ((a), the points alone, when None): those at a dp the
    target batch splits over in whole micro-steps (a point run at a rounded split measured another batch)."""
    label = source.label if source is not None else "fitted to the measured DP curve alone"
    points = [p for p in points if workload.grad_acc_at(p.dp) is not None]
    if not points:
        return Model(workload, None, "nothing measured")
    ex = extrapolate("recipe", workload, points, devices_per_node, source, n_draws=n_draws)
    return Model(workload, ex, label)


def workload_of(
    cfg: ExperimentConfig, c: Candidate, mbs: int, gbs_samples: int, model: Optional[ModelShape] = None
) -> Workload:
    """The step model's workload of a candidate at `mbs` under the config `cfg` (model, precision, clipping, ...);
    `model`: the model's shape where it is at hand (ModelFigures), else its family's (scaling.model.spec)."""
    t, p = cfg.train, cfg.parallel
    return Workload(
        c.layout.zero_stage,
        model if model is not None else family_of(cfg.model).shape(t.seq_len),
        str(t.precision),
        mbs,
        t.seq_len,
        gbs_samples,
        1,
        str(p.fsdp_grad_reduce),
        c.recompute,
        float(t.grad_clip),
        float(p.bucket_mb),
        c.layout.dp_shard,
        c.layout.tp,
        t.recompute_every,
        c.layout.pp,
        str(p.pp_schedule),
        p.pp_virtual,
        host_blocking_backend(cfg.hardware.backend),
    )


@dataclass
class FromRecords:
    """The recipe's estimator: a candidate's record at exactly the split when the store has one, else its step model
    fitted on its records at the split's mbs (one fit per candidate and mbs, under one network source)."""

    records: Sequence[Mapping[str, Any]]
    workload: Callable[[Candidate, int], Workload]
    """The step model's workload of a candidate at an mbs."""
    devices_per_node: Optional[int]
    source: Optional[NetworkEstimate]
    n_draws: int = 200
    fallback: Optional[Callable[[Candidate, Split], Optional[Estimate]]] = None
    """The figure of a candidate with no record at the split's mbs (scaling.recipe.predicted.Predicted), or None."""
    models: dict[tuple[Layout, str, int], Model] = field(default_factory=dict)
    """One fit per candidate (its whole layout and recompute setting: its identity) and mbs."""
    estimates: dict[tuple[Layout, str, Split], Optional[Estimate | Beyond]] = field(default_factory=dict)
    """Each candidate's figure at each split, worked out once: the rows, the baseline, the knee (twice with hybrid
    sharding) and every row's reasons ask for the same ones, and a predicted band is hundreds of step-model runs.
    The figure is a function of the records, the candidate's identity and the split alone (the draws are seeded),
    so it holds for this estimator's life; the records are not to change under it (a new list, a new estimator)."""

    def __call__(self, c: Candidate, s: Split) -> Optional[Estimate | Beyond]:
        key = (c.layout, c.recompute, s)
        if key not in self.estimates:
            self.estimates[key] = self._estimate(c, s)
        return self.estimates[key]

    def _estimate(self, c: Candidate, s: Split) -> Optional[Estimate | Beyond]:
        hit = measured_at(self.records, c, s)
        if hit is not None:
            return hit
        key = (c.layout, c.recompute, s.mbs)
        if key not in self.models:
            points = measured_points(self.records, c, s.mbs)
            self.models[key] = fit_model(
                self.workload(c, s.mbs), points, self.devices_per_node, self.source, self.n_draws
            )
        model = self.models[key]
        if model.extrapolation is None and self.fallback is not None:
            return self.fallback(c, s)
        return model.estimate(s.dp, s.grad_acc)
