"""A router that crashes, restarts or is not there at all, behind a real
Envoy 1.40 (issue 19, part 2): the generated bootstrap's `status_on_error:
503` and `grpc_service.retry_policy` (B67). The client's answer and the
worker's record are the truth.

Measured on 1.40 (docs/envoy.md): Envoy retries an ext_proc stream only
while the router has sent nothing on it, and a retry keeps the stream's
message timeout running from the first send.
"""

import http.client
import threading
import time

import pytest

from envoy_stack import LOOPBACK, Stack

# demo/parks is refused 40 times (2 s at the 50 ms retry interval), then
# resumed: a request for it is parked for about 2 s, on whichever router.
SCRIPT = "".join(["demo/parks ResourceExhausted 0s - false no free workers available\n"] * 40) + \
    "demo/parks OK 0s 127.0.1.1 true -\n"
FLAGS = ["--parked-request-budget", "20s", "--parked-request-retry-interval", "50ms",
         "--parked-request-retry-jitter", "0", "--parked-request-retry-factor", "1"]


def get(stack, actor, request_id):
    conn = http.client.HTTPConnection(LOOPBACK, stack.http_port, timeout=60)
    started = time.monotonic()
    try:
        conn.request("GET", "/", headers={"ate-target-actor": actor, "x-client-request-id": request_id})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("x-atenet-reason"), time.monotonic() - started
    finally:
        conn.close()


@pytest.fixture
def stack():
    with Stack(router_flags=FLAGS, script=SCRIPT, workers=1) as s:
        yield s


def test_a_request_parked_when_the_router_is_killed_is_served_by_its_successor(stack):
    """SIGKILL with a request parked, a new router on the same port at once:
    Envoy retries the stream (the router had sent nothing on it) and the
    new router parks and serves it."""
    answer = {}
    client = threading.Thread(target=lambda: answer.update(reply=get(stack, "demo/parks", "killed-1")))
    client.start()
    stack.wait_router_metric("atenet_router_parking_active", 1)
    stack.router.proc.kill()
    stack.router.proc.wait(timeout=30)
    stack.start_router()
    client.join(timeout=90)
    status, reason, _ = answer["reply"]
    assert (status, reason) == (200, None), answer
    assert [r["request_id"] for r in stack.records()] == ["killed-1"], "served once, by the worker"


def test_no_router_at_all_is_a_503_within_seconds(stack):
    """With no router, Envoy retries the stream, then answers its own 503
    (status_on_error), not a 500: a retryable answer, without the router's
    reason, in a few seconds."""
    stack.stop_router()
    status, reason, elapsed = get(stack, "demo/any", "nobody-home")
    assert (status, reason) == (503, None)
    assert elapsed < 30, "8 retries of at most 1 s each, then the 503"
    assert stack.records() == []
    entry = stack.wait_access_log(lambda e: e["response_code"] == 503)
    assert "ext_proc_error" in entry["response_code_details"], entry
