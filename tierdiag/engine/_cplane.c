/* The compiled CPU data plane: page moves, page content, its verification and a pool's slot
 * bookkeeping, straight on the pools' memory (the buffer protocol: numpy arrays, bytearrays) and
 * on the engine's slot lists.
 *
 * The numpy implementations (rows.py, pools.py) are the reference and the fallback. Every
 * function here either does all of its work or, having changed nothing, returns -1 ("not my
 * case"): a page out of range, a slot not owned, a list of something else than ints, a geometry
 * it does not know, pools that overlap. The Python wrapper then runs the numpy path, which moves
 * the bytes or raises the error message the engine has always raised. So this file never builds
 * an error message of its own for bad input; it only has to check before it writes.
 *
 * Row views (rows.array_rows): a pool is a C-contiguous [L, P] array of row items of rb bytes,
 * row (l, p) at byte (l * P + p) * rb. Layer-first pools have L layers of one layer's page a
 * row; page-first pools are [1, P] items of a whole page (its layers in order).
 *
 * The GIL is held throughout: every call is short (a few to a few thousand pages).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* Bumped whenever a signature or a semantic changes: tierdiag/engine/cplane.py refuses a stale
 * build (an editable install's .so compiled from an older source) instead of misusing it. */
#define CPLANE_API 2

/* Page lists up to this long are held on the C stack (the engine's common case). */
#define SMALL_LIST 256

/* page_content_np: mix(key) = key * golden ratio, modulo 2**64 (pools._MIX) */
#define MIX UINT64_C(0x9E3779B97F4A7C15)
#define LAYER_MUL UINT64_C(1000003)
#define COL_MUL UINT64_C(2654435761)

/* ------------------------------------------------------------------------------------------ */
/* Page lists as int64 values                                                                  */

typedef struct {
    int64_t *v;
    Py_ssize_t n;
    int64_t small[SMALL_LIST];
} Ints;

static void
ints_init(Ints *ix)
{
    ix->v = ix->small;
    ix->n = 0;
}

static void
ints_free(Ints *ix)
{
    if (ix->v != ix->small) {
        PyMem_Free(ix->v);
    }
    ix->v = ix->small;
    ix->n = 0;
}

