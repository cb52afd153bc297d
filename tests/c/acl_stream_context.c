/*
 * ACL refuses a stream outside the current context for aclrtMemcpyAsync and
 * aclrtMemsetAsync with ACL_ERROR_RT_STREAM_CONTEXT (CANN runtime api_impl.cc). Built and
 * run by tests/devices/test_sim_c_abi.py; prints "acl stream context ok".
 */
#include <stdio.h>
#include <string.h>

#include "acl/acl.h"
#include "check.h"

int main(void)
{
    unsigned char host[256], back[256];
    for (int i = 0; i < 256; i++)
        host[i] = (unsigned char)(i * 7);
    CHECK(aclInit(NULL) == ACL_SUCCESS);
    CHECK(aclrtSetDevice(0) == ACL_SUCCESS);
    aclrtStream s0;
    void *d0 = NULL, *d1 = NULL;
    CHECK(aclrtCreateStream(&s0) == ACL_SUCCESS);
    CHECK(aclrtMalloc(&d0, 256, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS);
    CHECK(aclrtSetDevice(1) == ACL_SUCCESS);
    CHECK(aclrtMalloc(&d1, 256, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS);
    /* device 1 is current: device 0's stream is outside the current context */
    CHECK(aclrtMemcpyAsync(d1, 256, host, 256, ACL_MEMCPY_HOST_TO_DEVICE, s0) == ACL_ERROR_RT_STREAM_CONTEXT);
    CHECK(strstr(aclGetRecentErrMsg(), "belongs to device 0") != NULL);
    CHECK(aclrtMemsetAsync(d1, 256, 1, 256, s0) == ACL_ERROR_RT_STREAM_CONTEXT);
    CHECK(aclrtMemcpyAsync(d1, 256, host, 256, ACL_MEMCPY_HOST_TO_DEVICE, NULL) == ACL_SUCCESS);
    CHECK(aclrtSynchronizeStream(NULL) == ACL_SUCCESS);
    /* back in device 0's context the stream is accepted */
    CHECK(aclrtSetDevice(0) == ACL_SUCCESS);
    CHECK(aclrtMemsetAsync(d0, 256, 0, 256, s0) == ACL_SUCCESS);
    CHECK(aclrtMemcpyAsync(d0, 256, host, 128, ACL_MEMCPY_HOST_TO_DEVICE, s0) == ACL_SUCCESS);
    CHECK(aclrtMemcpyAsync(back, 256, d0, 256, ACL_MEMCPY_DEVICE_TO_HOST, s0) == ACL_SUCCESS);
    CHECK(aclrtSynchronizeStream(s0) == ACL_SUCCESS);
    CHECK(back[127] == (unsigned char)(127 * 7) && back[128] == 0 && back[255] == 0);
    CHECK(aclrtDestroyStream(s0) == ACL_SUCCESS);
    CHECK(aclrtFree(d0) == ACL_SUCCESS);
    CHECK(aclrtSetDevice(1) == ACL_SUCCESS && aclrtFree(d1) == ACL_SUCCESS);
    CHECK(aclFinalize() == ACL_SUCCESS);
    printf("acl stream context ok\n");
    return 0;
}
