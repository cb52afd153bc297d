/*
 * A chip plugin for measuring the conformance suite: the device `anychip plugin new --lang c`
 * generates, plus complete collectives of its own (every op, type and reduction, send / recv in
 * groups) between processes over a shared-memory segment, correct unless MUTANT_DEFECT names one
 * planted defect (read once, when the library is loaded). The suite must pass the library without
 * a defect and fail it with each one.
 *
 * Built by tests/conformance/test_conformance_mutants.py (tests/conftest.py's build_template_wrapper) with
 *   -DTEMPLATE_HEADER="\"<rendered project>/src/<name>.h\"" -DNAME="\"<backend name>\"" -I csrc/common
 * and linked with the project's src/kernels.c (the kernel table, KERNELS, whose entries the
 * kernel defects wrap) and its src/<name>.c, compiled with -Danychip_plugin_init=template_plugin_init:
 * this file's anychip_plugin_init wraps the template's, and the entries it changes call the
 * template's own (`base`).
 *
 * The collectives run in the calling thread once the stream's earlier work is done, in rounds of
 * MUTANT_CHUNK bytes (default 1 MiB) per rank: each rank puts its part of the round in its slot
 * (or, point to point, in the mailbox of the pair), all ranks meet, each takes what it needs, all
 * meet again. Reductions go in rank order, rounding to the type after each step, as NCCL does.
 * Every rank of a communicator takes part in every group of sends and receives.
 *
 * MUTANT_DEFECT (one of the defects[] below):
 *   rounding and overflow  bf16_truncate fp16_truncate int8_saturate
 *   tails and chunks       tail8 tail4 last_chunk
 *   stale results          skip_repeat skip_same_recv
 *   stream order           no_stream_wait
 *   rooted, point to point reduce_inplace_clobber recv_any_source
 *   device API             query_always_done event_query_always_done elapsed_zero elapsed_seconds
 *                          wait_event_ignored free_leaks mem_info_always_free mem_info_double_total
 *                          bad_free_ok copy_large_short (copies above 2 MiB miss their last byte)
 *   the suite's deadline   never_done (stream and event queries never report completion)
 *   kernel table           add_one (add gives one more), gemm_drop_last (each dot product without its
 *                          last term), reduce_remainder (a reduction in blocks of 16 drops the n % 16
 *                          last rows), broadcast_fast_path (an operand broadcast along its last
 *                          dimension read as a scalar), subnormal_flush (subnormal float results become
 *                          zero), bool_ff (true stored as 0xFF), kernels_at_once (a kernel runs when it is
 *                          launched, not after the work queued before it on its stream)
 *   device semantics       query_last_item (a stream reported complete while its last item runs),
 *                          query_ignores_kernels (queued kernels not counted), event_first_record (a
 *                          re-recorded event complete once any record completed), elapsed_first_record
 *                          (elapsed time from the start event's first record), elapsed_clock (elapsed
 *                          time at a clock 25 % off), wait_latest_record (a stream wait bound when the
 *                          stream's next copy is queued: to a later record), mem_info_peak (free = total - the peak
 *                          use: freed memory never comes back), mem_info_drift (an allocation's padding
 *                          to 256 bytes counted twice, given back once), peer_at_once (a peer copy
 *                          runs when called, not in stream order), peer_burst (peer copies rounded down
 *                          to 64-byte bursts)
 *   collective semantics   avg_float32 (integer avg computed in float32), split_world_size (avg on a
 *                          sub-communicator divides by the first communicator's rank count),
 *                          group_last_only (all_reduces of one group share one slot: only the last
 *                          runs), first_op_stream (every op waits for the stream of the communicator's
 *                          first op), abort_silent (an abort does not tell the peers), nan_identity
 *                          (float max / min start from -inf / +inf: an element NaN on every rank
 *                          becomes -inf / +inf)
 *   past the first chunk   late_root (a broadcast's chunks after the first come from rank 0),
 *                          late_redop (chunks after the first are summed, whatever the reduce op),
 *                          swap_same_peer (two messages to one peer in a group arrive in reverse order)
 */
#include TEMPLATE_HEADER

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the template's own anychip_plugin_init, compiled under this name (see the top) */
anychip_status template_plugin_init(anychip_plugin *p);
static anychip_plugin base;                              /* the template's entries, as it filled them */

#include "half.h"

#include <math.h>

#define S_TIMEOUT 7
#define MAX_RANKS 16
#define MAX_P2P 64

/* ---- the planted defect ------------------------------------------------------------------ */
enum {
    D_NONE, D_BF16_TRUNCATE, D_FP16_TRUNCATE, D_INT8_SATURATE, D_TAIL8, D_TAIL4, D_LAST_CHUNK, D_SKIP_REPEAT,
    D_SKIP_SAME_RECV, D_NO_STREAM_WAIT, D_REDUCE_INPLACE_CLOBBER, D_RECV_ANY_SOURCE, D_QUERY_ALWAYS_DONE,
    D_EVENT_QUERY_ALWAYS_DONE, D_ELAPSED_ZERO, D_ELAPSED_SECONDS, D_WAIT_EVENT_IGNORED, D_FREE_LEAKS,
    D_MEM_INFO_ALWAYS_FREE, D_MEM_INFO_DOUBLE_TOTAL, D_BAD_FREE_OK, D_NEVER_DONE, D_COPY_LARGE_SHORT, D_ADD_ONE,
    D_GEMM_DROP_LAST, D_REDUCE_REMAINDER, D_BROADCAST_FAST_PATH, D_SUBNORMAL_FLUSH, D_BOOL_FF, D_KERNELS_AT_ONCE,
    D_QUERY_LAST_ITEM, D_QUERY_IGNORES_KERNELS, D_EVENT_FIRST_RECORD, D_ELAPSED_FIRST_RECORD, D_ELAPSED_CLOCK,
    D_WAIT_LATEST_RECORD, D_MEM_INFO_PEAK, D_MEM_INFO_DRIFT, D_PEER_AT_ONCE, D_PEER_BURST,
    D_AVG_FLOAT32, D_SPLIT_WORLD_SIZE, D_GROUP_LAST_ONLY, D_FIRST_OP_STREAM, D_ABORT_SILENT, D_NAN_IDENTITY,
    D_LATE_ROOT, D_LATE_REDOP, D_SWAP_SAME_PEER, D_COUNT
};
static const char *const defects[D_COUNT] = {
    "none", "bf16_truncate", "fp16_truncate", "int8_saturate", "tail8", "tail4", "last_chunk", "skip_repeat",
    "skip_same_recv", "no_stream_wait", "reduce_inplace_clobber", "recv_any_source", "query_always_done",
    "event_query_always_done", "elapsed_zero", "elapsed_seconds", "wait_event_ignored", "free_leaks",
    "mem_info_always_free", "mem_info_double_total", "bad_free_ok", "never_done", "copy_large_short", "add_one",
    "gemm_drop_last", "reduce_remainder", "broadcast_fast_path", "subnormal_flush", "bool_ff", "kernels_at_once",
    "query_last_item", "query_ignores_kernels", "event_first_record", "elapsed_first_record", "elapsed_clock",
    "wait_latest_record", "mem_info_peak", "mem_info_drift", "peer_at_once", "peer_burst",
    "avg_float32", "split_world_size", "group_last_only", "first_op_stream", "abort_silent", "nan_identity",
    "late_root", "late_redop", "swap_same_peer"
};
static int defect = D_NONE;
static size_t chunk = 1u << 20;

