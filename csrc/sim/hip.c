/*
 * HIP front end of the simulator (libhygon_sim), standing in for libamdhip64.so /
 * Hygon DTK's libgalaxyhip.so.
 *
 * Exports the HIP runtime entry points declared in csrc/include/hip/hip_runtime_api.h
 * (ROCm's names, argument orders, hipMemcpyKind values, hipError_t codes and HIP 6's
 * hipDeviceProp_tR0600). Behaviour follows ROCm clr (see docs/simulator.md):
 * HIP_VISIBLE_DEVICES, or CUDA_VISIBLE_DEVICES when it is unset or empty, selects
 * devices in list order (rocdevice.cpp's rule); hipFree waits for the device's streams
 * and returns hipErrorInvalidValue for a pointer that is not an allocation; a memcpy
 * kind is only range-checked, the pointers give the direction; elapsed time with an
 * event created with hipEventDisableTiming is hipErrorInvalidHandle.
 *
 * The null stream is clr's legacy null stream (hip_context.cpp / hip_device.cpp
 * WaitActiveStreams): work enqueued on it, hipStreamSynchronize(0) and hipStreamQuery(0)
 * first wait for the work queued so far on the device's blocking streams (hipStreamCreate,
 * hipStreamCreateWithFlags(hipStreamDefault)), work enqueued on a blocking stream first
 * waits for the work queued so far on the null stream, and the synchronous copies and
 * memsets (hipMemcpy, hipMemcpyPeer, hipMemset) wait for both. Streams made with
 * hipStreamNonBlocking are exempt from all of it.
 *
 * Deviation: hipStreamLegacy and hipStreamPerThread name the null stream (clr gives each
 * thread its own per-thread stream).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip/hip_runtime_api.h"
#include "internal.h"

#define HIP_API SIM_EXPORT

/* What a simulated device reports: a gfx906-class DCU (Hygon's DCUs are gfx906
 * derivatives) with the simulator's memory capacity. */
#define SIM_DEVICE_NAME "Hygon DCU (anychip simulator)"
#define SIM_CU_COUNT 64
#define SIM_WARP_SIZE 64
#define SIM_CLOCK_KHZ 1500000
#define SIM_MEM_CLOCK_KHZ 1000000
#define SIM_L2_BYTES (4 * 1024 * 1024)
#define SIM_LDS_BYTES 65536

_Static_assert(sizeof(anychip_sim_ipc_handle) == HIP_IPC_HANDLE_SIZE, "IPC handle must fit hipIpcMemHandle_t");

static pthread_once_t fe_once = PTHREAD_ONCE_INIT;
static __thread hipError_t t_last = hipSuccess;
static unsigned char peer_enabled[SIM_MAX_DEVICES][SIM_MAX_DEVICES];
static pthread_mutex_t peer_lock = PTHREAD_MUTEX_INITIALIZER;

static void fe_init(void)
{
    const char *vis = getenv("HIP_VISIBLE_DEVICES");
    if (!vis || !*vis)
        vis = getenv("CUDA_VISIBLE_DEVICES");
    sim_core_init(vis && *vis ? vis : NULL, SIM_VIS_HIP);
    sim_set_require_current(0);
    sim_set_legacy_null_stream(1);
}

#define ENTER() pthread_once(&fe_once, fe_init)
/* an entry that is one call of the simulator core: the front end set up, the status as HIP's */
#define CORE(call) (ENTER(), ret(call))

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

/* hipStreamLegacy and hipStreamPerThread: the current device's null stream */
static void *S(hipStream_t stream)
{
    return stream == hipStreamLegacy || stream == hipStreamPerThread ? NULL : (void *)stream;
}

/* clr's legacy null stream: a synchronous copy first waits for the current device's blocking streams */
static sim_status wait_blocking_streams(void)
{
    int phys;
    sim_status st = sim_current_phys(&phys);
    return st != SIM_OK ? st : sim_device_drain_blocking(phys);
}

/* clr checks only that the kind is one of hipMemcpyKind's values; the copy goes where
 * the pointers say (hip_memory.cpp) */
static int memcpy_dir(hipMemcpyKind kind)
{
    return (unsigned)kind <= hipMemcpyDefault ? SIM_DEFAULT : -1;
}

