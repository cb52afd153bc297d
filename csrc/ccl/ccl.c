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
 */
#define _GNU_SOURCE
#include "ccl.h"
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

static const char *KIND_NAMES[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                   "all_to_all", "send", "recv", "barrier"};
static const char *DTYPE_NAMES[] = {"int8",  "uint8", "int32",  "int64",  "float16", "bfloat16",
                                    "float32", "float64", "int16", "uint16", "uint32", "uint64"};
static const char *REDOP_NAMES[] = {"sum", "prod", "min", "max", "avg"};
static const size_t DTYPE_SIZES[] = {1, 1, 4, 8, 2, 2, 4, 8, 2, 2, 4, 8};

/* ========================================================================== */
/* small utilities                                                            */
/* ========================================================================== */

static uint64_t now_ns(void)
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

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
}

/* the longest timeout, in seconds (31 years): what "inf" means */
#define CCL_NEVER_S 1e9

/* The environment's numbers, by the rules of anychip/runtime/env.py: blanks around a value are
 * ignored and a blank value is unset; a whole number is digits; a number is digits with an
 * optional fraction and exponent (no sign, hex, inf or nan), or "inf" where `inf_ok`; a value > 0
 * is taken, anything else is ignored for the default (the Python side refuses it first). */
static const char *skip_blanks(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int is_number(const char *s, int whole)
{
    int digits = 0;
    for (; is_digit(*s); s++)
        digits++;
    if (!whole && *s == '.')
        for (s++; is_digit(*s); s++)
            digits++;
    if (!whole && digits && (*s == 'e' || *s == 'E')) {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!is_digit(*s))
            return 0;
        while (is_digit(*s))
            s++;
    }
    return digits && *skip_blanks(s) == '\0';
}

static double env_number(const char *name, double dflt, int whole, int inf_ok)
{
    const char *v = getenv(name);
    v = v ? skip_blanks(v) : "";
    if (!*v)
        return dflt;
    if (inf_ok && (v[0] | 0x20) == 'i' && (v[1] | 0x20) == 'n' && (v[2] | 0x20) == 'f' && !*skip_blanks(v + 3))
        return CCL_NEVER_S;
    if (!is_number(v, whole))
        return dflt;
    double d = strtod(v, NULL);
    double most = whole ? 9223372036854775808.0 : 1e308; /* whole: at most 2^63, as env.py */
    return (d > 0 && d <= most) ? d : dflt;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* process start time (clock ticks since boot) and whether it is still running */
static int proc_state(int pid, uint64_t *starttime, char *state)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p += 2;
    *state = *p;
    /* field 3 is the state; starttime is field 22 */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    *starttime = p ? strtoull(p, NULL, 10) : 0;
    return 0;
}

static __thread char init_err[MSG_LEN];

const char *ccl_init_error(void) { return init_err; }

size_t ccl_dtype_size(int dtype) { return dtype >= 0 && dtype < CCL_DTYPE_COUNT ? DTYPE_SIZES[dtype] : 0; }

const char *ccl_status_name(int st)
{
    static const char *names[] = {"CCL_OK", "CCL_E_INVALID", "CCL_E_TIMEOUT", "CCL_E_PEER_DEAD", "CCL_E_MISMATCH",
                                  "CCL_E_ABORTED", "CCL_E_SYSTEM", "CCL_E_IPC", "CCL_PENDING"};
    return st >= 0 && st <= CCL_PENDING ? names[st] : "CCL_E_UNKNOWN";
}

/* ========================================================================== */
/* reduction kernels                                                           */
/* ========================================================================== */

#define BLK 512
#define ID(x) (x)

