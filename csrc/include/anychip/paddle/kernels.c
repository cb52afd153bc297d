/*
 * The bridge's phi kernels: the ops a training step spends its time in, registered for the
 * bridge's device type through Paddle's kernel C API (phi_capi.h) and built from the five
 * primitives of the target plugin's kernel table (anychip/plugin.h minor 1, `kernels`:
 * strided binary ops with broadcasting, unary ops and casts, [outer, n, inner] reductions,
 * strided GEMM, fill), enqueued on the stream Paddle gives the op, over device memory: no
 * copy to the host. Included at the end of bridge.c (ANYCHIP_PADDLE_KERNELS), whose plugin
 * table (P), streams (stream_rec) and fence flags the kernels use; a kernel that cannot run
 * raises a C++ exception (kernels_throw.cc, linked beside), so this is compiled to unwind
 * (-fexceptions).
 *
 * A kernel is registered for a dtype only when every primitive it uses takes that dtype (the
 * table's masks) and the table's version is one this file knows; the other ops and dtypes
 * take Paddle's CPU fallback. A plugin without the table gets no kernels.
 *
 * Each kernel has two entries, as Paddle calls both: fn(PD_KernelContext *), used by
 * Paddle's executors, and the "variadic" one, which eager Paddle calls with the C++
 * kernel's own arguments (const phi::DeviceContext &, const phi::DenseTensor &, attributes
 * by value, DenseTensor * outputs): references and pointers arrive as the C API's handles,
 * a DataType attribute as a phi::DataType value.
 *
 * Composite ops (softmax, the gradients) are sequences of those primitives on the one stream,
 * with temporaries from Paddle's allocator for the device (freed when the op returns: the
 * next user of that memory, on this stream or another, is ordered after this op's work by the
 * bridge's stream order, enqueue_on). The formulas are Paddle's CPU kernels', in the same order, so results agree
 * with Paddle-CPU to the rounding of each step.
 *
 * ANYCHIP_PADDLE_BEFORE_GEMM, when defined, names a function (void) called before the first
 * GEMM of a matmul (the simulated chips hand their GEMM NumPy's BLAS there).
 */
#include <math.h>

#include "anychip/paddle/phi_capi.h"

static anychip_phi_api PD;

#define MAXD ANYCHIP_KERNEL_MAX_DIMS

/* the plugin's kernel table, once register_kernels (or the table query) accepted it */
static const anychip_kernels *K;

/* an entry's mask, 0 for an entry left NULL */
#define MASK(entry) (K->entry ? K->entry##_dtypes : 0u)

/* raise a C++ exception with the message (kernels_throw.cc): Paddle reports it as the op's error */
void anychip_paddle_raise(const char *msg) __attribute__((noreturn));

static void fail(const char *op, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(const char *op, const char *fmt, ...)
{
    char msg[768], line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "%s kernel of %s: %s", op, g_type, msg);
    anychip_paddle_raise(line);
}

static const char *const DTYPE_NAMES[] = {"int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
                                          "float64", "bool"};
static const int ITEMSZ[] = {1, 1, 4, 8, 2, 2, 4, 8, 1};      /* by anychip_dtype */

static int64_t numel(int nd, const int64_t *dim)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= dim[d];
    return n;
}

/* ---- tensors -------------------------------------------------------------------------------- */

typedef struct {
    void *p;
    int nd, dt;                           /* dt: its anychip_dtype */
    C_DataType cdt;
    int64_t dim[MAXD], n;
} tview;

static int to_dtype(C_DataType t)
{
    switch (t) {
    case BOOL: return ANYCHIP_BOOL;
    case INT8: return ANYCHIP_INT8;
    case UINT8: return ANYCHIP_UINT8;
    case INT32: return ANYCHIP_INT32;
    case INT64: return ANYCHIP_INT64;
    case FLOAT16: return ANYCHIP_FLOAT16;
    case BFLOAT16: return ANYCHIP_BFLOAT16;
    case FLOAT32: return ANYCHIP_FLOAT32;
    case FLOAT64: return ANYCHIP_FLOAT64;
    default: return -1;
    }
}

static C_DataType from_phi(int t)
{
    static const C_DataType MAP[] = {
        [PHI_UNDEFINED] = UNDEFINED, [PHI_BOOL] = BOOL,       [PHI_UINT8] = UINT8,     [PHI_INT8] = INT8,
        [PHI_UINT16] = UINT16,       [PHI_INT16] = INT16,     [PHI_UINT32] = UINT32,   [PHI_INT32] = INT32,
        [PHI_UINT64] = UINT64,       [PHI_INT64] = INT64,     [PHI_FLOAT32] = FLOAT32, [PHI_FLOAT64] = FLOAT64,
        [PHI_COMPLEX64] = COMPLEX64, [PHI_COMPLEX128] = COMPLEX128, [PHI_PSTRING] = UNDEFINED,
        [PHI_FLOAT16] = FLOAT16,     [PHI_BFLOAT16] = BFLOAT16,
    };
    return t >= 0 && (size_t)t < sizeof MAP / sizeof *MAP ? MAP[t] : UNDEFINED;
}

/* dims and dtype of a tensor (its data pointer when it has memory) */
static void shape_of(const char *op, const PD_Tensor *t, tview *v)
{
    C_Status st = C_SUCCESS;
    int64_t nd = PD.PD_TensorGetNumDims(t, &st);
    if (st != C_SUCCESS || nd < 0 || nd > MAXD)
        fail(op, "a tensor of %lld dimensions (the device's kernels take up to %d)", (long long)nd, MAXD);
    v->nd = (int)nd;
    v->n = 1;
    for (int d = 0; d < v->nd; d++) {
        v->dim[d] = PD.PD_TensorGetDim(t, (size_t)d, &st);
        v->n *= v->dim[d];
    }
    v->cdt = PD.PD_TensorGetPDDataType(t, &st);
    v->dt = to_dtype(v->cdt);
    if (v->dt < 0)
        fail(op, "data type %d is not one of the device's (bool, int8, uint8, int32, int64, float16, bfloat16, "
             "float32, float64)", (int)v->cdt);
    v->p = NULL;
}

/* an input: contiguous (Paddle hands non-stride kernels contiguous tensors) */
static void input(const char *op, const PD_Tensor *t, tview *v)
{
    shape_of(op, t, v);
    C_Status st = C_SUCCESS;
    int64_t ns = PD.PD_TensorGetNumStrides(t, &st);
    int64_t want = 1;
    for (int d = v->nd - 1; d >= 0 && ns == v->nd; d--) {
        if (v->dim[d] != 1 && PD.PD_TensorGetStride(t, (size_t)d, &st) != want)
            fail(op, "an input is not contiguous (dimension %d)", d);
        want *= v->dim[d];
    }
    v->p = v->n ? PD.PD_TensorGetDataPointer(t, &st) : NULL;
}

/* an output, allocated with the dims InferMeta gave it, of dtype cdt */
static void output(const char *op, const PD_DeviceContext *ctx, PD_Tensor *t, C_DataType cdt, tview *v)
{
    shape_of(op, t, v);
    C_Status st = C_SUCCESS;
    v->cdt = cdt;
    v->dt = to_dtype(cdt);
    v->p = PD.PD_DeviceContextAllocateTensor(ctx, t, 0, cdt, &st);
    if (st != C_SUCCESS || (!v->p && v->n))
        fail(op, "allocating the output (%lld elements) failed", (long long)v->n);
}

/* temporaries of one op, freed when it returns */
typedef struct {
    const PD_DeviceContext *ctx;
    const char *op;
    PD_Tensor *t[24];
    int n;
} temps;

static void *temp(temps *T, int nd, const int64_t *dim, C_DataType cdt)
{
    if (T->n == (int)(sizeof T->t / sizeof *T->t))
        fail(T->op, "more than %d temporaries", (int)(sizeof T->t / sizeof *T->t));
    int64_t n = 1, one = 1;
    for (int d = 0; d < nd; d++)
        n *= dim[d];
    PD_Tensor *t = PD.PD_NewTensor();
    C_Status st = C_SUCCESS;
    PD.PD_TensorSetDims(t, nd ? nd : 1, nd ? dim : &one, &st);
    void *p = PD.PD_DeviceContextAllocateTensor(T->ctx, t, (size_t)(n ? n : 1) * (size_t)ITEMSZ[to_dtype(cdt)], cdt,
                                                &st);
    if (st != C_SUCCESS || !p) {
        PD.PD_DeleteTensor(t);
        fail(T->op, "allocating a temporary of %lld elements failed", (long long)n);
    }
    T->t[T->n++] = t;
    return p;
}

static void temps_free(temps *T)
{
    for (int i = 0; i < T->n; i++)
        PD.PD_DeleteTensor(T->t[i]);
    T->n = 0;
}

static void count_call(const char *op);

static anychip_stream stream_of(const char *op, const PD_DeviceContext *ctx)
{
    count_call(op);
    C_Status st = C_SUCCESS;
    C_Stream s = PD.PD_DeviceContextGetStream(ctx, &st);
    if (st != C_SUCCESS || !s)
        fail(op, "the device context has no stream");
    if (enqueue_on(t_device, REC(s)) != C_SUCCESS)      /* the copy fence sees the kernel; the stream order */
        fail(op, "ordering its stream after the device's other streams failed");
    return REC(s)->s;
}

/* a primitive's failure: the plugin's status, its text and the detail of this thread's last failure */
static void kcheck(const char *op, const char *prim, anychip_status rc)
{
    if (rc == 0)
        return;
    const char *text = P.get_error_string ? P.get_error_string(rc) : NULL;
    const char *detail = P.get_last_error ? P.get_last_error() : NULL;
    fail(op, "the plugin's %s kernel failed: status %d%s%s%s%s%s", prim, (int)rc, text ? " (" : "", text ? text : "",
         text ? ")" : "", detail && detail[0] ? ": " : "", detail && detail[0] ? detail : "");
}

/* the registration checked each kernel's dtypes against the masks; what an attribute picks
 * at run time (cast's and sum's output dtype) is checked here */
static void takes(const char *op, const char *prim, uint32_t mask, int dt)
{
    if (dt < 0 || !(mask & (1u << dt)))
        fail(op, "the plugin's %s kernel does not take %s (its kernel table's dtype mask)", prim,
             dt < 0 ? "this data type" : DTYPE_NAMES[dt]);
}

/* ---- the five primitives (anychip/plugin.h, KERNELS) --------------------------------------------- */

/* out[dim] = a <e> b, a and b broadcast (strides as, bs) */
static void ew(const char *op, anychip_stream s, anychip_binary_op e, int dt, int nd, const int64_t *dim, void *out,
               const void *a, const int64_t *as, const void *b, const int64_t *bs)
{
    static const int64_t ONE[1] = {1};
    if (numel(nd, dim) == 0)
        return;
    takes(op, "binary", MASK(binary), dt);
    kcheck(op, "binary", K->binary(t_device, s, e, (anychip_dtype)dt, nd, nd ? dim : ONE, out, a, nd ? as : ONE, b,
                                   nd ? bs : ONE));
}

/* out[0:n] = u(x) (COPY: x cast from in_dt to out_dt) */
static void un(const char *op, anychip_stream s, anychip_unary_op u, int out_dt, int in_dt, int64_t n, void *out,
               const void *x)
{
    int64_t one = 1;
    if (n == 0)
        return;
    takes(op, "unary", MASK(unary), out_dt);
    takes(op, "unary", MASK(unary), in_dt);
    kcheck(op, "unary", K->unary(t_device, s, u, (anychip_dtype)out_dt, (anychip_dtype)in_dt, 1, &n, out, x, &one));
}

