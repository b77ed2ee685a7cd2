/* RequeryIndex (engine/prefetch.py: the storage re-queries armed, SGLang 0.5.23's
 * StoragePrefetchRetries; `RequeryIndexPy` there is the reference, chosen where this module is
 * not built). The first piece of a storage controller owned by C (issue 41's storage row).
 *
 * It holds each armed request's due pass (-1: armed past max_attempts, dropped by the first pass
 * that sees it), keyed by the request object itself (one per arrival: no seq boxed, no hash of
 * an int), an index of them in arming order (the due list: (due pass, request), its passes
 * never decreasing in the engine, so the entries due are a prefix), and the requests armed past
 * the cap since the last pass. `fire(step, waiting)` is one pass's
 * `_process_storage_prefetch_retries` -> `pop_ready` in one call: the queue head's entry
 * dropped, the capped ones dropped, the due ones taken off (an index entry the map no longer
 * agrees with is stale: admitted, cancelled or re-armed since) and handed back in
 * waiting-queue order (the queue walked from its tail, where re-queried requests sit), or None
 * when none is due. In Python (mypyc-compiled) that pass and the arm cost ~2.6 k instructions a
 * re-query in dict gets, sets and deletions of boxed seqs, list appends and the walk
 * (callgrind, whole conversation trace, session 38).
 *
 * Every operation is the reference's, step for step, on any input (tests/engine/
 * test_requery_index.py runs both on hostile streams); neither checks the re-query cap, which
 * the caller does (an entry is only armed under it, and nothing changes a request's count
 * while it is armed). The index holds a reference to each request it names. */
#include "cplane.h"

#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject *req;  /* NULL: empty; RQ_GONE: deleted */
    int64_t due;
} RqSlot;

typedef struct {
    PyObject *req;  /* owned */
    int64_t due;
} RqDue;

typedef struct {
    PyObject_HEAD
    RqSlot *slots;
    size_t mask;          /* slots - 1 (a power of two) */
    Py_ssize_t used;      /* live entries */
    Py_ssize_t filled;    /* live + deleted */
    RqDue *due;           /* the due list: [head, n) */
    Py_ssize_t head, n, due_alloc;
    PyObject **armed;     /* owned; armed past the cap since the last pass */
    Py_ssize_t narmed, armed_alloc;
    long long fired;      /* requests handed back by `fire`, all passes */
} RequeryIndex;

static char rq_gone_mark;
#define RQ_GONE ((PyObject *)&rq_gone_mark)
#define RQ_MIN_SLOTS 16

static inline size_t
rq_hash(const RequeryIndex *rq, PyObject *req)
{
    uint64_t h = (uint64_t)(uintptr_t)req >> 4;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 31)) & rq->mask;
}

/* The slot holding `req`, or -1. */
static Py_ssize_t
rq_find(const RequeryIndex *rq, PyObject *req)
{
    size_t i = rq_hash(rq, req);
    for (;;) {
        PyObject *at = rq->slots[i].req;
        if (at == req) {
            return (Py_ssize_t)i;
        }
        if (at == NULL) {
            return -1;
        }
        i = (i + 1) & rq->mask;
    }
}

static int
rq_resize(RequeryIndex *rq, size_t size)
{
    RqSlot *old = rq->slots;
    size_t old_size = rq->mask + 1;
    RqSlot *slots = PyMem_Calloc(size, sizeof(RqSlot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    rq->slots = slots;
    rq->mask = size - 1;
    rq->filled = rq->used;
    for (size_t k = 0; k < old_size; k++) {
        PyObject *req = old[k].req;
        if (req != NULL && req != RQ_GONE) {
            size_t i = rq_hash(rq, req);
            while (slots[i].req != NULL) {
                i = (i + 1) & rq->mask;
            }
            slots[i] = old[k];
        }
    }
    PyMem_Free(old);
    return 0;
}

/* map[req] = due. */
static int
rq_set(RequeryIndex *rq, PyObject *req, int64_t due)
{
    Py_ssize_t at = rq_find(rq, req);
    size_t i;
    if (at >= 0) {
        rq->slots[at].due = due;
        return 0;
    }
    if ((size_t)(rq->filled + 1) * 4 > (rq->mask + 1) * 3) {
        size_t size = RQ_MIN_SLOTS;
        while (size < (size_t)(rq->used + 1) * 3) {
            size <<= 1;
        }
        if (rq_resize(rq, size) < 0) {
            return -1;
        }
    }
    i = rq_hash(rq, req);
    while (rq->slots[i].req != NULL && rq->slots[i].req != RQ_GONE) {
        i = (i + 1) & rq->mask;
    }
    if (rq->slots[i].req == NULL) {
        rq->filled++;
    }
    rq->slots[i].req = Py_NewRef(req);
    rq->slots[i].due = due;
    rq->used++;
    return 0;
}

static void
rq_delete(RequeryIndex *rq, Py_ssize_t at)
{
    PyObject *req = rq->slots[at].req;
    rq->slots[at].req = RQ_GONE;
    rq->used--;
    Py_DECREF(req);
}

static int
rq_int64(PyObject *v, int64_t *x)
{
    int overflow;
    long long got;
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "a due pass is an int, not %.80s", Py_TYPE(v)->tp_name);
        return -1;
    }
    if (cp_small_int(v, x)) {
        return 0;
    }
    got = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "a due pass is an int64");
        return -1;
    }
    if (got == -1 && PyErr_Occurred()) {
        return -1;
    }
    *x = (int64_t)got;
    return 0;
}

