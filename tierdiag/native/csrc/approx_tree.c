/* cache_aware's approximate tree in C (engine/routing/approx_tree.py's ApproxTree, step for step).
 *
 * The Python `ApproxTree` keeps, per rank, a radix tree of `_Run`s (a run of page keys with one
 * tick, children by first key, a parent link). Its walk (`_path`: a dict lookup, an array read
 * and a compare a run, boxed) was ~2,500 instructions a rank a routed request at --dp 8, 8 ranks
 * a match, plus the insert's (issue 41, session 27: ~0.05 G a 2,000 requests). Here the same
 * runs are structs in one array: a run's keys an int64 buffer of its own, its tick, parent and
 * child count; every parent's children in one open-addressed table keyed by (parent, first key);
 * rank r's root is run r (no keys). A match is one call, the insert another.
 *
 * Same operations, same answers as the Python twin (tests/engine/test_routing.py and
 * test_cache_aware_decide.py run the three trees on the same streams): the walk, the binary
 * search where a request leaves a run (`_common`), the split where a touch ends inside a run
 * (the head gets a new struct, the tail keeps the run's own, so its children's links stay), the
 * latest toucher of the deepest node (the lowest rank on a tie) and the eviction's (tick, key)
 * order of leaf keys. Keys must be prefix-chained (a key has one parent), as the Python says,
 * and fit in int64 (page keys are int64 runs); a list of other ints is a TypeError. */
#include "cplane.h"

typedef struct {
    int64_t *keys;    /* owned; NULL for a root */
    Py_ssize_t len;
    int64_t tick;
    int32_t parent;   /* -1: a root */
    int32_t rank;
    int32_t kids;     /* children in the table */
    int32_t live;     /* 0: on the free list */
} Run;

typedef struct {
    int64_t key;
    int32_t parent;   /* -1: empty slot */
    int32_t run;
} Slot;

typedef struct {
    PyObject_HEAD
    Run *runs;
    Py_ssize_t nruns, cap;
    int32_t *free;    /* runs to reuse */
    Py_ssize_t nfree, free_cap;
    Slot *table;
    size_t mask;      /* table size - 1 (a power of two) */
    size_t used;
    int64_t *pages;   /* per rank */
    int32_t num_ranks;
} RouterTree;

static inline size_t
slot_hash(int32_t parent, int64_t key)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)(uint32_t)parent * 0xC2B2AE3D27D4EB4FULL);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return (size_t)h;
}

/* The child of `parent` whose first key is `key`, or -1. */
static inline int32_t
child_of(const RouterTree *t, int32_t parent, int64_t key)
{
    size_t i = slot_hash(parent, key) & t->mask;
    for (;;) {
        const Slot *s = &t->table[i];
        if (s->parent < 0) {
            return -1;
        }
        if (s->parent == parent && s->key == key) {
            return s->run;
        }
        i = (i + 1) & t->mask;
    }
}

static int
table_grow(RouterTree *t)
{
    size_t old_size = t->mask + 1, size = old_size * 2;
    Slot *old = t->table, *tab = PyMem_Malloc(size * sizeof(Slot));
    if (tab == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < size; i++) {
        tab[i].parent = -1;
    }
    t->table = tab;
    t->mask = size - 1;
    for (size_t i = 0; i < old_size; i++) {
        if (old[i].parent >= 0) {
            size_t j = slot_hash(old[i].parent, old[i].key) & t->mask;
            while (tab[j].parent >= 0) {
                j = (j + 1) & t->mask;
            }
            tab[j] = old[i];
        }
    }
    PyMem_Free(old);
    return 0;
}

/* parent.children[key] = run (a new entry counts a child of parent; an existing one is replaced,
 * as the dict's item assignment). 0, or -1 with MemoryError. */
