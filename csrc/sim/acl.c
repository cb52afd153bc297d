/*
 * Ascend ACL runtime front end of the simulator (libascend_sim).
 *
 * Exports the AscendCL runtime entry points declared in csrc/include/acl/acl.h (the
 * names, argument orders, enum values and aclError codes of CANN's acl/acl_rt.h,
 * acl/acl_prof.h and acl/error_codes/rt_error_codes.h). HCCL is in hccl.c.
 *
 * Behaviour follows CANN's open-source runtime (hicann/runtime; see docs/simulator.md):
 *   - no call checks for aclInit (CANN checks only in some subsystems); aclFinalize
 *     without aclInit succeeds, a second aclFinalize returns ACL_ERROR_REPEAT_FINALIZE;
 *   - ASCEND_RT_VISIBLE_DEVICES that repeats an id, is not ascending, is empty or does not
 *     start with a digit leaves no usable device: aclrtGetDeviceCount returns
 *     ACL_ERROR_RT_NO_DEVICE;
 *   - the current device / context is per thread; calls that need one fail with
 *     ACL_ERROR_RT_CONTEXT_NULL until aclrtSetDevice or aclrtSetCurrentContext;
 *   - memcpy: count 0 succeeds at once; count > destMax is ACL_ERROR_RT_PARAM_INVALID; a
 *     kind that disagrees with the pointers is corrected when both are runtime memory
 *     (device or aclrtMallocHost), and is an error only where pageable host memory takes
 *     part (MemcpyKindAutoCorrect's table); aclrtMemcpy / aclrtMemset wait for no stream
 *     (a driver copy, ApiImpl::MemCopySync), the default stream included;
 *   - callbacks run on the thread subscribed to the stream (aclrtSubscribeReport) when
 *     it calls aclrtProcessReport;
 *   - aclprof* sessions record nothing but the step timestamps asked for.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "acl/acl.h"
#include "internal.h"

#define ACL_API SIM_EXPORT

static pthread_once_t fe_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int acl_initialized;   /* aclInit succeeded and no aclFinalize since */
static int acl_finalized;     /* aclFinalize succeeded and no aclInit since */

static void fe_init(void)
{
    sim_core_init(getenv("ASCEND_RT_VISIBLE_DEVICES"), SIM_VIS_ACL);
    sim_set_require_current(1);
    /* aclrtMemcpy / aclrtMemset go straight to the driver (ApiImpl::MemCopySync ->
     * NpuDriver::MemCopySync): they wait for no stream, the default one included */
    sim_set_sync_waits_default(0);
}

/* The calling thread's last error (aclrtGetLastError / aclrtPeekAtLastError). */
static __thread aclError t_last_error;

static aclError keep(aclError code)
{
    if (code != ACL_SUCCESS)
        t_last_error = code;
    return code;
}

static aclError acl_code_of(sim_status st)
{
    switch (st) {
    case SIM_OK: return ACL_SUCCESS;
    case SIM_E_INVALID_VALUE: return ACL_ERROR_INVALID_PARAM;
    case SIM_E_INVALID_DEVICE: return ACL_ERROR_RT_INVALID_DEVICEID;
    case SIM_E_NO_DEVICE: return ACL_ERROR_RT_NO_DEVICE;
    case SIM_E_NO_CONTEXT: return ACL_ERROR_RT_CONTEXT_NULL;
    case SIM_E_OUT_OF_MEMORY: return ACL_ERROR_RT_MEMORY_ALLOCATION;
    case SIM_E_HOST_ALLOC: return ACL_ERROR_BAD_ALLOC;
    case SIM_E_BAD_FREE:
    case SIM_E_OUT_OF_RANGE:
    case SIM_E_DIRECTION: return ACL_ERROR_RT_PARAM_INVALID;
    case SIM_E_INVALID_HANDLE:
    case SIM_E_INVALID_STREAM: return ACL_ERROR_RT_INVALID_HANDLE;
    case SIM_E_TIMEOUT: return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
    case SIM_E_NOT_READY: return ACL_ERROR_RT_EVENT_NOT_COMPLETE;
    case SIM_E_NOT_RECORDED: return ACL_ERROR_RT_INTERNAL_ERROR;   /* CANN: RT_ERROR_EVENT_RECORDER_NULL */
    case SIM_E_ASYNC_FAULT: return ACL_ERROR_RT_SYS_DMA;
    case SIM_E_NOT_SUPPORTED: return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
    default: return ACL_ERROR_RT_INTERNAL_ERROR;
    }
}

static aclError acl_code(sim_status st)
{
    return keep(acl_code_of(st));
}

static aclError fail(aclError code, sim_status st, const char *fmt, const char *fn, const char *detail)
{
    sim_fail(st, fmt, fn, detail);
    return keep(code);
}

#define ENTER() pthread_once(&fe_once, fe_init)
/* an entry that is one call of the simulator core: the front end set up, the status as ACL's */
#define CORE(call) (ENTER(), acl_code(call))

/* ---- init ------------------------------------------------------------------- */

ACL_API aclError aclInit(const char *configPath)
{
    (void)configPath; /* the simulator has nothing to configure from the JSON file */
    ENTER();
    pthread_mutex_lock(&init_lock);
    int again = acl_initialized;
    acl_initialized = 1;
    acl_finalized = 0;
    pthread_mutex_unlock(&init_lock);
    if (again)
        return fail(ACL_ERROR_REPEAT_INITIALIZE, SIM_E_INVALID_VALUE, "%s: %s", __func__, "already initialized");
    return ACL_SUCCESS;
}

