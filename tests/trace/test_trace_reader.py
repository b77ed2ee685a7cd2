"""The trace reader: formats, arrival spreading, every bad-line error with its line, skip-bad, fuzz."""

from __future__ import annotations

import gzip
import hashlib
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.errors import TraceError
import msgspec

from tierdiag.trace import reader as reader_module
from tierdiag.trace.fields import FieldError, convert as convert_fields
from tierdiag.trace.reader import (ChainLinks, ReadReport, TraceRequest, BadLine, _loads,
                                   _typed_decoder, line_model, max_hash_id, read_trace, trace_sha256)

SHARED_TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"  # repo root / ../shared
MS = 1_000_000


def mooncake(ts: int, input_len: int, *, output_len: int = 10, first_hash: int = 0, block: int = 512, **extra) -> str:
    n = -(-input_len // block)
    return json.dumps({"timestamp": ts, "input_length": input_len, "output_length": output_len,
                       "hash_ids": list(range(first_hash, first_hash + n)), **extra})


def write(tmp_path: Path, lines: list[str] | bytes, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode())
    return path


def read_all(path: Path, **kw) -> list[TraceRequest]:
    return list(read_trace(path, **kw))


def test_mooncake_lines_parse_with_line_numbers_as_ids(tmp_path):
    path = write(tmp_path, [mooncake(0, 1000), "", mooncake(5, 512, output_len=3, first_hash=7), "   "])
    a, b = read_all(path)
    assert a == TraceRequest(req_id="1", seq=0, line=1, arrival_ns=0, input_len=1000, output_len=10,
                             hash_ids=(0, 1), tokens=None)
    # The blank line 2 is skipped but still counted: the second request is line 3, seq 1.
    assert (b.req_id, b.seq, b.line, b.arrival_ns, b.hash_ids) == ("3", 1, 3, 5 * MS, (7,))


def test_our_lines_with_id_and_tokens(tmp_path):
    line = json.dumps({"id": "sess0-turn1", "timestamp": 2, "input_length": 3, "output_length": 1,
                       "tokens": [11, 12, 13]})
    (req,) = read_all(write(tmp_path, [line]))
    assert (req.req_id, req.tokens, req.hash_ids, req.arrival_ns) == ("sess0-turn1", (11, 12, 13), None, 2 * MS)


def test_block_size_sets_expected_hash_count(tmp_path):
    path = write(tmp_path, [mooncake(0, 300, block=128)])
    assert read_all(path, block_size=128)[0].hash_ids == (0, 1, 2)
    with pytest.raises(TraceError, match="expected 1"):
        read_all(path)


# --- spreading shared timestamps ------------------------------------------------------------

def test_shared_timestamp_spread_over_gap_to_next(tmp_path):
    # Four requests at t=0, next timestamp 10 ms: 0, 2.5, 5, 7.5 ms.
    path = write(tmp_path, [mooncake(0, 100)] * 4 + [mooncake(10, 100)])
    assert [r.arrival_ns for r in read_all(path)][:4] == [0, 2_500_000, 5_000_000, 7_500_000]


def test_last_group_spread_over_mean_gap(tmp_path):
    # Distinct timestamps 0, 10, 30: mean gap 15 ms, so the last group of 3 at 30 ms gets 30, 35, 40.
    path = write(tmp_path, [mooncake(0, 100), mooncake(0, 100), mooncake(10, 100)] + [mooncake(30, 100)] * 3)
    assert [r.arrival_ns // 1000 for r in read_all(path)] == [0, 5_000, 10_000, 30_000, 35_000, 40_000]


def test_single_timestamp_trace_stays_at_its_timestamp(tmp_path):
    path = write(tmp_path, [mooncake(7, 100)] * 3)
    assert [r.arrival_ns for r in read_all(path)] == [7 * MS] * 3


def test_uneven_split_rounds_down_and_never_reaches_next(tmp_path):
    path = write(tmp_path, [mooncake(0, 100)] * 3 + [mooncake(1, 100)])
    assert [r.arrival_ns for r in read_all(path)] == [0, 333_333, 666_666, 1 * MS]


def test_skipped_lines_do_not_break_a_group(tmp_path):
    path = write(tmp_path, [mooncake(0, 100), "{bad", mooncake(0, 100), mooncake(4, 100)])
    assert [r.arrival_ns for r in read_all(path, skip_bad=True)] == [0, 2 * MS, 4 * MS]


# --- formats ----------------------------------------------------------------------------------

def test_gzip_read_transparently_by_content_not_name(tmp_path):
    body = ("\n".join([mooncake(0, 600), mooncake(3, 20)]) + "\n").encode()
    for name in ("t.jsonl.gz", "t.jsonl"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(body))
        assert [(r.input_len, r.arrival_ns) for r in read_all(path)] == [(600, 0), (20, 3 * MS)]


def test_truncated_gzip_is_a_trace_error(tmp_path):
    body = "".join(mooncake(i, 600) + "\n" for i in range(2000)).encode()
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(body)[:-2000])
    with pytest.raises(TraceError, match=r"t\.jsonl\.gz:\d+: corrupt or truncated gzip"):
        read_all(path)


def test_utf8_bom_is_accepted(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbf" + mooncake(0, 10).encode() + b"\n")
    assert len(read_all(path)) == 1


def test_crlf_line_endings(tmp_path):
    path = write(tmp_path, (mooncake(0, 10) + "\r\n" + mooncake(1, 10) + "\r\n").encode())
    assert [r.line for r in read_all(path)] == [1, 2]


def test_unknown_keys_are_collected_not_fatal(tmp_path):
    report = ReadReport()
    path = write(tmp_path, [mooncake(0, 10, conversation=1), mooncake(1, 10, user="u", conversation=2)])
    assert len(list(read_trace(path, report=report))) == 2
    assert report.unknown_keys == {"conversation", "user"}  # ("priority", "session" are known keys now)
    assert report.num_requests == 2 and report.bad_lines == 0


def test_reading_streams_requests_before_a_later_bad_line(tmp_path):
    path = write(tmp_path, [mooncake(0, 10), mooncake(1, 10), "not json"])
    it = read_trace(path)
    assert next(it).line == 1  # streamed: yielded before the bad line 3 is read
    with pytest.raises(TraceError, match=":3: bad JSON"):
        list(it)


def test_trace_sha256_hashes_stored_bytes(tmp_path):
    plain = write(tmp_path, [mooncake(0, 10)])
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert trace_sha256(plain) == hashlib.sha256(plain.read_bytes()).hexdigest()
    assert trace_sha256(gz) == hashlib.sha256(gz.read_bytes()).hexdigest()
    with pytest.raises(TraceError, match="no such trace file"):
        trace_sha256(tmp_path / "absent.jsonl")


# --- every error, with its line ----------------------------------------------------------------

def obj(**fields) -> str:
    base = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not _DROP})


