"""A rank that says how it was started: `python -m tests.helpers.agent_probe OUT_DIR [EXIT_CODE]` under torchrun.

Each rank writes OUT_DIR/rank-<RANK>.json (its pid, its agent's pid, command line and parent, its own command line, working
directory, module path, temporary directory, the launch's variables), sleeps PROBE_SLEEP_S seconds where set, and exits with EXIT_CODE
(0 by default)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from scaling.engine.lifetime import parent_command

if __name__ == "__main__":
    out = Path(sys.argv[1])
    agent = os.getppid()
    Path(out, f"rank-{os.environ['RANK']}.json").write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "agent": agent,
                "agent_command": parent_command(agent),
                "agent_parent": int(Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()[1]),
                "command": parent_command(os.getpid()),
                "cwd": os.getcwd(),
                "path": sys.path[:3],
                "tmp": tempfile.gettempdir(),
                "env": {k: v for k, v in os.environ.items() if k.startswith(("SCALING_", "PROBE_"))},
            }
        )
    )
    time.sleep(float(os.environ.get("PROBE_SLEEP_S", "0")))
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
