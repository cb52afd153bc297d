/*
 * Test plugins: the device `anychip plugin new` generates, changed in one way each.
 *
 * Built by tests/conftest.py's build_template_wrapper (for test_cplugin.py, test_cplugin_kernels.py,
 * test_torch_c10d.py) with
 *   -DTEMPLATE_HEADER="\"<rendered project>/src/<name>.h\"" -DNAME="\"<backend name>\"" -DVARIANT_<X>
 * and linked with the project's src/kernels.c (the kernel table, KERNELS) and its src/<name>.c, compiled
 * with -Danychip_plugin_init=template_plugin_init: this file's anychip_plugin_init wraps the template's.
 * The template's internals it uses (the stream, event and device structures, enqueue) are in <name>.h.
 * VARIANT_GOOD            the template as it is
 * VARIANT_NO_INIT         exports no anychip_plugin_init
 * VARIANT_MAJOR2          claims plugin ABI 2.0
 * VARIANT_MISSING         leaves the required mem_alloc and copy unset
 * VARIANT_INIT_FAIL       anychip_plugin_init fails, with a detail
 * VARIANT_EVENTS_PARTIAL  sets three of the four event entries
 * VARIANT_MINIMAL         only the required entries: every fallback of the core is used
 * VARIANT_CCL_SELF        collectives that are real for groups of one rank (refused for more)
 * VARIANT_CCL_NOOP        collectives that report success and move no data
 * VARIANT_CCL_PARTIAL     sets all_reduce and get_unique_id only (too few to be used)
 * VARIANT_CCL_SHM         collectives between processes over a shared-memory segment: all_reduce
 *                         (int32 / int64 / float32 / float64; sum, min, max), all_gather and
 *                         broadcast, run in the calling thread after a stream synchronize; anything
 *                         else is left to anychip's host transport
 * VARIANT_CCL_HANG        VARIANT_CCL_SHM, except that on the ranks CCL_HANG_RANKS lists ("all" or
 *                         ranks separated by commas; read at comm_init_rank) all_reduce enqueues work
 *                         that never ends and returns success (a collective that never completes);
 *                         with CCL_HANG_ABORT_ENDS set, comm_abort ends the first such work (as
 *                         ncclCommAbort ends the stuck kernels)
 * VARIANT_KERNELS_NONE    no kernel table (every tensor op on the host)
 * VARIANT_MINOR0          claims plugin ABI 1.0 and keeps the table (which anychip must not read)
 * VARIANT_KERNELS_V2      a kernel table of an unknown version (2)
 * VARIANT_KERNELS_BADMASK a binary mask with bit 9 set (beyond ANYCHIP_BOOL)
 * VARIANT_KERNELS_F32     kernels for float32 only, and no gemm
 * VARIANT_KERNELS_MUTANT  the table with the one defect KERNEL_DEFECT names (read at init):
 *                         sub_adds, float16_as_bfloat16 (binary), ignores_strides (binary and
 *                         unary treat every input as contiguous), mean_sums (reduce),
 *                         fill_through_double (integer fills lose bits past 2^53)
 */
#ifdef VARIANT_CCL_HANG
#define VARIANT_CCL_SHM
#endif
#include TEMPLATE_HEADER

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the template's own anychip_plugin_init, compiled under this name (see the top) */
anychip_status template_plugin_init(anychip_plugin *p);
static __attribute__((unused)) anychip_plugin base;      /* the template's entries, as it filled them */

#if defined(VARIANT_CCL_SELF) || defined(VARIANT_CCL_NOOP) || defined(VARIANT_CCL_SHM)
#define S_TIMEOUT 7
#define SLOT (1u << 20)                                  /* bytes per rank and round */

#define MAX_RANKS 64
typedef struct {
    _Atomic uint64_t seq[MAX_RANKS];                     /* barriers each rank has reached */
    _Atomic int32_t pid[MAX_RANKS];
    _Atomic int32_t aborted;                             /* 1 + the rank that aborted, 0 while none did */
} shm_header;

