/*
 * @name@: an anychip device plugin (anychip/plugin.h).
 *
 * This is a complete, honest device that keeps its "device memory" in host memory:
 *   - memory: a capacity per device (@NAME@_MEMORY_MB, default 1024) and a table of live
 *     allocations, so running out of memory and freeing a bad pointer are errors, not crashes;
 *   - streams: one worker thread each, running queued copies, fills, event records and
 *     event waits in order, so work really is asynchronous;
 *   - events: a recorded generation and a completion timestamp (CLOCK_MONOTONIC);
 *   - tensor kernels (src/kernels.c): elementwise, casts, reductions, GEMM and fill as plain
 *     loops, run by the stream workers in order with the copies.
@{collectives
 *   - collectives (src/collectives.c): plugin.h's NCCL-shaped entries over a stand-in library
 *     between the processes of one host (shared memory), run by the stream workers in order.
@}
 * Devices: @NAME@_DEVICES (default 4).
 * The files of src/ are compiled one by one and linked; @name@.h declares what they share.
 *
 * To bring up a real chip, replace the functions marked DRIVER with your driver's calls
@{collectives
 * (README.md lists them), and the stand-in library's calls in src/collectives.c with your
 * collective library's.
@}
@{!collectives
 * (README.md lists them). Collectives are left out: anychip's host transport serves until
 * you add your collective library's entries (see plugin.h, "COLLECTIVES";
 * `anychip plugin new NAME --collectives` writes them).
@}
 */
#define _GNU_SOURCE
#include "@name@.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- errors: the status codes S_* are in @name@.h ------------------------------------------- */
static const char *error_string(anychip_status s) {
    switch (s) {
    case S_OK: return "success";
    case S_INVALID: return "invalid argument";
    case S_NO_MEMORY: return "out of device memory";
    case S_BAD_POINTER: return "not a valid device pointer";
    case S_NOT_READY: return "not ready";
    case S_BAD_DEVICE: return "no such device";
    case S_SYSTEM: return "system error";
@{collectives
    case S_TIMEOUT: return "timed out waiting for a peer";
    case S_PEER: return "a peer failed";
    case S_ABORTED: return "communicator aborted";
@}
    default: return "unknown status";
    }
}

static __thread char last_error[512];