static void kreduce(const char *op, anychip_stream s, anychip_reduce_op r, int out_dt, int in_dt, int64_t outer,
                    int64_t n, int64_t inner, void *out, const void *x)
{
    takes(op, "reduce", MASK(reduce), out_dt);
    takes(op, "reduce", MASK(reduce), in_dt);
    kcheck(op, "reduce", K->reduce(t_device, s, r, (anychip_dtype)out_dt, (anychip_dtype)in_dt, outer, n, inner, out,
                                   x));
}

static void fill(const char *op, anychip_stream s, int dt, int64_t n, void *out, double f, int64_t i, int from_float)
{
    if (n == 0)
        return;
    takes(op, "fill", MASK(fill), dt);
    kcheck(op, "fill", K->fill(t_device, s, (anychip_dtype)dt, n, out, f, i, from_float));
}

/* ---- building blocks -------------------------------------------------------------------------- */

static void contiguous_strides(int nd, const int64_t *dim, int64_t *st)
{
    int64_t acc = 1;
    for (int d = nd - 1; d >= 0; d--) {
        st[d] = acc;
        acc *= dim[d];
    }
}

/* the strides that broadcast `v` to the nd-dim shape `dim`: its dims aligned at `off`
 * (Paddle's axis; the trailing alignment when -1), 0 where it has 1 or no dimension */
static void broadcast_strides(const char *op, const tview *v, int nd, const int64_t *dim, int axis, int64_t *st)
{
    int off = (axis < 0 || v->nd == nd) ? nd - v->nd : axis;
    if (off < 0 || off + v->nd > nd)
        fail(op, "cannot broadcast a %d-d operand to %d dimensions at axis %d", v->nd, nd, axis);
    int64_t own[MAXD];
    contiguous_strides(v->nd, v->dim, own);
    for (int d = 0; d < nd; d++) {
        int k = d - off;
        if (k < 0 || k >= v->nd || v->dim[k] == 1)
            st[d] = 0;
        else if (v->dim[k] == dim[d])
            st[d] = own[k];
        else
            fail(op, "dimension %d of an operand is %lld, the output's is %lld", k, (long long)v->dim[k],
                 (long long)dim[d]);
    }
}

/* a device constant of one element (broadcast with stride 0) */
static void *constant(temps *T, anychip_stream s, C_DataType cdt, double v)
{
    void *p = temp(T, 0, NULL, cdt);
    fill(T->op, s, to_dtype(cdt), 1, p, v, (int64_t)v, 1);
    return p;
}

/* out = x reduced (ANYCHIP_REDUCE_SUM / ANYCHIP_REDUCE_MEAN) over the dims flagged in `red`, x contiguous of `dim`;
 * out has the kept dims' elements, of out_dt. A mean over several runs of dimensions is a
 * sum divided by the count, as Paddle's CPU kernel computes it. */
static void reduce_dims(temps *T, anychip_stream s, int op, int nd, const int64_t *dim, const int *red, const void *x,
                        int in_dt, C_DataType out_cdt, void *out)
{
    int out_dt = to_dtype(out_cdt);
    int64_t size[MAXD];
    int flag[MAXD], runs = 0, reduced = 0;
    int64_t count = 1, total = 1;
    for (int d = 0; d < nd; d++) {
        total *= dim[d];
        if (dim[d] == 1)
            continue;
        if (red[d])
            count *= dim[d];
        if (runs && flag[runs - 1] == red[d])
            size[runs - 1] *= dim[d];
        else {
            size[runs] = dim[d];
            flag[runs++] = red[d];
        }
        reduced += red[d];
    }
    if (total == 0) {
        int64_t kept = 1;
        for (int d = 0; d < nd; d++)
            kept *= red[d] ? 1 : dim[d];
        if (kept)
            fill(T->op, s, out_dt, kept, out, op == ANYCHIP_REDUCE_MEAN ? NAN : 0.0, 0, op == ANYCHIP_REDUCE_MEAN);
        return;
    }
    if (!reduced) {
        un(T->op, s, ANYCHIP_OP_COPY, out_dt, in_dt, total, out, x);
        return;
    }
    int nred = 0;
    for (int r = 0; r < runs; r++)
        nred += flag[r];
    int one_step_mean = op == ANYCHIP_REDUCE_MEAN && nred == 1;
    const void *cur = x;
    int cur_dt = in_dt;
    for (int done = 0; done < nred; done++) {
        int r = runs - 1;
        while (!flag[r])
            r--;
        int64_t outer = 1, inner = 1;
        for (int k = 0; k < r; k++)
            outer *= size[k];
        for (int k = r + 1; k < runs; k++)
            inner *= size[k];
        int last = done == nred - 1;
        int64_t kept_dims[1] = {outer * inner};
        void *dst = last && (op == ANYCHIP_REDUCE_SUM || one_step_mean) ? out : temp(T, 1, kept_dims, out_cdt);
        kreduce(T->op, s, one_step_mean ? ANYCHIP_REDUCE_MEAN : ANYCHIP_REDUCE_SUM, out_dt, cur_dt, outer, size[r],
                inner, dst, cur);
        cur = dst;
        cur_dt = out_dt;
        /* drop the run; merge its neighbours when both are kept */
        for (int k = r; k + 1 < runs; k++) {
            size[k] = size[k + 1];
            flag[k] = flag[k + 1];
        }
        runs--;
        if (r > 0 && r < runs && !flag[r - 1] && !flag[r]) {
            size[r - 1] *= size[r];
            for (int k = r; k + 1 < runs; k++) {
                size[k] = size[k + 1];
                flag[k] = flag[k + 1];
            }
            runs--;
        }
    }
    if (op == ANYCHIP_REDUCE_MEAN && !one_step_mean) {
        int64_t kept = total / count, zero = 0;
        void *c = constant(T, s, out_cdt, (double)count);
        ew(T->op, s, ANYCHIP_OP_DIV, out_dt, 1, &kept, out, cur, (int64_t[]){1}, c, &zero);
    }
}

/* dx = dout summed over the dims x was broadcast along (dout's shape is the output's) */
static void unbroadcast(temps *T, anychip_stream s, const tview *dout, const void *src, const tview *x, int axis,
                        void *dx)
{
    int nd = dout->nd, red[MAXD];
    int64_t st[MAXD];
    broadcast_strides(T->op, x, nd, dout->dim, axis, st);
    for (int d = 0; d < nd; d++)
        red[d] = st[d] == 0 && dout->dim[d] != 1;
    reduce_dims(T, s, ANYCHIP_REDUCE_SUM, nd, dout->dim, red, src, dout->dt, x->cdt, dx);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

static void binary(const char *op, int e, PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *y, PD_Tensor *out)
{
    tview a, b, o;
    input(op, x, &a);
    input(op, y, &b);
    if (a.cdt != b.cdt)
        fail(op, "operands of data types %d and %d (Paddle casts them to one first)", (int)a.cdt, (int)b.cdt);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, out, a.cdt, &o);
    int64_t as[MAXD], bs[MAXD];
    broadcast_strides(op, &a, o.nd, o.dim, -1, as);
    broadcast_strides(op, &b, o.nd, o.dim, -1, bs);
    ew(op, s, e, o.dt, o.nd, o.dim, o.p, a.p, as, b.p, bs);
}

#define BINARY(fn, name, e)                                                                 \
    static void fn(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *y, PD_Tensor *o) { binary(name, e, c, x, y, o); }
BINARY(k_add, "add", ANYCHIP_OP_ADD)
BINARY(k_sub, "subtract", ANYCHIP_OP_SUB)
BINARY(k_mul, "multiply", ANYCHIP_OP_MUL)
BINARY(k_div, "divide", ANYCHIP_OP_DIV)
BINARY(k_max, "maximum", ANYCHIP_OP_MAX)
BINARY(k_min, "minimum", ANYCHIP_OP_MIN)

/* dx, dy of add (sign 1) and subtract (sign -1): dout summed to each operand's shape */
static void add_sub_grad(const char *op, int sign, PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *y,
                         PD_Tensor *dout, int axis, PD_Tensor *dx, PD_Tensor *dy)
{
    tview a, b, g, o;
    shape_of(op, x, &a);                  /* x and y: their shapes only (Paddle may pass no memory) */
    shape_of(op, y, &b);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    temps T = {ctx, op, {0}, 0};
    if (dx) {
        output(op, ctx, dx, a.cdt, &o);
        unbroadcast(&T, s, &g, g.p, &a, axis, o.p);
    }
    if (dy) {
        output(op, ctx, dy, b.cdt, &o);
        if (sign > 0)
            unbroadcast(&T, s, &g, g.p, &b, axis, o.p);
        else {
            void *neg = temp(&T, g.nd, g.dim, g.cdt);
            un(op, s, ANYCHIP_OP_NEG, g.dt, g.dt, g.n, neg, g.p);
            unbroadcast(&T, s, &g, neg, &b, axis, o.p);
        }
    }
    temps_free(&T);
}

static void k_add_grad(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *y, PD_Tensor *g, int axis, PD_Tensor *dx,
                       PD_Tensor *dy)
{
    add_sub_grad("add_grad", 1, c, x, y, g, axis, dx, dy);
}

static void k_sub_grad(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *y, PD_Tensor *g, int axis, PD_Tensor *dx,
                       PD_Tensor *dy)
{
    add_sub_grad("subtract_grad", -1, c, x, y, g, axis, dx, dy);
}

/* t = dout <e> other (other broadcast to dout's shape), then summed to `to`'s shape into out */
static void grad_term(temps *T, anychip_stream s, int e, const tview *g, const tview *other, const void *other_p,
                      int axis, const tview *to, void *out)
{
    int64_t gs[MAXD], os[MAXD];
    contiguous_strides(g->nd, g->dim, gs);
    broadcast_strides(T->op, other, g->nd, g->dim, axis, os);
    void *t = temp(T, g->nd, g->dim, g->cdt);
    ew(T->op, s, e, g->dt, g->nd, g->dim, t, g->p, gs, other_p, os);
    unbroadcast(T, s, g, t, to, axis, out);
}

static void k_mul_grad(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *y, PD_Tensor *dout, int axis, PD_Tensor *dx,
                       PD_Tensor *dy)
{
    const char *op = "multiply_grad";
    tview a, b, g, o;
    input(op, x, &a);
    input(op, y, &b);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    temps T = {ctx, op, {0}, 0};
    if (dx) {
        output(op, ctx, dx, a.cdt, &o);
        grad_term(&T, s, ANYCHIP_OP_MUL, &g, &b, b.p, axis, &a, o.p);              /* dout * y */
    }
    if (dy) {
        output(op, ctx, dy, b.cdt, &o);
        grad_term(&T, s, ANYCHIP_OP_MUL, &g, &a, a.p, axis, &b, o.p);              /* dout * x */
    }
    temps_free(&T);
}

static void k_div_grad(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *y, PD_Tensor *out, PD_Tensor *dout, int axis,
                       PD_Tensor *dx, PD_Tensor *dy)
{
    const char *op = "divide_grad";
    tview a, b, q, g, o;
    input(op, x, &a);
    input(op, y, &b);
    input(op, out, &q);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    temps T = {ctx, op, {0}, 0};
    if (dx) {
        output(op, ctx, dx, a.cdt, &o);
        grad_term(&T, s, ANYCHIP_OP_DIV, &g, &b, b.p, axis, &a, o.p);              /* dout / y */
    }
    if (dy) {                                                             /* -(dout * out / y) */
        output(op, ctx, dy, b.cdt, &o);
        int64_t gs[MAXD], ys[MAXD];
        contiguous_strides(g.nd, g.dim, gs);
        broadcast_strides(op, &b, g.nd, g.dim, axis, ys);
        void *t = temp(&T, g.nd, g.dim, g.cdt);
        ew(op, s, ANYCHIP_OP_MUL, g.dt, g.nd, g.dim, t, g.p, gs, q.p, gs);
        ew(op, s, ANYCHIP_OP_DIV, g.dt, g.nd, g.dim, t, t, gs, b.p, ys);
        un(op, s, ANYCHIP_OP_NEG, g.dt, g.dt, g.n, t, t);
        unbroadcast(&T, s, &g, t, &b, axis, o.p);
    }
    temps_free(&T);
}

