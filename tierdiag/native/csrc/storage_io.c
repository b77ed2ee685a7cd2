/* The storage tier's page writes and reads (engine/storage.py: StorageTier._append_rows and
 * _read_run_rows; numpy's gather / scatter with os.pwrite / os.preadv are the reference and the
 * fallback). */
#include "cplane.h"

#include <errno.h>
#include <unistd.h>

/* Pages are gathered into a buffer of at most this many bytes, written, and the next ones
 * gathered: the buffer stays in L2 whatever the write's size. */
#define PW_CHUNK_BYTES ((Py_ssize_t)1 << 20)

/* Write all `len` bytes at `offset`, retrying short writes and EINTR (after the signal
 * handlers, as os.pwrite does). 0, or -1 with OSError set (errno's). */
static int
pw_all(int fd, const char *buf, Py_ssize_t len, int64_t offset)
{
    while (len > 0) {
        ssize_t w = pwrite(fd, buf, (size_t)len, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0) return -1;
                continue;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (w == 0) {  /* a regular file never writes nothing: the loop would spin */
            errno = EIO;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        buf += w;
        len -= w;
        offset += w;
    }
    return 0;
}

/* The two calls' arguments (fd, offset, rows, pages), checked alike. */
typedef struct {
    Py_buffer rb;
    Ints p;
    int fd;
    int64_t offset;
    Py_ssize_t layers, item, npages, page_bytes, total;
} io_args;

static void
io_release(io_args *a)
{
    ints_free(&a->p);
    PyBuffer_Release(&a->rb);
}

/* 1: ready (io_release after); 0: not my case, nothing held; -1: an exception set, nothing held. */
static int
io_parse(PyObject *const *args, Py_ssize_t nargs, const char *usage, int writable, io_args *a)
{
    long long fd_ll, offset;
    int got;

    if (wrong_nargs(nargs, 4, usage)) {
        return -1;
    }
    fd_ll = PyLong_AsLongLong(args[0]);
    if (fd_ll == -1 && PyErr_Occurred()) return -1;
    offset = PyLong_AsLongLong(args[1]);
    if (offset == -1 && PyErr_Occurred()) return -1;
    if (fd_ll < 0 || fd_ll > INT32_MAX || offset < 0) {
        return 0;
    }
    if (!get_rows(args[2], &a->rb, writable)) {
        return 0;
    }
    ints_init(&a->p);
    a->fd = (int)fd_ll;
    a->offset = (int64_t)offset;
    a->layers = a->rb.shape[0];
    a->item = a->rb.itemsize;
    a->npages = a->rb.shape[1];
    got = ints_load(args[3], &a->p);
    if (got < 0) {
        io_release(a);
        return -1;
    }
    if (got == 0 || !all_in_range(&a->p, a->npages) || a->item > PY_SSIZE_T_MAX / a->layers) goto not_mine;
    a->page_bytes = a->layers * a->item;
    if (a->p.n > 0 && a->page_bytes > (PY_SSIZE_T_MAX - 1) / a->p.n) goto not_mine;
    a->total = a->p.n * a->page_bytes;
    if (a->total > INT64_MAX - offset) goto not_mine;
    return 1;
not_mine:
    io_release(a);
    return 0;
}

PyDoc_STRVAR(cp_pwrite_rows_doc,
"pwrite_rows(fd, offset, rows, pages) -> bytes written, or -1 (not my case)\n\n"
"Write pages `pages` of a CPU pool's row view (rows.array_rows: [L, P] row items) to file\n"
"descriptor `fd` at byte `offset`, page after page, each page its L rows in layer order (the\n"
"bytes of `np.ascontiguousarray(rows.take(pages, axis=1).T)`). -1, having written nothing:\n"
"not a row view, a page outside the pool, a list of something else than ints. OSError (the\n"
"system's errno) when the write fails: the bytes before it may be in the file.");

static PyObject *
cp_pwrite_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    io_args a;
    Py_ssize_t per_chunk;
    char *chunk = NULL, small[16384];
    const char *src;
    PyObject *result = NULL;
    int ok = io_parse(args, nargs, "pwrite_rows() takes 4 arguments: fd, offset, rows, pages", 0, &a);

    if (ok <= 0) {
        return ok < 0 ? NULL : not_mine();
    }
    src = a.rb.buf;
    per_chunk = PW_CHUNK_BYTES / a.page_bytes;
    if (per_chunk < 1) per_chunk = 1;
    if (per_chunk > a.p.n) per_chunk = a.p.n;
    if (per_chunk * a.page_bytes <= (Py_ssize_t)sizeof small) {
        chunk = small;
    } else if ((chunk = PyMem_Malloc((size_t)(per_chunk * a.page_bytes))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < a.p.n; i += per_chunk) {
        Py_ssize_t k = a.p.n - i < per_chunk ? a.p.n - i : per_chunk;
        char *out = chunk;
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_ssize_t page = (Py_ssize_t)a.p.v[i + j];
            for (Py_ssize_t l = 0; l < a.layers; l++) {
                memcpy(out, src + (l * a.npages + page) * a.item, (size_t)a.item);
                out += a.item;
            }
        }
        if (pw_all(a.fd, chunk, k * a.page_bytes, a.offset + (int64_t)(i * a.page_bytes)) < 0) {
            goto done;
        }
    }
    result = PyLong_FromSsize_t(a.total);
done:
    if (chunk != NULL && chunk != small) PyMem_Free(chunk);
    io_release(&a);
    return result;
}


