/* The simulated chips' elementwise kernels over int32 and int64 (see kernels_elementwise.c). */
#define _GNU_SOURCE
/* the loops below are written to vectorize; -O2's cheap cost model leaves most of them scalar */
#pragma GCC optimize("O3")
#include "kernels_ew.h"

void simk_ew_int(ew_job *j)
{
    switch (j->dtype) {
    case K_I32: EW_INT(j, int32_t, uint32_t); break;
    case K_I64: EW_INT(j, int64_t, uint64_t); break;
    default: break;
    }
}
