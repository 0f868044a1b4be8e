"""A Hugging Face causal LM from its config alone, as a model the user brings: the factory a model file's
`hf_config: path/config.json` stands for (scaling.core.model_group.HF_TARGET). No weights and no network: transformers
builds the architecture of the config's text decoder (scaling.model.hf.config reads it), on the meta device in the
engine, which shards, materialises and initialises it (`init_weights`, which in transformers fills the rotary tables
too). Attention is the model file's `attn_implementation`, by default transformers' own choice: SDPA where the model
has it, else eager (said in the record). `transformers` is the `[hf]` extra."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
from torch import nn

from scaling.model.hf.config import read_config

DEFAULT_ATTENTION = "sdpa"
"""The attention transformers runs unless the model file says otherwise or the model has no SDPA (then eager)."""


def causal_lm(
    config: str,
    vocab_size: Optional[int] = None,
    max_seq_len: Optional[int] = None,
    config_sha256: Optional[str] = None,
    attn_implementation: Optional[str] = None,
    **overrides: Any,
) -> nn.Module:
    """`AutoModelForCausalLM.from_config` of the file's (text decoder's) config with `overrides` (its vocabulary and
    longest sequence where the model file gives them), no KV cache, in float32 whatever the file's `torch_dtype`
    (a downloaded config.json names the dtype its weights were saved in; the engine keeps fp32 parameters, the
    master weights of train.precision=bf16, as it does for every model). `config_sha256` only keys the file's
    content.
    Refused (ModelError, one line) when the model is not a causal decoder: an encoder's attention is not causal.

    A mixture of experts runs its experts as batched matmuls over each token's chosen experts (transformers'
    `batched_mm`, unless the file's `experts_implementation` says otherwise): shapes that do not depend on the
    routing, so the FLOP counter and the traced predictor run it on fake tensors (the loop over experts needs the
    routing's values; the grouped kernel takes bf16 only on CPU), and the measured step is the step counted."""
    hf = read_config(config, vocab_size, max_seq_len, **overrides)
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_config(
            hf.text,
            dtype=torch.float32,  # not the file's torch_dtype: the engine keeps fp32 parameters whatever train.precision
            attn_implementation=attn_implementation,
            experts_implementation=hf.experts,
        )
    except (ValueError, ImportError) as e:
        if attn_implementation is not None and ("attention" in str(e) or "attn_implementation" in str(e)):
            raise hf.refused(f"cannot run model.attn_implementation={attn_implementation!r}: {e}") from None
        raise hf.refused(f"is not a causal LM: {e}") from None
    bidirectional = sorted({type(m).__name__ for m in model.modules() if getattr(m, "is_causal", None) is False})
    if bidirectional:
        raise hf.refused(
            f"is not a causal decoder: {type(model).__name__}'s attention ({', '.join(bidirectional)}) attends both ways "
            "(is_causal=false; an encoder's): give a decoder-only config"
        )
    return model


@contextlib.contextmanager
def masks_as_on_real_tensors() -> Iterator[None]:
    """While inside, transformers masks a forward on fake tensors (the FLOP count, the traced predictor) as it masks
    the same forward on real ones. Its masks look for packed sequences in the position ids; on real tensors the
    engine's (every row's positions 0..T-1: it never packs) are found unpacked, and attention runs SDPA with
    `is_causal` and no mask (grouped-query attention without repeating keys and values). On fake tensors the values
    cannot be read, and transformers would build a (T, T) mask for packed sequences and repeat each key and value
    head for every query head it serves, which the real step never holds (at Mistral-7B's shapes, seq 4096, 2.5 GiB
    of activations more: docs/own-project.md)."""
    from torch._subclasses.fake_tensor import is_fake

    try:
        from transformers import masking_utils
    except ImportError:  # without the [hf] extra: the build refuses the model, naming what to install
        yield
        return
    find = masking_utils.find_packed_sequence_indices

    def unpacked_when_fake(position_ids: Any) -> Any:
        return None if is_fake(position_ids) else find(position_ids)

    masking_utils.find_packed_sequence_indices = unpacked_when_fake
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = find


def attention_of(model: nn.Module) -> Optional[str]:
    """The attention implementation a built model runs (None: not a transformers model)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def load_modeling(config: str, **arguments: Any) -> None:
    """Import the modeling module of `causal_lm`'s model (its arguments) without building it: transformers imports
    a model type's module when it is first built, and a rank that imports it before its memory baseline does not
    count the import as building (scaling.model.custom.build.load_code)."""
    hf = read_config(config, **arguments)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    with contextlib.suppress(KeyError):  # not a causal LM: causal_lm says so when the model is built
        MODEL_FOR_CAUSAL_LM_MAPPING[type(hf.text)]


def as_built_on_meta(module: nn.Module) -> None:
    """Forget that transformers initialised `module` while building it (it marks what it initialised, and its
    `init_weights` skips what is marked): built on meta, as the engine builds it, nothing is initialised or marked."""
    for t in [*module.modules(), *module.parameters(), *module.buffers()]:
        t.__dict__.pop("_is_hf_initialized", None)


HF_STYLES = {
    "colwise": "colwise",
    "rowwise": "rowwise",
    "colwise_rep": "colwise_rep",
    "rowwise_rep": "rowwise_rep",
    "replicated_with_grad_allreduce": "replicate_sum_grad",
}
"""transformers' plan words this engine runs, in its own words. The others leave their module whole on every rank:
`colwise_gather_output` and `rowwise_split_input` come in pairs whose parts are whole between them (Phi-3's fused
qkv, OLMo 2's q/k/v), `embedding_rowwise` splits a vocabulary a tied head shares, and the expert-parallel words
(`packed_colwise`, `moe_tp_experts`) name experts fed the whole hidden state; a whole module computes what its
split would, at its full cost."""


FUSED_PAIR = frozenset({"colwise_gather_output", "rowwise_split_input"})
"""transformers' words for a pair whose parts are whole between them: a fused projection whose output the forward
splits apart (Phi-3's gate_up_proj, its qkv_proj), and the module after it."""


def _hf_plan(config: str, **arguments: Any) -> dict[str, str]:
    """The (text decoder's) config's `base_model_tp_plan`, transformers' own per model type, its patterns under the
    causal LM's base model (its `base_model_prefix`: `model.` for Llama, `gpt_neox.` for GPT-NeoX, `transformer.` for
    GPT-J), in transformers' words; empty when it has none."""
    hf = read_config(config, **arguments)
    plan = getattr(hf.text, "base_model_tp_plan", None) or {}
    if not plan:
        return {}
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        prefix = MODEL_FOR_CAUSAL_LM_MAPPING[type(hf.text)].base_model_prefix
    except KeyError:  # not a causal LM: causal_lm says so when the model is built
        return {}
    return {f"{prefix}.{pattern}": word for pattern, word in plan.items()}


def hf_tp_plan(config: str, **arguments: Any) -> dict[str, str]:
    """transformers' own plan (`_hf_plan`) in the engine's words, what it keeps whole left out; empty when it has
    none."""
    plan = _hf_plan(config, **arguments)
    whole = _kept_whole(plan)
    # under a module left whole (the experts), the plan's words name its parameters, not submodules: left whole too
    return {
        pattern: HF_STYLES[word]
        for pattern, word in plan.items()
        if word in HF_STYLES and not any(pattern.startswith(f"{w}.") for w in whole)
    }


def hf_kept_whole(config: str, **arguments: Any) -> dict[str, str]:
    """The patterns of transformers' own plan that this engine keeps whole (HF_STYLES), with transformers' word:
    a fused projection whose parts its forward splits apart (`colwise_gather_output`: Phi-3's gate_up_proj), the
    experts."""
    return _kept_whole(_hf_plan(config, **arguments))


def _kept_whole(plan: dict[str, str]) -> dict[str, str]:
    """The patterns of a plan (`_hf_plan`) whose words this engine does not run, with their words."""
    return {pattern: word for pattern, word in plan.items() if word not in HF_STYLES}


def hf_widths(config: str, **arguments: Any) -> dict[str, int]:
    """The (text decoder's) heads, key/value heads and widths that tensor parallelism splits, by the config's names."""
    text = read_config(config, **arguments).text
    names = ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size")
    return {name: int(getattr(text, name)) for name in names if isinstance(getattr(text, name, None), int)}
