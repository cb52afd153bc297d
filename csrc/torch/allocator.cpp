// The memory of anychip's PrivateUse1 device (see docs/torch.md; device.h lists the parts):
// device memory from anychip's caching allocator (one pool with anychip's own Buffers: a tensor's
// DataPtr holds its Buffer, and freeing the tensor drops it), pinned host memory, and the
// resizing of a storage. A Buffer is made by the allocator's compiled core (csrc/alloc/core.c,
// its Core.buffer, called from C: no Python code runs for a block it has cached); the Python
// side's callback (device, nbytes, stream id) -> (ptr, buffer) serves what the C path leaves to
// it (the device's allocator not made yet, a stream no longer usable).
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <pybind11/pybind11.h>

#include "anychip/plugin.h"
#include "device.h"

namespace py = pybind11;

namespace anychip_torch {
namespace {

// Python callbacks (set once by _init, never released: they live as long as the process)
PyObject *g_alloc = nullptr;         // (device, nbytes, stream id) -> (ptr, buffer)
PyObject *g_record = nullptr;        // (buffer, device, stream id) -> None
PyObject *g_stats = nullptr;         // (device, what) -> dict / None
PyObject *g_devices = nullptr;       // [anychip Device] by device index
PyObject *g_streams = nullptr;       // [[anychip Stream] by torch stream id] by device index
// attribute names the C path reads (interned once, under the GIL)
PyObject *g_s_allocator, *g_s_buffer, *g_s_block, *g_s_handle, *g_s_offset, *g_s_destroyed, *g_s_ptr;

// ---- memory ----------------------------------------------------------------------------

struct Allocation {
    PyObject *buffer;      // the anychip Buffer (owned reference)
    int device;
};

void free_allocation(void *ctx)
{
    auto *a = static_cast<Allocation *>(ctx);
    if (anychip_torch::python_usable()) {
        py::gil_scoped_acquire gil;
        Py_DECREF(a->buffer);   // anychip's allocator takes the block back (stream-ordered)
    }
    delete a;
}

// The C path: the Buffer of nbytes on (device, stream id) made by the device's allocator core
// (Device._allocator, whose compiled Core.buffer takes a cached block without running Python code
// and calls its Python slow path itself for the rest), as Device.alloc makes it, and its address.
// Returns nullptr with no Python error where the C path does not serve (the Python path then
// does, with its checks and errors), nullptr with the error set where the allocator raised.
PyObject *core_buffer(int device, size_t nbytes, c10::StreamId sid, uintptr_t *ptr)
{
    PyObject *streams = PyList_GET_ITEM(g_streams, device);
    if (sid < 0 || sid >= PyList_GET_SIZE(streams))
        return nullptr;
    PyObject *stream = PyList_GET_ITEM(streams, sid);
    PyObject *destroyed = PyObject_GetAttr(stream, g_s_destroyed);
    bool usable = destroyed == Py_False;
    Py_XDECREF(destroyed);
    PyObject *dev = PyList_GET_ITEM(g_devices, device);
    PyObject *core = usable ? PyObject_GetAttr(dev, g_s_allocator) : nullptr;
    if (core == nullptr || core == Py_None) {
        Py_XDECREF(core);
        PyErr_Clear();
        return nullptr;
    }
    PyObject *n = PyLong_FromSize_t(nbytes);
    PyObject *buffer = nullptr;
    if (n != nullptr) {
        PyObject *args[] = {core, dev, n, stream};
        buffer = PyObject_VectorcallMethod(g_s_buffer, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
        Py_DECREF(n);
    }
    Py_DECREF(core);
    if (buffer == nullptr)
        return nullptr;                                  // (the allocator's error, e.g. out of memory)
    // its address: the block's handle (a plugin.h library's device pointer) plus the offset
    PyObject *block = PyObject_GetAttr(buffer, g_s_block);
    PyObject *handle = block ? PyObject_GetAttr(block, g_s_handle) : nullptr;
    PyObject *offset = PyObject_GetAttr(buffer, g_s_offset);
    PyObject *address = handle && offset && PyLong_CheckExact(handle) && PyLong_CheckExact(offset)
                            ? PyNumber_Add(handle, offset) : PyObject_GetAttr(buffer, g_s_ptr);
    Py_XDECREF(block);
    Py_XDECREF(handle);
    Py_XDECREF(offset);
    if (address != nullptr && PyLong_Check(address))
        *ptr = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(address));
    Py_XDECREF(address);
    if (address == nullptr || PyErr_Occurred()) {
        Py_DECREF(buffer);
        return nullptr;
    }
    return buffer;
}

struct AnychipAllocator final : c10::DeviceAllocator {
    c10::DataPtr allocate(size_t nbytes) override
    {
        int device = current_device();
        check_index(device);
        c10::Device dev(kType, static_cast<c10::DeviceIndex>(device));
        if (nbytes == 0)
            return {nullptr, nullptr, &c10::detail::deleteNothing, dev};
        c10::StreamId sid = current_id(device);
        py::gil_scoped_acquire gil;
        uintptr_t address = 0;
        if (PyObject *buffer = core_buffer(device, nbytes, sid, &address))
            return {reinterpret_cast<void *>(address), new Allocation{buffer, device}, &free_allocation, dev};
        PyObject *res = PyErr_Occurred() ? nullptr
                                         : PyObject_CallFunction(g_alloc, "inL", device, static_cast<Py_ssize_t>(nbytes),
                                                                 static_cast<long long>(sid));
        if (res == nullptr) {
            // anychip's OutOfMemoryError becomes torch.OutOfMemoryError, with anychip's message
            bool oom = false;
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            std::string msg = "allocation failed";
            if (value) {
                PyObject *name = PyObject_GetAttrString(reinterpret_cast<PyObject *>(Py_TYPE(value)), "__name__");
                if (name) {
                    oom = std::string(PyUnicode_AsUTF8(name)) == "OutOfMemoryError";
                    Py_DECREF(name);
                }
                PyObject *s = PyObject_Str(value);
                if (s) {
                    msg = PyUnicode_AsUTF8(s);
                    Py_DECREF(s);
                }
            }
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            PyErr_Clear();
            if (oom)
                TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
            TORCH_CHECK(false, msg);
        }
        py::object pair = py::reinterpret_steal<py::object>(res);
        auto ptr = pair[py::int_(0)].cast<uintptr_t>();
        PyObject *buffer = pair[py::int_(1)].ptr();
        Py_INCREF(buffer);
        auto *ctx = new Allocation{buffer, device};
        return {reinterpret_cast<void *>(ptr), ctx, &free_allocation, dev};
    }

