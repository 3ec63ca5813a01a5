# mwlab: make run (the quick-start experiment), make test (every test), make bench, make lint.
# Every target installs what it needs first and can be run again safely.

SHELL := /bin/bash
CARGO ?= cargo
DEB_PACKAGES := memcached nutcracker libmemcached-tools iproute2 ethtool postgresql redis-tools redis-server
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

VENV := .venv
PYTHON ?= python3

.PHONY: all deps ha-deps test-deps rust-deps python-deps build test test-slow test-clock run run-proxy run-mq run-mq-ha bench lint fmt clean
.PHONY: dist-deps dist-test-deps release deb install uninstall

# Where make install puts things (the configurations go to $(PREFIX)/etc, or
# /etc when PREFIX is /usr: SYSCONFDIR=... says otherwise).
PREFIX ?= /usr/local
DESTDIR ?=
export PREFIX DESTDIR SYSCONFDIR UNITDIR

all: build

## System packages (Debian): memcached for tests and runs, nutcracker (twemproxy)
## for the ketama cross-check and the benchmark, libmemcached-tools for memcslap,
## iproute2 (ip, tc) and ethtool for emulated hosts (network namespaces),
## postgresql for mwmq (tests start throwaway servers: scripts/postgres.sh),
## redis-tools (redis-cli, redis-benchmark) to talk to mwmq, redis-server (7.0)
## as the reference the stream commands are compared with and benchmarked against
## (and Celery on Redis, against Celery on mwmq: bench/celery.sh),
## libmemcached-dev to build pylibmc (a client the tests run through mwproxy).
deps:
	@missing=""; \
	for b in memcached:memcached nutcracker:nutcracker memcslap:libmemcached-tools ip:iproute2 tc:iproute2 ethtool:ethtool ping:iputils-ping pg_ctlcluster:postgresql redis-cli:redis-tools redis-server:redis-server; do \
	  cmd=$${b%%:*}; pkg=$${b##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || [ -x /usr/sbin/$$cmd ] || missing="$$missing $$pkg"; \
	done; \
	[ -f /usr/include/libmemcached/memcached.h ] || missing="$$missing libmemcached-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@command -v $(CARGO) >/dev/null 2>&1 || { echo "cargo (Rust) is required: https://rustup.rs"; exit 1; }

## pg_auto_failover (a monitor and data nodes: scripts/pg-ha.sh), for the
## highly available database the failover tests and make run-mq-ha start:
## its command (pg-auto-failover-cli) and the extension built for the
## installed PostgreSQL (postgresql-NN-auto-failover).
ha-deps: deps
	@ver=$$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -1); \
	if ! command -v pg_autoctl >/dev/null 2>&1 || [ ! -f /usr/share/postgresql/$$ver/extension/pgautofailover.control ]; then \
	  echo "installing: pg-auto-failover-cli postgresql-$$ver-auto-failover"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    pg-auto-failover-cli postgresql-$$ver-auto-failover; \
	fi

## Headless Chromium, for the test that renders the HTML report.
test-deps: deps ha-deps
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing: chromium"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium; }
	@# Go (1.26+) builds the go-redis stream worker of lab/tests/goredis; its module comes from the Go proxy.
	@command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || { \
	  echo "Go 1.26 or newer is required for the go-redis client test (https://go.dev/dl/)"; exit 1; }

## Rust crates from crates.io (cached after the first run).
rust-deps:
	$(CARGO) fetch --locked 2>/dev/null || $(CARGO) fetch

## Python packages for the lab (mwlab) and its tests, in .venv.
python-deps: $(VENV)/.installed

# The startup hook of clients/python is copied into site-packages (editable
# installs too), so a change to it is a reason to install again.
$(VENV)/.installed: lab/pyproject.toml clients/python/pyproject.toml clients/python/src/_mwmq_kombu.py clients/python/src/mwmq-kombu.pth
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q python3-venv && \
	  $(PYTHON) -m venv $(VENV); }
	$(VENV)/bin/pip install -q -e 'lab[test]'
	@# The Python client and worker of mwmq (clients/python), with Celery's transport
	@# and taskiq's broker (extras celery, taskiq), tested by make test.
	$(VENV)/bin/pip install -q -e './clients/python[celery,taskiq,test]'
	@# pylibmc's own test suite (in its source distribution, not its wheel), run through mwproxy by lab/tests.
	@ver=$$($(VENV)/bin/python -c 'import pylibmc; print(pylibmc.__version__)') && \
	rm -rf $(VENV)/pylibmc-src && mkdir -p $(VENV)/pylibmc-src && \
	$(VENV)/bin/pip download -q --no-deps --no-binary :all: "pylibmc==$$ver" -d $(VENV)/pylibmc-src && \
	tar xzf $(VENV)/pylibmc-src/pylibmc-$$ver.tar.gz -C $(VENV)/pylibmc-src && \
	ln -sfn pylibmc-$$ver $(VENV)/pylibmc-src/current
	@touch $@

