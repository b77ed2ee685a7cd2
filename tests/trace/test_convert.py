"""`trace.convert`: kv-cache-tester and bailian sources read into session traces, narrated on the
fixtures in tests/trace/fixtures; block re-chaining; every malformed record named by file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.errors import ConfigError, TraceError
from tierdiag.trace.convert import ConvertOptions, convert
from tierdiag.trace.convert.jsonpos import line_of
from tierdiag.trace.convert.records import Rechainer
from tierdiag.trace.reader import read_trace
from tierdiag.trace.sessions import predecessors

FIXTURES = Path(__file__).with_name("fixtures")
KV = FIXTURES / "kv-cache-tester"
BAILIAN = FIXTURES / "bailian" / "usage.jsonl"
MS = 1_000_000


def lines(path: Path) -> list[dict]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def by_id(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in lines(path)}


# --- kv-cache-tester -----------------------------------------------------------------------------

def test_kv_cache_tester_fixture_narrated(tmp_path):
    out = tmp_path / "kv.jsonl"
    summary = convert("kv-cache-tester", [KV], out, ConvertOptions(block_size=64, seed=1))
    assert (summary.num_files, summary.num_requests, summary.num_sessions) == (2, 7, 3)
    assert summary.notes.subagents == 1 and summary.notes.unchained_blocks == 0
    r = by_id(out)
    # conv-a starts at 0; every line carries its session; a first turn has no think_ms.
    assert [r[f"conv-a#{i}"]["timestamp"] for i in (1, 2, 3)] == [0, 5_000, 70_000]
    assert "think_ms" not in r["conv-a#1"] and r["conv-a#2"]["think_ms"] == 3_000 and r["conv-a#3"]["think_ms"] == 60_000
    # 200 tokens: 3 full 64-token blocks named by the source, the 8-token tail its own block.
    a1, a2, a3 = (r[f"conv-a#{i}"]["hash_ids"] for i in (1, 2, 3))
    assert len(a1) == 4 and a2[:3] == a1[:3] and a2[3] not in a1 and a3[:4] == a2[:4]
    # The sub-agent is its own session, its t counted from its marker (t 7.0: 7.0 + 0.0 and 7.0 + 2.5),
    # sharing the file's ids:
    # its first block is conv-a's block 1 (same id, same place), its second is not conv-a's 2.
    s1, s2 = r["conv-a/sa1#1"], r["conv-a/sa1#2"]
    assert (s1["session"], s1["timestamp"], s2["timestamp"], s2["think_ms"]) == ("conv-a/sa1", 7_000, 9_500, 1_500)
    assert s1["hash_ids"][0] == a1[0] and s1["hash_ids"][1] != a1[1] and s2["hash_ids"][:2] == s1["hash_ids"][:2]
    # conv-b numbers its blocks 1, 2, 3 too ("local" scope): nothing shared with conv-a.
    b1, b2 = r["conv-b#1"]["hash_ids"], r["conv-b#2"]["hash_ids"]
    assert not set(b1 + b2) & set(a1 + a2 + a3) and b2[:3] == b1[:3]
    assert r["conv-b#2"]["timestamp"] - r["conv-b#1"]["timestamp"] == 30_000 and r["conv-b#2"]["think_ms"] == 28_500


def test_kv_cache_tester_output_reads_back_with_sessions(tmp_path):
    out = tmp_path / "kv.jsonl"
    convert("kv-cache-tester", [KV / "conv-a.json", KV / "more" / "conv-b.json"], out, ConvertOptions(block_size=64))
    reqs = list(read_trace(out, block_size=64))
    assert [r.arrival_ns for r in reqs] == sorted(r.arrival_ns for r in reqs)
    preds = list(predecessors(reqs))
    named = {r.req_id: (reqs[p].req_id if p is not None else None) for r, p in zip(reqs, preds)}
    assert named == {"conv-a#1": None, "conv-a#2": "conv-a#1", "conv-a#3": "conv-a#2", "conv-b#1": None,
                     "conv-b#2": "conv-b#1", "conv-a/sa1#1": None, "conv-a/sa1#2": "conv-a/sa1#1"}


def test_start_spread_is_seeded(tmp_path):
    def start_of_b(seed, spread):
        out = tmp_path / f"kv-{seed}-{spread}.jsonl"
        convert("kv-cache-tester", [KV], out, ConvertOptions(seed=seed, start_spread_s=spread))
        return by_id(out)["conv-b#1"]["timestamp"]

    assert start_of_b(1, 30.0) == start_of_b(1, 30.0) != start_of_b(2, 30.0)
    assert start_of_b(1, 0.0) == 0


def test_global_scope_shares_ids_across_files(tmp_path):
    for name in ("x", "y"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"id": name, "hash_id_scope": "global", "requests": [
            {"t": 0, "in": 128, "out": 1, "hash_ids": [5, 6]}]}))
    out = tmp_path / "o.jsonl"
    convert("kv-cache-tester", [tmp_path / "x.json", tmp_path / "y.json"], out, ConvertOptions(block_size=64))
    assert by_id(out)["x#1"]["hash_ids"] == by_id(out)["y#1"]["hash_ids"]


def _kv(tmp_path, requests, **top) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"id": "c", "block_size": 64, **top, "requests": requests}, indent=1))
    return path


GOOD = {"t": 0.0, "in": 128, "out": 2, "hash_ids": [1, 2]}


@pytest.mark.parametrize(("bad", "words"), [
    ({**GOOD, "in": "128"}, "'in' must be an integer"),
    ({**GOOD, "in": 0}, "'in' is 0, expected 1"),
    ({**GOOD, "out": -1}, "'out' is -1"),
    ({k: v for k, v in GOOD.items() if k != "t"}, "missing field 't'"),
    ({**GOOD, "t": -2}, "'t' is negative"),
    ({**GOOD, "hash_ids": [1, 2, 3]}, "'hash_ids' has 3 entries, expected 2"),
    ({**GOOD, "hash_ids": [1, "2"]}, "'hash_ids' must hold only integers"),
    ({**GOOD, "think_time": "soon"}, "'think_time' must be a finite number"),
    ({**GOOD, "t": 1e30}, "too large"),
    ({"type": "subagent", "t": 1.0}, "a sub-agent entry needs 'requests'"),
])
def test_malformed_request_names_its_file_and_line(tmp_path, bad, words):
    path = _kv(tmp_path, [GOOD, bad])
    with pytest.raises(TraceError) as info:
        convert("kv-cache-tester", [path], tmp_path / "o.jsonl")
    text = path.read_text().splitlines()
    # indent=1: the second request's "{" opens its own line.
    want = next(i for i, t in enumerate(text, 1) if t.strip() == "{" and i > 5 and "requests" not in t)
    assert info.value.message.startswith(f"{path}:{want}: ") and words in info.value.message
    assert not (tmp_path / "o.jsonl").exists(), "a bad record leaves no output"


def test_malformed_nested_request_names_its_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"id": "c", "requests": [\n'
                    ' {"t": 0, "in": 64, "out": 1, "hash_ids": [1]},\n'
                    ' {"t": 1, "type": "subagent", "requests": [\n'
                    '   {"t": 1, "in": 64, "out": 1, "hash_ids": [1]},\n'
                    '   {"t": 2, "in": 64, "out": 1, "hash_ids": []}\n'
                    ' ]}\n]}\n')
    with pytest.raises(TraceError, match=rf"c.json:5: 'hash_ids' has 0 entries, expected 1"):
        convert("kv-cache-tester", [path], tmp_path / "o.jsonl")


@pytest.mark.parametrize(("text", "words"), [
    ('{"id": "c", "requests": [\n {"t": 0,, }\n]}', "c.json:2: bad JSON"),
    ("[1, 2]", "c.json:1: expected a JSON object"),
    ('{"id": "c"}', "c.json:1: missing field 'requests'"),
    ('{"id": "c", "hash_id_scope": "world", "requests": []}', "'hash_id_scope' is \"world\""),
    ('{"id": "c", "block_size": 0, "requests": []}', "'block_size' is 0"),
    ('{"id": "c", "requests": [\n {"t": 5, "in": 64, "out": 1, "hash_ids": [1]},\n'
     ' {"t": 4, "in": 64, "out": 1, "hash_ids": [1]}]}', "c.json:3: 't' 4 goes backwards"),
])
def test_malformed_conversation(tmp_path, text, words):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=words):
        convert("kv-cache-tester", [path], tmp_path / "o.jsonl")


def test_two_files_with_one_conversation_id(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"id": "same", "requests": [GOOD]}))
    with pytest.raises(TraceError, match=r"b.json:1: conversation id \"same\" is also the id of .*a.json"):
        convert("kv-cache-tester", [tmp_path], tmp_path / "o.jsonl")


# --- bailian -------------------------------------------------------------------------------------

def test_bailian_fixture_narrated(tmp_path):
    out = tmp_path / "b.jsonl"
    summary = convert("bailian", [BAILIAN], out, ConvertOptions(block_size=16))
    n = summary.notes
    assert (summary.num_requests, summary.num_sessions, n.orphans, n.forks, n.early_turns) == (7, 4, 1, 1, 1)
    r = by_id(out)
    assert {k: v["session"] for k, v in r.items()} == {"1": "1", "3": "1", "7": "1", "2": "2", "6": "2", "4": "4",
                                                        "5": "5"}
    # think_ms = arrival - (parent arrival + parent output_length x 25 ms):
    # chat 3: 9000 - (500 + 20 x 25) = 8000; chat 7: 20250 - (9000 + 8 x 25) = 11050.
    assert (r["3"]["think_ms"], r["7"]["think_ms"]) == (8_000, 11_050)
    # chat 6 arrives 50 ms after chat 2, before its estimated finish (1000 + 5 x 25): pause 0.
    assert r["6"]["think_ms"] == 0
    # chat 4 is chat 1's second child: a fork, its own session, no pause; chat 5's parent is missing.
    assert "think_ms" not in r["4"] and "think_ms" not in r["5"]
    # 16-token blocks: chat 1 (40 tokens) has 2 full blocks and a tail; chat 3 continues them.
    assert r["3"]["hash_ids"][:2] == r["1"]["hash_ids"][:2] and r["1"]["hash_ids"][2] not in r["3"]["hash_ids"]
    assert r["7"]["hash_ids"][:6] == r["3"]["hash_ids"][:6]


def test_bailian_reblocked_to_64(tmp_path):
    out = tmp_path / "b.jsonl"
    convert("bailian", [BAILIAN], out, ConvertOptions(block_size=64))
    r = by_id(out)
    # chat 7 (130 tokens) shares chat 3's first 64-token block (4 full 16-token blocks in common).
    assert len(r["7"]["hash_ids"]) == 3 and r["7"]["hash_ids"][0] == r["3"]["hash_ids"][0]
    assert list(read_trace(out, block_size=64))


def _bailian(tmp_path, *rows) -> Path:
    path = tmp_path / "u.jsonl"
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


ROW = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 32, "output_length": 2,
       "hash_ids": [1, 2]}


@pytest.mark.parametrize(("bad", "words"), [
    ("{not json", "bad JSON"),
    ("[1]", "expected a JSON object"),
    ({**ROW, "chat_id": 1}, "duplicate chat_id \"1\" (first at"),
    ({**ROW, "chat_id": 2, "input_length": 32.0}, "'input_length' must be an integer"),
    ({**ROW, "chat_id": 2, "timestamp": "x"}, "'timestamp' must be a finite number"),
    ({**ROW, "chat_id": 2, "hash_ids": [1]}, "'hash_ids' has 1 entries, expected 2"),
    ({**ROW, "chat_id": 2, "parent_chat_id": 1, "timestamp": 0.5}, "before its parent chat \"1\""),
    ({**ROW, "chat_id": 2, "parent_chat_id": 2}, "is its own parent"),
    ({**ROW, "chat_id": None}, "missing field 'chat_id'"),
    ({**ROW, "chat_id": -4}, "'chat_id' must be a non-negative integer"),
])
def test_bailian_malformed_line_names_file_and_line(tmp_path, bad, words):
    path = _bailian(tmp_path, ROW, "", bad)
    with pytest.raises(TraceError) as info:
        convert("bailian", [path], tmp_path / "o.jsonl")
    assert info.value.message.startswith(f"{path}:3: ") and words in info.value.message


def test_bailian_parent_after_child_is_refused(tmp_path):
    path = _bailian(tmp_path, {**ROW, "chat_id": 2, "parent_chat_id": 9}, {**ROW, "chat_id": 9, "timestamp": 2.0})
    with pytest.raises(TraceError, match=r"u.jsonl:2: chat \"9\" comes after its child at .*u.jsonl:1"):
        convert("bailian", [path], tmp_path / "o.jsonl")


def test_unchained_source_ids_are_counted_and_split(tmp_path):
    # Chat 2 reuses id 2 behind id 7: not the block chat 1 has behind id 1, so not its KV.
    path = _bailian(tmp_path, ROW, {**ROW, "chat_id": 2, "hash_ids": [7, 2]})
    out = tmp_path / "o.jsonl"
    summary = convert("bailian", [path], out, ConvertOptions(block_size=16))
    assert summary.notes.unchained_blocks == 1
    assert not set(by_id(out)["1"]["hash_ids"]) & set(by_id(out)["2"]["hash_ids"])


# --- options and the output --------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "words"), [
    ({"block_size": 0}, "--block-size must be 1"),
    ({"start_spread_s": -1.0}, "--start-spread must be 0"),
    ({"start_spread_s": float("nan")}, "--start-spread must be 0"),
])
def test_bad_options(tmp_path, kwargs, words):
    with pytest.raises(ConfigError, match=words):
        convert("kv-cache-tester", [KV], tmp_path / "o.jsonl", ConvertOptions(**kwargs))


def test_start_spread_is_for_kv_cache_tester_only(tmp_path):
    with pytest.raises(ConfigError, match="--start-spread applies to kv-cache-tester"):
        convert("bailian", [BAILIAN], tmp_path / "o.jsonl", ConvertOptions(start_spread_s=3.0))


def test_unknown_format_lists_the_known():
    with pytest.raises(ConfigError, match="unknown format 'sharegpt'; known: bailian, kv-cache-tester"):
        convert("sharegpt", [KV], Path("o.jsonl"))


def test_output_that_is_an_input_is_refused(tmp_path):
    src = tmp_path / "u.jsonl"
    src.write_bytes(BAILIAN.read_bytes())
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match=f"-o {tmp_path}/link/u.jsonl is the input {src}: convert would overwrite"):
        convert("bailian", [src], tmp_path / "link" / "u.jsonl")
    # Inside a source folder too, once it exists there.
    (tmp_path / "o.jsonl").write_text("")
    with pytest.raises(ConfigError, match="is the input"):
        convert("bailian", [tmp_path], tmp_path / "o.jsonl")
    assert src.read_bytes() == BAILIAN.read_bytes()


def test_missing_source_and_empty_folder(tmp_path):
    with pytest.raises(TraceError, match="no such file or folder"):
        convert("bailian", [tmp_path / "nope.jsonl"], tmp_path / "o.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=r"no \*.json files in this folder"):
        convert("kv-cache-tester", [tmp_path / "empty"], tmp_path / "o.jsonl")


# --- re-chaining ---------------------------------------------------------------------------------

def _chained(rows: list[tuple[int, ...]]) -> bool:
    """Mooncake's rule: an id always follows the same id (or nothing)."""
    before: dict[int, int | None] = {}
    for ids in rows:
        for pos, h in enumerate(ids):
            if before.setdefault(h, ids[pos - 1] if pos else None) != (ids[pos - 1] if pos else None):
                return False
    return True


