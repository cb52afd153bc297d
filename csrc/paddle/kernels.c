/*
 * The bridge's phi kernels: the ops a training step spends its time in, registered for the
 * bridge's device type through Paddle's kernel C API (phi_capi.h) and built from the five
 * primitives of the target plugin's kernel table (anychip/plugin.h minor 1, `kernels`:
 * strided binary ops with broadcasting, unary ops and casts, [outer, n, inner] reductions,
 * strided GEMM, fill), enqueued on the stream Paddle gives the op, over device memory: no
 * copy to the host. Linked into the bridge with ANYCHIP_PADDLE_KERNELS; the kernels use its
 * plugin table (g_plugin), streams (stream_rec) and fence flags (bridge.h); a kernel that cannot
 * run raises a C++ exception (kernels_throw.cc, linked beside), so this is compiled to unwind
 * (-fexceptions). Built without a C++ compiler (ANYCHIP_PADDLE_VIEWS_ONLY, the reason), kernels_c.c
 * stands in for the C++ piece and only the strided views' copies are registered, through the host.
 *
 * A kernel is registered for a dtype only when every primitive it uses takes that dtype (the
 * table's masks) and the table's version is one this file knows; the other ops and dtypes
 * take Paddle's CPU fallback. A plugin without the table gets only the strided views' copies
 * (contiguous, strided_copy, fill: Paddle has no fallback for them), which then copy through the host.
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
 * bridge_before_gemm, when the library defines it, is called before the first GEMM of a matmul
 * (the simulated chips hand their GEMM NumPy's BLAS there: provider_sim.c).
 */
#include "bridge.h"

#include <math.h>

#include "phi_capi.h"

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
    if (enqueue_on(bridge_device, REC(s)) != C_SUCCESS)      /* the copy fence sees the kernel; the stream order */
        fail(op, "ordering its stream after the device's other streams failed");
    return REC(s)->s;
}

/* a primitive's failure: the plugin's status, its text and the detail of this thread's last failure */
static void kcheck(const char *op, const char *prim, anychip_status rc)
{
    if (rc == 0)
        return;
    const char *text = g_plugin.get_error_string ? g_plugin.get_error_string(rc) : NULL;
    const char *detail = g_plugin.get_last_error ? g_plugin.get_last_error() : NULL;
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

/* a primitive enqueued on s, checked; while Paddle's profiler runs, an event on its timeline
 * named "<primitive> <dtype> (<op>)" (profiler.c) */
#define KCALL(op, prim, s, dt, call)                                                                          \
    do {                                                                                                       \
        trace_mark m_;                                                                                         \
        trace_begin(bridge_device, (s), &m_);                                                                       \
        anychip_status rc_ = (call);                                                                           \
        trace_end(&m_, bridge_device, (s), rc_, TW_KERNEL, 0, "%s %s (%s)", (prim), DTYPE_NAMES[(dt)], (op));          \
        kcheck((op), (prim), rc_);                                                                             \
    } while (0)

/* ---- the five primitives (anychip/plugin.h, KERNELS) --------------------------------------------- */

/* out[dim] = a <e> b, a and b broadcast (strides as, bs) */
static void ew(const char *op, anychip_stream s, anychip_binary_op e, int dt, int nd, const int64_t *dim, void *out,
               const void *a, const int64_t *as, const void *b, const int64_t *bs)
{
    static const int64_t ONE[1] = {1};
    if (numel(nd, dim) == 0)
        return;
    takes(op, "binary", MASK(binary), dt);
    KCALL(op, "binary", s, dt, K->binary(bridge_device, s, e, (anychip_dtype)dt, nd, nd ? dim : ONE, out, a,
                                         nd ? as : ONE, b, nd ? bs : ONE));
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
    KCALL(op, "unary", s, out_dt, K->unary(bridge_device, s, u, (anychip_dtype)out_dt, (anychip_dtype)in_dt, 1, &n,
                                           out, x, &one));
}

static void kreduce(const char *op, anychip_stream s, anychip_reduce_op r, int out_dt, int in_dt, int64_t outer,
                    int64_t n, int64_t inner, void *out, const void *x)
{
    takes(op, "reduce", MASK(reduce), out_dt);
    takes(op, "reduce", MASK(reduce), in_dt);
    KCALL(op, "reduce", s, in_dt, K->reduce(bridge_device, s, r, (anychip_dtype)out_dt, (anychip_dtype)in_dt, outer,
                                            n, inner, out, x));
}

static void fill(const char *op, anychip_stream s, int dt, int64_t n, void *out, double f, int64_t i, int from_float)
{
    if (n == 0)
        return;
    takes(op, "fill", MASK(fill), dt);
    KCALL(op, "fill", s, dt, K->fill(bridge_device, s, (anychip_dtype)dt, n, out, f, i, from_float));
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

/* Paddle's inplace rules may hand an output an input's memory: in eager mode add_grad's and
 * subtract_grad's x_grad is out_grad's own buffer (backward.yaml: `inplace : (out_grad -> x_grad)`).
 * A kernel that still reads its inputs after writing an output writes it where `apart` says: a
 * temporary where it overlaps one of the inputs, which `settle` copies over once they are read. */
static int overlaps(const tview *a, const tview *b)
{
    if (!a->p || !b->p || !a->n || !b->n)
        return 0;
    const char *x = a->p, *y = b->p;
    return x < y + b->n * ITEMSZ[b->dt] && y < x + a->n * ITEMSZ[a->dt];
}

static void *apart(temps *T, const tview *o, const tview *in0, const tview *in1, const tview *in2)
{
    if (overlaps(o, in0) || (in1 && overlaps(o, in1)) || (in2 && overlaps(o, in2)))
        return temp(T, o->nd, o->dim, o->cdt);
    return o->p;
}

static void settle(temps *T, anychip_stream s, const tview *o, const void *p)
{
    if (p != o->p)
        un(T->op, s, ANYCHIP_OP_COPY, o->dt, o->dt, o->n, o->p, p);
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
    tview a, b, g, ox, oy;
    shape_of(op, x, &a);                  /* x and y: their shapes only (Paddle may pass no memory) */
    shape_of(op, y, &b);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    temps T = {ctx, op, {0}, 0};
    void *px = NULL, *py = NULL;
    if (dx) {
        output(op, ctx, dx, a.cdt, &ox);
        /* dx in dout's own memory (Paddle's inplace rule) with dout's shape: it holds dx already */
        if (!(ox.p == g.p && ox.n == g.n && ox.dt == g.dt)) {
            px = apart(&T, &ox, &g, NULL, NULL);
            unbroadcast(&T, s, &g, g.p, &a, axis, px);
        }
    }
    if (dy) {
        output(op, ctx, dy, b.cdt, &oy);
        py = apart(&T, &oy, &g, NULL, NULL);
        if (sign > 0)
            unbroadcast(&T, s, &g, g.p, &b, axis, py);
        else {
            void *neg = temp(&T, g.nd, g.dim, g.cdt);
            un(op, s, ANYCHIP_OP_NEG, g.dt, g.dt, g.n, neg, g.p);
            unbroadcast(&T, s, &g, neg, &b, axis, py);
        }
    }
    if (px)
        settle(&T, s, &ox, px);
    if (py)
        settle(&T, s, &oy, py);
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
    tview a, b, g, ox, oy;
    input(op, x, &a);
    input(op, y, &b);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    temps T = {ctx, op, {0}, 0};
    void *px = NULL, *py = NULL;
    if (dx) {
        output(op, ctx, dx, a.cdt, &ox);
        px = apart(&T, &ox, &a, &b, &g);
        grad_term(&T, s, ANYCHIP_OP_MUL, &g, &b, b.p, axis, &a, px);               /* dout * y */
    }
    if (dy) {
        output(op, ctx, dy, b.cdt, &oy);
        py = apart(&T, &oy, &a, &b, &g);
        grad_term(&T, s, ANYCHIP_OP_MUL, &g, &a, a.p, axis, &b, py);               /* dout * x */
    }
    if (px)
        settle(&T, s, &ox, px);
    if (py)
        settle(&T, s, &oy, py);
    temps_free(&T);
}

static void k_div_grad(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *y, PD_Tensor *out, PD_Tensor *dout, int axis,
                       PD_Tensor *dx, PD_Tensor *dy)
{
    const char *op = "divide_grad";
    tview a, b, q, g, ox, oy;
    input(op, x, &a);
    input(op, y, &b);
    input(op, out, &q);
    input(op, dout, &g);
    anychip_stream s = stream_of(op, ctx);
    temps T = {ctx, op, {0}, 0};
    void *px = NULL, *py = NULL;
    if (dx) {                                        /* x is not read: only y, out and dout */
        output(op, ctx, dx, a.cdt, &ox);
        px = apart(&T, &ox, &b, &q, &g);
        grad_term(&T, s, ANYCHIP_OP_DIV, &g, &b, b.p, axis, &a, px);               /* dout / y */
    }
    if (dy) {                                                             /* -(dout * out / y) */
        output(op, ctx, dy, b.cdt, &oy);
        py = apart(&T, &oy, &b, &q, &g);
        int64_t gs[MAXD], ys[MAXD];
        contiguous_strides(g.nd, g.dim, gs);
        broadcast_strides(op, &b, g.nd, g.dim, axis, ys);
        void *t = temp(&T, g.nd, g.dim, g.cdt);
        ew(op, s, ANYCHIP_OP_MUL, g.dt, g.nd, g.dim, t, g.p, gs, q.p, gs);
        ew(op, s, ANYCHIP_OP_DIV, g.dt, g.nd, g.dim, t, t, gs, b.p, ys);
        un(op, s, ANYCHIP_OP_NEG, g.dt, g.dt, g.n, t, t);
        unbroadcast(&T, s, &g, t, &b, axis, py);
    }
    if (px)
        settle(&T, s, &ox, px);
    if (py)
        settle(&T, s, &oy, py);
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
    if (sync_copy(bridge_device, src, a->p, n * (size_t)ITEMSZ[a->dt], ANYCHIP_COPY_D2H) != C_SUCCESS) {
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
    C_Status st = sync_copy(bridge_device, o->p, dst, n * (size_t)ITEMSZ[o->dt], ANYCHIP_COPY_H2D);
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
    if (n && (fence(bridge_device) != C_SUCCESS ||
              g_plugin.copy(bridge_device, b, p, (size_t)n * size, ANYCHIP_COPY_D2H) != 0))
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
/* a variadic entry's std::vector<int64_t>, std::vector<tensor *> and std::string arguments (kernels_throw.cc) */
const int64_t *anychip_paddle_i64s(const void *vec, size_t *n);
const int32_t *anychip_paddle_i32s(const void *vec, size_t *n);
void *const *anychip_paddle_ptrs(const void *vec, size_t *n);
const char *anychip_paddle_str(const void *str);
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
    KCALL(op, "gemm", s, dt, K->gemm(bridge_device, s, (anychip_dtype)dt, a.rows, a.cols, b.cols, out, a.p, a.s0, a.s1,
                                     b.p, b.s0, b.s1));
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

static void before_gemm(void)
{
    if (bridge_before_gemm)
        bridge_before_gemm();
}

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

/* the master (accumulation) dtype MT of dtype `t`: Paddle's MPTypeTrait */
static C_DataType master_of(C_DataType t) { return t == FLOAT16 || t == BFLOAT16 ? FLOAT32 : t; }

/* An optimizer step's weights in its compute type c: pt is param_out (the param's own type); po takes the
 * updated weights in c (the master output with multi_precision, param_out itself, or a temporary that
 * weights_done casts back into param_out); *gp and *pin are the grad and the weights read in c. */
static void weights_in(const char *op, PD_DeviceContext *ctx, temps *T, anychip_stream s, C_DataType c, int mp,
                       const tview *p, const tview *g, const tview *w, PD_Tensor *param_out, PD_Tensor *master_out,
                       tview *pt, tview *po, const void **gp, const void **pin)
{
    int dt = to_dtype(c);
    int64_t n = p->n;
    output(op, ctx, param_out, p->cdt, pt);
    if (mp)
        output(op, ctx, master_out, c, po);
    else {
        *po = *pt;
        if (p->cdt != c)
            po->p = temp(T, 1, &n, c);
    }
    *gp = g->p;
    *pin = w->p;
    if (g->cdt != c) {
        void *t = temp(T, 1, &n, c);
        un(op, s, ANYCHIP_OP_COPY, dt, g->dt, n, t, g->p);
        *gp = t;
    }
    if (w->cdt != c) {
        void *t = temp(T, 1, &n, c);
        un(op, s, ANYCHIP_OP_COPY, dt, w->dt, n, t, w->p);
        *pin = t;
    }
}

/* The weights of their own type (float16 / bfloat16) from the update in c; then the temporaries go. */
static void weights_done(const char *op, temps *T, anychip_stream s, C_DataType c, const tview *p, const tview *pt,
                         const tview *po)
{
    if (p->cdt != c)
        un(op, s, ANYCHIP_OP_COPY, p->dt, to_dtype(c), p->n, pt->p, po->p);
    temps_free(T);
}

/* ---- AdamW ---------------------------------------------------------------------------------------- */

/* Paddle's CPU AdamW, in its order: the decay p -= lr * lr_ratio * coeff * p, then Adam:
 *   m1 = b1 m1 + (1 - b1) g,  m2 = b2 m2 + (1 - b2) g g,
 *   p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m1 / (sqrt(m2) + eps sqrt(1 - b2^t)),
 *   b1^t *= b1, b2^t *= b2 (unless the beta powers are global).
 * The scalars stay on the device (one-element tensors broadcast), so the update is queued
 * like any kernel. Outputs alias their inputs (Paddle's adamw_ is in place). With float16 /
 * bfloat16 weights it computes in float32 (the moments' type), on the master weights with
 * multi_precision (AMP O2), as Paddle's GPU kernel does, and writes the weights rounded to theirs.
 * Adam is this without the decay. */
static void adamw(const char *op, PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *grad, PD_Tensor *lr, PD_Tensor *m1,
                  PD_Tensor *m2, PD_Tensor *m2max, PD_Tensor *b1p, PD_Tensor *b2p, PD_Tensor *master,
                  PD_Tensor *skip, double beta1, double beta2, double eps, float lr_ratio, float coeff,
                  bool with_decay, bool multi_precision, bool use_global_beta_pow, bool amsgrad, PD_Tensor *param_out,
                  PD_Tensor *m1_out, PD_Tensor *m2_out, PD_Tensor *b1p_out, PD_Tensor *b2p_out, PD_Tensor *master_out)
{
    (void)m2max;
    if (amsgrad)
        fail(op, "amsgrad=True is not implemented on this device (set FLAGS_enable_api_kernel_fallback and "
             "leave the kernel unregistered with ANYCHIP_PADDLE_KERNELS=0 to run it on Paddle's CPU)");
    tview p, g, l, a1, a2, q1, q2;
    input(op, param, &p);
    input(op, grad, &g);
    input(op, lr, &l);
    input(op, m1, &a1);
    input(op, m2, &a2);
    input(op, b1p, &q1);
    input(op, b2p, &q2);
    /* the update's type c is the moments' (float32 for float16 / bfloat16 weights: Paddle's MPDType); it
     * updates the master weights with multi_precision, else the weights (converted to c) */
    int mp = multi_precision && master;
    C_DataType c = a1.cdt;
    tview w = p;
    if (mp)
        input(op, master, &w);
    if (mp && !master_out)
        fail(op, "multi_precision with master weights but no master output");
    if (g.n != p.n || a1.n != p.n || a2.n != p.n || w.n != p.n || l.n != 1 || q1.n != 1 || q2.n != 1)
        fail(op, "param, grad and moments of %lld, %lld, %lld, %lld elements; learning rate and beta powers "
             "of %lld, %lld, %lld (want equal sizes, and one element each)", (long long)p.n, (long long)g.n,
             (long long)a1.n, (long long)a2.n, (long long)l.n, (long long)q1.n, (long long)q2.n);
    if (g.cdt != p.cdt || l.cdt != c || a2.cdt != c || q1.cdt != c || q2.cdt != c || w.cdt != (mp ? c : p.cdt) ||
        (c != p.cdt && c != master_of(p.cdt)))
        fail(op, "param and grad of data type %d, learning rate, moments and beta powers of %d, %d, %d, %d, %d, master "
             "weights of %d (want the moments' type, the weights' or its float32 for float16 / bfloat16, for all but "
             "param and grad)", (int)p.cdt, (int)l.cdt, (int)a1.cdt, (int)a2.cdt, (int)q1.cdt, (int)q2.cdt,
             (int)w.cdt);
    anychip_stream s = stream_of(op, ctx);
    if (skip) {
        tview k;
        input(op, skip, &k);
        unsigned char flag = 0;
        if (k.n && (sync_copy(bridge_device, &flag, k.p, 1, ANYCHIP_COPY_D2H) != C_SUCCESS))
            fail(op, "reading skip_update failed");
        if (flag)
            return;                       /* in place: the outputs are the inputs, unchanged */
    }
    temps T = {ctx, op, {0}, 0};
    int dt = to_dtype(c);
    int64_t n = p.n, one = 1, zero = 0, unit = 1;
    tview po, pt, o1, o2;                 /* po: the updated weights, of type c; pt: param_out */
    const void *gp, *pin;
    weights_in(op, ctx, &T, s, c, mp, &p, &g, &w, param_out, master_out, &pt, &po, &gp, &pin);
    output(op, ctx, m1_out, c, &o1);
    output(op, ctx, m2_out, c, &o2);
    double b1 = c == FLOAT32 ? (double)(float)beta1 : beta1, b2 = c == FLOAT32 ? (double)(float)beta2 : beta2;
    double e = c == FLOAT32 ? (double)(float)eps : eps;
    void *t1 = temp(&T, 1, &n, c), *t2 = temp(&T, 1, &n, c);
    void *sc = temp(&T, 0, NULL, c), *sq = temp(&T, 0, NULL, c), *sd = temp(&T, 0, NULL, c);
    void *slr = temp(&T, 0, NULL, c), *seps = temp(&T, 0, NULL, c);
    if (with_decay) {                     /* p -= ((lr * lr_ratio) * coeff) * p */
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, sc, l.p, &zero, constant(&T, s, c, lr_ratio), &zero);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &unit, sc, sc, &zero, constant(&T, s, c, coeff), &zero);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t1, sc, &zero, pin, &one);
        ew(op, s, ANYCHIP_OP_SUB, dt, 1, &n, po.p, pin, &one, t1, &one);
        pin = po.p;
    }
    void *kb1 = constant(&T, s, c, b1), *kb2 = constant(&T, s, c, b2);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t1, kb1, &zero, a1.p, &one);                       /* m1 */
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t2, constant(&T, s, c, 1.0 - b1), &zero, gp, &one);
    ew(op, s, ANYCHIP_OP_ADD, dt, 1, &n, o1.p, t1, &one, t2, &one);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t1, kb2, &zero, a2.p, &one);                       /* m2 */
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t2, constant(&T, s, c, 1.0 - b2), &zero, gp, &one);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t2, t2, &one, gp, &one);
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
    weights_done(op, &T, s, c, &p, &pt, &po);
}

