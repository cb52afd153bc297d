/*
 * The anychip/plugin.h face of a Kunlun chip, written against the XPU runtime and BKCL:
 * compiled into the simulated Kunlun library here, and against libxpurt + libbkcl on a
 * real chip. Three entries use simulator extensions (memset on a stream, event timing and
 * free memory, which the XPU runtime API lacks); built without ANYCHIP_SIMULATOR they are
 * left out (anychip's fallbacks serve) or, for free memory, report the capacity.
 *
 * - The device is per thread: every entry makes `device` current first.
 * - Status codes: XPU's (>= 700) and BKCL's (1..4) do not overlap and pass through.
 * - plugin.h's unique id is 128 bytes, a BKCLUniqueId 512: the used prefix is carried, a
 *   longer one is refused saying so.
 * - BKCL has no int8 and no average: ccl_dtype_mask and ccl_redop_mask leave them out.
 */
#include <stdio.h>
#include <string.h>

#include "anychip/plugin.h"
#include "bkcl/bkcl.h"
#include "xpu/runtime.h"
#ifdef ANYCHIP_SIMULATOR
#include "anychip/sim.h"
#endif

#define BKCL_CODE_MAX 100          /* BKCLResult_t values lie below, XPUError_t values above */

static __thread int t_set;       /* this thread has made a device current through this face */
static __thread char t_error[512];

static anychip_status fail(anychip_status code, const char *msg)
{
    snprintf(t_error, sizeof t_error, "%s", msg);
    return code;
}

static anychip_status use(int device)
{
    /* The library's current device is the thread's, shared with every other caller of the
     * library in the process (anychip's runtime, the application): one may have changed it
     * since this face last set it, so the library is asked, not a copy of our own kept.
     * (Before this thread's first set, the library is not asked: ACL fails without one.) */
    int current = -1;
    if (t_set && xpu_current_device(&current) == XPU_SUCCESS && current == device)
        return XPU_SUCCESS;
    int rc = xpu_set_device(device);
    if (rc == XPU_SUCCESS)
        t_set = 1;
    return rc;
}

#define USE(device)                                  \
    do {                                             \
        anychip_status rc_ = use(device);            \
        if (rc_ != XPU_SUCCESS)                      \
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
    static __thread char text[64];
    snprintf(text, sizeof text, "%s %d", status < BKCL_CODE_MAX ? "BKCLResult_t" : "XPUError_t", (int)status);
    return text;
}

static const char *last_error(void)
{
    static __thread char copy[sizeof t_error];
    if (t_error[0]) {
        memcpy(copy, t_error, sizeof copy);
        t_error[0] = 0;
        return copy;
    }
#ifdef ANYCHIP_SIMULATOR
    const char *msg = anychip_sim_last_error();
    return msg && msg[0] ? msg : NULL;
#else
    return NULL;
#endif
}

/* ---- devices and memory ------------------------------------------------------------- */

static anychip_status device_count(int *count)
{
    int rc = xpu_device_count(count);
    if (rc == XPUERR_NODEV) {
        *count = 0;
        return XPU_SUCCESS;
    }
    return rc;
}

static anychip_status set_device(int device) { return use(device); }

static anychip_status device_name(int device, char *name, size_t len)
{
    snprintf(name, len, "Kunlun XPU %d", device);
    return XPU_SUCCESS;
}

static anychip_status mem_info(int device, size_t *free_bytes, size_t *total)
{
    USE(device);
#ifdef ANYCHIP_SIMULATOR
    uint64_t f = 0, t = 0;
    CHECK(anychip_sim_xpu_mem_info(&f, &t));
    *free_bytes = (size_t)f;
    *total = (size_t)t;
#else
    uint64_t t = 0;
    CHECK(xpu_device_get_attr(&t, XPUATTR_MEM_MAIN_CAPACITY, device));
    *free_bytes = *total = (size_t)t;
#endif
    return XPU_SUCCESS;
}

