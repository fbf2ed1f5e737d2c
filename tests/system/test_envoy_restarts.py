"""A router that crashes, restarts or is not there at all, behind a real
Envoy 1.40 (issue 19, part 2): the generated bootstrap's `status_on_error:
503` and `grpc_service.retry_policy` (B67). The client's answer and the
worker's record are the truth.

Measured on 1.40 (docs/envoy.md): Envoy retries an ext_proc stream only
while the router has sent nothing on it, and a retry keeps the stream's
message timeout running from the first send.

The crash, the drain and the SIGHUP hand-over run twice: the router on
loopback TCP, and on a Unix socket that Envoy reaches through a `pipe`
address (B98-B100).
"""

import http.client
import re
import select
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

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


TRANSPORTS = ["tcp", "unix"]


@pytest.fixture(params=TRANSPORTS)
def stack(request):
    with Stack(router_flags=FLAGS, script=SCRIPT, workers=1, extproc_socket=request.param == "unix") as s:
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


def ready(stack):
    """Envoy's health listener's answer to GET /ready, or None if refused."""
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{stack.health_port}/ready", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_drain_timeline_through_envoy(transport):
    """B43 on a real Envoy: at SIGTERM Envoy's /ready turns 503 at once,
    while requests on new connections are still routed through the drain
    delay; then Envoy refuses new connections, a request parked at the
    signal gets its normal verdict, and no request gets an error for a
    missing ext_proc. The router exits 0."""
    with Stack(router_flags=FLAGS, script=SCRIPT, workers=2, router_drains_envoy=True, drain_delay="3s",
               extproc_socket=transport == "unix") as s:
        assert ready(s) == 200
        parked = {}
        client = threading.Thread(target=lambda: parked.update(reply=get(s, "demo/parks", "parked-at-signal")))
        client.start()
        s.wait_router_metric("atenet_router_parking_active", 1)
        signalled = time.monotonic()
        s.router.proc.send_signal(signal.SIGTERM)
        while ready(s) != 503:
            assert time.monotonic() - signalled < 2, "Envoy's /ready still 200 well into the drain delay"
            time.sleep(0.02)
        answers = []
        while True:
            try:
                answers.append((time.monotonic() - signalled, get(s, "demo/actor-0", f"during-{len(answers)}")))
            except ConnectionRefusedError:
                break
            assert time.monotonic() - signalled < 30, "Envoy still accepts long after the drain delay"
            time.sleep(0.1)
        refused_at = time.monotonic() - signalled
        assert refused_at >= 2.5, f"new connections refused at {refused_at:.1f}s, inside the 3 s delay"
        assert answers and all(reply[:2] == (200, None) for _, reply in answers), answers
        client.join(timeout=60)
        assert parked["reply"][:2] == (200, None), "the parked request's normal verdict"
        assert s.router.proc.wait(timeout=60) == 0
        served = {r["request_id"] for r in s.records()}
        assert served == {"parked-at-signal"} | {f"during-{i}" for i in range(len(answers))}


def closed_by_peer(sock):
    """Whether the peer closed `sock`: readable, with nothing to read."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def drained_to_eof(sock):
    """Whether the peer closed `sock`, reading (and dropping) whatever it
    sent first, such as an HTTP/2 GOAWAY."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
    return False


def idle_http2(stack):
    """An HTTP/2 connection (prior knowledge) that sent its preface and
    settings and nothing else."""
    sock = socket.create_connection((LOOPBACK, stack.http_port), timeout=10)
    empty_settings, settings_ack = b"\0\0\0\x04\0\0\0\0\0", b"\0\0\0\x04\x01\0\0\0\0"
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + empty_settings + settings_ack)
    return sock


def kept_alive(stack, request_id):
    """An HTTP/1.1 connection that carried one routed request and stays
    open, idle."""
    conn = http.client.HTTPConnection(LOOPBACK, stack.http_port, timeout=60)
    conn.request("GET", "/", headers={"ate-target-actor": "demo/actor-0", "x-client-request-id": request_id})
    response = conn.getresponse()
    response.read()
    assert (response.status, response.getheader("connection")) == (200, None)
    return conn


