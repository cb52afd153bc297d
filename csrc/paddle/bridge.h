/*
 * The Paddle bridge's internal header: what its translation units share. The bridge (init.c
 * says what it is) is built from
 *   init.c      loading the plugin.h library, messages, InitPlugin (Paddle's function table)
 *   device.c    the device list, set / get device, a device's init and deinit
 *   streams.c   streams and events, the stream order and the copy fence
 *   memory.c    allocation, copies (the staging buffers of asynchronous H2D copies)
 *   xccl.c      collectives: the plugin's, or anychip's engine (ANYCHIP_PADDLE_CCL)
 *   kernels.c   phi kernels over the plugin's kernel table (ANYCHIP_PADDLE_KERNELS), with
 *   profiler.c  Paddle's profiler entries, and kernels_throw.cc (C++: exceptions, trace events)
 * each compiled on its own with the same configuration (-D flags, see init.c) and linked into
 * one library. Everything declared here is hidden: the library exports only what is marked
 * EXPORT (InitPlugin and the anychip_paddle_* queries) and kernels_throw.cc's functions.
 */
#ifndef ANYCHIP_PADDLE_BRIDGE_H
#define ANYCHIP_PADDLE_BRIDGE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "anychip/plugin.h"
#include "anychip/paddle/device_ext.h"

/* what the library exports (everything else of the bridge is hidden) */
#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 64

#pragma GCC visibility push(hidden)

/* ---- the plugin and messages (init.c) ---------------------------------------------------------- */

extern anychip_plugin g_plugin;           /* the plugin.h library's table, filled by its init */
extern char g_type[ANYCHIP_DEVICE_TYPE_MAX + 16]; /* the Paddle device type, "anychip_<name>" */
extern char g_target[PATH_MAX];           /* the plugin.h library's path */
extern void *g_lib;                       /* the plugin.h library */
extern int g_count;                       /* its devices (at most MAX_DEVICES) */

/* whether the plugin is loaded (loads it the first time: InitPlugin, or a tool asking for the
 * kernel table) */
int target_ready(void);

/* `path` itself when absolute, else relative to the directory of this library (its real path) */
int resolve(const char *path, char *out, size_t len);

