/*
 * Streams: one worker thread per stream runs its queue of ops strictly in order. Ops
 * are checked when enqueued and again when they run; the first failure of an op is kept
 * ("sticky") and reported by the next synchronize. Also the copies and memsets.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================================== */
/* running ops                                                                */
/* ========================================================================== */

static sim_status run_copy(const sim_op *op, char *msg, size_t msglen)
{
    sim_status st = SIM_OK;
    pthread_rwlock_rdlock(&G.exec);
    if (sim_ref_valid(&op->u.copy.dref, op->u.copy.dst, op->u.copy.n) &&
        sim_ref_valid(&op->u.copy.sref, op->u.copy.src, op->u.copy.n))
        memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
    else
        st = SIM_E_ASYNC_FAULT;
    pthread_rwlock_unlock(&G.exec);
    if (st)
        snprintf(msg, msglen, "a queued copy of %zu bytes (%p -> %p) found its device memory freed before it "
                 "ran; it was skipped", op->u.copy.n, (const void *)op->u.copy.src, (void *)op->u.copy.dst);
    return st;
}

static sim_status run_set(const sim_op *op, char *msg, size_t msglen)
{
    sim_status st = SIM_OK;
    pthread_rwlock_rdlock(&G.exec);
    if (sim_ref_valid(&op->u.set.dref, op->u.set.dst, op->u.set.n))
        memset(op->u.set.dst, op->u.set.value, op->u.set.n);
    else
        st = SIM_E_ASYNC_FAULT;
    pthread_rwlock_unlock(&G.exec);
    if (st)
        snprintf(msg, msglen, "a queued memset of %zu bytes at %p found its device memory freed before it ran; "
                 "it was skipped", op->u.set.n, (void *)op->u.set.dst);
    return st;
}

static int wait_done(sim_stream *s, uint64_t target, uint64_t deadline_ns);

static sim_status run_op(const sim_op *op, char *msg, size_t msglen)
{
    switch (op->type) {
    case OP_COPY:
        return run_copy(op, msg, msglen);
    case OP_SET:
        return run_set(op, msg, msglen);
    case OP_RECORD: /* completed by run_next once the stream counts it as run */
        return SIM_OK;
    case OP_WAIT:
        sim_event_wait_gen(op->u.ev.ev, op->u.ev.gen);
        sim_event_put(op->u.ev.ev);
        return SIM_OK;
    case OP_HOST:
        op->u.host.fn(op->u.host.arg);
        return SIM_OK;
    case OP_AFTER:
        wait_done(op->u.after.s, op->u.after.target, 0);
        sim_stream_put(op->u.after.s);
        return SIM_OK;
    }
    return SIM_OK;
}

/* Run the op at the head of the queue (caller holds s->lock, which is released while
 * the op runs). A record completes its event only after `done` counts it, under the
 * lock: whoever sees the event complete then sees the stream's ops up to it run (a
 * query of the stream right after a synchronize of its last record reports it idle). */
static void run_next(sim_stream *s)
{
    sim_op op = s->ring[s->head & (s->cap - 1)];
    ASTORE(&s->running, 1);
    pthread_mutex_unlock(&s->lock);
    char msg[sizeof s->sticky_msg];
    sim_status st = run_op(&op, msg, sizeof msg);
    pthread_mutex_lock(&s->lock);
    if (st != SIM_OK && !s->has_sticky) { /* published before `done`, so a synchronizer sees it */
        s->sticky = st;
        snprintf(s->sticky_msg, sizeof s->sticky_msg, "%s", msg);
        ASTORE(&s->has_sticky, 1);
    }
    ASTORE(&s->head, s->head + 1);
    ASTORE(&s->running, 0);
    ASTORE(&s->done, s->head);
    if (op.type == OP_RECORD) { /* the lock order is the stream's, then the event's (as in record) */
        sim_event_complete(op.u.ev.ev, op.u.ev.gen);
        sim_event_put(op.u.ev.ev);
    }
    if (s->waiters)
        pthread_cond_broadcast(&s->done_cv);
}

/* The worker has something to do: an op it may start, or a stop with nothing left. */
static int worker_has_work(const void *ctx)
{
    const sim_stream *s = ctx;
    if (ALOAD(&s->running))
        return 0;
    if (ALOAD(&s->head) != ALOAD(&s->tail))
        return !ALOAD(&s->held);
    return ALOAD(&s->stop);
}

