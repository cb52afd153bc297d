/*
 * A Paddle CustomDevice plugin used by anychip's tests (tests/devices/test_paddle.py builds it).
 *
 * It implements the C_DeviceInterface honestly on the host: device memory is host
 * memory with a capacity (PDTEST_MEMORY bytes per device, default 256 MiB) and a table
 * of live allocations (a bad free or a wrong size is C_ERROR); every stream is a worker
 * thread running its queue in order; events are completed by the stream that recorded
 * them; the xccl_* entries run anychip's shared-memory collective engine (csrc/ccl) as
 * tasks on the stream, so collectives are stream-ordered and asynchronous.
 * PDTEST_DEVICES (default 4) sets the device count.
 *
 * anychip/paddle/device_ext.h is anychip's declaration of Paddle 3.x's device_ext.h (the
 * one the host loader reads). Variants, chosen at compile time:
 *   PDTEST_TYPE="name"        device_type (default "pdtest")
 *   PDTEST_NO_XCCL            no xccl_* entries (the host transport serves)
 *   PDTEST_MINIMAL            only the required entries (every optional one NULL)
 *   PDTEST_BROKEN_ALLREDUCE   xccl_all_reduce returns C_SUCCESS and moves nothing
 *   PDTEST_NULL_REQUIRED      leaves device_memory_stats NULL
 *   PDTEST_INIT_FAILS         initialize returns C_FAILED
 *   PDTEST_NULL_TYPE          sets no device_type
 *   PDTEST_OLD_LAYOUT         checks the sizes a Paddle 2.6 build would (88 / 912)
 *   PDTEST_OLD_VERSION        reports runtime version 0.1.0
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "anychip/paddle/device_ext.h"
#define CCL_EXPORT __attribute__((visibility("hidden")))
#include "ccl/ccl.h"

#ifndef PDTEST_TYPE
#define PDTEST_TYPE "pdtest"
#endif
#define MAX_DEVICES 64
#define ID_BYTES 64

typedef struct task {
    void (*fn)(void *);
    void *arg;
    struct task *next;
} task;

struct C_Stream_st {
    int device;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task *head, *tail;
    long pending;           /* queued or running */
    int stop;
    int error;              /* sticky C_Status of failed work */
    struct C_Stream_st *next_live;
};

struct C_Event_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded, completed;
};

typedef struct alloc_rec { void *ptr; size_t size; struct alloc_rec *next; } alloc_rec;

static struct {
    pthread_mutex_t mu;
    size_t ndev, capacity, used[MAX_DEVICES];
    alloc_rec *allocs[MAX_DEVICES];
    struct C_Stream_st *streams;
    int initialized;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static __thread int current_device = 0;

static size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    return v && *v ? (size_t)strtoull(v, NULL, 10) : dflt;
}

static int bad_device(const C_Device d) { return d == NULL || d->id < 0 || (size_t)d->id >= g.ndev; }

/* ---- devices ------------------------------------------------------------------ */

static C_Status initialize(void) {
#ifdef PDTEST_INIT_FAILS
    fprintf(stderr, "pdtest: initialize: no device answered\n");
    return C_FAILED;
#endif
    g.ndev = env_size("PDTEST_DEVICES", 4);
    if (g.ndev > MAX_DEVICES) g.ndev = MAX_DEVICES;
    g.capacity = env_size("PDTEST_MEMORY", (size_t)256 << 20);
    g.initialized = 1;
    return C_SUCCESS;
}

static C_Status finalize(void) { return C_SUCCESS; }
static C_Status init_device(const C_Device d) { return bad_device(d) ? C_ERROR : C_SUCCESS; }
static C_Status deinit_device(const C_Device d) { return bad_device(d) ? C_ERROR : C_SUCCESS; }

static C_Status set_device(const C_Device d) {
    if (bad_device(d)) return C_ERROR;
    current_device = d->id;
    return C_SUCCESS;
}

