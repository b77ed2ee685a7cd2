"""The storage tier's page writes on a thread of their own (`_cplane.PageWriter`, csrc/storage_io.c),
against their reference, the write in the caller's thread (`pwrite_rows`, and numpy's gather with
os.pwrite where the compiled data plane is not built): the same bytes at the same offsets once a
fence returns, whatever the queue's bounds; what `pwrite_rows` declines declined alike, nothing
queued; a failed write (a full disk) kept, every later write dropped, reported by every later put
(the system's OSError) and fence (its fd, offset and errno), where the tier raises the one-line
OutputError (exit 6) a write in the caller's thread raises, its file cut back.

SGLang writes its storage tier from HiCacheController's backup thread
(managers/cache_controller.py, `backup_thread_func`); the timing model and every row are virtual
and stay as they were: only the real bytes' path moved (benchmarks/README.md, session 25,
h41stor12)."""

from __future__ import annotations

import errno
import os
import re
import resource
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tierdiag.engine import rows as _rows
from tierdiag.engine import storage
from tierdiag.engine.storage import StorageTier
from tierdiag.errors import OutputError
from tierdiag.native import cplane
from tests.engine.test_storage_io import pool_rows

pytestmark = pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}")

LAYERS, ELEMS = 2, 4  # 64 B a page


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.integers(1, 4), pages=st.integers(1, 40), elems=st.integers(1, 16), page_first=st.booleans(),
       data=st.data(), seed=st.integers(0, 2**32 - 1), max_pending=st.integers(1, 1 << 14),
       wake=st.integers(1, 1 << 14))
def test_the_writers_files_are_the_callers_thread_writes_byte_for_byte(tmp_path, layers, pages, elems, page_first,
                                                                     data, seed, max_pending, wake):
    # Jobs to two files at any offsets (overlapping ones too: the queue keeps their order), the
    # pool changed after each put (the bytes are gathered at the call): after a fence the files
    # are what pwrite_rows writes, call after call, in the caller's thread.
    rows = pool_rows(layers, pages, elems, page_first, seed)
    jobs = data.draw(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4096),
                                        st.lists(st.integers(0, pages - 1), max_size=30)), max_size=12))
    paths = {side: [tmp_path / f"{side}-{seed}-{i}" for i in range(2)] for side in ("thread", "here")}
    fds = {side: [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) for p in ps] for side, ps in paths.items()}
    writer = cplane.C.PageWriter(max_pending, min(wake, max_pending))
    try:
        for n, (f, offset, slots) in enumerate(jobs):
            snapshot = rows.copy()
            want = len(slots) * layers * elems * 8
            assert writer.put(fds["thread"][f], offset, rows, slots) == want
            rows[:] = np.roll(rows, 1, axis=1)  # the pool moves on; the queued bytes do not
            assert cplane.C.pwrite_rows(fds["here"][f], offset, snapshot, slots) == want
        assert writer.fence() is None
        stats = writer.stats()
        assert stats["pending"] == 0 and stats["dropped"] == 0
        assert stats["jobs"] == sum(1 for _, _, s in jobs if s)  # an empty write queues nothing
    finally:
        assert writer.close() is None
        for fd in fds["thread"] + fds["here"]:
            os.close(fd)
    for a, b in zip(paths["thread"], paths["here"]):
        assert a.read_bytes() == b.read_bytes()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.one_of(
    st.lists(st.integers(-(1 << 70), 1 << 70), min_size=1, max_size=6).filter(
        lambda v: any(x < 0 or x >= 8 for x in v)),  # some page outside the 8-page pool
    st.lists(st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.none()), min_size=1, max_size=4),
    st.just("0123"), st.just(object())),
    offset=st.one_of(st.just(0), st.integers(-(1 << 40), -1)), fd=st.sampled_from([None, -1, 1 << 40]))
