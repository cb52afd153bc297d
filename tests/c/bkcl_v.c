/*
 * bkcl_all_to_all_v as Paddle's AllToAllUnequalSplit calls it: the counts and offsets
 * (elements, one size_t per rank) in device memory, here written by an asynchronous copy
 * queued on the same stream just before the call. One process per rank (fork); built
 * against anychip's bkcl/bkcl.h and xpu/runtime.h with -Werror=implicit-function-declaration
 * by tests/collectives/test_native_ccl_c.py. Usage: bkcl_v NRANKS (2..4). Prints "bkcl v ok rank R".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bkcl/bkcl.h"
#include "xpu/runtime.h"

#define RANKS_MALLOC(p, n) xpu_malloc(p, n, XPU_MEM_HBM)
#include "ranks.h"

#define BKCL(call) REQUIRE(call, BKCL_SUCCESS, NO_TEXT)

/* rank r sends (2 r + j) % 5 elements to rank j (0 included: some pairs move nothing) */
static size_t count_of(int from, int to) { return (size_t)((2 * from + to) % 5); }

static int run(int nranks, void *arg)
{
    const BKCLUniqueId *uid = arg;
    CHECK(xpu_set_device(rank) == 0, "set device");
    BKCLContext_t ctx;
    BKCL(bkcl_init_rank(&ctx, rank, nranks, uid));
    XPUStream stream;
    CHECK(xpu_stream_create(&stream) == 0, "stream");

    size_t meta[16], s = 0, r = 0;     /* send counts, send offsets, recv counts, recv offsets */
    for (int j = 0; j < nranks; j++) {
        meta[j] = count_of(rank, j), meta[nranks + j] = s, s += meta[j];
        meta[2 * nranks + j] = count_of(j, rank), meta[3 * nranks + j] = r, r += meta[2 * nranks + j] + 1;
    }
    int64_t hs[32], hr[32];
    for (int j = 0; j < nranks; j++)
        for (size_t k = 0; k < meta[j]; k++)
            hs[meta[nranks + j] + k] = rank * 1000 + j * 10 + (int64_t)k;
    for (int i = 0; i < 32; i++)
        hr[i] = -1;
    int64_t *send = dev_alloc(sizeof hs), *recv = dev_alloc(sizeof hr);
    size_t *dmeta = dev_alloc(sizeof meta);
    CHECK(xpu_memcpy(send, hs, sizeof hs, XPU_HOST_TO_DEVICE) == 0, "copy");
    CHECK(xpu_memcpy(recv, hr, sizeof hr, XPU_HOST_TO_DEVICE) == 0, "copy");
    /* the counts reach the device through the stream itself, right before the op */
    CHECK(xpu_memcpy_async(dmeta, meta, 4 * (size_t)nranks * sizeof(size_t), XPU_HOST_TO_DEVICE, stream) == 0,
          "async copy");
    BKCL(bkcl_all_to_all_v(ctx, send, dmeta, dmeta + nranks, BKCL_INT64, recv, dmeta + 2 * nranks,
                           dmeta + 3 * nranks, BKCL_INT64, stream));
    CHECK(xpu_wait(stream) == 0, "wait");
    CHECK(xpu_memcpy(hr, recv, sizeof hr, XPU_DEVICE_TO_HOST) == 0, "copy back");
    for (int j = 0; j < nranks; j++) {
        size_t c = meta[2 * nranks + j], off = meta[3 * nranks + j];
        for (size_t k = 0; k < c; k++)
            CHECK(hr[off + k] == j * 1000 + rank * 10 + (int64_t)k, "from %d [%zu] = %lld", j, k,
                  (long long)hr[off + k]);
        CHECK(hr[off + c] == -1, "wrote into the gap after the block from %d", j);
    }
    /* the counts are read on the device: host arrays are refused */
    CHECK(bkcl_all_to_all_v(ctx, send, meta, meta + nranks, BKCL_INT64, recv, meta + 2 * nranks, meta + 3 * nranks,
                            BKCL_INT64, stream) == BKCL_INVALID_ARGUMENT, "host count arrays");
    CHECK(bkcl_all_to_all_v(ctx, send, NULL, dmeta + nranks, BKCL_INT64, recv, dmeta + 2 * nranks,
                            dmeta + 3 * nranks, BKCL_INT64, stream) == BKCL_INVALID_ARGUMENT, "NULL counts");
    CHECK(bkcl_all_to_all_v(ctx, send, dmeta, dmeta + nranks, (BKCLDataType)42, recv, dmeta + 2 * nranks,
                            dmeta + 3 * nranks, BKCL_INT64, stream) == BKCL_INVALID_ARGUMENT, "bad type");
    BKCLResult_t async = BKCL_INTERNAL_ERROR;
    BKCL(anychip_sim_bkcl_async_error(ctx, &async));
    CHECK(async == BKCL_SUCCESS, "async error %d", (int)async);
    ranks_barrier();                   /* no rank leaves while a peer is still in the op */
    BKCL(bkcl_destroy_context(ctx));
    xpu_stream_destroy(stream);
    xpu_free(send);
    xpu_free(recv);
    xpu_free(dmeta);
    if (!failures)
        printf("bkcl v ok rank %d\n", rank);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    if (nranks < 2 || nranks > 4)
        return 1;
    BKCLUniqueId uid;
    if (bkcl_get_unique_id(&uid) != BKCL_SUCCESS)
        return 1;
    return run_ranks(nranks, run, &uid) ? 1 : 0;
}
