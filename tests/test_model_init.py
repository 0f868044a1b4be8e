"""Real models through the engine: every parameter and buffer written by initialisation (a model's own `__init__`
honoured, anything left unwritten refused before any rank starts, and by the ranks), ties kept across
materialisation, the contract checked on what training feeds, a non-finite loss never `ok`, and an edited model
measured again under its old job key. The model that shows most of it is tests/own_project/nanogpt_style.py, a GPT
in nanoGPT's style behind the 10-line adapter nano.py (docs/own-project.md)."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest
import torch

from scaling.core.model_group import CustomModel, ModelError
from scaling.core.schema import ExperimentConfig
from scaling.engine.data import GlobalBatch, step_batches, to_device
from scaling.job.run import run_point
from scaling.model.custom import build as custom_model
from scaling.model.custom.count import CONTRACT_BATCH
from scaling.model.family import family_of
from scaling.store.record import job_dir, job_key
from tests.helpers.compose import REPO
from tests.helpers.own_project import PROJECT
from tests.helpers.points import ON_WARM_RANKS

NANO = {"vocab_size": 512, "max_seq_len": 256, "n_layer": 2, "n_head": 4, "n_embd": 64}
"""conf/model/nanogpt_tiny.yaml's arguments."""


def nano() -> CustomModel:
    return CustomModel(name="nanogpt_tiny", target="nano.NanoGPT", kwargs=dict(NANO))


def test_the_models_own_init_is_honoured_and_its_ties_kept_after_materialisation(project):
    """Built on meta, the nanoGPT-style model's `__init__` init (N(0, 0.02), scaled projections, its own LayerNorm's
    ones) and its tie are lost; after the engine's materialise and initialise the module holds exactly what a real
    build on the CPU from the same seed holds, with the embedding and the head one parameter again."""
    family = family_of(nano())
    module = family.build("meta")
    family.materialise(module, torch.device("cpu"))
    assert module.wte.weight is module.lm_head.weight  # to_empty had untied them
    family.initialise(module, seed=7)
    family.check_initialised(module)
    torch.manual_seed(7)
    real = custom_model.build(nano(), "cpu")
    assert {n: t.tolist() for n, t in module.state_dict().items()} == {
        n: t.tolist() for n, t in real.state_dict().items()
    }
    assert sum(p.numel() for p in module.parameters()) == sum(p.numel() for p in real.parameters()) == 149248


def test_a_block_that_holds_its_own_tensors_is_initialised_under_recompute_and_in_a_stage(project):
    """A block holding a parameter and a buffer itself (a layer scale, a rotary table: PaLM-style code keeps them on
    the block), its values set in `__init__` only: wrapped for recomputation, its tensors sit right under the
    wrapper, and they get the real build's values, as every other tensor does, on one rank and in a pipeline
    stage (they were a KeyError for 'h.0._checkpoint_wrapped_module.scale')."""
    (project / "scaled_blocks.py").write_text(
        textwrap.dedent("""\
            import torch
            from torch import nn

            class Block(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.fc = nn.Linear(n, n)
                    self.scale = nn.Parameter(torch.full((n,), 0.1))
                    self.register_buffer("cos", torch.cos(torch.arange(n, dtype=torch.float32)), persistent=False)

                def forward(self, x):
                    return x + self.scale * self.fc(x) * self.cos

            class Model(nn.Module):
                def __init__(self, vocab_size=64, max_seq_len=16, n=8):
                    super().__init__()
                    self.emb, self.out = nn.Embedding(vocab_size, n), nn.Linear(n, vocab_size)
                    self.h = nn.ModuleList(Block(n) for _ in range(2))
                    nn.init.normal_(self.emb.weight, std=0.5)

                def forward(self, ids):
                    x = self.emb(ids)
                    for block in self.h:
                        x = block(x)
                    return self.out(x)
        """)
    )
    model = CustomModel(name="scaled_blocks", target="scaled_blocks.Model", kwargs={})
    family = family_of(model)
    torch.manual_seed(3)
    real = {n: t.tolist() for n, t in custom_model.build(model, "cpu").state_dict().items()}
    module = family.build("meta")
    family.recompute(module, family.blocks(module), "full", 1)
    family.materialise(module, torch.device("cpu"))
    family.initialise(module, seed=3)
    assert "h.0._checkpoint_wrapped_module.scale" in dict(module.named_parameters())  # wrapped
    assert {n: t.tolist() for n, t in module.state_dict().items()} == real  # (the wrapper's names, unwrapped)
    stage = family.pipeline_stage(module, range(1, 2), first=False, last=True)
    family.initialise_stages(module, [stage], seed=3)
    assert stage.model.h[1].scale.tolist() == real["h.1.scale"]