/* ---- unary ---------------------------------------------------------------------------------- */

static void unary_op(const char *op, int u, PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *out)
{
    tview a, o;
    input(op, x, &a);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, out, a.cdt, &o);
    un(op, s, u, o.dt, a.dt, a.n, o.p, a.p);
}

static void k_relu(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *o) { unary_op("relu", ANYCHIP_OP_RELU, c, x, o); }
static void k_exp(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *o) { unary_op("exp", ANYCHIP_OP_EXP, c, x, o); }
static void k_log(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *o) { unary_op("log", ANYCHIP_OP_LOG, c, x, o); }

static void k_square(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *out)
{
    tview a, o;
    input("square", x, &a);
    anychip_stream s = stream_of("square", ctx);
    output("square", ctx, out, a.cdt, &o);
    int64_t one = 1;
    ew("square", s, ANYCHIP_OP_MUL, o.dt, 1, &a.n, o.p, a.p, &one, a.p, &one);
}

/* dx = dout <e> v (same shapes) */
static void same_shape_grad(const char *op, int e, PD_DeviceContext *ctx, PD_Tensor *v, PD_Tensor *dout, PD_Tensor *dx)
{
    tview a, g, o;
    input(op, v, &a);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, dx, g.cdt, &o);
    int64_t one = 1;
    ew(op, s, e, o.dt, 1, &g.n, o.p, g.p, &one, a.p, &one);
}

static void k_exp_grad(PD_DeviceContext *c, PD_Tensor *out, PD_Tensor *g, PD_Tensor *dx)
{
    same_shape_grad("exp_grad", ANYCHIP_OP_MUL, c, out, g, dx);                    /* dout * out */
}

static void k_log_grad(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *g, PD_Tensor *dx)
{
    same_shape_grad("log_grad", ANYCHIP_OP_DIV, c, x, g, dx);                      /* dout / x */
}

/* dx = dout * (out > 0), as Paddle's CPU kernel computes it */
static void k_relu_grad(PD_DeviceContext *ctx, PD_Tensor *out, PD_Tensor *dout, PD_Tensor *dx)
{
    const char *op = "relu_grad";
    tview a, g, o;
    input(op, out, &a);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, dx, g.cdt, &o);
    temps T = {ctx, op, {0}, 0};
    int64_t one = 1, zero = 0;
    void *z = constant(&T, s, a.cdt, 0.0);
    void *mask = temp(&T, 1, &g.n, BOOL);
    void *maskf = temp(&T, 1, &g.n, g.cdt);
    ew(op, s, ANYCHIP_OP_GT, a.dt, 1, &a.n, mask, a.p, &one, z, &zero);
    un(op, s, ANYCHIP_OP_COPY, g.dt, ANYCHIP_BOOL, g.n, maskf, mask);
    ew(op, s, ANYCHIP_OP_MUL, g.dt, 1, &g.n, o.p, g.p, &one, maskf, &one);
    temps_free(&T);
}

/* dx = dout * 2 * x */
static void k_square_grad(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *dout, PD_Tensor *dx)
{
    const char *op = "square_grad";
    tview a, g, o;
    input(op, x, &a);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, dx, g.cdt, &o);
    int64_t one = 1;
    ew(op, s, ANYCHIP_OP_ADD, g.dt, 1, &g.n, o.p, g.p, &one, g.p, &one);
    ew(op, s, ANYCHIP_OP_MUL, g.dt, 1, &g.n, o.p, o.p, &one, a.p, &one);
}

static float half_to_float(uint16_t h);

static uint16_t float_to_half(float f)            /* round to nearest even */
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff)
        return (uint16_t)(sign | 0x7c00u | (m ? 0x200u | (m >> 13) : 0));
    int ex = (int)e - 127 + 15;
    if (ex >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (ex <= 0) {                                /* subnormal or zero */
        if (ex < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        int shift = 14 - ex;
        uint32_t half = m >> shift, rest = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)ex << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1)))
        half++;                                   /* a carry into the exponent is right, up to infinity */
    return (uint16_t)(sign | half);
}

static uint16_t float_to_bf16(float f)            /* round to nearest even */
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);     /* a quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* A cast whose output dtype the plugin's unary kernel does not take: the conversion runs on the
 * host, as a C cast (what Paddle's CPU fallback would do), through the plugin's synchronous copies
 * (the copy fence orders them after the stream's work). A float64 source cast to float16 or
 * bfloat16 is rounded through float32 there. */
static void host_cast(const char *op, const tview *a, const tview *o)
{
    size_t n = (size_t)a->n;
    unsigned char *src = malloc(n * (size_t)ITEMSZ[a->dt] + 1), *dst = malloc(n * (size_t)ITEMSZ[o->dt] + 1);
    if (!src || !dst) {
        free(src);
        free(dst);
        fail(op, "out of host memory for a cast of %zu elements on the host", n);
    }
    if (sync_copy(t_device, src, a->p, n * (size_t)ITEMSZ[a->dt], ANYCHIP_COPY_D2H) != C_SUCCESS) {
        free(src);
        free(dst);
        fail(op, "copying the input to the host failed (the message above says why)");
    }
    for (size_t k = 0; k < n; k++) {
        const unsigned char *p = src + k * (size_t)ITEMSZ[a->dt];
        double f = 0;
        int64_t i = 0;
        int is_f = 1;
        switch (a->dt) {
        case ANYCHIP_FLOAT64: memcpy(&f, p, 8); break;
        case ANYCHIP_FLOAT32: { float v; memcpy(&v, p, 4); f = v; break; }
        case ANYCHIP_FLOAT16: case ANYCHIP_BFLOAT16: {
            uint16_t h;
            memcpy(&h, p, 2);
            if (a->dt == ANYCHIP_FLOAT16)
                f = half_to_float(h);
            else {
                uint32_t bits = (uint32_t)h << 16;
                float v;
                memcpy(&v, &bits, 4);
                f = v;
            }
            break;
        }
        case ANYCHIP_INT64: memcpy(&i, p, 8); is_f = 0; break;
        case ANYCHIP_INT32: { int32_t v; memcpy(&v, p, 4); i = v; is_f = 0; break; }
        case ANYCHIP_INT8: i = (int8_t)p[0]; is_f = 0; break;
        default: i = p[0]; is_f = 0; break;       /* uint8, bool */
        }
        /* a float to an integer truncates toward zero; out of int64's range (or NaN) gives INT64_MIN,
         * as x86's conversion does */
        int64_t iv = !is_f ? i : (f > -9223372036854775808.0 && f < 9223372036854775808.0) ? (int64_t)f : INT64_MIN;
        float fv = is_f ? (float)f : (float)i;
        unsigned char *q = dst + k * (size_t)ITEMSZ[o->dt];
        switch (o->dt) {
        case ANYCHIP_FLOAT64: { double v = is_f ? f : (double)i; memcpy(q, &v, 8); break; }
        case ANYCHIP_FLOAT32: memcpy(q, &fv, 4); break;
        case ANYCHIP_FLOAT16: { uint16_t h = float_to_half(fv); memcpy(q, &h, 2); break; }
        case ANYCHIP_BFLOAT16: { uint16_t h = float_to_bf16(fv); memcpy(q, &h, 2); break; }
        case ANYCHIP_INT64: memcpy(q, &iv, 8); break;
        case ANYCHIP_INT32: { int32_t v = (int32_t)iv; memcpy(q, &v, 4); break; }
        case ANYCHIP_BOOL: q[0] = is_f ? f != 0 : i != 0; break;
        default: q[0] = (unsigned char)iv; break; /* int8, uint8 */
        }
    }
    C_Status st = sync_copy(t_device, o->p, dst, n * (size_t)ITEMSZ[o->dt], ANYCHIP_COPY_H2D);
    free(src);
    free(dst);
    if (st != C_SUCCESS)
        fail(op, "copying the result to the device failed (the message above says why)");
}

static void cast_to(PD_DeviceContext *ctx, PD_Tensor *x, C_DataType to, PD_Tensor *out)
{
    tview a, o;
    input("cast", x, &a);
    if (to_dtype(to) < 0)
        fail("cast", "to data type %d, which is not one of the device's", (int)to);
    anychip_stream s = stream_of("cast", ctx);
    output("cast", ctx, out, to, &o);
    if (MASK(unary) & (1u << o.dt))
        un("cast", s, ANYCHIP_OP_COPY, o.dt, a.dt, a.n, o.p, a.p);
    else if (a.n)
        host_cast("cast", &a, &o);
}

static void k_cast(PD_DeviceContext *c, PD_Tensor *x, int phi_dtype, PD_Tensor *o)
{
    cast_to(c, x, from_phi(phi_dtype), o);
}

/* A Scalar attribute's value. Eager mode passes a phi::Scalar; Paddle's executor passes an
 * attribute computed by the program ("mutable": scale's factor, full_like's value) as a
 * one-element tensor, which the kernel C API cannot read -- the C++ piece (kernels_throw.cc)
 * takes it through phi::KernelContext::AttrAt<phi::TensorRef>, and it is read here. */
typedef struct { double f; int64_t i; } scal_v;

