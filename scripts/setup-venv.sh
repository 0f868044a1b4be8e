#!/usr/bin/env bash
# setup-venv.sh VENV TORCH_REQ ARGS...: create VENV and install TORCH_REQ (e.g. torch==2.13.0) and ARGS (e.g.
# -c requirements.lock -e .[dev]: the Makefile's set-up, the CI's pinned versions).
#
# Installs with uv (about 5x faster than pip here: it resolves once and links from its cache), which is itself
# installed from the package index by pip and runs with pip's configuration (scripts/uv.sh). Bytecode is compiled
# at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, Python would otherwise compile torch anew in every
# process (an import of 6 s instead of 2.5 s). COMPILE_BYTECODE=0 leaves bytecode to the first imports, for a venv
# whose processes may write it (compiling every file of torch costs 40 s of CPU, most of it modules no process
# imports). If uv cannot be installed or fails, pip installs.
set -euo pipefail
venv=$1 torch_req=$2
shift 2
compile=--compile-bytecode
[ "${COMPILE_BYTECODE:-1}" = 0 ] && compile=
python3 -m venv "$venv"
py=$venv/bin/python

if "$py" -m pip install -q uv 2>/dev/null && [ -x "$venv/bin/uv" ]; then
  if bash "$(dirname "$0")/uv.sh" "$py" pip install -q --python "$py" $compile "$torch_req" "$@"; then
    exit 0
  fi
  echo "setup-venv: uv failed; installing with pip" >&2
fi
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q "$torch_req"
"$py" -m pip install -q "$@"