def test_a_tensor_that_initialisation_leaves_unwritten_stops_the_rank(project):
    """The ranks' own proof, beside the driver's: what to_empty allocated is NaN until initialisation writes it, and
    a model whose init_weights() misses a parameter is stopped naming it (here a gate the model forgot)."""
    (project / "forgetful.py").write_text(
        textwrap.dedent("""\
            import torch
            from torch import nn
            from nano import NanoGPT

            class Gated(NanoGPT):
                def __init__(self, **kwargs):
                    super().__init__(**kwargs)
                    self.gate = nn.Parameter(torch.empty(kwargs["n_embd"]))

                def init_weights(self):
                    for name, p in self.named_parameters():
                        if name != "gate":
                            nn.init.normal_(p, std=0.02)
        """)
    )
    family = family_of(CustomModel(name="gated", target="forgetful.Gated", kwargs=dict(NANO)))
    module = family.build("meta")
    family.materialise(module, torch.device("cpu"))
    family.initialise(module, seed=0)
    with pytest.raises(ModelError, match=r"model 'gated': 1 of 29 parameters and buffers get no value from its init_"):
        family.check_initialised(module)


def test_a_parameter_nothing_initialises_is_refused_before_any_process(project):
    """A parameter made with torch.empty that neither __init__ nor any reset_parameters writes: the driver follows
    on fake tensors what the engine's initialisation writes and records the point invalid, naming it and the fix."""
    (project / "unset.py").write_text(
        textwrap.dedent("""\
            import torch
            from torch import nn
            from nano import NanoGPT

            class Scaled(NanoGPT):
                def __init__(self, **kwargs):
                    super().__init__(**kwargs)
                    self.scale = nn.Parameter(torch.empty(kwargs["n_embd"]))  # meant to be set by a training script
        """)
    )
    cfg = ExperimentConfig.from_dict({"model": {"name": "scaled", "_target_": "unset.Scaled", **NANO}}).changed(
        train={"seq_len": 32, "mbs": 2}, logger={"name": "none"}
    )
    cfg.sweep_dir = str(project / "runs")
    record = run_point(cfg)
    assert record["status"] == "invalid", record
    assert "1 of 29 parameters and buffers get no value from its own __init__: scale: give each such" in record["error"]
    assert [p.name for p in job_dir(project / "runs", job_key(cfg)).iterdir()] == ["result.json"]


def test_a_constant_made_with_torch_tensor_holds_its_value_in_the_check_and_on_the_ranks(project):
    """`torch.tensor(data)` copies a constant that the fake mode lifts into it: a buffer or parameter made so (or
    computed from one) holds its value, as on real tensors; it was refused as getting none from its __init__."""
    (project / "consts.py").write_text(
        textwrap.dedent("""\
            import torch
            from torch import nn
            from nano import NanoGPT

            class Tempered(NanoGPT):
                def __init__(self, **kwargs):
                    super().__init__(**kwargs)
                    self.register_buffer("temperature", torch.tensor([0.7]))
                    self.logit_scale = nn.Parameter(torch.tensor(2.0))
                    self.register_buffer("steps", torch.tensor([1.0, 2.0]) * 3)
        """)
    )
    family = family_of(CustomModel(name="tempered", target="consts.Tempered", kwargs=dict(NANO)))
    assert family.counted(32).init == "own_init"  # the contract check: refused before
    module = family.build("meta")
    family.materialise(module, torch.device("cpu"))
    family.initialise(module, seed=0)
    family.check_initialised(module)
    assert module.temperature.tolist() == pytest.approx([0.7]) and module.logit_scale.item() == 2.0
    assert module.steps.tolist() == [3.0, 6.0]