/* Room for n values: 0, or -1 with MemoryError set. */
static int
ints_reserve(Ints *ix, Py_ssize_t n)
{
    if (n <= SMALL_LIST) {
        return 0;
    }
    if ((size_t)n > PY_SSIZE_T_MAX / sizeof(int64_t)) {
        PyErr_NoMemory();
        return -1;
    }
    ix->v = PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (ix->v == NULL) {
        ix->v = ix->small;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Whether a PEP 3118 format names a native signed 8-byte integer (numpy int64/intp: "l" on
 * LP64, "q"; "n" is Py_ssize_t). The item size is checked separately. */
static int
is_int64_format(const char *fmt)
{
    if (fmt == NULL) {
        return 0;
    }
    if (fmt[0] == '@') {
        fmt++;
    }
    return (fmt[0] == 'l' || fmt[0] == 'q' || fmt[0] == 'n') && fmt[1] == '\0';
}

/* Load a page list: a list or tuple of ints, a range, or a 1-D C-contiguous buffer of native
 * int64 (a numpy array). Returns 1 loaded, 0 not a list this module takes (nothing set: the
 * caller falls back to numpy, which raises whatever it raises for it), -1 on MemoryError. */
static int
ints_load(PyObject *obj, Ints *ix)
{
    ints_init(ix);
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        /* Nothing below runs Python code (only exact ints and their subclasses are read, never
         * through __index__), so the list cannot change under the loop. */
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        PyObject **items = PySequence_Fast_ITEMS(obj);
        if (ints_reserve(ix, n) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = items[i];
            int overflow = 0;
            long long x;
            if (!PyLong_Check(item)) {
                ints_free(ix);
                return 0;
            }
            x = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow) {
                ints_free(ix);
                return 0;
            }
            if (x == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                ints_free(ix);
                return 0;
            }
            ix->v[i] = (int64_t)x;
        }
        ix->n = n;
        return 1;
    }
    if (PyRange_Check(obj)) {
        /* start, stop and step as int64 (else not a page list: numpy's arange would refuse it
         * too); every value lies between start and stop, so none overflows. */
        static const char *const names[3] = {"start", "stop", "step"};
        long long bounds[3];
        Py_ssize_t n = PyObject_Length(obj);
        if (n < 0) { /* longer than Py_ssize_t */
            PyErr_Clear();
            return 0;
        }
        for (int k = 0; k < 3; k++) {
            PyObject *v = PyObject_GetAttrString(obj, names[k]);
            if (v == NULL) {
                PyErr_Clear();
                return 0;
            }
            bounds[k] = PyLong_AsLongLong(v);
            Py_DECREF(v);
            if (bounds[k] == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        }
        if (ints_reserve(ix, n) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            ix->v[i] = (int64_t)((uint64_t)bounds[0] + (uint64_t)i * (uint64_t)bounds[2]);
        }
        ix->n = n;
        return 1;
    }
    if (PyObject_CheckBuffer(obj)) {
        Py_buffer b;
        if (PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            return 0;
        }
        if (b.ndim != 1 || b.itemsize != (Py_ssize_t)sizeof(int64_t) || !is_int64_format(b.format)) {
            PyBuffer_Release(&b);
            return 0;
        }
        Py_ssize_t n = b.shape[0];
        if (ints_reserve(ix, n) < 0) {
            PyBuffer_Release(&b);
            return -1;
        }
        if (n) {
            memcpy(ix->v, b.buf, (size_t)n * sizeof(int64_t));
        }
        ix->n = n;
        PyBuffer_Release(&b);
        return 1;
    }
    return 0;
}

/* Whether every value is a slot of a pool of num_pages. */
static int
all_in_range(const Ints *ix, Py_ssize_t num_pages)
{
    for (Py_ssize_t i = 0; i < ix->n; i++) {
        if (ix->v[i] < 0 || ix->v[i] >= (int64_t)num_pages) {
            return 0;
        }
    }
    return 1;
}

/* A row view: 2-D, C-contiguous. Returns 1 got it, 0 not a row view (nothing set). */
static int
get_rows(PyObject *obj, Py_buffer *b, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (b->ndim != 2 || b->itemsize <= 0 || b->shape[0] <= 0) {
        PyBuffer_Release(b);
        return 0;
    }
    return 1;
}

static PyObject *
not_mine(void)
{
    return PyLong_FromLong(-1);
}

/* ------------------------------------------------------------------------------------------ */
/* move(src_rows, src_pages, dst_rows, dst_pages) -> count_runs(src_pages), or -1              */

PyDoc_STRVAR(move_doc,
"move(src_rows, src_pages, dst_rows, dst_pages) -> int\n\n"
"dst_rows[:, dst_pages[i]] = src_rows[:, src_pages[i]] for every i, one memcpy a run of pages\n"
"consecutive on both sides in every layer; every page is range-checked before a byte moves.\n"
"Returns count_runs(src_pages), or -1 having moved nothing when the case is the numpy path's\n"
"(lengths or geometries that differ, a page outside a pool, overlapping pools, a list of\n"
"anything but ints).");

static PyObject *
cp_move(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer sb, db;
    Ints s, d;
    Py_ssize_t n, nd, layers, rb, sp, dp, runs;
    const char *src;
    char *dst;
    PyObject *result = NULL;
    int got;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "move() takes 4 arguments");
        return NULL;
    }
    n = PyObject_Length(args[1]);
    nd = PyObject_Length(args[3]);
    if (n < 0 || nd < 0) {
        PyErr_Clear();
        return not_mine();
    }
    if (n != nd) {
        return not_mine();
    }
    if (n == 0) {
        return PyLong_FromLong(0);
    }
    if (!get_rows(args[0], &sb, 0)) {
        return not_mine();
    }
    if (!get_rows(args[2], &db, 1)) {
        PyBuffer_Release(&sb);
        return not_mine();
    }
    ints_init(&s);
    ints_init(&d);
    layers = sb.shape[0];
    rb = sb.itemsize;
    sp = sb.shape[1];
    dp = db.shape[1];
    src = sb.buf;
    dst = db.buf;
    if (db.shape[0] != layers || db.itemsize != rb
        /* the pools overlap (a move inside one pool): numpy reads every row before writing */
        || ((uintptr_t)src < (uintptr_t)dst + (uintptr_t)db.len
            && (uintptr_t)dst < (uintptr_t)src + (uintptr_t)sb.len)) {
        result = not_mine();
        goto done;
    }
    got = ints_load(args[1], &s);
    if (got == 1) {
        got = ints_load(args[3], &d);
    }
    if (got < 0) {
        goto done;
    }
    if (got == 0 || s.n != n || d.n != n || !all_in_range(&s, sp) || !all_in_range(&d, dp)) {
        result = not_mine();
        goto done;
    }
    runs = 0;
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t j = i + 1;
        while (j < n && s.v[j] == s.v[j - 1] + 1 && d.v[j] == d.v[j - 1] + 1) {
            j++;
        }
        for (Py_ssize_t l = 0; l < layers; l++) {
            memcpy(dst + (l * dp + (Py_ssize_t)d.v[i]) * rb, src + (l * sp + (Py_ssize_t)s.v[i]) * rb,
                   (size_t)((j - i) * rb));
        }
        i = j;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        runs += (i == 0 || s.v[i] != s.v[i - 1] + 1);
    }
    result = PyLong_FromSsize_t(runs);
