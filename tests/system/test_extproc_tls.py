"""ext_proc over TLS through a real Envoy 1.40 (B86): `envoy-config` of the
router's TLS flags gives the router cluster an UpstreamTlsContext whose files
Envoy reads through the SDS files envoy-config writes; a client request goes
client -> Envoy -(mTLS)-> router and reaches the worker. Certificates are made
by the openssl command at test time."""

import http.client
import subprocess

import pytest

from envoy_stack import LOOPBACK, Stack, render_config, validate_config


def openssl(directory, *args):
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def make_pki(directory):
    """A CA; the router's certificate for router.test; Envoy's client
    certificate; a second CA that signs nothing the router trusts."""
    for ca in ("ca", "other-ca"):
        openssl(directory, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2", "-subj", f"/CN={ca}")
    for name, ext in (("router", "subjectAltName=DNS:router.test"), ("envoy", "extendedKeyUsage=clientAuth")):
        (directory / f"{name}.ext").write_text(ext + "\n")
        openssl(directory, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")


def tls_flags(d, envoy_ca="ca.crt"):
    return ["--extproc-cert-file", str(d / "router.crt"), "--extproc-key-file", str(d / "router.key"),
            "--extproc-client-ca-file", str(d / "ca.crt"),
            "--envoy-router-ca-file", str(d / envoy_ca), "--envoy-router-cert-file", str(d / "envoy.crt"),
            "--envoy-router-key-file", str(d / "envoy.key"), "--envoy-router-server-name", "router.test",
            "--envoy-sds-dir", str(d / "sds")]


SCRIPT = "demo/tls  OK  0s  127.0.1.1  true  -\n"


def get(stack, actor):
    conn = http.client.HTTPConnection(LOOPBACK, stack.http_port, timeout=60)
    conn.request("GET", "/over-tls", headers={"ate-target-actor": actor})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, response.getheader("x-atenet-reason"), body


def test_a_request_reaches_the_worker_through_envoys_mtls_to_the_router(tmp_path):
    make_pki(tmp_path)
    with Stack(router_flags=tls_flags(tmp_path), script=SCRIPT, workers=1) as stack:
        status, reason, _ = get(stack, "demo/tls")
        assert (status, reason) == (200, None), "routed over mTLS"
        assert [r["actor"] for r in stack.records()] == ["demo/tls"], \
            "the echo worker recorded it"
        status, reason, _ = get(stack, "demo/nobody")
        assert (status, reason) == (404, "atenet_not_found"), "the router answered over mTLS"
        assert (tmp_path / "sds" / "atenet_router_ca.yaml").exists()


def test_an_envoy_that_does_not_trust_the_router_gets_no_answer_from_it(tmp_path):
    """The same stack, but Envoy verifies the router against another CA:
    every request gets Envoy's own 503, never the router's answer."""
    make_pki(tmp_path)
    with Stack(router_flags=tls_flags(tmp_path, envoy_ca="other-ca.crt"), script=SCRIPT, workers=1) as stack:
        status, reason, _ = get(stack, "demo/tls")
        assert status == 503 and reason is None, (status, reason)
        assert stack.records() == [], "nothing reached the worker"


def test_the_tls_bootstrap_loads_in_envoy(tmp_path):
    make_pki(tmp_path)
    path = tmp_path / "envoy.yaml"
    path.write_text(render_config(["--ateapi-insecure", *tls_flags(tmp_path)]))
    assert "UpstreamTlsContext" in path.read_text()
    result = validate_config(path)
    assert result.returncode == 0, result.stdout


def test_the_tls_fleet_bootstrap_loads_in_envoy(tmp_path):
    """B87 with B86: a fleet's health checks use the cluster's TLS too (the
    health service is on the ext_proc port)."""
    make_pki(tmp_path)
    path = tmp_path / "envoy.yaml"
    path.write_text(render_config(["--ateapi-insecure", *tls_flags(tmp_path),
                                   "--routers", "router.test:50051,127.0.0.1:50052"]))
    text = path.read_text()
    assert "UpstreamTlsContext" in text and "MAGLEV" in text and "grpc_health_check" in text
    result = validate_config(path)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("drop,complaint", [
    ("--envoy-router-ca-file", "--envoy-router-ca-file"),
    ("--envoy-sds-dir", "--envoy-sds-dir"),
    ("--envoy-router-cert-file", "--envoy-router-cert-file"),
])
def test_envoy_config_refuses_an_incomplete_tls_side(tmp_path, drop, complaint):
    make_pki(tmp_path)
    flags = tls_flags(tmp_path)
    at = flags.index(drop)
    del flags[at:at + 2]
    with pytest.raises(RuntimeError, match=complaint):
        render_config(["--ateapi-insecure", *flags])


def test_a_tls_fleet_health_checks_and_routes_over_mtls(tmp_path):
    """B87 with B86, live: two routers requiring client certificates, one
    Envoy from `envoy-config --routers`: its gRPC health checks pass over
    mTLS (both routers in rotation) and a request reaches the worker."""
    from envoy_stack import FleetStack
    make_pki(tmp_path)
    with FleetStack(routers=2, envoys=1, router_flags=tls_flags(tmp_path), script=SCRIPT, workers=1) as fleet:
        assert fleet.healthy_routers(0) == 2, fleet.router_hosts(0)
        conn = http.client.HTTPConnection(LOOPBACK, fleet.envoy_ports[0]["http"], timeout=60)
        conn.request("GET", "/over-tls", headers={"ate-target-actor": "demo/tls"})
        response = conn.getresponse()
        response.read()
        conn.close()
        assert (response.status, response.getheader("x-atenet-reason")) == (200, None)
        assert [r["actor"] for r in fleet.records()] == ["demo/tls"]
