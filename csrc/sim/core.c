/*
 * The anychip chip simulator core. See core.h for the model and docs/simulator.md for
 * the user-facing description.
 */
#define _GNU_SOURCE
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SIM_ALIGN 512u                      /* every allocation starts on this boundary */
#define SIM_PUNCH_MIN (256u * 1024u)        /* frees at least this big give pages back */
#define SIM_DEFAULT_DEVICES 8
#define SIM_DEFAULT_MEMORY (16ull << 30)
#define SIM_DEFAULT_SPIN_US 20

#define ALOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ASTORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* ========================================================================== */
/* small utilities                                                            */
/* ========================================================================== */

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* open-addressing map from non-zero 64-bit keys to pointers (linear probing,
 * deletion by backward shift, so there are no tombstones) */
typedef struct { uint64_t key; void *val; } map_slot;
typedef struct { map_slot *slots; size_t cap, n; } ptr_map;

static inline size_t map_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static void *map_get(const ptr_map *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = map_hash(key) & mask;; i = (i + 1) & mask) {
        if (m->slots[i].key == key)
            return m->slots[i].val;
        if (m->slots[i].key == 0)
            return NULL;
    }
}

static int map_put(ptr_map *m, uint64_t key, void *val)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        map_slot *ns = calloc(ncap, sizeof *ns);
        if (!ns)
            return -1;
        for (size_t j = 0; j < m->cap; j++) {
            if (!m->slots[j].key)
                continue;
            size_t i = map_hash(m->slots[j].key) & (ncap - 1);
            while (ns[i].key)
                i = (i + 1) & (ncap - 1);
            ns[i] = m->slots[j];
        }
        free(m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    size_t mask = m->cap - 1, i = map_hash(key) & mask;
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & mask;
    if (!m->slots[i].key)
        m->n++;
    m->slots[i].key = key;
    m->slots[i].val = val;
    return 0;
}

static void *map_del(ptr_map *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1, i = map_hash(key) & mask;
    while (m->slots[i].key != key) {
        if (!m->slots[i].key)
            return NULL;
        i = (i + 1) & mask;
    }
    void *val = m->slots[i].val;
    /* backward-shift the following cluster */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->slots[j].key)
            break;
        size_t home = map_hash(m->slots[j].key) & mask;
        /* can the entry at j move to the hole at i? (is home cyclically outside (i, j]) */
        int movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].key = 0;
    m->slots[i].val = NULL;
    m->n--;
    return val;
}

/* ========================================================================== */
/* state                                                                      */
/* ========================================================================== */

typedef struct { size_t off, size, rsize; uint64_t id; } sim_alloc;
typedef struct { size_t off, size; } sim_extent;

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

enum { REF_HOST = 0, REF_DEV = 1, REF_IMPORT = 2 };
typedef struct { int kind; int dev; uint64_t id; } sim_ref;

enum { OP_COPY = 1, OP_SET, OP_RECORD, OP_WAIT, OP_HOST };

typedef struct sim_op {
    int type;
    union {
        struct { char *dst; const char *src; size_t n; sim_ref dref, sref; } copy;
        struct { char *dst; int value; size_t n; sim_ref dref; } set;
        struct { sim_event *ev; uint64_t gen; } ev;
        struct { sim_host_fn fn; void *arg; } host;
    } u;
} sim_op;

struct sim_stream {
    uint64_t handle;
    int dev;
    int is_default;
    int refs;                     /* atomic */
    pthread_mutex_t lock;
    pthread_cond_t work_cv;       /* worker waits for work / release / stop */
    pthread_cond_t done_cv;       /* synchronizers wait for completion */
    sim_op *ring;
    size_t cap;                   /* power of two */
    uint64_t head;                /* next op to run (worker) */
    uint64_t tail;                /* next free slot; read without the lock */
    uint64_t done;                /* ops completed; read without the lock */
    int held;                     /* read without the lock by the spinning worker */
    int stop;
    int dead;
    int sleeping;
    int running;                  /* an op is being executed (by the worker or a helping synchronizer) */
    int waiters;
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
    int waiters;
};

static struct {
    pthread_mutex_t init_lock;
    int initialized;
    int nphys;
    size_t capacity;
    int nvis;
    int vis[SIM_MAX_DEVICES];
    int phys_to_log[SIM_MAX_DEVICES];
    uint64_t spin_ns;
    int require_current;
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
} G = {
    .init_lock = PTHREAD_MUTEX_INITIALIZER,
    .exec = PTHREAD_RWLOCK_INITIALIZER,
    .default_lock = PTHREAD_MUTEX_INITIALIZER,
    .reg_lock = PTHREAD_MUTEX_INITIALIZER,
    .host_lock = PTHREAD_MUTEX_INITIALIZER,
    .import_lock = PTHREAD_MUTEX_INITIALIZER,
};

static __thread int t_dev = -1;           /* current device (physical) */
static __thread char t_msg[512];

#define TAG_STREAM 0x5u
#define TAG_EVENT 0xEu

static inline uint64_t new_id(void) { return __atomic_add_fetch(&G.next_id, 1, __ATOMIC_RELAXED); }

/* ========================================================================== */
/* errors                                                                     */
/* ========================================================================== */

static const char *const status_names[SIM_STATUS_COUNT] = {
    [SIM_OK] = "SIM_OK",
    [SIM_E_INVALID_VALUE] = "SIM_E_INVALID_VALUE",
    [SIM_E_INVALID_DEVICE] = "SIM_E_INVALID_DEVICE",
    [SIM_E_NO_DEVICE] = "SIM_E_NO_DEVICE",
    [SIM_E_NO_CONTEXT] = "SIM_E_NO_CONTEXT",
    [SIM_E_OUT_OF_MEMORY] = "SIM_E_OUT_OF_MEMORY",
    [SIM_E_HOST_ALLOC] = "SIM_E_HOST_ALLOC",
    [SIM_E_BAD_FREE] = "SIM_E_BAD_FREE",
    [SIM_E_OUT_OF_RANGE] = "SIM_E_OUT_OF_RANGE",
    [SIM_E_DIRECTION] = "SIM_E_DIRECTION",
    [SIM_E_INVALID_HANDLE] = "SIM_E_INVALID_HANDLE",
    [SIM_E_NOT_READY] = "SIM_E_NOT_READY",
    [SIM_E_NOT_RECORDED] = "SIM_E_NOT_RECORDED",
    [SIM_E_ASYNC_FAULT] = "SIM_E_ASYNC_FAULT",
    [SIM_E_NOT_SUPPORTED] = "SIM_E_NOT_SUPPORTED",
    [SIM_E_OS] = "SIM_E_OS",
    [SIM_E_BUSY] = "SIM_E_BUSY",
};

const char *sim_status_name(sim_status st)
{
    if ((unsigned)st < SIM_STATUS_COUNT && status_names[st])
        return status_names[st];
    return "SIM_E_UNKNOWN";
}

sim_status sim_fail(sim_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_msg, sizeof t_msg, fmt, ap);
    va_end(ap);
    return st;
}

const char *sim_last_message(void) { return t_msg; }
void sim_clear_message(void) { t_msg[0] = '\0'; }

/* ========================================================================== */
/* configuration                                                              */
/* ========================================================================== */

