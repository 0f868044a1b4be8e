#!/usr/bin/env bash
# Installs the Debian packages the tests use: a one-node SLURM cluster (slurmctld, slurmd, munge)
# and headless Chromium for the report screenshot. Needs root; without it, says what to install.
set -euo pipefail
pkgs=(slurmctld slurmd slurm-client munge chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps: not root; the SLURM and browser tests will be skipped until you run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
