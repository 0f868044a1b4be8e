"""A model the user brings (`_target_`): its FLOPs counted, its contract checked before any process, and the engine's
promises kept on it (every ZeRO stage trains the same as the dp/grad_acc split it replaces, recompute per block,
the traced prediction against the tracked peak)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from scaling.core.model_group import CustomModel
from scaling.core.schema import CONF_DIR, ExperimentConfig
from scaling.job.run import run_point
from scaling.model.custom import build as custom_model
from scaling.model.family import checked, family_of
from scaling.model.llama import flops
from scaling.model.llama.args import ModelArgs
from scaling.store.record import job_dir, job_key
from tests.helpers.compose import REPO, compose_point
from tests.helpers.hf_families import ON_HF_WARM_RANKS
from tests.helpers.points import CLIP, ON_WARM_RANKS


def preset(name: str) -> dict:
    return {
        k: v for k, v in yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text()).items() if k != "defaults"
    }


@pytest.mark.parametrize("name, seq_len", [("tiny", 64), ("small", 128), ("llama_1b", 2048), ("llama_8b", 4096)])
def test_flops_counted_on_fake_tensors_equal_the_closed_form_on_the_presets(name, seq_len):
    """The built-in decoder brought as a user's model (`_target_: scaling.model.llama.decoder.decoder`): FlopCounterMode's
    count of one forward and backward on fake tensors against the closed form the built-in family keeps."""
    fields = preset(name)
    model = CustomModel(
        name=name, target="scaling.model.llama.decoder.decoder", kwargs={k: v for k, v in fields.items() if k != "name"}
    )
    counted = family_of(model).counted(seq_len)
    closed = flops.flops_per_token(ModelArgs(**fields), seq_len)
    assert abs(counted.flops_per_token / closed - 1) <= 0.01, (counted.flops_per_token, closed)
    assert counted.uncounted_ops == () and counted.block == "Block" and counted.n_blocks == fields["n_layers"]


BROKEN = textwrap.dedent("""\
    import torch
    from torch import nn

    def raises(**kwargs):
        raise RuntimeError("no GPU budget for this model")

    def not_a_module(**kwargs):
        return 42

    class Flat(nn.Module):  # no repeated blocks
        def __init__(self, vocab_size, max_seq_len):
            super().__init__()
            self.emb, self.out = nn.Embedding(vocab_size, 8), nn.Linear(8, vocab_size)

        def forward(self, ids):
            return self.out(self.emb(ids))

    class Output:  # what a Hugging Face model returns: an object with .logits
        def __init__(self, logits):
            self.logits = logits

    class Wrapped(Flat):  # a valid model whose forward returns such an object
        def __init__(self, vocab_size, max_seq_len):
            super().__init__(vocab_size, max_seq_len)
            self.h = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def forward(self, ids):
            x = self.emb(ids)
            for layer in self.h:
                x = layer(x)
            return Output(self.out(x))

    class Scaled(Wrapped):  # a learnt 0-dim scale of its logits: FSDP2 shards no 0-dim parameter
        def __init__(self, vocab_size, max_seq_len):
            super().__init__(vocab_size, max_seq_len)
            self.logit_scale = nn.Parameter(torch.full((), 1.0))

        def forward(self, ids):
            return super().forward(ids).logits * self.logit_scale

    class Keyed(Wrapped):  # a valid model whose forward returns a dict of its logits
        def forward(self, ids):
            return {"logits": super().forward(ids).logits}

    class Scored(Wrapped):  # a dict without logits
        def forward(self, ids):
            return {"scores": super().forward(ids).logits}

    class Pooled(Flat):  # one vector per sequence, not logits per token
        def __init__(self, vocab_size, max_seq_len):
            super().__init__(vocab_size, max_seq_len)
            self.h = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def forward(self, ids):
            return self.out(self.emb(ids).mean(dim=1))
