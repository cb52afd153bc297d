/*
 * The simulator's collective front-end core: communicators on the anychip engine,
 * argument checks, enqueueing on simulated streams, groups. See collective.h.
 */
#define _GNU_SOURCE
#include "collective.h"
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define ID_MAGIC "anychip-ccl:"
#define ZERO_COPY_DEFAULT 65536u

struct sc_comm {
    char vendor[8];
    char name[96];
    ccl_comm *engine;
    int rank, nranks;
    int phys, logical;
    uint64_t zc_min;
    char *arena_base;                 /* the device arena's base (IPC offsets) */
    void *order_event;                /* orders ops issued on different streams */
    void *last_stream;                /* stream of the previous op (NULL: none yet) */
    int has_last;
    pthread_mutex_t lock;             /* enqueue order; pending count */
    pthread_cond_t idle;
    int pending;                      /* tasks enqueued and not finished */
    int abandoned;                    /* aborted: the last task to finish frees it */
    unsigned splits;                  /* splits made of it (every rank counts alike) */
    _Atomic int async_status;         /* sc_status of the first failed task */
    char async_msg[512];
};

/* ---- messages -------------------------------------------------------------- */

sc_status sc_fail(sc_status st, const char *fmt, ...)
{
    char buf[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sim_fail(SIM_E_INVALID_VALUE, "%s", buf);
    return st;
}

const char *sc_last_message(void) { return sim_last_message(); }

static sc_status from_ccl(int st)
{
    switch (st) {
    case CCL_OK: return SC_OK;
    case CCL_E_INVALID: return SC_INVALID;
    case CCL_E_TIMEOUT: return SC_TIMEOUT;
    case CCL_E_PEER_DEAD: return SC_REMOTE;
    case CCL_E_MISMATCH: return SC_USAGE;
    case CCL_E_ABORTED: return SC_REMOTE;
    case CCL_E_SYSTEM: return SC_SYSTEM;
    case CCL_E_IPC: return SC_SYSTEM;
    default: return SC_INTERNAL;
    }
}

static sc_status from_sim(sim_status st)
{
    switch (st) {
    case SIM_OK: return SC_OK;
    case SIM_E_OUT_OF_MEMORY:
    case SIM_E_HOST_ALLOC: return SC_OOM;
    case SIM_E_OS: return SC_SYSTEM;
    case SIM_E_INVALID_VALUE:
    case SIM_E_OUT_OF_RANGE: return SC_INVALID;
    default: return SC_RUNTIME;
    }
}

/* ---- unique ids --------------------------------------------------------------- */

sc_status sc_unique_id(const char *vendor, void *id, size_t size)
{
    static _Atomic uint64_t counter;
    if (!id)
        return sc_fail(SC_NULL, "the unique id pointer is NULL");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t n = atomic_fetch_add(&counter, 1);
    char name[64];
    int len = snprintf(name, sizeof name, "%s%s-%d-%llx-%llu", ID_MAGIC, vendor, (int)getpid(),
                       (unsigned long long)(ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec), (unsigned long long)n);
    memset(id, 0, size);
    memcpy(id, name, (size_t)len < size ? (size_t)len : size - 1);
    return SC_OK;
}

/* ---- device memory ---------------------------------------------------------------- */

static pthread_mutex_t base_lock = PTHREAD_MUTEX_INITIALIZER;
static char *arena_bases[SIM_MAX_DEVICES];

/* The base address of device `phys`'s arena: an IPC handle gives an allocation's
 * offset inside the arena; a probe allocation of known address turns it into the base. */
static sc_status arena_base(int phys, char **out)
{
    pthread_mutex_lock(&base_lock);
    char *base = arena_bases[phys];
    sc_status st = SC_OK;
    if (!base) {
        void *p = NULL;
        anychip_sim_ipc_handle h;
        sim_status s = sim_malloc(phys, 1, &p);
        if (s == SIM_OK) {
            s = sim_ipc_get_handle(p, &h);
            if (s == SIM_OK)
                base = arena_bases[phys] = (char *)p - h.offset;
            sim_free(p);
        }
        if (s != SIM_OK)
            st = sc_fail(from_sim(s), "cannot share device memory for collectives: %s", sim_last_message());
    }
    pthread_mutex_unlock(&base_lock);
    *out = base;
    return st;
}

/* Check that [ptr, ptr + nbytes) lies in one live allocation of the communicator's
 * device and describe it for the engine (with its IPC handle when `share`). */
static sc_status describe(sc_comm *c, const void *ptr, uint64_t nbytes, int share, ccl_buf *out, const char *fn,
                          const char *what)
{
    memset(out, 0, sizeof *out);
    if (nbytes == 0)
        return SC_OK;
    if (!ptr)
        return sc_fail(SC_NULL, "%s: %s is NULL", fn, what);
    int dev = sim_device_of(ptr);
    if (dev < 0)
        return sc_fail(SC_INVALID, "%s: %s %p is not device memory of this process", fn, what, ptr);
    if (dev != c->phys)
        return sc_fail(SC_INVALID, "%s: %s %p is memory of device %d; the communicator works on device %d", fn,
                       what, ptr, sim_phys_to_logical(dev), c->logical);
    anychip_sim_ipc_handle h;
    if (sim_ipc_get_handle(ptr, &h) != SIM_OK)
        return sc_fail(SC_INVALID, "%s: %s %p is not inside a live allocation", fn, what, ptr);
    uint64_t off = (uint64_t)((const char *)ptr - c->arena_base) - h.offset;
    if (off + nbytes > h.size)
        return sc_fail(SC_INVALID, "%s: %s needs %llu bytes from %p but its allocation ends %llu bytes after it",
                       fn, what, (unsigned long long)nbytes, ptr, (unsigned long long)(h.size - off));
    out->ptr = (void *)ptr;
    if (share) {
        out->has_ipc = 1;
        out->ipc_offset = off;
        memcpy(out->ipc_handle, &h, sizeof h);
    }
    return SC_OK;
}

static int ipc_open(const void *handle, void **ptr)
{
    return sim_ipc_open(-1, (const anychip_sim_ipc_handle *)handle, ptr) == SIM_OK ? 0 : -1;
}

static int ipc_close(void *ptr) { return sim_ipc_close(ptr) == SIM_OK ? 0 : -1; }

/* ---- communicators ------------------------------------------------------------------ */

/* The rules of anychip/runtime/env.py: blanks around a value are ignored and a blank value is
 * unset; a whole number is digits (at most 2^63); anything else is ignored for the default. */
static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (!v)
        return dflt;
    while (*v == ' ' || *v == '\t')
        v++;
    if (*v < '0' || *v > '9')
        return dflt;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    while (*end == ' ' || *end == '\t')
        end++;
    return (*end || errno || x > (1ull << 63)) ? dflt : (uint64_t)x;
}

