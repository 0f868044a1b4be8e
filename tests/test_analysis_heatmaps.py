"""Heatmaps: status cells carry their labels, blank cells stay blank, the best cell is marked."""

from __future__ import annotations

import io
from functools import partial

import pandas as pd
import pytest

from analysis.collect import collect
from analysis.facets import default_layout, draw_all, facet_grid, figure_specs
from analysis.figures import render_pngs, save_png
from analysis.heatmaps import cells, heatmap
from tests.helpers.records import FAILURES, grid_records, make_record, write_sweep


@pytest.fixture(scope="module")
def df(tmp_path_factory):
    return collect(write_sweep(tmp_path_factory.mktemp("sweep"), grid_records()))


def _texts_at(ax):
    """Text of each cell by (row, col), from the annotations seaborn and the overlay drew."""
    out = {}
    for t in ax.texts:
        x, y = t.get_position()
        out[(int(y), int(x))] = t.get_text()
    return out


def test_oom_and_other_statuses_are_labelled_in_the_rendered_heatmap(df):
    facet = df[(df["zero_stage"] == 0) & (df["dp"] == 2)]
    ax = heatmap(facet, x="mbs", y="seq_len", metric="tokens_per_s_per_gpu")
    ax.figure.canvas.draw()
    texts = _texts_at(ax)
    ys, xs = [256, 512, 1024], [1, 2, 4, 8]
    assert texts[(ys.index(1024), xs.index(4))] == "OOM"
    assert texts[(ys.index(512), xs.index(8))] == "pred OOM"
    assert texts[(ys.index(1024), xs.index(1))] == "timeout"
    assert texts[(ys.index(1024), xs.index(2))] == "failed"
    # the point never run (largest seq_len x mbs) is blank: no text, no patch
    assert (ys.index(1024), xs.index(8)) not in texts
    gids = [p.get_gid() for p in ax.patches]
    assert gids.count("status:oom") == 1 and "status:predicted_oom" in gids
    assert FAILURES[(0, 2, 1024, 1)] == "timeout"


def test_ok_cells_show_values_and_the_best_is_starred_and_boxed(df):
    facet = df[(df["zero_stage"] == 1) & (df["dp"] == 2)]
    ax = heatmap(facet, x="mbs", y="seq_len", metric="tokens_per_s_per_gpu")
    texts = _texts_at(ax)
    starred = [cell for cell, text in texts.items() if text.startswith("★")]
    assert starred == [(0, 3)]  # seq 256, mbs 8: the most tokens/s per GPU in this facet
    assert texts[(2, 0)] == "invalid"
    best = [p for p in ax.patches if p.get_gid() == "best"]
    assert len(best) == 1 and best[0].get_xy() == (3, 0)
    assert texts[(0, 0)].replace(",", "").isdigit()


