/* LRU stack depths in one pass (Mattson's algorithm over a Fenwick tree): the compiled side of
 * tierdiag/diagnose/run/size_curves.py `_depths_python`, which is the reference (same arguments, same
 * result; tests/diagnose/test_size_curves.py runs both). A module of its own, apart from the data
 * plane (_cplane): it is diagnose's, read at a run's close, never by the engine.
 *
 * depths(prev, starts, query) -> the number of looked-up touches, k; their answers, in order,
 * written over prev[0 .. k) (prev is a writable buffer and the pass's output: no second array of
 * a touch, issue 41's 1M close):
 *   prev[t]   the position of the previous touch of the same key (-1: none), positions 0..n-1
 *   starts[g] the first position of group g (ascending, starts[0] == 0); a group ends where the
 *             next starts (the last at n). Every touch of a group is answered against the stack
 *             as it was before the group, then the group's touches become the latest.
 *   query[t]  1: answer touch t; 0: touch only (no answer)
 * answer: -1 where the key was never touched before, else its LRU stack depth (1 = the most
 * recently touched key): the number of distinct keys whose latest touch is at or after prev[t].
 * A group's answers wait in a scratch of one group while its touches are made; the k-th answer
 * is written at position k, at or below the touch it answers, whose prev is read by then.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

/* One pass over the groups with a Fenwick tree of TYPE counts (see depths). */
#define PASS(TYPE, TREE) do {                                                                     \
    TYPE *tr = (TREE);                                                                            \
    int64_t live = 0;                                                                             \
    Py_ssize_t o = 0;                                                                             \
    for (Py_ssize_t k = 0; k < g; k++) {                                                          \
        Py_ssize_t a = (Py_ssize_t)st[k], b = k + 1 < g ? (Py_ssize_t)st[k + 1] : n;              \
        for (Py_ssize_t t = a; t < b; t++) {                                                      \
            if (!q[t]) continue;                                                                  \
            if (pv[t] < 0) { scratch[t - a] = -1; continue; }                                     \
            int64_t below = 0; /* live latest touches at positions < prev[t] */                   \
            for (Py_ssize_t i = (Py_ssize_t)pv[t]; i > 0; i -= i & -i) below += tr[i];            \
            scratch[t - a] = live - below;                                                        \
        }                                                                                         \
        for (Py_ssize_t t = a; t < b; t++) {                                                      \
            int64_t p = pv[t];                                                                    \
            if (p >= 0) {                                                                         \
                for (Py_ssize_t i = (Py_ssize_t)p + 1; i <= n; i += i & -i) tr[i] -= 1;          \
            } else {                                                                              \
                live += 1;                                                                        \
            }                                                                                     \
            for (Py_ssize_t i = t + 1; i <= n; i += i & -i) tr[i] += 1;                           \
            if (q[t]) pv[o++] = scratch[t - a]; /* o <= t: prev[o] is read already */             \
        }                                                                                         \
    }                                                                                             \
    asked = o;                                                                                    \
} while (0)

/* The three buffers `feed` takes: ids (int64 a touch), query (one byte a touch), sizes (int64 a
 * group). 0, or -1 with the error set (the buffers released) when they are not buffers or not of
 * those sizes. */
static int three_buffers(PyObject *args, Py_buffer *a, Py_buffer *b, Py_buffer *c, const char *msg) {
    if (!PyArg_ParseTuple(args, "y*y*y*", a, b, c)) return -1;
    Py_buffer *touch = a, *bytes = b, *group = c;
    if (touch->len % 8 || group->len % 8 || bytes->len != touch->len / 8) {
        PyErr_SetString(PyExc_ValueError, msg);
        PyBuffer_Release(a); PyBuffer_Release(b); PyBuffer_Release(c);
        return -1;
    }
    return 0;
}

