/*
 * HCCL in the Ascend simulator (libascend_sim): the HCCL C API of hccl/hccl.h on the
 * anychip collective engine. Ops are enqueued on ACL streams of the simulator.
 *
 * Types: reductions work on int8, int16, uint8, int32, uint32, int64, uint64, fp16,
 * bf16, fp32, fp64; PROD of int16 is HCCL_E_NOT_SUPPORT (as on 910B / 910_93; they also
 * refuse bf16 PROD, which the simulator reduces), and so are uint16 and the 8-bit float types. Data movement (broadcast, all-gather,
 * all-to-all, send / recv) takes every type but the reserved INT128. An unknown type or
 * op is HCCL_E_NOT_SUPPORT; an op of count 0 returns HCCL_SUCCESS before any check.
 * HCCL has no average op. Failures of enqueued work are reported by
 * HcclGetCommAsyncError and by every later call on the communicator.
 */
#include <stdint.h>
#include <stdlib.h>

#include "acl/acl.h"
#include "collective.h"
#include "hccl/hccl.h"

#define HCCL_API SIM_EXPORT


static HcclResult code(sc_status st)
{
    switch (st) {
    case SC_OK: return HCCL_SUCCESS;
    case SC_INVALID:
    case SC_USAGE: return HCCL_E_PARA;
    case SC_NULL: return HCCL_E_PTR;
    case SC_UNSUPPORTED: return HCCL_E_NOT_SUPPORT;
    case SC_TIMEOUT: return HCCL_E_TIMEOUT;
    case SC_REMOTE: return HCCL_E_REMOTE;
    case SC_SYSTEM: return HCCL_E_SYSCALL;
    case SC_OOM: return HCCL_E_MEMORY;
    case SC_RUNTIME: return HCCL_E_RUNTIME;
    default: return HCCL_E_INTERNAL;
    }
}

/* reduce: 1 every op, 3 all but PROD (910B / 910_93 refuse PROD of int16: cann-hccl
 * HcomCheckReduceDataType; they refuse it for bf16 too, which the simulator reduces), 0 none; size 0: not a type HCCL moves (INT128 is reserved, 13 unassigned) */
static const struct { int ccl; int size; int reduce; } TYPES[] = {
    [HCCL_DATA_TYPE_INT8] = {CCL_INT8, 1, 1},       [HCCL_DATA_TYPE_INT16] = {CCL_INT16, 2, 3},
    [HCCL_DATA_TYPE_INT32] = {CCL_INT32, 4, 1},     [HCCL_DATA_TYPE_FP16] = {CCL_FLOAT16, 2, 1},
    [HCCL_DATA_TYPE_FP32] = {CCL_FLOAT32, 4, 1},    [HCCL_DATA_TYPE_INT64] = {CCL_INT64, 8, 1},
    [HCCL_DATA_TYPE_UINT64] = {CCL_UINT64, 8, 1},   [HCCL_DATA_TYPE_UINT8] = {CCL_UINT8, 1, 1},
    [HCCL_DATA_TYPE_UINT16] = {-1, 2, 0},           [HCCL_DATA_TYPE_UINT32] = {CCL_UINT32, 4, 1},
    [HCCL_DATA_TYPE_FP64] = {CCL_FLOAT64, 8, 1},    [HCCL_DATA_TYPE_BFP16] = {CCL_BFLOAT16, 2, 1},
    [HCCL_DATA_TYPE_INT128] = {-1, 0, 0},           [HCCL_DATA_TYPE_HIF8] = {-1, 1, 0},
    [HCCL_DATA_TYPE_FP8E4M3] = {-1, 1, 0},          [HCCL_DATA_TYPE_FP8E5M2] = {-1, 1, 0},
    [HCCL_DATA_TYPE_FP8E8M0] = {-1, 1, 0},
};
#define NTYPES ((int)(sizeof TYPES / sizeof TYPES[0]))
static const char *const TYPE_NAMES[] = {"INT8",   "INT16",  "INT32", "FP16",   "FP32",    "INT64",
                                         "UINT64", "UINT8",  "UINT16", "UINT32", "FP64",   "BFP16",
                                         "INT128", "13",     "HIF8",  "FP8E4M3", "FP8E5M2", "FP8E8M0"};