""")

SIZES = {"vocab_size": 64, "max_seq_len": 64}


@pytest.mark.parametrize(
    "model, expected",
    [
        ({"_target_": "nowhere.GPT", **SIZES}, "model._target_='nowhere.GPT' does not import: ModuleNotFoundError"),
        ({"_target_": "broken.raises", **SIZES}, "model._target_='broken.raises' raised RuntimeError: no GPU budget"),
        ({"_target_": "broken.not_a_module", **SIZES}, "returned int, not an nn.Module"),
        (
            {"_target_": "broken.Flat", **SIZES},
            "name the block class with blocks: my_pkg.models.Block in the model file, "
            "or +model.blocks=my_pkg.models.Block",
        ),
        (
            {"_target_": "broken.Scored", **SIZES},
            "its forward returned a dict, not logits: return the (B, T, vocab_size)",
        ),
        ({"_target_": "broken.Pooled", **SIZES}, "returned (2, 64); logits of shape (B, T, vocab_size) = (2, 32, 64)"),
        ({"_target_": "broken.Flat", "max_seq_len": 64}, "model.vocab_size is missing"),
        ({"_target_": "broken.Pooled", "blocks": "torch.nn.GELU", **SIZES}, "the model has no submodule of that class"),
    ],
    ids=["no-import", "raises", "not-a-module", "no-blocks", "not-logits", "wrong-shape", "no-vocab", "no-such-block"],
)
def test_a_model_that_breaks_the_contract_is_invalid_before_any_process(tmp_path, monkeypatch, model, expected):
    """Checked once in the driver on fake tensors: the record says `invalid` with the field and the value, and
    the point's directory holds nothing but it (no config.json: no rank was started)."""
    (tmp_path / "broken.py").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cfg = ExperimentConfig.from_dict({"model": {"name": "mine", **model}}).changed(
        train={"seq_len": 32, "mbs": 1}, logger={"name": "none"}
    )
    cfg.sweep_dir = str(tmp_path / "runs")
    record = run_point(cfg)
    assert record["status"] == "invalid" and expected in record["error"], record["error"]
    assert [p.name for p in job_dir(tmp_path / "runs", job_key(cfg)).iterdir()] == ["result.json"]


def test_only_a_module_of_ones_own_puts_the_working_directory_on_pythonpath(tmp_path, monkeypatch):
    """The processes a command starts import the user's module from where the command runs; scaling's own builder of
    Hugging Face models leaves the environment as it was (PYTHONPATH is part of what warm ranks share)."""
    from scaling.core.model_group import HF_TARGET

    (tmp_path / "mine.py").write_text("WIDTH = 64\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert callable(custom_model._import(HF_TARGET, "model._target_"))
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    assert custom_model._import("mine.WIDTH", "model._target_") == 64
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(tmp_path), "/elsewhere"])


def test_a_0_dim_parameter_at_zero_2_or_3_is_invalid_before_any_process_and_runs_below(tmp_path, monkeypatch):
    """FSDP2's fully_shard refuses 0-dim parameters: at ZeRO-3 the point is recorded `invalid` naming the parameter and
    the fix, no rank started (it was launched and failed on every rank); ZeRO-0 and 1 keep it whole."""
    (tmp_path / "broken.py").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    model = CustomModel(name="scaled", target="broken.Scaled", kwargs=SIZES)
    assert checked(model, 32, zero_stage=1).scalars == ("logit_scale",)
    cfg = ExperimentConfig.from_dict({"model": {"name": "scaled", "_target_": "broken.Scaled", **SIZES}}).changed(
        train={"seq_len": 32, "mbs": 1}, parallel={"dp": 2, "zero_stage": 3}, logger={"name": "none"}
    )
    cfg.sweep_dir = str(tmp_path / "runs")
    record = run_point(cfg)
    assert record["status"] == "invalid", record
    assert (
        "parallel.zero_stage=3: model 'scaled' has 0-dim parameters FSDP2's fully_shard cannot shard (logit_scale)"
        in (record["error"])
    )
    assert "make each 1-D (shape (1,)), or use parallel.zero_stage 0 or 1" in record["error"]
    assert [p.name for p in job_dir(tmp_path / "runs", job_key(cfg)).iterdir()] == ["result.json"]


