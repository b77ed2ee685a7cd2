"""The arrival spread of shared timestamps (`reader._spread`, one pass over the parsed lines with
the end of the input as one more item) against the rule its docstring states, written the plain
way: group, then spread each group over the gap to the next timestamp, the last over the mean
gap between distinct timestamps."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.trace import reader
from tierdiag.trace.reader import ReadReport, read_trace

NS = 1_000_000


def _expected(parsed: list[tuple[int, tuple]]) -> list[tuple]:
    groups: list[tuple[int, list[tuple]]] = []
    for ts, fields in parsed:
        if groups and groups[-1][0] == ts:
            groups[-1][1].append(fields)
        else:
            groups.append((ts, [fields]))
    distinct = [ts for ts, _ in groups]
    mean_gap_ms = (distinct[-1] - distinct[0]) / (len(distinct) - 1) if len(distinct) > 1 else 0.0
    out = []
    for g, (ts, members) in enumerate(groups):
        next_ts = groups[g + 1][0] if g + 1 < len(groups) else ts + mean_gap_ms
        gap_ns = round((next_ts - ts) * NS)
        for i, f in enumerate(members):
            out.append((*f[:3], ts * NS + i * gap_ns // len(members), *f[3:]))
    return out


_LINE = st.one_of(
    st.tuples(st.integers(0, 4), st.integers(1, 3), st.booleans()),  # (timestamp step, blocks, with a session)
    st.just(None),  # a bad line (skipped)
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(_LINE, min_size=1, max_size=40), start=st.sampled_from([0, 7, 10**9, reader.MAX_TIMESTAMP_MS - 200]))
def test_arrivals_are_the_documented_spread(tmp_path, plan, start):
    lines, ts, next_id = [], start, 0
    for item in plan:
        if item is None:
            lines.append('{"timestamp": "soon"}')
            continue
        step, blocks, session = item
        ts += step
        obj = {"timestamp": ts, "input_length": 512 * blocks, "output_length": 3,
               "hash_ids": list(range(next_id, next_id + blocks))}
        if session:
            obj["session"] = f"s{len(lines) % 3}"
        next_id += blocks
        lines.append(json.dumps(obj))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    parsed = list(reader._parse(Path(path), block_size=512, skip_bad=True, report=ReadReport()))
    if not parsed:
        return
    report = ReadReport()
    got = [tuple(getattr(r, f) for f in r.__struct_fields__) for r in read_trace(path, skip_bad=True, report=report)]
    assert got == _expected(parsed)
    assert report.num_requests == len(parsed) and report.bad_lines == plan.count(None)
