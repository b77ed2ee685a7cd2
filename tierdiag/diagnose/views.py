"""What each command asks of a run, answered by its kind's commands, chosen once from the run's
view (read/kind.py): a replay from the engine's parts, an imported run from what its server
reported (diagnose/twin/observed.py). Each answer is a typed result, drawn by report/views.py
according to its type; the modules behind an answer are imported only when it is asked for
(start-up: `summary` never loads explain's modules)."""

from __future__ import annotations

from tierdiag.diagnose.read.kind import view_of
from tierdiag.diagnose.read.run import parse
from tierdiag.store.reader import RunKind


class ReplayCommands:
    def summarize(self, con, run):
        """RunSummary."""
        from tierdiag.diagnose.run.summary import run_summary

        return run_summary(con, run)

    def explain(self, con, run, req_id: str):
        """Explanation."""
        from tierdiag.diagnose.request.explain import explain_request

        return explain_request(con, run, req_id)

    def slow(self, con, run, *, top: int, hit_class: str | None = None, cause: str | None = None):
        """(SlowRequest, rows ranked by excess TTFT over their ideal)."""
        from tierdiag.diagnose.request.slow import SlowRequest, slow_requests

        return SlowRequest, slow_requests(con, run, top=top, hit_class=hit_class, cause=cause)


class ObservedCommands:
    def summarize(self, con, run):
        """ObservedSummary."""
        from tierdiag.diagnose.twin.observed import observed_summary

        return observed_summary(con, run)

    def explain(self, con, run, req_id: str):
        """ObservedExplanation."""
        from tierdiag.diagnose.twin.observed import explain_observed

        return explain_observed(con, run, req_id)

    def slow(self, con, run, *, top: int, hit_class: str | None = None, cause: str | None = None):
        """(ObservedSlow, rows ranked by TTFT: no ideal there)."""
        from tierdiag.diagnose.twin.observed import ObservedSlow, slow_observed

        return ObservedSlow, slow_observed(con, run, top=top, hit_class=hit_class, cause=cause)


COMMANDS = {RunKind.REPLAY: ReplayCommands(), RunKind.OBSERVED: ObservedCommands()}


def commands(run) -> ReplayCommands | ObservedCommands:
    return COMMANDS[view_of(run).kind]


# Each command parses the run once (read/run.py): what it hands down is a Run, which every
# reader below takes as it is.


def prepare(command: str) -> None:
    """Import the modules a replay's `command` ("summary", "explain") answers with, before its
    store is open: app/views.py opens the store on another thread meanwhile (issue 41). Its kind
    is not known yet: an imported run's explain loads these anyway (twin/observed_explain.py
    imports explain_request), its summary loads the replay's summary modules without using them
    (the price of the overlap for that rarer kind; not measured)."""
    import importlib

    importlib.import_module({"summary": "tierdiag.diagnose.run.summary",
                             "explain": "tierdiag.diagnose.request.explain"}[command])


def summarize(con, run):
    """`summary`: RunSummary for a replay, ObservedSummary for an imported run."""
    run = parse(run)
    return commands(run).summarize(con, run)


def explain(con, run, req_id: str):
    """`explain`: Explanation for a replayed request, ObservedExplanation for an imported one."""
    run = parse(run)
    return commands(run).explain(con, run, req_id)


def slow(con, run, *, top: int, hit_class: str | None = None, cause: str | None = None):
    """`slow`: (row type, rows): requests ranked by excess TTFT over their ideal in a replay, by
    TTFT in an imported run (no ideal there). The row type is returned for an empty list's view."""
    run = parse(run)
    return commands(run).slow(con, run, top=top, hit_class=hit_class, cause=cause)
