/*
 * The Paddle bridge's collectives (see bridge.h): Paddle's xccl entries over the plugin's
 * collectives (plugin.h's optional ones), or, for a plugin without them or for the reductions
 * its masks leave out, over anychip's shared-memory engine (ANYCHIP_PADDLE_CCL: the path of
 * libanychip_ccl), host-staged; and the async errors of the communicators, which every
 * synchronize asks for.
 */
#include "bridge.h"

#ifdef ANYCHIP_PADDLE_CCL
#include "ccl/ccl.h"
#endif

/* ---- failures of enqueued collectives --------------------------------------------------------- */

/* A collective that fails on its stream (a peer gone, a timeout) leaves the stream's
 * synchronize successful, as NCCL's and HCCL's do: the failure is the communicator's async
 * error. device_ext.h has no entry for it, so every synchronize the bridge serves asks each
 * live communicator of the plugin, and reports the first failure as Paddle's error. */
typedef struct comm_rec {
    anychip_comm c;
    int rank, nranks, reported;
    struct comm_rec *next;
} comm_rec;

static pthread_mutex_t g_comms_lock = PTHREAD_MUTEX_INITIALIZER;
static comm_rec *g_comms;
static atomic_int g_ncomms;

static void comms_add(comm_rec *r)
{
    pthread_mutex_lock(&g_comms_lock);
    r->next = g_comms;
    g_comms = r;
    atomic_fetch_add(&g_ncomms, 1);
    pthread_mutex_unlock(&g_comms_lock);
}

static void comms_remove(comm_rec *r)
{
    pthread_mutex_lock(&g_comms_lock);
    for (comm_rec **p = &g_comms; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            atomic_fetch_sub(&g_ncomms, 1);
            break;
        }
    pthread_mutex_unlock(&g_comms_lock);
}

C_Status comm_errors(void)
{
    if (!atomic_load(&g_ncomms) || !g_plugin.comm_get_async_error)
        return C_SUCCESS;
    C_Status st = C_SUCCESS;
    pthread_mutex_lock(&g_comms_lock);
    for (comm_rec *r = g_comms; r && st == C_SUCCESS; r = r->next) {
        anychip_status err = 0;
        if (g_plugin.comm_get_async_error(r->c, &err) != 0 || err == 0)
            continue;
        /* the library's detail (which rank, what happened to it): the calling thread's last
         * error, which comm_get_async_error sets to the failure it reports, as anychip reads it */
        const char *detail = g_plugin.get_last_error ? g_plugin.get_last_error() : NULL;
        const char *text = g_plugin.get_error_string ? g_plugin.get_error_string(err) : NULL;
        if (!r->reported)
            say("rank %d of %d: a collective failed on its stream: status %d%s%s%s%s%s%s", r->rank, r->nranks,
                (int)err, text ? " (" : "", text ? text : "", text ? ")" : "",
                err == g_plugin.timeout_status && err ? "; a peer did not join in time (ANYCHIP_COLLECTIVE_TIMEOUT)"
                                                      : "",
                detail && *detail ? ": " : "", detail && *detail ? detail : "");
        r->reported = 1;
        st = C_FAILED;
    }
    pthread_mutex_unlock(&g_comms_lock);
    return st;
}


/* ---- collectives -------------------------------------------------------------------------------- */

typedef struct bridge_comm {
    comm_rec rec;                         /* in the list comm_errors() asks */
    anychip_comm c;                       /* the plugin's communicator (NULL: the engine serves all) */
    void *eng;                            /* the engine's (ccl_comm *), made when first needed */
    int device, rank, nranks;
    unsigned char id[sizeof(anychip_unique_id)];
} bridge_comm;

#define COMM(comm) ((bridge_comm *)(comm))

static const char *const PD_TYPES[] = {"UNDEFINED", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                                       "INT16", "INT32", "INT64", "FLOAT16", "FLOAT32", "FLOAT64",
                                       "BFLOAT16", "COMPLEX64", "COMPLEX128"};
static const char *const PD_OPS[] __attribute__((unused)) = {"SUM", "AVG", "MAX", "MIN", "PRODUCT"};

