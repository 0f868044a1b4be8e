"""What is trained: one folder per model family, each a `spec.Family` (how it is built, split, sharded, initialised,
counted), and the registry `family` that picks one for a model config. llama/ is the built-in decoder (its args,
module, FLOPs in closed form); custom/ builds and counts a module the user brings; hf/ a Hugging Face causal LM from
its config. `shape` is what the performance model needs of any of them. The model config group's dataclasses are
scaling.core.model_group's (the schema composes them). torch and the standard library only: the ranks import it."""
