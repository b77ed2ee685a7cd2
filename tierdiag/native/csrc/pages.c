/* Pages: moves between pools' row views (engine/rows.py's copy_rows), page content and its
 * verification (engine/content.py), and a pool's free-slot stack (engine/pagepool.py). */
#include "cplane.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* page_content_np: mix(key) = key * golden ratio, modulo 2**64 (content._MIX) */
#define MIX UINT64_C(0x9E3779B97F4A7C15)
#define LAYER_MUL UINT64_C(1000003)
#define COL_MUL UINT64_C(2654435761)

/* ------------------------------------------------------------------------------------------ */
/* move(src_rows, src_pages, dst_rows, dst_pages) -> count_runs(src_pages), or -1              */

PyDoc_STRVAR(move_doc,
"move(src_rows, src_pages, dst_rows, dst_pages) -> int\n\n"
"dst_rows[:, dst_pages[i]] = src_rows[:, src_pages[i]] for every i, one memcpy a run of pages\n"
"consecutive on both sides in every layer (from 1 MiB a move: layer by layer, four rows at a\n"
"time, streaming stores); every page is range-checked before a byte moves.\n"
"Returns count_runs(src_pages), or -1 having moved nothing when the case is the numpy path's\n"
"(lengths or geometries that differ, a page outside a pool, overlapping pools, a list of\n"
"anything but ints).");

/* A move this big goes layer by layer, four rows at a time, with streaming stores (the
 * destination is not read for ownership, nor left in the caches). Four rows' loads interleaved
 * 64 bytes at a time keep four streams of misses in flight: one row at a time (a memcpy each,
 * or one streamed run after another) waits on each row's first lines, and 4 KiB rows scattered
 * over a pool are too short for the hardware prefetcher to run ahead. Scattered 16 KiB pages
 * (4 layers of 4 KiB rows), the 2-vCPU VM under load, against one contiguous memcpy of the same
 * bytes (benchmarks/README.md, issue 41): a memcpy a row 0.5-0.6x at 1-64 MiB, one run streamed
 * after another 0.7-0.9x, four rows interleaved 1.1-1.4x. Below 1 MiB rows are memcpy'd: the
 * destination of a small move is read again soon (kept in the caches). */
#define STREAM_MIN_BYTES (1 << 20)

#if defined(__SSE2__)
#define LOAD4(p, a, b, c, e)                                                                   \
    do {                                                                                       \
        a = _mm_loadu_si128((const __m128i *)(p));                                             \
        b = _mm_loadu_si128((const __m128i *)((p) + 16));                                      \
        c = _mm_loadu_si128((const __m128i *)((p) + 32));                                      \
        e = _mm_loadu_si128((const __m128i *)((p) + 48));                                      \
    } while (0)
#define STREAM4(p, a, b, c, e)                                                                 \
    do {                                                                                       \
        _mm_stream_si128((__m128i *)(p), a);                                                   \
        _mm_stream_si128((__m128i *)((p) + 16), b);                                            \
        _mm_stream_si128((__m128i *)((p) + 32), c);                                            \
        _mm_stream_si128((__m128i *)((p) + 48), e);                                            \
    } while (0)

/* rows s[0..k) -> d[0..k) (k <= 4), rb bytes each (a multiple of 64, every d 16-byte aligned),
 * 64 bytes of each row in turn. Rows named twice on the destination end as a row-at-a-time copy
 * leaves them: at every offset the later row is stored last. */
static void
stream_rows(char *const *d, const char *const *s, int k, size_t rb)
{
    __m128i a0, b0, c0, e0, a1, b1, c1, e1, a2, b2, c2, e2, a3, b3, c3, e3;
    if (k == 4) {
        for (size_t i = 0; i < rb; i += 64) {
            LOAD4(s[0] + i, a0, b0, c0, e0);
            LOAD4(s[1] + i, a1, b1, c1, e1);
            LOAD4(s[2] + i, a2, b2, c2, e2);
            LOAD4(s[3] + i, a3, b3, c3, e3);
            STREAM4(d[0] + i, a0, b0, c0, e0);
            STREAM4(d[1] + i, a1, b1, c1, e1);
            STREAM4(d[2] + i, a2, b2, c2, e2);
            STREAM4(d[3] + i, a3, b3, c3, e3);
        }
        return;
    }
    for (size_t i = 0; i < rb; i += 64) {
        for (int r = 0; r < k; r++) {
            LOAD4(s[r] + i, a0, b0, c0, e0);
            STREAM4(d[r] + i, a0, b0, c0, e0);
        }
    }
}

