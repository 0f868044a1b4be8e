"""The compute of one micro-step from the model's FLOPs split and a per-hardware efficiency fitted to every measured
point on that hardware (an MFU model), with its spread and how far a configuration lies from the points:

    t_micro = max((T·(F_mm + F_att / r_att) / (η·P) + L·o) / c,  L·τ·(1 + a_rc·[full recompute] + a_fsdp·[ZeRO ≥ 2]))

T tokens per micro-step; F_mm, F_att the matmul and attention FLOPs per token the hardware runs (recomputation's
included); P the peak; o a layer's fixed cost per micro-step; c the speed-up of compiled blocks; the second term the
floor of a micro-step too small to keep the device busy (L layers of launches, FSDP's hooks). A point measured on one
device (its step: grad_acc · t_micro + parameters · the optimizer's seconds per parameter) fits them in log step time,
each weighted by its doubt, each parameter with a weak prior (`PRIORS`). Points: conf/mfu/<hardware>.yaml (the GPU
page's and published figures, each with its conditions) and the user's own records (scaling.recipe.predicted).
The derivation and its check: docs/dp-extrapolation.md ("The compute from FLOPs").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import yaml
from scipy.optimize import least_squares

from scaling.core.files import config_dirs
from scaling.core.model_group import ModelGroup, model_of
from scaling.core.recompute import recomputed_share
from scaling.model.shape import Counted

PARAMS = ("eta", "overhead_s", "compile_speedup", "attention_ratio")
PRIORS = {
    "eta": (0.4, 1.0),
    "overhead_s": (3e-4, 2.0),
    "compile_speedup": (1.1, 0.2),
    "attention_ratio": (0.75, 0.3),
}
"""Each parameter's prior: (median, σ of its logarithm). Weak where points identify it; the attention's efficiency
relative to the matmuls' (r_att) rests on it (FlashAttention-style kernels run below the GEMMs' rate), and the
speed-up of compiling (c) where no compiled point was measured."""
MEASURED_SIGMA = 0.05
"""Doubt of a point measured by this project (relative): run-to-run spread and the model's simplifications."""
PUBLISHED_SIGMA = 0.15
"""Doubt of a published figure (relative) unless it states its own: another engine, cluster, clock or recompute
policy than the model describes."""
BUILT_IN = "the built-in decoder"
"""`FlopsSplit.blocks` of the built-in family (closed form)."""
OTHER_BLOCKS = (
    "on an H200, models of other blocks ran 14-49% below the figure of a model fitted on llama_1b alone "
    "(benchmarks/RESULTS.md, 2026-11-30): measure one point of this model there"
)
"""What a figure of a model none of whose fitted points runs its blocks is said to rest on: the kernels a block runs
(its norms, activations, attention implementation, vocabulary's logits) move its efficiency, which the fitted
matmul efficiency of other blocks does not describe. Not in the band: its doubt is common to every candidate of the
model, which the recipe's ties would read as a difference."""
SELECTIVE_EAGER = (
    "selective recomputation without train.compile: on an H200 it ran 14-55% below the same point without "
    "recomputation, which this figure takes it for (its policy runs in Python for every op of each block), and "
    "compiled as fast as none (benchmarks/RESULTS.md, 2026-11-30)"
)
"""What a figure of selective recomputation run eagerly is said to rest on: the MFU model has no term for the host
cost of the policy, measured on one GPU only (its eager points are left out of conf/mfu/h200.yaml)."""
DISTANCE_DOUBT = 0.05
"""Relative doubt added per e-fold of parameter count between a configuration and the nearest fitted model: the
GEMMs' shapes, and so their efficiency, change with the width, which points of one size do not show."""


