/*
 * The tensor kernels of @name@ (anychip/plugin.h minor 1, "KERNELS"): plain loops over the
 * device memory, run by the stream's worker thread in order with the stream's copies and event
 * records. It uses @name@.c's streams, allocation table and errors (@name@.h).
 *
 * One loop serves every dtype: each element is loaded into a `value` (an int64 for bool and the
 * integer dtypes, a double for the float ones), computed on, and stored converted to the output
 * dtype. So integers compute in 64 bits and wrap when they are stored, and float16, bfloat16 and
 * float32 compute in double and round to nearest even once stored: for + - * / and sqrt that is
 * the correctly rounded result (double carries more than twice their precision).
 *
 * DRIVER: replace each entry (k_binary, k_unary, k_reduce, k_gemm, k_fill) with a launch of your
 * chip's kernel on the stream, and narrow the masks in KERNELS to the dtypes your kernels take;
 * an entry set to NULL, or a dtype whose bit is clear, runs on the host through anychip instead.
 * `anychip plugin check` compares every entry and dtype the masks claim with NumPy.
 */
#include "@name@.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NDTYPES (ANYCHIP_BOOL + 1)
#define MAX_DIMS ANYCHIP_KERNEL_MAX_DIMS
#define BIT(t) (1u << (t))
#define FLOATS (BIT(ANYCHIP_FLOAT16) | BIT(ANYCHIP_BFLOAT16) | BIT(ANYCHIP_FLOAT32) | BIT(ANYCHIP_FLOAT64))
#define ALL_DTYPES (BIT(NDTYPES) - 1)

const int64_t ITEM[NDTYPES] = {1, 1, 4, 8, 2, 2, 4, 8, 1};          /* bytes, in anychip_dtype order */
static const char *const DTYPE_NAME[NDTYPES] = {"int8", "uint8", "int32", "int64", "float16", "bfloat16",
                                                "float32", "float64", "bool"};

static int is_float(anychip_dtype t) { return t >= ANYCHIP_FLOAT16 && t <= ANYCHIP_FLOAT64; }

/* ---- float16 and bfloat16 <-> float, rounding to nearest even ------------------------------ */
static float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return bits_float(sign | 0x7f800000 | m << 13);           /* inf, NaN */
    if (e) return bits_float(sign | (e + 112) << 23 | m << 13);              /* normal */
    return bits_float(sign | float_bits((float)m * 0x1p-24f));               /* subnormal, zero */
}

static uint16_t float_to_f16(float f) {
    uint32_t x = float_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (uint16_t)(sign | 0x7e00 | (ax >> 13 & 0x3ff));      /* NaN */
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00);       /* inf, or rounds past 65504 */
    if (ax < 0x38800000)       /* a half subnormal: adding 0.5 rounds to a multiple of 2^-24 */
        return (uint16_t)(sign | (float_bits(bits_float(ax) + 0.5f) - 0x3f000000));
    return (uint16_t)(sign | (ax + 0xfff + (ax >> 13 & 1) - (112u << 23)) >> 13);
}

static float bfloat_to_float(uint16_t b) { return bits_float((uint32_t)b << 16); }

static uint16_t float_to_bfloat(float f) {
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(x >> 16 | 0x40);            /* NaN */
    return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);
}

/* d as a float "rounded to odd" (an inexact result gets an odd last bit): rounding that to
 * float16 or bfloat16 rounds d only once, as a direct conversion would */
static float float_odd(double d) {
    float f = (float)d;
    uint32_t u = float_bits(f);
    if ((double)f != d && !(u & 1) && !isnan(d) && !isinf(f)) u += fabs((double)f) < fabs(d) ? 1 : (uint32_t)-1;
    return bits_float(u);
}

/* ---- one element ------------------------------------------------------------------------- */
typedef struct {
    int is_float;               /* which of the two holds the value */
    int64_t i;
    double f;
} value;

static value int_value(int64_t i) { return (value){0, i, 0}; }
static value float_value(double f) { return (value){1, 0, f}; }
static double as_double(value v) { return v.is_float ? v.f : (double)v.i; }

static value load(const char *p, anychip_dtype t) {
    int8_t i8; uint8_t u8; int32_t i32; int64_t i64; uint16_t h; float f; double d;
    switch (t) {
    case ANYCHIP_INT8: memcpy(&i8, p, 1); return int_value(i8);
    case ANYCHIP_UINT8: memcpy(&u8, p, 1); return int_value(u8);
    case ANYCHIP_BOOL: memcpy(&u8, p, 1); return int_value(u8 != 0);
    case ANYCHIP_INT32: memcpy(&i32, p, 4); return int_value(i32);
    case ANYCHIP_INT64: memcpy(&i64, p, 8); return int_value(i64);
    case ANYCHIP_FLOAT16: memcpy(&h, p, 2); return float_value(f16_to_float(h));
    case ANYCHIP_BFLOAT16: memcpy(&h, p, 2); return float_value(bfloat_to_float(h));
    case ANYCHIP_FLOAT32: memcpy(&f, p, 4); return float_value(f);
    default: memcpy(&d, p, 8); return float_value(d);
    }
}

