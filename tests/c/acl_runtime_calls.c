/*
 * ACL runtime calls torch_npu and kernel launchers make: aclrtLaunchHostFunc (a host
 * function in stream order that blocks the stream's later work), aclrtGetDeviceInfo,
 * aclrtGetLastError / aclrtPeekAtLastError, and aclrtMemcpy waiting for no stream. Built
 * against anychip's acl/acl.h by
 * tests/devices/test_sim_c_abi.py; prints "acl runtime calls ok".
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "acl/acl.h"
#include "anychip/sim.h"

static int failures;
#define CHECK(cond, ...)                                 \
    do {                                                 \
        if (!(cond)) {                                   \
            fprintf(stderr, "line %d: ", __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                \
            fprintf(stderr, "\n");                       \
            failures++;                                  \
        }                                                \
    } while (0)

typedef struct { int *pinned; int value; int calls; } host_job;

/* writes the pinned buffer the next copy on the stream reads, after a pause: a copy queued
 * after it sees the value only if the stream waited for it */
static void host_fn(void *arg)
{
    host_job *j = arg;
    struct timespec pause = {0, 30 * 1000 * 1000};
    nanosleep(&pause, NULL);
    *j->pinned = j->value;
    j->calls++;
}

int main(void)
{
    CHECK(aclInit(NULL) == ACL_SUCCESS, "aclInit");
    CHECK(aclrtSetDevice(0) == ACL_SUCCESS, "set device");
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream) == ACL_SUCCESS, "create stream");
    int *pinned = NULL, *dev = NULL, out[2] = {0, 0};
    CHECK(aclrtMallocHost((void **)&pinned, 2 * sizeof(int)) == ACL_SUCCESS, "malloc host");
    CHECK(aclrtMalloc((void **)&dev, 2 * sizeof(int), ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS, "malloc");
    pinned[0] = pinned[1] = -1;

    /* no aclrtSubscribeReport needed (that is aclrtLaunchCallback's model) */
    host_job a = {&pinned[0], 11, 0}, b = {&pinned[1], 22, 0};
    CHECK(aclrtLaunchHostFunc(stream, host_fn, &a) == ACL_SUCCESS, "launch host func");
    CHECK(aclrtMemcpyAsync(dev, sizeof(int), &pinned[0], sizeof(int), ACL_MEMCPY_HOST_TO_DEVICE, stream) ==
          ACL_SUCCESS, "copy");
    CHECK(aclrtLaunchHostFunc(NULL, host_fn, &b) == ACL_SUCCESS, "launch on the default stream");
    CHECK(aclrtSynchronizeStream(stream) == ACL_SUCCESS, "sync");
    CHECK(aclrtSynchronizeDevice() == ACL_SUCCESS, "sync device");
    CHECK(aclrtMemcpy(out, sizeof(int), dev, sizeof(int), ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS, "copy back");
    CHECK(out[0] == 11, "the copy after the host function read %d, not the 11 it wrote", out[0]);
    CHECK(a.calls == 1 && b.calls == 1 && pinned[1] == 22, "host functions ran %d and %d times", a.calls, b.calls);

    /* aclrtMemcpy waits for no stream (CANN: a driver copy), the default stream included:
     * with the default stream held, a copy queued on it has not run when aclrtMemcpy reads */
    int fresh = 77, seen = -1;
    pinned[0] = 5;
    CHECK(aclrtMemcpy(dev, sizeof(int), &pinned[0], sizeof(int), ACL_MEMCPY_HOST_TO_DEVICE) == ACL_SUCCESS, "put");
    CHECK(anychip_sim_stream_hold(NULL) == 0, "hold the default stream");
    CHECK(aclrtMemcpyAsync(dev, sizeof(int), &fresh, sizeof(int), ACL_MEMCPY_HOST_TO_DEVICE, NULL) == ACL_SUCCESS,
          "queue a copy on the default stream");
    CHECK(aclrtMemcpy(&seen, sizeof(int), dev, sizeof(int), ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS, "read");
    CHECK(seen == 5, "aclrtMemcpy read %d: it waited for the default stream", seen);
    CHECK(anychip_sim_stream_release(NULL) == 0, "release");
    CHECK(aclrtSynchronizeStream(NULL) == ACL_SUCCESS, "sync the default stream");
    CHECK(aclrtMemcpy(&seen, sizeof(int), dev, sizeof(int), ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS, "read");
    CHECK(seen == 77, "after the synchronize the copy read %d", seen);

    /* the last error: kept per thread, Get clears it, Peek does not */
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS, "no error yet");
    CHECK(aclrtLaunchHostFunc(stream, NULL, NULL) == ACL_ERROR_INVALID_PARAM, "NULL fn");
    CHECK(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM, "peek");
    CHECK(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM, "peek keeps it");
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM, "get");
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS, "get cleared it");
    CHECK(aclrtMemcpy(out, 1, dev, sizeof(int), ACL_MEMCPY_DEVICE_TO_HOST) == ACL_ERROR_RT_PARAM_INVALID,
          "count > destMax");
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_RT_PARAM_INVALID, "the copy's error");
    CHECK(aclrtGetLastError((aclrtLastErrLevel)3) == ACL_ERROR_INVALID_PARAM, "unknown level");

    /* device attributes */
    int64_t v = -1;
    CHECK(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_AICORE_CORE_NUM, &v) == ACL_SUCCESS && v == 24, "ai cores %lld",
          (long long)v);
    CHECK(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_CUBE_CORE_NUM, &v) == ACL_SUCCESS && v == 24, "cube cores");
    CHECK(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_VECTOR_CORE_NUM, &v) == ACL_SUCCESS && v == 48, "vector cores");
    CHECK(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_AICPU_CORE_NUM, &v) == ACL_SUCCESS && v == 6, "ai cpus");
    size_t free_bytes = 0, total = 0;
    CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total) == ACL_SUCCESS, "mem info");
    CHECK(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE, &v) == ACL_SUCCESS && v == (int64_t)total,
          "global memory %lld, aclrtGetMemInfo total %zu", (long long)v, total);
    CHECK(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_WARP_SIZE, &v) == ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "warp size");
    CHECK(aclrtGetDeviceInfo(0, (aclrtDevAttr)7, &v) == ACL_ERROR_INVALID_PARAM, "unknown attribute");
    uint32_t count = 0;
    CHECK(aclrtGetDeviceCount(&count) == ACL_SUCCESS, "count");
    CHECK(aclrtGetDeviceInfo(count, ACL_DEV_ATTR_AICORE_CORE_NUM, &v) == ACL_ERROR_RT_INVALID_DEVICEID,
          "device past the last");
    CHECK(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_AICORE_CORE_NUM, NULL) == ACL_ERROR_INVALID_PARAM, "NULL value");

    aclrtFree(dev);
    aclrtFreeHost(pinned);
    CHECK(aclrtDestroyStream(stream) == ACL_SUCCESS, "destroy stream");
    if (!failures)
        printf("acl runtime calls ok\n");
    return failures ? 1 : 0;
}
