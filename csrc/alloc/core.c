/* The compiled core of anychip's caching allocator (anychip/runtime/allocator.py).
 *
 * It holds the data structures and the operations on them: blocks (Block),
 * free lists ordered by size (FreeList), the statistics (stats.h), the cached
 * malloc / free pair, which never calls back into Python, and the storage and
 * lifetime of anychip.Buffer (BufferBase), so that an alloc + free through a
 * Buffer runs no Python code beyond Device.alloc's checks. Everything
 * else (new segments, events, cross-stream moves, out-of-memory, empty_cache,
 * configuration) is the Python subclass's, reached through `_malloc_slow` and
 * `_free_slow` and the underscore methods below, which are the same functions
 * the cached path uses: there is one implementation of each operation.
 *
 * Thread safety: the cached path runs under the GIL without releasing it and
 * without running Python code, so it is atomic. The Python side sets `_busy`
 * while it holds its lock and works on the structures; the cached path then
 * steps aside to the slow path, which waits for the lock (or, for a finalizer
 * that must not block, queues the block on `_deferred`). New Block objects are
 * made before any structure is touched (`spare`), because making an object may
 * run the garbage collector and with it finalizers that free buffers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "stats.h"

#define MIN_BLOCK_SIZE 512LL
#define SMALL_SIZE (1LL << 20)
#define LARGE_BUFFER (20LL << 20)
#define NDIVS 16          /* roundup_power2_divisions intervals */
#define NSPARE 16         /* Block objects kept for reuse */
#define MAX_SIZE (1LL << 62)

enum { ST_FREE, ST_ALLOCATED, ST_PENDING, ST_ZERO };

typedef struct FreeList FreeList;

typedef struct Block {
    PyObject_HEAD
    PyObject *handle;           /* the raw segment */
    PyObject *stream;           /* stream token it was allocated on */
    PyObject *mig;              /* cross-stream move that marked it (Python object) or NULL */
    PyObject *uses;             /* set of extra streams (record_stream) or NULL */
    struct Block *prev, *next;  /* address neighbours in the segment */
    FreeList *fl;               /* FREE: the list it is in (NULL: merged away or out);
                                   otherwise the list it returns to */
    void *core;                 /* the allocator that made it (identity only) */
    Py_ssize_t offset, size, requested, npend;
    Py_ssize_t idx;             /* FREE and in a list: its index in its size bucket */
    int state;
} Block;

typedef struct {
    Py_ssize_t size;
    Block **items;              /* a stack: the last freed is taken first */
    Py_ssize_t n, cap;
} Bucket;

struct FreeList {
    PyObject_HEAD
    Bucket *buckets;            /* one per size, sorted by size; some may be empty */
    Py_ssize_t nb, capb, nempty, nblocks;
    PyObject *stream;
    PyObject *mig;              /* outstanding cross-stream move away from this list, or None */
    char small, retired;
};

typedef struct {
    PyObject_HEAD
    PyObject *lists[2];         /* [large, small]: dict stream -> FreeList */
    FreeList *any[2];           /* [large, small]: free blocks whose streams' work is done */
    PyObject *deferred;         /* blocks freed by finalizers while busy */
    DeviceStats stats;
    long long max_split;
    long long divs[NDIVS];
    int has_divs, busy;
    int cached_path;            /* 0: malloc / free always take the slow path (no caching) */
    Py_ssize_t npending;
    Block *spare[NSPARE];
    int nspare;
} Core;

static PyTypeObject Block_Type, FreeList_Type, Core_Type;
static PyObject *str_malloc_slow, *str_free_slow, *any_token;

#define Block_Check(o) (Py_TYPE(o) == &Block_Type)

/* ---------------------------------------------------------------- blocks */

static void set_link(Block **slot, Block *v)
{
    Block *old = *slot;
    Py_XINCREF(v);
    *slot = v;
    Py_XDECREF(old);
}

static void set_list(Block *b, FreeList *fl)
{
    FreeList *old = b->fl;
    Py_XINCREF(fl);
    b->fl = fl;
    Py_XDECREF(old);
}

static int Block_traverse(Block *b, visitproc visit, void *arg)
{
    Py_VISIT(b->handle);
    Py_VISIT(b->stream);
    Py_VISIT(b->mig);
    Py_VISIT(b->uses);
    Py_VISIT(b->prev);
    Py_VISIT(b->next);
    Py_VISIT(b->fl);
    return 0;
}

static int Block_clear(Block *b)
{
    Py_CLEAR(b->handle);
    Py_CLEAR(b->stream);
    Py_CLEAR(b->mig);
    Py_CLEAR(b->uses);
    Py_CLEAR(b->prev);
    Py_CLEAR(b->next);
    Py_CLEAR(b->fl);
    return 0;
}

static void Block_dealloc(Block *b)
{
    PyObject_GC_UnTrack(b);
    Py_TRASHCAN_BEGIN(b, Block_dealloc)
    Block_clear(b);
    PyObject_GC_Del(b);
    Py_TRASHCAN_END
}

static int refill_spare(Core *self)
{
    while (self->nspare < 2) {
        Block *b = PyObject_GC_New(Block, &Block_Type);
        if (b == NULL)
            return -1;
        b->handle = b->stream = b->mig = b->uses = NULL;
        b->prev = b->next = NULL;
        b->fl = NULL;
        PyObject_GC_Track(b);
        self->spare[self->nspare++] = b;
    }
    return 0;
}

/* A new block (a new reference); its fields are set, links empty, state FREE. */
static Block *block_new(Core *self, PyObject *handle, Py_ssize_t offset, Py_ssize_t size, PyObject *stream,
                        FreeList *fl)
{
    if (self->nspare == 0 && refill_spare(self) < 0)
        return NULL;
    Block *b = self->spare[--self->nspare];
    Py_INCREF(handle);
    b->handle = handle;
    Py_INCREF(stream);
    b->stream = stream;
    set_list(b, fl);
    b->core = self;
    b->offset = offset;
    b->size = size;
    b->requested = 0;
    b->npend = 0;
    b->idx = -1;
    b->state = ST_FREE;
    return b;
}

