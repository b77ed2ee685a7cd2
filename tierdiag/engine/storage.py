"""The storage tier (HiCache's L3): pages in append-only segment files on local disk, found through
an in-memory index keyed by page key.

A page key names its request's whole prefix up to that page (trace/pages.py: Mooncake's hash
ids are chained, token keys are a chained blake2b, output pages' keys are their request's own),
so the key alone says which KV a page holds: a page found in the tier vouches for its whole
prefix, as SGLang's chained storage hashes do, without hashing anything again.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import operator
import os
import sys
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Any, Final

import numpy as np

from tierdiag.engine import rows as _rows
from tierdiag.errors import OutputError
from tierdiag.native import cplane


def _output_error(exc: OSError, path: Path) -> OutputError:
    """A filesystem error of the storage tier (its folder read-only or a file, the disk full, a
    page file gone) as an output error naming the path: exit 6, one line, not a bug."""
    error = OutputError(f"cannot use the storage tier at {exc.filename or path}: {exc.strerror or exc}",
                        hint="set storage_dir (--config) to a writable folder with room, or pass --storage-tokens 0")
    # What `raise ... from None` sets, set here: mypyc compiles `raise X from Y` as `raise X`
    # (the from is dropped), so the compiled build would chain the OSError under it in a --debug
    # traceback where the twin does not (tests/reliability/test_engine_errors.py).
    error.__suppress_context__ = True
    return error


@contextlib.contextmanager
def _storage_errors(path: Path):
    """`_output_error` of what the block raises (the write paths use a try/except instead:
    no generator a write)."""
    try:
        yield
    except OSError as exc:
        raise _output_error(exc, path) from None


SEGMENT_BYTES = 64 << 20  # a segment file's target size; larger tiers get larger segments
MAX_SEGMENTS = 256  # ... so that the files (and descriptors) held open stay few
SEGMENT_SUFFIX = ".kvseg"
INDEX_RESERVE_MAX: Final = 1 << 21  # the most pages the index makes room for up front (storage_index.c's IX_RESERVE_MAX)
# The writer's thread (PageWriter): a write waits while this many bytes are queued, and the
# thread is woken once this many are (or by a read of them, a segment's close, the run's end).
WRITER_MAX_PENDING = 16 << 20
WRITER_WAKE_BYTES = 1 << 20
_SLOT_BITS: Final = 32  # a page's location in the index: segment number << 32 | slot in the segment
_ARRAY: Final = array  # (compiled, a Final name is a static, not a look-up in the module's dict a call)


class _Segment:
    """One append-only file of whole pages (`pages` slots, live or holes); which of them are live
    is the index's (`_LruIndex.live`, `segment_keys`)."""
    __slots__ = ("number", "path", "fd", "pages")

    def __init__(self, number: int, path: Path, fd: int):
        self.number, self.path, self.fd = number, path, fd
        self.pages = 0