static PyObject *depths(PyObject *self, PyObject *args) {
    Py_buffer prev, starts, query;
    if (!PyArg_ParseTuple(args, "w*y*y*", &prev, &starts, &query)) return NULL;
    if (prev.len % 8 || starts.len % 8 || query.len != prev.len / 8) {
        PyErr_SetString(PyExc_ValueError, "depths: prev and starts are int64, query one byte a touch");
        PyBuffer_Release(&prev); PyBuffer_Release(&starts); PyBuffer_Release(&query);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = prev.len / 8, g = starts.len / 8, widest = 0, asked = 0;
    int64_t *pv = (int64_t *)prev.buf;
    const int64_t *st = (const int64_t *)starts.buf;
    const uint8_t *q = (const uint8_t *)query.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pv[i] < -1 || pv[i] >= i) { PyErr_SetString(PyExc_ValueError, "depths: prev[t] must be in [-1, t)"); goto done; }
    for (Py_ssize_t i = 0; i < g; i++) {
        if (st[i] < 0 || st[i] > n || (i && st[i] < st[i - 1]) || (i == 0 && st[0] != 0)) {
            PyErr_SetString(PyExc_ValueError, "depths: starts must ascend from 0 within [0, n]"); goto done;
        }
        Py_ssize_t end = i + 1 < g ? (Py_ssize_t)st[i + 1] : n;
        if (end - (Py_ssize_t)st[i] > widest) widest = end - (Py_ssize_t)st[i];
    }
    /* The tree's counts are at most n: 32-bit ones where n allows (half the memory a walk up
     * the tree touches; the pass is cache misses, ~25 % less time on the conversation trace's
     * 4.6M touches, issue 41), else 64-bit. The same answers either way. */
    void *tree = calloc((size_t)n + 1, n < INT32_MAX ? sizeof(int32_t) : sizeof(int64_t));
    int64_t *scratch = malloc((size_t)(widest ? widest : 1) * sizeof(int64_t));
    if (!tree || !scratch) { free(tree); free(scratch); PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    if (n < INT32_MAX)
        PASS(int32_t, (int32_t *)tree);
    else
        PASS(int64_t, (int64_t *)tree);
    Py_END_ALLOW_THREADS
    free(tree);
    free(scratch);
    result = PyLong_FromSsize_t(asked);
done:
    PyBuffer_Release(&prev);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&query);
    return result;
}


/* previous(keys) -> None: each touch's key written over with the position of the previous touch
 * of the same key (-1: none), keys an int64 buffer, positions 0..n-1 (fewer than 2**31): the
 * `prev` that `depths` takes (size_curves.py `_previous_python` is the reference). One pass with
 * an open-addressing table of the distinct keys (key and its latest position, 12 bytes a slot,
 * at most 3/4 full), not a stable sort of every touch: a sampled close's ~20M touches have ~1.6M
 * distinct keys, so the table is ~48 MB where the sort's order and buffer were ~12 bytes a touch
 * (issue 41's 1M close). */
/* A key's slot: MurmurHash3's 64-bit finaliser, top bits. Not key x the golden ratio alone: the
 * sampled pass keeps exactly the keys whose key x that constant is small (size_curves.py
 * `_sampler`), which would all land in the table's first slots. */
static uint64_t sd_slot(int64_t key, int bits) {
    uint64_t h = (uint64_t)key;
    h ^= h >> 33; h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h >> (64 - bits);
}

static PyObject *previous(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "w*", &buf)) return NULL;
    if (buf.len % 8) {
        PyErr_SetString(PyExc_ValueError, "previous: keys are int64");
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t n = buf.len / 8;
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "previous: 2**31 touches or more");
        PyBuffer_Release(&buf);
        return NULL;
    }
    int64_t *ks = (int64_t *)buf.buf;
    int bits = 10, failed = 0;
    size_t cap = (size_t)1 << bits, used = 0;
    int64_t *tkey = malloc(cap * sizeof(int64_t));
    int32_t *tpos = malloc(cap * sizeof(int32_t));
    if (!tkey || !tpos) { free(tkey); free(tpos); PyBuffer_Release(&buf); return PyErr_NoMemory(); }
    memset(tpos, 0xff, cap * sizeof(int32_t)); /* -1: an empty slot */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0; t < n; t++) {
        if (4 * (used + 1) > 3 * cap) { /* grow: twice the slots, every key placed again */
            size_t ncap = cap * 2;
            int64_t *nkey = malloc(ncap * sizeof(int64_t));
            int32_t *npos = malloc(ncap * sizeof(int32_t));
            if (!nkey || !npos) { free(nkey); free(npos); failed = 1; break; }
            memset(npos, 0xff, ncap * sizeof(int32_t));
            for (size_t i = 0; i < cap; i++) {
                if (tpos[i] < 0) continue;
                uint64_t j = sd_slot(tkey[i], bits + 1);
                while (npos[j] >= 0) j = (j + 1) & (ncap - 1);
                nkey[j] = tkey[i]; npos[j] = tpos[i];
            }
            free(tkey); free(tpos);
            tkey = nkey; tpos = npos; cap = ncap; bits += 1;
        }
        int64_t key = ks[t];
        uint64_t j = sd_slot(key, bits);
        while (tpos[j] >= 0 && tkey[j] != key) j = (j + 1) & (cap - 1);
        if (tpos[j] >= 0) {
            ks[t] = tpos[j];
        } else {
            ks[t] = -1; tkey[j] = key; used += 1;
        }
        tpos[j] = (int32_t)t;
    }
    Py_END_ALLOW_THREADS
    free(tkey); free(tpos);
    PyBuffer_Release(&buf);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}


