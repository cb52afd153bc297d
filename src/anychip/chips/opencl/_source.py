"""OpenCL C sources of the kernels run by :class:`anychip.chips.opencl.kernels.ClKernels`.

The source is generated per device from a few templates so that every kernel
exists once per dtype (and per dtype pair for ``cast``). Buffers are passed as a
``__global char*`` base plus a byte offset, because anychip's caching allocator
sub-allocates a ``cl.Buffer`` segment by offset; OpenCL sub-buffers would need
``CL_DEVICE_MEM_BASE_ADDR_ALIGN`` alignment, plain offsets need only the
element size.

Exactness rules (the tests compare against NumPy bit for bit):

* ``FP_CONTRACT OFF`` so ``a*b+c`` is never fused into an FMA;
* integer add / sub / mul (and the matmul / sum accumulators) compute in the
  unsigned type of the same width, so overflow wraps as in NumPy instead of
  being undefined behaviour;
* integer ``div`` is floor division (NumPy's ``//``), ``x // 0 == 0`` (NumPy's
  result) and ``MIN // -1`` wraps to ``MIN`` (it would trap on x86 otherwise);
* float ``div`` is IEEE division; the program is built with
  ``-cl-fp32-correctly-rounded-divide-sqrt`` when the device supports it.
"""
from __future__ import annotations

#: numpy dtype name -> (OpenCL C type, unsigned type of the same width or None for floats)
CTYPES: dict[str, tuple[str, str | None]] = {
    "float32": ("float", None),
    "float64": ("double", None),
    "int32": ("int", "uint"),
    "int64": ("long", "ulong"),
}

BINARY_OPS = ("add", "sub", "mul", "div")

_HEADER = r"""
#pragma OPENCL FP_CONTRACT OFF
#ifdef ANYCHIP_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define GPTR(T, base, off) ((__global T *)((base) + (off)))
"""

# {T}: element type, {NAME}: dtype name, {EXPR}: expression of x and y
_BINARY = r"""
__kernel void {OP}_{NAME}(__global char *out, ulong out_off,
                         __global const char *a, ulong a_off,
                         __global const char *b, ulong b_off, ulong n)
{{
    __global {T} *o = GPTR({T}, out, out_off);
    __global const {T} *pa = (__global const {T} *)(a + a_off);
    __global const {T} *pb = (__global const {T} *)(b + b_off);
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0)) {{
        {T} x = pa[i];
        {T} y = pb[i];
        o[i] = {EXPR};
    }}
}}
"""

_FILL = r"""
__kernel void fill_{NAME}(__global char *out, ulong out_off, {T} value, ulong n)
{{
    __global {T} *o = GPTR({T}, out, out_off);
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0))
        o[i] = value;
}}
"""

_CAST = r"""
__kernel void cast_{SNAME}_to_{DNAME}(__global char *out, ulong out_off,
                                     __global const char *x, ulong x_off, ulong n)
{{
    __global {D} *o = GPTR({D}, out, out_off);
    __global const {S} *px = (__global const {S} *)(x + x_off);
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0))
        o[i] = ({D})px[i];
}}
"""

# One pass of a tree reduction: every work-group writes its partial sum to
# out[group]. Run twice (many groups, then one) for a full sum.
_SUM = r"""
__kernel void sum_{NAME}(__global char *out, ulong out_off,
                        __global const char *x, ulong x_off, ulong n,
                        __local {T} *scratch)
{{
    __global {T} *o = GPTR({T}, out, out_off);
    __global const {T} *px = (__global const {T} *)(x + x_off);
    size_t lid = get_local_id(0);
    {T} acc = 0;
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0))
        acc = {ADD(acc, px[i])};
    scratch[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (size_t s = get_local_size(0) / 2; s > 0; s >>= 1) {{
        if (lid < s)
            scratch[lid] = {ADD(scratch[lid], scratch[lid + s])};
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (lid == 0)
        o[get_group_id(0)] = scratch[0];
}}
"""

