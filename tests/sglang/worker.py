"""A worker process that runs request sequences through one SGLang version's own cache code.

    python worker.py <version> <unzipped wheel folder>

reads one JSON scenario a line on stdin and answers one JSON line on stdout: the state after
every step (tests/sglang/differential.py builds the scenarios and compares the answers with the
engine's), or, for a workload (a scenario with "requests"), 0.5.23's whole Scheduler's steps and
requests on the virtual clock (sglang0523_scheduler.py, tests/sglang/scheduler_harness.py). One process per version: each version's `sglang` package gets a namespace of its
own, and the stubs it needs never reach pytest's process.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sglang_imports  # noqa: E402  (this folder, not a package)


def main() -> int:
    version, root = sys.argv[1], sys.argv[2]
    # The answers go to the pipe on fd 1 through a duplicate of it; fd 1 itself is pointed at
    # stderr before SGLang is imported, so nothing SGLang writes (a print, a logging handler
    # bound to the process's stdout, a tree dump before its "Prefill out of memory") can land
    # in the middle of an answer (it did: `Extra data` where the reader expected one JSON line)
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # The wheel's modules compiled once, their .pyc written beside them in the unzipped folder (a
    # test cache of ours), even where PYTHONDONTWRITEBYTECODE is set (this machine's environment, so
    # CI's): otherwise each worker compiled the ~950 SGLang modules it imports from source again
    # (~1/3 of a worker's start-up CPU). A .pyc whose source changed is compiled afresh as before;
    # importlib writes it under a temporary name and renames it, so two workers never clash.
    sys.dont_write_bytecode = False
    # SGLang builds its native hash extension (`hicache_hash_cpp`: the storage keys) with g++
    # through torch.utils.cpp_extension on first use, into one folder per user by default
    # (~/.cache/torch_extensions), rebuilt whenever the build's command line differs from the
    # last one there (~12 s of CPU, 30-60 s of wall on a busy machine): every venv or wheel copy
    # that used it in turn rebuilt it for the next (TMPDIR moved the command line too: seen, not
    # explained). A folder per (interpreter, wheel folder, TMPDIR), beside the unzipped wheel,
    # keeps each build for its own runs (a user's TORCH_EXTENSIONS_DIR stands).
    where = f"{sys.prefix}\0{os.path.realpath(root)}\0{os.environ.get('TMPDIR', '')}"
    key = hashlib.sha256(where.encode()).hexdigest()[:16]
    os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                          os.path.join(os.path.dirname(os.path.realpath(root)), "torch-extensions", key))
    # One intra-op thread for torch (imported by install below): SGLang's scheduler loop runs
    # thousands of small CPU tensor ops a workload (searchsorted, cat, clone in the allocators),
    # and with the default pool (one thread a core) OpenMP's idle threads spin between them:
    # ~18 % of the worker's CPU over the Scheduler harness's 121 workloads, the answers the same
    # (integer bookkeeping, none of it depends on the thread count). A user's setting stands.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sglang_imports.install(root)
    import logging

    logging.disable(logging.WARNING)
    if version.startswith("0.5.9"):
        from sglang059 import run_scenario
    else:
        from sglang0523 import run_scenario
    real_stdout.write(json.dumps({"ready": version}) + "\n")
    real_stdout.flush()
    for line in sys.stdin:
        scenario = json.loads(line)
        try:
            if "max_running_cases" in scenario:  # SGLang's max_running_requests formula alone
                from sglang0523_scheduler import max_running_cases

                answer = {"max_running": max_running_cases(scenario["max_running_cases"])}
            elif "requests" in scenario:  # a workload for the whole Scheduler (sglang0523_scheduler.py)
                from sglang0523_scheduler import run_workload

                answer = run_workload(scenario)
            else:
                answer = {"steps": run_scenario(scenario)}
        except Exception as exc:  # a failure inside SGLang is a finding, reported with its step
            answer = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=6),
                      "steps": getattr(exc, "steps", [])}
        real_stdout.write(json.dumps(answer) + "\n")
        real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