static anychip_status mem_alloc(int device, size_t nbytes, void **ptr)
{
    USE(device);
    return xpu_malloc(ptr, nbytes, XPU_MEM_HBM);
}

static anychip_status mem_free(int device, void *ptr)
{
    USE(device);
    return xpu_free(ptr);
}

static const XPUMemcpyKind KINDS[] = {XPU_HOST_TO_DEVICE, XPU_DEVICE_TO_HOST, XPU_DEVICE_TO_DEVICE};

static anychip_status copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind)
{
    USE(device);
    if ((unsigned)kind > ANYCHIP_COPY_D2D)
        return fail(XPUERR_INVALID_PARAM, "copy: kind is not H2D (0), D2H (1) or D2D (2)");
    return nbytes ? xpu_memcpy(dst, src, nbytes, KINDS[kind]) : XPU_SUCCESS;
}

static anychip_status copy_async(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind,
                                 anychip_stream stream)
{
    USE(device);
    if ((unsigned)kind > ANYCHIP_COPY_D2D)
        return fail(XPUERR_INVALID_PARAM, "copy_async: kind is not H2D (0), D2H (1) or D2D (2)");
    return nbytes ? xpu_memcpy_async(dst, src, nbytes, KINDS[kind], (XPUStream)stream) : XPU_SUCCESS;
}

static anychip_status copy_peer(int dst_device, void *dst, int src_device, const void *src, size_t nbytes,
                                anychip_stream stream)
{
    USE(src_device);
    CHECK(xpu_wait((XPUStream)stream));          /* xpu_memcpy_peer is synchronous: keep stream order */
    return nbytes ? xpu_memcpy_peer(dst_device, dst, src_device, src, nbytes) : XPU_SUCCESS;
}

#ifdef ANYCHIP_SIMULATOR
static anychip_status fill_async(int device, void *dst, int value, size_t nbytes, anychip_stream stream)
{
    USE(device);
    return nbytes ? anychip_sim_xpu_memset_async(dst, value, nbytes, (XPUStream)stream) : XPU_SUCCESS;
}

static anychip_status event_elapsed_ms(int device, float *ms, anychip_event start, anychip_event end)
{
    USE(device);
    return anychip_sim_xpu_event_elapsed_time(ms, (XPUEvent)start, (XPUEvent)end);
}
#endif

/* ---- streams and events ------------------------------------------------------------- */

static anychip_status stream_create(int device, anychip_stream *stream)
{
    USE(device);
    return xpu_stream_create((XPUStream *)stream);
}

static anychip_status stream_destroy(int device, anychip_stream stream)
{
    USE(device);
    return xpu_stream_destroy((XPUStream)stream);
}

static anychip_status stream_synchronize(int device, anychip_stream stream)
{
    USE(device);
    return xpu_wait((XPUStream)stream);
}

static anychip_status stream_wait_event(int device, anychip_stream stream, anychip_event event)
{
    USE(device);
    return xpu_stream_wait_event((XPUStream)stream, (XPUEvent)event);
}

static anychip_status event_create(int device, anychip_event *event)
{
    USE(device);
    return xpu_event_create((XPUEvent *)event);
}

static anychip_status event_destroy(int device, anychip_event event)
{
    USE(device);
    return xpu_event_destroy((XPUEvent)event);
}

static anychip_status event_record(int device, anychip_event event, anychip_stream stream)
{
    USE(device);
    return xpu_event_record((XPUEvent)event, (XPUStream)stream);
}

static anychip_status event_synchronize(int device, anychip_event event)
{
    USE(device);
    return xpu_event_wait((XPUEvent)event);
}

static anychip_status event_query(int device, anychip_event event)
{
    USE(device);
    return xpu_event_query((XPUEvent)event);     /* XPUERR_BUSY while pending */
}

/* ---- collectives (BKCL) --------------------------------------------------------------- */

