/*
 * The collectives of @name@ (anychip/plugin.h, "COLLECTIVES"): the NCCL-shaped entries anychip's
 * native transport (`anychip launch`, the conformance suite), PyTorch's c10d backend and Paddle's
 * bridge call. It uses @name@.c's streams, status codes and errors and kernels.c's arithmetic
 * (@name@.h).
 *
 * Two parts:
 *   1. the plugin.h entries (c_*): what plugin.h asks of any collective library -- argument
 *      checks, the unique id's size, the communicator, the in-place broadcast, groups, the
 *      asynchronous error and its detail, the masks. Each calls the collective library once, on
 *      a line marked DRIVER: replace that call with your library's (README.md, "Collectives",
 *      names NCCL's, HCCL's and RCCL's) and keep the rest.
 *   2. a stand-in collective library (shm_*), shaped as NCCL: collectives between the processes
 *      of one host over a shared-memory segment, run by the stream's worker thread in order with
 *      the stream's copies and kernels. Delete it once the entries call your library.
 */
#define _GNU_SOURCE
#include "@name@.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ==== the stand-in library's interface (part 2; your library's header replaces it) ============ */
typedef struct shm_comm_s *shm_comm;
typedef struct { char name[64]; } shm_unique_id;
typedef enum { SHM_INT8, SHM_UINT8, SHM_INT32, SHM_INT64, SHM_FLOAT16, SHM_BFLOAT16, SHM_FLOAT32,
               SHM_FLOAT64 } shm_type;
typedef enum { SHM_SUM, SHM_PROD, SHM_MIN, SHM_MAX, SHM_AVG } shm_op;

static anychip_status shm_get_unique_id(shm_unique_id *id);
static anychip_status shm_comm_init_rank(shm_comm *comm, int nranks, shm_unique_id id, int rank, int device,
                                         double timeout_s);
static anychip_status shm_comm_destroy(shm_comm comm);
static anychip_status shm_comm_abort(shm_comm comm);
static anychip_status shm_comm_get_async_error(shm_comm comm, anychip_status *error);
static const char *shm_get_last_error(shm_comm comm);
static anychip_status shm_all_reduce(const void *send, void *recv, size_t count, shm_type type, shm_op op,
                                     shm_comm comm, anychip_stream stream);
static anychip_status shm_reduce(const void *send, void *recv, size_t count, shm_type type, shm_op op, int root,
                                 shm_comm comm, anychip_stream stream);
static anychip_status shm_broadcast(void *buf, size_t count, shm_type type, int root, shm_comm comm,
                                    anychip_stream stream);
static anychip_status shm_all_gather(const void *send, void *recv, size_t send_count, shm_type type,
                                     shm_comm comm, anychip_stream stream);
static anychip_status shm_reduce_scatter(const void *send, void *recv, size_t recv_count, shm_type type,
                                         shm_op op, shm_comm comm, anychip_stream stream);
static anychip_status shm_all_to_all(const void *send, void *recv, size_t count, shm_type type, shm_comm comm,
                                     anychip_stream stream);
static anychip_status shm_send(const void *buf, size_t count, shm_type type, int peer, shm_comm comm,
                               anychip_stream stream);
static anychip_status shm_recv(void *buf, size_t count, shm_type type, int peer, shm_comm comm,
                               anychip_stream stream);
static anychip_status shm_group_start(void);
static anychip_status shm_group_end(void);

/* ==== 1. the plugin.h entries ================================================================ */

/* DRIVER: your library's type and reduction for each anychip one. A type or a reduction your
 * library lacks: leave its bit out of ccl_dtype_mask / ccl_redop_mask (set_collectives, below),
 * and anychip runs those ops on its host transport. Ops that only move data (broadcast,
 * all_gather, all_to_all, send, recv) always come as ANYCHIP_UINT8, counted in bytes. */
static const shm_type CCL_TYPES[] = {
    [ANYCHIP_INT8] = SHM_INT8,       [ANYCHIP_UINT8] = SHM_UINT8,       [ANYCHIP_INT32] = SHM_INT32,
    [ANYCHIP_INT64] = SHM_INT64,     [ANYCHIP_FLOAT16] = SHM_FLOAT16,   [ANYCHIP_BFLOAT16] = SHM_BFLOAT16,
    [ANYCHIP_FLOAT32] = SHM_FLOAT32, [ANYCHIP_FLOAT64] = SHM_FLOAT64,
};
static const shm_op CCL_OPS[] = {
    [ANYCHIP_SUM] = SHM_SUM, [ANYCHIP_PROD] = SHM_PROD, [ANYCHIP_MIN] = SHM_MIN, [ANYCHIP_MAX] = SHM_MAX,
    [ANYCHIP_AVG] = SHM_AVG,
};
#define CCL_DTYPE_MASK 0u       /* bit (1 << anychip_dtype) per type the reductions take; 0: all */
#define CCL_REDOP_MASK 0u       /* bit (1 << anychip_redop) per reduction the library has; 0: all */

/* a communicator: the library's, and what the entries need beside it */
struct anychip_comm_s {
    shm_comm lib;               /* DRIVER: your library's communicator (ncclComm_t, HcclComm, ...) */
    int device, rank, nranks;
};

/* the checks every op starts with: the communicator, the stream and the type */
static anychip_status ccl_begin(const char *what, anychip_comm c, anychip_stream s, anychip_dtype t) {
    if (!c) return fail(S_INVALID, "%s: NULL communicator", what);
    if (!s) return fail(S_INVALID, "%s: NULL stream", what);
    if ((unsigned)t > ANYCHIP_FLOAT64) return fail(S_INVALID, "%s: dtype %d is not a collective type", what, (int)t);
    return S_OK;
}

/* a buffer is this device's memory (the allocation table says so) */
static anychip_status ccl_buffer(const char *what, anychip_comm c, const char *role, const void *p, size_t bytes) {
    if (bytes && !valid_range(get_device(c->device), p, bytes))
        return fail(S_BAD_POINTER, "%s: %s %p + %zu is not memory of device %d", what, role, p, bytes, c->device);
    return S_OK;
}

