/*
 * A multi-rank HCCL program written against hccl/hccl.h and the ACL runtime's C API, as
 * a user program for Ascend NPUs would be: one process per rank (fork), the root info
 * made before the fork. Linked against libascend_sim by tests/collectives/test_native_ccl_c.py.
 * Usage: hccl_ranks NRANKS. Prints "hccl ok rank R" per rank, exits 0 when exact.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hccl/hccl.h"

typedef int aclError;
typedef enum { ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST,
               ACL_MEMCPY_DEVICE_TO_DEVICE } aclrtMemcpyKind;
typedef enum { ACL_MEM_MALLOC_HUGE_FIRST } aclrtMemMallocPolicy;
aclError aclInit(const char *configPath);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);

#define RANKS_MALLOC(p, n) aclrtMalloc(p, n, ACL_MEM_MALLOC_HUGE_FIRST)
#include "ranks.h"

#define HCCL(call) REQUIRE(call, HCCL_SUCCESS, HcclGetErrorString)

static void put(void *dev, const void *host, size_t n) { aclrtMemcpy(dev, n, host, n, ACL_MEMCPY_HOST_TO_DEVICE); }
static void get(void *host, const void *dev, size_t n) { aclrtMemcpy(host, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST); }

static int run(int nranks, void *arg)
{
    const HcclRootInfo *root_info = arg;
    const size_t big = (1 << 16) + 5;
    aclInit(NULL);
    aclrtSetDevice(rank % 4);
    HcclComm comm;
    HCCL(HcclCommInitRootInfo((uint32_t)nranks, root_info, (uint32_t)rank, &comm));
    uint32_t size = 0, id = 99;
    HCCL(HcclGetRankSize(comm, &size));
    HCCL(HcclGetRankId(comm, &id));
    CHECK(size == (uint32_t)nranks && id == (uint32_t)rank, "size %u id %u", size, id);
    aclrtStream stream;
    aclrtCreateStream(&stream);
    float *h = malloc(big * nranks * sizeof(float)), *o = malloc(big * nranks * sizeof(float));
    float *send = dev_alloc(big * nranks * sizeof(float)), *recv = dev_alloc(big * nranks * sizeof(float));

    for (size_t i = 0; i < big; i++)
        h[i] = (float)((rank + 1) * (int)(i % 100));
    put(send, h, big * sizeof(float));
    HCCL(HcclAllReduce(send, recv, big, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream));
    HCCL(aclrtSynchronizeStream(stream) == 0 ? HCCL_SUCCESS : HCCL_E_RUNTIME);
    get(o, recv, big * sizeof(float));
    CHECK(o[big - 1] == (float)(nranks * (nranks + 1) / 2 * (int)((big - 1) % 100)), "all-reduce [last] = %g",
          o[big - 1]);

    /* broadcast is in place; reduce max to the last rank */
    for (int i = 0; i < 50; i++)
        h[i] = rank == 0 ? (float)i : 0.0f;
    put(recv, h, 50 * sizeof(float));
    HCCL(HcclBroadcast(recv, 50, HCCL_DATA_TYPE_FP32, 0, comm, stream));
    aclrtSynchronizeStream(stream);
    get(o, recv, 50 * sizeof(float));
    CHECK(o[49] == 49.0f, "broadcast [49] = %g", o[49]);
    int8_t *h8 = (int8_t *)h, *o8 = (int8_t *)o;
    for (int i = 0; i < 9; i++)
        h8[i] = (int8_t)(rank - i);
    put(send, h8, 9);
    HCCL(HcclReduce(send, recv, 9, HCCL_DATA_TYPE_INT8, HCCL_REDUCE_MAX, (uint32_t)(nranks - 1), comm, stream));
    aclrtSynchronizeStream(stream);
    if (rank == nranks - 1) {
        get(o8, recv, 9);
        CHECK(o8[8] == (int8_t)(nranks - 1 - 8), "reduce max int8 [8] = %d", o8[8]);
    }

    /* all-gather, reduce-scatter (prod, int32), all-to-all */
    for (int i = 0; i < 16; i++)
        h[i] = (float)(rank * 16 + i);
    put(send, h, 16 * sizeof(float));
    HCCL(HcclAllGather(send, recv, 16, HCCL_DATA_TYPE_FP32, comm, stream));
    aclrtSynchronizeStream(stream);
    get(o, recv, 16 * nranks * sizeof(float));
    for (int i = 0; i < 16 * nranks; i++)
        if (o[i] != (float)i) {
            CHECK(0, "all-gather [%d] = %g", i, o[i]);
            break;
        }
    int32_t *h32 = (int32_t *)h, *o32 = (int32_t *)o;
    for (int i = 0; i < 4 * nranks; i++)
        h32[i] = i + 1;
    put(send, h32, 4 * nranks * sizeof(int32_t));
    HCCL(HcclReduceScatter(send, recv, 4, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_PROD, comm, stream));
    aclrtSynchronizeStream(stream);
    get(o32, recv, 4 * sizeof(int32_t));
    int32_t want = 1;
    for (int r = 0; r < nranks; r++)
        want *= 4 * rank + 2;
    CHECK(o32[1] == want, "reduce-scatter prod [1] = %d, want %d", o32[1], want);
    for (int i = 0; i < 2 * nranks; i++)
        h32[i] = rank * 1000 + i;
    put(send, h32, 2 * nranks * sizeof(int32_t));
    HCCL(HcclAlltoAll(send, 2, HCCL_DATA_TYPE_INT32, recv, 2, HCCL_DATA_TYPE_INT32, comm, stream));
    aclrtSynchronizeStream(stream);
    get(o32, recv, 2 * nranks * sizeof(int32_t));
    CHECK(o32[2 * (nranks - 1) + 1] == (nranks - 1) * 1000 + 2 * rank + 1, "all-to-all");

    /* send / recv ring in a group, then a barrier */
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    for (int i = 0; i < 300; i++)
        h[i] = (float)(rank + i);
    put(send, h, 300 * sizeof(float));
    HCCL(HcclGroupStart());
    HCCL(HcclSend(send, 300, HCCL_DATA_TYPE_FP32, (uint32_t)next, comm, stream));
    HCCL(HcclRecv(recv, 300, HCCL_DATA_TYPE_FP32, (uint32_t)prev, comm, stream));
    HCCL(HcclGroupEnd());
    HCCL(HcclBarrier(comm, stream));
    aclrtSynchronizeStream(stream);
    get(o, recv, 300 * sizeof(float));
    CHECK(o[299] == (float)(prev + 299), "ring [299] = %g", o[299]);

    /* int16: every op but PROD (cann-hccl HcomCheckReduceDataType, 910B / 910_93) */
    int16_t *h16 = (int16_t *)h, *o16 = (int16_t *)o;
    for (int i = 0; i < 7; i++)
        h16[i] = (int16_t)((rank + 1) * (i - 3) * 1000);
    put(send, h16, 7 * sizeof(int16_t));
    HCCL(HcclAllReduce(send, recv, 7, HCCL_DATA_TYPE_INT16, HCCL_REDUCE_SUM, comm, stream));
    aclrtSynchronizeStream(stream);
    get(o16, recv, 7 * sizeof(int16_t));
    CHECK(o16[0] == (int16_t)(-3000 * nranks * (nranks + 1) / 2) && o16[6] == (int16_t)(3000 * nranks * (nranks + 1) / 2),
          "int16 sum [0] = %d [6] = %d", o16[0], o16[6]);
    HCCL(HcclAllReduce(send, recv, 7, HCCL_DATA_TYPE_INT16, HCCL_REDUCE_MIN, comm, stream));
    aclrtSynchronizeStream(stream);
    get(o16, recv, 7 * sizeof(int16_t));
    CHECK(o16[0] == (int16_t)(-3000 * nranks) && o16[6] == 3000, "int16 min [0] = %d [6] = %d", o16[0], o16[6]);
    CHECK(HcclAllReduce(send, recv, 7, HCCL_DATA_TYPE_INT16, HCCL_REDUCE_PROD, comm, stream) == HCCL_E_NOT_SUPPORT,
          "int16 prod");
    /* uint32 max: unsigned order */
    uint32_t *hu = (uint32_t *)h, *ou = (uint32_t *)o;
    hu[0] = rank == 0 ? 0x80000000u : (uint32_t)rank;
    hu[1] = rank == 0 ? 0xFFFFFFFFu : 5u;
    put(send, hu, 2 * sizeof(uint32_t));
    HCCL(HcclAllReduce(send, recv, 2, HCCL_DATA_TYPE_UINT32, HCCL_REDUCE_MAX, comm, stream));
    aclrtSynchronizeStream(stream);
    get(ou, recv, 2 * sizeof(uint32_t));
    CHECK(ou[0] == 0x80000000u && ou[1] == 0xFFFFFFFFu, "uint32 max %x %x", ou[0], ou[1]);

    /* errors found when called: CANN's codes */
    CHECK(HCCL_DATA_TYPE_RESERVED == 255 && HCCL_REDUCE_RESERVED == 255 && HCCL_DATA_TYPE_INT128 == 12 &&
          HCCL_DATA_TYPE_FP8E8M0 == 17, "enum values");
    CHECK(HcclAllReduce(send, recv, 4, HCCL_DATA_TYPE_RESERVED, HCCL_REDUCE_SUM, comm, stream) ==
          HCCL_E_NOT_SUPPORT, "type");
    CHECK(HcclAllReduce(send, recv, 4, (HcclDataType)13, HCCL_REDUCE_SUM, comm, stream) == HCCL_E_NOT_SUPPORT,
          "type 13");
    CHECK(HcclAllGather(send, recv, 4, HCCL_DATA_TYPE_INT128, comm, stream) == HCCL_E_NOT_SUPPORT, "int128");
    CHECK(HcclAllReduce(send, recv, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_RESERVED, comm, stream) ==
          HCCL_E_NOT_SUPPORT, "op");
    CHECK(HcclAllReduce(send, recv, 4, HCCL_DATA_TYPE_FP32, (HcclReduceOp)4, comm, stream) == HCCL_E_NOT_SUPPORT,
          "op 4");
    /* count 0 succeeds before any check, even of the communicator */
    CHECK(HcclAllReduce(NULL, NULL, 0, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, NULL, stream) == HCCL_SUCCESS,
          "count 0");
    CHECK(HcclBroadcast(NULL, 0, HCCL_DATA_TYPE_RESERVED, 0, NULL, NULL) == HCCL_SUCCESS, "count 0 broadcast");
    CHECK(HcclCommDestroy(NULL) == HCCL_SUCCESS, "destroy NULL");
    CHECK(HcclBroadcast(send, 4, HCCL_DATA_TYPE_FP32, (uint32_t)nranks, comm, stream) == HCCL_E_PARA, "root");
    CHECK(HcclAllReduce(NULL, recv, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream) == HCCL_E_PTR, "NULL");
    CHECK(HcclAllReduce(send, recv, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, NULL, stream) == HCCL_E_PTR,
          "NULL comm");
    CHECK(strcmp(HcclGetErrorString(HCCL_E_PARA), "HCCL_E_PARA") == 0, "error string");
    CHECK(sizeof(HcclRootInfo) == 4108, "root info size");
    HcclResult async = HCCL_E_INTERNAL;
    HCCL(HcclGetCommAsyncError(comm, &async));
    CHECK(async == HCCL_SUCCESS, "async error %d", (int)async);

    HCCL(HcclCommDestroy(comm));
    aclrtDestroyStream(stream);
    aclrtFree(send);
    aclrtFree(recv);
    free(h);
    free(o);
    if (!failures)
        printf("hccl ok rank %d\n", rank);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    HcclRootInfo root_info;
    if (HcclGetRootInfo(&root_info) != HCCL_SUCCESS)
        return 1;
    return run_ranks(nranks, run, &root_info) ? 1 : 0;
}
