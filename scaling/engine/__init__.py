"""What torchrun runs: the ZeRO wrapping of a model (scaling.model builds it), its data, the training loop and its
measurements.

Everything under `scaling.engine` imports torch and the standard library only, so a rank runs on a
bare GPU box that has torch and nothing else (lint-imports and tests/test_layers.py check it). The sweep
driver (scaling.job.run and friends) imports from here; nothing here imports the driver's libraries.
"""