/* Drop a block merged away (the caller's reference); kept for reuse when nothing else holds it. */
static void block_dead(Core *self, Block *b)
{
    set_link(&b->prev, NULL);
    set_link(&b->next, NULL);
    set_list(b, NULL);
    Py_CLEAR(b->mig);
    if (Py_REFCNT(b) == 1 && self->nspare < NSPARE) {
        Py_CLEAR(b->handle);
        Py_CLEAR(b->stream);
        Py_CLEAR(b->uses);
        self->spare[self->nspare++] = b;
    } else {
        Py_DECREF(b);
    }
}

/* ------------------------------------------------------------ free lists */

/* The free blocks of a list sit in buckets of one size each (a stack: last freed,
 * first out), over an array of buckets sorted by size: an exact fit is a binary
 * search and a pop, a block leaves its bucket by swapping with the last. Empty
 * buckets stay (they are reused by the next block of that size) until there are
 * more empty than used ones. */

/* Index of the first bucket of at least `size` bytes. */
static Py_ssize_t fl_lower(FreeList *fl, Py_ssize_t size)
{
    Py_ssize_t lo = 0, hi = fl->nb;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (fl->buckets[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int grow(void **items, Py_ssize_t *cap, Py_ssize_t need, size_t item_size)
{
    if (need <= *cap)
        return 0;
    Py_ssize_t n = *cap ? 2 * *cap : 8;
    void *p = PyMem_Realloc(*items, n * item_size);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *items = p;
    *cap = n;
    return 0;
}

static void fl_compact(FreeList *fl)
{
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < fl->nb; i++) {
        if (fl->buckets[i].n == 0)
            PyMem_Free(fl->buckets[i].items);
        else
            fl->buckets[j++] = fl->buckets[i];
    }
    fl->nb = j;
    fl->nempty = 0;
}

static int fl_add(FreeList *fl, Block *b)
{
    Py_ssize_t i = fl_lower(fl, b->size);
    if (i == fl->nb || fl->buckets[i].size != b->size) {
        if (grow((void **)&fl->buckets, &fl->capb, fl->nb + 1, sizeof(Bucket)) < 0)
            return -1;
        memmove(fl->buckets + i + 1, fl->buckets + i, (fl->nb - i) * sizeof(Bucket));
        fl->buckets[i] = (Bucket){.size = b->size};
        fl->nb++;
        fl->nempty++;
    }
    Bucket *bk = &fl->buckets[i];
    if (grow((void **)&bk->items, &bk->cap, bk->n + 1, sizeof(Block *)) < 0)
        return -1;
    if (bk->n == 0)
        fl->nempty--;
    Py_INCREF(b);
    b->idx = bk->n;
    bk->items[bk->n++] = b;
    fl->nblocks++;
    set_list(b, fl);
    return 0;
}

/* Take the block at `idx` out of bucket i; the list's reference passes to the caller. */
static Block *fl_take(FreeList *fl, Py_ssize_t i, Py_ssize_t idx)
{
    Bucket *bk = &fl->buckets[i];
    Block *b = bk->items[idx], *last = bk->items[--bk->n];
    bk->items[idx] = last;
    last->idx = idx;
    b->idx = -1;
    fl->nblocks--;
    if (bk->n == 0 && ++fl->nempty > 16 && fl->nempty > fl->nb - fl->nempty)
        fl_compact(fl);
    return b;
}

static void fl_remove(Block *b)
{
    FreeList *fl = b->fl;
    Py_ssize_t i = fl_lower(fl, b->size);
    assert(i < fl->nb && fl->buckets[i].size == b->size && fl->buckets[i].items[b->idx] == b);
    fl_take(fl, i, b->idx);
    Py_DECREF(b);               /* the list's reference; the caller holds its own */
}

/* Best fit for `size` in fl (taken out: a new reference), or NULL. Blocks of
 * max_split_size or more serve only requests of at least max_split_size that
 * waste less than LARGE_BUFFER (as PyTorch). */
static Block *fl_find(Core *self, FreeList *fl, long long size)
{
    Py_ssize_t i = fl_lower(fl, (Py_ssize_t)size);
    while (i < fl->nb && fl->buckets[i].n == 0)
        i++;
    if (i == fl->nb)
        return NULL;
    long long bsize = fl->buckets[i].size, ms = self->max_split;
    if (bsize >= ms && (size < ms || bsize >= size + LARGE_BUFFER))
        return NULL;
    return fl_take(fl, i, fl->buckets[i].n - 1);
}

/* ------------------------------------------------------- core operations */

static long long round_size(const long long *divs, long long n)
{
    if (n < MIN_BLOCK_SIZE)
        return MIN_BLOCK_SIZE;
    if (divs != NULL) {
        int bits = 64 - __builtin_clzll((unsigned long long)n);
        int idx = bits - 21;
        idx = idx < 0 ? 0 : (idx > NDIVS - 1 ? NDIVS - 1 : idx);
        long long d = divs[idx];
        if (d > 1 && n > MIN_BLOCK_SIZE * d) {
            if ((n & (n - 1)) == 0)
                return n;
            long long step = (1LL << (bits - 1)) / d;
            return (n + step - 1) / step * step;
        }
    }
    return (n + MIN_BLOCK_SIZE - 1) & -MIN_BLOCK_SIZE;
}

/* Best fit on fl's stream: its own list first, then the blocks of no stream. */
static Block *lookup(Core *self, FreeList *fl, long long size)
{
    Block *b = fl_find(self, fl, size);
    return b != NULL ? b : fl_find(self, self->any[fl->small != 0], size);
}

/* Hand out b (out of any list; a new segment or a block just found) for
 * `nbytes` on fl's stream, split when the rest is worth keeping (the rest stays
 * in the list b came from). Returns b (the caller's reference). */
static Block *take(Core *self, FreeList *fl, Block *b, long long nbytes, long long size)
{
    DeviceStats *st = &self->stats;
    int small = fl->small, was_split = b->prev != NULL || b->next != NULL;
    long long bsize = b->size, rest = bsize - size;
    if (rest >= (small ? MIN_BLOCK_SIZE : SMALL_SIZE + 1) && size < self->max_split) {
        Block *r = block_new(self, b->handle, b->offset + size, rest, b->stream, NULL);
        if (r == NULL)
            return NULL;
        set_link(&r->prev, b);
        set_link(&r->next, b->next);
        if (b->next != NULL)
            set_link(&b->next->prev, r);
        set_link(&b->next, r);
        b->size = size;
        int rc = fl_add(b->fl, r);
        Py_DECREF(r);
        if (rc < 0)
            return NULL;
        if (was_split) {
            update_stat_array(st, K_INACTIVE_SPLIT_BYTES, small, -size);
        } else {
            update_stat_array(st, K_INACTIVE_SPLIT_BYTES, small, rest);
            update_stat_array(st, K_INACTIVE_SPLIT, small, 1);
        }
    } else {
        size = bsize;
        if (was_split) {
            update_stat_array(st, K_INACTIVE_SPLIT_BYTES, small, -bsize);
            update_stat_array(st, K_INACTIVE_SPLIT, small, -1);
        }
    }
    b->state = ST_ALLOCATED;
    b->requested = nbytes;
    Py_CLEAR(b->mig);
    set_list(b, fl);
    Py_INCREF(fl->stream);
    Py_SETREF(b->stream, fl->stream);
    update_stat_array(st, K_ALLOCATED_BYTES, small, size);
    update_stat_array(st, K_REQUESTED_BYTES, small, nbytes);
    update_stat_array(st, K_ALLOCATION, small, 1);
    update_stat_array(st, K_ACTIVE_BYTES, small, size);
    update_stat_array(st, K_ACTIVE, small, 1);
    return b;
}

/* Put the free block b (in no list) into fl, merged with its free neighbours
 * in fl. `counted`: b is already counted as an inactive split block. */
static int insert_free(Core *self, Block *b, FreeList *fl, int counted)
{
    long long d_cnt = 0, d_bytes = 0;
    if (counted) {
        d_cnt = -1;
        d_bytes = -b->size;
    }
    Py_INCREF(b);
    Block *p = b->prev;
    if (p != NULL && p->state == ST_FREE && p->fl == fl) {
        Py_INCREF(p);
        fl_remove(p);
        d_cnt--;
        d_bytes -= p->size;
        p->size += b->size;
        set_link(&p->next, b->next);
        if (b->next != NULL)
            set_link(&b->next->prev, p);
        Py_CLEAR(p->mig);
        block_dead(self, b);       /* the caller still holds b: it is not reused */
        b = p;
    }
    Block *n = b->next;
    if (n != NULL && n->state == ST_FREE && n->fl == fl) {
        Py_INCREF(n);
        fl_remove(n);
        d_cnt--;
        d_bytes -= n->size;
        b->size += n->size;
        set_link(&b->next, n->next);
        if (b->next != NULL)
            set_link(&b->next->prev, b);
        block_dead(self, n);
    }
    if (b->prev != NULL || b->next != NULL) {
        d_cnt++;
        d_bytes += b->size;
    }
    int rc = fl_add(fl, b);
    Py_DECREF(b);
    update_stat_array(&self->stats, K_INACTIVE_SPLIT_BYTES, fl->small, d_bytes);
    update_stat_array(&self->stats, K_INACTIVE_SPLIT, fl->small, d_cnt);
    return rc;
}

static inline int block_small(Block *b)
{
    return b->fl != NULL ? b->fl->small : b->size <= SMALL_SIZE;
}

/* An allocated block is no longer allocated (it may still be active, waiting for events). */
static void unallocate(Core *self, Block *b)
{
    int small = block_small(b);
    b->state = ST_PENDING;
    update_stat_array(&self->stats, K_ALLOCATED_BYTES, small, -b->size);
    update_stat_array(&self->stats, K_REQUESTED_BYTES, small, -b->requested);
    update_stat_array(&self->stats, K_ALLOCATION, small, -1);
}

/* A block that is neither allocated nor waiting any more: free, into fl (NULL: no list). */
static int release(Core *self, Block *b, FreeList *fl, int small)
{
    b->state = ST_FREE;
    update_stat_array(&self->stats, K_ACTIVE_BYTES, small, -b->size);
    update_stat_array(&self->stats, K_ACTIVE, small, -1);
    return fl != NULL ? insert_free(self, b, fl, 0) : 0;
}

/* ------------------------------------------------------- the Python face */

static PyObject *stream_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Py_ssize_t pos,
                            const char *name, PyObject *dflt)
{
    if (nargs > pos)
        return args[pos];
    if (kwnames != NULL)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), name) == 0)
                return args[nargs + i];
    return dflt;
}

