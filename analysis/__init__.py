"""Analysis of sweep results: records -> pandas, heatmaps, DP scaling and its extrapolation, memory checks, the report.

`collect` reads records into one DataFrame (`usable` says which it can use) and `sweep_data` reads a sweep directory
once; `heatmaps` and `facets`, `dp_scaling`, `dp_extrapolation` (on the α-β network model of scaling.perf.network)
and `memory` turn them into figures and statements; `sections` says them and `report_writer` writes them as Markdown
and self-contained HTML. Figures are drawn on the Agg canvas (`figures.new_figure`), never through pyplot's current
backend.
"""

from analysis.collect import collect, from_wandb, to_parquet

__all__ = ["collect", "from_wandb", "to_parquet"]
