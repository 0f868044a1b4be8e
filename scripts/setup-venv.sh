#!/usr/bin/env bash
# setup-venv.sh VENV TORCH_REQ ARGS...: create VENV and install TORCH_REQ (e.g. torch==2.13.0) and ARGS (e.g.
# -c requirements.lock -e .[dev]: the Makefile's set-up, the CI's pinned versions).
#
# torch==X is PyTorch's CPU build, torch==X+cpu, where a find-links or an index pip is configured with offers it
# (scripts/torch_build.py), else the default index's torch==X (the CUDA build on Linux): a constraint file given as
# `-c FILE` that pins X+cpu is then read with X instead. SETUP_VENV_DRY_RUN=1 prints that choice and the install's
# arguments, one a line, and creates nothing (PYTHON, else python3, runs the choice).
#
# Installs with uv (about 5x faster than pip here: it resolves once and links from its cache), which is itself
# installed from the package index by pip and runs with pip's configuration (scripts/uv.sh). Bytecode is compiled
# at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, Python would otherwise compile torch anew in every
# process (an import of 6 s instead of 2.5 s). COMPILE_BYTECODE=0 leaves bytecode to the first imports (compiling every file of
# torch costs 40 s of CPU, most of it modules no process imports): the Makefile then compiles what the project's
# processes import with scripts/compile_imports.py. If uv cannot be installed or fails, pip installs.
set -euo pipefail
venv=$1 torch_req=$2
shift 2
here=$(dirname "$0")
compile=--compile-bytecode
[ "${COMPILE_BYTECODE:-1}" = 0 ] && compile=
dry_run=${SETUP_VENV_DRY_RUN:-0}
if [ "$dry_run" = 1 ]; then
  py=${PYTHON:-python3}
else
  python3 -m venv "$venv"
  py=$venv/bin/python
fi

# The torch build to install; a constraint file that pins the CPU build is read with the build chosen instead.
torch_req=$("$py" "$here/torch_build.py" "$torch_req")
constraints=
[ "$dry_run" = 1 ] || trap 'rm -f "$constraints"' EXIT
args=()
while [ $# -gt 0 ]; do
  case $torch_req in
    torch==*+*) ;;
    torch==*)
      if [ "$1" = -c ] && [ $# -gt 1 ] && grep -qx "$torch_req+cpu" "$2"; then
        constraints=$(mktemp "${TMPDIR:-/tmp}/setup-venv-constraints.XXXXXX")
        sed "s/^${torch_req//./\\.}+cpu\$/$torch_req/" "$2" > "$constraints"
        args+=(-c "$constraints")
        shift 2
        continue
      fi
      ;;
  esac
  args+=("$1")
  shift
done
set -- ${args[@]+"${args[@]}"}
if [ "$dry_run" = 1 ]; then
  printf '%s\n' "$torch_req" "$@"
  exit 0
fi

if "$py" -m pip install -q uv 2>/dev/null && [ -x "$venv/bin/uv" ]; then
  if bash "$here/uv.sh" "$py" pip install -q --python "$py" $compile "$torch_req" "$@"; then
    exit 0
  fi
  echo "setup-venv: uv failed; installing with pip" >&2
fi
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q "$torch_req"
"$py" -m pip install -q "$@"
