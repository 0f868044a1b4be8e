"""Keys of a config field's metadata, which every group of the schema (scaling.core.schema) and the record's typed
blocks (scaling.store.record_blocks) use to say how a field counts: in the job key, as an analysis column, as an axis."""

NEUTRAL = "neutral"
"""The value at which a field changes nothing measured before it existed (job_key omits it)."""
COLUMN = "column"
"""The analysis column of a field whose own name would not say what it is (model.name: `model`); None: no column."""
GROUP = "group"
"""(A dataclass) of a group field whose default is not a default_factory: the `model` group, which holds a model
config of either kind (scaling.core.model_group.ModelGroup)."""
RUN_ONLY = "run_only"
"""(True) the field says how long or how a point is run (steps, seed, fault), not which configuration it is. It is
part of the job key all the same; it is never a configuration axis."""
