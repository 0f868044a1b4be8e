"""`make gpu-check`: the GPU path, run for real on whatever CUDA devices this machine has.

    python benchmarks/gpu_check.py [--budget-s 560] [--out benchmarks/gpu]

(a) llama_1b at seq 4096 in bf16 on one GPU, ZeRO 0-3: the largest mbs that fits (`scaling find-mbs`:
    predicted, then confirmed by a run at that mbs and one at mbs + 1), then the same mbs with
    `train.compile`: tokens/s per GPU, MFU, the attention kernel that ran, compile time;
(b) the memory predictor against `max_memory_allocated` on 16 or more eager points (mbs, recompute none, selective
    and full, ZeRO stage), with `mem_get_info`'s view of what the device had in use beside it;
(c) a point made to run out of memory (the find-mbs run at mbs + 1, and one on a capped device) must
    be classified `oom`;
(d) with two or more GPUs, the ZeRO equivalence check on NCCL (dp=2, grad_acc=2 against dp=1,
    grad_acc=4: the same losses for every stage);
(f) llama_1b at seq 2048 at ZeRO-0 and ZeRO-1, dp=1, with `launch.memory_snapshot`: the allocation sites whose bytes
    at the peak differ (ZeRO-1 held 4 bytes per parameter more on an H100, not on CPU);
(g) a model the user brings against the built-in one: `model=hf_llama_1b` (Llama 3.2 1B's published config, built
    by transformers) beside `model=llama_1b` (the same shapes), seq 4096, bf16, mbs 2, ZeRO-0 and ZeRO-3, eager, then
    ZeRO-0 with `train.compile`: tokens/s per GPU, MFU (the HF model's FLOPs counted by FlopCounterMode), peak
    against the traced prediction (both models) and the analytic one (llama_1b);
(e) `scaling recipe` for llama_1b at seq 4096 in bf16 on the devices at hand (a global batch of 1Mi tokens,
    ZeRO-0 and ZeRO-3, 1 to 512 GPUs): measured at dp=1 and at the GPUs this machine has, extrapolated past
    them; its recipe.md is appended to the page.

It writes `benchmarks/gpu/<device>.md` (tokens/s per GPU, MFU, measured against predicted memory per
point, the targets: MFU >= 40% for llama_1b bf16 seq 4096 on an H100, predictor error on the eager and on the
compiled points: median <= 3%, largest <= 6%).
Without a CUDA device it composes and predicts every planned point, says that no CUDA device was
found, and exits 1. Parts that would overrun --budget-s are skipped and listed as skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scaling.core.enums import Status  # noqa: E402
from scaling.core.schema import ExperimentConfig  # noqa: E402
from scaling.core.units import GIB  # noqa: E402
from scaling.core.validate import validate  # noqa: E402
from scaling.model.family import family_of  # noqa: E402
from scaling.predictor.analytic import predict_config  # noqa: E402
from scaling.sweep.compose import compose_config  # noqa: E402

PROFILES = {"H100": "h100", "H200": "h200", "A100": "a100"}
MFU_TARGET, PREDICTOR_TARGET, PREDICTOR_LARGEST = 0.40, 0.03, 0.06
STAGES = (0, 1, 2, 3)
BASE = [
    "model=llama_1b",
    "train.seq_len=4096",
    "train.precision=bf16",
    "parallel.dp=1",
    "train.warmup_steps=2",
    "train.steps=5",
    "logger=none",
    "launch.rerun=all",
    "launch.timeout_s=300",
]
EXTRA = [(mbs, rc, z) for mbs in (1, 4) for rc in ("none", "selective", "full") for z in (0, 3)]
"""(b)'s further eager points: llama_1b at seq 2048."""


def profile_for(name: str) -> str:
    """The hardware profile of a CUDA device name ('NVIDIA H100 80GB HBM3' -> 'h100')."""
    for marker, profile in PROFILES.items():
        if marker in name:
            return profile
    raise SystemExit(
        f"gpu-check: no hardware profile for {name!r}: add one to conf/hardware/ (one of "
        f"{', '.join(PROFILES.values())} exists)"
    )


