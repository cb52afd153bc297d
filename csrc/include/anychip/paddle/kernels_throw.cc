// The one C++ piece of the bridge's Paddle kernels (kernels.c): a kernel that cannot run
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
    reinterpret_cast<enforce_ctor>(ctor)(e, &summary, "anychip/paddle/kernels_throw.cc", __LINE__);
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
// `const std::vector<int64_t> &` (strided_copy's dims and strides), a `std::vector<...*>` of
// tensors (by reference, or by value, which the Itanium ABI passes as a pointer to the caller's
// copy) and a `const std::string &` (momentum's regularization method).
#include <cstdint>
#include <vector>

extern "C" const int64_t *anychip_paddle_i64s(const void *vec, size_t *n);
extern "C" void *const *anychip_paddle_ptrs(const void *vec, size_t *n);
extern "C" const char *anychip_paddle_str(const void *str);

extern "C" const int64_t *anychip_paddle_i64s(const void *vec, size_t *n)
{
    const auto *v = static_cast<const std::vector<int64_t> *>(vec);
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
