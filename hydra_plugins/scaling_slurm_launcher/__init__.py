"""Hydra launcher for sweeps of thousands of SLURM points: `hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml)."""
