"""FLOPs formulas against torch's FlopCounterMode, MFU/HFU arithmetic, and the peak-FLOP/s lookup and cache.

Why the counted runs force the MATH attention backend: FlopCounterMode has no formula for the
fused CPU kernel (`aten._scaled_dot_product_flash_attention_for_cpu`), so with the default
kernel it counts attention as 0 FLOPs. Its formulas for the fused GPU kernels count the full
seq x seq score matrix in forward (not halved for the causal mask, as here), but 5 matmuls in
backward (flash recomputes the scores) where the PaLM convention has 4. The MATH backend runs
attention as plain matmuls over the full seq x seq scores, masked afterwards, which
FlopCounterMode counts op by op: exactly what the PaLM convention describes, with no adjustment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from scaling.core.schema import HardwareConfig
from scaling.engine import peak_flops
from scaling.model.llama import flops
from scaling.model.llama.args import ModelArgs
from scaling.model.llama.decoder import Transformer

CONF = Path(__file__).resolve().parents[1] / "conf"


def load(group: str, name: str) -> dict:
    return {k: v for k, v in yaml.safe_load((CONF / group / f"{name}.yaml").read_text()).items() if k != "defaults"}


def counted_flops_per_token(args: ModelArgs, seq_len: int, recompute: str) -> float:
    """FLOPs FlopCounterMode sees in one forward + backward (cross-entropy loss), per token."""
    model = Transformer(args, recompute=recompute)
    model.init_weights(0)
    batch = 2
    tokens = torch.randint(0, args.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return counter.get_total_flops() / (batch * seq_len)


WIDE_HEADS = {"head_dim": 32}
"""tiny's 4 heads twice as wide as hidden / n_heads: the q and o projections and the attention are 128 wide, not 64."""


@pytest.mark.parametrize("name, seq_len, extra", [("tiny", 64, {}), ("small", 128, {}), ("tiny", 64, WIDE_HEADS)])
def test_flops_per_token_matches_flop_counter(name, seq_len, extra):
    args = ModelArgs.from_dict({**load("model", name), **extra})
    counted = counted_flops_per_token(args, seq_len, recompute="none")
    assert flops.flops_per_token(args, seq_len) == pytest.approx(counted, rel=0.02)
    assert flops.hardware_flops_per_token(args, seq_len, recompute="none") == flops.flops_per_token(args, seq_len)


@pytest.mark.parametrize("name, seq_len, extra", [("tiny", 64, {}), ("small", 128, {}), ("tiny", 64, WIDE_HEADS)])
def test_hardware_flops_with_recompute_match_flop_counter(name, seq_len, extra):
    args = ModelArgs.from_dict({**load("model", name), **extra})
    counted = counted_flops_per_token(args, seq_len, recompute="full")
    assert flops.hardware_flops_per_token(args, seq_len, recompute="full") == pytest.approx(counted, rel=0.02)
    assert counted > flops.flops_per_token(args, seq_len) * 1.1  # the blocks' forward really ran twice


def test_selective_recompute_runs_no_matmul_twice():
    """train.recompute=selective keeps every matmul and attention output: the counter sees the FLOPs of no
    recomputation (its HFU is its MFU), where full recomputation runs the checkpointed blocks' matmuls again."""
    args = ModelArgs.from_dict(load("model", "tiny"))
    counted = counted_flops_per_token(args, 64, recompute="selective")
    assert counted == pytest.approx(counted_flops_per_token(args, 64, recompute="none"), rel=1e-9)
    assert flops.hardware_flops_per_token(args, 64, "selective") == flops.flops_per_token(args, 64)
    half = flops.flops_per_token(args, 64) + flops.recomputed_flops_per_token(args, 64) / 2  # 1 block of 2 at full
    assert flops.hardware_flops_per_token(args, 64, "full", every=2) == pytest.approx(half)