done:
    ints_free(&s);
    ints_free(&d);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* page content: value(key, layer, col) = (key * MIX) ^ (layer * 1000003) ^ (col * 2654435761)  */

/* Where (layer l, page p) starts and how far apart layers and pages are, in int64s. */
typedef struct {
    int64_t *base;
    Py_ssize_t layers, elems, pages;
    Py_ssize_t layer_stride, page_stride;
} Content;

/* The pool's layout from its row view and the data plane's (layers, elems): layer-first [L, P]
 * rows of elems int64s, or page-first [1, P] rows of layers * elems. 1 known, 0 not (released). */
static int
content_geometry(Py_buffer *b, PyObject *layers_o, PyObject *elems_o, Content *c)
{
    Py_ssize_t layers = PyLong_AsSsize_t(layers_o);
    Py_ssize_t elems = PyLong_AsSsize_t(elems_o);
    if ((layers == -1 || elems == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (layers <= 0 || elems <= 0 || ((uintptr_t)b->buf % sizeof(int64_t)) != 0
        || elems > PY_SSIZE_T_MAX / 8 / layers) {
        return 0;
    }
    c->base = b->buf;
    c->layers = layers;
    c->elems = elems;
    c->pages = b->shape[1];
    if (b->shape[0] == layers && b->itemsize == elems * 8) { /* layer-first */
        c->layer_stride = c->pages * elems;
        c->page_stride = elems;
        return 1;
    }
    if (b->shape[0] == 1 && b->itemsize == layers * elems * 8) { /* page-first */
        c->layer_stride = elems;
        c->page_stride = layers * elems;
        return 1;
    }
    return 0;
}

/* Shared by write_content and verify_content: the row view, slots and keys, checked.
 * Returns 1 ready, 0 not mine (all released), -1 error (all released). */
static int
content_args(PyObject *const *args, Py_ssize_t nargs, int writable, Py_buffer *b, Content *c,
             Ints *slots, Ints *keys)
{
    int got;
    ints_init(slots);
    ints_init(keys);
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "takes 5 arguments: rows, slots, keys, num_layers, page_elems");
        return -1;
    }
    if (!get_rows(args[0], b, writable)) {
        return 0;
    }
    if (!content_geometry(b, args[3], args[4], c)) {
        PyBuffer_Release(b);
        return 0;
    }
    got = ints_load(args[1], slots);
    if (got == 1) {
        got = ints_load(args[2], keys);
    }
    if (got == 1 && (slots->n != keys->n || !all_in_range(slots, c->pages))) {
        got = 0;
    }
    if (got != 1) {
        ints_free(slots);
        ints_free(keys);
        PyBuffer_Release(b);
    }
    return got;
}

PyDoc_STRVAR(write_content_doc,
"write_content(rows, slots, keys, num_layers, page_elems) -> int\n\n"
"Write into slots[i] of a pool's row view what pools.page_content_np(keys) holds for keys[i],\n"
"in the pool's layout (layer-first or page-first), generated in place. Returns 1, or -1\n"
"having written nothing (a slot outside the pool, a key that is not an int64, an unknown\n"
"geometry, lengths that differ).");