/* A pointer the kind calls device memory that is not: it must at least be mapped host
 * memory, so a stale device pointer (a closed IPC mapping) is an error, not a crash. */
static sim_status check_claimed(const void *dst, const void *src, size_t n, hipMemcpyKind kind)
{
    int src_dev = kind == hipMemcpyDeviceToHost || kind == hipMemcpyDeviceToDevice;
    int dst_dev = kind == hipMemcpyHostToDevice || kind == hipMemcpyDeviceToDevice;
    if (n && src_dev && src && sim_device_of(src) < 0 && !sim_host_mapped(src, n))
        return sim_fail(SIM_E_OUT_OF_RANGE, "the source %p is neither device memory nor mapped host memory", src);
    if (n && dst_dev && dst && sim_device_of(dst) < 0 && !sim_host_mapped(dst, n))
        return sim_fail(SIM_E_OUT_OF_RANGE, "the destination %p is neither device memory nor mapped host memory", dst);
    return SIM_OK;
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
    case hipErrorContextIsDestroyed: return "hipErrorContextIsDestroyed";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    case hipErrorUnknown: return "hipErrorUnknown";
    default: break;
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
    case hipErrorContextIsDestroyed: return "context is destroyed";
    case hipErrorNotSupported: return "operation not supported";
    case hipErrorUnknown: return "unknown error";
    default: break;
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
    *runtimeVersion = HIP_VERSION; /* reports itself as a HIP 6.0 runtime */
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

HIP_API hipError_t hipSetDevice(int deviceId) { return CORE(sim_set_current(deviceId)); }

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
    const char *n = SIM_DEVICE_NAME;
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

static void fill_props(hipDeviceProp_tR0600 *p, int logical, int phys)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", SIM_DEVICE_NAME);
    snprintf(p->gcnArchName, sizeof p->gcnArchName, "gfx906:sramecc+:xnack-");
    for (int i = 0; i < 16; i++)
        p->uuid.bytes[i] = (char)(i == 15 ? phys : 0x5a);
    p->totalGlobalMem = sim_capacity();
    p->sharedMemPerBlock = SIM_LDS_BYTES;
    p->regsPerBlock = 65536;
    p->warpSize = SIM_WARP_SIZE;
    p->memPitch = (size_t)INT32_MAX;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = p->maxThreadsDim[2] = 1024;
    p->maxGridSize[0] = INT32_MAX;
    p->maxGridSize[1] = p->maxGridSize[2] = 65536;
    p->clockRate = SIM_CLOCK_KHZ;
    p->totalConstMem = sim_capacity() < (size_t)INT32_MAX ? sim_capacity() : (size_t)INT32_MAX;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 256;
    p->texturePitchAlignment = 256;
    p->deviceOverlap = 1;
    p->multiProcessorCount = SIM_CU_COUNT;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->pciBusID = phys + 1;
    p->pciDeviceID = 0;
    p->pciDomainID = 0;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryClockRate = SIM_MEM_CLOCK_KHZ;
    p->memoryBusWidth = 4096;
    p->l2CacheSize = SIM_L2_BYTES;
    p->maxThreadsPerMultiProcessor = 2560;
    p->sharedMemPerMultiprocessor = SIM_LDS_BYTES;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->isMultiGpuBoard = 0;
    p->multiGpuBoardGroupID = logical;
    p->cooperativeLaunch = 1;
    p->cooperativeMultiDeviceLaunch = 1;
    p->sharedMemPerBlockOptin = SIM_LDS_BYTES;
    p->maxBlocksPerMultiProcessor = 32;
    p->hostRegisterSupported = 1;
    p->memoryPoolsSupported = 0;
    p->maxSharedMemoryPerMultiProcessor = SIM_LDS_BYTES;
    p->clockInstructionRate = 100000;
    p->arch.hasGlobalInt32Atomics = p->arch.hasSharedInt32Atomics = 1;
    p->arch.hasGlobalInt64Atomics = p->arch.hasSharedInt64Atomics = 1;
    p->arch.hasDoubles = p->arch.hasWarpVote = p->arch.hasWarpBallot = p->arch.hasWarpShuffle = 1;
    p->arch.hasFloatAtomicAdd = p->arch.has3dGrid = 1;
    p->isLargeBar = 1;
}

