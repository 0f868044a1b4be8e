"""Hydra sweeper for grids that resumes at the record store's speed: `hydra/sweeper=scaling_grid` (the default)."""