/* Paddle dtype -> anychip dtype and element size; reducing ops need a real numeric type */
static C_Status pd_type(C_DataType t, int reducing, anychip_dtype *out, size_t *size, const char *fn)
{
    switch (t) {
    case INT8: *out = ANYCHIP_INT8; *size = 1; break;
    case UINT8: *out = ANYCHIP_UINT8; *size = 1; break;
    case INT32: *out = ANYCHIP_INT32; *size = 4; break;
    case INT64: *out = ANYCHIP_INT64; *size = 8; break;
    case FLOAT16: *out = ANYCHIP_FLOAT16; *size = 2; break;
    case BFLOAT16: *out = ANYCHIP_BFLOAT16; *size = 2; break;
    case FLOAT32: *out = ANYCHIP_FLOAT32; *size = 4; break;
    case FLOAT64: *out = ANYCHIP_FLOAT64; *size = 8; break;
    case BOOL: *out = ANYCHIP_UINT8; *size = 1; break;
    case UINT16: *out = ANYCHIP_UINT8; *size = 2; break;
    case UINT32: *out = ANYCHIP_UINT8; *size = 4; break;
    case UINT64: *out = ANYCHIP_UINT8; *size = 8; break;
    case COMPLEX64: *out = ANYCHIP_UINT8; *size = 8; break;
    case COMPLEX128: *out = ANYCHIP_UINT8; *size = 16; break;
    default:
        say("%s: data type %d is not a Paddle C_DataType", fn, (int)t);
        return C_ERROR;
    }
    if (reducing && (t == BOOL || t == UINT16 || t == UINT32 || t == UINT64 || t == COMPLEX64 ||
                     t == COMPLEX128)) {
        say("%s: %s cannot be reduced (int8, uint8, int32, int64, float16, bfloat16, float32, float64 can)", fn,
            PD_TYPES[t]);
        return C_ERROR;
    }
    return C_SUCCESS;
}

static C_Status pd_op(C_CCLReduceOp op, anychip_redop *out, const char *fn)
{
    static const anychip_redop OPS[] = {ANYCHIP_SUM, ANYCHIP_AVG, ANYCHIP_MAX, ANYCHIP_MIN, ANYCHIP_PROD};
    if ((unsigned)op > PRODUCT) {
        say("%s: reduce op %d is not a Paddle C_CCLReduceOp (SUM 0, AVG 1, MAX 2, MIN 3, PRODUCT 4)", fn, (int)op);
        return C_ERROR;
    }
    *out = OPS[op];
    return C_SUCCESS;
}

/* elements to pass for `count` Paddle elements of type t (types moved as bytes scale) */
static size_t pd_count(size_t count, anychip_dtype dt, size_t size)
{
    return dt == ANYCHIP_UINT8 ? count * size : count;
}

/* whether the plugin's collectives reduce this type with this op (plugin.h's rule) */
static int plugin_reduces(anychip_dtype dt, anychip_redop op) { return anychip_plugin_reduces(&g_plugin, dt, op); }

#ifdef ANYCHIP_PADDLE_CCL
static C_Status eng_attach(bridge_comm *bc);
static C_Status eng_all_reduce(void *, void *, size_t, C_DataType, C_CCLReduceOp, C_CCLComm, C_Stream);
static C_Status eng_reduce(void *, void *, size_t, C_DataType, C_CCLReduceOp, size_t, C_CCLComm, C_Stream);
static C_Status eng_reduce_scatter(void *, void *, size_t, C_DataType, C_CCLReduceOp, C_CCLComm, C_Stream);
#define UNREDUCED(fn, call)                                                                        \
    do {                                                                                           \
        if (!plugin_reduces(dt, rop))                                                              \
            return eng_attach(COMM(comm)) == C_SUCCESS ? (call) : C_FAILED;                        \
    } while (0)
#else
#define UNREDUCED(fn, call)                                                                        \
    do {                                                                                           \
        if (!plugin_reduces(dt, rop)) {                                                            \
            say("%s: this device's collectives do not reduce %s with %s", fn, PD_TYPES[t], PD_OPS[op]); \
            return C_ERROR;                                                                        \
        }                                                                                          \
    } while (0)
#endif

static C_Status enqueued(anychip_status rc, C_Stream stream, const char *what)
{
    if (stream)
        atomic_store(&REC(stream)->pending, 1);
    return check(rc, what);
}

static C_Status xccl_get_unique_id_size(size_t *size)
{
    *size = sizeof(anychip_unique_id);
    return C_SUCCESS;
}

static C_Status xccl_get_unique_id(C_CCLRootId *id)
{
    if (!id || !id->data || id->sz < sizeof(anychip_unique_id)) {
        say("xccl_get_unique_id: the id buffer holds %zu bytes; %zu are needed", id ? id->sz : 0,
            sizeof(anychip_unique_id));
        return C_ERROR;
    }
    return check(g_plugin.get_unique_id((anychip_unique_id *)id->data), "get_unique_id");
}

