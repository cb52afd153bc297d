/*
 * The simulated chips' tensor kernels: elementwise (strided, broadcasting), unary and cast,
 * reductions over one axis, and GEMM. Each call checks its arguments, copies them into a
 * job and enqueues the job on a simulated stream (sim_enqueue_host_fn): the kernel then
 * runs on that stream's worker thread, in order with the stream's copies and collectives,
 * directly over device memory, as a chip's kernels run where the data is.
 *
 * Exactness follows NumPy: integer add / sub / mul / neg wrap (computed unsigned),
 * float16 and bfloat16 compute in float and round to nearest even, comparisons give
 * bool (one byte, 0 or 1), maximum propagates NaN. Sums of float16 / bfloat16 / float32
 * accumulate in double and round once; integer sums accumulate in int64 (wrapping).
 *
 * GEMM of float32 / float64 calls a CBLAS sgemm / dgemm when one was handed over with
 * anychip_simk_set_blas (the chip's BLAS library; the Python side passes NumPy's
 * OpenBLAS); otherwise, and for the other dtypes, a blocked loop runs.
 */
#define _GNU_SOURCE
/* the loops below are written to vectorize; -O2's cheap cost model leaves most of them scalar */
#pragma GCC optimize("O3")
#include "core.h"
#include "internal.h"
#include "common/half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static const int ITEMSIZE[K_NDTYPES] = {1, 1, 1, 4, 8, 2, 2, 4, 8};

/* ---- argument records -------------------------------------------------------------------- */

typedef struct {
    int op, out_dtype, in_dtype;
    int64_t outer, n, inner;
    char *out;
    const char *x;
} red_job;

typedef struct {
    int dtype;
    int64_t m, k, n, as0, as1, bs0, bs1;
    char *out;
    const char *a, *b;
} gemm_job;

/* CBLAS with 64-bit integers (ILP64), as NumPy's OpenBLAS exports it */
typedef void (*sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                         const float *, int64_t, float, float *, int64_t);
typedef void (*dgemm_fn)(int, int, int, int64_t, int64_t, int64_t, double, const double *, int64_t,
                         const double *, int64_t, double, double *, int64_t);
static _Atomic(sgemm_fn) g_sgemm;
static _Atomic(dgemm_fn) g_dgemm;

/* ---- unary and cast ---------------------------------------------------------------------- */

typedef union { int64_t i; double d; } kval;

static inline int is_float(int dt) { return dt >= K_F16; }

static inline kval load(const char *p, int dt)
{
    kval v;
    switch (dt) {
    case K_BOOL: v.i = *(const uint8_t *)p != 0; break;
    case K_I8: v.i = *(const int8_t *)p; break;
    case K_U8: v.i = *(const uint8_t *)p; break;
    case K_I32: v.i = *(const int32_t *)p; break;
    case K_I64: v.i = *(const int64_t *)p; break;
    case K_F16: v.d = half_to_float(*(const uint16_t *)p); break;
    case K_BF16: v.d = bf16_to_float(*(const uint16_t *)p); break;
    case K_F32: v.d = *(const float *)p; break;
    default: v.d = *(const double *)p; break;
    }
    return v;
}

/* d as a float "rounded to odd" (an inexact result gets an odd last bit): rounding that to
 * float16 or bfloat16 rounds d only once, as a direct conversion does (float64 -> float16 through
 * a plain float would round twice) */
static inline float float_odd(double d)
{
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((double)f != d && !(u & 1) && !isnan(d) && !isinf(f)) u += fabs((double)f) < fabs(d) ? 1 : (uint32_t)-1;
    memcpy(&f, &u, 4);
    return f;
}

