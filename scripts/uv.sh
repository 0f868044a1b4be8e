#!/usr/bin/env bash
# uv.sh PY ARGS...: run the uv of PY's virtual environment with ARGS, configured as PY's pip is.
#
# uv does not read pip's configuration, so the find-links, indexes, constraints and certificate pip is configured
# with (files or PIP_* variables: `pip config list`) are handed to uv as its UV_* variables, and with extra
# indexes uv considers every index for every package, as pip does. A constraint file given to uv as `-c` replaces
# the configured one.
set -euo pipefail
py=$1
shift

config=$("$py" -m pip config list 2>/dev/null || true)  # read once: each pip start costs 0.2 s of CPU
pip_config() {  # the value of pip's setting $1 (e.g. find-links), environment before files; empty if unset
  printf '%s\n' "$config" | sed -n "s/^:env:\.$1='\(.*\)'$/\1/p; s/^global\.$1='\(.*\)'$/\1/p" | head -n 1
}

links=$(pip_config find-links) index=$(pip_config index-url) extra=$(pip_config extra-index-url)
constraint=$(pip_config constraint) cert=$(pip_config cert)
[ -n "$links" ] && export UV_FIND_LINKS="$links"
[ -n "$index" ] && export UV_INDEX_URL="$index"
[ -n "$extra" ] && export UV_EXTRA_INDEX_URL="$extra" UV_INDEX_STRATEGY=unsafe-best-match
[ -n "$constraint" ] && export UV_CONSTRAINT="$constraint"
[ -n "$cert" ] && export SSL_CERT_FILE="$cert"
exec "$(dirname "$py")/uv" "$@"