class Check:
    """The run's points, its verdicts and its time budget."""

    def __init__(self, hardware: str, sweep_dir: Path, budget_s: float) -> None:
        self.hardware, self.sweep_dir, self.deadline = hardware, sweep_dir, time.monotonic() + budget_s
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.failures: list[str] = []
        self.recipe: str = ""
        self.snapshot: list[str] = []
        self.own: list[dict[str, Any]] = []

    def config(self, *overrides: str) -> ExperimentConfig:
        """A resolved point of the check."""
        return compose_config([*BASE, f"hardware={self.hardware}", f"sweep_dir={self.sweep_dir}", *overrides])

    def time_left(self, need_s: float, part: str) -> bool:
        """Whether `need_s` more seconds fit in the budget; if not the part is listed as skipped."""
        if time.monotonic() + need_s <= self.deadline:
            return True
        self.notes.append(f"skipped for time (--budget-s): {part}")
        return False

    def expect(self, ok: bool, what: str) -> None:
        """A correctness verdict: recorded, and failing the check when false."""
        if not ok:
            self.failures.append(what)

    def add(
        self, part: str, record: dict[str, Any], cfg: ExperimentConfig, predicted: Optional[int] = None
    ) -> dict[str, Any]:
        """One measured point as a table row; `predicted` defaults to the analytic peak (of the built-in family)."""
        m, env = record.get("metrics") or {}, record.get("env") or {}
        t, p = cfg.train, cfg.parallel
        times = m.get("step_times_s") or []
        row = {
            "part": part,
            "model": cfg.model.name,
            "seq": t.seq_len,
            "mbs": t.mbs,
            "zero": p.zero_stage,
            "recompute": t.recompute,
            "compile": t.compile,
            "status": record["status"],
            "error": record.get("error"),
            "tokens_per_s_per_gpu": m.get("tokens_per_s_per_gpu"),
            "mfu": m.get("mfu"),
            "step_spread": (max(times) - min(times)) / statistics.median(times) if times else None,
            "peak_alloc": m.get("peak_mem_bytes"),
            "peak_reserved": m.get("peak_mem_reserved_bytes"),
            "device_used": m.get("device_used_bytes"),
            "build_peak": m.get("build_peak_mem_bytes"),
            "predicted": predict_config(cfg).total_bytes
            if predicted is None and family_of(cfg.model).closed_form
            else predicted,
            "flops_per_token": (record.get("derived") or {}).get("flops_per_token"),
            "flops_source": (record.get("derived") or {}).get("flops_source", "closed form"),
            "kernel": env.get("attention_kernel"),
            "compile_s": m.get("compile_s"),
            "recompiles": m.get("recompiles_after_warmup"),
            "key": record.get("job_key"),
        }
        self.rows.append(row)
        print(_row_line(row), flush=True)
        return row


def _gib(b: Any, width: int = 0) -> str:
    """Bytes in GiB with two decimals, or a dash padded to `width` (blank with no width) when there are none."""
    return f"{b / GIB:{width}.2f}" if b else ("-".rjust(width) if width else "")


def _pct(v: Any) -> str:
    return "" if v is None else f"{v:.1%}"


def _row_line(r: dict[str, Any]) -> str:
    def gib(b: Any) -> str:
        return _gib(b, 6)

    mfu = f"{100 * r['mfu']:5.1f}%" if r["mfu"] is not None else "     -"
    tps = f"{r['tokens_per_s_per_gpu']:9.0f}" if r["tokens_per_s_per_gpu"] else "        -"
    return (
        f"  [{r['part']}] {r['model']} seq {r['seq']} mbs {r['mbs']:>2} zero {r['zero']} rc {r['recompute']:<4} "
        f"compile {int(r['compile'])}: {r['status']:<7} tok/s/GPU {tps} MFU {mfu} peak {gib(r['peak_alloc'])} GiB "
        f"predicted {gib(r['predicted'])} GiB kernel {r['kernel'] or '-'}"
    )


