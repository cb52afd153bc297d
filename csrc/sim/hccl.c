/*
 * HCCL in the Ascend simulator (libascend_sim): the HCCL C API of hccl/hccl.h on the
 * anychip collective engine. Ops are enqueued on ACL streams of the simulator.
 *
 * Types: reductions work on int8, int16, uint8, int32, uint32, int64, uint64, fp16,
 * bf16, fp32, fp64; PROD of int16 is HCCL_E_NOT_SUPPORT (as on 910B / 910_93; they also
 * refuse bf16 PROD, which the simulator reduces), and so are uint16 and the 8-bit float
 * types. Data movement (broadcast, all-gather, all-to-all, send / recv) takes every type
 * but the reserved INT128. An unknown type or
 * op is HCCL_E_NOT_SUPPORT; an op of count 0 returns HCCL_SUCCESS before any check.
 * HCCL has no average op. Every op needs a stream (NULL is HCCL_E_PTR, as CANN's
 * HcomCheckOpParam answers). The v-variants and HcclBatchSendRecv are built of the engine's
 * point-to-point ops and one rooted collective per rank, submitted together. Failures of
 * enqueued work are reported by HcclGetCommAsyncError and by every later call on the
 * communicator.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (reducing && (unsigned)op > HCCL_REDUCE_MIN)
        return sc_fail(SC_UNSUPPORTED, "%s: op %d is not an HcclReduceOp (SUM 0, PROD 1, MAX 2, MIN 3)", fn, (int)op);
    int r = TYPES[t].reduce;
    if (reducing && (!r || (r == 3 && op == HCCL_REDUCE_PROD)))
        return sc_fail(SC_UNSUPPORTED, "%s: HCCL does not reduce HCCL_DATA_TYPE_%s with HCCL_REDUCE_%s", fn,
                       TYPE_NAMES[t], OP_NAMES[op]);
    sc_op_types(o, count, TYPES[t].ccl, TYPES[t].size, reducing ? OPS[op] : -1);
    return SC_OK;
}

/* CANN refuses a NULL stream (HCCL_E_PTR: param_check.cc, HcomCheckOpParam); HCCL has no
 * default stream. */
static sc_status need_stream(aclrtStream stream, const char *fn)
{
    if (!stream)
        return sc_fail(SC_NULL, "%s: stream is NULL; HCCL ops run on a stream the caller created "
                       "(aclrtCreateStream)", fn);
    return SC_OK;
}

static HcclResult submit(HcclComm comm, sc_op *o, aclrtStream stream, const char *fn)
{
    sc_status st = need_stream(stream, fn);
    return code(st ? st : sc_submit((sc_comm *)comm, o, stream, fn));
}

