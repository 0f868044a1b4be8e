"""The memory of a Hugging Face config the built-in formulas describe (scaling.model.hf.builtin_shapes: Llama,
Mistral, Qwen2, Qwen3 and the like): the analytic predictor at the built-in shapes, plus what transformers' blocks
keep beyond the built-in decoder's (fp32 copies of each RMSNorm's input, q/k norms, biases), measured by the trace.

That difference is activations (`Calibration`): read off traces of the model cut to 1 and 2 blocks
(`CALIBRATION_LAYERS`) against the analytic figure of the same points, it holds for every count, shard group, ZeRO
stage of one kind, mbs and grad_acc of a setting (`setting_key`: the model file's content, seq_len, precision,
recompute, the FSDP2 kind, tp, device, torch's and transformers' versions, the analytic formulas' hash). It is traced
once per process and kept in `<sweep_dir>/traces/calibrations/<key>.json`; a point whose analytic figure alone is over
the capacity needs none (`fits`). The key cannot see the engine or the trace: after an upgrade that changes them,
delete the directory. docs/own-project.md (planned in a minute).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

from scaling.core.enums import ZeroStage
from scaling.core.layout import Layout
from scaling.core.model_group import ModelConfig
from scaling.core.schema import ExperimentConfig
from scaling.model.family import family_of
from scaling.model.hf.config import LAYERS_KEY
from scaling.predictor.analytic import MemoryBreakdown, analytic_peak

CALIBRATED = "analytic+traced"
"""The method of a calibrated figure, as a record's `predicted.method` would name it."""
CALIBRATION_LAYERS = (1, 2)
"""Blocks of the two traced cuts of the model: the difference per block is the second less the first."""
CALIBRATIONS_DIR = "calibrations"
"""Under a sweep directory's traces/ (scaling.predictor.trace.TRACES_DIR): one file per setting."""
MAX_CALIBRATION_MBS = 64
"""The largest micro-batch a calibration point doubles up to so that its peak holds activations (logits or blocks)."""


@dataclass(frozen=True)
class Calibration:
    """Bytes per rank the traced Hugging Face model holds beyond the analytic figure: per sequence of the micro-batch
    a root part and a part per block (activations), and under tensor parallelism a part of the shard group's size
    (state: transformers' plans leave the embedding and the head whole, the built-in one splits them)."""

    root_bytes: float
    block_bytes: float
    whole_bytes: float = 0.0
    """Held whatever the shard group (an unsharded copy of the whole root, its logits)."""
    sharded_bytes: float = 0.0
    """Held over the shard group's ranks (the whole root's sharded state): divided by their number."""

    def extra_bytes(self, mbs: int, n_layers: int, shard_size: int) -> int:
        """The difference at `mbs` sequences per micro-step, `n_layers` blocks and a shard group of `shard_size`."""
        state = self.whole_bytes + self.sharded_bytes / shard_size
        return int(state + mbs * (self.root_bytes + n_layers * self.block_bytes))


CALIBRATION_FIELDS = tuple(f.name for f in fields(Calibration))

_CALIBRATIONS: dict[str, Calibration] = {}
"""Each setting's calibration, by `setting_key`: traced once per process."""


def builtin_of(cfg: ExperimentConfig) -> Optional[ModelConfig]:
    """The built-in shapes of the point's model where the built-in formulas describe it and it is not built-in itself;
    None: the trace predicts it point by point."""
    if family_of(cfg.model).closed_form:
        return None
    return _builtin(json.dumps(cfg.model.to_dict(), sort_keys=True, default=str), cfg.train.seq_len)


@functools.lru_cache(maxsize=16)
def _builtin(model: str, seq_len: int) -> Optional[ModelConfig]:
    from scaling.core.model_group import model_of

    return family_of(model_of(json.loads(model))).builtin_config(seq_len)


def traced_by_cuts(cfg: ExperimentConfig, grad_acc: int, kept_in: Optional[str | os.PathLike] = None) -> int:
    """The traced predictor's figure of a point of the built-in family, from the traces of its 1- and 2-block cuts
    (the calibration of its setting, as a model it describes is calibrated) instead of one trace of the whole model:
    what checks a plan of the presets against the trace at every count in seconds (tests/test_plan_traced.py)."""
    model = cfg.model
    if not isinstance(model, ModelConfig):
        raise ValueError(f"model {model.name!r} is not of the built-in family: calibrated_peak predicts it")
    return calibrated_peak(cfg, model, grad_acc, kept_in)


NO_ANALYTIC = "the model is neither the built-in family nor one its formulas describe, so it has no analytic figure"
"""Why `--analytic` traces a model all the same (scaling predict and find-mbs say so)."""


