/* The session pauses' pairs in one pass: the compiled side of tierdiag/diagnose/session/session_pool.py
 * `_pairs_numpy` (the reference: same arguments, same result; tests/diagnose/test_session_pauses_linear.py
 * runs both). A module of its own: it is diagnose's, read at a run's close, never by the engine.
 *
 * pauses(arrival, finish, who, o_session, tokens, shared, pause_start, match, t_session, by_arrival,
 *        by_start, own, shared_max) -> None
 *   requests (n, int64 each): arrival, finish, who (its owner's number, 0 <= who < width),
 *     o_session (its session's number, -1: none), tokens (input + output);
 *   shared (width, int64): what each owner's first request found cached;
 *   turns (m, int64 each): pause_start (the predecessor's finish), match (its schedule), t_session;
 *   by_arrival (n): the requests in arrival order; by_start (m): the turns in pause-start order;
 *   own, shared_max (m, int64, written): per turn, over the other owners whose requests ran during
 *     its pause (arrival <= match and finish >= pause_start, of another session), the sum of
 *     max(largest tokens of the owner's such requests - shared[owner], 0), and the largest
 *     shared[owner] (0 where none).
 * The turns are swept by pause start: a request that arrived before it and finishes at or after
 * it is in a list of those in flight (dropped once it finished before a pause start: the later
 * ones start no earlier); those that arrived in [pause start, match] are a range of the arrivals.
 * Each owner of a turn's pairs is counted once, by a stamp an owner: no pair is stored, no sort (issue 41:
 * numpy took ~15 passes over ~15M pairs at 200k requests). Sums wrap as numpy's int64 do. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#define NBUF 13

static PyObject *pauses(PyObject *self, PyObject *args) {
    Py_buffer b[NBUF];
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*w*w*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6],
                          &b[7], &b[8], &b[9], &b[10], &b[11], &b[12]))
        return NULL;
    PyObject *result = NULL;
    int64_t *stamp = NULL, *best = NULL, *active = NULL, *touched = NULL;
    for (int i = 0; i < NBUF; i++)
        if (b[i].len % 8) { PyErr_SetString(PyExc_ValueError, "pauses: every array is int64"); goto done; }
    Py_ssize_t n = b[0].len / 8, width = b[5].len / 8, m = b[6].len / 8;
    if (b[1].len / 8 != n || b[2].len / 8 != n || b[3].len / 8 != n || b[4].len / 8 != n || b[9].len / 8 != n
        || b[7].len / 8 != m || b[8].len / 8 != m || b[10].len / 8 != m || b[11].len / 8 != m || b[12].len / 8 != m) {
        PyErr_SetString(PyExc_ValueError, "pauses: the requests' arrays and the turns' must be of one length each");
        goto done;
    }
    const int64_t *arr = b[0].buf, *fin = b[1].buf, *who = b[2].buf, *osess = b[3].buf, *tok = b[4].buf,
                  *sh = b[5].buf, *ps = b[6].buf, *mt = b[7].buf, *tsess = b[8].buf, *by_arr = b[9].buf,
                  *by_start = b[10].buf;
    int64_t *own = b[11].buf, *smax = b[12].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (who[i] < 0 || who[i] >= width) { PyErr_SetString(PyExc_ValueError, "pauses: who must be in [0, width)"); goto done; }
        if (by_arr[i] < 0 || by_arr[i] >= n) { PyErr_SetString(PyExc_ValueError, "pauses: by_arrival must index the requests"); goto done; }
    }
    for (Py_ssize_t i = 0; i < m; i++)
        if (by_start[i] < 0 || by_start[i] >= m) { PyErr_SetString(PyExc_ValueError, "pauses: by_start must index the turns"); goto done; }
    stamp = malloc((size_t)(width ? width : 1) * sizeof(int64_t));
    best = malloc((size_t)(width ? width : 1) * sizeof(int64_t));
    active = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    touched = malloc((size_t)(width ? width : 1) * sizeof(int64_t));
    if (!stamp || !best || !active || !touched) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t w = 0; w < width; w++) stamp[w] = -1;
    Py_ssize_t na = 0, next = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t t = by_start[k], p = ps[t], q = mt[t], ts = tsess[t];
        Py_ssize_t nt = 0;
        while (next < n && arr[by_arr[next]] < p) active[na++] = by_arr[next++];
#define TOUCH(J) do {                                                             \
            int64_t w_ = who[J], v_ = tok[J];                                     \
            if (stamp[w_] != k) { stamp[w_] = k; best[w_] = v_; touched[nt++] = w_; } \
            else if (v_ > best[w_]) best[w_] = v_;                                \
        } while (0)
        /* In flight when the pause began: arrived before it, finished at or after it. */
        for (Py_ssize_t i = 0; i < na;) {
            int64_t j = active[i];
            if (fin[j] < p) { active[i] = active[--na]; continue; }
            if (arr[j] <= q && osess[j] != ts) TOUCH(j);
            i++;
        }
        /* Arrived during it: [pause start, match]. */
        for (Py_ssize_t pos = next; pos < n; pos++) {
            int64_t j = by_arr[pos];
            if (arr[j] > q) break;
            if (fin[j] >= p && osess[j] != ts) TOUCH(j);
        }
#undef TOUCH
        uint64_t sum = 0;
        int64_t top = 0;
        for (Py_ssize_t i = 0; i < nt; i++) {
            int64_t w = touched[i], d = (int64_t)((uint64_t)best[w] - (uint64_t)sh[w]);
            if (d > 0) sum += (uint64_t)d;
            if (sh[w] > top) top = sh[w];
        }
        own[t] = (int64_t)sum;
        smax[t] = top;
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    free(stamp); free(best); free(active); free(touched);
    for (int i = 0; i < NBUF; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"pauses", pauses, METH_VARARGS, "The session pauses' per-turn sums over the requests that ran during each pause."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sessions", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sessions(void) { return PyModule_Create(&module); }
