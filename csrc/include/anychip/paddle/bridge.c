/*
 * anychip's Paddle CustomDevice provider: Paddle's InitPlugin (device_ext.h 0.1.1) over
 * one anychip/plugin.h backend, so that every C-level anychip backend is a Paddle device
 * type named "anychip_<backend>" (see docs/paddle.md, "Paddle on anychip").
 *
 Paddle calls InitPlugin once per library and gives each library one device type, so a
 * build of this file serves one plugin.h library, named at compile time:
 *   ANYCHIP_PADDLE_TARGET      the library's path, relative to the bridge's own directory
 *                              or absolute (a vendor's C plugin: `anychip plugin paddle`);
 *   ANYCHIP_PADDLE_SIMULATORS  a pattern (one %s) of the simulated chips' libraries: the
 *                              chip is the one ANYCHIP_PADDLE names (ascend, kunlun or
 *                              hygon), the simulated Ascend when it is unset.
 * Paddle's launcher takes the first device type it finds, so one simulated chip per
 * process is Paddle's device (ANYCHIP_PADDLE=none registers none). The bridge dlopens the
 * library and calls its anychip_plugin_init.
 *
 * The copy fence. Paddle issues synchronous copies (memory_copy_h2d / d2h / d2d, memset)
 * that expect to see the device's earlier asynchronous work, as CUDA's legacy-stream
 * cudaMemcpy does (it waits for every blocking stream). ACL's aclrtMemcpy, HIP's on a
 * non-blocking stream and most plugins' synchronous copies do not, and Paddle's
 * all_gather into a tensor list reads the gathered buffer with such copies before it
 * orders the compute stream after the collective's. So every stream the bridge created
 * carries a "pending" flag, set when async work (copies, fills, collectives) is enqueued
 * on it; a synchronous copy first synchronizes the pending streams of its device and
 * clears their flags. With nothing pending the fence costs one pass over a short list.
 *
 * Ordering (docs/paddle.md, "Ordering"): asynchronous H2D copies read a staging buffer of the
 * bridge's (Paddle may free the source at once), asynchronous D2H copies return complete,
 * work enqueued on a stream other than the device's last one first waits for that one (the
 * stream order: Paddle's allocator reuses memory across streams), and a free waits for the
 * device's pending streams (the fence).
 *
 * Collectives: the plugin's own (plugin.h's optional collectives), one communicator per
 * Paddle communicator. A plugin without them, in a build given ANYCHIP_PADDLE_CCL (the path
 * of anychip's libanychip_ccl), gets anychip's shared-memory engine: each op synchronizes
 * its stream, stages the data through host memory (device -> host, the engine between the
 * ranks of this machine, host -> device) and returns when done; send / recv between
 * group_start and group_end run together at group_end. Without either, no xccl entries.
 *
 * Kernels: built with ANYCHIP_PADDLE_KERNELS, the bridge includes kernels.c (below), which
 * registers Paddle phi kernels built from the plugin's kernel table (plugin.h minor 1), per
 * dtype its masks allow; kernels_throw.cc (C++) is linked beside it, and the C is compiled
 * with -fexceptions. Without ANYCHIP_PADDLE_KERNELS every op takes Paddle's CPU fallback and
 * anychip_paddle_kernel_note() says why (ANYCHIP_PADDLE_NO_KERNELS).
 */
#define _GNU_SOURCE
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

#if !defined(ANYCHIP_PADDLE_TARGET) && !defined(ANYCHIP_PADDLE_SIMULATORS)
#error "define ANYCHIP_PADDLE_TARGET (the plugin.h library, relative to this library's directory or absolute)"
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 64

static anychip_plugin P;
static char g_type[ANYCHIP_DEVICE_TYPE_MAX + 16];
static char g_target[PATH_MAX];
static void *g_lib;                       /* the plugin.h library */
static int g_count;
static __thread int t_device;

/* ---- messages ------------------------------------------------------------------------- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[anychip %s] %s\n", g_type[0] ? g_type : "paddle", line);
}

/* a plugin status -> C_Status, saying what failed (the plugin's text and detail) */
static C_Status check(anychip_status rc, const char *what)
{
    if (rc == 0)
        return C_SUCCESS;
    const char *text = P.get_error_string ? P.get_error_string(rc) : NULL;
    const char *detail = P.get_last_error ? P.get_last_error() : NULL;
    say("%s failed: status %d%s%s%s", what, (int)rc, text ? " (" : "", text ? text : "", text ? ")" : "");
    if (detail)
        say("  %s", detail);
    return rc == P.invalid_status && P.invalid_status ? C_ERROR : C_FAILED;
}

#define TRY(expr, what)                          \
    do {                                         \
        C_Status st_ = check((expr), (what));    \
        if (st_ != C_SUCCESS)                    \
            return st_;                          \
    } while (0)

static C_Status bad_device(const C_Device d, const char *fn)
{
    if (!d || d->id < 0 || d->id >= g_count) {
        say("%s: device %d does not exist (%d device%s)", fn, d ? d->id : -1, g_count, g_count == 1 ? "" : "s");
        return C_ERROR;
    }
    return C_SUCCESS;
}

#define DEVICE(d)                                         \
    do {                                                  \
        if (bad_device((d), __func__) != C_SUCCESS)       \
            return C_ERROR;                               \
    } while (0)

/* ---- ANYCHIP_PADDLE_PROFILE=1: calls and host time per entry, written to stderr at exit ---- */

enum { PROF_create_stream, PROF_destroy_stream, PROF_synchronize_stream, PROF_query_stream, PROF_synchronize_device, PROF_create_event, PROF_destroy_event, PROF_record_event, PROF_query_event, PROF_synchronize_event, PROF_stream_wait_event, PROF_set_device, PROF_get_device, PROF_device_memory_allocate, PROF_device_memory_deallocate, PROF_sync_copy, PROF_device_memory_set, PROF_async_copy, PROF_xccl_all_reduce, PROF_xccl_broadcast, PROF_xccl_all_gather, PROF_N };
static const char *const PROF_NAMES[PROF_N] = {"create_stream", "destroy_stream", "synchronize_stream", "query_stream", "synchronize_device", "create_event", "destroy_event", "record_event", "query_event", "synchronize_event", "stream_wait_event", "set_device", "get_device", "device_memory_allocate", "device_memory_deallocate", "sync_copy", "device_memory_set", "async_copy", "xccl_all_reduce", "xccl_broadcast", "xccl_all_gather"};
static int g_prof;
static atomic_ullong g_prof_calls[PROF_N], g_prof_ns[PROF_N], g_prof_max[PROF_N];

static unsigned long long prof_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

typedef struct { int id; unsigned long long t0; } prof_scope;

static void prof_end(prof_scope *p)
{
    if (p->id < 0)
        return;
    unsigned long long dt = prof_now() - p->t0, max = atomic_load(&g_prof_max[p->id]);
    atomic_fetch_add(&g_prof_calls[p->id], 1);
    atomic_fetch_add(&g_prof_ns[p->id], dt);
    while (dt > max && !atomic_compare_exchange_weak(&g_prof_max[p->id], &max, dt))
        ;
}

static void prof_report(void)
{
    say("profile (pid %d): entry, calls, host us per call, max us", (int)getpid());
    for (int i = 0; i < PROF_N; i++) {
        unsigned long long n = atomic_load(&g_prof_calls[i]);
        if (n)
            say("  %-26s %10llu %10.2f %10.1f", PROF_NAMES[i], n, atomic_load(&g_prof_ns[i]) / 1e3 / (double)n,
                atomic_load(&g_prof_max[i]) / 1e3);
    }
}

/* at the top of an entry: its time, from here to its return, counts when profiling */
#define PROF(name) prof_scope prof_ __attribute__((cleanup(prof_end))) = {g_prof ? PROF_##name : -1, \
                                                                         g_prof ? prof_now() : 0}

/* ---- failures of enqueued collectives --------------------------------------------------------- */

/* A collective that fails on its stream (a peer gone, a timeout) leaves the stream's
 * synchronize successful, as NCCL's and HCCL's do: the failure is the communicator's async
 * error. device_ext.h has no entry for it, so every synchronize the bridge serves asks each
 * live communicator of the plugin, and reports the first failure as Paddle's error. */
typedef struct comm_rec {
    anychip_comm c;
    int rank, nranks, reported;
    struct comm_rec *next;
} comm_rec;

static pthread_mutex_t g_comms_lock = PTHREAD_MUTEX_INITIALIZER;
static comm_rec *g_comms;
static atomic_int g_ncomms;

static void comms_add(comm_rec *r)
{
    pthread_mutex_lock(&g_comms_lock);
    r->next = g_comms;
    g_comms = r;
    atomic_fetch_add(&g_ncomms, 1);
    pthread_mutex_unlock(&g_comms_lock);
}

static void comms_remove(comm_rec *r)
{
    pthread_mutex_lock(&g_comms_lock);
    for (comm_rec **p = &g_comms; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            atomic_fetch_sub(&g_ncomms, 1);
            break;
        }
    pthread_mutex_unlock(&g_comms_lock);
}