def predictor_name(cfg: ExperimentConfig) -> str:
    """How `predicted_peak` predicts the point's model, in a plan's words."""
    if family_of(cfg.model).closed_form:
        return "analytic"
    return "analytic, calibrated by traces" if builtin_of(cfg) is not None else "traced"


def predicted_peak(cfg: ExperimentConfig, grad_acc: int, kept_in: Optional[str | os.PathLike] = None) -> int:
    """A point's peak bytes per rank as a plan takes it: the analytic predictor for the built-in family, calibrated
    for a model it describes (`calibrated_peak`), else the point traced (kept in `kept_in`'s traces/ when given)."""
    if family_of(cfg.model).closed_form:  # with pipeline stages, the fullest stage's
        from scaling.predictor.stage_memory import predict_peak

        return predict_peak(cfg, grad_acc).total_bytes
    model = builtin_of(cfg)
    if model is not None:
        return calibrated_peak(cfg, model, grad_acc, kept_in)
    from scaling.predictor.trace import trace_peak, trace_peak_kept

    return (trace_peak(cfg) if kept_in is None else trace_peak_kept(cfg, kept_in)).peak_mem_bytes


def fits(cfg: ExperimentConfig, grad_acc: int, capacity: int, kept_in: Optional[str | os.PathLike] = None) -> bool:
    """Whether the point's `predicted_peak` is within `capacity` bytes per rank. Of a model calibrated by traces, a
    point whose analytic figure alone is over it does not fit, whatever its setting's calibration (the calibrated
    figure is never below the analytic one: `calibrated_peak`): it is answered without tracing, and a setting none
    of whose points comes under the capacity is never calibrated (ZeRO-0 and 1 of an 8B model on 80 GB)."""
    model = builtin_of(cfg)
    if model is not None and _analytic(cfg, model, grad_acc).total_bytes > capacity:
        return False
    return predicted_peak(cfg, grad_acc, kept_in) <= capacity


def setting_key(cfg: ExperimentConfig) -> str:
    """What a calibration depends on, hashed: everything of the point but its counts, shard group, ZeRO stage within
    its kind, mbs and grad_acc, with torch's and transformers' versions."""
    from importlib import metadata

    import torch

    try:  # the installed distribution's version: the same string as transformers.__version__, without its import
        versions = [torch.__version__, metadata.version("transformers")]
    except metadata.PackageNotFoundError:  # the built-in family without the [hf] extra
        versions = [torch.__version__, None]
    layout = cfg.parallel.layout
    setting = {
        "model": cfg.model.to_dict(),
        "train": {k: getattr(cfg.train, k) for k in ("seq_len", "precision", "recompute", "recompute_every")},
        "fsdp": layout.fsdp,
        "tp": layout.tp,
        "hardware": {k: getattr(cfg.hardware, k) for k in ("device", "backend")},
        "versions": versions,
        "layers": CALIBRATION_LAYERS,
        "formulas": formulas_version(),
    }
    return hashlib.sha256(json.dumps(setting, sort_keys=True, default=str).encode()).hexdigest()[:20]


FORMULA_MODULES = ("scaling.predictor.analytic", "scaling.predictor.model_state")
"""Where the analytic figure's formulas live: a calibration is what the trace holds beyond them, so a change to
either makes every calibration of the old formulas another setting's."""


@functools.cache
def formulas_version() -> str:
    """A hash of FORMULA_MODULES' source, part of `setting_key`: a calibration written before a change to the
    analytic formulas is not read back beneath the new figure."""
    import importlib

    digest = hashlib.sha256()
    for name in FORMULA_MODULES:
        digest.update(Path(str(importlib.import_module(name).__file__)).read_bytes())
    return digest.hexdigest()[:16]


def _cut(cfg: ExperimentConfig, n_layers: int, mbs: int, dp: int = 2) -> ExperimentConfig:
    """The setting's calibration point: the model cut to `n_layers` blocks, `mbs` sequences, grad_acc 2, the stage of
    its kind (0 or 3) on `dp` ranks of its tp."""
    if isinstance(cfg.model, ModelConfig):  # the built-in family: its own field
        model = {"n_layers": n_layers}
    else:
        model = {"kwargs": {**cfg.model.kwargs, LAYERS_KEY: n_layers}}
    layout = cfg.parallel.layout
    cut = Layout(ZeroStage.PARAMETERS if layout.fsdp else ZeroStage.NONE, tp=layout.tp).with_dp(dp)
    train = {"mbs": mbs, "grad_acc": 2, "gbs": None, "gbs_tokens": None}
    return cfg.changed(model=model, train=train, parallel=cut.parallel())