HIP_API hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *prop, int deviceId)
{
    ENTER();
    if (!prop)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipGetDeviceProperties: prop is NULL"));
    int phys = sim_logical_to_phys(deviceId);
    if (phys < 0)
        return ret(sim_fail(SIM_E_INVALID_DEVICE, "hipGetDeviceProperties: device %d does not exist", deviceId));
    fill_props(prop, deviceId, phys);
    return hipSuccess;
}

/* the common attributes, from the same values as hipGetDeviceProperties */
static int attribute(const hipDeviceProp_tR0600 *p, hipDeviceAttribute_t attr, int *v)
{
    switch (attr) {
    case hipDeviceAttributeMaxThreadsPerBlock: *v = p->maxThreadsPerBlock; return 1;
    case hipDeviceAttributeMaxBlockDimX: *v = p->maxThreadsDim[0]; return 1;
    case hipDeviceAttributeMaxBlockDimY: *v = p->maxThreadsDim[1]; return 1;
    case hipDeviceAttributeMaxBlockDimZ: *v = p->maxThreadsDim[2]; return 1;
    case hipDeviceAttributeMaxGridDimX: *v = p->maxGridSize[0]; return 1;
    case hipDeviceAttributeMaxGridDimY: *v = p->maxGridSize[1]; return 1;
    case hipDeviceAttributeMaxGridDimZ: *v = p->maxGridSize[2]; return 1;
    case hipDeviceAttributeMaxSharedMemoryPerBlock: *v = (int)p->sharedMemPerBlock; return 1;
    case hipDeviceAttributeSharedMemPerBlockOptin: *v = (int)p->sharedMemPerBlockOptin; return 1;
    case hipDeviceAttributeSharedMemPerMultiprocessor: *v = (int)p->sharedMemPerMultiprocessor; return 1;
    case hipDeviceAttributeMaxSharedMemoryPerMultiprocessor: *v = (int)p->maxSharedMemoryPerMultiProcessor; return 1;
    case hipDeviceAttributeTotalConstantMemory: *v = (int)p->totalConstMem; return 1;
    case hipDeviceAttributeWarpSize: *v = p->warpSize; return 1;
    case hipDeviceAttributeMaxRegistersPerBlock: *v = p->regsPerBlock; return 1;
    case hipDeviceAttributeMaxRegistersPerMultiprocessor: *v = p->regsPerMultiprocessor; return 1;
    case hipDeviceAttributeClockRate: *v = p->clockRate; return 1;
    case hipDeviceAttributeMemoryClockRate: *v = p->memoryClockRate; return 1;
    case hipDeviceAttributeMemoryBusWidth: *v = p->memoryBusWidth; return 1;
    case hipDeviceAttributeMultiprocessorCount: *v = p->multiProcessorCount; return 1;
    case hipDeviceAttributeComputeCapabilityMajor: *v = p->major; return 1;
    case hipDeviceAttributeComputeCapabilityMinor: *v = p->minor; return 1;
    case hipDeviceAttributeL2CacheSize: *v = p->l2CacheSize; return 1;
    case hipDeviceAttributeMaxThreadsPerMultiProcessor: *v = p->maxThreadsPerMultiProcessor; return 1;
    case hipDeviceAttributeMaxBlocksPerMultiProcessor: *v = p->maxBlocksPerMultiProcessor; return 1;
    case hipDeviceAttributeConcurrentKernels: *v = p->concurrentKernels; return 1;
    case hipDeviceAttributeAsyncEngineCount: *v = p->asyncEngineCount; return 1;
    case hipDeviceAttributeCanMapHostMemory: *v = p->canMapHostMemory; return 1;
    case hipDeviceAttributeUnifiedAddressing: *v = p->unifiedAddressing; return 1;
    case hipDeviceAttributeManagedMemory: *v = p->managedMemory; return 1;
    case hipDeviceAttributeIntegrated: *v = p->integrated; return 1;
    case hipDeviceAttributeEccEnabled: *v = p->ECCEnabled; return 1;
    case hipDeviceAttributeComputeMode: *v = p->computeMode; return 1;
    case hipDeviceAttributeCooperativeLaunch: *v = p->cooperativeLaunch; return 1;
    case hipDeviceAttributeCooperativeMultiDeviceLaunch: *v = p->cooperativeMultiDeviceLaunch; return 1;
    case hipDeviceAttributePciBusId: *v = p->pciBusID; return 1;
    case hipDeviceAttributePciDeviceId: *v = p->pciDeviceID; return 1;
    case hipDeviceAttributePciDomainID: *v = p->pciDomainID; return 1;
    case hipDeviceAttributeIsMultiGpuBoard: *v = p->isMultiGpuBoard; return 1;
    case hipDeviceAttributeMultiGpuBoardGroupID: *v = p->multiGpuBoardGroupID; return 1;
    case hipDeviceAttributeHostRegisterSupported: *v = p->hostRegisterSupported; return 1;
    case hipDeviceAttributeMemoryPoolsSupported: *v = p->memoryPoolsSupported; return 1;
    case hipDeviceAttributeClockInstructionRate: *v = p->clockInstructionRate; return 1;
    case hipDeviceAttributeIsLargeBar: *v = p->isLargeBar; return 1;
    case hipDeviceAttributeAsicRevision: *v = p->asicRevision; return 1;
    case hipDeviceAttributeTextureAlignment: *v = (int)p->textureAlignment; return 1;
    case hipDeviceAttributeTexturePitchAlignment: *v = (int)p->texturePitchAlignment; return 1;
    case hipDeviceAttributeMaxPitch: *v = (int)p->memPitch; return 1;
    case hipDeviceAttributeDeviceOverlap: *v = p->deviceOverlap; return 1;
    case hipDeviceAttributeKernelExecTimeout: *v = p->kernelExecTimeoutEnabled; return 1;
    case hipDeviceAttributePhysicalMultiProcessorCount: *v = p->multiProcessorCount; return 1;
    default: return 0;
    }
}

