/*
 * The anychip/plugin.h face of a Hygon DCU, written against HIP and RCCL only: compiled
 * into the simulated Hygon library here, and unchanged against ROCm's libamdhip64 +
 * librccl (DTK on a real DCU).
 *
 * - The device is per thread in HIP: every entry makes `device` current first.
 * - Status codes: HIP's pass through; RCCL's (1..7 overlap HIP's) are offset by
 *   RCCL_BASE, and get_error_string tells them apart.
 * - Streams are created non-blocking, so that no stream orders with the null stream
 *   (anychip orders its work with events).
 * - RCCL has every type and op plugin.h names, average included.
 */
#include <stdio.h>
#include <string.h>

#include "anychip/plugin.h"
#include "hip/hip_runtime_api.h"
#include "rccl/rccl.h"

#define RCCL_BASE 10000

static __thread int t_set;       /* this thread has made a device current through this face */
static __thread char t_error[512];
static __thread ncclComm_t t_last_comm;

static anychip_status nccl(ncclResult_t rc) { return rc == ncclSuccess ? 0 : RCCL_BASE + (anychip_status)rc; }

static anychip_status use(int device)
{
    /* The library's current device is the thread's, shared with every other caller of the
     * library in the process (anychip's runtime, the application): one may have changed it
     * since this face last set it, so the library is asked, not a copy of our own kept.
     * (Before this thread's first set, the library is not asked: ACL fails without one.) */
    int current = -1;
    if (t_set && hipGetDevice(&current) == hipSuccess && current == device)
        return hipSuccess;
    hipError_t rc = hipSetDevice(device);
    if (rc == hipSuccess)
        t_set = 1;
    return rc;
}

#define USE(device)                                  \
    do {                                             \
        anychip_status rc_ = use(device);            \
        if (rc_ != hipSuccess)                       \
            return rc_;                              \
    } while (0)

#define CHECK(expr)                          \
    do {                                     \
        anychip_status rc_ = (expr);         \
        if (rc_ != 0)                        \
            return rc_;                      \
    } while (0)

static const char *error_string(anychip_status status)
{
    if (status >= RCCL_BASE)
        return ncclGetErrorString((ncclResult_t)(status - RCCL_BASE));
    return hipGetErrorString((hipError_t)status);
}

static const char *last_error(void)
{
    static __thread char copy[sizeof t_error];
    if (t_error[0]) {
        memcpy(copy, t_error, sizeof copy);
        t_error[0] = 0;
        return copy;
    }
    if (t_last_comm) {
        const char *msg = ncclGetLastError(t_last_comm);
        t_last_comm = NULL;
        if (msg && msg[0])
            return msg;
    }
    return NULL;
}

static anychip_status fail(anychip_status code, const char *msg)
{
    snprintf(t_error, sizeof t_error, "%s", msg);
    return code;
}

/* ---- devices and memory ------------------------------------------------------------- */

static anychip_status device_count(int *count)
{
    hipError_t rc = hipGetDeviceCount(count);
    if (rc == hipErrorNoDevice) {
        *count = 0;
        return hipSuccess;
    }
    return rc;
}

static anychip_status set_device(int device) { return use(device); }

static anychip_status device_name(int device, char *name, size_t len)
{
    return hipDeviceGetName(name, (int)len, device);
}

static anychip_status mem_info(int device, size_t *free_bytes, size_t *total)
{
    USE(device);
    return hipMemGetInfo(free_bytes, total);
}

static anychip_status device_synchronize(int device)
{
    USE(device);
    return hipDeviceSynchronize();
}

static anychip_status mem_alloc(int device, size_t nbytes, void **ptr)
{
    USE(device);
    return hipMalloc(ptr, nbytes);
}

static anychip_status mem_free(int device, void *ptr)
{
    USE(device);
    return hipFree(ptr);
}

static const hipMemcpyKind KINDS[] = {hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice};

static anychip_status copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind)
{
    USE(device);
    if ((unsigned)kind > ANYCHIP_COPY_D2D)
        return fail(hipErrorInvalidValue, "copy: kind is not H2D (0), D2H (1) or D2D (2)");
    return nbytes ? hipMemcpy(dst, src, nbytes, KINDS[kind]) : hipSuccess;
}

static anychip_status copy_async(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind,
                                 anychip_stream stream)
{
    USE(device);
    if ((unsigned)kind > ANYCHIP_COPY_D2D)
        return fail(hipErrorInvalidValue, "copy_async: kind is not H2D (0), D2H (1) or D2D (2)");
    return nbytes ? hipMemcpyAsync(dst, src, nbytes, KINDS[kind], (hipStream_t)stream) : hipSuccess;
}

static anychip_status copy_peer(int dst_device, void *dst, int src_device, const void *src, size_t nbytes,
                                anychip_stream stream)
{
    USE(src_device);
    return nbytes ? hipMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, (hipStream_t)stream) : hipSuccess;
}