/* "17179869184", "16G", "16GiB", "512 MiB", "1.5g": units are binary (K = 1024) */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0)
        return -1;
    while (*end == ' ')
        end++;
    double mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    case 'b': case 'B': case '\0': break;
    default: return -1;
    }
    if (mult > 1) {
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
    } else if (*end == 'b' || *end == 'B') {
        end++;
    }
    if (*end != '\0')
        return -1;
    double bytes = v * mult;
    if (bytes > (double)(1ull << 50))
        return -1;
    *out = (size_t)bytes;
    return 0;
}

/* one decimal id made only of digits, or -1 */
static int parse_id(const char *s, size_t len)
{
    if (len == 0 || len > 4)
        return -1;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static void apply_visibility(const char *visible, int rule)
{
    G.nvis = 0;
    for (int i = 0; i < SIM_MAX_DEVICES; i++)
        G.phys_to_log[i] = -1;
    if (!visible) {
        for (int i = 0; i < G.nphys; i++)
            G.vis[G.nvis++] = i;
    } else {
        const char *p = visible;
        while (*p && G.nvis < SIM_MAX_DEVICES) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            const char *tok = p;
            if (rule == SIM_VIS_CUDA) { /* CUDA tolerates blanks around an id */
                while (len && *tok == ' ') { tok++; len--; }
                while (len && tok[len - 1] == ' ') len--;
            }
            int id = parse_id(tok, len);
            if (id < 0 || id >= G.nphys)
                break;
            int bad = 0;
            for (int k = 0; k < G.nvis; k++)
                if (G.vis[k] == id)
                    bad = 1;
            if (rule == SIM_VIS_ACL && G.nvis && id <= G.vis[G.nvis - 1])
                bad = 1;
            if (bad)
                break;
            G.vis[G.nvis++] = id;
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    for (int i = 0; i < G.nvis; i++)
        G.phys_to_log[G.vis[i]] = i;
}

static void atfork_child(void);

/* Frees take the exec lock for writing; prefer them, so a steady flow of copies on many
 * streams cannot keep a free waiting. No thread ever takes the read side twice. */
static void init_exec_lock(void)
{
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&G.exec, &attr);
    pthread_rwlockattr_destroy(&attr);
}

void sim_core_init(const char *visible, int rule)
{
    if (ALOAD(&G.initialized))
        return;
    pthread_mutex_lock(&G.init_lock);
    if (!G.initialized) {
        G.nphys = SIM_DEFAULT_DEVICES;
        const char *s = getenv("ANYCHIP_SIM_DEVICES");
        if (s && *s) {
            char *end;
            long v = strtol(s, &end, 10);
            if (*end == '\0' && v >= 0 && v <= SIM_MAX_DEVICES)
                G.nphys = (int)v;
            else
                fprintf(stderr, "anychip simulator: ignoring ANYCHIP_SIM_DEVICES=%s (want 0..%d)\n",
                        s, SIM_MAX_DEVICES);
        }
        G.capacity = SIM_DEFAULT_MEMORY;
        s = getenv("ANYCHIP_SIM_MEMORY");
        if (s && *s) {
            size_t v;
            if (parse_size(s, &v) == 0)
                G.capacity = v;
            else
                fprintf(stderr, "anychip simulator: ignoring ANYCHIP_SIM_MEMORY=%s (want bytes, or a "
                                "number with K/M/G/T, e.g. 16GiB)\n", s);
        }
        G.capacity = G.capacity / SIM_ALIGN * SIM_ALIGN;
        uint64_t spin_us = SIM_DEFAULT_SPIN_US;
        s = getenv("ANYCHIP_SIM_SPIN_US");
        if (s && *s) {
            char *end;
            long v = strtol(s, &end, 10);
            if (*end == '\0' && v >= 0 && v <= 1000000)
                spin_us = (uint64_t)v;
        }
        G.spin_ns = spin_us * 1000;
        for (int i = 0; i < SIM_MAX_DEVICES; i++) {
            pthread_mutex_init(&G.dev[i].lock, NULL);
            pthread_mutex_init(&G.dev[i].streams_lock, NULL);
            G.dev[i].fd = -1;
        }
        apply_visibility(visible, rule);
        init_exec_lock();
        pthread_atfork(NULL, NULL, atfork_child);
        ASTORE(&G.initialized, 1);
    }
    pthread_mutex_unlock(&G.init_lock);
}

void sim_set_require_current(int yes) { G.require_current = yes; }
int sim_visible_count(void) { return G.nvis; }
int sim_physical_count(void) { return G.nphys; }
size_t sim_capacity(void) { return G.capacity; }

int sim_logical_to_phys(int logical)
{
    return (logical >= 0 && logical < G.nvis) ? G.vis[logical] : -1;
}

int sim_phys_to_logical(int phys)
{
    return (phys >= 0 && phys < SIM_MAX_DEVICES) ? G.phys_to_log[phys] : -1;
}

sim_status sim_set_current(int logical)
{
    if (G.nvis == 0)
        return sim_fail(SIM_E_NO_DEVICE, "no simulated device is visible (check the visibility variable "
                                          "and ANYCHIP_SIM_DEVICES)");
    if (logical < 0 || logical >= G.nvis)
        return sim_fail(SIM_E_INVALID_DEVICE, "device %d does not exist: %d device(s) visible", logical, G.nvis);
    t_dev = G.vis[logical];
    return SIM_OK;
}

sim_status sim_current_phys(int *phys)
{
    if (t_dev < 0) {
        if (G.require_current)
            return sim_fail(SIM_E_NO_CONTEXT, "no device is set on this thread (call the set-device API first)");
        if (G.nvis == 0)
            return sim_fail(SIM_E_NO_DEVICE, "no simulated device is visible");
        t_dev = G.vis[0];
    }
    *phys = t_dev;
    return SIM_OK;
}

int sim_current_raw(void) { return t_dev; }
void sim_clear_current(void) { t_dev = -1; }

/* ========================================================================== */
/* device memory                                                              */
/* ========================================================================== */

/* A device's arena starts as private memory with transparent huge pages (the fastest
 * for copies); make_shareable() turns it into a memfd mapping at the same addresses the
 * first time an allocation of the device is exported to another process. */
static sim_status ensure_arena(sim_device *d, int phys)
{
    if (d->base)
        return SIM_OK;
    if (G.capacity == 0)
        return SIM_OK;
    char *base = mmap(NULL, G.capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (base == MAP_FAILED)
        return sim_fail(SIM_E_OS, "cannot reserve %zu bytes of address space for device %d: %s",
                        G.capacity, sim_phys_to_logical(phys), strerror(errno));
    madvise(base, G.capacity, MADV_HUGEPAGE);
    d->frees = malloc(16 * sizeof *d->frees);
    d->allocs = malloc(16 * sizeof *d->allocs);
    if (!d->frees || !d->allocs) {
        munmap(base, G.capacity);
        free(d->frees);
        free(d->allocs);
        d->frees = NULL;
        d->allocs = NULL;
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    d->cap_frees = d->cap_allocs = 16;
    d->frees[0] = (sim_extent){0, G.capacity};
    d->nfrees = 1;
    d->nallocs = 0;
    d->used = 0;
    d->fd = -1;
    ASTORE(&d->base, base);
    return SIM_OK;
}

/* Move the arena's pages into a memfd mapped over the same address range, keeping the
 * contents of live allocations. Caller holds G.exec for writing and d->lock, so no op,
 * allocation or free runs meanwhile. */
static sim_status make_shareable(sim_device *d, int phys)
{
    if (d->fd >= 0)
        return SIM_OK;
    char name[64];
    snprintf(name, sizeof name, "anychip-sim-dev%d", phys);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return sim_fail(SIM_E_NOT_SUPPORTED, "device memory cannot be shared here: memfd_create: %s",
                        strerror(errno));
    if (ftruncate(fd, (off_t)G.capacity) != 0) {
        int err = errno;
        close(fd);
        return sim_fail(SIM_E_OS, "cannot size the shared arena: %s", strerror(err));
    }
    for (size_t i = 0; i < d->nallocs; i++) {
        size_t off = d->allocs[i].off, left = d->allocs[i].rsize;
        while (left) {
            ssize_t w = pwrite(fd, d->base + off, left, (off_t)off);
            if (w <= 0) {
                int err = errno;
                close(fd);
                return sim_fail(SIM_E_OS, "cannot move device memory into the shared arena: %s", strerror(err));
            }
            off += (size_t)w;
            left -= (size_t)w;
        }
    }
    void *m = mmap(d->base, G.capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0);
    if (m == MAP_FAILED) {
        int err = errno;
        close(fd);
        return sim_fail(SIM_E_OS, "cannot map the shared arena: %s", strerror(err));
    }
    d->fd = fd;
    return SIM_OK;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* index of the last allocation whose offset is <= off, or -1 */
static long alloc_floor(const sim_device *d, size_t off)
{
    long lo = 0, hi = (long)d->nallocs - 1, ans = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if (d->allocs[mid].off <= off) {
            ans = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ans;
}

static void extent_insert(sim_device *d, size_t off, size_t size)
{
    size_t i = 0;
    {
        long lo = 0, hi = (long)d->nfrees - 1;
        size_t pos = d->nfrees;
        while (lo <= hi) {
            long mid = (lo + hi) / 2;
            if (d->frees[mid].off > off) {
                pos = (size_t)mid;
                hi = mid - 1;
            } else {
                lo = mid + 1;
            }
        }
        i = pos;
    }
    int merge_prev = i > 0 && d->frees[i - 1].off + d->frees[i - 1].size == off;
    int merge_next = i < d->nfrees && off + size == d->frees[i].off;
    if (merge_prev && merge_next) {
        d->frees[i - 1].size += size + d->frees[i].size;
        memmove(&d->frees[i], &d->frees[i + 1], (d->nfrees - i - 1) * sizeof *d->frees);
        d->nfrees--;
    } else if (merge_prev) {
        d->frees[i - 1].size += size;
    } else if (merge_next) {
        d->frees[i].off = off;
        d->frees[i].size += size;
    } else {
        /* the table was grown by the caller before anything changed */
        memmove(&d->frees[i + 1], &d->frees[i], (d->nfrees - i) * sizeof *d->frees);
        d->frees[i] = (sim_extent){off, size};
        d->nfrees++;
    }
}

sim_status sim_malloc(int phys, size_t nbytes, void **out)
{
    if (!out)
        return sim_fail(SIM_E_INVALID_VALUE, "the output pointer is NULL");
    if (phys < 0 || phys >= G.nphys)
        return sim_fail(SIM_E_INVALID_DEVICE, "bad device");
    sim_device *d = &G.dev[phys];
    size_t need = round_up(nbytes ? nbytes : 1, SIM_ALIGN);
    if (nbytes > G.capacity || need < nbytes) {
        size_t used;
        pthread_mutex_lock(&d->lock);
        used = d->used;
        pthread_mutex_unlock(&d->lock);
        return sim_fail(SIM_E_OUT_OF_MEMORY, "out of device memory on device %d: requested %zu bytes, "
                        "%zu of %zu bytes free", sim_phys_to_logical(phys), nbytes, G.capacity - used, G.capacity);
    }
    pthread_mutex_lock(&d->lock);
    sim_status st = ensure_arena(d, phys);
    if (st != SIM_OK) {
        pthread_mutex_unlock(&d->lock);
        return st;
    }
    long best = -1;
    size_t largest = 0;
    for (size_t i = 0; i < d->nfrees; i++) {
        size_t sz = d->frees[i].size;
        if (sz > largest)
            largest = sz;
        if (sz >= need && (best < 0 || sz < d->frees[best].size))
            best = (long)i;
    }
    if (best < 0) {
        size_t used = d->used;
        pthread_mutex_unlock(&d->lock);
        return sim_fail(SIM_E_OUT_OF_MEMORY, "out of device memory on device %d: requested %zu bytes, "
                        "%zu of %zu bytes free (largest free block %zu bytes)",
                        sim_phys_to_logical(phys), nbytes, G.capacity - used, G.capacity, largest);
    }
    if (grow((void **)&d->allocs, &d->cap_allocs, d->nallocs + 1, sizeof *d->allocs)) {
        pthread_mutex_unlock(&d->lock);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory for the allocation table");
    }
    size_t off = d->frees[best].off;
    d->frees[best].off += need;
    d->frees[best].size -= need;
    if (d->frees[best].size == 0) {
        memmove(&d->frees[best], &d->frees[best + 1], (d->nfrees - (size_t)best - 1) * sizeof *d->frees);
        d->nfrees--;
    }
    long pos = alloc_floor(d, off) + 1;
    memmove(&d->allocs[pos + 1], &d->allocs[pos], (d->nallocs - (size_t)pos) * sizeof *d->allocs);
    d->allocs[pos] = (sim_alloc){off, nbytes, need, new_id()};
    d->nallocs++;
    d->used += need;
    char *p = d->base + off;
    pthread_mutex_unlock(&d->lock);
    *out = p;
    return SIM_OK;
}

/* the device whose arena holds p, or -1 */
static int arena_of(const void *p)
{
    const char *c = p;
    for (int i = 0; i < G.nphys; i++) {
        const char *b = ALOAD(&G.dev[i].base);
        if (b && c >= b && c < b + G.capacity)
            return i;
    }
    return -1;
}

int sim_device_of(const void *ptr)
{
    int d = arena_of(ptr);
    if (d >= 0)
        return d;
    pthread_mutex_lock(&G.import_lock);
    for (size_t i = 0; i < G.nimports; i++) {
        const sim_import *im = &G.imports[i];
        if ((const char *)ptr >= im->ptr && (const char *)ptr < im->ptr + im->size) {
            d = im->dev;
            break;
        }
    }
    pthread_mutex_unlock(&G.import_lock);
    return d;
}

sim_status sim_free(void *ptr)
{
    int phys = arena_of(ptr);
    if (phys < 0)
        return sim_fail(SIM_E_BAD_FREE, "free of %p: not device memory of this simulator", ptr);
    sim_device *d = &G.dev[phys];
    /* exclusive against running ops, so no op is writing the block as it is released */
    pthread_rwlock_wrlock(&G.exec);
    pthread_mutex_lock(&d->lock);
    size_t off = (size_t)((char *)ptr - d->base);
    long i = alloc_floor(d, off);
    if (i < 0 || d->allocs[i].off != off) {
        int inside = i >= 0 && off < d->allocs[i].off + d->allocs[i].rsize;
        pthread_mutex_unlock(&d->lock);
        pthread_rwlock_unlock(&G.exec);
        if (inside)
            return sim_fail(SIM_E_BAD_FREE, "free of %p: points %zu bytes into an allocation, not at its "
                            "start", ptr, off - d->allocs[i].off);
        return sim_fail(SIM_E_BAD_FREE, "free of %p: not a live allocation of device %d (already freed, "
                        "or never allocated)", ptr, sim_phys_to_logical(phys));
    }
    if (grow((void **)&d->frees, &d->cap_frees, d->nfrees + 1, sizeof *d->frees)) {
        pthread_mutex_unlock(&d->lock);
        pthread_rwlock_unlock(&G.exec);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory for the free list");
    }
    sim_alloc a = d->allocs[i];
    memmove(&d->allocs[i], &d->allocs[i + 1], (d->nallocs - (size_t)i - 1) * sizeof *d->allocs);
    d->nallocs--;
    d->used -= a.rsize;
    extent_insert(d, a.off, a.rsize);
    if (a.rsize >= SIM_PUNCH_MIN) {
        /* give whole pages back to the host; the next user sees zero pages */
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        size_t lo = round_up(a.off, pg), hi = (a.off + a.rsize) / pg * pg;
        if (hi > lo) {
            if (d->fd >= 0)
                fallocate(d->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)lo, (off_t)(hi - lo));
            else
                madvise(d->base + lo, hi - lo, MADV_DONTNEED);
        }
    }
    pthread_mutex_unlock(&d->lock);
    pthread_rwlock_unlock(&G.exec);
    return SIM_OK;
}

sim_status sim_mem_info(int phys, size_t *free_bytes, size_t *total_bytes)
{
    if (phys < 0 || phys >= G.nphys)
        return sim_fail(SIM_E_INVALID_DEVICE, "bad device");
    sim_device *d = &G.dev[phys];
    pthread_mutex_lock(&d->lock);
    size_t used = d->used;
    pthread_mutex_unlock(&d->lock);
    if (free_bytes)
        *free_bytes = G.capacity - used;
    if (total_bytes)
        *total_bytes = G.capacity;
    return SIM_OK;
}

/* host "pinned" memory */
sim_status sim_host_alloc(size_t nbytes, void **out)
{
    if (!out)
        return sim_fail(SIM_E_INVALID_VALUE, "the output pointer is NULL");
    void *p = NULL;
    if (posix_memalign(&p, 4096, nbytes ? nbytes : 1) != 0)
        return sim_fail(SIM_E_HOST_ALLOC, "cannot allocate %zu bytes of host memory", nbytes);
    pthread_mutex_lock(&G.host_lock);
    int rc = map_put(&G.host_allocs, (uint64_t)(uintptr_t)p, (void *)(uintptr_t)(nbytes ? nbytes : 1));
    pthread_mutex_unlock(&G.host_lock);
    if (rc) {
        free(p);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    *out = p;
    return SIM_OK;
}

sim_status sim_host_free(void *ptr)
{
    pthread_mutex_lock(&G.host_lock);
    void *had = ptr ? map_del(&G.host_allocs, (uint64_t)(uintptr_t)ptr) : NULL;
    pthread_mutex_unlock(&G.host_lock);
    if (!had)
        return sim_fail(SIM_E_BAD_FREE, "host free of %p: not a live page-locked host allocation", ptr);
    free(ptr);
    return SIM_OK;
}

/* ========================================================================== */
/* range checks                                                               */
/* ========================================================================== */

enum { WANT_HOST = 0, WANT_DEVICE = 1, WANT_ANY = 2 };

/* Check that [p, p+n) is usable as `what` and describe it in *ref. Caller holds nothing. */
static sim_status check_range(const void *p, size_t n, int want, sim_ref *ref, const char *what)
{
    const char *c = p;
    int phys = arena_of(p);
    if (phys >= 0) {
        sim_device *d = &G.dev[phys];
        if (want == WANT_HOST)
            return sim_fail(SIM_E_DIRECTION, "the %s %p is device memory (device %d), but the copy kind says "
                            "host memory", what, p, sim_phys_to_logical(phys));
        pthread_mutex_lock(&d->lock);
        size_t off = (size_t)(c - d->base);
        long i = alloc_floor(d, off);
        if (i < 0 || off >= d->allocs[i].off + d->allocs[i].size) {
            pthread_mutex_unlock(&d->lock);
            return sim_fail(SIM_E_OUT_OF_RANGE, "the %s %p is not inside a live allocation of device %d "
                            "(freed, or never allocated)", what, p, sim_phys_to_logical(phys));
        }
        sim_alloc a = d->allocs[i];
        pthread_mutex_unlock(&d->lock);
        if (off + n > a.off + a.size || off + n < off)
            return sim_fail(SIM_E_OUT_OF_RANGE, "the %s range of %zu bytes at offset %zu runs past the end of "
                            "its %zu-byte allocation on device %d", what, n, off - a.off, a.size,
                            sim_phys_to_logical(phys));
        *ref = (sim_ref){REF_DEV, phys, a.id};
        return SIM_OK;
    }
    int found = 0;
    sim_import im = {0};
    pthread_mutex_lock(&G.import_lock);
    for (size_t i = 0; i < G.nimports; i++) {
        if (c >= G.imports[i].map && c < G.imports[i].map + G.imports[i].map_len) {
            im = G.imports[i];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&G.import_lock);
    if (found) {
        if (want == WANT_HOST)
            return sim_fail(SIM_E_DIRECTION, "the %s %p is device memory opened from an IPC handle, but the copy "
                            "kind says host memory", what, p);
        if (c < im.ptr || c + n > im.ptr + im.size || c + n < c)
            return sim_fail(SIM_E_OUT_OF_RANGE, "the %s range of %zu bytes at %p runs outside the %zu-byte "
                            "allocation opened from an IPC handle", what, n, p, im.size);
        *ref = (sim_ref){REF_IMPORT, im.dev, im.id};
        return SIM_OK;
    }
    if (want == WANT_DEVICE)
        return sim_fail(SIM_E_DIRECTION, "the %s %p is not device memory of this simulator", what, p);
    for (int i = 0; i < G.nphys; i++) {
        const char *b = ALOAD(&G.dev[i].base);
        if (b && c < b && c + n > b)
            return sim_fail(SIM_E_OUT_OF_RANGE, "the host %s range of %zu bytes at %p runs into device memory",
                            what, n, p);
    }
    *ref = (sim_ref){REF_HOST, -1, 0};
    return SIM_OK;
}

/* Re-check a reference while an op runs (caller holds G.exec for reading). */
static int ref_still_valid(const sim_ref *ref, const char *p, size_t n)
{
    if (ref->kind == REF_HOST)
        return 1;
    if (ref->kind == REF_DEV) {
        sim_device *d = &G.dev[ref->dev];
        int ok = 0;
        pthread_mutex_lock(&d->lock);
        if (d->base) {
            size_t off = (size_t)(p - d->base);
            long i = alloc_floor(d, off);
            ok = i >= 0 && d->allocs[i].id == ref->id && off + n <= d->allocs[i].off + d->allocs[i].size;
        }
        pthread_mutex_unlock(&d->lock);
        return ok;
    }
    int ok = 0;
    pthread_mutex_lock(&G.import_lock);
    for (size_t i = 0; i < G.nimports; i++)
        if (G.imports[i].id == ref->id) {
            ok = 1;
            break;
        }
    pthread_mutex_unlock(&G.import_lock);
    return ok;
}

/* ========================================================================== */
/* registry of handles                                                        */
/* ========================================================================== */

static void *registry_get(void *handle, unsigned tag)
{
    uint64_t key = (uint64_t)(uintptr_t)handle;
    if ((key & 0xFu) != tag)
        return NULL;
    pthread_mutex_lock(&G.reg_lock);
    void *obj = map_get(&G.registry, key);
    if (obj) {
        if (tag == TAG_STREAM)
            __atomic_add_fetch(&((sim_stream *)obj)->refs, 1, __ATOMIC_RELAXED);
        else
            __atomic_add_fetch(&((sim_event *)obj)->refs, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&G.reg_lock);
    return obj;
}

/* ========================================================================== */
/* streams                                                                    */
/* ========================================================================== */

static void event_ref(sim_event *e) { __atomic_add_fetch(&e->refs, 1, __ATOMIC_RELAXED); }

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

int sim_stream_device(const sim_stream *s) { return s->dev; }

static sim_status run_op(sim_op *op, char *msg, size_t msglen)
{
    switch (op->type) {
    case OP_COPY: {
        sim_status st = SIM_OK;
        pthread_rwlock_rdlock(&G.exec);
        if (ref_still_valid(&op->u.copy.dref, op->u.copy.dst, op->u.copy.n) &&
            ref_still_valid(&op->u.copy.sref, op->u.copy.src, op->u.copy.n))
            memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
        else
            st = SIM_E_ASYNC_FAULT;
        pthread_rwlock_unlock(&G.exec);
        if (st)
            snprintf(msg, msglen, "a queued copy of %zu bytes (%p -> %p) found its "
                     "device memory freed before it ran; it was skipped", op->u.copy.n,
                     (const void *)op->u.copy.src, (void *)op->u.copy.dst);
        return st;
    }
    case OP_SET: {
        sim_status st = SIM_OK;
        pthread_rwlock_rdlock(&G.exec);
        if (ref_still_valid(&op->u.set.dref, op->u.set.dst, op->u.set.n))
            memset(op->u.set.dst, op->u.set.value, op->u.set.n);
        else
            st = SIM_E_ASYNC_FAULT;
        pthread_rwlock_unlock(&G.exec);
        if (st)
            snprintf(msg, msglen, "a queued memset of %zu bytes at %p found its device "
                     "memory freed before it ran; it was skipped", op->u.set.n, (void *)op->u.set.dst);
        return st;
    }
    case OP_RECORD: {
        sim_event *e = op->u.ev.ev;
        uint64_t t = now_ns();
        pthread_mutex_lock(&e->lock);
        if (op->u.ev.gen > e->done_gen) {
            e->t_ns = t;
            ASTORE(&e->done_gen, op->u.ev.gen);
        }
        if (e->waiters)
            pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->lock);
        sim_event_put(e);
        return SIM_OK;
    }
    case OP_WAIT: {
        sim_event *e = op->u.ev.ev;
        if (ALOAD(&e->done_gen) < op->u.ev.gen) {
            pthread_mutex_lock(&e->lock);
            e->waiters++;
            while (e->done_gen < op->u.ev.gen)
                pthread_cond_wait(&e->cv, &e->lock);
            e->waiters--;
            pthread_mutex_unlock(&e->lock);
        }
        sim_event_put(e);
        return SIM_OK;
    }
    case OP_HOST:
        op->u.host.fn(op->u.host.arg);
        return SIM_OK;
    }
    return SIM_OK;
}

/* Record the end of one op (caller holds s->lock). */
static void op_finished(sim_stream *s, sim_status st, const char *msg)
{
    if (st != SIM_OK && !s->has_sticky) { /* published before `done`, so a synchronizer sees it */
        s->sticky = st;
        snprintf(s->sticky_msg, sizeof s->sticky_msg, "%s", msg);
        ASTORE(&s->has_sticky, 1);
    }
    s->head++;
    s->running = 0;
    ASTORE(&s->done, s->head);
    if (s->waiters)
        pthread_cond_broadcast(&s->done_cv);
}

static void *stream_main(void *arg)
{
    sim_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        int spun = 0;
        while (s->head == s->tail || s->held || s->running) {
            if (s->stop && s->head == s->tail && !s->running)
                goto out;
            if (!spun && !s->held && !s->running && G.spin_ns) {
                /* stay awake a little: the next op usually follows at once */
                uint64_t seen = s->tail, until = now_ns() + G.spin_ns;
                pthread_mutex_unlock(&s->lock);
                for (unsigned k = 1;; k++) {
                    if (ALOAD(&s->tail) != seen || ALOAD(&s->held) || ALOAD(&s->stop))
                        break;
                    cpu_relax();
                    if ((k & 63) == 0 && now_ns() > until)
                        break;
                }
                pthread_mutex_lock(&s->lock);
                spun = 1;
                continue;
            }
            s->sleeping = 1;
            pthread_cond_wait(&s->work_cv, &s->lock);
            s->sleeping = 0;
        }
        sim_op op = s->ring[s->head & (s->cap - 1)];
        s->running = 1;
        pthread_mutex_unlock(&s->lock);
        char msg[sizeof s->sticky_msg];
        sim_status st = run_op(&op, msg, sizeof msg);
        pthread_mutex_lock(&s->lock);
        op_finished(s, st, msg);
    }
out:
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
        sim_op *next = &s->ring[s->head & (s->cap - 1)];
        if (next->type == OP_HOST)
            break;
        if (next->type == OP_WAIT && ALOAD(&next->u.ev.ev->done_gen) < next->u.ev.gen)
            break;
        sim_op op = *next;
        s->running = 1;
        pthread_mutex_unlock(&s->lock);
        char msg[sizeof s->sticky_msg];
        sim_status st = run_op(&op, msg, sizeof msg);
        pthread_mutex_lock(&s->lock);
        op_finished(s, st, msg);
    }
    if (!s->running && (s->head != s->tail || s->stop) && s->sleeping)
        pthread_cond_signal(&s->work_cv); /* hand what is left (or a stop) back to the worker */
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
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
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
            s->handle = ((uint64_t)new_id() << 4) | TAG_STREAM; /* internal only: NULL names it */
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
        if (st != SIM_OK)
            return st;
        st = default_stream(phys, out);
        if (st == SIM_OK)
            __atomic_add_fetch(&(*out)->refs, 1, __ATOMIC_RELAXED);
        return st;
    }
    sim_stream *s = registry_get(handle, TAG_STREAM);
    if (!s)
        return sim_fail(SIM_E_INVALID_HANDLE, "stream %p is not a live stream (destroyed, or never created)",
                        handle);
    *out = s;
    return SIM_OK;
}

sim_status sim_stream_create(int phys, void **handle)
{
    if (!handle)
        return sim_fail(SIM_E_INVALID_VALUE, "the output stream pointer is NULL");
    sim_stream *s;
    sim_status st = stream_new(phys, 0, &s);
    if (st != SIM_OK)
        return st;
    s->handle = ((uint64_t)new_id() << 4) | TAG_STREAM;
    pthread_mutex_lock(&G.reg_lock);
    int rc = map_put(&G.registry, s->handle, s);
    pthread_mutex_unlock(&G.reg_lock);
    if (rc) {
        /* not reachable by anyone: stop and free it directly */
        pthread_mutex_lock(&s->lock);
        s->stop = 1;
        pthread_cond_signal(&s->work_cv);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        sim_device *d = &G.dev[phys];
        pthread_mutex_lock(&d->streams_lock);
        if (s->prev) s->prev->next = s->next; else d->streams = s->next;
        if (s->next) s->next->prev = s->prev;
        pthread_mutex_unlock(&d->streams_lock);
        stream_free(s);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    *handle = (void *)(uintptr_t)s->handle;
    return SIM_OK;
}

static sim_status stream_push(sim_stream *s, const sim_op *op)
{
    pthread_mutex_lock(&s->lock);
    if (s->dead) {
        pthread_mutex_unlock(&s->lock);
        return sim_fail(SIM_E_INVALID_HANDLE, "the stream is being destroyed");
    }
    if (s->tail - s->head == s->cap) {
        size_t ncap = s->cap * 2;
        sim_op *nr = malloc(ncap * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&s->lock);
            return sim_fail(SIM_E_HOST_ALLOC, "out of host memory for the stream queue");
        }
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
    pthread_mutex_unlock(&s->lock);
    return SIM_OK;
}

static void wait_done(sim_stream *s, uint64_t target)
{
    if (ALOAD(&s->done) >= target)
        return;
    if (!ALOAD(&s->held)) {
        help_run(s, target);
        if (ALOAD(&s->done) >= target)
            return;
    }
    if (G.spin_ns && !ALOAD(&s->held)) {
        uint64_t until = now_ns() + G.spin_ns;
        for (unsigned k = 1;; k++) {
            if (ALOAD(&s->done) >= target)
                return;
            cpu_relax();
            if ((k & 63) == 0 && (now_ns() > until || ALOAD(&s->held)))
                break;
        }
    }
    pthread_mutex_lock(&s->lock);
    s->waiters++;
    while (s->done < target)
        pthread_cond_wait(&s->done_cv, &s->lock);
    s->waiters--;
    pthread_mutex_unlock(&s->lock);
}

sim_status sim_stream_synchronize(sim_stream *s)
{
    if (pthread_equal(pthread_self(), s->thread))
        return sim_fail(SIM_E_BUSY, "a stream cannot be synchronized from its own host callback");
    wait_done(s, ALOAD(&s->tail));
    if (ALOAD(&s->has_sticky)) {
        pthread_mutex_lock(&s->lock);
        sim_status st = s->sticky;
        int had = s->has_sticky;
        if (had) {
            snprintf(t_msg, sizeof t_msg, "%s", s->sticky_msg);
            s->has_sticky = 0;
            s->sticky = SIM_OK;
        }
        pthread_mutex_unlock(&s->lock);
        if (had)
            return st;
    }
    return SIM_OK;
}

sim_status sim_stream_query(sim_stream *s)
{
    return ALOAD(&s->done) >= ALOAD(&s->tail) ? SIM_OK : SIM_E_NOT_READY;
}

sim_status sim_stream_hold(sim_stream *s)
{
    pthread_mutex_lock(&s->lock);
    ASTORE(&s->held, 1);
    pthread_mutex_unlock(&s->lock);
    return SIM_OK;
}

sim_status sim_stream_release(sim_stream *s)
{
    pthread_mutex_lock(&s->lock);
    ASTORE(&s->held, 0);
    if (s->sleeping)
        pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->lock);
    return SIM_OK;
}

sim_status sim_stream_destroy(void *handle)
{
    if (!handle)
        return sim_fail(SIM_E_INVALID_HANDLE, "the default stream cannot be destroyed");
    uint64_t key = (uint64_t)(uintptr_t)handle;
    if ((key & 0xFu) != TAG_STREAM)
        return sim_fail(SIM_E_INVALID_HANDLE, "stream %p is not a live stream", handle);
    pthread_mutex_lock(&G.reg_lock);
    sim_stream *s = map_get(&G.registry, key);
    if (s && pthread_equal(pthread_self(), s->thread)) {
        pthread_mutex_unlock(&G.reg_lock);
        return sim_fail(SIM_E_BUSY, "a stream cannot be destroyed from its own host callback");
    }
    if (s)
        map_del(&G.registry, key);
    pthread_mutex_unlock(&G.reg_lock);
    if (!s)
        return sim_fail(SIM_E_INVALID_HANDLE, "stream %p is not a live stream (destroyed, or never created)",
                        handle);
    /* refuse new work, let queued work finish (a held stream is released), stop the worker */
    pthread_mutex_lock(&s->lock);
    s->dead = 1;
    ASTORE(&s->held, 0);
    ASTORE(&s->stop, 1);
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    sim_device *d = &G.dev[s->dev];
    pthread_mutex_lock(&d->streams_lock);
    if (s->prev) s->prev->next = s->next; else d->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
    pthread_mutex_unlock(&d->streams_lock);
    /* wake anyone still synchronizing on it (done == tail now) */
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->lock);
    sim_stream_put(s);
    return SIM_OK;
}

sim_status sim_device_synchronize(int phys)
{
    if (phys < 0 || phys >= G.nphys)
        return sim_fail(SIM_E_INVALID_DEVICE, "bad device");
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
        sim_status st = sim_stream_synchronize(list[i]);
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
    sim_status st = check_range(dst, n, want_for(dir, 1), dref, "destination");
    if (st != SIM_OK)
        return st;
    return check_range(src, n, want_for(dir, 0), sref, "source");
}

sim_status sim_memcpy_async(void *dst, const void *src, size_t n, int dir, sim_stream *s)
{
    if (n == 0)
        return SIM_OK;
    sim_op op = {.type = OP_COPY};
    sim_status st = check_copy(dst, src, n, dir, &op.u.copy.dref, &op.u.copy.sref);
    if (st != SIM_OK)
        return st;
    op.u.copy.dst = dst;
    op.u.copy.src = src;
    op.u.copy.n = n;
    return stream_push(s, &op);
}

sim_status sim_memset_async(void *dst, int value, size_t n, int device_only, sim_stream *s)
{
    if (n == 0)
        return SIM_OK;
    if (!dst)
        return sim_fail(SIM_E_INVALID_VALUE, "memset of a NULL pointer");
    sim_op op = {.type = OP_SET};
    sim_status st = check_range(dst, n, device_only ? WANT_DEVICE : WANT_ANY, &op.u.set.dref, "destination");
    if (st != SIM_OK)
        return st;
    op.u.set.dst = dst;
    op.u.set.value = value & 0xff;
    op.u.set.n = n;
    return stream_push(s, &op);
}

sim_status sim_enqueue_host_fn(sim_stream *s, sim_host_fn fn, void *arg)
{
    if (!fn)
        return sim_fail(SIM_E_INVALID_VALUE, "host function is NULL");
    sim_op op = {.type = OP_HOST};
    op.u.host.fn = fn;
    op.u.host.arg = arg;
    return stream_push(s, &op);
}

/* wait for the current device's default stream (when it exists) */
static sim_status drain_default(void)
{
    int phys = -1;
    sim_status st = sim_current_phys(&phys);
    if (st != SIM_OK)
        return st;
    sim_stream *s = ALOAD(&G.dev[phys].default_stream);
    if (s && !pthread_equal(pthread_self(), s->thread))
        wait_done(s, ALOAD(&s->tail));
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
    sim_status st = check_range(dst, n, want, &ref, "destination");
    if (st != SIM_OK)
        return st;
    st = drain_default();
    if (st != SIM_OK)
        return st;
    pthread_rwlock_rdlock(&G.exec);
    st = check_range(dst, n, want, &ref, "destination");
    if (st == SIM_OK)
        memset(dst, value & 0xff, n);
    pthread_rwlock_unlock(&G.exec);
    return st;
}

/* ========================================================================== */
/* events                                                                     */
/* ========================================================================== */

void sim_event_put(sim_event *e)
{
    if (e && __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->cv);
        free(e);
    }
}

sim_status sim_event_create(int phys, void **handle)
{
    if (!handle)
        return sim_fail(SIM_E_INVALID_VALUE, "the output event pointer is NULL");
    sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    e->dev = phys;
    e->refs = 1;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->handle = ((uint64_t)new_id() << 4) | TAG_EVENT;
    pthread_mutex_lock(&G.reg_lock);
    int rc = map_put(&G.registry, e->handle, e);
    pthread_mutex_unlock(&G.reg_lock);
    if (rc) {
        sim_event_put(e);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    *handle = (void *)(uintptr_t)e->handle;
    return SIM_OK;
}

sim_status sim_event_get(void *handle, sim_event **out)
{
    sim_event *e = handle ? registry_get(handle, TAG_EVENT) : NULL;
    if (!e)
        return sim_fail(SIM_E_INVALID_HANDLE, "event %p is not a live event (destroyed, or never created)",
                        handle);
    *out = e;
    return SIM_OK;
}

sim_status sim_event_destroy(void *handle)
{
    uint64_t key = (uint64_t)(uintptr_t)handle;
    sim_event *e = NULL;
    if ((key & 0xFu) == TAG_EVENT) {
        pthread_mutex_lock(&G.reg_lock);
        e = map_del(&G.registry, key);
        pthread_mutex_unlock(&G.reg_lock);
    }
    if (!e)
        return sim_fail(SIM_E_INVALID_HANDLE, "event %p is not a live event (destroyed, or never created)",
                        handle);
    sim_event_put(e); /* queued records and waits keep it alive until they ran */
    return SIM_OK;
}

sim_status sim_event_record(sim_event *e, sim_stream *s)
{
    sim_op op = {.type = OP_RECORD};
    op.u.ev.ev = e;
    pthread_mutex_lock(&s->lock);
    if (s->dead) {
        pthread_mutex_unlock(&s->lock);
        return sim_fail(SIM_E_INVALID_HANDLE, "the stream is being destroyed");
    }
    pthread_mutex_lock(&e->lock);
    op.u.ev.gen = ++e->rec_gen;
    if (s->head == s->tail && !s->running && !s->held) {
        /* nothing queued or running: the event is complete the moment it is recorded */
        e->t_ns = now_ns();
        ASTORE(&e->done_gen, op.u.ev.gen);
        if (e->waiters)
            pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->lock);
        pthread_mutex_unlock(&s->lock);
        return SIM_OK;
    }
    pthread_mutex_unlock(&e->lock);
    event_ref(e);
    pthread_mutex_unlock(&s->lock);
    /* the stream cannot die in between: the caller holds a reference and `dead` is only set
     * by destroy, which drains the queue before the worker stops */
    sim_status st = stream_push(s, &op);
    if (st != SIM_OK) {
        /* the record will never run: complete it now so nobody waits forever */
        pthread_mutex_lock(&e->lock);
        if (op.u.ev.gen > e->done_gen) {
            e->t_ns = now_ns();
            ASTORE(&e->done_gen, op.u.ev.gen);
        }
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->lock);
        sim_event_put(e);
    }
    return st;
}