@pytest.mark.parametrize("target", ["broken.Wrapped", "broken.Keyed"])
def test_a_forward_that_returns_an_object_or_a_dict_with_logits_keeps_the_contract(tmp_path, monkeypatch, target):
    (tmp_path / "broken.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    counted = family_of(CustomModel(name="wrapped", target=target, kwargs=SIZES)).counted(16)
    assert counted.block == "Linear" and counted.n_blocks == 2 + 1  # the two in its ModuleList, and its head
    assert counted.flops_per_token == 6 * (2 * 8 * 8 + 8 * 64)  # forward and backward of its matmuls


def test_a_model_file_without_a_target_is_the_built_in_family_and_a_stray_key_is_named():
    with pytest.raises(
        ValueError, match=r"model.n_layer is not a field of the built-in decoder \(model 'gpt'\).*_target_"
    ):
        ExperimentConfig.from_dict({"model": {"name": "gpt", "n_layer": 2}})


def test_a_misspelt_key_of_a_model_file_names_the_key_it_could_mean_or_the_files_keys(project):
    """A key the model file of one's own does not have: Hydra says only that it is not in struct; the refusal adds the
    key it could mean, else the file's keys and the override that adds one."""
    from scaling.sweep.compose import ComposeError, compose_config

    with pytest.raises(ComposeError, match=r"Key 'n_embdd' is not in struct \(did you mean 'n_embd'\?\)$"):
        compose_config(["model=gpt2_tiny", "model.n_embdd=32"])
    with pytest.raises(ComposeError) as refused:
        compose_config(["model=gpt2_tiny", "model.zzz=1"])
    assert str(refused.value).endswith(
        "(its keys: name, vocab_size, max_seq_len, n_layer, n_embd, n_head; +model.zzz=1 adds it)"
    ), refused.value


def test_two_user_models_of_one_name_never_share_a_key():
    one = ExperimentConfig.from_dict({"model": {"name": "gpt", "_target_": "gpt.GPT", **SIZES, "n_layer": 2}})
    other = ExperimentConfig.from_dict({"model": {"name": "gpt", "_target_": "gpt.GPT", **SIZES, "n_layer": 3}})
    assert job_key(one) != job_key(other)
    assert one.experiment()["model"] == {"name": "gpt", "_target_": "gpt.GPT", **SIZES, "n_layer": 2}
    assert ExperimentConfig.from_dict(one.to_dict()) == one  # what config.json carries to the ranks reads back equal


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b))


