"""A Hugging Face config file read through transformers, as a model file's `hf_config:` names it: transformers' own
config class of its `model_type`, so its attribute names hold (GPT-2's `n_positions` is its longest sequence), and
of a composite config (a vision-language model's) the text decoder's part. What is not a causal decoder (an
encoder-decoder, an encoder such as BERT) is refused here, in one line naming the file. The `[hf]` extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from scaling.core.model_group import ModelError, hf_config_dirs, hf_config_path

HF_EXTRA = "pip install 'scaling[hf]'"
"""What to install for a model made from a Hugging Face config."""
EXPERTS = "batched_mm"
"""transformers' implementation of a mixture of experts (scaling.model.hf.causal_lm)."""
LONGEST = "max_position_embeddings"
"""transformers' name of a model's longest sequence (a config class may map it to its own: `attribute_map`)."""
LAYERS_KEY = "num_hidden_layers"
"""transformers' name of a decoder's number of blocks (every Llama-like config class has it)."""
LAYER_TYPES = "layer_types"
"""transformers' list of each block's kind (Qwen3's, Gemma's and others' sliding and full attention), which its
validator holds to `LAYERS_KEY` blocks."""


@dataclass(frozen=True)
class HFConfig:
    """A config file as transformers reads it: the file (as the model file names it), its model type, the text
    decoder's config (the whole config, unless it is composite) and its experts' implementation."""

    path: str
    model_type: str
    text: Any
    experts: str

    def refused(self, why: str) -> ModelError:
        """A refusal of this config, in one line that names the file and its model type."""
        return ModelError(f"model.hf_config={self.path!r} ({self.model_type}) {why}".splitlines()[0])

    def longest_name(self) -> str:
        """The config's own name for its longest sequence (GPT-2's `n_positions`)."""
        return type(self.text).attribute_map.get(LONGEST, LONGEST)

    def sizes(self) -> tuple[Optional[int], Optional[int]]:
        """Its vocabulary and longest sequence (None: it has none, as ALiBi's BLOOM), read by transformers' names."""
        return getattr(self.text, "vocab_size", None), getattr(self.text, LONGEST, None)


def read_config(
    config: str,
    vocab_size: Optional[int] = None,
    max_seq_len: Optional[int] = None,
    config_sha256: Optional[str] = None,
    attn_implementation: Optional[str] = None,
    **overrides: Any,
) -> HFConfig:
    """The file's config, read from the factory's arguments (scaling.model.hf.causal_lm): with the model file's
    `overrides` (on the text part of a composite config), its vocabulary and longest sequence where given, and no KV
    cache (training); ModelError, one line, when it cannot be read or is an encoder-decoder. The hash and the
    attention are the factory's."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ModelError(f"model.hf_config={config!r} needs transformers: {HF_EXTRA}") from None
    try:
        fields = json.loads(hf_config_path(config).read_text())
    except FileNotFoundError:
        where = ", ".join(str(d) for d in hf_config_dirs())
        raise ModelError(
            f"model.hf_config={config!r}: no such file in {where} (a relative path is looked for there, in order)"
        ) from None
    except (OSError, ValueError) as e:
        raise ModelError(f"model.hf_config={config!r} is not a readable JSON config: {e}") from None
    model_type = fields.pop("model_type", None) if isinstance(fields, dict) else None
    if model_type is None:
        raise ModelError(f"model.hf_config={config!r} has no model_type: not a transformers config")
    experts = overrides.pop("experts_implementation", fields.pop("experts_implementation", EXPERTS))
    given = {k: v for k, v in {**overrides, "vocab_size": vocab_size, LONGEST: max_seq_len}.items() if v is not None}
    given["use_cache"] = False  # training: no KV cache
    try:
        whole = AutoConfig.for_model(model_type, **fields)
        text = whole.get_text_config(decoder=True)
        given |= _layer_types_for(text, given)
        # what the model file gives is the text decoder's (through the class's attribute_map: n_positions)
        if text is whole:
            text = AutoConfig.for_model(model_type, **{**fields, **given})
        else:
            text = type(text)(**{**text.to_dict(), **given})
    except Exception as e:  # transformers' validators raise their own kinds, over several lines
        why = " ".join(str(e).split())
        keys = ", ".join(sorted(overrides)) or "none"
        raise ModelError(
            f"model.hf_config={config!r} ({model_type}; overridden: {keys}) is not a valid config: {why}"
        ) from None
    from scaling.model.hf.keys import check_keys

    unknown = check_keys(f"model.hf_config={config!r} ({model_type})", type(whole), fields)
    unknown += check_keys(f"the model file's keys over model.hf_config={config!r}", type(text), overrides)
    if unknown:
        raise ModelError("; ".join(unknown))
    hf = HFConfig(config, model_type, text, experts)
    if getattr(whole, "is_encoder_decoder", False):
        raise hf.refused(
            "is not a causal decoder: an encoder-decoder (is_encoder_decoder=true); give a decoder-only one"
        )
    heads, kv = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if getattr(text, "kv_lora_rank", None) and isinstance(kv, int) and kv != heads:
        # transformers' multi-head latent attention repeats its keys and values num_attention_heads / kv times
        # onto heads it already has one for each of: its eager attention and SDPA with a mask fail on the shapes
        raise hf.refused(
            f"has num_key_value_heads={kv} and num_attention_heads={heads}: its multi-head latent attention "
            f"(kv_lora_rank) makes a key and a value for every head, and transformers' attention repeats them "
            f"{heads}/{kv} times more (eager attention fails on the shapes): set num_key_value_heads={heads}"
        )
    return hf


def _layer_types_for(text: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Where a number of blocks is given without their kinds, the file's kinds (`LAYER_TYPES`) cut or repeated to it,
    block for block: a model cut to its first blocks (the calibration's 1- and 2-block cuts,
    scaling.predictor.calibrated) keeps theirs, where transformers would refuse the file's list as the wrong length."""
    blocks, kinds = given.get(LAYERS_KEY), getattr(text, LAYER_TYPES, None)
    if not isinstance(blocks, int) or LAYER_TYPES in given or not isinstance(kinds, list) or not kinds:
        return {}
    return {LAYER_TYPES: [kinds[i % len(kinds)] for i in range(blocks)]}