PyDoc_STRVAR(cp_pread_rows_doc,
"pread_rows(fd, offset, rows, pages) -> bytes read, or -1 (not my case)\n\n"
"Read len(pages) whole pages from file descriptor `fd` at byte `offset` (pages as pwrite_rows\n"
"writes them: page after page, each its L rows in layer order) into pages `pages` of a CPU\n"
"pool's row view: page i of the file into pages[i]. Fewer bytes than asked (the file ends):\n"
"the count read, and the pool is left as it was. -1, having read nothing: not a writable row\n"
"view, a page outside the pool, a list of something else than ints. OSError (the system's\n"
"errno) when the read fails.");

static PyObject *
cp_pread_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    io_args a;
    Py_ssize_t done = 0;
    char *buf = NULL, small[16384];
    char *dst;
    PyObject *result = NULL;
    int ok = io_parse(args, nargs, "pread_rows() takes 4 arguments: fd, offset, rows, pages", 1, &a);

    if (ok <= 0) {
        return ok < 0 ? NULL : not_mine();
    }
    dst = a.rb.buf;
    if (a.total <= (Py_ssize_t)sizeof small) {
        buf = small;
    } else if ((buf = PyMem_Malloc((size_t)a.total)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* every byte first (a short file leaves the pool untouched), then the rows into place */
    while (done < a.total) {
        ssize_t r = pread(a.fd, buf + done, (size_t)(a.total - done), (off_t)(a.offset + done));
        if (r < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0) goto done;
                continue;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        if (r == 0) break;  /* the end of the file */
        done += r;
    }
    if (done == a.total) {
        const char *in = buf;
        for (Py_ssize_t i = 0; i < a.p.n; i++) {
            Py_ssize_t page = (Py_ssize_t)a.p.v[i];
            for (Py_ssize_t l = 0; l < a.layers; l++) {
                memcpy(dst + (l * a.npages + page) * a.item, in, (size_t)a.item);
                in += a.item;
            }
        }
    }
    result = PyLong_FromSsize_t(done);
done:
    if (buf != NULL && buf != small) PyMem_Free(buf);
    io_release(&a);
    return result;
}

PyMethodDef cp_storage_io_methods[] = {
    {"pwrite_rows", (PyCFunction)(void (*)(void))cp_pwrite_rows, METH_FASTCALL, cp_pwrite_rows_doc},
    {"pread_rows", (PyCFunction)(void (*)(void))cp_pread_rows, METH_FASTCALL, cp_pread_rows_doc},
    {NULL, NULL, 0, NULL},
};
