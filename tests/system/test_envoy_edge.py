"""Envoy's edge, through a real Envoy 1.40.0 (envoy_stack.py): what a client
can make Envoy do with x-envoy-* headers (B88), what a parked upload costs
Envoy's memory (B89), and what Envoy answers under its overload manager
(B90).

The truth is what the client got and what the echo worker recorded (one
line per attempt that reached it, with the body's sha256); Envoy's own
counters and memory are read from its admin and /proc, the router's metrics
only synchronise (wait until requests are parked).
"""

import hashlib
import http.client
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import grpc
import pytest

from envoy_stack import LOOPBACK, Stack, admin_stats as envoy_admin_stats

TIMEOUT = 60
# A peer on loopback that a stack trusting only 127.0.0.1/32 does not trust.
UNTRUSTED_SOURCE = "127.0.0.2"
# The generated bootstrap's per-connection buffer limit (B89).
BUFFER_LIMIT = 32 << 10
# What the generated Envoy removes from every client (B88): the router
# filter's control headers, and the ones that steer the access log, an
# ORIGINAL_DST cluster or tracing.
REMOVED = ["x-envoy-retry-on", "x-envoy-retry-grpc-on", "x-envoy-max-retries", "x-envoy-retriable-status-codes",
           "x-envoy-retriable-header-names", "x-envoy-upstream-rq-timeout-ms",
           "x-envoy-upstream-rq-per-try-timeout-ms", "x-envoy-hedge-on-per-try-timeout",
           "x-envoy-upstream-rq-timeout-alt-response", "x-envoy-upstream-stream-duration-ms",
           "x-envoy-upstream-alt-stat-name", "x-envoy-original-path", "x-envoy-original-dst-host",
           "x-envoy-force-trace", "x-envoy-decorator-operation"]

SCRIPT = """
demo/routed  OK                 0s  127.0.1.1  true   -
demo/stuck   ResourceExhausted  0s  -          false  no free workers available
"""
PARKING = ["--parked-request-budget", "2s", "--parked-request-retry-interval", "50ms"]


@dataclass
class Reply:
    status: int
    headers: dict
    body: bytes
    elapsed: float

    def echoed(self):
        """The echo worker's answer: what the worker received."""
        return json.loads(self.body)


