"""The hunt's campaign (tests/sglang/hunt.py) without SGLang: a fixed function of its seed, ids
unique and naming their options, its table, and its options' hostile values (argparse's one-line
error, exit 2). Running the workloads needs SGLang's wheel and minutes: not here."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sglang import hunt

pytestmark = pytest.mark.shared  # the slice family reads ../shared/traces


@pytest.fixture(scope="module")
def cases0(tmp_path_factory):
    if not (hunt.TRACES / "conversation_trace.jsonl").exists():
        pytest.skip("needs ../shared/traces")
    return hunt.campaign(0, tmp_path_factory.mktemp("hunt"))


def test_the_campaign_is_a_function_of_its_seed(cases0, tmp_path):
    again = hunt.campaign(0, tmp_path)
    assert [c.cid for c in again] == [c.cid for c in cases0]
    assert [c.cid for c in hunt.campaign(1, tmp_path)] != [c.cid for c in cases0]


def test_ids_are_unique_and_every_family_is_interleaved(cases0):
    ids = [c.cid for c in cases0]
    assert len(ids) == len(set(ids)) == 112
    assert [c.family for c in cases0[:4]] == ["synth", "slice", "decode", "shape"]


def test_trace_workloads_name_their_options(cases0):
    c = next(c for c in cases0 if c.family == "slice")
    page = c.argv[c.argv.index("--page-size") + 1]
    assert f"-p{page}-" in c.cid and c.cid.startswith("slice-")
    # host pools never below the device pool (HiCache refuses them), slices fit their device pool
    for c in cases0:
        if "--host-tokens" in c.argv:
            assert int(c.argv[c.argv.index("--host-tokens") + 1]) >= int(c.argv[c.argv.index("--device-tokens") + 1])


def test_the_table_shows_the_verdict_and_what_it_is_now():
    rows = [{"id": "a", "exit": 1, "steps": 10, "differing_steps": 2, "requests": 5, "differing_requests": 1,
             "note": "#3 (0-based 2): evicted"},
            {"id": "b", "exit": 2, "note": "a request of 9 tokens does not fit"}]
    final = {"a": {"id": "a", "exit": 0, "steps": 10, "differing_steps": 0, "requests": 5, "differing_requests": 0}}
    text = hunt.table(rows, final)
    assert "| `a` | differ: 2 of 10 steps, 1 of 5 requests (#3 (0-based 2): evicted) | agree |" in text
    assert "| `b` | exit 2: a request of 9 tokens does not fit | same |" in text


@settings(max_examples=60, deadline=None)
@given(option=st.sampled_from(["--seed", "--limit", "--only"]),
       value=st.one_of(st.sampled_from(["-1", "0", "2" * 30, "nan", "inf", "1e3", "x", "", "\x1b[31m", "é", "(",
                                        "[a-", "*"]),
                       st.text(max_size=12)))
def test_hostile_option_values_are_one_line_errors(option, value):
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            hunt.parser().parse_args([option, value, "--list"])
    except SystemExit as exc:
        assert exc.code == 2
        err = buf.getvalue().strip().splitlines()
        assert err and option in err[-1]
        return
    # accepted: a valid value of that option
    if option == "--seed":
        assert 0 <= int(value) < 2**63
    elif option == "--limit":
        assert int(value) >= 1
    else:
        import re
        re.compile(value)