static void *stream_main(void *arg)
{
    sim_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (!worker_has_work(s)) {
            uint64_t spin = ALOAD(&s->held) ? 0 : G.spin_ns; /* the next op usually follows at once */
            pthread_mutex_unlock(&s->lock);
            sim_wait(worker_has_work, s, &s->lock, &s->work_cv, &s->sleeping, spin, 0);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        if (s->head == s->tail)
            break; /* stopped, and everything queued has run */
        run_next(s);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* A thread about to wait for ops up to `target` runs them itself while the worker is
 * not busy: the same ops, in the same order, one executor at a time, so the result is
 * the one the worker would produce, without the cost of two thread hand-offs. Host
 * callbacks and waits on incomplete events are left to the worker. */
static void help_run(sim_stream *s, uint64_t target)
{
    pthread_mutex_lock(&s->lock);
    while (!s->running && !s->held && s->head < target) {
        const sim_op *next = &s->ring[s->head & (s->cap - 1)];
        if (next->type == OP_HOST)
            break;
        if (next->type == OP_WAIT && ALOAD(&next->u.ev.ev->done_gen) < next->u.ev.gen)
            break;
        if (next->type == OP_AFTER && ALOAD(&next->u.after.s->done) < next->u.after.target)
            break;
        run_next(s);
    }
    if (!s->running && (s->head != s->tail || s->stop) && s->sleeping)
        pthread_cond_signal(&s->work_cv); /* hand what is left (or a stop) back to the worker */
    pthread_mutex_unlock(&s->lock);
}

struct done_ctx { const sim_stream *s; uint64_t target; };

static int done_reached(const void *ctx)
{
    const struct done_ctx *c = ctx;
    return ALOAD(&c->s->done) >= c->target;
}

/* Wait until the stream has run its ops up to `target`, or the deadline (0: none). */
static int wait_done(sim_stream *s, uint64_t target, uint64_t deadline_ns)
{
    if (ALOAD(&s->done) >= target)
        return 1;
    if (!ALOAD(&s->held))
        help_run(s, target);
    struct done_ctx c = {s, target};
    return sim_wait(done_reached, &c, &s->lock, &s->done_cv, &s->waiters, ALOAD(&s->held) ? 0 : G.wait_spin_ns,
                    deadline_ns);
}

/* ========================================================================== */
/* stream objects                                                             */
/* ========================================================================== */

static void stream_free(sim_stream *s)
{
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    free(s->ring);
    free(s);
}

void sim_stream_put(sim_stream *s)
{
    if (s && __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0)
        stream_free(s);
}

static void unlink_stream(sim_stream *s)
{
    sim_device *d = &G.dev[s->dev];
    pthread_mutex_lock(&d->streams_lock);
    if (s->prev) s->prev->next = s->next; else d->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
    pthread_mutex_unlock(&d->streams_lock);
}

/* refuse new work, let queued work finish (a held stream is released), stop the worker */
static void stop_stream(sim_stream *s)
{
    pthread_mutex_lock(&s->lock);
    s->dead = 1;
    ASTORE(&s->held, 0);
    ASTORE(&s->stop, 1);
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    unlink_stream(s);
    pthread_mutex_lock(&s->lock); /* wake anyone still synchronizing on it (done == tail now) */
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->lock);
}

static sim_status stream_new(int phys, int is_default, sim_stream **out)
{
    sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    s->cap = 64;
    s->ring = malloc(s->cap * sizeof *s->ring);
    if (!s->ring) {
        free(s);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    s->dev = phys;
    s->is_default = is_default;
    s->refs = 1; /* the registry's (or, for a default stream, the device's) reference */
    s->handle = new_handle(TAG_STREAM); /* a default stream's is internal only: NULL names it */
    pthread_mutex_init(&s->lock, NULL);
    sim_cond_init(&s->work_cv);
    sim_cond_init(&s->done_cv);
    int rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc) {
        stream_free(s);
        return sim_fail(SIM_E_OS, "cannot start a stream worker thread: %s", strerror(rc));
    }
    char name[16];
    snprintf(name, sizeof name, "sim-stream%d", phys);
    pthread_setname_np(s->thread, name);
    sim_device *d = &G.dev[phys];
    pthread_mutex_lock(&d->streams_lock);
    s->next = d->streams;
    if (d->streams)
        d->streams->prev = s;
    d->streams = s;
    pthread_mutex_unlock(&d->streams_lock);
    *out = s;
    return SIM_OK;
}

static sim_status default_stream(int phys, sim_stream **out)
{
    sim_device *d = &G.dev[phys];
    sim_stream *s = ALOAD(&d->default_stream);
    if (!s) {
        pthread_mutex_lock(&G.default_lock);
        s = d->default_stream;
        if (!s) {
            sim_status st = stream_new(phys, 1, &s);
            if (st != SIM_OK) {
                pthread_mutex_unlock(&G.default_lock);
                return st;
            }
            ASTORE(&d->default_stream, s);
        }
        pthread_mutex_unlock(&G.default_lock);
    }
    *out = s;
    return SIM_OK;
}

sim_status sim_stream_get(void *handle, sim_stream **out)
{
    if (!handle) {
        int phys;
        sim_status st = sim_current_phys(&phys);
        if (st == SIM_OK)
            st = default_stream(phys, out);
        if (st == SIM_OK)
            __atomic_add_fetch(&(*out)->refs, 1, __ATOMIC_RELAXED);
        return st;
    }
    sim_stream *s = sim_registry_get(handle, TAG_STREAM);
    if (!s)
        return sim_fail(SIM_E_INVALID_STREAM, "stream %p is not a live stream (destroyed, or never created)",
                        handle);
    *out = s;
    return SIM_OK;
}

sim_status sim_stream_create(void **handle)
{
    if (!handle)
        return sim_fail(SIM_E_INVALID_VALUE, "the output stream pointer is NULL");
    int phys;
    sim_status st = sim_current_phys(&phys);
    sim_stream *s = NULL;
    if (st == SIM_OK)
        st = stream_new(phys, 0, &s);
    if (st != SIM_OK)
        return st;
    if (sim_registry_add(s->handle, s)) {
        stop_stream(s); /* not reachable by anyone */
        stream_free(s);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    *handle = (void *)(uintptr_t)s->handle;
    return SIM_OK;
}

sim_status sim_stream_destroy(void *handle)
{
    if (!handle)
        return sim_fail(SIM_E_INVALID_STREAM, "the default stream cannot be destroyed");
    sim_stream *s = sim_registry_get(handle, TAG_STREAM);
    if (s && pthread_equal(pthread_self(), s->thread)) {
        sim_stream_put(s);
        return sim_fail(SIM_E_BUSY, "a stream cannot be destroyed from its own host callback");
    }
    sim_stream *taken = s ? sim_registry_take(handle, TAG_STREAM) : NULL;
    sim_stream_put(s);
    if (!taken)
        return sim_fail(SIM_E_INVALID_STREAM, "stream %p is not a live stream (destroyed, or never created)",
                        handle);
    stop_stream(taken);
    sim_stream_put(taken); /* the registry's reference */
    return SIM_OK;
}

/* the caller holds s->lock */
sim_status sim_stream_push_locked(sim_stream *s, const sim_op *op)
{
    if (s->dead)
        return sim_fail(SIM_E_INVALID_STREAM, "the stream is being destroyed");
    if (s->tail - s->head == s->cap) {
        size_t ncap = s->cap * 2;
        sim_op *nr = malloc(ncap * sizeof *nr);
        if (!nr)
            return sim_fail(SIM_E_HOST_ALLOC, "out of host memory for the stream queue");
        for (uint64_t k = s->head; k < s->tail; k++)
            nr[k & (ncap - 1)] = s->ring[k & (s->cap - 1)];
        free(s->ring);
        s->ring = nr;
        s->cap = ncap;
    }
    s->ring[s->tail & (s->cap - 1)] = *op;
    ASTORE(&s->tail, s->tail + 1);
    if (s->sleeping)
        pthread_cond_signal(&s->work_cv);
    return SIM_OK;
}

sim_status sim_stream_push_raw(sim_stream *s, const sim_op *op)
{
    pthread_mutex_lock(&s->lock);
    sim_status st = sim_stream_push_locked(s, op);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* Queue on s a wait for the first `target` ops of t, unless they have run already. */
static sim_status push_after(sim_stream *s, sim_stream *t)
{
    uint64_t target = ALOAD(&t->tail);
    if (ALOAD(&t->done) >= target)
        return SIM_OK;
    sim_op op = {.type = OP_AFTER};
    op.u.after.s = t;
    op.u.after.target = target;
    __atomic_add_fetch(&t->refs, 1, __ATOMIC_RELAXED);
    sim_status st = sim_stream_push_raw(s, &op);
    if (st != SIM_OK)
        sim_stream_put(t);
    return st;
}

/* HIP's legacy null stream (see sim_set_legacy_null_stream). Every wait refers to ops
 * queued before it was queued, so the waits can never form a cycle. */
sim_status sim_stream_order(sim_stream *s)
{
    if (!ALOAD(&G.legacy_null_stream) || ALOAD(&s->nonblocking))
        return SIM_OK;
    sim_device *d = &G.dev[s->dev];
    if (!s->is_default) {
        sim_stream *null = ALOAD(&d->default_stream);
        return null ? push_after(s, null) : SIM_OK;
    }
    sim_status st = SIM_OK;
    pthread_mutex_lock(&d->streams_lock); /* no one takes it while holding a stream's lock */
    for (sim_stream *t = d->streams; t && st == SIM_OK; t = t->next)
        if (t != s && !ALOAD(&t->nonblocking))
            st = push_after(s, t);
    pthread_mutex_unlock(&d->streams_lock);
    return st;
}

sim_status sim_stream_push(sim_stream *s, const sim_op *op)
{
    sim_status st = sim_stream_order(s);
    return st != SIM_OK ? st : sim_stream_push_raw(s, op);
}

sim_status sim_stream_join_blocking(void *stream, int *queued)
{
    sim_stream *s;
    sim_status st = sim_stream_get(stream, &s);
    if (st != SIM_OK)
        return st;
    uint64_t tail = ALOAD(&s->tail);
    st = sim_stream_order(s);
    *queued = ALOAD(&s->tail) != tail; /* (or another thread queued work meanwhile) */
    sim_stream_put(s);
    return st;
}

/* ========================================================================== */
/* synchronization                                                            */
/* ========================================================================== */

static sim_status synchronize(sim_stream *s)
{
    if (pthread_equal(pthread_self(), s->thread))
        return sim_fail(SIM_E_BUSY, "a stream cannot be synchronized from its own host callback");
    wait_done(s, ALOAD(&s->tail), 0);
    if (!ALOAD(&s->has_sticky))
        return SIM_OK;
    pthread_mutex_lock(&s->lock);
    sim_status st = s->has_sticky ? s->sticky : SIM_OK;
    if (s->has_sticky) {
        snprintf(t_msg, sizeof t_msg, "%s", s->sticky_msg);
        s->has_sticky = 0;
        s->sticky = SIM_OK;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static sim_status timed_wait(sim_stream *s, uint64_t deadline_ns)
{
    if (pthread_equal(pthread_self(), s->thread))
        return sim_fail(SIM_E_BUSY, "a stream cannot be waited for from its own host callback");
    if (wait_done(s, ALOAD(&s->tail), deadline_ns))
        return SIM_OK;
    return sim_fail(SIM_E_TIMEOUT, "the stream's work did not complete in time");
}

/* Look up the stream, run f on it, drop it. */
#define WITH_STREAM(handle, expr)                        \
    do {                                                 \
        sim_stream *s_ = NULL;                           \
        sim_status st_ = sim_stream_get((handle), &s_);  \
        if (st_ != SIM_OK)                               \
            return st_;                                  \
        sim_stream *s = s_;                              \
        st_ = (expr);                                    \
        sim_stream_put(s);                               \
        return st_;                                      \
    } while (0)

sim_status sim_stream_synchronize(void *stream) { WITH_STREAM(stream, synchronize(s)); }

sim_status sim_stream_wait(void *stream, int timeout_ms)
{
    WITH_STREAM(stream, timed_wait(s, sim_deadline(timeout_ms)));
}

static sim_status query(const sim_stream *s)
{
    return ALOAD(&s->done) >= ALOAD(&s->tail) ? SIM_OK : SIM_E_NOT_READY;
}

sim_status sim_stream_query(void *stream) { WITH_STREAM(stream, query(s)); }

static sim_status set_held(sim_stream *s, int held)
{
    pthread_mutex_lock(&s->lock);
    ASTORE(&s->held, held);
    if (!held && s->sleeping)
        pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->lock);
    return SIM_OK;
}

sim_status sim_stream_hold(void *stream) { WITH_STREAM(stream, set_held(s, 1)); }
sim_status sim_stream_release(void *stream) { WITH_STREAM(stream, set_held(s, 0)); }

/* Synchronize (deadline_ns == 0) or wait for every stream of a device. */
static sim_status device_wait(int phys, int timed, uint64_t deadline_ns)
{
    sim_status st = sim_resolve_device(&phys);
    if (st != SIM_OK)
        return st;
    sim_device *d = &G.dev[phys];
    sim_stream *stack[64], **list = stack;
    size_t n = 0, cap = 64;
    pthread_mutex_lock(&d->streams_lock);
    for (sim_stream *s = d->streams; s; s = s->next) {
        if (n == cap) {
            sim_stream **nl = malloc(cap * 2 * sizeof *nl);
            if (!nl)
                break;
            memcpy(nl, list, n * sizeof *nl);
            if (list != stack)
                free(list);
            list = nl;
            cap *= 2;
        }
        __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
        list[n++] = s;
    }
    pthread_mutex_unlock(&d->streams_lock);
    sim_status first = SIM_OK;
    char msg[sizeof t_msg];
    msg[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        /* modes 2 and 3 (drain) pass over held streams and the caller's own worker: nothing
         * would ever let them finish while this thread waits; mode 3 also over non-blocking ones */
        int skip = timed >= 2 && (ALOAD(&list[i]->held) || pthread_equal(pthread_self(), list[i]->thread) ||
                                  (timed == 3 && ALOAD(&list[i]->nonblocking)));
        if (skip)
            st = SIM_OK;
        else
            st = first == SIM_E_TIMEOUT ? SIM_OK : timed ? timed_wait(list[i], deadline_ns) : synchronize(list[i]);
        if (st != SIM_OK && first == SIM_OK) {
            first = st;
            snprintf(msg, sizeof msg, "%s", t_msg);
        }
        sim_stream_put(list[i]);
    }
    if (list != stack)
        free(list);
    if (first != SIM_OK)
        snprintf(t_msg, sizeof t_msg, "%s", msg);
    return first;
}

sim_status sim_device_synchronize(int phys) { return device_wait(phys, 0, 0); }
sim_status sim_device_wait(int phys, int timeout_ms) { return device_wait(phys, 1, sim_deadline(timeout_ms)); }
sim_status sim_device_drain(int phys) { return device_wait(phys, 2, 0); }
sim_status sim_device_drain_blocking(int phys) { return device_wait(phys, 3, 0); }

sim_status sim_stream_set_nonblocking(void *stream)
{
    if (!stream)
        return sim_fail(SIM_E_INVALID_STREAM, "the null stream cannot be made non-blocking");
    sim_stream *s;
    sim_status st = sim_stream_get(stream, &s);
    if (st == SIM_OK) {
        ASTORE(&s->nonblocking, 1); /* set before the handle is handed out */
        sim_stream_put(s);
    }
    return st;
}

static sim_status get_nonblocking(const sim_stream *s, int *out)
{
    *out = ALOAD(&s->nonblocking);
    return SIM_OK;
}

sim_status sim_stream_nonblocking(void *stream, int *out) { WITH_STREAM(stream, get_nonblocking(s, out)); }

/* ========================================================================== */
/* copies and memsets                                                         */
/* ========================================================================== */

static int want_for(int dir, int is_dst)
{
    switch (dir) {
    case SIM_H2H: return WANT_HOST;
    case SIM_H2D: return is_dst ? WANT_DEVICE : WANT_HOST;
    case SIM_D2H: return is_dst ? WANT_HOST : WANT_DEVICE;
    case SIM_D2D: return WANT_DEVICE;
    default: return WANT_ANY;
    }
}

static sim_status check_copy(void *dst, const void *src, size_t n, int dir, sim_ref *dref, sim_ref *sref)
{
    if (!dst || !src)
        return sim_fail(SIM_E_INVALID_VALUE, "copy with a NULL %s pointer", dst ? "source" : "destination");
    if (dir < SIM_H2H || dir > SIM_DEFAULT)
        return sim_fail(SIM_E_INVALID_VALUE, "unknown copy kind %d", dir);
    sim_status st = sim_check_range(dst, n, want_for(dir, 1), dref, "destination");
    if (st != SIM_OK)
        return st;
    return sim_check_range(src, n, want_for(dir, 0), sref, "source");
}

static sim_status push(void *stream, const sim_op *op) { WITH_STREAM(stream, sim_stream_push(s, op)); }

sim_status sim_memcpy_async(void *dst, const void *src, size_t n, int dir, void *stream)
{
    sim_op op = {.type = OP_COPY};
    sim_status st = n ? check_copy(dst, src, n, dir, &op.u.copy.dref, &op.u.copy.sref) : SIM_OK;
    if (st != SIM_OK || n == 0)
        return st;
    op.u.copy.dst = dst;
    op.u.copy.src = src;
    op.u.copy.n = n;
    return push(stream, &op);
}

sim_status sim_memset_async(void *dst, int value, size_t n, int device_only, void *stream)
{
    if (n == 0)
        return SIM_OK;
    if (!dst)
        return sim_fail(SIM_E_INVALID_VALUE, "memset of a NULL pointer");
    sim_op op = {.type = OP_SET};
    sim_status st = sim_check_range(dst, n, device_only ? WANT_DEVICE : WANT_ANY, &op.u.set.dref, "destination");
    if (st != SIM_OK)
        return st;
    op.u.set.dst = dst;
    op.u.set.value = value & 0xff;
    op.u.set.n = n;
    return push(stream, &op);
}

sim_status sim_enqueue_host_fn(void *stream, sim_host_fn fn, void *arg)
{
    if (!fn)
        return sim_fail(SIM_E_INVALID_VALUE, "host function is NULL");
    sim_op op = {.type = OP_HOST};
    op.u.host.fn = fn;
    op.u.host.arg = arg;
    return push(stream, &op);
}

/* wait for the current device's default stream (when it exists) */
static sim_status drain_default(void)
{
    if (G.sync_no_default_wait)
        return SIM_OK;
    int phys = -1;
    sim_status st = sim_current_phys(&phys);
    if (st != SIM_OK)
        return st;
    sim_stream *s = ALOAD(&G.dev[phys].default_stream);
    if (s && !pthread_equal(pthread_self(), s->thread))
        wait_done(s, ALOAD(&s->tail), 0);
    return SIM_OK;
}

sim_status sim_memcpy_sync(void *dst, const void *src, size_t n, int dir)
{
    if (n == 0)
        return SIM_OK;
    sim_ref dref, sref;
    sim_status st = check_copy(dst, src, n, dir, &dref, &sref);
    if (st != SIM_OK)
        return st;
    st = drain_default();
    if (st != SIM_OK)
        return st;
    pthread_rwlock_rdlock(&G.exec);
    st = check_copy(dst, src, n, dir, &dref, &sref); /* the memory may have been freed meanwhile */
    if (st == SIM_OK)
        memmove(dst, src, n);
    pthread_rwlock_unlock(&G.exec);
    return st;
}

sim_status sim_memset_sync(void *dst, int value, size_t n, int device_only)
{
    if (n == 0)
        return SIM_OK;
    if (!dst)
        return sim_fail(SIM_E_INVALID_VALUE, "memset of a NULL pointer");
    sim_ref ref;
    int want = device_only ? WANT_DEVICE : WANT_ANY;
    sim_status st = sim_check_range(dst, n, want, &ref, "destination");
    if (st != SIM_OK)
        return st;
    st = drain_default();
    if (st != SIM_OK)
        return st;
    pthread_rwlock_rdlock(&G.exec);
    st = sim_check_range(dst, n, want, &ref, "destination");
    if (st == SIM_OK)
        memset(dst, value & 0xff, n);
    pthread_rwlock_unlock(&G.exec);
    return st;
}

/* ========================================================================== */
/* exported controls                                                          */
/* ========================================================================== */

int anychip_sim_stream_hold(void *stream) { return sim_stream_hold(stream); }
int anychip_sim_stream_release(void *stream) { return sim_stream_release(stream); }

int anychip_sim_stream_enqueue_host_fn(void *stream, void (*fn)(void *), void *arg)
{
    return sim_enqueue_host_fn(stream, fn, arg);
}

int anychip_sim_stream_wait(void *stream, int timeout_ms) { return sim_stream_wait(stream, timeout_ms); }
int anychip_sim_device_wait(int timeout_ms) { return sim_device_wait(SIM_CURRENT, timeout_ms); }