/* SGD's update, as Paddle's CPU kernel: param_out = param - lr * grad (in place); with master
 * weights (multi_precision, AMP O2), as its GPU kernel: master_out = master - lr * MT(grad),
 * param_out = T(master_out) */
static void sgd(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *lr, PD_Tensor *grad, PD_Tensor *master,
                bool multi_precision, PD_Tensor *param_out, PD_Tensor *master_out)
{
    const char *op = "sgd";
    tview p, l, g, po;
    input(op, param, &p);
    input(op, lr, &l);
    input(op, grad, &g);
    if (multi_precision && master && master_out) {
        tview m, mo;
        input(op, master, &m);
        if (g.n != p.n || m.n != p.n || l.n != 1 || g.cdt != p.cdt || m.cdt != master_of(p.cdt))
            fail(op, "param, grad, master weights and learning rate of %lld, %lld, %lld, %lld elements, data types "
                 "%d, %d, %d, %d (want equal sizes, one element of the learning rate, the master type for it and the "
                 "master weights)", (long long)p.n, (long long)g.n, (long long)m.n, (long long)l.n, (int)p.cdt,
                 (int)g.cdt, (int)m.cdt, (int)l.cdt);
        anychip_stream s = stream_of(op, ctx);
        output(op, ctx, param_out, p.cdt, &po);
        output(op, ctx, master_out, m.cdt, &mo);
        temps T = {ctx, op, {0}, 0};
        int64_t n = p.n, one = 1, zero = 0;
        void *t = temp(&T, 1, &n, m.cdt);
        if (l.cdt != m.cdt) {             /* a learning rate of the param's type (O2's optimizer) */
            void *lm = temp(&T, 0, NULL, m.cdt);
            un(op, s, ANYCHIP_OP_COPY, m.dt, l.dt, 1, lm, l.p);
            l.p = lm;
        }
        un(op, s, ANYCHIP_OP_COPY, m.dt, g.dt, n, t, g.p);
        ew(op, s, ANYCHIP_OP_MUL, m.dt, 1, &n, t, l.p, &zero, t, &one);
        ew(op, s, ANYCHIP_OP_SUB, m.dt, 1, &n, mo.p, m.p, &one, t, &one);
        un(op, s, ANYCHIP_OP_COPY, p.dt, m.dt, n, po.p, mo.p);
        temps_free(&T);
        return;
    }
    if (multi_precision && master)
        fail(op, "multi_precision with master weights but no master output");
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
    sgd(ctx, param, lr, grad, PD.PD_OptionalTensorGetPointer(master), multi_precision, param_out, master_out);
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
    /* the optional inputs arrive as paddle::optional objects: their tensor, or NULL */
    adamw("adamw", ctx, param, grad, lr, m1, m2, PD.PD_OptionalTensorGetPointer(m2max), b1p, b2p,
          PD.PD_OptionalTensorGetPointer(master), PD.PD_OptionalTensorGetPointer(skip),
          PD.PD_ScalarGetFloat64Data(beta1), PD.PD_ScalarGetFloat64Data(beta2), PD.PD_ScalarGetFloat64Data(eps),
          lr_ratio, coeff, with_decay, multi_precision, use_global_beta_pow, amsgrad, param_out, m1_out, m2_out,
          b1p_out, b2p_out, master_out);
}

