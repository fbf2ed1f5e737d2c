# shellcheck shell=bash
# What e2e.sh and fleet/e2e.sh share: their messages, the Compose command,
# the teardown and the wait for an endpoint. Sourced, never run, after the
# script has set E2E_NAME (its messages' prefix), PROJECT (its Compose
# project) and LOG_TAIL (how many lines of each container's log a failed
# run prints), from the directory of its compose.yaml.
#
# It sets `tmp` (a scratch directory, removed at exit), `passed` (0 until
# the script sets it to 1 at its end), `pids` (the script's background load
# clients, stopped at exit) and the EXIT trap that tears the stack down
# (ATENET_E2E_KEEP=1 leaves it up).

: "${E2E_NAME:?}" "${PROJECT:?}" "${LOG_TAIL:?}"

step() { echo "$E2E_NAME: $*"; }
fail() {
  echo "$E2E_NAME: FAIL: $*" >&2
  exit 1
}

command -v curl >/dev/null || fail "curl is missing"
docker info >/dev/null 2>&1 || fail "no Docker engine reachable (docker info failed)"
if docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose_cmd=(docker-compose)
else
  fail "neither docker compose (Compose v2) nor docker-compose (1.29) is installed (make deps-docker)"
fi
compose() { "${compose_cmd[@]}" -f compose.yaml -p "$PROJECT" "$@"; }
step "using $("${compose_cmd[@]}" version | head -n 1)"

tmp=$(mktemp -d)
export tmp
passed=0
pids=()
finish() {
  touch "$tmp/stop"
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  if [ "$passed" != 1 ]; then
    compose logs --no-color --tail="$LOG_TAIL" || true
  fi
  if [ "${ATENET_E2E_KEEP:-0}" = 1 ]; then
    step "stack left up (ATENET_E2E_KEEP=1): ${compose_cmd[*]} -f $PWD/compose.yaml -p $PROJECT down"
  else
    compose down --volumes --remove-orphans --timeout 60 >/dev/null 2>&1 || true
  fi
  rm -rf "$tmp"
}
trap finish EXIT

# wait_for URL CODE SECONDS: polls until URL answers CODE (000: refuses).
wait_for() {
  local deadline=$((SECONDS + $3)) code
  while :; do
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$1" || true)
    [ "$code" = "$2" ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || fail "$1 answered ${code:-nothing}, not $2, within $3s"
    sleep 0.5
  done
}