/* malloc: the cached path, or the Python slow path (a new reference) */
static PyObject *core_malloc(Core *self, PyObject *nbytes, PyObject *stream)
{
    if (self->cached_path && !self->busy && !self->npending && PyList_GET_SIZE(self->deferred) == 0
        && PyLong_CheckExact(nbytes)
        && (self->nspare > 0 || refill_spare(self) == 0)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(nbytes, &overflow);
        if (n > 0 && n < MAX_SIZE) {
            long long size = round_size(self->has_divs ? self->divs : NULL, n);
            PyObject *fl = PyDict_GetItemWithError(self->lists[size <= SMALL_SIZE], stream);
            if (fl != NULL && !((FreeList *)fl)->retired) {
                Block *b = lookup(self, (FreeList *)fl, size);
                if (b != NULL)
                    return (PyObject *)take(self, (FreeList *)fl, b, n, size);
            }
        }
        PyErr_Clear();
    }
    return PyObject_CallMethodObjArgs((PyObject *)self, str_malloc_slow, nbytes, stream, NULL);
}

/* free: the cached path, or the Python slow path */
static PyObject *core_free(Core *self, PyObject *block, PyObject *explicit)
{
    Block *b = (Block *)block;
    if (self->cached_path && !self->busy && Block_Check(b) && b->core == (void *)self && b->state == ST_ALLOCATED && b->uses == NULL
        && b->fl != NULL && !b->fl->retired) {
        unallocate(self, b);
        if (release(self, b, b->fl, b->fl->small) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return PyObject_CallMethodObjArgs((PyObject *)self, str_free_slow, block, explicit, NULL);
}

static PyObject *Core_malloc(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "malloc(nbytes, stream=None)");
        return NULL;
    }
    return core_malloc(self, args[0], stream_arg(args, nargs, kwnames, 1, "stream", Py_None));
}