static scal_v scal_of(PD_Scalar *s) { return (scal_v){PD.PD_ScalarGetFloat64Data(s), PD.PD_ScalarGetInt64Data(s)}; }

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023u, bits;
    if (e == 31)
        bits = sign | 0x7f800000u | (m << 13);
    else if (e)
        bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m)
        bits = sign;
    else {                                /* subnormal: normalise */
        e = 113;
        while (!(m & 1024u)) {
            m <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((m & 1023u) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* the elements (at most `max`) of an attribute's tensor into `b`; its data type */
static C_DataType attr_tensor(const char *op, size_t index, const PD_Tensor *t, unsigned char *b, size_t max,
                              int64_t *count)
{
    C_Status st = C_SUCCESS;
    int64_t n = PD.PD_TensorGetElementCount(t, &st);
    C_DataType dt = PD.PD_TensorGetPDDataType(t, &st);
    const void *p = PD.PD_TensorGetDataPointer(t, &st);
    size_t size = dt == FLOAT64 || dt == INT64 ? 8 : dt == FLOAT32 || dt == INT32 ? 4
                  : dt == FLOAT16 || dt == BFLOAT16 ? 2 : dt == BOOL || dt == INT8 || dt == UINT8 ? 1 : 0;
    if (st != C_SUCCESS || (n && !p) || n < 0)
        fail(op, "attribute %zu is a tensor Paddle gave no data for", index);
    if (!size)
        fail(op, "attribute %zu is a tensor of data type %d, not of numbers", index, (int)dt);
    if ((size_t)n * size > max)
        fail(op, "attribute %zu is a tensor of %lld elements; at most %zu", index, (long long)n, max / size);
    /* on the device: read it after the work queued there (the copy fence); else it is host memory */
    if (n && (fence(t_device) != C_SUCCESS || P.copy(t_device, b, p, (size_t)n * size, ANYCHIP_COPY_D2H) != 0))
        memcpy(b, p, (size_t)n * size);
    *count = n;
    return dt;
}

static scal_v scalar_of_tensor(const char *op, size_t index, const PD_Tensor *t)
{
    unsigned char b[8] = {0};
    int64_t n = 0;
    C_DataType dt = attr_tensor(op, index, t, b, sizeof b, &n);
    if (n != 1)
        fail(op, "attribute %zu is a tensor of %lld elements; a scalar attribute's tensor has one", index,
             (long long)n);
    scal_v v = {0, 0};
    switch (dt) {
    case FLOAT64: { double x; memcpy(&x, b, 8); v.f = x; v.i = (int64_t)x; break; }
    case FLOAT32: { float x; memcpy(&x, b, 4); v.f = x; v.i = (int64_t)x; break; }
    case INT64: { int64_t x; memcpy(&x, b, 8); v.f = (double)x; v.i = x; break; }
    case INT32: { int32_t x; memcpy(&x, b, 4); v.f = x; v.i = x; break; }
    case FLOAT16: { uint16_t x; memcpy(&x, b, 2); v.f = half_to_float(x); v.i = (int64_t)v.f; break; }
    case BFLOAT16: {
        uint16_t x;
        memcpy(&x, b, 2);
        uint32_t bits = (uint32_t)x << 16;
        float f;
        memcpy(&f, &bits, 4);
        v.f = f;
        v.i = (int64_t)f;
        break;
    }
    case INT8: v.i = (int8_t)b[0]; v.f = (double)v.i; break;
    default: v.i = b[0]; v.f = (double)v.i; break;       /* bool, uint8 */
    }
    return v;
}

const void *anychip_paddle_attr(void *attr_at, const void *tensor_ref_at, void *ctx, size_t index, int *is_tensor);
static const void *g_tensor_ref_at;       /* phi::KernelContext::AttrAt<phi::TensorRef>, from libphi_core.so */

static scal_v ctx_scalar(const char *op, PD_KernelContext *c, size_t index)
{
    int is_tensor = 0;
    const void *p = anychip_paddle_attr((void *)PD.PD_KernelContextScalarAttrAt, g_tensor_ref_at, c, index, &is_tensor);
    return is_tensor ? scalar_of_tensor(op, index, p) : scal_of((PD_Scalar *)p);
}


/* out = scale * x + bias, or scale * (x + bias) */
static void scale_op(PD_DeviceContext *ctx, PD_Tensor *x, double scale, double bias, bool after, PD_Tensor *out)
{
    const char *op = "scale";
    tview a, o;
    input(op, x, &a);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, out, a.cdt, &o);
    temps T = {ctx, op, {0}, 0};
    void *k = constant(&T, s, a.cdt, scale);
    void *c = constant(&T, s, a.cdt, bias);
    int64_t one = 1, zero = 0;
    if (after) {
        ew(op, s, ANYCHIP_OP_MUL, a.dt, 1, &a.n, o.p, a.p, &one, k, &zero);
        ew(op, s, ANYCHIP_OP_ADD, a.dt, 1, &a.n, o.p, o.p, &one, c, &zero);
    } else {
        ew(op, s, ANYCHIP_OP_ADD, a.dt, 1, &a.n, o.p, a.p, &one, c, &zero);
        ew(op, s, ANYCHIP_OP_MUL, a.dt, 1, &a.n, o.p, o.p, &one, k, &zero);
    }
    temps_free(&T);
}

static void k_scale(PD_DeviceContext *ctx, PD_Tensor *x, PD_Scalar *scale, PD_Scalar *bias, bool after, PD_Tensor *out)
{
    scale_op(ctx, x, PD.PD_ScalarGetFloat64Data(scale), PD.PD_ScalarGetFloat64Data(bias), after, out);
}

/* ---- fill ------------------------------------------------------------------------------------- */

static void fill_value(const char *op, PD_DeviceContext *ctx, scal_v val, C_DataType cdt, PD_Tensor *out)
{
    tview o;
    if (to_dtype(cdt) < 0)
        fail(op, "data type %d is not one of the device's", (int)cdt);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, out, cdt, &o);
    int is_f = cdt == FLOAT16 || cdt == BFLOAT16 || cdt == FLOAT32 || cdt == FLOAT64;
    if (o.n)
        fill(op, s, o.dt, o.n, o.p, is_f ? val.f : 0.0, is_f ? 0 : val.i, 0);
}

static void k_full(PD_DeviceContext *c, PD_IntArray *shape, PD_Scalar *v, int phi_dtype, PD_Tensor *o)
{
    (void)shape;                          /* InferMeta set the output's dims from it */
    fill_value("full", c, scal_of(v), from_phi(phi_dtype), o);
}

static void k_full_like(PD_DeviceContext *c, PD_Tensor *x, PD_Scalar *v, int phi_dtype, PD_Tensor *o)
{
    (void)x;
    C_DataType t = from_phi(phi_dtype);
    C_Status st = C_SUCCESS;
    fill_value("full_like", c, scal_of(v), t == UNDEFINED ? PD.PD_TensorGetPDDataType(x, &st) : t, o);
}

/* ---- reductions --------------------------------------------------------------------------------- */

/* the axes of a reduction: an IntArray attribute's values */
typedef struct { size_t n; int64_t v[2 * MAXD]; } axes_v;

static axes_v axes_of(const char *op, PD_IntArray *dims)
{
    axes_v a = {PD.PD_IntArrayGetElementCount(dims), {0}};
    if (a.n > sizeof a.v / sizeof *a.v)
        fail(op, "%zu axes; at most %zu", a.n, sizeof a.v / sizeof *a.v);
    PD_List l = PD.PD_IntArrayGetDataPointer(dims);
    if (a.n)
        memcpy(a.v, l.data, a.n * sizeof *a.v);
    return a;
}

/* which of x's dims the axes name (all when empty or reduce_all), negatives from the end */
static void reduced_dims(const char *op, const axes_v *dims, int reduce_all, const tview *x, int *red)
{
    size_t n = dims->n;
    const int64_t *d = dims->v;
    for (int k = 0; k < x->nd; k++)
        red[k] = reduce_all || n == 0 || (size_t)x->nd == 0;
    for (size_t i = 0; i < n && !reduce_all; i++) {
        int64_t a = d[i] < 0 ? d[i] + x->nd : d[i];
        if (x->nd == 0 && (d[i] == 0 || d[i] == -1))
            continue;
        if (a < 0 || a >= x->nd)
            fail(op, "axis %lld is out of range for a %d-d tensor", (long long)d[i], x->nd);
        red[a] = 1;
    }
}

static void reduce_op(const char *op, int r, PD_DeviceContext *ctx, PD_Tensor *x, const axes_v *dims, C_DataType to,
                      PD_Tensor *out)
{
    tview a, o;
    input(op, x, &a);
    int red[MAXD];
    reduced_dims(op, dims, 0, &a, red);
    anychip_stream s = stream_of(op, ctx);
    if (to == UNDEFINED) {                /* no dtype attribute: the one InferMeta gave the output */
        C_Status st = C_SUCCESS;
        to = PD.PD_TensorGetPDDataType(out, &st);
        if (st != C_SUCCESS || to_dtype(to) < 0)
            to = a.cdt;
    }
    output(op, ctx, out, to, &o);
    temps T = {ctx, op, {0}, 0};
    if (a.nd == 0)
        un(op, s, ANYCHIP_OP_COPY, o.dt, a.dt, 1, o.p, a.p);
    else
        reduce_dims(&T, s, r, a.nd, a.dim, red, a.p, a.dt, o.cdt, o.p);
    temps_free(&T);
}

static void k_sum(PD_DeviceContext *c, PD_Tensor *x, PD_IntArray *dims, int phi_dtype, bool keep, PD_Tensor *o)
{
    (void)keep;
    axes_v a = axes_of("sum", dims);
    reduce_op("sum", ANYCHIP_REDUCE_SUM, c, x, &a, from_phi(phi_dtype), o);
}

static void k_mean(PD_DeviceContext *c, PD_Tensor *x, PD_IntArray *dims, bool keep, PD_Tensor *o)
{
    (void)keep;
    axes_v a = axes_of("mean", dims);
    reduce_op("mean", ANYCHIP_REDUCE_MEAN, c, x, &a, UNDEFINED, o);
}

static void k_mean_all(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *out)
{
    tview a, o;
    input("mean_all", x, &a);
    anychip_stream s = stream_of("mean_all", ctx);
    output("mean_all", ctx, out, a.cdt, &o);
    temps T = {ctx, "mean_all", {0}, 0};
    int64_t n = a.n;
    int red = 1;
    reduce_dims(&T, s, ANYCHIP_REDUCE_MEAN, 1, &n, &red, a.p, a.dt, a.cdt, o.p);
    temps_free(&T);
}

/* dx = dout broadcast back over the reduced dims (divided by their count for a mean) */
static void reduce_grad(const char *op, int mean, PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *dout,
                        const axes_v *dims, int reduce_all, PD_Tensor *dx)
{
    tview a, g, o;
    shape_of(op, x, &a);                  /* x: its shape only */
    input(op, dout, &g);
    int red[MAXD];
    if (dims)
        reduced_dims(op, dims, reduce_all, &a, red);
    else
        for (int k = 0; k < a.nd; k++)
            red[k] = 1;
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, dx, a.cdt, &o);
    if (!o.n)
        return;
    /* dout has x's dims with the reduced ones removed or kept as 1: strides over x's dims */
    int64_t gs[MAXD], acc = 1, count = 1;
    for (int d = a.nd - 1; d >= 0; d--) {
        gs[d] = red[d] ? 0 : acc;
        acc *= red[d] ? 1 : a.dim[d];
        count *= red[d] ? a.dim[d] : 1;
    }
    temps T = {ctx, op, {0}, 0};
    void *c = constant(&T, s, g.cdt, mean ? (double)count : 0.0);
    if (a.nd == 0) {
        int64_t one = 1, zero = 0;
        ew(op, s, mean ? ANYCHIP_OP_DIV : ANYCHIP_OP_ADD, o.dt, 1, &one, o.p, g.p, &one, c, &zero);
    } else {
        int64_t zeros[MAXD] = {0};
        ew(op, s, mean ? ANYCHIP_OP_DIV : ANYCHIP_OP_ADD, o.dt, a.nd, a.dim, o.p, g.p, gs, c, zeros);
    }
    temps_free(&T);
}

static void k_sum_grad(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *g, PD_IntArray *dims, bool keep, bool all,
                       PD_Tensor *dx)
{
    (void)keep;
    axes_v a = axes_of("sum_grad", dims);
    reduce_grad("sum_grad", 0, c, x, g, &a, all, dx);
}

static void k_mean_grad(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *g, PD_IntArray *dims, bool keep, bool all,
                        PD_Tensor *dx)
{
    (void)keep;
    axes_v a = axes_of("mean_grad", dims);
    reduce_grad("mean_grad", 1, c, x, g, &a, all, dx);
}

static void k_mean_all_grad(PD_DeviceContext *c, PD_Tensor *x, PD_Tensor *g, PD_Tensor *dx)
{
    reduce_grad("mean_all_grad", 1, c, x, g, NULL, 1, dx);
}

/* ---- softmax ------------------------------------------------------------------------------------ */

static void axis_split(const char *op, const tview *v, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    int nd = v->nd ? v->nd : 1;
    int a = axis < 0 ? axis + nd : axis;
    if (a < 0 || a >= nd)
        fail(op, "axis %d is out of range for a %d-d tensor", axis, v->nd);
    *outer = 1;
    *inner = 1;
    *n = v->nd ? v->dim[a] : 1;
    for (int d = 0; d < a; d++)
        *outer *= v->dim[d];
    for (int d = a + 1; d < v->nd; d++)
        *inner *= v->dim[d];
}

/* out = exp(x - max) / sum(exp(x - max)) along the axis */
static void k_softmax(PD_DeviceContext *ctx, PD_Tensor *x, int axis, PD_Tensor *out)
{
    const char *op = "softmax";
    tview a, o;
    input(op, x, &a);
    int64_t outer, n, inner;
    axis_split(op, &a, axis, &outer, &n, &inner);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, out, a.cdt, &o);
    if (!a.n)
        return;
    temps T = {ctx, op, {0}, 0};
    int64_t dim[3] = {outer, n, inner}, full[3] = {n * inner, inner, 1}, bc[3] = {inner, 0, 1}, rows = outer * inner;
    void *m = temp(&T, 1, &rows, a.cdt), *sum = temp(&T, 1, &rows, a.cdt);
    kreduce(op, s, ANYCHIP_REDUCE_MAX, a.dt, a.dt, outer, n, inner, m, a.p);
    ew(op, s, ANYCHIP_OP_SUB, a.dt, 3, dim, o.p, a.p, full, m, bc);
    un(op, s, ANYCHIP_OP_EXP, a.dt, a.dt, a.n, o.p, o.p);
    kreduce(op, s, ANYCHIP_REDUCE_SUM, a.dt, a.dt, outer, n, inner, sum, o.p);
    ew(op, s, ANYCHIP_OP_DIV, a.dt, 3, dim, o.p, o.p, full, sum, bc);
    temps_free(&T);
}