#define APPLY(OP, A, acc, s, m, LOAD)                                                          \
    switch (OP) {                                                                               \
    case CCL_SUM:                                                                               \
    case CCL_AVG:                                                                               \
        for (size_t i = 0; i < m; i++) acc[i] = (A)(acc[i] + (A)LOAD(s[i]));                    \
        break;                                                                                  \
    case CCL_PROD:                                                                              \
        for (size_t i = 0; i < m; i++) acc[i] = (A)(acc[i] * (A)LOAD(s[i]));                    \
        break;                                                                                  \
    case CCL_MIN:                                                                               \
        for (size_t i = 0; i < m; i++) { A v = (A)LOAD(s[i]); acc[i] = v < acc[i] ? v : acc[i]; } \
        break;                                                                                  \
    case CCL_MAX:                                                                               \
        for (size_t i = 0; i < m; i++) { A v = (A)LOAD(s[i]); acc[i] = v > acc[i] ? v : acc[i]; } \
        break;                                                                                  \
    }

#define APPLY2(OP, A, acc, s0, s1, m, LOAD)                                                     \
    switch (OP) {                                                                               \
    case CCL_SUM:                                                                               \
    case CCL_AVG:                                                                               \
        for (size_t i = 0; i < m; i++) acc[i] = (A)((A)LOAD(s0[i]) + (A)LOAD(s1[i]));           \
        break;                                                                                  \
    case CCL_PROD:                                                                              \
        for (size_t i = 0; i < m; i++) acc[i] = (A)((A)LOAD(s0[i]) * (A)LOAD(s1[i]));           \
        break;                                                                                  \
    case CCL_MIN:                                                                               \
        for (size_t i = 0; i < m; i++) { A a = (A)LOAD(s0[i]), b = (A)LOAD(s1[i]); acc[i] = b < a ? b : a; } \
        break;                                                                                  \
    default:                                                                                    \
        for (size_t i = 0; i < m; i++) { A a = (A)LOAD(s0[i]), b = (A)LOAD(s1[i]); acc[i] = b > a ? b : a; } \
        break;                                                                                  \
    }

/* T: element type, A: accumulator type (ints: wide, so avg divides the true sum;
 * halves: float). Sources are combined in order, so every caller gets the same bits.
 * Elements are accessed through 1-byte-aligned types: views may start at any byte. */
#define DEF_REDUCE(NAME, T, A, LOAD, STORE)                                                    \
    typedef T NAME##_u __attribute__((aligned(1)));                                             \
    static void NAME(void *const *dsts, int nd, const void *const *src, int ns, size_t n, int op, int div) \
    {                                                                                           \
        A acc[BLK];                                                                             \
        for (size_t base = 0; base < n; base += BLK) {                                          \
            size_t m = MIN((size_t)BLK, n - base);                                              \
            const NAME##_u *s0 = (const NAME##_u *)src[0] + base;                               \
            int k = 1;                                                                          \
            if (ns >= 2) { /* the first two sources in one pass */                             \
                const NAME##_u *s1 = (const NAME##_u *)src[1] + base;                           \
                APPLY2(op, A, acc, s0, s1, m, LOAD)                                             \
                k = 2;                                                                          \
            } else {                                                                            \
                for (size_t i = 0; i < m; i++) acc[i] = (A)LOAD(s0[i]);                         \
            }                                                                                   \
            for (; k < ns; k++) {                                                               \
                const NAME##_u *s = (const NAME##_u *)src[k] + base;                            \
                APPLY(op, A, acc, s, m, LOAD)                                                   \
            }                                                                                   \
            if (op == CCL_AVG)                                                                  \
                for (size_t i = 0; i < m; i++) acc[i] = (A)(acc[i] / (A)div);                   \
            for (int d = 0; d < nd; d++) {                                                      \
                NAME##_u *dst = (NAME##_u *)dsts[d] + base;                                     \
                for (size_t i = 0; i < m; i++) dst[i] = STORE(acc[i]);                          \
            }                                                                                   \
        }                                                                                       \
    }