static void
rq_drop_index(RequeryIndex *rq)
{
    for (Py_ssize_t k = rq->head; k < rq->n; k++) {
        Py_DECREF(rq->due[k].req);
    }
    rq->head = rq->n = 0;
    for (Py_ssize_t k = 0; k < rq->narmed; k++) {
        Py_DECREF(rq->armed[k]);
    }
    rq->narmed = 0;
}

static PyObject *
rq_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    RequeryIndex *rq;
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "RequeryIndex() takes no arguments");
        return NULL;
    }
    if ((rq = (RequeryIndex *)type->tp_alloc(type, 0)) == NULL) {
        return NULL;
    }
    rq->slots = PyMem_Calloc(RQ_MIN_SLOTS, sizeof(RqSlot));
    if (rq->slots == NULL) {
        Py_DECREF(rq);
        return PyErr_NoMemory();
    }
    rq->mask = RQ_MIN_SLOTS - 1;
    return (PyObject *)rq;
}

static int
rq_traverse(RequeryIndex *rq, visitproc visit, void *arg)
{
    if (rq->slots != NULL) {
        for (size_t k = 0; k <= rq->mask; k++) {
            PyObject *req = rq->slots[k].req;
            if (req != NULL && req != RQ_GONE) {
                Py_VISIT(req);
            }
        }
    }
    for (Py_ssize_t k = rq->head; k < rq->n; k++) {
        Py_VISIT(rq->due[k].req);
    }
    for (Py_ssize_t k = 0; k < rq->narmed; k++) {
        Py_VISIT(rq->armed[k]);
    }
    return 0;
}

static int
rq_clear(RequeryIndex *rq)
{
    if (rq->slots != NULL) {
        for (size_t k = 0; k <= rq->mask; k++) {
            PyObject *req = rq->slots[k].req;
            if (req != NULL && req != RQ_GONE) {
                rq->slots[k].req = RQ_GONE;
                Py_DECREF(req);
            }
        }
        rq->used = 0;
    }
    rq_drop_index(rq);
    return 0;
}

static void
rq_dealloc(RequeryIndex *rq)
{
    PyObject_GC_UnTrack(rq);
    rq_clear(rq);
    PyMem_Free(rq->slots);
    PyMem_Free(rq->due);
    PyMem_Free(rq->armed);
    Py_TYPE(rq)->tp_free((PyObject *)rq);
}

static Py_ssize_t
rq_len(RequeryIndex *rq)
{
    return rq->used;
}

/* arm(req, due): poll_miss under the cap, its due pass set (the map and the due list). */
static PyObject *
rq_arm(RequeryIndex *rq, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t due;
    if (wrong_nargs(nargs, 2, "arm(req, due) takes two arguments") || rq_int64(args[1], &due) < 0) {
        return NULL;
    }
    if (rq->n == rq->due_alloc) {
        Py_ssize_t live = rq->n - rq->head;
        if (rq->head > 0 && live * 2 <= rq->due_alloc) {  /* the spent prefix goes first */
            memmove(rq->due, rq->due + rq->head, (size_t)live * sizeof(RqDue));
            rq->head = 0;
            rq->n = live;
        } else {
            Py_ssize_t size = rq->due_alloc ? rq->due_alloc * 2 : 64;
            RqDue *grown = PyMem_Realloc(rq->due, (size_t)size * sizeof(RqDue));
            if (grown == NULL) {
                return PyErr_NoMemory();
            }
            rq->due = grown;
            rq->due_alloc = size;
        }
    }
    if (rq_set(rq, args[0], due) < 0) {
        return NULL;
    }
    rq->due[rq->n].req = Py_NewRef(args[0]);
    rq->due[rq->n].due = due;
    rq->n++;
    Py_RETURN_NONE;
}

