"""store/columns.py's `coded_column` (issue 41, session 28): a coded column of a columnar hand-over
(engine/emitters.py's Columns: an index a row into the hand-over's dictionary) made the Arrow
array that arrow_column makes of its values, VARCHAR columns built from the codes in numpy.
Held here to arrow_column of the values row by row (the same array, or the same refusal) for
hostile strings, NULLs, str subclasses and any codes; codes outside the dictionary refused."""

from __future__ import annotations

import enum

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.store.columns import arrow_column, coded_column


class _Tier(enum.StrEnum):
    DEVICE = "device"
    HOST = "host"


# unicode of every kind (NUL, escapes, astral), lone surrogates (which Arrow refuses), str members
_TEXT = st.one_of(st.text(max_size=10), st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),
                  st.sampled_from(list(_Tier)))
_DICTIONARY = st.lists(st.one_of(st.none(), _TEXT), min_size=1, max_size=9)


def _outcome(table, col, values):
    try:
        return arrow_column(table, col, values).to_pylist()
    except (OverflowError, UnicodeEncodeError) as exc:  # (a lone surrogate: pa.array's own error, as before)
        return ("refused", type(exc).__name__)


@given(data=st.data(), dictionary=_DICTIONARY, table_col=st.sampled_from(
    [("evictions", "tier"), ("evictions", "owner_req_id"), ("requests", "hit_class"), ("transfers", "req_id")]))
@settings(max_examples=300, deadline=None)
def test_a_text_column_from_codes_is_its_values_array(data, dictionary, table_col):
    table, col = table_col
    codes = np.array(data.draw(st.lists(st.integers(0, len(dictionary) - 1), max_size=40)), dtype=np.int64)
    values = [dictionary[c] for c in codes.tolist()]
    got = coded_column(table, col, codes, dictionary)
    assert _outcome(table, col, got) == _outcome(table, col, values)
    if isinstance(got, pa.Array):
        got.validate(full=True)
        assert got.type == pa.string() and len(got) == len(codes)


@given(dictionary=st.lists(st.one_of(st.none(), st.booleans()), min_size=1, max_size=3), data=st.data())
@settings(max_examples=50, deadline=None)
def test_another_columns_codes_are_its_python_values(dictionary, data):
    codes = np.array(data.draw(st.lists(st.integers(0, len(dictionary) - 1), max_size=20)), dtype=np.int64)
    assert coded_column("transfers", "verified", codes, dictionary) == [dictionary[c] for c in codes.tolist()]


@pytest.mark.parametrize("codes", [[0, 3], [-1], [0, 2**40], [5]])
def test_a_code_outside_the_dictionary_is_refused_naming_the_column(codes):
    with pytest.raises(ValueError, match="evictions.tier"):
        coded_column("evictions", "tier", np.array(codes, dtype=np.int64), ["device", None, "host"])


def test_no_rows_no_values():
    got = coded_column("evictions", "tier", np.zeros(0, dtype=np.int64), [])
    assert _outcome("evictions", "tier", got) == []