static HcclResult submit_many(HcclComm comm, sc_op *ops, int n, aclrtStream stream, const char *fn)
{
    sc_status st = need_stream(stream, fn);
    return code(st ? st : sc_submit_many((sc_comm *)comm, ops, n, stream, fn));
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

/* ---- rank table files (HcclCommInitClusterInfo) ------------------------------------------
 * CANN's rank table (version 1.0 / 1.2): {"server_list": [{"server_id": ..., "device": [
 * {"device_id": "0", "device_ip": ..., "rank_id": "0"}, ...]}, ...], ...}. The simulator reads
 * every object that has a "rank_id" (with its "device_id"); the ranks must be 0..n-1, each
 * once. Values may be strings (as CANN writes them) or numbers. */

typedef struct rt_rank { long rank, device; } rt_rank;
typedef struct rt_parse {
    const char *p, *end;
    rt_rank ranks[CCL_MAX_RANKS];
    int n;
    int overflow;
    char err[160];
} rt_parse;

static void rt_ws(rt_parse *x)
{
    while (x->p < x->end && (*x->p == ' ' || *x->p == '\t' || *x->p == '\n' || *x->p == '\r'))
        x->p++;
}

static int rt_error(rt_parse *x, const char *what)
{
    if (!x->err[0])
        snprintf(x->err, sizeof x->err, "%s at byte %ld", what, (long)(x->end - x->p));
    return -1;
}

/* a string's contents into buf (escapes kept as written; rank tables hold plain text) */
static int rt_string(rt_parse *x, char *buf, size_t cap)
{
    if (x->p >= x->end || *x->p != '"')
        return rt_error(x, "expected a string");
    x->p++;
    size_t n = 0;
    while (x->p < x->end && *x->p != '"') {
        if (*x->p == '\\' && x->p + 1 < x->end)
            x->p++;
        if (buf && n + 1 < cap)
            buf[n++] = *x->p;
        x->p++;
    }
    if (x->p >= x->end)
        return rt_error(x, "unterminated string");
    x->p++;
    if (buf)
        buf[n] = 0;
    return 0;
}

static int rt_value(rt_parse *x, char *scalar, size_t cap, int depth);

static int rt_object(rt_parse *x, int depth)
{
    long rank = -1, device = -1;
    int has_rank = 0;
    x->p++;
    rt_ws(x);
    if (x->p < x->end && *x->p == '}')
        return x->p++, 0;
    for (;;) {
        char key[32], val[64];
        rt_ws(x);
        if (rt_string(x, key, sizeof key))
            return -1;
        rt_ws(x);
        if (x->p >= x->end || *x->p != ':')
            return rt_error(x, "expected ':'");
        x->p++;
        val[0] = 0;
        if (rt_value(x, val, sizeof val, depth + 1))
            return -1;
        char *e;
        if (!strcmp(key, "rank_id")) {
            rank = strtol(val, &e, 10);
            has_rank = 1;
            if (!val[0] || *e || rank < 0)
                return rt_error(x, "a rank_id is not a number >= 0");
        } else if (!strcmp(key, "device_id")) {
            device = strtol(val, &e, 10);
            if (!val[0] || *e || device < 0)
                return rt_error(x, "a device_id is not a number >= 0");
        }
        rt_ws(x);
        if (x->p < x->end && *x->p == ',') {
            x->p++;
            continue;
        }
        if (x->p < x->end && *x->p == '}') {
            x->p++;
            break;
        }
        return rt_error(x, "expected ',' or '}'");
    }
    if (has_rank) {
        if (x->n == CCL_MAX_RANKS)
            x->overflow = 1;
        else
            x->ranks[x->n++] = (rt_rank){rank, device};
    }
    return 0;
}

static int rt_value(rt_parse *x, char *scalar, size_t cap, int depth)
{
    rt_ws(x);
    if (x->p >= x->end)
        return rt_error(x, "unexpected end");
    if (depth > 16)
        return rt_error(x, "nested too deeply");
    char c = *x->p;
    if (c == '{')
        return rt_object(x, depth);
    if (c == '[') {
        x->p++;
        rt_ws(x);
        if (x->p < x->end && *x->p == ']')
            return x->p++, 0;
        for (;;) {
            if (rt_value(x, NULL, 0, depth + 1))
                return -1;
            rt_ws(x);
            if (x->p < x->end && *x->p == ',') {
                x->p++;
                continue;
            }
            if (x->p < x->end && *x->p == ']')
                return x->p++, 0;
            return rt_error(x, "expected ',' or ']'");
        }
    }
    if (c == '"')
        return rt_string(x, scalar, cap);
    size_t n = 0;   /* number, true, false, null */
    while (x->p < x->end && *x->p != ',' && *x->p != '}' && *x->p != ']' && *x->p != ' ' && *x->p != '\n' &&
           *x->p != '\r' && *x->p != '\t') {
        if (scalar && n + 1 < cap)
            scalar[n++] = *x->p;
        x->p++;
    }
    if (scalar)
        scalar[n] = 0;
    return n ? 0 : rt_error(x, "expected a value");
}

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

HCCL_API HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm)
{
    const char *fn = "HcclCommInitClusterInfo";
    if (!clusterInfo || !comm)
        return code(sc_fail(SC_NULL, "%s: %s is NULL", fn, clusterInfo ? "comm" : "clusterInfo"));
    int phys;
    int32_t dev;
    if (aclrtGetDevice(&dev) != 0 || sim_current_phys(&phys) != SIM_OK)
        return code(sc_fail(SC_RUNTIME, "%s: no current device; call aclrtSetDevice first", fn));
    FILE *f = fopen(clusterInfo, "rb");
    if (!f) {
        sc_fail(SC_INVALID, "%s: cannot open the rank table file %s", fn, clusterInfo);
        return HCCL_E_OPEN_FILE_FAILURE;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            char *t = realloc(text, cap = cap ? 2 * cap : 8192);
            if (!t) {
                free(text);
                fclose(f);
                return code(sc_fail(SC_OOM, "%s: out of host memory", fn));
            }
            text = t;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0 || len > (1u << 24))
            break;
    }
    fclose(f);
    rt_parse *x = calloc(1, sizeof *x);
    if (!x) {
        free(text);
        return code(sc_fail(SC_OOM, "%s: out of host memory", fn));
    }
    x->p = text;
    x->end = text + len;
    sc_status st = SC_OK;
    if (rt_value(x, NULL, 0, 0))
        st = sc_fail(SC_INVALID, "%s: %s is not a JSON rank table: %s", fn, clusterInfo, x->err);
    else if (x->overflow)
        st = sc_fail(SC_INVALID, "%s: %s lists more than %d ranks (the simulator's limit)", fn, clusterInfo,
                     CCL_MAX_RANKS);
    else if (x->n == 0)
        st = sc_fail(SC_INVALID, "%s: %s lists no device with a rank_id (server_list[].device[])", fn, clusterInfo);
    int nranks = x->n;
    long mine = -1;
    for (int i = 0; st == SC_OK && i < nranks; i++) {
        int seen = 0;
        for (int k = 0; k < nranks; k++)
            if (x->ranks[k].rank == i) {
                seen++;
                if (i == (long)rank)
                    mine = x->ranks[k].device;
            }
        if (seen != 1)
            st = sc_fail(SC_INVALID, "%s: %s lists rank_id %d %s; the %d ranks must be 0..%d, each once", fn,
                         clusterInfo, i, seen ? "more than once" : "not at all", nranks, nranks - 1);
    }
    if (st == SC_OK && rank >= (uint32_t)nranks)
        st = sc_fail(SC_INVALID, "%s: rank %u is not in %s (ranks 0..%d)", fn, rank, clusterInfo, nranks - 1);
    /* inferred: a rank runs on the device its entry names (the device set with aclrtSetDevice) */
    if (st == SC_OK && mine >= 0 && mine != phys)
        st = sc_fail(SC_INVALID, "%s: rank %u's device_id in %s is %ld but the current device is %d (physical %d); "
                     "call aclrtSetDevice with that rank's device first", fn, rank, clusterInfo, mine, (int)dev, phys);
    if (st == SC_OK) {
        /* every rank reads the same file: its contents name the communicator; the n-th
         * init from one table in a process is the n-th in every rank */
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        static struct { uint64_t hash; unsigned count; } seen[64];
        static int nseen;
        uint64_t h = fnv1a(text, len);
        unsigned gen = 0;
        pthread_mutex_lock(&lock);
        int i = 0;
        while (i < nseen && seen[i].hash != h)
            i++;
        if (i == nseen && nseen < 64)
            seen[nseen++].hash = h;
        if (i < 64)
            gen = seen[i].count++;
        pthread_mutex_unlock(&lock);
        HcclRootInfo id;
        memset(&id, 0, sizeof id);
        snprintf(id.internal, sizeof id.internal, "anychip-ccl:hccl-rt-%016llx-%u", (unsigned long long)h, gen);
        st = sc_comm_init("hccl", &id, sizeof id, nranks, (int)rank, (sc_comm **)comm);
    }
    free(x);
    free(text);
    return code(st);
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
    return code(sc_comm_get((sc_comm *)comm, SC_COMM_SIZE, "HcclGetRankSize", "rankSize", (int *)rankSize));
}