/* A flag: on for 1, true, yes or on (any case, blanks around), off for anything else. */
static int env_flag(const char *name)
{
    static const char *const ON[] = {"1", "true", "yes", "on"};
    const char *v = getenv(name);
    if (!v)
        return 0;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    for (size_t i = 0; i < sizeof ON / sizeof ON[0]; i++)
        if (strlen(ON[i]) == n && strncasecmp(v, ON[i], n) == 0)
            return 1;
    return 0;
}

/* The live communicators. A handle is looked up here before anything reads it, so a destroyed
 * (or made-up) communicator is reported without touching freed memory. */
static ptr_map live_comms;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

static void live_atfork_child(void)
{
    pthread_mutex_init(&live_lock, NULL);     /* another parent thread may have held it */
}

static void live_setup(void)
{
    pthread_atfork(NULL, NULL, live_atfork_child);
}

static int live_add(sc_comm *c)
{
    pthread_once(&live_once, live_setup);
    pthread_mutex_lock(&live_lock);
    int rc = map_put(&live_comms, (uint64_t)(uintptr_t)c, c);
    pthread_mutex_unlock(&live_lock);
    return rc;
}

static void live_remove(sc_comm *c)
{
    pthread_mutex_lock(&live_lock);
    map_del(&live_comms, (uint64_t)(uintptr_t)c);
    pthread_mutex_unlock(&live_lock);
}

