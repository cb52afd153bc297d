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

#include "anychip/sim.h"

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

_Static_assert(SIM_E_TIMEOUT == ANYCHIP_SIM_E_TIMEOUT, "anychip/sim.h documents the timeout status");

/* copy directions understood by the core */
enum { SIM_H2H = 0, SIM_H2D = 1, SIM_D2H = 2, SIM_D2D = 3, SIM_DEFAULT = 4 };

/* visibility-variable rules */
enum {
    SIM_VIS_ACL = 0,   /* CANN: ascending ids; a repeated / descending id or a bad start rejects all */
    SIM_VIS_CUDA = 1,  /* list order, reading stops at the first invalid or repeated id; "" lists none */
    SIM_VIS_HIP = 2,   /* clr: list order, exact decimal entries, repeats skipped, a bad entry ends it */
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
/* Whether the synchronous copies and memsets (sim_memcpy_sync, sim_memset_sync) first wait
 * for the current device's default stream (the default; CANN's aclrtMemcpy waits for no
 * stream, so the ACL front end turns it off). */
SIM_HIDDEN void sim_set_sync_waits_default(int yes);
/* HIP's legacy null stream (clr's WaitActiveStreams): work enqueued on a device's default
 * stream first waits for the work queued so far on its blocking streams (those not marked
 * non-blocking), and work enqueued on a blocking stream first waits for the work queued so
 * far on the default stream. Off unless a front end turns it on. */
SIM_HIDDEN void sim_set_legacy_null_stream(int yes);

/* why the visibility variable rejected every device (SIM_VIS_ACL), or NULL */
SIM_HIDDEN const char *sim_visibility_error(void);
SIM_HIDDEN int sim_visible_count(void);
SIM_HIDDEN int sim_physical_count(void);
SIM_HIDDEN int sim_logical_to_phys(int logical);          /* -1 when out of range */
SIM_HIDDEN int sim_phys_to_logical(int phys);             /* -1 when not visible */
/* A front end's call `fn` asking whether `device` can access `peer`'s memory (any other device
 * can), into *out: fails on a NULL out or a device that does not exist, saying which. */
SIM_HIDDEN sim_status sim_can_access_peer(int *out, int device, int peer, const char *fn);
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
/* whether ptr lies inside a live page-locked host allocation (sim_host_alloc) */
SIM_HIDDEN int sim_is_host_alloc(const void *ptr);
/* whether every page of [ptr, ptr + n) is mapped in this process (host memory that can be
 * read); used where a copy kind calls a host pointer device memory */
SIM_HIDDEN int sim_host_mapped(const void *ptr, size_t n);

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
/* wait for the work queued on the device's streams, passing over held streams (which only
 * a release can let run) and the calling thread's own stream worker */
SIM_HIDDEN sim_status sim_device_drain(int phys);
/* the same, passing over the streams marked non-blocking too (HIP's legacy null stream) */
SIM_HIDDEN sim_status sim_device_drain_blocking(int phys);
SIM_HIDDEN sim_status sim_stream_set_nonblocking(void *stream);
/* whether sim_stream_set_nonblocking marked the stream (0 for a default stream) */
SIM_HIDDEN sim_status sim_stream_nonblocking(void *stream, int *out);
/* queue on the stream the legacy null-stream waits an op would get (sim_set_legacy_null_stream),
 * so that a synchronize or query of the null stream covers the blocking streams' work;
 * *queued: whether the stream's queue grew */
SIM_HIDDEN sim_status sim_stream_join_blocking(void *stream, int *queued);

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
/* no_timing: elapsed time with this event is refused (SIM_E_INVALID_HANDLE) */
SIM_HIDDEN sim_status sim_event_create_flags(void **event, int no_timing);
/* reset the event to "never recorded" when the stream reaches this point */
SIM_HIDDEN sim_status sim_event_reset(void *event, void *stream);
/* recorded: a record since creation / the last reset; complete: the latest record ran;
 * waits_done: no stream has a queued wait on the event that it has not passed */
SIM_HIDDEN sim_status sim_event_status(void *event, int *recorded, int *complete, int *waits_done);
SIM_HIDDEN sim_status sim_event_destroy(void *event);
SIM_HIDDEN sim_status sim_event_record(void *event, void *stream);
SIM_HIDDEN sim_status sim_stream_wait_event(void *stream, void *event);
SIM_HIDDEN sim_status sim_event_synchronize(void *event);
SIM_HIDDEN sim_status sim_event_wait(void *event, int timeout_ms);  /* SIM_OK or SIM_E_TIMEOUT */
SIM_HIDDEN sim_status sim_event_query(void *event);            /* SIM_OK or SIM_E_NOT_READY */
SIM_HIDDEN sim_status sim_event_elapsed(float *ms, void *start, void *end);

/* ---- exported controls: declared in csrc/include/anychip/sim.h ------------------- */

/* internal forms used by vendor IPC entry points (hipIpc*) */
SIM_HIDDEN sim_status sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *h);
SIM_HIDDEN sim_status sim_ipc_open(int fd, const anychip_sim_ipc_handle *h, void **devptr);
SIM_HIDDEN sim_status sim_ipc_close(void *devptr);

#endif /* ANYCHIP_SIM_CORE_H */