static anychip_status ccl_redop(const char *what, anychip_redop op) {
    return (unsigned)op > ANYCHIP_AVG ? fail(S_INVALID, "%s: op %d is not an anychip_redop", what, (int)op) : S_OK;
}

static anychip_status ccl_rank(const char *what, const char *role, int r, anychip_comm c) {
    return r < 0 || r >= c->nranks ? fail(S_INVALID, "%s: %s %d of %d ranks", what, role, r, c->nranks) : S_OK;
}

#define CCL_CHECK(expr)                      \
    do {                                     \
        anychip_status rc_ = (expr);         \
        if (rc_ != S_OK) return rc_;         \
    } while (0)

static anychip_status c_get_unique_id(anychip_unique_id *id) {
    if (!id) return fail(S_INVALID, "get_unique_id: id is NULL");
    shm_unique_id uid;
    CCL_CHECK(shm_get_unique_id(&uid));                     /* DRIVER: ncclGetUniqueId, HcclGetRootInfo */
    /* anychip carries ANYCHIP_UNIQUE_ID_BYTES (128) to the other ranks. A larger id must fit: HCCL's
     * root info (4108 bytes) uses a prefix of it; carry that and refuse an id whose tail is not
     * zero, saying so (anychip's ACL + HCCL adapter, plugin_acl.c, does). */
    _Static_assert(sizeof uid <= sizeof id->internal, "the library's unique id fits anychip_unique_id");
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &uid, sizeof uid);
    return S_OK;
}

/* timeout_s: seconds each op of the communicator may wait for its peers; 0: the library's default */
static anychip_status comm_init(int d, int nranks, const anychip_unique_id *id, int rank, double timeout_s,
                                anychip_comm *out) {
    DEVICE(dev, d);
    (void)dev;
    if (!id || !out) return fail(S_INVALID, "comm_init_rank: NULL id or communicator");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(S_INVALID, "comm_init_rank: rank %d of %d ranks", rank, nranks);
    /* a runtime with a per-thread current device (ACL, HIP, CUDA): make device d current here, as
     * every entry does (README.md, "set_device"): the library takes the communicator's device from it */
    anychip_comm c = calloc(1, sizeof *c);
    if (!c) return fail(S_SYSTEM, "comm_init_rank: out of host memory");
    c->device = d;
    c->rank = rank;
    c->nranks = nranks;
    shm_unique_id uid;
    memcpy(&uid, id->internal, sizeof uid);
    /* DRIVER: ncclCommInitRank (and the library's way to give one communicator its own timeout) */
    anychip_status rc = shm_comm_init_rank(&c->lib, nranks, uid, rank, d, timeout_s);
    if (rc != S_OK) {
        free(c);
        return rc;
    }
    *out = c;
    return S_OK;
}

static anychip_status c_comm_init_rank(int d, int nranks, const anychip_unique_id *id, int rank,
                                       anychip_comm *out) {
    return comm_init(d, nranks, id, rank, 0, out);
}

/* plugin.h minor 3: the communicator of a group with its own timeout (a torch.distributed group's
 * `timeout`): its ops fail with timeout_status after timeout_s seconds of waiting for a peer, the
 * detail naming that peer. A library with no timeout per communicator (NCCL, HCCL, RCCL) leaves
 * the entry unset: anychip's watchdog then fails an op still running a second past the timeout. */
static anychip_status c_comm_init_rank_timeout(int d, int nranks, const anychip_unique_id *id, int rank,
                                               double timeout_s, anychip_comm *out) {
    if (!(timeout_s > 0)) return fail(S_INVALID, "comm_init_rank_timeout: timeout_s=%g; want seconds > 0", timeout_s);
    return comm_init(d, nranks, id, rank, timeout_s, out);
}

static anychip_status c_comm_destroy(anychip_comm c) {
    if (!c) return fail(S_INVALID, "comm_destroy: NULL communicator");
    anychip_status rc = shm_comm_destroy(c->lib);           /* DRIVER: ncclCommDestroy (waits for its ops) */
    free(c);
    return rc;
}

static anychip_status c_comm_abort(anychip_comm c) {
    if (!c) return fail(S_INVALID, "comm_abort: NULL communicator");
    anychip_status rc = shm_comm_abort(c->lib);             /* DRIVER: ncclCommAbort (a library without
                                                               one: leave comm_abort NULL) */
    free(c);
    return rc;
}

/* the failure of the communicator's enqueued work (0: none); its detail becomes this thread's
 * last error, which anychip reads next (get_last_error) and puts in the exception */
static anychip_status c_comm_get_async_error(anychip_comm c, anychip_status *error) {
    if (!c || !error) return fail(S_INVALID, "comm_get_async_error: NULL communicator or error");
    CCL_CHECK(shm_comm_get_async_error(c->lib, error));     /* DRIVER: ncclCommGetAsyncError */
    if (*error != S_OK) fail(*error, "%s", shm_get_last_error(c->lib));    /* DRIVER: ncclGetLastError */
    return S_OK;
}

static anychip_status c_all_reduce(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                                   anychip_comm c, anychip_stream s) {
    CCL_CHECK(ccl_begin("all_reduce", c, s, t));
    CCL_CHECK(ccl_redop("all_reduce", op));
    CCL_CHECK(ccl_buffer("all_reduce", c, "send", send, count * ITEM[t]));
    CCL_CHECK(ccl_buffer("all_reduce", c, "recv", recv, count * ITEM[t]));
    return shm_all_reduce(send, recv, count, CCL_TYPES[t], CCL_OPS[op], c->lib, s);   /* DRIVER: ncclAllReduce */
}

static anychip_status c_reduce(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                               int root, anychip_comm c, anychip_stream s) {
    CCL_CHECK(ccl_begin("reduce", c, s, t));
    CCL_CHECK(ccl_redop("reduce", op));
    CCL_CHECK(ccl_rank("reduce", "root", root, c));
    CCL_CHECK(ccl_buffer("reduce", c, "send", send, count * ITEM[t]));
    if (c->rank == root) CCL_CHECK(ccl_buffer("reduce", c, "recv", recv, count * ITEM[t]));
    return shm_reduce(send, recv, count, CCL_TYPES[t], CCL_OPS[op], root, c->lib, s);  /* DRIVER: ncclReduce */
}

