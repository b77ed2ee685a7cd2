"""The terminal view is chosen by the result's type (report/views.py), never by the run's kind:
every result a command renders has its view, and an observed run's results reach theirs."""

from __future__ import annotations

import dataclasses
import io

import pytest

from tierdiag.report import views


def _result_types():
    from tierdiag.app.advise import AdviseResult
    from tierdiag.diagnose.comparison.compare import Comparison, RequestComparison, TwinAgreement, TwinComparison
    from tierdiag.diagnose.request.explain import Explanation
    from tierdiag.diagnose.twin.observed import ObservedExplanation, ObservedSlow, ObservedSummary
    from tierdiag.diagnose.request.slow import SlowRequest
    from tierdiag.diagnose.run.summary import RunSummary

    return [Explanation, ObservedExplanation, RunSummary, ObservedSummary, SlowRequest, ObservedSlow, Comparison,
            RequestComparison, TwinAgreement, TwinComparison, AdviseResult]


def test_every_result_type_a_command_renders_has_a_view_and_no_view_is_stale():
    names = {t.__name__ for t in _result_types()}
    assert names == set(views.VIEWS)
    for t in _result_types():
        assert dataclasses.is_dataclass(t), t


def _console():
    from tierdiag.report.terminal import SafeConsole

    return SafeConsole(file=io.StringIO(), width=100)


@pytest.mark.parametrize("of, says", [("SlowRequest", "no request slower than its ideal in r (id)"),
                                      ("ObservedSlow", "no finished request with a server-reported TTFT in r (id)")])
def test_an_empty_list_is_drawn_by_the_view_of_the_type_it_would_hold(of, says):
    from types import SimpleNamespace

    kind = next(t for t in _result_types() if t.__name__ == of)
    console = _console()
    views.render([], console, of=kind, run=SimpleNamespace(name="r", run_id="id"))
    assert says in console.file.getvalue()


def test_a_result_without_a_view_is_a_type_error_naming_the_known_ones():
    with pytest.raises(TypeError, match="no terminal view for a dict; known: Explanation"):
        views.render({}, _console())
    with pytest.raises(TypeError, match="element type"):
        views.render([], _console())


def test_the_console_never_parses_markup():
    console = _console()
    console.print("[/]a[bold]b[/bold]")
    assert console.file.getvalue().strip() == "[/]a[bold]b[/bold]"
