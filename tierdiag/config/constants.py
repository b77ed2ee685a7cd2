"""Numbers that more than one layer reads, declared once, with no imports: the engine's cost
model uses them and diagnose's advice predicts with them (an explain loads this module alone,
not the config's presets and schema)."""

from __future__ import annotations

# Bounds on --time-scale: arrivals are int64 ns after scaling (the trace reader bounds them
# before), and a factor past these is a typo, not a workload. Checked with the rest of the
# config (config/engine.py); the advice never proposes a scale past MAX_TIME_SCALE.
MAX_TIME_SCALE = 1e6
MIN_TIME_SCALE = 1e-9

# The cost model's copy overheads, per layer: a page (segment) and a contiguous run of pages
# (engine/costmodel.py; docs/engine.md "The cost model").
SEGMENT_OVERHEAD_NS = 50
RUN_OVERHEAD_NS = 500
DISK_BYTES_PER_S = 5e9  # NVMe-class local storage: the storage tier's read and write rate