/* C conversion of a value of the class of `from` (integer or float) to `dt` */
static inline void store(char *p, int dt, kval v, int from_float)
{
    if (from_float) {
        double d = v.d;
        switch (dt) {
        case K_BOOL: *(uint8_t *)p = d != 0; break;
        case K_I8: *(int8_t *)p = (int8_t)(int64_t)d; break;
        case K_U8: *(uint8_t *)p = (uint8_t)(int64_t)d; break;
        case K_I32: *(int32_t *)p = (int32_t)(int64_t)d; break;
        case K_I64: *(int64_t *)p = (int64_t)d; break;
        case K_F16: *(uint16_t *)p = float_to_half(float_odd(d)); break;
        case K_BF16: *(uint16_t *)p = float_to_bf16(float_odd(d)); break;
        case K_F32: *(float *)p = (float)d; break;
        default: *(double *)p = d; break;
        }
        return;
    }
    int64_t i = v.i;
    switch (dt) {
    case K_BOOL: *(uint8_t *)p = i != 0; break;
    case K_I8: *(int8_t *)p = (int8_t)i; break;
    case K_U8: *(uint8_t *)p = (uint8_t)i; break;
    case K_I32: *(int32_t *)p = (int32_t)i; break;
    case K_I64: *(int64_t *)p = i; break;
    case K_F16: *(uint16_t *)p = float_to_half((float)i); break;
    case K_BF16: *(uint16_t *)p = float_to_bf16((float)i); break;
    case K_F32: *(float *)p = (float)i; break;
    default: *(double *)p = (double)i; break;
    }
}

static inline kval apply_unary(int op, int dt, kval v)
{
    if (is_float(dt)) {
        if (dt == K_F64) {
            switch (op) {
            case U_RELU: v.d = isnan(v.d) ? v.d : v.d > 0 ? v.d : 0.0; break;
            case U_EXP: v.d = exp(v.d); break;
            case U_LOG: v.d = log(v.d); break;
            case U_NEG: v.d = -v.d; break;
            case U_SQRT: v.d = sqrt(v.d); break;
            default: break;
            }
        } else {
            float f = (float)v.d;
            switch (op) {
            case U_RELU: f = isnan(f) ? f : f > 0 ? f : 0.0f; break;
            case U_EXP: f = k_expf(f); break;
            case U_LOG: f = logf(f); break;
            case U_NEG: f = -f; break;
            case U_SQRT: f = sqrtf(f); break;
            default: break;
            }
            v.d = f;
        }
        return v;
    }
    if (op == U_RELU)
        v.i = v.i > 0 ? v.i : 0;
    else if (op == U_NEG)
        v.i = (int64_t)(0 - (uint64_t)v.i);
    return v;
}

/* same-type float ops, one loop per op (NaN stays NaN in relu, as np.maximum(x, 0)) */
#define UNARY_LOOP(N, SA, BODY)                                                              \
    do {                                                                                     \
        if ((SA) == 1)                  /* contiguous: the loop that vectorizes */           \
            for (int64_t i = 0; i < (N); i++) { const int64_t k_ = i; BODY; }                \
        else                                                                                 \
            for (int64_t i = 0; i < (N); i++) { const int64_t k_ = i * (SA); BODY; }         \
    } while (0)

#define UNARY_TYPED(OP, T, RX, RO, SA, N, EXP, LOG)                                           \
    do {                                                                                     \
        const T *x_ = (const T *)(RX);                                                       \
        T *o_ = (T *)(RO);                                                                   \
        switch (OP) {                                                                        \
        case U_COPY: UNARY_LOOP(N, SA, o_[i] = x_[k_]); break;                               \
        case U_RELU:                                                                         \
            UNARY_LOOP(N, SA, T v = x_[k_]; o_[i] = v > 0 ? v : (v != v ? v : (T)0));         \
            break;                                                                           \
        case U_EXP: UNARY_LOOP(N, SA, o_[i] = EXP(x_[k_])); break;                           \
        case U_LOG: UNARY_LOOP(N, SA, o_[i] = LOG(x_[k_])); break;                           \
        case U_NEG: UNARY_LOOP(N, SA, o_[i] = -x_[k_]); break;                               \
        /* in double, then rounded once: the correctly rounded root for float too */         \
        case U_SQRT: UNARY_LOOP(N, SA, o_[i] = (T)sqrt((double)x_[k_])); break;               \
        default: break;                                                                      \
        }                                                                                    \
    } while (0)