HIP_API hipError_t hipDeviceGetAttribute(int *pi, hipDeviceAttribute_t attr, int deviceId)
{
    ENTER();
    if (!pi)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipDeviceGetAttribute: pi is NULL"));
    int phys = sim_logical_to_phys(deviceId);
    if (phys < 0)
        return ret(sim_fail(SIM_E_INVALID_DEVICE, "hipDeviceGetAttribute: device %d does not exist", deviceId));
    hipDeviceProp_tR0600 p;
    fill_props(&p, deviceId, phys);
    if (!attribute(&p, attr, pi))
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipDeviceGetAttribute: attribute %d is not simulated", (int)attr));
    return hipSuccess;
}

HIP_API hipError_t hipDeviceSynchronize(void) { return CORE(sim_device_synchronize(SIM_CURRENT)); }

HIP_API hipError_t hipDeviceCanAccessPeer(int *canAccessPeer, int deviceId, int peerDeviceId)
{
    return CORE(sim_can_access_peer(canAccessPeer, deviceId, peerDeviceId, "hipDeviceCanAccessPeer"));
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

static sim_status pool_forget(void *ptr);

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
    int dev = sim_device_of(ptr);
    if (dev >= 0 && dev < sim_physical_count())
        sim_device_drain(dev);          /* clr synchronizes the streams of the memory's device first */
    pool_forget(ptr);                   /* hipFree also takes memory of hipMallocAsync */
    sim_status st = sim_free(ptr);
    return ret(st == SIM_E_BAD_FREE ? SIM_E_INVALID_VALUE : st);
}

static sim_status host_alloc(void **ptr, size_t size, unsigned int flags, const char *fn)
{
    if (!ptr)
        return sim_fail(SIM_E_INVALID_VALUE, "%s: ptr is NULL", fn);
    if ((flags & hipHostMallocCoherent) && (flags & hipHostMallocNonCoherent))
        return sim_fail(SIM_E_INVALID_VALUE, "%s: hipHostMallocCoherent and hipHostMallocNonCoherent exclude "
                        "each other", fn);
    if (size == 0) {
        *ptr = NULL;
        return SIM_OK;
    }
    return sim_host_alloc(size, ptr);
}

HIP_API hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags)
{
    return CORE(host_alloc(ptr, size, flags, "hipHostMalloc"));
}

HIP_API hipError_t hipExtHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    return CORE(host_alloc(ptr, size, flags, "hipExtHostAlloc"));
}

HIP_API hipError_t hipHostFree(void *ptr)
{
    ENTER();
    if (!ptr)
        return hipSuccess;
    sim_status st = sim_host_free(ptr);
    return st == SIM_E_BAD_FREE ? ret(SIM_E_INVALID_VALUE) : ret(st);
}