@pytest.mark.torchrun
def test_a_user_model_trains_the_same_at_every_zero_stage_and_split_and_is_predicted(warm_project, tmp_path):
    """gpt.py's GPT-2-style model (LayerNorm, learned positions, biases, untied head): dp=2 at ZeRO 0-3 against
    dp=1 x grad_acc=2, clipped; tp=2 by its own plan; bf16; recompute per block; train.compile; the traced prediction
    against the tracked peak."""
    from scaling.sweep.compose import compose_config

    # on warm ranks that wait for the next point (launch.reuse_idle_s): the rank of dp=1 for its points after dp=2's
    base = [
        "model=gpt2_tiny", "logger=none", "train.seq_len=32", "train.mbs=2", "train.warmup_steps=2", "train.steps=2",
        *ON_WARM_RANKS, CLIP, f"sweep_dir={tmp_path / 'runs'}",
    ]  # fmt: skip
    one = run_point(compose_config([*base, "parallel.dp=1", "train.grad_acc=2"]))
    assert one["status"] == "ok", one["error"]
    assert one["derived"]["flops_source"] == "counted" and one["derived"]["model"]["source"] == "gpt.GPT"
    assert one["derived"]["n_params"] == 182016 and one["metrics"]["mfu"] > 0
    for stage in (0, 1, 2, 3):
        two = run_point(compose_config([*base, "parallel.dp=2", "train.grad_acc=1", f"parallel.zero_stage={stage}"]))
        assert two["status"] == "ok", two["error"]
        l2, l1 = two["metrics"]["losses"], one["metrics"]["losses"]
        assert len(l2) == len(l1) == 4 and max(rel(a, b) for a, b in zip(l2, l1)) <= 1e-5, (stage, l2, l1)
        assert rel(two["metrics"]["final_param_norm"], one["metrics"]["final_param_norm"]) <= 1e-5, stage
        predicted, measured = two["predicted"]["peak_mem_bytes"], two["metrics"]["peak_mem_bytes"]
        assert two["predicted"]["method"] == "traced" and abs(predicted / measured - 1) <= 0.05, (
            stage,
            predicted,
            measured,
        )
    # tensor parallelism by the file's own plan (its MLPs: c_attn packs q, k and v side by side, so its attention
    # stays whole), on the warm ranks of dp=2: dp=1 × tp=2 trains what one rank does; a pattern that names no
    # submodule is refused before any process, naming it
    from scaling.core.validate import InvalidConfig
    from scaling.model.family import checked

    tp = [*base, "parallel.dp=1", "train.grad_acc=2", "parallel.zero_stage=3", "parallel.tp=2"]
    typo = compose_config([*tp, "+model.tp_plan={h.*.fc:colwise,h.*.fcout:rowwise}"])
    with pytest.raises(InvalidConfig, match=r"model.tp_plan: 'h.\*.fcout' matches no submodule of model 'gpt2_tiny'"):
        checked(typo.model, 32, tp=2)
    split = run_point(compose_config([*tp, "+model.tp_plan={h.*.fc:colwise,h.*.fc_out:rowwise}"]))
    assert split["status"] == "ok" and split["derived"]["world_size"] == 2, split["error"]
    assert max(rel(a, b) for a, b in zip(split["metrics"]["losses"], one["metrics"]["losses"])) <= 1e-5
    assert rel(split["metrics"]["final_param_norm"], one["metrics"]["final_param_norm"]) <= 1e-5
    # bf16 (the warm ranks of dp=2 again): the same training within bf16's rounding
    bf16 = run_point(compose_config([*base, "parallel.dp=2", "parallel.zero_stage=3", "train.precision=bf16"]))
    assert bf16["status"] == "ok", bf16["error"]
    assert max(rel(a, b) for a, b in zip(bf16["metrics"]["losses"], one["metrics"]["losses"])) <= 2e-2
    assert bf16["metrics"]["losses"] != one["metrics"]["losses"]  # it did run in bf16
    recomputed = run_point(compose_config([*base, "parallel.dp=1", "train.grad_acc=2", "train.recompute=full"]))
    assert recomputed["status"] == "ok", recomputed["error"]
    assert max(rel(a, b) for a, b in zip(recomputed["metrics"]["losses"], one["metrics"]["losses"])) <= 1e-5
    assert recomputed["derived"]["hw_flops_per_token"] > recomputed["derived"]["flops_per_token"]
    assert recomputed["metrics"]["peak_mem_bytes"] < one["metrics"]["peak_mem_bytes"]
    # train.compile (each block compiled by inductor, on the warm rank of dp=1), under selective recomputation (its
    # policy traced into the compiled block): the same training within float rounding, compiled once in the warm-up
    # (no recompile in the timed steps)
    compiled = run_point(
        compose_config([*base, "parallel.dp=1", "train.grad_acc=2", "train.compile=true", "train.recompute=selective"])
    )
    assert compiled["status"] == "ok", compiled["error"]
    assert compiled["env"]["compile"] is True and compiled["metrics"]["compile_s"] > 0
    assert compiled["metrics"]["recompiles_after_warmup"] == 0
    assert max(rel(a, b) for a, b in zip(compiled["metrics"]["losses"], one["metrics"]["losses"])) <= 1e-4


