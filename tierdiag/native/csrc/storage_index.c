/* StorageIndex: the storage tier's page index (engine/storage.py's _LruIndex is the reference). */
#include "cplane.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* StorageIndex: the storage tier's page index (storage._LruIndex is the reference and the     */
/* fallback). Key -> location (segment << 32 | slot, -1 while the page is being written) in    */
/* LRU order, and the live pages of each segment. One call a write does what was a Python loop  */
/* a page: touches, deletions of the oldest pages with their holes, the new keys' places.      */
/*                                                                                              */
/* Keys are exact ints (the engine's page keys, which name their whole prefix), bytes or str    */
/* (tests): hashing and comparing them never runs Python code, so no call here can see the      */
/* index change under it. An int key of int64 range is held as its value, any other key as its */
/* object (IxKey); a call takes its keys as a list or as a run of int64 (the engine's array('q') */
/* key runs: IxKeys), so the engine's page keys are looked up, entered and deleted without an   */
/* int object a key (one is made only for a key handed back). Entries live in one array linked into the LRU list (oldest first) and */
/* are found through an open-addressing table (linear probing, deletion by backward shift, kept */
/* at most half full). A table slot holds the entry number + 1 (0: empty) and a 32-bit tag of   */
/* the key's hash, whose top bits are its home (tables stay under 2**32 slots): a probe past    */
/* other keys, and the backward shift of a deletion, read the table alone. The tag is the hash */
/* (an int64 key's: its value) times the golden ratio, high half; the page keys of a hash_ids   */
/* trace are runs of consecutive ints, which the tag's low bits as homes spread unevenly (runs  */
/* of the table every probe and deletion walks), its top bits evenly (IX_HOME). A tier of       */
/* ~800k pages is tens of MB of entries and table, so every entry or key read is a cache miss;  */
/* admit() also prefetches the slots of the keys ahead, and the next victims' entries and table */
/* slots; the large arrays are mapped with huge pages (ix_big_alloc).                           */

typedef struct {
    int64_t key;       /* an int key's value (an int64); any other key's object is in `obj` */
    Py_hash_t hash;    /* -1: a free entry (no key hashes to -1) */
    int64_t loc;
    int32_t prev;      /* LRU neighbours (-1 at the ends); a free entry's next is the free list */
    int32_t next;      /* (entry numbers stay below IX_MAX_ENTRIES = 2**31 - 1) */
} IxEntry;

/* 32 bytes: an entry never straddles two cache lines (the array is 2 MiB-aligned once large,
 * PyMem's 16 bytes below that), where 40-byte entries straddled one in two. A full tier's
 * entries are read at random (a found key's, a victim's, each relink's two neighbours): every
 * straddling read was a second miss (issue 41, the storage row). */
_Static_assert(sizeof(IxEntry) == 32, "IxEntry is half a cache line");

typedef struct {
    PyObject_HEAD
    IxEntry *ent;
    PyObject **obj;                          /* NULL until a key that is not an int64 comes; then */
                                             /* ent_cap of them: entry e's key object, or NULL */
                                             /* (an int64 key: ent[e].key) */
    Py_ssize_t ent_cap, ent_top, free_head;  /* entries ever used: [0, ent_top) */
    uint64_t *table;                         /* IX_SLOT(e, hash); 0: empty */
    size_t mask;                             /* table size - 1 (a power of two, below 2**32) */
    unsigned shift;                          /* 32 - log2(table size): a tag's home is its top bits */
    Py_ssize_t len, head, tail;              /* head: the least recently used */
    int64_t *live;                           /* live pages of segment number n */
    Py_ssize_t live_cap;
    Py_ssize_t pending[512];                 /* the entries the last admit made, in order: */
    Py_ssize_t pending_n, pending_at;        /* place() finds its keys there without a probe */
    pthread_t populate;                      /* ix_populate's thread, while `populating` */
    pthread_mutex_t populate_mu;             /* (made with the thread) guards the two below */
    pthread_cond_t populate_cv;
    int populate_stop;                       /* the index goes: the thread stops */
    Py_ssize_t populate_used;                /* ent_top as last told (at each chunk's start) */
    int populating;
    pid_t populate_pid;                      /* the process that started it (a fork's child has no thread) */
    char *populate_at[2];                    /* the table's mapping, then the reserved entries' */
    size_t populate_len[2];
} StorageIndex;

#define IX_PENDING 512

/* A table slot: the hash's tag above, entry number + 1 below. */
#define IX_TAG(hash) ((uint32_t)(((uint64_t)(hash) * UINT64_C(0x9E3779B97F4A7C15)) >> 32))
#define IX_SLOT(e, hash) (((uint64_t)IX_TAG(hash) << 32) | (uint64_t)((e) + 1))
#define IX_SLOT_E(s) ((Py_ssize_t)((s) & 0xffffffffu) - 1)
#define IX_SLOT_TAG(s) ((uint32_t)((s) >> 32))
/* A tag's home in the table: its top log2(size) bits (Fibonacci hashing), not its low ones. The
 * engine's page keys are mostly runs of consecutive ints, whose tags (the int times the golden
 * ratio) spread evenly only in their top bits: homes taken from the low bits of the tag (bits
 * 32-52 of the product for a table of 2**21 slots) left a full tier's keys ~0.80 slots from home
 * on average and in clusters of ~3.5 slots, the top bits ~0.02 and ~1.4 (the whole-trace storage
 * replay's 781,250 keys; a probe and a deletion's backward shift walk these). */
#define IX_HOME(ix, tag) ((size_t)(tag) >> (ix)->shift)
#define IX_MAX_ENTRIES ((Py_ssize_t)0x7fffffff)  /* and tables of at most 2**32 slots */

/* 32 - log2(size) for a table of `size` slots (a power of two, 1 .. 2**32). */
static unsigned
ix_shift(size_t size)
{
    unsigned bits = 0;
    while (((size_t)1 << bits) < size) bits++;
    return 32 - bits;
}

#define IX_SLOT_BITS 32
#define IX_MAX_SEGMENT ((int64_t)1 << 31)

/* The table and the entries of a full tier are tens of MB read at random: with 4 KiB pages
 * nearly every probe, deletion and relink also misses the TLB (a page walk before the cache
 * miss). Arrays of 2 MiB or more are therefore anonymous mappings aligned to 2 MiB and marked
 * MADV_HUGEPAGE (this machine's transparent huge pages are "madvise": without the mark the
 * kernel never backs them with huge pages). Smaller ones, and systems without the calls, use
 * PyMem. Both come zeroed; the size (which the caller always knows: the table's slots, the
 * entries' capacity) picks the kind, so ix_big_free needs no record of it. */
#define IX_HUGE ((size_t)2 << 20)

static size_t
ix_big_len(size_t bytes)
{
    return (bytes + IX_HUGE - 1) & ~(IX_HUGE - 1);
}

