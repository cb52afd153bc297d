// The aten kernels of anychip's PrivateUse1 device (see docs/torch.md; device.h lists the parts).
//
// Compute ops run on the CPU through at::native::cpu_fallback: the inputs are copied to
// the host, the CPU kernel runs, the outputs are copied back; a few run on the chip's own
// kernels where the library has plugin.h's kernel table (minor 1; "the chip's kernels" below).
// The ops that make, view, resize and fill tensors are the device's own.
#include <atomic>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
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

// The CPU fallback's copies of an op's device tensors (at::native::cpu_fallback hands them to
// at::_to_cpu): each as the same view would be on the CPU, so that the CPU kernel takes the path
// (and sums in the order) it takes there. torch's own .cpu() makes a tensor that is not dense (a
// strided slice, an expanded view) contiguous, which changed the order of a sum over it, and
// puts every copy at the start of a block, where a view's data on the CPU starts at its offset
// into a 64-byte aligned block (which the CPU's BLAS routines can follow). Here: the span of
// memory the tensor addresses, viewed with its strides, at its offset's place in that alignment.
std::vector<at::Tensor> to_cpu(at::TensorList tensors)
{
    constexpr int64_t kCpuAlignment = 64;          // c10's gAlignment: where a CPU block starts
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const at::Tensor &t : tensors) {
        if (!t.defined() || t.device().type() != kType) {
            out.push_back(t.defined() ? t.cpu() : t);
            continue;
        }
        int64_t item = static_cast<int64_t>(t.element_size());
        int64_t lead = kCpuAlignment % item == 0 ? t.storage_offset() % (kCpuAlignment / item) : 0;
        out.push_back(download(t, lead));
    }
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
