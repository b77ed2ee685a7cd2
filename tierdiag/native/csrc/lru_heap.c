/* The radix tree's lru heaps (engine/tree.py: RadixTree's device and host victims) as a binary
 * heap of C structs: an entry is (ns, seq, nid), three int64s ordered as the tuple, which is the
 * order of the Python list heap's int entries ((ns << 64 | seq) << 48 | nid: RadixTree._lru_entry)
 * wherever 0 <= ns < 2^63, 0 <= seq < 2^63 and 0 <= nid < 2^48. A compare is three int64 compares
 * where the list's was a big-int rich compare (~650 instructions a pop of ~1k entries, the entry
 * made as a big int a stamp: issue 41, session 31).
 *
 * lru_push declines (False, having changed nothing) any stamp outside those ranges or not an int:
 * the tree then turns its heaps into the list heaps (LruHeap.items) and goes on there, as it
 * always has. Equal entries are the same value either way, so the sequence of entries popped is
 * the list heap's whatever the arrangement inside. */
#include "cplane.h"

typedef struct {
    int64_t ns, seq, nid;
} LruEntry;

typedef struct {
    PyObject_HEAD
    LruEntry *v;
    Py_ssize_t n, cap;
    LruEntry last;   /* the entry lru_pop handed out last (has_last) */
    int has_last;
} LruHeap;

static inline int
entry_lt(const LruEntry *a, const LruEntry *b)
{
    if (a->ns != b->ns) {
        return a->ns < b->ns;
    }
    if (a->seq != b->seq) {
        return a->seq < b->seq;
    }
    return a->nid < b->nid;
}

/* An int's value in [0, limit), or -1 (not an int, negative, too large). bool and other int
 * subclasses by their value, as Python's shifts and ors read them. */
static int64_t
stamp_value(PyObject *v, int64_t limit)
{
    int64_t x;
    int overflow;
    if (!PyLong_Check(v)) {
        return -1;
    }
    if (!cp_small_int(v, &x)) {
        x = (int64_t)PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
    }
    return x < 0 || x >= limit ? -1 : x;
}

#define NS_LIMIT INT64_MAX           /* [0, 2^63 - 1): 2^63 - 1 itself declined too (harmless) */
#define NID_LIMIT ((int64_t)1 << 48) /* tree.py's _ID_BITS */

static void
lh_dealloc(LruHeap *self)
{
    PyMem_Free(self->v);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
lh_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    LruHeap *self;
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "LruHeap() takes no arguments");
        return NULL;
    }
    self = (LruHeap *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->v = NULL;
        self->n = self->cap = 0;
        self->has_last = 0;
    }
    return (PyObject *)self;
}

static Py_ssize_t
lh_len(LruHeap *self)
{
    return self->n;
}

PyDoc_STRVAR(lh_items_doc,
"items() -> list[tuple[int, int, int]]\n\n"
"Every entry (ns, seq, nid), in the heap's array order (the tree's list heaps are made of them).");