static int
child_set(RouterTree *t, int32_t parent, int64_t key, int32_t run)
{
    size_t i;
    if ((t->used + 1) * 4 > (t->mask + 1) * 3 && table_grow(t) < 0) {
        return -1;
    }
    i = slot_hash(parent, key) & t->mask;
    while (t->table[i].parent >= 0) {
        if (t->table[i].parent == parent && t->table[i].key == key) {
            t->table[i].run = run;
            return 0;
        }
        i = (i + 1) & t->mask;
    }
    t->table[i].parent = parent;
    t->table[i].key = key;
    t->table[i].run = run;
    t->used++;
    t->runs[parent].kids++;
    return 0;
}

/* del parent.children[key] (linear probing's backward shift: no tombstones). */
static void
child_del(RouterTree *t, int32_t parent, int64_t key)
{
    size_t i = slot_hash(parent, key) & t->mask, j;
    while (t->table[i].parent >= 0 && !(t->table[i].parent == parent && t->table[i].key == key)) {
        i = (i + 1) & t->mask;
    }
    if (t->table[i].parent < 0) {
        return;
    }
    t->used--;
    t->runs[parent].kids--;
    j = i;
    for (;;) {
        size_t home;
        j = (j + 1) & t->mask;
        if (t->table[j].parent < 0) {
            break;
        }
        home = slot_hash(t->table[j].parent, t->table[j].key) & t->mask;
        /* move j back to i unless its home lies cyclically in (i, j] */
        if ((i <= j) ? (i < home && home <= j) : (i < home || home <= j)) {
            continue;
        }
        t->table[i] = t->table[j];
        i = j;
    }
    t->table[i].parent = -1;
}

/* A new run of `len` keys copied from `keys`: its index, or -1 with MemoryError. */
static int32_t
run_new(RouterTree *t, const int64_t *keys, Py_ssize_t len, int64_t tick, int32_t parent, int32_t rank)
{
    int32_t idx;
    int64_t *buf = PyMem_Malloc((size_t)(len > 0 ? len : 1) * sizeof(int64_t));
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(buf, keys, (size_t)len * sizeof(int64_t));
    if (t->nfree) {
        idx = t->free[--t->nfree];
    } else {
        if (t->nruns == t->cap) {
            Py_ssize_t cap = t->cap * 2;
            Run *r = PyMem_Realloc(t->runs, (size_t)cap * sizeof(Run));
            if (r == NULL || cap > INT32_MAX) {
                if (r != NULL) {
                    t->runs = r;
                }
                PyMem_Free(buf);
                PyErr_NoMemory();
                return -1;
            }
            t->runs = r;
            t->cap = cap;
        }
        idx = (int32_t)t->nruns++;
    }
    t->runs[idx] = (Run){buf, len, tick, parent, rank, 0, 1};
    return idx;
}

