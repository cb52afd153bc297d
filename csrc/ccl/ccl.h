/*
 * anychip collective engine: collectives between processes of one machine through
 * shared memory (libanychip_ccl).
 *
 * Used by every anychip transport on one node: the host transport (cpu and staged
 * devices), the zero-copy path of the simulated chips, and the simulator's native
 * collective libraries (HCCL / BKCL / RCCL front ends built on this API).
 *
 * Communicators
 *   ccl_comm_init(id, rank, nranks) attaches rank `rank` to the communicator named `id`
 *   (a short string every rank passes identically, e.g. "job42.0"). Rank 0 creates one
 *   shared segment (/dev/shm/anychip-ccl-<hash of id>); the others open it; the last rank
 *   to map it unlinks the name, so after init nothing is left in /dev/shm even when a
 *   rank is later killed. Init itself waits at most the communicator timeout.
 *
 * Operations
 *   An operation is described by a ccl_op (kind, buffers, count, dtype, reduce op,
 *   root or peer). Several ops form a group (NCCL group semantics): ccl_run runs the
 *   point-to-point ops of the group together (so a ring of send/recv cannot deadlock),
 *   then the collectives in order. Every rank must issue the same collectives in the
 *   same order with the same count / dtype / redop / root.
 *
 *   Sizes:  all_reduce / broadcast / reduce: count elements in send and recv;
 *           all_gather:     send count, recv nranks*count;
 *           reduce_scatter: send nranks*count, recv count;
 *           all_to_all:     send and recv nranks*count (block j goes to / comes from rank j);
 *           send / recv:    count elements to / from `root` (the peer);
 *           barrier:        no buffers.
 *   In place: send == recv (all_gather: send == recv + rank*count; reduce_scatter:
 *   recv == send + rank*count).
 *
 * Paths
 *   small messages  one cache line of flags per rank plus a small per-rank slot: one
 *                   arrival per op, every rank reduces the whole (tiny) message itself
 *                   in rank order, so every rank has identical bits; no syscalls unless
 *                   a peer is late.
 *   large, staged   chunked and double-buffered through a per-rank slot: rank r copies
 *                   its chunk in, reduces slice r of every rank's chunk (reduce-scatter),
 *                   and every rank copies all reduced slices out (all-gather).
 *   large, zero-copy when every rank's buffers carry an IPC handle (ccl_buf.ipc_*) and a
 *                   mapper is set (ccl_comm_set_ipc): peers' buffers are mapped (cached
 *                   per exported allocation) and rank r reduces slice r straight from
 *                   every peer's send buffer into every peer's recv buffer.
 *   Half types (float16, bfloat16) accumulate in float32 and are rounded once.
 *
 * Waiting and failure
 *   Waits spin briefly (ANYCHIP_CCL_SPIN_US, default 200, or 2 when the communicator has
 *   more ranks than the machine has cores; after 5 us it yields the core between polls),
 *   then sleep on a futex. Every
 *   wait checks the deadline (the communicator timeout, from the op's start) and, while
 *   it sleeps (at most every 10 ms), the liveness of the peers: /proc/<pid>/stat, where a
 *   zombie counts as dead and the start time guards against a reused pid.
 *   A failure aborts the communicator: the ranks still waiting are woken and fail too
 *   (CCL_E_ABORTED), naming the op and the missing ranks. After an error the
 *   communicator only accepts ccl_comm_destroy.
 *   Check mode (ccl_comm_set_check): every collective first compares each rank's
 *   (op, count, dtype, redop, root) and fails on every rank with a message listing what
 *   each rank called.
 *
 * Threads: one thread at a time per communicator runs ops (ccl_run or a task). Every
 * call returns a CCL_* status; ccl_comm_error gives the message of the last failure.
 */
#ifndef ANYCHIP_CCL_H
#define ANYCHIP_CCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Compiled into another library (a simulator's HCCL / BKCL / RCCL front end), define
 * CCL_EXPORT as __attribute__((visibility("hidden"))) so that library exports only its
 * vendor's names. */
#ifndef CCL_EXPORT
#define CCL_EXPORT __attribute__((visibility("default")))
#endif

#define CCL_MAX_RANKS 64
#define CCL_IPC_BYTES 64    /* size of an opaque IPC handle (anychip_sim_ipc_handle) */

typedef enum ccl_status {
    CCL_OK = 0,
    CCL_E_INVALID = 1,      /* bad argument (unknown dtype/op, root out of range, NULL buffer ...) */
    CCL_E_TIMEOUT = 2,      /* the deadline passed while waiting for peers */
    CCL_E_PEER_DEAD = 3,    /* a peer process died */
    CCL_E_MISMATCH = 4,     /* check mode: ranks called different ops */
    CCL_E_ABORTED = 5,      /* another rank failed and aborted the communicator */
    CCL_E_SYSTEM = 6,       /* an operating-system call failed (shm_open, mmap ...) */
    CCL_E_IPC = 7,          /* a peer's buffer could not be mapped */
    CCL_PENDING = 8         /* (ccl_task_status) not finished yet */
} ccl_status;

typedef enum ccl_kind {
    CCL_ALL_REDUCE = 0, CCL_BROADCAST, CCL_REDUCE, CCL_ALL_GATHER, CCL_REDUCE_SCATTER,
    CCL_ALL_TO_ALL, CCL_SEND, CCL_RECV, CCL_BARRIER, CCL_KIND_COUNT
} ccl_kind;

/* element types (values are anychip's own, not a vendor's) */
typedef enum ccl_dtype {
    CCL_INT8 = 0, CCL_UINT8, CCL_INT32, CCL_INT64, CCL_FLOAT16, CCL_BFLOAT16, CCL_FLOAT32,
    CCL_FLOAT64, CCL_INT16, CCL_UINT16, CCL_UINT32, CCL_UINT64, CCL_DTYPE_COUNT
} ccl_dtype;

