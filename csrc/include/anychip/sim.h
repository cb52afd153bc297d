/*
 * The anychip simulator's own controls, exported by every simulator library
 * (libascend_sim, libkunlun_sim, libhygon_sim) beside the vendor's symbols. They exist
 * only in the simulator: a program that must also run on the vendor's library treats
 * them as optional. See docs/simulator.md. The text between the ANYCHIP-CDEF markers is
 * also anychip's cffi declaration of them.
 */
#ifndef ANYCHIP_SIM_H
#define ANYCHIP_SIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ANYCHIP-CDEF-BEGIN */
/* Inter-process memory handles (the simulated counterpart of cudaIpcGetMemHandle).
 * A handle names a whole allocation of the exporting process; opening it in another
 * process maps the same pages (through /proc/<pid>/fd/<fd>, or a descriptor the caller
 * received over a Unix socket) and returns the allocation's base address there, which
 * the importing simulator then accepts as device memory in copies. */
typedef struct anychip_sim_ipc_handle {
    uint32_t magic;      /* ANYCHIP_SIM_IPC_MAGIC */
    uint32_t version;    /* 1 */
    int32_t pid;         /* exporting process */
    int32_t fd;          /* arena memfd in the exporting process */
    int32_t device;      /* physical device */
    int32_t reserved0;
    uint64_t offset;     /* allocation start within the arena */
    uint64_t size;       /* allocation size in bytes */
    uint64_t alloc_id;   /* allocation id in the exporting process */
    uint8_t reserved[16];
} anychip_sim_ipc_handle;   /* 64 bytes */

/* the status of a timed wait that ran out (sim_status SIM_E_TIMEOUT) */
#define ANYCHIP_SIM_E_TIMEOUT 18

/* Stop a stream from starting queued work until anychip_sim_stream_release; work
 * queued meanwhile stays pending, so "not ready" states are deterministic in tests.
 * NULL means the default stream of the calling thread's current device. Holds do not
 * nest. Destroying a held stream releases it first. Returns 0 or a sim_status. */
int anychip_sim_stream_hold(void *stream);
int anychip_sim_stream_release(void *stream);
/* Run fn(arg) on the stream's worker thread, in order with the stream's other work. */
int anychip_sim_stream_enqueue_host_fn(void *stream, void (*fn)(void *), void *arg);
/* Interruptible waits: wait at most timeout_ms (< 0: no limit) for the work queued when
 * called on a stream, for an event, or for every stream of the calling thread's current
 * device. 0 when complete, SIM_E_TIMEOUT otherwise, or the handle's error. They only
 * wait: a failure of the work is still reported by the vendor's synchronize, so a caller
 * that must react to signals waits in slices and then calls the vendor's synchronize. */
int anychip_sim_stream_wait(void *stream, int timeout_ms);
int anychip_sim_event_wait(void *event, int timeout_ms);
int anychip_sim_device_wait(int timeout_ms);
/* Detail of the calling thread's most recent failure; "" when none. */
const char *anychip_sim_last_error(void);
const char *anychip_sim_status_string(int status);
/* physical device count, visible device count, per-device capacity */
int anychip_sim_config(int *physical_devices, int *visible_devices, uint64_t *capacity);
/* physical index of a visible (logical) device, -1 when out of range */
int anychip_sim_physical_device(int logical);

int anychip_sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *handle);
int anychip_sim_ipc_open(const anychip_sim_ipc_handle *handle, void **devptr);
int anychip_sim_ipc_open_fd(int fd, const anychip_sim_ipc_handle *handle, void **devptr);
int anychip_sim_ipc_close(void *devptr);

/* Abort a communicator of the simulator's HCCL, BKCL or RCCL as ncclCommAbort does, with
 * the reason the other ranks' failed ops report: every rank's pending and later ops fail
 * at once and the call returns without waiting for them; the handle is dead afterwards
 * (HCCL has no abort call of its own). 0, or non-zero with anychip_sim_last_error set. */
int anychip_sim_ccl_abort(void *comm, const char *reason);
/* The communicator's own timeout: each of its later ops waits at most `seconds` (> 0; 1e9 or
 * more is never) for its peers, whatever ANYCHIP_COLLECTIVE_TIMEOUT says (the vendors' libraries
 * have no per-communicator timeout; the plugin.h adapters' comm_init_rank_timeout calls this
 * over the simulator). 0, or non-zero with anychip_sim_last_error set. */
int anychip_sim_ccl_set_timeout(void *comm, double seconds);
/* The timeout of the communicators the calling thread's later communicator inits make (HCCL's
 * HcclCommInitRootInfo, BKCL's bkcl_init_rank, RCCL's ncclCommInitRank), as set_timeout gives
 * it, and the most their init waits for the peers to join; 0 (the start) is the default,
 * ANYCHIP_COLLECTIVE_TIMEOUT or 300 s. The plugin.h adapters' comm_init_rank_timeout sets it
 * around its init over the simulator. 0, or non-zero with anychip_sim_last_error set. */
int anychip_sim_ccl_init_timeout(double seconds);
/* ANYCHIP-CDEF-END */

#define ANYCHIP_SIM_IPC_MAGIC 0x41435349u /* "ISCA" */

/* Process-wide bit set of the configuration warnings already printed. Every simulator
 * library exports it; the copy in the first one loaded is the one used (config.c), so a
 * process that loads several simulator libraries prints each warning once. */
extern unsigned anychip_sim_warned;

#ifdef __cplusplus
}
#endif
#endif /* ANYCHIP_SIM_H */
