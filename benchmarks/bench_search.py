"""How much of a measured grid each search sampler needs before it finds a point within 5% of
the grid's best, replayed on recorded results (median over seeds).

    python benchmarks/bench_search.py [SWEEP_DIR] [--seeds 10] [--tolerance 0.05]
                                      [--objective metrics.tokens_per_s_per_gpu] [--n-startup-trials 5]

SWEEP_DIR holds the records of a finished grid sweep; the grid's dimensions are the config fields
that differ between its records. Each sampler searches that space through the sweeper's own code
(search-space parsing, sampler construction, record -> trial outcome, constraint, repeats answered
from earlier trials) with each trial answered from the record of its point instead of launching
it. A point counts once, when first measured. `tpe (repeats)` is Optuna's TPE as it is, proposing
tried points again (answered without a job), next to the sweeper's TPE that proposes untried ones.
`grid (cartesian order)` is the order Hydra's basic sweeper runs the grid in, dimensions sorted by
name. Without SWEEP_DIR the demo grid is measured first (`scaling sweep demo`, into runs/demo).
Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from optuna.samplers import TPESampler

from hydra_plugins.scaling_optuna_sweeper._outcome import (
    dotted_get,
    failure,
    is_feasible,
    judge,
    repeat_outcome,
    tell,
    worst_values,
)
from hydra_plugins.scaling_optuna_sweeper._space import format_value, parse_search_space
from hydra_plugins.scaling_optuna_sweeper._study import make_sampler
from scaling.core.enums import Status
from scaling.store.read import iter_records

DEMO_DIR = Path("runs/demo")
SAMPLERS = ("tpe", "random", "grid", "tpe (repeats)")
"""The sweeper's samplers, and plain TPE (repeating tried points) for reference."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'mbs': 2}} -> {'train.mbs': 2}."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def load_grid(sweep_dir: Path) -> tuple[dict[str, list[Any]], dict[tuple, dict[str, Any]]]:
    """The grid's dimensions (field -> sorted values) and its records keyed by their values."""
    records = [r for r in iter_records(sweep_dir) if r.get("config")]
    if not records:
        raise SystemExit(f"{sweep_dir} holds no records (<job_key>/result.json): measure a grid sweep first")
    flats = [flatten(r["config"]) for r in records]
    varying = [k for k in sorted(set().union(*flats)) if len({json.dumps(f.get(k)) for f in flats}) > 1]
    # A field that follows from the others (grad_acc set per dp, a model's shapes given its name) is
    # not a dimension of the grid; `*.name` fields are the last to go, so a model stays `model.name`.
    for key in sorted(varying, key=lambda k: (k.endswith(".name"), k)):
        rest = [k for k in varying if k != key]
        if len({json.dumps([f.get(k) for k in rest]) for f in flats}) == len(flats):
            varying = rest
    dims = {k: sorted({json.dumps(f.get(k)) for f in flats}) for k in varying}
    dims = {k: sorted((json.loads(v) for v in vs), key=lambda v: (str(type(v)), v)) for k, vs in dims.items()}
    points = {tuple(f.get(k) for k in dims): r for f, r in zip(flats, records)}
    return dims, points


def first_hit(
    sampler: str,
    seed: int,
    dims: dict[str, list[Any]],
    points: dict[tuple, dict[str, Any]],
    objective: str,
    target: float,
    n_startup_trials: int,
) -> tuple[int, int]:
    """(points measured, jobs launched) until one is feasible with objective >= target (the grid's
    sizes if never). A predicted_oom point is measured but costs no job: the pre-screen answers it."""
    space = parse_search_space(
        [f"{k}=choice({','.join(format_value(v) for v in vs)})" for k, vs in dims.items()], OverridesParser.create()
    )
    study = optuna.create_study(direction="maximize")
    study.sampler = (
        TPESampler(seed=seed, n_startup_trials=n_startup_trials)
        if sampler == "tpe (repeats)"
        else make_sampler(sampler, seed, n_startup_trials, space, 1)
    )
    measured: set[tuple] = set()
    while len(measured) < math.prod(len(v) for v in dims.values()):
        trial = study.ask(space.distributions)
        trials = study.get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE])
        outcome = repeat_outcome(trials, trial.params)
        if outcome is None:
            key = tuple(trial.params[k] for k in dims)
            measured.add(key)
            record = points.get(key)
            worst = worst_values(trials, study.directions)
            outcome = judge(record, [objective], worst) if record else failure("not in the recorded grid")
        tell(study, trial, outcome)
        done = study.get_trials(deepcopy=False)[-1]
        if is_feasible(done) and done.value >= target:
            return len(measured), launched(points, measured)
    return len(points), launched(points, set(points))