ACL_API aclError aclFinalize(void)
{
    ENTER();
    pthread_mutex_lock(&init_lock);
    int again = acl_finalized;
    acl_finalized = 1;
    acl_initialized = 0;
    pthread_mutex_unlock(&init_lock);
    if (again)
        return fail(ACL_ERROR_REPEAT_FINALIZE, SIM_E_INVALID_VALUE, "%s: %s", __func__, "already finalized");
    return ACL_SUCCESS;
}

ACL_API const char *aclGetRecentErrMsg(void)
{
    static __thread char copy[512];
    const char *m = sim_last_message();
    if (!m[0])
        return NULL;
    size_t i = 0;
    for (; m[i] && i + 1 < sizeof copy; i++)
        copy[i] = m[i];
    copy[i] = '\0';
    sim_clear_message(); /* a message is reported once */
    return copy;
}

ACL_API const char *aclrtGetSocName(void)
{
    return "Ascend-sim";
}

/* ---- devices ------------------------------------------------------------------ */

/* Contexts. A context belongs to one device; making it current makes its device the
 * thread's current device. aclrtSetDevice makes the device's primary (default) context
 * current. Handles are checked against the live contexts: a destroyed one is refused. */
typedef struct acl_context {
    uint32_t magic;
    int device;                 /* logical */
    int primary;
    struct acl_context *next;
} acl_context;

#define CTX_MAGIC 0x41435458u  /* "ACTX" */

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static acl_context *ctx_list;                       /* created with aclrtCreateContext */
static acl_context primary_ctx[SIM_MAX_DEVICES];
static __thread acl_context *t_ctx;

static int ctx_live(const acl_context *c)
{
    if (!c)
        return 0;
    for (int i = 0; i < SIM_MAX_DEVICES; i++)
        if (c == &primary_ctx[i])
            return 1;
    int live = 0;
    pthread_mutex_lock(&ctx_lock);
    for (acl_context *k = ctx_list; k && !live; k = k->next)
        live = k == c;
    pthread_mutex_unlock(&ctx_lock);
    return live;
}

static acl_context *primary_of(int logical)
{
    acl_context *c = &primary_ctx[logical];
    c->magic = CTX_MAGIC;
    c->device = logical;
    c->primary = 1;
    return c;
}

ACL_API aclError aclrtSetDevice(int32_t deviceId)
{
    ENTER();
    sim_status st = sim_set_current(deviceId);
    if (st == SIM_OK)
        t_ctx = primary_of(deviceId);
    return acl_code(st);
}

ACL_API aclError aclrtResetDevice(int32_t deviceId)
{
    ENTER();
    int phys = sim_logical_to_phys(deviceId);
    if (phys < 0)
        return acl_code(sim_fail(SIM_E_INVALID_DEVICE, "aclrtResetDevice: device %d does not exist", (int)deviceId));
    sim_status st = sim_device_synchronize(phys);
    if (sim_current_raw() == phys) {
        sim_clear_current();
        t_ctx = NULL;
    }
    return acl_code(st);
}

ACL_API aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId)
{
    ENTER();
    if (!context)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtCreateContext: context is NULL"));
    sim_status st = sim_set_current(deviceId);
    if (st != SIM_OK)
        return acl_code(st);
    acl_context *c = calloc(1, sizeof *c);
    if (!c)
        return acl_code(sim_fail(SIM_E_HOST_ALLOC, "aclrtCreateContext: out of host memory"));
    c->magic = CTX_MAGIC;
    c->device = deviceId;
    pthread_mutex_lock(&ctx_lock);
    c->next = ctx_list;
    ctx_list = c;
    pthread_mutex_unlock(&ctx_lock);
    t_ctx = c;               /* the new context is current on the calling thread */
    *context = c;
    return ACL_SUCCESS;
}

ACL_API aclError aclrtDestroyContext(aclrtContext context)
{
    ENTER();
    acl_context *found = NULL;
    pthread_mutex_lock(&ctx_lock);
    for (acl_context **k = &ctx_list; *k; k = &(*k)->next)
        if (*k == context) {
            found = *k;
            *k = found->next;
            break;
        }
    pthread_mutex_unlock(&ctx_lock);
    if (!found)
        return acl_code(sim_fail(SIM_E_INVALID_HANDLE, "aclrtDestroyContext: %p is not a context made by "
                                 "aclrtCreateContext (destroyed, a default context, or never created)", context));
    if (t_ctx == found)
        t_ctx = NULL;
    found->magic = 0;
    free(found);
    return ACL_SUCCESS;
}

ACL_API aclError aclrtSetCurrentContext(aclrtContext context)
{
    ENTER();
    acl_context *c = context;
    if (!ctx_live(c))
        return acl_code(sim_fail(SIM_E_INVALID_HANDLE, "aclrtSetCurrentContext: %p is not a live context", context));
    sim_status st = sim_set_current(c->device);
    if (st == SIM_OK)
        t_ctx = c;
    return acl_code(st);
}

ACL_API aclError aclrtGetCurrentContext(aclrtContext *context)
{
    ENTER();
    if (!context)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetCurrentContext: context is NULL"));
    if (!t_ctx || !ctx_live(t_ctx))
        return acl_code(sim_fail(SIM_E_NO_CONTEXT, "aclrtGetCurrentContext: no context is current on this thread "
                                 "(call aclrtSetDevice or aclrtSetCurrentContext first)"));
    *context = t_ctx;
    return ACL_SUCCESS;
}

ACL_API aclError aclrtGetDevice(int32_t *deviceId)
{
    ENTER();
    if (!deviceId)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetDevice: deviceId is NULL"));
    return acl_code(sim_current_logical(deviceId));
}

