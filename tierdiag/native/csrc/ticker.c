/* FlushTicker (probes/recorder.py: the recorder's `tick`, called by the engine once a batch).
 *
 * FlushTicker(buffers, limit, flush)() calls flush() when the buffers (a tuple of anything with
 * a length: the recorder's row buffers or lists) hold `limit` rows or more in all, else does
 * nothing: Recorder._tick_py, the reference, in one C call. The engine ticks ~8 times a request;
 * as a Python method each tick cost ~4k instructions (a frame, a map, six len calls), 3 % of
 * a probed Engine.run (benchmarks/README.md, issue 41). An error from a length or from flush()
 * propagates, as it does from the reference.
 * Called through vectorcall (no argument tuple, no tp_call's checks: the compiled engine's
 * `tick()`), and a RowBuffer's length read from it directly (no call through its type): ~1/4 of
 * a tick's cost was the call, ~2/5 the lengths (callgrind, issue 41 session 22). A memoryview
 * among the buffers is a row counter (the engine's columnar buffers', engine/emitters.py
 * Columns: the first int64 of a librt vec they update in place), its rows read from it with no
 * call (their lengths through mypyc's __len__ were ~35 instructions each, five a tick; CPLANE_API
 * 18, issue 41 session 24). */
#include "cplane.h"

#include <stddef.h>

typedef struct {
    PyObject_HEAD
    PyObject *buffers;  /* tuple */
    Py_ssize_t limit;
    PyObject *flush;    /* callable: the recorder's bound flush, hence the GC support */
    vectorcallfunc vectorcall;
} FlushTicker;

static PyObject *ft_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *
ft_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *buffers, *flush;
    Py_ssize_t limit;
    FlushTicker *ft;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "FlushTicker(buffers, limit, flush) takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!nO:FlushTicker", &PyTuple_Type, &buffers, &limit, &flush)) {
        return NULL;
    }
    if (!PyCallable_Check(flush)) {
        PyErr_SetString(PyExc_TypeError, "FlushTicker: flush must be callable");
        return NULL;
    }
    if ((ft = (FlushTicker *)type->tp_alloc(type, 0)) == NULL) {
        return NULL;
    }
    ft->buffers = Py_NewRef(buffers);
    ft->limit = limit;
    ft->flush = Py_NewRef(flush);
    ft->vectorcall = ft_vectorcall;
    return (PyObject *)ft;
}

static int
ft_traverse(FlushTicker *ft, visitproc visit, void *arg)
{
    Py_VISIT(ft->buffers);
    Py_VISIT(ft->flush);
    return 0;
}

static int
ft_clear(FlushTicker *ft)
{
    Py_CLEAR(ft->buffers);
    Py_CLEAR(ft->flush);
    return 0;
}

static void
ft_dealloc(FlushTicker *ft)
{
    PyObject_GC_UnTrack(ft);
    ft_clear(ft);
    Py_TYPE(ft)->tp_free((PyObject *)ft);
}

static PyObject *
ft_vectorcall(PyObject *self, PyObject *const *Py_UNUSED(args), size_t nargsf, PyObject *kwnames)
{
    FlushTicker *ft = (FlushTicker *)self;
    Py_ssize_t total = 0, i, n;
    if (PyVectorcall_NARGS(nargsf) || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a FlushTicker takes no arguments");
        return NULL;
    }
    if (ft->buffers == NULL || ft->flush == NULL) {
        Py_RETURN_NONE;  /* cleared by the collector: nothing left to flush */
    }
    for (i = 0; i < PyTuple_GET_SIZE(ft->buffers); i++) {
        PyObject *b = PyTuple_GET_ITEM(ft->buffers, i);
        if (Py_IS_TYPE(b, &cp_RowBufferType)) {
            n = cp_row_buffer_rows(b);
        } else if (PyMemoryView_Check(b)) {  /* a row counter: its first int64, read in place */
            Py_buffer *view = PyMemoryView_GET_BUFFER(b);
            int64_t c;
            if (view->len < 8 || view->itemsize != 8) {
                PyErr_SetString(PyExc_TypeError, "FlushTicker: a counter is a memoryview of int64s");
                return NULL;
            }
            memcpy(&c, view->buf, 8);
            n = (Py_ssize_t)c;
        } else if ((n = PyObject_Length(b)) < 0) {
            return NULL;
        }
        total += n;
    }
    if (total >= ft->limit) {
        return PyObject_CallNoArgs(ft->flush);
    }
    Py_RETURN_NONE;
}

PyTypeObject cp_FlushTickerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.FlushTicker",
    .tp_doc = PyDoc_STR("FlushTicker(buffers, limit, flush)(): flush() once the buffers hold limit rows in all."),
    .tp_basicsize = sizeof(FlushTicker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FlushTicker, vectorcall),
    .tp_new = ft_new,
    .tp_dealloc = (destructor)ft_dealloc,
    .tp_traverse = (traverseproc)ft_traverse,
    .tp_clear = (inquiry)ft_clear,
    .tp_call = PyVectorcall_Call,
};
