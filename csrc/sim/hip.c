/*
 * HIP front end of the simulator (libhygon_sim), standing in for libamdhip64.so /
 * Hygon DTK's libgalaxyhip.so.
 *
 * Exports the HIP runtime entry points of hip/hip_runtime_api.h with HIP's argument
 * orders, hipMemcpyKind values and hipError_t codes. HIP_VISIBLE_DEVICES (or, when it
 * is unset, CUDA_VISIBLE_DEVICES) selects devices in list order.
 *
 * Deviation: the null stream is an ordinary in-order stream of the current device; it
 * does not implicitly synchronize with the device's other streams as HIP's legacy
 * default stream does.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define HIP_API SIM_EXPORT

typedef enum hipError_t {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNotInitialized = 3,
    hipErrorInvalidDevicePointer = 17,
    hipErrorInvalidMemcpyDirection = 21,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorInvalidHandle = 400,
    hipErrorNotReady = 600,
    hipErrorIllegalAddress = 700,
    hipErrorPeerAccessAlreadyEnabled = 704,
    hipErrorPeerAccessNotEnabled = 705,
    hipErrorNotSupported = 801,
    hipErrorUnknown = 999,
} hipError_t;

typedef enum hipMemcpyKind {
    hipMemcpyHostToHost = 0,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipMemcpyDeviceToDevice = 3,
    hipMemcpyDefault = 4,
} hipMemcpyKind;

typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef int hipDevice_t;
typedef void (*hipHostFn_t)(void *userData);

#define HIP_IPC_HANDLE_SIZE 64
typedef struct hipIpcMemHandle_st {
    char reserved[HIP_IPC_HANDLE_SIZE];
} hipIpcMemHandle_t;

_Static_assert(sizeof(anychip_sim_ipc_handle) == HIP_IPC_HANDLE_SIZE, "IPC handle must fit hipIpcMemHandle_t");

static pthread_once_t fe_once = PTHREAD_ONCE_INIT;
static __thread hipError_t t_last = hipSuccess;
static unsigned char peer_enabled[SIM_MAX_DEVICES][SIM_MAX_DEVICES];
static pthread_mutex_t peer_lock = PTHREAD_MUTEX_INITIALIZER;

static void fe_init(void)
{
    const char *vis = getenv("HIP_VISIBLE_DEVICES");
    if (!vis)
        vis = getenv("CUDA_VISIBLE_DEVICES");
    sim_core_init(vis, SIM_VIS_CUDA);
    sim_set_require_current(0);
}

#define ENTER() pthread_once(&fe_once, fe_init)

static hipError_t map_status(sim_status st)
{
    switch (st) {
    case SIM_OK: return hipSuccess;
    case SIM_E_INVALID_VALUE: return hipErrorInvalidValue;
    case SIM_E_INVALID_DEVICE: return hipErrorInvalidDevice;
    case SIM_E_NO_DEVICE:
    case SIM_E_NO_CONTEXT: return hipErrorNoDevice;
    case SIM_E_OUT_OF_MEMORY:
    case SIM_E_HOST_ALLOC: return hipErrorOutOfMemory;
    case SIM_E_BAD_FREE: return hipErrorInvalidDevicePointer;
    case SIM_E_OUT_OF_RANGE: return hipErrorInvalidValue;
    case SIM_E_DIRECTION: return hipErrorInvalidMemcpyDirection;
    case SIM_E_INVALID_HANDLE:
    case SIM_E_INVALID_STREAM:
    case SIM_E_NOT_RECORDED: return hipErrorInvalidHandle;
    case SIM_E_NOT_READY:
    case SIM_E_TIMEOUT: return hipErrorNotReady;
    case SIM_E_ASYNC_FAULT: return hipErrorIllegalAddress;
    case SIM_E_NOT_SUPPORTED: return hipErrorNotSupported;
    case SIM_E_BUSY: return hipErrorInvalidValue;
    default: return hipErrorUnknown;
    }
}

/* translate and remember as the thread's last error (hipErrorNotReady is not an error) */
static hipError_t ret(sim_status st)
{
    hipError_t e = map_status(st);
    if (e != hipSuccess && e != hipErrorNotReady)
        t_last = e;
    return e;
}

static int memcpy_dir(hipMemcpyKind kind)
{
    switch (kind) {
    case hipMemcpyHostToHost: return SIM_H2H;
    case hipMemcpyHostToDevice: return SIM_H2D;
    case hipMemcpyDeviceToHost: return SIM_D2H;
    case hipMemcpyDeviceToDevice: return SIM_D2D;
    case hipMemcpyDefault: return SIM_DEFAULT;
    default: return -1;
    }
}

