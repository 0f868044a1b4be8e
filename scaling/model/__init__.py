"""What is trained: one folder per model family behind one interface (scaling.model.family). llama/ is the built-in
decoder (its args, its module, its FLOPs in closed form); custom/ builds and counts a module the user brings; hf/
builds a Hugging Face causal LM from its config. shape.py is what the performance model needs of any of them. The
`model` config group's dataclasses are scaling.core.model_group's (the schema composes them). torch and the
standard library only: the ranks import it."""