def drain_closes_idle_connections(edit_config=None):
    """B76: of two kept-alive connections, one is used once more in the
    drain delay and one stays idle. Returns what the busy one got, when
    (seconds after SIGTERM) Envoy closed the idle one (None: never) and
    the router exited, the router's exit status, what a request on the
    idle one got if it was still open after the router left, when an idle
    HTTP/2 connection was closed (None: never), and the logs."""
    flags = FLAGS + ["--envoy-idle-timeout", "4s"]
    with Stack(router_flags=flags, workers=2, router_drains_envoy=True, drain_delay="1s",
               edit_config=edit_config) as s:
        busy, idle, idle_h2 = kept_alive(s, "busy-0"), kept_alive(s, "idle-0"), idle_http2(s)
        signalled = time.monotonic()
        s.router.proc.send_signal(signal.SIGTERM)
        # The busy request goes once Envoy has failed its health check (the
        # drain's step 1): sent at once, it raced the router's POST and, on
        # a loaded host, was answered before it, keeping its connection.
        while ready(s) != 503:
            assert time.monotonic() - signalled < 20, "Envoy's /ready still 200 20 s into the drain"
            time.sleep(0.02)
        busy.request("GET", "/", headers={"ate-target-actor": "demo/actor-0", "x-client-request-id": "busy-1"})
        response = busy.getresponse()
        response.read()
        busy_reply = (response.status, response.getheader("connection"))
        idle_closed = h2_closed = None
        while s.router.running() and time.monotonic() - signalled < 60:
            if idle_closed is None and closed_by_peer(idle.sock):
                idle_closed = time.monotonic() - signalled
            if h2_closed is None and drained_to_eof(idle_h2):
                h2_closed = time.monotonic() - signalled
            time.sleep(0.02)
        exited = time.monotonic() - signalled
        status = s.router.proc.wait(timeout=60)
        late = None
        if not closed_by_peer(idle.sock):
            idle.request("GET", "/", headers={"ate-target-actor": "demo/actor-0", "x-client-request-id": "late"})
            late = idle.getresponse().status
        return busy_reply, idle_closed, exited, status, late, h2_closed, s.logs()


def test_the_drain_waits_for_envoy_to_close_idle_connections():
    """B76 through a real Envoy 1.40: no drain of Envoy's closes an idle
    keep-alive connection, so the generated bootstrap's idle timeout does,
    inside the router's Envoy window. The router stops ext_proc only after
    the last client connection closed: no client is left holding a
    connection to an Envoy without a router."""
    busy_reply, idle_closed, exited, status, late, h2_closed, logs = drain_closes_idle_connections()
    assert busy_reply == (200, "close"), "a response in the drain closes its connection"
    assert late is None, f"the idle connection outlived the router: a request on it got {late}"
    # Measured on 1.40: at its idle timeout an HTTP/1.1 connection starts
    # the connection manager's drain and is closed its drain timeout (5 s)
    # and about a second later: 10 s after its last request here.
    assert idle_closed is not None and 3.5 <= idle_closed <= 15, \
        f"the idle connection closed at {idle_closed} s, not after its 4 s idle timeout"
    assert h2_closed is not None and 3.5 <= h2_closed <= 15, f"the idle HTTP/2 connection closed at {h2_closed} s"
    assert exited >= max(idle_closed, h2_closed), "ext_proc stopped before the last connection closed"
    assert status == 0
    assert "drain: Envoy drained" in logs, logs[-2000:]


