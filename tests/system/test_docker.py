"""The container images: built for real and run, and their build context.

The images are built by `packaging/docker/build.sh` (what `make docker`
runs) under an engine from `packaging/docker/engine.sh` (a dockerd started
here when none answers, stopped afterwards). With no registry, as on these
machines, that is the Debian-packages path: the bases made with mmdebstrap,
the binaries `make build` compiled. The router's container then runs the
way an operator would run it: `--version`, a bad flag, UID 65532 on a
read-only root with the drain marker on a volume, /healthz and /metrics
from the host, ext_proc routed against the simulator (the tools image) on a
bridge network, and `docker stop` draining it to exit 0. Truth is the
checkout (version, revision), the kernel (the process's UID, the read-only
root), the simulator's own answer log and the volume's marker.

The registry path's Rust stage cannot run here, so it is checked the way a
build would fail: its build context is rebuilt exactly (the files its COPY
lines name, minus .dockerignore) in a temporary directory, and its own
cargo command runs there, with the shared target directory so that only the
crate itself compiles. `cargo metadata` would not catch a missing target
file (a declared bench, say); `cargo build` does.
"""

import fnmatch
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from conftest import BIN
from test_envoy_messages import check_route, route

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "packaging/docker/Dockerfile"


def instructions():
    """(instruction, arguments, stage) for each line of the Dockerfile,
    continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stage = None
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stage = rest.split(" AS ")[-1].strip() if " AS " in rest else None
        out.append((word, rest.strip(), stage))
    return out


def ignored(relative):
    """.dockerignore's verdict: the last pattern that matches decides, and a
    `!pattern` lets a path back in."""
    path = relative.as_posix()
    verdict = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").lstrip("/").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            verdict = not keep
    return verdict


def build_context(into):
    """Copies what the `build` stage's COPY lines name into `into` (the
    other stages copy what build.sh staged, or the echo worker)."""
    copied = []
    for word, args, stage in instructions():
        if word != "COPY" or args.startswith("--from") or stage != "build":
            continue
        sources = shlex.split(args)[:-1]
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"COPY {source}: not in the repository"
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for f in files:
                relative = f.relative_to(ROOT)
                if ignored(relative):
                    continue
                target = into / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
                copied.append(relative)
    return copied


def cargo_command():
    runs = [args for word, args, stage in instructions() if word == "RUN" and "cargo build" in args]
    assert len(runs) == 1, runs
    command = runs[0].split("&&")[0].strip()
    assert command.startswith("cargo build --release --locked"), command
    return shlex.split(command)


def test_the_build_context_builds_with_the_dockerfiles_own_cargo_command(tmp_path):
    copied = build_context(tmp_path)
    assert pathlib.Path("Cargo.toml") in copied and pathlib.Path("src/main.rs") in copied
    target = os.environ.get("CARGO_TARGET_DIR", "/var/tmp/atenet-router-target")
    revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip() or "unknown"
    # Same revision as the checkout's, so the binaries it leaves in the shared
    # target directory are the ones the other tests use.
    env = dict(os.environ, CARGO_TARGET_DIR=target, ATENET_GIT_REVISION=revision)
    result = subprocess.run(cargo_command(), cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


def arg_defaults():
    return dict(args.split("=", 1) for word, args, _ in instructions() if word == "ARG" and "=" in args)


def test_stages_images_and_pins():
    defaults = arg_defaults()
    stages = [stage for word, _, stage in instructions() if word == "FROM"]
    for word, args, _ in instructions():
        if word != "FROM":
            continue
        name = args.split()[0]
        variable = re.fullmatch(r"\$\{(\w+)\}", name)
        name = defaults[variable[1]] if variable else name
        if name == "scratch" or name in stages:
            continue
        assert re.search(r":\d+(\.\d+)+", name), f"base image pinned to an explicit release: {name}"
    assert defaults["BINARIES"] == "build", "with a registry, the binaries are compiled in the image"
    assert stages[-1] == "runtime", "the router image is the default target"
    assert "tools" in stages
    copies = {stage: args for word, args, stage in instructions() if word == "COPY" and args.startswith("--from")}
    assert "atenet-router" in copies["runtime"] and "ateapi-sim" not in copies["runtime"] \
        and "parkload" not in copies["runtime"], "the runtime image holds only the router"
    assert "ateapi-sim" in copies["tools"] and "parkload" in copies["tools"]
    users = {stage: args for word, args, stage in instructions() if word == "USER"}
    assert users["runtime"].startswith("65532"), "not root"


@pytest.mark.parametrize("missing", ["benches", "proto"])
def test_a_context_missing_a_declared_file_fails_to_build(tmp_path, missing):
    """The check above can fail: without a directory the manifest needs,
    the same command refuses to build."""
    build_context(tmp_path)
    shutil.rmtree(tmp_path / missing)
    env = dict(os.environ, CARGO_TARGET_DIR=os.environ.get("CARGO_TARGET_DIR", "/var/tmp/atenet-router-target"))
    command = cargo_command() + ["--offline"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode != 0


# -- The images, built and run ------------------------------------------------

ENGINE = ROOT / "packaging/docker/engine.sh"
BUILD = ROOT / "packaging/docker/build.sh"
# Host ports (loopback) and a bridge network of this test's own: the compose
# stack (make e2e) uses 172.29.47.0/24.
METRICS_PORT = 18491
EXTPROC_PORT = 18492
SUBNET = "172.29.48.0/24"
SIM_IP, ROUTER_IP = "172.29.48.30", "172.29.48.20"
# The one worker the simulator hands out: no container has it, only the
# simulator's flags say it.
WORKER_IP = "10.77.0.7"
NAME = f"atenet-test-docker-{os.getpid()}"


def docker(*args, check=True, timeout=120):
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {result.returncode}: {result.stderr[-2000:]}")
    return result


def version_and_revision():
    version = re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M)[1]
    revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    return version, revision


@pytest.fixture(scope="module")
def engine():
    """A Docker engine: the running one, else a dockerd of our own, stopped
    at the end. No engine is a failure, never a skip."""
    started = subprocess.run([str(ENGINE), "start"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, f"no Docker engine: {started.stderr}"
    pid = started.stdout.strip()
    yield
    if pid:
        subprocess.run([str(ENGINE), "stop", pid], check=True, timeout=120)


@pytest.fixture(scope="module")
def images(engine):
    """The router and tools images, built as `make docker` builds them."""
    version, revision = version_and_revision()
    env = dict(os.environ, VERSION=version, REVISION=revision, ATENET_BIN_DIR=BIN)
    result = subprocess.run([str(BUILD), "runtime", "tools"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(result.stdout)
    return f"atenet-router:{version}", f"atenet-router-tools:{version}"


def remove_test_objects(prefix):
    """Removes the containers, networks and volumes whose names start with
    `prefix`: a fixture whose setup failed leaves its container behind, and
    its network's subnet would then refuse the next run's."""
    for kind, listing in (("container", ["ps", "-aq"]), ("network", ["network", "ls", "-q"]),
                          ("volume", ["volume", "ls", "-q"])):
        ids = docker(*listing, "--filter", f"name={prefix}", check=False).stdout.split()
        if ids:
            docker(kind, "rm", *(["-f"] if kind == "container" else []), *ids, check=False)


@pytest.fixture(scope="module")
def network(engine):
    remove_test_objects("atenet-test-docker-")
    docker("network", "create", "--subnet", SUBNET, NAME)
    yield NAME
    remove_test_objects(NAME)


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def poll(what, probe, timeout=60):
    """Polls until `probe` returns something true. A connection refused or
    reset is "not yet": docker-proxy accepts on a published port before the
    container listens, then resets the connection."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = probe()
        except OSError as e:
            value, last_error = None, e
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s (last error: {last_error!r})"
        time.sleep(0.2)


