"""The report: Markdown + self-contained HTML with every section, the CLI entry, and the W&B summary run."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.collect import collect
from analysis.report_writer import write_report
from analysis.sections import build_sections, device_time_section, top_columns
from analysis.sweep_data import SweepData
from scaling.cli.report import main
from scaling.perf.network_figures import PROFILE_FILE, save_profile
from scaling.store.wandb_runs import read_offline_run
from tests.helpers.grid_report import GROUP, grid_report  # noqa: F401 (a fixture)
from tests.helpers.records import grid_records, key_of, make_record, write_sweep
from tests.helpers.synthetic_dp import LLAMA_1B, TRUTHS, profile_of


@pytest.mark.slow
@GROUP
def test_report_files_and_sections(grid_report):  # noqa: F811
    sweep, paths = grid_report
    assert paths["html"] == sweep / "report" / "report.html"
    md = paths["markdown"].read_text()
    for heading in (
        "# Sweep report: grid",
        "## Status counts",
        "## Top configurations",
        "## Heatmaps",
        "## Data-parallel scaling",
        "## DP extrapolation beyond the measured dp",
        "## Predicted vs measured memory",
        "## Failures",
        "## Device time",
    ):
        assert heading in md, heading
    assert "% in timed steps" in md and "The search recorded" not in md  # a grid, not a search
    assert "| oom | 6 |" in md and "| predicted_oom | 6 |" in md and "| invalid | 1 |" in md
    assert "DP stops paying off at dp=16: the first count" in md
    assert "(the last that pays: dp=8); efficiency falls from 85% (dp=8) to 62% (dp=16)" in md
    assert "Those are the 8 fastest configurations; the table has the knees of all 20." in md
    # the fastest point heads the table, its memory in the unit that reads best
    assert "| tiny | 256 | 8 | 8 | 1 | 0 | bf16 | none | 28,284 | ±0.0% | 1 | ★ best | 21.3% | 10.0 GiB |" in md
    for name in (
        "tokens_per_s_per_gpu",
        "mfu",
        "peak_mem_bytes",
        "dp_scaling",
        "dp_extrapolation_0",
        "memory_prediction",
    ):
        assert paths[f"figure:{name}"].exists()
        assert f"(figures/{name}.png)" in md
    assert len(pd.read_parquet(paths["parquet"])) == len(list(sweep.glob("*/result.json")))


def _truth_sweep(path, truth, dps, rng):
    """Records of one configuration measured at `dps` on 8-GPU H100 nodes, step times drawn from a known truth."""
    w, records = truth.workload, []
    for n in dps:
        times = [truth.step_time_s(n) * (1 + e) for e in rng.normal(0, 0.02, 5)]
        r = make_record(
            model="llama_1b",
            seq_len=w.seq_len,
            mbs=w.mbs,
            grad_acc=w.grad_acc_at(n),
            dp=n,
            zero_stage=w.zero_stage,
            precision=w.precision,
            memory_gb=80.0,
        )
        r["config"]["hardware"]["devices_per_node"] = 8
        r["config"]["model"].update(dataclasses.asdict(LLAMA_1B))  # the truths' model (their workload holds its shape)
        r["job_key"] = key_of(r["config"])
        r["derived"]["n_params"] = w.n_params
        step = float(np.median(times))
        r["metrics"].update(
            step_time_s=step, step_times_s=times, tokens_per_s_per_gpu=w.mbs * w.seq_len * w.grad_acc_at(n) / step
        )
        records.append(r)
    return write_sweep(path, records, name="truth")


@pytest.mark.slow
def test_extrapolation_names_each_source_its_knee_range_and_reach(tmp_path):
    """Measured on one node (dp 1-8): the sweep alone stops at the node and says why; the measured profile (rings
    of up to 32) extrapolates to its horizon, dp=128, and the published H100 figures to theirs, dp=32 (4× the
    largest measured dp), each with its knee as a range and what lies past the horizon said."""
    truth, rng = TRUTHS[0], np.random.default_rng(0)
    sweep = _truth_sweep(tmp_path / "s", truth, (1, 2, 4, 8), rng)
    save_profile(sweep / PROFILE_FILE, profile_of(truth, rng, world_sizes=(2, 8, 16, 32)))
    md = write_report(sweep, jobs=1)["markdown"].read_text()
    section = md[md.index("## DP extrapolation beyond the measured dp") : md.index("## Predicted vs measured")]
    assert "llama_1b, seq 4096, ZeRO-0: global batch fixed at 512 samples: grad_acc = 512 / (1 × dp)." in section
    assert (
        "(a) fitted to this sweep's DP curve: DP keeps paying off up to dp=8: efficiency stays at or above 80% of "
        "dp=1, the last dp it predicts "
        "(in 95% of the draws the first dp below 80% is beyond dp=8; no dp beyond the measured 8 can be "
        "predicted). Measured dp 1, 2, 4, 8: 3 point(s) with communication identify"
    ) in section
    assert "; the tier between nodes (no measured dp spans more than 8 ranks). Stops at dp=8: " in section
    assert "Stops at dp=8: this source has no figures for the tier between nodes." in section
    profile = next(p for p in section.split("\n\n") if p.startswith("(b) scaling collectives profile"))
    assert (
        ": DP stops paying off at dp=64: the first count whose efficiency falls below 80% of dp=1 (in 95% of "
        in profile
    )
    assert "extrapolated from dp ≤ 8 to dp=128, 16× past the largest measured dp" in profile
    published = next(p for p in section.split("\n\n") if p.startswith("(c) published h100 figures"))
    assert (
        "efficiency stays at or above 80% of dp=1, the last dp it predicts (past dp=32, 4× the largest measured dp, 8"
        in (published)
    )
    assert "| llama_1b, seq 4096, ZeRO-0 | (b) profile | 1, 2, 4, 8 | 128 | 64 |" in section
    assert "| llama_1b, seq 4096, ZeRO-0 | (b) measured network | 256 | beyond the horizon | past dp=128, 4× " in (
        section
    )
    assert "![dp_extrapolation_0](figures/dp_extrapolation_0.png)" in section
    # the answer first, in a sentence per configuration under its best-informed source; the rest folded below it
    summary, folded = section.split("<details>", 1)
    assert "llama_1b, seq 4096, ZeRO-0 ((b) profile): DP stops paying off at dp=64: the first count" in summary
    assert "(a) fitted to this sweep's DP curve" not in summary and "| (b) profile |" not in summary
    assert "(a) fitted to this sweep's DP curve" in folded and folded.rstrip().endswith("</details>")


def test_device_time_section_states_the_shares_and_what_a_search_spent_until_its_best(tmp_path):
    """Each synthetic launch held dp devices for 12 s; an ok one spent 9 s timed and 1 s warming up."""
    records = [make_record("ok", dp=2, mbs=mbs) for mbs in (1, 2, 4)] + [make_record("oom", dp=4)]
    for i, record in enumerate(reversed(records)):  # started a minute apart, the oom point first
        record["timing"]["started_at"] = f"2025-01-01T00:0{i}:00+00:00"
    sweep = write_sweep(tmp_path / "search", records)
    best = records[1]["job_key"]  # started third
    (sweep / "best.yaml").write_text(yaml.safe_dump({"best": {"trial": 2, "job_key": best}}))
    section = device_time_section(SweepData.load(sweep))
    assert section.title == "Device time"
    assert section.paragraphs[0].startswith(
        "The launches of 4 points held 0.0333 device-h (torchrun's wall time × the devices of each launch): "
        "45.0% in timed steps, 5.0% warm-up, 10.0% start-up, 40.0% launches not ok."
    )
    assert section.paragraphs[-1] == (
        f"The search recorded its best point ({best}) after 0.0267 device-h, 80% of the device time held "
        "(records in the order they started)."
    )


@pytest.mark.slow
@GROUP
def test_html_is_self_contained_with_embedded_pngs(grid_report):  # noqa: F811
    _, paths = grid_report
    page = paths["html"].read_text()
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert {name for name, _ in images} >= {
        "tokens_per_s_per_gpu",
        "dp_scaling",
        "dp_extrapolation_0",
        "memory_prediction",
    }
    for _, data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing loaded from elsewhere
    assert "<script" not in page


def test_single_dp_sweep_has_no_dp_section_and_no_predictions_no_scatter(tmp_path):
    records = [make_record(seq_len=s, mbs=m, peak_mem_bytes_value=m * 3 * 2**20) for s in (256, 512) for m in (1, 2)]
    for r in records:
        r["predicted"] = None
    paths = write_report(write_sweep(tmp_path / "s", records), out_dir=tmp_path / "out")
    md = paths["markdown"].read_text()
    assert "## Heatmaps" in md and "## Data-parallel scaling" not in md and "## Predicted vs measured" not in md
    assert "| 6.0 MiB |" in md  # small peaks read in MiB
    assert paths["html"].parent == tmp_path / "out"


def test_empty_sweep_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    md = write_report(tmp_path / "empty")["markdown"].read_text()
    assert "No records yet." in md


@pytest.mark.slow
def test_main_prints_where_the_report_is(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "s", [make_record(dp=d) for d in (1, 2)])
    assert main([str(sweep), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'r' / 'report.html'}" in out
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "missing")])
    assert exc.value.code == 2
    assert "SWEEP_DIR=" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(sweep), "--out", str(tmp_path / "r"), "--jobs", "0"])
    assert "--jobs=0: at least one process draws the heatmaps" in capsys.readouterr().err
    assert main([str(sweep), "--out", str(tmp_path / "r"), "--jobs", "1"]) == 0


@pytest.mark.slow
def test_several_sweeps_are_reported_in_one_call_each_into_its_own_folder(tmp_path, capsys):
    """`scaling report A B` (make demo: the sweep's and the recipe's) writes each report into its SWEEP_DIR/report;
    a folder that is not there, or --out beside two folders, is refused before any report is written."""
    a = write_sweep(tmp_path / "a", [make_record(dp=d) for d in (1, 2)])
    b = write_sweep(tmp_path / "b", [make_record(dp=d, mbs=2) for d in (1, 2, 4)])
    for refused, said in (
        ([str(a), str(tmp_path / "missing")], f"SWEEP_DIR='{tmp_path / 'missing'}' is not a directory"),
        ([str(a), str(b), "--out", str(tmp_path / "r")], "with 2 sweep folders: --out names one report's folder"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(refused)
        assert exc.value.code == 2 and said in capsys.readouterr().err
        assert not (a / "report").exists() and not (tmp_path / "r").exists()
    assert main([str(a), str(b), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    for sweep, ok in ((a, 2), (b, 3)):  # each report of its own records
        assert f"report: {sweep / 'report' / 'report.html'}" in out
        assert f"| ok | {ok} |" in (sweep / "report" / "report.md").read_text()


@pytest.mark.slow
def test_records_the_analysis_cannot_use_are_named_and_left_out_and_the_report_is_written(tmp_path, capsys):
    """One bad record used to take the report down (a ValueError from the extrapolation); now each is named once,
    on stderr and in the Markdown, and the report covers the good ones."""
    good = [make_record(dp=d, grad_acc=8 // d) for d in (1, 2, 4, 8)] + [make_record(dp=1, seq_len=512)]
    # derived disagrees with its config: dp=8 x grad_acc=1 x mbs=1 is 8 samples, not 1 (the configuration it
    # belongs to then held a fixed batch of 1 sample, which the extrapolation cannot split over 8 ranks)
    gbs = make_record(dp=8, seq_len=512)
    gbs["derived"].update(gbs=1, gbs_tokens=512)
    # edited by hand: a status no writer gives
    status = make_record(dp=2, mbs=2)
    status["status"] = "exploded"
    # an older schema, whose parallel group named the data-parallel degree otherwise
    older = make_record(dp=4, mbs=2)
    older["config"]["parallel"]["data_parallel"] = older["config"]["parallel"].pop("dp")
    older["job_key"] = "01de4a11c0de"  # today's schema cannot key it (no data_parallel field): the store's own key
    # merged from a store whose writer kept no metrics
    bare = make_record(dp=2, mbs=4)
    bare["metrics"] = None
    sweep = write_sweep(tmp_path / "s", [*good, gbs, status, older, bare])
    assert main([str(sweep), "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    md = (sweep / "report" / "report.md").read_text()
    why = {
        gbs["job_key"]: "derived.gbs=1 is not mbs × grad_acc × dp = 1 × 1 × 8 = 8",
        status["job_key"]: "status='exploded' is not one of ok, oom, predicted_oom, timeout, failed, invalid",
        older["job_key"]: "config.parallel.dp=None is not a positive integer",
        bare["job_key"]: "status ok but metrics.tokens_per_s_per_gpu=None is not a positive number",
    }
    for key, reason in why.items():
        assert err.count(f"[scaling report] left out {key}: {reason}") == 1, err
        assert f"| {key} | {reason}" in md
    assert err.count("left out") == len(why)
    assert f"5 records in `{sweep}` (4 more left out: see Records left out)" in md
    assert "## Records left out" in md and "## DP extrapolation beyond the measured dp" in md
    assert sorted(pd.read_parquet(sweep / "report" / "results.parquet")["job_key"]) == sorted(
        r["job_key"] for r in good
    )


@pytest.mark.subprocess
def test_wandb_report_run_offline_typed_tables_and_artifacts(tmp_path, monkeypatch):
    sweep = write_sweep(tmp_path / "s", grid_records(seq_lens=(256,), mbss=(1, 2), dps=(1, 2, 4)), name="grid")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")  # W&B's variable gives the default; the option wins
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert main([str(sweep), "--out", str(tmp_path / "w"), "--wandb", "--jobs", "1"]) == 0
    assert main([str(sweep), "--out", str(tmp_path / "w"), "--wandb", "--jobs", "1", "--wandb-project", "cli"]) == 0
    runs = []
    deadline = time.monotonic() + 30  # wandb-core finishes writing the log after finish() returns
    while sum(any(a["type"] == "report" for a in r["artifacts"]) for r in runs) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        runs = [read_offline_run(p) for p in sorted((sweep / "wandb").glob("offline-run-*/run-*.wandb"))]
    # beside the points' runs, in the sweep's own wandb folder: one `wandb sync` of it takes everything
    assert [(r["project"], r["group"], r["job_type"]) for r in runs] == [
        ("from-env", "grid", "report"),
        ("cli", "grid", "report"),
    ]
    run_dir = next((sweep / "wandb").glob("offline-run-*"))
    assert {(a["type"], tuple(a["files"])) for a in runs[0]["artifacts"] if a["type"] != "run_table"} == {
        ("dataset", ("results.parquet",)),
        ("report", ("report.html", "report.md")),
    }
    media = {p.name.split("_0_")[0] for p in (run_dir / "files" / "media" / "images" / "report").glob("*.png")}
    assert {"tokens_per_s_per_gpu", "mfu", "peak_mem_bytes", "dp_scaling"} <= media
    tables = {
        p.name.split("_0_")[0]: json.loads(p.read_text())
        for p in (run_dir / "files" / "media" / "table" / "report").glob("*.json")
    }
    assert {"status_counts", "top_configurations", "records"} <= set(tables)
    top = tables["top_configurations"]
    row = dict(zip(top["columns"], top["data"][0]))  # typed cells: numbers stay numbers
    assert isinstance(row["tokens_per_s_per_gpu"], float) and isinstance(row["dp"], int) and row["model"] == "tiny"
    counts = dict(tuple(r) for r in tables["status_counts"]["data"])
    assert counts["ok"] > 0 and all(isinstance(v, int) for v in counts.values())
    assert len(tables["records"]["data"]) == len(list(sweep.glob("*/result.json")))


def _cpu_record(seq_len: int, mbs: int, status: str = "ok", **extra) -> dict:
    """A CPU point as the engine records it: tracker-measured peak, RSS beside it, emulated capacity."""
    record = make_record(status, seq_len=seq_len, mbs=mbs, hardware="cpu", **extra)
    record["env"]["memory_capacity"] = "emulated"
    if record["metrics"] is not None and status == "ok":
        peak = record["metrics"]["peak_mem_bytes"]
        record["metrics"].update(
            peak_mem_source="mem_tracker",
            peak_rss_growth_bytes=int(1.5 * peak),
            peak_flops_source="measured",
            peak_flops_measured_at="2026-11-22T10:00:00Z",
        )
    return record


def test_memory_section_compares_independent_measures_and_never_the_tracker_with_itself(tmp_path):
    records = [_cpu_record(256, 1), _cpu_record(256, 2), _cpu_record(512, 1)]
    for r, traced in zip(records, (1.0, 1.0, None)):  # the pre-screen traced two of them
        if traced is not None:
            r["predicted"]["traced"] = {"method": "traced", "peak_mem_bytes": r["metrics"]["peak_mem_bytes"]}
    for r, factor in zip(records, (1.1, 0.8, 1.0)):  # analytic: 10%, 20% and 0% off
        r["predicted"]["analytic"]["peak_mem_bytes"] = int(factor * r["metrics"]["peak_mem_bytes"])
    sampled = [_cpu_record(1024, 1, "oom"), _cpu_record(1024, 2, "oom"), _cpu_record(512, 2)]
    for r in sampled:  # predicted not to fit, run anyway: two really ran out of memory, one was a false positive
        r["predicted"]["sampled"] = True
    md = write_report(write_sweep(tmp_path / "s", records + sampled), out_dir=tmp_path / "r")["markdown"].read_text()
    section = md.split("## Predicted vs measured memory")[1].split("\n## ")[0]
    assert (
        "Measured peak memory per rank (the largest rank's): live tensor bytes under torch's memory tracker" in section
    )
    assert (
        "Analytic prediction vs measured: median relative error 7.5% (largest 20.0%) over 4 ok points; 4 of them "
        "are of tiny and small, whose traced steps its activation coefficients were read off, so there the "
        "agreement is in-sample"
    ) in section
    assert (
        "Traced prediction vs the tracker on the 2 points the pre-screen traced: the trace runs the same model "
        "under the same tracker on fake tensors, so this compares the tracker with itself and is not an accuracy "
        "figure: the trace reproduces the tracker to within 0.0% (largest 0.0%)."
    ) in section
    assert "is 1.50× the tracked peak (median over 4 points; 1.50× to 1.50×)" in section
    assert (
        "3 points predicted not to fit were run anyway as a sample: 2 really ran out of memory, 1 ran ok (false "
        "positives of the pre-screen)."
    ) in section
    assert "an OOM there is an OOM (emulated capacity), not an out-of-memory the machine measured" in section
    assert "Median relative error of the memory prediction" not in md
    assert "OOM = OOM (emulated capacity): the tracked tensor bytes passed hardware.memory_gb" in md
    assert "MFU of 4 points is against a measured matmul peak (measured 2026-11-22T10:00:00Z)" in md


def test_memory_figure_draws_each_prediction_and_the_rss_beside_the_tracker(tmp_path):
    from analysis.memory import memory_figure

    records = [_cpu_record(256, 1), _cpu_record(256, 2)]
    records[0]["predicted"]["traced"] = {"method": "traced", "peak_mem_bytes": 123}
    fig = memory_figure(collect(write_sweep(tmp_path, records)))
    predictions, rss = fig.axes
    assert [c.get_gid() for c in predictions.collections] == ["analytic", "traced"]
    assert [len(c.get_offsets()) for c in predictions.collections] == [2, 1]
    assert predictions.get_ylabel().startswith("tracked peak (tensor bytes) per rank")
    assert [c.get_gid() for c in rss.collections] == ["rss"] and rss.get_ylabel().startswith("peak RSS growth")


@pytest.mark.slow
def test_ties_noise_knee_uncertainty_and_oversubscription_in_words(tmp_path):
    fast = [make_record(dp=dp, grad_acc=max(8 // dp, 1), noise_band_frac=0.05) for dp in (1, 2, 4, 8, 16)]
    over = [
        make_record(dp=dp, mbs=2, grad_acc=max(8 // dp, 1), oversubscribe=True, tokens_per_s_per_gpu_value=v)
        for dp, v in ((1, 5000.0), (2, 3000.0))
    ]
    for r in fast[:2]:  # dp 1 and 2 launched three times
        r["metrics"].update(repeats_ok=3, repeat_spread_frac=0.05)
    md = write_report(write_sweep(tmp_path / "s", fast + over), out_dir=tmp_path / "r")["markdown"].read_text()
    top = md.split("## Top configurations")[1].split("## Noise")[0]
    rows = [line for line in top.splitlines() if line.startswith("| tiny")]
    assert "★ best" in rows[0] and "| ±5.0% | 3 |" in rows[0]
    assert "≈ within noise" in rows[1]  # dp=2: 3% below, within the ±5% band
    assert not any("within noise" in row for row in rows if "| 16 |" in row)
    assert (
        "Over 7 ok points the band is ±5.0% at the median (largest ±5.0%)" in md
        and "2 points were launched 3 to 3 times: their repeat-to-repeat spread is ±5.0%" in md
    )
    assert "(the last that pays: dp=8, or dp=4 within noise); efficiency falls from 85% ± 8 pts (dp=8)" in md
    assert (
        "Oversubscribed (hardware.oversubscribe=true, ranks sharing cores): tiny, seq 256, mbs=2, ZeRO-0, "
        "oversubscription allowed at dp=1, 2."
    ) in md


@pytest.mark.slow
def test_the_extrapolation_writes_out_what_it_draws_past_the_measured_dp(tmp_path):
    """Records at dp 8, 16 and 32 and a measured network: the report's table gives tokens/s per GPU with its band
    and the efficiency at dp 32 (measured beside it), 64 and 128, the horizon (4× the largest measured dp), then one
    row that says why nothing past it is given."""
    truth, rng = TRUTHS[0], np.random.default_rng(0)
    sweep = _truth_sweep(tmp_path / "s", truth, (8, 16, 32), rng)
    save_profile(sweep / PROFILE_FILE, profile_of(truth, rng, world_sizes=(2, 8, 16, 32)))
    md = write_report(sweep, jobs=1)["markdown"].read_text()
    summary = md[md.index("## DP extrapolation beyond the measured dp") :].split("<details>", 1)[0]
    rows = [line.split(" | ") for line in summary.splitlines() if line.startswith("| llama_1b")]
    assert [int(r[2]) for r in rows] == [32, 64, 128, 256]
    assert {r[1] for r in rows} == {"(b) measured network"}
    assert rows[-1][3] == "beyond the horizon" and rows[-1][4].startswith("past dp=128, 4× the largest measured dp")
    rows = rows[:-1]
    for r in rows:
        value, (low, high) = float(r[3].replace(",", "")), (float(v.replace(",", "")) for v in r[4][1:-1].split(", "))
        assert low <= value <= high and r[5].endswith("%")
    assert rows[0][6].strip(" |") != "" and all(r[6].strip(" |") == "" for r in rows[1:])  # dp 32 was measured


@pytest.mark.slow
def test_the_sections_are_built_from_one_read_of_the_store(tmp_path):
    """SweepData reads the directory once: with the directory gone, every section is still built from it."""
    truth, rng = TRUTHS[0], np.random.default_rng(0)
    sweep = _truth_sweep(tmp_path / "s", truth, (1, 2, 4), rng)
    save_profile(sweep / PROFILE_FILE, profile_of(truth, rng, world_sizes=(2, 4)))
    data = SweepData.load(sweep)
    shutil.rmtree(sweep)
    titles = [s.title for s in build_sections(data, 0.8)]
    assert {"Status counts", "Top configurations", "Data-parallel scaling"} <= set(titles)
    assert "DP extrapolation beyond the measured dp" in titles


def test_the_top_table_shows_hfu_beside_mfu_where_a_point_recomputes_matmuls():
    """Full recomputation runs matmuls again: HFU above MFU, a column beside it; selective and none run none again."""
    lead = {"model": "tiny", "seq_len": 64, "mbs": 2, "grad_acc": 1, "dp": 1, "zero_stage": 0, "precision": "fp32"}
    rows = [{**lead, "recompute": rc, "mfu": 0.3, "hfu": hfu} for rc, hfu in [("none", 0.3), ("selective", 0.3)]]
    assert "hfu" not in top_columns(pd.DataFrame(rows))
    columns = top_columns(pd.DataFrame([*rows, {**lead, "recompute": "full", "mfu": 0.25, "hfu": 0.31}]))
    assert columns[columns.index("mfu") + 1] == "hfu"
