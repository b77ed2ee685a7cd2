"""The scheduler harness (issue 43): the same workload through SGLang 0.5.23's own `Scheduler`,
stepped on a virtual clock in the worker process (sglang0523_scheduler.py), and through main's
engine here, compared step by step and request by request.

A workload is a list of requests (id, arrival, input/output lengths, prefix-chained hash ids of
`block` tokens, optional priority, session and think time) and a deployment (pools, page size,
policies, the prefill budget). Both sides read the same hash ids: the engine as page keys
(trace/pages.py), SGLang as token ids (token j of block b = 1 + hash * block + j), so they share
exactly the same prefixes. Both sides are priced by the engine's cost model
(`tierdiag.engine.costmodel.CostModel`) on their own batches.

Compared, for every prefill step (SGLang's extend and mixed batches; the engine's batches, each
formed in one `Scheduler.schedule_pass` call, which the harness wraps to mark it):
  - the batch start time, membership in order, each member's extend and prefix tokens (chunk
    boundaries are consecutive members' prefix + extend) and the tokens it loaded back from host;
  - the device and host tokens evicted from the start of the step's formation to the next one's;
and for every request its device / host / storage / computed tokens (SGLang's
`split_cached_prefix_by_tier`, the engine's record) and TTFT. A request not admitted (NO_TOKEN)
shows as absent from a batch it would have joined. SGLang's decode steps are not compared one by
one (the engine has none); they show in the clock.

SWITCHES make SGLang behave as main's engine does where issue 43 found they differ, so that with
all of them on every step and request agrees (the proof that the harness compares what it
should); with all off the tests are the final ones. DIVERGENCES names, for each, the SGLang
function and issue 43's number.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from tests.engine.helpers import price_at_zero
from tests.sglang.storage_price import priced
from tierdiag.config.engine import EngineConfig
from tierdiag.engine import costmodel
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev
from tierdiag.trace.reader import TraceRequest

# switch -> (issue 43's divergence, the SGLang function, what the switch does to SGLang)
SWITCHES = {
    "priority_once": (1, "UnifiedRadixCache.checkpoint_into_tree",
                      "the finished prompt's second insert keeps the request's priority (not + 1)"),
    "reserve_output": (3, "PrefillAdder / new_token_ratio (SGLANG_INIT_NEW_TOKEN_RATIO)",
                       "admission reserves every running request's whole remaining output (ratio 1)"),
    "no_refresh": (4, "Scheduler waiting-prefix refresh (SGLANG_ENABLE_WAITING_PREFIX_REFRESH)",
                   "no LRU refresh of the waiting requests' cached prefixes"),
    "zero_decode": (5, "Scheduler.update_running_batch / run_batch (decode steps on the clock)",
                    "decode steps cost nothing, on both sides (the engine's decode_step_ns too)"),
    "alloc_output": ("2, 3", "alloc_for_extend / alloc_for_decode (allocation step by step)",
                     "a request's last chunk evicts for ceil((input + output) / page) pages at once, as "
                     "the engine allocates at admission"),
    "reserve_page_once": (6, "alloc_paged_token_slots_extend (conservative_num_tokens)",
                          "a batch's allocation evicts for its extend plus one page, as the engine's "
                          "request-by-request eviction leaves it (SGLang: a page a request)"),
    "drain_decode": (5, "Scheduler.get_next_batch_to_run (prefill first, decode when none)",
                     "running requests decode to their finish before the next prefill (as the engine "
                     "finishes them at no cost); a continuing chunk still goes first"),
}
# switches that show what SGLang does and the engine deliberately does not model (docs/engine.md,
# "What SGLang does that the engine does not model"); off in every final test
NOT_MODELLED = {
    "ignore_eos": ("found here", "PrefillAdder._get_running_request_total_token_offset (0.5.23)",
                   "requests sent with ignore_eos, as bench clients send them: each running request "
                   "reserves its whole remaining output (ratio 1.0), not new_token_ratio's estimate"),
}
SWITCHES.update(NOT_MODELLED)
COMPAT = tuple(s for s in SWITCHES if s not in NOT_MODELLED)  # every switch on: SGLang as main's engine was
LONG = os.environ.get("TIERDIAG_HARNESS_LONG") == "1"  # benchmark sizes (the 2,000 requests)


def long_n(env: dict | None = None) -> int:
    """The long mode's conversation size: TIERDIAG_HARNESS_LONG_N (a positive integer; default
    the issue's 2,000), to find a divergence on the smallest prefix of the trace that shows it."""
    raw = (os.environ if env is None else env).get("TIERDIAG_HARNESS_LONG_N", "").strip()
    if not raw:
        return 2000
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValueError(f"TIERDIAG_HARNESS_LONG_N must be a positive integer, not {raw!r}")
    return int(raw)


CONVERSATION = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "conversation_trace.jsonl"
MODEL, GPU = "llama3-8b", "h200"


@dataclass
class Workload:
    name: str
    requests: list[dict]
    page_size: int
    device_pages: int
    host_pages: int | None
    block_size: int
    max_prefill_tokens: int
    schedule_policy: str = "fcfs"
    write_policy: str = "write_through"
    eviction_policy: str = "lru"
    closed_loop: bool = False
    # SGLang's --max-running-requests, given to both sides (None: each derives it from the
    # device pool and the context length; SGLang by its own resolve_max_num_reqs)
    max_running: int | None = 512
    mixed_chunk: bool = False  # --enable-mixed-chunk: a prefill batch carries the running requests' decode step
    # a storage tier (SGLang: the file backend, its threads pumped at each pass: sglang0523_storage.py);
    # 0: none. prefetch_policy None: each side's default for 0.5.23 ("timeout")
    storage_tokens: int = 0
    prefetch_policy: str | None = None
    model: str = MODEL  # the cost model's presets (both sides are priced by it)
    gpu: str = GPU
    # storage I/O on the virtual clock (sglang0523_storage.TIMING), priced by the engine's cost
    # model on both sides with a disk this many times slower (storage_price.priced); 0: instant
    # (SGLang's threads pumped to quiescence at each pass, the engine's storage_ns at 0)
    storage_slowdown: float = 0

    def context_len(self) -> int:
        return max(r["input_len"] + r["output_len"] for r in self.requests) + 64

    def engine_config(self, **kw) -> dict:
        ps = self.page_size
        d = dict(model=self.model, gpu=self.gpu, page_size=ps, block_size=self.block_size,
                 device_tokens=self.device_pages * ps,
                 host_tokens=(self.host_pages or self.device_pages) * ps, write_policy=self.write_policy,
                 eviction_policy=self.eviction_policy, schedule_policy=self.schedule_policy,
                 max_prefill_tokens=self.max_prefill_tokens, max_context_tokens=self.context_len(),
                 sglang_rules="0.5.23", verify="off", enable_mixed_chunk=self.mixed_chunk,
                 max_running_requests=self.max_running,
                 # the real pools at one 8-byte word a page (verify is off): 4 MiB, or what they need
                 data_plane_mib=max(4, -(-(self.device_pages + (self.host_pages or self.device_pages)) * 8 >> 20) + 1))
        if self.storage_tokens:
            d.update(storage_tokens=self.storage_tokens, prefetch_policy=self.prefetch_policy)
        d.update(kw)
        return d

    def spec(self, switches, core: str) -> dict:
        return {"page_size": self.page_size, "device_pages": self.device_pages, "host_pages": self.host_pages,
                "write_policy": self.write_policy, "schedule_policy": self.schedule_policy,
                "eviction_policy": self.eviction_policy, "max_prefill_tokens": self.max_prefill_tokens,
                "context_len": self.context_len(), "core": core, "block_size": self.block_size,
                "engine_config": self.engine_config(), "requests": self.requests, "switches": sorted(switches),
                "closed_loop": self.closed_loop, "max_running": self.max_running, "flat_copy_cost": True,
                "mixed_chunk": self.mixed_chunk, "storage": bool(self.storage_tokens),
                "prefetch_policy": self.prefetch_policy, "storage_slowdown": self.storage_slowdown}


