/*
 * The XPU runtime behaviours the simulator takes from the runtime guide and Paddle's call
 * sites, checked through the shipped header: xpu_device_list returns the physical numbers
 * of the visible devices, the current device is per thread (device 0 until set), failures
 * are positive XPUError_t codes, xpu_get_driver_version. Run by tests/devices/test_sim_c_abi.py
 * with XPU_VISIBLE_DEVICES=5,2,7; prints "xpu fidelity ok".
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "xpu/runtime.h"
#include "check.h"

static int other_dev = -1, other_set = -1, other_after = -1;

static void *other_thread(void *arg)
{
    (void)arg;
    xpu_current_device(&other_dev);           /* never set on this thread: device 0 */
    other_set = xpu_set_device(2);
    xpu_current_device(&other_after);
    return NULL;
}

int main(void)
{
    int count = 0, list[8] = {-1, -1, -1, -1, -1, -1, -1, -1}, dev = -1;
    CHECK(xpu_device_count(&count) == XPU_SUCCESS && count == 3);
    CHECK(xpu_device_list(list) == XPU_SUCCESS);
    CHECK(list[0] == 5 && list[1] == 2 && list[2] == 7 && list[3] == -1);   /* physical numbers */
    uint64_t devid = 0;
    CHECK(xpu_device_get_attr(&devid, XPUATTR_DEVID, 1) == XPU_SUCCESS && devid == 2);

    CHECK(xpu_current_device(&dev) == XPU_SUCCESS && dev == 0);
    CHECK(xpu_set_device(1) == XPU_SUCCESS && xpu_current_device(&dev) == XPU_SUCCESS && dev == 1);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0 && pthread_join(t, NULL) == 0);
    CHECK(other_dev == 0 && other_set == XPU_SUCCESS && other_after == 2);
    CHECK(xpu_current_device(&dev) == XPU_SUCCESS && dev == 1);          /* untouched by the other thread */

    CHECK(xpu_set_device(3) == XPUERR_INVALID_DEVICE && XPUERR_INVALID_DEVICE == 701);   /* positive */
    void *p = NULL;
    CHECK(xpu_malloc(&p, 64, XPU_MEM_L3) == XPUERR_NOSUPPORT);           /* Paddle tolerates this one */
    CHECK(xpu_free(&dev) == XPUERR_INVALID_PARAM);

    uint32_t major = 0, minor = 99;
    CHECK(xpu_get_driver_version(&major, &minor) == XPU_SUCCESS && major == 4 && minor == 0);
    CHECK(xpu_get_driver_version(NULL, &minor) == XPUERR_INVALID_PARAM);
    printf("xpu fidelity ok\n");
    return 0;
}
