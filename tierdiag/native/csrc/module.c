/* The module: _cplane's parts put together (cplane.h says which file owns what), and the
 * page-list and row-view helpers every part uses. */
#include "cplane.h"

/* ------------------------------------------------------------------------------------------ */
/* Page lists as int64 values                                                                  */

void
ints_init(Ints *ix)
{
    ix->v = ix->small;
    ix->n = 0;
    ix->borrowed = 0;
}

void
ints_free(Ints *ix)
{
    if (ix->v != ix->small && !ix->borrowed) {
        PyMem_Free(ix->v);
    }
    ix->v = ix->small;
    ix->n = 0;
    ix->borrowed = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* int64 runs read in place. CPython's array.array keeps its items behind this header
 * (Modules/arraymodule.c, unchanged from 3.8 to 3.13; not in any public header): reading it
 * skips a buffer export and release a run (~120 instructions) and, for ints_load, the copy of
 * the items (issue 41, session 24). run_layout_check proves the layout on this interpreter
 * at import, against what the buffer protocol says of runs it makes; a failed check turns the
 * in-place read off and every reader takes the buffer protocol as before. */

typedef struct {
    char typecode;
    int itemsize;
} RunDescr;  /* struct arraydescr's first two members */

typedef struct {
    PyObject_VAR_HEAD
    char *ob_item;
    Py_ssize_t allocated;
    const RunDescr *ob_descr;
} RunHead;  /* struct arrayobject's first members */

static PyTypeObject *run_type;  /* array.array, once the layout is proven; NULL: never in place */

int
run_items(PyObject *obj, const int64_t **v, Py_ssize_t *n)
{
    const RunHead *r = (const RunHead *)obj;
    if (Py_TYPE(obj) != run_type || run_type == NULL || r->ob_descr->typecode != 'q'
        || r->ob_descr->itemsize != (int)sizeof(int64_t)) {
        return 0;
    }
    *v = (const int64_t *)r->ob_item;
    *n = Py_SIZE(obj);
    return 1;
}

/* One run of typecode `code` with `len` items: whether the header above says what its exported
 * buffer says (items, length, item size), and the type code. */
static int
run_layout_agrees(PyObject *array_type, const char *code, Py_ssize_t len)
{
    PyObject *r = PyObject_CallFunction(array_type, "s", code);
    Py_buffer b;
    int ok = 0;
    if (r == NULL) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *x = PyLong_FromSsize_t(i * 3 + 1);
        PyObject *got = x == NULL ? NULL : PyObject_CallMethod(r, "append", "O", x);
        Py_XDECREF(x);
        if (got == NULL) {
            Py_DECREF(r);
            return 0;
        }
        Py_DECREF(got);
    }
    if (PyObject_GetBuffer(r, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
        const RunHead *h = (const RunHead *)r;
        ok = Py_SIZE(r) == len && h->ob_descr != NULL && h->ob_descr->typecode == code[0]
             && h->ob_descr->itemsize == b.itemsize && b.len == len * b.itemsize
             && (len == 0 || (void *)h->ob_item == b.buf);
        PyBuffer_Release(&b);
    }
    Py_DECREF(r);
    return ok;
}

/* At import: run_type set where array.array is laid out as RunHead says, for runs of 'q' and
 * of another type code, empty and not. 0, or -1 with an error set (array not importable). */
int
run_layout_check(void)
{
    PyObject *mod = PyImport_ImportModule("array");
    PyObject *array_type;
    int ok;
    if (mod == NULL) {
        return -1;
    }
    array_type = PyObject_GetAttrString(mod, "array");
    Py_DECREF(mod);
    if (array_type == NULL) {
        return -1;
    }
    ok = PyType_Check(array_type) && run_layout_agrees(array_type, "q", 5) && run_layout_agrees(array_type, "q", 0)
         && run_layout_agrees(array_type, "i", 3) && run_layout_agrees(array_type, "q", 300);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        ok = 0;
    }
    if (ok) {
        run_type = (PyTypeObject *)array_type;  /* the reference kept: the type outlives the module */
    } else {
        Py_DECREF(array_type);
    }
    return 0;
}