static anychip_status read_defect(void) {
    const char *v = getenv("MUTANT_DEFECT");
    defect = -1;
    for (int i = 0; i < D_COUNT && v && *v; i++)
        if (!strcmp(v, defects[i])) defect = i;
    if (!v || !*v) defect = D_NONE;
    if (defect < 0) return fail(S_INVALID, "MUTANT_DEFECT=%s is not a defect this library knows", v);
    long c = env_long("MUTANT_CHUNK", 1 << 20, 4096, 64 << 20);
    chunk = (size_t)c;
    return S_OK;
}

/* ---- device API defects ----------------------------------------------------------------- */
static anychip_status mutant_stream_query(int d, anychip_stream s) {
    if (s && (defect == D_QUERY_LAST_ITEM || defect == D_QUERY_IGNORES_KERNELS)) {
        pthread_mutex_lock(&s->lock);
        int idle = s->completed + 1 >= s->enqueued;       /* query_last_item: the running item counts as done */
        if (defect == D_QUERY_IGNORES_KERNELS) {           /* only copies, fills and event tasks count */
            idle = 1;
            for (task *t = s->head; t; t = t->next) idle &= t->kind == T_KERNEL;
        }
        pthread_mutex_unlock(&s->lock);
        return idle ? S_OK : S_NOT_READY;
    }
    anychip_status rc = base.stream_query(d, s);
    if (defect == D_NEVER_DONE && rc == S_OK) return S_NOT_READY;
    return defect == D_QUERY_ALWAYS_DONE && rc == S_NOT_READY ? S_OK : rc;
}

static anychip_status mutant_event_query(int d, anychip_event e) {
    if (e && defect == D_EVENT_FIRST_RECORD) {           /* complete once any record completed */
        pthread_mutex_lock(&e->lock);
        int done = e->completed >= 1 || e->recorded == 0;
        pthread_mutex_unlock(&e->lock);
        return done ? S_OK : S_NOT_READY;
    }
    anychip_status rc = base.event_query(d, e);
    if (defect == D_NEVER_DONE && rc == S_OK) return S_NOT_READY;
    return defect == D_EVENT_QUERY_ALWAYS_DONE && rc == S_NOT_READY ? S_OK : rc;
}

/* elapsed_first_record: when each event's first record completed */
#define MAX_FIRSTS 1024
static struct { anychip_event e; struct timespec when; } firsts[MAX_FIRSTS];
static int nfirsts;
static pthread_mutex_t firsts_lock = PTHREAD_MUTEX_INITIALIZER;

static anychip_status mutant_event_record(int d, anychip_event e, anychip_stream s) {
    if (e && defect == D_ELAPSED_FIRST_RECORD) {
        pthread_mutex_lock(&firsts_lock);
        pthread_mutex_lock(&e->lock);
        int known = 0;
        for (int i = 0; i < nfirsts; i++) known |= firsts[i].e == e;
        if (!known && e->completed >= 1 && nfirsts < MAX_FIRSTS) {
            firsts[nfirsts].e = e;
            firsts[nfirsts++].when = e->when;
        }
        pthread_mutex_unlock(&e->lock);
        pthread_mutex_unlock(&firsts_lock);
    }
    return base.event_record(d, e, s);
}

static anychip_status mutant_elapsed(int d, float *ms, anychip_event a, anychip_event b) {
    anychip_status rc = base.event_elapsed_ms(d, ms, a, b);
    if (rc == S_OK && defect == D_ELAPSED_FIRST_RECORD) {
        pthread_mutex_lock(&firsts_lock);
        for (int i = 0; i < nfirsts; i++)
            if (firsts[i].e == a)
                *ms = (float)((double)(b->when.tv_sec - firsts[i].when.tv_sec) * 1e3 +
                              (double)(b->when.tv_nsec - firsts[i].when.tv_nsec) / 1e6);
        pthread_mutex_unlock(&firsts_lock);
    }
    if (rc == S_OK && defect == D_ELAPSED_CLOCK) *ms *= 1.25f;
    if (rc == S_OK && defect == D_ELAPSED_ZERO) *ms = 0.0f;
    if (rc == S_OK && defect == D_ELAPSED_SECONDS) *ms /= 1000.0f;
    return rc;
}

/* wait_latest_record: a stream's wait is bound when its next copy is queued */
static struct { anychip_stream s; anychip_event e; } lazy_waits[64];
static pthread_mutex_t lazy_lock = PTHREAD_MUTEX_INITIALIZER;

static anychip_status mutant_wait_event(int d, anychip_stream s, anychip_event e) {
    if (defect == D_WAIT_LATEST_RECORD) {
        pthread_mutex_lock(&lazy_lock);
        for (int i = 0; i < 64; i++)
            if (!lazy_waits[i].s || lazy_waits[i].s == s) {
                lazy_waits[i].s = s;
                lazy_waits[i].e = e;
                break;
            }
        pthread_mutex_unlock(&lazy_lock);
        return S_OK;
    }
    return defect == D_WAIT_EVENT_IGNORED ? S_OK : base.stream_wait_event(d, s, e);
}