class _LruIndex:
    """The storage tier's index: page key -> location (segment << _SLOT_BITS | slot; -1 while the
    page is being written) in LRU order, oldest first, and the live pages of each segment. The
    reference and the fallback of `_cplane.StorageIndex`, which has the same methods and is what
    a run uses when the compiled data plane is built (tests/engine/test_storage_index.py runs
    both on the same operations). The per-page work of a write is all here, in `admit`: compiled,
    the tier does no Python work a page.
    """

    def __init__(self, reserve: int = 0) -> None:
        # `reserve`: the compiled index's room made up front (the tier's capacity); a dict
        # grows as it needs, so here it is only checked as the compiled one checks it.
        reserve = operator.index(reserve)  # an int (a bool too), as the compiled one's "n" takes
        if not -sys.maxsize - 1 <= reserve <= sys.maxsize:
            raise OverflowError("Python int too large to convert to C ssize_t")
        if reserve < 0:
            raise ValueError(f"StorageIndex(reserve): reserve must be >= 0, got {reserve}")
        self._od: OrderedDict = OrderedDict()
        self._live: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._od)

    def __contains__(self, key) -> bool:
        return key in self._od

    def touch(self, key) -> None:
        self._od.move_to_end(key)

    def touch_all(self, keys: Any) -> None:
        for key in keys:
            self._od.move_to_end(key)

    def keys(self) -> list:
        return list(self._od)

    def run(self, keys: Any, start: int) -> int:
        """How many of keys[start:] are in the index before the first that is not."""
        if start < 0:
            raise ValueError("start must be >= 0")
        od, end = self._od, start
        while end < len(keys) and keys[end] in od:
            end += 1
        return end - start

    def locs(self, keys: Any) -> list[int]:
        od = self._od
        return [od[k] for k in keys]

    def loc_runs(self, keys: Any) -> list[int]:
        """`locs(keys)` as runs of adjacent pages: [first, count, ...], a run while each location
        is the one before + 1 in the same segment (what one read takes)."""
        out: list[int] = []
        for loc in self.locs(keys):
            if out:
                last = out[-2] + out[-1] - 1
                if loc == last + 1 and loc >> _SLOT_BITS == last >> _SLOT_BITS:
                    out[-1] += 1
                    continue
            out += (loc, 1)
        return out

    def live(self, segment: int) -> int:
        return self._live.get(segment, 0)

    def clear_live(self, segment: int) -> None:
        self._live.pop(segment, None)

    def segment_keys(self, segment: int) -> tuple[list[int], list]:
        """The live pages of `segment` as (slots, keys), in slot order (a scan: compaction is rare)."""
        lo, mask = segment << _SLOT_BITS, (1 << _SLOT_BITS) - 1
        found = sorted((loc, k) for k, loc in self._od.items() if lo <= loc <= lo + mask)
        return [loc & mask for loc, _ in found], [k for _, k in found]

    def admit(self, keys: Any, capacity: int, counted: bool = False) -> tuple[Any, list[int] | None, list[int]]:
        """`_admit`; `counted`: deleted is how many keys were deleted (an int), not their list
        (the engine only counts them; the compiled index then makes no list)."""
        deleted, fresh, emptied = self._admit(keys, capacity)
        return (len(deleted) if counted else deleted), fresh, emptied

    def _admit(self, keys: Any, capacity: int) -> tuple[list, list[int] | None, list[int]]:
        """Enter the keys of a write, one at a time as files a page would go: a key already there
        is touched; a new one first deletes the oldest pages while the index holds `capacity`
        (even one entered earlier in this call), then goes in as the newest, at location -1.
        Returns (deleted keys oldest first, fresh, emptied): fresh, the positions of the keys
        still at -1 at the end (None when no more than capacity keys were all entered new at
        their turn: all of them, in order); emptied, the segments whose last live page went, in
        that order.

        A key named twice in one write is the same key written twice, one page at a time: named
        again while it is there, it is touched (as a key from an earlier write is: its page is
        not written again); pushed out in between by the write's own keys, it is entered anew
        (and is in `deleted` too). Either way fresh names it once, at the position whose page
        the tier keeps: the one that entered it last."""
        deleted: list = []
        emptied: list[int] = []
        od = self._od
        distinct = set(keys)
        if len(keys) <= capacity and len(distinct) == len(keys) and od.keys().isdisjoint(distinct):
            # All new (the common case): what the loop below does, at once. With the index full,
            # the loop pops the oldest page before each insert; as none of these keys is in the
            # index yet, those are exactly the len(od) + len(keys) - capacity oldest pages, all
            # from before this call (there are at least that many).
            for _ in range(len(od) + len(keys) - capacity):
                self._pop_oldest(deleted, emptied)
            od.update(zip(keys, itertools.repeat(-1)))
            return deleted, None, emptied
        fresh: list[int] = []
        all_new = len(keys) <= capacity
        for i, key in enumerate(keys):
            if key in od:
                od.move_to_end(key)
                all_new = False
                continue
            while len(od) >= capacity:
                self._pop_oldest(deleted, emptied)
            od[key] = -1
            fresh.append(i)
        if all_new:  # (a key there before the call but pushed out before its turn)
            return deleted, None, emptied
        if len(distinct) == len(keys):
            return deleted, [i for i in fresh if od.get(keys[i]) == -1], emptied
        # A key entered, pushed out by this write's own keys and entered again is at -1 for both
        # entries, but its page is the later one's (written twice, it was counted live twice).
        last = {keys[i]: i for i in fresh}
        return deleted, [i for i in fresh if last[keys[i]] == i and od.get(keys[i]) == -1], emptied

    def _pop_oldest(self, deleted: list, emptied: list) -> None:
        """Delete the least recently used page: its key to `deleted`, its segment to `emptied`
        when that was the segment's last live page (a page not placed yet has no segment)."""
        old, loc = self._od.popitem(last=False)
        deleted.append(old)
        if loc >= 0:
            seg = loc >> _SLOT_BITS
            self._live[seg] -= 1
            if not self._live[seg]:
                emptied.append(seg)

    def place(self, keys: Any, segment: int, first: int) -> None:
        """The pages of `keys` (all in the index) went to slots first, first + 1, ... of
        `segment`: their locations change, their LRU places do not."""
        od = self._od
        loc = (segment << _SLOT_BITS) + first
        for i, key in enumerate(keys):
            if key not in od:
                raise KeyError(key)
            od[key] = loc + i
            self._live[segment] = self._live.get(segment, 0) + 1

    def drop_placeholders(self, keys: Any) -> None:
        """Delete those of `keys` still at -1 (pages that never reached the disk)."""
        od = self._od
        for key in keys:
            if od.get(key) == -1:
                del od[key]


