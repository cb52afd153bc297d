/*
 * What the simulator's three collective front ends (hccl.c, bkcl.c, rccl.c) share.
 *
 * A vendor communicator is an anychip collective-engine communicator (csrc/ccl)
 * bound to the device that was current when it was created. Every op is checked when
 * it is called (the caller gets the vendor's error code at once), then turned into a
 * ccl_op and enqueued on the simulated stream as a host function that runs an engine
 * task: stream-ordered and asynchronous, as a device library's kernels are.
 *
 * Zero copy: the buffers of ops of at least ANYCHIP_CCL_ZERO_COPY_MIN bytes (default
 * 64 KiB) carry the simulator's IPC handle of their allocation, so the engine maps the
 * peers' device memory (once per allocation) and reduces straight from it.
 *
 * Ordering: ops of one communicator run in the order they were called, even when they
 * are issued on different streams (a stream that differs from the previous op's waits
 * for an event recorded on that one), so the engine never sees two ops of one
 * communicator at the same time.
 *
 * Failures of enqueued work (a peer that died, a timeout) are kept as the
 * communicator's asynchronous error; later calls on it return that error.
 *
 * Groups (ncclGroupStart / HcclGroupStart / bkcl_group_start): per thread; ops called
 * inside are checked and collected, and the outermost end enqueues each
 * communicator's ops as one engine task (point-to-point ops of a group progress
 * together, so a ring of send / recv cannot deadlock).
 */
#ifndef ANYCHIP_SIM_COLLECTIVE_H
#define ANYCHIP_SIM_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "ccl/ccl.h"
#include "core.h"

/* outcome of a front-end call, mapped by each vendor file to its result codes */
typedef enum sc_status {
    SC_OK = 0,
    SC_INVALID,      /* bad argument (unknown type / op, rank out of range, bad buffer) */
    SC_NULL,         /* a required pointer is NULL */
    SC_USAGE,        /* call not valid now (destroyed communicator, unbalanced group end) */
    SC_UNSUPPORTED,  /* a type / op combination the simulator cannot reduce */
    SC_TIMEOUT,      /* peers did not arrive in time */
    SC_REMOTE,       /* a peer died or aborted the communicator */
    SC_SYSTEM,       /* an operating-system call failed */
    SC_OOM,          /* host or device memory exhausted */
    SC_INTERNAL,
    SC_RUNTIME       /* the simulated runtime refused (bad stream, no current device) */
} sc_status;

typedef struct sc_comm sc_comm;

/* Unique ids: a printable name written at the start of an id of `size` bytes (the
 * rest zero). `vendor` is a short tag ("hccl", "nccl", "bkcl"). */
SIM_HIDDEN sc_status sc_unique_id(const char *vendor, void *id, size_t size);

/* Create the communicator of `rank` of `nranks` named by `id` on the calling thread's
 * current device (blocks until every rank has joined, at most the collective timeout). */
SIM_HIDDEN sc_status sc_comm_init(const char *vendor, const void *id, size_t size, int nranks, int rank,
                                  sc_comm **out);
/* Create several communicators at once, each of its rank on its device (one thread
 * each, so ranks of one process join each other): all are made, or none (*out NULL). */
typedef struct sc_init_req {
    const void *id;
    size_t size;
    int nranks, rank;
    int logical;                 /* the device, as the calling program numbers them */
    sc_comm **out;
} sc_init_req;
SIM_HIDDEN sc_status sc_comm_init_many(const char *vendor, const sc_init_req *reqs, int n);
/* Split `c` as ncclCommSplit does: every rank of `c` calls it (blocking); ranks of one
 * color >= 0 form a communicator on the parent's device, ranked by key, then by their
 * rank in `c`; color -1 takes part and gets *out = NULL. */
SIM_HIDDEN sc_status sc_comm_split(sc_comm *c, int color, int key, sc_comm **out, const char *fn);
/* Wait for the communicator's enqueued work, then free it. */
SIM_HIDDEN sc_status sc_comm_destroy(sc_comm *c);
/* Fail every rank's pending and future ops and return at once (the handle is dead; the
 * communicator is freed when its last enqueued task has run). `why` (NULL: a generic
 * message) is what the other ranks' failed ops say. */