static C_Status comm_errors(void)
{
    if (!atomic_load(&g_ncomms) || !P.comm_get_async_error)
        return C_SUCCESS;
    C_Status st = C_SUCCESS;
    pthread_mutex_lock(&g_comms_lock);
    for (comm_rec *r = g_comms; r && st == C_SUCCESS; r = r->next) {
        anychip_status err = 0;
        if (P.comm_get_async_error(r->c, &err) != 0 || err == 0)
            continue;
        /* the library's detail (which rank, what happened to it): the calling thread's last
         * error, which comm_get_async_error sets to the failure it reports, as anychip reads it */
        const char *detail = P.get_last_error ? P.get_last_error() : NULL;
        const char *text = P.get_error_string ? P.get_error_string(err) : NULL;
        if (!r->reported)
            say("rank %d of %d: a collective failed on its stream: status %d%s%s%s%s%s%s", r->rank, r->nranks,
                (int)err, text ? " (" : "", text ? text : "", text ? ")" : "",
                err == P.timeout_status && err ? "; a peer did not join in time (ANYCHIP_COLLECTIVE_TIMEOUT)" : "",
                detail && *detail ? ": " : "", detail && *detail ? detail : "");
        r->reported = 1;
        st = C_FAILED;
    }
    pthread_mutex_unlock(&g_comms_lock);
    return st;
}

/* ---- streams and the copy fence ---------------------------------------------------------- */

typedef struct stream_rec {
    anychip_stream s;
    atomic_int pending;
    anychip_event order_ev;               /* recorded when another stream is ordered after this one */
    struct stream_rec *next;
} stream_rec;

static pthread_mutex_t g_streams_lock = PTHREAD_MUTEX_INITIALIZER;
static stream_rec *g_streams[MAX_DEVICES];

/* a Paddle stream is the bridge's record (the plugin's handle inside) */
#define REC(stream) ((stream_rec *)(stream))

/* The stream order. Paddle's allocator for a custom device hands memory back for reuse as
 * soon as the host frees it (a kernel's temporaries when the kernel returns, the executor's
 * intermediates when their last op has been enqueued), and the next user may run on another
 * stream: Paddle's executor copies on streams of its own, and it tells the device nothing
 * about which memory a stream uses (it records streams for CUDA's allocator only). Observed:
 * in a static program, the H2D stream wrote a transposed weight into the memory the compute
 * stream's queued matmul was about to read as another one. So the device's work is ordered
 * as the host enqueued it: work enqueued on a stream other than the one the device's last work
 * went to first waits (an event) for that stream; a stream that keeps the work costs nothing
 * (eager mode's one stream never switches). Collectives are left out: Paddle's process group
 * orders its stream after the compute stream's work itself. */
static pthread_mutex_t g_order_lock = PTHREAD_MUTEX_INITIALIZER;
static stream_rec *_Atomic g_last[MAX_DEVICES];

/* work is about to be enqueued on r of `device`: the copy fence will see it, and it comes after
 * the device's work enqueued before it on other streams */
static C_Status enqueue_on(int device, stream_rec *r)
{
    atomic_store(&r->pending, 1);
    if (atomic_load(&g_last[device]) == r)
        return C_SUCCESS;
    C_Status st = C_SUCCESS;
    pthread_mutex_lock(&g_order_lock);
    stream_rec *last = atomic_exchange(&g_last[device], r);
    if (last && last != r) {
        if (!P.event_create || !P.stream_wait_event)
            st = check(P.stream_synchronize(device, last->s), "stream_synchronize (the stream order)");
        else if (last->order_ev || (st = check(P.event_create(device, &last->order_ev), "event_create")) == C_SUCCESS) {
            st = check(P.event_record(device, last->order_ev, last->s), "event_record (the stream order)");
            if (st == C_SUCCESS)
                st = check(P.stream_wait_event(device, r->s, last->order_ev), "stream_wait_event (the stream order)");
        }
    }
    pthread_mutex_unlock(&g_order_lock);
    return st;
}

static C_Status fence(int device)
{
    pthread_mutex_lock(&g_streams_lock);
    C_Status st = C_SUCCESS;
    for (stream_rec *r = g_streams[device]; r && st == C_SUCCESS; r = r->next)
        if (atomic_exchange(&r->pending, 0))
            st = check(P.stream_synchronize(device, r->s), "the copy fence's stream_synchronize");
    pthread_mutex_unlock(&g_streams_lock);
    return st != C_SUCCESS ? st : comm_errors();
}

static C_Status create_stream(const C_Device d, C_Stream *stream)
{
    PROF(create_stream);
    DEVICE(d);
    stream_rec *r = calloc(1, sizeof *r);
    if (!r)
        return C_FAILED;
    C_Status st = check(P.stream_create(d->id, &r->s), "stream_create");
    if (st != C_SUCCESS) {
        free(r);
        return st;
    }
    pthread_mutex_lock(&g_streams_lock);
    r->next = g_streams[d->id];
    g_streams[d->id] = r;
    pthread_mutex_unlock(&g_streams_lock);
    *stream = (C_Stream)r;
    return C_SUCCESS;
}