def h1(stack, actor, path="/", headers=(), source=None, timeout=TIMEOUT):
    """One HTTP/1.1 request from `source` (a loopback address; default the
    kernel's choice, 127.0.0.1)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(LOOPBACK, stack.http_port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        conn.putrequest("GET", path)
        for name, value in [("ate-target-actor", actor), *headers]:
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        body = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body,
                     time.monotonic() - started)
    finally:
        conn.close()


def admin_stats(stack, pattern):
    return envoy_admin_stats(stack.admin_url, pattern)


def attempts(stack, request_id):
    return [r for r in stack.records() if r["request_id"] == request_id]


# -- B88: a client's x-envoy-* headers steer nothing -----------------------

SLOW = [("x-echo-delay-ms", "1500")]  # far past every 200 ms timeout below
FAIL = [("x-echo-status", "503")]
# (client's x-envoy-* headers, what the worker is asked to do, the status
# the client gets when Envoy ignores them: the worker's own).
PROBES = {
    "retry-on-5xx-50": ([("x-envoy-retry-on", "5xx"), ("x-envoy-max-retries", "50")], FAIL, 503),
    "retriable-status-codes": ([("x-envoy-retry-on", "retriable-status-codes"),
                                ("x-envoy-retriable-status-codes", "503"), ("x-envoy-max-retries", "3")], FAIL, 503),
    "retriable-headers": ([("x-envoy-retry-on", "retriable-headers"),
                           ("x-envoy-retriable-header-names", "content-type"), ("x-envoy-max-retries", "2")], [], 200),
    "retry-grpc-on": ([("x-envoy-retry-grpc-on", "unavailable"), ("x-envoy-max-retries", "3")],
                      [("x-echo-grpc-status", "14")], 200),
    "per-try-timeout": ([("x-envoy-retry-on", "5xx"), ("x-envoy-max-retries", "2"),
                         ("x-envoy-upstream-rq-per-try-timeout-ms", "200")], SLOW, 200),
    "hedge-on-per-try-timeout": ([("x-envoy-hedge-on-per-try-timeout", "true"), ("x-envoy-retry-on", "5xx"),
                                  ("x-envoy-max-retries", "2"), ("x-envoy-upstream-rq-per-try-timeout-ms", "200")],
                                 SLOW, 200),
    "upstream-rq-timeout": ([("x-envoy-upstream-rq-timeout-ms", "200")], SLOW, 200),
    "timeout-alt-response": ([("x-envoy-upstream-rq-timeout-ms", "200"),
                              ("x-envoy-upstream-rq-timeout-alt-response", "1")], SLOW, 200),
    "stream-duration": ([("x-envoy-upstream-stream-duration-ms", "200")], SLOW, 200),
    "alt-stat-name": ([("x-envoy-upstream-alt-stat-name", "edgeprobe")], [], 200),
    "original-path": ([("x-envoy-original-path", "/spoofed")], [], 200),
    "tracing": ([("x-envoy-force-trace", "true"), ("x-envoy-decorator-operation", "spoofed")], [], 200),
}


@pytest.fixture(scope="module")
def stack():
    """Default trust (loopback): the test's client is a trusted peer, the
    one Envoy would otherwise obey."""
    with Stack(router_flags=PARKING, script=SCRIPT, sim_flags=["--actors", "0"], workers=2) as s:
        yield s


@pytest.fixture(scope="module")
def probed(stack):
    """Every probe once, one after another (the worker cluster's retry
    breaker would blur attempts of probes running together): {id: Reply}."""
    replies = {}
    for probe, (control, worker, _) in PROBES.items():
        headers = [*control, *worker, ("x-client-request-id", probe)]
        replies[probe] = h1(stack, "demo/routed", f"/edge/{probe}", headers)
    return replies


@pytest.mark.parametrize("probe", PROBES)
def test_b88_client_control_headers_get_one_attempt_and_the_workers_answer(stack, probed, probe):
    """From a trusted peer (the worker sees x-envoy-internal), every probe
    reaches the worker exactly once and the client gets the worker's own
    answer: no retry, hedge, timeout or alternative response of Envoy's.
    Measured without the header_mutation filter: `retry-on-5xx-50` hit the
    worker 51 times, the timeouts were Envoy's 504 (204) at 200 ms."""
    reply = probed[probe]
    expected = PROBES[probe][2]
    assert reply.status == expected, reply
    seen = reply.echoed()
    assert seen["path"] == f"/edge/{probe}", "the worker's answer, not Envoy's"
    assert seen["headers"].get("x-envoy-internal") == "true", "a trusted peer: Envoy kept its x-envoy-* headers"
    assert not [h for h in REMOVED if h in seen["headers"]], seen["headers"]
    assert len(attempts(stack, probe)) == 1, attempts(stack, probe)


def test_b88_a_clients_stat_name_and_original_path_steer_nothing(stack, probed):
    """No stats named by the client; the access log's path is the request's."""
    assert probed["alt-stat-name"].status == 200
    assert admin_stats(stack, "edgeprobe") == {}
    assert admin_stats(stack, r"^cluster\.atenet_workers\.upstream_rq_total$"), "the filter does match stats"
    entry = stack.wait_access_log(lambda e: e.get("path") in ("/edge/original-path", "/spoofed"))
    assert entry["path"] == "/edge/original-path", entry


def test_b88_the_router_names_the_worker_whatever_the_client_says(stack):
    """x-envoy-original-dst-host (which an ORIGINAL_DST cluster reading
    headers would obey) never reaches Envoy's load balancer or the worker."""
    other = stack.worker(1)
    reply = h1(stack, "demo/routed", "/edge/dst", [("x-envoy-original-dst-host", other),
                                                     ("x-client-request-id", "dst")])
    assert reply.status == 200
    assert reply.echoed()["worker"] == "127.0.1.1:%d" % stack.worker_port, "the router's choice"
    assert "x-envoy-original-dst-host" not in reply.echoed()["headers"]
    assert [r["worker"] for r in attempts(stack, "dst")] == [f"127.0.1.1:{stack.worker_port}"]