static int is_live(const sc_comm *c)
{
    pthread_mutex_lock(&live_lock);
    int live = map_get(&live_comms, (uint64_t)(uintptr_t)c) != NULL;
    pthread_mutex_unlock(&live_lock);
    return live;
}

static sc_status comm_init_on(const char *vendor, const void *id, size_t size, int nranks, int rank, int phys,
                              sc_comm **out);

sc_status sc_comm_init(const char *vendor, const void *id, size_t size, int nranks, int rank, sc_comm **out)
{
    int phys = -1;
    if (out && id) {
        sim_status s = sim_current_phys(&phys);
        if (s != SIM_OK)
            return sc_fail(SC_RUNTIME, "%s communicator init: no current device (%s)", vendor, sim_last_message());
    }
    return comm_init_on(vendor, id, size, nranks, rank, phys, out);
}

static sc_status comm_init_on(const char *vendor, const void *id, size_t size, int nranks, int rank, int phys,
                              sc_comm **out)
{
    if (!out || !id)
        return sc_fail(SC_NULL, "%s communicator init: %s is NULL", vendor, out ? "the unique id" : "comm");
    *out = NULL;
    char name[97];
    memcpy(name, id, sizeof name - 1 < size ? sizeof name - 1 : size);
    name[sizeof name - 1] = 0;
    if (strncmp(name, ID_MAGIC, strlen(ID_MAGIC)) != 0)
        return sc_fail(SC_INVALID, "%s communicator init: the unique id was not made by this library's "
                       "get-unique-id call (or was not passed on intact)", vendor);
    if (nranks < 1 || nranks > CCL_MAX_RANKS)
        return sc_fail(SC_INVALID, "%s communicator init: nranks=%d; the simulator supports 1..%d ranks", vendor,
                       nranks, CCL_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return sc_fail(SC_INVALID, "%s communicator init: rank=%d is outside 0..%d", vendor, rank, nranks - 1);
    sim_status s;
    sc_comm *c = calloc(1, sizeof *c);
    if (!c)
        return sc_fail(SC_OOM, "out of host memory");
    snprintf(c->vendor, sizeof c->vendor, "%s", vendor);
    snprintf(c->name, sizeof c->name, "%s", name + strlen(ID_MAGIC));
    c->rank = rank;
    c->nranks = nranks;
    c->phys = phys;
    c->logical = sim_phys_to_logical(phys);
    c->zc_min = env_u64("ANYCHIP_CCL_ZERO_COPY_MIN", ZERO_COPY_DEFAULT);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    sc_status st = arena_base(phys, &c->arena_base);
    if (st == SC_OK && (s = sim_event_create(&c->order_event)) != SIM_OK)
        st = sc_fail(from_sim(s), "%s communicator init: %s", vendor, sim_last_message());
    if (st == SC_OK) {
        int e = ccl_comm_init(name, rank, nranks, 0, &c->engine);
        if (e != CCL_OK)
            st = sc_fail(from_ccl(e), "%s communicator init (rank %d of %d): %s", vendor, rank, nranks,
                         ccl_init_error());
    }
    if (st == SC_OK && live_add(c) != 0)
        st = sc_fail(SC_OOM, "%s communicator init: out of host memory", vendor);
    if (st != SC_OK) {
        if (c->engine)
            ccl_comm_destroy(c->engine);
        if (c->order_event)
            sim_event_destroy(c->order_event);
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->idle);
        free(c);
        return st;
    }
    ccl_comm_set_check(c->engine, env_flag("ANYCHIP_COLLECTIVE_CHECK"));
    char label[160];
    snprintf(label, sizeof label, "%s communicator %s", vendor, c->name);
    ccl_comm_set_label(c->engine, label);
    ccl_comm_set_ipc(c->engine, ipc_open, ipc_close);
    ccl_comm_set_thresholds(c->engine, UINT64_MAX, c->zc_min);
    *out = c;
    return SC_OK;
}

sc_status sc_comm_check(const sc_comm *c, const char *fn)
{
    if (!c)
        return sc_fail(SC_NULL, "%s: the communicator is NULL", fn);
    if (!is_live(c))
        return sc_fail(SC_INVALID, "%s: %p is not a live communicator (destroyed, or never created)", fn,
                       (const void *)c);
    return SC_OK;
}

