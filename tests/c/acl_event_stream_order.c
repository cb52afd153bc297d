/*
 * A stream's record of an event is one of its ops: once aclrtSynchronizeEvent returns for
 * the last op queued on a stream, aclrtStreamQuery reports the stream complete, every
 * time (the event was once completed before the stream counted the op as run, so a query
 * right after the event's synchronize could see work pending). The record is queued
 * behind a copy on a held stream, so it runs on the stream's worker while this thread
 * waits for it, and the check is repeated ROUNDS times. Built and run by tests/devices/test_sim_c_abi.py; prints
 * "acl event stream order ok".
 */
#include <stdio.h>
#include <stdlib.h>

#include "acl/acl.h"
#include "anychip/sim.h"

#define ROUNDS 100000
#define BYTES 4096

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAILED line %d (round %d): %s\n", __LINE__, round, #cond);  \
            return 1;                                                           \
        }                                                                       \
    } while (0)

int main(void)
{
    int round = -1;
    unsigned char *host = calloc(1, BYTES);
    CHECK(host != NULL);
    CHECK(aclInit(NULL) == ACL_SUCCESS);
    CHECK(aclrtSetDevice(0) == ACL_SUCCESS);
    aclrtStream s;
    aclrtEvent ev;
    void *dev = NULL;
    CHECK(aclrtCreateStream(&s) == ACL_SUCCESS);
    CHECK(aclrtCreateEvent(&ev) == ACL_SUCCESS);
    CHECK(aclrtMalloc(&dev, BYTES, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS);
    int late = 0;
    for (round = 0; round < ROUNDS; round++) {
        aclrtStreamStatus status = ACL_STREAM_STATUS_RESERVED;
        aclrtEventRecordedStatus recorded = ACL_EVENT_RECORDED_STATUS_NOT_READY;
        CHECK(anychip_sim_stream_hold(s) == 0);
        CHECK(aclrtMemcpyAsync(dev, BYTES, host, BYTES, ACL_MEMCPY_HOST_TO_DEVICE, s) == ACL_SUCCESS);
        CHECK(aclrtRecordEvent(ev, s) == ACL_SUCCESS);
        CHECK(aclrtStreamQuery(s, &status) == ACL_SUCCESS && status == ACL_STREAM_STATUS_NOT_READY);
        CHECK(anychip_sim_stream_release(s) == 0);
        CHECK(aclrtSynchronizeEvent(ev) == ACL_SUCCESS);
        CHECK(aclrtStreamQuery(s, &status) == ACL_SUCCESS);
        late += status != ACL_STREAM_STATUS_COMPLETE;
        CHECK(aclrtQueryEventStatus(ev, &recorded) == ACL_SUCCESS && recorded == ACL_EVENT_RECORDED_STATUS_COMPLETE);
        CHECK(aclrtSynchronizeStream(s) == ACL_SUCCESS);
    }
    round = -1;
    if (late) {
        printf("FAILED: in %d of %d rounds the stream reported work pending after its last op's event completed\n",
               late, ROUNDS);
        return 1;
    }
    CHECK(aclrtFree(dev) == ACL_SUCCESS);
    CHECK(aclrtDestroyEvent(ev) == ACL_SUCCESS);
    CHECK(aclrtDestroyStream(s) == ACL_SUCCESS);
    CHECK(aclFinalize() == ACL_SUCCESS);
    free(host);
    printf("acl event stream order ok\n");
    return 0;
}
