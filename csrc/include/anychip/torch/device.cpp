// anychip's chips as PyTorch's PrivateUse1 device (see docs/torch.md).
//
// One anychip/plugin.h library serves the device: its table (anychip_plugin_init) gives
// streams, events, copies and fills. Memory comes from anychip's caching allocator (one
// pool with anychip's own Buffers): the Python side (anychip/torch/__init__.py) hands
// in callbacks that allocate a Buffer on a given stream and record a Buffer on a stream;
// a tensor's DataPtr holds its Buffer, and freeing the tensor drops it. Streams are
// anychip Streams too: the Python side creates them and passes their native handles,
// which are the plugin's handles (the plugin face and anychip's runtime share one
// library instance in the process).
//
// Compute ops run on the CPU through at::native::cpu_fallback: the inputs are copied to
// the host, the CPU kernel runs, the outputs are copied back; a few run on the chip's own
// kernels where the library has plugin.h's kernel table (minor 1; "the chip's kernels" below).
#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>
#include <torch/library.h>

#include "anychip/plugin.h"
#include "anychip/torch/device.h"

namespace py = pybind11;

namespace anychip_torch {
anychip_plugin g_plugin;
}  // namespace anychip_torch

namespace {

using anychip_torch::g_plugin;
constexpr auto kType = c10::DeviceType::PrivateUse1;

// ---- the plugin ------------------------------------------------------------------------

std::string g_backend = "anychip";
int g_count = 0;
bool g_ready = false;

// Python callbacks (set once by _init, never released: they live as long as the process)
PyObject *g_alloc = nullptr;         // (device, nbytes, stream id) -> (ptr, buffer)
PyObject *g_record = nullptr;        // (buffer, device, stream id) -> None
PyObject *g_new_stream = nullptr;    // (device) -> (stream id, native handle)
PyObject *g_stats = nullptr;         // (device, what) -> dict / None

std::string status_text(anychip_status st)
{
    std::string text = "status " + std::to_string(st);
    if (g_plugin.get_error_string) {
        const char *s = g_plugin.get_error_string(st);
        if (s && *s)
            text += std::string(" (") + s + ")";
    }
    if (g_plugin.get_last_error) {
        const char *d = g_plugin.get_last_error();
        if (d && *d)
            text += std::string(": ") + d;
    }
    return text;
}

// Set in a process forked from one that set the device up (pthread_atfork): the parent's device
// memory, streams and the plugin's state do not survive fork(), as CUDA's do not; every use of the
// device there is refused saying so, rather than failing on a stale stream or pointer.
std::atomic<bool> g_forked{false};

void refuse_in_forked_child()
{
    TORCH_CHECK(!g_forked.load(std::memory_order_relaxed), "anychip ", g_backend,
                ": this is a forked child of the process that set up the anychip device (import anychip.torch): "
                "its device memory, tensors and streams do not survive fork(); use the 'spawn' start method "
                "(multiprocessing.get_context('spawn'), torch.multiprocessing.set_start_method('spawn'))");
}

void check(anychip_status st, const char *what, int device)
{
    if (st != 0)
        refuse_in_forked_child();
    TORCH_CHECK(st == 0, "anychip ", g_backend, ":", device, ": ", what, " failed: ", status_text(st));
}

void require_ready()
{
    refuse_in_forked_child();
    TORCH_CHECK(g_ready, "the anychip device is not initialized: import anychip.torch first");
}

void check_index(int device)
{
    require_ready();
    TORCH_CHECK(device >= 0 && device < g_count, "anychip device index ", device, " is out of range: ",
                g_backend, " has ", g_count, " device(s) here (0..", g_count - 1, ")");
}

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

struct AnychipAllocator final : c10::DeviceAllocator {
    c10::DataPtr allocate(size_t nbytes) override
    {
        int device = t_device;
        check_index(device);
        c10::Device dev(kType, static_cast<c10::DeviceIndex>(device));
        if (nbytes == 0)
            return {nullptr, nullptr, &c10::detail::deleteNothing, dev};
        c10::StreamId sid = current_id(device);
        py::gil_scoped_acquire gil;
        PyObject *res = PyObject_CallFunction(g_alloc, "inL", device, static_cast<Py_ssize_t>(nbytes),
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
        int device = t_device;
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

bool is_pinned(const void *ptr)
{
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    return pinned_block(ptr) != g_pinned.end();
}

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

// ---- copies ----------------------------------------------------------------------------

void sync_stream(int device, void *stream)
{
    check(g_plugin.stream_synchronize(device, static_cast<anychip_stream>(stream)), "stream_synchronize", device);
}

// nbytes between host and device (or within one device) on the device's current stream;
// host memory is not kept alive, so a copy touching the host is waited for
void raw_copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind)
{
    if (nbytes == 0)
        return;
    void *s = current_stream(device);
    const char *what = kind == ANYCHIP_COPY_H2D ? "copy (host to device)"
                       : kind == ANYCHIP_COPY_D2H ? "copy (device to host)" : "copy (device to device)";
    if (g_plugin.copy_async) {
        check(g_plugin.copy_async(device, dst, src, nbytes, kind, static_cast<anychip_stream>(s)), what, device);
        if (kind != ANYCHIP_COPY_D2D)
            sync_stream(device, s);
    } else {
        sync_stream(device, s);
        check(g_plugin.copy(device, dst, src, nbytes, kind), what, device);
    }
}

// a copy between the host and the device: with non_blocking and pinned host memory, enqueued
// on the current stream and not waited for (ordered with the stream's work); else raw_copy
void host_copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind, bool non_blocking)
{
    const void *host = kind == ANYCHIP_COPY_H2D ? src : dst;
    if (!non_blocking || nbytes == 0 || !can_record() || !is_pinned(host)) {
        raw_copy(device, dst, src, nbytes, kind);
        return;
    }
    void *s = current_stream(device);
    check(g_plugin.copy_async(device, dst, src, nbytes, kind, static_cast<anychip_stream>(s)),
          kind == ANYCHIP_COPY_H2D ? "copy (pinned host to device)" : "copy (device to pinned host)", device);
    record_pinned_use(host, device, s);
}

int dev_index(const at::Tensor &t) { return t.device().index() < 0 ? t_device : t.device().index(); }

// elements from the first to the last one the tensor addresses (strides are >= 0)
int64_t span_of(const at::Tensor &t)
{
    if (t.numel() == 0)
        return 0;
    int64_t span = 1;
    for (int64_t i = 0; i < t.dim(); ++i)
        span += (t.size(i) - 1) * t.stride(i);
    return span;
}

bool dense(const at::Tensor &t) { return t.is_non_overlapping_and_dense(); }

// the lazy conjugate and negative bits of `like` on a host view of the same memory
at::Tensor with_bits(at::Tensor host, const at::Tensor &like)
{
    if (like.is_conj())
        host = at::_conj(host);
    if (like.is_neg())
        host = at::_neg_view(host);
    return host;
}

// a host tensor with the device tensor's sizes, strides, bits and values
at::Tensor download(const at::Tensor &t)
{
    int64_t span = span_of(t);
    at::Tensor host = at::empty({span}, t.options().device(c10::kCPU));
    raw_copy(dev_index(t), host.data_ptr(), t.data_ptr(), span * t.element_size(), ANYCHIP_COPY_D2H);
    return with_bits(host.as_strided(t.sizes(), t.strides(), 0), t);
}

// writes host values (any layout and dtype) into a device tensor (any layout)
void upload(const at::Tensor &dst, const at::Tensor &src)
{
    int device = dev_index(dst);
    if (dst.numel() == 0)
        return;
    if (dense(dst)) {      // every element of the span is the tensor's: write it whole
        at::Tensor host = with_bits(at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(c10::kCPU)), dst);
        host.copy_(src);
        raw_copy(device, dst.data_ptr(), host.data_ptr(), dst.numel() * dst.element_size(), ANYCHIP_COPY_H2D);
        return;
    }
    at::Tensor host = download(dst);       // the span holds other tensors' elements: read, modify, write
    host.copy_(src);
    raw_copy(device, dst.data_ptr(), host.data_ptr(), span_of(dst) * dst.element_size(), ANYCHIP_COPY_H2D);
}

bool same_layout(const at::Tensor &a, const at::Tensor &b)
{
    return a.dtype() == b.dtype() && a.sizes().equals(b.sizes()) && a.strides().equals(b.strides()) && dense(a) &&
           a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg();
}

at::Tensor copy_from(const at::Tensor &self, const at::Tensor &dst, bool non_blocking)
{
    refuse_in_forked_child();
    require_ready();
    // (a source of another shape broadcasts: it goes through the host, where copy_ expands it)
    if (dst.numel() == 0)
        return dst;
    bool from_dev = self.device().type() == kType, to_dev = dst.device().type() == kType;
    if (from_dev && to_dev) {
        int sd = dev_index(self), dd = dev_index(dst);
        if (same_layout(self, dst)) {
            size_t nbytes = self.numel() * self.element_size();
            if (sd == dd) {
                c10::DeviceGuard guard(dst.device());
                raw_copy(dd, dst.data_ptr(), self.data_ptr(), nbytes, ANYCHIP_COPY_D2D);
                return dst;
            }
            if (g_plugin.copy_peer) {     // ordered after both devices' earlier work, then waited for
                sync_stream(dd, current_stream(dd));
                void *s = current_stream(sd);
                check(g_plugin.copy_peer(dd, dst.data_ptr(), sd, self.data_ptr(), nbytes,
                                         static_cast<anychip_stream>(s)), "copy_peer", sd);
                sync_stream(sd, s);
                return dst;
            }
        }
        upload(dst, download(self));       // another layout, dtype or device: through the host
        return dst;
    }
    if (from_dev) {        // device -> host
        if (same_layout(self, dst)) {
            host_copy(dev_index(self), dst.data_ptr(), self.data_ptr(), self.numel() * self.element_size(),
                      ANYCHIP_COPY_D2H, non_blocking);
        } else {
            dst.copy_(download(self));
        }
        return dst;
    }
    TORCH_CHECK(to_dev, "_copy_from on the anychip device got ", self.device(), " -> ", dst.device());
    if (same_layout(self, dst)) {          // host -> device
        host_copy(dev_index(dst), dst.data_ptr(), self.data_ptr(), self.numel() * self.element_size(),
                  ANYCHIP_COPY_H2D, non_blocking);
    } else {
        upload(dst, self);
    }
    return dst;
}

// ---- storage resizing --------------------------------------------------------------------

void resize_bytes(c10::StorageImpl *storage, size_t nbytes)
{
    TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
    size_t old = storage->nbytes();
    if (nbytes == old)
        return;
    int device = storage->device().index() < 0 ? t_device : storage->device().index();
    c10::DeviceGuard guard(c10::Device(kType, static_cast<c10::DeviceIndex>(device)));
    c10::DataPtr fresh = g_allocator.allocate(nbytes);
    size_t keep = std::min(old, nbytes);
    if (keep && storage->data())
        raw_copy(device, fresh.get(), storage->data(), keep, ANYCHIP_COPY_D2D);
    storage->set_data_ptr_noswap(std::move(fresh));
    storage->set_nbytes(nbytes);
}

// ---- the chip's kernels: plugin.h's kernel table ------------------------------------------------
// A library of plugin.h minor 1 may hand a kernel table (plugin.h, "KERNELS"): the simulated
// chips' faces fill it with the simulator's kernels (csrc/sim/kernels.c), a C plugin with its
// own. The ops below run on it where the operands fit an entry and its dtype mask, enqueued on
// the current stream and run over device memory, in order with the stream's copies; anything
// else takes the CPU kernel through the fallback. ANYCHIP_TORCH_KERNELS=0 turns them off; =all
// adds mm and float sums, whose values round differently from the CPU's.

const anychip_kernels *g_kernels = nullptr;
// ANYCHIP_TORCH_KERNELS=all: also the ops whose float results round differently from the CPU's
// (mm: the chip's GEMM accumulates in its own order; float sums: in double, rounded once)
bool g_all_kernels = false;
enum Entry { K_BINARY, K_UNARY, K_REDUCE, K_GEMM, K_FILL, K_ENTRIES };
const char *const kEntryNames[K_ENTRIES] = {"binary", "unary", "reduce", "gemm", "fill"};
std::atomic<int64_t> g_launches[K_ENTRIES];

int kernel_dtype(at::ScalarType t)      // plugin.h's anychip_dtype; -1: none
{
    switch (t) {
    case at::kChar: return ANYCHIP_INT8;
    case at::kByte: return ANYCHIP_UINT8;
    case at::kInt: return ANYCHIP_INT32;
    case at::kLong: return ANYCHIP_INT64;
    case at::kHalf: return ANYCHIP_FLOAT16;
    case at::kBFloat16: return ANYCHIP_BFLOAT16;
    case at::kFloat: return ANYCHIP_FLOAT32;
    case at::kDouble: return ANYCHIP_FLOAT64;
    case at::kBool: return ANYCHIP_BOOL;
    default: return -1;
    }
}

// whether the table's `entry` is set and its mask takes dtype `dt`
bool takes(Entry entry, int dt)
{
    if (!g_kernels || dt < 0)
        return false;
    const void *fn = entry == K_BINARY ? reinterpret_cast<const void *>(g_kernels->binary)
                     : entry == K_UNARY ? reinterpret_cast<const void *>(g_kernels->unary)
                     : entry == K_REDUCE ? reinterpret_cast<const void *>(g_kernels->reduce)
                     : entry == K_GEMM ? reinterpret_cast<const void *>(g_kernels->gemm)
                                       : reinterpret_cast<const void *>(g_kernels->fill);
    uint32_t mask = entry == K_BINARY ? g_kernels->binary_dtypes
                    : entry == K_UNARY ? g_kernels->unary_dtypes
                    : entry == K_REDUCE ? g_kernels->reduce_dtypes
                    : entry == K_GEMM ? g_kernels->gemm_dtypes
                                      : g_kernels->fill_dtypes;
    return fn && ((mask >> dt) & 1u);
}

bool is_float_dtype(int dt) { return dt >= ANYCHIP_FLOAT16 && dt <= ANYCHIP_FLOAT64; }

// an operand a kernel reads as it is: on an anychip device, no lazy conjugate / negative bit
bool plain(const at::Tensor &t) { return t.device().type() == kType && !t.is_conj() && !t.is_neg(); }

// the device made current for an entry's call, and its stream
anychip_stream kernel_stream(int device)
{
    if (g_plugin.set_device)
        check(g_plugin.set_device(device), "set_device", device);
    return static_cast<anychip_stream>(current_stream(device));
}

void launched(Entry entry, anychip_status st, int device)
{
    check(st, (std::string("the kernel table's ") + kEntryNames[entry]).c_str(), device);
    ++g_launches[entry];
}

// ---- kernels -----------------------------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format)
{
    (void)layout;
    (void)pin_memory;
    c10::DeviceGuard guard(device.value_or(c10::Device(kType, static_cast<c10::DeviceIndex>(t_device))));
    return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                     c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory)
{
    (void)layout;
    (void)pin_memory;
    c10::DeviceGuard guard(device.value_or(c10::Device(kType, static_cast<c10::DeviceIndex>(t_device))));
    return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                             c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor &self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset)
{
    return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor &self, c10::SymIntArrayRef size) { return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size)); }

