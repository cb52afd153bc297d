/*
 * Paddle's profiler on the bridge's device (the profiler_* entries of C_DeviceInterface): with
 * `paddle.profiler` and the custom-device target, every primitive the kernel layer (kernels.c)
 * enqueues and every copy and memset Paddle asks for is an event on Paddle's timeline, as
 * CUPTI's kernels and memcpys are for CUDA. Linked with kernels.c (ANYCHIP_PADDLE_KERNELS: the
 * events are C++ objects, built by kernels_throw.cc).
 *
 * While Paddle traces, a primitive or asynchronous copy is bracketed by two plugin events
 * recorded on its stream; at collection their elapsed times from a base event give its start
 * and duration on the device. The base event is recorded once per device and tracing run on
 * an idle stream of the bridge's own, and mapped to the host's CLOCK_REALTIME (Paddle's
 * clock, phi::PosixInNsec) when its synchronize returns, so a device event is never placed
 * before the host call that enqueued it. Synchronous copies and memsets run while the host
 * waits: their device span is the call's, after the copy fence (which the wrapper runs first,
 * so the wait for earlier work is not counted as the copy's).
 *
 * Each device event comes with a runtime event on the enqueuing thread (the host's span of the
 * enqueue, the same correlation id), which is how Paddle's trace tree attaches device work to
 * the operator that issued it (NodeTrees::BuildTrees matches them by correlation id).
 *
 * Paddle asks for this only while a profiler runs; otherwise each traced call costs one
 * relaxed atomic load. A plugin without timed events (event_create, event_record,
 * event_synchronize, event_elapsed_ms) leaves the entries unset, and Paddle says
 * "ProfilerInitialize is not implemented".
 */
#include "bridge.h"

#include <sys/syscall.h>

/* the two events of kernels_throw.cc: Paddle's phi::RuntimeTraceEvent / phi::DeviceTraceEvent
 * built and handed to profiler_add_runtime_trace_event / profiler_add_device_trace_event */
int anychip_paddle_trace_runtime(void *prof, const char *name, uint64_t start_ns, uint64_t end_ns, uint64_t pid,
                                 uint64_t tid, uint32_t correlation);
int anychip_paddle_trace_device(void *prof, const char *name, int type, uint64_t start_ns, uint64_t end_ns,
                                uint64_t device, uint64_t stream, uint32_t correlation, uint64_t bytes,
                                const char *copy_kind, const char *src_kind, const char *dst_kind, uint32_t value);

enum { TRACE_KERNEL = 4, TRACE_MEMCPY = 5, TRACE_MEMSET = 6 };     /* phi::TracerEventType */
static const char *const TC_KIND[TC_N] = {"HtoD", "DtoH", "DtoD"};
static const char *const TC_SRC[TC_N] = {"Pageable", "Device", "Device"};
static const char *const TC_DST[TC_N] = {"Device", "Pageable", "Device"};
#define TRACE_MAX_RECORDS (1u << 20)      /* per tracing run: about 200 MiB at most */

typedef struct {
    anychip_event a, b;                   /* around the work on its stream; NULL: timed on the host */
    int device, what;                     /* TC_H2D .. TW_KERNEL */
    uint32_t corr;
    uint64_t host_start, host_end, stream, tid, bytes;
    char name[96];
} trace_rec;

static atomic_int g_tracing;
static pthread_mutex_t g_trace_lock = PTHREAD_MUTEX_INITIALIZER;
static trace_rec *g_trace;
static size_t g_ntrace, g_trace_cap, g_trace_dropped;
static atomic_uint g_trace_corr;
static struct {
    anychip_event e;
    uint64_t ns;                          /* CLOCK_REALTIME of the base event */
    int state;                            /* 0: not yet, 1: calibrated, -1: failed this run */
} g_base[MAX_DEVICES];
static struct {
    anychip_event *e;
    size_t n, cap;
} g_pool[MAX_DEVICES];                    /* events to reuse, per device */