ACL_API aclError aclrtGetDeviceCount(uint32_t *count)
{
    ENTER();
    if (!count)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetDeviceCount: count is NULL"));
    const char *why = sim_visibility_error();
    if (why)
        return acl_code(sim_fail(SIM_E_NO_DEVICE, "aclrtGetDeviceCount: %s", why));
    *count = (uint32_t)sim_visible_count();
    return ACL_SUCCESS;
}

ACL_API aclError aclrtSynchronizeDevice(void) { return CORE(sim_device_synchronize(SIM_CURRENT)); }

ACL_API aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId)
{
    return CORE(sim_can_access_peer(canAccessPeer, deviceId, peerDeviceId, "aclrtDeviceCanAccessPeer"));
}

ACL_API aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags)
{
    ENTER();
    int phys;
    sim_status st = sim_current_phys(&phys);
    if (st != SIM_OK)
        return acl_code(st);
    if (flags != 0)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtDeviceEnablePeerAccess: flags must be 0"));
    if (sim_logical_to_phys(peerDeviceId) < 0)
        return acl_code(sim_fail(SIM_E_INVALID_DEVICE, "aclrtDeviceEnablePeerAccess: no device %d", (int)peerDeviceId));
    return ACL_SUCCESS; /* simulated devices share one address space: peer access always works */
}

ACL_API aclError aclrtDeviceDisablePeerAccess(int32_t peerDeviceId)
{
    ENTER();
    if (sim_logical_to_phys(peerDeviceId) < 0)
        return acl_code(sim_fail(SIM_E_INVALID_DEVICE, "aclrtDeviceDisablePeerAccess: no device %d", (int)peerDeviceId));
    return ACL_SUCCESS;
}

/* ---- memory ------------------------------------------------------------------ */

ACL_API aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    ENTER();
    (void)policy; /* huge / normal pages are the same thing in the simulator */
    if (!devPtr || size == 0)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtMalloc: %s", devPtr ? "size is 0" : "devPtr is NULL"));
    return acl_code(sim_malloc(SIM_CURRENT, size, devPtr));
}

ACL_API aclError aclrtFree(void *devPtr)
{
    ENTER();
    if (!devPtr)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtFree: devPtr is NULL"));
    return acl_code(sim_free(devPtr));
}

ACL_API aclError aclrtMallocHost(void **hostPtr, size_t size)
{
    ENTER();
    if (!hostPtr || size == 0)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtMallocHost: %s", hostPtr ? "size is 0" : "hostPtr is NULL"));
    return acl_code(sim_host_alloc(size, hostPtr));
}

ACL_API aclError aclrtFreeHost(void *hostPtr)
{
    ENTER();
    if (!hostPtr)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtFreeHost: hostPtr is NULL"));
    return acl_code(sim_host_free(hostPtr));
}

ACL_API aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total)
{
    ENTER();
    if (!free || !total)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetMemInfo: %s is NULL", free ? "total" : "free"));
    if ((unsigned)attr > ACL_MEM_P2P_HUGE1G)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetMemInfo: unknown aclrtMemAttr %d (0 to %d)", (int)attr,
                                 (int)ACL_MEM_P2P_HUGE1G));
    /* one kind of memory per simulated device: every attribute reports it */
    return acl_code(sim_mem_info(SIM_CURRENT, free, total));
}

/* where a copy's pointer lies (MemcpyKindAutoCorrect's location types) */
enum { LOC_HOST_PAGEABLE = 0, LOC_HOST_PINNED = 1, LOC_DEVICE = 2 };

static int location(const void *p)
{
    if (sim_device_of(p) >= 0)
        return LOC_DEVICE;
    return sim_is_host_alloc(p) ? LOC_HOST_PINNED : LOC_HOST_PAGEABLE;
}

static const char *const loc_names[] = {"pageable host memory", "aclrtMallocHost memory", "device memory"};
static const char *const kind_names[] = {"ACL_MEMCPY_HOST_TO_HOST", "ACL_MEMCPY_HOST_TO_DEVICE",
                                         "ACL_MEMCPY_DEVICE_TO_HOST", "ACL_MEMCPY_DEVICE_TO_DEVICE"};

/* Is `kind` (0..3) acceptable between these locations? Between runtime memory (device or
 * pinned host) any kind is: the runtime replaces it with the direction the pointers give.
 * Where pageable memory takes part, a pageable side may stand for host or device. */
static int kind_allowed(int src, int dst, int kind)
{
    if (src != LOC_HOST_PAGEABLE && dst != LOC_HOST_PAGEABLE)
        return 1;
    int src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    int dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    int src_ok = src == LOC_HOST_PAGEABLE || src_dev == (src == LOC_DEVICE);
    int dst_ok = dst == LOC_HOST_PAGEABLE || dst_dev == (dst == LOC_DEVICE);
    return src_ok && dst_ok;
}

/* Check a copy as CANN does; returns ACL_SUCCESS with *dir set (SIM_DEFAULT: by the
 * pointers), ACL_SUCCESS with *dir = -1 when there is nothing to copy, or an error. */
