"""A Hugging Face causal LM from its config alone (the `[hf]` extra): family.py (its entry in the registry), config.py
(the file read through transformers), causal_lm.py (the model built from it)."""
