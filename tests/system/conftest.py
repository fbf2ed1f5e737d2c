"""Fixtures: the real ateapi-sim and atenet-router binaries on loopback.

Both bind port 0; their real addresses are read from their startup lines.
"""

import os
import subprocess
import tempfile
import threading

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

BIN = os.environ.get("ATENET_BIN_DIR", "/var/tmp/atenet-router-target/release")


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