    c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

    void copy_data(void *dest, const void *src, std::size_t count) const override
    {
        int device = current_device();
        void *s = current_stream(device);
        check(g_plugin.copy_async ? g_plugin.copy_async(device, dest, src, count, ANYCHIP_COPY_D2D,
                                                                static_cast<anychip_stream>(s))
                                  : g_plugin.copy(device, dest, src, count, ANYCHIP_COPY_D2D),
              "copy (device to device)", device);
    }

    bool initialized() override { return g_ready; }

    void emptyCache(c10::MempoolId_t) override
    {
        require_ready();
        py::gil_scoped_acquire gil;
        for (int d = 0; d < g_count; ++d)
            py::reinterpret_borrow<py::object>(g_stats)(d, "empty_cache");
    }

    void recordStream(const c10::DataPtr &ptr, c10::Stream stream) override
    {
        if (ptr.get_deleter() != &free_allocation)
            return;
        auto *a = static_cast<Allocation *>(ptr.get_context());
        py::gil_scoped_acquire gil;
        py::reinterpret_borrow<py::object>(g_record)(py::handle(a->buffer), a->device, stream.id());
    }

    c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override
    {
        check_index(device);
        c10::CachingDeviceAllocator::DeviceStats out;
        py::gil_scoped_acquire gil;
        auto stats = py::reinterpret_borrow<py::object>(g_stats)(device, "stats").cast<py::dict>();
        auto get = [&](const std::string &key) -> int64_t {
            py::str k(key);
            return stats.contains(k) ? stats[k].cast<int64_t>() : 0;
        };
        auto fill = [&](c10::CachingDeviceAllocator::StatArray &arr, const std::string &name) {
            const char *pools[] = {"all", "small_pool", "large_pool"};
            for (int i = 0; i < 3; ++i) {
                std::string base = name + "." + pools[i] + ".";
                arr[i].current = get(base + "current");
                arr[i].peak = get(base + "peak");
                arr[i].allocated = get(base + "allocated");
                arr[i].freed = get(base + "freed");
            }
        };
        fill(out.allocation, "allocation");
        fill(out.segment, "segment");
        fill(out.active, "active");
        fill(out.inactive_split, "inactive_split");
        fill(out.allocated_bytes, "allocated_bytes");
        fill(out.reserved_bytes, "reserved_bytes");
        fill(out.active_bytes, "active_bytes");
        fill(out.inactive_split_bytes, "inactive_split_bytes");
        fill(out.requested_bytes, "requested_bytes");
        out.num_alloc_retries = get("num_alloc_retries");
        out.num_ooms = get("num_ooms");
        out.num_device_alloc = get("num_device_alloc");
        out.num_device_free = get("num_device_free");
        return out;
    }

