/*
 * The anychip chip simulator: the vendor-neutral core.
 *
 * One core is compiled into each vendor front-end library (acl.c -> libascend_sim,
 * xpu.c -> libkunlun_sim, hip.c -> libhygon_sim), so every simulated chip has its own
 * devices, memory and streams. Internal functions are hidden (SIM_HIDDEN) so that two
 * simulator libraries loaded into one process never resolve each other's core; the
 * only exported names are the vendors' own symbols (in the front ends) and the
 * documented anychip_sim_* controls declared at the end of this file.
 *
 * Model
 *   devices  ANYCHIP_SIM_DEVICES physical devices (default 8), each with
 *            ANYCHIP_SIM_MEMORY bytes (default 16 GiB). The vendor's visibility
 *            variable selects and renumbers them (sim_core_init).
 *   memory   each device owns an arena the size of its capacity, reserved with
 *            MAP_NORESERVE, so host memory is used only for pages touched. It starts as
 *            private memory with transparent huge pages; the first IPC export moves it
 *            into a memfd mapped at the same addresses, so another process can map the
 *            same pages. Allocations are carved from the arena (best fit, coalescing free
 *            list); a sorted table of live allocations lets every copy be checked.
 *   streams  one worker thread per stream executes queued ops strictly in order.
 *            Ops are checked when enqueued (the caller gets the vendor's error code)
 *            and checked again when they run, so a buffer freed while work was still
 *            queued can never be written: such an op fails and the stream reports the
 *            failure at its next synchronize (as a device fault would).
 *   events   record / wait / synchronize / query, CLOCK_MONOTONIC completion time.
 *   handles  streams and events are handed out as opaque, never reused values that
 *            are validated on every call: a destroyed handle is an error, not a crash.
 *
 * Files: config.c (environment, visibility, current device, messages, fork), memory.c
 * (arenas, allocation table, range checks), ipc.c (sharing memory between processes),
 * handles.c (the handle registry), wait.c (the one spin-then-sleep wait), stream.c
 * (stream workers, copies), event.c. Their shared internals are in internal.h.
 */
#ifndef ANYCHIP_SIM_CORE_H
#define ANYCHIP_SIM_CORE_H

#include <stddef.h>
#include <stdint.h>

#define SIM_HIDDEN __attribute__((visibility("hidden")))
#define SIM_EXPORT __attribute__((visibility("default")))

#define SIM_MAX_DEVICES 64

/* Status of a core call; each front end maps these to its vendor's codes. */
typedef enum sim_status {
    SIM_OK = 0,
    SIM_E_INVALID_VALUE,   /* a bad argument: NULL pointer, unknown enum, count > destMax ... */
    SIM_E_INVALID_DEVICE,  /* device index outside the visible devices */
    SIM_E_NO_DEVICE,       /* no device is visible at all */
    SIM_E_NO_CONTEXT,      /* no current device on this thread (ACL requires aclrtSetDevice) */
    SIM_E_OUT_OF_MEMORY,   /* device memory exhausted */
    SIM_E_HOST_ALLOC,      /* a host allocation failed */
    SIM_E_BAD_FREE,        /* free of a pointer that is not a live allocation */
    SIM_E_OUT_OF_RANGE,    /* a copy / memset touches memory outside a live allocation */
    SIM_E_DIRECTION,       /* the pointers do not match the copy direction */
    SIM_E_INVALID_HANDLE,  /* unknown or destroyed event */
    SIM_E_NOT_READY,       /* queued work is not complete yet */
    SIM_E_NOT_RECORDED,    /* elapsed time of an event that was never recorded */
    SIM_E_ASYNC_FAULT,     /* an op failed while it ran on a stream */
    SIM_E_NOT_SUPPORTED,
    SIM_E_OS,              /* an operating-system call failed */
    SIM_E_BUSY,            /* operation not allowed in this state (e.g. destroy from own worker) */
    SIM_E_INVALID_STREAM,  /* unknown or destroyed stream (SIM_E_INVALID_HANDLE: event) */
    SIM_E_TIMEOUT,         /* a timed wait ran out before the work completed */
    SIM_STATUS_COUNT
} sim_status;

/* copy directions understood by the core */
enum { SIM_H2H = 0, SIM_H2D = 1, SIM_D2H = 2, SIM_D2D = 3, SIM_DEFAULT = 4 };

/* visibility-variable rules */
enum {
    SIM_VIS_ACL = 0,   /* ascending ids, reading stops at the first invalid one; "" lists none */
    SIM_VIS_CUDA = 1,  /* list order, reading stops at the first invalid or repeated id; "" lists none */
};

typedef void (*sim_host_fn)(void *);

/* Where a core call takes a device: the calling thread's current device. */
#define SIM_CURRENT (-1)