K_CLONES static void unary_f32_flat(int op, const float *x, float *o, int64_t n)
{
    UNARY_TYPED(op, float, x, o, 1, n, k_expf, logf);
}

static void run_unary(void *arg)
{
    ew_job *j = arg;
    if (j->in_dtype == K_F32 && j->out_dtype == K_F32 && j->op != U_COPY && c_contiguous(j->ndim, j->shape, j->as)) {
        unary_f32_flat(j->op, (const float *)j->a, (float *)j->out, numel(j->ndim, j->shape));
        free(j);
        return;
    }
    int isz = ITEMSIZE[j->in_dtype], osz = ITEMSIZE[j->out_dtype];
    int ff = is_float(j->in_dtype);
    const char *px = j->a;
    char *po = j->out;
    ND_BEGIN(j)
    const char *rx = px + aoff_ * isz;
    char *ro = po + obase_ * osz;
    if (j->op == U_COPY && j->in_dtype == j->out_dtype) {
        if (sa_ == 1)
            memcpy(ro, rx, (size_t)(inner_ * isz));
        else
            for (int64_t i = 0; i < inner_; i++)
                memcpy(ro + i * osz, rx + i * sa_ * isz, (size_t)isz);
    } else if (j->in_dtype == j->out_dtype && j->in_dtype == K_F32) {
        UNARY_TYPED(j->op, float, rx, ro, sa_, inner_, k_expf, logf);
    } else if (j->in_dtype == j->out_dtype && j->in_dtype == K_F64) {
        UNARY_TYPED(j->op, double, rx, ro, sa_, inner_, exp, log);
    } else if (j->op == U_COPY && j->in_dtype == K_F32 && j->out_dtype == K_F16) {
        const float *x = (const float *)rx;
        uint16_t *o = (uint16_t *)ro;
        for (int64_t i = 0; i < inner_; i++)
            o[i] = float_to_half(x[i * sa_]);
    } else if (j->op == U_COPY && j->in_dtype == K_F16 && j->out_dtype == K_F32) {
        const uint16_t *x = (const uint16_t *)rx;
        float *o = (float *)ro;
        for (int64_t i = 0; i < inner_; i++)
            o[i] = half_to_float(x[i * sa_]);
    } else {
        for (int64_t i = 0; i < inner_; i++)
            store(ro + i * osz, j->out_dtype, apply_unary(j->op, j->in_dtype, load(rx + i * sa_ * isz, j->in_dtype)),
                  ff);
    }
    (void)sb_;
    (void)boff_;
    ND_END(j)
    free(j);
}

/* ---- reductions -------------------------------------------------------------------------- */

#define LANES 8

