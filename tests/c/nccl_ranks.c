/*
 * A 2..8-rank RCCL program written against rccl/rccl.h and HIP's C API, as a user
 * program for a Hygon DCU (or any ROCm GPU) would be: one process per rank (fork), the
 * unique id made before the fork. Linked against libhygon_sim by tests/collectives/test_native_ccl_c.py.
 * Usage: nccl_ranks NRANKS. Prints "nccl ok rank R" per rank and exits 0 when every
 * rank's results are exact.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "anychip/sim.h"
#include "rccl/rccl.h"
#include "ranks.h"

typedef int hipError_t;
typedef enum { hipMemcpyHostToHost, hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice,
               hipMemcpyDefault } hipMemcpyKind;
hipError_t hipSetDevice(int deviceId);
hipError_t hipMalloc(void **ptr, size_t size);
hipError_t hipFree(void *ptr);
hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind);
hipError_t hipStreamCreate(hipStream_t *stream);
hipError_t hipStreamDestroy(hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);

static int release[2]; /* rank 0 -> the others: the abort is done */
static int ready[2];   /* the other ranks are done with the communicator's work: rank 0 may abort it */
#define NCCL(call)                                                                                        \
    do {                                                                                                  \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess) {                                                                          \
            fprintf(stderr, "rank %d line %d: %s -> %d (%s): %s\n", rank, __LINE__, #call, (int)r_,        \
                    ncclGetErrorString(r_), ncclGetLastError(NULL));                                      \
            exit(2);                                                                                      \
        }                                                                                                 \
    } while (0)

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    if (hipMalloc(&p, n) != 0) {
        fprintf(stderr, "hipMalloc(%zu) failed\n", n);
        exit(3);
    }
    return p;
}

static void put(void *dev, const void *host, size_t n) { hipMemcpy(dev, host, n, hipMemcpyHostToDevice); }
static void get(void *host, const void *dev, size_t n) { hipMemcpy(host, dev, n, hipMemcpyDeviceToHost); }