at::Tensor reshape_alias(const at::Tensor &self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride)
{
    return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor &resize_(const at::Tensor &self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format)
{
    auto *impl = self.unsafeGetTensorImpl();
    auto sizes = C10_AS_INTARRAYREF_SLOW(size);
    impl->set_sizes_contiguous(sizes);
    size_t needed = at::detail::computeStorageNbytesContiguous(sizes, impl->dtype().itemsize(),
                                                               impl->storage_offset());
    if (needed > impl->storage().nbytes())
        resize_bytes(impl->storage().unsafeGetStorageImpl(), needed);
    if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve)
        impl->empty_tensor_restride(*memory_format);
    return self;
}

at::Tensor copy_from_and_resize(const at::Tensor &self, const at::Tensor &dst)
{
    if (!dst.sizes().equals(self.sizes()))
        dst.resize_(self.sizes());
    return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor &self)
{
    TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
    return at::_local_scalar_dense(download(self));
}

at::Tensor &set_source_storage_offset(at::Tensor &self, at::Storage source, c10::SymInt storage_offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride)
{
    int64_t offset = storage_offset.expect_int();
    auto sizes = C10_AS_INTARRAYREF_SLOW(size);
    auto strides = C10_AS_INTARRAYREF_SLOW(stride);
    at::native::checkSetStorage(self, source, offset, sizes, strides);
    self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
    self.unsafeGetTensorImpl()->set_storage_offset(offset);
    c10::DimVector contiguous;
    if (strides.data() == nullptr) {
        contiguous = c10::contiguous_strides(sizes);
        strides = contiguous;
    }
    size_t needed = at::detail::computeStorageNbytes(sizes, strides, self.dtype().itemsize(), offset);
    if (needed > self.storage().nbytes())
        resize_bytes(self.storage().unsafeGetStorageImpl(), needed);
    self.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
    return self;
}

