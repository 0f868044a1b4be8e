"""The `model` config group: the decoder's shapes as one plain dataclass.

It lives in the engine because a rank builds its model from it (scaling.engine.model's `ModelArgs`); the
schema (scaling.core.schema) types the `model` group with it. Standard library only: importing it costs no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

    name: str = "tiny"
    """Preset name, carried into records and plots."""
    n_layers: int = 2
    """Number of decoder blocks (L)."""
    hidden: int = 64
    """Model width (h)."""
    n_heads: int = 4
    """Attention query heads; must divide `hidden`."""
    n_kv_heads: int = 2
    """Key/value heads (GQA); must divide `n_heads`."""
    ffn_hidden: int = 192
    """Inner width of the SwiGLU MLP."""
    vocab_size: int = 512
    """Vocabulary size (v)."""
    max_seq_len: int = 512
    """Longest sequence the model is configured for; `train.seq_len` may not exceed it."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection (Llama 3.2 1B/3B do)."""