static void *
ix_big_alloc(size_t bytes)
{
#if defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
    if (bytes >= IX_HUGE) {
        size_t len = ix_big_len(bytes), lead;
        char *p = mmap(NULL, len + IX_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        /* keep the 2 MiB-aligned len bytes inside, unmap the rest */
        lead = (IX_HUGE - ((uintptr_t)p & (IX_HUGE - 1))) & (IX_HUGE - 1);
        if (lead) munmap(p, lead);
        if (IX_HUGE - lead) munmap(p + lead + len, IX_HUGE - lead);
        p += lead;
        (void)madvise(p, len, MADV_HUGEPAGE);  /* advice: without it, ordinary pages */
        return p;
    }
#endif
    return PyMem_Calloc(1, bytes ? bytes : 1);
}

static void
ix_big_free(void *p, size_t bytes)
{
    if (p == NULL) return;
#if defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
    if (bytes >= IX_HUGE) {
        munmap(p, ix_big_len(bytes));
        return;
    }
#endif
    PyMem_Free(p);
}

/* ix_big_alloc of `bytes` holding the first `keep` bytes of `old` (of `old_bytes`), which goes. */
static void *
ix_big_grow(void *old, size_t old_bytes, size_t bytes, size_t keep)
{
    void *p = ix_big_alloc(bytes);
    if (p == NULL) return NULL;
    if (keep) memcpy(p, old, keep);
    ix_big_free(old, old_bytes);
    return p;
}

/* The reserved arrays' pages made resident on a thread of their own (ix_new). Every page of a
 * large mapping is the kernel's to zero on its first touch, a fault in the thread that touches
 * it: a full tier's table (touched everywhere from the first keys on) and its entries (taken in
 * order) are ~40 MB, which the engine's thread zeroed in its admits, on this VM (a Firecracker
 * guest: its memory backed by the host on first use) at well under a GB/s: ~0.05-0.1 s of a
 * whole-trace storage replay (issue 41's storage row). MADV_POPULATE_WRITE faults pages in as a
 * write would, without writing them: a page the engine touched first is left as it is, so the
 * thread never races the engine's writes; it changes no byte and no answer, only which thread
 * takes the faults. The table at once (a few keys touch all of its 2 MiB pages); the entries a
 * 2 MiB chunk ahead of the ones in use (a tier that never fills makes no more of them resident
 * than before, but that chunk): ix_insert tells the thread as its entries enter a new chunk.
 * ix_populate_end (the index's end, a growth past the reserve) stops and joins it before a
 * mapping it may be populating is unmapped. */
#define IX_POPULATE_MIN ((size_t)8 << 20)  /* smaller reserves are left to fault as they are used */
#define IX_CHUNK_ENTRIES ((Py_ssize_t)(IX_HUGE / sizeof(IxEntry)))

static void *
ix_populate(void *arg)
{
#ifdef MADV_POPULATE_WRITE
    StorageIndex *ix = arg;
    for (int k = 0; k < 2; k++) {
        for (size_t off = 0; off < ix->populate_len[k]; off += IX_HUGE) {
            size_t len = ix->populate_len[k] - off < IX_HUGE ? ix->populate_len[k] - off : IX_HUGE;
            int stop;
            pthread_mutex_lock(&ix->populate_mu);
            /* an entries' chunk once the one before it is in use (the first two at once) */
            while (!ix->populate_stop && k == 1 &&
                   ix->populate_used < (Py_ssize_t)(off / sizeof(IxEntry)) - IX_CHUNK_ENTRIES) {
                pthread_cond_wait(&ix->populate_cv, &ix->populate_mu);
            }
            stop = ix->populate_stop;
            pthread_mutex_unlock(&ix->populate_mu);
            if (stop || madvise(ix->populate_at[k] + off, len, MADV_POPULATE_WRITE) != 0) return NULL;  /* advice */
        }
    }
#else
    (void)arg;
#endif
    return NULL;
}

/* Start ix_populate for the index's mappings (their sizes, rounded as ix_big_alloc maps them),
 * every signal blocked in it; without it (a failed start) the pages fault as they are used. */
static void
ix_populate_start(StorageIndex *ix, size_t table_bytes, size_t ent_bytes)
{
#ifdef MADV_POPULATE_WRITE
    sigset_t all, old;
    pthread_attr_t attr;
    int err;
    if (table_bytes + ent_bytes < IX_POPULATE_MIN) return;
    ix->populate_at[0] = table_bytes >= IX_HUGE ? (char *)ix->table : NULL;
    ix->populate_len[0] = table_bytes >= IX_HUGE ? ix_big_len(table_bytes) : 0;
    ix->populate_at[1] = ent_bytes >= IX_HUGE ? (char *)ix->ent : NULL;
    ix->populate_len[1] = ent_bytes >= IX_HUGE ? ix_big_len(ent_bytes) : 0;
    if (pthread_mutex_init(&ix->populate_mu, NULL) != 0) return;
    if (pthread_cond_init(&ix->populate_cv, NULL) != 0) {
        pthread_mutex_destroy(&ix->populate_mu);
        return;
    }
    if (pthread_attr_init(&attr) == 0) {
        (void)pthread_attr_setstacksize(&attr, (size_t)64 << 10);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        err = pthread_create(&ix->populate, &attr, ix_populate, ix);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (err == 0) {
            ix->populating = 1;
            ix->populate_pid = getpid();
            return;
        }
    }
    pthread_cond_destroy(&ix->populate_cv);
    pthread_mutex_destroy(&ix->populate_mu);
#else
    (void)ix;
    (void)table_bytes;
    (void)ent_bytes;
#endif
}

/* ix_insert took entry `top` - 1 anew, the first of a chunk: the thread may populate the next.
 * (A forked child's copy has no thread, and its copy of the lock may have been taken by the
 * thread at the fork: it lets go of both without touching the lock.) */
static void
ix_populate_used(StorageIndex *ix, Py_ssize_t top)
{
    if (ix->populate_pid != getpid()) {
        ix->populating = 0;
        return;
    }
    pthread_mutex_lock(&ix->populate_mu);
    ix->populate_used = top;
    pthread_cond_signal(&ix->populate_cv);
    pthread_mutex_unlock(&ix->populate_mu);
}

/* Stop ix_populate and wait for it (at most its 2 MiB chunk in progress): before the index
 * unmaps a mapping it may be populating (its end, a growth past the reserve). */
static void
ix_populate_end(StorageIndex *ix)
{
    if (ix->populating) {
        ix->populating = 0;
        if (ix->populate_pid == getpid()) {  /* a forked child's copy has no thread (nor a usable lock) */
            pthread_mutex_lock(&ix->populate_mu);
            ix->populate_stop = 1;
            pthread_cond_signal(&ix->populate_cv);
            pthread_mutex_unlock(&ix->populate_mu);
            pthread_join(ix->populate, NULL);
            pthread_cond_destroy(&ix->populate_cv);
            pthread_mutex_destroy(&ix->populate_mu);
        }
    }
}

/* A key as the index holds it: an int of int64 range is its value (obj NULL), any other key
 * (a bigger int, bytes, str) its object (borrowed); with its hash: an object's, Python's
 * (PyObject_Hash), an int64 value's, the value itself (-1, the free entries' mark, made -2). An
 * int64 value and a key object are never the same key (an int of int64 range is always held as
 * its value), so the two kinds of hash need not agree: the hash only picks the table slot and
 * rules out most entries before a compare. (Python's long_hash, the value modulo 2**61 - 1
 * computed here, was ~15 instructions of every key looked up; the engine's page keys are below
 * 2**61 where it is the value anyway.) The engine's page keys are int64 values (array('q')
 * runs): they are looked up, entered and deleted as values, no int object made for them unless
 * one is handed back (`deleted`, keys(), segment_keys(), a KeyError). */
typedef struct {
    PyObject *obj;
    int64_t v;
    Py_hash_t hash;
} IxKey;

static inline Py_hash_t
ix_hash_i64(int64_t x)
{
    return x == -1 ? -2 : (Py_hash_t)x;
}

static void
ix_key_v(IxKey *k, int64_t v)
{
    k->obj = NULL;
    k->v = v;
    k->hash = ix_hash_i64(v);
}

/* `key` as an IxKey: 0, or -1 with TypeError set (a key neither an exact int, bytes nor str:
 * comparing those never runs Python code, so no call here can see the index change under it). */
static int
ix_key_load(PyObject *key, IxKey *k)
{
    if (PyLong_CheckExact(key)) {
        int64_t x;
        int overflow = 0;
        long long y;
        if (cp_small_int(key, &x)) {
            ix_key_v(k, x);
            return 0;
        }
        y = PyLong_AsLongLongAndOverflow(key, &overflow);  /* an exact int: no error but overflow */
        if (!overflow) {
            ix_key_v(k, (int64_t)y);
            return 0;
        }
    } else if (!PyBytes_CheckExact(key) && !PyUnicode_CheckExact(key)) {
        PyErr_Format(PyExc_TypeError, "storage keys are int, bytes or str, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    k->obj = key;
    k->v = 0;
    k->hash = PyObject_Hash(key);  /* an int past int64, bytes, str: cannot fail */
    return k->hash == -1 ? -1 : 0;
}

/* Whether two key objects (a big int, bytes, str) are equal; never runs Python code. */
static int
ix_same(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (Py_TYPE(a) != Py_TYPE(b)) {
        return 0;  /* keys of different types never compare equal */
    }
    if (PyLong_CheckExact(a)) {  /* int == int runs no Python code (and cannot fail) */
        return PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    }
    if (PyBytes_CheckExact(a)) {
        return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
               memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(a)) == 0;
    }
    /* str: equal iff the same kind, length and code units (PEP 393's canonical form) */
    return PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) && PyUnicode_KIND(a) == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b),
                  (size_t)PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a)) == 0;
}

/* Whether entry e (live or free) holds key k. */
static inline int
ix_entry_is(StorageIndex *ix, Py_ssize_t e, const IxKey *k)
{
    PyObject *o;
    if (ix->ent[e].hash != k->hash) return 0;  /* a free entry's hash is -1, no key's */
    o = ix->obj != NULL ? ix->obj[e] : NULL;
    if (k->obj == NULL) return o == NULL && ix->ent[e].key == k->v;
    return o != NULL && ix_same(o, k->obj);
}

/* Entry e's key as an object (a new reference; NULL: MemoryError). */
static PyObject *
ix_entry_key(StorageIndex *ix, Py_ssize_t e)
{
    if (ix->obj != NULL && ix->obj[e] != NULL) return Py_NewRef(ix->obj[e]);
    return PyLong_FromLongLong(ix->ent[e].key);
}

/* The table position of int64 key value `v` (hash `h`) in an index of int64 keys only (`obj`
 * NULL), or the empty one where it would go (*found 0): ix_probe's, its compare made by value. */
