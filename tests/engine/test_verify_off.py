"""`--verify off` skips only what the check needs (issue 41, session 33): a prefill's page content
is generated for a load-back's byte-for-byte comparison and nothing else, so under off it is not
written (`CacheController.writes_content`; admission's `_write_chunk`). The copies still run:
every backup, load-back, prefetch and storage write moves the slots' bytes, with the same runs
and data-plane bytes, and every row is `sample`'s but for the `verified` column (and the
measured `wall_ns`, which no run repeats)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings

from tests.engine.helpers import PS, Collect, numbered, req, small_config
from tests.engine.test_invariants import configs, workloads
from tierdiag.engine.engine import Engine

MARK = 0x5A  # what the device pool holds before an off run: no page content ever replaces it


def _replay(reqs, cfg, tmp_path, tag: str, *, mark: bool = False):
    if cfg.storage_tokens:
        cfg = dataclasses.replace(cfg, storage_dir=str(tmp_path / tag))
    probe = Collect()
    engine = Engine(cfg, probe=probe)
    if mark:
        engine.ctrl.device.array.view(np.uint8)[...] = MARK
    engine.run(numbered(reqs))
    return engine, probe


def _rows(probe: Collect):
    """What a store would hold, less the columns no two runs share (compare_rows.py's MEASURED)."""
    transfers = [t._replace(wall_ns=0, verified=None) for t in probe.transfers]
    return probe.records, probe.evictions, transfers, probe.skips, probe.lost


def _stats(engine: Engine) -> dict:
    s = engine.stats
    return {"load_back_bytes": s.load_back_bytes, "backup_bytes": s.backup_bytes,
            "loaded_data_plane_bytes": s.loaded_data_plane_bytes}


def test_only_the_checks_modes_write_content():
    for mode, writes in (("off", False), ("sample", True), ("all", True)):
        assert Engine(small_config(verify=mode)).ctrl.writes_content is writes


def test_off_moves_the_slots_bytes_where_sample_moves_the_content(tmp_path):
    """A narrated run: r0's 4 pages computed, backed up (write_through), taken off the device by
    r1 and r2, loaded back for r3. Under sample the host copies and the loaded-back pages are the
    content of their keys (checked); under off no content is written, and the copies carry the
    device pool's bytes as they were (MARK) to the host and back: bytes moved, none generated."""
    reqs = [req("r0", 0, [1, 2, 3, 4]), req("r1", 100, list(range(10, 22))),
            req("r2", 200, list(range(30, 42))), req("r3", 300, [1, 2, 3, 4], extra_tokens=3)]
    cfg = dict(device_tokens=16 * PS, host_tokens=64 * PS, write_policy="write_through")
    on, on_probe = _replay(reqs, small_config(verify="sample", **cfg), tmp_path, "s")
    off, off_probe = _replay(reqs, small_config(verify="off", **cfg), tmp_path, "o", mark=True)
    loads = [t for t in off_probe.transfers if t.kind == "load_back"]
    assert loads and all(t.verified is None for t in loads)  # r3's load-back, unchecked
    assert [t.verified for t in on_probe.transfers if t.kind == "load_back"][0] is True
    assert _rows(off_probe) == _rows(on_probe)
    assert _stats(off) == _stats(on) and off.stats.loaded_data_plane_bytes > 0
    assert (off.stats.verified_load_backs, on.stats.verified_load_backs) == (0, 1)
    # the host pool received the device pool's bytes (it started as zeros: the backups moved them)
    host = off.ctrl.host.array.view(np.uint8)
    assert np.any(host == MARK) and set(np.unique(host)) <= {0, MARK}
    # and nothing under off wrote a byte of content into the device pool: MARK throughout
    assert set(np.unique(off.ctrl.device.array.view(np.uint8))) == {MARK}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=workloads(), cfg=configs())
def test_off_gives_samples_rows_and_data_plane_bytes(reqs, cfg, tmp_path_factory):
    """Any workload and configuration (storage, every write policy and rule set): the rows,
    skips, lost pages and byte counts under off are sample's, `verified` aside."""
    tmp_path = tmp_path_factory.mktemp("off")
    on, on_probe = _replay(reqs, dataclasses.replace(cfg, verify="sample"), tmp_path, "s")
    off, off_probe = _replay(reqs, dataclasses.replace(cfg, verify="off"), tmp_path, "o")
    assert _rows(off_probe) == _rows(on_probe)
    assert _stats(off) == _stats(on)
    assert off.stats.verified_load_backs == off.stats.verified_data_plane_bytes == 0
    assert all(t.verified is None for t in off_probe.transfers)
    off.check_invariants(idle=True)
