"""The recorder's encoded rows made columns for the store (writer.table_columns, by
_cplane.decode_arrow): each column either an Arrow array built straight from the encoding, equal
to what pa.array makes of the same values with the column's type, or the values themselves for
`_arrow` to convert (or refuse) as it always did; inline and writer-process replays both take
this path (tests/store/test_writer_paths.py compares their rows)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.native import cplane
from tierdiag.store.columns import _ARROW_TYPES, arrow_column as _arrow, table_columns

pytestmark = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")

# A made-up table of every type the decoder builds (INTEGER too: int32).
TABLE = {"i": "BIGINT", "d": "DOUBLE", "b": "BOOLEAN", "s": "VARCHAR", "n": "INTEGER"}
_BY_TYPE = {
    "BIGINT": st.integers(-2**63, 2**63 - 1),
    "DOUBLE": st.floats(allow_nan=False),
    "BOOLEAN": st.booleans(),
    "VARCHAR": st.text(max_size=8),
    # int32, and its edges: one past them sends the column the old way (pa.array refuses it)
    "INTEGER": st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from([2**31 - 1, -2**31, 2**31, -2**31 - 1, 0])),
}
_STRAY = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False), st.booleans(), st.text(max_size=3),
                   st.integers(-3, 3).map(np.int64))


@pytest.fixture(autouse=True, scope="module")
def _table_t():
    """The made-up table, in the schema for this module's tests only."""
    from tierdiag.store.schema import TABLES

    TABLES["t"] = TABLE
    yield
    del TABLES["t"]


def _column(typ):
    """Mostly values of the type and None; sometimes a stray value of another kind."""
    return st.one_of(_BY_TYPE[typ], st.none(), _BY_TYPE[typ], _STRAY if typ != "VARCHAR" else st.none())


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(0, 40))
def test_decoded_columns_are_what_pa_array_makes_of_the_values(data, n):
    fields = tuple(TABLE)
    rows = [tuple(data.draw(_column(TABLE[f])) for f in fields) for _ in range(n)]
    buf = cplane.C.RowBuffer(len(fields))
    for row in rows:
        buf.append(row)
    got = table_columns("t", fields, buf.take())
    for i, f in enumerate(fields):
        values = [row[i] for row in rows]
        col = got[f]
        if isinstance(col, pa.Array):  # built straight: only where every value fits the type
            assert col.equals(pa.array(values, type=_ARROW_TYPES[TABLE[f]]))
            col.validate(full=True)
        else:  # the values themselves, as the tuples held them: `_arrow` decides, as before
            assert [(type(v), v) for v in col] == [(type(v), v) for v in values]
            try:
                expected = pa.array(values, type=_ARROW_TYPES[TABLE[f]])
            except (OverflowError, TypeError, pa.ArrowInvalid, pa.ArrowTypeError):
                with pytest.raises((OverflowError, TypeError, pa.ArrowInvalid, pa.ArrowTypeError)):
                    _arrow("t", f, col)
            else:
                assert _arrow("t", f, col).equals(expected)


def test_a_column_of_one_type_is_built_straight_and_a_stray_value_sends_it_the_old_way():
    buf = cplane.C.RowBuffer(2)
    for row in ((1, 0.5), (None, 2), (3, None)):  # 2 is an int in a DOUBLE column
        buf.append(row)
    got = table_columns("t", ("i", "d"), buf.take())
    assert isinstance(got["i"], pa.Array) and got["i"].to_pylist() == [1, None, 3] and got["i"].null_count == 1
    assert got["d"] == (0.5, 2, None)
    assert table_columns("t", ("i", "d"), [(1, 0.5)]) == {"i": (1,), "d": (0.5,)}  # plain tuples: zipped


def test_the_engine_enum_members_are_encoded_as_their_text_and_built_straight():
    """Tier / EvictionAction / TransferKind members (StrEnum: str subclasses) at the eviction and
    transfer emit sites: RowBuffer encodes their text as a str's, so their VARCHAR column is
    built straight as Arrow (as 'O' objects they were pickled to the writer and the whole column
    converted from Python values), holding what pa.array makes of the members themselves: the
    stored value is the same text either way."""
    from tierdiag.config.names import EvictionAction, Tier, TransferKind

    members = [*Tier, *EvictionAction, *TransferKind, None]
    buf = cplane.C.RowBuffer(1)
    for m in members:
        buf.append((m,))
    data, n, objects = payload = buf.take()
    assert objects is None  # nothing kept as an object: no pickling of members
    col = table_columns("t", ("s",), payload)["s"]
    assert isinstance(col, pa.Array)
    assert col.equals(pa.array(members, type=pa.string()))
    assert col.to_pylist() == [None if m is None else m.value for m in members]
