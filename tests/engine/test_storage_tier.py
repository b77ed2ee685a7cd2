"""The storage tier's page files: bytes come back as written (through LRU deletion and segment
compaction), the folder a run writes to is its own and recorded, and replay says where it is."""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from pathlib import Path

import duckdb
import pytest
import torch

from tests.support.cli import completed_in_process
from tierdiag.engine import storage
from tierdiag.native import cplane
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.storage import StorageTier
from tierdiag.store.reader import open_store, resolve_run
from tierdiag.store.storage_dir import STORAGE_SUFFIX, folder_bytes, run_storage_dir
from tierdiag.trace.synth import DEMO_TRACE

LAYERS, ELEMS = 2, 16  # 256 B a page
SMALL = dict(model="tiny", gpu="cpu", device_tokens=4096, host_tokens=8192, storage_tokens=1 << 20)


def page(key: str) -> torch.Tensor:
    """[layers, 1, elems] bytes derived from the key, so any mix-up shows."""
    g = torch.Generator().manual_seed(hash(key) & 0xFFFF_FFFF)
    return torch.randint(-(1 << 62), 1 << 62, (LAYERS, 1, ELEMS), dtype=torch.int64, generator=g)


def key(i: int) -> str:
    return f"{i:064x}"


# The tier on each index: the compiled one (what a run uses when it is built) and the reference.
INDEXES = [pytest.param(storage._LruIndex, id="python"),
           pytest.param(lambda reserve=0: cplane.C.StorageIndex(reserve), id="c",
                        marks=pytest.mark.skipif(cplane.C is None, reason=f"_cplane: {cplane.WHY_NOT}"))]


def test_pages_read_back_byte_for_byte_through_deletion_and_compaction(tmp_path, monkeypatch):
    # 8 pages a segment, room for 40: random writes and reads against a plain LRU model.
    monkeypatch.setattr(storage, "SEGMENT_BYTES", 8 * LAYERS * ELEMS * 8)
    tier = StorageTier(tmp_path / "st", 40)
    model: OrderedDict[str, None] = OrderedDict()
    rng = random.Random(5)
    for step in range(400):
        if model and rng.random() < 0.4:  # a prefetch of a few keys the tier holds
            keys = rng.sample(list(model), min(len(model), rng.randint(1, 6)))
            got = tier.read(keys, LAYERS, ELEMS)
            assert torch.equal(got, torch.cat([page(k) for k in keys], dim=1)), f"step {step}: bytes differ"
            for k in keys:
                model.move_to_end(k)
            continue
        keys = [key(rng.randrange(120)) for _ in range(rng.randint(1, 12))]
        keys = list(dict.fromkeys(keys))
        expect_deleted = []
        for k in keys:  # the reference: one page at a time, as files a page were kept
            if k in model:
                model.move_to_end(k)
                continue
            while len(model) >= 40:
                expect_deleted.append(model.popitem(last=False)[0])
            model[k] = None
        deleted = tier.write(keys, torch.cat([page(k) for k in keys], dim=1))
        assert deleted == expect_deleted, f"step {step}: LRU deletion order differs"
        assert tier.used_pages == len(model) and all(k in tier for k in model)
        # the files hold the live pages plus holes, never more than twice the live pages + 2 segments
        on_disk = sum(f.stat().st_size for f in (tmp_path / "st").glob("*.kvseg"))
        assert on_disk == tier.disk_bytes() <= (2 * len(model) + 2 * 8) * tier.page_bytes
    everything = list(model)
    assert torch.equal(tier.read(everything, LAYERS, ELEMS), torch.cat([page(k) for k in everything], dim=1))
    assert len(list((tmp_path / "st").glob("*.kvseg"))) < 400 // 8  # segments were unlinked
    tier.close()


