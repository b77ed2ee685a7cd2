"""A run parsed once: the runs row (store/reader.py's RunInfo) with what diagnose and report ask
of it answered at one place instead of re-derived from the raw config dict at each use.

    kind           RunKind (replay, observed), and its view (kind.py): the one branch on it
    rules          the SGLang release whose cache rules a replay followed (None: an imported run);
                   a replay recorded before rule sets followed 0.5.9 (`rules_recorded` None)
    switched_back  `replay --sglang OLD,NEW`'s run of one rule switched back: those rules' names
    ranks          data-parallel ranks configured (config `dp`; 1 where absent or not a count)
    timing         the clock the replay ran on (virtual | wall), as stored

`parse(run)` is idempotent and cheap on a Run, so a function that is handed either may call it.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from tierdiag.diagnose.read.kind import REPLAY, RunView, view_of
from tierdiag.store.reader import RunInfo


@dataclass(frozen=True)
class Run(RunInfo):
    rules: str | None = None
    rules_recorded: str | None = None  # config `sglang_rules` as recorded (None: before rule sets)
    switched_back: str | None = None
    ranks: int = 1
    view: RunView = field(default=REPLAY, compare=False, repr=False)

    @property
    def engine_parts(self) -> bool:
        """Whether the run's rows carry the engine's TTFT parts (a replay)."""
        return self.view.engine_parts


def _recorded(value) -> str | None:
    return str(value) if value else None


def _ranks(config: dict) -> int:
    dp = config.get("dp")
    return dp if isinstance(dp, int) and not isinstance(dp, bool) and dp >= 1 else 1


def parse(run) -> Run:
    """`run` (a RunInfo, or anything with its attributes) as a Run; itself where it is one."""
    if isinstance(run, Run):
        return run
    base = {}
    for f in fields(RunInfo):
        default = f.default if f.default is not MISSING else None
        base[f.name] = getattr(run, f.name, default)
    config = base["config"] if isinstance(base["config"], dict) else {}
    view = view_of(run)
    rules = None
    if view.engine_parts:
        from tierdiag.engine.rules import recorded_rules

        rules = recorded_rules(config)
    back = config.get("sglang_switched_back")
    return Run(**base, rules=rules, rules_recorded=_recorded(config.get("sglang_rules")),
               switched_back=back if isinstance(back, str) and back else None, ranks=_ranks(config), view=view)


__all__ = ["Run", "RunView", "parse", "view_of"]