static inline __attribute__((always_inline)) size_t
ix_probe_value(const StorageIndex *ix, Py_hash_t h, int64_t v, int *found)
{
    uint32_t tag = IX_TAG(h);
    size_t i = IX_HOME(ix, tag);
    uint64_t s;
    while ((s = ix->table[i]) != 0) {
        if (IX_SLOT_TAG(s) == tag) {
            const IxEntry *x = &ix->ent[IX_SLOT_E(s)];
            if (x->hash == h && x->key == v) {
                *found = 1;
                return i;
            }
        }
        i = (i + 1) & ix->mask;
    }
    *found = 0;
    return i;
}

/* The table position holding `k`, or the empty one where it would go (*found 0). An int64 key in
 * an index of int64 keys only (the engine's: its reads' locations and touches, its writes'
 * placeholders, hit queries) is compared by value, no key object looked at. */
static inline __attribute__((always_inline)) size_t
ix_probe(StorageIndex *ix, const IxKey *k, int *found)
{
    uint32_t tag;
    size_t i;
    uint64_t s;
    if (k->obj == NULL && ix->obj == NULL) return ix_probe_value(ix, k->hash, k->v, found);
    tag = IX_TAG(k->hash);
    i = IX_HOME(ix, tag);
    while ((s = ix->table[i]) != 0) {
        if (IX_SLOT_TAG(s) == tag && ix_entry_is(ix, IX_SLOT_E(s), k)) {
            *found = 1;
            return i;
        }
        i = (i + 1) & ix->mask;
    }
    *found = 0;
    return i;
}

/* The entry of `k`, or -1. */
static inline __attribute__((always_inline)) Py_ssize_t
ix_find(StorageIndex *ix, const IxKey *k)
{
    int found;
    size_t i = ix_probe(ix, k, &found);
    return found ? IX_SLOT_E(ix->table[i]) : -1;
}

/* The entry of the object `key`, or -1 (-2: an error set: a key of another type). */
static Py_ssize_t
ix_find_obj(StorageIndex *ix, PyObject *key)
{
    IxKey k;
    if (ix_key_load(key, &k) < 0) return -2;
    return ix_find(ix, &k);
}

/* The keys a call names: a list (any keys), or a run of the engine's page keys, a 1-D
 * C-contiguous buffer of native int64 (its array('q') key runs, numpy int64 arrays), read in
 * place. The buffer is held for the call, so the run cannot change under it (nothing here runs
 * Python code). */
typedef struct {
    PyObject *list;      /* the list, or NULL: a run */
    const int64_t *v;    /* the run's values */
    Py_ssize_t n;
    Py_buffer buf;       /* the run's (released by ix_keys_release) */
} IxKeys;

