"""Packaging stays true to the router: the drain's grace period, the systemd
unit, the Prometheus rules and the Grafana dashboard are checked against the
real binary and real tools (promtool, systemd-analyze). The Kubernetes
manifests have test_kubernetes.py, the compose stack test_compose.py."""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
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
    deploy = (ROOT / "docs/deploy.md").read_text()
    assert f"exposure level {score.group(1)}" in deploy, f"docs/deploy.md states the exposure score {score.group(1)}"


def test_the_env_file_says_how_to_add_each_optional_credential():
    # docs/deploy.md sends operators to the env file for the client certificate
    # and the token: each needs its flag, naming the file under the unit's
    # credentials directory, and a drop-in loading that very credential.
    env = (PACKAGING / "systemd/atenet-router.env").read_text()
    deploy = (ROOT / "docs/deploy.md").read_text()
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
    assert f"ROUTER_FLAGS: {mtls[0]}" in deploy and mtls[1] in deploy, "docs/deploy.md's mTLS steps are the env file's"


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


def shell_commands(markdown):
    """The commands in a markdown text's sh blocks, without their comments."""
    blocks = re.findall(r"```sh\n(.*?)```", markdown, re.S)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.startswith("#")]


def test_the_tarball_runs_as_its_readme_says(tmp_path):
    # make package, unpacked elsewhere, with no checkout around it: what
    # its README tells to run runs from there, the demo included (make run's
    # script once looked for the binaries in the build's target directory
    # and printed make commands; the README was the checkout's).
    from envoy_stack import envoy_binary
    from test_demo import BANNER_END, READY_TIMEOUT, Demo, demo_env, free_ports, run_printed, printed_commands

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ATENET_BIN_DIR")}
    built = subprocess.run(["make", "-s", "package", f"DIST={tmp_path / 'dist'}",
                            f"CARGO_TARGET_DIR={pathlib.Path(BIN).parent}"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = (tmp_path / "dist").glob("atenet-router-*-linux-*.tar.gz")
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-C", str(unpacked), "-xzf", str(tarball)], check=True)
    (root,) = unpacked.iterdir()

    readme = (root / "README.md").read_text()
    commands = shell_commands(readme)
    assert not [c for c in commands if c.startswith(("make ", "sudo make"))], commands
    assert "make run" not in readme.replace("make package", ""), "the tarball's README sends to make"
    for path in re.findall(r"`((?:bin|tools|packaging|docs)/[^`\s]*|README-source\.md)`", readme):
        assert (root / path).exists(), f"the README names {path}, which the tarball lacks"

    # The router's own commands, as written.
    for command in [c for c in commands if c.startswith("bin/atenet-router ")]:
        result = subprocess.run(["bash", "-c", command], cwd=root, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{command}: {result.stdout}{result.stderr}"

    # The demo script's modes are the ones the README names, and the other way round.
    usage = subprocess.run([str(root / "packaging/demo/run.sh"), "--help"], cwd=root, capture_output=True, text=True)
    assert usage.returncode == 2
    modes = set(re.search(r"\[([a-z|-]+)\]", usage.stderr)[1].split("|"))
    demo_lines = [c for c in commands if "packaging/demo/run.sh" in c]
    assert {c.split("packaging/demo/run.sh ")[1].split()[0] for c in demo_lines} == modes, (demo_lines, usage.stderr)

    # Each demo line, run as written from the tarball (ENVOY=/path/to/envoy
    # being the venv's Envoy), on free ports: it comes up, what its banner
    # prints runs, and SIGTERM stops it with status 0.
    for line in demo_lines:
        mode = line.split("packaging/demo/run.sh ")[1].split()[0]
        if mode == "envoy-config":
            result = subprocess.run(["bash", "-c", line], cwd=root, capture_output=True, text=True, timeout=30)
            assert result.returncode == 0 and "ext_proc" in result.stdout, result.stderr
            continue
        words = shlex.split(line.replace("/path/to/envoy", envoy_binary()))
        env = demo_env(tmp_path / mode, **free_ports())
        del env["ATENET_BIN_DIR"]  # the tarball's own binaries
        while "=" in words[0]:
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        demo = Demo([str(root / words[0]), *words[1:]], env, cwd=root)
        try:
            demo.wait_for(re.escape(BANNER_END), READY_TIMEOUT)
            output = demo.output()
            assert not re.search(r"\bmake\b", output), output
            (load,) = [l.strip() for l in output.splitlines() if "tools/parkload" in l]
            assert load.startswith(f"{root}/tools/parkload --target 127.0.0.1:"), load
            run_printed(load.replace("--duration 10s", "--duration 1s"), timeout=60)
            for command in printed_commands(output)[:1]:  # routed through Envoy to the echo worker
                assert run_printed(command).startswith("HTTP/1.1 200"), command
            demo.proc.send_signal(signal.SIGTERM)
            assert demo.wait_exit() == 0, demo.output()
        finally:
            demo.kill()
