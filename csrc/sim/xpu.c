/*
 * Kunlun XPU runtime front end of the simulator (libkunlun_sim).
 *
 * Exports the xpu_* entry points declared in csrc/include/xpu/runtime.h, with the
 * runtime's argument orders and enums (XPUMemcpyKind: device-to-host 0, host-to-device
 * 1, device-to-device 2) and the XPUError_t codes of xpu/defs.h (XPU_ERRNO_BASE 700 + n),
 * returned as positive values, as Paddle's call sites compare them.
 *
 * The current device is a per-thread state and defaults to device 0 (the runtime guide);
 * xpu_device_list returns the physical numbers of the visible devices.
 *
 * The XPU runtime has no memset, no event timing and no memory-information call;
 * the simulator offers them under anychip-named extensions (anychip_sim_xpu_*), which
 * a program must treat as optional: they exist only in the simulator.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "core.h"
#include "xpu/runtime.h"

#define XPU_API SIM_EXPORT

#define XPU_MODEL_KL3 300 /* the board model the simulated devices report */

static pthread_once_t fe_once = PTHREAD_ONCE_INIT;

static void fe_init(void)
{
    sim_core_init(getenv("XPU_VISIBLE_DEVICES"), SIM_VIS_CUDA);
    sim_set_require_current(0); /* "device 0 when xpu_set_device was never called" */
}

#define ENTER() pthread_once(&fe_once, fe_init)
/* an entry that is one call of the simulator core: the front end set up, the status as XPU's */
#define CORE(call) (ENTER(), xpu_code(call))

static XPUError_t xpu_err(sim_status st)
{
    switch (st) {
    case SIM_OK: return XPU_SUCCESS;
    case SIM_E_INVALID_DEVICE: return XPUERR_INVALID_DEVICE;
    case SIM_E_NO_DEVICE:
    case SIM_E_NO_CONTEXT: return XPUERR_NODEV;
    case SIM_E_OUT_OF_MEMORY: return XPUERR_NOMEM;
    case SIM_E_HOST_ALLOC: return XPUERR_NOCPUMEM;
    case SIM_E_INVALID_VALUE:
    case SIM_E_BAD_FREE:
    case SIM_E_OUT_OF_RANGE:
    case SIM_E_DIRECTION:
    case SIM_E_NOT_RECORDED: return XPUERR_INVALID_PARAM;
    case SIM_E_INVALID_HANDLE: return XPUERR_INVALID_PARAM;   /* an event */
    case SIM_E_INVALID_STREAM: return XPUERR_USEAFCLOSE;      /* "use a stream after closed" */
    case SIM_E_NOT_READY:
    case SIM_E_BUSY: return XPUERR_BUSY;
    case SIM_E_TIMEOUT: return XPUERR_TIMEOUT;
    case SIM_E_ASYNC_FAULT: return XPUERR_DMAABORT;
    case SIM_E_NOT_SUPPORTED: return XPUERR_NOSUPPORT;
    default: return XPUERR_UNEXPECT;
    }
}

static int memcpy_dir(XPUMemcpyKind kind)
{
    switch (kind) {
    case XPU_DEVICE_TO_HOST: return SIM_D2H;
    case XPU_HOST_TO_DEVICE: return SIM_H2D;
    case XPU_DEVICE_TO_DEVICE: return SIM_D2D;
    default: return -1;
    }
}

/* ---- versions and devices ------------------------------------------------------ */

static int xpu_code(sim_status st) { return (int)xpu_err(st); }

XPU_API int xpu_get_driver_version(uint32_t *major, uint32_t *minor)
{
    ENTER();
    if (!major || !minor)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_get_driver_version: NULL argument"));
    *major = 4;   /* Paddle enables its XPU3 paths for driver major >= 4 */
    *minor = 0;
    return XPU_SUCCESS;
}