DEF_REDUCE(red_i8, int8_t, int64_t, ID, (int8_t))
DEF_REDUCE(red_u8, uint8_t, int64_t, ID, (uint8_t))
DEF_REDUCE(red_i32, int32_t, int64_t, ID, (int32_t))
DEF_REDUCE(red_i64, int64_t, int64_t, ID, (int64_t))
DEF_REDUCE(red_f16, uint16_t, float, half_to_float, float_to_half)
DEF_REDUCE(red_bf16, uint16_t, float, bf16_to_float, float_to_bf16)
DEF_REDUCE(red_f32, float, float, ID, (float))
DEF_REDUCE(red_f64, double, double, ID, (double))
DEF_REDUCE(red_i16, int16_t, int64_t, ID, (int16_t))
DEF_REDUCE(red_u16, uint16_t, int64_t, ID, (uint16_t))
DEF_REDUCE(red_u32, uint32_t, uint64_t, ID, (uint32_t))
DEF_REDUCE(red_u64, uint64_t, uint64_t, ID, (uint64_t))

typedef void (*reduce_fn)(void *const *, int, const void *const *, int, size_t, int, int);
static const reduce_fn REDUCERS[] = {red_i8,  red_u8,  red_i32, red_i64, red_f16, red_bf16,
                                     red_f32, red_f64, red_i16, red_u16, red_u32, red_u64};

static void reduce1(const ccl_op *o, void *dst, const void *const *srcs, int n, uint64_t m)
{
    REDUCERS[o->dtype](&dst, 1, srcs, n, (size_t)m, o->redop, n);
}

int ccl_reduce_local(void *dst, const void *const *srcs, int nsrc, uint64_t n, int dtype, int redop, int divisor)
{
    if (dtype < 0 || dtype >= CCL_DTYPE_COUNT || redop < 0 || redop >= CCL_REDOP_COUNT || nsrc < 1 || divisor < 1)
        return CCL_E_INVALID;
    if (n)
        REDUCERS[dtype](&dst, 1, srcs, nsrc, (size_t)n, redop, divisor);
    return CCL_OK;
}

/* ========================================================================== */
/* communicator setup                                                          */
/* ========================================================================== */

static void layout(ccl_comm *c)
{
    int n = c->nranks;
    size_t off = ALIGN_UP(sizeof(hdr_t), 4096);
    char *m = c->map;
    c->hdr = (hdr_t *)m;
    c->lines = (rank_line_t *)(m + off);
    off += ALIGN_UP(sizeof(rank_line_t) * (size_t)n, 4096);
    c->pubs = (pub_t *)(m + off);
    off += ALIGN_UP(sizeof(pub_t) * 2 * (size_t)n, 4096);
    c->chans = (chan_ctl_t *)(m + off);
    off += ALIGN_UP(sizeof(chan_ctl_t) * (size_t)n * (size_t)n, 4096);
    c->chan_data = m + off;
    off += (size_t)n * (size_t)n * c->chan;
    c->small_data = m + off;
    off += (size_t)n * 2 * c->small;
    c->big_data = m + off;
    off += (size_t)n * 2 * c->chunk;
    c->map_len = off;
}

static size_t segment_size(int n, uint64_t small, uint64_t chunk, uint64_t chan)
{
    ccl_comm tmp = {.nranks = n, .small = small, .chunk = chunk, .chan = chan, .map = NULL};
    layout(&tmp);
    return tmp.map_len;
}

static void seg_name(const char *id, char *out, size_t len)
{
    snprintf(out, len, "/anychip-ccl-%d-%016llx", (int)getuid(), (unsigned long long)fnv1a(id));
}

