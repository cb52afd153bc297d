/*
 * BKCL in the Kunlun simulator (libkunlun_sim): the calls of bkcl/bkcl.h (names and
 * argument orders of the public call sites; enum values anychip's own) on the anychip
 * collective engine. Ops are enqueued on XPU streams of the simulator.
 *
 * Types: BKCL_FLOAT, FLOAT16, BFLOAT16, FLOAT64, UINT8, INT32, INT64, all reduce ops.
 * Failures of enqueued work are kept by the context: every later call on it returns
 * the error, and anychip_sim_bkcl_async_error reports it.
 */
#include <stdint.h>

#include "bkcl/bkcl.h"
#include "collective.h"

#define BKCL_API SIM_EXPORT

int xpu_current_device(int *devid);

static BKCLResult_t code(sc_status st)
{
    switch (st) {
    case SC_OK: return BKCL_SUCCESS;
    case SC_INVALID:
    case SC_NULL:
    case SC_USAGE:
    case SC_UNSUPPORTED: return BKCL_INVALID_ARGUMENT;
    case SC_TIMEOUT:
    case SC_REMOTE:
    case SC_RUNTIME: return BKCL_RUNTIME_ERROR;
    case SC_SYSTEM:
    case SC_OOM: return BKCL_SYSTEM_ERROR;
    default: return BKCL_INTERNAL_ERROR;
    }
}

static const struct { int ccl; int size; } TYPES[] = {
    [BKCL_FLOAT] = {CCL_FLOAT32, 4}, [BKCL_FLOAT16] = {CCL_FLOAT16, 2}, [BKCL_BFLOAT16] = {CCL_BFLOAT16, 2},
    [BKCL_FLOAT64] = {CCL_FLOAT64, 8}, [BKCL_UINT8] = {CCL_UINT8, 1}, [BKCL_INT32] = {CCL_INT32, 4},
    [BKCL_INT64] = {CCL_INT64, 8},
};
#define NTYPES ((int)(sizeof TYPES / sizeof TYPES[0]))
static const int OPS[] = {[BKCL_ADD] = CCL_SUM, [BKCL_PRODUCT] = CCL_PROD, [BKCL_MIN] = CCL_MIN,
                          [BKCL_MAX] = CCL_MAX};

static sc_status types(sc_op *o, size_t count, BKCLDataType t, int reducing, BKCLOp op, const char *fn)
{
    if ((unsigned)t >= (unsigned)NTYPES)
        return sc_fail(SC_INVALID, "%s: datatype %d is not a BKCLDataType (0..%d)", fn, (int)t, NTYPES - 1);
    if (reducing && (unsigned)op >= BKCL_NUM_OPS)
        return sc_fail(SC_INVALID, "%s: op %d is not a BKCLOp (ADD 0, PRODUCT 1, MIN 2, MAX 3)", fn, (int)op);
    sc_op_types(o, count, TYPES[t].ccl, TYPES[t].size, reducing ? OPS[op] : -1);
    return SC_OK;
}

static BKCLResult_t submit(BKCLContext_t ctx, sc_op *o, XPUStream stream, const char *fn)
{
    return code(sc_submit((sc_comm *)ctx, o, stream, fn));
}

BKCL_API BKCLResult_t bkcl_get_unique_id(BKCLUniqueId *uid) { return code(sc_unique_id("bkcl", uid, sizeof *uid)); }

BKCL_API BKCLResult_t bkcl_init_rank(BKCLContext_t *ctx, int rank, int nranks, const BKCLUniqueId *uid)
{
    int dev;
    if (xpu_current_device(&dev) != 0)
        return code(sc_fail(SC_RUNTIME, "bkcl_init_rank: no usable current device"));
    return code(sc_comm_init("bkcl", uid, sizeof *uid, nranks, rank, (sc_comm **)ctx));
}

BKCL_API BKCLResult_t bkcl_destroy_context(BKCLContext_t ctx) { return code(sc_comm_destroy((sc_comm *)ctx)); }

BKCL_API BKCLResult_t bkcl_comm_abort(BKCLContext_t ctx) { return code(sc_comm_abort((sc_comm *)ctx)); }

BKCL_API BKCLResult_t bkcl_comm_count(const BKCLContext_t ctx, int *count)
{
    return code(sc_comm_get((sc_comm *)ctx, SC_COMM_SIZE, "bkcl_comm_count", "count", count));
}

BKCL_API BKCLResult_t bkcl_comm_user_rank(const BKCLContext_t ctx, int *rank)
{
    return code(sc_comm_get((sc_comm *)ctx, SC_COMM_RANK, "bkcl_comm_user_rank", "rank", rank));
}

BKCL_API BKCLResult_t anychip_sim_bkcl_async_error(BKCLContext_t ctx, BKCLResult_t *error)
{
    sc_status a;
    sc_status st = sc_comm_get_async_error((sc_comm *)ctx, "anychip_sim_bkcl_async_error", "error", error ? &a : NULL);
    if (st == SC_OK)
        *error = code(a);
    return code(st);
}

BKCL_API BKCLResult_t bkcl_all_reduce(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t count,
                                      BKCLDataType datatype, BKCLOp op, XPUStream stream)
{
    sc_op o = {.kind = CCL_ALL_REDUCE, .root = -1, .send = sendbuf, .recv = recvbuf};
    sc_status st = types(&o, count, datatype, 1, op, "bkcl_all_reduce");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_all_reduce");
}

