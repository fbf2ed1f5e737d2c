#!/usr/bin/env bash
# End to end through a fleet: brings up the compose stack beside this file
# (two Envoys, three fleet routers, ateapi-sim, an echo worker) from the
# images `make e2e` builds, sends real HTTP requests through both Envoys,
# and tears the stack down. `make e2e` runs it after ../e2e.sh (the
# one-router stack); it has its own project (atenet-e2e-fleet), subnet and
# host ports, so the two never clash. Needs a Docker engine, Compose v2
# (`docker compose`) or Debian's docker-compose 1.29, curl, and free
# loopback ports.
#
# Truth is what the client got, set against what the echo worker recorded
# (one JSON line per request it received, with the client's
# x-client-request-id) and what ateapi-sim answered (its answer log), never
# the router's counters. Envoy's own stats time the windows (the routers it
# counts healthy) and show what it retried. Load: LOAD_CLIENTS clients, each sending requests
# one after another, each for a random actor of the sim's 24 through a
# random one of the two Envoys, which saturates the sim's 6 workers. A
# request succeeds when it is 200 and recorded by the worker once, for its
# actor, or when a router answered it itself (x-atenet-reason: a parking
# 503, say); anything else is a failure, counted by kind. Checks, in order:
#  1. routing: a request through each Envoy reaches the worker;
#  2. one flight per actor (B87): under the load, until FLIGHT_REQUESTS are
#     answered, the sim never answered Aborted (its answer to a second
#     resume of an actor already being resumed, which only a second router
#     can send), parking happened (an actor refused ResourceExhausted, then
#     resumed), both Envoys served, and no request failed;
#  3. a `docker restart` of router-1 under the load, 0 failed requests: the
#     fleet router's drain (B85: health NOT_SERVING, --drain-delay 5s, which
#     covers every Envoy's 1s health check, then its streams finished)
#     takes it out of both Envoys' rotation before it stops taking streams,
#     so neither Envoy retried a stream or failed a connect (retries on
#     another router would hide a drain delay too short for the health
#     checks: with --drain-delay=0s no request failed, 6 streams were
#     retried); it exits 0 within its stop timeout (stop_grace_period), no
#     Envoy is drained (both still /ready), and both take it back after the
#     restart;
#  4. router-2 killed under the load (`docker kill`, SIGKILL), then started
#     again: the failures, counted by kind, are at most the requests in
#     flight at the kill plus those sent before both Envoys had taken the
#     router out of rotation. Those are the only requests the kill can
#     touch: once an Envoy counts the router out, no stream goes to it
#     (healthy_panic_threshold 0, B87). Its kernel resets the streams it
#     held as it dies; its address then stops answering at all on the
#     bridge, so a connect to it times out (0.25 s, connect_timeout) rather
#     than being refused. The ext_proc retry takes either to another router
#     (previous_hosts, B87), and outlier detection ejects the router after 3
#     such failures, before its health checks time out twice: 0 failed in
#     every run here (8 with the retry policy removed);
#  5. router-0 paused under the load (`docker pause`: its processes frozen,
#     its connections still open in its kernel), then unpaused: 0 failed
#     requests. Each Envoy takes it out of rotation (its health checks time
#     out) and closes its connections to it once a ping has gone unanswered
#     for 3 s (B102), and the streams they held are retried on another
#     router; without the keepalive those streams waited for their message
#     timeout and got Envoy's 504.
# Each step prints its numbers: requests, outcomes by kind, ResumeActor
# answers by code, the windows.
#
# Environment: ATENET_FLEET_HTTP0_PORT (18180), ATENET_FLEET_HEALTH0_PORT
# (18181), ATENET_FLEET_STATS0_PORT (19912), ATENET_FLEET_HTTP1_PORT
# (18190), ATENET_FLEET_HEALTH1_PORT (18191), ATENET_FLEET_STATS1_PORT
# (19922): host loopback ports of envoy-0 and envoy-1;
# ATENET_FLEET_LOAD_CLIENTS (16); ATENET_FLEET_REQUESTS (400, step 2);
# ATENET_E2E_KEEP=1 leaves the stack up afterwards.
set -euo pipefail
cd "$(dirname "$0")"