static C_Status destroy_stream(const C_Device d, C_Stream stream)
{
    PROF(destroy_stream);
    DEVICE(d);
    stream_rec *r = REC(stream);
    pthread_mutex_lock(&g_streams_lock);
    for (stream_rec **p = &g_streams[d->id]; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    pthread_mutex_unlock(&g_streams_lock);
    pthread_mutex_lock(&g_order_lock);
    stream_rec *mine = r;
    atomic_compare_exchange_strong(&g_last[d->id], &mine, NULL);
    pthread_mutex_unlock(&g_order_lock);
    C_Status st = check(P.stream_destroy(d->id, r->s), "stream_destroy");
    if (r->order_ev)
        P.event_destroy(d->id, r->order_ev);
    free(r);
    return st;
}

static C_Status synchronize_stream(const C_Device d, C_Stream stream)
{
    PROF(synchronize_stream);
    DEVICE(d);
    atomic_store(&REC(stream)->pending, 0);
    TRY(P.stream_synchronize(d->id, REC(stream)->s), "stream_synchronize");
    return comm_errors();
}

static C_Status query_stream(const C_Device d, C_Stream stream)
{
    PROF(query_stream);
    DEVICE(d);
    if (!P.stream_query)
        return synchronize_stream(d, stream);
    anychip_status rc = P.stream_query(d->id, REC(stream)->s);
    if (rc == P.not_ready_status && rc != 0)
        return C_FAILED;                  /* "not complete" is not a failure: no message */
    return check(rc, "stream_query");
}

static C_Status synchronize_device(const C_Device d)
{
    PROF(synchronize_device);
    DEVICE(d);
    if (P.device_synchronize) {
        TRY(P.device_synchronize(d->id), "device_synchronize");
        return comm_errors();
    }
    pthread_mutex_lock(&g_streams_lock);
    for (stream_rec *r = g_streams[d->id]; r; r = r->next)
        atomic_store(&r->pending, 1);
    pthread_mutex_unlock(&g_streams_lock);
    return fence(d->id);
}

/* ---- events (the plugin's; without them, a record synchronizes the stream) ------------------ */

typedef struct event_rec {
    anychip_event e;                      /* NULL when the plugin has no events */
} event_rec;

static C_Status create_event(const C_Device d, C_Event *event)
{
    PROF(create_event);
    DEVICE(d);
    event_rec *r = calloc(1, sizeof *r);
    if (!r)
        return C_FAILED;
    if (P.event_create) {
        C_Status st = check(P.event_create(d->id, &r->e), "event_create");
        if (st != C_SUCCESS) {
            free(r);
            return st;
        }
    }
    *event = (C_Event)r;
    return C_SUCCESS;
}

static C_Status destroy_event(const C_Device d, C_Event event)
{
    PROF(destroy_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    C_Status st = r->e ? check(P.event_destroy(d->id, r->e), "event_destroy") : C_SUCCESS;
    free(r);
    return st;
}

static C_Status record_event(const C_Device d, C_Stream stream, C_Event event)
{
    PROF(record_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    if (!r->e)
        return synchronize_stream(d, stream);
    return check(P.event_record(d->id, r->e, REC(stream)->s), "event_record");
}

static C_Status query_event(const C_Device d, C_Event event)
{
    PROF(query_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    if (!r->e)
        return C_SUCCESS;
    if (!P.event_query)
        return check(P.event_synchronize(d->id, r->e), "event_synchronize");
    anychip_status rc = P.event_query(d->id, r->e);
    if (rc == P.not_ready_status && rc != 0)
        return C_FAILED;
    return check(rc, "event_query");
}

static C_Status synchronize_event(const C_Device d, C_Event event)
{
    PROF(synchronize_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    if (r->e)
        TRY(P.event_synchronize(d->id, r->e), "event_synchronize");
    return comm_errors();
}

static C_Status stream_wait_event(const C_Device d, C_Stream stream, C_Event event)
{
    PROF(stream_wait_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    if (!r->e)
        return C_SUCCESS;                 /* recorded synchronously: already complete */
    if (P.stream_wait_event)
        return check(P.stream_wait_event(d->id, REC(stream)->s, r->e), "stream_wait_event");
    return check(P.event_synchronize(d->id, r->e), "event_synchronize");
}

/* ---- the staging buffers of asynchronous H2D copies ------------------------------------------ */

/* The staging buffers of asynchronous H2D copies are released only once the copy has
 * completed on its stream: an event is recorded after the copy, and the entry waits in a list
 * (oldest first) until the event has completed. Every addition reaps the list (queries each
 * entry's event, releases the completed ones); the list is bounded: past max_n entries or
 * max_bytes bytes the oldest entry's event is waited for. A released entry keeps its event and
 * its buffer (up to STAGE_KEEP bytes) for the next copy; LATER_SPARE of them are kept, and
 * those of a device are freed when it is deinitialized. */
typedef struct later {
    int device;
    anychip_event e;
    void *buf;                            /* the staging buffer, kept for reuse */
    size_t cap, bytes;
    struct later *next;
} later;

typedef struct {
    pthread_mutex_t lock;
    later *head, *spare;                  /* pending (oldest first), and reusable entries */
    size_t n, bytes, nspare;
    size_t max_n, max_bytes;
} later_list;

#define LATER_SPARE 64                    /* reusable entries kept per list */
#define STAGE_KEEP ((size_t)1 << 20)      /* staging buffers up to this size are kept for reuse */

static void later_recycle(later_list *L, later *x)
{
    x->bytes = 0;
    if (x->cap > STAGE_KEEP) {
        free(x->buf);
        x->buf = NULL;
        x->cap = 0;
    }
    pthread_mutex_lock(&L->lock);
    int keep = L->nspare < LATER_SPARE;
    if (keep) {
        x->next = L->spare;
        L->spare = x;
        L->nspare++;
    }
    pthread_mutex_unlock(&L->lock);
    if (!keep) {
        P.event_destroy(x->device, x->e);
        free(x->buf);
        free(x);
    }
}

/* an entry with an event of `device` and a staging buffer of `staging` bytes, or NULL */
static later *later_get(later_list *L, int device, size_t staging)
{
    later *x = NULL;
    pthread_mutex_lock(&L->lock);
    for (later **p = &L->spare; *p; p = &(*p)->next)
        if ((*p)->device == device && (*p)->cap >= staging) {
            x = *p;
            *p = x->next;
            L->nspare--;
            break;
        }
    pthread_mutex_unlock(&L->lock);
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x)
            return NULL;
        x->device = device;
        if (check(P.event_create(device, &x->e), "event_create") != C_SUCCESS) {
            free(x);
            return NULL;
        }
    }
    if (staging > x->cap) {
        void *buf = malloc(staging);
        if (!buf) {
            later_recycle(L, x);
            return NULL;
        }
        free(x->buf);
        x->buf = buf;
        x->cap = staging;
    }
    return x;
}

/* release the completed entries; past the bounds, wait for the oldest */
static void later_reap(later_list *L)
{
    for (;;) {
        later *done = NULL, *oldest = NULL;
        pthread_mutex_lock(&L->lock);
        for (later **p = &L->head; *p;) {
            later *x = *p;
            if (P.event_query && P.event_query(x->device, x->e) == 0) {    /* complete */
                *p = x->next;
                L->n--;
                L->bytes -= x->bytes;
                x->next = done;
                done = x;
            } else {
                p = &x->next;
            }
        }
        if (L->head && (L->n > L->max_n || L->bytes > L->max_bytes)) {
            oldest = L->head;
            L->head = oldest->next;
            L->n--;
            L->bytes -= oldest->bytes;
        }
        pthread_mutex_unlock(&L->lock);
        while (done) {
            later *x = done;
            done = x->next;
            later_recycle(L, x);
        }
        if (!oldest)
            return;
        check(P.event_synchronize(oldest->device, oldest->e), "event_synchronize");
        later_recycle(L, oldest);
    }
}

/* x (from later_get, its buffer filled) is released once the work enqueued so far on `s` has completed */
static void later_add(later_list *L, later *x, anychip_stream s)
{
    if (check(P.event_record(x->device, x->e, s), "event_record") != C_SUCCESS) {
        check(P.stream_synchronize(x->device, s), "stream_synchronize");
        later_recycle(L, x);
        return;
    }
    x->next = NULL;
    pthread_mutex_lock(&L->lock);
    later **p = &L->head;
    while (*p)
        p = &(*p)->next;
    *p = x;
    L->n++;
    L->bytes += x->bytes;
    pthread_mutex_unlock(&L->lock);
    later_reap(L);
}

/* wait for and release every entry of `device`, and free its spare ones */
static void later_drain(later_list *L, int device)
{
    for (;;) {
        later *x = NULL;
        pthread_mutex_lock(&L->lock);
        for (later **p = &L->head; *p; p = &(*p)->next)
            if ((*p)->device == device) {
                x = *p;
                *p = x->next;
                L->n--;
                L->bytes -= x->bytes;
                break;
            }
        pthread_mutex_unlock(&L->lock);
        if (!x)
            break;
        check(P.event_synchronize(x->device, x->e), "event_synchronize");
        later_recycle(L, x);
    }
    later *spare = NULL;
    pthread_mutex_lock(&L->lock);
    for (later **p = &L->spare; *p;) {
        later *x = *p;
        if (x->device == device) {
            *p = x->next;
            L->nspare--;
            x->next = spare;
            spare = x;
        } else {
            p = &x->next;
        }
    }
    pthread_mutex_unlock(&L->lock);
    while (spare) {
        later *x = spare;
        spare = x->next;
        P.event_destroy(x->device, x->e);
        free(x->buf);
        free(x);
    }
}

/* the staging buffers of asynchronous H2D copies in flight */
static later_list g_staged = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, 0, 0, 0, 4096, (size_t)256 << 20};

/* ---- devices ------------------------------------------------------------------------------ */

static C_Status initialize(void) { return C_SUCCESS; }
static C_Status finalize(void) { return C_SUCCESS; }

static C_Status set_device(const C_Device d)
{
    PROF(set_device);
    DEVICE(d);
    if (P.set_device)
        TRY(P.set_device(d->id), "set_device");
    t_device = d->id;
    return C_SUCCESS;
}

static C_Status init_device(const C_Device d) { return set_device(d); }

static C_Status get_device(const C_Device d)
{
    PROF(get_device);
    d->id = t_device;
    return C_SUCCESS;
}

static C_Status deinit_device(const C_Device d)
{
    DEVICE(d);
    later_drain(&g_staged, d->id);
    return synchronize_device(d);
}

static C_Status get_device_count(size_t *count)
{
    *count = (size_t)g_count;
    return C_SUCCESS;
}

static C_Status get_device_list(size_t *devices)
{
    for (int i = 0; i < g_count; i++)
        devices[i] = (size_t)i;
    return C_SUCCESS;
}

static C_Status device_memory_stats(const C_Device d, size_t *total, size_t *free_bytes)
{
    DEVICE(d);
    return check(P.mem_info(d->id, free_bytes, total), "mem_info");
}

static C_Status device_min_chunk_size(const C_Device d, size_t *size)
{
    (void)d;
    *size = 512;
    return C_SUCCESS;
}

static C_Status bool_true(const C_Device d, _Bool *supported)
{
    (void)d;
    *supported = 1;
    return C_SUCCESS;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static C_Status device_memory_allocate(const C_Device d, void **ptr, size_t size)
{
    PROF(device_memory_allocate);
    DEVICE(d);
    anychip_status rc = P.mem_alloc(d->id, size, ptr);
    if (rc == 0)
        return C_SUCCESS;
    if (rc == P.oom_status || P.oom_status == 0) {
        /* out of memory is success with no pointer, as cudaMalloc's failure is to Paddle's CUDA
         * allocator: Paddle's CustomAllocator then raises its out-of-memory error (BadAlloc, with
         * the request and the free memory), on which the auto_growth allocator frees the chunks
         * it keeps idle and tries again. A failed status would be an "External" error that
         * skips that retry: after freeing five 8 MiB tensors of a 64 MiB device, 40 MiB failed
         * until paddle.device.empty_cache(). */
        *ptr = NULL;
        return C_SUCCESS;
    }
    return check(rc, "mem_alloc");
}

static C_Status device_memory_deallocate(const C_Device d, void *ptr, size_t size)
{
    PROF(device_memory_deallocate);
    (void)size;
    DEVICE(d);
    /* as cudaFree: queued work may still use the memory (Paddle's allocator hands it back
     * when its cache is emptied, right after the ops that used it were enqueued), so the
     * free waits for every stream of the device with work pending (the copy fence) */
    TRY(fence(d->id), "the copy fence");
    return check(P.mem_free(d->id, ptr), "mem_free");
}

static C_Status sync_copy(int device, void *dst, const void *src, size_t size, anychip_copy_kind kind)
{
    PROF(sync_copy);
    if (!size)
        return C_SUCCESS;
    C_Status st = fence(device);
    return st != C_SUCCESS ? st : check(P.copy(device, dst, src, size, kind), "copy");
}

static C_Status memory_copy_h2d(const C_Device d, void *dst, const void *src, size_t size)
{
    DEVICE(d);
    return sync_copy(d->id, dst, src, size, ANYCHIP_COPY_H2D);
}

static C_Status memory_copy_d2h(const C_Device d, void *dst, const void *src, size_t size)
{
    DEVICE(d);
    return sync_copy(d->id, dst, src, size, ANYCHIP_COPY_D2H);
}

static C_Status memory_copy_d2d(const C_Device d, void *dst, const void *src, size_t size)
{
    DEVICE(d);
    return sync_copy(d->id, dst, src, size, ANYCHIP_COPY_D2D);
}

static C_Status memory_copy_p2p(const C_Device dst_d, const C_Device src_d, void *dst, const void *src,
                                size_t size)
{
    DEVICE(dst_d);
    DEVICE(src_d);
    if (dst_d->id == src_d->id)
        return sync_copy(dst_d->id, dst, src, size, ANYCHIP_COPY_D2D);
    void *host = malloc(size ? size : 1);
    if (!host)
        return C_FAILED;
    C_Status st = sync_copy(src_d->id, host, src, size, ANYCHIP_COPY_D2H);
    if (st == C_SUCCESS)
        st = sync_copy(dst_d->id, dst, host, size, ANYCHIP_COPY_H2D);
    free(host);
    return st;
}

static C_Status device_memory_set(const C_Device d, void *ptr, unsigned char value, size_t size)
{
    PROF(device_memory_set);
    DEVICE(d);
    if (!size)
        return C_SUCCESS;
    TRY(fence(d->id), "the copy fence");
    if (P.fill)
        return check(P.fill(d->id, ptr, value, size), "fill");
    unsigned char *host = malloc(size);
    if (!host)
        return C_FAILED;
    memset(host, value, size);
    C_Status st = check(P.copy(d->id, ptr, host, size, ANYCHIP_COPY_H2D), "copy");
    free(host);
    return st;
}

/* asynchronous H2D copies larger than this are synchronous (the stream's work, then the copy)
 * rather than staged */
#define STAGE_MAX ((size_t)64 << 20)

static C_Status async_copy(int device, C_Stream stream, void *dst, const void *src, size_t size,
                           anychip_copy_kind kind)
{
    PROF(async_copy);
    if (!size)
        return C_SUCCESS;
    stream_rec *r = REC(stream);
    int staged = kind == ANYCHIP_COPY_H2D && P.copy_async && P.event_create && size <= STAGE_MAX;
    C_Status st = enqueue_on(device, r);
    if (st != C_SUCCESS)
        return st;
    if (!P.copy_async || (kind == ANYCHIP_COPY_H2D && !staged)) {
        TRY(P.stream_synchronize(device, r->s), "stream_synchronize");
        return check(P.copy(device, dst, src, size, kind), "copy");
    }
    if (kind == ANYCHIP_COPY_D2H) {
        /* as CUDA's to pageable memory: the copy has completed when this returns (Paddle
         * reads a D2H destination, or frees it, without always waiting for the stream) */
        TRY(P.copy_async(device, dst, src, size, kind, r->s), "copy_async");
        return check(P.stream_synchronize(device, r->s), "stream_synchronize");
    }
    if (!staged)
        return check(P.copy_async(device, dst, src, size, kind, r->s), "copy_async");
    /* Paddle may free or reuse the host source as soon as this returns (its executor frees a
     * CPU tensor once the op that reads it has returned): the copy reads a staging buffer of
     * the bridge's, released once the copy has completed on the stream */
    later *x = later_get(&g_staged, device, size);
    if (!x) {
        TRY(P.stream_synchronize(device, r->s), "stream_synchronize");
        return check(P.copy(device, dst, src, size, kind), "copy");
    }
    memcpy(x->buf, src, size);
    x->bytes = size;
    st = check(P.copy_async(device, dst, x->buf, size, kind, r->s), "copy_async");
    if (st != C_SUCCESS) {
        later_recycle(&g_staged, x);
        return st;
    }
    later_add(&g_staged, x, r->s);
    return C_SUCCESS;
}

static C_Status async_memory_copy_h2d(const C_Device d, C_Stream stream, void *dst, const void *src, size_t size)
{
    DEVICE(d);
    return async_copy(d->id, stream, dst, src, size, ANYCHIP_COPY_H2D);
}

static C_Status async_memory_copy_d2h(const C_Device d, C_Stream stream, void *dst, const void *src, size_t size)
{
    DEVICE(d);
    return async_copy(d->id, stream, dst, src, size, ANYCHIP_COPY_D2H);
}

static C_Status async_memory_copy_d2d(const C_Device d, C_Stream stream, void *dst, const void *src, size_t size)
{
    DEVICE(d);
    return async_copy(d->id, stream, dst, src, size, ANYCHIP_COPY_D2D);
}

static C_Status async_memory_copy_p2p(const C_Device dst_d, const C_Device src_d, C_Stream stream, void *dst,
                                      const void *src, size_t size)
{
    DEVICE(src_d);
    TRY(P.stream_synchronize(src_d->id, REC(stream)->s), "stream_synchronize");
    return memory_copy_p2p(dst_d, src_d, dst, src, size);
}

/* ---- collectives -------------------------------------------------------------------------------- */

typedef struct bridge_comm {
    comm_rec rec;                         /* in the list comm_errors() asks */
    anychip_comm c;                       /* the plugin's communicator (NULL: the engine serves all) */
    void *eng;                            /* the engine's (ccl_comm *), made when first needed */
    int device, rank, nranks;
    unsigned char id[sizeof(anychip_unique_id)];
} bridge_comm;

#define COMM(comm) ((bridge_comm *)(comm))

static const char *const PD_TYPES[] = {"UNDEFINED", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                                       "INT16", "INT32", "INT64", "FLOAT16", "FLOAT32", "FLOAT64",
                                       "BFLOAT16", "COMPLEX64", "COMPLEX128"};
static const char *const PD_OPS[] __attribute__((unused)) = {"SUM", "AVG", "MAX", "MIN", "PRODUCT"};

/* Paddle dtype -> anychip dtype and element size; reducing ops need a real numeric type */
static C_Status pd_type(C_DataType t, int reducing, anychip_dtype *out, size_t *size, const char *fn)
{
    switch (t) {
    case INT8: *out = ANYCHIP_INT8; *size = 1; break;
    case UINT8: *out = ANYCHIP_UINT8; *size = 1; break;
    case INT32: *out = ANYCHIP_INT32; *size = 4; break;
    case INT64: *out = ANYCHIP_INT64; *size = 8; break;
    case FLOAT16: *out = ANYCHIP_FLOAT16; *size = 2; break;
    case BFLOAT16: *out = ANYCHIP_BFLOAT16; *size = 2; break;
    case FLOAT32: *out = ANYCHIP_FLOAT32; *size = 4; break;
    case FLOAT64: *out = ANYCHIP_FLOAT64; *size = 8; break;
    case BOOL: *out = ANYCHIP_UINT8; *size = 1; break;
    case UINT16: *out = ANYCHIP_UINT8; *size = 2; break;
    case UINT32: *out = ANYCHIP_UINT8; *size = 4; break;
    case UINT64: *out = ANYCHIP_UINT8; *size = 8; break;
    case COMPLEX64: *out = ANYCHIP_UINT8; *size = 8; break;
    case COMPLEX128: *out = ANYCHIP_UINT8; *size = 16; break;
    default:
        say("%s: data type %d is not a Paddle C_DataType", fn, (int)t);
        return C_ERROR;
    }
    if (reducing && (t == BOOL || t == UINT16 || t == UINT32 || t == UINT64 || t == COMPLEX64 ||
                     t == COMPLEX128)) {
        say("%s: %s cannot be reduced (int8, uint8, int32, int64, float16, bfloat16, float32, float64 can)", fn,
            PD_TYPES[t]);
        return C_ERROR;
    }
    return C_SUCCESS;
}

static C_Status pd_op(C_CCLReduceOp op, anychip_redop *out, const char *fn)
{
    static const anychip_redop OPS[] = {ANYCHIP_SUM, ANYCHIP_AVG, ANYCHIP_MAX, ANYCHIP_MIN, ANYCHIP_PROD};
    if ((unsigned)op > PRODUCT) {
        say("%s: reduce op %d is not a Paddle C_CCLReduceOp (SUM 0, AVG 1, MAX 2, MIN 3, PRODUCT 4)", fn, (int)op);
        return C_ERROR;
    }
    *out = OPS[op];
    return C_SUCCESS;
}

/* elements to pass for `count` Paddle elements of type t (types moved as bytes scale) */
static size_t pd_count(size_t count, anychip_dtype dt, size_t size)
{
    return dt == ANYCHIP_UINT8 ? count * size : count;
}

/* whether the plugin's collectives reduce this type with this op (plugin.h's rule) */
static int plugin_reduces(anychip_dtype dt, anychip_redop op) { return anychip_plugin_reduces(&P, dt, op); }

#ifdef ANYCHIP_PADDLE_CCL
static C_Status eng_attach(bridge_comm *bc);
static C_Status eng_all_reduce(void *, void *, size_t, C_DataType, C_CCLReduceOp, C_CCLComm, C_Stream);
static C_Status eng_reduce(void *, void *, size_t, C_DataType, C_CCLReduceOp, size_t, C_CCLComm, C_Stream);
static C_Status eng_reduce_scatter(void *, void *, size_t, C_DataType, C_CCLReduceOp, C_CCLComm, C_Stream);
#define UNREDUCED(fn, call)                                                                        \
    do {                                                                                           \
        if (!plugin_reduces(dt, rop))                                                              \
            return eng_attach(COMM(comm)) == C_SUCCESS ? (call) : C_FAILED;                        \
    } while (0)
#else
#define UNREDUCED(fn, call)                                                                        \
    do {                                                                                           \
        if (!plugin_reduces(dt, rop)) {                                                            \
            say("%s: this device's collectives do not reduce %s with %s", fn, PD_TYPES[t], PD_OPS[op]); \
            return C_ERROR;                                                                        \
        }                                                                                          \
    } while (0)
#endif

static C_Status enqueued(anychip_status rc, C_Stream stream, const char *what)
{
    if (stream)
        atomic_store(&REC(stream)->pending, 1);
    return check(rc, what);
}

static C_Status xccl_get_unique_id_size(size_t *size)
{
    *size = sizeof(anychip_unique_id);
    return C_SUCCESS;
}

static C_Status xccl_get_unique_id(C_CCLRootId *id)
{
    if (!id || !id->data || id->sz < sizeof(anychip_unique_id)) {
        say("xccl_get_unique_id: the id buffer holds %zu bytes; %zu are needed", id ? id->sz : 0,
            sizeof(anychip_unique_id));
        return C_ERROR;
    }
    return check(P.get_unique_id((anychip_unique_id *)id->data), "get_unique_id");
}

static C_Status xccl_comm_init_rank(size_t nranks, C_CCLRootId *id, size_t rank, C_CCLComm *comm)
{
    if (!id || id->sz < sizeof(anychip_unique_id) || rank >= nranks || nranks > INT_MAX) {
        say("xccl_comm_init_rank: rank %zu of %zu ranks, id of %zu bytes: want rank < nranks and a %zu-byte id",
            rank, nranks, id ? id->sz : 0, sizeof(anychip_unique_id));
        return C_ERROR;
    }
    bridge_comm *bc = calloc(1, sizeof *bc);
    if (!bc)
        return C_FAILED;
    bc->device = t_device;
    bc->rank = (int)rank;
    bc->nranks = (int)nranks;
    memcpy(bc->id, id->data, sizeof bc->id);
    C_Status st = check(P.comm_init_rank(t_device, (int)nranks, (const anychip_unique_id *)id->data, (int)rank,
                                         &bc->c), "comm_init_rank");
    if (st != C_SUCCESS) {
        free(bc);
        return st;
    }
    bc->rec.c = bc->c;
    bc->rec.rank = bc->rank;
    bc->rec.nranks = bc->nranks;
    comms_add(&bc->rec);
    *comm = (C_CCLComm)bc;
    return C_SUCCESS;
}

static void eng_detach(bridge_comm *bc);

static C_Status xccl_destroy_comm(C_CCLComm comm)
{
    bridge_comm *bc = COMM(comm);
    comms_remove(&bc->rec);
    C_Status st = check(P.comm_destroy(bc->c), "comm_destroy");
    eng_detach(bc);
    free(bc);
    return st;
}

static C_Status xccl_get_comm_name(C_CCLComm comm, char *name)
{
    snprintf(name, 128, "%s-rank%d-of-%d", g_type, COMM(comm)->rank, COMM(comm)->nranks);
    return C_SUCCESS;
}

static C_Status xccl_all_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                                C_CCLComm comm, C_Stream stream)
{
    PROF(xccl_all_reduce);
    anychip_dtype dt;
    anychip_redop rop;
    size_t size;
    if (pd_type(t, 1, &dt, &size, "all_reduce") || pd_op(op, &rop, "all_reduce"))
        return C_ERROR;
    UNREDUCED("all_reduce", eng_all_reduce(send, recv, count, t, op, comm, stream));
    return enqueued(P.all_reduce(send, recv, count, dt, rop, COMM(comm)->c, REC(stream)->s), stream, "all_reduce");
}

static C_Status missing(const char *op)
{
    say("%s: this device's collectives have no %s (plugin.h entry not set)", op, op);
    return C_FAILED;
}

static C_Status xccl_broadcast(void *buf, size_t count, C_DataType t, size_t root, C_CCLComm comm, C_Stream stream)
{
    PROF(xccl_broadcast);
    anychip_dtype dt;
    size_t size;
    if (!P.broadcast)
        return missing("broadcast");
    if (pd_type(t, 0, &dt, &size, "broadcast"))
        return C_ERROR;
    return enqueued(P.broadcast(buf, buf, pd_count(count, dt, size), dt, (int)root, COMM(comm)->c,
                                REC(stream)->s), stream, "broadcast");
}

static C_Status xccl_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op, size_t root,
                            C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    anychip_redop rop;
    size_t size;
    if (!P.reduce)
        return missing("reduce");
    if (pd_type(t, 1, &dt, &size, "reduce") || pd_op(op, &rop, "reduce"))
        return C_ERROR;
    UNREDUCED("reduce", eng_reduce(send, recv, count, t, op, root, comm, stream));
    return enqueued(P.reduce(send, recv, count, dt, rop, (int)root, COMM(comm)->c, REC(stream)->s), stream,
                    "reduce");
}

static C_Status xccl_all_gather(void *send, void *recv, size_t count, C_DataType t, C_CCLComm comm,
                                C_Stream stream)
{
    PROF(xccl_all_gather);
    anychip_dtype dt;
    size_t size;
    if (!P.all_gather)
        return missing("all_gather");
    if (pd_type(t, 0, &dt, &size, "all_gather"))
        return C_ERROR;
    return enqueued(P.all_gather(send, recv, pd_count(count, dt, size), dt, COMM(comm)->c, REC(stream)->s),
                    stream, "all_gather");
}

static C_Status xccl_reduce_scatter(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                                    C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    anychip_redop rop;
    size_t size;
    if (!P.reduce_scatter)
        return missing("reduce_scatter");
    if (pd_type(t, 1, &dt, &size, "reduce_scatter") || pd_op(op, &rop, "reduce_scatter"))
        return C_ERROR;
    UNREDUCED("reduce_scatter", eng_reduce_scatter(send, recv, count, t, op, comm, stream));
    return enqueued(P.reduce_scatter(send, recv, count, dt, rop, COMM(comm)->c, REC(stream)->s), stream,
                    "reduce_scatter");
}

static int has_p2p(void) { return P.send && P.recv && P.group_start && P.group_end; }

static C_Status xccl_group_start(void)
{
    return has_p2p() ? check(P.group_start(), "group_start") : C_SUCCESS;
}

static C_Status xccl_group_end(void)
{
    return has_p2p() ? check(P.group_end(), "group_end") : C_SUCCESS;
}

static C_Status xccl_send(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    size_t size;
    if (!has_p2p())
        return missing("send");
    if (pd_type(t, 0, &dt, &size, "send"))
        return C_ERROR;
    return enqueued(P.send(buf, pd_count(count, dt, size), dt, (int)peer, COMM(comm)->c, REC(stream)->s), stream,
                    "send");
}

static C_Status xccl_recv(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    anychip_dtype dt;
    size_t size;
    if (!has_p2p())
        return missing("recv");
    if (pd_type(t, 0, &dt, &size, "recv"))
        return C_ERROR;
    return enqueued(P.recv(buf, pd_count(count, dt, size), dt, (int)peer, COMM(comm)->c, REC(stream)->s), stream,
                    "recv");
}

/* Paddle passes one buffer per peer (their counts may differ): a group of sends and receives,
 * the local block copied on the stream; without point-to-point, equal contiguous blocks go to
 * the plugin's all_to_all. */
static C_Status xccl_all_to_all(const void **send, const size_t *send_count, const C_DataType *send_t, void **recv,
                                const size_t *recv_count, const C_DataType *recv_t, size_t rank, size_t nranks,
                                C_CCLComm comm, C_Stream stream)
{
    bridge_comm *bc = COMM(comm);
    anychip_dtype dt;
    size_t size;
    if (pd_type(send_t[0], 0, &dt, &size, "all_to_all"))
        return C_ERROR;
    for (size_t i = 0; i < nranks; i++)
        if (send_t[i] != send_t[0] || recv_t[i] != send_t[0]) {
            say("all_to_all: every block must have one data type (block %zu differs)", i);
            return C_ERROR;
        }
    if (has_p2p()) {
        TRY(P.group_start(), "group_start");
        anychip_status rc = 0;
        for (size_t i = 0; i < nranks && rc == 0; i++) {
            if (i == rank)
                continue;
            if (send_count[i])
                rc = P.send(send[i], send_count[i] * size, ANYCHIP_UINT8, (int)i, bc->c, REC(stream)->s);
            if (rc == 0 && recv_count[i])
                rc = P.recv(recv[i], recv_count[i] * size, ANYCHIP_UINT8, (int)i, bc->c, REC(stream)->s);
        }
        anychip_status end = P.group_end();
        TRY(rc ? rc : end, "all_to_all's send / recv");
        return async_copy(bc->device, stream, recv[rank], send[rank], send_count[rank] * size, ANYCHIP_COPY_D2D);
    }
    if (!P.all_to_all)
        return missing("all_to_all");
    size_t block = send_count[0] * size;
    for (size_t i = 0; i < nranks; i++)
        if (send_count[i] != send_count[0] || recv_count[i] != send_count[0] ||
            (const char *)send[i] != (const char *)send[0] + i * block ||
            (char *)recv[i] != (char *)recv[0] + i * block) {
            say("all_to_all: this device has no send / recv, so the blocks must be equal and contiguous");
            return C_ERROR;
        }
    return enqueued(P.all_to_all(send[0], recv[0], block, ANYCHIP_UINT8, bc->c, REC(stream)->s), stream,
                    "all_to_all");
}

/* ---- collectives of a plugin without them: anychip's shared-memory engine, host-staged ------ */

#ifdef ANYCHIP_PADDLE_CCL
#include "ccl/ccl.h"

static struct {
    int (*comm_init)(const char *, int, int, double, ccl_comm **);
    const char *(*init_error)(void);
    int (*comm_destroy)(ccl_comm *);
    int (*run)(ccl_comm *, const ccl_op *, int);
    const char *(*comm_error)(const ccl_comm *);
} E;

typedef struct staged {
    ccl_op op;
    void *dev_recv;                       /* device buffer the host result goes to */
    size_t recv_bytes;
    int device;
} staged;

#define GROUP_MAX 256
static __thread staged t_group[GROUP_MAX];
static __thread int t_group_n, t_group_depth;

static int resolve(const char *path, char *out, size_t len);

static int load_engine(void)
{
    char path[PATH_MAX];
    if (E.comm_init)
        return 0;
    if (resolve(ANYCHIP_PADDLE_CCL, path, sizeof path) != 0)
        return -1;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        say("cannot load anychip's collective engine %s: %s", path, dlerror());
        return -1;
    }
    *(void **)&E.comm_init = dlsym(lib, "ccl_comm_init");
    *(void **)&E.init_error = dlsym(lib, "ccl_init_error");
    *(void **)&E.comm_destroy = dlsym(lib, "ccl_comm_destroy");
    *(void **)&E.run = dlsym(lib, "ccl_run");
    *(void **)&E.comm_error = dlsym(lib, "ccl_comm_error");
    if (!E.comm_init || !E.init_error || !E.comm_destroy || !E.run || !E.comm_error) {
        say("%s lacks the engine's entry points (ccl_comm_init, ccl_run, ...)", path);
        E.comm_init = NULL;
        return -1;
    }
    return 0;
}

static C_Status eng_unique_id(C_CCLRootId *id)
{
    static atomic_ulong counter;
    if (!id || !id->data || id->sz < sizeof(anychip_unique_id)) {
        say("xccl_get_unique_id: the id buffer holds %zu bytes; %zu are needed", id ? id->sz : 0,
            sizeof(anychip_unique_id));
        return C_ERROR;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id->data, 0, id->sz);
    snprintf((char *)id->data, sizeof(anychip_unique_id), "pd-%s-%d-%llx-%lu", g_type, (int)getpid(),
             (unsigned long long)(ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec),
             atomic_fetch_add(&counter, 1));
    return C_SUCCESS;
}

static C_Status eng_comm_init(size_t nranks, C_CCLRootId *id, size_t rank, C_CCLComm *comm)
{
    if (!id || id->sz < sizeof(anychip_unique_id) || rank >= nranks || nranks > CCL_MAX_RANKS) {
        say("xccl_comm_init_rank: rank %zu of %zu ranks: want rank < nranks <= %d", rank, nranks, CCL_MAX_RANKS);
        return C_ERROR;
    }
    bridge_comm *bc = calloc(1, sizeof *bc);
    if (!bc)
        return C_FAILED;
    char name[sizeof(anychip_unique_id) + 1];
    memcpy(name, id->data, sizeof(anychip_unique_id));
    name[sizeof(anychip_unique_id)] = 0;
    ccl_comm *c = NULL;
    if (E.comm_init(name, (int)rank, (int)nranks, 0, &c) != CCL_OK) {
        say("rank %zu of %zu: the collective engine's init failed: %s", rank, nranks, E.init_error());
        free(bc);
        return C_FAILED;
    }
    bc->eng = c;
    bc->device = t_device;
    bc->rank = (int)rank;
    bc->nranks = (int)nranks;
    *comm = (C_CCLComm)bc;
    return C_SUCCESS;
}

static C_Status eng_destroy(C_CCLComm comm)
{
    eng_detach(COMM(comm));
    free(COMM(comm));
    return C_SUCCESS;
}

/* An engine communicator beside the plugin's, for the reductions the plugin lacks: every rank
 * makes it at the same op (the choice depends only on the op's type and reduce op), named
 * after the plugin communicator's id. */
static C_Status eng_attach(bridge_comm *bc)
{
    if (bc->eng)
        return C_SUCCESS;
    if (!E.comm_init) {
        say("this device's collectives lack a reduction and anychip's engine is not loaded");
        return C_FAILED;
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < sizeof bc->id; k++)
        h = (h ^ bc->id[k]) * 1099511628211ull;
    char name[64];
    snprintf(name, sizeof name, "pd-%016llx-%d", (unsigned long long)h, bc->nranks);
    ccl_comm *c = NULL;
    if (E.comm_init(name, bc->rank, bc->nranks, 0, &c) != CCL_OK) {
        say("rank %d of %d: the collective engine's init failed: %s", bc->rank, bc->nranks, E.init_error());
        return C_FAILED;
    }
    bc->eng = c;
    return C_SUCCESS;
}

static C_Status eng_fail(bridge_comm *bc, const char *what)
{
    say("rank %d of %d: %s failed: %s", bc->rank, bc->nranks, what, E.comm_error((ccl_comm *)bc->eng));
    return C_FAILED;
}

/* Stage one op: the stream drained, `send_bytes` of dev_send copied to host; the host result
 * of `recv_bytes` goes back to dev_recv after the run. */
static C_Status eng_stage(bridge_comm *bc, C_Stream stream, ccl_op *op, const void *dev_send, size_t send_bytes,
                          void *dev_recv, size_t recv_bytes, staged *out)
{
    TRY(P.stream_synchronize(bc->device, REC(stream)->s), "stream_synchronize");
    atomic_store(&REC(stream)->pending, 0);
    void *hs = send_bytes ? malloc(send_bytes) : NULL;
    void *hr = recv_bytes ? malloc(recv_bytes) : NULL;
    if ((send_bytes && !hs) || (recv_bytes && !hr)) {
        free(hs);
        free(hr);
        return C_FAILED;
    }
    if (send_bytes) {
        C_Status st = check(P.copy(bc->device, hs, dev_send, send_bytes, ANYCHIP_COPY_D2H), "copy");
        if (st != C_SUCCESS) {
            free(hs);
            free(hr);
            return st;
        }
    }
    op->send.ptr = hs;
    op->recv.ptr = hr;
    out->op = *op;
    out->dev_recv = dev_recv;
    out->recv_bytes = recv_bytes;
    out->device = bc->device;
    return C_SUCCESS;
}

static C_Status eng_finish(staged *ops, int n, C_Status st)
{
    for (int i = 0; i < n; i++) {
        if (st == C_SUCCESS && ops[i].recv_bytes)
            st = check(P.copy(ops[i].device, ops[i].dev_recv, ops[i].op.recv.ptr, ops[i].recv_bytes,
                              ANYCHIP_COPY_H2D), "copy");
        free(ops[i].op.send.ptr);
        free(ops[i].op.recv.ptr);
    }
    return st;
}

/* run one staged op now, or keep it for group_end */
static C_Status eng_go(bridge_comm *bc, staged *s, const char *what)
{
    if (t_group_depth > 0) {
        if (t_group_n == GROUP_MAX) {
            eng_finish(s, 1, C_FAILED);
            say("%s: more than %d ops in one group", what, GROUP_MAX);
            return C_FAILED;
        }
        t_group[t_group_n++] = *s;
        return C_SUCCESS;
    }
    C_Status st = E.run((ccl_comm *)bc->eng, &s->op, 1) == CCL_OK ? C_SUCCESS : eng_fail(bc, what);
    return eng_finish(s, 1, st);
}

static ccl_comm *t_group_comm;

static C_Status eng_group_start(void)
{
    t_group_depth++;
    return C_SUCCESS;
}

static C_Status eng_group_end(void)
{
    if (t_group_depth == 0) {
        say("xccl_group_end without xccl_group_start");
        return C_ERROR;
    }
    if (--t_group_depth > 0 || t_group_n == 0)
        return C_SUCCESS;
    ccl_op ops[GROUP_MAX];
    for (int i = 0; i < t_group_n; i++)
        ops[i] = t_group[i].op;
    int n = t_group_n;
    t_group_n = 0;
    C_Status st = C_SUCCESS;
    if (E.run(t_group_comm, ops, n) != CCL_OK) {
        say("a group of %d send / recv failed: %s", n, E.comm_error(t_group_comm));
        st = C_FAILED;
    }
    return eng_finish(t_group, n, st);
}

static C_Status eng_types(C_DataType t, int reducing, int *dtype, size_t *size, const char *fn)
{
    anychip_dtype dt;
    C_Status st = pd_type(t, reducing, &dt, size, fn);
    *dtype = (int)dt;                     /* anychip_dtype and ccl_dtype share values */
    return st;
}

static C_Status eng_all_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                               C_CCLComm comm, C_Stream stream)
{
    static const int OPS[] = {CCL_SUM, CCL_AVG, CCL_MAX, CCL_MIN, CCL_PROD};
    int dt;
    size_t size;
    if (eng_types(t, 1, &dt, &size, "all_reduce") || (unsigned)op > PRODUCT)
        return C_ERROR;
    ccl_op o = {.kind = CCL_ALL_REDUCE, .dtype = dt, .redop = OPS[op], .count = count};
    staged s;
    TRY(eng_stage(COMM(comm), stream, &o, send, count * size, recv, count * size, &s), "staging");
    return eng_go(COMM(comm), &s, "all_reduce");
}