/* dx = out * (dout - sum(dout * out) along the axis) */
static void k_softmax_grad(PD_DeviceContext *ctx, PD_Tensor *out, PD_Tensor *dout, int axis, PD_Tensor *dx)
{
    const char *op = "softmax_grad";
    tview y, g, o;
    input(op, out, &y);
    input(op, dout, &g);
    int64_t outer, n, inner;
    axis_split(op, &y, axis, &outer, &n, &inner);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, dx, y.cdt, &o);
    if (!y.n)
        return;
    temps T = {ctx, op, {0}, 0};
    int64_t dim[3] = {outer, n, inner}, full[3] = {n * inner, inner, 1}, bc[3] = {inner, 0, 1}, rows = outer * inner;
    int64_t one = 1;
    void *t = temp(&T, 1, &y.n, y.cdt), *sum = temp(&T, 1, &rows, y.cdt);
    ew(op, s, ANYCHIP_OP_MUL, y.dt, 1, &y.n, t, g.p, &one, y.p, &one);
    kreduce(op, s, ANYCHIP_REDUCE_SUM, y.dt, y.dt, outer, n, inner, sum, t);
    ew(op, s, ANYCHIP_OP_SUB, y.dt, 3, dim, t, g.p, full, sum, bc);
    ew(op, s, ANYCHIP_OP_MUL, y.dt, 1, &y.n, o.p, y.p, &one, t, &one);
    temps_free(&T);
}

/* ---- matmul ------------------------------------------------------------------------------------- */

/* a matrix operand: rows x cols with element strides */
typedef struct {
    const char *p;
    int64_t rows, cols, s0, s1;
} mat;

/* the logical [rows, cols] of the last two dims of v, transposed when t */
static mat as_mat(const tview *v, int t)
{
    int64_t r = v->nd >= 2 ? v->dim[v->nd - 2] : 1, c = v->nd >= 1 ? v->dim[v->nd - 1] : 1;
    mat m = {v->p, r, c, c, 1};
    if (t)
        m = (mat){v->p, c, r, 1, c};
    return m;
}

static void gemm(const char *op, anychip_stream s, int dt, void *out, mat a, mat b)
{
    if (a.rows == 0 || b.cols == 0)
        return;
    if (a.cols == 0) {
        fill(op, s, dt, a.rows * b.cols, out, 0.0, 0, 1);
        return;
    }
    takes(op, "gemm", MASK(gemm), dt);
    kcheck(op, "gemm", K->gemm(t_device, s, (anychip_dtype)dt, a.rows, a.cols, b.cols, out, a.p, a.s0, a.s1, b.p, b.s0,
                               b.s1));
}

/* batch geometry of a matmul: the broadcast batch dims of x and y (all but the last two) */
typedef struct {
    int nb;
    int64_t bdim[MAXD], xb[MAXD], yb[MAXD], count;
} batches;

static void batch_of(const char *op, const tview *x, const tview *y, batches *B)
{
    int xn = x->nd > 2 ? x->nd - 2 : 0, yn = y->nd > 2 ? y->nd - 2 : 0;
    B->nb = xn > yn ? xn : yn;
    B->count = 1;
    int64_t xm = x->nd >= 2 ? x->dim[x->nd - 2] * x->dim[x->nd - 1] : x->n;
    int64_t ym = y->nd >= 2 ? y->dim[y->nd - 2] * y->dim[y->nd - 1] : y->n;
    int64_t xs = xm, ys = ym;
    for (int d = B->nb - 1; d >= 0; d--) {
        int kx = d - (B->nb - xn), ky = d - (B->nb - yn);
        int64_t dx = kx >= 0 ? x->dim[kx] : 1, dy = ky >= 0 ? y->dim[ky] : 1;
        if (dx != dy && dx != 1 && dy != 1)
            fail(op, "batch dimensions %lld and %lld do not broadcast", (long long)dx, (long long)dy);
        B->bdim[d] = dx > dy ? dx : dy;
        B->xb[d] = dx == 1 ? 0 : xs;
        B->yb[d] = dy == 1 ? 0 : ys;
        xs *= dx;
        ys *= dy;
        B->count *= B->bdim[d];
    }
}

/* the element offsets of batch `i` in x and y */
static void batch_offsets(const batches *B, int64_t i, int64_t *xo, int64_t *yo)
{
    *xo = *yo = 0;
    for (int d = B->nb - 1; d >= 0; d--) {
        int64_t k = i % B->bdim[d];
        i /= B->bdim[d];
        *xo += k * B->xb[d];
        *yo += k * B->yb[d];
    }
}

static mat at(mat m, int64_t off, int item)
{
    m.p += off * item;
    return m;
}

#ifdef ANYCHIP_PADDLE_BEFORE_GEMM
static void ANYCHIP_PADDLE_BEFORE_GEMM(void);
#define before_gemm ANYCHIP_PADDLE_BEFORE_GEMM
#else
static void before_gemm(void) {}
#endif

/* x's batches (untransposed, contiguous) times a y of no batch dims are the rows of one matrix */
static int flat_batches(const tview *x, const tview *y, int tx)
{
    return x->nd > 2 && y->nd <= 2 && !tx;
}

static void k_matmul(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *y, bool tx, bool ty, PD_Tensor *out)
{
    before_gemm();
    const char *op = "matmul";
    tview a, b, o;
    input(op, x, &a);
    input(op, y, &b);
    if (a.cdt != b.cdt)
        fail(op, "operands of data types %d and %d", (int)a.cdt, (int)b.cdt);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, out, a.cdt, &o);
    /* a 1-d x is a row, a 1-d y a column (Paddle's rule); their transposes do not apply */
    mat A = as_mat(&a, a.nd >= 2 && tx), Bm = as_mat(&b, b.nd >= 2 && ty);
    if (b.nd == 1)
        Bm = (mat){b.p, b.dim[0], 1, 1, 1};
    if (A.cols != Bm.rows)
        fail(op, "inner dimensions %lld and %lld differ", (long long)A.cols, (long long)Bm.rows);
    batches B;
    batch_of(op, &a, &b, &B);
    int item = ITEMSZ[a.dt];
    int64_t per = A.rows * Bm.cols;
    if (flat_batches(&a, &b, tx)) {         /* [..., M, K] x [K, N]: one GEMM of all the rows */
        A.rows *= B.count;
        gemm(op, s, a.dt, o.p, A, Bm);
        return;
    }
    for (int64_t i = 0; i < B.count; i++) {
        int64_t xo, yo;
        batch_offsets(&B, i, &xo, &yo);
        gemm(op, s, a.dt, (char *)o.p + i * per * item, at(A, xo, item), at(Bm, yo, item));
    }
}

/* gradient of one operand: per output batch, the product `l @ r` (views chosen by the
 * caller), summed over the batches the operand was broadcast along */
static void matmul_grad_term(temps *T, anychip_stream s, const tview *self, const batches *B, int is_x, const tview *g,
                             mat (*pick)(const mat *, const mat *, const mat *, int), const mat *X, const mat *Y,
                             const mat *G, void *out)
{
    int item = ITEMSZ[g->dt];
    int64_t per = self->dim[self->nd - 2] * self->dim[self->nd - 1];
    int own_batches = 1;
    for (int d = 0; d < B->nb; d++)
        own_batches &= (is_x ? B->xb[d] : B->yb[d]) != 0 || B->bdim[d] == 1;
    own_batches &= (self->nd > 2 ? self->nd - 2 : 0) == B->nb;
    char *dst = own_batches ? out : temp(T, 1, (int64_t[]){B->count * per}, g->cdt);
    int64_t gper = g->dim[g->nd - 2] * g->dim[g->nd - 1];
    for (int64_t i = 0; i < B->count; i++) {
        int64_t xo, yo;
        batch_offsets(B, i, &xo, &yo);
        mat x = at(*X, xo, item), y = at(*Y, yo, item), gg = at(*G, i * gper, item);
        mat l = pick(&x, &y, &gg, 0), r = pick(&x, &y, &gg, 1);
        gemm(T->op, s, g->dt, dst + i * per * item, l, r);
    }
    if (own_batches)
        return;
    /* sum the per-batch results over the broadcast batch dims */
    int64_t dim[MAXD + 1];
    int red[MAXD + 1], nd = 0;
    for (int d = 0; d < B->nb; d++) {
        dim[nd] = B->bdim[d];
        red[nd++] = (is_x ? B->xb[d] : B->yb[d]) == 0;
    }
    dim[nd] = per;
    red[nd++] = 0;
    reduce_dims(T, s, ANYCHIP_REDUCE_SUM, nd, dim, red, dst, g->dt, g->cdt, out);
}

static mat tr(mat m) { return (mat){m.p, m.cols, m.rows, m.s1, m.s0}; }

/* out = x' @ y' (x' = x or x^T per tx, likewise y):
 *   dx' = dout @ y'^T, so dx = dout @ y'^T, or (dout @ y'^T)^T = y' @ dout^T when tx;
 *   dy' = x'^T @ dout, so dy = x'^T @ dout, or dout^T @ x' when ty. */
static __thread int t_tx, t_ty;          /* the op's flags, for the pickers */

static mat pick_dx(const mat *x, const mat *y, const mat *g, int right)
{
    (void)x;
    if (!t_tx)
        return right ? tr(*y) : *g;       /* dout @ y'^T */
    return right ? tr(*g) : *y;           /* y' @ dout^T */
}

static mat pick_dy(const mat *x, const mat *y, const mat *g, int right)
{
    (void)y;
    if (!t_ty)
        return right ? *g : tr(*x);       /* x'^T @ dout */
    return right ? *x : tr(*g);           /* dout^T @ x' */
}

static void k_matmul_grad(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *y, PD_Tensor *dout, bool tx, bool ty,
                          PD_Tensor *dx, PD_Tensor *dy)
{
    const char *op = "matmul_grad";
    before_gemm();
    tview a, b, g, o;
    input(op, x, &a);
    input(op, y, &b);
    input(op, dout, &g);
    /* a 1-d x is the row [1, K], a 1-d y the column [K, 1] (their transposes do not apply), and
     * dout gets back the dimension of 1 the product dropped: all contiguous, so only dims change */
    tview a2 = a, b2 = b;
    if (a.nd == 1) {
        a2.nd = 2;
        a2.dim[0] = 1;
        a2.dim[1] = a.dim[0];
        tx = 0;
    }
    if (b.nd == 1) {
        b2.nd = 2;
        b2.dim[0] = b.dim[0];
        b2.dim[1] = 1;
        ty = 0;
    }
    if (a.nd == 0 || b.nd == 0)
        fail(op, "a 0-d operand");
    anychip_stream s = stream_of(op, ctx);
    batches B;
    batch_of(op, &a2, &b2, &B);
    tview g2 = g;
    g2.nd = B.nb + 2;
    for (int d = 0; d < B.nb; d++)
        g2.dim[d] = B.bdim[d];
    g2.dim[B.nb] = tx ? a2.dim[a2.nd - 1] : a2.dim[a2.nd - 2];
    g2.dim[B.nb + 1] = ty ? b2.dim[b2.nd - 2] : b2.dim[b2.nd - 1];
    a = a2;
    b = b2;
    g = g2;
    mat X = as_mat(&a, tx), Y = as_mat(&b, ty);
    mat G = {g.p, X.rows, Y.cols, Y.cols, 1};
    t_tx = tx;
    t_ty = ty;
    if (flat_batches(&a, &b, tx)) {         /* x's rows as one matrix: dx = dout @ y'^T, dy = x^T @ dout */
        mat Xf = {X.p, X.rows * B.count, X.cols, X.s0, X.s1}, Gf = {G.p, G.rows * B.count, G.cols, G.s0, G.s1};
        if (dx) {
            output(op, ctx, dx, a.cdt, &o);
            gemm(op, s, a.dt, o.p, Gf, tr(Y));
        }
        if (dy) {
            output(op, ctx, dy, b.cdt, &o);
            if (ty)
                gemm(op, s, b.dt, o.p, tr(Gf), Xf);
            else
                gemm(op, s, b.dt, o.p, tr(Xf), Gf);
        }
        return;
    }
    temps T = {ctx, op, {0}, 0};
    if (dx) {
        output(op, ctx, dx, a.cdt, &o);
        matmul_grad_term(&T, s, &a, &B, 1, &g, pick_dx, &X, &Y, &G, o.p);
    }
    if (dy) {
        output(op, ctx, dy, b.cdt, &o);
        matmul_grad_term(&T, s, &b, &B, 0, &g, pick_dy, &X, &Y, &G, o.p);
    }
    temps_free(&T);
}

