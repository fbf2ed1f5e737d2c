"""Tracing (B121-B126) through the real binaries: the router's spans as an
OTLP receiver built on PyPI's opentelemetry-proto messages sees them (not
the router's own protos), the traceparent the simulated control plane
receives, and Envoy 1.40's spans joined to the router's.
"""

import json
import os
import re
import signal
import socket
import tempfile
import threading
import time
import urllib.request
from concurrent import futures

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2, external_processor_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from conftest import BIN, router_args, start, stop, word_after

TIMEOUT = 30


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver: keeps every span with its service name."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spans = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def Export(self, request, context):
        with self.lock:
            for resource_spans in request.resource_spans:
                attributes = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    self.spans.extend((attributes, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, *names):
        with self.lock:
            return [span for _, span in self.spans if span.name in names]

    def stop(self):
        self.server.stop(0)


def poll(what, check, timeout=TIMEOUT):
    """Polls check() until it returns something truthy; fails after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def traceparent(trace_id, span_id="b7ad6b7169203331", flags="01"):
    return f"00-{trace_id}-{span_id}-{flags}"


def attributes(span):
    out = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def metric(metrics_addr, name):
    text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=10).read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def headers_request(actor):
    request = external_processor_pb2.ProcessingRequest()
    headers = request.request_headers.headers.headers
    for key, value in ((":method", "GET"), (":path", "/"), (":authority", "x"), ("ate-target-actor", actor)):
        headers.add(key=key, raw_value=value.encode())
    return request


def verdict(stub, actor, metadata=()):
    """Sends one request's headers on a stream, as Envoy would; returns the
    reply."""
    replies = stub.Process(iter([headers_request(actor)]), metadata=list(metadata), timeout=TIMEOUT)
    return next(replies)


def in_background(fn, *args, **kwargs):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn(*args, **kwargs)), daemon=True)
    thread.start()
    return thread, result


SCRIPT = """
demo/traced      ResourceExhausted  0s    -         false  no free workers available
demo/traced      ResourceExhausted  held  -         false  no free workers available
demo/traced      OK                 0s    10.0.0.9  true   -
demo/untraced    OK                 0s    10.0.0.9  true   -
demo/unsampled   OK                 0s    10.0.0.9  true   -
"""

LEADER = "0af7651916cd43dd8448eb211c80319c"
JOINER = "1bf7651916cd43dd8448eb211c80319d"
UNSAMPLED = "2cf7651916cd43dd8448eb211c80319e"


@pytest.fixture
def traced():
    """The sim (logging answers), a receiver, and a router tracing to it."""
    workdir = tempfile.mkdtemp(prefix="atenet-tracing-")
    script, answers = os.path.join(workdir, "script"), os.path.join(workdir, "answers.jsonl")
    with open(script, "w") as f:
        f.write(SCRIPT)
    receiver = Receiver()
    sim, line = start([f"{BIN}/ateapi-sim", "--listen", "127.0.0.1:0", "--actors", "0", "--script", script,
                       "--answer-log", answers], "listening on")
    sim_addr = word_after(line, "listening on ")
    router, line = start(router_args(sim_addr, "--parked-request-budget", "20s",
                                     "--parked-request-retry-interval", "20ms",
                                     "--otlp-traces-address", receiver.address,
                                     "--trace-sample-percent", "100"), "serving")
    channel = grpc.insecure_channel(word_after(line, "ext_proc on "))
    stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
    stub.metrics_addr = word_after(line, "metrics on http://").split("/")[0]
    yield stub, receiver, sim, answers
    channel.close()
    stop(router)
    sim.send_signal(signal.SIGUSR1)  # lets anything still held go
    stop(sim)
    receiver.stop()


def test_b121_b122_b123_a_parked_requests_trace(traced):
    stub, receiver, sim, answers = traced
    # Unsampled or without a traceparent: nothing exported (B123). Sent first,
    # so that their spans, had they any, would reach the receiver before the
    # traced ones (one exporter thread, in order).
    assert verdict(stub, "demo/untraced").HasField("request_headers")
    unsampled = [("traceparent", traceparent(UNSAMPLED, flags="00"))]
    assert verdict(stub, "demo/unsampled", unsampled).HasField("request_headers")

    # The leader parks on the first ResourceExhausted; the second is held.
    leader, leader_reply = in_background(verdict, stub, "demo/traced",
                                         [("traceparent", traceparent(LEADER)), ("tracestate", "k=v")])
    poll("the leader parked and its second attempt open",
         lambda: metric(stub.metrics_addr, "atenet_router_parking_active") == 1
         and metric(stub.metrics_addr, "atenet_router_resume_calls_open") == 1)
    # A joiner on the parked flight parks at once: two slots held.
    joiner, joiner_reply = in_background(verdict, stub, "demo/traced",
                                         [("traceparent", traceparent(JOINER, "c7ad6b7169203332"))])
    poll("the joiner parked", lambda: metric(stub.metrics_addr, "atenet_router_parking_active") == 2)
    sim.send_signal(signal.SIGUSR1)
    for thread, reply in ((leader, leader_reply), (joiner, joiner_reply)):
        thread.join(TIMEOUT)
        assert reply["value"].HasField("request_headers"), reply

    poll("six spans", lambda: len(receiver.named("atenet.route", "atenet.resume",
                                                  "ateapi.Control/ResumeActor")) >= 6)
    routes = receiver.named("atenet.route")
    assert len(routes) == 2, routes
    by_trace = {span.trace_id.hex(): span for span in routes}
    assert set(by_trace) == {LEADER, JOINER}, "nothing from the unsampled requests"
    route, joined = by_trace[LEADER], by_trace[JOINER]
    assert route.parent_span_id.hex() == "b7ad6b7169203331", "child of the traceparent's span"
    assert route.trace_state == "k=v"
    assert attributes(route) == {"atenet.actor": "demo/traced", "atenet.parked": True,
                                 "atenet.outcome": "ok", "atenet.flight.role": "leader"}
    [resume] = receiver.named("atenet.resume")
    assert resume.trace_id.hex() == LEADER and resume.parent_span_id == route.span_id
    assert attributes(resume)["atenet.outcome"] == "resumed"
    attempts = sorted(receiver.named("ateapi.Control/ResumeActor"), key=lambda s: s.start_time_unix_nano)
    assert [attributes(a)["rpc.grpc.status_code"] for a in attempts] == [8, 8, 0]
    for attempt in attempts:
        assert attempt.trace_id.hex() == LEADER and attempt.parent_span_id == resume.span_id
        assert {k: v for k, v in attributes(attempt).items() if k.startswith("rpc.")} == {
            "rpc.system": "grpc", "rpc.service": "ateapi.Control", "rpc.method": "ResumeActor",
            "rpc.grpc.status_code": attributes(attempt)["rpc.grpc.status_code"]}
    assert joined.parent_span_id.hex() == "c7ad6b7169203332"
    assert attributes(joined)["atenet.flight.role"] == "joiner"
    assert [(link.trace_id.hex(), link.span_id) for link in joined.links] == [(LEADER, resume.span_id)]
    assert metric(stub.metrics_addr, "atenet_router_trace_spans_dropped_total") == 0

    # The control plane saw the leader's trace on every call, each call
    # naming its own attempt span (B122); the others carried none.
    calls = [json.loads(line) for line in open(answers)]
    traced_calls = [c for c in calls if c["actor"] == "demo/traced"]
    assert [c["traceparent"] for c in traced_calls] == [
        f"00-{LEADER}-{a.span_id.hex()}-01" for a in attempts]
    assert all("traceparent" not in c for c in calls if c["actor"] != "demo/traced")


def silent_collector():
    """A TCP port that accepts connections (the kernel's backlog) and never
    answers a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    return listener


def closed_port():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


@pytest.mark.parametrize("collector", ["silent", "down"])
def test_b124_a_collector_that_never_answers_or_is_down_changes_no_verdict(collector):
    listener = silent_collector() if collector == "silent" else None
    port = listener.getsockname()[1] if listener else closed_port()
    workdir = tempfile.mkdtemp(prefix="atenet-tracing-")
    script = os.path.join(workdir, "script")
    with open(script, "w") as f:
        f.write(SCRIPT)
    sim, line = start([f"{BIN}/ateapi-sim", "--listen", "127.0.0.1:0", "--actors", "0", "--script", script],
                      "listening on")
    router, line = start(router_args(word_after(line, "listening on "),
                                     "--otlp-traces-address", f"127.0.0.1:{port}"), "serving")
    channel = grpc.insecure_channel(word_after(line, "ext_proc on "))
    stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
    metrics_addr = word_after(line, "metrics on http://").split("/")[0]
    try:
        for i in range(20):
            reply = verdict(stub, "demo/untraced", [("traceparent", traceparent(LEADER, f"{i + 1:016x}"))])
            assert reply.HasField("request_headers"), reply
            assert not reply.HasField("immediate_response")
        # Every span is given up, and counted (the export's deadline is 2 s).
        poll("the spans counted as dropped",
             lambda: (metric(metrics_addr, "atenet_router_trace_spans_dropped_total") or 0) >= 20)
    finally:
        channel.close()
        stop(router)
        stop(sim)
        if listener:
            listener.close()


def test_b126_envoys_spans_and_the_routers_share_one_trace():
    """Envoy 1.40 from `envoy-config --otlp-traces-address`: the router's
    route span is the child of Envoy's span for its ext_proc call, in the
    trace of Envoy's request span."""
    from envoy_stack import Stack

    receiver = Receiver()
    flags = ["--otlp-traces-address", receiver.address, "--trace-sample-percent", "100"]
    try:
        with Stack(router_flags=flags, script="demo/routed OK 0s 127.0.1.1 true -\n",
                   sim_flags=["--actors", "0"], workers=1) as stack:
            request = urllib.request.Request(f"{stack.url}/traced", headers={"ate-target-actor": "demo/routed"})
            assert urllib.request.urlopen(request, timeout=TIMEOUT).status == 200
            [route] = poll("the router's route span", lambda: receiver.named("atenet.route"))

            def envoys_spans():
                with receiver.lock:
                    spans = [s for r, s in receiver.spans
                             if r.get("service.name") == "envoy" and s.trace_id == route.trace_id]
                ids = {s.span_id for s in spans}
                return spans if route.parent_span_id in ids and len(spans) >= 2 else None

            spans = poll("Envoy's spans in the router's trace", envoys_spans)
            by_id = {s.span_id: s for s in spans}
            call = by_id[route.parent_span_id]
            print("Envoy's spans:", [(s.name, s.kind, s.span_id.hex(), s.parent_span_id.hex()) for s in spans])
            assert call.kind == call.SPAN_KIND_CLIENT, call
            assert "ext_proc" in call.name.lower() or "externalprocessor" in call.name.lower(), call.name
            # Envoy's ext_proc call is a child of its request span, the trace's root.
            assert by_id[call.parent_span_id].parent_span_id == b"", by_id[call.parent_span_id]
    finally:
        receiver.stop()