_DROP = object()
GOOD = mooncake(0, 10)

LINE_ERRORS = [
    # (lines, bad line number, fragment of the message)
    ([GOOD, "{not json"], 2, "bad JSON"),
    ([GOOD, "", "[1, 2]"], 3, "expected a JSON object, got a list"),
    (['"just a string"'], 1, "expected a JSON object, got a string"),
    (["42"], 1, "expected a JSON object, got a number"),
    (["null"], 1, "expected a JSON object, got null"),
    ([GOOD, obj(timestamp=_DROP)], 2, "missing field 'timestamp'"),
    ([obj(input_length=_DROP)], 1, "missing field 'input_length'"),
    ([obj(output_length=_DROP)], 1, "missing field 'output_length'"),
    ([obj(timestamp=1.5)], 1, "'timestamp' must be an integer, got a number 1.5"),
    ([obj(timestamp="3")], 1, "'timestamp' must be an integer, got a string"),
    ([obj(input_length=True)], 1, "'input_length' must be an integer, got a boolean"),
    ([obj(output_length=None)], 1, "'output_length' must be an integer, got null"),
    ([obj(input_length=600.0)], 1, "'input_length' must be an integer"),
    ([obj(timestamp=-1)], 1, "'timestamp' is negative (-1)"),
    ([obj(output_length=-5)], 1, "'output_length' is negative"),
    ([obj(input_length=-600)], 1, "'input_length' is negative"),
    ([obj(timestamp=10**20)], 1, "'timestamp' 100000000000000000000 is too large"),
    ([obj(input_length=0, hash_ids=[])], 1, "'input_length' is 0"),
    (['{"timestamp": ' + "9" * 5000 + "}"], 1, "bad JSON (Exceeds the limit"),  # Python's int digit limit
    ([obj(timestamp=-(10**60))], 1, "'timestamp' is negative (-100000000000000000000000000000000000...)"),
    ([GOOD, GOOD, obj(hash_ids=[0])], 3, "'hash_ids' has 1 entries, expected 2"),
    ([obj(hash_ids=[0, 1, 2])], 1, "'hash_ids' has 3 entries, expected 2"),
    ([obj(hash_ids="0,1")], 1, "'hash_ids' must be a list of integers, got a string"),
    ([obj(hash_ids=[0, True])], 1, "'hash_ids' must hold only integers, found a boolean"),
    ([obj(hash_ids=[0, 1.0])], 1, "'hash_ids' must hold only integers, found a number"),
    ([obj(hash_ids=[0, -1])], 1, "'hash_ids' holds a negative value (-1)"),
    ([obj(hash_ids=[0, 2**62])], 1, "'hash_ids' holds 4611686018427387904, larger than the maximum"),
    ([obj(hash_ids=_DROP)], 1, "needs exactly one of 'hash_ids' or 'tokens', found neither"),
    ([obj(tokens=[1] * 600)], 1, "needs exactly one of 'hash_ids' or 'tokens', found both"),
    ([obj(hash_ids=_DROP, tokens=[1, 2])], 1, "'tokens' has 2 entries but 'input_length' is 600"),
    ([obj(hash_ids=_DROP, input_length=2, tokens=[1, 2**32])], 1, "'tokens' holds 4294967296, larger"),
    ([obj(hash_ids=_DROP, input_length=2, tokens=[1, None])], 1, "'tokens' must hold only integers, found null"),
    ([obj(hash_ids=[0, 1]), obj(hash_ids=[2, 1])], 2,
     "'hash_ids' do not chain: id 1 at position 1 follows id 2 here but id 0 before"),
    ([obj(hash_ids=[0, 1]), obj(hash_ids=[1, 3])], 2, "id 1 at position 0 follows nothing here but id 0 before"),
    ([obj(hash_ids=[4, 4])], 1, "id 4 at position 1 follows id 4 here but nothing before"),
    ([obj(timestamp=5), GOOD], 2, "timestamp 0 goes backwards (previous request is at 5)"),
    ([obj(id="a"), obj(id="b"), obj(id="a")], 3, "duplicate id \"a\" (first used on line 1)"),
    ([GOOD, obj(id="1")], 2, "duplicate id \"1\" (first used on line 1)"),  # clashes with line 1's implicit id
    ([obj(id=3)], 1, "'id' must be a string, got a number"),
    ([obj(id="  ")], 1, "'id' is empty"),
]


