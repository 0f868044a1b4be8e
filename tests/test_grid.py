"""A grid's points without a composition each (scaling/grid.py): the config, and so the job key, of every
point equals what a full Hydra composition of that point gives, for every sweep file in sweeps/ and for
the overrides that take the slower paths (package-global group files, `++`, interpolations)."""

from __future__ import annotations

import dataclasses
import functools
import textwrap
from collections import Counter
from pathlib import Path
from typing import Optional

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from scaling.core.enums import Status
from scaling.core.sample import sampled
from scaling.core.schema import CONF_DIR, EXPERIMENT_GROUPS, ExperimentConfig, LaunchConfig
from scaling.launch.resolvers import register_configs
from scaling.store.record import answers
from scaling.sweep.compose import sweep_file_grid
from scaling.sweep.grid import (
    LAUNCH,
    Forecast,
    GridPoint,
    format_duration,
    launch_wall_s,
    predict_new,
    survey,
    wall_estimate_s,
)
from scaling.sweep.progress import count_grid
from tests.helpers.compose import REPO, compose_point
from tests.helpers.records import key_of

SWEEP_FILES = sorted((REPO / "sweeps").glob("*.yaml"))


def groups_of(cfg: DictConfig) -> dict[str, object]:
    """A composed config's experiment groups, resolved: what its job key hashes."""
    return {group: OmegaConf.to_container(cfg[group], resolve=True) for group in EXPERIMENT_GROUPS}


def full_keys(sweep_file: Path, points: list[list[str]]) -> list[str]:
    """Job keys from a full composition of each point, as its Hydra job composes it."""
    register_configs()
    keys = []
    with initialize_config_dir(config_dir=str(sweep_file.parent), version_base="1.3"):
        for overrides in points:
            cfg = compose(
                sweep_file.stem,
                overrides=[f"hydra.searchpath=[file://{CONF_DIR}]", *overrides],
                return_hydra_config=True,
            )
            keys.append(key_of(groups_of(cfg)))
    return keys


def test_every_sweep_file_is_covered():
    assert {"demo", "dp_scaling", "playbook_grid", "best_throughput"} <= {p.stem for p in SWEEP_FILES}


def covering(points: list[list[str]], groups: frozenset[str]) -> list[list[str]]:
    """Points, in grid order, until every value of every axis has been seen under every group choice."""
    seen, chosen = set(), []
    for point in points:
        choice = tuple(o for o in point if o.split("=")[0] in groups)
        pairs = {(choice, o) for o in point}
        if pairs - seen:
            chosen.append(point)
            seen |= pairs
    return chosen


@functools.cache
def hydras_jobs(sweep_file: Path) -> dict[tuple[str, ...], DictConfig]:
    """Of a sweep file, the points that show each axis value under each group choice, each with the job config
    Hydra's basic launcher composes for it (`load_sweep_config`, a full composition: ~0.5 s each). Composed once per
    worker for the tests that hold the grid's own configs and keys to them (SWEEP_FILE_JOBS keeps them together)."""
    with sweep_file_grid(sweep_file) as (points, configs):
        checked = covering(points, configs.groups)
        return {tuple(p): configs.loader.load_sweep_config(configs.master, list(p)) for p in checked}


SWEEP_FILE_JOBS = "sweep_file_jobs"
"""The pytest-xdist group of the tests that read `hydras_jobs`: on one worker, each sweep file's points are composed
in full once."""


@pytest.mark.slow
@pytest.mark.xdist_group(SWEEP_FILE_JOBS)
@pytest.mark.parametrize("sweep_file", SWEEP_FILES, ids=lambda p: p.stem)
def test_keys_equal_a_full_composition(sweep_file):
    """Of every sweep file, the points that show each axis value under each group choice (a full composition
    costs ~0.5 s: 856 of them would take minutes of CI)."""
    with sweep_file_grid(sweep_file) as (points, configs):
        fast = {tuple(p.overrides): p.key for p in survey(points, configs)}
        choices = {tuple(o for o in p if o.split("=")[0] in configs.groups) for p in points}
        assert configs.compositions == len(choices)  # one per group choice, none per point
    assert len(points) > 1 and len(set(fast.values())) == len(points)
    jobs = hydras_jobs(sweep_file)
    assert [fast[p] for p in jobs] == [key_of(groups_of(job)) for job in jobs.values()]