static anychip_status fill(int device, void *dst, int value, size_t nbytes)
{
    USE(device);
    return nbytes ? hipMemset(dst, value, nbytes) : hipSuccess;
}

static anychip_status fill_async(int device, void *dst, int value, size_t nbytes, anychip_stream stream)
{
    USE(device);
    return nbytes ? hipMemsetAsync(dst, value, nbytes, (hipStream_t)stream) : hipSuccess;
}

/* ---- streams and events ------------------------------------------------------------- */

static anychip_status stream_create(int device, anychip_stream *stream)
{
    USE(device);
    return hipStreamCreateWithFlags((hipStream_t *)stream, hipStreamNonBlocking);
}

static anychip_status stream_destroy(int device, anychip_stream stream)
{
    USE(device);
    return hipStreamDestroy((hipStream_t)stream);
}

static anychip_status stream_synchronize(int device, anychip_stream stream)
{
    USE(device);
    return hipStreamSynchronize((hipStream_t)stream);
}

static anychip_status stream_query(int device, anychip_stream stream)
{
    USE(device);
    return hipStreamQuery((hipStream_t)stream);          /* hipErrorNotReady while pending */
}

static anychip_status stream_wait_event(int device, anychip_stream stream, anychip_event event)
{
    USE(device);
    return hipStreamWaitEvent((hipStream_t)stream, (hipEvent_t)event, 0);
}

static anychip_status event_create(int device, anychip_event *event)
{
    USE(device);
    return hipEventCreate((hipEvent_t *)event);
}

static anychip_status event_destroy(int device, anychip_event event)
{
    USE(device);
    return hipEventDestroy((hipEvent_t)event);
}

static anychip_status event_record(int device, anychip_event event, anychip_stream stream)
{
    USE(device);
    return hipEventRecord((hipEvent_t)event, (hipStream_t)stream);
}

static anychip_status event_synchronize(int device, anychip_event event)
{
    USE(device);
    return hipEventSynchronize((hipEvent_t)event);
}

static anychip_status event_query(int device, anychip_event event)
{
    USE(device);
    return hipEventQuery((hipEvent_t)event);
}

static anychip_status event_elapsed_ms(int device, float *ms, anychip_event start, anychip_event end)
{
    USE(device);
    return hipEventElapsedTime(ms, (hipEvent_t)start, (hipEvent_t)end);
}

/* ---- collectives (RCCL) --------------------------------------------------------------- */

static const ncclDataType_t NCCL_TYPES[] = {
    [ANYCHIP_INT8] = ncclInt8,       [ANYCHIP_UINT8] = ncclUint8,       [ANYCHIP_INT32] = ncclInt32,
    [ANYCHIP_INT64] = ncclInt64,     [ANYCHIP_FLOAT16] = ncclFloat16,   [ANYCHIP_BFLOAT16] = ncclBfloat16,
    [ANYCHIP_FLOAT32] = ncclFloat32, [ANYCHIP_FLOAT64] = ncclFloat64,
};
static const ncclRedOp_t NCCL_OPS[] = {
    [ANYCHIP_SUM] = ncclSum, [ANYCHIP_PROD] = ncclProd, [ANYCHIP_MIN] = ncclMin,
    [ANYCHIP_MAX] = ncclMax, [ANYCHIP_AVG] = ncclAvg,
};

static anychip_status nccl_args(anychip_dtype dtype, anychip_redop op, ncclDataType_t *t, ncclRedOp_t *o)
{
    if ((unsigned)dtype > ANYCHIP_FLOAT64)
        return fail(nccl(ncclInvalidArgument), "collective: dtype is not an anychip_dtype");
    if ((unsigned)op > ANYCHIP_AVG)
        return fail(nccl(ncclInvalidArgument), "collective: op is not an anychip_redop");
    *t = NCCL_TYPES[dtype];
    *o = NCCL_OPS[op];
    return 0;
}

#define COMM(comm) (t_last_comm = (ncclComm_t)(comm))
#define STREAM(stream) ((hipStream_t)(stream))

static anychip_status get_unique_id(anychip_unique_id *id)
{
    ncclUniqueId uid;
    CHECK(nccl(ncclGetUniqueId(&uid)));
    _Static_assert(sizeof uid.internal == sizeof id->internal, "ncclUniqueId is 128 bytes");
    memcpy(id->internal, uid.internal, sizeof id->internal);
    return 0;
}

static anychip_status comm_init_rank(int device, int nranks, const anychip_unique_id *id, int rank,
                                     anychip_comm *comm)
{
    USE(device);
    ncclUniqueId uid;
    memcpy(uid.internal, id->internal, sizeof uid.internal);
    return nccl(ncclCommInitRank((ncclComm_t *)comm, nranks, uid, rank));
}

static anychip_status comm_destroy(anychip_comm comm) { return nccl(ncclCommDestroy((ncclComm_t)comm)); }
static anychip_status comm_abort(anychip_comm comm) { return nccl(ncclCommAbort((ncclComm_t)comm)); }

