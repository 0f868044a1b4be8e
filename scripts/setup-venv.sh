#!/usr/bin/env bash
# setup-venv.sh VENV TORCH_REQ SPEC: create VENV and install TORCH_REQ (e.g. torch==2.13.0) and SPEC (e.g. -e .[dev]).
#
# Installs with uv (about 5x faster than pip here: it resolves once and links from its cache), which is itself
# installed from the package index by pip. uv does not read pip's configuration, so the find-links, indexes,
# constraints and certificate pip is configured with (files or PIP_* variables: `pip config list`) are handed
# to uv, and with extra indexes uv considers every index for every package, as pip does. Bytecode is compiled at
# install, as pip does: where PYTHONDONTWRITEBYTECODE is set, Python would otherwise compile torch anew in every
# process (an import of 6 s instead of 2.5 s). If uv cannot be installed or fails, pip installs.
set -euo pipefail
venv=$1 torch_req=$2
shift 2
python3 -m venv "$venv"
py=$venv/bin/python

pip_config() {  # the value of pip's setting $1 (e.g. find-links), environment before files; empty if unset
  "$py" -m pip config list 2>/dev/null | sed -n "s/^:env:\.$1='\(.*\)'$/\1/p; s/^global\.$1='\(.*\)'$/\1/p" | head -n 1
}

if "$py" -m pip install -q uv 2>/dev/null && [ -x "$venv/bin/uv" ]; then
  links=$(pip_config find-links) index=$(pip_config index-url) extra=$(pip_config extra-index-url)
  constraint=$(pip_config constraint) cert=$(pip_config cert)
  [ -n "$links" ] && export UV_FIND_LINKS="$links"
  [ -n "$index" ] && export UV_INDEX_URL="$index"
  [ -n "$extra" ] && export UV_EXTRA_INDEX_URL="$extra" UV_INDEX_STRATEGY=unsafe-best-match
  [ -n "$constraint" ] && export UV_CONSTRAINT="$constraint"
  [ -n "$cert" ] && export SSL_CERT_FILE="$cert"
  if "$venv/bin/uv" pip install -q --python "$py" --compile-bytecode "$torch_req" "$@"; then
    exit 0
  fi
  echo "setup-venv: uv failed; installing with pip" >&2
fi
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q "$torch_req"
"$py" -m pip install -q "$@"
