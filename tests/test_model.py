"""The decoder: closed-form parameter counts against the modules, shapes, seeded init, recompute, causality."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import yaml
from torch.distributed.fsdp import fully_shard

from scaling.model.llama.args import ModelArgs, matmul_param_count, param_count, param_shapes
from scaling.model.llama.decoder import Transformer

MODEL_CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
PRESETS = sorted(p.stem for p in MODEL_CONF.glob("*.yaml"))
PUBLISHED_PARAMS = {
    "llama_1b": 1.24e9,
    "llama_3b": 3.21e9,
    "llama_8b": 8.03e9,
    "llama_70b": 70.6e9,
    "llama2_7b": 6.74e9,
    "llama2_13b": 13.0e9,
    "llama2_70b": 69.0e9,
}


def preset(name: str) -> ModelArgs:
    return ModelArgs.from_dict(yaml.safe_load((MODEL_CONF / f"{name}.yaml").read_text()))


def meta_model(args: ModelArgs) -> Transformer:
    with torch.device("meta"):
        return Transformer(args)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    model = Transformer(ModelArgs(**{**vars(preset("tiny")), **overrides}))
    model.init_weights(seed)
    return model


def test_presets_are_found():
    assert {"tiny", "small", *PUBLISHED_PARAMS} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_param_count_matches_modules(name):
    args = preset(name)
    model = meta_model(args)
    assert param_count(args) == sum(p.numel() for p in model.parameters())
    # Every nn.Linear takes part in a matmul, the tied output projection included.
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert matmul_param_count(args) == linear_weights


def test_a_head_width_other_than_hidden_over_heads_widens_the_q_and_o_projections():
    """Gemma's and Qwen3's small models: head_dim times the heads is not the width. The q and o projections are
    nh·hd wide, and the closed-form counts and shapes follow the modules, in `parameters()` order."""
    args = ModelArgs(**{**vars(preset("tiny")), "head_dim": 32})
    model = meta_model(args)
    assert (args.hd, args.q_dim, model.layers[0].attention.wq.weight.shape) == (32, 128, (128, 64))
    assert param_count(args) == sum(p.numel() for p in model.parameters())
    shapes = [(rows, cols) for _, _, rows, cols in param_shapes(args)]
    assert shapes == [(p.shape[0], p[0].numel() if p.dim() > 1 else 1) for p in model.parameters()]
    logits = tiny_model(head_dim=32)(torch.zeros(1, 8, dtype=torch.long))
    assert logits.shape == (1, 8, args.vocab_size)


def test_a_head_dim_of_hidden_over_heads_is_the_default_model_under_one_job_key():
    """model.head_dim=16 on tiny (64 wide, 4 heads) is tiny: one form, one key, so a re-run skips it; 32 is another."""
    from scaling.core.schema import ExperimentConfig
    from scaling.store.record import job_key

    def key(**model):
        return job_key(ExperimentConfig.from_dict({"model": {**vars(preset("tiny")), **model}}))

    assert key(head_dim=16) == key() != key(head_dim=32)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_count_matches_published_sizes(name):
    assert param_count(preset(name)) == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


def test_tied_embeddings_are_one_parameter_after_to_empty():
    model = meta_model(ModelArgs(**{**vars(preset("tiny")), "tie_embeddings": True}))
    model.to_empty(device="cpu")
    assert model.output.weight is model.tok_embeddings.weight
    untied = meta_model(preset("tiny")).to_empty(device="cpu")
    assert untied.output.weight is not untied.tok_embeddings.weight


def test_from_dict_ignores_unknown_keys():
    args = ModelArgs.from_dict({**vars(preset("small")), "_target_": "x", "comment": 1})
    assert (args.name, args.hidden, args.hd) == ("small", 128, 16)


def test_forward_gives_logits_per_position():
    model = tiny_model()
    tokens = torch.randint(0, model.args.vocab_size, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, model.args.vocab_size)
    assert torch.isfinite(logits).all()


def test_same_seed_same_weights_and_logits_on_any_build_path():
    eager = tiny_model(seed=7)
    from_meta = meta_model(eager.args).to_empty(device="cpu")
    from_meta.init_weights(7)
    for (name, a), (_, b) in zip(eager.named_parameters(), from_meta.named_parameters()):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, eager.args.vocab_size, (2, 16))
    assert torch.equal(eager(tokens), from_meta(tokens))
    other = tiny_model(seed=8)
    assert not torch.equal(other.layers[0].attention.wq.weight, eager.layers[0].attention.wq.weight)


def test_init_statistics():
    model = tiny_model(seed=0, n_layers=8, hidden=256, n_heads=8, ffn_hidden=512)
    assert torch.equal(model.norm.weight, torch.ones(256))
    assert torch.equal(model.layers[3].ffn_norm.weight, torch.ones(256))
    assert model.layers[0].attention.wq.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.layers[0].feed_forward.w2.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)


def test_init_on_meta_is_refused():
    with pytest.raises(ValueError, match="to_empty"):
        meta_model(preset("tiny")).init_weights(0)


def loss_and_grads(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("recompute, every", [("full", 1), ("selective", 1), ("selective", 2), ("full", 2)])
def test_recompute_gives_same_loss_and_gradients(recompute, every):
    model = tiny_model(seed=1)
    tokens = torch.randint(0, model.args.vocab_size, (2, 33), generator=torch.Generator().manual_seed(0))
    loss, grads = loss_and_grads(model, tokens)
    model.set_recompute(recompute, every)
    assert [layer.recompute for layer in model.layers][every - 1 :: every] == [recompute] * (len(model.layers) // every)
    loss_rc, grads_rc = loss_and_grads(model, tokens)
    assert torch.allclose(loss, loss_rc)
    for name, grad in grads.items():
        assert torch.allclose(grad, grads_rc[name], rtol=1e-5, atol=1e-7), name


def test_changing_a_later_token_leaves_earlier_logits_unchanged():
    model = tiny_model(seed=2)
    tokens = torch.randint(0, model.args.vocab_size, (2, 24))
    changed = tokens.clone()
    changed[:, 15] = (changed[:, 15] + 1) % model.args.vocab_size
    before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :15], after[:, :15], atol=1e-6)
    assert not torch.allclose(before[:, 15:], after[:, 15:], atol=1e-3)


def _sharded_init_rank(rank: int, world_size: int, store_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    try:
        # An odd vocabulary makes FSDP2's dim-0 shards uneven; tied weights share one sharded parameter.
        args = ModelArgs(**{**vars(preset("tiny")), "vocab_size": 513, "tie_embeddings": True})
        model = meta_model(args)
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        model.to_empty(device="cpu")
        model.init_weights(3)
        reference = Transformer(args)
        reference.init_weights(3)
        for (name, p), (_, ref) in zip(model.named_parameters(), reference.named_parameters()):
            assert torch.equal(p.full_tensor(), ref), name
        tokens = torch.randint(0, args.vocab_size, (2, 8), generator=torch.Generator().manual_seed(rank))
        assert torch.allclose(model(tokens), reference(tokens), atol=1e-6)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_sharded_init_equals_unsharded_init():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_sharded_init_rank, args=(2, str(Path(tmp) / "store")), nprocs=2)