@pytest.mark.parametrize(("lines", "line", "fragment"), LINE_ERRORS, ids=[e[2][:40] for e in LINE_ERRORS])
def test_bad_line_error_names_file_and_line(tmp_path, lines, line, fragment):
    path = write(tmp_path, lines)
    with pytest.raises(TraceError) as info:
        read_all(path)
    message = info.value.message
    assert message.startswith(f"{path}:{line}: "), message
    assert fragment in message
    assert "\n" not in info.value.one_line()
    assert "--skip-bad" in (info.value.hint or "")


@pytest.mark.parametrize(("data", "line", "fragment"), [
    (b"\xff\xfe\x00\x01garbage\n", 1, "not UTF-8 text"),
    (GOOD.encode() + b"\n\xc3\x28\n", 2, "not UTF-8 text"),
    (bytes(range(256)) * 4, 1, "bad JSON"),  # a binary file whose first "line" happens to be ASCII
])
def test_binary_or_non_utf8_is_a_clean_error(tmp_path, data, line, fragment):
    path = write(tmp_path, data)
    with pytest.raises(TraceError, match=rf":{line}: {fragment}"):
        read_all(path)


@pytest.mark.parametrize("data", [b"", b"\n\n  \n"])
def test_empty_file_has_no_requests(tmp_path, data):
    path = write(tmp_path, data)
    with pytest.raises(TraceError, match=rf"^{path}: no requests in the trace$"):
        read_all(path)


