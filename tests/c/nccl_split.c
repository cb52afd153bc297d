/*
 * ncclCommInitRankConfig (a config from NCCL_CONFIG_INITIALIZER) and ncclCommSplit, as
 * frameworks that build sub-groups call them: one process per rank (fork), built against
 * anychip's rccl/rccl.h and hip/hip_runtime_api.h with -Werror=implicit-function-declaration
 * by tests/collectives/test_native_ccl_c.py. Usage: nccl_split NRANKS (2..8): prints
 * "nccl split ok rank R" per rank; nccl_split g: one thread splits the communicators of
 * two devices in one group, prints "nccl split group ok". Exits 0 when every result is exact.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hip/hip_runtime_api.h"
#include "rccl/rccl.h"
#include "ranks.h"

#define NCCL(call)                                                                                         \
    do {                                                                                                   \
        ncclResult_t r_ = (call);                                                                          \
        if (r_ != ncclSuccess) {                                                                           \
            fprintf(stderr, "rank %d line %d: %s -> %s\n", rank, __LINE__, #call, ncclGetErrorString(r_)); \
            exit(2);                                                                                       \
        }                                                                                                  \
    } while (0)

/* every rank of `comm` adds rank + 1 (its rank in the parent); the sum must be `want` */
static void all_reduce_ranks(ncclComm_t comm, hipStream_t stream, int want)
{
    int *d = NULL, v = rank + 1;
    CHECK(hipMalloc((void **)&d, sizeof(int)) == hipSuccess, "malloc");
    CHECK(hipMemcpy(d, &v, sizeof v, hipMemcpyHostToDevice) == hipSuccess, "copy");
    NCCL(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm, stream));
    CHECK(hipStreamSynchronize(stream) == hipSuccess, "sync");
    CHECK(hipMemcpy(&v, d, sizeof v, hipMemcpyDeviceToHost) == hipSuccess, "copy back");
    CHECK(v == want, "all-reduce gave %d, want %d", v, want);
    hipFree(d);
}