at::Tensor &set_source_storage(at::Tensor &self, at::Storage source)
{
    int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
    std::vector<c10::SymInt> size{c10::SymInt(n)};
    std::vector<c10::SymInt> stride{c10::SymInt(1)};
    return set_source_storage_offset(self, std::move(source), c10::SymInt(0), size, stride);
}

at::Tensor &set_source_tensor(at::Tensor &self, const at::Tensor &source)
{
    if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl())
        return self;
    return set_source_storage_offset(self, source.storage(), c10::SymInt(source.storage_offset()),
                                     source.sym_sizes(), source.sym_strides());
}

at::Tensor &set_empty(at::Tensor &self)
{
    c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, true);
    std::vector<c10::SymInt> size{c10::SymInt(0)};
    std::vector<c10::SymInt> stride{c10::SymInt(1)};
    return set_source_storage_offset(self, std::move(storage), c10::SymInt(0), size, stride);
}

at::Tensor &fill_scalar(at::Tensor &self, const at::Scalar &value)
{
    if (self.numel() == 0)
        return self;
    if (dense(self)) {
        // one element's bytes; a fill of one repeated byte (0, -1, ...) is a memset on the stream
        at::Tensor one = at::full({1}, value, self.options().device(c10::kCPU));
        auto *b = static_cast<const unsigned char *>(one.data_ptr());
        bool uniform = true;
        for (int64_t i = 1; i < one.element_size(); ++i)
            uniform = uniform && b[i] == b[0];
        int device = dev_index(self);
        size_t nbytes = self.numel() * self.element_size();
        if (uniform && g_plugin.fill_async) {
            check(g_plugin.fill_async(device, self.data_ptr(), b[0], nbytes,
                                      static_cast<anychip_stream>(current_stream(device))), "fill_async", device);
            return self;
        }
        int dt = kernel_dtype(self.scalar_type());
        if (takes(K_FILL, dt)) {
            // the value as the CPU converted it (one element of the dtype), which the kernel's
            // conversion then keeps exactly: the bits are the CPU's
            bool fl = is_float_dtype(dt);
            double fvalue = fl ? one.to(at::kDouble).item<double>() : 0.0;
            int64_t ivalue = fl ? 0 : one.to(at::kLong).item<int64_t>();
            launched(K_FILL, g_kernels->fill(device, kernel_stream(device), static_cast<anychip_dtype>(dt),
                                             self.numel(), self.data_ptr(), fvalue, ivalue, 0), device);
            return self;
        }
        at::Tensor host = at::full({self.numel()}, value, self.options().device(c10::kCPU));
        raw_copy(device, self.data_ptr(), host.data_ptr(), nbytes, ANYCHIP_COPY_H2D);
        return self;
    }
    at::Tensor host = download(self);
    host.fill_(value);
    upload(self, host);
    return self;
}