def part_a(check: Check) -> None:
    """find-mbs per ZeRO stage (its mbs + 1 run is part (c)), then the found mbs with compile."""
    from scaling.job.run import run_point
    from scaling.recipe.mbs_search import find_mbs

    for stage in STAGES:
        if not check.time_left(60, f"(a) ZeRO-{stage}"):
            return
        cfg = check.config(f"parallel.zero_stage={stage}", "launch.prescreen=false")
        found = find_mbs(cfg, max_mbs=64, traced=False)
        print(f"(a) ZeRO-{stage}: largest mbs {found.mbs} (predicted {found.predicted_mbs}; {found.note})", flush=True)
        for run in found.runs:
            run_cfg = check.config(f"parallel.zero_stage={stage}", f"train.mbs={run['mbs']}", "launch.prescreen=false")
            record = run_point(run_cfg.changed(launch={"rerun": "none"}))  # the stored run
            row = check.add("a", record, run_cfg)
            if run["mbs"] > found.mbs:
                check.expect(
                    row["status"] == Status.OOM,
                    f"(c) ZeRO-{stage} mbs={run['mbs']} ran out of memory but was recorded {row['status']}",
                )
        check.expect(found.mbs >= 1, f"(a) ZeRO-{stage}: not even mbs=1 fits")
        if found.mbs >= 1 and check.time_left(120, f"(a) ZeRO-{stage} with compile"):
            cfg = check.config(
                f"parallel.zero_stage={stage}", f"train.mbs={found.mbs}", "train.compile=true", "launch.prescreen=false"
            )
            row = check.add("a", run_point(cfg), cfg)
            check.expect(row["status"] == Status.OK, f"(a) ZeRO-{stage} mbs={found.mbs} with compile: {row['error']}")


def part_b(check: Check) -> None:
    """Further eager points for the predictor: seq 2048, mbs, recompute and stage varied."""
    from scaling.job.run import run_point

    for mbs, recompute, stage in EXTRA:
        if not check.time_left(25, f"(b) seq 2048 mbs={mbs} recompute={recompute} ZeRO-{stage}"):
            return
        cfg = check.config(
            "train.seq_len=2048", f"train.mbs={mbs}", f"train.recompute={recompute}", f"parallel.zero_stage={stage}"
        )
        row = check.add("b", run_point(cfg), cfg)
        check.expect(row["status"] == Status.OK, f"(b) seq 2048 mbs={mbs} rc={recompute} ZeRO-{stage}: {row['error']}")


def part_c(check: Check) -> None:
    """A device capped below what the point needs: oom, and said so."""
    from scaling.job.run import run_point

    if not check.time_left(30, "(c) capped device"):
        return
    cfg = check.config("train.mbs=8", "hardware.memory_gb=8", "hardware.reserve_gb=0.5", "launch.prescreen=false")
    row = check.add("c", run_point(cfg), cfg)
    check.expect(
        row["status"] == Status.OOM, f"(c) llama_1b mbs=8 on an 8 GiB cap was recorded {row['status']}: {row['error']}"
    )


def part_d(check: Check, devices: int) -> None:
    """ZeRO equivalence on NCCL: dp=2 x grad_acc=2 against dp=1 x grad_acc=4, every stage."""
    from scaling.job.run import run_point

    if devices < 2:
        check.notes.append("(d) skipped: one CUDA device (the ZeRO equivalence on NCCL needs two)")
        return
    for stage in STAGES:
        if not check.time_left(40, f"(d) ZeRO-{stage}"):
            return
        losses = []
        for dp, ga in ((2, 2), (1, 4)):
            cfg = check.config(
                "model=small",
                "train.seq_len=256",
                "train.mbs=2",
                f"parallel.dp={dp}",
                f"train.grad_acc={ga}",
                f"parallel.zero_stage={stage}",
            )
            record = run_point(cfg)
            losses.append((record.get("metrics") or {}).get("losses"))
        same = all(losses) and max(abs(a - b) / abs(b) for a, b in zip(*losses)) <= 1e-2
        check.expect(same, f"(d) ZeRO-{stage}: dp=2 x ga=2 and dp=1 x ga=4 losses differ: {losses}")
        check.notes.append(f"(d) ZeRO-{stage}: losses {'agree' if same else 'DIFFER'} within 1% (bf16)")


OWN_MODEL = ("llama_1b", "hf_llama_1b")
OWN_POINT = ["train.seq_len=4096", "train.mbs=2", "launch.prescreen=false"]
"""(g): the built-in llama_1b and the same shapes from Llama 3.2 1B's Hugging Face config, one point each per setting."""


def part_g(check: Check) -> None:
    """A model the user brings (a Hugging Face config) beside the built-in one of the same shapes."""
    from scaling.job.run import run_point
    from scaling.predictor.trace import TraceError, trace_peak_isolated

    for stage, compile_ in ((0, False), (3, False), (0, True)):
        for model in OWN_MODEL:
            what = f"(g) {model} ZeRO-{stage}{' with compile' if compile_ else ''}"
            if not check.time_left(150 if compile_ else 60, what):
                return
            cfg = check.config(
                f"model={model}", *OWN_POINT, f"parallel.zero_stage={stage}", f"train.compile={str(compile_).lower()}"
            )
            try:
                traced: Optional[int] = trace_peak_isolated(cfg).peak_mem_bytes
            except TraceError as e:
                traced = None
                check.notes.append(f"{what}: no traced prediction ({e})")
            row = check.add("g", run_point(cfg), cfg, predicted=traced)
            row["analytic"] = predict_config(cfg).total_bytes if family_of(cfg.model).closed_form else None
            check.expect(row["status"] == Status.OK, f"{what}: {row['status']} {row['error']}")
            check.own.append(row)