def test_a_plan_whose_first_step_would_fail_is_invalid_before_any_process(project):
    """gpt.py's attention reads its head count from the config and splits its fused qkv in three: split by column
    over tp=2 its first step fails. The pre-screen's trace of that step, on fake tensors in a fake world, fails the same
    way, so the point is `invalid`, naming the step's error and what a forward must do, and no rank starts."""
    from scaling.sweep.compose import compose_config

    cfg = compose_config([
        "model=gpt2_tiny", "logger=none", "train.seq_len=32", "parallel.tp=2", "parallel.zero_stage=3",
        "+model.tp_plan={h.*.qkv:colwise,h.*.proj:rowwise}", f"sweep_dir={project / 'runs'}",
    ])  # fmt: skip
    record = run_point(cfg)
    assert record["status"] == "invalid", record
    assert record["error"].startswith(
        "parallel.tp=2: the first training step of model 'gpt2_tiny' under its tensor-parallel plan fails (traced on "
        "fake tensors, as its ranks would run it): ValueError: not enough values to unpack (expected 3, got 2); "
    )
    assert [p.name for p in job_dir(project / "runs", job_key(cfg)).iterdir()] == ["result.json"]


def hf_point(model: str, sweep_dir: Path) -> dict:
    """A shipped Hugging Face model file's point at ZeRO-3 on 2 warm ranks (the worker's: ON_WARM_RANKS), seq 32, mbs 2,
    2 warm-up and 2 timed steps."""
    from scaling.sweep.compose import compose_config

    overrides = [
        f"model={model}", "logger=none", "train.seq_len=32", "train.mbs=2", "train.warmup_steps=2", "train.steps=2",
        *ON_WARM_RANKS, "parallel.dp=2", "parallel.zero_stage=3", f"sweep_dir={sweep_dir}",
    ]  # fmt: skip
    return run_point(compose_config(overrides))


