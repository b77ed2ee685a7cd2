/* The storage tier's page writes and reads (engine/storage.py: StorageTier._append_rows and
 * _read_run_rows; numpy's gather / scatter with os.pwrite / os.preadv are the reference and the
 * fallback). */
#include "cplane.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/uio.h>
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

/* Pages `pages` of a row view [layers, npages] of `item`-byte rows into `out`, page after page,
 * each its rows in layer order. The common row sizes copied by a constant-size memcpy (inlined:
 * no call a row; a page is one row of 256 bytes, 4 cache lines, in the replays' host pool). The
 * pages are the host slots of a node, short runs at random places of the pool (~2.7 pages a run
 * on the whole trace): the rows of the page GATHER_AHEAD pages on are prefetched, so their cache
 * misses overlap the copies before them instead of stalling each copy. */
#define GATHER_AHEAD 4
#define GATHER_LOOP(SIZE)                                                                    \
    for (Py_ssize_t i = 0; i < n; i++) {                                                     \
        const char *p = src + (Py_ssize_t)pages[i] * (SIZE);                                 \
        if (i + GATHER_AHEAD < n) {                                                          \
            const char *q = src + (Py_ssize_t)pages[i + GATHER_AHEAD] * (SIZE);              \
            for (Py_ssize_t l = 0; l < layers; l++) {                                        \
                for (Py_ssize_t o = 0; o < (SIZE); o += 64) {                                \
                    __builtin_prefetch(q + l * npages * (SIZE) + o);                         \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (Py_ssize_t l = 0; l < layers; l++) {                                            \
            memcpy(out, p + l * npages * (SIZE), (SIZE));                                    \
            out += (SIZE);                                                                   \
        }                                                                                    \
    }

static void
gather_pages(char *out, const char *src, Py_ssize_t layers, Py_ssize_t npages, Py_ssize_t item,
             const int64_t *pages, Py_ssize_t n)
{
    switch (item) {
    case 64: GATHER_LOOP(64) break;
    case 128: GATHER_LOOP(128) break;
    case 256: GATHER_LOOP(256) break;
    default: GATHER_LOOP(item) break;
    }
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
        gather_pages(chunk, src, a.layers, a.npages, a.item, a.p.v + i, k);
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

/* ------------------------------------------------------------------------------------------ */
/* PageWriter: the page writes on a thread of their own                                       */

/* SGLang writes the storage tier from threads of its own (HiCacheController's backup thread
 * beside its prefetch threads, managers/cache_controller.py): the scheduler hands a backup over
 * and goes on. Here the bytes of a write are gathered from the pool at once (the pool's slots
 * may be reused the moment the call returns) into a job, and the job's pwrite runs on one C
 * thread that touches no Python object; the tier fences (waits for the jobs that cover a
 * range) before a read, before a segment's descriptor is closed, and at the run's end. The first
 * failing write (a full disk) is kept, every later job dropped, and reported at the next put
 * or fence with the system's errno, where the tier raises the one-line error it always did. */

typedef struct pw_job {
    struct pw_job *next;
    int fd;
    int64_t offset;
    Py_ssize_t len;
    int size_class;         /* its buffer holds 1 << (size_class + PW_MIN_SHIFT) bytes */
    char data[];
} pw_job;

/* Job buffers are kept for reuse by size class (powers of two from 4 KiB): a buffer a write,
 * fresh from malloc and freed by the other thread, cost the engine's thread malloc's work and
 * the kernel's zeroing of the heap's new pages, about what the thread took off it. */
#define PW_MIN_SHIFT 12
#define PW_CLASSES 40

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t work;    /* a job queued, or stop */
    pthread_cond_t landed;  /* a job done */
    pw_job *head, *tail;    /* queued, not yet taken */
    pw_job *busy;           /* the chain being written: its first job, and how many */
    int busy_n;             /* (their fds and ranges read by fences) */
    Py_ssize_t pending;     /* bytes queued or being written */
    Py_ssize_t max_pending; /* a put waits while this many bytes are pending */
    Py_ssize_t wake_bytes;  /* the thread is woken once this many are (or by a fence, close):
                             * a wake a write would be a futex call and a context switch each */
    int started, stop, inited;
    int sleeping;           /* the thread waits for work (a put wakes it only then) */
    long forks;             /* pw_forks when made: a forked child's copy has no thread */
    pthread_t thread;
    int fail_errno, fail_fd;
    int64_t fail_offset;
    long long jobs, bytes, dropped, waits;
    pw_job *spare[PW_CLASSES];  /* written jobs' buffers kept for reuse, by size class */
    Py_ssize_t spare_bytes;     /* at most max_pending of them */
} PageWriter;

/* Forks this process made (counted in the child by pthread_atfork): a writer whose count is
 * another is a forked child's copy, without the thread (getpid() a put would be a syscall). */
static volatile long pw_forks = 0;
static int pw_atfork_set = 0;

static void
pw_after_fork(void)
{
    pw_forks++;
}

static int
pw_mine(const PageWriter *self)
{
    return self->forks == pw_forks;
}

static int
pw_class(Py_ssize_t len)
{
    int c = 0;
    while (c < PW_CLASSES - 1 && ((Py_ssize_t)1 << (c + PW_MIN_SHIFT)) < len) c++;
    return c;
}

/* A written job's buffer back to the spares, or freed. Called with mu held; 1 if kept. */
static int
pw_keep(PageWriter *self, pw_job *job)
{
    Py_ssize_t cap;

    if (job->size_class >= PW_CLASSES) return 0;
    cap = (Py_ssize_t)1 << (job->size_class + PW_MIN_SHIFT);
    if (cap > self->max_pending || self->spare_bytes + cap > self->max_pending) return 0;
    job->next = self->spare[job->size_class];
    self->spare[job->size_class] = job;
    self->spare_bytes += cap;
    return 1;
}

/* The writes of a chain of `n` jobs (one file, each starting where the last ended) by pwritev:
 * one call for up to PW_CHAIN of them, not one a job. Returns errno's value, or 0; *written: how
 * many of the chain's jobs are wholly in the file. No Python: the GIL is not held. */
#define PW_CHAIN 64

static int
pw_chain_write(pw_job *first, int n, int *written)
{
    struct iovec iov[PW_CHAIN];
    int fd = first->fd, at = 0;
    int64_t offset = first->offset;
    pw_job *job = first;

    for (int k = 0; k < n; k++, job = job->next) {
        iov[k].iov_base = job->data;
        iov[k].iov_len = (size_t)job->len;
    }
    *written = 0;
    while (at < n) {
        ssize_t w = pwritev(fd, iov + at, n - at, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;  /* a regular file never writes nothing: the loop would spin */
        offset += w;
        while (at < n && (size_t)w >= iov[at].iov_len) {  /* whole jobs written */
            w -= (ssize_t)iov[at].iov_len;
            at++;
            (*written)++;
        }
        if (at < n && w > 0) {  /* part of one: the rest of it next */
            iov[at].iov_base = (char *)iov[at].iov_base + w;
            iov[at].iov_len -= (size_t)w;
        }
    }
    return 0;
}

static void *
pw_thread(void *arg)
{
    PageWriter *self = arg;

    pthread_mutex_lock(&self->mu);
    for (;;) {
        pw_job *job, *last;
        int err = 0, skip, n = 1, written = 0;

        while (self->head == NULL && !self->stop) {
            self->sleeping = 1;
            pthread_cond_wait(&self->work, &self->mu);
            self->sleeping = 0;
        }
        if (self->head == NULL) break;  /* stopped, and nothing left */
        /* the queue's head and the jobs that continue it in its file: one chain, one pwritev */
        job = last = self->head;
        while (n < PW_CHAIN && last->next != NULL && last->next->fd == job->fd &&
               last->next->offset == last->offset + (int64_t)last->len) {
            last = last->next;
            n++;
        }
        self->head = last->next;
        if (self->head == NULL) self->tail = NULL;
        self->busy = job;
        self->busy_n = n;
        skip = self->fail_errno != 0;
        pthread_mutex_unlock(&self->mu);
        if (!skip) err = pw_chain_write(job, n, &written);
        pthread_mutex_lock(&self->mu);
        self->busy = NULL;
        self->busy_n = 0;
        for (int k = 0; k < n; k++) {
            pw_job *next = job->next;

            if (k < written) {
                self->jobs++;
                self->bytes += job->len;
            } else {
                if (!skip && err != 0 && k == written) {  /* the first job not wholly written */
                    self->fail_errno = err;
                    self->fail_fd = job->fd;
                    self->fail_offset = job->offset;
                }
                self->dropped++;
            }
            self->pending -= job->len;
            if (!pw_keep(self, job)) {
                pthread_mutex_unlock(&self->mu);
                PyMem_RawFree(job);
                pthread_mutex_lock(&self->mu);
            }
            job = next;
        }
        pthread_cond_broadcast(&self->landed);
    }
    pthread_mutex_unlock(&self->mu);
    return NULL;
}

/* Whether a job writes any byte of [start, end) of fd (fd -1: any job at all). */
static int
pw_overlaps(const pw_job *job, int fd, int64_t start, int64_t end)
{
    if (fd < 0) return 1;
    return job->fd == fd && job->offset < end && start < job->offset + (int64_t)job->len;
}

/* 1 while a queued or running job covers the range. Called with mu held. */
static int
pw_covered(PageWriter *self, int fd, int64_t start, int64_t end)
{
    pw_job *b = self->busy;

    for (int k = 0; k < self->busy_n; k++, b = b->next) {
        if (pw_overlaps(b, fd, start, end)) return 1;
    }
    for (pw_job *j = self->head; j != NULL; j = j->next) {
        if (pw_overlaps(j, fd, start, end)) return 1;
    }
    return 0;
}

/* The failure as (fd, offset, errno), or None. Called with the GIL, mu not held by us. */
static PyObject *
pw_failure_tuple(int fail_errno, int fd, int64_t offset)
{
    if (fail_errno == 0) Py_RETURN_NONE;
    return Py_BuildValue("(iLi)", fd, (long long)offset, fail_errno);
}

/* Raise the kept failure as the OSError a synchronous write would have raised. */
static PyObject *
pw_raise(int fail_errno)
{
    errno = fail_errno;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static int
pw_init(PageWriter *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_pending", "wake_bytes", NULL};
    Py_ssize_t max_pending = (Py_ssize_t)16 << 20, wake_bytes = (Py_ssize_t)1 << 20;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|nn:PageWriter", kwlist, &max_pending, &wake_bytes)) {
        return -1;
    }
    if (max_pending < 1) {
        PyErr_Format(PyExc_ValueError, "PageWriter(max_pending): must be >= 1, got %zd", max_pending);
        return -1;
    }
    if (wake_bytes < 1 || wake_bytes > max_pending) {
        PyErr_Format(PyExc_ValueError, "PageWriter(wake_bytes): must be 1 to max_pending (%zd), got %zd",
                     max_pending, wake_bytes);
        return -1;
    }
    if (self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "PageWriter is initialised once");
        return -1;
    }
    if (pthread_mutex_init(&self->mu, NULL) != 0 || pthread_cond_init(&self->work, NULL) != 0 ||
        pthread_cond_init(&self->landed, NULL) != 0) {
        PyErr_SetString(PyExc_OSError, "PageWriter: cannot make its lock");
        return -1;
    }
    self->inited = 1;
    self->max_pending = max_pending;
    self->wake_bytes = wake_bytes;
    if (!pw_atfork_set) {
        if (pthread_atfork(NULL, NULL, pw_after_fork) != 0) {
            PyErr_SetString(PyExc_OSError, "PageWriter: cannot register its fork handler");
            return -1;
        }
        pw_atfork_set = 1;
    }
    self->forks = pw_forks;
    return 0;
}

/* Start the thread, every signal blocked in it (the main thread handles them). 0 or -1 set. */
static int
pw_start(PageWriter *self)
{
    sigset_t all, old;
    int err;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&self->thread, NULL, pw_thread, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->started = 1;
    return 0;
}

static int
pw_usable(PageWriter *self)
{
    if (!self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "PageWriter not initialised");
        return 0;
    }
    if (self->stop || !pw_mine(self)) {
        PyErr_SetString(PyExc_RuntimeError, "PageWriter is closed");
        return 0;
    }
    return 1;
}

/* Queue a job. Called with mu held. */
static void
pw_enqueue(PageWriter *self, pw_job *job)
{
    if (self->tail != NULL) {
        self->tail->next = job;
    } else {
        self->head = job;
    }
    self->tail = job;
    self->pending += job->len;
    if (self->sleeping && self->pending >= self->wake_bytes) pthread_cond_signal(&self->work);
}

PyDoc_STRVAR(pw_put_doc,
"put(fd, offset, rows, pages) -> bytes queued, or -1 (not my case)\n\n"
"pwrite_rows's write, on the writer's thread: the pages' rows are gathered now (the pool may\n"
"change once this returns), their pwrite queued. Waits while max_pending bytes are queued.\n"
"-1, queuing nothing: what pwrite_rows declines. OSError (errno of the first failed write,\n"
"see failure()) when an earlier write failed: nothing is queued after a failure.");

static PyObject *
pw_put(PageWriter *self, PyObject *const *args, Py_ssize_t nargs)
{
    io_args a;
    pw_job *job;
    Py_ssize_t len;
    int fail, cls;
    int ok;

    if (!pw_usable(self)) return NULL;
    ok = io_parse(args, nargs, "put() takes 4 arguments: fd, offset, rows, pages", 0, &a);
    if (ok <= 0) {
        return ok < 0 ? NULL : not_mine();
    }
    pthread_mutex_lock(&self->mu);
    fail = self->fail_errno;
    pthread_mutex_unlock(&self->mu);
    if (fail != 0) {
        io_release(&a);
        return pw_raise(fail);
    }
    if (a.total == 0) {
        io_release(&a);
        return PyLong_FromLong(0);
    }
    cls = pw_class(a.total);
    pthread_mutex_lock(&self->mu);
    job = self->spare[cls];
    if (job != NULL) {
        self->spare[cls] = job->next;
        self->spare_bytes -= (Py_ssize_t)1 << (cls + PW_MIN_SHIFT);
    }
    pthread_mutex_unlock(&self->mu);
    if (job == NULL) {
        size_t cap = (size_t)1 << (cls + PW_MIN_SHIFT);
        job = PyMem_RawMalloc(sizeof(pw_job) + (cap < (size_t)a.total ? (size_t)a.total : cap));
        if (job == NULL) {
            io_release(&a);
            return PyErr_NoMemory();
        }
        job->size_class = cap < (size_t)a.total ? PW_CLASSES : cls;  /* past the last class: never kept */
    }
    job->next = NULL;
    job->fd = a.fd;
    job->offset = a.offset;
    job->len = a.total;
    gather_pages(job->data, a.rb.buf, a.layers, a.npages, a.item, a.p.v, a.p.n);
    io_release(&a);
    if (!self->started && pw_start(self) < 0) {
        pthread_mutex_lock(&self->mu);
        if (!pw_keep(self, job)) {
            pthread_mutex_unlock(&self->mu);
            PyMem_RawFree(job);
        } else {
            pthread_mutex_unlock(&self->mu);
        }
        return NULL;
    }
    len = job->len;
    pthread_mutex_lock(&self->mu);
    if (self->pending > 0 && self->pending + len > self->max_pending) {
        /* mu let go before the GIL is, and taken again without it: a thread that holds the GIL
         * never waits for mu while its holder waits for the GIL */
        self->waits++;
        pthread_cond_signal(&self->work);  /* (pending may be under wake_bytes: a big job) */
        pthread_mutex_unlock(&self->mu);
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        while (self->pending > 0 && self->pending + len > self->max_pending) {
            pthread_cond_wait(&self->landed, &self->mu);
        }
        pw_enqueue(self, job);
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
    } else {
        pw_enqueue(self, job);
        pthread_mutex_unlock(&self->mu);
    }
    return PyLong_FromSsize_t(len);  /* (the job is the thread's now: it may be freed already) */
}

static PyObject *pw_failure(PageWriter *self, PyObject *Py_UNUSED(ignored));

/* Wait until no job covers [start, end) of fd (fd -1: every job); the failure or None. */
static PyObject *
pw_wait(PageWriter *self, int fd, int64_t start, int64_t end)
{
    pthread_mutex_lock(&self->mu);
    if (pw_covered(self, fd, start, end)) {
        self->waits++;
        pthread_cond_signal(&self->work);  /* queued below wake_bytes: the thread may be asleep */
        pthread_mutex_unlock(&self->mu);
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        while (pw_covered(self, fd, start, end)) {
            pthread_cond_wait(&self->landed, &self->mu);
        }
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
    } else {
        pthread_mutex_unlock(&self->mu);
    }
    return pw_failure(self, NULL);
}

PyDoc_STRVAR(pw_fence_doc,
"fence(fd=-1, start=0, end=2**63-1) -> None, or (fd, offset, errno) of the first failed write\n\n"
"Wait until no queued write covers bytes [start, end) of fd (fd -1: until every queued write\n"
"is done). The failure is kept: every later fence and put reports it.");

static PyObject *
pw_fence(PageWriter *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fd", "start", "end", NULL};
    long long fd = -1, start = 0, end = INT64_MAX;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|LLL:fence", kwlist, &fd, &start, &end)) {
        return NULL;
    }
    if (!self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "PageWriter not initialised");
        return NULL;
    }
    if (fd < -1 || fd > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "fence(fd): a descriptor or -1, got %lld", fd);
        return NULL;
    }
    if (!pw_mine(self)) Py_RETURN_NONE;  /* a forked child: no thread, nothing of its own queued */
    return pw_wait(self, (int)fd, (int64_t)start, (int64_t)end);
}

