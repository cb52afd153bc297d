/*
 * The ACL behaviours the simulator takes from CANN's runtime (hicann/runtime), checked
 * through the shipped header as a CANN program would call them: init / finalize, memcpy
 * checks and kind correction, event status, callback reports on a subscribed thread,
 * contexts, every aclrtMemAttr, and aclprof sessions with step timestamps.
 * Built and run by tests/devices/test_sim_c_abi.py; prints "acl fidelity ok".
 */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "acl/acl.h"
#include "anychip/sim.h"
#include "check.h"

enum { N = 4096 };
static unsigned char a[N], b[N];

/* ---- init ---------------------------------------------------------------------- */
static int init_rules(void)
{
    uint32_t count = 0;
    CHECK(aclrtGetDeviceCount(&count) == ACL_SUCCESS && count == 8);  /* no aclInit needed */
    CHECK(aclrtSetDevice(0) == ACL_SUCCESS);
    CHECK(aclFinalize() == ACL_SUCCESS);                      /* without aclInit: succeeds */
    CHECK(aclFinalize() == ACL_ERROR_REPEAT_FINALIZE);        /* 100037 */
    CHECK(aclInit(NULL) == ACL_SUCCESS);
    CHECK(aclInit(NULL) == ACL_ERROR_REPEAT_INITIALIZE);
    return 0;
}

