"""Build small workloads in memory and collect what the engine reports about them."""

from __future__ import annotations

import dataclasses

import pytest

from tierdiag.config.engine import EngineConfig
from tierdiag.engine import compiled
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev
from tierdiag.probes.recorder import Probe
from tierdiag.trace.reader import TraceRequest

PS = 64  # page size used by the narrated tests: one hash id = one page (block_size 64)

# A test that replaces an engine method or class attribute (on an instance or the class): a compiled
# core's classes (mypyc's native classes) cannot be patched, so under it such a test is skipped
# here and run on the Python twin by tests/engine/test_python_twin.py (listed there).
patches_the_engine = pytest.mark.skipif(compiled.is_compiled(), reason="patches the engine's classes: run on the "
                                                                       "Python twin by test_python_twin.py")


class Collect(Probe):
    def __init__(self):
        super().__init__()
        self.records: dict[str, ev.RequestRecord] = {}
        self.evictions: list[ev.Eviction] = []
        self.transfers: list[ev.Transfer] = []
        self.skips: list[ev.LoadBackSkipped] = []
        self.lost: list[ev.PrefixLostPages] = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.RequestFinished):
            self.records[event.record.req_id] = event.record
        elif isinstance(event, ev.Eviction):
            self.evictions.append(event)
        elif isinstance(event, ev.Transfer):
            self.transfers.append(event)
        elif isinstance(event, ev.LoadBackSkipped):
            self.skips.append(event)
        elif isinstance(event, ev.PrefixLostPages):
            self.lost.append(event)


def req(req_id: str, t_ms: float, pages: list[int], *, extra_tokens: int = 1, output: int = 4, seq: int = 0,
        priority: int = 0, extra_key: str | None = None) -> TraceRequest:
    """A request whose input is `pages` (one hash id per page) plus `extra_tokens` more tokens."""
    return TraceRequest(req_id=req_id, seq=seq, line=seq + 1, arrival_ns=int(t_ms * 1e6),
                        input_len=len(pages) * PS + extra_tokens, output_len=output,
                        hash_ids=tuple(pages) + ((max(pages) + 10**6,) if extra_tokens else ()), tokens=None,
                        priority=priority, extra_key=extra_key)


def numbered(requests: list[TraceRequest]) -> list[TraceRequest]:
    out = []
    for i, r in enumerate(requests):
        out.append(TraceRequest(r.req_id, i, i + 1, r.arrival_ns, r.input_len, r.output_len, r.hash_ids, r.tokens,
                                r.priority, r.extra_key))
    return sorted(out, key=lambda r: (r.arrival_ns, r.seq))


def small_config(**kw) -> EngineConfig:
    base = dict(model="tiny", gpu="h100", device_tokens=16 * PS, host_tokens=64 * PS, page_size=PS,
                block_size=PS, verify="all", data_plane_mib=4)
    base.update(kw)
    return EngineConfig(**base)


def run(requests: list[TraceRequest], cfg: EngineConfig | None = None, **kw) -> tuple[Engine, Collect]:
    probe = Collect()
    engine = Engine(cfg or small_config(**kw), probe=probe)
    engine.run(numbered(requests))
    return engine, probe


def path_state(tree, keys: list[int]) -> list[tuple]:
    """The tree nodes along `keys`, without touching or splitting anything: one
    (pages matched in the node, tiers "D"/"H"/"DH", lock_ref, hit_count, host_ref) per node."""
    out = []
    node, i = tree.root, 0
    while i < len(keys):
        child = node.children.get(keys[i])
        if child is None:
            break
        m = 0
        while m < len(child.keys) and i + m < len(keys) and child.keys[m] == keys[i + m]:
            m += 1
        tiers = ("D" if child.device is not None else "") + ("H" if child.host is not None else "")
        out.append((m, tiers, child.lock_ref, child.hit_count, child.host_ref))
        if m < len(child.keys):
            break
        node, i = child, i + m
    return out


class Watch(Collect):
    """Collect, plus snapshots of chosen key paths whenever a request reaches a step:
    `admitted` (PrefixMatched: after match, load-back and locking), `prefilled` (FirstToken: after
    the post-prefill insert), `finished` (RequestFinished: after the finish insert and unlock),
    `batch` (BatchScheduled, by batch id: after the previous batch's chunk inserts). Hooks run
    the test's own callbacks at a step (e.g. to change the pools' surroundings)."""

    STEPS = {ev.PrefixMatched: "admitted", ev.FirstToken: "prefilled"}

    def __init__(self, paths: dict[str, list[int]], hooks=None):
        super().__init__()
        self.paths = paths
        self.hooks = hooks or {}
        self.engine = None
        self.snaps: dict[tuple[str, str], dict] = {}

    def _snap(self, step: str, who: str) -> None:
        tree = self.engine.tree
        self.snaps[(step, who)] = {
            **{name: path_state(tree, keys) for name, keys in self.paths.items()},
            "locked_device_pages": tree.locked_device_pages,
            "host_used_pages": self.engine.host.used_pages,
            "device_used_pages": self.engine.device.used_pages,
        }
        hook = self.hooks.get((step, who))
        if hook is not None:
            hook(self.engine)

    def emit(self, event):
        super().emit(event)
        step = self.STEPS.get(type(event))
        if step is not None:
            self._snap(step, event.req_id)
        elif isinstance(event, ev.RequestFinished) and event.record.status == "finished":
            self._snap("finished", event.record.req_id)
        elif isinstance(event, ev.BatchScheduled):
            self._snap("batch", str(event.batch_id))
        elif isinstance(event, ev.Transfer) and event.kind == "prefetch":
            self._snap("prefetch", event.req_id)

    def at(self, step: str, who: str) -> dict:
        return self.snaps[(step, who)]


