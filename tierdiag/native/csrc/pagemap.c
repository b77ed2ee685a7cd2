/* engine/pagemap.py's PageMap on its two-level int32 array (a slot holds its value's complement,
 * ~value: zero bytes, a page the kernel never had to touch, are MISSING = -1; session 36; a key's
 * slot is in the leaf its range's top entry names, leaf 0 the zero one; session 37): map_set, set_many's common case (every key
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
/* MapCore: PageMap's base on the compiled data plane. It holds the map's two-level array
 * (`_top`: a leaf's number for each LEAF keys, 0 for none; `_leaves`: the leaves, leaf 0 never
 * written; `_nleaves`: the leaves made; attributes PageMap sets and grows; session 37) so the
 * engine's set_many is one call into C with no interpreted wrapper frame (issue 41, session 19);
 * what map_set declines goes, with the same arguments, to PageMap._set_many_py. */

#define LEAF_SHIFT 6
#define LEAF_LOW ((1 << LEAF_SHIFT) - 1)

typedef struct {
    PyObject_HEAD
    PyObject *top;
    PyObject *leaves;
    /* Both arrays' writable int32 views, held from the time both are set (`held`) until either is
     * set again: a call reads the pointers, no buffer taken and given back each call (two a set,
     * four a blame: ~25 M instructions of a conversation replay). PageMap sets both None before it
     * resizes their mappings (a mapping with a view exported cannot be resized). */
    Py_buffer tb, lb;
    int held;
    Py_ssize_t nleaves;
} MapCore;

static void
map_let_go(MapCore *m)
{
    if (m->held) {
        PyBuffer_Release(&m->tb);
        PyBuffer_Release(&m->lb);
        m->held = 0;
    }
}

/* Hold both arrays' views where both are 1-D native int32 buffers, writable, and the leaves room
 * for a leaf for every top entry and the zero one; else hold nothing (every call declines). */
static void
map_hold(MapCore *m)
{
    map_let_go(m);
    if (m->top == NULL || m->leaves == NULL || m->top == Py_None || m->leaves == Py_None) {
        return;
    }
    if (!int32_view(m->top, &m->tb, PyBUF_WRITABLE)) {
        return;
    }
    if (!int32_view(m->leaves, &m->lb, PyBUF_WRITABLE)) {
        PyBuffer_Release(&m->tb);
        return;
    }
    if (m->lb.len / 4 < ((m->tb.len / 4) + 1) << LEAF_SHIFT) {
        PyBuffer_Release(&m->tb);
        PyBuffer_Release(&m->lb);
        return;
    }
    m->held = 1;
}

/* A map's arrays (its held views) for a call: the top, the leaves and the keys the array holds,
 * 1; or 0: not a MapCore, its views not held, or its leaf count past what they hold. */
static int
map_arrays(PyObject *obj, int32_t **top, int32_t **leaves, int64_t *slots)
{
    MapCore *m;
    if (!PyObject_TypeCheck(obj, &cp_MapCoreType)) {
        return 0;
    }
    m = (MapCore *)obj;
    if (!m->held || m->nleaves < 0 || m->nleaves > m->tb.len / 4) {
        return 0;
    }
    *top = (int32_t *)m->tb.buf;
    *leaves = (int32_t *)m->lb.buf;
    *slots = (int64_t)(m->tb.len / 4) << LEAF_SHIFT;
    return 1;
}

/* The leaf of key range `hi`, made (the next number) where it has none: its first slot's index. */
static inline int64_t
map_leaf(int32_t *top, Py_ssize_t *made, int64_t hi)
{
    int32_t leaf = top[hi];
    if (leaf == 0) {  /* map_hold: a leaf for every top entry fits */
        leaf = (int32_t)++*made;
        top[hi] = leaf;
    }
    return (int64_t)leaf << LEAF_SHIFT;
}

/* Key k's slot (0 <= k < the map's slots): ~value, 0 where never set (no leaf: the zero leaf). */
static inline int32_t
map_slot(const int32_t *top, const int32_t *leaves, int64_t k)
{
    return leaves[((int64_t)top[k >> LEAF_SHIFT] << LEAF_SHIFT) | (k & LEAF_LOW)];
}

/* A key's value (0 <= k < the map's slots), its leaf found again only where k's range is not the
 * last one read (*last, and *at: the leaf's first slot less the range's first key). */
