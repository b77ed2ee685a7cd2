/* The compiled CPU data plane (tierdiag.native._cplane): what its parts share.
 *
 * One extension, a source file an owner (setup.py lists them):
 *   module.c         the module, and the page-list and row-view helpers every part uses
 *   pages.c          page moves (engine/rows.py), page content and its verification
 *                    (engine/content.py), a pool's slot stack (engine/pagepool.py: SlotCore)
 *   pagemap.c        a PageMap's common store (MapCore), and which evictions took a request's
 *                    once-cached pages (engine/pagemap.py)
 *   page_keys.c      a hash_ids request's page keys (trace/pages.py)
 *   storage_index.c  the storage tier's index (engine/storage.py)
 *   storage_io.c     the storage tier's page writes and reads (engine/storage.py)
 *   rows.c           the recorder's RowBuffer (probes/recorder.py) and its decoder into Arrow
 *                    buffers (store/writer.py)
 *   ticker.c         the recorder's tick (probes/recorder.py: FlushTicker)
 *   batch_pages.c    a prefill batch's members' page keys (engine/miss.py: BatchPages)
 *   router.c         a deployment's arrival text, every rank's share of the prefix
 *                    (engine/deployment.py: ranks_json), and a rank's plain decode steps
 *                    run ahead (engine/decode.py: decode_steps)
 *   approx_tree.c    cache_aware's approximate tree as runs (routing/approx_tree.py: RouterTree)
 *   lru_heap.c       the radix tree's lru heaps (engine/tree.py: LruHeap)
 *   requery.c        the storage re-queries armed, fired once a pass (engine/prefetch.py:
 *                    RequeryIndex)
 *
 * The numpy (or Python) implementations beside their owners are the reference and the
 * fallback: tierdiag/native/cplane.py chooses one backend for the process. Every function here
 * either does all of its work or, having changed nothing, returns -1 ("not my case"): a page
 * out of range, a slot not owned, a list of something else than ints, a geometry it does not
 * know, pools that overlap. The Python wrapper then runs the numpy path, which moves the bytes
 * or raises the error message the engine has always raised. So no part builds an error message
 * of its own for bad input; it only has to check before it writes.
 *
 * Row views (rows.array_rows): a pool is a C-contiguous [L, P] array of row items of rb bytes,
 * row (l, p) at byte (l * P + p) * rb. Layer-first pools have L layers of one layer's page a
 * row; page-first pools are [1, P] items of a whole page (its layers in order).
 *
 * The GIL is held throughout: every call is short (a few to a few thousand pages).
 */
