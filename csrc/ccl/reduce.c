#include "internal.h"

/* ========================================================================== */
/* reduction kernels                                                           */
/* ========================================================================== */

#define BLK 512
#define ID(x) (x)

#define APPLY(OP, A, acc, s, m, LOAD)                                                          \
    switch (OP) {                                                                               \
    case CCL_SUM:                                                                               \
    case CCL_AVG:                                                                               \
        for (size_t i = 0; i < m; i++) acc[i] = (A)(acc[i] + (A)LOAD(s[i]));                    \
        break;                                                                                  \
    case CCL_PROD:                                                                              \
        for (size_t i = 0; i < m; i++) acc[i] = (A)(acc[i] * (A)LOAD(s[i]));                    \
        break;                                                                                  \
    case CCL_MIN:                                                                               \
        for (size_t i = 0; i < m; i++) { A v = (A)LOAD(s[i]); acc[i] = v < acc[i] ? v : acc[i]; } \
        break;                                                                                  \
    case CCL_MAX:                                                                               \
        for (size_t i = 0; i < m; i++) { A v = (A)LOAD(s[i]); acc[i] = v > acc[i] ? v : acc[i]; } \
        break;                                                                                  \
    }

#define APPLY2(OP, A, acc, s0, s1, m, LOAD)                                                     \
    switch (OP) {                                                                               \
    case CCL_SUM:                                                                               \
    case CCL_AVG:                                                                               \
        for (size_t i = 0; i < m; i++) acc[i] = (A)((A)LOAD(s0[i]) + (A)LOAD(s1[i]));           \
        break;                                                                                  \
    case CCL_PROD:                                                                              \
        for (size_t i = 0; i < m; i++) acc[i] = (A)((A)LOAD(s0[i]) * (A)LOAD(s1[i]));           \
        break;                                                                                  \
    case CCL_MIN:                                                                               \
        for (size_t i = 0; i < m; i++) { A a = (A)LOAD(s0[i]), b = (A)LOAD(s1[i]); acc[i] = b < a ? b : a; } \
        break;                                                                                  \
    default:                                                                                    \
        for (size_t i = 0; i < m; i++) { A a = (A)LOAD(s0[i]), b = (A)LOAD(s1[i]); acc[i] = b > a ? b : a; } \
        break;                                                                                  \
    }

/* T: element type, A: accumulator type (ints: wide, so avg divides the true sum;
 * halves: float). Sources are combined in order, so every caller gets the same bits.
 * Elements are accessed through 1-byte-aligned types: views may start at any byte. */
#define DEF_REDUCE(NAME, T, A, LOAD, STORE)                                                    \
    typedef T NAME##_u __attribute__((aligned(1)));                                             \
    static void NAME(void *const *dsts, int nd, const void *const *src, int ns, size_t n, int op, int div) \
    {                                                                                           \
        A acc[BLK];                                                                             \
        for (size_t base = 0; base < n; base += BLK) {                                          \
            size_t m = MIN((size_t)BLK, n - base);                                              \
            const NAME##_u *s0 = (const NAME##_u *)src[0] + base;                               \
            int k = 1;                                                                          \
            if (ns >= 2) { /* the first two sources in one pass */                             \
                const NAME##_u *s1 = (const NAME##_u *)src[1] + base;                           \
                APPLY2(op, A, acc, s0, s1, m, LOAD)                                             \
                k = 2;                                                                          \
            } else {                                                                            \
                for (size_t i = 0; i < m; i++) acc[i] = (A)LOAD(s0[i]);                         \
            }                                                                                   \
            for (; k < ns; k++) {                                                               \
                const NAME##_u *s = (const NAME##_u *)src[k] + base;                            \
                APPLY(op, A, acc, s, m, LOAD)                                                   \
            }                                                                                   \
            if (op == CCL_AVG)                                                                  \
                for (size_t i = 0; i < m; i++) acc[i] = (A)(acc[i] / (A)div);                   \
            for (int d = 0; d < nd; d++) {                                                      \
                NAME##_u *dst = (NAME##_u *)dsts[d] + base;                                     \
                for (size_t i = 0; i < m; i++) dst[i] = STORE(acc[i]);                          \
            }                                                                                   \
        }                                                                                       \
    }

DEF_REDUCE(red_i8, int8_t, int64_t, ID, (int8_t))
DEF_REDUCE(red_u8, uint8_t, int64_t, ID, (uint8_t))
DEF_REDUCE(red_i32, int32_t, int64_t, ID, (int32_t))
DEF_REDUCE(red_i64, int64_t, int64_t, ID, (int64_t))
DEF_REDUCE(red_f16, uint16_t, float, half_to_float, float_to_half)
DEF_REDUCE(red_bf16, uint16_t, float, bf16_to_float, float_to_bf16)
DEF_REDUCE(red_f32, float, float, ID, (float))
DEF_REDUCE(red_f64, double, double, ID, (double))
DEF_REDUCE(red_i16, int16_t, int64_t, ID, (int16_t))
DEF_REDUCE(red_u16, uint16_t, int64_t, ID, (uint16_t))
DEF_REDUCE(red_u32, uint32_t, uint64_t, ID, (uint32_t))
DEF_REDUCE(red_u64, uint64_t, uint64_t, ID, (uint64_t))

const reduce_fn REDUCERS[] = {red_i8,  red_u8,  red_i32, red_i64, red_f16, red_bf16,
                                     red_f32, red_f64, red_i16, red_u16, red_u32, red_u64};

void reduce1(const ccl_op *o, void *dst, const void *const *srcs, int n, uint64_t m)
{
    REDUCERS[o->dtype](&dst, 1, srcs, n, (size_t)m, o->redop, n);
}

int ccl_reduce_local(void *dst, const void *const *srcs, int nsrc, uint64_t n, int dtype, int redop, int divisor)
{
    if (dtype < 0 || dtype >= CCL_DTYPE_COUNT || redop < 0 || redop >= CCL_REDOP_COUNT || nsrc < 1 || divisor < 1)
        return CCL_E_INVALID;
    if (n)
        REDUCERS[dtype](&dst, 1, srcs, nsrc, (size_t)n, redop, divisor);
    return CCL_OK;
}