def _analytic(cfg: ExperimentConfig, model: ModelConfig, grad_acc: int) -> MemoryBreakdown:
    return analytic_peak(model, cfg.train, cfg.parallel, cfg.hardware, grad_acc)


def _calibrate(cfg: ExperimentConfig, model: ModelConfig) -> Calibration:
    """Traces of the cut model against the analytic figures of the same points, at the smallest mbs (doubling) whose
    analytic peak holds activations at both cuts (a peak of model state alone says nothing of them): two cuts at
    that mbs; under tensor parallelism also twice the mbs and four times the ranks, for the state's two parts."""
    from dataclasses import replace

    from scaling.predictor.trace import trace_peak

    def diff(n: int, mbs: int, dp: int = 2) -> int:
        point = _cut(cfg, n, mbs, dp)
        return trace_peak(point).peak_mem_bytes - _analytic(point, replace(model, n_layers=n), 2).total_bytes

    m = 1
    while m < MAX_CALIBRATION_MBS and any(
        _analytic(_cut(cfg, n, m), replace(model, n_layers=n), 2).activations_bytes == 0 for n in CALIBRATION_LAYERS
    ):
        m *= 2
    (n1, n2) = CALIBRATION_LAYERS
    d1, d2 = diff(n1, m), diff(n2, m)
    block = (d2 - d1) / (n2 - n1)
    if cfg.parallel.layout.tp == 1:  # the same parameters as the built-in decoder's but for vectors: no state part
        return Calibration((d1 - n1 * block) / m, block / m)
    per_seq = (diff(n1, 2 * m) - d1) / m  # the root's and n1 blocks' activations per sequence
    state = d1 - m * per_seq  # at 2 ranks: whole + sharded / 2
    sharded = (state - (diff(n1, m, 8) - m * per_seq)) / (1 / 2 - 1 / 8)
    return Calibration(per_seq - n1 * block / m, block / m, state - sharded / 2, sharded)


def calibration(cfg: ExperimentConfig, model: ModelConfig, kept_in: Optional[str | os.PathLike] = None) -> Calibration:
    """The point's setting's calibration: from this process, else the sweep directory's file, else traced (and kept)."""
    key = setting_key(cfg)
    if key in _CALIBRATIONS:
        return _CALIBRATIONS[key]
    from scaling.core.files import read_json, write_json_atomic
    from scaling.predictor.trace import TRACES_DIR

    path = None if kept_in is None else Path(kept_in) / TRACES_DIR / CALIBRATIONS_DIR / f"{key}.json"
    found = None
    if path is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            doc = read_json(path)
            found = Calibration(**{k: float(doc[k]) for k in CALIBRATION_FIELDS})
    if found is None:
        found = _calibrate(cfg, model)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, asdict(found))
    _CALIBRATIONS[key] = found
    return found


def _with_activations(cfg: ExperimentConfig, model: ModelConfig, grad_acc: int, peak: MemoryBreakdown) -> int:
    """The analytic figure of the step's phases that hold activations, where the peak is one that holds none (the
    optimizer step, DDP's bucket rebuild, FSDP2's end of backward): read off two larger micro-batches, on which those
    phases grow by the same bytes per sequence."""
    if peak.activations_bytes > 0:
        return peak.total_bytes
    mbs = int(cfg.train.mbs)
    at = {}
    for k in (MAX_CALIBRATION_MBS, 2 * MAX_CALIBRATION_MBS):
        b = _analytic(cfg.changed(train={"mbs": mbs * k}), model, grad_acc)
        if b.activations_bytes == 0:
            return 0  # none of them is ever the peak: no activations to correct
        at[k] = b.total_bytes
    per_mbs = (at[2 * MAX_CALIBRATION_MBS] - at[MAX_CALIBRATION_MBS]) / (mbs * MAX_CALIBRATION_MBS)
    return int(at[MAX_CALIBRATION_MBS] - per_mbs * mbs * (MAX_CALIBRATION_MBS - 1))


def calibrated_peak(
    cfg: ExperimentConfig, model: ModelConfig, grad_acc: int, kept_in: Optional[str | os.PathLike] = None
) -> int:
    """Peak bytes per rank of a point of a model the built-in formulas describe (`builtin_of`): the larger of the
    analytic phases without activations and those with them plus the setting's calibration."""
    peak = _analytic(cfg, model, grad_acc)
    shard = cfg.parallel.layout.shard_size
    extra = calibration(cfg, model, kept_in).extra_bytes(int(cfg.train.mbs), model.n_layers, shard)
    with_activations = _with_activations(cfg, model, grad_acc, peak)
    return max(peak.total_bytes, with_activations + extra) if with_activations else peak.total_bytes
