"""How long things take on the virtual clock.

- prefill: roofline of the model on the GPU: max(FLOPs / (peak * MFU), weights / HBM) + launch overhead;
  FLOPs = 2 * params * new tokens + 4 * layers * hidden * new tokens * mean attended context.
- a copy: per-transfer overhead + bytes / link bandwidth + per-layer costs for every page (a
  segment the kernel moves) and every contiguous run of slots (a separate DMA where copies are
  issued run by run): small pages and fragmented slots are slow, which is what explain calls out;
- load-back overlapped layer by layer with prefill: the first layer's load is always exposed;
- storage: per-operation latency + bytes / disk bandwidth.
A `tierdiag calibrate` profile replaces the link numbers with measured ones; a fitted profile
(`tierdiag calibrate --from OBSERVED_RUN`, config/profile.py) replaces every term of the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Mapping

from mypy_extensions import mypyc_attr

from tierdiag.config.constants import DISK_BYTES_PER_S, RUN_OVERHEAD_NS, SEGMENT_OVERHEAD_NS
from tierdiag.config.engine import EngineConfig
from tierdiag.config.presets import gpu_preset, model_preset
from tierdiag.config.profile import BATCH_OVERHEAD_NS, DECODE_STEP_OVERHEAD_NS, load_profile
# Per layer: each page is one segment of the copy, each contiguous run of slots one DMA
# (SEGMENT_OVERHEAD_NS, RUN_OVERHEAD_NS, DISK_BYTES_PER_S: config/constants.py, which the advice
# predicts with too). At Llama-3-8B geometry a 64-token page is 256 KiB a layer, so these matter
# for small pages and heavy fragmentation, and hardly at all otherwise.
DISK_LATENCY_NS: Final = 100_000  # (Final: a compiled constant, not a module dict look-up a call)
# SGLang moves a storage read or write in batches of this many pages, one backend call each, one
# after another (hicache_storage.STORAGE_BATCH_SIZE; HiCacheController._page_transfer /
# _page_backup), and acknowledges a read batch by batch: a read cut short keeps whole batches.
STORAGE_BATCH_PAGES: Final = 128


# Compiled (engine/compiled.py) as a native class that Python may subclass: a harness prices
# storage or a decode step at 0 with a subclass given to every holder of the model
# (tests/sglang/scheduler_harness.py `price_at_zero`); an instance takes no new attribute.
@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True)
class CostModel:
    num_layers: int
    hidden_size: int
    kv_bytes_per_token: int
    weight_bytes: float
    num_params: float
    effective_flops_per_s: float
    hbm_bytes_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    transfer_overhead_ns: int
    layerwise_overlap: bool
    link_source: str  # "preset" or the profile path
    # A fitted profile's clock (config/profile.CLOCK_PARAMS); None: the presets' roofline.
    clock: Mapping[str, float] | None = None
    # __post_init__'s folded factors, declared (the compiled class has no __dict__): not fields
    # of __init__, repr or ==.
    _linear_flops: float = field(init=False, repr=False, compare=False)
    _attention_flops: float = field(init=False, repr=False, compare=False)
    _memory_s: float = field(init=False, repr=False, compare=False)
    _batch_overhead_ns: int = field(init=False, repr=False, compare=False)
    # decode_step_ns's terms, read as typed fields (no clock dict look-ups, no module global a
    # step: a --dp 8 replay prices ~8x one rank's steps, issue 41)
    _decode_fitted: bool = field(init=False, repr=False, compare=False)
    _decode_base: float = field(init=False, repr=False, compare=False)
    _decode_per_token: float = field(init=False, repr=False, compare=False)
    _decode_overhead_ns: int = field(init=False, repr=False, compare=False)
    # storage_ns's rate as a typed float: config/constants' DISK_BYTES_PER_S is a module global
    # of an interpreted module, so a compiled storage_ns read it from a dict and did its
    # arithmetic on Python objects (~1.5k instructions a call; ~2 calls a storage write)
    _disk_bytes_per_s: float = field(init=False, repr=False, compare=False)
    # copy_ns's per-page and per-run costs as typed fields, this module's globals read when the
    # model is made: read at every copy, they were a module dict look-up each and their products
    # generic multiplies of boxed ints (~1.9k instructions a call; issue 41, session 26). Not
    # compiled constants: a harness sets RUN_OVERHEAD_NS to 0 around an engine it makes
    # (tests/sglang/scheduler_harness.py `run_engine`, flat_copy_cost).
    _segment_overhead_ns: int = field(init=False, repr=False, compare=False)
    _run_overhead_ns: int = field(init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> "CostModel":
        m, g = model_preset(cfg.model), gpu_preset(cfg.gpu)
        h2d = d2h = g.link_bytes_per_s
        overhead = g.transfer_overhead_ns
        source = "preset"
        clock = None
        if cfg.profile:
            prof = load_profile(cfg.profile)
            h2d, d2h = prof.clock["h2d_bytes_per_s"], prof.clock["d2h_bytes_per_s"]
            overhead = int(prof.clock["transfer_overhead_ns"])
            source = str(cfg.profile)
            clock = prof.clock if prof.kind == "fitted" else None
        return cls(
            num_layers=m.num_layers, hidden_size=m.hidden_size, kv_bytes_per_token=m.kv_bytes_per_token,
            weight_bytes=m.weight_bytes, num_params=m.num_params,
            effective_flops_per_s=g.flops_per_s * g.mfu, hbm_bytes_per_s=g.hbm_bytes_per_s,
            h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h, transfer_overhead_ns=overhead,
            layerwise_overlap=cfg.layerwise_overlap, link_source=source, clock=clock,
        )

    def __post_init__(self) -> None:
        # The prefill formulas' constant factors, folded once: the same floating-point operations
        # in the same order as written out below, so the same results to the last bit. A
        # request's record evaluates prefill_alone_ns three times (its counterfactuals).
        object.__setattr__(self, "_disk_bytes_per_s", float(DISK_BYTES_PER_S))
        object.__setattr__(self, "_segment_overhead_ns", SEGMENT_OVERHEAD_NS)
        object.__setattr__(self, "_run_overhead_ns", RUN_OVERHEAD_NS)
        c = self.clock
        if c is None:
            object.__setattr__(self, "_linear_flops", 2.0 * self.num_params)
            object.__setattr__(self, "_attention_flops", 4.0 * self.num_layers * self.hidden_size)
            object.__setattr__(self, "_memory_s", self.weight_bytes / self.hbm_bytes_per_s)
            object.__setattr__(self, "_batch_overhead_ns", BATCH_OVERHEAD_NS)
            object.__setattr__(self, "_decode_fitted", False)
            object.__setattr__(self, "_decode_base", self.weight_bytes)
            object.__setattr__(self, "_decode_per_token", 0.0)
            object.__setattr__(self, "_decode_overhead_ns", DECODE_STEP_OVERHEAD_NS)
        else:  # fitted times, as FLOPs at this GPU's rate: the formulas below stay one
            object.__setattr__(self, "_linear_flops", c["prefill_ns_per_token"] * 1e-9 * self.effective_flops_per_s)
            object.__setattr__(self, "_attention_flops",
                               c["prefill_ns_per_token_pair"] * 1e-9 * self.effective_flops_per_s)
            object.__setattr__(self, "_memory_s", c["prefill_floor_ns"] * 1e-9)
            object.__setattr__(self, "_batch_overhead_ns", int(round(c["batch_overhead_ns"])))
            object.__setattr__(self, "_decode_fitted", True)
            object.__setattr__(self, "_decode_base", float(c["decode_step_ns"]))
            object.__setattr__(self, "_decode_per_token", float(c["decode_ns_per_context_token"]))
            object.__setattr__(self, "_decode_overhead_ns", 0)

    # --- compute -------------------------------------------------------------------------
    def prefill_flops(self, new_tokens: int, prefix_tokens: int) -> float:
        """FLOPs to compute `new_tokens` that attend to `prefix_tokens` cached ones (causal):
        2 * params * new + 4 * layers * hidden * new * (prefix + new / 2)."""
        return self._linear_flops * new_tokens + self._attention_flops * new_tokens * (prefix_tokens + new_tokens / 2)

    def prefill_ns(self, flops: float) -> int:
        """max(flops / (peak * MFU), weights / HBM) + the batch's overhead."""
        compute_s = flops / self.effective_flops_per_s
        return int(max(compute_s, self._memory_s) * 1e9) + self._batch_overhead_ns

    def prefill_alone_ns(self, new_tokens: int, prefix_tokens: int) -> int:
        """prefill_ns(prefill_flops(max(new_tokens, 1), prefix_tokens)), inline."""
        new = new_tokens if new_tokens > 1 else 1
        compute_s = (self._linear_flops * new + self._attention_flops * new * (prefix_tokens + new / 2)
                     ) / self.effective_flops_per_s
        return int((compute_s if compute_s > self._memory_s else self._memory_s) * 1e9) + self._batch_overhead_ns

    def decode_step_ns(self, running_context_tokens: int) -> int:
        """One decode step: read the weights and every running request's KV once (fitted: the
        profile's step time and time per context token). __post_init__'s typed terms, the same
        operations in the same order as decode_step_ns_reference, so the same results to the bit."""
        if self._decode_fitted:
            return int(self._decode_base + self._decode_per_token * running_context_tokens)
        bytes_read = self._decode_base + running_context_tokens * self.kv_bytes_per_token
        return int(bytes_read / self.hbm_bytes_per_s * 1e9) + self._decode_overhead_ns

    def decode_step_ns_reference(self, running_context_tokens: int) -> int:
        """decode_step_ns written out from the clock and the module's constants (the tests hold
        the two to identical results)."""
        if self.clock is not None:
            return int(self.clock["decode_step_ns"] + self.clock["decode_ns_per_context_token"] * running_context_tokens)
        bytes_read = self.weight_bytes + running_context_tokens * self.kv_bytes_per_token
        return int(bytes_read / self.hbm_bytes_per_s * 1e9) + DECODE_STEP_OVERHEAD_NS

    # --- copies --------------------------------------------------------------------------
    def copy_ns(self, num_bytes: int, num_pages: int, *, to_device: bool, runs: int = 1) -> int:
        bw = self.h2d_bytes_per_s if to_device else self.d2h_bytes_per_s
        per_layer = self._segment_overhead_ns * num_pages + self._run_overhead_ns * runs
        return self.transfer_overhead_ns + int(num_bytes / bw * 1e9) + self.num_layers * per_layer

    def storage_ns(self, num_bytes: int) -> int:
        return DISK_LATENCY_NS + int(num_bytes / self._disk_bytes_per_s * 1e9)

    def storage_batch_ends(self, pages: int, page_bytes: int) -> list[int]:
        """A storage read or write of `pages` pages as SGLang issues it: one `storage_ns` call a
        batch of STORAGE_BATCH_PAGES pages, in turn. The end of each batch from the start (ns);
        the last is the operation's length (one call, for no pages)."""
        ends = []
        t = 0
        done = 0
        while True:
            n = min(STORAGE_BATCH_PAGES, pages - done)
            t += self.storage_ns(n * page_bytes)
            ends.append(t)
            done += n
            if done >= pages:
                return ends

    def storage_io_ns(self, pages: int, page_bytes: int) -> int:
        """How long a storage read or write of `pages` pages takes: storage_batch_ends' last, in
        closed form (the whole batches all cost the same storage_ns, so their sum is one call
        times their count, plus the last part batch's; no pages: one call, as there). Priced
        once a storage write and a read; building the batch-end list for its last item took
        ~2.8k instructions (tests/engine/test_storage_io_ns.py holds the two equal)."""
        if pages <= 0:
            return self.storage_ns(pages * page_bytes)
        full = pages // STORAGE_BATCH_PAGES  # (native int ops: divmod is a generic call)
        rest = pages - full * STORAGE_BATCH_PAGES
        t = self.storage_ns(STORAGE_BATCH_PAGES * page_bytes) * full if full else 0
        if rest:
            t += self.storage_ns(rest * page_bytes)
        return t

    def storage_pages_done(self, pages: int, page_bytes: int, elapsed_ns: int) -> int:
        """The pages of a read started `elapsed_ns` ago that are acknowledged: the whole batches
        ended by then (SGLang's `PrefetchAck` comes a batch at a time)."""
        if elapsed_ns <= 0:
            return 0
        done = 0
        for i, end in enumerate(self.storage_batch_ends(pages, page_bytes)):
            if end > elapsed_ns:
                return done
            done = min(pages, (i + 1) * STORAGE_BATCH_PAGES)
        return done

    def overlapped_ns(self, load_ns: int, compute_ns: int) -> int:
        """Wall time of a batch whose load-back of `load_ns` feeds a prefill of `compute_ns`.

        Layer-wise: layer i's KV is loaded while layer i-1 computes.
            load   |L0|L1|L2|...
            compute   |C0|C1|C2|...
        finish = l + (n-1) * max(l, c) + c with l, c the per-layer times.
        """
        if load_ns <= 0:
            return compute_ns
        if not self.layerwise_overlap:
            return load_ns + compute_ns
        n = self.num_layers
        per_load, per_compute = load_ns / n, compute_ns / n
        return int(per_load + (n - 1) * max(per_load, per_compute) + per_compute)