static anychip_status c_broadcast(const void *send, void *recv, size_t count, anychip_dtype t, int root,
                                  anychip_comm c, anychip_stream s) {
    CCL_CHECK(ccl_begin("broadcast", c, s, t));
    CCL_CHECK(ccl_rank("broadcast", "root", root, c));
    size_t bytes = count * ITEM[t];
    if (c->rank == root) CCL_CHECK(ccl_buffer("broadcast", c, "send", send, bytes));
    CCL_CHECK(ccl_buffer("broadcast", c, "recv", recv, bytes));
    /* The library broadcasts in place, as HCCL does: the root's send is first copied to its recv, on
     * the stream. (A library that takes send and recv, as NCCL and RCCL do, gets both: no copy.) */
    if (c->rank == root && send != recv && bytes)
        CCL_CHECK(copy_async(c->device, recv, send, bytes, ANYCHIP_COPY_D2D, s));   /* DRIVER: your memcpy */
    return shm_broadcast(recv, count, CCL_TYPES[t], root, c->lib, s);      /* DRIVER: ncclBroadcast */
}

static anychip_status c_all_gather(const void *send, void *recv, size_t send_count, anychip_dtype t,
                                   anychip_comm c, anychip_stream s) {
    CCL_CHECK(ccl_begin("all_gather", c, s, t));
    size_t bytes = send_count * ITEM[t];
    CCL_CHECK(ccl_buffer("all_gather", c, "send", send, bytes));
    CCL_CHECK(ccl_buffer("all_gather", c, "recv", recv, bytes * (size_t)c->nranks));
    return shm_all_gather(send, recv, send_count, CCL_TYPES[t], c->lib, s);    /* DRIVER: ncclAllGather */
}

static anychip_status c_reduce_scatter(const void *send, void *recv, size_t recv_count, anychip_dtype t,
                                       anychip_redop op, anychip_comm c, anychip_stream s) {
    CCL_CHECK(ccl_begin("reduce_scatter", c, s, t));
    CCL_CHECK(ccl_redop("reduce_scatter", op));
    size_t bytes = recv_count * ITEM[t];
    CCL_CHECK(ccl_buffer("reduce_scatter", c, "send", send, bytes * (size_t)c->nranks));
    CCL_CHECK(ccl_buffer("reduce_scatter", c, "recv", recv, bytes));
    /* DRIVER: ncclReduceScatter */
    return shm_reduce_scatter(send, recv, recv_count, CCL_TYPES[t], CCL_OPS[op], c->lib, s);
}

static anychip_status c_all_to_all(const void *send, void *recv, size_t count, anychip_dtype t, anychip_comm c,
                                   anychip_stream s) {
    CCL_CHECK(ccl_begin("all_to_all", c, s, t));
    size_t bytes = count * ITEM[t] * (size_t)c->nranks;
    CCL_CHECK(ccl_buffer("all_to_all", c, "send", send, bytes));
    CCL_CHECK(ccl_buffer("all_to_all", c, "recv", recv, bytes));
    /* DRIVER: ncclAllToAll (a library without one: leave all_to_all NULL; anychip runs it on its host
     * transport) */
    return shm_all_to_all(send, recv, count, CCL_TYPES[t], c->lib, s);
}

static anychip_status c_send(const void *buf, size_t count, anychip_dtype t, int peer, anychip_comm c,
                             anychip_stream s) {
    CCL_CHECK(ccl_begin("send", c, s, t));
    CCL_CHECK(ccl_rank("send", "peer", peer, c));
    CCL_CHECK(ccl_buffer("send", c, "buffer", buf, count * ITEM[t]));
    return shm_send(buf, count, CCL_TYPES[t], peer, c->lib, s);            /* DRIVER: ncclSend */
}

static anychip_status c_recv(void *buf, size_t count, anychip_dtype t, int peer, anychip_comm c,
                             anychip_stream s) {
    CCL_CHECK(ccl_begin("recv", c, s, t));
    CCL_CHECK(ccl_rank("recv", "peer", peer, c));
    CCL_CHECK(ccl_buffer("recv", c, "buffer", buf, count * ITEM[t]));
    return shm_recv(buf, count, CCL_TYPES[t], peer, c->lib, s);            /* DRIVER: ncclRecv */
}

/* anychip issues the ops of one group (several ops at once, sends and receives that must progress
 * together) between group_start and group_end, on one thread */
static anychip_status c_group_start(void) { return shm_group_start(); }    /* DRIVER: ncclGroupStart */
static anychip_status c_group_end(void) { return shm_group_end(); }        /* DRIVER: ncclGroupEnd */

void set_collectives(anychip_plugin *p) {
    p->timeout_status = S_TIMEOUT;      /* a peer that never came: CollectiveTimeout */
    p->ccl_dtype_mask = CCL_DTYPE_MASK;
    p->ccl_redop_mask = CCL_REDOP_MASK;
    p->get_unique_id = c_get_unique_id;
    p->comm_init_rank = c_comm_init_rank;
    p->comm_init_rank_timeout = c_comm_init_rank_timeout;
    p->comm_destroy = c_comm_destroy;
    p->comm_abort = c_comm_abort;
    p->comm_get_async_error = c_comm_get_async_error;
    p->all_reduce = c_all_reduce;
    p->broadcast = c_broadcast;
    p->reduce = c_reduce;
    p->all_gather = c_all_gather;
    p->reduce_scatter = c_reduce_scatter;
    p->all_to_all = c_all_to_all;
    p->send = c_send;
    p->recv = c_recv;
    p->group_start = c_group_start;
    p->group_end = c_group_end;
}