# -- B88: the caller's deadline passes from a trusted peer only ------------

def caller_deadline(reply):
    """The router honoured a 300 ms deadline: its own 504, long before the
    2 s budget (no park was ever served, so nothing is refused early)."""
    assert (reply.status, reply.headers.get("x-atenet-reason")) == (504, "atenet_caller_deadline"), reply


def budget_exhausted(reply):
    """The deadline never reached the router: the request parked for the
    whole budget."""
    assert (reply.status, reply.headers.get("x-atenet-reason")) == (503, "atenet_budget_exhausted"), reply


DEADLINE = [("x-envoy-expected-rq-timeout-ms", "300")]


def test_b88_the_deadline_passes_from_a_trusted_front_only():
    """--envoy-trusted-ranges 127.0.0.1/32: the same parked request with a
    300 ms x-envoy-expected-rq-timeout-ms gets the router's 504 from
    127.0.0.1 and waits out its budget from 127.0.0.2, whose headers Envoy
    strips; the worker sees x-envoy-internal only from the first."""
    flags = [*PARKING, "--envoy-trusted-ranges", "127.0.0.1/32"]
    with Stack(router_flags=flags, script=SCRIPT, sim_flags=["--actors", "0"], workers=1) as s:
        caller_deadline(h1(s, "demo/stuck", "/trusted", DEADLINE, source=LOOPBACK))
        budget_exhausted(h1(s, "demo/stuck", "/untrusted", DEADLINE, source=UNTRUSTED_SOURCE))
        trusted = h1(s, "demo/routed", "/trusted", source=LOOPBACK).echoed()["headers"]
        untrusted = h1(s, "demo/routed", "/untrusted", source=UNTRUSTED_SOURCE).echoed()["headers"]
        assert trusted.get("x-envoy-internal") == "true"
        assert "x-envoy-internal" not in untrusted, untrusted


def test_b88_no_trusted_range_trusts_not_even_loopback():
    """--envoy-trusted-ranges "": no internal_address_config. Before B88 it
    rendered `cidr_ranges: []`, which Envoy 1.40 reads as its private ranges:
    this very request from 127.0.0.1 then got the router's 504."""
    flags = [*PARKING, "--envoy-trusted-ranges", ""]
    with Stack(router_flags=flags, script=SCRIPT, sim_flags=["--actors", "0"], workers=1) as s:
        budget_exhausted(h1(s, "demo/stuck", "/none", DEADLINE))
        assert "x-envoy-internal" not in h1(s, "demo/routed", "/none").echoed()["headers"]


# -- B89: a parked upload costs Envoy its buffer, not its body --------------

UPLOADS = 24
BODY_BYTES = 8 << 20
# Envoy's memory per parked upload, generously: the 32 KiB buffer (twice,
# as Envoy reads past its high watermark), the HTTP/2 stream window of
# 64 KiB, and the request's own state (connection, stream, ext_proc call),
# eight buffers in all; plus a fixed slack for the allocator's own growth.
# Without the limits a parked HTTP/1.1 upload took about 1.8 MB, an HTTP/2
# one its whole 8 MiB (measured on 1.40).
PER_UPLOAD_BOUND = 8 * BUFFER_LIMIT
SLACK = 16 << 20
RESTORE = "8s"


def upload_script():
    """Each upload's actor: refused once (the pool is full: the request
    parks), then resumed by an attempt that takes RESTORE."""
    lines = ["demo/warm  OK  0s  127.0.1.1  true  -"]
    for proto in ("h1", "h2"):
        for i in range(UPLOADS):
            lines.append(f"demo/up-{proto}-{i}  ResourceExhausted  0s  -  false  no free workers available")
            lines.append(f"demo/up-{proto}-{i}  OK  {RESTORE}  127.0.1.{i % 4 + 1}  true  -")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def upload_stack():
    flags = ["--parked-request-budget", "20s"]
    with Stack(router_flags=flags, script=upload_script(), sim_flags=["--actors", "0"], workers=4) as s:
        yield s


