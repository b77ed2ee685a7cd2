"""The engine façade: build the tree, pools, controller and scheduler from one config, run a
trace through them, and check the invariants tests rely on."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Callable, Iterable

from tierdiag.config.names import Tier
from tierdiag.config.engine import EngineConfig
from tierdiag.engine.controller import CacheController, EngineStats
from tierdiag.engine.costmodel import CostModel
from tierdiag.engine.hardware import cuda_available
from tierdiag.engine.dataplane import DataPlane, plan_data_plane
from tierdiag.engine.deployment import Deployment
from tierdiag.engine.pagepool import PagePool
from tierdiag.engine.storage import StorageTier
from tierdiag.engine.scheduler import Scheduler
from tierdiag.engine.rules import config_rules
from tierdiag.engine.tree import RadixTree
from tierdiag.trace.reader import TraceRequest


def plan(cfg: EngineConfig) -> tuple[CostModel, DataPlane]:
    """The cost model and the real buffers' geometry a config implies (nothing allocated)."""
    cost = CostModel.from_config(cfg)
    ps = cfg.page_size
    pages = (cfg.resolved_device_tokens() + cfg.resolved_host_tokens()) // ps
    cuda = cuda_available()
    plane = plan_data_plane(
        model_layers=cost.num_layers, modelled_page_bytes=ps * cost.kv_bytes_per_token, total_pages=pages,
        budget_bytes=cfg.data_plane_mib << 20, device="cuda" if cuda else "cpu", pinned_host=cuda)
    return cost, plane


def describe_data_plane(cfg: EngineConfig) -> dict:
    cost, plane = plan(cfg)
    ps = cfg.page_size
    d = plane.to_json()
    d.update({
        "kv_bytes_per_token": cost.kv_bytes_per_token,
        "link_bytes_per_s": cost.h2d_bytes_per_s,
        "d2h_bytes_per_s": cost.d2h_bytes_per_s,
        "transfer_overhead_ns": cost.transfer_overhead_ns,
        "link_source": cost.link_source,
        "device_pages": cfg.resolved_device_tokens() // ps,
        "host_pages": cfg.resolved_host_tokens() // ps,
        "storage_pages": cfg.storage_tokens // ps,
        "verify": cfg.verify,
    })
    return d


