"""A replay's engine is freed by the collector once nobody holds it (issue 41, session 34).

Each rank's Scheduler is a cycle with its controller, its bound callbacks and its arrivals (the
`_fn` attributes, `at`, `on_drop`): only the cycle collector frees it. Compiled, the collector
sees a native object's references through its type's tp_traverse, and mypyc visits a field once
for every class of a class's chain that declares it (the struct holds it once). When Scheduler's
`__init__` annotated attributes SchedulerState already declared, Scheduler's tp_traverse visited
them twice: the collector subtracted two references where the Scheduler held one, the object's
count went below zero, read as held from outside, and the whole cycle stayed alive after every
replay (session 33 reverted the mixins' chain for it). These tests run on whichever core is the
default, so an engine change meets them without tests/cli/test_leave_fast.py's library replay."""

from __future__ import annotations

import ast
import collections
import gc
import sys
import types
from pathlib import Path

import pytest

from tests.engine.helpers import PS, Collect, numbered, req, small_config
from tierdiag.engine.engine import Engine
from tierdiag.engine.scheduler import Scheduler

ENGINE = Path(__file__).resolve().parents[2] / "tierdiag" / "engine"
# The Scheduler's chain of native classes, base first (schedule_common.SchedulerState says why)
CHAIN = (("schedule_common.py", "SchedulerState"), ("records.py", "RequestRecords"),
         ("prefetch.py", "StoragePrefetch"), ("decode.py", "DecodeSteps"), ("admission.py", "Admission"),
         ("scheduler.py", "Scheduler"))
SETUPS = {
    "one rank": dict(),
    "one rank, storage": dict(storage_tokens=256 * PS, prefetch_threshold=PS),
    "dp 2, storage": dict(dp=2, router="cache_aware", storage_tokens=256 * PS, prefetch_threshold=PS),
}


def _workload():
    """Conversations whose turns grow a shared prefix, on pools small enough that their pages are
    evicted to host and storage and read back: prefills, chunks, decode runs, finishes, load-backs
    and prefetches, so every callback the Scheduler binds has run."""
    reqs, t = [], 0.0
    for turn in range(6):
        for conv in range(4):
            pages = [conv * 1000 + p for p in range(3 + 2 * turn)]
            reqs.append(req(f"c{conv}t{turn}", t, pages, output=6 + conv))
            t += 3.0
    return numbered(reqs)


def _engine(tmp_path, **kw) -> Engine:
    cfg = small_config(device_tokens=20 * PS, host_tokens=32 * PS, max_prefill_tokens=4 * PS, verify="off",
                       **({"storage_dir": str(tmp_path / "tier")} if "storage_tokens" in kw else {}), **kw)
    engine = Engine(cfg, probe=Collect())
    engine.run(_workload())
    return engine


def _schedulers() -> int:
    return sum(type(o) is Scheduler for o in gc.get_objects())


@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_replayed_engine_is_freed_by_the_collector(tmp_path, setup):
    """Once the caller drops the engine, `gc.collect()` frees every rank's Scheduler (and with it
    its controller, tree and pools): a library, `advise` or a sweep worker replays many times in
    one process."""
    gc.collect()
    before = _schedulers()
    engine = _engine(tmp_path, **SETUPS[setup])
    ranks = len(engine.ranks)
    assert engine.stats.requests_finished == len(_workload()) and engine.stats.load_backs > 0
    assert _schedulers() == before + ranks
    del engine
    gc.collect()
    assert _schedulers() == before, f"{setup}: a replayed engine's schedulers were not collected"


def _reachable(start) -> tuple[dict[int, object], dict[int, tuple[int, ...]]]:
    """The objects reachable from `start` through the collector's eyes (gc.get_referents: each
    type's tp_traverse), stopping at types, modules and functions; each one's referents by id, as
    often as its tp_traverse visits them."""
    objs: dict[int, object] = {}
    edges: dict[int, tuple[int, ...]] = {}
    stack = [start]
    while stack:
        o = stack.pop()
        if id(o) in objs:
            continue
        objs[id(o)] = o
        if isinstance(o, (type, types.ModuleType, types.FunctionType, types.CodeType)):
            edges[id(o)] = ()
            continue
        refs = gc.get_referents(o)
        edges[id(o)] = tuple(id(r) for r in refs)
        stack.extend(r for r in refs if id(r) not in objs)
    return objs, edges


@pytest.mark.parametrize("setup", ["one rank, storage", "dp 2, storage"])
def test_no_object_of_an_engine_is_visited_by_the_collector_more_often_than_it_is_held(tmp_path, setup):
    """The collector subtracts one reference for each visit a tp_traverse makes: an object visited
    more often than it is referenced goes below zero and reads as held from outside, and its cycle
    is never freed (the cause above). Over everything a replayed engine's schedulers reach, no
    object is visited more often than its reference count (less this test's own two)."""
    engine = _engine(tmp_path, **SETUPS[setup])
    objs, edges = _reachable([r.scheduler for r in engine.ranks])
    visits = collections.Counter(i for refs in edges.values() for i in refs)
    held = list(objs.values())
    del objs, edges
    over = []
    for i in range(len(held)):
        refs = sys.getrefcount(held[i]) - 2  # `held`'s slot and the call's argument
        seen = visits[id(held[i])]
        if seen > refs:
            over.append(f"{type(held[i]).__qualname__} {repr(held[i])[:80]}: visited {seen}, held {refs}")
    assert len(held) > 100  # the engine's state, not just the list
    assert not over, f"{setup}: {len(over)} objects visited more often than held, e.g. {over[:5]}"


def _declared(path: Path, cls: str) -> set[str]:
    """The attributes class `cls` of `path` declares: its class-level annotations and every
    annotated `self.name: T = ...` in its methods (mypyc takes both as the class's fields)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            for n in ast.walk(node):
                if (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Attribute)
                        and isinstance(n.target.value, ast.Name) and n.target.value.id == "self"):
                    names.add(n.target.attr)
            return names
    raise AssertionError(f"{path.name}: no class {cls}")


def test_each_attribute_of_the_scheduler_chain_is_declared_by_one_class():
    """The cause, at its source: an attribute declared by two classes of the chain (say in
    SchedulerState and again by an annotation in Scheduler.__init__) is visited twice by the
    compiled Scheduler's tp_traverse. Assign a declared attribute without a type."""
    where: dict[str, list[str]] = {}
    for path, cls in CHAIN:
        for name in _declared(ENGINE / path, cls):
            where.setdefault(name, []).append(cls)
    assert {"running", "waiting", "clock", "_finish_fn"} <= where.keys()  # SchedulerState's fields are read
    twice = {name: classes for name, classes in where.items() if len(classes) > 1}
    assert not twice, f"declared by more than one class of the chain: {twice}"
