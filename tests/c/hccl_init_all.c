/*
 * One process, several Ascend devices: HcclCommInitAll from one thread, then the
 * all-reduces of every communicator issued by that thread (each op returns once
 * enqueued, so no group is needed); then the same with one thread per device, each
 * creating its communicator with HcclCommInitRootInfo. Checks every element exactly and
 * CANN's codes for bad arguments. Built and run by tests/collectives/test_native_ccl_c.py;
 * prints "hccl init all ok".
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "acl/acl.h"
#include "hccl/hccl.h"

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAILED line %d: %s\n", __LINE__, #cond);                    \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

enum { NDEV = 4, COUNT = (1 << 17) + 9 };

typedef struct dev_state {
    int32_t device;
    int rank;
    HcclComm comm;
    aclrtStream stream;
    float *send, *recv;
    const HcclRootInfo *root;
} dev_state;

static void setup(dev_state *d)
{
    CHECK(aclrtSetDevice(d->device) == ACL_SUCCESS);
    CHECK(aclrtMalloc((void **)&d->send, COUNT * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS);
    CHECK(aclrtMalloc((void **)&d->recv, COUNT * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS);
    float *h = malloc(COUNT * sizeof(float));
    for (int i = 0; i < COUNT; i++)
        h[i] = (float)(d->rank * 100 + i % 500);
    CHECK(aclrtMemcpy(d->send, COUNT * sizeof(float), h, COUNT * sizeof(float), ACL_MEMCPY_HOST_TO_DEVICE) ==
          ACL_SUCCESS);
    free(h);
    CHECK(aclrtCreateStream(&d->stream) == ACL_SUCCESS);
}

static void finish(dev_state *d)
{
    CHECK(aclrtSetDevice(d->device) == ACL_SUCCESS);
    CHECK(aclrtSynchronizeStream(d->stream) == ACL_SUCCESS);
    float *h = malloc(COUNT * sizeof(float));
    CHECK(aclrtMemcpy(h, COUNT * sizeof(float), d->recv, COUNT * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST) ==
          ACL_SUCCESS);
    for (int i = 0; i < COUNT; i++)
        if (h[i] != (float)(100 * NDEV * (NDEV - 1) / 2 + NDEV * (i % 500))) {
            printf("rank %d element %d is %g\n", d->rank, i, h[i]);
            exit(1);
        }
    free(h);
    uint32_t size = 0, rank = 99;
    CHECK(HcclGetRankSize(d->comm, &size) == HCCL_SUCCESS && size == NDEV);
    CHECK(HcclGetRankId(d->comm, &rank) == HCCL_SUCCESS && rank == (uint32_t)d->rank);
    CHECK(HcclCommDestroy(d->comm) == HCCL_SUCCESS);
    CHECK(aclrtDestroyStream(d->stream) == ACL_SUCCESS);
    CHECK(aclrtFree(d->send) == ACL_SUCCESS && aclrtFree(d->recv) == ACL_SUCCESS);
}

static void *device_thread(void *p)
{
    dev_state *d = p;
    CHECK(aclrtSetDevice(d->device) == ACL_SUCCESS);
    CHECK(HcclCommInitRootInfo(NDEV, d->root, (uint32_t)d->rank, &d->comm) == HCCL_SUCCESS);
    CHECK(HcclAllReduce(d->send, d->recv, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, d->comm, d->stream) ==
          HCCL_SUCCESS);
    finish(d);
    return NULL;
}

int main(void)
{
    CHECK(aclInit(NULL) == ACL_SUCCESS);
    int32_t devices[NDEV] = {3, 1, 0, 2};
    dev_state ds[NDEV];
    HcclComm comms[NDEV];

    /* one thread for all devices */
    for (int i = 0; i < NDEV; i++) {
        ds[i] = (dev_state){.device = devices[i], .rank = i};
        setup(&ds[i]);
    }
    CHECK(HcclCommInitAll(NDEV, devices, comms) == HCCL_SUCCESS);
    for (int i = 0; i < NDEV; i++) {
        ds[i].comm = comms[i];
        CHECK(aclrtSetDevice(ds[i].device) == ACL_SUCCESS);
        CHECK(HcclAllReduce(ds[i].send, ds[i].recv, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, ds[i].comm,
                            ds[i].stream) == HCCL_SUCCESS);
    }
    for (int i = 0; i < NDEV; i++)
        finish(&ds[i]);

    /* one thread per device */
    HcclRootInfo root;
    CHECK(HcclGetRootInfo(&root) == HCCL_SUCCESS);
    pthread_t t[NDEV];
    for (int i = 0; i < NDEV; i++) {
        ds[i] = (dev_state){.device = devices[i], .rank = i, .root = &root};
        setup(&ds[i]);
    }
    for (int i = 0; i < NDEV; i++)
        CHECK(pthread_create(&t[i], NULL, device_thread, &ds[i]) == 0);
    for (int i = 0; i < NDEV; i++)
        pthread_join(t[i], NULL);

    /* refused before anything is made */
    int32_t twice[2] = {1, 1}, gone[2] = {0, 99};
    CHECK(HcclCommInitAll(2, twice, comms) == HCCL_E_PARA);
    CHECK(HcclCommInitAll(2, gone, comms) == HCCL_E_PARA);
    CHECK(HcclCommInitAll(0, devices, comms) == HCCL_E_PARA);
    CHECK(HcclCommInitAll(2, NULL, comms) == HCCL_E_PTR);
    CHECK(HcclCommInitAll(2, devices, NULL) == HCCL_E_PTR);
    printf("hccl init all ok\n");
    return 0;
}
