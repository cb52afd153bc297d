// The device guard of anychip's PrivateUse1 device (see docs/torch.md; device.h lists the parts):
// the current device, the streams torch uses (anychip Streams, made by the Python side, whose
// native handles are the plugin's), and events.
#include <atomic>
#include <deque>
#include <mutex>
#include <vector>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>

#include "anychip/plugin.h"
#include "device.h"

namespace py = pybind11;

namespace anychip_torch {
namespace {

// ---- streams ---------------------------------------------------------------------------
// id 0 is the device's default stream; ids 1.. are streams made for torch (in creation
// order). The handles are anychip Streams' native handles.

std::mutex g_stream_mutex;
std::vector<std::deque<void *>> g_streams;             // per device: id -> handle
std::vector<std::vector<c10::StreamId>> g_pool;        // per device: pool of stream ids
std::vector<std::atomic<unsigned>> *g_pool_next = nullptr;
constexpr size_t kPoolSize = 4;
thread_local int t_device = 0;
thread_local std::vector<c10::StreamId> t_current;     // per device: current stream id

PyObject *g_new_stream = nullptr;    // (device) -> (stream id, native handle)

}  // namespace

void *stream_handle(int device, c10::StreamId id)
{
    std::lock_guard<std::mutex> lock(g_stream_mutex);
    auto &list = g_streams.at(device);
    TORCH_CHECK(id >= 0 && static_cast<size_t>(id) < list.size(), "anychip ", g_backend, ":", device,
                " has no stream with id ", id);
    return list[id];
}

c10::StreamId current_id(int device)
{
    if (t_current.size() <= static_cast<size_t>(device))
        return 0;
    return t_current[device];
}

void *current_stream(int device) { return stream_handle(device, current_id(device)); }

namespace {

c10::StreamId new_stream(int device)
{
    check_index(device);
    py::gil_scoped_acquire gil;
    py::object res = py::reinterpret_borrow<py::object>(g_new_stream)(device);
    auto pair = res.cast<std::pair<int64_t, uintptr_t>>();
    std::lock_guard<std::mutex> lock(g_stream_mutex);
    auto &list = g_streams.at(device);
    if (list.size() <= static_cast<size_t>(pair.first))
        list.resize(pair.first + 1, nullptr);
    list[pair.first] = reinterpret_cast<void *>(pair.second);
    return pair.first;
}

}  // namespace

void sync_stream(int device, void *stream)
{
    check(g_plugin.stream_synchronize(device, static_cast<anychip_stream>(stream)), "stream_synchronize", device);
}

int current_device() { return t_device; }

void *current_stream_of(int device, int64_t *id)
{
    *id = current_id(device);
    return stream_handle(device, *id);
}

void init_streams(int count, const std::vector<void *> &default_streams, PyObject *make_stream)
{
    g_streams.assign(count, {});
    g_pool.assign(count, std::vector<c10::StreamId>(kPoolSize, 0));
    g_pool_next = new std::vector<std::atomic<unsigned>>(count);
    for (int d = 0; d < count; ++d)
        g_streams[d].push_back(default_streams[d]);
    g_new_stream = make_stream;
}

namespace {

// ---- the device guard ----------------------------------------------------------------------

// a torch event: the plugin's event and its device, which plugin.h's event calls take and torch's
// query / synchronize / wait of an event do not give (it is not the current device's)
struct TorchEvent {
    anychip_event event;
    int device;
};

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
    c10::DeviceType type() const override { return kType; }

    c10::Device exchangeDevice(c10::Device d) const override
    {
        c10::Device old = getDevice();
        if (d.index() >= 0)
            setDevice(d);
        return old;
    }

    c10::Device getDevice() const override { return c10::Device(kType, static_cast<c10::DeviceIndex>(t_device)); }

    void setDevice(c10::Device d) const override
    {
        TORCH_CHECK(d.type() == kType, "the anychip device guard got a ", d.type(), " device");
        check_index(d.index());
        t_device = d.index();
    }

    void uncheckedSetDevice(c10::Device d) const noexcept override
    {
        if (d.index() >= 0)
            t_device = d.index();
    }

