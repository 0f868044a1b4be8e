"""What README.md and docs/*.md state, checked against the code, in-process (the only commands run stop at once).

Every `scaling` command they name exists and every flag they give it is one of its parser's; every default they
quote (`train.grad_clip` (default 1.0), `--max-grad-acc`, 16 by default) is the schema's, the shipped config's, the
plugin's or the parser's; every file, folder and dotted module they name is in the tree (or in tests/own_project, the
worked example of your own project); the exit statuses of concepts.md's table are the command's; the sweeps and the
commands their tables list (and the choices of each config group) are the tree's; and every relative link between
the pages, #anchor included, resolves.
Each check returns what it found wrong, and the last tests break a page on purpose to show that it says so.
(tests/test_docs_commands.py runs the commands; tests/test_docs_layout.py checks architecture.md's module list.)"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import io
import re
import shlex
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tests.test_docs_commands import PAGES, REPO

DOCS = {p.relative_to(REPO).as_posix(): p.read_text() for p in PAGES}
"""The pages checked: README.md and docs/*.md, by their path in the repository."""
TREE_ROOTS = ("scaling", "analysis", "tests", "benchmarks", "conf", "sweeps", "docs", "scripts", "hydra_plugins", ".ci")
ROOT_FILES = ("Makefile", "pyproject.toml", "requirements.lock", "README.md", "LICENSE")
OWN_PROJECT = REPO / "tests" / "own_project"
DATA_PACKAGES = {"scaling.conf": REPO / "conf", "scaling.sweeps": REPO / "sweeps"}
"""The shipped configs and sweeps as the installed package names them (pyproject.toml's package-dir)."""
OTHER_TOOLS_FLAGS = {"--kill-on-bad-exit", "--index-url", "--extra-index-url", "--find-links"}
"""Flags the pages give to srun and pip, not to `scaling`."""
CONFIG_KEY = r"(?:train|parallel|hardware|launch|logger|hydra\.sweeper|hydra\.launcher)\.[a-z_]+"


# --- reading the pages ---------------------------------------------------------------------------------------------
def prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def spans(text: str) -> list[str]:
    """The inline code spans of the page's prose, each on one line (a span may wrap)."""
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose(text))]


def command_lines(text: str) -> list[str]:
    """Every piece of a page that names a `scaling` command: its inline spans, and the lines of its bash blocks and
    of the `$ ` prompts in its other blocks, comments dropped."""
    lines = spans(text)
    for kind, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if kind == "bash" or line.startswith("$ "):
                lines.append(line.removeprefix("$ ").split(" #")[0].strip())
    return lines


def scaling_calls(line: str) -> list[tuple[str, list[str]]]:
    """(command, its words) of each `scaling COMMAND ...` in a line; `scaling` alone is ("", [])."""
    out = []
    for m in re.finditer(r"(?:^|[\s(])scaling(?=\s|$)(.*?)(?=$|;|&&|\|)", line):
        try:
            words = shlex.split(m.group(1))
        except ValueError:
            words = m.group(1).split()
        out.append((words[0] if words else "", words[1:]))
    return out


# --- the code's side ------------------------------------------------------------------------------------------------
CLI = REPO / "scaling" / "cli"


def _constants(tree: ast.Module, path: Path, follow: bool = True) -> dict[str, Any]:
    """A module's top-level constants, and those it imports by name from another module of the tree (one level)."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError):
                out[node.targets[0].id] = ast.literal_eval(node.value)
        elif follow and isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in TREE_ROOTS:
            source = REPO / (node.module.replace(".", "/") + ".py")
            if source.is_file() and source != path:
                theirs = _constants(ast.parse(source.read_text()), source, follow=False)
                out.update({a.asname or a.name: theirs[a.name] for a in node.names if a.name in theirs})
    return out


def _request_default(node: ast.AST) -> Any:
    """`default("threshold")` in scaling.cli.recipe: the request's own field default (RecipeRequest.default), else
    `...`."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "default" and node.args:
        from scaling.recipe.request import RecipeRequest

        return RecipeRequest.default(node.args[0].value)
    return ...


def _default(call: ast.Call, constants: dict[str, Any]) -> Any:
    """An add_argument's default: its literal, a constant it names or the request's field it reads, False for a
    switch, else what its help's "(default X)" says; `...` when none of them tells."""
    kw = {k.arg: k.value for k in call.keywords}
    value = kw.get("default")
    if isinstance(value, ast.Name) and value.id in constants:
        return constants[value.id]
    if value is not None and _request_default(value) is not ...:
        return _request_default(value)
    with contextlib.suppress(ValueError, TypeError):
        literal = ast.literal_eval(value) if value is not None else None
        if literal is not None:
            return literal
    action = kw.get("action")
    if isinstance(action, ast.Constant) and action.value == "store_true":
        return False
    help_text = kw.get("help")
    if isinstance(help_text, ast.JoinedStr):  # f"... (default {NAME})"
        text = "".join(
            str(constants.get(getattr(v.value, "id", ""), "?")) if isinstance(v, ast.FormattedValue) else str(v.value)
            for v in help_text.values
        )
    else:
        text = str(getattr(help_text, "value", ""))
    m = re.search(r"\(default:? ([^;)]+)\)", text)
    return m.group(1).strip() if m else ...


@cache
def parser_options() -> dict[str, dict[str, Any]]:
    """Command -> {flag: its default} of each `scaling` command's parser, read from the parser's source (the modules
    import torch, pandas and matplotlib: reading them costs seconds that parsing them does not). `run` and `sweep`
    take Hydra's flags; `sweep` also its `--dry-run`; `plan` is main.py's own parser."""
    from scaling.cli.main import COMMANDS
    from scaling.sweep.hydra_adapter import get_args_parser

    hydra = {s: None for a in get_args_parser()._actions for s in a.option_strings}
    out: dict[str, dict[str, Any]] = {"run": dict(hydra), "sweep": {**hydra, "--dry-run": False}, "": {"-h": None}}
    out[""]["--help"] = None
    for command in COMMANDS:
        path = CLI / ("main.py" if command == "plan" else f"{command.replace('-', '_')}.py")
        if command in out or not path.is_file():
            continue
        tree = ast.parse(path.read_text())
        constants = _constants(tree, path)
        flags: dict[str, Any] = {"-h": None, "--help": None}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
                flags.update({n: _default(node, constants) for n in names})
        out[command] = flags
    return out


@cache
def config_defaults() -> dict[str, list[Any]]:
    """Dotted key -> its default in each place that sets one: the schema's dataclass, the group's default file in
    conf/ (config.yaml's defaults list) and the Hydra plugins' structured configs."""
    from scaling.core import schema

    out: dict[str, list[Any]] = {}
    for f in dataclasses.fields(schema.ExperimentConfig):
        if f.default_factory is not dataclasses.MISSING:
            group = f.default_factory()
            for g in dataclasses.fields(group):
                out.setdefault(f"{f.name}.{g.name}", []).append(getattr(group, g.name))
    config = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())
    for entry in config["defaults"]:
        if isinstance(entry, dict) and len(entry) == 1:
            ((group, choice),) = entry.items()
            path = REPO / "conf" / group / f"{choice}.yaml"
            if path.is_file():
                for key, value in (yaml.safe_load(path.read_text()) or {}).items():
                    if not (isinstance(value, str) and "${" in value):
                        out.setdefault(f"{group}.{key}", []).append(value)
    for plugin, node in (("scaling_grid_sweeper", "sweeper"), ("scaling_optuna_sweeper", "sweeper")):
        tree = ast.parse((REPO / "hydra_plugins" / plugin / "config.py").read_text())
        for item in ast.walk(tree):
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                with contextlib.suppress(ValueError):
                    out.setdefault(f"hydra.{node}.{item.target.id}", []).append(ast.literal_eval(item.value))
    tree = ast.parse((REPO / "hydra_plugins" / "scaling_slurm_launcher" / "config.py").read_text())
    for item in ast.walk(tree):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
            with contextlib.suppress(ValueError):
                out.setdefault(f"hydra.launcher.{item.target.id}", []).append(ast.literal_eval(item.value))
    launcher = yaml.safe_load((REPO / "conf" / "hydra" / "launcher" / "slurm.yaml").read_text()) or {}
    for key, value in launcher.items():
        if key != "defaults" and not (isinstance(value, str) and "${" in value):
            out.setdefault(f"hydra.launcher.{key}", []).append(value)
    return out


def same(stated: str, value: Any) -> bool:
    """Whether a default as a page states it ("30 s", "true", "null", "1.0", "`runs/recipe`") is `value`."""
    text = stated.strip().strip("`").removesuffix(" s").strip()
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool) or value is None:
        return text.lower() in ({"true": ["true", "on"], "false": ["false", "off"]}.get(str(value).lower(), ["null"]))
    if isinstance(value, (int, float)):
        with contextlib.suppress(ValueError):
            return float(text.replace(",", "")) == float(value)
        return False
    return text == str(value)


# --- the checks -----------------------------------------------------------------------------------------------------
def command_problems(pages: dict[str, str]) -> list[str]:
    """Each `scaling COMMAND` the pages name that is no command, and each flag given to a command that its parser
    does not have; each flag named alone that no command has."""
    options = parser_options()
    everything = set().union(*options.values()) | OTHER_TOOLS_FLAGS
    out = []
    for page, text in pages.items():
        for line in command_lines(text):
            for command, words in scaling_calls(line):
                if command.startswith("-"):
                    command, words = "", [command, *words]
                if re.fullmatch(r"[A-Z_]+", command):  # a placeholder: `scaling UNKNOWN`
                    continue
                if command not in options:
                    out.append(
                        f"{page}: `scaling {command}`: no such command (the commands: {', '.join(filter(None, options))})"
                    )
                    continue
                for word in words:
                    flag = word.split("=")[0]
                    if re.fullmatch(r"--?[a-z][a-z-]*", flag) and flag not in options[command]:
                        out.append(f"{page}: `scaling {command}` has no flag {flag}")
        for span in spans(text):
            flag = span.split()[0]
            if re.fullmatch(r"--?[a-z][a-z-]*", flag) and flag not in everything:
                out.append(f"{page}: `{span}`: no command has the flag {flag}")
    return out


DEFAULT_PATTERNS = [
    rf"`(?P<key>{CONFIG_KEY})`[^`()]{{0,40}}\((?:default|defaults to) (?P<value>[^;,)]+)",  # `launch.x` (default 30 s
    rf"`(?P<key>{CONFIG_KEY})`, default (?P<value>[^;,)]+)",  # `hydra.sweeper.compose_once`, default true
    rf"`(?P<key>{CONFIG_KEY})=(?P<value>[^`]+)` \(default\)",  # `hydra.sweeper.noise_band=null` (default)
    rf"`(?P<key>{CONFIG_KEY})=(?P<on>[^`]+)`, (?P<value>off) by default",  # `launch.reuse=true`, off by default
    r"`(?P<flag>--[a-z-]+)`, default (?P<value>`[^`]+`|[^;,)\s]+)",  # `--sweep-dir`, default `runs/recipe`
    r"`(?P<flag>--[a-z-]+)`, (?P<value>\S+) by default",  # `--max-grad-acc`, 16 by default
]


def stated_defaults(pages: dict[str, str]) -> list[tuple[str, str, str]]:
    """(page, config key or flag, the default as stated) of every default the pages' prose states."""
    out = []
    for page, text in pages.items():
        flat = " ".join(prose(text).split())
        for pattern in DEFAULT_PATTERNS:
            for m in re.finditer(pattern, flat):
                found = m.groupdict()
                out.append((page, found.get("key") or found["flag"], found["value"]))
    return out


def default_problems(pages: dict[str, str]) -> list[str]:
    """Each stated default that differs from the code's, or that nothing in the code sets."""
    configs, options = config_defaults(), parser_options()
    out = []
    for page, name, stated in stated_defaults(pages):
        if name.startswith("--"):
            values = [flags[name] for flags in options.values() if name in flags and flags[name] is not ...]
        else:
            values = configs.get(name, [])
        if not values:
            out.append(f"{page}: {name} (default {stated}): no default of it in the code")
        elif not all(same(stated, v) for v in values) and not (
            name.startswith("--") and any(same(stated, v) for v in values)
        ):
            out.append(f"{page}: {name} (default {stated}): the code's default is {' / '.join(map(repr, values))}")
    return out


def _defines(module: Path, names: list[str]) -> bool:
    """Whether a module defines the first name at its top level and mentions each further one (an attribute)."""
    text = module.read_text()
    tree = ast.parse(text)
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            top |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return not names or (names[0] in top and all(re.search(rf"\b{re.escape(n)}\b", text) for n in names[1:]))


def dotted_problem(name: str) -> Optional[str]:
    """Why a dotted name (`scaling.store.read.load_record`) is not in the tree, or None: its longest prefix that is a
    module or package, then names that module defines."""
    for data, folder in DATA_PACKAGES.items():
        if name == data or name.startswith(data + "."):
            rest = name.removeprefix(data).strip(".")
            return None if (folder / rest.replace(".", "/")).exists() or not rest else f"{name}: not in {folder.name}/"
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file() or (base.is_dir() and i == len(parts)):
            if i == len(parts) or _defines(module, parts[i:]):
                return None
            return f"{name}: {module.relative_to(REPO)} does not define {'.'.join(parts[i:])}"
    return f"{name}: no such module"


def path_problem(token: str) -> Optional[str]:
    """Why a path a page names (`scaling/launch/warm.py`, `tests/test_trace.py::test_x`, `conf/network/`) is not in
    the repository nor in the worked example of your own project, or None."""
    path, _, test = token.partition("::")
    for root in (REPO, OWN_PROJECT):
        if (root / path).exists():
            if test and not re.search(rf"def {re.escape(test.split('[')[0])}\(", (root / path).read_text()):
                return f"{token}: {path} has no {test}"
            return None
    return f"{token}: no such file or folder"


def file_problems(pages: dict[str, str]) -> list[str]:
    """Each file, folder or dotted module that a page's inline code names and the tree does not have. A name with a
    placeholder (`<sweep_dir>`, `NAME`, `*`, `...`) is a pattern, not a path, and is not looked up."""
    out = []
    for page, text in pages.items():
        for span in spans(text):
            for raw in re.split(r"[\s,;=()'\"]+", span):
                token = raw.strip(".:")
                if not token or re.search(r"[<>*{}$\[\]]|\.\.\.|…|\b[A-Z][A-Z_]{2,}\b", token):
                    continue
                if re.fullmatch(r"(?:scaling|analysis|hydra_plugins)(?:\.[A-Za-z_]\w*)+", token):
                    problem = dotted_problem(token)
                elif token in ROOT_FILES or ("/" in token and token.split("/")[0] in TREE_ROOTS):
                    problem = path_problem(token)
                else:
                    continue
                if problem:
                    out.append(f"{page}: `{span}`: {problem}")
    return sorted(set(out))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The #anchors of a page's headings (a repeated heading's -1, -2 included)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(text), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_problems(pages: dict[str, str]) -> list[str]:
    """Each relative link of a page (page, #anchor, image) that leads nowhere: a missing file, or an anchor that is
    no heading of the page it points into."""
    out = []
    for page, text in pages.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (REPO / page).parent / path if path else REPO / page
            if not file.exists():
                out.append(f"{page}: ({target}): no file {path}")
                continue
            if anchor:
                body = pages.get(file.resolve().relative_to(REPO).as_posix()) or file.read_text()
                if anchor not in anchors(body):
                    out.append(f"{page}: ({target}): no heading of {file.relative_to(REPO)} has the anchor #{anchor}")
    return out


def exit_statuses(page: str) -> list[tuple[int, str]]:
    """(status, command) of each command in the exit-status table of concepts.md."""
    section = page.split("exit status | when |", 1)[1].split("\n\n", 1)[0]
    out = []
    for row in section.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        out += [(int(cells[0]), c) for c in re.findall(r"`(scaling(?: [^`]*)?)`", cells[1])]
    return out


def run_main(command: str) -> int:
    """The exit status of `scaling.cli.main.main` on a command line, in this process, its output swallowed; a command
    line that would run points (Hydra's app) fails the test instead."""
    from scaling.cli import main as cli

    def runs_points(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"`{command}` would run points: not a command line this check runs")

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        mp.setattr(cli, "run_app", runs_points)
        try:
            return cli.main(shlex.split(command)[1:])
        except SystemExit as e:  # argparse refusing a command line
            return int(e.code or 0)


def table_names(page: str, header: str) -> set[str]:
    """The names in backticks of the first column of the page's table under `header` (`a` / `b` gives both)."""
    rows = page.split(header, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return {n for row in rows for n in re.findall(r"`([^`]+)`", row.strip("|").split("|")[0])}


# --- the tests ------------------------------------------------------------------------------------------------------
def test_every_command_and_flag_the_pages_name_exists():
    assert command_problems(DOCS) == []


def test_every_default_the_pages_state_is_the_codes():
    found = {name for _, name, _ in stated_defaults(DOCS)}
    assert {"train.grad_clip", "launch.reuse", "launch.lease_wait_s", "hydra.sweeper.compose_once"} <= found
    assert {"--max-grad-acc", "--sweep-dir", "--threshold"} <= found
    assert default_problems(DOCS) == []


def test_every_file_and_module_the_pages_name_is_in_the_tree():
    assert file_problems(DOCS) == []


def test_every_link_between_the_pages_resolves():
    assert link_problems(DOCS) == []


def test_the_exit_statuses_concepts_states_are_the_commands():
    from scaling.cli import main as cli
    from scaling.core.enums import Status
    from scaling.sweep.progress import PointsFailed

    stated = exit_statuses(DOCS["docs/concepts.md"])
    assert {s for s, _ in stated} == {0, 1, 2}, stated
    # 1 needs a point that failed: the commands of its row are not run, the status of a failure is checked below
    assert [(status, command) for status, command in stated if status != 1 and run_main(command) != status] == []
    with pytest.MonkeyPatch.context() as mp:

        def failed(argv: list[str]) -> int:
            raise PointsFailed(Counter({Status.FAILED: 1}))

        mp.setitem(cli.COMMANDS, "run", (failed, "a run whose point failed"))
        assert run_main("scaling run") == 1


def test_the_tables_list_every_sweep_and_every_command():
    from scaling.cli.main import COMMANDS

    assert table_names(DOCS["docs/sweeps.md"], "| sweep | what |") == {p.stem for p in (REPO / "sweeps").glob("*.yaml")}
    listed = {name.split()[1] for name in table_names(DOCS["README.md"], "| command | what it does |")}
    assert listed == set(COMMANDS)
    groups = DOCS["docs/concepts.md"].split("| group | choices | what it holds |", 1)[1].split("\n\n", 1)[0]
    for row in groups.splitlines()[2:]:
        group, choices = (cell.strip() for cell in row.strip("|").split("|")[:2])
        shipped = {p.stem for p in (REPO / "conf" / group.strip("`")).glob("*.yaml")}
        assert set(re.findall(r"`([^`]+)`", choices)) == shipped, group


def test_each_check_says_what_a_broken_page_breaks():
    readme, concepts = DOCS["README.md"], DOCS["docs/concepts.md"]
    assert "(docs/recipe.md)" in readme and "(metrics.md#noise-and-repeats)" in concepts
    broken = {
        "README.md": readme.replace("(docs/recipe.md)", "(docs/recipes.md)", 1),
        "docs/concepts.md": concepts.replace("(metrics.md#noise-and-repeats)", "(metrics.md#noise-and-repeat)", 1),
    }
    assert link_problems(broken) == [
        "README.md: (docs/recipes.md): no file docs/recipes.md",
        "docs/concepts.md: (metrics.md#noise-and-repeat): no heading of docs/metrics.md has the anchor #noise-and-repeat",
    ]
    assert "(default 1.0, 0 turns it off" in concepts
    wrong = {"docs/concepts.md": concepts.replace("(default 1.0, 0 turns it off", "(default 0.5, 0 turns it off")}
    assert default_problems(wrong) == [
        "docs/concepts.md: train.grad_clip (default 0.5): the code's default is 1.0 / 1.0"
    ]
    moved = {
        "x.md": "the bands (`analysis/bands.py`, `scaling.perf.extrapolation.nothing_here`), `scaling sweeps demo`"
    }
    assert file_problems(moved) == [
        "x.md: `analysis/bands.py`: analysis/bands.py: no such file or folder",
        "x.md: `scaling.perf.extrapolation.nothing_here`: "
        "scaling.perf.extrapolation.nothing_here: scaling/perf/extrapolation.py does not define nothing_here",
    ]
    assert command_problems({"x.md": "`scaling sweep demo --dryrun` and `scaling sweeps demo`"}) == [
        "x.md: `scaling sweep` has no flag --dryrun",
        f"x.md: `scaling sweeps`: no such command (the commands: {', '.join(filter(None, parser_options()))})",
    ]
    table = concepts.replace("| 2 | a command line", "| 0 | a command line")
    assert table != concepts and any(run_main(c) != s for s, c in exit_statuses(table) if s != 1)