HIP_API hipError_t hipFreeHost(void *ptr) { return hipHostFree(ptr); }

/* ---- stream-ordered allocation ------------------------------------------------------ */

/* One pool per device (its default pool; hipMemPoolCreate is not provided). Memory
 * comes from the device arena when hipMallocAsync is called (ready before any later
 * work of the stream) and goes back when the stream reaches hipFreeAsync, so the pool
 * keeps nothing in reserve: reserved and used memory are the same. */
struct ihipMemPoolHandle_t {
    int phys;
    int ready;                          /* handed out by a hipDevice*MemPool call */
    uint64_t release_threshold;
    int reuse[3];                       /* the three hipMemPoolReuse* switches */
    uint64_t used, used_high, reserved_high;
};

static struct ihipMemPoolHandle_t pools[SIM_MAX_DEVICES];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static ptr_map pool_allocs;             /* address -> size of a live pool allocation (+1 so never 0) */

static struct ihipMemPoolHandle_t *pool_of(int phys)
{
    struct ihipMemPoolHandle_t *p = &pools[phys];
    pthread_mutex_lock(&pool_lock);
    if (!p->ready) {
        p->phys = phys;
        p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;     /* each is on by default */
        p->ready = 1;
    }
    pthread_mutex_unlock(&pool_lock);
    return p;
}

static sim_status check_pool(hipMemPool_t pool, const char *fn)
{
    if (!pool)
        return sim_fail(SIM_E_INVALID_VALUE, "%s: the memory pool is NULL", fn);
    for (int i = 0; i < SIM_MAX_DEVICES; i++)
        if (pool == &pools[i] && pools[i].ready)
            return SIM_OK;
    return sim_fail(SIM_E_INVALID_VALUE, "%s: %p is not a memory pool (the simulator has one default pool per "
                    "device, from hipDeviceGetDefaultMemPool)", fn, (void *)pool);
}

static sim_status device_pool(int device, hipMemPool_t *out, const char *fn)
{
    if (!out)
        return sim_fail(SIM_E_INVALID_VALUE, "%s: mem_pool is NULL", fn);
    int phys = sim_logical_to_phys(device);
    if (phys < 0)
        return sim_fail(SIM_E_INVALID_DEVICE, "%s: device %d does not exist (%d visible)", fn, device,
                        sim_visible_count());
    *out = pool_of(phys);
    return SIM_OK;
}

HIP_API hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t *mem_pool, int device)
{
    return CORE(device_pool(device, mem_pool, "hipDeviceGetDefaultMemPool"));
}

HIP_API hipError_t hipDeviceGetMemPool(hipMemPool_t *mem_pool, int device)
{
    return CORE(device_pool(device, mem_pool, "hipDeviceGetMemPool"));
}

HIP_API hipError_t hipDeviceSetMemPool(int device, hipMemPool_t mem_pool)
{
    ENTER();
    hipMemPool_t own = NULL;
    sim_status st = device_pool(device, &own, "hipDeviceSetMemPool");
    if (st == SIM_OK)
        st = check_pool(mem_pool, "hipDeviceSetMemPool");
    if (st == SIM_OK && mem_pool != own)
        st = sim_fail(SIM_E_INVALID_VALUE, "hipDeviceSetMemPool: the pool belongs to device %d, not device %d",
                      sim_phys_to_logical(mem_pool->phys), device);
    return ret(st);
}