def test_training_feeds_the_ids_the_contract_is_checked_on():
    """What the contract check feeds (a contiguous (B, T) int64 batch, B > 1) is what every micro-step feeds."""
    data = GlobalBatch(512, 16, seed=0)
    inputs, targets = to_device(step_batches(data, 0, 0, 3, 1)[0], torch.device("cpu"))
    assert inputs.shape == (3, 16) and inputs.dtype == torch.long and inputs.is_contiguous()
    assert targets.shape == (3, 16) and CONTRACT_BATCH > 1


def test_an_edited_model_is_judged_again_under_its_old_key(project):
    """A model's code is fingerprinted in its record (provenance.model_code), not in its key: an invalid point is
    answered from the store while its code is the same, and judged again once the file changes."""
    module = project / "edited.py"
    version = "from nano import NanoGPT\nfrom nanogpt_style import GPT\n\nclass Edited(NanoGPT):\n    def forward(self, idx):\n"
    module.write_text(version + "        return GPT.forward(self, idx)[0]  # without targets: the last position only\n")
    cfg = ExperimentConfig.from_dict({"model": {"name": "edited", "_target_": "edited.Edited", **NANO}}).changed(
        train={"seq_len": 32, "mbs": 2}, logger={"name": "none"}
    )
    cfg.sweep_dir = str(project / "runs")
    first = run_point(cfg)
    assert first["status"] == "invalid" and "returned (2, 1, 512)" in first["error"], first["error"]
    assert run_point(cfg)["provenance"]["attempt"] == 1  # answered by the store: the same code
    module.write_text(version + "        return GPT.forward(self, idx)[0][:, :, :8]  # still wrong, another way\n")
    sys.modules.pop("edited")  # a new command imports the file anew
    second = run_point(cfg)
    assert second["job_key"] == first["job_key"] and second["provenance"]["attempt"] == 2
    assert "returned (2, 1, 8)" in second["error"]
    assert second["provenance"]["model_code"] != first["provenance"]["model_code"]


@pytest.mark.torchrun
def test_a_nanogpt_style_model_trains_at_zero_0_and_3_from_its_own_init_tied_and_predicted(warm_project, tmp_path):
    """nanogpt_style.py behind nano.py, which does no init: at dp=2, ZeRO-0 then ZeRO-3 on warm ranks, its first loss
    on random tokens is ln(vocab) (its own N(0, 0.02) init, not to_empty's garbage nor NaN), both stages train alike,
    n_params is the tied count, and the traced prediction meets the tracked peak."""
    from scaling.sweep.compose import compose_config

    base = [
        "model=nanogpt_tiny", "logger=none", "train.seq_len=32", "train.mbs=2", "train.warmup_steps=2",
        "train.steps=2", "parallel.dp=2", *ON_WARM_RANKS, f"sweep_dir={tmp_path / 'runs'}",
    ]  # fmt: skip
    zero0, zero3 = (run_point(compose_config([*base, f"parallel.zero_stage={stage}"])) for stage in (0, 3))
    for record in (zero0, zero3):
        assert record["status"] == "ok", record["error"]
        assert record["derived"]["n_params"] == 149248 and record["derived"]["model"]["init"] == "own_init"
        assert abs(record["metrics"]["losses"][0] / math.log(512) - 1) <= 0.01, record["metrics"]["losses"]
        predicted, measured = record["predicted"]["peak_mem_bytes"], record["metrics"]["peak_mem_bytes"]
        assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)
    l0, l3 = zero0["metrics"]["losses"], zero3["metrics"]["losses"]
    assert max(abs(a - b) / a for a, b in zip(l0, l3)) <= 1e-5, (l0, l3)


