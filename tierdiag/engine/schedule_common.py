"""What the scheduler and its mixins (admission.py, decode.py) share: SGLang's scheduling
constants (their environ.py defaults) and AddReqResult's values, and the engine's error."""

from __future__ import annotations

from tierdiag.config.names import WritePolicy
from tierdiag.errors import TierdiagError

# Decode memory (both releases, environ.py): new_token_ratio starts at SGLANG_INIT_NEW_TOKEN_RATIO
# (0.7) x schedule_conservativeness (1), decays by (init - init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
# (0.14)) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600) every decode step that retracts nothing, is
# reset when the scheduler idles; a running request reserves min(max_new - out, CLIP) x ratio.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
NO_TOKEN, OTHER = "no_token", "other"  # AddReqResult: memory, or anything else (the shape, the budget)
INT64_MAX = 2**63 - 1  # checkpoint_into_tree: min(priority + 1, torch.iinfo(torch.int64).max)
# HiRadixCache.write_through_threshold: insert hits that trigger a device->host backup.
WRITE_THROUGH_THRESHOLD = {WritePolicy.WRITE_THROUGH: 1, WritePolicy.WRITE_THROUGH_SELECTIVE: 2}


class EngineError(TierdiagError):
    """The engine cannot make progress (a bug or an impossible configuration)."""
