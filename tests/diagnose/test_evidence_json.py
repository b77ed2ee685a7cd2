"""The run evidence row's JSON text made with a section dumped beforehand (diagnose/run/evidence.py
`evidence_json`: the size curves' section dumped on their thread, issue 41 session 26) is the
text `json.dumps` makes of the whole, whatever the sections hold and whichever are dumped."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from tierdiag.diagnose.run.evidence import evidence_json

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.text())
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(), inner, max_size=4)), max_leaves=20)


@given(sections=st.dictionaries(st.text(), _values, max_size=8), pick=st.lists(st.integers(0, 7), max_size=8))
def test_the_text_is_json_dumps_of_the_whole(sections, pick):
    want = json.dumps(sections, separators=(",", ":"))
    names = list(sections)
    dumped = {names[i % len(names)]: json.dumps(sections[names[i % len(names)]], separators=(",", ":"))
              for i in pick} if names else {}
    assert evidence_json(sections, dumped) == want
    assert evidence_json(sections) == want
    assert evidence_json(sections, None) == want
