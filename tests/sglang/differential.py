"""The differential driver: the same request sequences through SGLang's own cache code (in a
worker process, tests/sglang/worker.py) and through the engine's tree and controller (here),
compared after every step.

A scenario is pools, policies, the engine's rule set ("rules": "0.5.9" or "0.5.23", passed as
`sglang_rules` once the engine has rule sets), the worker's compat switches and a list of ops:
    {"op": "req", "id", "pages": [page keys], "hold": bool, "priority": int, "chunk": pages}
    ("chunk", 0.5.23 scenarios only: inserted every `chunk` pages past the protected prefix, as a
    chunked prefill's `cache_unfinished_req`, then whole; "finish": then once more, as
    `cache_finished_req` inserts the same pages again)
    {"op": "release", "id"}            (a held request finishes: its lock goes)
A request is matched, locked, admitted when its pages beyond the device prefix fit free +
evictable device memory, its host part loaded back (all or nothing), the rest allocated, the
whole inserted, and unlocked (or held). Copies (the step's queued backups flushed as one)
complete at the end of each step on both sides.
Page keys are prefix-chained (a key names its prefix), as the engine's are; SGLang gets tokens
[k] * page_size for page k, so both trees hold the same pages.

After every step both sides report: device pages matched, host_hit_length, pages loaded,
admitted, cache_protected_len, every page's (tiers, lock_ref, hit_count), evictable and
protected device pages, free device and host pages, and the step's evictions in order
(tier, action, first page, pages).
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tierdiag.config.engine import EngineConfig
from tierdiag.engine.engine import Engine
from tierdiag.engine.controller import CallClock

WORKER = Path(__file__).with_name("worker.py")
# The differences found between the engine and SGLang 0.5.9 (docs/engine.md, issue 29); the
# worker can make SGLang behave as the engine did for each (sglang059.py). The engine's 0.5.9
# rule set now follows all five (engine/rules.py): none is left to switch off.
FIXED_059 = ("split_access", "split_creation", "insert_priority", "evict_amount", "mru_ties")
KNOWN_059: tuple[str, ...] = ()
# The rules in which SGLang 0.5.23 differed from the engine as it followed 0.5.9 (docs/engine.md,
# "What 0.5.23 changes, measured"); the worker can make 0.5.23 behave as the old engine did for
# each (sglang0523.py). The 0.5.23 rule set implements all four: none is left to switch off.
FIXED_0523 = ("alloc_page", "split_access", "unevict_hit", "host_duplicates")
KNOWN_0523: tuple[str, ...] = ()
COMPARED = ("device", "host_hit", "loaded", "admitted", "protected_len", "pages", "evictable", "protected",
            "device_free", "host_free", "evictions")


class Worker:
    """One long-lived worker process per SGLang version: a scenario a line, an answer a line."""

    def __init__(self, version: str, root: Path):
        self.version = version
        self.proc = subprocess.Popen([sys.executable, str(WORKER), version, str(root)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = self.proc.stdout.readline()
        if not ready.startswith('{"ready"'):
            self.close()
            raise RuntimeError(f"SGLang {version}'s worker did not start (imports failed): {ready!r}")

    def run(self, scenario: dict) -> dict:
        self.proc.stdin.write(json.dumps(scenario) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"SGLang {self.version}'s worker died on a scenario")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


# --- the engine side -----------------------------------------------------------------------------
class EngineSide:
    """The engine's tree and controller, driven in the order of Scheduler._admit, _insert and
    _finish (tierdiag/engine/decode.py), one request at a time."""

    def __init__(self, sc: dict):
        ps = sc["page_size"]
        self.ps = ps
        rules = {}
        if "rules" in sc and "sglang_rules" in {f.name for f in dataclasses.fields(EngineConfig)}:
            # The scenario names the SGLang version whose rules the engine follows (issue 29's
            # `sglang_rules`); an engine without rule sets follows 0.5.9 whatever is asked.
            rules["sglang_rules"] = sc["rules"]
        cfg = EngineConfig(model="tiny", gpu="h100", page_size=ps, block_size=ps,
                           device_tokens=sc["device_pages"] * ps, host_tokens=sc["host_pages"] * ps,
                           write_policy=sc["write_policy"], eviction_policy=sc["eviction_policy"],
                           verify="all", data_plane_mib=4, **rules)
        self.engine = Engine(cfg, probe=None)
        self.tree, self.ctrl = self.engine.tree, self.engine.ctrl
        self.queue: list = []
        self.ctrl.clock = CallClock(lambda t, fn, arg: self.queue.append((fn, arg)))  # copies: done at the step's end
        self.threshold = {"write_through": 1, "write_through_selective": 2}.get(sc["write_policy"])
        self.held: dict = {}
        self.log: list = []
        def log(node, tier, action):
            self.log.append([tier, action, node.keys[0], len(node.keys)])

        if hasattr(self.ctrl, "on_eviction"):  # the controller's hook (a compiled one cannot be wrapped)
            self.ctrl.on_eviction = log
        else:  # an engine before the hook (a baseline checkout)
            record = self.ctrl.record_eviction

            def logged(node, tier, action, cause, now_ns):
                log(node, tier, action)
                return record(node, tier, action, cause, now_ns)

            self.ctrl.record_eviction = logged

    def request(self, op: dict, now: int) -> dict:
        tree, ctrl = self.tree, self.ctrl
        ctrl.ack_loads()  # a step is a scheduling pass: the load-backs before it are acknowledged
        keys = op["pages"]
        m = tree.match(keys, now, op["id"])
        dev, host_nodes = m.device_pages, m.host_nodes
        out = {"device": dev, "host_hit": m.host_pages, "loaded": 0, "admitted": False}
        dev_node = m.last_device_node or tree.root
        tree.inc_lock(dev_node)
        if len(keys) - dev > ctrl.device.free_pages + tree.evictable_device_pages:
            tree.dec_lock(dev_node)
            return out
        tiered = m.host_pages
        load = tiered > 0 and tiered * self.ps >= self.engine.cfg.load_back_threshold
        lb = None
        if load:
            tree.protect_host(host_nodes[-1])
            if ctrl.evict_device(tiered, op["id"], now):
                lb = ctrl.device.alloc(tiered)  # the load's slots first (HiCacheController.load)
            else:
                load = False
                tree.release_host(host_nodes[-1])
        prefix = dev + tiered if load else dev
        need = len(keys) - prefix
        # alloc_paged_token_slots_extend: evict for the extend plus a page (the rule set's amount)
        assert ctrl.evict_device(need, op["id"], now, reserve_pages=ctrl.rules.alloc_overhead_pages), \
            "admitted, but eviction could not make room"
        slots = ctrl.device.alloc(need)
        lock = dev_node
        if load:  # the host part stays protected until the allocation is done (Scheduler._admit)
            tree.release_host(host_nodes[-1])
            ctrl.load_back(host_nodes, lb, op["id"], now, keys[dev:dev + tiered])
            lock = host_nodes[-1]
            tree.inc_lock(lock)
            tree.dec_lock(dev_node)
            out["loaded"] = tiered
        ctrl.write_computed(slots, keys[prefix:])
        # Scheduler._insert once a chunk (op "chunk"; the last insert is the whole), each under
        # the rule set's hit rule: 0.5.23 counts what ends past the request's earlier inserts,
        # 0.5.9 nothing in a chunk insert.
        ends = chunk_ends(prefix, len(keys), op.get("chunk"))
        own_from, inserted = prefix, 0
        for end in ends:
            chunk = end != ends[-1]
            if ctrl.rules.hits_past_inserted:
                count, past = self.threshold is not None, inserted
            else:
                count, past = self.threshold is not None and not chunk, 0
            last, dups, _fresh, hit = tree.insert(keys[:end], own_from, slots[own_from - prefix:end - prefix], now,
                                                  op["id"], count_hits=count, priority=op.get("priority", 0),
                                                  inserted=past)
            ctrl.device.free(dups)
            own_from = inserted = end
            if last is not lock:
                tree.inc_lock(last)
                tree.dec_lock(lock)
                lock = last
            if self.threshold is not None:
                for node in hit:
                    if node.host is None and node.device is not None and node.hit_count >= self.threshold:
                        ctrl.backup(node, op["id"], now)
        if op.get("finish"):  # Scheduler._finish's insert of the same pages (no output pages here)
            past = inserted if ctrl.rules.hits_past_inserted else 0
            last, _, _, hit = tree.insert(keys, len(keys), [], now, op["id"], count_hits=self.threshold is not None,
                                          priority=op.get("priority", 0), inserted=past)
            if last is not lock:
                tree.inc_lock(last)
                tree.dec_lock(lock)
            if self.threshold is not None:
                for node in hit:
                    if node.host is None and node.device is not None and node.hit_count >= self.threshold:
                        ctrl.backup(node, op["id"], now)
        if op.get("hold"):
            self.held[op["id"]] = last
        else:
            tree.dec_lock(last)
        out.update(admitted=True, protected_len=prefix)
        return out

    def release(self, op: dict, now: int) -> dict:
        node = self.held.pop(op["id"], None)  # None: the request was never admitted
        if node is not None:
            self.tree.dec_lock(node)
        return {}

    def state(self) -> dict:
        tree = self.tree
        pages = {}
        for node in tree.nodes():
            tiers = ("D" if node.device is not None else "") + ("H" if node.host is not None else "")
            for k in node.keys:
                pages[str(k)] = [tiers, node.lock_ref, node.hit_count]
        locked_dev = sum(len(n.keys) for n in tree.nodes() if n.lock_ref and n.device is not None)
        return {"pages": pages, "evictable": tree.evictable_device_pages, "protected": locked_dev,
                "device_free": self.ctrl.device.free_pages, "host_free": self.ctrl.host.free_pages}


def run_engine(sc: dict) -> list:
    side = EngineSide(sc)
    steps = []
    for t, op in enumerate(sc["ops"], start=1):
        side.log = []
        out = side.request(op, t) if op["op"] == "req" else side.release(op, t)
        # the step's queued backups go out as one copy at its end (0.5.23 flush_pending_backups,
        # the batch's result processing; 0.5.9 copied each at once and queued none)
        side.ctrl.flush_backups(t)
        for fn, arg in side.queue:
            fn(arg)
        side.queue.clear()
        out.update(side.state(), evictions=side.log)
        steps.append(out)
    side.engine.tree  # noqa: B018  (kept alive to the end)
    return steps


# --- comparing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Divergence:
    step: int  # 1-based op index
    op: dict
    fields: dict  # field -> (sglang, engine)
    error: str | None = None

    def __str__(self) -> str:
        if self.error:
            return f"step {self.step} {self.op}: SGLang raised {self.error}"
        lines = [f"step {self.step} {self.op}:"]
        for name, (s, e) in self.fields.items():
            if name == "pages":
                keys = [k for k in sorted(set(s) | set(e), key=int) if s.get(k) != e.get(k)]
                s, e = {k: s.get(k) for k in keys}, {k: e.get(k) for k in keys}
            lines.append(f"  {name}: sglang={s} engine={e}")
        return "\n".join(lines)


def first_divergence(worker: Worker, sc: dict) -> Divergence | None:
    theirs = worker.run(sc)
    ours = run_engine(sc)
    for i, (s, e) in enumerate(zip(theirs["steps"], ours), start=1):
        diff = {f: (s.get(f), e.get(f)) for f in COMPARED if s.get(f) != e.get(f)}
        if diff:
            return Divergence(i, sc["ops"][i - 1], diff)
    if "error" in theirs:
        n = len(theirs["steps"]) + 1
        return Divergence(n, sc["ops"][n - 1], {}, theirs["error"])
    return None


def shrink(worker: Worker, sc: dict, found: Divergence) -> tuple[dict, Divergence]:
    """The fewest ops that still diverge: cut everything after the divergence, then drop ops one
    by one (a release goes with its request) while a divergence remains."""
    ops = sc["ops"][:found.step]
    best = found
    i = 0
    while i < len(ops):
        drop = ops[i]
        trial = [op for j, op in enumerate(ops) if j != i and not (drop["op"] == "req" and op["op"] == "release"
                                                                  and op["id"] == drop["id"])]
        if drop["op"] == "release":  # a held request's lock must go somewhere: keep it held
            i += 1
            continue
        d = first_divergence(worker, {**sc, "ops": trial}) if trial else None
        if d is not None:
            ops, best = trial[:d.step], d
        else:
            i += 1
    return {**sc, "ops": ops}, best


# --- scenarios -----------------------------------------------------------------------------------
def chunk_ends(protected: int, total: int, chunk: int | None) -> list[int]:
    """Where a request's inserts end, in pages: every `chunk` pages past the protected prefix,
    then the whole (sglang0523.chunk_ends cuts SGLang's the same way)."""
    if not chunk:
        return [total]
    return list(range(protected + chunk, total, chunk)) + [total]


def random_scenario(seed: int, *, n_ops: int = 40, device_pages: int = 24, host_pages: int = 40,
                    write_policy: str = "write_through", eviction_policy: str = "lru", chunks: bool = False) -> dict:
    """Requests over a tree of page keys (fresh keys per branch, so keys chain): shared prefixes,
    branches (splits), repeats (hits, load-backs once evicted), held requests (locks), priorities;
    with `chunks`, about half the requests are inserted a chunk of 1-3 pages at a time (a
    chunked prefill's inserts) and about half inserted once more after (their finish), drawn
    after the rest so the sequence is otherwise the same."""
    rnd = random.Random(seed)
    paths: list[list[int]] = [[]]
    next_key = 1
    ops: list[dict] = []
    held: list[str] = []
    for i in range(n_ops):
        if held and rnd.random() < 0.25:
            ops.append({"op": "release", "id": held.pop(rnd.randrange(len(held)))})
            continue
        base = rnd.choice(paths)
        keep = base[:rnd.randint(0, len(base))]
        if rnd.random() < 0.35 and base:
            pages = base[:]  # a repeat
        else:
            extra = rnd.randint(1, 6)
            pages = keep + list(range(next_key, next_key + extra))
            next_key += extra
            paths.append(pages)
        pages = pages[:device_pages // 2]
        if not pages:
            continue
        rid = f"r{i}"
        hold = rnd.random() < 0.2 and len(held) < 2
        ops.append({"op": "req", "id": rid, "pages": pages, "hold": hold, "priority": rnd.choice((0, 0, 1, 5))})
        if hold:
            held.append(rid)
    if chunks:
        cut = random.Random(seed + 10_000)
        for op in ops:
            if op["op"] == "req" and cut.random() < 0.5:
                op["chunk"] = cut.randint(1, 3)
            if op["op"] == "req" and cut.random() < 0.5:
                op["finish"] = True
    ops += [{"op": "release", "id": r} for r in held]
    return {"page_size": 4, "device_pages": device_pages, "host_pages": host_pages, "write_policy": write_policy,
            "eviction_policy": eviction_policy, "ops": ops}


def mooncake_scenario(path: Path, n: int, *, device_pages: int, host_pages: int, **kw) -> dict:
    """The first n requests of a Mooncake trace (hash_ids are prefix-chained page keys), in order,
    each on its own (one request a step; a hash id is one page of 4 tokens here)."""
    ops = []
    with path.open() as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            ids = json.loads(line)["hash_ids"]
            ops.append({"op": "req", "id": f"m{i}", "pages": [h + 1 for h in ids[:device_pages // 2]]})
    return {"page_size": 4, "device_pages": device_pages, "host_pages": host_pages, "ops": ops,
            "write_policy": kw.get("write_policy", "write_through"), "eviction_policy": kw.get("eviction_policy", "lru")}
