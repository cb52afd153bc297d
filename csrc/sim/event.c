/*
 * Events: a record is an op on a stream that completes the event (with a CLOCK_MONOTONIC
 * timestamp) when it runs; waits, synchronizes and queries compare generations.
 */
#include "internal.h"

#include <stdlib.h>

void sim_event_ref(sim_event *e) { __atomic_add_fetch(&e->refs, 1, __ATOMIC_RELAXED); }

void sim_event_put(sim_event *e)
{
    if (e && __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->cv);
        free(e);
    }
}

/* the live event behind a handle, with a reference taken; NULL (message set) when none */
static sim_event *lookup(void *handle)
{
    sim_event *e = handle ? sim_registry_get(handle, TAG_EVENT) : NULL;
    if (!e)
        sim_fail(SIM_E_INVALID_HANDLE, "event %p is not a live event (destroyed, or never created)", handle);
    return e;
}

sim_status sim_event_create(void **handle) { return sim_event_create_flags(handle, 0); }

sim_status sim_event_create_flags(void **handle, int no_timing)
{
    if (!handle)
        return sim_fail(SIM_E_INVALID_VALUE, "the output event pointer is NULL");
    int phys;
    sim_status st = sim_current_phys(&phys);
    if (st != SIM_OK)
        return st;
    sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    e->dev = phys;
    e->refs = 1;
    e->no_timing = no_timing;
    pthread_mutex_init(&e->lock, NULL);
    sim_cond_init(&e->cv);
    e->handle = new_handle(TAG_EVENT);
    if (sim_registry_add(e->handle, e)) {
        sim_event_put(e);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    *handle = (void *)(uintptr_t)e->handle;
    return SIM_OK;
}

sim_status sim_event_destroy(void *handle)
{
    sim_event *e = sim_registry_take(handle, TAG_EVENT);
    if (!e)
        return sim_fail(SIM_E_INVALID_HANDLE, "event %p is not a live event (destroyed, or never created)",
                        handle);
    sim_event_put(e); /* queued records and waits keep it alive until they ran */
    return SIM_OK;
}

/* Mark record `gen` complete, now (the caller holds at most the recording stream's lock). */
void sim_event_complete(sim_event *e, uint64_t gen)
{
    uint64_t t = now_ns();
    pthread_mutex_lock(&e->lock);
    if (gen > e->done_gen) {
        e->t_ns = t;
        ASTORE(&e->done_gen, gen);
    }
    if (e->waiters)
        pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->lock);
}

struct gen_ctx { const sim_event *e; uint64_t gen; };

static int gen_done(const void *ctx)
{
    const struct gen_ctx *c = ctx;
    return ALOAD(&c->e->done_gen) >= c->gen;
}

static int wait_gen(sim_event *e, uint64_t gen, uint64_t deadline_ns)
{
    struct gen_ctx c = {e, gen};
    return sim_wait(gen_done, &c, &e->lock, &e->cv, &e->waiters, G.wait_spin_ns, deadline_ns);
}

void sim_event_wait_gen(sim_event *e, uint64_t gen)
{
    wait_gen(e, gen, 0);
    __atomic_sub_fetch(&e->pending_waits, 1, __ATOMIC_ACQ_REL);
}

static uint64_t recorded(sim_event *e)
{
    pthread_mutex_lock(&e->lock);
    uint64_t gen = e->rec_gen;
    pthread_mutex_unlock(&e->lock);
    return gen;
}

static sim_status record(sim_event *e, sim_stream *s)
{
    sim_status st = sim_stream_order(s); /* the record comes after the legacy null-stream waits */
    if (st != SIM_OK)
        return st;
    sim_op op = {.type = OP_RECORD};
    op.u.ev.ev = e;
    pthread_mutex_lock(&s->lock);
    if (s->dead) {
        pthread_mutex_unlock(&s->lock);
        return sim_fail(SIM_E_INVALID_STREAM, "the stream is being destroyed");
    }
    pthread_mutex_lock(&e->lock);
    op.u.ev.gen = ++e->rec_gen;
    pthread_mutex_unlock(&e->lock);
    if (s->head == s->tail && !s->running && !s->held) {
        /* nothing queued or running: the event is complete the moment it is recorded */
        sim_event_complete(e, op.u.ev.gen);
        pthread_mutex_unlock(&s->lock);
        return SIM_OK;
    }
    sim_event_ref(e);
    /* queued under the same hold of the stream's lock that numbered it: a wait another thread
     * queues for this record (it reads rec_gen) must never land on this stream ahead of it,
     * or two streams waiting for each other's records deadlock */
    st = sim_stream_push_locked(s, &op);
    pthread_mutex_unlock(&s->lock);
    if (st != SIM_OK) {
        sim_event_complete(e, op.u.ev.gen); /* the record will never run: nobody may wait forever */
        sim_event_put(e);
    }
    return st;
}

static sim_status stream_wait(sim_stream *s, sim_event *e)
{
    uint64_t gen = recorded(e);
    if (gen == 0 || ALOAD(&e->done_gen) >= gen)
        return SIM_OK; /* never recorded, or already complete: nothing to wait for */
    sim_op op = {.type = OP_WAIT};
    op.u.ev.ev = e;
    op.u.ev.gen = gen;
    sim_event_ref(e);
    __atomic_add_fetch(&e->pending_waits, 1, __ATOMIC_ACQ_REL);
    sim_status st = sim_stream_push(s, &op);
    if (st != SIM_OK) {
        __atomic_sub_fetch(&e->pending_waits, 1, __ATOMIC_ACQ_REL);
        sim_event_put(e);
    }
    return st;
}