HCCL_API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank)
{
    return code(sc_comm_get((sc_comm *)comm, SC_COMM_RANK, "HcclGetRankId", "rank", (int *)rank));
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
    sc_status a;
    sc_status st = sc_comm_get_async_error((sc_comm *)comm, "HcclGetCommAsyncError", "asyncError",
                                           asyncError ? &a : NULL);
    if (st == SC_OK)
        *asyncError = code(a);
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

/* HcclSend / HcclRecv: `o` names the kind and the buffer */
static HcclResult point_to_point(sc_op o, uint64_t count, HcclDataType dataType, uint32_t peer, HcclComm comm,
                                 aclrtStream stream, const char *fn)
{
    if (count == 0)
        return HCCL_SUCCESS; /* CANN: before any check */
    o.root = peer > INT32_MAX ? INT32_MAX : (int)peer;
    sc_status st = types(&o, count, dataType, 0, 0, fn);
    return st ? code(st) : submit(comm, &o, stream, fn);
}

HCCL_API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                             aclrtStream stream)
{
    sc_op o = {.kind = CCL_SEND, .send = sendBuf};
    return point_to_point(o, count, dataType, destRank, comm, stream, "HcclSend");
}

HCCL_API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                             aclrtStream stream)
{
    sc_op o = {.kind = CCL_RECV, .recv = recvBuf};
    return point_to_point(o, count, dataType, srcRank, comm, stream, "HcclRecv");
}