static C_Status get_device(const C_Device d) {
    if (d == NULL) return C_ERROR;
    d->id = current_device;
    return C_SUCCESS;
}

static C_Status get_device_count(size_t *count) {
    if (!g.initialized) return C_ERROR;
    *count = g.ndev;
    return C_SUCCESS;
}

static C_Status get_device_list(size_t *devices) {
    for (size_t i = 0; i < g.ndev; i++) devices[i] = i;
    return C_SUCCESS;
}

/* ---- memory ---------------------------------------------------------------------- */

static C_Status mem_alloc(const C_Device d, void **ptr, size_t size) {
    if (bad_device(d) || ptr == NULL) return C_ERROR;
    pthread_mutex_lock(&g.mu);
    if (g.used[d->id] + size > g.capacity) {
        pthread_mutex_unlock(&g.mu);
        return C_FAILED;                          /* resource exhausted */
    }
    alloc_rec *r = malloc(sizeof *r);
    void *p = NULL;
    if (r == NULL || posix_memalign(&p, 256, size ? size : 1) != 0) {
        free(r);
        pthread_mutex_unlock(&g.mu);
        return C_FAILED;
    }
    r->ptr = p, r->size = size, r->next = g.allocs[d->id];
    g.allocs[d->id] = r;
    g.used[d->id] += size;
    pthread_mutex_unlock(&g.mu);
    *ptr = p;
    return C_SUCCESS;
}