def test_missing_file_fails_at_the_call(tmp_path):
    with pytest.raises(TraceError, match="absent.jsonl: no such trace file"):
        read_trace(tmp_path / "absent.jsonl")
    with pytest.raises(TraceError, match="is a directory"):
        read_trace(tmp_path)


def test_bad_block_size(tmp_path):
    with pytest.raises(TraceError, match="block size must be a positive"):
        read_trace(write(tmp_path, [GOOD]), block_size=0)


# --- skip-bad -----------------------------------------------------------------------------------

def test_skip_bad_counts_and_keeps_the_first_five(tmp_path):
    lines = [
        mooncake(0, 10),       # 1 ok
        "{",                   # 2 bad JSON
        mooncake(5, 10),       # 3 ok
        mooncake(2, 10),       # 4 backwards: skipped, not fatal
        obj(input_length=0),   # 5 bad
        "",                    # 6 blank: not bad
        "[]",                  # 7 bad
        mooncake(6, 10),       # 8 ok
        obj(timestamp=True),   # 9 bad
        "x",                   # 10 bad (6th: counted, not kept)
        mooncake(7, 10),       # 11 ok
    ]
    report = ReadReport()
    reqs = list(read_trace(write(tmp_path, lines), skip_bad=True, report=report))
    assert [r.line for r in reqs] == [1, 3, 8, 11]
    assert [r.seq for r in reqs] == [0, 1, 2, 3]
    assert report.bad_lines == 6
    assert [line for line, _ in report.first_bad] == [2, 4, 5, 7, 9]
    assert "goes backwards" in report.first_bad[1][1]
    assert report.num_requests == 4


def test_skip_bad_with_nothing_valid_still_fails(tmp_path):
    with pytest.raises(TraceError, match=r"no requests in the trace \(2 bad lines skipped\)"):
        read_all(write(tmp_path, ["{", "[]"]), skip_bad=True)


def test_skip_bad_line_leaves_no_hash_chain_behind(tmp_path):
    # Line 2 is rejected (0 cannot follow 9), so its link "9 starts a prefix" must not be kept:
    # line 3, where 9 follows 5, is then valid.
    lines = [obj(hash_ids=[0, 1]), obj(hash_ids=[9, 0], timestamp=1), obj(hash_ids=[5, 9], timestamp=2)]
    report = ReadReport()
    reqs = list(read_trace(write(tmp_path, lines), skip_bad=True, report=report))
    assert [r.line for r in reqs] == [1, 3] and report.first_bad[0][0] == 2


def test_skip_bad_duplicate_id_keeps_the_first(tmp_path):
    report = ReadReport()
    reqs = list(read_trace(write(tmp_path, [obj(id="a"), obj(id="a", timestamp=1)]), skip_bad=True, report=report))
    assert [r.line for r in reqs] == [1] and report.bad_lines == 1



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "\u00e9", "c\\n", "7"]), st.sampled_from(["ok", "blank", "bad"])),
                min_size=1, max_size=30))
def test_skip_bad_duplicate_names_the_first_accepted_line(tmp_path, plan):
    # The reader keeps the ids as a set and each accepted one's line in an array by seq (issue 41:
    # a dict of id -> line number was ~70 MB at 1M requests); a duplicate's message must still
    # name the line that first used the id, whatever blank or bad lines came before it.
    lines, first, expect = [], {}, []
    for n, (rid, kind) in enumerate(plan, start=1):
        if kind == "blank":
            lines.append("")
        elif kind == "bad":
            lines.append(obj(id=rid, timestamp="x"))
            expect.append((n, "'timestamp'"))
        else:
            lines.append(obj(id=rid))
            if rid in first:
                expect.append((n, f"(first used on line {first[rid]})"))
            else:
                first[rid] = n
    if not first:
        return  # nothing valid: the reader refuses the trace (tested above)
    report = ReadReport()
    reqs = list(read_trace(write(tmp_path, lines), skip_bad=True, report=report))
    assert [r.line for r in reqs] == sorted(first.values())
    assert report.bad_lines == len(expect)
    for (line, msg), (want_line, fragment) in zip(report.first_bad, expect):
        assert line == want_line and fragment in msg, (line, msg, want_line, fragment)