struct anychip_comm_s {
    int device, nranks, rank;
    shm_header *hdr;                                     /* VARIANT_CCL_SHM: the mapped segment */
    char *slots;
    size_t size;
    double timeout;
    int hang;                                            /* VARIANT_CCL_HANG: this rank's all_reduce never ends */
    anychip_event stuck;                                 /* VARIANT_CCL_HANG: what comm_abort ends (or null) */
};

/* a barrier fails once a rank aborted the communicator (shm_group.h) */
#define SHM_ABORTED(c) atomic_load(&(c)->hdr->aborted)
#include "shm_group.h"

#ifdef VARIANT_CCL_SHM
static anychip_status shm_attach(anychip_comm c, const anychip_unique_id *id) {
    c->size = sizeof(shm_header) + (size_t)c->nranks * SLOT;
    anychip_status rc = shm_map(c, id);
    if (rc == S_OK) c->slots = (char *)c->hdr + sizeof(shm_header);
    return rc;
}
#endif

static anychip_status comm_init_rank(int d, int nranks, const anychip_unique_id *id, int rank, anychip_comm *out) {
#ifdef VARIANT_CCL_SELF
    if (nranks != 1) return fail(S_INVALID, "these test collectives serve groups of one rank, not %d", nranks);
#endif
    anychip_comm c = calloc(1, sizeof *c);
    if (!c) return fail(S_SYSTEM, "out of host memory");
    c->device = d;
    c->nranks = nranks;
    c->rank = rank;
#ifdef VARIANT_CCL_SHM
    if (nranks > MAX_RANKS) {
        free(c);
        return fail(S_INVALID, "at most %d ranks, not %d", MAX_RANKS, nranks);
    }
#ifdef VARIANT_CCL_HANG
    for (const char *p = getenv("CCL_HANG_RANKS"); p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
        if (!strncmp(p, "all", 3) || atoi(p) == rank) c->hang = 1;
#endif
    anychip_status rc = shm_attach(c, id);
    if (rc) {
        free(c);
        return rc;
    }
#else
    (void)id;
#endif
    *out = c;
    return S_OK;
}

static anychip_status comm_destroy(anychip_comm c) {
#ifdef VARIANT_CCL_HANG
    if (c->stuck) event_release(c->stuck);
#endif
    if (c->hdr) munmap(c->hdr, c->size);
    free(c);
    return S_OK;
}

/* the peers' barriers fail, naming this rank */
static anychip_status comm_abort(anychip_comm c) {
    if (c->hdr) atomic_store(&c->hdr->aborted, c->rank + 1);
#ifdef VARIANT_CCL_HANG
    if (c->stuck && getenv("CCL_HANG_ABORT_ENDS")) {    /* the never-ending work ends */
        pthread_mutex_lock(&c->stuck->lock);
        c->stuck->completed = c->stuck->recorded;
        pthread_cond_broadcast(&c->stuck->cond);
        pthread_mutex_unlock(&c->stuck->lock);
    }
#endif
    return comm_destroy(c);
}

#ifdef VARIANT_CCL_SHM
#define REDUCE_LOOP(T)                                                                            \
    for (size_t i = 0; i < n; i++) {                                                             \
        T acc = ((const T *)c->slots)[i];                                                        \
        for (int r = 1; r < c->nranks; r++) {                                                    \
            T v = ((const T *)(c->slots + (size_t)r * SLOT))[i];                                 \
            acc = op == ANYCHIP_SUM ? acc + v : op == ANYCHIP_MIN ? (v < acc ? v : acc) : (v > acc ? v : acc); \
        }                                                                                        \
        ((T *)out)[i] = acc;                                                                     \
    }

static void reduce_slots(anychip_comm c, void *out, size_t n, anychip_dtype t, anychip_redop op) {
    switch (t) {
    case ANYCHIP_INT32: REDUCE_LOOP(int32_t) break;
    case ANYCHIP_INT64: REDUCE_LOOP(int64_t) break;
    case ANYCHIP_FLOAT32: REDUCE_LOOP(float) break;
    default: REDUCE_LOOP(double) break;
    }
}

#ifdef VARIANT_CCL_HANG
/* a wait for an event whose record is never enqueued: the stream never gets past it (with
 * CCL_HANG_ABORT_ENDS, the communicator keeps its first such event, which comm_abort ends) */
static anychip_status never_ending(anychip_comm c, anychip_stream s) {
    anychip_event e;
    anychip_status rc = base.event_create(c->device, &e);
    if (rc) return rc;
    pthread_mutex_lock(&e->lock);
    uint64_t gen = ++e->recorded;
    pthread_mutex_unlock(&e->lock);
    rc = enqueue_event_task(s, (task){.kind = T_WAIT, .event = e, .generation = gen});
    if (rc == S_OK && !c->stuck && getenv("CCL_HANG_ABORT_ENDS"))
        c->stuck = e;
    else
        event_release(e);                                /* the queued wait holds its own reference */
    return rc;
}
#endif

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                                 anychip_comm c, anychip_stream s) {
#ifdef VARIANT_CCL_HANG
    if (c->hang) return never_ending(c, s);
#endif
    size_t size = dtype_size(t), per = SLOT / size;
    anychip_status rc = base.stream_synchronize(c->device, s);     /* ordered after the stream's work */
    for (size_t at = 0; rc == S_OK && at < count; at += per) {
        size_t n = count - at < per ? count - at : per;
        memcpy(c->slots + (size_t)c->rank * SLOT, (const char *)send + at * size, n * size);
        if ((rc = barrier(c))) break;
        reduce_slots(c, (char *)recv + at * size, n, t, op);
        rc = barrier(c);
    }
    return rc;
}

