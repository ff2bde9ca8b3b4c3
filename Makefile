# The two commands: `make run` and `make test`. Both set everything up first (idempotent, see scripts/setup.sh).
VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test bench clean

setup:
	@bash scripts/setup.sh

run: setup
	$(VENV)/bin/pflash-proxy serve --spawn $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python benchmarks/bench_proxy.py

clean:
	rm -rf $(VENV) *.egg-info