static anychip_status bkcl_type(anychip_dtype dtype, BKCLDataType *out)
{
    static const int TYPES[] = {[ANYCHIP_INT8] = -1,  [ANYCHIP_UINT8] = BKCL_UINT8,
                                [ANYCHIP_INT32] = BKCL_INT32, [ANYCHIP_INT64] = BKCL_INT64,
                                [ANYCHIP_FLOAT16] = BKCL_FLOAT16, [ANYCHIP_BFLOAT16] = BKCL_BFLOAT16,
                                [ANYCHIP_FLOAT32] = BKCL_FLOAT, [ANYCHIP_FLOAT64] = BKCL_FLOAT64};
    if ((unsigned)dtype > ANYCHIP_FLOAT64 || TYPES[dtype] < 0)
        return fail(BKCL_INVALID_ARGUMENT, "collective: BKCL has no such data type (int8 is not one)");
    *out = (BKCLDataType)TYPES[dtype];
    return BKCL_SUCCESS;
}

static anychip_status bkcl_op(anychip_redop op, BKCLOp *out)
{
    static const BKCLOp OPS[] = {[ANYCHIP_SUM] = BKCL_ADD, [ANYCHIP_PROD] = BKCL_PRODUCT,
                                 [ANYCHIP_MIN] = BKCL_MIN, [ANYCHIP_MAX] = BKCL_MAX};
    if ((unsigned)op > ANYCHIP_MAX)
        return fail(BKCL_INVALID_ARGUMENT, "collective: BKCL has no average reduce op");
    *out = OPS[op];
    return BKCL_SUCCESS;
}

static anychip_status get_unique_id(anychip_unique_id *id)
{
    BKCLUniqueId uid;
    CHECK(bkcl_get_unique_id(&uid));
    for (size_t i = sizeof id->internal; i < sizeof uid.internal; i++)
        if (uid.internal[i])
            return fail(BKCL_INTERNAL_ERROR, "get_unique_id: this BKCLUniqueId uses more than the 128 bytes of "
                                             "anychip_unique_id");
    memcpy(id->internal, uid.internal, sizeof id->internal);
    return BKCL_SUCCESS;
}

static anychip_status comm_init_rank(int device, int nranks, const anychip_unique_id *id, int rank,
                                     anychip_comm *comm)
{
    USE(device);
    BKCLUniqueId uid;
    memset(&uid, 0, sizeof uid);
    memcpy(uid.internal, id->internal, sizeof id->internal);
    return bkcl_init_rank((BKCLContext_t *)comm, rank, nranks, &uid);
}

static anychip_status comm_destroy(anychip_comm comm) { return bkcl_destroy_context((BKCLContext_t)comm); }
static anychip_status comm_abort(anychip_comm comm) { return bkcl_comm_abort((BKCLContext_t)comm); }

#ifdef ANYCHIP_SIMULATOR
static anychip_status comm_get_async_error(anychip_comm comm, anychip_status *error)
{
    BKCLResult_t e = BKCL_SUCCESS;
    BKCLResult_t rc = anychip_sim_bkcl_async_error((BKCLContext_t)comm, &e);
    *error = (anychip_status)e;
    return rc;
}
#endif

#define CTX(comm) ((BKCLContext_t)(comm))
#define STREAM(stream) ((XPUStream)(stream))

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    BKCLDataType t;
    BKCLOp o;
    CHECK(bkcl_type(dtype, &t));
    CHECK(bkcl_op(op, &o));
    return bkcl_all_reduce(CTX(comm), send, recv, count, t, o, STREAM(stream));
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype dtype, int root,
                                anychip_comm comm, anychip_stream stream)
{
    BKCLDataType t;
    CHECK(bkcl_type(dtype, &t));
    return bkcl_broadcast(CTX(comm), send, recv, count, t, root, STREAM(stream));
}

static anychip_status reduce(const void *send, void *recv, size_t count, anychip_dtype dtype, anychip_redop op,
                             int root, anychip_comm comm, anychip_stream stream)
{
    BKCLDataType t;
    BKCLOp o;
    CHECK(bkcl_type(dtype, &t));
    CHECK(bkcl_op(op, &o));
    return bkcl_reduce(CTX(comm), send, recv, count, t, o, root, STREAM(stream));
}

