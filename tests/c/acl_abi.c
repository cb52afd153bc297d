/*
 * Calls the Ascend simulator through ACL's C API, built from the shipped header
 * (csrc/include/acl/acl.h) as a program written for CANN's acl/acl.h is. Linked against
 * libascend_sim by tests/devices/test_sim_c_abi.py.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "acl/acl.h"
#include "anychip/sim.h"
#include "check.h"

#define SIM_E_TIMEOUT ANYCHIP_SIM_E_TIMEOUT
#define SIM_E_INVALID_STREAM 17

int main(void)
{
    enum { N = 4096 };
    static unsigned char a[N], b[N];
    uint32_t count = 0;
    CHECK(aclInit(NULL) == 0);
    CHECK(aclInit(NULL) == 100002);                     /* ACL_ERROR_REPEAT_INITIALIZE */
    CHECK(aclrtGetDeviceCount(&count) == 0 && count >= 1);
    CHECK(aclrtSetDevice(count) == 107001);             /* ACL_ERROR_RT_INVALID_DEVICEID */
    CHECK(aclrtSetDevice(0) == 0);
    int32_t dev = -1;
    CHECK(aclrtGetDevice(&dev) == 0 && dev == 0);

    void *d1 = NULL, *d2 = NULL;
    CHECK(aclrtMalloc(&d1, N, ACL_MEM_MALLOC_HUGE_FIRST) == 0 && d1);
    CHECK(aclrtMalloc(&d2, N, ACL_MEM_MALLOC_HUGE_FIRST) == 0 && d2);
    for (int i = 0; i < N; i++)
        a[i] = (unsigned char)(i * 7);
    CHECK(aclrtMemcpy(d1, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE) == 0);
    CHECK(aclrtMemcpy(b, N, a, N + 1, ACL_MEMCPY_HOST_TO_DEVICE) == 107000); /* count > destMax */

    aclrtStream s;
    aclrtEvent e0, e1;
    CHECK(aclrtCreateStream(&s) == 0);
    CHECK(aclrtCreateEvent(&e0) == 0 && aclrtCreateEvent(&e1) == 0);
    CHECK(anychip_sim_stream_hold(s) == 0);
    CHECK(aclrtRecordEvent(e0, s) == 0);
    CHECK(aclrtMemcpyAsync(d2, N, d1, N, ACL_MEMCPY_DEVICE_TO_DEVICE, s) == 0);
    CHECK(aclrtMemcpyAsync(b, N, d2, N, ACL_MEMCPY_DEVICE_TO_HOST, s) == 0);
    CHECK(aclrtRecordEvent(e1, s) == 0);
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    CHECK(aclrtQueryEventStatus(e1, &st) == 0 && st == ACL_EVENT_RECORDED_STATUS_NOT_READY);
    CHECK(b[1] == 0);                                   /* held: nothing ran */
    /* the timed waits give up on a held stream, and never consume its result */
    CHECK(anychip_sim_stream_wait(s, 1) == SIM_E_TIMEOUT);
    CHECK(anychip_sim_event_wait(e1, 1) == SIM_E_TIMEOUT);
    CHECK(anychip_sim_device_wait(1) == SIM_E_TIMEOUT);
    CHECK(anychip_sim_event_wait(e0, 0) == SIM_E_TIMEOUT); /* 0: do not wait */
    CHECK(b[1] == 0);
    CHECK(anychip_sim_stream_release(s) == 0);
    CHECK(anychip_sim_stream_wait(s, -1) == 0 && anychip_sim_event_wait(e1, -1) == 0);
    CHECK(anychip_sim_device_wait(-1) == 0);
    CHECK(aclrtSynchronizeStream(s) == 0);
    CHECK(aclrtQueryEventStatus(e1, &st) == 0 && st == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK(memcmp(a, b, N) == 0);
    float ms = -1;
    CHECK(aclrtEventElapsedTime(&ms, e0, e1) == 0 && ms >= 0);

    CHECK(aclrtMemsetAsync(d1, N, 0x5a, N, s) == 0);
    CHECK(aclrtSynchronizeStream(s) == 0);
    CHECK(aclrtMemcpy(b, N, d1, N, ACL_MEMCPY_DEVICE_TO_HOST) == 0 && b[N - 1] == 0x5a);

    /* errors come back as ACL codes, never as crashes */
    CHECK(aclrtMemcpy(b, N + 1, d1, N + 1, ACL_MEMCPY_DEVICE_TO_HOST) == 107000); /* past the allocation */
    CHECK(aclGetRecentErrMsg() != NULL);
    CHECK(aclrtMemcpy(d1, N, a, N, ACL_MEMCPY_DEVICE_TO_HOST) == 107000);         /* wrong direction */
    CHECK(aclrtFree((char *)d1 + 16) == 107000);                                  /* not the start */
    CHECK(aclrtFree(d1) == 0);
    CHECK(aclrtFree(d1) == 107000);                                               /* already freed */
    CHECK(aclrtMalloc(&d1, (size_t)1 << 50, ACL_MEM_MALLOC_HUGE_FIRST) == 207001); /* out of memory */
    CHECK(aclrtDestroyStream(s) == 0);
    CHECK(aclrtSynchronizeStream(s) == 107017);                                   /* destroyed stream */
    CHECK(anychip_sim_stream_wait(s, 1) == SIM_E_INVALID_STREAM);
    CHECK(aclrtDestroyEvent(e0) == 0 && aclrtDestroyEvent(e0) == 107017);
    void *h = NULL;
    CHECK(aclrtMallocHost(&h, 100) == 0 && aclrtFreeHost(h) == 0 && aclrtFreeHost(h) == 107000);
    size_t fr = 0, tot = 0;
    CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &tot) == 0 && fr <= tot && tot > 0);
    CHECK(aclrtFree(d2) == 0);
    CHECK(aclFinalize() == 0);
    printf("acl ok\n");
    return 0;
}