def _key_seq(keys: Any) -> Any:
    """`keys` as both indexes take them: a list, or an array('q') key run as it is (the engine's
    page keys: the compiled index reads the run's int64 values in place, the reference iterates
    it), anything else as a list."""
    return keys if type(keys) is list or type(keys) is array else list(keys)


def _gather_rows(layer_rows: np.ndarray, pages) -> np.ndarray:
    """Pages `pages` (a list or an int array) of a pool's row view as page-major int64 rows
    [n, layers * elems]: the bytes a segment file holds (the reference of `_cplane.pwrite_rows`)."""
    slots_a = _rows.slot_index(pages) if isinstance(pages, list) else np.asarray(pages, dtype=np.intp)
    return np.ascontiguousarray(layer_rows.take(slots_a, axis=1).T).view(np.int64)


def _write_all(seg: "_Segment", buf: memoryview, offset: int) -> None:
    """All of `buf` into `seg` at `offset` (pwrite writes less at times); a failure truncates the
    file back to `offset` (a full disk must not keep half a page) and is an OutputError."""
    try:
        try:
            written = 0
            while written < len(buf):
                written += os.pwrite(seg.fd, buf[written:], offset + written)
        except BaseException:
            os.ftruncate(seg.fd, offset)
            raise
    except OSError as exc:
        raise _output_error(exc, seg.path) from None


# The compiled page write and read (storage_io.c), None on the numpy data plane.
_pwrite_rows = cplane.compiled("pwrite_rows")
_pread_rows = cplane.compiled("pread_rows")
# The page writes on a thread of their own (storage_io.c's PageWriter), None on the numpy data
# plane: there (and for what it declines) the tier writes in the caller's thread, its reference.
_PageWriter = cplane.compiled("PageWriter")

# The index native/cplane.py chose: the compiled StorageIndex or the reference.
new_index = cplane.choose("storage.index", cplane.compiled("StorageIndex"), _LruIndex)