@pytest.fixture(scope="module")
def body_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("uploads") / "body"
    path.write_bytes(os.urandom(BODY_BYTES))
    return path


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def curl_upload(stack, proto, actor, request_id, body_file, out):
    flag = "--http1.1" if proto == "h1" else "--http2-prior-knowledge"
    return subprocess.Popen(
        ["curl", "-sS", flag, "--max-time", str(TIMEOUT * 2), "-H", "Expect:", "-H", f"ate-target-actor: {actor}",
         "-H", f"x-client-request-id: {request_id}", "--data-binary", f"@{body_file}", "-o", str(out),
         "-w", "%{http_code}", f"{stack.url}/upload/{request_id}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rx_bytes(stack):
    return admin_stats(stack, r"^http\.ingress\.downstream_cx_rx_bytes_total$")["http.ingress.downstream_cx_rx_bytes_total"]


def wait_for(what, check, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout}s")
        time.sleep(0.05)
    return value


@pytest.mark.parametrize("proto", ["h1", "h2"])
def test_b89_parked_uploads_cost_envoy_their_buffers_and_arrive_whole(upload_stack, body_file, proto, tmp_path):
    """24 uploads of 8 MiB each, held parked (the pool is full) for an 8 s
    restore, then routed: Envoy's RSS grows by at most 256 KiB per upload
    (+16 MiB) while they are parked, each client having pushed past the
    32 KiB buffer, and while they are sent on; every body reaches the
    worker whole (the worker's sha256)."""
    stack = upload_stack
    want = hashlib.sha256(body_file.read_bytes()).hexdigest()
    pid = stack.envoy.proc.pid
    # Warm Envoy's pools and allocator on a routed upload first.
    warm = curl_upload(stack, proto, "demo/warm", f"warm-{proto}", body_file, tmp_path / "warm")
    assert warm.communicate(timeout=TIMEOUT)[0] == "200"
    baseline, rx_before = rss(pid), rx_bytes(stack)
    ids = [f"up-{proto}-{i}" for i in range(UPLOADS)]
    clients = [curl_upload(stack, proto, f"demo/{i}", i, body_file, tmp_path / i) for i in ids]
    try:
        stack.wait_router_metric("atenet_router_parking_active", UPLOADS, timeout=TIMEOUT)
        # Every client has pushed at least Envoy's buffer (on average):
        # the bound below holds with the buffers full.
        wait_for("the buffers filled", lambda: rx_bytes(stack) - rx_before >= UPLOADS * BUFFER_LIMIT)
        # Envoy's memory while every upload is parked, then while they are
        # routed and sent on, until the last client has its answer.
        peak, parked_samples, rx_parked = baseline, 0, 0
        while any(c.poll() is None for c in clients):
            peak = max(peak, rss(pid))
            if stack.router_metric("atenet_router_parking_active") == UPLOADS:
                parked_samples, rx_parked = parked_samples + 1, rx_bytes(stack) - rx_before
            time.sleep(0.1)
        outputs = [c.communicate(timeout=TIMEOUT * 2) for c in clients]
    finally:
        for c in clients:
            c.kill()
    after = rss(pid)
    growth, bound = peak - baseline, UPLOADS * PER_UPLOAD_BOUND + SLACK
    measured = (f"{proto}: RSS {baseline / 2**20:.1f} MiB, peak +{growth / 2**20:.1f} MiB (bound "
                f"{bound / 2**20:.1f} MiB), after {after / 2**20:.1f} MiB; Envoy had read {rx_parked / 2**20:.2f} "
                f"MiB of {UPLOADS * BODY_BYTES / 2**20:.0f} MiB while all were parked ({parked_samples} samples)")
    print(measured)
    assert parked_samples > 0, measured
    assert growth <= bound, measured
    assert [out for out, _ in outputs] == ["200"] * UPLOADS, outputs
    for request_id in ids:
        echoed = json.loads((tmp_path / request_id).read_bytes())
        assert (echoed["body_sha256"], echoed["body_length"]) == (want, BODY_BYTES), request_id
        records = attempts(stack, request_id)
        assert [(r["body_sha256"], r["body_length"]) for r in records] == [(want, BODY_BYTES)], request_id


def test_b89_a_header_named_with_an_underscore_is_dropped_and_the_request_served(stack, tmp_path):
    """HTTP/1.1 and HTTP/2: the worker gets the request without `x_client`
    (DROP_HEADER), where REJECT_REQUEST would have answered 400 or reset
    the stream; Envoy counts each drop."""
    reply = h1(stack, "demo/routed", "/underscore", [("x_client", "1"), ("x-client-request-id", "underscore-h1")])
    assert reply.status == 200 and "x_client" not in reply.echoed()["headers"], reply
    out = tmp_path / "h2"
    run = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", str(TIMEOUT), "-o", str(out),
                          "-w", "%{http_code}", "-H", "ate-target-actor: demo/routed", "-H", "x_client: 1",
                          f"{stack.url}/underscore"], capture_output=True, text=True, timeout=TIMEOUT + 10)
    assert run.stdout == "200", run.stderr
    assert "x_client" not in json.loads(out.read_bytes())["headers"]
    drops = admin_stats(stack, r"^http[12]\.dropped_headers_with_underscores$")
    assert drops.get("http1.dropped_headers_with_underscores", 0) >= 1, drops
    assert drops.get("http2.dropped_headers_with_underscores", 0) >= 1, drops