static PyObject *Core_free(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "free(block, explicit=True)");
        return NULL;
    }
    return core_free(self, args[0], stream_arg(args, nargs, kwnames, 1, "explicit", Py_True));
}

static PyObject *Core_buffer(Core *self, PyObject *const *args, Py_ssize_t nargs);

static int check_block(PyObject *o)
{
    if (!Block_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "expected a Block");
        return -1;
    }
    return 0;
}

static int check_list(PyObject *o)
{
    if (Py_TYPE(o) != &FreeList_Type) {
        PyErr_SetString(PyExc_TypeError, "expected a FreeList");
        return -1;
    }
    return 0;
}

/* _lookup(fl, size) -> Block | None: best fit on fl's stream (own list, then no stream's) */
static PyObject *Core_lookup(Core *self, PyObject *args)
{
    PyObject *fl;
    long long size;
    if (!PyArg_ParseTuple(args, "OL", &fl, &size) || check_list(fl) < 0)
        return NULL;
    Block *b = lookup(self, (FreeList *)fl, size);
    if (b == NULL)
        Py_RETURN_NONE;
    return (PyObject *)b;
}

/* _take(fl, block, nbytes, size) -> block: hand out a block out of every list */
static PyObject *Core_take(Core *self, PyObject *args)
{
    PyObject *fl, *b;
    long long nbytes, size;
    if (!PyArg_ParseTuple(args, "OOLL", &fl, &b, &nbytes, &size) || check_list(fl) < 0 || check_block(b) < 0)
        return NULL;
    Py_INCREF(b);
    if (take(self, (FreeList *)fl, (Block *)b, nbytes, size) == NULL) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

/* _insert_free(block, fl, counted): put a free block out of every list into fl, merged */
static PyObject *Core_insert_free(Core *self, PyObject *args)
{
    PyObject *b, *fl;
    int counted;
    if (!PyArg_ParseTuple(args, "OOp", &b, &fl, &counted) || check_block(b) < 0 || check_list(fl) < 0)
        return NULL;
    ((Block *)b)->state = ST_FREE;
    if (insert_free(self, (Block *)b, (FreeList *)fl, counted) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* _unlist(block): take a free block out of its list (its statistics unchanged) */
static PyObject *Core_unlist(Core *self, PyObject *b)
{
    if (check_block(b) < 0)
        return NULL;
    Block *blk = (Block *)b;
    if (blk->state != ST_FREE || blk->fl == NULL) {
        PyErr_SetString(PyExc_ValueError, "_unlist: the block is in no free list");
        return NULL;
    }
    fl_remove(blk);
    set_list(blk, NULL);
    Py_RETURN_NONE;
}

/* _owns(block) -> bool: made by this allocator */
static PyObject *Core_owns(Core *self, PyObject *b)
{
    return PyBool_FromLong(Block_Check(b) && ((Block *)b)->core == (void *)self);
}

/* _unallocate(block): an allocated block stops counting as allocated (still active) */
static PyObject *Core_unallocate(Core *self, PyObject *b)
{
    if (check_block(b) < 0)
        return NULL;
    unallocate(self, (Block *)b);
    Py_RETURN_NONE;
}

/* _release(block, fl, small): stops counting as active; free into fl (None: into no list) */
static PyObject *Core_release(Core *self, PyObject *args)
{
    PyObject *b, *fl;
    int small;
    if (!PyArg_ParseTuple(args, "OOp", &b, &fl, &small) || check_block(b) < 0)
        return NULL;
    if (fl != Py_None && check_list(fl) < 0)
        return NULL;
    if (release(self, (Block *)b, fl == Py_None ? NULL : (FreeList *)fl, small) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* _new_block(handle, offset, size, stream, fl_or_None) -> a free Block in no list */
static PyObject *Core_new_block(Core *self, PyObject *args)
{
    PyObject *handle, *stream, *fl;
    Py_ssize_t offset, size;
    if (!PyArg_ParseTuple(args, "OnnOO", &handle, &offset, &size, &stream, &fl))
        return NULL;
    if (fl != Py_None && check_list(fl) < 0)
        return NULL;
    return (PyObject *)block_new(self, handle, offset, size, stream, fl == Py_None ? NULL : (FreeList *)fl);
}

/* _stat(kind, small, delta): change one statistic of a pool (and of "all") */
static PyObject *Core_stat(Core *self, PyObject *args)
{
    int kind, small;
    long long delta;
    if (!PyArg_ParseTuple(args, "ipL", &kind, &small, &delta))
        return NULL;
    if (kind < 0 || kind >= NKIND) {
        PyErr_SetString(PyExc_ValueError, "_stat: no such statistic");
        return NULL;
    }
    update_stat_array(&self->stats, kind, small, delta);
    Py_RETURN_NONE;
}

/* _stat_values() -> (current, peak, allocated, freed) for each kind, then pool (all, small, large) */
static PyObject *Core_stat_values(Core *self, PyObject *unused)
{
    PyObject *out = PyTuple_New(NKIND * NPOOL * 4);
    if (out == NULL)
        return NULL;
    Py_ssize_t i = 0;
    for (int k = 0; k < NKIND; k++)
        for (int p = 0; p < NPOOL; p++) {
            Stat *s = &self->stats.kind[k][p];
            long long v[4] = {s->current, s->peak, s->allocated, s->freed};
            for (int j = 0; j < 4; j++) {
                PyObject *x = PyLong_FromLongLong(v[j]);
                if (x == NULL) {
                    Py_DECREF(out);
                    return NULL;
                }
                PyTuple_SET_ITEM(out, i++, x);
            }
        }
    return out;
}

static PyObject *Core_reset_peaks(Core *self, PyObject *unused)
{
    reset_peaks(&self->stats);
    Py_RETURN_NONE;
}

static PyObject *Core_reset_accumulated(Core *self, PyObject *unused)
{
    reset_accumulated(&self->stats);
    Py_RETURN_NONE;
}

/* _configure(max_split, divisions_or_None) */
static PyObject *Core_configure(Core *self, PyObject *args)
{
    long long max_split;
    PyObject *divs;
    if (!PyArg_ParseTuple(args, "LO", &max_split, &divs))
        return NULL;
    self->max_split = max_split;
    self->has_divs = 0;
    if (divs != Py_None) {
        PyObject *seq = PySequence_Fast(divs, "divisions must be a sequence");
        if (seq == NULL)
            return NULL;
        if (PySequence_Fast_GET_SIZE(seq) != NDIVS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "divisions must have %d entries", NDIVS);
            return NULL;
        }
        for (int i = 0; i < NDIVS; i++)
            self->divs[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        Py_DECREF(seq);
        if (PyErr_Occurred())
            return NULL;
        self->has_divs = 1;
    }
    Py_RETURN_NONE;
}

/* _round(nbytes) -> the block size that serves a request of nbytes (>= 1) */
static PyObject *Core_round(Core *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(round_size(self->has_divs ? self->divs : NULL, n));
}

static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->max_split = MAX_SIZE;
    self->cached_path = 1;
    for (int small = 0; small < 2; small++) {
        self->lists[small] = PyDict_New();
        self->any[small] = (FreeList *)PyObject_CallFunction((PyObject *)&FreeList_Type, "Oi", any_token, small);
        if (self->lists[small] == NULL || self->any[small] == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    self->deferred = PyList_New(0);
    if (self->deferred == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Core_traverse(Core *self, visitproc visit, void *arg)
{
    for (int i = 0; i < 2; i++) {
        Py_VISIT(self->lists[i]);
        Py_VISIT(self->any[i]);
    }
    Py_VISIT(self->deferred);
    for (int i = 0; i < self->nspare; i++)
        Py_VISIT(self->spare[i]);
    return 0;
}

static int Core_clear(Core *self)
{
    for (int i = 0; i < 2; i++) {
        Py_CLEAR(self->lists[i]);
        Py_CLEAR(self->any[i]);
    }
    Py_CLEAR(self->deferred);
    while (self->nspare > 0) {     /* (Py_CLEAR names its argument twice: no side effects in it) */
        self->nspare--;
        Py_CLEAR(self->spare[self->nspare]);
    }
    return 0;
}

static void Core_dealloc(Core *self)
{
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Core_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))Core_malloc, METH_FASTCALL | METH_KEYWORDS,
     "malloc(nbytes, stream=None) -> Block: a block of at least nbytes bytes usable on stream"},
    {"free", (PyCFunction)(void (*)(void))Core_free, METH_FASTCALL | METH_KEYWORDS,
     "free(block, explicit=True): return block (reused at once on its stream); explicit=False (a finalizer) "
     "never blocks"},
    {"buffer", (PyCFunction)(void (*)(void))Core_buffer, METH_FASTCALL,
     "buffer(device, nbytes, stream) -> Buffer: malloc(nbytes, stream) wrapped in a Buffer of device"},
    {"_lookup", (PyCFunction)Core_lookup, METH_VARARGS, NULL},
    {"_take", (PyCFunction)Core_take, METH_VARARGS, NULL},
    {"_insert_free", (PyCFunction)Core_insert_free, METH_VARARGS, NULL},
    {"_unlist", (PyCFunction)Core_unlist, METH_O, NULL},
    {"_unallocate", (PyCFunction)Core_unallocate, METH_O, NULL},
    {"_owns", (PyCFunction)Core_owns, METH_O, NULL},
    {"_release", (PyCFunction)Core_release, METH_VARARGS, NULL},
    {"_new_block", (PyCFunction)Core_new_block, METH_VARARGS, NULL},
    {"_stat", (PyCFunction)Core_stat, METH_VARARGS, NULL},
    {"_stat_values", (PyCFunction)Core_stat_values, METH_NOARGS, NULL},
    {"_reset_peaks", (PyCFunction)Core_reset_peaks, METH_NOARGS, NULL},
    {"_reset_accumulated", (PyCFunction)Core_reset_accumulated, METH_NOARGS, NULL},
    {"_configure", (PyCFunction)Core_configure, METH_VARARGS, NULL},
    {"_round", (PyCFunction)Core_round, METH_O, NULL},
    {NULL},
};

static PyMemberDef Core_members[] = {
    {"_busy", T_INT, offsetof(Core, busy), 0, NULL},
    {"_cached_path", T_INT, offsetof(Core, cached_path), 0, NULL},
    {"_npending", T_PYSSIZET, offsetof(Core, npending), 0, NULL},
    {"_deferred", T_OBJECT, offsetof(Core, deferred), READONLY, NULL},
    {"_large", T_OBJECT, offsetof(Core, lists[0]), READONLY, NULL},
    {"_small", T_OBJECT, offsetof(Core, lists[1]), READONLY, NULL},
    {"_any_large", T_OBJECT, offsetof(Core, any[0]), READONLY, NULL},
    {"_any_small", T_OBJECT, offsetof(Core, any[1]), READONLY, NULL},
    {NULL},
};

static PyTypeObject Core_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "anychip._lib._alloc.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Free lists, blocks and statistics of one caching allocator, and its cached malloc / free.",
    .tp_new = Core_new,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
};

/* ----------------------------------------------------------- Block type */

static PyObject *Block_repr(Block *b)
{
    return PyUnicode_FromFormat("Block(handle=%R, offset=%zd, size=%zd, requested=%zd, stream=%R)",
                                b->handle ? b->handle : Py_None, b->offset, b->size, b->requested,
                                b->stream ? b->stream : Py_None);
}

static PyObject *get_ptr(PyObject *p)
{
    return Py_NewRef(p != NULL ? p : Py_None);
}

static PyObject *Block_get_prev(Block *b, void *u) { return get_ptr((PyObject *)b->prev); }
static PyObject *Block_get_next(Block *b, void *u) { return get_ptr((PyObject *)b->next); }
static PyObject *Block_get_fl(Block *b, void *u) { return get_ptr((PyObject *)b->fl); }
static PyObject *Block_get_handle(Block *b, void *u) { return get_ptr(b->handle); }
static PyObject *Block_get_stream(Block *b, void *u) { return get_ptr(b->stream); }
static PyObject *Block_get_mig(Block *b, void *u) { return get_ptr(b->mig); }
static PyObject *Block_get_uses(Block *b, void *u) { return get_ptr(b->uses); }

static int set_obj(PyObject **slot, PyObject *v)
{
    Py_XINCREF(v == Py_None ? NULL : v);
    PyObject *old = *slot;
    *slot = v == Py_None ? NULL : v;
    Py_XDECREF(old);
    return 0;
}

static int Block_set_mig(Block *b, PyObject *v, void *u) { return set_obj(&b->mig, v); }
static int Block_set_uses(Block *b, PyObject *v, void *u) { return set_obj(&b->uses, v); }

static int Block_set_state(Block *b, PyObject *v, void *u)
{
    long s = v != NULL ? PyLong_AsLong(v) : -1;
    if (s < ST_FREE || s > ST_ZERO) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bad block state");
        return -1;
    }
    b->state = (int)s;
    return 0;
}

static PyObject *Block_get_state(Block *b, void *u) { return PyLong_FromLong(b->state); }

static PyGetSetDef Block_getset[] = {
    {"handle", (getter)Block_get_handle, NULL, "the raw segment (backend handle)", NULL},
    {"stream", (getter)Block_get_stream, NULL, "the stream token it was allocated on", NULL},
    {"prev", (getter)Block_get_prev, NULL, "address neighbour before it in the segment", NULL},
    {"next", (getter)Block_get_next, NULL, "address neighbour after it in the segment", NULL},
    {"_fl", (getter)Block_get_fl, NULL, NULL, NULL},
    {"_mig", (getter)Block_get_mig, (setter)Block_set_mig, NULL, NULL},
    {"_uses", (getter)Block_get_uses, (setter)Block_set_uses, NULL, NULL},
    {"_state", (getter)Block_get_state, (setter)Block_set_state, NULL, NULL},
    {NULL},
};

static PyMemberDef Block_members[] = {
    {"offset", T_PYSSIZET, offsetof(Block, offset), READONLY, "byte offset in the segment"},
    {"size", T_PYSSIZET, offsetof(Block, size), READONLY, "bytes the block spans (the request rounded)"},
    {"requested", T_PYSSIZET, offsetof(Block, requested), READONLY, "bytes the caller asked for"},
    {"_npend", T_PYSSIZET, offsetof(Block, npend), 0, NULL},
    {NULL},
};

static PyObject *Block_new_error(PyTypeObject *t, PyObject *a, PyObject *k)
{
    PyErr_SetString(PyExc_TypeError, "Blocks are made by an allocator's malloc()");
    return NULL;
}

static PyTypeObject Block_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "anychip.runtime.allocator.Block",
    .tp_basicsize = sizeof(Block),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A range [offset, offset + size) of the raw segment `handle`, made by an allocator.",
    .tp_new = Block_new_error,
    .tp_dealloc = (destructor)Block_dealloc,
    .tp_traverse = (traverseproc)Block_traverse,
    .tp_clear = (inquiry)Block_clear,
    .tp_repr = (reprfunc)Block_repr,
    .tp_getset = Block_getset,
    .tp_members = Block_members,
};

/* -------------------------------------------------------- FreeList type */

static PyObject *FreeList_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *stream;
    int small;
    if (!PyArg_ParseTuple(args, "Op", &stream, &small))
        return NULL;
    FreeList *fl = (FreeList *)type->tp_alloc(type, 0);
    if (fl == NULL)
        return NULL;
    fl->stream = Py_NewRef(stream);
    fl->mig = Py_NewRef(Py_None);
    fl->small = (char)small;
    return (PyObject *)fl;
}

static int FreeList_traverse(FreeList *fl, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < fl->nb; i++)
        for (Py_ssize_t j = 0; j < fl->buckets[i].n; j++)
            Py_VISIT(fl->buckets[i].items[j]);
    Py_VISIT(fl->stream);
    Py_VISIT(fl->mig);
    return 0;
}

