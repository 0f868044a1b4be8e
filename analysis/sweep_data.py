"""One sweep directory as the report reads it, read once: its records (as `collect`'s DataFrame, the unusable ones
named), its index (sweep.json), a search's best point (best.yaml) and the measured
network profile (alpha_beta.json). The report's sections are built from this object; none of them opens a file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import yaml

from analysis.collect import collect
from analysis.usable import LeftOut
from scaling.perf.network_figures import Profile, read_profile
from scaling.store.record import SEARCH_BEST, SWEEP_INDEX


@dataclass
class SweepData:
    """What one report of a sweep directory is built from."""

    sweep_dir: Path
    df: pd.DataFrame
    """Every usable record, one row per point (analysis.collect)."""
    left_out: list[LeftOut] = field(default_factory=list)
    """Records the analysis cannot use, each with why."""
    meta: dict[str, Any] = field(default_factory=dict)
    """sweep.json: the sweep's name, when it started, its hardware (the folder's name when there is none)."""
    search_best_key: Optional[str] = None
    """The job key of a search's best point (best.yaml); None for a sweep that is not a search, or no feasible one."""
    profile: Optional[Profile] = None
    """The network profile `scaling collectives` measured into the directory."""
    profile_problem: Optional[str] = None
    """Why alpha_beta.json could not be used (None: used, or there is none)."""

    @property
    def name(self) -> str:
        """The sweep's name: sweep.json's, else the folder's."""
        return str(self.meta.get("name") or self.sweep_dir.name)

    @classmethod
    def load(cls, sweep_dir: str | os.PathLike) -> SweepData:
        """Read everything the report shows of `sweep_dir`, once."""
        sweep_dir = Path(sweep_dir)
        left_out: list[LeftOut] = []
        df = collect(sweep_dir, left_out=left_out)
        profile, profile_problem = read_profile(sweep_dir)
        return cls(
            sweep_dir,
            df,
            left_out,
            _read_meta(sweep_dir),
            _read_best_key(sweep_dir),
            profile,
            profile_problem,
        )


def _read_meta(sweep_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((sweep_dir / SWEEP_INDEX).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"name": sweep_dir.name}


def _read_best_key(sweep_dir: Path) -> Optional[str]:
    try:
        doc = yaml.safe_load((sweep_dir / SEARCH_BEST).read_text())
    except (FileNotFoundError, yaml.YAMLError):
        return None
    return ((doc or {}).get("best") or {}).get("job_key")
