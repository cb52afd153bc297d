/*
 * The NCCL user guide's three examples, ported to HIP + RCCL as ROCm users write them
 * (cuda* -> hip*, nccl.h -> rccl/rccl.h), with fork standing in for MPI: the unique id is
 * made before the fork, as MPI_Bcast hands it out.
 *
 *   nccl_guide 1        one process, one thread, several devices (ncclCommInitAll)
 *   nccl_guide 2 N      one device per process, N processes
 *   nccl_guide 3 N D    N processes of D devices each, created by one thread in a group
 *   nccl_guide 3t N D   the same with one thread per device (no group)
 *
 * Every rank all-reduces (sum) 1 << 18 + 3 floats of value rank * 1000 + i % 1000 and
 * checks each element exactly, then one all-reduce of int32 in a group over all of the
 * process's communicators. Built and run by tests/collectives/test_native_ccl_c.py; prints
 * "guide N ok" once per process.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hip/hip_runtime_api.h"
#include "rccl/rccl.h"

#define HIPCHECK(cmd)                                                                              \
    do {                                                                                           \
        hipError_t e = cmd;                                                                        \
        if (e != hipSuccess) {                                                                     \
            printf("Failed: HIP error %s:%d '%s'\n", __FILE__, __LINE__, hipGetErrorString(e));    \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

#define NCCLCHECK(cmd)                                                                             \
    do {                                                                                           \
        ncclResult_t r = cmd;                                                                      \
        if (r != ncclSuccess) {                                                                    \
            printf("Failed, NCCL error %s:%d '%s' (%s)\n", __FILE__, __LINE__, ncclGetErrorString(r), \
                   ncclGetLastError(NULL));                                                        \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

enum { SIZE = (1 << 18) + 3 };

static float *host_in(int rank)
{
    float *h = malloc(SIZE * sizeof(float));
    for (int i = 0; i < SIZE; i++)
        h[i] = (float)(rank * 1000 + i % 1000);
    return h;
}

/* every element of rank `r`'s result, for nranks ranks */
static int check_sum(const float *out, int nranks, const char *what)
{
    for (int i = 0; i < SIZE; i++) {
        float want = (float)(1000 * nranks * (nranks - 1) / 2 + nranks * (i % 1000));
        if (out[i] != want) {
            printf("%s: element %d is %g, want %g\n", what, i, out[i], want);
            return 1;
        }
    }
    return 0;
}

/* the per-device state the examples keep */
typedef struct dev_state {
    int device, rank, nranks;
    ncclComm_t comm;
    hipStream_t stream;
    float *send, *recv;
    int32_t *isend, *irecv;
} dev_state;

static void setup(dev_state *d)
{
    HIPCHECK(hipSetDevice(d->device));
    HIPCHECK(hipMalloc((void **)&d->send, SIZE * sizeof(float)));
    HIPCHECK(hipMalloc((void **)&d->recv, SIZE * sizeof(float)));
    HIPCHECK(hipMalloc((void **)&d->isend, 16 * sizeof(int32_t)));
    HIPCHECK(hipMalloc((void **)&d->irecv, 16 * sizeof(int32_t)));
    float *h = host_in(d->rank);
    HIPCHECK(hipMemcpy(d->send, h, SIZE * sizeof(float), hipMemcpyHostToDevice));
    free(h);
    int32_t hi[16];
    for (int i = 0; i < 16; i++)
        hi[i] = d->rank + i;
    HIPCHECK(hipMemcpy(d->isend, hi, sizeof hi, hipMemcpyHostToDevice));
    HIPCHECK(hipMemset(d->recv, 0, SIZE * sizeof(float)));
    HIPCHECK(hipStreamCreate(&d->stream));
}

/* synchronize, check exactly, free */
static int finish(dev_state *d, int nranks)
{
    HIPCHECK(hipSetDevice(d->device));
    HIPCHECK(hipStreamSynchronize(d->stream));
    float *out = malloc(SIZE * sizeof(float));
    HIPCHECK(hipMemcpy(out, d->recv, SIZE * sizeof(float), hipMemcpyDeviceToHost));
    char what[64];
    snprintf(what, sizeof what, "rank %d all-reduce", d->rank);
    int bad = check_sum(out, nranks, what);
    free(out);
    int32_t hi[16];
    HIPCHECK(hipMemcpy(hi, d->irecv, sizeof hi, hipMemcpyDeviceToHost));
    for (int i = 0; i < 16 && !bad; i++)
        if (hi[i] != nranks * (nranks - 1) / 2 + nranks * i) {
            printf("rank %d int32 all-reduce [%d] = %d\n", d->rank, i, hi[i]);
            bad = 1;
        }
    int dev = -1, count = 0, rank = -1;
    NCCLCHECK(ncclCommCuDevice(d->comm, &dev));
    NCCLCHECK(ncclCommCount(d->comm, &count));
    NCCLCHECK(ncclCommUserRank(d->comm, &rank));
    if (dev != d->device || count != nranks || rank != d->rank) {
        printf("rank %d: the communicator says device %d, %d ranks, rank %d\n", d->rank, dev, count, rank);
        bad = 1;
    }
    HIPCHECK(hipFree(d->send));
    HIPCHECK(hipFree(d->recv));
    HIPCHECK(hipFree(d->isend));
    HIPCHECK(hipFree(d->irecv));
    HIPCHECK(hipStreamDestroy(d->stream));
    NCCLCHECK(ncclCommDestroy(d->comm));
    return bad;
}

