"""`atenet-router envoy-config` output parses, field by field, into the
official envoy.config.bootstrap.v3.Bootstrap, passes the validation rules
Envoy enforces when it loads a config (protoc-gen-validate's annotations, in
every typed_config too), and its coupled values follow the flags
(docs/envoy.md, B57, B67)."""

import subprocess

import pytest
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
# Registers the typed_config types the bootstrap names.
from envoy.config.trace.v3 import opentelemetry_pb2  # noqa: F401
from envoy.extensions.common.matching.v3 import extension_matcher_pb2
from envoy.extensions.filters.common.matcher.action.v3 import skip_action_pb2  # noqa: F401
from envoy.extensions.access_loggers.stream.v3 import stream_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.http.health_check.v3 import health_check_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.resource_monitors.downstream_connections.v3 import downstream_connections_pb2
from envoy.extensions.resource_monitors.fixed_heap.v3 import fixed_heap_pb2
from envoy.extensions.clusters.dns.v3 import dns_cluster_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2  # noqa: F401
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import http_inputs_pb2  # noqa: F401
from google.protobuf import json_format, symbol_database
from protoc_gen_validate.validator import ValidationFailed, validate_all

from conftest import BIN


def render(*flags):
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", "--ateapi-insecure", *flags],
                         capture_output=True, text=True, check=True)
    return out.stdout


def envoy_config(*flags):
    bootstrap = bootstrap_pb2.Bootstrap()
    json_format.ParseDict(yaml.safe_load(render(*flags)), bootstrap)
    return bootstrap


def pgv_errors(message, path="bootstrap"):
    """What Envoy's load-time validation would refuse in `message` and in
    every message under it, `Any` fields unpacked into their own types."""
    errors = []
    try:
        validate_all(message)
    except ValidationFailed as e:
        errors.append(f"{path} <{message.DESCRIPTOR.full_name}>: {e}")
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            items = list(value.items()) if value_field.message_type else []
        elif field.is_repeated:
            items = list(enumerate(value))
        else:
            items = [(None, value)]
        for key, item in items:
            where = f"{path}.{field.name}" + ("" if key is None else f"[{key}]")
            if item.DESCRIPTOR.full_name == "google.protobuf.Any":
                name = item.type_url.split("/")[-1]
                inner = symbol_database.Default().GetSymbol(name)()
                assert item.Unpack(inner), where
                errors += pgv_errors(inner, where)
            else:
                errors += pgv_errors(item, where)
    return errors


def parts(bootstrap):
    listeners = {l.name: l for l in bootstrap.static_resources.listeners}
    listener = listeners["ingress"]
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    ext_proc = ext_proc_pb2.ExternalProcessor()
    filters = {f.name: f for f in hcm.http_filters}
    filters["envoy.filters.http.ext_proc"].typed_config.Unpack(ext_proc)
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    return listener, hcm, ext_proc, clusters


def unpack_hcm(listener):
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    return hcm


@pytest.mark.parametrize("flags", [
    (),
    ("--parked-request-budget", "12s", "--parked-request-max", "4000", "--late-serve-limit", "20s"),
    ("--parked-request-max", "0", "--late-serve-limit", "0"),
    ("--parked-request-budget", "3570s"),
    ("--route-timeout", "0s", "--port-http", "1", "--port-health", "65535", "--port-stats", "2"),
    ("--routers", "10.0.0.1:50051,10.0.0.2:50051,[fd00::3]:50051"),
    ("--routers", "atenet-router-fleet.atenet.svc.cluster.local:50051"),
    ("--extproc-address", "unix:/var/run/atenet/extproc.sock"),
    ("--otlp-traces-address", "otel-collector:4317", "--trace-sample-percent", "100"),
])
def test_passes_envoys_own_validation_rules(flags):
    errors = pgv_errors(envoy_config(*flags))
    assert not errors, "\n".join(errors)


def test_the_validation_catches_what_envoy_would_refuse():
    """The check above can fail: a message timeout above Envoy's 3600 s."""
    text = render().replace("message_timeout: 10s", "message_timeout: 4000s")
    bootstrap = bootstrap_pb2.Bootstrap()
    json_format.ParseDict(yaml.safe_load(text), bootstrap)
    errors = pgv_errors(bootstrap)
    assert any("message_timeout" in e for e in errors), errors