@pytest.mark.parametrize("make", INDEXES)
def test_a_key_named_twice_in_one_write_is_one_page_of_the_tier(tmp_path, monkeypatch, make):
    """A write is its keys written one at a time: a key named again while its page is there is
    touched, as a key written by an earlier call is (its bytes stay); one pushed out in between
    by the write's own pages is written anew, from that later position. One page either way."""
    monkeypatch.setattr(storage, "SEGMENT_BYTES", 2 * LAYERS * ELEMS * 8)  # 2 pages a segment
    monkeypatch.setattr(storage, "new_index", make)
    rows = torch.cat([page(f"position {i}") for i in range(4)], dim=1)
    a, b, c, d, e = (key(i) for i in range(5))

    roomy = StorageTier(tmp_path / "roomy", 4)
    assert roomy.write([a, b, a], rows[:, :3]) == []
    assert roomy.disk_bytes() == 2 * roomy.page_bytes
    assert roomy.write([c, d, e], rows[:, :3]) == [b]  # a's second naming made b the oldest
    assert torch.equal(roomy.read([a], LAYERS, ELEMS), rows[:, :1])  # a: its first position's page
    roomy.close()

    tight = StorageTier(tmp_path / "tight", 2)
    assert tight.write([a, b, c, a], rows) == [a, b]  # c pushes out a, then a pushes out b
    assert tight.used_pages == 2 and a in tight and c in tight
    assert torch.equal(tight.read([c, a], LAYERS, ELEMS), rows[:, 2:4])  # a: position 3's page
    assert tight.disk_bytes() == 2 * tight.page_bytes  # position 0's page was never written
    tight.close()


@pytest.mark.parametrize("make", INDEXES)
def test_writes_naming_keys_twice_read_back_and_keep_the_files_bounded(tmp_path, monkeypatch, make):
    """Writes with repeated keys, longer than the room: each segment's live count stays its pages',
    so emptied segments are unlinked and compaction finds pages to move (a count left too high
    kept dead segments, and compacting one failed on its empty read)."""
    monkeypatch.setattr(storage, "SEGMENT_BYTES", 4 * LAYERS * ELEMS * 8)  # 4 pages a segment
    monkeypatch.setattr(storage, "new_index", make)
    capacity, per_segment = 4, 4
    tier = StorageTier(tmp_path / "st", capacity)
    model: OrderedDict[str, torch.Tensor] = OrderedDict()  # key -> its page, oldest first
    rng = random.Random(11)
    for step in range(300):
        if model and rng.random() < 0.3:
            keys = rng.sample(list(model), min(len(model), rng.randint(1, 4)))
            assert torch.equal(tier.read(keys, LAYERS, ELEMS), torch.cat([model[k] for k in keys], dim=1)), \
                f"step {step}: bytes differ"
            for k in keys:
                model.move_to_end(k)
            continue
        # a few keys, up to 7 (more than the room: the write's own pages push some out)
        names = rng.sample(range(40), rng.randint(1, 7))
        keys = [key(rng.choice(names)) for _ in range(rng.randint(1, 14))]
        rows = [page(f"{step} {i}") for i in range(len(keys))]  # each position its own bytes
        expect_deleted = []
        for k, row in zip(keys, rows):  # the reference: one page at a time
            if k in model:
                model.move_to_end(k)
                continue
            while len(model) >= capacity:
                expect_deleted.append(model.popitem(last=False)[0])
            model[k] = row
        assert tier.write(keys, torch.cat(rows, dim=1)) == expect_deleted, f"step {step}: deletions differ"
        assert tier.used_pages == len(model) and all(k in tier for k in model)
        on_disk = sum(f.stat().st_size for f in (tmp_path / "st").glob("*.kvseg"))
        assert on_disk == tier.disk_bytes() <= (2 * len(model) + 2 * per_segment) * tier.page_bytes
    everything = list(model)
    assert torch.equal(tier.read(everything, LAYERS, ELEMS), torch.cat([model[k] for k in everything], dim=1))
    tier.close()