static int FreeList_clear(FreeList *fl)
{
    for (Py_ssize_t i = 0; i < fl->nb; i++) {
        Bucket *bk = &fl->buckets[i];
        while (bk->n > 0) {
            Block *b = bk->items[--bk->n];
            Py_DECREF(b);
        }
    }
    fl->nblocks = 0;
    fl->nempty = fl->nb;
    Py_CLEAR(fl->stream);
    Py_CLEAR(fl->mig);
    return 0;
}

static void FreeList_dealloc(FreeList *fl)
{
    PyObject_GC_UnTrack(fl);
    FreeList_clear(fl);
    for (Py_ssize_t i = 0; i < fl->nb; i++)
        PyMem_Free(fl->buckets[i].items);
    PyMem_Free(fl->buckets);
    Py_TYPE(fl)->tp_free((PyObject *)fl);
}

static Py_ssize_t FreeList_len(FreeList *fl)
{
    return fl->nblocks;
}

static PyObject *FreeList_blocks(FreeList *fl, PyObject *unused)
{
    PyObject *out = PyList_New(fl->nblocks);
    if (out == NULL)
        return NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < fl->nb; i++)
        for (Py_ssize_t j = fl->buckets[i].n - 1; j >= 0; j--)      /* the next taken first */
            PyList_SET_ITEM(out, k++, Py_NewRef((PyObject *)fl->buckets[i].items[j]));
    return out;
}