def own_model_table(rows: list[dict[str, Any]]) -> list[str]:
    """(g)'s rows side by side: the model the user brings against the built-in one."""
    lines = [
        "| model | ZeRO | compile | status | tokens/s/GPU | MFU | FLOPs/token | step spread | peak alloc GiB | "
        "traced GiB | error | analytic GiB | attention |",
        "|" + "---|" * 13,
    ]
    for r in rows:
        err = (
            f"{(r['predicted'] - r['peak_alloc']) / r['peak_alloc']:+.1%}" if r["peak_alloc"] and r["predicted"] else ""
        )
        flops = f"{r['flops_per_token'] / 1e9:.3f} G ({r['flops_source']})" if r["flops_per_token"] else ""
        lines.append(
            f"| {r['model']} | {r['zero']} | {int(r['compile'])} | {r['status']} | "
            f"{r['tokens_per_s_per_gpu'] or 0:,.0f} | {_pct(r['mfu'])} | {flops} | {_pct(r['step_spread'])} | "
            f"{_gib(r['peak_alloc'])} | {_gib(r['predicted'])} | {err} | {_gib(r.get('analytic'))} | "
            f"{r['kernel'] or ''} |"
        )
    return lines


SNAPSHOT_POINT = ["train.seq_len=2048", "train.mbs=1", "launch.memory_snapshot=true"]
"""(f): llama_1b at seq 2048, mbs 1, bf16, dp=1, at ZeRO-0 and ZeRO-1, with the allocator's history recorded."""


def _site(frames: list[dict[str, Any]]) -> str:
    """Where an allocation was made: its innermost Python frame and its innermost frame in this project."""
    py = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    ours = [f for f in py if "/scaling/" in str(f["filename"])]

    def name(f: dict[str, Any]) -> str:
        path = str(f["filename"]).split("site-packages/")[-1]
        path = "scaling/" + path.split("/scaling/")[-1] if "/scaling/" in path else path
        return f"{path}:{f.get('line')} {f.get('name')}"

    return " < ".join(dict.fromkeys(name(f) for f in (py[:1] + ours[:1]))) or "(no Python frame)"