static void k_adam(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *grad, PD_Tensor *lr, PD_Tensor *m1,
                   PD_Tensor *m2, PD_Tensor *m2max, PD_Tensor *b1p, PD_Tensor *b2p, PD_Tensor *master,
                   PD_Tensor *skip, PD_Scalar *beta1, PD_Scalar *beta2, PD_Scalar *eps, bool lazy_mode,
                   int64_t min_row, bool multi_precision, bool use_global_beta_pow, bool amsgrad,
                   PD_Tensor *param_out, PD_Tensor *m1_out, PD_Tensor *m2_out, PD_Tensor *m2max_out,
                   PD_Tensor *b1p_out, PD_Tensor *b2p_out, PD_Tensor *master_out)
{
    (void)lazy_mode;                      /* dense gradients: lazy mode changes nothing */
    (void)min_row;
    (void)m2max_out;
    adamw("adam", ctx, param, grad, lr, m1, m2, PD.PD_OptionalTensorGetPointer(m2max), b1p, b2p,
          PD.PD_OptionalTensorGetPointer(master), PD.PD_OptionalTensorGetPointer(skip),
          PD.PD_ScalarGetFloat64Data(beta1), PD.PD_ScalarGetFloat64Data(beta2), PD.PD_ScalarGetFloat64Data(eps),
          1.0f, 0.0f, false, multi_precision, use_global_beta_pow, amsgrad, param_out, m1_out, m2_out, b1p_out,
          b2p_out, master_out);
}

/* ---- Momentum ------------------------------------------------------------------------------------- */

/* Paddle's Momentum (paddle/phi/kernels/impl/momentum_kernel_impl.h), in its CPU kernel's order:
 *   g' = p * coeff + g  (regularization_method "l2_decay"; any other: g' = g),
 *   v = v * mu + g',  p -= lr * v,  or with Nesterov p -= (g' + v * mu) * lr.
 * rescale_grad scales g first, as Paddle's GPU kernel does (its CPU kernel ignores it; Paddle's
 * optimizer passes 1). In place: the outputs alias param and velocity. With float16 / bfloat16
 * weights it computes in float32 (the velocity's type), on the master weights with
 * multi_precision (AMP O2), as the GPU kernel does, and writes the weights rounded to theirs. */
static void momentum(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *grad, PD_Tensor *velocity, PD_Tensor *lr,
                     PD_Tensor *master, float mu, bool nesterov, const char *method, float coeff,
                     bool multi_precision, float rescale, PD_Tensor *param_out, PD_Tensor *velocity_out,
                     PD_Tensor *master_out)
{
    const char *op = "momentum";
    tview p, g, v, l, w, po, pt, vo;
    input(op, param, &p);
    input(op, grad, &g);
    input(op, velocity, &v);
    input(op, lr, &l);
    /* the update's type c is the velocity's (float32 for float16 / bfloat16 weights: Paddle's MT); it
     * updates the master weights with multi_precision, else the weights (converted to c) */
    int mp = multi_precision && master;
    C_DataType c = v.cdt;
    w = p;
    if (mp)
        input(op, master, &w);
    if (mp && !master_out)
        fail(op, "multi_precision with master weights but no master output");
    if (g.n != p.n || v.n != p.n || w.n != p.n || l.n != 1)
        fail(op, "param, grad and velocity of %lld, %lld, %lld elements, learning rate of %lld (want equal "
             "sizes, and one element)", (long long)p.n, (long long)g.n, (long long)v.n, (long long)l.n);
    if (g.cdt != p.cdt || l.cdt != c || w.cdt != (mp ? c : p.cdt) || (c != p.cdt && c != master_of(p.cdt)))
        fail(op, "param and grad of data type %d, velocity of %d, learning rate of %d, master weights of %d (want "
             "the velocity's type, the weights' or its float32 for float16 / bfloat16, for all but param and grad)",
             (int)p.cdt, (int)v.cdt, (int)l.cdt, (int)w.cdt);
    anychip_stream s = stream_of(op, ctx);
    temps T = {ctx, op, {0}, 0};
    int dt = to_dtype(c);
    int64_t n = p.n, one = 1, zero = 0;
    const void *gp, *pin;
    weights_in(op, ctx, &T, s, c, mp, &p, &g, &w, param_out, master_out, &pt, &po, &gp, &pin);
    output(op, ctx, velocity_out, c, &vo);
    void *t = temp(&T, 1, &n, c);
    if (rescale != 1.0f) {
        void *r = temp(&T, 1, &n, c);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, r, gp, &one, constant(&T, s, c, rescale), &zero);
        gp = r;
    }
    if (method && strcmp(method, "l2_decay") == 0) {
        void *r = temp(&T, 1, &n, c);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, r, pin, &one, constant(&T, s, c, coeff), &zero);
        ew(op, s, ANYCHIP_OP_ADD, dt, 1, &n, r, r, &one, gp, &one);
        gp = r;
    }
    void *kmu = constant(&T, s, c, mu);
    ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t, v.p, &one, kmu, &zero);                          /* v * mu + g' */
    ew(op, s, ANYCHIP_OP_ADD, dt, 1, &n, vo.p, t, &one, gp, &one);
    if (nesterov) {                                                                          /* (g' + v mu) lr */
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t, vo.p, &one, kmu, &zero);
        ew(op, s, ANYCHIP_OP_ADD, dt, 1, &n, t, gp, &one, t, &one);
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t, t, &one, l.p, &zero);
    } else                                                                                   /* lr * v */
        ew(op, s, ANYCHIP_OP_MUL, dt, 1, &n, t, l.p, &zero, vo.p, &one);
    ew(op, s, ANYCHIP_OP_SUB, dt, 1, &n, po.p, pin, &one, t, &one);
    weights_done(op, &T, s, c, &p, &pt, &po);
}

static void k_momentum(PD_DeviceContext *ctx, PD_Tensor *param, PD_Tensor *grad, PD_Tensor *velocity, PD_Tensor *lr,
                       PD_Tensor *master, float mu, bool nesterov, const void *method, float coeff,
                       bool multi_precision, float rescale, PD_Tensor *param_out, PD_Tensor *velocity_out,
                       PD_Tensor *master_out)
{
    momentum(ctx, param, grad, velocity, lr, PD.PD_OptionalTensorGetPointer(master), mu, nesterov,
             anychip_paddle_str(method), coeff, multi_precision, rescale, param_out, velocity_out, master_out);
}

/* ---- AMP: check_finite_and_unscale, update_loss_scaling ---------------------------------------------- */

/* Paddle's loss scaling (paddle/phi/kernels/amp_kernel.h; the GPU kernels' semantics): the scale
 * and the loss-scaling state are of the "master" type MT (float32 for float16 / bfloat16 grads). */


/* outs[i] = T(MT(xs[i]) * (1 / scale)); found_infinite = whether any element of any xs[i] is inf or NaN */
static void check_finite_and_unscale(PD_DeviceContext *ctx, size_t n, PD_Tensor *const *xs, PD_Tensor *scale,
                                     size_t nout, PD_Tensor *const *outs, PD_Tensor *found)
{
    const char *op = "check_finite_and_unscale";
    if (nout != n)
        fail(op, "%zu inputs and %zu outputs", n, nout);
    tview sc, fo;
    input(op, scale, &sc);
    if (sc.n != 1)
        fail(op, "a scale of %lld elements (want one)", (long long)sc.n);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, found, BOOL, &fo);
    temps T = {ctx, op, {0}, 0};
    C_DataType mt = sc.cdt;
    int mdt = sc.dt;
    int64_t one = 1, zero = 0;
    void *inv = temp(&T, 0, NULL, mt), *acc = constant(&T, s, mt, 0.0), *part = temp(&T, 0, NULL, mt);
    void *k0 = constant(&T, s, mt, 0.0);
    ew(op, s, ANYCHIP_OP_DIV, mdt, 1, &one, inv, constant(&T, s, mt, 1.0), &zero, sc.p, &zero);
    for (size_t i = 0; i < n; i++) {
        tview x, o;
        input(op, xs[i], &x);
        if (master_of(x.cdt) != mt)
            fail(op, "a gradient of data type %d with a scale of data type %d", (int)x.cdt, (int)mt);
        output(op, ctx, outs[i], x.cdt, &o);
        if (!x.n)
            continue;
        temps X = {ctx, op, {0}, 0};
        const void *xm = x.p;
        if (x.cdt != mt) {
            void *w = temp(&X, 1, &x.n, mt);
            un(op, s, ANYCHIP_OP_COPY, mdt, x.dt, x.n, w, x.p);
            xm = w;
        }
        void *z = temp(&X, 1, &x.n, mt);                /* x * 0: NaN where x is inf or NaN, else 0 */
        ew(op, s, ANYCHIP_OP_MUL, mdt, 1, &x.n, z, xm, &one, k0, &zero);
        kreduce(op, s, ANYCHIP_REDUCE_SUM, mdt, mdt, 1, x.n, 1, part, z);
        ew(op, s, ANYCHIP_OP_ADD, mdt, 1, &one, acc, acc, &zero, part, &zero);
        if (x.cdt == mt)
            ew(op, s, ANYCHIP_OP_MUL, mdt, 1, &x.n, o.p, xm, &one, inv, &zero);
        else {
            ew(op, s, ANYCHIP_OP_MUL, mdt, 1, &x.n, z, xm, &one, inv, &zero);
            un(op, s, ANYCHIP_OP_COPY, x.dt, mdt, x.n, o.p, z);
        }
        temps_free(&X);
    }
    ew(op, s, ANYCHIP_OP_NE, mdt, 1, &one, fo.p, acc, &zero, acc, &zero);    /* NaN != NaN */
    temps_free(&T);
}

static void k_check_finite_and_unscale(PD_DeviceContext *ctx, const void *xs, PD_Tensor *scale, const void *outs,
                                       PD_Tensor *found)
{
    size_t n = 0, nout = 0;
    void *const *x = anychip_paddle_ptrs(xs, &n), *const *o = anychip_paddle_ptrs(outs, &nout);
    check_finite_and_unscale(ctx, n, (PD_Tensor *const *)x, scale, nout, (PD_Tensor *const *)o, found);
}

/* one element of a small tensor, read after the queued work (attr_tensor), as a double */
static double read_scalar(const char *op, const PD_Tensor *t)
{
    unsigned char b[8] = {0};
    int64_t n = 0;
    C_DataType dt = attr_tensor(op, 0, t, b, sizeof b, &n);
    if (n != 1)
        fail(op, "a state tensor of %lld elements (want one)", (long long)n);
    switch (dt) {
    case FLOAT64: { double x; memcpy(&x, b, 8); return x; }
    case FLOAT32: { float x; memcpy(&x, b, 4); return x; }
    case INT64: { int64_t x; memcpy(&x, b, 8); return (double)x; }
    case INT32: { int32_t x; memcpy(&x, b, 4); return x; }
    default: return b[0];                 /* bool */
    }
}