def test_what_pwrite_rows_declines_the_writer_declines_queuing_nothing(tmp_path, pages, offset, fd):
    rows = pool_rows(2, 8, 4, False, 1)
    path = tmp_path / "seg"
    own = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    writer = cplane.C.PageWriter()
    try:
        use = own if fd is None else fd
        assert writer.put(use, offset, rows, pages) == -1
        assert writer.put(own, 0, np.zeros(8), [0]) == -1  # 1-D: not a row view
        assert writer.fence() is None and writer.stats()["jobs"] == 0
    finally:
        writer.close()
        os.close(own)
    assert path.read_bytes() == b""


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(max_pending=0), ValueError, r"PageWriter\(max_pending\): must be >= 1, got 0"),
    (dict(max_pending=-5), ValueError, r"PageWriter\(max_pending\): must be >= 1, got -5"),
    (dict(max_pending=1 << 70), OverflowError, "too large"),
    (dict(max_pending=float("nan")), TypeError, "integer"),
    (dict(max_pending=1.5), TypeError, "integer"),
    (dict(max_pending="16"), TypeError, "integer"),
    (dict(max_pending="\u00e9\n"), TypeError, "integer"),
    (dict(wake_bytes=0), ValueError, r"PageWriter\(wake_bytes\): must be 1 to max_pending"),
    (dict(max_pending=10, wake_bytes=11), ValueError, r"must be 1 to max_pending \(10\), got 11"),
    (dict(wake_bytes=-(1 << 70)), OverflowError, "too large"),
    (dict(wake_bytes=None), TypeError, "integer"),
], ids=["zero", "negative", "huge", "nan", "float", "text", "unicode", "wake zero", "wake past max",
        "wake huge negative", "wake none"])
def test_hostile_bounds_are_refused_in_one_line(kwargs, error, message):
    with pytest.raises(error, match=message) as err:
        cplane.C.PageWriter(**kwargs)
    assert "\n" not in str(err.value).strip()


@pytest.mark.parametrize("args, error", [((-2,), ValueError), ((1 << 40,), ValueError), (("3",), TypeError),
                                         ((float("nan"),), TypeError), ((0, "a"), TypeError)],
                         ids=["fd -2", "fd huge", "fd text", "fd nan", "start text"])
def test_a_hostile_fence_is_refused(args, error):
    writer = cplane.C.PageWriter()
    try:
        with pytest.raises(error):
            writer.fence(*args)
    finally:
        writer.close()


def test_a_failed_write_is_kept_the_later_ones_dropped_and_reported_by_every_put_and_fence(tmp_path):
    rows = pool_rows(2, 8, 4, False, 1)
    ro = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)  # its pwrite fails: EBADF
    ok = os.open(tmp_path / "ok", os.O_RDWR | os.O_CREAT, 0o644)
    writer = cplane.C.PageWriter()
    try:
        assert writer.put(ok, 0, rows, [0]) == 64
        assert writer.put(ro, 128, rows, [0, 1]) == 128  # queued: the failure is the thread's
        assert writer.put(ok, 64, rows, [1]) == 64  # queued behind it, or refused if it failed already
        assert writer.fence() == (ro, 128, errno.EBADF)
        assert writer.failure() == (ro, 128, errno.EBADF)
        with pytest.raises(OSError) as err:
            writer.put(ok, 128, rows, [2])
        assert err.value.errno == errno.EBADF
        assert writer.fence(ok) == (ro, 128, errno.EBADF)  # kept
        stats = writer.stats()
        assert stats["jobs"] == 1 and stats["dropped"] in (1, 2) and stats["pending"] == 0
    finally:
        assert writer.close() == (ro, 128, errno.EBADF)
        os.close(ro)
        os.close(ok)
    assert (tmp_path / "ok").read_bytes() == rows[:, [0]].T.tobytes()  # nothing after the failure


def test_a_closed_writer_wrote_what_it_held_and_takes_no_more(tmp_path):
    rows = pool_rows(2, 64, 4, False, 3)
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    writer = cplane.C.PageWriter(1 << 20, 1 << 20)  # nothing wakes the thread but the close
    try:
        for i in range(64):
            assert writer.put(fd, i * 64, rows, [i]) == 64
        assert writer.close() is None
        assert writer.close() is None  # again: nothing
        with pytest.raises(RuntimeError, match="PageWriter is closed"):
            writer.put(fd, 0, rows, [0])
        assert writer.stats()["jobs"] == 64
    finally:
        os.close(fd)
    assert (tmp_path / "seg").read_bytes() == np.ascontiguousarray(rows.T).tobytes()


def test_a_fence_of_a_range_waits_for_the_writes_that_cover_it(tmp_path):
    # The thread is woken by the fence (the writes are under wake_bytes): the range read after
    # it holds the bytes, whichever the job.
    rows = pool_rows(2, 16, 4, False, 4)
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    writer = cplane.C.PageWriter(1 << 20, 1 << 20)
    try:
        for i in range(16):
            writer.put(fd, i * 64, rows, [i])
        assert writer.fence(fd, 5 * 64, 6 * 64) is None
        assert os.pread(fd, 64, 5 * 64) == rows[:, [5]].T.tobytes()
        assert writer.fence(fd, 0, 1) is None
        assert os.pread(fd, 64, 0) == rows[:, [0]].T.tobytes()
    finally:
        writer.close()
        os.close(fd)


# --- the tier: the writer's thread and the caller's write, alike -------------------------------