static sim_status pool_malloc(void **dev_ptr, size_t size, struct ihipMemPoolHandle_t *pool, hipStream_t stream,
                              const char *fn)
{
    if (!dev_ptr)
        return sim_fail(SIM_E_INVALID_VALUE, "%s: dev_ptr is NULL", fn);
    if (size == 0)
        return sim_fail(SIM_E_INVALID_VALUE, "%s: size is 0", fn);
    sim_stream *s;
    sim_status st = sim_stream_get(S(stream), &s);
    if (st != SIM_OK)
        return st;
    int phys = s->dev;
    sim_stream_put(s);
    if (!pool)
        pool = pool_of(phys);
    else if (pool->phys != phys)
        return sim_fail(SIM_E_INVALID_VALUE, "%s: the pool is device %d's; the stream is on device %d", fn,
                        sim_phys_to_logical(pool->phys), sim_phys_to_logical(phys));
    void *p;
    if ((st = sim_malloc(phys, size, &p)) != SIM_OK)
        return st;
    pthread_mutex_lock(&pool_lock);
    int rc = map_put(&pool_allocs, (uint64_t)(uintptr_t)p, (void *)(uintptr_t)(size + 1));
    if (rc == 0) {
        pool->used += size;
        if (pool->used > pool->used_high)
            pool->used_high = pool->used;
        if (pool->used > pool->reserved_high)
            pool->reserved_high = pool->used;
    }
    pthread_mutex_unlock(&pool_lock);
    if (rc != 0) {
        sim_free(p);
        return sim_fail(SIM_E_HOST_ALLOC, "%s: out of host memory", fn);
    }
    *dev_ptr = p;
    return SIM_OK;
}

/* Forget a pool allocation (SIM_OK) or say it is none. */
static sim_status pool_forget(void *ptr)
{
    pthread_mutex_lock(&pool_lock);
    uintptr_t v = (uintptr_t)map_del(&pool_allocs, (uint64_t)(uintptr_t)ptr);
    if (v) {
        int dev = sim_device_of(ptr);
        if (dev >= 0)
            pools[dev].used -= (uint64_t)(v - 1);
    }
    pthread_mutex_unlock(&pool_lock);
    return v ? SIM_OK : SIM_E_INVALID_VALUE;
}

HIP_API hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream)
{
    return CORE(pool_malloc(dev_ptr, size, NULL, stream, "hipMallocAsync"));
}

HIP_API hipError_t hipMallocFromPoolAsync(void **dev_ptr, size_t size, hipMemPool_t mem_pool, hipStream_t stream)
{
    ENTER();
    sim_status st = check_pool(mem_pool, "hipMallocFromPoolAsync");
    return ret(st != SIM_OK ? st : pool_malloc(dev_ptr, size, mem_pool, stream, "hipMallocFromPoolAsync"));
}

static void free_when_reached(void *ptr) { sim_free(ptr); }

HIP_API hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream)
{
    ENTER();
    if (!dev_ptr)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipFreeAsync: dev_ptr is NULL"));
    sim_stream *s;
    sim_status st = sim_stream_get(S(stream), &s);
    if (st != SIM_OK)
        return ret(st);
    sim_stream_put(s);
    if (pool_forget(dev_ptr) != SIM_OK)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipFreeAsync: %p is not a live allocation of hipMallocAsync / "
                            "hipMallocFromPoolAsync (freed already, or from another allocator)", dev_ptr));
    st = sim_enqueue_host_fn(S(stream), free_when_reached, dev_ptr);
    if (st != SIM_OK)
        sim_free(dev_ptr);              /* not enqueued: nothing of the stream can still use it */
    return ret(st);
}

/* `fn`'s checks of a pool attribute call; on SIM_OK pool_lock is held */
static sim_status pool_attribute_begin(hipMemPool_t mem_pool, const void *value, const char *fn)
{
    ENTER();
    sim_status st = check_pool(mem_pool, fn);
    if (st == SIM_OK && !value)
        st = sim_fail(SIM_E_INVALID_VALUE, "%s: value is NULL", fn);
    if (st == SIM_OK)
        pthread_mutex_lock(&pool_lock);
    return st;
}

HIP_API hipError_t hipMemPoolSetAttribute(hipMemPool_t mem_pool, hipMemPoolAttr attr, void *value)
{
    sim_status st = pool_attribute_begin(mem_pool, value, "hipMemPoolSetAttribute");
    if (st != SIM_OK)
        return ret(st);
    switch (attr) {
    case hipMemPoolReuseFollowEventDependencies:
    case hipMemPoolReuseAllowOpportunistic:
    case hipMemPoolReuseAllowInternalDependencies:
        mem_pool->reuse[attr - 1] = *(const int *)value != 0;
        break;
    case hipMemPoolAttrReleaseThreshold: mem_pool->release_threshold = *(const uint64_t *)value; break;
    case hipMemPoolAttrReservedMemHigh:
    case hipMemPoolAttrUsedMemHigh:
        if (*(const uint64_t *)value != 0)
            st = sim_fail(SIM_E_INVALID_VALUE, "hipMemPoolSetAttribute: a high watermark can only be reset (to 0)");
        else if (attr == hipMemPoolAttrUsedMemHigh)
            mem_pool->used_high = mem_pool->used;
        else
            mem_pool->reserved_high = mem_pool->used;
        break;
    default:
        st = sim_fail(SIM_E_INVALID_VALUE, "hipMemPoolSetAttribute: attribute %d cannot be set", (int)attr);
    }
    pthread_mutex_unlock(&pool_lock);
    return ret(st);
}

