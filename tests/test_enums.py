"""The enums (scaling/core/enums.py): members are their plain values wherever records, reports and
messages meet them, and the status sets partition the statuses as the resume rule and the forecast need."""

from __future__ import annotations

import json

import pandas as pd

from analysis.collect import STATUS_ORDER, to_frame
from scaling.core.enums import FINAL, LAUNCHED, FsdpGradReduce, Precision, Recompute, Status, ZeroStage


def test_members_format_and_serialise_as_their_plain_values():
    assert [f"{s}" for s in Status] == ["ok", "oom", "predicted_oom", "timeout", "failed", "invalid"]
    assert [str(p) for p in Precision] == ["fp32", "bf16"] and [str(r) for r in Recompute] == [
        "none",
        "selective",
        "full",
    ]
    assert f"{FsdpGradReduce.last_micro_step}" == "last_micro_step"
    assert [f"{z}" for z in ZeroStage] == ["0", "1", "2", "3"] and str(ZeroStage.PARAMETERS) == "3"
    record = {"status": Status.PREDICTED_OOM, "precision": Precision.bf16, "zero_stage": ZeroStage(2)}
    assert json.loads(json.dumps(record, indent=1)) == {"status": "predicted_oom", "precision": "bf16", "zero_stage": 2}
    assert json.dumps({Status.OK: 1}) == '{"ok": 1}'


def test_a_plain_value_from_disk_equals_and_finds_its_member():
    assert Status.OK == "ok" and "ok" in FINAL and {"ok": 1}[Status.OK] == 1
    assert Status("timeout") is Status.TIMEOUT and ZeroStage.GRADIENTS == 2 and "bf16" in tuple(Precision)
    assert "fp16" not in tuple(Precision) and 5 not in tuple(ZeroStage)


def test_final_and_launched_split_the_statuses():
    assert set(Status) == FINAL | LAUNCHED
    assert {Status.OK, Status.OOM} == FINAL & LAUNCHED  # measured: final, and they ran torchrun
    assert Status.PREDICTED_OOM not in LAUNCHED and Status.INVALID not in LAUNCHED  # never started a process
    assert Status.FAILED not in FINAL and Status.TIMEOUT not in FINAL  # retried with launch.rerun=failed


def test_the_status_category_holds_plain_strings():
    df = to_frame([{"status": Status.OOM}, {"status": "ok"}])
    categories = list(df["status"].cat.categories)
    assert categories == STATUS_ORDER == [s.value for s in Status] and all(type(c) is str for c in categories)
    assert df["status"].cat.ordered and list(df["status"].astype(str)) == ["oom", "ok"]
    counts = df["status"].value_counts().reindex(STATUS_ORDER, fill_value=0)
    assert all(type(s) is str for s in counts.index) and counts["ok"] == 1
    assert isinstance(df, pd.DataFrame) and df["status"].isin([Status.OK]).tolist() == [False, True]
