/* RowBuffer (probes/recorder.py: a table's rows, encoded as appended) and decode_arrow
 * (store/writer.py's table_columns: those rows as Arrow buffers, or as the values themselves). */
#include "cplane.h"

/* ------------------------------------------------------------------------------------------ */
/* RowBuffer: a recorder's buffer of one table's rows, encoded as they are appended             */
/*                                                                                              */
/* The probes' events are tuples built on the engine's hot path. Kept as tuples until a flush,  */
/* each (and each of its ints) is a heap object the flush's pickling visits again, cold, one by  */
/* one; here a row is encoded when it is appended, while its values are hot, and the tuple goes  */
/* back to the allocator at once. A flush hands over one bytes object; the store's writer       */
/* process turns it back into the same values (decode_arrow). Per value: a tag byte, then        */
/*   'N' None | 'T' True | 'F' False | 'I' an exact int within int64: 8 bytes | 'D' an exact      */
/*   float: 8 bytes | 'S' a str, or a str subclass's text (the engine's StrEnum members: Tier,  */
/*   EvictionAction, TransferKind), uint32 length + UTF-8: a subclass's comes back a plain str */
/*   of the same text, what its VARCHAR column stores (as 'O' objects they were pickled,       */
/*   unpickled and decoded as Python values in the writer: their columns off the Arrow path)  */
/*   | 'O' anything else (a big int, a numpy scalar, a str with lone surrogates): uint32 index */
/*   into the buffer's list of such objects, which travels beside the bytes (pickled), and     */
/*   comes back as it went in.                                                                 */

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t len, cap, rows, width;
    PyObject *objects;  /* list, or NULL while none */
} RowBuffer;

static int rb_grow(RowBuffer *rb, Py_ssize_t need);

static inline int
rb_reserve(RowBuffer *rb, Py_ssize_t more)
{
    return rb->len + more <= rb->cap ? 0 : rb_grow(rb, rb->len + more);
}