DIVERGES = textwrap.dedent("""\
    import torch
    from torch import nn

    class Normalised(nn.Module):
        '''Embeddings started at zero and scaled to unit length: 0/0 on the first step.'''

        def __init__(self, vocab_size, max_seq_len):
            super().__init__()
            self.emb = nn.Embedding(vocab_size, 16)
            nn.init.zeros_(self.emb.weight)
            self.h = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
            self.out = nn.Linear(16, vocab_size)

        def forward(self, ids):
            x = self.emb(ids)
            x = x / x.norm(dim=-1, keepdim=True)
            for layer in self.h:
                x = layer(x)
            return self.out(x)
""")


@pytest.mark.torchrun
def test_a_nan_loss_is_never_ok_in_the_record_or_the_report(warm_project, tmp_path):
    """A model whose loss is NaN from its first step trains to the end, and the point is `failed` with the step and
    the value: no tokens/s or MFU is published, and the report counts it failed, its error beside it. At dp=2 on the
    warm job of the nanoGPT-style points (warm_project)."""
    from analysis.collect import collect

    (warm_project / "diverges.py").write_text(DIVERGES)
    cfg = ExperimentConfig.from_dict(
        {"model": {"name": "diverges", "_target_": "diverges.Normalised", "vocab_size": 64, "max_seq_len": 32}}
    ).changed(
        train={"seq_len": 16, "mbs": 2, "warmup_steps": 2, "steps": 1},
        parallel={"dp": 2},
        logger={"name": "none"},
        launch={"timeout_s": 180, "reuse": True, "reuse_idle_s": 600},  # ON_WARM_RANKS
    )
    cfg.sweep_dir = str(tmp_path / "runs")
    record = run_point(cfg)
    assert record["status"] == "failed" and record["metrics"] is None, record
    assert record["error"].startswith("training is not finite: the loss of step 0 (of 3, the first 2 warm-up) is nan")
    table = collect(tmp_path / "runs")
    assert list(table["status"].astype(str)) == ["failed"] and table["tokens_per_s_per_gpu"].isna().all()


def test_predict_and_find_mbs_refuse_a_broken_model_in_one_line_as_run_does(project, capsys):
    """The nanoGPT-style GPT's own forward, given no targets, returns the last position's logits, (B, 1, V): `scaling
    predict` and `scaling find-mbs` check the contract as `scaling run` does, one line on stderr and no traceback."""
    from scaling.cli.find_mbs import main as find_mbs_main
    from scaling.cli.predict import main as predict_main

    (project / "last.py").write_text(
        "from nano import NanoGPT\n\nclass Last(NanoGPT):\n    forward = NanoGPT.__mro__[1].forward\n"
    )
    point = ["model=nanogpt_tiny", "model._target_=last.Last", "train.seq_len=32", "hardware.memory_gb=0.01"]
    expected = "model 'nanogpt_tiny' (last.Last): forward(input_ids) of shape (2, 32) returned (2, 1, 512); logits"
    for main, prefix in ((predict_main, "scaling predict: invalid point: "), (find_mbs_main, "scaling find-mbs: ")):
        assert main([*point, "--no-confirm"] if main is find_mbs_main else point) == 2
        err = capsys.readouterr().err
        assert err.startswith(prefix + expected) and err.count("\n") == 1 and "Traceback" not in err, err


READS_A_SHARD = textwrap.dedent("""\
    import torch
    from torch import nn

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("Boom's backward is not written yet")

    class Model(nn.Module):
        # its head adds a block's bias, read outside the block: at ZeRO-3 that bias is a shard there
        def __init__(self, vocab_size=64, max_seq_len=32, boom=False):
            super().__init__()
            self.emb, self.out, self.boom = nn.Embedding(vocab_size, 16), nn.Linear(16, vocab_size), boom
            self.h = nn.ModuleList(Block(16, 16) for _ in range(2))

        def forward(self, ids):
            x = self.emb(ids)
            for layer in self.h:
                x = layer(x)
            x = Boom.apply(x) if self.boom else x
            return self.out(x) + self.h[0].bias.sum()

    class Block(nn.Linear):
        pass
""")