static int
run_free(RouterTree *t, int32_t idx)
{
    if (t->nfree == t->free_cap) {
        Py_ssize_t cap = t->free_cap ? t->free_cap * 2 : 64;
        int32_t *f = PyMem_Realloc(t->free, (size_t)cap * sizeof(int32_t));
        if (f == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->free = f;
        t->free_cap = cap;
    }
    PyMem_Free(t->runs[idx].keys);
    t->runs[idx].keys = NULL;
    t->runs[idx].live = 0;
    t->free[t->nfree++] = idx;
    return 0;
}

/* approx_tree._common: how many leading keys of the run equal keys[i:] (at least 1). */
static Py_ssize_t
common(const Run *r, const int64_t *keys, Py_ssize_t i, Py_ssize_t n)
{
    Py_ssize_t lo = 1, hi = r->len < n - i ? r->len : n - i;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        if (keys[i + mid - 1] == r->keys[mid - 1]) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

/* approx_tree._split: the run's first c keys become a new run (the head, returned) in its place
 * under its parent; the run keeps the rest, its tick and children, as the head's only child. */
static int32_t
split(RouterTree *t, int32_t idx, Py_ssize_t c)
{
    Run *r = &t->runs[idx];
    int32_t head;
    int64_t first;
    if (c >= r->len) {
        return idx;
    }
    head = run_new(t, r->keys, c, r->tick, r->parent, r->rank);
    if (head < 0) {
        return -1;
    }
    r = &t->runs[idx];  /* (run_new may move the array) */
    first = r->keys[0];
    memmove(r->keys, r->keys + c, (size_t)(r->len - c) * sizeof(int64_t));
    r->len -= c;
    /* the parent's entry for the first key names the head now (no new child of the parent) */
    if (child_set(t, r->parent, first, head) < 0) {
        return -1;
    }
    r->parent = head;
    if (child_set(t, head, r->keys[0], idx) < 0) {
        return -1;
    }
    return head;
}

/* approx_tree.ApproxTree._path from rank's root: how many leading keys the rank holds; *end the
 * run holding the last of them (the root when none). touch: the runs of the path stamped at
 * tick, the last split first where the path ends inside it. -1 with MemoryError. */
static Py_ssize_t
path(RouterTree *t, int32_t rank, const int64_t *keys, Py_ssize_t n, int touch, int64_t tick, int32_t *end)
{
    int32_t node = rank;
    Py_ssize_t i = 0;
    while (i < n) {
        int32_t child = child_of(t, node, keys[i]);
        Run *r;
        Py_ssize_t m, c;
        if (child < 0) {
            break;
        }
        r = &t->runs[child];
        m = r->len;
        if (i + m <= n && keys[i + m - 1] == r->keys[m - 1]) {
            if (touch) {
                r->tick = tick;
            }
            i += m;
            node = child;
            continue;
        }
        c = common(r, keys, i, n);
        if (touch) {
            child = split(t, child, c);
            if (child < 0) {
                return -1;
            }
            t->runs[child].tick = tick;
        }
        *end = child;
        return i + c;
    }
    *end = node;
    return i;
}

/* ------------------------------------------------------------------------------------------ */

static int
keys_arg(PyObject *obj, Ints *ix)
{
    int got = ints_load(obj, ix);
    if (got == 0) {
        PyErr_SetString(PyExc_TypeError, "RouterTree: keys must be an int64 run or a list of ints that fit in int64");
        return -1;
    }
    return got < 0 ? -1 : 0;
}

static int
int_arg(PyObject *obj, int64_t *x, const char *what)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "RouterTree: %s must be an int", what);
        return -1;
    }
    *x = PyLong_AsLongLong(obj);
    return (*x == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int
rank_arg(RouterTree *t, PyObject *obj, int32_t *rank)
{
    int64_t r;
    if (int_arg(obj, &r, "rank") < 0) {
        return -1;
    }
    if (r < 0 || r >= t->num_ranks) {
        PyErr_Format(PyExc_IndexError, "RouterTree: rank %lld out of range", (long long)r);
        return -1;
    }
    *rank = (int32_t)r;
    return 0;
}

/* insert(keys, rank, tick, held=None): Tree::insert (held, the reference's hint, is not needed). */
static PyObject *
rt_insert(RouterTree *t, PyObject *const *args, Py_ssize_t nargs)
{
    Ints ix;
    int32_t rank, end;
    int64_t tick;
    Py_ssize_t i;
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "insert(keys, rank, tick, held=None)");
        return NULL;
    }
    if (rank_arg(t, args[1], &rank) < 0 || int_arg(args[2], &tick, "tick") < 0) {
        return NULL;
    }
    ints_init(&ix);
    if (keys_arg(args[0], &ix) < 0) {
        return NULL;
    }
    i = path(t, rank, ix.v, ix.n, 1, tick, &end);
    if (i >= 0 && i < ix.n) {
        int32_t run = run_new(t, ix.v + i, ix.n - i, tick, end, rank);
        if (run < 0 || child_set(t, end, ix.v[i], run) < 0) {
            i = -1;
        } else {
            t->pages[rank] += ix.n - i;
        }
    }
    ints_free(&ix);
    if (i < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* touch(keys, rank, tick): the timestamp walk of Tree::prefix_match. */
static PyObject *
rt_touch(RouterTree *t, PyObject *const *args, Py_ssize_t nargs)
{
    Ints ix;
    int32_t rank, end;
    int64_t tick;
    Py_ssize_t i;
    if (wrong_nargs(nargs, 3, "touch(keys, rank, tick)") || rank_arg(t, args[1], &rank) < 0
        || int_arg(args[2], &tick, "tick") < 0) {
        return NULL;
    }
    ints_init(&ix);
    if (keys_arg(args[0], &ix) < 0) {
        return NULL;
    }
    i = path(t, rank, ix.v, ix.n, 1, tick, &end);
    ints_free(&ix);
    if (i < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* prefix_match(keys, tick, *, touch=True) -> (matched, rank or None, [depth a rank]). */
static PyObject *
rt_prefix_match(RouterTree *t, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Ints ix;
    int64_t tick, latest = 0;
    int touch = 1;
    Py_ssize_t depth = 0;
    int32_t chosen = -1, end;
    PyObject *depths, *out;
    typedef struct { Py_ssize_t depth; int32_t end; } Held;
    Held held_small[64], *held = held_small;
    if (nargs != 2 || (kwnames != NULL && (PyTuple_GET_SIZE(kwnames) != 1
                                          || !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))
                                          || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "touch") != 0))) {
        PyErr_SetString(PyExc_TypeError, "prefix_match(keys, tick, *, touch=True)");
        return NULL;
    }
    if (int_arg(args[1], &tick, "tick") < 0) {
        return NULL;
    }
    if (kwnames != NULL && (touch = PyObject_IsTrue(args[2])) < 0) {
        return NULL;
    }
    depths = PyList_New(t->num_ranks);
    if (depths == NULL) {
        return NULL;
    }
    if (t->num_ranks > 64 && (held = PyMem_Malloc((size_t)t->num_ranks * sizeof(Held))) == NULL) {
        Py_DECREF(depths);
        return PyErr_NoMemory();
    }
    ints_init(&ix);
    if (keys_arg(args[0], &ix) < 0) {
        goto fail;
    }
    for (int32_t r = 0; r < t->num_ranks; r++) {
        Py_ssize_t d = path(t, r, ix.v, ix.n, 0, 0, &held[r].end);
        PyObject *x = PyLong_FromSsize_t(d);
        held[r].depth = d;
        if (x == NULL) {
            goto fail_keys;
        }
        PyList_SET_ITEM(depths, r, x);
        if (d > depth) {
            depth = d;
        }
    }
    if (depth > 0) {
        for (int32_t r = 0; r < t->num_ranks; r++) {
            if (held[r].depth == depth) {
                int64_t tk = t->runs[held[r].end].tick;
                if (chosen < 0 || tk > latest) {
                    chosen = r;
                    latest = tk;
                }
            }
        }
        if (touch && path(t, chosen, ix.v, depth, 1, tick, &end) < 0) {
            goto fail_keys;
        }
    }
    ints_free(&ix);
    if (held != held_small) {
        PyMem_Free(held);
    }
    if (depth == 0) {
        out = Py_BuildValue("(nON)", (Py_ssize_t)0, Py_None, depths);
    } else {
        out = Py_BuildValue("(niN)", depth, (int)chosen, depths);
    }
    return out;
fail_keys:
    ints_free(&ix);
fail:
    if (held != held_small) {
        PyMem_Free(held);
    }
    Py_DECREF(depths);
    return NULL;
}

