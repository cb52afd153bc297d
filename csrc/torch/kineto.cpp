// The device's activities in torch.profiler's trace (see docs/torch.md; device.h lists the parts):
// a libkineto::IActivityProfiler registered as PrivateUse1's, which torch's Kineto state
// KINETO_PRIVATEUSE1 (torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1]))
// runs beside its CPU trace.
//
// While a session traces, each kernel and each enqueued copy or fill is bracketed on its stream by
// two of plugin.h's events (trace_begin / trace_end, called around the enqueue): the device's
// times are when the stream ran the work, not when the host queued it. The host side of the
// enqueue is kept too (its start and end on the host clock, the innermost CPU op's correlation
// id). When the session's trace is processed, each pair of events is waited for and placed on the
// host clock through an anchor: the first time a session traces a stream, the stream is drained,
// an event is recorded on it and waited for, and the host time after that wait is the anchor's
// (so device work never shows before the host queued it). An activity's start is the anchor's
// host time plus event_elapsed_ms(anchor, start event); its end likewise.
//
// A profile without the device's activities (CPU only) gets no session: nothing is recorded, and
// the check on each enqueue is one relaxed atomic load. A plugin without timed events
// (event_create / event_record / event_synchronize / event_elapsed_ms) gets no session either:
// the trace has the ops without device activities.
#if __has_include(<IActivityProfiler.h>)
#define USE_KINETO 1
#define ANYCHIP_HAS_KINETO 1
#endif

#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device.h"

#ifdef ANYCHIP_HAS_KINETO
#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <ThreadUtil.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#endif

namespace anychip_torch {

std::atomic<bool> g_tracing{false};

namespace {

// one enqueued piece of work and its two events
struct Record {
    const char *name;           // the device activity's name
    const char *call;           // the plugin.h call that enqueued it (the host activity's name)
    TraceKind kind;
    int device;
    int64_t stream_id;          // torch's id of the stream (0: the device's default stream)
    void *stream;
    anychip_event start, end;
    int64_t host_start, host_end;   // the enqueue on the host clock (ns)
    uint64_t correlation;       // the innermost CPU op's correlation id (0: none)
    int32_t thread;
};

// a stream's anchor: an event recorded on the drained stream, and the host time it completed by
struct Anchor {
    anychip_event event;
    int64_t host_ns;
};

std::mutex g_mu;                                            // guards the two below
std::vector<Record> g_records;
std::map<std::pair<int, void *>, Anchor> g_anchors;         // by (device, stream handle)
thread_local std::vector<uint64_t> t_correlation;           // Kineto's correlation ids, innermost last

anychip_event new_event(int device)
{
    anychip_event ev = nullptr;
    check(g_plugin.event_create(device, &ev), "event_create", device);
    return ev;
}

// the anchor of (device, stream), made on first use; g_mu held
const Anchor &anchor(int device, void *stream)
{
    auto it = g_anchors.find({device, stream});
    if (it != g_anchors.end())
        return it->second;
    sync_stream(device, stream);
    anychip_event ev = new_event(device);
    check(g_plugin.event_record(device, ev, static_cast<anychip_stream>(stream)), "event_record", device);
    check(g_plugin.event_synchronize(device, ev), "event_synchronize", device);
    return g_anchors.emplace(std::make_pair(device, stream), Anchor{ev, c10::getTime()}).first->second;
}

// the events and anchors a session made, destroyed; g_mu held
void release_all()
{
    if (g_ready) {
        for (const Record &r : g_records) {
            g_plugin.event_destroy(r.device, r.start);
            g_plugin.event_destroy(r.device, r.end);
        }
        for (const auto &[key, a] : g_anchors)
            g_plugin.event_destroy(key.first, a.event);
    }
    g_records.clear();
    g_anchors.clear();
}

}  // namespace

TraceMark trace_begin(int device, void *stream)
{
    TraceMark m;
    if (!g_tracing.load(std::memory_order_relaxed))
        return m;
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_tracing.load())
        return m;
    anchor(device, stream);
    m.device = device;
    m.stream = stream;
    m.host_start = c10::getTime();
    m.start = new_event(device);
    check(g_plugin.event_record(device, m.start, static_cast<anychip_stream>(stream)), "event_record", device);
    return m;
}

void trace_end(const TraceMark &m, TraceKind kind, const char *name, const char *call)
{
    if (!m.start)
        return;
    anychip_event end = new_event(m.device);
    check(g_plugin.event_record(m.device, end, static_cast<anychip_stream>(m.stream)), "event_record", m.device);
    int64_t host_end = c10::getTime();
    int32_t thread = 0;
#ifdef ANYCHIP_HAS_KINETO
    thread = libkineto::systemThreadId();
#endif
    std::lock_guard<std::mutex> lock(g_mu);
    g_records.push_back(Record{name, call, kind, m.device, current_id(m.device), m.stream, m.start, end, m.host_start,
                               host_end, t_correlation.empty() ? 0 : t_correlation.back(), thread});
}

#ifdef ANYCHIP_HAS_KINETO

namespace {

using libkineto::ActivityType;

const std::set<ActivityType> kActivities{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                         ActivityType::GPU_MEMSET, ActivityType::PRIVATEUSE1_RUNTIME};

class Session final : public libkineto::IActivityProfilerSession {
  public:
    ~Session() override
    {
        g_tracing.store(false);
        std::lock_guard<std::mutex> lock(g_mu);
        release_all();
    }