static anychip_status bind_lazy_wait(int d, anychip_stream s) {
    anychip_event e = NULL;
    pthread_mutex_lock(&lazy_lock);
    for (int i = 0; i < 64; i++)
        if (lazy_waits[i].s == s) {
            e = lazy_waits[i].e;
            lazy_waits[i].s = NULL;
        }
    pthread_mutex_unlock(&lazy_lock);
    return e ? base.stream_wait_event(d, s, e) : S_OK;
}

static size_t copied(size_t n) {
    return defect == D_COPY_LARGE_SHORT && n > (2u << 20) ? n - 1 : n;
}

static anychip_status mutant_copy(int d, void *dst, const void *src, size_t n, anychip_copy_kind kind) {
    return base.copy(d, dst, src, copied(n), kind);
}

static anychip_status mutant_copy_async(int d, void *dst, const void *src, size_t n, anychip_copy_kind kind,
                                        anychip_stream s) {
    if (defect == D_WAIT_LATEST_RECORD) {
        anychip_status rc = bind_lazy_wait(d, s);
        if (rc) return rc;
    }
    return copy_async(d, dst, src, copied(n), kind, s);
}

/* device memory is host memory: a peer copy is a copy on the source device's stream */
static anychip_status mutant_copy_peer(int dd, void *dst, int sd, const void *src, size_t n, anychip_stream s) {
    DEVICE(ddev, dd);
    DEVICE(sdev, sd);
    if (!valid_range(ddev, dst, n) || !valid_range(sdev, src, n))
        return fail(S_BAD_POINTER, "copy_peer: %zu bytes from device %d to device %d out of range", n, sd, dd);
    if (defect == D_PEER_BURST) n &= ~(size_t)63;
    if (n == 0) return S_OK;
    if (defect == D_PEER_AT_ONCE) {
        memmove(dst, src, n);
        return S_OK;
    }
    return enqueue(s, (task){.kind = T_COPY, .dst = dst, .src = src, .n = n});
}

static anychip_status mutant_alloc(int d, size_t nbytes, void **ptr) {
    anychip_status rc = base.mem_alloc(d, nbytes, ptr);
    if (rc == S_OK && defect == D_MEM_INFO_DRIFT) {     /* the padding counted twice, freed once */
        DEVICE(dev, d);
        size_t size = nbytes ? (nbytes + 255) & ~(size_t)255 : 256;
        pthread_mutex_lock(&dev->lock);
        dev->used += size - nbytes;
        pthread_mutex_unlock(&dev->lock);
    }
    return rc;
}

static anychip_status mutant_free(int d, void *ptr) {
    DEVICE(dev, d);
    if (defect == D_FREE_LEAKS) {        /* the memory goes, the capacity it held is not given back */
        pthread_mutex_lock(&dev->lock);
        size_t held = 0;
        for (size_t i = 0; i < dev->nallocs; i++)
            if (dev->allocs[i].base == (uintptr_t)ptr) held = dev->allocs[i].size;
        pthread_mutex_unlock(&dev->lock);
        anychip_status rc = base.mem_free(d, ptr);
        if (rc == S_OK) {
            pthread_mutex_lock(&dev->lock);
            dev->used += held;
            pthread_mutex_unlock(&dev->lock);
        }
        return rc;
    }
    anychip_status rc = base.mem_free(d, ptr);
    return defect == D_BAD_FREE_OK && rc == S_BAD_POINTER ? S_OK : rc;
}

static anychip_status mutant_mem_info(int d, size_t *free_bytes, size_t *total) {
    anychip_status rc = base.mem_info(d, free_bytes, total);
    static size_t peak[MAX_DEVICES];
    if (rc == S_OK && defect == D_MEM_INFO_PEAK && d >= 0 && d < MAX_DEVICES) {
        if (*total - *free_bytes > peak[d]) peak[d] = *total - *free_bytes;
        *free_bytes = *total - peak[d];
    }
    if (rc == S_OK && defect == D_MEM_INFO_ALWAYS_FREE) *free_bytes = *total;
    if (rc == S_OK && defect == D_MEM_INFO_DOUBLE_TOTAL) {
        *free_bytes += *total;
        *total *= 2;
    }
    return rc;
}

/* ---- communicators over shared memory ---------------------------------------------------- */
typedef struct {
    _Atomic uint64_t seq[MAX_RANKS];                     /* barriers each rank has reached */
    _Atomic int32_t pid[MAX_RANKS];
    _Atomic uint64_t want[MAX_RANKS];                    /* bytes of a rank's longest p2p stream */
    _Atomic int32_t aborted;                             /* 1 + the rank that aborted, 0 while none did */
} shm_header;

typedef struct { const void *send; void *recv; size_t bytes; int peer; } p2p_op;

struct anychip_comm_s {
    int device, nranks, rank;
    shm_header *hdr;
    char *slots;                                         /* nranks slots of `chunk` bytes */
    char *mail;                                          /* nranks x nranks mailboxes of `chunk` bytes */
    size_t size;
    double timeout;
    struct { int kind; const void *send; void *recv; size_t count; int dtype, op; } last;
    anychip_stream first_stream;                         /* first_op_stream: the stream of the first op */
};

/* a barrier fails once a rank aborted the communicator (shm_group.h) */
#define SHM_ABORTED(c) atomic_load(&(c)->hdr->aborted)
static int world_nranks;                                 /* split_world_size: the first communicator's */
static __thread int group_depth;

#include "shm_group.h"

static anychip_status comm_init_rank(int d, int nranks, const anychip_unique_id *id, int rank, anychip_comm *out) {
    if (nranks < 1 || nranks > MAX_RANKS) return fail(S_INVALID, "1 to %d ranks, not %d", MAX_RANKS, nranks);
    anychip_comm c = calloc(1, sizeof *c);
    if (!c) return fail(S_SYSTEM, "out of host memory");
    c->device = d;
    c->nranks = nranks;
    c->rank = rank;
    c->last.kind = -1;
    if (!world_nranks) world_nranks = nranks;
    c->size = sizeof(shm_header) + (size_t)nranks * chunk + (size_t)nranks * (size_t)nranks * chunk;
    anychip_status rc = shm_map(c, id);
    if (rc) {
        free(c);
        return rc;
    }
    c->slots = (char *)c->hdr + sizeof(shm_header);
    c->mail = c->slots + (size_t)nranks * chunk;
    *out = c;
    return S_OK;
}

