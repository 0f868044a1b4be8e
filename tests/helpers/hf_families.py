"""Tiny Hugging Face configs of the families people train, made by transformers' own config classes (never
hand-written JSON), and the PaLM closed form their counted FLOPs are held to. tests/test_hf_families.py checks them;
benchmarks/bench_hf_families.py trains them and prints the table in benchmarks/RESULTS.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

V, H, L, F, HEADS, KV, POS = 256, 64, 2, 128, 4, 2, 128
"""Vocabulary, width, layers, MLP width, heads, key/value heads and longest sequence of every tiny config."""


def _decoder(**extra: Any) -> dict[str, Any]:
    """The fields most decoders name alike (`extra` adds or replaces some)."""
    fields = dict(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=F,
        num_hidden_layers=L,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        max_position_embeddings=POS,
        pad_token_id=0,
    )
    return {**fields, **extra}


def _configs() -> dict[str, Callable[[], Any]]:
    import transformers as t

    return {
        "llama": lambda: t.LlamaConfig(**_decoder()),
        "mistral": lambda: t.MistralConfig(**_decoder(sliding_window=16)),
        "gpt2": lambda: t.GPT2Config(vocab_size=V, n_embd=H, n_layer=L, n_head=HEADS, n_positions=POS),
        "gpt_neox": lambda: t.GPTNeoXConfig(**{k: v for k, v in _decoder().items() if k != "num_key_value_heads"}),
        "phi3": lambda: t.Phi3Config(**_decoder()),
        "gemma2": lambda: t.Gemma2Config(**_decoder(head_dim=16, sliding_window=16)),
        "gemma3_text": lambda: t.Gemma3TextConfig(**_decoder(head_dim=16, sliding_window=16)),
        "qwen3": lambda: t.Qwen3Config(**_decoder(head_dim=16)),
        "qwen3_moe": lambda: t.Qwen3MoeConfig(
            **_decoder(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
        ),
        "olmo2": lambda: t.Olmo2Config(**_decoder()),
        "falcon": lambda: t.FalconConfig(
            vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS, max_position_embeddings=POS
        ),
        "starcoder2": lambda: t.Starcoder2Config(**_decoder(sliding_window=16)),
        "granite": lambda: t.GraniteConfig(**_decoder()),
        "deepseek_v3": lambda: t.DeepseekV3Config(
            **_decoder(
                num_key_value_heads=HEADS,
                moe_intermediate_size=32,
                n_routed_experts=4,
                num_experts_per_tok=2,
                n_shared_experts=1,
                first_k_dense_replace=1,
                q_lora_rank=32,
                kv_lora_rank=16,
                qk_rope_head_dim=8,
                qk_nope_head_dim=8,
                v_head_dim=16,
                n_group=1,
                topk_group=1,
            )  # fmt: skip
        ),
        "cohere": lambda: t.CohereConfig(**_decoder()),
        "stablelm": lambda: t.StableLmConfig(**_decoder()),
        "mixtral": lambda: t.MixtralConfig(**_decoder(num_local_experts=4, num_experts_per_tok=2)),
        "bloom": lambda: t.BloomConfig(vocab_size=V, hidden_size=H, n_layer=L, n_head=HEADS),
        "gptj": lambda: t.GPTJConfig(vocab_size=V, n_embd=H, n_layer=L, n_head=HEADS, n_positions=POS, rotary_dim=8),
        "gemma3": lambda: t.Gemma3Config(
            text_config=_decoder(head_dim=16, sliding_window=16),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=32,
                patch_size=16,
            ),
        ),  # fmt: skip
    }


def _refused() -> dict[str, Callable[[], Any]]:
    import transformers as t

    encoder = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS, intermediate_size=F)
    return {
        "bert": lambda: t.BertConfig(**encoder, max_position_embeddings=POS),
        "roberta": lambda: t.RobertaConfig(**encoder, max_position_embeddings=POS),
        "t5": lambda: t.T5Config(vocab_size=V, d_model=H, d_ff=F, num_layers=L, num_heads=HEADS),
        "bart": lambda: t.BartConfig(
            vocab_size=V,
            d_model=H,
            encoder_layers=L,
            decoder_layers=L,
            encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS,
            max_position_embeddings=POS,
        ),  # fmt: skip
    }


CAUSAL = (
    "llama", "mistral", "gpt2", "gpt_neox", "phi3", "gemma2", "gemma3_text", "qwen3", "qwen3_moe", "olmo2", "falcon",
    "starcoder2", "granite", "deepseek_v3", "cohere", "stablelm", "mixtral", "bloom", "gptj", "gemma3",
)  # fmt: skip
"""Causal decoders, dense and mixtures of experts (qwen3_moe, deepseek_v3, mixtral); gemma3 is a composite
(vision-language) config whose text decoder is trained."""
MOE = ("qwen3_moe", "deepseek_v3", "mixtral")
TIED = ("gpt2", "gemma2", "gemma3_text", "falcon", "starcoder2", "cohere", "bloom", "gemma3")
"""Families whose tiny config ties the token embedding to the output head (transformers' default for them)."""
SLIDING = ("mistral", "gemma2", "gemma3_text", "starcoder2", "gemma3")
EAGER = ("gemma2", "bloom")
"""Families transformers has no SDPA attention for: eager by default."""
NO_TP_PLAN = ("gpt2", "phi3", "falcon", "stablelm", "bloom")
"""Families with no tensor-parallel plan this engine runs: none in transformers (GPT-2, Falcon, StableLM, BLOOM), or
one of words it does not run (Phi-3's gathered colwise and split-input rowwise); at tp > 1 each is refused naming
`tp_plan`."""
REFUSED = ("bert", "roberta", "t5", "bart")
"""Encoders and encoder-decoders: not causal decoders."""


ON_HF_WARM_RANKS = "hf_warm_ranks"
"""The pytest-xdist group of the tests that train a Hugging Face model on 2 warm ranks (ON_WARM_RANKS, no project on
PYTHONPATH): one worker runs them all, so one warm job, its ranks having imported transformers once, serves every
such point instead of one job per worker (`make test` runs `--dist loadgroup`)."""


def write_config(name: str, directory: Path) -> Path:
    """The family's tiny config as its config class writes it (`to_json_file`), at directory/<name>.json."""
    path = directory / f"{name}.json"
    {**_configs(), **_refused()}[name]().to_json_file(path)
    return path


def palm_flops_per_token(module: Any, text: Any, seq_len: int) -> float:
    """PaLM's closed form, 6·N + 6·L·T·H·(d_qk + d_v) per token: N the matmul weights a token runs through (embedding
    lookups left out, the output head in; of a mixture of experts the router and the top-k of the experts, each
    expert tensor (experts, rows, cols)), the attention term not halved for causal masks."""
    from torch import nn

    head = module.get_output_embeddings().weight
    lookups = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)} - {id(head)}
    active = getattr(text, "num_experts_per_tok", None)
    n = 0.0
    for p in {id(p): p for p in module.parameters()}.values():
        if p.dim() >= 2 and id(p) not in lookups:
            n += p.numel() * (active / p.shape[0] if p.dim() == 3 else 1)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    d_qk = getattr(text, "qk_nope_head_dim", 0) + getattr(text, "qk_rope_head_dim", 0) or head_dim
    d_v = getattr(text, "v_head_dim", None) or head_dim
    return 6 * n + 6 * text.num_hidden_layers * seq_len * heads * (d_qk + d_v)
