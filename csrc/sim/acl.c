/*
 * Ascend ACL runtime front end of the simulator (libascend_sim).
 *
 * Exports the AscendCL runtime entry points with the declarations of acl/acl_rt.h and
 * acl/acl.h (names, argument order, enum values, aclError codes). Only the runtime
 * part is here; HCCL arrives with the collectives.
 *
 * Behaviour chosen where ACL's documentation is silent (see docs/simulator.md):
 *   - every aclrt* call except aclrtGetDeviceCount needs aclInit first
 *     (ACL_ERROR_UNINITIALIZE otherwise);
 *   - the current device is per thread; calls that need one fail with
 *     ACL_ERROR_RT_CONTEXT_NULL until aclrtSetDevice;
 *   - address errors (bad free, copy outside an allocation, host/device mismatch)
 *     return ACL_ERROR_RT_PARAM_INVALID; malformed arguments ACL_ERROR_INVALID_PARAM;
 *     out of device memory ACL_ERROR_RT_MEMORY_ALLOCATION;
 *     a destroyed stream or event ACL_ERROR_RT_INVALID_HANDLE.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "core.h"

#define ACL_API SIM_EXPORT

typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void (*aclrtCallback)(void *userData);

typedef enum aclrtMemcpyKind {
    ACL_MEMCPY_HOST_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEFAULT,
} aclrtMemcpyKind;

typedef enum aclrtMemMallocPolicy {
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEM_MALLOC_HUGE_ONLY,
    ACL_MEM_MALLOC_NORMAL_ONLY,
    ACL_MEM_MALLOC_HUGE_FIRST_P2P,
    ACL_MEM_MALLOC_HUGE_ONLY_P2P,
    ACL_MEM_MALLOC_NORMAL_ONLY_P2P,
} aclrtMemMallocPolicy;

typedef enum aclrtMemAttr {
    ACL_DDR_MEM,
    ACL_HBM_MEM,
    ACL_DDR_MEM_HUGE,
    ACL_DDR_MEM_NORMAL,
    ACL_HBM_MEM_HUGE,
    ACL_HBM_MEM_NORMAL,
    ACL_DDR_MEM_P2P_HUGE,
    ACL_DDR_MEM_P2P_NORMAL,
    ACL_HBM_MEM_P2P_HUGE,
    ACL_HBM_MEM_P2P_NORMAL,
} aclrtMemAttr;

typedef enum aclrtEventStatus {          /* deprecated aclrtQueryEvent: opposite polarity */
    ACL_EVENT_STATUS_COMPLETE = 0,
    ACL_EVENT_STATUS_NOT_READY = 1,
    ACL_EVENT_STATUS_RESERVED = 2,
} aclrtEventStatus;

typedef enum aclrtEventRecordedStatus {
    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
    ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
} aclrtEventRecordedStatus;

typedef enum aclrtStreamStatus {         /* aclrtStreamQuery (newer CANN releases) */
    ACL_STREAM_STATUS_COMPLETE = 0,
    ACL_STREAM_STATUS_NOT_READY = 1,
    ACL_STREAM_STATUS_RESERVED = 0xFFFF,
} aclrtStreamStatus;

typedef enum aclrtCallbackBlockType {
    ACL_CALLBACK_NO_BLOCK,
    ACL_CALLBACK_BLOCK,
} aclrtCallbackBlockType;

/* acl_base.h */
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_REPEAT_FINALIZE 100037
#define ACL_ERROR_BAD_ALLOC 200000
/* error_codes/rt_error_codes.h */
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID 107006
#define ACL_ERROR_RT_INVALID_HANDLE 107017
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_NO_DEVICE 207004
#define ACL_ERROR_RT_INTERNAL_ERROR 507000
#define ACL_ERROR_RT_EVENT_NOT_COMPLETE 507006
#define ACL_ERROR_RT_SYS_DMA 507013
#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046

