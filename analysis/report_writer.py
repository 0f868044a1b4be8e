"""The sweep report: Markdown plus a self-contained HTML page (figures as base64 PNG), optionally W&B
(figures, typed tables, and the Parquet record table and the HTML report as artifacts).

`scaling report SWEEP_DIR [--out DIR] [--wandb]` writes, under `<sweep_dir>/report` unless told:
status counts, the top configurations (ties within noise of the best marked), the noise of the
measurements, the heatmaps, the DP-scaling curve with its knee and the dps it may lie at within
noise, and its extrapolation beyond the measured dp (when the sweep has several dp), the memory
checks (`analysis.memory`), the failures' last error lines and the device time the launches held; and the
records it could not use, each named.
"""

from __future__ import annotations

import base64
import html
import os
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from analysis.collect import STATUS_ORDER, to_parquet
from analysis.figures import render_pngs
from analysis.sections import Section, build_sections, top_configurations
from analysis.sweep_data import SweepData
from scaling.core.enums import Status
from scaling.perf.knee import DEFAULT_THRESHOLD


def _md_table(df: pd.DataFrame) -> str:
    cells = [[str(c) for c in df.columns]] + [[str(v).replace("|", "\\|") for v in row] for row in df.to_numpy()]
    lines = ["| " + " | ".join(r) + " |" for r in cells]
    lines.insert(1, "|" + "---|" * len(df.columns))
    return "\n".join(lines)


NUMBER = re.compile(r"[-+±≈]?\s?[\d,.]+\s?(%|[KMGT]?i?B|s|pts)?|\[[\d,. ]+\]|")
"""A cell that reads as a figure (right-aligned): a number with its unit or sign, a [low, high] band, or empty."""