/* With an inf or NaN found, the gradients are zeroed; then (unless stop_update) the loss scale
 * and the good / bad step counters are updated, as Paddle's GPU kernel's Update does:
 * found: good = 0, bad += 1, and at decr_every_n_nan_or_inf bad steps scale = max(scale * decr_ratio, 1),
 * bad = 0; else bad = 0, good += 1, and at incr_every_n_steps good steps scale *= incr_ratio (kept
 * if that is not finite), good = 0. */
static void update_loss_scaling(PD_DeviceContext *ctx, size_t n, PD_Tensor *const *xs, PD_Tensor *found,
                                PD_Tensor *prev, PD_Tensor *good_in, PD_Tensor *bad_in, int incr_n, int decr_n,
                                float incr_ratio, float decr_ratio, bool stop_update, size_t nout,
                                PD_Tensor *const *outs, PD_Tensor *scale_out, PD_Tensor *good_out,
                                PD_Tensor *bad_out)
{
    const char *op = "update_loss_scaling";
    if (nout != n)
        fail(op, "%zu inputs and %zu outputs", n, nout);
    anychip_stream s = stream_of(op, ctx);
    int inf = read_scalar(op, found) != 0;
    for (size_t i = 0; i < n; i++) {
        tview x, o;
        input(op, xs[i], &x);
        output(op, ctx, outs[i], x.cdt, &o);
        if (inf)
            fill(op, s, o.dt, o.n, o.p, 0.0, 0, 1);
        else if (o.p != x.p)
            un(op, s, ANYCHIP_OP_COPY, o.dt, x.dt, x.n, o.p, x.p);
    }
    if (stop_update)
        return;
    tview sc, g, b;
    input(op, prev, &sc);
    double scale = read_scalar(op, prev);
    int good = (int)read_scalar(op, good_in), bad = (int)read_scalar(op, bad_in);
    if (inf) {
        good = 0;
        if (++bad == decr_n) {
            double next = sc.cdt == FLOAT32 ? (double)((float)scale * decr_ratio) : scale * decr_ratio;
            scale = next < 1 ? 1 : next;
            bad = 0;
        }
    } else {
        bad = 0;
        if (++good == incr_n) {
            double next = sc.cdt == FLOAT32 ? (double)((float)scale * incr_ratio) : scale * incr_ratio;
            scale = isfinite(next) ? next : scale;
            good = 0;
        }
    }
    output(op, ctx, scale_out, sc.cdt, &sc);
    output(op, ctx, good_out, INT32, &g);
    output(op, ctx, bad_out, INT32, &b);
    fill(op, s, sc.dt, 1, sc.p, scale, 0, 1);
    fill(op, s, g.dt, 1, g.p, 0.0, good, 0);
    fill(op, s, b.dt, 1, b.p, 0.0, bad, 0);
}

static void k_update_loss_scaling(PD_DeviceContext *ctx, const void *xs, PD_Tensor *found, PD_Tensor *prev,
                                  PD_Tensor *good_in, PD_Tensor *bad_in, int incr_n, int decr_n, float incr_ratio,
                                  float decr_ratio, PD_Scalar *stop_update, const void *outs, PD_Tensor *scale_out,
                                  PD_Tensor *good_out, PD_Tensor *bad_out)
{
    size_t n = 0, nout = 0;
    void *const *x = anychip_paddle_ptrs(xs, &n), *const *o = anychip_paddle_ptrs(outs, &nout);
    update_loss_scaling(ctx, n, (PD_Tensor *const *)x, found, prev, good_in, bad_in, incr_n, decr_n, incr_ratio,
                        decr_ratio, PD.PD_ScalarGetInt64Data(stop_update) != 0 ||
                        PD.PD_ScalarGetFloat64Data(stop_update) != 0, nout, (PD_Tensor *const *)o, scale_out,
                        good_out, bad_out);
}

/* ---- strided views: contiguous, strided_copy, fill ------------------------------------------------ */

/* Paddle 3.x's stride kernels make slices, transposes and the other views share their base's
 * memory (paddle/phi/kernels/stride/, registered for every custom device); what a view's
 * reader needs then comes from the device, with no CPU fallback (paddle/phi/kernels/funcs/
 * strided_utils.h, paddle/phi/api/lib/data_transform.cc: PD_VISIT_KERNEL refuses a fallback):
 * `contiguous` (a view made contiguous for a kernel that reads it), `strided_copy` (a result
 * written into a view: an in-place op on a view, the view ops' gradients) and `fill` (those
 * gradients' zeros). Each runs as the plugin's unary COPY, which reads strided input: one call
 * for `contiguous`, one per contiguous run of the destination for `strided_copy`; a dtype the
 * table does not take (or a plugin without a table) copies through the host, after the
 * stream's queued work (the copy fence). Every dtype Paddle's CPU registers them for is taken. */

/* a tensor as its memory sees it: dims, strides (elements), the first element's address */
typedef struct {
    char *p;
    int nd, item, dt;                     /* dt: its anychip_dtype, -1 for the others (int16, complex) */
    C_DataType cdt;
    int64_t dim[MAXD], st[MAXD], n;
} sview;

static int item_size(C_DataType t)
{
    switch (t) {
    case BOOL: case UINT8: case INT8: return 1;
    case UINT16: case INT16: case FLOAT16: case BFLOAT16: return 2;
    case UINT32: case INT32: case FLOAT32: return 4;
    case UINT64: case INT64: case FLOAT64: case COMPLEX64: return 8;
    case COMPLEX128: return 16;
    default: return 0;
    }
}

/* a view's geometry from Paddle's tensor (its strides, or contiguous ones when it has none) */
static void strided_of(const char *op, const PD_Tensor *t, sview *v)
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
    contiguous_strides(v->nd, v->dim, v->st);
    if (PD.PD_TensorGetNumStrides(t, &st) == nd)
        for (int d = 0; d < v->nd; d++)
            v->st[d] = PD.PD_TensorGetStride(t, (size_t)d, &st);
    v->cdt = PD.PD_TensorGetPDDataType(t, &st);
    v->item = item_size(v->cdt);
    v->dt = to_dtype(v->cdt);
    if (!v->item)
        fail(op, "data type %d, which the device's copies do not take", (int)v->cdt);
    v->p = v->n ? PD.PD_TensorGetDataPointer(t, &st) : NULL;
    if (v->n && !v->p)
        fail(op, "a tensor of %lld elements without memory", (long long)v->n);
}

/* the elements [lo, hi] a view touches, relative to its first element */
static void span_of(const sview *v, int64_t *lo, int64_t *hi)
{
    *lo = *hi = 0;
    for (int d = 0; d < v->nd; d++) {
        int64_t far = (v->dim[d] - 1) * v->st[d];
        *lo += far < 0 ? far : 0;
        *hi += far > 0 ? far : 0;
    }
}

/* the next index of an odometer over dims (the last fastest); the element offsets it moves */
static void step(int nd, const int64_t *dim, int64_t *idx, const int64_t *as, int64_t *ao, const int64_t *bs,
                 int64_t *bo)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < dim[d]) {
            *ao += as[d];
            *bo += bs[d];
            return;
        }
        idx[d] = 0;
        *ao -= (dim[d] - 1) * as[d];
        *bo -= (dim[d] - 1) * bs[d];
    }
}

/* dst = src (same dims, same dtype) through the host: both spans read after the stream's work,
 * the elements moved, the destination's span written back (the copy fence orders all three) */
static void host_copy(const char *op, const sview *dst, const sview *src)
{
    int64_t slo, shi, dlo, dhi;
    span_of(src, &slo, &shi);
    span_of(dst, &dlo, &dhi);
    size_t sbytes = (size_t)(shi - slo + 1) * (size_t)src->item, dbytes = (size_t)(dhi - dlo + 1) * (size_t)dst->item;
    char *sb = malloc(sbytes), *db = malloc(dbytes);
    int dense = dhi - dlo + 1 == dst->n;     /* the destination covers its span: nothing to keep */
    if (!sb || !db || sync_copy(bridge_device, sb, src->p + slo * src->item, sbytes, ANYCHIP_COPY_D2H) != C_SUCCESS ||
        (!dense && sync_copy(bridge_device, db, dst->p + dlo * dst->item, dbytes, ANYCHIP_COPY_D2H) != C_SUCCESS)) {
        free(sb);
        free(db);
        fail(op, "copying a view through the host failed (out of host memory, or the message above says why)");
    }
    int64_t idx[MAXD] = {0}, so = -slo, dof = -dlo;
    for (int64_t k = 0; k < src->n; k++) {
        memcpy(db + dof * dst->item, sb + so * src->item, (size_t)src->item);
        step(src->nd, src->dim, idx, src->st, &so, dst->st, &dof);
    }
    C_Status st = sync_copy(bridge_device, dst->p + dlo * dst->item, db, dbytes, ANYCHIP_COPY_H2D);
    free(sb);
    free(db);
    if (st != C_SUCCESS)
        fail(op, "copying a view back to the device failed (the message above says why)");
}

/* more runs than this copy through the host in one pass instead */
#define MAX_RUNS 4096

/* dst = src, element by element over the same dims: the destination's dims ordered by its
 * strides, its innermost contiguous block one unary COPY (src read with its strides) per run */
static void copy_view(const char *op, anychip_stream s, const sview *dst, const sview *src)
{
    if (!src->n)
        return;
    if (src->dt < 0 || !K || !(MASK(unary) & (1u << src->dt))) {
        host_copy(op, dst, src);
        return;
    }
    int nd = 0;
    int64_t dim[MAXD], os[MAXD], is[MAXD];
    for (int d = 0; d < src->nd; d++) {
        if (src->dim[d] == 1)
            continue;
        int k = nd++;                     /* insertion by the destination's stride, largest first */
        while (k > 0 && os[k - 1] < dst->st[d]) {
            dim[k] = dim[k - 1];
            os[k] = os[k - 1];
            is[k] = is[k - 1];
            k--;
        }
        dim[k] = src->dim[d];
        os[k] = dst->st[d];
        is[k] = src->st[d];
    }
    int inner = nd;                       /* dims inner..nd-1: contiguous in the destination */
    int64_t acc = 1, runs = 1;
    while (inner > 0 && os[inner - 1] == acc)
        acc *= dim[--inner];
    for (int d = 0; d < inner; d++)
        runs *= dim[d];
    if (runs > MAX_RUNS) {
        host_copy(op, dst, src);
        return;
    }
    static const int64_t ONE[1] = {1};
    int rnd = nd - inner;
    int64_t idx[MAXD] = {0}, oo = 0, io = 0;
    for (int64_t r = 0; r < runs; r++) {
        KCALL(op, "unary", s, src->dt,
              K->unary(bridge_device, s, ANYCHIP_OP_COPY, (anychip_dtype)src->dt, (anychip_dtype)src->dt, rnd ? rnd : 1,
                       rnd ? dim + inner : ONE, dst->p + oo * dst->item, src->p + io * src->item, rnd ? is + inner : ONE));
        step(inner, dim, idx, os, &oo, is, &io);
    }
}

