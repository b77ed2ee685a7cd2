"""The scheduler harness's own parts, without SGLang: the workloads it builds, the token ids it
gives SGLang, the engine side's steps and the comparison (a planted difference is found at its
step; a run compared with itself is clean)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sglang import scheduler_harness as H
from tests.sglang.token_ids import OUTPUT_TOKEN_BASE, input_tokens
from tierdiag.trace.pages import page_keys

SHAPES = ("burst", "chunk", "pressure", "tiered")


def _chained(reqs: list[dict]) -> None:
    """Prefix-chained hash ids: an id always follows the same prefix."""
    seen: dict[int, tuple] = {}
    for r in reqs:
        for b, h in enumerate(r["hash_ids"]):
            prefix = tuple(r["hash_ids"][:b])
            assert seen.setdefault(h, prefix) == prefix, f"hash id {h} follows two prefixes"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(-2**31, 2**31), shape=st.sampled_from(SHAPES), ps=st.sampled_from((1, 64)),
       pol=st.sampled_from(("fcfs", "lpm")), wp=st.sampled_from(H.WRITE_POLICIES))
def test_seeded_workloads_are_valid_traces(seed, shape, ps, pol, wp):
    w = H.seeded(seed, page_size=ps, shape=shape, schedule_policy=pol, write_policy=wp)
    ids = [r["id"] for r in w.requests]
    assert len(set(ids)) == len(ids)
    arrivals = [r["arrival_ns"] for r in w.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    for r in w.requests:
        assert 0 < r["input_len"] <= len(r["hash_ids"]) * w.block_size
        assert r["output_len"] >= 1
        assert len(input_tokens(r, w.block_size)) == r["input_len"]
    _chained(w.requests)
    assert w.block_size % ps == 0 and w.host_pages >= w.device_pages
    # the pool holds the largest request (else both sides would reject it, comparing nothing)
    assert max(r["input_len"] + r["output_len"] for r in w.requests) < w.device_pages * ps
    assert w.context_len() > max(r["input_len"] + r["output_len"] for r in w.requests)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**9), ps=st.sampled_from((1, 64)), sessions=st.integers(1, 5), turns=st.integers(1, 5))
def test_agentic_sessions_grow_their_context(seed, ps, sessions, turns):
    w = H.agentic(seed, sessions=sessions, turns=turns, page_size=ps)
    assert w.closed_loop and len(w.requests) == sessions * turns
    by_session: dict[str, list[dict]] = {}
    for r in w.requests:
        by_session.setdefault(r["session"], []).append(r)
        assert r["think_ns"] >= 0 and r["think_ns"] % 1_000_000 == 0
    for turns_ in by_session.values():
        for a, b in zip(turns_, turns_[1:]):
            assert b["hash_ids"][:len(a["hash_ids"])] == a["hash_ids"], "a turn resends the history"
    _chained(w.requests)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), block=st.sampled_from((1, 16, 64, 512)))
def test_token_ids_share_exactly_the_pages_the_engine_shares(data, block):
    """Two requests' token ids agree on a page exactly where the engine's page keys agree."""
    ps = data.draw(st.sampled_from([p for p in (1, 4, 16, 64) if block % p == 0]))
    common = data.draw(st.lists(st.integers(0, 5000), max_size=4, unique=True))
    a = common + data.draw(st.lists(st.integers(5001, 9000), max_size=3, unique=True))
    b = common + data.draw(st.lists(st.integers(9001, 12000), max_size=3, unique=True))
    reqs = []
    for ids in (a, b):
        if not ids:
            return
        n = data.draw(st.integers((len(ids) - 1) * block + 1, len(ids) * block))
        reqs.append({"id": "x", "input_len": n, "hash_ids": ids})
    ta, tb = (input_tokens(r, block) for r in reqs)
    from tierdiag.trace.reader import TraceRequest

    ka, kb = (page_keys(TraceRequest("x", 0, 1, 0, r["input_len"], 1, tuple(r["hash_ids"]), None), page_size=ps,
                        block_size=block) for r in reqs)
    for p in range(min(len(ka), len(kb))):
        assert (ka[p] == kb[p]) == (ta[p * ps:(p + 1) * ps] == tb[p * ps:(p + 1) * ps])
    assert max(ta + tb) < OUTPUT_TOKEN_BASE


@settings(max_examples=40, deadline=None)
@given(n=st.integers(-5, 3000), ids=st.lists(st.integers(-3, 2**31), max_size=8), block=st.sampled_from((1, 64, 512)))
def test_token_ids_refuse_what_they_cannot_represent(n, ids, block):
    """Hostile requests: too few hash ids, negative or huge ones, a negative length: a ValueError
    naming the request, never wrong ids."""
    r = {"id": "bad", "input_len": n, "hash_ids": ids}
    try:
        out = input_tokens(r, block)
    except ValueError as exc:
        assert "bad" in str(exc)
        return
    assert len(out) == n and all(0 < t < OUTPUT_TOKEN_BASE for t in out)


def _run(steps_members: list[list[list]]) -> dict:
    steps, cum = [], 0
    for i, members in enumerate(steps_members):
        steps.append({"t": i * 10, "kind": "prefill", "members": members, "evicted_before": [cum, 0]})
        cum += 64
        steps.append({"t": i * 10 + 5, "kind": "decode", "members": [m[0] for m in members],
                      "evicted_before": [cum, 0]})
        cum += 64  # a decode step's allocation evicts too
    steps.append({"t": 999, "kind": "end", "members": [], "evicted_before": [cum, 0]})
    return {"steps": steps, "requests": {}}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_compare_finds_a_planted_difference_at_its_step(data):
    nsteps = data.draw(st.integers(1, 8))
    members = [[[f"r{i}-{j}", data.draw(st.integers(1, 4096)), data.draw(st.integers(0, 4096)), 0]
                for j in range(data.draw(st.integers(1, 3)))] for i in range(nsteps)]
    w = H.Workload("t", [], 64, 10, 20, 64, 1024)
    theirs = _run(members)
    assert H.compare(w, theirs, copy.deepcopy(theirs), ()).clean
    k = data.draw(st.integers(0, nsteps - 1))
    field = data.draw(st.sampled_from((1, 2, 3)))
    planted = copy.deepcopy(members)
    planted[k][0][field] += data.draw(st.integers(1, 10**6))
    rep = H.compare(w, theirs, _run(planted), ())
    assert rep.differing_steps == 1 and f"#{k + 1} " in rep.first_step
    # windows: what the decode steps between two prefill steps evicted counts in the one before
    assert [s["evicted"] for s in H.prefill_steps(theirs["steps"])] == [[128, 0]] * nsteps


def test_compare_reports_sglang_errors_and_missing_requests():
    w = H.Workload("t", [{"id": "a"}, {"id": "b"}], 64, 10, 20, 64, 1024)
    rep = H.compare(w, {"error": "RuntimeError: boom", "trace": ""}, {"steps": [], "requests": {}}, ())
    assert not rep.clean and "boom" in rep.summary()
    ours = {"steps": [{"kind": "end", "members": [], "evicted_before": [0, 0]}],
            "requests": {"a": {"device": 0, "host": 0, "storage": 0, "computed": 5, "ttft_ns": 7}}}
    theirs = {"steps": [{"t": 0, "kind": "end", "members": [], "evicted_before": [0, 0]}], "requests": {}}
    rep = H.compare(w, theirs, ours, ())
    assert rep.differing_requests == 1 and "request a" in rep.first_request


@pytest.mark.parametrize("value,long", [("1", True), ("0", False), ("", False), ("yes", False), (" 1", False)])
def test_long_mode_only_on_one(monkeypatch, value, long):
    """TIERDIAG_HARNESS_LONG=1, and only that, asks for the issue's sizes (2,000 requests)."""
    import importlib

    monkeypatch.setenv("TIERDIAG_HARNESS_LONG", value)
    mod = importlib.reload(H)
    try:
        assert mod.LONG is long
        assert any(cid.startswith("conversation2000") for cid, _, _ in mod.trace_cases()) is long
    finally:
        monkeypatch.delenv("TIERDIAG_HARNESS_LONG")
        importlib.reload(H)


