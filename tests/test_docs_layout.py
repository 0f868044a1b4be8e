"""docs/architecture.md's Layout section lists the modules of every package as the tree has them: none missing, none extra."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def layout(page: str) -> dict[str, set[str]]:
    """Folder -> the entries its line lists in the Layout section's module list (its last code block; continuation
    lines included), each entry `name (what it is)` read as `name`."""
    section = page.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```")[-2]
    lines: dict[str, str] = {}
    folder = None
    for line in block.splitlines():
        head = re.match(r"^(\S+/)\s+(.*)$", line)
        if head:
            folder = head.group(1)
            lines[folder] = head.group(2)
        elif folder and line.startswith(" "):
            lines[folder] += " " + line.strip()
    entries = {folder: re.sub(r"\([^()]*\)", "", text).split(",") for folder, text in lines.items()}
    return {folder: {e.strip() for e in names if e.strip()} for folder, names in entries.items()}


def contents(folder: Path) -> set[str]:
    """A package folder's public modules and, with a trailing slash, its subfolders (no `_private`, no caches)."""
    return {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")} | {
        f"{p.name}/" for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    }


def tree() -> dict[str, set[str]]:
    """What the module list must say: every subpackage of scaling/, analysis/ and hydra_plugins/ (its plugins)."""
    want = {
        f"scaling/{p.name}/": contents(p) for p in sorted((REPO / "scaling").iterdir()) if (p / "__init__.py").exists()
    }
    return {**want, "analysis/": contents(REPO / "analysis"), "hydra_plugins/": contents(REPO / "hydra_plugins")}


def mismatches(listed: dict[str, set[str]], want: dict[str, set[str]]) -> list[str]:
    """Each folder the page lists differently from the tree, with what is missing and what does not exist."""
    out = [f"{folder} has no line in the layout" for folder in want if folder not in listed]
    out += [f"{folder} is not a package of the tree" for folder in listed if folder not in want]
    for folder in sorted(set(listed) & set(want)):
        missing, extra = sorted(want[folder] - listed[folder]), sorted(listed[folder] - want[folder])
        if missing or extra:
            out.append(f"{folder}: missing from the layout {missing}, named but not in the tree {extra}")
    return out


def test_layout_lists_every_module_of_every_package_and_nothing_else():
    assert mismatches(layout((REPO / "docs" / "architecture.md").read_text()), tree()) == []


def test_the_check_fails_for_a_missing_and_for_an_extra_module():
    page = (REPO / "docs" / "architecture.md").read_text()
    assert "inflight (running.json markers)," in page and "trace (under FakeTensorMode)," in page
    without = page.replace("inflight (running.json markers),", "")
    assert mismatches(layout(without), tree()) == [
        "scaling/store/: missing from the layout ['inflight'], named but not in the tree []"
    ]
    extra = page.replace("trace (under FakeTensorMode),", "trace (under FakeTensorMode), cli,")
    assert mismatches(layout(extra), tree()) == [
        "scaling/predictor/: missing from the layout [], named but not in the tree ['cli']"
    ]
