"""Pure shared code below the store, the launch side and the job: schema, enums, units, batch arithmetic, validation, the α-β network model."""