@dataclass(frozen=True)
class FlopsSplit:
    """FLOPs per token by kind: the model's (matmul and attention) and what full recomputation of every block adds
    to each."""

    matmul: float
    attention: float
    recompute_matmul: float = 0.0
    recompute_attention: float = 0.0
    layers: int = 1
    n_params: int = 0
    blocks: str = BUILT_IN
    """What runs these FLOPs: the built-in decoder (BUILT_IN), else the class of a counted model's blocks."""

    @property
    def model(self) -> float:
        """Model FLOPs per token: MFU's numerator."""
        return self.matmul + self.attention

    def run(self, recomputed: float) -> tuple[float, float]:
        """(matmul, attention) FLOPs per token the hardware runs when `recomputed` of full recomputation's FLOPs
        run again (scaling.core.recompute.recomputed_share: 1 full, 0 none and selective)."""
        return self.matmul + recomputed * self.recompute_matmul, self.attention + recomputed * self.recompute_attention

    @classmethod
    def of(cls, counted: Counted) -> FlopsSplit:
        """A model's split as its family counts it (scaling.model.spec.Family.counted): the built-in decoder's in
        closed form, a counted model's with its attention not told apart from its matmuls."""
        attention, recomputed_attention = (
            counted.attention_flops_per_token,
            counted.recomputed_attention_flops_per_token,
        )
        return cls(
            counted.flops_per_token - attention,
            attention,
            counted.recomputed_flops_per_token - recomputed_attention,
            recomputed_attention,
            counted.n_blocks,
            counted.n_params,
            BUILT_IN if counted.source == "closed_form" else counted.block,
        )


@dataclass(frozen=True)
class Work:
    """One configuration on one device: what a micro-step computes and how it runs."""

    flops: FlopsSplit
    tokens: int
    """Tokens of one micro-step (mbs × seq_len)."""
    zero_stage: int = 0
    recomputed: float = 0.0
    """Share of full recomputation's FLOPs run again (scaling.core.recompute.recomputed_share)."""
    compile: bool = False
    seq_len: int = 0
    selective: bool = False
    """Selective recomputation (its recomputed share is counted as none's: the attention's scores only)."""

    @classmethod
    def of(
        cls, flops: FlopsSplit, tokens: int, zero_stage: int, recompute: str, every: int, compile_: bool, seq_len: int
    ) -> Work:
        """A configuration's work under `train.recompute` (and `recompute_every`): the share of full recomputation
        it runs again, and whether it is selective."""
        again = recomputed_share(str(recompute), int(every), flops.layers)
        return cls(flops, tokens, zero_stage, again, bool(compile_), seq_len, str(recompute) == "selective")


@dataclass(frozen=True)
class Measured:
    """A step measured on one device: the work, grad_acc, the median step time, its doubt and where it comes from."""

    work: Work
    grad_acc: int
    step_time_s: float
    sigma: float
    source: str
    published: bool = False
    """A published figure: fitted with its doubt, but left out of the scatter and the distance."""


@dataclass(frozen=True)
class Estimate:
    """The compute of one micro-step: nominal seconds, the relative σ of its log, and how far from the data."""

    seconds: float
    sigma: float
    mfu: float
    distance: str

    def draw(self, rng: np.random.Generator) -> float:
        """Seconds of a micro-step drawn log-normally (within ±2.5 σ)."""
        return self.seconds * math.exp(self.sigma * float(np.clip(rng.normal(), -2.5, 2.5)))


def micro_step_s(theta: np.ndarray, w: Work, peak: float) -> float:
    """Seconds of one micro-step of `w` at parameters `theta` (natural logs, in the order of PARAMS)."""
    eta, overhead, c, r_att = np.exp(theta)
    mm, att = w.flops.run(w.recomputed)
    busy = w.tokens * (mm + att / r_att) / (eta * peak) + w.flops.layers * overhead
    return busy / (c if w.compile else 1.0)


LOCAL = 0.7
"""Width (in the log of tokens per micro-step, a factor of 2) over which a point's error counts toward the scatter
of a prediction: small micro-steps scatter more (launches, hooks) than large ones."""


