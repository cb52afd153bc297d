/*
 * RCCL in the Hygon simulator (libhygon_sim): the NCCL C API of rccl/rccl.h on the
 * anychip collective engine. Ops are enqueued on HIP streams of the simulator.
 *
 * Types: reductions work on int8, uint8, int32, uint32, int64, uint64, float16,
 * bfloat16, float32, float64 with every op (integer avg: the sum divided by the rank
 * count); reductions of the fp8 types return ncclInvalidArgument (RCCL reduces them).
 * Data movement takes every type. Failures of enqueued work are reported by
 * ncclCommGetAsyncError (and ncclGetLastError) and by every later call on the
 * communicator. Differences kept on purpose (nonblocking configs made at once,
 * ncclCommSplit not deferred by groups, ...) are listed in docs/simulator.md.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "collective.h"
#include "rccl/rccl.h"

#define NCCL_API SIM_EXPORT

typedef int hipError_t;
hipError_t hipGetDevice(int *deviceId);
hipError_t hipGetDeviceCount(int *count);

static ncclResult_t code(sc_status st)
{
    switch (st) {
    case SC_OK: return ncclSuccess;
    case SC_INVALID:
    case SC_NULL:
    case SC_UNSUPPORTED: return ncclInvalidArgument;
    case SC_USAGE: return ncclInvalidUsage;
    case SC_TIMEOUT:
    case SC_REMOTE: return ncclRemoteError;
    case SC_SYSTEM:
    case SC_OOM: return ncclSystemError;
    case SC_RUNTIME: return ncclUnhandledCudaError;
    default: return ncclInternalError;
    }
}

static const struct { int ccl; int size; int reduce; } TYPES[] = {
    [ncclInt8] = {CCL_INT8, 1, 1},       [ncclUint8] = {CCL_UINT8, 1, 1},     [ncclInt32] = {CCL_INT32, 4, 1},
    [ncclUint32] = {CCL_UINT32, 4, 1},   [ncclInt64] = {CCL_INT64, 8, 1},     [ncclUint64] = {CCL_UINT64, 8, 1},
    [ncclFloat16] = {CCL_FLOAT16, 2, 1}, [ncclFloat32] = {CCL_FLOAT32, 4, 1}, [ncclFloat64] = {CCL_FLOAT64, 8, 1},
    [ncclBfloat16] = {CCL_BFLOAT16, 2, 1}, [ncclFp8E4M3] = {-1, 1, 0},        [ncclFp8E5M2] = {-1, 1, 0},
};
static const int OPS[] = {[ncclSum] = CCL_SUM, [ncclProd] = CCL_PROD, [ncclMax] = CCL_MAX, [ncclMin] = CCL_MIN,
                          [ncclAvg] = CCL_AVG};
static const char *const OP_NAMES[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};

static sc_status types(sc_op *o, size_t count, ncclDataType_t t, int reducing, ncclRedOp_t op, const char *fn)
{
    if ((unsigned)t >= ncclNumTypes)
        return sc_fail(SC_INVALID, "%s: invalid type %d (0..%d)", fn, (int)t, ncclNumTypes - 1);
    if (reducing && (unsigned)op >= ncclNumOps)
        return sc_fail(SC_INVALID, "%s: invalid reduction operation %d", fn, (int)op);
    if (reducing && !TYPES[t].reduce)
        return sc_fail(SC_UNSUPPORTED, "%s: the simulator cannot reduce data type %d with %s", fn, (int)t,
                       OP_NAMES[op]);
    sc_op_types(o, count, TYPES[t].ccl, TYPES[t].size, reducing ? OPS[op] : -1);
    return SC_OK;
}

static ncclResult_t submit(ncclComm_t comm, sc_op *o, hipStream_t stream, const char *fn)
{
    /* hipStreamLegacy (1) and hipStreamPerThread (2): the device's null stream, as in hip.c */
    if (stream == (hipStream_t)1 || stream == (hipStream_t)2)
        stream = NULL;
    return code(sc_submit((sc_comm *)comm, o, stream, fn));
}

NCCL_API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return code(sc_fail(SC_NULL, "ncclGetVersion: version is NULL"));
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    return code(sc_unique_id("nccl", uniqueId, sizeof *uniqueId));
}

/* Inits called inside a group wait for its outermost ncclGroupEnd, which makes them all at
 * once (one thread each), as NCCL does: one thread can so create the communicators of
 * several devices (the NCCL user guide's examples 1 and 3). */
typedef struct deferred_init {
    ncclUniqueId id;
    sc_init_req req;
} deferred_init;

static __thread int t_group;                  /* this thread's group depth */
static __thread deferred_init *t_inits;
static __thread int t_ninits, t_cap_inits;