static int init_fail(ccl_comm *c, int st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int init_fail(ccl_comm *c, int st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(init_err, sizeof init_err, fmt, ap);
    va_end(ap);
    if (c) {
        if (c->map)
            munmap(c->map, c->map_len);
        free(c);
    }
    return st;
}

static int creator_alive(hdr_t *h)
{
    return h->creator_pid > 0 && (kill(h->creator_pid, 0) == 0 || errno == EPERM);
}

static int open_segment(ccl_comm *c, const char *name, uint64_t deadline)
{
    size_t want = segment_size(c->nranks, c->small, c->chunk, c->chan);
    if (c->rank == 0) {
        shm_unlink(name); /* a stale segment of a crashed job with the same id */
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0)
            return init_fail(c, CCL_E_SYSTEM, "shm_open(%s) failed: %s", name, strerror(errno));
        if (ftruncate(fd, (off_t)want) != 0) {
            int e = errno;
            close(fd);
            shm_unlink(name);
            return init_fail(c, CCL_E_SYSTEM, "ftruncate of %s to %zu bytes failed: %s", name, want, strerror(e));
        }
        c->map = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (c->map == MAP_FAILED) {
            c->map = NULL;
            shm_unlink(name);
            return init_fail(c, CCL_E_SYSTEM, "mmap of %zu bytes failed: %s", want, strerror(errno));
        }
        c->map_len = want;
        hdr_t *h = (hdr_t *)c->map;
        h->nranks = c->nranks;
        h->creator_pid = getpid();
        h->small = c->small;
        h->chunk = c->chunk;
        h->chan = c->chan;
        h->total = want;
        atomic_store(&h->magic, MAGIC);
        return CCL_OK;
    }
    for (;;) {
        int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(hdr_t)) {
                char *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) {
                    hdr_t *h = (hdr_t *)m;
                    if (atomic_load(&h->magic) == MAGIC && h->nranks == c->nranks && creator_alive(h) &&
                        h->total == (uint64_t)st.st_size) {
                        close(fd);
                        c->map = m;
                        c->map_len = (size_t)st.st_size;
                        c->small = h->small;
                        c->chunk = h->chunk;
                        c->chan = h->chan;
                        return CCL_OK;
                    }
                    munmap(m, (size_t)st.st_size);
                }
            }
            close(fd);
        }
        if (now_ns() > deadline)
            return init_fail(c, CCL_E_TIMEOUT, "rank %d of %d: rank 0 did not create the communicator (%s) in time",
                             c->rank, c->nranks, name);
        usleep(1000);
    }
}

