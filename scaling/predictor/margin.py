"""The planning margin: how far below the capacity a predicted peak must stay when nothing will confirm it, from the
predictor's largest error measured on the device for that setting (benchmarks/RESULTS.md: the H100 page predicted
again, 2026-11-26). The allocator's slack, the CUDA context and NCCL's buffers are already outside the capacity
(hardware.reserve_gb, scaling.predictor.prescreen.capacity_bytes); a fit confirmed by runs needs no margin.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaling.core.enums import ZeroStage
from scaling.core.schema import ExperimentConfig
from scaling.model.family import family_of

MEASURED_ERROR = {
    ("cuda", "analytic", "eager", ZeroStage.NONE): 0.003,
    ("cuda", "analytic", "eager", ZeroStage.OPTIMIZER): 0.069,
    ("cuda", "analytic", "eager", ZeroStage.GRADIENTS): 0.003,
    ("cuda", "analytic", "eager", ZeroStage.PARAMETERS): 0.003,
    ("cuda", "analytic", "compiled", None): 0.064,
}
"""The largest |predicted / measured − 1| of the analytic predictor against max_memory_allocated on the H100 page, by
stage (eager; ZeRO-1's 4Ψ is not modelled) and compiled (every stage)."""
UNMEASURED = max(MEASURED_ERROR.values())
"""The margin of a setting no device measured (the traced predictor on CUDA, a model one brings): the largest seen."""


@dataclass(frozen=True)
class Margin:
    """The share of the capacity a planned fit leaves unused, and what it rests on."""

    frac: float
    basis: str


def planning_margin(cfg: ExperimentConfig) -> Margin:
    """The margin of a point planned on its target device without a run to confirm it (CPU: none, the recipe
    confirms every CPU fit with runs, against the same tracker the predictors are fitted to)."""
    if cfg.hardware.device != "cuda":
        return Margin(0.0, "confirmed by runs on CPU")
    method = "analytic" if family_of(cfg.model).closed_form else "traced"
    compiled = "compiled" if cfg.train.compile else "eager"
    stage = None if compiled == "compiled" else ZeroStage(cfg.parallel.zero_stage)
    split = cfg.parallel.layout.model_parallel > 1  # the H100 page ran whole models: no tp or pp point measured
    measured = None if split else MEASURED_ERROR.get(("cuda", method, compiled, stage))
    if split:
        return Margin(
            UNMEASURED,
            f"{method} {compiled} under {cfg.parallel.layout.kind}: not measured on a GPU, the largest error seen",
        )
    if measured is None:
        return Margin(UNMEASURED, f"{method} {compiled}: not measured on a GPU, the largest error seen")
    setting = f"{compiled} at ZeRO-{int(stage)}" if stage is not None else compiled
    return Margin(measured, f"the {method} predictor's largest error {setting} on the H100 page")
