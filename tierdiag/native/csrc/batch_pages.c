/* BatchPages (engine/miss.py: the pages a prefill batch computes, MissTracker.scheduled).
 *
 * A prefill batch's members, each a window of its page keys: add(keys, lo, hi) keeps keys[lo:hi]
 * as a member computing pages lo..hi-1; count_add(keys, lo, count_hi, add_hi) says how many of
 * the pages lo..count_hi-1 of `keys` an earlier member computes, then keeps keys[lo:add_hi] as a
 * member; clear() forgets every member. `keys` is a 1-D native int64 buffer (a key run,
 * array('q'): engine/tree_node.py; read in place) or a list or tuple of ints within int64, and
 * 0 <= lo, hi <= len(keys) (the caller clamps as a slice would; hi <= lo is empty).
 *
 * Page keys chain (trace/pages.py): a key stands for its whole prefix, so two requests hold the
 * same key only at the same page, with every page before it the same. A page is then counted
 * when a member's window holds it with the same key, and a member's matching pages within the
 * pages both cover are a prefix of them, found as the radix tree finds a node's
 * (tree.common_pages_py): the first page compared, then the last, then halved. So a member costs
 * one or two compares, not a hash table probe a page: the reference, a set of the batch's keys
 * (miss.py before session 36), hashed and probed every key of every member (~36 instructions a
 * key, ~25 M of a probed conversation replay, issue 41). The count is the union of the members'
 * matching pages. miss._BatchPagesPy is the reference of this file, step for step (the same
 * answer for any keys, chained or not: tests/engine/test_batch_pages.py). */
#include "cplane.h"

typedef struct {
    PyObject_HEAD
    int64_t *keys;        /* every member's window, laid end to end */
    Py_ssize_t used, room;
    Py_ssize_t *members;  /* (lo, hi, at) a member: its pages lo..hi-1 at keys[at..] */
    Py_ssize_t *spans;    /* count_add's: (first, end) of each member's matching pages */
    Py_ssize_t n, mroom;
} BatchPages;

/* The keys of a call: a run read in place, or a list's or tuple's ints copied. */
typedef struct {
    const int64_t *k;
    Py_buffer run;
    int64_t *own;
    Py_ssize_t n;
} BpKeys;

static void
bp_keys_release(BpKeys *kk)
{
    if (kk->run.obj != NULL) {
        PyBuffer_Release(&kk->run);
        kk->run.obj = NULL;
    }
    PyMem_Free(kk->own);
    kk->own = NULL;
}

/* `keys` as int64s: 0, or -1 with TypeError (nothing held). */
static int
bp_keys(PyObject *keys, const char *name, BpKeys *kk)
{
    Py_ssize_t i, n;
    kk->run.obj = NULL;
    kk->own = NULL;
    if (PyList_Check(keys) || PyTuple_Check(keys)) {
        n = PySequence_Fast_GET_SIZE(keys);
        if ((kk->own = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t))) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (i = 0; i < n; i++) {  /* (no Python code runs here: the list stays as it is) */
            PyObject *v = PySequence_Fast_GET_ITEM(keys, i);
            int64_t x;
            int overflow = 0;
            if (!PyLong_CheckExact(v)) {
                goto odd;
            }
            if (!cp_small_int(v, &x)) {
                long long y = PyLong_AsLongLongAndOverflow(v, &overflow);
                if (overflow || (y == -1 && PyErr_Occurred())) {
                    PyErr_Clear();
                    goto odd;
                }
                x = (int64_t)y;
            }
            kk->own[i] = x;
        }
        kk->k = kk->own;
        kk->n = n;
        return 0;
    }
    if (PyObject_CheckBuffer(keys) && PyObject_GetBuffer(keys, &kk->run, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
        if (kk->run.ndim != 1 || kk->run.itemsize != (Py_ssize_t)sizeof(int64_t)
            || !is_int64_format(kk->run.format)) {
            PyBuffer_Release(&kk->run);
            kk->run.obj = NULL;
            goto odd;
        }
        kk->k = (const int64_t *)kk->run.buf;
        kk->n = kk->run.shape[0];
        return 0;
    }
odd:
    bp_keys_release(kk);
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "BatchPages.%s: keys must be an int64 run, or a list or tuple of ints within int64",
                 name);
    return -1;
}

