#include "internal.h"

/* ========================================================================== */
/* collectives                                                                 */
/* ========================================================================== */

static char *small_slot(ccl_comm *c, int r, int b) { return c->small_data + ((size_t)r * 2 + (size_t)b) * c->small; }
static char *big_slot(ccl_comm *c, int r, int b) { return c->big_data + ((size_t)r * 2 + (size_t)b) * c->chunk; }

static void describe(const pub_t *p, char *buf, size_t len)
{
    int k = p->kind;
    const char *kn = k >= 0 && k < CCL_KIND_COUNT ? KIND_NAMES[k] : "?";
    const char *dn = p->dtype >= 0 && p->dtype < CCL_DTYPE_COUNT ? DTYPE_NAMES[p->dtype] : "?";
    size_t n = (size_t)snprintf(buf, len, "%s(count=%llu, %s", kn, (unsigned long long)p->count, dn);
    if (k == CCL_ALL_REDUCE || k == CCL_REDUCE || k == CCL_REDUCE_SCATTER)
        n += (size_t)snprintf(buf + n, len - n, ", %s", p->redop >= 0 && p->redop < CCL_REDOP_COUNT ?
                              REDOP_NAMES[p->redop] : "?");
    if (k == CCL_BROADCAST || k == CCL_REDUCE)
        n += (size_t)snprintf(buf + n, len - n, ", root=%d", p->root);
    snprintf(buf + n, len - n, ")");
}

/* check mode: compare every rank's signature (published before the first arrival) */
static int check_signatures(ctx_t *x, int parity)
{
    ccl_comm *c = x->c;
    pub_t *mine = &c->pubs[c->rank * 2 + parity];
    int same = 1;
    for (int r = 0; r < c->nranks && same; r++) {
        pub_t *p = &c->pubs[r * 2 + parity];
        same = p->kind == mine->kind && p->dtype == mine->dtype && p->count == mine->count &&
               (mine->kind != CCL_BROADCAST && mine->kind != CCL_REDUCE ? 1 : p->root == mine->root) &&
               (mine->kind != CCL_ALL_REDUCE && mine->kind != CCL_REDUCE && mine->kind != CCL_REDUCE_SCATTER
                    ? 1 : p->redop == mine->redop);
    }
    if (same)
        return CCL_OK;
    char msg[MSG_LEN];
    size_t n = (size_t)snprintf(msg, sizeof msg, "mismatched collective in %s (op #%llu; ANYCHIP_COLLECTIVE_CHECK): ",
                                c->label, (unsigned long long)c->opno);
    for (int r = 0; r < c->nranks && n < sizeof msg - 100; r++) {
        char d[160];
        describe(&c->pubs[r * 2 + parity], d, sizeof d);
        n += (size_t)snprintf(msg + n, sizeof msg - n, "%srank %d called %s", r ? ", " : "", r, d);
    }
    return fail(x, CCL_E_MISMATCH, "%s", msg);
}

/* element range [lo, hi) of n split in c->nranks slices: slice r */
static void slice(uint64_t n, int nr, int r, uint64_t *lo, uint64_t *hi)
{
    uint64_t q = n / (uint64_t)nr, rem = n % (uint64_t)nr;
    *lo = (uint64_t)r * q + MIN((uint64_t)r, rem);
    *hi = *lo + q + ((uint64_t)r < rem);
}

/* One round of the one-arrival path: elements [lo, lo + m) of each block, in the slots of
 * parity b (a slot holds `cap` elements of each block). */
typedef struct one_round {
    char *(*slot)(ccl_comm *, int, int);      /* small_slot or big_slot */
    int b;
    uint64_t lo, m, cap;
} one_round;

/* This rank's part of the round into its own slot (a broadcast: only the root's). */
static void put_round(ctx_t *x, const one_round *r, int blocks)
{
    ccl_comm *c = x->c;
    const ccl_op *o = x->op;
    if (o->kind == CCL_BROADCAST && c->rank != o->root)
        return;
    size_t es = DTYPE_SIZES[o->dtype];
    const char *send = o->send.ptr;
    char *mine = r->slot(c, c->rank, r->b);
    for (int i = 0; i < blocks; i++)
        copy(mine + (size_t)i * r->cap * es, send + ((size_t)i * o->count + r->lo) * es, r->m * es);
}

/* What this rank can do between its arrival and the others': the part of the round that
 * needs only its own slot (a broadcast root's copy into its recv; its own block of an
 * all_gather / all_to_all), so it overlaps the peers' work instead of following it.
 * Returns 1 when it did that part (take_round then skips it). */