# --- the engine side --------------------------------------------------------------------------
class Capture:
    """A probe keeping what the comparison needs, in emission order."""

    def __init__(self):
        self.steps: list[dict] = []
        self.evicted = [0, 0]  # device, host tokens, cumulative
        self.matched: dict[str, tuple[int, int]] = {}  # rid -> (prefix tokens, loaded tokens)
        self.prefix: dict[str, int] = {}  # rid -> tokens before its next chunk
        self.records: dict[str, ev.RequestRecord] = {}
        self.current: dict | None = None
        self.log: list = []  # every eviction (tier, action, tokens, the node's owner), for a diverging step's story

    def emit(self, e) -> None:
        if isinstance(e, ev.PrefixMatched):
            self.matched[e.req_id] = (e.prefix_indices_len, e.host_tokens + e.storage_tokens)
            self.prefix.pop(e.req_id, None)  # an admission (a retracted request's again): its match
        elif isinstance(e, ev.PrefillDone):
            # the first chunk since its admission's match (a retracted request's chunks count on)
            first = e.req_id not in self.prefix
            prefix = self.matched[e.req_id][0] if first else self.prefix[e.req_id]
            loaded = self.matched[e.req_id][1] if first else 0
            self.current["members"].append([e.req_id, e.extend_tokens, prefix, loaded])
            self.prefix[e.req_id] = prefix + e.extend_tokens
        elif isinstance(e, ev.BatchScheduled):
            self.current["t"], self.current["end"] = e.t_start_ns, e.t_end_ns
        elif isinstance(e, ev.Eviction):
            self.log.append((e.tier, e.action, e.tokens, e.owner_req_id))
            if e.tier == "device":
                self.evicted[0] += e.tokens
            elif e.tier == "host":
                self.evicted[1] += e.tokens
        elif isinstance(e, ev.DecodeStep):
            if e.batch_id is not None and self.current is not None:
                self.current["kind"] = "mixed"  # the running requests' step rode in this prefill batch
        elif isinstance(e, ev.RequestFinished):
            self.records[e.record.req_id] = e.record


def engine_state(engine) -> dict:
    """The engine's memory state once a batch is formed (its admissions allocated), the same
    fields as the SGLang side's (`sglang0523_scheduler._state`): free, evictable and locked
    device tokens, backups in flight (a backed-up node stays locked until its copy's modelled
    end: CacheController.backup), free host tokens, requests waiting and running."""
    sched, ctrl, tree, ps = engine.scheduler, engine.scheduler.ctrl, engine.scheduler.tree, engine.cfg.page_size
    backups = (sum(1 for e in sched._events if e[2] == tree.dec_lock) + ctrl.backups_in_flight
               + len(ctrl.backup_queue) + len(ctrl.backup_later))
    return {"free": ctrl.device.free_pages * ps, "evictable": tree.evictable_device_pages * ps,
            "locked": tree.locked_device_pages * ps, "backups": backups,
            "host_free": ctrl.host.free_pages * ps, "waiting": len(sched.waiting), "running": len(sched.running),
            "refresh_calls": sched.refresh_calls}


def trace_requests(w: Workload) -> list[TraceRequest]:
    return [TraceRequest(req_id=r["id"], seq=i, line=i + 1, arrival_ns=r["arrival_ns"], input_len=r["input_len"],
                         output_len=r["output_len"],
                         hash_ids=None if r.get("hash_ids") is None else tuple(r["hash_ids"]),
                         tokens=None if r.get("tokens") is None else tuple(r["tokens"]),
                         priority=r.get("priority", 0), session=r.get("session"), think_ns=r.get("think_ns"))
            for i, r in enumerate(w.requests)]


def run_engine(w: Workload, switches) -> dict:
    """Main's engine on the workload: its prefill batches as steps (the same fields as SGLang's)
    and its request records."""
    cfg = EngineConfig(**w.engine_config(arrivals="closed" if w.closed_loop else "trace"))
    cap = Capture()
    saved = costmodel.RUN_OVERHEAD_NS
    costmodel.RUN_OVERHEAD_NS = 0  # flat_copy_cost: the per-run term reads the allocator's layout
    try:
        engine = Engine(cfg, probe=cap)
        sched = engine.scheduler
        if w.storage_slowdown:  # storage on the clock, both sides priced alike (storage_price.py)
            cost = priced(engine.cost, w.storage_slowdown)
            engine.cost = cost
            for rank in engine.ranks:
                rank.ctrl.cost = rank.scheduler.cost = cost
        # otherwise SGLang's storage threads are pumped between passes (sglang0523_storage.py):
        # its reads and writes take no virtual time, and so do the engine's here
        price_at_zero(engine, (["decode_step_ns"] if "zero_decode" in switches else [])
                      + (["storage_ns"] if w.storage_tokens and not w.storage_slowdown else []))
        form = sched.schedule_pass

        def batch(now):  # a step: one Scheduler.schedule_pass call that formed a batch
            mark = list(cap.evicted)
            cap.current = {"t": now, "kind": "prefill", "members": [], "evicted_before": mark, "log_at": len(cap.log)}
            end = form(now)
            cap.current["state"] = engine_state(engine)
            if end is not None:
                if not cap.current["members"]:  # no request prefilled: a decode step (engines that step decode)
                    cap.current["kind"] = "decode"
                cap.steps.append(cap.current)
            cap.current = None
            return end

        if hasattr(sched, "pass_fn"):  # the loops' pass (a compiled scheduler's methods cannot be replaced)
            sched.pass_fn = batch
        else:  # an engine before it (a baseline checkout)
            sched.schedule_pass = batch
        engine.run(trace_requests(w))
        engine.check_invariants(idle=True)
    finally:
        costmodel.RUN_OVERHEAD_NS = saved
    cap.steps.append({"kind": "end", "members": [], "evicted_before": list(cap.evicted)})
    requests = {}
    for rid, rec in cap.records.items():
        requests[rid] = {"status": rec.status, "device": rec.device_hit_tokens, "host": rec.host_hit_tokens,
                         "storage": rec.storage_hit_tokens, "computed": rec.computed_tokens,
                         "ttft_ns": rec.ttft_ns, "finish_ns": rec.finish_ns}
    return {"steps": cap.steps, "requests": requests, "evictions": cap.log, "max_running": sched.max_running}


