"""The shipped Hydra configs (config.yaml and its groups), installed as the data package `scaling.conf`."""
