"""How a finished job is classified (pure: no process is started)."""

from __future__ import annotations

import json

from scaling.launch.torchrun import classify, error_messages


def test_a_peers_dropped_connection_is_not_the_root_cause(tmp_path):
    for rank, (stamp, message) in enumerate(
        [
            (
                "100",
                "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:42674. This is typically caused "
                "by a remote worker crashing.",
            ),
            ("100", "RuntimeError: injected fault: rank 1 crashed on purpose (train.fault=crash)"),
        ]
    ):
        path = tmp_path / "elastic" / "run" / "attempt_0" / str(rank) / "error.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": stamp}}}))
    status, error = classify(1, False, error_messages(tmp_path), "", 60)
    assert (status, error) == ("failed", "RuntimeError: injected fault: rank 1 crashed on purpose (train.fault=crash)")
