/*
 * The Paddle bridge's streams and events (see bridge.h), the stream order and the copy fence
 * (init.c's overview says why).
 */
#include "bridge.h"

static pthread_mutex_t g_streams_lock = PTHREAD_MUTEX_INITIALIZER;
static stream_rec *g_streams[MAX_DEVICES];

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

/* whether the plugin says s has no work left (without stream_query: not known, so no) */
static int idle(int device, stream_rec *s)
{
    return g_plugin.stream_query && g_plugin.stream_query(device, s->s) == 0;
}

/* Whether a copy made at once, now, would be ordered as one enqueued on r would: r has no work
 * left, nor has the device's last stream (whose work comes after that of every stream before it,
 * by the stream order), so every earlier piece of the device's work has completed. */
int nothing_pending(int device, stream_rec *r)
{
    stream_rec *last = atomic_load(&g_last[device]);
    return idle(device, r) && (!last || last == r || idle(device, last));
}

/* work is about to be enqueued on r of `device`: the copy fence will see it, and it comes after
 * the device's work enqueued before it on other streams (an event, unless that stream is idle) */
C_Status enqueue_on(int device, stream_rec *r)
{
    atomic_store(&r->pending, 1);
    if (atomic_load(&g_last[device]) == r)
        return C_SUCCESS;
    C_Status st = C_SUCCESS;
    pthread_mutex_lock(&g_order_lock);
    stream_rec *last = atomic_exchange(&g_last[device], r);
    if (last && last != r && idle(device, last)) {
        COUNT(order_idle);                /* its work, and what it waited for, has completed */
    } else if (last && last != r) {
        COUNT(order_wait);
        if (!g_plugin.event_create || !g_plugin.stream_wait_event)
            st = check(g_plugin.stream_synchronize(device, last->s), "stream_synchronize (the stream order)");
        else if (last->order_ev ||
                 (st = check(g_plugin.event_create(device, &last->order_ev), "event_create")) == C_SUCCESS) {
            st = check(g_plugin.event_record(device, last->order_ev, last->s), "event_record (the stream order)");
            if (st == C_SUCCESS)
                st = check(g_plugin.stream_wait_event(device, r->s, last->order_ev),
                           "stream_wait_event (the stream order)");
        }
    }
    pthread_mutex_unlock(&g_order_lock);
    return st;
}

C_Status fence(int device)
{
    pthread_mutex_lock(&g_streams_lock);
    C_Status st = C_SUCCESS;
    for (stream_rec *r = g_streams[device]; r && st == C_SUCCESS; r = r->next)
        if (atomic_exchange(&r->pending, 0))
            st = check(g_plugin.stream_synchronize(device, r->s), "the copy fence's stream_synchronize");
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
    C_Status st = check(g_plugin.stream_create(d->id, &r->s), "stream_create");
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
    C_Status st = check(g_plugin.stream_destroy(d->id, r->s), "stream_destroy");
    if (r->order_ev)
        g_plugin.event_destroy(d->id, r->order_ev);
    free(r);
    return st;
}

static C_Status synchronize_stream(const C_Device d, C_Stream stream)
{
    PROF(synchronize_stream);
    DEVICE(d);
    atomic_store(&REC(stream)->pending, 0);
    TRY(g_plugin.stream_synchronize(d->id, REC(stream)->s), "stream_synchronize");
    return comm_errors();
}

static C_Status query_stream(const C_Device d, C_Stream stream)
{
    PROF(query_stream);
    DEVICE(d);
    if (!g_plugin.stream_query)
        return synchronize_stream(d, stream);
    anychip_status rc = g_plugin.stream_query(d->id, REC(stream)->s);
    if (rc == g_plugin.not_ready_status && rc != 0)
        return C_FAILED;                  /* "not complete" is not a failure: no message */
    return check(rc, "stream_query");
}

C_Status synchronize_device(const C_Device d)
{
    PROF(synchronize_device);
    DEVICE(d);
    if (g_plugin.device_synchronize) {
        TRY(g_plugin.device_synchronize(d->id), "device_synchronize");
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
    if (g_plugin.event_create) {
        C_Status st = check(g_plugin.event_create(d->id, &r->e), "event_create");
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
    C_Status st = r->e ? check(g_plugin.event_destroy(d->id, r->e), "event_destroy") : C_SUCCESS;
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
    return check(g_plugin.event_record(d->id, r->e, REC(stream)->s), "event_record");
}

static C_Status query_event(const C_Device d, C_Event event)
{
    PROF(query_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    if (!r->e)
        return C_SUCCESS;
    if (!g_plugin.event_query)
        return check(g_plugin.event_synchronize(d->id, r->e), "event_synchronize");
    anychip_status rc = g_plugin.event_query(d->id, r->e);
    if (rc == g_plugin.not_ready_status && rc != 0)
        return C_FAILED;
    return check(rc, "event_query");
}

static C_Status synchronize_event(const C_Device d, C_Event event)
{
    PROF(synchronize_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    if (r->e)
        TRY(g_plugin.event_synchronize(d->id, r->e), "event_synchronize");
    return comm_errors();
}

static C_Status stream_wait_event(const C_Device d, C_Stream stream, C_Event event)
{
    PROF(stream_wait_event);
    DEVICE(d);
    event_rec *r = (event_rec *)event;
    if (!r->e)
        return C_SUCCESS;                 /* recorded synchronously: already complete */
    if (g_plugin.stream_wait_event)
        return check(g_plugin.stream_wait_event(d->id, REC(stream)->s, r->e), "stream_wait_event");
    return check(g_plugin.event_synchronize(d->id, r->e), "event_synchronize");
}

void fill_streams(C_DeviceInterface *i)
{
    i->create_stream = create_stream;
    i->destroy_stream = destroy_stream;
    i->query_stream = query_stream;
    i->synchronize_stream = synchronize_stream;
    i->synchronize_device = synchronize_device;
    i->create_event = create_event;
    i->record_event = record_event;
    i->destroy_event = destroy_event;
    i->query_event = query_event;
    i->synchronize_event = synchronize_event;
    i->stream_wait_event = stream_wait_event;
}