def test_memory_best_is_the_smallest(df):
    facet = df[(df["zero_stage"] == 1) & (df["dp"] == 8)]
    ax = heatmap(facet, x="mbs", y="seq_len", metric="peak_mem_bytes")
    starred = [t.get_text() for t in ax.texts if t.get_text().startswith("★")]
    assert starred == [f"★ {facet['peak_mem_gib'].min():.1f}"]
    assert "GiB" in ax.figure.axes[-1].get_ylabel()  # the colour bar names the unit
    small = facet.assign(peak_mem_bytes=facet["peak_mem_bytes"] // 1024, peak_mem_mib=facet["peak_mem_gib"])
    ax = heatmap(small, x="mbs", y="seq_len", metric="peak_mem_bytes")
    assert "MiB" in ax.figure.axes[-1].get_ylabel()


def test_cells_take_the_best_ok_value_and_count_records(df):
    table = cells(df, "mbs", "seq_len", "tokens_per_s_per_gpu")
    assert table.loc[(256, 1), "n"] == 10  # 5 dp x 2 ZeRO stages fall into one cell
    assert table.loc[(256, 1), "value"] == pytest.approx(
        df.loc[(df["seq_len"] == 256) & (df["mbs"] == 1), "tokens_per_s_per_gpu"].max()
    )
    assert table.loc[(1024, 4), "status"] == "ok"  # OOM under ZeRO-0 but ok when sharded: ok wins


def test_aggregated_cells_say_so_in_the_title(df):
    ax = heatmap(df, x="mbs", y="seq_len", metric="mfu")
    assert "best ok value of up to 10 records per cell" in ax.get_title()
    fig = facet_grid(df, x="mbs", y="seq_len", metric="mfu", col="zero_stage")
    assert "best ok value of up to 5 records per cell (over dp, grad_acc)" in fig._suptitle.get_text()


def test_a_grid_faceted_by_one_key_draws_every_facet(df):
    fig = facet_grid(df, x="mbs", y="seq_len", metric="mfu", col="zero_stage")
    grid = fig.axes[0]
    assert [t.get_text() for t in grid.texts if t.get_gid() == "facet"] == ["ZeRO-0", "ZeRO-1"]
    assert sum(t.get_text().startswith("★") for t in grid.texts) == 2  # each facet's cells, its best starred


def test_facet_grid_titles_each_facet_and_shares_one_colour_scale(df):
    fig = facet_grid(df, x="mbs", y="seq_len", metric="tokens_per_s_per_gpu", row="zero_stage", col="dp")
    grid = fig.axes[0]
    titles = [t.get_text() for t in grid.texts if t.get_gid() == "facet"]
    assert titles[:2] == ["ZeRO-0, dp=1", "ZeRO-0, dp=2"] and len(titles) == 10
    assert len(grid.collections) == 10  # one mesh per facet
    ok = df.loc[df["status"] == "ok", "tokens_per_s_per_gpu"]
    assert {(mesh.norm.vmin, mesh.norm.vmax) for mesh in grid.collections} == {(ok.min(), ok.max())}
    assert any(t.get_text() == "OOM" for t in grid.texts)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["OOM", "pred OOM", "timeout", "failed", "invalid", "★ best"]
    png = io.BytesIO()
    fig.savefig(png, format="png")
    assert png.getvalue().startswith(b"\x89PNG")


def test_filters_and_bad_axes_are_clear_errors(df):
    fig = facet_grid(df, x="mbs", y="seq_len", metric="mfu", filters={"zero_stage": 1, "dp": 4})
    assert "(ZeRO-1, dp=4)" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="x='batch' is not a column"):
        facet_grid(df, x="batch", y="seq_len", metric="mfu")
    with pytest.raises(ValueError, match="metric='speed' has no heatmap"):
        heatmap(df, x="mbs", y="seq_len", metric="speed")
    with pytest.raises(ValueError, match="x='mbs', y='mbs' and facets .* must be different columns"):
        facet_grid(df, x="mbs", y="mbs", metric="mfu")
    with pytest.raises(ValueError, match="filter dp=3 matches no record: dp takes 1, 2, 4, 8, 16"):
        facet_grid(df, x="mbs", y="seq_len", metric="mfu", filters={"dp": 3})


def test_default_layout_and_draw_all(df):
    assert default_layout(df) == {"y": "seq_len", "x": "mbs", "row": "zero_stage", "col": "dp"}
    one_dp = df[df["dp"] == 1]
    assert default_layout(one_dp)["col"] is None
    figs = draw_all(df)
    assert set(figs) == {"tokens_per_s_per_gpu", "mfu", "peak_mem_bytes"}


def test_draw_all_splits_a_further_varying_axis_into_figures(df):
    two_models = pd.concat([df.assign(model="tiny"), df.assign(model="small", status="oom")], ignore_index=True)
    figs = draw_all(two_models, metrics=("mfu",))
    assert set(figs) == {"mfu__model-small", "mfu__model-tiny"}
    labels = [t.get_text() for ax in figs["mfu__model-small"].axes for t in ax.texts]
    assert "OOM" in labels  # not hidden under the other model's values