@pytest.mark.parametrize("make", INDEXES)
def test_compacting_a_segment_without_a_live_page_unlinks_it(tmp_path, monkeypatch, make):
    """A segment counted live with none of its pages left (what a key written twice left before)
    is never emptied; when the files outgrow the live pages, compaction picks it: it has nothing
    to move, so it is just unlinked (its empty read failed before)."""
    monkeypatch.setattr(storage, "SEGMENT_BYTES", 2 * LAYERS * ELEMS * 8)  # 2 pages a segment
    monkeypatch.setattr(storage, "new_index", make)
    tier = StorageTier(tmp_path / "st", 2)  # compaction past 2 * 2 live + 2 * 2 slack pages
    stale = []
    for r in range(6):  # each pair pushes out the one before, in a segment of its own
        pair = [key(2 * r), key(2 * r + 1)]
        tier.write(pair, torch.cat([page(k) for k in pair], dim=1))
        seg = tier._active.number
        tier._index.place(pair[:1], seg, 0)  # its first page counted live twice, where it is
        stale.append(seg)
        on_disk = sum(f.stat().st_size for f in (tmp_path / "st").glob("*.kvseg"))
        assert on_disk == tier.disk_bytes() <= (2 * 2 + 2 * 2) * tier.page_bytes, f"round {r}"
    assert not any((tmp_path / "st" / f"{n:06d}{storage.SEGMENT_SUFFIX}").exists() for n in stale[:2])
    assert torch.equal(tier.read(pair, LAYERS, ELEMS), torch.cat([page(k) for k in pair], dim=1))
    tier.close()


def test_write_from_a_pool_and_read_into_a_pool_move_the_slots_named(tmp_path):
    tier = StorageTier(tmp_path / "st", 16)
    src = torch.arange(LAYERS * 10 * ELEMS, dtype=torch.int64).view(LAYERS, 10, ELEMS)
    tier.write_from(src, [7, 2, 5], [key(1), key(2), key(3)])
    dst = torch.zeros_like(src)
    assert tier.read_into([key(3), key(1)], dst, [0, 9]) == 2 * tier.page_bytes
    assert torch.equal(dst[:, 0], src[:, 5]) and torch.equal(dst[:, 9], src[:, 7])
    assert not dst[:, 1:9].any()


def test_a_page_first_pool_writes_the_same_page_files_as_a_layer_first_one(tmp_path):
    """The CPU replay's pools are page-first numpy buffers ([P, L, E] seen as [L, P, E]): the
    bytes on disk are the same pages, layer after layer, and read back into the slots named."""
    import numpy as np

    layer_first = np.arange(LAYERS * 10 * ELEMS, dtype=np.int64).reshape(LAYERS, 10, ELEMS)
    page_first = np.ascontiguousarray(layer_first.transpose(1, 0, 2)).transpose(1, 0, 2)  # same values
    a, b = StorageTier(tmp_path / "a", 16), StorageTier(tmp_path / "b", 16)
    a.write_from(layer_first, [7, 2, 5], [key(1), key(2), key(3)])
    b.write_from(page_first, [7, 2, 5], [key(1), key(2), key(3)])
    a.flush(), b.flush()  # write_from's pwrite runs on the tier's thread: landed before the files are read
    files = sorted((tmp_path / "a").iterdir()), sorted((tmp_path / "b").iterdir())
    assert [f.read_bytes() for f in files[0]] == [f.read_bytes() for f in files[1]]
    dst = np.zeros((10, LAYERS, ELEMS), dtype=np.int64).transpose(1, 0, 2)
    assert b.read_into([key(3), key(1)], dst, [0, 9]) == 2 * b.page_bytes
    assert np.array_equal(dst[:, 0], layer_first[:, 5]) and np.array_equal(dst[:, 9], layer_first[:, 7])
    assert not dst[:, 1:9].any()


def test_a_truncated_segment_is_an_output_error_not_wrong_bytes(tmp_path):
    from tierdiag.errors import OutputError

    tier = StorageTier(tmp_path / "st", 16)
    tier.write([key(1), key(2)], torch.ones((LAYERS, 2, ELEMS), dtype=torch.int64))
    seg = next((tmp_path / "st").glob("*.kvseg"))
    with open(seg, "r+b") as fh:
        fh.truncate(tier.page_bytes + 8)
    with pytest.raises(OutputError, match="truncated"):
        tier.read([key(1), key(2)], LAYERS, ELEMS)


