"""Issue 43 (found by the scheduler harness's wider sweeps: 7 of 32 hrrn workloads with mixed
chunk at seeds 6-9 differed, up to 37 of 43 prefill steps): HRRN's token clock counts what
SGLang 0.5.23's `Scheduler.run_batch` counts, decode steps included.

`SchedulePolicy._sort_by_hrrn` ages a waiting request by `processed_tokens -
arrival_processed_tokens`, where `Scheduler.run_batch` keeps

    if batch.extend_num_tokens:
        self.processed_tokens_counter += batch.extend_num_tokens

for every batch it runs ("Decode / prebuilt batches contribute 0", its comment says; they do not):
- a prefill batch counts its extend tokens (`prepare_for_extend`);
- a mixed batch counts a token more for each running request (`mix_with_running`:
  `extend_num_tokens + running_bs`);
- a decode batch is the running batch, and `prepare_for_decode` never resets the
  `extend_num_tokens` the object had: the running batch is the prefill (or mixed) batch that
  `get_next_batch_to_run` made it when it was empty ("if running_batch.is_empty(): running_batch
  = last_batch"; after a mixed batch it always is, `mix_with_running` having left an empty one),
  and a batch merged into a running batch (`merge_batch`) leaves its count alone. So each decode
  step adds that batch's extend count again.
The engine counted prefill extends only: under hrrn its waiting requests aged more slowly, and
ranked differently, wherever requests decode between arrivals.

Pools: tests/engine/helpers.small_config (page 64, 16 device pages).
"""

from __future__ import annotations

from tests.engine import helpers
from tests.engine.helpers import req
from tierdiag.engine.engine import Engine
from tierdiag.probes import events as ev


class Steps(helpers.Collect):
    def __init__(self):
        super().__init__()
        self.decodes: list[ev.DecodeStep] = []

    def emit(self, event):
        super().emit(event)
        if isinstance(event, ev.DecodeStep):
            self.decodes.append(event)


def _clock(requests, mixed: bool = False) -> tuple[int, Steps]:
    probe = Steps()
    engine = Engine(helpers.small_config(schedule_policy="hrrn", enable_mixed_chunk=mixed, sglang_rules="0.5.23"),
                    probe=probe)
    engine.run(helpers.numbered(requests))
    engine.check_invariants(idle=True)
    assert {r.status for r in probe.records.values()} == {"finished"}
    return engine.scheduler.processed_tokens, probe


def test_each_decode_step_counts_the_running_batchs_extend_again():
    """a (65 tokens, 10 output) alone: its prefill batch counts 65 and becomes the running batch;
    its 9 decode steps count 65 each."""
    clock, probe = _clock([req("a", 0, [1], output=10)])
    assert len(probe.decodes) == 9
    assert clock == 65 + 9 * 65


def test_a_batch_merged_into_a_running_batch_leaves_its_count():
    """b (129 tokens, 1 output) arrives while a (40 output) decodes: b's batch counts 129 and
    merges into the running batch, which keeps a's batch's 65 for a's 39 steps."""
    clock, probe = _clock([req("a", 0, [1], output=40), req("b", 0.5, [2, 3], output=1)])
    assert len(probe.decodes) == 39
    assert clock == 65 + 129 + 39 * 65


def test_a_mixed_batch_counts_its_decode_rows_and_becomes_the_running_batch():
    """The same with mixed chunk: b's batch carries a's decode step (129 + 1 = 130, the step's
    token counted as an extend row) and becomes the running batch; a's 38 later steps count 130
    each."""
    clock, probe = _clock([req("a", 0, [1], output=40), req("b", 0.5, [2, 3], output=1)], mixed=True)
    assert [d.batch_id is not None for d in probe.decodes].count(True) == 1  # the mixed one
    assert clock == 65 + (129 + 1) + 38 * 130