/* A leaf key in the eviction's heap: (tick, key) order; keys are unique in a rank. */
typedef struct {
    int64_t tick, key;
    int32_t run;
} Leaf;

static inline int
leaf_less(const Leaf *a, const Leaf *b)
{
    return a->tick < b->tick || (a->tick == b->tick && a->key < b->key);
}

static void
heap_push(Leaf *h, Py_ssize_t *n, Leaf x)
{
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!leaf_less(&x, &h[p])) {
            break;
        }
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static Leaf
heap_pop(Leaf *h, Py_ssize_t *n)
{
    Leaf top = h[0], x = h[--(*n)];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= *n) {
            break;
        }
        if (c + 1 < *n && leaf_less(&h[c + 1], &h[c])) {
            c++;
        }
        if (!leaf_less(&h[c], &x)) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) {
        h[i] = x;
    }
    return top;
}

/* evict(max_pages) -> entries dropped: per rank over max_pages, its least recently touched leaf
 * keys in (tick, key) order until it holds max_pages (Tree::evict_tenant_by_size). */
static PyObject *
rt_evict(RouterTree *t, PyObject *arg)
{
    int64_t max_pages, dropped = 0;
    if (int_arg(arg, &max_pages, "max_pages") < 0) {
        return NULL;
    }
    for (int32_t rank = 0; rank < t->num_ranks; rank++) {
        Leaf *heap;
        Py_ssize_t n = 0;
        if (t->pages[rank] <= max_pages) {
            continue;
        }
        /* a run holds at least one key, and each push follows a pop or a leaf of the start */
        heap = PyMem_Malloc((size_t)(t->nruns + 1) * sizeof(Leaf));
        if (heap == NULL) {
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = t->num_ranks; i < t->nruns; i++) {
            const Run *r = &t->runs[i];
            if (r->live && r->rank == rank && r->kids == 0) {
                heap_push(heap, &n, (Leaf){r->tick, r->keys[r->len - 1], (int32_t)i});
            }
        }
        while (n && t->pages[rank] > max_pages) {
            Leaf leaf = heap_pop(heap, &n);
            Run *r = &t->runs[leaf.run];
            int32_t parent;
            r->len--;
            t->pages[rank]--;
            dropped++;
            if (r->len) {
                heap_push(heap, &n, (Leaf){r->tick, r->keys[r->len - 1], leaf.run});
                continue;
            }
            parent = r->parent;
            child_del(t, parent, leaf.key);
            if (run_free(t, leaf.run) < 0) {
                PyMem_Free(heap);
                return NULL;
            }
            if (parent >= t->num_ranks && t->runs[parent].kids == 0) {
                const Run *p = &t->runs[parent];
                heap_push(heap, &n, (Leaf){p->tick, p->keys[p->len - 1], parent});
            }
        }
        PyMem_Free(heap);
    }
    return PyLong_FromLongLong(dropped);
}

