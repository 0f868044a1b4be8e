"""Validation and batch arithmetic: impossible points are named precisely, before any process starts."""

from __future__ import annotations

import pytest

from scaling.cli.main import main as cli_main
from scaling.core.batch import BatchError, derive_grad_acc, plan
from scaling.core.schema import ExperimentConfig
from scaling.core.validate import InvalidConfig, validate
from tests.helpers.compose import compose_point

INVALID = [
    (["parallel.dp=3", "train.grad_acc=auto", "train.gbs=8", "train.mbs=2"], "try parallel.dp in {1, 2, 4}"),
    (["train.mbs=3", "train.grad_acc=auto", "train.gbs=8"], "try train.mbs in {1, 2, 4, 8}"),
    (["model.n_heads=5"], "model.n_heads=5 does not divide model.hidden=64"),
    (["model.n_kv_heads=3"], "model.n_kv_heads=3 does not divide model.n_heads=4"),
    (["model.head_dim=7"], "model.head_dim=7 is odd: RoPE needs an even head_dim"),
    (["model.head_dim=0"], "model.head_dim=0 must be a positive integer or null"),
    (["parallel.zero_stage=5"], "parallel.zero_stage=5 is not valid: choose one of 0, 1, 2, 3"),
    (["parallel.dp=0"], "parallel.dp=0 must be a positive integer"),
    (["train.mbs=-1"], "train.mbs=-1 must be a positive integer"),
    (["train.seq_len=4096"], "train.seq_len=4096 exceeds model.max_seq_len=512"),
    (
        ["model=hf_llama_tiny", "train.seq_len=4096"],
        "exceeds model.max_seq_len=512 (the model file's, else max_position_embeddings of its hf_config=",
    ),
    (["train.grad_acc=auto", "train.gbs_tokens=1000", "train.seq_len=64"], "is not a multiple of train.seq_len=64"),
    (["train.grad_acc=auto", "train.gbs=2", "train.mbs=2", "parallel.dp=2"], "is below 1"),
    (["train.grad_acc=auto"], "needs train.gbs or train.gbs_tokens"),
    (["train.grad_acc=0"], "train.grad_acc=0 must be an integer >= 1 or 'auto'"),
    (["hardware.backend=nccl"], "hardware.backend='nccl' is not valid: choose one of gloo"),
    (["hardware.memory_gb=-1"], "hardware.memory_gb=-1.0 must be a positive number or null"),
    (["launch.repeats=0"], "launch.repeats=0 must be a positive integer"),
    (
        ["launch.timeout_s=20", "launch.collective_timeout_s=30"],
        "launch.collective_timeout_s=30.0 must be below launch.timeout_s=20.0",
    ),
    (["launch.collective_timeout_s=0"], "launch.collective_timeout_s=0.0 must be a positive number or null"),
    (
        ["train.data.source=file", "train.data.path=/nonexistent.bin"],
        "train.data.path='/nonexistent.bin' is not a readable file",
    ),
    (["train.grad_acc=2", "train.gbs=8", "train.mbs=2"], "set train.grad_acc=auto"),
    (
        ["hardware=h100", "hardware.devices_per_node=8", "parallel.dp=12", "train.mbs=1", "train.grad_acc=1"],
        "is not a multiple of it",
    ),
    (["hardware=h100", "train.precision=fp32"], "use train.precision=bf16"),
    (["hardware.threads_per_device=0"], "hardware.threads_per_device=0 must be a positive integer"),
    (["launch.prescreen_sample=2"], "launch.prescreen_sample=2.0 must be a fraction in [0, 1]"),
    (["train.grad_clip=-1"], "train.grad_clip=-1.0 must be >= 0"),
    (
        ["train.recompute=selective", "train.recompute_every=0"],
        "train.recompute_every=0 must be an integer >= 1 (try recompute_every in {1, ..., 2})",
    ),
    (
        ["train.recompute=full", "train.recompute_every=3"],
        "train.recompute_every=3 exceeds the model's 2 blocks: it would checkpoint none; try recompute_every in {1, ...,",
    ),
]