def test_b89_headers_that_never_end_get_a_408(stack):
    """request_headers_timeout (10 s): a client that sends half its headers
    and stops gets Envoy's 408 and a closed connection, never the router."""
    with socket.create_connection((LOOPBACK, stack.http_port), timeout=TIMEOUT) as conn:
        conn.sendall(b"GET /slow HTTP/1.1\r\nHost: edge\r\nate-target-actor: demo/routed\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert all(r["path"] != "/slow" for r in stack.records())


# -- B90: the overload manager ----------------------------------------------

def overloaded(text):
    """The bootstrap with a heap bound an idle Envoy already exceeds."""
    assert "max_heap_size_bytes: 1073741824\n" in text
    return text.replace("max_heap_size_bytes: 1073741824\n", "max_heap_size_bytes: 2097152\n")


def test_b90_over_its_heap_bound_envoy_refuses_new_requests_readiness_included():
    """Over the heap bound (here one an idle Envoy exceeds), every listener
    answers a new request 503 `envoy overloaded` before any filter: the
    router is never asked, the worker never reached, and the health
    listener's /ready fails too, so a load balancer stops sending; a gRPC
    client reads UNAVAILABLE. The admin API is not subject to it."""
    with Stack(router_flags=PARKING, script=SCRIPT, sim_flags=["--actors", "0"], workers=1,
               edit_config=overloaded) as s:
        wait_for("overloaded", lambda: admin_stats(
            s, r"^overload\.envoy\.overload_actions\.stop_accepting_requests\.active$").get(
            "overload.envoy.overload_actions.stop_accepting_requests.active") == 1)
        reply = h1(s, "demo/routed", "/overloaded")
        assert (reply.status, reply.body) == (503, b"envoy overloaded"), reply
        for port, path in [(s.health_port, "/ready"), (s.stats_port, "/stats/prometheus")]:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=10)
            assert (refused.value.code, refused.value.read()) == (503, b"envoy overloaded"), path
        with grpc.insecure_channel(f"{LOOPBACK}:{s.http_port}") as channel:
            call = channel.unary_unary("/atenet.e2e.Echo/Call", request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as failed:
                call(b"", metadata=[("ate-target-actor", "demo/routed")], timeout=TIMEOUT)
            assert (failed.value.code(), failed.value.details()) == (grpc.StatusCode.UNAVAILABLE, "envoy overloaded")
        with urllib.request.urlopen(f"{s.admin_url}/ready", timeout=10) as response:
            assert response.status == 200
        assert admin_stats(s, r"^http\.ingress\.ext_proc\.streams_started$") == {
            "http.ingress.ext_proc.streams_started": 0}, "the router was never asked"
        assert s.records() == []
        assert admin_stats(s, r"^http\.ingress\.downstream_rq_overload_close$")[
            "http.ingress.downstream_rq_overload_close"] >= 2