static anychip_status comm_destroy(anychip_comm c) {
    if (c->hdr) munmap(c->hdr, c->size);
    free(c);
    return S_OK;
}

/* the peers' barriers fail, naming this rank (abort_silent: they are not told) */
static anychip_status comm_abort(anychip_comm c) {
    if (defect != D_ABORT_SILENT && c->hdr) atomic_store(&c->hdr->aborted, c->rank + 1);
    return comm_destroy(c);
}

/* ---- reductions ---------------------------------------------------------------------------- */
static float to_float(const void *p, anychip_dtype t) {
    uint16_t h;
    memcpy(&h, p, 2);
    return t == ANYCHIP_FLOAT16 ? half_to_float(h) : bf16_to_float(h);
}

static void from_float(void *p, float f, anychip_dtype t) {
    uint16_t h;
    uint32_t x;
    memcpy(&x, &f, 4);
    if (t == ANYCHIP_FLOAT16) {
        uint32_t ax = x & 0x7fffffffu;
        if (defect == D_FP16_TRUNCATE && ax >= 0x38800000u && ax < 0x477ff000u)
            h = (uint16_t)(((x >> 16) & 0x8000u) | ((ax - (112u << 23)) >> 13));
        else
            h = float_to_half(f);
    } else {
        h = defect == D_BF16_TRUNCATE ? (uint16_t)(x >> 16) : float_to_bf16(f);
    }
    memcpy(p, &h, 2);
}

#define COMBINE(a, b) (op == ANYCHIP_MIN ? ((b) < (a) ? (b) : (a)) : op == ANYCHIP_MAX ? ((b) > (a) ? (b) : (a)) : \
                       op == ANYCHIP_PROD ? (a) * (b) : (a) + (b))

/* acc[i] = acc[i] (op) v[i] for n elements; unsigned arithmetic wraps as the types do */
static void combine(void *acc, const void *v, size_t n, anychip_dtype t, anychip_redop op) {
    if (defect == D_TAIL8 && dtype_size(t) == 1) n -= n % 8;
    if (defect == D_TAIL4 && dtype_size(t) == 2) n -= n % 4;
    switch (t) {
    case ANYCHIP_INT8:
    case ANYCHIP_UINT8:
        for (size_t i = 0; i < n; i++) {
            int a = t == ANYCHIP_INT8 ? ((int8_t *)acc)[i] : ((uint8_t *)acc)[i];
            int b = t == ANYCHIP_INT8 ? ((const int8_t *)v)[i] : ((const uint8_t *)v)[i];
            int r = (op == ANYCHIP_SUM || op == ANYCHIP_AVG) ? a + b : COMBINE(a, b);
            if (defect == D_INT8_SATURATE && (op == ANYCHIP_SUM || op == ANYCHIP_AVG)) {
                int lo = t == ANYCHIP_INT8 ? -128 : 0, hi = t == ANYCHIP_INT8 ? 127 : 255;
                r = r < lo ? lo : r > hi ? hi : r;
            }
            ((uint8_t *)acc)[i] = (uint8_t)(r & 0xff);
        }
        break;
    case ANYCHIP_INT32:
        for (size_t i = 0; i < n; i++) {
            int32_t a = ((int32_t *)acc)[i], b = ((const int32_t *)v)[i];
            ((int32_t *)acc)[i] = op == ANYCHIP_MIN || op == ANYCHIP_MAX ? COMBINE(a, b) :
                (int32_t)(op == ANYCHIP_PROD ? (uint32_t)a * (uint32_t)b : (uint32_t)a + (uint32_t)b);
        }
        break;
    case ANYCHIP_INT64:
        for (size_t i = 0; i < n; i++) {
            int64_t a = ((int64_t *)acc)[i], b = ((const int64_t *)v)[i];
            ((int64_t *)acc)[i] = op == ANYCHIP_MIN || op == ANYCHIP_MAX ? COMBINE(a, b) :
                (int64_t)(op == ANYCHIP_PROD ? (uint64_t)a * (uint64_t)b : (uint64_t)a + (uint64_t)b);
        }
        break;
    case ANYCHIP_FLOAT16:
    case ANYCHIP_BFLOAT16:
        for (size_t i = 0; i < n; i++) {
            float a = to_float((char *)acc + 2 * i, t), b = to_float((const char *)v + 2 * i, t);
            from_float((char *)acc + 2 * i, COMBINE(a, b), t);
        }
        break;
    case ANYCHIP_FLOAT32:
        for (size_t i = 0; i < n; i++) ((float *)acc)[i] = COMBINE(((float *)acc)[i], ((const float *)v)[i]);
        break;
    default:
        for (size_t i = 0; i < n; i++) ((double *)acc)[i] = COMBINE(((double *)acc)[i], ((const double *)v)[i]);
    }
}

/* avg: the sum divided by the rank count */
static void divide(void *acc, size_t n, anychip_dtype t, int by) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case ANYCHIP_INT8: ((int8_t *)acc)[i] = (int8_t)(((int8_t *)acc)[i] / by); break;
        case ANYCHIP_UINT8: ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] / by); break;
        case ANYCHIP_INT32:
            if (defect == D_AVG_FLOAT32) ((int32_t *)acc)[i] = (int32_t)((float)((int32_t *)acc)[i] / (float)by);
            else ((int32_t *)acc)[i] /= by;
            break;
        case ANYCHIP_INT64:
            if (defect == D_AVG_FLOAT32) ((int64_t *)acc)[i] = (int64_t)((float)((int64_t *)acc)[i] / (float)by);
            else ((int64_t *)acc)[i] /= by;
            break;
        case ANYCHIP_FLOAT16:
        case ANYCHIP_BFLOAT16: from_float((char *)acc + 2 * i, to_float((char *)acc + 2 * i, t) / (float)by, t); break;
        case ANYCHIP_FLOAT32: ((float *)acc)[i] /= (float)by; break;
        default: ((double *)acc)[i] /= by;
        }
    }
}

