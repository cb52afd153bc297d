/*
 * The elementwise loops (one per op and dtype) that the kernels_ew*.c files instantiate,
 * each file a few dtypes, so that the kernels compile in parallel.
 */
#ifndef ANYCHIP_SIM_KERNELS_EW_H
#define ANYCHIP_SIM_KERNELS_EW_H

#include "kernels.h"

/* one loop per (op, type); EXPR reads x and y of compute type C and gives the output */
#define EW_LOOP(J, T, C, OT, LD, ST, EXPR)                                                   \
    do {                                                                                     \
        const T *pa = (const T *)(J)->a, *pb = (const T *)(J)->b;                            \
        OT *po = (OT *)(J)->out;                                                             \
        ND_BEGIN(J)                                                                          \
        const T *ra = pa + aoff_, *rb = pb + boff_;                                          \
        OT *ro = po + obase_;                                                                \
        if (sa_ == 1 && sb_ == 1) {                                                          \
            for (int64_t i = 0; i < inner_; i++) {                                           \
                C x = LD(ra[i]), y = LD(rb[i]);                                              \
                ro[i] = ST(EXPR);                                                            \
            }                                                                                \
        } else if (sa_ == 1 && sb_ == 0) {                                                   \
            C y = LD(rb[0]);                                                                 \
            for (int64_t i = 0; i < inner_; i++) {                                           \
                C x = LD(ra[i]);                                                             \
                ro[i] = ST(EXPR);                                                            \
            }                                                                                \
        } else {                                                                             \
            for (int64_t i = 0; i < inner_; i++) {                                           \
                C x = LD(ra[i * sa_]), y = LD(rb[i * sb_]);                                  \
                ro[i] = ST(EXPR);                                                            \
            }                                                                                \
        }                                                                                    \
        ND_END(J)                                                                            \
    } while (0)

#define EW_COMPARE(J, T, C, LD)                                                              \
    switch ((J)->op) {                                                                       \
    case E_EQ: EW_LOOP(J, T, C, uint8_t, LD, TO_BOOL, x == y); break;                        \
    case E_NE: EW_LOOP(J, T, C, uint8_t, LD, TO_BOOL, x != y); break;                        \
    case E_LT: EW_LOOP(J, T, C, uint8_t, LD, TO_BOOL, x < y); break;                         \
    case E_LE: EW_LOOP(J, T, C, uint8_t, LD, TO_BOOL, x <= y); break;                        \
    case E_GT: EW_LOOP(J, T, C, uint8_t, LD, TO_BOOL, x > y); break;                         \
    case E_GE: EW_LOOP(J, T, C, uint8_t, LD, TO_BOOL, x >= y); break;                        \
    default: break;                                                                          \
    }

#define EW_FLOAT(J, T, LD, ST)                                                               \
    switch ((J)->op) {                                                                       \
    case E_ADD: EW_LOOP(J, T, float, T, LD, ST, x + y); break;                               \
    case E_SUB: EW_LOOP(J, T, float, T, LD, ST, x - y); break;                               \
    case E_MUL: EW_LOOP(J, T, float, T, LD, ST, x * y); break;                               \
    case E_DIV: EW_LOOP(J, T, float, T, LD, ST, x / y); break;                               \
    case E_MAX: EW_LOOP(J, T, float, T, LD, ST, FMAXNAN(x, y)); break;                       \
    case E_MIN: EW_LOOP(J, T, float, T, LD, ST, FMINNAN(x, y)); break;                       \
    default: EW_COMPARE(J, T, float, LD);                                                    \
    }

#define EW_DOUBLE(J)                                                                         \
    switch ((J)->op) {                                                                       \
    case E_ADD: EW_LOOP(J, double, double, double, ID, ID, x + y); break;                    \
    case E_SUB: EW_LOOP(J, double, double, double, ID, ID, x - y); break;                    \
    case E_MUL: EW_LOOP(J, double, double, double, ID, ID, x * y); break;                    \
    case E_DIV: EW_LOOP(J, double, double, double, ID, ID, x / y); break;                    \
    case E_MAX: EW_LOOP(J, double, double, double, ID, ID, FMAXNAN(x, y)); break;            \
    case E_MIN: EW_LOOP(J, double, double, double, ID, ID, FMINNAN(x, y)); break;            \
    default: EW_COMPARE(J, double, double, ID);                                              \
    }

/* integers: wrap through the unsigned type U of the same width */
#define EW_INT(J, T, U)                                                                      \
    switch ((J)->op) {                                                                       \
    case E_ADD: EW_LOOP(J, T, T, T, ID, ID, (T)((U)x + (U)y)); break;                        \
    case E_SUB: EW_LOOP(J, T, T, T, ID, ID, (T)((U)x - (U)y)); break;                        \
    case E_MUL: EW_LOOP(J, T, T, T, ID, ID, (T)((U)x * (U)y)); break;                        \
    case E_MAX: EW_LOOP(J, T, T, T, ID, ID, x > y ? x : y); break;                           \
    case E_MIN: EW_LOOP(J, T, T, T, ID, ID, x < y ? x : y); break;                           \
    default: EW_COMPARE(J, T, T, ID);                                                        \
    }

/* one dtype group each, dispatched by simk_run_elementwise */
void simk_ew_int8(ew_job *j);
void simk_ew_int(ew_job *j);
void simk_ew_half(ew_job *j);

#endif