/* the collectives of one process over its devices: one group, as the guide does */
static void all_reduce_all(dev_state *ds, int n)
{
    NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < n; i++) {
        NCCLCHECK(ncclAllReduce(ds[i].send, ds[i].recv, SIZE, ncclFloat, ncclSum, ds[i].comm, ds[i].stream));
        NCCLCHECK(ncclAllReduce(ds[i].isend, ds[i].irecv, 16, ncclInt32, ncclSum, ds[i].comm, ds[i].stream));
    }
    NCCLCHECK(ncclGroupEnd());
}

/* Example 1: single process, single thread, multiple devices */
static int example1(void)
{
    enum { nDev = 4 };
    int devs[nDev] = {0, 1, 2, 3};
    ncclComm_t comms[nDev];
    dev_state ds[nDev];
    for (int i = 0; i < nDev; i++) {
        ds[i] = (dev_state){.device = devs[i], .rank = i, .nranks = nDev};
        setup(&ds[i]);
    }
    NCCLCHECK(ncclCommInitAll(comms, nDev, devs));
    for (int i = 0; i < nDev; i++)
        ds[i].comm = comms[i];
    all_reduce_all(ds, nDev);
    int bad = 0;
    for (int i = 0; i < nDev; i++)
        bad |= finish(&ds[i], nDev);
    return bad;
}

/* Example 2: one device per process */
static int example2(int myRank, int nRanks, ncclUniqueId id)
{
    dev_state d = {.device = myRank % 4, .rank = myRank, .nranks = nRanks};
    setup(&d);
    NCCLCHECK(ncclCommInitRank(&d.comm, nRanks, id, myRank));
    NCCLCHECK(ncclAllReduce(d.send, d.recv, SIZE, ncclFloat, ncclSum, d.comm, d.stream));
    NCCLCHECK(ncclAllReduce(d.isend, d.irecv, 16, ncclInt32, ncclSum, d.comm, d.stream));
    return finish(&d, nRanks);
}

/* Example 3: multiple devices per process; the communicators by one thread in a group */
static int example3(int myRank, int nRanks, int nDev, ncclUniqueId id)
{
    dev_state ds[8];
    for (int i = 0; i < nDev; i++) {
        ds[i] = (dev_state){.device = i, .rank = myRank * nDev + i, .nranks = nRanks * nDev};
        setup(&ds[i]);
    }
    NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < nDev; i++) {
        HIPCHECK(hipSetDevice(ds[i].device));
        NCCLCHECK(ncclCommInitRank(&ds[i].comm, nRanks * nDev, id, myRank * nDev + i));
    }
    NCCLCHECK(ncclGroupEnd());
    all_reduce_all(ds, nDev);
    int bad = 0;
    for (int i = 0; i < nDev; i++)
        bad |= finish(&ds[i], nRanks * nDev);
    return bad;
}

/* Example 3 with one thread per device: each creates its communicator and all-reduces */
typedef struct thread_arg {
    dev_state *d;
    ncclUniqueId id;
    int bad;
} thread_arg;

static void *device_thread(void *p)
{
    thread_arg *a = p;
    dev_state *d = a->d;
    HIPCHECK(hipSetDevice(d->device));
    NCCLCHECK(ncclCommInitRank(&d->comm, d->nranks, a->id, d->rank));
    NCCLCHECK(ncclAllReduce(d->send, d->recv, SIZE, ncclFloat, ncclSum, d->comm, d->stream));
    NCCLCHECK(ncclAllReduce(d->isend, d->irecv, 16, ncclInt32, ncclSum, d->comm, d->stream));
    a->bad = finish(d, d->nranks);
    return NULL;
}

static int example3_threads(int myRank, int nRanks, int nDev, ncclUniqueId id)
{
    dev_state ds[8];
    thread_arg args[8];
    pthread_t t[8];
    for (int i = 0; i < nDev; i++) {
        ds[i] = (dev_state){.device = i, .rank = myRank * nDev + i, .nranks = nRanks * nDev};
        setup(&ds[i]);
        args[i] = (thread_arg){.d = &ds[i], .id = id};
    }
    for (int i = 0; i < nDev; i++)
        pthread_create(&t[i], NULL, device_thread, &args[i]);
    int bad = 0;
    for (int i = 0; i < nDev; i++) {
        pthread_join(t[i], NULL);
        bad |= args[i].bad;
    }
    return bad;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "1";
    int nRanks = argc > 2 ? atoi(argv[2]) : 1, nDev = argc > 3 ? atoi(argv[3]) : 1;
    if (strcmp(mode, "1") == 0) {
        int bad = example1();
        if (!bad)
            printf("guide 1 ok\n");
        return bad;
    }
    if (nRanks < 1 || nRanks > 8 || nDev < 1 || nDev > 8) {
        printf("usage: nccl_guide 1 | 2 NRANKS | 3 NRANKS NDEV | 3t NRANKS NDEV\n");
        return 2;
    }
    ncclUniqueId id;
    NCCLCHECK(ncclGetUniqueId(&id));        /* rank 0's MPI_Bcast in the guide */
    fflush(stdout);
    pid_t kids[8];
    for (int r = 0; r < nRanks; r++) {
        kids[r] = fork();
        if (kids[r] == 0) {
            int bad = strcmp(mode, "2") == 0   ? example2(r, nRanks, id)
                      : strcmp(mode, "3") == 0 ? example3(r, nRanks, nDev, id)
                                               : example3_threads(r, nRanks, nDev, id);
            if (!bad)
                printf("guide %s ok\n", mode);
            fflush(stdout);
            _exit(bad);
        }
    }
    int failed = 0;
    for (int r = 0; r < nRanks; r++) {
        int status = 0;
        waitpid(kids[r], &status, 0);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    return failed;
}