/* `v` converted to `t` as a C cast would (floats to integers truncate; nonzero to bool is 1) */
static void store(char *p, anychip_dtype t, value v) {
    if (is_float(t)) {
        double d = as_double(v);
        float f = v.is_float ? (float)v.f : (float)v.i;     /* rounded once from either class */
        uint16_t h;
        switch (t) {
        case ANYCHIP_FLOAT16: h = float_to_f16(float_odd(d)); memcpy(p, &h, 2); break;
        case ANYCHIP_BFLOAT16: h = float_to_bfloat(float_odd(d)); memcpy(p, &h, 2); break;
        case ANYCHIP_FLOAT32: memcpy(p, &f, 4); break;
        default: memcpy(p, &d, 8); break;
        }
        return;
    }
    int64_t i = !v.is_float ? v.i : t == ANYCHIP_BOOL ? v.f != 0 : (int64_t)v.f;
    int8_t i8 = (int8_t)i;
    uint8_t u8 = t == ANYCHIP_BOOL ? i != 0 : (uint8_t)i;
    int32_t i32 = (int32_t)i;
    switch (t) {
    case ANYCHIP_INT8: memcpy(p, &i8, 1); break;
    case ANYCHIP_UINT8: case ANYCHIP_BOOL: memcpy(p, &u8, 1); break;
    case ANYCHIP_INT32: memcpy(p, &i32, 4); break;
    default: memcpy(p, &i, 8); break;
    }
}

/* ---- the operations ---------------------------------------------------------------------- */
#define NAN_FIRST(x, y, better) (isnan(x) ? (x) : isnan(y) ? (y) : (x) better (y) ? (x) : (y))

static value binary_op(anychip_binary_op op, value a, value b) {
    if (a.is_float) {
        double x = a.f, y = b.f;
        switch (op) {
        case ANYCHIP_OP_ADD: return float_value(x + y);
        case ANYCHIP_OP_SUB: return float_value(x - y);
        case ANYCHIP_OP_MUL: return float_value(x * y);
        case ANYCHIP_OP_DIV: return float_value(x / y);
        case ANYCHIP_OP_EQ: return int_value(x == y);
        case ANYCHIP_OP_NE: return int_value(x != y);
        case ANYCHIP_OP_LT: return int_value(x < y);
        case ANYCHIP_OP_LE: return int_value(x <= y);
        case ANYCHIP_OP_GT: return int_value(x > y);
        case ANYCHIP_OP_GE: return int_value(x >= y);
        case ANYCHIP_OP_MAX: return float_value(NAN_FIRST(x, y, >));
        default: return float_value(NAN_FIRST(x, y, <));
        }
    }
    uint64_t x = (uint64_t)a.i, y = (uint64_t)b.i;        /* unsigned: wrapping is defined */
    switch (op) {
    case ANYCHIP_OP_ADD: return int_value((int64_t)(x + y));
    case ANYCHIP_OP_SUB: return int_value((int64_t)(x - y));
    case ANYCHIP_OP_MUL: return int_value((int64_t)(x * y));
    case ANYCHIP_OP_EQ: return int_value(a.i == b.i);
    case ANYCHIP_OP_NE: return int_value(a.i != b.i);
    case ANYCHIP_OP_LT: return int_value(a.i < b.i);
    case ANYCHIP_OP_LE: return int_value(a.i <= b.i);
    case ANYCHIP_OP_GT: return int_value(a.i > b.i);
    case ANYCHIP_OP_GE: return int_value(a.i >= b.i);
    case ANYCHIP_OP_MAX: return a.i > b.i ? a : b;
    default: return a.i < b.i ? a : b;                    /* MIN (DIV takes floats only) */
    }
}

static value unary_op(anychip_unary_op op, value x) {
    if (x.is_float) {
        switch (op) {
        case ANYCHIP_OP_RELU: return float_value(isnan(x.f) || x.f > 0 ? x.f : 0.0);
        case ANYCHIP_OP_EXP: return float_value(exp(x.f));
        case ANYCHIP_OP_LOG: return float_value(log(x.f));
        case ANYCHIP_OP_NEG: return float_value(-x.f);
        case ANYCHIP_OP_SQRT: return float_value(sqrt(x.f));
        default: return x;                                /* COPY: store() converts */
        }
    }
    switch (op) {
    case ANYCHIP_OP_RELU: return int_value(x.i > 0 ? x.i : 0);
    case ANYCHIP_OP_NEG: return int_value((int64_t)(0 - (uint64_t)x.i));
    default: return x;                       /* COPY (EXP, LOG and SQRT take floats only) */
    }
}