static C_Status xccl_comm_init_rank(size_t nranks, C_CCLRootId *id, size_t rank, C_CCLComm *comm)
{
    if (!id || id->sz < sizeof(anychip_unique_id) || rank >= nranks || nranks > INT_MAX) {
        say("xccl_comm_init_rank: rank %zu of %zu ranks, id of %zu bytes: want rank < nranks and a %zu-byte id",
            rank, nranks, id ? id->sz : 0, sizeof(anychip_unique_id));
        return C_ERROR;
    }
    bridge_comm *bc = calloc(1, sizeof *bc);
    if (!bc)
        return C_FAILED;
    bc->device = bridge_device;
    bc->rank = (int)rank;
    bc->nranks = (int)nranks;
    memcpy(bc->id, id->data, sizeof bc->id);
    C_Status st = check(g_plugin.comm_init_rank(bridge_device, (int)nranks, (const anychip_unique_id *)id->data,
                                                (int)rank, &bc->c), "comm_init_rank");
    if (st != C_SUCCESS) {
        free(bc);
        return st;
    }
    bc->rec.c = bc->c;
    bc->rec.rank = bc->rank;
    bc->rec.nranks = bc->nranks;
    comms_add(&bc->rec);
    *comm = (C_CCLComm)bc;
    return C_SUCCESS;
}

static void eng_detach(bridge_comm *bc);

static C_Status xccl_destroy_comm(C_CCLComm comm)
{
    bridge_comm *bc = COMM(comm);
    comms_remove(&bc->rec);
    C_Status st = check(g_plugin.comm_destroy(bc->c), "comm_destroy");
    eng_detach(bc);
    free(bc);
    return st;
}

static C_Status xccl_get_comm_name(C_CCLComm comm, char *name)
{
    snprintf(name, 128, "%s-rank%d-of-%d", g_type, COMM(comm)->rank, COMM(comm)->nranks);
    return C_SUCCESS;
}

static C_Status xccl_all_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                                C_CCLComm comm, C_Stream stream)
{
    PROF(xccl_all_reduce);
    anychip_dtype dt;
    anychip_redop rop;
    size_t size;
    if (pd_type(t, 1, &dt, &size, "all_reduce") || pd_op(op, &rop, "all_reduce"))
        return C_ERROR;
    UNREDUCED("all_reduce", eng_all_reduce(send, recv, count, t, op, comm, stream));
    return enqueued(g_plugin.all_reduce(send, recv, count, dt, rop, COMM(comm)->c, REC(stream)->s), stream,
                    "all_reduce");
}

static C_Status missing(const char *op)
{
    say("%s: this device's collectives have no %s (plugin.h entry not set)", op, op);
    return C_FAILED;
}

static C_Status xccl_broadcast(void *buf, size_t count, C_DataType t, size_t root, C_CCLComm comm, C_Stream stream)
{
    PROF(xccl_broadcast);
    anychip_dtype dt;
    size_t size;
    if (!g_plugin.broadcast)
        return missing("broadcast");
    if (pd_type(t, 0, &dt, &size, "broadcast"))
        return C_ERROR;
    return enqueued(g_plugin.broadcast(buf, buf, pd_count(count, dt, size), dt, (int)root, COMM(comm)->c,
                                       REC(stream)->s), stream, "broadcast");
}

static C_Status xccl_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op, size_t root,
                            C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    anychip_redop rop;
    size_t size;
    if (!g_plugin.reduce)
        return missing("reduce");
    if (pd_type(t, 1, &dt, &size, "reduce") || pd_op(op, &rop, "reduce"))
        return C_ERROR;
    UNREDUCED("reduce", eng_reduce(send, recv, count, t, op, root, comm, stream));
    return enqueued(g_plugin.reduce(send, recv, count, dt, rop, (int)root, COMM(comm)->c, REC(stream)->s), stream,
                    "reduce");
}

static C_Status xccl_all_gather(void *send, void *recv, size_t count, C_DataType t, C_CCLComm comm,
                                C_Stream stream)
{
    PROF(xccl_all_gather);
    anychip_dtype dt;
    size_t size;
    if (!g_plugin.all_gather)
        return missing("all_gather");
    if (pd_type(t, 0, &dt, &size, "all_gather"))
        return C_ERROR;
    return enqueued(g_plugin.all_gather(send, recv, pd_count(count, dt, size), dt, COMM(comm)->c, REC(stream)->s),
                    stream, "all_gather");
}

