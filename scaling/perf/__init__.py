"""The performance model: how long a step takes at dp=n, and how sure that is. network.py (the α-β cost of ring
collectives) and network_figures.py (measured, published), step_model.py (what each ZeRO stage communicates per
step, and its time), dp_fit.py (its unknowns fitted to measured points), extrapolation.py (the curve past the
measured dp with its band), knee.py (where DP stops paying off). Arithmetic on numpy and scipy: it reads no record
and launches nothing; the report, the recipe and `scaling collectives` use it. docs/dp-extrapolation.md derives it.
"""
