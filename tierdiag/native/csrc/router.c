/* A deployment's C (engine/deployment.py, engine/decode.py): the arrival text and a rank's decode
 * steps run ahead.
 *
 * The deployment's arrival text (engine/deployment.py: ranks_json): where a request's prefix was
 * on every rank when it arrived, one JSON object a rank, as json.dumps writes the list with
 * separators (",", ":"). A --dp 8 arrival made it in the compiled core from eight f-strings of
 * three formatted ints and a score text each (~45,000 instructions an arrival, callgrind, issue
 * 41 session 23: ~5 % of a --dp 8 replay's `Engine.run`); here it is one buffer written in place.
 *
 * The reference is deployment.ranks_json_py (tests/engine/test_deployment.py holds the two and
 * json.dumps to the same text). Anything but the shapes the deployment hands (a list of
 * (device, host) int pairs, a tuple of ints, a tuple of exact floats, values that fit in int64)
 * is "not my case": -1, nothing changed, and the reference writes it. */
#include "cplane.h"

#include <math.h>

typedef struct {
    char *p;
    Py_ssize_t len, cap;
    char small[2048];
} Text;

static void
text_init(Text *t)
{
    t->p = t->small;
    t->len = 0;
    t->cap = (Py_ssize_t)sizeof(t->small);
}

static void
text_free(Text *t)
{
    if (t->p != t->small) {
        PyMem_Free(t->p);
    }
}

