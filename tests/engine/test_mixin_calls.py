"""The scheduler mixins' calls of each other (issue 41, session 25): the methods one mixin calls
on another are declared on SchedulerState (compiled: native trait calls), each defined once, with
the declaration's signature; `_leave`'s removal from the running batch by identity; the pool's
free count made at its first read after a change (SlotCore)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine.dataplane import DataPlane
from tierdiag.engine.decode import _drop
from tierdiag.engine.pagepool import PagePool
from tierdiag.engine.request import Req
from tierdiag.native import cplane

ENGINE = Path(__file__).resolve().parents[2] / "tierdiag" / "engine"
MIXINS = ("admission.py", "decode.py", "prefetch.py", "records.py", "scheduler.py")


def _class_methods(path: Path, cls: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
    raise AssertionError(f"{path.name}: no class {cls}")


def _definitions() -> dict[str, list[tuple[str, ast.FunctionDef]]]:
    found: dict[str, list[tuple[str, ast.FunctionDef]]] = {}
    for name in MIXINS:
        tree = ast.parse((ENGINE / name).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for f in node.body:
                    if isinstance(f, ast.FunctionDef):
                        found.setdefault(f.name, []).append((f"{name}:{node.name}", f))
    return found


def _signature(f: ast.FunctionDef) -> str:
    return ast.dump(f.args, annotate_fields=True, include_attributes=False) + " -> " + ast.dump(f.returns or ast.Constant(None))


def test_every_declared_mixin_method_is_defined_once_with_the_declared_signature():
    """A declaration on SchedulerState is what the compiled mixins call through (a vtable slot):
    each must be defined by exactly one mixin or Scheduler, with the same parameters, annotations,
    defaults and return type, so that the native call means what the generic one did. (The
    declarations raise NotImplementedError: Scheduler's MRO puts every definition before them.)"""
    declared = _class_methods(ENGINE / "schedule_common.py", "SchedulerState")
    assert declared, "SchedulerState declares no method"
    defs = _definitions()
    for name, stub in declared.items():
        where = defs.get(name, [])
        assert len(where) == 1, f"{name}: defined {len(where)} times ({[w for w, _ in where]})"
        assert _signature(where[0][1]) == _signature(stub), f"{name}: {where[0][0]}'s signature differs from the declaration"
        body = stub.body[-1]
        assert isinstance(body, ast.Raise), f"{name}: the declaration must only raise"


def test_scheduler_resolves_each_declared_method_to_its_definition():
    from tierdiag.engine import schedule_common
    from tierdiag.engine.scheduler import Scheduler

    declared = _class_methods(ENGINE / "schedule_common.py", "SchedulerState")
    for name in declared:
        impl = getattr(Scheduler, name)
        assert impl is not schedule_common.SchedulerState.__dict__[name], f"Scheduler.{name} is the bare declaration"


def test_the_mixins_are_one_chain_in_the_order_the_four_bases_resolved():
    """The mixins are one single-inheritance chain of native classes (issue 41, session 33: as
    mypyc traits, every `self.attr` in a mixin walked the object's vtable for the trait's offset
    table): Scheduler's MRO is the one `Scheduler(Admission, DecodeSteps, StoragePrefetch,
    RequestRecords)` over a SchedulerState trait resolved to, so every name (and every test's
    patch of a mixin's class attribute) resolves as before."""
    from tierdiag.engine.admission import Admission
    from tierdiag.engine.decode import DecodeSteps
    from tierdiag.engine.prefetch import StoragePrefetch
    from tierdiag.engine.records import RequestRecords
    from tierdiag.engine.schedule_common import SchedulerState
    from tierdiag.engine.scheduler import Scheduler

    chain = [Scheduler, Admission, DecodeSteps, StoragePrefetch, RequestRecords, SchedulerState, object]
    assert list(Scheduler.__mro__) == chain
    for cls, base in zip(chain, chain[1:]):
        assert cls.__bases__ == (base,), f"{cls.__name__}: bases {cls.__bases__}"


def test_a_request_compares_by_identity():
    """`_drop` removes by identity, which is what list.remove compared a Req by: no __eq__."""
    assert Req.__eq__ is object.__eq__


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_drop_removes_the_same_object_list_remove_removes(n, data):
    items = [object() for _ in range(n)]
    target = items[data.draw(st.integers(0, n - 1))]
    want = list(items)
    want.remove(target)
    got = list(items)
    _drop(got, target)
    assert len(got) == len(want) and all(a is b for a, b in zip(got, want))


@pytest.mark.parametrize("absent", [object(), None, 0, "x", float("nan")])
def test_drop_of_what_is_not_there_raises_as_remove_does(absent):
    items = [object(), object()]
    with pytest.raises(ValueError, match="not in list"):
        _drop(items, absent)
    assert len(items) == 2
    with pytest.raises(ValueError):
        _drop([], absent)


def test_drop_takes_the_object_itself_not_an_equal_one():
    class Same:
        def __eq__(self, other):  # equal to everything: remove() would take the first
            return True

        __hash__ = object.__hash__

    a, b = Same(), Same()
    items = [a, b]
    _drop(items, b)
    assert items == [a] and items[0] is a


def _pool(pages: int) -> PagePool:
    return PagePool("host", pages, DataPlane(2, 4, "cpu", False, 1 << 20), on_device=False)


@settings(max_examples=80, deadline=None)
@given(pages=st.integers(1, 64), data=st.data())
def test_free_pages_read_after_any_run_of_allocs_frees_and_sets(pages, data):
    """SlotCore makes its count's int at the first read after a change (a decode step's allocs
    change it several times between reads): whatever ran before a read, it says the free slots."""
    pool = _pool(pages)
    held: list[int] = []
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(("alloc", "free", "read", "set_same")))
        if op == "alloc":
            got = pool.alloc(data.draw(st.integers(1, pages)))
            if got is not None:
                held.extend(got)
        elif op == "free" and held:
            k = data.draw(st.integers(1, len(held)))
            pool.free(held[:k])
            held = held[k:]
        elif op == "set_same":
            pool.free_pages = pool.free_pages  # the setter with an unchanged count
        else:
            assert pool.free_pages == pages - len(held)
        assert pool.free_pages == pages - len(held) and pool.used_pages == len(held)
    pool.check()


@pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")
@pytest.mark.parametrize("value", [2**63, -(2**70), "3", 2.5, None, b"\x00"])
def test_free_pages_set_to_a_hostile_value_raises_and_keeps_the_count(value):
    pool = _pool(8)
    pool.alloc(3)
    assert pool.free_pages == 5
    with pytest.raises((TypeError, OverflowError)):
        pool.free_pages = value
    assert pool.free_pages == 5 and pool.alloc(5) is not None and pool.free_pages == 0
