"""Packaging stays true to the router: the Kubernetes manifests, the systemd
unit, the Prometheus rules and the Grafana dashboard are checked against the
real binary and real tools (promtool, systemd-analyze)."""

import json
import math
import pathlib
import re
import shutil
import subprocess
import tempfile
import urllib.request

import pytest
import yaml

from conftest import BIN

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"


def deployment():
    return yaml.safe_load((PACKAGING / "kubernetes/deployment.yaml").read_text())


def containers():
    spec = deployment()["spec"]["template"]["spec"]
    return spec, {c["name"]: c for c in spec["containers"]}


def router_flags():
    _, by_name = containers()
    args = by_name["router"]["args"]
    assert args[0] == "serve"
    return args[1:]


def flag(args, name, default):
    for arg in args:
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def seconds(text):
    return float(text[:-1]) if text.endswith("s") else float(text)


def test_envoy_bootstrap_is_what_envoy_config_prints_for_the_router_flags():
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", *router_flags()],
                         capture_output=True, text=True, check=True).stdout
    assert (PACKAGING / "kubernetes/envoy-bootstrap.yaml").read_text() == out, \
        "regenerate with: make k8s-envoy-config"


def test_termination_grace_covers_the_drain():
    args = router_flags()
    delay = seconds(flag(args, "--drain-delay", "13s"))
    budget = seconds(flag(args, "--parked-request-budget", "5s"))
    timeout = seconds(flag(args, "--drain-timeout", "0")) or budget + 15
    grace = math.ceil((delay + 15 + timeout + 10) / 10) * 10
    spec, _ = containers()
    assert spec["terminationGracePeriodSeconds"] == grace == 60
    unit = (PACKAGING / "systemd/atenet-router.service").read_text()
    assert f"TimeoutStopSec={grace}" in unit


def test_probes_marker_and_prestop():
    spec, by_name = containers()
    router, envoy = by_name["router"], by_name["envoy"]
    assert router["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert router["livenessProbe"]["httpGet"]["path"] == "/healthz"
    marker = flag(router_flags(), "--drain-complete-file", None)
    assert marker and marker.startswith("/var/run/atenet/")
    assert marker in " ".join(envoy["lifecycle"]["preStop"]["exec"]["command"])
    mounts = {m["name"]: m["mountPath"] for c in (router, envoy) for m in c["volumeMounts"]}
    assert mounts["drain"] == "/var/run/atenet"
    assert {"name": "drain", "emptyDir": {}} in spec["volumes"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert flag(router_flags(), "--extproc-address", None) == "127.0.0.1", "ext_proc stays in the pod"


def test_pdb_and_hpa_target_the_deployment():
    pdb = yaml.safe_load((PACKAGING / "kubernetes/pdb.yaml").read_text())
    hpa = yaml.safe_load((PACKAGING / "kubernetes/hpa.yaml").read_text())
    labels = deployment()["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment()["metadata"]["name"]


def test_systemd_unit_verifies_and_is_hardened():
    unit = (PACKAGING / "systemd/atenet-router.service").read_text()
    for setting in ["DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "RuntimeDirectory=atenet"]:
        assert setting in unit
    env = (PACKAGING / "systemd/atenet-router.env").read_text()
    flags = re.search(r'ROUTER_FLAGS="([^"]*)"', env).group(1).split()
    assert "/run/atenet/drain-complete" in flags, "the marker lives in the RuntimeDirectory"
    # The environment file's flags are valid router flags.
    subprocess.run([f"{BIN}/atenet-router", "envoy-config", *flags], check=True, capture_output=True)
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed")
    with tempfile.TemporaryDirectory() as tmp:
        local = pathlib.Path(tmp) / "atenet-router.service"
        local.write_text(unit.replace("/usr/local/bin/atenet-router", f"{BIN}/atenet-router")
                         .replace("/etc/atenet-router/atenet-router.env", str(PACKAGING / "systemd/atenet-router.env")))
        result = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_prometheus_rules_and_config_check_and_alerts_fire():
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: make deps installs Debian's prometheus package"
    cwd = PACKAGING / "prometheus"
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"],
                 ["test", "rules", "alerts_test.yml"]):
        result = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def exported_metric_names(stack):
    text = urllib.request.urlopen(f"http://{stack.metrics_addr}/metrics", timeout=10).read().decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


def referenced(expr):
    return set(re.findall(r"atenet_router_[a-z_]+", expr))


def base_name(name):
    return re.sub(r"_(bucket|count|sum)$", "", name)


def test_dashboard_and_alerts_only_use_metrics_the_router_exports(stack):
    # Make every labelled family appear at least once.
    from test_envoy_compat import route
    route(stack, "demo/parks")
    names = exported_metric_names(stack)
    dashboard = json.loads((PACKAGING / "grafana/atenet-router-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= referenced(target["expr"])
    for rule in yaml.safe_load((PACKAGING / "prometheus/alerts.yml").read_text())["groups"][0]["rules"]:
        used |= referenced(rule["expr"])
    missing = {n for n in used if base_name(n) not in names and n not in names}
    assert not missing, f"not exported by the router: {missing}"