typedef struct { int64_t key; int32_t id; int32_t unused; } sd_slot_t; /* a key and its id in one cache line */
#define SD_AHEAD 16 /* keys ahead whose slot is prefetched */

/* keys[0 .. n) numbered by first appearance, 0 .. d - 1, each key's number written to out64[t] (which
 * may be keys itself: a key is read before its number is written) or, where out64 is NULL, to
 * out32[t]: d, or -1 out of memory (the numbers then partly written). The open-addressing table of
 * dense_ids and block_ids: sized at once for every key distinct, up to 2**22 slots (64 MB), then
 * grown; each growth places every key again, at random (the conversation trace's 2.3M keys, 1.4M
 * distinct, grew the table eleven times from 1,024 slots). No Python API: run without the GIL. */
static int64_t sd_number(const int64_t *keys, Py_ssize_t n, int64_t *out64, int32_t *out32) {
    int bits = 10;
    while (bits < 22 && ((size_t)1 << bits) * 3 < (size_t)n * 4) bits++;
    size_t cap = (size_t)1 << bits;
    int32_t used = 0;
    sd_slot_t *tab = malloc(cap * sizeof(sd_slot_t));
    if (!tab) return -1;
    for (size_t i = 0; i < cap; i++) tab[i].id = -1; /* -1: an empty slot */
    for (Py_ssize_t t = 0; t < n; t++) {
        if (4 * ((size_t)used + 1) > 3 * cap) { /* grow: twice the slots, every key placed again */
            size_t ncap = cap * 2;
            sd_slot_t *ntab = malloc(ncap * sizeof(sd_slot_t));
            if (!ntab) { free(tab); return -1; }
            for (size_t i = 0; i < ncap; i++) ntab[i].id = -1;
            for (size_t i = 0; i < cap; i++) {
                if (tab[i].id < 0) continue;
                uint64_t j = sd_slot(tab[i].key, bits + 1);
                while (ntab[j].id >= 0) j = (j + 1) & (ncap - 1);
                ntab[j] = tab[i];
            }
            free(tab);
            tab = ntab; cap = ncap; bits += 1;
        }
        /* The slot of a key a few places ahead asked for now: the table is larger than the caches
         * (1.4M keys: 32 MB), and a miss's wait is then spent on the keys between. */
        if (t + SD_AHEAD < n) __builtin_prefetch(&tab[sd_slot(keys[t + SD_AHEAD], bits)]);
        int64_t key = keys[t];
        uint64_t j = sd_slot(key, bits);
        while (tab[j].id >= 0 && tab[j].key != key) j = (j + 1) & (cap - 1);
        if (tab[j].id < 0) { tab[j].key = key; tab[j].id = used++; }
        if (out64) out64[t] = tab[j].id;
        else out32[t] = tab[j].id;
    }
    free(tab);
    return used;
}

/* dense_ids(keys, lens) -> the number of distinct keys, d: each key written over with its dense id,
 * 0 .. d - 1 in the order the keys first come, then each request's ids reversed in place (its keys
 * are keys[off .. off + lens[i]), the requests end to end; lens int64, adding up to the keys): the
 * live pass's index (diagnose/run/live_curves.py `dense_ids`, whose numpy `_dense_ids_numpy` is the
 * reference). One pass with an open-addressing table of the distinct keys (key and id, 16 bytes a
 * slot, at most 3/4 full), not a sort of the distinct keys and a binary search of every key
 * in them (issue 41: ~0.18 s of the writer's CPU on the conversation trace's ~1.4M distinct keys).
 * The ids name keys only to the stack, whose answers do not depend on how they are numbered. */
static PyObject *dense_ids(PyObject *self, PyObject *args) {
    Py_buffer buf, lbuf;
    if (!PyArg_ParseTuple(args, "w*y*", &buf, &lbuf)) return NULL;
    Py_ssize_t n = buf.len / 8, g = lbuf.len / 8;
    const int64_t *ln = (const int64_t *)lbuf.buf;
    int64_t *ks = (int64_t *)buf.buf;
    int64_t total = 0;
    int bad = buf.len % 8 || lbuf.len % 8;
    for (Py_ssize_t i = 0; !bad && i < g; i++) {
        if (ln[i] < 0 || ln[i] > n - total) bad = 1;
        else total += ln[i];
    }
    if (bad || total != n) {
        PyErr_SetString(PyExc_ValueError, "dense_ids: keys and lens are int64, lens >= 0 adding up to the keys");
        PyBuffer_Release(&buf); PyBuffer_Release(&lbuf);
        return NULL;
    }
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "dense_ids: 2**31 keys or more");
        PyBuffer_Release(&buf); PyBuffer_Release(&lbuf);
        return NULL;
    }
    int64_t used;
    Py_BEGIN_ALLOW_THREADS
    used = sd_number(ks, n, ks, NULL);
    if (used >= 0) {
        Py_ssize_t a = 0;
        for (Py_ssize_t i = 0; i < g; i++) { /* each request's ids backwards */
            for (Py_ssize_t lo = a, hi = a + (Py_ssize_t)ln[i] - 1; lo < hi; lo++, hi--) {
                int64_t x = ks[lo]; ks[lo] = ks[hi]; ks[hi] = x;
            }
            a += (Py_ssize_t)ln[i];
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf); PyBuffer_Release(&lbuf);
    if (used < 0) return PyErr_NoMemory();
    return PyLong_FromLong((long)used);
}