@settings(max_examples=80, deadline=None)
@given(src_block=st.sampled_from([16, 64]), out_block=st.sampled_from([16, 32, 64, 100, 512]),
       reqs=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 5), max_size=12), st.integers(0, 63)),
                     min_size=1, max_size=12))
def test_rechained_ids_always_chain_and_share_only_shared_prefixes(src_block, out_block, reqs):
    chain = Rechainer(out_block)
    rows = []
    for namespace, ids, tail in reqs:
        input_len = len(ids) * src_block + tail or 1
        out = chain.blocks(namespace, ids, src_block, input_len)
        assert len(out) == -(-input_len // out_block)
        rows.append((namespace, ids, input_len, out))
    assert _chained([r[3] for r in rows])
    # Two output blocks share an id only if their requests agree on every source block up to it
    # (same namespace) and the block ends inside the full blocks of both.
    for a, (ns_a, ids_a, len_a, out_a) in enumerate(rows):
        for ns_b, ids_b, len_b, out_b in rows[a + 1:]:
            for j, (x, y) in enumerate(zip(out_a, out_b)):
                if x == y:
                    end = min((j + 1) * out_block, len_a)
                    assert ns_a == ns_b and end == min((j + 1) * out_block, len_b)
                    n = -(-end // src_block)
                    assert ids_a[:n] == ids_b[:n] and n <= len(ids_a)


def test_line_of_points_at_the_object():
    text = '{\n "requests": [\n  {"a": 1},\n  {"b": [\n   {"c": 2}]}\n ]\n}'
    assert line_of(text, ()) == 1
    assert line_of(text, ("requests", 1)) == 4
    assert line_of(text, ("requests", 1, "b", 0)) == 5
    assert line_of(text, ("requests", 1, "b", 0, "c")) == 5  # a value: its object's line
    assert line_of(text, ("requests", 7)) == 1  # not there: the nearest object found