static C_Status mem_free(const C_Device d, void *ptr, size_t size) {
    if (bad_device(d)) return C_ERROR;
    pthread_mutex_lock(&g.mu);
    for (alloc_rec **pp = &g.allocs[d->id]; *pp; pp = &(*pp)->next) {
        alloc_rec *r = *pp;
        if (r->ptr == ptr) {
            if (r->size != size) break;           /* Paddle passes the allocation's size back */
            *pp = r->next;
            g.used[d->id] -= r->size;
            pthread_mutex_unlock(&g.mu);
            free(r->ptr);
            free(r);
            return C_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g.mu);
    return C_ERROR;
}

static C_Status mem_stats(const C_Device d, size_t *total, size_t *free_) {
    if (bad_device(d)) return C_ERROR;
    pthread_mutex_lock(&g.mu);
    *total = g.capacity;
    *free_ = g.capacity - g.used[d->id];
    pthread_mutex_unlock(&g.mu);
    return C_SUCCESS;
}

static C_Status min_chunk(const C_Device d, size_t *size) { (void)d; *size = 512; return C_SUCCESS; }

static C_Status mem_set(const C_Device d, void *ptr, unsigned char value, size_t size) {
    if (bad_device(d)) return C_ERROR;
    memset(ptr, value, size);
    return C_SUCCESS;
}

static C_Status host_alloc(const C_Device d, void **ptr, size_t size) {
    (void)d;
    *ptr = malloc(size ? size : 1);
    return *ptr ? C_SUCCESS : C_FAILED;
}

static C_Status host_free(const C_Device d, void *ptr, size_t size) { (void)d, (void)size; free(ptr); return C_SUCCESS; }

static C_Status copy_sync(const C_Device d, void *dst, const void *src, size_t size) {
    if (bad_device(d)) return C_ERROR;
    memmove(dst, src, size);
    return C_SUCCESS;
}

static C_Status copy_p2p(const C_Device dd, const C_Device sd, void *dst, const void *src, size_t size) {
    if (bad_device(dd) || bad_device(sd)) return C_ERROR;
    memmove(dst, src, size);
    return C_SUCCESS;
}

/* ---- streams ----------------------------------------------------------------------- */

static void *worker(void *arg) {
    struct C_Stream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == NULL) break;
        task *t = s->head;
        pthread_mutex_unlock(&s->mu);
        t->fn(t->arg);
        pthread_mutex_lock(&s->mu);
        s->head = t->next;
        if (s->head == NULL) s->tail = NULL;
        s->pending--;
        free(t);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Enqueue fn(arg); a NULL stream runs it at once (Paddle's synchronous stream). */
static C_Status enqueue(struct C_Stream_st *s, void (*fn)(void *), void *arg) {
    if (s == NULL) {
        fn(arg);
        return C_SUCCESS;
    }
    task *t = malloc(sizeof *t);
    if (t == NULL) return C_FAILED;
    t->fn = fn, t->arg = arg, t->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = t; else s->head = t;
    s->tail = t;
    s->pending++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return C_SUCCESS;
}

static C_Status create_stream(const C_Device d, C_Stream *out) {
    if (bad_device(d) || out == NULL) return C_ERROR;
    struct C_Stream_st *s = calloc(1, sizeof *s);
    if (s == NULL) return C_FAILED;
    s->device = d->id;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        free(s);
        return C_FAILED;
    }
    pthread_mutex_lock(&g.mu);
    s->next_live = g.streams;
    g.streams = s;
    pthread_mutex_unlock(&g.mu);
    *out = s;
    return C_SUCCESS;
}

static C_Status sync_stream(const C_Device d, C_Stream s) {
    (void)d;
    if (s == NULL) return C_SUCCESS;
    pthread_mutex_lock(&s->mu);
    while (s->pending) pthread_cond_wait(&s->cv, &s->mu);
    int err = s->error;
    pthread_mutex_unlock(&s->mu);
    return err ? (C_Status)err : C_SUCCESS;
}

static C_Status destroy_stream(const C_Device d, C_Stream s) {
    if (s == NULL) return C_SUCCESS;
    sync_stream(d, s);
    pthread_mutex_lock(&g.mu);
    for (struct C_Stream_st **pp = &g.streams; *pp; pp = &(*pp)->next_live)
        if (*pp == s) { *pp = s->next_live; break; }
    pthread_mutex_unlock(&g.mu);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    free(s);
    return C_SUCCESS;
}

static C_Status query_stream(const C_Device d, C_Stream s) {
    (void)d;
    if (s == NULL) return C_SUCCESS;
    pthread_mutex_lock(&s->mu);
    long p = s->pending;
    pthread_mutex_unlock(&s->mu);
    return p ? C_FAILED : C_SUCCESS;
}

static C_Status sync_device(const C_Device d) {
    if (bad_device(d)) return C_ERROR;
    for (;;) {                                    /* each live stream of the device */
        pthread_mutex_lock(&g.mu);
        struct C_Stream_st *busy = NULL;
        for (struct C_Stream_st *s = g.streams; s; s = s->next_live)
            if (s->device == d->id && query_stream(d, s) != C_SUCCESS) { busy = s; break; }
        pthread_mutex_unlock(&g.mu);
        if (busy == NULL) return C_SUCCESS;
        sync_stream(d, busy);
    }
}

typedef struct { void *dst; const void *src; size_t n; } copy_args;

static void run_copy(void *arg) {
    copy_args *c = arg;
    memmove(c->dst, c->src, c->n);
    free(c);
}

static C_Status copy_async(const C_Device d, C_Stream s, void *dst, const void *src, size_t size) {
    if (bad_device(d)) return C_ERROR;
    copy_args *c = malloc(sizeof *c);
    if (c == NULL) return C_FAILED;
    c->dst = dst, c->src = src, c->n = size;
    return enqueue(s, run_copy, c);
}

static C_Status copy_p2p_async(const C_Device dd, const C_Device sd, C_Stream s, void *dst, const void *src,
                               size_t size) {
    if (bad_device(dd)) return C_ERROR;
    return copy_async(sd, s, dst, src, size);
}


typedef struct { C_Callback cb; struct C_Device_st dev; C_Stream stream; void *user; } callback_args;

static void run_callback(void *arg) {
    callback_args *c = arg;
    C_Status st = C_SUCCESS;
    c->cb(&c->dev, c->stream, c->user, &st);
    free(c);
}

static C_Status add_callback(const C_Device d, C_Stream s, C_Callback cb, void *user) {
    if (bad_device(d) || cb == NULL) return C_ERROR;
    callback_args *c = malloc(sizeof *c);
    if (c == NULL) return C_FAILED;
    c->cb = cb, c->dev = *d, c->stream = s, c->user = user;
    return enqueue(s, run_callback, c);
}

/* ---- events ------------------------------------------------------------------------ */

static C_Status create_event(const C_Device d, C_Event *out) {
    if (bad_device(d) || out == NULL) return C_ERROR;
    struct C_Event_st *e = calloc(1, sizeof *e);
    if (e == NULL) return C_FAILED;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    *out = e;
    return C_SUCCESS;
}

static C_Status destroy_event(const C_Device d, C_Event e) {
    (void)d;
    if (e == NULL) return C_ERROR;
    pthread_mutex_lock(&e->mu);                   /* a pending completion still refers to it */
    while (e->completed < e->recorded) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    free(e);
    return C_SUCCESS;
}

typedef struct { struct C_Event_st *e; uint64_t gen; } mark_args;

static void run_complete(void *arg) {
    mark_args *m = arg;
    pthread_mutex_lock(&m->e->mu);
    if (m->gen > m->e->completed) m->e->completed = m->gen;
    pthread_cond_broadcast(&m->e->cv);
    pthread_mutex_unlock(&m->e->mu);
    free(m);
}

static C_Status record_event(const C_Device d, C_Stream s, C_Event e) {
    if (bad_device(d) || e == NULL) return C_ERROR;
    mark_args *m = malloc(sizeof *m);
    if (m == NULL) return C_FAILED;
    pthread_mutex_lock(&e->mu);
    m->e = e, m->gen = ++e->recorded;
    pthread_mutex_unlock(&e->mu);
    return enqueue(s, run_complete, m);
}

static C_Status query_event(const C_Device d, C_Event e) {
    (void)d;
    pthread_mutex_lock(&e->mu);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->mu);
    return done ? C_SUCCESS : C_FAILED;
}

