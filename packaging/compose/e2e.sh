#!/usr/bin/env bash
# End to end through Envoy: brings up the compose stack beside this file
# (Envoy, atenet-router, ateapi-sim, an echo worker) from the images `make
# e2e` builds, sends real HTTP requests through Envoy, and tears the stack
# down. `make e2e` runs it (after building the images, under an engine it
# starts when none runs), then fleet/e2e.sh, the fleet's stack (two Envoys
# over three routers). Needs a Docker engine, Compose v2 (`docker
# compose`) or Debian's docker-compose 1.29, curl, and free loopback ports.
#
# Truth is what the client got, set against what the echo worker recorded
# (one JSON line per request it received, with the client's
# x-client-request-id) and what ateapi-sim answered (its answer log), never
# the router's counters. What it checks, in order:
#  1. routing: a request for demo/actor-0 gets 200 from the echo worker, which
#     recorded it for that actor, with X-Ate-Target-Port 80 and its path;
#  2. Envoy's stats listener serves /stats/prometheus, and not the admin API;
#  3. parking: CONCURRENCY requests for as many actors at once on a 2-worker
#     pool. Every 200 was recorded by the worker for its actor; more than 2
#     were routed, so some waited: the sim refused them before resuming them
#     (parked, then served); any others are the router's capacity 503s and
#     never reached the worker;
#  4. verdicts through Envoy: an unknown actor gets 404 with x-atenet-reason:
#     atenet_not_found, no actor header 404 atenet_invalid_target, and
#     neither reached the worker;
#  5. a router restart under load (`docker restart`): LOAD_CLIENTS clients
#     send requests one after another for the whole of it. The router drains
#     Envoy (/healthcheck/fail, then /drain_listeners, which leaves Envoy
#     without listeners until it restarts: docs/drain.md), so
#     Envoy is restarted after it, as its pairing with the router requires.
#     The client's answers are counted by verdict; every 200 was recorded by
#     the worker for its actor, every failure is one the restart explains (no
#     answer while Envoy has no listeners or restarts, Envoy's 503 while no
#     router answers), and requests are routed again after it;
#  6. drain (docs/behavior.md B43, B76), with an idle keep-alive client
#     connection open: SIGTERM to the router turns Envoy's /ready to 503 (the
#     router's POST /healthcheck/fail reached Envoy's admin), Envoy closes
#     the idle connection (its idle timeout) before the router exits 0, and
#     Envoy's HTTP listener then refuses connections (/drain_listeners).
#
# Environment: ATENET_E2E_HTTP_PORT (18080), ATENET_E2E_HEALTH_PORT (18081),
# ATENET_E2E_STATS_PORT (19902), ATENET_E2E_METRICS_PORT (19090),
# ATENET_E2E_STATUS_PORT (18440): host loopback ports; ATENET_E2E_CONCURRENCY
# (16, at most 31: the sim has 32 actors); ATENET_E2E_LOAD_CLIENTS (4);
# ATENET_E2E_KEEP=1 leaves the stack up afterwards.
set -euo pipefail
cd "$(dirname "$0")"

export ATENET_E2E_HTTP_PORT=${ATENET_E2E_HTTP_PORT:-18080}
export ATENET_E2E_HEALTH_PORT=${ATENET_E2E_HEALTH_PORT:-18081}
export ATENET_E2E_STATS_PORT=${ATENET_E2E_STATS_PORT:-19902}
export ATENET_E2E_METRICS_PORT=${ATENET_E2E_METRICS_PORT:-19090}
export ATENET_E2E_STATUS_PORT=${ATENET_E2E_STATUS_PORT:-18440}
CONCURRENCY=${ATENET_E2E_CONCURRENCY:-16}
LOAD_CLIENTS=${ATENET_E2E_LOAD_CLIENTS:-4}
WORKERS=2 # ateapi-sim --workers in compose.yaml
PROJECT=atenet-e2e

E2E_NAME=e2e
LOG_TAIL=100
# shellcheck source=lib.sh
. ./lib.sh # step, fail, compose, tmp, passed, pids (step 5's load clients), wait_for