static const char *const OP_NAMES[] = {"SUM", "PROD", "MAX", "MIN"};
static const int OPS[] = {[HCCL_REDUCE_SUM] = CCL_SUM, [HCCL_REDUCE_PROD] = CCL_PROD, [HCCL_REDUCE_MAX] = CCL_MAX,
                          [HCCL_REDUCE_MIN] = CCL_MIN};

/* Fill dtype / redop / count of `o`: reductions in the engine's type, movement as bytes.
 * An unknown type or op is HCCL_E_NOT_SUPPORT, as HcomCheckDataType / HcomCheckReductionOp
 * return. */
static sc_status types(sc_op *o, uint64_t count, HcclDataType t, int reducing, HcclReduceOp op, const char *fn)
{
    if ((unsigned)t >= (unsigned)NTYPES || TYPES[t].size == 0)
        return sc_fail(SC_UNSUPPORTED, "%s: dataType %d is not a data type HCCL supports (0..11, 14..17)", fn,
                       (int)t);
    o->count = count;
    if (!reducing) {
        o->dtype = CCL_UINT8;
        o->redop = -1;
        o->count = count * (uint64_t)TYPES[t].size;
        return SC_OK;
    }
    if ((unsigned)op > HCCL_REDUCE_MIN)
        return sc_fail(SC_UNSUPPORTED, "%s: op %d is not an HcclReduceOp (SUM 0, PROD 1, MAX 2, MIN 3)", fn, (int)op);
    int r = TYPES[t].reduce;
    if (!r || (r == 3 && op == HCCL_REDUCE_PROD))
        return sc_fail(SC_UNSUPPORTED, "%s: HCCL does not reduce HCCL_DATA_TYPE_%s with HCCL_REDUCE_%s", fn,
                       TYPE_NAMES[t], OP_NAMES[op]);
    o->dtype = TYPES[t].ccl;
    o->redop = OPS[op];
    return SC_OK;
}

static HcclResult submit(HcclComm comm, sc_op *o, aclrtStream stream, const char *fn)
{
    return code(sc_submit((sc_comm *)comm, o, stream, fn));
}

HCCL_API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)
{
    return code(sc_unique_id("hccl", rootInfo, sizeof *rootInfo));
}

HCCL_API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                         HcclComm *comm)
{
    int32_t dev;
    if (aclrtGetDevice(&dev) != 0)
        return code(sc_fail(SC_RUNTIME, "HcclCommInitRootInfo: no current device; call aclrtSetDevice first"));
    if (!comm || !rootInfo)
        return code(sc_fail(SC_NULL, "HcclCommInitRootInfo: %s is NULL", comm ? "rootInfo" : "comm"));
    if (nRanks > INT32_MAX || rank > INT32_MAX)
        return code(sc_fail(SC_INVALID, "HcclCommInitRootInfo: nRanks=%u, rank=%u out of range", nRanks, rank));
    return code(sc_comm_init("hccl", rootInfo, sizeof *rootInfo, (int)nRanks, (int)rank, (sc_comm **)comm));
}

HCCL_API HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms)
{
    if (!devices || !comms)
        return code(sc_fail(SC_NULL, "HcclCommInitAll: %s is NULL", devices ? "comms" : "devices"));
    uint32_t count = 0;
    if (aclrtGetDeviceCount(&count) != 0)
        return code(sc_fail(SC_RUNTIME, "HcclCommInitAll: no visible device"));
    if (ndev < 1 || ndev > count || ndev > CCL_MAX_RANKS)
        return code(sc_fail(SC_INVALID, "HcclCommInitAll: ndev=%u; 1..%u devices are visible", ndev, count));
    for (uint32_t i = 0; i < ndev; i++) {
        if (devices[i] < 0 || (uint32_t)devices[i] >= count)
            return code(sc_fail(SC_INVALID, "HcclCommInitAll: devices[%u]=%d is not a device (0..%u)", i,
                                (int)devices[i], count - 1));
        for (uint32_t k = 0; k < i; k++)
            if (devices[k] == devices[i])
                return code(sc_fail(SC_INVALID, "HcclCommInitAll: device %d is listed twice (devices[%u] and "
                                    "devices[%u])", (int)devices[i], k, i));
    }
    HcclRootInfo root;
    sc_status st = sc_unique_id("hccl", &root, sizeof root);
    sc_init_req *reqs = st == SC_OK ? calloc(ndev, sizeof *reqs) : NULL;
    if (st == SC_OK && !reqs)
        st = sc_fail(SC_OOM, "HcclCommInitAll: out of host memory");
    if (st == SC_OK) {
        for (uint32_t i = 0; i < ndev; i++)
            reqs[i] = (sc_init_req){.id = &root, .size = sizeof root, .nranks = (int)ndev, .rank = (int)i,
                                    .logical = devices[i], .out = (sc_comm **)&comms[i]};
        st = sc_comm_init_many("hccl", reqs, (int)ndev);
    }
    free(reqs);
    return code(st);
}

