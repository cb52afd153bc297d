/* The simulated chips' elementwise kernels over float16 and bfloat16, computed in float and
 * rounded to nearest even (see kernels_elementwise.c). */
#define _GNU_SOURCE
/* the loops below are written to vectorize; -O2's cheap cost model leaves most of them scalar */
#pragma GCC optimize("O3")
#include "kernels_ew.h"
#include "common/half.h"

void simk_ew_half(ew_job *j)
{
    switch (j->dtype) {
    case K_F16: EW_FLOAT(j, uint16_t, half_to_float, float_to_half); break;
    case K_BF16: EW_FLOAT(j, uint16_t, bf16_to_float, float_to_bf16); break;
    default: break;
    }
}
