"""What the recipe measures: each candidate at the fewest GPUs it fits on and at all the devices at hand, for every
mbs a requested GPU count needs (at most `max_grad_acc` micro-steps a point), each an ordinary record of the sweep
directory, so a second call measures nothing new and a killed call resumes. `Launcher` runs the points and counts
which it launched and which the store answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from scaling.core.enums import Status
from scaling.core.schema import ExperimentConfig
from scaling.job.run import run_point
from scaling.recipe.candidates import candidate_point
from scaling.recipe.options import Candidate, split
from scaling.store.read import RecordError, read_record
from scaling.store.record import answers, job_key


@dataclass
class Launcher:
    """Runs points through scaling.job.run.run_point and counts which it launched and which the store answered."""

    launched: int = 0
    answered: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, cfg: ExperimentConfig) -> dict[str, Any]:
        key = job_key(cfg)
        try:
            stored = read_record(Path(cfg.sweep_dir).resolve(), key)
        except RecordError:
            stored = None  # run_point sets a corrupt one aside, or leaves an unreadable one and does not run it
        if answers(stored, key, cfg.launch):
            self.answered += 1
        else:
            self.launched += 1
        record = run_point(cfg)
        self.records.append(record)
        return record


def measure_candidates(
    cfg: ExperimentConfig,
    candidates: Sequence[Candidate],
    gbs_samples: int,
    gpus: Sequence[int],
    at_hand: int,
    max_grad_acc: int,
    launch: Launcher,
) -> list[Candidate]:
    """Throughput of each candidate from the fewest GPUs it fits on (one node first) to all at hand, for each mbs a
    requested GPU count needs. A point planned to fit that runs out of memory (the caching allocator's fragmentation,
    say, which no predictor sees) rules its mbs out there and at fewer GPUs, and the candidate is measured again at
    what is left: the candidates as measured."""
    measured = []
    for c in candidates:
        for _ in range(MOST_CONTRADICTIONS):
            oom = _measure(cfg, c, gbs_samples, sorted({1, *gpus}), at_hand, max_grad_acc, launch)
            if oom is None:
                break
            mbs, world, grad_acc = oom
            c = c.without(mbs, world, f"grad_acc {grad_acc}")
        measured.append(c)
    return measured


MOST_CONTRADICTIONS = 4
"""How many times one candidate's planned mbs may run out of memory before the recipe measures it no further."""


def _measure(
    cfg: ExperimentConfig,
    c: Candidate,
    gbs_samples: int,
    counts: list[int],
    at_hand: int,
    max_grad_acc: int,
    launch: Launcher,
) -> Optional[tuple[int, int, int]]:
    """Run one candidate's points; the (mbs, GPUs, grad_acc) of the first that ran out of memory, or None."""
    seq_len = cfg.train.seq_len
    at = sorted({c.fit_gpus, at_hand}) if c.fit_gpus is not None and at_hand >= c.fit_gpus else []
    for mbs in sorted({s.mbs for n in counts if (s := c.split_at(gbs_samples, seq_len, n))}):
        for layout in (c.at(g) for g in at if c.mbs_for(g) >= mbs):
            s = split(gbs_samples, seq_len, layout.dp, mbs) if layout is not None else None
            if s is None or s.mbs != mbs:
                continue
            grad_acc = min(s.grad_acc, max_grad_acc)
            if launch(candidate_point(cfg, c, mbs, layout.dp, grad_acc)).get("status") == Status.OOM:
                return mbs, layout.world_size, grad_acc
    return None
