"""A Hugging Face causal LM from its config alone (the `[hf]` extra): config.py (the file read through transformers),
causal_lm.py (the model built from it)."""