HIP_API hipError_t hipMemPoolGetAttribute(hipMemPool_t mem_pool, hipMemPoolAttr attr, void *value)
{
    sim_status st = pool_attribute_begin(mem_pool, value, "hipMemPoolGetAttribute");
    if (st != SIM_OK)
        return ret(st);
    switch (attr) {
    case hipMemPoolReuseFollowEventDependencies:
    case hipMemPoolReuseAllowOpportunistic:
    case hipMemPoolReuseAllowInternalDependencies: *(int *)value = mem_pool->reuse[attr - 1]; break;
    case hipMemPoolAttrReleaseThreshold: *(uint64_t *)value = mem_pool->release_threshold; break;
    case hipMemPoolAttrReservedMemCurrent:
    case hipMemPoolAttrUsedMemCurrent: *(uint64_t *)value = mem_pool->used; break;
    case hipMemPoolAttrReservedMemHigh: *(uint64_t *)value = mem_pool->reserved_high; break;
    case hipMemPoolAttrUsedMemHigh: *(uint64_t *)value = mem_pool->used_high; break;
    default: st = sim_fail(SIM_E_INVALID_VALUE, "hipMemPoolGetAttribute: unknown attribute %d", (int)attr);
    }
    pthread_mutex_unlock(&pool_lock);
    return ret(st);
}

HIP_API hipError_t hipMemPoolTrimTo(hipMemPool_t mem_pool, size_t min_bytes_to_hold)
{
    ENTER();
    (void)min_bytes_to_hold;            /* the pool holds nothing back: nothing to trim */
    return ret(check_pool(mem_pool, "hipMemPoolTrimTo"));
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
    sim_status st = check_claimed(dst, src, sizeBytes, kind);
    if (st == SIM_OK)
        st = wait_blocking_streams();
    return ret(st != SIM_OK ? st : sim_memcpy_sync(dst, src, sizeBytes, dir));
}

HIP_API hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                                  hipStream_t stream)
{
    ENTER();
    int dir = memcpy_dir(kind);
    if (dir < 0)
        return ret(sim_fail(SIM_E_DIRECTION, "hipMemcpyAsync: unknown hipMemcpyKind %d", (int)kind));
    sim_status st = check_claimed(dst, src, sizeBytes, kind);
    return ret(st != SIM_OK ? st : sim_memcpy_async(dst, src, sizeBytes, dir, S(stream)));
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

HIP_API hipError_t hipMemcpyPeer(void *dst, int dstDeviceId, const void *src, int srcDeviceId, size_t sizeBytes)
{
    ENTER();
    sim_status st = check_peer(dst, dstDeviceId, src, srcDeviceId, sizeBytes);
    if (st == SIM_OK)
        st = wait_blocking_streams();
    return ret(st != SIM_OK ? st : sim_memcpy_sync(dst, src, sizeBytes, SIM_D2D));
}

HIP_API hipError_t hipMemcpyPeerAsync(void *dst, int dstDeviceId, const void *src, int srcDevice, size_t sizeBytes,
                                      hipStream_t stream)
{
    ENTER();
    sim_status st = check_peer(dst, dstDeviceId, src, srcDevice, sizeBytes);
    return ret(st != SIM_OK ? st : sim_memcpy_async(dst, src, sizeBytes, SIM_D2D, S(stream)));
}

HIP_API hipError_t hipMemset(void *dst, int value, size_t sizeBytes)
{
    ENTER();
    sim_status st = wait_blocking_streams();
    return ret(st != SIM_OK ? st : sim_memset_sync(dst, value, sizeBytes, 1));
}

HIP_API hipError_t hipMemsetAsync(void *dst, int value, size_t sizeBytes, hipStream_t stream)
{
    return CORE(sim_memset_async(dst, value, sizeBytes, 1, S(stream)));
}

/* ---- streams -------------------------------------------------------------------- */

HIP_API hipError_t hipStreamCreate(hipStream_t *stream) { return CORE(sim_stream_create((void **)stream)); }

HIP_API hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags)
{
    ENTER();
    if (flags & ~(unsigned)hipStreamNonBlocking)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipStreamCreateWithFlags: unknown flags 0x%x "
                            "(hipStreamDefault 0, hipStreamNonBlocking 1)", flags));
    sim_status st = sim_stream_create((void **)stream);
    if (st == SIM_OK && (flags & hipStreamNonBlocking) && (st = sim_stream_set_nonblocking(*stream)) != SIM_OK)
        sim_stream_destroy(*stream);
    return ret(st);
}

