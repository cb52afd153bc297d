#include "internal.h"

#include <dirent.h>

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
        /* the header is written before the segment has its size: a segment of a header's size or
         * more names its creator (ccl_sweep_segments), and a joiner takes it only once it is whole */
        hdr_t head = {.nranks = c->nranks, .creator_pid = getpid(), .small = c->small, .chunk = c->chunk,
                      .chan = c->chan, .total = want, .magic = MAGIC};
        if (pwrite(fd, &head, sizeof head, 0) != (ssize_t)sizeof head || ftruncate(fd, (off_t)want) != 0) {
            int e = errno;
            close(fd);
            shm_unlink(name);
            return init_fail(c, CCL_E_SYSTEM, "sizing %s to %zu bytes failed: %s", name, want, strerror(e));
        }
        c->map = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (c->map == MAP_FAILED) {
            c->map = NULL;
            shm_unlink(name);
            return init_fail(c, CCL_E_SYSTEM, "mmap of %zu bytes failed: %s", want, strerror(errno));
        }
        c->map_len = want;
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
    c->timeout = timeout_s > 0 ? timeout_s : ENV_PARAM(COLLECTIVE_TIMEOUT, 0, 1);
    const char *env_timeout = getenv("ANYCHIP_COLLECTIVE_TIMEOUT");
    if (timeout_s > 0)
        snprintf(c->timeout_from, sizeof c->timeout_from, "the communicator's own timeout");
    else if (env_timeout && *env_timeout)
        snprintf(c->timeout_from, sizeof c->timeout_from, "ANYCHIP_COLLECTIVE_TIMEOUT=%.40s", env_timeout);
    else
        snprintf(c->timeout_from, sizeof c->timeout_from, "the default; ANYCHIP_COLLECTIVE_TIMEOUT is unset");
    if (!(c->timeout < CCL_NEVER_S))
        c->timeout = CCL_NEVER_S; /* inf (or more than the 64-bit nanosecond deadlines hold): never */
    c->small = (uint64_t)ENV_PARAM(CCL_SMALL, 1, 0);
    c->small = ALIGN_UP(c->small, 64);
    c->chunk = ALIGN_UP((uint64_t)ENV_PARAM(CCL_CHUNK, 1, 0), 4096);
    c->chan = nranks <= 8 ? 256 * 1024 : 64 * 1024;
    double spin_us = ENV_PARAM(CCL_SPIN_US, 0, 0);
    c->spin_ns = spin_us < INT_MAX / 1000 ? (int)(spin_us * 1000) : INT_MAX;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (env_number("ANYCHIP_CCL_SPIN_US", -1, 0, 0) < 0 && cores > 0 && nranks > cores)
        c->spin_ns = 2000; /* more ranks than cores: a spinning rank takes the core its peer needs */
    c->small_max = c->small;
    c->zc_min = ANYCHIP_DEFAULT_CCL_ZERO_COPY_MIN;
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
            return init_fail(c, CCL_E_TIMEOUT, "communicator of %d ranks: ranks %s did not join within %g s (%s)",
                             nranks, miss, c->timeout, c->timeout_from);
        }
        usleep(200);
    }
    *out = c;
    return CCL_OK;
}

int ccl_sweep_segments(void)
{
    char prefix[64];
    int plen = snprintf(prefix, sizeof prefix, "anychip-ccl-%d-", (int)getuid());
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return 0;
    int swept = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
            continue;
        char name[NAME_MAX + 2];
        snprintf(name, sizeof name, "/%s", e->d_name);
        int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0)
            continue;
        struct stat st;
        hdr_t *h = MAP_FAILED;
        if (fstat(fd, &st) != 0) {
            close(fd);
            continue;
        }
        if ((size_t)st.st_size >= sizeof(hdr_t))
            h = mmap(NULL, sizeof(hdr_t), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (h == MAP_FAILED) {
            /* no header yet: its creator is between shm_open and pwrite, or died there a while ago */
            if ((size_t)st.st_size < sizeof(hdr_t) && time(NULL) - st.st_mtime > 10)
                swept += shm_unlink(name) == 0;
            continue;
        }
        uint64_t t;
        char state;
        if (atomic_load(&h->magic) == MAGIC && h->creator_pid > 0 &&
            (proc_state(h->creator_pid, &t, &state) != 0 || state == 'Z' || state == 'X'))
            swept += shm_unlink(name) == 0;
        munmap(h, sizeof(hdr_t));
    }
    closedir(dir);
    return swept;
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
void ccl_comm_set_timeout(ccl_comm *c, double s)
{
    if (s > 0) {
        c->timeout = s < CCL_NEVER_S ? s : CCL_NEVER_S;
        snprintf(c->timeout_from, sizeof c->timeout_from, "the communicator's own timeout");
    }
}
void ccl_comm_set_check(ccl_comm *c, int on) { c->check = on != 0; }
void ccl_comm_set_label(ccl_comm *c, const char *label) { snprintf(c->label, sizeof c->label, "%s", label ? label : ""); }
void ccl_comm_set_ipc(ccl_comm *c, ccl_ipc_open_fn o, ccl_ipc_close_fn cl) { c->ipc_open = o; c->ipc_close = cl; }
const char *ccl_comm_error(const ccl_comm *c) { return c->err; }

void ccl_comm_set_thresholds(ccl_comm *c, uint64_t small_max, uint64_t zc_min)
{
    c->small_max = MIN(small_max, c->small);
    c->zc_min = zc_min;
}

void ring_all(ccl_comm *c)
{
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank && atomic_load(&c->lines[r].sleeping)) {
            atomic_fetch_add(&c->lines[r].bell, 1);
            futex_wake(&c->lines[r].bell);
        }
}

void ring(ccl_comm *c, int r)
{
    if (atomic_load(&c->lines[r].sleeping)) {
        atomic_fetch_add(&c->lines[r].bell, 1);
        futex_wake(&c->lines[r].bell);
    }
}

void do_abort(ccl_comm *c, int status, const char *msg)
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