static PyObject *
lh_items(LruHeap *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(self->n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < self->n; i++) {
        PyObject *t = Py_BuildValue("(LLL)", (long long)self->v[i].ns, (long long)self->v[i].seq,
                                    (long long)self->v[i].nid);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static PyMethodDef lh_methods[] = {
    {"items", (PyCFunction)lh_items, METH_NOARGS, lh_items_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods lh_as_sequence = {
    .sq_length = (lenfunc)lh_len,
};

PyTypeObject cp_LruHeapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.LruHeap",
    .tp_basicsize = sizeof(LruHeap),
    .tp_dealloc = (destructor)lh_dealloc,
    .tp_as_sequence = &lh_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("LruHeap()\n\nengine/tree.py's lru heap of (ns, seq, nid) entries (lru_heap.c)."),
    .tp_methods = lh_methods,
    .tp_new = lh_new,
};

static LruHeap *
heap_arg(PyObject *o, const char *fn)
{
    if (Py_TYPE(o) != &cp_LruHeapType) {
        PyErr_Format(PyExc_TypeError, "%s(): the heap must be an LruHeap, not %.100s", fn, Py_TYPE(o)->tp_name);
        return NULL;
    }
    return (LruHeap *)o;
}

PyDoc_STRVAR(lru_push_doc,
"lru_push(heap, ns, seq, nid) -> bool\n\n"
"Push the entry (ns, seq, nid): True; False, having changed nothing, where ns or seq is not an\n"
"int in [0, 2**63 - 1) or nid not one in [0, 2**48) (the caller's list heap takes it).");

static PyObject *
cp_lru_push(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    LruHeap *h;
    LruEntry e;
    Py_ssize_t i;
    if (wrong_nargs(nargs, 4, "lru_push() takes 4 arguments: heap, ns, seq, nid")) {
        return NULL;
    }
    if ((h = heap_arg(args[0], "lru_push")) == NULL) {
        return NULL;
    }
    e.ns = stamp_value(args[1], NS_LIMIT);
    e.seq = stamp_value(args[2], NS_LIMIT);
    e.nid = stamp_value(args[3], NID_LIMIT);
    if (e.ns < 0 || e.seq < 0 || e.nid < 0) {
        Py_RETURN_FALSE;
    }
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap < 64 ? 64 : h->cap * 2;
        LruEntry *v = PyMem_Realloc(h->v, (size_t)cap * sizeof(LruEntry));
        if (v == NULL) {
            return PyErr_NoMemory();
        }
        h->v = v;
        h->cap = cap;
    }
    i = h->n++;
    while (i > 0) { /* sift up */
        Py_ssize_t parent = (i - 1) >> 1;
        if (!entry_lt(&e, &h->v[parent])) {
            break;
        }
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = e;
    Py_RETURN_TRUE;
}

/* The least entry taken off the heap (n > 0). */
static LruEntry
heap_take(LruHeap *h)
{
    LruEntry top = h->v[0], e = h->v[--h->n];
    Py_ssize_t i = 0, n = h->n;
    for (;;) { /* sift the last entry down from the root */
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) {
            break;
        }
        if (c + 1 < n && entry_lt(&h->v[c + 1], &h->v[c])) {
            c++;
        }
        if (!entry_lt(&h->v[c], &e)) {
            break;
        }
        h->v[i] = h->v[c];
        i = c;
    }
    if (n > 0) {
        h->v[i] = e;
    }
    return top;
}

PyDoc_STRVAR(lru_pop_doc,
"lru_pop(heap, by_id) -> node | None\n\n"
"Take least entries off the heap until one's nid is a key of the dict `by_id` (the tree's id\n"
"index: a deleted node's entries find none and are dropped) and return by_id[nid], its entry\n"
"kept for lru_fresh; None when the heap runs empty.");

static PyObject *
cp_lru_pop(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    LruHeap *h;
    PyObject *by_id;
    if (wrong_nargs(nargs, 2, "lru_pop() takes 2 arguments: heap, by_id")) {
        return NULL;
    }
    if ((h = heap_arg(args[0], "lru_pop")) == NULL) {
        return NULL;
    }
    by_id = args[1];
    if (!PyDict_Check(by_id)) {
        PyErr_Format(PyExc_TypeError, "lru_pop(): by_id must be a dict, not %.100s", Py_TYPE(by_id)->tp_name);
        return NULL;
    }
    h->has_last = 0;
    while (h->n > 0) {
        LruEntry e = heap_take(h);
        PyObject *key = PyLong_FromLongLong((long long)e.nid), *node;
        if (key == NULL) {
            return NULL;
        }
        node = PyDict_GetItemWithError(by_id, key); /* borrowed */
        Py_DECREF(key);
        if (node != NULL) {
            h->last = e;
            h->has_last = 1;
            return Py_NewRef(node);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(lru_fresh_doc,
"lru_fresh(heap, ns, seq) -> bool\n\n"
"Whether the entry lru_pop handed out last has the stamp (ns, seq) (its nid is the node's: the\n"
"node was found by it). False when none was handed out, or for a value the heap cannot hold.");

static PyObject *
cp_lru_fresh(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    LruHeap *h;
    if (wrong_nargs(nargs, 3, "lru_fresh() takes 3 arguments: heap, ns, seq")) {
        return NULL;
    }
    if ((h = heap_arg(args[0], "lru_fresh")) == NULL) {
        return NULL;
    }
    if (h->has_last && stamp_value(args[1], NS_LIMIT) == h->last.ns && h->last.ns >= 0
        && stamp_value(args[2], NS_LIMIT) == h->last.seq) {
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

PyMethodDef cp_lru_heap_methods[] = {
    {"lru_push", (PyCFunction)(void (*)(void))cp_lru_push, METH_FASTCALL, lru_push_doc},
    {"lru_pop", (PyCFunction)(void (*)(void))cp_lru_pop, METH_FASTCALL, lru_pop_doc},
    {"lru_fresh", (PyCFunction)(void (*)(void))cp_lru_fresh, METH_FASTCALL, lru_fresh_doc},
    {NULL, NULL, 0, NULL},
};