anychip_status fail(anychip_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

static const char *get_last_error(void) { return last_error[0] ? last_error : NULL; }

/* ---- devices and their memory ---------------------------------------------------------- */
static device devices[MAX_DEVICES];
int ndevices;
static pthread_once_t once = PTHREAD_ONCE_INIT;

long env_long(const char *name, long dflt, long lo, long hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return (*end || x < lo || x > hi) ? dflt : x;
}

static void setup(void) {   /* DRIVER: open the driver, count the chips */
    ndevices = (int)env_long("@NAME@_DEVICES", 4, 0, MAX_DEVICES);
    size_t capacity = (size_t)env_long("@NAME@_MEMORY_MB", 1024, 1, 1 << 20) << 20;
    for (int i = 0; i < ndevices; i++) {
        pthread_mutex_init(&devices[i].lock, NULL);
        devices[i].capacity = capacity;
    }
}

device *get_device(int d) {
    pthread_once(&once, setup);
    return (d >= 0 && d < ndevices) ? &devices[d] : NULL;
}

static anychip_status device_count(int *count) {
    pthread_once(&once, setup);
    if (!count) return fail(S_INVALID, "device_count: count is NULL");
    *count = ndevices;
    return S_OK;
}

static anychip_status device_name(int d, char *name, size_t len) {
    DEVICE(dev, d);
    (void)dev;
    snprintf(name, len, "@name@ device %d (host memory)", d);
    return S_OK;
}

static anychip_status mem_info(int d, size_t *free_bytes, size_t *total) {
    DEVICE(dev, d);
    pthread_mutex_lock(&dev->lock);
    *free_bytes = dev->capacity - dev->used;
    *total = dev->capacity;
    pthread_mutex_unlock(&dev->lock);
    return S_OK;
}

static anychip_status mem_alloc(int d, size_t nbytes, void **ptr) {   /* DRIVER: device malloc */
    DEVICE(dev, d);
    if (!ptr) return fail(S_INVALID, "mem_alloc: ptr is NULL");
    size_t size = (nbytes + 255) & ~(size_t)255;
    if (size == 0) size = 256;
    pthread_mutex_lock(&dev->lock);
    anychip_status rc = S_OK;
    void *p = NULL;
    if (size > dev->capacity - dev->used) {
        rc = fail(S_NO_MEMORY, "device %d: %zu bytes requested, %zu of %zu free", d, nbytes,
                  dev->capacity - dev->used, dev->capacity);
    } else if (dev->nallocs == dev->cap &&
               !(dev->allocs = realloc(dev->allocs, (dev->cap = dev->cap ? 2 * dev->cap : 64) * sizeof(allocation)))) {
        rc = fail(S_SYSTEM, "device %d: the allocation table cannot grow", d);
    } else if (posix_memalign(&p, 256, size) != 0) {
        rc = fail(S_NO_MEMORY, "device %d: the host refused %zu bytes", d, size);
    } else {
        dev->allocs[dev->nallocs++] = (allocation){(uintptr_t)p, size};
        dev->used += size;
        *ptr = p;
    }
    pthread_mutex_unlock(&dev->lock);
    return rc;
}

static anychip_status mem_free(int d, void *ptr) {   /* DRIVER: device free */
    DEVICE(dev, d);
    pthread_mutex_lock(&dev->lock);
    for (size_t i = 0; i < dev->nallocs; i++) {
        if (dev->allocs[i].base == (uintptr_t)ptr) {
            dev->used -= dev->allocs[i].size;
            dev->allocs[i] = dev->allocs[--dev->nallocs];
            pthread_mutex_unlock(&dev->lock);
            free(ptr);
            return S_OK;
        }
    }
    pthread_mutex_unlock(&dev->lock);
    return fail(S_BAD_POINTER, "free of %p, which is not a live allocation of device %d", ptr, d);
}

/* whether [p, p + n) lies inside one live allocation of dev */
int valid_range(device *dev, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    int ok = 0;
    pthread_mutex_lock(&dev->lock);
    for (size_t i = 0; i < dev->nallocs && !ok; i++)
        ok = a >= dev->allocs[i].base && a + n <= dev->allocs[i].base + dev->allocs[i].size;
    pthread_mutex_unlock(&dev->lock);
    return ok;
}

static anychip_status check_copy(int d, device *dev, void *dst, const void *src, size_t n, anychip_copy_kind kind) {
    if (n == 0) return S_OK;
    if (kind > ANYCHIP_COPY_D2D) return fail(S_INVALID, "copy: unknown kind %d", (int)kind);
    if (kind != ANYCHIP_COPY_D2H && !valid_range(dev, dst, n))
        return fail(S_BAD_POINTER, "copy: destination %p + %zu is not memory of device %d", dst, n, d);
    if (kind != ANYCHIP_COPY_H2D && !valid_range(dev, src, n))
        return fail(S_BAD_POINTER, "copy: source %p + %zu is not memory of device %d", src, n, d);
    return S_OK;
}

/* ---- events ------------------------------------------------------------------------ */

/* An event destroyed while a record or wait of it is still queued lives until that task
 * has run (CUDA and ACL allow destroying such an event). */
void event_release(struct anychip_event_s *e) {
    if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->cond);
        free(e);
    }
}

/* ---- streams: a worker thread running queued tasks in order (task, the stream: @name@.h) -- */
static void run(task *t) {   /* DRIVER: what the chip does for each queued command */
    switch (t->kind) {
    case T_COPY: memmove(t->dst, t->src, t->n); break;
    case T_FILL: memset(t->dst, t->value, t->n); break;
    case T_RECORD:
        pthread_mutex_lock(&t->event->lock);
        if (t->generation > t->event->completed) {
            t->event->completed = t->generation;
            clock_gettime(CLOCK_MONOTONIC, &t->event->when);
        }
        pthread_cond_broadcast(&t->event->cond);
        pthread_mutex_unlock(&t->event->lock);
        event_release(t->event);
        break;
    case T_WAIT:
        pthread_mutex_lock(&t->event->lock);
        while (t->event->completed < t->generation) pthread_cond_wait(&t->event->cond, &t->event->lock);
        pthread_mutex_unlock(&t->event->lock);
        event_release(t->event);
        break;
    case T_KERNEL: run_kernel(t->kernel); break;
    case T_HOST: t->host(t->arg); break;
    }
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    anychip_stream s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (!s->head && !s->stop) {   /* new work often follows at once: spin 20 us before sleeping */
            pthread_mutex_unlock(&s->lock);
            for (double until = seconds() + 20e-6; seconds() < until;)
                if (__atomic_load_n(&s->head, __ATOMIC_ACQUIRE) || __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) break;
            pthread_mutex_lock(&s->lock);
        }
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &s->lock);
        if (!s->head) break;
        task *t = s->head;
        pthread_mutex_unlock(&s->lock);
        run(t);
        pthread_mutex_lock(&s->lock);
        s->head = t->next;
        if (!s->head) s->tail = NULL;
        s->completed++;
        pthread_cond_broadcast(&s->done);
        free(t);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

