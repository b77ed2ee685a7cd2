"""The cost model's prefill formulas, folded for speed (CostModel.__post_init__), against the
roofline written out as the docstring of costmodel.py states it: the same ns to the last bit."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.config.engine import EngineConfig
from tierdiag.engine.costmodel import BATCH_OVERHEAD_NS, CostModel
from tierdiag.config.presets import GPUS, MODELS
from tierdiag.errors import ConfigError


def _models() -> list[CostModel]:
    out = []
    for model, gpu in itertools.product(MODELS, GPUS):
        try:
            out.append(CostModel.from_config(EngineConfig(model=model, gpu=gpu)))
        except ConfigError:  # a model that leaves no room for the KV cache on that GPU
            continue
    return out


MODELS_ = _models()


def _written_out(c: CostModel, new: int, prefix: int) -> int:
    flops = 2.0 * c.num_params * new + 4.0 * c.num_layers * c.hidden_size * new * (prefix + new / 2)
    return int(max(flops / c.effective_flops_per_s, c.weight_bytes / c.hbm_bytes_per_s) * 1e9) + BATCH_OVERHEAD_NS


@settings(max_examples=500, deadline=None)
@given(which=st.integers(0, len(MODELS_) - 1), new=st.integers(-5, 2_000_000), prefix=st.integers(0, 4_000_000))
def test_prefill_times_are_the_roofline_written_out(which, new, prefix):
    c = MODELS_[which]
    assert c.prefill_alone_ns(new, prefix) == _written_out(c, max(new, 1), prefix)
    if new > 0:
        assert c.prefill_ns(c.prefill_flops(new, prefix)) == _written_out(c, new, prefix)