static anychip_status comm_get_async_error(anychip_comm comm, anychip_status *error)
{
    ncclResult_t e = ncclSuccess;
    anychip_status rc = nccl(ncclCommGetAsyncError(COMM(comm), &e));
    *error = nccl(e);
    return rc;
}

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, op, &t, &o));
    return nccl(ncclAllReduce(send, recv, count, t, o, COMM(comm), STREAM(stream)));
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype dtype, int root,
                                anychip_comm comm, anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, ANYCHIP_SUM, &t, &o));
    return nccl(ncclBroadcast(send, recv, count, t, root, COMM(comm), STREAM(stream)));
}

static anychip_status reduce(const void *send, void *recv, size_t count, anychip_dtype dtype, anychip_redop op,
                             int root, anychip_comm comm, anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, op, &t, &o));
    return nccl(ncclReduce(send, recv, count, t, o, root, COMM(comm), STREAM(stream)));
}

static anychip_status all_gather(const void *send, void *recv, size_t send_count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, ANYCHIP_SUM, &t, &o));
    return nccl(ncclAllGather(send, recv, send_count, t, COMM(comm), STREAM(stream)));
}

static anychip_status reduce_scatter(const void *send, void *recv, size_t recv_count, anychip_dtype dtype,
                                     anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, op, &t, &o));
    return nccl(ncclReduceScatter(send, recv, recv_count, t, o, COMM(comm), STREAM(stream)));
}

static anychip_status all_to_all(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, ANYCHIP_SUM, &t, &o));
    return nccl(ncclAllToAll(send, recv, count, t, COMM(comm), STREAM(stream)));
}

static anychip_status send(const void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, ANYCHIP_SUM, &t, &o));
    return nccl(ncclSend(buf, count, t, peer, COMM(comm), STREAM(stream)));
}

static anychip_status recv(void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    ncclDataType_t t;
    ncclRedOp_t o;
    CHECK(nccl_args(dtype, ANYCHIP_SUM, &t, &o));
    return nccl(ncclRecv(buf, count, t, peer, COMM(comm), STREAM(stream)));
}

static anychip_status group_start(void) { return nccl(ncclGroupStart()); }
static anychip_status group_end(void) { return nccl(ncclGroupEnd()); }

/* ---- the table -------------------------------------------------------------------------- */

#ifdef ANYCHIP_SIMULATOR
#define KERNEL_FAILED hipErrorInvalidValue
#include "sim/plugin_kernels.h"
#endif

ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p)
{
    if (p->struct_size < sizeof *p)
        return hipErrorInvalidValue;
    p->major = ANYCHIP_PLUGIN_API_MAJOR;
    p->minor = ANYCHIP_PLUGIN_API_MINOR;
    snprintf(p->device_type, sizeof p->device_type, "hygon");
    p->plugin_version = "HIP + RCCL adapter 1.0";
#ifdef ANYCHIP_SIMULATOR
    p->flags = ANYCHIP_PLUGIN_SIMULATED;
#endif
    p->oom_status = hipErrorOutOfMemory;
    p->invalid_status = hipErrorInvalidValue;
    p->timeout_status = 0;
    p->not_ready_status = hipErrorNotReady;
    p->get_error_string = error_string;
    p->get_last_error = last_error;
    p->device_count = device_count;
    p->set_device = set_device;
    p->device_name = device_name;
    p->mem_info = mem_info;
    p->device_synchronize = device_synchronize;
    p->mem_alloc = mem_alloc;
    p->mem_free = mem_free;
    p->copy = copy;
    p->copy_async = copy_async;
    p->copy_peer = copy_peer;
    p->fill = fill;
    p->fill_async = fill_async;
    p->stream_create = stream_create;
    p->stream_destroy = stream_destroy;
    p->stream_synchronize = stream_synchronize;
    p->stream_query = stream_query;
    p->stream_wait_event = stream_wait_event;
    p->event_create = event_create;
    p->event_destroy = event_destroy;
    p->event_record = event_record;
    p->event_synchronize = event_synchronize;
    p->event_query = event_query;
    p->event_elapsed_ms = event_elapsed_ms;
    p->get_unique_id = get_unique_id;
    p->comm_init_rank = comm_init_rank;
    p->comm_destroy = comm_destroy;
    p->comm_abort = comm_abort;
    p->comm_get_async_error = comm_get_async_error;
    p->all_reduce = all_reduce;
    p->broadcast = broadcast;
    p->reduce = reduce;
    p->all_gather = all_gather;
    p->reduce_scatter = reduce_scatter;
    p->all_to_all = all_to_all;
    p->send = send;
    p->recv = recv;
    p->group_start = group_start;
    p->group_end = group_end;
#ifdef ANYCHIP_SIMULATOR
    p->kernels = &SIM_KERNELS;
#endif
    return hipSuccess;
}