/* text_room's growth (out of line: the fast path below is inlined at every call). */
static int
text_grow(Text *t, Py_ssize_t more)
{
    Py_ssize_t cap = (t->len + more) * 2;
    char *p;
    if (t->p == t->small) {
        p = PyMem_Malloc((size_t)cap);
        if (p != NULL) {
            memcpy(p, t->small, (size_t)t->len);
        }
    } else {
        p = PyMem_Realloc(t->p, (size_t)cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->p = p;
    t->cap = cap;
    return 0;
}

static inline int
text_room(Text *t, Py_ssize_t more)
{
    return t->len + more <= t->cap ? 0 : text_grow(t, more);
}

/* Inlined (Py_ALWAYS_INLINE: GCC/Clang's always_inline, MSVC's __forceinline): a ranks_json
   call adds ~96 pieces, most of them literals, whose copy then has a constant length; as a
   called function it was ~40 instructions a piece and a memcpy call (issue 41, session 25). */
#ifndef Py_ALWAYS_INLINE /* (Python 3.10's headers have none) */
#  if defined(__GNUC__) || defined(__clang__)
#    define Py_ALWAYS_INLINE __attribute__((always_inline))
#  else
#    define Py_ALWAYS_INLINE
#  endif
#endif

static inline Py_ALWAYS_INLINE int
text_add(Text *t, const char *s, Py_ssize_t n)
{
    if (text_room(t, n) < 0) {
        return -1;
    }
    memcpy(t->p + t->len, s, (size_t)n);
    t->len += n;
    return 0;
}

#define TEXT_LIT(t, s) text_add((t), (s), (Py_ssize_t)(sizeof(s) - 1))

/* "00" .. "99": text_int's two digits a division */
static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* An int64 in decimal, as int.__str__ writes it (two digits a step: a --dp 8 arrival writes 32
 * ints, ~70 instructions each a digit at a time; issue 41 session 38). */
static int
text_int(Text *t, int64_t v)
{
    char buf[24];
    int i = (int)sizeof(buf);
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (u < 10) { /* (a rank's number, most loads) */
        char c = (char)('0' + (int)u);
        if (v >= 0) {
            return text_add(t, &c, 1);
        }
    }
    while (u >= 100) {
        unsigned r = (unsigned)(u % 100);
        u /= 100;
        i -= 2;
        memcpy(buf + i, DIGIT_PAIRS + 2 * r, 2);
    }
    if (u >= 10) {
        i -= 2;
        memcpy(buf + i, DIGIT_PAIRS + 2 * (unsigned)u, 2);
    } else {
        buf[--i] = (char)('0' + (int)u);
    }
    if (v < 0) {
        buf[--i] = '-';
    }
    return text_add(t, buf + i, (Py_ssize_t)sizeof(buf) - i);
}

/* An exact int's value: 1 read, 0 not an exact int or out of int64 (nothing set). */
static int
exact_int(PyObject *o, int64_t *x)
{
    int overflow = 0;
    long long v;
    if (!PyLong_CheckExact(o)) {
        return 0;
    }
    if (cp_small_int(o, x)) {
        return 1;
    }
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (overflow) {
        return 0;
    }
    *x = (int64_t)v;
    return 1;
}

/* d * ps without overflow: 1 and *out set, else 0. */
static int
times(int64_t d, int64_t ps, int64_t *out)
{
    return !__builtin_mul_overflow(d, ps, out);
}

/* float.__repr__ of a double with 1e-4 <= |f| < 1e15 (repr's fixed notation, no exponent),
 * written to `out` (at least 40 bytes): its length, or 0 where this does not decide it (outside
 * that range, or a case left to repr below). repr writes the shortest digits that read back as
 * f, the nearest to f among them (David Gay's dtoa, mode 0): ~7,000 instructions a call, and a
 * --dp 8 replay's match rates are new values (a request's depth x page tokens / its length:
 * 12,970 reprs, 0.094 G of the conversation trace's Engine.run, issue 41 session 33). Here the
 * same digits by exact integer arithmetic: f = M 2^E (M < 2^53, E in [-67, -3] in this range);
 * in units of 2^(E-2) f is X = 4M and the reals that read back as f lie between L = 4M - 2
 * (4M - 1 where M is 2^52: the double below is nearer) and H = 4M + 2. For k = 0, 1, ...
 * fraction digits the candidates are the integers d in [L 10^k, H 10^k] / 2^(S), S = 2 - E
 * (L, H < 2^55 and 10^k <= 10^21 < 2^70: every product fits 128 bits); the first k that has
 * one is the shortest, and the candidate nearest X 10^k / 2^S is repr's. Left to repr (0): a
 * candidate exactly on L or H (whether it reads back as f is round-half-even's, on M's parity)
 * and a tie between two candidates: never met by the tests' millions of values, decided by repr
 * where they are. tests/engine/test_deployment.py holds the text equal to repr. */
#ifndef __SIZEOF_INT128__ /* (a compiler without 128-bit ints: repr writes every score) */
static int
short_repr(double f, char *out)
{
    (void)f;
    (void)out;
    return 0;
}
#else
static int
short_repr(double f, char *out)
{
    typedef unsigned __int128 u128;
    uint64_t bits, m, digits, ip, fp;
    int e, s, k, n = 0;
    u128 lo, hi, x, mask, p = 1;
    char buf[24];
    double a = f < 0 ? -f : f;
    if (!(a >= 1e-4 && a < 1e15)) {
        return 0;
    }
    memcpy(&bits, &a, sizeof(bits));
    m = (bits & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1) << 52); /* (a normal double in this range) */
    e = (int)((bits >> 52) & 0x7ff) - 1075;
    s = 2 - e;
    mask = ((u128)1 << s) - 1;
    lo = (u128)(4 * m - (m == (UINT64_C(1) << 52) ? 1 : 2));
    hi = (u128)(4 * m + 2);
    for (k = 0; k <= 21; k++, p *= 10, lo *= 10, hi *= 10) {
        u128 d_lo = (lo + mask) >> s, d_hi = hi >> s, q, r, half, cand;
        if (d_lo > d_hi) {
            continue;
        }
        if ((lo & mask) == 0 || (hi & mask) == 0) {
            return 0; /* a candidate on an edge: repr decides */
        }
        x = (u128)(4 * m) * p;
        q = x >> s;
        r = x & mask;
        half = (u128)1 << (s - 1);
        if (r == half) {
            return 0; /* halfway between two candidates: repr decides */
        }
        cand = r > half ? q + 1 : q;
        if (cand < d_lo) {
            cand = d_lo;
        } else if (cand > d_hi) {
            cand = d_hi;
        }
        if (cand >= (u128)UINT64_C(100000000000000000)) {
            return 0; /* (never: the shortest has at most 17 digits) */
        }
        digits = (uint64_t)cand;
        if (p > (u128)UINT64_MAX) { /* (k >= 20: digits < 10^17 <= p, all of them fraction) */
            ip = 0;
            fp = digits;
        } else {
            ip = digits / (uint64_t)p;
            fp = digits % (uint64_t)p;
        }
        if (f < 0) {
            out[n++] = '-';
        }
        {
            int i = (int)sizeof(buf);
            do {
                buf[--i] = (char)('0' + (int)(ip % 10));
                ip /= 10;
            } while (ip);
            memcpy(out + n, buf + i, sizeof(buf) - (size_t)i);
            n += (int)sizeof(buf) - i;
        }
        out[n++] = '.';
        if (k == 0) {
            out[n++] = '0';
            return n;
        }
        for (int i = k - 1; i >= 0; i--) {
            out[n + i] = (char)('0' + (int)(fp % 10));
            fp /= 10;
        }
        return n + k;
    }
    return 0;
}
#endif

/* Score texts by the double's bits, in front of `table` (the reference's dict): a slot a hash
 * of the bits, the last text stored there kept. A --dp 8 arrival writes 8 scores, most of them
 * seen before; the dict's look-up (the float's hash, the compare) was ~380 instructions each,
 * ~37 M of a conversation replay (issue 41 session 38). Only finite nonzero scores are kept
 * (zeros are written above it, NaN never kept); a text longer than a slot holds (never: repr's
 * longest is 24 bytes) is not kept. Not used where `table_max` is 0 or less (a caller keeping
 * nothing, as the tests that write every text afresh). */
#define SCORE_SLOTS 4096
typedef struct {
    uint64_t bits; /* 0: empty (+0.0 is never kept) */
    unsigned char len;
    char text[31];
} ScoreSlot;
static ScoreSlot score_slots[SCORE_SLOTS];

static inline ScoreSlot *
score_slot(uint64_t bits)
{
    uint64_t h = bits * UINT64_C(0x9E3779B97F4A7C15);
    return &score_slots[h >> (64 - 12)];
}

/* A score's text, deployment._json_number's: "0.0" / "-0.0" for zeros, else float.__repr__,
 * kept in `table` by value (cleared when it holds `table_max`; NaN never kept), as the
 * reference keeps it. 1 added, 0 not my case, -1 error. */
static int
text_score(Text *t, PyObject *s, PyObject *table, Py_ssize_t table_max)
{
    double f;
    PyObject *text;
    const char *u;
    Py_ssize_t n;
    int rc;
    uint64_t bits;
    ScoreSlot *slot = NULL;
    if (s == Py_None) {
        return TEXT_LIT(t, "null") < 0 ? -1 : 1;
    }
    if (!PyFloat_CheckExact(s)) {
        return 0;
    }
    f = PyFloat_AS_DOUBLE(s);
    if (f == 0.0) {
        if (signbit(f)) {
            return TEXT_LIT(t, "-0.0") < 0 ? -1 : 1;
        }
        return TEXT_LIT(t, "0.0") < 0 ? -1 : 1;
    }
    if (table_max > 0 && isfinite(f)) {
        memcpy(&bits, &f, sizeof(bits));
        slot = score_slot(bits);
        if (slot->bits == bits && slot->len) {
            return text_add(t, slot->text, (Py_ssize_t)slot->len) < 0 ? -1 : 1;
        }
    }
    text = PyDict_GetItemWithError(table, s); /* borrowed */
    if (text != NULL) {
        Py_INCREF(text);
    } else {
        if (PyErr_Occurred()) {
            return -1;
        }
        char shortest[40];
        int len = short_repr(f, shortest);
        text = len > 0 ? PyUnicode_FromStringAndSize(shortest, len) : PyObject_Repr(s);
        if (text == NULL) {
            return -1;
        }
        if (f == f) {
            if (PyDict_GET_SIZE(table) >= table_max) {
                PyDict_Clear(table);
            }
            if (PyDict_SetItem(table, s, text) < 0) {
                Py_DECREF(text);
                return -1;
            }
        }
    }
    if (!PyUnicode_Check(text) || (u = PyUnicode_AsUTF8AndSize(text, &n)) == NULL) {
        Py_DECREF(text);
        if (PyErr_Occurred()) {
            return -1;
        }
        return 0;
    }
    if (slot != NULL && n > 0 && n <= (Py_ssize_t)sizeof(slot->text)) {
        slot->bits = bits;
        slot->len = (unsigned char)n;
        memcpy(slot->text, u, (size_t)n);
    }
    rc = text_add(t, u, n) < 0 ? -1 : 1;
    Py_DECREF(text);
    return rc;
}

PyDoc_STRVAR(ranks_json_doc,
"ranks_json(held, in_flight, scores, page_size, score_text, score_text_max) -> str, or -1\n\n"
"deployment.ranks_json_py's text: for each rank r of `held` (a list of (device pages, host\n"
"pages) int pairs), {\"rank\":r,\"device_tokens\":d*ps,\"host_tokens\":h*ps,\"in_flight\":in_flight[r],\n"
"\"score\":scores[r] (null past its end)}, joined as json.dumps(..., separators=(',', ':')).\n"
"Scores' texts are kept in the dict `score_text` (the reference's table), and by their bits in\n"
"this module's own table in front of it (not where score_text_max is 0 or less). -1: not my case\n"
"(another shape or a value past int64), nothing changed: the reference writes it.");

static PyObject *
cp_ranks_json(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *held, *in_flight, *scores, *table, *out = NULL;
    int64_t ps;
    Py_ssize_t n, num_scores, table_max;
    Text t;
    if (wrong_nargs(nargs, 6, "ranks_json(held, in_flight, scores, page_size, score_text, score_text_max)")) {
        return NULL;
    }
    held = args[0];
    in_flight = args[1];
    scores = args[2];
    table = args[4];
    if (!PyList_CheckExact(held) || !PyTuple_CheckExact(in_flight) || !PyTuple_CheckExact(scores)
        || !PyDict_CheckExact(table) || !exact_int(args[3], &ps)) {
        return not_mine();
    }
    table_max = PyLong_AsSsize_t(args[5]);
    if (table_max == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return not_mine();
    }
    n = PyList_GET_SIZE(held);
    num_scores = PyTuple_GET_SIZE(scores);
    if (PyTuple_GET_SIZE(in_flight) < n) {
        return not_mine();
    }
    /* Every value is checked before the score table is touched: "not my case" changes nothing.
     * The first RANKS_KEPT ranks' values are kept from here for the text (read once). */
#define RANKS_KEPT 64
    int64_t kept[RANKS_KEPT][3];
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *pair = PyList_GET_ITEM(held, r);
        int64_t d, h, f;
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
            || !exact_int(PyTuple_GET_ITEM(pair, 0), &d) || !exact_int(PyTuple_GET_ITEM(pair, 1), &h)
            || !times(d, ps, &d) || !times(h, ps, &h) || !exact_int(PyTuple_GET_ITEM(in_flight, r), &f)
            || (r < num_scores && !PyFloat_CheckExact(PyTuple_GET_ITEM(scores, r)))) {
            return not_mine();
        }
        if (r < RANKS_KEPT) {
            kept[r][0] = d;
            kept[r][1] = h;
            kept[r][2] = f;
        }
    }
    text_init(&t);
    if (TEXT_LIT(&t, "[") < 0) {
        goto done;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        int64_t d = 0, h = 0, f = 0;
        int got;
        if (r < RANKS_KEPT) {
            d = kept[r][0];
            h = kept[r][1];
            f = kept[r][2];
        } else {
            PyObject *pair = PyList_GET_ITEM(held, r);
            (void)exact_int(PyTuple_GET_ITEM(pair, 0), &d);
            (void)exact_int(PyTuple_GET_ITEM(pair, 1), &h);
            (void)exact_int(PyTuple_GET_ITEM(in_flight, r), &f);
            d *= ps; /* checked above */
            h *= ps;
        }
        if ((r && TEXT_LIT(&t, ",") < 0) || TEXT_LIT(&t, "{\"rank\":") < 0 || text_int(&t, (int64_t)r) < 0
            || TEXT_LIT(&t, ",\"device_tokens\":") < 0 || text_int(&t, d) < 0
            || TEXT_LIT(&t, ",\"host_tokens\":") < 0 || text_int(&t, h) < 0
            || TEXT_LIT(&t, ",\"in_flight\":") < 0 || text_int(&t, f) < 0 || TEXT_LIT(&t, ",\"score\":") < 0) {
            goto done;
        }
        got = text_score(&t, r < num_scores ? PyTuple_GET_ITEM(scores, r) : Py_None, table, table_max);
        if (got < 0) {
            goto done;
        }
        if (got == 0) { /* (a repr that is not text: checked floats only, so never) */
            text_free(&t);
            return not_mine();
        }
        if (TEXT_LIT(&t, "}") < 0) {
            goto done;
        }
    }
    if (TEXT_LIT(&t, "]") < 0) {
        goto done;
    }
    out = PyUnicode_New(t.len, 127);
    if (out != NULL) {
        memcpy(PyUnicode_DATA(out), t.p, (size_t)t.len);
    }
