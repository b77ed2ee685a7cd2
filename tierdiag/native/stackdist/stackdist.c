/* LRU stack depths in one pass (Mattson's algorithm over a Fenwick tree): the compiled side of
 * tierdiag/diagnose/run/size_curves.py `_depths_python`, which is the reference (same arguments, same
 * result; tests/diagnose/test_size_curves.py runs both). A module of its own, apart from the data
 * plane (_cplane): it is diagnose's, read at a run's close, never by the engine.
 *
 * depths(prev, starts, query) -> bytes of int64, one per touch:
 *   prev[t]   the position of the previous touch of the same key (-1: none), positions 0..n-1
 *   starts[g] the first position of group g (ascending, starts[0] == 0); a group ends where the
 *             next starts (the last at n). Every touch of a group is answered against the stack
 *             as it was before the group, then the group's touches become the latest.
 *   query[t]  1: answer touch t; 0: touch only (its answer is -2)
 * answer: -1 where the key was never touched before, else its LRU stack depth (1 = the most
 * recently touched key): the number of distinct keys whose latest touch is at or after prev[t].
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One pass over the groups with a Fenwick tree of TYPE counts (see depths). */
#define PASS(TYPE, TREE) do {                                                                     \
    TYPE *tr = (TREE);                                                                            \
    int64_t live = 0;                                                                             \
    for (Py_ssize_t k = 0; k < g; k++) {                                                          \
        Py_ssize_t a = (Py_ssize_t)st[k], b = k + 1 < g ? (Py_ssize_t)st[k + 1] : n;              \
        for (Py_ssize_t t = a; t < b; t++) {                                                      \
            if (!q[t]) { out[t] = -2; continue; }                                                 \
            if (pv[t] < 0) { out[t] = -1; continue; }                                             \
            int64_t below = 0; /* live latest touches at positions < prev[t] */                   \
            for (Py_ssize_t i = (Py_ssize_t)pv[t]; i > 0; i -= i & -i) below += tr[i];            \
            out[t] = live - below;                                                                \
        }                                                                                         \
        for (Py_ssize_t t = a; t < b; t++) {                                                      \
            if (pv[t] >= 0) {                                                                     \
                for (Py_ssize_t i = (Py_ssize_t)pv[t] + 1; i <= n; i += i & -i) tr[i] -= 1;       \
            } else {                                                                              \
                live += 1;                                                                        \
            }                                                                                     \
            for (Py_ssize_t i = t + 1; i <= n; i += i & -i) tr[i] += 1;                           \
        }                                                                                         \
    }                                                                                             \
} while (0)

static PyObject *depths(PyObject *self, PyObject *args) {
    Py_buffer prev, starts, query;
    if (!PyArg_ParseTuple(args, "y*y*y*", &prev, &starts, &query)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = prev.len / 8, g = starts.len / 8;
    if (prev.len % 8 || starts.len % 8 || query.len != n) {
        PyErr_SetString(PyExc_ValueError, "depths: prev and starts are int64, query one byte a touch");
        goto done;
    }
    const int64_t *pv = (const int64_t *)prev.buf, *st = (const int64_t *)starts.buf;
    const uint8_t *q = (const uint8_t *)query.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pv[i] < -1 || pv[i] >= i) { PyErr_SetString(PyExc_ValueError, "depths: prev[t] must be in [-1, t)"); goto done; }
    for (Py_ssize_t i = 0; i < g; i++)
        if (st[i] < 0 || st[i] > n || (i && st[i] < st[i - 1]) || (i == 0 && st[0] != 0)) {
            PyErr_SetString(PyExc_ValueError, "depths: starts must ascend from 0 within [0, n]"); goto done;
        }
    result = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!result) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
    /* The tree's counts are at most n: 32-bit ones where n allows (half the memory a walk up
     * the tree touches; the pass is cache misses, ~25 % less time on the conversation trace's
     * 4.6M touches, issue 41), else 64-bit. The same answers either way. */
    void *tree = calloc((size_t)n + 1, n < INT32_MAX ? sizeof(int32_t) : sizeof(int64_t));
    if (!tree) { Py_CLEAR(result); PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    if (n < INT32_MAX)
        PASS(int32_t, (int32_t *)tree);
    else
        PASS(int64_t, (int64_t *)tree);
    Py_END_ALLOW_THREADS
    free(tree);
done:
    PyBuffer_Release(&prev);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&query);
    return result;
}

static PyMethodDef methods[] = {
    {"depths", depths, METH_VARARGS, "LRU stack depths of grouped touches (size_curves.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stackdist", NULL, -1, methods};

PyMODINIT_FUNC PyInit__stackdist(void) { return PyModule_Create(&module); }
