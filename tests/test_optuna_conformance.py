"""The scaling_optuna sweeper run through Hydra's own sweeper test utilities (`hydra.test_utils`, the
`hydra_sweep_runner` fixture) on tasks outside this project, with hydra-optuna-sweeper's keys:
`direction`, a sampler from `hydra/sweeper/sampler` (a `_target_`), `custom_search_space`, and tasks
that return their objective value(s) as numbers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import optuna
import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.test_utils.test_utils import TSweepRunner
from optuna.distributions import IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import StudyDirection

from hydra_plugins.scaling_optuna_sweeper._impl import resolve_objectives
from hydra_plugins.scaling_optuna_sweeper._space import parse_search_space
from tests.toy_app.toy_app import main as toy_main

TOY_APP = Path(__file__).resolve().parent / "toy_app" / "toy_app.py"


def study_in(sweep_dir: Path) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal")))
    return optuna.load_study(study_name=sweep_dir.name, storage=storage)


@pytest.mark.slow
def test_launch_jobs(hydra_sweep_runner: TSweepRunner, tmp_path: Path) -> None:
    """hydra-optuna-sweeper's own launch test: Hydra's test app, whose task returns 100."""
    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        task_function=None,
        config_path="configs",
        config_name="compose.yaml",
        temp_dir=tmp_path / "sweep",
        overrides=[
            "hydra/sweeper=scaling_optuna",
            "hydra/launcher=basic",
            "hydra.sweeper.n_trials=8",
            "hydra.sweeper.n_jobs=3",
            "group1=file1,file2",
        ],
    )
    with sweep:
        assert sweep.returns["values"] == {"metrics.tokens_per_s_per_gpu": 100.0}
        trials = study_in(tmp_path / "sweep").trials
        assert len(trials) == 8 and {t.value for t in trials} == {100.0}
        assert {t.params["group1"] for t in trials} == {"file1", "file2"}


@pytest.mark.slow
def test_hydra_optuna_sweeper_keys_on_a_task_outside_the_project(
    hydra_sweep_runner: TSweepRunner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    calls = tmp_path / "calls.jsonl"
    sweep = hydra_sweep_runner(
        calling_file=str(TOY_APP),
        calling_module=None,
        task_function=toy_main,
        config_path="conf",
        config_name="config",
        temp_dir=tmp_path / "toy",
        overrides=[
            "hydra/sweeper=scaling_optuna",
            "hydra/sweeper/sampler=random",
            "hydra.sweeper.sampler.seed=3",
            "hydra.sweeper.direction=maximize",
            "hydra.sweeper.objectives=[metrics.score]",
            "hydra.sweeper.custom_search_space=tests.toy_app.toy_app.mbs_for_kind",
            "hydra.sweeper.n_trials=6",
            "x=interval(0,1)",
            "kind=a,b",
            f"calls_log={calls}",
        ],
    )
    with sweep:  # the sweep's folder is gone once the block ends
        study = study_in(tmp_path / "toy")
        directions, trials = study.directions, study.trials
        best = yaml.safe_load((tmp_path / "toy" / "best.yaml").read_text())["best"]
    assert "with RandomSampler" in caplog.text  # the sampler Hydra built from the group's _target_
    assert directions == [StudyDirection.MAXIMIZE] and len(trials) == 6
    for trial in trials:  # the custom space saw the sampled kind, and the app got its mbs
        assert trial.params["mbs"] in ({"a": (1, 2), "b": (4, 8)}[trial.params["kind"]])
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert {(c["kind"], c["mbs"]) for c in ran} <= {("a", 1), ("a", 2), ("b", 4), ("b", 8)}
    assert sweep.returns == best and any(o.startswith("mbs=") for o in best["overrides"])


@pytest.mark.slow
def test_a_task_returning_a_list_of_values_with_a_list_of_directions(
    hydra_sweep_runner: TSweepRunner, tmp_path: Path
) -> None:
    def two_values(cfg):  # hydra-optuna-sweeper's multi-objective contract: one float per direction
        return [(cfg.x - 0.3) ** 2, float(cfg.mbs)]

    sweep = hydra_sweep_runner(
        calling_file=str(TOY_APP),
        calling_module=None,
        task_function=two_values,
        config_path="conf",
        config_name="config",
        temp_dir=tmp_path / "mo",
        overrides=[
            "hydra/sweeper=scaling_optuna",
            "hydra.sweeper.direction=[minimize,minimize]",
            "hydra.sweeper.n_trials=6",
            "hydra/sweeper/sampler=tpe",
            "hydra.sweeper.sampler.seed=0",
            "x=interval(0,1)",
            "mbs=1,2,4",
        ],
    )
    with sweep:
        study = study_in(tmp_path / "mo")
        directions, names, trials = study.directions, study.metric_names, study.trials
        doc = yaml.safe_load((tmp_path / "mo" / "best.yaml").read_text())
    assert directions == [StudyDirection.MINIMIZE] * 2 and names == ["value_0", "value_1"]
    assert all(t.values == [(t.params["x"] - 0.3) ** 2, float(t.params["mbs"])] for t in trials)
    assert doc["pareto_front"] and all(set(p["values"]) == {"value_0", "value_1"} for p in doc["pareto_front"])


def test_direction_and_interval_casts_as_hydra_optuna_sweeper_reads_them() -> None:
    assert resolve_objectives(["metrics.tokens_per_s_per_gpu"], None, "minimize") == (
        ["metrics.tokens_per_s_per_gpu"],
        ["minimize"],
    )
    assert resolve_objectives(["metrics.tokens_per_s_per_gpu"], None, None)[1] == ["maximize"]
    assert resolve_objectives(["a", "b"], ["maximize", "minimize"], ["maximize", "minimize"]) == (
        ["a", "b"],
        ["maximize", "minimize"],
    )
    with pytest.raises(ValueError, match=r"direction=\['minimize'\] and hydra.sweeper.directions=\['maximize'\]"):
        resolve_objectives(["m"], ["maximize"], "minimize")
    space = parse_search_space(["a=int(interval(1,5))", "b=range(1,3)"], OverridesParser.create())
    assert space.distributions["a"] == IntDistribution(1, 5)
    # Hydra's range stops before its end (as in the basic sweeper); hydra-optuna-sweeper includes it
    assert space.distributions["b"] == IntDistribution(1, 2)
