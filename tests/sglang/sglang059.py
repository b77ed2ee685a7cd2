"""SGLang 0.5.9's own HiRadixCache, HiCacheController and host pool, driven request by request
(worker side; imported by worker.py after sglang_imports.install).

Only the byte-moving layer is replaced: the controller's device module completes every copy
synchronously, the host pool's copies are no-ops on CPU tensors (nothing reads the bytes), the
free-host-memory guard reads a fixed large number. Matching, insertion, splits, hit counts,
write-through, load-back, locks and both tiers' eviction are SGLang's code.

`compat` names switch off, one by one, the five known differences of the engine from 0.5.9
(docs/engine.md), by making SGLang behave as the engine does; the xfail tests run without
them, the others with all of them, so that they see every other difference.
"""

from __future__ import annotations

import types

import torch

import sglang_imports
from sglang.srt.managers import cache_controller as cc
from sglang.srt.mem_cache import hiradix_cache as hr
from sglang.srt.mem_cache import memory_pool_host as mph
from sglang.srt.mem_cache import radix_cache as rc
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import evict_from_tree_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

CLOCK = sglang_imports.Clock()
COMPAT: set[str] = set()
KNOWN = ("split_access", "split_creation", "insert_priority", "evict_amount", "mru_ties")

# --- the stand-ins -----------------------------------------------------------------------
_time = types.SimpleNamespace(monotonic=lambda: CLOCK.monotonic(), perf_counter=lambda: 0.0,
                              time=lambda: 0.0, sleep=lambda s: None)
hr.time = _time
rc.time = _time
cc.device_module = sglang_imports.sync_device_module()
mph.psutil = types.SimpleNamespace(virtual_memory=lambda: types.SimpleNamespace(available=1 << 50))
mph.MHATokenToKVPoolHost.backup_from_device_all_layer = lambda self, *a, **k: None
mph.MHATokenToKVPoolHost.load_to_device_per_layer = lambda self, *a, **k: None
cc.HiCacheController.move_indices = lambda self, op: (op.host_indices, op.device_indices)
hr.HiRadixCache.shutdown = lambda self: None
# the host buffer: a plain CPU tensor (no cudaHostRegister)
mph.ALLOC_MEMORY_FUNCS = {**mph.ALLOC_MEMORY_FUNCS, "cpu": lambda dims, dtype, device, pin_memory, allocator:
                          torch.empty(dims, dtype=dtype, device="cpu")}


def _lt(self, other):
    # SGLang orders equal-priority heap entries by last_access_time only; an exact tie would
    # fall to set iteration order (nodes hash by id). Break it by node id, as the engine does.
    return (self.last_access_time, self.id) < (other.last_access_time, other.id)


rc.TreeNode.__lt__ = _lt

# --- the compat switches -------------------------------------------------------------------
_LAST_SET: dict = {}
_TRACKED = ("last_access_time", "priority")


def _setattr(self, name, value):
    if name in _TRACKED and name in self.__dict__:
        _LAST_SET[name] = (self, self.__dict__[name])
    self.__dict__[name] = value


rc.TreeNode.__setattr__ = _setattr
_orig_split = hr.HiRadixCache._split_node


def _split_node(self, key, child, split_len):
    upper = _orig_split(self, key, child, split_len)
    if "split_access" in COMPAT and _LAST_SET.get("last_access_time", (None,))[0] is child:
        child.__dict__["last_access_time"] = _LAST_SET["last_access_time"][1]  # engine: lower half untouched
    if "split_creation" in COMPAT:
        upper.__dict__["creation_time"] = child.creation_time  # engine: the upper half keeps the node's
    if "insert_priority" in COMPAT and _LAST_SET.get("priority", (None,))[0] is child:
        child.__dict__["priority"] = _LAST_SET["priority"][1]  # engine: raised after the split
    return upper


hr.HiRadixCache._split_node = _split_node
_SHORTFALL = {"on": False}
_orig_evict, _orig_evict_host, _orig_load_back = hr.HiRadixCache.evict, hr.HiRadixCache.evict_host, hr.HiRadixCache.load_back


def _evict(self, params):
    if _SHORTFALL["on"] and "evict_amount" in COMPAT:  # engine: only what is missing
        free = self.token_to_kv_pool_allocator.available_size()
        params = EvictParams(num_tokens=max(0, params.num_tokens - free))
    return _orig_evict(self, params)


def _evict_host(self, num_tokens):
    if "evict_amount" in COMPAT:
        num_tokens = max(0, num_tokens - self.token_to_kv_pool_host.available_size())
    return _orig_evict_host(self, num_tokens)


def _load_back(self, node, mem_quota=None):
    _SHORTFALL["on"] = True
    try:
        return _orig_load_back(self, node, mem_quota)
    finally:
        _SHORTFALL["on"] = False


hr.HiRadixCache.evict = _evict
hr.HiRadixCache.evict_host = _evict_host
hr.HiRadixCache.load_back = _load_back
for _name in ("match_prefix", "insert"):
    def _clearing(fn):
        def wrapper(self, *a, **k):
            _LAST_SET.clear()
            return fn(self, *a, **k)
        return wrapper
    setattr(hr.HiRadixCache, _name, _clearing(getattr(hr.HiRadixCache, _name)))