HCCL_API HcclResult HcclCommDestroy(HcclComm comm)
{
    if (!comm)
        return HCCL_SUCCESS; /* CANN skips a NULL communicator */
    return code(sc_comm_destroy((sc_comm *)comm));
}

HCCL_API HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize)
{
    sc_status st = sc_comm_check((sc_comm *)comm, "HcclGetRankSize");
    if (st == SC_OK && !rankSize)
        st = sc_fail(SC_NULL, "HcclGetRankSize: rankSize is NULL");
    if (st == SC_OK)
        *rankSize = (uint32_t)sc_comm_size((sc_comm *)comm);
    return code(st);
}

HCCL_API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank)
{
    sc_status st = sc_comm_check((sc_comm *)comm, "HcclGetRankId");
    if (st == SC_OK && !rank)
        st = sc_fail(SC_NULL, "HcclGetRankId: rank is NULL");
    if (st == SC_OK)
        *rank = (uint32_t)sc_comm_rank((sc_comm *)comm);
    return code(st);
}

HCCL_API HcclResult HcclGetCommName(HcclComm comm, char *commName)
{
    sc_status st = sc_comm_check((sc_comm *)comm, "HcclGetCommName");
    if (st == SC_OK && !commName)
        st = sc_fail(SC_NULL, "HcclGetCommName: commName is NULL");
    if (st == SC_OK) {
        const char *n = sc_comm_name((sc_comm *)comm);
        size_t i = 0;
        for (; n[i] && i < 127; i++)
            commName[i] = n[i];
        commName[i] = 0;
    }
    return code(st);
}

HCCL_API HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError)
{
    sc_status st = sc_comm_check((sc_comm *)comm, "HcclGetCommAsyncError");
    if (st == SC_OK && !asyncError)
        st = sc_fail(SC_NULL, "HcclGetCommAsyncError: asyncError is NULL");
    if (st == SC_OK) {
        const char *msg;
        sc_status a = sc_comm_async_error((sc_comm *)comm, &msg);
        if (a != SC_OK)
            sc_fail(a, "%s", msg);
        *asyncError = code(a);
    }
    return code(st);
}

HCCL_API const char *HcclGetErrorString(HcclResult code)
{
    static const char *const names[] = {
        "HCCL_SUCCESS", "HCCL_E_PARA", "HCCL_E_PTR", "HCCL_E_MEMORY", "HCCL_E_INTERNAL", "HCCL_E_NOT_SUPPORT",
        "HCCL_E_NOT_FOUND", "HCCL_E_UNAVAIL", "HCCL_E_SYSCALL", "HCCL_E_TIMEOUT", "HCCL_E_OPEN_FILE_FAILURE",
        "HCCL_E_TCP_CONNECT", "HCCL_E_ROCE_CONNECT", "HCCL_E_TCP_TRANSFER", "HCCL_E_ROCE_TRANSFER",
        "HCCL_E_RUNTIME", "HCCL_E_DRV", "HCCL_E_PROFILING", "HCCL_E_CCE", "HCCL_E_NETWORK", "HCCL_E_AGAIN",
        "HCCL_E_REMOTE", "HCCL_E_SUSPENDING", "HCCL_E_OPRETRY_FAIL", "HCCL_E_OOM"};
    if ((unsigned)code < sizeof names / sizeof names[0])
        return names[code];
    return "HCCL_E_UNKNOWN";
}