/* the reduction of every rank's slot into out (n elements) */
static void reduce_slots(anychip_comm c, void *out, size_t n, anychip_dtype t, anychip_redop op) {
    size_t bytes = n * dtype_size(t);
    char *tmp = malloc(bytes ? bytes : 1);
    memcpy(tmp, c->slots, bytes);
    int from = 1;
    if (defect == D_NAN_IDENTITY && (op == ANYCHIP_MIN || op == ANYCHIP_MAX) &&
        (t == ANYCHIP_FLOAT32 || t == ANYCHIP_FLOAT64)) {  /* start from the identity, compare with < / > */
        for (size_t i = 0; i < n; i++) {
            if (t == ANYCHIP_FLOAT32) ((float *)tmp)[i] = op == ANYCHIP_MAX ? -INFINITY : INFINITY;
            else ((double *)tmp)[i] = op == ANYCHIP_MAX ? -INFINITY : INFINITY;
        }
        from = 0;
    }
    for (int r = from; r < c->nranks; r++) combine(tmp, c->slots + (size_t)r * chunk, n, t, op);
    if (op == ANYCHIP_AVG) divide(tmp, n, t, defect == D_SPLIT_WORLD_SIZE ? world_nranks : c->nranks);
    if (defect == D_TAIL8 && dtype_size(t) == 1) bytes -= (n % 8);
    if (defect == D_TAIL4 && dtype_size(t) == 2) bytes -= (n % 4) * 2;
    memcpy(out, tmp, bytes);
    free(tmp);
}

/* ---- the ops ------------------------------------------------------------------------------ */
/* bytes processed of a message of `bytes` (last_chunk: a last partial chunk is dropped) */
static size_t span(size_t bytes) {
    return defect == D_LAST_CHUNK && bytes > chunk ? bytes - bytes % chunk : bytes;
}

/* before an op: the stream's earlier work done; and whether to skip it as a repeat */
static anychip_status begin(anychip_comm c, anychip_stream s, int kind, const void *send, void *recv, size_t count,
                            int dtype, int op, int *skip) {
    *skip = 0;
    if ((defect == D_SKIP_REPEAT && kind == 0 && c->last.kind == 0 && c->last.send == send &&
         c->last.recv == recv && c->last.count == count && c->last.dtype == dtype && c->last.op == op) ||
        (defect == D_SKIP_SAME_RECV && c->last.kind == kind && c->last.recv == recv &&
         c->last.count * dtype_size((anychip_dtype)c->last.dtype) == count * dtype_size((anychip_dtype)dtype)))
        *skip = 1;
    c->last.kind = kind;
    c->last.send = send;
    c->last.recv = recv;
    c->last.count = count;
    c->last.dtype = dtype;
    c->last.op = op;
    if (!c->first_stream) c->first_stream = s;
    if (defect == D_FIRST_OP_STREAM) s = c->first_stream;
    return defect == D_NO_STREAM_WAIT ? S_OK : base.stream_synchronize(c->device, s);
}

/* the reduce op of the chunk at element `at` (late_redop: sum past the first chunk) */
static anychip_redop late_op(anychip_redop op, size_t at) {
    return defect == D_LATE_REDOP && at ? ANYCHIP_SUM : op;
}

static anychip_status reduce_to(anychip_comm c, const void *send, void *recv, size_t count, anychip_dtype t,
                                anychip_redop op, int root, anychip_stream s, int kind) {
    size_t size = dtype_size(t), per = chunk / size, todo = span(count * size) / size;
    int skip;
    anychip_status rc = begin(c, s, kind, send, recv, count, t, op, &skip);
    int writes = root < 0 || c->rank == root || (defect == D_REDUCE_INPLACE_CLOBBER && send == recv);
    for (size_t at = 0; rc == S_OK && !skip && at < todo; at += per) {
        size_t n = todo - at < per ? todo - at : per;
        memcpy(c->slots + (size_t)c->rank * chunk, (const char *)send + at * size, n * size);
        if ((rc = barrier(c))) break;
        if (writes) reduce_slots(c, (char *)recv + at * size, n, t, late_op(op, at));
        rc = barrier(c);
    }
    return rc;
}

/* group_last_only: the all_reduces of a group share one slot, run at the group's end */
static __thread struct { int set; const void *send; void *recv; size_t count; anychip_dtype t; anychip_redop op;
                         anychip_comm c; anychip_stream s; } grouped;

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                                 anychip_comm c, anychip_stream s) {
    if (defect == D_GROUP_LAST_ONLY && group_depth > 0) {
        grouped.set = 1, grouped.send = send, grouped.recv = recv, grouped.count = count;
        grouped.t = t, grouped.op = op, grouped.c = c, grouped.s = s;
        return S_OK;
    }
    return reduce_to(c, send, recv, count, t, op, -1, s, 0);
}

static anychip_status reduce(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                             int root, anychip_comm c, anychip_stream s) {
    if (root < 0 || root >= c->nranks) return fail(S_INVALID, "reduce: root %d of %d ranks", root, c->nranks);
    return reduce_to(c, send, recv, count, t, op, root, s, 1);
}

static anychip_status reduce_scatter(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                                     anychip_comm c, anychip_stream s) {
    size_t size = dtype_size(t), per = chunk / size, todo = span(count * size) / size;
    int skip;
    anychip_status rc = begin(c, s, 2, send, recv, count, t, op, &skip);
    for (int q = 0; q < c->nranks && !skip; q++) {
        for (size_t at = 0; rc == S_OK && at < todo; at += per) {
            size_t n = todo - at < per ? todo - at : per;
            memcpy(c->slots + (size_t)c->rank * chunk, (const char *)send + ((size_t)q * count + at) * size, n * size);
            if ((rc = barrier(c))) break;
            if (c->rank == q) reduce_slots(c, (char *)recv + at * size, n, t, late_op(op, at));
            rc = barrier(c);
        }
    }
    return rc;
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype t, int root,
                                anychip_comm c, anychip_stream s) {
    size_t bytes = span(count * dtype_size(t));
    if (root < 0 || root >= c->nranks) return fail(S_INVALID, "broadcast: root %d of %d ranks", root, c->nranks);
    int skip;
    anychip_status rc = begin(c, s, 3, send, recv, count, t, root, &skip);
    for (size_t at = 0; rc == S_OK && !skip && at < bytes; at += chunk) {
        size_t n = bytes - at < chunk ? bytes - at : chunk;
        if (c->rank == (defect == D_LATE_ROOT && at ? 0 : root)) memcpy(c->slots, (const char *)send + at, n);
        if ((rc = barrier(c))) break;
        memmove((char *)recv + at, c->slots, n);
        rc = barrier(c);
    }
    return rc;
}

