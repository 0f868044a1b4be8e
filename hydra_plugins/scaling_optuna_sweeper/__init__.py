"""Hydra sweeper that searches experiment points with Optuna: `hydra/sweeper=scaling_optuna`."""