def test_the_image_prints_its_version_and_revision(images):
    router, _ = images
    version, revision = version_and_revision()
    out = docker("run", "--rm", router, "--version").stdout
    assert out.strip() == f"atenet-router {version} (revision {revision})"


def test_a_bad_flag_exits_2_with_the_message_on_the_containers_stderr(images):
    router, _ = images
    result = docker("run", "--rm", router, "serve", "--no-such-flag", check=False)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "--no-such-flag" in result.stderr and result.stdout == ""


def test_the_images_run_as_65532_with_the_dockerfiles_entrypoints(images):
    router, tools = images
    for image, entrypoint in ((router, "/usr/local/bin/atenet-router"), (tools, "/usr/local/bin/ateapi-sim")):
        config = json.loads(docker("image", "inspect", "-f", "{{json .Config}}", image).stdout)
        assert config["User"] == "65532:65532", image
        assert config["Entrypoint"] == [entrypoint], image
    assert json.loads(docker("image", "inspect", "-f", "{{json .Config}}", router).stdout)["StopSignal"] == "SIGTERM"


@pytest.fixture(scope="module")
def sim(images, network):
    """ateapi-sim from the tools image on the bridge network; its answer log
    (every ResumeActor it answered) is the truth of what it placed."""
    _, tools = images
    name = f"{NAME}-sim"
    docker("run", "-d", "--name", name, "--network", network, "--ip", SIM_IP,
           "--tmpfs", "/log:uid=65532,gid=65532", tools,
           "--listen", "0.0.0.0:50061", "--workers", "4", "--actors", "8", "--worker-ip", WORKER_IP,
           "--answer-log", "/log/answers.jsonl")
    poll("the simulator's startup line", lambda: "listening on" in docker("logs", name).stderr)
    yield name
    docker("rm", "-f", name, check=False)