static C_Status eng_broadcast(void *buf, size_t count, C_DataType t, size_t root, C_CCLComm comm, C_Stream stream)
{
    int dt;
    size_t size;
    if (eng_types(t, 0, &dt, &size, "broadcast"))
        return C_ERROR;
    size_t n = count * (dt == CCL_UINT8 ? size : 1), bytes = count * size;
    ccl_op o = {.kind = CCL_BROADCAST, .dtype = dt, .root = (int)root, .count = n};
    staged s;
    TRY(eng_stage(COMM(comm), stream, &o, buf, bytes, buf, bytes, &s), "staging");
    return eng_go(COMM(comm), &s, "broadcast");
}

static C_Status eng_reduce(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op, size_t root,
                           C_CCLComm comm, C_Stream stream)
{
    static const int OPS[] = {CCL_SUM, CCL_AVG, CCL_MAX, CCL_MIN, CCL_PROD};
    int dt;
    size_t size;
    if (eng_types(t, 1, &dt, &size, "reduce") || (unsigned)op > PRODUCT)
        return C_ERROR;
    int me = COMM(comm)->rank == (int)root;
    ccl_op o = {.kind = CCL_REDUCE, .dtype = dt, .redop = OPS[op], .root = (int)root, .count = count};
    staged s;
    TRY(eng_stage(COMM(comm), stream, &o, send, count * size, recv, count * size, &s), "staging");
    if (!me)
        s.recv_bytes = 0;                 /* only the root's recv holds the result */
    return eng_go(COMM(comm), &s, "reduce");
}

