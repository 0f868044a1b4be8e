"""Hugging Face configs of the families people train, as transformers' own config classes write them
(tests/helpers/hf_families.py): each causal decoder built on fake tensors, its contract and initialisation checked
and its FLOPs counted to PaLM's closed form; encoders and encoder-decoders refused before any process; GPT-2 (its
`n_positions`, tied) and Gemma2 (no SDPA: eager; sliding window) trained at ZeRO-3. The per-family table of training
at ZeRO-3 is benchmarks/bench_hf_families.py's."""

from __future__ import annotations

import math

import pytest

from scaling.core.model_group import ModelError
from scaling.core.schema import ExperimentConfig
from scaling.core.validate import InvalidConfig, validate
from scaling.job.run import run_point
from scaling.model.custom.build import build
from scaling.model.family import checked, family_of
from scaling.model.hf.config import LAYERS_KEY, read_config
from scaling.predictor.trace import trace_peak
from scaling.store.record import job_dir, job_key
from tests.helpers import hf_families as families
from tests.helpers.points import ON_WARM_RANKS


def config_of(name: str, directory) -> ExperimentConfig:
    """A point of the family's config file, named by nothing but its path (no key added by hand)."""
    path = families.write_config(name, directory)
    return ExperimentConfig.from_dict({"model": {"name": name, "hf_config": str(path)}}).changed(
        train={"seq_len": 32, "mbs": 2}, logger={"name": "none"}
    )


@pytest.mark.slow  # 20 models built and counted on fake tensors: a few seconds
def test_every_family_is_counted_and_checked_or_refused_on_fake_tensors(tmp_path):
    """20 causal decoders (3 mixtures of experts, 8 tied, 5 with sliding windows, a composite vision-language config
    whose text decoder is taken): the contract holds, init_weights() writes every tensor, the counted FLOPs equal
    PaLM's closed form, n_params counts a tied weight once. The encoders and encoder-decoders are refused, naming
    the file and why."""
    assert len(families.CAUSAL) >= 12 and families.MOE and families.TIED and families.SLIDING
    for name in families.CAUSAL:
        model = config_of(name, tmp_path).model
        counted = family_of(model).counted(32)
        module, text = build(model, "meta"), read_config(**model.kwargs).text
        closed = families.palm_flops_per_token(module, text, 32)
        assert abs(counted.flops_per_token / closed - 1) <= 0.02, (name, counted.flops_per_token, closed)
        assert counted.init == "init_weights" and counted.uncounted_ops == (), (name, counted)
        assert counted.attention == ("eager" if name in families.EAGER else "sdpa"), (name, counted.attention)
        every = sum(p.numel() for _, p in module.named_parameters(remove_duplicate=False))
        assert (counted.n_params < every) == (name in families.TIED), (name, counted.n_params, every)
        assert bool(getattr(text, "sliding_window", None)) == (name in families.SLIDING), name
    for name in families.REFUSED:
        with pytest.raises(ModelError, match=rf"model.hf_config='.*{name}.json' \({name}\) is not a causal decoder: "):
            family_of(config_of(name, tmp_path).model).counted(32)