# The chain check's property (each side against the plain loop over a dict) is
# tests/trace/test_trace_chain.py's; `_links` below is its reader of the links.


def _links(links: ChainLinks) -> dict[int, int]:
    """`links.as_dict()` (a reader for tests only) at C speed: the array holds ~2**20 slots once
    an id of 10**6 is dense (the largest slack), and as_dict's Python walk of them after every
    line of every example took ~40 s of the suite. The test below holds the two equal."""
    import numpy as np

    dense = np.frombuffer(links._dense, dtype=np.int64) if len(links._dense) else np.empty(0, np.int64)
    held = np.flatnonzero(dense != ChainLinks.NONE)
    out = dict(zip(held.tolist(), dense[held].tolist()))
    out.update(links._sparse)
    return out


def test_the_tests_reader_of_the_links_is_as_dict():
    links = ChainLinks()
    assert _links(links) == links.as_dict() == {}
    links.add((0, 1), (-1, 0))
    links.add((2**40, -5), (1, 2**40))  # past the array: the dict
    assert links.knowns((10**6, 3)) == (ChainLinks.NONE, ChainLinks.NONE)  # grows the array past 10**6
    links.add((10**6, 3), (1, 10**6))
    links.add((17,), (ChainLinks.NONE + 1,))
    want = {0: -1, 1: 0, 2**40: 1, -5: 2**40, 10**6: 1, 3: 10**6, 17: -1}
    assert _links(links) == links.as_dict() == want and len(links) == len(want)


@pytest.mark.parametrize("text", ['{"a": 1}\n', '{"a": 1}', '{"a": 1} \t\r\n', ' {"a": 1}', '{"a": 1} x',
                                  '{"a": 1}\x0c', '{"a": 1}\u3000', '{"a": 1}{}', '{"a": }', '{"a": 1',
                                  '{"a": NaN}', '{"a": ' * 5000, '{"a": 1' + '0' * 5000 + '}', '\ufeff{}', '[1]'])
def test_object_lines_parse_by_the_scanner_as_json_loads_would(text):
    # _loads skips json.loads for a line that is one object; what it accepts and every error
    # (message and column) must stay json.loads's.
    try:
        want = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(BadLine) as got:
            _loads(text)
        assert str(got.value) == f"bad JSON ({exc.msg} at column {exc.colno})"
        return
    except (ValueError, RecursionError):
        with pytest.raises(BadLine, match="bad JSON"):
            _loads(text)
        return
    if isinstance(want, dict):
        assert _loads(text) == want
    else:
        with pytest.raises(BadLine, match="expected a JSON object"):
            _loads(text)


def test_extra_data_after_the_object_reports_json_loads_column(tmp_path):
    with pytest.raises(TraceError, match=r":1: bad JSON \(Extra data at column 10\)"):
        read_all(write(tmp_path, ['{"a": 1} x']))


# --- fuzz ---------------------------------------------------------------------------------------

_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 2000), st.integers(),
                          st.floats(allow_nan=True), st.text(max_size=5))
_field_values = st.one_of(_json_scalars, st.lists(st.integers(-2, 3000), max_size=6),
                          st.lists(_json_scalars, max_size=3))


@st.composite
def _valid_line(draw) -> str:
    n = draw(st.integers(1, 2000))
    d = {"timestamp": draw(st.integers(0, 50)), "input_length": n, "output_length": draw(st.integers(0, 9))}
    blocks = -(-n // 512)
    if draw(st.booleans()):
        # Mostly chain-consistent ids (prefixes of a few fixed chains), sometimes arbitrary ones.
        if draw(st.booleans()):
            base = draw(st.sampled_from([0, 100, 200]))
            d["hash_ids"] = list(range(base, base + blocks))
        else:
            d["hash_ids"] = draw(st.lists(st.integers(0, 100), min_size=blocks, max_size=blocks))
    else:
        d["tokens"] = [7] * n
    if draw(st.booleans()):
        d["id"] = draw(st.sampled_from(["a", "b", "c", "1", "2"]))
    return json.dumps(d)


@st.composite
def _mutated_line(draw) -> str:
    d = json.loads(draw(_valid_line()))
    for key in draw(st.lists(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "tokens",
                                              "id", "extra"]), max_size=3)):
        if draw(st.booleans()):
            d.pop(key, None)
        else:
            d[key] = draw(_field_values)
    return json.dumps(d)