static C_Status eng_all_gather(void *send, void *recv, size_t count, C_DataType t, C_CCLComm comm,
                               C_Stream stream)
{
    int dt;
    size_t size;
    if (eng_types(t, 0, &dt, &size, "all_gather"))
        return C_ERROR;
    bridge_comm *bc = COMM(comm);
    size_t n = count * (dt == CCL_UINT8 ? size : 1);
    ccl_op o = {.kind = CCL_ALL_GATHER, .dtype = dt, .count = n};
    staged s;
    TRY(eng_stage(bc, stream, &o, send, count * size, recv, count * size * (size_t)bc->nranks, &s), "staging");
    return eng_go(bc, &s, "all_gather");
}

static C_Status eng_reduce_scatter(void *send, void *recv, size_t count, C_DataType t, C_CCLReduceOp op,
                                   C_CCLComm comm, C_Stream stream)
{
    static const int OPS[] = {CCL_SUM, CCL_AVG, CCL_MAX, CCL_MIN, CCL_PROD};
    int dt;
    size_t size;
    if (eng_types(t, 1, &dt, &size, "reduce_scatter") || (unsigned)op > PRODUCT)
        return C_ERROR;
    bridge_comm *bc = COMM(comm);
    ccl_op o = {.kind = CCL_REDUCE_SCATTER, .dtype = dt, .redop = OPS[op], .count = count};
    staged s;
    TRY(eng_stage(bc, stream, &o, send, count * size * (size_t)bc->nranks, recv, count * size, &s), "staging");
    return eng_go(bc, &s, "reduce_scatter");
}