def _html_table(df: pd.DataFrame) -> str:
    """A table whose text columns are left-aligned and whose figures are right-aligned."""
    text = [not all(NUMBER.fullmatch(str(v).strip()) for v in df[c]) for c in df.columns]
    cls = [' class="text"' if t else "" for t in text]
    head = "".join(f"<th{k}>{html.escape(str(c))}</th>" for c, k in zip(df.columns, cls))
    body = "".join(
        "<tr>" + "".join(f"<td{k}>{html.escape(str(v))}</td>" for v, k in zip(row, cls)) + "</tr>"
        for row in df.to_numpy()
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


CSS = (
    "body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}"
    "th.text,td.text{text-align:left}"
    "th{background:#f0f0f0}img{max-width:100%;display:block;margin:1em 0}code{background:#f4f4f4}"
    "pre{white-space:pre-wrap;overflow-wrap:anywhere}"
)


def _add_text(md: list[str], page: list[str], paragraphs: list[str], tables: list[pd.DataFrame]) -> None:
    """Paragraphs, then tables, to the Markdown lines and the HTML page."""
    for text in paragraphs:
        md += [text, ""]
        page.append(f"<p>{html.escape(text)}</p>")
    for table in tables:
        md += [_md_table(table), ""]
        page.append(_html_table(table))


def write_report(
    sweep_dir: str | os.PathLike,
    out_dir: Optional[str | os.PathLike] = None,
    threshold: float = DEFAULT_THRESHOLD,
    wandb: bool = False,
    wandb_project: str = "scaling",
    wandb_mode: str = "offline",
    jobs: Optional[int] = None,
    wandb_entity: Optional[str] = None,
    lead: Sequence[Section] = (),
) -> dict[str, Path]:
    """Write report.md, report.html (self-contained), results.parquet and figures/*.png; return their paths.

    The heatmaps are drawn by `jobs` processes (default: one per usable core). A record the analysis cannot
    use is left out, named on stderr and in the report's "Records left out". `lead`: sections before the sweep's
    own (`scaling report` puts the directory's recipe there).
    """
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep_dir / "report"
    data = SweepData.load(sweep_dir)
    df, left_out, meta = data.df, data.left_out, data.meta
    for one in left_out:
        print(f"[scaling report] {one.line()}", file=sys.stderr)
    sections = [*lead, *build_sections(data, threshold)]
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for stale in (out / "figures").glob("*.png"):  # figures of an earlier report of another layout
        stale.unlink()
    paths: dict[str, Path] = {"parquet": to_parquet(df, out / "results.parquet")}
    pngs = render_pngs(
        {name: fig for section in sections for name, fig in section.figures.items()}, out / "figures", jobs
    )
    title = f"Sweep report: {data.name}"
    intro = f"{len(df)} records in <code>{html.escape(str(sweep_dir))}</code>"
    if left_out:
        intro += f" ({len(left_out)} more left out: see Records left out)"
    if meta.get("created_at"):  # sweep.json: written when the sweep first started
        intro += f", started {html.escape(str(meta['created_at']))}"
        if meta.get("hardware"):
            intro += f" on {html.escape(str(meta['hardware'].get('name')))}"
    md = [f"# {title}", "", intro.replace("<code>", "`").replace("</code>", "`") + ".", ""]
    page = [f"<h1>{html.escape(title)}</h1>", f"<p>{intro}.</p>"]
    for section in sections:
        md += [f"## {section.title}", ""]
        page.append(f"<h2>{html.escape(section.title)}</h2>")
        _add_text(md, page, section.paragraphs, section.tables)
        if section.code:
            md += ["```bash", *section.code, "```", ""]
            page.append(f"<pre><code>{html.escape(chr(10).join(section.code))}</code></pre>")
        for name in section.figures:
            png = paths[f"figure:{name}"] = pngs[name]
            md += [f"![{name}](figures/{png.name})", ""]
            encoded = base64.b64encode(png.read_bytes()).decode()
            page.append(f'<img alt="{html.escape(name)}" src="data:image/png;base64,{encoded}">')
        if section.details or section.detail_tables:
            md += ["<details>", f"<summary>{html.escape(section.details_title)}</summary>", ""]
            page.append(f"<details><summary>{html.escape(section.details_title)}</summary>")
            _add_text(md, page, section.details, section.detail_tables)
            md += ["</details>", ""]
            page.append("</details>")
    paths["markdown"] = out / "report.md"
    paths["markdown"].write_text("\n".join(md))
    paths["html"] = out / "report.html"
    paths["html"].write_text(
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
        f"</title><style>{CSS}</style></head><body>{''.join(page)}</body></html>"
    )
    if wandb:
        paths["wandb_run_dir"] = log_to_wandb(
            df, sections, paths, data.name, sweep_dir, wandb_project, wandb_entity, wandb_mode
        )
    return paths


def typed_table(df: pd.DataFrame) -> pd.DataFrame:
    """`df` ready for a typed wandb.Table: numbers stay numbers, categories and times become text, list
    columns (losses, step times) are left to the Parquet artifact, missing values become None."""
    scalar = df[[c for c in df.columns if not any(isinstance(v, (list, tuple)) for v in df[c])]]
    out = scalar.astype(
        {
            c: str
            for c in scalar.columns
            if isinstance(scalar[c].dtype, pd.CategoricalDtype) or pd.api.types.is_datetime64_any_dtype(scalar[c])
        }
    )
    return out.astype(object).where(scalar.notna(), None)


def log_to_wandb(
    df: pd.DataFrame,
    sections: list[Section],
    paths: dict[str, Path],
    sweep: str,
    sweep_dir: Path,
    project: str,
    entity: Optional[str],
    mode: str,
) -> Path:
    """One report run in the sweep's group (job_type report), beside the points' runs in the sweep's
    wandb folder: the figures, typed tables (status counts, top configurations, every record), the knees
    in the summary, and the Parquet record table and the HTML report as artifacts."""
    import wandb

    from scaling.store.wandb_runs import run_dir, run_settings, safe_name

    run = wandb.init(
        project=project,
        entity=entity,
        group=sweep,
        job_type="report",
        name=f"{sweep} report",
        dir=run_dir(None, str(sweep_dir), os.environ),
        mode=mode,
        config={"sweep": sweep, "records": len(df)},
        settings=wandb.Settings(**run_settings(os.environ)),
    )
    try:
        images = {
            f"report/{k.split(':', 1)[1]}": wandb.Image(str(p)) for k, p in paths.items() if k.startswith("figure:")
        }
        counts = df["status"].value_counts().reindex(STATUS_ORDER, fill_value=0)
        tables = {
            "status_counts": counts.rename_axis("status").reset_index(name="records"),
            "top_configurations": top_configurations(df),
            "records": df,
        }
        run.log({**images, **{f"report/{name}": wandb.Table(dataframe=typed_table(t)) for name, t in tables.items()}})
        for status, count in counts.items():
            run.summary[f"records/{status}"] = int(count)
        ok = df[df["status"] == Status.OK]
        if len(ok):
            run.summary["best_tokens_per_s_per_gpu"] = float(ok["tokens_per_s_per_gpu"].max())
        for section in sections:
            if section.title == "Data-parallel scaling":
                run.summary["dp_knees"] = " ".join(section.paragraphs)
        for name, kind, files in (
            (f"{sweep}-records", "dataset", ("parquet",)),
            (f"{sweep}-report", "report", ("html", "markdown")),
        ):
            artifact = wandb.Artifact(safe_name(name), type=kind)
            for key in files:
                artifact.add_file(str(paths[key]))
            run.log_artifact(artifact)
        return Path(run.dir).parent
    finally:
        run.finish()