HCCL_API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                                  HcclReduceOp op, HcclComm comm, aclrtStream stream)
{
    if (count == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_ALL_REDUCE, .root = -1, .send = sendBuf, .recv = recvBuf};
    sc_status st = types(&o, count, dataType, 1, op, "HcclAllReduce");
    return st ? code(st) : submit(comm, &o, stream, "HcclAllReduce");
}

HCCL_API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                                  aclrtStream stream)
{
    if (count == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_BROADCAST, .root = root > INT32_MAX ? INT32_MAX : (int)root, .send = buf, .recv = buf};
    sc_status st = types(&o, count, dataType, 0, 0, "HcclBroadcast");
    return st ? code(st) : submit(comm, &o, stream, "HcclBroadcast");
}

HCCL_API HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                               uint32_t root, HcclComm comm, aclrtStream stream)
{
    if (count == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_REDUCE, .root = root > INT32_MAX ? INT32_MAX : (int)root, .send = sendBuf,
               .recv = recvBuf};
    sc_status st = types(&o, count, dataType, 1, op, "HcclReduce");
    return st ? code(st) : submit(comm, &o, stream, "HcclReduce");
}

HCCL_API HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                      HcclReduceOp op, HcclComm comm, aclrtStream stream)
{
    if (recvCount == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_REDUCE_SCATTER, .root = -1, .send = sendBuf, .recv = recvBuf};
    sc_status st = types(&o, recvCount, dataType, 1, op, "HcclReduceScatter");
    return st ? code(st) : submit(comm, &o, stream, "HcclReduceScatter");
}

HCCL_API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType,
                                  HcclComm comm, aclrtStream stream)
{
    if (sendCount == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_ALL_GATHER, .root = -1, .send = sendBuf, .recv = recvBuf};
    sc_status st = types(&o, sendCount, dataType, 0, 0, "HcclAllGather");
    return st ? code(st) : submit(comm, &o, stream, "HcclAllGather");
}

HCCL_API HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType, const void *recvBuf,
                                 uint64_t recvCount, HcclDataType recvType, HcclComm comm, aclrtStream stream)
{
    if (sendCount == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_ALL_TO_ALL, .root = -1, .send = sendBuf, .recv = (void *)recvBuf};
    sc_status st = types(&o, sendCount, sendType, 0, 0, "HcclAlltoAll");
    sc_op r = {0};
    if (st == SC_OK)
        st = types(&r, recvCount, recvType, 0, 0, "HcclAlltoAll");
    if (st == SC_OK && r.count != o.count)
        st = sc_fail(SC_INVALID, "HcclAlltoAll: each block sends %llu bytes but receives %llu; they must match",
                     (unsigned long long)o.count, (unsigned long long)r.count);
    return st ? code(st) : submit(comm, &o, stream, "HcclAlltoAll");
}

HCCL_API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                             aclrtStream stream)
{
    if (count == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_SEND, .root = destRank > INT32_MAX ? INT32_MAX : (int)destRank, .send = sendBuf};
    sc_status st = types(&o, count, dataType, 0, 0, "HcclSend");
    return st ? code(st) : submit(comm, &o, stream, "HcclSend");
}

HCCL_API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                             aclrtStream stream)
{
    if (count == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    sc_op o = {.kind = CCL_RECV, .root = srcRank > INT32_MAX ? INT32_MAX : (int)srcRank, .recv = recvBuf};
    sc_status st = types(&o, count, dataType, 0, 0, "HcclRecv");
    return st ? code(st) : submit(comm, &o, stream, "HcclRecv");
}

HCCL_API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream)
{
    sc_op o = {.kind = CCL_BARRIER, .dtype = CCL_UINT8, .redop = -1, .root = -1};
    return submit(comm, &o, stream, "HcclBarrier");
}

HCCL_API HcclResult HcclGroupStart(void) { return code(sc_group_start()); }

HCCL_API HcclResult HcclGroupEnd(void) { return code(sc_group_end()); }