static uint64_t real_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* an event of the device from the pool (g_trace_lock held); NULL when none can be made */
static anychip_event pool_take(int device)
{
    if (g_pool[device].n)
        return g_pool[device].e[--g_pool[device].n];
    anychip_event e = NULL;
    return g_plugin.event_create(device, &e) == 0 ? e : NULL;
}

static void pool_give(int device, anychip_event e)
{
    if (!e)
        return;
    if (g_pool[device].n == g_pool[device].cap) {
        size_t cap = g_pool[device].cap ? 2 * g_pool[device].cap : 256;
        anychip_event *grown = realloc(g_pool[device].e, cap * sizeof *grown);
        if (!grown) {
            g_plugin.event_destroy(device, e);
            return;
        }
        g_pool[device].e = grown;
        g_pool[device].cap = cap;
    }
    g_pool[device].e[g_pool[device].n++] = e;
}

/* the device's base event, recorded on an idle stream of its own (g_trace_lock held) */
static int calibrate(int device)
{
    if (g_base[device].state)
        return g_base[device].state > 0;
    g_base[device].state = -1;
    anychip_stream s = NULL;
    if (g_plugin.stream_create(device, &s) != 0)
        return 0;
    /* the event completed between the record call and the synchronize's return; of a few tries,
     * the one whose span was shortest places it best (on a busy host a single wake-up can come
     * milliseconds late, and every device event of the run would be that much late) */
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        anychip_event e = pool_take(device);
        uint64_t t0 = real_ns();
        if (!e || g_plugin.event_record(device, e, s) != 0 || g_plugin.event_synchronize(device, e) != 0) {
            pool_give(device, e);
            break;
        }
        uint64_t t1 = real_ns();
        if (t1 - t0 < best) {
            best = t1 - t0;
            pool_give(device, g_base[device].e);
            g_base[device].ns = t1;
            g_base[device].e = e;
            g_base[device].state = 1;
        } else {
            pool_give(device, e);
        }
    }
    g_plugin.stream_destroy(device, s);
    return g_base[device].state > 0;
}

/* before work is enqueued on s: its start event, when Paddle traces */
void trace_begin(int device, anychip_stream s, trace_mark *m)
{
    m->on = 0;
    if (!atomic_load_explicit(&g_tracing, memory_order_relaxed))
        return;
    m->host_start = real_ns();
    pthread_mutex_lock(&g_trace_lock);
    m->a = calibrate(device) ? pool_take(device) : NULL;
    pthread_mutex_unlock(&g_trace_lock);
    if (m->a && g_plugin.event_record(device, m->a, s) == 0) {
        m->on = 1;
        return;
    }
    pthread_mutex_lock(&g_trace_lock);
    pool_give(device, m->a);
    pthread_mutex_unlock(&g_trace_lock);
}

static void trace_add(const trace_rec *r)
{
    pthread_mutex_lock(&g_trace_lock);
    if (g_ntrace == g_trace_cap && g_trace_cap < TRACE_MAX_RECORDS) {
        size_t cap = g_trace_cap ? 2 * g_trace_cap : 1024;
        trace_rec *grown = realloc(g_trace, cap * sizeof *grown);
        if (grown) {
            g_trace = grown;
            g_trace_cap = cap;
        }
    }
    if (g_ntrace < g_trace_cap) {
        g_trace[g_ntrace++] = *r;
    } else {
        g_trace_dropped++;
        pool_give(r->device, r->a);
        pool_give(r->device, r->b);
    }
    pthread_mutex_unlock(&g_trace_lock);
}

static void trace_fill(trace_rec *r, int device, int what, uint64_t stream, uint64_t bytes, const char *fmt,
                       va_list ap)
{
    r->device = device;
    r->what = what;
    r->stream = stream;
    r->bytes = bytes;
    r->tid = (uint64_t)syscall(SYS_gettid);
    r->corr = atomic_fetch_add(&g_trace_corr, 1) + 1;
    vsnprintf(r->name, sizeof r->name, fmt, ap);
}

