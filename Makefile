# Two entry points for a new user: `make demo` (set up, replay the bundled sample, write the HTML
# report, explain the most interesting request) and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_DB := demo.duckdb
# A deliberately small device pool (96k tokens) and a 4x host pool, so returning sessions find
# their prefix demoted to host: tiered hits with real load-backs, beside device hits and misses.
DEMO_OPTS := --device-tokens 98304 --host-tokens 393216 --run-name demo

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pinned: installs the CPU build from this machine's disk in seconds (pyproject says torch>=2.4).
	$(BIN)/pip install -q torch==2.13.0
	# The ray extra too: CI runs one sweep on a local Ray (tests/sweep/test_sweep_ray.py).
	$(BIN)/pip install -q -e '.[dev,ray]'
	# The Triton kernel's tests run under Triton's interpreter on CPU (pytest -m triton); 3.9.0
	# installs beside torch 2.13.0+cpu (CUDA wheels of torch bring their own triton).
	$(BIN)/pip install -q triton==3.9.0
	touch $@

demo: setup
	rm -f $(DEMO_DB) $(DEMO_DB).wal
	$(BIN)/tierdiag replay tierdiag/trace/samples/demo.jsonl --db $(DEMO_DB) $(DEMO_OPTS)
	$(BIN)/tierdiag report --db $(DEMO_DB) -o reports/demo.html
	@# The most interesting request: the one that lost the most to load-back (else the slowest at all).
	id=$$($(BIN)/tierdiag slow --db $(DEMO_DB) --cause load_back --top 1 --ids); \
	[ -n "$$id" ] || id=$$($(BIN)/tierdiag slow --db $(DEMO_DB) --top 1 --ids); \
	$(BIN)/tierdiag explain "$$id" --db $(DEMO_DB)
	@echo "report: reports/demo.html   (open it in a browser)"

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(DEMO_DB) $(DEMO_DB).wal $(DEMO_DB:.duckdb=.storage) reports/*.html
