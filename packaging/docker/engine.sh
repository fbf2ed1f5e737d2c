#!/usr/bin/env bash
# A Docker engine for `make docker`, `make e2e` and the tests: the one that
# answers `docker info` when there is one, else a dockerd started here and
# stopped afterwards (never one that was already running).
#
#   packaging/docker/engine.sh run CMD [ARG...]  CMD with an engine; stops the dockerd it started
#   packaging/docker/engine.sh start             starts one if none answers; prints the pid it
#                                                started (nothing when one was running)
#   packaging/docker/engine.sh stop PID          stops the dockerd `start` printed
#
# The dockerd it starts: ATENET_DOCKERD_FLAGS (default `--storage-driver=vfs
# --iptables=false --ip6tables=false`, what works in a container without
# overlayfs or iptables), its log in ATENET_DOCKER_CACHE/dockerd.log
# (/var/tmp/atenet-docker).
set -euo pipefail

cache=${ATENET_DOCKER_CACHE:-/var/tmp/atenet-docker}
read -r -a flags <<<"${ATENET_DOCKERD_FLAGS:---storage-driver=vfs --iptables=false --ip6tables=false}"

die() {
  echo "engine: $*" >&2
  exit 1
}

start() {
  docker info >/dev/null 2>&1 && return 0
  command -v dockerd >/dev/null ||
    die "no Docker engine answers and dockerd is missing: make deps-docker installs Debian's docker.io"
  mkdir -p "$cache"
  # Its own session, so that a Ctrl-C meant for the caller does not reach it.
  setsid dockerd "${flags[@]}" >>"$cache/dockerd.log" 2>&1 </dev/null &
  local pid=$! deadline=$((SECONDS + 60))
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$cache/dockerd.log" >&2
      die "dockerd ${flags[*]} exited at startup (log above, all of it in $cache/dockerd.log)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      stop "$pid"
      die "dockerd ${flags[*]} did not answer within 60 s ($cache/dockerd.log)"
    fi
    sleep 0.5
  done
  echo "engine: started dockerd ${flags[*]} (pid $pid)" >&2
  echo "$pid"
}

stop() {
  local pid=$1 deadline=$((SECONDS + 90))
  kill -TERM "$pid" 2>/dev/null || return 0
  # dockerd stops its containers first (15 s each at most), then exits.
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "dockerd (pid $pid) still runs 90 s after SIGTERM"
    sleep 0.5
  done
  echo "engine: stopped dockerd (pid $pid)" >&2
}

case "${1:-}" in
  start) start ;;
  stop)
    [ -n "${2:-}" ] || die "usage: engine.sh stop PID"
    stop "$2"
    ;;
  run)
    shift
    [ $# -gt 0 ] || die "usage: engine.sh run CMD [ARG...]"
    pid=$(start)
    # Stopped however CMD ends (Ctrl-C included).
    trap 'if [ -n "$pid" ]; then stop "$pid"; fi' EXIT
    "$@"
    ;;
  *) die "usage: engine.sh run CMD [ARG...] | start | stop PID" ;;
esac