at::Tensor &zero(at::Tensor &self) { return fill_scalar(self, 0); }

void record_stream(at::Tensor &self, c10::Stream stream)
{
    g_allocator.recordStream(self.storage().data_ptr(), stream);
}

// convolution on a backend other than CPU / CUDA / MKLDNN dispatches to the "overrideable"
// pair, whose CPU kernels only throw: run at::convolution and its backward on the host
at::Tensor host(const at::Tensor &t) { return t.defined() ? t.cpu() : t; }

at::Tensor convolution_overrideable(const at::Tensor &input, const at::Tensor &weight,
                                    const std::optional<at::Tensor> &bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups)
{
    std::optional<at::Tensor> b;
    if (bias.has_value() && bias->defined())
        b = host(*bias);
    at::Tensor out = at::convolution(host(input), host(weight), b, stride, padding, dilation, transposed,
                                     output_padding, groups);
    return out.to(input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor &grad_output, const at::Tensor &input, const at::Tensor &weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask)
{
    std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
    auto grads = at::convolution_backward(host(grad_output), host(input), host(weight), bias_sizes, stride, padding,
                                          dilation, transposed, output_padding, groups, output_mask);
    auto back = [&](const at::Tensor &t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(std::get<0>(grads)), back(std::get<1>(grads)), back(std::get<2>(grads))};
}

// The devices of an op's tensor arguments, by CUDA's rule: the anychip tensors on one device,
// with CPU tensors only as 0-dim inputs (scalars) and as indices (a Tensor?[] list, which torch
// moves to the device); any other CPU tensor is refused with torch's usual error. Returns the
// anychip device, if any tensor is on one.
std::optional<c10::Device> check_devices(const c10::FunctionSchema &schema, const torch::jit::Stack &stack)
{
    const auto &args = schema.arguments();
    size_t begin = stack.size() - args.size();
    std::optional<c10::Device> device;
    bool cpu = false;           // a CPU tensor other than a 0-dim input or an index
    auto see = [&](const at::Tensor &t, bool written, bool index) {
        if (!t.defined())
            return;
        if (t.device().type() == kType) {
            if (!device)
                device = t.device();
            TORCH_CHECK(t.device() == *device, "Expected all tensors to be on the same device, but found at least "
                        "two devices, ", *device, " and ", t.device(), "!");
        } else if (t.device().is_cpu() && !index && (t.dim() > 0 || written)) {
            cpu = true;
        }
    };
    for (size_t i = 0; i < args.size(); ++i) {
        const c10::IValue &v = stack[begin + i];
        bool written = args[i].alias_info() && args[i].alias_info()->isWrite();
        if (v.isTensor()) {
            see(v.toTensor(), written, false);
        } else if (v.isTensorList()) {
            for (const at::Tensor &t : v.toTensorList())
                see(t, written, false);
        } else if (v.isOptionalTensorList()) {
            for (const std::optional<at::Tensor> &t : v.toOptionalTensorList())
                if (t.has_value())
                    see(*t, written, true);
        }
    }
    TORCH_CHECK(!(device && cpu), "Expected all tensors to be on the same device, but found at least two devices, ",
                *device, " and cpu!");
    return device;
}

// The CPU kernel of every op without a device one. A view op's result must share its input's
// memory, which a CPU result copied back cannot: writes through it would be lost. The view ops
// torch has no generic (CompositeExplicitAutograd) kernel for are registered below with their
// as_strided-based native kernels; a view op still reaching here (sparse, nested) is refused.
// torch's fallback returns the results to its first tensor argument's device (unless the op has
// a device argument), which for `2 - t` or `where(cpu_scalar, t, u)` is the CPU's: they go to the
// anychip device of the other arguments, as on CUDA.
void cpu_fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack)
{
    const c10::FunctionSchema &schema = op.schema();
    for (const auto &ret : schema.returns()) {
        const c10::AliasInfo *alias = ret.alias_info();
        TORCH_CHECK(alias == nullptr || alias->isWrite(), schema.operator_name(),
                    " is a view op (its result shares its input's memory) with no implementation on the anychip "
                    "device: the CPU fallback would return a copy, so writes through it would be lost");
    }
    std::optional<c10::Device> device = check_devices(schema, *stack);
    bool device_arg = false;
    for (size_t i = 0, begin = stack->size() - schema.arguments().size(); i < schema.arguments().size(); ++i)
        device_arg = device_arg || (*stack)[begin + i].isDevice();
    at::native::cpu_fallback(op, stack);
    if (!device || device_arg)
        return;
    size_t nret = schema.returns().size(), begin = stack->size() - nret;
    auto place = [&](const at::Tensor &t) { return t.defined() && t.device().is_cpu() ? t.to(*device) : t; };
    for (size_t i = 0; i < nret; ++i) {
        c10::IValue &v = (*stack)[begin + i];
        if (schema.returns()[i].alias_info())      // (an input written in place: where it was)
            continue;
        if (v.isTensor()) {
            v = place(v.toTensor());
        } else if (v.isTensorList()) {
            c10::List<at::Tensor> list = v.toTensorList();
            for (size_t k = 0; k < list.size(); ++k)
                list.set(k, place(list.get(k)));
            v = list;
        }
    }
}

