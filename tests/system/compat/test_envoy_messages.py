"""Envoy's side of the ext_proc stream is the official generated classes
(PyPI xds-protos): requests are encoded exactly as Envoy encodes them, and
every reply must decode field by field into what behavior.md says
(B6, B7, B9, B10, B11)."""

import threading

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

# wire.md's golden ProcessingRequest, as Envoy sends it.
ENVOY_GET = bytes.fromhex(
    "12740a700a190a0a3a617574686f726974791a0b6578616d706c652e636f6d0a1a0a053a706174681a112f6170692f76312f"
    "6974656d733f783d310a0e0a073a6d6574686f641a034745540a0f0a073a736368656d651a04687474700a160a0a75736572"
    "2d6167656e741a086375726c2f382e3018014200")


def headers_request(headers, attributes=None):
    request = ep.ProcessingRequest()
    for key, value in headers:
        request.request_headers.headers.headers.append(base_pb2.HeaderValue(key=key, raw_value=value.encode()))
    request.request_headers.end_of_stream = True
    request.metadata_context.SetInParent()
    if attributes:
        attrs = struct_pb2.Struct()
        attrs.update(attributes)
        request.attributes["envoy.filters.http.ext_proc"].CopyFrom(attrs)
    return request


def exchange(stub, *requests):
    """Opens one stream, sends requests, returns one reply per request. A
    late-serve override (B49) is no reply: on a loaded host an attempt may
    still be running when the 300 ms budget passes, and the router then
    asks Envoy for more time before its verdict (the late-serve test below
    reads the override itself)."""
    call = stub.Process(iter(requests), timeout=30)
    replies = []
    while len(replies) < len(requests):
        reply = next(call)
        if reply.WhichOneof("response") is not None:
            replies.append(reply)
    call.cancel()
    return replies


def route(stub, actor, extra=()):
    return exchange(stub, headers_request([("ate-target-actor", actor), *extra]))[0]


def check_route(reply, actor, local, port="80", sets_header=False):
    """A routing verdict to `local`; `sets_header` when the request did not
    carry its canonical actor header alone (B6)."""
    assert reply.WhichOneof("response") == "request_headers"
    common = reply.request_headers.response
    assert common.status == ep.CommonResponse.CONTINUE
    metadata = reply.dynamic_metadata.fields["envoy.filters.listener.original_dst"].struct_value
    assert metadata.fields["local"].string_value == local
    assert metadata.fields["port"].string_value == port
    assert list(reply.dynamic_metadata.fields) == ["envoy.filters.listener.original_dst"]
    if not sets_header:
        assert not reply.request_headers.HasField("response"), "B6: no mutation for a header carried alone"
        return
    assert len(common.header_mutation.set_headers) == 1, "B6: exactly one header"
    option = common.header_mutation.set_headers[0]
    assert option.header.key == "ate-target-actor"
    assert option.header.raw_value == actor.encode()
    assert option.header.value == "", "B6: raw_value only"
    assert not option.HasField("append"), "B6: append unset (overwrite)"
    assert option.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def test_b6_b7_route_ipv4(stack):
    check_route(route(stack, "demo/v4"), "demo/v4", "10.1.2.3:443")


def test_b7_route_ipv6_bracketed(stack):
    check_route(route(stack, "demo/v6"), "demo/v6", "[fd00::52]:443")


def test_b5_connect_port(stack):
    reply = route(stack, "demo/v4", [(":method", "CONNECT"), (":authority", "db:5432")])
    check_route(reply, "demo/v4", "10.1.2.3:443", "5432")


def test_b2_attribute_actor(stack):
    request = headers_request([(":path", "/")], {"filter_state['dev.ate.target.actor']": "demo/v4"})
    check_route(exchange(stack, request)[0], "demo/v4", "10.1.2.3:443", sets_header=True)


def test_b6_a_repeated_actor_header_is_set_to_the_canonical_id(stack):
    reply = route(stack, "demo/v4", [("ate-target-actor", "demo/v6")])
    check_route(reply, "demo/v4", "10.1.2.3:443", sets_header=True)


def test_parked_then_routed(stack):
    check_route(route(stack, "demo/parks"), "demo/parks", "10.0.0.9:443")


def test_b4_golden_envoy_request_without_actor_is_404(stack):
    request = ep.ProcessingRequest.FromString(ENVOY_GET)
    reply = exchange(stack, request)[0]
    check_immediate(reply, 404, "invalid actor reference", "atenet_invalid_target")