/* A bound argument within 0..n: 0, or -1 with an exception. */
static int
bp_bound(PyObject *v, Py_ssize_t n, const char *name, Py_ssize_t *out)
{
    if ((*out = PyLong_AsSsize_t(v)) == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*out < 0 || *out > n) {
        PyErr_Format(PyExc_ValueError, "BatchPages.%s: lo and hi must be within 0..len(keys)", name);
        return -1;
    }
    return 0;
}

/* keys[lo:hi] kept as a member (an empty window is none). 0, or -1 with MemoryError. */
static int
bp_keep(BatchPages *bp, const int64_t *k, Py_ssize_t lo, Py_ssize_t hi)
{
    Py_ssize_t len = hi - lo;
    if (len <= 0) {
        return 0;
    }
    if (bp->n == bp->mroom) {
        Py_ssize_t room = bp->mroom ? 2 * bp->mroom : 16;
        Py_ssize_t *members, *spans;
        if (room > PY_SSIZE_T_MAX / (3 * (Py_ssize_t)sizeof(Py_ssize_t))) {
            PyErr_NoMemory();
            return -1;
        }
        members = PyMem_Realloc(bp->members, (size_t)room * 3 * sizeof(Py_ssize_t));
        if (members == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        bp->members = members;
        spans = PyMem_Realloc(bp->spans, (size_t)room * 2 * sizeof(Py_ssize_t));
        if (spans == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        bp->spans = spans;
        bp->mroom = room;
    }
    if (len > bp->room - bp->used) {
        Py_ssize_t room = bp->room ? bp->room : 1024;
        int64_t *keys;
        while (len > room - bp->used) {
            if (room > PY_SSIZE_T_MAX / (4 * (Py_ssize_t)sizeof(int64_t))) {
                PyErr_NoMemory();
                return -1;
            }
            room *= 2;
        }
        if ((keys = PyMem_Realloc(bp->keys, (size_t)room * sizeof(int64_t))) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        bp->keys = keys;
        bp->room = room;
    }
    memcpy(bp->keys + bp->used, k + lo, (size_t)len * sizeof(int64_t));
    bp->members[3 * bp->n] = lo;
    bp->members[3 * bp->n + 1] = hi;
    bp->members[3 * bp->n + 2] = bp->used;
    bp->n++;
    bp->used += len;
    return 0;
}

static int
bp_span_cmp(const void *a, const void *b)
{
    Py_ssize_t x = ((const Py_ssize_t *)a)[0], y = ((const Py_ssize_t *)b)[0];
    return (x > y) - (x < y);
}

/* How many of the pages lo..hi-1 of `k` a member holds with the same key (module doc). */
static Py_ssize_t
bp_count(BatchPages *bp, const int64_t *k, Py_ssize_t lo, Py_ssize_t hi)
{
    Py_ssize_t j, found = 0, spans = 0, end = 0;
    for (j = 0; j < bp->n; j++) {
        const Py_ssize_t *m = bp->members + 3 * j;
        Py_ssize_t s = m[0] > lo ? m[0] : lo, e = m[1] < hi ? m[1] : hi, base = m[2] - m[0];
        const int64_t *a = bp->keys;
        if (s >= e || a[base + s] != k[s]) {
            continue;
        }
        if (a[base + e - 1] != k[e - 1]) {  /* s matches, e - 1 does not: the last that matches */
            Py_ssize_t yes = s, no = e - 1;
            while (no - yes > 1) {
                Py_ssize_t mid = yes + (no - yes) / 2;
                if (a[base + mid] == k[mid]) {
                    yes = mid;
                } else {
                    no = mid;
                }
            }
            e = yes + 1;
        }
        bp->spans[2 * spans] = s;
        bp->spans[2 * spans + 1] = e;
        spans++;
    }
    if (spans > 1) {
        qsort(bp->spans, (size_t)spans, 2 * sizeof(Py_ssize_t), bp_span_cmp);
    }
    for (j = 0; j < spans; j++) {  /* their union, by first page */
        Py_ssize_t s = bp->spans[2 * j], e = bp->spans[2 * j + 1];
        if (s < end) {
            s = end;
        }
        if (e > s) {
            found += e - s;
            end = e;
        }
    }
    return found;
}

/* The pages lo..count_hi-1 of `keys` an earlier member holds with the same key (none counted
 * where `count_o` is NULL: count_hi = lo), then keys[lo:add_hi] kept as a member: the count, or
 * NULL with an exception (the members unchanged). */
static PyObject *
bp_join(BatchPages *bp, PyObject *keys, PyObject *lo_o, PyObject *count_o, PyObject *add_o, const char *name)
{
    BpKeys kk;
    Py_ssize_t lo, count_hi = 0, add_hi, found;
    if (bp_keys(keys, name, &kk) < 0) {
        return NULL;
    }
    if (bp_bound(lo_o, kk.n, name, &lo) < 0 || (count_o != NULL && bp_bound(count_o, kk.n, name, &count_hi) < 0)
        || bp_bound(add_o, kk.n, name, &add_hi) < 0) {
        bp_keys_release(&kk);
        return NULL;
    }
    found = count_o != NULL ? bp_count(bp, kk.k, lo, count_hi) : 0;
    if (bp_keep(bp, kk.k, lo, add_hi) < 0) {
        bp_keys_release(&kk);
        return NULL;
    }
    bp_keys_release(&kk);
    return PyLong_FromSsize_t(found);
}

/* count_add(keys, lo, count_hi, add_hi): the pages lo..count_hi-1 of `keys` an earlier member
 * holds with the same key, then keys[lo:add_hi] kept as a member. */
static PyObject *
bp_count_add(BatchPages *bp, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "BatchPages.count_add takes keys, lo, count_hi, add_hi");
        return NULL;
    }
    return bp_join(bp, args[0], args[1], args[2], args[3], "count_add");
}

/* add(keys, lo, hi): keys[lo:hi] kept as a member. */
static PyObject *
bp_add(BatchPages *bp, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *none;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "BatchPages.add takes keys, lo, hi");
        return NULL;
    }
    if ((none = bp_join(bp, args[0], args[1], NULL, args[2], "add")) == NULL) {
        return NULL;
    }
    Py_DECREF(none);
    Py_RETURN_NONE;
}

