/* block_page_keys: trace/pages.py's page keys of a hash_ids request (Mooncake, `tierdiag
 * synth`) in one C loop (pages._block_page_keys_numpy is the reference); output_keys: a
 * finishing request's output page keys appended to its list and array in one call
 * (pages.extend_output_keys_numpy is the reference). */
#include "cplane.h"

/* ------------------------------------------------------------------------------------------ */
/* block_page_keys(hash_ids, num_pages, per_block) -> bytearray of int64 page keys, or -1      */

PyDoc_STRVAR(block_page_keys_doc,
"block_page_keys(hash_ids, num_pages, per_block) -> bytearray\n\n"
"trace.pages._block_page_keys_numpy as native int64s: page j of block b is\n"
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
/* BLAKE2b (RFC 7693), unkeyed, for output_seed: hashlib.blake2b(data, digest_size=8)           */

static const uint64_t B2B_IV[8] = {
    UINT64_C(0x6A09E667F3BCC908), UINT64_C(0xBB67AE8584CAA73B), UINT64_C(0x3C6EF372FE94F82B),
    UINT64_C(0xA54FF53A5F1D36F1), UINT64_C(0x510E527FADE682D1), UINT64_C(0x9B05688C2B3E6C1F),
    UINT64_C(0x1F83D9ABFB41BD6B), UINT64_C(0x5BE0CD19137E2179)};

static const uint8_t B2B_SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

#define ROTR64(x, n) (((x) >> (n)) | ((x) << (64 - (n))))
#define B2B_G(a, b, c, d, x, y)                                                                \
    do {                                                                                       \
        v[a] = v[a] + v[b] + (x);                                                              \
        v[d] = ROTR64(v[d] ^ v[a], 32);                                                        \
        v[c] = v[c] + v[d];                                                                    \
        v[b] = ROTR64(v[b] ^ v[c], 24);                                                        \
        v[a] = v[a] + v[b] + (y);                                                              \
        v[d] = ROTR64(v[d] ^ v[a], 16);                                                        \
        v[c] = v[c] + v[d];                                                                    \
        v[b] = ROTR64(v[b] ^ v[c], 63);                                                        \
    } while (0)

static void
b2b_compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = B2B_IV[i];
    }
    v[12] ^= t;  /* the byte count's high word (v[13]) stays 0: messages are short */
    if (last) {
        v[14] = ~v[14];
    }
    for (int i = 0; i < 16; i++) {
        uint64_t w = 0;
        for (int j = 7; j >= 0; j--) {
            w = (w << 8) | block[8 * i + j];  /* little-endian */
        }
        m[i] = w;
    }
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = B2B_SIGMA[r];
        B2B_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        B2B_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        B2B_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        B2B_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        B2B_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        B2B_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        B2B_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        B2B_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) {
        h[i] ^= v[i] ^ v[i + 8];
    }
}

/* The first 8 bytes of BLAKE2b-64 (digest_size 8, no key) of `data`, as a little-endian uint64:
 * int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little"). */
static uint64_t
blake2b_64(const uint8_t *data, size_t len)
{
    uint64_t h[8];
    uint8_t block[128];
    size_t done = 0;
    memcpy(h, B2B_IV, sizeof(h));
    h[0] ^= UINT64_C(0x01010000) ^ 8;  /* depth 1, fanout 1, no key, digest length 8 */
    while (len - done > 128) {
        memcpy(block, data + done, 128);
        done += 128;
        b2b_compress(h, block, (uint64_t)done, 0);
    }
    memset(block, 0, sizeof(block));
    memcpy(block, data + done, len - done);
    b2b_compress(h, block, (uint64_t)len, 1);
    return h[0];
}

/* ------------------------------------------------------------------------------------------ */
/* output_seed(req_id, last) -> int, or -1                                                     */

PyDoc_STRVAR(output_seed_doc,
"output_seed(req_id, last) -> int, or -1\n\n"
"trace.pages._output_seed in C: blake2b-64 of b'out' + last as 8 little-endian signed bytes +\n"
"req_id in UTF-8, as an int, shifted right by one. -1 when the case is Python's (req_id not an\n"
"exact str or not encodable, last not an int64).");

