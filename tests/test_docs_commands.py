"""Every `scaling` command in the shell blocks of the README and of docs/ runs from a fresh directory.

A command that would launch points or measure runs to its dry run (`scaling run -m` and `scaling sweep` to the
sweeper's, `scaling recipe` and `scaling collectives` to `--dry-run`, `scaling run` to `--cfg job`, `scaling
find-mbs` without its confirming runs); the quick ones run in full (`plan`, `predict`, and `status` and `report` on a
small store written where the command reads). A command written under `salloc` is meant for a SLURM allocation: it
must stop with the message that asks for one, and nothing else. `cd my-project` runs the commands after it in a copy
of tests/own_project, the worked example of docs/own-project.md."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import scaling
from tests.helpers.records import grid_records, write_sweep

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DRY_RUN = {"sweep": ["--dry-run"], "recipe": ["--dry-run"], "collectives": ["--dry-run"], "find-mbs": ["--no-confirm"]}


def shell_commands(text: str) -> list[tuple[str, bool, str]]:
    """(command, under salloc, the directory a `cd` before it in its block went to, else "") of each `scaling` command
    line in the text's ```bash blocks, and of each `$ ` prompt in its other blocks (a session with its output): the
    prompt and a trailing comment dropped, continued lines joined."""
    out = []
    for kind, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        cwd = ""
        for line in block.replace("\\\n", " ").splitlines():
            if kind != "bash" and not line.startswith("$ "):
                continue
            words = shlex.split(line.strip().removeprefix("$ "), comments=True)
            if words[:1] == ["cd"]:
                cwd = words[1]
            salloc = words[:1] == ["salloc"]
            if salloc:
                words = words[next(i for i, w in enumerate(words) if w == "scaling") :]
            if words[:1] == ["scaling"]:
                out.append((shlex.join(words), salloc, cwd))
    return out


def shown_outputs(text: str) -> dict[tuple[str, ...], list[str]]:
    """What the page shows a `$ scaling ...` prompt of a non-bash block print (the lines after it, up to the next
    prompt), keyed by the argv the test runs for it."""
    out = {}
    for kind, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if kind == "bash":
            continue
        for session in re.split(r"^(?=\$ )", block, flags=re.M):
            command, _, printed = session.partition("\n")
            if command.startswith("$ scaling "):
                words = shlex.split(command.removeprefix("$ "), comments=True)
                out[tuple(as_run(shlex.join(words)))] = printed.splitlines()
    return out


SHOWN_CHECKED = ("--dry-run",)
"""The shown output compared with the real one: a dry run's (its forecast of the grid, which no machine's speed moves;
a Hydra log line is compared without its time stamp). Other sessions show a store or a cluster the test does not have."""


def inline_commands(text: str) -> list[tuple[str, bool, str]]:
    """The concrete `scaling` commands in the text's inline code outside its blocks: with arguments, and none of
    them a placeholder (`[overrides]`, `NAME`, `<TAB>`, `...`)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found = re.findall(r"`(scaling [^`]+)`", prose)
    return [
        (" ".join(c.split()), False, "")
        for c in found
        if len(c.split()) > 2 and not re.search(r"\[|\.\.\.|…|<|\b[A-Z_]{3,}\b", c)
    ]


def as_run(command: str) -> list[str]:
    """The argv the test runs for a command: its dry run where it would launch (the module docstring)."""
    argv = shlex.split(command)[1:]
    if argv[0] == "run":
        argv = [a for a in argv if a != "-m"] + (
            ["hydra.sweeper.dry_run=true", "-m"] if "-m" in argv else ["--cfg", "job"]
        )
    return argv + [a for a in DRY_RUN.get(argv[0], []) if a not in argv]


def _distinct(found: list[tuple[str, str, bool, str]]) -> list[tuple[str, str, bool, str]]:
    """Each command once (the first page that has it), whichever pages repeat it; a command that runs as another's
    dry run (`scaling sweep demo` and `scaling sweep demo --dry-run`) is that one."""
    seen: dict[tuple[tuple[str, ...], bool, str], tuple[str, str]] = {}
    for page, command, salloc, cwd in found:
        seen.setdefault((tuple(as_run(command)), salloc, cwd), (page, command))
    return [(page, command, salloc, cwd) for (_, salloc, cwd), (page, command) in seen.items()]


SHOWN = {argv: lines for page in PAGES for argv, lines in shown_outputs(page.read_text()).items()}

COMMANDS = _distinct(
    [
        (page.relative_to(REPO).as_posix(), *c)
        for page in PAGES
        for c in shell_commands(page.read_text()) + inline_commands(page.read_text())
    ]
)


def test_the_pages_hold_the_commands_a_reader_runs():
    commands = {c for _, c, _, _ in COMMANDS}
    assert any(c.startswith("scaling recipe model=llama_1b") for c in commands)
    assert {
        "scaling sweep best_throughput",
        "scaling report runs/demo",
        "scaling plan --gbs-tokens 4M --seq-len 4000 --mbs 2 --gpus 128",
    } <= commands
    assert shell_commands("```bash\ncd p\n$ scaling status runs/x   # where it stands\nmake demo\n```") == [
        ("scaling status runs/x", False, "p")
    ]
    assert SHOWN[("sweep", "demo", "--dry-run")][1].startswith("sweep demo: 64 points: ")


@pytest.mark.subprocess
@pytest.mark.parametrize(("page", "command", "salloc", "cwd"), COMMANDS, ids=[f"{p}: {c}" for p, c, _, _ in COMMANDS])
def test_each_command_runs_from_a_fresh_directory(tmp_path: Path, page: str, command: str, salloc: bool, cwd: str):
    if cwd:
        assert cwd == "my-project", f"{page}: `cd {cwd}`: no worked example stands for it"
        shutil.copytree(REPO / "tests" / "own_project", tmp_path / cwd)
        tmp_path = tmp_path / cwd
    else:  # `--config-dir sweeps`, as from the repository
        shutil.copytree(REPO / "sweeps", tmp_path / "sweeps")
    argv = as_run(command)
    sub = argv[0]
    if sub in ("report", "status"):  # they read a store: a small one where the command looks (report: each folder)
        folders = argv[1 : next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))]
        for folder in folders if sub == "report" else folders[:1]:
            write_sweep(tmp_path / folder, grid_records(seq_lens=(256,), mbss=(1, 2), dps=(1, 2), zero_stages=(0,)))
    out = scaling(*argv, cwd=tmp_path, timeout=180)
    if salloc:
        assert out.returncode == 2 and "inside a SLURM allocation" in out.stderr, out.stdout + out.stderr
        return
    assert out.returncode == 0, f"{page}: {command}\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
    assert "Traceback" not in out.stderr
    if sub in ("sweep", "recipe", "collectives") or "-m" in argv:
        assert not list(tmp_path.rglob("result.json")), "a dry run wrote a record"
    if any(flag in argv for flag in SHOWN_CHECKED):
        printed = out.stdout + out.stderr
        for line in SHOWN.get(tuple(argv), []):
            assert re.sub(r"^\[[^]]*\]\[HYDRA\] ", "", line) in printed, (
                f"{page}: `{command}` shows {line!r}:\n{printed}"
            )
