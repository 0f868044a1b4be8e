"""The memory predictor: will a point fit before it is launched?

`analytic` predicts peak bytes per rank by arithmetic, `trace` by running the real step on fake
tensors; `scaling predict` and `scaling find-mbs` (scaling.cli) ask them, and the Hydra job's pre-screen too.
"""


class TraceError(RuntimeError):
    """The traced prediction could not be made (the message says why, in one line): here, not in `trace`, so a
    command that asks for a trace catches it without importing torch."""
