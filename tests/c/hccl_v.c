/*
 * HCCL calls beyond the basic collectives, as torch_npu issues them: a communicator made
 * from a rank table file (HcclCommInitClusterInfo), HcclAlltoAllV, HcclAllGatherV,
 * HcclReduceScatterV and HcclBatchSendRecv, and the NULL stream CANN refuses. One
 * process per rank (fork); built against anychip's hccl/hccl.h and acl/acl.h with
 * -Werror=implicit-function-declaration by tests/collectives/test_native_ccl_c.py.
 * Usage: hccl_v NRANKS (2..4). Prints "hccl v ok rank R" per rank, exits 0 when exact.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "acl/acl.h"
#include "hccl/hccl.h"

#define RANKS_MALLOC(p, n) aclrtMalloc(p, n, ACL_MEM_MALLOC_HUGE_FIRST)
#include "ranks.h"

#define HCCL(call) REQUIRE(call, HCCL_SUCCESS, HcclGetErrorString)

static void put(void *dev, const void *host, size_t n) { aclrtMemcpy(dev, n, host, n, ACL_MEMCPY_HOST_TO_DEVICE); }
static void get(void *host, const void *dev, size_t n) { aclrtMemcpy(host, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST); }

/* rank r sends (r + j) % 3 + 1 elements to rank j */
static uint64_t a2a_count(int from, int to) { return (uint64_t)((from + to) % 3 + 1); }

static void all_to_all_v(HcclComm comm, aclrtStream stream, int n, int grouped)
{
    uint64_t sc[4], sd[4], rc[4], rd[4], s = 0, r = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = a2a_count(rank, j), sd[j] = s, s += sc[j] + 1;   /* one element of gap after each block */
        rc[j] = a2a_count(j, rank), rd[j] = r, r += rc[j] + 2;
    }
    int32_t hs[64], hr[64];
    for (int j = 0; j < n; j++)
        for (uint64_t k = 0; k < sc[j]; k++)
            hs[sd[j] + k] = rank * 100 + j * 10 + (int)k;
    for (int i = 0; i < 64; i++)
        hr[i] = -1;
    int32_t *send = dev_alloc(sizeof hs), *recv = dev_alloc(sizeof hr);
    put(send, hs, sizeof hs);
    put(recv, hr, sizeof hr);
    if (grouped)       /* inside a group the op is issued by the group's end */
        HCCL(HcclGroupStart());
    HCCL(HcclAlltoAllV(send, sc, sd, HCCL_DATA_TYPE_INT32, recv, rc, rd, HCCL_DATA_TYPE_INT32, comm, stream));
    if (grouped)
        HCCL(HcclGroupEnd());
    CHECK(aclrtSynchronizeStream(stream) == ACL_SUCCESS, "sync");
    get(hr, recv, sizeof hr);
    for (int j = 0; j < n; j++) {
        for (uint64_t k = 0; k < rc[j]; k++)
            CHECK(hr[rd[j] + k] == j * 100 + rank * 10 + (int)k, "alltoallv from %d [%d] = %d", j, (int)k,
                  hr[rd[j] + k]);
        CHECK(hr[rd[j] + rc[j]] == -1 && hr[rd[j] + rc[j] + 1] == -1, "alltoallv wrote into the gap after %d", j);
    }
    /* the vendor's codes */
    CHECK(HcclAlltoAllV(send, NULL, sd, HCCL_DATA_TYPE_INT32, recv, rc, rd, HCCL_DATA_TYPE_INT32, comm, stream) ==
          HCCL_E_PTR, "NULL sendCounts");
    CHECK(HcclAlltoAllV(send, sc, sd, HCCL_DATA_TYPE_INT32, recv, rc, rd, HCCL_DATA_TYPE_INT32, comm, NULL) ==
          HCCL_E_PTR, "NULL stream");
    CHECK(HcclAlltoAllV(send, sc, sd, HCCL_DATA_TYPE_INT128, recv, rc, rd, HCCL_DATA_TYPE_INT32, comm, stream) ==
          HCCL_E_NOT_SUPPORT, "int128");
    aclrtFree(send);
    aclrtFree(recv);
}