    void resetAccumulatedStats(c10::DeviceIndex device) override
    {
        check_index(device);
        py::gil_scoped_acquire gil;
        py::reinterpret_borrow<py::object>(g_stats)(static_cast<int>(device), "reset_accumulated");
    }

    void resetPeakStats(c10::DeviceIndex device) override
    {
        check_index(device);
        py::gil_scoped_acquire gil;
        py::reinterpret_borrow<py::object>(g_stats)(static_cast<int>(device), "reset_peak");
    }

    std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override
    {
        check_index(device);
        size_t free = 0, total = 0;
        check(g_plugin.mem_info(device, &free, &total), "mem_info", device);
        return {free, total};
    }
};

AnychipAllocator g_allocator;

// ---- pinned host memory ---------------------------------------------------------------------
// plugin.h has no host-allocation entry, so pinned memory is the extension's own: page-aligned
// host memory, page-locked with mlock where RLIMIT_MEMLOCK allows. A non_blocking copy between
// it and the device is enqueued on the current stream and not waited for; an event recorded
// after it keeps the block from being freed (its deleter waits) before the copy is done.

struct PinnedBlock {
    size_t nbytes;
    bool locked;
    std::vector<std::pair<int, anychip_event>> uses;    // (device, event after a copy)
};

std::mutex g_pinned_mutex;
std::map<uintptr_t, PinnedBlock> g_pinned;               // start address -> block

// the block holding ptr (g_pinned_mutex held), or end()
std::map<uintptr_t, PinnedBlock>::iterator pinned_block(const void *ptr)
{
    auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = g_pinned.upper_bound(p);
    if (it == g_pinned.begin())
        return g_pinned.end();
    --it;
    return p < it->first + it->second.nbytes ? it : g_pinned.end();
}

}  // namespace

bool is_pinned(const void *ptr)
{
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    return pinned_block(ptr) != g_pinned.end();
}

namespace {

void free_pinned(void *ptr)
{
    PinnedBlock block{0, false, {}};
    {
        std::lock_guard<std::mutex> lock(g_pinned_mutex);
        auto it = g_pinned.find(reinterpret_cast<uintptr_t>(ptr));
        if (it == g_pinned.end())
            return;
        block = std::move(it->second);
        g_pinned.erase(it);
    }
    for (auto &[device, event] : block.uses) {      // copies still reading or writing it
        (void)g_plugin.event_synchronize(device, event);
        (void)g_plugin.event_destroy(device, event);
    }
    if (block.locked)
        munlock(ptr, block.nbytes);
    std::free(ptr);
}

struct PinnedAllocator final : c10::Allocator {
    c10::DataPtr allocate(size_t nbytes) override
    {
        if (nbytes == 0)
            return {nullptr, nullptr, &c10::detail::deleteNothing, c10::Device(c10::kCPU)};
        constexpr size_t page = 4096;
        size_t size = (nbytes + page - 1) / page * page;
        void *ptr = nullptr;
        TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&ptr, page, size) == 0,
                         "anychip pinned memory: cannot allocate ", nbytes, " bytes of host memory");
        bool locked = mlock(ptr, size) == 0;
        {
            std::lock_guard<std::mutex> lock(g_pinned_mutex);
            g_pinned[reinterpret_cast<uintptr_t>(ptr)] = PinnedBlock{size, locked, {}};
        }
        return {ptr, ptr, &free_pinned, c10::Device(c10::kCPU)};
    }