def test_flops_per_token_formula_by_hand():
    # tiny: per block q,o 64·64 each, k,v 64·32 each, w1,w2,w3 64·192 each; output 64·512.
    args = ModelArgs.from_dict(load("model", "tiny"))
    n_matmul = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192) + 64 * 512
    assert flops.flops_per_token(args, 100) == 6 * n_matmul + 12 * 2 * 64 * 100


def test_mfu_and_hfu_arithmetic():
    # A 1B-class model at 6 GFLOP/token doing 25k tokens/s on a 989 TFLOP/s device: 15.2 %.
    assert peak_flops.mfu(6e9, 25_000.0, 989e12) == pytest.approx(0.151668, rel=1e-5)
    assert peak_flops.hfu(8e9, 25_000.0, 989e12) == pytest.approx(0.202224, rel=1e-5)
    with pytest.raises(ValueError, match="peak_flops_per_s=0"):
        peak_flops.mfu(6e9, 25_000.0, 0.0)


@pytest.mark.parametrize(
    "hardware, precision, expected", [("h100", "bf16", 989e12), ("h100", "fp32", 67e12), ("a100", "bf16", 312e12)]
)
def test_peak_flops_come_from_the_hardware_config(hardware, precision, expected):
    peak = peak_flops.resolve_peak_flops(HardwareConfig(**load("hardware", hardware)), precision)
    assert peak == peak_flops.PeakFlops(expected, "config")


def test_bad_precision_and_unmeasurable_device_are_rejected():
    with pytest.raises(ValueError, match=r"train.precision='fp16'.*\['bf16', 'fp32'\]"):
        peak_flops.resolve_peak_flops(HardwareConfig(**load("hardware", "h100")), "fp16")
    with pytest.raises(ValueError, match="hardware.peak_tflops_bf16 is null for device='cuda'"):
        peak_flops.resolve_peak_flops(HardwareConfig(device="cuda", peak_tflops_bf16=None), "bf16")


@pytest.mark.slow
def test_cpu_peak_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALING_CACHE_DIR", str(tmp_path))
    cpu = HardwareConfig(**load("hardware", "cpu"))
    threads_before = torch.get_num_threads()

    cores_before = os.sched_getaffinity(0)
    first = peak_flops.resolve_peak_flops(cpu, "fp32")
    assert first.source == "measured" and first.flops_per_s > 1e8
    assert first.measured_at and 0 <= first.spread < 1  # when, and how far the median repeat fell below the best
    assert torch.get_num_threads() == threads_before and os.sched_getaffinity(0) == cores_before
    entries = json.loads((tmp_path / peak_flops.CACHE_FILE).read_text())
    key = peak_flops.cache_key("fp32", 1)
    assert entries[key]["flops_per_s"] == first.flops_per_s

    second = peak_flops.resolve_peak_flops(cpu, "fp32")
    assert second == peak_flops.PeakFlops(first.flops_per_s, "cache", first.measured_at, first.spread)

    # The cache file is what answers: a value written there is returned as is.
    entries[key]["flops_per_s"] = 1234.0
    (tmp_path / peak_flops.CACHE_FILE).write_text(json.dumps(entries))
    assert peak_flops.resolve_peak_flops(cpu, "fp32").flops_per_s == 1234.0

    # A peak timed another way (before the key named the kernel, `torch.mm`: a bf16 peak ~7x too low) is not read.
    assert key.endswith(f"|{peak_flops.PEAK_KERNEL}")
    timed_by_mm = key.rsplit("|", 1)[0].replace("fp32", "bf16")
    entries = {timed_by_mm: {"flops_per_s": 1.0}, key: entries[key]}
    (tmp_path / peak_flops.CACHE_FILE).write_text(json.dumps(entries))
    # Another dtype is another measurement, added beside the first (and the entry timed the old way, left as it was).
    assert peak_flops.resolve_peak_flops(cpu, "bf16").source == "measured"
    assert set(json.loads((tmp_path / peak_flops.CACHE_FILE).read_text())) == {
        timed_by_mm,
        key,
        peak_flops.cache_key("bf16", 1),
    }
