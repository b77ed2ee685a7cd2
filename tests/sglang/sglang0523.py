"""SGLang 0.5.23's own UnifiedRadixCache on its Python tree core, with its HybridCacheController
and host pool, driven request by request (worker side; imported by worker.py after
sglang_imports.install, which sets SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python).

Only the byte-moving layer is replaced: the controller's and the L2 transfer engine's device
module complete every copy synchronously, the host pool's copies are no-ops on CPU tensors
(nothing reads the bytes) and its buffer is a plain CPU tensor. Matching
(`UnifiedTreeCore._match_prefix_helper`, `_match_post_processor`), insertion and splits
(`begin_insert` .. `_insert_tail_step`, `_split_node`), hit counts and write-through
(`_finish_insert_walk_node`, `_should_backup_after_insert`), load-back
(`UnifiedRadixCache.init_load_back`, `_load_back_transfers`), locks, and both tiers' eviction
(`evict_for_alloc`, `_evict_components`, `drive_host_eviction`) are SGLang's code. Access
times are 0.5.23's own logical counter (`components.base.get_and_increase_time_counter`),
reset for every scenario.

`compat` names switch off, one by one, the rules in which 0.5.23 differs from the engine
(which follows 0.5.9), by making SGLang behave as the engine does (RULES_0523 below; each is a
rule the 0.5.23 rule set implements, docs/engine.md "What 0.5.23 changes, measured").
"""

from __future__ import annotations

import types
from array import array

import torch

from sglang.srt.managers import cache_controller as cc
from sglang.srt.mem_cache import l2_transfer
from sglang.srt.mem_cache import unified_radix_cache as urc
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import (EvictParams, InitLoadBackParams, InsertParams,
                                                     MatchPrefixParams)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import evict_from_tree_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host import common as host_common
from sglang.srt.mem_cache.pool_host import mha as host_mha
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache import unified_tree_core as utc
from sglang.srt.mem_cache.unified_cache.components import base as comp_base
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

import sglang_imports

FULL = ComponentType.FULL
COMPAT: set[str] = set()

# --- the stand-ins -----------------------------------------------------------------------
_sync = sglang_imports.sync_device_module()
cc.device_module = _sync
l2_transfer.device_module = _sync
host_common.ALLOC_MEMORY_FUNCS["cpu"] = (lambda dims, dtype, device, pin_memory, allocator, **kw:
                                         torch.empty(dims, dtype=dtype, device="cpu"))
for _cls in (host_mha.MHATokenToKVPoolHost,):
    _cls.backup_from_device_all_layer_physical = lambda self, *a, **k: None
    _cls.load_to_device_per_layer_physical = lambda self, *a, **k: None
urc.UnifiedRadixCache.shutdown = lambda self: None


# --- the compat switches -------------------------------------------------------------------
_TOUCHED: dict = {}  # node id -> its last_access_time before this walk touched it
_orig_touch, _orig_split = utc.UnifiedTreeCore._touch_node, utc.UnifiedTreeCore._split_node
_orig_unevict, _orig_hit = utc.UnifiedTreeCore._unevict_node_on_insert, utc.UnifiedTreeCore._inc_hit_count_and_check
_RESTORED: set = set()


def _touch_node(self, node):
    _TOUCHED.setdefault(node.id, node.last_access_time)
    return _orig_touch(self, node)


def _split_node(self, key, child, split_len):
    before = _TOUCHED.get(child.id, child.last_access_time)
    upper, action = _orig_split(self, key, child, split_len)
    if "split_access" in COMPAT:  # engine: the lower half keeps its access time
        child.last_access_time = before
    return upper, action


def _unevict_node_on_insert(self, node, *a, **k):
    _RESTORED.add(node.id)
    return _orig_unevict(self, node, *a, **k)


def _inc_hit_count_and_check(self, node):
    if "unevict_hit" in COMPAT and node.id in _RESTORED:  # engine: a restored node counts no hit
        return False
    return _orig_hit(self, node)


_orig_reclaim = utc.UnifiedTreeCore._reclaim_full_host_duplicates


def _reclaim_full_host_duplicates(self, *a, **k):
    if "host_duplicates" in COMPAT:  # engine: host pressure deletes host leaves only
        return None
    return _orig_reclaim(self, *a, **k)


def _walk(fn):
    def wrapper(self, *a, **k):
        _TOUCHED.clear()
        _RESTORED.clear()
        return fn(self, *a, **k)
    return wrapper