static void k_contiguous(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *out)
{
    const char *op = "contiguous";
    sview a, o;
    strided_of(op, x, &a);
    anychip_stream s = stream_of(op, ctx);
    C_Status st = C_SUCCESS;
    o = a;
    contiguous_strides(a.nd, a.dim, o.st);
    if (a.nd) {
        PD.PD_TensorSetDims(out, a.nd, a.dim, &st);
        PD.PD_TensorSetStrides(out, a.nd, o.st, &st);
    }
    PD.PD_TensorSetOffset(out, 0, &st);
    o.p = PD.PD_DeviceContextAllocateTensor(ctx, out, 0, a.cdt, &st);
    if (st != C_SUCCESS || (!o.p && o.n))
        fail(op, "allocating the output (%lld elements) failed", (long long)o.n);
    copy_view(op, s, &o, &a);
}

/* out (x's memory seen through dims, strides and a byte offset) = x */
static void strided_copy(PD_DeviceContext *ctx, PD_Tensor *x, size_t nd, const int64_t *dims, size_t nst,
                         const int64_t *strides, int64_t offset, PD_Tensor *out)
{
    const char *op = "strided_copy";
    sview a, o;
    strided_of(op, x, &a);
    if (nd != (size_t)a.nd || nst != nd)
        fail(op, "the input has %d dimensions; the destination %zu dims and %zu strides", a.nd, nd, nst);
    for (int d = 0; d < a.nd; d++)
        if (dims[d] != a.dim[d])
            fail(op, "dimension %d of the input is %lld, of the destination %lld", d, (long long)a.dim[d],
                 (long long)dims[d]);
    anychip_stream s = stream_of(op, ctx);
    C_Status st = C_SUCCESS;
    if (nd) {
        PD.PD_TensorSetDims(out, (int64_t)nd, dims, &st);
        PD.PD_TensorSetStrides(out, (int64_t)nd, strides, &st);
    }
    PD.PD_TensorSetOffset(out, offset, &st);
    if (!a.n)
        return;
    o = a;
    memcpy(o.st, strides, nd * sizeof *strides);
    o.p = PD.PD_TensorGetDataPointer(out, &st);
    if (st != C_SUCCESS || !o.p)
        fail(op, "the destination has no memory (Paddle allocates it before the copy)");
    copy_view(op, s, &o, &a);
}

static void k_strided_copy(PD_DeviceContext *ctx, PD_Tensor *x, const void *dims, const void *strides,
                           int64_t offset, PD_Tensor *out)
{
    size_t nd = 0, nst = 0;
    const int64_t *d = anychip_paddle_i64s(dims, &nd), *st = anychip_paddle_i64s(strides, &nst);
    strided_copy(ctx, x, nd, d, nst, st, offset, out);
}

/* transpose: out[i_0, ..., i_n-1] = x[.., i_d at axis[d], ..] (out's dim d is x's dim axis[d]);
 * transpose_grad (inverse): dx = dout transposed back (dx's dim axis[d] is dout's dim d). In eager
 * mode a transpose is a view (Paddle's stride kernels) and these do not run; in a static program
 * they are real ops, which would otherwise take the CPU fallback (two copies and a wait for the
 * stream). One copy_view: x seen through the permuted dims and strides, into out. */
static void transpose_by(const char *op, PD_DeviceContext *ctx, PD_Tensor *x, const int32_t *axis, size_t naxis,
                         int inverse, PD_Tensor *out)
{
    sview a, v, o;
    strided_of(op, x, &a);
    if ((int64_t)naxis != a.nd)
        fail(op, "%zu axes for a tensor of %d dimensions", naxis, a.nd);
    int seen[MAXD] = {0};
    v = a;
    for (int d = 0; d < a.nd; d++) {
        int ax = axis[d] < 0 ? axis[d] + a.nd : axis[d];
        if (ax < 0 || ax >= a.nd || seen[ax]++)
            fail(op, "axis %d of a tensor of %d dimensions (each axis once)", (int)axis[d], a.nd);
        if (inverse) {
            v.dim[ax] = a.dim[d];
            v.st[ax] = a.st[d];
        } else {
            v.dim[d] = a.dim[ax];
            v.st[d] = a.st[ax];
        }
    }
    anychip_stream s = stream_of(op, ctx);
    C_Status st = C_SUCCESS;
    o = v;
    contiguous_strides(v.nd, v.dim, o.st);
    if (PD.PD_TensorGetNumDims(out, &st) != v.nd)
        fail(op, "the output has %lld dimensions, the input %d", (long long)PD.PD_TensorGetNumDims(out, &st), v.nd);
    for (int d = 0; d < v.nd; d++)
        if (PD.PD_TensorGetDim(out, (size_t)d, &st) != v.dim[d])
            fail(op, "dimension %d of the output is %lld, of the transposed input %lld", d,
                 (long long)PD.PD_TensorGetDim(out, (size_t)d, &st), (long long)v.dim[d]);
    o.p = PD.PD_DeviceContextAllocateTensor(ctx, out, 0, a.cdt, &st);
    if (st != C_SUCCESS || (!o.p && o.n))
        fail(op, "allocating the output (%lld elements) failed", (long long)o.n);
    copy_view(op, s, &o, &v);
}

static void k_transpose(PD_DeviceContext *ctx, PD_Tensor *x, const void *axis, PD_Tensor *out)
{
    size_t n = 0;
    const int32_t *ax = anychip_paddle_i32s(axis, &n);
    transpose_by("transpose", ctx, x, ax, n, 0, out);
}

static void k_transpose_grad(PD_DeviceContext *ctx, PD_Tensor *dout, const void *axis, PD_Tensor *dx)
{
    size_t n = 0;
    const int32_t *ax = anychip_paddle_i32s(axis, &n);
    transpose_by("transpose_grad", ctx, dout, ax, n, 1, dx);
}

/* a host value of dtype t: f (a float dtype, or from_float), else i */
static void put_value(C_DataType t, double f, int64_t i, int from_float, unsigned char *q)
{
    int64_t iv = from_float ? (int64_t)f : i;
    double fv = from_float ? f : (double)i;
    switch (t) {
    case FLOAT64: memcpy(q, &fv, 8); break;
    case FLOAT32: { float v = (float)fv; memcpy(q, &v, 4); break; }
    case FLOAT16: { uint16_t h = float_to_half((float)fv); memcpy(q, &h, 2); break; }
    case BFLOAT16: { uint16_t h = float_to_bf16((float)fv); memcpy(q, &h, 2); break; }
    case COMPLEX64: { float v[2] = {(float)fv, 0}; memcpy(q, v, 8); break; }
    case COMPLEX128: { double v[2] = {fv, 0}; memcpy(q, v, 16); break; }
    case INT64: case UINT64: memcpy(q, &iv, 8); break;
    case INT32: case UINT32: { int32_t v = (int32_t)iv; memcpy(q, &v, 4); break; }
    case INT16: case UINT16: { int16_t v = (int16_t)iv; memcpy(q, &v, 2); break; }
    case BOOL: q[0] = from_float ? f != 0 : i != 0; break;
    default: q[0] = (unsigned char)iv; break;          /* int8, uint8 */
    }
}

/* out = x's shape filled with the value (Paddle's fill: the view gradients' zeros, Tensor.fill_) */
static void fill_op(PD_DeviceContext *ctx, PD_Tensor *x, scal_v v, PD_Tensor *out)
{
    const char *op = "fill";
    sview a;
    strided_of(op, x, &a);
    anychip_stream s = stream_of(op, ctx);
    C_Status st = C_SUCCESS;
    char *p = PD.PD_DeviceContextAllocateTensor(ctx, out, 0, a.cdt, &st);
    if (st != C_SUCCESS || (!p && a.n))
        fail(op, "allocating the output (%lld elements) failed", (long long)a.n);
    if (!a.n)
        return;
    int is_f = a.cdt == FLOAT16 || a.cdt == BFLOAT16 || a.cdt == FLOAT32 || a.cdt == FLOAT64 || a.cdt == COMPLEX64 ||
               a.cdt == COMPLEX128;
    if (a.dt >= 0 && K && (MASK(fill) & (1u << a.dt))) {
        fill(op, s, a.dt, a.n, p, is_f ? v.f : 0.0, is_f ? 0 : v.i, 0);
        return;
    }
    size_t bytes = (size_t)a.n * (size_t)a.item;
    unsigned char *h = malloc(bytes);
    if (!h)
        fail(op, "out of host memory for %zu bytes", bytes);
    for (int64_t k = 0; k < a.n; k++)
        put_value(a.cdt, v.f, v.i, is_f, h + k * a.item);
    st = sync_copy(bridge_device, p, h, bytes, ANYCHIP_COPY_H2D);
    free(h);
    if (st != C_SUCCESS)
        fail(op, "copying the value to the device failed (the message above says why)");
}

static void k_fill(PD_DeviceContext *ctx, PD_Tensor *x, PD_Scalar *v, PD_Tensor *out) { fill_op(ctx, x, scal_of(v), out); }

/* out = x0 + x1 + ... in that order (Paddle's CPU add_n: the first two added, then each next one),
 * the inputs of one shape and dtype; empty inputs are skipped, as Paddle's CPU kernel skips them.
 * A static program's gradient accumulation (a value used by several ops) is an add_n. */
static void add_n(PD_DeviceContext *ctx, size_t n, PD_Tensor *const *xs, PD_Tensor *out)
{
    const char *op = "add_n";
    tview x[64], o;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m == sizeof x / sizeof *x)
            fail(op, "more than %zu inputs", sizeof x / sizeof *x);
        input(op, xs[i], &x[m]);
        if (!x[m].n)
            continue;
        if (m && (x[m].cdt != x[0].cdt || x[m].nd != x[0].nd ||
                  memcmp(x[m].dim, x[0].dim, sizeof *x[0].dim * (size_t)x[0].nd) != 0))
            fail(op, "input %zu's shape or data type differs from the first's", i);
        m++;
    }
    if (!n)
        fail(op, "no inputs");
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, out, x[0].cdt, &o);   /* all empty: x[0] is the last input, of the dtype */
    if (!m)
        return;
    if (o.n != x[0].n)
        fail(op, "an output of %lld elements for inputs of %lld", (long long)o.n, (long long)x[0].n);
    temps T = {ctx, op, {0}, 0};
    void *acc = o.p;
    for (size_t i = 1; i < m && acc == o.p; i++)      /* the output is an input read after the first add */
        if (overlaps(&o, &x[i]))
            acc = temp(&T, o.nd, o.dim, o.cdt);
    int64_t one = 1;
    if (m == 1)
        un(op, s, ANYCHIP_OP_COPY, o.dt, o.dt, o.n, acc, x[0].p);
    for (size_t i = 1; i < m; i++)
        ew(op, s, ANYCHIP_OP_ADD, o.dt, 1, &o.n, acc, i == 1 ? x[0].p : acc, &one, x[i].p, &one);
    settle(&T, s, &o, acc);
    temps_free(&T);
}

static void k_add_n(PD_DeviceContext *ctx, const void *xs, PD_Tensor *out)
{
    size_t n = 0;
    void *const *x = anychip_paddle_ptrs(xs, &n);
    add_n(ctx, n, (PD_Tensor *const *)x, out);
}

