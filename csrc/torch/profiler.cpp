// The profiler's device time (see docs/torch.md; device.h lists the parts): PrivateUse1's profiler
// stubs over plugin.h's events. With them registered, a profile that asks for the device
// (torch.autograd.profiler.profile(use_device="anychip"), torch's KINETO_PRIVATEUSE1_FALLBACK)
// records an event on the current stream of the current device as each op starts and another as
// it ends, and takes the op's device time from the two (event_elapsed_ms). Without the stubs torch
// reads the default ones, whose records are never made: the ops' device durations came out negative.
//
// A plugin without timed events (no event_create / event_record / event_synchronize /
// event_elapsed_ms) records nothing, and its ops show no device time; so do the ops whose start
// and end events are on two devices (an op that changed the current device), which no one clock
// times.
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <functional>
#include <memory>

#include "device.h"

namespace anychip_torch {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

// one recorded profiler event: the plugin's event and its device
struct ProfEvent {
    anychip_event event;
    int device;
};

struct Stubs final : torch::profiler::impl::ProfilerStubs {
    void record(c10::DeviceIndex *device, ProfilerVoidEventStub *event, int64_t *cpu_ns) const override
    {
        const int dev = current_device();
        if (device)
            *device = static_cast<c10::DeviceIndex>(dev);
        if (cpu_ns)
            *cpu_ns = c10::getTime();
        if (!g_ready || !timed_events())
            return;
        anychip_event ev = nullptr;
        check(g_plugin.event_create(dev, &ev), "event_create", dev);
        // the event outlives the profile's records only as long as torch keeps them
        *event = std::shared_ptr<void>(new ProfEvent{ev, dev}, [](void *p) {
            auto *e = static_cast<ProfEvent *>(p);
            if (g_ready)
                g_plugin.event_destroy(e->device, e->event);
            delete e;
        });
        check(g_plugin.event_record(dev, ev, static_cast<anychip_stream>(current_stream(dev))), "event_record", dev);
    }

    // microseconds from the first event to the second, as CUDA's stubs give
    float elapsed(const ProfilerVoidEventStub *start, const ProfilerVoidEventStub *end) const override
    {
        if (!start || !end || !*start || !*end)
            return 0.f;
        const auto *a = static_cast<const ProfEvent *>(start->get());
        const auto *b = static_cast<const ProfEvent *>(end->get());
        if (a->device != b->device)
            return 0.f;
        check(g_plugin.event_synchronize(b->device, b->event), "event_synchronize", b->device);
        float ms = 0.f;
        check(g_plugin.event_elapsed_ms(b->device, &ms, a->event, b->event), "event_elapsed_ms", b->device);
        return ms * 1000.f;
    }

    // plugin.h has no annotations (NVTX's ranges)
    void mark(const char *) const override {}
    void rangePush(const char *) const override {}
    void rangePop() const override {}
    bool enabled() const override { return g_ready && timed_events(); }

    void onEachDevice(std::function<void(int)> op) const override
    {
        for (int d = 0; d < device_count(); ++d) {
            c10::DeviceGuard guard(c10::Device(kType, static_cast<c10::DeviceIndex>(d)));
            op(d);
        }
    }

    // the work of every device's current stream is done
    void synchronize() const override
    {
        for (int d = 0; d < device_count(); ++d) {
            if (g_plugin.device_synchronize)
                check(g_plugin.device_synchronize(d), "device_synchronize", d);
            else
                sync_stream(d, current_stream(d));
        }
    }
};

Stubs g_stubs;

}  // namespace

bool timed_events()
{
    return g_plugin.event_create && g_plugin.event_destroy && g_plugin.event_record && g_plugin.event_synchronize &&
           g_plugin.event_elapsed_ms;
}

void register_profiler()
{
    torch::profiler::impl::registerPrivateUse1Methods(&g_stubs);
    register_activity_profiler();
}

}  // namespace anychip_torch