HCCL_API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream)
{
    sc_op o = {.kind = CCL_BARRIER, .dtype = CCL_UINT8, .redop = -1, .root = -1};
    return submit(comm, &o, stream, "HcclBarrier");
}

HCCL_API HcclResult HcclGroupStart(void) { return code(sc_group_start()); }

HCCL_API HcclResult HcclGroupEnd(void) { return code(sc_group_end()); }

/* ---- v-variants and batches: built of the engine's point-to-point ops and of one rooted
 * collective per rank, submitted together (one engine task, or part of the caller's group) ---- */

/* The communicator's size for a v-variant (its arrays have one entry per rank). */
static sc_status v_size(HcclComm comm, const char *fn, int *n, int *rank)
{
    sc_status st = sc_comm_check((sc_comm *)comm, fn);
    if (st == SC_OK) {
        *n = sc_comm_size((sc_comm *)comm);
        *rank = sc_comm_rank((sc_comm *)comm);
    }
    return st;
}

static sc_status v_arrays(const void *a, const void *b, const char *na, const char *nb, const char *fn)
{
    if (!a || !b)
        return sc_fail(SC_NULL, "%s: %s is NULL", fn, !a ? na : nb);
    return SC_OK;
}

static const char *at(const void *base, uint64_t elems, uint64_t size)
{
    return (const char *)base + elems * size;
}

HCCL_API HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls,
                                  HcclDataType sendType, const void *recvBuf, const void *recvCounts,
                                  const void *rdispls, HcclDataType recvType, HcclComm comm, aclrtStream stream)
{
    const char *fn = "HcclAlltoAllV";
    int n = 0, rank = 0;
    sc_op t = {0}, r = {0};
    sc_status st = v_size(comm, fn, &n, &rank);
    if (st == SC_OK)
        st = v_arrays(sendCounts, sdispls, "sendCounts", "sdispls", fn);
    if (st == SC_OK)
        st = v_arrays(recvCounts, rdispls, "recvCounts", "rdispls", fn);
    if (st == SC_OK)
        st = types(&t, 1, sendType, 0, 0, fn);
    if (st == SC_OK)
        st = types(&r, 1, recvType, 0, 0, fn);
    if (st != SC_OK)
        return code(st);
    const uint64_t *sc = sendCounts, *sd = sdispls, *rc = recvCounts, *rd = rdispls;
    sc_op ops[2 * CCL_MAX_RANKS];
    int k = 0;
    for (int j = 0; j < n; j++) {
        ops[k++] = (sc_op){.kind = CCL_SEND, .dtype = CCL_UINT8, .redop = -1, .root = j, .count = sc[j] * t.count,
                           .send = at(sendBuf, sd[j], t.count)};
        ops[k++] = (sc_op){.kind = CCL_RECV, .dtype = CCL_UINT8, .redop = -1, .root = j, .count = rc[j] * r.count,
                           .recv = (void *)at(recvBuf, rd[j], r.count)};
    }
    return submit_many(comm, ops, k, stream, fn);
}