def snapshot_at_peak(snapshot: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """From a `torch.cuda.memory._snapshot()` (a launch.memory_snapshot pickle): the most bytes allocated at once over
    the recorded events, and what was allocated then, summed by allocation site (`_site`)."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            action, addr = event.get("action"), event.get("addr")
            if action == "alloc":
                live[addr] = (int(event.get("size", 0)), _site(event.get("frames") or []))
                total += live[addr][0]
                if total > peak:
                    peak, at_peak = total, dict(live)
            elif action in ("free_requested", "free_completed") and addr in live:
                total -= live.pop(addr)[0]
    sites: dict[str, int] = {}
    for size, site in at_peak.values():
        sites[site] = sites.get(site, 0) + size
    return peak, sites


def snapshot_difference(base: dict[str, int], other: dict[str, int], top: int = 6) -> list[tuple[str, int]]:
    """The allocation sites whose bytes at the peak differ most between two `snapshot_at_peak` breakdowns."""
    diff = {site: other.get(site, 0) - base.get(site, 0) for site in set(base) | set(other)}
    return sorted(((s, d) for s, d in diff.items() if d), key=lambda sd: -abs(sd[1]))[:top]


def part_f(check: Check) -> None:
    """ZeRO-0 and ZeRO-1 at dp=1 with the allocator's history: what ZeRO-1 holds at its peak that ZeRO-0 does not."""
    import pickle

    from scaling.engine.jobfiles import MEMORY_SNAPSHOT_FILE
    from scaling.job.run import run_point
    from scaling.store.record import job_dir, launch_dir

    breakdowns = {}
    for stage in (0, 1):
        if not check.time_left(60, f"(f) ZeRO-{stage} with the allocator's history"):
            return
        cfg = check.config(*SNAPSHOT_POINT, f"parallel.zero_stage={stage}")
        record = run_point(cfg)
        row = check.add("f", record, cfg)
        # only this launch's snapshot (in the directory of its own that the record names), of this user's: a pickle
        # someone else could have written is not loaded
        launch = launch_dir(job_dir(check.sweep_dir, row["key"]), record)
        path = launch / MEMORY_SNAPSHOT_FILE if launch is not None else None
        ours = path is not None and path.is_file() and not path.is_symlink() and path.stat().st_uid == os.getuid()
        check.expect(ours, f"(f) ZeRO-{stage}: no {MEMORY_SNAPSHOT_FILE} of this launch ({row['status']})")
        if ours:
            breakdowns[stage] = snapshot_at_peak(pickle.loads(path.read_bytes()))
            check.notes.append(f"(f) ZeRO-{stage}: allocator history in {path}")
    if len(breakdowns) == 2:
        (peak0, sites0), (peak1, sites1) = breakdowns[0], breakdowns[1]
        check.snapshot = [
            f"Most allocated at once over the build and warm-up: ZeRO-0 {peak0 / GIB:.2f} GiB, "
            f"ZeRO-1 {peak1 / GIB:.2f} GiB ({(peak1 - peak0) / GIB:+.2f} GiB). Allocation sites whose bytes at the "
            "peak differ most (ZeRO-1 minus ZeRO-0):",
            "",
            *[f"- {d / GIB:+.3f} GiB  `{site}`" for site, d in snapshot_difference(sites0, sites1)],
        ]


RECIPE = [
    "--gbs-tokens=1Mi",
    "--gpus=1,8,64,256,512",
    "--zero=0,3",
    "--recompute=none",
    "--max-grad-acc=4",
    "model=llama_1b",
    "train.seq_len=4096",
    "train.precision=bf16",
    "train.warmup_steps=2",
    "train.steps=5",
    "logger=none",
    "launch.timeout_s=300",
]
"""(e): the recipe of llama_1b on the device at hand."""


def part_e(check: Check) -> None:
    """`scaling recipe` for llama_1b on this machine's GPUs; its recipe.md goes on the page."""
    from scaling.cli.recipe import main as recipe
    from scaling.recipe.answer import RECIPE_MD

    if not check.time_left(240, "(e) the recipe of llama_1b"):
        return
    out = check.sweep_dir / "recipe"
    code = recipe([*RECIPE, f"hardware={check.hardware}", f"--sweep-dir={out}"])
    check.expect(code == 0, f"(e) scaling recipe exited {code}")
    if (out / RECIPE_MD).exists():
        check.recipe = (out / RECIPE_MD).read_text()


def summary(check: Check, device: str) -> list[str]:
    """The Markdown page."""
    measured = [r for r in check.rows if r["status"] == Status.OK and r["peak_alloc"] and r["part"] != "g"]
    errors = {
        kind: [abs(r["predicted"] - r["peak_alloc"]) / r["peak_alloc"] for r in measured if bool(r["compile"]) == c]
        for kind, c in (("eager", False), ("compiled", True))
    }
    big = [
        r
        for r in check.rows
        if r["status"] == Status.OK and r["seq"] == 4096 and r["mfu"] is not None and r["model"] == "llama_1b"
    ]
    best = max(big, key=lambda r: r["mfu"], default=None)
    lines = [
        f"# GPU check: {device}",
        "",
        f"`python benchmarks/gpu_check.py` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| part | seq | mbs | ZeRO | recompute | compile | status | tokens/s/GPU | MFU | step spread | "
        "peak alloc GiB | reserved GiB | device used GiB | build peak GiB | predicted GiB | error | attention | "
        "compile s |",
        "|" + "---|" * 18,
    ]
    gib, pct = _gib, _pct
    for r in (r for r in check.rows if r["part"] != "g"):
        err = (
            f"{(r['predicted'] - r['peak_alloc']) / r['peak_alloc']:+.1%}"
            if r["peak_alloc"] and r["status"] == Status.OK
            else ""
        )
        compile_s = "" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        lines.append(
            f"| {r['part']} | {r['seq']} | {r['mbs']} | {r['zero']} | {r['recompute']} | {int(r['compile'])} | "
            f"{r['status']} | {r['tokens_per_s_per_gpu'] or 0:,.0f} | {pct(r['mfu'])} | {pct(r['step_spread'])} | "
            f"{gib(r['peak_alloc'])} | {gib(r['peak_reserved'])} | {gib(r['device_used'])} | {gib(r['build_peak'])} | "
            f"{gib(r['predicted'])} | {err} | {r['kernel'] or ''} | {compile_s} |"
        )
    lines += ["", "## Targets", ""]
    if best is not None:
        lines.append(
            f"- MFU of llama_1b bf16 seq 4096: best {best['mfu']:.1%} (ZeRO-{best['zero']}, mbs {best['mbs']}, "
            f"compile {int(best['compile'])}); target >= {MFU_TARGET:.0%}: "
            f"{'met' if best['mfu'] >= MFU_TARGET else 'NOT met'}."
        )
    for kind, errs in errors.items():
        if not errs:
            continue
        med, top = statistics.median(errs), max(errs)
        met = med <= PREDICTOR_TARGET and top <= PREDICTOR_LARGEST
        lines.append(
            f"- Memory predictor (analytic) against max_memory_allocated on {len(errs)} {kind} points: median "
            f"|error| {med:.1%}, largest {top:.1%}; target median <= {PREDICTOR_TARGET:.0%}, largest <= "
            f"{PREDICTOR_LARGEST:.0%}: {'met' if met else 'NOT met'}."
        )
    lines += ["", "## Checks", ""] + [f"- FAILED: {f}" for f in check.failures] + [f"- {n}" for n in check.notes]
    if not check.failures:
        lines.append("- every correctness check passed (OOM points classified oom, every ok point ran).")
    if check.snapshot:
        lines += ["", "## (f) What ZeRO-1 holds over ZeRO-0 at dp=1 (the allocator's history)", "", *check.snapshot]
    if check.own:
        lines += ["", "## (g) A Hugging Face config against the built-in model of the same shapes", ""]
        lines += own_model_table(check.own)
    if check.recipe:
        lines += ["", "## (e) The recipe of llama_1b on this machine", ""]
        lines += ["#" + line if line.startswith("# ") else line for line in check.recipe.splitlines()]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the check; exit 0 when every correctness check passed, 1 otherwise or without CUDA."""
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=560.0, help="wall-clock budget; later parts are skipped past it")
    p.add_argument("--out", type=Path, default=HERE / "gpu", help="folder of the <device>.md page")
    p.add_argument("--sweep-dir", type=Path, default=Path("runs/gpu-check"), help="where the points' records go")
    p.add_argument("--parts", default="a,b,c,d,f,g,e", help="which parts to run, in this order, e.g. a,c")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        planned = _planned_configs()
        for cfg in planned:
            validate(cfg)
        print(
            f"gpu-check: composed and validated {len(planned)} planned points (analytic peaks "
            f"{min(predict_config(c).total_bytes for c in planned) / GIB:.1f}-"
            f"{max(predict_config(c).total_bytes for c in planned) / GIB:.1f} GiB per rank)"
        )
        print(
            "gpu-check: no CUDA device found (torch.cuda.is_available() is False): nothing was measured; "
            "run this on a machine with an NVIDIA GPU",
            file=sys.stderr,
        )
        return 1
    device = torch.cuda.get_device_name(0)
    check = Check(profile_for(device), a.sweep_dir.resolve(), a.budget_s)
    parts: dict[str, Callable[[], None]] = {
        "a": lambda: part_a(check),
        "b": lambda: part_b(check),
        "c": lambda: part_c(check),
        "d": lambda: part_d(check, torch.cuda.device_count()),
        "e": lambda: part_e(check),
        "f": lambda: part_f(check),
        "g": lambda: part_g(check),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    page = a.out / f"{device.replace(' ', '_')}.md"
    for name in a.parts.split(","):
        parts[name]()
        page.write_text("\n".join(summary(check, device)) + "\n")  # after each part: a run cut short keeps its rows
    print("\n".join(summary(check, device)[-8:]))
    print(f"gpu-check: wrote {page}")
    return 1 if check.failures else 0


def _planned_configs() -> list[dict[str, Any]]:
    """The points parts (a), (b) and (f) start from, on the H100 profile (for the CPU dry run)."""
    check = Check("h100", Path("runs/gpu-check"), 0)
    return (
        [check.config(f"parallel.zero_stage={z}", "train.mbs=1") for z in STAGES]
        + [
            check.config("train.seq_len=2048", f"train.mbs={m}", f"train.recompute={rc}", f"parallel.zero_stage={z}")
            for m, rc, z in EXTRA
        ]
        + [check.config(*SNAPSHOT_POINT, f"parallel.zero_stage={z}") for z in (0, 1)]
    )


if __name__ == "__main__":
    sys.exit(main())