static int own_round(ctx_t *x, const one_round *r)
{
    ccl_comm *c = x->c;
    const ccl_op *o = x->op;
    int me = c->rank;
    size_t es = DTYPE_SIZES[o->dtype];
    char *recv = o->recv.ptr;
    char *mine = r->slot(c, me, r->b);
    switch (o->kind) {
    case CCL_BROADCAST:
        if (me != o->root || !recv || recv == o->send.ptr)
            return 0;
        copy(recv + r->lo * es, mine, r->m * es);
        return 1;
    case CCL_ALL_GATHER:
        copy(recv + ((size_t)me * o->count + r->lo) * es, mine, r->m * es);
        return 1;
    case CCL_ALL_TO_ALL:
        copy(recv + ((size_t)me * o->count + r->lo) * es, mine + (size_t)me * r->cap * es, r->m * es);
        return 1;
    default:
        return 0;
    }
}

/* What this rank takes from every rank's slot once all have arrived (`own`: its own part
 * was done by own_round already). */
static void take_round(ctx_t *x, const one_round *r, int own)
{
    if (!own && r->m)
        own_round(x, r);
    ccl_comm *c = x->c;
    const ccl_op *o = x->op;
    int me = c->rank, N = c->nranks;
    size_t es = DTYPE_SIZES[o->dtype];
    uint64_t n = o->count, lo = r->lo, m = r->m;
    size_t mine = (size_t)me * r->cap * es;    /* this rank's block in a slot */
    char *recv = o->recv.ptr;
    const void *srcs[CCL_MAX_RANKS];
    switch (o->kind) {
    case CCL_ALL_REDUCE:
    case CCL_REDUCE:
        if (o->kind == CCL_REDUCE && me != o->root)
            break;
        for (int i = 0; i < N; i++)
            srcs[i] = r->slot(c, i, r->b);
        reduce1(o, recv + lo * es, srcs, N, m);
        break;
    case CCL_BROADCAST:
        if (me != o->root)
            copy(recv + lo * es, r->slot(c, o->root, r->b), m * es);
        break;
    case CCL_ALL_GATHER:
        for (int i = 0; i < N; i++)
            if (i != me)
                copy(recv + ((size_t)i * n + lo) * es, r->slot(c, i, r->b), m * es);
        break;
    case CCL_REDUCE_SCATTER:
        for (int i = 0; i < N; i++)
            srcs[i] = r->slot(c, i, r->b) + mine;
        reduce1(o, recv + lo * es, srcs, N, m);
        break;
    case CCL_ALL_TO_ALL:
        for (int i = 0; i < N; i++)
            if (i != me)
                copy(recv + ((size_t)i * n + lo) * es, r->slot(c, i, r->b) + mine, m * es);
        break;
    default:
        break;
    }
}

/* Rounds with one arrival each: every rank writes its part of the round into its slot
 * (parity b), arrives, waits for all, and takes what it needs from the others' slots. */
static int one_barrier_rounds(ctx_t *x, int small)
{
    ccl_comm *c = x->c;
    const ccl_op *o = x->op;
    int kind = o->kind;
    size_t es = DTYPE_SIZES[o->dtype];
    uint64_t n = o->count;
    int blocks = (kind == CCL_REDUCE_SCATTER || kind == CCL_ALL_TO_ALL) ? c->nranks : 1;
    one_round r = {small ? small_slot : big_slot, 0, 0, 0, 0};
    r.cap = (small ? c->small : c->chunk) / (uint64_t)blocks / es;
    uint64_t rounds = n ? (n + r.cap - 1) / r.cap : 1;
    for (uint64_t j = 0; j < rounds; j++) {
        r.lo = j * r.cap;
        r.m = MIN(r.cap, n - r.lo);
        r.b = (int)((small ? c->small_round++ : c->big_round++) & 1);
        put_round(x, &r, blocks);
        arrive(c);
        /* (in check mode the signatures are compared before anything is written to recv) */
        int own = !(j == 0 && c->check) && r.m && own_round(x, &r);
        int st = wait_all(x);
        if (st)
            return st;
        if (j == 0 && c->check && (st = check_signatures(x, (int)((c->seq - 1) & 1))))
            return st;
        take_round(x, &r, own);
    }
    return CCL_OK;
}

/* all_reduce / reduce of large messages: per round, reduce-scatter (rank r reduces slice r
 * of everyone's chunk into its own slot) then all-gather (copy every reduced slice out). */
