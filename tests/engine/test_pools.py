"""Page pools: slot accounting (free + used == capacity, no slot owned twice, a double free
caught and the pool left as it was), the order slots come back in, and page content written and
verified byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.helpers import patches_the_engine
from tierdiag.engine.content import page_content_np, read_pages, verify_content, write_content
from tierdiag.engine.dataplane import DataPlane
from tierdiag.engine.pagepool import PagePool

PLANE = DataPlane(num_layers=2, page_elems=4, device="cpu", pinned_host=False, modelled_page_bytes=64)
LAYOUTS = ("layer_first", "page_first")  # a CPU replay's pools are page-first (dataplane.plan_data_plane)


def _pool(pages: int = 8, layout: str = "layer_first") -> PagePool:
    plane = DataPlane(num_layers=2, page_elems=4, device="cpu", pinned_host=False, modelled_page_bytes=64,
                      layout=layout)
    return PagePool("host", pages, plane, on_device=False)


def test_fresh_pool_hands_out_lowest_slots_first_and_a_freed_list_comes_back_in_order():
    pool = _pool()
    assert list(pool.alloc(3)) == [0, 1, 2]
    assert list(pool.alloc(2)) == [3, 4]
    pool.free([1, 0, 2])
    assert (pool.free_pages, pool.used_pages) == (6, 2)
    assert list(pool.alloc(3)) == [1, 0, 2]  # the last list freed, as it was freed
    assert list(pool.alloc(0)) == []
    assert pool.alloc(4) is None  # 3 free: nothing handed out
    assert pool.free_pages == 3
    pool.check()


def test_double_free_across_calls_is_caught_and_changes_nothing():
    pool = _pool()
    slots = pool.alloc(4)
    pool.free(slots[:2])
    with pytest.raises(AssertionError, match="host slot 1 freed but not owned"):
        pool.free([3, 1])
    assert (pool.free_pages, pool.used_pages) == (6, 2)
    pool.check()
    assert sorted(pool.alloc(6)) == [0, 1, 4, 5, 6, 7]  # 3 was not freed by the refused call


def test_a_slot_twice_in_one_free_is_caught():
    pool = _pool()
    pool.alloc(4)
    with pytest.raises(AssertionError, match="slot 2 freed twice in one call"):
        pool.free([2, 3, 2])
    with pytest.raises(AssertionError, match="freed twice in one call"):
        pool.free(list(range(4)) * 20)  # a long list takes the sorting check
    assert pool.used_pages == 4
    pool.check()


@pytest.mark.parametrize("slot", [-1, 8, 1 << 40])
def test_a_slot_outside_the_pool_is_refused(slot):
    pool = _pool()
    pool.alloc(2)
    with pytest.raises(AssertionError, match=f"slot {slot} freed but not owned"):
        pool.free([0, slot])
    assert pool.used_pages == 2
    pool.check()


def test_negative_alloc_is_a_bug():
    with pytest.raises(ValueError, match="alloc of -1"):
        _pool().alloc(-1)


class _SetPool:
    """The slot bookkeeping as it was (a free list and a set of owned slots): the reference."""

    def __init__(self, pages: int):
        self.free_list = list(range(pages - 1, -1, -1))
        self.used: set[int] = set()

    def alloc(self, n: int):
        if n > len(self.free_list):
            return None
        slots = self.free_list[len(self.free_list) - n:][::-1]
        del self.free_list[len(self.free_list) - n:]
        self.used.update(slots)
        return slots

    def free(self, slots) -> bool:
        if not self.used.issuperset(slots) or len(set(slots)) != len(slots):
            return False
        self.used.difference_update(slots)
        self.free_list.extend(reversed(slots))
        return True


@settings(max_examples=60, deadline=None)
@given(pages=st.integers(1, 80), data=st.data())
def test_pool_hands_out_the_same_slots_as_the_set_bookkeeping(pages, data):
    """Any sequence of allocs and frees (some of them wrong: a freed slot, a repeat, a slot of no
    pool): the same slots in the same order as the reference, the same refusals, and the
    accounting exact after every step."""
    pool, ref = _pool(pages), _SetPool(pages)
    held: list[int] = []
    for _ in range(data.draw(st.integers(1, 30))):
        if data.draw(st.booleans()):
            n = data.draw(st.integers(0, pages + 2))
            got = pool.alloc(n)
            assert (got if got is None else list(got)) == ref.alloc(n)
            held.extend(got or [])
        else:
            slots = data.draw(st.lists(st.sampled_from(held), max_size=len(held), unique=True)) if held else []
            if data.draw(st.integers(0, 4)) == 0:  # a wrong free: a repeat or a slot not held
                slots = slots + [data.draw(st.sampled_from(slots)) if slots else data.draw(st.integers(-2, pages + 2))]
            ok = ref.free(slots)
            if ok:
                pool.free(slots)
                held = [s for s in held if s not in set(slots)]
            else:
                with pytest.raises(AssertionError):
                    pool.free(slots)
        assert pool.free_pages + pool.used_pages == pool.capacity
        assert pool.used_pages == len(ref.used) == len(held)
        pool.check()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("slots", [[5, 2, 7, 0], [3, 4, 5], [6]])
def test_written_content_is_the_keys_content_in_those_slots_only(slots, layout):
    pool = _pool(layout=layout)
    keys = [1000 + 17 * i for i in range(len(slots))]
    write_content(pool, slots, keys)
    assert np.array_equal(read_pages(pool, slots).numpy(), page_content_np(keys, 2, 4))
    others = [s for s in range(8) if s not in slots]
    assert torch.count_nonzero(pool.buffer[:, others]) == 0
    assert verify_content(pool, slots, keys)
    assert verify_content(pool, slots, np.asarray(keys, dtype=np.int64))  # the scheduler passes arrays


@pytest.mark.parametrize("layout", LAYOUTS)
def test_verification_catches_one_flipped_byte_and_a_slot_mix_up(layout):
    pool = _pool(layout=layout)
    write_content(pool, [1, 2, 3], [11, 12, 13])
    assert not verify_content(pool, [1, 3, 2], [11, 12, 13])  # slots swapped
    pool.buffer.view(torch.uint8)[1, 2, 5] ^= 1  # one bit of layer 1 of page 2
    assert not verify_content(pool, [1, 2, 3], [11, 12, 13])
    assert verify_content(pool, [1, 3], [11, 13])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_content_without_the_row_view_takes_the_tensor_path(layout):
    """A pool the numpy path cannot use (CUDA's case; here forced): same bytes, same verdicts."""
    a, b = _pool(layout=layout), _pool(layout=layout)
    b.rows = None
    for pool in (a, b):
        write_content(pool, [4, 0], [7, 9])
    assert torch.equal(a.buffer, b.buffer)
    assert verify_content(b, [4, 0], [7, 9]) and not verify_content(b, [0, 4], [7, 9])


@patches_the_engine  # wraps the controller's load_back
def test_a_load_back_of_a_corrupted_host_copy_is_caught():
    """The engine end to end (test_scenarios' narrated load-back: a's pages backed up, demoted by
    a flood, loaded back for b). Flip one bit of a's host copy just before the load-back and
    its byte-for-byte check stops the replay, naming the request; untouched, it passes."""
    from tests.engine.helpers import numbered, req, small_config
    from tierdiag.engine.engine import Engine

    trace = ([req("a", 0, list(range(1, 9)))]
             + [req(f"f{i}", 100 + 100 * i, list(range(1000 + 100 * i, 1008 + 100 * i))) for i in range(3)]
             + [req("b", 1000, list(range(1, 9)) + [90])])
    for damage in (False, True):
        engine = Engine(small_config())
        load_back = engine.ctrl.load_back

        def damaged_load_back(nodes, slots, req_id, now_ns, page_keys, engine=engine, load_back=load_back):
            if damage:
                engine.host.buffer.view(torch.uint8)[0, nodes[0].host[3], 5] ^= 0x10
            return load_back(nodes, slots, req_id, now_ns, page_keys)

        engine.ctrl.load_back = damaged_load_back
        if damage:
            with pytest.raises(AssertionError, match="load-back for request b: device pages differ"):
                engine.run(numbered(trace))
        else:
            engine.run(numbered(trace))
            assert engine.stats.verified_load_backs == 1


def test_a_page_first_pool_is_its_pages_in_one_block_each_and_the_same_tensor_view():
    """Page-first: a page's layers are adjacent in memory ([P, L, E]); the pool still reads as
    [L, P, E] (numpy and torch views of the same bytes), and its content equals a layer-first
    pool's page for page."""
    pf, lf = _pool(layout="page_first"), _pool(layout="layer_first")
    for pool in (pf, lf):
        write_content(pool, [6, 1], [21, 22])
    assert pf.rows.shape == (1, 8) and pf.rows.dtype.itemsize == 2 * 4 * 8
    assert pf.array.shape == (2, 8, 4) and pf.array.transpose(1, 0, 2).flags.c_contiguous
    assert np.array_equal(pf.array, lf.array)
    assert torch.equal(pf.buffer, lf.buffer) and pf.buffer.data_ptr() == pf.array.ctypes.data
    block = pf.array.transpose(1, 0, 2)[6].reshape(-1)  # page 6: layer 0's row, then layer 1's
    assert np.array_equal(block, page_content_np([21], 2, 4)[:, 0, :].reshape(-1))


def test_the_cpu_data_plane_is_page_first_and_a_cuda_one_layer_first():
    from tierdiag.engine.dataplane import plan_data_plane

    cpu = plan_data_plane(model_layers=32, modelled_page_bytes=1 << 20, total_pages=100, budget_bytes=1 << 20,
                          device="cpu", pinned_host=False)
    cuda = plan_data_plane(model_layers=32, modelled_page_bytes=1 << 20, total_pages=100, budget_bytes=1 << 20,
                           device="cuda", pinned_host=True)
    assert (cpu.layout, cuda.layout) == ("page_first", "layer_first")
    assert cpu.to_json()["layout"] == "page_first"
    with pytest.raises(ValueError, match="page_first data plane is for CPU pools"):
        DataPlane(2, 4, "cuda", True, 64, layout="page_first")


_HUGE = 2 << 20


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 70_000), st.integers(1, 16))
def test_a_pool_array_is_zeros_of_its_shape_and_one_of_two_mib_or_more_starts_on_a_huge_page(layers, pages, elems):
    # Session 37: a CPU pool's array of 2 MiB or more is an anonymous mapping from a 2 MiB
    # boundary, its whole 2 MiB chunks madvised as huge pages (the --dp 8 pools faulted ~10 k
    # 4 KiB pages); smaller, np.zeros. Either way: int64 zeros of the shape, C order, writable,
    # every element its own (writes land where numpy's would).
    from tierdiag.engine import pagepool

    shape = (layers, pages, elems)
    arr = pagepool._zeros(shape)
    assert arr.shape == shape and arr.dtype == np.int64 and arr.flags.c_contiguous and arr.flags.writeable
    assert not arr.any()
    if arr.nbytes >= _HUGE:
        assert arr.ctypes.data % _HUGE == 0
    arr[-1, -1, -1] = 7
    arr[0, 0, 0] = -1
    flat = arr.reshape(-1)
    assert flat[0] == -1 and int(np.count_nonzero(arr)) == min(arr.size, 2)
    assert arr.size == 1 or flat[-1] == 7


