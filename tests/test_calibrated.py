"""A Hugging Face config the built-in formulas describe is planned by the analytic predictor calibrated by traces of
its 1- and 2-block cuts (scaling.predictor.calibrated): its figure equals the trace of the whole point across stages,
shard groups, tensor parallelism, recompute settings and micro-batches; a config they do not describe is traced; a
setting's calibration is traced once and kept in the sweep directory under a key that names the setting."""

from __future__ import annotations

import json

import pytest

from scaling.core.schema import ModelConfig
from scaling.predictor import calibrated
from scaling.predictor.calibrated import CALIBRATIONS_DIR, builtin_of, calibrated_peak, predicted_peak, setting_key
from scaling.predictor.trace import TRACES_DIR, trace_peak
from scaling.sweep.compose import compose_config

HF_TINY = ["model=hf_llama_tiny", "train.seq_len=64", "train.precision=bf16", "logger=none"]


def point(*more: str) -> object:
    return compose_config([*HF_TINY, "hardware=h100", *more])


def test_a_llama_shaped_config_is_described_by_the_built_in_shapes_and_a_mixture_of_experts_is_not() -> None:
    described = builtin_of(point())
    assert isinstance(described, ModelConfig)
    assert (described.n_layers, described.hidden, described.n_heads, described.n_kv_heads) == (2, 64, 4, 2)
    assert builtin_of(compose_config(["model=hf_mixtral_tiny", "train.seq_len=64"])) is None  # its experts
    assert builtin_of(compose_config(["model=tiny"])) is None  # the built-in family is analytic already


@pytest.mark.slow
@pytest.mark.parametrize(
    "zero, dp, tp, recompute, mbs", [(0, 4, 1, "none", 3), (2, 8, 1, "full", 5), (3, 4, 2, "selective", 3)]
)
def test_the_calibrated_figure_is_the_trace_of_the_whole_point(tmp_path, zero, dp, tp, recompute, mbs) -> None:
    """Calibrated on cuts of 1 and 2 blocks at 2 ranks and mbs 1 (with tp also at 8 ranks and mbs 2), it holds for a
    4-block model at another count, mbs and ZeRO stage of the same kind, within the analytic predictor's own error
    (this tiny model is mostly model state: a ZeRO-2 point is 4% under its trace here, an 8B-sized one 0.0%:
    benchmarks/bench_plan_fast.py)."""
    cfg = point(
        f"parallel.zero_stage={zero}", f"parallel.dp={dp}", f"parallel.tp={tp}", f"train.recompute={recompute}",
        f"train.mbs={mbs}", "train.grad_acc=2", "+model.num_hidden_layers=4",
    )  # fmt: skip
    model = builtin_of(cfg)
    assert model is not None and model.n_layers == 4
    traced = trace_peak(cfg).peak_mem_bytes
    assert calibrated_peak(cfg, model, 2, tmp_path) == pytest.approx(traced, rel=0.05)


@pytest.mark.slow
def test_a_setting_is_traced_once_kept_and_read_back_under_its_own_key(tmp_path, monkeypatch) -> None:
    cfg = point("parallel.zero_stage=3", "parallel.dp=8", "train.mbs=2", "train.grad_acc=2")
    calibrated._CALIBRATIONS.clear()
    first = predicted_peak(cfg, 2, tmp_path)
    kept = list((tmp_path / TRACES_DIR / CALIBRATIONS_DIR).glob("*.json"))
    assert [k.stem for k in kept] == [setting_key(cfg)] and set(json.loads(kept[0].read_text())) >= {"block_bytes"}
    # every count, stage of its kind and mbs of the setting reuses it: nothing more is traced, in this process or
    # another that reads the directory
    calibrated._CALIBRATIONS.clear()
    monkeypatch.setattr("scaling.predictor.trace.trace_peak", lambda c: pytest.fail("traced again"))
    again = [
        predicted_peak(cfg.changed(parallel={"dp": n, "zero_stage": z}), 2, tmp_path) for n in (8, 64) for z in (2, 3)
    ]
    assert again[1] == first and again[3] < again[1] < again[0]  # ZeRO-3 at 64 ranks: less; ZeRO-2 holds more
    assert predicted_peak(cfg, 2, tmp_path) == first
    # another setting (recomputation, tensor parallelism, the other kind, another seq_len) is another key
    others = [
        cfg.changed(train={"recompute": "full"}),
        cfg.changed(parallel={"tp": 2}),
        cfg.changed(parallel={"zero_stage": 1}),
        cfg.changed(train={"seq_len": 32}),
    ]
    assert len({setting_key(cfg), *map(setting_key, others)}) == 5
    # an edited model file is another model: its content hash is in the key
    edited = cfg.changed(model={"kwargs": {**cfg.model.kwargs, "config_sha256": "0" * 16}})
    assert setting_key(edited) != setting_key(cfg)


@pytest.mark.slow
def test_a_model_the_formulas_do_not_describe_is_traced_point_by_point(tmp_path) -> None:
    cfg = compose_config(
        [
            "model=hf_mixtral_tiny",
            "train.seq_len=64",
            "hardware=h100",
            "train.mbs=2",
            "train.grad_acc=2",
            "parallel.dp=4",
        ]
    )
    assert predicted_peak(cfg, 2, tmp_path) == trace_peak(cfg).peak_mem_bytes
    assert not (tmp_path / TRACES_DIR / CALIBRATIONS_DIR).exists() and list((tmp_path / TRACES_DIR).glob("*.json"))


def test_a_setting_none_of_whose_points_fits_by_its_analytic_figure_alone_is_never_traced(tmp_path, monkeypatch):
    """The calibrated figure is never below the analytic one: a point the analytic figure puts over the capacity does
    not fit whatever the calibration, so the recipe's search answers it without tracing the setting (ZeRO-0 and 1 of
    an 8B model on 80 GB: three calibrations of no use)."""
    from scaling.recipe.mbs_search import largest_mbs_by_gpus

    cfg = point("parallel.zero_stage=0", "train.grad_acc=2", "hardware.memory_gb=0.0001")
    model = builtin_of(cfg)
    assert model is not None and calibrated._analytic(cfg, model, 2).total_bytes > 0.0001 * 2**30
    calibrated._CALIBRATIONS.clear()
    monkeypatch.setattr("scaling.predictor.trace.trace_peak", lambda c: pytest.fail("traced a point that cannot fit"))
    assert largest_mbs_by_gpus(cfg, [1, 2, 8], 64, tmp_path) == {1: 0, 2: 0, 8: 0}
    assert not calibrated._CALIBRATIONS and not (tmp_path / TRACES_DIR).exists()


def test_a_calibration_of_other_analytic_formulas_is_another_settings(monkeypatch) -> None:
    """A calibration is what the trace holds beyond the analytic figure: the formulas' source is in its key, so one
    written before they changed is not read back beneath the new figure."""
    import hashlib
    import importlib
    from pathlib import Path

    cfg = point("parallel.zero_stage=3", "parallel.dp=8")
    source = b"".join(Path(str(importlib.import_module(m).__file__)).read_bytes() for m in calibrated.FORMULA_MODULES)
    assert calibrated.formulas_version() == hashlib.sha256(source).hexdigest()[:16]
    before = setting_key(cfg)
    monkeypatch.setattr(calibrated, "formulas_version", lambda: hashlib.sha256(source + b"# edited").hexdigest()[:16])
    assert setting_key(cfg) != before