static void wait_idle(sc_comm *c)
{
    pthread_mutex_lock(&c->lock);
    while (c->pending > 0)
        pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

static void comm_free(sc_comm *c)
{
    live_remove(c);
    ccl_comm_destroy(c->engine);
    sim_event_destroy(c->order_event);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->idle);
    free(c);
}

sc_status sc_comm_destroy(sc_comm *c)
{
    sc_status st = sc_comm_check(c, "destroy");
    if (st != SC_OK)
        return st;
    wait_idle(c);
    comm_free(c);
    return SC_OK;
}

/* As ncclCommAbort: fail the work of every rank at once and return without waiting for it.
 * The engine's abort wakes the ranks' waits; tasks still queued on streams fail as soon as
 * they start, without waiting for peers; the last of them frees the communicator. */
sc_status sc_comm_abort(sc_comm *c)
{
    return sc_comm_abort_reason(c, NULL);
}

sc_status sc_comm_abort_reason(sc_comm *c, const char *why)
{
    sc_status st = sc_comm_check(c, "abort");
    if (st != SC_OK)
        return st;
    live_remove(c); /* the handle is dead for its owner from now on (freed by the last task) */
    ccl_comm_abort(c->engine, why && *why ? why : "the communicator was aborted by its owner");
    pthread_mutex_lock(&c->lock);
    c->abandoned = 1;
    int idle = c->pending == 0;
    pthread_mutex_unlock(&c->lock);
    if (idle)
        comm_free(c);
    return SC_OK;
}

SIM_EXPORT int anychip_sim_ccl_abort(void *comm, const char *reason)
{
    return (int)sc_comm_abort_reason((sc_comm *)comm, reason);
}

int sc_comm_rank(const sc_comm *c) { return c->rank; }
int sc_comm_size(const sc_comm *c) { return c->nranks; }
int sc_comm_device(const sc_comm *c) { return c->logical; }

sc_status sc_comm_get(const sc_comm *c, sc_comm_field f, const char *fn, const char *arg, int *out)
{
    sc_status st = sc_comm_check(c, fn);
    if (st == SC_OK && !out)
        st = sc_fail(SC_NULL, "%s: %s is NULL", fn, arg);
    if (st == SC_OK)
        *out = f == SC_COMM_SIZE ? c->nranks : f == SC_COMM_RANK ? c->rank : c->logical;
    return st;
}
const char *sc_comm_name(const sc_comm *c) { return c->name; }

sc_status sc_comm_async_error(const sc_comm *c, const char **msg)
{
    sc_status st = (sc_status)atomic_load(&c->async_status);
    if (msg)
        *msg = st ? c->async_msg : "";
    return st;
}

/* ---- enqueueing ------------------------------------------------------------------------ */

typedef struct job {
    sc_comm *comm;
    ccl_task *task;
} job;

static void run_job(void *arg)
{
    job *j = arg;
    sc_comm *c = j->comm;
    ccl_task_run(j->task);
    int st = ccl_task_status(j->task);
    pthread_mutex_lock(&c->lock);
    if (st != CCL_OK && atomic_load(&c->async_status) == SC_OK) {
        snprintf(c->async_msg, sizeof c->async_msg, "%s", ccl_task_error(j->task));
        atomic_store(&c->async_status, from_ccl(st));
    }
    ccl_task_free(j->task);
    free(j);
    int last = --c->pending == 0;
    if (last)
        pthread_cond_broadcast(&c->idle);
    int orphan = last && c->abandoned;
    pthread_mutex_unlock(&c->lock);
    if (orphan)
        comm_free(c);
}

/* Make `stream` wait for the work queued so far on `other` (both on the comm's device). */
static sim_status order_after(sc_comm *c, void *stream, void *other)
{
    sim_status st = sim_event_record(c->order_event, other);
    if (st == SIM_E_INVALID_STREAM)
        return SIM_OK; /* destroyed since: its work is done */
    if (st == SIM_OK)
        st = sim_stream_wait_event(stream, c->order_event);
    return st;
}

