// The one C++ piece of the bridge's Paddle kernels (kernels.c): a kernel that cannot run
// raises, as Paddle's own kernels do, and Paddle turns the exception into the op's Python
// error. The C callers are compiled with -fexceptions, so it unwinds through them. Compiled
// with a C++ compiler and linked into the bridge (setup.py; `anychip plugin paddle`).
#include <stdexcept>

extern "C" void anychip_paddle_raise(const char *msg) __attribute__((noreturn));

extern "C" void anychip_paddle_raise(const char *msg) { throw std::runtime_error(msg); }

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