static int reduce_rounds(ctx_t *x)
{
    ccl_comm *c = x->c;
    const ccl_op *o = x->op;
    int me = c->rank, N = c->nranks;
    size_t es = DTYPE_SIZES[o->dtype];
    uint64_t n = o->count, cap = c->chunk / es;
    const char *send = o->send.ptr;
    char *recv = o->recv.ptr;
    const void *srcs[CCL_MAX_RANKS];
    for (uint64_t lo = 0; lo < n; lo += cap) {
        uint64_t m = MIN(cap, n - lo);
        int b = (int)(c->big_round++ & 1);
        copy(big_slot(c, me, b), send + lo * es, m * es);
        int st = barrier_step(x);
        if (st)
            return st;
        if (lo == 0 && c->check && (st = check_signatures(x, (int)((c->seq - 1) & 1))))
            return st;
        uint64_t s0, s1;
        slice(m, N, me, &s0, &s1);
        for (int r = 0; r < N; r++)
            srcs[r] = big_slot(c, r, b) + s0 * es;
        if (s1 > s0)
            reduce1(o, big_slot(c, me, b) + s0 * es, srcs, N, s1 - s0);
        if ((st = barrier_step(x)))
            return st;
        if (o->kind == CCL_REDUCE && me != o->root)
            continue;
        for (int r = 0; r < N; r++) {
            slice(m, N, r, &s0, &s1);
            copy(recv + (lo + s0) * es, big_slot(c, r, b) + s0 * es, (s1 - s0) * es);
        }
    }
    return CCL_OK;
}

/* ---- zero-copy ------------------------------------------------------------ */

static void *ipc_map(ccl_comm *c, const uint8_t *h)
{
    ipc_entry *e = NULL;
    for (int i = 0; i < c->ncache; i++)
        if (memcmp(c->cache[i].h, h, CCL_IPC_BYTES) == 0) {
            e = &c->cache[i];
            break;
        }
    if (!e) {
        void *base = NULL;
        if (c->ipc_open(h, &base) != 0 || !base)
            return NULL;
        if (c->ncache == IPC_CACHE) { /* evict the least recently used mapping */
            int lru = 0;
            for (int i = 1; i < c->ncache; i++)
                if (c->cache[i].used < c->cache[lru].used)
                    lru = i;
            if (c->ipc_close)
                c->ipc_close(c->cache[lru].base);
            c->cache[lru] = c->cache[--c->ncache];
        }
        e = &c->cache[c->ncache++];
        memcpy(e->h, h, CCL_IPC_BYTES);
        e->base = base;
    }
    e->used = ++c->use_clock;
    return e->base;
}

/* Every rank's send and recv mapped here (own buffers as they are). */
static int map_peers(ctx_t *x, int parity, char **sp, char **rp)
{
    ccl_comm *c = x->c;
    for (int r = 0; r < c->nranks; r++) {
        pub_t *p = &c->pubs[r * 2 + parity];
        if (r == c->rank) {
            sp[r] = x->op->send.ptr;
            rp[r] = x->op->recv.ptr;
            continue;
        }
        sp[r] = rp[r] = NULL;
        for (int which = 0; which < 2; which++) {
            if (!(which ? p->recv_ipc : p->send_ipc))
                continue;
            char *b = ipc_map(c, which ? p->recv_h : p->send_h);
            if (!b) {
                const char *why;
                if (peer_gone(c, r, &why))
                    return fail(x, CCL_E_PEER_DEAD, "%s (op #%llu, %s) failed: missing rank %d (pid %d %s)", x->name,
                                (unsigned long long)c->opno, c->label, r, c->lines[r].pid, why);
                return fail(x, CCL_E_IPC, "%s (op #%llu, %s): cannot map rank %d's %s buffer", x->name,
                            (unsigned long long)c->opno, c->label, r, which ? "recv" : "send");
            }
            *(which ? &rp[r] : &sp[r]) = b + (which ? p->recv_off : p->send_off);
        }
    }
    return CCL_OK;
}

#define ZC_CHUNK (64 * 1024)