def launched(points: dict[tuple, dict[str, Any]], keys: set[tuple]) -> int:
    """How many of these points started a job (all but those the pre-screen answered)."""
    return sum(1 for k in keys if k in points and points[k].get("status") != Status.PREDICTED_OOM)


def sweep_order_hit(
    dims: dict[str, list[Any]], points: dict[tuple, dict[str, Any]], objective: str, target: float
) -> int:
    """Points Hydra's basic sweeper runs (cartesian order) until one reaches the target."""
    for i, key in enumerate(itertools.product(*dims.values()), start=1):
        record = points.get(key)
        if record and record.get("status") == Status.OK and dotted_get(record, objective) >= target:
            return i
    return len(points)


def measure_demo_grid() -> Path:
    """Run the demo sweep (its records land in runs/demo)."""
    print(f"no sweep dir given: measuring the demo grid into {DEMO_DIR} (scaling sweep demo)", flush=True)
    done = subprocess.run([sys.executable, "-m", "scaling", "sweep", "demo"])
    if done.returncode != 0:
        raise SystemExit(f"`scaling sweep demo` failed (exit {done.returncode}): pass a measured sweep dir instead")
    return DEMO_DIR


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Replay every sampler over the seeds and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", nargs="?", type=Path, help="a sweep directory holding a measured grid")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--tolerance", type=float, default=0.05, help="within this fraction of the grid's best")
    p.add_argument("--objective", default="metrics.tokens_per_s_per_gpu", help="maximised record field")
    p.add_argument("--n-startup-trials", type=int, default=5, help="random trials before TPE models (sweeper default)")
    a = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    dims, points = load_grid(a.sweep_dir or measure_demo_grid())
    ok = {k: dotted_get(r, a.objective) for k, r in points.items() if r.get("status") == Status.OK}
    if not ok:
        raise SystemExit(f"no record of status ok in {a.sweep_dir}: nothing to find")
    best = max(ok.values())
    target = (1.0 - a.tolerance) * best
    n = len(points)
    n_hits = sum(v >= target for v in ok.values())
    statuses = sorted({r["status"] for r in points.values()})
    print(f"grid: {n} points over {', '.join(f'{k} ({len(v)})' for k, v in dims.items())}; statuses {statuses}")
    print(f"best {a.objective} = {best:.6g}; {n_hits} point(s) within {a.tolerance:.0%} of it\n")
    jobs = launched(points, set(points))
    print(
        f"{'sampler':<22} {'median':>8} {'min':>6} {'max':>6}   points measured   jobs launched (of {jobs}), "
        f"median of {a.seeds} seeds"
    )
    for sampler in SAMPLERS:
        runs = [
            first_hit(sampler, seed, dims, points, a.objective, target, a.n_startup_trials) for seed in range(a.seeds)
        ]
        fractions = [h / n for h, _ in runs]
        started = statistics.median(j for _, j in runs)
        print(
            f"{sampler:<22} {statistics.median(fractions):>8.1%} {min(fractions):>6.1%} {max(fractions):>6.1%}   "
            f"{statistics.median(h for h, _ in runs):>15g}   {started:g} ({started / jobs:.1%})"
        )
    order = sweep_order_hit(dims, points, a.objective, target)
    print(f"{'grid (cartesian order)':<22} {order / n:>8.1%} {'':>6} {'':>6}   {order}")
    print(
        f"{'random (expected)':<22} {(n + 1) / (n_hits + 1) / n:>8.1%} {'':>6} {'':>6}   "
        f"{(n + 1) / (n_hits + 1):.1f}  (uniform without replacement)"
    )


if __name__ == "__main__":
    main()