# --- comparing -------------------------------------------------------------------------------------
def prefill_steps(steps: list[dict]) -> list[dict]:
    """The prefill (extend, mixed) steps, each with the tokens evicted from its formation to the
    next prefill step's (SGLang's decode steps between them count in the window before)."""
    marks = [s for s in steps if s["kind"] in ("prefill", "mixed", "end")]
    out = []
    for s, nxt in zip(marks, marks[1:]):
        out.append({"t": s["t"], "kind": s["kind"], "members": [list(m) for m in s["members"]],
                    "evicted": [b - a for a, b in zip(s["evicted_before"], nxt["evicted_before"])],
                    "state": s.get("state")})
    return out


STEP_FIELDS = ("t", "kind", "members", "evicted")
REQUEST_FIELDS = ("device", "host", "storage", "computed", "ttft_ns")


@dataclass
class Report:
    workload: str
    switches: tuple
    steps: int = 0
    differing_steps: int = 0
    first_step: str | None = None
    requests: int = 0
    differing_requests: int = 0
    differing_splits: int = 0
    differing_ttft: int = 0
    first_request: str | None = None
    ttft_ratio_p50: float | None = None
    ttft_ratio_p90: float | None = None
    ttft_ratio_max: float | None = None
    error: str | None = None
    sglang_raised: bool = False  # the error is SGLang's Scheduler raising (drive's exit 5), not a difference
    notes: list = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.error is None and self.differing_steps == 0 and self.differing_requests == 0

    def summary(self) -> str:
        sw = "+".join(self.switches) or "none"
        head = (f"{self.workload} [switches: {sw}]: {self.differing_steps} of {self.steps} prefill steps differ, "
                f"{self.differing_requests} of {self.requests} requests (splits {self.differing_splits}, "
                f"TTFT {self.differing_ttft}; SGLang/engine TTFT p50 {self.ttft_ratio_p50}, p90 {self.ttft_ratio_p90}, "
                f"max {self.ttft_ratio_max})")
        parts = [head]
        if self.error:
            parts.append(f"SGLang raised: {self.error}")
        if self.first_step:
            parts.append(self.first_step)
        if self.first_request:
            parts.append(self.first_request)
        return "\n".join(parts)