/* Room for n values: 0, or -1 with MemoryError set. */
static int
ints_reserve(Ints *ix, Py_ssize_t n)
{
    if (n <= SMALL_LIST) {
        return 0;
    }
    if ((size_t)n > PY_SSIZE_T_MAX / sizeof(int64_t)) {
        PyErr_NoMemory();
        return -1;
    }
    ix->v = PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (ix->v == NULL) {
        ix->v = ix->small;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Whether a PEP 3118 format names a native signed 8-byte integer (numpy int64/intp: "l" on
 * LP64, "q"; "n" is Py_ssize_t). The item size is checked separately. */
int
is_int64_format(const char *fmt)
{
    if (fmt == NULL) {
        return 0;
    }
    if (fmt[0] == '@') {
        fmt++;
    }
    return (fmt[0] == 'l' || fmt[0] == 'q' || fmt[0] == 'n') && fmt[1] == '\0';
}

/* Load a page list: a list or tuple of ints, a range, or a 1-D C-contiguous buffer of native
 * int64 (a numpy array). Returns 1 loaded, 0 not a list this module takes (nothing set: the
 * caller falls back to numpy, which raises whatever it raises for it), -1 on MemoryError. */
int
ints_load(PyObject *obj, Ints *ix)
{
    ints_init(ix);
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        /* Nothing below runs Python code (only exact ints and their subclasses are read, never
         * through __index__), so the list cannot change under the loop. */
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        PyObject **items = PySequence_Fast_ITEMS(obj);
        if (ints_reserve(ix, n) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = items[i];
            int overflow = 0;
            long long x;
            if (!PyLong_Check(item)) {
                ints_free(ix);
                return 0;
            }
            if (cp_small_int(item, &ix->v[i])) { /* a slot or a key: read in place, no call */
                continue;
            }
            x = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow) {
                ints_free(ix);
                return 0;
            }
            if (x == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                ints_free(ix);
                return 0;
            }
            ix->v[i] = (int64_t)x;
        }
        ix->n = n;
        return 1;
    }
    if (PyRange_Check(obj)) {
        /* start, stop and step as int64 (else not a page list: numpy's arange would refuse it
         * too); every value lies between start and stop, so none overflows. */
        static const char *const names[3] = {"start", "stop", "step"};
        long long bounds[3];
        Py_ssize_t n = PyObject_Length(obj);
        if (n < 0) { /* longer than Py_ssize_t */
            PyErr_Clear();
            return 0;
        }
        for (int k = 0; k < 3; k++) {
            PyObject *v = PyObject_GetAttrString(obj, names[k]);
            if (v == NULL) {
                PyErr_Clear();
                return 0;
            }
            bounds[k] = PyLong_AsLongLong(v);
            Py_DECREF(v);
            if (bounds[k] == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        }
        if (ints_reserve(ix, n) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            ix->v[i] = (int64_t)((uint64_t)bounds[0] + (uint64_t)i * (uint64_t)bounds[2]);
        }
        ix->n = n;
        return 1;
    }
    {
        const int64_t *items;
        Py_ssize_t n;
        if (run_items(obj, &items, &n)) {  /* a run: its own items, read in place */
            ix->v = (int64_t *)items;
            ix->n = n;
            ix->borrowed = 1;
            return 1;
        }
    }
    if (PyObject_CheckBuffer(obj)) {
        Py_buffer b;
        if (PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            return 0;
        }
        if (b.ndim != 1 || b.itemsize != (Py_ssize_t)sizeof(int64_t) || !is_int64_format(b.format)) {
            PyBuffer_Release(&b);
            return 0;
        }
        Py_ssize_t n = b.shape[0];
        if (ints_reserve(ix, n) < 0) {
            PyBuffer_Release(&b);
            return -1;
        }
        if (n) {
            memcpy(ix->v, b.buf, (size_t)n * sizeof(int64_t));
        }
        ix->n = n;
        PyBuffer_Release(&b);
        return 1;
    }
    return 0;
}

/* Whether every value is a slot of a pool of num_pages: one unsigned compare a value (a negative
 * one is, as unsigned, past any pool), the answers or-ed without a branch a value, so the loop
 * vectorises (two compares and a branch a slot were ~1.4 % of Scheduler.run; session 29). */
int
all_in_range(const Ints *ix, Py_ssize_t num_pages)
{
    if (num_pages <= 0) {
        return ix->n == 0;
    }
    const uint64_t *v = (const uint64_t *)ix->v;
    const uint64_t bound = (uint64_t)num_pages;
    uint64_t out = 0;
    for (Py_ssize_t i = 0; i < ix->n; i++) {
        out |= (uint64_t)(v[i] >= bound);
    }
    return out == 0;
}

/* A row view: 2-D, C-contiguous. Returns 1 got it, 0 not a row view (nothing set). */
int
get_rows(PyObject *obj, Py_buffer *b, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (b->ndim != 2 || b->itemsize <= 0 || b->shape[0] <= 0) {
        PyBuffer_Release(b);
        return 0;
    }
    return 1;
}

PyObject *
not_mine(void)
{
    return PyLong_FromLong(-1);
}

/* 1 (TypeError set, saying `message`) unless a call got `want` arguments. */
int
wrong_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *message)
{
    if (nargs == want) {
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, message);
    return 1;
}


