"""The commands' one output sink (tierdiag/cli/sink.py): a result goes out as its JSON view or as the
text view registered for its type, and data in it (run names, ids, paths) is never markup and never
raw terminal escapes, whichever way it goes out."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.cli import sink as sink_mod
from tierdiag.cli.sink import Sink, json_text, renderer_for, renders
from tierdiag.store.delete import DeletedRun
from tierdiag.store.export import ExportResult

# What a run name, an id or a path may hold: Rich markup, terminal escapes, other controls,
# newlines, non-ASCII, and plain text around them.
HOSTILE = st.one_of(
    st.sampled_from(["[bold]x[/bold]", "[/]", "[red", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "a\nb\rc",
                     "\x00\x08\x7f\x9b", "[link=http://x]y[/link]", "é中\u202e", ":smile:", "\\[x]"]),
    st.text(min_size=0, max_size=30),
)

_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # newline is the view's own


def _stdout_of(emit) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        emit()
    return buf.getvalue()


def _deleted(run_id: str, name: str, folder: str) -> DeletedRun:
    return DeletedRun(run_id=run_id, name=name, rows={"requests": 3, "events": 0}, db_bytes_before=2 << 20,
                      db_bytes_after=2 << 20, storage_dir=folder, storage_removed=False, storage_files=0,
                      storage_bytes=0, storage_kept_because="--keep-storage")


@settings(max_examples=40, deadline=None)
@given(run_id=HOSTILE, name=HOSTILE, folder=HOSTILE)
def test_json_view_is_the_results_own_view_in_ascii_with_every_control_escaped(run_id, name, folder):
    result = _deleted(run_id, name, folder)
    printed = _stdout_of(lambda: Sink(json=True).emit(result))
    assert printed == json_text(result.to_json())
    assert json.loads(printed) == result.to_json()
    assert printed.isascii() and not _RAW_CONTROL.search(printed)


@settings(max_examples=40, deadline=None)
@given(run_id=HOSTILE, name=HOSTILE, folder=HOSTILE)
def test_text_view_shows_markup_as_text_and_no_raw_escape(run_id, name, folder):
    import tierdiag.cli.runs  # noqa: F401 - registers the views of `runs` (DeletedRun among them)

    printed = _stdout_of(lambda: Sink(json=False).emit(_deleted(run_id, name, folder), db="s.duckdb"))
    assert printed.startswith("deleted run ")
    assert not _RAW_CONTROL.search(printed), printed
    # Markup is text: a name holding `[bold]x[/bold]` shows its brackets.
    for value in (run_id, name):
        if value.isprintable() and value.isascii():
            assert value in printed


def test_an_emoji_code_in_a_name_is_text_not_a_face():
    """Rich replaces `:smile:` with 😄 unless told not to: a run named so was printed as a face (a
    bug: data is never markup). The consoles the sink draws on keep it as text."""
    import tierdiag.cli.runs  # noqa: F401 - registers the views of `runs` (DeletedRun among them)

    printed = _stdout_of(lambda: Sink(json=False).emit(_deleted(":smile:", ":thumbs_up:", "f"), db="s.duckdb"))
    assert printed.startswith("deleted run :smile: (:thumbs_up:): ")


@settings(max_examples=30, deadline=None)
@given(out_dir=HOSTILE, run_ids=st.lists(HOSTILE, max_size=3))
def test_text_view_registered_by_type_name_is_found_and_escapes_a_hostile_path(out_dir, run_ids):
    import tierdiag.cli.export  # noqa: F401 - registers "tierdiag.store.export.ExportResult"

    printed = _stdout_of(lambda: Sink(json=False).emit(ExportResult(out_dir=out_dir, run_ids=tuple(run_ids),
                                                                     rows={"requests": 7})))
    assert printed.startswith(f"exported {len(run_ids)} run(s), 7 rows, to ")
    assert not _RAW_CONTROL.search(printed)


def test_stderr_sink_keeps_stdout_free_for_the_data(capsys):
    Sink(json=True, stderr=True).emit(ExportResult(out_dir="o", run_ids=("r",), rows={}))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err) == {"out_dir": "o", "run_ids": ["r"], "rows": {}}


def test_a_json_note_goes_to_stderr_beside_the_json_view(capsys, tmp_path):
    from types import SimpleNamespace

    from tierdiag.app.calibrate import MeasuredProfile

    profile = SimpleNamespace(to_json=lambda: {"device": "cpu"})
    Sink(json=True).emit(MeasuredProfile(profile, tmp_path / "p.json"))
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"device": "cpu"}
    assert captured.err == f"profile written to {tmp_path / 'p.json'}\n"


class _Base:
    pass


class _Child(_Base):
    pass


class _Unviewed:
    pass


def test_the_view_of_the_nearest_registered_class_is_used(monkeypatch):
    monkeypatch.setattr(sink_mod, "_RENDERERS", {})

    @renders(_Base)
    def base_view(result, console):
        pass

    assert renderer_for(_Child()) is base_view

    @renders(f"{__name__}._Child")
    def child_view(result, console):
        pass

    assert renderer_for(_Child()) is child_view
    assert renderer_for(_Base()) is base_view


def test_a_result_without_a_view_or_a_second_view_for_a_type_is_a_type_error(monkeypatch):
    monkeypatch.setattr(sink_mod, "_RENDERERS", {})
    with pytest.raises(TypeError, match="no text view registered for _Unviewed"):
        renderer_for(_Unviewed())

    @renders(_Base)
    def one(result, console):
        pass

    with pytest.raises(TypeError, match="already has a text view"):
        @renders(_Base)
        def other(result, console):
            pass


def test_no_command_prints_json_or_builds_a_rich_table_itself():
    """Every command's output goes through the sink: no command module prints JSON, and tables
    are built only in text views registered with it (or in report/)."""
    from pathlib import Path

    import tierdiag.cli

    cli_dir = Path(tierdiag.cli.__file__).parent
    for path in sorted(cli_dir.glob("*.py")):
        if path.name == "sink.py":
            continue
        text = path.read_text()
        assert not re.search(r"print_json\(|json\.dumps\(", text), path.name
        assert not re.search(r"^\s+if json_:", text, re.M), path.name


@pytest.fixture(scope="module")
def late_runs_view(late_run):
    from tierdiag.app.views import runs_view

    return runs_view(late_run)


@settings(max_examples=25, deadline=None)
@given(name=HOSTILE, run_id=HOSTILE, error=HOSTILE)
def test_runs_through_the_sink_keeps_hostile_names_data(late_runs_view, name, run_id, error):
    """A real `runs` listing (app.views.RunsView of a replayed run) whose run's name, id and error
    are hostile: the JSON view holds them exactly; the text view shows no raw escape."""
    import dataclasses

    import tierdiag.cli.runs  # noqa: F401 - registers RunsView's text view

    (info,) = late_runs_view.runs
    hostile = dataclasses.replace(info, name=name, run_id=run_id, status="failed", error=error or "x")
    view = dataclasses.replace(late_runs_view, runs=(hostile,), changes={run_id: {}}, default_run_id=run_id)
    printed = _stdout_of(lambda: Sink(json=True).emit(view, db="s.duckdb"))
    (row,) = json.loads(printed)
    assert (row["name"], row["run_id"], row["error"], row["default"]) == (name, run_id, error or "x", True)
    assert printed.isascii() and not _RAW_CONTROL.search(printed)
    text = _stdout_of(lambda: Sink(json=False).emit(view, db="s.duckdb"))
    assert not _RAW_CONTROL.search(text), text
    assert "failed: " in text
