/* engine/pagemap.py's PageMap on its int32 array: map_set, set_many's common case (every key
 * inside the array; PageMap._set_many_py is the reference), and blame, of a request's computed
 * pages how many were cached once and which evictions took them (pagemap.blame_py is the
 * reference). */
#include "cplane.h"

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
"value for every key, a negative key (an output page) skipped. -1, having changed nothing, if\n"
"a key is past the array's end, the value outside [0, 2**31) or an argument of another type:\n"
"PageMap's Python path then (it grows the array, or keeps the key in its dict).");

static PyObject *
cp_map_set(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    Ints keys;
    long long value;
    int loaded;
    Py_ssize_t i, n;
    if (wrong_nargs(nargs, 3, "map_set() takes 3 arguments: dense, keys, value")) {
        return NULL;
    }
    if (!PyLong_CheckExact(args[2])) {
        return not_mine();
    }
    value = PyLong_AsLongLong(args[2]);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    if (value < 0 || value > INT32_MAX) {
        return not_mine();
    }
    if (!int32_view(args[0], &b, PyBUF_WRITABLE)) {
        return not_mine();
    }
    loaded = ints_load(args[1], &keys);
    if (loaded <= 0) {
        PyBuffer_Release(&b);
        return loaded < 0 ? NULL : not_mine();
    }
    int32_t *dense = (int32_t *)b.buf;
    const Py_ssize_t len = b.len / 4;
    n = keys.n;
    for (i = 0; i < n; i++) {  /* every key checked before one is stored */
        if (keys.v[i] >= len) {
            ints_free(&keys);
            PyBuffer_Release(&b);
            return not_mine();
        }
    }
    for (i = 0; i < n; i++) {
        if (keys.v[i] >= 0) {
            dense[keys.v[i]] = (int32_t)value;
        }
    }
    ints_free(&keys);
    PyBuffer_Release(&b);
    return PyLong_FromLong(0);
}

/* ------------------------------------------------------------------------------------------ */
/* blame(cached, demoted, keys, lost, ps) -> pages once cached, or -1                           */

PyDoc_STRVAR(blame_doc,
"blame(cached, demoted, keys, lost, ps) -> int, or -1\n\n"
"pagemap.blame on the page maps' arrays (1-D native int32 buffers: PageMap._dense, -1 where a\n"
"key was never set, past the end too): how many of the keys were cached once (value >= 0);\n"
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
        int32_t e = k < nc ? cached[k] : -1;
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
            if ((k < nc ? cached[k] : -1) >= 0) {
                int32_t d = k < nd ? demoted[k] : -1;
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
