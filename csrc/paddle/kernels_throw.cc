// The one C++ piece of the bridge's Paddle kernels (kernels.c) and profiler (profiler.c): a kernel that cannot run
// raises, as Paddle's own kernels do, and Paddle turns the exception into the op's Python
// error. The C callers are compiled with -fexceptions, so it unwinds through them. Compiled
// with a C++ compiler and linked into the bridge (setup.py; `anychip plugin paddle`).
//
// The exception is Paddle's own, common::enforce::EnforceNotMet (paddle/common/enforce.h), built
// by its constructor in libphi_core.so: Paddle's Python binding (ThrowExceptionToPython) turns
// only Paddle's exception types into Python errors and lets any other escape, which ends the
// process. The bridge is compiled without Paddle's headers, so the constructor, destructor and
// type_info are looked up by their Itanium names, and the constructor's argument is laid out as
// Paddle 3.x's common::ErrorSummary (its ErrorCode, then its std::string message). Outside such
// a Paddle it is a std::runtime_error.
#define _GLIBCXX_USE_CXX11_ABI 1          // Paddle's wheels use the C++11 std::string
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <typeinfo>

namespace {

struct error_summary {                    // common::ErrorSummary of Paddle 3.x
    int code;                             // common::ErrorCode
    std::string msg;
};

const int PRECONDITION_NOT_MET = 6;       // common::ErrorCode: Python's RuntimeError
const size_t EXCEPTION_BYTES = 512;       // more than sizeof(common::enforce::EnforceNotMet)

typedef void (*enforce_ctor)(void *, const error_summary *, const char *, int);

}  // namespace

extern "C" void anychip_paddle_raise(const char *msg) __attribute__((noreturn));

extern "C" void anychip_paddle_raise(const char *msg)
{
    static void *phi = dlopen("libphi_core.so", RTLD_NOW | RTLD_NOLOAD);
    static void *ctor = phi ? dlsym(phi, "_ZN6common7enforce13EnforceNotMetC1ERKNS_12ErrorSummaryEPKci") : nullptr;
    static void *dtor = phi ? dlsym(phi, "_ZN6common7enforce13EnforceNotMetD1Ev") : nullptr;
    static void *type = phi ? dlsym(phi, "_ZTIN6common7enforce13EnforceNotMetE") : nullptr;
    if (!ctor || !dtor || !type)
        throw std::runtime_error(msg);
    error_summary summary{PRECONDITION_NOT_MET, msg};
    void *e = __cxxabiv1::__cxa_allocate_exception(EXCEPTION_BYTES);
    std::memset(e, 0, EXCEPTION_BYTES);
    reinterpret_cast<enforce_ctor>(ctor)(e, &summary, "csrc/paddle/kernels_throw.cc", __LINE__);
    __cxxabiv1::__cxa_throw(e, static_cast<std::type_info *>(type), reinterpret_cast<void (*)(void *)>(dtor));
}

// A Scalar or IntArray attribute of a kernel context (kernels.c, ctx_scalar / ctx_axes): the
// C API's getter (`attr_at`: PD_KernelContextScalarAttrAt / IntArrayAttrAt), or, where Paddle's
// executor computed the value in the program, a phi::TensorRef, which the C API cannot read:
// phi::KernelContext::AttrAt<phi::TensorRef> (`tensor_ref_at`, exported by libphi_core.so; a const
// member function, `this` first) gives it, and a TensorRef holds only its `const DenseTensor *`
// -- a PD_Tensor. Each getter throws when the attribute holds another type.
typedef void *(*attr_at_fn)(void *, size_t);
typedef const void *const *(*tensor_ref_at_fn)(const void *, size_t);

extern "C" const void *anychip_paddle_attr(void *attr_at, const void *tensor_ref_at, void *ctx, size_t index,
                                           int *is_tensor);

extern "C" const void *anychip_paddle_attr(void *attr_at, const void *tensor_ref_at, void *ctx, size_t index,
                                           int *is_tensor)
{
    *is_tensor = 0;
    try {
        return reinterpret_cast<attr_at_fn>(attr_at)(ctx, index);
    } catch (...) {
        if (!tensor_ref_at)
            throw;
    }
    *is_tensor = 1;
    return *reinterpret_cast<tensor_ref_at_fn>(const_cast<void *>(tensor_ref_at))(ctx, index);
}

// The C++ arguments a kernel's variadic entry receives that C cannot read (kernels.c): a
// `const std::vector<int64_t> &` (strided_copy's dims and strides), a `const std::vector<int> &`
// (transpose's axes), a `std::vector<...*>` of
// tensors (by reference, or by value, which the Itanium ABI passes as a pointer to the caller's
// copy) and a `const std::string &` (momentum's regularization method).
#include <cstdint>
#include <vector>

extern "C" const int64_t *anychip_paddle_i64s(const void *vec, size_t *n);
extern "C" const int32_t *anychip_paddle_i32s(const void *vec, size_t *n);
extern "C" void *const *anychip_paddle_ptrs(const void *vec, size_t *n);
extern "C" const char *anychip_paddle_str(const void *str);

extern "C" const int64_t *anychip_paddle_i64s(const void *vec, size_t *n)
{
    const auto *v = static_cast<const std::vector<int64_t> *>(vec);
    *n = v->size();
    return v->data();
}

extern "C" const int32_t *anychip_paddle_i32s(const void *vec, size_t *n)
{
    const auto *v = static_cast<const std::vector<int32_t> *>(vec);
    *n = v->size();
    return v->data();
}

