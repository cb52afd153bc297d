/*
 * HIP as ROCm 6 programs use it beyond the basics: the version and flag macros,
 * hipExtHostAlloc / hipFreeHost, the special stream handles hipStreamPerThread and
 * hipStreamLegacy, stream-ordered allocation (hipMallocAsync / hipFreeAsync) with the
 * device's default memory pool, hipStreamDestroy of a destroyed stream (clr: 709), and
 * the legacy null stream's wait for blocking streams in a synchronous hipMemcpy.
 * Built and run by tests/devices/test_sim_c_abi.py; prints "hip stream-ordered ok".
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "hip/hip_runtime_api.h"
#include "check.h"

#if !defined(HIP_VERSION) || HIP_VERSION < 50200000
#error "HIP_VERSION must say HIP >= 5.2 (stream-ordered allocation)"
#endif

enum { N = 1 << 16 };
static int host[N];
static volatile int hostfn_ran;

static void mark(void *arg) { hostfn_ran = *(int *)arg; }

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* stream work that takes 100 ms */
static void slow(void *arg)
{
    (void)arg;
    double t0 = now();
    while (now() - t0 < 0.1) {
    }
}

/* waits (at most 10 s) for the host to set *flag; records whether it saw it */
static int released, saw_release;
static void wait_for_host(void *arg)
{
    (void)arg;
    double t0 = now();
    while (!__atomic_load_n(&released, __ATOMIC_ACQUIRE) && now() - t0 < 10.0) {
    }
    saw_release = __atomic_load_n(&released, __ATOMIC_ACQUIRE);
}

