# mwlab: make run (start servers + mwproxy), make test (every test), make bench, make lint.
# Every target installs what it needs first and can be run again safely.

SHELL := /bin/bash
CARGO ?= cargo
DEB_PACKAGES := memcached nutcracker libmemcached-tools
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps rust-deps build test run bench lint fmt clean

all: build

## System packages (Debian): memcached for tests and runs, nutcracker (twemproxy)
## for the ketama cross-check and the benchmark, libmemcached-tools for memcslap.
deps:
	@missing=""; \
	for b in memcached:memcached nutcracker:nutcracker memcslap:libmemcached-tools; do \
	  cmd=$${b%%:*}; pkg=$${b##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || [ -x /usr/sbin/$$cmd ] || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@command -v $(CARGO) >/dev/null 2>&1 || { echo "cargo (Rust) is required: https://rustup.rs"; exit 1; }

## Rust crates from crates.io (cached after the first run).
rust-deps:
	$(CARGO) fetch --locked 2>/dev/null || $(CARGO) fetch

build: deps rust-deps
	$(CARGO) build --release --workspace --bins

test: deps rust-deps
	$(CARGO) test --workspace --no-fail-fast

run: build
	scripts/run-local.sh

bench: build
	bench/proxy.sh

lint: rust-deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