@pytest.mark.slow  # 15 training steps traced at tp=2 in a fake world: about a second each
def test_every_family_at_tp_2_is_traced_under_its_plan_or_refused_before_launch(tmp_path):
    """At tp=2 every family's plan (transformers' own, under its causal LM's base model: `gpt_neox.layers.*`, not
    `model.layers.*`) is checked against the model built on meta, and its training step traced in a fake world of 2
    ranks, where a plan that fails the first step fails; a family with no plan this engine runs is refused naming
    `tp_plan`. Falcon's MLP-only plan runs (its in-place add to the MLP's output), and a misspelt or misplaced pattern
    is refused in one line naming what it could mean."""
    for name in families.CAUSAL:
        cfg = config_of(name, tmp_path).changed(parallel={"tp": 2, "zero_stage": 3})
        if name in families.NO_TP_PLAN:
            refused = r"tensor-parallel plan.*: give its file a tp_plan"
            if name == "phi3":  # its plan is fused pairs only: nothing a plan of one's own could split rightly
                refused = r"in a pair around a fused projection whose output its forward splits apart .*tp=1"
            with pytest.raises(InvalidConfig, match=refused):
                checked(cfg.model, 32, tp=2)
            continue
        checked(cfg.model, 32, tp=2)
        assert trace_peak(cfg).peak_mem_bytes > 0, name
    # Phi-3's fused gate_up_proj split by rows would give one rank the gate and the other the up, every shape lining
    # up, and train another model (it did, recorded ok): a plan of one's own that splits it is refused
    phi3 = config_of("phi3", tmp_path).changed(parallel={"tp": 2, "zero_stage": 3})
    phi3.model.tp_plan = {"model.layers.*.mlp.gate_up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise"}
    with pytest.raises(InvalidConfig, match=r"model.tp_plan: 'model.layers.\*.mlp.gate_up_proj' \(colwise\) splits "
                       r"model.layers.\*.mlp.gate_up_proj, which transformers' own plan .* keeps whole between a pair "
                       r"\(colwise_gather_output\)"):  # fmt: skip
        checked(phi3.model, 32, tp=2)
    mlp = {"transformer.h.*.mlp.dense_h_to_4h": "colwise", "transformer.h.*.mlp.dense_4h_to_h": "rowwise"}
    falcon = config_of("falcon", tmp_path).changed(parallel={"tp": 2, "zero_stage": 3})
    falcon.model.tp_plan = mlp
    checked(falcon.model, 32, tp=2)
    assert trace_peak(falcon).peak_mem_bytes > 0
    falcon.model.tp_plan = {**mlp, "transformer.h.*.mlp.dense_4h_h": "rowwise"}
    with pytest.raises(InvalidConfig, match=r"'transformer.h.\*.mlp.dense_4h_h' matches no submodule of model 'falcon'; "
                       r"it could mean transformer.h.\*.mlp.dense_4h_to_h"):  # fmt: skip
        checked(falcon.model, 32, tp=2)
    falcon.model.tp_plan = {"transformer.h.*.mlp": "colwise"}
    with pytest.raises(
        InvalidConfig, match=r"colwise splits Linear modules only, and transformer.h.0.mlp is a FalconMLP"
    ):
        checked(falcon.model, 32, tp=2)


@pytest.mark.slow  # the two families' modules imported, three traces each
def test_a_config_that_lists_its_blocks_kinds_is_cut_and_calibrated_with_them(tmp_path):
    """transformers writes each block's kind into Qwen3's and Gemma's files (`layer_types`) and refuses a count of
    blocks it does not match: a count given in the model file takes the file's kinds cut or repeated to it, so the
    calibration's cuts to 1 and 2 blocks are made, and its figure is the whole model's trace (they were refused).
    Gemma 2's is calibrated at 4 blocks, its kinds repeated, in the next test."""
    from scaling.predictor.calibrated import predicted_peak

    for name in ("qwen3", "gemma2"):
        cfg = config_of(name, tmp_path)
        kinds = read_config(**cfg.model.kwargs).text.layer_types
        assert len(kinds) == families.L == 2, kinds
        assert read_config(**{**cfg.model.kwargs, LAYERS_KEY: 1}).text.layer_types == kinds[:1]
        assert read_config(**{**cfg.model.kwargs, LAYERS_KEY: 3}).text.layer_types == [*kinds, kinds[0]]
    calibrated, traced = predicted_peak(cfg := config_of("qwen3", tmp_path), 1), trace_peak(cfg).peak_mem_bytes
    assert abs(calibrated / traced - 1) <= 0.01, (calibrated, traced)