# request NAME ACTOR PATH: one request through Envoy, with ate-target-actor:
# ACTOR unless ACTOR is empty, and x-client-request-id: NAME. Body and
# headers go to $tmp/NAME.{body,headers}; prints the status code (000: no
# answer).
request() {
  local args=(-s -m 40 -o "$tmp/$1.body" -D "$tmp/$1.headers" -w '%{http_code}' -H "x-client-request-id: $1")
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

# The echo worker's record (JSON lines, keys sorted, `"key": value`) and the
# simulator's answer log (`{"time":…,"actor":"…","code":"…"…}`), fetched
# fresh from their containers.
records() { compose exec -T echo-worker cat /records/records.jsonl >"$tmp/records.jsonl"; }
answers() { compose exec -T ateapi-sim cat /log/answers.jsonl >"$tmp/answers.jsonl"; }
# recorded ID [ACTOR]: how many requests with x-client-request-id ID the
# worker received (for ACTOR, when given).
recorded() {
  grep -F "\"request_id\": \"$1\"" "$tmp/records.jsonl" | grep -cF "\"actor\": \"${2:-}" || true
}
# record_has ID KEY VALUE: the worker's record of ID has "KEY": "VALUE".
record_has() {
  grep -F "\"request_id\": \"$1\"" "$tmp/records.jsonl" | grep -qF "\"$2\": \"$3\""
}

step "starting the stack"
compose up -d --no-build
wait_for "http://127.0.0.1:$ATENET_E2E_HEALTH_PORT/ready" 200 120
wait_for "http://127.0.0.1:$ATENET_E2E_METRICS_PORT/readyz" 200 120
router=$(compose ps -q router)
[ -n "$router" ] || fail "no router container"

step "1. a request through Envoy reaches the worker"
code=$(request first demo/actor-0 "/e2e/first?q=1")
[ "$code" = 200 ] || fail "demo/actor-0: $code, not 200: $(cat "$tmp/first.body" 2>/dev/null)"
records
[ "$(recorded first demo/actor-0)" = 1 ] || fail "the worker did not record the request once for demo/actor-0"
record_has first target_port 80 || fail "the worker did not see X-Ate-Target-Port: 80"
record_has first path "/e2e/first?q=1" || fail "the worker did not see the request's path"

step "2. Envoy's stats listener: /stats/prometheus only"
code=$(curl -s -m 5 -o "$tmp/stats" -w '%{http_code}' "http://127.0.0.1:$ATENET_E2E_STATS_PORT/stats/prometheus" || true)
if [ "$code" != 200 ] || ! grep -q '^envoy_' "$tmp/stats"; then
  fail "/stats/prometheus on the stats port: $code"
fi
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$ATENET_E2E_STATS_PORT/server_info" || true)
[ "$code" != 200 ] || fail "the stats port serves the admin API's /server_info"

step "3. saturation: $CONCURRENCY actors at once on $WORKERS workers"
# demo/actor-0 may still hold a worker: the sim frees an idle actor's worker
# when a later request needs one, so the pool is as full either way.
# shellcheck disable=SC2016 # $tmp expands in the inner shell
seq 1 "$CONCURRENCY" | xargs -P "$CONCURRENCY" -I{} \
  bash -c 'request sat-{} demo/actor-{} /e2e/saturate/{} > "$tmp/sat-{}.code"'
records
answers
routed=0
shed=0
parked=0
for i in $(seq 1 "$CONCURRENCY"); do
  code=$(cat "$tmp/sat-$i.code")
  actor=demo/actor-$i
  case "$code" in
    200)
      [ "$(recorded "sat-$i" "$actor")" = 1 ] || fail "$actor: 200, but the worker did not record it once for its actor"
      routed=$((routed + 1))
      # Parked: the sim refused it (no free worker) before resuming it.
      if grep -F "\"actor\":\"$actor\"" "$tmp/answers.jsonl" | head -n 1 | grep -q '"code":"ResourceExhausted"'; then
        parked=$((parked + 1))
      fi
      ;;
    503)
      reason=$(header "sat-$i" x-atenet-reason)
      case "$reason" in
        atenet_budget_exhausted | atenet_no_capacity | atenet_lot_full) shed=$((shed + 1)) ;;
        *) fail "$actor: 503 not from the router's parking (x-atenet-reason: ${reason:-none})" ;;
      esac
      [ "$(recorded "sat-$i")" = 0 ] || fail "$actor: shed with 503, yet the worker received it"
      ;;
    *) fail "$actor: $code" ;;
  esac