# --- one cache -----------------------------------------------------------------------------
class Cache:
    def __init__(self, sc: dict):
        ps, dev, host = sc["page_size"], sc["device_pages"], sc["host_pages"]
        self.ps = ps
        kv = MHATokenToKVPool(dev * ps, ps, torch.float16, 1, 1, 1, "cpu", False)
        self.alloc = PagedTokenToKVPoolAllocator(dev * ps, ps, torch.int64, "cpu", kv, False)
        args = types.SimpleNamespace(
            hicache_io_backend="kernel", hicache_mem_layout="layer_first", disable_hicache_numa_detect=True,
            # HostKVCache sizes the pool int(device * ratio) // page + 1 pages: ask for host - 1
            hicache_ratio=((host - 1) * ps + 0.5) / (dev * ps), hicache_size=0,
            hicache_storage_backend=None, hicache_write_policy=sc["write_policy"], hicache_storage_prefetch_policy="best_effort",
            hicache_storage_backend_extra_config=None, served_model_name="tierdiag", extra_metric_labels=None,
            enable_metrics=False)
        params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.alloc,
                                 page_size=ps, eviction_policy=sc["eviction_policy"])
        self.cache = hr.HiRadixCache(params, args)
        assert self.cache.token_to_kv_pool_host.size == host * ps, "host pool size"
        self.held: dict = {}
        self.log: list = []
        ctrl = self.cache.cache_controller
        cache = self.cache
        orig_regular, orig_backuped, orig_host = cache._evict_regular, cache._evict_backuped, ctrl.evict_host

        def regular(node):
            self.log.append(["device", "drop", self.key(node), len(node.key) // ps])
            return orig_regular(node)

        def backuped(node):
            self.log.append(["device", "demote", self.key(node), len(node.key) // ps])
            return orig_backuped(node)

        def host_evicted(host_indices, backup_only=True):
            node = next(n for n in self.nodes() if n.host_value is host_indices)
            self.log.append(["host", "delete", self.key(node), len(node.key) // ps])
            return orig_host(host_indices, backup_only)

        cache._evict_regular, cache._evict_backuped, ctrl.evict_host = regular, backuped, host_evicted

    def key(self, node) -> int:
        return int(node.key.token_ids[0])

    def nodes(self):
        stack = list(self.cache.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def tokens(self, pages: list[int]) -> rc.RadixKey:
        return rc.RadixKey([k for k in pages for _ in range(self.ps)], None)

    def request(self, op: dict) -> dict:
        """PrefillAdder.add_one_req's cache calls, then the allocation of prepare_for_extend and the
        insert of cache_unfinished_req (held) or cache_finished_req."""
        cache, ps = self.cache, self.ps
        key = self.tokens(op["pages"])
        m = cache.match_prefix(MatchPrefixParams(key=key))
        dev_len, host_hit = len(m.device_indices), m.host_hit_length
        out = {"device": dev_len // ps, "host_hit": host_hit // ps, "loaded": 0, "admitted": False}
        last = m.last_device_node
        cache.inc_lock_ref(last)  # PrefillAdder._lock_node
        need = len(key) - dev_len
        if need > self.alloc.available_size() + cache.evictable_size():
            cache.dec_lock_ref(last)
            return out
        indices, node = m.device_indices, last
        if host_hit > 0:
            loaded, node = cache.init_load_back(m.last_host_node, host_hit)
            indices = torch.cat([indices, loaded])
            out["loaded"] = len(loaded) // ps
        cache.ready_to_load_host_cache()
        cache.inc_lock_ref(node)  # _req_inc_lock_ref
        cache.dec_lock_ref(last)  # leaving _lock_node
        protected = len(indices)
        rest = len(key) - protected
        if "evict_amount" in COMPAT:
            free = self.alloc.available_size()
            if free < rest:
                cache.evict(EvictParams(num_tokens=rest - free))
        else:
            evict_from_tree_cache(cache, rest + ps)  # alloc_paged_token_slots_extend: one page per request more
        new = self.alloc.alloc(rest)
        assert new is not None, "admitted, but the allocation failed"
        values = torch.cat([indices, new])
        res = cache.insert(InsertParams(key=key, value=values, priority=op.get("priority", 0)))
        self.alloc.free(values[protected:res.prefix_len])
        out.update(admitted=True, protected_len=protected // ps)
        if op.get("hold"):
            again = cache.match_prefix(MatchPrefixParams(key=key))  # cache_unfinished_req
            cache.dec_lock_ref(node)
            cache.inc_lock_ref(again.last_device_node)
            self.held[op["id"]] = again.last_device_node
        else:
            cache.dec_lock_ref(node)
        return out

    def release(self, op: dict) -> dict:
        self.cache.dec_lock_ref(self.held.pop(op["id"]))
        return {}

    def state(self) -> dict:
        ps, cache = self.ps, self.cache
        pages = {}
        for node in self.nodes():
            tiers = ("D" if not node.evicted else "") + ("H" if node.backuped else "")
            for i in range(0, len(node.key), ps):
                pages[int(node.key.token_ids[i])] = [tiers, node.lock_ref, node.hit_count]
        return {"pages": pages, "evictable": cache.evictable_size() // ps, "protected": cache.protected_size_ // ps,
                "device_free": self.alloc.available_size() // ps,
                "host_free": cache.token_to_kv_pool_host.available_size() // ps}


def run_scenario(sc: dict) -> list:
    COMPAT.clear()
    COMPAT.update(sc.get("compat", ()))
    CLOCK.fine = "mru_ties" not in COMPAT
    cache = Cache(sc)
    steps = []
    for t, op in enumerate(sc["ops"], start=1):
        CLOCK.set_step(t)
        cache.log = []
        try:
            out = cache.request(op) if op["op"] == "req" else cache.release(op)
            cache.cache.writing_check()
            cache.cache.loading_check()
        except Exception as exc:
            exc.steps = steps
            raise
        out.update(cache.state(), evictions=cache.log)
        steps.append(out)
    return steps