def check_immediate(reply, status, body, details):
    assert reply.WhichOneof("response") == "immediate_response"
    ir = reply.immediate_response
    assert ir.status.code == status
    assert ir.body == body.encode()
    assert ir.details == details
    headers = {h.header.key: h.header.raw_value.decode() for h in ir.headers.set_headers}
    assert all(h.header.value == "" for h in ir.headers.set_headers), "B10: raw_value only"
    expected = {"content-type": "text/plain", "x-atenet-reason": details}
    if details in ("atenet_budget_exhausted", "atenet_lot_full"):
        expected["retry-after"] = "1"  # capacity 503s; nothing served yet, so the 1 s floor
    assert headers == expected
    assert not reply.HasField("dynamic_metadata")


B11 = [
    ("demo/notfound", 404, "actor demo/notfound not found", "atenet_not_found"),
    ("demo/exhausted", 503, "actor demo/exhausted unavailable: no free workers available", "atenet_budget_exhausted"),
    ("demo/precondition", 503, "actor demo/precondition unavailable: actor is suspending", "atenet_budget_exhausted"),
    ("demo/aborted", 503, "actor demo/aborted unavailable: concurrent operation in progress", "atenet_budget_exhausted"),
    ("demo/unavailable", 503, "actor demo/unavailable unavailable", "atenet_budget_exhausted"),
    ("demo/deadline", 504, "actor demo/deadline request timed out", "atenet_timeout"),
    ("demo/denied", 403, "actor demo/denied access denied", "atenet_access_denied"),
    ("demo/unauth", 401, "actor demo/unauth authentication required", "atenet_unauthenticated"),
    ("demo/internal", 500, "error resuming actor demo/internal", "atenet_resume_error"),
    ("demo/noip", 500, "actor demo/noip routing failed", "atenet_routing_failed"),
]


@pytest.mark.parametrize("actor,status,body,details", B11, ids=[row[0] for row in B11])
def test_b11_rows(stack, actor, status, body, details):
    check_immediate(route(stack, actor), status, body, details)


def test_b9_each_phase_gets_its_own_kind(stack):
    """Every other phase's message before the verdict gets an empty reply of
    its own kind (B9); the verdict then ends the stream with OK (B77)."""
    kinds = [
        ("response_headers", ep.ProcessingRequest(response_headers=ep.HttpHeaders())),
        ("request_body", ep.ProcessingRequest(request_body=ep.HttpBody(body=b"x", end_of_stream=True))),
        ("response_body", ep.ProcessingRequest(response_body=ep.HttpBody())),
        ("request_trailers", ep.ProcessingRequest(request_trailers=ep.HttpTrailers())),
        ("response_trailers", ep.ProcessingRequest(response_trailers=ep.HttpTrailers())),
    ]
    last = headers_request([("ate-target-actor", "demo/v4")])
    finished = threading.Event()

    def requests():
        yield from (request for _, request in kinds)
        yield last
        # Envoy does not half-close: the router must end the stream itself.
        finished.wait(30)

    call = stack.Process(requests(), timeout=10)
    try:
        replies = list(call)
    finally:
        finished.set()
    assert call.code() == grpc.StatusCode.OK, "B77: the router ended the stream itself"
    assert len(replies) == len(kinds) + 1
    for (kind, _), reply in zip(kinds, replies):
        assert reply.WhichOneof("response") == kind, "B9"
        assert reply.ListFields() == [(reply.DESCRIPTOR.fields_by_name[kind], getattr(reply, kind))]
    check_route(replies[-1], "demo/v4", "10.1.2.3:443")


def test_late_serve_override_arrives_before_the_late_verdict(stack):
    """The flight passes its 1 s budget with an attempt running; Envoy is told
    to keep waiting (override_message_timeout = --late-serve-limit) before the
    late verdict arrives on the same stream."""
    call = stack.late.Process(iter([headers_request([("ate-target-actor", "demo/late")])]), timeout=30)
    first = next(call)
    assert first.WhichOneof("response") is None
    assert first.HasField("override_message_timeout")
    assert first.override_message_timeout.seconds == 12
    assert first.override_message_timeout.nanos == 0
    assert first.SerializeToString() == bytes.fromhex("5202080c"), "override only, as wire.md encodes it"
    second = next(call)
    call.cancel()
    check_route(second, "demo/late", "10.0.0.7:443")