extern "C" void *const *anychip_paddle_ptrs(const void *vec, size_t *n)
{
    const auto *v = static_cast<const std::vector<void *> *>(vec);
    *n = v->size();
    return v->data();
}

extern "C" const char *anychip_paddle_str(const void *str)
{
    return static_cast<const std::string *>(str)->c_str();
}

// Paddle's profiler events (profiler.c): phi::RuntimeTraceEvent and phi::DeviceTraceEvent of
// Paddle 3.x (paddle/phi/api/profiler/trace_event.h), laid out here as Paddle declares them (a
// std::string name, phi::TracerEventType as an int, the times and ids, and for a device event a
// union of the kernel / memcpy / memset details), handed to the collector through the C entries
// libpaddle.so exports for plugins (device_ext.h: profiler_add_runtime_trace_event /
// profiler_add_device_trace_event), which move them into Paddle's collector. 0, or -1 when this
// process's Paddle does not export them.
namespace {

const size_t MEM_KIND_LEN = 50;           // phi::kMemKindMaxLen

struct kernel_event_info {                // phi::KernelEventInfo
    uint32_t block[3], grid[3], dynamic_shared, static_shared, registers, local_per_thread, local_total;
    uint64_t queued, submitted, completed;
    float blocks_per_sm, warps_per_sm, occupancy;
};

struct memcpy_event_info {                // phi::MemcpyEventInfo
    uint64_t num_bytes;
    char copy_kind[MEM_KIND_LEN], src_kind[MEM_KIND_LEN], dst_kind[MEM_KIND_LEN];
};

struct memset_event_info {                // phi::MemsetEventInfo
    uint64_t num_bytes;
    char memory_kind[MEM_KIND_LEN];
    uint32_t value;
};

struct runtime_trace_event {              // phi::RuntimeTraceEvent
    std::string name;
    int type;
    uint64_t start_ns, end_ns, process_id, thread_id;
    uint32_t correlation_id, callback_id;
};

struct device_trace_event {               // phi::DeviceTraceEvent
    std::string name;
    int type;
    uint64_t start_ns, end_ns, device_id, context_id, stream_id;
    uint32_t correlation_id;
    union {
        kernel_event_info kernel_info;
        memcpy_event_info memcpy_info;
        memset_event_info memset_info;
    };
};

const int CUDA_RUNTIME = 3, MEMCPY = 5, MEMSET = 6;    // phi::TracerEventType

typedef void (*add_event_fn)(void *, void *);

add_event_fn paddle_entry(const char *name)
{
    void *paddle = dlopen("libpaddle.so", RTLD_NOW | RTLD_NOLOAD);
    return paddle ? reinterpret_cast<add_event_fn>(dlsym(paddle, name)) : nullptr;
}

void copy_kind(char *dst, const char *src)
{
    std::strncpy(dst, src, MEM_KIND_LEN - 1);
    dst[MEM_KIND_LEN - 1] = 0;
}

}  // namespace

extern "C" int anychip_paddle_trace_runtime(void *prof, const char *name, uint64_t start_ns, uint64_t end_ns,
                                            uint64_t pid, uint64_t tid, uint32_t correlation);
extern "C" int anychip_paddle_trace_device(void *prof, const char *name, int type, uint64_t start_ns,
                                           uint64_t end_ns, uint64_t device, uint64_t stream, uint32_t correlation,
                                           uint64_t bytes, const char *copy, const char *src_kind,
                                           const char *dst_kind, uint32_t value);

extern "C" int anychip_paddle_trace_runtime(void *prof, const char *name, uint64_t start_ns, uint64_t end_ns,
                                            uint64_t pid, uint64_t tid, uint32_t correlation)
{
    static add_event_fn add = paddle_entry("profiler_add_runtime_trace_event");
    if (!add)
        return -1;
    runtime_trace_event e{name, CUDA_RUNTIME, start_ns, end_ns, pid, tid, correlation, 0};
    add(prof, &e);
    return 0;
}

extern "C" int anychip_paddle_trace_device(void *prof, const char *name, int type, uint64_t start_ns,
                                           uint64_t end_ns, uint64_t device, uint64_t stream, uint32_t correlation,
                                           uint64_t bytes, const char *copy, const char *src_kind,
                                           const char *dst_kind, uint32_t value)
{
    static add_event_fn add = paddle_entry("profiler_add_device_trace_event");
    if (!add)
        return -1;
    const size_t details = sizeof(memcpy_event_info) > sizeof(kernel_event_info)
                               ? (sizeof(memcpy_event_info) > sizeof(memset_event_info) ? sizeof(memcpy_event_info)
                                                                                      : sizeof(memset_event_info))
                               : sizeof(kernel_event_info);
    device_trace_event e;
    std::memset(static_cast<void *>(&e.kernel_info), 0, details);
    e.name = name;
    e.type = type;
    e.start_ns = start_ns;
    e.end_ns = end_ns;
    e.device_id = device;
    e.context_id = 0;
    e.stream_id = stream;
    e.correlation_id = correlation;
    if (type == MEMCPY) {
        e.memcpy_info.num_bytes = bytes;
        copy_kind(e.memcpy_info.copy_kind, copy);
        copy_kind(e.memcpy_info.src_kind, src_kind);
        copy_kind(e.memcpy_info.dst_kind, dst_kind);
    } else if (type == MEMSET) {
        e.memset_info.num_bytes = bytes;
        copy_kind(e.memset_info.memory_kind, dst_kind);
        e.memset_info.value = value;
    }
    add(prof, &e);
    return 0;
}
