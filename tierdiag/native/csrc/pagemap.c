/* engine/pagemap.py's PageMap on its int32 array (a slot holds its value's complement, ~value:
 * zero bytes, a page the kernel never had to touch, are MISSING = -1; session 36): map_set, set_many's common case (every key
 * inside the array; PageMap._set_many_py is the reference), and blame, of a request's computed
 * pages how many were cached once and which evictions took them (pagemap.blame_py is the
 * reference). */
#include "cplane.h"

#include <structmember.h>

/* A 1-D C-contiguous buffer of native 4-byte ints (array('i'), numpy int32), with `flags`
 * (PyBUF_WRITABLE) too: 1, or 0 (not mine, nothing held). */
static int
int32_view(PyObject *obj, Py_buffer *b, int flags)
{
    const char *f;
    if (PyObject_GetBuffer(obj, b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    f = b->format;
    if (f != NULL && f[0] == '@') {
        f++;
    }
    if (b->ndim != 1 || b->itemsize != 4 || f == NULL || f[0] != 'i' || f[1] != '\0') {
        PyBuffer_Release(b);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* map_set(dense, keys, value) -> 0, or -1                                                     */

PyDoc_STRVAR(map_set_doc,
"map_set(dense, keys, value) -> 0, or -1\n\n"
"PageMap.set_many's common case on its array (a 1-D native int32 buffer, writable): dense[k] =\n"
"~value (the slot's form: 0 is MISSING) for every key, a negative key (an output page) skipped. -1, having changed nothing, if\n"
"a key is past the array's end, the value outside [0, 2**31) or an argument of another type:\n"
"PageMap's Python path then (it grows the array, or keeps the key in its dict).");

/* dense[k] = ~value for every key (negative keys skipped): 1 done, 0 declined having changed
 * nothing (a key past the end, a value outside [0, 2**31), another type), -1 MemoryError. */
static int
map_set_impl(PyObject *dense_o, PyObject *keys_o, PyObject *value_o)
{
    Py_buffer b;
    Ints keys;
    long long value;
    int loaded;
    Py_ssize_t i, n;
    if (!PyLong_CheckExact(value_o)) {
        return 0;
    }
    value = PyLong_AsLongLong(value_o);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (value < 0 || value > INT32_MAX) {
        return 0;
    }
    if (!int32_view(dense_o, &b, PyBUF_WRITABLE)) {
        return 0;
    }
    loaded = ints_load(keys_o, &keys);
    if (loaded <= 0) {
        PyBuffer_Release(&b);
        return loaded;
    }
    int32_t *dense = (int32_t *)b.buf;
    const Py_ssize_t len = b.len / 4;
    n = keys.n;
    for (i = 0; i < n; i++) {  /* every key checked before one is stored */
        if (keys.v[i] >= len) {
            ints_free(&keys);
            PyBuffer_Release(&b);
            return 0;
        }
    }
    for (i = 0; i < n; i++) {
        if (keys.v[i] >= 0) {
            dense[keys.v[i]] = ~(int32_t)value;
        }
    }
    ints_free(&keys);
    PyBuffer_Release(&b);
    return 1;
}

static PyObject *
cp_map_set(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int done;
    if (wrong_nargs(nargs, 3, "map_set() takes 3 arguments: dense, keys, value")) {
        return NULL;
    }
    done = map_set_impl(args[0], args[1], args[2]);
    if (done < 0) {
        return NULL;
    }
    return done ? PyLong_FromLong(0) : not_mine();
}

/* ------------------------------------------------------------------------------------------ */
/* MapCore: PageMap's base on the compiled data plane. It holds the map's array (`_dense`, an
 * attribute PageMap sets and grows) so the engine's set_many is one call into C with no
 * interpreted wrapper frame (issue 41, session 19); what map_set declines goes, with the same
 * arguments, to PageMap._set_many_py. */

typedef struct {
    PyObject_HEAD
    PyObject *dense;
} MapCore;

static void
mapcore_dealloc(MapCore *self)
{
    Py_CLEAR(self->dense);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(mapcore_set_many_doc,
"_set_many_c(keys, value, *, outputs_last=False)\n\n"
"PageMap._set_many_py by map_set on the map's array when every key is inside it (the common\n"
"case); anything else, having changed nothing, goes to _set_many_py with the same arguments.");

static PyObject *
mapcore_set_many(MapCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static PyObject *name = NULL;
    PyObject *stack[8];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    /* keys, value and at most outputs_last (a hint the C store does not need) */
    int plain = nkw == 0 || (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "outputs_last") == 0);
    if (nargs == 2 && plain && self->dense != NULL) {
        int done = map_set_impl(self->dense, args[0], args[1]);
        if (done < 0) {
            return NULL;
        }
        if (done) {
            Py_RETURN_NONE;
        }
    }
    /* _set_many_py(keys, value, ...) as called: it answers, or raises Python's error */
    if (1 + nargs + nkw > 8) {
        PyErr_SetString(PyExc_TypeError, "set_many() takes keys, value and outputs_last");
        return NULL;
    }
    if (name == NULL && (name = PyUnicode_InternFromString("_set_many_py")) == NULL) {
        return NULL;
    }
    stack[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        stack[1 + i] = args[i];
    }
    return PyObject_VectorcallMethod(name, stack, (size_t)(1 + nargs), kwnames);
}

static PyMemberDef mapcore_members[] = {
    {"_dense", T_OBJECT, offsetof(MapCore, dense), 0, "the map's array (array('i')), set by PageMap"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef mapcore_methods[] = {
    {"_set_many_c", (PyCFunction)(void (*)(void))mapcore_set_many, METH_FASTCALL | METH_KEYWORDS, mapcore_set_many_doc},
    {NULL, NULL, 0, NULL},
};

PyTypeObject cp_MapCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.MapCore",
    .tp_basicsize = sizeof(MapCore),
    .tp_dealloc = (destructor)mapcore_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "PageMap's base on the compiled data plane: set_many's common case in C.",
    .tp_members = mapcore_members,
    .tp_methods = mapcore_methods,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------ */
/* blame(cached, demoted, keys, lost, ps) -> pages once cached, or -1                           */

PyDoc_STRVAR(blame_doc,
"blame(cached, demoted, keys, lost, ps) -> int, or -1\n\n"
"pagemap.blame on the page maps' arrays (1-D native int32 buffers: PageMap._dense, each slot\n"
"~value, 0 where a key was never set; past the end MISSING too): how many of the keys were cached once (value >= 0);\n"
"with `lost` a dict, also adds ps tokens to lost[eid] for each page an eviction took (its\n"
"cached value, when > 0), then for each once-cached page's demotion before (demoted value\n"
"> 0), ids added in that order, run by run. -1 (nothing changed) for a negative key or\n"
"arguments of other types: pagemap.blame's Python path then.");

/* lost[eid] += tokens: 0, or -1 with an exception set. */
static int
blame_add(PyObject *lost, int32_t eid, long long tokens)
{
    PyObject *key, *old, *sum;
    int rc;
    if ((key = PyLong_FromLong(eid)) == NULL) {
        return -1;
    }
    old = PyDict_GetItemWithError(lost, key);  /* borrowed */
    if (old == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    if (old == NULL) {
        sum = PyLong_FromLongLong(tokens);
    } else {
        PyObject *t = PyLong_FromLongLong(tokens);
        sum = t == NULL ? NULL : PyNumber_Add(old, t);
        Py_XDECREF(t);
    }
    if (sum == NULL) {
        Py_DECREF(key);
        return -1;
    }
    rc = PyDict_SetItem(lost, key, sum);
    Py_DECREF(key);
    Py_DECREF(sum);
    return rc;
}

/* The ids of one pass (values > 0, in key order) added run by run of equal ids. */
static int
blame_runs(PyObject *lost, const int32_t *ids, Py_ssize_t n, long long ps)
{
    Py_ssize_t begin = 0;
    for (Py_ssize_t i = 1; i <= n; i++) {
        if (i == n || ids[i] != ids[begin]) {
            if (blame_add(lost, ids[begin], (long long)(i - begin) * ps) < 0) {
                return -1;
            }
            begin = i;
        }
    }
    return 0;
}

static PyObject *
cp_blame(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer cb, db;
    Ints keys;
    PyObject *lost, *out = NULL;
    long long ps;
    int loaded;
    int32_t *took = NULL;
    Py_ssize_t found = 0, ntook = 0, i;
    if (wrong_nargs(nargs, 5, "blame() takes 5 arguments: cached, demoted, keys, lost, ps")) {
        return NULL;
    }
    lost = args[3];
    if ((lost != Py_None && !PyDict_CheckExact(lost)) || !PyLong_CheckExact(args[4])) {
        return not_mine();
    }
    ps = PyLong_AsLongLong(args[4]);
    if (ps == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    if (!int32_view(args[0], &cb, 0)) {
        return not_mine();
    }
    if (!int32_view(args[1], &db, 0)) {
        PyBuffer_Release(&cb);
        return not_mine();
    }
    loaded = ints_load(args[2], &keys);
    if (loaded <= 0) {
        PyBuffer_Release(&cb);
        PyBuffer_Release(&db);
        return loaded < 0 ? NULL : not_mine();
    }
    const int32_t *cached = (const int32_t *)cb.buf, *demoted = (const int32_t *)db.buf;
    const Py_ssize_t nc = cb.len / 4, nd = db.len / 4, n = keys.n;
    for (i = 0; i < n; i++) {
        if (keys.v[i] < 0) {
            out = not_mine();
            goto done;
        }
    }
    if (lost != Py_None && n) {
        /* The evictions of every page, then the demotions of the once-cached ones: 2n at most. */
        if ((took = PyMem_Malloc((size_t)n * 2 * sizeof(int32_t))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (i = 0; i < n; i++) {
        int64_t k = keys.v[i];
        int32_t e = k < nc ? ~cached[k] : -1;
        if (e >= 0) {
            found++;
            if (took != NULL && e > 0) {
                took[ntook++] = e;
            }
        }
    }
    if (took != NULL && found) {
        for (i = 0; i < n; i++) {
            int64_t k = keys.v[i];
            if ((k < nc ? ~cached[k] : -1) >= 0) {
                int32_t d = k < nd ? ~demoted[k] : -1;
                if (d > 0) {
                    took[ntook++] = d;
                }
            }
        }
        /* One sequence, as pagemap.blame's Python path counts it (a run across the two passes
         * adds up the same). */
        if (blame_runs(lost, took, ntook, ps) < 0) {
            goto done;
        }
    }
    out = PyLong_FromSsize_t(found);
done:
    PyMem_Free(took);
    ints_free(&keys);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&db);
    return out;
}

PyMethodDef cp_pagemap_methods[] = {
    {"map_set", (PyCFunction)(void (*)(void))cp_map_set, METH_FASTCALL, map_set_doc},
    {"blame", (PyCFunction)(void (*)(void))cp_blame, METH_FASTCALL, blame_doc},
    {NULL, NULL, 0, NULL},
};