def _replay(tmp_path, db: Path, **cfg):
    from tierdiag.app.replay import replay

    return replay(DEMO_TRACE, EngineConfig(**{**SMALL, **cfg}), db=db, run_name=None, probes=True, skip_bad=False)


def test_a_run_writes_its_pages_into_its_own_folder_beside_the_database_and_records_it(tmp_path):
    db = tmp_path / "demo.duckdb"
    first, second = _replay(tmp_path, db), _replay(tmp_path, db)
    for s in (first, second):
        folder = Path(s.storage_dir)
        assert folder == (tmp_path / ("demo" + STORAGE_SUFFIX) / s.run_id).resolve()
        assert list(folder.glob("*.kvseg")) and s.storage_bytes == folder_bytes(folder) > 0
        with open_store(db) as con:
            info = resolve_run(con, s.run_id)
        assert info.config["storage_dir"] == str(folder) and run_storage_dir(info) == folder
    # the same trace and config, two folders, the same rows
    con = duckdb.connect(str(db), read_only=True)
    rows = [con.execute("SELECT * EXCLUDE (run_id) FROM requests WHERE run_id = ? ORDER BY req_id",
                        [s.run_id]).fetchall() for s in (first, second)]
    assert rows[0] == rows[1] and rows[0]


def test_storage_dir_names_the_root_and_a_run_without_storage_has_no_folder(tmp_path):
    db = tmp_path / "r.duckdb"
    s = _replay(tmp_path, db, storage_dir=str(tmp_path / "elsewhere"))
    assert Path(s.storage_dir) == (tmp_path / "elsewhere" / s.run_id).resolve()
    assert not (tmp_path / ("r" + STORAGE_SUFFIX)).exists()
    none = _replay(tmp_path, db, storage_tokens=0, storage_dir=str(tmp_path / "elsewhere"))
    with open_store(db) as con:
        assert run_storage_dir(resolve_run(con, none.run_id)) is None
    assert none.storage_dir is None and none.storage_bytes == 0


def test_replay_announces_the_folder_and_its_size_and_a_replay_without_a_run_removes_its_own(tmp_path):
    base = ["replay", str(DEMO_TRACE), "--model", "tiny", "--gpu", "cpu", "--device-tokens", "4096", "--host-tokens",
            "8192", "--storage-tokens", str(1 << 20)]
    db = tmp_path / "a.duckdb"
    shown = completed_in_process(*base, "--db", str(db), "--json")  # the CLI in this process: what it says
    assert shown.returncode == 0, shown.stderr
    d = json.loads(shown.stdout)
    assert Path(d["storage_dir"]).parent == (tmp_path / "a.storage").resolve() and d["storage_bytes"] > 0
    table = completed_in_process(*base, "--no-probes", "--storage-dir", str(tmp_path / "tmp"))
    assert table.returncode == 0, table.stderr
    assert "page files in a temporary folder, removed (nothing was recorded)" in table.stdout
    assert list((tmp_path / "tmp").iterdir()) == []  # the temporary folder went with the replay


def test_an_engine_built_without_a_storage_folder_removes_the_one_it_made(monkeypatch, tmp_path):
    """Engine(cfg) with a storage tier and no folder makes a temporary one; nobody else knows of
    it, so it goes with the engine (before: every such engine left a folder in /tmp)."""
    import gc
    import tempfile

    from tierdiag.config.engine import EngineConfig
    from tierdiag.engine.engine import Engine

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = Engine(EngineConfig(model="tiny", gpu="cpu", device_tokens=65536, storage_tokens=1 << 20))
    (made,) = tmp_path.iterdir()
    assert made.name.startswith("tierdiag-storage-") and engine.storage is not None
    del engine
    gc.collect()
    assert not made.exists()
