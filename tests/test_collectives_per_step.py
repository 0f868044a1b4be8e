"""The step model against the engine: the collectives one optimizer step issues at dp=2 (op, calls, bytes of each),
counted by torch's profiler (tests/helpers/collective_counts.py), are those `scaling.perf.step_model.step_collectives`
lists, for every ZeRO stage, fsdp_grad_reduce and grad_acc, with clipping; and at dp=4 sharded over groups of 2
(hybrid sharding) and at dp=2 × tp=2. Every case is counted in one torchrun launch of 4 ranks, which the tests read."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from scaling.core.schema import ExperimentConfig
from scaling.core.validate import validate
from scaling.launch import agents
from scaling.launch.torchrun import job_env, kill_tree, torchrun_argv
from scaling.perf.step_model import EVERY, LAST, step_collectives
from tests.helpers.compose import REPO, compose_point, workload_of

pytestmark = pytest.mark.torchrun  # its points run on torchrun ranks (the session's point store)

DP = 2
CASES = [
    (stage, reduce, grad_acc, "fp32")
    for stage in (0, 1, 2, 3)
    for reduce in ((EVERY,) if stage <= 1 else (EVERY, LAST))
    for grad_acc in (1, 4)
] + [(1, EVERY, 4, "bf16"), (3, EVERY, 4, "bf16")]
"""(zero_stage, fsdp_grad_reduce, grad_acc, precision). bf16: DDP's buckets and ZeroRedundancyOptimizer's
broadcasts stay fp32, FSDP2 gathers bf16 parameters and reduce-scatters fp32 gradients."""


HYBRID = [(stage, EVERY, 2, "fp32") for stage in (1, 2, 3)] + [(3, LAST, 2, "bf16")]
"""The same at dp=4, dp_shard=2: gathers and reduce-scatters within the pair, each shard all-reduced across the two
pairs, ZeRO-1's broadcasts within the pair."""


def _config(stage: int, reduce: str, grad_acc: int, precision: str, *more: str) -> ExperimentConfig:
    """The tiny model at dp=2 (unless `more` says otherwise), mbs 1, seq_len 16, clipped (grad_clip's default)."""
    cfg = compose_point(
        [
            "model=tiny",
            "logger=none",
            f"parallel.dp={DP}",
            f"parallel.zero_stage={stage}",
            f"parallel.fsdp_grad_reduce={reduce}",
            f"train.grad_acc={grad_acc}",
            "train.mbs=1",
            "train.seq_len=16",
            f"train.precision={precision}",
            *more,
        ]
    )
    return cfg


def _assumed(cfg: ExperimentConfig) -> dict[str, list[int]]:
    """{op: sorted bytes of each call} of one step as the step model lists it for this config."""
    grad_acc = validate(cfg, host=False).grad_acc
    w = workload_of(cfg, grad_acc)
    calls: dict[str, list[int]] = defaultdict(list)
    for c in step_collectives(w, cfg.parallel.dp, grad_acc):
        calls[c.op] += [round(c.bytes_per_call)] * c.count
    return {op: sorted(sizes) for op, sizes in sorted(calls.items())}


def _show(calls: dict[str, list[int]]) -> str:
    """`all_gather 3× (1× 131200 B, 2× 98560 B)`, op by op."""
    return "; ".join(
        f"{op} {len(sizes)}× ({', '.join(f'{k}× {size} B' for size, k in sorted(Counter(sizes).items()))})"
        for op, sizes in calls.items()
    )


TENSOR_PARALLEL = [(3, EVERY, 2, "fp32"), (2, EVERY, 2, "bf16")]
"""The same at dp=2, tp=2: each block's activations all-reduced over the pair (twice forward, twice backward),
the embedding's and the head's too, the logits gathered; FSDP2's collectives over the dp ranks of each half."""


@pytest.fixture(scope="module")
def cases() -> dict[str, dict[str, ExperimentConfig]]:
    """The cases by test: dp=2 ("dp"), and hybrid sharding and tensor parallelism over 4 ranks ("four")."""
    hybrid = ("parallel.dp=4", "parallel.dp_shard=2", "hardware.oversubscribe=true")
    tp = ("parallel.dp=2", "parallel.tp=2", "hardware.oversubscribe=true")
    four = {f"hybrid zero{s}/{r}/grad_acc={g}/{p}": _config(s, r, g, p, *hybrid) for s, r, g, p in HYBRID}
    four.update({f"tp=2 zero{s}/{r}/grad_acc={g}/{p}": _config(s, r, g, p, *tp) for s, r, g, p in TENSOR_PARALLEL})
    dp = {f"zero{s}{'' if s <= 1 else '/' + r}/grad_acc={g}/{p}": _config(s, r, g, p) for s, r, g, p in CASES}
    return {"dp": dp, "four": four}


@pytest.fixture(scope="module")
def issued(cases, tmp_path_factory) -> dict[str, dict[str, list[int]]]:
    """{case: {op: sorted bytes of each call}} as the engine issued them: one torchrun launch of 4 ranks counts the
    4-rank cases, then its first 2 ranks the dp=2 cases (tests/helpers/collective_counts.py)."""
    tmp = tmp_path_factory.mktemp("collectives")
    configs = {name: cfg for group in cases.values() for name, cfg in group.items()}
    listed, counted = tmp / "cases.json", tmp / "counted.json"
    listed.write_text(json.dumps([{"name": name, "config": cfg.to_dict()} for name, cfg in configs.items()]))
    # Through the points' own launcher: its ranks forked from this process's agent server (their imports made once,
    # 14 s of CPU less than a fresh torchrun's), the repository in front of its module path (a project's is so).
    argv = torchrun_argv("tests.helpers.collective_counts", [str(listed), str(counted)], 4)
    with open(tmp / "torchrun.log", "wb") as log:
        agent = agents.start(argv, {**job_env(1, None, False), "PYTHONPATH": str(REPO)}, log)
        try:
            code = agent.wait(timeout=300)
        finally:
            if agent.poll() is None:
                kill_tree(agent)
    assert code == 0, (tmp / "torchrun.log").read_text()[-3000:]
    return json.loads(counted.read_text())


def _wrong(configs: dict[str, ExperimentConfig], issued: dict[str, dict[str, list[int]]]) -> list[str]:
    """Each case whose step issued other collectives than the step model lists, in words."""
    return [
        f"{name}: the engine issued {_show(issued[name])}\n    the step model assumes {_show(_assumed(cfg))}"
        for name, cfg in configs.items()
        if issued[name] != _assumed(cfg)
    ]


def test_each_step_issues_what_the_step_model_lists(cases, issued):
    wrong = _wrong(cases["dp"], issued)
    assert not wrong, "\n".join(wrong)


def test_each_hybrid_and_tensor_parallel_step_issues_what_the_step_model_lists(cases, issued):
    wrong = _wrong(cases["four"], issued)
    assert not wrong, "\n".join(wrong)