static PyObject *FreeList_repr(FreeList *fl)
{
    return PyUnicode_FromFormat("<FreeList %s pool, stream %R: %zd blocks>", fl->small ? "small" : "large",
                                fl->stream, fl->nblocks);
}

static PyObject *FreeList_sizes(FreeList *fl, PyObject *unused)
{
    PyObject *out = PyList_New(fl->nb);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < fl->nb; i++)
        PyList_SET_ITEM(out, i, PyLong_FromSsize_t(fl->buckets[i].size));
    return out;
}

static PyMethodDef FreeList_methods[] = {
    {"blocks", (PyCFunction)FreeList_blocks, METH_NOARGS, "the free blocks, smallest first"},
    {"_sizes", (PyCFunction)FreeList_sizes, METH_NOARGS, "the sizes of its buckets (some may be empty)"},
    {NULL},
};

static PyMemberDef FreeList_members[] = {
    {"stream", T_OBJECT, offsetof(FreeList, stream), READONLY, NULL},
    {"small", T_BOOL, offsetof(FreeList, small), READONLY, NULL},
    {"mig", T_OBJECT, offsetof(FreeList, mig), 0, NULL},
    {"retired", T_BOOL, offsetof(FreeList, retired), 0, NULL},
    {NULL},
};

static PySequenceMethods FreeList_as_sequence = {.sq_length = (lenfunc)FreeList_len};