/* Enqueue ops on `stream`; extra streams of a group are joined before and after. */
static sc_status enqueue(sc_comm *c, const ccl_op *ops, int n, void *stream, void *const *others, int nothers,
                         const char *fn)
{
    const char *amsg;
    sc_status st = sc_comm_async_error(c, &amsg);
    if (st != SC_OK)
        return sc_fail(st, "%s: the communicator failed earlier: %s", fn, amsg);
    job *j = malloc(sizeof *j);
    ccl_task *t = j ? ccl_task_new(c->engine, ops, n) : NULL;
    if (!t) {
        free(j);
        return sc_fail(SC_OOM, "%s: out of host memory", fn);
    }
    j->comm = c;
    j->task = t;
    pthread_mutex_lock(&c->lock);
    sim_status ss = SIM_OK;
    if (c->has_last && c->last_stream != stream)
        ss = order_after(c, stream, c->last_stream);
    for (int i = 0; ss == SIM_OK && i < nothers; i++)
        ss = order_after(c, stream, others[i]);
    if (ss == SIM_OK)
        ss = sim_enqueue_host_fn(stream, run_job, j);
    if (ss == SIM_OK) {
        c->pending++;
        c->has_last = 1;
        c->last_stream = stream;
        for (int i = 0; i < nothers; i++)
            order_after(c, others[i], stream);
    }
    pthread_mutex_unlock(&c->lock);
    if (ss != SIM_OK) {
        ccl_task_free(t);
        free(j);
        return sc_fail(ss == SIM_E_INVALID_STREAM ? SC_INVALID : SC_RUNTIME, "%s: enqueueing on the stream failed: %s",
                       fn, sim_last_message());
    }
    return SC_OK;
}

/* ---- groups ------------------------------------------------------------------------------ */

typedef struct pending_op {
    sc_comm *comm;
    void *stream;
    ccl_op op;
} pending_op;

static __thread int t_depth;
static __thread pending_op *t_ops;
static __thread int t_nops, t_cap;

sc_status sc_group_start(void)
{
    t_depth++;
    return SC_OK;
}

static void drop_group(void)
{
    free(t_ops);
    t_ops = NULL;
    t_nops = t_cap = 0;
}

sc_status sc_group_end(void)
{
    if (t_depth == 0)
        return sc_fail(SC_USAGE, "group end without a matching group start");
    if (--t_depth > 0)
        return SC_OK;
    sc_status first = SC_OK;
    ccl_op *ops = t_nops ? malloc((size_t)t_nops * sizeof *ops) : NULL;
    void **streams = t_nops ? malloc((size_t)t_nops * sizeof *streams) : NULL;
    if (t_nops && (!ops || !streams)) {
        free(ops);
        free(streams);
        drop_group();
        return sc_fail(SC_OOM, "group end: out of host memory");
    }
    /* one task per communicator, in the order the communicators were first used */
    for (int i = 0; i < t_nops; i++) {
        sc_comm *c = t_ops[i].comm;
        if (!c)
            continue;
        int n = 0, ns = 0;
        void *primary = t_ops[i].stream;
        for (int k = i; k < t_nops; k++) {
            if (t_ops[k].comm != c)
                continue;
            ops[n++] = t_ops[k].op;
            void *sk = t_ops[k].stream;
            int seen = sk == primary;
            for (int m = 0; m < ns && !seen; m++)
                seen = streams[m] == sk;
            if (!seen)
                streams[ns++] = sk;
            t_ops[k].comm = NULL;
        }
        sc_status st = enqueue(c, ops, n, primary, streams, ns, "group end");
        if (st != SC_OK && first == SC_OK)
            first = st;
    }
    free(ops);
    free(streams);
    drop_group();
    return first;
}

/* ---- ops --------------------------------------------------------------------------------- */

static int is_reducing(int kind)
{
    return kind == CCL_ALL_REDUCE || kind == CCL_REDUCE || kind == CCL_REDUCE_SCATTER;
}

static int is_rooted(int kind)
{
    return kind == CCL_BROADCAST || kind == CCL_REDUCE || kind == CCL_SEND || kind == CCL_RECV;
}

