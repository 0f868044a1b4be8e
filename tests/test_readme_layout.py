"""The README's Layout section names every module of the package, each under the folder it lives in."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def layout() -> dict[str, set[str]]:
    """Folder -> the names listed for it in the README's Layout block (continuation lines included)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed: dict[str, set[str]] = {}
    folder = None
    for line in block.splitlines():
        head = re.match(r"^(\S+/)\s+(.*)$", line)
        if head:
            folder, rest = head.group(1), head.group(2)
        elif folder and line.startswith(" "):
            rest = line
        else:
            continue
        listed.setdefault(folder, set()).update(re.findall(r"[a-z_][a-z0-9_]*", rest))
    return listed


def test_layout_names_every_module_in_its_folder():
    listed = layout()
    for folder in ("scaling/", "scaling/engine/", "scaling/predictor/", "analysis/"):
        modules = {p.stem for p in (REPO / folder).glob("*.py") if not p.stem.startswith("_")}
        assert modules <= listed[folder], (folder, sorted(modules - listed[folder]))
    plugins = {p.name for p in (REPO / "hydra_plugins").iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert plugins <= listed["hydra_plugins/"], sorted(plugins - listed["hydra_plugins/"])