static PyTypeObject FreeList_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "anychip._lib._alloc.FreeList",
    .tp_basicsize = sizeof(FreeList),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "FreeList(stream, small): the free blocks of one (pool, stream), ordered by size.",
    .tp_new = FreeList_new,
    .tp_dealloc = (destructor)FreeList_dealloc,
    .tp_traverse = (traverseproc)FreeList_traverse,
    .tp_clear = (inquiry)FreeList_clear,
    .tp_repr = (reprfunc)FreeList_repr,
    .tp_as_sequence = &FreeList_as_sequence,
    .tp_methods = FreeList_methods,
    .tp_members = FreeList_members,
};

/* ------------------------------------------------------ Buffer storage */

/* The storage and lifetime of anychip.Buffer (anychip/runtime/buffer.py subclasses
 * it): made with its block by Core.buffer, freed by free() or when the last
 * reference goes (a finalizer's free, which never blocks). */
typedef struct {
    PyObject_HEAD
    PyObject *device;
    PyObject *block;            /* the allocator's Block; NULL or None once freed, and for views */
    PyObject *root;             /* the buffer a view views, else NULL or None */
    Core *core;                 /* the allocator the block returns to */
    PyObject *weakreflist;
    Py_ssize_t nbytes, offset;
} BufferObject;

static PyTypeObject BufferBase_Type;
static PyTypeObject *buffer_type = &BufferBase_Type;    /* the Python subclass, once registered */
static PyObject *invalid_argument;                      /* anychip's InvalidArgumentError, once registered */

static int present(PyObject *o)
{
    return o != NULL && o != Py_None;
}

static PyObject *Core_buffer(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "buffer(device, nbytes, stream)");
        return NULL;
    }
    PyObject *block = core_malloc(self, args[1], args[2]);
    if (block == NULL)
        return NULL;
    BufferObject *buf = (BufferObject *)buffer_type->tp_alloc(buffer_type, 0);
    if (buf == NULL) {
        Py_XDECREF(core_free(self, block, Py_True));
        Py_DECREF(block);
        return NULL;
    }
    buf->device = Py_NewRef(args[0]);
    buf->block = block;
    buf->core = (Core *)Py_NewRef(self);
    buf->nbytes = ((Block *)block)->requested;
    buf->offset = ((Block *)block)->offset;
    return (PyObject *)buf;
}

static PyObject *Buffer_free(BufferObject *self, PyObject *unused)
{
    PyObject *block = self->block;
    if (!present(block) || self->core == NULL) {
        if (present(self->root))
            PyErr_SetString(invalid_argument, "free() on a view: free the buffer it views instead");
        else
            PyErr_Format(invalid_argument, "double free of a buffer (%zd bytes on %S)", self->nbytes,
                         self->device ? self->device : Py_None);
        return NULL;
    }
    self->block = NULL;
    PyObject *r = core_free(self->core, block, Py_True);
    Py_DECREF(block);
    return r;
}

static int Buffer_traverse(BufferObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->device);
    Py_VISIT(self->block);
    Py_VISIT(self->root);
    Py_VISIT(self->core);
    return 0;
}

/* Dropped without free() (last reference, or the cycle collector): return the
 * block as a finalizer does, which never raises and never blocks. */
static void Buffer_release(BufferObject *self)
{
    PyObject *block = self->block;
    if (present(block) && self->core != NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        self->block = NULL;
        PyObject *r = core_free(self->core, block, Py_False);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        Py_DECREF(block);
        PyErr_Restore(type, value, tb);
    }
}

