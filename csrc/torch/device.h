// What the parts of the PyTorch extension share (csrc/torch/; see docs/torch.md). Each part is a
// translation unit of its own, compiled side by side (anychip/torch/_build.py), and includes only
// the torch headers it needs (torch/extension.h alone costs a compile about half a minute):
//
//   module.cpp     the plugin.h library the device runs on, the checks every part makes, the
//                  extension module's Python entries (_init and the rest)
//   guard.cpp      the device guard: the current device, the streams and the events
//   allocator.cpp  device memory (anychip's caching allocator), pinned host memory, storage resizing
//   copies.cpp     copies between the host and the device and within the device
//   ops.cpp        the aten kernels: the CPU fallback, the ops on the chip's kernel table (their
//                  functional, in-place and out= forms), the registrations
//   fused.cpp      what torch's composite ops take on a device but not on the CPU: attention's
//                  kernel choice, the fused RNN cells
//   hooks.cpp      PrivateUse1's hooks (generators, pinned memory, storage resizing)
//   profiler.cpp   the profiler's device time (PrivateUse1's profiler stubs over plugin.h's events)
//   kineto.cpp     the device's activities in torch.profiler's trace (PrivateUse1's Kineto
//                  activity profiler: the kernels and copies, timed by events on their streams)
//   random.cpp     the device's generators and random ops
//   amp.cpp        autocast's kernels
//   c10d.cpp       the c10d backend's direct ops
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include "anychip/plugin.h"

namespace c10 {
class OperatorHandle;
struct DeviceAllocator;
}  // namespace c10

namespace pybind11 {
class module_;
}  // namespace pybind11

namespace anychip_torch {

constexpr auto kType = c10::DeviceType::PrivateUse1;

// ---- module.cpp: the plugin.h library and the device's state ---------------------------------
extern anychip_plugin g_plugin;                 // the device's plugin.h library (set by _init)
extern std::string g_backend;                   // the anychip backend the device is
extern int g_count;                             // the devices the backend has here
extern bool g_ready;                            // set by _init
const std::string &backend_name();              // g_backend
int device_count();                             // g_count
std::string status_text(anychip_status st);     // a status code with the library's text and detail
// refused, saying why, in a process forked from the one that set the device up
void refuse_in_forked_child();
// a TORCH_CHECK that st is 0, naming the call and the device
void check(anychip_status st, const char *what, int device);
void require_ready();                           // _init ran
void check_index(int device);                   // require_ready, and device is one of g_count
// whether Python may be entered from any thread: false once the interpreter is finalizing
// (a thread other than the main one that takes the GIL then is ended inside our frames)
inline bool python_usable()
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsInitialized() && !Py_IsFinalizing();
#else
    return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// ---- guard.cpp: the current device, streams and events ---------------------------------------
// Stream id 0 is a device's default stream; ids 1.. are streams made for torch (in creation order).
int current_device();                           // this thread's current device
c10::StreamId current_id(int device);           // this thread's current stream of `device`
void *stream_handle(int device, c10::StreamId id);
void *current_stream(int device);               // the handle of current_id(device)
// the handle of `device`'s current torch stream; *id: its id (0: the device's default stream)
void *current_stream_of(int device, int64_t *id);
void sync_stream(int device, void *stream);
// the streams of `count` devices, their default ones' handles, and the Python callback that
// makes a stream, (device) -> (stream id, native handle) (a reference _init hands over)
void init_streams(int count, const std::vector<void *> &default_streams, PyObject *make_stream);

// ---- allocator.cpp: memory -------------------------------------------------------------------
c10::DeviceAllocator *device_allocator();       // the device's memory (anychip's caching allocator)
c10::Allocator *pinned_allocator();             // page-locked host memory
// the Python callbacks of the device's memory (references _init hands over): (device, nbytes,
// stream id) -> (ptr, buffer); (buffer, device, stream id) -> None; (device, what) -> dict / None;
// and for the C path to the allocator's core, the list of the anychip Devices and the list (one
// per device) of the lists of their Streams by torch stream id
void init_allocator(PyObject *alloc, PyObject *record, PyObject *stats, PyObject *devices, PyObject *streams);
// the anychip Buffer holding ptr's memory (a borrowed reference); nullptr where anychip did not allocate it
PyObject *allocation_buffer(const c10::DataPtr &ptr);
bool is_pinned(const void *ptr);
// whether copies to and from pinned memory can be enqueued and their end recorded
bool can_record();
// a copy touching the pinned block at host was enqueued on stream: an event after it keeps the
// block until the copy is done
void record_pinned_use(const void *host, int device, void *stream);
void resize_bytes(c10::StorageImpl *storage, size_t nbytes);

// ---- copies.cpp ------------------------------------------------------------------------------
// nbytes between host and device (or within one device) on the device's current stream;
// host memory is not kept alive, so a copy touching the host is waited for
void raw_copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind);
int dev_index(const at::Tensor &t);             // a tensor's device index (the current one for -1)
bool dense(const at::Tensor &t);                // non-overlapping and dense
// a host tensor with the device tensor's layout and values (`lead` elements into its block)
at::Tensor download(const at::Tensor &t, int64_t lead = 0);
// download(ts[i], leads[i]) of each tensor (each on an anychip device), the copies enqueued together
// and waited for once per stream: one round trip for all of an op's inputs. may_alias: the caller
// reads and writes the results on the host before it enqueues anything: where the host addresses
// device memory (host_addressable), each is then a CPU view of the device tensor's own memory (the
// views of one storage share one host storage), not a copy
std::vector<at::Tensor> download_all(const std::vector<at::Tensor> &ts, const std::vector<int64_t> &leads,
                                     bool may_alias = false);