static C_Status eng_p2p(int kind, void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm,
                        C_Stream stream)
{
    int dt;
    size_t size;
    const char *what = kind == CCL_SEND ? "send" : "recv";
    if (eng_types(t, 0, &dt, &size, what))
        return C_ERROR;
    bridge_comm *bc = COMM(comm);
    size_t n = count * (dt == CCL_UINT8 ? size : 1), bytes = count * size;
    ccl_op o = {.kind = kind, .dtype = dt, .root = (int)peer, .count = n};
    staged s;
    TRY(eng_stage(bc, stream, &o, kind == CCL_SEND ? buf : NULL, kind == CCL_SEND ? bytes : 0,
                  kind == CCL_RECV ? buf : NULL, kind == CCL_RECV ? bytes : 0, &s), "staging");
    if (t_group_depth > 0)
        t_group_comm = (ccl_comm *)bc->eng;
    return eng_go(bc, &s, what);
}

static C_Status eng_send(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    return eng_p2p(CCL_SEND, buf, count, t, peer, comm, stream);
}

static C_Status eng_recv(void *buf, size_t count, C_DataType t, size_t peer, C_CCLComm comm, C_Stream stream)
{
    return eng_p2p(CCL_RECV, buf, count, t, peer, comm, stream);
}

static C_Status eng_all_to_all(const void **send, const size_t *send_count, const C_DataType *send_t, void **recv,
                               const size_t *recv_count, const C_DataType *recv_t, size_t rank, size_t nranks,
                               C_CCLComm comm, C_Stream stream)
{
    (void)recv_t;
    TRY(eng_group_start(), "group_start");
    C_Status st = C_SUCCESS;
    for (size_t i = 0; i < nranks && st == C_SUCCESS; i++) {
        if (i == rank)
            continue;
        if (send_count[i])
            st = eng_send((void *)send[i], send_count[i], send_t[i], i, comm, stream);
        if (st == C_SUCCESS && recv_count[i])
            st = eng_recv(recv[i], recv_count[i], send_t[i], i, comm, stream);
    }
    C_Status end = eng_group_end();
    if (st != C_SUCCESS || end != C_SUCCESS)
        return st != C_SUCCESS ? st : end;
    anychip_dtype dt;
    size_t size;
    TRY(pd_type(send_t[0], 0, &dt, &size, "all_to_all") ? 1 : 0, "all_to_all");
    return sync_copy(COMM(comm)->device, recv[rank], send[rank], send_count[rank] * size, ANYCHIP_COPY_D2D);
}