typedef enum ccl_redop { CCL_SUM = 0, CCL_PROD, CCL_MIN, CCL_MAX, CCL_AVG, CCL_REDOP_COUNT } ccl_redop;

/* One buffer: its address in this process and, optionally, how peers can map it. */
typedef struct ccl_buf {
    void *ptr;                        /* host-addressable memory (NULL when count is 0) */
    uint64_t ipc_offset;              /* byte offset of ptr inside the exported allocation */
    int32_t has_ipc;                  /* 1 when ipc_handle is valid */
    int32_t reserved;
    uint8_t ipc_handle[CCL_IPC_BYTES];
} ccl_buf;

typedef struct ccl_op {
    int32_t kind;                     /* ccl_kind */
    int32_t dtype;                    /* ccl_dtype */
    int32_t redop;                    /* ccl_redop (reducing ops) */
    int32_t root;                     /* root (broadcast, reduce) or peer (send, recv) */
    uint64_t count;                   /* elements, see "Sizes" */
    ccl_buf send;
    ccl_buf recv;
} ccl_op;

typedef struct ccl_comm ccl_comm;

/* Functions that map a peer's exported allocation (the signatures of
 * anychip_sim_ipc_open / anychip_sim_ipc_close). */
typedef int (*ccl_ipc_open_fn)(const void *handle, void **ptr);
typedef int (*ccl_ipc_close_fn)(void *ptr);

/* ---- communicators -------------------------------------------------------- */

/* Attach to communicator `id` as `rank` of `nranks`, waiting at most `timeout_s` for
 * the others (0 = ANYCHIP_COLLECTIVE_TIMEOUT or 300 s). On failure *out is NULL and
 * ccl_init_error() says why. */
CCL_EXPORT int ccl_comm_init(const char *id, int rank, int nranks, double timeout_s, ccl_comm **out);
CCL_EXPORT const char *ccl_init_error(void);    /* the calling thread's last init failure */
/* Unlink this user's segments whose creator (rank 0) is gone: those of a job whose ranks were all
 * stopped while the communicator was being made, before the last rank joined and unlinked the name.
 * A launcher calls it once its ranks have exited. Returns how many it unlinked. */
CCL_EXPORT int ccl_sweep_segments(void);
/* Detach and free (never blocks on peers). Mappings made through the IPC mapper are closed. */
CCL_EXPORT int ccl_comm_destroy(ccl_comm *comm);
CCL_EXPORT int ccl_comm_rank(const ccl_comm *comm);
CCL_EXPORT int ccl_comm_size(const ccl_comm *comm);
/* seconds each op may wait for peers (applies to ops started after the call) */
CCL_EXPORT void ccl_comm_set_timeout(ccl_comm *comm, double seconds);
CCL_EXPORT void ccl_comm_set_check(ccl_comm *comm, int on);
/* a label used in error messages (e.g. "group world" or "group split(color=1)") */
CCL_EXPORT void ccl_comm_set_label(ccl_comm *comm, const char *label);
/* enable the zero-copy path: `open` maps a peer's handle, `close` unmaps it */
CCL_EXPORT void ccl_comm_set_ipc(ccl_comm *comm, ccl_ipc_open_fn open, ccl_ipc_close_fn close);
/* Message bytes from which the staged path (and zero-copy) replace the small path.
 * Read by ccl_comm_init from ANYCHIP_CCL_SMALL (default 4096); exposed for tests. */
CCL_EXPORT void ccl_comm_set_thresholds(ccl_comm *comm, uint64_t small_max, uint64_t zero_copy_min);
/* Mark the communicator failed and wake every rank's waits (they fail with CCL_E_ABORTED). */
CCL_EXPORT void ccl_comm_abort(ccl_comm *comm, const char *why);
/* Message of the communicator's last failure ("" when none). */
CCL_EXPORT const char *ccl_comm_error(const ccl_comm *comm);

/* ---- running ops ----------------------------------------------------------- */

/* Run a group of ops to completion on the calling thread. */
CCL_EXPORT int ccl_run(ccl_comm *comm, const ccl_op *ops, int nops);

/* The same, deferred: a task holds a copy of the ops; ccl_task_run (a void(*)(void*)
 * suitable for anychip_sim_stream_enqueue_host_fn, aclrtLaunchCallback ...) runs them
 * and publishes the status; ccl_task_wait waits for that (futex). */
typedef struct ccl_task ccl_task;
CCL_EXPORT ccl_task *ccl_task_new(ccl_comm *comm, const ccl_op *ops, int nops);
CCL_EXPORT void ccl_task_run(void *task);
/* CCL_PENDING while not run yet, else the status ccl_run returned */
CCL_EXPORT int ccl_task_status(const ccl_task *task);
/* wait up to timeout_s (< 0: forever); returns ccl_task_status */
CCL_EXPORT int ccl_task_wait(ccl_task *task, double timeout_s);
CCL_EXPORT const char *ccl_task_error(const ccl_task *task);   /* message when it failed */
CCL_EXPORT void ccl_task_free(ccl_task *task);

/* ---- helpers ----------------------------------------------------------------- */

CCL_EXPORT size_t ccl_dtype_size(int dtype);
CCL_EXPORT const char *ccl_status_name(int status);
/* Reduce nsrc arrays of n elements into dst in source order (dst may alias srcs[0]);
 * the local kernel the engine uses, exported for front ends and tests. */
CCL_EXPORT int ccl_reduce_local(void *dst, const void *const *srcs, int nsrc, uint64_t n, int dtype, int redop,
                                int divisor);

#ifdef __cplusplus
}
#endif
#endif /* ANYCHIP_CCL_H */