static C_Status xccl_reduce_scatter(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                                    C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    anychip_redop rop;
    size_t size;
    if (!g_plugin.reduce_scatter)
        return missing("reduce_scatter");
    if (pd_type(t, 1, &dt, &size, "reduce_scatter") || pd_op(op, &rop, "reduce_scatter"))
        return C_ERROR;
    UNREDUCED("reduce_scatter", eng_reduce_scatter(send, recv, count, t, op, comm, stream));
    return enqueued(g_plugin.reduce_scatter(send, recv, count, dt, rop, COMM(comm)->c, REC(stream)->s), stream,
                    "reduce_scatter");
}

static int has_p2p(void) { return g_plugin.send && g_plugin.recv && g_plugin.group_start && g_plugin.group_end; }

static C_Status xccl_group_start(void)
{
    return has_p2p() ? check(g_plugin.group_start(), "group_start") : C_SUCCESS;
}

static C_Status xccl_group_end(void)
{
    return has_p2p() ? check(g_plugin.group_end(), "group_end") : C_SUCCESS;
}

static C_Status xccl_send(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    size_t size;
    if (!has_p2p())
        return missing("send");
    if (pd_type(t, 0, &dt, &size, "send"))
        return C_ERROR;
    return enqueued(g_plugin.send(buf, pd_count(count, dt, size), dt, (int)peer, COMM(comm)->c, REC(stream)->s), stream,
                    "send");
}

static C_Status xccl_recv(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    size_t size;
    if (!has_p2p())
        return missing("recv");
    if (pd_type(t, 0, &dt, &size, "recv"))
        return C_ERROR;
    return enqueued(g_plugin.recv(buf, pd_count(count, dt, size), dt, (int)peer, COMM(comm)->c, REC(stream)->s), stream,
                    "recv");
}

/* Paddle passes one buffer per peer (their counts may differ): a group of sends and receives,
 * the local block copied on the stream; without point-to-point, equal contiguous blocks go to
 * the plugin's all_to_all. */
static C_Status xccl_all_to_all(const void **send, const size_t *send_count, const C_DataType *send_t, void **recv,
                                const size_t *recv_count, const C_DataType *recv_t, size_t rank, size_t nranks,
                                C_CCLComm comm, C_Stream stream)
{
    bridge_comm *bc = COMM(comm);
    anychip_dtype dt;
    size_t size;
    if (pd_type(send_t[0], 0, &dt, &size, "all_to_all"))
        return C_ERROR;
    for (size_t i = 0; i < nranks; i++)
        if (send_t[i] != send_t[0] || recv_t[i] != send_t[0]) {
            say("all_to_all: every block must have one data type (block %zu differs)", i);
            return C_ERROR;
        }
    if (has_p2p()) {
        TRY(g_plugin.group_start(), "group_start");
        anychip_status rc = 0;
        for (size_t i = 0; i < nranks && rc == 0; i++) {
            if (i == rank)
                continue;
            if (send_count[i])
                rc = g_plugin.send(send[i], send_count[i] * size, ANYCHIP_UINT8, (int)i, bc->c, REC(stream)->s);
            if (rc == 0 && recv_count[i])
                rc = g_plugin.recv(recv[i], recv_count[i] * size, ANYCHIP_UINT8, (int)i, bc->c, REC(stream)->s);
        }
        anychip_status end = g_plugin.group_end();
        TRY(rc ? rc : end, "all_to_all's send / recv");
        return async_copy(bc->device, stream, recv[rank], send[rank], send_count[rank] * size, ANYCHIP_COPY_D2D);
    }
    if (!g_plugin.all_to_all)
        return missing("all_to_all");
    size_t block = send_count[0] * size;
    for (size_t i = 0; i < nranks; i++)
        if (send_count[i] != send_count[0] || recv_count[i] != send_count[0] ||
            (const char *)send[i] != (const char *)send[0] + i * block ||
            (char *)recv[i] != (char *)recv[0] + i * block) {
            say("all_to_all: this device has no send / recv, so the blocks must be equal and contiguous");
            return C_ERROR;
        }
    return enqueued(g_plugin.all_to_all(send[0], recv[0], block, ANYCHIP_UINT8, bc->c, REC(stream)->s), stream,
                    "all_to_all");
}


