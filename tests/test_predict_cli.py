"""`scaling predict`, the pre-screen in run_point, and `scaling find-mbs` against a direct search, with real runs.

One emulated capacity is shared by the module so the store answers repeated points: the pre-screen
loop, the direct search and find-mbs's confirmation together launch three real torchrun points.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from scaling.cli.find_mbs import main as find_mbs_main
from scaling.cli.predict import main as predict_main
from scaling.core.enums import Status
from scaling.core.units import GIB
from scaling.engine.jobfiles import RESULT_FILE
from scaling.job.run import run_point
from scaling.predictor.trace import trace_peak
from scaling.recipe.mbs_search import largest_true
from scaling.store.record import job_key, launch_dir
from scaling.sweep.grid import format_duration
from tests.helpers.cli import scaling
from tests.helpers.compose import compose_point

POINT = [
    "model=tiny",
    "train.seq_len=64",
    "train.warmup_steps=1",
    "train.steps=1",
    "launch.timeout_s=240",
    "launch.reuse=true",
]
"""Warm ranks (launch.reuse): these tests are about what fits, not about start-up."""


@pytest.fixture(scope="module")
def capacity_gb() -> float:
    """A capacity that mbs=3 overshoots by 5%: inside the pre-screen's 10% margin, so it is launched (and OOMs)."""
    return trace_peak(compose_point([*POINT, "train.mbs=3"])).peak_mem_bytes / 1.05 / GIB


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("predict")


def point(store, capacity_gb, mbs, *extra):
    return compose_point([*POINT, f"train.mbs={mbs}", f"hardware.memory_gb={capacity_gb}", *extra], store)


@pytest.mark.torchrun
def test_prescreen_skips_exactly_the_points_predicted_not_to_fit(store, capacity_gb):
    launched = {}
    for mbs in (1, 3, 5, 12):
        rec = run_point(point(store, capacity_gb, mbs))
        pred, job = rec["predicted"], store / rec["job_key"]
        assert pred["capacity_bytes"] == int(capacity_gb * GIB)
        should_skip = pred["peak_mem_bytes"] > 1.1 * pred["capacity_bytes"]
        assert (rec["status"] == Status.PREDICTED_OOM) == should_skip, (mbs, pred)
        launched[mbs] = bool(list(job.glob("launches/*/torchrun.log")))
        assert launched[mbs] == (not should_skip)  # a skipped point starts no process
        if not should_skip:
            assert rec["status"] in ("ok", "oom") and rec["predicted"]["fits"] == (rec["status"] == "ok")
            assert rec["env"]["memory_capacity"] == "emulated"
        if rec["status"] == "oom":  # measured: the tracked step's live tensors passed the emulated capacity
            assert "emulated capacity exceeded" in rec["error"]
    assert launched == {1: True, 3: True, 5: False, 12: False}
    assert (
        "predicted peak"
        in json.loads((store / job_key(point(store, capacity_gb, 12)) / RESULT_FILE).read_text())["error"]
    )


@pytest.mark.torchrun
def test_a_sample_of_predicted_oom_points_runs_anyway_to_measure_the_prescreen(store, capacity_gb):
    """launch.prescreen_sample=1 launches what the pre-screen would skip; the record says it was a sample."""
    sampled = run_point(point(store, capacity_gb, 12, "launch.prescreen_sample=1.0"))
    assert sampled["predicted"]["skip"] and sampled["predicted"]["sampled"]
    assert sampled["status"] == "oom" and (launch_dir(store / sampled["job_key"], sampled) / "torchrun.log").exists()
    rec = run_point(point(store, capacity_gb, 12, "launch.prescreen_sample=0.0", "launch.rerun=all"))
    assert rec["status"] == Status.PREDICTED_OOM and not rec["predicted"]["sampled"]
    # The sample is chosen by job key: about the asked fraction of keys, the same ones every time.
    from scaling.core.sample import sampled as in_sample

    keys = [f"{i * 7919:012x}" for i in range(2000)]
    share = sum(in_sample(k, 0.1) for k in keys) / len(keys)
    assert 0.07 < share < 0.13 and [in_sample(k, 0.1) for k in keys] == [in_sample(k, 0.1) for k in keys]


@pytest.mark.torchrun
def test_find_mbs_returns_what_a_direct_search_finds(store, capacity_gb):
    direct = 0
    for mbs in range(1, 6):  # the Playbook's recipe: increase mbs until out of memory
        status = run_point(point(store, capacity_gb, mbs, "launch.prescreen=false"))["status"]
        if status != "ok":
            assert status == "oom"
            break
        direct = mbs
    out = scaling(
        "find-mbs",
        "--json",
        "--max-mbs=16",
        *POINT,
        f"hardware.memory_gb={capacity_gb}",
        f"sweep_dir={store}",
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout[out.stdout.index("{") :])
    assert found["mbs"] == found["predicted_mbs"] == direct == 2
    assert found["confirmed"] and [r["status"] for r in found["runs"]] == ["ok", "oom"]
    assert "confirmed: mbs=2 ok, mbs=3 oom" in found["note"]


