"""Training data: step t's global batch is a function of (seed, t), whatever the split."""

from __future__ import annotations

import torch

from scaling.engine.data import GlobalBatch, step_batches, to_device


def test_rows_do_not_depend_on_the_split():
    data = GlobalBatch(vocab_size=100, seq_len=8, seed=3)
    whole = data.rows(step=5, first=0, count=8)  # (8, 9)
    # dp=2, grad_acc=2, mbs=2: rank 1's second micro-step holds rows 6-7 of the same global batch
    built = data.rows_built
    micro_batches = step_batches(data, 5, dp_rank=1, mbs=2, grad_acc=2)
    assert data.rows_built - built == 4 and len(micro_batches) == 2  # the step's rows, built ahead of it
    inputs, targets = to_device(micro_batches[1], torch.device("cpu"))
    assert torch.equal(inputs, whole[6:8, :-1]) and torch.equal(targets, whole[6:8, 1:])
    assert not torch.equal(data.rows(6, 0, 8), whole)  # another step, other samples
    assert not torch.equal(GlobalBatch(100, 8, seed=4).rows(5, 0, 8), whole)  # another seed too
    assert int(whole.max()) < 100 and int(whole.min()) >= 0


def test_token_file_windows_are_memory_mapped_and_deterministic(tmp_path):
    tokens = torch.arange(40_000, 41_000, dtype=torch.int32)  # above 2^15: read back as uint16, not int16
    path = tmp_path / "tokens.bin"
    tokens.numpy().astype("uint16").tofile(path)
    data = GlobalBatch(vocab_size=65536, seq_len=16, seed=0, source="file", path=str(path), dtype="uint16")
    row = data.row(step=2, row=7)
    start = int(row[0])
    assert 40_000 <= start <= 41_000 - 17
    assert torch.equal(row, torch.arange(start, start + 17))  # one contiguous window of the file
    assert torch.equal(data.row(2, 7), row)
    assert not torch.equal(data.row(3, 7), row)