    void start() override
    {
        {
            std::lock_guard<std::mutex> lock(g_mu);
            release_all();
        }
        start_ns_ = c10::getTime();
        g_tracing.store(true);
    }

    void stop() override
    {
        g_tracing.store(false);
        end_ns_ = c10::getTime();
    }

    std::vector<std::string> errors() override { return errors_; }

    void processTrace(libkineto::ActivityLogger &logger) override
    {
        processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity * { return nullptr; }, 0, 0);
    }

    void processTrace(libkineto::ActivityLogger &logger, libkineto::getLinkedActivityCallback linked, int64_t,
                      int64_t) override
    {
        buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
        buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "anychip");
        buffer_->gpuOpCount = 0;
        std::lock_guard<std::mutex> lock(g_mu);
        if (!g_ready) {
            g_records.clear();
            return;
        }
        for (const Record &r : g_records) {
            const Anchor &a = g_anchors.at({r.device, r.stream});
            float to_start = 0.f, to_end = 0.f;
            try {
                check(g_plugin.event_synchronize(r.device, r.end), "event_synchronize", r.device);
                check(g_plugin.event_elapsed_ms(r.device, &to_start, a.event, r.start), "event_elapsed_ms", r.device);
                check(g_plugin.event_elapsed_ms(r.device, &to_end, a.event, r.end), "event_elapsed_ms", r.device);
            } catch (const c10::Error &e) {
                errors_.push_back(e.what_without_backtrace());
                continue;
            }
            const libkineto::ITraceActivity *op = r.correlation ? linked(static_cast<int32_t>(r.correlation)) : nullptr;
            // the pair's own id (the flow's): the op's correlation id links them to the op (one op
            // may enqueue several pieces of work, each its own flow)
            const int32_t id = ++ids_;
            // the host side: the plugin.h call that enqueued the work, where the flow starts
            auto &host = add(ActivityType::PRIVATEUSE1_RUNTIME, r.call, r, op, id);
            host.startTime = r.host_start;
            host.endTime = r.host_end;
            host.device = static_cast<int32_t>(libkineto::processId());
            host.resource = r.thread;
            host.flow.start = 1;
            // the device side: when the stream ran it
            ActivityType type = r.kind == TraceKind::kernel ? ActivityType::CONCURRENT_KERNEL
                                : r.kind == TraceKind::memcpy ? ActivityType::GPU_MEMCPY
                                                              : ActivityType::GPU_MEMSET;
            auto &dev = add(type, r.name, r, op, id);
            dev.startTime = a.host_ns + static_cast<int64_t>(static_cast<double>(to_start) * 1e6);
            dev.endTime = std::max(dev.startTime, a.host_ns + static_cast<int64_t>(static_cast<double>(to_end) * 1e6));
            dev.device = r.device;
            dev.resource = static_cast<int32_t>(r.stream_id);
            dev.addMetadataQuoted("device", std::to_string(r.device));
            dev.addMetadataQuoted("stream", std::to_string(r.stream_id));
            streams_.insert({r.device, r.stream_id});
            ++buffer_->gpuOpCount;
        }
        for (const auto &act : buffer_->activities)
            act->log(logger);
        release_all();
    }

    std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }

    std::vector<libkineto::ResourceInfo> getResourceInfos() override
    {
        std::vector<libkineto::ResourceInfo> out;
        for (auto [device, id] : streams_)
            out.push_back({id, id, device, "anychip " + std::to_string(device) + " stream " + std::to_string(id)});
        return out;
    }

    std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

    // the innermost CPU op of this thread (torch pushes its correlation id as the op starts)
    void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
    void popCorrelationId() override
    {
        if (!t_correlation.empty())
            t_correlation.pop_back();
    }

  private:
    // (metadata through addMetadataQuoted only: addMetadata formats with fmt, whose compiled part
    // torch does not export)
    libkineto::GenericTraceActivity &add(ActivityType type, const char *name, const Record &r,
                                         const libkineto::ITraceActivity *op, int32_t id)
    {
        buffer_->emplace_activity(buffer_->span, type, std::string(name));
        auto &act = *buffer_->activities.back();
        act.id = id;
        act.threadId = r.thread;
        act.linked = op;
        act.flow.id = static_cast<uint32_t>(id);
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        return act;
    }

    int64_t start_ns_ = 0, end_ns_ = 0;
    int32_t ids_ = 0;
    std::vector<std::string> errors_;
    std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
    std::set<std::pair<int, int64_t>> streams_;
};

class Profiler final : public libkineto::IActivityProfiler {
  public:
    const std::string &name() const override { return name_; }
    const std::set<ActivityType> &availableActivities() const override { return kActivities; }

    std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType> &types,
                                                                   const libkineto::Config &) override
    {
        // the device's activities asked for (a CPU-only profile asks for none of these), on a
        // plugin that times its events
        bool device = types.count(ActivityType::CONCURRENT_KERNEL) || types.count(ActivityType::GPU_MEMCPY) ||
                      types.count(ActivityType::GPU_MEMSET);
        if (!device || !g_ready || !timed_events())
            return nullptr;
        return std::make_unique<Session>();
    }

    std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                   const std::set<ActivityType> &types,
                                                                   const libkineto::Config &config) override
    {
        return configure(types, config);
    }

  private:
    std::string name_{"anychip"};
};

}  // namespace

void register_activity_profiler()
{
    torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
        [] { return std::unique_ptr<libkineto::IActivityProfiler>(new Profiler()); });
}

#else

void register_activity_profiler() {}

#endif

}  // namespace anychip_torch
