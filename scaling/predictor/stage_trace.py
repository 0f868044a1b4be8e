"""Traced memory of pipeline stages: each stage of the built-in model run on fake tensors under torch's memory tracker,
in its schedule's order, to check the analytic stage peaks (scaling.predictor.stage_memory) against.

A stage is the model's own modules for it (the blocks of scaling.core.stages.split_blocks, by
scaling.predictor.stage_memory.stage_blocks; the embedding with the first stage, the final norm, the head and the loss
with the last); its input is a received activation (mbs, seq, hidden) that keeps its gradient, its output's gradient
a received one. GPipe runs every forward, then every backward; 1F1B warms up min(pp − s, m) forwards, then one
backward and one forward alternately, then the rest of the backwards (torch's Schedule1F1B); then AdamW steps. Two
steps, the second tracked. One rank at dp 1 and tp 1, ZeRO-0, eager, no communication: the engine's stages
(torch.distributed.pipelining) are not what runs here, so this traces the arithmetic's assumptions, not the engine.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from scaling.core.enums import PipelineSchedule, Precision, ZeroStage
from scaling.core.schema import ExperimentConfig
from scaling.predictor.stage_memory import stage_blocks


def _order(schedule: PipelineSchedule | str, pp: int, rank: int, m: int) -> Iterator[tuple[str, int]]:
    """("F" or "B", micro-batch) in the order stage `rank` runs them (GPipe or 1F1B)."""
    warmup = m if PipelineSchedule(schedule) == PipelineSchedule.gpipe else min(pp - rank, m)
    forward = backward = 0
    for _ in range(warmup):
        yield "F", forward
        forward += 1
    while forward < m:
        yield "B", backward
        backward += 1
        yield "F", forward
        forward += 1
    while backward < m:
        yield "B", backward
        backward += 1


def trace_stage_peaks(cfg: ExperimentConfig, grad_acc: int) -> list[int]:
    """Each stage's peak live bytes, first to last, of a pp > 1 point of the built-in family at dp 1, tp 1 and ZeRO-0
    under GPipe or 1F1B (ValueError otherwise), traced on fake tensors."""
    from scaling.model.llama.args import ModelArgs

    par, train = cfg.parallel, cfg.train
    schedule = PipelineSchedule(par.pp_schedule)
    if par.layout.world_size != par.pp or par.zero_stage != ZeroStage.NONE:
        raise ValueError("the traced stages are one rank's at dp 1, tp 1 and ZeRO-0")
    if schedule not in (PipelineSchedule.gpipe, PipelineSchedule.one_f_one_b):
        raise ValueError(f"parallel.pp_schedule={schedule}: the traced stages run gpipe and one_f_one_b")
    args = ModelArgs.of(cfg.model)
    ranges = stage_blocks(args, train.seq_len, par.pp)
    return [_trace_stage(args, train, schedule, par.pp, rank, blocks, grad_acc) for rank, blocks in enumerate(ranges)]


def _trace_stage(
    args: Any, train: Any, schedule: PipelineSchedule, pp: int, rank: int, blocks: range, grad_acc: int
) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scaling.engine.memtrack import tracked_step
    from scaling.model.llama.decoder import Transformer, rope_cos_sin

    first, last = rank == 0, rank == pp - 1
    mbs, T, h = train.mbs, train.seq_len, args.hidden
    bf16 = train.precision == Precision.bf16
    with FakeTensorMode():
        model = Transformer(args, train.recompute)
        model.set_recompute(train.recompute, train.recompute_every)
        keep = [model.layers[i] for i in blocks]
        stage = torch.nn.ModuleList(
            [*([model.tok_embeddings] if first else []), *keep, *([model.norm, model.output] if last else [])]
        )
        optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-4, fused=False)
        cos, sin = rope_cos_sin(T, args.hd, args.rope_theta, torch.device("cpu"))

        def forward(held: list) -> None:
            # the first stage's tokens; elsewhere the received activation, which keeps its gradient
            x = torch.randint(0, args.vocab_size, (mbs, T)) if first else torch.empty(mbs, T, h, requires_grad=True)
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                y = model.tok_embeddings(x) if first else x
                for layer in keep:
                    y = layer(y, cos, sin)
                if last:
                    logits = model.output(model.norm(y))
                    y = F.cross_entropy(logits.float().flatten(0, 1), torch.zeros(mbs * T, dtype=torch.long))
            held.append((x, y))

        def backward(held: list, k: int) -> None:
            _, y = held[k]
            if last:
                (y / grad_acc).backward()
            else:
                y.backward(torch.empty_like(y))  # the gradient received from the next stage
            held[k] = None  # its activations and its input's gradient go (sent on)

        def step(before_forward: Callable[[], None] = lambda: None) -> None:
            held: list = []
            for kind, k in _order(schedule, pp, rank, grad_acc):
                if kind == "F":
                    before_forward()  # the tracker's module stats allow one forward per module
                    forward(held)
                else:
                    backward(held, k)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        with tracked_step(stage, optimizer, False, None) as peak:
            step(peak.new_micro_step)
    return int(peak.peak_bytes)