BKCL_API BKCLResult_t bkcl_broadcast(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t count,
                                     BKCLDataType datatype, int root, XPUStream stream)
{
    sc_op o = {.kind = CCL_BROADCAST, .root = root, .send = sendbuf, .recv = recvbuf};
    sc_status st = types(&o, count, datatype, 0, 0, "bkcl_broadcast");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_broadcast");
}

BKCL_API BKCLResult_t bkcl_reduce(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t count,
                                  BKCLDataType datatype, BKCLOp op, int root, XPUStream stream)
{
    sc_op o = {.kind = CCL_REDUCE, .root = root, .send = sendbuf, .recv = recvbuf};
    sc_status st = types(&o, count, datatype, 1, op, "bkcl_reduce");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_reduce");
}

BKCL_API BKCLResult_t bkcl_all_gather(BKCLContext_t ctx, const void *sendbuf, size_t sendcount, void *recvbuf,
                                      BKCLDataType datatype, XPUStream stream)
{
    sc_op o = {.kind = CCL_ALL_GATHER, .root = -1, .send = sendbuf, .recv = recvbuf};
    sc_status st = types(&o, sendcount, datatype, 0, 0, "bkcl_all_gather");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_all_gather");
}

BKCL_API BKCLResult_t bkcl_reduce_scatter(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t recvcount,
                                          BKCLDataType datatype, BKCLOp op, XPUStream stream)
{
    sc_op o = {.kind = CCL_REDUCE_SCATTER, .root = -1, .send = sendbuf, .recv = recvbuf};
    sc_status st = types(&o, recvcount, datatype, 1, op, "bkcl_reduce_scatter");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_reduce_scatter");
}

BKCL_API BKCLResult_t bkcl_all_to_all(BKCLContext_t ctx, const void *sendbuf, size_t count, void *recvbuf,
                                      BKCLDataType datatype, XPUStream stream)
{
    sc_op o = {.kind = CCL_ALL_TO_ALL, .root = -1, .send = sendbuf, .recv = recvbuf};
    sc_status st = types(&o, count, datatype, 0, 0, "bkcl_all_to_all");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_all_to_all");
}

/* The counts and displacements (elements) lie in device memory, one size_t per rank, as
 * Paddle's AllToAllUnequalSplit passes them; they are read when the call is made, after the
 * stream's queued work (so the call waits for the stream). */
BKCL_API BKCLResult_t bkcl_all_to_all_v(BKCLContext_t ctx, const void *sendbuf, const size_t *send_counts,
                                        const size_t *send_displs, BKCLDataType send_type, void *recvbuf,
                                        const size_t *recv_counts, const size_t *recv_displs,
                                        BKCLDataType recv_type, XPUStream stream)
{
    const char *fn = "bkcl_all_to_all_v";
    sc_comm *c = (sc_comm *)ctx;
    sc_op t = {0}, r = {0};
    sc_status st = sc_comm_check(c, fn);
    if (st == SC_OK)
        st = types(&t, 1, send_type, 0, 0, fn);
    if (st == SC_OK)
        st = types(&r, 1, recv_type, 0, 0, fn);
    int n = st == SC_OK ? sc_comm_size(c) : 0;
    uint64_t w[4 * CCL_MAX_RANKS];
    const void *arrays[4] = {send_counts, send_displs, recv_counts, recv_displs};
    static const char *const names[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    _Static_assert(sizeof(size_t) == sizeof(uint64_t), "size_t counts are 64-bit words");
    if (st == SC_OK)
        st = sc_device_words(c, stream, arrays, names, 4, n, w, fn);
    if (st != SC_OK)
        return code(st);
    const uint64_t *sc = w, *sd = w + n, *rc = w + 2 * n, *rd = w + 3 * n;
    sc_op ops[2 * CCL_MAX_RANKS];
    int k = 0;
    for (int j = 0; j < n; j++) {
        ops[k++] = (sc_op){.kind = CCL_SEND, .dtype = CCL_UINT8, .redop = -1, .root = j, .count = sc[j] * t.count,
                           .send = (const char *)sendbuf + sd[j] * t.count};
        ops[k++] = (sc_op){.kind = CCL_RECV, .dtype = CCL_UINT8, .redop = -1, .root = j, .count = rc[j] * r.count,
                           .recv = (char *)recvbuf + rd[j] * r.count};
    }
    return code(sc_submit_many(c, ops, k, stream, fn));
}

BKCL_API BKCLResult_t bkcl_send(BKCLContext_t ctx, const void *sendbuf, size_t count, int peer,
                                BKCLDataType datatype, XPUStream stream)
{
    sc_op o = {.kind = CCL_SEND, .root = peer, .send = sendbuf};
    sc_status st = types(&o, count, datatype, 0, 0, "bkcl_send");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_send");
}

BKCL_API BKCLResult_t bkcl_recv(BKCLContext_t ctx, void *recvbuf, size_t count, int peer, BKCLDataType datatype,
                                XPUStream stream)
{
    sc_op o = {.kind = CCL_RECV, .root = peer, .recv = recvbuf};
    sc_status st = types(&o, count, datatype, 0, 0, "bkcl_recv");
    return st ? code(st) : submit(ctx, &o, stream, "bkcl_recv");
}

BKCL_API BKCLResult_t bkcl_group_start(void) { return code(sc_group_start()); }

BKCL_API BKCLResult_t bkcl_group_end(void) { return code(sc_group_end()); }