done:
    text_free(&t);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* A rank's plain decode steps run ahead (engine/decode.py: decode_steps_py, the reference)      */

/* An exact float's value: 1 read, 0 not an exact float. */
static int
exact_float(PyObject *o, double *x)
{
    if (!PyFloat_CheckExact(o)) {
        return 0;
    }
    *x = PyFloat_AS_DOUBLE(o);
    return 1;
}

/* int(x) of a float, as int() truncates it: 1 and *v set where x is finite and within int64
 * (a NaN fails both compares), else 0. */
static inline int
trunc_int(double x, int64_t *v)
{
    if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) {
        return 0;
    }
    *v = (int64_t)x;
    return 1;
}

typedef struct {
    int fitted;
    double base, per_token, hbm, decay, floor;
    int64_t kv_bytes, overhead;
} StepClock;

/* CostModel.decode_step_ns(ctx), the compiled clock's operations in its order: fitted
 * int(base + per_token * ctx); the roofline int((base + ctx * kv_bytes) / hbm * 1e9) +
 * overhead (the int product converted once, as float + int converts it). 0 where a value
 * leaves int64 (the reference then runs that step: Python's ints do not overflow). */
static inline Py_ALWAYS_INLINE int
step_ns(const StepClock *c, int64_t ctx, int64_t *ns)
{
    /* (volatile: each operation rounded on its own, as the compiled code's; no fused
       multiply-add on a build for a machine that has one) */
    volatile double prod;
    double x;
    int64_t bytes, t;
    if (c->fitted) {
        prod = c->per_token * (double)ctx;
        return trunc_int(c->base + prod, ns);
    }
    if (__builtin_mul_overflow(ctx, c->kv_bytes, &bytes)) {
        return 0;
    }
    prod = c->base + (double)bytes;
    x = prod / c->hbm;
    if (!trunc_int(x * 1e9, &t)) {
        return 0;
    }
    return !__builtin_add_overflow(t, c->overhead, ns);
}

