/*
 * Calls the Hygon simulator through HIP's C API, built from the shipped header
 * (csrc/include/hip/hip_runtime_api.h) as a program written
 * for ROCm's header is. Linked against libhygon_sim by
 * tests/devices/test_sim_c_abi.py.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "anychip/sim.h"
#include "hip/hip_runtime_api.h"
#include "check.h"

int main(void)
{
    enum { N = 4096 };
    static unsigned char a[N], b[N];
    int count = 0, dev = -1;
    CHECK(hipGetDeviceCount(&count) == 0 && count >= 1);
    CHECK(hipGetDevice(&dev) == 0 && dev == 0);
    CHECK(hipSetDevice(count) == 101);                  /* hipErrorInvalidDevice */
    CHECK(hipGetLastError() == 101 && hipGetLastError() == 0);
    CHECK(strcmp(hipGetErrorName(600), "hipErrorNotReady") == 0);

    void *d1 = NULL, *d2 = NULL, *z = (void *)1;
    CHECK(hipMalloc(&z, 0) == 0 && z == NULL);          /* zero bytes: NULL, no error */
    CHECK(hipMalloc(&d1, N) == 0 && hipMalloc(&d2, N) == 0);
    for (int i = 0; i < N; i++)
        a[i] = (unsigned char)(i ^ 0x3c);
    hipStream_t s1, s2;
    hipEvent_t e0, e1;
    CHECK(hipStreamCreate(&s1) == 0 && hipStreamCreate(&s2) == 0);
    CHECK(hipEventCreate(&e0) == 0 && hipEventCreate(&e1) == 0);
    CHECK(anychip_sim_stream_hold(s1) == 0);
    CHECK(hipEventRecord(e0, s1) == 0);
    CHECK(hipMemcpyAsync(d1, a, N, hipMemcpyHostToDevice, s1) == 0);
    CHECK(hipEventRecord(e1, s1) == 0);
    CHECK(hipStreamWaitEvent(s2, e1, 0) == 0);          /* s2 runs after s1's copy */
    CHECK(hipMemcpyAsync(d2, d1, N, hipMemcpyDefault, s2) == 0);
    CHECK(hipMemcpyAsync(b, d2, N, hipMemcpyDeviceToHost, s2) == 0);
    CHECK(hipStreamQuery(s1) == 600 && hipStreamQuery(s2) == 600 && hipEventQuery(e1) == 600);
    CHECK(b[7] == 0);
    CHECK(anychip_sim_stream_release(s1) == 0);
    CHECK(hipStreamSynchronize(s2) == 0 && hipStreamQuery(s2) == 0);
    CHECK(memcmp(a, b, N) == 0);
    float ms = -1;
    CHECK(hipEventSynchronize(e1) == 0 && hipEventElapsedTime(&ms, e0, e1) == 0 && ms >= 0);
    CHECK(hipMemset(d1, 0xab, N) == 0 && hipMemcpy(b, d1, N, hipMemcpyDeviceToHost) == 0 && b[0] == 0xab);

    CHECK(hipMemcpy(b, d1, N + 1, hipMemcpyDeviceToHost) == 1);     /* hipErrorInvalidValue */
    CHECK(hipMemcpy(d1, a, N, (hipMemcpyKind)5) == 21);             /* hipErrorInvalidMemcpyDirection */
    CHECK(hipMemset(a, 0, N) != 0);                                 /* host memory */
    CHECK(hipFree((char *)d1 + 4) == 1);                            /* hipErrorInvalidValue (clr) */
    hipIpcMemHandle_t ipc;
    CHECK(hipIpcGetMemHandle(&ipc, d1) == 0);
    CHECK(hipFree(d1) == 0 && hipFree(d1) == 1);
    CHECK(hipMalloc(&d1, (size_t)1 << 50) == 2);                    /* hipErrorOutOfMemory */
    CHECK(hipStreamDestroy(s1) == 0 && hipStreamSynchronize(s1) == 400); /* hipErrorInvalidHandle */
    CHECK(hipEventDestroy(e0) == 0 && hipEventQuery(e0) == 400);
    CHECK(hipStreamDestroy(s2) == 0 && hipEventDestroy(e1) == 0);
    void *h = NULL;
    CHECK(hipHostMalloc(&h, 64, 0) == 0 && hipHostFree(h) == 0 && hipHostFree(h) == 1);
    size_t fr = 0, tot = 0;
    CHECK(hipMemGetInfo(&fr, &tot) == 0 && fr <= tot);
    CHECK(hipFree(d2) == 0 && hipDeviceSynchronize() == 0);
    printf("hip ok: %s\n", hipGetErrorString(0));
    return 0;
}
