/*
 * kernels_throw.cc's kernel-layer functions for a bridge built without a C++ compiler
 * (`anychip plugin paddle` where none is found; ANYCHIP_PADDLE_VIEWS_ONLY): there the kernel layer
 * registers only the strided views' copies (contiguous, strided_copy, fill), which Paddle 3.x asks a
 * custom device for with no CPU fallback, copying through the host, so that views work in default
 * mode; every other op takes Paddle's CPU fallback, and the profiler entries are left unset.
 *
 * What the C++ piece does with the C++ compiler is done here in C over the C++ runtime already in
 * Paddle's process, and the layouts Paddle's wheels are built with (libstdc++, the C++11 ABI):
 * - a kernel that cannot run throws Paddle's common::enforce::EnforceNotMet, built by its
 *   constructor in libphi_core.so around a common::ErrorSummary {int code; std::string msg;}, with
 *   libstdc++'s __cxa_allocate_exception and __cxa_throw (looked up in the process); the C units are
 *   compiled with -fexceptions, so it unwinds through them into Paddle, which makes it the op's
 *   Python error. Outside Paddle (no libphi_core.so) the message is printed and the process aborts:
 *   there is no caller that could take an error, and a kernel never returns a wrong result.
 * - a std::vector is {begin, end, end of storage}; a std::string {data, length, local buffer or
 *   capacity}.
 * - a Scalar or IntArray attribute is read with the C API's getter alone: where Paddle's executor
 *   computed the value in the program (a phi::TensorRef) the getter's own exception is the op's error
 *   (the C++ piece catches it and reads the tensor); the views' copies take no such attribute but
 *   fill's value, which eager code and the view ops' gradients give as a number.
 */
#include "bridge.h"

#include <dlfcn.h>

struct cxx_string {                       /* std::string, libstdc++'s C++11 ABI */
    char *data;
    size_t length;
    union {
        char local[16];
        size_t capacity;
    } u;
};

struct cxx_vector {                       /* std::vector<T>, libstdc++ */
    char *begin, *end, *end_of_storage;
};

struct error_summary {                    /* common::ErrorSummary of Paddle 3.x */
    int code;
    struct cxx_string msg;
};

enum { PRECONDITION_NOT_MET = 6, EXCEPTION_BYTES = 512 };   /* as in kernels_throw.cc */

typedef void (*enforce_ctor)(void *, const struct error_summary *, const char *, int);
typedef void *(*cxa_allocate_fn)(size_t);
typedef void (*cxa_throw_fn)(void *, void *, void (*)(void *)) __attribute__((noreturn));

void anychip_paddle_raise(const char *msg) __attribute__((noreturn));
void anychip_paddle_raise(const char *msg)
{
    static __thread char text[1024];
    void *phi = dlopen("libphi_core.so", RTLD_NOW | RTLD_NOLOAD);
    void *ctor = phi ? dlsym(phi, "_ZN6common7enforce13EnforceNotMetC1ERKNS_12ErrorSummaryEPKci") : NULL;
    void *dtor = phi ? dlsym(phi, "_ZN6common7enforce13EnforceNotMetD1Ev") : NULL;
    void *type = phi ? dlsym(phi, "_ZTIN6common7enforce13EnforceNotMetE") : NULL;
    void *alloc = dlsym(RTLD_DEFAULT, "__cxa_allocate_exception"), *thrower = dlsym(RTLD_DEFAULT, "__cxa_throw");
    if (phi)
        dlclose(phi);                     /* RTLD_NOLOAD took a reference to the loaded library */
    if (!ctor || !dtor || !type || !alloc || !thrower) {
        say("%s (no Paddle C++ runtime in this process to raise it with)", msg);
        abort();
    }
    snprintf(text, sizeof text, "%s", msg);
    struct error_summary summary = {PRECONDITION_NOT_MET, {text, strlen(text), {{0}}}};
    summary.msg.u.capacity = sizeof text - 1;
    void *e = ((cxa_allocate_fn)alloc)(EXCEPTION_BYTES);
    memset(e, 0, EXCEPTION_BYTES);
    ((enforce_ctor)ctor)(e, &summary, "csrc/paddle/kernels_c.c", __LINE__);
    ((cxa_throw_fn)thrower)(e, type, (void (*)(void *))dtor);
}

typedef void *(*attr_at_fn)(void *, size_t);

const void *anychip_paddle_attr(void *attr_at, const void *tensor_ref_at, void *ctx, size_t index, int *is_tensor);
const void *anychip_paddle_attr(void *attr_at, const void *tensor_ref_at, void *ctx, size_t index, int *is_tensor)
{
    (void)tensor_ref_at;
    *is_tensor = 0;
    return ((attr_at_fn)attr_at)(ctx, index);
}

const int64_t *anychip_paddle_i64s(const void *vec, size_t *n);
const int64_t *anychip_paddle_i64s(const void *vec, size_t *n)
{
    const struct cxx_vector *v = vec;
    *n = (size_t)(v->end - v->begin) / sizeof(int64_t);
    return (const int64_t *)(const void *)v->begin;
}

const int32_t *anychip_paddle_i32s(const void *vec, size_t *n);
const int32_t *anychip_paddle_i32s(const void *vec, size_t *n)
{
    const struct cxx_vector *v = vec;
    *n = (size_t)(v->end - v->begin) / sizeof(int32_t);
    return (const int32_t *)(const void *)v->begin;
}

void *const *anychip_paddle_ptrs(const void *vec, size_t *n);
void *const *anychip_paddle_ptrs(const void *vec, size_t *n)
{
    const struct cxx_vector *v = vec;
    *n = (size_t)(v->end - v->begin) / sizeof(void *);
    return (void *const *)(const void *)v->begin;
}

const char *anychip_paddle_str(const void *str)
{
    return ((const struct cxx_string *)str)->data;
}

/* Paddle's trace events hold std::strings this file does not build: the profiler entries are not
 * set in this build (init.c), so nothing is traced; -1 as where Paddle lacks the entries */
int anychip_paddle_trace_runtime(void *prof, const char *name, uint64_t start_ns, uint64_t end_ns, uint64_t pid,
                                 uint64_t tid, uint32_t correlation);
int anychip_paddle_trace_runtime(void *prof, const char *name, uint64_t start_ns, uint64_t end_ns, uint64_t pid,
                                 uint64_t tid, uint32_t correlation)
{
    (void)prof, (void)name, (void)start_ns, (void)end_ns, (void)pid, (void)tid, (void)correlation;
    return -1;
}

int anychip_paddle_trace_device(void *prof, const char *name, int type, uint64_t start_ns, uint64_t end_ns,
                                uint64_t device, uint64_t stream, uint32_t correlation, uint64_t bytes,
                                const char *copy, const char *src_kind, const char *dst_kind, uint32_t value);
int anychip_paddle_trace_device(void *prof, const char *name, int type, uint64_t start_ns, uint64_t end_ns,
                                uint64_t device, uint64_t stream, uint32_t correlation, uint64_t bytes,
                                const char *copy, const char *src_kind, const char *dst_kind, uint32_t value)
{
    (void)prof, (void)name, (void)type, (void)start_ns, (void)end_ns, (void)device, (void)stream;
    (void)correlation, (void)bytes, (void)copy, (void)src_kind, (void)dst_kind, (void)value;
    return -1;
}