@pytest.mark.torchrun
@pytest.mark.xdist_group(ON_HF_WARM_RANKS)
def test_a_hugging_face_llama_from_its_config_trains_at_zero_3_and_is_counted_and_predicted(tmp_path):
    """conf/model/hf_llama_tiny.yaml (`hf_config:`, transformers, no weights): the tiny model's shapes, so its counted
    FLOPs are the built-in tiny's closed form; trained at ZeRO-3 on 2 ranks, its losses on random tokens at
    ln(vocab_size) (finite: materialised from meta, its rotary tables were filled by its init); its memory traced."""
    record = hf_point("hf_llama_tiny", tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["config"]["model"]["config"] == "model/hf_llama_tiny.json"
    assert record["derived"]["n_params"] == 164160 and record["derived"]["model"]["block"] == "LlamaDecoderLayer"
    assert record["derived"]["flops_per_token"] == flops.flops_per_token(ModelArgs(**preset("tiny")), 32)
    losses = record["metrics"]["losses"]
    assert len(losses) == 4 and all(abs(loss - math.log(512)) < 0.05 for loss in losses), losses  # random tokens
    predicted, measured = record["predicted"]["peak_mem_bytes"], record["metrics"]["peak_mem_bytes"]
    assert record["predicted"]["method"] == "traced" and abs(predicted / measured - 1) <= 0.05, (predicted, measured)


LOADS_ALL_A_BUILD_IMPORTS = """
import gc, json, sys
gc.disable()  # what is imported is the question, not how fast
from scaling.core.schema import ExperimentConfig
from scaling.model.family import family_of
new = {}
for name in sys.argv[1:]:
    family = family_of(ExperimentConfig.from_dict({"model": {"name": name, "hf_config": f"model/{name}.json"}}).model)
    family.load_code()
    before = set(sys.modules)
    family.build("meta")
    new[name] = sorted(set(sys.modules) - before)
print(json.dumps(new))
"""


@pytest.mark.subprocess
def test_a_rank_imports_a_models_code_before_its_memory_baseline_so_no_import_is_counted_as_building():
    """What a rank imports before its resident-memory baseline (the family's `load_code`, beside the ZeRO wrappers)
    is everything the model's build imports: building it afterwards imports no module, in a fresh interpreter.
    Imported during the build instead, transformers' modeling modules were in the record's `build_peak_mem_bytes`
    (97 MB for the 164k-parameter hf_llama_tiny on CPU, 15 MB with them imported first)."""
    models = ["hf_llama_tiny", "hf_mixtral_tiny"]
    out = subprocess.run(
        [sys.executable, "-c", LOADS_ALL_A_BUILD_IMPORTS, *models],
        cwd=REPO,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {name: [] for name in models}


@pytest.mark.torchrun
@pytest.mark.xdist_group(ON_HF_WARM_RANKS)
def test_a_hugging_face_mixture_of_experts_trains_at_zero_3_counted_by_its_active_experts(tmp_path):
    """conf/model/hf_mixtral_tiny.yaml: Mixtral's shape, 4 experts of which 2 run per token. Its blocks are the one
    class its `_no_split_modules` names; its FLOPs counted on fake tensors are those of the experts a token runs (not
    all four, not none); trained at ZeRO-3 on 2 ranks, it learns nothing of random tokens (losses at ln(vocab)); its
    memory traced within 5% of the tracked peak."""
    record = hf_point("hf_mixtral_tiny", tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["derived"]["model"]["block"] == "MixtralDecoderLayer" and record["derived"]["model"]["n_blocks"] == 2
    h, kv, f, experts, active, layers, vocab, seq = 64, 32, 128, 4, 2, 2, 512, 32
    per_layer = (2 * h * h + 2 * h * kv) + h * experts + active * 3 * h * f  # attention, router, the chosen experts
    forward = 2 * (layers * per_layer + h * vocab) + 4 * layers * h * seq  # matmuls, then QK^T and A.V
    assert record["derived"]["flops_per_token"] == 3 * forward, (record["derived"]["flops_per_token"], 3 * forward)
    assert record["derived"]["uncounted_ops"] == []
    losses = record["metrics"]["losses"]
    assert len(losses) == 4 and all(abs(loss - math.log(vocab)) < 0.05 for loss in losses), losses
    predicted, measured = record["predicted"]["peak_mem_bytes"], record["metrics"]["peak_mem_bytes"]
    assert record["predicted"]["method"] == "traced" and abs(predicted / measured - 1) <= 0.05, (predicted, measured)


def test_a_hugging_face_model_without_the_extra_is_invalid_and_says_what_to_install(tmp_path, monkeypatch):
    """Without transformers (the `[hf]` extra) a model made from a Hugging Face config is `invalid` before any
    process, with the file it names and the install command; nothing else of the point is written."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    cfg = ExperimentConfig.from_dict(
        {"model": {"name": "hf_without_extra", "hf_config": "model/hf_llama_tiny.json", "num_hidden_layers": 3}}
    ).changed(train={"seq_len": 32, "mbs": 1}, logger={"name": "none"})
    cfg.sweep_dir = str(tmp_path / "runs")
    record = run_point(cfg)
    assert record["status"] == "invalid", record
    assert "model.hf_config='model/hf_llama_tiny.json' needs transformers: pip install 'scaling[hf]'" in record["error"]
    assert [p.name for p in job_dir(tmp_path / "runs", job_key(cfg)).iterdir()] == ["result.json"]


@pytest.mark.slow  # about 10 s of traces
def test_find_mbs_takes_a_model_of_ones_own_and_answers_what_its_trace_says(capsys):
    """`scaling find-mbs` on a Hugging Face model (no analytic form): the traced predictor settles the largest mbs;
    the trace of that mbs fits the capacity and the next one's does not."""
    from scaling.cli.find_mbs import main as find_mbs_main
    from scaling.predictor.prescreen import capacity_bytes
    from scaling.predictor.trace import trace_peak
    from scaling.sweep.compose import compose_config

    point = ["model=hf_llama_tiny", "train.seq_len=64", "hardware.memory_gb=0.01", "logger=none"]
    assert find_mbs_main(["--no-confirm", "--json", "--max-mbs=16", *point]) == 0
    out = capsys.readouterr().out
    found = json.loads(out[out.index("{") :])
    assert found["predicted_mbs"] == found["mbs"] and found["method"] == "traced", found

    def peak(mbs: int) -> int:
        return trace_peak(compose_config([*point, f"train.mbs={mbs}"])).peak_mem_bytes

    capacity = capacity_bytes(compose_config(point).hardware)
    assert found["mbs"] >= 2 and peak(found["mbs"]) <= capacity < peak(found["mbs"] + 1), found


def test_recompute_every_past_the_blocks_of_a_model_one_brings_is_invalid_before_any_process(tmp_path):
    """A model one brings has its blocks known once counted (on fake tensors, in the driver): recompute_every above
    them is refused there, naming the field and the valid values, before any rank starts."""
    overrides = ["model=hf_llama_tiny", "logger=none", "train.seq_len=32", "train.recompute=selective"]
    cfg = compose_point([*overrides, "train.recompute_every=3"], tmp_path / "runs")
    record = run_point(cfg)
    assert record["status"] == "invalid", record["error"]
    assert "train.recompute_every=3 exceeds the model's 2 blocks" in record["error"], record["error"]
    assert "try recompute_every in {1, ..., 2}" in record["error"]
    assert [p.name for p in job_dir(tmp_path / "runs", job_key(cfg)).iterdir()] == ["result.json"]


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_config_that_names_its_weights_dtype_still_trains_fp32_parameters(tmp_path, key):
    """A downloaded config.json names the dtype its weights were saved in (`"torch_dtype": "bfloat16"`, newer ones
    `"dtype"`). transformers built the model in it, so the engine kept bf16 parameters and optimizer states under
    train.precision=fp32 and bf16 alike (no fp32 master weights: the traced peak of Qwen2.5-1.5B's optimizer states
    was half): the model is built in float32 whatever the file says, and traced as the same file without the key."""
    from scaling.predictor.trace import trace_peak

    plain = json.loads((CONF_DIR / "model" / "hf_llama_tiny.json").read_text())
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    (tmp_path / "saved_bf16.json").write_text(json.dumps({**plain, key: "bfloat16"}))
    points = {
        name: ExperimentConfig.from_dict(
            {"model": {"name": name, "hf_config": str(tmp_path / f"{name}.json")}}
        ).changed(train={"seq_len": 32, "mbs": 2, "precision": "bf16"}, logger={"name": "none"})
        for name in ("plain", "saved_bf16")
    }
    model = family_of(points["saved_bf16"].model).build("meta")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert trace_peak(points["saved_bf16"]).peak_mem_bytes == trace_peak(points["plain"]).peak_mem_bytes


def test_a_relative_hf_config_is_found_in_the_projects_conf_as_in_the_shipped_one(tmp_path, monkeypatch):
    """A project's conf/model/mine.yaml naming `hf_config: model/mine.json`, as the shipped files name theirs: it
    was looked for in the working directory and the shipped conf/ only ("No such file or directory"); a file found
    nowhere names where it was looked for."""
    from scaling.core.model_group import ModelError, hf_config_path
    from scaling.model.hf.config import read_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf" / "model").mkdir(parents=True)
    shipped = json.loads((CONF_DIR / "model" / "hf_llama_tiny.json").read_text())
    (tmp_path / "conf" / "model" / "mine.json").write_text(json.dumps(shipped))
    assert hf_config_path("model/mine.json") == (tmp_path / "conf" / "model" / "mine.json").resolve()
    assert read_config("model/mine.json").text.num_hidden_layers == shipped["num_hidden_layers"]
    assert hf_config_path("model/hf_llama_tiny.json") == CONF_DIR / "model" / "hf_llama_tiny.json"  # still found
    with pytest.raises(ModelError, match=r"model.hf_config='model/nope.json': no such file in .*, .*conf, .*looked"):
        read_config("model/nope.json")
