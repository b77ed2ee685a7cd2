"""engine/cached_split.py: the cached prefix's split by tier (rules.RuleSet.split_cached_prefix),
compiled with the engine core, written with comparisons instead of the builtin min/max it had in
rules.py (compiled, those are generic calls). Held to the rules.py functions as they were (here,
verbatim) and to its own Python source (the twin) on any ints, hostile ones included."""

from __future__ import annotations

import importlib.util

from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.engine import cached_split, compiled


def _split_promised(prefix, device, host_hit, host_loaded, storage_hit, storage_start, span, span_start):
    storage = min(host_hit, storage_hit)
    return max(0, prefix - host_hit), host_hit - storage, storage


def _split_by_tier(prefix, device, host_hit, host_loaded, storage_hit, storage_start, span, span_start):
    host_total = min(prefix, min(host_hit, host_loaded))
    host_start = prefix - host_total
    storage_start, storage_hit = span_start, span
    storage_end = storage_start + storage_hit
    storage = max(0, min(prefix, storage_end) - max(0, storage_start))
    storage_in_host = max(0, min(prefix, storage_end) - max(host_start, storage_start))
    host = host_total - storage_in_host
    return prefix - host - storage, host, storage


def _twin():
    """cached_split.py's source as a plain Python module, whatever this process runs."""
    spec = importlib.util.spec_from_file_location("_cached_split_twin", compiled.source_path("cached_split"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TWIN = _twin()
_INTS = st.one_of(st.integers(0, 4096), st.integers(-5, 5), st.integers(-2**70, 2**70),
                  st.sampled_from([2**62, -2**62, 2**63 - 1, -2**63, 2**64]))


@settings(max_examples=300, deadline=None)
@given(args=st.tuples(*[_INTS] * 8))
def test_the_splits_are_the_rules_py_functions_compiled_and_not(args):
    for new, old in ((cached_split.split_promised, _split_promised), (cached_split.split_by_tier, _split_by_tier)):
        want = old(*args)
        assert new(*args) == want
        assert getattr(_TWIN, new.__name__)(*args) == want
        assert all(type(v) is int for v in new(*args))


def test_every_rule_set_reads_the_compiled_splits():
    from tierdiag.engine.rules import RULE_SETS

    for rules in RULE_SETS.values():
        assert rules.split_cached_prefix in (cached_split.split_promised, cached_split.split_by_tier)