export ATENET_FLEET_HTTP0_PORT=${ATENET_FLEET_HTTP0_PORT:-18180}
export ATENET_FLEET_HEALTH0_PORT=${ATENET_FLEET_HEALTH0_PORT:-18181}
export ATENET_FLEET_STATS0_PORT=${ATENET_FLEET_STATS0_PORT:-19912}
export ATENET_FLEET_HTTP1_PORT=${ATENET_FLEET_HTTP1_PORT:-18190}
export ATENET_FLEET_HEALTH1_PORT=${ATENET_FLEET_HEALTH1_PORT:-18191}
export ATENET_FLEET_STATS1_PORT=${ATENET_FLEET_STATS1_PORT:-19922}
LOAD_CLIENTS=${ATENET_FLEET_LOAD_CLIENTS:-16}
FLIGHT_REQUESTS=${ATENET_FLEET_REQUESTS:-400}
ACTORS=24  # ateapi-sim --actors in compose.yaml
WORKERS=6  # ateapi-sim --workers
ROUTERS=3  # router-0 .. router-2, envoy-config.flags' --routers
PROJECT=atenet-e2e-fleet
http_ports=("$ATENET_FLEET_HTTP0_PORT" "$ATENET_FLEET_HTTP1_PORT")
health_ports=("$ATENET_FLEET_HEALTH0_PORT" "$ATENET_FLEET_HEALTH1_PORT")
stats_ports=("$ATENET_FLEET_STATS0_PORT" "$ATENET_FLEET_STATS1_PORT")

E2E_NAME="e2e fleet"
LOG_TAIL=60
# shellcheck source=../lib.sh
. ../lib.sh # step, fail, compose, tmp, passed, pids (the load clients), wait_for