/* smallest_rank(): the fewest pages, the first rank on a tie (approx_tree.first_smallest). */
static PyObject *
rt_smallest_rank(RouterTree *t, PyObject *Py_UNUSED(ignored))
{
    int32_t rank = 0;
    for (int32_t r = 1; r < t->num_ranks; r++) {
        if (t->pages[r] < t->pages[rank]) {
            rank = r;
        }
    }
    return PyLong_FromLong(rank);
}

/* runs(rank) -> [(run, parent, tick, [keys])] of every run of rank (roots: run == rank, not
 * listed; parent == rank: a child of the root). For the tests' and check()'s walks. */
static PyObject *
rt_runs(RouterTree *t, PyObject *arg)
{
    int32_t rank;
    PyObject *out;
    if (rank_arg(t, arg, &rank) < 0 || (out = PyList_New(0)) == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = t->num_ranks; i < t->nruns; i++) {
        const Run *r = &t->runs[i];
        PyObject *keys, *item;
        if (!r->live || r->rank != rank) {
            continue;
        }
        keys = PyList_New(r->len);
        if (keys == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (Py_ssize_t k = 0; k < r->len; k++) {
            PyObject *x = PyLong_FromLongLong(r->keys[k]);
            if (x == NULL) {
                Py_DECREF(keys);
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(keys, k, x);
        }
        item = Py_BuildValue("(niLN)", i, (int)r->parent, (long long)r->tick, keys);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

/* child(parent, key) -> the run parent's table names for key, or -1 (for check()). */
static PyObject *
rt_child(RouterTree *t, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t parent, key;
    if (wrong_nargs(nargs, 2, "child(parent, key)") || int_arg(args[0], &parent, "parent") < 0
        || int_arg(args[1], &key, "key") < 0) {
        return NULL;
    }
    if (parent < 0 || parent >= t->nruns || !t->runs[parent].live) {
        return PyLong_FromLong(-1);
    }
    return PyLong_FromLong(child_of(t, (int32_t)parent, key));
}

static PyObject *
rt_get_pages(RouterTree *t, void *Py_UNUSED(closure))
{
    PyObject *out = PyList_New(t->num_ranks);
    if (out == NULL) {
        return NULL;
    }
    for (int32_t r = 0; r < t->num_ranks; r++) {
        PyObject *x = PyLong_FromLongLong(t->pages[r]);
        if (x == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, r, x);
    }
    return out;
}

static PyObject *
rt_get_num_ranks(RouterTree *t, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(t->num_ranks);
}

static void
rt_clear_all(RouterTree *t)
{
    if (t->runs != NULL) {
        for (Py_ssize_t i = 0; i < t->nruns; i++) {
            PyMem_Free(t->runs[i].keys);
        }
    }
    PyMem_Free(t->runs);
    PyMem_Free(t->free);
    PyMem_Free(t->table);
    PyMem_Free(t->pages);
    t->runs = NULL;
    t->free = NULL;
    t->table = NULL;
    t->pages = NULL;
}

static PyObject *
rt_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    long n;
    RouterTree *t;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "RouterTree(num_ranks)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "l:RouterTree", &n)) {
        return NULL;
    }
    if (n < 1 || n > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "RouterTree: num_ranks must be 1 .. 2**20");
        return NULL;
    }
    t = (RouterTree *)type->tp_alloc(type, 0);
    if (t == NULL) {
        return NULL;
    }
    t->num_ranks = (int32_t)n;
    t->cap = n + 1024;
    t->runs = PyMem_Calloc((size_t)t->cap, sizeof(Run));
    t->pages = PyMem_Calloc((size_t)n, sizeof(int64_t));
    t->mask = 1023;
    t->table = PyMem_Malloc(1024 * sizeof(Slot));
    if (t->runs == NULL || t->pages == NULL || t->table == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < 1024; i++) {
        t->table[i].parent = -1;
    }
    for (long r = 0; r < n; r++) {
        t->runs[r] = (Run){NULL, 0, 0, -1, (int32_t)r, 0, 1};
    }
    t->nruns = n;
    return (PyObject *)t;
}

static void
rt_dealloc(RouterTree *t)
{
    rt_clear_all(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef rt_methods[] = {
    {"insert", (PyCFunction)(void (*)(void))rt_insert, METH_FASTCALL, "insert(keys, rank, tick, held=None)"},
    {"touch", (PyCFunction)(void (*)(void))rt_touch, METH_FASTCALL, "touch(keys, rank, tick)"},
    {"prefix_match", (PyCFunction)(void (*)(void))rt_prefix_match, METH_FASTCALL | METH_KEYWORDS,
     "prefix_match(keys, tick, *, touch=True) -> (matched, rank or None, depths)"},
    {"evict", (PyCFunction)rt_evict, METH_O, "evict(max_pages) -> entries dropped"},
    {"smallest_rank", (PyCFunction)rt_smallest_rank, METH_NOARGS, "smallest_rank() -> rank"},
    {"runs", (PyCFunction)rt_runs, METH_O, "runs(rank) -> [(run, parent, tick, keys)]"},
    {"child", (PyCFunction)(void (*)(void))rt_child, METH_FASTCALL, "child(parent, key) -> run or -1"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rt_getset[] = {
    {"pages", (getter)rt_get_pages, NULL, "pages each rank holds (a new list)", NULL},
    {"num_ranks", (getter)rt_get_num_ranks, NULL, "ranks", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject cp_RouterTreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.RouterTree",
    .tp_doc = PyDoc_STR("RouterTree(num_ranks): cache_aware's approximate tree as runs in C (routing/approx_tree.py)."),
    .tp_basicsize = sizeof(RouterTree),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = rt_new,
    .tp_dealloc = (destructor)rt_dealloc,
    .tp_methods = rt_methods,
    .tp_getset = rt_getset,
};