    c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }

    void copy_data(void *dest, const void *src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

PinnedAllocator g_pinned_allocator;

}  // namespace

bool can_record() { return g_plugin.copy_async && g_plugin.event_create && g_plugin.event_record &&
                           g_plugin.event_synchronize && g_plugin.event_destroy; }

// a copy touching the pinned block at host was enqueued on stream: an event after it (the
// block's completed uses are dropped meanwhile)
void record_pinned_use(const void *host, int device, void *stream)
{
    anychip_event event = nullptr;
    check(g_plugin.event_create(device, &event), "event_create", device);
    anychip_status st = g_plugin.event_record(device, event, static_cast<anychip_stream>(stream));
    if (st != 0) {
        (void)g_plugin.event_destroy(device, event);
        check(st, "event_record", device);
    }
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    auto it = pinned_block(host);
    if (it == g_pinned.end()) {     // (freed meanwhile by another thread: nothing to keep)
        (void)g_plugin.event_synchronize(device, event);
        (void)g_plugin.event_destroy(device, event);
        return;
    }
    auto &uses = it->second.uses;
    if (g_plugin.event_query) {
        std::vector<std::pair<int, anychip_event>> pending;
        for (auto &use : uses) {
            if (g_plugin.event_query(use.first, use.second) == 0)
                (void)g_plugin.event_destroy(use.first, use.second);
            else
                pending.push_back(use);
        }
        uses.swap(pending);
    }
    uses.emplace_back(device, event);
}

// ---- storage resizing --------------------------------------------------------------------

void resize_bytes(c10::StorageImpl *storage, size_t nbytes)
{
    TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
    size_t old = storage->nbytes();
    if (nbytes == old)
        return;
    int device = storage->device().index() < 0 ? current_device() : storage->device().index();
    c10::DeviceGuard guard(c10::Device(kType, static_cast<c10::DeviceIndex>(device)));
    c10::DataPtr fresh = g_allocator.allocate(nbytes);
    size_t keep = std::min(old, nbytes);
    if (keep && storage->data())
        raw_copy(device, fresh.get(), storage->data(), keep, ANYCHIP_COPY_D2D);
    storage->set_data_ptr_noswap(std::move(fresh));
    storage->set_nbytes(nbytes);
}

c10::DeviceAllocator *device_allocator() { return &g_allocator; }

c10::Allocator *pinned_allocator() { return &g_pinned_allocator; }

void init_allocator(PyObject *alloc, PyObject *record, PyObject *stats, PyObject *devices, PyObject *streams)
{
    g_alloc = alloc;
    g_record = record;
    g_stats = stats;
    g_devices = devices;
    g_streams = streams;
    g_s_allocator = PyUnicode_InternFromString("_allocator");
    g_s_buffer = PyUnicode_InternFromString("buffer");
    g_s_block = PyUnicode_InternFromString("_block");
    g_s_handle = PyUnicode_InternFromString("handle");
    g_s_offset = PyUnicode_InternFromString("_offset");
    g_s_destroyed = PyUnicode_InternFromString("_destroyed");
    g_s_ptr = PyUnicode_InternFromString("ptr");
}

PyObject *allocation_buffer(const c10::DataPtr &ptr)
{
    if (ptr.get_deleter() != &free_allocation)
        return nullptr;
    return static_cast<Allocation *>(ptr.get_context())->buffer;
}

}  // namespace anychip_torch