static void wait_gen(struct C_Event_st *e, uint64_t gen) {
    pthread_mutex_lock(&e->mu);
    while (e->completed < gen) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

static C_Status sync_event(const C_Device d, C_Event e) {
    (void)d;
    if (e == NULL) return C_ERROR;
    pthread_mutex_lock(&e->mu);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&e->mu);
    wait_gen(e, gen);
    return C_SUCCESS;
}

static void run_wait(void *arg) {
    mark_args *m = arg;
    wait_gen(m->e, m->gen);
    free(m);
}

static C_Status stream_wait_event(const C_Device d, C_Stream s, C_Event e) {
    if (bad_device(d) || e == NULL) return C_ERROR;
    mark_args *m = malloc(sizeof *m);
    if (m == NULL) return C_FAILED;
    pthread_mutex_lock(&e->mu);
    m->e = e, m->gen = e->recorded;
    pthread_mutex_unlock(&e->mu);
    return enqueue(s, run_wait, m);
}

/* ---- xccl on anychip's collective engine -------------------------------------------- */

struct C_CCLComm_st {
    ccl_comm *c;
    pthread_mutex_t mu;
    int rank, size;
    int failed;                 /* set by the stream worker when an op failed */
    char error[512];            /* its message */
};

/* anychip's optional extension of the Paddle interface: the message of a communicator's
 * first failed op ("" when none); anychip reads it as the op's asynchronous error. */
__attribute__((visibility("default"))) const char *anychip_paddle_comm_error(C_CCLComm comm) {
    return comm && __atomic_load_n(&comm->failed, __ATOMIC_ACQUIRE) ? comm->error : "";
}

