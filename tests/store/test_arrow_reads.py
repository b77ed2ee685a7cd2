"""store/columns.py's reads of taken columns (`arrow_valid`, `arrow_ints`, `arrow_is`): what the
writer process reads of its rows without pyarrow.compute, held equal to pyarrow.compute's
answers on hostile arrays (NULLs anywhere, int64's and int32's ends, slices that start inside a
validity byte, chunked arrays of any chunking, none at all, all-NULL and NULL-typed columns,
Python lists)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.store.columns import arrow_ints, arrow_is, arrow_valid

I64 = st.integers(min_value=-2**63, max_value=2**63 - 1)
I32 = st.integers(min_value=-2**31, max_value=2**31 - 1)
TEXT = st.sampled_from(["finished", "dropped", "", "Finished", "finished ", "\x00", "é"])


@st.composite
def arrays(draw, values, typ):
    """An Arrow array of `typ` (or a Python list, or a chunked array), sliced anywhere."""
    items = draw(st.lists(st.none() | values, max_size=40))
    whole = pa.array(items, type=typ)
    start = draw(st.integers(0, len(items)))
    stop = draw(st.integers(start, len(items)))
    part = whole.slice(start, stop - start)
    shape = draw(st.sampled_from(["array", "chunked", "list"]))
    if shape == "list":
        return part.to_pylist()
    if shape == "chunked":
        cuts = sorted(draw(st.lists(st.integers(0, len(part)), max_size=4)))
        bounds = [0, *cuts, len(part)]
        return pa.chunked_array([part.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], type=part.type)
    return part


def _reference(values, typ=None):
    ref = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    # a list of NULLs only is NULL-typed, which fill_null refuses: read as the column's type (SQL's coalesce)
    return ref.cast(typ) if typ is not None and ref.type == pa.null() else ref


@settings(max_examples=300, deadline=None)
@given(arrays(I64, pa.int64()) | arrays(I32, pa.int32()), I64)
def test_ints_and_validity_are_pyarrow_computes(values, fill):
    ref = _reference(values, pa.int64())
    want_valid = np.asarray(pc.is_valid(ref).to_numpy(zero_copy_only=False), dtype=bool)
    got_valid = arrow_valid(values)
    assert got_valid.dtype == bool and got_valid.tolist() == want_valid.tolist()
    if ref.type == pa.int32() and not -2**31 <= fill < 2**31:
        fill = 7  # fill_null casts the fill to the column's type
    want = pc.fill_null(ref, fill).to_pylist() if len(ref) else []
    got = arrow_ints(values, fill)
    assert got.dtype == np.int64 and got.tolist() == [fill if v is None else v for v in want]


@settings(max_examples=300, deadline=None)
@given(arrays(TEXT, pa.string()) | arrays(TEXT, pa.large_string()), TEXT, st.booleans())
def test_text_equality_is_pyarrow_computes(values, text, null):
    ref = _reference(values, pa.string())
    want = pc.fill_null(pc.equal(ref, text), null).to_pylist() if len(ref) else []
    got = arrow_is(values, text, null=null)
    assert got.dtype == bool and got.tolist() == want


@pytest.mark.parametrize("n", [0, 1, 9])
def test_all_null_and_null_typed_columns(n):
    for values in (pa.nulls(n), pa.nulls(n, type=pa.int64()), pa.nulls(n, type=pa.string()), [None] * n,
                   pa.chunked_array([], type=pa.int64())):
        m = len(values)
        assert arrow_valid(values).tolist() == [False] * m
        assert arrow_ints(values, -3).tolist() == [-3] * m
    for values in (pa.nulls(n), pa.nulls(n, type=pa.string())):
        assert arrow_is(values, "finished", null=True).tolist() == [True] * n
        assert arrow_is(values, "finished", null=False).tolist() == [False] * n


def test_columns_of_another_type_are_refused_as_pyarrow_compute_refuses_them():
    struct = pa.array([{"x": 1}, None])
    with pytest.raises(TypeError):
        arrow_is(struct, "finished", null=True)
    with pytest.raises(TypeError):
        arrow_ints(struct, 0)
    with pytest.raises(TypeError):
        arrow_is(pa.array([1, 2]), "finished", null=True)
    assert arrow_ints(pa.array([1.0, None, 2.9]), 5).tolist() == [1, 5, 2]  # fill_null, then numpy's int64
    assert arrow_ints(pa.array([True, None, False]), 0).tolist() == [1, 0, 0]