/* Entry points take the vendors' own handles: `void *stream` (NULL is the default
 * stream of the calling thread's current device) and `void *event`. The core looks
 * them up, checks them and holds them for the length of the call, so a front-end
 * function is an argument check and one core call. */

/* ---- setup (config.c) ---------------------------------------------------- */

/* Read ANYCHIP_SIM_* once and apply the vendor's visibility variable (NULL = unset).
 * Called by each front end before anything else (idempotent, thread-safe). An invalid
 * value is reported on stderr once per process (not once per simulator library). */
SIM_HIDDEN void sim_core_init(const char *visible, int rule);
/* ACL needs an explicit aclrtSetDevice; HIP and XPU default to device 0. */
SIM_HIDDEN void sim_set_require_current(int yes);

SIM_HIDDEN int sim_visible_count(void);
SIM_HIDDEN int sim_physical_count(void);
SIM_HIDDEN int sim_logical_to_phys(int logical);          /* -1 when out of range */
SIM_HIDDEN int sim_phys_to_logical(int phys);             /* -1 when not visible */
SIM_HIDDEN size_t sim_capacity(void);

/* the calling thread's current device (physical index) */
SIM_HIDDEN sim_status sim_set_current(int logical);
SIM_HIDDEN sim_status sim_current_phys(int *phys);        /* applies the default-device rule */
SIM_HIDDEN sim_status sim_current_logical(int *logical);
SIM_HIDDEN int sim_current_raw(void);                     /* -1 when never set on this thread */
SIM_HIDDEN void sim_clear_current(void);

/* ---- errors (config.c) ----------------------------------------------------- */