static aclError copy_check(const char *fn, void *dst, size_t destMax, const void *src, size_t count,
                           aclrtMemcpyKind kind, int *dir)
{
    *dir = -1;
    if (count == 0)
        return ACL_SUCCESS;
    if (!dst || !src)
        return fail(ACL_ERROR_INVALID_PARAM, SIM_E_INVALID_VALUE, "%s: %s is NULL", fn, dst ? "src" : "dst");
    if ((unsigned)kind > ACL_MEMCPY_INTER_DEVICE_TO_DEVICE)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "%s: unknown aclrtMemcpyKind %d (0 to 7)", fn, (int)kind));
    if (count > destMax) {
        sim_fail(SIM_E_OUT_OF_RANGE, "%s: count %zu exceeds destMax %zu", fn, count, destMax);
        return keep(ACL_ERROR_RT_PARAM_INVALID);
    }
    if (kind == ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE) {
        *dir = SIM_H2D;
        return ACL_SUCCESS;
    }
    if (kind > ACL_MEMCPY_DEFAULT) {     /* inner / inter device-to-device */
        *dir = SIM_D2D;
        return ACL_SUCCESS;
    }
    if (kind == ACL_MEMCPY_DEFAULT) {
        *dir = SIM_DEFAULT;
        return ACL_SUCCESS;
    }
    int src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    int dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    if ((sim_device_of(src) >= 0) == src_dev && (sim_device_of(dst) >= 0) == dst_dev) {
        *dir = SIM_DEFAULT;          /* the kind matches the pointers: every row of the table allows it */
        return ACL_SUCCESS;
    }
    int sl = location(src), dl = location(dst);
    if (!kind_allowed(sl, dl, kind)) {
        sim_fail(SIM_E_DIRECTION, "%s: %s cannot copy from %s to %s", fn, kind_names[kind], loc_names[sl],
                 loc_names[dl]);
        return keep(ACL_ERROR_RT_PARAM_INVALID);
    }
    /* CANN lets a kind call pageable memory device memory (it may be mapped for the device);
     * here such memory must at least be mapped, so a stale pointer is an error, not a crash */
    if ((src_dev && sl == LOC_HOST_PAGEABLE && !sim_host_mapped(src, count)) ||
        (dst_dev && dl == LOC_HOST_PAGEABLE && !sim_host_mapped(dst, count))) {
        sim_fail(SIM_E_OUT_OF_RANGE, "%s: the %s is neither device memory nor mapped host memory", fn,
                 src_dev && sl == LOC_HOST_PAGEABLE && !sim_host_mapped(src, count) ? "source" : "destination");
        return keep(ACL_ERROR_RT_PARAM_INVALID);
    }
    *dir = SIM_DEFAULT;
    return ACL_SUCCESS;
}

ACL_API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    ENTER();
    int dir;
    aclError rc = copy_check(__func__, dst, destMax, src, count, kind, &dir);
    if (rc != ACL_SUCCESS || dir < 0 || dst == src)
        return rc;
    return acl_code(sim_memcpy_sync(dst, src, count, dir));
}

/* CANN (api_impl.cc MemcpyAsync / MemsetAsync): a stream outside the current context is
 * ACL_ERROR_RT_STREAM_CONTEXT. The simulator's contexts are per device, so a stream of
 * another device is refused (one of another context of the same device is not). */
static aclError check_stream_context(aclrtStream stream, const char *fn)
{
    if (!stream)
        return ACL_SUCCESS;             /* the current context's default stream */
    sim_stream *s;
    int phys;
    if (sim_stream_get(stream, &s) != SIM_OK)
        return ACL_SUCCESS;             /* left to the enqueue, which names the bad handle */
    int dev = s->dev;
    sim_stream_put(s);
    if (sim_current_phys(&phys) != SIM_OK || phys == dev)
        return ACL_SUCCESS;
    sim_fail(SIM_E_INVALID_VALUE, "%s: the stream belongs to device %d, not to the current context's device %d", fn,
             sim_phys_to_logical(dev), sim_phys_to_logical(phys));
    return keep(ACL_ERROR_RT_STREAM_CONTEXT);
}

ACL_API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                                  aclrtStream stream)
{
    ENTER();
    int dir;
    aclError rc = check_stream_context(stream, __func__);
    if (rc != ACL_SUCCESS)
        return rc;
    rc = copy_check(__func__, dst, destMax, src, count, kind, &dir);
    if (rc != ACL_SUCCESS || dir < 0)
        return rc;
    return acl_code(sim_memcpy_async(dst, src, count, dir, stream));
}

ACL_API aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    ENTER();
    if (count > maxCount)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtMemset: count %zu exceeds maxCount %zu", count, maxCount));
    return acl_code(sim_memset_sync(devPtr, value, count, 0));
}

ACL_API aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream)
{
    ENTER();
    aclError rc = check_stream_context(stream, __func__);
    if (rc != ACL_SUCCESS)
        return rc;
    if (count > maxCount)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtMemsetAsync: count %zu exceeds maxCount %zu", count,
                                 maxCount));
    return acl_code(sim_memset_async(devPtr, value, count, 0, stream));
}

/* ---- streams ------------------------------------------------------------------ */

ACL_API aclError aclrtCreateStream(aclrtStream *stream) { return CORE(sim_stream_create(stream)); }

ACL_API aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag)
{
    (void)priority;
    (void)flag;
    return aclrtCreateStream(stream);
}

ACL_API aclError aclrtDestroyStream(aclrtStream stream) { return CORE(sim_stream_destroy(stream)); }
ACL_API aclError aclrtSynchronizeStream(aclrtStream stream) { return CORE(sim_stream_synchronize(stream)); }

ACL_API aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status)
{
    ENTER();
    if (!status)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtStreamQuery: status is NULL"));
    sim_status st = sim_stream_query(stream);
    *status = st == SIM_OK ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
    return st == SIM_E_NOT_READY ? ACL_SUCCESS : acl_code(st);
}

ACL_API aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event)
{
    return CORE(sim_stream_wait_event(stream, event));
}

/* ---- callbacks: subscribed threads and reports ------------------------------ */