sim_status sim_stream_wait_event(sim_stream *s, sim_event *e)
{
    pthread_mutex_lock(&e->lock);
    uint64_t gen = e->rec_gen;
    pthread_mutex_unlock(&e->lock);
    if (gen == 0 || ALOAD(&e->done_gen) >= gen)
        return SIM_OK; /* never recorded, or already complete: nothing to wait for */
    sim_op op = {.type = OP_WAIT};
    op.u.ev.ev = e;
    op.u.ev.gen = gen;
    event_ref(e);
    sim_status st = stream_push(s, &op);
    if (st != SIM_OK)
        sim_event_put(e);
    return st;
}

sim_status sim_event_query(sim_event *e)
{
    pthread_mutex_lock(&e->lock);
    int done = e->done_gen >= e->rec_gen;
    pthread_mutex_unlock(&e->lock);
    return done ? SIM_OK : SIM_E_NOT_READY;
}

sim_status sim_event_synchronize(sim_event *e)
{
    pthread_mutex_lock(&e->lock);
    uint64_t gen = e->rec_gen;
    pthread_mutex_unlock(&e->lock);
    if (ALOAD(&e->done_gen) >= gen)
        return SIM_OK;
    if (G.spin_ns) {
        uint64_t until = now_ns() + G.spin_ns;
        for (unsigned k = 1;; k++) {
            if (ALOAD(&e->done_gen) >= gen)
                return SIM_OK;
            cpu_relax();
            if ((k & 63) == 0 && now_ns() > until)
                break;
        }
    }
    pthread_mutex_lock(&e->lock);
    e->waiters++;
    while (e->done_gen < gen)
        pthread_cond_wait(&e->cv, &e->lock);
    e->waiters--;
    pthread_mutex_unlock(&e->lock);
    return SIM_OK;
}