/* ------------------------------------------------------------------------------------------ */

static struct PyModuleDef cplane_module = {
    PyModuleDef_HEAD_INIT,
    "_cplane",
    "The compiled CPU data plane (tierdiag/native/cplane.py chooses it; the numpy reference\n"
    "it falls back to lives beside each owner: engine/rows.py, content.py, pagepool.py,\n"
    "pagemap.py, storage.py, probes/recorder.py, trace/pages.py, trace/reader.py, miss.py,\n"
    "deployment.py, prefetch.py).",
    -1,
    NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__cplane(void)
{
    PyObject *m = PyModule_Create(&cplane_module);
    if (m == NULL) {
        return NULL;
    }
    if (run_layout_check() < 0 ||
        PyModule_AddIntConstant(m, "API", CPLANE_API) < 0 ||
        PyModule_AddFunctions(m, cp_pages_methods) < 0 ||
        PyModule_AddFunctions(m, cp_pagemap_methods) < 0 ||
        PyModule_AddFunctions(m, cp_page_keys_methods) < 0 ||
        PyModule_AddFunctions(m, cp_rows_methods) < 0 ||
        PyModule_AddFunctions(m, cp_storage_io_methods) < 0 ||
        PyModule_AddFunctions(m, cp_router_methods) < 0 ||
        PyModule_AddFunctions(m, cp_trace_chain_methods) < 0 ||
        PyModule_AddFunctions(m, cp_lru_heap_methods) < 0 ||
        PyType_Ready(&cp_StorageIndexType) < 0 ||
        PyModule_AddObjectRef(m, "StorageIndex", (PyObject *)&cp_StorageIndexType) < 0 ||
        PyType_Ready(&cp_PageWriterType) < 0 ||
        PyModule_AddObjectRef(m, "PageWriter", (PyObject *)&cp_PageWriterType) < 0 ||
        PyType_Ready(&cp_RowBufferType) < 0 ||
        PyModule_AddObjectRef(m, "RowBuffer", (PyObject *)&cp_RowBufferType) < 0 ||
        PyType_Ready(&cp_FlushTickerType) < 0 ||
        PyModule_AddObjectRef(m, "FlushTicker", (PyObject *)&cp_FlushTickerType) < 0 ||
        PyType_Ready(&cp_BatchPagesType) < 0 ||
        PyModule_AddObjectRef(m, "BatchPages", (PyObject *)&cp_BatchPagesType) < 0 ||
        PyType_Ready(&cp_SlotCoreType) < 0 ||
        PyModule_AddObjectRef(m, "SlotCore", (PyObject *)&cp_SlotCoreType) < 0 ||
        PyType_Ready(&cp_MapCoreType) < 0 ||
        PyModule_AddObjectRef(m, "MapCore", (PyObject *)&cp_MapCoreType) < 0 ||
        PyType_Ready(&cp_RouterTreeType) < 0 ||
        PyModule_AddObjectRef(m, "RouterTree", (PyObject *)&cp_RouterTreeType) < 0 ||
        PyType_Ready(&cp_LruHeapType) < 0 ||
        PyModule_AddObjectRef(m, "LruHeap", (PyObject *)&cp_LruHeapType) < 0 ||
        PyType_Ready(&cp_RequeryIndexType) < 0 ||
        PyModule_AddObjectRef(m, "RequeryIndex", (PyObject *)&cp_RequeryIndexType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