/* A callback reaches the subscribed thread as a report: the stream's worker posts it
 * when the stream gets there (and, for ACL_CALLBACK_BLOCK, waits until it has run);
 * the thread runs it in aclrtProcessReport. */
typedef struct acl_report {
    aclrtCallback fn;
    void *data;
    int block;
    int done;
    void *stream;              /* subscription key */
    int dev;
    struct acl_report *next;
} acl_report;

typedef struct acl_sub {
    uint64_t thread;
    void *stream;
    int dev;                   /* physical device of a NULL (default) stream */
    acl_report *head, *tail;
} acl_sub;

#define MAX_SUBS 1024
static pthread_mutex_t rep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rep_cv = PTHREAD_COND_INITIALIZER;
static acl_sub subs[MAX_SUBS];
static int nsubs;

static int stream_dev(void *stream)
{
    int phys = -1;
    if (!stream)
        sim_current_phys(&phys);
    return phys;
}

/* index of the stream's subscription (rep_lock held), or -1 */
static int sub_find(void *stream, int dev)
{
    for (int i = 0; i < nsubs; i++)
        if (subs[i].stream == stream && (stream || subs[i].dev == dev))
            return i;
    return -1;
}

static void report_run(acl_report *r)
{
    r->fn(r->data);
    pthread_mutex_lock(&rep_lock);
    int block = r->block;
    r->done = 1;
    pthread_cond_broadcast(&rep_cv);
    pthread_mutex_unlock(&rep_lock);
    if (!block)
        free(r);
}

/* on the stream's worker: hand the report to the subscribed thread */
static void report_post(void *arg)
{
    acl_report *r = arg;
    pthread_mutex_lock(&rep_lock);
    int i = sub_find(r->stream, r->dev);
    if (i < 0) {                           /* unsubscribed meanwhile: run it here */
        pthread_mutex_unlock(&rep_lock);
        r->block = 0;
        report_run(r);
        return;
    }
    if (subs[i].tail)
        subs[i].tail->next = r;
    else
        subs[i].head = r;
    subs[i].tail = r;
    pthread_cond_broadcast(&rep_cv);
    if (r->block) {
        while (!r->done)
            pthread_cond_wait(&rep_cv, &rep_lock);
        pthread_mutex_unlock(&rep_lock);
        free(r);
        return;
    }
    pthread_mutex_unlock(&rep_lock);
}

ACL_API aclError aclrtSubscribeReport(uint64_t threadId, aclrtStream stream)
{
    ENTER();
    sim_status st = sim_stream_query(stream);
    if (st != SIM_OK && st != SIM_E_NOT_READY)
        return acl_code(st);
    int dev = stream_dev(stream);
    pthread_mutex_lock(&rep_lock);
    aclError rc = ACL_SUCCESS;
    if (sub_find(stream, dev) >= 0)
        rc = fail(ACL_ERROR_RT_STREAM_SUBSCRIBE, SIM_E_INVALID_VALUE, "%s: %s", __func__,
                  "the stream already has a subscribed thread");
    else if (nsubs == MAX_SUBS)
        rc = fail(ACL_ERROR_RT_STREAM_SUBSCRIBE, SIM_E_INVALID_VALUE, "%s: %s", __func__, "too many subscriptions");
    else
        subs[nsubs++] = (acl_sub){.thread = threadId, .stream = stream, .dev = dev};
    pthread_mutex_unlock(&rep_lock);
    return rc;
}

ACL_API aclError aclrtUnSubscribeReport(uint64_t threadId, aclrtStream stream)
{
    ENTER();
    int dev = stream_dev(stream);
    pthread_mutex_lock(&rep_lock);
    int i = sub_find(stream, dev);
    if (i < 0 || subs[i].thread != threadId) {
        pthread_mutex_unlock(&rep_lock);
        return fail(ACL_ERROR_RT_STREAM_SUBSCRIBE, SIM_E_INVALID_VALUE, "%s: %s", __func__,
                    "the thread is not subscribed to the stream");
    }
    acl_report *left = subs[i].head;
    subs[i] = subs[--nsubs];
    pthread_mutex_unlock(&rep_lock);
    while (left) {                         /* reports nobody processed yet run here, none is lost */
        acl_report *next = left->next;
        report_run(left);
        left = next;
    }
    return ACL_SUCCESS;
}

ACL_API aclError aclrtLaunchCallback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                                     aclrtStream stream)
{
    ENTER();
    if (blockType != ACL_CALLBACK_BLOCK && blockType != ACL_CALLBACK_NO_BLOCK)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtLaunchCallback: blockType %d is neither "
                                 "ACL_CALLBACK_BLOCK nor ACL_CALLBACK_NO_BLOCK", (int)blockType));
    if (!fn)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtLaunchCallback: fn is NULL"));
    int dev = stream_dev(stream);
    pthread_mutex_lock(&rep_lock);
    int subscribed = sub_find(stream, dev) >= 0;
    pthread_mutex_unlock(&rep_lock);
    if (!subscribed)
        return fail(ACL_ERROR_RT_STREAM_NO_CB_REG, SIM_E_INVALID_VALUE, "%s: %s", __func__,
                    "no thread is subscribed to the stream (aclrtSubscribeReport)");
    acl_report *r = calloc(1, sizeof *r);
    if (!r)
        return acl_code(sim_fail(SIM_E_HOST_ALLOC, "aclrtLaunchCallback: out of host memory"));
    *r = (acl_report){.fn = fn, .data = userData, .block = blockType == ACL_CALLBACK_BLOCK, .stream = stream,
                      .dev = dev};
    sim_status st = sim_enqueue_host_fn(stream, report_post, r);
    if (st != SIM_OK)
        free(r);
    return acl_code(st);
}

