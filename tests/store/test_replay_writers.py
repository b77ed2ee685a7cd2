"""A replay drives each writer kind through one interface (tierdiag/app/replay_writers.py): the kind
`writer_mode` names picks its strategy, and a writer process that cannot be had falls back to
writing inline, the run recorded all the same."""

from __future__ import annotations

import contextlib

import duckdb
import pytest

from tierdiag.app.replay_writers import InlineWriter, Unrecorded, WriterInProcess, for_mode


@pytest.mark.parametrize("mode, kind, cls", [(None, None, Unrecorded), ("inline", "inline", InlineWriter),
                                              ("process", "process", WriterInProcess)])
def test_each_writer_kind_has_its_strategy(mode, kind, cls):
    recording = for_mode(mode)
    assert type(recording) is cls and recording.kind == kind
    assert recording.writer is None and recording.recorder is None  # nothing opened yet


def test_an_unrecorded_replay_closes_nothing_and_has_no_store_numbers():
    recording = for_mode(None)
    with contextlib.ExitStack() as cleanup:
        assert recording.start(cleanup) is recording
    assert recording.close("complete", None) is None
    assert recording.numbers() is None


def test_no_writer_process_to_be_had_writes_inline_and_says_so(tmp_path, monkeypatch):
    from tierdiag.app.replay import replay
    from tierdiag.config.engine import EngineConfig
    from tierdiag.store.writer_process import WriterProcess

    def no_process(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setenv("TIERDIAG_WRITER", "process")
    monkeypatch.setattr(WriterProcess, "start", no_process)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 10}, "input_length": 1024, "output_length": 4, '
                             f'"hash_ids": [{i % 3}, {100 + i}]}}\n' for i in range(20)))
    db = tmp_path / "r.duckdb"
    result = replay(trace, EngineConfig(model="tiny", gpu="cpu", device_tokens=4096), db=db, run_name="fallback",
                    probes=True, skip_bad=False)
    assert result.writer == "inline"
    assert result.num_requests == 20 and result.run_id is not None
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status, num_requests FROM runs WHERE run_id = ?",
                           [result.run_id]).fetchone() == ("complete", 20)