/* ---- layer_norm ----------------------------------------------------------------------------------- */

/* x as Paddle's CPU kernel sees it: [left, right], the dims from begin_norm_axis on normalized together */
static void norm_split(const char *op, const tview *x, int axis, int64_t *left, int64_t *right)
{
    if (axis < 0 || axis >= (x->nd ? x->nd : 1))
        fail(op, "begin_norm_axis %d is out of range for a %d-d input", axis, x->nd);
    *left = 1;
    *right = 1;
    for (int d = 0; d < x->nd; d++)
        *(d < axis ? left : right) *= x->dim[d];
}

/* scale or bias: `right` elements of x's dtype */
static void norm_param(const char *op, const char *what, const PD_Tensor *t, const tview *x, int64_t right, tview *v)
{
    input(op, t, v);
    if (v->n != right || v->cdt != x->cdt)
        fail(op, "%s has %lld elements of data type %d; x normalizes %lld elements of data type %d", what,
             (long long)v->n, (int)v->cdt, (long long)right, (int)x->cdt);
}

/* sqrt(var + epsilon), one per row (Paddle's DivAndSqrtFunctor divides by it) */
static void *norm_denominator(temps *T, anychip_stream s, const tview *x, const void *var, int64_t left, float eps)
{
    int64_t one = 1, zero = 0;
    void *r = temp(T, 1, &left, x->cdt);
    ew(T->op, s, ANYCHIP_OP_ADD, x->dt, 1, &left, r, var, &one, constant(T, s, x->cdt, (double)eps), &zero);
    un(T->op, s, ANYCHIP_OP_SQRT, x->dt, x->dt, left, r, r);
    return r;
}

/* Paddle's CPU layer_norm, step by step: mean and variance (the mean of (x - mean)^2) per row,
 * y = (x - mean) / sqrt(variance + epsilon), then times scale, then plus bias, each where given.
 * mean and variance are outputs, of x's dtype (the float32 / float64 kernels'). */
static void layer_norm(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *scale, PD_Tensor *bias, float eps, int axis,
                       PD_Tensor *y, PD_Tensor *mean, PD_Tensor *var)
{
    const char *op = "layer_norm";
    tview a, w, b, o, m, v;
    input(op, x, &a);
    int64_t left, right;
    norm_split(op, &a, axis, &left, &right);
    if (scale)
        norm_param(op, "scale", scale, &a, right, &w);
    if (bias)
        norm_param(op, "bias", bias, &a, right, &b);
    anychip_stream s = stream_of(op, ctx);
    output(op, ctx, y, a.cdt, &o);
    output(op, ctx, mean, a.cdt, &m);
    output(op, ctx, var, a.cdt, &v);
    if (m.n != left || v.n != left)
        fail(op, "mean and variance of %lld and %lld elements for %lld rows", (long long)m.n, (long long)v.n,
             (long long)left);
    if (!right) {                         /* rows of nothing: Paddle-CPU's 0 * (1 / 0) */
        fill(op, s, m.dt, m.n, m.p, NAN, 0, 1);
        fill(op, s, v.dt, v.n, v.p, NAN, 0, 1);
        return;
    }
    if (!a.n)
        return;
    temps T = {ctx, op, {0}, 0};
    int64_t dim[2] = {left, right}, full[2] = {right, 1}, rows[2] = {1, 0}, cols[2] = {0, 1};
    void *d = temp(&T, 2, dim, a.cdt);
    kreduce(op, s, ANYCHIP_REDUCE_MEAN, a.dt, a.dt, left, right, 1, m.p, a.p);
    ew(op, s, ANYCHIP_OP_SUB, a.dt, 2, dim, d, a.p, full, m.p, rows);                /* x - mean */
    ew(op, s, ANYCHIP_OP_MUL, a.dt, 2, dim, o.p, d, full, d, full);                  /* its square, in y */
    kreduce(op, s, ANYCHIP_REDUCE_MEAN, a.dt, a.dt, left, right, 1, v.p, o.p);
    void *r = norm_denominator(&T, s, &a, v.p, left, eps);
    ew(op, s, ANYCHIP_OP_DIV, a.dt, 2, dim, o.p, d, full, r, rows);
    if (scale)
        ew(op, s, ANYCHIP_OP_MUL, a.dt, 2, dim, o.p, o.p, full, w.p, cols);
    if (bias)
        ew(op, s, ANYCHIP_OP_ADD, a.dt, 2, dim, o.p, o.p, full, b.p, cols);
    temps_free(&T);
}

/* Paddle's CPU layer_norm_grad, step by step, with x_norm = (x - mean) / sqrt(variance + epsilon) and
 * g = dy * scale (dy without a scale):
 *   bias_grad = dy summed over the rows, scale_grad = x_norm * dy summed over the rows,
 *   x_grad = (g - rowmean(g) - x_norm * rowmean(g * x_norm)) / sqrt(variance + epsilon).
 * An output Paddle does not ask for (NULL) is not computed; bias itself is not read. */
static void layer_norm_grad(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *scale, PD_Tensor *mean, PD_Tensor *var,
                            PD_Tensor *dy, float eps, int axis, PD_Tensor *dx, PD_Tensor *dscale, PD_Tensor *dbias)
{
    const char *op = "layer_norm_grad";
    tview a, w, m, v, g, ox, os, ob;
    input(op, x, &a);
    input(op, dy, &g);
    input(op, mean, &m);
    input(op, var, &v);
    int64_t left, right;
    norm_split(op, &a, axis, &left, &right);
    if (scale)
        norm_param(op, "scale", scale, &a, right, &w);
    if (g.n != a.n || g.cdt != a.cdt || m.n != left || v.n != left || m.cdt != a.cdt || v.cdt != a.cdt)
        fail(op, "x of %lld elements (%lld rows), out_grad of %lld, mean and variance of %lld and %lld, "
             "data types %d, %d, %d, %d (want out_grad as x, one mean and variance per row, one data type)",
             (long long)a.n, (long long)left, (long long)g.n, (long long)m.n, (long long)v.n, (int)a.cdt, (int)g.cdt,
             (int)m.cdt, (int)v.cdt);
    if (dscale && !scale)
        fail(op, "scale_grad asked for without a scale");
    anychip_stream s = stream_of(op, ctx);
    if (dx)
        output(op, ctx, dx, a.cdt, &ox);
    if (dscale)
        output(op, ctx, dscale, a.cdt, &os);
    if (dbias)
        output(op, ctx, dbias, a.cdt, &ob);
    if (!a.n) {                           /* sums over no rows */
        if (dscale)
            fill(op, s, os.dt, os.n, os.p, 0.0, 0, 1);
        if (dbias)
            fill(op, s, ob.dt, ob.n, ob.p, 0.0, 0, 1);
        return;
    }
    temps T = {ctx, op, {0}, 0};
    int64_t dim[2] = {left, right}, full[2] = {right, 1}, rows[2] = {1, 0}, cols[2] = {0, 1};
    void *r = NULL, *xn = NULL, *t = NULL;
    if (dx || dscale) {
        r = norm_denominator(&T, s, &a, v.p, left, eps);
        xn = temp(&T, 2, dim, a.cdt);
        t = temp(&T, 2, dim, a.cdt);
        ew(op, s, ANYCHIP_OP_SUB, a.dt, 2, dim, xn, a.p, full, m.p, rows);
        ew(op, s, ANYCHIP_OP_DIV, a.dt, 2, dim, xn, xn, full, r, rows);
    }
    if (dbias)
        kreduce(op, s, ANYCHIP_REDUCE_SUM, a.dt, a.dt, 1, left, right, ob.p, g.p);
    if (dscale) {
        ew(op, s, ANYCHIP_OP_MUL, a.dt, 2, dim, t, xn, full, g.p, full);
        kreduce(op, s, ANYCHIP_REDUCE_SUM, a.dt, a.dt, 1, left, right, os.p, t);
    }
    if (dx) {
        void *gs = temp(&T, 2, dim, a.cdt), *row = temp(&T, 1, &left, a.cdt);
        if (scale)
            ew(op, s, ANYCHIP_OP_MUL, a.dt, 2, dim, gs, g.p, full, w.p, cols);
        else
            un(op, s, ANYCHIP_OP_COPY, a.dt, a.dt, a.n, gs, g.p);
        kreduce(op, s, ANYCHIP_REDUCE_MEAN, a.dt, a.dt, left, right, 1, row, gs);
        ew(op, s, ANYCHIP_OP_MUL, a.dt, 2, dim, t, gs, full, xn, full);              /* g * x_norm */
        ew(op, s, ANYCHIP_OP_SUB, a.dt, 2, dim, gs, gs, full, row, rows);            /* g - rowmean(g) */
        kreduce(op, s, ANYCHIP_REDUCE_MEAN, a.dt, a.dt, left, right, 1, row, t);
        ew(op, s, ANYCHIP_OP_MUL, a.dt, 2, dim, t, xn, full, row, rows);
        ew(op, s, ANYCHIP_OP_SUB, a.dt, 2, dim, gs, gs, full, t, full);
        ew(op, s, ANYCHIP_OP_DIV, a.dt, 2, dim, ox.p, gs, full, r, rows);
    }
    temps_free(&T);
}

/* the optional scale and bias arrive as paddle::optional objects: their tensor, or NULL */
static void k_layer_norm(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *scale, PD_Tensor *bias, float eps, int axis,
                         PD_Tensor *y, PD_Tensor *mean, PD_Tensor *var)
{
    layer_norm(ctx, x, PD.PD_OptionalTensorGetPointer(scale), PD.PD_OptionalTensorGetPointer(bias), eps, axis, y,
               mean, var);
}

static void k_layer_norm_grad(PD_DeviceContext *ctx, PD_Tensor *x, PD_Tensor *scale, PD_Tensor *bias, PD_Tensor *mean,
                              PD_Tensor *var, PD_Tensor *dy, float eps, int axis, PD_Tensor *dx, PD_Tensor *dscale,
                              PD_Tensor *dbias)
{
    (void)bias;
    layer_norm_grad(ctx, x, PD.PD_OptionalTensorGetPointer(scale), mean, var, dy, eps, axis, dx, dscale, dbias);
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
    adamw("adamw", CTX, IN(0), IN(1), IN(2), IN(3), IN(4), IN(5), IN(6), IN(7), IN(8), IN(9),
          SCAL("adamw", 0).f, SCAL("adamw", 1).f, SCAL("adamw", 2).f,
          PD.PD_KernelContextFloatAttrAt(c, 3), PD.PD_KernelContextFloatAttrAt(c, 4), BOOLA(5), BOOLA(8), BOOLA(9),
          BOOLA(10), OUT(0), OUT(1), OUT(2), OUT(4), OUT(5), OUT(6));
}
static void c_adam(PD_KernelContext *c)
{
    adamw("adam", CTX, IN(0), IN(1), IN(2), IN(3), IN(4), IN(5), IN(6), IN(7), IN(8), IN(9),
          SCAL("adam", 0).f, SCAL("adam", 1).f, SCAL("adam", 2).f, 1.0f, 0.0f, false, BOOLA(5), BOOLA(6), BOOLA(7),
          OUT(0), OUT(1), OUT(2), OUT(4), OUT(5), OUT(6));
}
static void c_momentum(PD_KernelContext *c)
{
    momentum(CTX, IN(0), IN(1), IN(2), IN(3), IN(4), PD.PD_KernelContextFloatAttrAt(c, 0), BOOLA(1),
             PD.PD_KernelContextStringAttrAt(c, 2), PD.PD_KernelContextFloatAttrAt(c, 3), BOOLA(4),
             PD.PD_KernelContextFloatAttrAt(c, 5), OUT(0), OUT(1), OUT(2));
}
/* a list input's or output's tensors, copied (the C API's list is freed at once) */
typedef struct { size_t n; PD_Tensor *t[1024]; } tlist;