static inline int32_t
map_read_near(const int32_t *top, const int32_t *leaves, int64_t k, int64_t *last, int64_t *at)
{
    if (k >> LEAF_SHIFT != *last) {
        *last = k >> LEAF_SHIFT;
        *at = ((int64_t)top[*last] - *last) << LEAF_SHIFT;
    }
    return ~leaves[*at + k];
}

/* ------------------------------------------------------------------------------------------ */
/* map_set(map, keys, value) -> 0, or -1                                                       */

PyDoc_STRVAR(map_set_doc,
"map_set(map, keys, value) -> 0, or -1\n\n"
"PageMap.set_many's common case on a map's array (MapCore's `_top` and `_leaves`): each key's\n"
"slot = ~value (the slot's form: 0 is MISSING), a leaf made where its range has none (in the\n"
"order the keys come), a negative key (an output page) skipped. -1, having changed nothing, if\n"
"a key is past the array's end, the value outside [0, 2**31) or an argument of another type:\n"
"PageMap's Python path then (it grows the array, or keeps the key in its dict).");

/* Each key's slot = ~value (negative keys skipped): 1 done, 0 declined having changed nothing
 * (a key past the end, a value outside [0, 2**31), another type), -1 MemoryError. */
static int
map_set_impl(PyObject *map, PyObject *keys_o, PyObject *value_o)
{
    Ints keys;
    long long value;
    int64_t len;
    int32_t *top, *leaves;
    int loaded, run;
    Py_ssize_t i, n, inputs;
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
    if (!map_arrays(map, &top, &leaves, &len)) {
        return 0;
    }
    loaded = ints_load(keys_o, &keys);
    if (loaded <= 0) {
        return loaded;
    }
    const int32_t slot = ~(int32_t)value;
    const int64_t *v = keys.v;
    Py_ssize_t made = ((MapCore *)map)->nleaves;
    n = keys.n;
    /* every key checked before one is stored (the largest against the array's end), then whether
     * the keys before the output pages at the end are one run k0 >= 0, k0 + 1, ... (a tree node's
     * keys: ~3 in 4 of the keys set), stored leaf by leaf; both loops branch-free (vectorised) */
    int64_t largest = -1, off = 0;
    for (i = 0; i < n; i++) {
        largest = v[i] > largest ? v[i] : largest;
    }
    if (largest >= len) {
        ints_free(&keys);
        return 0;
    }
    for (inputs = n; inputs > 0 && v[inputs - 1] < 0; inputs--) {
    }
    for (i = 0; i < inputs; i++) {
        off |= v[i] ^ (v[0] + i);
    }
    run = off == 0 && (inputs == 0 || v[0] >= 0);
    if (run) {
        int64_t k = inputs ? v[0] : 0;
        const int64_t end = k + inputs;
        while (k < end) {
            const int64_t hi = k >> LEAF_SHIFT, stop = ((hi + 1) << LEAF_SHIFT) < end ? (hi + 1) << LEAF_SHIFT : end;
            const int64_t at = map_leaf(top, &made, hi) - (hi << LEAF_SHIFT);
            for (; k < stop; k++) {
                leaves[at + k] = slot;
            }
        }
    } else {
        int64_t last = -1, at = 0;  /* the last key's range and its leaf's first slot less its first key */
        for (i = 0; i < n; i++) {
            const int64_t k = v[i];
            if (k >= 0) {
                if (k >> LEAF_SHIFT != last) {
                    last = k >> LEAF_SHIFT;
                    at = map_leaf(top, &made, last) - (last << LEAF_SHIFT);
                }
                leaves[at + k] = slot;
            }
        }
    }
    ((MapCore *)map)->nleaves = made;
    ints_free(&keys);
    return 1;
}

static PyObject *
cp_map_set(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int done;
    if (wrong_nargs(nargs, 3, "map_set() takes 3 arguments: map, keys, value")) {
        return NULL;
    }
    done = map_set_impl(args[0], args[1], args[2]);
    if (done < 0) {
        return NULL;
    }
    return done ? PyLong_FromLong(0) : not_mine();
}