/* block_ids(hids, blocks, lens, per_block, out) -> the number of ids, d x per_block (d: distinct
 * hash ids): the live pass's index made from the trace's hash ids, not from its page keys
 * (diagnose/run/live_curves.py `block_ids`, whose numpy `_block_ids_numpy` is the reference and
 * writes the same numbers). Request i has blocks[i] hash ids (hids end to end) and its first
 * lens[i] pages (at most blocks[i] x per_block): page p is page p % per_block of its block
 * p / per_block, whose key is hash id x per_block + p % per_block (trace/pages.py), so a page's
 * id is the dense number of its hash id (0 .. d - 1, in the order the hash ids first come) x
 * per_block + p % per_block: distinct pages, distinct ids, as dense_ids would number their keys
 * (differently named: the stack's answers do not depend on names). Written to out (int64, the
 * requests' pages end to end, each request's backwards: deepest first). One hash-table pass over
 * the hash ids (a plain hash_ids trace: 1 / per_block of its pages, issue 41: the writer's keys
 * never made), the table as dense_ids keeps it. */
static PyObject *block_ids(PyObject *self, PyObject *args) {
    Py_buffer hbuf, bbuf, lbuf, obuf;
    long long per;
    if (!PyArg_ParseTuple(args, "y*y*y*Lw*", &hbuf, &bbuf, &lbuf, &per, &obuf)) return NULL;
    Py_ssize_t n = hbuf.len / 8, g = bbuf.len / 8, m = obuf.len / 8;
    const int64_t *hs = (const int64_t *)hbuf.buf, *bl = (const int64_t *)bbuf.buf, *ln = (const int64_t *)lbuf.buf;
    int64_t *out = (int64_t *)obuf.buf;
    int bad = hbuf.len % 8 || bbuf.len % 8 || lbuf.len % 8 || obuf.len % 8 || lbuf.len != bbuf.len
              || per < 1 || per >= INT32_MAX;
    int64_t tb = 0, tl = 0;
    for (Py_ssize_t i = 0; !bad && i < g; i++) {
        if (bl[i] < 0 || bl[i] > n - tb || ln[i] < 0 || ln[i] > bl[i] * per || ln[i] > m - tl) bad = 1;
        else { tb += bl[i]; tl += ln[i]; }
    }
    if (bad || tb != n || tl != m) {
        PyErr_SetString(PyExc_ValueError, "block_ids: hids, blocks, lens and out are int64, blocks >= 0 adding up "
                        "to the hids, 0 <= lens <= blocks x per_block adding up to out, 1 <= per_block < 2**31");
        PyBuffer_Release(&hbuf); PyBuffer_Release(&bbuf); PyBuffer_Release(&lbuf); PyBuffer_Release(&obuf);
        return NULL;
    }
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "block_ids: 2**31 hash ids or more");
        PyBuffer_Release(&hbuf); PyBuffer_Release(&bbuf); PyBuffer_Release(&lbuf); PyBuffer_Release(&obuf);
        return NULL;
    }
    int32_t *num = malloc((size_t)(n ? n : 1) * sizeof(int32_t)); /* each hash id's number */
    if (!num) {
        PyBuffer_Release(&hbuf); PyBuffer_Release(&bbuf); PyBuffer_Release(&lbuf); PyBuffer_Release(&obuf);
        return PyErr_NoMemory();
    }
    int64_t used;
    Py_BEGIN_ALLOW_THREADS
    used = sd_number(hs, n, NULL, num);
    if (used >= 0) {
        Py_ssize_t a = 0, o = 0;
        for (Py_ssize_t i = 0; i < g; i++) { /* each request's pages, backwards */
            int64_t L = ln[i];
            for (int64_t p = 0; p < L; p++)
                out[o + L - 1 - p] = (int64_t)num[a + p / per] * per + p % per;
            a += (Py_ssize_t)bl[i];
            o += (Py_ssize_t)L;
        }
    }
    Py_END_ALLOW_THREADS
    free(num);
    PyBuffer_Release(&hbuf); PyBuffer_Release(&bbuf); PyBuffer_Release(&lbuf); PyBuffer_Release(&obuf);
    if (used < 0) return PyErr_NoMemory();
    return PyLong_FromLongLong((long long)used * per);
}