/* the first report for a stream this thread is subscribed to (rep_lock held); 0 when the
 * thread has no subscription at all */
static int take_report(uint64_t self, acl_report **out)
{
    int any = 0;
    *out = NULL;
    for (int i = 0; i < nsubs; i++) {
        if (subs[i].thread != self)
            continue;
        any = 1;
        if (subs[i].head) {
            *out = subs[i].head;
            subs[i].head = subs[i].head->next;
            if (!subs[i].head)
                subs[i].tail = NULL;
            return 1;
        }
    }
    return any;
}

ACL_API aclError aclrtProcessReport(int32_t timeout)
{
    ENTER();
    if (timeout < -1 || timeout == 0)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtProcessReport: timeout %d: -1 waits without limit, "
                                 "a positive value is milliseconds", (int)timeout));
    uint64_t self = (uint64_t)pthread_self();
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    if (timeout > 0) {
        deadline.tv_sec += timeout / 1000;
        deadline.tv_nsec += (long)(timeout % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    acl_report *r = NULL;
    pthread_mutex_lock(&rep_lock);
    for (;;) {
        if (!take_report(self, &r)) {
            pthread_mutex_unlock(&rep_lock);
            return fail(ACL_ERROR_RT_THREAD_SUBSCRIBE, SIM_E_INVALID_VALUE, "%s: %s", __func__,
                        "the calling thread is not subscribed to any stream (aclrtSubscribeReport)");
        }
        if (r)
            break;
        int rc = timeout < 0 ? pthread_cond_wait(&rep_cv, &rep_lock)
                             : pthread_cond_timedwait(&rep_cv, &rep_lock, &deadline);
        if (rc) {
            pthread_mutex_unlock(&rep_lock);
            return fail(ACL_ERROR_RT_REPORT_TIMEOUT, SIM_E_TIMEOUT, "%s: %s", __func__,
                        "no callback report arrived within the timeout");
        }
    }
    pthread_mutex_unlock(&rep_lock);
    report_run(r);
    return ACL_SUCCESS;
}

/* ---- events ------------------------------------------------------------------ */

ACL_API aclError aclrtCreateEvent(aclrtEvent *event) { return CORE(sim_event_create(event)); }

ACL_API aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    (void)flag; /* ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE ...: every simulated event has all of them */
    return aclrtCreateEvent(event);
}

ACL_API aclError aclrtDestroyEvent(aclrtEvent event) { return CORE(sim_event_destroy(event)); }

ACL_API aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    return CORE(sim_event_record(event, stream));
}

ACL_API aclError aclrtSynchronizeEvent(aclrtEvent event) { return CORE(sim_event_synchronize(event)); }
ACL_API aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream) { return CORE(sim_event_reset(event, stream)); }

/* `fn`'s reading of the event into *done: whether it is recorded and complete or, with `waits`,
 * whether every stream told to wait for it has got past the wait; `status` is the caller's
 * out argument, which must not be NULL */
static sim_status event_done(aclrtEvent event, int waits, const void *status, int *done, const char *fn)
{
    ENTER();
    if (!status)
        return sim_fail(SIM_E_INVALID_VALUE, "%s: status is NULL", fn);
    int recorded, complete, waits_done;
    sim_status st = sim_event_status(event, &recorded, &complete, &waits_done);
    if (st == SIM_OK)
        *done = waits ? waits_done : recorded && complete;
    return st;
}

/* A created event that was never recorded (or was reset since) is NOT_READY, as CANN
 * reports for events made by aclrtCreateEvent. */
ACL_API aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    int done = 0;
    sim_status st = event_done(event, 0, status, &done, "aclrtQueryEventStatus");
    if (st == SIM_OK)
        *status = done ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return acl_code(st);
}

/* COMPLETE when every stream that was told to wait for the event has got past the wait
 * (also when none was), NOT_READY while one is still waiting. */
ACL_API aclError aclrtQueryEventWaitStatus(aclrtEvent event, aclrtEventWaitStatus *status)
{
    int done = 0;
    sim_status st = event_done(event, 1, status, &done, "aclrtQueryEventWaitStatus");
    if (st == SIM_OK)
        *status = done ? ACL_EVENT_WAIT_STATUS_COMPLETE : ACL_EVENT_WAIT_STATUS_NOT_READY;
    return acl_code(st);
}

ACL_API aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status)
{
    ENTER();
    if (!status)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtQueryEvent: status is NULL"));
    sim_status st = sim_event_query(event);
    *status = st == SIM_OK ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
    return st == SIM_E_NOT_READY ? ACL_SUCCESS : acl_code(st);
}

ACL_API aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent)
{
    return CORE(sim_event_elapsed(ms, startEvent, endEvent));
}

/* ---- profiling (acl_prof.h) ------------------------------------------------------- */

/* Honest no-op sessions: aclprofInit / aclprofStart / aclprofStop / aclprofFinalize keep
 * the state CANN checks (and return its codes for misuse), but no profile data is
 * collected or written. aclprofGetStepTimestamp records, in stream order, the time the
 * stream reached it; anychip_sim_aclprof_step_time reads it back. */
struct aclprofConfig {
    uint32_t magic;
    uint32_t ndev;
    uint32_t devices[SIM_MAX_DEVICES];
    uint64_t data_types;
};

struct aclprofStepInfo {
    uint32_t magic;
    int refs;                     /* the owner, plus each queued timestamp (atomic) */
    int requested[2];
    int reached[2];               /* atomic */
    uint64_t t_ns[2];
};

#define PROF_CONFIG_MAGIC 0x50434647u  /* "PCFG" */
#define PROF_STEP_MAGIC 0x50535450u    /* "PSTP" */

