"""The storage tier's compiled page write and read (`_cplane.pwrite_rows` / `pread_rows`,
csrc/storage_io.c) against their reference (storage._gather_rows + os.pwrite; read_pages'
preadv + numpy's scatter): the same bytes at the same offset and in the same slots for any
pool layout and page list, and for anything they cannot prove safe (a page outside the pool, a
list of something else, a negative offset or descriptor, not a (writable) row view) -1 with
nothing written or read, so the tier falls back to numpy and its errors. A failing write or
read is an OSError with the system's errno, which the tier turns into its one-line OutputError
(a write's file truncated back; a short read the "page file truncated" error, the pool as it
was)."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tierdiag.engine import rows as _rows
from tierdiag.engine import storage
from tierdiag.engine.storage import StorageTier
from tierdiag.errors import OutputError
from tierdiag.native import cplane

pytestmark = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")


def pool_rows(layers: int, pages: int, elems: int, page_first: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if page_first:
        buf = rng.integers(-(1 << 62), 1 << 62, (pages, layers, elems), dtype=np.int64).transpose(1, 0, 2)
    else:
        buf = rng.integers(-(1 << 62), 1 << 62, (layers, pages, elems), dtype=np.int64)
    return _rows.array_rows(buf, page_first=page_first)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.integers(1, 4), pages=st.integers(1, 40), elems=st.integers(1, 24), page_first=st.booleans(),
       data=st.data(), offset=st.integers(0, 1 << 20), seed=st.integers(0, 2**32 - 1))
def test_the_compiled_write_puts_the_reference_bytes_at_the_offset(tmp_path, layers, pages, elems, page_first,
                                                                   data, offset, seed):
    rows = pool_rows(layers, pages, elems, page_first, seed)
    slots = data.draw(st.lists(st.integers(0, pages - 1), max_size=80))  # repeats and any order
    path = tmp_path / f"seg-{seed}-{offset}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        got = cplane.C.pwrite_rows(fd, offset, rows, slots)
    finally:
        os.close(fd)
    want = storage._gather_rows(rows, slots).tobytes()
    assert got == len(want)
    on_disk = path.read_bytes()
    assert on_disk[offset:] == want
    assert len(on_disk) == (offset + len(want) if want else 0)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.one_of(
    st.lists(st.integers(-(1 << 70), 1 << 70), min_size=1, max_size=6).filter(
        lambda v: any(x < 0 or x >= 8 for x in v)),  # some page outside the 8-page pool
    st.lists(st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.none()), min_size=1, max_size=4),
    st.just("0123"), st.just(object())),
    offset=st.one_of(st.just(0), st.integers(-(1 << 40), -1)))
def test_what_it_cannot_prove_safe_is_declined_with_nothing_written(tmp_path, pages, offset):
    rows = pool_rows(2, 8, 4, False, 1)
    path = tmp_path / "seg"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        got = cplane.C.pwrite_rows(fd, offset, rows, pages)
    finally:
        os.close(fd)
    assert got == -1
    assert path.read_bytes() == b""


@pytest.mark.parametrize("args", [(-1, 0), (1 << 40, 0)], ids=["negative fd", "huge fd"])
def test_a_descriptor_out_of_range_or_not_a_row_view_is_declined(args):
    rows = pool_rows(2, 8, 4, False, 1)
    assert cplane.C.pwrite_rows(args[0], args[1], rows, [0, 1]) == -1
    assert cplane.C.pwrite_rows(0, 0, np.zeros(8), [0]) == -1  # 1-D: not a row view
    with pytest.raises(TypeError):
        cplane.C.pwrite_rows(0, 0, rows)
    with pytest.raises(TypeError):
        cplane.C.pwrite_rows("3", 0, rows, [0])


def test_a_failing_write_is_the_systems_oserror(tmp_path):
    rows = pool_rows(2, 8, 4, False, 1)
    fd = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as err:
            cplane.C.pwrite_rows(fd, 0, rows, [0, 1])
        assert err.value.errno == errno.EBADF
    finally:
        os.close(fd)


def test_the_tier_writes_the_same_files_with_and_without_the_compiled_write(tmp_path, monkeypatch):
    # The same writes (repeats, deletions, a full segment) through the compiled write and through
    # numpy's gather: byte-identical segment files and index.
    monkeypatch.setattr(storage, "SEGMENT_BYTES", 8 * 2 * 4 * 8)
    rng = np.random.default_rng(7)
    buf = rng.integers(-(1 << 62), 1 << 62, (2, 64, 4), dtype=np.int64)
    writes = [(rng.integers(0, 64, rng.integers(1, 12)).tolist(), rng.integers(0, 90, 12).tolist())
              for _ in range(60)]
    trees = {}
    # "c-rows": the engine's call (the host pool's row view kept: write_from's fast path, its
    # geometry checked once for that view)
    for name, fn, rows in (("c", storage._pwrite_rows, None), ("numpy", None, None),
                           ("c-rows", storage._pwrite_rows, _rows.array_rows(buf))):
        monkeypatch.setattr(storage, "_pwrite_rows", fn)
        tier = StorageTier(tmp_path / name, 30)
        for slots, keys in writes:
            tier.write_from(buf, slots, keys[:len(slots)], rows=rows)
        tier.flush()  # ("c-rows" writes on the writer's thread)
        trees[name] = ({p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())},
                       tier._index.keys(), tier.bytes_written)
        tier.close()
    assert trees["c"] == trees["numpy"] == trees["c-rows"]


def test_a_pool_of_another_geometry_is_refused_though_the_engines_write_checks_it_once(tmp_path):
    # write_from with the pool's row view checks the pages' geometry at the first write through
    # that view, not at each: a second view of another geometry is still checked, and refused.
    tier = StorageTier(tmp_path / "st", 30)
    assert tier.page_bytes == 0  # no page written yet: no geometry
    buf = np.zeros((2, 8, 4), dtype=np.int64)
    rows = _rows.array_rows(buf)
    tier.write_from(buf, [0, 1], [10, 11], rows=rows)
    tier.write_from(buf, [2], [12], rows=rows)
    assert tier.page_bytes == 2 * 4 * 8 and [12 in tier, tier.used_pages] == [True, 3]
    other = np.zeros((3, 8, 4), dtype=np.int64)
    with pytest.raises(AssertionError, match="storage pages are"):
        tier.write_from(other, [0], [13], rows=_rows.array_rows(other))
    assert 13 not in tier
    tier.close()


def test_a_full_disk_in_the_compiled_write_is_an_output_error_and_keeps_no_half_page(tmp_path, monkeypatch):
    calls = []

    def full(fd, offset, rows, pages):
        calls.append(offset)
        os.pwrite(fd, b"x" * 100, offset)  # part of a page reached the file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage, "_pwrite_rows", full)
    monkeypatch.setattr(storage, "_PageWriter", None)  # the write in the caller's thread (test_page_writer.py: the thread's)
    tier = StorageTier(tmp_path / "st", 30)
    buf = np.zeros((2, 8, 4), dtype=np.int64)
    with pytest.raises(OutputError, match="cannot use the storage tier at .*st.*No space left"):
        tier.write_from(buf, [0, 1], [10, 11])
    assert calls == [0]
    assert [p.stat().st_size for p in (tmp_path / "st").iterdir()] == [0]  # truncated back
    assert 10 not in tier and 11 not in tier  # pages that never reached the disk are not in the tier


# --- the compiled read (`_cplane.pread_rows`) ---------------------------------------------------

@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.integers(1, 4), pages=st.integers(1, 40), elems=st.integers(1, 24), page_first=st.booleans(),
       data=st.data(), offset=st.integers(0, 4096), seed=st.integers(0, 2**32 - 1))
def test_the_compiled_read_puts_each_file_page_into_the_slot_named(tmp_path, layers, pages, elems, page_first,
                                                                  data, offset, seed):
    src = pool_rows(layers, pages, elems, page_first, seed)
    written = data.draw(st.lists(st.integers(0, pages - 1), max_size=40))
    into = data.draw(st.lists(st.integers(0, pages - 1), min_size=len(written), max_size=len(written)))
    path = tmp_path / f"seg-{seed}-{offset}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert cplane.C.pwrite_rows(fd, offset, src, written) == len(written) * layers * elems * 8
        dst = pool_rows(layers, pages, elems, page_first, seed + 1)
        want = dst.copy()
        want[:, into] = src[:, written]  # numpy's scatter (the last of a slot named twice wins)
        assert cplane.C.pread_rows(fd, offset, dst, into) == len(written) * layers * elems * 8
    finally:
        os.close(fd)
    assert dst.tobytes() == want.tobytes()


def test_a_short_file_gives_the_count_read_and_leaves_the_pool_alone(tmp_path):
    rows = pool_rows(2, 8, 4, False, 1)
    path = tmp_path / "seg"
    path.write_bytes(b"\1" * (2 * 4 * 8 + 10))  # one page and 10 bytes
    before = rows.tobytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert cplane.C.pread_rows(fd, 0, rows, [3, 4]) == 2 * 4 * 8 + 10
        assert cplane.C.pread_rows(fd, 1 << 20, rows, [3]) == 0  # past the end
    finally:
        os.close(fd)
    assert rows.tobytes() == before


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.one_of(
    st.lists(st.integers(-(1 << 70), 1 << 70), min_size=1, max_size=6).filter(
        lambda v: any(x < 0 or x >= 8 for x in v)),
    st.lists(st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.none()), min_size=1, max_size=4),
    st.just("0123"), st.just(object())),
    offset=st.one_of(st.just(0), st.integers(-(1 << 40), -1)))
def test_a_read_it_cannot_prove_safe_is_declined_with_the_pool_untouched(tmp_path, pages, offset):
    rows = pool_rows(2, 8, 4, False, 1)
    before = rows.tobytes()
    path = tmp_path / "seg"
    path.write_bytes(b"\7" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert cplane.C.pread_rows(fd, offset, rows, pages) == -1
        assert cplane.C.pread_rows(fd, 0, rows.copy()[:, :0], [0]) == -1  # page outside an empty pool
        ro = rows.copy()
        ro.flags.writeable = False
        assert cplane.C.pread_rows(fd, 0, ro, [0]) == -1  # not writable
    finally:
        os.close(fd)
    assert rows.tobytes() == before


def test_a_failing_read_is_the_systems_oserror(tmp_path):
    rows = pool_rows(2, 8, 4, False, 1)
    fd = os.open(tmp_path / "wo", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as err:
            cplane.C.pread_rows(fd, 0, rows, [0])
        assert err.value.errno == errno.EBADF
    finally:
        os.close(fd)


@pytest.mark.parametrize("page_first", [False, True], ids=["layer-first", "page-first"])
def test_the_tier_reads_the_same_pages_with_and_without_the_compiled_read(tmp_path, monkeypatch, page_first):
    # Writes with deletions and a small segment size (reads span segments and runs), then reads
    # of random held keys into random slots: the pool and the tier's counts the same both ways.
    monkeypatch.setattr(storage, "SEGMENT_BYTES", 8 * 2 * 4 * 8)
    rng = np.random.default_rng(11)
    src = rng.integers(-(1 << 62), 1 << 62, (2, 64, 4), dtype=np.int64)
    if page_first:
        src = np.ascontiguousarray(src.transpose(1, 0, 2)).transpose(1, 0, 2)
    out = {}
    for name, fn in (("c", storage._pread_rows), ("numpy", None)):
        monkeypatch.setattr(storage, "_pread_rows", fn)
        tier = StorageTier(tmp_path / name, 30)
        wrng = np.random.default_rng(3)
        dst = np.zeros((64, 2, 4), dtype=np.int64).transpose(1, 0, 2) if page_first else np.zeros_like(src)
        for step in range(80):
            slots = wrng.integers(0, 64, wrng.integers(1, 10)).tolist()
            tier.write_from(src, slots, wrng.integers(0, 90, len(slots)).tolist())
            held = tier._index.keys()
            if held:
                keys = [held[k] for k in wrng.choice(len(held), min(len(held), int(wrng.integers(1, 8))),
                                                     replace=False)]
                into = wrng.integers(0, 64, len(keys)).tolist()
                assert tier.read_into(keys, dst, into) == len(keys) * tier.page_bytes
        out[name] = (dst.tobytes(), tier._index.keys(), tier.bytes_read)
        tier.close()
    assert out["c"] == out["numpy"]


def test_a_truncated_segment_read_by_the_compiled_read_is_an_output_error(tmp_path):
    tier = StorageTier(tmp_path / "st", 16)
    buf = np.ones((2, 8, 4), dtype=np.int64)
    tier.write_from(buf, [0, 1], [1, 2])
    tier.flush()  # the writer's thread wrote them (the file is then cut short behind its back)
    seg = next((tmp_path / "st").glob("*.kvseg"))
    with open(seg, "r+b") as fh:
        fh.truncate(tier.page_bytes + 8)
    dst = np.zeros_like(buf)
    with pytest.raises(OutputError, match=r"storage tier at .*kvseg: page file truncated \(read 72 of 128 bytes\)"):
        tier.read_into([1, 2], dst, [3, 4])
    assert not dst.any()  # nothing of a short run reaches the pool