@{collectives
/* out[i] = in[0][i] op in[1][i] op ... op in[n - 1][i] for i < count, in that order, computed as the
 * kernels compute (average: the sum divided by n): collectives.c's stand-in library reduces float16,
 * bfloat16 and averages so */
void reduce_elements(char *out, char *const *in, int n, size_t count, anychip_dtype t, anychip_binary_op op,
                     int average) {
    size_t item = (size_t)ITEM[t];
    for (size_t i = 0; i < count; i++) {
        value acc = load(in[0] + i * item, t);
        for (int r = 1; r < n; r++) acc = binary_op(op, acc, load(in[r] + i * item, t));
        if (average) acc = acc.is_float ? float_value(acc.f / n) : int_value(acc.i / n);
        store(out + i * item, t, acc);
    }
}

@}
/* ---- a call, copied when it is enqueued and run by the stream's worker ------------------- */
typedef enum { K_BINARY, K_UNARY, K_REDUCE, K_GEMM, K_FILL } kernel_kind;

struct kernel_call {
    kernel_kind kind;
    int op, ndim;
    anychip_dtype dtype, in_dtype;              /* the output's dtype, the inputs' */
    /* binary / unary: the shape and the inputs' strides; reduce: shape = {outer, n, inner};
     * gemm: shape = {m, k, n}, a_strides and b_strides their two strides each */
    int64_t shape[MAX_DIMS], a_strides[MAX_DIMS], b_strides[MAX_DIMS];
    char *out;
    const char *a, *b;
    value fill;
};

/* float32 and float64 ops take loops with direct loads, which the compiler vectorizes, one per
 * row of the last dimension (any strides, broadcasts included); the result is the general loop's:
 * + - * / in the operands' own type round exactly as in double then rounded once, and the unary
 * ops compute in double and round once, as store() does. */
#define ROW_BINARY(T)                                                                            \
    do {                                                                                         \
        const T *x = (const T *)c->a + at_a, *y = (const T *)c->b + at_b;                        \
        T *o = (T *)c->out + e;                                                                  \
        switch (c->op) {                                                                         \
        case ANYCHIP_OP_ADD: for (int64_t j = 0; j < len; j++) o[j] = x[j * sa] + y[j * sb]; break; \
        case ANYCHIP_OP_SUB: for (int64_t j = 0; j < len; j++) o[j] = x[j * sa] - y[j * sb]; break; \
        case ANYCHIP_OP_MUL: for (int64_t j = 0; j < len; j++) o[j] = x[j * sa] * y[j * sb]; break; \
        default: for (int64_t j = 0; j < len; j++) o[j] = x[j * sa] / y[j * sb]; break;          \
        }                                                                                        \
    } while (0)

#define ROW_UNARY(T)                                                                             \
    do {                                                                                         \
        const T *x = (const T *)c->a + at_a;                                                     \
        T *o = (T *)c->out + e;                                                                  \
        switch (c->op) {                                                                         \
        case ANYCHIP_OP_RELU: for (int64_t j = 0; j < len; j++) o[j] = x[j * sa] > 0 || isnan(x[j * sa]) ? x[j * sa] : 0; break; \
        case ANYCHIP_OP_EXP: for (int64_t j = 0; j < len; j++) o[j] = (T)exp((double)x[j * sa]); break; \
        case ANYCHIP_OP_LOG: for (int64_t j = 0; j < len; j++) o[j] = (T)log((double)x[j * sa]); break; \
        case ANYCHIP_OP_NEG: for (int64_t j = 0; j < len; j++) o[j] = -x[j * sa]; break;         \
        case ANYCHIP_OP_SQRT: for (int64_t j = 0; j < len; j++) o[j] = (T)sqrt((double)x[j * sa]); break; \
        default: for (int64_t j = 0; j < len; j++) o[j] = x[j * sa]; break;                      \
        }                                                                                        \
    } while (0)

/* steps the index idx over the first `dims` dimensions of the call's shape, the last of them
 * fastest, and the operands' element offsets *at_a, *at_b along with it by their strides */
static void next_index(const struct kernel_call *c, int dims, int64_t *idx, int64_t *at_a, int64_t *at_b) {
    for (int d = dims - 1; d >= 0; d--) {
        *at_a += c->a_strides[d];
        *at_b += c->b_strides[d];
        if (++idx[d] < c->shape[d]) return;
        *at_a -= c->a_strides[d] * c->shape[d];
        *at_b -= c->b_strides[d] * c->shape[d];
        idx[d] = 0;
    }
}