/* ==== 2. the stand-in library (delete it once the entries call yours) ========================== */
/*
 * A communicator is a shared-memory segment that rank 0 creates (its name is the unique id) and
 * every rank maps: for each ordered pair of ranks a ring of SHM_RING bytes that one writes and
 * the other reads. Every op becomes messages between pairs (a length, then the bytes): an
 * all-reduce sends each piece of the input to every peer and reduces the pieces in rank order
 * (so every rank gets the same bits), a broadcast sends from the root, sends and receives of one
 * group move together. An op is enqueued on its stream (a T_HOST task): the stream's worker runs
 * it after the stream's earlier work and before its later work, so the op is asynchronous and
 * ordered as plugin.h asks. A peer that has exited fails the op at once, one that sends nothing
 * for ANYCHIP_COLLECTIVE_TIMEOUT seconds (default 300; a real library has its own setting) fails
 * it with S_TIMEOUT, naming the peer; the communicator then keeps the failure
 * (shm_comm_get_async_error) and fails every later op.
 */
#define SHM_RING (1u << 20)                 /* bytes of each ordered pair's ring */
#define SHM_PIECE (1u << 20)                /* bytes a reduction handles per round */
#define SHM_MAX_RANKS 64
#define SHM_HEADER 4096                     /* bytes before the rings' counters */

typedef struct {
    _Atomic uint64_t head;                  /* bytes written (by the sender) */
    char pad0[56];
    _Atomic uint64_t tail;                  /* bytes read (by the receiver) */
    char pad1[56];
} shm_ring;

typedef struct {
    _Atomic int32_t pid[SHM_MAX_RANKS];     /* each rank's process, for the liveness check */
    _Atomic int32_t joined;                 /* ranks that have mapped the segment */
    _Atomic uint32_t bell[SHM_MAX_RANKS];   /* rung when a ring of the rank moves: a futex word */
    _Atomic uint32_t asleep[SHM_MAX_RANKS]; /* the rank waits on its bell */
    _Atomic int32_t aborted_by;             /* 1 + the rank that aborted the communicator; 0: none */
} shm_header;

struct shm_comm_s {
    int device, nranks, rank;
    char *segment;
    size_t size;
    shm_header *hdr;
    shm_ring *rings;                        /* [src * nranks + dst] */
    char *data;                             /* SHM_RING bytes per ring, in the same order */
    char *scratch;                          /* nranks pieces: what the peers sent, before reducing */
    double timeout;
    pthread_mutex_t run;                    /* one op at a time */
    pthread_mutex_t lock;                   /* refs, error, error_text */
    pthread_cond_t idle;
    int refs;                               /* the handle's, and one per enqueued batch */
    _Atomic int aborted;
    anychip_status error;                   /* the first failure, kept */
    char error_text[512];
};

/* one op as enqueued */
typedef enum { OP_ALL_REDUCE, OP_REDUCE, OP_BROADCAST, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_SEND,
               OP_RECV } shm_kind;

typedef struct {
    shm_kind kind;
    shm_comm comm;
    anychip_stream stream;
    const void *send;
    void *recv;
    size_t count;
    shm_type type;
    shm_op op;
    int root;                               /* root, or the peer of a send / recv */
} shm_call;

/* the ops of one communicator that one stream task runs: its collectives in order, then its
 * sends and receives together */
typedef struct {
    shm_comm comm;
    int n;
    shm_call calls[];
} shm_batch;

static const size_t SHM_ITEM[] = {1, 1, 4, 8, 2, 2, 4, 8};

static double shm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* the communicator's failure: the first is kept, with its text */
static anychip_status shm_fail(shm_comm c, anychip_status code, const char *fmt, ...) {
    pthread_mutex_lock(&c->lock);
    if (c->error == S_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->error_text, sizeof c->error_text, fmt, ap);
        va_end(ap);
        c->error = code;
    }
    pthread_mutex_unlock(&c->lock);
    return code;
}

static void shm_release(shm_comm c) {
    pthread_mutex_lock(&c->lock);
    int left = --c->refs;
    pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->lock);
    if (left) return;
    if (c->segment) munmap(c->segment, c->size);
    free(c->scratch);
    pthread_mutex_destroy(&c->run);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->idle);
    free(c);
}

/* whether process pid runs (a killed process its parent has not reaped yet is a zombie: dead) */
static int shm_alive(int32_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return kill(pid, 0) == 0 || errno != ESRCH;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')');
    return !(paren && (paren[2] == 'Z' || paren[2] == 'X'));
}

/* waiting for rank 0's segment: a short sleep */
static void shm_pause(void) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
}

/* waiting for a peer: yield for the first 20 us, then sleep on this rank's bell (a peer that
 * moves a ring of ours rings it) for up to 0.1 s; `seen` is the bell before the last look */
static void shm_wait(shm_comm c, uint32_t seen, double idle_s) {
    if (idle_s < 20e-6) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 100000000};
    atomic_store(&c->hdr->asleep[c->rank], 1);
    syscall(SYS_futex, (uint32_t *)&c->hdr->bell[c->rank], FUTEX_WAIT, seen, &ts, NULL, 0);
    atomic_store(&c->hdr->asleep[c->rank], 0);
}

/* rank `peer` may wait for what this rank just moved */
static void shm_ring_bell(shm_comm c, int peer) {
    atomic_fetch_add(&c->hdr->bell[peer], 1);
    if (atomic_load(&c->hdr->asleep[peer]))
        syscall(SYS_futex, (uint32_t *)&c->hdr->bell[peer], FUTEX_WAKE, 1, NULL, NULL, 0);
}

static anychip_status shm_get_unique_id(shm_unique_id *id) {
    static _Atomic unsigned serial;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id, 0, sizeof *id);
    snprintf(id->name, sizeof id->name, "/@name@-ccl-%d-%u-%lx", (int)getpid(), atomic_fetch_add(&serial, 1),
             (unsigned long)ts.tv_nsec ^ (unsigned long)ts.tv_sec);
    return S_OK;
}

/* every rank maps the segment id.name (rank 0 creates it, the others wait for it), registers its
 * process and waits for the others; then the name is unlinked (the mappings stay) */