static int run(int nranks, void *arg)
{
    ncclUniqueId id = *(const ncclUniqueId *)arg;
    CHECK(hipSetDevice(rank % 4) == hipSuccess, "set device");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    CHECK(config.magic == 0xcafebeef && config.blocking == NCCL_CONFIG_UNDEF_INT && config.netName == NULL,
          "initializer");
    ncclConfig_t raw = {0};
    ncclComm_t world = NULL;
    CHECK(ncclCommInitRankConfig(&world, nranks, id, rank, &raw) == ncclInvalidArgument, "uninitialized config");
    config.blocking = 7;
    CHECK(ncclCommInitRankConfig(&world, nranks, id, rank, &config) == ncclInvalidArgument, "blocking 7");
    config.blocking = 1;
    NCCL(ncclCommInitRankConfig(&world, nranks, id, rank, &config));
    hipStream_t stream;
    CHECK(hipStreamCreate(&stream) == hipSuccess, "stream");
    all_reduce_ranks(world, stream, nranks * (nranks + 1) / 2);

    /* even / odd ranks, each ranked in reverse (key = -rank); with more than 2 ranks the
     * last one takes part without a color */
    int nocolor = nranks > 2 && rank == nranks - 1;
    int color = nocolor ? NCCL_SPLIT_NOCOLOR : rank % 2;
    ncclComm_t half = (ncclComm_t)&failures;          /* overwritten: NULL for no color */
    NCCL(ncclCommSplit(world, color, -rank, &half, NULL));
    if (nocolor) {
        CHECK(half == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator");
    } else {
        int members = 0, above = 0, want = 0;
        for (int r = 0; r < nranks; r++)
            if (r % 2 == color && !(nranks > 2 && r == nranks - 1)) {
                members++;
                want += r + 1;
                above += r > rank;
            }
        int n = -1, me = -1, dev = -1;
        NCCL(ncclCommCount(half, &n));
        NCCL(ncclCommUserRank(half, &me));
        NCCL(ncclCommCuDevice(half, &dev));
        CHECK(n == members && me == above && dev == rank % 4, "split: %d ranks, rank %d, device %d (want %d, %d, %d)",
              n, me, dev, members, above, rank % 4);
        all_reduce_ranks(half, stream, want);
        NCCL(ncclCommDestroy(half));
    }
    /* a second split of the same parent, everyone in one color, config given */
    ncclComm_t again = NULL;
    NCCL(ncclCommSplit(world, 0, 0, &again, &config));
    int n = -1, me = -1;
    NCCL(ncclCommCount(again, &n));
    NCCL(ncclCommUserRank(again, &me));
    CHECK(n == nranks && me == rank, "split of everyone: %d ranks, rank %d", n, me);
    all_reduce_ranks(again, stream, nranks * (nranks + 1) / 2);
    NCCL(ncclCommDestroy(again));
    CHECK(ncclCommSplit(world, -5, 0, &again, NULL) == ncclInvalidArgument, "color -5");
    CHECK(ncclCommSplit(world, 0, 0, NULL, NULL) == ncclInvalidArgument, "NULL newcomm");

    NCCL(ncclCommDestroy(world));
    CHECK(hipStreamDestroy(stream) == hipSuccess, "destroy stream");
    if (!failures)
        printf("nccl split ok rank %d\n", rank);
    return failures ? 1 : 0;
}

/* One thread, two devices (ncclCommInitAll), both communicators split inside one group:
 * the splits run at the group's end, together. */
static int split_in_group(void)
{
    ncclComm_t comms[2] = {NULL, NULL}, subs[2] = {NULL, NULL};
    int devs[2] = {0, 1};
    NCCL(ncclCommInitAll(comms, 2, devs));
    NCCL(ncclGroupStart());
    for (int i = 0; i < 2; i++)
        NCCL(ncclCommSplit(comms[i], 0, -i, &subs[i], NULL));   /* key -i: the ranks swap */
    CHECK(subs[0] == NULL && subs[1] == NULL, "a deferred split wrote its handle before the group's end");
    NCCL(ncclGroupEnd());
    int *d[2];
    hipStream_t s[2];
    for (int i = 0; i < 2; i++) {
        int n = -1, me = -1, v = 10 * (i + 1);
        NCCL(ncclCommCount(subs[i], &n));
        NCCL(ncclCommUserRank(subs[i], &me));
        CHECK(n == 2 && me == 1 - i, "device %d: %d ranks, rank %d", i, n, me);
        CHECK(hipSetDevice(i) == hipSuccess, "set device");
        CHECK(hipStreamCreate(&s[i]) == hipSuccess, "stream");
        CHECK(hipMalloc((void **)&d[i], sizeof(int)) == hipSuccess, "malloc");
        CHECK(hipMemcpy(d[i], &v, sizeof v, hipMemcpyHostToDevice) == hipSuccess, "copy");
    }
    NCCL(ncclGroupStart());
    for (int i = 0; i < 2; i++)
        NCCL(ncclAllReduce(d[i], d[i], 1, ncclInt32, ncclSum, subs[i], s[i]));
    NCCL(ncclGroupEnd());
    for (int i = 0; i < 2; i++) {
        int v = 0;
        CHECK(hipSetDevice(i) == hipSuccess, "set device");
        CHECK(hipStreamSynchronize(s[i]) == hipSuccess, "sync");
        CHECK(hipMemcpy(&v, d[i], sizeof v, hipMemcpyDeviceToHost) == hipSuccess, "copy back");
        CHECK(v == 30, "device %d: all-reduce gave %d, want 30", i, v);
        hipFree(d[i]);
        CHECK(hipStreamDestroy(s[i]) == hipSuccess, "destroy stream");
        NCCL(ncclCommDestroy(subs[i]));
        NCCL(ncclCommDestroy(comms[i]));
    }
    if (!failures)
        printf("nccl split group ok\n");
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && argv[1][0] == 'g')
        return split_in_group();
    int nranks = argc > 1 ? atoi(argv[1]) : 2;
    if (nranks < 2 || nranks > 8)
        return 1;
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return 1;
    return run_ranks(nranks, run, &id) ? 1 : 0;
}