    c10::Stream getStream(c10::Device d) const override
    {
        int dev = d.index() < 0 ? t_device : d.index();
        return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(dev)), current_id(dev));
    }

    c10::Stream getDefaultStream(c10::Device d) const override
    {
        int dev = d.index() < 0 ? t_device : d.index();
        return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(dev)), 0);
    }

    c10::Stream getNewStream(c10::Device d, int priority) const override
    {
        (void)priority;
        int dev = d.index() < 0 ? t_device : d.index();
        return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(dev)), new_stream(dev));
    }

    c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override
    {
        (void)high_priority;
        int dev = d.index() < 0 ? t_device : d.index();
        check_index(dev);
        unsigned slot = (*g_pool_next)[dev]++ % kPoolSize;
        c10::StreamId id;
        {
            std::lock_guard<std::mutex> lock(g_stream_mutex);
            id = g_pool[dev][slot];
        }
        if (id == 0) {
            c10::StreamId made = new_stream(dev);
            std::lock_guard<std::mutex> lock(g_stream_mutex);
            if (g_pool[dev][slot] == 0)
                g_pool[dev][slot] = made;
            id = g_pool[dev][slot];
        }
        return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(dev)), id);
    }

    c10::Stream exchangeStream(c10::Stream s) const override
    {
        int dev = s.device_index() < 0 ? t_device : s.device_index();
        c10::Stream old = getStream(c10::Device(kType, static_cast<c10::DeviceIndex>(dev)));
        if (t_current.size() <= static_cast<size_t>(dev))
            t_current.resize(dev + 1, 0);
        stream_handle(dev, s.id());      // checks the id
        t_current[dev] = s.id();
        return old;
    }

    void *getStreamNativeHandle(const c10::Stream s) const override { return stream_handle(s.device_index(), s.id()); }

    bool has_events() const
    {
        return g_plugin.event_create && g_plugin.event_destroy && g_plugin.event_record && g_plugin.event_synchronize;
    }

    void destroyEvent(void *event, const c10::DeviceIndex device) const noexcept override
    {
        (void)device;
        auto *e = static_cast<TorchEvent *>(event);
        if (e && has_events())
            g_plugin.event_destroy(e->device, e->event);
        delete e;
    }

    void record(void **event, const c10::Stream &stream, const c10::DeviceIndex device,
                const c10::EventFlag flag) const override
    {
        (void)flag;
        int dev = stream.device_index();
        TORCH_CHECK(device == -1 || device == dev, "an event of anychip:", device, " cannot be recorded on a stream of anychip:",
                    dev);
        void *s = stream_handle(dev, stream.id());
        if (!has_events()) {     // plugin.h's fallback: recording waits for the stream
            sync_stream(dev, s);
            return;
        }
        if (*event == nullptr) {
            anychip_event ev = nullptr;
            check(g_plugin.event_create(dev, &ev), "event_create", dev);
            *event = new TorchEvent{ev, dev};
        }
        auto *e = static_cast<TorchEvent *>(*event);
        TORCH_CHECK(e->device == dev, "an event of anychip:", e->device, " cannot be recorded on a stream of anychip:", dev);
        check(g_plugin.event_record(dev, e->event, static_cast<anychip_stream>(s)), "event_record", dev);
    }

    // work enqueued on `stream` from now on waits for the event: on the stream where the event is of
    // the stream's device (plugin.h's stream_wait_event takes one device), else the host waits for it
    void block(void *event, const c10::Stream &stream) const override
    {
        if (event == nullptr)
            return;
        auto *e = static_cast<TorchEvent *>(event);
        int dev = stream.device_index();
        void *s = stream_handle(dev, stream.id());
        if (g_plugin.stream_wait_event && e->device == dev)
            check(g_plugin.stream_wait_event(dev, static_cast<anychip_stream>(s), e->event), "stream_wait_event", dev);
        else
            check(g_plugin.event_synchronize(e->device, e->event), "event_synchronize", e->device);
    }

    bool queryEvent(void *event) const override
    {
        if (event == nullptr)
            return true;
        auto *e = static_cast<TorchEvent *>(event);
        if (!g_plugin.event_query) {
            check(g_plugin.event_synchronize(e->device, e->event), "event_synchronize", e->device);
            return true;
        }
        anychip_status st = g_plugin.event_query(e->device, e->event);
        if (st == g_plugin.not_ready_status && st != 0)
            return false;
        check(st, "event_query", e->device);
        return true;
    }

    c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(g_count); }

    bool queryStream(const c10::Stream &stream) const override
    {
        int dev = stream.device_index();
        void *s = stream_handle(dev, stream.id());
        if (!g_plugin.stream_query) {
            sync_stream(dev, s);
            return true;
        }
        anychip_status st = g_plugin.stream_query(dev, static_cast<anychip_stream>(s));
        if (st == g_plugin.not_ready_status && st != 0)
            return false;
        check(st, "stream_query", dev);
        return true;
    }

    void synchronizeStream(const c10::Stream &stream) const override
    {
        int dev = stream.device_index();
        sync_stream(dev, stream_handle(dev, stream.id()));
    }

    void synchronizeEvent(void *event) const override
    {
        if (event == nullptr)
            return;
        auto *e = static_cast<TorchEvent *>(event);
        check(g_plugin.event_synchronize(e->device, e->event), "event_synchronize", e->device);
    }

    void synchronizeDevice(const c10::DeviceIndex device) const override
    {
        int dev = device < 0 ? t_device : device;
        check_index(dev);
        if (g_plugin.device_synchronize) {
            check(g_plugin.device_synchronize(dev), "device_synchronize", dev);
            return;
        }
        std::vector<void *> all;
        {
            std::lock_guard<std::mutex> lock(g_stream_mutex);
            all.assign(g_streams[dev].begin(), g_streams[dev].end());
        }
        for (void *s : all)
            sync_stream(dev, s);
    }

    void recordDataPtrOnStream(const c10::DataPtr &ptr, const c10::Stream &stream) const override
    {
        device_allocator()->recordStream(ptr, stream);
    }

    // torch.accelerator.get_device_capability: every dtype but the quantized ones (the device
    // stores any dense dtype and computes it with the CPU's kernels; it has no quantized tensors)
    c10::DeviceCapability getDeviceCapability(c10::Device) const override
    {
        c10::DeviceCapability cap;
        auto &types = cap.capability_data.supported_scalar_types;
        types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = types.has_QUInt4x2 = types.has_QUInt2x4 = 0;
        return cap;
    }

    double elapsedTime(void *start, void *end, const c10::DeviceIndex device) const override
    {
        (void)device;
        TORCH_CHECK(start && end, "elapsed_time needs two recorded events");
        TORCH_CHECK(g_plugin.event_elapsed_ms, "anychip ", g_backend, " offers no event timing (event_elapsed_ms)");
        auto *a = static_cast<TorchEvent *>(start), *b = static_cast<TorchEvent *>(end);
        TORCH_CHECK(a->device == b->device, "elapsed_time needs two events of one device, got anychip:", a->device,
                    " and anychip:", b->device);
        float ms = 0;
        check(g_plugin.event_synchronize(b->device, b->event), "event_synchronize", b->device);
        check(g_plugin.event_elapsed_ms(b->device, &ms, a->event, b->event), "event_elapsed_ms", b->device);
        return ms;
    }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace
}  // namespace anychip_torch