static anychip_status shm_comm_init_rank(shm_comm *out, int nranks, shm_unique_id id, int rank, int device,
                                         double timeout_s) {
    if (nranks > SHM_MAX_RANKS) return fail(S_INVALID, "comm_init_rank: at most %d ranks, not %d", SHM_MAX_RANKS, nranks);
    id.name[sizeof id.name - 1] = 0;
    if (id.name[0] != '/') return fail(S_INVALID, "comm_init_rank: not a unique id of @name@'s get_unique_id");
    shm_comm c = calloc(1, sizeof *c);
    if (!c) return fail(S_SYSTEM, "comm_init_rank: out of host memory");
    c->device = device;
    c->nranks = nranks;
    c->rank = rank;
    c->refs = 1;
    const char *t = getenv("ANYCHIP_COLLECTIVE_TIMEOUT");
    c->timeout = timeout_s > 0 ? timeout_s : t && strtod(t, NULL) > 0 ? strtod(t, NULL) : 300.0;
    pthread_mutex_init(&c->run, NULL);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    size_t pairs = (size_t)nranks * (size_t)nranks;
    c->size = SHM_HEADER + pairs * sizeof(shm_ring) + pairs * SHM_RING;
    c->scratch = malloc((size_t)nranks * SHM_PIECE);
    if (!c->scratch) {
        shm_release(c);
        return fail(S_SYSTEM, "comm_init_rank: out of host memory");
    }
    int fd = -1;
    double deadline = shm_now() + c->timeout;
    for (;;) {
        struct stat st;
        fd = rank == 0 ? shm_open(id.name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(id.name, O_RDWR, 0);
        if (fd >= 0 && rank == 0 && ftruncate(fd, (off_t)c->size) != 0) {
            int err = errno;
            close(fd);
            shm_unlink(id.name);
            shm_release(c);
            return fail(S_SYSTEM, "comm_init_rank: cannot size %s to %zu bytes: %s", id.name, c->size, strerror(err));
        }
        if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == c->size) break;
        int err = errno;
        if (fd >= 0) close(fd);
        if (rank == 0) {
            shm_release(c);
            return fail(S_SYSTEM, "comm_init_rank: cannot create %s: %s", id.name, strerror(err));
        }
        if (shm_now() > deadline) {
            shm_release(c);
            return fail(S_TIMEOUT, "comm_init_rank: rank %d: rank 0 made no segment %s within %g s", rank, id.name,
                        c->timeout);
        }
        shm_pause();
    }
    void *p = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (rank == 0) shm_unlink(id.name);
        shm_release(c);
        return fail(S_SYSTEM, "comm_init_rank: cannot map %s: %s", id.name, strerror(errno));
    }
    c->segment = p;
    c->hdr = p;
    c->rings = (shm_ring *)(c->segment + SHM_HEADER);
    c->data = (char *)(c->rings + pairs);
    atomic_store(&c->hdr->pid[rank], (int32_t)getpid());
    atomic_fetch_add(&c->hdr->joined, 1);
    anychip_status rc = S_OK;
    while (rc == S_OK && atomic_load(&c->hdr->joined) < nranks) {
        if (shm_now() > deadline)
            rc = fail(S_TIMEOUT, "comm_init_rank: rank %d: %d of %d ranks joined within %g s", rank,
                      (int)atomic_load(&c->hdr->joined), nranks, c->timeout);
        shm_pause();
    }
    if (rank == 0) shm_unlink(id.name);
    if (rc != S_OK) {
        shm_release(c);
        return rc;
    }
    *out = c;
    return S_OK;
}

static anychip_status shm_comm_destroy(shm_comm c) {
    pthread_mutex_lock(&c->lock);                 /* the ops enqueued before run first */
    while (c->refs > 1) pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
    shm_release(c);
    return S_OK;
}

static anychip_status shm_comm_abort(shm_comm c) {
    atomic_store(&c->aborted, 1);                 /* the op running and those enqueued fail at once */
    int32_t none = 0;                             /* and the peers' ops too (they look while they wait) */
    atomic_compare_exchange_strong(&c->hdr->aborted_by, &none, c->rank + 1);
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank) shm_ring_bell(c, r);
    shm_fail(c, S_ABORTED, "rank %d: the communicator was aborted", c->rank);
    shm_release(c);
    return S_OK;
}

static anychip_status shm_comm_get_async_error(shm_comm c, anychip_status *error) {
    pthread_mutex_lock(&c->lock);
    *error = c->error;
    pthread_mutex_unlock(&c->lock);
    return S_OK;
}

static const char *shm_get_last_error(shm_comm c) { return c->error_text; }   /* (set once, kept) */

/* ---- moving bytes: one message (a length, then its bytes) per transfer ------------------------- */
typedef struct {
    int peer, sending;
    char *buf;
    size_t bytes;
    uint64_t length;                        /* the message's length, sent or received first */
    size_t done;                            /* bytes moved, the 8 of the length included */
} shm_xfer;

static shm_ring *shm_ring_of(shm_comm c, int src, int dst) { return &c->rings[src * c->nranks + dst]; }
static char *shm_data_of(shm_comm c, int src, int dst) { return c->data + (size_t)(src * c->nranks + dst) * SHM_RING; }

/* up to n bytes into (sending) or out of the ring of the pair; the count moved */
static size_t shm_move(shm_comm c, shm_xfer *x, char *bytes, size_t n) {
    int src = x->sending ? c->rank : x->peer, dst = x->sending ? x->peer : c->rank;
    shm_ring *r = shm_ring_of(c, src, dst);
    char *data = shm_data_of(c, src, dst);
    uint64_t head = atomic_load_explicit(&r->head, x->sending ? memory_order_relaxed : memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->tail, x->sending ? memory_order_acquire : memory_order_relaxed);
    size_t ready = x->sending ? SHM_RING - (size_t)(head - tail) : (size_t)(head - tail);
    if (n > ready) n = ready;
    if (n == 0) return 0;
    size_t at = (size_t)((x->sending ? head : tail) % SHM_RING), first = n < SHM_RING - at ? n : SHM_RING - at;
    if (x->sending) {
        memcpy(data + at, bytes, first);
        memcpy(data, bytes + first, n - first);
        atomic_store_explicit(&r->head, head + n, memory_order_release);
    } else {
        memcpy(bytes, data + at, first);
        memcpy(bytes + first, data, n - first);
        atomic_store_explicit(&r->tail, tail + n, memory_order_release);
    }
    shm_ring_bell(c, x->peer);
    return n;
}

