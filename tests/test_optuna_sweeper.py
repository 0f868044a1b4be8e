"""The scaling_optuna sweeper: discovery, search space, outcomes, toy searches end to end, resume
after SIGKILL, and a search over the real engine whose best point runs again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.test_utils.test_utils import run_process, run_python_script, run_with_error
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from hydra_plugins.scaling_optuna_sweeper._outcome import judge, repeat_outcome, tell
from hydra_plugins.scaling_optuna_sweeper._space import parse_search_space
from hydra_plugins.scaling_optuna_sweeper._study import (
    make_sampler,
    noise_band,
    trials_since_improvement,
)
from scaling.engine.lifetime import GATE_ENV
from scaling.store.read import read_record
from scaling.store.record import job_key
from tests.helpers.compose import compose_point

REPO = Path(__file__).resolve().parents[1]
TOY_APP = REPO / "tests" / "toy_app" / "toy_app.py"
TOY_SPACE = ["x=interval(0,1)", "mbs=choice(1,2,4,8,16)", "kind=a,b"]
SWEEPER = ["-m", "hydra/sweeper=scaling_optuna", "hydra.sweeper.sampler.seed=0"]


def toy_command(sweep_dir: Path, *overrides: str) -> list[str]:
    """The toy app as a multirun under the sweeper, scored on metrics.score."""
    return [
        str(TOY_APP),
        *SWEEPER,
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweeper.objectives=[metrics.score]",
        *overrides,
    ]


def toy_sweep(sweep_dir: Path, *overrides: str) -> str:
    """Run a toy search to the end (warnings are errors) and return its stdout."""
    stdout, _ = run_python_script(toy_command(sweep_dir, *overrides))
    return stdout


def load_study(sweep_dir: Path) -> optuna.Study:
    """The study a default-configured search leaves in its sweep directory."""
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal")))
    return optuna.load_study(study_name=sweep_dir.name, storage=storage)


def calls(sweep_dir: Path) -> list[dict[str, Any]]:
    """What the toy app actually ran, one entry per call."""
    path = sweep_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def toy_score(overrides: list[str]) -> float:
    """The toy objective recomputed from a list of overrides (same formula as the toy app)."""
    kv = dict(o.split("=", 1) for o in overrides)
    return 1.0 - (float(kv["x"]) - 0.3) ** 2 + 0.1 * int(kv["mbs"]) + (0.5 if kv["kind"] == "b" else 0.0)


# --- pure parts -------------------------------------------------------------------------------
def test_hydra_discovers_the_plugin_and_its_config() -> None:
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    names = [f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)]
    assert "hydra_plugins.scaling_optuna_sweeper.sweeper.ScalingOptunaSweeper" in names
    assert "scaling_optuna.yaml" in ConfigStore.instance().list("hydra/sweeper")
    # Discovery must not import Optuna's heavy machinery: that happens when a sweep starts.
    assert "hydra_plugins.scaling_optuna_sweeper._impl" not in Plugins.instance().stats.modules_import_time


def test_search_space_maps_hydra_sweeps_to_distributions() -> None:
    space = parse_search_space(
        [
            "model=tiny,small",
            "train.mbs=choice(1,2,4)",
            "parallel.dp=range(1,9,2)",
            "train.lr=tag(log,interval(1e-4,1e-2))",
            "x=tag(int,interval(1,64))",
            "y=range(0,1,0.25)",
            "train.steps=2",
            "train.mbs=choice(2,8)",
        ],
        OverridesParser.create(),
    )
    d = space.distributions
    assert d["model"] == CategoricalDistribution(["tiny", "small"])
    assert d["train.mbs"] == CategoricalDistribution([2, 8])  # the later override of a key wins
    assert d["parallel.dp"] == IntDistribution(1, 7, step=2)  # range's stop is exclusive, as in Hydra
    assert d["train.lr"] == FloatDistribution(1e-4, 1e-2, log=True)
    assert d["x"] == IntDistribution(1, 64)
    assert space.fixed == ["train.steps=2"]
    params = {"model": "small", "train.mbs": 8, "parallel.dp": 3, "train.lr": 0.001, "x": 5, "y": 0.5}
    assert space.overrides(params) == [
        "train.steps=2",
        "model=small",
        "parallel.dp=3",
        "train.lr=0.001",
        "x=5",
        "y=0.5",
        "train.mbs=8",
    ]
    grid_space = parse_search_space(["a=1,2", "b=range(0,1,0.25)"], OverridesParser.create())
    assert grid_space.grid() == {"a": [1, 2], "b": [0.0, 0.25, 0.5, 0.75]}
    with pytest.raises(ValueError, match=r"sampler.name=grid needs discrete parameters, but train.lr is continuous"):
        space.grid()


def test_records_become_trial_outcomes() -> None:
    ok = judge(
        {"status": "ok", "job_key": "k", "metrics": {"tokens_per_s_per_gpu": 5.0, "losses": [1.0]}},
        ["metrics.tokens_per_s_per_gpu"],
        [1.0],
    )
    assert (ok.state, ok.values, ok.violation) == (TrialState.COMPLETE, [5.0], 0.0)
    assert ok.attrs["metrics"] == {"tokens_per_s_per_gpu": 5.0}  # lists stay in the record
    for status in ("oom", "predicted_oom"):
        bad = judge({"status": status, "metrics": None}, ["metrics.tokens_per_s_per_gpu"], [1.5])
        assert (bad.state, bad.values, bad.violation) == (TrialState.COMPLETE, [1.5], 1.0)
    for status in ("failed", "timeout", "invalid"):
        assert judge({"status": status}, ["metrics.x"], [0.0]).state == TrialState.FAIL
    missing = judge({"status": "ok", "metrics": {}}, ["metrics.mfu"], [0.0])
    assert missing.state == TrialState.FAIL and "metrics.mfu=None" in missing.attrs["error"]


def test_patience_counts_only_moves_of_the_best_beyond_the_noise_band() -> None:
    study = optuna.create_study(direction="maximize")
    # (tokens/s per GPU, the record's noise band): 104 and 106 lie within the first point's ±5%, 120 does not
    for value, band in ((100.0, 0.05), (104.0, 0.01), (120.0, 0.02), (121.0, 0.01), (106.0, 0.0)):
        trial = study.ask()
        tell(
            study,
            trial,
            judge(
                {"status": "ok", "metrics": {"tokens_per_s_per_gpu": value, "noise_band_frac": band}},
                ["metrics.tokens_per_s_per_gpu"],
                [0.0],
            ),
        )
    trials = study.trials
    measured = partial(noise_band, objective="metrics.tokens_per_s_per_gpu", fixed=None)
    assert [measured(t) for t in trials] == [0.05, 0.01, 0.02, 0.01, 0.0]
    assert trials_since_improvement(trials, study.direction, measured) == 2  # 120 moved it; 121 did not
    assert trials_since_improvement(trials[:2], study.direction, measured) == 1
    assert trials_since_improvement(trials, study.direction) == 1  # no band: 121 is an improvement
    fixed = partial(noise_band, objective="metrics.tokens_per_s_per_gpu", fixed=0.2)
    assert trials_since_improvement(trials, study.direction, fixed) == 4
    # a band is a throughput band: it does not blur a memory objective
    assert noise_band(trials[0], "metrics.peak_mem_bytes", None) == 0.0


def test_an_earlier_trial_with_fewer_launches_than_repeats_answers_nothing() -> None:
    study = optuna.create_study(direction="maximize")
    trial = study.ask({"mbs": CategoricalDistribution([1, 2])})
    tell(
        study,
        trial,
        judge(
            {"status": "ok", "metrics": {"tokens_per_s_per_gpu": 9.0, "repeats_ok": 2}},
            ["metrics.tokens_per_s_per_gpu"],
            [0.0],
        ),
    )
    assert repeat_outcome(study.trials, trial.params, repeats=2).values == [9.0]
    assert repeat_outcome(study.trials, trial.params, repeats=3) is None


# --- toy searches (real Hydra, real Optuna journal, no torch) ---------------------------------
@pytest.fixture(scope="module")
def tpe_search(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    sweep_dir = tmp_path_factory.mktemp("tpe")
    stdout = toy_sweep(
        sweep_dir, *TOY_SPACE, "oom_above_mbs=4", "hydra.sweeper.n_trials=12", f"calls_log={sweep_dir / 'calls.jsonl'}"
    )
    return sweep_dir, stdout


@pytest.mark.subprocess
def test_toy_search_writes_best_yaml_that_reproduces(tpe_search: tuple[Path, str], tmp_path: Path) -> None:
    sweep_dir, stdout = tpe_search
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["n_trials"] == 12 and best["directions"] == ["maximize"]
    point = best["best"]
    assert point["status"] == "ok"
    assert point["values"]["metrics.score"] == pytest.approx(toy_score(point["overrides"]))
    study = load_study(sweep_dir)
    feasible = [t.value for t in study.trials if t.user_attrs["status"] == "ok"]
    assert point["values"]["metrics.score"] == max(feasible)
    assert f"Best (trial {point['trial']})" in stdout and "metrics.score" in stdout  # the printed table
    rows = (sweep_dir / "trials.csv").read_text().splitlines()
    assert len(rows) == 13 and rows[0].startswith("trial,state,status,metrics.score,feasible")
    # The overrides are accepted by the app itself and run the same point.
    run_python_script(
        [str(TOY_APP), *point["overrides"], f"calls_log={tmp_path / 'calls.jsonl'}", f"hydra.run.dir={tmp_path}"]
    )
    kv = dict(o.split("=", 1) for o in point["overrides"])
    assert calls(tmp_path) == [{"x": float(kv["x"]), "mbs": int(kv["mbs"]), "kind": kv["kind"], "num": None}]
    # hydra.job.num of every launched job is its trial number.
    assert sorted(c["num"] for c in calls(sweep_dir)) == sorted(
        t.number for t in study.trials if "answered_from" not in t.user_attrs
    )


@pytest.mark.subprocess
def test_oom_trials_are_stored_infeasible(tpe_search: tuple[Path, str]) -> None:
    study = load_study(tpe_search[0])
    ooms = [t for t in study.trials if t.params["mbs"] > 4]
    assert ooms, "the search never tried an mbs that does not fit"
    for t in study.trials:
        assert t.state == TrialState.COMPLETE
        if t.params["mbs"] > 4:
            assert t.user_attrs["status"] == "oom" and t.constraints == {"oom": 1.0}
        else:
            assert t.user_attrs["status"] == "ok" and t.constraints == {"oom": 0.0}
    assert study.best_trial.params["mbs"] <= 4


@pytest.mark.subprocess
def test_journal_opens_in_optuna_dashboard(tpe_search: tuple[Path, str]) -> None:
    import optuna_dashboard

    sweep_dir = tpe_search[0]
    app = optuna_dashboard.wsgi(JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal"))))

    def get(path: str) -> Any:
        environ: dict[str, Any] = {"PATH_INFO": path}
        setup_testing_defaults(environ)
        status: list[str] = []
        body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
        assert status == ["200 OK"], body[:500]
        return json.loads(body)

    (summary,) = get("/api/studies")["study_summaries"]
    assert summary["study_name"] == sweep_dir.name and summary["directions"] == ["maximize"]
    detail = get(f"/api/studies/{summary['study_id']}")
    assert len(detail["trials"]) == 12 and detail["objective_names"] == ["metrics.score"]


@pytest.mark.subprocess
def test_readme_opens_the_study_in_pandas(tpe_search: tuple[Path, str]) -> None:
    """docs/search.md's recipe, run on a finished search: one row per trial with the record's status."""
    sweep_dir = tpe_search[0]
    readme = (REPO / "docs" / "search.md").read_text()
    code = readme.split("The study in pandas", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    code = code.replace("runs/best_throughput/optuna.journal", str(sweep_dir / "optuna.journal"))
    code = code.replace('study_name="best_throughput"', f"study_name={sweep_dir.name!r}")
    scope: dict[str, Any] = {}
    exec(code, scope)
    trials = scope["trials"]
    assert len(trials) == 12 and {"number", "value_metrics.score", "params_mbs", "user_attrs_status"} <= set(
        trials.columns
    )
    assert set(trials["user_attrs_status"]) == {"ok", "oom"}


@pytest.mark.subprocess
def test_failures_are_tolerated_up_to_max_failure_rate(tmp_path: Path) -> None:
    toy_sweep(tmp_path / "tolerant", "x=0.3", "kind=a,b", "mbs=1,2", "fail_kind=b", "hydra.sweeper.n_trials=6")
    study = load_study(tmp_path / "tolerant")
    assert {t.state for t in study.trials if t.params["kind"] == "b"} == {TrialState.FAIL}
    assert len(study.trials) == 6
    err = run_with_error(
        toy_command(
            tmp_path / "strict",
            "x=0.3",
            "kind=choice(b)",
            "fail_kind=b",
            "hydra.sweeper.n_trials=6",
            "hydra.sweeper.max_failure_rate=0.5",
        )
    )
    assert "1 of 1 trials failed (100%), above hydra.sweeper.max_failure_rate=0.5" in err


@pytest.mark.subprocess
def test_patience_stops_and_repeated_points_are_not_run_again(tmp_path: Path) -> None:
    stdout = toy_sweep(
        tmp_path,
        "x=0.3",
        "mbs=2",
        "kind=choice(a)",
        "hydra.sweeper.n_trials=50",
        "hydra.sweeper.patience=3",
        f"calls_log={tmp_path / 'calls.jsonl'}",
    )
    study = load_study(tmp_path)
    assert len(study.trials) == 4 and "3 trials without a better feasible value (patience=3)" in stdout
    assert len(calls(tmp_path)) == 1
    assert [t.user_attrs.get("answered_from") for t in study.trials] == [None, "trial 0", "trial 0", "trial 0"]
    # resumed over another space (mbs now searched): said, not silently mixed in
    again = toy_sweep(tmp_path, "x=0.3", "mbs=1,2", "kind=choice(a)", "hydra.sweeper.n_trials=5")
    assert f"Study '{tmp_path.name}''s trials so far searched ['kind']; this run searches ['mbs', 'kind']" in again


@pytest.mark.subprocess
def test_patience_with_a_noise_band_stops_when_nothing_beats_the_first_point_beyond_it(tmp_path: Path) -> None:
    # scores 1.1 ... 1.6 (mbs 1 ... 6): within a ±20% band of one another, so no trial moves the best
    stdout = toy_sweep(
        tmp_path,
        "x=0.3",
        "mbs=1,2,3,4,5,6",
        "kind=choice(a)",
        "hydra.sweeper.n_trials=50",
        "hydra.sweeper.patience=3",
        "hydra.sweeper.noise_band=0.2",
        f"calls_log={tmp_path / 'calls.jsonl'}",
    )
    assert len(load_study(tmp_path).trials) == 4 and len(calls(tmp_path)) == 4
    assert (
        "3 trials without a better feasible value (patience=3); one within the noise band of the best does "
        "not count (hydra.sweeper.noise_band=0.2)"
    ) in stdout
    err = run_with_error(toy_command(tmp_path / "bad", "x=0.3", "hydra.sweeper.noise_band=1.5"))
    assert "hydra.sweeper.noise_band=1.5 must be a fraction in [0, 1)" in err


@pytest.mark.subprocess
def test_a_search_space_value_no_point_can_take_is_refused_before_the_study_opens(tmp_path: Path) -> None:
    """Every value of the space (a range's ends) is checked alone over the fixed overrides before the study opens,
    the dry run's too: a value no point can take and a misspelt key end the command (exit 2) naming them, where
    trials ran first (real points launched) and the run then exited 0. A value that only some combinations make
    invalid (dp_shard 2, which does not divide the base config's dp=1 but divides the space's dp 2 and 4) is left to
    its trials."""

    def search(*overrides: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "scaling", "run", *SWEEPER, "model=tiny", "logger=none"]
        return subprocess.run([*argv, f"sweep_dir={tmp_path / 'runs'}", *overrides], capture_output=True, text=True)

    for dry in ([], ["hydra.sweeper.dry_run=true"]):
        bad = search("parallel.zero_stage=0,4", "train.mbs=range(0,4)", "parallel.dp=1,2", *dry)
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert bad.stderr.strip().splitlines()[-1] == (
            "scaling run: hydra.sweeper.params: parallel.zero_stage=4 is not valid: choose one of 0, 1, 2, 3; "
            "train.mbs=0 must be a positive integer"
        ), bad.stderr
    misspelt = search("train.mbz=2,8")
    assert misspelt.returncode == 2 and "Key 'mbz' not in 'TrainConfig' (did you mean 'mbs'?)" in misspelt.stderr
    assert not (tmp_path / "runs" / "optuna.journal").exists()  # no study opened, no trial run
    combined = search("parallel.dp=2,4", "parallel.dp_shard=1,2", "hydra.sweeper.dry_run=true")
    assert combined.returncode == 0 and "parallel.dp_shard in {1, 2}" in combined.stdout, (
        combined.stdout + combined.stderr
    )


@pytest.mark.subprocess
def test_grid_sampler_visits_each_point_once(tmp_path: Path) -> None:
    stdout = toy_sweep(
        tmp_path,
        "x=range(0,1,0.5)",
        "mbs=1,2",
        "kind=a,b",
        "hydra.sweeper.sampler.name=grid",
        "hydra.sweeper.n_trials=50",
        "hydra.sweeper.n_jobs=3",
    )
    study = load_study(tmp_path)
    points = {(t.params["x"], t.params["mbs"], t.params["kind"]) for t in study.trials}
    assert len(study.trials) == 8 and len(points) == 8
    assert "the grid sampler visited every point" in stdout
    # each job of a batch of three ran its own trial's point (the sweeper hands the launcher the configs it composed)
    assert [t.value for t in study.trials] == [
        pytest.approx(toy_score(t.user_attrs["overrides"])) for t in study.trials
    ]


@pytest.mark.subprocess
@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_tpe_and_random_propose_untried_points_until_the_space_is_used_up(tmp_path: Path, sampler: str) -> None:
    toy_sweep(
        tmp_path,
        "x=range(0,1,0.5)",
        "mbs=1,2",
        "kind=a,b",
        f"hydra.sweeper.sampler.name={sampler}",
        "hydra.sweeper.sampler.n_startup_trials=2",
        "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.n_trials=10",
        "hydra.sweeper.n_jobs=2",
    )
    trials = load_study(tmp_path).trials
    points = [(t.params["x"], t.params["mbs"], t.params["kind"]) for t in trials]
    assert len(points) == 10 and len(set(points[:8])) == 8  # each of the 8 points once, then repeats
    assert [bool(t.user_attrs.get("answered_from")) for t in trials] == [False] * 8 + [True] * 2


def test_untried_first_counts_failed_points_as_tried_and_stale_ones_as_untried() -> None:
    space = parse_search_space(["a=1,2", "b=x,y"], OverridesParser.create())
    study = optuna.create_study(direction="maximize")
    study.sampler = make_sampler("tpe", 0, 1, space, 1)
    tried = [
        ({"a": 1, "b": "x"}, TrialState.FAIL, {}),
        ({"a": 2, "b": "x"}, TrialState.COMPLETE, {}),
        ({"a": 1, "b": "y"}, TrialState.FAIL, {"stale": True}),
    ]  # left running by a dead driver
    for params, state, attrs in tried:
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=space.distributions,
                state=state,
                value=1.0 if state == TrialState.COMPLETE else None,
                user_attrs=attrs,
            )
        )
    proposed = []
    for _ in range(2):
        trial = study.ask(space.distributions)
        proposed.append((trial.params["a"], trial.params["b"]))
        study.tell(trial, 2.0)
    assert sorted(proposed) == [(1, "y"), (2, "y")]


def test_untried_first_knows_a_float_step_point_however_optuna_rounds_it() -> None:
    space = parse_search_space(["lr=range(0.1,0.5,0.1)", "b=x,y"], OverridesParser.create())
    study = optuna.create_study(direction="maximize")
    study.sampler = make_sampler("tpe", 1, 2, space, 1)
    for _ in range(8):
        trial = study.ask(space.distributions)
        study.tell(trial, trial.params["lr"] * (2 if trial.params["b"] == "y" else 1))
    assert len({(round(t.params["lr"], 9), t.params["b"]) for t in study.trials}) == 8


@pytest.mark.subprocess
def test_two_objectives_give_a_feasible_pareto_front_in_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    toy_sweep(
        tmp_path,
        *TOY_SPACE,
        "oom_above_mbs=8",
        "hydra.sweeper.n_trials=8",
        "hydra.sweeper.sampler.name=random",
        "hydra.sweeper.objectives=[metrics.score,metrics.mem]",
        "hydra.sweeper.directions=[maximize,minimize]",
        f"hydra.sweeper.storage={url}",
        "hydra.sweeper.study_name=pareto",
    )
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    study = optuna.load_study(study_name="pareto", storage=url)
    ok = [t for t in study.trials if t.user_attrs["status"] == "ok"]
    front = best["pareto_front"]
    assert front and best["best"] == front[0] and best["storage"] == url
    for p in front:
        score, mem = p["values"]["metrics.score"], p["values"]["metrics.mem"]
        assert p["status"] == "ok"
        assert not any(t.values[0] > score and t.values[1] < mem for t in ok)  # nothing dominates it


@pytest.mark.subprocess
def test_cmaes_sampler_runs(tmp_path: Path) -> None:
    pytest.importorskip("cmaes")
    toy_sweep(
        tmp_path,
        "x=interval(0,1)",
        "mbs=tag(int,interval(1,8))",
        "kind=b",
        "hydra.sweeper.sampler.name=cmaes",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.sampler.n_startup_trials=2",
    )
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["best"]["status"] == "ok"


@pytest.mark.subprocess
@pytest.mark.own_agent_servers
def test_sigkilled_search_resumes_without_repeating_finished_trials(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    for n in (0, 1):  # two trials run through; the third stops in flight at the test gate
        (gates / f"call{n}.go").touch()
    cmd = [
        sys.executable,
        *toy_command(tmp_path, *TOY_SPACE, "hydra.sweeper.n_trials=5", f"calls_log={tmp_path / 'calls.jsonl'}"),
    ]
    driver = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, GATE_ENV: str(gates)}
    )
    try:
        deadline = time.monotonic() + 120
        while not (gates / "call2.reached").exists():
            assert time.monotonic() < deadline and driver.poll() is None, "the driver never reached its third trial"
            time.sleep(0.05)
        trials = load_study(tmp_path).trials
        running = [t for t in trials if t.state == TrialState.RUNNING]
        assert sum(t.state == TrialState.COMPLETE for t in trials) == 2 and len(running) == 1
        assert len(running[0].params) == 3  # mid-flight: the trial has all its parameters and its job runs
    finally:
        driver.kill()  # SIGKILL
        driver.wait()
    before = {t.number: t for t in load_study(tmp_path).trials}
    finished = {n: t for n, t in before.items() if t.state == TrialState.COMPLETE}
    killed = [n for n, t in before.items() if t.state == TrialState.RUNNING]
    n_calls_before = len(calls(tmp_path))
    assert len(killed) == 1 and n_calls_before == len(finished)

    run_process(cmd)
    after = load_study(tmp_path).trials
    for n, t in finished.items():  # finished trials are kept as they were
        assert (after[n].state, after[n].params, after[n].values) == (TrialState.COMPLETE, t.params, t.values)
    stale = after[killed[0]]
    assert stale.state == TrialState.FAIL and stale.user_attrs["stale"] is True
    (retry,) = [t for t in after if t.user_attrs.get("retry_of") == killed[0]]
    assert retry.params == stale.params and retry.state == TrialState.COMPLETE
    counted = [t for t in after if not t.user_attrs.get("stale")]
    assert len(counted) == 5 and all(t.state == TrialState.COMPLETE for t in counted)
    new_calls = calls(tmp_path)[n_calls_before:]
    assert sorted(c["num"] for c in new_calls) == sorted(t.number for t in counted if t.number not in finished)
    assert not {c["x"] for c in new_calls} & {t.params["x"] for t in finished.values()}


# --- the real engine: torchrun over gloo, one timed step, on a model of one's own: the tiny model's shapes as a
# Hugging Face Llama (conf/model/hf_llama_tiny.yaml), so the search runs as it does on the built-in family --------
ENGINE_POINT = [
    "model=hf_llama_tiny",
    "train.steps=1",
    "train.warmup_steps=1",
    "hardware.memory_gb=0.02",
    "launch.prescreen=false",
    "launch.reuse=true",  # the trials' subject is the search, not start-up: one warm job serves both
    "logger=none",
]


def engine_sweep(sweep_dir: Path, *overrides: str) -> str:
    """`python -m scaling run -m` under the sweeper, grid over mbs: 2 fits, 64 does not fit in 0.02 GiB."""
    stdout, _ = run_process(
        [
            sys.executable,
            "-m",
            "scaling",
            "run",
            *SWEEPER,
            "hydra.sweeper.sampler.name=grid",
            "train.mbs=2,64",
            "sweep=optuna_cpu",
            f"sweep_dir={sweep_dir}",
            *ENGINE_POINT,
            *overrides,
        ]
    )
    return stdout


@pytest.fixture(scope="module")
def engine_search(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sweep_dir = tmp_path_factory.mktemp("engine") / "optuna_cpu"
    engine_sweep(sweep_dir, "hydra.sweeper.n_trials=2")
    return sweep_dir


@pytest.mark.subprocess
def test_engine_search_stores_oom_infeasible(engine_search: Path) -> None:
    trials = {t.params["train.mbs"]: t for t in load_study(engine_search).trials}
    assert sorted(trials) == [2, 64]
    assert trials[64].user_attrs["status"] == "oom" and trials[64].constraints == {"oom": 1.0}
    t = trials[2]
    record = read_record(engine_search, t.user_attrs["job_key"])
    assert t.user_attrs["status"] == "ok" and t.constraints == {"oom": 0.0}
    assert t.value == record["metrics"]["tokens_per_s_per_gpu"] > 0
    # the record names the trial (and Hydra job) that made it, with the trial's overrides
    assert record["provenance"]["optuna_trial"] == record["provenance"]["hydra_job_num"] == t.number
    assert "train.mbs=2" in record["provenance"]["overrides"]


@pytest.mark.subprocess
def test_engine_best_point_runs_with_scaling_run(engine_search: Path) -> None:
    """best.yaml's command names the best point itself: `scaling run` with its overrides is answered by the
    best point's record (a re-run of a best point is test_toy_search_writes_best_yaml_that_reproduces)."""
    best = yaml.safe_load((engine_search / "best.yaml").read_text())["best"]
    assert best["status"] == "ok" and best["trial"] in (0, 1)
    assert f"sweep_dir={engine_search}" in best["overrides"] and "train.mbs=64" not in best["overrides"]
    # a model of one's own is named by its file first (the default config's model is the built-in family's)
    assert best["command"].startswith("python -m scaling run model=hf_llama_tiny model.name=hf_llama_tiny ")
    stdout, _ = run_process([sys.executable, "-m", "scaling", "run", *best["run_overrides"], "logger=none"])
    assert f"[scaling] {best['job_key']} already recorded as ok: skipped" in stdout


@pytest.mark.subprocess
def test_recorded_points_are_answered_from_the_store(engine_search: Path) -> None:
    stdout = engine_sweep(engine_search, "hydra.sweeper.n_trials=2", "hydra.sweeper.study_name=replay")
    assert "Launching" not in stdout
    storage = JournalStorage(JournalFileBackend(str(engine_search / "optuna.journal")))
    replay = optuna.load_study(study_name="replay", storage=storage).trials
    assert [t.user_attrs["answered_from"] for t in replay] == ["record store"] * 2
    assert sorted(t.user_attrs["status"] for t in replay) == ["ok", "oom"]


@pytest.mark.subprocess
def test_sweep_file_search_names_a_point_the_default_config_reproduces(tmp_path: Path) -> None:
    """sweeps/best_throughput.yaml for one (shrunk) trial; its winner, run from conf/config.yaml (no
    fixed batch, no memory cap), composes to the same job_key."""
    sweep_dir = tmp_path / "best_throughput"
    run_process(
        [
            sys.executable,
            "-m",
            "scaling",
            "sweep",
            "best_throughput",
            "hydra.sweeper.n_trials=1",
            "model=tiny",
            "train.gbs=4",
            "train.mbs=2",
            "parallel.dp=1",
            "train.steps=1",
            "train.warmup_steps=0",
            "logger=none",
            f"sweep_dir={sweep_dir}",
        ]
    )
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())["best"]
    assert best["status"] == "ok"
    assert {"train.grad_acc=auto", "train.gbs=4", "train.seq_len=128", "hardware.memory_gb=0.047"} <= set(
        best["run_overrides"]
    )
    assert job_key(compose_point(best["run_overrides"])) == best["job_key"]