# stop_load: stops the load clients and waits for them to finish.
stop_load() {
  touch "$tmp/stop"
  if [ ${#pids[@]} -gt 0 ]; then
    wait "${pids[@]}" 2>/dev/null || true
  fi
  pids=()
  rm -f "$tmp/stop"
}

# healthy J: how many routers Envoy J has in rotation (its router cluster's
# membership_healthy: health checks and outlier detection together).
healthy() {
  { curl -s -m 2 "http://127.0.0.1:${stats_ports[$1]}/stats/prometheus" 2>/dev/null || true; } |
    awk '/^envoy_cluster_membership_healthy\{/ && /envoy_cluster_name="atenet_router"/ { print $2; found = 1; exit }
      END { if (!found) print "?" }'
}
# envoy_sum NAME...: what both Envoys counted so far on their router
# cluster, summed over NAMEs (envoy_cluster_NAME): how they saw a router
# leave.
envoy_sum() {
  for j in 0 1; do
    { curl -s -m 2 "http://127.0.0.1:${stats_ports[$j]}/stats/prometheus" 2>/dev/null || true; } |
      grep -F 'envoy_cluster_name="atenet_router"'
  done | awk -v names="$*" 'BEGIN { n = split(names, want, " "); for (i = 1; i <= n; i++) wanted["envoy_cluster_" want[i]] = 1 }
    { name = $1; sub(/\{.*/, "", name); if (name in wanted) sum += $2 } END { print sum + 0 }'
}
# snapshot: the counts the printout shows, in one line; counters BEFORE:
# that printout, counted since the snapshot BEFORE.
COUNTED=(upstream_rq_retry upstream_rq_retry_success upstream_cx_connect_timeout upstream_cx_connect_fail
  outlier_detection_ejections_enforced_total health_check_failure health_check_network_failure
  http2_keepalive_timeout)
snapshot() {
  local name line=""
  for name in "${COUNTED[@]}"; do line+="$(envoy_sum "$name") "; done
  echo "$line"
}
counters() {
  local -a before after
  read -r -a before <<<"$1"
  read -r -a after <<<"$(snapshot)"
  local d=()
  for i in "${!COUNTED[@]}"; do d+=($((after[i] - before[i]))); done
  echo "retries ${d[0]} (${d[1]} succeeded), connect timeouts ${d[2]}, connect failures ${d[3]}," \
    "ejections ${d[4]}, failed health checks ${d[5]} (${d[6]} network), keepalive timeouts ${d[7]}"
}
# wait_healthy N SECONDS WHAT: until both Envoys have N routers in rotation;
# prints when that was ($EPOCHREALTIME).
wait_healthy() {
  local deadline=$((SECONDS + $2)) a b
  while :; do
    a=$(healthy 0)
    b=$(healthy 1)
    if [ "$a" = "$1" ] && [ "$b" = "$1" ]; then
      echo "$EPOCHREALTIME"
      return 0
    fi
    [ "$SECONDS" -lt "$deadline" ] || fail "$3: the Envoys have $a and $b routers in rotation, not $1, after $2s"
    sleep 0.1
  done
}

# request ID ENVOY ACTOR: one request through Envoy ENVOY (0 or 1) for
# ACTOR, with x-client-request-id: ID; prints `code curl-exit reason`
# (code 000: no answer; reason -: no x-atenet-reason).
request() {
  local code rc=0 reason
  code=$(curl -s -m 60 -o /dev/null -D "$tmp/$1.headers" -w '%{http_code}' -H "ate-target-actor: $3" \
    -H "x-client-request-id: $1" "http://127.0.0.1:${http_ports[$2]}/fleet/$1") || rc=$?
  reason=$(sed -n 's/^[Xx]-[Aa]tenet-[Rr]eason: *\([^[:space:]]*\).*/\1/p' "$tmp/$1.headers" 2>/dev/null | head -n 1)
  rm -f "$tmp/$1.headers"
  echo "${code:-000} $rc ${reason:--}"
}

# load_client PHASE N: requests one after another, each for a random actor
# through a random Envoy, until $tmp/stop exists; one line per request:
# id envoy actor code curl-exit reason began ended.
load_client() {
  local n=0 id envoy actor began answer
  RANDOM=$(($2 * 7919 + 10#${EPOCHREALTIME#*.} % 1000))
  while [ ! -e "$tmp/stop" ]; do
    n=$((n + 1))
    id=$1-$2-$n
    envoy=$((RANDOM % 2))
    actor=demo/actor-$((RANDOM % ACTORS))
    began=$EPOCHREALTIME
    answer=$(request "$id" "$envoy" "$actor")
    echo "$id $envoy $actor $answer $began $EPOCHREALTIME" >>"$tmp/load-$1-$2"
  done
}
start_load() {
  for c in $(seq 1 "$LOAD_CLIENTS"); do
    load_client "$1" "$c" &
    pids+=($!)
  done
}
answered() { cat "$tmp/load-$1"-* 2>/dev/null | wc -l; }
routed() { cat "$tmp/load-$1"-* 2>/dev/null | awk '$4 == 200 && $6 == "-"' | wc -l; }
# wait_load PHASE HOW N WHAT: until N more of PHASE's requests are HOW
# (answered, routed).
wait_load() {
  local want=$(($($2 "$1") + $3)) deadline=$((SECONDS + 120))
  until [ "$($2 "$1")" -ge "$want" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the load got fewer than $3 more $2 requests in 120s ($4)"
    sleep 0.2
  done
}

# The echo worker's record and the sim's answer log, fresh from their
# containers.
records() { compose exec -T echo-worker cat /records/records.jsonl >"$tmp/records.jsonl"; }
answers() { compose exec -T ateapi-sim cat /log/answers.jsonl >"$tmp/answers.jsonl"; }

# outcomes PHASE: each request of PHASE as `kind id began ended`, judged
# against the worker's record (records first). A kind that starts with
# FAIL is a failed request.
outcomes() {
  cat "$tmp/load-$1"-* >"$tmp/load-$1"
  awk 'FNR == NR {
      if (match($0, /"request_id": "[^"]*"/)) {
        id = substr($0, RSTART + 15, RLENGTH - 16); seen[id]++
        if (match($0, /"actor": "[^"]*"/)) actor[id] = substr($0, RSTART + 10, RLENGTH - 11)
      }
      next
    }
    {
      id = $1; code = $4; rc = $5; reason = $6; n = seen[id] + 0
      if (code == 200 && reason == "-") {
        if (n == 1 && actor[id] == $3) kind = "routed"
        else if (n == 0) kind = "FAIL:200-the-worker-never-received"
        else if (n > 1) kind = "FAIL:200-received-" n "-times"
        else kind = "FAIL:200-received-for-" actor[id]
      } else if (reason ~ /^atenet_/) {
        kind = (n == 0) ? "verdict:" code "-" reason : "FAIL:verdict-" reason "-yet-received"
      } else if (code == "000") {
        kind = "FAIL:no-answer(curl-exit-" rc ")"
      } else {
        kind = "FAIL:" code "-from-Envoy"
      }
      print kind, id, $7, $8
    }' "$tmp/records.jsonl" "$tmp/load-$1" >"$tmp/outcomes-$1"
  # Nothing the worker received is a request the clients did not send.
  local unsent
  unsent=$(grep -o "\"request_id\": \"$1-[^\"]*\"" "$tmp/records.jsonl" | sed 's/.*"\([^"]*\)"$/\1/' | sort |
    comm -23 - <(awk '{ print $1 }' "$tmp/load-$1" | sort) | wc -l)
  [ "$unsent" = 0 ] || fail "$1: the worker recorded $unsent requests the clients never sent"
}
# tally PHASE: the outcomes by kind, most first.
tally() {
  awk '{ print $1 }' "$tmp/outcomes-$1" | sort | uniq -c | sort -rn |
    while read -r count kind; do printf 'e2e fleet:     %6d  %s\n' "$count" "${kind//-/ }"; done
}
failed() { grep -c '^FAIL' "$tmp/outcomes-$1" || true; }
# death CONTAINER SINCE: the exit code of CONTAINER's last death since
# SINCE (unix seconds) and when it was, from the engine's events.
death() {
  docker events --since "$2" --until "$(date +%s.%N)" --filter "container=$1" --filter event=die \
    --format '{{.Actor.Attributes.exitCode}} {{.TimeNano}}' | tail -n 1
}

step "starting the stack"
compose up -d --no-build
for j in 0 1; do
  wait_for "http://127.0.0.1:${health_ports[$j]}/ready" 200 120
done
wait_healthy "$ROUTERS" 60 "at startup" >/dev/null

step "1. a request through each Envoy reaches the worker"
for j in 0 1; do
  answer=$(request "first-$j" "$j" demo/actor-0)
  [ "${answer%% *}" = 200 ] || fail "through envoy-$j: $answer, not 200"
done
records
for j in 0 1; do
  grep -F "\"request_id\": \"first-$j\"" "$tmp/records.jsonl" | grep -qF '"actor": "demo/actor-0"' ||
    fail "the worker did not record first-$j for demo/actor-0"
done

step "2. one flight per actor: $LOAD_CLIENTS clients, $ACTORS actors on $WORKERS workers, both Envoys"
: >"$tmp/answers.jsonl"
start_load flight
wait_load flight answered "$FLIGHT_REQUESTS" "one flight per actor"
stop_load
records
answers
outcomes flight
total=$(wc -l <"$tmp/outcomes-flight")
step "   $total requests ($(awk '$2 == 0' "$tmp/load-flight" | wc -l) through envoy-0, $(awk '$2 == 1' "$tmp/load-flight" | wc -l) through envoy-1):"
tally flight
calls=$(grep -o '"code":"[A-Za-z]*"' "$tmp/answers.jsonl" | sed 's/"code":"\(.*\)"/\1/' | sort | uniq -c |
  awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')
# Parked: an actor refused (no free worker), then resumed by a later call.
parked=$(awk '/"code":"ResourceExhausted"/ { match($0, /"actor":"[^"]*"/); refused[substr($0, RSTART, RLENGTH)] = 1 }
  /"code":"OK"/ && /"resumed":true/ { match($0, /"actor":"[^"]*"/); a = substr($0, RSTART, RLENGTH); if (refused[a]) { n++; refused[a] = 0 } }
  END { print n + 0 }' "$tmp/answers.jsonl")
step "   ResumeActor answers: $calls; $parked resumes after a ResourceExhausted (parked, then served)"
aborted=$(grep -c '"code":"Aborted"' "$tmp/answers.jsonl" || true)
[ "$aborted" = 0 ] || fail "the sim answered Aborted $aborted times: two routers resumed one actor at once ($(grep -m 3 '"code":"Aborted"' "$tmp/answers.jsonl" | tr '\n' ' '))"
grep -q '"code":"ResourceExhausted"' "$tmp/answers.jsonl" || fail "the sim never refused a resume: the pool was not saturated"
[ "$parked" -gt 0 ] || fail "no actor was resumed after a ResourceExhausted: nothing parked"
for j in 0 1; do
  [ "$(awk -v j="$j" '$2 == j && $4 == 200' "$tmp/load-flight" | wc -l)" -gt 0 ] || fail "nothing was routed through envoy-$j"
done
[ "$(failed flight)" = 0 ] || fail "$(failed flight) requests failed: $(grep -m 5 '^FAIL' "$tmp/outcomes-flight" | tr '\n' ' ')"

step "3. docker restart of router-1 under load ($LOAD_CLIENTS clients)"
router=$(compose ps -q router-1)
[ -n "$router" ] || fail "no router-1 container"
grace=$(docker inspect -f '{{.Config.StopTimeout}}' "$router")
start_load restart
wait_load restart routed 50 "before the restart"
retried=$(envoy_sum upstream_rq_retry upstream_cx_connect_fail)
counted=$(snapshot)
since=$(date +%s.%N)
began=$EPOCHREALTIME
docker restart "$router" >/dev/null &
restarting=$!
out=$(wait_healthy $((ROUTERS - 1)) 30 "router-1 draining")
wait "$restarting" || fail "docker restart router-1 failed"
restarted=$EPOCHREALTIME
back=$(wait_healthy "$ROUTERS" 60 "router-1 restarted")
read -r exit_code died < <(death "$router" "$since") || true
[ "$exit_code" = 0 ] || fail "router-1 exited ${exit_code:-?} from its drain (not 0)"
wait_load restart routed 50 "after the restart"
stop_load
for j in 0 1; do
  # A fleet router drains no Envoy (B85): both still take requests.
  wait_for "http://127.0.0.1:${health_ports[$j]}/ready" 200 5
done
records
outcomes restart
awk -v b="$began" -v o="$out" -v d="$died" -v r="$restarted" -v k="$back" -v g="$grace" 'BEGIN {
  printf "e2e fleet:    out of rotation in both Envoys %.1fs after docker restart; exited 0 at %.1fs (stop timeout %ss); restarted at %.1fs; back in both at %.1fs\n", o - b, d / 1e9 - b, g, r - b, k - b }'
step "   $(wc -l <"$tmp/outcomes-restart") requests:"
tally restart
step "   both Envoys counted: $(counters "$counted")"
[ "$(failed restart)" = 0 ] ||
  fail "$(failed restart) requests failed across the restart: $(grep -m 5 '^FAIL' "$tmp/outcomes-restart" | tr '\n' ' ')"
# The drain took router-1 out of both Envoys' rotation before it stopped
# taking streams: no stream had to be retried elsewhere (retries would hide
# a drain delay too short for the health checks).
retried=$(($(envoy_sum upstream_rq_retry upstream_cx_connect_fail) - retried))
[ "$retried" = 0 ] ||
  fail "the Envoys retried or failed to connect $retried times across the restart: router-1 stopped taking streams while still in rotation (--drain-delay shorter than the health checks need?)"

step "4. docker kill of router-2 under load ($LOAD_CLIENTS clients), then docker start"
router=$(compose ps -q router-2)
[ -n "$router" ] || fail "no router-2 container"
start_load kill
wait_load kill routed 50 "before the kill"
counted=$(snapshot)
killed=$EPOCHREALTIME
docker kill "$router" >/dev/null
# When each Envoy took it out (printed), and when both had.
out0='' out1=''
deadline=$((SECONDS + 30))
while [ -z "$out0" ] || [ -z "$out1" ]; do
  [ -n "$out0" ] || [ "$(healthy 0)" != $((ROUTERS - 1)) ] || out0=$EPOCHREALTIME
  [ -n "$out1" ] || [ "$(healthy 1)" != $((ROUTERS - 1)) ] || out1=$EPOCHREALTIME
  [ "$SECONDS" -lt "$deadline" ] || fail "router-2 killed: not out of rotation in both Envoys after 30s"
  sleep 0.1
done
out=$(awk -v a="$out0" -v b="$out1" 'BEGIN { print (a > b) ? a : b }')
docker start "$router" >/dev/null
started=$EPOCHREALTIME
back=$(wait_healthy "$ROUTERS" 60 "router-2 started again")
wait_load kill routed 50 "after the kill"
stop_load
records
outcomes kill
# The bound: requests in flight at the kill, plus those sent before both
# Envoys had taken router-2 out of rotation.
read -r in_flight sent_before < <(awk -v k="$killed" -v o="$out" '
  $3 < k && $4 > k { f++ } $3 >= k && $3 < o { s++ } END { print f + 0, s + 0 }' "$tmp/outcomes-kill")
bound=$((in_flight + sent_before))
fails=$(failed kill)
window=$(awk -v k="$killed" '/^FAIL/ { if (first == "" || $4 < first) first = $4; if ($4 > last) last = $4 }
  END { if (first == "") print "none"; else printf "%.1f-%.1fs after the kill", first - k, last - k }' "$tmp/outcomes-kill")
awk -v k="$killed" -v a="$out0" -v c="$out1" -v s="$started" -v b="$back" 'BEGIN {
  printf "e2e fleet:    out of rotation in envoy-0 %.1fs and envoy-1 %.1fs after the kill; started again at %.1fs; back in both at %.1fs\n", a - k, c - k, s - k, b - k }'
step "   $(wc -l <"$tmp/outcomes-kill") requests; $fails failed (failures: $window), bound $bound ($in_flight in flight at the kill + $sent_before sent before both Envoys took router-2 out):"
tally kill
step "   both Envoys counted: $(counters "$counted")"
[ "$fails" -le "$bound" ] ||
  fail "$fails requests failed around the kill, above the bound of $bound: $(grep -m 5 '^FAIL' "$tmp/outcomes-kill" | tr '\n' ' ')"

step "5. docker pause of router-0 under load ($LOAD_CLIENTS clients), then docker unpause"
router=$(compose ps -q router-0)
[ -n "$router" ] || fail "no router-0 container"
start_load pause
wait_load pause routed 50 "before the pause"
counted=$(snapshot)
timeouts=$(envoy_sum http2_keepalive_timeout)
paused=$EPOCHREALTIME
docker pause "$router" >/dev/null
trap 'docker unpause "$router" >/dev/null 2>&1 || true; finish' EXIT
out=$(wait_healthy $((ROUTERS - 1)) 30 "router-0 paused")
# Both Envoys close connections to it for an unanswered ping (B102; its
# health-check connections count too, so the 0 failed below is the proof).
deadline=$((SECONDS + 30))
until [ "$(envoy_sum http2_keepalive_timeout)" -ge $((timeouts + 2)) ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "router-0 paused: the Envoys closed $(($(envoy_sum http2_keepalive_timeout) - timeouts)) connections to it for an unanswered ping in 30s, not 2"
  sleep 0.1
done
closed=$EPOCHREALTIME
wait_load pause routed 50 "while router-0 is paused"
docker unpause "$router" >/dev/null
trap finish EXIT
unpaused=$EPOCHREALTIME
back=$(wait_healthy "$ROUTERS" 60 "router-0 unpaused")
wait_load pause routed 50 "after the unpause"
stop_load
records
outcomes pause
awk -v p="$paused" -v o="$out" -v c="$closed" -v u="$unpaused" -v b="$back" 'BEGIN {
  printf "e2e fleet:    out of rotation in both Envoys %.1fs after the pause; 2 keepalive timeouts counted by %.1fs; unpaused at %.1fs; back in both at %.1fs\n", o - p, c - p, u - p, b - p }'
step "   $(wc -l <"$tmp/outcomes-pause") requests; $(failed pause) failed:"
tally pause
step "   both Envoys counted: $(counters "$counted")"
# A paused router answers nothing, yet its kernel keeps its connections:
# only Envoy's keepalive closes them, and the streams on them are retried
# on another router (B102).
[ "$(failed pause)" = 0 ] ||
  fail "$(failed pause) requests failed around the pause: $(grep -m 5 '^FAIL' "$tmp/outcomes-pause" | tr '\n' ' ')"

passed=1
step "PASS"
