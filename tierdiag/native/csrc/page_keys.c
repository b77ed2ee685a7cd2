/* block_page_keys: trace/pages.py's page keys of a hash_ids request (Mooncake, `tierdiag
 * synth`) in one C loop (pages._block_page_keys_numpy is the reference). */
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

PyMethodDef cp_page_keys_methods[] = {
    {"block_page_keys", (PyCFunction)(void (*)(void))cp_block_page_keys, METH_FASTCALL, block_page_keys_doc},
    {NULL, NULL, 0, NULL},
};
