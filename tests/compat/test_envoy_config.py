"""`atenet-router envoy-config` output parses, field by field, into the
official envoy.config.bootstrap.v3.Bootstrap, and its coupled values follow
the flags (envoy.md)."""

import subprocess

import pytest
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
# Registers the typed_config types the bootstrap names.
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import json_format

from conftest import BIN


def envoy_config(*flags):
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", "--ateapi-insecure", *flags],
                         capture_output=True, text=True, check=True)
    bootstrap = bootstrap_pb2.Bootstrap()
    json_format.ParseDict(yaml.safe_load(out.stdout), bootstrap)
    return bootstrap


def parts(bootstrap):
    listener = bootstrap.static_resources.listeners[0]
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    ext_proc = ext_proc_pb2.ExternalProcessor()
    hcm.http_filters[0].typed_config.Unpack(ext_proc)
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    return listener, hcm, ext_proc, clusters


def test_defaults_field_by_field():
    bootstrap = envoy_config()
    listener, hcm, ext_proc, clusters = parts(bootstrap)
    assert bootstrap.admin.address.socket_address.address == "127.0.0.1"
    assert bootstrap.admin.address.socket_address.port_value == 9901
    assert listener.address.socket_address.port_value == 8080
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    assert ext_proc.grpc_service.envoy_grpc.cluster_name == "atenet_router"
    assert ext_proc.grpc_service.timeout.seconds == 10
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
    assert ext_proc.mutation_rules.allow_all_routing.value is True
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
    route = hcm.route_config.virtual_hosts[0].routes[0]
    assert route.match.prefix == "/" and route.route.cluster == "atenet_workers"
    assert route.route.timeout.seconds == 300 and route.route.idle_timeout.seconds == 330
    header = route.request_headers_to_add[0]
    assert header.header.key == "X-Ate-Target-Port"
    assert header.header.value == "%DYNAMIC_METADATA(envoy.filters.listener.original_dst:port)%"


def test_coupled_values_follow_the_flags():
    bootstrap = envoy_config("--parked-request-budget", "12s", "--parked-request-max", "4000",
                             "--late-serve-limit", "20s", "--port-http", "9000", "--port-extproc", "6000",
                             "--route-timeout", "10m", "--envoy-admin-address", "[::1]:9902")
    listener, hcm, ext_proc, clusters = parts(bootstrap)
    assert ext_proc.message_timeout.seconds == 17
    assert ext_proc.max_message_timeout.seconds == 32
    assert clusters["atenet_router"].circuit_breakers.thresholds[0].max_requests.value == 8000
    assert listener.address.socket_address.port_value == 9000
    endpoint = clusters["atenet_router"].load_assignment.endpoints[0].lb_endpoints[0].endpoint
    assert endpoint.address.socket_address.port_value == 6000
    assert hcm.route_config.virtual_hosts[0].routes[0].route.idle_timeout.seconds == 630
    assert bootstrap.admin.address.socket_address.address == "::1"


def test_parking_off_uses_the_15s_resume_budget():
    _, _, ext_proc, clusters = parts(envoy_config("--parked-request-max", "0", "--late-serve-limit", "0"))
    assert ext_proc.message_timeout.seconds == 20
    assert ext_proc.max_message_timeout.seconds == 0
    assert clusters["atenet_router"].circuit_breakers.thresholds[0].max_requests.value == 1024


@pytest.mark.parametrize("flags,flag", [
    (["--extproc-max-requests", "10"], "--extproc-max-requests"),
    (["--drain-timeout", "1s"], "--drain-timeout"),
    (["--late-serve-limit", "2s"], "--late-serve-limit"),
])
def test_refuses_what_serve_refuses(flags, flag):
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", "--ateapi-insecure", *flags],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("invalid router configuration: ") and flag in out.stderr
    assert out.stdout == ""