int ccl_comm_init(const char *id, int rank, int nranks, double timeout_s, ccl_comm **out)
{
    init_err[0] = 0;
    if (out)
        *out = NULL;
    if (!id || !out || nranks < 1 || nranks > CCL_MAX_RANKS || rank < 0 || rank >= nranks)
        return init_fail(NULL, CCL_E_INVALID, "ccl_comm_init: bad arguments (rank %d of %d; at most %d ranks)", rank,
                         nranks, CCL_MAX_RANKS);
    ccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return init_fail(NULL, CCL_E_SYSTEM, "out of host memory");
    c->rank = rank;
    c->nranks = nranks;
    c->timeout = timeout_s > 0 ? timeout_s : env_number("ANYCHIP_COLLECTIVE_TIMEOUT", 300.0, 0, 1);
    if (!(c->timeout < CCL_NEVER_S))
        c->timeout = CCL_NEVER_S; /* inf (or more than the 64-bit nanosecond deadlines hold): never */
    c->small = (uint64_t)env_number("ANYCHIP_CCL_SMALL", 16384, 1, 0);
    c->small = ALIGN_UP(c->small, 64);
    c->chunk = ALIGN_UP((uint64_t)env_number("ANYCHIP_CCL_CHUNK", 1 << 20, 1, 0), 4096);
    c->chan = nranks <= 8 ? 256 * 1024 : 64 * 1024;
    double spin_us = env_number("ANYCHIP_CCL_SPIN_US", 200, 0, 0);
    c->spin_ns = spin_us < INT_MAX / 1000 ? (int)(spin_us * 1000) : INT_MAX;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (env_number("ANYCHIP_CCL_SPIN_US", -1, 0, 0) < 0 && cores > 0 && nranks > cores)
        c->spin_ns = 2000; /* more ranks than cores: a spinning rank takes the core its peer needs */
    c->small_max = c->small;
    c->zc_min = 65536;
    snprintf(c->label, sizeof c->label, "group of %d ranks", nranks);
    uint64_t deadline = now_ns() + (uint64_t)(c->timeout * 1e9);
    char name[NAME_LEN];
    seg_name(id, name, sizeof name);
    int st = open_segment(c, name, deadline);
    if (st)
        return st;
    layout(c);
    rank_line_t *me = &c->lines[rank];
    char state;
    me->pid = getpid();
    atomic_store(&me->kind, -1);
    proc_state(me->pid, &me->starttime, &state);
    if (atomic_exchange(&me->state, ST_ATTACHED) != ST_EMPTY) {
        munmap(c->map, c->map_len);
        c->map = NULL;
        return init_fail(c, CCL_E_INVALID, "rank %d joined communicator '%s' twice", rank, id);
    }
    if (atomic_fetch_add(&c->hdr->attached, 1) + 1 == nranks)
        shm_unlink(name);
    /* wait for everyone (the segment name disappears with the last one) */
    while (atomic_load(&c->hdr->attached) < nranks) {
        for (int r = 0; r < nranks; r++) {
            rank_line_t *l = &c->lines[r];
            if (atomic_load(&l->state) != ST_ATTACHED)
                continue;
            uint64_t t;
            char s;
            if (proc_state(l->pid, &t, &s) != 0 || s == 'Z' || s == 'X' || t != l->starttime) {
                shm_unlink(name);
                atomic_store(&me->state, ST_DETACHED);
                return init_fail(c, CCL_E_PEER_DEAD, "rank %d (pid %d) died while the communicator was "
                                 "being created", r, l->pid);
            }
        }
        if (now_ns() > deadline) {
            char miss[256] = "";
            size_t p = 0;
            for (int r = 0; r < nranks; r++)
                if (atomic_load(&c->lines[r].state) != ST_ATTACHED && p < sizeof miss - 8)
                    p += (size_t)snprintf(miss + p, sizeof miss - p, "%s%d", p ? ", " : "", r);
            shm_unlink(name);
            atomic_store(&me->state, ST_DETACHED);
            return init_fail(c, CCL_E_TIMEOUT, "communicator of %d ranks: ranks %s did not join within %.0f s "
                             "(ANYCHIP_COLLECTIVE_TIMEOUT)", nranks, miss, c->timeout);
        }
        usleep(200);
    }
    *out = c;
    return CCL_OK;
}

int ccl_comm_destroy(ccl_comm *c)
{
    if (!c)
        return CCL_E_INVALID;
    for (int i = 0; i < c->ncache; i++)
        if (c->ipc_close)
            c->ipc_close(c->cache[i].base);
    atomic_store(&c->lines[c->rank].state, ST_DETACHED);
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank) {
            atomic_fetch_add(&c->lines[r].bell, 1);
            futex_wake(&c->lines[r].bell);
        }
    munmap(c->map, c->map_len);
    free(c);
    return CCL_OK;
}

int ccl_comm_rank(const ccl_comm *c) { return c->rank; }
int ccl_comm_size(const ccl_comm *c) { return c->nranks; }
void ccl_comm_set_timeout(ccl_comm *c, double s) { if (s > 0) c->timeout = s < CCL_NEVER_S ? s : CCL_NEVER_S; }
void ccl_comm_set_check(ccl_comm *c, int on) { c->check = on != 0; }
void ccl_comm_set_label(ccl_comm *c, const char *label) { snprintf(c->label, sizeof c->label, "%s", label ? label : ""); }
void ccl_comm_set_ipc(ccl_comm *c, ccl_ipc_open_fn o, ccl_ipc_close_fn cl) { c->ipc_open = o; c->ipc_close = cl; }
const char *ccl_comm_error(const ccl_comm *c) { return c->err; }

void ccl_comm_set_thresholds(ccl_comm *c, uint64_t small_max, uint64_t zc_min)
{
    c->small_max = MIN(small_max, c->small);
    c->zc_min = zc_min;
}

static void ring_all(ccl_comm *c)
{
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank && atomic_load(&c->lines[r].sleeping)) {
            atomic_fetch_add(&c->lines[r].bell, 1);
            futex_wake(&c->lines[r].bell);
        }
}