static void all_gather_v(HcclComm comm, aclrtStream stream, int n, uint64_t scale)
{
    /* rank i contributes (i + 1) * scale floats; blocks land 3 elements apart */
    uint64_t rc[4], rd[4], total = 0;
    for (int i = 0; i < n; i++)
        rc[i] = (uint64_t)(i + 1) * scale, rd[i] = total, total += rc[i] + 3;
    float *hs = malloc(rc[rank] * sizeof(float)), *hr = malloc(total * sizeof(float));
    for (uint64_t k = 0; k < rc[rank]; k++)
        hs[k] = (float)((rank + 1) * 1000 + (int)(k % 997));
    for (uint64_t k = 0; k < total; k++)
        hr[k] = -1.0f;
    float *send = dev_alloc(rc[rank] * sizeof(float)), *recv = dev_alloc(total * sizeof(float));
    put(send, hs, rc[rank] * sizeof(float));
    put(recv, hr, total * sizeof(float));
    HCCL(HcclAllGatherV(send, rc[rank], recv, rc, rd, HCCL_DATA_TYPE_FP32, comm, stream));
    CHECK(aclrtSynchronizeStream(stream) == ACL_SUCCESS, "sync");
    get(hr, recv, total * sizeof(float));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        for (uint64_t k = 0; k < rc[i]; k++)
            bad += hr[rd[i] + k] != (float)((i + 1) * 1000 + (int)(k % 997));
        bad += hr[rd[i] + rc[i]] != -1.0f;
    }
    CHECK(bad == 0, "allgatherv (%llu floats per block unit): %d elements wrong", (unsigned long long)scale, bad);
    CHECK(HcclAllGatherV(send, rc[rank] + 1, recv, rc, rd, HCCL_DATA_TYPE_FP32, comm, stream) == HCCL_E_PARA,
          "sendCount that is not recvCounts[rank]");
    CHECK(HcclAllGatherV(send, rc[rank], recv, rc, NULL, HCCL_DATA_TYPE_FP32, comm, stream) == HCCL_E_PTR,
          "NULL recvDispls");
    aclrtFree(send);
    aclrtFree(recv);
    free(hs);
    free(hr);
}

static void reduce_scatter_v(HcclComm comm, aclrtStream stream, int n)
{
    /* block i (i + 2 elements) of every rank is reduced into rank i */
    uint64_t sc[4], sd[4], total = 0;
    for (int i = 0; i < n; i++)
        sc[i] = (uint64_t)(i + 2), sd[i] = total, total += sc[i] + 1;
    int32_t hs[32], hr[8];
    for (int i = 0; i < n; i++)
        for (uint64_t k = 0; k < sc[i]; k++)
            hs[sd[i] + k] = (rank + 1) * (int)(k + 1) + i;
    int32_t *send = dev_alloc(sizeof hs), *recv = dev_alloc(sizeof hr);
    put(send, hs, sizeof hs);
    for (int op = 0; op < 2; op++) {
        HcclReduceOp rop = op ? HCCL_REDUCE_MAX : HCCL_REDUCE_SUM;
        for (int k = 0; k < 8; k++)
            hr[k] = -7;
        put(recv, hr, sizeof hr);
        HCCL(HcclReduceScatterV(send, sc, sd, recv, sc[rank], HCCL_DATA_TYPE_INT32, rop, comm, stream));
        CHECK(aclrtSynchronizeStream(stream) == ACL_SUCCESS, "sync");
        get(hr, recv, sizeof hr);
        for (uint64_t k = 0; k < sc[rank]; k++) {
            int want = op ? n * (int)(k + 1) + rank : (int)(k + 1) * n * (n + 1) / 2 + n * rank;
            CHECK(hr[k] == want, "reducescatterv %s [%d] = %d, want %d", op ? "max" : "sum", (int)k, hr[k], want);
        }
        CHECK(hr[sc[rank]] == -7, "reducescatterv wrote past its block");
    }
    CHECK(HcclReduceScatterV(send, sc, sd, recv, sc[rank] + 1, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, comm, stream) ==
          HCCL_E_PARA, "recvCount that is not sendCounts[rank]");
    CHECK(HcclReduceScatterV(send, sc, sd, recv, sc[rank], HCCL_DATA_TYPE_INT16, HCCL_REDUCE_PROD, comm, stream) ==
          HCCL_E_NOT_SUPPORT, "int16 prod");
    aclrtFree(send);
    aclrtFree(recv);
}

static void batch_send_recv(HcclComm comm, aclrtStream stream, int n)
{
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    float hs[300], hr[300];
    for (int k = 0; k < 300; k++)
        hs[k] = (float)(rank * 1000 + k), hr[k] = 0;
    float *send = dev_alloc(sizeof hs), *recv = dev_alloc(sizeof hr);
    put(send, hs, sizeof hs);
    put(recv, hr, sizeof hr);
    HcclSendRecvItem items[2] = {
        {.sendRecvType = HCCL_RECV, .buf = recv, .count = 300, .dataType = HCCL_DATA_TYPE_FP32,
         .remoteRank = (uint32_t)prev},
        {.sendRecvType = HCCL_SEND, .buf = send, .count = 300, .dataType = HCCL_DATA_TYPE_FP32,
         .remoteRank = (uint32_t)next},
    };
    HCCL(HcclBatchSendRecv(items, 2, comm, stream));
    CHECK(aclrtSynchronizeStream(stream) == ACL_SUCCESS, "sync");
    get(hr, recv, sizeof hr);
    int bad = 0;
    for (int k = 0; k < 300; k++)
        bad += hr[k] != (float)(prev * 1000 + k);
    CHECK(bad == 0, "batch send/recv: %d of 300 wrong", bad);
    items[0].sendRecvType = HCCL_SEND_RECV_RESERVED;
    CHECK(HcclBatchSendRecv(items, 2, comm, stream) == HCCL_E_PARA, "reserved item type");
    items[0].sendRecvType = HCCL_RECV;
    CHECK(HcclBatchSendRecv(NULL, 2, comm, stream) == HCCL_E_PTR, "NULL items");
    CHECK(HcclBatchSendRecv(items, 2, comm, NULL) == HCCL_E_PTR, "NULL stream");
    aclrtFree(send);
    aclrtFree(recv);
}