static sim_status timed_sync(sim_event *e, uint64_t deadline_ns)
{
    if (wait_gen(e, recorded(e), deadline_ns))
        return SIM_OK;
    return sim_fail(SIM_E_TIMEOUT, "the event did not complete in time");
}

static sim_status query(sim_event *e)
{
    return ALOAD(&e->done_gen) >= recorded(e) ? SIM_OK : SIM_E_NOT_READY;
}

static sim_status elapsed(float *ms, sim_event *start, sim_event *end)
{
    if (!ms)
        return sim_fail(SIM_E_INVALID_VALUE, "the output pointer is NULL");
    sim_event *ev[2] = {start, end};
    uint64_t t[2];
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&ev[i]->lock);
        uint64_t rec = ev[i]->rec_gen, done = ev[i]->done_gen, reset = ev[i]->reset_gen;
        t[i] = ev[i]->t_ns;
        pthread_mutex_unlock(&ev[i]->lock);
        if (ev[i]->no_timing)
            return sim_fail(SIM_E_INVALID_HANDLE, "the %s event was created without timing", i ? "end" : "start");
        if (rec == reset)
            return sim_fail(SIM_E_NOT_RECORDED, "the %s event was never recorded", i ? "end" : "start");
        if (done < rec)
            return sim_fail(SIM_E_NOT_READY, "the %s event has not completed yet", i ? "end" : "start");
    }
    *ms = (float)((double)((int64_t)(t[1] - t[0])) / 1e6);
    return SIM_OK;
}

/* ---- entry points on handles -------------------------------------------------- */

/* Look up the event (and, where given, the stream), evaluate expr, drop them. */
#define WITH_EVENT(handle, expr)                       \
    do {                                               \
        sim_event *e = lookup(handle);                 \
        if (!e)                                        \
            return SIM_E_INVALID_HANDLE;               \
        sim_status st_ = (expr);                       \
        sim_event_put(e);                              \
        return st_;                                    \
    } while (0)

static sim_status on_stream(void *stream, sim_event *e, sim_status (*fn)(sim_stream *, sim_event *))
{
    sim_stream *s;
    sim_status st = sim_stream_get(stream, &s);
    if (st != SIM_OK)
        return st;
    st = fn(s, e);
    sim_stream_put(s);
    return st;
}

static sim_status record_on(sim_stream *s, sim_event *e) { return record(e, s); }

sim_status sim_event_record(void *event, void *stream) { WITH_EVENT(event, on_stream(stream, e, record_on)); }

sim_status sim_stream_wait_event(void *stream, void *event)
{
    sim_stream *s;
    sim_status st = sim_stream_get(stream, &s); /* the stream is checked first */
    if (st != SIM_OK)
        return st;
    sim_stream_put(s);
    WITH_EVENT(event, on_stream(stream, e, stream_wait));
}
sim_status sim_event_synchronize(void *event) { WITH_EVENT(event, timed_sync(e, 0)); }
sim_status sim_event_wait(void *event, int timeout_ms) { WITH_EVENT(event, timed_sync(e, sim_deadline(timeout_ms))); }
sim_status sim_event_query(void *event) { WITH_EVENT(event, query(e)); }

static void reset_now(void *arg)
{
    sim_event *e = arg;
    pthread_mutex_lock(&e->lock);
    e->reset_gen = e->rec_gen;
    pthread_mutex_unlock(&e->lock);
    sim_event_put(e);
}

static sim_status reset_on(sim_stream *s, sim_event *e)
{
    sim_op op = {.type = OP_HOST};
    op.u.host.fn = reset_now;
    op.u.host.arg = e;
    sim_event_ref(e);
    sim_status st = sim_stream_push(s, &op);
    if (st != SIM_OK)
        sim_event_put(e);
    return st;
}

sim_status sim_event_reset(void *event, void *stream) { WITH_EVENT(event, on_stream(stream, e, reset_on)); }

static sim_status status_of(sim_event *e, int *recorded, int *complete, int *waits_done)
{
    pthread_mutex_lock(&e->lock);
    *recorded = e->rec_gen != e->reset_gen;
    *complete = e->done_gen >= e->rec_gen;
    pthread_mutex_unlock(&e->lock);
    *waits_done = __atomic_load_n(&e->pending_waits, __ATOMIC_ACQUIRE) == 0;
    return SIM_OK;
}

sim_status sim_event_status(void *event, int *recorded, int *complete, int *waits_done)
{
    if (!recorded || !complete || !waits_done)
        return sim_fail(SIM_E_INVALID_VALUE, "the output pointer is NULL");
    WITH_EVENT(event, status_of(e, recorded, complete, waits_done));
}

sim_status sim_event_elapsed(float *ms, void *start, void *end)
{
    sim_event *a = lookup(start);
    if (!a)
        return SIM_E_INVALID_HANDLE;
    sim_event *b = lookup(end);
    sim_status st = b ? elapsed(ms, a, b) : SIM_E_INVALID_HANDLE;
    sim_event_put(b);
    sim_event_put(a);
    return st;
}

int anychip_sim_event_wait(void *event, int timeout_ms) { return sim_event_wait(event, timeout_ms); }
