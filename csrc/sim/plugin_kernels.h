/*
 * The simulated chips' tensor kernels (csrc/sim/kernels.c) as plugin.h's kernel table
 * (minor 1). Included by csrc/adapters/common.h only when an adapter is built into the
 * simulator, after the adapter's `USE()` and `fail()`, with KERNEL_FAILED the adapter's status
 * for a refused kernel. On a real chip the adapter would fill the table from the vendor's
 * kernel library instead.
 *
 * The face's streams are the simulator's streams (aclrtStream, XPUStream and hipStream_t
 * are one sim stream each), so each entry makes the device current and hands the call on,
 * with plugin.h's dtype codes turned into the simulator's (bool first there).
 */
#ifndef ANYCHIP_SIM_PLUGIN_KERNELS_H
#define ANYCHIP_SIM_PLUGIN_KERNELS_H

int anychip_simk_elementwise(void *stream, int op, int dtype, int ndim, const int64_t *shape, void *out,
                             const void *a, const int64_t *as, const void *b, const int64_t *bs);
int anychip_simk_unary(void *stream, int op, int out_dtype, int in_dtype, int ndim, const int64_t *shape, void *out,
                       const void *x, const int64_t *xs);
int anychip_simk_reduce(void *stream, int op, int out_dtype, int in_dtype, int64_t outer, int64_t n, int64_t inner,
                        void *out, const void *x);
int anychip_simk_gemm(void *stream, int dtype, int64_t m, int64_t k, int64_t n, void *out, const void *a,
                      int64_t as0, int64_t as1, const void *b, int64_t bs0, int64_t bs1);
int anychip_simk_fill(void *stream, int dtype, int64_t n, void *out, double fvalue, int64_t ivalue, int from_float);
const char *anychip_sim_last_error(void);

/* plugin.h's dtype -> the simulator's (K_BOOL = 0, then plugin.h's order); unknown codes stay unknown */
static int sim_dtype(anychip_dtype d)
{
    return d == ANYCHIP_BOOL ? 0 : (d >= ANYCHIP_INT8 && d <= ANYCHIP_FLOAT64) ? (int)d + 1 : -1;
}

static anychip_status kernel_result(int rc)
{
    if (rc == 0)
        return 0;
    const char *msg = anychip_sim_last_error();
    return fail(KERNEL_FAILED, "%s", msg && msg[0] ? msg : "the simulator refused the kernel");
}

static anychip_status k_binary(int device, anychip_stream stream, anychip_binary_op op, anychip_dtype dtype, int ndim,
                               const int64_t *shape, void *out, const void *a, const int64_t *as, const void *b,
                               const int64_t *bs)
{
    USE(device);
    return kernel_result(anychip_simk_elementwise(stream, (int)op, sim_dtype(dtype), ndim, shape, out, a, as, b, bs));
}

static anychip_status k_unary(int device, anychip_stream stream, anychip_unary_op op, anychip_dtype out_dtype,
                              anychip_dtype in_dtype, int ndim, const int64_t *shape, void *out, const void *x,
                              const int64_t *xs)
{
    USE(device);
    return kernel_result(
        anychip_simk_unary(stream, (int)op, sim_dtype(out_dtype), sim_dtype(in_dtype), ndim, shape, out, x, xs));
}

static anychip_status k_reduce(int device, anychip_stream stream, anychip_reduce_op op, anychip_dtype out_dtype,
                               anychip_dtype in_dtype, int64_t outer, int64_t n, int64_t inner, void *out,
                               const void *x)
{
    USE(device);
    return kernel_result(
        anychip_simk_reduce(stream, (int)op, sim_dtype(out_dtype), sim_dtype(in_dtype), outer, n, inner, out, x));
}

static anychip_status k_gemm(int device, anychip_stream stream, anychip_dtype dtype, int64_t m, int64_t k, int64_t n,
                             void *out, const void *a, int64_t as0, int64_t as1, const void *b, int64_t bs0,
                             int64_t bs1)
{
    USE(device);
    return kernel_result(anychip_simk_gemm(stream, sim_dtype(dtype), m, k, n, out, a, as0, as1, b, bs0, bs1));
}

static anychip_status k_fill(int device, anychip_stream stream, anychip_dtype dtype, int64_t n, void *out,
                             double fvalue, int64_t ivalue, int from_float)
{
    USE(device);
    return kernel_result(anychip_simk_fill(stream, sim_dtype(dtype), n, out, fvalue, ivalue, from_float));
}

#define SIM_ALL_DTYPES ((1u << (ANYCHIP_BOOL + 1)) - 1)
#define SIM_FLOAT_DTYPES \
    ((1u << ANYCHIP_FLOAT16) | (1u << ANYCHIP_BFLOAT16) | (1u << ANYCHIP_FLOAT32) | (1u << ANYCHIP_FLOAT64))

static const anychip_kernels SIM_KERNELS = {
    .version = ANYCHIP_KERNELS_VERSION,
    .binary_dtypes = SIM_ALL_DTYPES,
    .unary_dtypes = SIM_ALL_DTYPES,
    .reduce_dtypes = SIM_ALL_DTYPES & ~(1u << ANYCHIP_BOOL),
    .gemm_dtypes = SIM_FLOAT_DTYPES,
    .fill_dtypes = SIM_ALL_DTYPES,
    .binary = k_binary,
    .unary = k_unary,
    .reduce = k_reduce,
    .gemm = k_gemm,
    .fill = k_fill,
};

#endif