HIP_API hipError_t hipStreamDestroy(hipStream_t stream)
{
    ENTER();
    if (!stream || stream == hipStreamLegacy || stream == hipStreamPerThread)
        return ret(sim_fail(SIM_E_INVALID_STREAM, "hipStreamDestroy: the null stream cannot be destroyed"));
    sim_status st = sim_stream_destroy(stream);
    if (st == SIM_E_INVALID_STREAM) {       /* clr: a handle that is not a live stream */
        t_last = hipErrorContextIsDestroyed;
        return hipErrorContextIsDestroyed;
    }
    return ret(st);
}

HIP_API hipError_t hipStreamSynchronize(hipStream_t stream)
{
    ENTER();
    void *s = S(stream);
    sim_status st = sim_stream_synchronize(s);
    int queued = 0;
    /* clr: the null stream also waits for the blocking streams; joined after its own work,
     * so that a copy just queued still runs on this thread */
    if (st == SIM_OK && !s && (st = sim_stream_join_blocking(NULL, &queued)) == SIM_OK && queued)
        st = sim_stream_synchronize(NULL);
    return ret(st);
}

HIP_API hipError_t hipStreamQuery(hipStream_t stream)
{
    ENTER();
    void *s = S(stream);
    sim_status st = sim_stream_query(s);
    int queued = 0;
    if (st == SIM_OK && !s && (st = sim_stream_join_blocking(NULL, &queued)) == SIM_OK && queued)
        st = sim_stream_query(NULL);
    return ret(st);
}

HIP_API hipError_t hipStreamGetFlags(hipStream_t stream, unsigned int *flags)
{
    ENTER();
    if (!flags)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipStreamGetFlags: flags is NULL"));
    int nonblocking = 0;
    sim_status st = sim_stream_nonblocking(S(stream), &nonblocking);
    if (st == SIM_OK)
        *flags = nonblocking ? hipStreamNonBlocking : hipStreamDefault;
    return ret(st);
}

HIP_API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags)
{
    ENTER();
    if (flags != 0)
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipStreamWaitEvent: flags must be 0"));
    return ret(sim_stream_wait_event(S(stream), event));
}

HIP_API hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData)
{
    return CORE(sim_enqueue_host_fn(S(stream), fn, userData));
}

/* ---- events --------------------------------------------------------------------- */

HIP_API hipError_t hipEventCreate(hipEvent_t *event) { return CORE(sim_event_create((void **)event)); }

HIP_API hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags)
{
    ENTER();
    if (flags & ~(unsigned)(hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess))
        return ret(sim_fail(SIM_E_INVALID_VALUE, "hipEventCreateWithFlags: unknown flags 0x%x", flags));
    return ret(sim_event_create_flags((void **)event, (flags & hipEventDisableTiming) != 0));
}

HIP_API hipError_t hipEventDestroy(hipEvent_t event) { return CORE(sim_event_destroy(event)); }

HIP_API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)
{
    return CORE(sim_event_record(event, S(stream)));
}

HIP_API hipError_t hipEventSynchronize(hipEvent_t event) { return CORE(sim_event_synchronize(event)); }
HIP_API hipError_t hipEventQuery(hipEvent_t event) { return CORE(sim_event_query(event)); }

HIP_API hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop)
{
    return CORE(sim_event_elapsed(ms, start, stop));
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

HIP_API hipError_t hipIpcCloseMemHandle(void *devPtr) { return CORE(sim_ipc_close(devPtr)); }