XPU_API int xpu_get_runtime_version(uint32_t *major, uint32_t *minor)
{
    ENTER();
    if (!major || !minor)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_get_runtime_version: NULL argument"));
    *major = 0;
    *minor = 1;
    return XPU_SUCCESS;
}

XPU_API int xpu_set_device(int devid) { return CORE(sim_set_current(devid)); }

XPU_API int xpu_current_device(int *devid)
{
    ENTER();
    if (!devid)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_current_device: devid is NULL"));
    return xpu_code(sim_current_logical(devid));
}

XPU_API int xpu_device_count(int *dev_count)
{
    ENTER();
    if (!dev_count)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_device_count: dev_count is NULL"));
    *dev_count = sim_visible_count();
    return XPU_SUCCESS;
}

XPU_API int xpu_device_list(int *dev_list)
{
    ENTER();
    if (!dev_list)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_device_list: dev_list is NULL"));
    for (int i = 0; i < sim_visible_count(); i++)
        dev_list[i] = sim_logical_to_phys(i);   /* the physical numbers, as the runtime returns */
    return XPU_SUCCESS;
}

XPU_API int xpu_device_get_attr(uint64_t *v, XPUDeviceAttr attr, int devid)
{
    ENTER();
    if (!v)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_device_get_attr: v is NULL"));
    int phys = sim_logical_to_phys(devid);
    if (phys < 0)
        return xpu_code(sim_fail(SIM_E_INVALID_DEVICE, "xpu_device_get_attr: device %d does not exist", devid));
    switch (attr) {
    case XPUATTR_PCI_ADDRESS: *v = (uint64_t)(phys + 1) << 8; return XPU_SUCCESS; /* 0000:0N:00.0 */
    case XPUATTR_DEVID: *v = (uint64_t)phys; return XPU_SUCCESS;
    case XPUATTR_BOARDID: *v = (uint64_t)phys; return XPU_SUCCESS;
    case XPUATTR_ONBOARDID: *v = 0; return XPU_SUCCESS;
    case XPUATTR_MODEL: *v = XPU_MODEL_KL3; return XPU_SUCCESS;
    case XPUATTR_MEM_MAIN_CAPACITY: *v = (uint64_t)sim_capacity(); return XPU_SUCCESS;
    case XPUATTR_MEM_L3_CAPACITY: *v = 0; return XPU_SUCCESS; /* no L3 in the simulator */
    case XPUATTR_NUM_CLUSTER: *v = 8; return XPU_SUCCESS;
    case XPUATTR_NUM_SDNN: *v = 8; return XPU_SUCCESS;
    default:
        return xpu_code(sim_fail(SIM_E_NOT_SUPPORTED, "xpu_device_get_attr: attribute %d is not simulated",
                                 (int)attr));
    }
}

/* ---- memory ------------------------------------------------------------------- */

XPU_API int xpu_malloc(void **pdevptr, uint64_t sz, XPUMemoryKind kind)
{
    ENTER();
    if (!pdevptr || sz == 0)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_malloc: %s", pdevptr ? "size is 0" : "pdevptr is NULL"));
    if (kind == XPU_MEM_L3)
        return xpu_code(sim_fail(SIM_E_NOT_SUPPORTED, "xpu_malloc: L3 memory is not simulated"));
    if (kind != XPU_MEM_MAIN)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_malloc: unknown XPUMemoryKind %d", (int)kind));
    return xpu_code(sim_malloc(SIM_CURRENT, (size_t)sz, pdevptr));
}

XPU_API int xpu_free(void *devptr)
{
    ENTER();
    if (!devptr)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_free: devptr is NULL"));
    return xpu_code(sim_free(devptr));
}

XPU_API int xpu_host_alloc(void **ptr, uint64_t sz, unsigned int flags)
{
    ENTER();
    if (!ptr || flags != 0)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_host_alloc: %s", ptr ? "flags must be 0" : "ptr is NULL"));
    return xpu_code(sim_host_alloc((size_t)sz, ptr));
}