static sc_status check_init(ncclComm_t *comm, int nranks, int rank, const char *fn)
{
    if (!comm)
        return sc_fail(SC_NULL, "%s: comm is NULL", fn);
    if (nranks < 1 || nranks > CCL_MAX_RANKS)
        return sc_fail(SC_INVALID, "%s: nranks=%d; the simulator supports 1..%d ranks", fn, nranks, CCL_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return sc_fail(SC_INVALID, "%s: rank=%d is outside 0..%d", fn, rank, nranks - 1);
    return SC_OK;
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    int dev;
    if (hipGetDevice(&dev) != 0)
        return code(sc_fail(SC_RUNTIME, "ncclCommInitRank: no usable current device"));
    sc_status st = check_init(comm, nranks, rank, "ncclCommInitRank");
    if (st != SC_OK)
        return code(st);
    if (t_group == 0)
        return code(sc_comm_init("nccl", &commId, sizeof commId, nranks, rank, (sc_comm **)comm));
    if (t_ninits == t_cap_inits) {
        int cap = t_cap_inits ? 2 * t_cap_inits : 8;
        deferred_init *p = realloc(t_inits, (size_t)cap * sizeof *p);
        if (!p)
            return code(sc_fail(SC_OOM, "ncclCommInitRank: out of host memory"));
        t_inits = p;
        t_cap_inits = cap;
    }
    *comm = NULL;                              /* made by the group's end */
    t_inits[t_ninits++] = (deferred_init){
        .id = commId, .req = {.size = sizeof commId, .nranks = nranks, .rank = rank, .logical = dev,
                              .out = (sc_comm **)comm}};
    return ncclSuccess;
}

/* NCCL's parseCommConfig: the config must come from NCCL_CONFIG_INITIALIZER (magic,
 * version) and blocking is 0, 1 or undefined; the tuning fields mean nothing here. */
static sc_status check_config(const ncclConfig_t *config, const char *fn)
{
    if (!config)
        return SC_OK;
    if (config->magic != 0xcafebeefu || config->size < offsetof(ncclConfig_t, netName))
        return sc_fail(SC_INVALID, "%s: the config was not initialized with NCCL_CONFIG_INITIALIZER (magic 0x%x, "
                       "size %zu)", fn, config->magic, config->size);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
        return sc_fail(SC_INVALID, "%s: config->blocking is %d; it is 0 or 1", fn, config->blocking);
    return SC_OK;
}

NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                             ncclConfig_t *config)
{
    /* a nonblocking communicator (blocking = 0) is made before the call returns, as a blocking
     * one: ncclCommGetAsyncError then reports ncclSuccess at once (docs/simulator.md) */
    sc_status st = check_config(config, "ncclCommInitRankConfig");
    return st ? code(st) : ncclCommInitRank(comm, nranks, commId, rank);
}

/* Splits called inside a group run at its outermost ncclGroupEnd, one thread each (as
 * NCCL defers them), so one thread can split the communicators of several devices. */
typedef struct deferred_split {
    sc_comm *parent;
    int color, key;
    sc_comm **out;
    sc_status st;
    char msg[480];
} deferred_split;

static __thread deferred_split *t_splits;
static __thread int t_nsplits, t_cap_splits;

NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    const char *fn = "ncclCommSplit";
    sc_status st = check_config(config, fn);
    if (st != SC_OK || t_group == 0)
        return code(st ? st : sc_comm_split((sc_comm *)comm, color, key, (sc_comm **)newcomm, fn));
    if ((st = sc_comm_check((sc_comm *)comm, fn)) != SC_OK)
        return code(st);
    if (!newcomm)
        return code(sc_fail(SC_NULL, "%s: newcomm is NULL", fn));
    if (color < NCCL_SPLIT_NOCOLOR)
        return code(sc_fail(SC_INVALID, "%s: color %d; a color is >= 0, or NCCL_SPLIT_NOCOLOR (-1)", fn, color));
    if (t_nsplits == t_cap_splits) {
        int cap = t_cap_splits ? 2 * t_cap_splits : 8;
        deferred_split *p = realloc(t_splits, (size_t)cap * sizeof *p);
        if (!p)
            return code(sc_fail(SC_OOM, "%s: out of host memory", fn));
        t_splits = p;
        t_cap_splits = cap;
    }
    *newcomm = NULL;                           /* made by the group's end */
    t_splits[t_nsplits++] = (deferred_split){.parent = (sc_comm *)comm, .color = color, .key = key,
                                             .out = (sc_comm **)newcomm};
    return ncclSuccess;
}