# C[M,N] = A[M,K] @ B[K,N], row-major, tiles of TS x TS in local memory.
# Out-of-range elements of a tile are zero; only k >= K pads, where both
# factors are zero, so the padding adds exactly +0 to the accumulator.
_MATMUL = r"""
__kernel void matmul_{NAME}(__global char *out, ulong out_off,
                           __global const char *a, ulong a_off,
                           __global const char *b, ulong b_off,
                           ulong M, ulong K, ulong N)
{{
    __global {T} *c = GPTR({T}, out, out_off);
    __global const {T} *pa = (__global const {T} *)(a + a_off);
    __global const {T} *pb = (__global const {T} *)(b + b_off);
    __local {T} As[TS][TS];
    __local {T} Bs[TS][TS];
    size_t col = get_global_id(0), row = get_global_id(1);
    size_t lc = get_local_id(0), lr = get_local_id(1);
    {T} acc = 0;
    for (size_t t = 0; t < K; t += TS) {{
        As[lr][lc] = (row < M && t + lc < K) ? pa[row * K + t + lc] : ({T})0;
        Bs[lr][lc] = (t + lr < K && col < N) ? pb[(t + lr) * N + col] : ({T})0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k)
            acc = {MADD(acc, As[lr][k], Bs[k][lc])};
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (row < M && col < N)
        c[row * N + col] = acc;
}}
"""


def _int_binary_expr(op: str, t: str, u: str) -> str:
    if op == "add":
        return f"({t})(({u})x + ({u})y)"
    if op == "sub":
        return f"({t})(({u})x - ({u})y)"
    if op == "mul":
        return f"({t})(({u})x * ({u})y)"
    # floor division with NumPy's edge cases
    return (f"(y == 0) ? ({t})0 : (y == -1) ? ({t})(({u})0 - ({u})x) : "
            f"(({t})(x / y) - ((x % y != 0) && ((x < 0) != (y < 0)) ? 1 : 0))")


def _float_binary_expr(op: str) -> str:
    return {"add": "x + y", "sub": "x - y", "mul": "x * y", "div": "x / y"}[op]


def dtypes_for(fp64: bool) -> tuple[str, ...]:
    return tuple(name for name in CTYPES if fp64 or name != "float64")


def build_source(fp64: bool) -> str:
    """The whole program for a device (with or without ``double`` support)."""
    parts = [_HEADER]
    names = dtypes_for(fp64)
    for name in names:
        t, u = CTYPES[name]
        for op in BINARY_OPS:
            expr = _float_binary_expr(op) if u is None else _int_binary_expr(op, t, u)
            parts.append(_BINARY.format(OP=op, NAME=name, T=t, EXPR=expr))
        parts.append(_FILL.format(NAME=name, T=t))
        if u is None:
            add = "{0} + {1}"
            madd = "{0} + {1} * {2}"
        else:
            add = f"({t})(({u}){{0}} + ({u}){{1}})"
            madd = f"({t})(({u}){{0}} + ({u}){{1}} * ({u}){{2}})"
        sum_src = _SUM.replace("{ADD(acc, px[i])}", add.format("acc", "px[i]"))
        sum_src = sum_src.replace("{ADD(scratch[lid], scratch[lid + s])}",
                                  add.format("scratch[lid]", "scratch[lid + s]"))
        parts.append(sum_src.format(NAME=name, T=t))
        mm_src = _MATMUL.replace("{MADD(acc, As[lr][k], Bs[k][lc])}",
                                 madd.format("acc", "As[lr][k]", "Bs[k][lc]"))
        parts.append(mm_src.format(NAME=name, T=t))
        for dname in names:
            if dname != name:
                parts.append(_CAST.format(SNAME=name, DNAME=dname, S=t, D=CTYPES[dname][0]))
    return "\n".join(parts)
