"""A recipe row before anything is measured at its micro-batch: `predicted` from the model's FLOPs split through the
hardware's MFU model, and the network's figures through the step model.

    compute per micro-step = the MFU model's (scaling.perf.mfu_model: fitted to conf/mfu/<hardware>.yaml and the
    user's own records on that hardware) or FLOPs / (--assume-mfu · peak);  step(n) = the step model at dp=n

The band draws the compute from the MFU model's spread at that configuration, the overlap below what the engine's
schedule hides (`step_model.scheduled_overlap`), the network's draws and the model form past two nodes
(scaling.perf.extrapolation); a row says what its compute rests on, how far it lies from the fitted points and,
where the band is wide, which unknown makes it so. A measured or extrapolated figure replaces it as soon as the store
has records (scaling.recipe.estimate). docs/recipe.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from scaling.core.enums import Status
from scaling.core.layout import Layout
from scaling.core.model_group import ModelGroup, model_of
from scaling.core.recompute import recomputed_share
from scaling.core.schema import ExperimentConfig
from scaling.engine.peak_flops import configured_peak_flops_per_s
from scaling.model.family import family_of
from scaling.model.shape import Counted, ModelShape
from scaling.perf.dp_fit import Fit
from scaling.perf.extrapolation import WIDE, Draw, ModelForm, model_form, rate_band
from scaling.perf.mfu_model import MEASURED_SIGMA, FlopsSplit, Measured, MfuModel, Work, conf_points, fit
from scaling.perf.mfu_model import Estimate as Compute
from scaling.perf.network import NetworkEstimate
from scaling.perf.step_model import Workload, scheduled_overlap
from scaling.recipe.options import PREDICTED, Candidate, Estimate, Split
from scaling.recipe.request import RecipeRequest

ASSUMED_SPREAD = 0.05
"""The σ (relative) of `--assume-mfu` where the hardware has no MFU model to take the spread from."""
OVERLAP_LOSS = 0.3
"""Up to this share of what the engine's schedule could hide stays exposed (collective kernels share the device's
SMs and memory with the compute, and a late issue delays a prefetch): the band draws the overlap uniformly between
(1 − OVERLAP_LOSS) × the scheduled one and the scheduled one, the nominal figure takes the middle."""


def own_points(records: Sequence[Mapping[str, Any]], hardware: str) -> list[Measured]:
    """The user's records measured on one device of `hardware` as points of its MFU model (but selective recomputation
    run eagerly: its host cost is no term of the model, scaling.perf.mfu_model.SELECTIVE_EAGER)."""
    out = []
    for r in records:
        cfg = r.get("config") or {}
        if r.get("status") != Status.OK or (cfg.get("hardware") or {}).get("name") != hardware:
            continue
        if Layout.of(cfg["parallel"]).world_size != 1:  # one device running the whole model
            continue
        work = record_work(r)
        if work.selective and not work.compile:  # a host cost the model has no term for (mfu_model.SELECTIVE_EAGER)
            continue
        m = r["metrics"]
        sigma = max(MEASURED_SIGMA, float(m.get("noise_band_frac") or 0.0))
        out.append(
            Measured(work, int(r["derived"]["grad_acc"]), float(m["step_time_s"]), sigma, f"record {r['job_key']}")
        )
    return out


def record_work(r: Mapping[str, Any]) -> Work:
    """A record's micro-step as the MFU model's work: its FLOPs (`record_flops`), tokens, ZeRO stage, recomputation
    and compile."""
    t, p = r["config"]["train"], r["config"]["parallel"]
    tokens, every = int(t["mbs"]) * int(t["seq_len"]), t.get("recompute_every", 1)
    return Work.of(
        record_flops(r), tokens, int(p["zero_stage"]), t["recompute"], every, t.get("compile"), int(t["seq_len"])
    )


def record_flops(r: Mapping[str, Any]) -> FlopsSplit:
    """A record's FLOPs split: its family's count where that is in closed form (the built-in decoder's, from its
    config.model), else the figures counted when it ran (its attention not told apart from its matmuls)."""
    family, d = family_of(model_of(r["config"]["model"])), r["derived"]
    if family.closed_form:
        return FlopsSplit.of(family.counted(r["config"]["train"]["seq_len"]))
    blocks, t = (d.get("model") or {}).get("n_blocks") or 1, r["config"]["train"]
    share = recomputed_share(t["recompute"], int(t.get("recompute_every", 1)), blocks)  # of full recomputation's
    recomputed = (d["hw_flops_per_token"] - d["flops_per_token"]) / share if share else 0.0
    block = (d.get("model") or {}).get("block") or "an unnamed block"
    return FlopsSplit(d["flops_per_token"], 0.0, recomputed, 0.0, blocks, d["n_params"], block)


def mfu_model(hardware: str, precision: str, peak: float, records: Sequence[Mapping[str, Any]]) -> Optional[MfuModel]:
    """The MFU model of `hardware` in `precision`: conf/mfu/<hardware>.yaml's points (when measured in it) and the
    user's records on it at dp=1 (None: neither)."""
    points, optimizer, _ = conf_points(hardware, peak, precision=precision, counted=counted)
    points += own_points([r for r in records if r["config"]["train"].get("precision") == precision], hardware)
    return fit(hardware, peak, points, optimizer) if points else None


