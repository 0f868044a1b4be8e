"""torch_build.py TORCH_REQ: the torch requirement to install, as pip is configured for this interpreter.

`torch==X` becomes `torch==X+cpu`, PyTorch's CPU build, when a find-links or an index pip is configured with
(`pip config list`: files or PIP_* variables) offers a wheel of it for this interpreter; otherwise it stays `torch==X`,
which the default package index has (the CUDA build on Linux). A requirement that names a build already, or is not
`torch==X`, is kept as given. Prints the requirement; says on stderr which source it came from.
Local folders and file:// indexes are read from disk; an http(s) find-links page or index is asked once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

SOURCES = ("find-links", "index-url", "extra-index-url")
"""pip's settings that name where packages come from."""


def pip_settings(python: str) -> dict[str, list[str]]:
    """Each of SOURCES -> its values in `pip config list` (every section and the environment), in order."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False).stdout
    found: dict[str, list[str]] = {key: [] for key in SOURCES}
    for line in out.splitlines():
        m = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line)
        if m and m.group(1) in found:
            found[m.group(1)] += [v for v in m.group(2).split() if v not in found[m.group(1)]]
    return found


def wheel_tags() -> set[str]:
    """The `python-abi-platform` tags this interpreter installs, from the packaging pip carries."""
    try:
        from pip._vendor.packaging.tags import sys_tags
    except ImportError:  # no pip here: the CPython tag of this version on this machine's architecture
        py = f"cp{sys.version_info.major}{sys.version_info.minor}"
        return {f"{py}-{py}-{os.uname().machine}"}
    return {str(t) for t in sys_tags()}


def offers(listing: str, version: str, tags: set[str]) -> bool:
    """Whether a page or folder listing names a CPU wheel of torch `version` for one of `tags`."""
    pattern = r"torch-" + re.escape(version) + r"\+cpu-([\w.]+)-([\w.]+)-([\w.]+)\.whl"
    for py, abi, plat in re.findall(pattern, urllib.parse.unquote(listing)):
        wheel = {f"{p}-{a}-{pl}" for p in py.split(".") for a in abi.split(".") for pl in plat.split(".")}
        if wheel & tags:
            return True
    return False


def listing(source: str, kind: str) -> str:
    """What a source lists for torch: a folder's file names, or the text of its page (an index's `torch/` page)."""
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("", "file"):
        path = Path(urllib.parse.unquote(parsed.path) if parsed.scheme else source)
        if kind != "find-links":
            path = path / "torch"
        if path.is_dir():
            return "\n".join(p.name for p in path.iterdir()) + "\n" + _index_html(path)
        return path.read_text(errors="replace") if path.is_file() else ""
    if kind != "find-links":
        source = source.rstrip("/") + "/torch/"
    try:
        with urllib.request.urlopen(source, timeout=20) as response:
            return response.read().decode("utf-8", "replace")
    except (OSError, ValueError) as e:
        print(f"setup-venv: could not read {source}: {e}", file=sys.stderr)
        return ""


def _index_html(folder: Path) -> str:
    """The index.html of a folder (a file:// simple index lists its files there), or nothing."""
    page = folder / "index.html"
    return page.read_text(errors="replace") if page.is_file() else ""


def choose(requirement: str, settings: dict[str, list[str]], tags: set[str]) -> tuple[str, str]:
    """(the requirement to install, where it comes from) for `requirement` under pip's `settings`."""
    m = re.fullmatch(r"torch==([0-9][0-9a-z.]*)", requirement.strip())
    if not m:
        return requirement, "as given"
    version = m.group(1)
    for kind in SOURCES:
        for source in settings[kind]:
            if offers(listing(source, kind), version, tags):
                return f"torch=={version}+cpu", f"the CPU build, from {kind} {source}"
    return requirement, (
        f"no configured find-links or index offers torch {version}+cpu: the default index's build "
        "(docs/install.md: PyTorch's CPU index)"
    )


def main(argv: list[str]) -> int:
    """Print the torch requirement to install for argv[0]; say where it comes from on stderr."""
    if len(argv) != 1:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    requirement, why = choose(argv[0], pip_settings(sys.executable), wheel_tags())
    print(f"setup-venv: {requirement}: {why}", file=sys.stderr)
    print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
