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

/* Bumped whenever a signature or a semantic changes: tierdiag/native/cplane.py refuses a stale
 * build (an editable install's .so compiled from an older source) instead of misusing it. */
#define CPLANE_API 5

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

/* 1 (TypeError set, saying `message`) unless a call got `want` arguments. */
static int
wrong_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *message)
{
    if (nargs == want) {
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, message);
    return 1;
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

    if (wrong_nargs(nargs, 4, "move() takes 4 arguments")) {
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
/* block_page_keys(hash_ids, num_pages, per_block) -> bytearray of int64 page keys, or -1      */

PyDoc_STRVAR(block_page_keys_doc,
"block_page_keys(hash_ids, num_pages, per_block) -> bytearray\n\n"
"trace.pages._keys_from_hash_ids as native int64s: page j of block b is\n"
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
/* gather_pages(src_rows, pages) -> bytearray of the pages page-major, or -1                   */

PyDoc_STRVAR(gather_pages_doc,
"gather_pages(src_rows, pages) -> bytearray\n\n"
"The pages `pages` of a pool's row view, page-major: page i's rows of every layer in order\n"
"(np.ascontiguousarray(src_rows.take(pages, axis=1).T), the bytes a storage segment holds).\n"
"Every page is range-checked before a byte is copied. -1 when the case is the numpy path's (a\n"
"page outside the pool, a list of anything but ints, not a row view).");

static PyObject *
cp_gather_pages(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer sb;
    Ints s;
    Py_ssize_t layers, rb, sp;
    const char *src;
    char *out;
    PyObject *result = NULL;
    int got;

    if (wrong_nargs(nargs, 2, "gather_pages() takes 2 arguments")) {
        return NULL;
    }
    if (!get_rows(args[0], &sb, 0)) {
        return not_mine();
    }
    layers = sb.shape[0];
    rb = sb.itemsize;
    sp = sb.shape[1];
    src = sb.buf;
    got = ints_load(args[1], &s);
    if (got < 0) {
        goto done;
    }
    if (got == 0 || !all_in_range(&s, sp)) {
        result = not_mine();
        goto done;
    }
    if (s.n > PY_SSIZE_T_MAX / layers / rb) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyByteArray_FromStringAndSize(NULL, s.n * layers * rb);
    if (result == NULL) {
        goto done;
    }
    out = PyByteArray_AS_STRING(result);
    if (layers == 1) {  /* page-first rows: whole pages, a memcpy a run of consecutive ones */
        for (Py_ssize_t i = 0; i < s.n;) {
            Py_ssize_t j = i + 1;
            while (j < s.n && s.v[j] == s.v[j - 1] + 1) j++;
            memcpy(out + i * rb, src + (Py_ssize_t)s.v[i] * rb, (size_t)((j - i) * rb));
            i = j;
        }
    } else {
        for (Py_ssize_t i = 0; i < s.n; i++) {
            const char *page = src + (Py_ssize_t)s.v[i] * rb;
            for (Py_ssize_t l = 0; l < layers; l++) {
                memcpy(out + (i * layers + l) * rb, page + l * sp * rb, (size_t)rb);
            }
        }
    }
done:
    ints_free(&s);
    PyBuffer_Release(&sb);
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
    if (wrong_nargs(nargs, 5, "takes 5 arguments: rows, slots, keys, num_layers, page_elems")) {
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

    if (wrong_nargs(nargs, 4, "alloc() takes 4 arguments: stack, owned, top, n")) {
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

    if (wrong_nargs(nargs, 4, "free() takes 4 arguments: stack, owned, top, slots")) {
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

/* The same digest by the x86 SHA extensions (SHA-NI: AMD Zen, Intel since Ice Lake / Goldmont),
 * where the CPU has them (CPUID, checked once at import): the 64 rounds by sha256rnds2, the
 * message schedule by sha256msg1/msg2, ~4x fewer cycles than the portable rounds above, which
 * stay the reference (tests/engine/test_cplane.py checks both against hashlib). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_NI_BUILD 1

static int
cpu_has_sha_ni(void)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9))) {
        return 0;  /* SSE4.1 (blend) and SSSE3 (byte shuffle) */
    }
    if (__get_cpuid_max(0, NULL) < 7) {
        return 0;
    }
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1;
}

__attribute__((target("sha,sse4.1,ssse3")))
static void
sha256_short_ni(const unsigned char *msg, size_t len, unsigned char out[32])
{
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char block[64];
    uint64_t bits = (uint64_t)len * 8;
    const __m128i bswap = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
    __m128i w[4], abef, cdgh, abef0, cdgh0, t;
    int i;

    memset(block, 0, sizeof block);
    memcpy(block, msg, len);
    block[len] = 0x80;
    for (i = 0; i < 8; i++) {
        block[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    }
    /* H0..H3 = A B C D and H4..H7 = E F G H (lane 0 first) into the ABEF / CDGH lane order the
     * round instructions take: ABEF holds A in lane 3, B 2, E 1, F 0; CDGH likewise. */
    t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&H0[0]), 0xB1);     /* C D A B -> lanes B A D C */
    cdgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&H0[4]), 0x1B);  /* H G F E */
    abef = _mm_alignr_epi8(t, cdgh, 8);
    cdgh = _mm_blend_epi16(cdgh, t, 0xF0);
    abef0 = abef;
    cdgh0 = cdgh;
    for (i = 0; i < 16; i++) {
        __m128i m;
        if (i < 4) {
            w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 16 * i)), bswap);
        } else {
            /* W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16], four at a time */
            __m128i x = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
            x = _mm_add_epi32(x, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
            w[i & 3] = _mm_sha256msg2_epu32(x, w[(i + 3) & 3]);
        }
        m = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)&SHA_K[4 * i]));
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);
        abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(m, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
    /* back to A..D and E..H, big-endian bytes */
    t = _mm_shuffle_epi32(abef, 0x1B);                  /* F E B A */
    cdgh = _mm_shuffle_epi32(cdgh, 0xB1);               /* D C H G */
    abef = _mm_blend_epi16(t, cdgh, 0xF0);              /* D C B A */
    cdgh = _mm_alignr_epi8(cdgh, t, 8);                 /* H G F E */
    _mm_storeu_si128((__m128i *)out, _mm_shuffle_epi8(abef, bswap));
    _mm_storeu_si128((__m128i *)(out + 16), _mm_shuffle_epi8(cdgh, bswap));
}
#endif

/* 1 where the SHA extensions are used (decided at import; use_portable_sha256 turns them off
 * for the tests of the portable rounds). */
static int use_sha_ni = 0;

static void
sha256_digest(const unsigned char *msg, size_t len, unsigned char out[32])
{
#ifdef HAVE_SHA_NI_BUILD
    if (use_sha_ni) {
        sha256_short_ni(msg, len, out);
        return;
    }
#endif
    sha256_short(msg, len, out);
}

PyDoc_STRVAR(sha256_impl_doc,
"sha256_impl(portable=None) -> 'sha-ni' or 'portable'\n\n"
"Which SHA-256 storage_key_chain uses; portable=True forces the portable rounds, False\n"
"goes back to the SHA extensions where the CPU has them (for the tests of both).");