PyDoc_STRVAR(pw_failure_doc,
"failure() -> None, or (fd, offset, errno) of the first failed write (not waiting)");

static PyObject *
pw_failure(PageWriter *self, PyObject *Py_UNUSED(ignored))
{
    int fail, ffd;
    int64_t foff;

    if (!self->inited) Py_RETURN_NONE;
    pthread_mutex_lock(&self->mu);
    fail = self->fail_errno;
    ffd = self->fail_fd;
    foff = self->fail_offset;
    pthread_mutex_unlock(&self->mu);
    return pw_failure_tuple(fail, ffd, foff);
}

/* Stop the thread after its queue (a failure keeps dropping the rest) and join it. */
static void
pw_stop(PageWriter *self)
{
    if (!self->inited || !pw_mine(self)) return;
    pthread_mutex_lock(&self->mu);
    self->stop = 1;
    pthread_cond_signal(&self->work);
    pthread_mutex_unlock(&self->mu);
    if (self->started) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(self->thread, NULL);
        Py_END_ALLOW_THREADS
        self->started = 0;
    }
}

PyDoc_STRVAR(pw_close_doc,
"close() -> None, or (fd, offset, errno) of the first failed write\n\n"
"Write what is queued, stop the thread. A closed writer takes no put; close again is a no-op.");

