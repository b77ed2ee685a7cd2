/* PageKeySet (engine/miss.py: the page keys a prefill batch computes, MissTracker.scheduled).
 *
 * A set of page keys with three methods: add(keys, lo, hi) puts keys[lo:hi] in, count(keys, lo,
 * hi) says how many of keys[lo:hi] are in, clear() empties it. `keys` is a list, a tuple or a 1-D
 * native int64 buffer (a key run, array('q'): engine/tree_node.py; read in place) and
 * 0 <= lo, hi <= len(keys) (the caller clamps as a slice would; hi <= lo is empty). miss.py's
 * _KeySetPy, the reference, does the same with a Python set: a set of Python ints was ~30k
 * instructions a request of a probed Engine.run (hashing, comparing and boxing every key),
 * here an int64 open-addressing table, a few instructions a key.
 *
 * Engine keys are ints within int64. Any other value (a big int, a float, a bool, a str) makes
 * the set switch, for good, to a Python set holding everything (its int64 keys boxed): Python's
 * equality (1 == 1.0 == True) then decides, exactly as the reference's.
 *
 * clear() is O(1): a slot is in the set when its stamp is the current generation. */
#include "cplane.h"

typedef struct {
    PyObject_HEAD
    int64_t *keys;
    uint32_t *stamp;
    uint32_t *mark;     /* count_add's: the call that put a slot's key in (count_add's own keys) */
    Py_ssize_t cap, n;  /* cap a power of two (0: none yet); n keys of this generation */
    uint32_t gen, call;
    PyObject *py;       /* the Python set once an odd value was seen, else NULL */
} PageKeySet;

static inline size_t
ks_hash(int64_t k)
{
    uint64_t x = (uint64_t)k;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

/* The slot of k: where it is, or the empty slot where it would go. */
static inline Py_ssize_t
ks_slot(const PageKeySet *ks, int64_t k)
{
    size_t mask = (size_t)ks->cap - 1, i = ks_hash(k) & mask;
    while (ks->stamp[i] == ks->gen && ks->keys[i] != k) {
        i = (i + 1) & mask;
    }
    return (Py_ssize_t)i;
}

/* Room for `more` more keys (at most half full). 0, or -1 with MemoryError. */
static int
ks_reserve_n(PageKeySet *ks, Py_ssize_t more)
{
    Py_ssize_t cap = ks->cap ? ks->cap : 1024, i;
    int64_t *old_keys = ks->keys;
    uint32_t *old_stamp = ks->stamp, *old_mark = ks->mark, old_gen = ks->gen;
    Py_ssize_t old_cap = ks->cap;
    if (more > PY_SSIZE_T_MAX / 4 - ks->n) {
        PyErr_NoMemory();
        return -1;
    }
    if ((ks->n + more) * 2 <= ks->cap) {
        return 0;
    }
    while ((ks->n + more) * 2 > cap) {
        if (cap > PY_SSIZE_T_MAX / 16) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    ks->keys = PyMem_Malloc((size_t)cap * sizeof(int64_t));
    ks->stamp = PyMem_Calloc((size_t)cap, sizeof(uint32_t));
    ks->mark = PyMem_Calloc((size_t)cap, sizeof(uint32_t));
    if (ks->keys == NULL || ks->stamp == NULL || ks->mark == NULL) {
        PyMem_Free(ks->keys);
        PyMem_Free(ks->stamp);
        PyMem_Free(ks->mark);
        ks->keys = old_keys;
        ks->stamp = old_stamp;
        ks->mark = old_mark;
        PyErr_NoMemory();
        return -1;
    }
    ks->cap = cap;
    ks->gen = 1;
    for (i = 0; i < old_cap; i++) {
        if (old_stamp[i] == old_gen) {
            Py_ssize_t at = ks_slot(ks, old_keys[i]);
            ks->keys[at] = old_keys[i];
            ks->stamp[at] = 1;
            ks->mark[at] = old_mark[i];
        }
    }
    PyMem_Free(old_keys);
    PyMem_Free(old_stamp);
    PyMem_Free(old_mark);
    return 0;
}

/* Room for one more key. */
static inline int
ks_reserve(PageKeySet *ks)
{
    return (ks->n + 1) * 2 <= ks->cap ? 0 : ks_reserve_n(ks, 1);
}

/* An exact int within int64: 1 and *out set; 0 for any other value; -1 on an error. */
static inline int
ks_int(PyObject *v, int64_t *out)
{
    int overflow = 0;
    long long x;
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    if (cp_small_int(v, out)) {  /* page keys are hashes of up to 63 bits: read in place */
        return 1;
    }
    x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        return 0;
    }
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)x;
    return 1;
}