@pytest.mark.slow  # Gemma 2's modules imported, three traces
def test_heads_wider_than_hidden_over_heads_are_the_built_in_head_dim_calibrated_by_cuts(tmp_path):
    """Gemma 2's and Qwen3-4B's heads are not hidden / heads wide (Gemma-2-9B: 16 of 256 in 3584). The config is
    described by the built-in shapes with that head_dim, so a point is calibrated on cuts of 1 and 2 blocks
    instead of traced whole (15-30 s a point at 42 blocks): its figure at 4 blocks (the file's 2 kinds of block
    repeated) is the whole model's trace."""
    import json

    from scaling.predictor.calibrated import builtin_of, predicted_peak, predictor_name

    path = families.write_config("gemma2", tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), "head_dim": 2 * families.H // families.HEADS}))
    cfg = ExperimentConfig.from_dict({"model": {"name": "wide", "hf_config": str(path), LAYERS_KEY: 4}})
    cfg = cfg.changed(train={"seq_len": 32, "mbs": 2}, logger={"name": "none"})
    model = builtin_of(cfg)
    assert model is not None and (model.head_dim, model.q_dim, model.n_layers) == (32, 128, 4), model
    assert predictor_name(cfg) == "analytic, calibrated by traces"
    calibrated, traced = predicted_peak(cfg, 1), trace_peak(cfg).peak_mem_bytes
    assert abs(calibrated / traced - 1) <= 0.01, (calibrated, traced)


def test_a_key_nothing_reads_is_refused_naming_the_field_it_could_mean(tmp_path):
    """A misspelt key of a config file, of its composite part or of the model file's overrides is refused before
    anything runs (transformers would build the default width); a key Qwen3-MoE's modeling code reads without its
    config class declaring it (`head_dim`) and an older name transformers converts (`rope_theta`) are not."""
    import json

    path = families.write_config("llama", tmp_path)
    fields = json.loads(path.read_text())
    fields["intermediate_sise"] = fields.pop("intermediate_size")
    path.write_text(json.dumps({**fields, "rope_theta": 10000.0}))
    with pytest.raises(
        ModelError, match=r"'intermediate_sise' \(did you mean 'intermediate_size'\?\) is not a field of "
    ):
        read_config(str(path))
    with pytest.raises(ModelError, match=r"model file's keys over .*: 'n_layer' is not a field of LlamaConfig"):
        read_config(str(families.write_config("llama", tmp_path)), n_layer=1)
    composite = families.write_config("gemma3", tmp_path)
    fields = json.loads(composite.read_text())
    fields["text_config"]["hiden_size"] = fields["text_config"]["hidden_size"]
    composite.write_text(json.dumps(fields))
    with pytest.raises(ModelError, match=r"\(gemma3\) text_config: 'hiden_size' \(did you mean 'hidden_size'\?\)"):
        read_config(str(composite))
    assert read_config(str(families.write_config("qwen3_moe", tmp_path))).text.head_dim == 16


