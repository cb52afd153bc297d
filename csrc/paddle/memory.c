/*
 * The Paddle bridge's memory (see bridge.h): allocation and frees, synchronous copies (after
 * the copy fence) and asynchronous ones (in the stream order; H2D from the bridge's staging
 * buffers), and memsets.
 */
#include "bridge.h"

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
        g_plugin.event_destroy(x->device, x->e);
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
        if (check(g_plugin.event_create(device, &x->e), "event_create") != C_SUCCESS) {
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
            if (g_plugin.event_query && g_plugin.event_query(x->device, x->e) == 0) {    /* complete */
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
        check(g_plugin.event_synchronize(oldest->device, oldest->e), "event_synchronize");
        later_recycle(L, oldest);
    }
}

/* x (from later_get, its buffer filled) is released once the work enqueued so far on `s` has completed */
static void later_add(later_list *L, later *x, anychip_stream s)
{
    if (check(g_plugin.event_record(x->device, x->e, s), "event_record") != C_SUCCESS) {
        check(g_plugin.stream_synchronize(x->device, s), "stream_synchronize");
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
        check(g_plugin.event_synchronize(x->device, x->e), "event_synchronize");
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
        g_plugin.event_destroy(x->device, x->e);
        free(x->buf);
        free(x);
    }
}

/* the staging buffers of asynchronous H2D copies in flight */
static later_list g_staged = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, 0, 0, 0, 4096, (size_t)256 << 20};

void staging_drain(int device) { later_drain(&g_staged, device); }


/* ---- allocation and copies --------------------------------------------------------------------- */

static C_Status device_memory_allocate(const C_Device d, void **ptr, size_t size)
{
    PROF(device_memory_allocate);
    DEVICE(d);
    anychip_status rc = g_plugin.mem_alloc(d->id, size, ptr);
    if (rc == 0)
        return C_SUCCESS;
    if (rc == g_plugin.oom_status || g_plugin.oom_status == 0) {
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
    return check(g_plugin.mem_free(d->id, ptr), "mem_free");
}

C_Status sync_copy(int device, void *dst, const void *src, size_t size, anychip_copy_kind kind)
{
    PROF(sync_copy);
    if (!size)
        return C_SUCCESS;
    C_Status st = fence(device);
    return st != C_SUCCESS ? st : check(g_plugin.copy(device, dst, src, size, kind), "copy");
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
    if (g_plugin.fill)
        return check(g_plugin.fill(d->id, ptr, value, size), "fill");
    unsigned char *host = malloc(size);
    if (!host)
        return C_FAILED;
    memset(host, value, size);
    C_Status st = check(g_plugin.copy(d->id, ptr, host, size, ANYCHIP_COPY_H2D), "copy");
    free(host);
    return st;
}

/* asynchronous H2D copies larger than this are synchronous (the stream's work, then the copy)
 * rather than staged */
#define STAGE_MAX ((size_t)64 << 20)

C_Status async_copy(int device, C_Stream stream, void *dst, const void *src, size_t size, anychip_copy_kind kind)
{
    PROF(async_copy);
    if (!size)
        return C_SUCCESS;
    stream_rec *r = REC(stream);
    if (kind != ANYCHIP_COPY_D2D && nothing_pending(device, r)) {
        /* nothing the copy must follow is left on the device: made at once it is ordered as it
         * would be on the stream, reads the host source before Paddle can reuse it (no staging),
         * and a D2H copy is complete on return as below, without a round trip through the stream */
        if (kind == ANYCHIP_COPY_H2D)
            COUNT(h2d_direct);
        else
            COUNT(d2h_direct);
        return check(g_plugin.copy(device, dst, src, size, kind), "copy");
    }
    int staged = kind == ANYCHIP_COPY_H2D && g_plugin.copy_async && g_plugin.event_create && size <= STAGE_MAX;
    C_Status st = enqueue_on(device, r);
    if (st != C_SUCCESS)
        return st;
    if (!g_plugin.copy_async || (kind == ANYCHIP_COPY_H2D && !staged)) {
        TRY(g_plugin.stream_synchronize(device, r->s), "stream_synchronize");
        return check(g_plugin.copy(device, dst, src, size, kind), "copy");
    }
    if (kind == ANYCHIP_COPY_D2H) {
        /* as CUDA's to pageable memory: the copy has completed when this returns (Paddle
         * reads a D2H destination, or frees it, without always waiting for the stream) */
        COUNT(d2h_enqueued);
        TRY(g_plugin.copy_async(device, dst, src, size, kind, r->s), "copy_async");
        return check(g_plugin.stream_synchronize(device, r->s), "stream_synchronize");
    }
    if (!staged)
        return check(g_plugin.copy_async(device, dst, src, size, kind, r->s), "copy_async");
    /* Paddle may free or reuse the host source as soon as this returns (its executor frees a
     * CPU tensor once the op that reads it has returned): the copy reads a staging buffer of
     * the bridge's, released once the copy has completed on the stream */
    later *x = later_get(&g_staged, device, size);
    if (!x) {
        TRY(g_plugin.stream_synchronize(device, r->s), "stream_synchronize");
        return check(g_plugin.copy(device, dst, src, size, kind), "copy");
    }
    COUNT(h2d_staged);
    memcpy(x->buf, src, size);
    x->bytes = size;
    st = check(g_plugin.copy_async(device, dst, x->buf, size, kind, r->s), "copy_async");
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
    TRY(g_plugin.stream_synchronize(src_d->id, REC(stream)->s), "stream_synchronize");
    return memory_copy_p2p(dst_d, src_d, dst, src, size);
}

void fill_memory(C_DeviceInterface *i)
{
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
}