/* moves what the ring allows of transfer x: the bytes moved; *rc a mismatch of lengths */
static size_t shm_progress(shm_comm c, shm_xfer *x, anychip_status *rc) {
    size_t moved = 0;
    if (x->done < 8) {
        if (x->sending) x->length = x->bytes;
        moved = shm_move(c, x, (char *)&x->length + x->done, 8 - x->done);
        x->done += moved;
        if (x->done < 8) return moved;
        if (!x->sending && x->length != x->bytes) {
            *rc = shm_fail(c, S_PEER, "rank %d: rank %d sent %llu bytes where %zu were expected (the ranks called "
                           "different ops or counts)", c->rank, x->peer, (unsigned long long)x->length, x->bytes);
            return moved;
        }
    }
    size_t step = shm_move(c, x, x->buf + (x->done - 8), x->bytes - (x->done - 8));
    x->done += step;
    return moved + step;
}

/* runs the transfers together until all are done (those to or from one peer in their order) */
static anychip_status shm_exchange(shm_comm c, shm_xfer *xs, int n) {
    int left = n;
    unsigned char busy[2 * SHM_MAX_RANKS];
    double last = shm_now(), next_check = last + 0.1;
    while (left > 0) {
        size_t moved = 0;
        anychip_status rc = S_OK;
        uint32_t seen = atomic_load(&c->hdr->bell[c->rank]);
        memset(busy, 0, sizeof busy);
        for (int i = 0; i < n && rc == S_OK; i++) {
            shm_xfer *x = &xs[i];
            if (x->done == x->bytes + 8) continue;
            unsigned char *b = &busy[2 * x->peer + x->sending];
            if (*b) continue;                       /* an earlier message to that peer goes first */
            *b = 1;
            moved += shm_progress(c, x, &rc);
            if (x->done == x->bytes + 8) left--;
        }
        if (rc != S_OK) return rc;
        double now = shm_now();
        if (moved) {
            last = now;
            continue;
        }
        if (atomic_load(&c->aborted)) return shm_fail(c, S_ABORTED, "rank %d: the communicator was aborted", c->rank);
        int32_t by = atomic_load(&c->hdr->aborted_by);
        if (by) return shm_fail(c, S_ABORTED, "rank %d: rank %d aborted the communicator", c->rank, (int)by - 1);
        int waiting = -1;
        for (int i = 0; i < n && waiting < 0; i++)
            if (xs[i].done < xs[i].bytes + 8) waiting = xs[i].peer;
        if (now - last > c->timeout)
            return shm_fail(c, S_TIMEOUT, "rank %d: timed out after %g s waiting for rank %d", c->rank, c->timeout,
                            waiting);
        if (now > next_check) {
            for (int i = 0; i < n; i++) {
                int32_t pid = atomic_load(&c->hdr->pid[xs[i].peer]);
                if (xs[i].done < xs[i].bytes + 8 && pid > 0 && !shm_alive(pid))
                    return shm_fail(c, S_PEER, "rank %d: rank %d (pid %d) exited during the collective", c->rank,
                                    xs[i].peer, (int)pid);
            }
            next_check = now + 0.1;
        }
        shm_wait(c, seen, now - last);
    }
    return S_OK;
}

/* ---- reductions, in rank order (kernels.c's reduce_elements for the less common types) --------- */
#define SHM_LOOP(T, COMBINE)                                                                      \
    for (size_t i = 0; i < count; i++) {                                                         \
        T acc = ((const T *)in[0])[i];                                                           \
        for (int r = 1; r < n; r++) {                                                            \
            T v = ((const T *)in[r])[i];                                                         \
            acc = COMBINE;                                                                       \
        }                                                                                        \
        ((T *)out)[i] = acc;                                                                     \
    }                                                                                            \
    return
/* integers: sums and products in unsigned arithmetic (they wrap) */
#define SHM_INT_LOOPS(S, U)                                                                       \
    switch (op) {                                                                                \
    case SHM_SUM: SHM_LOOP(U, acc + v);                                                          \
    case SHM_PROD: SHM_LOOP(U, acc * v);                                                         \
    case SHM_MIN: SHM_LOOP(S, v < acc ? v : acc);                                                \
    case SHM_MAX: SHM_LOOP(S, v > acc ? v : acc);                                                \
    default: break;                                                                              \
    }
/* floats: min and max propagate NaN */
#define SHM_FLOAT_LOOPS(T)                                                                        \
    switch (op) {                                                                                \
    case SHM_SUM: SHM_LOOP(T, acc + v);                                                          \
    case SHM_PROD: SHM_LOOP(T, acc * v);                                                         \
    case SHM_MIN: SHM_LOOP(T, acc != acc ? acc : v != v || v < acc ? v : acc);                   \
    case SHM_MAX: SHM_LOOP(T, acc != acc ? acc : v != v || v > acc ? v : acc);                   \
    default: break;                                                                              \
    }

static void shm_reduce_pieces(char *out, char *const *in, int n, size_t count, shm_type type, shm_op op) {
    switch (type) {                                 /* the common cases, typed */
    case SHM_INT8: SHM_INT_LOOPS(int8_t, uint8_t) break;
    case SHM_UINT8: SHM_INT_LOOPS(uint8_t, uint8_t) break;
    case SHM_INT32: SHM_INT_LOOPS(int32_t, uint32_t) break;
    case SHM_INT64: SHM_INT_LOOPS(int64_t, uint64_t) break;
    case SHM_FLOAT32: SHM_FLOAT_LOOPS(float) break;
    case SHM_FLOAT64: SHM_FLOAT_LOOPS(double) break;
    default: break;
    }
    /* the others (float16, bfloat16, averages), element by element as kernels.c computes (shm_type has
     * anychip_dtype's order) */
    anychip_binary_op bop = op == SHM_PROD ? ANYCHIP_OP_MUL : op == SHM_MIN ? ANYCHIP_OP_MIN :
                            op == SHM_MAX ? ANYCHIP_OP_MAX : ANYCHIP_OP_ADD;
    reduce_elements(out, in, n, count, (anychip_dtype)type, bop, op == SHM_AVG);
}