static anychip_status all_gather(const void *send, void *recv, size_t count, anychip_dtype t, anychip_comm c,
                                 anychip_stream s) {
    size_t full = count * dtype_size(t), bytes = span(full);
    int skip;
    anychip_status rc = begin(c, s, 4, send, recv, count, t, 0, &skip);
    for (size_t at = 0; rc == S_OK && !skip && at < bytes; at += chunk) {
        size_t n = bytes - at < chunk ? bytes - at : chunk;
        memcpy(c->slots + (size_t)c->rank * chunk, (const char *)send + at, n);
        if ((rc = barrier(c))) break;
        for (int r = 0; r < c->nranks; r++) memcpy((char *)recv + (size_t)r * full + at, c->slots + (size_t)r * chunk, n);
        rc = barrier(c);
    }
    return rc;
}

static char *mailbox(anychip_comm c, int src, int dst) {
    return c->mail + ((size_t)src * (size_t)c->nranks + (size_t)dst) * chunk;
}

/* every rank's sends and receives of one group: per peer, the messages form one stream of bytes,
   moved in rounds of `chunk` bytes (as many rounds as the longest stream of any rank needs) */
static anychip_status exchange(anychip_comm c, const p2p_op *ops, int nops) {
    size_t out_len[MAX_RANKS] = {0}, in_len[MAX_RANKS] = {0}, longest = 0;
    int from[MAX_RANKS];                               /* stream whose bytes a receive from peer p takes */
    for (int p = 0; p < c->nranks; p++) from[p] = p;
    if (defect == D_RECV_ANY_SOURCE) {                  /* receives take the senders in the order they come */
        int k = 0, order[MAX_RANKS];
        for (int i = 0; i < nops; i++)
            if (!ops[i].send) {
                int seen = 0;
                for (int j = 0; j < k; j++) seen |= order[j] == ops[i].peer;
                if (!seen) order[k++] = ops[i].peer;
            }
        int sorted[MAX_RANKS];
        memcpy(sorted, order, sizeof(int) * (size_t)k);
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++)
                if (sorted[b] < sorted[a]) { int x = sorted[a]; sorted[a] = sorted[b]; sorted[b] = x; }
        for (int j = 0; j < k; j++) from[order[j]] = sorted[j];
    }
    for (int i = 0; i < nops; i++) {
        size_t *len = ops[i].send ? &out_len[ops[i].peer] : &in_len[ops[i].peer];
        *len += ops[i].bytes;
        if (*len > longest) longest = *len;
    }
    atomic_store(&c->hdr->want[c->rank], longest);
    anychip_status rc = barrier(c);
    for (int r = 0; r < c->nranks; r++)
        if (atomic_load(&c->hdr->want[r]) > longest) longest = atomic_load(&c->hdr->want[r]);
    if (rc == S_OK) rc = barrier(c);                   /* every rank has read every want */
    for (size_t at = 0; rc == S_OK && at < longest; at += chunk) {
        size_t pos[MAX_RANKS] = {0};
        for (int i = 0; i < nops; i++) {               /* this round's bytes of each outgoing stream */
            if (!ops[i].send) continue;
            int p = ops[i].peer;
            size_t lo = pos[p], hi = pos[p] + ops[i].bytes;
            pos[p] = hi;
            size_t a = lo > at ? lo : at, b = hi < at + chunk ? hi : at + chunk;
            if (a < b) memcpy(mailbox(c, c->rank, p) + (a - at), (const char *)ops[i].send + (a - lo), b - a);
        }
        if ((rc = barrier(c))) break;
        memset(pos, 0, sizeof pos);
        for (int k = 0; k < nops; k++) {
            int i = defect == D_SWAP_SAME_PEER ? nops - 1 - k : k;   /* receives of one peer in reverse */
            if (ops[i].send) continue;
            int p = ops[i].peer, q = from[p];
            size_t lo = pos[p], hi = pos[p] + ops[i].bytes;
            pos[p] = hi;
            size_t a = lo > at ? lo : at, b = hi < at + chunk ? hi : at + chunk;
            if (a < b) memcpy((char *)ops[i].recv + (a - lo), mailbox(c, q, c->rank) + (a - at), b - a);
        }
        rc = barrier(c);
    }
    return rc;
}

static anychip_status all_to_all(const void *send, void *recv, size_t count, anychip_dtype t, anychip_comm c,
                                 anychip_stream s) {
    size_t bytes = span(count * dtype_size(t));
    int skip;
    anychip_status rc = begin(c, s, 5, send, recv, count, t, 0, &skip);
    if (rc || skip) return rc;
    p2p_op ops[2 * MAX_RANKS];
    char *staged = NULL;
    size_t stride = count * dtype_size(t);
    if (send == recv) {                                /* in place: send from a copy */
        staged = malloc(stride * (size_t)c->nranks + 1);
        if (!staged) return fail(S_SYSTEM, "out of host memory");
        memcpy(staged, send, stride * (size_t)c->nranks);
        send = staged;
    }
    for (int p = 0; p < c->nranks; p++) {
        ops[2 * p] = (p2p_op){(const char *)send + (size_t)p * stride, NULL, bytes, p};
        ops[2 * p + 1] = (p2p_op){NULL, (char *)recv + (size_t)p * stride, bytes, p};
    }
    rc = exchange(c, ops, 2 * c->nranks);
    free(staged);
    return rc;
}

/* groups: sends and receives are collected per thread and exchanged at the end of the group */
static __thread struct { anychip_comm comm; anychip_stream stream; int n; p2p_op ops[MAX_P2P]; } pending;