/* ---- AdamW ---------------------------------------------------------------------------------------- */

/* Paddle's CPU AdamW, in its order: the decay p -= lr * lr_ratio * coeff * p, then Adam:
 *   m1 = b1 m1 + (1 - b1) g,  m2 = b2 m2 + (1 - b2) g g,
 *   p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m1 / (sqrt(m2) + eps sqrt(1 - b2^t)),
 *   b1^t *= b1, b2^t *= b2 (unless the beta powers are global).
 * The scalars stay on the device (one-element tensors broadcast), so the update is queued
 * like any kernel. Outputs alias their inputs (Paddle's adamw_ is in place). */
static void adamw(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *grad, PD_Tensor *lr, PD_Tensor *m1,
                  PD_Tensor *m2, PD_Tensor *m2max, PD_Tensor *b1p, PD_Tensor *b2p, PD_Tensor *master,
                  PD_Tensor *skip, double beta1, double beta2, double eps, float lr_ratio, float coeff,
                  bool with_decay, bool multi_precision, bool use_global_beta_pow, bool amsgrad, PD_Tensor *param_out,
                  PD_Tensor *m1_out, PD_Tensor *m2_out, PD_Tensor *b1p_out, PD_Tensor *b2p_out)
{
    const char *op = "adamw";
    (void)m2max;
    if (amsgrad)
        fail(op, "amsgrad=True is not implemented on this device (set FLAGS_enable_api_kernel_fallback and "
             "leave the kernel unregistered with ANYCHIP_PADDLE_KERNELS=0 to run it on Paddle's CPU)");
    if (multi_precision && master)
        fail(op, "multi_precision with master weights is not implemented on this device");
    tview p, g, l, a1, a2, q1, q2;
    input(op, param, &p);
    input(op, grad, &g);
    input(op, lr, &l);
    input(op, m1, &a1);
    input(op, m2, &a2);
    input(op, b1p, &q1);
    input(op, b2p, &q2);
    if (g.n != p.n || a1.n != p.n || a2.n != p.n || l.n != 1 || q1.n != 1 || q2.n != 1)
        fail(op, "param, grad and moments of %lld, %lld, %lld, %lld elements; learning rate and beta powers "
             "of %lld, %lld, %lld (want equal sizes, and one element each)", (long long)p.n, (long long)g.n,
             (long long)a1.n, (long long)a2.n, (long long)l.n, (long long)q1.n, (long long)q2.n);
    if (g.cdt != p.cdt || l.cdt != p.cdt || a1.cdt != p.cdt || a2.cdt != p.cdt || q1.cdt != p.cdt || q2.cdt != p.cdt)
        fail(op, "tensors of different data types (this device's AdamW takes one)");
    anychip_stream s = stream_of(op, ctx);
    if (skip) {
        tview k;
        input(op, skip, &k);
        unsigned char flag = 0;
        if (k.n && (sync_copy(t_device, &flag, k.p, 1, ANYCHIP_COPY_D2H) != C_SUCCESS))
            fail(op, "reading skip_update failed");
        if (flag)
            return;                       /* in place: the outputs are the inputs, unchanged */
    }
    tview po, o1, o2;
    output(op, ctx, param_out, p.cdt, &po);
    output(op, ctx, m1_out, p.cdt, &o1);
    output(op, ctx, m2_out, p.cdt, &o2);
    temps T = {ctx, op, {0}, 0};
    int dt = p.dt;
    C_DataType c = p.cdt;
    int64_t n = p.n, one = 1, zero = 0, unit = 1;
    double b1 = c == FLOAT32 ? (double)(float)beta1 : beta1, b2 = c == FLOAT32 ? (double)(float)beta2 : beta2;
    double e = c == FLOAT32 ? (double)(float)eps : eps;
    void *t1 = temp(&T, 1, &n, c), *t2 = temp(&T, 1, &n, c);
    void *sc = temp(&T, 0, NULL, c), *sq = temp(&T, 0, NULL, c), *sd = temp(&T, 0, NULL, c);
    void *slr = temp(&T, 0, NULL, c), *seps = temp(&T, 0, NULL, c);
    const void *pin = p.p;
    if (with_decay) {                     /* p -= ((lr * lr_ratio) * coeff) * p */
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, sc, l.p, &zero, constant(&T, s, c, lr_ratio), &zero);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, sc, sc, &zero, constant(&T, s, c, coeff), &zero);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t1, sc, &zero, pin, &one);
        ew(op, s, ANYCHIP_OP_SUB, dt, 1, &n, po.p, pin, &one, t1, &one);
        pin = po.p;
    }
    void *kb1 = constant(&T, s, c, b1), *kb2 = constant(&T, s, c, b2);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t1, kb1, &zero, a1.p, &one);                       /* m1 */
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t2, constant(&T, s, c, 1.0 - b1), &zero, g.p, &one);
    ew(op, s, ANYCHIP_OP_ADD, dt, 1, &n, o1.p, t1, &one, t2, &one);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t1, kb2, &zero, a2.p, &one);                       /* m2 */
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t2, constant(&T, s, c, 1.0 - b2), &zero, g.p, &one);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t2, t2, &one, g.p, &one);
    ew(op, s, ANYCHIP_OP_ADD, dt, 1, &n, o2.p, t1, &one, t2, &one);
    void *k1 = constant(&T, s, c, 1.0);                                             /* the scalars */
    ew(op, s, ANYCHIP_OP_SUB, dt, 1, &unit, sq, k1, &zero, q2.p, &zero);
    un(op, s, ANYCHIP_OP_SQRT, dt, dt, 1, sq, sq);                                          /* sqrt(1 - b2^t) */
    ew(op, s, ANYCHIP_OP_SUB, dt, 1, &unit, sd, k1, &zero, q1.p, &zero);                    /* 1 - b1^t */
    ew(op, s, ANYCHIP_OP_DIV, dt, 1, &unit, sd, sq, &zero, sd, &zero);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, slr, l.p, &zero, sd, &zero);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, seps, constant(&T, s, c, e), &zero, sq, &zero);
    un(op, s, ANYCHIP_OP_SQRT, dt, dt, n, t1, o2.p);                                        /* the update */
    ew(op, s, ANYCHIP_OP_ADD, dt, 1, &n, t1, t1, &one, seps, &zero);
    ew(op, s, ANYCHIP_OP_DIV, dt, 1, &n, t1, o1.p, &one, t1, &one);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t1, slr, &zero, t1, &one);
    ew(op, s, ANYCHIP_OP_SUB, dt, 1, &n, po.p, pin, &one, t1, &one);
    if (!use_global_beta_pow) {
        tview r1, r2;
        output(op, ctx, b1p_out, c, &r1);
        output(op, ctx, b2p_out, c, &r2);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, r1.p, q1.p, &zero, kb1, &zero);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, r2.p, q2.p, &zero, kb2, &zero);
    }
    temps_free(&T);
}

/* SGD's update, as Paddle's CPU kernel: param_out = param - lr * grad (in place) */
static void sgd(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *lr, PD_Tensor *grad, PD_Tensor *master,
                bool multi_precision, PD_Tensor *param_out)
{
    const char *op = "sgd";
    if (multi_precision && master)
        fail(op, "multi_precision with master weights is not implemented on this device");
    tview p, l, g, po;
    input(op, param, &p);
    input(op, lr, &l);
    input(op, grad, &g);
    if (g.n != p.n || l.n != 1)
        fail(op, "param and grad of %lld and %lld elements, learning rate of %lld (want equal sizes, and one "
             "element)", (long long)p.n, (long long)g.n, (long long)l.n);
    if (g.cdt != p.cdt || l.cdt != p.cdt)
        fail(op, "param, learning rate and grad of different data types (this device's SGD takes one)");
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, param_out, p.cdt, &po);
    temps T = {ctx, op, {0}, 0};
    int64_t n = p.n, one = 1, zero = 0;
    void *t = temp(&T, 1, &n, p.cdt);
    ew(op, s, ANYCHIP_OP_MUL, p.dt, 1, &n, t, l.p, &zero, g.p, &one);
    ew(op, s, ANYCHIP_OP_SUB, p.dt, 1, &n, po.p, p.p, &one, t, &one);
    temps_free(&T);
}

static void k_sgd(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *lr, PD_Tensor *grad, PD_Tensor *master,
                  bool multi_precision, PD_Tensor *param_out, PD_Tensor *master_out)
{
    (void)master_out;
    sgd(ctx, param, lr, grad, PD.PD_OptionalTensorGetPointer(master), multi_precision, param_out);
}

static void k_adamw(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *grad, PD_Tensor *lr, PD_Tensor *m1,
                    PD_Tensor *m2, PD_Tensor *m2max, PD_Tensor *b1p, PD_Tensor *b2p, PD_Tensor *master,
                    PD_Tensor *skip, PD_Scalar *beta1, PD_Scalar *beta2, PD_Scalar *eps, float lr_ratio, float coeff,
                    bool with_decay, bool lazy_mode, int64_t min_row, bool multi_precision, bool use_global_beta_pow,
                    bool amsgrad, PD_Tensor *param_out, PD_Tensor *m1_out, PD_Tensor *m2_out, PD_Tensor *m2max_out,
                    PD_Tensor *b1p_out, PD_Tensor *b2p_out, PD_Tensor *master_out)
{
    (void)lazy_mode;                      /* dense gradients: lazy mode changes nothing */
    (void)min_row;
    (void)m2max_out;
    (void)master_out;
    /* the optional inputs arrive as paddle::optional objects: their tensor, or NULL */
    adamw(ctx, param, grad, lr, m1, m2, PD.PD_OptionalTensorGetPointer(m2max), b1p, b2p,
          PD.PD_OptionalTensorGetPointer(master), PD.PD_OptionalTensorGetPointer(skip),
          PD.PD_ScalarGetFloat64Data(beta1), PD.PD_ScalarGetFloat64Data(beta2), PD.PD_ScalarGetFloat64Data(eps),
          lr_ratio, coeff, with_decay, multi_precision, use_global_beta_pow, amsgrad, param_out, m1_out, m2_out,
          b1p_out, b2p_out);
}

/* ---- the executors' entries (PD_KernelContext) ----------------------------------------------------- */

