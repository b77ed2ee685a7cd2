/* The deployment's arrival text (engine/deployment.py: ranks_json): where a request's prefix was
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

/* An int64 in decimal, as int.__str__ writes it. */
static int
text_int(Text *t, int64_t v)
{
    char buf[24];
    int i = (int)sizeof(buf);
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        buf[--i] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
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
    text = PyDict_GetItemWithError(table, s); /* borrowed */
    if (text != NULL) {
        Py_INCREF(text);
    } else {
        if (PyErr_Occurred()) {
            return -1;
        }
        text = PyObject_Repr(s);
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
    rc = text_add(t, u, n) < 0 ? -1 : 1;
    Py_DECREF(text);
    return rc;
}

PyDoc_STRVAR(ranks_json_doc,
"ranks_json(held, in_flight, scores, page_size, score_text, score_text_max) -> str, or -1\n\n"
"deployment.ranks_json_py's text: for each rank r of `held` (a list of (device pages, host\n"
"pages) int pairs), {\"rank\":r,\"device_tokens\":d*ps,\"host_tokens\":h*ps,\"in_flight\":in_flight[r],\n"
"\"score\":scores[r] (null past its end)}, joined as json.dumps(..., separators=(',', ':')).\n"
"Scores' texts are kept in the dict `score_text` (the reference's table). -1: not my case\n"
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
    /* Every value is checked before the score table is touched: "not my case" changes nothing. */
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *pair = PyList_GET_ITEM(held, r);
        int64_t d, h, f;
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
            || !exact_int(PyTuple_GET_ITEM(pair, 0), &d) || !exact_int(PyTuple_GET_ITEM(pair, 1), &h)
            || !times(d, ps, &d) || !times(h, ps, &h) || !exact_int(PyTuple_GET_ITEM(in_flight, r), &f)
            || (r < num_scores && !PyFloat_CheckExact(PyTuple_GET_ITEM(scores, r)))) {
            return not_mine();
        }
    }
    text_init(&t);
    if (TEXT_LIT(&t, "[") < 0) {
        goto done;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *pair = PyList_GET_ITEM(held, r);
        int64_t d = 0, h = 0, f = 0;
        int got;
        (void)exact_int(PyTuple_GET_ITEM(pair, 0), &d);
        (void)exact_int(PyTuple_GET_ITEM(pair, 1), &h);
        (void)exact_int(PyTuple_GET_ITEM(in_flight, r), &f);
        d *= ps; /* checked above */
        h *= ps;
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

PyMethodDef cp_router_methods[] = {
    {"ranks_json", (PyCFunction)(void (*)(void))cp_ranks_json, METH_FASTCALL, ranks_json_doc},
    {NULL, NULL, 0, NULL},
};
