"""The data plane's geometry: how wide the pools' real buffers are, and how they relate to the
modelled ones (`DataPlane`), and the plan that fits both pools into a memory budget.

A KV pool buffer is `[num_layers, num_pages, page_elems]` int64, layer-major like SGLang's
layer_first host layout, so one layer's page is one contiguous row and a layer can be
loaded back on its own. The device pool lives on CUDA when there is one; the host pool is
pinned CPU memory then (plain CPU memory otherwise).

Layout (`DataPlane.layout`): on CUDA both pools are layer-first, as SGLang's device pool is (a
layer loads back on its own event). A CPU replay's pools are page-first (SGLang's `page_first`
host layout: a `[P, L, E]` buffer, seen as `[L, P, E]` through a transpose), so a page's layers
are one contiguous block: a copy of n pages moves n blocks instead of n x L rows scattered over
the pool (measured ~1.5-2x faster at 80-200 scattered pages), and a layer's page is still one
contiguous row. Content and verification are the same function of the page key either way
(content.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tierdiag.native import cplane


@dataclass(frozen=True)
class DataPlane:
    """The real buffers' geometry, and how it relates to the modelled one."""
    num_layers: int
    page_elems: int  # int64 elements per page per layer
    device: str
    pinned_host: bool
    modelled_page_bytes: int
    layout: str = "layer_first"  # layer_first: [L, P, E] buffers; page_first: [P, L, E] (CPU pools only)

    def __post_init__(self) -> None:
        if self.layout not in ("layer_first", "page_first"):
            raise ValueError(f"data plane layout {self.layout!r}: layer_first or page_first")
        if self.layout == "page_first" and (self.device != "cpu" or self.pinned_host):
            raise ValueError("the page_first data plane is for CPU pools (a CUDA one is layer_first)")

    @property
    def page_bytes(self) -> int:
        return self.num_layers * self.page_elems * 8

    @property
    def reduced(self) -> bool:
        return self.page_bytes < self.modelled_page_bytes

    def to_json(self) -> dict:
        return {
            "num_layers": self.num_layers, "page_elems": self.page_elems, "device": self.device,
            "pinned_host": self.pinned_host, "page_bytes": self.page_bytes,
            "modelled_page_bytes": self.modelled_page_bytes, "reduced_width": self.reduced,
            "scale": self.page_bytes / self.modelled_page_bytes, "layout": self.layout,
            # What moved, wrote and checked the CPU pools' bytes: the compiled kernel or numpy
            # (cplane.py; the same bytes either way, the time differs).
            "cpu_kernel": cplane.CPU_KERNEL,
        }


# Widest row the engine's pools get (one layer of one page): 64 B. Every computed page is
# written and every write-through backup copied for real, so row width is replay time: at
# 256 B rows (1 KiB pages) those copies were ~40 % of a CPU replay of the conversation trace,
# at 64 B ~2.7x cheaper (benchmarks/README.md), and a slot mix-up shows at any width.
MAX_ROW_BYTES = 64


def plan_data_plane(*, model_layers: int, modelled_page_bytes: int, total_pages: int,
                    budget_bytes: int, device: str, pinned_host: bool) -> DataPlane:
    """Fit both pools into `budget_bytes`: up to 4 layers of rows as wide as the modelled page
    (a power of two of int64s) up to MAX_ROW_BYTES; then drop layers, then narrow down to one
    int64 a page (the config refuses pools that would not fit even then)."""
    layers = min(model_layers, 4)
    full_elems = max(1, min(modelled_page_bytes // (model_layers * 8), MAX_ROW_BYTES // 8))
    elems = 1 << (full_elems.bit_length() - 1)  # power of two <= full row

    def size() -> int:
        return layers * elems * 8 * total_pages

    while elems > 8 and size() > budget_bytes:
        elems //= 2
    while layers > 1 and size() > budget_bytes:
        layers -= 1
    while elems > 1 and size() > budget_bytes:
        elems //= 2
    layout = "page_first" if device == "cpu" and not pinned_host else "layer_first"
    return DataPlane(layers, elems, device, pinned_host, modelled_page_bytes, layout)
