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

.PHONY: help deps venv build run test test-rust test-compat lint fmt clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## Install missing build tools (cmake, g++, libssl-dev, python3-venv).
	@missing=""; \
	command -v cmake >/dev/null || missing="$$missing cmake"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	command -v pkg-config >/dev/null || missing="$$missing pkg-config"; \
	[ -f /usr/include/openssl/ssl.h ] || missing="$$missing libssl-dev"; \
	python3 -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; \
	fi

venv: $(VENV)/.installed ## Python venv with Envoy's official protos for compatibility tests.

$(VENV)/.installed: tests/compat/requirements.txt | deps
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r tests/compat/requirements.txt
	touch $@

build: deps ## Build the router and the simulator (release).
	cargo build --release --bins

run: build ## Run ateapi-sim and the router on loopback (Ctrl-C stops both).
	@echo "ateapi-sim on $(SIM_LISTEN); router ext_proc on 127.0.0.1:$(EXTPROC_PORT)"
	@echo "metrics: http://$(METRICS_ADDR)/metrics  health: http://$(METRICS_ADDR)/healthz"
	@$(BIN)/ateapi-sim --listen $(SIM_LISTEN) & sim=$$!; \
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

lint: ## rustfmt and clippy, warnings as errors.
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings

fmt: ## Format the code.
	cargo fmt

clean: ## Remove build outputs.
	cargo clean
