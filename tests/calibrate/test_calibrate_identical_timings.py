"""`calibrate --from` a run whose requests all took the same time (issue 39, item 21): numpy's
RuntimeWarning ("invalid value encountered in multiply", with a source path) was printed on
stderr beside the result. An exact fit leaves the unseen directions infinitely wide (kept from
the preset), not NaN, and says nothing on stderr."""

from __future__ import annotations

import warnings

from tests.importers.sglang_export import EPOCH, record, write_export
from tests.support.cli import tierdiag
from tierdiag.config.profile import load_profile
from tierdiag.diagnose.twin.calibrate import Geometry, calibrate_run
from tierdiag.importers.load import import_sglang
from tierdiag.store.reader import open_store, resolve_run

LENGTHS = (128, 256, 512, 1024)


def _identical_run(tmp_path):
    """40 requests far apart, of four prompt lengths, every one 1 ms queued, 50 ms to its first
    token and 200 ms in all."""
    records = []
    for i in range(40):
        n = LENGTHS[i % 4] + i
        r = record(f"r{i}", prompt=n, completion=8, arrival_s=i * 10.0, queue_s=0.001, ttft_s=0.05, e2e_s=0.2,
                   tokens=[1000 * i + j for j in range(n)])
        r["forward_entry_time"] = EPOCH + i * 10.0 + 0.001
        records.append(r)
    write_export(tmp_path / "export", "20251201_09", records)
    db = tmp_path / "obs.duckdb"
    return db, import_sglang([tmp_path / "export"], db=db, run_name="same").run_id


def test_identical_timings_fit_without_warnings(tmp_path):
    db, run_id = _identical_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning fails the test
        with open_store(db) as con:
            c = calibrate_run(con, resolve_run(con, run_id), Geometry("llama3-8b", "h200"), db_label=str(db))
    # The prefill time is one constant: floor and overhead together explain it exactly.
    assert c.heldout_prefill.median_rel_error < 1e-3
    for p in c.params.values():
        assert p.fitted or p.reason  # every kept parameter says why


def test_identical_timings_calibrate_cli_says_nothing_on_stderr(tmp_path):
    db, run_id = _identical_run(tmp_path)
    r = tierdiag("calibrate", "--from", run_id, "--db", db, "-o", tmp_path / "p.toml")
    assert r.code == 0 and r.err == "", r.err
    assert load_profile(tmp_path / "p.toml").kind == "fitted"  # and replay takes the profile
