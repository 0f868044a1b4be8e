"""What a point's record tells Optuna: trial state, objective values, feasibility, user attrs.

- `ok` -> COMPLETE with the objective values read from the record, feasible.
- `oom` and `predicted_oom` -> COMPLETE and infeasible: the constraint `oom` is set to 1.0
  (`Trial.set_constraint`, Optuna's way since 5.0; > 0 means infeasible), so constraint-aware
  samplers (TPE, NSGA-II, GP) learn where memory runs out and `best_trial` never picks them.
  A COMPLETE trial needs values, so each objective gets the worst value of the study's feasible
  trials so far (0.0 while there is none); samplers rank infeasible trials by their violation,
  not by these values.
- `failed`, `timeout`, `invalid`, a missing objective or a job that raised -> FAIL.
- A number, or a list of numbers (one per objective), as tasks return them to hydra-optuna-sweeper
  -> COMPLETE with those values.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, Trial, TrialState

from scaling.core.enums import Status

CONSTRAINT = "oom"
INFEASIBLE_STATUSES = frozenset({Status.OOM, Status.PREDICTED_OOM})


@dataclass
class Outcome:
    """How one trial is told to the study."""

    state: TrialState
    values: Optional[list[float]] = None
    violation: float = 0.0
    attrs: dict[str, Any] = field(default_factory=dict)


def dotted_get(record: Mapping[str, Any], name: str) -> Any:
    """`record["metrics"]["tokens_per_s_per_gpu"]` for `metrics.tokens_per_s_per_gpu`; None if absent."""
    node: Any = record
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def judge(record: Any, objectives: Sequence[str], worst: Sequence[float]) -> Outcome:
    """Translate one returned record (or, as with hydra-optuna-sweeper, the objective value or a list of
    values, one per objective) into the trial's state, values and attrs."""
    values = [record] if _is_number(record) else record if isinstance(record, (list, tuple)) else None
    if values is not None:
        if len(values) != len(objectives) or not all(_is_number(v) and math.isfinite(v) for v in values):
            return failure(
                f"task returned {record!r}: expected {len(objectives)} finite number(s), one per "
                f"objective {list(objectives)}, or a record dict"
            )
        return Outcome(TrialState.COMPLETE, values=[float(v) for v in values], attrs={"status": Status.OK})
    if not isinstance(record, Mapping):
        return failure(f"task returned {type(record).__name__}, expected a record dict or the objective value(s)")
    status = record.get("status")
    attrs = {
        "status": status,
        "job_key": record.get("job_key"),
        "error": record.get("error"),
        "metrics": _scalar_metrics(record.get("metrics")),
    }
    if status in INFEASIBLE_STATUSES:
        return Outcome(TrialState.COMPLETE, values=list(worst), violation=1.0, attrs=attrs)
    if status != Status.OK:
        return Outcome(TrialState.FAIL, attrs=attrs)
    values = [dotted_get(record, name) for name in objectives]
    for name, value in zip(objectives, values):
        if not _is_number(value) or not math.isfinite(value):
            attrs["error"] = f"objective {name}={value!r} is not a finite number in a record of status ok"
            return Outcome(TrialState.FAIL, attrs=attrs)
    return Outcome(TrialState.COMPLETE, values=[float(v) for v in values], attrs=attrs)


def failure(error: str) -> Outcome:
    """The outcome of a job that raised instead of returning a record."""
    return Outcome(TrialState.FAIL, attrs={"status": Status.FAILED, "error": error})


def repeat_outcome(trials: Sequence[FrozenTrial], params: Mapping[str, Any], repeats: int = 1) -> Optional[Outcome]:
    """The outcome of an earlier COMPLETE trial with the same parameters, if there is one; an ok one
    answers only if it was measured with at least `repeats` ok launches (launch.repeats)."""
    for earlier in trials:
        launched = earlier.user_attrs.get("metrics", {}).get("repeats_ok", 1)
        if (
            earlier.state == TrialState.COMPLETE
            and earlier.params == params
            and (earlier.user_attrs.get("status") != Status.OK or launched >= repeats)
        ):
            attrs = {k: earlier.user_attrs.get(k) for k in ("status", "job_key", "error", "metrics")}
            attrs["answered_from"] = f"trial {earlier.number}"
            violation = max(earlier.constraints.values(), default=0.0)
            return Outcome(TrialState.COMPLETE, list(earlier.values), violation, attrs)
    return None


def tell(study: Study, trial: Trial, outcome: Outcome) -> None:
    """Store the outcome's attrs and constraint on the trial and finish it."""
    for key, value in outcome.attrs.items():
        if value is not None:
            trial.set_user_attr(key, value)
    trial.set_user_attr("feasible", outcome.state == TrialState.COMPLETE and outcome.violation <= 0.0)
    if outcome.state == TrialState.COMPLETE:
        trial.set_constraint(CONSTRAINT, outcome.violation)
        with warnings.catch_warnings():
            # CmaEsSampler warns on every constrained trial that it does not use constraints.
            warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEsSampler")
            study.tell(trial, outcome.values)
    else:
        study.tell(trial, state=TrialState.FAIL)


def is_feasible(trial: FrozenTrial) -> bool:
    """COMPLETE with every constraint <= 0."""
    return trial.state == TrialState.COMPLETE and all(v <= 0.0 for v in trial.constraints.values())


def worst_values(trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]) -> list[float]:
    """Per objective, the worst value among feasible trials (0.0 when there is none)."""
    feasible = [t.values for t in trials if is_feasible(t)]
    worst = []
    for i, direction in enumerate(directions):
        column = [values[i] for values in feasible]
        if not column:
            worst.append(0.0)
        elif direction == StudyDirection.MAXIMIZE:
            worst.append(min(column))
        else:
            worst.append(max(column))
    return worst


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar_metrics(metrics: Any) -> dict[str, float]:
    """The number-valued metrics of a record (lists such as step_times_s stay in the record)."""
    if not isinstance(metrics, Mapping):
        return {}
    return {k: v for k, v in metrics.items() if _is_number(v) and math.isfinite(v)}
