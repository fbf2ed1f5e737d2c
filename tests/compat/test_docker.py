"""The container image's build context cannot drift from the crate.

There is no Docker engine on these machines, so the Dockerfile is checked
the way a build would fail: its build context is rebuilt exactly (the files
its COPY lines name, minus .dockerignore) in a temporary directory, and its
own cargo command runs there, with the shared target directory so that only
the crate itself compiles. `cargo metadata` would not catch a missing target
file (a declared bench, say); `cargo build` does.
"""

import fnmatch
import os
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest

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
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    path = relative.as_posix()
    return any(fnmatch.fnmatch(path, p.lstrip("/")) or path.startswith(p.lstrip("/").rstrip("/") + "/")
               for p in patterns)


def build_context(into):
    """Copies what the COPY lines (not --from) name into `into`."""
    copied = []
    for word, args, _ in instructions():
        if word != "COPY" or args.startswith("--from"):
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


def test_stages_images_and_pins():
    froms = [args for word, args, _ in instructions() if word == "FROM"]
    for image in froms:
        name = image.split()[0]
        assert re.search(r":\d+(\.\d+)+", name), f"base image pinned to an explicit release: {name}"
    stages = [stage for word, _, stage in instructions() if word == "FROM"]
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