static anychip_status group_start(void) {
    group_depth++;
    return S_OK;
}

static anychip_status flush(void) {
    anychip_status rc = S_OK;
    if (pending.n && pending.comm) {
        int skip;
        rc = begin(pending.comm, pending.stream, 6, NULL, NULL, 0, 0, 0, &skip);
        if (rc == S_OK) rc = exchange(pending.comm, pending.ops, pending.n);
    }
    pending.n = 0;
    pending.comm = NULL;
    return rc;
}

static anychip_status group_end(void) {
    if (group_depth == 0) return fail(S_INVALID, "group_end without group_start");
    if (--group_depth) return S_OK;
    if (grouped.set) {
        grouped.set = 0;
        anychip_status rc = reduce_to(grouped.c, grouped.send, grouped.recv, grouped.count, grouped.t, grouped.op, -1,
                                      grouped.s, 0);
        if (rc) return rc;
    }
    return flush();
}

static anychip_status queue_p2p(const void *send, void *recv, size_t count, anychip_dtype t, int peer, anychip_comm c,
                                anychip_stream s) {
    if (peer < 0 || peer >= c->nranks) return fail(S_INVALID, "peer %d of %d ranks", peer, c->nranks);
    if (pending.n == MAX_P2P || (pending.comm && pending.comm != c))
        return fail(S_INVALID, "at most %d sends and receives of one communicator per group", MAX_P2P);
    pending.comm = c;
    pending.stream = s;
    pending.ops[pending.n++] = (p2p_op){send, recv, count * dtype_size(t), peer};
    return group_depth ? S_OK : flush();
}

static anychip_status p2p_send(const void *send, size_t count, anychip_dtype t, int peer, anychip_comm c,
                               anychip_stream s) {
    return queue_p2p(send, NULL, count, t, peer, c, s);
}

static anychip_status p2p_recv(void *recv, size_t count, anychip_dtype t, int peer, anychip_comm c, anychip_stream s) {
    return queue_p2p(NULL, recv, count, t, peer, c, s);
}

/* ---- kernel table defects ------------------------------------------------------------------ */
/* A defect of values is planted after the scaffold's kernel has run: the entry waits for its stream
 * (which keeps stream order) and rewrites the output in place (the device memory is host memory). */
#define MAX_DIMS ANYCHIP_KERNEL_MAX_DIMS

static int is_float(anychip_dtype t) { return t >= ANYCHIP_FLOAT16 && t <= ANYCHIP_FLOAT64; }

/* the element count of a shape the kernel took (so no dimension is negative) */
static int64_t count_of(int ndim, const int64_t *shape) {
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) count *= shape[i];
    return count;
}

static double min_normal(anychip_dtype t) {
    return t == ANYCHIP_FLOAT16 ? 0x1p-14 : t == ANYCHIP_FLOAT64 ? 0x1p-1022 : 0x1p-126;
}

/* the element at p of float dtype t, as a double */
static double float_at(const char *p, anychip_dtype t) {
    float f;
    double d;
    if (t == ANYCHIP_FLOAT16 || t == ANYCHIP_BFLOAT16) return to_float(p, t);
    if (t == ANYCHIP_FLOAT32) return memcpy(&f, p, 4), f;
    return memcpy(&d, p, 8), d;
}

/* add_one: the element at p of dtype t one more (integers wrap; floats round to t) */
static void add_one(char *p, anychip_dtype t) {
    uint16_t h;
    uint32_t u32;
    uint64_t u64;
    float f;
    double d;
    switch (t) {
    case ANYCHIP_INT8: case ANYCHIP_UINT8: *(unsigned char *)p += 1; break;
    case ANYCHIP_INT32: memcpy(&u32, p, 4); u32++; memcpy(p, &u32, 4); break;
    case ANYCHIP_INT64: memcpy(&u64, p, 8); u64++; memcpy(p, &u64, 8); break;
    case ANYCHIP_FLOAT16: h = float_to_half(to_float(p, t) + 1.0f); memcpy(p, &h, 2); break;
    case ANYCHIP_BFLOAT16: h = float_to_bf16(to_float(p, t) + 1.0f); memcpy(p, &h, 2); break;
    case ANYCHIP_FLOAT32: memcpy(&f, p, 4); f = (float)((double)f + 1.0); memcpy(p, &f, 4); break;
    case ANYCHIP_FLOAT64: memcpy(&d, p, 8); d += 1.0; memcpy(p, &d, 8); break;
    default: break;
    }
}

/* subnormal_flush: a subnormal float element becomes a zero of its sign */
static void flush_subnormal(char *p, anychip_dtype t) {
    double v = float_at(p, t);
    if (v == 0.0 || !(fabs(v) < min_normal(t))) return;
    uint16_t h = signbit(v) ? 0x8000 : 0;
    float f = signbit(v) ? -0.0f : 0.0f;
    double d = signbit(v) ? -0.0 : 0.0;
    if (t == ANYCHIP_FLOAT16 || t == ANYCHIP_BFLOAT16) memcpy(p, &h, 2);
    else if (t == ANYCHIP_FLOAT32) memcpy(p, &f, 4);
    else memcpy(p, &d, 8);
}

static anychip_status corrupt(int d, anychip_stream s, anychip_status rc, void *out, int64_t count, anychip_dtype t,
                              int added) {
    int flush = defect == D_SUBNORMAL_FLUSH && is_float(t), ff = defect == D_BOOL_FF && t == ANYCHIP_BOOL;
    if (rc || count <= 0 || !(added || flush || ff)) return rc;
    if ((rc = base.stream_synchronize(d, s))) return rc;
    for (int64_t e = 0; e < count; e++) {
        char *p = (char *)out + e * ITEM[t];
        if (added) add_one(p, t);
        if (flush) flush_subnormal(p, t);
        if (ff && *p) *p = (char)0xFF;
    }
    return S_OK;
}

/* kernels_at_once: the kernel runs on a stream of its own, at once, whatever is queued on `s` */
static anychip_stream at_once[64];
static pthread_mutex_t at_once_lock = PTHREAD_MUTEX_INITIALIZER;

