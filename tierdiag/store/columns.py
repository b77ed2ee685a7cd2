"""The recorder's rows as the store's Arrow columns: the schema's column types as Arrow types,
one column converted (`arrow_column`), and a hand-over of rows made columns (`table_columns`:
zipped tuples, or the compiled row buffer's encoding decoded straight into Arrow buffers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tierdiag.store.reader import first_line
from tierdiag.store.schema import TABLES

_ARROW_TYPES = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP": pa.timestamp("us"),
}


# The compiled row decoder's kinds (_cplane.decode_arrow), by column type: the types whose Arrow
# arrays it builds straight from the encoded rows. The others come back as Python values.
# INTEGER (int32: every table's dp_rank, requests.best_rank) too, an int outside its range sending
# the column the old way (pa.array refuses it, as before).
_DECODE_KIND = {"BIGINT": b"i", "INTEGER": b"n", "DOUBLE": b"d", "BOOLEAN": b"b", "VARCHAR": b"s"}
_FROM_BUFFERS = {"i": pa.int64(), "n": pa.int32(), "d": pa.float64(), "b": pa.bool_()}


def table_columns(table: str, fields: tuple[str, ...], rows) -> dict[str, Any]:
    """A recorder's rows of `table` as columns: rows a list of tuples (zipped), or the compiled
    row buffer's encoding, decoded by `_cplane.decode_arrow` straight into Arrow arrays for the
    columns whose every value fits their type as pa.array would take it (an int in a BIGINT
    column, a str in a VARCHAR one, None anywhere), and into the Python values for the rest,
    which `arrow_column` converts (and refuses) as it always did. Measured on the conversation trace's
    hand-overs: ~0.03 s against ~0.4 s decoding into Python values and converting those."""
    if isinstance(rows, dict):
        return _columnar(table, fields, rows)
    if isinstance(rows, list):
        from tierdiag.probes.recorder import columns_of

        return columns_of(fields, rows)
    from tierdiag.native import cplane

    decode_arrow = cplane.compiled("decode_arrow")
    if decode_arrow is None:  # only the compiled data plane encodes rows, and it chose for both processes
        raise RuntimeError(f"encoded rows of {table} but no compiled data plane to decode them: {cplane.WHY_NOT}")
    schema = TABLES.get(table, {})
    kinds = [_DECODE_KIND.get(schema.get(f), b"o") for f in fields]
    data, n, objects = rows
    out: dict[str, Any] = {}
    for f, col in zip(fields, decode_arrow(data, n, objects, b"".join(kinds))):
        kind = col[0]
        if kind == "o":
            out[f] = col[1]
        elif kind == "s":
            _, offsets, chars, valid, nulls = col
            out[f] = pa.Array.from_buffers(pa.string(), n, [_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(chars)],
                                           null_count=nulls)
        else:
            _, values, valid, nulls = col
            out[f] = pa.Array.from_buffers(_FROM_BUFFERS[kind], n, [_buffer(valid), pa.py_buffer(values)],
                                           null_count=nulls)
    return out


def _columnar(table: str, fields: tuple[str, ...], hand: dict) -> dict[str, Any]:
    """`table_columns` for a columnar hand-over (engine/emitters.py's Columns.take(): the ints
    as int64 bytes row after row, the objects as lists, tuples of columns, constants; the other
    rows as the recorder's buffer took them, with their places among the others): every column
    an Arrow array or the values arrow_column converts, the rows in the order they were
    appended. An int column is its values taken out of the rows by numpy (the rows transposed in
    one copy, on the writer's core: the engine wrote each row's ints side by side), a BIGINT column Arrow's
    array over them (no Python int made), another (INTEGER: dp_rank) the numpy array, cast by
    arrow_column (a value that does not fit is its OverflowError naming the column)."""
    from tierdiag.probes.recorder import columnar_order

    n = hand["n"]
    cols: dict[str, Any] = {}
    for name, value in hand["constants"]:
        cols[name] = [value] * n
    schema = TABLES.get(table, {})
    names, block = hand["ints"]
    width = len(names)
    size = memoryview(block).nbytes  # bytes, or a slice of the frame (frames.loads)
    if size != 8 * n * width:
        raise ValueError(f"{table}: a columnar hand-over's ints are {size} bytes, not {n} rows of {width} int64")
    # the rows turned into columns in one copy (numpy's transpose, in C): each column a contiguous row of it
    by_column = np.frombuffer(block, dtype=np.int64).reshape(n, width).T.copy()
    for j, name in enumerate(names):
        values = by_column[j]
        cols[name] = (pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(values)], null_count=0)
                      if schema.get(name) == "BIGINT" else values)
    coded, dictionary = hand["coded"]
    for name in coded:
        if name in cols:
            cols[name] = coded_column(table, name, by_column[names.index(name)], dictionary)
    for name, values in hand["objects"].items():
        cols[name] = text_column(table, name, n, values) if isinstance(values, tuple) else values
    for names, rows in hand["tuples"]:
        cols.update(zip(names, zip(*rows)) if rows else ((f, ()) for f in names))
    missing = [f for f in fields if f not in cols]
    if missing:
        raise ValueError(f"{table}: a columnar hand-over without columns {missing}")
    order = columnar_order(n, hand["at"])
    if order is None:
        return {f: cols[f] for f in fields}
    other = table_columns(table, fields, hand["rows"])
    take = pa.array(order, type=pa.int64())
    return {f: pa.concat_arrays([arrow_column(table, f, cols[f]), arrow_column(table, f, other[f])]).take(take)
            for f in fields}


def text_column(table: str, col: str, n: int, sent: tuple) -> Any:
    """An object column sent as text (store/frames.py's out_of_band: (TEXT, int32 offsets, UTF-8
    data, validity bitmap or None, nulls), `_cplane.text_column`'s buffers) as the Arrow string
    array on those buffers (no Python object a row), checked (offsets rising within the data,
    valid UTF-8: a ValueError naming the column otherwise). A column the schema does not type
    VARCHAR is given back as its Python values, which arrow_column converts (and refuses) as it
    did the list that was sent before."""
    if len(sent) != 5 or sent[0] != "text":
        raise ValueError(f"{table}.{col}: a columnar hand-over's text column is not (text, offsets, data, valid, nulls)")
    _, offsets, data, valid, nulls = sent
    if memoryview(offsets).nbytes != 4 * (n + 1) or not isinstance(nulls, int) or not 0 <= nulls <= n \
            or (valid is None) != (nulls == 0) or (valid is not None and memoryview(valid).nbytes != (n + 7) // 8):
        raise ValueError(f"{table}.{col}: a columnar hand-over's text column is not {n} rows")
    try:
        array = pa.Array.from_buffers(pa.string(), n, [_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)],
                                      null_count=nulls)
        array.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise ValueError(f"{table}.{col}: a columnar hand-over's text column does not read back ({first_line(exc)})") from None
    if TABLES.get(table, {}).get(col) != "VARCHAR":
        return array.to_pylist()
    return array


def coded_column(table: str, col: str, codes: np.ndarray, dictionary: list) -> Any:
    """A coded column (engine/emitters.py's Columns: an index a row into the hand-over's
    dictionary) as its values: a VARCHAR column the Arrow string array gathered from the
    dictionary's own (pa.array of the dictionary, as arrow_column would make each value; each
    row's offsets and UTF-8 bytes taken by its code in numpy: no Python object a row), any other
    column, or a dictionary pa.array refuses (a lone surrogate, a value that is no text), the
    Python values, which arrow_column converts (and refuses) as it always did. A code outside
    the dictionary is a ValueError naming the column."""
    n = len(codes)
    k = len(dictionary)
    if n and (int(codes.min()) < 0 or int(codes.max()) >= k):
        raise ValueError(f"{table}.{col}: a columnar hand-over's codes are not its dictionary's {k}")
    if TABLES.get(table, {}).get(col) == "VARCHAR" and n:
        try:
            words = pa.array(dictionary, type=pa.string())
        except (pa.ArrowException, UnicodeEncodeError, TypeError, ValueError, OverflowError):
            words = None  # refused as arrow_column refuses the rows' values (below)
        if words is not None:
            _, word_offsets, chars = words.buffers()
            at = np.frombuffer(word_offsets, dtype=np.int32, count=k + 1).astype(np.int64)
            row_lens = (at[1:] - at[:-1])[codes]
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(row_lens, out=offsets[1:])
            total = int(offsets[-1])
            if total < 2**31:
                # each row's bytes: its value's bytes in the dictionary's, byte by byte
                take = np.arange(total, dtype=np.int64) + np.repeat(at[:-1][codes] - offsets[:-1], row_lens)
                data = np.frombuffer(chars, dtype=np.uint8)[take] if total else np.zeros(0, dtype=np.uint8)
                nulls = 0
                valid = None
                if words.null_count:
                    null = ~_valid_chunk(words)[codes]
                    nulls = int(null.sum())
                    valid = pa.py_buffer(np.packbits(~null, bitorder="little")) if nulls else None
                return pa.Array.from_buffers(pa.string(), n, [valid, pa.py_buffer(offsets.astype(np.int32)),
                                                               pa.py_buffer(data)], null_count=nulls)
    return [dictionary[c] for c in codes.tolist()]


def _buffer(data: bytes | None):
    return None if data is None else pa.py_buffer(data)


def arrow_column(table: str, col: str, values: Any) -> pa.Array:
    """One column's values as the Arrow array of its schema type; a value that does not fit is an
    OverflowError naming the table and column."""
    if isinstance(values, pa.Array):
        return values
    typ = TABLES[table].get(col)
    if typ is None:
        raise ValueError(f"{table}: column {col!r} is not in the schema")
    try:
        return pa.array(values, type=_ARROW_TYPES[typ])
    except (OverflowError, pa.ArrowInvalid) as exc:
        raise OverflowError(f"{table}.{col}: a value does not fit {typ} ({first_line(exc)})") from None


# What the writer process reads of the columns it took (the live pass's rows, the story's
# parts: diagnose/run/live_curves.py `rows_of`, diagnose/read/run_context.py `taken_story_rows`),
# read from the arrays' own buffers: pyarrow.compute's import (~0.07-0.09 s of the writer's CPU,
# its ~280 functions wrapped and documented at import; issue 41, session 27) is not made in the
# writer process at all, and no per-call wrapper runs (~480 calls a conversation replay).


def _chunks_of(values) -> list:
    if isinstance(values, pa.ChunkedArray):
        return values.chunks
    return [values if isinstance(values, pa.Array) else pa.array(values)]


def _joined_np(parts: list, dtype) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _valid_chunk(a: pa.Array) -> np.ndarray:
    n = len(a)
    nulls = a.null_count
    if nulls == 0:
        return np.ones(n, dtype=bool)
    if nulls == n:
        return np.zeros(n, dtype=bool)
    bits = np.frombuffer(a.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, count=a.offset + n, bitorder="little")[a.offset:].astype(bool)


def arrow_valid(values) -> np.ndarray:
    """Which of `values` (an Arrow array, chunked or not, or what pa.array takes) are not NULL:
    pyarrow.compute's `is_valid(values).to_numpy()`, as a bool array."""
    return _joined_np([_valid_chunk(a) for a in _chunks_of(values)], bool)


def _ints_chunk(a: pa.Array, fill: int) -> np.ndarray:
    n = len(a)
    if a.null_count == n:
        return np.full(n, fill, dtype=np.int64)
    t = a.type
    if pa.types.is_integer(t):
        width = np.dtype(t.to_pandas_dtype())
        values = np.frombuffer(a.buffers()[1], dtype=width, count=a.offset + n)[a.offset:]
        values = np.asarray(values, dtype=np.int64)
    elif pa.types.is_floating(t) or pa.types.is_boolean(t):  # as fill_null then numpy's int64 made it
        values = np.asarray(a.to_numpy(zero_copy_only=False))
    else:  # what fill_null with an int refuses too
        raise TypeError(f"{t} values are not ints")
    if a.null_count:
        values = np.where(_valid_chunk(a), values, fill)
    return np.asarray(values, dtype=np.int64)


def arrow_ints(values, fill: int = 0) -> np.ndarray:
    """`values` (an Arrow int array, chunked or not, or what pa.array takes) as int64, each NULL
    `fill`: pyarrow.compute's `fill_null(values, fill).to_numpy()` as int64, exact (no float
    on the way for a column with NULLs)."""
    return _joined_np([_ints_chunk(a, fill) for a in _chunks_of(values)], np.int64)


def arrow_is(values, text: str, *, null: bool) -> np.ndarray:
    """Which of `values` (an Arrow string array, chunked or not, or what pa.array takes) equal
    `text`, a NULL counting as `null`: pyarrow.compute's `fill_null(equal(values, text), null)`
    (as `equal(fill_null(values, text), text)` where `null` is True)."""
    parts = []
    for a in _chunks_of(values):
        t = a.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
            raise TypeError(f"{t} values are not text")  # what equal() with a string refuses too
        valid = _valid_chunk(a)
        if valid.any():
            parts.append(np.where(valid, _text_is(a, text.encode()), null))
        else:
            parts.append(np.full(len(a), null, dtype=bool))
    return _joined_np(parts, bool)


def _text_is(a: pa.Array, want: bytes) -> np.ndarray:
    """Which values of the string array `a` are the UTF-8 bytes `want`, compared byte for byte in
    its buffers (as Arrow's `equal` does; numpy's string compare drops trailing NULs)."""
    n = len(a)
    _, offsets, data = a.buffers()
    width = np.int64 if pa.types.is_large_string(a.type) else np.int32
    off = np.frombuffer(offsets, dtype=width, count=a.offset + n + 1)[a.offset:].astype(np.int64)
    same = (off[1:] - off[:-1]) == len(want)
    if want and same.any():
        chars = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
        at = off[:-1][same]
        same[same] = (chars[at[:, None] + np.arange(len(want))] == np.frombuffer(want, dtype=np.uint8)).all(axis=1)
    return same