static int Buffer_clear(BufferObject *self)
{
    Buffer_release(self);
    Py_CLEAR(self->device);
    Py_CLEAR(self->block);
    Py_CLEAR(self->root);
    Py_CLEAR(self->core);
    return 0;
}

static void Buffer_dealloc(BufferObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Buffer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Buffer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyErr_SetString(invalid_argument ? invalid_argument : PyExc_TypeError,
                    "anychip.Buffer cannot be constructed directly; use Device.alloc(nbytes), e.g. "
                    "anychip.device('cpu:0').alloc(1024)");
    return NULL;
}

static PyMethodDef Buffer_methods[] = {
    {"free", (PyCFunction)Buffer_free, METH_NOARGS,
     "Return the memory to the device's allocator (stream-ordered: work already enqueued that uses it "
     "still completes first). Freeing twice is an error."},
    {NULL},
};

static PyMemberDef Buffer_members[] = {
    {"device", T_OBJECT, offsetof(BufferObject, device), 0, "the Device the memory belongs to"},
    {"nbytes", T_PYSSIZET, offsetof(BufferObject, nbytes), 0, "size in bytes"},
    {"_block", T_OBJECT, offsetof(BufferObject, block), 0, NULL},
    {"_offset", T_PYSSIZET, offsetof(BufferObject, offset), 0, NULL},
    {"_root", T_OBJECT, offsetof(BufferObject, root), 0, NULL},
    {NULL},
};

static PyTypeObject BufferBase_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "anychip._lib._alloc.BufferBase",
    .tp_basicsize = sizeof(BufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Storage and lifetime of anychip.Buffer.",
    .tp_new = Buffer_new,
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_traverse = (traverseproc)Buffer_traverse,
    .tp_clear = (inquiry)Buffer_clear,
    .tp_weaklistoffset = offsetof(BufferObject, weakreflist),
    .tp_methods = Buffer_methods,
    .tp_members = Buffer_members,
};

/* view(buffer_type, device, nbytes, offset, root) -> a Buffer that owns no block */
static PyObject *mod_view(PyObject *mod, PyObject *args)
{
    PyObject *device, *root;
    Py_ssize_t nbytes, offset;
    if (!PyArg_ParseTuple(args, "OnnO", &device, &nbytes, &offset, &root))
        return NULL;
    BufferObject *v = (BufferObject *)buffer_type->tp_alloc(buffer_type, 0);
    if (v == NULL)
        return NULL;
    v->device = Py_NewRef(device);
    v->root = Py_NewRef(root);
    v->nbytes = nbytes;
    v->offset = offset;
    return (PyObject *)v;
}

/* register_buffer(Buffer, InvalidArgumentError): the subclass Core.buffer makes, the error it raises */
static PyObject *mod_register_buffer(PyObject *mod, PyObject *args)
{
    PyObject *type, *error;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &type, &error))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)type, &BufferBase_Type)) {
        PyErr_SetString(PyExc_TypeError, "register_buffer needs a subclass of BufferBase");
        return NULL;
    }
    Py_XSETREF(invalid_argument, Py_NewRef(error));
    buffer_type = (PyTypeObject *)Py_NewRef(type);
    Py_RETURN_NONE;
}

/* --------------------------------------------------------------- module */

static PyObject *mod_round_size(PyObject *mod, PyObject *args)
{
    long long n, divs[NDIVS];
    PyObject *d = Py_None;
    if (!PyArg_ParseTuple(args, "L|O", &n, &d))
        return NULL;
    if (d != Py_None) {
        PyObject *seq = PySequence_Fast(d, "divisions must be a sequence");
        if (seq == NULL)
            return NULL;
        Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
        for (int i = 0; i < NDIVS; i++)
            divs[i] = i < k ? PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i)) : 1;
        Py_DECREF(seq);
        if (PyErr_Occurred())
            return NULL;
    }
    return PyLong_FromLongLong(round_size(d != Py_None ? divs : NULL, n));
}

static PyMethodDef module_methods[] = {
    {"view", mod_view, METH_VARARGS, "view(device, nbytes, offset, root) -> a Buffer viewing root's memory"},
    {"register_buffer", mod_register_buffer, METH_VARARGS, NULL},
    {"round_size", mod_round_size, METH_VARARGS,
     "round_size(nbytes, divisions=None): size of the block that serves a request of nbytes (>= 1)"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "anychip._lib._alloc",
    .m_doc = "Compiled core of anychip's caching allocator (see anychip.runtime.allocator).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__alloc(void)
{
    if (PyType_Ready(&Block_Type) < 0 || PyType_Ready(&FreeList_Type) < 0 || PyType_Ready(&Core_Type) < 0
        || PyType_Ready(&BufferBase_Type) < 0)
        return NULL;
    str_malloc_slow = PyUnicode_InternFromString("_malloc_slow");
    str_free_slow = PyUnicode_InternFromString("_free_slow");
    any_token = PyUnicode_InternFromString("<no stream>");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL || str_malloc_slow == NULL || str_free_slow == NULL || any_token == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Block", (PyObject *)&Block_Type) < 0
        || PyModule_AddObjectRef(m, "FreeList", (PyObject *)&FreeList_Type) < 0
        || PyModule_AddObjectRef(m, "Core", (PyObject *)&Core_Type) < 0
        || PyModule_AddObjectRef(m, "BufferBase", (PyObject *)&BufferBase_Type) < 0
        || PyModule_AddIntConstant(m, "FREE", ST_FREE) < 0 || PyModule_AddIntConstant(m, "ALLOCATED", ST_ALLOCATED) < 0
        || PyModule_AddIntConstant(m, "PENDING", ST_PENDING) < 0 || PyModule_AddIntConstant(m, "ZERO", ST_ZERO) < 0)
        return NULL;
    return m;
}