/* ---- memcpy ---------------------------------------------------------------------- */
static int memcpy_rules(void)
{
    void *d = NULL, *h = NULL, *h2 = NULL;
    aclrtStream s;
    CHECK(aclrtMalloc(&d, N, ACL_MEM_MALLOC_HUGE_FIRST) == 0);
    CHECK(aclrtMallocHost(&h, N) == 0 && aclrtMallocHost(&h2, N) == 0);
    CHECK(aclrtCreateStream(&s) == 0);
    for (int i = 0; i < N; i++)
        ((unsigned char *)h)[i] = (unsigned char)(i * 13 + 1);

    CHECK(aclrtMemcpy(NULL, 0, NULL, 0, (aclrtMemcpyKind)99) == ACL_SUCCESS);      /* count 0 first */
    CHECK(aclrtMemcpyAsync(NULL, 0, NULL, 0, (aclrtMemcpyKind)99, s) == ACL_SUCCESS);
    CHECK(aclrtMemcpy(NULL, N, h, N, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtMemcpy(d, N, h, N, (aclrtMemcpyKind)8) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtMemcpy(d, N - 1, h, N, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_ERROR_RT_PARAM_INVALID);
    CHECK(aclrtMemcpyAsync(d, N - 1, h, N, ACL_MEMCPY_HOST_TO_DEVICE, s) == ACL_ERROR_RT_PARAM_INVALID);

    /* runtime memory on both sides: a wrong kind is corrected */
    CHECK(aclrtMemcpy(d, N, h, N, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS);
    CHECK(aclrtMemcpy(h2, N, d, N, ACL_MEMCPY_HOST_TO_HOST) == ACL_SUCCESS);
    CHECK(memcmp(h, h2, N) == 0);
    memset(h2, 0, N);
    CHECK(aclrtMemcpyAsync(h2, N, d, N, ACL_MEMCPY_HOST_TO_DEVICE, s) == ACL_SUCCESS);
    CHECK(aclrtSynchronizeStream(s) == 0 && memcmp(h, h2, N) == 0);
    CHECK(aclrtMemcpy(h2, N, h, N, ACL_MEMCPY_DEVICE_TO_DEVICE) == ACL_SUCCESS);   /* pinned to pinned */

    /* pageable memory: only the kinds MemcpyKindAutoCorrect lists for the pair */
    CHECK(aclrtMemcpy(d, N, a, N, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_ERROR_RT_PARAM_INVALID);
    CHECK(aclGetRecentErrMsg() != NULL);
    CHECK(aclrtMemcpy(d, N, a, N, ACL_MEMCPY_HOST_TO_HOST) == ACL_ERROR_RT_PARAM_INVALID);
    CHECK(aclrtMemcpy(b, N, d, N, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_ERROR_RT_PARAM_INVALID);
    CHECK(aclrtMemcpy(b, N, h, N, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_ERROR_RT_PARAM_INVALID); /* pinned -> pageable */
    CHECK(aclrtMemcpy(a, N, b, N, ACL_MEMCPY_DEVICE_TO_DEVICE) == ACL_SUCCESS);  /* pageable pair: any kind */
    CHECK(aclrtMemcpy(b, N, d, N, ACL_MEMCPY_DEVICE_TO_DEVICE) == ACL_SUCCESS);  /* allowed for device -> pageable */
    CHECK(memcmp(b, h, N) == 0);
    memset(b, 0, N);
    CHECK(aclrtMemcpy(b, N, d, N, ACL_MEMCPY_DEFAULT) == ACL_SUCCESS && memcmp(b, h, N) == 0);
    CHECK(aclrtMemcpyAsync(d, N, a, N, ACL_MEMCPY_DEVICE_TO_HOST, s) == ACL_ERROR_RT_PARAM_INVALID);
    /* a pointer the kind calls device memory that is not even mapped: an error, not a crash */
    void *gone = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(gone != MAP_FAILED && munmap(gone, N) == 0);
    CHECK(aclrtMemcpy(b, N, gone, N, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_ERROR_RT_PARAM_INVALID);
    CHECK(aclrtMemcpy(gone, N, d, N, ACL_MEMCPY_DEVICE_TO_DEVICE) == ACL_ERROR_RT_PARAM_INVALID);

    CHECK(aclrtDestroyStream(s) == 0);
    CHECK(aclrtFree(d) == 0 && aclrtFreeHost(h) == 0 && aclrtFreeHost(h2) == 0);
    return 0;
}

/* ---- events ------------------------------------------------------------------- */
static int event_rules(void)
{
    aclrtStream s1, s2;
    aclrtEvent e, f;
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    aclrtEventStatus old = ACL_EVENT_STATUS_NOT_READY;
    aclrtEventWaitStatus ws = ACL_EVENT_WAIT_STATUS_NOT_READY;
    float ms = -1;
    CHECK(aclrtCreateStream(&s1) == 0 && aclrtCreateStream(&s2) == 0);
    CHECK(aclrtCreateEvent(&e) == 0 && aclrtCreateEventWithFlag(&f, 0x8u) == 0);
    CHECK(aclrtQueryEventStatus(e, &st) == 0 && st == ACL_EVENT_RECORDED_STATUS_NOT_READY); /* never recorded */
    CHECK(aclrtQueryEvent(e, &old) == 0 && old == ACL_EVENT_STATUS_COMPLETE);   /* deprecated: nothing pending */
    CHECK(aclrtQueryEventWaitStatus(e, &ws) == 0 && ws == ACL_EVENT_WAIT_STATUS_COMPLETE);  /* nobody waits */
    CHECK(aclrtRecordEvent(f, s1) == 0 && aclrtSynchronizeEvent(f) == 0);
    CHECK(aclrtEventElapsedTime(&ms, e, f) == ACL_ERROR_RT_INTERNAL_ERROR);     /* 507000 */
    CHECK(aclrtEventElapsedTime(&ms, f, e) == ACL_ERROR_RT_INTERNAL_ERROR);

    /* a stream waiting for an event that is not complete yet */
    CHECK(anychip_sim_stream_hold(s1) == 0);
    CHECK(aclrtRecordEvent(e, s1) == 0);
    CHECK(aclrtStreamWaitEvent(s2, e) == 0);
    CHECK(aclrtQueryEventStatus(e, &st) == 0 && st == ACL_EVENT_RECORDED_STATUS_NOT_READY);
    CHECK(aclrtQueryEventWaitStatus(e, &ws) == 0 && ws == ACL_EVENT_WAIT_STATUS_NOT_READY);
    CHECK(anychip_sim_stream_release(s1) == 0);
    CHECK(aclrtSynchronizeStream(s1) == 0 && aclrtSynchronizeStream(s2) == 0);
    CHECK(aclrtQueryEventStatus(e, &st) == 0 && st == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK(aclrtQueryEventWaitStatus(e, &ws) == 0 && ws == ACL_EVENT_WAIT_STATUS_COMPLETE);
    CHECK(aclrtEventElapsedTime(&ms, f, e) == 0 && ms >= 0);

    /* reset: back to "never recorded", in stream order */
    CHECK(aclrtResetEvent(e, s1) == 0 && aclrtSynchronizeStream(s1) == 0);
    CHECK(aclrtQueryEventStatus(e, &st) == 0 && st == ACL_EVENT_RECORDED_STATUS_NOT_READY);
    CHECK(aclrtEventElapsedTime(&ms, f, e) == ACL_ERROR_RT_INTERNAL_ERROR);
    CHECK(aclrtRecordEvent(e, s1) == 0 && aclrtSynchronizeEvent(e) == 0);
    CHECK(aclrtQueryEventStatus(e, &st) == 0 && st == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK(aclrtQueryEventWaitStatus(NULL, &ws) == ACL_ERROR_RT_INVALID_HANDLE);
    CHECK(aclrtDestroyEvent(e) == 0 && aclrtDestroyEvent(f) == 0);
    CHECK(aclrtDestroyStream(s1) == 0 && aclrtDestroyStream(s2) == 0);
    return 0;
}

/* ---- callbacks ----------------------------------------------------------------- */
static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cb_cv = PTHREAD_COND_INITIALIZER;
static int cb_count;
static pthread_t cb_threads[8];
static atomic_int worker_stop;       /* set by the main thread, read by the worker */
static int worker_rc = -1;

static void callback(void *arg)
{
    pthread_mutex_lock(&cb_lock);
    cb_threads[cb_count++] = pthread_self();
    *(int *)arg += 1;
    pthread_cond_broadcast(&cb_cv);
    pthread_mutex_unlock(&cb_lock);
}

static void *report_worker(void *ctx)
{
    aclrtSetCurrentContext(ctx);               /* the PaddleCustomDevice NPU runtime's worker */
    while (!atomic_load(&worker_stop)) {
        int rc = aclrtProcessReport(20);
        if (rc != ACL_SUCCESS && rc != ACL_ERROR_RT_REPORT_TIMEOUT && rc != ACL_ERROR_RT_THREAD_SUBSCRIBE)
            worker_rc = rc;
    }
    if (worker_rc < 0)
        worker_rc = 0;
    return NULL;
}

static int callback_rules(void)
{
    aclrtStream s;
    aclrtContext ctx;
    int hits = 0;
    pthread_t worker;
    CHECK(aclrtCreateStream(&s) == 0);
    CHECK(aclrtLaunchCallback(callback, &hits, ACL_CALLBACK_BLOCK, s) == ACL_ERROR_RT_STREAM_NO_CB_REG);
    CHECK(aclrtProcessReport(10) == ACL_ERROR_RT_THREAD_SUBSCRIBE);     /* this thread subscribed nothing */
    CHECK(aclrtProcessReport(0) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtProcessReport(-2) == ACL_ERROR_INVALID_PARAM);

    /* a subscribed thread with nothing to do times out */
    uint64_t self = (uint64_t)pthread_self();
    CHECK(aclrtSubscribeReport(self, s) == 0);
    CHECK(aclrtSubscribeReport(self, s) == ACL_ERROR_RT_STREAM_SUBSCRIBE);
    CHECK(aclrtProcessReport(5) == ACL_ERROR_RT_REPORT_TIMEOUT);
    CHECK(aclrtLaunchCallback(callback, &hits, (aclrtCallbackBlockType)2, s) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtLaunchCallback(callback, &hits, ACL_CALLBACK_NO_BLOCK, s) == 0);
    CHECK(aclrtSynchronizeStream(s) == 0);
    CHECK(hits == 0);                                          /* not run until reports are processed */
    CHECK(aclrtProcessReport(-1) == 0 && hits == 1 && pthread_equal(cb_threads[0], pthread_self()));
    CHECK(aclrtUnSubscribeReport(self, s) == 0);
    CHECK(aclrtUnSubscribeReport(self, s) == ACL_ERROR_RT_STREAM_SUBSCRIBE);

    /* the PaddleCustomDevice pattern: a worker thread processes reports for the stream */
    CHECK(aclrtGetCurrentContext(&ctx) == 0);
    CHECK(pthread_create(&worker, NULL, report_worker, ctx) == 0);
    CHECK(aclrtSubscribeReport((uint64_t)worker, s) == 0);
    CHECK(aclrtLaunchCallback(callback, &hits, ACL_CALLBACK_BLOCK, s) == 0);
    CHECK(aclrtSynchronizeStream(s) == 0);
    CHECK(hits == 2 && pthread_equal(cb_threads[1], worker));  /* BLOCK: done when the stream is */
    CHECK(aclrtLaunchCallback(callback, &hits, ACL_CALLBACK_NO_BLOCK, s) == 0);
    pthread_mutex_lock(&cb_lock);
    while (cb_count < 3)
        pthread_cond_wait(&cb_cv, &cb_lock);
    pthread_mutex_unlock(&cb_lock);
    CHECK(hits == 3 && pthread_equal(cb_threads[2], worker));
    atomic_store(&worker_stop, 1);
    CHECK(pthread_join(worker, NULL) == 0 && worker_rc == 0);
    CHECK(aclrtUnSubscribeReport((uint64_t)worker, s) == 0);
    CHECK(aclrtLaunchCallback(callback, &hits, ACL_CALLBACK_BLOCK, s) == ACL_ERROR_RT_STREAM_NO_CB_REG);
    CHECK(aclrtDestroyStream(s) == 0);
    return 0;
}

/* ---- contexts ------------------------------------------------------------------- */
static int no_context_rc = -1;

static void *fresh_thread(void *ctx)
{
    aclrtContext cur = NULL;
    int32_t dev = -1;
    no_context_rc = aclrtGetCurrentContext(&cur);
    if (aclrtSetCurrentContext(ctx) != 0 || aclrtGetDevice(&dev) != 0 || dev != 3)
        no_context_rc = -2;
    return NULL;
}

static int context_rules(void)
{
    aclrtContext primary = NULL, c = NULL, cur = NULL;
    int32_t dev = -1;
    pthread_t t;
    CHECK(aclrtSetDevice(0) == 0 && aclrtGetCurrentContext(&primary) == 0 && primary != NULL);
    CHECK(aclrtCreateContext(&c, 3) == 0 && c != NULL && c != primary);
    CHECK(aclrtGetDevice(&dev) == 0 && dev == 3);              /* the new context is current */
    CHECK(aclrtGetCurrentContext(&cur) == 0 && cur == c);
    CHECK(pthread_create(&t, NULL, fresh_thread, c) == 0 && pthread_join(t, NULL) == 0);
    CHECK(no_context_rc == ACL_ERROR_RT_CONTEXT_NULL);         /* a new thread has none */
    CHECK(aclrtSetCurrentContext(primary) == 0 && aclrtGetDevice(&dev) == 0 && dev == 0);
    CHECK(aclrtCreateContext(&cur, 99) == ACL_ERROR_RT_INVALID_DEVICEID);
    CHECK(aclrtDestroyContext(c) == 0);
    CHECK(aclrtDestroyContext(c) == ACL_ERROR_RT_INVALID_HANDLE);
    CHECK(aclrtSetCurrentContext(c) == ACL_ERROR_RT_INVALID_HANDLE);
    CHECK(aclrtDestroyContext(primary) == ACL_ERROR_RT_INVALID_HANDLE);   /* a default context */
    return 0;
}

/* ---- memory information ---------------------------------------------------------- */
static int mem_info_rules(void)
{
    size_t fr = 0, tot = 0;
    for (int attr = ACL_DDR_MEM; attr <= ACL_MEM_P2P_HUGE1G; attr++)
        CHECK(aclrtGetMemInfo((aclrtMemAttr)attr, &fr, &tot) == 0 && tot > 0 && fr <= tot);
    CHECK(ACL_HBM_MEM_HUGE1G == 10 && ACL_HBM_MEM_P2P_HUGE1G == 11);
    CHECK(aclrtGetMemInfo((aclrtMemAttr)(ACL_MEM_P2P_HUGE1G + 1), &fr, &tot) == ACL_ERROR_INVALID_PARAM);
    return 0;
}

/* ---- profiling ------------------------------------------------------------------- */
static int prof_rules(void)
{
    uint32_t devs[1] = {0};
    aclrtStream s;
    uint64_t t0 = 0, t1 = 0;
    const char *dir = "/nonexistent/anychip-prof";
    aclprofConfig *cfg = aclprofCreateConfig(devs, 1, ACL_AICORE_NONE, NULL, ACL_PROF_ACL_API | ACL_PROF_TASK_TIME);
    CHECK(cfg != NULL);
    uint32_t bad[1] = {77};
    CHECK(aclprofCreateConfig(bad, 1, ACL_AICORE_NONE, NULL, 0) == NULL);
    CHECK(aclprofStart(cfg) == ACL_ERROR_UNINITIALIZE);
    CHECK(aclprofInit(dir, strlen(dir)) == 0);
    CHECK(aclprofInit(dir, strlen(dir)) == ACL_ERROR_REPEAT_INITIALIZE);
    CHECK(aclprofStart(cfg) == 0 && aclprofStart(cfg) == ACL_ERROR_PROF_ALREADY_RUN);
    CHECK(aclrtCreateStream(&s) == 0);
    aclprofStepInfo *step = aclprofCreateStepInfo();
    CHECK(step != NULL);
    CHECK(aclprofGetStepTimestamp(NULL, ACL_STEP_START, s) == ACL_ERROR_INVALID_PARAM);
    CHECK(anychip_sim_aclprof_step_time(step, ACL_STEP_START, &t0) == ACL_ERROR_INVALID_PARAM); /* not asked */
    CHECK(anychip_sim_stream_hold(s) == 0);
    CHECK(aclprofGetStepTimestamp(step, ACL_STEP_START, s) == 0);
    CHECK(anychip_sim_aclprof_step_time(step, ACL_STEP_START, &t0) == ACL_ERROR_PROF_NOT_RUN); /* not reached */
    CHECK(aclrtMemcpyAsync(b, N, a, N, ACL_MEMCPY_HOST_TO_HOST, s) == 0);
    CHECK(aclprofGetStepTimestamp(step, ACL_STEP_END, s) == 0);
    CHECK(anychip_sim_stream_release(s) == 0 && aclrtSynchronizeStream(s) == 0);
    CHECK(anychip_sim_aclprof_step_time(step, ACL_STEP_START, &t0) == 0);
    CHECK(anychip_sim_aclprof_step_time(step, ACL_STEP_END, &t1) == 0 && t1 >= t0 && t0 > 0);
    aclprofDestroyStepInfo(step);
    CHECK(aclprofFinalize() == ACL_ERROR_PROF_ALREADY_RUN);  /* stop the session first */
    CHECK(aclprofDestroyConfig(cfg) == ACL_ERROR_PROF_ALREADY_RUN);
    CHECK(aclprofStop(cfg) == 0 && aclprofStop(cfg) == ACL_ERROR_PROF_NOT_RUN);
    CHECK(aclprofDestroyConfig(cfg) == 0 && aclprofFinalize() == 0);
    CHECK(aclrtDestroyStream(s) == 0);
    return 0;
}

int main(void)
{
    if (init_rules() || memcpy_rules() || event_rules() || callback_rules() || context_rules() ||
        mem_info_rules() || prof_rules())
        return 1;
    CHECK(aclFinalize() == 0 && aclInit(NULL) == 0 && aclFinalize() == 0);   /* init again after finalize */
    printf("acl fidelity ok\n");
    return 0;
}