static void
mapcore_dealloc(MapCore *self)
{
    map_let_go(self);
    Py_CLEAR(self->top);
    Py_CLEAR(self->leaves);
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
    if (nargs == 2 && plain) {
        int done = map_set_impl((PyObject *)self, args[0], args[1]);
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
    {"_nleaves", T_PYSSIZET, offsetof(MapCore, nleaves), 0, "the leaves made (1.._nleaves of _leaves)"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
mapcore_get(MapCore *self, void *which)
{
    PyObject *o = which ? self->leaves : self->top;
    return Py_NewRef(o ? o : Py_None);
}

/* `_top` / `_leaves` set: the views of the old arrays let go, the new ones' taken (map_hold). */
static int
mapcore_set(MapCore *self, PyObject *value, void *which)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a page map's arrays cannot be deleted");
        return -1;
    }
    map_let_go(self);
    Py_XSETREF(*(which ? &self->leaves : &self->top), Py_NewRef(value));
    map_hold(self);
    return 0;
}

static PyGetSetDef mapcore_getset[] = {
    {"_top", (getter)mapcore_get, (setter)mapcore_set,
     "each leaf range's leaf number, 0 for none (int32 memoryview), set by PageMap", NULL},
    {"_leaves", (getter)mapcore_get, (setter)mapcore_set,
     "the leaves, leaf 0 the zero one (int32 memoryview), set by PageMap", (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
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
    .tp_getset = mapcore_getset,
    .tp_methods = mapcore_methods,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------ */
/* blame(cached, demoted, keys, lost, ps) -> pages once cached, or -1                           */

PyDoc_STRVAR(blame_doc,
"blame(cached, demoted, keys, lost, ps) -> int, or -1\n\n"
"pagemap.blame on the page maps' arrays (two PageMaps on the compiled data plane: each slot\n"
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
    int32_t *ctop, *cleaves, *dtop, *dleaves;
    int64_t nc, nd;
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
    if (!map_arrays(args[0], &ctop, &cleaves, &nc) || !map_arrays(args[1], &dtop, &dleaves, &nd)) {
        return not_mine();
    }
    loaded = ints_load(args[2], &keys);
    if (loaded <= 0) {
        return loaded < 0 ? NULL : not_mine();
    }
    const Py_ssize_t n = keys.n;
    int64_t last = -1, at = 0;  /* the cached map's last range read and its leaf's offset (map_set) */
    /* A negative key (an output page: pagemap.blame never sends one) declines the call: the loops
     * below test it where a key is past the map (one unsigned compare a key), and nothing is
     * changed before both have read every key. */
    if (lost != Py_None && n) {
        /* The evictions of every page (from the front), the demotions of the once-cached ones
         * (from the middle, moved up behind them at the end): 2n at most. */
        if ((took = PyMem_Malloc((size_t)n * 2 * sizeof(int32_t))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    /* One pass: with a lost dict, a once-cached page's demotion is read as it is found (its leaf
     * kept as the cached map's is), not in a second pass over the keys and the cached map (issue
     * 41, session 38); the demotions land in key order after the evictions: the same sequence. */
    int32_t *dtook = took == NULL ? NULL : took + n;
    Py_ssize_t ndtook = 0;
    int64_t dlast = -1, dat = 0;
    for (i = 0; i < n; i++) {
        const int64_t k = keys.v[i];
        if ((uint64_t)k >= (uint64_t)nc) {
            if (k < 0) {
                out = not_mine();
                goto done;
            }
            continue;
        }
        const int32_t e = map_read_near(ctop, cleaves, k, &last, &at);
        if (e < 0) {
            continue;
        }
        found++;
        if (took == NULL) {
            continue;
        }
        if (e > 0) {
            took[ntook++] = e;
        }
        if (k < nd) {
            const int32_t d = map_read_near(dtop, dleaves, k, &dlast, &dat);
            if (d > 0) {
                dtook[ndtook++] = d;
            }
        }
    }
    if (took != NULL && found) {
        memmove(took + ntook, dtook, (size_t)ndtook * sizeof(int32_t));
        ntook += ndtook;
        /* One sequence, as pagemap.blame's Python path counts it (a run across the two parts
         * adds up the same). */
        if (blame_runs(lost, took, ntook, ps) < 0) {
            goto done;
        }
    }
    out = PyLong_FromSsize_t(found);
done:
    PyMem_Free(took);
    ints_free(&keys);
    return out;
}

PyMethodDef cp_pagemap_methods[] = {
    {"map_set", (PyCFunction)(void (*)(void))cp_map_set, METH_FASTCALL, map_set_doc},
    {"blame", (PyCFunction)(void (*)(void))cp_blame, METH_FASTCALL, blame_doc},
    {NULL, NULL, 0, NULL},
};