/* ------------------------------------------------------------------------------------------------
 * Stack: the same pass fed a group at a time, as the touches come (the close's pass, and the one a
 * writer process runs while the run is recorded: diagnose/run/live_curves.py `new_stack`, whose
 * Python twin `StackPython` is the reference). Keys are dense ids, 0 .. ids - 1 (Stack(ids)), or
 * -1 for a key touched once only (an output page); a key's latest position is `last[id]` (32-bit: positions stay under 2**30), so a
 * previous touch is one array read, not a sort of every touch. What is counted is the positions keys
 * have left (touched again since), not the keys' marks: every position was marked when touched, so a
 * touch at the end adds nothing and only a moved key's old place is taken out (issue 41: the mark's
 * walk up from a fresh position, to the tree's top through cold nodes, was ~45 % of the conversation
 * trace's feed; StackPython keeps the marks, the same answers). The positions left are a bit a
 * position, and a Fenwick tree over the bits' 64-position words counts them a word at a time: the
 * positions left below p are the tree's prefix over p's word's predecessors and a popcount of p's own
 * word (issue 41, session 36: a tree over every position, 4 bytes each, was 16 MiB at the
 * conversation trace's ~4M touches, and a move's walk up it half of the walk's CPU in cache misses;
 * the words' tree is 1/64 of it, 64 KiB a million positions, and stays in cache). Both double as the
 * positions grow: a power-of-two tree keeps its nodes, the new top node holding every position left.
 *
 * feed(ids, query, sizes) -> bytes of int64, one per queried touch, in order: the groups laid end
 * to end (ids int64, query one byte a key, sizes int64: group g is the next sizes[g] keys). Each
 * queried key is answered against the stack as it was before its group (-1: never touched; its
 * depth otherwise; 0 where the same key came earlier in the same group, as `depths` answers it),
 * then the group's keys are touched in order. The answers are those of `depths` over every touch
 * fed so far, prev[t] being the previous touch of the same id (none for -1).
 */

/* The set bits of a word: the instruction where the compiler may use it (or on a machine where the builtin is
 * one), else a few shifts and adds inline, not libgcc's call (issue 41, session 36: ~14 % of the walk, perf). */
static inline int64_t sd_bits_set(uint64_t x) {
#if defined(__POPCNT__) || !(defined(__x86_64__) || defined(__i386__))
    return __builtin_popcountll(x);
#else
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
    return (int64_t)((x * 0x0101010101010101ULL) >> 56);
#endif
}

typedef struct {
    PyObject_HEAD
    int32_t *last;    /* each id's latest position (-1: not touched yet; positions stay under 2**30) */
    int64_t ids;
    uint64_t *bits;   /* cap / 64 words: bit p % 64 of word p / 64 set where position p is one a key has left
                       * (touched again since): every position below n was marked once when touched, so the
                       * marks below p are p less these; a touch sets none, only a key's move sets its old one */
    int32_t *tree;    /* Fenwick tree over the words 1..cap / 64: how many positions of each word are left */
    int64_t cap;      /* positions: a power of two, >= 4096 (64 words) */
    int64_t n;        /* positions used (since the last renumbering: `sd_compact`) */
    int64_t live;     /* distinct keys touched (each -1 a key of its own): the marked positions, n less the tree's */
    int64_t fed;      /* touches fed so far */
} StackObject;

/* Renumber the marked positions 0..live-1, in their order, and the ids' latest positions with them.
 * A depth counts the marks after a key's previous touch, which only their order decides, so every
 * answer after is the same; the tree then covers the keys still marked, not every touch fed (issue 41:
 * a sampled size-curves pass fed ~20M touches over ~2M marks held a 2**25-slot tree, 128 MiB, through
 * the run). O(cap + ids). */
