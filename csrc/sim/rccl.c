/*
 * RCCL in the Hygon simulator (libhygon_sim): the NCCL C API of rccl/rccl.h on the
 * anychip collective engine. Ops are enqueued on HIP streams of the simulator.
 *
 * Types: reductions work on int8, uint8, int32, uint32, int64, uint64, float16,
 * bfloat16, float32, float64 with every op (integer avg: the sum divided by the rank
 * count); reductions of the fp8 types return ncclInvalidArgument (RCCL reduces them). Data movement takes every type. Failures of
 * enqueued work are reported by ncclCommGetAsyncError (and ncclGetLastError) and by
 * every later call on the communicator.
 */
#include <stdint.h>
#include <stdio.h>

#include "collective.h"
#include "rccl/rccl.h"

#define NCCL_API SIM_EXPORT

typedef int hipError_t;
hipError_t hipGetDevice(int *deviceId);

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
    o->count = count;
    if (!reducing) {
        o->dtype = CCL_UINT8;
        o->redop = -1;
        o->count = count * (uint64_t)TYPES[t].size;
        return SC_OK;
    }
    if ((unsigned)op >= ncclNumOps)
        return sc_fail(SC_INVALID, "%s: invalid reduction operation %d", fn, (int)op);
    if (!TYPES[t].reduce)
        return sc_fail(SC_UNSUPPORTED, "%s: the simulator cannot reduce data type %d with %s", fn, (int)t,
                       OP_NAMES[op]);
    o->dtype = TYPES[t].ccl;
    o->redop = OPS[op];
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

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    int dev;
    if (hipGetDevice(&dev) != 0)
        return code(sc_fail(SC_RUNTIME, "ncclCommInitRank: no usable current device"));
    return code(sc_comm_init("nccl", &commId, sizeof commId, nranks, rank, (sc_comm **)comm));
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
    sc_status st = sc_comm_check((sc_comm *)comm, "ncclCommCount");
    if (st == SC_OK && !count)
        st = sc_fail(SC_NULL, "ncclCommCount: count is NULL");
    if (st == SC_OK)
        *count = sc_comm_size((sc_comm *)comm);
    return code(st);
}

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    sc_status st = sc_comm_check((sc_comm *)comm, "ncclCommCuDevice");
    if (st == SC_OK && !device)
        st = sc_fail(SC_NULL, "ncclCommCuDevice: device is NULL");
    if (st == SC_OK)
        *device = sc_comm_device((sc_comm *)comm);
    return code(st);
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    sc_status st = sc_comm_check((sc_comm *)comm, "ncclCommUserRank");
    if (st == SC_OK && !rank)
        st = sc_fail(SC_NULL, "ncclCommUserRank: rank is NULL");
    if (st == SC_OK)
        *rank = sc_comm_rank((sc_comm *)comm);
    return code(st);
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

NCCL_API ncclResult_t ncclGroupStart(void) { return code(sc_group_start()); }

NCCL_API ncclResult_t ncclGroupEnd(void) { return code(sc_group_end()); }
