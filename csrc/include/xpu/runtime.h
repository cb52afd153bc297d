/*
 * The Kunlun XPU runtime C API (libxpurt.so): the part the anychip simulator
 * (libkunlun_sim) implements, with the names, argument orders and enum values of the
 * XPU runtime's xpu/runtime.h and the XPUError_t codes of xpu/defs.h. defs.h beside it
 * forwards here.
 *
 * Every call returns 0 (XPU_SUCCESS) or a positive XPUError_t code (see
 * docs/simulator.md on the sign). xpu_memcpy_async and xpu_event_query are not in the
 * public runtime.h; their argument orders follow their call sites.
 *
 * The text between the ANYCHIP-CDEF markers is also read by anychip's Python backend
 * as its cffi declarations: only typedefs, enums, prototypes and "#define NAME number"
 * lines go there.
 */
#ifndef ANYCHIP_XPU_RUNTIME_H
#define ANYCHIP_XPU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ANYCHIP-CDEF-BEGIN */
typedef void *XPUStream;
typedef void *XPUEvent;

typedef enum {
    XPU_MEM_HBM = 0,
    XPU_MEM_MAIN = 0,
    XPU_MEM_L3 = 1
} XPUMemoryKind;

typedef enum {
    XPU_DEVICE_TO_HOST = 0,
    XPU_HOST_TO_DEVICE = 1,
    XPU_DEVICE_TO_DEVICE = 2
} XPUMemcpyKind;

typedef enum {
    XPUATTR_PCI_ADDRESS = 0,
    XPUATTR_DEVID = 1,
    XPUATTR_BOARDID = 2,
    XPUATTR_ONBOARDID = 3,
    XPUATTR_MODEL = 4,
    XPUATTR_MEM_MAIN_CAPACITY = 5,
    XPUATTR_MEM_L3_CAPACITY = 6,
    XPUATTR_NUM_CLUSTER = 7,
    XPUATTR_NUM_SDNN = 8,
    XPUATTR_NUM_DMACH = 9,
    XPUATTR_NUM_HWQ = 10,
    XPUATTR_NUM_ENC = 11,
    XPUATTR_NUM_DEC = 12,
    XPUATTR_NUM_IMGPROC = 13
} XPUDeviceAttr;

/* xpu/defs.h: XPU_ERRNO_BASE 700 + n */
typedef enum {
    XPU_SUCCESS = 0,
    XPUERR_INVALID_DEVICE = 701,
    XPUERR_UNINIT = 702,
    XPUERR_NODEV = 703,
    XPUERR_VERSION = 704,
    XPUERR_NOMEM = 705,
    XPUERR_NOCPUMEM = 706,
    XPUERR_INVALID_PARAM = 707,
    XPUERR_NOXPUFUNC = 708,
    XPUERR_LDSO = 709,
    XPUERR_LDSYM = 710,
    XPUERR_SIMULATOR = 711,
    XPUERR_NOSUPPORT = 712,
    XPUERR_ABNORMAL = 713,
    XPUERR_KEXCEPTION = 714,
    XPUERR_TIMEOUT = 715,
    XPUERR_BUSY = 716,
    XPUERR_USEAFCLOSE = 717,
    XPUERR_UCECC = 718,
    XPUERR_OVERHEAT = 719,
    XPUERR_UNEXPECT = 800,
    XPUERR_DEVRESET = 801,
    XPUERR_HWEXCEPTION = 802,
    XPUERR_HBM_INIT = 803,
    XPUERR_DEVINIT = 804,
    XPUERR_PEERRESET = 805,
    XPUERR_MAXDEV = 806,
    XPUERR_NOIOC = 807,
    XPUERR_DMATIMEOUT = 808,
    XPUERR_DMAABORT = 809,
    XPUERR_MCUUNINIT = 810,
    XPUERR_OLDFW = 811,
    XPUERR_PCIE = 812,
    XPUERR_FAULT = 813,
    XPUERR_INTERRUPTED = 814
} XPUError_t;

/* versions and devices */
int xpu_get_driver_version(uint32_t *major, uint32_t *minor);
int xpu_get_runtime_version(uint32_t *major, uint32_t *minor);
int xpu_set_device(int devid);
int xpu_current_device(int *devid);
int xpu_device_count(int *dev_count);
int xpu_device_list(int *dev_list);
int xpu_device_get_attr(uint64_t *v, XPUDeviceAttr attr, int devid);

/* memory */
int xpu_malloc(void **pdevptr, uint64_t sz, XPUMemoryKind kind);
int xpu_free(void *devptr);
int xpu_host_alloc(void **ptr, uint64_t sz, unsigned int flags);
int xpu_host_free(void *ptr);
int xpu_memcpy(void *dst, const void *src, uint64_t sz, XPUMemcpyKind kind);
int xpu_memcpy_async(void *dst, const void *src, uint64_t sz, XPUMemcpyKind kind, XPUStream stream);
int xpu_memcpy_peer(int dst_device, void *dst_addr, int src_device, const void *src_addr, uint64_t sz);

/* streams and events */
int xpu_stream_create(XPUStream *pstream);
int xpu_stream_destroy(XPUStream stream);
int xpu_wait(XPUStream stream);
int xpu_stream_wait_event(XPUStream stream, XPUEvent event);
int xpu_event_create(XPUEvent *pevent);
int xpu_event_record(XPUEvent event, XPUStream stream);
int xpu_event_destroy(XPUEvent event);
int xpu_event_wait(XPUEvent event);
int xpu_event_query(XPUEvent event);

/* anychip simulator only (not in the XPU runtime): what the runtime lacks */
int anychip_sim_xpu_memset_async(void *dst, int value, uint64_t sz, XPUStream stream);
int anychip_sim_xpu_event_elapsed_time(float *ms, XPUEvent start, XPUEvent end);
int anychip_sim_xpu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);
/* ANYCHIP-CDEF-END */

#ifdef __cplusplus
}
#endif
#endif /* ANYCHIP_XPU_RUNTIME_H */
