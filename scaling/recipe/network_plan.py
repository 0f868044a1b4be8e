"""The recipe's network: the sweep directory's `scaling collectives` profile, measured now when two or more devices
are at hand and there is none (at the message sizes the candidates' steps issue), else the hardware's published
figures (scaling.perf.network_figures), else none (the measured DP curve alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from scaling.core.schema import ExperimentConfig
from scaling.launch.network_probe import measure_and_save
from scaling.model.shape import ModelShape
from scaling.perf.network import CPU_SIZES, CUDA_SIZES, NetworkEstimate
from scaling.perf.network_figures import sources
from scaling.perf.step_model import step_collectives
from scaling.recipe.estimate import workload_of
from scaling.recipe.options import Candidate


def network_sizes(
    cfg: ExperimentConfig, candidates: Sequence[Candidate], gbs_samples: int, n: int, shape: Optional[ModelShape] = None
) -> list[int]:
    """The message sizes worth timing: `scaling collectives`' defaults up to the first at or above the largest
    message any candidate's step issues at dp=n, and at least the first four (4 KiB to 4 MiB): with fewer, one
    noisy small size can make time fall with size and β unfittable."""
    largest = max(
        call.bytes_per_call
        for c in candidates
        for call in step_collectives(workload_of(cfg, c, c.mbs_max, gbs_samples, shape), n, 1)
    )
    defaults = CUDA_SIZES if cfg.hardware.device == "cuda" else CPU_SIZES
    upto = next((i for i, size in enumerate(defaults) if size >= largest), len(defaults) - 1)
    return list(defaults[: max(upto, 3) + 1])


def network_source(
    cfg: ExperimentConfig,
    sweep_dir: Path,
    at_hand: int,
    measured: Sequence[dict[str, Any]],
    candidates: Sequence[Candidate],
    gbs_samples: int,
    shape: Optional[ModelShape],
    draws: int,
    notes: list[str],
) -> tuple[Optional[NetworkEstimate], str]:
    """The network source the recipe extrapolates and predicts with, and its description; measured now (when the
    directory has no profile, two or more devices are at hand and a point ran), its notes added to `notes`."""
    hw = cfg.hardware
    dpn = hw.devices_per_node
    found, source_notes = sources(sweep_dir, hw.name, dpn, draws, links_per_node=hw.links_per_node)
    has_profile = len(found) > 1 and found[1].kind == "profile"
    if not has_profile and at_hand >= 2 and any(p.get("status") == "ok" for p in measured):
        sizes = network_sizes(cfg, candidates, gbs_samples, at_hand, shape)
        print(
            f"[recipe] measuring the network at up to {at_hand} ranks (scaling collectives, messages up to "
            f"{sizes[-1]:,} bytes: the candidates' largest, or more)",
            flush=True,
        )
        measure_and_save(cfg.changed(parallel={"dp": at_hand}), sweep_dir, sizes)
        found, source_notes = sources(sweep_dir, hw.name, dpn, draws, links_per_node=hw.links_per_node)
    source = found[1] if len(found) > 1 else None
    if source is None:
        network = "fitted to the measured DP curve alone (no profile and no published figures)"
    elif source.kind == "profile":
        network = f"{source.label}, measured in this directory by `scaling collectives`"
    else:
        network = f"{source.label} (the hardware's published figures)"
    notes += [n for n in source_notes if "No measured profile" not in n or source is None]
    return source, network