/* float32 / float64 input, accumulated in double; out of the same type */
#define REDUCE_TYPED(J, T)                                                                   \
    do {                                                                                     \
        double *acc = malloc(sizeof(double) * (size_t)((J)->inner > LANES ? (J)->inner : LANES)); \
        if (!acc)                                                                            \
            break;                                                                           \
        for (int64_t o = 0; o < (J)->outer; o++) {                                           \
            const T *base = (const T *)(J)->x + o * (J)->n * (J)->inner;                     \
            T *out = (T *)(J)->out + o * (J)->inner;                                         \
            if ((J)->inner == 1 && (J)->op != R_MAX) {                                       \
                for (int l = 0; l < LANES; l++)                                              \
                    acc[l] = 0.0;                                                            \
                int64_t r = 0;                                                               \
                for (; r + LANES <= (J)->n; r += LANES)                                      \
                    for (int l = 0; l < LANES; l++)                                          \
                        acc[l] += base[r + l];                                               \
                double s = 0.0;                                                              \
                for (int l = 0; l < LANES; l++)                                              \
                    s += acc[l];                                                             \
                for (; r < (J)->n; r++)                                                      \
                    s += base[r];                                                            \
                out[0] = (T)((J)->op == R_MEAN ? s / (double)(J)->n : s);                    \
                continue;                                                                    \
            }                                                                                \
            for (int64_t i = 0; i < (J)->inner; i++)                                         \
                acc[i] = (J)->op == R_MAX ? base[i] : 0.0;                                   \
            int64_t r = (J)->op == R_MAX ? 1 : 0;                                            \
            if ((J)->op != R_MAX && sizeof(T) == 4)                                          \
                /* float rows four at a time: one pass over acc for four rows (sums of     \
                 * two floats are all but always exact in double) */                       \
                for (; r + 4 <= (J)->n; r += 4) {                                            \
                    const T *r0 = base + r * (J)->inner, *r1 = r0 + (J)->inner;              \
                    const T *r2 = r1 + (J)->inner, *r3 = r2 + (J)->inner;                    \
                    for (int64_t i = 0; i < (J)->inner; i++)                                 \
                        acc[i] += ((double)r0[i] + (double)r1[i]) + ((double)r2[i] + (double)r3[i]); \
                }                                                                            \
            for (; r < (J)->n; r++) {                                                        \
                const T *row = base + r * (J)->inner;                                        \
                if ((J)->op == R_MAX)                                                        \
                    for (int64_t i = 0; i < (J)->inner; i++)                                 \
                        acc[i] = FMAXNAN(acc[i], (double)row[i]);                            \
                else                                                                         \
                    for (int64_t i = 0; i < (J)->inner; i++)                                 \
                        acc[i] += row[i];                                                    \
            }                                                                                \
            for (int64_t i = 0; i < (J)->inner; i++)                                         \
                out[i] = (T)((J)->op == R_MEAN ? acc[i] / (double)(J)->n : acc[i]);          \
        }                                                                                    \
        free(acc);                                                                           \
    } while (0)

K_CLONES static void reduce_f32(red_job *j)
{
    REDUCE_TYPED(j, float);
}

static void run_reduce(void *arg)
{
    red_job *j = arg;
    if (j->in_dtype == j->out_dtype && (j->in_dtype == K_F32 || j->in_dtype == K_F64)) {
        if (j->in_dtype == K_F32)
            reduce_f32(j);
        else
            REDUCE_TYPED(j, double);
        free(j);
        return;
    }
    int isz = ITEMSIZE[j->in_dtype], osz = ITEMSIZE[j->out_dtype];
    int ff = is_float(j->in_dtype);
    kval *acc = malloc(sizeof(kval) * (size_t)(j->inner ? j->inner : 1));
    if (!acc) {
        free(j);
        return;     /* cannot happen in practice: the inner size was checked at enqueue */
    }
    for (int64_t o = 0; o < j->outer; o++) {
        const char *base = j->x + o * j->n * j->inner * isz;
        for (int64_t i = 0; i < j->inner; i++) {
            if (j->op == R_MAX)
                acc[i] = load(base + i * isz, j->in_dtype);
            else if (ff)
                acc[i].d = 0.0;
            else
                acc[i].i = 0;
        }
        for (int64_t r = (j->op == R_MAX ? 1 : 0); r < j->n; r++) {
            const char *row = base + r * j->inner * isz;
            for (int64_t i = 0; i < j->inner; i++) {
                kval v = load(row + i * isz, j->in_dtype);
                if (j->op == R_MAX) {
                    if (ff)
                        acc[i].d = FMAXNAN(acc[i].d, v.d);
                    else
                        acc[i].i = acc[i].i > v.i ? acc[i].i : v.i;
                } else if (ff)
                    acc[i].d += v.d;
                else
                    acc[i].i = (int64_t)((uint64_t)acc[i].i + (uint64_t)v.i);
            }
        }
        char *out = j->out + o * j->inner * osz;
        for (int64_t i = 0; i < j->inner; i++) {
            kval v = acc[i];
            int vf = ff;
            if (j->op == R_MEAN) {
                v.d = (ff ? v.d : (double)v.i) / (double)j->n;
                vf = 1;
            }
            store(out + i * osz, j->out_dtype, v, vf);
        }
    }
    free(acc);
    free(j);
}