def counted(model: ModelGroup, seq_len: int) -> Counted:
    """A model's size and FLOPs at a sequence length, as its family counts them."""
    return family_of(model).counted(seq_len)


def flops_split(cfg: ExperimentConfig) -> FlopsSplit:
    """The FLOPs split of the config's model, as its family counts it."""
    return FlopsSplit.of(counted(cfg.model, cfg.train.seq_len))


@dataclass
class Predicted:
    """The recipe's figure of a candidate with nothing measured at its mbs: the step model with the compute of the
    MFU model (or of an assumed MFU), the overlap the engine schedules, the network's figures."""

    workload: Callable[[Candidate, int], Workload]
    """The step model's workload of a candidate at an mbs."""
    work: Callable[[Candidate, int], Work]
    """What one micro-step of a candidate at an mbs computes (its FLOPs split, tokens, stage, recompute)."""
    peak_flops_per_s: float
    network: NetworkEstimate
    model: Optional[MfuModel]
    assume_mfu: Optional[float] = None
    optimizer_s_per_param: float = 0.0
    n_draws: int = 200
    seed: int = 0

    def compute(self, c: Candidate, mbs: int) -> tuple[Compute, str]:
        """A micro-step's compute on one rank with its spread, and what it rests on in words. Under tensor
        parallelism a rank runs 1/tp of each matmul's columns or rows: as many FLOPs as a micro-step of 1/tp the
        tokens, and the efficiency of matmuls that narrow, so it is estimated as that micro-step (every layer's
        fixed cost still paid). Under pipeline stages, a stage's share of it (`_per_stage`)."""
        w = self.work(c, mbs)
        if c.layout.tp > 1:  # pipeline stages split the layers, not the tokens: a stage's share of the step below
            w = dataclasses.replace(w, tokens=max(1, w.tokens // c.layout.tp))
        fitted = self.model.estimate(w) if self.model is not None else None
        if self.assume_mfu is None and fitted is not None and self.model is not None:
            return _per_stage(fitted, c.layout.pp), f"{self.model.describe()}; {fitted.distance}"
        if self.assume_mfu is None:
            raise ValueError("a predicted figure needs an MFU model of the hardware or --assume-mfu")
        seconds = w.flops.model * w.tokens / (self.assume_mfu * self.peak_flops_per_s)
        sigma = fitted.sigma if fitted is not None else ASSUMED_SPREAD
        spread = "the MFU model's spread there" if fitted is not None else f"σ {ASSUMED_SPREAD:.0%}"
        computed = Compute(seconds, sigma, self.assume_mfu, "")
        return _per_stage(computed, c.layout.pp), f"--assume-mfu {self.assume_mfu:g} ({spread})"

    def __call__(self, c: Candidate, s: Split) -> Optional[Estimate]:
        w = self.workload(c, s.mbs)
        if not self.network.nominal.reaches(c.layout.with_dp(s.dp).world_size):  # a dp ring tp apart spans them all
            return None
        compute, basis = self.compute(c, s.mbs)
        scheduled = scheduled_overlap(w, s.dp, s.grad_acc)
        k = self.optimizer_s_per_param
        nominal = Fit(compute.seconds, k, scheduled * (1 - OVERLAP_LOSS / 2), self.network.nominal)
        two_nodes = 2 * (self.network.nominal.devices_per_node or 1)
        step, rate, lo, hi = rate_band(w, nominal, self._draws(compute, scheduled, two_nodes), s.dp, s.grad_acc)
        detail = (
            f"nothing measured at this mbs: compute {compute.seconds:.3g} s a micro-step, MFU "
            f"{compute.mfu:.1%} ± {compute.sigma:.0%} from {basis}; overlap {nominal.overlap:.2f} (the engine's "
            f"schedule hides up to {scheduled:.2f}); network: {self.network.label}"
        )
        half = (hi - lo) / 2 / rate
        why = functools.partial(self._why_wide, w, nominal, compute, scheduled, s, half) if half > WIDE else None
        return Estimate(rate, min(lo, rate), max(hi, rate), step, PREDICTED, detail, why_wide=why)

    def _why_wide(self, w: Workload, nominal: Fit, compute: Compute, scheduled: float, s: Split, half: float) -> str:
        """Which of UNKNOWNS makes a band of half-width `half` wide: the band with that one alone drawn, the widest
        (asked only of the figure a row shows: `Estimate.described`)."""
        two_nodes = 2 * (self.network.nominal.devices_per_node or 1)
        widths = {
            part: _half(rate_band(w, nominal, self._draws(compute, scheduled, two_nodes, part), s.dp, s.grad_acc))
            for part in UNKNOWNS
        }
        worst = max(widths, key=widths.__getitem__)
        return f"; the band (±{half:.0%}) is wide mostly because of {UNKNOWNS[worst]} (±{widths[worst]:.0%} alone)"

    def _draws(self, compute: Compute, scheduled: float, two_nodes: int, part: str = "all") -> list[Draw]:
        """The band's draws, every unknown drawn (`all`) or only one of UNKNOWNS (the others at their nominal)."""
        rng = np.random.default_rng(self.seed)
        out = []
        for i in range(self.n_draws):
            seconds = compute.draw(rng) if part in ("all", "compute") else compute.seconds
            lost = rng.uniform(0.0, OVERLAP_LOSS) if part in ("all", "overlap") else OVERLAP_LOSS / 2
            form = model_form(two_nodes, rng, True) if part in ("all", "network") else ModelForm(two_nodes)
            net = (
                self.network.draws[i % len(self.network.draws)] if part in ("all", "network") else self.network.nominal
            )
            out.append(Draw(Fit(seconds, self.optimizer_s_per_param, scheduled * (1 - lost), net), form))
        return out


def _per_stage(compute: Compute, pp: int) -> Compute:
    """A micro-step's compute on one of pp pipeline stages: the whole model's at the same tokens over pp (each stage
    runs every token through its share of the layers, at the whole step's matmul efficiency; the costliest stage's
    excess is the step model's, scaling.perf.step_model.pipeline_compute_s)."""
    return compute if pp == 1 else dataclasses.replace(compute, seconds=compute.seconds / pp)


UNKNOWNS = {
    "compute": "the compute (the MFU model's spread at this configuration)",
    "overlap": "how much of the scheduled overlap the engine achieves",
    "network": "the network (its published ranges, and past two nodes a tier or congestion nothing measured)",
}
"""The unknowns a predicted band draws, each named where it makes the band wide."""


def _half(band: tuple[float, float, float, float]) -> float:
    _, rate, lo, hi = band
    return (hi - lo) / 2 / rate if rate > 0 else math.inf


@dataclass(frozen=True)
class ModelFigures:
    """What the recipe plans with: the model's parameters and model FLOPs per token (the built-in family's closed
    form; a model the user brings counted on fake tensors), and the shape its step model is made of."""

    n_params: int
    flops_per_token: float
    shape: ModelShape
    """Its parameter tensors and blocks, as its family gives them."""

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> ModelFigures:
        """Counted once per model and seq_len (a model the user brings: cached); ModelError when a model
        the user brings breaks the contract."""
        family = family_of(cfg.model)
        counted = family.counted(cfg.train.seq_len)
        return cls(counted.n_params, counted.flops_per_token, family.shape(cfg.train.seq_len))


def predicted_figures(
    cfg: ExperimentConfig,
    workload: Callable[[Candidate, int], Workload],
    source: Optional[NetworkEstimate],
    a: RecipeRequest,
    records: Sequence[Mapping[str, Any]] = (),
) -> tuple[Optional[Predicted], Optional[str]]:
    """The predicted figures for candidates with nothing measured (`Predicted`: the hardware's MFU model, fitted to
    conf/mfu/ and to `records` on that hardware), and a note when there are none: no network figures, no peak
    FLOP/s, or no MFU model of the hardware and none assumed."""
    hw, t = cfg.hardware, cfg.train
    peak = configured_peak_flops_per_s(hw, str(t.precision))
    if source is None or peak is None:
        return None, None
    model = mfu_model(hw.name, str(t.precision), peak, records)
    if model is None and a.assume_mfu is None:
        return None, (
            f"no MFU measured on {hw.name} in {t.precision} (conf/mfu/{hw.name}.yaml, or records at dp=1 here): pass "
            "--assume-mfu to plan the GPU counts nothing was measured for"
        )
    split, seq = flops_split(cfg), t.seq_len

    def work(c: Candidate, mbs: int) -> Work:
        return Work.of(split, mbs * seq, c.layout.zero_stage, c.recompute, t.recompute_every, t.compile, seq)

    optimizer = model.optimizer_s_per_param if model is not None else 0.0
    return Predicted(workload, work, peak, source, model, a.assume_mfu, optimizer, a.draws), None
