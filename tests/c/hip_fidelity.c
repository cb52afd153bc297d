/*
 * The HIP behaviours the simulator takes from ROCm clr, checked through the shipped
 * header as a HIP program would call them: hipFree, memcpy kinds, hipEventDisableTiming,
 * HIP 6's hipGetDeviceProperties (hipDeviceProp_tR0600) and hipDeviceGetAttribute.
 * Built and run by tests/devices/test_sim_c_abi.py; prints "hip fidelity ok".
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "hip/hip_runtime_api.h"
#include "check.h"

enum { N = 4096 };
static unsigned char a[N], b[N];
static volatile int slow_done;

/* stream work that takes 100 ms of the worker's time */
static void slow_work(void *arg)
{
    (void)arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 100000000L);
    slow_done = 1;
}

int main(void)
{
    void *d = NULL, *d2 = NULL;
    int local = 0;
    CHECK(hipMalloc(&d, N) == hipSuccess && hipMalloc(&d2, N) == hipSuccess);
    for (int i = 0; i < N; i++)
        a[i] = (unsigned char)(i * 5 + 3);

    /* the kind is range-checked only; the pointers give the direction */
    CHECK(hipMemcpy(d, a, N, hipMemcpyDeviceToHost) == hipSuccess);
    CHECK(hipMemcpy(b, d, N, hipMemcpyHostToDevice) == hipSuccess && memcmp(a, b, N) == 0);
    CHECK(hipMemcpy(d2, d, N, hipMemcpyHostToHost) == hipSuccess);
    memset(b, 0, N);
    CHECK(hipMemcpyAsync(b, d2, N, hipMemcpyHostToDevice, NULL) == hipSuccess);
    CHECK(hipStreamSynchronize(NULL) == hipSuccess && memcmp(a, b, N) == 0);
    CHECK(hipMemcpy(d, a, N, (hipMemcpyKind)5) == hipErrorInvalidMemcpyDirection);
    CHECK(hipGetLastError() == hipErrorInvalidMemcpyDirection);
    void *gone = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(gone != MAP_FAILED && munmap(gone, N) == 0);        /* a stale "device" pointer */
    CHECK(hipMemcpy(b, gone, N, hipMemcpyDeviceToHost) == hipErrorInvalidValue);
    CHECK(hipMemcpyAsync(gone, d, N, hipMemcpyDeviceToDevice, NULL) == hipErrorInvalidValue);

    /* hipFree: a pointer that is no allocation is hipErrorInvalidValue; it waits for the streams */
    CHECK(hipFree(&local) == hipErrorInvalidValue);
    CHECK(hipFree((char *)d + 8) == hipErrorInvalidValue);
    hipStream_t s;
    CHECK(hipStreamCreate(&s) == hipSuccess);
    CHECK(hipLaunchHostFunc(s, slow_work, NULL) == hipSuccess);
    CHECK(hipFree(d2) == hipSuccess && slow_done == 1);
    CHECK(hipStreamDestroy(s) == hipSuccess);

    /* events without timing */
    hipEvent_t t0, t1, n0;
    float ms = -1;
    CHECK(hipEventCreateWithFlags(&n0, hipEventDisableTiming) == hipSuccess);
    CHECK(hipEventCreateWithFlags(&t0, hipEventDefault) == hipSuccess && hipEventCreate(&t1) == hipSuccess);
    CHECK(hipEventCreateWithFlags(&t1, 0x80) == hipErrorInvalidValue);
    CHECK(hipEventRecord(t0, NULL) == 0 && hipEventRecord(n0, NULL) == 0 && hipEventRecord(t1, NULL) == 0);
    CHECK(hipEventSynchronize(t1) == hipSuccess);
    CHECK(hipEventElapsedTime(&ms, t0, n0) == hipErrorInvalidHandle);
    CHECK(hipEventElapsedTime(&ms, n0, t1) == hipErrorInvalidHandle);
    CHECK(hipEventElapsedTime(&ms, t0, t1) == hipSuccess && ms >= 0);
    CHECK(hipEventQuery(n0) == hipSuccess);                  /* still an event: it synchronizes */

    /* HIP 6 properties: hipGetDeviceProperties is hipGetDevicePropertiesR0600 */
    hipDeviceProp_t p;
    size_t total = 0;
    CHECK(sizeof(hipDeviceProp_t) == 1472);
    CHECK(offsetof(hipDeviceProp_t, totalGlobalMem) == 288 && offsetof(hipDeviceProp_t, gcnArchName) == 1160);
    CHECK(hipGetDeviceProperties(&p, 0) == hipSuccess);
    CHECK(hipDeviceTotalMem(&total, 0) == hipSuccess && p.totalGlobalMem == total);
    CHECK(strcmp(p.name, "Hygon DCU (anychip simulator)") == 0 && strncmp(p.gcnArchName, "gfx906", 6) == 0);
    CHECK(p.warpSize == 64 && p.multiProcessorCount == 64 && p.maxThreadsPerBlock == 1024 && p.major == 9);
    CHECK(p.pciBusID == 1 && p.l2CacheSize == 4 * 1024 * 1024 && p.arch.hasDoubles == 1);
    CHECK(hipGetDevicePropertiesR0600(&p, 99) == hipErrorInvalidDevice);
    CHECK(hipGetDeviceProperties(NULL, 0) == hipErrorInvalidValue);

    int v = 0;
    CHECK(hipDeviceAttributeWarpSize == 87 && hipDeviceAttributeMaxThreadsPerBlock == 56);
    CHECK(hipDeviceAttributeClockInstructionRate == 10000);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeWarpSize, 0) == hipSuccess && v == 64);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeMultiprocessorCount, 0) == hipSuccess && v == 64);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeMaxSharedMemoryPerBlock, 0) == hipSuccess && v == 65536);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeComputeCapabilityMajor, 0) == hipSuccess && v == 9);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeMaxBlockDimX, 0) == hipSuccess && v == 1024);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributePciBusId, 1) == hipSuccess && v == 2);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeWarpSize, 99) == hipErrorInvalidDevice);
    CHECK(hipDeviceGetAttribute(&v, hipDeviceAttributeLuid, 0) == hipErrorInvalidValue);   /* not simulated */
    CHECK(hipDeviceGetAttribute(NULL, hipDeviceAttributeWarpSize, 0) == hipErrorInvalidValue);

    CHECK(hipFree(d) == hipSuccess);
    printf("hip fidelity ok\n");
    return 0;
}
