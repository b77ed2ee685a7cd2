"""Every copy-plan kind has its one implementation in each backend's table, and the planner only
makes kinds the tables know (engine/rows.py `PlanKind`, `_ROWS_BY_KIND`; kernels_cuda.py
`_SAME_DEVICE_BY_KIND`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tierdiag.engine import rows
from tierdiag.engine.rows import PlanKind, plan_copy


def test_each_backend_table_covers_every_plan_kind():
    assert set(rows._ROWS_BY_KIND) == set(PlanKind)
    kc = pytest.importorskip("tierdiag.engine.kernels_cuda")
    assert set(kc._SAME_DEVICE_BY_KIND) == set(PlanKind)


def test_plan_kinds_are_the_strings_they_always_were():
    """Calibrate profiles and LoadBackHandle.plan_kind hold them as text."""
    assert [str(k) for k in PlanKind] == ["empty", "runs", "gather", "scatter", "two_pass"]
    assert {k for k in PlanKind if k.indexed} == {PlanKind.GATHER, PlanKind.SCATTER, PlanKind.TWO_PASS}


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_plan_runs_through_the_cpu_table_and_moves_the_rows(data):
    """Hostile page lists (empty, scattered, runs, reversed, one pool into itself) plan to a
    PlanKind whose CPU implementation moves exactly the pages asked."""
    pages = 64
    n = data.draw(st.integers(0, 24))
    src = data.draw(st.permutations(range(pages)))[:n]
    dst = data.draw(st.permutations(range(pages)))[:n]
    same_pool = data.draw(st.booleans())
    plan = plan_copy(src, dst, column_bytes=data.draw(st.sampled_from([8, 4096, 1 << 20])),
                     src_num_pages=pages, dst_num_pages=pages)
    assert isinstance(plan.kind, PlanKind)
    layers, width = 2, 4
    a = np.arange(layers * pages * width, dtype=np.int64).reshape(layers, pages, width)
    b = a if same_pool else np.full_like(a, -1)
    view = lambda x: x.view(np.dtype((np.void, width * 8))).reshape(layers, pages)  # noqa: E731
    before = a.copy()
    if same_pool:
        plan = rows.within_one_pool(plan)
    rows._execute_rows(view(a), view(b), plan)
    for s, d in zip(src, dst):
        assert (b[:, d] == before[:, s]).all()