/* an IntArray attribute's values: an IntArray, or a 1-d int32 / int64 tensor in the executor */
static axes_v ctx_axes(const char *op, PD_KernelContext *c, size_t index)
{
    int is_tensor = 0;
    const void *p = anychip_paddle_attr((void *)PD.PD_KernelContextIntArrayAttrAt, g_tensor_ref_at, c, index,
                                        &is_tensor);
    if (!is_tensor)
        return axes_of(op, (PD_IntArray *)p);
    axes_v a = {0, {0}};
    unsigned char b[sizeof a.v];
    int64_t n = 0;
    C_DataType dt = attr_tensor(op, index, p, b, sizeof b, &n);
    if (dt != INT32 && dt != INT64)
        fail(op, "attribute %zu is a tensor of data type %d; an int array's is int32 or int64", index, (int)dt);
    a.n = (size_t)n;
    for (size_t i = 0; i < a.n; i++) {
        int32_t v32;
        if (dt == INT64)
            memcpy(&a.v[i], b + 8 * i, 8);
        else {
            memcpy(&v32, b + 4 * i, 4);
            a.v[i] = v32;
        }
    }
    return a;
}

#define IN(i) PD.PD_KernelContextInputAt(c, i)
#define OUT(i) PD.PD_KernelContextOutputAt(c, i)
#define CTX PD.PD_KernelContextGetDeviceContext(c)
#define BOOLA(i) PD.PD_KernelContextBoolAttrAt(c, i)
#define INTA(i) PD.PD_KernelContextInt32AttrAt(c, i)
#define ARR(op, i) ctx_axes(op, c, i)
#define SCAL(op, i) ctx_scalar(op, c, i)
#define DTYPE(i) PD.PD_KernelContextDataTypeAttrAt(c, i)

static void c_add(PD_KernelContext *c) { k_add(CTX, IN(0), IN(1), OUT(0)); }
static void c_sub(PD_KernelContext *c) { k_sub(CTX, IN(0), IN(1), OUT(0)); }
static void c_mul(PD_KernelContext *c) { k_mul(CTX, IN(0), IN(1), OUT(0)); }
static void c_div(PD_KernelContext *c) { k_div(CTX, IN(0), IN(1), OUT(0)); }
static void c_max(PD_KernelContext *c) { k_max(CTX, IN(0), IN(1), OUT(0)); }
static void c_min(PD_KernelContext *c) { k_min(CTX, IN(0), IN(1), OUT(0)); }
static void c_add_grad(PD_KernelContext *c) { k_add_grad(CTX, IN(0), IN(1), IN(2), INTA(0), OUT(0), OUT(1)); }
static void c_sub_grad(PD_KernelContext *c) { k_sub_grad(CTX, IN(0), IN(1), IN(2), INTA(0), OUT(0), OUT(1)); }
static void c_mul_grad(PD_KernelContext *c) { k_mul_grad(CTX, IN(0), IN(1), IN(2), INTA(0), OUT(0), OUT(1)); }
static void c_div_grad(PD_KernelContext *c) { k_div_grad(CTX, IN(0), IN(1), IN(2), IN(3), INTA(0), OUT(0), OUT(1)); }
static void c_relu(PD_KernelContext *c) { k_relu(CTX, IN(0), OUT(0)); }
static void c_exp(PD_KernelContext *c) { k_exp(CTX, IN(0), OUT(0)); }
static void c_log(PD_KernelContext *c) { k_log(CTX, IN(0), OUT(0)); }
static void c_square(PD_KernelContext *c) { k_square(CTX, IN(0), OUT(0)); }
static void c_relu_grad(PD_KernelContext *c) { k_relu_grad(CTX, IN(0), IN(1), OUT(0)); }
static void c_exp_grad(PD_KernelContext *c) { k_exp_grad(CTX, IN(0), IN(1), OUT(0)); }
static void c_log_grad(PD_KernelContext *c) { k_log_grad(CTX, IN(0), IN(1), OUT(0)); }
static void c_square_grad(PD_KernelContext *c) { k_square_grad(CTX, IN(0), IN(1), OUT(0)); }
static void c_cast(PD_KernelContext *c) { cast_to(CTX, IN(0), DTYPE(0), OUT(0)); }
static void c_scale(PD_KernelContext *c)
{
    scale_op(CTX, IN(0), SCAL("scale", 0).f, SCAL("scale", 1).f, BOOLA(2), OUT(0));
}
static void c_full(PD_KernelContext *c) { fill_value("full", CTX, SCAL("full", 1), DTYPE(2), OUT(0)); }
static void c_full_like(PD_KernelContext *c)
{
    C_DataType t = DTYPE(1);
    C_Status st = C_SUCCESS;
    fill_value("full_like", CTX, SCAL("full_like", 0), t == UNDEFINED ? PD.PD_TensorGetPDDataType(IN(0), &st) : t,
               OUT(0));
}
static void c_sum(PD_KernelContext *c)
{
    axes_v a = ARR("sum", 0);
    reduce_op("sum", ANYCHIP_REDUCE_SUM, CTX, IN(0), &a, DTYPE(1), OUT(0));
}
static void c_mean(PD_KernelContext *c)
{
    axes_v a = ARR("mean", 0);
    reduce_op("mean", ANYCHIP_REDUCE_MEAN, CTX, IN(0), &a, UNDEFINED, OUT(0));
}
static void c_mean_all(PD_KernelContext *c) { k_mean_all(CTX, IN(0), OUT(0)); }
static void c_sum_grad(PD_KernelContext *c)
{
    axes_v a = ARR("sum_grad", 0);
    reduce_grad("sum_grad", 0, CTX, IN(0), IN(1), &a, BOOLA(2), OUT(0));
}
static void c_mean_grad(PD_KernelContext *c)
{
    axes_v a = ARR("mean_grad", 0);
    reduce_grad("mean_grad", 1, CTX, IN(0), IN(1), &a, BOOLA(2), OUT(0));
}
static void c_mean_all_grad(PD_KernelContext *c) { k_mean_all_grad(CTX, IN(0), IN(1), OUT(0)); }
static void c_softmax(PD_KernelContext *c) { k_softmax(CTX, IN(0), INTA(0), OUT(0)); }
static void c_softmax_grad(PD_KernelContext *c) { k_softmax_grad(CTX, IN(0), IN(1), INTA(0), OUT(0)); }
static void c_matmul(PD_KernelContext *c) { k_matmul(CTX, IN(0), IN(1), BOOLA(0), BOOLA(1), OUT(0)); }
static void c_adamw(PD_KernelContext *c)
{
    adamw(CTX, IN(0), IN(1), IN(2), IN(3), IN(4), IN(5), IN(6), IN(7), IN(8), IN(9),
          SCAL("adamw", 0).f, SCAL("adamw", 1).f, SCAL("adamw", 2).f,
          PD.PD_KernelContextFloatAttrAt(c, 3), PD.PD_KernelContextFloatAttrAt(c, 4), BOOLA(5), BOOLA(8), BOOLA(9),
          BOOLA(10), OUT(0), OUT(1), OUT(2), OUT(4), OUT(5));
}
static void c_sgd(PD_KernelContext *c) { sgd(CTX, IN(0), IN(1), IN(2), IN(3), BOOLA(0), OUT(0)); }
static void c_matmul_grad(PD_KernelContext *c)
{
    k_matmul_grad(CTX, IN(0), IN(1), IN(2), BOOLA(0), BOOLA(1), OUT(0), OUT(1));
}

/* ---- registration --------------------------------------------------------------------------------- */

#define T_ PD_ARG_TYPE_TENSOR
#define B_ PD_ARG_TYPE_BOOL
#define I_ PD_ARG_TYPE_INT32
#define A_ PD_ARG_TYPE_INT_ARRAY
#define S_ PD_ARG_TYPE_SCALAR
#define D_ PD_ARG_TYPE_DATA_TYPE

enum { FLOATS = 1, INTS = 2, ALL = FLOATS | INTS, ADAMW_TYPES = 4 };

/* the primitives a kernel uses, each with the kernel's dtype; BOOL_MASK: also a unary cast from
 * bool (a comparison's result); WIDEN: an integer sum, which Paddle accumulates into int64 */
enum { BIN = 1, UN = 2, RED = 4, GEMM = 8, FIL = 16, BOOL_MASK = 32, WIDEN = 64 };

typedef struct {
    const char *name;
    int types;                            /* FLOATS, INTS */
    int uses;                             /* BIN, UN, RED, GEMM, FIL, BOOL_MASK, WIDEN */
    int nin, nattr, nout;
    PD_KernelArgumentType attr[12];
    void (*fn)(PD_KernelContext *);
    void *variadic;
    int out_any_dtype;                    /* the output's dtype is an attribute's, not the key's */
    const PD_KernelArgumentType *in;      /* the inputs' types; NULL: all tensors */
} kernel_def;

#define O_ PD_ARG_TYPE_OPTIONAL_TENSOR
#define F32_ PD_ARG_TYPE_FLOAT32
#define I64_ PD_ARG_TYPE_INT64
static const PD_KernelArgumentType ADAMW_IN[] = {T_, T_, T_, T_, T_, O_, T_, T_, O_, O_};
static const PD_KernelArgumentType SGD_IN[] = {T_, T_, T_, O_};

/* reductions over several axes or none (sums, means, the gradients that unbroadcast) */
#define REDUCING (RED | UN | FIL)

#define V(f) ((void *)(f))
static const kernel_def KERNELS[] = {
    {"add", ALL, BIN, 2, 0, 1, {0}, c_add, V(k_add), 0, NULL},
    {"subtract", ALL, BIN, 2, 0, 1, {0}, c_sub, V(k_sub), 0, NULL},
    {"multiply", ALL, BIN, 2, 0, 1, {0}, c_mul, V(k_mul), 0, NULL},
    {"divide", FLOATS, BIN, 2, 0, 1, {0}, c_div, V(k_div), 0, NULL},
    {"maximum", ALL, BIN, 2, 0, 1, {0}, c_max, V(k_max), 0, NULL},
    {"minimum", ALL, BIN, 2, 0, 1, {0}, c_min, V(k_min), 0, NULL},
    {"add_grad", ALL, REDUCING, 3, 1, 2, {I_}, c_add_grad, V(k_add_grad), 0, NULL},
    {"subtract_grad", ALL, REDUCING, 3, 1, 2, {I_}, c_sub_grad, V(k_sub_grad), 0, NULL},
    {"multiply_grad", ALL, BIN | REDUCING, 3, 1, 2, {I_}, c_mul_grad, V(k_mul_grad), 0, NULL},
    {"divide_grad", FLOATS, BIN | REDUCING, 4, 1, 2, {I_}, c_div_grad, V(k_div_grad), 0, NULL},
    {"relu", FLOATS, UN, 1, 0, 1, {0}, c_relu, V(k_relu), 0, NULL},
    {"exp", FLOATS, UN, 1, 0, 1, {0}, c_exp, V(k_exp), 0, NULL},
    {"log", FLOATS, UN, 1, 0, 1, {0}, c_log, V(k_log), 0, NULL},
    {"square", ALL, BIN, 1, 0, 1, {0}, c_square, V(k_square), 0, NULL},
    {"relu_grad", FLOATS, BIN | UN | FIL | BOOL_MASK, 2, 0, 1, {0}, c_relu_grad, V(k_relu_grad), 0, NULL},
    {"exp_grad", FLOATS, BIN, 2, 0, 1, {0}, c_exp_grad, V(k_exp_grad), 0, NULL},
    {"log_grad", FLOATS, BIN, 2, 0, 1, {0}, c_log_grad, V(k_log_grad), 0, NULL},
    {"square_grad", ALL, BIN, 2, 0, 1, {0}, c_square_grad, V(k_square_grad), 0, NULL},
    {"cast", ALL, UN, 1, 1, 1, {D_}, c_cast, V(k_cast), 1, NULL},
    {"scale", ALL, BIN | FIL, 1, 3, 1, {S_, S_, B_}, c_scale, V(k_scale), 0, NULL},
    {"full", ALL, FIL, 0, 3, 1, {A_, S_, D_}, c_full, V(k_full), 0, NULL},
    {"full_like", ALL, FIL, 1, 2, 1, {S_, D_}, c_full_like, V(k_full_like), 0, NULL},
    {"sum", ALL, REDUCING | WIDEN, 1, 3, 1, {A_, D_, B_}, c_sum, V(k_sum), 1, NULL},
    {"mean", FLOATS, BIN | REDUCING, 1, 2, 1, {A_, B_}, c_mean, V(k_mean), 0, NULL},
    {"mean_all", FLOATS, BIN | REDUCING, 1, 0, 1, {0}, c_mean_all, V(k_mean_all), 0, NULL},
    {"sum_grad", ALL, BIN | FIL, 2, 3, 1, {A_, B_, B_}, c_sum_grad, V(k_sum_grad), 0, NULL},
    {"mean_grad", FLOATS, BIN | FIL, 2, 3, 1, {A_, B_, B_}, c_mean_grad, V(k_mean_grad), 0, NULL},
    {"mean_all_grad", FLOATS, BIN | FIL, 2, 0, 1, {0}, c_mean_all_grad, V(k_mean_all_grad), 0, NULL},
    {"softmax", FLOATS, BIN | UN | RED, 1, 1, 1, {I_}, c_softmax, V(k_softmax), 0, NULL},
    {"softmax_grad", FLOATS, BIN | RED, 2, 1, 1, {I_}, c_softmax_grad, V(k_softmax_grad), 0, NULL},
    {"matmul", FLOATS, GEMM | FIL, 2, 2, 1, {B_, B_}, c_matmul, V(k_matmul), 0, NULL},
    {"matmul_grad", FLOATS, GEMM | REDUCING, 3, 2, 2, {B_, B_}, c_matmul_grad, V(k_matmul_grad), 0, NULL},
    {"adamw", ADAMW_TYPES, BIN | UN | FIL, 10, 11, 7, {S_, S_, S_, F32_, F32_, B_, B_, I64_, B_, B_, B_}, c_adamw,
     V(k_adamw), 0, ADAMW_IN},
    {"sgd", ADAMW_TYPES, BIN, 4, 1, 2, {B_}, c_sgd, V(k_sgd), 0, SGD_IN},
};
#define NKERNELS (sizeof KERNELS / sizeof *KERNELS)