static int zero_copy(ctx_t *x, int parity)
{
    ccl_comm *c = x->c;
    const ccl_op *o = x->op;
    int me = c->rank, N = c->nranks;
    size_t es = DTYPE_SIZES[o->dtype];
    uint64_t n = o->count;
    char *sp[CCL_MAX_RANKS], *rp[CCL_MAX_RANKS];
    const void *srcs[CCL_MAX_RANKS];
    int st = map_peers(x, parity, sp, rp);
    if (st)
        return st;
    uint64_t lo, hi, step = ZC_CHUNK / es;
    switch (o->kind) {
    case CCL_ALL_REDUCE:
    case CCL_REDUCE:
        slice(n, N, me, &lo, &hi);
        for (uint64_t a = lo; a < hi; a += step) {
            uint64_t m = MIN(step, hi - a);
            for (int r = 0; r < N; r++)
                srcs[r] = sp[r] + a * es;
            void *dsts[CCL_MAX_RANKS];
            int nd = 0;
            if (o->kind == CCL_REDUCE)
                dsts[nd++] = rp[o->root] + a * es;
            else
                for (int r = 0; r < N; r++)
                    dsts[nd++] = rp[r] + a * es;
            REDUCERS[o->dtype](dsts, nd, srcs, N, m, o->redop, N);
        }
        break;
    case CCL_BROADCAST:
        if (me != o->root || sp[me] != rp[me])
            copy(rp[me], sp[o->root], n * es);
        break;
    case CCL_ALL_GATHER:
        for (int r = 0; r < N; r++)
            copy(rp[r] + (size_t)me * n * es, sp[me], n * es);
        break;
    case CCL_REDUCE_SCATTER:
        for (uint64_t a = 0; a < n; a += step) {
            uint64_t m = MIN(step, n - a);
            for (int r = 0; r < N; r++)
                srcs[r] = sp[r] + ((size_t)me * n + a) * es;
            reduce1(o, rp[me] + a * es, srcs, N, m);
        }
        break;
    default:
        return fail(x, CCL_E_INVALID, "%s has no zero-copy form", x->name);
    }
    return barrier_step(x);
}

static void publish(ccl_comm *c, const ccl_op *o, int parity, int zc)
{
    pub_t *p = &c->pubs[c->rank * 2 + parity];
    p->kind = o->kind;
    p->dtype = o->dtype;
    p->redop = o->redop;
    p->root = o->root;
    p->count = o->count;
    p->opno = c->opno;
    p->has_ipc = zc;
    p->send_ipc = zc && o->send.has_ipc;
    p->recv_ipc = zc && o->recv.has_ipc;
    if (p->send_ipc) {
        memcpy(p->send_h, o->send.ipc_handle, CCL_IPC_BYTES);
        p->send_off = o->send.ipc_offset;
    }
    if (p->recv_ipc) {
        memcpy(p->recv_h, o->recv.ipc_handle, CCL_IPC_BYTES);
        p->recv_off = o->recv.ipc_offset;
    }
}

int collective(ctx_t *x)
{
    ccl_comm *c = x->c;
    const ccl_op *o = x->op;
    int N = c->nranks;
    size_t es = DTYPE_SIZES[o->dtype];
    int blocks = (o->kind == CCL_REDUCE_SCATTER || o->kind == CCL_ALL_TO_ALL) ? N : 1;
    uint64_t contrib = o->count * es * (uint64_t)blocks;
    int parity = (int)(c->seq & 1);
    int reducing = o->kind == CCL_ALL_REDUCE || o->kind == CCL_REDUCE;
    int zc = c->ipc_open && o->send.has_ipc && o->recv.has_ipc && o->count * es >= c->zc_min &&
             o->kind != CCL_ALL_TO_ALL && o->kind != CCL_BARRIER;
    publish(c, o, parity, zc);
    if (zc) {
        int st = barrier_step(x);
        if (st)
            return st;
        if (c->check && (st = check_signatures(x, parity)))
            return st;
        for (int r = 0; r < N; r++)
            if (!c->pubs[r * 2 + parity].has_ipc) {
                char msg[MSG_LEN];
                snprintf(msg, sizeof msg, "%s (%s): rank %d cannot share its buffers but rank %d can; every "
                         "rank of a communicator must use the same kind of device", x->name, c->label, r, c->rank);
                do_abort(c, CCL_E_INVALID, msg);
                return fail(x, CCL_E_INVALID, "%s", msg);
            }
        return zero_copy(x, parity);
    }
    if (o->kind == CCL_BARRIER) {
        int st = barrier_step(x);
        if (!st && c->check)
            st = check_signatures(x, parity);
        return st;
    }
    if (contrib <= c->small_max)
        return one_barrier_rounds(x, 1);
    if (reducing)
        return reduce_rounds(x);
    return one_barrier_rounds(x, 0);
}
