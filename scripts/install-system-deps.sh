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
# man-db's trigger rebuilds the manual pages' index after the install (about 5 s of CPU here, beside the set-up's own):
# off while these install, on again after, whatever the outcome.
auto=/var/lib/man-db/auto-update
if [ -e "$auto" ]; then
  mv "$auto" "$auto.scaling-off"
  trap 'mv "$auto.scaling-off" "$auto"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