static C_Status id_size(size_t *size) { *size = ID_BYTES; return C_SUCCESS; }

static C_Status unique_id(C_CCLRootId *id) {
    static unsigned counter;
    if (id == NULL || id->data == NULL || id->sz < ID_BYTES) return C_ERROR;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id->data, 0, id->sz);
    snprintf(id->data, ID_BYTES, "pdtest.%d.%u.%lld%09ld", (int)getpid(), __atomic_fetch_add(&counter, 1, 0),
             (long long)ts.tv_sec, ts.tv_nsec);
    return C_SUCCESS;
}

static C_Status comm_init(size_t nranks, C_CCLRootId *id, size_t rank, C_CCLComm *out) {
    if (id == NULL || id->data == NULL || out == NULL || rank >= nranks) return C_ERROR;
    struct C_CCLComm_st *comm = calloc(1, sizeof *comm);
    if (comm == NULL) return C_FAILED;
    char name[ID_BYTES + 1] = {0};
    memcpy(name, id->data, id->sz < ID_BYTES ? id->sz : ID_BYTES);
    if (ccl_comm_init(name, (int)rank, (int)nranks, 0, &comm->c) != CCL_OK) {
        fprintf(stderr, "pdtest: xccl_comm_init_rank: %s\n", ccl_init_error());
        free(comm);
        return C_FAILED;
    }
    pthread_mutex_init(&comm->mu, NULL);
    comm->rank = (int)rank, comm->size = (int)nranks;
    const char *chk = getenv("ANYCHIP_COLLECTIVE_CHECK");
    ccl_comm_set_check(comm->c, chk && chk[0] == '1');
    *out = comm;
    return C_SUCCESS;
}

static C_Status comm_destroy(C_CCLComm comm) {
    if (comm == NULL) return C_ERROR;
    pthread_mutex_lock(&comm->mu);                /* work still running on a stream */
    pthread_mutex_unlock(&comm->mu);
    ccl_comm_destroy(comm->c);
    free(comm);
    return C_SUCCESS;
}

static int to_ccl_dtype(C_DataType t) {
    switch (t) {
    case INT8: return CCL_INT8;
    case UINT8: return CCL_UINT8;
    case INT32: return CCL_INT32;
    case INT64: return CCL_INT64;
    case FLOAT16: return CCL_FLOAT16;
    case BFLOAT16: return CCL_BFLOAT16;
    case FLOAT32: return CCL_FLOAT32;
    case FLOAT64: return CCL_FLOAT64;
    default: return -1;
    }
}

static int to_ccl_op(C_CCLReduceOp op) {
    switch (op) {
    case SUM: return CCL_SUM;
    case AVG: return CCL_AVG;
    case MAX: return CCL_MAX;
    case MIN: return CCL_MIN;
    case PRODUCT: return CCL_PROD;
    default: return -1;
    }
}

#define MAX_GROUP 256
typedef struct { C_CCLComm comm; C_Stream stream; int n; ccl_op ops[MAX_GROUP]; } ccl_job;

static __thread int group_depth;
static __thread ccl_job *group_job;