/* ---- errors --------------------------------------------------------------------- */

HIP_API const char *hipGetErrorName(hipError_t error)
{
    switch (error) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorInvalidDevicePointer: return "hipErrorInvalidDevicePointer";
    case hipErrorInvalidMemcpyDirection: return "hipErrorInvalidMemcpyDirection";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotReady: return "hipErrorNotReady";
    case hipErrorIllegalAddress: return "hipErrorIllegalAddress";
    case hipErrorPeerAccessAlreadyEnabled: return "hipErrorPeerAccessAlreadyEnabled";
    case hipErrorPeerAccessNotEnabled: return "hipErrorPeerAccessNotEnabled";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    case hipErrorUnknown: return "hipErrorUnknown";
    }
    return "hipErrorUnknown";
}

HIP_API const char *hipGetErrorString(hipError_t error)
{
    switch (error) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument";
    case hipErrorOutOfMemory: return "out of memory";
    case hipErrorNotInitialized: return "initialization error";
    case hipErrorInvalidDevicePointer: return "invalid device pointer";
    case hipErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case hipErrorNoDevice: return "no ROCm-capable device is detected";
    case hipErrorInvalidDevice: return "invalid device ordinal";
    case hipErrorInvalidHandle: return "invalid resource handle";
    case hipErrorNotReady: return "device not ready";
    case hipErrorIllegalAddress: return "an illegal memory access was encountered";
    case hipErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case hipErrorPeerAccessNotEnabled: return "peer access has not been enabled";
    case hipErrorNotSupported: return "operation not supported";
    case hipErrorUnknown: return "unknown error";
    }
    return "unknown error";
}

HIP_API hipError_t hipGetLastError(void)
{
    hipError_t e = t_last;
    t_last = hipSuccess;
    return e;
}

HIP_API hipError_t hipPeekAtLastError(void) { return t_last; }

/* ---- init, versions, devices ----------------------------------------------------- */

HIP_API hipError_t hipInit(unsigned int flags)
{
    ENTER();
    if (flags != 0)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipInit: flags must be 0"));
    return hipSuccess;
}

HIP_API hipError_t hipRuntimeGetVersion(int *runtimeVersion)
{
    ENTER();
    if (!runtimeVersion)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipRuntimeGetVersion: NULL argument"));
    *runtimeVersion = 60000000; /* reports itself as a HIP 6.0 runtime */
    return hipSuccess;
}

HIP_API hipError_t hipDriverGetVersion(int *driverVersion)
{
    ENTER();
    if (!driverVersion)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipDriverGetVersion: NULL argument"));
    *driverVersion = 60000000;
    return hipSuccess;
}

HIP_API hipError_t hipGetDeviceCount(int *count)
{
    ENTER();
    if (!count)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipGetDeviceCount: count is NULL"));
    *count = sim_visible_count();
    if (*count == 0)
        return ret(sim_fail(SIM_E_NO_DEVICE, "no simulated device is visible"));
    return hipSuccess;
}

HIP_API hipError_t hipSetDevice(int deviceId)
{
    ENTER();
    return ret(sim_set_current(deviceId));
}

HIP_API hipError_t hipGetDevice(int *deviceId)
{
    ENTER();
    if (!deviceId)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipGetDevice: deviceId is NULL"));
    return ret(sim_current_logical(deviceId));
}

HIP_API hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device)
{
    ENTER();
    if (!name || len <= 0)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipDeviceGetName: bad buffer"));
    if (sim_logical_to_phys(device) < 0)
        return ret(sim_fail(SIM_E_INVALID_DEVICE, "hipDeviceGetName: device %d does not exist", device));
    const char *n = "Hygon DCU (anychip simulator)";
    size_t k = strlen(n);
    if (k >= (size_t)len)
        k = (size_t)len - 1;
    memcpy(name, n, k);
    name[k] = '\0';
    return hipSuccess;
}

HIP_API hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device)
{
    ENTER();
    if (!bytes)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipDeviceTotalMem: bytes is NULL"));
    if (sim_logical_to_phys(device) < 0)
        return ret(sim_fail(SIM_E_INVALID_DEVICE, "hipDeviceTotalMem: device %d does not exist", device));
    *bytes = sim_capacity();
    return hipSuccess;
}

HIP_API hipError_t hipDeviceSynchronize(void)
{
    ENTER();
    return ret(sim_device_synchronize(SIM_CURRENT));
}