/* ---- GEMM -------------------------------------------------------------------------------- */

enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };

/* (transpose flag, leading dimension) of a strided matrix for CBLAS, or 0 when it has none */
static int blas_layout(int64_t s0, int64_t s1, int64_t rows, int64_t cols, int *trans, int64_t *ld)
{
    if (s1 == 1 && s0 >= (cols > 1 ? cols : 1)) {
        *trans = CblasNoTrans;
        *ld = s0;
        return 1;
    }
    if (s0 == 1 && s1 >= (rows > 1 ? rows : 1)) {
        *trans = CblasTrans;
        *ld = s1;
        return 1;
    }
    return 0;
}

static int gemm_blas(gemm_job *j)
{
    int ta, tb;
    int64_t lda, ldb;
    if (!blas_layout(j->as0, j->as1, j->m, j->k, &ta, &lda) || !blas_layout(j->bs0, j->bs1, j->k, j->n, &tb, &ldb))
        return 0;
    if (j->dtype == K_F32) {
        sgemm_fn f = g_sgemm;
        if (!f)
            return 0;
        f(CblasRowMajor, ta, tb, j->m, j->n, j->k, 1.0f, (const float *)j->a, lda, (const float *)j->b, ldb, 0.0f,
          (float *)j->out, j->n > 0 ? j->n : 1);
        return 1;
    }
    if (j->dtype == K_F64) {
        dgemm_fn f = g_dgemm;
        if (!f)
            return 0;
        f(CblasRowMajor, ta, tb, j->m, j->n, j->k, 1.0, (const double *)j->a, lda, (const double *)j->b, ldb, 0.0,
          (double *)j->out, j->n > 0 ? j->n : 1);
        return 1;
    }
    return 0;
}

/* C[i, :] = sum_k A[i, k] * B[k, :], row by row, accumulating in ACC (floats) or wrapping U (ints) */
#define GEMM_LOOP(J, T, ACC, LD, ST, MADD)                                                   \
    do {                                                                                     \
        const T *A = (const T *)(J)->a, *B = (const T *)(J)->b;                              \
        T *Cm = (T *)(J)->out;                                                               \
        ACC *row = malloc(sizeof(ACC) * (size_t)((J)->n ? (J)->n : 1));                      \
        if (!row)                                                                            \
            break;                                                                           \
        for (int64_t i = 0; i < (J)->m; i++) {                                               \
            for (int64_t c = 0; c < (J)->n; c++)                                             \
                row[c] = 0;                                                                  \
            for (int64_t kk = 0; kk < (J)->k; kk++) {                                        \
                ACC av = LD(A[i * (J)->as0 + kk * (J)->as1]);                                \
                const T *br = B + kk * (J)->bs0;                                             \
                if ((J)->bs1 == 1)                                                           \
                    for (int64_t c = 0; c < (J)->n; c++)                                     \
                        row[c] = MADD(row[c], av, LD(br[c]));                                \
                else                                                                         \
                    for (int64_t c = 0; c < (J)->n; c++)                                     \
                        row[c] = MADD(row[c], av, LD(br[c * (J)->bs1]));                     \
            }                                                                                \
            for (int64_t c = 0; c < (J)->n; c++)                                             \
                Cm[i * (J)->n + c] = ST(row[c]);                                             \
        }                                                                                    \
        free(row);                                                                           \
    } while (0)

