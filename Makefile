# Two entry points for a new user: `make demo` (set up, replay the bundled sample, write the HTML
# report, explain the most interesting request) and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_DB := demo.duckdb
# A deliberately small device pool (96k tokens) and a 4x host pool, so returning sessions find
# their prefix demoted to host: tiered hits with real load-backs, beside device hits and misses.
DEMO_OPTS := --device-tokens 98304 --host-tokens 393216 --run-name demo

.PHONY: setup demo test test-fast bench clean

# summary --json -> the cause with the largest share of excess TTFT (the diagnosis's, when present).
define DOMINANT_CAUSE
import json, sys
s = json.load(sys.stdin)
d = (s.get("diagnosis") or {}).get("dominant_cause")
c = [x for x in s["time_by_cause"] if x["cause"] != "none" and x["excess_share"]]
print(d or (max(c, key=lambda x: x["excess_share"])["cause"] if c else ""))
endef
export DOMINANT_CAUSE

setup: $(VENV)/.installed

# setup.py and the C source too: `pip install -e` compiles tierdiag/native/csrc/*.c in place
# (the CPU data plane), tierdiag/native/stackdist/ (diagnose's size curves) and
# tierdiag/native/sessions/ (diagnose's session pauses), so a changed source reinstalls rather
# than leave a stale build.
$(VENV)/.installed: pyproject.toml setup.py $(wildcard tierdiag/native/csrc/*.c tierdiag/native/csrc/*.h) \
		$(wildcard tierdiag/native/stackdist/*.c tierdiag/native/sessions/*.c) tierdiag/engine/compiled.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pinned: installs the CPU build from this machine's disk in seconds (pyproject says torch>=2.4).
	$(BIN)/pip install -q torch==2.13.0
	# The ray extra too: CI runs one sweep on a local Ray (tests/sweep/test_sweep_ray.py). The build
	# compiles the engine core with mypyc (pyproject's build-system pins mypy; setup.py), about
	# 1.5 min of the install on a 2-core machine; without a C compiler the Python engine runs.
	$(BIN)/pip install -q -e '.[dev,ray]'
	# The Triton kernel's tests run under Triton's interpreter on CPU (pytest -m triton); 3.9.0
	# installs beside torch 2.13.0+cpu (CUDA wheels of torch bring their own triton).
	$(BIN)/pip install -q triton==3.9.0
	# The read commands' dataclass methods compiled once, as compileall does .pyc files
	# (tierdiag/dataclass_code.py: ~15-20 % of `explain`/`summary`'s start-up; the replay's and its writer process's too).
	$(BIN)/python -m tierdiag.cli.dataclass_code
	touch $(VENV)/.engine-core $@

# The engine core again after an edit of the engine's source: a compiled module whose source
# changed is stale, and the Python twin would run in its place (engine/compiled.py; doctor says so).
$(VENV)/.engine-core: $(wildcard tierdiag/engine/*.py) | $(VENV)/.installed
	$(BIN)/python setup.py build_ext --inplace -q
	touch $@

demo: setup $(VENV)/.engine-core
	rm -f $(DEMO_DB) $(DEMO_DB).wal
	$(BIN)/tierdiag replay tierdiag/trace/samples/demo.jsonl --db $(DEMO_DB) $(DEMO_OPTS)
	$(BIN)/tierdiag report --db $(DEMO_DB) -o reports/demo.html
	@# Explain the request that best shows the run's dominant cause (the largest share of excess
	@# TTFT in `summary --json`): the slowest request with that primary cause, else the slowest.
	@cause=$$($(BIN)/tierdiag summary --db $(DEMO_DB) --json | $(BIN)/python -c "$$DOMINANT_CAUSE"); \
	id=$$([ -z "$$cause" ] || $(BIN)/tierdiag slow --db $(DEMO_DB) --cause "$$cause" --top 1 --ids); \
	[ -n "$$id" ] || id=$$($(BIN)/tierdiag slow --db $(DEMO_DB) --top 1 --ids); \
	echo "dominant cause of excess TTFT: $${cause:-none}; explaining request $$id"; \
	$(BIN)/tierdiag explain "$$id" --db $(DEMO_DB)
	@echo "report: reports/demo.html   (open it in a browser)"

# The whole suite, slow tier included (CI runs this), on TEST_JOBS worker processes
# (pytest-xdist; each test file stays on one worker, so a file's shared replays run once);
# TEST_JOBS=0 runs it in this process. `make test-fast`: the same without the slow tier
# (the `slow` marker, pyproject.toml), for a quick check while developing.
# PYTEST_ARGS: more pytest options (CI's .ci/run: `--durations=40`, the slowest tests' walls in
# every CI log, the map each session's test-time work starts from).
TEST_JOBS ?= 2
PYTEST_XDIST := -n $(TEST_JOBS) --dist loadfile
PYTEST_ARGS ?=

test: setup $(VENV)/.engine-core
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)

test-fast: setup $(VENV)/.engine-core
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) -m "not slow"

bench: setup $(VENV)/.engine-core
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(DEMO_DB) $(DEMO_DB).wal $(DEMO_DB:.duckdb=.storage) reports/*.html build tierdiag/native/_cplane*.so