def write_grid(tmp_path: Path) -> Path:
    """A sweep file whose group files are package-global and whose values interpolate another group's."""
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "wide.yaml").write_text("# @package _global_\nparallel:\n  dp: 2\n")
    (tmp_path / "case" / "narrow.yaml").write_text("# @package _global_\nparallel:\n  dp: 1\n")
    (tmp_path / "grid.yaml").write_text(
        textwrap.dedent("""\
        defaults:
          - config
          - _self_
          - case: narrow
        sweep: grid
        train:
          seq_len: ${model.max_seq_len}
          gbs_tokens: ${train.seq_len}
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              model: tiny,small
              case: wide,narrow
              train.mbs: 1,2
        """)
    )
    return tmp_path / "grid.yaml"


def keys_of(surveyed: list[GridPoint]) -> dict[tuple[str, ...], str]:
    """The surveyed points' job keys by their overrides."""
    return {tuple(p.overrides): p.key for p in surveyed}


@pytest.mark.slow
def test_group_files_force_adds_and_interpolations_compose_exactly(tmp_path):
    """Of each grid, every point's key is its own, and the points that show each axis value under each group choice
    (`covering`) have the keys a full composition gives."""
    write_grid(tmp_path)
    with sweep_file_grid(tmp_path / "grid.yaml", ["++train.steps=2", "parallel.zero_stage=1,3"]) as (points, configs):
        surveyed = list(survey(points, configs))
        assert configs.compositions == 4  # model x case; ++ is part of every composition
        checked = covering(points, configs.groups)
    assert len(points) == 16 and len({p.key for p in surveyed}) == len(points)
    assert [keys_of(surveyed)[tuple(p)] for p in checked] == full_keys(tmp_path / "grid.yaml", checked)
    by_model = {p.cfg.model.name: p.cfg.train for p in surveyed}
    assert by_model["small"].seq_len != by_model["tiny"].seq_len  # the interpolation follows the group
    assert {p.cfg.train.gbs_tokens == p.cfg.train.seq_len for p in surveyed} == {True}
    assert {(p.cfg.parallel.dp, "case=wide" in p.overrides) for p in surveyed} == {(2, True), (1, False)}

    # A value of a key another interpolates (gbs_tokens: ${train.seq_len}) is applied to its group choice's
    # composition, which is resolved again (once per value); the other values are set on that resolved config: the
    # interpolation follows the value.
    with sweep_file_grid(tmp_path / "grid.yaml", ["train.seq_len=16,32"]) as (points, configs):
        surveyed = list(survey(points, configs))
        assert configs.compositions == 4  # model x case
        assert len(configs._bound) == 4 * 2  # and each resolved again with each seq_len
        checked = covering(points, configs.groups)
    assert len(points) == 16 and len({p.key for p in surveyed}) == len(points)
    assert [keys_of(surveyed)[tuple(p)] for p in checked] == full_keys(tmp_path / "grid.yaml", checked)
    assert {(p.cfg.train.seq_len, p.cfg.train.gbs_tokens) for p in surveyed} == {(16, 16), (32, 32)}

    # A value that reads the hydra node cannot be resolved without it: such points are composed in full.
    with sweep_file_grid(tmp_path / "grid.yaml", ["logger.project=${hydra.job.name}"]) as (points, configs):
        surveyed = list(survey(points, configs))
        assert configs.compositions == 4 + len(points)
    assert [p.key for p in surveyed] == full_keys(tmp_path / "grid.yaml", points) and len(points) == 8


def assert_jobs_composed_as_hydra(points: list, configs, composed: Optional[dict] = None) -> None:
    """Each point's job config (hydra node included) equals the one Hydra's launcher composes for the job (in
    `composed`, by the point's overrides, where given)."""
    for overrides in points:
        job = configs.job_config(list(overrides))
        hydras = (
            composed[tuple(overrides)]
            if composed is not None
            else configs.loader.load_sweep_config(configs.master, list(overrides))
        )
        assert OmegaConf.to_container(job) == OmegaConf.to_container(hydras), overrides
        resolved = [{k: OmegaConf.select(c, str(k)) for k in c if k != "hydra"} for c in (job, hydras)]
        assert resolved[0] == resolved[1] and job.hydra.overrides.task == list(overrides)
        assert job.hydra.job.override_dirname == hydras.hydra.job.override_dirname != ""


@pytest.mark.slow
@pytest.mark.xdist_group(SWEEP_FILE_JOBS)
@pytest.mark.parametrize("sweep_file", SWEEP_FILES, ids=lambda p: p.stem)
def test_the_jobs_of_a_sweep_file_get_the_config_hydra_composes(sweep_file):
    """What the grid sweeper hands Hydra's basic launcher (`PointConfigs.job_config`) for the points that show each
    axis value under each group choice: the sweep file's defaults, values and interpolations, and the hydra node."""
    jobs = hydras_jobs(sweep_file)  # composed under a Hydra of its own: before this test's
    with sweep_file_grid(sweep_file) as (points, configs):
        assert list(jobs) == [tuple(p) for p in covering(points, configs.groups)]
        assert_jobs_composed_as_hydra(list(jobs), configs, jobs)
        choices = {tuple(o for o in p if o.split("=")[0] in configs.groups) for p in points}
        assert configs.compositions == len(choices)  # one per group choice, none per job