anychip_status enqueue(anychip_stream s, task tmpl) {
    if (!s) return fail(S_INVALID, "NULL stream");
    task *t = malloc(sizeof *t);
    if (!t) return fail(S_SYSTEM, "out of host memory for a stream task");
    *t = tmpl;
    t->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail) s->tail->next = t; else s->head = t;
    s->tail = t;
    s->enqueued++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    return S_OK;
}

/* a record or wait holds its event until it has run */
anychip_status enqueue_event_task(anychip_stream s, task tmpl) {
    __atomic_add_fetch(&tmpl.event->refs, 1, __ATOMIC_RELAXED);
    anychip_status st = enqueue(s, tmpl);
    if (st != S_OK) event_release(tmpl.event);
    return st;
}

static anychip_status stream_create(int d, anychip_stream *out) {
    DEVICE(dev, d);
    anychip_stream s = calloc(1, sizeof *s);
    if (!s) return fail(S_SYSTEM, "out of host memory for a stream");
    s->device = d;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    int err = pthread_create(&s->thread, NULL, worker, s);
    if (err) {
        free(s);
        return fail(S_SYSTEM, "cannot start a stream thread: %s", strerror(err));
    }
    pthread_mutex_lock(&dev->lock);
    s->next = dev->streams;
    dev->streams = s;
    pthread_mutex_unlock(&dev->lock);
    *out = s;
    return S_OK;
}

static anychip_status stream_synchronize(int d, anychip_stream s) {
    (void)d;
    if (!s) return fail(S_INVALID, "stream_synchronize: NULL stream");
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->enqueued;
    while (s->completed < target) pthread_cond_wait(&s->done, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return S_OK;
}

static anychip_status stream_query(int d, anychip_stream s) {
    (void)d;
    if (!s) return fail(S_INVALID, "stream_query: NULL stream");
    pthread_mutex_lock(&s->lock);
    int idle = s->completed == s->enqueued;
    pthread_mutex_unlock(&s->lock);
    return idle ? S_OK : S_NOT_READY;
}

static anychip_status stream_destroy(int d, anychip_stream s) {
    DEVICE(dev, d);
    if (!s || s->device != d) return fail(S_INVALID, "stream_destroy: not a stream of device %d", d);
    pthread_mutex_lock(&dev->lock);
    anychip_stream *p = &dev->streams;
    while (*p && *p != s) p = &(*p)->next;
    if (*p) *p = s->next;
    pthread_mutex_unlock(&dev->lock);
    pthread_mutex_lock(&s->lock);
    s->stop = 1;                      /* the worker finishes the queued work first */
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    free(s);
    return S_OK;
}

static anychip_status device_synchronize(int d) {
    DEVICE(dev, d);
    /* streams are destroyed only by their owner, after its own synchronize: walking the list
       under the device lock and waiting outside it is safe for the streams anychip tracks */
    pthread_mutex_lock(&dev->lock);
    size_t n = 0;
    for (anychip_stream s = dev->streams; s; s = s->next) n++;
    anychip_stream *all = malloc((n ? n : 1) * sizeof *all);
    n = 0;
    if (all)
        for (anychip_stream s = dev->streams; s; s = s->next) all[n++] = s;
    pthread_mutex_unlock(&dev->lock);
    if (!all) return fail(S_SYSTEM, "device_synchronize: out of host memory");
    for (size_t i = 0; i < n; i++) stream_synchronize(d, all[i]);
    free(all);
    return S_OK;
}

/* ---- copies and fills -------------------------------------------------------------- */
anychip_status copy_async(int d, void *dst, const void *src, size_t n, anychip_copy_kind kind, anychip_stream s) {
    DEVICE(dev, d);
    anychip_status rc = check_copy(d, dev, dst, src, n, kind);
    if (rc || n == 0) return rc;
    return enqueue(s, (task){.kind = T_COPY, .dst = dst, .src = src, .n = n});
}

static anychip_status copy_sync(int d, void *dst, const void *src, size_t n, anychip_copy_kind kind) {
    DEVICE(dev, d);
    anychip_status rc = check_copy(d, dev, dst, src, n, kind);
    if (rc == S_OK && n) memmove(dst, src, n);
    return rc;
}

static anychip_status fill_async(int d, void *dst, int value, size_t n, anychip_stream s) {
    DEVICE(dev, d);
    if (n == 0) return S_OK;
    if (!valid_range(dev, dst, n)) return fail(S_BAD_POINTER, "fill: %p + %zu is not memory of device %d", dst, n, d);
    return enqueue(s, (task){.kind = T_FILL, .dst = dst, .n = n, .value = value});
}

/* ---- events -------------------------------------------------------------------------- */
static anychip_status event_create(int d, anychip_event *out) {
    DEVICE(dev, d);
    (void)dev;
    anychip_event e = calloc(1, sizeof *e);
    if (!e) return fail(S_SYSTEM, "out of host memory for an event");
    e->device = d;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    e->refs = 1;
    *out = e;
    return S_OK;
}

static anychip_status event_destroy(int d, anychip_event e) {
    if (!e || e->device != d) return fail(S_INVALID, "event_destroy: not an event of device %d", d);
    event_release(e);
    return S_OK;
}

static anychip_status event_record(int d, anychip_event e, anychip_stream s) {
    if (!e || !s || e->device != d) return fail(S_INVALID, "event_record: bad event or stream on device %d", d);
    pthread_mutex_lock(&e->lock);
    uint64_t gen = ++e->recorded;
    pthread_mutex_unlock(&e->lock);
    return enqueue_event_task(s, (task){.kind = T_RECORD, .event = e, .generation = gen});
}

static anychip_status event_synchronize(int d, anychip_event e) {
    if (!e || e->device != d) return fail(S_INVALID, "event_synchronize: not an event of device %d", d);
    pthread_mutex_lock(&e->lock);
    uint64_t target = e->recorded;
    while (e->completed < target) pthread_cond_wait(&e->cond, &e->lock);
    pthread_mutex_unlock(&e->lock);
    return S_OK;
}

static anychip_status event_query(int d, anychip_event e) {
    if (!e || e->device != d) return fail(S_INVALID, "event_query: not an event of device %d", d);
    pthread_mutex_lock(&e->lock);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->lock);
    return done ? S_OK : S_NOT_READY;
}