static PyObject *
cp_output_seed(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    const char *rid;
    Py_ssize_t rlen;
    long long last;
    int overflow = 0;
    uint8_t small[256], *buf = small;
    uint64_t digest;
    if (wrong_nargs(nargs, 2, "output_seed() takes 2 arguments: req_id, last")) {
        return NULL;
    }
    if (!PyUnicode_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        return not_mine();
    }
    last = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || (last == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return not_mine();
    }
    rid = PyUnicode_AsUTF8AndSize(args[0], &rlen);
    if (rid == NULL) {  /* a lone surrogate: Python's encode raises its own error */
        PyErr_Clear();
        return not_mine();
    }
    if ((size_t)rlen + 11 > sizeof(small)) {
        buf = PyMem_Malloc((size_t)rlen + 11);
        if (buf == NULL) {
            return PyErr_NoMemory();
        }
    }
    memcpy(buf, "out", 3);
    for (int i = 0; i < 8; i++) {
        buf[3 + i] = (uint8_t)((uint64_t)last >> (8 * i));
    }
    memcpy(buf + 11, rid, (size_t)rlen);
    digest = blake2b_64(buf, (size_t)rlen + 11);
    if (buf != small) {
        PyMem_Free(buf);
    }
    return PyLong_FromUnsignedLongLong(digest >> 1);
}

/* ------------------------------------------------------------------------------------------ */
/* output_keys(keys, keys_np, seed, skip, count) -> bytearray, None, or -1                     */

PyDoc_STRVAR(output_keys_doc,
"output_keys(keys, keys_np, seed, skip, count) -> bytearray, None, or -1\n\n"
"trace.pages.extend_output_keys_numpy's work after the seed: output page j (skip <= j < count)\n"
"is ~((seed + j * step) mod 2**63) as an int64 (pages._OUTPUT_STEP); they are appended to\n"
"`keys` (a list, or a key run: an array.array of int64, extended by its frombytes), and the\n"
"bytearray returned holds keys_np's int64s then the same keys (what np.concatenate made).\n"
"keys_np None: the keys are appended and nothing else is made (None returned:\n"
"trace.pages.append_output_keys_py's work, a finish's, whose keys_np nobody reads after). -1,\n"
"having changed nothing, when the case is numpy's: keys neither a list nor an int64 run,\n"
"keys_np neither None nor a 1-D native int64 buffer as long as keys, a seed outside\n"
"[0, 2**63), counts out of range.");

#define OUTPUT_STEP ((UINT64_C(0x9E3779B97F4A7C15) >> 1) | 1)
#define MASK63 ((UINT64_C(1) << 63) - 1)