def probe_extproc(stack):
    """One connect() to where Envoy reaches the router, and the server's
    first HTTP/2 frame: "answered", "refused" or "unanswered"."""
    if stack.socket_path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target = str(stack.socket_path)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        target = (LOOPBACK, stack.extproc_port)
    sock.settimeout(20)
    try:
        try:
            sock.connect(target)
        except OSError:
            return "refused"
        try:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            head = b""
            while len(head) < 9:
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    return "unanswered"
                head += chunk
            return "answered" if head[3] == 4 else "unanswered"
        except OSError:
            return "unanswered"
    finally:
        sock.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_sighup_handover_under_load_fails_no_request(transport):
    """B75 through Envoy: SIGHUP under continuous load (a running actor and
    parking ones, kept-alive and fresh connections): the successor takes
    over, the old router exits 0, Envoy stays ready, and every request gets
    its normal answer, each at the worker once. A probe connects to the
    router's port or socket throughout: no connect() fails and every
    connection is answered (B95, B100)."""
    script = SCRIPT + "".join(f"demo/p{i} ResourceExhausted 0s - false no free workers available\n"
                              f"demo/p{i} OK 1s 127.0.1.2 true -\n" for i in range(20))
    with Stack(router_flags=FLAGS, script=script, workers=2, extproc_socket=transport == "unix") as s:
        stop = threading.Event()
        answers, errors, probes = [], [], []

        def prober():
            while not stop.is_set():
                probes.append(probe_extproc(s))

        def client(name, fresh):
            conn = None
            i = 0
            while not stop.is_set():
                actor = "demo/actor-0" if i % 2 == 0 else f"demo/p{(i // 2) % 20}"
                request_id = f"{name}-{i}"
                i += 1
                try:
                    if conn is None or fresh:
                        conn = http.client.HTTPConnection(LOOPBACK, s.http_port, timeout=60)
                    conn.request("GET", "/", headers={"ate-target-actor": actor, "x-client-request-id": request_id})
                    response = conn.getresponse()
                    response.read()
                    answers.append((request_id, response.status, response.getheader("x-atenet-reason")))
                    if response.getheader("connection") == "close":
                        conn.close()
                        conn = None
                except OSError as e:
                    errors.append((request_id, repr(e)))
                    conn = None
            if conn is not None:
                conn.close()

        clients = [threading.Thread(target=client, args=(f"c{k}", k % 2 == 1)) for k in range(6)]
        clients.append(threading.Thread(target=prober))
        for c in clients:
            c.start()
        time.sleep(1.5)
        readiness = []
        watching = threading.Thread(target=lambda: [readiness.append(ready(s)) or time.sleep(0.05)
                                                    for _ in range(60)])
        watching.start()
        assert s.hand_over() == 0, "the old router exits 0"
        time.sleep(2)
        stop.set()
        for c in clients + [watching]:
            c.join(timeout=90)
        assert errors == [], errors[:5]
        assert len(probes) > 50 and set(probes) == {"answered"}, \
            {p: probes.count(p) for p in set(probes)}
        bad = [a for a in answers if a[1] != 200]
        assert bad == [], bad[:10]
        assert len(answers) > 20, len(answers)
        assert set(readiness) == {200}, "Envoy ready throughout"
        recorded = [r["request_id"] for r in s.records()]
        assert sorted(recorded) == sorted(a[0] for a in answers), "each request at the worker once"
        assert get(s, "demo/actor-0", "after")[:2] == (200, None), "the successor serves"


def without_client_idle_timeout(config):
    text = re.sub(r"(\n *common_http_protocol_options:\n) *idle_timeout: 4s\n", r"\1", config, count=1)
    assert text != config, "the bootstrap has no client idle timeout to take out"
    return text


def test_without_the_idle_timeout_an_idle_connection_outlives_the_router():
    """Why B76 exists, measured on Envoy 1.40: take the bootstrap's idle
    timeout out and the idle connection stays open through the whole drain,
    so a request on it after the router exits gets Envoy's 503."""
    busy_reply, idle_closed, _, status, late, h2_closed, logs = \
        drain_closes_idle_connections(without_client_idle_timeout)
    assert busy_reply == (200, "close")
    assert (idle_closed, late, h2_closed) == (None, 503, None)
    assert status == 0
    assert "drain: Envoy still had connections when the window passed" in logs, logs[-2000:]


# demo/late's first ResumeActor answers after 7 s: past the 1 s budget and
# past Envoy's message timeout (budget + 5 s), so its callers live on the
# late-serve override (B49) that the router sends at the budget.
LATE_SCRIPT = "demo/late OK 7s 127.0.1.1 true -\n"
LATE_FLAGS = ["--parked-request-budget", "1s", "--late-serve-limit", "10s"]


def test_requests_late_served_across_a_sigterm_get_their_verdict():
    """Issue 28 part 10's case, targeted: a SIGTERM while requests wait on
    an attempt that outlives the budget (late serve, B49, their overrides
    already sent). Each gets its 200 through Envoy, served by the worker
    once, and the router exits 0 after them (B44)."""
    with Stack(router_flags=LATE_FLAGS, script=LATE_SCRIPT, workers=1) as s:
        replies = {}

        def ask(request_id):
            replies[request_id] = get(s, "demo/late", request_id)

        clients = [threading.Thread(target=ask, args=(f"late-{i}",)) for i in range(3)]
        for c in clients:
            c.start()
        s.wait_router_metric("atenet_router_extproc_streams_active", 3)
        began = time.monotonic()
        # Past the 1 s budget, so that the overrides are out (a SIGTERM
        # that came earlier would only make this test weaker, not wrong).
        while time.monotonic() - began < 2.0:
            time.sleep(0.05)
        s.router.proc.send_signal(signal.SIGTERM)
        for c in clients:
            c.join(timeout=60)
        status = s.router.proc.wait(timeout=60)
        logs = s.logs()
        assert {k: v[:2] for k, v in replies.items()} == {f"late-{i}": (200, None) for i in range(3)}, \
            (replies, logs[-4000:])
        assert status == 0
        assert sorted(r["request_id"] for r in s.records()) == [f"late-{i}" for i in range(3)]