static pthread_once_t fe_once = PTHREAD_ONCE_INIT;
static int acl_initialized;

static void fe_init(void)
{
    sim_core_init(getenv("ASCEND_RT_VISIBLE_DEVICES"), SIM_VIS_ACL);
    sim_set_require_current(1);
}

static aclError acl_code(sim_status st)
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
    case SIM_E_NOT_RECORDED: return ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID;
    case SIM_E_ASYNC_FAULT: return ACL_ERROR_RT_SYS_DMA;
    case SIM_E_NOT_SUPPORTED: return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
    default: return ACL_ERROR_RT_INTERNAL_ERROR;
    }
}

#define ENTER()                                                                              \
    do {                                                                                     \
        pthread_once(&fe_once, fe_init);                                                     \
        if (!__atomic_load_n(&acl_initialized, __ATOMIC_ACQUIRE))                             \
            return (aclError)(sim_fail(SIM_E_INVALID_VALUE, "%s: aclInit has not been called", \
                                       __func__), ACL_ERROR_UNINITIALIZE);                   \
    } while (0)

static int memcpy_dir(aclrtMemcpyKind kind)
{
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: return SIM_H2H;
    case ACL_MEMCPY_HOST_TO_DEVICE: return SIM_H2D;
    case ACL_MEMCPY_DEVICE_TO_HOST: return SIM_D2H;
    case ACL_MEMCPY_DEVICE_TO_DEVICE: return SIM_D2D;
    case ACL_MEMCPY_DEFAULT: return SIM_DEFAULT;
    default: return -1;
    }
}

/* ---- init ------------------------------------------------------------------- */

ACL_API aclError aclInit(const char *configPath)
{
    (void)configPath; /* the simulator has nothing to configure from the JSON file */
    pthread_once(&fe_once, fe_init);
    int expected = 0;
    if (!__atomic_compare_exchange_n(&acl_initialized, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        sim_fail(SIM_E_INVALID_VALUE, "aclInit: already initialized");
        return ACL_ERROR_REPEAT_INITIALIZE;
    }
    return ACL_SUCCESS;
}

ACL_API aclError aclFinalize(void)
{
    pthread_once(&fe_once, fe_init);
    int expected = 1;
    if (!__atomic_compare_exchange_n(&acl_initialized, &expected, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        sim_fail(SIM_E_INVALID_VALUE, "aclFinalize: not initialized, or already finalized");
        return ACL_ERROR_REPEAT_FINALIZE;
    }
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

ACL_API aclError aclrtSetDevice(int32_t deviceId)
{
    ENTER();
    return acl_code(sim_set_current(deviceId));
}

ACL_API aclError aclrtResetDevice(int32_t deviceId)
{
    ENTER();
    int phys = sim_logical_to_phys(deviceId);
    if (phys < 0)
        return acl_code(sim_fail(SIM_E_INVALID_DEVICE, "aclrtResetDevice: device %d does not exist", (int)deviceId));
    sim_status st = sim_device_synchronize(phys);
    if (sim_current_raw() == phys)
        sim_clear_current();
    return acl_code(st);
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
    pthread_once(&fe_once, fe_init);
    if (!count)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetDeviceCount: count is NULL"));
    *count = (uint32_t)sim_visible_count();
    return ACL_SUCCESS;
}

ACL_API aclError aclrtSynchronizeDevice(void)
{
    ENTER();
    return acl_code(sim_device_synchronize(SIM_CURRENT));
}

ACL_API aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId)
{
    ENTER();
    if (!canAccessPeer)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtDeviceCanAccessPeer: canAccessPeer is NULL"));
    if (sim_logical_to_phys(deviceId) < 0 || sim_logical_to_phys(peerDeviceId) < 0)
        return acl_code(sim_fail(SIM_E_INVALID_DEVICE, "aclrtDeviceCanAccessPeer: no device %d",
                                 sim_logical_to_phys(deviceId) < 0 ? (int)deviceId : (int)peerDeviceId));
    *canAccessPeer = deviceId != peerDeviceId;
    return ACL_SUCCESS;
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
    if (!free || !total || (unsigned)attr > ACL_HBM_MEM_P2P_NORMAL)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtGetMemInfo: bad argument"));
    return acl_code(sim_mem_info(SIM_CURRENT, free, total));
}

/* the core's direction for a copy of `count` bytes into `destMax`, or -1 (message set) */
static int copy_dir(const char *fn, size_t destMax, size_t count, aclrtMemcpyKind kind)
{
    int dir = memcpy_dir(kind);
    if (dir < 0) {
        sim_fail(SIM_E_INVALID_VALUE, "%s: unknown aclrtMemcpyKind %d", fn, (int)kind);
        return -1;
    }
    if (count > destMax) {
        sim_fail(SIM_E_INVALID_VALUE, "%s: count %zu exceeds destMax %zu", fn, count, destMax);
        return -1;
    }
    return dir;
}

ACL_API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    ENTER();
    int dir = copy_dir(__func__, destMax, count, kind);
    return dir < 0 ? ACL_ERROR_INVALID_PARAM : acl_code(sim_memcpy_sync(dst, src, count, dir));
}

ACL_API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                                  aclrtStream stream)
{
    ENTER();
    int dir = copy_dir(__func__, destMax, count, kind);
    return dir < 0 ? ACL_ERROR_INVALID_PARAM : acl_code(sim_memcpy_async(dst, src, count, dir, stream));
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
    if (count > maxCount)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtMemsetAsync: count %zu exceeds maxCount %zu", count,
                                 maxCount));
    return acl_code(sim_memset_async(devPtr, value, count, 0, stream));
}

