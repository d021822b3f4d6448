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
# The default editable mode: rollyard's Dask workers take their scratch directory (which holds a
# `storage/` folder) off sys.path (flows/dask_worker.py), so nothing shadows the packages.
"$venv/bin/python" -m pip install -q -e ".[dev]"
# The empty Prefect database each new Prefect server home starts from: Prefect's own migrations,
# run once per installed Prefect version (flows/runtime.py, prefect_database_template).
"$venv/bin/python" -c "from flows.runtime import prefect_database_template as t; t()"
