"""One point's job: the Hydra app that turns a config into a record (validate, predict, launch, measure, log)."""
