"""Advice: what to change in a run's config, each item a rule's, verified by a replay.

    base.py        what a rule is (Rule: trigger, sentence, prediction, target, kinds, options,
                   place) and reads (Evidence); the bars all rules share
    rules/         one rule a module: its trigger, its sentence (a Claim from named numbers), its
                   prediction and its target (how its replay is judged), together
    registry.py    the list of rules, in the order they are tried, and the fallback ("none")
    propose.py     every rule that fires, placed: what `summary`, `explain` and `advise` propose
    targets.py     the run shares a rule's change must lower, with their SQL
    types.py       Advice, Verified, Sizing; the status of a tried item (classify)
    verify.py      what `advise` replayed, measured and classified; the combination of the confirmed

Adding a rule is one module under rules/ and its test (docs/architecture.md, "Adding an advice
rule"). Reads the store only; app/advise.py replays.
"""

from tierdiag.diagnose.advice.base import HOST_POOL_LIMIT_BYTES, Evidence, Rule
from tierdiag.diagnose.advice.propose import propose
from tierdiag.diagnose.advice.types import (STATUSES, Advice, Sizing, Verified, advice_json, advised, classify,
                                            tried_not_advised)

__all__ = ["HOST_POOL_LIMIT_BYTES", "Evidence", "Rule", "propose", "STATUSES", "Advice", "Sizing", "Verified",
           "advice_json", "advised", "classify", "tried_not_advised"]
