/*
 * HIP's legacy null stream (ROCm clr, hip_context.cpp / hip_device.cpp WaitActiveStreams):
 * work enqueued on the null stream waits for the work queued before it on the device's
 * blocking streams (hipStreamCreate, hipStreamCreateWithFlags(hipStreamDefault)), work
 * enqueued on a blocking stream waits for the work queued before it on the null stream,
 * and hipStreamNonBlocking streams are exempt both ways. The simulator's stream hold makes
 * "has not run yet" deterministic; the last part checks the rule from two threads at once.
 * Built and run by tests/devices/test_sim_c_abi.py; prints "hip null stream ok".
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "anychip/sim.h"
#include "hip/hip_runtime_api.h"
#include "check.h"

enum { N = 4 };

static void sleep_ms(int ms)
{
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

/* a host function standing in for a kernel that takes a while, then writes its mark */
static volatile int slow_mark;
static void slow_write(void *arg)
{
    sleep_ms(50);
    slow_mark = *(int *)arg;
}

/* ---- two threads: each op checks that the other queue's earlier work has run ---------- */

enum { ROUNDS = 400 };

typedef struct {
    int *ran;                  /* ops of this queue that have run (written by its worker only) */
    const int *other_ran;      /* the other queue's count */
    int seen_other;            /* the other queue's ops enqueued before this op was */
    int *violations;
} order_check;

static int null_ran, blocking_ran, violations;
static int null_enqueued, blocking_enqueued;   /* published after each enqueue returns */
static order_check null_ops[ROUNDS], blocking_ops[ROUNDS];

static void run_check(void *arg)
{
    order_check *c = arg;
    if (__atomic_load_n(c->other_ran, __ATOMIC_ACQUIRE) < c->seen_other)
        __atomic_add_fetch(c->violations, 1, __ATOMIC_RELAXED);
    __atomic_store_n(c->ran, *c->ran + 1, __ATOMIC_RELEASE);
}

typedef struct { hipStream_t stream; int rc; } pusher;