static anychip_status all_gather(const void *send, void *recv, size_t count, anychip_dtype t, anychip_comm c,
                                 anychip_stream s) {
    size_t bytes = count * dtype_size(t);
    anychip_status rc = base.stream_synchronize(c->device, s);
    for (size_t at = 0; rc == S_OK && at < bytes; at += SLOT) {
        size_t n = bytes - at < SLOT ? bytes - at : SLOT;
        memcpy(c->slots + (size_t)c->rank * SLOT, (const char *)send + at, n);
        if ((rc = barrier(c))) break;
        for (int r = 0; r < c->nranks; r++) memcpy((char *)recv + (size_t)r * bytes + at, c->slots + (size_t)r * SLOT, n);
        rc = barrier(c);
    }
    return rc;
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype t, int root,
                                anychip_comm c, anychip_stream s) {
    size_t bytes = count * dtype_size(t);
    if (root < 0 || root >= c->nranks) return fail(S_INVALID, "broadcast: root %d of %d ranks", root, c->nranks);
    anychip_status rc = base.stream_synchronize(c->device, s);
    for (size_t at = 0; rc == S_OK && at < bytes; at += SLOT) {
        size_t n = bytes - at < SLOT ? bytes - at : SLOT;
        if (c->rank == root) memcpy(c->slots, (const char *)send + at, n);
        if ((rc = barrier(c))) break;
        memmove((char *)recv + at, c->slots, n);
        rc = barrier(c);
    }
    return rc;
}
#else
/* one rank: every op's result is its input (an enqueued device-to-device copy) */
static anychip_status self_copy(anychip_comm c, const void *send, void *recv, size_t bytes, anychip_stream s) {
#ifdef VARIANT_CCL_NOOP
    (void)c; (void)send; (void)recv; (void)bytes; (void)s;
    return S_OK;                                      /* success, and no data moved */
#else
    if (send == recv || bytes == 0) return S_OK;
    return copy_async(c->device, recv, send, bytes, ANYCHIP_COPY_D2D, s);
#endif
}

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                                 anychip_comm c, anychip_stream s) {
    (void)op;
    return self_copy(c, send, recv, count * dtype_size(t), s);
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype t, int root,
                                anychip_comm c, anychip_stream s) {
    if (root != 0) return fail(S_INVALID, "broadcast: root %d of a group of one", root);
    return self_copy(c, send, recv, count * dtype_size(t), s);
}