@dataclass(frozen=True)
class MfuModel:
    """The fitted efficiency of one hardware: parameters, their covariance, the points and their scatter."""

    hardware: str
    peak_flops_per_s: float
    optimizer_s_per_param: float
    theta: np.ndarray
    cov: np.ndarray
    points: tuple[Measured, ...]

    def scatter(self, w: Work) -> float:
        """RMS of the log errors of the points measured on this hardware (published ones left out; a hardware fitted on
        published figures alone takes theirs), each weighted by how near its tokens per micro-step lie to `w`'s
        (LOCAL)."""
        pairs = list(zip(self.points, self.residuals()))
        own = [(p, r) for p, r in pairs if not p.published] or pairs
        if not own:
            return MEASURED_SIGMA
        near = np.array([math.exp(-0.5 * (math.log(p.work.tokens / w.tokens) / LOCAL) ** 2) for p, _ in own])
        err = np.array([math.log1p(r) for _, r in own])
        return max(math.sqrt(float(near @ err**2) / max(float(near.sum()), 1e-12)), MEASURED_SIGMA)

    def residuals(self) -> list[float]:
        """Each point's relative error of the fitted step time (model / measured − 1)."""
        return [self._step(p) / p.step_time_s - 1 for p in self.points]

    def _step(self, p: Measured) -> float:
        return p.grad_acc * micro_step_s(self.theta, p.work, self.peak_flops_per_s) + (
            p.work.flops.n_params * self.optimizer_s_per_param
        )

    def estimate(self, w: Work) -> Estimate:
        """The micro-step's seconds with the σ of its log (parameters, scatter, distance) and its distance in words."""
        f0 = micro_step_s(self.theta, w, self.peak_flops_per_s)
        grad = np.zeros(len(self.theta))
        for i in range(len(self.theta)):
            step = np.zeros_like(self.theta)
            step[i] = 1e-4
            grad[i] = (math.log(micro_step_s(self.theta + step, w, self.peak_flops_per_s)) - math.log(f0)) / 1e-4
        own = [p for p in self.points if not p.published] or list(self.points)
        near = min(own, key=lambda p: abs(math.log(p.work.flops.n_params / w.flops.n_params)))
        efold = abs(math.log(w.flops.n_params / near.work.flops.n_params))
        sigma = math.sqrt(float(grad @ self.cov @ grad) + self.scatter(w) ** 2 + (DISTANCE_DOUBT * efold) ** 2)
        mfu = w.flops.model * w.tokens / (f0 * self.peak_flops_per_s)
        seqs = sorted({p.work.seq_len for p in self.points if p.work.flops.n_params == near.work.flops.n_params})
        ratio = w.flops.n_params / near.work.flops.n_params
        distance = (
            f"{ratio:.2g}× the parameters of the nearest fitted model ({near.source.split(':')[0]}), seq "
            f"{w.seq_len} (fitted there: {', '.join(map(str, seqs))})"
        )
        if w.selective and not w.compile:
            distance += f"; {SELECTIVE_EAGER}"
        fitted = sorted({p.work.flops.blocks for p in own})
        if w.flops.blocks not in fitted:
            distance += (
                f"; its blocks ({w.flops.blocks}) are none of the fitted points' ({', '.join(fitted)}): {OTHER_BLOCKS}"
            )
        return Estimate(f0, sigma, mfu, distance)

    def describe(self) -> str:
        """What the model is fitted on and how well, in words."""
        pub = [p for p in self.points if p.published]
        eta = math.exp(self.theta[0])
        worst = max((abs(e) for e in self.residuals()), default=0.0)
        return (
            f"MFU model of {self.hardware} fitted on {len(self.points) - len(pub)} measured point(s) and {len(pub)} published "
            f"figure(s) (matmul efficiency {eta:.0%} of peak, the largest error of a point {worst:.0%})"
        )


def fit(hardware: str, peak: float, points: Sequence[Measured], optimizer_s_per_param: float) -> MfuModel:
    """Fit the efficiency of `hardware` to its points (weighted least squares in log step time, with PRIORS)."""
    if not points:
        raise ValueError(f"hardware={hardware}: no measured point to fit an MFU model on (conf/mfu/{hardware}.yaml)")
    prior = np.log([PRIORS[k][0] for k in PARAMS])
    prior_sigma = np.array([PRIORS[k][1] for k in PARAMS])

    def residuals(theta: np.ndarray) -> np.ndarray:
        data = [
            (
                math.log(p.grad_acc * micro_step_s(theta, p.work, peak) + p.work.flops.n_params * optimizer_s_per_param)
                - math.log(p.step_time_s)
            )
            / p.sigma
            for p in points
        ]
        return np.concatenate([data, (theta - prior) / prior_sigma])

    res = least_squares(residuals, prior, method="trf", loss="soft_l1", f_scale=2.0)
    cov = np.linalg.pinv(res.jac.T @ res.jac)  # at the stated doubts; the misfit enters as the local scatter
    return MfuModel(hardware, peak, optimizer_s_per_param, res.x, cov, tuple(points))