/* enqueue ROUNDS checks on the blocking stream, each knowing how many null-stream ops came before */
static void *push_blocking(void *arg)
{
    pusher *p = arg;
    p->rc = hipSetDevice(0);
    for (int i = 0; i < ROUNDS && p->rc == hipSuccess; i++) {
        blocking_ops[i] = (order_check){&blocking_ran, &null_ran, __atomic_load_n(&null_enqueued, __ATOMIC_ACQUIRE),
                                        &violations};
        p->rc = hipLaunchHostFunc(p->stream, run_check, &blocking_ops[i]);
        __atomic_store_n(&blocking_enqueued, i + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

int main(void)
{
    int *d = NULL;
    int ones[N] = {1, 1, 1, 1}, twos[N] = {2, 2, 2, 2}, back[N];
    CHECK(hipMalloc((void **)&d, sizeof ones) == hipSuccess);
    CHECK(hipMemset(d, 0, sizeof ones) == hipSuccess);
    hipStream_t blocking, created, nonblocking;
    CHECK(hipStreamCreateWithFlags(&blocking, hipStreamDefault) == hipSuccess);
    CHECK(hipStreamCreate(&created) == hipSuccess);
    CHECK(hipStreamCreateWithFlags(&nonblocking, hipStreamNonBlocking) == hipSuccess);
    unsigned flags = 9;
    CHECK(hipStreamGetFlags(created, &flags) == hipSuccess && flags == hipStreamDefault);
    CHECK(hipStreamGetFlags(nonblocking, &flags) == hipSuccess && flags == hipStreamNonBlocking);

    /* the case: a host function and a copy on a hipStreamCreate stream, then a
     * synchronous copy back through the null stream */
    int mark = 1;
    CHECK(hipLaunchHostFunc(created, slow_write, &mark) == hipSuccess);
    CHECK(hipMemcpyAsync(d, ones, sizeof ones, hipMemcpyHostToDevice, created) == hipSuccess);
    memset(back, 0, sizeof back);
    CHECK(hipMemcpy(back, d, sizeof back, hipMemcpyDeviceToHost) == hipSuccess);
    CHECK(back[0] == 1 && back[3] == 1 && slow_mark == 1);

    /* 1. an async copy on the null stream waits for a blocking stream's earlier copy */
    CHECK(anychip_sim_stream_hold(blocking) == 0);
    CHECK(hipMemcpyAsync(d, twos, sizeof twos, hipMemcpyHostToDevice, blocking) == hipSuccess);
    memset(back, 0, sizeof back);
    CHECK(hipMemcpyAsync(back, d, sizeof back, hipMemcpyDeviceToHost, NULL) == hipSuccess);
    CHECK(hipStreamQuery(blocking) == hipErrorNotReady);
    CHECK(hipStreamQuery(NULL) == hipErrorNotReady);             /* it waits for `blocking` */
    CHECK(back[0] == 0);
    CHECK(anychip_sim_stream_release(blocking) == 0);
    CHECK(hipStreamSynchronize(NULL) == hipSuccess);
    CHECK(back[0] == 2 && back[3] == 2);
    CHECK(hipStreamQuery(blocking) == hipSuccess);

    /* 2. a blocking stream's copy waits for the null stream's earlier copy */
    CHECK(anychip_sim_stream_hold(NULL) == 0);
    CHECK(hipMemcpyAsync(d, ones, sizeof ones, hipMemcpyHostToDevice, NULL) == hipSuccess);
    memset(back, 0, sizeof back);
    CHECK(hipMemcpyAsync(back, d, sizeof back, hipMemcpyDeviceToHost, created) == hipSuccess);
    CHECK(hipStreamQuery(created) == hipErrorNotReady);
    CHECK(back[0] == 0);
    CHECK(anychip_sim_stream_release(NULL) == 0);
    CHECK(hipStreamSynchronize(created) == hipSuccess);
    CHECK(back[0] == 1 && back[3] == 1);

    /* 3. an event recorded on the null stream completes after the blocking streams' earlier work */
    hipEvent_t ev;
    CHECK(hipEventCreate(&ev) == hipSuccess);
    CHECK(anychip_sim_stream_hold(created) == 0);
    CHECK(hipMemsetAsync(d, 0, sizeof ones, created) == hipSuccess);
    CHECK(hipEventRecord(ev, NULL) == hipSuccess);
    CHECK(hipEventQuery(ev) == hipErrorNotReady);
    CHECK(hipStreamWaitEvent(nonblocking, ev, 0) == hipSuccess);
    memset(back, 0xff, sizeof back);
    CHECK(hipMemcpyAsync(back, d, sizeof back, hipMemcpyDeviceToHost, nonblocking) == hipSuccess);
    CHECK(hipStreamQuery(nonblocking) == hipErrorNotReady);
    CHECK(anychip_sim_stream_release(created) == 0);
    CHECK(hipEventSynchronize(ev) == hipSuccess && hipStreamSynchronize(nonblocking) == hipSuccess);
    CHECK(back[0] == 0 && back[3] == 0);

    /* 4. hipStreamSynchronize(NULL) with nothing queued on the null stream still waits for
     * the blocking streams' work */
    mark = 7;
    CHECK(hipLaunchHostFunc(blocking, slow_write, &mark) == hipSuccess);
    CHECK(hipStreamSynchronize(NULL) == hipSuccess);
    CHECK(slow_mark == 7);

    /* 5. hipStreamNonBlocking is exempt both ways */
    CHECK(anychip_sim_stream_hold(nonblocking) == 0);
    CHECK(hipMemcpyAsync(d, twos, sizeof twos, hipMemcpyHostToDevice, nonblocking) == hipSuccess);
    memset(back, 0xff, sizeof back);
    CHECK(hipMemcpyAsync(back, d, sizeof back, hipMemcpyDeviceToHost, NULL) == hipSuccess);
    CHECK(hipStreamSynchronize(NULL) == hipSuccess);             /* does not wait for `nonblocking` */
    CHECK(back[0] == 0 && back[3] == 0);
    CHECK(hipMemcpy(back, d, sizeof back, hipMemcpyDeviceToHost) == hipSuccess);
    CHECK(back[0] == 0);
    CHECK(hipStreamQuery(nonblocking) == hipErrorNotReady);
    CHECK(anychip_sim_stream_release(nonblocking) == 0);
    CHECK(hipStreamSynchronize(nonblocking) == hipSuccess);
    CHECK(anychip_sim_stream_hold(NULL) == 0);
    CHECK(hipMemsetAsync(d, 0, sizeof ones, NULL) == hipSuccess);
    memset(back, 0xff, sizeof back);
    CHECK(hipMemcpyAsync(back, d, sizeof back, hipMemcpyDeviceToHost, nonblocking) == hipSuccess);
    CHECK(hipStreamSynchronize(nonblocking) == hipSuccess);      /* does not wait for the null stream */
    CHECK(back[0] == 2 && back[3] == 2);
    CHECK(hipStreamQuery(NULL) == hipErrorNotReady);
    CHECK(anychip_sim_stream_release(NULL) == 0);
    CHECK(hipStreamSynchronize(NULL) == hipSuccess);
    CHECK(hipMemcpy(back, d, sizeof back, hipMemcpyDeviceToHost) == hipSuccess);
    CHECK(back[0] == 0 && back[3] == 0);

    /* 6. two threads enqueue at once, one on the null stream, one on a blocking stream:
     * every op runs after all of the other queue's ops enqueued before it, and the waits
     * the two queues place on each other never deadlock */
    pusher p = {blocking, hipSuccess};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, push_blocking, &p) == 0);
    int rc = hipSuccess;
    for (int i = 0; i < ROUNDS && rc == hipSuccess; i++) {
        null_ops[i] = (order_check){&null_ran, &blocking_ran, __atomic_load_n(&blocking_enqueued, __ATOMIC_ACQUIRE),
                                    &violations};
        rc = hipLaunchHostFunc(NULL, run_check, &null_ops[i]);
        __atomic_store_n(&null_enqueued, i + 1, __ATOMIC_RELEASE);
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(rc == hipSuccess && p.rc == hipSuccess);
    CHECK(hipDeviceSynchronize() == hipSuccess);
    CHECK(null_ran == ROUNDS && blocking_ran == ROUNDS);
    CHECK(violations == 0);

    CHECK(hipEventDestroy(ev) == hipSuccess);
    CHECK(hipStreamDestroy(blocking) == hipSuccess && hipStreamDestroy(created) == hipSuccess);
    CHECK(hipStreamDestroy(nonblocking) == hipSuccess);
    CHECK(hipFree(d) == hipSuccess);
    printf("hip null stream ok\n");
    return 0;
}