static void sd_compact(StackObject *s) {
    int32_t *before = s->tree;  /* reused: the marked positions in the words before each word */
    const uint64_t *bits = s->bits;
    int64_t words = s->cap >> 6, n = s->n, used = (n + 63) >> 6;
    int32_t k = 0;
    for (int64_t w = 0; w < used; w++) {
        uint64_t in = (w == used - 1 && (n & 63)) ? (((uint64_t)1 << (n & 63)) - 1) : ~(uint64_t)0;
        before[w] = k;
        k += (int32_t)sd_bits_set(~bits[w] & in);
    }
    /* Each id's latest position (marked: a key's latest touch is never one it left) renumbered: its rank
     * among the marked ones. */
    for (int64_t id = 0; id < s->ids; id++) {
        int32_t p = s->last[id];
        if (p >= 0)
            s->last[id] = before[p >> 6]
                          + (int32_t)sd_bits_set(~bits[p >> 6] & ((((uint64_t)1) << (p & 63)) - 1));
    }
    /* Positions 0..k-1, every one marked: none left. */
    memset(s->bits, 0, (size_t)words * sizeof(uint64_t));
    memset(s->tree, 0, ((size_t)words + 1) * sizeof(int32_t));
    s->n = k;
}

/* Room for positions up to `need`: the bits and the words' tree doubled; the new words are positions
 * not used yet, and the new nodes cover those but the top one, whose range is every word: it holds
 * every position left (n - live). */
static int sd_grow_tree(StackObject *s, int64_t need) {
    int64_t cap = s->cap;
    while (cap < need) {
        if (cap >= (INT32_MAX >> 1)) return -2;
        int64_t words = cap >> 6;
        uint64_t *b = realloc(s->bits, (size_t)words * 2 * sizeof(uint64_t));
        if (!b) return -1;
        memset(b + words, 0, (size_t)words * sizeof(uint64_t));
        s->bits = b;
        int32_t *t = realloc(s->tree, ((size_t)words * 2 + 1) * sizeof(int32_t));
        if (!t) return -1;
        memset(t + words + 1, 0, (size_t)words * sizeof(int32_t));
        t[words * 2] = (int32_t)(s->n - s->live);
        s->tree = t;
        cap *= 2;
        s->cap = cap;
    }
    return 0;
}

/* A stack's `last`: `ids` int32s, every one -1 (not touched yet). Written whole here, so where it
 * spans a 2 MiB huge page or more it is one of whole huge pages (2 MiB aligned, MADV_HUGEPAGE:
 * transparent huge pages where the kernel offers them on request, else the same plain pages): a
 * --dp 8 run's writer makes one a rank and one over every rank, each the whole trace's distinct
 * pages (~3 MiB a stack on the conversation trace), and their fills were ~7 k minor faults of
 * its ~77 k (issue 41, session 37). At most 2 MiB past the fill is touched, once. */
static int32_t *sd_last_new(int64_t ids) {
    const size_t bytes = (size_t)(ids ? ids : 1) * sizeof(int32_t);
    int32_t *last = NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const size_t huge = (size_t)2 << 20;
    if (bytes >= huge) {
        const size_t whole = (bytes + huge - 1) & ~(huge - 1);
        void *p = NULL;
        if (posix_memalign(&p, huge, whole) == 0) {
            last = p;
            /* a hint: where it is refused (no transparent huge pages) the pages are plain ones */
            (void)madvise(p, whole, MADV_HUGEPAGE);
        }
    }
#endif
    if (!last) last = malloc(bytes);
    if (last) memset(last, 0xff, bytes);  /* -1 */
    return last;
}

static PyObject *stack_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    long long ids;
    if (!PyArg_ParseTuple(args, "L:Stack", &ids)) return NULL;
    if (ids < 0 || ids >= INT64_MAX / 16) { PyErr_SetString(PyExc_ValueError, "Stack: ids must be >= 0"); return NULL; }
    StackObject *s = (StackObject *)type->tp_alloc(type, 0);
    if (!s) return NULL;
    s->ids = ids;
    s->last = sd_last_new(ids);
    s->cap = 4096;
    s->bits = calloc((size_t)(s->cap >> 6), sizeof(uint64_t));
    s->tree = calloc((size_t)(s->cap >> 6) + 1, sizeof(int32_t));
    if (!s->last || !s->bits || !s->tree) { Py_DECREF(s); return PyErr_NoMemory(); }
    return (PyObject *)s;
}