/* the row loop: 1 when it computed the call (float32 / float64, the same dtype in and out, an
 * arithmetic binary op or any unary op), 0 for the general loop */
static int run_rows(const struct kernel_call *c, int64_t count) {
    anychip_dtype t = c->in_dtype;
    if ((t != ANYCHIP_FLOAT32 && t != ANYCHIP_FLOAT64) || c->dtype != t || c->ndim == 0) return 0;
    if (c->kind == K_BINARY && c->op > ANYCHIP_OP_DIV) return 0;
    int last = c->ndim - 1;
    int64_t len = c->shape[last], sa = c->a_strides[last], sb = c->b_strides[last];
    int64_t idx[MAX_DIMS] = {0}, at_a = 0, at_b = 0;
    for (int64_t e = 0; e < count; e += len) {
        if (c->kind == K_BINARY && t == ANYCHIP_FLOAT32) ROW_BINARY(float);
        else if (c->kind == K_BINARY) ROW_BINARY(double);
        else if (t == ANYCHIP_FLOAT32) ROW_UNARY(float);
        else ROW_UNARY(double);
        next_index(c, last, idx, &at_a, &at_b);         /* the next row */
    }
    return 1;
}

static void run_elementwise(struct kernel_call *c) {
    int64_t count = 1, idx[MAX_DIMS] = {0}, at_a = 0, at_b = 0;
    for (int d = 0; d < c->ndim; d++) count *= c->shape[d];
    if (run_rows(c, count)) return;
    int64_t out_item = ITEM[c->dtype], in_item = ITEM[c->in_dtype];
    for (int64_t e = 0; e < count; e++) {
        value x = load(c->a + at_a * in_item, c->in_dtype);
        value r = c->kind == K_UNARY ? unary_op(c->op, x) : binary_op(c->op, x, load(c->b + at_b * in_item, c->in_dtype));
        store(c->out + e * out_item, c->dtype, r);
        next_index(c, c->ndim, idx, &at_a, &at_b);
    }
}

/* element `at` (in elements) of a float operand, as a double */
static double float_at(const char *p, anychip_dtype t, int64_t at) {
    if (t == ANYCHIP_FLOAT32) return ((const float *)p)[at];
    if (t == ANYCHIP_FLOAT64) return ((const double *)p)[at];
    return load(p + at * ITEM[t], t).f;
}

/* sums and means of float32 / float64 walk x in order, a row of `inner` double sums at a time (the
 * general loop's result: each sum in double, r ascending, rounded once); 0 for the general loop */
static int run_reduce_rows(const struct kernel_call *c) {
    int64_t outer = c->shape[0], n = c->shape[1], inner = c->shape[2];
    anychip_dtype t = c->in_dtype;
    if (c->op == ANYCHIP_REDUCE_MAX || (t != ANYCHIP_FLOAT32 && t != ANYCHIP_FLOAT64) || c->dtype != t) return 0;
    double *acc = malloc((size_t)(inner ? inner : 1) * sizeof *acc);
    if (!acc) return 0;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) acc[i] = 0.0;
        for (int64_t r = 0; r < n; r++) {
            int64_t at = (o * n + r) * inner;
            if (t == ANYCHIP_FLOAT32) for (int64_t i = 0; i < inner; i++) acc[i] += ((const float *)c->a)[at + i];
            else for (int64_t i = 0; i < inner; i++) acc[i] += ((const double *)c->a)[at + i];
        }
        for (int64_t i = 0; i < inner; i++) {
            double v = c->op == ANYCHIP_REDUCE_MEAN ? acc[i] / (double)n : acc[i];     /* n = 0: NaN */
            store(c->out + (o * inner + i) * ITEM[t], t, float_value(v));
        }
    }
    free(acc);
    return 1;
}

static void run_reduce(struct kernel_call *c) {
    if (run_reduce_rows(c)) return;
    int64_t outer = c->shape[0], n = c->shape[1], inner = c->shape[2], item = ITEM[c->in_dtype];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const char *x = c->a + (o * n * inner + i) * item;     /* x[o, 0, i]; rows are inner apart */
            value acc = c->op == ANYCHIP_REDUCE_MAX ? load(x, c->in_dtype)
                        : is_float(c->in_dtype) ? float_value(0.0) : int_value(0);
            for (int64_t r = c->op == ANYCHIP_REDUCE_MAX ? 1 : 0; r < n; r++) {
                value v = load(x + r * inner * item, c->in_dtype);
                if (c->op == ANYCHIP_REDUCE_MAX)
                    acc = acc.is_float ? float_value(NAN_FIRST(acc.f, v.f, >)) : acc.i > v.i ? acc : v;
                else if (acc.is_float)
                    acc.f += v.f;                                /* in double, rounded once when stored */
                else
                    acc.i = (int64_t)((uint64_t)acc.i + (uint64_t)v.i);     /* in int64, wrapping */
            }
            if (c->op == ANYCHIP_REDUCE_MEAN) acc = float_value(as_double(acc) / (double)n);  /* n = 0: NaN */
            store(c->out + (o * inner + i) * ITEM[c->dtype], c->dtype, acc);
        }
}