/* ---- collectives of a plugin without them: anychip's shared-memory engine, host-staged ------ */

#ifdef ANYCHIP_PADDLE_CCL
static struct {
    int (*comm_init)(const char *, int, int, double, ccl_comm **);
    const char *(*init_error)(void);
    int (*comm_destroy)(ccl_comm *);
    int (*run)(ccl_comm *, const ccl_op *, int);
    const char *(*comm_error)(const ccl_comm *);
} E;

typedef struct staged {
    ccl_op op;
    void *dev_recv;                       /* device buffer the host result goes to */
    size_t recv_bytes;
    int device;
} staged;

#define GROUP_MAX 256
static __thread staged t_group[GROUP_MAX];
static __thread int t_group_n, t_group_depth;

static int load_engine(void)
{
    char path[PATH_MAX];
    if (E.comm_init)
        return 0;
    if (resolve(ANYCHIP_PADDLE_CCL, path, sizeof path) != 0)
        return -1;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        say("cannot load anychip's collective engine %s: %s", path, dlerror());
        return -1;
    }
    *(void **)&E.comm_init = dlsym(lib, "ccl_comm_init");
    *(void **)&E.init_error = dlsym(lib, "ccl_init_error");
    *(void **)&E.comm_destroy = dlsym(lib, "ccl_comm_destroy");
    *(void **)&E.run = dlsym(lib, "ccl_run");
    *(void **)&E.comm_error = dlsym(lib, "ccl_comm_error");
    if (!E.comm_init || !E.init_error || !E.comm_destroy || !E.run || !E.comm_error) {
        say("%s lacks the engine's entry points (ccl_comm_init, ccl_run, ...)", path);
        E.comm_init = NULL;
        return -1;
    }
    return 0;
}

static C_Status eng_unique_id(C_CCLRootId *id)
{
    static atomic_ulong counter;
    if (!id || !id->data || id->sz < sizeof(anychip_unique_id)) {
        say("xccl_get_unique_id: the id buffer holds %zu bytes; %zu are needed", id ? id->sz : 0,
            sizeof(anychip_unique_id));
        return C_ERROR;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id->data, 0, id->sz);
    snprintf((char *)id->data, sizeof(anychip_unique_id), "pd-%s-%d-%llx-%lu", g_type, (int)getpid(),
             (unsigned long long)(ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec),
             atomic_fetch_add(&counter, 1));
    return C_SUCCESS;
}

static C_Status eng_comm_init(size_t nranks, C_CCLRootId *id, size_t rank, C_CCLComm *comm)
{
    if (!id || id->sz < sizeof(anychip_unique_id) || rank >= nranks || nranks > CCL_MAX_RANKS) {
        say("xccl_comm_init_rank: rank %zu of %zu ranks: want rank < nranks <= %d", rank, nranks, CCL_MAX_RANKS);
        return C_ERROR;
    }
    bridge_comm *bc = calloc(1, sizeof *bc);
    if (!bc)
        return C_FAILED;
    char name[sizeof(anychip_unique_id) + 1];
    memcpy(name, id->data, sizeof(anychip_unique_id));
    name[sizeof(anychip_unique_id)] = 0;
    ccl_comm *c = NULL;
    if (E.comm_init(name, (int)rank, (int)nranks, 0, &c) != CCL_OK) {
        say("rank %zu of %zu: the collective engine's init failed: %s", rank, nranks, E.init_error());
        free(bc);
        return C_FAILED;
    }
    bc->eng = c;
    bc->device = bridge_device;
    bc->rank = (int)rank;
    bc->nranks = (int)nranks;
    *comm = (C_CCLComm)bc;
    return C_SUCCESS;
}

static C_Status eng_destroy(C_CCLComm comm)
{
    eng_detach(COMM(comm));
    free(COMM(comm));
    return C_SUCCESS;
}

/* An engine communicator beside the plugin's, for the reductions the plugin lacks: every rank
 * makes it at the same op (the choice depends only on the op's type and reduce op), named
 * after the plugin communicator's id. */
