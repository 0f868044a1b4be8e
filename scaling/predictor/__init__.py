"""The memory predictor: will a point fit before it is launched?

`analytic` predicts peak bytes per rank by arithmetic, `trace` by running the real step on fake
tensors; `scaling predict` and `scaling find-mbs` (scaling.cli) ask them, and the Hydra job's pre-screen too.
"""