HCCL_API HcclResult HcclAllGatherV(void *sendBuf, uint64_t sendCount, void *recvBuf, const void *recvCounts,
                                   const void *recvDispls, HcclDataType dataType, HcclComm comm, aclrtStream stream)
{
    const char *fn = "HcclAllGatherV";
    int n = 0, rank = 0;
    sc_op t = {0};
    sc_status st = v_size(comm, fn, &n, &rank);
    if (st == SC_OK)
        st = v_arrays(recvCounts, recvDispls, "recvCounts", "recvDispls", fn);
    if (st == SC_OK)
        st = types(&t, 1, dataType, 0, 0, fn);
    const uint64_t *rc = recvCounts, *rd = recvDispls;
    if (st == SC_OK && rc[rank] != sendCount)
        st = sc_fail(SC_INVALID, "%s: rank %d sends %llu elements but recvCounts[%d] is %llu; they must match", fn,
                     rank, (unsigned long long)sendCount, rank, (unsigned long long)rc[rank]);
    if (st != SC_OK)
        return code(st);
    /* one broadcast per rank: rank i's block goes from its sendBuf to recvBuf + recvDispls[i] everywhere */
    sc_op ops[CCL_MAX_RANKS];
    for (int i = 0; i < n; i++) {
        void *dst = (void *)at(recvBuf, rd[i], t.count);
        ops[i] = (sc_op){.kind = CCL_BROADCAST, .dtype = CCL_UINT8, .redop = -1, .root = i, .count = rc[i] * t.count,
                         .send = i == rank ? sendBuf : dst, .recv = dst};
    }
    return submit_many(comm, ops, n, stream, fn);
}

HCCL_API HcclResult HcclReduceScatterV(void *sendBuf, const void *sendCounts, const void *sendDispls, void *recvBuf,
                                       uint64_t recvCount, HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                       aclrtStream stream)
{
    const char *fn = "HcclReduceScatterV";
    int n = 0, rank = 0;
    sc_op t = {0};
    sc_status st = v_size(comm, fn, &n, &rank);
    if (st == SC_OK)
        st = v_arrays(sendCounts, sendDispls, "sendCounts", "sendDispls", fn);
    if (st == SC_OK)
        st = types(&t, 1, dataType, 1, op, fn);
    const uint64_t *sc = sendCounts, *sd = sendDispls;
    if (st == SC_OK && sc[rank] != recvCount)
        st = sc_fail(SC_INVALID, "%s: rank %d receives %llu elements but sendCounts[%d] is %llu; they must match", fn,
                     rank, (unsigned long long)recvCount, rank, (unsigned long long)sc[rank]);
    if (st != SC_OK)
        return code(st);
    /* one reduce per rank: block i of every rank's sendBuf is reduced into rank i's recvBuf */
    size_t size = ccl_dtype_size(t.dtype);
    sc_op ops[CCL_MAX_RANKS];
    for (int i = 0; i < n; i++) {
        const char *src = at(sendBuf, sd[i], size);
        ops[i] = (sc_op){.kind = CCL_REDUCE, .dtype = t.dtype, .redop = t.redop, .root = i, .count = sc[i],
                         .send = src, .recv = i == rank ? recvBuf : (void *)src};
    }
    return submit_many(comm, ops, n, stream, fn);
}

HCCL_API HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum, HcclComm comm,
                                      aclrtStream stream)
{
    const char *fn = "HcclBatchSendRecv";
    sc_status st = sc_comm_check((sc_comm *)comm, fn);
    if (st == SC_OK && itemNum && !sendRecvInfo)
        st = sc_fail(SC_NULL, "%s: sendRecvInfo is NULL", fn);
    if (st == SC_OK && itemNum > 256)
        st = sc_fail(SC_INVALID, "%s: itemNum=%u; the simulator runs at most 256 items at once", fn, itemNum);
    sc_op ops[256];
    for (uint32_t i = 0; st == SC_OK && i < itemNum; i++) {
        const HcclSendRecvItem *it = &sendRecvInfo[i];
        if (it->sendRecvType != HCCL_SEND && it->sendRecvType != HCCL_RECV) {
            st = sc_fail(SC_INVALID, "%s: item %u: sendRecvType %d is neither HCCL_SEND (0) nor HCCL_RECV (1)", fn, i,
                         (int)it->sendRecvType);
            break;
        }
        int send = it->sendRecvType == HCCL_SEND;
        ops[i] = (sc_op){.kind = send ? CCL_SEND : CCL_RECV, .root = it->remoteRank > INT32_MAX ? INT32_MAX
                                                                                                 : (int)it->remoteRank};
        st = types(&ops[i], it->count, it->dataType, 0, 0, fn);
        if (send)
            ops[i].send = it->buf;
        else
            ops[i].recv = it->buf;
    }
    return st ? code(st) : submit_many(comm, ops, (int)itemNum, stream, fn);
}