def test_engine_side_records_every_batch_once():
    """The engine side's steps are its batches (one Scheduler.schedule_pass call that formed one), with
    every request's chunks adding up to its computed tokens."""
    w = H.seeded(0, page_size=64, shape="chunk")
    ours = H.run_engine(w, ())
    steps = [s for s in ours["steps"] if s["kind"] == "prefill"]
    assert steps and all(s["members"] for s in steps)
    done: dict[str, int] = {}
    for s in steps:
        for rid, ext, pre, _ in s["members"]:
            assert pre == done.get(rid, pre), f"{rid}: a chunk starts where the last ended"
            done[rid] = pre + ext
    for r in w.requests:
        rec = ours["requests"][r["id"]]
        assert done[r["id"]] == r["input_len"]
        assert rec["device"] + rec["host"] + rec["storage"] + rec["computed"] == r["input_len"]


@settings(max_examples=60, deadline=None)
@given(raw=st.one_of(st.text(max_size=12), st.integers(-10**6, 10**6).map(str),
                     st.sampled_from(["", " ", "0", "-1", "1e3", "２", "0x10", "100\n", "007", "1.5"])))
def test_long_n_is_a_positive_integer_or_one_line_error(raw):
    """TIERDIAG_HARNESS_LONG_N, the long mode's size knob: unset or blank is the issue's 2,000;
    ASCII digits naming a positive integer are that size; anything else is a one-line error
    naming the variable (never a silent other size)."""
    env = {"TIERDIAG_HARNESS_LONG_N": raw}
    s = raw.strip()
    if not s:
        assert H.long_n(env) == 2000
    elif s.isascii() and s.isdigit() and int(s) >= 1:
        assert H.long_n(env) == int(s)
    else:
        with pytest.raises(ValueError) as e:
            H.long_n(env)
        assert "TIERDIAG_HARNESS_LONG_N" in str(e.value) and "\n" not in str(e.value)