HIP_API hipError_t hipDeviceCanAccessPeer(int *canAccessPeer, int deviceId, int peerDeviceId)
{
    ENTER();
    if (!canAccessPeer)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipDeviceCanAccessPeer: canAccessPeer is NULL"));
    if (sim_logical_to_phys(deviceId) < 0 || sim_logical_to_phys(peerDeviceId) < 0)
        return ret(sim_fail(SIM_E_INVALID_DEVICE, "hipDeviceCanAccessPeer: no such device"));
    *canAccessPeer = deviceId != peerDeviceId;
    return hipSuccess;
}

HIP_API hipError_t hipDeviceEnablePeerAccess(int peerDeviceId, unsigned int flags)
{
    ENTER();
    int phys, peer = sim_logical_to_phys(peerDeviceId);
    sim_status st = sim_current_phys(&phys);
    if (st != SIM_OK)
        return ret(st);
    if (peer < 0 || peer == phys)
        return ret(sim_fail(SIM_E_INVALID_DEVICE, "hipDeviceEnablePeerAccess: bad peer device %d", peerDeviceId));
    if (flags != 0)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipDeviceEnablePeerAccess: flags must be 0"));
    pthread_mutex_lock(&peer_lock);
    int already = peer_enabled[phys][peer];
    peer_enabled[phys][peer] = 1;
    pthread_mutex_unlock(&peer_lock);
    if (already) {
        sim_fail(SIM_E_INVALID_VALUE, "hipDeviceEnablePeerAccess: already enabled");
        t_last = hipErrorPeerAccessAlreadyEnabled;
        return hipErrorPeerAccessAlreadyEnabled;
    }
    return hipSuccess;
}

HIP_API hipError_t hipDeviceDisablePeerAccess(int peerDeviceId)
{
    ENTER();
    int phys, peer = sim_logical_to_phys(peerDeviceId);
    sim_status st = sim_current_phys(&phys);
    if (st != SIM_OK)
        return ret(st);
    if (peer < 0)
        return ret(sim_fail(SIM_E_INVALID_DEVICE, "hipDeviceDisablePeerAccess: bad peer device %d", peerDeviceId));
    pthread_mutex_lock(&peer_lock);
    int was = peer_enabled[phys][peer];
    peer_enabled[phys][peer] = 0;
    pthread_mutex_unlock(&peer_lock);
    if (!was) {
        sim_fail(SIM_E_INVALID_VALUE, "hipDeviceDisablePeerAccess: not enabled");
        t_last = hipErrorPeerAccessNotEnabled;
        return hipErrorPeerAccessNotEnabled;
    }
    return hipSuccess;
}

/* ---- memory --------------------------------------------------------------------- */

HIP_API hipError_t hipMalloc(void **ptr, size_t size)
{
    ENTER();
    if (!ptr)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipMalloc: ptr is NULL"));
    if (size == 0) {
        *ptr = NULL;
        return hipSuccess;
    }
    return ret(sim_malloc(SIM_CURRENT, size, ptr));
}

HIP_API hipError_t hipFree(void *ptr)
{
    ENTER();
    if (!ptr)
        return hipSuccess;
    return ret(sim_free(ptr));
}

HIP_API hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags)
{
    ENTER();
    (void)flags;
    if (!ptr)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipHostMalloc: ptr is NULL"));
    if (size == 0) {
        *ptr = NULL;
        return hipSuccess;
    }
    return ret(sim_host_alloc(size, ptr));
}

HIP_API hipError_t hipHostFree(void *ptr)
{
    ENTER();
    if (!ptr)
        return hipSuccess;
    sim_status st = sim_host_free(ptr);
    return st == SIM_E_BAD_FREE ? ret(SIM_E_INVALID_VALUE) : ret(st);
}

HIP_API hipError_t hipMemGetInfo(size_t *free, size_t *total)
{
    ENTER();
    if (!free || !total)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipMemGetInfo: NULL argument"));
    return ret(sim_mem_info(SIM_CURRENT, free, total));
}

HIP_API hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind)
{
    ENTER();
    int dir = memcpy_dir(kind);
    if (dir < 0)
        return ret(sim_fail(SIM_E_DIRECTION, "hipMemcpy: unknown hipMemcpyKind %d", (int)kind));
    return ret(sim_memcpy_sync(dst, src, sizeBytes, dir));
}

HIP_API hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                                  hipStream_t stream)
{
    ENTER();
    int dir = memcpy_dir(kind);
    if (dir < 0)
        return ret(sim_fail(SIM_E_DIRECTION, "hipMemcpyAsync: unknown hipMemcpyKind %d", (int)kind));
    return ret(sim_memcpy_async(dst, src, sizeBytes, dir, stream));
}