@pytest.mark.slow  # traces in a fake world of 2 ranks and the recipe's candidates at 1 and 8 GPUs: a few seconds
def test_a_model_whose_step_raises_is_one_line_naming_its_line_in_predict_find_mbs_and_the_recipe(project, capsys):
    """A model whose backward raises is refused before any process, the error and its line named (it was a
    traceback out of the driver, the point not recorded). One that raises only at ZeRO-3 (a block's parameter read
    outside the block, a shard there): `scaling predict` and `scaling find-mbs` say so in one line, exit 1 (a
    35-line traceback), and the recipe weighs the other stages and notes why it left that one out (it stopped)."""
    from scaling.cli.find_mbs import main as find_mbs_main
    from scaling.cli.predict import main as predict_main
    from scaling.core.validate import InvalidConfig
    from scaling.model.family import checked
    from scaling.recipe.candidates import find_candidates
    from scaling.sweep.compose import compose_config

    (project / "shard_read.py").write_text(READS_A_SHARD)
    (project / "conf" / "model" / "shard_read.yaml").write_text(
        "name: shard_read\n_target_: shard_read.Model\nvocab_size: 64\nmax_seq_len: 32\n"
    )
    boom = CustomModel(
        name="boom", target="shard_read.Model", kwargs={"boom": True, "vocab_size": 64, "max_seq_len": 32}
    )
    with pytest.raises(InvalidConfig, match=r"model 'boom' \(shard_read.Model\): the backward of its logits' sum "
                       r"raised RuntimeError: Boom's backward is not written yet \(at shard_read.py:11\)"):  # fmt: skip
        checked(boom, 32)
    point = ["model=shard_read", "train.seq_len=32", "parallel.zero_stage=3"]
    said = (
        "the traced training step of model 'shard_read' raised RuntimeError: aten.add.Tensor got mixed torch.Tensor "
        "and DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators! (at "
        "shard_read.py:25)"
    )
    for main, prefix in ((predict_main, "scaling predict: "), (find_mbs_main, "scaling find-mbs: ")):
        at = [*point, "parallel.dp=2", "hardware.memory_gb=0.01"]
        assert main([*at, "--no-confirm"] if main is find_mbs_main else at) == 1
        err = capsys.readouterr().err
        assert err.startswith(prefix + said) and err.count("\n") == 1 and "Traceback" not in err, err
    cfg = compose_config([*point, "hardware=h100", "logger=none"])
    notes: list[str] = []
    never = lambda point: pytest.fail("nothing is launched without a device at hand")  # noqa: E731
    found = find_candidates(cfg, [0, 3], ["none"], [8], 64, 0, never, project / "runs", notes)
    assert [c.name for c in found] == ["ZeRO-0, recompute none"], found
    assert f"ZeRO-3, recompute none: not weighed: {said}" in notes, notes


def test_full_recompute_of_a_model_one_brings_adds_its_blocks_forward_not_its_heads(project):
    """What full recompute runs again is each checkpointed block's forward: the head (16 x 64 here, two thirds of
    the forward) is not run twice, so it is not in the hardware FLOPs (HFU counted it: 3,072 per token, not 1,024)."""
    (project / "shard_read.py").write_text(READS_A_SHARD)
    model = CustomModel(name="plain", target="shard_read.Model", kwargs={"vocab_size": 64, "max_seq_len": 32})
    counted = family_of(model).counted(32)
    assert counted.block == "Block" and counted.n_blocks == 2
    assert counted.recomputed_flops_per_token == 2 * (2 * 16 * 16)  # the two blocks' matmuls, once
    assert counted.flops_per_token == 3 * (2 * (2 * 16 * 16) + 2 * 16 * 64)  # forward and backward of all
    assert counted.hw_flops_per_token("full") == counted.flops_per_token + 1024


def test_the_adapter_on_the_page_is_the_one_the_tests_run():
    """docs/own-project.md's nanoGPT adapter, as printed, is tests/own_project/nano.py (which the docs' commands run)."""
    page = (REPO / "docs" / "own-project.md").read_text()
    block = page.split("### A worked adapter: nanoGPT", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert block in (PROJECT / "nano.py").read_text()