/* each family's dtypes, in registration order */
static const C_DataType FLOAT_TYPES[] = {FLOAT32, FLOAT64, FLOAT16, BFLOAT16};
static const C_DataType INT_TYPES[] = {INT32, INT64};
static const C_DataType ADAMW_DTYPES[] = {FLOAT32, FLOAT64};
static const struct {
    int family;
    const C_DataType *types;
    size_t n;
} FAMILIES[] = {{FLOATS, FLOAT_TYPES, 4}, {INTS, INT_TYPES, 2}, {ADAMW_TYPES, ADAMW_DTYPES, 2}};

static const char *const PHI_NAMES[] = {[FLOAT32] = "float32", [FLOAT64] = "float64", [FLOAT16] = "float16",
                                        [BFLOAT16] = "bfloat16", [INT32] = "int32", [INT64] = "int64"};

/* whether every primitive kernel `d` uses takes dtype `t` */
static int allowed(const kernel_def *d, C_DataType t)
{
    uint32_t bit = 1u << to_dtype(t), i64 = 1u << ANYCHIP_INT64;
    if (((d->uses & BIN) && !(MASK(binary) & bit)) || ((d->uses & UN) && !(MASK(unary) & bit)) ||
        ((d->uses & RED) && !(MASK(reduce) & bit)) || ((d->uses & GEMM) && !(MASK(gemm) & bit)) ||
        ((d->uses & FIL) && !(MASK(fill) & bit)))
        return 0;
    if ((d->uses & BOOL_MASK) && !(MASK(unary) & (1u << ANYCHIP_BOOL)))
        return 0;
    if ((d->uses & WIDEN) && t == INT32 && !(MASK(reduce) & MASK(unary) & MASK(fill) & i64))
        return 0;
    return 1;
}

/* Why the plugin's table gives no kernels ("" when it is usable); K is set when it is. plugin.h's
 * anychip_plugin_kernels decides (as anychip's own loader reads the table); this says why not. */
static const char *table_problem(void)
{
    static char why[256];
    if (!target_ready())
        return "the bridge loaded no plugin: ANYCHIP_PADDLE=none for the simulated chips' bridge, else see what "
               "it printed";
    K = anychip_plugin_kernels(&P);          /* the header's rule decides; the rest says why not */
    if (K)
        return "";
    if (P.minor < 1)
        snprintf(why, sizeof why, "the plugin is built against anychip/plugin.h %u.%u, which has no kernel table "
                 "(minor 1 adds it)", P.major, P.minor);
    else if (!P.kernels)
        snprintf(why, sizeof why, "the plugin fills no kernel table, plugin.h's `kernels`");
    else if (P.kernels->version != ANYCHIP_KERNELS_VERSION)
        snprintf(why, sizeof why, "the plugin's kernel table is version %u, which this bridge (kernel table "
                 "version %d) does not know", P.kernels->version, ANYCHIP_KERNELS_VERSION);
    else {                                /* dtypes of a newer header: the table is not this file's */
        const anychip_kernels *k = P.kernels;
        uint32_t all = k->binary_dtypes | k->unary_dtypes | k->reduce_dtypes | k->gemm_dtypes | k->fill_dtypes;
        snprintf(why, sizeof why, "the plugin's kernel table sets dtype mask bits %#x beyond bool, which "
                 "anychip/plugin.h %d.%d does not define", all & ~((1u << (ANYCHIP_BOOL + 1)) - 1),
                 ANYCHIP_PLUGIN_API_MAJOR, ANYCHIP_PLUGIN_API_MINOR);
    }
    return why;
}

/* outputs whose dtype an attribute sets accept any dtype (Paddle's cast / sum kernels do this) */
static void any_output_dtype(const PD_KernelKey *key, PD_Kernel *kernel)
{
    (void)key;
    C_Status st = C_SUCCESS;
    PD_KernelArgsDef *def = PD.PD_KernelGetArgsDef(kernel, &st);
    PD_List outs = PD.PD_KernelArgsDefGetOutputArgDefs(def, &st);
    for (size_t i = 0; i < outs.size; i++)
        PD.PD_TensorArgDefSetDataType(((PD_TensorArgDef **)outs.data)[i], UNDEFINED, &st);
    PD.PD_DeletePointerList(outs);
}

static void no_arg_changes(const PD_KernelKey *key, PD_Kernel *kernel)
{
    (void)key;
    (void)kernel;
}

/* the names of the registered kernels, for `anychip info` and the tests */
static char g_kernel_names[1024];

EXPORT const char *anychip_paddle_kernels(void) { return g_kernel_names; }

/* How many times each kernel ran (its name's entry in KERNELS), for tests and tools that check
 * where a program's ops ran: anychip_paddle_kernel_calls("matmul"); ~0 for a name not in the table. */
static atomic_ullong g_calls[NKERNELS];

static void count_call(const char *op)
{
    for (size_t k = 0; k < NKERNELS; k++)
        if (strcmp(KERNELS[k].name, op) == 0) {
            atomic_fetch_add(&g_calls[k], 1);
            return;
        }
}

EXPORT unsigned long long anychip_paddle_kernel_calls(const char *name)
{
    for (size_t k = 0; k < NKERNELS; k++)
        if (strcmp(KERNELS[k].name, name) == 0)
            return atomic_load(&g_calls[k]);
    return ~0ull;
}

/* The kernels this bridge registers for the plugin's table, as text, without registering anything
 * (`anychip info` reads it from the library, Paddle or not; it loads the plugin): a line per op,
 * "name<TAB>dtype,dtype,...", in registration order; empty when the table gives none. */
static char g_kernel_table[4096];

EXPORT const char *anychip_paddle_kernel_table(void)
{
    size_t used = 0;
    g_kernel_table[0] = 0;
    if (table_problem()[0])
        return g_kernel_table;
    for (size_t k = 0; k < NKERNELS; k++) {
        const kernel_def *d = &KERNELS[k];
        char types[128] = "";
        size_t tu = 0;
        for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++)
            for (size_t i = 0; (d->types & FAMILIES[f].family) && i < FAMILIES[f].n; i++)
                if (allowed(d, FAMILIES[f].types[i]))
                    tu += (size_t)snprintf(types + tu, sizeof types - tu, "%s%s", tu ? "," : "",
                                           PHI_NAMES[FAMILIES[f].types[i]]);
        if (tu && used < sizeof g_kernel_table)
            used += (size_t)snprintf(g_kernel_table + used, sizeof g_kernel_table - used, "%s\t%s\n", d->name, types);
    }
    return g_kernel_table;
}

/* why the bridge registers no kernels, "" when it registers some (`anychip info`) */
EXPORT const char *anychip_paddle_kernel_note(void)
{
    const char *why = table_problem();
    if (why[0])
        return why;
    return anychip_paddle_kernel_table()[0] ? "" : "the plugin's kernel table's dtype masks allow none of the kernels";
}

/* ANYCHIP_PADDLE_KERNELS=0 registers none (every op then takes Paddle's CPU fallback) */
static void register_kernels(void)
{
    const char *off = getenv("ANYCHIP_PADDLE_KERNELS");      /* "0", blanks around it ignored */
    if (off) {
        off += strspn(off, " \t");
        if (off[0] == '0' && off[strspn(off + 1, " \t") + 1] == '\0')
            return;
    }
    if (table_problem()[0])
        return;                           /* no usable kernel table: every op takes the fallback */
    void *phi = dlopen("libphi_core.so", RTLD_NOW | RTLD_NOLOAD);
    if (!phi)
        return;                           /* not inside Paddle (a tool probing the bridge) */
#define LOOKUP(ret, name, args) *(void **)&PD.name = dlsym(phi, #name);
    ANYCHIP_PHI_FUNCTIONS(LOOKUP)
#undef LOOKUP
#define CHECK(ret, name, args)                                                                 \
    if (!PD.name) {                                                                            \
        say("Paddle's libphi_core.so lacks %s: the device's kernels are not registered (every " \
            "op runs through Paddle's CPU fallback)", #name);                                  \
        return;                                                                                \
    }
    ANYCHIP_PHI_FUNCTIONS(CHECK)
#undef CHECK
    g_tensor_ref_at = dlsym(phi, "_ZNK3phi13KernelContext6AttrAtINS_9TensorRefEEERKT_m");
    PD_KernelArgumentType tensors[12] = {T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_, T_};
    size_t used = 0;
    for (size_t k = 0; k < NKERNELS; k++) {
        const kernel_def *d = &KERNELS[k];
        PD_KernelArgumentType attrs[12], ins[12];
        memcpy(attrs, d->attr, sizeof attrs);
        memcpy(ins, d->in ? d->in : tensors, sizeof ins[0] * (size_t)d->nin);
        int any = 0;
        for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++)
            for (size_t i = 0; (d->types & FAMILIES[f].family) && i < FAMILIES[f].n; i++) {
                if (!allowed(d, FAMILIES[f].types[i]))
                    continue;
                PD.PD_RegisterPhiKernel(d->name, g_type, FAMILIES[f].types[i], ANYCHIP_PD_LAYOUT_ANY,
                                        (size_t)d->nin, ins, (size_t)d->nattr, attrs, (size_t)d->nout, tensors,
                                        d->out_any_dtype ? any_output_dtype : no_arg_changes, d->fn, d->variadic);
                any = 1;
            }
        if (any && used < sizeof g_kernel_names)
            used += (size_t)snprintf(g_kernel_names + used, sizeof g_kernel_names - used, "%s%s", used ? " " : "",
                                     d->name);
    }
}
