"""A rank's plain decode steps run ahead (DecodeSteps._decode_ahead's loop): the data plane's C
(csrc/router.c `decode_steps`, through decode.decode_steps_c) and its reference
(decode.decode_steps_py) run the same steps: the same decode clock, end, step count and ratio,
the same pages given at the same steps, the same wakes, on any state (issue 41 session 26: the
loop was ~300 instructions a step compiled, ~2.7 M steps a --dp 8 conversation replay).

Hostile states: clocks and step numbers near and past int64 (the C runs to the step whose
values leave it and the reference runs on from there), zero, negative and NaN step times, a
limit already met or none, gives that free nothing or everything. A replay's rows are held to
the reference by the compiled-vs-Python and C-vs-numpy replays of the other test files."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.config.engine import EngineConfig
from tierdiag.config.profile import CLOCK_PARAMS
from tierdiag.engine import decode
from tierdiag.engine.costmodel import CostModel
from tierdiag.native import cplane

_ROOFLINE = CostModel.from_config(EngineConfig())
_I64 = 2**63


def _cost(fitted: bool, step: float, per_token: float) -> CostModel:
    if not fitted:
        return _ROOFLINE
    clock = {name: 1.0 for name in CLOCK_PARAMS}
    clock.update(decode_step_ns=step, decode_ns_per_context_token=per_token)
    return dataclasses.replace(_ROOFLINE, clock=clock)


class _Rank:
    """A ring of `ps` slots (a slot not empty: pages due at its step) and a give that empties
    the slot, notes the step and answers the free pages from `frees` in turn (as _give_step)."""

    def __init__(self, ps: int, due: set[int], frees: list[int]):
        self.ring = [[object()] if i in due else [] for i in range(ps)]
        self.frees = list(frees)
        self.given: list[int] = []

    def give(self, k: int) -> int:
        self.ring[k % len(self.ring)] = []
        self.given.append(k)
        return self.frees[(len(self.given) - 1) % len(self.frees)]


def _both(ps, due, frees, k, end, limit, fin_step, base, n, ratio, cost, with_wakes):
    """Each side's answer, pages given, ring and wakes (on the numpy data plane, where decode_steps_c
    has no C to call and is never chosen, the reference twice)."""
    c_side = decode.decode_steps_c if cplane.compiled("decode_steps") is not None else decode.decode_steps_py
    out = []
    for steps in (c_side, decode.decode_steps_py):
        rank = _Rank(ps, due, frees)
        wakes = [] if with_wakes else None
        try:
            got = steps(rank.ring, ps, k, end, limit, fin_step, base, n, ratio, cost, wakes, rank.give)
        except (OverflowError, ValueError) as exc:  # int() of a NaN or infinite step time: the reference's error
            got = type(exc)
        out.append((got, rank.given, [len(s) for s in rank.ring], wakes))
    return out


@settings(max_examples=400, deadline=None)
@given(ps=st.sampled_from([1, 2, 16, 64]), data=st.data(), k=st.one_of(st.integers(0, 10**6), st.integers(_I64 - 300, _I64 + 5)),
       end=st.one_of(st.integers(0, 10**15), st.integers(_I64 - 10**12, _I64 + 5), st.integers(-(10**9), -1)),
       bounded=st.booleans(), span=st.integers(-10, 10**9), fin_in=st.integers(2, 200),
       base=st.one_of(st.integers(0, 10**7), st.integers(-(10**7), -1), st.integers(_I64 - 10**6, _I64 + 10**6)),
       n=st.integers(1, 64), ratio=st.floats(allow_nan=False, allow_infinity=False, width=64),
       fitted=st.booleans(), step=st.one_of(st.floats(-1e4, 1e7), st.sampled_from([0.0, 1e18, 9.3e18, math.nan])),
       per_token=st.one_of(st.floats(-10.0, 1e3), st.sampled_from([0.0, 1e12, math.inf])), with_wakes=st.booleans())
def test_c_steps_are_the_reference_steps(ps, data, k, end, bounded, span, fin_in, base, n, ratio, fitted, step,
                                         per_token, with_wakes):
    due = set(data.draw(st.lists(st.integers(0, ps - 1), max_size=ps)))
    frees = data.draw(st.lists(st.integers(0, 2 * n), min_size=1, max_size=4))
    cost = _cost(fitted, step, per_token)
    limit = end + span if bounded else None
    c_side, py_side = _both(ps, due, frees, k, end, limit, k + fin_in, base, n, ratio, cost, with_wakes)
    assert c_side == py_side


class _EmptyList(list):
    """An empty slot that is not an exact list (the C's loop of plain steps leaves it to its own
    step, which reads it as any list)."""


class _Meddling(_Rank):
    """_Rank whose give also changes the ring as no scheduler does: another slot filled or
    emptied, a slot made an empty list subclass, the ring grown or shrunk (a slot is a list: the
    compiled reference refuses anything else, as its type says)."""

    def __init__(self, ps: int, due: set[int], frees: list[int], moves: list[tuple[str, int]]):
        super().__init__(ps, due, frees)
        self.moves = moves

    def give(self, k: int) -> int:
        free = super().give(k)
        kind, i = self.moves[(len(self.given) - 1) % len(self.moves)]
        ring = self.ring
        at = i % len(ring)
        if kind == "fill":
            ring[at] = [object()]
        elif kind == "empty":
            ring[at] = []
        elif kind == "subclass":
            ring[at] = _EmptyList()
        elif kind == "grow":
            ring.append([])
        elif kind == "shrink" and len(ring) > 1:
            ring.pop()
        return free


# The C's plain steps run in a loop of their own (issue 41 session 38: a step whose slot is an
# empty list, without wakes, not the step the finish stops the run after); every other step in
# the loop beside it. Both loops against the reference: any finish step (before, at and long
# after the first), long runs without a give, a ratio that reaches its floor, a limit met
# exactly, and gives that change the ring under the loop.
@settings(max_examples=400, deadline=None)
@given(ps=st.sampled_from([1, 2, 3, 16, 64]), data=st.data(), k=st.one_of(st.integers(0, 10**6), st.integers(_I64 - 40, _I64 - 1)),
       end=st.one_of(st.integers(0, 10**12), st.integers(_I64 - 10**7, _I64 - 1)),
       bounded=st.booleans(), span=st.one_of(st.integers(0, 10**8), st.just(0)), n=st.integers(1, 8),
       ratio=st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.7, 0.1, 0.0999, -1.0])),
       with_wakes=st.booleans(),
       moves=st.lists(st.tuples(st.sampled_from(["none", "fill", "empty", "subclass", "grow", "shrink"]),
                                st.integers(0, 70)), min_size=1, max_size=5))
def test_the_plain_steps_loop_is_the_reference(ps, data, k, end, bounded, span, n, ratio, with_wakes, moves):
    # (a finish step the run never meets, at or before k + 1 or past int64, only where a limit ends
    # it: the reference would run on for ever)
    fin_in = data.draw(st.one_of(st.integers(-3, 3000), st.just(_I64)) if bounded else st.integers(2, 3000))
    due = set(data.draw(st.lists(st.integers(0, ps - 1), max_size=2)))
    frees = data.draw(st.lists(st.integers(0, 2 * n), min_size=1, max_size=3))
    limit = end + span if bounded else None
    c_side = decode.decode_steps_c if cplane.compiled("decode_steps") is not None else decode.decode_steps_py
    out = []
    for steps in (c_side, decode.decode_steps_py):
        rank = _Meddling(ps, due, frees, moves)
        wakes = [] if with_wakes else None
        try:
            got = steps(rank.ring, ps, k, end, limit, k + fin_in, 1000, n, ratio, _ROOFLINE, wakes, rank.give)
        except (OverflowError, IndexError) as exc:  # (a step past int64's k; a ring shrunk under the reference)
            got = type(exc)
        out.append((got, rank.given, [len(s) for s in rank.ring], wakes))
    assert out[0] == out[1]


def test_the_c_loop_runs_where_it_is_built():
    """On the compiled data plane the C answers a plain state itself (done), and declines other
    types (-1, nothing changed); the numpy data plane runs the reference."""
    native = cplane.compiled("decode_steps")
    if native is None:
        assert decode.decode_steps is decode.decode_steps_py
        pytest.skip("the data plane is not compiled")
    assert decode.decode_steps is decode.decode_steps_c
    c = _ROOFLINE
    clock = (c._decode_fitted, c._decode_base, c._decode_per_token, c.kv_bytes_per_token, float(c.hbm_bytes_per_s),
             c._decode_overhead_ns, decode.NEW_TOKEN_RATIO_DECAY, decode.MIN_NEW_TOKEN_RATIO)
    rank = _Rank(4, {2}, [10])
    args = [rank.ring, 4, 0, 100, None, 5, 1000, 2, 0.7, clock, None, rank.give]
    got = native(*args)
    assert got[0] == 4 and got[3] is True and rank.given == [2]
    want = decode.decode_steps_py(_Rank(4, {2}, [10]).ring, 4, 0, 100, None, 5, 1000, 2, 0.7, c, None,
                                  _Rank(4, {2}, [10]).give)
    assert (got[0], got[1], 4, got[2], got[3]) == want
    for i, bad in [(0, tuple(rank.ring)), (1, 4.0), (2, True), (8, 1), (9, clock[:7]), (9, (1,) + clock[1:]),
                   (9, clock[:3] + (1.0,) + clock[4:]), (10, ()), (2, -1)]:
        assert native(*args[:i], bad, *args[i + 1:]) == -1
    args[0] = [[], [], [], [object()]]
    args[11] = lambda k: "no"
    with pytest.raises(TypeError, match="not the free pages"):
        native(*args)