/* 1 loaded, 0 an error set (neither a list nor an int64 run). */
static int
ix_keys_load(PyObject *obj, IxKeys *k)
{
    k->list = NULL;
    k->v = NULL;
    k->buf.obj = NULL;
    if (PyList_CheckExact(obj)) {
        k->list = obj;
        k->n = PyList_GET_SIZE(obj);
        return 1;
    }
    if (PyObject_CheckBuffer(obj) && PyObject_GetBuffer(obj, &k->buf, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
        if (k->buf.ndim == 1 && k->buf.itemsize == (Py_ssize_t)sizeof(int64_t) && is_int64_format(k->buf.format)) {
            k->v = (const int64_t *)k->buf.buf;
            k->n = k->buf.shape[0];
            return 1;
        }
        PyBuffer_Release(&k->buf);
        k->buf.obj = NULL;
    }
    PyErr_Clear();
    PyErr_SetString(PyExc_TypeError, "keys must be a list or a run of int64 (array('q'))");
    return 0;
}

static void
ix_keys_release(IxKeys *k)
{
    if (k->buf.obj != NULL) PyBuffer_Release(&k->buf);
}

/* Key i of a call's keys: 0, or -1 with an error set. */
static inline int
ix_keys_at(const IxKeys *k, Py_ssize_t i, IxKey *out)
{
    if (k->list) return ix_key_load(PyList_GET_ITEM(k->list, i), out);
    ix_key_v(out, k->v[i]);
    return 0;
}

/* KeyError(key); NULL. */
static PyObject *
ix_keyerror_key(const IxKey *k)
{
    PyObject *key = k->obj != NULL ? Py_NewRef(k->obj) : PyLong_FromLongLong(k->v);
    if (key != NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        Py_DECREF(key);
    }
    return NULL;
}

static void
ix_unlink(StorageIndex *ix, Py_ssize_t e)
{
    IxEntry *x = &ix->ent[e];
    if (x->prev >= 0) ix->ent[x->prev].next = x->next; else ix->head = x->next;
    if (x->next >= 0) ix->ent[x->next].prev = x->prev; else ix->tail = x->prev;
}

static void
ix_push_newest(StorageIndex *ix, Py_ssize_t e)
{
    IxEntry *x = &ix->ent[e];
    x->prev = (int32_t)ix->tail;
    x->next = -1;
    if (ix->tail >= 0) ix->ent[ix->tail].next = (int32_t)e; else ix->head = e;
    ix->tail = e;
}

static int
ix_rehash(StorageIndex *ix, size_t size)
{
    uint64_t *old = ix->table, *t;
    size_t old_size = ix->mask + 1, mask = size - 1;
    unsigned shift = ix_shift(size);
    ix_populate_end(ix);  /* the old table is unmapped below */
    if (size > ((size_t)1 << 32) || (t = ix_big_alloc(size * sizeof(uint64_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* from the old table's slots, in memory order (their tags are their homes) */
    for (size_t j = 0; j < old_size; j++) {
        uint64_t s = old[j];
        if (s != 0) {
            size_t i = (size_t)IX_SLOT_TAG(s) >> shift;
            while (t[i] != 0) i = (i + 1) & mask;
            t[i] = s;
        }
    }
    ix_big_free(old, old_size * sizeof(uint64_t));
    ix->table = t;
    ix->mask = mask;
    ix->shift = shift;
    return 0;
}

/* Add key k (not in the index; table position `at` from ix_probe) as the newest entry. */
static Py_ssize_t
ix_insert(StorageIndex *ix, const IxKey *k, size_t at, int64_t loc)
{
    Py_ssize_t e;
    if ((size_t)(ix->len + 1) * 2 > ix->mask + 1) {
        int found;
        if (ix_rehash(ix, (ix->mask + 1) * 2) < 0) return -1;
        at = ix_probe(ix, k, &found);
    }
    if (ix->free_head < 0 && ix->ent_top >= IX_MAX_ENTRIES) {
        PyErr_SetString(PyExc_MemoryError, "the storage index is full (2**31 - 1 pages)");
        return -1;
    }
    if (ix->free_head < 0 && ix->ent_top == ix->ent_cap) {
        Py_ssize_t cap = ix->ent_cap ? ix->ent_cap * 2 : 64;
        IxEntry *n;
        ix_populate_end(ix);  /* the old entries are unmapped below */
        if (ix->obj != NULL) {
            PyObject **o = PyMem_Realloc(ix->obj, (size_t)cap * sizeof(PyObject *));
            if (o == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memset(o + ix->ent_cap, 0, (size_t)(cap - ix->ent_cap) * sizeof(PyObject *));
            ix->obj = o;
        }
        n = ix_big_grow(ix->ent, (size_t)ix->ent_cap * sizeof(IxEntry), (size_t)cap * sizeof(IxEntry),
                        (size_t)ix->ent_top * sizeof(IxEntry));
        if (n == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        ix->ent = n;
        ix->ent_cap = cap;
    }
    if (k->obj != NULL && ix->obj == NULL) {  /* the first key that is not an int64 */
        if ((ix->obj = PyMem_Calloc((size_t)ix->ent_cap, sizeof(PyObject *))) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (ix->free_head >= 0) {
        e = ix->free_head;
        ix->free_head = ix->ent[e].next;
    } else {
        e = ix->ent_top++;
        if (ix->populating && e % IX_CHUNK_ENTRIES == 0) ix_populate_used(ix, ix->ent_top);
    }
    if (k->obj != NULL) ix->obj[e] = Py_NewRef(k->obj);
    ix->ent[e].key = k->v;
    ix->ent[e].hash = k->hash;
    ix->ent[e].loc = loc;
    ix->table[at] = IX_SLOT(e, k->hash);
    ix_push_newest(ix, e);
    ix->len++;
    return e;
}

/* Remove entry e from the table and the LRU list (its key object, if any, released).
 * Backward-shift deletion: no tombstones, so probes stay short. */
static void
ix_remove(StorageIndex *ix, Py_ssize_t e)
{
    size_t i = IX_HOME(ix, IX_TAG(ix->ent[e].hash)), j;
    uint64_t *t = ix->table;
    while (IX_SLOT_E(t[i]) != e) i = (i + 1) & ix->mask;
    t[i] = 0;
    for (j = (i + 1) & ix->mask; t[j] != 0; j = (j + 1) & ix->mask) {
        size_t home = IX_HOME(ix, IX_SLOT_TAG(t[j]));
        /* the entry at j may move back to i unless its home lies cyclically in (i, j] */
        if (((j - home) & ix->mask) >= ((j - i) & ix->mask)) {
            t[i] = t[j];
            t[j] = 0;
            i = j;
        }
    }
    ix_unlink(ix, e);
    ix->ent[e].hash = -1;
    if (ix->obj != NULL) Py_CLEAR(ix->obj[e]);
    ix->ent[e].next = (int32_t)ix->free_head;
    ix->free_head = e;
    ix->len--;
}

static int
ix_live_room(StorageIndex *ix, int64_t seg)
{
    if (seg < 0 || seg >= IX_MAX_SEGMENT) {
        PyErr_Format(PyExc_ValueError, "segment number %lld out of range", (long long)seg);
        return -1;
    }
    if (seg >= ix->live_cap) {
        Py_ssize_t cap = ix->live_cap ? ix->live_cap : 16;
        while (cap <= seg) cap *= 2;
        int64_t *n = PyMem_Realloc(ix->live, (size_t)cap * sizeof(int64_t));
        if (n == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(n + ix->live_cap, 0, (size_t)(cap - ix->live_cap) * sizeof(int64_t));
        ix->live = n;
        ix->live_cap = cap;
    }
    return 0;
}

/* StorageIndex(reserve): room made up front for `reserve` keys (the tier's capacity), at most
 * IX_RESERVE_MAX; past that the arrays grow by doubling as before. A full tier of ~800k pages
 * grew its table 17 times (each a rehash of every slot, read at random) and its entries 15
 * times (each a copy into a fresh mapping whose huge pages the kernel zeroes): ~4 % of a
 * whole-trace storage replay (issue 41's storage row). Reserved, the table is made once at its
 * final size and the entries' mapping is touched only as entries are used (in order: a free
 * entry is reused before a new one is taken). A tier that never fills still pays its table's
 * zeroing for the slots its keys land in (at most 2 * IX_RESERVE_MAX slots: 32 MiB). The
 * answers do not depend on the table's size: every walk is in LRU order, not table order. */
#define IX_RESERVE_MAX ((Py_ssize_t)1 << 21)

static PyObject *
ix_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"reserve", NULL};
    StorageIndex *ix;
    Py_ssize_t reserve = 0;
    size_t size = 16;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:StorageIndex", kwlist, &reserve)) return NULL;
    if (reserve < 0) {
        PyErr_Format(PyExc_ValueError, "StorageIndex(reserve): reserve must be >= 0, got %zd", reserve);
        return NULL;
    }
    if (reserve > IX_RESERVE_MAX) reserve = IX_RESERVE_MAX;
    while ((size_t)(reserve + 1) * 2 > size) size *= 2;  /* ix_insert's load bound, met up front */
    ix = (StorageIndex *)type->tp_alloc(type, 0);
    if (ix == NULL) return NULL;
    ix->free_head = ix->head = ix->tail = -1;
    ix->table = ix_big_alloc(size * sizeof(uint64_t));
    if (ix->table == NULL) {
        Py_DECREF(ix);
        return PyErr_NoMemory();
    }
    ix->mask = size - 1;
    ix->shift = ix_shift(size);
    if (reserve > 0) {
        /* the whole mapping as entries (a large one is rounded up to 2 MiB anyway) */
        size_t bytes = (size_t)reserve * sizeof(IxEntry);
        Py_ssize_t cap = bytes >= IX_HUGE ? (Py_ssize_t)(ix_big_len(bytes) / sizeof(IxEntry)) : reserve;
        if ((ix->ent = ix_big_alloc((size_t)cap * sizeof(IxEntry))) == NULL) {
            Py_DECREF(ix);
            return PyErr_NoMemory();
        }
        ix->ent_cap = cap;
    }
    ix_populate_start(ix, size * sizeof(uint64_t), (size_t)ix->ent_cap * sizeof(IxEntry));
    return (PyObject *)ix;
}

static void
ix_dealloc(StorageIndex *ix)
{
    ix_populate_end(ix);
    if (ix->obj != NULL) {
        for (Py_ssize_t e = 0; e < ix->ent_top; e++) {
            Py_XDECREF(ix->obj[e]);
        }
        PyMem_Free(ix->obj);
    }
    ix_big_free(ix->ent, (size_t)ix->ent_cap * sizeof(IxEntry));
    ix_big_free(ix->table, (ix->mask + 1) * sizeof(uint64_t));
    PyMem_Free(ix->live);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static Py_ssize_t
ix_len(StorageIndex *ix)
{
    return ix->len;
}

static int
ix_contains(StorageIndex *ix, PyObject *key)
{
    Py_ssize_t e = ix_find_obj(ix, key);
    return e == -2 ? -1 : e >= 0;
}

PyDoc_STRVAR(ix_touch_doc, "touch(key): make key the most recently used (KeyError if absent).");

static PyObject *
ix_touch(StorageIndex *ix, PyObject *key)
{
    Py_ssize_t e = ix_find_obj(ix, key);
    if (e == -2) return NULL;
    if (e < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    ix_unlink(ix, e);
    ix_push_newest(ix, e);
    Py_RETURN_NONE;
}

/* A deleted page (at `loc`: -1, never placed) no longer counted live in its segment, which is
 * named in `emptied` when that was its last live page. 0, or -1 with an error set (no memory). */
static inline int
ix_page_gone(StorageIndex *ix, int64_t loc, PyObject *emptied)
{
    if (loc >= 0 && --ix->live[loc >> IX_SLOT_BITS] == 0) {
        PyObject *s = PyLong_FromLongLong(loc >> IX_SLOT_BITS);
        if (s == NULL || PyList_Append(emptied, s) < 0) {
            Py_XDECREF(s);
            return -1;
        }
        Py_DECREF(s);
    }
    return 0;
}

/* admit()'s deletion of the oldest page to make room: the key handed back in `deleted` (not
 * `counted`), its segment named in `emptied` when its last live page went. 0, or -1 with an
 * error set (an empty index: OrderedDict.popitem's KeyError; no memory). */
static int
ix_delete_oldest(StorageIndex *ix, int counted, PyObject *deleted, PyObject *emptied)
{
    Py_ssize_t e = ix->head;
    int64_t loc;
    if (e < 0) {  /* OrderedDict.popitem on an empty index (capacity 0) */
        PyErr_SetString(PyExc_KeyError, "dictionary is empty");
        return -1;
    }
    {
        /* the next victim's entry was prefetched at this deletion's turn one before: its table
         * slot now (the deletion's one cache miss, the rest is in the line), and the entry of
         * the victim after it */
        Py_ssize_t nx = ix->ent[e].next;
        if (nx >= 0) {
            __builtin_prefetch(&ix->table[IX_HOME(ix, IX_TAG(ix->ent[nx].hash))]);
            if (ix->ent[nx].next >= 0) __builtin_prefetch(&ix->ent[ix->ent[nx].next]);
        }
    }
    loc = ix->ent[e].loc;
    if (!counted) {  /* the deleted key handed back: made an object only here */
        PyObject *old = ix_entry_key(ix, e);
        if (old == NULL || PyList_Append(deleted, old) < 0) {
            Py_XDECREF(old);
            return -1;
        }
        Py_DECREF(old);
    }
    ix_remove(ix, e);
    return ix_page_gone(ix, loc, emptied);
}

PyDoc_STRVAR(ix_admit_doc,
"admit(keys, capacity[, counted]) -> (deleted, fresh, emptied)\n\n"
"_LruIndex.admit: a key already there is touched; a new one first deletes the oldest pages\n"
"while the index holds `capacity`, then goes in as the newest with location -1. deleted: the\n"
"keys deleted, oldest first; fresh: the positions of keys still -1 at the end (None when no\n"
"more than capacity keys were all entered new at their turn: all of them, in order); emptied:\n"
"the segments whose last live page went, in that order. A key named twice is touched while it\n"
"is there, or entered anew when the write's own keys pushed it out; fresh names it once, at\n"
"the position that entered it last. counted true: deleted is how many keys were deleted (an\n"
"int), no list of them made (the engine only counts them). keys: a list, or an int64 run.");

/* How many keys ahead admit() prefetches the table slot of. */
#define IX_PREFETCH 8

/* The home slot of int64 key value `v` (the prefetches ahead of a key run's probes). */
static inline size_t
ix_home_v(const StorageIndex *ix, int64_t v)
{
    return IX_HOME(ix, IX_TAG(ix_hash_i64(v)));
}

/* admit()'s loop over an int64 key run into an index of int64 keys only (`obj` NULL) whose table
 * holds every key of the call without a rehash: the engine's writes (issue 41's storage row:
 * 2.0 M keys, 694k deletions on the whole conversation trace). Each key is touched, or entered
 * after the oldest pages are deleted while the index is full, into a freed entry or the next
 * unused one, as admit()'s generic loop does (the same entries, table slots, LRU order,
 * deletions, pending entries and positions), with the index's fields in locals (an entry's
 * store may alias them: each one was reloaded after every store), the probe compared by value,
 * a found key that is already the newest left where it is, and the deletion of the oldest page
 * (ix_delete_oldest + ix_remove) inlined: the victim is the list's head, and the empty slot a
 * new key goes to is the first one from its home once the shifts are done (it is absent).
 * Called first (no key entered yet: *nfresh_io 0, no pending entry), so the k-th new key's entry
 * is the k-th pending one. Returns the position it stopped at: n, or the first key that needs
 * the entries to grow
 * (nothing of its own done yet but the deletions, which the generic loop would have made
 * alike: it goes on from there), or -1 with an error set (the index consistent, as after the
 * keys before it and the deletions made). */
static Py_ssize_t
ix_admit_run(StorageIndex *ix, const int64_t *v, Py_ssize_t n, Py_ssize_t capacity, int counted,
             PyObject *deleted, PyObject *emptied, Py_ssize_t *pos, Py_ssize_t *nfresh_io,
             Py_ssize_t *ndeleted_io, int *all_new_io)
{
    IxEntry *const ent = ix->ent;
    uint64_t *const table = ix->table;
    const size_t mask = ix->mask;
    const unsigned shift = ix->shift;
    const Py_ssize_t top_max = ix->ent_cap < IX_MAX_ENTRIES ? ix->ent_cap : IX_MAX_ENTRIES;
    Py_ssize_t head = ix->head, tail = ix->tail, len = ix->len, free_head = ix->free_head, top = ix->ent_top;
    Py_ssize_t nfresh = *nfresh_io, ndeleted = *ndeleted_io, i;
    int all_new = *all_new_io, failed = 0;
    for (i = 0; i < n; i++) {
        const int64_t key = v[i];
        const Py_hash_t h = ix_hash_i64(key);
        const uint32_t tag = IX_TAG(h);
        size_t at = (size_t)tag >> shift;
        uint64_t s;
        Py_ssize_t e;
        IxEntry *x;
        if (i + IX_PREFETCH < n) __builtin_prefetch(&table[(size_t)IX_TAG(ix_hash_i64(v[i + IX_PREFETCH])) >> shift]);
        while ((s = table[at]) != 0) {
            if (IX_SLOT_TAG(s) == tag) {
                x = &ent[IX_SLOT_E(s)];
                if (x->hash == h && x->key == key) break;
            }
            at = (at + 1) & mask;
        }
        if (s != 0) {  /* there: touched (the newest already: it stays) */
            e = IX_SLOT_E(s);
            if (all_new) {  /* the keys before it were all entered new, in order: their positions */
                for (Py_ssize_t p = 0; p < nfresh; p++) pos[p] = p;
                all_new = 0;
            }
            if (e != tail) {  /* (so it has a next, and the list a tail) */
                x = &ent[e];
                if (x->prev >= 0) ent[x->prev].next = x->next; else head = x->next;
                ent[x->next].prev = x->prev;
                x->prev = (int32_t)tail;
                x->next = -1;
                ent[tail].next = (int32_t)e;
                tail = e;
            }
            continue;
        }
        if (len >= capacity) {
            while (len >= capacity) {  /* the oldest page deleted (ix_delete_oldest) */
                Py_ssize_t d = head, nx;
                size_t j, k;
                int64_t loc;
                if (d < 0) {  /* OrderedDict.popitem on an empty index (capacity 0) */
                    PyErr_SetString(PyExc_KeyError, "dictionary is empty");
                    failed = 1;
                    goto out;
                }
                x = &ent[d];
                nx = x->next;
                /* the next victim's entry was prefetched a deletion before: its table slot now,
                 * and the entry of the victim after it */
                if (nx >= 0) {
                    __builtin_prefetch(&table[(size_t)IX_TAG(ent[nx].hash) >> shift]);
                    if (ent[nx].next >= 0) __builtin_prefetch(&ent[ent[nx].next]);
                }
                loc = x->loc;
                if (!counted) {  /* the deleted key handed back: made an object only here */
                    PyObject *old = PyLong_FromLongLong(x->key);
                    if (old == NULL || PyList_Append(deleted, old) < 0) {
                        Py_XDECREF(old);
                        failed = 1;
                        goto out;
                    }
                    Py_DECREF(old);
                }
                /* ix_remove: its slot emptied by backward shift */
                j = (size_t)IX_TAG(x->hash) >> shift;
                while (IX_SLOT_E(table[j]) != d) j = (j + 1) & mask;
                table[j] = 0;
                for (k = (j + 1) & mask; (s = table[k]) != 0; k = (k + 1) & mask) {
                    size_t home = (size_t)IX_SLOT_TAG(s) >> shift;
                    if (((k - home) & mask) >= ((k - j) & mask)) {
                        table[j] = s;
                        table[k] = 0;
                        j = k;
                    }
                }
                head = nx;
                if (nx >= 0) ent[nx].prev = -1; else tail = -1;
                x->hash = -1;
                x->next = (int32_t)free_head;
                free_head = d;
                len--;
                ndeleted++;
                if (ix_page_gone(ix, loc, emptied) < 0) {
                    failed = 1;
                    goto out;
                }
            }
            at = (size_t)tag >> shift;  /* the table shifted: the first empty slot from home */
            while (table[at] != 0) at = (at + 1) & mask;
        }
        if (free_head >= 0) {
            e = free_head;
            free_head = ent[e].next;
        } else if (top < top_max) {
            e = top++;
            if (e % IX_CHUNK_ENTRIES == 0 && ix->populating) ix_populate_used(ix, top);
        } else {
            break;  /* the entries grow: ix_insert's, in the generic loop */
        }
        x = &ent[e];
        x->key = key;
        x->hash = h;
        x->loc = -1;
        x->prev = (int32_t)tail;
        x->next = -1;
        table[at] = IX_SLOT(e, h);
        if (tail >= 0) ent[tail].next = (int32_t)e; else head = e;
        tail = e;
        len++;
        if (nfresh < IX_PENDING) ix->pending[nfresh] = e;  /* (the k-th pending entry is the k-th new one) */
        if (!all_new) pos[nfresh] = i;  /* (while all are new, position k is the k-th: made if needed) */
        nfresh++;
    }
    if (all_new && i < n) {  /* the generic loop goes on: its positions are written */
        for (Py_ssize_t p = 0; p < nfresh; p++) pos[p] = p;
    }
out:
    ix->head = head;
    ix->tail = tail;
    ix->len = len;
    ix->free_head = free_head;
    ix->ent_top = top;
    ix->pending_n = nfresh < IX_PENDING ? nfresh : IX_PENDING;
    *nfresh_io = nfresh;
    *ndeleted_io = ndeleted;
    *all_new_io = all_new;
    return failed ? -1 : i;
}

/* admit() of keys loaded by the caller (who releases them): 0 with *deleted_out (a count when
 * `counted`, else the list), *fresh_out and *emptied_out made (new references), or -1 with an
 * error set and nothing made. */
static int
ix_admit_keys(StorageIndex *ix, IxKeys *kp, Py_ssize_t capacity, int counted,
              PyObject **deleted_out, PyObject **fresh_out, PyObject **emptied_out)
{
    PyObject *deleted = NULL, *fresh = NULL, *emptied = NULL;
    IxKeys keys = *kp;
    Py_ssize_t n, i, nfresh = 0, ndeleted = 0;
    /* a list's keys loaded up front (each checked before anything changes); a run's are read
     * in place as they come (an int64 value cannot fail to load) */
    IxKey small_ks[SMALL_LIST], *ks = small_ks;
    Py_ssize_t small_pos[SMALL_LIST], *pos = small_pos;  /* the positions entered new, in order */
    const int64_t *rv = keys.list == NULL ? keys.v : NULL;
    int all_new;
    n = keys.n;
    all_new = n <= capacity;
    if (n > SMALL_LIST) {
        ks = rv == NULL ? PyMem_Malloc((size_t)n * sizeof *ks) : NULL;
        pos = PyMem_Malloc((size_t)n * sizeof *pos);
        if ((ks == NULL && rv == NULL) || pos == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    if (rv == NULL) {
        for (i = 0; i < n; i++) {  /* every key checked before anything changes */
            if (ix_keys_at(&keys, i, &ks[i]) < 0) goto fail;
        }
    }
    for (i = 0; i < n && i < IX_PREFETCH; i++) {
        __builtin_prefetch(&ix->table[rv != NULL ? ix_home_v(ix, rv[i]) : IX_HOME(ix, IX_TAG(ks[i].hash))]);
    }
    ix->pending_n = ix->pending_at = 0;
    if ((!counted && (deleted = PyList_New(0)) == NULL) || (emptied = PyList_New(0)) == NULL) {
        goto fail;
    }
    i = 0;
    if (rv != NULL && ix->obj == NULL && (size_t)(ix->len + n) * 2 <= ix->mask + 1) {
        i = ix_admit_run(ix, rv, n, capacity, counted, deleted, emptied, pos, &nfresh, &ndeleted, &all_new);
        if (i < 0) goto fail;
    }
    for (; i < n; i++) {
        IxKey kv;
        const IxKey *k = &kv;
        int found;
        size_t at;
        if (rv != NULL) ix_key_v(&kv, rv[i]); else k = &ks[i];
        if (i + IX_PREFETCH < n) {
            __builtin_prefetch(&ix->table[rv != NULL ? ix_home_v(ix, rv[i + IX_PREFETCH])
                                                     : IX_HOME(ix, IX_TAG(ks[i + IX_PREFETCH].hash))]);
        }
        at = ix_probe(ix, k, &found);
        if (found) {
            Py_ssize_t e = IX_SLOT_E(ix->table[at]);
            ix_unlink(ix, e);
            ix_push_newest(ix, e);
            all_new = 0;
            continue;
        }
        if (ix->len >= capacity) {
            while (ix->len >= capacity) {
                if (ix_delete_oldest(ix, counted, deleted, emptied) < 0) goto fail;
                ndeleted++;
            }
            at = ix_probe(ix, k, &found);  /* the table shifted */
        }
        {
            Py_ssize_t e = ix_insert(ix, k, at, -1);
            if (e < 0) goto fail;
            if (ix->pending_n < IX_PENDING) ix->pending[ix->pending_n++] = e;
        }
        pos[nfresh++] = i;
    }
    if (all_new) {
        fresh = Py_NewRef(Py_None);
    } else {
        /* the positions whose key is still a placeholder, each key's last only: a page pushed
         * out again within this call is not written at its earlier position, even when the
         * key was entered again later (written twice, it was counted live twice). Walked from
         * the end, a key kept is marked (location -2) so its earlier positions are not, and
         * every mark is undone before returning. */
        Py_ssize_t nmarked = 0, nkept = 0;
        Py_ssize_t *marked = PyMem_Malloc((size_t)(nfresh ? nfresh : 1) * sizeof *marked);
        if (marked == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (i = nfresh - 1; i >= 0; i--) {
            IxKey kv;
            Py_ssize_t e;
            if (rv != NULL) ix_key_v(&kv, rv[pos[i]]);
            e = ix_find(ix, rv != NULL ? &kv : &ks[pos[i]]);
            if (e >= 0 && ix->ent[e].loc == -1) {
                ix->ent[e].loc = -2;
                marked[nmarked++] = e;
                pos[nfresh - 1 - nkept++] = pos[i];  /* kept, packed at the end in order */
            }
        }
        for (i = 0; i < nmarked; i++) ix->ent[marked[i]].loc = -1;
        PyMem_Free(marked);
        if ((fresh = PyList_New(nkept)) == NULL) goto fail;
        for (i = 0; i < nkept; i++) {
            PyObject *p = PyLong_FromSsize_t(pos[nfresh - nkept + i]);
            if (p == NULL) goto fail;
            PyList_SET_ITEM(fresh, i, p);
        }
    }
    if (counted && (deleted = PyLong_FromSsize_t(ndeleted)) == NULL) goto fail;
    if (ks != small_ks) PyMem_Free(ks);
    if (pos != small_pos) PyMem_Free(pos);
    *deleted_out = deleted;
    *fresh_out = fresh;
    *emptied_out = emptied;
    return 0;
fail:
    Py_XDECREF(deleted);
    Py_XDECREF(fresh);
    Py_XDECREF(emptied);
    if (ks != small_ks) PyMem_Free(ks);
    if (pos != small_pos) PyMem_Free(pos);
    return -1;
}

static PyObject *
ix_admit(StorageIndex *ix, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *deleted, *fresh, *emptied, *res;
    IxKeys keys;
    Py_ssize_t capacity;
    int counted = 0;
    if (nargs != 3 && wrong_nargs(nargs, 2, "admit() takes 2 or 3 arguments: keys, capacity[, counted]")) {
        return NULL;
    }
    if (nargs == 3 && (counted = PyObject_IsTrue(args[2])) < 0) return NULL;
    capacity = PyLong_AsSsize_t(args[1]);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    if (!ix_keys_load(args[0], &keys)) return NULL;
    if (ix_admit_keys(ix, &keys, capacity, counted, &deleted, &fresh, &emptied) < 0) {
        ix_keys_release(&keys);
        return NULL;
    }
    ix_keys_release(&keys);
    res = PyTuple_Pack(3, deleted, fresh, emptied);
    Py_DECREF(deleted);
    Py_DECREF(fresh);
    Py_DECREF(emptied);
    return res;
}

/* drop_placeholders() of loaded keys (nothing raised: an int64 run's keys cannot fail to load,
 * a list's loaded once already). */
static void
ix_drop_loaded(StorageIndex *ix, const IxKeys *keys)
{
    for (Py_ssize_t i = 0; i < keys->n; i++) {
        IxKey k;
        Py_ssize_t e;
        if (ix_keys_at(keys, i, &k) < 0) {
            PyErr_Clear();
            continue;
        }
        if ((e = ix_find(ix, &k)) >= 0 && ix->ent[e].loc == -1) {
            ix_remove(ix, e);
        }
    }
}

PyDoc_STRVAR(ix_admit_write_doc,
"admit_write(keys, capacity, writer, fd, offset, rows, slots, segment, first, room)\n"
"    -> (deleted, fresh, emptied, written)\n\n"
"A storage write's admit(keys, capacity, True), and, where every key went in new and in order\n"
"(fresh None) and they fit the active segment's `room`, its page write and place() in the same\n"
"call: writer.put(fd, offset, rows, slots), then the keys placed at slots first, first + 1, ...\n"
"of `segment` (the entries the admit just made, no probe). A mixed write (fresh a list: some\n"
"keys there before) of no more keys than `capacity` whose fresh keys fit `room` the same way:\n"
"writer.put(fd, offset, rows, [slots[i] for i in fresh]), the fresh keys placed in order.\n"
"written: put's answer (bytes queued), or -1 when nothing was written (no fresh key, more keys\n"
"than capacity, no room, slots too short or neither a list nor an int64 run, or put declined:\n"
"the caller writes and places as after admit()). A put that raises drops the keys'\n"
"placeholders first (the pages never reached the disk) and its error is raised.");

/* admit_write's page write of a mixed write (some keys there before, the rest entered new):
 * with no more keys than the capacity none of the write's own keys is pushed out by it, so the
 * positions `fresh` names are every key the admit entered, in the order of its pending entries.
 * Their slots picked (as `[slots[i] for i in fresh]`), writer.put(fd, offset, rows, picked), and
 * the pending entries placed at first, first + 1, ... of `seg`. Returns put's answer (>= 0), -1
 * when nothing was written and nothing changed (the caller goes the old way: a slot position
 * past the slots, slots neither a list nor an int64 run, put declined), -2 with an error set
 * (put raised: the write's placeholders dropped first). */
static Py_ssize_t
ix_write_mixed(StorageIndex *ix, const IxKeys *keys, PyObject *fresh, PyObject *const *args, int64_t seg,
               int64_t first)
{
    static PyObject *put_name = NULL;
    Py_ssize_t nf = PyList_GET_SIZE(fresh), got;
    PyObject *slots = args[6], *picked, *r;
    Ints sv;
    int loaded = 0;
    if (seg < 0 || seg >= IX_MAX_SEGMENT || ix_live_room(ix, seg) < 0) {
        PyErr_Clear();
        return -1;
    }
    if (!PyList_CheckExact(slots)) {
        loaded = ints_load(slots, &sv);
        if (loaded <= 0) {
            if (loaded < 0) PyErr_Clear();
            return -1;
        }
    }
    if ((picked = PyList_New(nf)) == NULL) {
        if (loaded) ints_free(&sv);
        PyErr_Clear();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyList_GET_ITEM(fresh, i));  /* (made by the admit: exact ints) */
        PyObject *slot;
        if (at < 0 || at >= (loaded ? sv.n : PyList_GET_SIZE(slots))) {
            slot = NULL;  /* the old way raises its IndexError */
        } else {
            slot = loaded ? PyLong_FromLongLong(sv.v[at]) : Py_NewRef(PyList_GET_ITEM(slots, at));
        }
        if (slot == NULL) {
            PyErr_Clear();
            Py_DECREF(picked);
            if (loaded) ints_free(&sv);
            return -1;
        }
        PyList_SET_ITEM(picked, i, slot);
    }
    if (loaded) ints_free(&sv);
    if (put_name == NULL && (put_name = PyUnicode_InternFromString("put")) == NULL) {
        Py_DECREF(picked);
        return -2;
    }
    {
        PyObject *call[5] = {args[2], args[3], args[4], args[5], picked};
        r = PyObject_VectorcallMethod(put_name, call, 5, NULL);
    }
    Py_DECREF(picked);
    got = r == NULL ? -1 : PyLong_AsSsize_t(r);
    Py_XDECREF(r);
    if (got == -1 && PyErr_Occurred()) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        ix_drop_loaded(ix, keys);  /* pages that never reached the disk are not in the tier */
        PyErr_Restore(type, value, tb);
        return -2;
    }
    if (got < 0) return -1;
    for (Py_ssize_t i = 0; i < nf; i++) {
        ix->ent[ix->pending[i]].loc = (seg << IX_SLOT_BITS) + first + i;
    }
    ix->live[seg] += nf;
    ix->pending_at = nf;
    return got;
}

static PyObject *
ix_admit_write(StorageIndex *ix, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *deleted, *fresh, *emptied, *res = NULL;
    IxKeys keys;
    Py_ssize_t capacity, room, n, got = -1;
    int64_t seg, first;
    if (wrong_nargs(nargs, 10, "admit_write() takes 10 arguments: keys, capacity, writer, fd, offset, rows, "
                               "slots, segment, first, room")) {
        return NULL;
    }
    capacity = PyLong_AsSsize_t(args[1]);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    seg = PyLong_AsLongLong(args[7]);
    if (seg == -1 && PyErr_Occurred()) return NULL;
    first = PyLong_AsLongLong(args[8]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    room = PyLong_AsSsize_t(args[9]);
    if (room == -1 && PyErr_Occurred()) return NULL;
    if (!ix_keys_load(args[0], &keys)) return NULL;
    n = keys.n;
    /* checked before anything changes: a place() that would fail is not attempted */
    if (n > 0 && n <= room && n <= IX_PENDING && (first < 0 || first + n > ((int64_t)1 << IX_SLOT_BITS))) {
        PyErr_SetString(PyExc_ValueError, "slot out of range");
        ix_keys_release(&keys);
        return NULL;
    }
    if (n > 0 && n <= room && n <= IX_PENDING && ix_live_room(ix, seg) < 0) {
        ix_keys_release(&keys);
        return NULL;
    }
    if (ix_admit_keys(ix, &keys, capacity, 1, &deleted, &fresh, &emptied) < 0) {
        ix_keys_release(&keys);
        return NULL;
    }
    if (fresh == Py_None && n > 0 && n <= room && n <= IX_PENDING && ix->pending_n == n) {
        static PyObject *put_name = NULL;
        PyObject *call[5] = {args[2], args[3], args[4], args[5], args[6]};
        PyObject *r;
        if (put_name == NULL && (put_name = PyUnicode_InternFromString("put")) == NULL) goto fail;
        r = PyObject_VectorcallMethod(put_name, call, 5, NULL);
        if (r == NULL) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            ix_drop_loaded(ix, &keys);  /* pages that never reached the disk are not in the tier */
            PyErr_Restore(type, value, tb);
            goto fail;
        }
        got = PyLong_AsSsize_t(r);
        Py_DECREF(r);
        if (got == -1 && PyErr_Occurred()) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            ix_drop_loaded(ix, &keys);
            PyErr_Restore(type, value, tb);
            goto fail;
        }
        if (got >= 0) {
            /* place(): the admit's entries are the keys', in order (all entered new) */
            for (Py_ssize_t i = 0; i < n; i++) {
                ix->ent[ix->pending[i]].loc = (seg << IX_SLOT_BITS) + first + i;
            }
            ix->live[seg] += n;
            ix->pending_at = n;
        }
    }
    else if (fresh != Py_None && n <= capacity && ix->pending_n == PyList_GET_SIZE(fresh) && ix->pending_n > 0 &&
             ix->pending_n <= room && first >= 0 && first + ix->pending_n <= ((int64_t)1 << IX_SLOT_BITS)) {
        if ((got = ix_write_mixed(ix, &keys, fresh, args, seg, first)) == -2) goto fail;
    }
    {
        PyObject *w = PyLong_FromSsize_t(got < 0 ? -1 : got);
        if (w == NULL) goto fail;
        res = PyTuple_Pack(4, deleted, fresh, emptied, w);
        Py_DECREF(w);
    }
fail:
    Py_DECREF(deleted);
    Py_DECREF(fresh);
    Py_DECREF(emptied);
    ix_keys_release(&keys);
    return res;
}

PyDoc_STRVAR(ix_place_doc,
"place(keys, segment, first)\n\n"
"The pages of `keys` (all in the index) went to slots first, first + 1, ... of `segment`: set\n"
"their locations (their LRU places stay) and count them live there.");

static PyObject *
ix_place(StorageIndex *ix, PyObject *const *args, Py_ssize_t nargs)
{
    IxKeys keys;
    int64_t seg, first;
    Py_ssize_t n, i;
    PyObject *res = NULL;
    if (wrong_nargs(nargs, 3, "place() takes 3 arguments: keys, segment, first")) {
        return NULL;
    }
    seg = PyLong_AsLongLong(args[1]);
    if (seg == -1 && PyErr_Occurred()) return NULL;
    first = PyLong_AsLongLong(args[2]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    if (!ix_keys_load(args[0], &keys)) return NULL;
    n = keys.n;
    if (first < 0 || first + n > ((int64_t)1 << IX_SLOT_BITS)) {
        PyErr_SetString(PyExc_ValueError, "slot out of range");
        goto done;
    }
    if (ix_live_room(ix, seg) < 0) goto done;
    for (i = 0; i < n; i++) {
        IxKey k;
        Py_ssize_t e = -1, p;
        if (ix_keys_at(&keys, i, &k) < 0) goto done;
        /* the common case: the keys of the last admit, in its order (an entry made then and
         * still holding this key: the index holds a key once; a free entry holds none) */
        while (ix->pending_at < ix->pending_n) {
            p = ix->pending[ix->pending_at++];
            if (ix_entry_is(ix, p, &k)) {
                e = p;
                break;
            }
        }
        if (e < 0 && (e = ix_find(ix, &k)) < 0) {
            ix_keyerror_key(&k);
            goto done;
        }
        ix->ent[e].loc = (seg << IX_SLOT_BITS) + first + i;
        ix->live[seg]++;
    }
    res = Py_NewRef(Py_None);
done:
    ix_keys_release(&keys);
    return res;
}

PyDoc_STRVAR(ix_drop_placeholders_doc,
"drop_placeholders(keys): delete those of `keys` still at location -1 (pages never written).");

static PyObject *
ix_drop_placeholders(StorageIndex *ix, PyObject *arg)
{
    IxKeys keys;
    if (!ix_keys_load(arg, &keys)) return NULL;
    for (Py_ssize_t i = 0; i < keys.n; i++) {
        IxKey k;
        Py_ssize_t e;
        if (ix_keys_at(&keys, i, &k) < 0) {
            ix_keys_release(&keys);
            return NULL;
        }
        if ((e = ix_find(ix, &k)) >= 0 && ix->ent[e].loc == -1) {
            ix_remove(ix, e);
        }
    }
    ix_keys_release(&keys);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ix_locs_doc, "locs(keys) -> [location, ...] (KeyError for a key not there; nothing is touched).");

static PyObject *
ix_locs(StorageIndex *ix, PyObject *arg)
{
    IxKeys keys;
    PyObject *out;
    if (!ix_keys_load(arg, &keys)) return NULL;
    if ((out = PyList_New(keys.n)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < keys.n; i++) {
        IxKey k;
        PyObject *loc;
        Py_ssize_t e;
        if (ix_keys_at(&keys, i, &k) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        if ((e = ix_find(ix, &k)) < 0) {
            ix_keyerror_key(&k);
            Py_CLEAR(out);
            goto done;
        }
        if ((loc = PyLong_FromLongLong(ix->ent[e].loc)) == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, loc);
    }
done:
    ix_keys_release(&keys);
    return out;
}

PyDoc_STRVAR(ix_loc_runs_doc,
"loc_runs(keys) -> [first, count, first, count, ...]\n\n"
"locs(keys) as runs: the keys in order, a run while each location is the one before + 1 in the\n"
"same segment (pages adjacent in a file: one read), each run its first location and how many\n"
"keys it spans. KeyError for a key not there; nothing is touched.");

static PyObject *
ix_loc_runs(StorageIndex *ix, PyObject *arg)
{
    IxKeys keys;
    PyObject *out = NULL;
    int64_t small[2 * SMALL_LIST], *runs = small;
    Py_ssize_t nruns = 0;
    if (!ix_keys_load(arg, &keys)) return NULL;
    if (keys.n > SMALL_LIST && (runs = PyMem_Malloc((size_t)keys.n * 2 * sizeof *runs)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < keys.n; i++) {
        IxKey k;
        Py_ssize_t e;
        int64_t loc;
        if (keys.v != NULL && i + IX_PREFETCH < keys.n) {
            __builtin_prefetch(&ix->table[IX_HOME(ix, IX_TAG(ix_hash_i64(keys.v[i + IX_PREFETCH])))]);
        }
        if (ix_keys_at(&keys, i, &k) < 0) goto done;
        if ((e = ix_find(ix, &k)) < 0) {
            ix_keyerror_key(&k);
            goto done;
        }
        loc = ix->ent[e].loc;
        if (nruns > 0) {
            int64_t last = runs[2 * nruns - 2] + runs[2 * nruns - 1] - 1;
            if (loc == last + 1 && (loc >> IX_SLOT_BITS) == (last >> IX_SLOT_BITS)) {
                runs[2 * nruns - 1]++;
                continue;
            }
        }
        runs[2 * nruns] = loc;
        runs[2 * nruns + 1] = 1;
        nruns++;
    }
    if ((out = PyList_New(2 * nruns)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < 2 * nruns; i++) {
        PyObject *v = PyLong_FromLongLong(runs[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, v);
    }
done:
    if (runs != small) PyMem_Free(runs);
    ix_keys_release(&keys);
    return out;
}

PyDoc_STRVAR(ix_touch_all_doc, "touch_all(keys): touch(key) for each key in order.");

static PyObject *
ix_touch_all(StorageIndex *ix, PyObject *arg)
{
    IxKeys keys;
    if (!ix_keys_load(arg, &keys)) return NULL;
    for (Py_ssize_t i = 0; i < keys.n; i++) {
        IxKey k;
        Py_ssize_t e;
        if (ix_keys_at(&keys, i, &k) < 0 || (e = ix_find(ix, &k)) < 0) {
            if (!PyErr_Occurred()) ix_keyerror_key(&k);
            ix_keys_release(&keys);
            return NULL;
        }
        if (e != ix->tail) {  /* (the newest already: it stays) */
            ix_unlink(ix, e);
            ix_push_newest(ix, e);
        }
    }
    ix_keys_release(&keys);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ix_run_doc,
"run(keys, start) -> n: how many of keys[start:] are in the index before the first that is not.");

static PyObject *
ix_run(StorageIndex *ix, PyObject *const *args, Py_ssize_t nargs)
{
    IxKeys keys;
    Py_ssize_t start, i;
    if (wrong_nargs(nargs, 2, "run() takes 2 arguments: keys, start")) {
        return NULL;
    }
    start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "start must be >= 0");
        return NULL;
    }
    /* an int64 run read in place (no buffer exported and released: ~150 instructions of each of
     * the ~100k hit queries of a storage replay, issue 41 session 38); no Python code runs
     * while its items are read */
    keys.list = NULL;
    keys.buf.obj = NULL;
    if (!run_items(args[0], &keys.v, &keys.n) && !ix_keys_load(args[0], &keys)) return NULL;
    if (keys.list == NULL && ix->obj == NULL) {  /* the engine's: its run probed by value */
        for (i = start; i < keys.n; i++) {
            int found;
            (void)ix_probe_value(ix, ix_hash_i64(keys.v[i]), keys.v[i], &found);
            if (!found) break;
        }
        ix_keys_release(&keys);
        return PyLong_FromSsize_t(i - start > 0 ? i - start : 0);
    }
    for (i = start; i < keys.n; i++) {
        IxKey k;
        if (ix_keys_at(&keys, i, &k) < 0) {
            ix_keys_release(&keys);
            return NULL;
        }
        if (ix_find(ix, &k) < 0) break;
    }
    ix_keys_release(&keys);
    return PyLong_FromSsize_t(i - start > 0 ? i - start : 0);
}

static int
ix_segment(PyObject *arg, int64_t *seg)
{
    *seg = PyLong_AsLongLong(arg);
    return !(*seg == -1 && PyErr_Occurred());
}

PyDoc_STRVAR(ix_live_doc, "live(segment) -> the pages of `segment` still in the index.");

static PyObject *
ix_live(StorageIndex *ix, PyObject *arg)
{
    int64_t seg;
    if (!ix_segment(arg, &seg)) return NULL;
    return PyLong_FromLongLong(seg >= 0 && seg < ix->live_cap ? ix->live[seg] : 0);
}

PyDoc_STRVAR(ix_clear_live_doc, "clear_live(segment): count no live page in `segment` (its pages went elsewhere).");

static PyObject *
ix_clear_live(StorageIndex *ix, PyObject *arg)
{
    int64_t seg;
    if (!ix_segment(arg, &seg)) return NULL;
    if (seg >= 0 && seg < ix->live_cap) ix->live[seg] = 0;
    Py_RETURN_NONE;
}

static int
ix_cmp_loc(const void *a, const void *b)
{
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

PyDoc_STRVAR(ix_segment_keys_doc,
"segment_keys(segment) -> (slots, keys): the pages of `segment` in the index, in slot order.");

static PyObject *
ix_segment_keys(StorageIndex *ix, PyObject *arg)
{
    int64_t seg, (*pairs)[2];
    Py_ssize_t n = 0, e, i;
    PyObject *slots = NULL, *keys = NULL, *res = NULL;
    if (!ix_segment(arg, &seg)) return NULL;
    pairs = PyMem_Malloc((size_t)(ix->len ? ix->len : 1) * sizeof *pairs);
    if (pairs == NULL) return PyErr_NoMemory();
    for (e = ix->head; e >= 0; e = ix->ent[e].next) {  /* a scan: compaction is rare */
        if (ix->ent[e].loc >= 0 && ix->ent[e].loc >> IX_SLOT_BITS == seg) {
            pairs[n][0] = ix->ent[e].loc;
            pairs[n][1] = e;
            n++;
        }
    }
    qsort(pairs, (size_t)n, sizeof *pairs, ix_cmp_loc);
    if ((slots = PyList_New(n)) == NULL || (keys = PyList_New(n)) == NULL) goto done;
    for (i = 0; i < n; i++) {
        PyObject *s = PyLong_FromLongLong(pairs[i][0] & (((int64_t)1 << IX_SLOT_BITS) - 1)), *k;
        if (s == NULL) goto done;
        PyList_SET_ITEM(slots, i, s);
        if ((k = ix_entry_key(ix, (Py_ssize_t)pairs[i][1])) == NULL) goto done;
        PyList_SET_ITEM(keys, i, k);
    }
    res = PyTuple_Pack(2, slots, keys);
done:
    PyMem_Free(pairs);
    Py_XDECREF(slots);
    Py_XDECREF(keys);
    return res;
}

PyDoc_STRVAR(ix_keys_doc, "keys() -> the keys, least recently used first.");

static PyObject *
ix_keys(StorageIndex *ix, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(ix->len);
    Py_ssize_t i = 0;
    if (out == NULL) return NULL;
    for (Py_ssize_t e = ix->head; e >= 0; e = ix->ent[e].next) {
        PyObject *k = ix_entry_key(ix, e);
        if (k == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i++, k);
    }
    return out;
}

static PyMethodDef ix_methods[] = {
    {"touch", (PyCFunction)ix_touch, METH_O, ix_touch_doc},
    {"admit", (PyCFunction)(void (*)(void))ix_admit, METH_FASTCALL, ix_admit_doc},
    {"admit_write", (PyCFunction)(void (*)(void))ix_admit_write, METH_FASTCALL, ix_admit_write_doc},
    {"place", (PyCFunction)(void (*)(void))ix_place, METH_FASTCALL, ix_place_doc},
    {"drop_placeholders", (PyCFunction)ix_drop_placeholders, METH_O, ix_drop_placeholders_doc},
    {"locs", (PyCFunction)ix_locs, METH_O, ix_locs_doc},
    {"loc_runs", (PyCFunction)ix_loc_runs, METH_O, ix_loc_runs_doc},
    {"touch_all", (PyCFunction)ix_touch_all, METH_O, ix_touch_all_doc},
    {"run", (PyCFunction)(void (*)(void))ix_run, METH_FASTCALL, ix_run_doc},
    {"live", (PyCFunction)ix_live, METH_O, ix_live_doc},
    {"clear_live", (PyCFunction)ix_clear_live, METH_O, ix_clear_live_doc},
    {"segment_keys", (PyCFunction)ix_segment_keys, METH_O, ix_segment_keys_doc},
    {"keys", (PyCFunction)ix_keys, METH_NOARGS, ix_keys_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods ix_as_sequence = {
    .sq_length = (lenfunc)ix_len,
    .sq_contains = (objobjproc)ix_contains,
};

PyTypeObject cp_StorageIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tierdiag.native._cplane.StorageIndex",
    .tp_doc = PyDoc_STR("StorageIndex(reserve=0): the storage tier's page index in LRU order\n"
                        "(storage._LruIndex's methods, compiled); room for `reserve` keys (the tier's\n"
                        "capacity, at most 2**21) is made up front."),
    .tp_basicsize = sizeof(StorageIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = ix_new,
    .tp_dealloc = (destructor)ix_dealloc,
    .tp_as_sequence = &ix_as_sequence,
    .tp_methods = ix_methods,
};