static void ring(ccl_comm *c, int r)
{
    if (atomic_load(&c->lines[r].sleeping)) {
        atomic_fetch_add(&c->lines[r].bell, 1);
        futex_wake(&c->lines[r].bell);
    }
}

static void do_abort(ccl_comm *c, int status, const char *msg)
{
    hdr_t *h = c->hdr;
    int32_t expect = 0;
    if (atomic_compare_exchange_strong(&h->aborted, &expect, 1)) {
        snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
        h->abort_status = status;
        atomic_store(&h->aborted, 2);
    }
    /* every rank's waits, this one's too: another thread of this process may be waiting in
     * an op of the communicator (a stream's worker when the owner aborts) */
    for (int r = 0; r < c->nranks; r++) {
        atomic_fetch_add(&c->lines[r].bell, 1);
        futex_wake(&c->lines[r].bell);
    }
}

void ccl_comm_abort(ccl_comm *c, const char *why)
{
    char msg[MSG_LEN];
    snprintf(msg, sizeof msg, "rank %d aborted the communicator (%s): %s", c->rank, c->label, why ? why : "");
    do_abort(c, CCL_E_ABORTED, msg);
}

/* ========================================================================== */
/* waiting                                                                     */
/* ========================================================================== */

typedef struct ctx {
    ccl_comm *c;
    const ccl_op *op;
    const char *name;
    uint64_t deadline;
} ctx_t;

typedef int (*ready_fn)(ctx_t *x, const void *arg);

static int fail(ctx_t *x, int st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ctx_t *x, int st, const char *fmt, ...)
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
static int peer_gone(ccl_comm *c, int r, const char **why)
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

static int check_abort(ctx_t *x)
{
    hdr_t *h = x->c->hdr;
    if (atomic_load(&h->aborted) != 2)
        return 0;
    int st = h->abort_status ? h->abort_status : CCL_E_ABORTED;
    return fail(x, st, "%s", h->abort_msg);
}

/* Wait until ready(); `peers` lists the ranks whose liveness matters (bit r),
 * `lagging` names the ranks not there yet for the timeout message. */
static int wait_until(ctx_t *x, ready_fn ready, const void *arg, uint64_t peers,
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
            snprintf(msg, sizeof msg, "%s (op #%llu, %s) timed out after %.1f s on rank %d%s%s "
                     "(ANYCHIP_COLLECTIVE_TIMEOUT)", x->name, (unsigned long long)c->opno, c->label, c->timeout,
                     c->rank, buf[0] ? ": " : "", buf);
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
static void arrive(ccl_comm *c)
{
    uint64_t target = ++c->seq;
    atomic_store_explicit(&c->lines[c->rank].seq, target, memory_order_seq_cst);
    ring_all(c);
}

/* wait until every rank has arrived as often as this one */
static int wait_all(ctx_t *x)
{
    ccl_comm *c = x->c;
    uint64_t target = c->seq;
    uint64_t all = c->nranks >= 64 ? ~0ull : ((1ull << c->nranks) - 1);
    return wait_until(x, all_arrived, &target, all, not_arrived);
}

/* arrive, then wait until every rank has */
static int barrier_step(ctx_t *x)
{
    arrive(x->c);
    return wait_all(x);
}

/* ========================================================================== */
/* collectives                                                                 */
/* ========================================================================== */

static char *small_slot(ccl_comm *c, int r, int b) { return c->small_data + ((size_t)r * 2 + (size_t)b) * c->small; }
static char *big_slot(ccl_comm *c, int r, int b) { return c->big_data + ((size_t)r * 2 + (size_t)b) * c->chunk; }

static void copy(void *dst, const void *src, size_t n)
{
    if (n && dst != src)
        memmove(dst, src, n);
}

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

static int collective(ctx_t *x)
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

static int run_p2p(ctx_t *x, const ccl_op *ops, int nops)
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