static C_Status eng_attach(bridge_comm *bc)
{
    if (bc->eng)
        return C_SUCCESS;
    if (!E.comm_init) {
        say("this device's collectives lack a reduction and anychip's engine is not loaded");
        return C_FAILED;
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < sizeof bc->id; k++)
        h = (h ^ bc->id[k]) * 1099511628211ull;
    char name[64];
    snprintf(name, sizeof name, "pd-%016llx-%d", (unsigned long long)h, bc->nranks);
    ccl_comm *c = NULL;
    if (E.comm_init(name, bc->rank, bc->nranks, 0, &c) != CCL_OK) {
        say("rank %d of %d: the collective engine's init failed: %s", bc->rank, bc->nranks, E.init_error());
        return C_FAILED;
    }
    bc->eng = c;
    return C_SUCCESS;
}

static C_Status eng_fail(bridge_comm *bc, const char *what)
{
    say("rank %d of %d: %s failed: %s", bc->rank, bc->nranks, what, E.comm_error((ccl_comm *)bc->eng));
    return C_FAILED;
}

/* Stage one op: the stream drained, `send_bytes` of dev_send copied to host; the host result
 * of `recv_bytes` goes back to dev_recv after the run. */
static C_Status eng_stage(bridge_comm *bc, C_Stream stream, ccl_op *op, const void *dev_send, size_t send_bytes,
                          void *dev_recv, size_t recv_bytes, staged *out)
{
    TRY(g_plugin.stream_synchronize(bc->device, REC(stream)->s), "stream_synchronize");
    atomic_store(&REC(stream)->pending, 0);
    void *hs = send_bytes ? malloc(send_bytes) : NULL;
    void *hr = recv_bytes ? malloc(recv_bytes) : NULL;
    if ((send_bytes && !hs) || (recv_bytes && !hr)) {
        free(hs);
        free(hr);
        return C_FAILED;
    }
    if (send_bytes) {
        C_Status st = check(g_plugin.copy(bc->device, hs, dev_send, send_bytes, ANYCHIP_COPY_D2H), "copy");
        if (st != C_SUCCESS) {
            free(hs);
            free(hr);
            return st;
        }
    }
    op->send.ptr = hs;
    op->recv.ptr = hr;
    out->op = *op;
    out->dev_recv = dev_recv;
    out->recv_bytes = recv_bytes;
    out->device = bc->device;
    return C_SUCCESS;
}

static C_Status eng_finish(staged *ops, int n, C_Status st)
{
    for (int i = 0; i < n; i++) {
        if (st == C_SUCCESS && ops[i].recv_bytes)
            st = check(g_plugin.copy(ops[i].device, ops[i].dev_recv, ops[i].op.recv.ptr, ops[i].recv_bytes,
                                     ANYCHIP_COPY_H2D), "copy");
        free(ops[i].op.send.ptr);
        free(ops[i].op.recv.ptr);
    }
    return st;
}

/* run one staged op now, or keep it for group_end */
static C_Status eng_go(bridge_comm *bc, staged *s, const char *what)
{
    if (t_group_depth > 0) {
        if (t_group_n == GROUP_MAX) {
            eng_finish(s, 1, C_FAILED);
            say("%s: more than %d ops in one group", what, GROUP_MAX);
            return C_FAILED;
        }
        t_group[t_group_n++] = *s;
        return C_SUCCESS;
    }
    C_Status st = E.run((ccl_comm *)bc->eng, &s->op, 1) == CCL_OK ? C_SUCCESS : eng_fail(bc, what);
    return eng_finish(s, 1, st);
}

static ccl_comm *t_group_comm;

static C_Status eng_group_start(void)
{
    t_group_depth++;
    return C_SUCCESS;
}

static C_Status eng_group_end(void)
{
    if (t_group_depth == 0) {
        say("xccl_group_end without xccl_group_start");
        return C_ERROR;
    }
    if (--t_group_depth > 0 || t_group_n == 0)
        return C_SUCCESS;
    ccl_op ops[GROUP_MAX];
    for (int i = 0; i < t_group_n; i++)
        ops[i] = t_group[i].op;
    int n = t_group_n;
    t_group_n = 0;
    C_Status st = C_SUCCESS;
    if (E.run(t_group_comm, ops, n) != CCL_OK) {
        say("a group of %d send / recv failed: %s", n, E.comm_error(t_group_comm));
        st = C_FAILED;
    }
    return eng_finish(t_group, n, st);
}

static C_Status eng_types(C_DataType t, int reducing, int *dtype, size_t *size, const char *fn)
{
    anychip_dtype dt;
    C_Status st = pd_type(t, reducing, &dt, size, fn);
    *dtype = (int)dt;                     /* anychip_dtype and ccl_dtype share values */
    return st;
}