sim_status sim_event_elapsed(float *ms, sim_event *start, sim_event *end)
{
    if (!ms)
        return sim_fail(SIM_E_INVALID_VALUE, "the output pointer is NULL");
    sim_event *ev[2] = {start, end};
    uint64_t t[2];
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&ev[i]->lock);
        uint64_t rec = ev[i]->rec_gen, done = ev[i]->done_gen;
        t[i] = ev[i]->t_ns;
        pthread_mutex_unlock(&ev[i]->lock);
        if (rec == 0)
            return sim_fail(SIM_E_NOT_RECORDED, "the %s event was never recorded", i ? "end" : "start");
        if (done < rec)
            return sim_fail(SIM_E_NOT_READY, "the %s event has not completed yet", i ? "end" : "start");
    }
    *ms = (float)((double)((int64_t)(t[1] - t[0])) / 1e6);
    return SIM_OK;
}

/* ========================================================================== */
/* inter-process handles                                                      */
/* ========================================================================== */

sim_status sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *h)
{
    if (!h || !devptr)
        return sim_fail(SIM_E_INVALID_VALUE, "NULL argument");
    int phys = arena_of(devptr);
    if (phys < 0)
        return sim_fail(SIM_E_INVALID_VALUE, "%p is not device memory allocated by this process", devptr);
    sim_device *d = &G.dev[phys];
    pthread_rwlock_wrlock(&G.exec);
    pthread_mutex_lock(&d->lock);
    size_t off = (size_t)((const char *)devptr - d->base);
    long i = alloc_floor(d, off);
    if (i < 0 || off >= d->allocs[i].off + d->allocs[i].rsize) {
        pthread_mutex_unlock(&d->lock);
        pthread_rwlock_unlock(&G.exec);
        return sim_fail(SIM_E_INVALID_VALUE, "%p is not inside a live allocation", devptr);
    }
    sim_alloc a = d->allocs[i];
    sim_status st = make_shareable(d, phys);
    int fd = d->fd;
    pthread_mutex_unlock(&d->lock);
    pthread_rwlock_unlock(&G.exec);
    if (st != SIM_OK)
        return st;
    memset(h, 0, sizeof *h);
    h->magic = ANYCHIP_SIM_IPC_MAGIC;
    h->version = 1;
    h->pid = (int32_t)getpid();
    h->fd = fd;
    h->device = phys;
    h->offset = a.off;
    h->size = a.size;
    h->alloc_id = a.id;
    return SIM_OK;
}