/* ---- GEMM --------------------------------------------------------------------------------
 * out[i, j] = a[i, 0] * b[0, j] + a[i, 1] * b[1, j] + ... + a[i, k - 1] * b[k - 1, j], the terms
 * added in that order in the operands' precision: float for float32, float16 and bfloat16 (whose
 * products are exact in float), double for float64. Each product and each sum is rounded on its
 * own (no fused multiply-add), so the bits do not depend on the tile sizes or on the machine;
 * float16 and bfloat16 sums are then rounded to their dtype.
 *
 * a and b are first packed, whatever their strides (transposed operands too), into panels padded
 * with zeros to whole tiles: a in panels of GEMM_MR rows (a[i0 .. i0 + GEMM_MR - 1, kk] side by
 * side, kk ascending), b in panels of NR columns (b[kk, j0 .. j0 + NR - 1]). Then each tile of
 * GEMM_MR x NR sums stays in registers while it walks its two panels: the tile's loops have fixed
 * trip counts, so the compiler unrolls the rows and vectorizes along the columns (with AVX2, two
 * vectors a row: 12 sums, b's two and a's value fill 15 of the 16 registers). A chip's GEMM tiles
 * for its own units and memories instead; this is the host loop's way of doing it. */
#define GEMM_MR 6
#define GEMM_NR_FLOAT 16                /* 64 bytes of sums a row */
#define GEMM_NR_DOUBLE 8

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__GLIBC__)
/* also compiled for AVX2 (no FMA: the same roundings as the plain build), picked at load time
 * where the CPU has it (an ifunc: GCC with glibc) */
#define HOST_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HOST_CLONES
#endif

/* sums[r][j] = the sum over kk < k of pa[kk * GEMM_MR + r] * pb[kk * NR + j], kk ascending */
#define GEMM_TILE(T, NR)                                                                              \
    HOST_CLONES static void gemm_tile_##T(int64_t k, const T *restrict pa, const T *restrict pb,      \
                                          T sums[GEMM_MR][NR]) {                                      \
        T acc[GEMM_MR][NR] = {{0}};                                                                   \
        for (int64_t kk = 0; kk < k; kk++, pa += GEMM_MR, pb += NR) {                                 \
            _Pragma("GCC unroll 8")                                                                   \
            for (int r = 0; r < GEMM_MR; r++)                                                         \
                for (int j = 0; j < NR; j++) acc[r][j] += pa[r] * pb[j];                              \
        }                                                                                             \
        memcpy(sums, acc, sizeof acc);                                                                \
    }
GEMM_TILE(float, GEMM_NR_FLOAT)
GEMM_TILE(double, GEMM_NR_DOUBLE)

/* packs the operand p of dtype t into panels of w lanes: its element (o, kk), at p[o * so + kk * sk],
 * goes to panel o / w, row kk, lane o % w (a double when `wide`, else a float); dst was zeroed. A
 * panel's row is read from w places at once, each walking its lane of p along kk, so the reads are
 * in order both along p's rows and along its columns. */
static void gemm_pack(void *dst, int wide, const char *p, anychip_dtype t, int64_t outer, int64_t so, int64_t k,
                      int64_t sk, int64_t w) {
    float *f = dst;
    double *d = dst;
    for (int64_t o0 = 0; o0 < outer; o0 += w) {
        int64_t lanes = outer - o0 < w ? outer - o0 : w, to = o0 * k;      /* panel o0 / w starts there */
        for (int64_t kk = 0; kk < k; kk++, to += w)
            for (int64_t l = 0; l < lanes; l++) {
                int64_t from = (o0 + l) * so + kk * sk;
                if (t == ANYCHIP_FLOAT32) f[to + l] = ((const float *)p)[from];
                else if (wide) d[to + l] = ((const double *)p)[from];
                else f[to + l] = (float)float_at(p, t, from);
            }
    }
}

/* out element `at` = v, a finished sum (exact in float32 and float64; float16 and bfloat16 round) */
static void gemm_put(struct kernel_call *c, int64_t at, double v) {
    if (c->dtype == ANYCHIP_FLOAT32) ((float *)c->out)[at] = (float)v;
    else if (c->dtype == ANYCHIP_FLOAT64) ((double *)c->out)[at] = v;
    else store(c->out + at * ITEM[c->dtype], c->dtype, float_value(v));
}