static PyObject *
pw_close(PageWriter *self, PyObject *Py_UNUSED(ignored))
{
    pw_stop(self);
    return pw_failure(self, NULL);
}

PyDoc_STRVAR(pw_stats_doc,
"stats() -> dict: jobs and bytes written, jobs dropped after a failure, waits (puts and\n"
"fences that found the writes they needed not yet landed), pending bytes");

static PyObject *
pw_stats(PageWriter *self, PyObject *Py_UNUSED(ignored))
{
    long long jobs = 0, bytes = 0, dropped = 0, waits = 0, pending = 0;

    if (self->inited) {
        pthread_mutex_lock(&self->mu);
        jobs = self->jobs;
        bytes = self->bytes;
        dropped = self->dropped;
        waits = self->waits;
        pending = (long long)self->pending;
        pthread_mutex_unlock(&self->mu);
    }
    return Py_BuildValue("{sLsLsLsLsL}", "jobs", jobs, "bytes", bytes, "dropped", dropped, "waits", waits,
                         "pending", pending);
}

static void
pw_dealloc(PageWriter *self)
{
    pw_stop(self);
    /* jobs left (only in a forked child, whose copy has no thread): freed, never written */
    for (pw_job *j = self->head; j != NULL;) {
        pw_job *next = j->next;
        PyMem_RawFree(j);
        j = next;
    }
    self->head = self->tail = NULL;
    for (int c = 0; c < PW_CLASSES; c++) {
        for (pw_job *j = self->spare[c]; j != NULL;) {
            pw_job *next = j->next;
            PyMem_RawFree(j);
            j = next;
        }
        self->spare[c] = NULL;
    }
    if (self->inited && pw_mine(self)) {
        pthread_cond_destroy(&self->landed);
        pthread_cond_destroy(&self->work);
        pthread_mutex_destroy(&self->mu);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef pw_methods[] = {
    {"put", (PyCFunction)(void (*)(void))pw_put, METH_FASTCALL, pw_put_doc},
    {"fence", (PyCFunction)(void (*)(void))pw_fence, METH_VARARGS | METH_KEYWORDS, pw_fence_doc},
    {"failure", (PyCFunction)pw_failure, METH_NOARGS, pw_failure_doc},
    {"close", (PyCFunction)pw_close, METH_NOARGS, pw_close_doc},
    {"stats", (PyCFunction)pw_stats, METH_NOARGS, pw_stats_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(pw_doc,
"PageWriter(max_pending=16 MiB): the storage tier's page writes on a thread of their own\n\n"
"put() gathers a write's pages now and queues its pwrite; fence() waits for the writes that\n"
"cover a range (a read of it, a descriptor closed, the run's end); the first failed write is\n"
"kept and reported by every later put (OSError) and fence (its (fd, offset, errno)).");

PyTypeObject cp_PageWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.PageWriter",
    .tp_basicsize = sizeof(PageWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = pw_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pw_init,
    .tp_dealloc = (destructor)pw_dealloc,
    .tp_methods = pw_methods,
};

PyMethodDef cp_storage_io_methods[] = {
    {"pwrite_rows", (PyCFunction)(void (*)(void))cp_pwrite_rows, METH_FASTCALL, cp_pwrite_rows_doc},
    {"pread_rows", (PyCFunction)(void (*)(void))cp_pread_rows, METH_FASTCALL, cp_pread_rows_doc},
    {NULL, NULL, 0, NULL},
};