static PyObject *
cp_output_keys(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    PyObject *keys, *result, *tail, *done;
    long long seed;
    Py_ssize_t skip, count, have, add, lead;
    int64_t *out, *made;
    int keys_only;

    if (wrong_nargs(nargs, 5, "output_keys() takes 5 arguments: keys, keys_np, seed, skip, count")) {
        return NULL;
    }
    keys = args[0];
    keys_only = args[1] == Py_None;
    if (!PyLong_CheckExact(args[2])) {
        return not_mine();
    }
    if (PyList_CheckExact(keys)) {
        have = PyList_GET_SIZE(keys);
    } else if (strcmp(Py_TYPE(keys)->tp_name, "array.array") == 0 && PyObject_CheckBuffer(keys)) {
        /* a key run: its length here, its frombytes below */
        if (PyObject_GetBuffer(keys, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            return not_mine();
        }
        have = b.ndim == 1 && b.itemsize == 8 && is_int64_format(b.format) ? b.shape[0] : -1;
        PyBuffer_Release(&b);
        if (have < 0) {
            return not_mine();
        }
    } else {
        return not_mine();
    }
    seed = PyLong_AsLongLong(args[2]);
    skip = PyLong_AsSsize_t(args[3]);
    count = PyLong_AsSsize_t(args[4]);
    if ((seed == -1 || skip == -1 || count == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    if (seed < 0 || skip < 0 || count < skip) {
        return not_mine();
    }
    add = count - skip;
    if (add > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t) - have) {
        return PyErr_NoMemory();  /* (have + add) int64s cannot be sized: nothing appended */
    }
    if (keys_only) {
        /* the new keys alone: no copy of the keys before them */
        lead = 0;
        result = PyByteArray_FromStringAndSize(NULL, add * (Py_ssize_t)sizeof(int64_t));
        if (result == NULL) {
            return NULL;
        }
        out = (int64_t *)PyByteArray_AS_STRING(result);
    } else {
        if (PyObject_GetBuffer(args[1], &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            return not_mine();
        }
        if (b.ndim != 1 || b.itemsize != 8 || b.format == NULL
            || !((b.format[0] == 'l' || b.format[0] == 'q') && b.format[1] == '\0') || b.shape[0] != have) {
            PyBuffer_Release(&b);
            return not_mine();
        }
        lead = have;
        result = PyByteArray_FromStringAndSize(NULL, (have + add) * (Py_ssize_t)sizeof(int64_t));
        if (result == NULL) {
            PyBuffer_Release(&b);
            return NULL;
        }
        out = (int64_t *)PyByteArray_AS_STRING(result);
        if (have) {
            memcpy(out, b.buf, (size_t)have * sizeof(int64_t));
        }
        PyBuffer_Release(&b);
    }
    made = out + lead;
    for (Py_ssize_t i = 0; i < add; i++) {
        uint64_t v = ((uint64_t)seed + (uint64_t)(skip + i) * OUTPUT_STEP) & MASK63;
        made[i] = -(int64_t)v - 1;
    }
    if (!PyList_CheckExact(keys)) {  /* a key run: its bytes appended */
        /* frombytes by an interned name, handed a view of the keys just made (a call by a C
         * string made the name and a bytes copy of the keys every finish) */
        static PyObject *frombytes;
        PyObject *view;
        if (frombytes == NULL && (frombytes = PyUnicode_InternFromString("frombytes")) == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        view = PyMemoryView_FromMemory((char *)made, add * (Py_ssize_t)sizeof(int64_t), PyBUF_READ);
        if (view == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        done = PyObject_CallMethodOneArg(keys, frombytes, view);
        Py_DECREF(view);
        if (done == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(done);
    } else {
        tail = PyList_New(add);
        if (tail == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < add; i++) {
            PyObject *o = PyLong_FromLongLong(made[i]);
            if (o == NULL) {
                Py_DECREF(result);
                Py_DECREF(tail);
                return NULL;
            }
            PyList_SET_ITEM(tail, i, o);
        }
        if (PyList_SetSlice(keys, have, have, tail) < 0) {
            Py_DECREF(result);
            Py_DECREF(tail);
            return NULL;
        }
        Py_DECREF(tail);
    }
    if (keys_only) {
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* keys_list(keys_np) -> list[int]                                                             */

PyDoc_STRVAR(keys_list_doc,
"keys_list(keys_np) -> list[int]\n\n"
"keys_np.tolist() for a request's page keys: a 1-D C-contiguous native int64 buffer made a\n"
"list of ints in one loop (numpy's tolist reads each item through the dtype's getitem, ~2x\n"
"the instructions); anything else is handed to its own tolist(), as pages.keys_list_numpy does.");

static PyObject *
cp_keys_list(PyObject *Py_UNUSED(module), PyObject *obj)
{
    Py_buffer b;
    PyObject *out;
    const int64_t *v;
    Py_ssize_t n;
    if (!PyObject_CheckBuffer(obj) || PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return PyObject_CallMethod(obj, "tolist", NULL);
    }
    if (b.ndim != 1 || b.itemsize != 8 || b.format == NULL
        || !((b.format[0] == 'l' || b.format[0] == 'q') && b.format[1] == '\0')) {
        PyBuffer_Release(&b);
        return PyObject_CallMethod(obj, "tolist", NULL);
    }
    n = b.shape[0];
    v = b.buf;
    out = PyList_New(n);
    if (out != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *o = PyLong_FromLongLong(v[i]);
            if (o == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, o);
        }
    }
    PyBuffer_Release(&b);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* common_pages(keys, start, node_keys) -> int, or -1                                          */

PyDoc_STRVAR(common_pages_doc,
"common_pages(keys, start, node_keys) -> int, or -1\n\n"
"engine/tree.py's common_pages_py on two key runs read in place: the pages of node_keys that\n"
"keys[start:] matches (node_keys[0] == keys[start] is known; chained keys: a binary search\n"
"for the last matching page, probing exactly the pages the reference probes, so any input\n"
"gives its answer). -1, having read nothing, when the case is the reference's: either not a\n"
"1-D native int64 buffer (a list, a tuple), start not an int in [0, len(keys)), node_keys\n"
"empty.");

/* A key run's int64s (1: *b got, release it), or 0 (not one; nothing held). */
static int
key_buffer(PyObject *obj, Py_buffer *b)
{
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj) || !PyObject_CheckBuffer(obj)) {
        return 0;
    }
    if (PyObject_GetBuffer(obj, b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (b->ndim != 1 || b->itemsize != (Py_ssize_t)sizeof(int64_t) || !is_int64_format(b->format)) {
        PyBuffer_Release(b);
        return 0;
    }
    return 1;
}

static PyObject *
cp_common_pages(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer a, b;
    Py_ssize_t start, n, m, avail, lo, hi, got;
    const int64_t *k, *nk;

    if (wrong_nargs(nargs, 3, "common_pages() takes 3 arguments: keys, start, node_keys")) {
        return NULL;
    }
    if (!PyLong_CheckExact(args[1])) {
        return not_mine();
    }
    start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    /* two runs (the tree's case) read in place; other int64 buffers exported */
    a.obj = b.obj = NULL;
    if (!run_items(args[0], &k, &n)) {
        if (!key_buffer(args[0], &a)) {
            return not_mine();
        }
        k = (const int64_t *)a.buf;
        n = a.shape[0];
    }
    if (!run_items(args[2], &nk, &m)) {
        if (!key_buffer(args[2], &b)) {
            if (a.obj != NULL) {
                PyBuffer_Release(&a);
            }
            return not_mine();
        }
        nk = (const int64_t *)b.buf;
        m = b.shape[0];
    }
    if (start < 0 || start >= n || m < 1) {
        if (a.obj != NULL) {
            PyBuffer_Release(&a);
        }
        if (b.obj != NULL) {
            PyBuffer_Release(&b);
        }
        return not_mine();
    }
    k += start;
    avail = n - start;
    if (avail >= m && k[m - 1] == nk[m - 1]) {
        got = m;
    } else {
        lo = 1;
        hi = m < avail ? m : avail;  /* k[lo - 1] matches; find the last matching page */
        if (k[hi - 1] == nk[hi - 1]) {
            got = hi;
        } else {
            while (hi - lo > 1) {  /* lo matches, hi does not */
                Py_ssize_t mid = (lo + hi) / 2;
                if (k[mid - 1] == nk[mid - 1]) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            got = lo;
        }
    }
    if (a.obj != NULL) {
        PyBuffer_Release(&a);
    }
    if (b.obj != NULL) {
        PyBuffer_Release(&b);
    }
    return PyLong_FromSsize_t(got);
}

/* ------------------------------------------------------------------------------------------ */
/* lru_entry(ns, seq, nid) -> int, or None; lru_id(entry) -> int                               */

PyDoc_STRVAR(lru_entry_doc,
"lru_entry(ns, seq, nid) -> int, or None\n\n"
"engine/tree.py's lru heap entry, ((ns << 64 | seq) << 48) | nid, made in one step where\n"
"0 <= ns < 2**63, 0 <= seq < 2**63 and 0 <= nid < 2**48 (the three fields' bits then do not\n"
"meet: the value's bytes are written and read as one int); None, having made nothing, for any\n"
"other argument (the caller's expression answers). Compiled, the expression was three\n"
"big-int operations, each a new int (~900 instructions an entry).");

/* An exact int's value in [0, 2^63), or -1 (anything else: not an int, negative, larger). */
static int64_t
cp_nonneg_int(PyObject *v)
{
    int64_t x;
    int overflow;
    if (!PyLong_CheckExact(v)) {
        return -1;
    }
    if (cp_small_int(v, &x)) {
        return x < 0 ? -1 : x;
    }
    x = (int64_t)PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return x < 0 ? -1 : x;
}

static PyObject *
cp_lru_entry(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t ns, seq, nid;
    uint64_t w[3];

    if (wrong_nargs(nargs, 3, "lru_entry() takes 3 arguments: ns, seq, nid")) {
        return NULL;
    }
    ns = cp_nonneg_int(args[0]);
    seq = cp_nonneg_int(args[1]);
    nid = cp_nonneg_int(args[2]);
    if (ns < 0 || seq < 0 || nid < 0 || nid >= ((int64_t)1 << 48)) {
        Py_RETURN_NONE;
    }
    /* value = ns * 2^112 + seq * 2^48 + nid, as three little-endian 64-bit words */
    w[0] = (uint64_t)nid | ((uint64_t)seq << 48);
    w[1] = ((uint64_t)seq >> 16) | ((uint64_t)ns << 48);
    w[2] = (uint64_t)ns >> 16;
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API) && PYLONG_BITS_IN_DIGIT == 30
    {
        /* 3.11's layout (cp_small_int's): the value's 30-bit digits written into a new int, low
         * first, its size the digits up to the highest non-zero one (the value < 2^175: six) */
        digit d[7];
        Py_ssize_t nd = 0;
        PyLongObject *v;
        for (int i = 0; i < 7; i++) {
            int bit = 30 * i, word = bit / 64, off = bit % 64;
            uint64_t x = w[word] >> off;
            if (off > 34 && word < 2) {
                x |= w[word + 1] << (64 - off);
            }
            d[i] = (digit)(x & ((1u << 30) - 1));
            if (d[i] != 0) {
                nd = i + 1;
            }
        }
        if (nd <= 1) {
            return PyLong_FromLong((long)d[0]);  /* (0 and small values: the shared small ints) */
        }
        v = _PyLong_New(nd);
        if (v == NULL) {
            return NULL;
        }
        memcpy(v->ob_digit, d, (size_t)nd * sizeof(digit));
        return (PyObject *)v;
    }
#else
    unsigned char bytes[24];
    for (int i = 0; i < 24; i++) {
        bytes[i] = (unsigned char)(w[i / 8] >> (8 * (i % 8)));
    }
#if PY_VERSION_HEX < 0x030D0000
    return _PyLong_FromByteArray(bytes, sizeof bytes, 1, 0);
#else
    return PyLong_FromUnsignedNativeBytes(bytes, sizeof bytes, Py_ASNATIVEBYTES_LITTLE_ENDIAN);
#endif
#endif
}

PyDoc_STRVAR(lru_id_doc,
"lru_id(entry) -> int\n\n"
"`entry & (2**48 - 1)`: the node id in engine/tree.py's lru heap entry, for any int (its low\n"
"bits, two's complement as Python's & reads a negative one); another object: `entry & mask` as\n"
"Python computes it. Compiled, the & of a big int was a new int made through the generic path.");

static PyObject *
cp_lru_id(PyObject *Py_UNUSED(module), PyObject *entry)
{
    if (PyLong_Check(entry)) {
        unsigned long long low = PyLong_AsUnsignedLongLongMask(entry);
        if (low == (unsigned long long)-1 && PyErr_Occurred()) {
            return NULL;
        }
        return PyLong_FromUnsignedLongLong(low & ((1ULL << 48) - 1));
    }
    {
        PyObject *mask = PyLong_FromUnsignedLongLong((1ULL << 48) - 1), *got;
        if (mask == NULL) {
            return NULL;
        }
        got = PyNumber_And(entry, mask);
        Py_DECREF(mask);
        return got;
    }
}

PyMethodDef cp_page_keys_methods[] = {
    {"lru_entry", (PyCFunction)(void (*)(void))cp_lru_entry, METH_FASTCALL, lru_entry_doc},
    {"lru_id", (PyCFunction)cp_lru_id, METH_O, lru_id_doc},
    {"common_pages", (PyCFunction)(void (*)(void))cp_common_pages, METH_FASTCALL, common_pages_doc},
    {"keys_list", (PyCFunction)cp_keys_list, METH_O, keys_list_doc},
    {"block_page_keys", (PyCFunction)(void (*)(void))cp_block_page_keys, METH_FASTCALL, block_page_keys_doc},
    {"output_keys", (PyCFunction)(void (*)(void))cp_output_keys, METH_FASTCALL, output_keys_doc},
    {"output_seed", (PyCFunction)(void (*)(void))cp_output_seed, METH_FASTCALL, output_seed_doc},
    {NULL, NULL, 0, NULL},
};