static PyObject *
cp_sha256_impl(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "sha256_impl() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        int portable = PyObject_IsTrue(args[0]);
        if (portable < 0) {
            return NULL;
        }
#ifdef HAVE_SHA_NI_BUILD
        use_sha_ni = !portable && cpu_has_sha_ni();
#endif
    }
    return PyUnicode_FromString(use_sha_ni ? "sha-ni" : "portable");
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

    if (wrong_nargs(nargs, 2, "storage_key_chain() takes 2 arguments: keys, prev")) {
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
        sha256_digest(msg, at + 8, digest);
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
/* lookup_prefix(mapping, keys) -> [mapping[k] for the leading keys found], or -1               */

PyDoc_STRVAR(lookup_prefix_doc,
"lookup_prefix(mapping, keys) -> list, or -1\n\n"
"[mapping[k] for k in keys], stopping before the first key not in mapping (pools.lookup_prefix:\n"
"the storage keys already known of a request's pages). -1 (nothing made) unless mapping is a\n"
"dict and keys a list of ints: the caller's Python loop then.");

static PyObject *
cp_lookup_prefix(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *d, *keys, *out;
    Py_ssize_t n, i;
    if (wrong_nargs(nargs, 2, "lookup_prefix() takes 2 arguments: mapping, keys")) {
        return NULL;
    }
    d = args[0];
    keys = args[1];
    if (!PyDict_CheckExact(d) || !PyList_CheckExact(keys)) {
        return not_mine();
    }
    n = PyList_GET_SIZE(keys);
    for (i = 0; i < n; i++) {  /* ints hash and compare without running Python code */
        if (!PyLong_CheckExact(PyList_GET_ITEM(keys, i))) {
            return not_mine();
        }
    }
    if ((out = PyList_New(0)) == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *v = PyDict_GetItemWithError(d, PyList_GET_ITEM(keys, i));
        if (v == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(out);
                return NULL;
            }
            break;
        }
        if (PyList_Append(out, v) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

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
/* map_set(dense, keys, value) -> 0, or -1                                                     */

PyDoc_STRVAR(map_set_doc,
"map_set(dense, keys, value) -> 0, or -1\n\n"
"PageMap.set_many's common case on its array (a 1-D native int32 buffer, writable): dense[k] =\n"
"value for every key, a negative key (an output page) skipped. -1, having changed nothing, if\n"
"a key is past the array's end, the value outside [0, 2**31) or an argument of another type:\n"
"PageMap's Python path then (it grows the array, or keeps the key in its dict).");

static PyObject *
cp_map_set(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    Ints keys;
    long long value;
    int loaded;
    Py_ssize_t i, n;
    if (wrong_nargs(nargs, 3, "map_set() takes 3 arguments: dense, keys, value")) {
        return NULL;
    }
    if (!PyLong_CheckExact(args[2])) {
        return not_mine();
    }
    value = PyLong_AsLongLong(args[2]);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    if (value < 0 || value > INT32_MAX) {
        return not_mine();
    }
    if (!int32_view(args[0], &b, PyBUF_WRITABLE)) {
        return not_mine();
    }
    loaded = ints_load(args[1], &keys);
    if (loaded <= 0) {
        PyBuffer_Release(&b);
        return loaded < 0 ? NULL : not_mine();
    }
    int32_t *dense = (int32_t *)b.buf;
    const Py_ssize_t len = b.len / 4;
    n = keys.n;
    for (i = 0; i < n; i++) {  /* every key checked before one is stored */
        if (keys.v[i] >= len) {
            ints_free(&keys);
            PyBuffer_Release(&b);
            return not_mine();
        }
    }
    for (i = 0; i < n; i++) {
        if (keys.v[i] >= 0) {
            dense[keys.v[i]] = (int32_t)value;
        }
    }
    ints_free(&keys);
    PyBuffer_Release(&b);
    return PyLong_FromLong(0);
}

/* ------------------------------------------------------------------------------------------ */
/* blame(cached, demoted, keys, lost, ps) -> pages once cached, or -1                           */

PyDoc_STRVAR(blame_doc,
"blame(cached, demoted, keys, lost, ps) -> int, or -1\n\n"
"pagemap.blame on the page maps' arrays (1-D native int32 buffers: PageMap._dense, -1 where a\n"
"key was never set, past the end too): how many of the keys were cached once (value >= 0);\n"
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
    Py_buffer cb, db;
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
    if (!int32_view(args[0], &cb, 0)) {
        return not_mine();
    }
    if (!int32_view(args[1], &db, 0)) {
        PyBuffer_Release(&cb);
        return not_mine();
    }
    loaded = ints_load(args[2], &keys);
    if (loaded <= 0) {
        PyBuffer_Release(&cb);
        PyBuffer_Release(&db);
        return loaded < 0 ? NULL : not_mine();
    }
    const int32_t *cached = (const int32_t *)cb.buf, *demoted = (const int32_t *)db.buf;
    const Py_ssize_t nc = cb.len / 4, nd = db.len / 4, n = keys.n;
    for (i = 0; i < n; i++) {
        if (keys.v[i] < 0) {
            out = not_mine();
            goto done;
        }
    }
    if (lost != Py_None && n) {
        /* The evictions of every page, then the demotions of the once-cached ones: 2n at most. */
        if ((took = PyMem_Malloc((size_t)n * 2 * sizeof(int32_t))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (i = 0; i < n; i++) {
        int64_t k = keys.v[i];
        int32_t e = k < nc ? cached[k] : -1;
        if (e >= 0) {
            found++;
            if (took != NULL && e > 0) {
                took[ntook++] = e;
            }
        }
    }
    if (took != NULL && found) {
        for (i = 0; i < n; i++) {
            int64_t k = keys.v[i];
            if ((k < nc ? cached[k] : -1) >= 0) {
                int32_t d = k < nd ? demoted[k] : -1;
                if (d > 0) {
                    took[ntook++] = d;
                }
            }
        }
        /* One sequence, as pagemap.blame's Python path counts it (a run across the two passes
         * adds up the same). */
        if (blame_runs(lost, took, ntook, ps) < 0) {
            goto done;
        }
    }
    out = PyLong_FromSsize_t(found);
done:
    PyMem_Free(took);
    ints_free(&keys);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&db);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* StorageIndex: the storage tier's page index (pools._LruIndex is the reference and the       */
/* fallback). Key -> location (segment << 32 | slot, -1 while the page is being written) in    */
/* LRU order, and the live pages of each segment. One call a write does what was a Python loop  */
/* a page: touches, deletions of the oldest pages with their holes, the new keys' places.      */
/*                                                                                              */
/* Keys are exact bytes or str (the chained SHA-256 digests; tests use hex strings): their      */
/* hashes are cached by Python and comparing two never runs Python code, so no call here can    */
/* see the index change under it. Entries live in one array linked into the LRU list (oldest   */
/* first) and are found through an open-addressing table (linear probing, deletion by backward  */
/* shift, kept at most half full). A table slot holds the entry number + 1 (0: empty) and the   */
/* low 32 bits of the key's hash, which are also its home (tables stay under 2**32 slots): a    */
/* probe past other keys, and the backward shift of a deletion, read the table alone. A tier of */
/* ~800k pages is tens of MB of entries and table, so every entry or key read is a cache miss;  */
/* admit() also prefetches the slots of the keys ahead and the entries of the next victims.     */

typedef struct {
    PyObject *key;     /* a strong reference; NULL: a free entry */
    Py_hash_t hash;
    int64_t loc;
    Py_ssize_t prev;   /* LRU neighbours (-1 at the ends); a free entry's next is the free list */
    Py_ssize_t next;
} IxEntry;

typedef struct {
    PyObject_HEAD
    IxEntry *ent;
    Py_ssize_t ent_cap, ent_top, free_head;  /* entries ever used: [0, ent_top) */
    uint64_t *table;                         /* IX_SLOT(e, hash); 0: empty */
    size_t mask;                             /* table size - 1 (a power of two, below 2**32) */
    Py_ssize_t len, head, tail;              /* head: the least recently used */
    int64_t *live;                           /* live pages of segment number n */
    Py_ssize_t live_cap;
    Py_ssize_t pending[512];                 /* the entries the last admit made, in order: */
    Py_ssize_t pending_n, pending_at;        /* place() finds its keys there without a probe */
} StorageIndex;

#define IX_PENDING 512

/* A table slot: hash tag (low 32 bits of the hash) above, entry number + 1 below. */
#define IX_SLOT(e, hash) (((uint64_t)(uint32_t)(hash) << 32) | (uint64_t)((e) + 1))
#define IX_SLOT_E(s) ((Py_ssize_t)((s) & 0xffffffffu) - 1)
#define IX_SLOT_TAG(s) ((uint32_t)((s) >> 32))
#define IX_MAX_ENTRIES ((Py_ssize_t)0x7fffffff)  /* and tables of at most 2**32 slots */

#define IX_SLOT_BITS 32
#define IX_MAX_SEGMENT ((int64_t)1 << 31)

static int
ix_key_ok(PyObject *key)
{
    if (PyBytes_CheckExact(key) || PyUnicode_CheckExact(key)) {
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "storage keys are bytes or str, not %.100s", Py_TYPE(key)->tp_name);
    return 0;
}

static int
ix_same(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (Py_TYPE(a) != Py_TYPE(b)) {
        return 0;  /* a bytes key never equals a str key */
    }
    if (PyBytes_CheckExact(a)) {
        return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
               memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(a)) == 0;
    }
    /* str: equal iff the same kind, length and code units (PEP 393's canonical form) */
    return PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) && PyUnicode_KIND(a) == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b),
                  (size_t)PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a)) == 0;
}

/* The table position holding `key`, or the empty one where it would go (*found 0). */
static size_t
ix_probe(StorageIndex *ix, PyObject *key, Py_hash_t hash, int *found)
{
    size_t i = (size_t)hash & ix->mask;
    uint32_t tag = (uint32_t)hash;
    uint64_t s;
    while ((s = ix->table[i]) != 0) {
        if (IX_SLOT_TAG(s) == tag) {
            Py_ssize_t e = IX_SLOT_E(s);
            if (ix->ent[e].hash == hash && ix_same(ix->ent[e].key, key)) {
                *found = 1;
                return i;
            }
        }
        i = (i + 1) & ix->mask;
    }
    *found = 0;
    return i;
}

/* The entry of `key`, or -1 (-2: an error set: a key of another type or unhashable). */
static Py_ssize_t
ix_find(StorageIndex *ix, PyObject *key)
{
    Py_hash_t hash;
    int found;
    size_t i;
    if (!ix_key_ok(key) || (hash = PyObject_Hash(key)) == -1) {
        return -2;
    }
    i = ix_probe(ix, key, hash, &found);
    return found ? IX_SLOT_E(ix->table[i]) : -1;
}

static void
ix_unlink(StorageIndex *ix, Py_ssize_t e)
{
    IxEntry *x = &ix->ent[e];
    if (x->prev >= 0) ix->ent[x->prev].next = x->next; else ix->head = x->next;
    if (x->next >= 0) ix->ent[x->next].prev = x->prev; else ix->tail = x->prev;
}

static void
ix_push_newest(StorageIndex *ix, Py_ssize_t e)
{
    IxEntry *x = &ix->ent[e];
    x->prev = ix->tail;
    x->next = -1;
    if (ix->tail >= 0) ix->ent[ix->tail].next = e; else ix->head = e;
    ix->tail = e;
}

static int
ix_rehash(StorageIndex *ix, size_t size)
{
    uint64_t *old = ix->table, *t;
    size_t old_size = ix->mask + 1, mask = size - 1;
    if (size > ((size_t)1 << 32) || (t = PyMem_Calloc(size, sizeof(uint64_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* from the old table's slots, in memory order (their tags are their homes) */
    for (size_t j = 0; j < old_size; j++) {
        uint64_t s = old[j];
        if (s != 0) {
            size_t i = IX_SLOT_TAG(s) & mask;
            while (t[i] != 0) i = (i + 1) & mask;
            t[i] = s;
        }
    }
    PyMem_Free(old);
    ix->table = t;
    ix->mask = mask;
    return 0;
}

/* Add `key` (not in the index; table position `at` from ix_probe) as the newest entry. */
static Py_ssize_t
ix_insert(StorageIndex *ix, PyObject *key, Py_hash_t hash, size_t at, int64_t loc)
{
    Py_ssize_t e;
    if ((size_t)(ix->len + 1) * 2 > ix->mask + 1) {
        int found;
        if (ix_rehash(ix, (ix->mask + 1) * 2) < 0) return -1;
        at = ix_probe(ix, key, hash, &found);
    }
    if (ix->free_head < 0 && ix->ent_top >= IX_MAX_ENTRIES) {
        PyErr_SetString(PyExc_MemoryError, "the storage index is full (2**31 - 1 pages)");
        return -1;
    }
    if (ix->free_head >= 0) {
        e = ix->free_head;
        ix->free_head = ix->ent[e].next;
    } else {
        if (ix->ent_top == ix->ent_cap) {
            Py_ssize_t cap = ix->ent_cap ? ix->ent_cap * 2 : 64;
            IxEntry *n = PyMem_Realloc(ix->ent, (size_t)cap * sizeof(IxEntry));
            if (n == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            ix->ent = n;
            ix->ent_cap = cap;
        }
        e = ix->ent_top++;
    }
    Py_INCREF(key);
    ix->ent[e].key = key;
    ix->ent[e].hash = hash;
    ix->ent[e].loc = loc;
    ix->table[at] = IX_SLOT(e, hash);
    ix_push_newest(ix, e);
    ix->len++;
    return e;
}

/* Remove entry e from the table and the LRU list; returns its key (the reference passes to the
 * caller). Backward-shift deletion: no tombstones, so probes stay short. */
static PyObject *
ix_remove(StorageIndex *ix, Py_ssize_t e)
{
    size_t i = (size_t)ix->ent[e].hash & ix->mask, j;
    PyObject *key = ix->ent[e].key;
    uint64_t *t = ix->table;
    while (IX_SLOT_E(t[i]) != e) i = (i + 1) & ix->mask;
    t[i] = 0;
    for (j = (i + 1) & ix->mask; t[j] != 0; j = (j + 1) & ix->mask) {
        size_t home = IX_SLOT_TAG(t[j]) & ix->mask;
        /* the entry at j may move back to i unless its home lies cyclically in (i, j] */
        if (((j - home) & ix->mask) >= ((j - i) & ix->mask)) {
            t[i] = t[j];
            t[j] = 0;
            i = j;
        }
    }
    ix_unlink(ix, e);
    ix->ent[e].key = NULL;
    ix->ent[e].next = ix->free_head;
    ix->free_head = e;
    ix->len--;
    return key;
}

static int
ix_live_room(StorageIndex *ix, int64_t seg)
{
    if (seg < 0 || seg >= IX_MAX_SEGMENT) {
        PyErr_Format(PyExc_ValueError, "segment number %lld out of range", (long long)seg);
        return -1;
    }
    if (seg >= ix->live_cap) {
        Py_ssize_t cap = ix->live_cap ? ix->live_cap : 16;
        while (cap <= seg) cap *= 2;
        int64_t *n = PyMem_Realloc(ix->live, (size_t)cap * sizeof(int64_t));
        if (n == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(n + ix->live_cap, 0, (size_t)(cap - ix->live_cap) * sizeof(int64_t));
        ix->live = n;
        ix->live_cap = cap;
    }
    return 0;
}

static PyObject *
ix_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    StorageIndex *ix;
    if ((args != NULL && PyTuple_GET_SIZE(args)) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "StorageIndex() takes no arguments");
        return NULL;
    }
    ix = (StorageIndex *)type->tp_alloc(type, 0);
    if (ix == NULL) return NULL;
    ix->free_head = ix->head = ix->tail = -1;
    ix->table = PyMem_Calloc(16, sizeof(uint64_t));
    if (ix->table == NULL) {
        Py_DECREF(ix);
        return PyErr_NoMemory();
    }
    ix->mask = 15;
    return (PyObject *)ix;
}

static void
ix_dealloc(StorageIndex *ix)
{
    for (Py_ssize_t e = 0; e < ix->ent_top; e++) {
        Py_XDECREF(ix->ent[e].key);
    }
    PyMem_Free(ix->ent);
    PyMem_Free(ix->table);
    PyMem_Free(ix->live);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static Py_ssize_t
ix_len(StorageIndex *ix)
{
    return ix->len;
}

static int
ix_contains(StorageIndex *ix, PyObject *key)
{
    Py_ssize_t e = ix_find(ix, key);
    return e == -2 ? -1 : e >= 0;
}

static PyObject *
ix_keyerror(PyObject *key)
{
    PyErr_SetObject(PyExc_KeyError, key);
    return NULL;
}

static int
ix_check_list(PyObject *keys)
{
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list");
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(ix_touch_doc, "touch(key): make key the most recently used (KeyError if absent).");

static PyObject *
ix_touch(StorageIndex *ix, PyObject *key)
{
    Py_ssize_t e = ix_find(ix, key);
    if (e == -2) return NULL;
    if (e < 0) return ix_keyerror(key);
    ix_unlink(ix, e);
    ix_push_newest(ix, e);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ix_admit_doc,
"admit(keys, capacity) -> (deleted, fresh, emptied)\n\n"
"_LruIndex.admit: a key already there is touched; a new one first deletes the oldest pages\n"
"while the index holds `capacity`, then goes in as the newest with location -1. deleted: the\n"
"keys deleted, oldest first; fresh: the positions of keys still -1 at the end (None when no\n"
"more than capacity keys were all entered new at their turn: all of them, in order); emptied:\n"
"the segments whose last live page went, in that order. A key named twice is touched while it\n"
"is there, or entered anew when the write's own keys pushed it out; fresh names it once, at\n"
"the position that entered it last.");

/* How many keys ahead admit() prefetches the table slot of. */
#define IX_PREFETCH 8

static PyObject *
ix_admit(StorageIndex *ix, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *keys, *deleted = NULL, *fresh = NULL, *emptied = NULL, *res;
    Py_ssize_t n, capacity, i, nfresh = 0;
    Py_hash_t small_hashes[SMALL_LIST], *hashes = small_hashes;
    Py_ssize_t small_pos[SMALL_LIST], *pos = small_pos;  /* the positions entered new, in order */
    int all_new;
    if (wrong_nargs(nargs, 2, "admit() takes 2 arguments: keys, capacity")) {
        return NULL;
    }
    keys = args[0];
    if (!ix_check_list(keys)) return NULL;
    capacity = PyLong_AsSsize_t(args[1]);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    n = PyList_GET_SIZE(keys);
    all_new = n <= capacity;
    if (n > SMALL_LIST) {
        hashes = PyMem_Malloc((size_t)n * sizeof *hashes);
        pos = PyMem_Malloc((size_t)n * sizeof *pos);
        if (hashes == NULL || pos == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    for (i = 0; i < n; i++) {  /* every key checked before anything changes */
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!ix_key_ok(key) || (hashes[i] = PyObject_Hash(key)) == -1) goto fail;
    }
    for (i = 0; i < n && i < IX_PREFETCH; i++) __builtin_prefetch(&ix->table[(size_t)hashes[i] & ix->mask]);
    ix->pending_n = ix->pending_at = 0;
    if ((deleted = PyList_New(0)) == NULL || (emptied = PyList_New(0)) == NULL) {
        goto fail;
    }
    for (i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_hash_t hash = hashes[i];
        int found;
        size_t at;
        if (i + IX_PREFETCH < n) __builtin_prefetch(&ix->table[(size_t)hashes[i + IX_PREFETCH] & ix->mask]);
        at = ix_probe(ix, key, hash, &found);
        if (found) {
            Py_ssize_t e = IX_SLOT_E(ix->table[at]);
            ix_unlink(ix, e);
            ix_push_newest(ix, e);
            all_new = 0;
            continue;
        }
        if (ix->len >= capacity) {
            while (ix->len >= capacity) {
                Py_ssize_t e = ix->head;
                int64_t loc;
                PyObject *old;
                if (e < 0) {  /* OrderedDict.popitem on an empty index (capacity 0) */
                    PyErr_SetString(PyExc_KeyError, "dictionary is empty");
                    goto fail;
                }
                if (ix->ent[e].next >= 0) __builtin_prefetch(&ix->ent[ix->ent[e].next]);  /* the next victim */
                loc = ix->ent[e].loc;
                old = ix_remove(ix, e);
                if (PyList_Append(deleted, old) < 0) {
                    Py_DECREF(old);
                    goto fail;
                }
                Py_DECREF(old);
                if (loc >= 0) {
                    int64_t seg = loc >> IX_SLOT_BITS;
                    if (--ix->live[seg] == 0) {
                        PyObject *s = PyLong_FromLongLong(seg);
                        if (s == NULL || PyList_Append(emptied, s) < 0) {
                            Py_XDECREF(s);
                            goto fail;
                        }
                        Py_DECREF(s);
                    }
                }
            }
            at = ix_probe(ix, key, hash, &found);  /* the table shifted */
        }
        {
            Py_ssize_t e = ix_insert(ix, key, hash, at, -1);
            if (e < 0) goto fail;
            if (ix->pending_n < IX_PENDING) ix->pending[ix->pending_n++] = e;
        }
        pos[nfresh++] = i;
    }
    if (all_new) {
        fresh = Py_NewRef(Py_None);
    } else {
        /* the positions whose key is still a placeholder, each key's last only: a page pushed
         * out again within this call is not written at its earlier position, even when the
         * key was entered again later (written twice, it was counted live twice). Walked from
         * the end, a key kept is marked (location -2) so its earlier positions are not, and
         * every mark is undone before returning. */
        Py_ssize_t nmarked = 0, nkept = 0;
        Py_ssize_t *marked = PyMem_Malloc((size_t)(nfresh ? nfresh : 1) * sizeof *marked);
        if (marked == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (i = nfresh - 1; i >= 0; i--) {
            /* every key here was hashed and checked above: the lookup cannot fail */
            Py_ssize_t e = ix_find(ix, PyList_GET_ITEM(keys, pos[i]));
            if (e >= 0 && ix->ent[e].loc == -1) {
                ix->ent[e].loc = -2;
                marked[nmarked++] = e;
                pos[nfresh - 1 - nkept++] = pos[i];  /* kept, packed at the end in order */
            }
        }
        for (i = 0; i < nmarked; i++) ix->ent[marked[i]].loc = -1;
        PyMem_Free(marked);
        if ((fresh = PyList_New(nkept)) == NULL) goto fail;
        for (i = 0; i < nkept; i++) {
            PyObject *p = PyLong_FromSsize_t(pos[nfresh - nkept + i]);
            if (p == NULL) goto fail;
            PyList_SET_ITEM(fresh, i, p);
        }
    }
    res = PyTuple_Pack(3, deleted, fresh, emptied);
    Py_DECREF(deleted);
    Py_DECREF(fresh);
    Py_DECREF(emptied);
    if (hashes != small_hashes) PyMem_Free(hashes);
    if (pos != small_pos) PyMem_Free(pos);
    return res;
fail:
    Py_XDECREF(deleted);
    Py_XDECREF(fresh);
    Py_XDECREF(emptied);
    if (hashes != small_hashes) PyMem_Free(hashes);
    if (pos != small_pos) PyMem_Free(pos);
    return NULL;
}

PyDoc_STRVAR(ix_place_doc,
"place(keys, segment, first)\n\n"
"The pages of `keys` (all in the index) went to slots first, first + 1, ... of `segment`: set\n"
"their locations (their LRU places stay) and count them live there.");

static PyObject *
ix_place(StorageIndex *ix, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *keys;
    int64_t seg, first;
    Py_ssize_t n, i;
    if (wrong_nargs(nargs, 3, "place() takes 3 arguments: keys, segment, first")) {
        return NULL;
    }
    keys = args[0];
    if (!ix_check_list(keys)) return NULL;
    seg = PyLong_AsLongLong(args[1]);
    if (seg == -1 && PyErr_Occurred()) return NULL;
    first = PyLong_AsLongLong(args[2]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    n = PyList_GET_SIZE(keys);
    if (first < 0 || first + n > ((int64_t)1 << IX_SLOT_BITS)) {
        PyErr_SetString(PyExc_ValueError, "slot out of range");
        return NULL;
    }
    if (ix_live_room(ix, seg) < 0) return NULL;
    for (i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_ssize_t e = -1, k;
        /* the common case: the keys of the last admit, in its order (an entry made then and
         * still holding this very object; a free entry's key is NULL) */
        while (ix->pending_at < ix->pending_n) {
            k = ix->pending[ix->pending_at++];
            if (ix->ent[k].key == key) {
                e = k;
                break;
            }
        }
        if (e < 0 && (e = ix_find(ix, key)) == -2) return NULL;
        if (e < 0) return ix_keyerror(key);
        ix->ent[e].loc = (seg << IX_SLOT_BITS) + first + i;
        ix->live[seg]++;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ix_drop_placeholders_doc,
"drop_placeholders(keys): delete those of `keys` still at location -1 (pages never written).");

static PyObject *
ix_drop_placeholders(StorageIndex *ix, PyObject *keys)
{
    if (!ix_check_list(keys)) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        Py_ssize_t e = ix_find(ix, PyList_GET_ITEM(keys, i));
        if (e == -2) return NULL;
        if (e >= 0 && ix->ent[e].loc == -1) {
            Py_DECREF(ix_remove(ix, e));
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ix_locs_doc, "locs(keys) -> [location, ...] (KeyError for a key not there; nothing is touched).");

static PyObject *
ix_locs(StorageIndex *ix, PyObject *keys)
{
    PyObject *out;
    Py_ssize_t n;
    if (!ix_check_list(keys)) return NULL;
    n = PyList_GET_SIZE(keys);
    if ((out = PyList_New(n)) == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *loc;
        Py_ssize_t e = ix_find(ix, key);
        if (e < 0) {
            Py_DECREF(out);
            return e == -2 ? NULL : ix_keyerror(key);
        }
        if ((loc = PyLong_FromLongLong(ix->ent[e].loc)) == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, loc);
    }
    return out;
}

PyDoc_STRVAR(ix_touch_all_doc, "touch_all(keys): touch(key) for each key in order.");

static PyObject *
ix_touch_all(StorageIndex *ix, PyObject *keys)
{
    if (!ix_check_list(keys)) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *r = ix_touch(ix, PyList_GET_ITEM(keys, i));
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ix_run_doc,
"run(keys, start) -> n: how many of keys[start:] are in the index before the first that is not.");

static PyObject *
ix_run(StorageIndex *ix, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *keys;
    Py_ssize_t start, i;
    if (wrong_nargs(nargs, 2, "run() takes 2 arguments: keys, start")) {
        return NULL;
    }
    keys = args[0];
    if (!ix_check_list(keys)) return NULL;
    start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "start must be >= 0");
        return NULL;
    }
    for (i = start; i < PyList_GET_SIZE(keys); i++) {
        Py_ssize_t e = ix_find(ix, PyList_GET_ITEM(keys, i));
        if (e == -2) return NULL;
        if (e < 0) break;
    }
    return PyLong_FromSsize_t(i - start > 0 ? i - start : 0);
}

static int
ix_segment(PyObject *arg, int64_t *seg)
{
    *seg = PyLong_AsLongLong(arg);
    return !(*seg == -1 && PyErr_Occurred());
}

PyDoc_STRVAR(ix_live_doc, "live(segment) -> the pages of `segment` still in the index.");

static PyObject *
ix_live(StorageIndex *ix, PyObject *arg)
{
    int64_t seg;
    if (!ix_segment(arg, &seg)) return NULL;
    return PyLong_FromLongLong(seg >= 0 && seg < ix->live_cap ? ix->live[seg] : 0);
}

PyDoc_STRVAR(ix_clear_live_doc, "clear_live(segment): count no live page in `segment` (its pages went elsewhere).");

static PyObject *
ix_clear_live(StorageIndex *ix, PyObject *arg)
{
    int64_t seg;
    if (!ix_segment(arg, &seg)) return NULL;
    if (seg >= 0 && seg < ix->live_cap) ix->live[seg] = 0;
    Py_RETURN_NONE;
}

static int
ix_cmp_loc(const void *a, const void *b)
{
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

PyDoc_STRVAR(ix_segment_keys_doc,
"segment_keys(segment) -> (slots, keys): the pages of `segment` in the index, in slot order.");

static PyObject *
ix_segment_keys(StorageIndex *ix, PyObject *arg)
{
    int64_t seg, (*pairs)[2];
    Py_ssize_t n = 0, e, i;
    PyObject *slots = NULL, *keys = NULL, *res = NULL;
    if (!ix_segment(arg, &seg)) return NULL;
    pairs = PyMem_Malloc((size_t)(ix->len ? ix->len : 1) * sizeof *pairs);
    if (pairs == NULL) return PyErr_NoMemory();
    for (e = ix->head; e >= 0; e = ix->ent[e].next) {  /* a scan: compaction is rare */
        if (ix->ent[e].loc >= 0 && ix->ent[e].loc >> IX_SLOT_BITS == seg) {
            pairs[n][0] = ix->ent[e].loc;
            pairs[n][1] = e;
            n++;
        }
    }
    qsort(pairs, (size_t)n, sizeof *pairs, ix_cmp_loc);
    if ((slots = PyList_New(n)) == NULL || (keys = PyList_New(n)) == NULL) goto done;
    for (i = 0; i < n; i++) {
        PyObject *s = PyLong_FromLongLong(pairs[i][0] & (((int64_t)1 << IX_SLOT_BITS) - 1));
        if (s == NULL) goto done;
        PyList_SET_ITEM(slots, i, s);
        PyList_SET_ITEM(keys, i, Py_NewRef(ix->ent[pairs[i][1]].key));
    }
    res = PyTuple_Pack(2, slots, keys);
done:
    PyMem_Free(pairs);
    Py_XDECREF(slots);
    Py_XDECREF(keys);
    return res;
}

PyDoc_STRVAR(ix_keys_doc, "keys() -> the keys, least recently used first.");

static PyObject *
ix_keys(StorageIndex *ix, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(ix->len);
    Py_ssize_t i = 0;
    if (out == NULL) return NULL;
    for (Py_ssize_t e = ix->head; e >= 0; e = ix->ent[e].next) {
        PyList_SET_ITEM(out, i++, Py_NewRef(ix->ent[e].key));
    }
    return out;
}

static PyMethodDef ix_methods[] = {
    {"touch", (PyCFunction)ix_touch, METH_O, ix_touch_doc},
    {"admit", (PyCFunction)(void (*)(void))ix_admit, METH_FASTCALL, ix_admit_doc},
    {"place", (PyCFunction)(void (*)(void))ix_place, METH_FASTCALL, ix_place_doc},
    {"drop_placeholders", (PyCFunction)ix_drop_placeholders, METH_O, ix_drop_placeholders_doc},
    {"locs", (PyCFunction)ix_locs, METH_O, ix_locs_doc},
    {"touch_all", (PyCFunction)ix_touch_all, METH_O, ix_touch_all_doc},
    {"run", (PyCFunction)(void (*)(void))ix_run, METH_FASTCALL, ix_run_doc},
    {"live", (PyCFunction)ix_live, METH_O, ix_live_doc},
    {"clear_live", (PyCFunction)ix_clear_live, METH_O, ix_clear_live_doc},
    {"segment_keys", (PyCFunction)ix_segment_keys, METH_O, ix_segment_keys_doc},
    {"keys", (PyCFunction)ix_keys, METH_NOARGS, ix_keys_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods ix_as_sequence = {
    .sq_length = (lenfunc)ix_len,
    .sq_contains = (objobjproc)ix_contains,
};

static PyTypeObject StorageIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.StorageIndex",
    .tp_doc = PyDoc_STR("StorageIndex(): the storage tier's page index in LRU order (pools._LruIndex's\n"
                        "methods, compiled)."),
    .tp_basicsize = sizeof(StorageIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = ix_new,
    .tp_dealloc = (destructor)ix_dealloc,
    .tp_as_sequence = &ix_as_sequence,
    .tp_methods = ix_methods,
};

/* ------------------------------------------------------------------------------------------ */
/* RowBuffer: a recorder's buffer of one table's rows, encoded as they are appended             */
/*                                                                                              */
/* The probes' events are tuples built on the engine's hot path. Kept as tuples until a flush,  */
/* each (and each of its ints) is a heap object the flush's pickling visits again, cold, one by  */
/* one; here a row is encoded when it is appended, while its values are hot, and the tuple goes  */
/* back to the allocator at once. A flush hands over one bytes object; the store's writer       */
/* process turns it back into the same values (decode_rows). Per value: a tag byte, then         */
/*   'N' None | 'T' True | 'F' False | 'I' an exact int within int64: 8 bytes | 'D' an exact      */
/*   float: 8 bytes | 'S' an exact str: uint32 length + UTF-8 | 'O' anything else (a big int, a */
/*   numpy scalar, a str subclass): uint32 index into the buffer's list of such objects, which   */
/*   travels beside the bytes (pickled): every value comes back as it went in.                  */

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t len, cap, rows, width;
    PyObject *objects;  /* list, or NULL while none */
} RowBuffer;

static int
rb_reserve(RowBuffer *rb, Py_ssize_t more)
{
    Py_ssize_t need = rb->len + more, cap = rb->cap ? rb->cap : 1 << 16;
    char *p;
    if (need <= rb->cap) {
        return 0;
    }
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    if ((p = PyMem_Realloc(rb->buf, (size_t)cap)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    rb->buf = p;
    rb->cap = cap;
    return 0;
}

/* One value: 0, or -1 with an exception set (MemoryError, or a str that is no valid UTF-8). */
static int
rb_put(RowBuffer *rb, PyObject *v)
{
    char tag;
    if (PyLong_CheckExact(v)) {  /* most values: ids, times, counts */
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) {
            goto object;
        }
        if (rb_reserve(rb, 9) < 0) {
            return -1;
        }
        rb->buf[rb->len] = 'I';
        memcpy(rb->buf + rb->len + 1, &x, 8);
        rb->len += 9;
        return 0;
    }
    if (v == Py_None) {
        tag = 'N';
    } else if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(v, &n);
        uint32_t n32;
        if (u == NULL) {
            PyErr_Clear();  /* lone surrogates: kept as the object itself */
            goto object;
        }
        if (n > (Py_ssize_t)UINT32_MAX) {
            goto object;
        }
        n32 = (uint32_t)n;
        if (rb_reserve(rb, 5 + n) < 0) {
            return -1;
        }
        rb->buf[rb->len] = 'S';
        memcpy(rb->buf + rb->len + 1, &n32, 4);
        memcpy(rb->buf + rb->len + 5, u, (size_t)n);
        rb->len += 5 + n;
        return 0;
    } else if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (rb_reserve(rb, 9) < 0) {
            return -1;
        }
        rb->buf[rb->len] = 'D';
        memcpy(rb->buf + rb->len + 1, &x, 8);
        rb->len += 9;
        return 0;
    } else if (v == Py_True) {
        tag = 'T';
    } else if (v == Py_False) {
        tag = 'F';
    } else {
        goto object;
    }
    if (rb_reserve(rb, 1) < 0) {
        return -1;
    }
    rb->buf[rb->len++] = tag;
    return 0;
object:
    {
        uint32_t at;
        if (rb->objects == NULL && (rb->objects = PyList_New(0)) == NULL) {
            return -1;
        }
        if (PyList_GET_SIZE(rb->objects) >= (Py_ssize_t)UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "RowBuffer: too many odd values in one flush");
            return -1;
        }
        at = (uint32_t)PyList_GET_SIZE(rb->objects);
        if (rb_reserve(rb, 5) < 0 || PyList_Append(rb->objects, v) < 0) {
            return -1;
        }
        rb->buf[rb->len] = 'O';
        memcpy(rb->buf + rb->len + 1, &at, 4);
        rb->len += 5;
        return 0;
    }
}

PyDoc_STRVAR(rb_append_doc,
"append(row)\n\nEncode a tuple of `width` values (a TypeError for anything else: a bug of the caller);\n"
"a row that fails part-way (MemoryError) is not kept.");

static PyObject *
rb_append(RowBuffer *rb, PyObject *row)
{
    Py_ssize_t start = rb->len, i;
    Py_ssize_t nobj = rb->objects ? PyList_GET_SIZE(rb->objects) : 0;
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != rb->width) {
        PyErr_Format(PyExc_TypeError, "RowBuffer.append takes a tuple of %zd values", rb->width);
        return NULL;
    }
    for (i = 0; i < rb->width; i++) {
        if (rb_put(rb, PyTuple_GET_ITEM(row, i)) < 0) {
            rb->len = start;
            if (rb->objects != NULL && PyList_SetSlice(rb->objects, nobj, PY_SSIZE_T_MAX, NULL) < 0) {
                PyErr_Clear();
            }
            return NULL;
        }
    }
    rb->rows++;
    Py_RETURN_NONE;
}

static void
rb_reset(RowBuffer *rb)
{
    rb->len = 0;
    rb->rows = 0;
    Py_CLEAR(rb->objects);
}

PyDoc_STRVAR(rb_take_doc,
"take() -> (bytes, rows, objects or None)\n\nWhat was appended since the last take (decode_rows' arguments),\n"
"and the buffer empty again.");

static PyObject *
rb_take(RowBuffer *rb, PyObject *Py_UNUSED(ignored))
{
    PyObject *data = PyBytes_FromStringAndSize(rb->buf, rb->len), *out;
    if (data == NULL) {
        return NULL;
    }
    out = Py_BuildValue("(NnO)", data, rb->rows, rb->objects ? rb->objects : Py_None);
    if (out != NULL) {
        rb_reset(rb);
    }
    return out;
}

static PyObject *
rb_clear(RowBuffer *rb, PyObject *Py_UNUSED(ignored))
{
    rb_reset(rb);
    Py_RETURN_NONE;
}

static Py_ssize_t
rb_len(RowBuffer *rb)
{
    return rb->rows;
}

static PyObject *
rb_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t width;
    RowBuffer *rb;
    static char *kwlist[] = {"width", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &width)) {
        return NULL;
    }
    if (width <= 0) {
        PyErr_SetString(PyExc_ValueError, "RowBuffer: width must be positive");
        return NULL;
    }
    if ((rb = (RowBuffer *)type->tp_alloc(type, 0)) == NULL) {
        return NULL;
    }
    rb->width = width;
    return (PyObject *)rb;
}

static void
rb_dealloc(RowBuffer *rb)
{
    PyMem_Free(rb->buf);
    Py_CLEAR(rb->objects);
    Py_TYPE(rb)->tp_free((PyObject *)rb);
}

static PyObject *
rb_width(RowBuffer *rb, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(rb->width);
}

static PyMethodDef rb_methods[] = {
    {"append", (PyCFunction)rb_append, METH_O, rb_append_doc},
    {"take", (PyCFunction)rb_take, METH_NOARGS, rb_take_doc},
    {"clear", (PyCFunction)rb_clear, METH_NOARGS, "clear()\n\nForget what was appended."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rb_getset[] = {
    {"width", (getter)rb_width, NULL, "values a row", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods rb_as_sequence = {
    .sq_length = (lenfunc)rb_len,
};

static PyTypeObject RowBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.RowBuffer",
    .tp_doc = PyDoc_STR("RowBuffer(width): rows of `width` values, encoded as appended (see _cplane.c)."),
    .tp_basicsize = sizeof(RowBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = rb_new,
    .tp_dealloc = (destructor)rb_dealloc,
    .tp_as_sequence = &rb_as_sequence,
    .tp_methods = rb_methods,
    .tp_getset = rb_getset,
};

/* The payload size after a tag, or -1 for a bad tag / data cut short. */
static Py_ssize_t
da_skip(const char *p, const char *end, char tag)
{
    switch (tag) {
    case 'N': case 'T': case 'F':
        return 0;
    case 'I': case 'D':
        return end - p >= 8 ? 8 : -1;
    case 'O':
        return end - p >= 4 ? 4 : -1;
    case 'S': {
        uint32_t n;
        if (end - p < 4) {
            return -1;
        }
        memcpy(&n, p, 4);
        return (size_t)(end - p - 4) >= n ? 4 + (Py_ssize_t)n : -1;
    }
    default:
        return -1;
    }
}

/* The value of one checked field (tag, its payload at p, k bytes): a new reference, or NULL
 * with an exception set (MemoryError; ValueError for an object index out of range). */
static PyObject *
da_value(char tag, const char *p, Py_ssize_t k, PyObject *objects)
{
    switch (tag) {
    case 'N': return Py_NewRef(Py_None);
    case 'T': return Py_NewRef(Py_True);
    case 'F': return Py_NewRef(Py_False);
    case 'I': { long long x; memcpy(&x, p, 8); return PyLong_FromLongLong(x); }
    case 'D': { double x; memcpy(&x, p, 8); return PyFloat_FromDouble(x); }
    case 'S': return PyUnicode_DecodeUTF8(p + 4, k - 4, "strict");
    default: {
        uint32_t at;
        memcpy(&at, p, 4);
        if (objects == Py_None || (Py_ssize_t)at >= PyList_GET_SIZE(objects)) {
            PyErr_SetString(PyExc_ValueError, "decode_rows: an object index out of range");
            return NULL;
        }
        return Py_NewRef(PyList_GET_ITEM(objects, at));
    }
    }
}

static int
da_fits(char kind, char tag)
{
    if (tag == 'N') {
        return 1;
    }
    switch (kind) {
    case 'i': return tag == 'I';
    case 'd': return tag == 'D';
    case 'b': return tag == 'T' || tag == 'F';
    case 's': return tag == 'S';
    default: return 0;
    }
}

/* One column's decoding: whether it is built as Arrow buffers (`fit`), and those buffers. */
typedef struct {
    char fit;
    Py_ssize_t nulls, strbytes;
    int32_t soff;
    PyObject *vals, *sdata, *valid;  /* values (offsets for strings), string data, validity */
} DaCol;

/* decode_arrow's work, for `width` columns of `kinds` (decode_rows: all 'o'): the list, or NULL
 * with an exception set. */
static PyObject *
decode_columns(const char *data, const char *end, Py_ssize_t rows, PyObject *objects, const char *kinds,
               Py_ssize_t width)
{
    const char *p;
    Py_ssize_t r, c, nbytes = (rows + 7) / 8;
    PyObject *out = NULL;
    DaCol *cols = PyMem_Calloc((size_t)width, sizeof(DaCol));
    if (cols == NULL) {
        return PyErr_NoMemory();
    }
    for (c = 0; c < width; c++) {
        cols[c].fit = kinds[c] == 'i' || kinds[c] == 'd' || kinds[c] == 'b' || kinds[c] == 's';
    }
    /* Pass 1: check the data; which columns fit, their nulls and string bytes. */
    p = data;
    for (r = 0; r < rows; r++) {
        for (c = 0; c < width; c++) {
            DaCol *col = &cols[c];
            char tag;
            Py_ssize_t k;
            if (p >= end) {
                PyErr_SetString(PyExc_ValueError, "decode_rows: the data ends inside a row");
                goto fail;
            }
            tag = *p++;
            if ((k = da_skip(p, end, tag)) < 0) {
                PyErr_SetString(PyExc_ValueError, tag != '\0' && strchr("NTFIDSO", tag) != NULL
                                ? "decode_rows: the data ends inside a row" : "decode_rows: a bad tag");
                goto fail;
            }
            if (col->fit) {
                if (!da_fits(kinds[c], tag)) {
                    col->fit = 0;
                } else if (tag == 'N') {
                    col->nulls++;
                } else if (tag == 'S' && (col->strbytes += k - 4) > INT32_MAX) {
                    col->fit = 0;
                }
            }
            if (tag == 'O') {
                uint32_t at;
                memcpy(&at, p, 4);
                if (objects == Py_None || (Py_ssize_t)at >= PyList_GET_SIZE(objects)) {
                    PyErr_SetString(PyExc_ValueError, "decode_rows: an object index out of range");
                    goto fail;
                }
            }
            p += k;
        }
    }
    if (p != end) {
        PyErr_SetString(PyExc_ValueError, "decode_rows: data left after the last row");
        goto fail;
    }
    if ((out = PyList_New(width)) == NULL) {
        goto fail;
    }
    /* The outputs: typed buffers (zeroed: nulls' slots and padding bits), or a tuple. */
    for (c = 0; c < width; c++) {
        DaCol *col = &cols[c];
        if (!col->fit) {
            PyObject *values = PyTuple_New(rows);
            if (values == NULL) {
                goto fail;
            }
            PyList_SET_ITEM(out, c, values);
            continue;
        }
        col->vals = PyBytes_FromStringAndSize(NULL, kinds[c] == 'b' ? nbytes : kinds[c] == 's' ? (rows + 1) * 4
                                                                                               : rows * 8);
        if (kinds[c] == 's') {
            col->sdata = PyBytes_FromStringAndSize(NULL, col->strbytes);
        }
        if (col->nulls) {
            col->valid = PyBytes_FromStringAndSize(NULL, nbytes);
        }
        if (col->vals == NULL || (kinds[c] == 's' && col->sdata == NULL) || (col->nulls && col->valid == NULL)) {
            goto fail;
        }
        memset(PyBytes_AS_STRING(col->vals), 0, (size_t)PyBytes_GET_SIZE(col->vals));
        if (col->valid != NULL) {
            memset(PyBytes_AS_STRING(col->valid), 0, (size_t)nbytes);
        }
    }
    /* Pass 2: fill. */
    p = data;
    for (r = 0; r < rows; r++) {
        for (c = 0; c < width; c++) {
            DaCol *col = &cols[c];
            char tag = *p++;
            Py_ssize_t k = da_skip(p, end, tag);
            if (!col->fit) {
                PyObject *v = da_value(tag, p, k, objects);
                if (v == NULL) {
                    goto fail;
                }
                PyTuple_SET_ITEM(PyList_GET_ITEM(out, c), r, v);
            } else {
                char *vals = PyBytes_AS_STRING(col->vals);
                if (tag != 'N' && col->valid != NULL) {
                    PyBytes_AS_STRING(col->valid)[r >> 3] |= (char)(1 << (r & 7));
                }
                if (kinds[c] == 'b') {
                    if (tag == 'T') {
                        vals[r >> 3] |= (char)(1 << (r & 7));
                    }
                } else if (kinds[c] == 's') {
                    if (tag == 'S') {
                        memcpy(PyBytes_AS_STRING(col->sdata) + col->soff, p + 4, (size_t)(k - 4));
                        col->soff += (int32_t)(k - 4);
                    }
                    memcpy(vals + (r + 1) * 4, &col->soff, 4);
                } else if (tag != 'N') {  /* 'i', 'd' */
                    memcpy(vals + r * 8, p, 8);
                }
            }
            p += k;
        }
    }
    for (c = 0; c < width; c++) {
        DaCol *col = &cols[c];
        PyObject *entry;
        if (!col->fit) {
            PyObject *values = PyList_GET_ITEM(out, c);
            if ((entry = Py_BuildValue("(CO)", 'o', values)) == NULL) {
                goto fail;
            }
            PyList_SET_ITEM(out, c, entry);  /* the list's reference to `values` passes to entry */
            Py_DECREF(values);
            continue;
        }
        if (kinds[c] == 's') {
            entry = Py_BuildValue("(COOOn)", 's', col->vals, col->sdata, col->valid ? col->valid : Py_None, col->nulls);
        } else {
            entry = Py_BuildValue("(COOn)", kinds[c], col->vals, col->valid ? col->valid : Py_None, col->nulls);
        }
        if (entry == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(out, c, entry);
    }
    for (c = 0; c < width; c++) {
        Py_XDECREF(cols[c].vals);
        Py_XDECREF(cols[c].sdata);
        Py_XDECREF(cols[c].valid);
    }
    PyMem_Free(cols);
    return out;
fail:
    for (c = 0; c < width; c++) {
        Py_XDECREF(cols[c].vals);
        Py_XDECREF(cols[c].sdata);
        Py_XDECREF(cols[c].valid);
    }
    PyMem_Free(cols);
    Py_XDECREF(out);
    return NULL;
}

/* The arguments both decoders take: data (bytes), rows, objects and a fourth, bytes too when
 * `fourth_bytes` (else a TypeError saying `usage`). 0, or -1 with an exception. */
static int
decode_args(PyObject *const *args, Py_ssize_t nargs, int fourth_bytes, const char *usage, const char **data,
            const char **end, Py_ssize_t *rows, PyObject **objects)
{
    if (nargs != 4 || !PyBytes_Check(args[0]) || (fourth_bytes && !PyBytes_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *rows = PyLong_AsSsize_t(args[1]);
    if (*rows == -1 && PyErr_Occurred()) {
        return -1;
    }
    *objects = args[2];
    if (*rows < 0 || (*objects != Py_None && !PyList_Check(*objects))) {
        PyErr_SetString(PyExc_ValueError, "decode_rows: bad rows or objects");
        return -1;
    }
    *data = PyBytes_AS_STRING(args[0]);
    *end = *data + PyBytes_GET_SIZE(args[0]);
    return 0;
}

PyDoc_STRVAR(decode_rows_doc,
"decode_rows(data, rows, objects, width) -> tuple of `width` column tuples\n\n"
"RowBuffer.take's rows back as columns, each value as it was appended. A ValueError for data\n"
"that is not such rows (cut short, a bad tag, an object index out of range).");

static PyObject *
cp_decode_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    const char *data, *end;
    char *kinds;
    Py_ssize_t rows, width, c;
    PyObject *objects, *entries, *out;
    if (decode_args(args, nargs, 0, "decode_rows() takes data (bytes), rows, objects, width", &data, &end, &rows,
                    &objects) < 0) {
        return NULL;
    }
    width = PyLong_AsSsize_t(args[3]);
    if (width == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (width <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_rows: bad rows, width or objects");
        return NULL;
    }
    if ((kinds = PyMem_Malloc((size_t)width)) == NULL) {
        return PyErr_NoMemory();
    }
    memset(kinds, 'o', (size_t)width);
    entries = decode_columns(data, end, rows, objects, kinds, width);
    PyMem_Free(kinds);
    if (entries == NULL || (out = PyTuple_New(width)) == NULL) {
        Py_XDECREF(entries);
        return NULL;
    }
    for (c = 0; c < width; c++) {  /* ('o', values) -> values */
        PyTuple_SET_ITEM(out, c, Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(entries, c), 1)));
    }
    Py_DECREF(entries);
    return out;
}

PyDoc_STRVAR(decode_arrow_doc,
"decode_arrow(data, rows, objects, kinds) -> list, a column each\n\n"
"RowBuffer.take's rows as Arrow buffers, straight, for the columns whose every value fits its\n"
"kind (a bytes string, a letter a column): ('i' or 'd', values, validity, nulls) for int64 and\n"
"float64, ('b', value bits, validity, nulls) for bool, ('s', int32 offsets, UTF-8 data,\n"
"validity, nulls) for strings; validity None without a null, else an Arrow bitmap (LSB first,\n"
"1 valid). None fits every kind. A column of kind 'o', or whose values do not all fit (an int\n"
"in a float column, a big int, an odd object, strings past 2 GiB), is ('o', a tuple of the\n"
"values themselves), as decode_rows gives them. A ValueError as decode_rows' for data that is\n"
"not such rows.");

static PyObject *
cp_decode_arrow(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    const char *data, *end;
    Py_ssize_t rows;
    PyObject *objects;
    if (decode_args(args, nargs, 1, "decode_arrow() takes data (bytes), rows, objects, kinds (bytes)", &data, &end,
                    &rows, &objects) < 0) {
        return NULL;
    }
    if (PyBytes_GET_SIZE(args[3]) <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_arrow: no kinds");
        return NULL;
    }
    return decode_columns(data, end, rows, objects, PyBytes_AS_STRING(args[3]), PyBytes_GET_SIZE(args[3]));
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef cplane_methods[] = {
    {"move", (PyCFunction)(void (*)(void))cp_move, METH_FASTCALL, move_doc},
    {"gather_pages", (PyCFunction)(void (*)(void))cp_gather_pages, METH_FASTCALL, gather_pages_doc},
    {"block_page_keys", (PyCFunction)(void (*)(void))cp_block_page_keys, METH_FASTCALL, block_page_keys_doc},
    {"write_content", (PyCFunction)(void (*)(void))cp_write_content, METH_FASTCALL, write_content_doc},
    {"verify_content", (PyCFunction)(void (*)(void))cp_verify_content, METH_FASTCALL, verify_content_doc},
    {"alloc", (PyCFunction)(void (*)(void))cp_alloc, METH_FASTCALL, alloc_doc},
    {"free", (PyCFunction)(void (*)(void))cp_free, METH_FASTCALL, free_doc},
    {"storage_key_chain", (PyCFunction)(void (*)(void))cp_storage_key_chain, METH_FASTCALL, storage_key_chain_doc},
    {"lookup_prefix", (PyCFunction)(void (*)(void))cp_lookup_prefix, METH_FASTCALL, lookup_prefix_doc},
    {"blame", (PyCFunction)(void (*)(void))cp_blame, METH_FASTCALL, blame_doc},
    {"map_set", (PyCFunction)(void (*)(void))cp_map_set, METH_FASTCALL, map_set_doc},
    {"decode_rows", (PyCFunction)(void (*)(void))cp_decode_rows, METH_FASTCALL, decode_rows_doc},
    {"decode_arrow", (PyCFunction)(void (*)(void))cp_decode_arrow, METH_FASTCALL, decode_arrow_doc},
    {"sha256_impl", (PyCFunction)(void (*)(void))cp_sha256_impl, METH_FASTCALL, sha256_impl_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cplane_module = {
    PyModuleDef_HEAD_INIT,
    "_cplane",
    "The compiled CPU data plane (tierdiag/native/cplane.py chooses it; rows.py and pools.py\n"
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
#ifdef HAVE_SHA_NI_BUILD
    use_sha_ni = cpu_has_sha_ni();
#endif
    if (PyModule_AddIntConstant(m, "API", CPLANE_API) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyType_Ready(&StorageIndexType) < 0 ||
        PyModule_AddObjectRef(m, "StorageIndex", (PyObject *)&StorageIndexType) < 0 ||
        PyType_Ready(&RowBufferType) < 0 ||
        PyModule_AddObjectRef(m, "RowBuffer", (PyObject *)&RowBufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