static int run(int nranks, void *arg)
{
    const char *table = ((const char *const *)arg)[0], *bad_table = ((const char *const *)arg)[1];
    CHECK(aclInit(NULL) == ACL_SUCCESS, "aclInit");
    HcclComm comm = NULL;
    /* a rank must run on the device its entry names */
    CHECK(aclrtSetDevice((rank + 1) % nranks) == ACL_SUCCESS, "set device");
    CHECK(HcclCommInitClusterInfo(table, (uint32_t)rank, &comm) == HCCL_E_PARA, "init on another device");
    CHECK(aclrtSetDevice(rank) == ACL_SUCCESS, "set device");
    CHECK(HcclCommInitClusterInfo("/nonexistent/rank_table.json", (uint32_t)rank, &comm) ==
          HCCL_E_OPEN_FILE_FAILURE, "missing file");
    CHECK(HcclCommInitClusterInfo(bad_table, (uint32_t)rank, &comm) == HCCL_E_PARA, "rank table with a rank twice");
    CHECK(HcclCommInitClusterInfo(table, (uint32_t)nranks, &comm) == HCCL_E_PARA, "rank outside the table");
    CHECK(HcclCommInitClusterInfo(NULL, (uint32_t)rank, &comm) == HCCL_E_PTR, "NULL file");
    HCCL(HcclCommInitClusterInfo(table, (uint32_t)rank, &comm));
    uint32_t size = 0, id = 99;
    HCCL(HcclGetRankSize(comm, &size));
    HCCL(HcclGetRankId(comm, &id));
    CHECK(size == (uint32_t)nranks && id == (uint32_t)rank, "size %u id %u", size, id);

    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream) == ACL_SUCCESS, "stream");
    /* HCCL has no default stream */
    int32_t *buf = dev_alloc(64);
    CHECK(HcclAllReduce(buf, buf, 4, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, comm, NULL) == HCCL_E_PTR, "NULL stream");
    CHECK(HcclBarrier(comm, NULL) == HCCL_E_PTR, "NULL stream barrier");
    CHECK(HcclAllReduce(buf, buf, 0, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, comm, NULL) == HCCL_SUCCESS,
          "count 0 returns before any check");
    aclrtFree(buf);

    all_to_all_v(comm, stream, nranks, 0);
    all_gather_v(comm, stream, nranks, 3);
    all_gather_v(comm, stream, nranks, 20000);   /* 80 KB blocks: the zero-copy path */
    reduce_scatter_v(comm, stream, nranks);
    batch_send_recv(comm, stream, nranks);
    all_to_all_v(comm, stream, nranks, 1);

    HcclResult async = HCCL_E_INTERNAL;
    HCCL(HcclGetCommAsyncError(comm, &async));
    CHECK(async == HCCL_SUCCESS, "async error %d", (int)async);
    HCCL(HcclCommDestroy(comm));
    CHECK(aclrtDestroyStream(stream) == ACL_SUCCESS, "destroy stream");
    if (!failures)
        printf("hccl v ok rank %d\n", rank);
    return failures ? 1 : 0;
}

/* CANN's rank table (version 1.0): one server, device_id d has rank_id d */
static int write_table(char *path, int nranks, int twice)
{
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f)
        return -1;
    fprintf(f, "{\n  \"status\": \"completed\",\n  \"version\": \"1.0\",\n  \"server_count\": \"1\",\n"
               "  \"server_list\": [\n    {\n      \"server_id\": \"10.0.0.1\",\n      \"device\": [\n");
    for (int r = 0; r < nranks; r++)
        fprintf(f, "        {\"device_id\": \"%d\", \"device_ip\": \"192.168.100.%d\", \"rank_id\": \"%d\"}%s\n", r,
                r + 1, twice && r == nranks - 1 ? 0 : r, r + 1 < nranks ? "," : "");
    fprintf(f, "      ]\n    }\n  ]\n}\n");
    return fclose(f);
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    if (nranks < 2 || nranks > 4)
        return 1;
    char table[] = "/tmp/anychip-hccl-table-XXXXXX", bad[] = "/tmp/anychip-hccl-table-XXXXXX";
    if (write_table(table, nranks, 0) || write_table(bad, nranks, 1))
        return 1;
    const char *tables[2] = {table, bad};
    int failed = run_ranks(nranks, run, tables);
    unlink(table);
    unlink(bad);
    return failed ? 1 : 0;
}