// module.to(device) keeps each Parameter object, so that tied ones stay one (param.data = moved),
// only where torch calls the two tensors' types compatible; its list of dense backends lacks
// PrivateUse1, so a CPU parameter moved here would become a new Parameter per module
bool has_compatible_shallow_copy_type(const at::Tensor &self, const at::Tensor &from)
{
    auto dense = [](c10::DispatchKeySet ks) {
        return ks.has(c10::DispatchKey::CPU) || ks.has(c10::DispatchKey::PrivateUse1);
    };
    return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
           (dense(self.key_set()) && dense(from.key_set()));
}

// ---- ops on the chip's kernels (the table above) ------------------------------------------------
// Each takes the kernel where its operands fit: on one anychip device, one dtype the entry's mask
// takes (no type promotion), contiguous inputs (broadcasting included; the result is contiguous,
// as the CPU's is for such inputs), at most ANYCHIP_KERNEL_MAX_DIMS dimensions. The values are
// the CPU's bit for bit (one IEEE operation per element, half types rounded once, integers wrap),
// but for mm and float sums, which only ANYCHIP_TORCH_KERNELS=all puts on the chip.

constexpr int kMaxDims = ANYCHIP_KERNEL_MAX_DIMS;
const int64_t kOne = 1;          // what a 0-d operand passes for its shape and strides (never read)

at::Tensor device_binary(anychip_binary_op op, const at::Tensor &a, const at::Tensor &b)
{
    at::ScalarType st = a.scalar_type();
    int dt = kernel_dtype(st);
    if (!takes(K_BINARY, dt) || !plain(a) || !plain(b) || a.device() != b.device() || b.scalar_type() != st ||
        !a.is_contiguous() || !b.is_contiguous())
        return {};
    if ((op == ANYCHIP_OP_DIV && !is_float_dtype(dt)) || (op <= ANYCHIP_OP_MUL && dt == ANYCHIP_BOOL))
        return {};                          // (plugin.h: div takes floats, add / sub / mul no bool)
    c10::DimVector shape = at::infer_size_dimvector(a.sizes(), b.sizes());
    if (shape.size() > kMaxDims)
        return {};
    bool compare = op >= ANYCHIP_OP_EQ && op <= ANYCHIP_OP_GE;         // (these write bool)
    c10::DeviceGuard guard(a.device());
    at::Tensor out = at::empty(shape, a.options().dtype(compare ? at::kBool : st));
    if (out.numel() == 0)
        return out;
    at::Tensor ea = a.expand(shape), eb = b.expand(shape);
    int device = dev_index(a);
    int nd = static_cast<int>(shape.size());
    launched(K_BINARY, g_kernels->binary(device, kernel_stream(device), op, static_cast<anychip_dtype>(dt), nd,
                                         nd ? shape.data() : &kOne, out.data_ptr(), ea.data_ptr(),
                                         nd ? ea.strides().data() : &kOne, eb.data_ptr(),
                                         nd ? eb.strides().data() : &kOne), device);
    return out;
}

