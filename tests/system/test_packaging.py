"""Packaging stays true to the router: the drain's grace period, the systemd
unit, the Prometheus rules and the Grafana dashboard are checked against the
real binary and real tools (promtool, systemd-analyze). The Kubernetes
manifests have test_kubernetes.py, the compose stack test_compose.py."""

import json
import pathlib
import re
import shutil
import subprocess
import tempfile
import urllib.request

import pytest
import yaml

from conftest import BIN
from test_kubernetes import drain_grace, router_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"

# The Kubernetes manifests' own tests (rendering, schemas, probes, ports, the
# generated Envoy bootstrap) are in test_kubernetes.py.


def test_termination_grace_covers_the_drain():
    # drain delay + the Envoy window (idle timeout 75 s + 10 s) + drain
    # timeout (0 derives budget + max(15 s, late-serve limit)) + 10 s slack,
    # rounded up to 10 s: 13 + 85 + (5 + 30) + 10 = 143 -> 150 at defaults.
    flags = router_flags()
    grace = drain_grace(flags)
    spec = yaml.safe_load((PACKAGING / "kubernetes/deployment.yaml").read_text())["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == grace == 150
    unit = (PACKAGING / "systemd/atenet-router.service").read_text()
    assert f"TimeoutStopSec={grace}" in unit


def unit_and_flags():
    unit = (PACKAGING / "systemd/atenet-router.service").read_text()
    env = (PACKAGING / "systemd/atenet-router.env").read_text()
    flags = re.search(r'ROUTER_FLAGS="([^"]*)"', env).group(1).split()
    return unit, flags


def test_systemd_unit_verifies_and_is_hardened():
    unit, flags = unit_and_flags()
    for setting in ["Type=notify", "NotifyAccess=all", "ExecReload=/bin/kill -HUP $MAINPID", "RestartPreventExitStatus=2", "DynamicUser=yes",
                    "NoNewPrivileges=yes", "ProtectSystem=strict", "RuntimeDirectory=atenet"]:
        assert setting in unit, setting
    assert "/run/atenet/drain-complete" in flags, "the marker lives in the RuntimeDirectory"
    assert "--envoy-admin-address=" in flags, "the shipped flags drain no Envoy the unit does not own"
    # Every credential the flags name comes through LoadCredential=, under
    # the unit's credentials directory.
    credentials = dict(line.split("=", 1)[1].split(":", 1) for line in unit.splitlines()
                       if line.startswith("LoadCredential="))
    named = [f for f in flags if f.startswith("/run/credentials/")]
    assert named and all(f.startswith("/run/credentials/atenet-router.service/") for f in named)
    assert {f.rsplit("/", 1)[1] for f in named} == set(credentials), (named, credentials)
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
        security = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(local)],
                                  capture_output=True, text=True)
    score = re.search(r"Overall exposure level for atenet-router.service: ([0-9.]+)", security.stdout)
    assert score, security.stdout + security.stderr
    assert float(score.group(1)) <= 1.5, security.stdout
    readme = (ROOT / "README.md").read_text()
    assert f"exposure level {score.group(1)}" in readme, f"the README states the exposure score {score.group(1)}"


def test_the_env_file_says_how_to_add_each_optional_credential():
    # The README sends operators to the env file for the client certificate
    # and the token: each needs its flag, naming the file under the unit's
    # credentials directory, and a drop-in loading that very credential.
    env = (PACKAGING / "systemd/atenet-router.env").read_text()
    readme = (ROOT / "README.md").read_text()
    _, flags = unit_and_flags()
    found = re.findall(r"^#\s+(\S+):\s+(.*)\n#\s+with a drop-in: (LoadCredential=([^:\s]+):(\S+))$", env, re.M)
    assert [kind for kind, *_ in found] == ["mTLS", "token"], env
    for kind, flag, load, name, source in found:
        expected = {"mTLS": "--ateapi-client-cert", "token": "--ateapi-token-file"}[kind]
        assert flag == f"{expected} /run/credentials/atenet-router.service/{name}", (kind, flag)
        assert source == f"/etc/atenet-router/{name}", (kind, source)
        # The flag is one the router takes beside the shipped ones.
        subprocess.run([f"{BIN}/atenet-router", "envoy-config", *flags, *flag.split()], check=True,
                       capture_output=True)
    mtls = dict((kind, (flag, load)) for kind, flag, load, *_ in found)["mTLS"]
    assert f"ROUTER_FLAGS: {mtls[0]}" in readme and mtls[1] in readme, "the README's mTLS steps are the env file's"


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


# Series a router exports only when configured so, which this stack is not;
# test_prometheus.py's router is (it presents a client certificate to ateapi),
# and there every series the alerts query must exist.
CONFIGURED_ONLY = {"atenet_router_certificate_expiry_timestamp_seconds"}


def test_dashboard_and_alerts_only_use_metrics_the_router_exports(stack):
    # Make every labelled family appear at least once.
    from test_envoy_messages import route
    route(stack, "demo/parks")
    names = exported_metric_names(stack)
    dashboard = json.loads((PACKAGING / "grafana/atenet-router-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= referenced(target["expr"])
    for rule in yaml.safe_load((PACKAGING / "prometheus/alerts.yml").read_text())["groups"][0]["rules"]:
        used |= referenced(rule["expr"])
    missing = {n for n in used if base_name(n) not in names and n not in names} - CONFIGURED_ONLY
    assert not missing, f"not exported by the router: {missing}"
