"""page_size: load-backs fragmented (small pages, short contiguous runs) and far below the link's
peak, their exposed time a material share of TTFT; advises page_size x PAGE_SIZE_FACTOR (at most
the block size). Predicted with the engine's copy costs (`loadback_after_pages`)."""

from __future__ import annotations

from tierdiag.config.constants import RUN_OVERHEAD_NS, SEGMENT_OVERHEAD_NS
from tierdiag.diagnose.advice import targets as T
from tierdiag.diagnose.advice.base import Evidence, Rule
from tierdiag.diagnose.advice.types import Advice
from tierdiag.diagnose.request.claims import Claim
from tierdiag.units import fmt_bytes, fmt_ms, fmt_pct, ns_to_ms, share

SLOW_LINK_SHARE = 0.5
FRAGMENTED_PAGES_PER_RUN = 4
SMALL_RUN_BYTES = 1 << 20
SMALL_PAGE_BYTES = 4 << 20  # a 64-token page of an 8B model is 8 MiB
EXPOSED_SHARE_OF_TTFT = 0.05
PAGE_SIZE_FACTOR = 4


def loadback_after_pages(tr, factor: float) -> int | None:
    """The run's load-back link time with pages `factor` times larger, by the cost model's copy
    time (engine/costmodel.py copy_ns): per transfer overhead + bytes / link + layers x
    (SEGMENT_OVERHEAD_NS x pages + RUN_OVERHEAD_NS x runs). The bytes-over-link part is the
    run's busy time x its link peak share; the per-layer part is what remains beside the
    transfers' fixed overhead, split between pages and runs by their weights. Pages shrink by
    `factor`; runs stay, at most one a page. Ignores: partial pages at a prefix's end (larger
    pages match whole pages only), and measured (`--timing wall`) copies."""
    if (not tr.num_loadbacks or not tr.loadback_busy_ns or tr.link_peak_share is None or not tr.bytes_per_page
            or not tr.bytes_per_run or tr.transfer_overhead_ns is None):
        return None
    pages, runs = tr.loadback_bytes / tr.bytes_per_page, tr.loadback_bytes / tr.bytes_per_run
    wire = tr.loadback_busy_ns * min(tr.link_peak_share, 1.0)
    per_layer = max(tr.loadback_busy_ns - wire - tr.num_loadbacks * tr.transfer_overhead_ns, 0.0)
    weight = SEGMENT_OVERHEAD_NS * pages + RUN_OVERHEAD_NS * runs
    pages_after = pages / factor
    runs_after = min(runs, pages_after)
    scaled = per_layer * (SEGMENT_OVERHEAD_NS * pages_after + RUN_OVERHEAD_NS * runs_after) / weight
    return int(tr.loadback_busy_ns - per_layer + scaled)


class PageSize(Rule):
    kinds = ("page_size",)
    options = {"page_size": "page_size"}
    target = T.LOADBACK_EXPOSED_SHARE

    def trigger(self, ev: Evidence) -> list[Advice]:
        ctx = ev.ctx
        tr = ctx.transfers
        page = int(ctx.config.get("page_size") or 64)
        block = int(ctx.config.get("block_size") or page)
        if (not tr.num_loadbacks or tr.link_peak_share is None or tr.link_peak_share >= SLOW_LINK_SHARE
                or tr.loadback_exposed_ns < EXPOSED_SHARE_OF_TTFT * tr.tiered_ttft_ns):
            return []
        fragmented = ((tr.pages_per_run or 0) < FRAGMENTED_PAGES_PER_RUN or (tr.bytes_per_run or 0) < SMALL_RUN_BYTES
                      or (tr.bytes_per_page or 0) < SMALL_PAGE_BYTES)
        new = min(page * PAGE_SIZE_FACTOR, block)
        if not fragmented or new <= page:
            return []
        after = loadback_after_pages(tr, new / page)
        if after is None:
            return []  # the copies' parts are not known (an import): nothing predicted
        exposed_after = int(tr.loadback_exposed_ns * after / tr.loadback_busy_ns)
        if tr.loadback_exposed_ns - exposed_after < EXPOSED_SHARE_OF_TTFT * tr.tiered_ttft_ns:
            return []  # larger pages would save too little of the load-backs' TTFT to be worth it
        return [Advice(
            "page_size", "page_size", new, {"page_size": new},
            self.sentence(link_peak_share=tr.link_peak_share, bytes_per_page=tr.bytes_per_page,
                          pages_per_run=tr.pages_per_run, bytes_per_run=tr.bytes_per_run,
                          exposed_ns=tr.loadback_exposed_ns, tiered_ttft_ns=tr.tiered_ttft_ns).text,
            {"link_peak_share": tr.link_peak_share, "pages_per_run": tr.pages_per_run,
             "bytes_per_run": tr.bytes_per_run, "bytes_per_page": tr.bytes_per_page,
             "loadback_exposed_ms": ns_to_ms(tr.loadback_exposed_ns),
             "loadback_busy_ms": ns_to_ms(tr.loadback_busy_ns), "loadback_busy_after_ms": ns_to_ms(after)},
            prediction=self.prediction(busy_after_ns=after, busy_ns=tr.loadback_busy_ns,
                                       exposed_after_ns=exposed_after, exposed_ns=tr.loadback_exposed_ns))]

    def sentence(self, *, link_peak_share: float, bytes_per_page: float, pages_per_run: float,
                 bytes_per_run: float, exposed_ns: int, tiered_ttft_ns: int) -> Claim:
        return Claim("page_size", (
            f"load-backs ran at {fmt_pct(link_peak_share)} of link peak, {fmt_bytes(bytes_per_page)} a page and "
            f"{pages_per_run:,.1f} pages ({fmt_bytes(bytes_per_run)}) per contiguous run, and exposed load-back was "
            f"{fmt_pct(share(exposed_ns, tiered_ttft_ns))} of the TTFT of the requests that loaded back: per-page and "
            f"per-run copy overheads dominate, and larger pages mean fewer, larger copies"))

    def prediction(self, *, busy_after_ns: int, busy_ns: int, exposed_after_ns: int, exposed_ns: int) -> str:
        return (f"predicted with the engine's copy costs ({SEGMENT_OVERHEAD_NS} ns a page and {RUN_OVERHEAD_NS} ns a "
                f"contiguous run, a layer, beside the bytes over the link): load-backs take ~{fmt_ms(busy_after_ns)} "
                f"instead of {fmt_ms(busy_ns)}, exposed load-back ~{fmt_ms(exposed_after_ns)} instead "
                f"of {fmt_ms(exposed_ns)}")