static anychip_stream kernel_stream(int d, anychip_stream s) {
    if (defect != D_KERNELS_AT_ONCE || d < 0 || d >= 64) return s;
    pthread_mutex_lock(&at_once_lock);
    if (!at_once[d] && base.stream_create(d, &at_once[d])) at_once[d] = NULL;
    anychip_stream own = at_once[d];
    pthread_mutex_unlock(&at_once_lock);
    return own ? own : s;
}

static anychip_status at_once_done(int d, anychip_stream s, anychip_stream ran, anychip_status rc) {
    return rc || ran == s ? rc : base.stream_synchronize(d, ran);
}

static anychip_status mutant_binary(int d, anychip_stream s, anychip_binary_op op, anychip_dtype t, int ndim,
                                    const int64_t *shape, void *out, const void *a, const int64_t *as, const void *b,
                                    const int64_t *bs) {
    int64_t zeros[MAX_DIMS] = {0};
    if (defect == D_BROADCAST_FAST_PATH && ndim > 0 && ndim <= MAX_DIMS && bs[ndim - 1] == 0 && shape[ndim - 1] > 1)
        bs = zeros;                                   /* "stride 0 last: a scalar" */
    anychip_stream k = kernel_stream(d, s);
    anychip_status rc = at_once_done(d, s, k, KERNELS.binary(d, k, op, t, ndim, shape, out, a, as, b, bs));
    int compare = op >= ANYCHIP_OP_EQ && op <= ANYCHIP_OP_GE;
    return corrupt(d, s, rc, out, rc ? 0 : count_of(ndim, shape), compare ? ANYCHIP_BOOL : t,
                   defect == D_ADD_ONE && op == ANYCHIP_OP_ADD);
}

static anychip_status mutant_unary(int d, anychip_stream s, anychip_unary_op op, anychip_dtype out_t,
                                   anychip_dtype in_t, int ndim, const int64_t *shape, void *out, const void *x,
                                   const int64_t *xs) {
    anychip_stream k = kernel_stream(d, s);
    anychip_status rc = at_once_done(d, s, k, KERNELS.unary(d, k, op, out_t, in_t, ndim, shape, out, x, xs));
    return corrupt(d, s, rc, out, rc ? 0 : count_of(ndim, shape), out_t, 0);
}

static anychip_status mutant_reduce(int d, anychip_stream s, anychip_reduce_op op, anychip_dtype out_t,
                                    anychip_dtype in_t, int64_t outer, int64_t n, int64_t inner, void *out,
                                    const void *x) {
    anychip_stream k = kernel_stream(d, s);
    anychip_status rc = S_OK;
    if (defect == D_REDUCE_REMAINDER && n > 16 && n % 16 && outer >= 0 && inner >= 0) {
        for (int64_t o = 0; o < outer && !rc; o++)   /* whole blocks of 16 rows only */
            rc = KERNELS.reduce(d, k, op, out_t, in_t, 1, n - n % 16, inner, (char *)out + o * inner * ITEM[out_t],
                          (const char *)x + o * n * inner * ITEM[in_t]);
    } else {
        rc = KERNELS.reduce(d, k, op, out_t, in_t, outer, n, inner, out, x);
    }
    rc = at_once_done(d, s, k, rc);
    return corrupt(d, s, rc, out, rc ? 0 : outer * inner, out_t, 0);
}

static anychip_status mutant_gemm(int d, anychip_stream s, anychip_dtype t, int64_t m, int64_t k, int64_t n, void *out,
                                  const void *a, int64_t as0, int64_t as1, const void *b, int64_t bs0, int64_t bs1) {
    anychip_stream ks = kernel_stream(d, s);
    int64_t kk = defect == D_GEMM_DROP_LAST && k > 1 ? k - 1 : k;
    anychip_status rc = at_once_done(d, s, ks, KERNELS.gemm(d, ks, t, m, kk, n, out, a, as0, as1, b, bs0, bs1));
    return corrupt(d, s, rc, out, rc ? 0 : m * n, t, 0);
}

static anychip_status mutant_fill(int d, anychip_stream s, anychip_dtype t, int64_t n, void *out, double fvalue,
                                  int64_t ivalue, int from_float) {
    anychip_stream k = kernel_stream(d, s);
    anychip_status rc = at_once_done(d, s, k, KERNELS.fill(d, k, t, n, out, fvalue, ivalue, from_float));
    return corrupt(d, s, rc, out, rc ? 0 : n, t, 0);
}

static anychip_kernels mutant_kernels;

/* ---- the table ------------------------------------------------------------------------------ */
ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p);

ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p) {
    anychip_status rc = template_plugin_init(p);
    if (rc) return rc;
    base = *p;
    if ((rc = read_defect())) return rc;
    snprintf(p->device_type, sizeof p->device_type, "%s", NAME);
    p->timeout_status = S_TIMEOUT;
    p->stream_query = mutant_stream_query;
    p->event_query = mutant_event_query;
    p->event_elapsed_ms = mutant_elapsed;
    p->stream_wait_event = mutant_wait_event;
    p->event_record = mutant_event_record;
    p->copy_peer = mutant_copy_peer;
    p->mem_alloc = mutant_alloc;
    p->mem_free = mutant_free;
    p->copy = mutant_copy;
    p->copy_async = mutant_copy_async;
    p->mem_info = mutant_mem_info;
    p->get_unique_id = get_unique_id;
    p->comm_init_rank = comm_init_rank;
    p->comm_destroy = comm_destroy;
    p->comm_abort = comm_abort;
    p->all_reduce = all_reduce;
    p->reduce = reduce;
    p->broadcast = broadcast;
    p->all_gather = all_gather;
    p->reduce_scatter = reduce_scatter;
    p->all_to_all = all_to_all;
    p->send = p2p_send;
    p->recv = p2p_recv;
    p->group_start = group_start;
    p->group_end = group_end;
    mutant_kernels = KERNELS;
    mutant_kernels.binary = mutant_binary;
    mutant_kernels.unary = mutant_unary;
    mutant_kernels.reduce = mutant_reduce;
    mutant_kernels.gemm = mutant_gemm;
    mutant_kernels.fill = mutant_fill;
    p->kernels = &mutant_kernels;
    return S_OK;
}
