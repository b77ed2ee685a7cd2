"""SGLang 0.5.23's own `Scheduler`, stepped on a virtual clock (worker side of the scheduler
harness, tests/sglang/scheduler_harness.py; imported by worker.py after sglang_imports.install).

What runs is SGLang's code: `Scheduler.__init__` (its init_* orchestration), `handle_generate_request`,
`get_next_batch_to_run` (PrefillAdder, SchedulePolicy, chunked prefill, the waiting-prefix refresh,
`update_running_batch` with decode allocation and retraction), `run_batch`,
`process_batch_result` (`cache_unfinished_req`, `cache_finished_req`/`checkpoint_into_tree`),
`ScheduleBatch`, the allocators, `UnifiedRadixCache` on the tree core that
SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND names (the wheel's Rust core by default, "python" for the
fallback) and the HiCache controller. Replaced are only what needs a GPU or a model:

- `init_model_config` / `init_tokenizer`: a model config of the few fields the scheduling path
  reads (anything else it asks for reads None: logged in `MISSING`), no tokenizer
  (`skip_tokenizer_init`), no IPC (`Sink`);
- `init_model_worker`: CPU pools built as SGLang's own classes (`MHATokenToKVPool` at head_dim 1,
  `PagedTokenToKVPoolAllocator` / `TokenToKVPoolAllocator`, `ReqToTokenPool`) and a model worker
  whose forward returns one fresh token id a request (`FakeWorker.forward_batch_generation`);
- the parallel runtime: SGLang's `_init_parallel_groups` on the one-rank gloo group;
- the byte layer as tests/sglang/sglang0523.py stands it in (copies complete synchronously,
  host copies are no-ops on a plain CPU buffer).

The clock: before each step the requests whose arrival is at or before it are handed to
`handle_generate_request`; one step runs; the clock advances by the step's price, which is the
engine's own cost model (`tierdiag.engine.costmodel.CostModel`, the same config) applied to
SGLang's batch: `prefill_flops(extend, prefix)` per request, load-back pages through
`copy_ns` on one host->device link, `overlapped_ns`, `decode_step_ns(running context)` for a
decode step. `switches` (scheduler_harness.SWITCHES) make SGLang behave as main's engine does
where it is known to differ (issue 43); each is off in the final tests.
"""

from __future__ import annotations

import os
import socket
import sys
import types
from array import array
from dataclasses import replace
from pathlib import Path

import torch

import triton  # the stub (sglang_imports.GPU_ROOTS)

triton.__version__ = "3.5.0"  # mamba_ssm compares it at import time

from sglang.srt.distributed import bootstrap  # noqa: E402
from sglang.srt.managers import schedule_batch  # noqa: E402
from sglang.srt.managers import scheduler as S  # noqa: E402
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache import allocation, kv_cache_builder  # noqa: E402
from sglang.srt.mem_cache import unified_radix_cache as urc  # noqa: E402
from sglang.srt.mem_cache.common import evict_from_tree_cache  # noqa: E402
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.pool_host import common as host_common  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, get_context, get_parallel, publish  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

import sglang0523  # noqa: E402,F401  (its byte stand-ins: device module, host buffer, copies)
import sglang0523_storage as storage  # noqa: E402  (the storage tier's threads, pumped: its docstring)
import storage_price  # noqa: E402
from token_ids import OUTPUT_TOKEN_BASE, input_tokens  # noqa: E402

# The engine's cost model: the repository root is two folders up (tests/sglang/..).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tierdiag.config.engine import EngineConfig  # noqa: E402
from tierdiag.engine import costmodel  # noqa: E402

# Every device a host buffer may be allocated for: a plain CPU tensor.
_cpu_alloc = host_common.ALLOC_MEMORY_FUNCS["cpu"]
host_common.ALLOC_MEMORY_FUNCS.default_factory = lambda: _cpu_alloc
for _k in list(host_common.ALLOC_MEMORY_FUNCS):
    host_common.ALLOC_MEMORY_FUNCS[_k] = _cpu_alloc
# HostKVCache._allocate_host_buffer checks the pool against the machine's free RAM less a
# reserve (HICACHE_HOST_MEMORY_RESERVE_BYTES): at head_dim 1 the pool is a few MB, but on a busy
# shared machine the reserve alone fails it ("Not enough host memory available"). The budget is
# what the pool asks for.
from sglang.srt.mem_cache.pool_host import base as _host_base  # noqa: E402

_host_base.host_memory_budget_bytes = lambda requested_bytes=0, *, auto_size=False: requested_bytes
# Model-specific questions the KV-cache builder asks of a real model config.
kv_cache_builder.get_resolved_model_impl = lambda model_config: "sglang"
kv_cache_builder.is_deepseek_dsa = lambda hf_config: False
kv_cache_builder.uses_ssm_state = lambda model_config: False
S.get_resolved_model_impl = lambda model_config: "sglang"