sim_status sim_ipc_open(int fd, const anychip_sim_ipc_handle *h, void **devptr)
{
    if (!h || !devptr)
        return sim_fail(SIM_E_INVALID_VALUE, "NULL argument");
    if (h->magic != ANYCHIP_SIM_IPC_MAGIC || h->version != 1)
        return sim_fail(SIM_E_INVALID_VALUE, "not an anychip simulator IPC handle");
    int own = 0;
    if (fd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return sim_fail(SIM_E_OS, "cannot open %s: %s (is the exporting process alive?)", path,
                            strerror(errno));
        own = 1;
    }
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t moff = (size_t)h->offset / pg * pg;
    size_t len = round_up((size_t)h->offset + (size_t)(h->size ? h->size : 1) - moff, pg);
    char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)moff);
    int err = errno;
    if (own)
        close(fd);
    if (map == MAP_FAILED)
        return sim_fail(SIM_E_OS, "cannot map the shared allocation: %s", strerror(err));
    pthread_mutex_lock(&G.import_lock);
    if (grow((void **)&G.imports, &G.cap_imports, G.nimports + 1, sizeof *G.imports)) {
        pthread_mutex_unlock(&G.import_lock);
        munmap(map, len);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    sim_import *im = &G.imports[G.nimports++];
    im->map = map;
    im->map_len = len;
    im->ptr = map + (h->offset - moff);
    im->size = (size_t)h->size;
    im->dev = h->device;
    im->id = new_id();
    *devptr = im->ptr;
    pthread_mutex_unlock(&G.import_lock);
    return SIM_OK;
}