@pytest.mark.subprocess
def test_render_pngs_draws_each_figure_in_a_forked_worker_as_drawn_here(df, tmp_path):
    specs = figure_specs(df, metrics=("mfu", "tokens_per_s_per_gpu", "peak_mem_bytes"))
    paths = render_pngs(specs, tmp_path / "figures", jobs=2)
    assert list(paths) == list(specs)
    assert all(path == tmp_path / "figures" / f"{name}.png" for name, path in paths.items())
    here = io.BytesIO()
    save_png(specs["mfu"](), here)
    assert paths["mfu"].read_bytes() == here.getvalue()
    with pytest.raises(ValueError, match="x='batch' is not a column"):  # a worker's error reaches the caller
        render_pngs({"bad": partial(facet_grid, df, x="batch", y="seq_len", metric="mfu"), **specs}, tmp_path, jobs=2)
    with pytest.raises(ValueError, match="jobs=0 must be at least 1"):
        render_pngs(specs, tmp_path, jobs=0)


def _noisy_facet(tmp_path, bands: dict, **extra):
    """One facet (ZeRO-0, dp=1) over seq_len x mbs whose ok points carry the given noise bands."""
    records = [
        make_record(seq_len=seq, mbs=mbs, noise_band_frac=bands.get((seq, mbs), 0.0), **extra)
        for seq in (256, 512)
        for mbs in (1, 2, 4, 8)
    ]
    return collect(write_sweep(tmp_path, records))


def test_cells_within_noise_of_the_best_are_marked_as_ties(tmp_path):
    # the model's tokens/s grow with sqrt(mbs): mbs=8 is best, mbs=4 is 29% below it, 512 is 7% below 256
    df = _noisy_facet(tmp_path, {(256, 8): 0.08, (512, 8): 0.03, (256, 4): 0.02})
    ax = heatmap(df, x="mbs", y="seq_len", metric="tokens_per_s_per_gpu")
    texts = _texts_at(ax)
    assert texts[(0, 3)].startswith("★ ")
    assert texts[(1, 3)].startswith("≈ ")  # seq 512: 7% below, within the best's ±8% band: a tie
    assert not texts[(0, 2)].startswith(("≈", "★"))  # mbs=4: 29% below, outside any band
    assert [p.get_xy() for p in ax.patches if p.get_gid() == "tie"] == [(3, 1)]
    # memory has no noise band: no ties there
    ax = heatmap(df, x="mbs", y="seq_len", metric="peak_mem_bytes")
    assert not any(t.get_text().startswith("≈") for t in ax.texts)
    # without a band (within-run spread 0) the same values are told apart
    quiet = heatmap(_noisy_facet(tmp_path / "quiet", {}), x="mbs", y="seq_len", metric="tokens_per_s_per_gpu")
    assert not any(t.get_text().startswith("≈") for t in quiet.texts)


def test_facet_grid_legend_names_ties_oversubscription_and_emulated_ooms(tmp_path):
    df = _noisy_facet(tmp_path, {(256, 8): 0.08, (512, 8): 0.03}, oversubscribe=True)
    df.loc[df["mbs"] == 1, "status"] = "oom"
    df["memory_capacity"] = "emulated"
    df["peak_flops_source"] = "measured"
    fig = facet_grid(df, x="mbs", y="seq_len", metric="tokens_per_s_per_gpu")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "★ 28,284†" in texts and any(t.startswith("≈ ") and t.endswith("†") for t in texts)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["OOM (emulated capacity)", "★ best", "≈ within noise of ★", "† oversubscribed"]
    mfu = facet_grid(df, x="mbs", y="seq_len", metric="mfu")
    assert mfu.axes[-1].get_ylabel() == "MFU against a measured matmul peak"
