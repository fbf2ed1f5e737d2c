#!/usr/bin/env bash
# End to end through Envoy: brings up the compose stack beside this file
# (Envoy, atenet-router, ateapi-sim, an echo worker), sends real HTTP requests
# through Envoy, and tears the stack down. `make e2e` runs it. Needs a Docker
# engine with Compose v2, curl, and free loopback ports (see below).
#
# NOT RUN HERE: this script was written on a machine with a docker client but
# no Docker engine. It has only been checked with `bash -n`, and its compose
# file offline (tests/compat/test_compose.py). Its first real run is the
# first `make e2e` on a machine with Docker.
#
# What it checks, in order:
#  1. routing: a request for demo/actor-0 reaches the echo worker, which
#     shows the actor header and X-Ate-Target-Port (80 for a plain request);
#  2. Envoy's stats listener serves /stats/prometheus, and not the admin API;
#  3. parking: CONCURRENCY requests for as many actors at once on a 2-worker
#     pool. More than 2 must be routed, the router's
#     atenet_router_parking_wait_duration_seconds_count{outcome="served"} must
#     be above 0, and any others must be the router's capacity 503s;
#  4. verdicts through Envoy: an unknown actor gets 404 with
#     x-atenet-reason: atenet_not_found, no actor header 404
#     atenet_invalid_target;
#  5. drain: SIGTERM to the router turns Envoy's /ready to 503 (the router's
#     POST /healthcheck/fail reached Envoy's admin), and the router exits 0.
#
# Environment: ATENET_E2E_HTTP_PORT (18080), ATENET_E2E_HEALTH_PORT (18081),
# ATENET_E2E_STATS_PORT (19902), ATENET_E2E_METRICS_PORT (19090),
# ATENET_E2E_STATUS_PORT (14040): host loopback ports; ATENET_E2E_CONCURRENCY
# (16, at most 31: the sim has 32 actors); ATENET_E2E_KEEP=1 leaves the stack
# up afterwards.
set -euo pipefail
cd "$(dirname "$0")"

export ATENET_E2E_HTTP_PORT=${ATENET_E2E_HTTP_PORT:-18080}
export ATENET_E2E_HEALTH_PORT=${ATENET_E2E_HEALTH_PORT:-18081}
export ATENET_E2E_STATS_PORT=${ATENET_E2E_STATS_PORT:-19902}
export ATENET_E2E_METRICS_PORT=${ATENET_E2E_METRICS_PORT:-19090}
export ATENET_E2E_STATUS_PORT=${ATENET_E2E_STATUS_PORT:-14040}
CONCURRENCY=${ATENET_E2E_CONCURRENCY:-16}
WORKERS=2 # ateapi-sim --workers in compose.yaml
PROJECT=atenet-e2e

step() { echo "e2e: $*"; }
fail() {
  echo "e2e: FAIL: $*" >&2
  exit 1
}

command -v curl >/dev/null || fail "curl is missing"
docker info >/dev/null 2>&1 || fail "no Docker engine reachable (docker info failed)"
docker compose version >/dev/null 2>&1 || fail "docker compose (Compose v2) is missing"

compose() { docker compose -f compose.yaml -p "$PROJECT" "$@"; }

tmp=$(mktemp -d)
export tmp
passed=0
finish() {
  if [ "$passed" != 1 ]; then
    compose logs --no-color --tail=200 || true
  fi
  if [ "${ATENET_E2E_KEEP:-0}" = 1 ]; then
    step "stack left up (ATENET_E2E_KEEP=1): docker compose -p $PROJECT down"
  else
    compose down --volumes --remove-orphans --timeout 60 || true
  fi
  rm -rf "$tmp"
}
trap finish EXIT

# wait_for URL CODE SECONDS: polls until URL answers CODE.
wait_for() {
  local deadline=$((SECONDS + $3)) code
  while :; do
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$1" || true)
    [ "$code" = "$2" ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || fail "$1 answered ${code:-nothing}, not $2, within $3s"
    sleep 0.5
  done
}

# request NAME ACTOR PATH: one request through Envoy, with ate-target-actor:
# ACTOR unless ACTOR is empty. Body and headers go to $tmp/NAME.{body,headers};
# prints the status code (000: no answer).
request() {
  local args=(-s -m 40 -o "$tmp/$1.body" -D "$tmp/$1.headers" -w '%{http_code}')
  if [ -n "$2" ]; then
    args+=(-H "ate-target-actor: $2")
  fi
  curl "${args[@]}" "http://127.0.0.1:$ATENET_E2E_HTTP_PORT$3" || true
}
export -f request

# header NAME HEADER: that response header's value.
header() {
  [ -f "$tmp/$1.headers" ] || return 0
  awk -v want="$(printf '%s' "$2" | tr '[:upper:]' '[:lower:]')" '{
    line = $0; sub(/\r$/, "", line)
    name = tolower(substr(line, 1, index(line, ":") - 1))
    if (name == want) { sub(/^[^:]*:[ \t]*/, "", line); print line }
  }' "$tmp/$1.headers"
}