static void list_of(const char *op, PD_List l, tlist *out)
{
    size_t n = l.size;
    if (n <= sizeof out->t / sizeof *out->t)
        memcpy(out->t, l.data, n * sizeof *out->t);
    PD.PD_DeletePointerList(l);
    if (n > sizeof out->t / sizeof *out->t)
        fail(op, "a list of %zu tensors; at most %zu", n, sizeof out->t / sizeof *out->t);
    out->n = n;
}
static void c_check_finite_and_unscale(PD_KernelContext *c)
{
    static __thread tlist xs, outs;
    list_of("check_finite_and_unscale", PD.PD_KernelContextMultiInputAt(c, 0), &xs);
    list_of("check_finite_and_unscale", PD.PD_KernelContextMultiOutputAt(c, 0), &outs);
    check_finite_and_unscale(CTX, xs.n, xs.t, IN(1), outs.n, outs.t, OUT(1));
}
static void c_add_n(PD_KernelContext *c)
{
    static __thread tlist xs;
    list_of("add_n", PD.PD_KernelContextMultiInputAt(c, 0), &xs);
    add_n(CTX, xs.n, xs.t, OUT(0));
}
static void c_layer_norm(PD_KernelContext *c)
{
    layer_norm(CTX, IN(0), IN(1), IN(2), PD.PD_KernelContextFloatAttrAt(c, 0), INTA(1), OUT(0), OUT(1), OUT(2));
}
static void c_layer_norm_grad(PD_KernelContext *c)
{
    layer_norm_grad(CTX, IN(0), IN(1), IN(3), IN(4), IN(5), PD.PD_KernelContextFloatAttrAt(c, 0), INTA(1), OUT(0),
                    OUT(1), OUT(2));
}
static void c_update_loss_scaling(PD_KernelContext *c)
{
    static __thread tlist xs, outs;
    list_of("update_loss_scaling", PD.PD_KernelContextMultiInputAt(c, 0), &xs);
    list_of("update_loss_scaling", PD.PD_KernelContextMultiOutputAt(c, 0), &outs);
    scal_v stop = SCAL("update_loss_scaling", 4);
    update_loss_scaling(CTX, xs.n, xs.t, IN(1), IN(2), IN(3), IN(4), INTA(0), INTA(1),
                        PD.PD_KernelContextFloatAttrAt(c, 2), PD.PD_KernelContextFloatAttrAt(c, 3),
                        stop.i != 0 || stop.f != 0, outs.n, outs.t, OUT(1), OUT(2), OUT(3));
}
static void c_contiguous(PD_KernelContext *c) { k_contiguous(CTX, IN(0), OUT(0)); }
static void c_strided_copy(PD_KernelContext *c)
{
    /* the attributes' own vectors, not copies (paddle/phi/capi/lib/c_kernel_context.cc): deleting
     * them freed the kernel context's memory */
    PD_List d = PD.PD_KernelContextListInt64AttrAt(c, 0), st = PD.PD_KernelContextListInt64AttrAt(c, 1);
    strided_copy(CTX, IN(0), d.size, (const int64_t *)d.data, st.size, (const int64_t *)st.data,
                 PD.PD_KernelContextInt64AttrAt(c, 2), OUT(0));
}
static void c_fill(PD_KernelContext *c) { fill_op(CTX, IN(0), SCAL("fill", 0), OUT(0)); }
static void c_transpose_by(PD_KernelContext *c, const char *op, int inverse)
{
    /* the attribute's own vector, not a copy (paddle/phi/capi/lib/c_kernel_context.cc) */
    PD_List l = PD.PD_KernelContextListInt32AttrAt(c, 0);
    transpose_by(op, CTX, IN(0), (const int32_t *)l.data, l.size, inverse, OUT(0));
}
static void c_transpose(PD_KernelContext *c) { c_transpose_by(c, "transpose", 0); }
static void c_transpose_grad(PD_KernelContext *c) { c_transpose_by(c, "transpose_grad", 1); }
static void c_sgd(PD_KernelContext *c) { sgd(CTX, IN(0), IN(1), IN(2), IN(3), BOOLA(0), OUT(0), OUT(1)); }
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

enum { FLOATS = 1, INTS = 2, ALL = FLOATS | INTS, VIEW_TYPES = 4, WIDE_FLOATS = 8 };
/* WIDE_FLOATS: float32 and float64, the dtypes of Paddle's CPU kernels whose float16 forms (on GPUs)
 * keep statistics or parameters in float32 (layer_norm) */

/* the primitives a kernel uses, each with the kernel's dtype; BOOL_MASK: also a unary cast from
 * bool (a comparison's result); WIDEN: an integer sum, which Paddle accumulates into int64 */
enum { BIN = 1, UN = 2, RED = 4, GEMM = 8, FIL = 16, BOOL_MASK = 32, WIDEN = 64, HOST = 128 };
/* HOST: registered for every dtype of its family, with or without a kernel table: what the
 * table's masks do not take copies through the host (the strided views' kernels, which have no
 * CPU fallback) */

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
    const PD_KernelArgumentType *out;     /* the outputs' types; NULL: all tensors */
    void (*args)(const PD_KernelKey *, PD_Kernel *);   /* sets outputs' dtypes; NULL: as out_any_dtype says */
} kernel_def;

#define O_ PD_ARG_TYPE_OPTIONAL_TENSOR
#define F32_ PD_ARG_TYPE_FLOAT32
#define I64_ PD_ARG_TYPE_INT64
static const PD_KernelArgumentType ADAMW_IN[] = {T_, T_, T_, T_, T_, O_, T_, T_, O_, O_};
static const PD_KernelArgumentType SGD_IN[] = {T_, T_, T_, O_};
#define L_ PD_ARG_TYPE_LIST_TENSOR
#define LI64_ PD_ARG_TYPE_LIST_INT64
#define LI32_ PD_ARG_TYPE_LIST_INT32
#define STR_ PD_ARG_TYPE_STRING
static const PD_KernelArgumentType MOMENTUM_IN[] = {T_, T_, T_, T_, O_};
static const PD_KernelArgumentType CFU_IN[] = {L_, T_}, CFU_OUT[] = {L_, T_}, ADD_N_IN[] = {L_};
static const PD_KernelArgumentType LN_IN[] = {T_, O_, O_}, LN_GRAD_IN[] = {T_, O_, O_, T_, T_, T_};
static const PD_KernelArgumentType ULS_IN[] = {L_, T_, T_, T_, T_}, ULS_OUT[] = {L_, T_, T_, T_};
static void cfu_args(const PD_KernelKey *key, PD_Kernel *kernel);
static void uls_args(const PD_KernelKey *key, PD_Kernel *kernel);

/* reductions over several axes or none (sums, means, the gradients that unbroadcast) */
#define REDUCING (RED | UN | FIL)