def watch(requests: list[TraceRequest], paths: dict[str, list[int]], cfg: EngineConfig | None = None, *,
          hooks=None, **kw) -> tuple[Engine, Watch]:
    probe = Watch(paths, hooks)
    engine = Engine(cfg or small_config(**kw), probe=probe)
    probe.engine = engine
    engine.run(numbered(requests))
    return engine, probe


def price_at_zero(engine: Engine, names: list[str]) -> None:
    """The engine's cost model with the methods `names` at 0 ns, given to every rank's controller
    and scheduler: a subclass (the compiled model's instances take no attribute)."""
    if not names:
        return
    base = engine.cost
    zero = type("ZeroPriced", (type(base),), {n: (lambda self, *args, **kw: 0) for n in names})
    cost = zero(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init})
    engine.cost = cost
    for rank in engine.ranks:
        rank.ctrl.cost = rank.scheduler.cost = cost


def storage_engine(tmp_path, folder: str = "tier", **kw) -> Engine:
    """An engine with a 128-page storage tier in `tmp_path / folder`, prefetching from one page,
    no verification, and storage priced at 0 ns (so a read or write lands at the pass the rules
    say, not later); `kw`: other config keys."""
    cfg = small_config(storage_tokens=128 * PS, prefetch_threshold=PS, storage_dir=str(tmp_path / folder),
                       verify="off", **kw)
    engine = Engine(cfg, probe=Collect())
    price_at_zero(engine, ["storage_ns"])
    return engine


def queued_req(t):
    """Trace request `t` as the scheduler's Req once queued: its page keys, its matchable pages."""
    from tierdiag.engine.request import Req
    from tierdiag.trace.pages import page_keys_array

    r = Req(t, 0)
    r.keys_np = page_keys_array(t, page_size=PS, block_size=PS)
    r.keys = r.keys_np.tolist()
    r.max_match_pages = (t.input_len - 1) // PS
    return r


def tracked_req(seq: int, keys: list[int] | None = None, input_len: int = 1):
    """A Req as engine/miss.py's MissTracker reads it (its seq, page keys and input length; the
    facts it keeps on the request, `Req.miss_*`, at their start), whatever those values."""
    from tierdiag.engine.request import Req

    r = Req(TraceRequest(req_id=f"r{seq}", seq=seq, line=1, arrival_ns=0, input_len=1, output_len=1, hash_ids=None,
                         tokens=None), 0)
    r.keys = list(keys or [])
    r.input_len = input_len
    return r


def store_input_pages(engine: Engine, t) -> None:
    """The input pages of trace request `t` written into the storage tier (nothing on device or host)."""
    from tierdiag.trace.pages import page_keys_array

    keys = page_keys_array(t, page_size=PS, block_size=PS).tolist()[: (t.input_len - 1) // PS]
    host = engine.ctrl.host
    slots = host.alloc(len(keys)).tolist()  # (a slot run, array('q'); the storage tier takes lists)
    engine.ctrl.storage.write_from(host.array, slots, keys, rows=host.rows)
    host.free(slots)


def source_twin(module: str, name: str):
    """engine/`module`.py's source loaded as a plain Python module named `name`, whatever this
    process runs (the compiled core's twin, beside the compiled module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, compiled.source_path(module))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


# The tree changes of the memo tests' op streams (test_refresh_memo, test_requery_memo): each op
# (name, index) takes the index-th node (by id, wrapping) of those the change may apply to.
TREE_CHANGES = {
    "host": (lambda n: n.host is None, None),
    "demote": (lambda n: n.device is not None and n.host is not None and n.lock_ref == 0 and n.n_dev_children == 0,
               "demote"),
    "drop_host": (lambda n: n.device is not None and n.host is not None, "drop_host"),
    "delete": (lambda n: n.lock_ref == 0 and not n.children, "delete"),
}


def pick_node(tree, i: int, ok):
    """The i-th node (by id, wrapping) of `tree`'s nodes that `ok` accepts; None: none does."""
    nodes = sorted((n for n in tree.nodes() if ok(n)), key=lambda n: n.id)
    return nodes[i % len(nodes)] if nodes else None


def change_tree(tree, o: tuple, slots) -> None:
    """Apply a TREE_CHANGES op `o` to `tree` (a host copy takes its slots from `slots`)."""
    ok, method = TREE_CHANGES[o[0]]
    n = pick_node(tree, o[1], ok)
    if n is None:
        return
    if method is None:
        tree.set_host(n, [next(slots) for _ in n.keys])
    else:
        getattr(tree, method)(n)



_CHAIN_FIRST = (-(2**63), 2**63 - 1, 0, -1, 1, 2**62)  # the first keys handed out: int64's edges


def chained_keys(paths: list[list[int]]) -> list[list[int]]:
    """Page keys that chain as trace/pages.py's do, for requests given as paths of branch
    choices (small ints): two requests hold the same key at page i exactly when their paths
    agree up to i, and a key is never met at another page. Keys are distinct int64s spread
    over the whole range, int64's edges first."""
    ids: dict[tuple, int] = {}
    out = []
    for path in paths:
        keys = []
        for i in range(len(path)):
            prefix = tuple(path[:i + 1])
            if prefix not in ids:
                n = len(ids)
                ids[prefix] = (_CHAIN_FIRST[n] if n < len(_CHAIN_FIRST)
                               else ((n * 0x9E3779B97F4A7C15) % 2**64) - 2**63)
            keys.append(ids[prefix])
        out.append(keys)
    return out