MISSING: set[str] = set()  # model-config / runner fields SGLang asked for that the stand-ins lack
_PARALLEL = {"ready": False}
SWITCHES: set[str] = set()


class _Lenient(types.SimpleNamespace):
    """A model config / model runner stand-in: fields it was given, None for any other (logged)."""

    _prefix = ""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        MISSING.add(self._prefix + name)
        return None


class _Runner(_Lenient):
    _prefix = "runner."


class Sink:
    """The scheduler's outbound channels: whatever is sent is dropped (the harness reads the
    requests' state itself)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *a, **k):
        return None


class FakeWorker:
    """The model worker: pools built by SGLang's own classes; a forward that samples one fresh
    token id a request (never an input token, never another request's)."""

    def __init__(self, model_config, kv, alloc, req_to_token):
        self.model_config = model_config
        self.is_hybrid_swa = False
        self.model_runner = _Runner(
            token_to_kv_pool=kv, token_to_kv_pool_allocator=alloc, req_to_token_pool=req_to_token,
            model_config=model_config, canary_manager=None, forward_stream=None, mtp_draft_device_pools=(),
            mtp_draft_mamba_pools=(), attn_backend=types.SimpleNamespace(), is_hybrid_swa=False,
            sliding_window_size=None,
            ngram_embedding_manager=types.SimpleNamespace(prepare_for_forward=lambda b, chunked_req=None: b,
                                                          enabled=False))
        self.next_token = OUTPUT_TOKEN_BASE

    def forward_batch_generation(self, batch, **kw):
        ids = []
        for _ in batch.reqs:
            self.next_token += 1
            ids.append(self.next_token)
        return GenerationBatchResult(logits_output=None, next_token_ids=torch.tensor(ids, dtype=torch.int64),
                                     can_run_cuda_graph=False)

    def get_memory_pool(self):
        return self.model_runner.req_to_token_pool, self.model_runner.token_to_kv_pool_allocator

    def register_hicache_layer_transfer_counter(self, *a, **k):
        pass

    def set_hicache_consumer(self, *a, **k):
        pass

    def get_pad_input_ids_func(self):
        return None


class HeadlessScheduler(S.Scheduler):
    """`Scheduler.__init__` as it is, with the model, tokenizer, IPC and GPU pieces stood in."""

    total_tokens = 0
    max_running = 0
    context_len = 0

    def init_startup_timing_begin(self):
        pass

    def init_startup_timing_summary(self):
        pass

    def init_soft_watchdog(self):
        pass

    def init_model_config(self):
        self.model_config = _Lenient(
            is_generation=True, is_multimodal=False, is_encoder_decoder=False, context_len=self.context_len,
            hf_config=_Lenient(architectures=["LlamaForCausalLM"]), hf_text_config=_Lenient(),
            num_hidden_layers=1, vocab_size=(1 << 31) - 1, use_ngram_embedding=False)

    def init_ipc_channels(self, port_args):
        self.ipc_channels = Sink()
        self.recv_from_tokenizer = None
        self.load_snapshot_writer = None

    def init_idle_sleeper(self):
        self.idle_sleeper = None

    def init_tokenizer(self):
        self.is_generation = True
        self.tokenizer = self.processor = None
        self._mm_processor = None

    def init_moe_gemm_config(self):
        self.require_mlp_sync = False

    def init_model_worker(self):
        ps, total = self.page_size, self.total_tokens
        kv = MHATokenToKVPool(size=total, page_size=ps, dtype=torch.float16, head_num=1, head_dim=1, layer_num=1,
                              device="cpu", enable_memory_saver=False)
        if ps == 1:
            alloc = TokenToKVPoolAllocator(total, torch.int64, "cpu", kv, False)
        else:
            alloc = PagedTokenToKVPoolAllocator(total, ps, torch.int64, "cpu", kv, False)
        rows = ReqToTokenPool(size=self.max_running, max_context_len=self.context_len + 8, device="cpu",
                              enable_memory_saver=False)
        self.tp_worker = FakeWorker(self.model_config, kv, alloc, rows)
        self.draft_worker = None
        self.model_worker = self.tp_worker
        # Scheduler.init_model_worker's tail, from tp_worker.get_worker_info
        self.max_total_num_tokens = total
        self.max_prefill_tokens = self.server_args.max_prefill_tokens
        self.max_running_requests = self.max_running
        self.max_queued_requests = None
        self.max_req_len = self.context_len - 1
        self.max_req_input_len = self.max_req_len - 5
        self.random_seed = 0
        self.device = "cpu"
        self.forward_stream = None
        self.schedule_stream = None
        self.min_free_slots_delayer = None
        p = get_parallel()
        if not p.pp_max_micro_batch_size:
            get_context().override("scheduler.pp_max_micro_batch_size_default",
                                   pp_max_micro_batch_size=self.max_running)
        self.tp_group, self.attn_tp_group, self.attn_cp_group = p.tp_group, p.attn_tp_group, p.attn_cp_group
        self.tp_cpu_group, self.attn_tp_cpu_group = self.tp_group.cpu_group, self.attn_tp_group.cpu_group
        self.attn_cp_cpu_group = self.attn_cp_group.cpu_group
        self.pp_group, self.world_group = p.pp_group, p.world_group
        self.dp_tp_group = S.get_dp_tp_group()
        self.dp_tp_cpu_group = self.dp_tp_group.cpu_group
        self.pad_input_ids_func = None
        self.startup_available_gpu_memory_gb = 0.0


def _init_parallel(server_args) -> None:
    """bootstrap.init_parallel_runtime's group building, once a process, on the gloo group
    sglang_imports.install started."""
    if _PARALLEL["ready"]:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bootstrap._init_parallel_groups(backend="gloo", dist_init_method=f"tcp://127.0.0.1:{port}",
                                    server_args=server_args, gpu_id=0)
    _PARALLEL["ready"] = True


bootstrap.init_parallel_runtime = lambda **kw: _init_parallel(kw["server_args"])
bootstrap.init_layer_runtime = lambda **kw: None


# --- switches: SGLang made to behave as main's engine (issue 43's divergences) -------------------
_CKPT = {"depth": 0, "priority": None}
_orig_ckpt = urc.UnifiedRadixCache.checkpoint_into_tree
_orig_insert = urc.UnifiedRadixCache.insert


def _checkpoint_into_tree(self, *a, **k):
    _CKPT["depth"] += 1
    _CKPT["priority"] = None
    try:
        return _orig_ckpt(self, *a, **k)
    finally:
        _CKPT["depth"] -= 1


def _insert(self, params, *a, **k):
    if _CKPT["depth"]:
        if _CKPT["priority"] is None:
            _CKPT["priority"] = params.priority
        elif "priority_once" in SWITCHES and params.priority == _CKPT["priority"] + 1:
            # divergence 1: the engine inserts a finished prompt once, at its own priority
            params = replace(params, priority=_CKPT["priority"])
    return _orig_insert(self, params, *a, **k)


_orig_stash = S.Scheduler.stash_chunked_request


def _stash_chunked_request(self, req):
    """get_next_batch_to_run checkpoints the chunked request's last chunk into the tree; a pass
    that formed no prefill (the drain_decode switch's decode pass) leaves the chunk where it was,
    and the next pass must not checkpoint the same chunk again."""
    key = (req.rid, req.prefix_len, req.extend_end)
    if getattr(self, "_stashed", None) == key:
        return None
    self._stashed = key
    counter = getattr(self, "_harness_evicted", None)
    if counter is None:
        return _orig_stash(self, req)
    # The chunk's insert (cache_unfinished_req: its write-through backup may evict host leaves)
    # belongs to the previous batch's end, where the engine runs it (_cache_unfinished at the
    # batch's end), and so does what this pass ran before it (`_process_hicache_events`: the
    # storage drain, whose hits' host memory may evict host leaves, and the re-queries), which
    # the engine runs there too, just before the insert (`storage_pass_start`): run_workload
    # moves everything evicted from the pass's start to the stash's end into the window before.
    try:
        return _orig_stash(self, req)
    finally:
        counter["stash"] = [counter["device"], counter["host"], len(counter["log"])]


S.Scheduler.stash_chunked_request = _stash_chunked_request
urc.UnifiedRadixCache.checkpoint_into_tree = _checkpoint_into_tree
urc.UnifiedRadixCache.insert = _insert

_orig_alloc_for_extend = schedule_batch.alloc_for_extend


def _alloc_for_extend(batch):
    """ScheduleBatch.prepare_for_extend's allocation. With `alloc_output` (divergences 2 and 3),
    first evict as main's engine allocates at admission: a request's last chunk takes
    ceil((input + output) / page) pages (its whole output, and one page more than SGLang ever
    gives it when input + output = 1 mod page), plus the rule set's page a request."""
    ps = batch.token_to_kv_pool_allocator.page_size
    once = "reserve_page_once" in SWITCHES
    if "alloc_output" in SWITCHES:
        # request by request, as the engine's admissions evict: each for what the requests
        # before it took plus its own pages plus the page it keeps free
        need = 0
        for req, pre, ext in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
            end, n_in = pre + ext, len(req.origin_input_ids)
            last = -(-(n_in + req.sampling_params.max_new_tokens) // ps) if end >= n_in else -(-end // ps)
            need += (last - -(-pre // ps)) * ps + (0 if once else ps)
            evict_from_tree_cache(batch.tree_cache, need + (ps if once else 0))
    if not once or len(batch.reqs) < 2:
        return _orig_alloc_for_extend(batch)
    # divergence 6: alloc_paged_token_slots_extend evicts for the batch's extend plus a page a
    # request at once; the engine evicts request by request, each for its extend plus a page
    # that the next one then finds free: one page for the batch
    spare = (len(batch.reqs) - 1) * ps
    allocation.evict_from_tree_cache = lambda tree_cache, num_tokens: evict_from_tree_cache(
        tree_cache, num_tokens - spare)
    try:
        return _orig_alloc_for_extend(batch)
    finally:
        allocation.evict_from_tree_cache = evict_from_tree_cache


schedule_batch.alloc_for_extend = _alloc_for_extend


def _set_env(switches: set[str], core: str) -> None:
    os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = core
    # divergence 4: the waiting-prefix LRU refresh (every 32nd pass, the first 128 waiting)
    os.environ["SGLANG_ENABLE_WAITING_PREFIX_REFRESH"] = "0" if "no_refresh" in switches else "1"
    if "reserve_output" in switches:
        # divergence 3 (admission part): reserve every running request's whole remaining output
        os.environ["SGLANG_INIT_NEW_TOKEN_RATIO"] = "1.0"
        os.environ["SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR"] = "1.0"
    else:
        os.environ.pop("SGLANG_INIT_NEW_TOKEN_RATIO", None)
        os.environ.pop("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", None)


def _hook_load_backs(tree) -> None:
    """Each admission's load-back as it happens (`UnifiedRadixCache.init_load_back`), for the
    price: `Req.host_loaded_length` is set only when an admission loads (`PrefillAdder`:
    `if req.needs_host_load_back()`), and `reset_for_retract` leaves it, so a retracted request
    re-admitted from device still carries its first admission's load."""
    inner = tree.init_load_back

    def init_load_back(params):
        loaded = inner(params)
        if loaded is not None and params.req is not None:
            params.req._harness_fresh_load = loaded[0]
        return loaded

    tree.init_load_back = init_load_back


def build(spec: dict) -> HeadlessScheduler:
    ps, dev, host = spec["page_size"], spec["device_pages"], spec.get("host_pages")
    kw = {}
    if host:
        # HostKVCache sizes the pool int(device * ratio) // page + 1 pages: ask for host - 1
        kw = dict(enable_hierarchical_cache=True, hicache_ratio=((host - 1) * ps + 0.5) / (dev * ps),
                  hicache_io_backend="kernel", hicache_mem_layout="layer_first",
                  hicache_write_policy=spec["write_policy"])
        kw.update(spec.get("_storage_args", {}))
    budget = spec["max_prefill_tokens"]
    args = ServerArgs(model_path="dummy", skip_tokenizer_init=True, page_size=ps, device="cpu",
                      disable_overlap_schedule=True, chunked_prefill_size=budget, max_prefill_tokens=budget,
                      max_total_tokens=dev * ps, schedule_policy=spec["schedule_policy"],
                      radix_eviction_policy=spec.get("eviction_policy", "lru"),
                      enable_mixed_chunk=bool(spec.get("mixed_chunk")),
                      max_running_requests=spec.get("max_running", 512), **kw)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    HeadlessScheduler.total_tokens = dev * ps
    HeadlessScheduler.max_running = max_running_requests(dev * ps, spec["context_len"])
    HeadlessScheduler.context_len = spec["context_len"]
    sch = HeadlessScheduler(args, types.SimpleNamespace(nccl_port=0))
    core = type(sch.tree_cache.tree_core).__name__
    want = "RustUnifiedTreeCore" if spec["core"] == "rust" else "UnifiedTreeCore"
    assert core == want, f"tree core {core}, asked for {spec['core']}"
    if host:
        got = sch.tree_cache.cache_controller.mem_pool_host.size
        assert got == host * ps, f"host pool {got} tokens, asked for {host * ps}"
    return sch


def max_running_requests(token_capacity: int, context_len: int) -> int:
    """SGLang's own `KVCacheConfigurator.resolve_max_num_reqs(token_capacity)` (the published
    server args' max_running_requests, None: its estimate from the context length), on a
    configurator of one attention-DP rank and no mamba state: the ReqToTokenPool's rows and the
    scheduler's `max_running_requests` (`get_worker_info`), as `_resolve_memory_pool_config` sets
    them."""
    conf = types.SimpleNamespace(model_config=types.SimpleNamespace(context_len=context_len), attn_dp_size=1,
                                 mambaish_config=None)
    return KVCacheConfigurator.resolve_max_num_reqs(conf, token_capacity)


def max_running_cases(cases: list) -> list[int]:
    """`resolve_max_num_reqs` on each (token_capacity, context_len, explicit or None), the
    explicit value read where SGLang reads it (`get_schedule().max_running_requests`, stood in
    for the call): tests/sglang/test_scheduler_0523.py holds the engine's formula to it."""
    from sglang.srt.mem_cache import kv_cache_configurator as kvc

    real = kvc.get_schedule
    out = []
    try:
        for capacity, context, explicit in cases:
            kvc.get_schedule = lambda explicit=explicit: types.SimpleNamespace(max_running_requests=explicit)
            out.append(max_running_requests(capacity, context))
    finally:
        kvc.get_schedule = real
    return out


def _make(r: dict, block: int) -> TokenizedGenerateReqInput:
    # Not ignore_eos (the engine's model: a request's output ends by itself, max_new_tokens being
    # the trace's output length; the fake worker never samples an EOS id). The `ignore_eos`
    # switch sends it as bench clients do, which 0.5.23 reserves differently (not modelled).
    sp = SamplingParams(max_new_tokens=r["output_len"], ignore_eos="ignore_eos" in SWITCHES)
    sp.normalize(None)
    return TokenizedGenerateReqInput(
        rid=r["id"], input_text=None, input_ids=array("q", input_tokens(r, block)), input_embeds=None,
        mm_inputs=None, token_type_ids=None, sampling_params=sp, return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=False, priority=r.get("priority") or None)


class Pricer:
    """The engine's cost model on SGLang's batch (scheduler.Scheduler._run_batch's formulas)."""

    def __init__(self, spec: dict):
        if spec.get("flat_copy_cost"):
            costmodel.RUN_OVERHEAD_NS = 0  # the per-run DMA term reads the allocator's slot layout
        cfg = EngineConfig(**spec["engine_config"])
        self.cost = costmodel.CostModel.from_config(cfg)
        self.ps = cfg.page_size
        self.page_bytes = self.cost.kv_bytes_per_token * self.ps
        self.h2d_free = 0
        self.d2h_free = 0
        self.blocking = 0  # write-backs the current step's allocation waited for
        self.zero_decode = "zero_decode" in SWITCHES
        # storage on the clock (sglang0523_storage.TIMING): the engine's price, maybe slowed
        slow = spec.get("storage_slowdown") or 0
        storage.timed_by(storage_price.priced(self.cost, slow) if slow else None, self.page_bytes)

    def device_to_host(self, tokens: int, now: int) -> None:
        """A copy of `tokens` on the one device->host link (CacheController.backup / _write_back:
        each starts when the link is free)."""
        pages = -(-tokens // self.ps)
        start = max(now, self.d2h_free)
        self.d2h_free = start + self.cost.copy_ns(pages * self.page_bytes, pages, to_device=False)

    def prefill(self, now: int, items: list[tuple[int, int, int]]) -> int:
        """items: (extend tokens, prefix tokens, loaded pages) a request, in batch order."""
        cost = self.cost
        link = max(now, self.h2d_free)
        for _, _, pages in items:
            if pages:
                link += cost.copy_ns(pages * self.page_bytes, pages, to_device=True)
        self.h2d_free = link
        compute = cost.prefill_ns(sum(cost.prefill_flops(t, p) for t, p, _ in items))
        blocking, self.blocking = self.blocking, 0
        return cost.overlapped_ns(link - now, compute) + blocking

    def decode(self, context_tokens: int) -> int:
        return 0 if self.zero_decode else self.cost.decode_step_ns(context_tokens)


def run_workload(spec: dict) -> dict:
    """Replay spec["requests"] through SGLang's Scheduler on the virtual clock. Returns the steps
    (kind, members with extend / prefix / loaded tokens, evicted tokens) and each request's split,
    first-token and finish times."""
    SWITCHES.clear()
    SWITCHES.update(spec.get("switches", ()))
    _set_env(SWITCHES, spec["core"])
    spec["_storage_args"], folder = storage.server_args(spec)
    spec["_storage_folder"] = folder
    try:
        return _run_workload(spec)
    finally:
        storage.cleanup(folder)


def _run_workload(spec: dict) -> dict:
    sch = build(spec)
    worker = sch.tp_worker
    pricer = Pricer(spec)
    block = spec["block_size"]
    reqs = spec["requests"]
    by_id = {r["id"]: r for r in reqs}
    seq = {r["id"]: i for i, r in enumerate(reqs)}  # trace order: the engine's TraceRequest.seq
    closed = bool(spec.get("closed_loop"))
    # closed loop: a session's next turn arrives at its predecessor's finish + think time
    nxt: dict[str, str] = {}
    prev_of: dict[str, str] = {}
    last_in_session: dict[str, str] = {}
    if closed:
        for r in reqs:
            s = r.get("session")
            if s is not None:
                if s in last_in_session:
                    nxt[last_in_session[s]] = r["id"]
                    prev_of[r["id"]] = last_in_session[s]
                last_in_session[s] = r["id"]
    arrival = {r["id"]: r["arrival_ns"] for r in reqs if r["id"] not in prev_of}
    pending = [r["id"] for r in reqs if r["id"] in arrival]  # trace order (arrivals are sorted)
    out: dict[str, dict] = {}
    steps: list[dict] = []
    live: dict[str, object] = {}
    clock = 0
    idle_passes = 0
    tree = sch.tree_cache
    _hook_load_backs(tree)
    evicted = {"device": 0, "host": 0}
    _hook_evictions(tree, evicted)
    evicted["stash"] = None  # device, host tokens and log entries evicted up to this pass's chunk stash's end
    sch._harness_evicted = evicted
    phase = {"now": 0}
    _hook_copies(tree, pricer, phase)
    drain = "drain_decode" in SWITCHES
    pi = 0
    # a bound no replay reaches: every output token a decode step, every request many chunks
    max_passes = 4 * (sum(r["output_len"] for r in reqs) + sum(r["input_len"] for r in reqs) // 64 + 1000)
    passes = 0
    while True:
        passes += 1
        if passes > max_passes:
            raise RuntimeError(f"no end after {max_passes} scheduling passes: {len(sch.waiting_queue)} waiting, "
                               f"{sch.running_batch.batch_size()} running")
        # arrivals due (the engine: ArrivalSource.due before the batch)
        due = []
        while pi < len(pending) and arrival[pending[pi]] <= clock:
            due.append(pending[pi])
            pi += 1
        for rid in due:
            r = by_id[rid]
            sch.handle_generate_request(_make(r, block))
            out[rid] = {"arrival_ns": arrival[rid], "first_token_ns": None, "finish_ns": None}
        for req in sch.waiting_queue:
            live[req.rid] = req
        # the storage threads ran while the last batch ran: quiescent before the pass
        storage.pump(tree, clock)
        mark = [evicted["device"], evicted["host"]]  # cumulative at this pass's start
        log_at = len(evicted["log"])
        phase["now"] = clock
        hidden = None
        if drain and _decodable(sch):
            # decode first, at no cost: the running requests finish before the next prefill (a
            # continuing chunk's included), as main's engine finishes them at its first token
            hidden = sch.get_new_batch_prefill
            sch.get_new_batch_prefill = lambda running_batch: S.NextBatchPlan(batch_to_run=None,
                                                                              running_batch=running_batch)
        evicted["stash"] = None
        plan = sch.get_next_batch_to_run(running_batch=sch.running_batch, last_batch=sch.last_batch)
        # the chunk stashed at this pass's start, and what the pass ran before it, end the
        # previous batch (_stash_chunked_request: the counters at the stash's end)
        if evicted["stash"] is not None:
            mark = evicted["stash"][:2]
            log_at = evicted["stash"][2]
        if hidden is not None:
            del sch.get_new_batch_prefill
        sch.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch is None:
            sch.last_batch = None
            if not sch.running_batch.is_empty():
                raise RuntimeError("a running batch but no batch to run")
            if not sch.waiting_queue and sch.chunked_req is None:
                # the event loop's `on_idle`: fully idle (`is_fully_idle`), it resets the ratio
                # (its other work is housekeeping); requests waiting, it returns before that
                sch.new_token_ratio_tracker.reset()
            if hidden is not None:
                continue  # nothing left to decode: the prefill pass runs now
            # The next pass is at the next thing to happen: an arrival, or a copy's end (a node it
            # locks frees), one pass an instant as the engine's loop runs them. SGLang's event loop
            # spins meanwhile, as many passes as wall-clock time allows, each counting toward the
            # waiting-prefix refresh (every 32nd: SchedulePolicy._touch_waiting_prefixes); a
            # number no virtual clock reproduces (docs/engine.md, not modelled). Extra passes here
            # at the same instant changed nothing but that count (conversation[:400] x1 step 182:
            # four of them moved the refresh to another pass, and a node split with it).
            ctrl = getattr(tree, "cache_controller", None)
            later = [a.finish_event.ready_at for a in (ctrl.ack_write_queue if ctrl is not None else ())
                     if isinstance(a.finish_event, _TimedEvent) and a.finish_event.ready_at > clock]
            if pi < len(pending):
                later.append(arrival[pending[pi]])
            wake = storage.wake_ns(tree, clock)  # storage on the clock: its next delivery's pass
            if wake is not None:
                later.append(wake)
            elif storage.held():
                later.append(clock)  # a request waits on storage: the event loop's next pass
            if later and (pi < len(pending) or sch.waiting_queue or sch.chunked_req is not None):
                clock = max(clock, min(later))
                idle_passes = 0
                continue
            if sch.waiting_queue or sch.chunked_req is not None:
                # nothing later: a copy acknowledged at the next pass (check_hicache_events) may
                # still free what the head waits for; one more pass now before giving up
                idle_passes += 1
                if idle_passes <= 1:
                    continue
                raise RuntimeError(f"no progress: {len(sch.waiting_queue)} waiting, nothing running, "
                                   f"{sch.token_to_kv_pool_allocator.available_size()} tokens free")
            break
        idle_passes = 0
        mode = batch.forward_mode
        step = {"t": clock, "evicted_before": mark, "state": _state(sch, tree), "log_at": log_at}
        if mode.is_extend() or mode.is_mixed():
            n_new = len(batch.reqs) - (batch.decoding_reqs and len(batch.decoding_reqs) or 0) if mode.is_mixed() \
                else len(batch.reqs)
            members, items = [], []
            for i, req in enumerate(batch.reqs[:n_new]):
                ext, pre = int(batch.extend_lens[i]), int(batch.prefix_lens[i])
                loaded = 0
                # the first chunk since its admission (a retracted request's again:
                # Req.reset_for_retract counts retraction_count up) loaded what it matched on host
                fresh = 0
                if pre == req.prefix_len and getattr(req, "_harness_counted", None) != req.retraction_count:
                    loaded = req.host_loaded_length
                    req._harness_counted = req.retraction_count
                    # priced: what this admission's init_load_back loaded (a retracted request
                    # matched on device again keeps its first admission's host_loaded_length,
                    # as the engine's record keeps its first load: reported, not loaded again)
                    fresh, req._harness_fresh_load = getattr(req, "_harness_fresh_load", 0), 0
                items.append((ext, pre, fresh // pricer.ps))
                members.append([req.rid, ext, pre, loaded])
            step.update(kind="mixed" if mode.is_mixed() else "prefill", members=members,
                        decoding=len(batch.reqs) - n_new)
            dur = pricer.prefill(clock, items)
            if mode.is_mixed():
                dur += pricer.decode(sum(len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs[n_new:]))
        else:
            ctx = sum(len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs)
            step.update(kind="decode", members=[r.rid for r in batch.reqs])
            dur = pricer.decode(ctx) + pricer.blocking
            pricer.blocking = 0
        had_output = {r.rid: len(r.output_ids) for r in batch.reqs}
        end = clock + dur
        phase["now"] = end
        result = sch.run_batch(batch)
        sch.process_batch_result(batch, result)
        sch.last_batch = batch
        step["end"] = end
        for req in batch.reqs:
            o = out[req.rid]
            if o["first_token_ns"] is None and len(req.output_ids) > had_output[req.rid] and \
                    (req.rid != getattr(sch.chunked_req, "rid", None)):
                o["first_token_ns"] = end
                o.update(device=req.cached_tokens_device, host=req.cached_tokens_host,
                         storage=req.cached_tokens_storage)
            if req.finished() and o["finish_ns"] is None:
                o["finish_ns"] = end
                o["retracted"] = bool(getattr(req, "is_retracted", False))
                follow = nxt.get(req.rid)
                if follow is not None:
                    arrival[follow] = end + (by_id[follow].get("think_ns") or 0)
                    _insert_pending(pending, pi, follow, arrival, seq)
        steps.append(step)
        clock = end
    for rid, o in out.items():
        r = by_id[rid]
        if o.get("device") is not None:
            o["computed"] = r["input_len"] - o["device"] - o["host"] - o["storage"]
    steps.append({"t": clock, "kind": "end", "members": [],
                  "evicted_before": [evicted["device"], evicted["host"]]})
    return {"steps": steps, "requests": out, "missing": sorted(MISSING), "evictions": evicted["log"],
            "core": type(tree.tree_core).__name__, "storage": storage.stats(tree, spec.get("_storage_folder")),
            "max_running": sch.max_running_requests}


def _state(sch, tree) -> dict:
    """The memory state once a batch is formed (its allocation done), for the first diverging
    step's printout: free, evictable and locked device tokens, backups in flight (a write-through
    node stays locked until its copy is acknowledged), free host tokens."""
    ctrl = getattr(tree, "cache_controller", None)
    return {"free": int(sch.token_to_kv_pool_allocator.available_size()), "evictable": int(tree.evictable_size()),
            "locked": int(tree.protected_size()), "backups": len(getattr(tree, "ongoing_write_through", ()) or ()),
            "host_free": None if ctrl is None else int(ctrl.mem_pool_host.available_size()),
            "waiting": len(sch.waiting_queue), "running": sch.running_batch.batch_size(),
            # the waiting-prefix refresh's pass counter (SchedulePolicy._touch_waiting_prefixes)
            "refresh_calls": sch.policy._waiting_prefix_refresh_calls}


def _insert_pending(pending: list, pi: int, rid: str, arrival: dict, seq: dict) -> None:
    """A released turn joins the arrivals not yet handed in, in arrival order; ties in trace
    order, as the engine's closed-loop source hands them (`ArrivalSource`: a heap of (arrival,
    seq)). Two turns released by finishes in one step arrive at the same instant, whose order
    SGLang does not decide (the clients do); handing them as released (batch order) made the
    two sides' FCFS queues differ on agent sessions (seed 5: a5-1-3 and a5-2-2)."""
    key = (arrival[rid], seq[rid])
    j = len(pending)
    while j > pi and (arrival[pending[j - 1]], seq[pending[j - 1]]) > key:
        j -= 1
    pending.insert(j, rid)


def _decodable(sch) -> bool:
    """Whether a request has its first token and no finish yet (running, or in the last prefill
    batch, which get_next_batch_to_run merges into the running batch)."""
    if not sch.running_batch.is_empty():
        return True
    last = sch.last_batch
    return last is not None and last.forward_mode.is_extend() and any(
        not r.finished() and r is not sch.chunked_req for r in last.reqs)


class _TimedEvent:
    """A device->host copy's completion on the virtual clock: done once the clock reaches the
    copy's modelled end (the engine keeps a backed-up node locked until then: CacheController.backup);
    waiting for it (a write_back eviction's synchronize) makes the step wait, as the engine's
    _write_back blocks the batch."""

    def __init__(self, ready_at: int, pricer: "Pricer", phase: dict):
        self.ready_at, self.pricer, self.phase = ready_at, pricer, phase

    def query(self) -> bool:
        return self.phase["now"] >= self.ready_at

    def synchronize(self) -> None:
        self.pricer.blocking = max(self.pricer.blocking, self.ready_at - self.phase["now"])

    def record(self, *a, **k):
        pass

    def wait(self, *a, **k):
        pass


def _hook_copies(tree, pricer: Pricer, phase: dict) -> None:
    """Price every device->host copy the controller submits (`start_writing`: the queued nodes,
    each a copy, as the engine's flush_backups) on one link from the phase's time, and make the
    merged copy's one acknowledgement wait for its end on the virtual clock."""
    ctrl = getattr(tree, "cache_controller", None)
    if ctrl is None:
        return
    start_writing = ctrl.start_writing

    def timed_start_writing(*a, **k):
        # the copy starts when the queue is submitted (0.5.23 queues a backup with flush=False:
        # flush_pending_backups at the batch's end, or writing_check), node after node
        for op in ctrl.write_queue:
            pricer.device_to_host(len(op.device_indices), phase["now"])
        n = len(ctrl.ack_write_queue)
        res = start_writing(*a, **k)
        q = ctrl.ack_write_queue
        for i in range(n, len(q)):  # HiCacheAck is a NamedTuple
            q[i] = q[i]._replace(finish_event=_TimedEvent(pricer.d2h_free, pricer, phase))
        return res

    ctrl.start_writing = timed_start_writing


def _hook_evictions(tree, counter: dict) -> None:
    """Count the tokens evictions take off the device (the tree cache's `_evict`, every device
    eviction: demote or drop) and off the host (`evict_host`), wrapped on this instance."""
    evict, evict_host = tree._evict, tree.evict_host

    log = counter.setdefault("log", [])

    def device(params, *a, **k):
        res = evict(params, *a, **k)
        counter["device"] += res.num_tokens_evicted
        log.append(("device", params.num_tokens, res.num_tokens_evicted))
        return res

    def host(num_tokens, *a, **k):
        n = evict_host(num_tokens, *a, **k)
        counter["host"] += n
        log.append(("host", num_tokens, n))
        return n

    tree._evict, tree.evict_host = device, host
    if os.environ.get("TIERDIAG_HARNESS_NODES") == "1":
        # for a diverging step's story: each device node the eviction walk took, in order
        acc = tree._accumulate_tracker

        def accumulate(tracker, delta):
            n = sum(v for k, v in delta.items() if getattr(k, "name", str(k)) == "FULL")
            if n:
                log.append(("  node", n))
            return acc(tracker, delta)

        tree._accumulate_tracker = accumulate
        apply = tree._apply_eviction_result

        def applied(result):
            # the host copies an eviction step frees (a host leaf, or a duplicate beside its device copy)
            sizes = [len(t) for frees in (result.host_frees or {}).values() for t in frees]
            if sizes:
                log.append(("  host node", sizes))
            return apply(result)

        tree._apply_eviction_result = applied