done
step "   $routed routed ($parked of them parked first: refused by the sim, then resumed), $shed shed with the router's 503"
[ "$routed" -gt "$WORKERS" ] || fail "only $routed routed: nothing was served after parking"
[ "$parked" -gt 0 ] || fail "no routed request was refused by the sim first: nothing parked"

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
records
if [ "$(recorded unknown)" != 0 ] || [ "$(recorded noactor)" != 0 ]; then
  fail "a 404 verdict reached the worker"
fi

step "5. docker restart of the router under load ($LOAD_CLIENTS clients)"
# load_client N: requests one after another for demo/actor-(N % 2) (two
# actors on two workers: no parking) until $tmp/stop exists; one line per
# request: id code reason time (when it ended).
load_client() {
  local n=0 id code reason
  while [ ! -e "$tmp/stop" ]; do
    n=$((n + 1))
    id=load-$1-$n
    code=$(request "$id" "demo/actor-$(($1 % 2))" "/e2e/load/$1/$n")
    reason=$(header "$id" x-atenet-reason)
    echo "$id $code ${reason:--} $EPOCHREALTIME" >>"$tmp/load-$1"
    rm -f "$tmp/$id.body" "$tmp/$id.headers"
  done
}
export -f load_client header
# routed_since FILE... : how many 200s the load has had so far.
routed_total() { cat "$tmp"/load-* 2>/dev/null | awk '$2 == 200' | wc -l; }
wait_routed() {
  local want=$(($(routed_total) + $1)) deadline=$((SECONDS + 60))
  until [ "$(routed_total)" -ge "$want" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the load got fewer than $1 more 200s in 60s ($2)"
    sleep 0.2
  done
}
for c in $(seq 1 "$LOAD_CLIENTS"); do
  load_client "$c" &
  pids+=($!)
done
wait_routed 20 "before the restart"
start=$SECONDS
docker restart -t 60 "$router" >/dev/null
restart_seconds=$((SECONDS - start))
wait_for "http://127.0.0.1:$ATENET_E2E_METRICS_PORT/readyz" 200 60
# The drain closed Envoy's listeners: it answers nothing until it restarts.
code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$ATENET_E2E_HEALTH_PORT/ready" || true)
[ "$code" = 000 ] || fail "Envoy's health listener answered $code after the router's drain (expected none: /drain_listeners)"
start=$SECONDS
compose restart -t 30 envoy >/dev/null
wait_for "http://127.0.0.1:$ATENET_E2E_HEALTH_PORT/ready" 200 60
envoy_seconds=$((SECONDS - start))
wait_routed 20 "after the restart"
touch "$tmp/stop"
wait "${pids[@]}"
records
cat "$tmp"/load-* >"$tmp/load"
total=$(wc -l <"$tmp/load")
window=$(awk '$2 != 200 { if (first == "" || $4 < first) first = $4; if ($4 > last) last = $4 }
  END { if (first == "") print "none"; else printf "%.1fs", last - first }' "$tmp/load")
step "   router restart ${restart_seconds}s (drain included), then Envoy's ${envoy_seconds}s; $total requests, failures over $window, by verdict:"
awk '{ print $2, $3 }' "$tmp/load" | sort | uniq -c | sort -rn | while read -r count code reason; do
  case "$code $reason" in
    "200 -") what="routed" ;;
    "000 -") what="no answer (Envoy without listeners after the drain, or restarting)" ;;
    "503 -") what="Envoy's 503 (no router answering ext_proc)" ;;
    *) what="UNEXPECTED" ;;
  esac
  printf 'e2e:     %6d  %s %s  %s\n' "$count" "$code" "$reason" "$what"
