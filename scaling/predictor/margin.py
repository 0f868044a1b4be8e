"""The planning margin: how far below the capacity a predicted peak must stay when nothing will confirm it, from the
predictor's largest error measured on the device for that setting (benchmarks/gpu/: the H100 page predicted again,
2026-11-26; the H200 page of the final tree, 2026-11-30). The CUDA context and NCCL's buffers are outside the capacity
(hardware.reserve_gb, scaling.predictor.prescreen.capacity_bytes); a fit confirmed by runs needs no margin. Not in
it: the caching allocator's fragmentation, which the H200 page saw decide four points the predictor had under the
card (predicted 121-133 GiB of allocations, out of memory on a 139.8 GiB card with 7-23 GiB reserved but unused)
under the allocator's default setting; under the one CUDA ranks now start with
(scaling.launch.torchrun.CUDA_ALLOC_CONF) two of them ran at their predicted peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaling.core.enums import ZeroStage
from scaling.core.schema import ExperimentConfig
from scaling.model.family import family_of

MEASURED_ERROR = {
    "h100": {
        ("analytic", "eager", ZeroStage.NONE): 0.003,
        ("analytic", "eager", ZeroStage.OPTIMIZER): 0.069,
        ("analytic", "eager", ZeroStage.GRADIENTS): 0.003,
        ("analytic", "eager", ZeroStage.PARAMETERS): 0.003,
        ("analytic", "compiled", None): 0.064,
    },
    "h200": {
        ("analytic", "eager", ZeroStage.NONE): 0.003,
        ("analytic", "eager", ZeroStage.OPTIMIZER): 0.003,
        ("analytic", "eager", ZeroStage.GRADIENTS): 0.002,
        ("analytic", "eager", ZeroStage.PARAMETERS): 0.004,
        ("analytic", "compiled", None): 0.074,
    },
}
"""Per GPU page, the largest |predicted / measured − 1| of the analytic predictor against max_memory_allocated (rounded
up to 0.1%), by stage (eager) and compiled (every stage). The H100 page (2026-11-22, an earlier engine) saw ZeRO-1
hold 4 bytes per parameter more than ZeRO-0, which the predictor does not model; the H200 page (the final tree,
2026-11-30, 22 eager points with none, selective and full recomputation) did not: ZeRO-1 peaked where ZeRO-0 did."""
DEFAULT_PAGE = "h100"
"""The page a CUDA profile without one of its own (a100) takes its margins from."""
UNMEASURED = max(MEASURED_ERROR[DEFAULT_PAGE].values())
"""The margin of a setting no device measured (the traced predictor on CUDA, a model one brings) on a profile without
a page: the largest its default page saw."""


def _page(hardware: str) -> str:
    return hardware if hardware in MEASURED_ERROR else DEFAULT_PAGE


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
    page = _page(cfg.hardware.name)
    errors, name = MEASURED_ERROR[page], f"the {page.upper()} page"
    largest = max(errors.values())
    if cfg.parallel.layout.model_parallel > 1:  # the GPU pages ran whole models: no tp or pp point measured
        return Margin(
            largest,
            f"{method} {compiled} under {cfg.parallel.layout.kind}: not measured on a GPU, the largest error on {name}",
        )
    measured = errors.get((method, compiled, stage))
    if measured is None:
        return Margin(largest, f"{method} {compiled}: not measured on a GPU, the largest error on {name}")
    setting = f"{compiled} at ZeRO-{int(stage)}" if stage is not None else compiled
    return Margin(measured, f"the {method} predictor's largest error {setting} on {name}")