def test_a_latent_attention_with_fewer_kv_heads_is_refused_naming_the_field(tmp_path):
    """DeepSeek-V3's multi-head latent attention makes a key and a value per head; with num_key_value_heads below
    num_attention_heads transformers repeats them onto more heads than the queries have (eager attention fails on
    the shapes): refused before anything runs, naming the field and the value to set."""
    import json

    path = families.write_config("deepseek_v3", tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_key_value_heads": families.KV}))
    with pytest.raises(ModelError, match=rf"has num_key_value_heads={families.KV} and num_attention_heads="
                       rf"{families.HEADS}: .* set num_key_value_heads={families.HEADS}$"):  # fmt: skip
        read_config(str(path))


def test_on_fake_tensors_attention_runs_as_on_real_ones_unmasked_and_grouped(tmp_path, monkeypatch):
    """The engine's positions are never packed: on real tensors transformers finds so and runs SDPA with is_causal,
    no mask and its key/value heads as they are; on fake tensors (the count, the trace) it cannot read them, and
    without scaling.model.hf.causal_lm.masks_as_on_real_tensors it built a (T, T) mask and repeated each key and value
    head for its query heads, which the traced step held and the real one does not."""
    import torch
    from transformers.integrations import sdpa_attention

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def seen(q, k, v, attn_mask=None, **kwargs):
        calls.append((attn_mask is None, k.shape[1], kwargs.get("is_causal")))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(sdpa_attention.torch.nn.functional, "scaled_dot_product_attention", seen)
    cfg = config_of("llama", tmp_path).changed(parallel={"dp": 2, "zero_stage": 3})
    family_of(cfg.model).counted(32)
    trace_peak(cfg)
    assert calls and set(calls) == {(True, families.KV, True)}, calls


def test_gpt2s_own_config_needs_no_key_and_its_n_positions_bounds_the_sequence(tmp_path):
    """GPT-2's config names its longest sequence `n_positions`: read through transformers, the point validates and is
    counted with nothing added by hand, and a longer train.seq_len is refused naming that key and the file."""
    cfg = config_of("gpt2", tmp_path)
    assert cfg.model.max_seq_len is None and validate(cfg).world_size == 1
    assert family_of(cfg.model).counted(32).n_params == 124672
    with pytest.raises(ModelError, match=r"train.seq_len=256 exceeds n_positions of model.hf_config='.*gpt2.json'=128"):
        family_of(cfg.model).counted(256)


def test_an_encoder_is_recorded_invalid_before_any_rank_starts(tmp_path):
    cfg = config_of("bert", tmp_path)
    cfg.sweep_dir = str(tmp_path / "runs")
    record = run_point(cfg)
    assert record["status"] == "invalid" and "(bert) is not a causal decoder: BertLMHeadModel's" in record["error"]
    assert [p.name for p in job_dir(tmp_path / "runs", job_key(cfg)).iterdir()] == ["result.json"]


@pytest.mark.torchrun
@pytest.mark.xdist_group(families.ON_HF_WARM_RANKS)
@pytest.mark.parametrize("name", ["gpt2", "gemma2"])
def test_gpt2_and_gemma2_from_their_config_classes_train_at_zero_3(tmp_path, name):
    """GPT-2 from `GPT2Config(...).to_json_file` (tied, `n_positions`) and Gemma2 (no SDPA in transformers: eager,
    said in derived.model.attention; sliding window) at ZeRO-3 on 2 warm ranks: ok, their first loss on random tokens
    at ln(vocab), their traced memory within 5% of the tracked peak."""
    cfg = config_of(name, tmp_path).changed(
        train={"warmup_steps": 2, "steps": 2},
        parallel={"dp": 2, "zero_stage": 3},
        launch={"timeout_s": 180, "reuse": True, "reuse_idle_s": 600},  # ON_WARM_RANKS
    )
    assert ON_WARM_RANKS[0] == "launch.timeout_s=180"
    cfg.sweep_dir = str(tmp_path / "runs")
    record = run_point(cfg)
    assert record["status"] == "ok", record["error"]
    assert record["derived"]["model"]["attention"] == ("eager" if name == "gemma2" else "sdpa")
    assert abs(record["metrics"]["losses"][0] / math.log(families.V) - 1) <= 0.02, record["metrics"]["losses"]
    predicted, measured = record["predicted"]["peak_mem_bytes"], record["metrics"]["peak_mem_bytes"]
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


@pytest.mark.torchrun
@pytest.mark.xdist_group(families.ON_HF_WARM_RANKS)
def test_qwen3_at_tp_2_trains_what_dp_2_does_its_per_head_norms_gradients_summed(tmp_path):
    """Qwen3's q_norm and k_norm normalise each head's width and see only this rank's heads at tp=2: transformers'
    plan keeps them whole with their gradients summed over the tp ranks (replicated_with_grad_allreduce), and so
    does the engine, as each gradient arrives. dp=1 x tp=2 x grad_acc=2, its gradients accumulated over both
    micro-steps before FSDP2 reduces them, trains the weights dp=2 does (left whole, each rank's norms drift: the
    final parameter norm 1e-4 off), on the same 2 warm ranks."""
    base = config_of("qwen3", tmp_path).changed(
        train={"warmup_steps": 2, "steps": 2}, launch={"timeout_s": 180, "reuse": True, "reuse_idle_s": 600}
    )
    records = []
    tp2 = {"dp": 1, "tp": 2, "zero_stage": 3, "fsdp_grad_reduce": "last_micro_step"}  # accumulated, summed once
    for parallel, grad_acc in (({"dp": 2, "zero_stage": 3}, 1), (tp2, 2)):
        cfg = base.changed(parallel=parallel, train={"grad_acc": grad_acc})
        cfg.sweep_dir = str(tmp_path / "runs")
        records.append(run_point(cfg))
        assert records[-1]["status"] == "ok", records[-1]["error"]
    dp2, tp2 = (r["metrics"]["final_param_norm"] for r in records)
    assert abs(tp2 / dp2 - 1) <= 1e-6, (tp2, dp2)