// the host reads and writes device memory itself (plugin.h's ANYCHIP_PLUGIN_HOST_MEMORY, while the
// profiler does not trace the device)
bool host_addressable();
void upload(const at::Tensor &dst, const at::Tensor &src);  // host values into a device tensor
at::Tensor copy_from(const at::Tensor &self, const at::Tensor &dst, bool non_blocking);
at::Tensor copy_from_and_resize(const at::Tensor &self, const at::Tensor &dst);

// ---- ops.cpp ---------------------------------------------------------------------------------
int dtype_of(at::ScalarType t);                 // plugin.h's anychip_dtype of a torch dtype; -1: none
// the CPU fallback (inputs copied to the host, the CPU kernel, outputs copied back)
void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack);
// the ops on the chip's kernels use k (nullptr: none); all: also those whose float results round
// differently from the CPU's
void use_kernels(const anychip_kernels *k, bool all);
bool has_kernels();
// launches of the chip's kernels so far, by the table's entry (its name, its launches)
std::vector<std::pair<const char *, int64_t>> kernel_launch_counts();

// ---- hooks.cpp -------------------------------------------------------------------------------
void register_hooks();

// ---- profiler.cpp ----------------------------------------------------------------------------
void register_profiler();       // the autograd profiler's stubs, and kineto.cpp's activity profiler
// whether the plugin times its events (event_create / destroy / record / synchronize / elapsed_ms),
// which both profilers need
bool timed_events();

// ---- kineto.cpp: the device's work in torch.profiler's trace -----------------------------------
// While a torch.profiler session traces the device (g_tracing), each kernel, copy and fill enqueued
// on a stream is bracketed by two of the plugin's events: trace_begin records the first just before
// the enqueue (it returns an empty mark, at the cost of one atomic load, when not tracing),
// trace_end the second just after, naming the work and the plugin.h call that enqueued it.
extern std::atomic<bool> g_tracing;
enum class TraceKind { kernel, memcpy, memset };
struct TraceMark {
    int device = 0;
    void *stream = nullptr;
    anychip_event start = nullptr;      // nullptr: not traced
    int64_t host_start = 0;
};
TraceMark trace_begin(int device, void *stream);
void trace_end(const TraceMark &mark, TraceKind kind, const char *name, const char *call);
void register_activity_profiler();

// ---- random.cpp: the device's generators (its Philox seed and offset) and its names in the module
const at::Generator &default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
void bind_random(pybind11::module_ &m);

// ---- c10d.cpp's names in the extension module --------------------------------------------------
void bind_c10d(pybind11::module_ &m);

}  // namespace anychip_torch