static sim_status check_peer(void *dst, int dstDevice, const void *src, int srcDevice, size_t n)
{
    int dphys = sim_logical_to_phys(dstDevice), sphys = sim_logical_to_phys(srcDevice);
    if (dphys < 0 || sphys < 0)
        return sim_fail(SIM_E_INVALID_DEVICE, "peer copy: device %d does not exist", dphys < 0 ? dstDevice : srcDevice);
    if (n && sim_device_of(dst) != dphys)
        return sim_fail(SIM_E_INVALID_VALUE, "peer copy: the destination is not memory of device %d", dstDevice);
    if (n && sim_device_of(src) != sphys)
        return sim_fail(SIM_E_INVALID_VALUE, "peer copy: the source is not memory of device %d", srcDevice);
    return SIM_OK;
}

HIP_API hipError_t hipMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t sizeBytes)
{
    ENTER();
    sim_status st = check_peer(dst, dstDevice, src, srcDevice, sizeBytes);
    return ret(st != SIM_OK ? st : sim_memcpy_sync(dst, src, sizeBytes, SIM_D2D));
}

HIP_API hipError_t hipMemcpyPeerAsync(void *dst, int dstDeviceId, const void *src, int srcDevice, size_t sizeBytes,
                                      hipStream_t stream)
{
    ENTER();
    sim_status st = check_peer(dst, dstDeviceId, src, srcDevice, sizeBytes);
    return ret(st != SIM_OK ? st : sim_memcpy_async(dst, src, sizeBytes, SIM_D2D, stream));
}

HIP_API hipError_t hipMemset(void *dst, int value, size_t sizeBytes)
{
    ENTER();
    return ret(sim_memset_sync(dst, value, sizeBytes, 1));
}

HIP_API hipError_t hipMemsetAsync(void *dst, int value, size_t sizeBytes, hipStream_t stream)
{
    ENTER();
    return ret(sim_memset_async(dst, value, sizeBytes, 1, stream));
}

/* ---- streams -------------------------------------------------------------------- */

HIP_API hipError_t hipStreamCreate(hipStream_t *stream)
{
    ENTER();
    return ret(sim_stream_create((void **)stream));
}

HIP_API hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags)
{
    (void)flags; /* hipStreamNonBlocking: the simulator's null stream never blocks others anyway */
    return hipStreamCreate(stream);
}

HIP_API hipError_t hipStreamDestroy(hipStream_t stream)
{
    ENTER();
    return ret(sim_stream_destroy(stream));
}

HIP_API hipError_t hipStreamSynchronize(hipStream_t stream)
{
    ENTER();
    return ret(sim_stream_synchronize(stream));
}

HIP_API hipError_t hipStreamQuery(hipStream_t stream)
{
    ENTER();
    return ret(sim_stream_query(stream));
}

HIP_API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags)
{
    ENTER();
    if (flags != 0)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipStreamWaitEvent: flags must be 0"));
    return ret(sim_stream_wait_event(stream, event));
}

HIP_API hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData)
{
    ENTER();
    return ret(sim_enqueue_host_fn(stream, fn, userData));
}

/* ---- events --------------------------------------------------------------------- */

HIP_API hipError_t hipEventCreate(hipEvent_t *event)
{
    ENTER();
    return ret(sim_event_create((void **)event));
}

HIP_API hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags)
{
    (void)flags;
    return hipEventCreate(event);
}

HIP_API hipError_t hipEventDestroy(hipEvent_t event)
{
    ENTER();
    return ret(sim_event_destroy(event));
}

HIP_API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)
{
    ENTER();
    return ret(sim_event_record(event, stream));
}

HIP_API hipError_t hipEventSynchronize(hipEvent_t event)
{
    ENTER();
    return ret(sim_event_synchronize(event));
}

HIP_API hipError_t hipEventQuery(hipEvent_t event)
{
    ENTER();
    return ret(sim_event_query(event));
}

HIP_API hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop)
{
    ENTER();
    return ret(sim_event_elapsed(ms, start, stop));
}

/* ---- inter-process memory --------------------------------------------------------- */

HIP_API hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *devPtr)
{
    ENTER();
    if (!handle)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipIpcGetMemHandle: handle is NULL"));
    anychip_sim_ipc_handle h;
    sim_status st = sim_ipc_get_handle(devPtr, &h);
    if (st == SIM_OK)
        memcpy(handle->reserved, &h, sizeof h);
    return ret(st);
}

HIP_API hipError_t hipIpcOpenMemHandle(void **devPtr, hipIpcMemHandle_t handle, unsigned int flags)
{
    ENTER();
    (void)flags;
    anychip_sim_ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    return ret(sim_ipc_open(-1, &h, devPtr));
}

HIP_API hipError_t hipIpcCloseMemHandle(void *devPtr)
{
    ENTER();
    return ret(sim_ipc_close(devPtr));
}