/* ---- streams ------------------------------------------------------------------ */

ACL_API aclError aclrtCreateStream(aclrtStream *stream)
{
    ENTER();
    return acl_code(sim_stream_create(stream));
}

ACL_API aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag)
{
    (void)priority;
    (void)flag;
    return aclrtCreateStream(stream);
}

ACL_API aclError aclrtDestroyStream(aclrtStream stream)
{
    ENTER();
    return acl_code(sim_stream_destroy(stream));
}

ACL_API aclError aclrtSynchronizeStream(aclrtStream stream)
{
    ENTER();
    return acl_code(sim_stream_synchronize(stream));
}

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
    ENTER();
    return acl_code(sim_stream_wait_event(stream, event));
}

ACL_API aclError aclrtLaunchCallback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                                     aclrtStream stream)
{
    ENTER();
    (void)blockType; /* callbacks run on the stream's own worker, in order, either way */
    return acl_code(sim_enqueue_host_fn(stream, fn, userData));
}

/* ---- events ------------------------------------------------------------------ */

ACL_API aclError aclrtCreateEvent(aclrtEvent *event)
{
    ENTER();
    return acl_code(sim_event_create(event));
}

ACL_API aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    (void)flag;
    return aclrtCreateEvent(event);
}

ACL_API aclError aclrtDestroyEvent(aclrtEvent event)
{
    ENTER();
    return acl_code(sim_event_destroy(event));
}

ACL_API aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    ENTER();
    return acl_code(sim_event_record(event, stream));
}

ACL_API aclError aclrtSynchronizeEvent(aclrtEvent event)
{
    ENTER();
    return acl_code(sim_event_synchronize(event));
}

ACL_API aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    ENTER();
    if (!status)
        return acl_code(sim_fail(SIM_E_INVALID_VALUE, "aclrtQueryEventStatus: status is NULL"));
    sim_status st = sim_event_query(event);
    *status = st == SIM_OK ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return st == SIM_E_NOT_READY ? ACL_SUCCESS : acl_code(st);
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
    ENTER();
    return acl_code(sim_event_elapsed(ms, startEvent, endEvent));
}