static C_Status eng_all_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                               C_CCLComm comm, C_Stream stream)
{
    static const int OPS[] = {CCL_SUM, CCL_AVG, CCL_MAX, CCL_MIN, CCL_PROD};
    int dt;
    size_t size;
    if (eng_types(t, 1, &dt, &size, "all_reduce") || (unsigned)op > PRODUCT)
        return C_ERROR;
    ccl_op o = {.kind = CCL_ALL_REDUCE, .dtype = dt, .redop = OPS[op], .count = count};
    staged s;
    TRY(eng_stage(COMM(comm), stream, &o, send, count * size, recv, count * size, &s), "staging");
    return eng_go(COMM(comm), &s, "all_reduce");
}

static C_Status eng_broadcast(void *buf, size_t count, C_DataType t, size_t root, C_CCLComm comm, C_Stream stream)
{
    int dt;
    size_t size;
    if (eng_types(t, 0, &dt, &size, "broadcast"))
        return C_ERROR;
    size_t n = count * (dt == CCL_UINT8 ? size : 1), bytes = count * size;
    ccl_op o = {.kind = CCL_BROADCAST, .dtype = dt, .root = (int)root, .count = n};
    staged s;
    TRY(eng_stage(COMM(comm), stream, &o, buf, bytes, buf, bytes, &s), "staging");
    return eng_go(COMM(comm), &s, "broadcast");
}

static C_Status eng_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op, size_t root,
                           C_CCLComm comm, C_Stream stream)
{
    static const int OPS[] = {CCL_SUM, CCL_AVG, CCL_MAX, CCL_MIN, CCL_PROD};
    int dt;
    size_t size;
    if (eng_types(t, 1, &dt, &size, "reduce") || (unsigned)op > PRODUCT)
        return C_ERROR;
    int me = COMM(comm)->rank == (int)root;
    ccl_op o = {.kind = CCL_REDUCE, .dtype = dt, .redop = OPS[op], .root = (int)root, .count = count};
    staged s;
    TRY(eng_stage(COMM(comm), stream, &o, send, count * size, recv, count * size, &s), "staging");
    if (!me)
        s.recv_bytes = 0;                 /* only the root's recv holds the result */
    return eng_go(COMM(comm), &s, "reduce");
}

static C_Status eng_all_gather(void *send, void *recv, size_t count, C_DataType t, C_CCLComm comm,
                               C_Stream stream)
{
    int dt;
    size_t size;
    if (eng_types(t, 0, &dt, &size, "all_gather"))
        return C_ERROR;
    bridge_comm *bc = COMM(comm);
    size_t n = count * (dt == CCL_UINT8 ? size : 1);
    ccl_op o = {.kind = CCL_ALL_GATHER, .dtype = dt, .count = n};
    staged s;
    TRY(eng_stage(bc, stream, &o, send, count * size, recv, count * size * (size_t)bc->nranks, &s), "staging");
    return eng_go(bc, &s, "all_gather");
}

static C_Status eng_reduce_scatter(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                                   C_CCLComm comm, C_Stream stream)
{
    static const int OPS[] = {CCL_SUM, CCL_AVG, CCL_MAX, CCL_MIN, CCL_PROD};
    int dt;
    size_t size;
    if (eng_types(t, 1, &dt, &size, "reduce_scatter") || (unsigned)op > PRODUCT)
        return C_ERROR;
    bridge_comm *bc = COMM(comm);
    ccl_op o = {.kind = CCL_REDUCE_SCATTER, .dtype = dt, .redop = OPS[op], .count = count};
    staged s;
    TRY(eng_stage(bc, stream, &o, send, count * size * (size_t)bc->nranks, recv, count * size, &s), "staging");
    return eng_go(bc, &s, "reduce_scatter");
}

static C_Status eng_p2p(int kind, void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm,
                        C_Stream stream)
{
    int dt;
    size_t size;
    const char *what = kind == CCL_SEND ? "send" : "recv";
    if (eng_types(t, 0, &dt, &size, what))
        return C_ERROR;
    bridge_comm *bc = COMM(comm);
    size_t n = count * (dt == CCL_UINT8 ? size : 1), bytes = count * size;
    ccl_op o = {.kind = kind, .dtype = dt, .root = (int)peer, .count = n};
    staged s;
    TRY(eng_stage(bc, stream, &o, kind == CCL_SEND ? buf : NULL, kind == CCL_SEND ? bytes : 0,
                  kind == CCL_RECV ? buf : NULL, kind == CCL_RECV ? bytes : 0, &s), "staging");
    if (t_group_depth > 0)
        t_group_comm = (ccl_comm *)bc->eng;
    return eng_go(bc, &s, what);
}