static anychip_status all_gather(const void *send, void *recv, size_t count, anychip_dtype t, anychip_comm c,
                                 anychip_stream s) {
    return self_copy(c, send, recv, count * dtype_size(t), s);
}
#endif /* VARIANT_CCL_SHM */
#endif

#ifdef VARIANT_CCL_PARTIAL
static anychip_status partial_unique_id(anychip_unique_id *id) {
    (void)id;
    return fail(S_INVALID, "never called: the entries are too few to be used");
}

static anychip_status partial_all_reduce(const void *send, void *recv, size_t count, anychip_dtype t,
                                         anychip_redop op, anychip_comm c, anychip_stream s) {
    (void)send; (void)recv; (void)count; (void)t; (void)op; (void)c; (void)s;
    return fail(S_INVALID, "never called: the entries are too few to be used");
}
#endif

#if defined(VARIANT_KERNELS_V2) || defined(VARIANT_KERNELS_BADMASK) || defined(VARIANT_KERNELS_F32) || \
    defined(VARIANT_KERNELS_MUTANT)
static anychip_kernels variant_kernels;
#endif

#ifdef VARIANT_KERNELS_MUTANT
#define MAX_DIMS ANYCHIP_KERNEL_MAX_DIMS
static const char *kernel_defect = "";

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t step = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = step;
        step *= shape[d];
    }
}

static anychip_status mutant_binary(int d, anychip_stream s, anychip_binary_op op, anychip_dtype t, int ndim,
                                    const int64_t *shape, void *out, const void *a, const int64_t *as,
                                    const void *b, const int64_t *bs) {
    int64_t flat[MAX_DIMS];
    if (!strcmp(kernel_defect, "sub_adds") && op == ANYCHIP_OP_SUB) op = ANYCHIP_OP_ADD;
    if (!strcmp(kernel_defect, "float16_as_bfloat16") && t == ANYCHIP_FLOAT16) t = ANYCHIP_BFLOAT16;
    if (!strcmp(kernel_defect, "ignores_strides") && ndim > 0 && ndim <= MAX_DIMS) {
        contiguous_strides(ndim, shape, flat);
        as = bs = flat;
    }
    return KERNELS.binary(d, s, op, t, ndim, shape, out, a, as, b, bs);
}

static anychip_status mutant_unary(int d, anychip_stream s, anychip_unary_op op, anychip_dtype out_t,
                                   anychip_dtype in_t, int ndim, const int64_t *shape, void *out, const void *x,
                                   const int64_t *xs) {
    int64_t flat[MAX_DIMS];
    if (!strcmp(kernel_defect, "ignores_strides") && ndim > 0 && ndim <= MAX_DIMS) {
        contiguous_strides(ndim, shape, flat);
        xs = flat;
    }
    return KERNELS.unary(d, s, op, out_t, in_t, ndim, shape, out, x, xs);
}

static anychip_status mutant_reduce(int d, anychip_stream s, anychip_reduce_op op, anychip_dtype out_t,
                                    anychip_dtype in_t, int64_t outer, int64_t n, int64_t inner, void *out,
                                    const void *x) {
    if (!strcmp(kernel_defect, "mean_sums") && op == ANYCHIP_REDUCE_MEAN) op = ANYCHIP_REDUCE_SUM;
    return KERNELS.reduce(d, s, op, out_t, in_t, outer, n, inner, out, x);
}

static anychip_status mutant_fill(int d, anychip_stream s, anychip_dtype t, int64_t n, void *out, double fvalue,
                                  int64_t ivalue, int from_float) {
    if (!strcmp(kernel_defect, "fill_through_double") && !from_float) {
        fvalue = (double)ivalue;
        from_float = 1;
    }
    return KERNELS.fill(d, s, t, n, out, fvalue, ivalue, from_float);
}
#endif

ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p);