#define V(f) ((void *)(f))
static const kernel_def KERNELS[] = {
    {"add", ALL, BIN, 2, 0, 1, {0}, c_add, V(k_add), 0, NULL, NULL, NULL},
    {"subtract", ALL, BIN, 2, 0, 1, {0}, c_sub, V(k_sub), 0, NULL, NULL, NULL},
    {"multiply", ALL, BIN, 2, 0, 1, {0}, c_mul, V(k_mul), 0, NULL, NULL, NULL},
    {"divide", FLOATS, BIN, 2, 0, 1, {0}, c_div, V(k_div), 0, NULL, NULL, NULL},
    {"maximum", ALL, BIN, 2, 0, 1, {0}, c_max, V(k_max), 0, NULL, NULL, NULL},
    {"minimum", ALL, BIN, 2, 0, 1, {0}, c_min, V(k_min), 0, NULL, NULL, NULL},
    {.name = "add_n", .types = ALL, .uses = BIN | UN, .nin = 1, .nout = 1, .fn = c_add_n, .variadic = V(k_add_n),
     .in = ADD_N_IN},
    {"add_grad", ALL, REDUCING, 3, 1, 2, {I_}, c_add_grad, V(k_add_grad), 0, NULL, NULL, NULL},
    {"subtract_grad", ALL, REDUCING, 3, 1, 2, {I_}, c_sub_grad, V(k_sub_grad), 0, NULL, NULL, NULL},
    {"multiply_grad", ALL, BIN | REDUCING, 3, 1, 2, {I_}, c_mul_grad, V(k_mul_grad), 0, NULL, NULL, NULL},
    {"divide_grad", FLOATS, BIN | REDUCING, 4, 1, 2, {I_}, c_div_grad, V(k_div_grad), 0, NULL, NULL, NULL},
    {"relu", FLOATS, UN, 1, 0, 1, {0}, c_relu, V(k_relu), 0, NULL, NULL, NULL},
    {"exp", FLOATS, UN, 1, 0, 1, {0}, c_exp, V(k_exp), 0, NULL, NULL, NULL},
    {"log", FLOATS, UN, 1, 0, 1, {0}, c_log, V(k_log), 0, NULL, NULL, NULL},
    {"square", ALL, BIN, 1, 0, 1, {0}, c_square, V(k_square), 0, NULL, NULL, NULL},
    {"relu_grad", FLOATS, BIN | UN | FIL | BOOL_MASK, 2, 0, 1, {0}, c_relu_grad, V(k_relu_grad), 0, NULL, NULL, NULL},
    {"exp_grad", FLOATS, BIN, 2, 0, 1, {0}, c_exp_grad, V(k_exp_grad), 0, NULL, NULL, NULL},
    {"log_grad", FLOATS, BIN, 2, 0, 1, {0}, c_log_grad, V(k_log_grad), 0, NULL, NULL, NULL},
    {"square_grad", ALL, BIN, 2, 0, 1, {0}, c_square_grad, V(k_square_grad), 0, NULL, NULL, NULL},
    {"cast", ALL, UN, 1, 1, 1, {D_}, c_cast, V(k_cast), 1, NULL, NULL, NULL},
    {"scale", ALL, BIN | FIL, 1, 3, 1, {S_, S_, B_}, c_scale, V(k_scale), 0, NULL, NULL, NULL},
    {"full", ALL, FIL, 0, 3, 1, {A_, S_, D_}, c_full, V(k_full), 0, NULL, NULL, NULL},
    {"full_like", ALL, FIL, 1, 2, 1, {S_, D_}, c_full_like, V(k_full_like), 0, NULL, NULL, NULL},
    {"sum", ALL, REDUCING | WIDEN, 1, 3, 1, {A_, D_, B_}, c_sum, V(k_sum), 1, NULL, NULL, NULL},
    {"mean", FLOATS, BIN | REDUCING, 1, 2, 1, {A_, B_}, c_mean, V(k_mean), 0, NULL, NULL, NULL},
    {"mean_all", FLOATS, BIN | REDUCING, 1, 0, 1, {0}, c_mean_all, V(k_mean_all), 0, NULL, NULL, NULL},
    {"sum_grad", ALL, BIN | FIL, 2, 3, 1, {A_, B_, B_}, c_sum_grad, V(k_sum_grad), 0, NULL, NULL, NULL},
    {"mean_grad", FLOATS, BIN | FIL, 2, 3, 1, {A_, B_, B_}, c_mean_grad, V(k_mean_grad), 0, NULL, NULL, NULL},
    {"mean_all_grad", FLOATS, BIN | FIL, 2, 0, 1, {0}, c_mean_all_grad, V(k_mean_all_grad), 0, NULL, NULL, NULL},
    {"softmax", FLOATS, BIN | UN | RED, 1, 1, 1, {I_}, c_softmax, V(k_softmax), 0, NULL, NULL, NULL},
    {"softmax_grad", FLOATS, BIN | RED, 2, 1, 1, {I_}, c_softmax_grad, V(k_softmax_grad), 0, NULL, NULL, NULL},
    {"matmul", FLOATS, GEMM | FIL, 2, 2, 1, {B_, B_}, c_matmul, V(k_matmul), 0, NULL, NULL, NULL},
    {"matmul_grad", FLOATS, GEMM | REDUCING, 3, 2, 2, {B_, B_}, c_matmul_grad, V(k_matmul_grad), 0, NULL, NULL, NULL},
    {"adamw", FLOATS, BIN | UN | FIL, 10, 11, 7, {S_, S_, S_, F32_, F32_, B_, B_, I64_, B_, B_, B_}, c_adamw,
     V(k_adamw), 0, ADAMW_IN, NULL, NULL},
    {"sgd", FLOATS, BIN | UN, 4, 1, 2, {B_}, c_sgd, V(k_sgd), 0, SGD_IN, NULL, NULL},
    {.name = "adam", .types = FLOATS, .uses = BIN | UN | FIL, .nin = 10, .nattr = 8, .nout = 7,
     .attr = {S_, S_, S_, B_, I64_, B_, B_, B_}, .fn = c_adam, .variadic = V(k_adam), .in = ADAMW_IN},
    {.name = "momentum", .types = FLOATS, .uses = BIN | UN | FIL, .nin = 5, .nattr = 6, .nout = 3,
     .attr = {F32_, B_, STR_, F32_, B_, F32_}, .fn = c_momentum, .variadic = V(k_momentum), .in = MOMENTUM_IN},
    {.name = "check_finite_and_unscale", .types = FLOATS, .uses = BIN | UN | RED | FIL | BOOL_MASK, .nin = 2,
     .nout = 2, .fn = c_check_finite_and_unscale, .variadic = V(k_check_finite_and_unscale), .in = CFU_IN,
     .out = CFU_OUT, .args = cfu_args},
    {.name = "update_loss_scaling", .types = FLOATS, .uses = UN | FIL, .nin = 5, .nattr = 5, .nout = 4,
     .attr = {I_, I_, F32_, F32_, S_}, .fn = c_update_loss_scaling, .variadic = V(k_update_loss_scaling),
     .in = ULS_IN, .out = ULS_OUT, .args = uls_args},
    {.name = "layer_norm", .types = WIDE_FLOATS, .uses = BIN | UN | RED | FIL, .nin = 3, .nattr = 2, .nout = 3,
     .attr = {F32_, I_}, .fn = c_layer_norm, .variadic = V(k_layer_norm), .in = LN_IN},
    {.name = "layer_norm_grad", .types = WIDE_FLOATS, .uses = BIN | UN | RED | FIL, .nin = 6, .nattr = 2,
     .nout = 3, .attr = {F32_, I_}, .fn = c_layer_norm_grad, .variadic = V(k_layer_norm_grad), .in = LN_GRAD_IN},
    {.name = "contiguous", .types = VIEW_TYPES, .uses = HOST, .nin = 1, .nout = 1, .fn = c_contiguous,
     .variadic = V(k_contiguous)},
    {.name = "strided_copy", .types = VIEW_TYPES, .uses = HOST, .nin = 1, .nattr = 3, .nout = 1,
     .attr = {LI64_, LI64_, I64_}, .fn = c_strided_copy, .variadic = V(k_strided_copy)},
    {.name = "fill", .types = VIEW_TYPES, .uses = HOST, .nin = 1, .nattr = 1, .nout = 1, .attr = {S_},
     .fn = c_fill, .variadic = V(k_fill)},
    {.name = "transpose", .types = ALL, .uses = UN, .nin = 1, .nattr = 1, .nout = 1, .attr = {LI32_},
     .fn = c_transpose, .variadic = V(k_transpose)},
    {.name = "transpose_grad", .types = ALL, .uses = UN, .nin = 1, .nattr = 1, .nout = 1, .attr = {LI32_},
     .fn = c_transpose_grad, .variadic = V(k_transpose_grad)},
};
#define NKERNELS (sizeof KERNELS / sizeof *KERNELS)

/* each family's dtypes, in registration order */
static const C_DataType FLOAT_TYPES[] = {FLOAT32, FLOAT64, FLOAT16, BFLOAT16};
static const C_DataType INT_TYPES[] = {INT32, INT64};
static const C_DataType WIDE_FLOAT_TYPES[] = {FLOAT32, FLOAT64};
/* those Paddle's CPU registers contiguous and strided_copy for */
static const C_DataType VIEW_DTYPES[] = {FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64, BOOL, UINT8, INT8, INT16,
                                         COMPLEX64, COMPLEX128};
static const struct {
    int family;
    const C_DataType *types;
    size_t n;
} FAMILIES[] = {{FLOATS, FLOAT_TYPES, 4}, {INTS, INT_TYPES, 2}, {VIEW_TYPES, VIEW_DTYPES, 12},
                {WIDE_FLOATS, WIDE_FLOAT_TYPES, 2}};

static const char *const PHI_NAMES[] = {[FLOAT32] = "float32", [FLOAT64] = "float64", [FLOAT16] = "float16",
                                        [BFLOAT16] = "bfloat16", [INT32] = "int32", [INT64] = "int64",
                                        [BOOL] = "bool", [UINT8] = "uint8", [INT8] = "int8", [INT16] = "int16",
                                        [COMPLEX64] = "complex64", [COMPLEX128] = "complex128"};

/* whether every primitive kernel `d` uses takes dtype `t` */
static int allowed(const kernel_def *d, C_DataType t)
{
    if (d->uses & HOST)
        return 1;
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
#ifdef ANYCHIP_PADDLE_VIEWS_ONLY
    K = NULL;                             /* built without a C++ compiler (kernels_c.c): the views' copies only */
    return ANYCHIP_PADDLE_VIEWS_ONLY;
#endif
    K = anychip_plugin_kernels(&g_plugin);          /* the header's rule decides; the rest says why not */
    if (K)
        return "";
    if (g_plugin.minor < 1)
        snprintf(why, sizeof why, "the plugin is built against anychip/plugin.h %u.%u, which has no kernel table "
                 "(minor 1 adds it)", g_plugin.major, g_plugin.minor);
    else if (!g_plugin.kernels)
        snprintf(why, sizeof why, "the plugin fills no kernel table, plugin.h's `kernels`");
    else if (g_plugin.kernels->version != ANYCHIP_KERNELS_VERSION)
        snprintf(why, sizeof why, "the plugin's kernel table is version %u, which this bridge (kernel table "
                 "version %d) does not know", g_plugin.kernels->version, ANYCHIP_KERNELS_VERSION);
    else {                                /* dtypes of a newer header: the table is not this file's */
        const anychip_kernels *k = g_plugin.kernels;
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

/* output `i`'s dtype */
static void output_dtype(PD_Kernel *kernel, size_t i, C_DataType t)
{
    C_Status st = C_SUCCESS;
    PD_KernelArgsDef *def = PD.PD_KernelGetArgsDef(kernel, &st);
    PD_List outs = PD.PD_KernelArgsDefGetOutputArgDefs(def, &st);
    if (i < outs.size)
        PD.PD_TensorArgDefSetDataType(((PD_TensorArgDef **)outs.data)[i], t, &st);
    PD.PD_DeletePointerList(outs);
}

/* found_infinite is bool (Paddle's GPU registration) */
static void cfu_args(const PD_KernelKey *key, PD_Kernel *kernel)
{
    (void)key;
    output_dtype(kernel, 1, BOOL);
}

/* the loss scale is of the master type, the step counters int32 (Paddle's GPU registration) */
static void uls_args(const PD_KernelKey *key, PD_Kernel *kernel)
{
    C_Status st = C_SUCCESS;
    C_DataType t = PD.PD_KernelKeyGetDataType((PD_KernelKey *)key, &st);
    if (t == FLOAT16 || t == BFLOAT16)
        output_dtype(kernel, 1, FLOAT32);
    output_dtype(kernel, 2, INT32);
    output_dtype(kernel, 3, INT32);
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

/* ANYCHIP_PADDLE_KERNELS=0 registers none of the table's kernels (every op then takes Paddle's CPU
 * fallback); without a usable table, too, only the strided views' kernels (HOST), which have no
 * fallback, are registered, copying through the host */
void register_kernels(void)
{
    const char *off = getenv("ANYCHIP_PADDLE_KERNELS");      /* "0", blanks around it ignored */
    int table = 1;
    if (off) {
        off += strspn(off, " \t");
        if (off[0] == '0' && off[strspn(off + 1, " \t") + 1] == '\0')
            table = 0;
    }
    if (!target_ready())
        return;
    if (table_problem()[0] || !table) {
        table = 0;                        /* no usable kernel table: the fallback, and the host's copies */
        K = NULL;
    }
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
        if (!table && !(d->uses & HOST))
            continue;
        PD_KernelArgumentType attrs[12], ins[12], outs[12];
        memcpy(attrs, d->attr, sizeof attrs);
        memcpy(ins, d->in ? d->in : tensors, sizeof ins[0] * (size_t)d->nin);
        memcpy(outs, d->out ? d->out : tensors, sizeof outs[0] * (size_t)d->nout);
        int any = 0;
        for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++)
            for (size_t i = 0; (d->types & FAMILIES[f].family) && i < FAMILIES[f].n; i++) {
                if (!allowed(d, FAMILIES[f].types[i]))
                    continue;
                PD.PD_RegisterPhiKernel(d->name, g_type, FAMILIES[f].types[i], ANYCHIP_PD_LAYOUT_ANY,
                                        (size_t)d->nin, ins, (size_t)d->nattr, attrs, (size_t)d->nout, outs,
                                        d->args ? d->args : d->out_any_dtype ? any_output_dtype : no_arg_changes,
                                        d->fn, d->variadic);
                any = 1;
            }
        if (any && used < sizeof g_kernel_names)
            used += (size_t)snprintf(g_kernel_names + used, sizeof g_kernel_names - used, "%s%s", used ? " " : "",
                                     d->name);
    }
}