static void run_job(void *arg) {
    ccl_job *j = arg;
    struct C_CCLComm_st *comm = j->comm;
    pthread_mutex_lock(&comm->mu);
    int rc = comm->failed ? CCL_E_ABORTED : ccl_run(comm->c, j->ops, j->n);
    if (rc != CCL_OK && !comm->failed) {    /* kept for anychip_paddle_comm_error; later ops fail */
        snprintf(comm->error, sizeof comm->error, "%s", ccl_comm_error(comm->c));
        __atomic_store_n(&comm->failed, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&comm->mu);
    free(j);
}

static C_Status submit(C_CCLComm comm, C_Stream stream, const ccl_op *op) {
    if (comm == NULL) return C_ERROR;
    if (group_depth) {
        if (group_job == NULL) {
            group_job = calloc(1, sizeof *group_job);
            if (group_job == NULL) return C_FAILED;
            group_job->comm = comm, group_job->stream = stream;
        }
        if (group_job->comm != comm || group_job->n == MAX_GROUP) return C_ERROR;
        group_job->ops[group_job->n++] = *op;
        return C_SUCCESS;
    }
    ccl_job *j = calloc(1, sizeof *j);
    if (j == NULL) return C_FAILED;
    j->comm = comm, j->stream = stream, j->n = 1, j->ops[0] = *op;
    return enqueue(stream, run_job, j);
}

static C_Status make_op(ccl_op *op, int kind, const void *send, void *recv, size_t count, C_DataType t, int redop,
                        int root) {
    memset(op, 0, sizeof *op);
    op->kind = kind, op->count = count, op->root = root, op->redop = redop < 0 ? 0 : redop;
    op->dtype = to_ccl_dtype(t);
    op->send.ptr = (void *)send, op->recv.ptr = recv;
    return op->dtype < 0 || redop == -2 ? C_ERROR : C_SUCCESS;
}

#define SUBMIT(...) do { ccl_op op; if (make_op(&op, __VA_ARGS__) != C_SUCCESS) return C_ERROR; \
                         return submit(comm, stream, &op); } while (0)

static C_Status all_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp rop, C_CCLComm comm,
                           C_Stream stream) {
#ifdef PDTEST_BROKEN_ALLREDUCE
    (void)send, (void)recv, (void)count, (void)t, (void)rop, (void)comm, (void)stream;
    return C_SUCCESS;                             /* claims success, moves nothing */
#else
    int op_ = to_ccl_op(rop);
    SUBMIT(CCL_ALL_REDUCE, send, recv, count, t, op_ < 0 ? -2 : op_, -1);
#endif
}

static C_Status broadcast(void *buf, size_t count, C_DataType t, size_t root, C_CCLComm comm, C_Stream stream) {
    SUBMIT(CCL_BROADCAST, buf, buf, count, t, -1, (int)root);
}

static C_Status reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp rop, size_t root,
                       C_CCLComm comm, C_Stream stream) {
    int op_ = to_ccl_op(rop);
    SUBMIT(CCL_REDUCE, send, recv, count, t, op_ < 0 ? -2 : op_, (int)root);
}

static C_Status all_gather(void *send, void *recv, size_t count, C_DataType t, C_CCLComm comm, C_Stream stream) {
    SUBMIT(CCL_ALL_GATHER, send, recv, count, t, -1, -1);
}

static C_Status reduce_scatter(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp rop,
                               C_CCLComm comm, C_Stream stream) {
    int op_ = to_ccl_op(rop);
    SUBMIT(CCL_REDUCE_SCATTER, send, recv, count, t, op_ < 0 ? -2 : op_, -1);
}

static C_Status xsend(void *send, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream) {
    SUBMIT(CCL_SEND, send, NULL, count, t, -1, (int)peer);
}

static C_Status xrecv(void *recv, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream) {
    SUBMIT(CCL_RECV, NULL, recv, count, t, -1, (int)peer);
}

static C_Status group_start(void) { group_depth++; return C_SUCCESS; }

static C_Status group_end(void) {
    if (group_depth == 0) return C_ERROR;
    if (--group_depth || group_job == NULL) return C_SUCCESS;
    ccl_job *j = group_job;
    group_job = NULL;
    return enqueue(j->stream, run_job, j);
}

/* Paddle passes one pointer, count and type per peer; this plugin handles the layout anychip
 * and Paddle's collective layer use: equal counts and types, blocks contiguous in rank order. */