XPU_API int xpu_host_free(void *ptr) { return CORE(sim_host_free(ptr)); }

XPU_API int xpu_memcpy(void *dst, const void *src, uint64_t sz, XPUMemcpyKind kind)
{
    ENTER();
    int dir = memcpy_dir(kind);
    if (dir < 0)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_memcpy: unknown XPUMemcpyKind %d", (int)kind));
    return xpu_code(sim_memcpy_sync(dst, src, (size_t)sz, dir));
}

XPU_API int xpu_memcpy_async(void *dst, const void *src, uint64_t sz, XPUMemcpyKind kind, XPUStream stream)
{
    ENTER();
    int dir = memcpy_dir(kind);
    if (dir < 0)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_memcpy_async: unknown XPUMemcpyKind %d", (int)kind));
    return xpu_code(sim_memcpy_async(dst, src, (size_t)sz, dir, stream));
}

XPU_API int xpu_memcpy_peer(int dst_device, void *dst_addr, int src_device, const void *src_addr, uint64_t sz)
{
    ENTER();
    int dphys = sim_logical_to_phys(dst_device), sphys = sim_logical_to_phys(src_device);
    if (dphys < 0 || sphys < 0)
        return xpu_code(sim_fail(SIM_E_INVALID_DEVICE, "xpu_memcpy_peer: device %d does not exist",
                                 dphys < 0 ? dst_device : src_device));
    if (sz && (sim_device_of(dst_addr) != dphys || sim_device_of(src_addr) != sphys))
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "xpu_memcpy_peer: %s address is not memory of device %d",
                                 sim_device_of(dst_addr) != dphys ? "destination" : "source",
                                 sim_device_of(dst_addr) != dphys ? dst_device : src_device));
    return xpu_code(sim_memcpy_sync(dst_addr, src_addr, (size_t)sz, SIM_D2D));
}

/* ---- streams and events ------------------------------------------------------- */

XPU_API int xpu_stream_create(XPUStream *pstream) { return CORE(sim_stream_create(pstream)); }
XPU_API int xpu_stream_destroy(XPUStream stream) { return CORE(sim_stream_destroy(stream)); }
XPU_API int xpu_wait(XPUStream stream) { return CORE(sim_stream_synchronize(stream)); }

XPU_API int xpu_stream_wait_event(XPUStream stream, XPUEvent event)
{
    return CORE(sim_stream_wait_event(stream, event));
}

XPU_API int xpu_event_create(XPUEvent *pevent) { return CORE(sim_event_create(pevent)); }
XPU_API int xpu_event_destroy(XPUEvent event) { return CORE(sim_event_destroy(event)); }
XPU_API int xpu_event_record(XPUEvent event, XPUStream stream) { return CORE(sim_event_record(event, stream)); }
XPU_API int xpu_event_wait(XPUEvent event) { return CORE(sim_event_synchronize(event)); }
XPU_API int xpu_event_query(XPUEvent event) { return CORE(sim_event_query(event)); }

/* ---- simulator-only extensions ------------------------------------------------ */

XPU_API int anychip_sim_xpu_memset_async(void *dst, int value, uint64_t sz, XPUStream stream)
{
    return CORE(sim_memset_async(dst, value, (size_t)sz, 1, stream));
}

XPU_API int anychip_sim_xpu_event_elapsed_time(float *ms, XPUEvent start, XPUEvent end)
{
    return CORE(sim_event_elapsed(ms, start, end));
}

XPU_API int anychip_sim_xpu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes)
{
    ENTER();
    if (!free_bytes || !total_bytes)
        return xpu_code(sim_fail(SIM_E_INVALID_VALUE, "anychip_sim_xpu_mem_info: NULL argument"));
    size_t f = 0, t = 0;
    sim_status st = sim_mem_info(SIM_CURRENT, &f, &t);
    *free_bytes = f;
    *total_bytes = t;
    return xpu_code(st);
}