static pthread_mutex_t prof_lock = PTHREAD_MUTEX_INITIALIZER;
static int prof_initialized;
static const aclprofConfig *prof_running;

ACL_API aclError aclprofInit(const char *profilerResultPath, size_t length)
{
    ENTER();
    if (!profilerResultPath || length == 0 || strnlen(profilerResultPath, length + 1) != length)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclprofInit: want a result path and its length"));
    pthread_mutex_lock(&prof_lock);
    int again = prof_initialized;
    prof_initialized = 1;
    pthread_mutex_unlock(&prof_lock);
    return again ? fail(ACL_ERROR_REPEAT_INITIALIZE, SIM_E_INVALID_VALUE, "%s: %s", __func__, "already initialized")
                 : ACL_SUCCESS;
}

ACL_API aclError aclprofFinalize(void)
{
    ENTER();
    pthread_mutex_lock(&prof_lock);
    aclError rc = ACL_SUCCESS;
    if (!prof_initialized)
        rc = fail(ACL_ERROR_UNINITIALIZE, SIM_E_INVALID_VALUE, "%s: %s", __func__, "aclprofInit was not called");
    else if (prof_running)
        rc = fail(ACL_ERROR_PROF_ALREADY_RUN, SIM_E_BUSY, "%s: %s", __func__, "a session is running (aclprofStop)");
    else
        prof_initialized = 0;
    pthread_mutex_unlock(&prof_lock);
    return rc;
}

ACL_API aclprofConfig *aclprofCreateConfig(uint32_t *deviceIdList, uint32_t deviceNums,
                                           aclprofAicoreMetrics aicoreMetrics, const aclprofAicoreEvents *aicoreEvents,
                                           uint64_t dataTypeConfig)
{
    ENTER();
    (void)aicoreMetrics;
    (void)aicoreEvents;
    if (!deviceIdList || deviceNums == 0 || deviceNums > SIM_MAX_DEVICES) {
        sim_fail(SIM_E_INVALID_VALUE, "aclprofCreateConfig: want 1 to %d device ids", SIM_MAX_DEVICES);
        return NULL;
    }
    for (uint32_t i = 0; i < deviceNums; i++)
        if (sim_logical_to_phys((int)deviceIdList[i]) < 0) {
            sim_fail(SIM_E_INVALID_DEVICE, "aclprofCreateConfig: device %u does not exist", deviceIdList[i]);
            return NULL;
        }
    aclprofConfig *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->magic = PROF_CONFIG_MAGIC;
    c->ndev = deviceNums;
    memcpy(c->devices, deviceIdList, deviceNums * sizeof *deviceIdList);
    c->data_types = dataTypeConfig;
    return c;
}

ACL_API aclError aclprofDestroyConfig(const aclprofConfig *profilerConfig)
{
    ENTER();
    if (!profilerConfig || profilerConfig->magic != PROF_CONFIG_MAGIC)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclprofDestroyConfig: not a live aclprofConfig"));
    pthread_mutex_lock(&prof_lock);
    int running = prof_running == profilerConfig;
    pthread_mutex_unlock(&prof_lock);
    if (running)
        return fail(ACL_ERROR_PROF_ALREADY_RUN, SIM_E_BUSY, "%s: %s", __func__, "the session is running (aclprofStop)");
    aclprofConfig *c = (aclprofConfig *)profilerConfig;
    c->magic = 0;
    free(c);
    return ACL_SUCCESS;
}

ACL_API aclError aclprofStart(const aclprofConfig *profilerConfig)
{
    ENTER();
    if (!profilerConfig || profilerConfig->magic != PROF_CONFIG_MAGIC)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclprofStart: not a live aclprofConfig"));
    pthread_mutex_lock(&prof_lock);
    aclError rc = ACL_SUCCESS;
    if (!prof_initialized)
        rc = fail(ACL_ERROR_UNINITIALIZE, SIM_E_INVALID_VALUE, "%s: %s", __func__, "aclprofInit was not called");
    else if (prof_running)
        rc = fail(ACL_ERROR_PROF_ALREADY_RUN, SIM_E_BUSY, "%s: %s", __func__, "a session is already running");
    else
        prof_running = profilerConfig;
    pthread_mutex_unlock(&prof_lock);
    return rc;
}

ACL_API aclError aclprofStop(const aclprofConfig *profilerConfig)
{
    ENTER();
    if (!profilerConfig || profilerConfig->magic != PROF_CONFIG_MAGIC)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclprofStop: not a live aclprofConfig"));
    pthread_mutex_lock(&prof_lock);
    aclError rc = ACL_SUCCESS;
    if (prof_running != profilerConfig)
        rc = fail(ACL_ERROR_PROF_NOT_RUN, SIM_E_INVALID_VALUE, "%s: %s", __func__,
                  "no session was started with this config");
    else
        prof_running = NULL;
    pthread_mutex_unlock(&prof_lock);
    return rc;
}

static void step_put(aclprofStepInfo *s)
{
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        s->magic = 0;
        free(s);
    }
}

ACL_API aclprofStepInfo *aclprofCreateStepInfo(void)
{
    ENTER();
    aclprofStepInfo *s = calloc(1, sizeof *s);
    if (s) {
        s->magic = PROF_STEP_MAGIC;
        s->refs = 1;
    }
    return s;
}

ACL_API void aclprofDestroyStepInfo(aclprofStepInfo *stepinfo)
{
    ENTER();
    if (stepinfo && stepinfo->magic == PROF_STEP_MAGIC)
        step_put(stepinfo);
}

struct step_mark { aclprofStepInfo *info; int tag; };