utc.UnifiedTreeCore._reclaim_full_host_duplicates = _reclaim_full_host_duplicates
utc.UnifiedTreeCore._touch_node = _touch_node
utc.UnifiedTreeCore._split_node = _split_node
utc.UnifiedTreeCore._unevict_node_on_insert = _unevict_node_on_insert
utc.UnifiedTreeCore._inc_hit_count_and_check = _inc_hit_count_and_check
utc.UnifiedTreeCore.match_prefix = _walk(utc.UnifiedTreeCore.match_prefix)
utc.UnifiedTreeCore.begin_insert = _walk(utc.UnifiedTreeCore.begin_insert)


def _reset_clock() -> None:
    comp_base._LAST_ACCESS_TIME_COUNTER_FLOAT = 0.0  # one logical clock per scenario


# --- one cache -----------------------------------------------------------------------------
class Cache:
    def __init__(self, sc: dict):
        ps, dev, host = sc["page_size"], sc["device_pages"], sc["host_pages"]
        self.ps = ps
        # HostKVCache sizes the pool int(device * ratio) // page + 1 pages: ask for host - 1
        args = ServerArgs(model_path="dummy", page_size=ps, hicache_io_backend="kernel",
                          hicache_mem_layout="layer_first", hicache_write_policy=sc["write_policy"],
                          hicache_ratio=((host - 1) * ps + 0.5) / (dev * ps))
        set_global_server_args_for_scheduler(args)
        kv = MHATokenToKVPool(size=dev * ps, page_size=ps, dtype=torch.float16, head_num=1, head_dim=1,
                              layer_num=1, device="cpu", enable_memory_saver=False)
        self.alloc = PagedTokenToKVPoolAllocator(dev * ps, ps, torch.int64, "cpu", kv, False)
        params = CacheInitParams(req_to_token_pool=None, token_to_kv_pool_allocator=self.alloc, page_size=ps,
                                 disable=False, tree_components=(FULL,), eviction_policy=sc["eviction_policy"])
        self.cache = urc.UnifiedRadixCache(params=params)
        assert isinstance(self.cache.tree_core, utc.UnifiedTreeCore), "the Python tree core"
        self.cache.init_hicache(args, params)
        self.core = self.cache.tree_core
        assert self.cache.cache_controller.mem_pool_host.size == host * ps, "host pool size"
        self.held: dict = {}
        self.log: list = []
        self._hook_evictions()

    def _hook_evictions(self) -> None:
        core, ps, log = self.core, self.ps, self.log_append
        orig_drop, orig_demote, orig_host, orig_copy = (core._delete_unbacked_device_leaf, core._demote,
                                                        core._evict_host_leaf, core._release_full_host_duplicate)

        def drop(node, *a, **k):
            log(["device", "drop", self.key(node), len(node.key) // ps])
            return orig_drop(node, *a, **k)

        def demote(node, *a, **k):
            log(["device", "demote", self.key(node), len(node.key) // ps])
            return orig_demote(node, *a, **k)

        def host_evicted(node, *a, **k):
            log(["host", "delete", self.key(node), len(node.key) // ps])
            return orig_host(node, *a, **k)

        def host_copy_freed(node, *a, **k):  # its device copy stays (write_back host pressure)
            log(["host", "free_duplicate", self.key(node), len(node.key) // ps])
            return orig_copy(node, *a, **k)

        core._delete_unbacked_device_leaf, core._demote, core._evict_host_leaf = drop, demote, host_evicted
        core._release_full_host_duplicate = host_copy_freed

    def log_append(self, entry: list) -> None:
        self.log.append(entry)

    def key(self, node) -> int:
        return int(node.key.token_ids[0])

    def nodes(self):
        stack = list(self.core.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def tokens(self, pages: list[int]) -> RadixKey:
        return RadixKey(array("q", [k for k in pages for _ in range(self.ps)]), None)

    def request(self, op: dict) -> dict:
        """PrefillAdder.add_one_req's cache calls (match; device path locked; the best-match
        node host-locked and locked while init_load_back runs), then the allocation of
        alloc_paged_token_slots_extend and checkpoint_into_tree's insert and lock move."""
        cache, ps = self.cache, self.ps
        key = self.tokens(op["pages"])
        m = cache.match_prefix(MatchPrefixParams(key=key))
        dev_len, host_hit = m.device_prefix_len, m.host_hit_length
        out = {"device": dev_len // ps, "host_hit": host_hit // ps, "loaded": 0, "admitted": False}
        last = m.last_device_node
        lock = cache.lock(last)  # _lock_node(req.last_node)
        need = len(key) - dev_len
        if need > self.alloc.available_size() + cache.evictable_size():
            cache.unlock(lock)
            return out
        node, loaded = last, 0
        if host_hit > 0:  # req.needs_host_load_back()
            host_lock = cache.inc_host_lock_ref(m.best_match_node).to_dec_params()
            anchor = cache.lock(m.best_match_node)
            req = types.SimpleNamespace(last_node=last, swa_host_hit_length=0, mamba_host_hit_length=0, rid=op["id"],
                                        kv=types.SimpleNamespace(mamba_pool_idx=None))
            loaded, node = cache.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node,
                                                                   host_hit_length=host_hit, req=req))
            cache.unlock(anchor)
            cache.dec_host_lock_ref(m.best_match_node, host_lock)
            assert loaded in (0, host_hit), f"a partial load-back: {loaded} of {host_hit}"
            out["loaded"] = loaded // ps
        cache.ready_to_load_host_cache()
        new_lock = cache.lock(node)  # the request's lock moves to the loaded node
        cache.unlock(lock)
        lock = new_lock
        protected = dev_len + loaded
        rest = len(key) - protected
        # alloc_paged_token_slots_extend: the extend plus a page a request (engine: the extend)
        evict_from_tree_cache(cache, rest if "alloc_page" in COMPAT else rest + ps)
        new = self.alloc.alloc(rest)
        assert new is not None, "admitted, but the allocation failed"
        values = torch.cat([cache.path_device_indices(node), new])
        assert len(values) == len(key), "the protected prefix is the node's path"
        # checkpoint_into_tree once a prefill chunk (op "chunk": pages a chunk past the protected
        # prefix; none: one insert of the whole): prev_prefix_len = req.kv.cache_protected_len,
        # inserted_len = req.kv.cache_inserted_len, both the last insert's end after it.
        inserted, prev = 0, protected
        for end in chunk_ends(protected // ps, len(op["pages"]), op.get("chunk")):
            res = cache.insert(InsertParams(key=key[:end * ps], value=values[:end * ps], prev_prefix_len=prev,
                                            inserted_len=inserted, priority=op.get("priority", 0)))
            held = cache.lock(res.last_device_node)  # checkpoint_into_tree: lock the insert's node
            cache.unlock(lock)
            lock = held
            inserted = prev = end * ps
        if op.get("finish"):  # cache_finished_req's checkpoint of the same pages: nothing new
            path = cache.path_device_indices(res.last_device_node)
            res = cache.insert(InsertParams(key=key, value=path, prev_prefix_len=len(key), inserted_len=inserted,
                                            priority=op.get("priority", 0)))
            held = cache.lock(res.last_device_node)
            cache.unlock(lock)
            lock = held
        out.update(admitted=True, protected_len=protected // ps)
        if op.get("hold"):
            self.held[op["id"]] = held
        else:
            cache.unlock(held)
        return out

    def release(self, op: dict) -> dict:
        lock = self.held.pop(op["id"], None)  # None: the request was never admitted
        if lock is not None:
            self.cache.unlock(lock)
        return {}

    def state(self) -> dict:
        ps = self.ps
        pages = {}
        for node in self.nodes():
            cd = node.component_data[FULL]
            tiers = ("D" if cd.value is not None else "") + ("H" if cd.host_value is not None else "")
            for i in range(0, len(node.key), ps):
                pages[int(node.key.token_ids[i])] = [tiers, cd.lock_ref, node.hit_count]
        return {"pages": pages, "evictable": self.core.full_evictable_size() // ps,
                "protected": self.core.full_protected_size() // ps,
                "device_free": self.alloc.available_size() // ps,
                "host_free": self.cache.cache_controller.mem_pool_host.available_size() // ps}


def chunk_ends(protected: int, total: int, chunk: int | None) -> list[int]:
    """Where a request's inserts end, in pages: every `chunk` pages past the protected prefix,
    then the whole (one insert of the whole without `chunk`); tests/sglang/differential.py
    cuts the engine's the same way."""
    if not chunk:
        return [total]
    return list(range(protected + chunk, total, chunk)) + [total]


def run_scenario(sc: dict) -> list:
    COMPAT.clear()
    COMPAT.update(sc.get("compat", ()))
    _reset_clock()
    cache = Cache(sc)
    steps = []
    for op in sc["ops"]:
        cache.log = []
        try:
            out = cache.request(op) if op["op"] == "req" else cache.release(op)
            cache.cache.check_hicache_events()  # the scheduler's poll: submit backups, reap acks
        except Exception as exc:
            exc.steps = steps
            raise
        out.update(cache.state(), evictions=cache.log)
        steps.append(out)
    return steps