def test_defaults_field_by_field():
    bootstrap = envoy_config()
    listener, hcm, ext_proc, clusters = parts(bootstrap)
    assert bootstrap.admin.address.socket_address.address == "127.0.0.1"
    assert bootstrap.admin.address.socket_address.port_value == 9901
    assert listener.address.socket_address.port_value == 8080
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.match_delegate", "envoy.filters.http.header_mutation",
        "envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    assert ext_proc.grpc_service.envoy_grpc.cluster_name == "atenet_router"
    assert not ext_proc.grpc_service.HasField("timeout"), "Envoy's ext_proc does not read it"
    assert not ext_proc.HasField("mutation_rules"), "the router mutates nothing that needs it"
    assert ext_proc.message_timeout.seconds == 10, "budget 5s + 5s"
    assert ext_proc.max_message_timeout.seconds == 35, "budget + late-serve limit 30s"
    assert ext_proc.failure_mode_allow is False
    mode = ext_proc.processing_mode
    assert mode.request_header_mode == mode.SEND and mode.response_header_mode == mode.SKIP
    assert mode.request_body_mode == mode.NONE and mode.response_body_mode == mode.NONE
    assert mode.request_trailer_mode == mode.SKIP and mode.response_trailer_mode == mode.SKIP
    assert list(ext_proc.request_attributes) == [
        "filter_state['dev.ate.target.actor']", "filter_state['dev.ate.connect.authority']"]
    assert list(ext_proc.metadata_options.receiving_namespaces.untyped) == ["envoy.filters.listener.original_dst"]
    router = clusters["atenet_router"]
    assert router.type == router.STATIC
    assert router.connect_timeout.nanos == 250_000_000
    assert router.circuit_breakers.thresholds[0].max_requests.value == 2048, "B39: 2 x 1024"
    endpoint = router.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (endpoint.address, endpoint.port_value) == ("127.0.0.1", 50051)
    assert "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" in router.typed_extension_protocol_options
    workers = clusters["atenet_workers"]
    assert workers.type == workers.ORIGINAL_DST and workers.lb_policy == workers.CLUSTER_PROVIDED
    assert not workers.HasField("load_assignment")
    key = workers.original_dst_lb_config.metadata_key
    assert key.key == "envoy.filters.listener.original_dst" and [p.key for p in key.path] == ["local"]
    assert workers.original_dst_lb_config.use_http_header is False
    connect, route = hcm.route_config.virtual_hosts[0].routes
    assert connect.match.HasField("connect_matcher") and not connect.route.upgrade_configs, \
        "B5: a CONNECT goes to the worker as a CONNECT, not terminated by Envoy"
    assert route.match.prefix == "/"
    for r in (connect, route):
        assert r.route.cluster == "atenet_workers"
        assert r.route.timeout.seconds == 300 and r.route.idle_timeout.seconds == 330
        header = r.request_headers_to_add[0]
        assert header.header.key == "X-Ate-Target-Port"
        assert header.header.value == "%DYNAMIC_METADATA(envoy.filters.listener.original_dst:port)%"
    assert [u.upgrade_type for u in hcm.upgrade_configs] == ["websocket", "CONNECT"]
    assert hcm.http2_protocol_options.allow_connect
    assert hcm.use_remote_address.value is True
    assert [(r.address_prefix, r.prefix_len.value) for r in hcm.internal_address_config.cidr_ranges] == [
        ("127.0.0.0", 8), ("::1", 128)], "B88: loopback only"