/* Switch to a Python set holding every key so far. 0, or -1 with an exception. */
static int
ks_to_python(PageKeySet *ks)
{
    Py_ssize_t i;
    PyObject *set = PySet_New(NULL);
    if (set == NULL) {
        return -1;
    }
    for (i = 0; i < ks->cap; i++) {
        if (ks->stamp[i] == ks->gen) {
            PyObject *v = PyLong_FromLongLong(ks->keys[i]);
            if (v == NULL || PySet_Add(set, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(set);
                return -1;
            }
            Py_DECREF(v);
        }
    }
    ks->py = set;
    return 0;
}

/* keys[i] (borrowed), or NULL past its end: a list is read afresh each time, since an odd
 * value's __eq__ or __hash__ (the Python set's) could change it. */
static inline PyObject *
ks_item(PyObject *keys, Py_ssize_t i)
{
    if (PyList_Check(keys)) {
        return i < PyList_GET_SIZE(keys) ? PyList_GET_ITEM(keys, i) : NULL;
    }
    return i < PyTuple_GET_SIZE(keys) ? PyTuple_GET_ITEM(keys, i) : NULL;
}

/* The arguments (keys, lo, hi): lo and hi checked. 0, or -1 with an exception. */
static int
ks_args(PyObject *const *args, Py_ssize_t nargs, const char *name, Py_ssize_t *lo, Py_ssize_t *hi,
        Py_buffer *run)
{
    Py_ssize_t n;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "PageKeySet.%s takes keys, lo, hi", name);
        return -1;
    }
    if (PyList_Check(args[0])) {
        n = PyList_GET_SIZE(args[0]);
    } else if (PyTuple_Check(args[0])) {
        n = PyTuple_GET_SIZE(args[0]);
    } else if (run != NULL && PyObject_CheckBuffer(args[0])
               && PyObject_GetBuffer(args[0], run, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
        if (run->ndim != 1 || run->itemsize != (Py_ssize_t)sizeof(int64_t) || !is_int64_format(run->format)) {
            PyBuffer_Release(run);
            run->obj = NULL;
            PyErr_Format(PyExc_TypeError, "PageKeySet.%s: keys must be a list, tuple or int64 run", name);
            return -1;
        }
        n = run->shape[0];
    } else {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "PageKeySet.%s: keys must be a list, tuple or int64 run", name);
        return -1;
    }