def test_a_big_pool_is_madvised_huge_over_its_whole_chunks_only():
    # The hint covers the whole 2 MiB chunks inside the array and nothing past it (no page
    # beyond the array is touched): the smaps VMA of its first chunk carries `hg`.
    import mmap
    import os

    from tierdiag.engine import pagepool

    if not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        pytest.skip("no transparent huge pages here")
    arr = pagepool._zeros((4, 3 * 12_876 // 2, 8))  # 4.7 MiB: two whole chunks and a tail
    start = arr.ctypes.data
    flags = {}
    with open("/proc/self/smaps") as fh:
        vma = None
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                vma = (lo, hi)
            elif head == "VmFlags:" and vma is not None:
                flags[vma] = line.split()[1:]
    huge = [(lo, hi) for (lo, hi), f in flags.items() if "hg" in f and lo < start + arr.nbytes and hi > start]
    assert huge == [(start, start + 2 * _HUGE)], huge


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_big_pool_writes_verifies_copies_and_hands_its_tensor_over_its_own_memory(layout):
    # A pool over the huge-page mapping behaves as one over np.zeros: content written and
    # verified, the torch view the same memory, a copy and a pickle its own bytes.
    import copy
    import pickle

    plane = DataPlane(num_layers=4, page_elems=8, device="cpu", pinned_host=False, modelled_page_bytes=256,
                      layout=layout)
    pool = PagePool("host", 25_752, plane, on_device=False)  # the conversation trace's host pool: 6.3 MiB
    assert pool.array.nbytes >= 3 * _HUGE
    slots = pool.alloc(300)
    keys = np.arange(1_000, 1_300, dtype=np.int64)
    write_content(pool, slots, keys)
    assert verify_content(pool, slots, keys)
    for again in (copy.deepcopy(pool), pickle.loads(pickle.dumps(pool))):
        assert verify_content(again, slots, keys)
        again.array[...] = 0
        assert verify_content(pool, slots, keys) and not verify_content(again, slots, keys)
    view = pool.buffer  # torch's tensor over the same memory
    view[1, 2, 3] = 12345  # [layers, pages, elems] either layout
    assert pool.array[1, 2, 3] == 12345
