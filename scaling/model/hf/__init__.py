"""A Hugging Face causal LM from its config alone (the `[hf]` extra): causal_lm.py."""
