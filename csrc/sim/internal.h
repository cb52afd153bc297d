/*
 * Internals shared by the simulator core's files (never by the front ends, which see
 * only core.h). Everything here is hidden from the library's exports.
 */
#ifndef ANYCHIP_SIM_INTERNAL_H
#define ANYCHIP_SIM_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "core.h"

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define SIM_ALIGN 512u                      /* every allocation starts on this boundary */
#define SIM_PUNCH_MIN (256u * 1024u)        /* frees at least this big give pages back */

#define ALOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ASTORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ---- open-addressing map from non-zero 64-bit keys to pointers (handles.c) ---- */

typedef struct { uint64_t key; void *val; } map_slot;
typedef struct { map_slot *slots; size_t cap, n; } ptr_map;

SIM_HIDDEN void *map_get(const ptr_map *m, uint64_t key);
SIM_HIDDEN int map_put(ptr_map *m, uint64_t key, void *val);
SIM_HIDDEN void *map_del(ptr_map *m, uint64_t key);
/* grow *arr (of elem-sized items) to hold at least `need`; 0 or -1 */
SIM_HIDDEN int grow(void **arr, size_t *cap, size_t need, size_t elem);

/* ---- state ---------------------------------------------------------------- */

typedef struct { size_t off, size, rsize; uint64_t id; } sim_alloc;
typedef struct { size_t off, size; } sim_extent;
typedef struct sim_stream sim_stream;
typedef struct sim_event sim_event;

typedef struct sim_device {
    pthread_mutex_t lock;         /* the arena and its tables */
    char *base;                   /* arena mapping; NULL until first use (read atomically) */
    int fd;                       /* arena memfd, -1 when anonymous */
    size_t used;                  /* bytes taken by live allocations (rounded) */
    sim_alloc *allocs;            /* live allocations, sorted by offset */
    size_t nallocs, cap_allocs;
    sim_extent *frees;            /* free extents, sorted by offset, coalesced */
    size_t nfrees, cap_frees;
    pthread_mutex_t streams_lock;
    sim_stream *streams;          /* live streams of this device */
    sim_stream *default_stream;
} sim_device;

typedef struct sim_import {
    char *map;
    size_t map_len;
    char *ptr;
    size_t size;
    int dev;
    uint64_t id;
} sim_import;

/* what an op's pointer refers to, so the op can re-check it when it runs */
enum { REF_HOST = 0, REF_DEV = 1, REF_IMPORT = 2 };
typedef struct { int kind; int dev; uint64_t id; } sim_ref;

enum { OP_COPY = 1, OP_SET, OP_RECORD, OP_WAIT, OP_HOST, OP_AFTER };

typedef struct sim_op {
    int type;
    union {
        struct { char *dst; const char *src; size_t n; sim_ref dref, sref; } copy;
        struct { char *dst; int value; size_t n; sim_ref dref; } set;
        struct { sim_event *ev; uint64_t gen; } ev;
        struct { sim_host_fn fn; void *arg; } host;
        struct { sim_stream *s; uint64_t target; } after; /* another stream's first `target` ops (a reference held) */
    } u;
} sim_op;

struct sim_stream {
    uint64_t handle;
    int dev;
    int is_default;
    int refs;                     /* atomic */
    pthread_mutex_t lock;
    pthread_cond_t work_cv;       /* the worker waits for work / release / stop */
    pthread_cond_t done_cv;       /* synchronizers wait for completion */
    sim_op *ring;
    size_t cap;                   /* power of two */
    uint64_t head;                /* next op to run */
    uint64_t tail;                /* next free slot; read without the lock */
    uint64_t done;                /* ops completed; read without the lock */
    int held;                     /* read without the lock */
    int nonblocking;              /* HIP's hipStreamNonBlocking: legacy null-stream waits pass it over */
    int stop;                     /* read without the lock */
    int dead;
    int sleeping;                 /* the worker sleeps on work_cv */
    int running;                  /* an op is being executed (by the worker or a helping synchronizer) */
    int waiters;                  /* threads sleeping on done_cv */
    sim_status sticky;            /* first failure of an op since the last synchronize */
    int has_sticky;               /* read without the lock */
    char sticky_msg[256];
    pthread_t thread;
    sim_stream *prev, *next;      /* device list */
};

struct sim_event {
    uint64_t handle;
    int dev;
    int refs;                     /* atomic */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    uint64_t rec_gen;             /* records issued */
    uint64_t done_gen;            /* latest record completed; read without the lock */
    uint64_t t_ns;                /* completion time of done_gen */
    uint64_t reset_gen;           /* rec_gen when last reset: "never recorded" while rec_gen == reset_gen */
    int pending_waits;            /* waits on this event queued on streams and not yet passed (atomic) */
    int no_timing;                /* created without timing: elapsed time is refused */
    int waiters;
};