def test_access_log_health_and_stats_listeners_and_worker_breakers():
    bootstrap = envoy_config()
    listeners = {l.name: l for l in bootstrap.static_resources.listeners}
    _, hcm, _, clusters = parts(bootstrap)
    # B67: one JSON line per request on stdout, with what explains a verdict.
    log = stream_pb2.StdoutAccessLog()
    assert hcm.access_log[0].typed_config.Unpack(log)
    fields = dict(log.log_format.json_format.items())
    for field, operator in [("response_code", "%RESPONSE_CODE%"), ("response_flags", "%RESPONSE_FLAGS%"),
                            ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
                            ("atenet_reason", "%RESP(X-ATENET-REASON)%"), ("upstream_host", "%UPSTREAM_HOST%"),
                            ("duration_ms", "%DURATION%")]:
        assert fields[field] == operator, field
    # Readiness through a listener on the pod's address, not the admin port.
    health = listeners["health"]
    assert health.address.socket_address.address == "0.0.0.0"
    assert health.address.socket_address.port_value == 8081
    health_hcm = unpack_hcm(health)
    check = health_check_pb2.HealthCheck()
    assert health_hcm.http_filters[0].name == "envoy.filters.http.health_check"
    assert health_hcm.http_filters[0].typed_config.Unpack(check)
    assert check.pass_through_mode.value is False
    assert check.headers[0].name == ":path" and check.headers[0].string_match.exact == "/ready"
    # Envoy's metrics without the admin API: one exact GET route.
    stats = listeners["stats"]
    assert stats.address.socket_address.port_value == 9902
    routes = unpack_hcm(stats).route_config.virtual_hosts[0].routes
    assert routes[0].match.path == "/stats/prometheus" and routes[0].route.cluster == "envoy_admin"
    assert routes[0].match.headers[0].string_match.exact == "GET"
    assert routes[1].direct_response.status == 404, "nothing else of the admin API"
    admin = clusters["envoy_admin"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (admin.address, admin.port_value) == ("127.0.0.1", 9901)
    # The drain ignores these listeners' connections (B43, B67).
    assert {health.stat_prefix, stats.stat_prefix} == {"atenet_health", "atenet_stats"}
    thresholds = clusters["atenet_workers"].circuit_breakers.thresholds[0]
    assert thresholds.max_requests.value > 1024 and thresholds.max_pending_requests.value > 0
    options = http_protocol_options_pb2.HttpProtocolOptions()
    clusters["atenet_workers"].typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(options)
    assert options.common_http_protocol_options.idle_timeout.seconds == 300
    assert "Needs Envoy 1.30 or later" in render(), "the minimum Envoy version is stated"


def test_coupled_values_follow_the_flags():
    bootstrap = envoy_config("--parked-request-budget", "12s", "--parked-request-max", "4000",
                             "--late-serve-limit", "20s", "--port-http", "9000", "--port-extproc", "6000",
                             "--route-timeout", "10m", "--envoy-admin-address", "[::1]:9903",
                             "--port-health", "9001", "--port-stats", "9002")
    listener, hcm, ext_proc, clusters = parts(bootstrap)
    assert ext_proc.message_timeout.seconds == 17
    assert ext_proc.max_message_timeout.seconds == 32
    assert clusters["atenet_router"].circuit_breakers.thresholds[0].max_requests.value == 8000
    assert listener.address.socket_address.port_value == 9000
    endpoint = clusters["atenet_router"].load_assignment.endpoints[0].lb_endpoints[0].endpoint
    assert endpoint.address.socket_address.port_value == 6000
    assert hcm.route_config.virtual_hosts[0].routes[0].route.idle_timeout.seconds == 630
    assert bootstrap.admin.address.socket_address.address == "::1"
    listeners = {l.name: l.address.socket_address.port_value for l in bootstrap.static_resources.listeners}
    assert listeners == {"ingress": 9000, "health": 9001, "stats": 9002}
    admin = clusters["envoy_admin"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (admin.address, admin.port_value) == ("::1", 9903)


def test_parking_off_uses_the_15s_resume_budget():
    _, _, ext_proc, clusters = parts(envoy_config("--parked-request-max", "0", "--late-serve-limit", "0"))
    assert ext_proc.message_timeout.seconds == 20
    assert ext_proc.max_message_timeout.seconds == 0
    assert clusters["atenet_router"].circuit_breakers.thresholds[0].max_requests.value == 1024


@pytest.mark.parametrize("flags,flag", [
    (["--extproc-max-requests", "10"], "--extproc-max-requests"),
    (["--drain-timeout", "1s"], "--drain-timeout"),
    (["--late-serve-limit", "2s"], "--late-serve-limit"),
    (["--parked-request-budget", "3596s"], "--parked-request-budget"),
    (["--port-stats", "8081"], "--port-stats"),
    # B98: what means nothing on a Unix socket.
    (["--extproc-address", "unix:/run/x.sock", "--port-extproc", "50051"], "--port-extproc"),
    (["--extproc-address", "unix:/run/x.sock", "--extproc-insecure"], "--extproc-insecure"),
    (["--extproc-address", "unix:run/x.sock"], "absolute"),
    (["--extproc-socket-mode", "0600"], "--extproc-socket-mode"),
])
def test_refuses_what_serve_refuses(flags, flag):
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", "--ateapi-insecure", *flags],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("invalid router configuration: ") and flag in out.stderr
    assert out.stdout == ""


# Router-control headers a client may send; only the deadline passes (B88).
ROUTER_CONTROL = ["x-envoy-retry-on", "x-envoy-retry-grpc-on", "x-envoy-max-retries",
                  "x-envoy-retriable-status-codes", "x-envoy-retriable-header-names",
                  "x-envoy-upstream-rq-timeout-ms", "x-envoy-upstream-rq-per-try-timeout-ms",
                  "x-envoy-hedge-on-per-try-timeout", "x-envoy-upstream-rq-timeout-alt-response",
                  "x-envoy-upstream-stream-duration-ms", "x-envoy-upstream-alt-stat-name"]


def removed_headers(hcm):
    filters = list(hcm.http_filters)
    if filters[0].name == "envoy.filters.http.match_delegate":
        # B116: only an untrusted client's ate-priority goes before it.
        matched = extension_matcher_pb2.ExtensionWithMatcher()
        assert filters[0].typed_config.Unpack(matched)
        priority = header_mutation_pb2.HeaderMutation()
        assert matched.extension_config.typed_config.Unpack(priority)
        assert [m.remove for m in priority.mutations.request_mutations] == ["ate-priority"]
        filters = filters[1:]
    first = filters[0]
    assert first.name == "envoy.filters.http.header_mutation", "first, before any filter reads a header"
    mutation = header_mutation_pb2.HeaderMutation()
    assert first.typed_config.Unpack(mutation)
    assert not mutation.mutations.response_mutations
    return [m.remove for m in mutation.mutations.request_mutations]


def test_b88_every_client_control_header_is_removed_but_the_deadline():
    bootstrap = envoy_config()
    listeners = {l.name: l for l in bootstrap.static_resources.listeners}
    for name in ("ingress", "stats"):
        removed = removed_headers(unpack_hcm(listeners[name]))
        assert set(ROUTER_CONTROL) <= set(removed), name
        assert "x-envoy-original-path" in removed, "the access log's path"
        assert "x-envoy-expected-rq-timeout-ms" not in removed, "the caller's deadline, B68"


def test_b88_no_trusted_range_leaves_internal_address_config_out():
    """An empty cidr_ranges is Envoy 1.40's private ranges, not none."""
    _, hcm, _, _ = parts(envoy_config("--envoy-trusted-ranges", ""))
    assert not hcm.HasField("internal_address_config")
    _, hcm, _, _ = parts(envoy_config("--envoy-trusted-ranges", "10.1.0.0/16,fd00::/8"))
    assert [(r.address_prefix, r.prefix_len.value) for r in hcm.internal_address_config.cidr_ranges] == [
        ("10.1.0.0", 16), ("fd00::", 8)]


def test_b89_buffers_and_http2_are_bounded():
    bootstrap = envoy_config()
    listeners = {l.name: l for l in bootstrap.static_resources.listeners}
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    for part in [*listeners.values(), *clusters.values()]:
        assert part.per_connection_buffer_limit_bytes.value == 32768, part.name
    hcm = unpack_hcm(listeners["ingress"])
    h2 = hcm.http2_protocol_options
    assert (h2.max_concurrent_streams.value, h2.initial_stream_window_size.value,
            h2.initial_connection_window_size.value) == (100, 65536, 1048576)
    assert hcm.request_headers_timeout.seconds == 10
    assert not hcm.HasField("request_timeout"), "it would run on while a request is parked"
    options = hcm.common_http_protocol_options
    assert options.headers_with_underscores_action == options.DROP_HEADER
    assert options.idle_timeout.seconds == 75
    router = http_protocol_options_pb2.HttpProtocolOptions()
    clusters["atenet_router"].typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(router)
    h2 = router.explicit_http_config.http2_protocol_options
    assert (h2.initial_stream_window_size.value, h2.initial_connection_window_size.value) == (65536, 1048576)


@pytest.mark.parametrize("layout", [(), ("--routers", "10.0.0.1:50051,10.0.0.2:50051")])
def test_b102_envoy_pings_every_router_connection(layout):
    bootstrap = envoy_config(*layout)
    router = http_protocol_options_pb2.HttpProtocolOptions()
    cluster = {c.name: c for c in bootstrap.static_resources.clusters}["atenet_router"]
    cluster.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(router)
    keepalive = router.explicit_http_config.http2_protocol_options.connection_keepalive
    assert (keepalive.interval.ToMilliseconds(), keepalive.timeout.ToMilliseconds()) == (1000, 3000)
    # Envoy's default jitter only adds to the interval: no ping comes sooner
    # than the router's gRPC server allows (every 500 ms, B102).
    assert not keepalive.HasField("interval_jitter")


@pytest.mark.parametrize("flag,heap,connections", [
    (None, 1 << 30, 32768), ("64Mi", 64 << 20, 2048), ("1Ti", 1 << 40, 50000)])
def test_b90_overload_manager_follows_the_heap_flag(flag, heap, connections):
    overload = envoy_config(*(["--envoy-max-heap", flag] if flag else [])).overload_manager
    assert overload.refresh_interval.ToMilliseconds() == 250
    monitors = {m.name: m for m in overload.resource_monitors}
    fixed = fixed_heap_pb2.FixedHeapConfig()
    assert monitors["envoy.resource_monitors.fixed_heap"].typed_config.Unpack(fixed)
    assert fixed.max_heap_size_bytes == heap
    cap = downstream_connections_pb2.DownstreamConnectionsConfig()
    assert monitors["envoy.resource_monitors.global_downstream_max_connections"].typed_config.Unpack(cap)
    assert cap.max_active_downstream_connections == connections
    actions = {a.name: [(t.name, t.threshold.value) for t in a.triggers] for a in overload.actions}
    assert actions == {
        "envoy.overload_actions.shrink_heap": [("envoy.resource_monitors.fixed_heap", 0.95)],
        "envoy.overload_actions.stop_accepting_requests": [("envoy.resource_monitors.fixed_heap", 0.98)]}


@pytest.mark.parametrize("bad", ["63Mi", "2Ti", "1.5Gi", "1G", "512"])
def test_b90_refuses_an_absurd_heap(bad):
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", "--ateapi-insecure", "--envoy-max-heap", bad],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("invalid router configuration: --envoy-max-heap must be a size from 64Mi to 1Ti")
FLEET = "atenet-router-fleet.atenet.svc.cluster.local:50051,10.0.0.9:50052"


def test_b87_a_fleet_hashes_the_actor_over_the_routers():
    """--routers: MAGLEV over the routers, the actor (header, else B2's
    filter state) copied onto the side stream and hashed, gRPC health
    checks every second traffic or not, no panic mode, outlier detection,
    retries to another router, names resolved by Envoy."""
    _, hcm, ext_proc, clusters = parts(envoy_config("--routers", FLEET, "--parked-request-max", "3000"))
    metadata = [(m.key, m.value) for m in ext_proc.grpc_service.initial_metadata]
    assert metadata == [("ate-target-actor", "%REQ(ate-target-actor)%"),
                        ("ate-target-actor-fs", "%FILTER_STATE(dev.ate.target.actor:PLAIN)%")]
    retry = ext_proc.grpc_service.retry_policy
    assert retry.num_retries.value == 8
    assert [p.name for p in retry.retry_host_predicate] == ["envoy.retry_host_predicates.previous_hosts"]
    assert retry.host_selection_retry_max_attempts == 5
    router = clusters["atenet_router"]
    assert router.lb_policy == router.MAGLEV
    assert router.common_lb_config.healthy_panic_threshold.value == 0
    assert router.cluster_type.name == "envoy.cluster.dns"
    dns = dns_cluster_pb2.DnsCluster()
    assert router.cluster_type.typed_config.Unpack(dns)
    assert dns.dns_refresh_rate.seconds == 5 and dns.respect_dns_ttl is False
    options = http_protocol_options_pb2.HttpProtocolOptions()
    router.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(options)
    assert options.explicit_http_config.HasField("http2_protocol_options")
    assert [(h.header.header_name, h.terminal) for h in options.hash_policy] == [
        ("ate-target-actor", True), ("ate-target-actor-fs", False)]
    assert router.circuit_breakers.thresholds[0].max_requests.value == 6000, "B39: 2 x the lot"
    assert router.circuit_breakers.per_host_thresholds[0].max_connections.value == 4
    [check] = router.health_checks
    assert check.HasField("grpc_health_check") and check.grpc_health_check.service_name == ""
    assert check.interval.seconds == 1 and check.no_traffic_interval.seconds == 1 and check.timeout.seconds == 1
    assert (check.unhealthy_threshold.value, check.healthy_threshold.value) == (2, 1)
    outlier = router.outlier_detection
    assert outlier.split_external_local_origin_errors
    assert outlier.consecutive_local_origin_failure.value == 3
    assert outlier.enforcing_consecutive_local_origin_failure.value == 100
    assert outlier.max_ejection_percent.value == 100
    hosts = [(e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
             for e in router.load_assignment.endpoints[0].lb_endpoints]
    assert hosts == [("atenet-router-fleet.atenet.svc.cluster.local", 50051), ("10.0.0.9", 50052)]


def test_b87_a_fleet_of_addresses_is_static():
    _, _, _, clusters = parts(envoy_config("--routers", "127.0.0.1:1,127.0.0.2:2"))
    router = clusters["atenet_router"]
    assert router.type == router.STATIC and not router.HasField("cluster_type")
    assert router.lb_policy == router.MAGLEV


def test_b87_without_routers_the_output_is_the_sidecars():
    """Byte for byte: --routers "" is no flag at all, and nothing of the
    fleet appears."""
    text = render()
    assert render("--routers", "") == text
    for fleet_only in ("MAGLEV", "initial_metadata", "previous_hosts", "health_checks", "outlier_detection"):
        assert fleet_only not in text


@pytest.mark.parametrize("value,complaint", [
    ("a:1,,b:2", "entry 2 is empty"),
    ("a:1,", "entry 2 is empty"),
    ("a:0", "port 0"),
    ("a:1,A:1", "a second time"),
    ("a", "has no port"),
    ("a\"b:1", "neither an IP address nor a DNS name"),
    (",".join(f"10.0.1.{i}:1" for i in range(1, 66)), "at most 64"),
])
def test_b87_bad_routers_exit_2(value, complaint):
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", "--ateapi-insecure", "--routers", value],
                         capture_output=True, text=True)
    assert out.returncode == 2, out
    assert out.stderr.startswith("invalid router configuration: --routers: ") and complaint in out.stderr
    assert out.stdout == ""


def test_b87_a_fleet_needs_a_drain_delay_its_health_checks_can_see():
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", "--ateapi-insecure", "--routers", "a:1",
                          "--drain-delay", "2s"], capture_output=True, text=True)
    assert out.returncode == 2 and "--drain-delay of at least 3s" in out.stderr, out
    render("--routers", "a:1", "--drain-delay", "3s")


def test_b98_a_unix_socket_is_the_router_clusters_pipe():
    """The router cluster of a router on a Unix socket: the same STATIC
    HTTP/2 cluster, its one endpoint a pipe at the path, no TLS."""
    _, _, _, clusters = parts(envoy_config("--extproc-address", "unix:/var/run/atenet/extproc.sock"))
    router = clusters["atenet_router"]
    assert router.type == router.STATIC and not router.HasField("transport_socket")
    address = router.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert address.WhichOneof("address") == "pipe"
    assert address.pipe.path == "/var/run/atenet/extproc.sock"
    assert "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" in router.typed_extension_protocol_options