static void *split_one(void *arg)
{
    deferred_split *d = arg;
    d->st = sc_comm_split(d->parent, d->color, d->key, d->out, "ncclCommSplit");
    if (d->st != SC_OK)
        snprintf(d->msg, sizeof d->msg, "%s", sc_last_message());
    return NULL;
}

/* Make the splits deferred by this thread's group, together. */
static sc_status run_deferred_splits(void)
{
    int n = t_nsplits, started = 0;
    sc_status first = SC_OK;
    pthread_t *threads = n > 1 ? malloc((size_t)n * sizeof *threads) : NULL;
    if (n == 1)
        split_one(&t_splits[0]);
    else if (n > 1 && !threads)
        first = sc_fail(SC_OOM, "ncclGroupEnd: out of host memory");
    for (; threads && started < n; started++)
        if (pthread_create(&threads[started], NULL, split_one, &t_splits[started]) != 0) {
            first = sc_fail(SC_SYSTEM, "ncclGroupEnd: cannot start a thread for a split");
            break;
        }
    for (int i = 0; threads && i < started; i++)
        pthread_join(threads[i], NULL);
    const char *msg = NULL;
    for (int i = 0; i < (n == 1 ? 1 : started) && first == SC_OK; i++)
        if (t_splits[i].st != SC_OK)
            first = t_splits[i].st, msg = t_splits[i].msg;
    if (msg)
        sc_fail(first, "%s", msg);
    free(threads);
    free(t_splits);
    t_splits = NULL;
    t_nsplits = t_cap_splits = 0;
    return first;
}

/* Make the inits deferred by this thread's group. */
static sc_status run_deferred_inits(void)
{
    int n = t_ninits;
    if (n == 0)
        return SC_OK;
    sc_init_req *reqs = malloc((size_t)n * sizeof *reqs);
    sc_status st = SC_OK;
    if (!reqs)
        st = sc_fail(SC_OOM, "ncclGroupEnd: out of host memory");
    else {
        for (int i = 0; i < n; i++) {
            reqs[i] = t_inits[i].req;
            reqs[i].id = &t_inits[i].id;
        }
        st = sc_comm_init_many("nccl", reqs, n);
        free(reqs);
    }
    free(t_inits);
    t_inits = NULL;
    t_ninits = t_cap_inits = 0;
    return st;
}

NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms)
        return code(sc_fail(SC_NULL, "ncclCommInitAll: comms is NULL"));
    if (ndev < 1 || ndev > CCL_MAX_RANKS)
        return code(sc_fail(SC_INVALID, "ncclCommInitAll: ndev=%d; the simulator supports 1..%d", ndev,
                            CCL_MAX_RANKS));
    int count = 0;
    if (hipGetDeviceCount(&count) != 0)
        return code(sc_fail(SC_RUNTIME, "ncclCommInitAll: no visible device"));
    if (!devlist && ndev > count)
        return code(sc_fail(SC_INVALID, "ncclCommInitAll: ndev=%d but %d devices are visible", ndev, count));
    for (int i = 0; devlist && i < ndev; i++) {
        if (devlist[i] < 0 || devlist[i] >= count)
            return code(sc_fail(SC_INVALID, "ncclCommInitAll: devlist[%d]=%d is not a device (0..%d)", i, devlist[i],
                                count - 1));
        for (int k = 0; k < i; k++)
            if (devlist[k] == devlist[i])
                return code(sc_fail(SC_USAGE, "ncclCommInitAll: device %d is listed twice (devlist[%d] and "
                                    "devlist[%d])", devlist[i], k, i));
    }
    ncclUniqueId id;
    sc_status st = sc_unique_id("nccl", &id, sizeof id);
    sc_init_req *reqs = st == SC_OK ? calloc((size_t)ndev, sizeof *reqs) : NULL;
    if (st == SC_OK && !reqs)
        st = sc_fail(SC_OOM, "ncclCommInitAll: out of host memory");
    if (st == SC_OK) {
        for (int i = 0; i < ndev; i++)
            reqs[i] = (sc_init_req){.id = &id, .size = sizeof id, .nranks = ndev, .rank = i,
                                    .logical = devlist ? devlist[i] : i, .out = (sc_comm **)&comms[i]};
        st = sc_comm_init_many("nccl", reqs, ndev);
    }
    free(reqs);
    return code(st);
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return code(sc_comm_check((sc_comm *)comm, "ncclCommFinalize"));
}

/* NCCL / RCCL return success for a NULL communicator (init.cc) */
NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return comm ? code(sc_comm_destroy((sc_comm *)comm)) : ncclSuccess;
}

NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return comm ? code(sc_comm_abort((sc_comm *)comm)) : ncclSuccess;
}

NCCL_API const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