at::Tensor add_tensor(const at::Tensor &self, const at::Tensor &other, const at::Scalar &alpha)
{
    if (alpha.equal(1)) {
        at::Tensor out = device_binary(ANYCHIP_OP_ADD, self, other);
        if (out.defined())
            return out;
    }
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::add_Tensor>::call(self, other, alpha);
}

at::Tensor sub_tensor(const at::Tensor &self, const at::Tensor &other, const at::Scalar &alpha)
{
    if (alpha.equal(1)) {
        at::Tensor out = device_binary(ANYCHIP_OP_SUB, self, other);
        if (out.defined())
            return out;
    }
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::sub_Tensor>::call(self, other, alpha);
}

// true division: the kernel's (float types only; integers promote to float, which the CPU does)
at::Tensor div_tensor(const at::Tensor &self, const at::Tensor &other)
{
    if (at::isFloatingType(self.scalar_type())) {
        at::Tensor out = device_binary(ANYCHIP_OP_DIV, self, other);
        if (out.defined())
            return out;
    }
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::div_Tensor>::call(self, other);
}

at::Tensor mul_tensor(const at::Tensor &self, const at::Tensor &other)
{
    at::Tensor out = device_binary(ANYCHIP_OP_MUL, self, other);
    if (out.defined())
        return out;
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::mul_Tensor>::call(self, other);
}

// comparisons (into bool), maximum and minimum (NaN propagates, as the CPU's)
template <anychip_binary_op Op, typename Fallback>
at::Tensor binary_op(const at::Tensor &self, const at::Tensor &other)
{
    at::Tensor out = device_binary(Op, self, other);
    if (out.defined())
        return out;
    return at::native::call_fallback_fn<&cpu_fallback, Fallback>::call(self, other);
}

// op(x) by the table's unary entry, of a contiguous tensor of a dtype it takes (not bool: relu
// and neg take none); else an undefined tensor
at::Tensor device_unary(anychip_unary_op op, const at::Tensor &self)
{
    int dt = kernel_dtype(self.scalar_type());
    if (!takes(K_UNARY, dt) || dt == ANYCHIP_BOOL || !plain(self) || !self.is_contiguous() || self.dim() > kMaxDims)
        return {};
    c10::DeviceGuard guard(self.device());
    at::Tensor out = at::empty(self.sizes(), self.options());
    if (out.numel() == 0)
        return out;
    int device = dev_index(self);
    int nd = static_cast<int>(self.dim());
    auto t = static_cast<anychip_dtype>(dt);
    launched(K_UNARY, g_kernels->unary(device, kernel_stream(device), op, t, t, nd, nd ? self.sizes().data() : &kOne,
                                       out.data_ptr(), self.data_ptr(), nd ? self.strides().data() : &kOne), device);
    return out;
}

at::Tensor relu(const at::Tensor &self)
{
    at::Tensor out = device_unary(ANYCHIP_OP_RELU, self);
    return out.defined() ? out : at::native::call_fallback_fn<&cpu_fallback, at::_ops::relu>::call(self);
}

at::Tensor neg(const at::Tensor &self)
{
    at::Tensor out = device_unary(ANYCHIP_OP_NEG, self);
    return out.defined() ? out : at::native::call_fallback_fn<&cpu_fallback, at::_ops::neg>::call(self);
}

// a[m, k] @ b[k, n] of one float dtype (ANYCHIP_TORCH_KERNELS=all): the table's gemm takes
// strided operands (a transpose is a stride swap) and writes a contiguous result, as the CPU's
// mm does; its sums run in the chip's order, so the last bits may differ from the CPU's
at::Tensor mm(const at::Tensor &a, const at::Tensor &b)
{
    at::ScalarType st = a.scalar_type();
    int dt = kernel_dtype(st);
    if (g_all_kernels && takes(K_GEMM, dt) && is_float_dtype(dt) && plain(a) && plain(b) && a.device() == b.device() &&
        b.scalar_type() == st && a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && a.size(1) > 0) {
        c10::DeviceGuard guard(a.device());
        at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
        if (out.numel() == 0)
            return out;
        int device = dev_index(a);
        launched(K_GEMM, g_kernels->gemm(device, kernel_stream(device), static_cast<anychip_dtype>(dt), a.size(0),
                                         a.size(1), b.size(1), out.data_ptr(), a.data_ptr(), a.stride(0),
                                         a.stride(1), b.data_ptr(), b.stride(0), b.stride(1)), device);
        return out;
    }
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::mm>::call(a, b);
}

// sums of integers and bool are exact everywhere; a float sum is the CPU's only by chance
bool sum_on_device(int dt) { return g_all_kernels || !is_float_dtype(dt); }

