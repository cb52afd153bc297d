/*
 * The anychip/plugin.h face of an Ascend chip, written against ACL (runtime) and HCCL
 * (collectives) only: compiled into the simulated Ascend library here, and unchanged
 * against CANN's libascendcl + libhccl on a real chip.
 *
 * - The device is per thread in ACL: every entry makes `device` current first
 *   (aclrtSetDevice, skipped when the thread's current device already is that one).
 * - Status codes: ACL's (>= 100000) and HCCL's (< 100) do not overlap, so the plugin
 *   passes either through unchanged; get_error_string names which API a code came from.
 * - plugin.h's unique id is 128 bytes; an HcclRootInfo is 4108. The adapter carries the
 *   root info's used prefix and refuses one whose tail is not zero (saying so).
 * - HCCL has no average: ccl_redop_mask leaves it out (anychip runs it on its host
 *   transport). Broadcast is in place in HCCL: a root's separate send buffer is first
 *   copied into recv on the stream.
 */
#include <stdio.h>
#include <string.h>

#include "acl/acl.h"
#include "anychip/plugin.h"
#include "hccl/hccl.h"

#define NOT_READY ACL_ERROR_RT_STREAM_NOT_COMPLETE
#define HCCL_CODE_MAX 100          /* HcclResult values lie below, aclError values far above */

static __thread int t_set;       /* this thread has made a device current through this face */
static __thread char t_error[512];

static anychip_status fail(anychip_status code, const char *fmt, const char *what)
{
    snprintf(t_error, sizeof t_error, fmt, what);
    return code;
}

static anychip_status use(int device)
{
    /* The library's current device is the thread's, shared with every other caller of the
     * library in the process (anychip's runtime, the application): one may have changed it
     * since this face last set it, so the library is asked, not a copy of our own kept.
     * (Before this thread's first set, the library is not asked: ACL fails without one.) */
    int32_t current = -1;
    if (t_set && aclrtGetDevice(&current) == ACL_SUCCESS && current == device)
        return ACL_SUCCESS;
    aclError rc = aclrtSetDevice(device);
    if (rc == ACL_SUCCESS)
        t_set = 1;
    return rc;
}

#define USE(device)                                  \
    do {                                             \
        anychip_status rc_ = use(device);            \
        if (rc_ != ACL_SUCCESS)                      \
            return rc_;                              \
    } while (0)

static const char *error_string(anychip_status status)
{
    static __thread char text[96];
    if (status > 0 && status < HCCL_CODE_MAX)
        return HcclGetErrorString((HcclResult)status);
    snprintf(text, sizeof text, "aclError %d", (int)status);
    return text;
}

static const char *last_error(void)
{
    if (t_error[0]) {
        static __thread char copy[sizeof t_error];
        memcpy(copy, t_error, sizeof copy);
        t_error[0] = 0;
        return copy;
    }
    const char *msg = aclGetRecentErrMsg();
    return msg && msg[0] ? msg : NULL;
}

/* ---- devices and memory ------------------------------------------------------------- */

static anychip_status device_count(int *count)
{
    uint32_t n = 0;
    aclError rc = aclrtGetDeviceCount(&n);
    if (rc == ACL_ERROR_RT_NO_DEVICE) {       /* no device is a count of 0, not a failure */
        *count = 0;
        return ACL_SUCCESS;
    }
    *count = (int)n;
    return rc;
}

static anychip_status set_device(int device) { return use(device); }

static anychip_status device_name(int device, char *name, size_t len)
{
    USE(device);
    const char *soc = aclrtGetSocName();
    snprintf(name, len, "%s %d", soc && soc[0] ? soc : "Ascend", device);
    return ACL_SUCCESS;
}

static anychip_status mem_info(int device, size_t *free, size_t *total)
{
    USE(device);
    return aclrtGetMemInfo(ACL_HBM_MEM, free, total);
}

static anychip_status device_synchronize(int device)
{
    USE(device);
    return aclrtSynchronizeDevice();
}

