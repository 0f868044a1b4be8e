"""A recipe row before anything is measured on the hardware: `predicted` from the model's FLOPs, an MFU measured on
that hardware, and the network's figures through the step model.

    compute per micro-step = FLOPs per micro-step / (MFU · peak FLOP/s);  step(n) = the step model at dp=n

The MFU comes from conf/mfu/<hardware>.yaml (points measured on that hardware) or `--assume-mfu`; the band draws
the MFU, the network and the overlap, and the model form past one node (scaling.perf.extrapolation). A measured or
extrapolated figure replaces it as soon as the store has records (scaling.recipe.estimate). docs/recipe.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import yaml

from scaling.core.schema import CONF_DIR
from scaling.perf.dp_fit import Fit
from scaling.perf.extrapolation import Draw, model_form, rate_band
from scaling.perf.network import NetworkEstimate
from scaling.perf.step_model import Workload
from scaling.recipe.options import PREDICTED, Candidate, Estimate, Split

ASSUMED_SPREAD = 0.10
"""The relative band of `--assume-mfu` where the hardware has no measured points to take the spread from."""
NOMINAL_OVERLAP = 0.5
"""The overlap of the nominal figure: the middle of what the band draws."""


@dataclass(frozen=True)
class MfuPrior:
    """An MFU to plan with: nominal, its band, and where it comes from (in words)."""

    nominal: float
    low: float
    high: float
    source: str


@dataclass(frozen=True)
class MfuPoint:
    """One measured MFU of conf/mfu/<hardware>.yaml."""

    model: str
    n_params: int
    seq_len: int
    mbs: int
    zero_stage: int
    recompute: str
    compile: bool
    mfu: float


def mfu_points(hardware: str, conf_dir: Path = CONF_DIR) -> tuple[list[MfuPoint], str]:
    """The measured MFU points of a hardware profile and their source (none: an empty list)."""
    path = conf_dir / "mfu" / f"{hardware}.yaml"
    if not path.is_file():
        return [], ""
    doc = yaml.safe_load(path.read_text()) or {}
    return [MfuPoint(*p) for p in doc.get("points") or []], f"{doc.get('source', path.name)} (conf/mfu/{path.name})"


def measured_mfu(
    hardware: str, n_params: int, seq_len: int, recompute: str, compile_: bool, conf_dir: Path = CONF_DIR
) -> Optional[MfuPrior]:
    """The MFU of the hardware's measured points nearest this run: the nearest model by parameter count, the same
    recompute and compile setting, the nearest seq_len (log scale); None when the hardware has no such point."""
    points, source = mfu_points(hardware, conf_dir)
    points = [p for p in points if p.recompute == recompute and p.compile == compile_]
    if not points:
        return None
    nearest = min(abs(math.log(p.n_params / n_params)) for p in points)
    points = [p for p in points if abs(math.log(p.n_params / n_params)) == nearest]
    nearest = min(abs(math.log(p.seq_len / seq_len)) for p in points)
    points = [p for p in points if abs(math.log(p.seq_len / seq_len)) == nearest]
    values = [p.mfu for p in points]
    p0 = points[0]
    return MfuPrior(
        statistics.median(values),
        min(values),
        max(values),
        f"{len(values)} point(s) of {p0.model} at seq {p0.seq_len}, recompute {recompute}"
        f"{', compiled' if compile_ else ''}, measured on {hardware}: {source}",
    )


def assumed_mfu(value: float, measured: Optional[MfuPrior]) -> MfuPrior:
    """`--assume-mfu`: the value, its band the measured points' relative spread (or ±ASSUMED_SPREAD)."""
    if measured is not None and measured.nominal > 0:
        low, high = value * measured.low / measured.nominal, value * measured.high / measured.nominal
        how = "the relative spread of the hardware's measured points"
    else:
        low, high = value * (1 - ASSUMED_SPREAD), value * (1 + ASSUMED_SPREAD)
        how = f"±{ASSUMED_SPREAD:.0%}"
    return MfuPrior(value, low, min(high, 1.0), f"--assume-mfu {value:g} (band: {how})")


@dataclass
class Predicted:
    """The recipe's figure of a candidate with nothing measured: the step model with the compute from FLOPs and MFU."""

    workload: Callable[[Candidate, int], Workload]
    """The step model's workload of a candidate at an mbs."""
    flops_per_token: float
    """Model FLOPs per trained token (MFU's numerator)."""
    peak_flops_per_s: float
    mfu: MfuPrior
    network: NetworkEstimate
    n_draws: int = 200
    seed: int = 0

    def __call__(self, c: Candidate, s: Split) -> Optional[Estimate]:
        w = self.workload(c, s.mbs)
        if not self.network.nominal.reaches(s.gpus):
            return None

        def compute_s(mfu: float) -> float:
            return self.flops_per_token * s.mbs * w.seq_len / w.tp / (mfu * self.peak_flops_per_s)  # a rank's part

        nominal = Fit(compute_s(self.mfu.nominal), 0.0, NOMINAL_OVERLAP, self.network.nominal)
        rng = np.random.default_rng(self.seed)
        one_node = self.network.nominal.devices_per_node or 1
        draws = []
        for i in range(self.n_draws):
            net = self.network.draws[i % len(self.network.draws)]
            fit = Fit(compute_s(rng.uniform(self.mfu.low, self.mfu.high)), 0.0, rng.uniform(0.0, 1.0), net)
            draws.append(Draw(fit, model_form(one_node, rng)))
        step, rate, lo, hi = rate_band(w, nominal, draws, s.gpus, s.grad_acc)
        return Estimate(
            rate,
            min(lo, rate),
            max(hi, rate),
            step,
            PREDICTED,
            f"nothing measured on this hardware: MFU {self.mfu.nominal:.1%} [{self.mfu.low:.1%}, "
            f"{self.mfu.high:.1%}] from {self.mfu.source}; network: {self.network.label}",
        )
