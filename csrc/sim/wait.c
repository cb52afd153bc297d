/*
 * The one wait of the simulator: spin briefly, then sleep on a condition variable,
 * optionally until a deadline. Stream workers wait for work with it; synchronizing
 * threads wait for streams and events with it.
 */
#include "internal.h"

#include <sched.h>

#define SPIN_YIELD_AFTER_NS 2000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void sim_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

uint64_t sim_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? 0 : now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int sim_wait(sim_ready_fn ready, const void *ctx, pthread_mutex_t *lock, pthread_cond_t *cv, int *sleepers,
             uint64_t spin_ns, uint64_t deadline_ns)
{
    if (ready(ctx))
        return 1;
    if (spin_ns) {
        /* after the first microseconds the spin yields the core between polls: on a machine
         * with more busy threads than cores, the thread that will make us ready (the issuing
         * thread, a peer rank) may be waiting for this very core */
        uint64_t start = now_ns(), until = start + spin_ns;
        for (unsigned k = 1;; k++) {
            if (ready(ctx))
                return 1;
            cpu_relax();
            if ((k & 63) == 0) {
                uint64_t t = now_ns();
                if (t > until)
                    break;
                if (t - start > SPIN_YIELD_AFTER_NS)
                    sched_yield();
            }
        }
    }
    int ok = 1;
    pthread_mutex_lock(lock);
    ++*sleepers;
    while (!ready(ctx)) {
        if (!deadline_ns) {
            pthread_cond_wait(cv, lock);
            continue;
        }
        struct timespec ts = {(time_t)(deadline_ns / 1000000000ull), (long)(deadline_ns % 1000000000ull)};
        if (pthread_cond_timedwait(cv, lock, &ts) != 0 && !ready(ctx)) {
            ok = 0;
            break;
        }
    }
    --*sleepers;
    pthread_mutex_unlock(lock);
    return ok;
}