sim_status sim_ipc_close(void *devptr)
{
    pthread_rwlock_wrlock(&G.exec);
    pthread_mutex_lock(&G.import_lock);
    sim_import im = {0};
    int found = 0;
    for (size_t i = 0; i < G.nimports; i++) {
        if (G.imports[i].ptr == devptr) {
            im = G.imports[i];
            G.imports[i] = G.imports[--G.nimports];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&G.import_lock);
    if (found)
        munmap(im.map, im.map_len);
    pthread_rwlock_unlock(&G.exec);
    if (!found)
        return sim_fail(SIM_E_INVALID_VALUE, "%p was not opened from an IPC handle", devptr);
    return SIM_OK;
}

/* ========================================================================== */
/* fork                                                                       */
/* ========================================================================== */

/* The child of fork() has none of the worker threads and must not write the parent's
 * device memory (the arenas are shared mappings). It starts over with empty devices;
 * handles from before the fork are invalid there. */
static void atfork_child(void)
{
    init_exec_lock();
    pthread_mutex_init(&G.default_lock, NULL);
    pthread_mutex_init(&G.reg_lock, NULL);
    pthread_mutex_init(&G.host_lock, NULL);
    pthread_mutex_init(&G.import_lock, NULL);
    G.registry = (ptr_map){0};     /* the parent's objects are leaked on purpose */
    G.host_allocs = (ptr_map){0};
    G.imports = NULL;
    G.nimports = G.cap_imports = 0;
    for (int i = 0; i < SIM_MAX_DEVICES; i++) {
        sim_device *d = &G.dev[i];
        pthread_mutex_init(&d->lock, NULL);
        pthread_mutex_init(&d->streams_lock, NULL);
        if (d->base)
            munmap(d->base, G.capacity);
        if (d->fd >= 0)
            close(d->fd);
        d->base = NULL;
        d->fd = -1;
        d->used = 0;
        d->allocs = NULL;
        d->frees = NULL;
        d->nallocs = d->nfrees = d->cap_allocs = d->cap_frees = 0;
        d->streams = NULL;
        d->default_stream = NULL;
    }
}

/* ========================================================================== */
/* exported controls                                                          */
/* ========================================================================== */

int anychip_sim_stream_hold(void *stream)
{
    sim_stream *s;
    sim_status st = sim_stream_get(stream, &s);
    if (st != SIM_OK)
        return st;
    st = sim_stream_hold(s);
    sim_stream_put(s);
    return st;
}

int anychip_sim_stream_release(void *stream)
{
    sim_stream *s;
    sim_status st = sim_stream_get(stream, &s);
    if (st != SIM_OK)
        return st;
    st = sim_stream_release(s);
    sim_stream_put(s);
    return st;
}

int anychip_sim_stream_enqueue_host_fn(void *stream, void (*fn)(void *), void *arg)
{
    sim_stream *s;
    sim_status st = sim_stream_get(stream, &s);
    if (st != SIM_OK)
        return st;
    st = sim_enqueue_host_fn(s, fn, arg);
    sim_stream_put(s);
    return st;
}

const char *anychip_sim_last_error(void) { return t_msg; }
const char *anychip_sim_status_string(int status) { return sim_status_name((sim_status)status); }

int anychip_sim_config(int *physical_devices, int *visible_devices, uint64_t *capacity)
{
    if (!ALOAD(&G.initialized))
        return sim_fail(SIM_E_NO_DEVICE, "the simulator is not initialized yet (call a vendor API first)");
    if (physical_devices)
        *physical_devices = G.nphys;
    if (visible_devices)
        *visible_devices = G.nvis;
    if (capacity)
        *capacity = G.capacity;
    return SIM_OK;
}

int anychip_sim_physical_device(int logical) { return sim_logical_to_phys(logical); }

int anychip_sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *handle)
{
    return sim_ipc_get_handle(devptr, handle);
}

int anychip_sim_ipc_open(const anychip_sim_ipc_handle *handle, void **devptr)
{
    return sim_ipc_open(-1, handle, devptr);
}

int anychip_sim_ipc_open_fd(int fd, const anychip_sim_ipc_handle *handle, void **devptr)
{
    if (fd < 0)
        return sim_fail(SIM_E_INVALID_VALUE, "bad file descriptor %d", fd);
    return sim_ipc_open(fd, handle, devptr);
}

int anychip_sim_ipc_close(void *devptr) { return sim_ipc_close(devptr); }
