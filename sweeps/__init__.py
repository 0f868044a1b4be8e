"""The shipped sweep files, installed as the data package `scaling.sweeps` (`scaling sweep NAME`)."""
