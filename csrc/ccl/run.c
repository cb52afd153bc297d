#include "internal.h"

static int validate(ccl_comm *c, const ccl_op *o, char *msg, size_t len)
{
    if (o->kind < 0 || o->kind >= CCL_KIND_COUNT)
        return snprintf(msg, len, "unknown op kind %d", o->kind), CCL_E_INVALID;
    const char *k = KIND_NAMES[o->kind];
    if (o->dtype < 0 || o->dtype >= CCL_DTYPE_COUNT)
        return snprintf(msg, len, "%s: unknown dtype %d", k, o->dtype), CCL_E_INVALID;
    if (o->redop < 0 || o->redop >= CCL_REDOP_COUNT)
        return snprintf(msg, len, "%s: unknown reduce op %d", k, o->redop), CCL_E_INVALID;
    int rooted = o->kind == CCL_BROADCAST || o->kind == CCL_REDUCE || o->kind == CCL_SEND || o->kind == CCL_RECV;
    if (rooted && (o->root < 0 || o->root >= c->nranks))
        return snprintf(msg, len, "%s: %s %d is not a rank of 0..%d", k,
                        o->kind == CCL_SEND || o->kind == CCL_RECV ? "peer" : "root", o->root, c->nranks - 1),
               CCL_E_INVALID;
    if (o->count && o->kind != CCL_BARRIER) {
        int need_send = o->kind != CCL_RECV && !(o->kind == CCL_BROADCAST && o->root != c->rank);
        int need_recv = o->kind != CCL_SEND && !(o->kind == CCL_REDUCE && o->root != c->rank);
        if ((need_send && !o->send.ptr) || (need_recv && !o->recv.ptr))
            return snprintf(msg, len, "%s: %s buffer is NULL", k, need_send && !o->send.ptr ? "send" : "recv"),
                   CCL_E_INVALID;
    }
    return CCL_OK;
}

int ccl_run(ccl_comm *c, const ccl_op *ops, int nops)
{
    if (!c || (nops && !ops) || nops < 0)
        return CCL_E_INVALID;
    if (c->failed)
        return CCL_E_ABORTED;
    if (atomic_load(&c->hdr->aborted) == 2) {
        ctx_t x = {c, NULL, "op", 0};
        return check_abort(&x);
    }
    for (int i = 0; i < nops; i++) {
        int st = validate(c, &ops[i], c->err, sizeof c->err);
        if (st)
            return st;
    }
    uint64_t deadline = now_ns() + (uint64_t)(c->timeout * 1e9);
    rank_line_t *me = &c->lines[c->rank];
    /* point-to-point ops of the group first, together */
    ctx_t x = {c, NULL, "send/recv", deadline};
    atomic_store(&me->kind, CCL_SEND);
    int st = run_p2p(&x, ops, nops);
    for (int i = 0; i < nops && !st; i++) {
        if (ops[i].kind == CCL_SEND || ops[i].kind == CCL_RECV)
            continue;
        c->opno++;
        atomic_store(&me->opno, c->opno);
        atomic_store(&me->kind, ops[i].kind);
        ctx_t y = {c, &ops[i], KIND_NAMES[ops[i].kind], deadline};
        st = collective(&y);
    }
    if (st) /* peers may be waiting on this rank inside the op: end their waits too */
        do_abort(c, st, c->err);
    return st;
}

/* ========================================================================== */
/* tasks                                                                       */
/* ========================================================================== */

ccl_task *ccl_task_new(ccl_comm *c, const ccl_op *ops, int nops)
{
    if (!c || nops < 0)
        return NULL;
    ccl_task *t = calloc(1, sizeof *t + sizeof(ccl_op) * (size_t)nops);
    if (!t)
        return NULL;
    t->comm = c;
    t->nops = nops;
    if (nops)
        memcpy(t->ops, ops, sizeof(ccl_op) * (size_t)nops);
    atomic_store(&t->status, CCL_PENDING);
    return t;
}

void ccl_task_run(void *arg)
{
    ccl_task *t = arg;
    int st = ccl_run(t->comm, t->ops, t->nops);
    if (st)
        snprintf(t->err, sizeof t->err, "%s", t->comm->err[0] ? t->comm->err : ccl_status_name(st));
    atomic_store(&t->status, st);
    atomic_store(&t->done, 1);
    futex_wake(&t->done);
}

int ccl_task_status(const ccl_task *t) { return atomic_load(&t->status); }
const char *ccl_task_error(const ccl_task *t) { return t->err; }
void ccl_task_free(ccl_task *t) { free(t); }

int ccl_task_wait(ccl_task *t, double timeout_s)
{
    uint64_t start = now_ns();
    uint64_t deadline = timeout_s < 0 ? UINT64_MAX : start + (uint64_t)(timeout_s * 1e9);
    for (unsigned k = 1; !atomic_load(&t->done); k++) {
        uint64_t now = (k & 63) == 0 ? now_ns() : start;
        if (now - start < 50000) {
            cpu_relax();
            continue;
        }
        if (now >= deadline)
            break;
        futex_wait(&t->done, 0, MIN(deadline - now, 100000000ull));
    }
    return atomic_load(&t->status);
}
