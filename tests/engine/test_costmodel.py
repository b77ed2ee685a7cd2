"""The cost model's prefill formulas, folded for speed (CostModel.__post_init__), against the
roofline written out as the docstring of costmodel.py states it: the same ns to the last bit."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.config.engine import EngineConfig
from tierdiag.config.profile import CLOCK_PARAMS, DECODE_STEP_OVERHEAD_NS
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


# decode_step_ns reads __post_init__'s typed terms (issue 41: a --dp 8 replay prices ~8x one
# rank's decode steps); the clock and the module's constants written out must give the same ns.
def _decode_written_out(c: CostModel, ctx: int) -> int:
    if c.clock is not None:
        return int(c.clock["decode_step_ns"] + c.clock["decode_ns_per_context_token"] * ctx)
    return int((c.weight_bytes + ctx * c.kv_bytes_per_token) / c.hbm_bytes_per_s * 1e9) + DECODE_STEP_OVERHEAD_NS


@settings(max_examples=500, deadline=None)
@given(which=st.integers(0, len(MODELS_) - 1), ctx=st.integers(0, 1 << 40))
def test_decode_step_is_the_bandwidth_bound_written_out(which, ctx):
    c = MODELS_[which]
    assert c.decode_step_ns(ctx) == c.decode_step_ns_reference(ctx) == _decode_written_out(c, ctx)


_NS = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(which=st.integers(0, len(MODELS_) - 1), step=_NS, per_token=_NS, ctx=st.integers(0, 1 << 40),
       whole=st.booleans())
def test_fitted_decode_step_is_the_clock_written_out(which, step, per_token, ctx, whole):
    # a fitted profile's clock (load_profile makes its values floats; whole-number values too)
    if whole:
        step, per_token = float(int(step)), float(int(per_token))
    clock = {name: 1.0 for name in CLOCK_PARAMS}
    clock.update(decode_step_ns=step, decode_ns_per_context_token=per_token)
    c = dataclasses.replace(MODELS_[which], clock=clock)
    assert c.decode_step_ns(ctx) == c.decode_step_ns_reference(ctx) == _decode_written_out(c, ctx)
