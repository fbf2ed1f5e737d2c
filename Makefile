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

# Local demo addresses (make run).
SIM_LISTEN ?= 127.0.0.1:50061
EXTPROC_PORT ?= 50051
METRICS_ADDR ?= 127.0.0.1:9090
STATUS_PORT ?= 4040
RUN_FLAGS ?=
# A pool small enough that a little load parks requests: 64 actors share 16
# workers, and an actor idle for 2 s gives its worker back.
SIM_FLAGS ?= --workers 16 --idle-suspend 2s

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
PREFIX ?= /usr/local
DESTDIR ?=
# Flags for `make envoy-config`: the router flags the Envoy config must match.
ENVOY_FLAGS ?= --ateapi-insecure --ateapi-address $(SIM_LISTEN) --port-extproc $(EXTPROC_PORT)

.PHONY: help deps venv build run test test-rust test-compat bench soak lint fmt install envoy-config \
	k8s-envoy-config docker package clean

help: ## List the targets.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## Install missing tools (cmake, g++, libssl-dev, python3-venv; chromium, promtool for tests).
	@missing=""; \
	command -v cmake >/dev/null || missing="$$missing cmake"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	command -v pkg-config >/dev/null || missing="$$missing pkg-config"; \
	[ -f /usr/include/openssl/ssl.h ] || missing="$$missing libssl-dev"; \
	python3 -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; \
	fi

venv: deps ## Python venv with Envoy's official protos for compatibility tests.
	@if ! cmp -s tests/compat/requirements.txt $(VENV)/requirements.txt; then \
		python3 -m venv $(VENV) && \
		$(VENV)/bin/pip install -q --disable-pip-version-check -r tests/compat/requirements.txt && \
		cp tests/compat/requirements.txt $(VENV)/requirements.txt; \
	fi

build: deps ## Build the router and the simulator (release).
	@cargo build --release --bins

run: build ## Run ateapi-sim and the router on loopback (Ctrl-C stops both).
	@echo "ateapi-sim on $(SIM_LISTEN); router ext_proc on 127.0.0.1:$(EXTPROC_PORT)"
	@echo "metrics: http://$(METRICS_ADDR)/metrics  health: http://$(METRICS_ADDR)/healthz"
	@$(BIN)/ateapi-sim --listen $(SIM_LISTEN) $(SIM_FLAGS) & sim=$$!; \
	trap 'kill $$sim 2>/dev/null; wait $$sim 2>/dev/null' EXIT INT TERM; \
	$(BIN)/atenet-router serve --ateapi-insecure --ateapi-address $(SIM_LISTEN) \
		--extproc-address 127.0.0.1 --port-extproc $(EXTPROC_PORT) \
		--metrics-listen-addr $(METRICS_ADDR) --status-port $(STATUS_PORT) \
		--drain-delay 0s --envoy-admin-address "" --drain-complete-file "" $(RUN_FLAGS)

test: test-rust test-compat ## Run every test: unit, end-to-end, Envoy compatibility.

test-rust: deps
	cargo test --release

test-compat: build venv
	ATENET_BIN_DIR=$(BIN) $(VENV)/bin/python -m pytest -q tests/compat

bench: deps ## Benchmarks: router vs a baseline, five scenarios (about 4 minutes); see BENCHMARKS.md.
	cargo bench --profile release --bench parking $(if $(ONLY),-- --only $(ONLY))

SOAK_SECONDS ?= 600

soak: deps ## Chaos run: faults, cancels, SIGTERM restarts; SOAK_SECONDS (600) long.
	SOAK_SECONDS=$(SOAK_SECONDS) cargo test --release --test soak -- --nocapture

lint: ## rustfmt and clippy, warnings as errors.
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings

fmt: ## Format the code.
	cargo fmt

install: build ## Install the binary, the systemd unit and its env file (PREFIX, DESTDIR).
	install -D -m 0755 $(BIN)/atenet-router $(DESTDIR)$(PREFIX)/bin/atenet-router
	install -D -m 0644 packaging/systemd/atenet-router.service $(DESTDIR)/etc/systemd/system/atenet-router.service
	sed -i 's|/usr/local/bin/atenet-router|$(PREFIX)/bin/atenet-router|' $(DESTDIR)/etc/systemd/system/atenet-router.service
	@if [ -e $(DESTDIR)/etc/atenet-router/atenet-router.env ]; then \
		echo "keeping existing /etc/atenet-router/atenet-router.env"; \
	else \
		install -D -m 0644 packaging/systemd/atenet-router.env $(DESTDIR)/etc/atenet-router/atenet-router.env; \
	fi
	@echo "installed; then: systemctl daemon-reload && systemctl enable --now atenet-router"

envoy-config: build ## Print the Envoy bootstrap for ENVOY_FLAGS (default: the make run router).
	@$(BIN)/atenet-router envoy-config $(ENVOY_FLAGS)

k8s-envoy-config: build ## Regenerate packaging/kubernetes/envoy-bootstrap.yaml from the Deployment's flags.
	$(BIN)/atenet-router envoy-config $$(sed -n 's/^ *- \(--[a-z-]*=.*\)$$/\1/p' packaging/kubernetes/deployment.yaml) \
		> packaging/kubernetes/envoy-bootstrap.yaml

docker: ## Build the container image atenet-router:VERSION (needs a Docker engine).
	@docker info >/dev/null 2>&1 || { echo "make docker: no Docker engine reachable (docker info failed)"; exit 1; }
	docker build -f packaging/docker/Dockerfile -t atenet-router:$(VERSION) -t atenet-router:latest .

package: build ## Tarball of the binaries and packaging files in dist/.
	rm -rf dist/atenet-router-$(VERSION) && mkdir -p dist/atenet-router-$(VERSION)/bin
	cp $(BIN)/atenet-router $(BIN)/ateapi-sim $(BIN)/parkload dist/atenet-router-$(VERSION)/bin/
	cp -r packaging README.md dist/atenet-router-$(VERSION)/
	tar -C dist -czf dist/atenet-router-$(VERSION)-linux-$$(uname -m).tar.gz atenet-router-$(VERSION)
	@echo dist/atenet-router-$(VERSION)-linux-$$(uname -m).tar.gz

clean: ## Remove build outputs.
	cargo clean
	rm -rf dist
