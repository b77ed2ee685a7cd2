/* The compiled CPU data plane (tierdiag.native._cplane): what its parts share.
 *
 * One extension, a source file an owner (setup.py lists them):
 *   module.c         the module, and the page-list and row-view helpers every part uses
 *   pages.c          page moves (engine/rows.py), page content and its verification
 *                    (engine/content.py), a pool's slot stack (engine/pagepool.py)
 *   pagemap.c        a PageMap's common store, and which evictions took a request's
 *                    once-cached pages (engine/pagemap.py)
 *   page_keys.c      a hash_ids request's page keys (trace/pages.py)
 *   storage_index.c  the storage tier's index (engine/storage.py)
 *   storage_io.c     the storage tier's page writes and reads (engine/storage.py)
 *   rows.c           the recorder's RowBuffer (probes/recorder.py) and its decoder into Arrow
 *                    buffers (store/writer.py)
 *   ticker.c         the recorder's tick (probes/recorder.py: FlushTicker)
 *   keyset.c         a prefill batch's page keys (engine/miss.py: PageKeySet)
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
 * 10: PageKeySet (the miss reasons' in-batch page keys; benchmarks/README.md, issue 41 session 18). */
#define CPLANE_API 10

/* Page lists up to this long are held on the C stack (the engine's common case). */
#define SMALL_LIST 256

/* Shared between the parts, not exported from the extension. */
#define CP_HIDDEN __attribute__((visibility("hidden")))

/* ------------------------------------------------------------------------------------------ */
/* Page lists as int64 values (module.c)                                                       */

typedef struct {
    int64_t *v;
    Py_ssize_t n;
    int64_t small[SMALL_LIST];
} Ints;

CP_HIDDEN void ints_init(Ints *ix);
CP_HIDDEN void ints_free(Ints *ix);
/* A page list: a list or tuple of ints, a range, or a 1-D C-contiguous buffer of native int64.
 * 1 loaded, 0 not a list this module takes (nothing set), -1 on MemoryError. */
CP_HIDDEN int ints_load(PyObject *obj, Ints *ix);
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
CP_HIDDEN extern PyTypeObject cp_StorageIndexType; /* storage_index.c */
CP_HIDDEN extern PyTypeObject cp_RowBufferType;    /* rows.c */
CP_HIDDEN extern PyTypeObject cp_FlushTickerType;  /* ticker.c */
CP_HIDDEN extern PyTypeObject cp_PageKeySetType;   /* keyset.c */

#endif