static void stack_dealloc(StackObject *s) {
    free(s->last); free(s->bits); free(s->tree);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* The groups fed (ks, q, sz: m keys in g groups, validated by the caller: sizes add up to m, ids in
 * [-1, ids)) answered and touched: `feed`'s work, and `walk`'s once it has laid its groups out.
 * Returns the answers as bytes (`asked` of them), or NULL with the error set. */
static PyObject *sd_run(StackObject *s, const int64_t *ks, const uint8_t *q, const int64_t *sz, Py_ssize_t g,
                        Py_ssize_t m, int64_t asked) {
    if (s->n + m > s->cap) {
        int64_t need = s->n + m;
        /* Renumbered first where the ids are few beside the tree (the cost is O(cap + ids)), then
         * grown only as far as to leave half of it free: renumbered at most once every cap / 2 touches. */
        if (s->n > s->live && s->ids <= 4 * s->cap) {
            sd_compact(s);
            need = s->n + m;
            if (2 * need > s->cap) need *= 2;
        }
        int r = sd_grow_tree(s, need);
        if (r == -2) { PyErr_SetString(PyExc_OverflowError, "feed: more than 2**30 touches"); return NULL; }
        if (r < 0) return PyErr_NoMemory();
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, asked * 8);
    int64_t *scratch = malloc((size_t)(m ? m : 1) * sizeof(int64_t));
    if (!result || !scratch) { Py_XDECREF(result); free(scratch); if (!PyErr_Occurred()) PyErr_NoMemory(); return NULL; }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    int32_t *tr = s->tree;
    uint64_t *bits = s->bits;
    int32_t *last = s->last;
    int64_t words = s->cap >> 6, at = 0, o = 0, n0 = s->n;
    for (Py_ssize_t k = 0; k < g; k++) {
        int64_t a = at, b = at + sz[k], start = n0 + a;
        for (int64_t t = a; t < b; t++) {          /* answers: the stack before the group */
            int64_t id = ks[t], p = -1;
            if (id >= 0) { p = last[id]; last[id] = (int32_t)(n0 + t); }
            scratch[t] = p;
            if (!q[t]) continue;
            if (p < 0) { out[o++] = -1; continue; }
            if (p >= start) { out[o++] = 0; continue; }  /* earlier in this group */
            /* positions below p left since (the marks below p are p - left): p's word's below it, then
             * the words before it */
            int64_t left = sd_bits_set(bits[p >> 6] & ((((uint64_t)1) << (p & 63)) - 1));
            for (int64_t i = p >> 6; i > 0; i -= i & -i) left += tr[i];
            out[o++] = s->live - (p - left);
        }
        for (int64_t t = a; t < b; t++) {          /* then touched, in order: a moved key leaves its place */
            int64_t p = scratch[t];
            if (p >= 0) {
                bits[p >> 6] |= ((uint64_t)1) << (p & 63);
                for (int64_t i = (p >> 6) + 1; i <= words; i += i & -i) tr[i] += 1;
            } else {
                s->live += 1;
            }
        }
        at = b;
    }
    s->n += m;
    s->fed += m;
    Py_END_ALLOW_THREADS
    free(scratch);
    return result;
}

static PyObject *stack_feed(StackObject *s, PyObject *args) {
    Py_buffer keys, query, sizes;
    if (three_buffers(args, &keys, &query, &sizes, "feed: ids and sizes are int64, query one byte a key") < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t m = keys.len / 8, g = sizes.len / 8;
    const int64_t *ks = (const int64_t *)keys.buf, *sz = (const int64_t *)sizes.buf;
    const uint8_t *q = (const uint8_t *)query.buf;
    int64_t total = 0, asked = 0;
    for (Py_ssize_t i = 0; i < g; i++) {
        if (sz[i] < 0 || sz[i] > m - total) {
            PyErr_SetString(PyExc_ValueError, "feed: sizes must be >= 0 and add up to the ids"); goto done;
        }
        total += sz[i];
    }
    if (total != m) { PyErr_SetString(PyExc_ValueError, "feed: sizes must be >= 0 and add up to the ids"); goto done; }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (ks[i] < -1 || ks[i] >= s->ids) { PyErr_SetString(PyExc_ValueError, "feed: an id must be -1 or in [0, ids)"); goto done; }
        asked += q[i] != 0;
    }
    result = sd_run(s, ks, q, sz, g, m, asked);
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&query);
    PyBuffer_Release(&sizes);
    return result;
}

/* walk(rev_ids, start, lens, looks, outs) -> what `feed` answers for the events' groups, laid out
 * here rather than by numpy a touch at a time (live_curves.py `walk`, whose numpy layout for
 * StackPython is the reference; issue 41: ~0.1 s of the writer's live pass on the conversation
 * trace). rev_ids: int32, the index's keys' ids (each request's deepest first); one event a
 * group, each of the four int64 arrays one value an event: its request's keys are
 * rev_ids[start .. start + lens), `outs` fresh output keys (id -1) come first, then those keys,
 * the last `looks` of them queried (0 <= looks <= lens). */