static void run_gemm(struct kernel_call *c) {
    int64_t m = c->shape[0], k = c->shape[1], n = c->shape[2];
    int64_t as0 = c->a_strides[0], as1 = c->a_strides[1], bs0 = c->b_strides[0], bs1 = c->b_strides[1];
    int wide = c->dtype == ANYCHIP_FLOAT64;
    int64_t nr = wide ? GEMM_NR_DOUBLE : GEMM_NR_FLOAT, size = wide ? 8 : 4;
    int64_t a_rows = (m + GEMM_MR - 1) / GEMM_MR * GEMM_MR, b_cols = (n + nr - 1) / nr * nr;
    char *pa = calloc((size_t)((a_rows + b_cols) * k + 1), (size_t)size);
    if (!pa) {              /* no host memory for the panels: one sum at a time, the same terms in order */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double wide_sum = 0.0;
                float sum = 0.0f;
                for (int64_t kk = 0; kk < k; kk++) {
                    double x = float_at(c->a, c->dtype, i * as0 + kk * as1);
                    double y = float_at(c->b, c->dtype, kk * bs0 + j * bs1);
                    if (wide) wide_sum += x * y;
                    else sum += (float)x * (float)y;
                }
                gemm_put(c, i * n + j, wide ? wide_sum : sum);
            }
        return;
    }
    char *pb = pa + a_rows * k * size;
    gemm_pack(pa, wide, c->a, c->dtype, m, as0, k, as1, GEMM_MR);
    gemm_pack(pb, wide, c->b, c->dtype, n, bs1, k, bs0, nr);
    float sums[GEMM_MR][GEMM_NR_FLOAT];
    double wide_sums[GEMM_MR][GEMM_NR_DOUBLE];
    for (int64_t j0 = 0; j0 < n; j0 += nr)          /* one panel of b at a time, while a's panels pass */
        for (int64_t i0 = 0; i0 < m; i0 += GEMM_MR) {
            if (wide) gemm_tile_double(k, (const double *)pa + i0 * k, (const double *)pb + j0 * k, wide_sums);
            else gemm_tile_float(k, (const float *)pa + i0 * k, (const float *)pb + j0 * k, sums);
            for (int64_t r = 0; r < GEMM_MR && i0 + r < m; r++)
                for (int64_t j = 0; j < nr && j0 + j < n; j++)
                    gemm_put(c, (i0 + r) * n + j0 + j, wide ? wide_sums[r][j] : sums[r][j]);
        }
    free(pa);
}

static void run_fill(struct kernel_call *c) {
    char bytes[8];
    int64_t n = c->shape[0], item = ITEM[c->dtype];
    store(bytes, c->dtype, c->fill);
    for (int64_t i = 0; i < n; i++) memcpy(c->out + i * item, bytes, (size_t)item);
}

void run_kernel(struct kernel_call *c) {     /* on the stream's worker thread */
    switch (c->kind) {
    case K_BINARY: case K_UNARY: run_elementwise(c); break;
    case K_REDUCE: run_reduce(c); break;
    case K_GEMM: run_gemm(c); break;
    case K_FILL: run_fill(c); break;
    }
    free(c);
}

/* ---- the entries: check the call, copy it, enqueue it --------------------------------------- */
static anychip_status check_dtype(const char *what, anychip_dtype t, uint32_t mask, const char *mask_name) {
    if ((unsigned)t >= NDTYPES) return fail(S_INVALID, "%s: unknown dtype %d", what, (int)t);
    if (!(mask & BIT(t))) return fail(S_INVALID, "%s: %s is not in %s", what, DTYPE_NAME[t], mask_name);
    return S_OK;
}

/* [p + lo * item, p + (hi + 1) * item), what `shape` with `strides` covers, lies in one allocation */
static anychip_status check_operand(int d, const char *what, const void *p, int64_t item, int ndim,
                                    const int64_t *shape, const int64_t *strides) {
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) return S_OK;                       /* reads nothing */
        int64_t reach = (shape[i] - 1) * strides[i];
        if (reach < 0) lo += reach; else hi += reach;
    }
    if (!valid_range(get_device(d), (const char *)p + lo * item, (size_t)((hi - lo + 1) * item)))
        return fail(S_BAD_POINTER, "%s: elements [%lld, %lld] from %p are not memory of device %d", what,
                    (long long)lo, (long long)hi, p, d);
    return S_OK;
}

/* the element count of shape, or -1 when a dimension is negative or the count overflows */
static int64_t count_of(int ndim, const int64_t *shape) {
    int64_t count = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(count, shape[i], &count)) return -1;
    return count;
}