/* The checks every vendor front end shares: a known dtype, reduce op and root (or peer). */
static sc_status check_op(const sc_comm *c, const sc_op *op, const char *fn)
{
    if (op->dtype < 0 || op->dtype >= CCL_DTYPE_COUNT)
        return sc_fail(SC_INVALID, "%s: unknown data type", fn);
    if (is_reducing(op->kind) && (op->redop < 0 || op->redop >= CCL_REDOP_COUNT))
        return sc_fail(SC_INVALID, "%s: unknown reduce op", fn);
    if (is_rooted(op->kind) && (op->root < 0 || op->root >= c->nranks))
        return sc_fail(SC_INVALID, "%s: %s %d is outside 0..%d", fn,
                       op->kind == CCL_SEND || op->kind == CCL_RECV ? "peer" : "root", op->root, c->nranks - 1);
    return SC_OK;
}

/* The buffers this rank's part of the op reads and writes, and their sizes in bytes:
 * the engine writes only the root's recv of a reduce and reads only the root's send of a
 * broadcast, so the other ranks name one buffer for both. */
typedef struct op_spans {
    const void *send;
    void *recv;
    uint64_t send_bytes, recv_bytes;
} op_spans;

static op_spans spans_of(const sc_comm *c, const sc_op *op, uint64_t n)
{
    uint64_t N = (uint64_t)c->nranks;
    op_spans s = {op->send, op->recv, n, n};
    switch (op->kind) {
    case CCL_ALL_GATHER: s.recv_bytes = n * N; break;
    case CCL_REDUCE_SCATTER: s.send_bytes = n * N; break;
    case CCL_ALL_TO_ALL: s.send_bytes = s.recv_bytes = n * N; break;
    case CCL_SEND: s.recv = NULL, s.recv_bytes = 0; break;
    case CCL_RECV: s.send = NULL, s.send_bytes = 0; break;
    case CCL_BARRIER: s.send_bytes = s.recv_bytes = 0; break;
    case CCL_REDUCE:
        if (c->rank != op->root)
            s.recv = (void *)s.send, s.recv_bytes = s.send_bytes;
        break;
    case CCL_BROADCAST:
        if (c->rank != op->root)
            s.send = s.recv, s.send_bytes = s.recv_bytes;
        break;
    default: break;
    }
    return s;
}

/* Check `op` and turn it into the engine's op; *skip is set for an op that moves nothing. */
static sc_status prepare(sc_comm *c, const sc_op *op, ccl_op *o, int *skip, const char *fn)
{
    sc_status st = check_op(c, op, fn);
    if (st != SC_OK)
        return st;
    int kind = op->kind;
    *skip = op->count == 0 && kind != CCL_BARRIER; /* nothing moves; every rank skips it alike */
    if (*skip)
        return SC_OK;
    uint64_t n = op->count * ccl_dtype_size(op->dtype);
    op_spans s = spans_of(c, op, n);
    /* zero-copy: the peers read this rank's buffers in place (not for point-to-point ops) */
    int share = kind != CCL_SEND && kind != CCL_RECV && kind != CCL_BARRIER && kind != CCL_ALL_TO_ALL &&
                n >= c->zc_min;
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->dtype = op->dtype;
    o->redop = is_reducing(kind) ? op->redop : CCL_SUM;
    o->root = is_rooted(kind) ? op->root : -1;
    o->count = op->count;
    if ((st = describe(c, s.send, s.send_bytes, share, &o->send, fn, "the send buffer")) != SC_OK ||
        (st = describe(c, s.recv, s.recv_bytes, share, &o->recv, fn, "the receive buffer")) != SC_OK)
        return st;
    return SC_OK;
}

sc_status sc_submit(sc_comm *c, const sc_op *op, void *stream, const char *fn)
{
    return sc_submit_many(c, op, 1, stream, fn);
}

