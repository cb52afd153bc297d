// The aten kernels of anychip's PrivateUse1 device (see docs/torch.md; device.h lists the parts).
//
// Compute ops run on the CPU through at::native::cpu_fallback: the inputs are copied to
// the host, the CPU kernel runs, the outputs are copied back; a few run on the chip's own
// kernels where the library has plugin.h's kernel table (minor 1; "the chip's kernels" below),
// in their functional, in-place and out= forms from one implementation each (structured, below).
// The ops that make, view, resize and fill tensors are the device's own.
#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/add_meta.h>
#include <ATen/ops/addcdiv_meta.h>
#include <ATen/ops/addcmul_meta.h>
#include <ATen/ops/div_meta.h>
#include <ATen/ops/eq_meta.h>
#include <ATen/ops/ge_meta.h>
#include <ATen/ops/gt_meta.h>
#include <ATen/ops/le_meta.h>
#include <ATen/ops/lerp_meta.h>
#include <ATen/ops/lt_meta.h>
#include <ATen/ops/maximum_meta.h>
#include <ATen/ops/minimum_meta.h>
#include <ATen/ops/mul_meta.h>
#include <ATen/ops/ne_meta.h>
#include <ATen/ops/neg_meta.h>
#include <ATen/ops/sqrt_meta.h>
#include <ATen/ops/sub_meta.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "anychip/plugin.h"
#include "device.h"