build: deps rust-deps
	$(CARGO) build --release --workspace --bins

## Every test of every component with each service's default engine
## (async, for both mwproxy and mwmq). scripts/testrun.py runs them and ends with
## where the time went (installs, build, each suite), the ten slowest tests
## and every failure with its log (target/test-logs/). Two Rust test
## binaries run side by side (no test holds a timing to a fixed margin,
## docs/testing.md), which keeps the whole under 15 minutes on 2 cores.
test: test-clock deps test-deps dist-test-deps rust-deps python-deps
	scripts/testrun.py --jobs 2 $(TEST_ARGS)

## What CI runs (.ci/run): make test's suites, and every mwproxy and mwmq
## suite again with the service's other engine (pool), one binary at a
## time (CI has the time).
test-slow: test-clock deps test-deps dist-test-deps rust-deps python-deps
	scripts/testrun.py --engines both $(TEST_ARGS)

# The start of a test run, so that the installs before it are timed too.
test-clock:
	@mkdir -p target/test-logs && date +%s.%N > target/test-logs/start

## What make deb and make install need: dpkg-deb (dpkg), strip and objdump
## (binutils), gzip.
dist-deps:
	@missing=""; \
	for b in dpkg-deb:dpkg strip:binutils objdump:binutils gzip:gzip; do \
	  command -v $${b%%:*} >/dev/null 2>&1 || missing="$$missing $${b##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

## And what the package tests (lab/tests/test_packages.py) check them with:
## systemd-analyze (systemd) verifies the units, man (man-db) renders the pages.
dist-test-deps: dist-deps
	@missing=""; \
	for b in systemd-analyze:systemd man:man-db; do \
	  command -v $${b%%:*} >/dev/null 2>&1 || missing="$$missing $${b##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

## The release binaries alone (make build also installs what runs and tests need).
release: rust-deps
	@command -v $(CARGO) >/dev/null 2>&1 || { echo "cargo (Rust) is required: https://rustup.rs"; exit 1; }
	$(CARGO) build --release --workspace --bins

## Debian packages of mwproxy, mwmq and mwload in target/debian/: the binary,
## man pages, shell completions, and for the services a commented
## configuration in /etc/NAME/ and a systemd unit (docs/install.md).
deb: dist-deps release
	scripts/dist.sh deb

## The same files under $(DESTDIR)$(PREFIX), for systems without dpkg. The
## release binaries are brought up to date first where cargo is on the PATH
## (under sudo it may not be: then what make build left is installed).
install: dist-deps $(if $(shell command -v $(CARGO) 2>/dev/null),release)
	scripts/dist.sh install

## Removes what make install put there (an edited configuration stays).
uninstall:
	scripts/dist.sh uninstall

## The quick-start experiment: servers, a middleware and clients, then the report.
run: build python-deps
	$(VENV)/bin/mwlab run quickstart

## Three memcached servers and mwproxy in front of them with its admin
## endpoint (/metrics), until Ctrl-C; prints every port it started. Ports:
## PROXY_PORT (11311), MC_PORTS ("21211 21212 21213"), ADMIN_PORT (9100), as
## in make run-proxy PROXY_PORT=11400. A port set is used or refused; a
## default that is taken is replaced by a free port (said). So for the others.
run-proxy: build
	scripts/run-local.sh

## A throwaway PostgreSQL (unix socket only) and mwmq in front of it with its
## admin endpoint (/metrics, /ui), until Ctrl-C. Ports: MQ_PORT (6380),
## ADMIN_PORT (9380).
run-mq: build
	scripts/run-mq.sh

## A highly available PostgreSQL (pg_auto_failover: monitor, primary,
## synchronous standby) and mwmq in front of it, until Ctrl-C. Ports: MQ_PORT
## (6380), ADMIN_PORT (9380), PG_PORTS (the monitor's and the nodes', "M P1 P2";
## free ones unless set).
run-mq-ha: build ha-deps
	scripts/run-mq-ha.sh

bench: build python-deps
	@command -v valgrind >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends valgrind; }
	@# memtier_benchmark, the neutral client, where a build of it sits beside the checkout (../shared/tools)
	@if ! command -v memtier_benchmark >/dev/null 2>&1 && [ -x ../shared/tools/memtier_benchmark ]; then \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    libevent-2.1-7 libevent-openssl-2.1-7 && $(SUDO) install -m 755 ../shared/tools/memtier_benchmark /usr/local/bin/; fi
	bench/proxy.sh
	bench/peers.sh
	bench/load.sh
	bench/fairness.sh
	bench/instrumentation.sh
	bench/tls.sh
	bench/mq.sh
	bench/mq-quota.sh
	bench/mq-peers.sh
	bench/mq-streams.sh
	bench/celery.sh
	$(VENV)/bin/python bench/lab.py

lint: rust-deps python-deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check lab clients/python examples/python
	$(VENV)/bin/ruff format --check lab clients/python examples/python

fmt: python-deps
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format lab clients/python examples/python

clean:
	$(CARGO) clean