static anychip_status all_gather(const void *send, void *recv, size_t send_count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    BKCLDataType t;
    CHECK(bkcl_type(dtype, &t));
    return bkcl_all_gather(CTX(comm), send, send_count, recv, t, STREAM(stream));
}

static anychip_status reduce_scatter(const void *send, void *recv, size_t recv_count, anychip_dtype dtype,
                                     anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    BKCLDataType t;
    BKCLOp o;
    CHECK(bkcl_type(dtype, &t));
    CHECK(bkcl_op(op, &o));
    return bkcl_reduce_scatter(CTX(comm), send, recv, recv_count, t, o, STREAM(stream));
}

static anychip_status all_to_all(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    BKCLDataType t;
    CHECK(bkcl_type(dtype, &t));
    return bkcl_all_to_all(CTX(comm), send, count, recv, t, STREAM(stream));
}

static anychip_status send(const void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    BKCLDataType t;
    CHECK(bkcl_type(dtype, &t));
    return bkcl_send(CTX(comm), buf, count, peer, t, STREAM(stream));
}

static anychip_status recv(void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    BKCLDataType t;
    CHECK(bkcl_type(dtype, &t));
    return bkcl_recv(CTX(comm), buf, count, peer, t, STREAM(stream));
}

static anychip_status group_start(void) { return bkcl_group_start(); }
static anychip_status group_end(void) { return bkcl_group_end(); }

/* ---- the table -------------------------------------------------------------------------- */

#ifdef ANYCHIP_SIMULATOR
#define KERNEL_FAILED XPUERR_INVALID_PARAM
#include "sim/plugin_kernels.h"
#endif

ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p)
{
    if (p->struct_size < sizeof *p)
        return XPUERR_INVALID_PARAM;
    p->major = ANYCHIP_PLUGIN_API_MAJOR;
    p->minor = ANYCHIP_PLUGIN_API_MINOR;
    snprintf(p->device_type, sizeof p->device_type, "kunlun");
    p->plugin_version = "XPU + BKCL adapter 1.0";
    p->oom_status = XPUERR_NOMEM;
    p->invalid_status = XPUERR_INVALID_PARAM;
    p->timeout_status = XPUERR_TIMEOUT;
    p->not_ready_status = XPUERR_BUSY;
    p->get_error_string = error_string;
    p->get_last_error = last_error;
    p->device_count = device_count;
    p->set_device = set_device;
    p->device_name = device_name;
    p->mem_info = mem_info;
    p->mem_alloc = mem_alloc;
    p->mem_free = mem_free;
    p->copy = copy;
    p->copy_async = copy_async;
    p->copy_peer = copy_peer;
    p->stream_create = stream_create;
    p->stream_destroy = stream_destroy;
    p->stream_synchronize = stream_synchronize;
    p->stream_wait_event = stream_wait_event;
    p->event_create = event_create;
    p->event_destroy = event_destroy;
    p->event_record = event_record;
    p->event_synchronize = event_synchronize;
    p->event_query = event_query;
#ifdef ANYCHIP_SIMULATOR
    p->flags = ANYCHIP_PLUGIN_SIMULATED;
    p->fill_async = fill_async;
    p->event_elapsed_ms = event_elapsed_ms;
    p->comm_get_async_error = comm_get_async_error;
#endif
    p->ccl_dtype_mask = 0xFFu & ~(1u << ANYCHIP_INT8);
    p->ccl_redop_mask = (1u << ANYCHIP_SUM) | (1u << ANYCHIP_PROD) | (1u << ANYCHIP_MIN) | (1u << ANYCHIP_MAX);
    p->get_unique_id = get_unique_id;
    p->comm_init_rank = comm_init_rank;
    p->comm_destroy = comm_destroy;
    p->comm_abort = comm_abort;
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
    return XPU_SUCCESS;
}