// the sum over every dimension, or over one, of a contiguous tensor whose dtype the reduce entry
// takes: x as [outer, n, inner] (integers and bool sum into int64, wrapping, as the CPU's)
at::Tensor device_sum(const at::Tensor &self, at::OptionalIntArrayRef dim, bool keepdim,
                      std::optional<at::ScalarType> dtype)
{
    at::ScalarType in = self.scalar_type();
    at::ScalarType result = at::isIntegralType(in, /*includeBool=*/true) ? at::kLong : in;
    int dt = kernel_dtype(in), rt = kernel_dtype(result);
    if ((dtype.has_value() && *dtype != result) || !sum_on_device(dt) || !takes(K_REDUCE, dt) || !takes(K_REDUCE, rt) ||
        !plain(self) || !self.is_contiguous() || self.numel() == 0)
        return {};
    bool all = !dim.has_value() || dim->empty();
    if (!all && dim->size() != 1)
        return {};
    int64_t nd = self.dim(), d = all ? 0 : c10::maybe_wrap_dim((*dim)[0], nd);
    int64_t outer = 1, n = all ? self.numel() : (nd ? self.size(d) : 1), inner = 1;
    c10::DimVector shape;
    for (int64_t i = 0; i < nd; ++i) {
        if (all || i == d) {
            if (keepdim)
                shape.push_back(1);
            continue;
        }
        shape.push_back(self.size(i));
        (i < d ? outer : inner) *= self.size(i);
    }
    c10::DeviceGuard guard(self.device());
    at::Tensor out = at::empty(shape, self.options().dtype(result));
    int device = dev_index(self);
    launched(K_REDUCE, g_kernels->reduce(device, kernel_stream(device), ANYCHIP_REDUCE_SUM,
                                         static_cast<anychip_dtype>(rt), static_cast<anychip_dtype>(dt), outer, n,
                                         inner, out.data_ptr(), self.data_ptr()), device);
    return out;
}

at::Tensor sum_dim(const at::Tensor &self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype)
{
    at::Tensor out = device_sum(self, dim, keepdim, dtype);
    if (out.defined())
        return out;
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::sum_dim_IntList>::call(self, dim, keepdim, dtype);
}

at::Tensor sum_all(const at::Tensor &self, std::optional<at::ScalarType> dtype)
{
    at::Tensor out = device_sum(self, std::nullopt, false, dtype);
    if (out.defined())
        return out;
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::sum>::call(self, dtype);
}

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
        g_allocator.recordStream(ptr, stream);
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

// ---- hooks -----------------------------------------------------------------------------------

struct Hooks final : at::PrivateUse1HooksInterface {
    bool isBuilt() const override { return true; }
    bool isAvailable() const override { return g_ready && g_count > 0; }
    bool hasPrimaryContext(c10::DeviceIndex device) const override { return g_ready && device >= 0 && device < g_count; }
    // each device's own generators (random.cpp)
    const at::Generator &getDefaultGenerator(c10::DeviceIndex device) const override
    {
        return anychip_torch::default_generator(device);
    }
    at::Generator getNewGenerator(c10::DeviceIndex device) const override { return anychip_torch::new_generator(device); }
    at::Device getDeviceFromPtr(void *data) const override
    {
        (void)data;
        return at::Device(kType, static_cast<c10::DeviceIndex>(t_device));
    }
    bool isPinnedPtr(const void *data) const override { return is_pinned(data); }
    c10::Allocator *getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
    void resizePrivateUse1Bytes(const c10::Storage &storage, size_t newsize) const override
    {
        resize_bytes(storage.unsafeGetStorageImpl(), newsize);
    }
};

Hooks g_hooks;

// ---- set up from Python --------------------------------------------------------------------------

void init(const std::string &library, const std::string &backend, int count, py::list default_streams,
          py::object alloc, py::object record, py::object make_stream, py::object stats, int kernels)
{
    TORCH_CHECK(!g_ready, "the anychip device is already bound to ", g_backend,
                " in this process (PrivateUse1 is one device type per process)");
    void *lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib, "cannot open ", library, ": ", dlerror());
    auto fn = reinterpret_cast<anychip_plugin_init_fn>(dlsym(lib, ANYCHIP_PLUGIN_INIT_SYMBOL));
    TORCH_CHECK(fn, library, " exports no ", ANYCHIP_PLUGIN_INIT_SYMBOL, ": it is not an anychip/plugin.h library");
    std::memset(&g_plugin, 0, sizeof g_plugin);
    g_plugin.struct_size = sizeof g_plugin;
    anychip_status st = fn(&g_plugin);
    TORCH_CHECK(st == 0, library, ": anychip_plugin_init returned ", st);
    TORCH_CHECK(g_plugin.major == ANYCHIP_PLUGIN_API_MAJOR, library, " implements plugin.h ", g_plugin.major, ".",
                g_plugin.minor, "; this build takes major version ", ANYCHIP_PLUGIN_API_MAJOR);
    TORCH_CHECK(g_plugin.mem_info && g_plugin.copy && g_plugin.stream_synchronize,
                library, " lacks a required plugin.h entry (mem_info, copy, stream_synchronize)");
    TORCH_CHECK(static_cast<int>(py::len(default_streams)) == count, "one default stream per device expected");
    g_backend = backend;
    g_count = count;
    g_streams.assign(count, {});
    g_pool.assign(count, std::vector<c10::StreamId>(kPoolSize, 0));
    g_pool_next = new std::vector<std::atomic<unsigned>>(count);
    for (int d = 0; d < count; ++d)
        g_streams[d].push_back(reinterpret_cast<void *>(default_streams[d].cast<uintptr_t>()));
    g_alloc = alloc.release().ptr();
    g_record = record.release().ptr();
    g_new_stream = make_stream.release().ptr();
    g_stats = stats.release().ptr();
    // the kernel table, where plugin.h's rule (anychip_plugin_kernels) lets it be used
    // (kernels: ANYCHIP_TORCH_KERNELS as runtime/env.py reads it, 0 = none, 1 = exact, 2 = all)
    const anychip_kernels *k = anychip_plugin_kernels(&g_plugin);
    if (k && kernels > 0) {
        g_kernels = k;
        g_all_kernels = kernels == 2;
    }
    c10::SetAllocator(kType, &g_allocator);
    at::RegisterPrivateUse1HooksInterface(&g_hooks);
    pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); });
    g_ready = true;
}