namespace anychip_torch {
namespace {

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

// the launch being made on this thread, while the profiler traces the device (kineto.cpp)
thread_local TraceMark t_launch;

// the device made current for an entry's call, and its stream; called as the call's argument, so
// that the profiler's start event is recorded just before the launch (launched records its end)
anychip_stream kernel_stream(int device)
{
    if (g_plugin.set_device)
        check(g_plugin.set_device(device), "set_device", device);
    void *stream = current_stream(device);
    t_launch = trace_begin(device, stream);
    return static_cast<anychip_stream>(stream);
}

void launched(Entry entry, anychip_status st, int device)
{
    static const char *const calls[K_ENTRIES] = {"kernels.binary", "kernels.unary", "kernels.reduce",
                                                 "kernels.gemm", "kernels.fill"};
    trace_end(std::exchange(t_launch, TraceMark{}), TraceKind::kernel, kEntryNames[entry], calls[entry]);
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
    c10::DeviceGuard guard(device.value_or(c10::Device(kType, static_cast<c10::DeviceIndex>(current_device()))));
    return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                     c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory)
{
    (void)layout;
    (void)pin_memory;
    c10::DeviceGuard guard(device.value_or(c10::Device(kType, static_cast<c10::DeviceIndex>(current_device()))));
    return at::detail::empty_strided_generic(size, stride, device_allocator(),
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
    c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
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
            void *stream = current_stream(device);
            TraceMark mark = trace_begin(device, stream);
            anychip_status st = g_plugin.fill_async(device, self.data_ptr(), b[0], nbytes,
                                                    static_cast<anychip_stream>(stream));
            trace_end(mark, TraceKind::memset, "Memset", "fill_async");
            check(st, "fill_async", device);
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
    device_allocator()->recordStream(self.storage().data_ptr(), stream);
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
// set while the CPU fallback runs an op: where the host addresses device memory, its arguments'
// host tensors (to_cpu) are views of the device memory itself, which the CPU kernel reads and
// writes in place (an out= argument, an in-place op's self), instead of copies written back
thread_local bool t_in_fallback = false;

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
    {
        bool outer = std::exchange(t_in_fallback, true);
        try {
            at::native::cpu_fallback(op, stack);
        } catch (...) {
            t_in_fallback = outer;
            throw;
        }
        t_in_fallback = outer;
    }
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

// The CPU fallback's copies of an op's device tensors (at::native::cpu_fallback hands them to
// at::_to_cpu): each as the same view would be on the CPU, so that the CPU kernel takes the path
// (and sums in the order) it takes there. torch's own .cpu() makes a tensor that is not dense (a
// strided slice, an expanded view) contiguous, which changed the order of a sum over it, and
// puts every copy at the start of a block, where a view's data on the CPU starts at its offset
// into a 64-byte aligned block (which the CPU's BLAS routines can follow). Here: the span of
// memory the tensor addresses, viewed with its strides, at its offset's place in that alignment.
std::vector<at::Tensor> to_cpu(at::TensorList tensors)
{
    // The device tensors' copies are enqueued together and waited for once (one round trip for
    // all of an op's inputs, a foreach op's lists included).
    constexpr int64_t kCpuAlignment = 64;          // c10's gAlignment: where a CPU block starts
    std::vector<at::Tensor> out, dev;
    std::vector<int64_t> leads;
    out.reserve(tensors.size());
    for (const at::Tensor &t : tensors) {
        if (!t.defined() || t.device().type() != kType) {
            out.push_back(t.defined() ? t.cpu() : t);
            continue;
        }
        int64_t item = static_cast<int64_t>(t.element_size());
        leads.push_back(kCpuAlignment % item == 0 ? t.storage_offset() % (kCpuAlignment / item) : 0);
        dev.push_back(t);
        out.emplace_back();
    }
    std::vector<at::Tensor> host = download_all(dev, leads, t_in_fallback);
    for (size_t i = 0, k = 0; i < out.size(); ++i)
        if (tensors[i].defined() && tensors[i].device().type() == kType)
            out[i] = host[k++];
    return out;
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
// Each takes the kernel where its operands fit: on one anychip device (a CPU scalar is put on it
// by the fill entry), one dtype the entry's mask takes (no type promotion), at most
// ANYCHIP_KERNEL_MAX_DIMS dimensions. The values are the CPU's bit for bit (one IEEE operation
// per element, half types rounded once, integers wrap), but for mm and float sums, which only
// ANYCHIP_TORCH_KERNELS=all puts on the chip.

constexpr int kMaxDims = ANYCHIP_KERNEL_MAX_DIMS;
const int64_t kOne = 1;          // what a 0-d operand passes for its shape and strides (never read)

// ---- the functional, in-place and out= forms of an op, from one implementation ---------------------
// What torchgen writes for a structured kernel on CPU and CUDA: the op's meta function (torch's
// own: broadcasting, type promotion, the checks of the output's dtype, shape and overlap, with
// torch's messages) builds a TensorIterator over an output that is made (functional), checked
// against self (in place: "Bad in-place call: ...") or resized as torch resizes an out= tensor
// (with its warning). The op's implementation then fills iter.output(): on the kernel table where
// the operands fit, else with the CPU kernel's values.

enum class Form { Functional, Inplace, Out };

template <class Meta>
struct Structured final : Meta {
    Structured(Form form, const at::Tensor &out) : form(form), out(out) {}

    void set_output_raw_strided(int64_t idx, at::IntArrayRef sizes, at::IntArrayRef strides,
                                at::TensorOptions options) override
    {
        if (form == Form::Functional) {
            c10::DeviceGuard guard(options.device());
            out = strides.empty() ? at::empty(sizes, options) : at::empty_strided(sizes, strides, options);
        } else if (form == Form::Inplace) {
            TORCH_CHECK(options.dtype() == out.dtype(), "Bad in-place call: input tensor dtype ", out.dtype(),
                        " and output tensor dtype ", options.dtype(), " should match");
            TORCH_CHECK(options.device() == out.device(), "Bad in-place call: input tensor device ", out.device(),
                        " and output tensor device ", options.device(), " should match");
            TORCH_CHECK(sizes == out.sizes(), "Bad in-place call: input tensor size ", out.sizes(),
                        " and output tensor size ", sizes, " should match");
        } else {
            TORCH_CHECK(options.dtype() == out.dtype(), "Expected out tensor to have dtype ", options.dtype(),
                        ", but got ", out.dtype(), " instead");
            TORCH_CHECK(options.device() == out.device(), "Expected out tensor to have device ", options.device(),
                        ", but got ", out.device(), " instead");
            if (at::native::resize_output(out, sizes)) {
                if (!strides.empty())
                    out.as_strided_(sizes, strides);
                else if (options.memory_format_opt().has_value())
                    out.unsafeGetTensorImpl()->empty_tensor_restride(*options.memory_format_opt());
            }
        }
        Meta::set_output_raw_strided(idx, sizes, strides, options);     // (after: it reads `out`)
    }

    const at::Tensor &maybe_get_output(int64_t) override { return out; }

    Form form;
    at::Tensor out;
};

// form's result of the op whose meta class is Meta: meta(args...), then impl(iter)
template <class Meta, typename Impl, typename... Args>
at::Tensor structured(Form form, const at::Tensor &out, Impl &&impl, const Args &...args)
{
    Structured<Meta> op(form, out);
    op.meta(args...);
    impl(static_cast<at::TensorIteratorBase &>(op));
    return op.out;
}

// the CPU kernel's values: the iterator's inputs on the host (views of the device memory where the
// host addresses it: f only reads them), the CPU op `f` over them, its result written into the
// output (cast to the output's dtype, as the CPU's out= does). `into`, where given, is the CPU
// op's out= form, into(out, in): where the host addresses device memory and the output needs no
// conversion, the CPU kernel writes the output where it is (no host result made and copied)
template <typename F, typename G = std::nullptr_t>
void on_host(at::TensorIteratorBase &iter, F &&f, G &&into = nullptr)
{
    std::vector<at::Tensor> in, dev;
    for (int i = 0; i < iter.ninputs(); ++i) {
        const at::Tensor &t = iter.input(i);
        in.push_back(t);                                        // (a CPU scalar as it is)
        if (t.device().type() == kType)
            dev.push_back(t);
    }
    std::vector<at::Tensor> host = download_all(dev, std::vector<int64_t>(dev.size(), 0), /*may_alias=*/true);
    for (size_t i = 0, k = 0; i < in.size(); ++i)
        if (in[i].device().type() == kType)
            in[i] = host[k++];
    const at::Tensor &out = iter.output(0);
    if constexpr (!std::is_same_v<std::decay_t<G>, std::nullptr_t>) {
        if (host_addressable() && out.numel() > 0 && out.scalar_type() == iter.common_dtype() && !out.is_conj() &&
            !out.is_neg()) {
            at::Tensor target = download_all({out}, {0}, /*may_alias=*/true)[0];
            if (target.data_ptr() == out.data_ptr()) {          // (a view of the output's memory)
                into(target, in);
                return;
            }
        }
    }
    at::Tensor result = f(in);
    out.copy_(result);
}

// The iterator's operand i as the kernel reads it: a tensor on out's device of dtype st, or a CPU
// scalar written there by the fill entry (a value the CPU's kernel reads as the same number);
// else an undefined tensor
at::Tensor kernel_operand(const at::TensorIteratorBase &iter, int i, at::ScalarType st, const at::Tensor &out)
{
    const at::Tensor &t = iter.input(i);
    if (t.device() == out.device())
        return plain(t) && t.scalar_type() == st ? t : at::Tensor();
    int dt = kernel_dtype(st);
    if (!t.device().is_cpu() || t.dim() != 0 || !takes(K_FILL, dt))
        return {};
    // the value as the CPU's kernel reads it: converted to st, but float16 / bfloat16 ops take a
    // scalar in float, so only a value those dtypes hold exactly gives the same numbers
    at::Scalar s = t.item();
    bool integral = s.isIntegral(/*includeBool=*/true);
    // (an integer converted to float directly, as the CPU does: through double it could round twice)
    auto to_float = [&] { return integral ? static_cast<float>(s.toLong()) : static_cast<float>(s.toDouble()); };
    double fvalue = 0.0;
    int64_t ivalue = 0;
    switch (st) {
    case at::kDouble: fvalue = s.toDouble(); break;
    case at::kFloat: fvalue = to_float(); break;
    case at::kHalf:
    case at::kBFloat16: {
        float f = to_float();
        float held = st == at::kHalf ? static_cast<float>(c10::Half(f)) : static_cast<float>(c10::BFloat16(f));
        if (!(held == f))           // (NaN too)
            return {};
        fvalue = held;
        break;
    }
    case at::kLong: ivalue = s.toLong(); break;
    case at::kInt: ivalue = static_cast<int32_t>(s.toLong()); break;
    case at::kChar: ivalue = static_cast<int8_t>(s.toLong()); break;
    case at::kByte: ivalue = static_cast<uint8_t>(s.toLong()); break;
    case at::kBool: ivalue = s.toBool(); break;
    default: return {};
    }
    at::Tensor value = at::empty({}, out.options().dtype(st));
    int device = dev_index(out);
    launched(K_FILL, g_kernels->fill(device, kernel_stream(device), static_cast<anychip_dtype>(dt), 1,
                                     value.data_ptr(), fvalue, ivalue, 0), device);
    return value;
}

// The kernel writes a C-contiguous output that overlaps no input: out itself, with its dimensions
// permuted to their memory order when it is dense in another order (a transposed result), else a
// temporary that is then copied into out. Returns what to launch on, and the permutation.
at::Tensor kernel_target(const at::Tensor &out, const std::vector<at::Tensor> &in, std::vector<int64_t> &perm)
{
    perm.resize(out.dim());
    for (int64_t d = 0; d < out.dim(); ++d)
        perm[d] = d;
    bool overlaps = false;
    for (const at::Tensor &t : in)
        overlaps = overlaps || at::get_overlap_status(out, t) != at::MemOverlapStatus::No;
    if (!overlaps && !out.is_contiguous() && out.is_non_overlapping_and_dense()) {
        std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
            return out.size(a) != 1 && (out.size(b) == 1 || out.stride(a) > out.stride(b));
        });
        if (out.permute(perm).is_contiguous())
            return out.permute(perm);
    }
    for (int64_t d = 0; d < out.dim(); ++d)
        perm[d] = d;
    if (!overlaps && out.is_contiguous())
        return out;
    return at::empty(out.sizes(), out.options().memory_format(at::MemoryFormat::Contiguous));
}

bool writes_bool(anychip_binary_op op) { return op >= ANYCHIP_OP_EQ && op <= ANYCHIP_OP_GE; }

// iter's output = input(0) <op> input(1) on the binary entry; false where the operands do not fit
bool binary_kernel(at::TensorIteratorBase &iter, anychip_binary_op op)
{
    const at::Tensor &out = iter.output(0);
    at::ScalarType st = iter.common_dtype();
    int dt = kernel_dtype(st);
    if (!takes(K_BINARY, dt) || !plain(out) || out.scalar_type() != (writes_bool(op) ? at::kBool : st) ||
        out.dim() > kMaxDims || iter.ninputs() != 2)
        return false;
    if ((op == ANYCHIP_OP_DIV && !is_float_dtype(dt)) || (op <= ANYCHIP_OP_MUL && dt == ANYCHIP_BOOL))
        return false;                       // (plugin.h: div takes floats, add / sub / mul no bool)
    c10::DeviceGuard guard(out.device());
    std::vector<at::Tensor> in{kernel_operand(iter, 0, st, out), kernel_operand(iter, 1, st, out)};
    if (!in[0].defined() || !in[1].defined())
        return false;
    if (out.numel() == 0)
        return true;
    std::vector<int64_t> perm;
    at::Tensor dst = kernel_target(out, in, perm);
    at::Tensor a = in[0].expand(out.sizes()).permute(perm), b = in[1].expand(out.sizes()).permute(perm);
    int device = dev_index(out);
    int nd = static_cast<int>(dst.dim());
    launched(K_BINARY, g_kernels->binary(device, kernel_stream(device), op, static_cast<anychip_dtype>(dt), nd,
                                         nd ? dst.sizes().data() : &kOne, dst.data_ptr(), a.data_ptr(),
                                         nd ? a.strides().data() : &kOne, b.data_ptr(),
                                         nd ? b.strides().data() : &kOne), device);
    if (!dst.is_same(out) && dst.data_ptr() != out.data_ptr())
        out.copy_(dst);
    return true;
}

// iter's output = op(input(0)) on the unary entry (not bool: relu and neg take none, and sqrt takes
// floats only); false where the operands do not fit
bool unary_kernel(at::TensorIteratorBase &iter, anychip_unary_op op)
{
    const at::Tensor &out = iter.output(0);
    at::ScalarType st = iter.common_dtype();
    int dt = kernel_dtype(st);
    if (!takes(K_UNARY, dt) || dt == ANYCHIP_BOOL || (op == ANYCHIP_OP_SQRT && !is_float_dtype(dt)) || !plain(out) ||
        out.scalar_type() != st || out.dim() > kMaxDims)
        return false;
    const at::Tensor &x = iter.input(0);
    if (x.device() != out.device() || !plain(x) || x.scalar_type() != st)
        return false;
    if (out.numel() == 0)
        return true;
    c10::DeviceGuard guard(out.device());
    std::vector<int64_t> perm;
    at::Tensor dst = kernel_target(out, {x}, perm);
    at::Tensor px = x.permute(perm);
    int device = dev_index(out);
    int nd = static_cast<int>(dst.dim());
    auto t = static_cast<anychip_dtype>(dt);
    launched(K_UNARY, g_kernels->unary(device, kernel_stream(device), op, t, t, nd, nd ? dst.sizes().data() : &kOne,
                                       dst.data_ptr(), px.data_ptr(), nd ? px.strides().data() : &kOne), device);
    if (dst.data_ptr() != out.data_ptr())
        out.copy_(dst);
    return true;
}

// The ops' implementations. add and sub with alpha 1 or -1 are one IEEE operation per element;
// with another alpha the CPU computes other + alpha * self in one fused multiply-add, which the
// table has not: the CPU's kernel. So for lerp, addcmul and addcdiv (their CPU kernels round
// once where two of the table's operations would round twice).
struct AddImpl {
    at::Scalar alpha;
    bool negate;             // sub: self - alpha * other
    void operator()(at::TensorIteratorBase &iter) const
    {
        bool one = alpha.equal(1), minus = alpha.equal(-1);
        if ((one || minus) && binary_kernel(iter, one != negate ? ANYCHIP_OP_ADD : ANYCHIP_OP_SUB))
            return;
        on_host(iter, [&](const std::vector<at::Tensor> &in) {
            return negate ? at::sub(in[0], in[1], alpha) : at::add(in[0], in[1], alpha);
        });
    }
};

template <anychip_binary_op Op, at::Tensor (*Host)(const at::Tensor &, const at::Tensor &)>
void binary_impl(at::TensorIteratorBase &iter)
{
    if (!binary_kernel(iter, Op))
        on_host(iter, [](const std::vector<at::Tensor> &in) { return Host(in[0], in[1]); });
}

template <anychip_unary_op Op, at::Tensor (*Host)(const at::Tensor &)>
void unary_impl(at::TensorIteratorBase &iter)
{
    if (!unary_kernel(iter, Op))
        on_host(iter, [](const std::vector<at::Tensor> &in) { return Host(in[0]); });
}

// the CPU kernel's values only: sqrt, whose CPU kernel (vectorized) is not the correctly rounded
// square root the table's computes (about 1 float32 value in 6 differs in the last bit)
template <at::Tensor (*Host)(const at::Tensor &), at::Tensor &(*HostOut)(at::Tensor &, const at::Tensor &)>
void host_unary(at::TensorIteratorBase &iter)
{
    on_host(iter, [](const std::vector<at::Tensor> &in) { return Host(in[0]); },
            [](at::Tensor &out, const std::vector<at::Tensor> &in) { HostOut(out, in[0]); });
}

// the host's ops (at::add and the rest have default arguments, so they are wrapped)
at::Tensor host_mul(const at::Tensor &a, const at::Tensor &b) { return at::mul(a, b); }
at::Tensor host_div(const at::Tensor &a, const at::Tensor &b) { return at::div(a, b); }
at::Tensor host_eq(const at::Tensor &a, const at::Tensor &b) { return at::eq(a, b); }
at::Tensor host_ne(const at::Tensor &a, const at::Tensor &b) { return at::ne(a, b); }
at::Tensor host_lt(const at::Tensor &a, const at::Tensor &b) { return at::lt(a, b); }
at::Tensor host_le(const at::Tensor &a, const at::Tensor &b) { return at::le(a, b); }
at::Tensor host_gt(const at::Tensor &a, const at::Tensor &b) { return at::gt(a, b); }
at::Tensor host_ge(const at::Tensor &a, const at::Tensor &b) { return at::ge(a, b); }
at::Tensor host_maximum(const at::Tensor &a, const at::Tensor &b) { return at::maximum(a, b); }
at::Tensor host_minimum(const at::Tensor &a, const at::Tensor &b) { return at::minimum(a, b); }
at::Tensor host_neg(const at::Tensor &a) { return at::neg(a); }
at::Tensor host_sqrt(const at::Tensor &a) { return at::sqrt(a); }
at::Tensor &host_sqrt_out(at::Tensor &out, const at::Tensor &a) { return at::sqrt_out(out, a); }

// The three forms of an op with meta class Meta, as kernels to register: functional(args...),
// inplace(self, args...), out(args..., out). Binary ops with alpha (add, sub):
template <class Meta, bool Negate>
struct AlphaOps {
    static at::Tensor functional(const at::Tensor &self, const at::Tensor &other, const at::Scalar &alpha)
    {
        return structured<Meta>(Form::Functional, {}, AddImpl{alpha, Negate}, self, other, alpha);
    }
    static at::Tensor &inplace(at::Tensor &self, const at::Tensor &other, const at::Scalar &alpha)
    {
        structured<Meta>(Form::Inplace, self, AddImpl{alpha, Negate}, self, other, alpha);
        return self;
    }
    static at::Tensor &out(const at::Tensor &self, const at::Tensor &other, const at::Scalar &alpha, at::Tensor &out)
    {
        structured<Meta>(Form::Out, out, AddImpl{alpha, Negate}, self, other, alpha);
        return out;
    }
};

template <class Meta, void (*Impl)(at::TensorIteratorBase &)>
struct BinaryOps {
    static at::Tensor functional(const at::Tensor &self, const at::Tensor &other)
    {
        return structured<Meta>(Form::Functional, {}, Impl, self, other);
    }
    static at::Tensor &inplace(at::Tensor &self, const at::Tensor &other)
    {
        structured<Meta>(Form::Inplace, self, Impl, self, other);
        return self;
    }
    static at::Tensor &out(const at::Tensor &self, const at::Tensor &other, at::Tensor &out)
    {
        structured<Meta>(Form::Out, out, Impl, self, other);
        return out;
    }
};

template <class Meta, void (*Impl)(at::TensorIteratorBase &)>
struct UnaryOps {
    static at::Tensor functional(const at::Tensor &self) { return structured<Meta>(Form::Functional, {}, Impl, self); }
    static at::Tensor &inplace(at::Tensor &self)
    {
        structured<Meta>(Form::Inplace, self, Impl, self);
        return self;
    }
    static at::Tensor &out(const at::Tensor &self, at::Tensor &out)
    {
        structured<Meta>(Form::Out, out, Impl, self);
        return out;
    }
};

// self + value * t1 * t2 and self + value * t1 / t2, and lerp with a scalar weight: the CPU's kernel
template <class Meta,
          at::Tensor (*Host)(const at::Tensor &, const at::Tensor &, const at::Tensor &, const at::Scalar &),
          at::Tensor &(*HostOut)(at::Tensor &, const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                 const at::Scalar &)>
struct PointwiseOps {
    static void impl(at::TensorIteratorBase &iter, const at::Scalar &value)
    {
        on_host(iter, [&](const std::vector<at::Tensor> &in) { return Host(in[0], in[1], in[2], value); },
                [&](at::Tensor &out, const std::vector<at::Tensor> &in) { HostOut(out, in[0], in[1], in[2], value); });
    }
    static at::Tensor functional(const at::Tensor &self, const at::Tensor &t1, const at::Tensor &t2,
                                 const at::Scalar &value)
    {
        return structured<Meta>(Form::Functional, {}, [&](at::TensorIteratorBase &it) { impl(it, value); }, self, t1,
                                t2, value);
    }
    static at::Tensor &inplace(at::Tensor &self, const at::Tensor &t1, const at::Tensor &t2, const at::Scalar &value)
    {
        structured<Meta>(Form::Inplace, self, [&](at::TensorIteratorBase &it) { impl(it, value); }, self, t1, t2,
                         value);
        return self;
    }
    static at::Tensor &out(const at::Tensor &self, const at::Tensor &t1, const at::Tensor &t2, const at::Scalar &value,
                           at::Tensor &out)
    {
        structured<Meta>(Form::Out, out, [&](at::TensorIteratorBase &it) { impl(it, value); }, self, t1, t2, value);
        return out;
    }
};

at::Tensor host_addcmul(const at::Tensor &s, const at::Tensor &a, const at::Tensor &b, const at::Scalar &v)
{
    return at::addcmul(s, a, b, v);
}
at::Tensor host_addcdiv(const at::Tensor &s, const at::Tensor &a, const at::Tensor &b, const at::Scalar &v)
{
    return at::addcdiv(s, a, b, v);
}
at::Tensor &host_addcmul_out(at::Tensor &out, const at::Tensor &s, const at::Tensor &a, const at::Tensor &b,
                             const at::Scalar &v)
{
    return at::addcmul_out(out, s, a, b, v);
}
at::Tensor &host_addcdiv_out(at::Tensor &out, const at::Tensor &s, const at::Tensor &a, const at::Tensor &b,
                             const at::Scalar &v)
{
    return at::addcdiv_out(out, s, a, b, v);
}

struct LerpOps {
    using Meta = at::meta::structured_lerp_Scalar;
    static void impl(at::TensorIteratorBase &iter, const at::Scalar &weight)
    {
        on_host(iter, [&](const std::vector<at::Tensor> &in) { return at::lerp(in[0], in[1], weight); },
                [&](at::Tensor &out, const std::vector<at::Tensor> &in) { at::lerp_out(out, in[0], in[1], weight); });
    }
    static at::Tensor functional(const at::Tensor &self, const at::Tensor &end, const at::Scalar &weight)
    {
        return structured<Meta>(Form::Functional, {}, [&](at::TensorIteratorBase &it) { impl(it, weight); }, self, end,
                                weight);
    }
    static at::Tensor &inplace(at::Tensor &self, const at::Tensor &end, const at::Scalar &weight)
    {
        structured<Meta>(Form::Inplace, self, [&](at::TensorIteratorBase &it) { impl(it, weight); }, self, end, weight);
        return self;
    }
    static at::Tensor &out(const at::Tensor &self, const at::Tensor &end, const at::Scalar &weight, at::Tensor &out)
    {
        structured<Meta>(Form::Out, out, [&](at::TensorIteratorBase &it) { impl(it, weight); }, self, end, weight);
        return out;
    }
};

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

// relu_ (nn.ReLU(inplace=True)): the kernel's result copied back (an output never overlaps an input)
at::Tensor &relu_inplace(at::Tensor &self)
{
    at::Tensor out = device_unary(ANYCHIP_OP_RELU, self);
    if (!out.defined())
        return at::native::call_fallback_fn<&cpu_fallback, at::_ops::relu_>::call(self);
    self.copy_(out);
    return self;
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
    // where the host addresses device memory: the CPU kernel of mm.out (the one the CPU's mm runs)
    // writes a device output made here where it is, through the fallback (not a host result copied);
    // the fallback is called directly, so the profiler records one aten::mm, as for the CPU's mm
    if (host_addressable() && a.dim() == 2 && b.dim() == 2 && a.device() == b.device() &&
        a.scalar_type() == b.scalar_type() && a.size(1) == b.size(0)) {
        c10::DeviceGuard guard(a.device());
        at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
        at::native::call_fallback_fn<&cpu_fallback, at::_ops::mm_out>::call(a, b, out);
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

}  // namespace

int dtype_of(at::ScalarType t) { return kernel_dtype(t); }

void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack) { cpu_fallback(op, stack); }

void use_kernels(const anychip_kernels *k, bool all)
{
    g_kernels = k;
    g_all_kernels = all;
}

bool has_kernels() { return g_kernels != nullptr; }

std::vector<std::pair<const char *, int64_t>> kernel_launch_counts()
{
    std::vector<std::pair<const char *, int64_t>> counts;
    for (int e = 0; e < K_ENTRIES; ++e)
        counts.emplace_back(kEntryNames[e], g_launches[e].load());
    return counts;
}

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
    m.impl("_to_cpu", to_cpu);
    m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
    m.impl("set_.source_Storage", set_source_storage);
    m.impl("set_.source_Tensor", set_source_tensor);
    m.impl("set_", set_empty);
    m.impl("fill_.Scalar", fill_scalar);
    m.impl("zero_", zero);
    m.impl("record_stream", record_stream);
    // the functional, in-place and out= forms of each op, from one implementation (above)
    using Add = AlphaOps<at::meta::structured_add_Tensor, false>;
    using Sub = AlphaOps<at::meta::structured_sub_Tensor, true>;
    m.impl("add.Tensor", Add::functional);
    m.impl("add_.Tensor", Add::inplace);
    m.impl("add.out", Add::out);
    m.impl("sub.Tensor", Sub::functional);
    m.impl("sub_.Tensor", Sub::inplace);
    m.impl("sub.out", Sub::out);
#define ANYCHIP_BINARY(name, schema, Meta, Op, Host)                                                   \
    m.impl(name "." schema, BinaryOps<Meta, binary_impl<Op, Host>>::functional);                     \
    m.impl(name "_." schema, BinaryOps<Meta, binary_impl<Op, Host>>::inplace);                       \
    m.impl(name "." schema "_out", BinaryOps<Meta, binary_impl<Op, Host>>::out);
    m.impl("mul.Tensor", BinaryOps<at::meta::structured_mul_Tensor, binary_impl<ANYCHIP_OP_MUL, host_mul>>::functional);
    m.impl("mul_.Tensor", BinaryOps<at::meta::structured_mul_Tensor, binary_impl<ANYCHIP_OP_MUL, host_mul>>::inplace);
    m.impl("mul.out", BinaryOps<at::meta::structured_mul_Tensor, binary_impl<ANYCHIP_OP_MUL, host_mul>>::out);
    m.impl("div.Tensor", BinaryOps<at::meta::structured_div_Tensor, binary_impl<ANYCHIP_OP_DIV, host_div>>::functional);
    m.impl("div_.Tensor", BinaryOps<at::meta::structured_div_Tensor, binary_impl<ANYCHIP_OP_DIV, host_div>>::inplace);
    m.impl("div.out", BinaryOps<at::meta::structured_div_Tensor, binary_impl<ANYCHIP_OP_DIV, host_div>>::out);
    ANYCHIP_BINARY("eq", "Tensor", at::meta::structured_eq_Tensor, ANYCHIP_OP_EQ, host_eq)
    ANYCHIP_BINARY("ne", "Tensor", at::meta::structured_ne_Tensor, ANYCHIP_OP_NE, host_ne)
    ANYCHIP_BINARY("lt", "Tensor", at::meta::structured_lt_Tensor, ANYCHIP_OP_LT, host_lt)
    ANYCHIP_BINARY("le", "Tensor", at::meta::structured_le_Tensor, ANYCHIP_OP_LE, host_le)
    ANYCHIP_BINARY("gt", "Tensor", at::meta::structured_gt_Tensor, ANYCHIP_OP_GT, host_gt)
    ANYCHIP_BINARY("ge", "Tensor", at::meta::structured_ge_Tensor, ANYCHIP_OP_GE, host_ge)
#undef ANYCHIP_BINARY
    using Maximum = BinaryOps<at::meta::structured_maximum, binary_impl<ANYCHIP_OP_MAX, host_maximum>>;
    using Minimum = BinaryOps<at::meta::structured_minimum, binary_impl<ANYCHIP_OP_MIN, host_minimum>>;
    m.impl("maximum", Maximum::functional);
    m.impl("maximum.out", Maximum::out);
    m.impl("minimum", Minimum::functional);
    m.impl("minimum.out", Minimum::out);
    using Neg = UnaryOps<at::meta::structured_neg, unary_impl<ANYCHIP_OP_NEG, host_neg>>;
    using Sqrt = UnaryOps<at::meta::structured_sqrt, host_unary<host_sqrt, host_sqrt_out>>;
    m.impl("neg", Neg::functional);
    m.impl("neg_", Neg::inplace);
    m.impl("neg.out", Neg::out);
    m.impl("sqrt", Sqrt::functional);
    m.impl("sqrt_", Sqrt::inplace);
    m.impl("sqrt.out", Sqrt::out);
    using Addcmul = PointwiseOps<at::meta::structured_addcmul, host_addcmul, host_addcmul_out>;
    using Addcdiv = PointwiseOps<at::meta::structured_addcdiv, host_addcdiv, host_addcdiv_out>;
    m.impl("addcmul", Addcmul::functional);
    m.impl("addcmul_", Addcmul::inplace);
    m.impl("addcmul.out", Addcmul::out);
    m.impl("addcdiv", Addcdiv::functional);
    m.impl("addcdiv_", Addcdiv::inplace);
    m.impl("addcdiv.out", Addcdiv::out);
    m.impl("lerp.Scalar", LerpOps::functional);
    m.impl("lerp_.Scalar", LerpOps::inplace);
    m.impl("lerp.Scalar_out", LerpOps::out);
    m.impl("relu", relu);
    m.impl("relu_", relu_inplace);
    m.impl("mm", mm);
    m.impl("sum", sum_all);
    m.impl("sum.dim_IntList", sum_dim);
    // ops with a CompositeExplicitAutograd decomposition that backends without a kernel get
    // (mish_backward and silu_backward: a CompositeImplicitAutograd one, which takes precedence
    // over a backend's fallback): the CPU kernel instead, through the fallback, so that the values
    // are the CPU's bit for bit (mse_loss and smooth_l1_loss: their generic kernel writes a reduced
    // loss into an output the CPU kernel then resizes, which warns on every call)
    for (const char *name : {"addr", "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
                             "native_group_norm_backward", "mse_loss", "smooth_l1_loss", "mish_backward", "silu_backward"})
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
}  // namespace anychip_torch