static C_Status all_to_all(const void **send, const size_t *scount, const C_DataType *stype, void **recv,
                           const size_t *rcount, const C_DataType *rtype, size_t rank, size_t nranks,
                           C_CCLComm comm, C_Stream stream) {
    if (comm == NULL || rank != (size_t)comm->rank || nranks != (size_t)comm->size) return C_ERROR;
    int dt = to_ccl_dtype(stype[0]);
    if (dt < 0) return C_ERROR;
    size_t block = scount[0] * ccl_dtype_size(dt);
    for (size_t p = 0; p < nranks; p++)
        if (scount[p] != scount[0] || rcount[p] != scount[0] || stype[p] != stype[0] || rtype[p] != stype[0] ||
            (const char *)send[p] != (const char *)send[0] + p * block ||
            (char *)recv[p] != (char *)recv[0] + p * block)
            return C_ERROR;
    SUBMIT(CCL_ALL_TO_ALL, send[0], recv[0], scount[0], stype[0], -1, -1);
}

/* ---- registration ---------------------------------------------------------------------- */

void InitPlugin(struct CustomRuntimeParams *params) {
#ifdef PDTEST_OLD_LAYOUT
    if (params->size != 88 && params->interface->size != 912) return;   /* a Paddle 2.6 build's check */
#else
    if (params->size != sizeof(struct CustomRuntimeParams) &&
        params->interface->size != sizeof(struct C_DeviceInterface)) return;
#endif
    params->version.major = 0;
    params->version.minor = 1;
#ifdef PDTEST_OLD_VERSION
    params->version.patch = 0;
#else
    params->version.patch = 1;
#endif
#ifndef PDTEST_NULL_TYPE
    params->device_type = (char *)PDTEST_TYPE;
#endif
    params->sub_device_type = (char *)"v1";
    struct C_DeviceInterface *i = params->interface;
    i->initialize = initialize;
    i->set_device = set_device;
    i->get_device = get_device;
    i->create_stream = create_stream;
    i->destroy_stream = destroy_stream;
    i->create_event = create_event;
    i->record_event = record_event;
    i->destroy_event = destroy_event;
    i->synchronize_stream = sync_stream;
    i->synchronize_event = sync_event;
    i->stream_wait_event = stream_wait_event;
    i->device_memory_allocate = mem_alloc;
    i->device_memory_deallocate = mem_free;
    i->memory_copy_h2d = copy_sync;
    i->memory_copy_d2h = copy_sync;
    i->memory_copy_d2d = copy_sync;
    i->get_device_count = get_device_count;
    i->get_device_list = get_device_list;
#ifndef PDTEST_NULL_REQUIRED
    i->device_memory_stats = mem_stats;
#endif
    i->device_min_chunk_size = min_chunk;
#ifndef PDTEST_MINIMAL
    i->finalize = finalize;
    i->init_device = init_device;
    i->deinit_device = deinit_device;
    i->query_stream = query_stream;
    i->stream_add_callback = add_callback;
    i->query_event = query_event;
    i->synchronize_device = sync_device;
    i->device_memory_set = mem_set;
    i->host_memory_allocate = host_alloc;
    i->host_memory_deallocate = host_free;
    i->memory_copy_p2p = copy_p2p;
    i->async_memory_copy_h2d = copy_async;
    i->async_memory_copy_d2h = copy_async;
    i->async_memory_copy_d2d = copy_async;
    i->async_memory_copy_p2p = copy_p2p_async;
#ifndef PDTEST_NO_XCCL
    i->xccl_get_unique_id_size = id_size;
    i->xccl_get_unique_id = unique_id;
    i->xccl_comm_init_rank = comm_init;
    i->xccl_destroy_comm = comm_destroy;
    i->xccl_all_reduce = all_reduce;
    i->xccl_broadcast = broadcast;
    i->xccl_reduce = reduce;
    i->xccl_all_gather = all_gather;
    i->xccl_reduce_scatter = reduce_scatter;
    i->xccl_group_start = group_start;
    i->xccl_group_end = group_end;
    i->xccl_send = xsend;
    i->xccl_recv = xrecv;
    i->xccl_all_to_all = all_to_all;
#endif
#endif
}
