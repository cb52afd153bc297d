/*
 * A stream wait that its own queue already implies is passed without being queued: stream A
 * waits for B's record and then records EA; B, told to wait for EA, needs nothing A has not
 * had from B already (the two-stream hand-shake of a framework's collectives). A wait for a
 * record with real work ahead of it is queued. Observed through aclrtQueryEventWaitStatus
 * (COMPLETE while no stream is held at a wait for the event), with the streams held.
 */
#include <stdio.h>
#include <string.h>

#include "acl/acl.h"
#include "anychip/sim.h"

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                           \
        }                                                                       \
    } while (0)

enum { N = 1 << 16 };

static int wait_status(aclrtEvent e)
{
    aclrtEventWaitStatus s;
    return aclrtQueryEventWaitStatus(e, &s) == ACL_SUCCESS ? (int)s : -1;
}

static int recorded_status(aclrtEvent e)
{
    aclrtEventRecordedStatus s;
    return aclrtQueryEventStatus(e, &s) == ACL_SUCCESS ? (int)s : -1;
}

int main(void)
{
    static unsigned char host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (unsigned char)(i * 7 + 1);
    CHECK(aclrtSetDevice(0) == ACL_SUCCESS);
    void *x, *y, *z;
    CHECK(aclrtMalloc(&x, N, ACL_MEM_MALLOC_HUGE_FIRST) == 0 && aclrtMalloc(&y, N, ACL_MEM_MALLOC_HUGE_FIRST) == 0 &&
          aclrtMalloc(&z, N, ACL_MEM_MALLOC_HUGE_FIRST) == 0);
    CHECK(aclrtMemcpy(x, N, host, N, ACL_MEMCPY_HOST_TO_DEVICE) == 0);
    aclrtStream a, b, c;
    aclrtEvent eb, ea, ec;
    CHECK(aclrtCreateStream(&a) == 0 && aclrtCreateStream(&b) == 0 && aclrtCreateStream(&c) == 0);
    CHECK(aclrtCreateEvent(&eb) == 0 && aclrtCreateEvent(&ea) == 0 && aclrtCreateEvent(&ec) == 0);

    /* B (held) copies x -> y and records EB; A waits for EB and records EA */
    CHECK(anychip_sim_stream_hold(b) == 0);
    CHECK(aclrtMemcpyAsync(y, N, x, N, ACL_MEMCPY_DEVICE_TO_DEVICE, b) == 0);
    CHECK(aclrtRecordEvent(eb, b) == 0);
    CHECK(aclrtStreamWaitEvent(a, eb) == 0);
    CHECK(aclrtRecordEvent(ea, a) == 0);
    CHECK(wait_status(eb) == ACL_EVENT_WAIT_STATUS_NOT_READY);  /* A is at its wait for EB */
    /* B waits for EA: implied by B's own order, so not queued; EA itself is not complete */
    CHECK(aclrtStreamWaitEvent(b, ea) == 0);
    CHECK(wait_status(ea) == ACL_EVENT_WAIT_STATUS_COMPLETE);
    CHECK(recorded_status(ea) == ACL_EVENT_RECORDED_STATUS_NOT_READY);

    /* C (held) copies y -> z and records EC: B's wait for EC has work ahead of it and is queued */
    CHECK(anychip_sim_stream_hold(c) == 0);
    CHECK(aclrtMemcpyAsync(z, N, y, N, ACL_MEMCPY_DEVICE_TO_DEVICE, c) == 0);
    CHECK(aclrtRecordEvent(ec, c) == 0);
    CHECK(aclrtStreamWaitEvent(b, ec) == 0);
    CHECK(wait_status(ec) == ACL_EVENT_WAIT_STATUS_NOT_READY);

    /* released, everything runs in order: z holds x's bytes (C's copy ran after B's) */
    CHECK(anychip_sim_stream_release(b) == 0);
    CHECK(aclrtSynchronizeStream(a) == 0);
    CHECK(anychip_sim_stream_release(c) == 0);
    CHECK(aclrtSynchronizeStream(b) == 0 && aclrtSynchronizeStream(c) == 0);
    CHECK(wait_status(eb) == ACL_EVENT_WAIT_STATUS_COMPLETE && wait_status(ec) == ACL_EVENT_WAIT_STATUS_COMPLETE);
    CHECK(recorded_status(ea) == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK(aclrtMemcpy(back, N, z, N, ACL_MEMCPY_DEVICE_TO_HOST) == 0);
    CHECK(memcmp(back, host, N) == 0);
    printf("acl implied wait ok\n");
    return 0;
}