def preset(name: str) -> ModelGroup:
    """A model preset of the `model` config group by name (conf/model/<name>.yaml, the project's own first)."""
    path = next((p for p in (d / "model" / f"{name}.yaml" for d in config_dirs()) if p.is_file()), None)
    if path is None:
        raise ValueError(f"model={name}: no conf/model/{name}.yaml to read the shapes of a point from")
    doc: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return model_of({k: v for k, v in doc.items() if k != "defaults"})


POINT_FIELDS = ("model", "n_params", "seq_len", "mbs", "zero_stage", "recompute", "compile", "mfu", "spread")
"""The columns of a measured point of conf/mfu/<hardware>.yaml; `spread`, the relative spread of its timed steps,
raises its doubt above MEASURED_SIGMA. A published figure is a mapping of the same names with `tokens_per_s_per_gpu`
(or `mfu`), its `source` and optionally `recompute_every`; keys read by nothing else (`gpus`) describe its run."""


def conf_points(
    hardware: str,
    peak: float,
    conf_dir: Optional[Path] = None,
    precision: str = "bf16",
    *,
    counted: Callable[[ModelGroup, int], Counted],
) -> tuple[list[Measured], float, str]:
    """The points of conf/mfu/<hardware>.yaml (measured ones, then published figures with their source), the
    optimizer's seconds per parameter it states, and its source; nothing where the hardware has no file or its
    points were measured in another precision. An MFU figure is read against `peak`, a published one from its
    tokens/s per GPU. `counted` counts a point's model (its preset) at its seq_len: its family's `counted`."""
    dirs = [conf_dir] if conf_dir is not None else [d / "mfu" for d in config_dirs()]
    path = next((p for p in (d / f"{hardware}.yaml" for d in dirs) if p.is_file()), None)
    if path is None:
        return [], 0.0, ""
    doc = yaml.safe_load(path.read_text()) or {}
    if doc.get("precision", "bf16") != precision:
        return [], 0.0, ""
    rows = [(dict(zip(POINT_FIELDS, row)), MEASURED_SIGMA) for row in doc.get("points") or []]
    rows = [({**e, "sigma": max(float(e.get("spread", 0.0)), s)}, s) for e, s in rows]
    rows += [(dict(row), PUBLISHED_SIGMA) for row in doc.get("published") or []]
    out = []
    for entry, sigma in rows:
        seq, mbs = int(entry["seq_len"]), int(entry["mbs"])
        split = FlopsSplit.of(counted(preset(str(entry["model"])), seq))
        every = entry.get("recompute_every", 1)
        work = Work.of(split, mbs * seq, int(entry["zero_stage"]), entry["recompute"], every, entry["compile"], seq)
        if "tokens_per_s_per_gpu" in entry:
            step = mbs * seq / float(entry["tokens_per_s_per_gpu"])
        else:
            step = split.model * mbs * seq / (float(entry["mfu"]) * peak)
        where = f"published: {entry['source']}" if "source" in entry else f"measured on {hardware}"
        sigma = float(entry.get("sigma", sigma))
        out.append(Measured(work, 1, step, sigma, f"{entry['model']}: {where}", "source" in entry))
    return out, float(doc.get("optimizer_s_per_param", 0.0)), f"{doc.get('source', path.name)} (conf/mfu/{path.name})"


def with_points(model: MfuModel, extra: Sequence[Measured]) -> MfuModel:
    """The model refitted with more points (the user's records on that hardware)."""
    if not extra:
        return model
    return fit(model.hardware, model.peak_flops_per_s, [*model.points, *extra], model.optimizer_s_per_param)
