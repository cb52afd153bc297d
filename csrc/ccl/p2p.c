#include "internal.h"

/* ---- point to point ----------------------------------------------------------- */

typedef struct p2p {
    const ccl_op *op;
    uint64_t done, total;     /* bytes */
    int peer, sending;
} p2p_t;

static chan_ctl_t *chan_ctl(ccl_comm *c, int src, int dst) { return &c->chans[src * c->nranks + dst]; }
static char *chan_buf(ccl_comm *c, int src, int dst, int half)
{
    return c->chan_data + ((size_t)src * (size_t)c->nranks + (size_t)dst) * c->chan + (size_t)half * (c->chan / 2);
}

/* One step of a transfer if the channel allows it: 1 progressed, 0 not now, < 0 error. */
static int p2p_step(ctx_t *x, p2p_t *t)
{
    ccl_comm *c = x->c;
    uint64_t halfsz = c->chan / 2;
    if (t->sending) {
        chan_ctl_t *ch = chan_ctl(c, c->rank, t->peer);
        uint64_t posted = atomic_load(&ch->posted);
        if (posted - atomic_load_explicit(&ch->consumed, memory_order_acquire) >= 2)
            return 0;
        int h = (int)(posted & 1);
        uint64_t m = MIN(halfsz, t->total - t->done);
        copy(chan_buf(c, c->rank, t->peer, h), (const char *)t->op->send.ptr + t->done, m);
        ch->len[h] = m;
        ch->msg_len[h] = t->total;
        atomic_store_explicit(&ch->posted, posted + 1, memory_order_release);
        ring(c, t->peer);
        t->done += m;
        if (t->total == 0)
            t->done = 1, t->total = 1;
        return 1;
    }
    chan_ctl_t *ch = chan_ctl(c, t->peer, c->rank);
    uint64_t consumed = atomic_load(&ch->consumed);
    if (atomic_load_explicit(&ch->posted, memory_order_acquire) == consumed)
        return 0;
    int h = (int)(consumed & 1);
    if (ch->msg_len[h] != t->total)
        return -fail(x, CCL_E_MISMATCH, "recv (%s): rank %d sends %llu bytes but rank %d expects %llu bytes", c->label,
                     t->peer, (unsigned long long)ch->msg_len[h], c->rank, (unsigned long long)t->total);
    uint64_t m = ch->len[h];
    copy((char *)t->op->recv.ptr + t->done, chan_buf(c, t->peer, c->rank, h), m);
    atomic_store_explicit(&ch->consumed, consumed + 1, memory_order_release);
    ring(c, t->peer);
    t->done += m;
    if (t->total == 0)
        t->done = 1, t->total = 1;
    return 1;
}

typedef struct p2p_set {
    p2p_t *t;
    int n;
} p2p_set;

static int p2p_can_step(ctx_t *x, const void *arg)
{
    const p2p_set *s = arg;
    ccl_comm *c = x->c;
    for (int i = 0; i < s->n; i++) {
        const p2p_t *t = &s->t[i];
        if (t->done >= t->total && t->total)
            continue;
        if (t->sending) {
            chan_ctl_t *ch = chan_ctl(c, c->rank, t->peer);
            if (atomic_load(&ch->posted) - atomic_load(&ch->consumed) < 2)
                return 1;
        } else {
            chan_ctl_t *ch = chan_ctl(c, t->peer, c->rank);
            if (atomic_load(&ch->posted) != atomic_load(&ch->consumed))
                return 1;
        }
    }
    return 0;
}

static void p2p_lagging(ctx_t *x, const void *arg, char *buf, size_t len)
{
    const p2p_set *s = arg;
    size_t p = 0;
    for (int i = 0; i < s->n && p < len - 64; i++) {
        const p2p_t *t = &s->t[i];
        if (t->total && t->done >= t->total)
            continue;
        p += (size_t)snprintf(buf + p, len - p, "%s%s rank %d (%llu of %llu bytes done)", p ? "; " : "",
                              t->sending ? "send to" : "recv from", t->peer, (unsigned long long)t->done,
                              (unsigned long long)t->total);
    }
    (void)x;
}

int run_p2p(ctx_t *x, const ccl_op *ops, int nops)
{
    p2p_t t[256];
    int n = 0;
    for (int i = 0; i < nops; i++) {
        if (ops[i].kind != CCL_SEND && ops[i].kind != CCL_RECV)
            continue;
        if (n == 256)
            return fail(x, CCL_E_INVALID, "a group may hold at most 256 send/recv ops");
        p2p_t *p = &t[n++];
        p->op = &ops[i];
        p->sending = ops[i].kind == CCL_SEND;
        p->peer = ops[i].root;
        p->done = 0;
        p->total = ops[i].count * DTYPE_SIZES[ops[i].dtype];
    }
    if (!n)
        return CCL_OK;
    x->name = n == 1 ? KIND_NAMES[t[0].op->kind] : "group of send/recv";
    p2p_set set = {t, n};
    for (;;) {
        int left = 0, progressed = 0;
        uint64_t busy_send = 0, busy_recv = 0;
        /* the peers whose liveness matters: those of the transfers not done yet. A send is done
         * once its last piece is in the channel, so a peer that has received it and left (its
         * own part of the group done, then destroyed or exited) fails nobody; the message it
         * sent stays in the channel for the receiver, as outside a group. */
        uint64_t peers = 0;
        for (int i = 0; i < n; i++) {
            p2p_t *p = &t[i];
            if (p->total && p->done >= p->total)
                continue;
            uint64_t *busy = p->sending ? &busy_send : &busy_recv;
            if (*busy >> p->peer & 1) { /* an earlier transfer on the same channel comes first */
                peers |= 1ull << p->peer;
                left++;
                continue;
            }
            int r;
            while ((r = p2p_step(x, p)) > 0 && p->done < p->total)
                progressed = 1;
            if (r < 0)
                return -r;
            if (r > 0)
                progressed = 1;
            if (!(p->total && p->done >= p->total)) {
                *busy |= 1ull << p->peer;
                peers |= 1ull << p->peer;
                left++;
            }
        }
        if (!left)
            return CCL_OK;
        if (!progressed) {
            int st = wait_until(x, p2p_can_step, &set, peers, p2p_lagging);
            if (st)
                return st;
        }
    }
}