static int run(int rank, int nranks, ncclUniqueId id)
{
    const size_t big = (1 << 17) + 3;   /* > 64 KiB of floats: the zero-copy path */
    hipSetDevice(rank % 4);
    ncclComm_t comm;
    NCCL(ncclCommInitRank(&comm, nranks, id, rank));
    int count = -1, me = -1;
    NCCL(ncclCommCount(comm, &count));
    NCCL(ncclCommUserRank(comm, &me));
    CHECK(count == nranks && me == rank, "count %d rank %d", count, me);
    hipStream_t stream;
    hipStreamCreate(&stream);

    float *h = malloc(big * nranks * sizeof(float)), *o = malloc(big * nranks * sizeof(float));
    float *send = dev_alloc(big * nranks * sizeof(float)), *recv = dev_alloc(big * nranks * sizeof(float));

    /* all-reduce sum, small and large; avg; in place max */
    size_t sizes[] = {1, 1000, big};
    for (int s = 0; s < 3; s++) {
        size_t n = sizes[s];
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(rank + 1) * (float)(i % 1000);
        put(send, h, n * sizeof(float));
        NCCL(ncclAllReduce(send, recv, n, ncclFloat32, ncclSum, comm, stream));
        hipStreamSynchronize(stream);
        get(o, recv, n * sizeof(float));
        float k = (float)(nranks * (nranks + 1) / 2);
        for (size_t i = 0; i < n; i++)
            if (o[i] != k * (float)(i % 1000)) {
                CHECK(0, "all-reduce sum n=%zu [%zu] = %g, want %g", n, i, o[i], k * (float)(i % 1000));
                break;
            }
    }
    NCCL(ncclAllReduce(send, send, big, ncclFloat32, ncclMax, comm, stream));   /* in place */
    hipStreamSynchronize(stream);
    get(o, send, big * sizeof(float));
    CHECK(o[7] == (float)nranks * 7.0f, "in-place max [7] = %g", o[7]);

    int64_t *hi = (int64_t *)h, *oi = (int64_t *)o;
    for (int i = 0; i < 10; i++)
        hi[i] = rank * 10 + i;
    put(send, hi, 10 * sizeof(int64_t));
    NCCL(ncclAllReduce(send, recv, 10, ncclInt64, ncclAvg, comm, stream));
    hipStreamSynchronize(stream);
    get(oi, recv, 10 * sizeof(int64_t));
    CHECK(oi[3] == (int64_t)((10 * (nranks - 1) * nranks / 2 + 3 * nranks) / nranks), "avg int64 [3] = %lld",
          (long long)oi[3]);

    /* unsigned max / min and integer avg (rccl enqueue.cc: unsigned order, sum then divide) */
    uint64_t *hu = (uint64_t *)h, *ou = (uint64_t *)o;
    hu[0] = rank == 0 ? 0x8000000000000000ull : (uint64_t)rank;
    hu[1] = rank == 0 ? UINT64_MAX : 7u;
    put(send, hu, 2 * sizeof(uint64_t));
    NCCL(ncclAllReduce(send, recv, 2, ncclUint64, ncclMax, comm, stream));
    hipStreamSynchronize(stream);
    get(ou, recv, 2 * sizeof(uint64_t));
    CHECK(ou[0] == 0x8000000000000000ull && ou[1] == UINT64_MAX, "uint64 max %llx %llx", (unsigned long long)ou[0],
          (unsigned long long)ou[1]);
    NCCL(ncclAllReduce(send, recv, 2, ncclUint64, ncclMin, comm, stream));
    hipStreamSynchronize(stream);
    get(ou, recv, 2 * sizeof(uint64_t));
    CHECK(ou[0] == 1 && ou[1] == 7, "uint64 min %llu %llu", (unsigned long long)ou[0], (unsigned long long)ou[1]);
    uint32_t *hw = (uint32_t *)h, *ow = (uint32_t *)o;
    hw[0] = 0xF0000000u + (uint32_t)rank;
    hw[1] = 10u * (uint32_t)(rank + 1);
    put(send, hw, 2 * sizeof(uint32_t));
    NCCL(ncclAllReduce(send, recv, 2, ncclUint32, ncclMin, comm, stream));
    hipStreamSynchronize(stream);
    get(ow, recv, 2 * sizeof(uint32_t));
    CHECK(ow[0] == 0xF0000000u && ow[1] == 10u, "uint32 min %x %u", ow[0], ow[1]);
    hw[0] = 4u * (uint32_t)rank;
    put(send, hw, 2 * sizeof(uint32_t));
    NCCL(ncclAllReduce(send, recv, 2, ncclUint32, ncclAvg, comm, stream));
    hipStreamSynchronize(stream);
    get(ow, recv, 2 * sizeof(uint32_t));
    CHECK(ow[0] == 2u * (uint32_t)(nranks - 1) && ow[1] == 5u * (uint32_t)(nranks + 1),
          "uint32 avg %u %u", ow[0], ow[1]);

    /* broadcast from the last rank, reduce (prod) to rank 1 % nranks */
    int root = nranks - 1;
    for (int i = 0; i < 100; i++)
        h[i] = rank == root ? (float)(i * 3) : -1.0f;
    put(recv, h, 100 * sizeof(float));
    NCCL(ncclBroadcast(recv, recv, 100, ncclFloat32, root, comm, stream));
    hipStreamSynchronize(stream);
    get(o, recv, 100 * sizeof(float));
    CHECK(o[99] == 297.0f && o[0] == 0.0f, "broadcast [99] = %g", o[99]);
    int32_t *h32 = (int32_t *)h, *o32 = (int32_t *)o;
    for (int i = 0; i < 5; i++)
        h32[i] = rank + 2;
    put(send, h32, 5 * sizeof(int32_t));
    int rroot = 1 % nranks;
    NCCL(ncclReduce(send, rank == rroot ? recv : NULL, 5, ncclInt32, ncclProd, rroot, comm, stream));
    hipStreamSynchronize(stream);
    if (rank == rroot) {
        int32_t want = 1;
        for (int r = 0; r < nranks; r++)
            want *= r + 2;
        get(o32, recv, 5 * sizeof(int32_t));
        CHECK(o32[4] == want, "reduce prod = %d, want %d", o32[4], want);
    }

    /* all-gather, reduce-scatter (min), all-to-all of bytes */
    for (int i = 0; i < 64; i++)
        h[i] = (float)(rank * 100 + i);
    put(send, h, 64 * sizeof(float));
    NCCL(ncclAllGather(send, recv, 64, ncclFloat32, comm, stream));
    hipStreamSynchronize(stream);
    get(o, recv, 64 * nranks * sizeof(float));
    CHECK(o[64 * (nranks - 1) + 5] == (float)((nranks - 1) * 100 + 5), "all-gather");
    for (int i = 0; i < 8 * nranks; i++)
        h[i] = (float)(i + rank);
    put(send, h, 8 * nranks * sizeof(float));
    NCCL(ncclReduceScatter(send, recv, 8, ncclFloat32, ncclMin, comm, stream));
    hipStreamSynchronize(stream);
    get(o, recv, 8 * sizeof(float));
    CHECK(o[2] == (float)(8 * rank + 2), "reduce-scatter min [2] = %g", o[2]);
    uint8_t *hb = (uint8_t *)h, *ob = (uint8_t *)o;
    for (int i = 0; i < 3 * nranks; i++)
        hb[i] = (uint8_t)(rank * 16 + i / 3);
    put(send, hb, 3 * nranks);
    NCCL(ncclAllToAll(send, recv, 3, ncclUint8, comm, stream));
    hipStreamSynchronize(stream);
    get(ob, recv, 3 * nranks);
    CHECK(ob[3 * (nranks - 1) + 1] == (uint8_t)((nranks - 1) * 16 + rank), "all-to-all");

    /* a ring of send / recv in one group (would deadlock without group semantics) */
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    for (int i = 0; i < 1000; i++)
        h[i] = (float)(rank * 1000 + i);
    put(send, h, 1000 * sizeof(float));
    NCCL(ncclGroupStart());
    NCCL(ncclSend(send, 1000, ncclFloat32, next, comm, stream));
    NCCL(ncclRecv(recv, 1000, ncclFloat32, prev, comm, stream));
    NCCL(ncclGroupEnd());
    hipStreamSynchronize(stream);
    get(o, recv, 1000 * sizeof(float));
    CHECK(o[999] == (float)(prev * 1000 + 999), "ring recv [999] = %g", o[999]);

    /* ops of one communicator issued on two streams run in call order; a group may span streams */
    hipStream_t s2;
    hipStreamCreate(&s2);
    for (int i = 0; i < 1000; i++)
        h[i] = (float)(rank + 1);
    put(send, h, 1000 * sizeof(float));
    NCCL(ncclAllReduce(send, recv, 1000, ncclFloat32, ncclSum, comm, stream));
    NCCL(ncclAllReduce(recv, recv, 1000, ncclFloat32, ncclSum, comm, s2));
    hipStreamSynchronize(s2);
    get(o, recv, 1000 * sizeof(float));
    CHECK(o[500] == (float)(nranks * nranks * (nranks + 1) / 2), "two streams [500] = %g", o[500]);
    hipStreamSynchronize(stream);
    put(send, h, 1000 * sizeof(float));
    NCCL(ncclGroupStart());
    NCCL(ncclSend(send, 1000, ncclFloat32, next, comm, s2));
    NCCL(ncclRecv(recv, 1000, ncclFloat32, prev, comm, stream));
    NCCL(ncclGroupEnd());
    hipStreamSynchronize(stream);
    hipStreamSynchronize(s2);
    get(o, recv, 1000 * sizeof(float));
    CHECK(o[999] == (float)(prev + 1), "group on two streams [999] = %g", o[999]);
    hipStreamDestroy(s2);

    /* errors found when called: the vendor's codes */
    CHECK(ncclAllReduce(send, recv, 4, (ncclDataType_t)42, ncclSum, comm, stream) == ncclInvalidArgument, "type");
    CHECK(ncclAllReduce(send, recv, 4, ncclFloat32, (ncclRedOp_t)9, comm, stream) == ncclInvalidArgument, "op");
    CHECK(ncclBroadcast(send, recv, 4, ncclFloat32, nranks, comm, stream) == ncclInvalidArgument, "root");
    CHECK(ncclAllReduce(h, recv, 4, ncclFloat32, ncclSum, comm, stream) == ncclInvalidArgument, "host pointer");
    CHECK(ncclAllReduce(send, recv, 4, ncclFloat32, ncclSum, NULL, stream) == ncclInvalidArgument, "NULL comm");
    CHECK(ncclCommDestroy(NULL) == ncclSuccess && ncclCommAbort(NULL) == ncclSuccess, "NULL destroy / abort");
    CHECK(ncclAllReduce(NULL, recv, 4, ncclFloat32, ncclSum, comm, stream) == ncclInvalidArgument, "NULL send");
    CHECK(ncclAllReduce(send, recv, big * nranks + 1, ncclFloat32, ncclSum, comm, stream) == ncclInvalidArgument,
          "count past the allocation");
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "unbalanced group end");
    CHECK(strcmp(ncclGetErrorString(ncclInvalidArgument), "invalid argument (run with NCCL_DEBUG=WARN for details)")
          == 0, "error string");
    ncclResult_t async = ncclInternalError;
    NCCL(ncclCommGetAsyncError(comm, &async));
    CHECK(async == ncclSuccess, "async error %d", (int)async);

    /* ncclCommAbort returns without waiting for the communicator's work: rank 0's op is
     * queued behind a held stream (and no other rank joins it); once the stream runs it,
     * it fails at once instead of waiting for the peers. Rank 0 aborts only once the others
     * have finished the ops above (an abort while a peer is still in one fails that peer). */
    if (rank == 0) {
        char c;
        for (int r = 1; r < nranks; r++)
            CHECK(read(ready[0], &c, 1) == 1, "wait for the others' ops");
        CHECK(anychip_sim_stream_hold(stream) == 0, "hold");
        NCCL(ncclAllReduce(send, recv, 1000, ncclFloat32, ncclSum, comm, stream));
        NCCL(ncclCommAbort(comm));
        CHECK(anychip_sim_stream_release(stream) == 0, "release");
        CHECK(hipStreamSynchronize(stream) == 0, "stream after the abort");
        for (int r = 1; r < nranks; r++)
            CHECK(write(release[1], "x", 1) == 1, "release the others");
    } else {
        char c;
        CHECK(write(ready[1], "x", 1) == 1, "tell rank 0");
        CHECK(read(release[0], &c, 1) == 1, "wait for rank 0's abort");
        NCCL(ncclCommDestroy(comm));
        CHECK(ncclCommCount(comm, &count) == ncclInvalidArgument, "destroyed comm");
    }
    hipStreamDestroy(stream);
    hipFree(send);
    hipFree(recv);
    free(h);
    free(o);
    if (!failures)
        printf("nccl ok rank %d\n", rank);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    int version = 0;
    ncclGetVersion(&version);
    if (version != NCCL_VERSION_CODE) {
        fprintf(stderr, "version %d\n", version);
        return 1;
    }
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess || pipe(release) != 0 || pipe(ready) != 0)
        return 1;
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            int rc = run(r, nranks, id);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
    }
    int bad = 0, status;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            bad++;
    return bad ? 1 : 0;
}