/* a reduction of every rank's `count` elements at send (+ block * count when scattering) into recv on
 * rank `to` (-1: every rank; -2: each rank its own block, reduce_scatter) */
static anychip_status shm_run_reduce(shm_comm c, const shm_call *k, int to) {
    size_t item = SHM_ITEM[k->type], per = SHM_PIECE / item;
    int n = c->nranks, me = c->rank, scatter = to == -2;
    shm_xfer xs[2 * SHM_MAX_RANKS];
    char *pieces[SHM_MAX_RANKS];
    for (size_t at = 0; at < k->count; at += per) {
        size_t len = k->count - at < per ? k->count - at : per;
        int nx = 0;
        for (int q = 0; q < n; q++) {
            const char *mine = (const char *)k->send + ((scatter ? (size_t)q * k->count : 0) + at) * item;
            if (q == me) {
                if (!scatter) pieces[me] = (char *)mine;
                continue;
            }
            if (scatter || to < 0 || q == to)       /* my piece of q's result */
                xs[nx++] = (shm_xfer){.peer = q, .sending = 1, .buf = (char *)mine, .bytes = len * item};
            if (to == -1 || scatter || me == to)    /* q's piece of mine */
                xs[nx++] = (shm_xfer){.peer = q, .sending = 0, .buf = c->scratch + (size_t)q * SHM_PIECE,
                                      .bytes = len * item};
            pieces[q] = c->scratch + (size_t)q * SHM_PIECE;
        }
        if (scatter) pieces[me] = (char *)k->send + ((size_t)me * k->count + at) * item;
        anychip_status rc = shm_exchange(c, xs, nx);
        if (rc != S_OK) return rc;
        if (to < 0 || me == to) shm_reduce_pieces((char *)k->recv + at * item, pieces, n, len, k->type, k->op);
    }
    return S_OK;
}

static anychip_status shm_run_collective(shm_comm c, const shm_call *k) {
    int n = c->nranks, me = c->rank;
    size_t bytes = k->count * SHM_ITEM[k->type];
    shm_xfer xs[2 * SHM_MAX_RANKS];
    int nx = 0;
    switch (k->kind) {
    case OP_ALL_REDUCE: return shm_run_reduce(c, k, -1);
    case OP_REDUCE: return shm_run_reduce(c, k, k->root);
    case OP_REDUCE_SCATTER: return shm_run_reduce(c, k, -2);
    case OP_BROADCAST:                              /* in place: recv is the buffer */
        for (int q = 0; q < n; q++)
            if (me == k->root && q != me)
                xs[nx++] = (shm_xfer){.peer = q, .sending = 1, .buf = k->recv, .bytes = bytes};
        if (me != k->root) xs[nx++] = (shm_xfer){.peer = k->root, .sending = 0, .buf = k->recv, .bytes = bytes};
        return shm_exchange(c, xs, nx);
    case OP_ALL_GATHER: {
        char *mine = (char *)k->recv + (size_t)me * bytes;
        if (mine != k->send) memmove(mine, k->send, bytes);
        for (int q = 0; q < n; q++) {
            if (q == me) continue;
            xs[nx++] = (shm_xfer){.peer = q, .sending = 1, .buf = mine, .bytes = bytes};
            xs[nx++] = (shm_xfer){.peer = q, .sending = 0, .buf = (char *)k->recv + (size_t)q * bytes, .bytes = bytes};
        }
        return shm_exchange(c, xs, nx);
    }
    case OP_ALL_TO_ALL: {
        size_t total = bytes * (size_t)n;
        const char *src = k->send;
        char *copy = NULL;
        if ((const char *)k->send < (char *)k->recv + total && (char *)k->recv < (const char *)k->send + total) {
            if (!(copy = malloc(total ? total : 1)))        /* in place: send what was there before */
                return shm_fail(c, S_SYSTEM, "rank %d: all_to_all: out of host memory", me);
            memcpy(copy, k->send, total);
            src = copy;
        }
        memmove((char *)k->recv + (size_t)me * bytes, src + (size_t)me * bytes, bytes);
        for (int q = 0; q < n; q++) {
            if (q == me) continue;
            xs[nx++] = (shm_xfer){.peer = q, .sending = 1, .buf = (char *)src + (size_t)q * bytes, .bytes = bytes};
            xs[nx++] = (shm_xfer){.peer = q, .sending = 0, .buf = (char *)k->recv + (size_t)q * bytes, .bytes = bytes};
        }
        anychip_status rc = shm_exchange(c, xs, nx);
        free(copy);
        return rc;
    }
    default: return S_OK;                           /* sends and receives: shm_run_batch */
    }
}

/* a batch, on the stream's worker thread: its collectives in order, then its sends and receives */
static void shm_run_batch(void *arg) {
    shm_batch *b = arg;
    shm_comm c = b->comm;
    pthread_mutex_lock(&c->run);
    anychip_status rc;
    pthread_mutex_lock(&c->lock);
    rc = c->error;                                  /* a failed communicator runs nothing more */
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; rc == S_OK && i < b->n; i++) rc = shm_run_collective(c, &b->calls[i]);
    int np2p = 0;
    for (int i = 0; i < b->n; i++) np2p += b->calls[i].kind == OP_SEND || b->calls[i].kind == OP_RECV;
    shm_xfer *xs = np2p && rc == S_OK ? malloc((size_t)np2p * sizeof *xs) : NULL;
    if (np2p && rc == S_OK && !xs) rc = shm_fail(c, S_SYSTEM, "rank %d: out of host memory", c->rank);
    if (xs) {
        int nx = 0;
        for (int i = 0; i < b->n; i++) {
            const shm_call *k = &b->calls[i];
            if (k->kind == OP_SEND || k->kind == OP_RECV)
                xs[nx++] = (shm_xfer){.peer = k->root, .sending = k->kind == OP_SEND,
                                      .buf = k->kind == OP_SEND ? (char *)k->send : k->recv,
                                      .bytes = k->count * SHM_ITEM[k->type]};
        }
        shm_exchange(c, xs, nx);
        free(xs);
    }
    pthread_mutex_unlock(&c->run);
    free(b);
    shm_release(c);
}