_line = st.one_of(_valid_line(), _valid_line(), _mutated_line(), st.text(max_size=30).map(str),
                  st.binary(max_size=30))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, max_size=12), skip_bad=st.booleans(), compress=st.sampled_from(["no", "gzip", "cut"]))
def test_fuzz_reader_only_parses_or_raises_trace_error(tmp_path, lines, skip_bad, compress):
    data = b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines)
    if compress != "no":
        data = gzip.compress(data)
        if compress == "cut":
            data = data[: len(data) // 2]
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    report = ReadReport()
    try:
        reqs = list(read_trace(path, skip_bad=skip_bad, report=report))
    except TraceError as exc:
        assert "\n" not in exc.one_line()
        assert str(path) in exc.message
        return
    assert reqs, "a trace that parsed must hold at least one request"
    assert [r.seq for r in reqs] == list(range(len(reqs)))
    assert all(a.arrival_ns <= b.arrival_ns for a, b in zip(reqs, reqs[1:]))
    assert len({r.req_id for r in reqs}) == len(reqs)
    assert all((r.hash_ids is None) != (r.tokens is None) and r.input_len > 0 for r in reqs)
    assert report.num_requests == len(reqs)


# --- the typed fast path of _parse ------------------------------------------------------------------

_KEYS = ["timestamp", "input_length", "output_length", "hash_ids", "tokens", "id", "priority", "extra_key",
         "session", "think_ms"]
_hostile_values = st.one_of(
    _json_scalars, st.integers(-(2**70), 2**70), st.sampled_from([2**63 - 1, 2**63, -(2**63) + 1, -(2**63), 2**64]),
    st.floats(allow_nan=False), st.sampled_from([0.5, 1.0, -0.0, 1e308, 4.6e15]),
    st.lists(st.integers(0, 2**33), max_size=4), st.lists(st.sampled_from([1.0, True, "1", None]), max_size=2),
    st.text(max_size=6), st.sampled_from(["", " ", "\x00", "\u00e9", "x" * 1025]), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def _raw_key(key: str, draw) -> str:
    """A key as JSON text: plain, with an escape that decodes to it, or unknown."""
    how = draw(st.sampled_from(["plain", "plain", "escaped", "unknown"]))
    if how == "escaped":
        return json.dumps(key, ensure_ascii=False).replace(key[0], "\\u%04x" % ord(key[0]), 1)
    if how == "unknown":
        return json.dumps(key + draw(st.sampled_from(["_", "X", "\u00e9"])))
    return json.dumps(key)


@st.composite
def _hostile_line(draw) -> bytes:
    """A line near the valid ones: known keys (sometimes twice, escaped, or misspelt), values of
    every JSON type and size, a byte-order mark, whitespace, trailing bytes."""
    if draw(st.booleans()):
        base = json.loads(draw(_valid_line()))
        pairs = list(base.items())
    else:
        pairs = []
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=4)):
        pairs.append((key, draw(_hostile_values)))
    order = draw(st.permutations(range(len(pairs)))) if pairs else []
    body = ", ".join(f"{_raw_key(pairs[i][0], draw)}: {json.dumps(pairs[i][1])}" for i in order)
    text = draw(st.sampled_from(["", " ", "\ufeff"])) + "{" + body + "}" + draw(st.sampled_from(["", " ", "\r", "\n", " x", "}"]))
    return text.encode("utf-8", "surrogatepass")