/* Every row of `s`/`d`, layer by layer, four at a time, streamed. */
static void
move_streamed(char *dst, const char *src, const Ints *s, const Ints *d, Py_ssize_t n, Py_ssize_t layers,
              Py_ssize_t rb, Py_ssize_t sp, Py_ssize_t dp)
{
    const char *from[4];
    char *to[4];
    for (Py_ssize_t l = 0; l < layers; l++) {
        const char *sl = src + l * sp * rb;
        char *dl = dst + l * dp * rb;
        for (Py_ssize_t i = 0; i < n; i += 4) {
            int k = n - i < 4 ? (int)(n - i) : 4;
            for (int r = 0; r < k; r++) {
                from[r] = sl + (Py_ssize_t)s->v[i + r] * rb;
                to[r] = dl + (Py_ssize_t)d->v[i + r] * rb;
            }
            stream_rows(to, from, k, (size_t)rb);
        }
    }
    _mm_sfence();
}
#endif

/* Below 1 MiB a move is mostly single pages scattered over both pools (the whole conversation
 * trace: 2.2 M pages in 1.85 M runs, 256 B each): a memcpy a page waits on the source's and
 * the destination's first lines, and a page is too short for the hardware prefetcher to start.
 * The moves ask for the lines MOVE_AHEAD pages ahead (source to read, destination to write,
 * PREFETCH_ROW_BYTES of each of the first PREFETCH_LAYERS layers' rows), so those misses
 * overlap the copies before them. Only when the lines are fetched changes: the bytes moved
 * are the same. */
#define MOVE_AHEAD 6
#define PREFETCH_ROW_BYTES 256
#define PREFETCH_LAYERS 4
#define PREFETCH_LINES (PREFETCH_LAYERS * PREFETCH_ROW_BYTES / 64)

/* The lines a page's prefetch asks for, as offsets from its first row: worked out once a call
 * (a loop over layers and lines a page was ~25 instructions, 4 % of the engine's). `dense`: the
 * four lines of one contiguous 256 bytes (the engine's page-first 4 x 8 pages), unrolled. */
typedef struct {
    Py_ssize_t off[PREFETCH_LINES];
    int n, dense;
} PageLines;

static void
page_lines(PageLines *pl, Py_ssize_t layer_stride, Py_ssize_t layers, Py_ssize_t rb)
{
    Py_ssize_t bytes = rb < PREFETCH_ROW_BYTES ? rb : PREFETCH_ROW_BYTES;
    pl->n = 0;
    for (Py_ssize_t l = 0; l < layers && l < PREFETCH_LAYERS; l++) {
        for (Py_ssize_t b = 0; b < bytes; b += 64) {
            pl->off[pl->n++] = l * layer_stride + b;
        }
    }
    pl->dense = pl->n == 4;
    for (int q = 0; q < pl->n && pl->dense; q++) {
        pl->dense = pl->off[q] == 64 * q;
    }
}