# echoed NAME HEADER VALUE: the echo worker saw HEADER: VALUE.
echoed() {
  grep -qF "\"$2\": \"$3\"" "$tmp/$1.body"
}

step "building and starting the stack"
compose up -d --build
wait_for "http://127.0.0.1:$ATENET_E2E_HEALTH_PORT/ready" 200 120
wait_for "http://127.0.0.1:$ATENET_E2E_METRICS_PORT/readyz" 200 120

step "1. a request through Envoy reaches the worker"
code=$(request first demo/actor-0 "/e2e/first?q=1")
[ "$code" = 200 ] || fail "demo/actor-0: $code, not 200: $(cat "$tmp/first.body" 2>/dev/null)"
echoed first ate-target-actor demo/actor-0 || fail "the worker did not see ate-target-actor: demo/actor-0"
echoed first x-ate-target-port 80 || fail "the worker did not see X-Ate-Target-Port: 80"
echoed first path "/e2e/first?q=1" || fail "the worker did not see the request's path"

step "2. Envoy's stats listener: /stats/prometheus only"
code=$(curl -s -m 5 -o "$tmp/stats" -w '%{http_code}' "http://127.0.0.1:$ATENET_E2E_STATS_PORT/stats/prometheus" || true)
if [ "$code" != 200 ] || ! grep -q '^envoy_' "$tmp/stats"; then
  fail "/stats/prometheus on the stats port: $code"
fi
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$ATENET_E2E_STATS_PORT/server_info" || true)
[ "$code" != 200 ] || fail "the stats port serves the admin API's /server_info"

step "3. saturation: $CONCURRENCY actors at once on $WORKERS workers"
sleep 1 # demo/actor-0 goes idle and frees its worker
# shellcheck disable=SC2016 # $tmp expands in the inner shell
seq 1 "$CONCURRENCY" | xargs -P "$CONCURRENCY" -I{} \
  bash -c 'request sat-{} demo/actor-{} /e2e/saturate/{} > "$tmp/sat-{}.code"'
routed=0
shed=0
for i in $(seq 1 "$CONCURRENCY"); do
  code=$(cat "$tmp/sat-$i.code")
  case "$code" in
    200)
      echoed "sat-$i" ate-target-actor "demo/actor-$i" || fail "demo/actor-$i: routed, but not to its actor"
      routed=$((routed + 1))
      ;;
    503)
      reason=$(header "sat-$i" x-atenet-reason)
      case "$reason" in
        atenet_budget_exhausted | atenet_no_capacity | atenet_lot_full) shed=$((shed + 1)) ;;
        *) fail "demo/actor-$i: 503 not from the router's parking (x-atenet-reason: ${reason:-none})" ;;
      esac
      ;;
    *) fail "demo/actor-$i: $code" ;;
  esac
done
step "   $routed routed, $shed shed with the router's 503"
[ "$routed" -gt "$WORKERS" ] || fail "only $routed routed: nothing was served after parking"
served=$(curl -s -m 5 "http://127.0.0.1:$ATENET_E2E_METRICS_PORT/metrics" |
  awk '/^atenet_router_parking_wait_duration_seconds_count\{/ && /outcome="served"/ { s += $NF } END { print s + 0 }')
awk -v s="$served" 'BEGIN { exit !(s > 0) }' ||
  fail "atenet_router_parking_wait_duration_seconds_count{outcome=\"served\"} is $served"
step "   parked and served: $served"

step "4. the router's verdicts come back through Envoy"
code=$(request unknown demo/nobody /e2e/verdict)
reason=$(header unknown x-atenet-reason)
if [ "$code" != 404 ] || [ "$reason" != atenet_not_found ]; then
  fail "unknown actor: $code, x-atenet-reason: ${reason:-none} (expected 404 atenet_not_found)"
fi
code=$(request noactor "" /e2e/verdict)
reason=$(header noactor x-atenet-reason)
if [ "$code" != 404 ] || [ "$reason" != atenet_invalid_target ]; then
  fail "no actor header: $code, x-atenet-reason: ${reason:-none} (expected 404 atenet_invalid_target)"
fi

step "5. drain: SIGTERM to the router"
router=$(compose ps -aq router)
compose kill -s SIGTERM router
wait_for "http://127.0.0.1:$ATENET_E2E_HEALTH_PORT/ready" 503 30
deadline=$((SECONDS + 60))
while [ "$(docker inspect -f '{{.State.Running}}' "$router")" = true ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the router has not exited 60s after SIGTERM"
  sleep 1
done
exit_code=$(docker inspect -f '{{.State.ExitCode}}' "$router")
[ "$exit_code" = 0 ] || fail "the router exited $exit_code after its drain"

passed=1
step "PASS"
