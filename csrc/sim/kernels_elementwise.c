/*
 * The simulated chips' elementwise kernels (strided, broadcasting; see kernels.c for the
 * entry points and the exactness rules): the dispatch over dtypes, float32 and float64 (the
 * contiguous float32 fast path cloned per x86-64 level). Integers are in kernels_ew_int8.c
 * and kernels_ew_int.c, float16 and bfloat16 in kernels_ew_half.c.
 */
#define _GNU_SOURCE
/* the loops below are written to vectorize; -O2's cheap cost model leaves most of them scalar */
#pragma GCC optimize("O3")
#include "kernels_ew.h"

#include <stdlib.h>

/* float32, both inputs contiguous: one flat loop per op */
#define EW_F32_FLAT(OT, EXPR)                                                                \
    do {                                                                                     \
        OT *o_ = (OT *)out;                                                                  \
        for (int64_t i = 0; i < n; i++) {                                                    \
            float x = a[i], y = b[i];                                                        \
            o_[i] = (OT)(EXPR);                                                              \
        }                                                                                    \
    } while (0)

K_CLONES static void ew_f32_flat(int op, const float *a, const float *b, void *out, int64_t n)
{
    switch (op) {
    case E_ADD: EW_F32_FLAT(float, x + y); break;
    case E_SUB: EW_F32_FLAT(float, x - y); break;
    case E_MUL: EW_F32_FLAT(float, x * y); break;
    case E_DIV: EW_F32_FLAT(float, x / y); break;
    case E_MAX: EW_F32_FLAT(float, FMAXNAN(x, y)); break;
    case E_MIN: EW_F32_FLAT(float, FMINNAN(x, y)); break;
    case E_EQ: EW_F32_FLAT(uint8_t, TO_BOOL(x == y)); break;
    case E_NE: EW_F32_FLAT(uint8_t, TO_BOOL(x != y)); break;
    case E_LT: EW_F32_FLAT(uint8_t, TO_BOOL(x < y)); break;
    case E_LE: EW_F32_FLAT(uint8_t, TO_BOOL(x <= y)); break;
    case E_GT: EW_F32_FLAT(uint8_t, TO_BOOL(x > y)); break;
    case E_GE: EW_F32_FLAT(uint8_t, TO_BOOL(x >= y)); break;
    default: break;
    }
}

void simk_run_elementwise(void *arg)
{
    ew_job *j = arg;
    if (j->dtype == K_F32 && c_contiguous(j->ndim, j->shape, j->as) && c_contiguous(j->ndim, j->shape, j->bs)) {
        ew_f32_flat(j->op, (const float *)j->a, (const float *)j->b, j->out, numel(j->ndim, j->shape));
        free(j);
        return;
    }
    switch (j->dtype) {
    case K_BOOL: case K_I8: case K_U8: simk_ew_int8(j); break;
    case K_I32: case K_I64: simk_ew_int(j); break;
    case K_F16: case K_BF16: simk_ew_half(j); break;
    case K_F32: EW_FLOAT(j, float, ID, ID); break;
    case K_F64: EW_DOUBLE(j); break;
    default: break;
    }
    free(j);
}