static void step_reached(void *arg)
{
    struct step_mark *m = arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    m->info->t_ns[m->tag] = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    __atomic_store_n(&m->info->reached[m->tag], 1, __ATOMIC_RELEASE);
    step_put(m->info);
    free(m);
}

ACL_API aclError aclprofGetStepTimestamp(aclprofStepInfo *stepInfo, aclprofStepTag tag, aclrtStream stream)
{
    ENTER();
    if (!stepInfo || stepInfo->magic != PROF_STEP_MAGIC)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclprofGetStepTimestamp: not a live aclprofStepInfo"));
    if (tag != ACL_STEP_START && tag != ACL_STEP_END)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclprofGetStepTimestamp: tag %d is neither ACL_STEP_START "
                                 "nor ACL_STEP_END", (int)tag));
    struct step_mark *m = malloc(sizeof *m);
    if (!m)
        return acl_code(sim_fail(SIM_E_HOST_ALLOC, "aclprofGetStepTimestamp: out of host memory"));
    m->info = stepInfo;
    m->tag = (int)tag;
    __atomic_add_fetch(&stepInfo->refs, 1, __ATOMIC_ACQ_REL);
    __atomic_store_n(&stepInfo->reached[tag], 0, __ATOMIC_RELEASE);
    stepInfo->requested[tag] = 1;
    sim_status st = sim_enqueue_host_fn(stream, step_reached, m);
    if (st != SIM_OK) {
        step_put(stepInfo);
        free(m);
    }
    return acl_code(st);
}

ACL_API aclError anychip_sim_aclprof_step_time(const aclprofStepInfo *stepInfo, aclprofStepTag tag, uint64_t *ns)
{
    ENTER();
    if (!stepInfo || stepInfo->magic != PROF_STEP_MAGIC || !ns || (tag != ACL_STEP_START && tag != ACL_STEP_END))
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "anychip_sim_aclprof_step_time: bad argument"));
    if (!stepInfo->requested[tag])
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "anychip_sim_aclprof_step_time: no timestamp was requested"));
    if (!__atomic_load_n(&stepInfo->reached[tag], __ATOMIC_ACQUIRE))
        return fail(ACL_ERROR_PROF_NOT_RUN, SIM_E_NOT_READY, "%s: %s", __func__,
                    "the stream has not reached the timestamp yet");
    *ns = stepInfo->t_ns[tag];
    return ACL_SUCCESS;
}

/* ---- host functions, device attributes, the last error ------------------------------------ */

ACL_API aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args)
{
    ENTER();
    if (!fn)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtLaunchHostFunc: fn is NULL"));
    /* CANN runs it on a thread of the runtime's own, in stream order, blocking the stream's
     * later work until it returns: the simulator's stream worker does the same */
    return acl_code(sim_enqueue_host_fn(stream, fn, args));
}

/* The simulated chip: a 910B-like part (inferred figures, see docs/simulator.md). */
#define SIM_AICPU_CORES 6
#define SIM_AICORE_CORES 24
#define SIM_VECTOR_CORES 48
#define SIM_L2_CACHE_BYTES (192ll << 20)

ACL_API aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value)
{
    ENTER();
    if (!value)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetDeviceInfo: value is NULL"));
    int phys = deviceId <= INT32_MAX ? sim_logical_to_phys((int)deviceId) : -1;
    if (phys < 0)
        return acl_code(sim_fail(SIM_E_INVALID_DEVICE, "aclrtGetDeviceInfo: device %u is not visible (0..%d)",
                                 deviceId, sim_visible_count() - 1));
    size_t free_bytes = 0, total = 0;
    switch (attr) {
    case ACL_DEV_ATTR_AICPU_CORE_NUM: *value = SIM_AICPU_CORES; return ACL_SUCCESS;
    case ACL_DEV_ATTR_AICORE_CORE_NUM:
    case ACL_DEV_ATTR_CUBE_CORE_NUM: *value = SIM_AICORE_CORES; return ACL_SUCCESS;
    case ACL_DEV_ATTR_VECTOR_CORE_NUM: *value = SIM_VECTOR_CORES; return ACL_SUCCESS;
    case ACL_DEV_ATTR_L2_CACHE_SIZE: *value = SIM_L2_CACHE_BYTES; return ACL_SUCCESS;
    case ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE: {
        sim_status st = sim_mem_info(phys, &free_bytes, &total);
        if (st == SIM_OK)
            *value = (int64_t)total;
        return acl_code(st);
    }
    case ACL_DEV_ATTR_WARP_SIZE:
    case ACL_DEV_ATTR_MAX_THREAD_PER_VECTOR_CORE:
        /* SIMT attributes of newer chips; a 910B-like part has none */
        return acl_code(sim_fail(SIM_E_NOT_SUPPORTED, "aclrtGetDeviceInfo: attribute %d (SIMT) is not supported "
                                 "by this chip", (int)attr));
    default:
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetDeviceInfo: unknown aclrtDevAttr %d", (int)attr));
    }
}

static aclError last_error(aclrtLastErrLevel level, int clear, const char *fn)
{
    if (level != ACL_RT_THREAD_LEVEL)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "%s: level %d; only ACL_RT_THREAD_LEVEL (0) exists", fn,
                                 (int)level));
    aclError e = t_last_error;
    if (clear)
        t_last_error = ACL_SUCCESS;
    return e;
}

ACL_API aclError aclrtGetLastError(aclrtLastErrLevel level) { return last_error(level, 1, __func__); }

ACL_API aclError aclrtPeekAtLastError(aclrtLastErrLevel level) { return last_error(level, 0, __func__); }