@pytest.mark.parametrize("overrides,expected", INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_points_are_named(overrides, expected):
    with pytest.raises(InvalidConfig) as err:
        validate(compose_point(overrides))
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


CHOICES = [
    ("train.precision=fp8", "Invalid value 'fp8', expected one of [fp32, bf16]"),
    ("train.recompute=partial", "Invalid value 'partial', expected one of [none, selective, full]"),
    ("parallel.fsdp_grad_reduce=never", "Invalid value 'never', expected one of [every_micro_step, last_micro_step]"),
]


@pytest.mark.parametrize("override,expected", CHOICES, ids=[o for o, _ in CHOICES])
def test_a_choice_outside_its_enum_is_refused_when_the_config_is_composed(override, expected):
    """The schema types these fields with their enums (scaling.core.enums): Hydra refuses another value while it
    composes, before any point exists, naming the field, the value and the valid ones."""
    with pytest.raises(Exception) as err:
        compose_point([override])
    text = f"{err.value} {err.value.__cause__}"
    assert expected in text and override in text, text


def test_a_choice_outside_its_enum_in_a_plain_config_is_invalid():
    """A config read from a file rather than composed (a record, a job's config.json) is checked by validate."""
    c = ExperimentConfig.from_dict({"train": {"precision": "fp8", "recompute": "some"}})
    with pytest.raises(InvalidConfig) as err:
        validate(c)
    assert "train.precision='fp8' is not valid: choose one of fp32, bf16" in str(err.value)
    assert "train.recompute='some' is not valid: choose one of none, selective, full" in str(err.value)


def test_several_problems_are_all_reported():
    with pytest.raises(InvalidConfig) as err:
        validate(compose_point(["parallel.zero_stage=4", "hardware.backend=nccl", "model.n_kv_heads=3"]))
    assert len(err.value.errors) == 3


def test_auto_grad_acc_from_gbs_tokens():
    d = validate(
        compose_point(
            ["train.grad_acc=auto", "train.gbs_tokens=1024", "train.seq_len=64", "train.mbs=2", "parallel.dp=2"]
        )
    )
    assert (d.gbs, d.gbs_tokens, d.grad_acc, d.world_size, d.nnodes) == (16, 1024, 4, 2, 1)


def test_a_cpu_rank_is_a_device_of_its_own_cores():
    """dp x threads_per_device must fit the host's cores, unless oversubscription is asked for (and recorded)."""
    too_many = compose_point(["parallel.dp=4", "hardware.threads_per_device=2"])
    with pytest.raises(InvalidConfig) as err:
        validate(too_many, usable_cores=6)
    assert str(err.value) == (
        "parallel.dp=4 x hardware.threads_per_device=2 = 8 threads on one host but this host has 6 usable cores: "
        "the largest dp that fits is 3 (or set hardware.oversubscribe=true to let ranks share cores; the record "
        "and the report then say so)"
    )
    assert validate(too_many, usable_cores=8).world_size == 4
    with pytest.raises(InvalidConfig, match=r"= 4 threads .* 2 usable cores: the largest dp that fits is 1 \("):
        validate(compose_point(["parallel.dp=2", "parallel.tp=2", "parallel.zero_stage=3"]), usable_cores=2)
    # one dp rank's model-parallel group alone past the cores: not "the largest dp that fits is 0"
    with pytest.raises(
        InvalidConfig,
        match=r"2 usable cores: one dp rank alone is 2 ranks \(its model-parallel degrees\), and 1 fit \(",
    ):
        validate(compose_point(["parallel.pp=2", "train.grad_acc=2", "hardware.threads_per_device=2"]), usable_cores=2)
    assert (
        validate(
            compose_point(["parallel.dp=4", "hardware.threads_per_device=2", "hardware.oversubscribe=true"]),
            usable_cores=6,
        ).world_size
        == 4
    )
    assert validate(too_many, usable_cores=6, host=False).world_size == 4  # the predictors' view: any host


def test_the_cpu_device_is_part_of_the_job_key():
    """A record measured on 1-thread devices never answers a point asked on 2-thread ones."""
    from scaling.store.record import job_key

    keys = {job_key(compose_point([f"hardware.threads_per_device={t}"])) for t in (1, 2)}
    keys.add(job_key(compose_point(["hardware.oversubscribe=true"])))
    assert len(keys) == 3
    assert job_key(compose_point(["launch.timeout_s=5"])) == job_key(compose_point([]))  # how it runs: not the key


def test_grad_clip_is_part_of_the_job_key():
    """Clipping changes what is trained: a point clipped at another norm, or not at all, is another point."""
    from scaling.store.record import job_key

    keys = {job_key(compose_point([f"train.grad_clip={v}"])) for v in (0, 0.5, 1.0)}
    assert len(keys) == 3 and job_key(compose_point(["train.grad_clip=1.0"])) == job_key(compose_point([]))


def test_nodes_from_devices_per_node():
    d = validate(compose_point(["hardware=h100", "train.precision=bf16", "parallel.dp=16", "train.mbs=1"]))
    assert d.nnodes == 2


def test_typo_or_wrong_type_fails_at_composition():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="msb"):
        compose_point(["train.msb=2"])
    with pytest.raises(ConfigCompositionException, match="parallel.dp"):
        compose_point(["parallel.dp=two"])


def test_derive_grad_acc_errors_propose_choices():
    assert derive_grad_acc(32, 2, 4) == 4
    with pytest.raises(BatchError, match=r"try parallel.dp in \{1, 2, 4\}"):
        derive_grad_acc(8, 2, 3)


def test_plan_playbook_example(capsys):
    exact = plan(4_000_000, 4000, 2, 500)
    assert exact.grad_acc == 1 and exact.effective_gbs_tokens == 4_000_000
    p = plan(4_000_000, 4000, 2, 128)
    assert p.grad_acc is None and round(p.grad_acc_exact, 1) == 3.9 and p.gpus_for_grad_acc_1 == 500
    assert (125, 4, 4_000_000) in p.alternatives and (128, 4, 4_096_000) in p.alternatives
    assert cli_main(["plan", "--gbs-tokens", "4M", "--seq-len", "4000", "--mbs", "2", "--gpus", "128"]) == 0
    out = capsys.readouterr().out
    assert "grad_acc 1 would need 500.0 GPUs" in out and "grad_acc = 3.91" in out and "125 GPUs x grad_acc 4" in out


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["hardware.links_per_node=0"], "hardware.links_per_node=0 must be a positive integer or null"),
        (
            ["hardware.devices_per_node=2", "hardware.links_per_node=4"],
            "hardware.links_per_node=4 must be null (one link per device) or between 1 and hardware.devices_per_node=2",
        ),
    ],
)
def test_links_per_node_outside_one_to_devices_per_node_is_refused(overrides, message):
    with pytest.raises(InvalidConfig) as e:
        validate(compose_point(overrides))
    assert message in str(e.value)
