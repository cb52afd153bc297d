#include "internal.h"

/* ========================================================================== */
/* waiting                                                                     */
/* ========================================================================== */

int fail(ctx_t *x, int st, const char *fmt, ...)
{
    ccl_comm *c = x->c;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    c->failed = 1;
    return st;
}

/* A peer is gone when its process died (or is a zombie) or it destroyed the communicator. */
int peer_gone(ccl_comm *c, int r, const char **why)
{
    rank_line_t *l = &c->lines[r];
    if (atomic_load(&l->state) == ST_DETACHED) {
        *why = "left the communicator (destroyed it or exited)";
        return 1;
    }
    uint64_t t;
    char s;
    if (proc_state(l->pid, &t, &s) != 0 || s == 'Z' || s == 'X' || t != l->starttime) {
        *why = "died";
        return 1;
    }
    return 0;
}

int check_abort(ctx_t *x)
{
    hdr_t *h = x->c->hdr;
    if (atomic_load(&h->aborted) != 2)
        return 0;
    int st = h->abort_status ? h->abort_status : CCL_E_ABORTED;
    return fail(x, st, "%s", h->abort_msg);
}

/* Wait until ready(); `peers` lists the ranks whose liveness matters (bit r),
 * `lagging` names the ranks not there yet for the timeout message. */
int wait_until(ctx_t *x, ready_fn ready, const void *arg, uint64_t peers,
                      void (*lagging)(ctx_t *, const void *, char *, size_t))
{
    ccl_comm *c = x->c;
    if (ready(x, arg))
        return CCL_OK;
    /* spin until the spin time is up (2 us when ranks outnumber cores), then sleep on the
     * doorbell; after the first microseconds the spin yields the core between polls (as
     * MPICH's progress loop does), which keeps latency low on a busy machine */
    uint64_t start = now_ns(), spin_until = start + (uint64_t)c->spin_ns;
    for (unsigned k = 1;; k++) {
        if (ready(x, arg))
            return CCL_OK;
        cpu_relax();
        if ((k & 63) == 0) {
            if (atomic_load(&c->hdr->aborted) == 2)
                return check_abort(x);
            uint64_t t = now_ns();
            if (t > spin_until)
                break;
            if (t - start > 5000)
                sched_yield();
        }
    }
    rank_line_t *me = &c->lines[c->rank];
    uint64_t last_look = 0;
    for (;;) {
        uint32_t bell = atomic_load(&me->bell);
        atomic_store(&me->sleeping, 1);
        if (ready(x, arg)) {
            atomic_store(&me->sleeping, 0);
            return CCL_OK;
        }
        if (atomic_load(&c->hdr->aborted) == 2) {
            atomic_store(&me->sleeping, 0);
            return check_abort(x);
        }
        uint64_t t = now_ns();
        char buf[MSG_LEN / 2];
        if (t > x->deadline) {
            atomic_store(&me->sleeping, 0);
            buf[0] = 0;
            if (lagging)
                lagging(x, arg, buf, sizeof buf);
            char msg[MSG_LEN];
            snprintf(msg, sizeof msg, "%s (op #%llu, %s) timed out after %.1f s on rank %d%s%s (%s)", x->name,
                     (unsigned long long)c->opno, c->label, c->timeout, c->rank, buf[0] ? ": " : "", buf,
                     c->timeout_from);
            do_abort(c, CCL_E_TIMEOUT, msg);
            return fail(x, CCL_E_TIMEOUT, "%s", msg);
        }
        /* liveness, at most every 10 ms */
        size_t p = 0;
        buf[0] = 0;
        const char *why = "";
        int look = t - last_look > 10000000ull;
        if (look)
            last_look = t;
        for (int r = 0; look && r < c->nranks; r++)
            if (r != c->rank && (peers >> r & 1) && peer_gone(c, r, &why) && p < sizeof buf - 64)
                p += (size_t)snprintf(buf + p, sizeof buf - p, "%s%d (pid %d %s)", p ? ", " : "", r,
                                      c->lines[r].pid, why);
        if (p) {
            atomic_store(&me->sleeping, 0);
            /* a peer that did its part and then left (ready() turned true after the check
             * above) is not a failure: its writes were published before it exited */
            if (ready(x, arg))
                return CCL_OK;
            char msg[MSG_LEN];
            snprintf(msg, sizeof msg, "%s (op #%llu, %s) failed: missing rank%s %s", x->name,
                     (unsigned long long)c->opno, c->label, strchr(buf, ',') ? "s" : "", buf);
            do_abort(c, CCL_E_PEER_DEAD, msg);
            return fail(x, CCL_E_PEER_DEAD, "%s", msg);
        }
        uint64_t left = x->deadline - t;
        futex_wait(&me->bell, bell, MIN(left, 20000000ull));
        atomic_store(&me->sleeping, 0);
    }
}

static int all_arrived(ctx_t *x, const void *arg)
{
    uint64_t target = *(const uint64_t *)arg;
    ccl_comm *c = x->c;
    for (int r = 0; r < c->nranks; r++)
        if (atomic_load_explicit(&c->lines[r].seq, memory_order_acquire) < target)
            return 0;
    return 1;
}

static void not_arrived(ctx_t *x, const void *arg, char *buf, size_t len)
{
    uint64_t target = *(const uint64_t *)arg;
    ccl_comm *c = x->c;
    size_t p = (size_t)snprintf(buf, len, "waiting for rank");
    int n = 0;
    for (int r = 0; r < c->nranks && p < len - 80; r++) {
        rank_line_t *l = &c->lines[r];
        if (atomic_load(&l->seq) < target) {
            int kind = atomic_load(&l->kind);
            uint64_t at = atomic_load(&l->opno);
            if (kind < 0 || kind >= CCL_KIND_COUNT || at == 0)
                p += (size_t)snprintf(buf + p, len - p, "%s %d (has not started any op)", n++ ? "," : "", r);
            else
                p += (size_t)snprintf(buf + p, len - p, "%s %d (last in op #%llu %s)", n++ ? "," : "", r,
                                      (unsigned long long)at, KIND_NAMES[kind]);
        }
    }
}

/* arrive (publish this rank's progress and wake the sleepers) */
void arrive(ccl_comm *c)
{
    uint64_t target = ++c->seq;
    atomic_store_explicit(&c->lines[c->rank].seq, target, memory_order_seq_cst);
    ring_all(c);
}

/* wait until every rank has arrived as often as this one */
int wait_all(ctx_t *x)
{
    ccl_comm *c = x->c;
    uint64_t target = c->seq;
    uint64_t all = c->nranks >= 64 ? ~0ull : ((1ull << c->nranks) - 1);
    return wait_until(x, all_arrived, &target, all, not_arrived);
}

/* arrive, then wait until every rank has */
int barrier_step(ctx_t *x)
{
    arrive(x->c);
    return wait_all(x);
}
