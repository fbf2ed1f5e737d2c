"""`parkload --http` through a real Envoy (envoy_stack.py): what it counts
against what Envoy logged and what the echo worker received.

parkload's own report is never its own truth here: each request's verdict
is checked against Envoy's access log (status and x-atenet-reason), each
routed request against the worker's record (its actor), and keep-alive
against Envoy's count of downstream connections.
"""

import json
import subprocess
import time
from collections import Counter

import pytest

from envoy_stack import BIN, Stack

PARKLOAD = f"{BIN}/parkload"
# Four actors the sim runs, and one it has never heard of.
ACTORS = "demo/actor-{0..3},demo/nobody"


@pytest.fixture(scope="module")
def stack():
    with Stack(sim_flags=["--actors", "4"], workers=4) as s:
        yield s


def parkload(*args):
    return subprocess.run([PARKLOAD, *args], capture_output=True, text=True, timeout=120)


def verdict_key(entry):
    """What parkload should have counted for an access-log entry."""
    reason = entry.get("atenet_reason")
    code = str(entry["response_code"])
    return code if reason in (None, "", "-") else f"{code} {reason}"


def test_verdicts_are_what_envoy_answered_and_the_worker_received(stack):
    connections = stack.ingress_connections()["total"]
    logged, recorded = len(stack.access_log()), len(stack.records())
    ran = parkload("--http", f"{stack.url}/through-envoy", "--actors", ACTORS, "--distribution", "round-robin",
                   "--count", "200", "--concurrency", "4", "--json", "--progress", "0")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = json.loads(ran.stdout)
    assert report["requests"] == 200 and report["errors"] == 0, report

    deadline = time.monotonic() + 15  # Envoy flushes its access log every 100 ms
    while len(stack.access_log()) < logged + 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    entries = stack.access_log()[logged:]
    assert len(entries) == 200, entries[-3:]
    assert all(e["path"] == "/through-envoy" for e in entries), entries[:3]
    assert Counter(verdict_key(e) for e in entries) == report["verdicts"]
    # The unknown actor is the router's own answer, reason and all.
    refused = {k: n for k, n in report["verdicts"].items() if k != "200"}
    assert list(refused.values()) == [40] and " atenet_" in next(iter(refused)), report["verdicts"]

    records = stack.records()[recorded:]
    assert Counter(r["actor"] for r in records) == {f"demo/actor-{i}": 40 for i in range(4)}
    assert report["verdicts"]["200"] == 160

    # Four requests in flight, four keep-alive connections for all 200.
    assert stack.ingress_connections()["total"] - connections == 4