/* after the work was enqueued on s (rc: the enqueue's status): its end event and the record */
void trace_end(trace_mark *m, int device, anychip_stream s, anychip_status rc, int what, uint64_t bytes,
               const char *fmt, ...)
{
    if (!m->on)
        return;
    trace_rec r = {.a = m->a, .host_start = m->host_start};
    pthread_mutex_lock(&g_trace_lock);
    r.b = rc == 0 ? pool_take(device) : NULL;
    pthread_mutex_unlock(&g_trace_lock);
    if (!r.b || g_plugin.event_record(device, r.b, s) != 0) {
        pthread_mutex_lock(&g_trace_lock);
        pool_give(device, r.a);
        pool_give(device, r.b);
        pthread_mutex_unlock(&g_trace_lock);
        return;
    }
    r.host_end = real_ns();
    va_list ap;
    va_start(ap, fmt);
    trace_fill(&r, device, what, (uint64_t)(uintptr_t)s, bytes, fmt, ap);
    va_end(ap);
    trace_add(&r);
}

/* work the host waited for, [t0, t1] */
static void trace_host(int device, uint64_t t0, uint64_t t1, int what, uint64_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void trace_host(int device, uint64_t t0, uint64_t t1, int what, uint64_t bytes, const char *fmt, ...)
{
    trace_rec r = {.host_start = t0, .host_end = t1};
    va_list ap;
    va_start(ap, fmt);
    trace_fill(&r, device, what, 0, bytes, fmt, ap);
    va_end(ap);
    trace_add(&r);
}

/* ---- copies and memsets: the entries InitPlugin registered, wrapped ------------------------------- */

typedef C_Status (*sync_copy_fn)(const C_Device, void *, const void *, size_t);
typedef C_Status (*async_copy_fn)(const C_Device, C_Stream, void *, const void *, size_t);
typedef C_Status (*memset_fn)(const C_Device, void *, unsigned char, size_t);
static sync_copy_fn g_sync_copy[TC_N];
static async_copy_fn g_async_copy[TC_N];
static memset_fn g_memset;

static C_Status traced_sync_copy(int k, const C_Device d, void *dst, const void *src, size_t size)
{
    if (!atomic_load_explicit(&g_tracing, memory_order_relaxed) || !size || bad_device(d, "memory_copy"))
        return g_sync_copy[k](d, dst, src, size);
    C_Status st = fence(d->id);           /* the copy's wait for earlier work: not the copy's time */
    if (st != C_SUCCESS)
        return st;
    uint64_t t0 = real_ns();
    st = g_sync_copy[k](d, dst, src, size);
    if (st == C_SUCCESS) {
        trace_host(d->id, t0, real_ns(), k, size, "Memcpy %s (%s -> %s)", TC_KIND[k], TC_SRC[k], TC_DST[k]);
    }
    return st;
}

static C_Status traced_async_copy(int k, const C_Device d, C_Stream stream, void *dst, const void *src, size_t size)
{
    trace_mark m = {0};
    int on = size && stream && bad_device(d, "async_memory_copy") == C_SUCCESS;
    if (on)
        trace_begin(d->id, REC(stream)->s, &m);
    C_Status st = g_async_copy[k](d, stream, dst, src, size);
    if (on)
        trace_end(&m, d->id, REC(stream)->s, st == C_SUCCESS ? 0 : -1, k, size, "Memcpy %s (%s -> %s)", TC_KIND[k],
                  TC_SRC[k], TC_DST[k]);
    return st;
}

static C_Status traced_h2d(const C_Device d, void *dst, const void *src, size_t size)
{
    return traced_sync_copy(TC_H2D, d, dst, src, size);
}
static C_Status traced_d2h(const C_Device d, void *dst, const void *src, size_t size)
{
    return traced_sync_copy(TC_D2H, d, dst, src, size);
}
static C_Status traced_d2d(const C_Device d, void *dst, const void *src, size_t size)
{
    return traced_sync_copy(TC_D2D, d, dst, src, size);
}
static C_Status traced_async_h2d(const C_Device d, C_Stream s, void *dst, const void *src, size_t size)
{
    return traced_async_copy(TC_H2D, d, s, dst, src, size);
}
static C_Status traced_async_d2h(const C_Device d, C_Stream s, void *dst, const void *src, size_t size)
{
    return traced_async_copy(TC_D2H, d, s, dst, src, size);
}
static C_Status traced_async_d2d(const C_Device d, C_Stream s, void *dst, const void *src, size_t size)
{
    return traced_async_copy(TC_D2D, d, s, dst, src, size);
}

static C_Status traced_memset(const C_Device d, void *ptr, unsigned char value, size_t size)
{
    if (!atomic_load_explicit(&g_tracing, memory_order_relaxed) || !size || bad_device(d, "device_memory_set"))
        return g_memset(d, ptr, value, size);
    C_Status st = fence(d->id);
    if (st != C_SUCCESS)
        return st;
    uint64_t t0 = real_ns();
    st = g_memset(d, ptr, value, size);
    if (st == C_SUCCESS)
        trace_host(d->id, t0, real_ns(), TW_MEMSET, size, "Memset (Device)");
    return st;
}

/* ---- the entries -------------------------------------------------------------------------------- */

/* the records of the run so far, taken out (the caller hands their events back) */
static trace_rec *trace_take(size_t *n)
{
    pthread_mutex_lock(&g_trace_lock);
    trace_rec *t = g_trace;
    *n = g_ntrace;
    g_trace = NULL;
    g_ntrace = g_trace_cap = 0;
    pthread_mutex_unlock(&g_trace_lock);
    return t;
}

static void trace_release(trace_rec *t, size_t n)
{
    pthread_mutex_lock(&g_trace_lock);
    for (size_t i = 0; i < n; i++) {
        pool_give(t[i].device, t[i].a);
        pool_give(t[i].device, t[i].b);
    }
    pthread_mutex_unlock(&g_trace_lock);
    free(t);
}

static void trace_discard(void)
{
    size_t n;
    trace_rec *t = trace_take(&n);
    trace_release(t, n);
}

static void trace_reset_bases(void)
{
    pthread_mutex_lock(&g_trace_lock);
    for (int d = 0; d < MAX_DEVICES; d++) {
        if (g_base[d].state > 0)
            pool_give(d, g_base[d].e);
        g_base[d].e = NULL;
        g_base[d].state = 0;
    }
    g_trace_dropped = 0;
    pthread_mutex_unlock(&g_trace_lock);
}

static C_Status profiler_initialize(C_Profiler prof, void **user_data)
{
    (void)prof;
    *user_data = NULL;
    return C_SUCCESS;
}

static C_Status profiler_prepare_tracing(C_Profiler prof, void *user_data)
{
    (void)prof, (void)user_data;
    return C_SUCCESS;
}

static C_Status profiler_start_tracing(C_Profiler prof, void *user_data)
{
    (void)prof, (void)user_data;
    trace_discard();                      /* a run stopped and never collected */
    trace_reset_bases();
    atomic_store(&g_tracing, 1);
    return C_SUCCESS;
}

static C_Status profiler_stop_tracing(C_Profiler prof, void *user_data)
{
    (void)prof, (void)user_data;
    atomic_store(&g_tracing, 0);
    return C_SUCCESS;
}

/* the device's times of a record, from its events */
static int trace_times(const trace_rec *r, uint64_t *start, uint64_t *end)
{
    if (!r->a) {
        *start = r->host_start;
        *end = r->host_end;
        return 1;
    }
    float from_base = 0, dur = 0;
    if (g_base[r->device].state <= 0 || g_plugin.event_synchronize(r->device, r->b) != 0 ||
        g_plugin.event_elapsed_ms(r->device, &from_base, g_base[r->device].e, r->a) != 0 ||
        g_plugin.event_elapsed_ms(r->device, &dur, r->a, r->b) != 0)
        return 0;
    *start = g_base[r->device].ns + (uint64_t)((double)(from_base > 0 ? from_base : 0) * 1e6);
    *end = *start + (uint64_t)((double)(dur > 0 ? dur : 0) * 1e6);
    return 1;
}

static C_Status profiler_collect_trace_data(C_Profiler prof, uint64_t start_ns, void *user_data)
{
    (void)start_ns, (void)user_data;
    size_t n;
    trace_rec *t = trace_take(&n);
    uint64_t pid = (uint64_t)getpid();
    size_t lost = 0;
    for (size_t i = 0; i < n; i++) {
        const trace_rec *r = &t[i];
        uint64_t start, end;
        if (!trace_times(r, &start, &end)) {
            lost++;
            continue;
        }
        int copy = r->what < TC_N;
        const char *launch = r->what == TW_KERNEL ? "anychip kernel launch"
                             : r->what == TW_MEMSET ? "anychip memset"
                             : r->a                 ? "anychip copy_async" : "anychip copy";
        int type = copy ? TRACE_MEMCPY : r->what == TW_MEMSET ? TRACE_MEMSET : TRACE_KERNEL;
        if (anychip_paddle_trace_runtime(prof, launch, r->host_start, r->host_end, pid, r->tid, r->corr) != 0 ||
            anychip_paddle_trace_device(prof, r->name, type, start, end, (uint64_t)r->device, r->stream, r->corr,
                                        r->bytes, copy ? TC_KIND[r->what] : "", copy ? TC_SRC[r->what] : "",
                                        copy ? TC_DST[r->what] : "Device", 0) != 0) {
            say("profiler: this Paddle does not export profiler_add_*_trace_event; no device events");
            break;
        }
    }
    if (lost || g_trace_dropped)
        say("profiler: %zu event%s without device times, %zu over the limit of %u per run", lost, lost == 1 ? "" : "s",
            g_trace_dropped, TRACE_MAX_RECORDS);
    trace_release(t, n);
    return C_SUCCESS;
}

static C_Status profiler_finalize(C_Profiler prof, void *user_data)
{
    (void)prof, (void)user_data;
    atomic_store(&g_tracing, 0);
    trace_discard();
    trace_reset_bases();
    pthread_mutex_lock(&g_trace_lock);
    for (int d = 0; d < MAX_DEVICES; d++) {
        for (size_t i = 0; i < g_pool[d].n; i++)
            g_plugin.event_destroy(d, g_pool[d].e[i]);
        free(g_pool[d].e);
        g_pool[d].e = NULL;
        g_pool[d].n = g_pool[d].cap = 0;
    }
    pthread_mutex_unlock(&g_trace_lock);
    return C_SUCCESS;
}

/* the profiler entries, and the copies and memsets wrapped to be traced (after InitPlugin set them) */
void fill_profiler(C_DeviceInterface *i)
{
    if (!(g_plugin.event_create && g_plugin.event_record && g_plugin.event_synchronize && g_plugin.event_elapsed_ms))
        return;
    g_sync_copy[TC_H2D] = i->memory_copy_h2d;
    g_sync_copy[TC_D2H] = i->memory_copy_d2h;
    g_sync_copy[TC_D2D] = i->memory_copy_d2d;
    g_async_copy[TC_H2D] = i->async_memory_copy_h2d;
    g_async_copy[TC_D2H] = i->async_memory_copy_d2h;
    g_async_copy[TC_D2D] = i->async_memory_copy_d2d;
    g_memset = i->device_memory_set;
    i->memory_copy_h2d = traced_h2d;
    i->memory_copy_d2h = traced_d2h;
    i->memory_copy_d2d = traced_d2d;
    i->async_memory_copy_h2d = traced_async_h2d;
    i->async_memory_copy_d2h = traced_async_d2h;
    i->async_memory_copy_d2d = traced_async_d2d;
    i->device_memory_set = traced_memset;
    i->profiler_initialize = profiler_initialize;
    i->profiler_finalize = profiler_finalize;
    i->profiler_prepare_tracing = profiler_prepare_tracing;
    i->profiler_start_tracing = profiler_start_tracing;
    i->profiler_stop_tracing = profiler_stop_tracing;
    i->profiler_collect_trace_data = profiler_collect_trace_data;
}