static PyObject *
cp_write_content(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    Content c;
    Ints slots, keys;
    int got = content_args(args, nargs, 1, &b, &c, &slots, &keys);
    if (got <= 0) {
        return got < 0 ? NULL : not_mine();
    }
    for (Py_ssize_t i = 0; i < slots.n; i++) {
        uint64_t mixed = (uint64_t)keys.v[i] * MIX;
        int64_t *page = c.base + (Py_ssize_t)slots.v[i] * c.page_stride;
        for (Py_ssize_t l = 0; l < c.layers; l++) {
            int64_t *row = page + l * c.layer_stride;
            uint64_t lm = mixed ^ ((uint64_t)l * LAYER_MUL);
            for (Py_ssize_t e = 0; e < c.elems; e++) {
                row[e] = (int64_t)(lm ^ ((uint64_t)e * COL_MUL));
            }
        }
    }
    ints_free(&slots);
    ints_free(&keys);
    PyBuffer_Release(&b);
    return PyLong_FromLong(1);
}

PyDoc_STRVAR(verify_content_doc,
"verify_content(rows, slots, keys, num_layers, page_elems) -> int\n\n"
"1 if slots[i] of the pool hold exactly what write_content writes for keys[i] (compared in\n"
"place), 0 if a byte differs, -1 when the case is the numpy path's (as write_content).");

static PyObject *
cp_verify_content(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    Content c;
    Ints slots, keys;
    long same = 1;
    int got = content_args(args, nargs, 0, &b, &c, &slots, &keys);
    if (got <= 0) {
        return got < 0 ? NULL : not_mine();
    }
    for (Py_ssize_t i = 0; i < slots.n && same; i++) {
        uint64_t mixed = (uint64_t)keys.v[i] * MIX;
        const int64_t *page = c.base + (Py_ssize_t)slots.v[i] * c.page_stride;
        for (Py_ssize_t l = 0; l < c.layers && same; l++) {
            const int64_t *row = page + l * c.layer_stride;
            uint64_t lm = mixed ^ ((uint64_t)l * LAYER_MUL);
            uint64_t diff = 0;
            for (Py_ssize_t e = 0; e < c.elems; e++) {
                diff |= (uint64_t)row[e] ^ (lm ^ ((uint64_t)e * COL_MUL));
            }
            same = diff == 0;
        }
    }
    ints_free(&slots);
    ints_free(&keys);
    PyBuffer_Release(&b);
    return PyLong_FromLong(same);
}

/* ------------------------------------------------------------------------------------------ */
/* PagePool's free-slot stack (intp, top at `top`) and ownership bytes (one a slot)             */

/* The stack (1-D, C-contiguous, items of Py_ssize_t) and the owned bytes, both writable.
 * 1 got them, 0 not (released). */
