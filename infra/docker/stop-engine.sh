#!/usr/bin/env bash
# Stops the engine started by start-engine.sh, by the pid in its pidfile (never by name), after
# removing the containers rollyard left (labelled rollyard.sandbox). Images are kept.
set -euo pipefail

state=${1:-${ROLLYARD_DOCKER_STATE:-/var/lib/rollyard-docker}}
pidfile="$state/dockerd.pid"
export DOCKER_HOST="unix://$state/docker.sock"
docker_bin=/usr/bin/docker
[ -x "$docker_bin" ] || docker_bin=$(command -v docker)

if [ ! -f "$pidfile" ]; then
  echo "stop-engine: no pidfile at $pidfile; nothing to stop" >&2
  exit 0
fi
pid=$(cat "$pidfile")
if kill -0 "$pid" 2>/dev/null; then
  ids=$("$docker_bin" ps -aq --filter label=rollyard.sandbox 2>/dev/null || true)
  [ -z "$ids" ] || "$docker_bin" rm -f $ids >/dev/null 2>&1 || true
  kill -TERM "$pid"
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "stop-engine: dockerd $pid did not stop within 10 s" >&2
    exit 1
  fi
fi
rm -f "$pidfile"
echo "stop-engine: stopped" >&2