sc_status sc_submit_many(sc_comm *c, const sc_op *ops, int n, void *stream, const char *fn)
{
    sc_status st = sc_comm_check(c, fn);
    if (st != SC_OK)
        return st;
    ccl_op one, *v = n > 1 ? malloc((size_t)n * sizeof *v) : &one;
    if (!v)
        return sc_fail(SC_OOM, "%s: out of host memory", fn);
    int k = 0;
    for (int i = 0; i < n && st == SC_OK; i++) {
        int skip = 0;
        st = prepare(c, &ops[i], &v[k], &skip, fn);
        if (st == SC_OK && !skip)
            k++;
    }
    if (st == SC_OK && k > 0 && t_depth > 0 && t_nops + k > t_cap) {
        int cap = t_cap ? t_cap : 16;
        while (cap < t_nops + k)
            cap *= 2;
        pending_op *p = realloc(t_ops, (size_t)cap * sizeof *p);
        if (!p)
            st = sc_fail(SC_OOM, "%s: out of host memory", fn);
        else
            t_ops = p, t_cap = cap;
    }
    if (st == SC_OK && k > 0) {
        if (t_depth > 0)      /* inside a group: kept for sc_group_end (room was made above) */
            for (int i = 0; i < k; i++)
                t_ops[t_nops++] = (pending_op){c, stream, v[i]};
        else
            st = enqueue(c, v, k, stream, NULL, 0, fn);
    }
    if (v != &one)
        free(v);
    return st;
}

/* ---- splitting a communicator ---------------------------------------------------------- */