@pytest.mark.slow
def test_jobs_with_group_files_force_adds_and_interpolations_get_the_config_hydra_composes(tmp_path):
    grid = write_grid(tmp_path)
    with sweep_file_grid(grid, ["++train.steps=2", "+launch.extra=1", "logger.project=${hydra.job.name}"]) as (
        points,
        configs,
    ):
        assert_jobs_composed_as_hydra(points, configs)
        assert {configs.job_config(p).logger.project for p in points} == {configs.master.hydra.job.name}


def test_a_job_with_a_hydra_override_is_composed_as_hydra_composes_it():
    """Hydra files a point's `hydra.` overrides apart from the task's (hydra.overrides.hydra): such a job is composed
    in full, a value (`hydra.job.chdir=true`) or an add (`+hydra.job.env_set.X=1`), under a group choice of its own."""
    with sweep_file_grid(REPO / "sweeps" / "demo.yaml") as (points, configs):
        small = next(p for p in points if "model=small" in p)
        for hydra_override in ("hydra.job.chdir=true", "+hydra.job.env_set.X=1"):
            overrides, before = [*small, hydra_override], configs.compositions
            job = configs.job_config(overrides)
            hydras = configs.loader.load_sweep_config(configs.master, overrides)
            assert configs.compositions == before + 1 and OmegaConf.to_container(job) == OmegaConf.to_container(hydras)
            assert hydra_override in job.hydra.overrides.hydra and job.hydra.overrides.task == small
            assert hydra_override.lstrip("+") not in job.hydra.job.override_dirname and job.model.name == "small"


def test_a_misspelt_key_fails_like_hydra_before_anything_runs(tmp_path):
    from hydra.errors import ConfigCompositionException

    with (
        sweep_file_grid(REPO / "sweeps" / "dp_scaling.yaml", ["train.mbz=2"]) as (points, configs),
        pytest.raises(ConfigCompositionException, match="train.mbz"),
    ):
        list(survey(points, configs))


@pytest.mark.parametrize(
    "override, meant",
    [("train.seqlen=4096", "seq_len"), ("parallel.zero=3", "zero_stage"), ("launch.timeout=60", "timeout_s")],
)
def test_a_misspelt_field_names_the_field_it_could_mean(override, meant):
    """Hydra says a key is not in the typed config; the refusal adds the field it could mean (a near spelling, or the
    field the key begins), and nothing where no field is near."""
    from scaling.sweep.compose import ComposeError, compose_config

    with pytest.raises(ComposeError, match=rf"Key '\w+' not in '\w+Config' \(did you mean '{meant}'\?\)$"):
        compose_config([override])
    with pytest.raises(ComposeError) as refused:
        compose_config(["train.xyz=1"])
    assert str(refused.value).endswith("Key 'xyz' not in 'TrainConfig'")


def _point(status, wall_s=10.0, done=True):
    record = None if status is None else {"status": status, "timing": {"wall_s": wall_s}}
    return GridPoint(0, [], ExperimentConfig(launch=LaunchConfig(timeout_s=300.0)), "k", Path("."), record, done)


def test_forecast_counts_and_estimates_from_recorded_wall_times():
    f = Forecast()
    for status, wall in [(Status.OK, 10.0), (Status.OK, 30.0), (Status.OOM, 20.0), (Status.PREDICTED_OOM, 0.01)]:
        f.add(_point(status, wall), None)
    for forecast in [LAUNCH] * 5 + [Status.PREDICTED_OOM, "invalid"]:
        f.add(_point(None, done=False), forecast)
    f.add(_point(None, done=False), LAUNCH, in_flight=True)
    assert (
        f.points == 12
        and f.recorded == Counter({Status.OK: 2, Status.OOM: 1, Status.PREDICTED_OOM: 1})
        and f.in_flight == 1
    )
    assert f.wall_s(at_once=1) == 5 * 20.0 and f.wall_s(at_once=2) == 3 * 20.0  # waves of the median
    head, wall = f.lines("g", at_once=2)
    assert head == (
        "sweep g: 12 points: 7 new (5 to launch, 1 predicted_oom, 1 invalid), "
        "4 recorded (2 ok, 1 oom, 1 predicted_oom), 1 in flight"
    )
    assert wall.startswith("wall time: about 60 s (5 launches, 2 at a time; median 20.0 s per launched point over 3")

    fresh = Forecast()
    fresh.add(_point(None, done=False), LAUNCH)
    assert fresh.wall_s(1) is None and "at most 5.0 min (1 launch, 1 at a time" in fresh.lines("g", 1)[1]
    assert format_duration(7200) == "2.0 h" and format_duration(150) == "2.5 min"