static anychip_status event_elapsed_ms(int d, float *ms, anychip_event a, anychip_event b) {
    if (!a || !b || a->device != d || b->device != d)
        return fail(S_INVALID, "event_elapsed_ms: not events of device %d", d);
    anychip_status rc = S_OK;
    pthread_mutex_lock(&a->lock);
    pthread_mutex_lock(&b->lock);
    if (!a->recorded || !b->recorded)
        rc = fail(S_INVALID, "event_elapsed_ms: an event that was never recorded");
    else if (a->completed < a->recorded || b->completed < b->recorded)
        rc = fail(S_NOT_READY, "event_elapsed_ms: an event has not completed yet");
    else
        *ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
                      (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
    pthread_mutex_unlock(&b->lock);
    pthread_mutex_unlock(&a->lock);
    return rc;
}

static anychip_status stream_wait_event(int d, anychip_stream s, anychip_event e) {
    if (!e || !s || e->device != d) return fail(S_INVALID, "stream_wait_event: bad event or stream on device %d", d);
    pthread_mutex_lock(&e->lock);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&e->lock);
    return gen ? enqueue_event_task(s, (task){.kind = T_WAIT, .event = e, .generation = gen}) : S_OK;
}

/* ---- the table ------------------------------------------------------------------------ */
ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p) {
    if (!p || p->struct_size < offsetof(anychip_plugin, reserved))
        return S_INVALID;              /* an anychip older than this header: refuse */
    p->major = ANYCHIP_PLUGIN_API_MAJOR;
    p->minor = ANYCHIP_PLUGIN_API_MINOR;
    snprintf(p->device_type, sizeof p->device_type, "%s", "@name@");
    p->plugin_version = "@name@ 0.1.0 (host memory)";
    p->flags = ANYCHIP_PLUGIN_SIMULATED;   /* remove once the calls reach real hardware */
    p->flags |= ANYCHIP_PLUGIN_HOST_MEMORY; /* mem_alloc gives host memory; remove once it is the device's */
    p->oom_status = S_NO_MEMORY;
    p->invalid_status = S_INVALID;
    p->not_ready_status = S_NOT_READY;

    p->get_error_string = error_string;
    p->get_last_error = get_last_error;

    p->device_count = device_count;
    p->device_name = device_name;
    p->mem_info = mem_info;
    p->device_synchronize = device_synchronize;

    p->mem_alloc = mem_alloc;
    p->mem_free = mem_free;

    p->copy = copy_sync;
    p->copy_async = copy_async;
    p->fill_async = fill_async;

    p->stream_create = stream_create;
    p->stream_destroy = stream_destroy;
    p->stream_synchronize = stream_synchronize;
    p->stream_query = stream_query;
    p->stream_wait_event = stream_wait_event;

    p->event_create = event_create;
    p->event_destroy = event_destroy;
    p->event_record = event_record;
    p->event_synchronize = event_synchronize;
    p->event_query = event_query;
    p->event_elapsed_ms = event_elapsed_ms;

    p->kernels = &KERNELS;
@{collectives
    set_collectives(p);
@}
    return S_OK;
}
