"""`scaling predict`: peak memory per rank of a point, or of a whole sweep grid, before launching anything.

    scaling predict [--json | --analytic] [overrides]    the analytic breakdown (calibrated for a Hugging Face model
                                                         the formulas describe) and the traced one, or the first
    scaling predict --sweep NAME [--traced] [overrides]  the grid's fit / OOM per point and its forecast

Overrides are those of `scaling run`, composed outside a Hydra job as `scaling find-mbs` composes them
(scaling.sweep.compose.compose_config). docs/memory.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from scaling.core.schema import ExperimentConfig
from scaling.core.units import memory_unit
from scaling.core.validate import InvalidConfig, validate
from scaling.model.family import checked, family_of
from scaling.predictor import TraceError
from scaling.predictor.calibrated import CALIBRATED, NO_ANALYTIC, builtin_of, calibrated_peak
from scaling.predictor.prescreen import capacity_bytes
from scaling.predictor.stage_memory import predict_peak, require_stage_predictor
from scaling.sweep.compose import ComposeError, compose_config


def _fmt(n: Optional[float], divisor: int) -> str:
    return "-" if n is None else f"{n / divisor:.3f}"


def _breakdown_rows(
    analytic: Optional[dict[str, Any]], traced: Optional[dict[str, Any]], calibrated: Optional[dict[str, Any]] = None
) -> list[str]:
    unit, div = memory_unit((analytic or traced or calibrated or {}).get("peak_mem_bytes") or 0)
    rows = []
    if calibrated is not None:  # a model the built-in formulas describe: what the recipe and find-mbs plan with
        rows.append(f"{'analytic at the built-in shapes, calibrated':<44} {unit:>10}")
        rows.append(f"  {'by traces of 1 and 2 blocks: total':<42} {_fmt(calibrated['peak_mem_bytes'], div):>10}")
    if analytic is not None:  # none for a model the user brings: the analytic model is the built-in family's
        rows.append(f"{'analytic (peak at: ' + analytic['phase'] + ')':<44} {unit:>10}")
        for name, value in analytic.items():
            if name.endswith("_bytes") and name != "peak_mem_bytes":
                rows.append(f"  {name:<42} {_fmt(value, div):>10}")
        rows.append(f"  {'total':<42} {_fmt(analytic['peak_mem_bytes'], div):>10}")
    if traced is not None:
        rows.append(f"{'traced (torch memory tracker, fake tensors)':<44} {unit:>10}")
        for name, value in sorted(traced["breakdown"].items(), key=lambda kv: -kv[1]):
            rows.append(f"  {name:<42} {_fmt(value, div):>10}")
        rows.append(f"  {'total':<42} {_fmt(traced['peak_mem_bytes'], div):>10}   (traced in {traced['wall_s']:.1f} s)")
    return rows


def _stage_rows(stages: list[dict[str, Any]]) -> list[str]:
    """One line per pipeline stage: its blocks, the micro-batches it keeps in flight, its peak and where."""
    unit, div = memory_unit(max(st["peak_mem_bytes"] for st in stages))
    rows = [
        f"{'stage':<6} {'blocks':<8} {'in flight':>9} {'weights+grads+states':>21} {'activations':>12} {'peak':>9} "
        f"{'traced':>9}"
    ]
    rows += [
        f"{st['stage']:<6} {st['blocks']:<8} {st['in_flight']:>9g} "
        f"{_fmt(st['params_bytes'] + st['grads_bytes'] + st['optimizer_bytes'], div):>21} "
        f"{_fmt(st['activations_bytes'], div):>12} {_fmt(st['peak_mem_bytes'], div):>9} "
        f"{_fmt(st.get('traced_peak_mem_bytes'), div):>9}  {st['phase']}"
        for st in stages
    ]
    fullest = max(stages, key=lambda st: st["peak_mem_bytes"])
    return [*rows, f"({unit}) the fullest stage, {fullest['stage']}, decides the fit"]


def _point_line(cfg: ExperimentConfig) -> str:
    m, t, p, hw = cfg.model, cfg.train, cfg.parallel, cfg.hardware
    return (
        f"model={m.name} seq_len={t.seq_len} mbs={t.mbs} dp={p.dp} zero_stage={p.zero_stage} "
        f"precision={t.precision} recompute={t.recompute} hardware={hw.name}"
        + (f" tp={p.tp}" if p.tp > 1 else "")
        + (f" pp={p.pp} pp_schedule={p.pp_schedule} pp_virtual={p.pp_virtual}" if p.pp > 1 else "")
    )


def predict_point(cfg: ExperimentConfig, traced: bool = True) -> dict[str, Any]:
    """Both predictions of one point: {capacity_bytes, analytic: {...}, traced: {...} or None}. A model the user
    brings has no analytic one (None); where the built-in formulas describe it (scaling.predictor.calibrated) its
    `calibrated` figure is given instead, the one the recipe and find-mbs plan with; any other is traced, whatever
    `traced` says."""
    closed_form = family_of(cfg.model).closed_form
    described = None if closed_form or cfg.parallel.pp > 1 else builtin_of(cfg)
    out: dict[str, Any] = {
        "capacity_bytes": capacity_bytes(cfg.hardware),
        "analytic": predict_peak(cfg).as_dict() if closed_form else None,
        "traced": None,
    }
    if described is not None:
        grad_acc = validate(cfg, host=False).grad_acc
        peak = calibrated_peak(cfg, described, grad_acc)
        out["calibrated"] = {"method": CALIBRATED, "peak_mem_bytes": peak}
    if cfg.parallel.pp > 1:  # per pipeline stage: analytic, and traced where the stage trace runs (dp 1, ZeRO-0)
        from scaling.predictor.stage_memory import micro_batches, predict_stages

        stages = predict_stages(cfg)
        out["stages"] = [st.as_dict() for st in stages]
        if traced:
            from scaling.predictor.stage_trace import trace_stage_peaks

            try:
                traced_peaks = trace_stage_peaks(cfg, micro_batches(cfg))
            except ValueError as e:
                out["stages_traced_error"] = str(e)
            else:
                for st, peak in zip(out["stages"], traced_peaks):
                    st["traced_peak_mem_bytes"] = peak
        return out
    if traced or (not closed_form and described is None):
        from scaling.predictor.trace import trace_peak

        out["traced"] = trace_peak(cfg).as_dict()
    return out


def _verdict(peak: Optional[int], capacity: Optional[int], margin: float) -> str:
    if capacity is None or peak is None:
        return "-"
    if peak <= capacity:
        return "fits"
    # Over capacity but within the pre-screen's margin: launched, and expected to run out of memory.
    return "oom_within_margin" if peak <= (1 + margin) * capacity else "predicted_oom"


def _sweep(name: str, overrides: list[str], traced: bool, as_json: bool) -> int:
    from omegaconf import OmegaConf

    from scaling.sweep.compose import sweep_file_grid
    from scaling.sweep.grid import Forecast, points_at_once, predict_new, survey
    from scaling.sweep.named import find_sweep

    rows, forecast = [], Forecast()
    with sweep_file_grid(find_sweep(name), overrides) as (points, configs):
        params = OmegaConf.to_container(configs.master.hydra.sweeper.params) or {}
        axes = [
            *params,
            *(o.split("=", 1)[0] for o in overrides if "," in o.split("=", 1)[-1] and o.split("=", 1)[0] not in params),
        ]
        at_once = points_at_once(configs.master)
        for point in survey(points, configs):
            choice = {k: v for k, v in (o.split("=", 1) for o in point.overrides) if k in axes}
            # a model without the closed form is traced, as `scaling predict` of one point and its launch trace it
            new = predict_new(point.cfg, traced or not family_of(point.cfg.model).closed_form)
            forecast.add(point, new["status"], unscreened=new["unscreened"])
            pred = new["predicted"]
            if pred is None:
                rows.append({**choice, "status": "invalid", "error": new["error"]})
                continue
            margin = point.cfg.launch.prescreen_margin
            rows.append(
                {
                    **choice,
                    "status": _verdict(pred["peak_mem_bytes"], pred["capacity_bytes"], margin),
                    "peak_mem_bytes": pred["peak_mem_bytes"],
                    "method": pred["method"],
                    "capacity_bytes": pred["capacity_bytes"],
                    "phase": pred["analytic"]["phase"] if pred["analytic"] else None,
                    "recorded": point.record["status"] if point.done else None,
                }
            )
    summary = forecast.lines(name, at_once)
    if as_json:
        print(
            json.dumps(
                {"sweep": name, "points": rows, "summary": summary, "estimated_wall_s": forecast.wall_s(at_once)},
                indent=2,
            )
        )
        return 0
    keys = axes
    unit, div = memory_unit(max([r.get("peak_mem_bytes") or 0 for r in rows] + [0]))
    widths = [max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)) + f"  {'peak ' + unit:>9}  {'cap ' + unit:>9}  verdict")
    for r in rows:
        cells = "  ".join(str(r.get(k, "")).ljust(w) for k, w in zip(keys, widths))
        print(
            f"{cells}  {_fmt(r.get('peak_mem_bytes'), div):>9}  {_fmt(r.get('capacity_bytes'), div):>9}  {r['status']}"
            + (f" ({r['method']})" if r.get("method") == "traced" else "")
            + (f": {r['error']}" if "error" in r else "")
            + (f" [recorded {r['recorded']}]" if r.get("recorded") else "")
        )
    print("\n".join(summary))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """`scaling predict`: print the memory predictions; returns the exit status."""
    p = argparse.ArgumentParser(prog="scaling predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--analytic",
        action="store_true",
        help="analytic prediction only, calibrated by traces of 1 and 2 blocks for a model the built-in formulas "
        "describe (no whole-model trace; a model they do not describe is traced all the same)",
    )
    p.add_argument("--sweep", metavar="NAME", help="predict every point of sweeps/NAME.yaml")
    p.add_argument(
        "--traced", action="store_true", help="with --sweep: trace near-capacity points, as the pre-screen does"
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=llama_8b parallel.dp=8")
    a = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if a.sweep:
        return _sweep(a.sweep, a.overrides, a.traced, a.json)
    try:
        cfg = compose_config(a.overrides)
    except ComposeError as e:
        print(f"scaling predict: {e}", file=sys.stderr)
        return 2
    try:
        validate(cfg)  # as `scaling run` validates it: a pipeline's stages and schedule too
        require_stage_predictor(cfg, "predict")
        checked(cfg.model, cfg.train.seq_len, cfg.parallel.tp, zero_stage=cfg.parallel.zero_stage)  # as `run` checks it
        result = predict_point(cfg, traced=not a.analytic)  # (its first step under a tp plan, as the pre-screen)
    except InvalidConfig as e:
        print(f"scaling predict: invalid point: {e}", file=sys.stderr)
        return 2
    except TraceError as e:  # the model's own step raised on fake tensors: its ranks may fail so
        print(f"scaling predict: {e}; `scaling run` of the point records what its ranks do", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps({"point": _point_line(cfg), **result}, indent=2))
        return 0
    print(_point_line(cfg))
    if a.analytic and result["analytic"] is None and "calibrated" not in result and result["traced"] is not None:
        print(f"scaling predict: --analytic: {NO_ANALYTIC}: traced", file=sys.stderr)
    print("\n".join(_breakdown_rows(result["analytic"], result["traced"], result.get("calibrated"))))
    if result.get("stages"):
        print("\n".join(_stage_rows(result["stages"])))
        if result.get("stages_traced_error"):
            print(f"traced: not run ({result['stages_traced_error']})")
    cap = result["capacity_bytes"]
    if cap is not None:
        peak = (result["traced"] or result.get("calibrated") or result["analytic"])["peak_mem_bytes"]
        unit, div = memory_unit(cap)
        print(
            f"capacity {_fmt(cap, div)} {unit} per rank (hardware.memory_gb): "
            f"{_verdict(peak, cap, cfg.launch.prescreen_margin)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