def _writes(tmp_path, name: str, monkeypatch, writer) -> tuple:
    monkeypatch.setattr(storage, "SEGMENT_BYTES", 8 * LAYERS * ELEMS * 8)
    monkeypatch.setattr(storage, "_PageWriter", writer)
    rng = np.random.default_rng(7)
    buf = rng.integers(-(1 << 62), 1 << 62, (LAYERS, 64, ELEMS), dtype=np.int64)
    rows = _rows.array_rows(buf)
    tier = StorageTier(tmp_path / name, 30)
    read = []
    for step in range(120):
        slots = rng.integers(0, 64, rng.integers(1, 12)).tolist()
        tier.write_from(buf, slots, rng.integers(0, 90, len(slots)).tolist(), rows=rows)
        buf[:] = np.roll(buf, 1, axis=1)  # the pool moves on after each write
        held = tier._index.keys()
        if held and step % 3 == 0:  # a load-back of pages just written, and older ones
            keys = held[-3:] + held[:2]
            dst = np.zeros_like(buf)
            tier.read_into(keys, dst, list(range(len(keys))))
            read.append(dst.tobytes())
    tier.flush()
    files = {p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())}
    out = (files, tier._index.keys(), tier.bytes_written, tier.bytes_read, tier.disk_bytes(), read)
    tier.close()
    return out


def test_the_tier_writes_and_reads_the_same_with_and_without_the_writers_thread(tmp_path, monkeypatch):
    # Reads right after the writes (the fence of their range), deletions, compaction and
    # unlinked segments (the fence before a close): files, index, counts and loaded bytes alike.
    assert _writes(tmp_path, "thread", monkeypatch, cplane.C.PageWriter) == \
        _writes(tmp_path, "here", monkeypatch, None)


def _fsize_limited(limit: int):
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    return old


@pytest.mark.parametrize("writer", ["thread", "here"])
def test_a_full_disk_is_the_same_one_line_error_with_the_file_cut_back(tmp_path, monkeypatch, writer):
    # A real failing pwrite: the file-size limit (RLIMIT_FSIZE; CPython ignores SIGXFSZ, so the
    # write fails with EFBIG) at 2.5 pages. The third page's write lands half, then fails: the
    # file is cut back to two pages and the error names the segment. Through the writer's
    # thread the write returns and the error comes at the next fence (the run's end: flush).
    monkeypatch.setattr(storage, "_PageWriter", cplane.C.PageWriter if writer == "thread" else None)
    buf = np.arange(LAYERS * 8 * ELEMS, dtype=np.int64).reshape(LAYERS, 8, ELEMS)
    rows = _rows.array_rows(buf)
    tier = StorageTier(tmp_path / "st", 30)
    page_bytes = LAYERS * ELEMS * 8
    old = _fsize_limited(2 * page_bytes + page_bytes // 2)
    try:
        tier.write_from(buf, [0, 1], [10, 11], rows=rows)
        with pytest.raises(OutputError) as err:
            tier.write_from(buf, [2, 3], [12, 13], rows=rows)
            tier.flush()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    (seg,) = (tmp_path / "st").iterdir()
    assert str(err.value) == f"cannot use the storage tier at {seg}: File too large"
    assert seg.stat().st_size == 2 * page_bytes  # no half page kept
    assert seg.read_bytes() == np.ascontiguousarray(rows[:, [0, 1]].T).tobytes()
    if writer == "thread":  # the tier stays failed: the next write and the close say it again
        with pytest.raises(OutputError, match="File too large"):
            tier.write_from(buf, [4], [14], rows=rows)
    tier.close()


def test_a_failure_not_fenced_before_the_close_is_raised_by_the_close(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "_PageWriter", cplane.C.PageWriter)
    buf = np.ones((LAYERS, 8, ELEMS), dtype=np.int64)
    tier = StorageTier(tmp_path / "st", 30)
    page_bytes = LAYERS * ELEMS * 8
    old = _fsize_limited(page_bytes)
    try:
        tier.write_from(buf, [0, 1], [10, 11], rows=_rows.array_rows(buf))
        with pytest.raises(OutputError, match=r"storage tier at .*000001\.kvseg: File too large"):
            tier.close()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    assert (tmp_path / "st" / "000001.kvseg").stat().st_size == 0


def _replay_limited(tmp_path, name: str, env_extra: dict) -> subprocess.CompletedProcess:
    from tierdiag.trace.synth import DEMO_TRACE

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env_extra}
    return subprocess.run([sys.executable, "-m", "tierdiag", "replay", str(DEMO_TRACE), "--no-probes",
                           "--storage-tokens", str(1 << 20), "--storage-dir", str(tmp_path / name),
                           "--model", "tiny", "--gpu", "cpu", "--device-tokens", "4096", "--host-tokens", "8192"],
                          capture_output=True, text=True, env=env, preexec_fn=limit, timeout=300)