// the Buffer holding a tensor's memory and the tensor's byte offset in it (for collectives)
py::tuple buffer_of(const at::Tensor &t)
{
    TORCH_CHECK(t.device().type() == kType, "want a tensor on the anychip device, got one on ", t.device());
    const c10::DataPtr &ptr = t.storage().data_ptr();
    TORCH_CHECK(ptr.get_deleter() == &free_allocation, "this tensor's memory was not allocated by anychip");
    auto *a = static_cast<Allocation *>(ptr.get_context());
    size_t offset = static_cast<const char *>(t.data_ptr()) - static_cast<const char *>(ptr.get());
    return py::make_tuple(py::handle(a->buffer), offset);
}

int current_device() { return t_device; }

int64_t current_stream_id(int device) { return current_id(device); }

// launches of the chip's kernels so far, whether the chip has them, and the launches by entry
py::tuple kernel_launches()
{
    py::dict by_entry;
    int64_t total = 0;
    for (int e = 0; e < K_ENTRIES; ++e) {
        by_entry[kEntryNames[e]] = g_launches[e].load();
        total += g_launches[e].load();
    }
    return py::make_tuple(total, g_kernels != nullptr, by_entry);
}

}  // namespace

namespace anychip_torch {

const std::string &backend_name() { return g_backend; }

std::string status_text(anychip_status st) { return ::status_text(st); }

int dtype_of(at::ScalarType t) { return kernel_dtype(t); }

int device_count() { return g_count; }

void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack) { cpu_fallback(op, stack); }

void *current_stream_of(int device, int64_t *id)
{
    *id = current_id(device);
    return stream_handle(device, *id);
}

}  // namespace anychip_torch

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m)
{
    m.impl("empty.memory_format", empty_memory_format);
    m.impl("empty_strided", empty_strided);
    m.impl("as_strided", as_strided);
    m.impl("view", view);
    m.impl("_reshape_alias", reshape_alias);
    // views with no generic kernel (their CPU one is as_strided-based, so it serves any device)
    m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
    m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
    m.impl("unfold", TORCH_FN(at::native::unfold));
    m.impl("resize_", resize_);
    m.impl("_copy_from", copy_from);
    m.impl("_copy_from_and_resize", copy_from_and_resize);
    m.impl("_local_scalar_dense", local_scalar_dense);
    m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
    m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
    m.impl("set_.source_Storage", set_source_storage);
    m.impl("set_.source_Tensor", set_source_tensor);
    m.impl("set_", set_empty);
    m.impl("fill_.Scalar", fill_scalar);
    m.impl("zero_", zero);
    m.impl("record_stream", record_stream);
    m.impl("add.Tensor", add_tensor);
    m.impl("sub.Tensor", sub_tensor);
    m.impl("mul.Tensor", mul_tensor);
    m.impl("div.Tensor", div_tensor);
    m.impl("eq.Tensor", binary_op<ANYCHIP_OP_EQ, at::_ops::eq_Tensor>);
    m.impl("ne.Tensor", binary_op<ANYCHIP_OP_NE, at::_ops::ne_Tensor>);
    m.impl("lt.Tensor", binary_op<ANYCHIP_OP_LT, at::_ops::lt_Tensor>);
    m.impl("le.Tensor", binary_op<ANYCHIP_OP_LE, at::_ops::le_Tensor>);
    m.impl("gt.Tensor", binary_op<ANYCHIP_OP_GT, at::_ops::gt_Tensor>);
    m.impl("ge.Tensor", binary_op<ANYCHIP_OP_GE, at::_ops::ge_Tensor>);
    m.impl("maximum", binary_op<ANYCHIP_OP_MAX, at::_ops::maximum>);
    m.impl("minimum", binary_op<ANYCHIP_OP_MIN, at::_ops::minimum>);
    m.impl("relu", relu);
    m.impl("neg", neg);
    m.impl("mm", mm);
    m.impl("sum", sum_all);
    m.impl("sum.dim_IntList", sum_dim);
    // ops with a CompositeExplicitAutograd decomposition that backends without a kernel get:
    // the CPU kernel instead, through the fallback, so that the values are the CPU's bit for bit
    // (mse_loss and smooth_l1_loss: their generic kernel writes a reduced loss into an output the
    // CPU kernel then resizes, which warns on every call)
    for (const char *name : {"addr", "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
                             "native_group_norm_backward", "mse_loss", "smooth_l1_loss"})
        m.impl(name, torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
    m.impl("convolution_overrideable", convolution_overrideable);
    m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
}

// the copies read the conjugate and negative bits themselves (as CUDA's copy kernel does):
// through the math fallback, a copy of a conjugate view would clone it with a copy, for ever
TORCH_LIBRARY_IMPL(aten, Conjugate, m)
{
    m.impl("_copy_from", torch::CppFunction::makeFallthrough());
    m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m)
{
    m.impl("_copy_from", torch::CppFunction::makeFallthrough());
    m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m)
{
    m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("_init", &init);
    m.def("buffer_of", &buffer_of);
    m.def("current_device", &current_device);
    m.def("current_stream_id", &current_stream_id);
    m.def("kernel_launches", &kernel_launches);
    anychip_torch::bind_c10d(m);
    anychip_torch::bind_random(m);
}