static PyObject *
bp_clear(BatchPages *bp, PyObject *Py_UNUSED(ignored))
{
    bp->n = bp->used = 0;
    Py_RETURN_NONE;
}

/* The pages the members hold, together (a page two members hold counted twice). */
static Py_ssize_t
bp_len(BatchPages *bp)
{
    return bp->used;
}

static PyObject *
bp_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "BatchPages() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static void
bp_dealloc(BatchPages *bp)
{
    PyMem_Free(bp->keys);
    PyMem_Free(bp->members);
    PyMem_Free(bp->spans);
    Py_TYPE(bp)->tp_free((PyObject *)bp);
}

static PyMethodDef bp_methods[] = {
    {"add", (PyCFunction)(void (*)(void))bp_add, METH_FASTCALL, "add(keys, lo, hi): keys[lo:hi] kept as a member."},
    {"count_add", (PyCFunction)(void (*)(void))bp_count_add, METH_FASTCALL,
     "count_add(keys, lo, count_hi, add_hi) -> the pages lo..count_hi-1 an earlier member holds with the same key; "
     "then keys[lo:add_hi] kept as a member."},
    {"clear", (PyCFunction)bp_clear, METH_NOARGS, "clear(): forget every member."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods bp_as_sequence = {
    .sq_length = (lenfunc)bp_len,
};

PyTypeObject cp_BatchPagesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.BatchPages",
    .tp_doc = PyDoc_STR("BatchPages(): a prefill batch's members' page keys (engine/miss.py), int64 windows in C."),
    .tp_basicsize = sizeof(BatchPages),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = bp_new,
    .tp_dealloc = (destructor)bp_dealloc,
    .tp_as_sequence = &bp_as_sequence,
    .tp_methods = bp_methods,
};
