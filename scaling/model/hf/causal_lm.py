"""A Hugging Face causal LM from its config alone, as a model the user brings: the factory a model file's
`hf_config: path/config.json` stands for (scaling.core.model_group.HF_TARGET). No weights and no network: transformers
builds the architecture (on the meta device in the engine), the engine shards, materialises and initialises it
(`init_weights`, which in transformers fills the rotary tables too). `transformers` is the `[hf]` extra."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Optional

from torch import nn

from scaling.core.model_group import hf_config_path

HF_EXTRA = "pip install 'scaling[hf]'"
"""What to install for a model made from a Hugging Face config."""
EXPERTS = "batched_mm"
"""transformers' implementation of a mixture of experts (see `causal_lm`)."""


def causal_lm(
    config: str, vocab_size: int, max_seq_len: int, config_sha256: Optional[str] = None, **overrides: Any
) -> nn.Module:
    """`AutoModelForCausalLM.from_config` of the file's fields with `overrides` (its vocabulary and longest sequence
    as the model file gives them), SDPA attention, no KV cache. `config_sha256` only keys the file's content.

    A mixture of experts runs its experts as batched matmuls over each token's chosen experts (transformers'
    `batched_mm`, unless the file's `experts_implementation` says otherwise): shapes that do not depend on the
    routing, so the FLOP counter and the traced predictor run it on fake tensors (the loop over experts needs the
    routing's values; the grouped kernel takes bf16 only on CPU), and the measured step is the step counted."""
    # first the config: it says what to install when transformers is missing
    hf, experts, model_type = _hf_config(config, vocab_size, max_seq_len, overrides)
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa", experts_implementation=experts)
    except ValueError as e:
        raise _not_a_causal_lm(config, model_type, e) from None


def load_modeling(
    config: str, vocab_size: int, max_seq_len: int, config_sha256: Optional[str] = None, **overrides: Any
) -> None:
    """Import the modeling module of `causal_lm`'s model (its arguments) without building it: transformers imports
    a model type's module when it is first built, and a rank that imports it before its memory baseline does not
    count the import as building (scaling.model.custom.build.load_code)."""
    hf = _hf_config(config, vocab_size, max_seq_len, overrides)[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    with contextlib.suppress(KeyError):  # not a causal LM: causal_lm says so when the model is built
        MODEL_FOR_CAUSAL_LM_MAPPING[type(hf)]


def _hf_config(config: str, vocab_size: int, max_seq_len: int, overrides: dict[str, Any]) -> tuple[Any, str, str]:
    """transformers' config of the file's fields with `overrides`, its experts' implementation and its model type."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ValueError(f"model.hf_config={config!r} needs transformers: {HF_EXTRA}") from None
    try:
        fields = json.loads(hf_config_path(config).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"model.hf_config={config!r} is not a readable JSON config: {e}") from None
    fields = {**fields, **overrides, "vocab_size": vocab_size, "max_position_embeddings": max_seq_len}
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"model.hf_config={config!r} has no model_type: not a transformers config")
    fields["use_cache"] = False  # training: no KV cache
    experts = fields.pop("experts_implementation", EXPERTS)
    try:
        return AutoConfig.for_model(model_type, **fields), experts, model_type
    except ValueError as e:
        raise _not_a_causal_lm(config, model_type, e) from None


def _not_a_causal_lm(config: str, model_type: str, e: ValueError) -> ValueError:
    """transformers' refusal of the file's config or model, in one line naming the file and its model type."""
    return ValueError(f"model.hf_config={config!r} ({model_type}) is not a causal LM: {e}".splitlines()[0])


HF_STYLES = {"colwise": "colwise", "rowwise": "rowwise", "colwise_rep": "colwise_rep", "rowwise_rep": "rowwise_rep"}
"""transformers' plan words this engine runs (others, such as expert-parallel ones, are left out of the plan)."""


def hf_tp_plan(
    config: str, vocab_size: int, max_seq_len: int, config_sha256: Optional[str] = None, **overrides: Any
) -> dict[str, str]:
    """The config's `base_model_tp_plan` (transformers' own, per model type) under the causal LM's base model
    (`model.`), in the engine's words; empty when it has none."""
    hf = _hf_config(config, vocab_size, max_seq_len, overrides)[0]
    plan = getattr(hf, "base_model_tp_plan", None) or {}
    return {f"model.{pattern}": HF_STYLES[word] for pattern, word in plan.items() if word in HF_STYLES}