/* Detail message of the calling thread's most recent failure ("" when none). */
SIM_HIDDEN const char *sim_last_message(void);
SIM_HIDDEN void sim_clear_message(void);
SIM_HIDDEN sim_status sim_fail(sim_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
SIM_HIDDEN const char *sim_status_name(sim_status st);

/* ---- memory (memory.c) ------------------------------------------------------ */

/* phys: a physical device, or SIM_CURRENT */
SIM_HIDDEN sim_status sim_malloc(int phys, size_t nbytes, void **out);
SIM_HIDDEN sim_status sim_free(void *ptr);
SIM_HIDDEN sim_status sim_mem_info(int phys, size_t *free_bytes, size_t *total_bytes);
/* the device (physical) whose memory holds ptr, or -1 for host memory */
SIM_HIDDEN int sim_device_of(const void *ptr);

/* page-locked host memory (plain host memory here, but tracked so a bad free is caught) */
SIM_HIDDEN sim_status sim_host_alloc(size_t nbytes, void **out);
SIM_HIDDEN sim_status sim_host_free(void *ptr);

/* ---- streams (stream.c) -------------------------------------------------------- */

/* on the current device */
SIM_HIDDEN sim_status sim_stream_create(void **stream);
SIM_HIDDEN sim_status sim_stream_destroy(void *stream);
SIM_HIDDEN sim_status sim_stream_synchronize(void *stream);
SIM_HIDDEN sim_status sim_stream_query(void *stream);      /* SIM_OK or SIM_E_NOT_READY */
SIM_HIDDEN sim_status sim_stream_hold(void *stream);
SIM_HIDDEN sim_status sim_stream_release(void *stream);
/* Wait up to timeout_ms (< 0: no limit) for the work queued on the stream when called:
 * SIM_OK, or SIM_E_TIMEOUT. Failures of that work are left for the next synchronize. */
SIM_HIDDEN sim_status sim_stream_wait(void *stream, int timeout_ms);
/* phys: a physical device, or SIM_CURRENT */
SIM_HIDDEN sim_status sim_device_synchronize(int phys);
SIM_HIDDEN sim_status sim_device_wait(int phys, int timeout_ms);

/* enqueue work; the direction is checked against the allocation table */
SIM_HIDDEN sim_status sim_memcpy_async(void *dst, const void *src, size_t n, int dir, void *stream);
/* device_only: refuse host memory (HIP, XPU); ACL's memset accepts either */
SIM_HIDDEN sim_status sim_memset_async(void *dst, int value, size_t n, int device_only, void *stream);
SIM_HIDDEN sim_status sim_enqueue_host_fn(void *stream, sim_host_fn fn, void *arg);
/* synchronous forms: drain the current device's default stream, then act inline */
SIM_HIDDEN sim_status sim_memcpy_sync(void *dst, const void *src, size_t n, int dir);
SIM_HIDDEN sim_status sim_memset_sync(void *dst, int value, size_t n, int device_only);

/* ---- events (event.c) ---------------------------------------------------------- */

/* on the current device */
SIM_HIDDEN sim_status sim_event_create(void **event);
SIM_HIDDEN sim_status sim_event_destroy(void *event);
SIM_HIDDEN sim_status sim_event_record(void *event, void *stream);
SIM_HIDDEN sim_status sim_stream_wait_event(void *stream, void *event);
SIM_HIDDEN sim_status sim_event_synchronize(void *event);
SIM_HIDDEN sim_status sim_event_wait(void *event, int timeout_ms);  /* SIM_OK or SIM_E_TIMEOUT */
SIM_HIDDEN sim_status sim_event_query(void *event);            /* SIM_OK or SIM_E_NOT_READY */
SIM_HIDDEN sim_status sim_event_elapsed(float *ms, void *start, void *end);

/* ---- exported controls (same names in every simulator library) ------------- */

/* Stop a stream from starting queued work until anychip_sim_stream_release; work
 * queued meanwhile stays pending, so "not ready" states are deterministic in tests.
 * NULL means the default stream of the calling thread's current device. Holds do not
 * nest. Destroying a held stream releases it first. Returns 0 or a sim_status. */
SIM_EXPORT int anychip_sim_stream_hold(void *stream);
SIM_EXPORT int anychip_sim_stream_release(void *stream);
/* Run fn(arg) on the stream's worker thread, in order with the stream's other work. */
SIM_EXPORT int anychip_sim_stream_enqueue_host_fn(void *stream, void (*fn)(void *), void *arg);
/* Interruptible waits: wait at most timeout_ms (< 0: no limit) for the work queued when
 * called on a stream, for an event, or for every stream of the calling thread's current
 * device. 0 when complete, SIM_E_TIMEOUT otherwise, or the handle's error. They only
 * wait: a failure of the work is still reported by the vendor's synchronize, so a caller
 * that must react to signals waits in slices and then calls the vendor's synchronize. */
SIM_EXPORT int anychip_sim_stream_wait(void *stream, int timeout_ms);
SIM_EXPORT int anychip_sim_event_wait(void *event, int timeout_ms);
SIM_EXPORT int anychip_sim_device_wait(int timeout_ms);
/* Detail of the calling thread's most recent failure; "" when none. */
SIM_EXPORT const char *anychip_sim_last_error(void);
SIM_EXPORT const char *anychip_sim_status_string(int status);
/* physical device count, visible device count, per-device capacity */
SIM_EXPORT int anychip_sim_config(int *physical_devices, int *visible_devices, uint64_t *capacity);
/* physical index of a visible (logical) device, -1 when out of range */
SIM_EXPORT int anychip_sim_physical_device(int logical);
/* Process-wide bit set of the configuration warnings already printed. Every simulator
 * library exports it; the copy in the first one loaded is the one used (config.c), so a
 * process that loads several simulator libraries prints each warning once. */
SIM_EXPORT extern unsigned anychip_sim_warned;

/* Inter-process memory handles (the simulated counterpart of cudaIpcGetMemHandle).
 * A handle names a whole allocation of the exporting process; opening it in another
 * process maps the same pages (through /proc/<pid>/fd/<fd>, or a descriptor the caller
 * received over a Unix socket) and returns the allocation's base address there, which
 * the importing simulator then accepts as device memory in copies. */
typedef struct anychip_sim_ipc_handle {
    uint32_t magic;      /* ANYCHIP_SIM_IPC_MAGIC */
    uint32_t version;    /* 1 */
    int32_t pid;         /* exporting process */
    int32_t fd;          /* arena memfd in the exporting process */
    int32_t device;      /* physical device */
    int32_t reserved0;
    uint64_t offset;     /* allocation start within the arena */
    uint64_t size;       /* allocation size in bytes */
    uint64_t alloc_id;   /* allocation id in the exporting process */
    uint8_t reserved[16];
} anychip_sim_ipc_handle;   /* 64 bytes */

#define ANYCHIP_SIM_IPC_MAGIC 0x41435349u /* "ISCA" */

SIM_EXPORT int anychip_sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *handle);
SIM_EXPORT int anychip_sim_ipc_open(const anychip_sim_ipc_handle *handle, void **devptr);
SIM_EXPORT int anychip_sim_ipc_open_fd(int fd, const anychip_sim_ipc_handle *handle, void **devptr);
SIM_EXPORT int anychip_sim_ipc_close(void *devptr);

/* internal forms used by vendor IPC entry points (hipIpc*) */
SIM_HIDDEN sim_status sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *h);
SIM_HIDDEN sim_status sim_ipc_open(int fd, const anychip_sim_ipc_handle *h, void **devptr);
SIM_HIDDEN sim_status sim_ipc_close(void *devptr);

#endif /* ANYCHIP_SIM_CORE_H */