NCCL_API const char *ncclGetLastError(ncclComm_t comm)
{
    const char *msg;
    if (comm && sc_comm_check((sc_comm *)comm, "ncclGetLastError") == SC_OK &&
        sc_comm_async_error((sc_comm *)comm, &msg) != SC_OK)
        return msg;
    return sc_last_message();
}

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    sc_status st = sc_comm_check((sc_comm *)comm, "ncclCommGetAsyncError");
    if (st == SC_OK && !asyncError)
        st = sc_fail(SC_NULL, "ncclCommGetAsyncError: asyncError is NULL");
    if (st == SC_OK)
        *asyncError = code(sc_comm_async_error((sc_comm *)comm, NULL));
    return code(st);
}

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    return code(sc_comm_get((sc_comm *)comm, SC_COMM_SIZE, "ncclCommCount", "count", count));
}

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    return code(sc_comm_get((sc_comm *)comm, SC_COMM_DEVICE, "ncclCommCuDevice", "device", device));
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    return code(sc_comm_get((sc_comm *)comm, SC_COMM_RANK, "ncclCommUserRank", "rank", rank));
}

NCCL_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, int root, ncclComm_t comm, hipStream_t stream)
{
    sc_op o = {.kind = CCL_REDUCE, .root = root, .send = sendbuff, .recv = recvbuff};
    sc_status st = types(&o, count, datatype, 1, op, "ncclReduce");
    return st ? code(st) : submit(comm, &o, stream, "ncclReduce");
}

NCCL_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, hipStream_t stream)
{
    sc_op o = {.kind = CCL_BROADCAST, .root = root, .send = sendbuff, .recv = recvbuff};
    sc_status st = types(&o, count, datatype, 0, 0, "ncclBroadcast");
    return st ? code(st) : submit(comm, &o, stream, "ncclBroadcast");
}

NCCL_API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                hipStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, ncclComm_t comm, hipStream_t stream)
{
    sc_op o = {.kind = CCL_ALL_REDUCE, .root = -1, .send = sendbuff, .recv = recvbuff};
    sc_status st = types(&o, count, datatype, 1, op, "ncclAllReduce");
    return st ? code(st) : submit(comm, &o, stream, "ncclAllReduce");
}

NCCL_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, hipStream_t stream)
{
    sc_op o = {.kind = CCL_REDUCE_SCATTER, .root = -1, .send = sendbuff, .recv = recvbuff};
    sc_status st = types(&o, recvcount, datatype, 1, op, "ncclReduceScatter");
    return st ? code(st) : submit(comm, &o, stream, "ncclReduceScatter");
}

NCCL_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                    ncclComm_t comm, hipStream_t stream)
{
    sc_op o = {.kind = CCL_ALL_GATHER, .root = -1, .send = sendbuff, .recv = recvbuff};
    sc_status st = types(&o, sendcount, datatype, 0, 0, "ncclAllGather");
    return st ? code(st) : submit(comm, &o, stream, "ncclAllGather");
}

NCCL_API ncclResult_t ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclComm_t comm, hipStream_t stream)
{
    sc_op o = {.kind = CCL_ALL_TO_ALL, .root = -1, .send = sendbuff, .recv = recvbuff};
    sc_status st = types(&o, count, datatype, 0, 0, "ncclAllToAll");
    return st ? code(st) : submit(comm, &o, stream, "ncclAllToAll");
}

NCCL_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, hipStream_t stream)
{
    sc_op o = {.kind = CCL_SEND, .root = peer, .send = sendbuff};
    sc_status st = types(&o, count, datatype, 0, 0, "ncclSend");
    return st ? code(st) : submit(comm, &o, stream, "ncclSend");
}

NCCL_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               hipStream_t stream)
{
    sc_op o = {.kind = CCL_RECV, .root = peer, .recv = recvbuff};
    sc_status st = types(&o, count, datatype, 0, 0, "ncclRecv");
    return st ? code(st) : submit(comm, &o, stream, "ncclRecv");
}

NCCL_API ncclResult_t ncclGroupStart(void)
{
    sc_status st = sc_group_start();
    if (st == SC_OK)
        t_group++;
    return code(st);
}

NCCL_API ncclResult_t ncclGroupEnd(void)
{
    if (t_group == 0)
        return code(sc_group_end());           /* unbalanced: ncclInvalidUsage */
    sc_status st = SC_OK;
    if (--t_group == 0) {
        st = run_deferred_inits();             /* before the group's ops */
        sc_status sp = run_deferred_splits();
        if (st == SC_OK)
            st = sp;
    }
    sc_status ops = sc_group_end();
    return code(st != SC_OK ? st : ops);
}