def test_a_replay_on_a_full_disk_exits_6_with_the_same_line_with_and_without_the_thread(tmp_path):
    runs = {"thread": _replay_limited(tmp_path, "thread", {}),
            "here": _replay_limited(tmp_path, "here", {"TIERDIAG_CPLANE": "numpy"})}
    lines = {}
    for name, r in runs.items():
        assert r.returncode == 6, (name, r.returncode, r.stderr[-2000:])
        (line,) = [x for x in r.stderr.splitlines() if "cannot use the storage tier" in x]
        # (a --no-probes replay writes into a temporary folder under --storage-dir)
        lines[name] = re.sub(r"tierdiag-storage-\w+", "TMP", line.replace(str(tmp_path / name), "DIR"))
    assert lines["thread"] == lines["here"]
    assert "kvseg: File too large" in lines["thread"]


@pytest.mark.parametrize("layers, elems, page_first", [(4, 8, False), (2, 16, False), (4, 32, False),
                                                       (1, 8, True), (4, 8, True), (3, 5, False)],
                         ids=["64 B rows", "128 B rows", "256 B rows", "64 B pages", "256 B pages", "40 B rows"])
def test_each_row_size_the_gather_copies_by_its_own_loop_is_numpys_gather(tmp_path, layers, elems, page_first):
    # gather_pages copies 64, 128 and 256-byte rows by a constant-size copy, others generically:
    # the bytes of each, written both ways (the thread's put and pwrite_rows), are numpy's.
    rows = pool_rows(layers, 50, elems, page_first, 9)
    slots = list(range(49, -1, -3)) + [7, 7, 0]
    want = storage._gather_rows(rows, slots).tobytes()
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    writer = cplane.C.PageWriter()
    try:
        assert writer.put(fd, 0, rows, slots) == len(want)
        assert writer.fence() is None
        assert os.pread(fd, len(want) + 1, 0) == want
        assert cplane.C.pwrite_rows(fd, len(want), rows, slots) == len(want)
        assert os.pread(fd, len(want) + 1, len(want)) == want
    finally:
        writer.close()
        os.close(fd)


def test_a_forked_childs_copy_has_no_thread_and_takes_no_write(tmp_path):
    rows = pool_rows(2, 8, 4, False, 1)
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    writer = cplane.C.PageWriter()
    try:
        assert writer.put(fd, 0, rows, [0]) == 64  # the parent's thread runs
        pid = os.fork()
        if pid == 0:  # the child: its copy refuses a put (nobody would write it), a fence returns
            code = 1
            try:
                try:
                    writer.put(fd, 64, rows, [1])
                except RuntimeError as exc:
                    code = 0 if "closed" in str(exc) and writer.fence() is None else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert writer.put(fd, 64, rows, [1]) == 64  # the parent's goes on
        assert writer.fence() is None
    finally:
        writer.close()
        os.close(fd)
    assert (tmp_path / "seg").read_bytes() == np.ascontiguousarray(rows[:, [0, 1]].T).tobytes()


def test_a_chain_of_appends_failing_midway_keeps_the_jobs_before_and_names_the_first_cut(tmp_path):
    # Appends that continue each other go to the file in one pwritev (a chain): a file-size
    # limit at 4.5 pages cuts the fifth job; the four before are written, the failure is the
    # fifth's offset, the rest dropped.
    rows = pool_rows(2, 16, 4, False, 5)
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    writer = cplane.C.PageWriter(1 << 20, 1 << 20)  # under 1 MiB queued, only a fence wakes the thread
    old = _fsize_limited(4 * 64 + 32)
    try:
        # The thread starts at the first put and finds that job queued without sleeping: a put
        # made while it still runs would be written at once, and a put after the fifth job's
        # failure raises it. The first job fenced on its own, the thread is asleep (it lets the
        # lock go only there once its queue is empty), so the nine after it are one chain.
        assert writer.put(fd, 0, rows, [0]) == 64
        assert writer.fence() is None
        for i in range(1, 10):
            assert writer.put(fd, i * 64, rows, [i]) == 64
        assert writer.fence() == (fd, 4 * 64, errno.EFBIG)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        writer.close()
        os.close(fd)
    stats = writer.stats()
    assert (stats["jobs"], stats["dropped"], stats["pending"]) == (4, 6, 0)
    data = (tmp_path / "seg").read_bytes()
    assert data[:4 * 64] == np.ascontiguousarray(rows[:, :4].T).tobytes() and len(data) == 4 * 64 + 32