sc_status sc_comm_split(sc_comm *c, int color, int key, sc_comm **out, const char *fn)
{
    sc_status st = sc_comm_check(c, fn);
    if (st != SC_OK)
        return st;
    if (!out)
        return sc_fail(SC_NULL, "%s: newcomm is NULL", fn);
    *out = NULL;
    if (color < -1)
        return sc_fail(SC_INVALID, "%s: color %d; a color is >= 0, or NCCL_SPLIT_NOCOLOR (-1)", fn, color);
    const char *amsg;
    if ((st = sc_comm_async_error(c, &amsg)) != SC_OK)
        return sc_fail(st, "%s: the communicator failed earlier: %s", fn, amsg);
    /* every rank's (color, key), gathered on the calling thread once the communicator's
     * queued work has run (the lock keeps new work out meanwhile) */
    int32_t mine[2] = {color, key}, *all = malloc((size_t)c->nranks * sizeof mine);
    if (!all)
        return sc_fail(SC_OOM, "%s: out of host memory", fn);
    ccl_op op;
    memset(&op, 0, sizeof op);
    op.kind = CCL_ALL_GATHER;
    op.dtype = CCL_INT32;
    op.redop = CCL_SUM;
    op.root = -1;
    op.count = 2;
    op.send.ptr = mine;
    op.recv.ptr = all;
    pthread_mutex_lock(&c->lock);
    while (c->pending > 0)
        pthread_cond_wait(&c->idle, &c->lock);
    int e = ccl_run(c->engine, &op, 1);
    unsigned gen = c->splits++;
    if (e != CCL_OK && atomic_load(&c->async_status) == SC_OK) {
        snprintf(c->async_msg, sizeof c->async_msg, "%s", ccl_comm_error(c->engine));
        atomic_store(&c->async_status, from_ccl(e));
    }
    pthread_mutex_unlock(&c->lock);
    if (e != CCL_OK) {
        free(all);
        return sc_fail(from_ccl(e), "%s: exchanging colors and keys failed: %s", fn, ccl_comm_error(c->engine));
    }
    if (color == -1) {            /* NCCL_SPLIT_NOCOLOR: takes part, joins nothing */
        free(all);
        return SC_OK;
    }
    /* the new ranks: the members of `color` ordered by key, then by rank in the parent */
    int n = 0, rank = 0;
    for (int r = 0; r < c->nranks; r++) {
        if (all[2 * r] != color)
            continue;
        n++;
        int k = all[2 * r + 1];
        if (k < key || (k == key && r < c->rank))
            rank++;
    }
    free(all);
    char id[128];
    memset(id, 0, sizeof id);
    uint64_t h = 1469598103934665603ull;      /* the parent's name, hashed: names stay short */
    for (const char *p = c->name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    snprintf(id, sizeof id, "%s%s-split-%016llx-%u-%d", ID_MAGIC, c->vendor, (unsigned long long)h, gen, color);
    return comm_init_on(c->vendor, id, sizeof id, n, rank, c->phys, out);
}

/* ---- arrays an op reads from device memory ------------------------------------------- */

sc_status sc_device_words(sc_comm *c, void *stream, const void *const *arrays, const char *const *names, int narrays,
                          int n, uint64_t *out, const char *fn)
{
    for (int a = 0; a < narrays; a++) {
        const char *p = arrays[a];
        if (!p)
            return sc_fail(SC_NULL, "%s: %s is NULL", fn, names[a]);
        size_t bytes = (size_t)n * sizeof(uint64_t);
        int dev = sim_device_of(p);
        if (dev < 0 || sim_device_of(p + bytes - 1) != dev)
            return sc_fail(SC_INVALID, "%s: %s %p is not %zu bytes of device memory (%d 64-bit counts); the "
                           "library reads it on the device", fn, names[a], (const void *)p, bytes, n);
        if (dev != c->phys)
            return sc_fail(SC_INVALID, "%s: %s %p is memory of device %d; the communicator works on device %d", fn,
                           names[a], (const void *)p, sim_phys_to_logical(dev), c->logical);
    }
    /* what the stream's queued work writes into the arrays is there once it has run */
    sim_status ss = sim_stream_synchronize(stream);
    if (ss != SIM_OK)
        return sc_fail(ss == SIM_E_INVALID_STREAM ? SC_INVALID : SC_RUNTIME, "%s: the stream: %s", fn,
                       sim_last_message());
    for (int a = 0; a < narrays; a++)
        memcpy(out + (size_t)a * (size_t)n, arrays[a], (size_t)n * sizeof(uint64_t));
    return SC_OK;
}

/* ---- several communicators at once (single-process multi-device init) -------------------- */

typedef struct init_job {
    const char *vendor;
    const sc_init_req *req;
    sc_status st;
    char msg[480];
} init_job;

static void *init_one(void *arg)
{
    init_job *j = arg;
    sim_status s = sim_set_current(j->req->logical);
    if (s != SIM_OK)
        j->st = sc_fail(SC_RUNTIME, "%s communicator init: device %d: %s", j->vendor, j->req->logical,
                        sim_last_message());
    else
        j->st = sc_comm_init(j->vendor, j->req->id, j->req->size, j->req->nranks, j->req->rank, j->req->out);
    if (j->st != SC_OK)
        snprintf(j->msg, sizeof j->msg, "%s", sim_last_message());
    return NULL;
}

sc_status sc_comm_init_many(const char *vendor, const sc_init_req *reqs, int n)
{
    init_job *jobs = calloc((size_t)(n > 0 ? n : 1), sizeof *jobs);
    pthread_t *threads = calloc((size_t)(n > 0 ? n : 1), sizeof *threads);
    if (!jobs || !threads) {
        free(jobs);
        free(threads);
        return sc_fail(SC_OOM, "%s communicator init: out of host memory", vendor);
    }
    int started = 0;
    sc_status first = SC_OK;
    char msg[480] = "";
    for (; started < n; started++) {
        jobs[started] = (init_job){.vendor = vendor, .req = &reqs[started]};
        *reqs[started].out = NULL;
        if (pthread_create(&threads[started], NULL, init_one, &jobs[started]) != 0) {
            first = SC_SYSTEM;
            snprintf(msg, sizeof msg, "%s communicator init: cannot start a thread for rank %d", vendor,
                     reqs[started].rank);
            break;
        }
    }
    for (int i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
        if (jobs[i].st != SC_OK && first == SC_OK) {
            first = jobs[i].st;
            snprintf(msg, sizeof msg, "%s", jobs[i].msg);
        }
    }
    if (first != SC_OK)                 /* all or none: free the ones that were made */
        for (int i = 0; i < started; i++)
            if (*reqs[i].out) {
                sc_comm_destroy(*reqs[i].out);
                *reqs[i].out = NULL;
            }
    free(jobs);
    free(threads);
    return first == SC_OK ? SC_OK : sc_fail(first, "%s", msg);
}
