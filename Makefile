# The two commands: `make run` and `make test`. Both set everything up first (idempotent, see scripts/setup.sh).
# `make test` runs the static checks first (ruff, mypy: configured in pyproject.toml), then the whole suite.
# `make test-fast`: the same checks and every test that starts no llama-server (`-m "not llama"`), on the venv as it
# is: no set-up step, nothing built (docs/contributing.md says when to use which).
VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test test-fast lint static bench clean install-systemd

setup:
	@bash scripts/setup.sh

run: setup
	$(VENV)/bin/pflash-proxy serve --spawn $(ARGS)

test: setup lint
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: setup
	@$(MAKE) --no-print-directory static

test-fast: static
	$(VENV)/bin/python -m pytest -m "not llama" $(PYTEST_ARGS)

# The static checks on the venv as it is (`lint` sets it up first)
static:
	@test -x $(VENV)/bin/python || { echo "no $(VENV): run 'make setup' once (or 'make test')"; exit 1; }
	$(VENV)/bin/ruff check pflash_proxy evals tests benchmarks scripts
	$(VENV)/bin/mypy

# The proxy's added latency against llama-server direct (tests/perf/proxy_overhead.py; docs/results.md has the rest)
bench: setup
	$(VENV)/bin/python -m tests.perf.proxy_overhead $(ARGS)

# As root: a venv in /opt/pflash-proxy (PREFIX=...), the systemd units, /etc/pflash-proxy/env. Not part of `test`.
install-systemd:
	@bash scripts/install-systemd.sh

clean:
	rm -rf $(VENV) *.egg-info