@pytest.fixture(scope="module")
def router(images, network, sim):
    """The router's container as an operator runs it: read-only root, the
    drain marker's directory a named volume, metrics and ext_proc published
    on the host's loopback."""
    image, _ = images
    name, volume = f"{NAME}-router", f"{NAME}-marker"
    docker("run", "-d", "--name", name, "--network", network, "--ip", ROUTER_IP,
           "--read-only", "--mount", f"type=volume,src={volume},dst=/var/run/atenet", "--stop-timeout", "60",
           "-p", f"127.0.0.1:{METRICS_PORT}:9090", "-p", f"127.0.0.1:{EXTPROC_PORT}:50051",
           image, "serve", "--ateapi-insecure", f"--ateapi-address={SIM_IP}:50061",
           # Plaintext on the test's own bridge network (B86), published on
           # the host's loopback only.
           "--extproc-address=0.0.0.0", "--extproc-insecure", "--envoy-admin-address=", "--drain-delay=1s", "--worker-port=8000")
    poll("/readyz from the host", lambda: get(f"http://127.0.0.1:{METRICS_PORT}/readyz")[0] == 200)
    yield name, volume
    docker("rm", "-f", name, check=False)
    docker("volume", "rm", volume, check=False)


def test_the_router_runs_as_65532_on_a_read_only_root(router):
    name, _ = router
    # The kernel's view of the router process, not the image's config.
    status = docker("exec", name, "cat", "/proc/1/status").stdout
    uids = re.search(r"^Uid:\s+(.*)$", status, re.M)[1].split()
    assert uids == ["65532"] * 4, uids
    denied = docker("exec", name, "touch", "/usr/local/bin/x", check=False)
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr
    writable = docker("exec", name, "touch", "/var/run/atenet/probe", check=False)
    assert writable.returncode == 0, "the marker's volume is writable by 65532"
    docker("exec", name, "rm", "/var/run/atenet/probe")


def test_healthz_and_metrics_from_the_host(router):
    assert get(f"http://127.0.0.1:{METRICS_PORT}/healthz")[0] == 200
    status, text = get(f"http://127.0.0.1:{METRICS_PORT}/metrics")
    assert status == 200
    version, revision = version_and_revision()
    assert f'atenet_router_build_info{{revision="{revision}",version="{version}"}} 1' in text.splitlines(), \
        text[:2000]