def compare(w: Workload, theirs: dict, ours: dict, switches) -> Report:
    rep = Report(w.name, tuple(sorted(switches)))
    if "error" in theirs:
        rep.error = theirs["error"] + "\n" + theirs.get("trace", "")
        rep.sglang_raised = True
        return rep
    if theirs.get("max_running") != ours.get("max_running"):  # the cap each side derived
        rep.error = (f"max_running_requests: SGLang's resolve_max_num_reqs gives {theirs.get('max_running')}, "
                     f"the engine's {ours.get('max_running')}")
        return rep
    s_steps, e_steps = prefill_steps(theirs["steps"]), prefill_steps(ours["steps"])
    rep.steps = max(len(s_steps), len(e_steps))
    for i in range(rep.steps):
        s = s_steps[i] if i < len(s_steps) else None
        e = e_steps[i] if i < len(e_steps) else None
        diff = {f: (s and s[f], e and e[f]) for f in STEP_FIELDS if s is None or e is None or s[f] != e[f]}
        if diff:
            rep.differing_steps += 1
            if rep.first_step is None:
                lines = [f"first diverging prefill step: #{i + 1} (0-based {i})"]
                for f, (a, b) in diff.items():
                    lines.append(f"  {f}: sglang={a}\n  {' ' * len(f)}  engine={b}")
                prev = s_steps[i - 1] if 0 < i <= len(s_steps) else None
                if prev is not None:
                    shown = {k: v for k, v in prev.items() if k != "state"}
                    lines.append(f"  (step before, both sides agreeing: {shown})")
                for j, when in ((i - 1, "step before"), (i, "this step")):
                    if 0 <= j:
                        a = s_steps[j].get("state") if j < len(s_steps) else None
                        b = e_steps[j].get("state") if j < len(e_steps) else None
                        lines.append(f"  memory once formed ({when}): sglang={a}\n"
                                     f"  {' ' * len(when)}                      engine={b}")
                rep.first_step = "\n".join(lines)
    s_req, e_req = theirs["requests"], ours["requests"]
    ratios = []
    for rid in [r["id"] for r in w.requests]:
        s, e = s_req.get(rid), e_req.get(rid)
        if s is None and e is None:
            continue
        rep.requests += 1
        s_view = None if s is None else {"device": s.get("device"), "host": s.get("host"),
                                         "storage": s.get("storage"), "computed": s.get("computed"),
                                         "ttft_ns": None if s.get("first_token_ns") is None
                                         else s["first_token_ns"] - s["arrival_ns"]}
        e_view = None if e is None else {f: e[f] for f in REQUEST_FIELDS}
        if s_view is None or e_view is None:
            rep.differing_requests += 1
            if rep.first_request is None:
                rep.first_request = f"request {rid}: sglang={s_view} engine={e_view}"
            continue
        split = any(s_view[f] != e_view[f] for f in REQUEST_FIELDS[:4])
        ttft = s_view["ttft_ns"] != e_view["ttft_ns"]
        if s_view["ttft_ns"] and e_view["ttft_ns"]:
            ratios.append(s_view["ttft_ns"] / e_view["ttft_ns"])
        rep.differing_splits += split
        rep.differing_ttft += ttft
        if split or ttft:
            rep.differing_requests += 1
            if rep.first_request is None:
                rep.first_request = f"first diverging request {rid}: sglang={s_view}\n  engine={e_view}"
    if ratios:
        ratios.sort()
        rep.ttft_ratio_p50 = round(ratios[len(ratios) // 2], 3)
        rep.ttft_ratio_p90 = round(ratios[min(len(ratios) - 1, int(len(ratios) * 0.9))], 3)
        rep.ttft_ratio_max = round(ratios[-1], 3)
    return rep


def run_both(worker, w: Workload, switches=(), core: str = "rust") -> Report:
    switches = tuple(switches)
    theirs = worker.run(w.spec(switches, core))
    ours = run_engine(w, switches)
    return compare(w, theirs, ours, switches)


# --- workloads -----------------------------------------------------------------------------------
class _Chains:
    """Prefix-chained hash ids: a new id for every new block, reused along a shared prefix."""

    def __init__(self):
        self.next = 1

    def fresh(self, n: int) -> list[int]:
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids


def seeded(seed: int, *, page_size: int, shape: str, schedule_policy: str = "fcfs",
           write_policy: str = "write_through", eviction_policy: str = "lru", outputs=(1, 9),
           mixed_chunk: bool = False) -> Workload:
    """Concurrent sequences: `burst` (groups arriving at one instant, sharing a system prompt and
    a family prefix), `chunk` (long prompts beyond the prefill budget, beside short ones),
    `pressure` (a device pool a few requests fill: admissions wait for memory, the tree evicts to
    host and loads back), `tiered` (a smaller device pool, a host pool of the same size, most prompts
    repeats of earlier ones: load-backs, and host evictions). Block 64 tokens; the budget 512
    tokens (1,024 at page 64)."""
    rnd = random.Random(seed * 7919 + len(shape))
    block = 64
    chains = _Chains()
    system = chains.fresh(2)
    families = [system + chains.fresh(rnd.randint(1, 3)) for _ in range(4)]
    reqs = []
    t = 0
    n = {"burst": 40, "chunk": 24, "pressure": 48, "tiered": 64}[shape]
    repeat = 0.6 if shape == "tiered" else 0.25
    for i in range(n):
        if shape == "burst":
            t += 0 if i % 8 else rnd.randint(20, 60) * 1_000_000
        else:
            t += rnd.randint(0, 12) * 1_000_000
        fam = rnd.choice(families)
        if shape == "chunk" and rnd.random() < 0.4:
            extra = rnd.randint(10, 24)  # 640-1,536 tokens past the family prefix
        else:
            extra = rnd.randint(1, 4)
        if rnd.random() < repeat and reqs:  # a repeat of an earlier prompt (a hit, or a load-back)
            prev = rnd.choice(reqs)
            ids, length = list(prev["hash_ids"]), prev["input_len"]
        else:
            ids = fam + chains.fresh(extra)
            length = len(ids) * block - rnd.randint(0, block - 1)
        out = rnd.randint(*outputs)
        reqs.append({"id": f"{shape}{seed}-{i}", "arrival_ns": t, "input_len": length, "output_len": out,
                     "hash_ids": ids, "priority": rnd.choice((0, 0, 1, 3)) if eviction_policy == "priority" else 0})
    budget = 512 if page_size < 64 else 1024
    dev_tokens = {"burst": 6144, "chunk": 8192, "pressure": 2560, "tiered": 2048}[shape]
    dev = dev_tokens // page_size
    host = dev * (1 if shape == "tiered" else 3)  # tiered: the host pool evicts too
    mixed = ", mixed chunk" if mixed_chunk else ""
    return Workload(f"{shape}(seed {seed}, page {page_size}, {schedule_policy}, {write_policy}{mixed})", reqs,
                    page_size, dev, host, block, budget, schedule_policy, write_policy, eviction_policy,
                    mixed_chunk=mixed_chunk)


def mooncake(n: int, *, speedup: float, page_size: int = 64, schedule_policy: str = "fcfs",
             write_policy: str = "write_through", device_tokens: int = 131072) -> Workload:
    """The first n requests of the conversation trace, arrivals divided by `speedup`."""
    reqs = []
    with CONVERSATION.open() as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            d = json.loads(line)
            reqs.append({"id": f"c{i}", "arrival_ns": int(d["timestamp"] * 1_000_000 / speedup),
                         "input_len": d["input_length"], "output_len": d["output_length"], "hash_ids": d["hash_ids"]})
    dev = device_tokens // page_size
    return Workload(f"conversation[:{n}] x{speedup:g} (page {page_size}, {schedule_policy}, {write_policy})", reqs,
                    page_size, dev, dev * 4, 512, 8192, schedule_policy, write_policy)


def chunk_host(seed: int, *, n: int = 24, page_size: int = 64, write_policy: str = "write_through") -> Workload:
    """Long distinct prompts (6-20 blocks of 64 tokens) that chunk at a 512-token budget, into a
    device pool of 2,048 tokens and a host pool of the same size: every chunk's insert
    (`stash_chunked_request` -> cache_unfinished_req) backs its pages up and evicts host leaves to
    make room, at the start of the pass that continues the chunk (the conversation trace's first
    divergence at step 69, found by the long mode, in 24 requests)."""
    rnd = random.Random(seed)
    block = 64
    chains = _Chains()
    reqs = []
    t = 0
    for i in range(n):
        t += rnd.randint(0, 6) * 1_000_000
        ids = chains.fresh(rnd.randint(6, 20))
        reqs.append({"id": f"k{seed}-{i}", "arrival_ns": t, "input_len": len(ids) * block - rnd.randint(0, block - 1),
                     "output_len": rnd.randint(1, 4), "hash_ids": ids, "priority": 0})
    dev = 2048 // page_size
    return Workload(f"chunk_host(seed {seed}, page {page_size}, fcfs, {write_policy})", reqs, page_size, dev, dev,
                    block, 512, "fcfs", write_policy)


def agentic(seed: int, *, sessions: int = 6, turns: int = 5, page_size: int = 64,
            schedule_policy: str = "lpm", write_policy: str = "write_through", device_tokens: int = 8192) -> Workload:
    """Closed-loop agent sessions: each turn resends the session's whole history plus a tool
    result (the context grows), after a think time; the sessions share a system prompt."""
    rnd = random.Random(seed)
    block = 64
    chains = _Chains()
    system = chains.fresh(4)
    reqs = []
    for s in range(sessions):
        hist = system + chains.fresh(rnd.randint(1, 3))
        start = rnd.randint(0, 40) * 1_000_000
        for k in range(turns):
            length = len(hist) * block - rnd.randint(0, block - 1)
            reqs.append({"id": f"a{seed}-{s}-{k}", "arrival_ns": start + k * 1_000_000, "input_len": length,
                         "output_len": rnd.randint(2, 24), "hash_ids": list(hist), "session": f"s{s}",
                         "think_ns": rnd.randint(0, 20) * 1_000_000})
            hist = hist + chains.fresh(rnd.randint(2, 6))
    reqs.sort(key=lambda r: r["arrival_ns"])
    dev = device_tokens // page_size
    return Workload(f"agentic(seed {seed}, page {page_size}, {schedule_policy}, {write_policy}, {device_tokens})",
                    reqs, page_size,
                    dev, dev * 3, block, 1024, schedule_policy, write_policy, closed_loop=True)


def decode_pressure(seed: int, *, page_size: int, n: int, device_tokens: int, outputs: tuple[int, int],
                    schedule_policy: str, write_policy: str, eviction_policy: str = "lru",
                    mixed_chunk: bool = False, gap_ms: int = 8, budget: int = 1024) -> Workload:
    """Requests with long outputs (decode pressure) sharing a few prefixes, into a device pool
    their running decode overflows: SGLang allocates a page at a time before each decode step
    and retracts when it runs out (`update_running_batch` -> `retract_decode`)."""
    rnd = random.Random(seed * 31337 + page_size)
    block = 64
    chains = _Chains()
    system = chains.fresh(2)
    fams = [system + chains.fresh(rnd.randint(1, 4)) for _ in range(3)]
    reqs, t = [], 0
    for i in range(n):
        t += rnd.randint(0, gap_ms) * 1_000_000
        if reqs and rnd.random() < 0.2:
            prev = rnd.choice(reqs)
            ids, length = list(prev["hash_ids"]), prev["input_len"]
        else:
            ids = rnd.choice(fams) + chains.fresh(rnd.randint(1, 8))
            length = len(ids) * block - rnd.randint(0, block - 1)
        reqs.append({"id": f"d{seed}-{i}", "arrival_ns": t, "input_len": length,
                     "output_len": rnd.randint(*outputs), "hash_ids": ids,
                     "priority": rnd.choice((0, 1, 5)) if eviction_policy == "priority" else 0})
    dev = device_tokens // page_size
    mixed = ", mixed" if mixed_chunk else ""
    return Workload(f"decode(seed {seed}, page {page_size}, {device_tokens}, out {outputs}, {schedule_policy}, "
                    f"{write_policy}, {eviction_policy}{mixed})", reqs, page_size, dev, dev * 2, block, budget,
                    schedule_policy, write_policy, eviction_policy, mixed_chunk=mixed_chunk)


def hunt_synth(kind: str, seed: int, rate: float, n: int, requests: int, argv: list[str]) -> Workload:
    """A hunt workload on a `tierdiag synth` trace (tests/sglang/hunt.py's `synth` family): the
    n-request trace written once under the temp folder, its first `requests` driven as
    `python -m tests.sglang.drive TRACE --requests R ARGV` builds them."""
    import tempfile

    from tests.sglang import drive  # it imports this module
    from tierdiag.trace.synth import SynthConfig, synth_to_file

    path = Path(tempfile.gettempdir()) / "tierdiag-harness-traces" / f"synth-{kind}-s{seed}-r{rate:g}-n{n}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")  # parallel workers: whole files only
        synth_to_file(part, SynthConfig(kind=kind, num_requests=n, seed=seed, rate_per_s=rate))
        part.replace(path)
    _, w = drive.prepare([str(path), "--requests", str(requests)] + argv)
    return w


def hunt_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """What tests/sglang/hunt.py found differing, each reduced to a CI case of a few seconds
    (tests/sglang/README.md, "The hunt")."""
    return [
        # fifo / filo order nodes made at one instant by SGLang's creation counter
        # (tests/engine/test_sglang_0523_creation_order.py)
        ("decode-s206-p16-lpm-write_through-filo",
         partial(decode_pressure, 206, page_size=16, n=60, device_tokens=4096, outputs=(100, 600),
                 schedule_policy="lpm", write_policy="write_through", eviction_policy="filo", gap_ms=2,
                 budget=2048), "rust"),
        # shortest-prefill-first orders a retracted request by its input + output so far
        # (tests/engine/test_sglang_0523_sjf_retracted.py)
        ("decode-s515-p1-shortest-prefill-first-write_back-slru",
         partial(decode_pressure, 515, page_size=1, n=100, device_tokens=3072, outputs=(100, 600),
                 schedule_policy="shortest-prefill-first", write_policy="write_back", eviction_policy="slru",
                 gap_ms=20, budget=512), "rust"),
        # a chunk is stashed after its batch's other inserts (the creation order filo reads;
        # tests/engine/test_sglang_0523_creation_order.py)
        ("chunk-s2-p16-shortest-prefill-first-write_back-filo",
         partial(seeded, 2, page_size=16, shape="chunk", schedule_policy="shortest-prefill-first",
                 write_policy="write_back", eviction_policy="filo", outputs=(16, 64)), "rust"),
        # a node split while its load-back is in flight joins the host-duplicate registry at the
        # ack, anchor first (tests/engine/test_sglang_0523_duplicate_order.py)
        ("tiered-s216-p1-lpm-write_back-long-outputs",
         partial(seeded, 216, page_size=1, shape="tiered", schedule_policy="lpm", write_policy="write_back",
                 outputs=(64, 200)), "rust"),
        # a storage read whose pages another request put on device meanwhile, without a host
        # copy (the 24,576-token host pool was full at its backup): 0.5.23's insert_host refills
        # that host copy from the read and counts it loaded from storage
        # (tests/engine/test_sglang_0523_insert_host_refill.py); the hunt's 150 requests, cut to
        # the first 40 (the engine without the rule differs in 1 of them, 2 of the 150)
        ("synth-mixed-s642-r8-n150:40-p16-lpm-write_through-mru-stored-wait_complete",
         partial(hunt_synth, "mixed", 642, 8.0, 150, 40,
                 ["--page-size", "16", "--schedule-policy", "lpm", "--write-policy", "write_through",
                  "--eviction-policy", "mru", "--max-prefill-tokens", "4096", "--storage-tokens", "4000000",
                  "--prefetch-policy", "wait_complete", "--device-tokens", "24576", "--host-tokens", "24576"]),
         "rust"),
    ]


# --- the test matrix -------------------------------------------------------------------------------
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")


def seeded_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """(id, workload, core): bursts, chunking, memory pressure; seeds cycle the write policy;
    pages 1 and 64; fcfs and lpm; the Rust core (SGLang's default), the Python core beside it for
    a few."""
    out = []
    for shape in ("burst", "chunk", "pressure", "tiered"):
        for seed in range(3 if not LONG else 8):
            for ps in (1, 64):
                for pol in ("fcfs", "lpm"):
                    wp = WRITE_POLICIES[seed % 3]
                    w = partial(seeded, seed, page_size=ps, shape=shape, schedule_policy=pol, write_policy=wp)
                    out.append((f"{shape}-s{seed}-p{ps}-{pol}-{wp}", w, "rust"))
    for shape in ("burst", "pressure"):
        for pol in ("fcfs", "lpm"):
            w = partial(seeded, 0, page_size=64, shape=shape, schedule_policy=pol)
            out.append((f"{shape}-s0-p64-{pol}-write_through-pythoncore", w, "python"))
    w = partial(seeded, 0, page_size=64, shape="pressure", eviction_policy="priority")
    out.append(("pressure-s0-p64-fcfs-write_through-priority", w, "rust"))
    # --enable-mixed-chunk: decode steps ride in the prefill batches (mix_with_running)
    for shape, seed, ps in (("chunk", 0, 64), ("chunk", 1, 1), ("pressure", 0, 64), ("pressure", 1, 1),
                            ("burst", 2, 64)):
        wp = WRITE_POLICIES[seed % 3]
        w = partial(seeded, seed, page_size=ps, shape=shape, write_policy=wp, mixed_chunk=True)
        out.append((f"{shape}-s{seed}-p{ps}-fcfs-{wp}-mixed", w, "rust"))
    return out


def trace_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """The conversation trace's first requests at its own rate and at 4x: 24 in CI (SGLang's CPU
    allocation and its decode steps make ~0.5 s a request), the issue's 2,000 in the long mode
    (TIERDIAG_HARNESS_LONG_N: another size)."""
    n = long_n() if LONG else 24
    combos = (("fcfs", "write_through", 1), ("lpm", "write_back", 4))
    if LONG:
        combos = tuple((p, wp, x) for x in (1, 4) for p, wp in (("fcfs", "write_through"), ("lpm", "write_back")))
    return [(f"conversation{n}-x{x}-{p}-{wp}", partial(mooncake, n, speedup=x, schedule_policy=p, write_policy=wp),
             "rust")
            for p, wp, x in combos]


def agentic_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    out = []
    for seed in range(2 if not LONG else 6):
        for pol in ("lpm", "fcfs"):
            for ps in (1, 64):
                out.append((f"agentic-s{seed}-p{ps}-{pol}", partial(agentic, seed, page_size=ps, schedule_policy=pol,
                                                                   write_policy=WRITE_POLICIES[seed % 3]), "rust"))
    for seed in range(2 if not LONG else 6):
        # a device pool of three sessions' histories: the others' go to host between turns
        for ps in (1, 64):
            out.append((f"agentic-tiered-s{seed}-p{ps}", partial(agentic, seed, page_size=ps, device_tokens=3072,
                                                                  write_policy=WRITE_POLICIES[seed % 3]), "rust"))
    return out


def with_budget(make: Callable[[], Workload], budget: int) -> Workload:
    """A workload with another prefill budget (`max_prefill_tokens`, SGLang's chunked_prefill_size
    too): one that is not a page multiple leaves under a page of it after a batch."""
    w = make()
    w.max_prefill_tokens = budget
    w.name += f" budget {budget}"
    return w


def audit_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """Combinations the matrix above misses (issue 43's workload list, audited): the Python core
    at page 1, under write_back and with host evictions; agent sessions under
    write_through_selective, and with host traffic under fcfs; the conversation slice under lpm
    with write_through_selective and under fcfs at 4x; mixed chunk under lpm; and 0.5.23's other
    cache-aware policies, hrrn and shortest-prefill-first (the same `_compute_prefix_matches`)."""
    wts, wb = "write_through_selective", "write_back"
    out = [
        ("tiered-s2-p1-lpm-write_through_selective-pythoncore",
         partial(seeded, 2, page_size=1, shape="tiered", schedule_policy="lpm", write_policy=wts), "python"),
        ("pressure-s1-p1-fcfs-write_back-pythoncore",
         partial(seeded, 1, page_size=1, shape="pressure", write_policy=wb), "python"),
        ("tiered-s1-p64-lpm-write_back-pythoncore",
         partial(seeded, 1, page_size=64, shape="tiered", schedule_policy="lpm", write_policy=wb), "python"),
        ("agentic-s2-p64-lpm-write_through_selective", partial(agentic, 2, page_size=64, write_policy=wts), "rust"),
        # two sessions' turns released by one step's finishes arrive at the same instant
        ("agentic-s5-p64-fcfs-write_through_selective",
         partial(agentic, 5, page_size=64, schedule_policy="fcfs", write_policy=wts), "rust"),
        ("agentic-tiered-s2-p64-write_through_selective",
         partial(agentic, 2, page_size=64, device_tokens=3072, write_policy=wts), "rust"),
        ("agentic-tiered-s0-p64-fcfs", partial(agentic, 0, page_size=64, device_tokens=3072, schedule_policy="fcfs"),
         "rust"),
        ("agentic-tiered-s1-p1-fcfs-write_back",
         partial(agentic, 1, page_size=1, device_tokens=3072, schedule_policy="fcfs", write_policy=wb), "rust"),
        # mixed chunk under memory pressure (batch_is_full after a mixed batch)
        ("pressure-s1-p64-fcfs-write_back-mixed",
         partial(seeded, 1, page_size=64, shape="pressure", write_policy=wb, mixed_chunk=True), "rust"),
        ("tiered-s3-p1-fcfs-write_through-mixed",
         partial(seeded, 3, page_size=1, shape="tiered", mixed_chunk=True), "rust"),
        ("chunk-s0-p64-lpm-write_through-mixed",
         partial(seeded, 0, page_size=64, shape="chunk", schedule_policy="lpm", mixed_chunk=True), "rust"),
        ("pressure-s2-p1-lpm-write_through_selective-mixed",
         partial(seeded, 2, page_size=1, shape="pressure", schedule_policy="lpm", write_policy=wts, mixed_chunk=True),
         "rust"),
        # a mixed batch leaves under a page of budget: the next waiting request is matched (its
        # prefix stamped) and refused (_get_new_batch_prefill_raw: budget_state() is not OTHER)
        ("chunk-s4-p64-fcfs-write_back-mixed",
         partial(seeded, 4, page_size=64, shape="chunk", write_policy=wb, mixed_chunk=True), "rust"),
        # ... and without mixed chunk, a budget off a page boundary (1,000 at page 64)
        ("chunk-s4-p64-fcfs-write_back-budget1000",
         partial(with_budget, partial(seeded, 4, page_size=64, shape="chunk", write_policy=wb), 1000), "rust"),
        # hrrn's token clock counts decode steps (the running batch's stale extend_num_tokens) and
        # a mixed batch's decode rows (Scheduler.run_batch)
        ("chunk-s1-p64-hrrn-write_back", partial(seeded, 1, page_size=64, shape="chunk", schedule_policy="hrrn",
                                                 write_policy=wb), "rust"),
        ("pressure-s7-p64-hrrn-write_back-mixed",
         partial(seeded, 7, page_size=64, shape="pressure", schedule_policy="hrrn", write_policy=wb, mixed_chunk=True),
         "rust"),
        ("burst-s1-p64-hrrn-write_back", partial(seeded, 1, page_size=64, shape="burst", schedule_policy="hrrn",
                                                 write_policy=wb), "rust"),
        ("pressure-s0-p1-hrrn-write_through", partial(seeded, 0, page_size=1, shape="pressure", schedule_policy="hrrn"),
         "rust"),
        ("chunk-s2-p64-shortest-prefill-first-write_through_selective",
         partial(seeded, 2, page_size=64, shape="chunk", schedule_policy="shortest-prefill-first", write_policy=wts),
         "rust"),
        ("tiered-s0-p1-shortest-prefill-first-write_through",
         partial(seeded, 0, page_size=1, shape="tiered", schedule_policy="shortest-prefill-first"), "rust"),
        ("conversation24-x1-lpm-write_through_selective",
         partial(mooncake, 24, speedup=1, schedule_policy="lpm", write_policy=wts), "rust"),
        ("conversation24-x4-fcfs-write_through",
         partial(mooncake, 24, speedup=4, schedule_policy="fcfs", write_policy="write_through"), "rust"),
    ]
    return out


# --- the storage tier (sglang0523_storage.py) -------------------------------------------------------
STORAGE_TOKENS = 1 << 22  # far beyond what a workload writes: nothing is deleted from the tier


def stored(seed: int, *, page_size: int, schedule_policy: str = "fcfs", write_policy: str = "write_through",
           prefetch_policy: str | None = None, n: int = 40, system_prompt: bool = True,
           storage_slowdown: float = 0, spacing: int = 1) -> Workload:
    """A storage tier behind pools that churn: distinct prompts of 5-12 blocks (320-768 tokens)
    under a system prompt, into a device pool of 2,048 tokens and a host pool of the same size,
    so the host evicts what storage then keeps; 40 % of the requests repeat an earlier prompt
    (a storage hit once its pages left the host: prefetched at arrival, loaded back at
    admission), some of them arriving together (in-flight prefetches share the host).
    Without `system_prompt` the prompts share nothing: under write_back a device-resident system
    prompt is never backed up, so 0.5.23's prefetch gate (`_prefetch_kvcache`: the best match
    backed up, or the root) stops every query; without it the gate is the root.
    `storage_slowdown` puts storage on the clock (Workload.storage_slowdown); `spacing` stretches
    the gaps between arrivals (so that slow writes land before the repeats come)."""
    rnd = random.Random(seed * 104729 + 17)
    block = 64
    chains = _Chains()
    system = chains.fresh(1) if system_prompt else []
    reqs = []
    t = 0
    for i in range(n):
        t += 0 if rnd.random() < 0.25 else rnd.randint(1, 10) * 1_000_000 * spacing
        if i >= 8 and rnd.random() < 0.4:
            prev = rnd.choice(reqs[: max(1, i - 6)])  # an older prompt: its pages have likely left the host
            ids, length = list(prev["hash_ids"]), prev["input_len"]
        else:
            ids = system + chains.fresh(rnd.randint(4, 11))
            length = len(ids) * block - rnd.randint(0, block - 1)
        reqs.append({"id": f"st{seed}-{i}", "arrival_ns": t, "input_len": length, "output_len": rnd.randint(1, 8),
                     "hash_ids": ids, "priority": 0})
    dev = 2048 // page_size
    budget = 512 if page_size < 64 else 1024
    pp = prefetch_policy or "timeout"
    sp = "" if system_prompt else ", no system prompt"
    if storage_slowdown:
        sp += f", storage on the clock x{storage_slowdown:g}, gaps x{spacing}"
    return Workload(f"stored(seed {seed}, page {page_size}, {schedule_policy}, {write_policy}, {pp}{sp})", reqs,
                    page_size, dev, dev, block, budget, schedule_policy, write_policy,
                    storage_tokens=STORAGE_TOKENS, prefetch_policy=prefetch_policy,
                    storage_slowdown=storage_slowdown)


def storage_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """A storage tier (`stored`): pages 64 and 1, fcfs and lpm, write_through, write_back and
    write_through_selective, each prefetch policy (timeout is 0.5.23's default), and prompts
    without a shared system prompt (under write_back the prefetch gate is then the root)."""
    out = []
    for seed, ps, pol, wp, pp, system in (
            (0, 64, "fcfs", "write_through", None, True), (0, 64, "fcfs", "write_through", "best_effort", True),
            (1, 64, "fcfs", "write_back", "best_effort", False), (1, 64, "lpm", "write_back", None, True),
            (1, 1, "lpm", "write_back", "best_effort", True), (0, 1, "fcfs", "write_through", None, True),
            (0, 64, "lpm", "write_through", None, True), (0, 1, "fcfs", "write_back", "best_effort", False),
            (2, 64, "fcfs", "write_through_selective", "wait_complete", True)):
        name = f"stored-s{seed}-p{ps}-{pol}-{wp}-{pp or 'timeout'}" + ("" if system else "-nosystem")
        out.append((name, partial(stored, seed, page_size=ps, schedule_policy=pol, write_policy=wp,
                                  prefetch_policy=pp, system_prompt=system), "rust"))
    return out


# --- issue 43's workload matrix, audited (tests/sglang/README.md, "The workload matrix") ------------
def with_storage(make: Callable[[], Workload], prefetch_policy: str | None = None, *,
                 pools: int | None = None) -> Workload:
    """A workload with a storage tier behind its host pool (SGLang: the file backend,
    sglang0523_storage.py), as `stored` has; `pools`: device and host pools of that many tokens
    each (a host pool that evicts, so that storage serves hits)."""
    w = make()
    w.storage_tokens = STORAGE_TOKENS
    w.prefetch_policy = prefetch_policy
    if pools is not None:
        w.device_pages = w.host_pages = pools // w.page_size
    w.name += f" + storage ({prefetch_policy or 'timeout'}{f', pools {pools}' if pools else ''})"
    return w


DEMO = Path(__file__).resolve().parents[2] / "tierdiag" / "trace" / "samples" / "demo.jsonl"


def crowd(seed: int, *, page_size: int, schedule_policy: str = "fcfs", write_policy: str = "write_through",
          cap: int = 8) -> Workload:
    """Bursts of shared prefixes (`seeded` "burst") whose outputs (24-64 tokens) keep more
    requests running than `--max-running-requests` `cap` lets in: admission stops at the cap
    (`get_num_allocatable_reqs`) and the rest wait for a running request to leave."""
    w = seeded(seed, page_size=page_size, shape="burst", schedule_policy=schedule_policy, write_policy=write_policy,
               outputs=(24, 64))
    w.max_running = cap
    w.name = w.name[:-1] + f", max running {cap})"
    return w


def demo_stored(n: int, prefetch_policy: str) -> Workload:
    """The demo trace's first n requests behind 16,384-token device and host pools with a storage
    tier, as `python -m tests.sglang.drive` builds them (tests/sglang/README.md, "Where it
    differed"): prompts of up to 12,000 tokens that churn both pools, so storage serves hits."""
    from tests.sglang import drive  # it imports this module

    _, w = drive.prepare([str(DEMO), "--requests", str(n), "--device-tokens", "16384", "--host-tokens", "16384",
                          "--storage-tokens", "4000000", "--prefetch-policy", prefetch_policy])
    return w


def matrix_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """The cells the CI cases above left empty (the audit, `matrix`): the conversation slice at
    page 1, on the Python core and with a storage tier, at its rate (under write_back too) and at
    4x (under write_through_selective too); agent sessions with a storage tier and on the Python
    core; bursts of shared prefixes with a storage tier. The conversation's first 24 requests share
    only block 0, which stays on device: their storage tier is written, never read."""
    wts, wb = "write_through_selective", "write_back"
    return [
        ("conversation24-x1-p1-fcfs-write_back-pythoncore",
         partial(mooncake, 24, speedup=1, page_size=1, write_policy=wb), "python"),
        ("conversation24-x4-p64-lpm-write_through_selective-stored",
         partial(with_storage, partial(mooncake, 24, speedup=4, schedule_policy="lpm", write_policy=wts)), "rust"),
        ("conversation24-x1-p64-fcfs-write_through-stored",
         partial(with_storage, partial(mooncake, 24, speedup=1)), "rust"),
        ("conversation24-x4-p1-fcfs-write_through-pythoncore",
         partial(mooncake, 24, speedup=4, page_size=1), "python"),
        # agent sessions behind pools of 2,048 / 3,072 tokens each: histories go to host, then to
        # storage, and come back as storage hits (1,536 and 1,408 tokens)
        ("agentic-s1-p64-lpm-write_through-stored-pythoncore",
         partial(with_storage, partial(agentic, 1, page_size=64), pools=2048), "python"),
        ("agentic-s3-p64-lpm-write_through-stored",
         partial(with_storage, partial(agentic, 3, page_size=64), pools=3072), "rust"),
        # issue 43's driver found these two (tests/engine/test_sglang_0523_storage_locks.py): seed
        # 2 anchors a storage miss on a host leaf another request's hit would evict; demo.jsonl
        # under best_effort ends prefetches before their read's ack (their host memory is freed
        # two drains later)
        ("agentic-s2-p64-lpm-write_through-stored",
         partial(with_storage, partial(agentic, 2, page_size=64), pools=3072), "rust"),
        ("demo24-p64-fcfs-write_through-stored-best_effort", partial(demo_stored, 24, "best_effort"), "rust"),
        # its first 40 differed from step 33 (storage writes' host copies held a pass too long)
        # until the engine's idle passes drained storage as SGLang's idle loop does
        ("demo40-p64-fcfs-write_through-stored-best_effort", partial(demo_stored, 40, "best_effort"), "rust"),
        # bursts with storage: the shared prefixes stay on device (host evictions, no storage hit)
        ("burst-s0-p64-lpm-write_through-stored",
         partial(with_storage, partial(seeded, 0, page_size=64, shape="burst", schedule_policy="lpm"), pools=2048),
         "rust"),
    ]


def capped_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """Bursts that keep more requests running than a small `--max-running-requests` (8, 16)
    allows, given to both sides (the engine's cap, SGLang's ReqToTokenPool rows through its own
    `resolve_max_num_reqs`): admission stops at the cap and resumes as requests finish. Forty
    requests, 20-40 running at the peak without a cap."""
    wts, wb = "write_through_selective", "write_back"
    return [
        ("crowd-s0-p1-fcfs-write_through-cap8", partial(crowd, 0, page_size=1), "rust"),
        ("crowd-s1-p64-lpm-write_back-cap8-pythoncore",
         partial(crowd, 1, page_size=64, schedule_policy="lpm", write_policy=wb), "python"),
        ("crowd-s2-p64-fcfs-write_through_selective-cap16-stored",
         partial(with_storage, partial(crowd, 2, page_size=64, write_policy=wts, cap=16), pools=4096), "rust"),
        ("crowd-s3-p64-lpm-write_through-cap8", partial(crowd, 3, page_size=64, schedule_policy="lpm"), "rust"),
    ]


def long_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """What TIERDIAG_HARNESS_LONG=1 runs besides CI's: the conversation trace's first 2,000 (or
    TIERDIAG_HARNESS_LONG_N) at its rate and at 4x, fcfs + write_through and lpm + write_back."""
    n = long_n()
    return [(f"conversation{n}-x{x}-{p}-{wp}", partial(mooncake, n, speedup=x, schedule_policy=p, write_policy=wp),
             "rust") for x in (1, 4) for p, wp in (("fcfs", "write_through"), ("lpm", "write_back"))]


def _together(w: Workload) -> bool:
    """Two requests arriving at one instant that share their first block (a shared prefix)."""
    seen: dict[tuple[int, int], int] = {}
    for r in w.requests:
        key = (r["arrival_ns"], r["hash_ids"][0])
        seen[key] = seen.get(key, 0) + 1
    return any(n > 1 for n in seen.values())


# issue 43's workload list: each kind, told from the workload itself (or, for the trace's two
# rates, its id)
MATRIX_KINDS: dict[str, Callable[[str, Workload], bool]] = {
    "seeded bursts": lambda cid, w: cid.startswith("burst"),
    "shared prefixes arriving together": lambda cid, w: _together(w),
    "long prompts that chunk": lambda cid, w: any(r["input_len"] > w.max_prefill_tokens for r in w.requests),
    # pools the workload overflows (evictions to host, admissions that wait): the shapes built so
    "memory pressure": lambda cid, w: cid.startswith(("pressure", "tiered", "chunk_host", "stored", "agentic-tiered",
                                                      "conversation")),
    "conversation at its rate": lambda cid, w: cid.startswith("conversation") and "-x1-" in cid,
    "conversation at 4x": lambda cid, w: cid.startswith("conversation") and "-x4-" in cid,
    "agent sessions, closed loop": lambda cid, w: w.closed_loop,
    # more requests running at once than --max-running-requests (capped_cases: 20-40 at the peak
    # without the cap, 8 or 16 with it)
    "concurrency over max_running_requests": lambda cid, w: cid.startswith("crowd"),
}
MATRIX_COLUMNS: dict[str, Callable[[Workload, str], bool]] = {
    "fcfs": lambda w, core: w.schedule_policy == "fcfs",
    "lpm": lambda w, core: w.schedule_policy == "lpm",
    "write_through": lambda w, core: w.write_policy == "write_through",
    "write_back": lambda w, core: w.write_policy == "write_back",
    "write_through_selective": lambda w, core: w.write_policy == "write_through_selective",
    "no storage": lambda w, core: not w.storage_tokens,
    "storage": lambda w, core: bool(w.storage_tokens),
    "page 1": lambda w, core: w.page_size == 1,
    "page 64": lambda w, core: w.page_size == 64,
    "Rust core": lambda w, core: core == "rust",
    "Python core": lambda w, core: core == "python",
}


def ci_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """Every workload CI runs against SGLang (test_scheduler_0523.py, test_scheduler_long.py)."""
    return (seeded_cases() + agentic_cases() + trace_cases() + audit_cases() + storage_cases() + matrix_cases()
            + timed_storage_cases() + capped_cases() + hunt_cases()
            + [(f"chunk_host-s{s}", partial(chunk_host, s), "rust") for s in range(4)])


def matrix(cases) -> dict[tuple[str, str], list[str]]:
    """(kind, column) -> the ids of the cases that cover that cell."""
    out: dict[tuple[str, str], list[str]] = {(k, c): [] for k in MATRIX_KINDS for c in MATRIX_COLUMNS}
    for cid, make, core in cases:
        w = make()
        kinds = [k for k, is_kind in MATRIX_KINDS.items() if is_kind(cid, w)]
        for c, has in MATRIX_COLUMNS.items():
            if has(w, core):
                for k in kinds:
                    out[(k, c)].append(cid)
    return out


def matrix_table(ci: dict, long: dict) -> str:
    """The matrix as markdown: per cell the number of CI cases and one of them, or the long mode's."""
    head = "| workload | " + " | ".join(MATRIX_COLUMNS) + " |"
    lines = [head, "|---" * (len(MATRIX_COLUMNS) + 1) + "|"]
    for k in MATRIX_KINDS:
        cells = []
        for c in MATRIX_COLUMNS:
            ids = ci[(k, c)]
            if ids:
                cells.append(f"{len(ids)}: `{ids[0]}`")
            elif long[(k, c)]:
                cells.append(f"long: `{long[(k, c)][0]}`")
            else:
                cells.append("-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timed_storage_cases() -> list[tuple[str, Callable[[], Workload], str]]:
    """Storage on the virtual clock (`stored` with `storage_slowdown`; sglang0523_storage.TIMING):
    at the engine's own disk price (x1) and at one 100 times slower, arrivals 200 times further
    apart, where a read of 5-12 pages outlasts the `timeout` policy's budget (1 s + 0.25 s a
    Ki-token) and is cut short (`terminate_prefetch`): all of it at page 64 (one 128-page batch),
    its whole batches done at page 1 (partial reads)."""
    out = []
    for seed, ps, pol, wp, pp, system, slow, spacing in (
            (0, 64, "fcfs", "write_through", None, True, 300, 1000),
            (0, 1, "fcfs", "write_through", None, True, 300, 1000),
            (0, 64, "lpm", "write_through", None, True, 100, 200),
            (1, 64, "fcfs", "write_back", None, False, 100, 200),
            (0, 64, "fcfs", "write_through", "best_effort", True, 1, 1),
            (1, 1, "lpm", "write_back", "best_effort", False, 1, 1),
            (2, 64, "fcfs", "write_through_selective", "wait_complete", True, 100, 200)):
        name = (f"timed{slow}-s{seed}-p{ps}-{pol}-{wp}-{pp or 'timeout'}" + ("" if system else "-nosystem"))
        out.append((name, partial(stored, seed, page_size=ps, schedule_policy=pol, write_policy=wp,
                                  prefetch_policy=pp, system_prompt=system, storage_slowdown=slow,
                                  spacing=spacing), "rust"))
    return out



if __name__ == "__main__":  # python -m tests.sglang.scheduler_harness: the matrix for the README
    print(matrix_table(matrix(ci_cases()), matrix(long_cases())))