#ifndef TIERDIAG_CPLANE_H
#define TIERDIAG_CPLANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* Bumped whenever a signature or a semantic changes: tierdiag/native/cplane.py refuses a stale
 * build (an editable install's .so compiled from an older source) instead of misusing it.
 * 6: the SHA-256 storage key chain, lookup_prefix, block_page_keys, map_set, gather_pages and
 * decode_rows gone; StorageIndex takes int keys.
 * 7: block_page_keys and map_set back (measured: benchmarks/README.md, session 11).
 * 8: FlushTicker (the recorder's tick; benchmarks/README.md, issue 41).
 * 9: pwrite_rows, pread_rows (the storage tier's page writes and reads; benchmarks/README.md, issue 41 session 17).
 * 10: PageKeySet (the miss reasons' in-batch page keys; benchmarks/README.md, issue 41 session 18).
 * 11: SlotCore and MapCore (PagePool's and PageMap's bases: alloc, free, set_many one C call; session 19).
 * 12: StorageIndex.admit's `counted` (the deletions counted, no list made; session 19, h41stor3).
 * 13: SlotCore's runs: `_bind` takes an array('q') template, alloc hands out array('q') slot runs and
 *     free takes them (session 21, h41soa).
 * 14: page keys as int64 runs: common_pages, PageKeySet and output_keys read array('q') runs
 *     (session 22, h41keys); RowBuffer.append and FlushTicker by vectorcall (h41rec5).
 * 15: StorageIndex's calls take keys as an int64 run (array('q')) as well as a list (session 22,
 *     h41stor8: the storage paths hand a node's and a request's key runs as they are).
 * 16: ranks_json (the deployment's arrival text; session 23, h41dp7).
 * 17: PageKeySet.count_add (count then add in one call, one probe a key on a run; session 23, h41rec6).
 * 18: StorageIndex(reserve): the tier's capacity made room for up front (session 24, h41stor10).
 * 19: FlushTicker reads a memoryview among its buffers as a row counter (the engine's columnar
 *     buffers'; session 24, h41rec7).
 * 20: PageWriter (the storage tier's page writes on a thread of their own; session 25, h41stor12).
 * 21: decode_steps (a rank's plain decode steps run ahead, engine/decode.py; session 26, h41dp11).
 * 22: lru_entry, lru_id (the radix tree's lru heap entries made and read in C; session 27, h41core11).
 * 23: StorageIndex.admit_write (a storage landing write's admit, page write and place in one call; session 28, h41stor15).
 * 24: RouterTree (cache_aware's approximate tree as runs in C, routing/approx_tree.py; session 28, h41dp13).
 * 25: link_chain (a trace line's hash-chain check, trace_chain.c; session 30, h41trace1).
 * 26: StorageIndex.admit_write writes a mixed write (some keys there before) in the same call;
 *     StorageIndex.loc_runs (a read's locations as runs; session 30, h41stor16).
 * 27: LruHeap, lru_push, lru_pop, lru_fresh (the radix tree's lru heaps as C structs, lru_heap.c;
 *     session 31, h41core15).
 * 28: text_column (an object column of str and None as an Arrow string array's buffers, handed
 *     over out of band; session 34, h44rec).
 * 29: BatchPages replaces PageKeySet (a prefill batch's shared pages from its members' key chains,
 *     a compare or two a member, no hash set of their keys; session 36, h46miss).
 * 30: a page map's slot holds ~value (0 = MISSING, pages never set left untouched): map_set and
 *     MapCore store it, blame reads it (session 36, h46maps).
 * 31: a page map's array is two-level (MapCore's `_top`, `_leaves`, `_nleaves`: leaves made on a
 *     key's first set); map_set and blame take the maps, not their arrays (session 37, h47faults).
 * 32: RowBuffer.append_pairs (a request's request_evictions rows from its `lost` dict in one call;
 *     session 38, h48rec).
 * 33: RequeryIndex (requery.c): the storage re-queries armed, one call a pass (session 38, h48stor). */
#define CPLANE_API 33

/* Page lists up to this long are held on the C stack (the engine's common case). */
#define SMALL_LIST 256

/* Shared between the parts, not exported from the extension. */
#define CP_HIDDEN __attribute__((visibility("hidden")))

/* ------------------------------------------------------------------------------------------ */
/* A small int read in place (module.c's page lists, rows.c's row values, batch_pages.c's keys) */

/* An int's value read from the object itself, no call: 1 and *x set when the layout is one this
 * build knows and the value fits in int64 with room to spare, else 0 and the caller asks
 * PyLong_AsLongLongAndOverflow (which gives the same value, or says it overflows). `v` must be
 * an int (PyLong_Check: the caller decides whether subclasses and bool are welcome; their value
 * is held the same way). A call a value was ~2/5 of a page list's load, ~half of a row value's
 * encoding and a third of a key lookup (callgrind, issue 41).
 *   3.11 (30-bit digits): up to three digits with the top one < 8, |v| < 2^63 (-2^63 itself is
 *        the call's); its layout is ob_size (the sign and the digit count) and ob_digit[].
 *   3.12+: a compact int (one digit), through the accessors CPython names for it.
 *   other layouts (15-bit digits, the limited API): always the call. */
static inline int
cp_small_int(PyObject *v, int64_t *x)
{
#if PY_VERSION_HEX >= 0x030C0000 && !defined(Py_LIMITED_API)
    if (PyUnstable_Long_IsCompact((PyLongObject *)v)) {
        *x = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)v);
        return 1;
    }
    return 0;
#elif PY_VERSION_HEX >= 0x030B0000 && !defined(Py_LIMITED_API) && PYLONG_BITS_IN_DIGIT == 30
    Py_ssize_t size = Py_SIZE(v), n;
    const digit *d = ((PyLongObject *)v)->ob_digit;
    uint64_t u;
    if (size == 1) { /* one digit (every slot number, most page-list items): the value itself */
        *x = (int64_t)d[0];
        return 1;
    }
    n = size < 0 ? -size : size;
    if (n > 3 || (n == 3 && d[2] >= 8)) {
        return 0;
    }
    u = n == 0 ? 0 : (uint64_t)d[0] | (n > 1 ? (uint64_t)d[1] << 30 : 0) | (n > 2 ? (uint64_t)d[2] << 60 : 0);
    *x = size < 0 ? -(int64_t)u : (int64_t)u; /* u < 2^63 */
    return 1;
#else
    (void)v;
    (void)x;
    return 0;
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* Page lists as int64 values (module.c)                                                       */

typedef struct {
    int64_t *v;
    Py_ssize_t n;
    int borrowed;  /* v is an int64 run's own items (read in place, never written or freed) */
    int64_t small[SMALL_LIST];
} Ints;

CP_HIDDEN void ints_init(Ints *ix);
CP_HIDDEN void ints_free(Ints *ix);
/* A page list: a list or tuple of ints, a range, or a 1-D C-contiguous buffer of native int64.
 * 1 loaded, 0 not a list this module takes (nothing set), -1 on MemoryError. */
CP_HIDDEN int ints_load(PyObject *obj, Ints *ix);
/* An int64 run (an array.array of typecode 'q': engine/tree_node.py's KeyRun and SlotRun) read
 * in place: 1 with its items and length set, 0 for anything else (nothing set). No buffer is
 * exported, so the items stay valid only while no Python code runs (the caller holds the GIL
 * and calls none before it is done with them). Only where run_layout_check (module init)
 * proved this interpreter's array object laid out as below; else always 0. */
CP_HIDDEN int run_items(PyObject *obj, const int64_t **v, Py_ssize_t *n);
CP_HIDDEN int run_layout_check(void);
/* Whether a PEP 3118 format names a native signed 8-byte integer ("l", "q", "n", "@" first). */
CP_HIDDEN int is_int64_format(const char *fmt);
/* Whether every value is a slot of a pool of num_pages. */
CP_HIDDEN int all_in_range(const Ints *ix, Py_ssize_t num_pages);
/* A row view: 2-D, C-contiguous. 1 got it, 0 not a row view (nothing set). */
CP_HIDDEN int get_rows(PyObject *obj, Py_buffer *b, int writable);
/* -1 as a Python int: "not my case". */
CP_HIDDEN PyObject *not_mine(void);
/* 1 (TypeError set, saying `message`) unless a call got `want` arguments. */
CP_HIDDEN int wrong_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *message);

/* ------------------------------------------------------------------------------------------ */
/* What each part adds to the module                                                          */

CP_HIDDEN extern PyMethodDef cp_pages_methods[];   /* pages.c */
CP_HIDDEN extern PyMethodDef cp_pagemap_methods[]; /* pagemap.c */
CP_HIDDEN extern PyMethodDef cp_page_keys_methods[]; /* page_keys.c */
CP_HIDDEN extern PyMethodDef cp_rows_methods[];    /* rows.c */
CP_HIDDEN extern PyMethodDef cp_storage_io_methods[]; /* storage_io.c */
CP_HIDDEN extern PyMethodDef cp_router_methods[];  /* router.c */
CP_HIDDEN extern PyMethodDef cp_trace_chain_methods[]; /* trace_chain.c */
CP_HIDDEN extern PyMethodDef cp_lru_heap_methods[]; /* lru_heap.c */
CP_HIDDEN extern PyTypeObject cp_StorageIndexType; /* storage_index.c */
CP_HIDDEN extern PyTypeObject cp_PageWriterType;   /* storage_io.c */
CP_HIDDEN extern PyTypeObject cp_RowBufferType;    /* rows.c */
CP_HIDDEN Py_ssize_t cp_row_buffer_rows(PyObject *rb); /* rows.c: a RowBuffer's rows (its len) */
CP_HIDDEN extern PyTypeObject cp_FlushTickerType;  /* ticker.c */
CP_HIDDEN extern PyTypeObject cp_BatchPagesType;   /* batch_pages.c */
CP_HIDDEN extern PyTypeObject cp_SlotCoreType;     /* pages.c */
CP_HIDDEN extern PyTypeObject cp_MapCoreType;      /* pagemap.c */
CP_HIDDEN extern PyTypeObject cp_RouterTreeType;   /* approx_tree.c */
CP_HIDDEN extern PyTypeObject cp_LruHeapType;      /* lru_heap.c */
CP_HIDDEN extern PyTypeObject cp_RequeryIndexType; /* requery.c */

#endif
