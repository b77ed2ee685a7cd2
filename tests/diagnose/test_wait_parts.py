"""The parts of a request's queue wait are named once (diagnose/request/context.py `WaitPart`): the
attribution's keys, the run story's wait keys and the words both say them in follow it."""

from __future__ import annotations

from tierdiag.diagnose.request import claims
from tierdiag.diagnose.run import run_claims, story
from tierdiag.diagnose.request.context import ATTRIBUTION_KEYS, WaitPart


def test_attribution_keys_are_the_wait_parts_in_order():
    assert ATTRIBUTION_KEYS == ("recompute", "new_compute", "load_back", "write_back", "decode", "storage_wait",
                                "memory_wait", "idle")
    assert tuple(WaitPart) == ATTRIBUTION_KEYS


def test_the_run_story_folds_storage_wait_into_idle_and_keeps_the_order():
    assert story.WAIT_KEYS == tuple(k for k in ATTRIBUTION_KEYS if k != WaitPart.STORAGE_WAIT)


def test_every_part_has_its_words():
    assert set(claims._WAIT_WORDS) == set(WaitPart)
    assert set(run_claims._RUN_WAIT_WORDS) == set(story.WAIT_KEYS)