static anychip_status mem_alloc(int device, size_t nbytes, void **ptr)
{
    USE(device);
    return aclrtMalloc(ptr, nbytes, ACL_MEM_MALLOC_HUGE_FIRST);
}

static anychip_status mem_free(int device, void *ptr)
{
    USE(device);
    return aclrtFree(ptr);
}

static const aclrtMemcpyKind KINDS[] = {ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST,
                                        ACL_MEMCPY_DEVICE_TO_DEVICE};

static anychip_status copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind)
{
    USE(device);
    if ((unsigned)kind > ANYCHIP_COPY_D2D)
        return fail(ACL_ERROR_INVALID_PARAM, "copy: kind %s is not H2D (0), D2H (1) or D2D (2)", "value");
    return nbytes ? aclrtMemcpy(dst, nbytes, src, nbytes, KINDS[kind]) : ACL_SUCCESS;
}

static anychip_status copy_async(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind,
                                 anychip_stream stream)
{
    USE(device);
    if ((unsigned)kind > ANYCHIP_COPY_D2D)
        return fail(ACL_ERROR_INVALID_PARAM, "copy_async: kind %s is not H2D (0), D2H (1) or D2D (2)", "value");
    return nbytes ? aclrtMemcpyAsync(dst, nbytes, src, nbytes, KINDS[kind], (aclrtStream)stream) : ACL_SUCCESS;
}

static anychip_status fill(int device, void *dst, int value, size_t nbytes)
{
    USE(device);
    return nbytes ? aclrtMemset(dst, nbytes, value, nbytes) : ACL_SUCCESS;
}

static anychip_status fill_async(int device, void *dst, int value, size_t nbytes, anychip_stream stream)
{
    USE(device);
    return nbytes ? aclrtMemsetAsync(dst, nbytes, value, nbytes, (aclrtStream)stream) : ACL_SUCCESS;
}

/* ---- streams and events ------------------------------------------------------------- */

static anychip_status stream_create(int device, anychip_stream *stream)
{
    USE(device);
    return aclrtCreateStream((aclrtStream *)stream);
}

static anychip_status stream_destroy(int device, anychip_stream stream)
{
    USE(device);
    return aclrtDestroyStream((aclrtStream)stream);
}

static anychip_status stream_synchronize(int device, anychip_stream stream)
{
    USE(device);
    return aclrtSynchronizeStream((aclrtStream)stream);
}

static anychip_status stream_query(int device, anychip_stream stream)
{
    USE(device);
    aclrtStreamStatus status;
    aclError rc = aclrtStreamQuery((aclrtStream)stream, &status);
    if (rc != ACL_SUCCESS)
        return rc;
    return status == ACL_STREAM_STATUS_COMPLETE ? ACL_SUCCESS : NOT_READY;
}

static anychip_status stream_wait_event(int device, anychip_stream stream, anychip_event event)
{
    USE(device);
    return aclrtStreamWaitEvent((aclrtStream)stream, (aclrtEvent)event);
}

static anychip_status event_create(int device, anychip_event *event)
{
    USE(device);
    return aclrtCreateEvent((aclrtEvent *)event);
}

static anychip_status event_destroy(int device, anychip_event event)
{
    USE(device);
    return aclrtDestroyEvent((aclrtEvent)event);
}

static anychip_status event_record(int device, anychip_event event, anychip_stream stream)
{
    USE(device);
    return aclrtRecordEvent((aclrtEvent)event, (aclrtStream)stream);
}

static anychip_status event_synchronize(int device, anychip_event event)
{
    USE(device);
    return aclrtSynchronizeEvent((aclrtEvent)event);
}

static anychip_status event_query(int device, anychip_event event)
{
    USE(device);
    aclrtEventRecordedStatus status;
    aclError rc = aclrtQueryEventStatus((aclrtEvent)event, &status);
    if (rc != ACL_SUCCESS)
        return rc;
    return status == ACL_EVENT_RECORDED_STATUS_COMPLETE ? ACL_SUCCESS : NOT_READY;
}