static int
get_pool(PyObject *stack_o, PyObject *owned_o, Py_buffer *stack, Py_buffer *owned)
{
    if (PyObject_GetBuffer(stack_o, stack, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (stack->ndim > 1 || stack->itemsize != (Py_ssize_t)sizeof(Py_ssize_t)) {
        PyBuffer_Release(stack);
        return 0;
    }
    if (PyObject_GetBuffer(owned_o, owned, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(stack);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(alloc_doc,
"alloc(stack, owned, top, n) -> list[int]\n\n"
"Pop n slots off the free stack (stack[:top] are free, the top last), mark them owned and\n"
"return them, the top first: stack[top-1], stack[top-2], ... The caller keeps top - n.\n"
"0 < n <= top is the caller's to ensure (ValueError otherwise); a stacked slot outside the\n"
"pool is a pool bug (AssertionError), found before anything is marked.");

static PyObject *
cp_alloc(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer stack, owned;
    Py_ssize_t top, n, cap, depth;
    const Py_ssize_t *st;
    unsigned char *own;
    PyObject *out = NULL;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "alloc() takes 4 arguments: stack, owned, top, n");
        return NULL;
    }
    top = PyLong_AsSsize_t(args[2]);
    if (top == -1 && PyErr_Occurred()) {
        return NULL;
    }
    n = PyLong_AsSsize_t(args[3]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!get_pool(args[0], args[1], &stack, &owned)) {
        PyErr_SetString(PyExc_TypeError, "alloc(): stack must be a writable intp buffer, owned a writable byte buffer");
        return NULL;
    }
    st = stack.buf;
    own = owned.buf;
    cap = owned.len;
    depth = stack.len / stack.itemsize;
    if (n <= 0 || top > depth || n > top) {
        PyErr_Format(PyExc_ValueError, "alloc(): %zd slots off a stack of %zd (%zd deep)", n, top, depth);
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t slot = st[top - 1 - j];
        if (slot < 0 || slot >= cap) {
            PyErr_Format(PyExc_AssertionError, "free stack holds slot %zd of a pool of %zd (a pool bug)", slot, cap);
            goto done;
        }
    }
    out = PyList_New(n);
    if (out == NULL) {
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = PyLong_FromSsize_t(st[top - 1 - j]);
        if (v == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, j, v);
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        own[st[top - 1 - j]] = 1;
    }
done:
    PyBuffer_Release(&stack);
    PyBuffer_Release(&owned);
    return out;
}

PyDoc_STRVAR(free_doc,
"free(stack, owned, top, slots) -> int\n\n"
"Prove every slot owned and named once, then clear their owned bytes and push them onto the\n"
"free stack reversed (so the next alloc of as many hands out the same list). Returns the new\n"
"top, or -1 having changed nothing (a slot not owned, outside the pool, or twice in the list;\n"
"a list of anything but ints): the caller's numpy path names the slot and raises.");

static PyObject *
cp_free(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer stack, owned;
    Ints ix;
    Py_ssize_t top, cap, depth, n, i;
    Py_ssize_t *st;
    unsigned char *own;
    PyObject *result = NULL;
    int got;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "free() takes 4 arguments: stack, owned, top, slots");
        return NULL;
    }
    top = PyLong_AsSsize_t(args[2]);
    if (top == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyList_CheckExact(args[3]) && !PyTuple_CheckExact(args[3])) {
        return not_mine();
    }
    got = ints_load(args[3], &ix);
    if (got <= 0) {
        return got < 0 ? NULL : not_mine();
    }
    if (!get_pool(args[0], args[1], &stack, &owned)) {
        ints_free(&ix);
        return not_mine();
    }
    st = stack.buf;
    own = owned.buf;
    cap = owned.len;
    depth = stack.len / stack.itemsize;
    n = ix.n;
    if (top < 0 || top > depth || n > depth - top) {
        result = not_mine();
        goto done;
    }
    /* Owned and named once: mark each slot 2 as it is seen; a slot seen twice, or not 1, stops
     * the free and the marks made so far go back to 1 (they were 1: each was checked). */
    for (i = 0; i < n; i++) {
        int64_t slot = ix.v[i];
        if (slot < 0 || slot >= (int64_t)cap || own[slot] != 1) {
            break;
        }
        own[slot] = 2;
    }
    if (i < n) {
        for (Py_ssize_t j = 0; j < i; j++) {
            own[ix.v[j]] = 1;
        }
        result = not_mine();
        goto done;
    }
    for (i = 0; i < n; i++) {
        own[ix.v[i]] = 0;
        st[top + i] = (Py_ssize_t)ix.v[n - 1 - i];
    }
    result = PyLong_FromSsize_t(top + n);
done:
    ints_free(&ix);
    PyBuffer_Release(&stack);
    PyBuffer_Release(&owned);
    return result;
}


/* ------------------------------------------------------------------------------------------ */
/* storage_key_chain(keys, prev) -> [digest, ...], or -1                                      */
/* trace/pages.py storage_key_chain: sha256(previous digest || key as 8 little-endian bytes,   */
/* two's complement), a page after the other. Each message is 8 or 40 bytes: one block.       */

static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

/* The digest of one message of len <= 55 bytes (FIPS 180-4: one padded block). */
static void
sha256_short(const unsigned char *msg, size_t len, unsigned char out[32])
{
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char block[64];
    uint32_t w[64], v[8];
    uint64_t bits = (uint64_t)len * 8;
    int i;

    memset(block, 0, sizeof block);
    memcpy(block, msg, len);
    block[len] = 0x80;
    for (i = 0; i < 8; i++) {
        block[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    }
    for (i = 0; i < 16; i++) {
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
               (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
    }
    for (i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, H0, sizeof v);
    for (i = 0; i < 64; i++) {
        uint32_t S1 = ROTR(v[4], 6) ^ ROTR(v[4], 11) ^ ROTR(v[4], 25);
        uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
        uint32_t t1 = v[7] + S1 + ch + SHA_K[i] + w[i];
        uint32_t S0 = ROTR(v[0], 2) ^ ROTR(v[0], 13) ^ ROTR(v[0], 22);
        uint32_t maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
        uint32_t t2 = S0 + maj;
        v[7] = v[6];
        v[6] = v[5];
        v[5] = v[4];
        v[4] = v[3] + t1;
        v[3] = v[2];
        v[2] = v[1];
        v[1] = v[0];
        v[0] = t1 + t2;
    }
    for (i = 0; i < 8; i++) {
        uint32_t h = H0[i] + v[i];
        out[4 * i] = (unsigned char)(h >> 24);
        out[4 * i + 1] = (unsigned char)(h >> 16);
        out[4 * i + 2] = (unsigned char)(h >> 8);
        out[4 * i + 3] = (unsigned char)h;
    }
}

PyDoc_STRVAR(storage_key_chain_doc,
"storage_key_chain(keys, prev) -> list of 32-byte digests, or -1\n\n"
"trace.pages.storage_key_chain: sha256(previous digest + key as 8 little-endian bytes, two's\n"
"complement), the first after `prev` (b'' or a 32-byte digest). -1 (nothing made) for keys\n"
"that are not a list of int64s or a `prev` of another length: the caller's Python chain.");

static PyObject *
cp_storage_key_chain(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Ints ix;
    unsigned char msg[40];
    size_t at;
    Py_ssize_t prev_len, i;
    PyObject *out;
    int got;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "storage_key_chain() takes 2 arguments: keys, prev");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[1])) {
        return not_mine();
    }
    prev_len = PyBytes_GET_SIZE(args[1]);
    if (prev_len != 0 && prev_len != 32) {
        return not_mine();
    }
    if (!PyList_CheckExact(args[0]) && !PyTuple_CheckExact(args[0])) {
        return not_mine();
    }
    got = ints_load(args[0], &ix);
    if (got <= 0) {
        return got < 0 ? NULL : not_mine();
    }
    out = PyList_New(ix.n);
    if (out == NULL) {
        ints_free(&ix);
        return NULL;
    }
    memcpy(msg, PyBytes_AS_STRING(args[1]), (size_t)prev_len);
    at = (size_t)prev_len;
    for (i = 0; i < ix.n; i++) {
        uint64_t k = (uint64_t)ix.v[i];
        unsigned char digest[32];
        PyObject *item;
        for (int b = 0; b < 8; b++) {
            msg[at + (size_t)b] = (unsigned char)(k >> (8 * b));
        }
        sha256_short(msg, at + 8, digest);
        item = PyBytes_FromStringAndSize((const char *)digest, 32);
        if (item == NULL) {
            Py_DECREF(out);
            ints_free(&ix);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
        memcpy(msg, digest, 32);
        at = 32;
    }
    ints_free(&ix);
    return out;
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef cplane_methods[] = {
    {"move", (PyCFunction)(void (*)(void))cp_move, METH_FASTCALL, move_doc},
    {"write_content", (PyCFunction)(void (*)(void))cp_write_content, METH_FASTCALL, write_content_doc},
    {"verify_content", (PyCFunction)(void (*)(void))cp_verify_content, METH_FASTCALL, verify_content_doc},
    {"alloc", (PyCFunction)(void (*)(void))cp_alloc, METH_FASTCALL, alloc_doc},
    {"free", (PyCFunction)(void (*)(void))cp_free, METH_FASTCALL, free_doc},
    {"storage_key_chain", (PyCFunction)(void (*)(void))cp_storage_key_chain, METH_FASTCALL, storage_key_chain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cplane_module = {
    PyModuleDef_HEAD_INIT,
    "_cplane",
    "The compiled CPU data plane (tierdiag/engine/cplane.py chooses it; rows.py and pools.py\n"
    "hold the numpy reference it falls back to).",
    -1,
    cplane_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__cplane(void)
{
    PyObject *m = PyModule_Create(&cplane_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "API", CPLANE_API) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
