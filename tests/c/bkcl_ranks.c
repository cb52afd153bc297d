/*
 * A multi-rank BKCL program written against bkcl/bkcl.h (Paddle's call-site argument
 * orders) and the XPU runtime's C API: one process per rank (fork), the unique id made
 * before the fork. Linked against libkunlun_sim by tests/collectives/test_native_ccl_c.py.
 * Usage: bkcl_ranks NRANKS. Prints "bkcl ok rank R" per rank, exits 0 when exact.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bkcl/bkcl.h"

typedef enum { XPU_DEVICE_TO_HOST = 0, XPU_HOST_TO_DEVICE = 1, XPU_DEVICE_TO_DEVICE = 2 } XPUMemcpyKind;
typedef enum { XPU_MEM_HBM = 0 } XPUMemoryKind;
int xpu_set_device(int devid);
int xpu_malloc(void **pdevptr, uint64_t sz, XPUMemoryKind kind);
int xpu_free(void *devptr);
int xpu_memcpy(void *dst, const void *src, uint64_t sz, XPUMemcpyKind kind);
int xpu_stream_create(XPUStream *pstream);
int xpu_stream_destroy(XPUStream stream);
int xpu_wait(XPUStream stream);

#define RANKS_MALLOC(p, n) xpu_malloc(p, n, XPU_MEM_HBM)
#include "ranks.h"

#define BKCL(call) REQUIRE(call, BKCL_SUCCESS, NO_TEXT)

static int run(int nranks, void *arg)
{
    const BKCLUniqueId *uid = arg;
    const size_t big = (1 << 15) + 1;
    xpu_set_device(rank % 4);
    BKCLContext_t ctx;
    BKCL(bkcl_init_rank(&ctx, rank, nranks, uid));
    int count = 0, me = -1;
    BKCL(bkcl_comm_count(ctx, &count));
    BKCL(bkcl_comm_user_rank(ctx, &me));
    CHECK(count == nranks && me == rank, "count %d rank %d", count, me);
    XPUStream stream;
    xpu_stream_create(&stream);
    double *h = malloc(big * nranks * sizeof(double)), *o = malloc(big * nranks * sizeof(double));
    double *send = dev_alloc(big * nranks * sizeof(double)), *recv = dev_alloc(big * nranks * sizeof(double));

    for (size_t i = 0; i < big; i++)
        h[i] = (double)rank + 0.5 * (double)i;
    xpu_memcpy(send, h, big * sizeof(double), XPU_HOST_TO_DEVICE);
    BKCL(bkcl_all_reduce(ctx, send, recv, big, BKCL_FLOAT64, BKCL_ADD, stream));
    xpu_wait(stream);
    xpu_memcpy(o, recv, big * sizeof(double), XPU_DEVICE_TO_HOST);
    CHECK(o[big - 1] == (double)(nranks * (nranks - 1) / 2) + 0.5 * (double)(big - 1) * nranks, "all-reduce");

    for (int i = 0; i < 10; i++)
        h[i] = rank == 1 % nranks ? (double)i : -1.0;
    xpu_memcpy(send, h, 10 * sizeof(double), XPU_HOST_TO_DEVICE);
    BKCL(bkcl_broadcast(ctx, send, recv, 10, BKCL_FLOAT64, 1 % nranks, stream));
    BKCL(bkcl_reduce(ctx, send, recv + 16, 10, BKCL_FLOAT64, BKCL_MIN, 0, stream));
    xpu_wait(stream);
    xpu_memcpy(o, recv, 26 * sizeof(double), XPU_DEVICE_TO_HOST);
    CHECK(o[9] == 9.0, "broadcast [9] = %g", o[9]);
    if (rank == 0)
        CHECK(o[16 + 9] == (nranks > 1 ? -1.0 : 9.0), "reduce min [9] = %g", o[16 + 9]);

    for (int i = 0; i < 4; i++)
        h[i] = rank * 4 + i;
    xpu_memcpy(send, h, 4 * sizeof(double), XPU_HOST_TO_DEVICE);
    BKCL(bkcl_all_gather(ctx, send, 4, recv, BKCL_FLOAT64, stream));   /* count before recv */
    xpu_wait(stream);
    xpu_memcpy(o, recv, 4 * nranks * sizeof(double), XPU_DEVICE_TO_HOST);
    CHECK(o[4 * nranks - 1] == (double)(4 * nranks - 1), "all-gather");
    BKCL(bkcl_reduce_scatter(ctx, recv, send, 4, BKCL_FLOAT64, BKCL_MAX, stream));
    xpu_wait(stream);
    xpu_memcpy(o, send, 4 * sizeof(double), XPU_DEVICE_TO_HOST);
    CHECK(o[3] == (double)(4 * rank + 3), "reduce-scatter max [3] = %g", o[3]);

    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    int32_t *h32 = (int32_t *)h, *o32 = (int32_t *)o;
    for (int i = 0; i < 7; i++)
        h32[i] = rank * 7 + i;
    xpu_memcpy(send, h32, 7 * sizeof(int32_t), XPU_HOST_TO_DEVICE);
    BKCL(bkcl_group_start());
    BKCL(bkcl_send(ctx, send, 7, next, BKCL_INT32, stream));           /* peer before type */
    BKCL(bkcl_recv(ctx, recv, 7, prev, BKCL_INT32, stream));
    BKCL(bkcl_group_end());
    xpu_wait(stream);
    xpu_memcpy(o32, recv, 7 * sizeof(int32_t), XPU_DEVICE_TO_HOST);
    CHECK(o32[6] == prev * 7 + 6, "ring [6] = %d", o32[6]);

    CHECK(bkcl_all_reduce(ctx, send, recv, 4, (BKCLDataType)99, BKCL_ADD, stream) == BKCL_INVALID_ARGUMENT, "type");
    CHECK(bkcl_all_reduce(ctx, send, recv, 4, BKCL_FLOAT, BKCL_NUM_OPS, stream) == BKCL_INVALID_ARGUMENT, "op");
    CHECK(bkcl_send(ctx, send, 4, nranks, BKCL_FLOAT, stream) == BKCL_INVALID_ARGUMENT, "peer");
    BKCLResult_t async = BKCL_INTERNAL_ERROR;
    BKCL(anychip_sim_bkcl_async_error(ctx, &async));
    CHECK(async == BKCL_SUCCESS, "async error %d", (int)async);

    BKCL(bkcl_destroy_context(ctx));
    xpu_stream_destroy(stream);
    xpu_free(send);
    xpu_free(recv);
    free(h);
    free(o);
    if (!failures)
        printf("bkcl ok rank %d\n", rank);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    BKCLUniqueId uid;
    if (bkcl_get_unique_id(&uid) != BKCL_SUCCESS)
        return 1;
    return run_ranks(nranks, run, &uid) ? 1 : 0;
}