def test_ext_proc_routes_against_the_simulator_on_the_bridge(router, sim):
    channel = grpc.insecure_channel(f"127.0.0.1:{EXTPROC_PORT}")
    try:
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        for actor in ("demo/actor-1", "demo/actor-2"):
            check_route(route(stub, actor), actor, f"{WORKER_IP}:8000")
    finally:
        channel.close()
    # The simulator's own record: it resumed exactly those actors, once each.
    answers = [json.loads(line) for line in docker("exec", sim, "cat", "/log/answers.jsonl").stdout.splitlines()]
    resumed = sorted(a["actor"] for a in answers if a["code"] == "OK")
    assert resumed == ["demo/actor-1", "demo/actor-2"], answers


def ateapi_credentials(into):
    """A CA and a client bundle (chain and key) made by openssl."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=into, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ca")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=client")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "client.crt", "-days", "2")
    (into / "client.pem").write_text((into / "client.crt").read_text() + (into / "client.key").read_text())
    for leftover in ("ca.key", "ca.srl", "client.key", "client.csr", "client.crt"):
        (into / leftover).unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="the files' owner is set as docs/deploy.md's sudo does")
def test_credentials_as_the_docs_mount_them_and_a_root_only_one_names_the_uid(images, tmp_path):
    """docs/deploy.md, "Container": /etc/atenet holds ca.pem and client.pem, readable
    by the image's UID 65532. Root-only 0600 files (as the systemd section
    installs them) are refused with the file and the UID named."""
    image, _ = images
    etc = tmp_path / "atenet"
    etc.mkdir(mode=0o755)
    etc.chmod(0o755)
    ateapi_credentials(etc)
    name = f"{NAME}-credentials"

    def run(detach):
        return docker("run", *(["-d", "--name", name] if detach else ["--rm"]), "--read-only",
                      "--tmpfs", "/var/run/atenet:uid=65532,gid=65532", "-v", f"{etc}:/etc/atenet:ro", image,
                      "serve", "--ateapi-address", "api.example:443", "--ateapi-ca-file", "/etc/atenet/ca.pem",
                      "--ateapi-client-cert", "/etc/atenet/client.pem", "--extproc-address", "0.0.0.0",
                      # Plaintext off the loopback is refused first without it (B86).
                      "--extproc-insecure", check=False, timeout=60)

    for file in ("ca.pem", "client.pem"):
        (etc / file).chmod(0o600)
    refused = run(detach=False)
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert ("--ateapi-ca-file /etc/atenet/ca.pem: permission denied (the router runs as uid 65532, gid 65532)"
            in refused.stderr), refused.stderr
    # docs/deploy.md's modes: the CA world-readable, the bundle (its key) the
    # router's user's alone.
    (etc / "ca.pem").chmod(0o644)
    os.chown(etc / "client.pem", 65532, 65532)
    (etc / "client.pem").chmod(0o400)
    try:
        started = run(detach=True)
        assert started.returncode == 0, started.stderr
        poll("the router's serving line", lambda: " serving: " in docker("logs", name).stderr)
        assert docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true", \
            docker("logs", name).stderr
    finally:
        docker("rm", "-f", name, check=False)


def test_docker_stop_drains_and_exits_0_within_the_stop_timeout(images, router):
    """Last in the module: it stops the router."""
    image, _ = images
    name, volume = router
    assert docker("inspect", "-f", "{{.Config.StopTimeout}}", name).stdout.strip() == "60"
    docker("stop", name, timeout=120)  # SIGTERM (the image's STOPSIGNAL), SIGKILL after 60 s
    state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
    assert state["ExitCode"] == 0 and not state["OOMKilled"], state
    assert "drain" in docker("logs", name).stderr
    # The drain's own marker, written at its end, read from the volume by
    # another container.
    marker = docker("run", "--rm", "--mount", f"type=volume,src={volume},dst=/m", "--entrypoint", "cat", image,
                    "/m/drain-complete").stdout
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)\n", marker), repr(marker)
