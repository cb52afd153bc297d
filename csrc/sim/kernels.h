/*
 * What the simulated chips' kernel files share (csrc/sim/kernels*.c): the dtype and op codes,
 * the job record of elementwise and unary kernels, the n-d iteration and the float32 exp.
 * The kernels are split over several files so that they compile in parallel.
 */
#ifndef ANYCHIP_SIM_KERNELS_H
#define ANYCHIP_SIM_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* dtype codes (anychip/chips/_sim_kernels.py keeps the same table) */
enum { K_BOOL, K_I8, K_U8, K_I32, K_I64, K_F16, K_BF16, K_F32, K_F64, K_NDTYPES };
/* elementwise ops */
enum { E_ADD, E_SUB, E_MUL, E_DIV, E_EQ, E_NE, E_LT, E_LE, E_GT, E_GE, E_MAX, E_MIN, E_NOPS };
/* unary ops */
enum { U_COPY, U_RELU, U_EXP, U_LOG, U_NEG, U_SQRT, U_NOPS };
/* reductions */
enum { R_SUM, R_MEAN, R_MAX, R_NOPS };

#define K_MAXDIM 16

/* The float32 fast paths (contiguous operands) are compiled three times, for x86-64 with
 * AVX-512, with AVX2 + FMA and for the baseline, and the loader picks the widest the CPU has
 * (an ifunc): the library still runs on any x86-64. Only those small functions are cloned,
 * so the build stays quick; every other layout and type runs the general loops below. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && \
    !defined(__SANITIZE_THREAD__)
/* (not under ThreadSanitizer: an ifunc's resolver runs while the library is relocated,
 * before the sanitizer's runtime is set up, and its instrumented code crashes there) */
#define K_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define K_CLONES
#endif

/* ---- exp ------------------------------------------------------------------------------- */

static inline float bits_to_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* e^x in float32 without branches, so that loops over it vectorize (the C library's expf is
 * a call per element): Cephes' range reduction x = n ln2 + r (ln2 in two parts), a degree-6
 * polynomial for e^r, and 2^n applied as two factors so that results down to the smallest
 * subnormal round once. Within 1 ulp of the correctly rounded result; overflow gives inf,
 * underflow 0, NaN stays NaN. Every value is computed and then selected, never branched on. */
static inline float k_expf(float x)
{
    float xc = x > -104.0f ? x : -104.0f;           /* e^-104 rounds to 0; NaN also lands here */
    xc = xc < 89.0f ? xc : 89.0f;                   /* e^89 overflows */
    const float round = 12582912.0f;                /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (xc * 1.44269504088896341f + round) - round;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;      /* n in [-150, 129] */
    float res = p * bits_to_f((uint32_t)(n1 + 127) << 23) * bits_to_f((uint32_t)(n2 + 127) << 23);
    float nan = x + x;
    return x != x ? nan : res;
}

/* an elementwise or unary kernel's arguments, copied when it is enqueued */
typedef struct {
    int op, dtype, out_dtype, in_dtype, ndim;
    int64_t shape[K_MAXDIM], as[K_MAXDIM], bs[K_MAXDIM];
    char *out;
    const char *a, *b;
} ew_job;

/* iterate the outer dimensions of an n-d index; the innermost is left to the caller */
#define ND_BEGIN(J)                                                                          \
    int64_t idx_[K_MAXDIM] = {0};                                                            \
    int nd_ = (J)->ndim;                                                                     \
    int64_t inner_ = nd_ ? (J)->shape[nd_ - 1] : 1;                                          \
    int64_t sa_ = nd_ ? (J)->as[nd_ - 1] : 0, sb_ = nd_ ? (J)->bs[nd_ - 1] : 0;              \
    int64_t rows_ = 1;                                                                       \
    for (int d_ = 0; d_ + 1 < nd_; d_++)                                                     \
        rows_ *= (J)->shape[d_];                                                             \
    int64_t aoff_ = 0, boff_ = 0;                                                            \
    for (int64_t row_ = 0; row_ < rows_; row_++) {                                           \
        int64_t obase_ = row_ * inner_;

#define ND_END(J)                                                                            \
        for (int d_ = nd_ - 2; d_ >= 0; d_--) {                                              \
            aoff_ += (J)->as[d_];                                                            \
            boff_ += (J)->bs[d_];                                                            \
            if (++idx_[d_] < (J)->shape[d_])                                                 \
                break;                                                               \
            aoff_ -= (J)->as[d_] * (J)->shape[d_];                                           \
            boff_ -= (J)->bs[d_] * (J)->shape[d_];                                           \
            idx_[d_] = 0;                                                                    \
        }                                                                                    \
    }

#define ID(v) (v)
#define TO_BOOL(v) ((uint8_t)((v) ? 1 : 0))
#define FMAXNAN(x, y) (isnan(x) ? (x) : isnan(y) ? (y) : (x) > (y) ? (x) : (y))
#define FMINNAN(x, y) (isnan(x) ? (x) : isnan(y) ? (y) : (x) < (y) ? (x) : (y))

/* true when strides are those of a C-contiguous array of shape (dimensions of 1 aside) */
static inline int c_contiguous(int ndim, const int64_t *shape, const int64_t *strides)
{
    int64_t want = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] != 1 && strides[d] != want)
            return 0;
        want *= shape[d];
    }
    return 1;
}

static inline int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* the elementwise kernel (kernels_elementwise.c), run on a stream's worker */
void simk_run_elementwise(void *arg);

#endif