#define FMADD(acc, a, b) ((acc) + (a) * (b))
#define UMADD64(acc, a, b) ((uint64_t)(acc) + (uint64_t)(a) * (uint64_t)(b))
#define TO_U8BOOL(v) ((uint8_t)((v) != 0))
#define BOR(acc, a, b) ((acc) | ((a) & (b)))

static void run_gemm(void *arg)
{
    gemm_job *j = arg;
    if (!gemm_blas(j)) {
        switch (j->dtype) {
        case K_BOOL: GEMM_LOOP(j, uint8_t, uint8_t, ID, TO_U8BOOL, BOR); break;
        case K_I8: GEMM_LOOP(j, int8_t, uint64_t, ID, (int8_t), UMADD64); break;
        case K_U8: GEMM_LOOP(j, uint8_t, uint64_t, ID, (uint8_t), UMADD64); break;
        case K_I32: GEMM_LOOP(j, int32_t, uint64_t, ID, (int32_t), UMADD64); break;
        case K_I64: GEMM_LOOP(j, int64_t, uint64_t, ID, (int64_t), UMADD64); break;
        case K_F16: GEMM_LOOP(j, uint16_t, float, half_to_float, float_to_half, FMADD); break;
        case K_BF16: GEMM_LOOP(j, uint16_t, float, bf16_to_float, float_to_bf16, FMADD); break;
        case K_F32: GEMM_LOOP(j, float, float, ID, ID, FMADD); break;
        case K_F64: GEMM_LOOP(j, double, double, ID, ID, FMADD); break;
        default: break;
        }
    }
    free(j);
}

/* ---- entry points ------------------------------------------------------------------------ */

static int bad_dtype(int dt) { return dt < 0 || dt >= K_NDTYPES; }

/* every byte the strided operand reads or writes must lie in one live device allocation */
static int check_span(const void *p, int item, int ndim, const int64_t *shape, const int64_t *strides,
                      const char *what)
{
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0)
            return SIM_OK;
        int64_t ext = (shape[d] - 1) * (strides ? strides[d] : 0);
        if (ext < 0)
            lo += ext;
        else
            hi += ext;
    }
    sim_ref ref;
    return sim_check_range((const char *)p + lo * item, (size_t)((hi - lo + 1) * item), WANT_DEVICE, &ref, what);
}

static int enqueue(void *stream, void (*fn)(void *), void *job)
{
    int st = sim_enqueue_host_fn(stream, fn, job);
    if (st != SIM_OK)
        free(job);
    return st;
}

/* C-order strides of shape (in elements) */
static const int64_t *contiguous(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t acc = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = acc;
        acc *= shape[d] > 0 ? shape[d] : 1;
    }
    return strides;
}

static int ew_setup(ew_job **out, int ndim, const int64_t *shape, void *dst, const void *a, const int64_t *as,
                    const void *b, const int64_t *bs)
{
    if (ndim < 0 || ndim > K_MAXDIM)
        return sim_fail(SIM_E_INVALID_VALUE, "tensor kernel: %d dimensions (at most %d)", ndim, K_MAXDIM);
    if (!dst || !a)
        return sim_fail(SIM_E_INVALID_VALUE, "tensor kernel: NULL operand");
    if (!out)
        return SIM_OK;
    ew_job *j = calloc(1, sizeof *j);
    if (!j)
        return sim_fail(SIM_E_HOST_ALLOC, "tensor kernel: out of host memory");
    j->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        j->shape[d] = shape[d];
        j->as[d] = as[d];
        j->bs[d] = bs ? bs[d] : 0;
    }
    j->out = dst;
    j->a = a;
    j->b = b;
    *out = j;
    return SIM_OK;
}

