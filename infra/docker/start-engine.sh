#!/usr/bin/env bash
# Starts a private Docker engine for rollyard's docker sandbox backend (and its tests), and builds
# the base image from a debootstrap root filesystem, since no registry is reachable. Idempotent:
# a running engine and an existing base image are reused.
#
#   infra/docker/start-engine.sh [STATE_DIR]        # default: /var/lib/rollyard-docker
#   eval "$(infra/docker/start-engine.sh)"           # sets DOCKER_HOST for this shell
#   infra/docker/stop-engine.sh [STATE_DIR]          # stops it by its pid
#
# Needs root (apt, dockerd, debootstrap). About 2-3 minutes the first time (mostly debootstrap),
# under a second afterwards. The engine has no bridge and no iptables rules: every container of
# the backend runs with `--network none` anyway.
set -euo pipefail

state=${1:-${ROLLYARD_DOCKER_STATE:-/var/lib/rollyard-docker}}
base_image=${ROLLYARD_DOCKER_BASE_IMAGE:-rollyard/base:bookworm-py3}
suite=${ROLLYARD_DOCKER_SUITE:-bookworm}
sock="$state/docker.sock"
export DOCKER_HOST="unix://$sock"

log() { echo "start-engine: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "must run as root (installs docker.io and debootstrap, starts dockerd)"
  exit 1
fi

missing=()
for p in docker.io debootstrap; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
dockerd_bin=$(command -v dockerd || echo /usr/sbin/dockerd)
# The Debian client talks to the Debian engine whatever else is first on PATH.
docker_bin=/usr/bin/docker
[ -x "$docker_bin" ] || docker_bin=$(command -v docker)

mkdir -p "$state"
if "$docker_bin" version >/dev/null 2>&1; then
  log "engine already running at $sock"
else
  if [ -f "$state/dockerd.pid" ] && kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null; then
    log "dockerd $(cat "$state/dockerd.pid") is running but does not answer; stop it first"
    exit 1
  fi
  rm -f "$state/dockerd.pid" "$sock"
  log "starting dockerd (state in $state)"
  # setsid: the engine must outlive this script and the shell that ran it.
  setsid "$dockerd_bin" \
    --iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2 \
    --data-root "$state/data" --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
    -H "unix://$sock" >"$state/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 150); do
    "$docker_bin" version >/dev/null 2>&1 && break
    sleep 0.2
  done
  if ! "$docker_bin" version >/dev/null 2>&1; then
    log "dockerd did not come up; last lines of $state/dockerd.log:"
    tail -n 20 "$state/dockerd.log" >&2
    exit 1
  fi
fi

if "$docker_bin" image inspect "$base_image" >/dev/null 2>&1; then
  log "base image $base_image present"
else
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [ -z "$mirror" ]; then
    mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  fi
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs="$state/rootfs-$suite"
  rm -rf "$rootfs"
  log "building $base_image with debootstrap $suite from $mirror (about 2 minutes)"
  debootstrap --variant=minbase \
    --include=python3,python-is-python3,python3-pytest,patch \
    "$suite" "$rootfs" "$mirror" >"$state/debootstrap.log" 2>&1 || {
      log "debootstrap failed; see $state/debootstrap.log"; tail -n 20 "$state/debootstrap.log" >&2; exit 1; }
  # Keep the image small and free of apt state the sandbox has no use for.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "$docker_bin" import \
    -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8' - "$base_image" >/dev/null
  rm -rf "$rootfs"
  log "base image $base_image built"
fi

echo "export DOCKER_HOST=unix://$sock"
echo "export ROLLYARD_DOCKER_BASE_IMAGE=$base_image"