static anychip_status launch(int d, anychip_stream s, struct kernel_call call) {
    if (!s || s->device != d) return fail(S_INVALID, "kernel: not a stream of device %d", d);
    struct kernel_call *c = malloc(sizeof *c);
    if (!c) return fail(S_SYSTEM, "out of host memory for a kernel");
    *c = call;
    anychip_status rc = enqueue(s, (task){.kind = T_KERNEL, .kernel = c});
    if (rc) free(c);
    return rc;
}

static anychip_status elementwise(int d, anychip_stream s, struct kernel_call c, const int64_t *shape,
                                  const int64_t *a_strides, const int64_t *b_strides, const char *what) {
    DEVICE(dev, d);
    (void)dev;
    if (c.ndim < 0 || c.ndim > MAX_DIMS) return fail(S_INVALID, "%s: ndim %d (0 to %d)", what, c.ndim, MAX_DIMS);
    int64_t one = 1, count = count_of(c.ndim, shape);
    if (count < 0) return fail(S_INVALID, "%s: a negative or too large shape", what);
    if (count == 0) return S_OK;
    anychip_status rc = check_operand(d, what, c.out, ITEM[c.dtype], 1, &count, &one);
    if (!rc) rc = check_operand(d, what, c.a, ITEM[c.in_dtype], c.ndim, shape, a_strides);
    if (!rc && c.b) rc = check_operand(d, what, c.b, ITEM[c.in_dtype], c.ndim, shape, b_strides);
    if (rc) return rc;
    for (int i = 0; i < c.ndim; i++) {
        c.shape[i] = shape[i];
        c.a_strides[i] = a_strides[i];
        c.b_strides[i] = c.b ? b_strides[i] : 0;
    }
    return launch(d, s, c);
}

static anychip_status k_binary(int d, anychip_stream s, anychip_binary_op op, anychip_dtype t, int ndim,
                               const int64_t *shape, void *out, const void *a, const int64_t *as, const void *b,
                               const int64_t *bs) {
    anychip_status rc = check_dtype("binary", t, KERNELS.binary_dtypes, "binary_dtypes");
    if (rc) return rc;
    if ((unsigned)op > ANYCHIP_OP_MIN) return fail(S_INVALID, "binary: unknown op %d", (int)op);
    if (op == ANYCHIP_OP_DIV && !is_float(t)) return fail(S_INVALID, "binary: div takes float dtypes only");
    if (op <= ANYCHIP_OP_MUL && t == ANYCHIP_BOOL) return fail(S_INVALID, "binary: add, sub and mul take no bool");
    if (!out || !a || !b) return fail(S_INVALID, "binary: a NULL operand");
    int compare = op >= ANYCHIP_OP_EQ && op <= ANYCHIP_OP_GE;
    struct kernel_call c = {.kind = K_BINARY, .op = (int)op, .ndim = ndim, .dtype = compare ? ANYCHIP_BOOL : t,
                            .in_dtype = t, .out = out, .a = a, .b = b};
    return elementwise(d, s, c, shape, as, bs, "binary");
}

static anychip_status k_unary(int d, anychip_stream s, anychip_unary_op op, anychip_dtype out_t,
                              anychip_dtype in_t, int ndim, const int64_t *shape, void *out, const void *x,
                              const int64_t *xs) {
    anychip_status rc = check_dtype("unary", out_t, KERNELS.unary_dtypes, "unary_dtypes");
    if (!rc) rc = check_dtype("unary", in_t, KERNELS.unary_dtypes, "unary_dtypes");
    if (rc) return rc;
    if ((unsigned)op > ANYCHIP_OP_SQRT) return fail(S_INVALID, "unary: unknown op %d", (int)op);
    if (op != ANYCHIP_OP_COPY && out_t != in_t) return fail(S_INVALID, "unary: only copy converts dtypes");
    if ((op == ANYCHIP_OP_EXP || op == ANYCHIP_OP_LOG || op == ANYCHIP_OP_SQRT) && !is_float(in_t))
        return fail(S_INVALID, "unary: exp, log and sqrt take float dtypes only");
    if ((op == ANYCHIP_OP_RELU || op == ANYCHIP_OP_NEG) && in_t == ANYCHIP_BOOL)
        return fail(S_INVALID, "unary: relu and neg take no bool");
    if (!out || !x) return fail(S_INVALID, "unary: a NULL operand");
    struct kernel_call c = {.kind = K_UNARY, .op = (int)op, .ndim = ndim, .dtype = out_t, .in_dtype = in_t,
                            .out = out, .a = x};
    return elementwise(d, s, c, shape, xs, NULL, "unary");
}