static anychip_status event_elapsed_ms(int device, float *ms, anychip_event start, anychip_event end)
{
    USE(device);
    return aclrtEventElapsedTime(ms, (aclrtEvent)start, (aclrtEvent)end);
}

/* ---- collectives (HCCL) --------------------------------------------------------------- */

static const HcclDataType HCCL_TYPES[] = {
    [ANYCHIP_INT8] = HCCL_DATA_TYPE_INT8,     [ANYCHIP_UINT8] = HCCL_DATA_TYPE_UINT8,
    [ANYCHIP_INT32] = HCCL_DATA_TYPE_INT32,   [ANYCHIP_INT64] = HCCL_DATA_TYPE_INT64,
    [ANYCHIP_FLOAT16] = HCCL_DATA_TYPE_FP16,  [ANYCHIP_BFLOAT16] = HCCL_DATA_TYPE_BFP16,
    [ANYCHIP_FLOAT32] = HCCL_DATA_TYPE_FP32,  [ANYCHIP_FLOAT64] = HCCL_DATA_TYPE_FP64,
};
static const HcclReduceOp HCCL_OPS[] = {
    [ANYCHIP_SUM] = HCCL_REDUCE_SUM, [ANYCHIP_PROD] = HCCL_REDUCE_PROD,
    [ANYCHIP_MIN] = HCCL_REDUCE_MIN, [ANYCHIP_MAX] = HCCL_REDUCE_MAX,
};

static anychip_status hccl_type(anychip_dtype dtype, HcclDataType *out)
{
    if ((unsigned)dtype > ANYCHIP_FLOAT64)
        return fail(HCCL_E_PARA, "collective: dtype %s is not an anychip_dtype", "value");
    *out = HCCL_TYPES[dtype];
    return HCCL_SUCCESS;
}

static anychip_status hccl_op(anychip_redop op, HcclReduceOp *out)
{
    if ((unsigned)op > ANYCHIP_MAX)
        return fail(HCCL_E_NOT_SUPPORT, "collective: %s", op == ANYCHIP_AVG ? "HCCL has no average reduce op"
                                                                             : "op is not an anychip_redop");
    *out = HCCL_OPS[op];
    return HCCL_SUCCESS;
}

#define CHECK(expr)                          \
    do {                                     \
        anychip_status rc_ = (expr);         \
        if (rc_ != 0)                        \
            return rc_;                      \
    } while (0)

static anychip_status get_unique_id(anychip_unique_id *id)
{
    HcclRootInfo info;
    CHECK(HcclGetRootInfo(&info));
    for (size_t i = sizeof id->internal; i < sizeof info.internal; i++)
        if (info.internal[i])
            return fail(HCCL_E_NOT_SUPPORT, "get_unique_id: this HcclRootInfo uses more than the %s bytes of "
                                            "anychip_unique_id", "128");
    memcpy(id->internal, info.internal, sizeof id->internal);
    return HCCL_SUCCESS;
}

static anychip_status comm_init_rank(int device, int nranks, const anychip_unique_id *id, int rank,
                                     anychip_comm *comm)
{
    USE(device);
    HcclRootInfo info;
    memset(&info, 0, sizeof info);
    memcpy(info.internal, id->internal, sizeof id->internal);
    return HcclCommInitRootInfo((uint32_t)nranks, &info, (uint32_t)rank, (HcclComm *)comm);
}

static anychip_status comm_destroy(anychip_comm comm) { return HcclCommDestroy((HcclComm)comm); }