def test_the_wall_time_forecast_is_waves_of_the_median_launched_point():
    """The one estimate the grid's forecast and `scaling status` share."""
    assert launch_wall_s({"status": "timeout", "timing": {"wall_s": 7}}) == 7.0
    assert launch_wall_s({"status": Status.PREDICTED_OOM, "timing": {"wall_s": 0.1}}) is None  # never launched
    assert launch_wall_s({"status": "ok", "timing": {}}) is None and launch_wall_s(None) is None
    assert wall_estimate_s(5, 2, [10.0, 30.0, 20.0]) == 3 * 20.0 and wall_estimate_s(0, 2, [10.0]) == 0
    assert wall_estimate_s(5, 0, [10.0]) == 50.0 and wall_estimate_s(5, 2, []) is None


def test_progress_counts_the_grid_as_the_grid_expands_it():
    from omegaconf import OmegaConf

    def config(sweeper: dict, task: list[str]):
        return OmegaConf.create({"hydra": {"sweeper": sweeper, "overrides": {"task": task}}})

    assert count_grid(config({"params": {"train.mbs": "1,2,4"}}, ["parallel.dp=1,2", "model=tiny"])) == 6
    assert count_grid(config({"params": None}, ["train.mbs=range(1,5)"])) == 4
    assert count_grid(config({"n_trials": 9, "params": {"train.mbs": "1,2"}}, [])) == 9  # a search: its budget


def test_predict_new_follows_validation_and_the_prescreen():
    assert predict_new(compose_point(["parallel.zero_stage=5"]))["status"] == "invalid"
    assert predict_new(compose_point(["hardware.memory_gb=0.0001"]))["status"] == Status.PREDICTED_OOM
    assert predict_new(compose_point(["hardware.memory_gb=0.0001", "launch.prescreen=false"]))["status"] == LAUNCH
    assert predict_new(compose_point(["hardware.memory_gb=0.0001", "launch.prescreen_sample=1"]))["status"] == LAUNCH
    assert predict_new(compose_point([]))["status"] == LAUNCH


@pytest.mark.parametrize(
    "status, rerun, sample, answered",
    [
        ("ok", "none", 1.0, True),
        ("ok", "failed", 0.0, True),
        ("ok", "all", 0.0, False),
        ("oom", "failed", 1.0, True),
        ("invalid", "failed", 1.0, True),
        ("oom", "all", 0.0, False),
        ("predicted_oom", "none", 0.0, True),
        ("predicted_oom", "failed", 0.0, True),
        ("predicted_oom", "none", 1.0, False),  # in the pre-screen's sample: it runs
        ("failed", "none", 1.0, True),
        ("timeout", "none", 0.0, True),
        ("failed", "failed", 0.0, False),
        ("timeout", "failed", 0.0, False),
        ("unknown", "none", 0.0, False),
        (None, "none", 0.0, False),
    ],
)
def test_the_store_answers_a_point_by_one_rule(status, rerun, sample, answered):
    """run_point, the grid and Optuna sweepers and `scaling status` all ask `answers`."""
    record = {"status": status, "repeats": [{"status": status}]}
    assert answers(record, "0" * 12, LaunchConfig(rerun=rerun, repeats=1, prescreen_sample=sample)) is answered


def test_the_sample_that_runs_predicted_oom_points_is_chosen_by_job_key():
    launch = LaunchConfig(rerun="none", repeats=1, prescreen_sample=0.5)
    keys = [f"{i * 7919:012x}" for i in range(200)]
    inside = [k for k in keys if sampled(k, 0.5)]
    assert 0 < len(inside) < len(keys)
    assert all(answers({"status": Status.PREDICTED_OOM}, k, launch) == (k not in inside) for k in keys)
    assert not answers(None, keys[0], launch)
    one_launch = {"status": Status.OK, "repeats": [{"status": Status.OK, "metrics": {}}]}
    assert answers(one_launch, keys[0], launch)
    assert not answers(one_launch, keys[0], dataclasses.replace(launch, repeats=2))  # the missing repeat is launched
