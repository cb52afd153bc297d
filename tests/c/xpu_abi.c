/*
 * Calls the Kunlun simulator through the XPU runtime's C API, built from the shipped
 * header (csrc/include/xpu/runtime.h) as a program written for
 * xpu/runtime.h is. Linked against libkunlun_sim by
 * tests/devices/test_sim_c_abi.py.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "anychip/sim.h"
#include "xpu/runtime.h"
#include "check.h"

int main(void)
{
    enum { N = 4096 };
    static unsigned char a[N], b[N];
    int count = 0, dev = -1;
    CHECK(xpu_device_count(&count) == 0 && count >= 2);
    CHECK(xpu_current_device(&dev) == 0 && dev == 0);   /* device 0 until xpu_set_device */
    CHECK(xpu_set_device(count) == 701);                /* XPUERR_INVALID_DEVICE */
    uint64_t cap = 0;
    CHECK(xpu_device_get_attr(&cap, XPUATTR_MEM_MAIN_CAPACITY, 0) == 0 && cap > 0);

    void *d0 = NULL, *d1 = NULL;
    CHECK(xpu_malloc(&d0, N, XPU_MEM_MAIN) == 0);
    CHECK(xpu_set_device(1) == 0);
    CHECK(xpu_malloc(&d1, N, XPU_MEM_MAIN) == 0);
    for (int i = 0; i < N; i++)
        a[i] = (unsigned char)(i * 13 + 1);
    CHECK(xpu_memcpy(d0, a, N, XPU_HOST_TO_DEVICE) == 0);
    CHECK(xpu_memcpy_peer(1, d1, 0, d0, N) == 0);

    XPUStream s;
    XPUEvent e;
    CHECK(xpu_stream_create(&s) == 0 && xpu_event_create(&e) == 0);
    CHECK(anychip_sim_stream_hold(s) == 0);
    CHECK(xpu_memcpy_async(b, d1, N, XPU_DEVICE_TO_HOST, s) == 0);
    CHECK(xpu_event_record(e, s) == 0);
    CHECK(xpu_event_query(e) != 0);                     /* not complete while held */
    CHECK(b[5] == 0);
    CHECK(anychip_sim_stream_release(s) == 0);
    CHECK(xpu_event_wait(e) == 0 && xpu_event_query(e) == 0);
    CHECK(xpu_wait(s) == 0);
    CHECK(memcmp(a, b, N) == 0);

    CHECK(xpu_memcpy_async(b, d1, N + 1, XPU_DEVICE_TO_HOST, s) == 707);  /* past the allocation */
    CHECK(xpu_memcpy(d1, a, N, XPU_DEVICE_TO_HOST) == 707);              /* wrong direction */
    CHECK(xpu_free((char *)d1 + 8) == 707);
    CHECK(xpu_malloc(&d1, (uint64_t)1 << 50, XPU_MEM_MAIN) == 705);      /* XPUERR_NOMEM */
    CHECK(xpu_stream_destroy(s) == 0);
    CHECK(xpu_wait(s) == 717);                                           /* XPUERR_USEAFCLOSE */
    CHECK(xpu_event_destroy(e) == 0 && xpu_event_destroy(e) == 707);
    void *h = NULL;
    CHECK(xpu_host_alloc(&h, 64, 0) == 0 && xpu_host_free(h) == 0 && xpu_host_free(h) == 707);
    CHECK(xpu_free(d1) == 0 && xpu_free(d0) == 0 && xpu_free(d0) == 707);
    printf("xpu ok\n");
    return 0;
}
