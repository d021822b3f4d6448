#!/usr/bin/env bash
# Installs what rollyard needs on a Debian machine: the system packages the sandbox uses and a
# virtual environment with the project and its dev tools. Safe to run again.
set -euo pipefail
venv=${1:-.venv}

apt_packages=(bubblewrap util-linux libseccomp2 git chromium)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "rollyard setup: missing system packages: ${missing[*]}; run as root or 'sudo apt-get install ${missing[*]}'" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -x "$venv/bin/python" ]; then
  python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# torch first and exactly pinned: any looser request downloads a multi-GB CUDA build
"$venv/bin/python" -m pip install -q "torch==2.13.0"
# compat editable mode puts the project root on sys.path. The default mode resolves packages
# through an import hook that runs after the path scan, so a `storage/` directory elsewhere on
# the path (a Dask worker's scratch dir has one) would shadow the `storage` package.
"$venv/bin/python" -m pip install -q -e ".[dev]" --config-settings editable_mode=compat
