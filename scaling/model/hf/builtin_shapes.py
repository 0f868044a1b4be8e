"""A Hugging Face config the built-in family's shapes describe (Llama, Mistral, Qwen2, Qwen3 and the like): the
built-in `model` config with its sizes, when the model transformers builds has the built-in decoder's matrices
(per block q, k, v, o and the SwiGLU's three; the embedding and the output projection unless tied). Its vectors
(biases, RMSNorm and q/k-norm weights) are left out of the comparison: a few thousand parameters per block, which
the built-in formulas do not hold and the trace-calibrated correction counts (scaling.predictor.calibrated).
A head_dim other than hidden / heads (Gemma 2 and 3, Qwen3-0.6B and 4B) is the built-in config's own `head_dim`.
What decides is the counted module's parameter tensors (scaling.model.custom.count), so a fused projection or a
mixture of experts is not described, whatever its model type says.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from scaling.core.model_group import ModelConfig
from scaling.model.hf.config import LAYERS_KEY
from scaling.model.llama.args import param_shapes
from scaling.model.shape import Counted


def _matrices(tensors: Any) -> Counter[tuple[bool, int, int]]:
    """(in a block, rows, cols) of every matrix (cols > 1), counted: the shapes whatever their names and order."""
    return Counter((bool(in_block), int(rows), int(cols)) for _, in_block, rows, cols in tensors if cols > 1)


def builtin_config(name: str, text: Any, counted: Counted) -> Optional[ModelConfig]:
    """The built-in `model` config of a transformers text config whose counted module has exactly the built-in
    decoder's matrices at its sizes; None when its sizes are not all there or its matrices differ."""
    sizes = {
        "n_layers": getattr(text, LAYERS_KEY, None),
        "hidden": getattr(text, "hidden_size", None),
        "n_heads": getattr(text, "num_attention_heads", None),
        "n_kv_heads": getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads", None),
        "ffn_hidden": getattr(text, "intermediate_size", None),
        "vocab_size": getattr(text, "vocab_size", None),
        "max_seq_len": getattr(text, "max_position_embeddings", None),
    }
    if not all(isinstance(v, int) and v > 0 for v in sizes.values()):
        return None
    head_dim = getattr(text, "head_dim", None)
    if head_dim is not None and not (isinstance(head_dim, int) and head_dim > 0 and head_dim % 2 == 0):
        return None
    # a head_dim of hidden / heads is the built-in default: ModelConfig makes it null itself (one job key)
    if (head_dim is None and sizes["hidden"] % sizes["n_heads"]) or sizes["n_heads"] % sizes["n_kv_heads"]:
        return None
    tied = bool(getattr(text, "tie_word_embeddings", False))
    model = ModelConfig(name=name, tie_embeddings=tied, head_dim=head_dim, **sizes)
    if counted.n_blocks != model.n_layers or _matrices(counted.tensors) != _matrices(param_shapes(model)):
        return None
    return model