static void fill_engine(C_DeviceInterface *i)
{
    if (load_engine() != 0)
        return;
    i->xccl_get_comm_name = xccl_get_comm_name;
    i->xccl_get_unique_id_size = xccl_get_unique_id_size;
    i->xccl_get_unique_id = eng_unique_id;
    i->xccl_comm_init_rank = eng_comm_init;
    i->xccl_destroy_comm = eng_destroy;
    i->xccl_all_reduce = eng_all_reduce;
    i->xccl_broadcast = eng_broadcast;
    i->xccl_reduce = eng_reduce;
    i->xccl_all_gather = eng_all_gather;
    i->xccl_reduce_scatter = eng_reduce_scatter;
    i->xccl_group_start = eng_group_start;
    i->xccl_group_end = eng_group_end;
    i->xccl_send = eng_send;
    i->xccl_recv = eng_recv;
    i->xccl_all_to_all = eng_all_to_all;
}
#endif

#ifdef ANYCHIP_PADDLE_CCL
static void eng_detach(bridge_comm *bc)
{
    if (bc->eng)
        E.comm_destroy((ccl_comm *)bc->eng);
    bc->eng = NULL;
}
#else
static void eng_detach(bridge_comm *bc) { (void)bc; }
#endif

/* ---- loading the plugin and InitPlugin ------------------------------------------------------------ */

#ifdef ANYCHIP_PADDLE_SIMULATORS
#include <dirent.h>

/* A C plugin's bridge (`anychip plugin paddle`: libanychip_<name>.so, not libanychip_sim*)
 * in the directory Paddle loaded this library from, its file name in `buf`; 0 when none. */
static int plugin_bridge_beside(char *buf, size_t len)
{
    Dl_info info;
    if (!dladdr((void *)plugin_bridge_beside, &info) || !info.dli_fname)
        return 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);   /* the path Paddle opened, not the real one */
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        found = strncmp(e->d_name, "libanychip_", 11) == 0 && strncmp(e->d_name, "libanychip_sim", 14) != 0 &&
                n > 3 && strcmp(e->d_name + n - 3, ".so") == 0;
        if (found)
            snprintf(buf, len, "%s", e->d_name);
    }
    closedir(d);
    return found;
}

/* set by InitPlugin: Paddle is loading this library (not a tool asking for its kernel table) */
static int g_paddle_loading;

/* The simulated chip ANYCHIP_PADDLE names (the first of them), NULL for none; `buf` holds the
 * name. Unset, the simulated Ascend -- unless Paddle loads this library beside a C plugin's
 * bridge: then that chip is the device the user chose, and Paddle's launcher, which takes the
 * first device type, must not run the job on a simulated chip instead (none is registered). */
static const char *chosen_simulator(char *buf, size_t len)
{
    static const char *const CHIPS[] = {"ascend", "kunlun", "hygon"};
    const char *v = getenv("ANYCHIP_PADDLE");
    if (!v) {
        char other[256];
        if (g_paddle_loading && plugin_bridge_beside(other, sizeof other)) {
            say("ANYCHIP_PADDLE is unset and the C plugin bridge %s lies beside this library: that plugin "
                "is Paddle's anychip device and no simulated chip is registered (ANYCHIP_PADDLE=ascend, "
                "kunlun or hygon registers one)", other);
            return NULL;
        }
        return "ascend";
    }
    for (const char *p = v; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',' && *end != ' ')
            end++;
        for (size_t i = 0; i < sizeof CHIPS / sizeof *CHIPS; i++)
            if ((size_t)(end - p) == strlen(CHIPS[i]) && strncasecmp(p, CHIPS[i], end - p) == 0) {
                snprintf(buf, len, "%s", CHIPS[i]);
                return buf;
            }
        if (end > p && !(end - p == 4 && strncasecmp(p, "none", 4) == 0))
            say("ANYCHIP_PADDLE=%s: %.*s is not a simulated chip (ascend, kunlun, hygon or none)", v,
                (int)(end - p), p);
        p = end;
    }
    return NULL;
}
#endif

/* `path` itself when absolute, else relative to the directory of this library (its real path) */
static int resolve(const char *path, char *out, size_t len)
{
    if (path[0] == '/') {
        snprintf(out, len, "%s", path);
        return 0;
    }
    Dl_info info;
    if (!dladdr((void *)resolve, &info) || !info.dli_fname) {
        say("cannot find this library's own path (dladdr)");
        return -1;
    }
    char dir[PATH_MAX];
    if (!realpath(info.dli_fname, dir))   /* a symlink to the bridge: the directory it lies in */
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    if ((size_t)snprintf(out, len, "%.*s/%s", PATH_MAX / 2, dir, path) >= len) {
        say("the path %s/%s is longer than %zu bytes", dir, path, len);
        return -1;
    }
    return 0;
}