def test_long_n_sizes_the_long_conversation_cases(monkeypatch):
    """With the long mode on, TIERDIAG_HARNESS_LONG_N sizes the conversation cases (their ids say it)."""
    import importlib

    monkeypatch.setenv("TIERDIAG_HARNESS_LONG", "1")
    monkeypatch.setenv("TIERDIAG_HARNESS_LONG_N", "150")
    mod = importlib.reload(H)
    try:
        ids = [cid for cid, _, _ in mod.trace_cases()]
        assert len(ids) == 4 and all(cid.startswith("conversation150-") for cid in ids)
    finally:
        monkeypatch.delenv("TIERDIAG_HARNESS_LONG")
        monkeypatch.delenv("TIERDIAG_HARNESS_LONG_N")
        importlib.reload(H)


@settings(max_examples=30, deadline=None)
@given(ttfts=st.lists(st.tuples(st.integers(1, 10**12), st.integers(1, 10**12)), min_size=1, max_size=30))
def test_compare_reports_the_ttft_ratio_p50_p90_and_max(ttfts):
    """The report's SGLang/engine TTFT ratios: p50, p90 and max of the per-request ratios (the long
    mode's per-case numbers), and a request differs in TTFT exactly where the two differ."""
    w = H.Workload("t", [{"id": f"r{i}"} for i in range(len(ttfts))], 64, 10, 20, 64, 1024)
    end = [{"t": 0, "kind": "end", "members": [], "evicted_before": [0, 0]}]
    theirs = {"steps": end, "requests": {f"r{i}": {"device": 0, "host": 0, "storage": 0, "computed": 1,
                                                    "arrival_ns": 0, "first_token_ns": s}
                                         for i, (s, _) in enumerate(ttfts)}}
    ours = {"steps": end, "requests": {f"r{i}": {"device": 0, "host": 0, "storage": 0, "computed": 1, "ttft_ns": e}
                                       for i, (_, e) in enumerate(ttfts)}}
    rep = H.compare(w, theirs, ours, ())
    ratios = sorted(s / e for s, e in ttfts)
    assert rep.ttft_ratio_max == round(ratios[-1], 3) and rep.ttft_ratio_p50 == round(ratios[len(ratios) // 2], 3)
    assert rep.ttft_ratio_p50 <= rep.ttft_ratio_p90 <= rep.ttft_ratio_max
    assert rep.differing_ttft == sum(s != e for s, e in ttfts) == rep.differing_requests
    assert f"max {rep.ttft_ratio_max}" in rep.summary()