SIM_HIDDEN sc_status sc_comm_abort(sc_comm *c);
SIM_HIDDEN sc_status sc_comm_abort_reason(sc_comm *c, const char *why);
/* SC_OK when `c` is a live communicator (else the detail message is set). */
SIM_HIDDEN sc_status sc_comm_check(const sc_comm *c, const char *fn);
SIM_HIDDEN int sc_comm_rank(const sc_comm *c);
SIM_HIDDEN int sc_comm_size(const sc_comm *c);
SIM_HIDDEN int sc_comm_device(const sc_comm *c);   /* logical device index */
/* A library getter `fn` of one of those numbers into `*out` (its argument named `arg`): fails
 * on a dead communicator or a NULL `out`, saying which. */
typedef enum { SC_COMM_SIZE, SC_COMM_RANK, SC_COMM_DEVICE } sc_comm_field;
SIM_HIDDEN sc_status sc_comm_get(const sc_comm *c, sc_comm_field f, const char *fn, const char *arg, int *out);
/* The first failure of enqueued work (SC_OK when none) and its message. */
SIM_HIDDEN sc_status sc_comm_async_error(const sc_comm *c, const char **msg);
/* A library's query `fn` of that failure into `*error` (its argument named `arg`): fails on a
 * dead communicator or a NULL `error`, saying which; a failure found is also the thread's
 * last message. */
SIM_HIDDEN sc_status sc_comm_get_async_error(const sc_comm *c, const char *fn, const char *arg, sc_status *error);
SIM_HIDDEN const char *sc_comm_name(const sc_comm *c);

/* One op as the front ends describe it. `dtype` and `redop` are ccl_dtype / ccl_redop
 * (-1 for movement ops, which then count bytes: pass count in bytes and
 * dtype CCL_UINT8). `root` is the root or the peer, -1 otherwise. For reduce on a
 * non-root rank recv may be NULL; for broadcast send may be NULL off the root. */
typedef struct sc_op {
    int kind;            /* ccl_kind */
    int dtype;
    int redop;
    int root;
    uint64_t count;
    const void *send;
    void *recv;
} sc_op;

/* `count` elements of a front end's data type as `o` counts them: a reducing op (redop >= 0)
 * counts elements of ccl_dtype `dtype`, a movement op (redop -1) count * size bytes. */
static inline void sc_op_types(sc_op *o, uint64_t count, int dtype, int size, int redop)
{
    o->dtype = redop < 0 ? CCL_UINT8 : dtype;
    o->redop = redop;
    o->count = redop < 0 ? count * (uint64_t)size : count;
}

/* Check `op` and enqueue it on `stream` (a vendor stream handle; NULL is the current
 * device's default stream), or add it to the calling thread's group. `fn` names the
 * vendor call for messages. */
SIM_HIDDEN sc_status sc_submit(sc_comm *c, const sc_op *op, void *stream, const char *fn);
/* Several ops as one: all are checked before any is enqueued, then they run as one engine
 * task (a group: point-to-point ops progress together, collectives in order); ops of
 * count 0 are left out. The v-variants (all-to-all-v, all-gather-v, ...) are built so. */
SIM_HIDDEN sc_status sc_submit_many(sc_comm *c, const sc_op *ops, int n, void *stream, const char *fn);

/* Read `narrays` arrays of `n` 64-bit words that lie in the communicator's device memory
 * (the count arrays a library reads on the device) into out[a * n ...], once the work
 * queued on `stream` before the call has run (so values it writes are seen). */
SIM_HIDDEN sc_status sc_device_words(sc_comm *c, void *stream, const void *const *arrays, const char *const *names,
                                     int narrays, int n, uint64_t *out, const char *fn);

SIM_HIDDEN sc_status sc_group_start(void);
SIM_HIDDEN sc_status sc_group_end(void);

/* The calling thread's detail message of the last failure (the core's). */
SIM_HIDDEN const char *sc_last_message(void);
SIM_HIDDEN sc_status sc_fail(sc_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* ANYCHIP_SIM_COLLECTIVE_H */