/* (k, end, ratio, done): built item by item (Py_BuildValue parses its format a call) */
static PyObject *
steps_result(int64_t k, int64_t end, double ratio, int done)
{
    PyObject *out = PyTuple_New(4), *item;
    if (out == NULL) {
        return NULL;
    }
    if ((item = PyLong_FromLongLong((long long)k)) == NULL) {
        goto fail;
    }
    PyTuple_SET_ITEM(out, 0, item);
    if ((item = PyLong_FromLongLong((long long)end)) == NULL) {
        goto fail;
    }
    PyTuple_SET_ITEM(out, 1, item);
    if ((item = PyFloat_FromDouble(ratio)) == NULL) {
        goto fail;
    }
    PyTuple_SET_ITEM(out, 2, item);
    item = done ? Py_True : Py_False;
    Py_INCREF(item);
    PyTuple_SET_ITEM(out, 3, item);
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(decode_steps_doc,
"decode_steps(ring, page_size, k, end, limit, fin_step, kv_base, running, ratio, clock, wakes, give)\n"
"    -> (k, end, ratio, done), or -1\n\n"
"decode.decode_steps_py's loop (no emit): plain decode steps k + 1, ... from `end`, each\n"
"new_token_ratio's decay, step k's pages where ring[k % page_size] is not empty (give(k): the\n"
"free pages after), the step's time decode_step_ns(kv_base + running * k) from the clock's terms\n"
"(`clock`: CostModel's (fitted, base, per_token, kv_bytes, hbm, overhead) and the ratio's\n"
"(decay, floor)), its start appended to `wakes` (a list, or None), until\n"
"the end reaches `limit` (None: no bound), the free pages fall below `running` or step\n"
"fin_step - 1 is run. done False: a step's values left int64 before it ran (the reference runs\n"
"on from the state returned); -1: not my case (other types), nothing changed.");

static PyObject *
cp_decode_steps(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *ring, *wakes, *give;
    PyObject *const *t;
    int64_t ps, k, end, until = 0, fin_step, base, n, free_pages, slot, lim;
    double ratio;
    int bounded;
    StepClock c;
    if (wrong_nargs(nargs, 12, "decode_steps(ring, page_size, k, end, limit, fin_step, kv_base, running, ratio, "
                               "clock, wakes, give)")) {
        return NULL;
    }
    ring = args[0];
    wakes = args[10];
    give = args[11];
    bounded = args[4] != Py_None;
    if (!PyTuple_CheckExact(args[9]) || PyTuple_GET_SIZE(args[9]) != 8) {
        return not_mine();
    }
    t = &PyTuple_GET_ITEM(args[9], 0); /* fitted, base, per_token, kv_bytes, hbm, overhead, decay, floor */
    if (!PyList_CheckExact(ring) || !exact_int(args[1], &ps) || ps <= 0 || PyList_GET_SIZE(ring) != ps
        || !exact_int(args[2], &k) || !exact_int(args[3], &end) || (bounded && !exact_int(args[4], &until))
        || !exact_int(args[5], &fin_step) || !exact_int(args[6], &base) || !exact_int(args[7], &n)
        || !exact_float(args[8], &ratio) || !PyBool_Check(t[0]) || !exact_float(t[1], &c.base)
        || !exact_float(t[2], &c.per_token) || !exact_int(t[3], &c.kv_bytes) || !exact_float(t[4], &c.hbm)
        || !exact_int(t[5], &c.overhead) || !exact_float(t[6], &c.decay) || !exact_float(t[7], &c.floor)
        || (wakes != Py_None && !PyList_CheckExact(wakes)) || k < 0 || k == INT64_MAX) {
        return not_mine();
    }
    c.fitted = t[0] == Py_True;
    free_pages = n; /* (the caller saw at least `running` free: only a give changes it) */
    slot = k % ps;
    /* (the limit, or where there is none one no end passes but INT64_MAX itself: `end >= until`
       then asks `bounded`) */
    if (!bounded) {
        until = INT64_MAX;
    }
    /* the first step the run's own loop below must take: the one after which fin_step is next
       (k + 1 == fin_step stops the run), or the one whose k + 1 leaves int64 */
    lim = fin_step > k + 1 ? fin_step - 1 : INT64_MAX;
    for (;;) {
        /* The common step, in a loop of its own: its slot an empty list (no give), no wakes to
         * note, not the step the finish stops the run after. The free pages change only at a
         * give, whose step (below) checks them, so they are never below `running` here. Each
         * step's values are checked before anything of it is done, as below; a step that is not
         * this case is left to the loop below. (issue 41 session 38: ~2.8 M steps a --dp 8
         * conversation replay, ~70 instructions each in the one loop below.) */
        int64_t at; /* the context before the next step, base + running * k: each step adds `running` */
        if (wakes == Py_None && PyList_GET_SIZE(ring) == ps /* (a give may have changed its length) */
            && !__builtin_mul_overflow(n, k, &at) && !__builtin_add_overflow(base, at, &at)) {
            PyObject *const *items = &PyList_GET_ITEM(ring, 0);
            for (;;) {
                int64_t k1 = k + 1, ctx, ns, next_end, nslot = slot + 1 == ps ? 0 : slot + 1;
                PyObject *due = items[nslot];
                if (k1 >= lim || !PyList_CheckExact(due) || PyList_GET_SIZE(due) != 0
                    || __builtin_add_overflow(at, n, &ctx) || !step_ns(&c, ctx, &ns)
                    || __builtin_add_overflow(end, ns, &next_end)) {
                    break;
                }
                at = ctx;
                ratio -= c.decay;
                if (ratio < c.floor) {
                    ratio = c.floor;
                }
                slot = nslot;
                k = k1;
                end = next_end;
                if (end >= until && bounded) {
                    return steps_result(k, end, ratio, 1);
                }
            }
        }
        int64_t k1 = k + 1, ctx, ns, now = end, next_end;
        PyObject *due;
        /* the step's values first: where one leaves int64 (or a give changed the ring's length),
           nothing of the step is done */
        if (k1 == INT64_MAX || PyList_GET_SIZE(ring) != ps || __builtin_mul_overflow(n, k1, &ctx)
            || __builtin_add_overflow(base, ctx, &ctx) || !step_ns(&c, ctx, &ns)
            || __builtin_add_overflow(now, ns, &next_end)) {
            return steps_result(k, end, ratio, 0);
        }
        slot = slot + 1 == ps ? 0 : slot + 1;
        due = PyList_GET_ITEM(ring, slot);
        if (!PyList_Check(due)) {
            return steps_result(k, end, ratio, 0);
        }
        ratio -= c.decay;
        if (ratio < c.floor) {
            ratio = c.floor;
        }
        k = k1;
        if (PyList_GET_SIZE(due) > 0) {
            PyObject *kk = PyLong_FromLongLong((long long)k), *got;
            if (kk == NULL) {
                return NULL;
            }
            got = PyObject_CallOneArg(give, kk);
            Py_DECREF(kk);
            if (got == NULL) {
                return NULL;
            }
            if (!exact_int(got, &free_pages)) {
                PyErr_Format(PyExc_TypeError, "decode_steps: give(%lld) returned %R, not the free pages",
                             (long long)k, got);
                Py_DECREF(got);
                return NULL;
            }
            Py_DECREF(got);
        }
        end = next_end;
        if (wakes != Py_None) {
            PyObject *t = PyLong_FromLongLong((long long)now);
            int bad = t == NULL || PyList_Append(wakes, t) < 0;
            Py_XDECREF(t);
            if (bad) {
                return NULL;
            }
        }
        if ((bounded && end >= until) || free_pages < n || fin_step == k + 1) {
            return steps_result(k, end, ratio, 1);
        }
    }
}

PyMethodDef cp_router_methods[] = {
    {"decode_steps", (PyCFunction)(void (*)(void))cp_decode_steps, METH_FASTCALL, decode_steps_doc},
    {"ranks_json", (PyCFunction)(void (*)(void))cp_ranks_json, METH_FASTCALL, ranks_json_doc},
    {NULL, NULL, 0, NULL},
};
