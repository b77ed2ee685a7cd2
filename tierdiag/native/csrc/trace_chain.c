/* link_chain: trace/reader.py's hash-chain check of one line (`_link_chain_python` is the
 * reference) in one C loop over the line's ids, against ChainLinks' dense int64 array. Where an
 * id lies outside the array, or the line breaks the chain (an id behind a different predecessor
 * than before or than earlier in the line), it changes nothing and answers -1: the reference
 * then grows the array, asks the dict, or words the error. */
#include "cplane.h"

#define CHAIN_NONE (-2)  /* ChainLinks.NONE: no link known */
#define CHAIN_SMALL 256

PyDoc_STRVAR(link_chain_doc,
"link_chain(dense, hash_ids) -> int\n\n"
"trace.reader._link_chain_python over ChainLinks' array: each id of the tuple `hash_ids`\n"
"linked to the id before it (-1 for the first) where `dense` (an array('q'), NONE = -2 where\n"
"no link is known) holds none yet, each known link checked. The number of links added, or -1\n"
"(nothing changed) where the case is the reference's: an id outside the array, a broken\n"
"chain, anything that is not a tuple of ints.");

static PyObject *
cp_link_chain(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    PyObject *hash_ids;
    Py_ssize_t n, len, i, added = 0;
    int64_t *dense, prev = -1;
    int64_t small[CHAIN_SMALL];
    int64_t *written = small;  /* the ids this call linked: unlinked again where the line fails */
    int failed = 0;

    if (wrong_nargs(nargs, 2, "link_chain() takes 2 arguments")) {
        return NULL;
    }
    hash_ids = args[1];
    if (!PyTuple_CheckExact(hash_ids)) {
        return not_mine();
    }
    if (PyObject_GetBuffer(args[0], &b, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return not_mine();
    }
    if (b.itemsize != 8 || b.format == NULL || !is_int64_format(b.format)) {
        PyBuffer_Release(&b);
        return not_mine();
    }
    dense = (int64_t *)b.buf;
    len = b.len / 8;
    n = PyTuple_GET_SIZE(hash_ids);
    if (n > CHAIN_SMALL) {
        written = PyMem_Malloc((size_t)n * sizeof(int64_t));
        if (written == NULL) {
            PyBuffer_Release(&b);
            return PyErr_NoMemory();
        }
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(hash_ids, i);
        int overflow = 0;
        long long h;
        int64_t known;

        if (!PyLong_CheckExact(item)) {
            failed = 1;
            break;
        }
        h = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || h < 0 || h >= len) {
            failed = 1;
            break;
        }
        known = dense[h];
        if (known == CHAIN_NONE) {
            dense[h] = prev;
            written[added++] = h;
        } else if (known != prev) {
            failed = 1;
            break;
        }
        prev = h;
    }
    if (failed) {
        for (i = 0; i < added; i++) {
            dense[written[i]] = CHAIN_NONE;
        }
        added = -1;
    }
    if (written != small) {
        PyMem_Free(written);
    }
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(added);
}

PyMethodDef cp_trace_chain_methods[] = {
    {"link_chain", (PyCFunction)(void (*)(void))cp_link_chain, METH_FASTCALL, link_chain_doc},
    {NULL, NULL, 0, NULL},
};
