/* The simulated chips' elementwise kernels over bool, int8 and uint8 (see kernels_elementwise.c). */
#define _GNU_SOURCE
/* the loops below are written to vectorize; -O2's cheap cost model leaves most of them scalar */
#pragma GCC optimize("O3")
#include "kernels_ew.h"

void simk_ew_int8(ew_job *j)
{
    switch (j->dtype) {
    case K_BOOL: EW_INT(j, uint8_t, uint8_t); break;
    case K_I8: EW_INT(j, int8_t, uint8_t); break;
    case K_U8: EW_INT(j, uint8_t, uint8_t); break;
    default: break;
    }
}
