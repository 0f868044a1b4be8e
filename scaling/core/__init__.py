"""Pure shared code below the store, the launch side and the job: the schema and the model config group, enums, units,
batch arithmetic, validation, noise. The standard library only (the α-β network model is scaling.perf.network)."""