typedef struct sim_globals {
    pthread_mutex_t init_lock;
    int initialized;
    int nphys;
    size_t capacity;
    int nvis;
    int vis[SIM_MAX_DEVICES];
    int phys_to_log[SIM_MAX_DEVICES];
    char vis_value[80];           /* the visibility variable's value (truncated) */
    char vis_error[256];          /* why the visibility variable was rejected; "" when it was not */
    uint64_t spin_ns;             /* a stream worker's spin for its next op */
    uint64_t wait_spin_ns;        /* a synchronizing thread's spin (SIM_WAIT_SPIN_FACTOR x spin_ns) */
    int require_current;
    int sync_no_default_wait;     /* synchronous copies / memsets skip the default stream (ACL) */
    int legacy_null_stream;       /* HIP: the null stream and the blocking streams wait for each other */
    sim_device dev[SIM_MAX_DEVICES];
    pthread_rwlock_t exec;        /* read: an op touches memory; write: memory is freed or unmapped */
    pthread_mutex_t default_lock; /* creation of default streams */
    pthread_mutex_t reg_lock;
    ptr_map registry;             /* handle -> sim_stream* / sim_event* */
    uint64_t next_id;             /* atomic; ids are never reused */
    pthread_mutex_t host_lock;
    ptr_map host_allocs;          /* address -> size */
    pthread_mutex_t import_lock;
    sim_import *imports;
    size_t nimports, cap_imports;
} sim_globals;

SIM_HIDDEN extern sim_globals G;
SIM_HIDDEN extern __thread char t_msg[512];

static inline uint64_t new_id(void) { return __atomic_add_fetch(&G.next_id, 1, __ATOMIC_RELAXED); }

/* a physical device, or the current one for SIM_CURRENT (config.c) */
SIM_HIDDEN sim_status sim_resolve_device(int *phys);
/* the fork handler of each part: state from before fork() is dropped in the child */
SIM_HIDDEN void sim_exec_lock_init(void);
SIM_HIDDEN void sim_memory_atfork_child(void);
SIM_HIDDEN void sim_handles_atfork_child(void);

/* ---- memory.c -------------------------------------------------------------- */

enum { WANT_HOST = 0, WANT_DEVICE = 1, WANT_ANY = 2 };

/* the device whose arena holds p, or -1 */
SIM_HIDDEN int sim_arena_of(const void *p);
/* index of the last allocation whose offset is <= off, or -1 (caller holds d->lock) */
SIM_HIDDEN long sim_alloc_floor(const sim_device *d, size_t off);
/* check that [p, p+n) is usable as `what` and describe it in *ref (caller holds nothing) */
SIM_HIDDEN sim_status sim_check_range(const void *p, size_t n, int want, sim_ref *ref, const char *what);
/* re-check a reference while an op runs (caller holds G.exec for reading) */
SIM_HIDDEN int sim_ref_valid(const sim_ref *ref, const char *p, size_t n);

/* ---- handles.c ------------------------------------------------------------- */

#define TAG_STREAM 0x5u
#define TAG_EVENT 0xEu

static inline uint64_t new_handle(unsigned tag) { return (new_id() << 4) | tag; }

SIM_HIDDEN int sim_registry_add(uint64_t handle, void *obj);
/* the live object behind a handle, with a reference taken (NULL when there is none) */
SIM_HIDDEN void *sim_registry_get(void *handle, unsigned tag);
/* remove a handle; returns the object (its registry reference passes to the caller) */
SIM_HIDDEN void *sim_registry_take(void *handle, unsigned tag);

/* ---- wait.c ------------------------------------------------------------------ */

SIM_HIDDEN void sim_cond_init(pthread_cond_t *cv);   /* CLOCK_MONOTONIC, for timed waits */
/* deadline of a timeout in milliseconds; 0 (none) for a negative timeout */
SIM_HIDDEN uint64_t sim_deadline(int timeout_ms);

typedef int (*sim_ready_fn)(const void *ctx);

/* The simulator's one wait: until ready(ctx), spin for up to `spin_ns` (the next event
 * usually follows at once, and sleeping costs two thread hand-offs), then sleep on cv
 * under lock, counted in *sleepers so wakers signal only when someone sleeps, until
 * ready or the deadline (0: none). ready() is called with and without the lock and must
 * only read. Returns 1 when ready, 0 at the deadline. */
SIM_HIDDEN int sim_wait(sim_ready_fn ready, const void *ctx, pthread_mutex_t *lock, pthread_cond_t *cv,
                        int *sleepers, uint64_t spin_ns, uint64_t deadline_ns);

/* ---- stream.c / event.c ---------------------------------------------------- */

SIM_HIDDEN sim_status sim_stream_get(void *handle, sim_stream **out);
SIM_HIDDEN void sim_stream_put(sim_stream *s);
/* queue an op, after the legacy null-stream waits (sim_stream_order) */
SIM_HIDDEN sim_status sim_stream_push(sim_stream *s, const sim_op *op);
/* queue HIP's legacy null-stream waits on s (nothing unless the front end turned them on) */
SIM_HIDDEN sim_status sim_stream_order(sim_stream *s);
/* queue an op as it is */
SIM_HIDDEN sim_status sim_stream_push_raw(sim_stream *s, const sim_op *op);
SIM_HIDDEN sim_status sim_stream_push_locked(sim_stream *s, const sim_op *op); /* s->lock held */
SIM_HIDDEN void sim_event_put(sim_event *e);
SIM_HIDDEN void sim_event_ref(sim_event *e);
/* run a record / wait op on a stream (event.c) */
SIM_HIDDEN void sim_event_complete(sim_event *e, uint64_t gen);
SIM_HIDDEN void sim_event_wait_gen(sim_event *e, uint64_t gen);

#endif /* ANYCHIP_SIM_INTERNAL_H */
