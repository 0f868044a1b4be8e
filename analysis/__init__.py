"""Analysis of sweep results: records -> pandas, heatmaps, DP scaling, the α-β model and the report.

`collect` reads records into one DataFrame; `heatmaps`, `dp_scaling` and `alpha_beta` turn it into
figures and statements; `report` writes them as Markdown and self-contained HTML. Figures are
drawn on the Agg canvas (`figures.new_figure`), never through pyplot's current backend.
"""

from analysis.collect import collect, from_wandb, to_parquet

__all__ = ["collect", "from_wandb", "to_parquet"]