static C_Status eng_send(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    return eng_p2p(CCL_SEND, buf, count, t, peer, comm, stream);
}

static C_Status eng_recv(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    return eng_p2p(CCL_RECV, buf, count, t, peer, comm, stream);
}

static C_Status eng_all_to_all(const void **send, const size_t *send_count, const C_DataType *send_t, void **recv,
                               const size_t *recv_count, const C_DataType *recv_t, size_t rank, size_t nranks,
                               C_CCLComm comm, C_Stream stream)
{
    (void)recv_t;
    TRY(eng_group_start(), "group_start");
    C_Status st = C_SUCCESS;
    for (size_t i = 0; i < nranks && st == C_SUCCESS; i++) {
        if (i == rank)
            continue;
        if (send_count[i])
            st = eng_send((void *)send[i], send_count[i], send_t[i], i, comm, stream);
        if (st == C_SUCCESS && recv_count[i])
            st = eng_recv(recv[i], recv_count[i], send_t[i], i, comm, stream);
    }
    C_Status end = eng_group_end();
    if (st != C_SUCCESS || end != C_SUCCESS)
        return st != C_SUCCESS ? st : end;
    anychip_dtype dt;
    size_t size;
    TRY(pd_type(send_t[0], 0, &dt, &size, "all_to_all") ? 1 : 0, "all_to_all");
    return sync_copy(COMM(comm)->device, recv[rank], send[rank], send_count[rank] * size, ANYCHIP_COPY_D2D);
}

static void fill_engine(C_DeviceInterface *i)
{
    if (load_engine() != 0)
        return;
    i->xccl_get_comm_name = xccl_get_comm_name;
    i->xccl_get_unique_id_size = xccl_get_unique_id_size;
    i->xccl_get_unique_id = eng_unique_id;
    i->xccl_comm_init_rank = eng_comm_init;
    i->xccl_destroy_comm = eng_destroy;
    i->xccl_all_reduce = eng_all_reduce;
    i->xccl_broadcast = eng_broadcast;
    i->xccl_reduce = eng_reduce;
    i->xccl_all_gather = eng_all_gather;
    i->xccl_reduce_scatter = eng_reduce_scatter;
    i->xccl_group_start = eng_group_start;
    i->xccl_group_end = eng_group_end;
    i->xccl_send = eng_send;
    i->xccl_recv = eng_recv;
    i->xccl_all_to_all = eng_all_to_all;
}
#endif

#ifdef ANYCHIP_PADDLE_CCL
static void eng_detach(bridge_comm *bc)
{
    if (bc->eng)
        E.comm_destroy((ccl_comm *)bc->eng);
    bc->eng = NULL;
}
#else
static void eng_detach(bridge_comm *bc) { (void)bc; }
#endif

void fill_collectives(C_DeviceInterface *i)
{
#ifdef ANYCHIP_PADDLE_CCL
    if (g_plugin.ccl_dtype_mask || g_plugin.ccl_redop_mask || (g_plugin.minor >= 2 && g_plugin.ccl_op_dtype_masks))
        load_engine();                    /* the reductions the plugin lacks run on the engine */
#endif
    if (!(g_plugin.get_unique_id && g_plugin.comm_init_rank && g_plugin.comm_destroy && g_plugin.all_reduce)) {
#ifdef ANYCHIP_PADDLE_CCL
        fill_engine(i);
#endif
        return;
    }
    i->xccl_get_comm_name = xccl_get_comm_name;
    i->xccl_get_unique_id_size = xccl_get_unique_id_size;
    i->xccl_get_unique_id = xccl_get_unique_id;
    i->xccl_comm_init_rank = xccl_comm_init_rank;
    i->xccl_destroy_comm = xccl_destroy_comm;
    i->xccl_all_reduce = xccl_all_reduce;
    i->xccl_broadcast = xccl_broadcast;
    i->xccl_reduce = xccl_reduce;
    i->xccl_all_gather = xccl_all_gather;
    i->xccl_reduce_scatter = xccl_reduce_scatter;
    i->xccl_group_start = xccl_group_start;
    i->xccl_group_end = xccl_group_end;
    i->xccl_send = xccl_send;
    i->xccl_recv = xccl_recv;
    i->xccl_all_to_all = xccl_all_to_all;
}