done
# The truth: every 200 was recorded once, for its actor; nothing the worker
# recorded is a request the client did not send.
while read -r id code reason _; do
  case "$code $reason" in
    "200 -")
      client=${id#load-}
      client=${client%%-*}
      [ "$(recorded "$id" "demo/actor-$((client % 2))")" = 1 ] ||
        fail "$id: 200, but the worker did not record it once for its actor"
      ;;
    "000 -" | "503 -") ;;
    *) fail "$id: $code (x-atenet-reason: $reason) is no failure a restart explains" ;;
  esac
done <"$tmp/load"
unsent=$(grep -o '"request_id": "load-[^"]*"' "$tmp/records.jsonl" | sed 's/.*"\(load-[^"]*\)"/\1/' |
  sort | comm -23 - <(awk '{ print $1 }' "$tmp/load" | sort) | wc -l)
[ "$unsent" = 0 ] || fail "the worker recorded $unsent load requests the clients never sent"
failed_reached=$(awk '$2 != 200 { print $1 }' "$tmp/load" | while read -r id; do recorded "$id"; done |
  awk '{ s += $1 } END { print s + 0 }')
step "   $failed_reached of the failed requests had reached the worker (the client got no answer)"

step "6. drain: SIGTERM to the router, an idle keep-alive client connection open"
# The idle client: one request on a kept-alive connection (fd 3), then
# nothing. Envoy's idle timeout must close it before the router stops (B76).
exec 3<>"/dev/tcp/127.0.0.1/$ATENET_E2E_HTTP_PORT"
printf 'GET /e2e/idle HTTP/1.1\r\nHost: e2e\r\nate-target-actor: demo/actor-0\r\nx-client-request-id: idle\r\n\r\n' >&3
IFS= read -r -t 30 status_line <&3 || fail "no answer on the idle client's connection"
length=0
while IFS= read -r -t 10 line <&3; do
  line=${line%$'\r'}
  [ -n "$line" ] || break
  case "${line,,}" in content-length:*) length=${line#*: } ;; esac
done
read -r -N "$length" -t 10 _ <&3 || fail "the idle client's answer ended early"
case "$status_line" in "HTTP/1.1 200"*) ;; *) fail "the idle client's request: $status_line" ;; esac
router=$(compose ps -q router)
compose kill -s SIGTERM router >/dev/null
signal_time=$EPOCHREALTIME
wait_for "http://127.0.0.1:$ATENET_E2E_HEALTH_PORT/ready" 503 30
# Envoy closes the idle connection: EOF on fd 3, within the drain's window
# (idle timeout 5 s + 10 s, compose.yaml), while the router waits for it.
closed_time=
deadline=$((SECONDS + 30))
while [ -z "$closed_time" ]; do
  if IFS= read -r -t 1 line <&3; then
    fail "the idle client's connection got data after the drain began: $line"
  elif [ $? -le 128 ]; then
    closed_time=$EPOCHREALTIME # EOF (a timeout is above 128)
  fi
  [ "$SECONDS" -lt "$deadline" ] || fail "Envoy did not close the idle client's connection within 30s of SIGTERM"
done
exec 3<&-
deadline=$((SECONDS + 60))
while [ "$(docker inspect -f '{{.State.Running}}' "$router")" = true ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the router has not exited 60s after SIGTERM"
  sleep 0.5
done
exit_code=$(docker inspect -f '{{.State.ExitCode}}' "$router")
[ "$exit_code" = 0 ] || fail "the router exited $exit_code after its drain"
finished=$(docker inspect -f '{{.State.FinishedAt}}' "$router")
exited_time=$(date -d "$finished" +%s.%N)
awk -v c="$closed_time" -v e="$exited_time" 'BEGIN { exit !(c < e) }' ||
  fail "the router exited before Envoy closed the idle client's connection"
awk -v s="$signal_time" -v c="$closed_time" -v e="$exited_time" \
  'BEGIN { printf "e2e:    idle connection closed by Envoy %.1fs after SIGTERM; the router exited 0 at %.1fs\n", c - s, e - s }'
code=$(request after-drain demo/actor-0 /e2e/after-drain)
[ "$code" = 000 ] || fail "Envoy's HTTP listener answered $code after the drain (expected none: /drain_listeners)"

passed=1
step "PASS"