SIM_EXPORT int anychip_simk_elementwise(void *stream, int op, int dtype, int ndim, const int64_t *shape, void *out,
                                        const void *a, const int64_t *as, const void *b, const int64_t *bs)
{
    if (op < 0 || op >= E_NOPS || bad_dtype(dtype) || !b)
        return sim_fail(SIM_E_INVALID_VALUE, "elementwise kernel: bad op %d, dtype %d or NULL operand", op, dtype);
    if (op == E_DIV && !is_float(dtype))
        return sim_fail(SIM_E_INVALID_VALUE, "elementwise kernel: div takes floats");
    int64_t ones[K_MAXDIM] = {0};
    int st = ew_setup(NULL, ndim, shape, out, a, as, b, bs);
    if (st == SIM_OK)
        st = check_span(out, op >= E_EQ && op <= E_GE ? 1 : ITEMSIZE[dtype], ndim, shape, contiguous(ndim, shape, ones),
                        "elementwise output");
    if (st == SIM_OK)
        st = check_span(a, ITEMSIZE[dtype], ndim, shape, as, "elementwise input a");
    if (st == SIM_OK)
        st = check_span(b, ITEMSIZE[dtype], ndim, shape, bs, "elementwise input b");
    ew_job *j;
    if (st == SIM_OK)
        st = ew_setup(&j, ndim, shape, out, a, as, b, bs);
    if (st != SIM_OK)
        return st;
    j->op = op;
    j->dtype = dtype;
    return enqueue(stream, simk_run_elementwise, j);
}

SIM_EXPORT int anychip_simk_unary(void *stream, int op, int out_dtype, int in_dtype, int ndim, const int64_t *shape,
                                  void *out, const void *x, const int64_t *xs)
{
    if (op < 0 || op >= U_NOPS || bad_dtype(out_dtype) || bad_dtype(in_dtype))
        return sim_fail(SIM_E_INVALID_VALUE, "unary kernel: bad op %d or dtypes %d, %d", op, out_dtype, in_dtype);
    int64_t ones[K_MAXDIM] = {0};
    int st = ew_setup(NULL, ndim, shape, out, x, xs, NULL, NULL);
    if (st == SIM_OK)
        st = check_span(out, ITEMSIZE[out_dtype], ndim, shape, contiguous(ndim, shape, ones), "unary output");
    if (st == SIM_OK)
        st = check_span(x, ITEMSIZE[in_dtype], ndim, shape, xs, "unary input");
    ew_job *j;
    if (st == SIM_OK)
        st = ew_setup(&j, ndim, shape, out, x, xs, NULL, NULL);
    if (st != SIM_OK)
        return st;
    j->op = op;
    j->in_dtype = in_dtype;
    j->out_dtype = out_dtype;
    return enqueue(stream, run_unary, j);
}

SIM_EXPORT int anychip_simk_reduce(void *stream, int op, int out_dtype, int in_dtype, int64_t outer, int64_t n,
                                   int64_t inner, void *out, const void *x)
{
    if (op < 0 || op >= R_NOPS || bad_dtype(out_dtype) || bad_dtype(in_dtype) || outer < 0 || n < 0 || inner < 0)
        return sim_fail(SIM_E_INVALID_VALUE, "reduce kernel: bad op %d, dtypes or sizes", op);
    if (!out || !x)
        return sim_fail(SIM_E_INVALID_VALUE, "reduce kernel: NULL operand");
    int64_t in_shape[1] = {outer * n * inner}, out_shape[1] = {outer * inner}, one[1] = {1};
    int st = check_span(x, ITEMSIZE[in_dtype], 1, in_shape, one, "reduce input");
    if (st == SIM_OK)
        st = check_span(out, ITEMSIZE[out_dtype], 1, out_shape, one, "reduce output");
    if (st != SIM_OK)
        return st;
    red_job *j = calloc(1, sizeof *j);
    if (!j)
        return sim_fail(SIM_E_HOST_ALLOC, "reduce kernel: out of host memory");
    *j = (red_job){.op = op, .out_dtype = out_dtype, .in_dtype = in_dtype, .outer = outer, .n = n, .inner = inner,
                   .out = out, .x = x};
    return enqueue(stream, run_reduce, j);
}

