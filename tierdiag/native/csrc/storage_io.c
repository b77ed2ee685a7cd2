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
    Py_buffer rb;
    Ints p;
    Py_ssize_t layers, item, npages, page_bytes, per_chunk, total;
    long long fd_ll, offset;
    char *chunk = NULL, small[16384];
    const char *src;
    PyObject *result = NULL;
    int got;

    if (wrong_nargs(nargs, 4, "pwrite_rows() takes 4 arguments: fd, offset, rows, pages")) {
        return NULL;
    }
    fd_ll = PyLong_AsLongLong(args[0]);
    if (fd_ll == -1 && PyErr_Occurred()) return NULL;
    offset = PyLong_AsLongLong(args[1]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    if (fd_ll < 0 || fd_ll > INT32_MAX || offset < 0) {
        return not_mine();
    }
    if (!get_rows(args[2], &rb, 0)) {
        return not_mine();
    }
    ints_init(&p);
    layers = rb.shape[0];
    item = rb.itemsize;
    npages = rb.shape[1];
    src = rb.buf;
    got = ints_load(args[3], &p);
    if (got < 0) goto done;
    if (got == 0 || !all_in_range(&p, npages) || item > PY_SSIZE_T_MAX / layers) {
        result = not_mine();
        goto done;
    }
    page_bytes = layers * item;
    if (p.n > 0 && page_bytes > (PY_SSIZE_T_MAX - 1) / p.n) {
        result = not_mine();
        goto done;
    }
    total = p.n * page_bytes;
    if (total > INT64_MAX - offset) {
        result = not_mine();
        goto done;
    }
    per_chunk = PW_CHUNK_BYTES / page_bytes;
    if (per_chunk < 1) per_chunk = 1;
    if (per_chunk > p.n) per_chunk = p.n;
    if (per_chunk * page_bytes <= (Py_ssize_t)sizeof small) {
        chunk = small;
    } else if ((chunk = PyMem_Malloc((size_t)(per_chunk * page_bytes))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < p.n; i += per_chunk) {
        Py_ssize_t k = p.n - i < per_chunk ? p.n - i : per_chunk;
        char *out = chunk;
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_ssize_t page = (Py_ssize_t)p.v[i + j];
            for (Py_ssize_t l = 0; l < layers; l++) {
                memcpy(out, src + (l * npages + page) * item, (size_t)item);
                out += item;
            }
        }
        if (pw_all((int)fd_ll, chunk, k * page_bytes, (int64_t)offset + (int64_t)(i * page_bytes)) < 0) {
            goto done;
        }
    }
    result = PyLong_FromSsize_t(total);
done:
    if (chunk != NULL && chunk != small) PyMem_Free(chunk);
    ints_free(&p);
    PyBuffer_Release(&rb);
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
    Py_buffer rb;
    Ints p;
    Py_ssize_t layers, item, npages, page_bytes, total, done = 0;
    long long fd_ll, offset;
    char *buf = NULL, small[16384];
    char *dst;
    PyObject *result = NULL;
    int got;

    if (wrong_nargs(nargs, 4, "pread_rows() takes 4 arguments: fd, offset, rows, pages")) {
        return NULL;
    }
    fd_ll = PyLong_AsLongLong(args[0]);
    if (fd_ll == -1 && PyErr_Occurred()) return NULL;
    offset = PyLong_AsLongLong(args[1]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    if (fd_ll < 0 || fd_ll > INT32_MAX || offset < 0) {
        return not_mine();
    }
    if (!get_rows(args[2], &rb, 1)) {
        return not_mine();
    }
    ints_init(&p);
    layers = rb.shape[0];
    item = rb.itemsize;
    npages = rb.shape[1];
    dst = rb.buf;
    got = ints_load(args[3], &p);
    if (got < 0) goto done;
    if (got == 0 || !all_in_range(&p, npages) || item > PY_SSIZE_T_MAX / layers) {
        result = not_mine();
        goto done;
    }
    page_bytes = layers * item;
    if (p.n > 0 && page_bytes > (PY_SSIZE_T_MAX - 1) / p.n) {
        result = not_mine();
        goto done;
    }
    total = p.n * page_bytes;
    if (total > INT64_MAX - offset) {
        result = not_mine();
        goto done;
    }
    if (total <= (Py_ssize_t)sizeof small) {
        buf = small;
    } else if ((buf = PyMem_Malloc((size_t)total)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* every byte first (a short file leaves the pool untouched), then the rows into place */
    while (done < total) {
        ssize_t r = pread((int)fd_ll, buf + done, (size_t)(total - done), (off_t)(offset + done));
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
    if (done == total) {
        const char *in = buf;
        for (Py_ssize_t i = 0; i < p.n; i++) {
            Py_ssize_t page = (Py_ssize_t)p.v[i];
            for (Py_ssize_t l = 0; l < layers; l++) {
                memcpy(dst + (l * npages + page) * item, in, (size_t)item);
                in += item;
            }
        }
    }
    result = PyLong_FromSsize_t(done);
done:
    if (buf != NULL && buf != small) PyMem_Free(buf);
    ints_free(&p);
    PyBuffer_Release(&rb);
    return result;
}

PyMethodDef cp_storage_io_methods[] = {
    {"pwrite_rows", (PyCFunction)(void (*)(void))cp_pwrite_rows, METH_FASTCALL, cp_pwrite_rows_doc},
    {"pread_rows", (PyCFunction)(void (*)(void))cp_pread_rows, METH_FASTCALL, cp_pread_rows_doc},
    {NULL, NULL, 0, NULL},
};
