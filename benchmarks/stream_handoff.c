/*
 * What a hand-off between two streams costs on the simulated Ascend, next to the same hand-off
 * between two bare threads in the same run: the figure behind Paddle's default collective
 * form (docs/paddle.md, "Speed"), where each call makes the collective stream wait for the
 * compute stream and the compute stream wait for the collective's.
 *
 *   one_stream    per round: one aclrtMemsetAsync of KiB on one stream (the work alone; large
 *                 enough that the host enqueues faster than the stream runs, as with a collective);
 *   two_streams   per round, Paddle's pattern: record e1 on stream A, B waits e1, the memset
 *                 on B, record e2 on B, A waits e2 -- each round hands work from one stream's
 *                 worker to the other's and back;
 *   threads       per round, two threads passing a token there and back through a mutex and
 *                 two condition variables: two hand-offs, the floor the OS gives on this
 *                 machine for what two_streams asks of the simulator's stream workers.
 *
 * Each way runs `rounds` rounds then synchronizes; the best of `repeat` runs is printed as
 * "way microseconds-per-round".
 *
 * Build and run (from a tree where anychip is built or installed):
 *   cc -O2 benchmarks/stream_handoff.c $(anychip info --cflags ascend) -o /tmp/stream_handoff
 *   /tmp/stream_handoff [KiB (64)] [rounds (2000)] [repeat (5)]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "acl/acl.h"

#define CHECK(call)                                                                        \
    do {                                                                                   \
        aclError rc_ = (call);                                                             \
        if (rc_ != ACL_SUCCESS) {                                                          \
            fprintf(stderr, "%s failed: %d (%s)\n", #call, (int)rc_, aclGetRecentErrMsg()); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static double one_stream(aclrtStream a, void *buf, size_t nbytes, int rounds)
{
    double t0 = now_us();
    for (int i = 0; i < rounds; i++)
        CHECK(aclrtMemsetAsync(buf, nbytes, i & 0xff, nbytes, a));
    CHECK(aclrtSynchronizeStream(a));
    return (now_us() - t0) / rounds;
}

static double two_streams(aclrtStream a, aclrtStream b, aclrtEvent e1, aclrtEvent e2, void *buf, size_t nbytes,
                          int rounds)
{
    double t0 = now_us();
    for (int i = 0; i < rounds; i++) {
        CHECK(aclrtRecordEvent(e1, a));
        CHECK(aclrtStreamWaitEvent(b, e1));
        CHECK(aclrtMemsetAsync(buf, nbytes, i & 0xff, nbytes, b));
        CHECK(aclrtRecordEvent(e2, b));
        CHECK(aclrtStreamWaitEvent(a, e2));
    }
    CHECK(aclrtSynchronizeStream(a));
    return (now_us() - t0) / rounds;
}

static struct {
    pthread_mutex_t mu;
    pthread_cond_t to_peer, to_main;
    int turn, rounds;                     /* turn 1: the peer's move */
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};

static void *peer(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&P.mu);
    for (int i = 0; i < P.rounds; i++) {
        while (P.turn != 1)
            pthread_cond_wait(&P.to_peer, &P.mu);
        P.turn = 0;
        pthread_cond_signal(&P.to_main);
    }
    pthread_mutex_unlock(&P.mu);
    return NULL;
}

static double threads(int rounds)
{
    pthread_t t;
    P.turn = 0;
    P.rounds = rounds;
    if (pthread_create(&t, NULL, peer, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        exit(1);
    }
    double t0 = now_us();
    pthread_mutex_lock(&P.mu);
    for (int i = 0; i < rounds; i++) {
        P.turn = 1;
        pthread_cond_signal(&P.to_peer);
        while (P.turn != 0)
            pthread_cond_wait(&P.to_main, &P.mu);
    }
    pthread_mutex_unlock(&P.mu);
    double us = (now_us() - t0) / rounds;
    pthread_join(t, NULL);
    return us;
}

int main(int argc, char **argv)
{
    long kib = argc > 1 ? atol(argv[1]) : 64;
    int rounds = argc > 2 ? atoi(argv[2]) : 2000, repeat = argc > 3 ? atoi(argv[3]) : 5;
    if (kib <= 0 || rounds <= 0 || repeat <= 0) {
        fprintf(stderr, "usage: %s [KiB > 0] [rounds > 0] [repeat > 0]\n", argv[0]);
        return 2;
    }
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream a, b;
    aclrtEvent e1, e2;
    void *buf;
    CHECK(aclrtCreateStream(&a));
    CHECK(aclrtCreateStream(&b));
    CHECK(aclrtCreateEvent(&e1));
    CHECK(aclrtCreateEvent(&e2));
    size_t nbytes = (size_t)kib << 10;
    CHECK(aclrtMalloc(&buf, nbytes, ACL_MEM_MALLOC_HUGE_FIRST));
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < repeat; r++) {      /* interleaved, so a busy moment hits every way */
        double v[3] = {one_stream(a, buf, nbytes, rounds),
                        two_streams(a, b, e1, e2, buf, nbytes, rounds), threads(rounds)};
        for (int w = 0; w < 3; w++)
            best[w] = v[w] < best[w] ? v[w] : best[w];
    }
    printf("one_stream %.2f\ntwo_streams %.2f\nthreads %.2f\n", best[0], best[1], best[2]);
    CHECK(aclrtFree(buf));
    CHECK(aclrtDestroyEvent(e1));
    CHECK(aclrtDestroyEvent(e2));
    CHECK(aclrtDestroyStream(a));
    CHECK(aclrtDestroyStream(b));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    return 0;
}
