"""Drive the scheduler harness (issue 43) with any workload trace:

    python -m tests.sglang.drive TRACE [--requests N] [--time-scale S | --speedup X] [--page-size P]
        [--block-size B] [--device-tokens T] [--host-tokens T] [--storage-tokens T] [--write-policy W]
        [--schedule-policy S] [--eviction-policy E] [--prefetch-policy P] [--enable-mixed-chunk]
        [--max-prefill-tokens T] [--max-running-requests N] [--arrivals trace|closed] [--model M] [--gpu G] [--core rust|python]
        [--switch NAME ...] [--json OUT] [--skip-bad]

TRACE is anything `tierdiag replay` reads (Mooncake JSONL, tierdiag JSONL with ids, tokens, sessions
and think times, `.gz`): it is read by tierdiag's own trace reader (`tierdiag.trace.reader.read_trace`,
the same errors), its first N requests (default 200) replayed through SGLang 0.5.23's own Scheduler on
the virtual clock (sglang0523_scheduler.py, in a worker process; the wheel fetched as the tests fetch
it, tests/support/sglang_wheels.py) and through the engine, then compared step by step and request by
request (scheduler_harness.compare). The options are `tierdiag replay`'s, with its config keys and
checks (`load_config`); `--speedup X` is `--time-scale 1/X`, `--chunked-prefill-size` SGLang's name
for `--max-prefill-tokens`, `--mixed-chunk` for `--enable-mixed-chunk`. Defaults are replay's, except
the device pool: 131,072 tokens (the CI harness's conversation pool) unless given, and a host pool of
4x it.

Printed: the prefill steps and requests that agree, the first diverging step with both sides'
members and memory state, the first diverging request, SGLang's TTFT over the engine's (p50 / p90 /
max). `--json OUT` writes the same with every step's and request's agreement.

Exit codes: 0 both sides agree on every prefill step and request; 1 they differ; 5 SGLang's own
Scheduler raised on the workload (its error's first line printed, e.g. "Prefill out of memory" from
`alloc_paged_token_slots_extend`: a real server's scheduler dies there; the engine does not model
SGLang failing, so there is nothing to compare); 2 a bad option value (one line naming the
option, as `tierdiag replay` says it), or a workload this harness cannot run on a CPU (one line);
3 a bad trace (one line, `file:line: field ...`, the reader's error); 4 SGLang's wheel could not be
fetched; 6 `--json OUT` not writable (checked before the run).

Where the harness differs from `tierdiag replay` on purpose: the engine runs with the per-run DMA term
at 0 and `verify off` (scheduler_harness.run_engine); the context limit is the longest request + 64
(nothing is rejected), and so the derived `--max-running-requests` is derived from that context
(SGLang's `resolve_max_num_reqs`, the engine's `resolved_max_running_requests`: both sides get the
same cap, and a cap above the number of requests replayed is given as that number, which changes
nothing and keeps SGLang's ReqToTokenPool small); SGLang runs without a tokenizer. Token ids (a `tokens` trace) and hash ids past what
the harness's token layout holds are renumbered by first appearance (equal stays equal, prefixes stay
prefixes); an `extra_key` is folded into that renumbering, so requests under different keys share
nothing on either side.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
from pathlib import Path

from tests.sglang import scheduler_harness as H
from tests.sglang.token_ids import OUTPUT_TOKEN_BASE
from tierdiag.config.engine import (ARRIVALS, EVICTION_POLICIES, PREFETCH_POLICIES, SCHEDULE_POLICIES,
                                    WRITE_POLICIES, load_config)
from tierdiag.config.presets import GPUS, MODELS
from tierdiag.errors import TierdiagError
from tierdiag.trace.reader import ReadReport, read_trace

AGREE, DIFFER, USAGE, BAD_INPUT, NO_WHEEL, SGLANG_FAILED, IO = 0, 1, 2, 3, 4, 5, 6
DEFAULT_REQUESTS = 200
DEFAULT_DEVICE_TOKENS = 131072
# SGLang's ReqToTokenPool is max_running_requests x context int32 slots on the CPU: past this the
# worker would ask for more memory than a CI machine has.
MAX_REQ_TO_TOKEN_BYTES = 4 << 30
VERSION = "0.5.23"
MAX_REQUESTS = 10**9


class Usage(Exception):
    """A bad option value or a workload the harness cannot run: exit 2, one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2 (not usage + message)
        raise Usage(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= MAX_REQUESTS:
        raise argparse.ArgumentTypeError(f"{value} must be 1 to {MAX_REQUESTS:,}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tests.sglang.drive", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("trace", metavar="TRACE", help="Mooncake JSONL or tierdiag JSONL (.gz too)")
    p.add_argument("--requests", type=_positive_int, default=DEFAULT_REQUESTS, metavar="N",
                   help=f"the trace's first N requests (default {DEFAULT_REQUESTS})")
    p.add_argument("--time-scale", type=_float, metavar="S", help="multiply inter-arrival times (replay's option)")
    p.add_argument("--speedup", type=_float, metavar="X", help="the trace's rate times X (--time-scale 1/X)")
    p.add_argument("--page-size", type=_int, metavar="P")
    p.add_argument("--block-size", type=_int, metavar="B", help="tokens per hash id (Mooncake traces)")
    p.add_argument("--device-tokens", type=_int, metavar="T",
                   help=f"device KV pool (default {DEFAULT_DEVICE_TOKENS:,})")
    p.add_argument("--host-tokens", type=_int, metavar="T", help="host KV pool (default 4x device)")
    p.add_argument("--storage-tokens", type=_int, metavar="T", help="a storage tier (SGLang: the file backend)")
    p.add_argument("--write-policy", choices=WRITE_POLICIES)
    p.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES)
    p.add_argument("--eviction-policy", choices=EVICTION_POLICIES)
    p.add_argument("--prefetch-policy", choices=PREFETCH_POLICIES)
    p.add_argument("--max-prefill-tokens", "--chunked-prefill-size", dest="max_prefill_tokens", type=_int,
                   metavar="T", help="the prefill budget (SGLang's chunked_prefill_size and max_prefill_tokens)")
    p.add_argument("--max-running-requests", type=_int, metavar="N",
                   help="requests running at once (replay's option; default: derived as SGLang derives it)")
    p.add_argument("--enable-mixed-chunk", "--mixed-chunk", dest="mixed_chunk", action="store_true", default=None)
    p.add_argument("--arrivals", choices=ARRIVALS, help="closed where the trace has sessions, else trace")
    p.add_argument("--model", choices=MODELS, help="the cost model's model preset")
    p.add_argument("--gpu", choices=GPUS, help="the cost model's GPU preset")
    p.add_argument("--core", choices=("rust", "python"), default="rust", help="SGLang's tree core (default rust)")
    p.add_argument("--switch", action="append", default=[], choices=sorted(H.SWITCHES), metavar="NAME",
                   help="SGLang made to behave as the engine once did (scheduler_harness.SWITCHES): "
                        + ", ".join(sorted(H.SWITCHES)))
    p.add_argument("--json", type=Path, metavar="OUT", help="write the comparison as JSON")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed trace lines (and count them)")
    return p


def _config(a: argparse.Namespace):
    """The engine's config, checked as `tierdiag replay` checks its options (exit 2 naming one)."""
    if a.speedup is not None:
        if a.time_scale is not None:
            raise Usage("--speedup and --time-scale say the same thing: give one")
        if a.speedup <= 0:
            raise Usage(f"--speedup {a.speedup:g} must be above 0")
        a.time_scale = 1.0 / a.speedup
    device = a.device_tokens if a.device_tokens is not None else DEFAULT_DEVICE_TOKENS
    host = a.host_tokens
    if host is None and isinstance(device, int) and 1 <= device < 2**61:
        host = 4 * device
    return load_config(None, {
        "model": a.model, "gpu": a.gpu, "device_tokens": device, "host_tokens": host,
        "storage_tokens": a.storage_tokens, "page_size": a.page_size, "block_size": a.block_size,
        "write_policy": a.write_policy, "eviction_policy": a.eviction_policy, "schedule_policy": a.schedule_policy,
        "prefetch_policy": a.prefetch_policy, "max_prefill_tokens": a.max_prefill_tokens,
        "max_running_requests": a.max_running_requests, "time_scale": a.time_scale, "arrivals": a.arrivals,
        "enable_mixed_chunk": a.mixed_chunk,
        "sglang_rules": VERSION, "verify": "off", "data_plane_mib": _data_plane_mib(device, host, a.page_size)})


def _data_plane_mib(device, host, page_size) -> int:
    """The engine's real pools at their narrowest (8 bytes a page), at least the harness's 4 MiB."""
    ps = page_size if isinstance(page_size, int) and page_size >= 1 else 64
    if not all(isinstance(v, int) and 1 <= v < 2**61 for v in (device, host or device)):
        return 4  # the config check names the bad pool
    pages = (device + (host or 2 * device)) // ps
    return max(4, min(-(-pages * 8 >> 20) + 1, 1 << 20))


class _Renumber:
    """First-appearance numbering of (extra_key, id): equal stays equal, distinct stays distinct."""

    def __init__(self, start: int):
        self.ids: dict = {}
        self.start = start

    def __call__(self, key, value: int) -> int:
        got = self.ids.get((key, value))
        if got is None:
            got = self.ids[(key, value)] = self.start + len(self.ids)
        return got


def workload(trace: Path, a: argparse.Namespace, cfg) -> H.Workload:
    """The trace's first `--requests` requests (read by tierdiag's reader) as a harness workload."""
    report = ReadReport()
    reqs = list(itertools.islice(read_trace(trace, block_size=cfg.block_size, skip_bad=a.skip_bad, report=report),
                                 a.requests))
    block, ps = cfg.block_size, cfg.page_size
    fits = all(r.hash_ids is None or not r.hash_ids or (1 + max(r.hash_ids) * block + block <= OUTPUT_TOKEN_BASE)
               for r in reqs)
    renumber_hash = not fits or any(r.extra_key is not None for r in reqs)
    hashes, tokens = _Renumber(0), _Renumber(1)
    out = []
    for r in reqs:
        d = {"id": r.req_id, "arrival_ns": int(r.arrival_ns * cfg.time_scale), "input_len": r.input_len,
             "output_len": r.output_len, "priority": r.priority, "hash_ids": None}
        if r.tokens is not None:
            d["tokens"] = [tokens(r.extra_key, t) for t in r.tokens]
        else:
            d["hash_ids"] = [hashes(r.extra_key, h) for h in r.hash_ids] if renumber_hash else list(r.hash_ids)
        if r.session is not None:
            d["session"] = r.session
            d["think_ns"] = r.think_ns
        out.append(d)
    if len(hashes.ids) * block + block >= OUTPUT_TOKEN_BASE or len(tokens.ids) + 1 >= OUTPUT_TOKEN_BASE:
        raise Usage(f"{trace}: the first {len(out):,} requests hold more distinct blocks or tokens than SGLang's "
                    f"side of the harness can name below its output ids ({OUTPUT_TOKEN_BASE:,}); pass fewer --requests")
    closed = cfg.arrivals == "closed" or (cfg.arrivals is None and any(r.session is not None for r in reqs))
    if not closed and any(r.session is not None for r in reqs):
        for d in out:  # open loop: every turn at its timestamp
            d.pop("think_ns", None)
            d.pop("session", None)
    dev = cfg.resolved_device_tokens() // ps
    host = cfg.resolved_host_tokens() // ps
    name = f"{trace.name}[:{len(out)}] x{1 / cfg.time_scale:g} (page {ps}, {cfg.schedule_policy}, {cfg.write_policy})"
    w = H.Workload(name, out, ps, dev, host, block, cfg.max_prefill_tokens, cfg.schedule_policy, cfg.write_policy,
                   cfg.eviction_policy, closed_loop=closed,
                   mixed_chunk=cfg.enable_mixed_chunk, storage_tokens=cfg.storage_tokens,
                   prefetch_policy=cfg.prefetch_policy, model=cfg.model, gpu=cfg.gpu)
    # the cap both sides derive for the harness's context (or the one given), no more than the
    # requests replayed: a cap they cannot reach admits as any larger one does
    w.max_running = min(dataclasses.replace(cfg, max_context_tokens=w.context_len()).resolved_max_running_requests(),
                        len(out))
    _check_runnable(w, cfg)
    w.notes = {"skipped_lines": report.bad_lines}
    return w


def _check_runnable(w: H.Workload, cfg) -> None:
    """What SGLang's Scheduler cannot run on this CPU, or the harness cannot compare: one line each."""
    need = w.max_running * (w.context_len() + 8) * 4
    if need > MAX_REQ_TO_TOKEN_BYTES:
        raise Usage(f"the longest request ({w.context_len() - 64:,} tokens) with {w.max_running:,} running requests "
                    f"needs SGLang's req_to_token pool of {need / 2**30:.1f} GiB on the CPU "
                    f"(at most {MAX_REQ_TO_TOKEN_BYTES >> 30} GiB); pass fewer --requests or a smaller "
                    "--max-running-requests")
    if w.device_pages < 2:
        raise Usage(f"--device-tokens {cfg.device_tokens} is under two pages of --page-size {w.page_size}")
    slots = (w.device_pages + w.host_pages) * w.page_size
    if slots > 1 << 28:
        raise Usage(f"--device-tokens/--host-tokens: {slots:,} token slots are more than SGLang's CPU pools take "
                    f"here (2^28)")
    longest = max(r["input_len"] + r["output_len"] for r in w.requests)
    if longest + w.page_size > w.device_pages * w.page_size:
        raise Usage(f"a request of {longest:,} tokens does not fit the device pool ({w.device_pages * w.page_size:,} "
                    f"tokens): SGLang would wait for it forever; raise --device-tokens")


def _agreement(theirs: dict, ours: dict, w: H.Workload) -> dict:
    """Per prefill step and per request: agree or not (the JSON's detail)."""
    s_steps, e_steps = H.prefill_steps(theirs.get("steps", [])), H.prefill_steps(ours["steps"])
    steps = []
    for i in range(max(len(s_steps), len(e_steps))):
        s = s_steps[i] if i < len(s_steps) else None
        e = e_steps[i] if i < len(e_steps) else None
        differ = [f for f in H.STEP_FIELDS if s is None or e is None or s[f] != e[f]]
        steps.append({"step": i, "agree": not differ, "fields": differ,
                      "sglang": None if s is None else {f: s[f] for f in H.STEP_FIELDS},
                      "engine": None if e is None else {f: e[f] for f in H.STEP_FIELDS}})
    requests = []
    s_req, e_req = theirs.get("requests", {}), ours["requests"]
    for r in w.requests:
        s, e = s_req.get(r["id"]), e_req.get(r["id"])
        sv = None if s is None else {"device": s.get("device"), "host": s.get("host"), "storage": s.get("storage"),
                                     "computed": s.get("computed"),
                                     "ttft_ns": None if s.get("first_token_ns") is None
                                     else s["first_token_ns"] - s["arrival_ns"]}
        ev = None if e is None else {f: e[f] for f in H.REQUEST_FIELDS}
        requests.append({"id": r["id"], "agree": sv == ev, "sglang": sv, "engine": ev})
    return {"steps": steps, "requests": requests}


def printable(text: str) -> str:
    """Text from the trace (ids, the file name) as it is printed: control characters escaped, so no
    terminal escape reaches the screen; newlines kept."""
    return "\n".join("".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
                      for line in str(text).split("\n"))


class DriveError(Exception):
    """Bad input: one line, and the exit code it documents."""

    def __init__(self, message: str, code: int):
        super().__init__(printable(" ".join(str(message).split())))  # one line, no terminal escapes
        self.code = code


def prepare(argv: list[str] | None) -> tuple[argparse.Namespace, H.Workload]:
    """The options checked and the workload read, before anything runs; DriveError otherwise."""
    a = None
    try:
        a = parser().parse_args(argv)
        cfg = _config(a)
        trace = Path(a.trace)
        if a.json is not None:
            _check_output(a.json, trace)
        return a, workload(trace, a, cfg)
    except Usage as exc:
        raise DriveError(str(exc), USAGE) from None
    except TierdiagError as exc:  # the config's (2) and the trace reader's (3) errors, as replay words them
        raise DriveError(exc.one_line(), int(exc.exit_code)) from None
    except OSError as exc:
        raise DriveError(f"{a.trace if a else ''}: {exc.strerror or exc}", BAD_INPUT) from None


def main(argv: list[str] | None = None, worker=None) -> int:
    """The command; `worker`: a running SGLang 0.5.23 worker to reuse (the tests'), else one of its own."""
    try:
        a, w = prepare(argv)
    except DriveError as exc:
        return _fail(str(exc), exc.code)
    trace = Path(a.trace)
    from tests.sglang.differential import Worker
    from tests.support.sglang_wheels import WheelUnavailable, wheel_root

    own = worker is None
    if own:
        try:
            root = wheel_root(VERSION)
        except WheelUnavailable as exc:
            return _fail(str(exc), NO_WHEEL)
        worker = Worker(VERSION, root)
    print(printable(f"{w.name}: {len(w.requests)} requests, SGLang {VERSION}'s Scheduler ({a.core} tree core) beside the "
          f"engine{' (switches: ' + ', '.join(a.switch) + ')' if a.switch else ''}"), file=sys.stderr, flush=True)
    switches = tuple(dict.fromkeys(a.switch))
    try:
        theirs = worker.run(w.spec(switches, a.core))
    finally:
        if own:
            worker.close()
    ours = H.run_engine(w, switches)
    rep = H.compare(w, theirs, ours, switches)
    detail = _agreement(theirs, ours, w) if "error" not in theirs else {"steps": [], "requests": []}
    agree_steps = sum(s["agree"] for s in detail["steps"])
    agree_reqs = sum(r["agree"] for r in detail["requests"])
    print(f"prefill steps: {agree_steps} of {len(detail['steps'])} agree; requests: {agree_reqs} of "
          f"{len(detail['requests'])} agree (tier splits differ in {rep.differing_splits}, TTFT in "
          f"{rep.differing_ttft})")
    print(f"TTFT SGLang / engine: p50 {rep.ttft_ratio_p50}, p90 {rep.ttft_ratio_p90}, max {rep.ttft_ratio_max}")
    print(printable(rep.summary()))
    if w.notes["skipped_lines"]:
        print(f"({w.notes['skipped_lines']} bad trace lines skipped)")
    if a.json is not None:
        doc = {"workload": w.name, "trace": str(trace), "num_requests": len(w.requests), "core": a.core,
               "switches": list(switches), "engine_config": w.engine_config(), "agree": rep.clean,
               "differing_steps": rep.differing_steps, "num_steps": rep.steps,
               "differing_requests": rep.differing_requests, "differing_splits": rep.differing_splits,
               "differing_ttft": rep.differing_ttft, "ttft_ratio": {"p50": rep.ttft_ratio_p50,
                                                                    "p90": rep.ttft_ratio_p90,
                                                                    "max": rep.ttft_ratio_max},
               "first_step": rep.first_step, "first_request": rep.first_request, "error": rep.error, **detail}
        try:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as exc:
            return _fail(f"--json {a.json}: {exc.strerror or exc}", IO)
    if rep.sglang_raised:  # SGLang's Scheduler raised: not a difference of the engine's, a failure of SGLang's
        first = printable(" ".join(str(theirs["error"]).split("\n")[0].split()))[:300]
        print(f"SGLang {VERSION}'s Scheduler raised on this workload: {first}", file=sys.stderr)
        return SGLANG_FAILED
    return AGREE if rep.clean else DIFFER


def _check_output(out: Path, trace: Path) -> None:
    """--json OUT before anything runs (a run can take minutes): not the trace (2), writable (6:
    a folder, a path under a file, a read-only place); missing parent folders are created."""
    if "\x00" in str(out):
        raise Usage(f"--json {str(out)!r}: a file name cannot hold a NUL byte")
    if out.exists() and trace.exists() and os.path.samefile(out, trace):
        raise Usage(f"--json {out} is the trace itself: pick another file")
    try:
        if out.is_dir():
            raise IsADirectoryError(21, "is a folder")
        out.parent.mkdir(parents=True, exist_ok=True)
        existed = out.exists()
        with open(out, "a"):
            pass
        if not existed:
            out.unlink()
    except OSError as exc:
        raise DriveError(f"--json {out}: {exc.strerror or exc}", IO) from None


def _fail(message: str, code: int) -> int:
    print(f"error: {DriveError(message, code)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
