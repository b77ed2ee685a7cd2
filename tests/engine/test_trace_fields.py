"""The trace fields the SGLang rules read: `priority`, `extra_key`, and the synthetic keys of
output pages (trace.reader, trace.pages)."""

from __future__ import annotations

import json

import pytest

from tierdiag.errors import TraceError
from tierdiag.trace.pages import extra_key_salt, output_page_keys, page_keys
from tierdiag.trace.reader import read_trace


def write(tmp_path, *lines):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


BASE = {"timestamp": 0, "input_length": 130, "output_length": 3, "hash_ids": [7]}


def test_priority_and_extra_key_parse(tmp_path):
    path = write(tmp_path, BASE, {**BASE, "priority": -3, "extra_key": "lora-7"}, {**BASE, "extra_key": ""})
    reqs = list(read_trace(path, block_size=512))
    assert [(r.priority, r.extra_key) for r in reqs] == [(0, None), (-3, "lora-7"), (0, "")]


@pytest.mark.parametrize("field,value,words", [
    ("priority", 1.5, "'priority' must be an integer"), ("priority", True, "'priority' must be an integer"),
    ("priority", 2**64, "does not fit in a 64-bit integer"), ("extra_key", 3, "'extra_key' must be a string"),
    ("extra_key", "x" * 2000, "at most 1024"),
])
def test_bad_priority_or_extra_key_names_the_line(tmp_path, field, value, words):
    path = write(tmp_path, BASE, {**BASE, field: value})
    with pytest.raises(TraceError, match=f"t.jsonl:2: .*{words}"):
        list(read_trace(path, block_size=512))


def test_extra_key_salts_every_page_key_and_keeps_the_chain(tmp_path):
    path = write(tmp_path, *({**BASE, "input_length": 1024, "hash_ids": [1, 2], "extra_key": k} for k in
                             (None, "a", "b", "a")))
    plain, a, b, a2 = (page_keys(r, page_size=64, block_size=512) for r in read_trace(path, block_size=512))
    assert len(plain) == 16 and a == a2  # same key, same tokens: the same keys
    assert not set(a) & set(b) and not set(a) & set(plain)
    assert a == [k ^ extra_key_salt("a") for k in plain]  # one salt per key space: prefixes still chain


def test_output_page_keys_are_deterministic_and_per_request():
    first = output_page_keys("r1", [5, 6], 3)
    assert first == output_page_keys("r1", [5, 6], 3) and len(set(first)) == 3
    assert not set(first) & set(output_page_keys("r2", [5, 6], 3))
    assert all(-2**63 <= k < 0 for k in first)  # int64 like every page key, negative like no input key