#define KS_ARGS_FAIL() do { if (run != NULL && run->obj != NULL) { PyBuffer_Release(run); run->obj = NULL; } return -1; } while (0)
    if ((*lo = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) {
        KS_ARGS_FAIL();
    }
    if ((*hi = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) {
        KS_ARGS_FAIL();
    }
    if (*lo < 0 || *lo > n || *hi < 0 || *hi > n) {
        PyErr_Format(PyExc_ValueError, "PageKeySet.%s: lo and hi must be within 0..len(keys)", name);
        KS_ARGS_FAIL();
    }
    return 0;
#undef KS_ARGS_FAIL
}

/* One int64 key put in (adding) or looked up (not) while the set is still its own table: 1 found,
 * 0 not (or added), -1 with an exception. */
static inline int
ks_one(PageKeySet *ks, int64_t k, int adding)
{
    if (adding) {
        Py_ssize_t at;
        if (ks_reserve(ks) < 0) {
            return -1;
        }
        at = ks_slot(ks, k);
        if (ks->stamp[at] != ks->gen) {
            ks->keys[at] = k;
            ks->stamp[at] = ks->gen;
            ks->n++;
        }
        return 0;
    }
    return ks->cap && ks->stamp[ks_slot(ks, k)] == ks->gen;
}

/* One value put in or looked up in the Python set (switching to it first): 1 found, 0 not, -1
 * with an exception. `v` is borrowed. */
static int
ks_one_py(PageKeySet *ks, PyObject *v, int adding)
{
    int in = 0;
    Py_INCREF(v);
    if ((ks->py == NULL && ks_to_python(ks) < 0)
        || (adding ? PySet_Add(ks->py, v) : (in = PySet_Contains(ks->py, v))) < 0) {
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    return in;
}

/* ks_each over n int64 keys (a key run's, read in place): each key as its int would be. */
static Py_ssize_t
ks_each_run(PageKeySet *ks, const int64_t *keys, Py_ssize_t n, int adding)
{
    Py_ssize_t i, found = 0;
    for (i = 0; i < n; i++) {
        int got;
        if (ks->py != NULL) {  /* switched for good: Python's set decides, the key boxed */
            PyObject *v = PyLong_FromLongLong(keys[i]);
            if (v == NULL) {
                return -1;
            }
            got = ks_one_py(ks, v, adding);
            Py_DECREF(v);
        } else {
            got = ks_one(ks, keys[i], adding);
        }
        if (got < 0) {
            return -1;
        }
        found += got;
    }
    return found;
}

/* add (adding) or count (not): keys[lo:hi] put in, or how many of them are in; the count
 * (added: 0), or -1 with an exception. */
static Py_ssize_t
ks_each(PageKeySet *ks, PyObject *const *args, Py_ssize_t nargs, int adding)
{
    Py_ssize_t lo, hi, i, found = 0;
    PyObject *v;
    Py_buffer run;
    run.obj = NULL;
    if (ks_args(args, nargs, adding ? "add" : "count", &lo, &hi, &run) < 0) {
        return -1;
    }
    if (run.obj != NULL) {
        found = ks_each_run(ks, (const int64_t *)run.buf + lo, hi > lo ? hi - lo : 0, adding);
        PyBuffer_Release(&run);
        return found;
    }
    for (i = lo; i < hi && (v = ks_item(args[0], i)) != NULL; i++) {
        int64_t k;
        int got = ks->py == NULL ? ks_int(v, &k) : 0;
        if (got < 0) {
            return -1;
        }
        /* an odd value, or a set already switched: Python's set decides */
        got = got ? ks_one(ks, k, adding) : ks_one_py(ks, v, adding);
        if (got < 0) {
            return -1;
        }
        found += got;
    }
    return found;
}

/* count_add(keys, lo, count_hi, add_hi): count(keys, lo, count_hi), then add(keys, lo, add_hi),
 * the count returned (MissTracker.scheduled: a request's pages counted against its batch's, then
 * its own put in). On a key run while the set is its own table, one pass: each key hashed and
 * probed once (count then add probed each twice, issue 41 session 23); a key this call put in
 * carries the call's mark, so that a key repeated within keys[lo:count_hi] is counted only if it
 * was in before the call, as count-then-add counts it. Anything else: count, then add. */
static PyObject *
ks_count_add(PageKeySet *ks, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t lo, hc, ha, hi, i, found = 0;
    PyObject *count_args[3], *add_args[3];
    Py_buffer run;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "PageKeySet.count_add takes keys, lo, count_hi, add_hi");
        return NULL;
    }
    count_args[0] = add_args[0] = args[0];
    count_args[1] = add_args[1] = args[1];
    count_args[2] = args[2];
    add_args[2] = args[3];
    run.obj = NULL;
    if (ks_args(count_args, 3, "count_add", &lo, &hc, &run) < 0) {
        return NULL;
    }
    if (run.obj == NULL || ks->py != NULL) {
        if (run.obj != NULL) {
            PyBuffer_Release(&run);
        }
        found = ks_each(ks, count_args, 3, 0);  /* (reads only: add's bounds are checked after it) */
        if (found < 0 || ks_each(ks, add_args, 3, 1) < 0) {
            return NULL;
        }
        return PyLong_FromSsize_t(found);
    }
    if ((ha = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&run);
        return NULL;
    }
    if (ha < 0 || ha > run.shape[0]) {
        PyBuffer_Release(&run);
        PyErr_SetString(PyExc_ValueError, "PageKeySet.count_add: lo and hi must be within 0..len(keys)");
        return NULL;
    }
    if (ks_reserve_n(ks, ha > lo ? ha - lo : 0) < 0) {
        PyBuffer_Release(&run);
        return NULL;
    }
    if (++ks->call == 0) {  /* wrapped: every mark is old again */
        if (ks->cap) {
            memset(ks->mark, 0, (size_t)ks->cap * sizeof(uint32_t));
        }
        ks->call = 1;
    }
    {
        const int64_t *keys = (const int64_t *)run.buf;
        uint32_t gen = ks->gen, call = ks->call;
        hi = hc > ha ? hc : ha;
        for (i = lo; i < hi; i++) {
            Py_ssize_t at;
            if (ks->cap == 0) {  /* nothing in, nothing to add (ha <= lo): none found */
                break;
            }
            at = ks_slot(ks, keys[i]);
            if (ks->stamp[at] == gen) {
                found += i < hc && ks->mark[at] != call;
            } else if (i < ha) {
                ks->keys[at] = keys[i];
                ks->stamp[at] = gen;
                ks->mark[at] = call;
                ks->n++;
            }
        }
    }
    PyBuffer_Release(&run);
    return PyLong_FromSsize_t(found);
}