def _general_path(data: bytes, model):
    """What _parse's general path makes of one line: the model's fields, or the error's words."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        try:
            obj = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            return "bad JSON"
    if type(obj) is not dict:
        return "not an object"
    try:
        return convert_fields(obj, model), set(obj) - reader_module.KNOWN_KEYS
    except FieldError as exc:
        return str(exc)


def _typed(values) -> list:
    """Field values with their types (5 and 5.0 differ; so do a list and a tuple)."""
    return [(type(v), v) for v in values]


@settings(max_examples=600, deadline=None)
@given(data=st.one_of(_hostile_line(), _line.map(lambda x: x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass"))),
       block=st.sampled_from([1, 512, 2**40]))
def test_typed_decoder_answers_only_lines_the_general_path_accepts_with_the_same_fields(data, block):
    # The reader decodes a line straight into its fields first and takes the general path (a
    # dict, unknown keys collected, each field converted and worded) only where that fails: so
    # every line the typed decoder takes must be one the general path accepts, with no unknown
    # key, to exactly the same values and types.
    max_hash = max_hash_id(block)
    model = line_model(max_hash)
    try:
        line = _typed_decoder(max_hash)(data)
    except (msgspec.DecodeError, RecursionError):
        return
    general = _general_path(data, model)
    assert isinstance(general, tuple), (data, general)
    want, unknown = general
    assert not unknown
    names = model.__struct_fields__
    assert _typed([getattr(line, f) for f in names]) == _typed([getattr(want, f) for f in names]), data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(_hostile_line(), _line), max_size=10), skip_bad=st.booleans())
def test_reader_with_and_without_the_typed_path_reads_alike(tmp_path, lines, skip_bad):
    # Whole traces: the same requests, report (bad lines and their messages, unknown keys) and
    # error with the typed path as without it (every line through the general path).
    data = b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines)
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)

    def read(typed: bool):
        report = ReadReport()
        with pytest.MonkeyPatch.context() as mp:
            if not typed:
                def refuse(max_hash):
                    def decode(data):
                        raise msgspec.DecodeError("general path")
                    return decode
                mp.setattr(reader_module, "_typed_decoder", refuse)
            try:
                reqs = list(read_trace(path, skip_bad=skip_bad, report=report))
            except TraceError as exc:
                return "error", exc.one_line()
        return [(tuple(_typed(msgspec.structs.astuple(r)))) for r in reqs], report

    fast, slow = read(True), read(False)
    assert fast == slow


def test_trace_request_is_immutable_compared_and_hashed_by_its_fields():
    # A msgspec Struct since issue 41 (built in C): what the engine and the tests rely on of the
    # frozen dataclass it was stays: keywords and defaults, equality, hashing, no assignment.
    a = TraceRequest("r", 0, 1, 5, 10, 2, (1, 2), None)
    b = TraceRequest(req_id="r", seq=0, line=1, arrival_ns=5, input_len=10, output_len=2, hash_ids=(1, 2), tokens=None,
                     priority=0, extra_key=None, session=None, think_ns=None)
    assert a == b and hash(a) == hash(b) and a != TraceRequest("r", 0, 1, 6, 10, 2, (1, 2), None)
    assert (a.priority, a.extra_key, a.session, a.think_ns) == (0, None, None, None)
    with pytest.raises(AttributeError):
        a.arrival_ns = 7  # type: ignore[misc]
    assert repr(a).startswith("TraceRequest(req_id='r', seq=0, line=1, arrival_ns=5")


# --- the real Mooncake traces (SOURCES.md facts) --------------------------------------------------

@pytest.mark.shared
@pytest.mark.parametrize(("name", "count", "mean_input", "median_input", "span_s", "refs", "unique"), [
    ("conversation_trace.jsonl", 12_031, 12_035, 6_909, 3_537, 288_500, 182_790),
    ("synthetic_trace.jsonl", 3_993, 15_325, 11_587, 1_022, 121_877, 43_924),
])
def test_shared_mooncake_trace_facts(name, count, mean_input, median_input, span_s, refs, unique):
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    report = ReadReport()
    reqs = list(read_trace(path, report=report))
    inputs = [r.input_len for r in reqs]
    assert len(reqs) == report.num_requests == count
    assert round(statistics.fmean(inputs)) == mean_input
    assert statistics.median(inputs) == median_input
    assert report.bad_lines == 0 and not report.unknown_keys
    assert round((reqs[-1].arrival_ns - reqs[0].arrival_ns) / 1e9) in range(span_s - 5, span_s + 5)
    all_ids = [h for r in reqs for h in r.hash_ids]
    assert (len(all_ids), len(set(all_ids))) == (refs, unique)
