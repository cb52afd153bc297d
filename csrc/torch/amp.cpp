// Autocast for the device (torch.autocast("anychip", dtype=torch.float16 / torch.bfloat16); see
// docs/torch.md, "Autocast"): the AutocastPrivateUse1 kernels, with the op lists and cast
// policies torch gives CUDA (ATen/autocast_mode.h's AT_FORALL_* lists, which torch shares
// with backends for this purpose): matrix products and convolutions in the lower precision,
// the ops that need range in float32, the mixed-dtype ones promoted to their widest type.
// Every other op passes through.
#include <ATen/Functions.h>
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

// (the lists' signatures name these unqualified, as in ATen's own autocast_mode.cpp)
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m)
{
    m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m)
{
#define ANYCHIP_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define ANYCHIP_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define ANYCHIP_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define ANYCHIP_FP32_APPEND_DTYPE(...) KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(__VA_ARGS__)
#define ANYCHIP_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
    AT_FORALL_LOWER_PRECISION_FP(ANYCHIP_LOWER_PRECISION_FP)
    AT_FORALL_FP32(ANYCHIP_FP32)
    AT_FORALL_FP32_SET_OPT_DTYPE(ANYCHIP_FP32_SET_OPT_DTYPE)
    AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(ANYCHIP_FP32_APPEND_DTYPE)
    AT_FORALL_PROMOTE(ANYCHIP_PROMOTE)
#undef ANYCHIP_LOWER_PRECISION_FP
#undef ANYCHIP_FP32
#undef ANYCHIP_FP32_SET_OPT_DTYPE
#undef ANYCHIP_FP32_APPEND_DTYPE
#undef ANYCHIP_PROMOTE
}