static anychip_status comm_get_async_error(anychip_comm comm, anychip_status *error)
{
    HcclResult e = HCCL_SUCCESS;
    HcclResult rc = HcclGetCommAsyncError((HcclComm)comm, &e);
    *error = (anychip_status)e;
    return rc;
}

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    HcclDataType t;
    HcclReduceOp o;
    CHECK(hccl_type(dtype, &t));
    CHECK(hccl_op(op, &o));
    return HcclAllReduce((void *)send, recv, count, t, o, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype dtype, int root,
                                anychip_comm comm, anychip_stream stream)
{
    HcclDataType t;
    CHECK(hccl_type(dtype, &t));
    uint32_t rank = 0;
    CHECK(HcclGetRankId((HcclComm)comm, &rank));
    if ((int)rank == root && send != recv && count) {
        static const size_t SIZES[] = {1, 1, 4, 8, 2, 2, 4, 8};
        size_t n = count * SIZES[dtype];
        CHECK(aclrtMemcpyAsync(recv, n, send, n, ACL_MEMCPY_DEVICE_TO_DEVICE, (aclrtStream)stream));
    }
    return HcclBroadcast(recv, count, t, (uint32_t)root, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status reduce(const void *send, void *recv, size_t count, anychip_dtype dtype, anychip_redop op,
                             int root, anychip_comm comm, anychip_stream stream)
{
    HcclDataType t;
    HcclReduceOp o;
    CHECK(hccl_type(dtype, &t));
    CHECK(hccl_op(op, &o));
    return HcclReduce((void *)send, recv, count, t, o, (uint32_t)root, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status all_gather(const void *send, void *recv, size_t send_count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    HcclDataType t;
    CHECK(hccl_type(dtype, &t));
    return HcclAllGather((void *)send, recv, send_count, t, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status reduce_scatter(const void *send, void *recv, size_t recv_count, anychip_dtype dtype,
                                     anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    HcclDataType t;
    HcclReduceOp o;
    CHECK(hccl_type(dtype, &t));
    CHECK(hccl_op(op, &o));
    return HcclReduceScatter((void *)send, recv, recv_count, t, o, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status all_to_all(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    HcclDataType t;
    CHECK(hccl_type(dtype, &t));
    return HcclAlltoAll(send, count, t, recv, count, t, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status send(const void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    HcclDataType t;
    CHECK(hccl_type(dtype, &t));
    return HcclSend((void *)buf, count, t, (uint32_t)peer, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status recv(void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    HcclDataType t;
    CHECK(hccl_type(dtype, &t));
    return HcclRecv(buf, count, t, (uint32_t)peer, (HcclComm)comm, (aclrtStream)stream);
}

static anychip_status group_start(void) { return HcclGroupStart(); }
static anychip_status group_end(void) { return HcclGroupEnd(); }

/* ---- the table -------------------------------------------------------------------------- */

#ifdef ANYCHIP_SIMULATOR
#define KERNEL_FAILED ACL_ERROR_INVALID_PARAM
#include "sim/plugin_kernels.h"
#endif

ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p)
{
    if (p->struct_size < sizeof *p)
        return ACL_ERROR_INVALID_PARAM;
    p->major = ANYCHIP_PLUGIN_API_MAJOR;
    p->minor = ANYCHIP_PLUGIN_API_MINOR;
    snprintf(p->device_type, sizeof p->device_type, "ascend");
    p->plugin_version = "ACL + HCCL adapter 1.0";
#ifdef ANYCHIP_SIMULATOR
    p->flags = ANYCHIP_PLUGIN_SIMULATED;
#endif
    p->oom_status = ACL_ERROR_RT_MEMORY_ALLOCATION;
    p->invalid_status = ACL_ERROR_INVALID_PARAM;
    p->timeout_status = HCCL_E_TIMEOUT;
    p->not_ready_status = NOT_READY;
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
    p->ccl_redop_mask = (1u << ANYCHIP_SUM) | (1u << ANYCHIP_PROD) | (1u << ANYCHIP_MIN) | (1u << ANYCHIP_MAX);
    p->get_unique_id = get_unique_id;
    p->comm_init_rank = comm_init_rank;
    p->comm_destroy = comm_destroy;
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
    return ACL_SUCCESS;
}
