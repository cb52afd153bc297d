/*
 * What the test plugins' shared-memory collectives share (plugin_variants.c's VARIANT_CCL_SHM
 * and conformance_mutants.c): unique ids, a communicator's segment (made by rank 0, mapped by
 * every rank), and the barrier all their ops meet at, which fails on a peer that exited and
 * after the collective timeout.
 *
 * Included after the includer's `struct anychip_comm_s`, which has the fields nranks, rank,
 * size (the segment's bytes), timeout (seconds) and hdr: a header that starts with
 *     _Atomic uint64_t seq[MAX_RANKS];    barriers each rank has reached
 *     _Atomic int32_t pid[MAX_RANKS];
 * and after fail(), S_TIMEOUT and S_SYSTEM.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static inline size_t dtype_size(anychip_dtype t) {
    static const size_t sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
    return (unsigned)t < 8 ? sizes[t] : 0;
}

static inline anychip_status get_unique_id(anychip_unique_id *id) {
    static _Atomic unsigned serial;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/%s-%d-%u-%ld", NAME, (int)getpid(), atomic_fetch_add(&serial, 1),
             (long)time(NULL));
    return S_OK;
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* whether process pid runs (a killed process its parent has not reaped yet is a zombie: dead) */
static inline int alive(int32_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return kill(pid, 0) == 0 || errno != ESRCH;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');
    return !(close_paren && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

/* every rank arrives, then all go on; a peer that has exited, or is missing past the timeout, fails */
static inline anychip_status barrier(anychip_comm c) {
    uint64_t mine = atomic_fetch_add(&c->hdr->seq[c->rank], 1) + 1;
    double start = now_s(), next_check = start + 0.1;
    for (int r = 0; r < c->nranks; r++) {
        while (atomic_load(&c->hdr->seq[r]) < mine) {
            double t = now_s();
#ifdef SHM_ABORTED
            int by = SHM_ABORTED(c);
            if (by) return fail(S_SYSTEM, "rank %d: the communicator was aborted by rank %d", c->rank, by - 1);
#endif
            if (t - start > c->timeout)
                return fail(S_TIMEOUT, "rank %d: timed out after %g s waiting for rank %d", c->rank, c->timeout, r);
            if (t > next_check) {
                int32_t pid = atomic_load(&c->hdr->pid[r]);
                if (pid > 0 && !alive(pid))
                    return fail(S_SYSTEM, "rank %d: rank %d (pid %d) exited during the collective", c->rank, r, pid);
                next_check = t + 0.1;
            }
            sched_yield();
        }
    }
    return S_OK;
}

/* c->timeout from ANYCHIP_COLLECTIVE_TIMEOUT (60 s unless set); then the c->size bytes of the
 * segment id->internal mapped at c->hdr (rank 0 creates it, the others wait for it up to the
 * timeout), this rank's pid registered and every rank met, after which the name is unlinked.
 * On a failure nothing stays mapped. */
static inline anychip_status shm_map(anychip_comm c, const anychip_unique_id *id) {
    const char *t = getenv("ANYCHIP_COLLECTIVE_TIMEOUT");
    c->timeout = t && atof(t) > 0 ? atof(t) : 60.0;
    int fd = -1;
    double deadline = now_s() + c->timeout;
    for (;;) {                                           /* rank 0 creates; the others wait for it */
        fd = c->rank == 0 ? shm_open(id->internal, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(id->internal, O_RDWR, 0);
        struct stat st;
        if (fd >= 0 && c->rank == 0 && ftruncate(fd, (off_t)c->size) != 0) {
            close(fd);
            shm_unlink(id->internal);
            return fail(S_SYSTEM, "ftruncate of %s failed", id->internal);
        }
        if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == c->size) break;
        if (fd >= 0) close(fd);
        if (c->rank == 0) return fail(S_SYSTEM, "shm_open of %s failed", id->internal);
        if (now_s() > deadline) return fail(S_TIMEOUT, "rank %d: %s never appeared", c->rank, id->internal);
        sched_yield();
    }
    void *p = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return fail(S_SYSTEM, "mmap of %s failed", id->internal);
    c->hdr = p;
    atomic_store(&c->hdr->pid[c->rank], (int32_t)getpid());
    anychip_status rc = barrier(c);                      /* all mapped: the name can go */
    if (c->rank == 0) shm_unlink(id->internal);
    if (rc) {
        munmap(p, c->size);
        c->hdr = NULL;
    }
    return rc;
}
