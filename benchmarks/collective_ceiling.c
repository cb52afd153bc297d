/*
 * Ceilings of a 2-process all_reduce (float32 sum) through shared memory on this
 * machine, for bench_collectives.py. Two processes (fork) share one anonymous mapping
 * and meet at spinning barriers; each way is timed as the best of `iters` rounds:
 *
 *   zero_copy  both processes' input and output arrays are in the shared mapping;
 *              process p sums its half of both inputs and stores it in both outputs
 *              (what an engine that maps its peer's device memory can at best do);
 *   staged     inputs and outputs are private; each process copies its input into
 *              its shared slot, sums its half of both slots into its own slot, and
 *              copies both reduced halves out (what a host transport can at best do);
 *   staged_chunked  the same, 256 KiB at a time, so the copies and sums hit the cache;
 *   memcpy     one process copying the message once (the machine's copy speed).
 *
 * Waits spin, then yield the core between polls (a shared machine may run other work).
 *
 * Usage: collective_ceiling BYTES [ITERS]; prints "way bytes seconds" per line.
 * Build: cc -O3 -march=native -o collective_ceiling collective_ceiling.c
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (256 << 10)    /* bytes per round of staged_chunked */

typedef struct {
    _Alignas(64) atomic_long seen[2][8];    /* one cache line per process */
} meet_t;

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* both processes arrive at round `k` before either leaves; after a short spin the
 * waiter yields its core between polls, so a busy machine still runs the peer */
static void meet(meet_t *m, int me, long k)
{
    atomic_store_explicit(&m->seen[me][0], k, memory_order_release);
    for (long spins = 0; atomic_load_explicit(&m->seen[1 - me][0], memory_order_acquire) < k; spins++)
        if (spins > 4096)
            sched_yield();
}

static void add_halves(float *restrict dst0, float *restrict dst1, const float *a, const float *b, size_t lo,
                       size_t hi)
{
    for (size_t i = lo; i < hi; i++) {
        float s = a[i] + b[i];
        dst0[i] = s;
        if (dst1)
            dst1[i] = s;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s BYTES [ITERS]\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10) & ~(size_t)7;
    int iters = argc > 2 ? atoi(argv[2]) : 10;
    size_t n = bytes / 4, mid = n / 2;
    size_t page = 4096, span = (bytes + page - 1) / page * page;
    char *shared = mmap(NULL, page + 6 * span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    meet_t *m = (meet_t *)shared;
    float *in[2], *out[2], *slot[2];
    for (int p = 0; p < 2; p++) {
        in[p] = (float *)(shared + page + (size_t)p * span);
        out[p] = (float *)(shared + page + (size_t)(2 + p) * span);
        slot[p] = (float *)(shared + page + (size_t)(4 + p) * span);
    }
    for (size_t i = 0; i < n; i++) {
        in[0][i] = 1.0f, in[1][i] = 2.0f;
        out[0][i] = out[1][i] = slot[0][i] = slot[1][i] = 0.0f;
    }
    pid_t child = fork();
    int me = child == 0 ? 1 : 0;
    float *mine = malloc(bytes + 64), *result = malloc(bytes + 64);
    for (size_t i = 0; i < n; i++)
        mine[i] = (float)(me + 1), result[i] = 0.0f;
    size_t lo = me ? mid : 0, hi = me ? n : mid;
    long k = 0;

    double best = 1e30;
    for (int it = 0; it < iters; it++) {
        meet(m, me, ++k);
        double t = seconds();
        add_halves(out[0], out[1], in[0], in[1], lo, hi);
        meet(m, me, ++k);
        t = seconds() - t;
        best = t < best ? t : best;
    }
    if (me == 0)
        printf("zero_copy %zu %.9f\n", bytes, best);

    best = 1e30;
    for (int it = 0; it < iters; it++) {
        meet(m, me, ++k);
        double t = seconds();
        memcpy(slot[me], mine, bytes);
        meet(m, me, ++k);
        add_halves(slot[me], NULL, slot[0], slot[1], lo, hi);
        meet(m, me, ++k);
        memcpy(result, slot[0], mid * 4);
        memcpy(result + mid, slot[1] + mid, (n - mid) * 4);
        meet(m, me, ++k);
        t = seconds() - t;
        best = t < best ? t : best;
    }
    if (me == 0)
        printf("staged %zu %.9f\n", bytes, best);

    /* the same in chunks that stay in cache (double-buffered slots would overlap more) */
    size_t cn = CHUNK / 4;
    best = 1e30;
    for (int it = 0; it < iters; it++) {
        meet(m, me, ++k);
        double t = seconds();
        for (size_t base = 0; base < n; base += cn) {
            size_t len = n - base < cn ? n - base : cn, half = len / 2;
            memcpy(slot[me], mine + base, len * 4);
            meet(m, me, ++k);
            add_halves(slot[me], NULL, slot[0], slot[1], me ? half : 0, me ? len : half);
            meet(m, me, ++k);
            memcpy(result + base, slot[0], half * 4);
            memcpy(result + base + half, slot[1] + half, (len - half) * 4);
            meet(m, me, ++k);
        }
        t = seconds() - t;
        best = t < best ? t : best;
    }
    if (me == 0)
        printf("staged_chunked %zu %.9f\n", bytes, best);
    if (result[n - 1] != 3.0f || out[me][n - 1] != 3.0f) {
        fprintf(stderr, "collective_ceiling: wrong sum\n");
        return 1;
    }
    if (me == 1)
        _exit(0);
    int status = 0;
    waitpid(child, &status, 0);

    best = 1e30;
    for (int it = 0; it < iters; it++) {
        double t = seconds();
        memcpy(result, mine, bytes);
        t = seconds() - t;
        best = t < best ? t : best;
    }
    printf("memcpy %zu %.9f\n", bytes, best);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