/* a line on stderr, "[anychip <device type>] ..." */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* a plugin status -> C_Status, saying what failed (the plugin's text and detail) */
C_Status check(anychip_status rc, const char *what);

#define TRY(expr, what)                          \
    do {                                         \
        C_Status st_ = check((expr), (what));    \
        if (st_ != C_SUCCESS)                    \
            return st_;                          \
    } while (0)

/* ---- calls per entry, always counted (anychip_paddle_calls); ANYCHIP_PADDLE_PROFILE=1 adds their host
 * time, written to stderr at exit (init.c) ------------------------------------------------------------ */

/* the entries (and the ways a copy or the stream order went) counted; PROF_NAMES (init.c) names them */
enum { PROF_create_stream, PROF_destroy_stream, PROF_synchronize_stream, PROF_query_stream, PROF_synchronize_device, PROF_create_event, PROF_destroy_event, PROF_record_event, PROF_query_event, PROF_synchronize_event, PROF_stream_wait_event, PROF_set_device, PROF_get_device, PROF_device_memory_allocate, PROF_device_memory_deallocate, PROF_sync_copy, PROF_device_memory_set, PROF_async_copy, PROF_xccl_all_reduce, PROF_xccl_broadcast, PROF_xccl_all_gather,
       PROF_h2d_staged, PROF_h2d_direct, PROF_d2h_enqueued, PROF_d2h_direct, PROF_order_wait, PROF_order_idle, PROF_N };
extern int g_prof;                        /* ANYCHIP_PADDLE_PROFILE=1 */

typedef struct { int id; unsigned long long t0; } prof_scope;

static inline unsigned long long prof_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

extern atomic_ullong g_prof_calls[PROF_N];

/* one call of the entry `id`, begun at t0 (profiling) */
void prof_add(int id, unsigned long long t0);

static inline void prof_end(prof_scope *p)
{
    if (p->t0)
        prof_add(p->id, p->t0);
    else
        atomic_fetch_add_explicit(&g_prof_calls[p->id], 1, memory_order_relaxed);
}

/* at the top of an entry: it counts, and when profiling its time, from here to its return */
#define PROF(name) prof_scope prof_ __attribute__((cleanup(prof_end))) = {PROF_##name, g_prof ? prof_now() : 0}

/* one more of `name` (no time): a way a copy or the stream order went */
#define COUNT(name) atomic_fetch_add_explicit(&g_prof_calls[PROF_##name], 1, memory_order_relaxed)

/* ---- devices (device.c) -------------------------------------------------------------------------- */

extern __thread int bridge_device;        /* the calling thread's device (set_device) */

/* C_SUCCESS when d is one of the plugin's devices; else says so (as `fn`) */
C_Status bad_device(const C_Device d, const char *fn);

#define DEVICE(d)                                         \
    do {                                                  \
        if (bad_device((d), __func__) != C_SUCCESS)       \
            return C_ERROR;                               \
    } while (0)

void fill_devices(C_DeviceInterface *i);

/* ---- streams and events (streams.c) -------------------------------------------------------------- */

typedef struct stream_rec {
    anychip_stream s;
    atomic_int pending;                   /* async work enqueued since the copy fence last synchronized it */
    anychip_event order_ev;               /* recorded when another stream is ordered after this one */
    struct stream_rec *next;
} stream_rec;

/* a Paddle stream is the bridge's record (the plugin's handle inside) */
#define REC(stream) ((stream_rec *)(stream))

/* work is about to be enqueued on r of `device`: the copy fence will see it, and it comes after
 * the device's work enqueued before it on other streams (the stream order) */
C_Status enqueue_on(int device, stream_rec *r);

/* whether r and the device's last stream have no work left: a copy made at once, now, is ordered
 * as one enqueued on r (after every earlier piece of the device's work) */
int nothing_pending(int device, stream_rec *r);

/* the copy fence: synchronize the streams of `device` with work pending */
C_Status fence(int device);

C_Status synchronize_device(const C_Device d);

void fill_streams(C_DeviceInterface *i);

/* ---- memory and copies (memory.c) ---------------------------------------------------------------- */

/* a synchronous copy, after the copy fence */
C_Status sync_copy(int device, void *dst, const void *src, size_t size, anychip_copy_kind kind);

/* a copy enqueued on `stream` (in the stream order; H2D from a staging buffer, D2H complete on return) */
C_Status async_copy(int device, C_Stream stream, void *dst, const void *src, size_t size, anychip_copy_kind kind);

/* wait for the device's staged H2D copies and free their staging buffers (the device's deinit) */
void staging_drain(int device);

void fill_memory(C_DeviceInterface *i);

/* ---- collectives (xccl.c) ------------------------------------------------------------------------ */

/* the first async error of a live communicator of the plugin, reported once (a collective that
 * failed on its stream: device_ext.h has no entry for it, so every synchronize asks) */
C_Status comm_errors(void);

void fill_collectives(C_DeviceInterface *i);

/* ---- kernels and Paddle's profiler (kernels.c, profiler.c; ANYCHIP_PADDLE_KERNELS) ------------- */

/* register the phi kernels the plugin's kernel table allows */
void register_kernels(void);

/* the profiler entries, and the copies and memsets wrapped to be traced (after the others are set) */
void fill_profiler(C_DeviceInterface *i);

/* the trace of a primitive enqueued on a stream: trace_begin before, trace_end after */
typedef struct {
    int on;
    anychip_event a;
    uint64_t host_start;
} trace_mark;

/* what a record is: a copy (its direction), a memset or a kernel */
enum { TC_H2D, TC_D2H, TC_D2D, TC_N, TW_MEMSET = TC_N, TW_KERNEL };

void trace_begin(int device, anychip_stream s, trace_mark *m);
void trace_end(trace_mark *m, int device, anychip_stream s, anychip_status rc, int what, uint64_t bytes,
               const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* called before a matmul's first GEMM when the library defines it (provider_sim.c: the simulated
 * chips hand their GEMM a BLAS) */
void bridge_before_gemm(void) __attribute__((weak));

#pragma GCC visibility pop

#endif