SIM_EXPORT int anychip_simk_gemm(void *stream, int dtype, int64_t m, int64_t k, int64_t n, void *out, const void *a,
                                 int64_t as0, int64_t as1, const void *b, int64_t bs0, int64_t bs1)
{
    if (bad_dtype(dtype) || m < 0 || k < 0 || n < 0 || !out || !a || !b)
        return sim_fail(SIM_E_INVALID_VALUE, "gemm kernel: bad dtype %d, sizes or NULL operand", dtype);
    int64_t ash[2] = {m, k}, ast[2] = {as0, as1}, bsh[2] = {k, n}, bst[2] = {bs0, bs1}, osh[1] = {m * n}, one[1] = {1};
    int st = check_span(a, ITEMSIZE[dtype], 2, ash, ast, "gemm input a");
    if (st == SIM_OK)
        st = check_span(b, ITEMSIZE[dtype], 2, bsh, bst, "gemm input b");
    if (st == SIM_OK)
        st = check_span(out, ITEMSIZE[dtype], 1, osh, one, "gemm output");
    if (st != SIM_OK)
        return st;
    gemm_job *j = calloc(1, sizeof *j);
    if (!j)
        return sim_fail(SIM_E_HOST_ALLOC, "gemm kernel: out of host memory");
    *j = (gemm_job){.dtype = dtype, .m = m, .k = k, .n = n, .as0 = as0, .as1 = as1, .bs0 = bs0, .bs1 = bs1,
                    .out = out, .a = a, .b = b};
    return enqueue(stream, run_gemm, j);
}

/* ---- fill -------------------------------------------------------------------------------- */

typedef struct {
    int dtype, from_float;
    int64_t n;
    kval v;
    char *out;
} fill_job;

static void run_fill(void *arg)
{
    fill_job *j = arg;
    int sz = ITEMSIZE[j->dtype];
    if (j->n > 0) {
        store(j->out, j->dtype, j->v, j->from_float);
        int64_t done = 1;                   /* double the filled prefix until it covers n */
        while (done < j->n) {
            int64_t step = done < j->n - done ? done : j->n - done;
            memcpy(j->out + done * sz, j->out, (size_t)(step * sz));
            done += step;
        }
    }
    free(j);
}

/* out[0:n] = the value, converted to dtype as a cast would: `fvalue` for float dtypes, or
 * when from_float is set; `ivalue` (exact to 64 bits) otherwise */
SIM_EXPORT int anychip_simk_fill(void *stream, int dtype, int64_t n, void *out, double fvalue, int64_t ivalue,
                                 int from_float)
{
    if (bad_dtype(dtype) || n < 0 || !out)
        return sim_fail(SIM_E_INVALID_VALUE, "fill kernel: bad dtype %d, size %lld or NULL output", dtype,
                        (long long)n);
    int64_t shape[1] = {n}, one[1] = {1};
    int st = check_span(out, ITEMSIZE[dtype], 1, shape, one, "fill output");
    if (st != SIM_OK)
        return st;
    fill_job *j = calloc(1, sizeof *j);
    if (!j)
        return sim_fail(SIM_E_HOST_ALLOC, "fill kernel: out of host memory");
    j->dtype = dtype;
    j->n = n;
    j->out = out;
    j->from_float = from_float || is_float(dtype);
    if (j->from_float)
        j->v.d = fvalue;
    else
        j->v.i = ivalue;
    return enqueue(stream, run_fill, j);
}

SIM_EXPORT void anychip_simk_set_blas(void *sgemm, void *dgemm)
{
    g_sgemm = (sgemm_fn)sgemm;
    g_dgemm = (dgemm_fn)dgemm;
}