static int
rb_grow(RowBuffer *rb, Py_ssize_t need)
{
    Py_ssize_t cap = rb->cap ? rb->cap : 1 << 16;
    char *p;
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
        int64_t x;  /* read in place (cp_small_int): every id, time and count a row holds */
        if (!cp_small_int(v, &x)) {
            int overflow = 0;
            x = (int64_t)PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow) {
                goto object;
            }
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
    } else if (PyUnicode_Check(v)) {  /* a str subclass too: its text (the engine's StrEnum members) */
        Py_ssize_t n;
        const char *u;
        uint32_t n32;
#ifndef Py_LIMITED_API
        if (PyUnicode_IS_COMPACT_ASCII(v)) {  /* ASCII is its own UTF-8: read in place, no call */
            n = PyUnicode_GET_LENGTH(v);
            u = (const char *)PyUnicode_DATA(v);
        } else
#endif
        u = PyUnicode_AsUTF8AndSize(v, &n);
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

/* One row of `width` values, room for each as an int or None made first (9 bytes a value,
 * reserved again after any other value, which reserves its own): the row's common values, an int
 * read in place (cp_small_int) and None, are written inline with no call and no capacity check a
 * value, the others by rb_put. The same bytes as rb_put's for every value
 * (tests/engine/test_cplane.py); ~2/5 of the appends' instructions went (callgrind, issue 41
 * session 22). 0, or -1 with an exception set and the row not kept. */
static int
rb_put_row(RowBuffer *rb, PyObject *const *vals, Py_ssize_t width)
{
    Py_ssize_t start = rb->len, i;
    Py_ssize_t nobj = rb->objects ? PyList_GET_SIZE(rb->objects) : 0;
    if (width > (PY_SSIZE_T_MAX - rb->len) / 9 || rb_reserve(rb, 9 * width) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return -1;
    }
    for (i = 0; i < width; i++) {
        PyObject *v = vals[i];
        int64_t x;
        if (PyLong_CheckExact(v) && cp_small_int(v, &x)) {
            char *p = rb->buf + rb->len;
            p[0] = 'I';
            memcpy(p + 1, &x, 8);
            rb->len += 9;
            continue;
        }
        if (v == Py_None) {
            rb->buf[rb->len++] = 'N';
            continue;
        }
        if (rb_put(rb, v) < 0 || rb_reserve(rb, 9 * (width - i - 1)) < 0) {
            rb->len = start;
            if (rb->objects != NULL && PyList_SetSlice(rb->objects, nobj, PY_SSIZE_T_MAX, NULL) < 0) {
                PyErr_Clear();
            }
            return -1;
        }
    }
    rb->rows++;
    return 0;
}

static PyObject *
rb_append(RowBuffer *rb, PyObject *row)
{
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != rb->width) {
        PyErr_Format(PyExc_TypeError, "RowBuffer.append takes a tuple of %zd values", rb->width);
        return NULL;
    }
    if (rb_put_row(rb, ((PyTupleObject *)row)->ob_item, rb->width) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(rb_append_pairs_doc,
"append_pairs(first, pairs)\n\nappend((first, key, value)) for each item of the dict `pairs`, in its order,\n"
"for a buffer of 3 values a row (a TypeError for another width or anything but a dict): a request's\n"
"request_evictions rows from its `lost` dict in one call, no tuple built and no int boxed a row\n"
"(issue 41, session 38). A row that fails part-way (MemoryError) is not kept; the rows before it are.");

static PyObject *
rb_append_pairs(RowBuffer *rb, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *row[3], *key, *value;
    Py_ssize_t pos = 0;
    if (nargs != 2 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "RowBuffer.append_pairs takes (first, a dict)");
        return NULL;
    }
    if (rb->width != 3) {
        PyErr_Format(PyExc_TypeError, "RowBuffer.append_pairs: a buffer of 3 values a row, not %zd", rb->width);
        return NULL;
    }
    row[0] = args[0];
    while (PyDict_Next(args[1], &pos, &key, &value)) {  /* (borrowed; nothing here runs Python code) */
        row[1] = key;
        row[2] = value;
        if (rb_put_row(rb, row, 3) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* A RowBuffer's rows (ticker.c reads them with no call through the type). */
Py_ssize_t
cp_row_buffer_rows(PyObject *rb)
{
    return ((RowBuffer *)rb)->rows;
}

static void
rb_reset(RowBuffer *rb)
{
    rb->len = 0;
    rb->rows = 0;
    Py_CLEAR(rb->objects);
}

PyDoc_STRVAR(rb_take_doc,
"take() -> (bytes, rows, objects or None)\n\nWhat was appended since the last take (decode_arrow's first three arguments),\n"
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
    {"append_pairs", (PyCFunction)(void (*)(void))rb_append_pairs, METH_FASTCALL, rb_append_pairs_doc},
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

PyTypeObject cp_RowBufferType = {
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
            PyErr_SetString(PyExc_ValueError, "decode_arrow: an object index out of range");
            return NULL;
        }
        return Py_NewRef(PyList_GET_ITEM(objects, at));
    }
    }
}

/* Whether a value (tag, its payload at p) fits a column of `kind`. */
static int
da_fits(char kind, char tag, const char *p)
{
    if (tag == 'N') {
        return 1;
    }
    switch (kind) {
    case 'i': return tag == 'I';
    case 'n': {  /* int32 (an INTEGER column: dp_rank, best_rank ...) */
        int64_t x;
        if (tag != 'I') {
            return 0;
        }
        memcpy(&x, p, 8);
        return x >= INT32_MIN && x <= INT32_MAX;
    }
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

/* decode_arrow's work, for `width` columns of `kinds`: the list, or NULL
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
        cols[c].fit = kinds[c] == 'i' || kinds[c] == 'n' || kinds[c] == 'd' || kinds[c] == 'b' || kinds[c] == 's';
    }
    /* Pass 1: check the data; which columns fit, their nulls and string bytes. */
    p = data;
    for (r = 0; r < rows; r++) {
        for (c = 0; c < width; c++) {
            DaCol *col = &cols[c];
            char tag;
            Py_ssize_t k;
            if (p >= end) {
                PyErr_SetString(PyExc_ValueError, "decode_arrow: the data ends inside a row");
                goto fail;
            }
            tag = *p++;
            if ((k = da_skip(p, end, tag)) < 0) {
                PyErr_SetString(PyExc_ValueError, tag != '\0' && strchr("NTFIDSO", tag) != NULL
                                ? "decode_arrow: the data ends inside a row" : "decode_arrow: a bad tag");
                goto fail;
            }
            if (col->fit) {
                if (!da_fits(kinds[c], tag, p)) {
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
                    PyErr_SetString(PyExc_ValueError, "decode_arrow: an object index out of range");
                    goto fail;
                }
            }
            p += k;
        }
    }
    if (p != end) {
        PyErr_SetString(PyExc_ValueError, "decode_arrow: data left after the last row");
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
        col->vals = PyBytes_FromStringAndSize(NULL, kinds[c] == 'b' ? nbytes
                                                    : kinds[c] == 's' || kinds[c] == 'n' ? (rows + (kinds[c] == 's')) * 4
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
                } else if (kinds[c] == 'n') {
                    if (tag != 'N') {  /* checked in pass 1: within int32 */
                        int64_t x;
                        int32_t y;
                        memcpy(&x, p, 8);
                        y = (int32_t)x;
                        memcpy(vals + r * 4, &y, 4);
                    }
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

/* decode_arrow's arguments: data (bytes), rows, objects, kinds (bytes). 0, or -1 with an
 * exception. */
static int
decode_args(PyObject *const *args, Py_ssize_t nargs, const char **data, const char **end, Py_ssize_t *rows,
            PyObject **objects)
{
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "decode_arrow() takes data (bytes), rows, objects, kinds (bytes)");
        return -1;
    }
    *rows = PyLong_AsSsize_t(args[1]);
    if (*rows == -1 && PyErr_Occurred()) {
        return -1;
    }
    *objects = args[2];
    if (*rows < 0 || (*objects != Py_None && !PyList_Check(*objects))) {
        PyErr_SetString(PyExc_ValueError, "decode_arrow: bad rows or objects");
        return -1;
    }
    *data = PyBytes_AS_STRING(args[0]);
    *end = *data + PyBytes_GET_SIZE(args[0]);
    return 0;
}

PyDoc_STRVAR(decode_arrow_doc,
"decode_arrow(data, rows, objects, kinds) -> list, a column each\n\n"
"RowBuffer.take's rows as Arrow buffers, straight, for the columns whose every value fits its\n"
"kind (a bytes string, a letter a column): ('i' or 'd', values, validity, nulls) for int64 and\n"
"float64, ('n', values, validity, nulls) for int32 (ints within its range), ('b', value bits, validity, nulls) for bool, ('s', int32 offsets, UTF-8 data,\n"
"validity, nulls) for strings; validity None without a null, else an Arrow bitmap (LSB first,\n"
"1 valid). None fits every kind. A column of kind 'o', or whose values do not all fit (an int\n"
"in a float column, a big int, an odd object, strings past 2 GiB), is ('o', a tuple of the\n"
"values themselves), exactly as they were appended (kinds b'o' * width: every column so).\n"
"A ValueError for data that is not such rows (cut short, a bad tag, an object index out of\n"
"range).");

static PyObject *
cp_decode_arrow(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    const char *data, *end;
    Py_ssize_t rows;
    PyObject *objects;
    if (decode_args(args, nargs, &data, &end, &rows, &objects) < 0) {
        return NULL;
    }
    if (PyBytes_GET_SIZE(args[3]) <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_arrow: no kinds");
        return NULL;
    }
    return decode_columns(data, end, rows, objects, PyBytes_AS_STRING(args[3]), PyBytes_GET_SIZE(args[3]));
}

/* A str's UTF-8 (PyUnicode_AsUTF8AndSize): a compact ASCII str is its own UTF-8, read in place
   without the call (~50 instructions a value, twice a value in text_column: ~160k values a
   conversation replay; issue 41 session 35); any other str through the call, which caches it. */
static inline const char *
text_utf8(PyObject *v, Py_ssize_t *len)
{
#ifndef Py_LIMITED_API
    if (PyUnicode_IS_COMPACT_ASCII(v)) {
        *len = PyUnicode_GET_LENGTH(v);
        return (const char *)PyUnicode_DATA(v);
    }
#endif
    return PyUnicode_AsUTF8AndSize(v, len);
}

PyDoc_STRVAR(text_column_doc,
"text_column(values) -> (int32 offsets, UTF-8 data, validity, nulls) or None\n\n"
"A list of str and None as the buffers of an Arrow string array (decode_arrow's 's' layout):\n"
"offsets (bytes, rows + 1 int32s), the values' UTF-8 bytes one after the other, validity None\n"
"without a None, else an Arrow bitmap (LSB first, 1 valid), and the Nones counted. None where\n"
"the list is not such a column: a value that is not exactly a str or None, a str with no UTF-8\n"
"form (a lone surrogate), no str at all, or data past 2 GiB; the caller keeps the list then\n"
"(engine/emitters.py's object columns, handed over by store/frames.py's out_of_band).");

static PyObject *
cp_text_column(PyObject *Py_UNUSED(module), PyObject *values)
{
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "text_column() takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    Py_ssize_t total = 0, nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (v == Py_None) {
            nulls++;
            continue;
        }
        if (!PyUnicode_CheckExact(v)) {
            Py_RETURN_NONE;
        }
        Py_ssize_t len;
        if (text_utf8(v, &len) == NULL) {
            PyErr_Clear();  /* no UTF-8 form: the list as it is (arrow_column refuses it as before) */
            Py_RETURN_NONE;
        }
        total += len;
        if (total > INT32_MAX) {
            Py_RETURN_NONE;
        }
    }
    if (nulls == n) {
        Py_RETURN_NONE;
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *data = PyBytes_FromStringAndSize(NULL, total);
    PyObject *valid = nulls ? PyBytes_FromStringAndSize(NULL, (n + 7) / 8) : NULL;
    if (offsets == NULL || data == NULL || (nulls && valid == NULL)) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        Py_XDECREF(valid);
        return NULL;
    }
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(data);
    char *bits = valid ? PyBytes_AS_STRING(valid) : NULL;
    if (bits != NULL) {
        memset(bits, 0, (size_t)((n + 7) / 8));
    }
    Py_ssize_t at = 0;
    off[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (v != Py_None) {
            Py_ssize_t len;
            const char *utf8 = text_utf8(v, &len);  /* cached by the first pass (or ASCII in place) */
            if (utf8 == NULL || at + len > total) {  /* the list changed under us: not possible without the GIL let go */
                Py_DECREF(offsets);
                Py_DECREF(data);
                Py_XDECREF(valid);
                if (utf8 == NULL) {
                    return NULL;
                }
                PyErr_SetString(PyExc_RuntimeError, "text_column: the list changed while it was read");
                return NULL;
            }
            memcpy(out + at, utf8, (size_t)len);
            at += len;
            if (bits != NULL) {
                bits[i >> 3] |= (char)(1 << (i & 7));
            }
        }
        off[i + 1] = (int32_t)at;
    }
    PyObject *res = Py_BuildValue("(NNOn)", offsets, data, valid ? valid : Py_None, nulls);
    Py_XDECREF(valid);
    return res;
}

/* ------------------------------------------------------------------------------------------ */

PyMethodDef cp_rows_methods[] = {
    {"decode_arrow", (PyCFunction)(void (*)(void))cp_decode_arrow, METH_FASTCALL, decode_arrow_doc},
    {"text_column", (PyCFunction)cp_text_column, METH_O, text_column_doc},
    {NULL, NULL, 0, NULL},
};