class Rank:
    """One data-parallel rank: its pools, tree, controller and scheduler (engine/deployment.py)."""

    def __init__(self, engine: "Engine", probe, progress) -> None:
        cfg, ps = engine.cfg, engine.cfg.page_size
        self.device = PagePool(Tier.DEVICE, cfg.resolved_device_tokens() // ps, engine.plane, on_device=True)
        self.host = PagePool(Tier.HOST, cfg.resolved_host_tokens() // ps, engine.plane, on_device=False)
        self.tree = RadixTree(ps, cfg.resolved_eviction_policy(), config_rules(cfg))
        self.ctrl = CacheController(cfg, engine.cost, self.tree, self.device, self.host, engine.storage, probe,
                                    engine.stats)
        self.scheduler = Scheduler(cfg, engine.cost, self.tree, self.ctrl, probe, engine.stats, progress)


class Engine:
    """The engine: one rank (cfg.dp == 1, its scheduler's own loop), or a deployment of cfg.dp
    ranks behind a router (engine/deployment.py). `device`, `host`, `tree`, `ctrl`, `scheduler`
    are rank 0's; `ranks` has every rank's."""

    def __init__(self, cfg: EngineConfig, *, probe=None, storage_dir: str | Path | None = None,
                 progress: Callable[[int, int, EngineStats], None] | None = None):
        self.cfg = cfg
        self.cost, self.plane = plan(cfg)
        ps = cfg.page_size
        self.storage: StorageTier | None = None
        if cfg.storage_tokens:
            root = storage_dir or cfg.storage_dir
            if not root:
                # A folder nobody else knows of (an Engine built directly, as tests and library
                # users do): it goes when the engine does, or at exit.
                import shutil  # here, as tempfile: shutil loads bz2 and lzma (~5 M instructions of a start)
                import tempfile  # here: a replay names its storage folder (app/replay.py); ~1 ms of its start

                root = tempfile.mkdtemp(prefix="tierdiag-storage-")
                weakref.finalize(self, shutil.rmtree, root, True)
            self.storage = StorageTier(Path(root), cfg.storage_tokens // ps)  # one, shared by every rank
        self.stats = EngineStats()
        self.probe = probe
        self.ranks = [Rank(self, probe, progress) for _ in range(cfg.dp)]
        first = self.ranks[0]
        self.device, self.host, self.tree = first.device, first.host, first.tree
        self.ctrl, self.scheduler = first.ctrl, first.scheduler
        self.deployment = None
        if cfg.dp > 1:
            self.deployment = Deployment(cfg, [r.scheduler for r in self.ranks], self.stats)

    def run(self, requests: Iterable[TraceRequest]) -> EngineStats:
        if self.deployment is not None:
            stats = self.deployment.run(requests)
        else:
            stats = self.scheduler.run(requests)
        if self.storage is not None:
            self.storage.flush()  # the tier's page writes landed (a full disk raised here, not after the run)
        return stats

    def check_invariants(self, *, idle: bool = False) -> None:
        """Pool accounting, residency closure, lock counts, on every rank; with idle=True also
        that no lock is held (and, in a deployment, that the router counts nothing in flight)."""
        for rank in self.ranks:
            check_rank(rank.device, rank.host, rank.tree, idle=idle)
            s = rank.scheduler  # every armed storage re-query is a queued request's (_retry_prefetches)
            queued = {id(r) for r in s.waiting}
            assert all(id(req) in queued for req, _ in s.requeries.items()), \
                "a storage re-query is armed for a request not in the waiting queue"
            # a storage query in flight (prefetch.py `_queue_query`): on the list once, with its
            # entry; a waiting request with an entry is on the list
            in_flight = {id(r) for r in s.unallocated}
            assert len(in_flight) == len(s.unallocated) and all(r.query_anchor is not None for r in s.unallocated), \
                "a storage query in flight is listed twice or without its anchor"
            assert all(r.query_anchor is None or id(r) in in_flight for r in s.waiting), \
                "a waiting request's storage query is in flight but not listed"
        if idle and self.deployment is not None:
            d = self.deployment
            assert not d.in_flight, f"{len(d.in_flight)} requests routed and never reported finished"
            assert not any(d.gateway.in_flight), f"the gateway still counts {d.gateway.in_flight} in flight"


def check_rank(device: PagePool, host: PagePool, tree: RadixTree, *, idle: bool = False) -> None:
    """One rank's invariants (Engine.check_invariants)."""
    device.check()
    host.check()
    dev_slots: list[int] = []
    host_slots: list[int] = []
    locked_dev = locked_host = 0
    for node in tree.nodes():
        assert node.device is not None or node.host is not None, f"{node}: in the tree but on no tier"
        if node.device is not None:
            assert node.parent.device is not None, f"{node}: device residency not root-connected"
            dev_slots.extend(node.device)
        if node.host is not None:
            host_slots.extend(node.host)
        child_locks = sum(c.lock_ref for c in node.children.values())
        assert node.lock_ref >= child_locks, f"{node}: lock_ref below its children's"
        n_dev = sum(1 for c in node.children.values() if c.device is not None)
        assert node.n_dev_children == n_dev, f"{node}: n_dev_children {node.n_dev_children} != {n_dev}"
        if node.lock_ref:
            locked_dev += len(node.keys) if node.device is not None else 0
            locked_host += len(node.keys) if node.host is not None else 0
        if idle:
            assert node.lock_ref == 0, f"{node}: still locked after every request finished"
            assert node.host_ref == 0, f"{node}: host copy still protected after every request finished"
    assert len(set(dev_slots)) == len(dev_slots), "a device slot is owned by two tree nodes"
    assert len(set(host_slots)) == len(host_slots), "a host slot is owned by two tree nodes"
    assert tree.device_pages == len(dev_slots), "tree device page counter drifted"
    assert tree.locked_device_pages == locked_dev, "locked device page counter drifted"
    assert tree.locked_host_pages == locked_host, "locked host page counter drifted"
    if idle:
        assert len(dev_slots) == device.used_pages, \
            f"device: {device.used_pages} pages used but the tree holds {len(dev_slots)} (leak)"
        assert len(host_slots) == host.used_pages, \
            f"host: {host.used_pages} pages used but the tree holds {len(host_slots)} (leak)"
        assert tree.root.lock_ref == 1, "root lock_ref must return to its resting 1"