static int load_target(void)
{
#ifdef ANYCHIP_PADDLE_SIMULATORS
    char chip[16], pattern[PATH_MAX];
    if (!chosen_simulator(chip, sizeof chip))
        return -1;
    const char *use = getenv("ANYCHIP_PADDLE") ? chip : "ascend";
    snprintf(pattern, sizeof pattern, ANYCHIP_PADDLE_SIMULATORS, use);
    const char *target = pattern;
#else
    const char *target = ANYCHIP_PADDLE_TARGET;
#endif
    if (resolve(target, g_target, sizeof g_target) != 0)
        return -1;
    void *lib = dlopen(g_target, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        Dl_info self;
        if (access(g_target, F_OK) != 0 && dladdr((void *)load_target, &self) && self.dli_fname)
            say("the anychip plugin %s is gone (its package uninstalled?): remove this bridge, %s, or rebuild it "
                "with `anychip plugin paddle NAME`", g_target, self.dli_fname);
        else
            say("cannot load the anychip plugin %s: %s", g_target, dlerror());
        return -1;
    }
    g_lib = lib;
    anychip_plugin_init_fn init = (anychip_plugin_init_fn)dlsym(lib, ANYCHIP_PLUGIN_INIT_SYMBOL);
    if (!init) {
        say("%s exports no %s (not an anychip/plugin.h library)", g_target, ANYCHIP_PLUGIN_INIT_SYMBOL);
        return -1;
    }
    memset(&P, 0, sizeof P);
    P.struct_size = sizeof P;
    anychip_status rc = init(&P);
    if (rc != 0) {
        say("%s: %s failed with status %d", g_target, ANYCHIP_PLUGIN_INIT_SYMBOL, (int)rc);
        return -1;
    }
    if (P.major != ANYCHIP_PLUGIN_API_MAJOR) {
        say("%s is built for plugin ABI %u.%u; this bridge implements %d.%d", g_target, P.major, P.minor,
            ANYCHIP_PLUGIN_API_MAJOR, ANYCHIP_PLUGIN_API_MINOR);
        return -1;
    }
    if (!P.device_count || !P.mem_info || !P.mem_alloc || !P.mem_free || !P.copy || !P.stream_create ||
        !P.stream_destroy || !P.stream_synchronize) {
        say("%s lacks a required plugin.h entry", g_target);
        return -1;
    }
    if (P.event_create && !(P.event_destroy && P.event_record && P.event_synchronize)) {
        say("%s sets event_create without event_destroy / record / synchronize", g_target);
        return -1;
    }
    char name[ANYCHIP_DEVICE_TYPE_MAX];
    memcpy(name, P.device_type, sizeof name);
    name[sizeof name - 1] = 0;
    snprintf(g_type, sizeof g_type, "anychip_%s", name);
    rc = P.device_count(&g_count);
    if (rc != 0) {
        check(rc, "device_count");
        return -1;
    }
    if (g_count > MAX_DEVICES)
        g_count = MAX_DEVICES;
    return 0;
}

/* the path of the plugin.h library this copy serves, and its Paddle device type (for tools) */
EXPORT const char *anychip_paddle_target(void) { return g_target; }
EXPORT const char *anychip_paddle_device_type(void) { return g_type; }

static void fill_collectives(C_DeviceInterface *i)
{
#ifdef ANYCHIP_PADDLE_CCL
    if (P.ccl_dtype_mask || P.ccl_redop_mask || (P.minor >= 2 && P.ccl_op_dtype_masks))
        load_engine();                    /* the reductions the plugin lacks run on the engine */
#endif
    if (!(P.get_unique_id && P.comm_init_rank && P.comm_destroy && P.all_reduce)) {
#ifdef ANYCHIP_PADDLE_CCL
        fill_engine(i);
#endif
        return;
    }
    i->xccl_get_comm_name = xccl_get_comm_name;
    i->xccl_get_unique_id_size = xccl_get_unique_id_size;
    i->xccl_get_unique_id = xccl_get_unique_id;
    i->xccl_comm_init_rank = xccl_comm_init_rank;
    i->xccl_destroy_comm = xccl_destroy_comm;
    i->xccl_all_reduce = xccl_all_reduce;
    i->xccl_broadcast = xccl_broadcast;
    i->xccl_reduce = xccl_reduce;
    i->xccl_all_gather = xccl_all_gather;
    i->xccl_reduce_scatter = xccl_reduce_scatter;
    i->xccl_group_start = xccl_group_start;
    i->xccl_group_end = xccl_group_end;
    i->xccl_send = xccl_send;
    i->xccl_recv = xccl_recv;
    i->xccl_all_to_all = xccl_all_to_all;
}

/* the plugin, loaded once per process: by InitPlugin, or by a tool asking for the kernel table */
static pthread_once_t g_target_once = PTHREAD_ONCE_INIT;
static int g_target_ok;

static void load_target_once(void) { g_target_ok = load_target() == 0; }

static int target_ready(void)
{
    pthread_once(&g_target_once, load_target_once);
    return g_target_ok;
}

#ifdef ANYCHIP_PADDLE_KERNELS
static void register_kernels(void);
static void fill_profiler(C_DeviceInterface *i);
#else
/* why this bridge registers no kernels (`anychip info`): it was built without the kernel layer */
#ifndef ANYCHIP_PADDLE_NO_KERNELS
#define ANYCHIP_PADDLE_NO_KERNELS "the bridge was built without its kernel layer"
#endif
EXPORT const char *anychip_paddle_kernel_note(void) { return ANYCHIP_PADDLE_NO_KERNELS; }
#endif

EXPORT void InitPlugin(struct CustomRuntimeParams *params)
{
    if (!params || params->size < sizeof *params || !params->interface ||
        params->interface->size < sizeof(C_DeviceInterface)) {
        say("InitPlugin: Paddle passed structs of %zu / %zu bytes; this bridge is built for %zu / %zu "
            "(device_ext.h %d.%d.%d)", params ? params->size : 0,
            params && params->interface ? params->interface->size : 0, sizeof *params, sizeof(C_DeviceInterface),
            ANYCHIP_PADDLE_RUNTIME_MAJOR, ANYCHIP_PADDLE_RUNTIME_MINOR, ANYCHIP_PADDLE_RUNTIME_PATCH);
        return;
    }
    const char *prof = getenv("ANYCHIP_PADDLE_PROFILE");
    g_prof = prof && strcmp(prof, "1") == 0;
    if (g_prof)
        atexit(prof_report);
    params->version.major = ANYCHIP_PADDLE_RUNTIME_MAJOR;
    params->version.minor = ANYCHIP_PADDLE_RUNTIME_MINOR;
    params->version.patch = ANYCHIP_PADDLE_RUNTIME_PATCH;
#ifdef ANYCHIP_PADDLE_SIMULATORS
    g_paddle_loading = 1;
#endif
    if (!target_ready())
        return;                           /* device_type stays NULL: Paddle skips the library */
    params->device_type = g_type;
    params->sub_device_type = g_type + strlen("anychip_");

    C_DeviceInterface *i = params->interface;
    i->initialize = initialize;
    i->finalize = finalize;
    i->init_device = init_device;
    i->set_device = set_device;
    i->get_device = get_device;
    i->deinit_device = deinit_device;
    i->create_stream = create_stream;
    i->destroy_stream = destroy_stream;
    i->query_stream = query_stream;
    i->create_event = create_event;
    i->record_event = record_event;
    i->destroy_event = destroy_event;
    i->query_event = query_event;
    i->synchronize_device = synchronize_device;
    i->synchronize_stream = synchronize_stream;
    i->synchronize_event = synchronize_event;
    i->stream_wait_event = stream_wait_event;
    i->device_memory_allocate = device_memory_allocate;
    i->device_memory_deallocate = device_memory_deallocate;
    i->device_memory_set = device_memory_set;
    i->memory_copy_h2d = memory_copy_h2d;
    i->memory_copy_d2h = memory_copy_d2h;
    i->memory_copy_d2d = memory_copy_d2d;
    i->memory_copy_p2p = memory_copy_p2p;
    i->async_memory_copy_h2d = async_memory_copy_h2d;
    i->async_memory_copy_d2h = async_memory_copy_d2h;
    i->async_memory_copy_d2d = async_memory_copy_d2d;
    i->async_memory_copy_p2p = async_memory_copy_p2p;
    i->get_device_count = get_device_count;
    i->get_device_list = get_device_list;
    i->device_memory_stats = device_memory_stats;
    i->device_min_chunk_size = device_min_chunk_size;
    i->is_float16_supported = bool_true;
    i->is_bfloat16_supported = bool_true;
    fill_collectives(i);
#ifdef ANYCHIP_PADDLE_KERNELS
    register_kernels();                   /* the device's phi kernels, from the plugin's kernel table */
    fill_profiler(i);                     /* Paddle's profiler: the kernels and copies on its timeline */
#endif
}

#ifdef ANYCHIP_PADDLE_KERNELS
#include "anychip/paddle/profiler.c"
#include "anychip/paddle/kernels.c"
#endif
