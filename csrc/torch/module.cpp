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
// kernels where the library has plugin.h's kernel table (minor 1; ops.cpp).
//
// This part: the plugin.h library, the device's state and the checks every part makes
// (device.h lists the others), and the extension module's Python entries.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/utils/pybind.h>

#include "anychip/plugin.h"
#include "device.h"

namespace py = pybind11;

namespace anychip_torch {

// ---- the plugin ------------------------------------------------------------------------

anychip_plugin g_plugin;
std::string g_backend = "anychip";
int g_count = 0;
bool g_ready = false;

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

const std::string &backend_name() { return g_backend; }

int device_count() { return g_count; }

namespace {

// ---- set up from Python --------------------------------------------------------------------------

void init(const std::string &library, const std::string &backend, int count, py::list default_streams,
          py::object alloc, py::object record, py::object make_stream, py::object stats, int kernels,
          py::list devices, py::list streams)
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
    std::vector<void *> defaults;
    for (int d = 0; d < count; ++d)
        defaults.push_back(reinterpret_cast<void *>(default_streams[d].cast<uintptr_t>()));
    init_streams(count, defaults, make_stream.release().ptr());
    TORCH_CHECK(static_cast<int>(py::len(devices)) == count && static_cast<int>(py::len(streams)) == count,
                "one anychip Device and one list of Streams per device expected");
    init_allocator(alloc.release().ptr(), record.release().ptr(), stats.release().ptr(), devices.release().ptr(),
                   streams.release().ptr());
    // the kernel table, where plugin.h's rule (anychip_plugin_kernels) lets it be used
    // (kernels: ANYCHIP_TORCH_KERNELS as runtime/env.py reads it, 0 = none, 1 = exact, 2 = all)
    const anychip_kernels *k = anychip_plugin_kernels(&g_plugin);
    if (k && kernels > 0)
        use_kernels(k, kernels == 2);
    c10::SetAllocator(kType, device_allocator());
    register_hooks();
    register_profiler();
    pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); });
    g_ready = true;
}

// the Buffer holding a tensor's memory and the tensor's byte offset in it (for collectives)
py::tuple buffer_of(const at::Tensor &t)
{
    TORCH_CHECK(t.device().type() == kType, "want a tensor on the anychip device, got one on ", t.device());
    const c10::DataPtr &ptr = t.storage().data_ptr();
    PyObject *buffer = allocation_buffer(ptr);
    TORCH_CHECK(buffer, "this tensor's memory was not allocated by anychip");
    size_t offset = static_cast<const char *>(t.data_ptr()) - static_cast<const char *>(ptr.get());
    return py::make_tuple(py::handle(buffer), offset);
}

int64_t current_stream_id(int device) { return current_id(device); }

// launches of the chip's kernels so far, whether the chip has them, and the launches by entry
py::tuple kernel_launches()
{
    py::dict by_entry;
    int64_t total = 0;
    for (auto [name, launches] : kernel_launch_counts()) {
        by_entry[name] = launches;
        total += launches;
    }
    return py::make_tuple(total, has_kernels(), by_entry);
}

}  // namespace
}  // namespace anychip_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("_init", &anychip_torch::init);
    m.def("buffer_of", &anychip_torch::buffer_of);
    m.def("current_device", &anychip_torch::current_device);
    m.def("current_stream_id", &anychip_torch::current_stream_id);
    m.def("kernel_launches", &anychip_torch::kernel_launches);
    anychip_torch::bind_c10d(m);
    anychip_torch::bind_random(m);
}
