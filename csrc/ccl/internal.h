/*
 * anychip collective engine: shared memory between the processes of one machine.
 * The interface and the algorithms are described in ccl.h.
 *
 * Segment layout (one per communicator, offsets fixed at init):
 *   header       magic, size, geometry, abort state
 *   rank lines   one cache line per rank: arrival counter, doorbell, sleeping flag,
 *                pid and start time (liveness), the op it is in (for messages)
 *   pubs         per rank two publication slots (by arrival parity): op signature and
 *                IPC handles of its buffers
 *   channels     per ordered pair (src, dst): a control line and two half buffers for
 *                send / recv
 *   small slots  per rank two slots of `small` bytes (one-round ops)
 *   big slots    per rank two slots of `chunk` bytes (chunked rounds)
 *
 * Arrivals: every collective is a fixed sequence of "arrive, wait for all"; each rank's
 * counter is monotone and all ranks advance in lockstep, so slot parity (counter & 1)
 * double-buffers every round.
 *
 * What the engine's files share (csrc/ccl: comm.c sets communicators up, wait.c waits for peers,
 * reduce.c holds the reduction kernels, algorithms.c the collectives, p2p.c point-to-point, run.c
 * checks and runs ops and tasks, util.c the small utilities). Everything declared here is hidden:
 * the library exports ccl.h's API only.
 */
#ifndef ANYCHIP_CCL_INTERNAL_H
#define ANYCHIP_CCL_INTERNAL_H

#pragma GCC optimize("O3")      /* the copy and reduce loops; also where a simulator library (-O2) links it */

#define _GNU_SOURCE
#include "ccl/ccl.h"
#include "common/half.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x414e4343u /* "ANCC" */
#define LINE 64
#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define NAME_LEN 64
#define MSG_LEN 1024
#define IPC_CACHE 64

enum { ST_EMPTY = 0, ST_ATTACHED = 1, ST_DETACHED = 2 };

typedef struct hdr {
    _Atomic uint32_t magic;
    int32_t nranks;
    int32_t creator_pid;
    _Atomic int32_t attached;
    uint64_t small, chunk, chan;
    uint64_t total;
    _Atomic int32_t aborted;      /* 0, 1 writing, 2 message ready */
    int32_t abort_status;
    char abort_msg[MSG_LEN];
} hdr_t;

typedef struct rank_line {
    _Atomic uint64_t seq;          /* arrivals */
    _Atomic uint32_t bell;         /* futex word */
    _Atomic uint32_t sleeping;
    _Atomic int32_t state;
    int32_t pid;
    uint64_t starttime;
    _Atomic uint64_t opno;         /* op it is in (for messages) */
    _Atomic int32_t kind;
    char pad[LINE - 44];
} __attribute__((aligned(LINE))) rank_line_t;

typedef struct pub {
    int32_t kind, dtype, redop, root;
    uint64_t count, opno;
    int32_t has_ipc, reserved;
    uint64_t send_off, recv_off;
    uint8_t send_h[CCL_IPC_BYTES], recv_h[CCL_IPC_BYTES];
    int32_t send_ipc, recv_ipc;
} __attribute__((aligned(LINE))) pub_t;

typedef struct chan_ctl {
    _Atomic uint64_t posted, consumed;
    uint64_t msg_len[2];
    uint64_t len[2];
    char pad[LINE - 48];
} __attribute__((aligned(LINE))) chan_ctl_t;

typedef struct ipc_entry {
    uint8_t h[CCL_IPC_BYTES];
    void *base;
    uint64_t used;
} ipc_entry;

struct ccl_comm {
    int rank, nranks;
    char *map;
    size_t map_len;
    hdr_t *hdr;
    rank_line_t *lines;
    pub_t *pubs;
    chan_ctl_t *chans;
    char *chan_data, *small_data, *big_data;
    uint64_t small, chunk, chan;
    uint64_t seq;                  /* my arrivals */
    uint64_t small_round, big_round; /* rounds through the small / big slots (their parity double-buffers) */
    uint64_t opno;
    double timeout;
    int check;
    uint64_t small_max, zc_min;
    int spin_ns;
    char label[NAME_LEN];
    char err[MSG_LEN];
    int failed;
    ccl_ipc_open_fn ipc_open;
    ccl_ipc_close_fn ipc_close;
    ipc_entry cache[IPC_CACHE];
    int ncache;
    uint64_t use_clock;
};

struct ccl_task {
    ccl_comm *comm;
    int nops;
    _Atomic int status;
    _Atomic uint32_t done;
    char err[MSG_LEN];
    ccl_op ops[];
};

typedef struct ctx {
    ccl_comm *c;
    const ccl_op *op;
    const char *name;
    uint64_t deadline;
} ctx_t;

typedef int (*ready_fn)(ctx_t *x, const void *arg);

#pragma GCC visibility push(hidden)

extern const char *const KIND_NAMES[], *const DTYPE_NAMES[], *const REDOP_NAMES[];
extern const size_t DTYPE_SIZES[];
extern __thread char init_err[MSG_LEN];   /* why this thread's last ccl_comm_init failed */

/* the longest timeout, in seconds (31 years): what "inf" means */
#define CCL_NEVER_S 1e9

static inline uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void futex_wait(_Atomic uint32_t *addr, uint32_t val, uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static inline void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
}

static inline void copy(void *dst, const void *src, size_t n)
{
    if (n && dst != src)
        memmove(dst, src, n);
}

/* util.c */
double env_number(const char *name, double dflt, int whole, int inf_ok);
uint64_t fnv1a(const char *s);
int proc_state(int pid, uint64_t *starttime, char *state);

/* reduce.c */
typedef void (*reduce_fn)(void *const *, int, const void *const *, int, size_t, int, int);
extern const reduce_fn REDUCERS[];
void reduce1(const ccl_op *o, void *dst, const void *const *srcs, int n, uint64_t m);

/* comm.c */
void ring_all(ccl_comm *c);
void ring(ccl_comm *c, int r);
void do_abort(ccl_comm *c, int status, const char *msg);

/* wait.c */
int fail(ctx_t *x, int st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int peer_gone(ccl_comm *c, int r, const char **why);
int check_abort(ctx_t *x);
int wait_until(ctx_t *x, ready_fn ready, const void *arg, uint64_t peers,
               void (*lagging)(ctx_t *, const void *, char *, size_t));
void arrive(ccl_comm *c);
int wait_all(ctx_t *x);
int barrier_step(ctx_t *x);

/* algorithms.c */
int collective(ctx_t *x);

/* p2p.c */
int run_p2p(ctx_t *x, const ccl_op *ops, int nops);

#pragma GCC visibility pop

#endif