/* arm_capped(req): poll_miss past max_attempts: due -1, dropped by the next pass. */
static PyObject *
rq_arm_capped(RequeryIndex *rq, PyObject *req)
{
    if (rq->narmed == rq->armed_alloc) {
        Py_ssize_t size = rq->armed_alloc ? rq->armed_alloc * 2 : 16;
        PyObject **grown = PyMem_Realloc(rq->armed, (size_t)size * sizeof(PyObject *));
        if (grown == NULL) {
            return PyErr_NoMemory();
        }
        rq->armed = grown;
        rq->armed_alloc = size;
    }
    if (rq_set(rq, req, -1) < 0) {
        return NULL;
    }
    rq->armed[rq->narmed++] = Py_NewRef(req);
    Py_RETURN_NONE;
}

/* cancel(req): its armed re-query, if any, dropped (admission; `retries.cancel(rid)`). */
static PyObject *
rq_cancel(RequeryIndex *rq, PyObject *req)
{
    Py_ssize_t at = rq_find(rq, req);
    if (at >= 0) {
        rq_delete(rq, at);
    }
    Py_RETURN_NONE;
}

/* due(req): its due pass, None where none is armed. */
static PyObject *
rq_due_of(RequeryIndex *rq, PyObject *req)
{
    Py_ssize_t at = rq_find(rq, req);
    if (at < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(rq->slots[at].due);
}

/* set_due(req, due): the map alone (pop_ready's walk, the reference, sets a due pass there). */
static PyObject *
rq_set_due(RequeryIndex *rq, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t due;
    if (wrong_nargs(nargs, 2, "set_due(req, due) takes two arguments") || rq_int64(args[1], &due) < 0) {
        return NULL;
    }
    if (rq_set(rq, args[0], due) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* items(): [(req, due)] of every armed entry (in no set order). */
static PyObject *
rq_items(RequeryIndex *rq, PyObject *Py_UNUSED(arg))
{
    PyObject *out = PyList_New(rq->used);
    Py_ssize_t at = 0;
    for (size_t k = 0; out != NULL && k <= rq->mask; k++) {
        PyObject *req = rq->slots[k].req, *pair;
        if (req != NULL && req != RQ_GONE) {
            if ((pair = Py_BuildValue("(OL)", req, (long long)rq->slots[k].due)) == NULL) {
                Py_CLEAR(out);
            } else {
                PyList_SET_ITEM(out, at++, pair);  /* (at < used: every live slot counted) */
            }
        }
    }
    return out;
}

/* fire(step, waiting): one pass's pop_ready (the module doc): the requests due, in queue order,
 * each taken off the map; None if none. */
static PyObject *
rq_fire(RequeryIndex *rq, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t step;
    PyObject *waiting, *out;
    PyObject **items, *small[16], **ready = small;
    Py_ssize_t len, nready = 0, at;
    if (wrong_nargs(nargs, 2, "fire(step, waiting) takes two arguments") || rq_int64(args[0], &step) < 0) {
        return NULL;
    }
    waiting = args[1];
    if (!PyList_Check(waiting)) {
        PyErr_SetString(PyExc_TypeError, "fire: the waiting queue is a list");
        return NULL;
    }
    if (rq->used == 0) {  /* every index entry is stale now */
        rq_drop_index(rq);
        Py_RETURN_NONE;
    }
    len = PyList_GET_SIZE(waiting);
    if (len == 0) {
        Py_RETURN_NONE;
    }
    items = ((PyListObject *)waiting)->ob_item;
    at = rq_find(rq, items[0]);  /* "a speculative miss must never delay the queue head" */
    if (at >= 0) {
        rq_delete(rq, at);
    }
    if (rq->narmed) {  /* armed past the cap: dropped unless set again since */
        for (Py_ssize_t k = 0; k < rq->narmed; k++) {
            Py_ssize_t i = rq_find(rq, rq->armed[k]);
            if (i >= 0 && rq->slots[i].due == -1) {
                rq_delete(rq, i);
            }
        }
        for (Py_ssize_t k = 0; k < rq->narmed; k++) {
            Py_DECREF(rq->armed[k]);
        }
        rq->narmed = 0;
    }
    if (rq->head == rq->n || rq->due[rq->head].due > step) {
        Py_RETURN_NONE;
    }
    for (Py_ssize_t k = rq->head; k < rq->n && rq->due[k].due <= step; k++) {
        nready++;  /* at most this many: the prefix due */
    }
    if (nready > (Py_ssize_t)(sizeof small / sizeof small[0])) {
        ready = PyMem_Malloc((size_t)nready * sizeof(PyObject *));
        if (ready == NULL) {
            return PyErr_NoMemory();
        }
    }
    nready = 0;
    while (rq->head < rq->n && rq->due[rq->head].due <= step) {
        RqDue e = rq->due[rq->head++];
        Py_ssize_t i = rq_find(rq, e.req);
        if (i < 0 || rq->slots[i].due != e.due) {
            Py_DECREF(e.req);  /* stale */
            continue;
        }
        rq_delete(rq, i);
        ready[nready++] = e.req;  /* the due list's reference, now ready's */
    }
    if (rq->head == rq->n) {
        rq->head = rq->n = 0;
    } else if (rq->head > 256 && rq->head * 2 > rq->n) {  /* the spent prefix goes now and then */
        memmove(rq->due, rq->due + rq->head, (size_t)(rq->n - rq->head) * sizeof(RqDue));
        rq->n -= rq->head;
        rq->head = 0;
    }
    if (nready == 0) {
        out = Py_NewRef(Py_None);
    } else if (nready == 1) {
        out = PyList_New(1);
        if (out != NULL) {
            PyList_SET_ITEM(out, 0, Py_NewRef(ready[0]));
        }
    } else {
        /* in waiting-queue order, walked from the tail and stopped once all are found (the
         * reference's loop exactly: a request queued twice is found twice) */
        Py_ssize_t left = nready;
        uint64_t seen = 0;  /* a bit an address class of the ready ones: most queued are none */
        for (Py_ssize_t x = 0; x < nready; x++) {
            seen |= (uint64_t)1 << (((uintptr_t)ready[x] >> 4) & 63);
        }
        out = PyList_New(0);
        for (Py_ssize_t j = PyList_GET_SIZE(waiting) - 1; out != NULL && j >= 0; j--) {
            PyObject *r = PyList_GET_ITEM(waiting, j);
            if (!(seen >> (((uintptr_t)r >> 4) & 63) & 1)) {
                continue;
            }
            for (Py_ssize_t x = 0; x < nready; x++) {
                if (ready[x] == r) {
                    if (PyList_Append(out, r) < 0) {
                        Py_CLEAR(out);
                    }
                    left--;
                    break;
                }
            }
            if (!left) {
                break;
            }
        }
        if (out != NULL && PyList_Reverse(out) < 0) {
            Py_CLEAR(out);
        }
    }
    if (out != NULL && out != Py_None) {
        rq->fired += PyList_GET_SIZE(out);
    }
    for (Py_ssize_t k = 0; k < nready; k++) {
        Py_DECREF(ready[k]);
    }
    if (ready != small) {
        PyMem_Free(ready);
    }
    return out;
}

static PyMethodDef rq_methods[] = {
    {"arm", (PyCFunction)(void (*)(void))rq_arm, METH_FASTCALL, "arm(req, due): armed under the cap, due at pass `due`."},
    {"arm_capped", (PyCFunction)rq_arm_capped, METH_O, "arm_capped(req): armed past the cap (due -1)."},
    {"cancel", (PyCFunction)rq_cancel, METH_O, "cancel(req): its armed re-query, if any, dropped."},
    {"due", (PyCFunction)rq_due_of, METH_O, "due(req): its due pass, or None."},
    {"set_due", (PyCFunction)(void (*)(void))rq_set_due, METH_FASTCALL, "set_due(req, due): the map alone."},
    {"items", (PyCFunction)rq_items, METH_NOARGS, "items(): [(req, due)] of the armed entries."},
    {"fire", (PyCFunction)(void (*)(void))rq_fire, METH_FASTCALL,
     "fire(step, waiting): the re-queries due at pass `step`, in queue order, or None."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef rq_members[] = {
    {"fired", T_LONGLONG, offsetof(RequeryIndex, fired), READONLY, "requests handed back by fire(), all passes"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods rq_as_sequence = {
    .sq_length = (lenfunc)rq_len,
};

PyTypeObject cp_RequeryIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.RequeryIndex",
    .tp_doc = PyDoc_STR("RequeryIndex(): the storage re-queries armed (engine/prefetch.py RequeryIndexPy)."),
    .tp_basicsize = sizeof(RequeryIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = rq_new,
    .tp_dealloc = (destructor)rq_dealloc,
    .tp_traverse = (traverseproc)rq_traverse,
    .tp_clear = (inquiry)rq_clear,
    .tp_methods = rq_methods,
    .tp_members = rq_members,
    .tp_as_sequence = &rq_as_sequence,
};