#define PREFETCH_PAGE(p, pl, rw)                                                               \
    do {                                                                                       \
        const char *p_ = (const char *)(p);                                                    \
        if ((pl)->dense) {                                                                     \
            __builtin_prefetch(p_, rw, 3);                                                     \
            __builtin_prefetch(p_ + 64, rw, 3);                                                \
            __builtin_prefetch(p_ + 128, rw, 3);                                               \
            __builtin_prefetch(p_ + 192, rw, 3);                                               \
        }                                                                                      \
        else {                                                                                 \
            for (int q_ = 0; q_ < (pl)->n; q_++) {                                             \
                __builtin_prefetch(p_ + (pl)->off[q_], rw, 3);                                 \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static PyObject *
cp_move(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer sb, db;
    Ints s, d;
    Py_ssize_t n, nd, layers, rb, sp, dp, runs;
    PageLines from_lines, to_lines;
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
    page_lines(&from_lines, sp * rb, layers, rb);
    page_lines(&to_lines, dp * rb, layers, rb);
#if defined(__SSE2__)
    if (n * layers * rb >= STREAM_MIN_BYTES && rb % 64 == 0 && (uintptr_t)dst % 16 == 0) {
        move_streamed(dst, src, &s, &d, n, layers, rb, sp, dp);
        goto counted;
    }
#endif
    for (Py_ssize_t i = 0, ahead = 0; i < n;) {
        Py_ssize_t j = i + 1;
        while (j < n && s.v[j] == s.v[j - 1] + 1 && d.v[j] == d.v[j - 1] + 1) {
            j++;
        }
        /* the pages MOVE_AHEAD past this run asked for now (each page once) */
        for (Py_ssize_t stop = j + MOVE_AHEAD < n ? j + MOVE_AHEAD : n; ahead < stop; ahead++) {
            PREFETCH_PAGE(src + (Py_ssize_t)s.v[ahead] * rb, &from_lines, 0);
            PREFETCH_PAGE(dst + (Py_ssize_t)d.v[ahead] * rb, &to_lines, 1);
        }
        for (Py_ssize_t l = 0; l < layers; l++) {
            memcpy(dst + (l * dp + (Py_ssize_t)d.v[i]) * rb, src + (l * sp + (Py_ssize_t)s.v[i]) * rb,
                   (size_t)((j - i) * rb));
        }
        i = j;
    }
#if defined(__SSE2__)
counted:
#endif
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

/* The part of a page's values that does not depend on its key, (layer * LAYER_MUL) ^
 * (col * COL_MUL) at [layer * elems + col]: 1 made, 0 the geometry is wider than the table
 * (the caller computes each value as it goes). */
#define PATTERN_MAX 256

static int
content_pattern(const Content *c, uint64_t *pattern)
{
    if (c->layers * c->elems > PATTERN_MAX) {
        return 0;
    }
    for (Py_ssize_t l = 0; l < c->layers; l++) {
        for (Py_ssize_t e = 0; e < c->elems; e++) {
            pattern[l * c->elems + e] = ((uint64_t)l * LAYER_MUL) ^ ((uint64_t)e * COL_MUL);
        }
    }
    return 1;
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
    uint64_t pattern[PATTERN_MAX];
    if (content_pattern(&c, pattern)) {
        /* value = mix(key) ^ pattern[layer][col], the pattern made once a call: a page is
         * one XOR a value (vectorised) instead of two multiplications and two XORs */
        Py_ssize_t row_elems = c.elems;
        PageLines lines;
        page_lines(&lines, c.layer_stride * 8, c.layers, row_elems * 8);
        for (Py_ssize_t i = 0; i < slots.n; i++) {
            uint64_t mixed = (uint64_t)keys.v[i] * MIX;
            int64_t *page = c.base + (Py_ssize_t)slots.v[i] * c.page_stride;
            if (i + MOVE_AHEAD < slots.n) { /* as cp_move: the page MOVE_AHEAD on, for writing */
                PREFETCH_PAGE(c.base + (Py_ssize_t)slots.v[i + MOVE_AHEAD] * c.page_stride, &lines, 1);
            }
            if (c.layer_stride == row_elems) { /* page-first: the page's layers are one block */
                Py_ssize_t m = c.layers * row_elems, k = 0;
#if defined(__SSE2__)
                /* eight values an iteration, two an XOR: the loop's own bookkeeping was most
                 * of a page's ~125 instructions (32 values, the engine's 4 x 8 geometry) */
                const __m128i mk = _mm_set1_epi64x((long long)mixed);
                for (; k + 8 <= m; k += 8) {
                    const __m128i *p = (const __m128i *)(pattern + k);
                    __m128i *d = (__m128i *)(page + k);
                    _mm_storeu_si128(d, _mm_xor_si128(mk, _mm_loadu_si128(p)));
                    _mm_storeu_si128(d + 1, _mm_xor_si128(mk, _mm_loadu_si128(p + 1)));
                    _mm_storeu_si128(d + 2, _mm_xor_si128(mk, _mm_loadu_si128(p + 2)));
                    _mm_storeu_si128(d + 3, _mm_xor_si128(mk, _mm_loadu_si128(p + 3)));
                }
                for (; k + 2 <= m; k += 2) {
                    _mm_storeu_si128((__m128i *)(page + k),
                                     _mm_xor_si128(mk, _mm_loadu_si128((const __m128i *)(pattern + k))));
                }
#endif
                for (; k < m; k++) {
                    page[k] = (int64_t)(mixed ^ pattern[k]);
                }
                continue;
            }
            for (Py_ssize_t l = 0; l < c.layers; l++) {
                int64_t *row = page + l * c.layer_stride;
                const uint64_t *p = pattern + l * row_elems;
                for (Py_ssize_t e = 0; e < row_elems; e++) {
                    row[e] = (int64_t)(mixed ^ p[e]);
                }
            }
        }
    }
    else {
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
"alloc(stack, owned, top, n[, ints]) -> list[int]\n\n"
"Pop n slots off the free stack (stack[:top] are free, the top last), mark them owned and\n"
"return them, the top first: stack[top-1], stack[top-2], ... The caller keeps top - n.\n"
"0 < n <= top is the caller's to ensure (ValueError otherwise); a stacked slot outside the\n"
"pool is a pool bug (AssertionError), found before anything is marked. `ints`, a tuple of\n"
"the pool's slot numbers as ints (ints[s] == s, as long as the pool), lends its objects to\n"
"the list instead of a new int a slot (TypeError for anything else).");

/* Whether the top n slots of the stack are slots of a pool of cap (AssertionError set if not:
 * the stack is the pool's own, only a bug puts anything else there). */
static int
stack_top_in_range(const Py_ssize_t *st, Py_ssize_t cap, Py_ssize_t top, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t slot = st[top - 1 - j];
        if (slot < 0 || slot >= cap) {
            PyErr_Format(PyExc_AssertionError, "free stack holds slot %zd of a pool of %zd (a pool bug)", slot, cap);
            return 0;
        }
    }
    return 1;
}

/* Pop n slots (0 < n <= top <= depth: the caller's to ensure) off the stack, the top first, as a
 * list (each slot's int lent from `ints` when not NULL, else made), and mark them owned. A
 * stacked slot outside the pool is a pool bug: AssertionError, found before anything is marked.
 * NULL with an exception set. */
static PyObject *
slots_pop(const Py_ssize_t *st, unsigned char *own, Py_ssize_t cap, Py_ssize_t top, Py_ssize_t n, PyObject *ints)
{
    PyObject *out;
    if (!stack_top_in_range(st, cap, top, n)) {
        return NULL;
    }
    out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v;
        if (ints != NULL) {  /* the pool's own int for this slot: no allocation, no later free */
            v = PyTuple_GET_ITEM(ints, st[top - 1 - j]);
            Py_INCREF(v);
        } else {
            v = PyLong_FromSsize_t(st[top - 1 - j]);
        }
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, v);
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        own[st[top - 1 - j]] = 1;
    }
    return out;
}

/* Prove every slot of `ix` owned and named once, then clear their owned bytes and push them
 * reversed onto the stack (stack[:top] free, `depth` deep). 1 done, 0 refused having changed
 * nothing (a slot not owned, outside the pool, twice in the list; no room). */
static int
slots_push(Py_ssize_t *st, unsigned char *own, Py_ssize_t cap, Py_ssize_t depth, Py_ssize_t top, const Ints *ix)
{
    Py_ssize_t n = ix->n, i;
    if (top < 0 || top > depth || n > depth - top) {
        return 0;
    }
    /* Owned and named once: mark each slot 2 as it is seen; a slot seen twice, or not 1, stops
     * the free and the marks made so far go back to 1 (they were 1: each was checked). */
    for (i = 0; i < n; i++) {
        int64_t slot = ix->v[i];
        if (slot < 0 || slot >= (int64_t)cap || own[slot] != 1) {
            break;
        }
        own[slot] = 2;
    }
    if (i < n) {
        for (Py_ssize_t j = 0; j < i; j++) {
            own[ix->v[j]] = 1;
        }
        return 0;
    }
    for (i = 0; i < n; i++) {
        own[ix->v[i]] = 0;
        st[top + i] = (Py_ssize_t)ix->v[n - 1 - i];
    }
    return 1;
}

static PyObject *
cp_alloc(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer stack, owned;
    Py_ssize_t top, n, cap, depth;
    PyObject *out = NULL;
    PyObject *ints = NULL;

    if (nargs == 5) {
        ints = args[4];
        nargs = 4;
    }
    if (wrong_nargs(nargs, 4, "alloc() takes 4 or 5 arguments: stack, owned, top, n[, ints]")) {
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
    cap = owned.len;
    depth = stack.len / stack.itemsize;
    if (ints != NULL && (!PyTuple_CheckExact(ints) || PyTuple_GET_SIZE(ints) != cap)) {
        PyErr_Format(PyExc_TypeError, "alloc(): ints must be a tuple of the pool's %zd slot numbers", cap);
        goto done;
    }
    if (n <= 0 || top > depth || n > top) {
        PyErr_Format(PyExc_ValueError, "alloc(): %zd slots off a stack of %zd (%zd deep)", n, top, depth);
        goto done;
    }
    out = slots_pop(stack.buf, owned.buf, cap, top, n, ints);
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
    Py_ssize_t top;
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
    if (slots_push(stack.buf, owned.buf, owned.len, stack.len / stack.itemsize, top, &ix)) {
        result = PyLong_FromSsize_t(top + ix.n);
    } else {
        result = not_mine();
    }
    ints_free(&ix);
    PyBuffer_Release(&stack);
    PyBuffer_Release(&owned);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* SlotCore: PagePool's base on the compiled data plane. It holds the pool's stack, owned bytes
 * and the template its slot runs are cut from (or a tuple of lent ints: lists then; bound once) and the free count, so the engine's pool.alloc(n) / pool.free(slots)
 * are one call into C, with no interpreted wrapper frame and no buffer export a call (issue 41,
 * session 19). What it does not take (n outside (0, free_pages], a free it refuses, a list of
 * anything but ints) goes, having changed nothing, to the pool's numpy method of the same
 * arguments (_alloc_numpy / _free_numpy), which answers or raises as it always has. */

typedef struct {
    PyObject_HEAD
    Py_ssize_t top;      /* stack[:top] are the free slots: PagePool.free_pages */
    PyObject *top_obj;   /* top as an int, made at the first read after it changes and kept
                          * (read ~30 times a request; a decode step's allocs and an eviction's
                          * frees change it several times between reads) */
    PyObject *ints;      /* array('q') template: alloc hands out slices of it (runs); a tuple of the
                          * pool's slot numbers: lent to the lists alloc hands out */
    Py_buffer stack, owned;
    int bound;
} SlotCore;

static void
core_unbind(SlotCore *self)
{
    if (self->bound) {
        PyBuffer_Release(&self->stack);
        PyBuffer_Release(&self->owned);
        self->bound = 0;
    }
    Py_CLEAR(self->ints);
}

static void
core_dealloc(SlotCore *self)
{
    core_unbind(self);
    Py_CLEAR(self->top_obj);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A slot run template: an int64 buffer object (array('q')) as long as the pool, whose slices
 * are the runs alloc hands out (the pool's runs mode: no int object a slot); a run longer than
 * the template is its first item repeated. */
static int
is_run_template(PyObject *o, Py_ssize_t cap)
{
    Py_buffer b;
    int ok;
    if (PyTuple_Check(o) || PyList_Check(o) || !PyObject_CheckBuffer(o)) {
        return 0;
    }
    if (PyObject_GetBuffer(o, &b, PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    ok = b.ndim == 1 && b.itemsize == 8 && b.len >= 8 && b.len <= 8 * (cap > 1 ? cap : 1) && b.format != NULL
         && (b.format[0] == 'q' || b.format[0] == 'l') && b.format[1] == '\0';
    PyBuffer_Release(&b);
    return ok;
}

/* n slots popped off the stack into a new run, a slice of `tmpl` (the pool's template). */
static PyObject *
slots_pop_run(const Py_ssize_t *st, unsigned char *own, Py_ssize_t cap, Py_ssize_t top, Py_ssize_t n, PyObject *tmpl)
{
    PyObject *out;
    Py_buffer b;
    int64_t *v;
    if (!stack_top_in_range(st, cap, top, n)) {
        return NULL;
    }
    if (n <= PyObject_Length(tmpl)) {
        out = PySequence_GetSlice(tmpl, 0, n);
    } else {
        PyObject *one = PySequence_GetSlice(tmpl, 0, 1);
        out = one == NULL ? NULL : PySequence_Repeat(one, n);
        Py_XDECREF(one);
    }
    if (out == NULL) {
        return NULL;
    }
    b.obj = NULL;
    {
        const int64_t *items;
        Py_ssize_t len;
        if (run_items(out, &items, &len) && len == n) {  /* this call's own new run: written in place */
            v = (int64_t *)items;
        } else if (PyObject_GetBuffer(out, &b, PyBUF_WRITABLE) < 0) {
            Py_DECREF(out);
            return NULL;
        } else {
            v = (int64_t *)b.buf;
        }
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t slot = st[top - 1 - j];
        v[j] = (int64_t)slot;
        own[slot] = 1;
    }
    if (b.obj != NULL) {
        PyBuffer_Release(&b);
    }
    return out;
}

PyDoc_STRVAR(core_bind_doc,
"_bind(stack, owned, ints)\n\n"
"Hold the pool's free stack (1-D intp, writable) and owned bytes (writable, one a slot), both as\n"
"long as the pool, for alloc and free; `ints`: an int64 array('q') of 1 to the pool's length\n"
"items (alloc hands out slot runs cut from it) or a tuple of the pool's slot numbers\n"
"(ints[s] == s, as long as the pool: alloc hands out lists of them).");

static PyObject *
core_bind(SlotCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer stack, owned;
    Py_ssize_t cap;
    if (wrong_nargs(nargs, 3, "_bind() takes 3 arguments: stack, owned, ints")) {
        return NULL;
    }
    if (!get_pool(args[0], args[1], &stack, &owned)) {
        PyErr_SetString(PyExc_TypeError, "_bind(): stack must be a writable intp buffer, owned a writable byte buffer");
        return NULL;
    }
    cap = owned.len;
    if (stack.ndim != 1 || stack.len / stack.itemsize != cap
        || !(is_run_template(args[2], cap) || (PyTuple_CheckExact(args[2]) && PyTuple_GET_SIZE(args[2]) == cap))) {
        PyBuffer_Release(&stack);
        PyBuffer_Release(&owned);
        PyErr_Format(PyExc_TypeError, "_bind(): the stack and ints must be as long as the owned bytes (%zd)", cap);
        return NULL;
    }
    core_unbind(self);
    self->stack = stack;
    self->owned = owned;
    self->ints = Py_NewRef(args[2]);
    self->bound = 1;
    Py_RETURN_NONE;
}

/* The pool's numpy method `name` of the same arguments: what the compiled one declines. */
static PyObject *
core_numpy(SlotCore *self, const char *name, PyObject *arg)
{
    return PyObject_CallMethod((PyObject *)self, name, "O", arg);
}

static int
core_set_top(SlotCore *self, Py_ssize_t top)
{
    if (self->top != top) {
        Py_CLEAR(self->top_obj);  /* made again by the next read (core_get_top) */
    }
    self->top = top;
    return 0;
}

PyDoc_STRVAR(core_alloc_doc,
"_alloc_c(n) -> list[int] | None\n\n"
"PagePool._alloc_numpy(n) in one C call: n slots popped off the free stack, the top first,\n"
"marked owned; the pool's numpy method answers n outside (0, free_pages] (None, [], an error).");

static PyObject *
core_alloc(SlotCore *self, PyObject *arg)
{
    Py_ssize_t n, top = self->top;
    PyObject *out;
    int overflow = 0;
    if (!self->bound || !PyLong_CheckExact(arg)) {
        return core_numpy(self, "_alloc_numpy", arg);
    }
    n = (Py_ssize_t)PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (overflow || n <= 0 || n > top || top > self->stack.len / self->stack.itemsize) {
        return core_numpy(self, "_alloc_numpy", arg);
    }
    if (PyTuple_CheckExact(self->ints)) {
        out = slots_pop(self->stack.buf, self->owned.buf, self->owned.len, top, n, self->ints);
    } else {
        out = slots_pop_run(self->stack.buf, self->owned.buf, self->owned.len, top, n, self->ints);
    }
    if (out != NULL && core_set_top(self, top - n) < 0) {
        Py_CLEAR(out);
    }
    return out;
}

PyDoc_STRVAR(core_free_doc,
"_free_c(slots)\n\n"
"PagePool._free_numpy(slots) in one C call: every slot proved owned and named once (marked as\n"
"it is seen, no set), then cleared and pushed reversed. A free it refuses, having changed\n"
"nothing, goes to the pool's numpy method, which names the slot and raises.");

static PyObject *
core_free(SlotCore *self, PyObject *slots)
{
    Ints ix;
    int got;
    if (!self->bound || (!PyList_CheckExact(slots) && !PyTuple_CheckExact(slots)
                         && Py_TYPE(slots) != Py_TYPE(self->ints))) {
        return core_numpy(self, "_free_numpy", slots);
    }
    got = ints_load(slots, &ix);
    if (got < 0) {
        return NULL;
    }
    if (got == 0 || !slots_push(self->stack.buf, self->owned.buf, self->owned.len,
                                self->stack.len / self->stack.itemsize, self->top, &ix)) {
        ints_free(&ix);
        return core_numpy(self, "_free_numpy", slots);
    }
    got = core_set_top(self, self->top + ix.n);
    ints_free(&ix);
    if (got < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
core_get_top(SlotCore *self, void *Py_UNUSED(closure))
{
    if (self->top_obj == NULL && (self->top_obj = PyLong_FromSsize_t(self->top)) == NULL) {
        return NULL;
    }
    return Py_NewRef(self->top_obj);
}

static int
core_set_top_attr(SlotCore *self, PyObject *value, void *Py_UNUSED(closure))
{
    Py_ssize_t top;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "free_pages cannot be deleted");
        return -1;
    }
    top = PyNumber_AsSsize_t(value, PyExc_OverflowError);
    if (top == -1 && PyErr_Occurred()) {
        return -1;
    }
    return core_set_top(self, top);
}

static PyMethodDef core_methods[] = {
    {"_bind", (PyCFunction)(void (*)(void))core_bind, METH_FASTCALL, core_bind_doc},
    {"_alloc_c", (PyCFunction)core_alloc, METH_O, core_alloc_doc},
    {"_free_c", (PyCFunction)core_free, METH_O, core_free_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"free_pages", (getter)core_get_top, (setter)core_set_top_attr,
     "the free slots: stack[:free_pages] (an int, settable)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject cp_SlotCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.SlotCore",
    .tp_basicsize = sizeof(SlotCore),
    .tp_dealloc = (destructor)core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "PagePool's base on the compiled data plane: its slot stack's alloc and free in C.",
    .tp_methods = core_methods,
    .tp_getset = core_getset,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------ */

PyMethodDef cp_pages_methods[] = {
    {"move", (PyCFunction)(void (*)(void))cp_move, METH_FASTCALL, move_doc},
    {"write_content", (PyCFunction)(void (*)(void))cp_write_content, METH_FASTCALL, write_content_doc},
    {"verify_content", (PyCFunction)(void (*)(void))cp_verify_content, METH_FASTCALL, verify_content_doc},
    {"alloc", (PyCFunction)(void (*)(void))cp_alloc, METH_FASTCALL, alloc_doc},
    {"free", (PyCFunction)(void (*)(void))cp_free, METH_FASTCALL, free_doc},
    {NULL, NULL, 0, NULL},
};