int main(void)
{
    /* versions and flags */
    int v = 0;
    CHECK(hipRuntimeGetVersion(&v) == hipSuccess && v == HIP_VERSION);
    CHECK(HIP_VERSION == HIP_VERSION_MAJOR * 10000000 + HIP_VERSION_MINOR * 100000 + HIP_VERSION_PATCH);
    CHECK(HIP_VERSION == 60000000);
    CHECK(hipIpcMemLazyEnablePeerAccess == 0x1 && hipHostMallocPortable == 0x1 && hipHostMallocMapped == 0x2);
    CHECK(hipHostMallocWriteCombined == 0x4 && hipHostMallocCoherent == 0x40000000u);
    CHECK(hipDeviceScheduleAuto == 0 && hipDeviceScheduleBlockingSync == 0x4 && hipDeviceScheduleMask == 0x7);

    /* hipExtHostAlloc / hipFreeHost (ROCm 6.3's names for hipHostMalloc / hipHostFree) */
    int *pinned = NULL;
    CHECK(hipExtHostAlloc((void **)&pinned, N * sizeof(int), hipHostMallocPortable | hipHostMallocMapped) ==
          hipSuccess && pinned != NULL);
    void *bad = NULL;
    CHECK(hipExtHostAlloc(&bad, 64, hipHostMallocCoherent | hipHostMallocNonCoherent) == hipErrorInvalidValue);
    CHECK(hipGetLastError() == hipErrorInvalidValue);

    /* hipStreamPerThread / hipStreamLegacy are streams wherever one is expected */
    int *d = NULL;
    CHECK(hipMalloc((void **)&d, N * sizeof(int)) == hipSuccess);
    for (int i = 0; i < N; i++)
        pinned[i] = 3 * i + 1;
    CHECK(hipMemcpyAsync(d, pinned, N * sizeof(int), hipMemcpyHostToDevice, hipStreamPerThread) == hipSuccess);
    int token = 7;
    CHECK(hipLaunchHostFunc(hipStreamPerThread, mark, &token) == hipSuccess);
    CHECK(hipStreamSynchronize(hipStreamPerThread) == hipSuccess && hostfn_ran == 7);
    CHECK(hipMemsetAsync(d, 0, 4 * sizeof(int), hipStreamLegacy) == hipSuccess);
    CHECK(hipMemcpyAsync(host, d, N * sizeof(int), hipMemcpyDeviceToHost, hipStreamLegacy) == hipSuccess);
    CHECK(hipStreamSynchronize(hipStreamLegacy) == hipSuccess);
    CHECK(host[0] == 0 && host[3] == 0 && host[4] == 13 && host[N - 1] == 3 * (N - 1) + 1);
    hipEvent_t ev;
    CHECK(hipEventCreate(&ev) == hipSuccess);
    CHECK(hipEventRecord(ev, hipStreamPerThread) == hipSuccess && hipEventSynchronize(ev) == hipSuccess);
    CHECK(hipStreamQuery(hipStreamPerThread) == hipSuccess);
    CHECK(hipStreamDestroy(hipStreamPerThread) == hipErrorInvalidHandle);

    /* stream-ordered allocation on a created stream */
    hipStream_t s;
    CHECK(hipStreamCreate(&s) == hipSuccess);
    hipMemPool_t pool = NULL, current = NULL;
    CHECK(hipDeviceGetDefaultMemPool(&pool, 0) == hipSuccess && pool != NULL);
    CHECK(hipDeviceGetMemPool(&current, 0) == hipSuccess && current == pool);
    CHECK(hipDeviceSetMemPool(0, pool) == hipSuccess);
    uint64_t threshold = UINT64_MAX, got = 0;
    CHECK(hipMemPoolSetAttribute(pool, hipMemPoolAttrReleaseThreshold, &threshold) == hipSuccess);
    CHECK(hipMemPoolGetAttribute(pool, hipMemPoolAttrReleaseThreshold, &got) == hipSuccess && got == UINT64_MAX);
    int reuse = -1;
    CHECK(hipMemPoolGetAttribute(pool, hipMemPoolReuseAllowOpportunistic, &reuse) == hipSuccess && reuse == 1);
    uint64_t used0 = 1;
    CHECK(hipMemPoolGetAttribute(pool, hipMemPoolAttrUsedMemCurrent, &used0) == hipSuccess && used0 == 0);

    int *a = NULL, *b = NULL;
    CHECK(hipMallocAsync((void **)&a, N * sizeof(int), s) == hipSuccess && a != NULL);
    CHECK(hipMallocFromPoolAsync((void **)&b, 1000, pool, s) == hipSuccess && b != NULL);
    uint64_t used = 0, high = 0;
    CHECK(hipMemPoolGetAttribute(pool, hipMemPoolAttrUsedMemCurrent, &used) == hipSuccess);
    CHECK(used == N * sizeof(int) + 1000);
    CHECK(hipMemcpyAsync(a, d, N * sizeof(int), hipMemcpyDeviceToDevice, s) == hipSuccess);
    CHECK(hipMemcpyAsync(b, a, 1000, hipMemcpyDeviceToDevice, s) == hipSuccess);
    CHECK(hipFreeAsync(a, s) == hipSuccess);
    memset(host, 0, sizeof host);
    CHECK(hipMemcpyAsync(host, b, 1000, hipMemcpyDeviceToHost, s) == hipSuccess);
    CHECK(hipFreeAsync(b, s) == hipSuccess);
    CHECK(hipStreamSynchronize(s) == hipSuccess);
    CHECK(host[0] == 0 && host[4] == 13 && host[249] == 3 * 249 + 1 && host[250] == 0);
    CHECK(hipMemPoolGetAttribute(pool, hipMemPoolAttrUsedMemCurrent, &used) == hipSuccess && used == 0);
    CHECK(hipMemPoolGetAttribute(pool, hipMemPoolAttrUsedMemHigh, &high) == hipSuccess);
    CHECK(high == N * sizeof(int) + 1000);
    uint64_t zero = 0, one = 1;
    CHECK(hipMemPoolSetAttribute(pool, hipMemPoolAttrUsedMemHigh, &zero) == hipSuccess);
    CHECK(hipMemPoolGetAttribute(pool, hipMemPoolAttrUsedMemHigh, &high) == hipSuccess && high == 0);
    CHECK(hipMemPoolSetAttribute(pool, hipMemPoolAttrUsedMemHigh, &one) == hipErrorInvalidValue);
    CHECK(hipMemPoolSetAttribute(pool, hipMemPoolAttrUsedMemCurrent, &zero) == hipErrorInvalidValue);
    CHECK(hipMemPoolTrimTo(pool, 0) == hipSuccess);

    /* on the null-stream handles too, and hipFree takes such memory */
    int *c = NULL;
    CHECK(hipMallocAsync((void **)&c, 256, hipStreamPerThread) == hipSuccess);
    CHECK(hipFreeAsync(c, hipStreamPerThread) == hipSuccess);
    CHECK(hipMallocAsync((void **)&c, 256, NULL) == hipSuccess);
    CHECK(hipFree(c) == hipSuccess);

    /* what clr refuses */
    CHECK(hipFreeAsync(c, s) == hipErrorInvalidValue);          /* freed already */
    CHECK(hipFreeAsync(d, s) == hipErrorInvalidValue);          /* not from a pool */
    CHECK(hipFreeAsync(NULL, s) == hipErrorInvalidValue);
    CHECK(hipMallocAsync((void **)&c, 0, s) == hipErrorInvalidValue);
    CHECK(hipMallocAsync(NULL, 16, s) == hipErrorInvalidValue);
    CHECK(hipMemPoolTrimTo((hipMemPool_t)&token, 0) == hipErrorInvalidValue);
    CHECK(hipDeviceGetDefaultMemPool(&pool, 999) == hipErrorInvalidDevice);

    /* the synchronous hipMemcpy waits for the device's blocking streams, not for non-blocking ones */
    hipStream_t blocking, nonblocking;
    CHECK(hipStreamCreateWithFlags(&blocking, hipStreamDefault) == hipSuccess);
    CHECK(hipStreamCreateWithFlags(&nonblocking, hipStreamNonBlocking) == hipSuccess);
    CHECK(hipStreamCreateWithFlags(&nonblocking, 0x4) == hipErrorInvalidValue);
    CHECK(hipLaunchHostFunc(nonblocking, wait_for_host, NULL) == hipSuccess);
    int ones[4] = {1, 1, 1, 1}, back[4] = {0, 0, 0, 0};
    pinned[0] = 0;
    CHECK(hipMemcpy(d, pinned, sizeof(int), hipMemcpyHostToDevice) == hipSuccess);
    CHECK(hipLaunchHostFunc(blocking, slow, NULL) == hipSuccess);
    CHECK(hipMemcpyAsync(d, ones, sizeof ones, hipMemcpyHostToDevice, blocking) == hipSuccess);
    CHECK(hipMemcpy(back, d, sizeof back, hipMemcpyDeviceToHost) == hipSuccess);
    CHECK(back[0] == 1 && back[3] == 1);
    CHECK(hipLaunchHostFunc(blocking, slow, NULL) == hipSuccess);
    CHECK(hipMemsetAsync(d, 0, sizeof ones, blocking) == hipSuccess);
    CHECK(hipMemset(d, 9, 1) == hipSuccess);       /* after the async memset */
    CHECK(hipMemcpy(back, d, sizeof back, hipMemcpyDeviceToHost) == hipSuccess);
    CHECK(back[0] == 9 && back[1] == 0);
    __atomic_store_n(&released, 1, __ATOMIC_RELEASE);
    CHECK(hipStreamSynchronize(nonblocking) == hipSuccess && saw_release == 1);
    CHECK(hipStreamDestroy(blocking) == hipSuccess && hipStreamDestroy(nonblocking) == hipSuccess);

    /* a second hipStreamDestroy of one stream: clr's hipErrorContextIsDestroyed */
    CHECK(hipStreamDestroy(s) == hipSuccess);
    CHECK(hipStreamDestroy(s) == hipErrorContextIsDestroyed);
    CHECK(hipGetLastError() == hipErrorContextIsDestroyed);
    CHECK(hipMallocAsync((void **)&c, 16, s) == hipErrorInvalidHandle);

    CHECK(hipEventDestroy(ev) == hipSuccess);
    CHECK(hipFree(d) == hipSuccess && hipFreeHost(pinned) == hipSuccess);
    CHECK(hipFreeHost(NULL) == hipSuccess);
    printf("hip stream-ordered ok\n");
    return 0;
}