static PyObject *stack_walk(StackObject *s, PyObject *args) {
    Py_buffer ids, start, lens, looks, outs;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*", &ids, &start, &lens, &looks, &outs)) return NULL;
    PyObject *result = NULL;
    int64_t *ks = NULL, *sz = NULL;
    uint8_t *q = NULL;
    Py_ssize_t g = start.len / 8, r = ids.len / 4;
    if (ids.len % 4 || start.len % 8 || lens.len != start.len || looks.len != start.len || outs.len != start.len) {
        PyErr_SetString(PyExc_ValueError, "walk: ids are int32, start, lens, looks and outs int64 an event"); goto done;
    }
    const int32_t *rid = (const int32_t *)ids.buf;
    const int64_t *st = (const int64_t *)start.buf, *ln = (const int64_t *)lens.buf;
    const int64_t *lk = (const int64_t *)looks.buf, *ou = (const int64_t *)outs.buf;
    int64_t m = 0, asked = 0;
    for (Py_ssize_t e = 0; e < g; e++) {
        if (st[e] < 0 || ln[e] < 0 || st[e] > r || ln[e] > r - st[e] || lk[e] < 0 || lk[e] > ln[e] || ou[e] < 0
            || ou[e] > ((int64_t)1 << 40) || m > ((int64_t)1 << 40)) {
            PyErr_SetString(PyExc_ValueError, "walk: an event's keys must lie in the ids, 0 <= looks <= lens, outs >= 0");
            goto done;
        }
        for (int64_t t = st[e]; t < st[e] + ln[e]; t++)
            if (rid[t] < -1 || rid[t] >= s->ids) { PyErr_SetString(PyExc_ValueError, "walk: an id must be -1 or in [0, ids)"); goto done; }
        m += ou[e] + ln[e];
        asked += lk[e];
    }
    if (m >= ((int64_t)1 << 31)) { PyErr_SetString(PyExc_OverflowError, "feed: more than 2**30 touches"); goto done; }
    ks = malloc((size_t)(m ? m : 1) * sizeof(int64_t));
    q = malloc((size_t)(m ? m : 1));
    sz = malloc((size_t)(g ? g : 1) * sizeof(int64_t));
    if (!ks || !q || !sz) { PyErr_NoMemory(); goto done; }
    int64_t at = 0;
    for (Py_ssize_t e = 0; e < g; e++) {
        for (int64_t j = 0; j < ou[e]; j++) { ks[at] = -1; q[at++] = 0; }
        const int32_t *from = rid + st[e];
        int64_t n = ln[e], first = n - lk[e];
        for (int64_t j = 0; j < n; j++) { ks[at] = from[j]; q[at++] = j >= first; }
        sz[e] = ou[e] + n;
    }
    result = sd_run(s, ks, q, sz, g, (Py_ssize_t)m, asked);
done:
    free(ks); free(q); free(sz);
    PyBuffer_Release(&ids); PyBuffer_Release(&start); PyBuffer_Release(&lens);
    PyBuffer_Release(&looks); PyBuffer_Release(&outs);
    return result;
}

static PyMethodDef stack_methods[] = {
    {"feed", (PyCFunction)stack_feed, METH_VARARGS, "Answer and touch groups of keys (see the comment above)."},
    {"walk", (PyCFunction)stack_walk, METH_VARARGS, "feed the groups of events laid out from the index's ids (see stack_walk)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *stack_touches(StackObject *s, void *closure) { return PyLong_FromLongLong(s->fed); }

/* The tree's slots (a test's look at the renumbering: `sd_compact`). */
static PyObject *stack_slots(StackObject *s, void *closure) { return PyLong_FromLongLong(s->cap); }

static PyGetSetDef stack_getset[] = {
    {"touches", (getter)stack_touches, NULL, "touches fed so far", NULL},
    {"slots", (getter)stack_slots, NULL, "the positions the stack has room for (its memory: a bit each, and 4 bytes a 64 of them)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._stackdist.Stack",
    .tp_basicsize = sizeof(StackObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An LRU stack fed groups of keys, answering their depths (size_curves.py StackPython).",
    .tp_new = stack_new,
    .tp_dealloc = (destructor)stack_dealloc,
    .tp_methods = stack_methods,
    .tp_getset = stack_getset,
};

static PyMethodDef methods[] = {
    {"depths", depths, METH_VARARGS, "LRU stack depths of grouped touches, written over prev (size_curves.py)."},
    {"previous", previous, METH_VARARGS, "Each touch's key written over with its previous touch's position (size_curves.py)."},
    {"dense_ids", dense_ids, METH_VARARGS, "Each key written over with its dense id, each request's reversed (live_curves.py)."},
    {"block_ids", block_ids, METH_VARARGS, "Each request's pages' ids from its hash ids, reversed (live_curves.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stackdist", NULL, -1, methods};

PyMODINIT_FUNC PyInit__stackdist(void) {
    if (PyType_Ready(&StackType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&StackType);
    if (PyModule_AddObject(m, "Stack", (PyObject *)&StackType) < 0) { Py_DECREF(&StackType); Py_DECREF(m); return NULL; }
    return m;
}