static anychip_status k_reduce(int d, anychip_stream s, anychip_reduce_op op, anychip_dtype out_t,
                               anychip_dtype in_t, int64_t outer, int64_t n, int64_t inner, void *out,
                               const void *x) {
    DEVICE(dev, d);
    (void)dev;
    anychip_status rc = check_dtype("reduce", out_t, KERNELS.reduce_dtypes, "reduce_dtypes");
    if (!rc) rc = check_dtype("reduce", in_t, KERNELS.reduce_dtypes, "reduce_dtypes");
    if (rc) return rc;
    if ((unsigned)op > ANYCHIP_REDUCE_MAX) return fail(S_INVALID, "reduce: unknown op %d", (int)op);
    int64_t shape[3] = {outer, n, inner}, kept[2] = {outer, inner}, one = 1;
    int64_t count = count_of(3, shape), out_count = count_of(2, kept);
    if (count < 0) return fail(S_INVALID, "reduce: a negative or too large shape");
    if (op == ANYCHIP_REDUCE_MAX && n == 0 && out_count) return fail(S_INVALID, "reduce: max over no elements");
    if (!out || !x) return fail(S_INVALID, "reduce: a NULL operand");
    if (out_count == 0) return S_OK;
    rc = check_operand(d, "reduce", out, ITEM[out_t], 1, &out_count, &one);
    if (!rc) rc = check_operand(d, "reduce", x, ITEM[in_t], 1, &count, &one);
    if (rc) return rc;
    return launch(d, s, (struct kernel_call){.kind = K_REDUCE, .op = (int)op, .dtype = out_t, .in_dtype = in_t,
                                             .shape = {outer, n, inner}, .out = out, .a = x});
}

static anychip_status k_gemm(int d, anychip_stream s, anychip_dtype t, int64_t m, int64_t k, int64_t n,
                             void *out, const void *a, int64_t as0, int64_t as1, const void *b, int64_t bs0,
                             int64_t bs1) {
    DEVICE(dev, d);
    (void)dev;
    anychip_status rc = check_dtype("gemm", t, KERNELS.gemm_dtypes, "gemm_dtypes");
    if (rc) return rc;
    if (!is_float(t)) return fail(S_INVALID, "gemm: float dtypes only");
    int64_t mn[2] = {m, n}, a_shape[2] = {m, k}, b_shape[2] = {k, n}, as[2] = {as0, as1}, bs[2] = {bs0, bs1}, one = 1;
    int64_t out_count = count_of(2, mn);
    if (out_count < 0 || count_of(2, a_shape) < 0 || count_of(2, b_shape) < 0)
        return fail(S_INVALID, "gemm: a negative or too large size");
    if (!out || !a || !b) return fail(S_INVALID, "gemm: a NULL operand");
    if (out_count == 0) return S_OK;
    rc = check_operand(d, "gemm", out, ITEM[t], 1, &out_count, &one);
    if (!rc) rc = check_operand(d, "gemm", a, ITEM[t], 2, a_shape, as);
    if (!rc) rc = check_operand(d, "gemm", b, ITEM[t], 2, b_shape, bs);
    if (rc) return rc;
    return launch(d, s, (struct kernel_call){.kind = K_GEMM, .dtype = t, .in_dtype = t, .shape = {m, k, n},
                                             .a_strides = {as0, as1}, .b_strides = {bs0, bs1}, .out = out,
                                             .a = a, .b = b});
}

static anychip_status k_fill(int d, anychip_stream s, anychip_dtype t, int64_t n, void *out, double fvalue,
                             int64_t ivalue, int from_float) {
    DEVICE(dev, d);
    (void)dev;
    anychip_status rc = check_dtype("fill", t, KERNELS.fill_dtypes, "fill_dtypes");
    if (rc) return rc;
    if (n < 0 || !out) return fail(S_INVALID, "fill: n %lld or a NULL output", (long long)n);
    if (n == 0) return S_OK;
    int64_t one = 1;
    if ((rc = check_operand(d, "fill", out, ITEM[t], 1, &n, &one))) return rc;
    value v = from_float || is_float(t) ? float_value(fvalue) : int_value(ivalue);
    return launch(d, s, (struct kernel_call){.kind = K_FILL, .dtype = t, .shape = {n}, .out = out, .fill = v});
}

/* what each entry takes: bit (1 << anychip_dtype) per dtype (plugin.h says which ops take which) */
const anychip_kernels KERNELS = {
    .version = ANYCHIP_KERNELS_VERSION,
    .binary_dtypes = ALL_DTYPES,
    .unary_dtypes = ALL_DTYPES,
    .reduce_dtypes = ALL_DTYPES,
    .gemm_dtypes = FLOATS,
    .fill_dtypes = ALL_DTYPES,
    .binary = k_binary,
    .unary = k_unary,
    .reduce = k_reduce,
    .gemm = k_gemm,
    .fill = k_fill,
};
