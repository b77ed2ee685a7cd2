"""trace/writer.py `write_jsonl(..., chunked=True)` (synth's: lines written ~1 MB at a time, never
held whole; issue 41) writes the very bytes the whole-body write does, plain and gzip, for hostile
lines: empty, non-ASCII, surrogate-free unicode of every plane, lines longer than a chunk and a
chunk boundary inside a multi-byte character."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

import tierdiag.trace.writer as writer

lines = st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), max_size=30)


@settings(max_examples=40, deadline=None)
@given(lines, st.integers(1, 64), st.sampled_from(["t.jsonl", "t.jsonl.gz"]))
def test_chunked_writes_the_same_bytes(tmp_path_factory, got_lines, chunk, name):
    folder = tmp_path_factory.mktemp("w")
    whole, chunked = folder / ("a-" + name), folder / ("b-" + name)
    writer.write_jsonl(whole, iter(got_lines))
    old = writer._CHUNK_CHARS
    writer._CHUNK_CHARS = chunk
    try:
        writer.write_jsonl(chunked, iter(got_lines), chunked=True)
    finally:
        writer._CHUNK_CHARS = old
    assert chunked.read_bytes() == whole.read_bytes()


def test_no_lines_make_an_empty_file(tmp_path):
    out = tmp_path / "e.jsonl"
    writer.write_jsonl(out, iter(()), chunked=True)
    assert out.read_bytes() == b""
