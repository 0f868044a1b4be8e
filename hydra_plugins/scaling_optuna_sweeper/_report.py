"""What a search leaves in its sweep directory: `best.yaml` and `trials.csv`.

`best.yaml` holds the winning point: `overrides`, the trial's task overrides (on top of the
primary config the search ran with, e.g. a sweep file), its objective values, status, job_key and
metrics; for the engine also `run_overrides`, every experiment field plus sweep and sweep_dir, so
`command` (`python -m scaling run <run_overrides>`) runs the same point from the default config.
A multi-objective study also lists its Pareto front. Infeasible and failed trials never win.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from scaling.store.record import SEARCH_BEST

from ._outcome import is_feasible
from ._study import counted_trials

BEST_FILE = SEARCH_BEST
TRIALS_FILE = "trials.csv"


def best_trials(study: Study) -> list[FrozenTrial]:
    """The best feasible trial (single objective) or the feasible Pareto front, best first."""
    if not any(is_feasible(t) for t in study.get_trials(deepcopy=False, states=[TrialState.COMPLETE])):
        return []
    if len(study.directions) == 1:
        return [study.best_trial]
    sign = 1.0 if study.directions[0].name == "MINIMIZE" else -1.0
    return sorted(study.best_trials, key=lambda t: sign * t.values[0])


def point(trial: FrozenTrial, objectives: Sequence[str]) -> dict[str, Any]:
    """One trial as a plain mapping: its overrides, values and what its record said."""
    entry = {
        "trial": trial.number,
        "overrides": list(trial.user_attrs.get("overrides", [])),
        "values": dict(zip(objectives, trial.values)),
        "status": trial.user_attrs.get("status"),
        "job_key": trial.user_attrs.get("job_key"),
        "metrics": dict(trial.user_attrs.get("metrics", {})),
    }
    if "run_overrides" in trial.user_attrs:
        entry["run_overrides"] = list(trial.user_attrs["run_overrides"])
        entry["command"] = shlex.join(["python", "-m", "scaling", "run", *entry["run_overrides"]])
    return entry


def write_best(sweep_dir: Path, study: Study, objectives: Sequence[str], storage: str) -> Optional[dict[str, Any]]:
    """Write `best.yaml` and return its `best` entry (None while no trial is feasible)."""
    front = [point(t, objectives) for t in best_trials(study)]
    doc: dict[str, Any] = {
        "study": study.study_name,
        "storage": storage,
        "objectives": list(objectives),
        "directions": [d.name.lower() for d in study.directions],
        "n_trials": len(counted_trials(study)),
        "best": front[0] if front else None,
    }
    if len(study.directions) > 1:
        doc["pareto_front"] = front
    _write_text(sweep_dir / BEST_FILE, yaml.safe_dump(doc, sort_keys=False))
    return doc["best"]


def trial_rows(study: Study, objectives: Sequence[str]) -> list[dict[str, Any]]:
    """One row per trial: number, state, status, objective values, feasibility, params, key, time."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {
            "trial": t.number,
            "state": t.state.name,
            "status": "stale" if t.user_attrs.get("stale") else t.user_attrs.get("status"),
        }
        values = t.values if t.values is not None else [None] * len(objectives)
        row.update(zip(objectives, values))
        row["feasible"] = is_feasible(t)
        row.update(t.params)
        duration = t.duration.total_seconds() if t.duration is not None else None
        row.update(
            job_key=t.user_attrs.get("job_key"),
            answered_from=t.user_attrs.get("answered_from"),
            duration_s=duration,
            error=t.user_attrs.get("error"),
        )
        rows.append(row)
    return rows


def write_trials(sweep_dir: Path, rows: list[dict[str, Any]]) -> str:
    """Write `trials.csv` and return the same table as text for the log."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    path = sweep_dir / TRIALS_FILE
    tmp = path.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)
    shown = frame.drop(columns=["error"], errors="ignore")
    return shown.to_string(index=False, float_format=lambda v: f"{v:.6g}")


def _write_text(path: Path, text: str) -> None:
    # Written whole then renamed, so a killed driver leaves the previous file, not half of one.
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
