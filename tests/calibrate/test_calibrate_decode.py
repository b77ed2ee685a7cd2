"""`calibrate --from`'s decode model is SGLang's (and the engine's) decode on the GPU's clock.

SGLang 0.5.23, `Scheduler.get_next_batch_to_run`: "Run prefill first if possible", else
`update_running_batch` runs one decode step for every running request at once; the first output
token comes from the prefill, so a request of `output` tokens takes output - 1 steps, and
`ScheduleBatch.prepare_for_decode` grows each `seq_lens` by one before the step reads it (step j
reads input + j tokens of this request, beside the other running requests' KV). From per-request
stamps alone, (finish - first token) is then (output - 1) x decode_step_ns +
decode_ns_per_context_token x sum_j (input + j) only for a request that decoded alone; the fit
must take exactly those, and recover both constants from them.

Before the fix the fitter divided (finish - first token) by `output` steps at one running
context: on the timings below it missed decode_step_ns by about 1 / output.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.importers.sglang_export import EPOCH, record, write_export
from tierdiag.diagnose.twin.calibrate import Geometry, calibrate_run
from tierdiag.importers.load import import_sglang
from tierdiag.store.reader import open_store, resolve_run

A, B = 23_000_000.0, 120.0  # the server's decode clock: ns a step, ns a context token read
PREFILL_S = 0.2
ALONE_REASON = ("decoded beside another request (batched steps or a prefill between them: the steps' context and "
                "count are not its own)")


def _decode_s(prompt: int, output: int) -> float:
    """A request decoding alone: output - 1 steps, step j reading prompt + j tokens."""
    return sum(A + B * (prompt + j) for j in range(1, output)) / 1e9


def _rec(rid: str, prompt: int, output: int, arrival_s: float, *, decode_s: float | None = None,
         dp_rank: object = "absent") -> dict:
    decode = _decode_s(prompt, output) if decode_s is None else decode_s
    r = record(rid, prompt=prompt, completion=output, arrival_s=arrival_s, queue_s=0.0005,
               ttft_s=0.0005 + PREFILL_S, e2e_s=0.0005 + PREFILL_S + decode,
               tokens=[10_000 * (hash(rid) % 1000) + i for i in range(prompt)], dp_rank=dp_rank)
    r["forward_entry_time"] = EPOCH + arrival_s + 0.0005
    return r


def _calibrate(tmp_path, records, name="obs"):
    export = tmp_path / f"export-{name}"
    write_export(export, "20251201_09", records)
    db = tmp_path / f"{name}.duckdb"
    run_id = import_sglang([export], db=db, run_name=name).run_id
    with open_store(db) as con:
        return calibrate_run(con, resolve_run(con, run_id), Geometry("llama3-8b", "h200"), db_label=str(db))


def test_requests_that_decoded_alone_give_both_decode_constants(tmp_path):
    records = []
    t = 0.0
    for i in range(24):  # far apart: each decodes alone; prompts long and short, outputs 2..25
        records.append(_rec(f"alone{i}", prompt=[128, 1024, 4096, 16384][i % 4] + 7 * i, output=2 + i, arrival_s=t))
        t += 30.0
    # a second request that arrives during the first one's decode: its prefill runs between the
    # first's steps, then both decode in the same steps (their times here are made up: whatever
    # they are, neither is a point of the fit)
    records.append(_rec("busy0", prompt=2048, output=20, arrival_s=t, decode_s=3.0))
    records.append(_rec("busy1", prompt=512, output=10, arrival_s=t + 0.5, decode_s=2.0))
    t += 30.0
    records.append(_rec("one-token", prompt=900, output=1, arrival_s=t, decode_s=0.0001))  # no decode step
    c = _calibrate(tmp_path, records)
    u = c.usable
    assert len(u.decode_ns) == 24
    assert u.decode_excluded == {ALONE_REASON: 2, "no decode step (one output token: it comes from prefill)": 1}
    assert sorted(u.decode_steps.tolist()) == list(range(1, 25))
    for name, true in (("decode_step_ns", A), ("decode_ns_per_context_token", B)):
        p = c.params[name]
        assert p.fitted, (name, p.reason)
        assert p.value == pytest.approx(true, rel=1e-4), name
    assert c.heldout_decode.num_points == 24 - 17 and c.heldout_decode.median_rel_error < 1e-4


def test_other_ranks_do_not_share_a_requests_steps(tmp_path):
    """Data-parallel ranks are separate GPUs (0.5.23 exports each request's `dp_rank`): two
    requests at once on two ranks each decode alone; the same two without ranks might have
    shared steps, and are left out."""
    def pair(ranks):
        recs = []
        for i in range(6):
            for k, rank in enumerate(ranks):
                recs.append(_rec(f"r{i}-{k}", prompt=8000 + 24000 * k + 11 * i, output=5 + i + 3 * k,
                                 arrival_s=30.0 * i + 0.01 * k, dp_rank=rank))
        return recs

    ranked = _calibrate(tmp_path, pair([0, 1]), "ranked")
    assert len(ranked.usable.decode_ns) == 12 and not ranked.usable.decode_excluded
    for name, true in (("decode_step_ns", A), ("decode_ns_per_context_token", B)):
        assert ranked.params[name].value == pytest.approx(true, rel=1e-4), name
    unranked = _calibrate(tmp_path, pair(["absent", "absent"]), "unranked")
    assert len(unranked.usable.decode_ns) == 0 and unranked.usable.decode_excluded == {ALONE_REASON: 12}
    assert not unranked.params["decode_step_ns"].fitted
    assert unranked.params["decode_step_ns"].reason == "no usable point"


def test_short_prompts_keep_the_per_token_decode_term_and_say_why(tmp_path):
    """Prompts of a few hundred tokens: the KV read is under 0.5 % of every decode time; the
    fixed part is fitted, the per-token part kept from the preset with the reason."""
    records = [_rec(f"s{i}", prompt=100 + 10 * i, output=3 + i, arrival_s=30.0 * i) for i in range(20)]
    c = _calibrate(tmp_path, records)
    assert c.params["decode_step_ns"].fitted
    assert c.params["decode_step_ns"].value == pytest.approx(A, rel=0.01)
    p = c.params["decode_ns_per_context_token"]
    assert not p.fitted and p.reason.startswith("the KV read never showed in a decode time")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 200_000),  # prompt
                          st.integers(1, 4096),  # output (1: no decode step)
                          st.floats(0.0, 40.0),  # gap after the previous arrival (0: the same instant)
                          st.sampled_from([None, 1e-10, 1e-9, 1e-6, 5.0, 1e4])),  # decode s (None: the clock's; 1e-10: finish on first)
                min_size=1, max_size=14))
def test_hostile_decode_timings_are_counted_and_never_crash(tmp_path_factory, reqs):
    """Any stamps: every finished request is counted once (a point or a reason), the points are
    output - 1 steps with their context, and a fit comes out (fitted or kept, with a reason)."""
    tmp = tmp_path_factory.mktemp("hostile")
    t, records = 0.0, []
    for i, (prompt, output, gap, decode) in enumerate(reqs):
        t += gap
        records.append(_rec(f"h{i}", prompt, output, t, decode_s=decode))
    c = _calibrate(tmp, records)
    u = c.usable
    assert len(u.decode_ns) + sum(u.decode_excluded.values()) == u.num_requests == len(reqs)
    assert (u.decode_steps >= 1).all() and (u.decode_ns > 0).all()
    assert (u.decode_context >= u.decode_steps).all()
    for name in ("decode_step_ns", "decode_ns_per_context_token"):
        p = c.params[name]
        assert np.isfinite(p.value) and p.value >= 0
        assert p.fitted or p.reason