class StorageTier:
    """The L3 tier of SGLang's HiCache as files on local disk (HiCacheFile's role).

    Layout: pages are appended to segment files `NNNNNN.kvseg` under `root`, each page the
    `page_bytes` of its rows (layer after layer), so a transfer of n pages is one write and a
    prefetch of consecutive pages one read. The index (page key -> segment, slot) and the LRU
    order over it live in memory (_LruIndex): the tier is the run's, made empty at its start.

        segment 000001.kvseg  |page a|page b|page c|  ...  (append only)
        index: a -> (1, 0), b -> (1, 1), ...   LRU: a b c ... (oldest first)

    Past `capacity_pages` the least recently used page is deleted from the index (as one file a
    page was unlinked before); its bytes become a hole in its segment. A segment with no live
    page is unlinked; while the files hold more than twice the live pages (plus two segments),
    the sparsest segment is compacted: its live pages are appended anew and the file unlinked.
    No fsync: the tier is a cache of the run, not a durable store.
    """

    def __init__(self, root: Path, capacity_pages: int):
        # Keys: the pages' keys (trace/pages.py), each naming its whole prefix; the tier only
        # hashes and compares them (the reference index takes any hashable key, the compiled
        # one ints, bytes and str).
        self.root = Path(root)
        with _storage_errors(self.root):
            self.root.mkdir(parents=True, exist_ok=True)
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", str(self.root))
        self.capacity = capacity_pages
        # When the tier's bandwidth is next free (virtual ns): its reads (prefetches) and writes
        # queue on it, from whichever rank shares the tier (engine/deployment.py). Under 0.5.23's
        # rules (storage_acks_per_pass) writes have a queue of their own, `write_free_ns`, as
        # SGLang writes in its own thread (`backup_thread_func`) beside its reads'
        # (`prefetch_io_aux_func`).
        self.free_ns = 0
        self.write_free_ns = 0
        # key -> location, LRU order; live pages a segment. Room for the whole capacity made now:
        # a tier that fills would otherwise grow the index's table and entries by doubling.
        self._index = new_index(max(0, min(capacity_pages, INDEX_RESERVE_MAX)))
        # `hits`' call, bound once (the index is never replaced): a prefetch's query and each
        # re-query asked it by name, a method look-up a call (~33k on conversation[:4000])
        self._run: Any = self._index.run
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None
        self._next_segment = 1
        self._page_shape: tuple[int, int] | None = None  # (layers, elems), from the first write
        # A page's bytes (layers x elems x 8; 0 until the first write): a field set with the
        # shape, read natively, where a property computed it from the shape's tuple at each of
        # a write's two reads (~19k writes a conversation[:4000] storage replay, issue 41)
        self.page_bytes: int = 0
        self._rows_seen: object = None  # the pool row view write_from checked the geometry of
        self._segment_pages = 0
        self._disk_pages = 0  # pages the segment files hold, live or holes
        self._emptied: list[_Segment] = []  # segments whose last live page went (unlinked when not active)
        self.bytes_written = 0  # bytes appended to segment files (compaction included)
        self.bytes_read = 0
        # The engine's page writes (write_from with the pool's row view) go to a C thread, as
        # SGLang's backups go to its cache controller's backup thread: the bytes are gathered at
        # the call, their pwrite runs beside the engine. Fenced before a read of their range, a
        # segment's close, and at flush() (the run's end); the first failed write (a full disk)
        # is raised there with the message and exit code a write in the caller's thread raises.
        self._writer: Any = _PageWriter(WRITER_MAX_PENDING, WRITER_WAKE_BYTES) if _PageWriter is not None else None
        # The compiled index's admit + page write + place in one call (`_write`), where both the
        # index and the writer's thread are compiled; the reference index has no such call.
        self._admit_write: Any = None
        if self._writer is not None and _pwrite_rows is not None:
            self._admit_write = getattr(self._index, "admit_write", None)
        self._failure_seen = False

    def __contains__(self, key) -> bool:
        return key in self._index

    def hits(self, keys: Any, start: int) -> int:
        """How many of keys[start:] the tier holds before the first it does not (a prefetch's
        hit query), without touching them."""
        return self._run(keys, start)

    @property
    def used_pages(self) -> int:
        return len(self._index)

    def disk_bytes(self) -> int:
        """Bytes the segment files hold now (live pages and holes)."""
        return self._disk_pages * self.page_bytes

    def touch(self, key) -> None:
        self._index.touch(key)

    # --- writing -----------------------------------------------------------------------------
    def write(self, keys: list, rows) -> list:
        """Write pages (rows: [layers, n, elems] on CPU). Returns the keys deleted to make room."""
        page_major = rows.numpy().transpose(1, 0, 2)
        return self._write(keys, lambda idx: np.ascontiguousarray(page_major if idx is None else page_major[idx]),
                           (rows.shape[0], rows.shape[2]))

    def write_from(self, pool, slots: Any, keys: Any, *, rows: np.ndarray | None = None) -> int:
        """Write the pages in `slots` of a [layers, pages, elems] CPU pool buffer (a numpy array,
        or a CPU tensor) under `keys`: one gather into page-major rows, one append. Returns how
        many keys were deleted to make room (`write` returns them; the engine only counts). `rows`: the pool's row view when the caller keeps one (the
        engine's host pool), instead of making it again."""
        if rows is not None and _pwrite_rows is not None and (type(slots) is _ARRAY or type(slots) is list):
            # The engine's host pool (its row view kept): one C call a segment, no closure, and
            # the pool's geometry checked once for this row view, not at every write (~28k writes
            # a whole-trace storage replay: issue 41's storage row). The slots as the pool hands
            # them out (a node's array('q') run, which pwrite_rows reads as a buffer), not a
            # list of Python ints made a write (~7.7k instructions a write).
            if rows is not self._rows_seen:
                self._set_shape((pool.shape[0], pool.shape[2]))
                self._rows_seen = rows
            seg = self._active
            if seg is not None and self._admit_write is not None:
                # the engine's landing write (~28k a whole-trace storage replay): `_write`'s first
                # branch called straight, its keys as they come where they are a key run
                return self._admit_write_rows(keys if type(keys) is _ARRAY else _key_seq(keys), rows, slots, seg)
            return self._write(keys, None, (0, 0), rows, slots, True)
        return self._write_gathered(pool, slots, keys, rows)

    def _write_gathered(self, pool, slots: Any, keys: Any, rows: np.ndarray | None) -> int:
        """write_from's other writes (no row view kept, slots of another type, or no compiled
        page writer): the pages gathered here. A method of its own: its closure (`gather`) made
        write_from build an environment object at every call, the engine's fast path included
        (~19k a conversation[:4000] storage replay, issue 41)."""
        if rows is not None:
            layer_rows = rows
        elif isinstance(pool, np.ndarray):
            layer_rows = _rows.array_rows(pool)  # [layers, pages] row items ([1, pages] page-first)
        else:
            from tierdiag.engine import kernels

            layer_rows = kernels.pool_rows(pool)
        def gather(idx):
            # Page-major for the file, never a pass over the whole pool: numpy's rows of each
            # layer, then transposed. A page-first pool's items are whole pages already ([1, n]
            # -> [n, 1]), so the transpose is free there. (Where the compiled data plane is
            # built, _append_rows gathers and writes in one C call instead: this is its reference
            # and fallback.)
            if idx is None:
                pages = slots
            else:
                pages = [slots[i] for i in idx] if isinstance(slots, list) else np.asarray(slots)[np.asarray(idx)]
            return _gather_rows(layer_rows, pages)

        if _pwrite_rows is not None and type(slots) is list:
            return self._write(keys, gather, (pool.shape[0], pool.shape[2]), layer_rows, slots, True)
        return self._write(keys, gather, (pool.shape[0], pool.shape[2]), counted=True)

    def _write(self, keys: Any, gather, shape: tuple[int, int], layer_rows: np.ndarray | None = None,
               slots: Any = None, counted: bool = False) -> Any:
        """Enter `keys` in the index and append the pages it wants written: `gather(positions)`
        makes their rows, or, given the pool's `layer_rows` and the pages' `slots` (a list or an
        array('q')), `_append_rows` writes them from the pool in one C call a segment. `gather`
        None: the caller checked the geometry (`shape` is not read)."""
        if gather is not None:
            self._set_shape(shape)
        keys = _key_seq(keys)
        seg = self._active
        if gather is None and self._admit_write is not None and seg is not None and counted:
            return self._admit_write_rows(keys, layer_rows, slots, seg)
        # (a tuple as typed: unpacked by its items, where the index's untyped answer was a
        # generic iteration a write)
        admitted: tuple[Any, Any, list[int]] = self._index.admit(keys, self.capacity, counted)
        deleted, fresh, emptied = admitted
        if emptied:
            segments = self._segments
            self._emptied.extend(segments[n] for n in emptied)
        return self._after_admit(keys, gather, layer_rows, slots, deleted, fresh)

    def _admit_write_rows(self, keys: Any, layer_rows: Any, slots: Any, seg: _Segment) -> Any:
        """The engine's page write (issue 41's storage row: ~28k a whole-trace replay): the
        compiled index admits, queues the page write on the writer's thread and places the keys
        in one call where the keys it enters new (all of them, or some beside keys there before:
        a mixed write, ~9 % of them) fit the active segment `seg` (as `_next_run` would put them:
        the same segment, slot and offset); otherwise it only admits, and the write goes on as
        after `admit` (`_after_admit`). `keys` as `_key_seq` gives them."""
        first = seg.pages
        try:
            wrote: tuple[Any, Any, list[int], int] = self._admit_write(
                keys, self.capacity, self._writer, seg.fd, first * self.page_bytes, layer_rows, slots,
                seg.number, first, self._segment_pages - first)
        except OSError:
            # an earlier write's failure (put queued nothing; the keys' placeholders dropped)
            self._write_failed(self._writer.failure())
            raise  # (_write_failed always raises)
        deleted, fresh, emptied, written = wrote
        if emptied:
            segments = self._segments
            self._emptied.extend(segments[n] for n in emptied)
        if written < 0:
            return self._after_admit(keys, None, layer_rows, slots, deleted, fresh)
        # all new (fresh None): every key's page; a mixed write (some keys there before, no more
        # keys than the capacity): the pages of the positions `fresh` names, written and placed
        # by the same call as the all-new ones
        count = len(keys) if fresh is None else len(fresh)
        seg.pages += count
        self._disk_pages += count
        self.bytes_written += count * self.page_bytes
        if deleted or fresh is not None:
            self._collect()
        return deleted

    def _after_admit(self, keys: Any, gather, layer_rows: Any, slots: Any, deleted: Any, fresh: Any) -> Any:
        """`_write` after the index's admit (`deleted`, `fresh`): the pages it wants written
        appended and placed, then what the deletions emptied unlinked."""
        if fresh is None:  # all new, in order: one gather of every slot
            if layer_rows is not None and slots is not None:
                self._place_rows(keys, layer_rows, slots)
            else:
                self._place(keys, gather(None))
            # Nothing to unlink or compact without deletions: the files grew as the index did.
            # (A key there before the call but pushed out before its turn is a deletion.)
            if deleted:
                self._collect()
            return deleted
        if fresh:
            # (typed: the index is chosen at run time, so its answer is untyped; as ints the
            # positions index the lists directly, not by a generic iteration and subscript a page)
            pos: list[int] = fresh
            if layer_rows is not None and slots is not None:
                self._place_rows([keys[i] for i in pos], layer_rows, [slots[i] for i in pos])
            else:
                self._place([keys[i] for i in pos], gather(pos))
        self._collect()
        return deleted

    def _place(self, keys: Any, data: np.ndarray) -> None:
        """Append the pages of `keys` (in the index as -1) and record where they went."""
        try:
            self._append(keys, data.reshape(len(keys), -1))
        except BaseException:
            self._index.drop_placeholders(keys)  # pages that never reached the disk are not in the tier
            raise

    def _place_rows(self, keys: Any, layer_rows: np.ndarray, slots: Any) -> None:
        """`_place` of the pages in `slots` of a pool's row view, written from the pool."""
        try:
            self._append_rows(keys, layer_rows, slots)
        except BaseException:
            self._index.drop_placeholders(keys)
            raise

    def _set_shape(self, shape: tuple[int, int]) -> None:
        if self._page_shape is None:
            self._page_shape = (int(shape[0]), int(shape[1]))
            self.page_bytes = self._page_shape[0] * self._page_shape[1] * 8
            cap_bytes = self.capacity * self.page_bytes
            seg_bytes = max(SEGMENT_BYTES, -(-cap_bytes // MAX_SEGMENTS))
            self._segment_pages = max(1, min(seg_bytes // self.page_bytes, (1 << _SLOT_BITS) - 1))
        assert self._page_shape == (shape[0], shape[1]), \
            f"storage pages are {self._page_shape} (layers, elems); got {tuple(shape)} (data plane changed mid-run?)"

    def _new_segment(self) -> _Segment:
        while True:
            number = self._next_segment
            self._next_segment += 1
            path = self.root / f"{number:06d}{SEGMENT_SUFFIX}"
            with _storage_errors(path):
                try:
                    # O_EXCL: a folder shared by mistake never has its pages overwritten.
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    fd = -1  # (no `continue` inside the with: mypyc does not compile one)
            if fd < 0:
                continue
            seg = self._segments[number] = _Segment(number, path, fd)
            return seg

    def _append(self, keys: Any, data) -> None:
        """Append pages (data: [n, page_bytes/8] int64, C order; keys in the index) at the end of
        the active segment, starting a new one when it is full; one pwrite per segment touched."""
        done = 0
        while done < len(keys):
            seg, first, n = self._next_run(len(keys) - done)
            offset = first * self.page_bytes
            _write_all(seg, memoryview(data[done:done + n]).cast("B"), offset)
            self._placed(keys[done:done + n] if done or n < len(keys) else keys, seg, first, n)
            done += n

    def _append_rows(self, keys: Any, layer_rows: np.ndarray, slots: Any) -> None:
        """`_append` of the pages in `slots` of a pool's row view: gathered by one C call a
        segment touched and written on the writer's thread (`PageWriter.put`), or, without one,
        gathered and written here (`_cplane.pwrite_rows`; no numpy array, no Python per page).
        What the C calls decline (having written nothing) goes the numpy way, here."""
        done = 0
        writer = self._writer
        while done < len(keys):
            seg, first, n = self._next_run(len(keys) - done)
            offset = first * self.page_bytes
            pages = slots[done:done + n] if done or n < len(slots) else slots
            got = -1
            if writer is not None:
                try:
                    got = writer.put(seg.fd, offset, layer_rows, pages)
                except OSError:
                    self._write_failed(writer.failure())  # an earlier write's (nothing queued)
            if got < 0:
                try:
                    try:
                        got = _pwrite_rows(seg.fd, offset, layer_rows, pages)
                        if got < 0:  # not its case: numpy's gather and the pwrite loop
                            _write_all(seg, memoryview(_gather_rows(layer_rows, pages)).cast("B"), offset)
                    except BaseException:
                        os.ftruncate(seg.fd, offset)  # a full disk must not keep half a page
                        raise
                except OSError as exc:
                    raise _output_error(exc, seg.path) from None
            self._placed(keys[done:done + n] if done or n < len(keys) else keys, seg, first, n)
            done += n

    def _landed(self, seg: _Segment, start: int = 0, end: int = (1 << 63) - 1) -> None:
        """Wait for the writer's writes to bytes [start, end) of `seg` (a read of them, the
        file's close); the first failed write is raised (`_write_failed`)."""
        writer = self._writer
        if writer is not None:
            failure = writer.fence(seg.fd, start, end)
            if failure is not None:
                self._write_failed(failure)

    def flush(self) -> None:
        """Wait for every page write the writer's thread holds (the run's end: the pages are in
        their files, a full disk's error raised here, before the run is recorded as done)."""
        writer = self._writer
        if writer is not None:
            failure = writer.fence()
            if failure is not None:
                self._write_failed(failure)

    def _write_failed(self, failure: Any) -> None:
        """Raise the writer's first failed write, (fd, offset, errno), as a write here raises
        it: the file cut back to the write's offset (a full disk must not keep half a page; the
        writes queued after it were dropped), the one-line OutputError naming its segment. The
        tier is unusable after it: every later write, read and flush raises it again."""
        fd, offset, err = failure
        seg: _Segment | None = None
        for s in self._segments.values():
            if s.fd == fd:
                seg = s
        self._failure_seen = True
        if seg is None:
            raise _output_error(OSError(err, os.strerror(err)), self.root)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, offset)
        raise _output_error(OSError(err, os.strerror(err)), seg.path)

    def _next_run(self, want: int) -> tuple[_Segment, int, int]:
        """The active segment (a new one when it is full), its first free slot and how many of
        `want` pages go there."""
        seg = self._active
        if seg is None or seg.pages >= self._segment_pages:
            seg = self._active = self._new_segment()
        first = seg.pages
        return seg, first, min(want, self._segment_pages - first)

    def _placed(self, keys: Any, seg: _Segment, first: int, n: int) -> None:
        """The pages of `keys` are in slots first .. first + n - 1 of `seg`."""
        self._index.place(keys, seg.number, first)
        seg.pages += n
        self._disk_pages += n
        self.bytes_written += n * self.page_bytes

    def _collect(self) -> None:
        """Unlink segments without a live page. Then, while the files hold more than about twice
        the live pages, compact the sparsest segment. Deletion is LRU and writes append, so the
        oldest segments mostly empty on their own; only pages kept alive by hits get copied."""
        if self._emptied:
            live = self._index.live
            for seg in self._emptied:
                if seg is not self._active and not live(seg.number) and seg.number in self._segments:
                    self._unlink(seg)
            self._emptied = [s for s in self._emptied if s.number in self._segments and not live(s.number)]
        slack = 2 * self._segment_pages
        while self._disk_pages > 2 * len(self._index) + slack:
            self._compact_sparsest()

    def _compact_sparsest(self) -> None:
        """`_collect`'s compaction of the sparsest segment but the active one. A method of its
        own: its lambda made `_collect` build an environment object at every call (~17k a
        whole-trace storage replay), compaction or not."""
        live = self._index.live
        seg = min((s for s in self._segments.values() if s is not self._active),
                  key=lambda s: live(s.number) / s.pages)
        self._compact(seg)
        self._unlink(seg)

    def _compact(self, seg: _Segment) -> None:
        """Move the live pages of `seg` to the end of the files (the caller unlinks it). A
        segment whose pages are all gone has nothing to move: only its count is cleared."""
        slots, keys = self._index.segment_keys(seg.number)
        if slots:
            data = self._read_slots(seg, slots)
            # Re-appending keeps each key's place in the LRU order (a location update does not move it).
            self._append(keys, data.reshape(len(slots), -1))
        self._index.clear_live(seg.number)

    def _unlink(self, seg: _Segment) -> None:
        self._landed(seg)  # no write of the writer's thread to a closed (or reused) descriptor
        del self._segments[seg.number]
        self._disk_pages -= seg.pages
        with _storage_errors(seg.path):
            os.close(seg.fd)
            seg.path.unlink(missing_ok=True)

    # --- reading -----------------------------------------------------------------------------
    def _read_slots(self, seg: _Segment, slots: list[int]):
        """[len(slots), layers, elems] int64 read from `seg`, one preadv per run of adjacent slots."""
        layers, elems = self._page_shape
        out: np.ndarray = np.empty((len(slots), layers, elems), dtype=np.int64)
        page_bytes = self.page_bytes
        i = 0
        while i < len(slots):
            j = i + 1
            while j < len(slots) and slots[j] == slots[j - 1] + 1:
                j += 1
            want = (j - i) * page_bytes
            self._landed(seg, slots[i] * page_bytes, slots[i] * page_bytes + want)
            with _storage_errors(seg.path):
                got = os.preadv(seg.fd, [memoryview(out[i:j]).cast("B")], slots[i] * page_bytes)
                if got != want:
                    raise OSError(errno.EIO, f"page file truncated (read {got:,} of {want:,} bytes)",
                                  str(seg.path))
            i = j
        self.bytes_read += len(slots) * page_bytes
        return out

    def read_pages(self, keys: Any):
        """The pages of `keys` as [n, layers, elems] int64 (numpy), each touched in the LRU:
        pages adjacent in a segment are read together."""
        keys = _key_seq(keys)
        locs: list[int] = self._index.locs(keys)
        layers, elems = self._page_shape
        out: np.ndarray = np.empty((len(keys), layers, elems), dtype=np.int64)
        mask = (1 << _SLOT_BITS) - 1
        i = 0
        while i < len(keys):
            seg_no, j = locs[i] >> _SLOT_BITS, i + 1
            while j < len(keys) and locs[j] >> _SLOT_BITS == seg_no:
                j += 1
            out[i:j] = self._read_slots(self._segments[seg_no], [loc & mask for loc in locs[i:j]])
            i = j
        self._index.touch_all(keys)
        return out

    def read(self, keys: Any, num_layers: int, page_elems: int):
        """The pages of `keys` as a fresh [layers, n, elems] CPU tensor."""
        import torch

        if not keys:
            return torch.empty((num_layers, 0, page_elems), dtype=torch.int64)
        assert self._page_shape == (num_layers, page_elems), "storage page geometry differs from the pool's"
        return torch.from_numpy(self.read_pages(keys)).permute(1, 0, 2).contiguous()

    def read_into(self, keys: Any, pool, slots: list[int]) -> int:
        """Read the pages of `keys` into `slots` of a [layers, pages, elems] CPU pool buffer (a
        numpy array, or a CPU tensor); returns the bytes read."""
        if not keys:
            return 0
        target = pool if isinstance(pool, np.ndarray) else pool.numpy()
        keys = _key_seq(keys)
        if _pread_rows is not None and type(slots) is list and len(slots) == len(keys):
            try:
                rows: np.ndarray | None = _rows.array_rows(target)
            except ValueError:
                rows = None  # a layout the row view does not take: numpy's way
            if rows is not None and self._read_into_rows(keys, rows, slots):
                return len(keys) * self.page_bytes
        target[:, np.asarray(slots, dtype=np.int64)] = self.read_pages(keys).transpose(1, 0, 2)
        return len(keys) * self.page_bytes

    def _read_into_rows(self, keys: Any, rows: np.ndarray, slots: list[int]) -> bool:
        """`read_into` by the compiled read (`_cplane.pread_rows`: one pread a run of adjacent
        slots of a segment, its pages' rows put straight into the pool's, no numpy array): the
        same runs, bytes and errors as `read_pages`. False when the C call declines a run (the
        caller then reads them all numpy's way: the same bytes into the same slots)."""
        # The runs of adjacent pages split by the index (`loc_runs`: [first, count, ...]), not
        # here a page (issue 41's storage row: ~75k pages in ~450 runs on conversation[:4000],
        # where the split of a list of locations made a boxed int and ~340 instructions a page).
        runs: list[int] = self._index.loc_runs(keys)
        page_bytes = self.page_bytes
        mask = (1 << _SLOT_BITS) - 1
        n = len(keys)
        i = 0
        for r in range(0, len(runs), 2):
            first = runs[r]
            j = i + runs[r + 1]
            seg = self._segments[first >> _SLOT_BITS]
            want = (j - i) * page_bytes
            self._landed(seg, (first & mask) * page_bytes, (first & mask) * page_bytes + want)
            try:
                got = _pread_rows(seg.fd, (first & mask) * page_bytes, rows, slots[i:j])
            except OSError as exc:
                raise _output_error(exc, seg.path) from None
            if got < 0:
                return False
            if got != want:
                raise _output_error(OSError(errno.EIO, f"page file truncated (read {got:,} of {want:,} bytes)",
                                            str(seg.path)), seg.path)
            i = j
        self.bytes_read += n * page_bytes
        self._index.touch_all(keys)
        return True

    def close(self) -> None:
        """Close the segment files (they stay on disk: the run's folder keeps them), after the
        writer's thread wrote what it holds and stopped. A failed write not raised yet (no
        flush since) is raised, the files closed first."""
        writer = self._writer
        failure = None
        if writer is not None:
            failure = writer.close()
            if failure is not None and not self._failure_seen:
                with contextlib.suppress(OSError):
                    os.ftruncate(failure[0], failure[1])
            else:
                failure = None
        path: Path = self.root
        if failure is not None:
            for s in self._segments.values():
                if s.fd == failure[0]:
                    path = s.path
        for seg in self._segments.values():
            with contextlib.suppress(OSError):
                os.close(seg.fd)
        self._segments.clear()
        self._active = None
        if failure is not None:
            self._failure_seen = True
            raise _output_error(OSError(failure[2], os.strerror(failure[2])), path)
