/* block_page_keys: trace/pages.py's page keys of a hash_ids request (Mooncake, `tierdiag
 * synth`) in one C loop (pages._block_page_keys_numpy is the reference); output_keys: a
 * finishing request's output page keys appended to its list and array in one call
 * (pages.extend_output_keys_numpy is the reference). */
#include "cplane.h"

/* ------------------------------------------------------------------------------------------ */
/* block_page_keys(hash_ids, num_pages, per_block) -> bytearray of int64 page keys, or -1      */

PyDoc_STRVAR(block_page_keys_doc,
"block_page_keys(hash_ids, num_pages, per_block) -> bytearray\n\n"
"trace.pages._block_page_keys_numpy as native int64s: page j of block b is\n"
"hash_ids[b] * per_block + j, the first num_pages of them. -1 when the case is numpy's (a\n"
"value that is not an int64, a key that would overflow, a count out of range).");

static PyObject *
cp_block_page_keys(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Ints h;
    Py_ssize_t num_pages, per_block, b;
    int64_t *out;
    PyObject *result;
    int got;

    if (wrong_nargs(nargs, 3, "block_page_keys() takes 3 arguments")) {
        return NULL;
    }
    num_pages = PyLong_AsSsize_t(args[1]);
    per_block = PyLong_AsSsize_t(args[2]);
    if ((num_pages == -1 || per_block == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    if (num_pages < 0 || per_block < 1) {
        return not_mine();
    }
    got = ints_load(args[0], &h);
    if (got <= 0) {
        return got < 0 ? NULL : not_mine();
    }
    if (num_pages > h.n * per_block) {
        num_pages = h.n * per_block;  /* numpy's slice past the end: as many as there are */
    }
    for (b = 0; b * per_block < num_pages; b++) {
        int64_t top;
        if (__builtin_mul_overflow(h.v[b], (int64_t)per_block, &top) ||
            __builtin_add_overflow(top, (int64_t)(per_block - 1), &top)) {
            ints_free(&h);
            return not_mine();
        }
    }
    result = PyByteArray_FromStringAndSize(NULL, num_pages * (Py_ssize_t)sizeof(int64_t));
    if (result == NULL) {
        ints_free(&h);
        return NULL;
    }
    out = (int64_t *)PyByteArray_AS_STRING(result);
    for (Py_ssize_t i = 0; i < num_pages; i++) {
        out[i] = h.v[i / per_block] * (int64_t)per_block + (int64_t)(i % per_block);
    }
    ints_free(&h);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* output_keys(keys, keys_np, seed, skip, count) -> bytearray, or -1                           */

PyDoc_STRVAR(output_keys_doc,
"output_keys(keys, keys_np, seed, skip, count) -> bytearray, or -1\n\n"
"trace.pages.extend_output_keys_numpy's work after the seed: output page j (skip <= j < count)\n"
"is ~((seed + j * step) mod 2**63) as an int64 (pages._OUTPUT_STEP); they are appended to the\n"
"list `keys`, and the bytearray returned holds keys_np's int64s then the same keys (what\n"
"np.concatenate made). -1, having changed nothing, when the case is numpy's: keys not a list,\n"
"keys_np not a 1-D native int64 buffer as long as it, a seed outside [0, 2**63), counts out\n"
"of range.");

#define OUTPUT_STEP ((UINT64_C(0x9E3779B97F4A7C15) >> 1) | 1)
#define MASK63 ((UINT64_C(1) << 63) - 1)

static PyObject *
cp_output_keys(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    PyObject *keys, *result, *tail;
    long long seed;
    Py_ssize_t skip, count, have, add;
    int64_t *out;

    if (wrong_nargs(nargs, 5, "output_keys() takes 5 arguments: keys, keys_np, seed, skip, count")) {
        return NULL;
    }
    keys = args[0];
    if (!PyList_CheckExact(keys) || !PyLong_CheckExact(args[2])) {
        return not_mine();
    }
    seed = PyLong_AsLongLong(args[2]);
    skip = PyLong_AsSsize_t(args[3]);
    count = PyLong_AsSsize_t(args[4]);
    if ((seed == -1 || skip == -1 || count == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    if (seed < 0 || skip < 0 || count < skip) {
        return not_mine();
    }
    if (PyObject_GetBuffer(args[1], &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return not_mine();
    }
    have = PyList_GET_SIZE(keys);
    if (b.ndim != 1 || b.itemsize != 8 || b.format == NULL
        || !((b.format[0] == 'l' || b.format[0] == 'q') && b.format[1] == '\0') || b.shape[0] != have) {
        PyBuffer_Release(&b);
        return not_mine();
    }
    add = count - skip;
    result = PyByteArray_FromStringAndSize(NULL, (have + add) * (Py_ssize_t)sizeof(int64_t));
    tail = PyList_New(add);
    if (result == NULL || tail == NULL) {
        Py_XDECREF(result);
        Py_XDECREF(tail);
        PyBuffer_Release(&b);
        return NULL;
    }
    out = (int64_t *)PyByteArray_AS_STRING(result);
    if (have) {
        memcpy(out, b.buf, (size_t)have * sizeof(int64_t));
    }
    PyBuffer_Release(&b);
    for (Py_ssize_t i = 0; i < add; i++) {
        uint64_t v = ((uint64_t)seed + (uint64_t)(skip + i) * OUTPUT_STEP) & MASK63;
        int64_t key = -(int64_t)v - 1;
        PyObject *o = PyLong_FromLongLong(key);
        if (o == NULL) {
            Py_DECREF(result);
            Py_DECREF(tail);
            return NULL;
        }
        out[have + i] = key;
        PyList_SET_ITEM(tail, i, o);
    }
    if (PyList_SetSlice(keys, have, have, tail) < 0) {
        Py_DECREF(result);
        Py_DECREF(tail);
        return NULL;
    }
    Py_DECREF(tail);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* keys_list(keys_np) -> list[int]                                                             */

PyDoc_STRVAR(keys_list_doc,
"keys_list(keys_np) -> list[int]\n\n"
"keys_np.tolist() for a request's page keys: a 1-D C-contiguous native int64 buffer made a\n"
"list of ints in one loop (numpy's tolist reads each item through the dtype's getitem, ~2x\n"
"the instructions); anything else is handed to its own tolist(), as pages.keys_list_numpy does.");

static PyObject *
cp_keys_list(PyObject *Py_UNUSED(module), PyObject *obj)
{
    Py_buffer b;
    PyObject *out;
    const int64_t *v;
    Py_ssize_t n;
    if (!PyObject_CheckBuffer(obj) || PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return PyObject_CallMethod(obj, "tolist", NULL);
    }
    if (b.ndim != 1 || b.itemsize != 8 || b.format == NULL
        || !((b.format[0] == 'l' || b.format[0] == 'q') && b.format[1] == '\0')) {
        PyBuffer_Release(&b);
        return PyObject_CallMethod(obj, "tolist", NULL);
    }
    n = b.shape[0];
    v = b.buf;
    out = PyList_New(n);
    if (out != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *o = PyLong_FromLongLong(v[i]);
            if (o == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, o);
        }
    }
    PyBuffer_Release(&b);
    return out;
}

PyMethodDef cp_page_keys_methods[] = {
    {"keys_list", (PyCFunction)cp_keys_list, METH_O, keys_list_doc},
    {"block_page_keys", (PyCFunction)(void (*)(void))cp_block_page_keys, METH_FASTCALL, block_page_keys_doc},
    {"output_keys", (PyCFunction)(void (*)(void))cp_output_keys, METH_FASTCALL, output_keys_doc},
    {NULL, NULL, 0, NULL},
};