/* ---- enqueueing: an op at once, or the ops of a group at its end ------------------------------- */
static __thread int shm_depth;                      /* group_start calls not yet ended */
static __thread shm_call *shm_pending;               /* the group's ops */
static __thread int shm_npending, shm_cap;

/* a batch of n ops of communicator c, their calls to be filled in */
static shm_batch *shm_batch_new(shm_comm c, int n) {
    shm_batch *b = malloc(sizeof *b + (size_t)n * sizeof(shm_call));
    if (!b) return NULL;
    b->comm = c;
    b->n = 0;
    return b;
}

/* the batch onto the stream: its worker runs it (shm_run_batch), then frees it */
static anychip_status shm_enqueue(shm_batch *b, anychip_stream s) {
    shm_comm c = b->comm;
    pthread_mutex_lock(&c->lock);
    c->refs++;                                      /* the batch holds the communicator */
    pthread_mutex_unlock(&c->lock);
    anychip_status rc = enqueue(s, (task){.kind = T_HOST, .host = shm_run_batch, .arg = b});
    if (rc != S_OK) {
        free(b);
        shm_release(c);
    }
    return rc;
}

static anychip_status shm_submit(shm_call k) {
    if (atomic_load(&k.comm->aborted)) return fail(S_ABORTED, "the communicator was aborted");
    if (shm_depth == 0) {
        shm_batch *b = shm_batch_new(k.comm, 1);
        if (!b) return fail(S_SYSTEM, "collective: out of host memory");
        b->calls[b->n++] = k;
        return shm_enqueue(b, k.stream);
    }
    if (shm_npending == shm_cap) {
        shm_call *more = realloc(shm_pending, (size_t)(shm_cap ? 2 * shm_cap : 16) * sizeof *more);
        if (!more) return fail(S_SYSTEM, "collective: out of host memory for a group");
        shm_pending = more;
        shm_cap = shm_cap ? 2 * shm_cap : 16;
    }
    shm_pending[shm_npending++] = k;
    return S_OK;
}

static anychip_status shm_group_start(void) {
    shm_depth++;
    return S_OK;
}

/* the group's ops, one batch per communicator (whose ops must share a stream) */
static anychip_status shm_group_end(void) {
    if (shm_depth == 0) return fail(S_INVALID, "group_end without group_start");
    if (--shm_depth > 0) return S_OK;
    anychip_status rc = S_OK;
    for (int i = 0; i < shm_npending; i++) {
        shm_comm c = shm_pending[i].comm;
        if (!c) continue;                           /* in an earlier batch */
        shm_batch *b = shm_batch_new(c, shm_npending - i);
        for (int j = i; j < shm_npending; j++) {
            if (shm_pending[j].comm != c) continue;
            if (shm_pending[j].stream != shm_pending[i].stream && rc == S_OK)
                rc = fail(S_INVALID, "group_end: the ops of one communicator in one group are on two streams");
            if (b) b->calls[b->n++] = shm_pending[j];
            shm_pending[j].comm = NULL;
        }
        if (!b) {
            if (rc == S_OK) rc = fail(S_SYSTEM, "group_end: out of host memory");
        } else if (rc != S_OK) {
            free(b);                                /* (a failed group enqueues nothing more) */
        } else {
            rc = shm_enqueue(b, shm_pending[i].stream);
        }
    }
    shm_npending = 0;
    return rc;
}

static anychip_status shm_all_reduce(const void *send, void *recv, size_t count, shm_type type, shm_op op,
                                     shm_comm comm, anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_ALL_REDUCE, .comm = comm, .stream = stream, .send = send, .recv = recv,
                                 .count = count, .type = type, .op = op});
}

static anychip_status shm_reduce(const void *send, void *recv, size_t count, shm_type type, shm_op op, int root,
                                 shm_comm comm, anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_REDUCE, .comm = comm, .stream = stream, .send = send, .recv = recv,
                                 .count = count, .type = type, .op = op, .root = root});
}

static anychip_status shm_broadcast(void *buf, size_t count, shm_type type, int root, shm_comm comm,
                                    anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_BROADCAST, .comm = comm, .stream = stream, .recv = buf, .count = count,
                                 .type = type, .root = root});
}

static anychip_status shm_all_gather(const void *send, void *recv, size_t send_count, shm_type type,
                                     shm_comm comm, anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_ALL_GATHER, .comm = comm, .stream = stream, .send = send, .recv = recv,
                                 .count = send_count, .type = type});
}

static anychip_status shm_reduce_scatter(const void *send, void *recv, size_t recv_count, shm_type type,
                                         shm_op op, shm_comm comm, anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_REDUCE_SCATTER, .comm = comm, .stream = stream, .send = send,
                                 .recv = recv, .count = recv_count, .type = type, .op = op});
}

static anychip_status shm_all_to_all(const void *send, void *recv, size_t count, shm_type type, shm_comm comm,
                                     anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_ALL_TO_ALL, .comm = comm, .stream = stream, .send = send, .recv = recv,
                                 .count = count, .type = type});
}

static anychip_status shm_send(const void *buf, size_t count, shm_type type, int peer, shm_comm comm,
                               anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_SEND, .comm = comm, .stream = stream, .send = buf, .count = count,
                                 .type = type, .root = peer});
}

static anychip_status shm_recv(void *buf, size_t count, shm_type type, int peer, shm_comm comm,
                               anychip_stream stream) {
    return shm_submit((shm_call){.kind = OP_RECV, .comm = comm, .stream = stream, .recv = buf, .count = count,
                                 .type = type, .root = peer});
}