@pytest.mark.slow
def test_predict_point_json_has_both_methods(capsys):
    assert (
        predict_main(["--json", "model=tiny", "parallel.dp=2", "parallel.zero_stage=3", "hardware.memory_gb=0.1"]) == 0
    )
    res = json.loads(capsys.readouterr().out)
    analytic, traced = res["analytic"], res["traced"]
    assert analytic["method"] == "analytic" and traced["method"] == "traced"
    assert abs(analytic["peak_mem_bytes"] - traced["peak_mem_bytes"]) / traced["peak_mem_bytes"] < 0.1
    assert analytic["peak_mem_bytes"] == sum(
        v for k, v in analytic.items() if k.endswith("_bytes") and k != "peak_mem_bytes"
    )
    assert res["capacity_bytes"] == int(0.1 * GIB)


@pytest.mark.subprocess  # the dry run of a model without the closed form
def test_predict_sweep_prints_the_grid_without_launching(tmp_path, monkeypatch, capsys):
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "fitgrid.yaml").write_text(
        textwrap.dedent("""\
        defaults:
          - config
          - _self_
        sweep: fitgrid
        hardware:
          memory_gb: 0.01
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              model: tiny,small
              train.mbs: 1,64
              parallel.zero_stage: 0,3
        """)
    )
    monkeypatch.chdir(tmp_path)  # ./sweeps is searched first, as for `scaling sweep`
    assert predict_main(["--sweep", "fitgrid", "parallel.dp=2", f"sweep_dir={tmp_path / 'runs'}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:3] == ["model", "train.mbs", "parallel.zero_stage"]
    verdicts = {tuple(line.split()[:3]): line.split()[-1] for line in lines[1:-2]}
    assert len(verdicts) == 8
    assert verdicts[("tiny", "1", "3")] == "fits" and verdicts[("small", "64", "0")] == "predicted_oom"
    skipped = sum(v == "predicted_oom" for v in verdicts.values())
    assert lines[-2] == (
        f"sweep fitgrid: 8 points: 8 new ({8 - skipped} to launch, {skipped} predicted_oom, 0 invalid), 0 recorded"
    )
    assert lines[-1] == (
        f"wall time: unknown, no launched point recorded yet; at most {format_duration((8 - skipped) * 600)} "
        f"({8 - skipped} launches, 1 at a time, launch.timeout_s=600)"
    )
    assert not (tmp_path / "runs").exists()  # nothing launched, nothing recorded
    # a model without the closed form: traced, as `scaling predict` of one point and its launch's pre-screen trace it
    # (it was `-` for every point); the dry run's analytic forecast counts its launches on a line of their own
    (tmp_path / "sweeps" / "owngrid.yaml").write_text(
        textwrap.dedent("""\
        defaults:
          - config
          - _self_
        sweep: owngrid
        hardware:
          memory_gb: 0.01
        train:
          seq_len: 32
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              model: hf_llama_tiny
              train.mbs: 1,2
        """)
    )
    own = ["--sweep", "owngrid", f"sweep_dir={tmp_path / 'runs'}"]
    assert predict_main(own) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines[1:3]] == ["1", "2"] and all("(traced)" in x for x in lines[1:3]), lines
    assert "without a memory figure" not in "\n".join(lines)
    dry = scaling("sweep", "owngrid", "--dry-run", own[-1], cwd=tmp_path)
    assert (
        "2 of the launches without a memory figure here: model 'hf_llama_tiny' has no closed-form figure: each "
        "launch's pre-screen traces it, `scaling predict --sweep` traces it now" in dry.stdout
    ), dry.stdout
    assert not (tmp_path / "runs").exists()


def test_bad_input_is_a_clear_error(capsys):
    assert predict_main(["--analytic", "parallel.zero_stage=5"]) == 2
    assert "parallel.zero_stage=5 is not valid: choose one of 0, 1, 2, 3" in capsys.readouterr().err
    assert find_mbs_main(["model=tiny"]) == 2
    assert "hardware.memory_gb=null: find-mbs needs a capacity" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, said",
    [
        # a pipeline is validated as `scaling run` validates it (predict checked the point at pp 1: a traceback here)
        (["parallel.pp=40", "train.grad_acc=2"], "parallel.pp=40 = 40 stages but model.n_layers=2 blocks"),
        (["parallel.pp=2", "train.grad_acc=1"], "train.grad_acc=1 with parallel.pp=2 and pp_schedule=one_f_one_b"),
        # a model of another family has no stage predictor: said, not an AttributeError's traceback
        (
            ["model=hf_llama_tiny", "parallel.pp=2", "train.grad_acc=2"],
            "parallel.pp=2 with model 'hf_llama_tiny': a pipeline stage's memory is predicted for the built-in family "
            "only",
        ),
    ],
)
def test_a_pipeline_predict_cannot_answer_is_refused_naming_the_field(capsys, overrides, said):
    assert predict_main(["--analytic", "model=tiny", "train.seq_len=64", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scaling predict: invalid point: ") and said in err and "Traceback" not in err, err


def test_find_mbs_of_a_pipelined_model_the_stage_predictor_does_not_describe_is_refused(capsys):
    """It said "2 stages cannot split 1 blocks" of a 2-block Hugging Face model (a cut of it, calibrating)."""
    argv = ["--analytic", "--no-confirm", "model=hf_llama_tiny", "train.seq_len=64", "hardware.memory_gb=0.05"]
    assert find_mbs_main([*argv, "parallel.pp=2", "train.grad_acc=2"]) == 2
    err = capsys.readouterr().err
    assert "parallel.pp=2 with model 'hf_llama_tiny': a pipeline stage's memory is predicted for the built-in" in err
    assert "search it at parallel.pp=1" in err and "cannot split" not in err, err


def test_find_mbs_for_devices_not_at_hand_predicts_and_says_why_it_launched_nothing(tmp_path, monkeypatch, capsys):
    """An H100 point on a host without one: confirmed as the recipe does it, not at all (it launched 8 CUDA ranks
    that failed on the device, recorded a failed point and still exited 0)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    argv = ["--analytic", "model=llama_1b", "hardware=h100", "train.precision=bf16", "parallel.dp=8"]
    assert find_mbs_main([*argv, "parallel.zero_stage=3", f"sweep_dir={tmp_path / 'runs'}"]) == 0
    out = capsys.readouterr().out
    assert "not confirmed: 0 h100 device(s) at hand, the point needs 8; run find-mbs where they are" in out, out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("answer,start", [(0, 5), (1, 1), (7, 3), (7, 40), (64, 64), (100, 9)])
def test_largest_true_finds_the_boundary_from_any_guess(answer, start):
    calls = []

    def fits(m):
        calls.append(m)
        return m <= answer

    assert largest_true(fits, start, 64) == min(answer, 64)
    assert len(calls) <= 16 and all(1 <= m <= 64 for m in calls)


def test_find_mbs_prints_each_peak_in_the_capacitys_unit_with_its_share_of_it(capsys):
    """As `scaling predict` does: MiB or GiB, not bytes, and how near the capacity each predicted mbs comes."""
    assert find_mbs_main(["--analytic", "--no-confirm", "model=tiny", "hardware.memory_gb=0.02"]) == 0
    lines = capsys.readouterr().out.splitlines()
    found = int(lines[-1].split("largest mbs that fits: ")[1].split()[0])
    assert re.fullmatch(
        rf"  mbs={found}: predicted \d+\.\d{{3}} MiB per rank \(analytic\), \d+% of the 20\.480 MiB capacity: fits",
        lines[0],
    ), lines
    assert lines[1].startswith(f"  mbs={found + 1}: ") and lines[1].endswith(": does not fit"), lines


@pytest.mark.slow  # transformers' Llama and Mixtral built and traced on fake tensors
def test_a_hugging_face_model_the_formulas_describe_is_predicted_as_the_recipe_plans_it(capsys):
    """`scaling predict` of hf_llama_tiny gives the calibrated figure the recipe and find-mbs plan with beside its
    trace; `--analytic` gives it alone, without the whole-model trace, and so does `find-mbs --analytic` (it was
    traced: the flag did nothing for a model one brings). A model the formulas do not describe (Mixtral's experts) is
    traced all the same, and `--analytic` says so."""
    point = ["model=hf_llama_tiny", "train.seq_len=64", "logger=none", "hardware.memory_gb=0.01"]
    assert predict_main(["--json", *point]) == 0
    both = json.loads(capsys.readouterr().out)
    calibrated, traced = both["calibrated"]["peak_mem_bytes"], both["traced"]["peak_mem_bytes"]
    assert both["analytic"] is None and abs(calibrated / traced - 1) <= 0.02, both
    assert predict_main(["--analytic", *point]) == 0
    out = capsys.readouterr().out
    assert "calibrated" in out and "traced (torch memory tracker" not in out, out
    assert find_mbs_main(["--analytic", "--no-confirm", "--json", *point]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["method"] == "analytic, calibrated by traces" and found["mbs"] >= 2, found
    assert predict_main(["--analytic", "model=hf_mixtral_tiny", "train.seq_len=64"]) == 0
    said = capsys.readouterr()
    assert "traced (torch memory tracker" in said.out and "--analytic: the model is neither" in said.err