#ifndef VARIANT_NO_INIT
ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p) {
    anychip_status rc = template_plugin_init(p);
    if (rc) return rc;
    base = *p;
    snprintf(p->device_type, sizeof p->device_type, "%s", NAME);
#if defined(VARIANT_MAJOR2)
    p->major = 2;
    p->minor = 3;
#elif defined(VARIANT_MISSING)
    p->mem_alloc = NULL;
    p->copy = NULL;
#elif defined(VARIANT_INIT_FAIL)
    return fail(S_SYSTEM, "no %s driver: /dev/%s0 does not exist", NAME, NAME);
#elif defined(VARIANT_EVENTS_PARTIAL)
    p->event_record = NULL;
#elif defined(VARIANT_MINIMAL)
    p->set_device = NULL; p->device_name = NULL; p->device_synchronize = NULL;
    p->copy_async = NULL; p->copy_peer = NULL; p->fill = NULL; p->fill_async = NULL;
    p->stream_query = NULL; p->stream_wait_event = NULL;
    p->event_create = NULL; p->event_destroy = NULL; p->event_record = NULL; p->event_synchronize = NULL;
    p->event_query = NULL; p->event_elapsed_ms = NULL;
    p->get_error_string = NULL; p->get_last_error = NULL;
#elif defined(VARIANT_KERNELS_NONE)
    p->kernels = NULL;
#elif defined(VARIANT_MINOR0)
    p->minor = 0;
#elif defined(VARIANT_KERNELS_V2)
    variant_kernels = KERNELS;
    variant_kernels.version = 2;
    p->kernels = &variant_kernels;
#elif defined(VARIANT_KERNELS_BADMASK)
    variant_kernels = KERNELS;
    variant_kernels.binary_dtypes |= 1u << 9;
    p->kernels = &variant_kernels;
#elif defined(VARIANT_KERNELS_F32)
    variant_kernels = KERNELS;
    variant_kernels.binary_dtypes = variant_kernels.unary_dtypes = variant_kernels.reduce_dtypes =
        variant_kernels.fill_dtypes = 1u << ANYCHIP_FLOAT32;
    variant_kernels.gemm_dtypes = 0;
    variant_kernels.gemm = NULL;
    p->kernels = &variant_kernels;
#elif defined(VARIANT_KERNELS_MUTANT)
    kernel_defect = getenv("KERNEL_DEFECT") ? getenv("KERNEL_DEFECT") : "";
    variant_kernels = KERNELS;
    variant_kernels.binary = mutant_binary;
    variant_kernels.unary = mutant_unary;
    variant_kernels.reduce = mutant_reduce;
    variant_kernels.fill = mutant_fill;
    p->kernels = &variant_kernels;
#elif defined(VARIANT_CCL_PARTIAL)
    p->get_unique_id = partial_unique_id;
    p->all_reduce = partial_all_reduce;
#elif defined(VARIANT_CCL_SELF) || defined(VARIANT_CCL_NOOP) || defined(VARIANT_CCL_SHM)
#ifdef VARIANT_CCL_SHM
    p->timeout_status = S_TIMEOUT;
    p->ccl_dtype_mask = 1u << ANYCHIP_INT32 | 1u << ANYCHIP_INT64 | 1u << ANYCHIP_FLOAT32 | 1u << ANYCHIP_FLOAT64;
    p->ccl_redop_mask = 1u << ANYCHIP_SUM | 1u << ANYCHIP_MIN | 1u << ANYCHIP_MAX;
#endif
    p->get_unique_id = get_unique_id;
    p->comm_init_rank = comm_init_rank;
    p->comm_destroy = comm_destroy;
    p->comm_abort = comm_abort;
    p->all_reduce = all_reduce;
    p->broadcast = broadcast;
    p->all_gather = all_gather;
#endif
    return S_OK;
}
#endif