static PyObject *
ks_add(PageKeySet *ks, PyObject *const *args, Py_ssize_t nargs)
{
    if (ks_each(ks, args, nargs, 1) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ks_count(PageKeySet *ks, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t found = ks_each(ks, args, nargs, 0);
    return found < 0 ? NULL : PyLong_FromSsize_t(found);
}

static PyObject *
ks_clear(PageKeySet *ks, PyObject *Py_UNUSED(ignored))
{
    if (ks->py != NULL && PySet_Clear(ks->py) < 0) {
        return NULL;
    }
    ks->n = 0;
    if (++ks->gen == 0) {  /* wrapped: every stamp is old again */
        if (ks->cap) {
            memset(ks->stamp, 0, (size_t)ks->cap * sizeof(uint32_t));
        }
        ks->gen = 1;
    }
    Py_RETURN_NONE;
}

static Py_ssize_t
ks_len(PageKeySet *ks)
{
    return ks->py != NULL ? PySet_GET_SIZE(ks->py) : ks->n;
}

static PyObject *
ks_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PageKeySet *ks;
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "PageKeySet() takes no arguments");
        return NULL;
    }
    if ((ks = (PageKeySet *)type->tp_alloc(type, 0)) == NULL) {
        return NULL;
    }
    ks->gen = 1;
    return (PyObject *)ks;
}

static void
ks_dealloc(PageKeySet *ks)
{
    PyMem_Free(ks->keys);
    PyMem_Free(ks->stamp);
    PyMem_Free(ks->mark);
    Py_CLEAR(ks->py);
    Py_TYPE(ks)->tp_free((PyObject *)ks);
}

static PyMethodDef ks_methods[] = {
    {"add", (PyCFunction)(void (*)(void))ks_add, METH_FASTCALL, "add(keys, lo, hi): keys[lo:hi] into the set."},
    {"count", (PyCFunction)(void (*)(void))ks_count, METH_FASTCALL,
     "count(keys, lo, hi) -> how many of keys[lo:hi] are in the set."},
    {"count_add", (PyCFunction)(void (*)(void))ks_count_add, METH_FASTCALL,
     "count_add(keys, lo, count_hi, add_hi) -> count(keys, lo, count_hi), then add(keys, lo, add_hi)."},
    {"clear", (PyCFunction)ks_clear, METH_NOARGS, "clear(): empty the set."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods ks_as_sequence = {
    .sq_length = (lenfunc)ks_len,
};

PyTypeObject cp_PageKeySetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.PageKeySet",
    .tp_doc = PyDoc_STR("PageKeySet(): a set of page keys (engine/miss.py), int64 keys in a C table."),
    .tp_basicsize = sizeof(PageKeySet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = ks_new,
    .tp_dealloc = (destructor)ks_dealloc,
    .tp_as_sequence = &ks_as_sequence,
    .tp_methods = ks_methods,
};
