/*
 * anychip/plugin.h -- the C ABI a new chip implements to become an anychip backend.
 *
 * A plugin is a shared library exporting one function:
 *
 *     anychip_status anychip_plugin_init(anychip_plugin *plugin);
 *
 * anychip allocates an anychip_plugin, zeroes it, sets `struct_size` to the size it
 * knows and calls anychip_plugin_init when it discovers the library (keep it cheap:
 * fill the table and return; open the driver lazily, e.g. in device_count). The plugin
 * sets `major` / `minor` to ANYCHIP_PLUGIN_API_MAJOR / _MINOR of the header it was built
 * with, names its device type, and fills the function pointers it implements. It returns
 * 0 on success or one of its own non-zero codes.
 *
 * Versioning (as PJRT's C API): a minor version only adds entries, taken from the
 * reserved slots, so the struct keeps its size and layout. anychip loads a plugin of the
 * same major version and any minor; a plugin of a newer major is refused with a message
 * saying so. A plugin must not write past `struct_size` (ANYCHIP_PLUGIN_HAS tells).
 *
 * Status codes are the plugin's own: 0 is success, anything else a failure. anychip
 * turns a failure into a Python exception carrying the code, the plugin's text for it
 * (get_error_string) and the detail of the calling thread's last failure
 * (get_last_error). The three *_status fields name the codes that mean "out of memory",
 * "invalid argument" and "timed out", so they become OutOfMemoryError,
 * InvalidArgumentError and CollectiveTimeout.
 *
 * REQUIRED entries (a plugin missing one is refused, naming it):
 *   device_count, mem_info, mem_alloc, mem_free, copy,
 *   stream_create, stream_destroy, stream_synchronize
 *
 * OPTIONAL entries, and what anychip does without them:
 *   set_device            device index is passed to every call anyway; nothing is called
 *   device_name           the device is called "<device_type> <index>"
 *   copy_async            the synchronous copy, ordered on the stream: anychip first
 *                         synchronizes the stream, then copies
 *   copy_peer             copies between two devices stage through host memory
 *   fill_async            fill after a stream synchronize; without fill either, a host
 *                         buffer of the byte is copied (through the copy path)
 *   stream_query          with events: record one and query it; without: stream_synchronize,
 *                         then "complete"
 *   device_synchronize    stream_synchronize on every stream anychip created on the device
 *   events (event_create, event_destroy, event_record, event_synchronize: all four or none)
 *                         the stream-synchronize fallback: recording synchronizes the stream
 *                         and takes a host timestamp; an event is complete once recorded;
 *                         waiting on it is a no-op
 *   event_query           event_synchronize, then "complete"
 *   event_elapsed_ms      elapsed time is refused (UnsupportedError)
 *   stream_wait_event     the host waits for the event (event_synchronize), then goes on
 *   get_error_string      messages show the status code only
 *   get_last_error        messages carry no per-call detail
 *   collectives           see below; without them the host transport serves (device ->
 *                         host copies, anychip's shared-memory engine or MPI, host -> device)
 *   kernels (minor 1)     see below; without them every tensor op runs on the host
 *                         (device -> host copies, the host's kernel, host -> device), in anychip's
 *                         tensor layer and in the Paddle and PyTorch providers
 *
 * COLLECTIVES (optional; NCCL-shaped). A plugin offering them sets at least
 * get_unique_id, comm_init_rank, comm_destroy and all_reduce; otherwise anychip ignores
 * the collective entries (it logs a warning
 * saying which are missing; `anychip plugin check` shows it too). Each op is enqueued on `stream`
 * and returns at once; its completion is observed with an event recorded after it, and
 * its failure through comm_get_async_error. Any single op left NULL (broadcast, reduce,
 * all_gather, reduce_scatter, all_to_all) runs on the host transport instead; send and
 * recv are used only when send, recv, group_start and group_end are all present (a
 * pair must progress together). Counts are in elements of `dtype`; anychip moves data
 * of every type as ANYCHIP_UINT8 for the ops that do not reduce. ccl_dtype_mask and
 * ccl_redop_mask say which types and reductions the reducing ops support (bit
 * 1 << value; 0 = all); the others run on the host transport. Where a library refuses only
 * some pairs (HCCL reduces bfloat16 with every op but PROD), ccl_op_dtype_masks (minor 2)
 * points to ANYCHIP_REDOP_COUNT masks, one per anychip_redop: the types that op reduces,
 * on top of the two masks. anychip_plugin_reduces() below is the rule every consumer uses.
 *
 * A communicator's timeout (minor 3, optional): comm_init_rank_timeout is comm_init_rank with
 * the seconds (> 0; 1e9 or more means never) each op of that communicator may wait for its
 * peers before it fails with timeout_status (reported, as any failure of enqueued work, by
 * comm_get_async_error and get_last_error, whose detail should name the rank waited for).
 * anychip calls it, when the plugin's minor is >= 3 and the entry is set, with the timeout of
 * the group the communicator serves (a torch.distributed group's own timeout, else the
 * default). Where ANYCHIP_COLLECTIVE_TIMEOUT is set (it overrides every group's) anychip calls
 * comm_init_rank instead, and a library with a timeout of its own takes the variable's (the
 * template does), so that its errors can name it. Without the entry, comm_init_rank, and
 * anychip's watchdog alone fails an op still running a second past the timeout (its message
 * then names no peer). Leave it
 * unset where the library has no per-communicator timeout (the vendors' HCCL, BKCL and RCCL:
 * the adapters set it only over the simulator's libraries).
 *
 * KERNELS (optional, minor version 1): five tensor primitives that anychip's tensor layer and
 * the Paddle and PyTorch providers build their device ops from (elementwise, activations,
 * casts, reductions, matmul, softmax and their gradients, optimizer steps). `kernels` points
 * to an anychip_kernels table that lives as long as the library; anychip reads it only when
 * the plugin's minor is >= 1 and the table's `version` is one it knows. Each entry is
 * enqueued on `stream` of `device` and returns at once, in order with the stream's copies and
 * collectives; a NULL entry, or a dtype whose bit (1 << anychip_dtype) is not in the entry's
 * mask, means "not on the device" (the host runs that op). Semantics, which the conformance
 * check (`anychip plugin check`) compares with NumPy:
 *   - shapes and strides are int64_t, strides in elements (0 broadcasts a dimension, negative
 *     ones are allowed), at most ANYCHIP_KERNEL_MAX_DIMS dimensions (ndim 0 is a scalar; its
 *     shape and stride pointers are not read); outputs are C-contiguous and never overlap an
 *     input; device pointers may be offset by bytes, as a framework does with a tensor view;
 *   - integer add / sub / mul / neg wrap; float16 and bfloat16 compute in float32 or wider
 *     and round to nearest even; comparisons write ANYCHIP_BOOL (one byte, 0 or 1); max / min
 *     propagate NaN; div, exp, log and sqrt take float types only; add, sub, mul, neg, relu,
 *     exp and log do not take bool;
 *   - unary COPY converts in_dtype to out_dtype as a C cast would (floats to integers truncate
 *     toward zero; to bool: nonzero is 1); the other unary ops have out_dtype == in_dtype;
 *   - reduce: x is C-contiguous of shape [outer, n, inner], out[o, i] = op over r of
 *     x[o, r, i]; sums of float types accumulate in double and round once, integer sums in
 *     int64 (wrapping); MEAN divides the sum by n; MAX propagates NaN; n == 0 gives 0 for SUM,
 *     NaN for MEAN (and is not passed for MAX);
 *   - gemm: out[m, n] (contiguous) = a[m, k] @ b[k, n], a and b strided (row and column
 *     strides: a transpose is a stride swap); float types; accumulation at least in float32;
 *   - fill: out[0:n] = the value converted to dtype: `fvalue` for float dtypes or when
 *     from_float is set, else `ivalue` (exact to 64 bits).
 *
 * Handles: device memory is a `void *` (it need not be addressable by the host);
 * streams, events and communicators are opaque pointers the plugin hands out. anychip
 * never passes a NULL stream: it creates its own default stream per device. Host
 * memory passed to a copy stays valid until the copy has completed on its stream.
 * Calls may come from any thread, several at once.
 */
#ifndef ANYCHIP_PLUGIN_H
#define ANYCHIP_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ANYCHIP_PLUGIN_API_MAJOR 1
#define ANYCHIP_PLUGIN_API_MINOR 3

/* the symbol anychip looks up */
#define ANYCHIP_PLUGIN_INIT_SYMBOL "anychip_plugin_init"

/* slots kept for entries later minor versions add (the struct size never changes; minor 1
 * took one for `kernels`, minor 2 one for `ccl_op_dtype_masks`, minor 3 one for
 * `comm_init_rank_timeout`) */
#define ANYCHIP_PLUGIN_RESERVED 32

/* longest device type name, including the terminating NUL */
#define ANYCHIP_DEVICE_TYPE_MAX 64

typedef int32_t anychip_status;           /* 0 = success; other values are the plugin's own */

typedef struct anychip_stream_s *anychip_stream;
typedef struct anychip_event_s *anychip_event;
typedef struct anychip_comm_s *anychip_comm;

typedef enum anychip_copy_kind {
    ANYCHIP_COPY_H2D = 0,                 /* src is host memory, dst device memory */
    ANYCHIP_COPY_D2H = 1,                 /* src is device memory, dst host memory */
    ANYCHIP_COPY_D2D = 2                  /* both are memory of the same device */
} anychip_copy_kind;

typedef enum anychip_dtype {
    ANYCHIP_INT8 = 0, ANYCHIP_UINT8 = 1, ANYCHIP_INT32 = 2, ANYCHIP_INT64 = 3,
    ANYCHIP_FLOAT16 = 4, ANYCHIP_BFLOAT16 = 5, ANYCHIP_FLOAT32 = 6, ANYCHIP_FLOAT64 = 7,
    ANYCHIP_BOOL = 8                      /* minor 1: kernels only (collectives move it as UINT8) */
} anychip_dtype;

typedef enum anychip_redop {
    ANYCHIP_SUM = 0, ANYCHIP_PROD = 1, ANYCHIP_MIN = 2, ANYCHIP_MAX = 3, ANYCHIP_AVG = 4
} anychip_redop;
#define ANYCHIP_REDOP_COUNT 5

/* ---- kernels (minor 1; see the top of this file) ----------------------------------------- */
#define ANYCHIP_KERNELS_VERSION 1
#define ANYCHIP_KERNEL_MAX_DIMS 16

typedef enum anychip_binary_op {
    ANYCHIP_OP_ADD = 0, ANYCHIP_OP_SUB = 1, ANYCHIP_OP_MUL = 2, ANYCHIP_OP_DIV = 3,
    ANYCHIP_OP_EQ = 4, ANYCHIP_OP_NE = 5, ANYCHIP_OP_LT = 6, ANYCHIP_OP_LE = 7,
    ANYCHIP_OP_GT = 8, ANYCHIP_OP_GE = 9, ANYCHIP_OP_MAX = 10, ANYCHIP_OP_MIN = 11
} anychip_binary_op;

typedef enum anychip_unary_op {
    ANYCHIP_OP_COPY = 0, ANYCHIP_OP_RELU = 1, ANYCHIP_OP_EXP = 2, ANYCHIP_OP_LOG = 3,
    ANYCHIP_OP_NEG = 4, ANYCHIP_OP_SQRT = 5
} anychip_unary_op;

typedef enum anychip_reduce_op {
    ANYCHIP_REDUCE_SUM = 0, ANYCHIP_REDUCE_MEAN = 1, ANYCHIP_REDUCE_MAX = 2
} anychip_reduce_op;

typedef struct anychip_kernels {
    uint32_t version;                     /* ANYCHIP_KERNELS_VERSION the plugin was built with */
    /* per entry: bit (1 << anychip_dtype) set for each dtype it takes (unary: both dtypes) */
    uint32_t binary_dtypes, unary_dtypes, reduce_dtypes, gemm_dtypes, fill_dtypes;
    /* out = a <op> b over shape (out: dtype, or ANYCHIP_BOOL for EQ..GE) */
    anychip_status (*binary)(int device, anychip_stream stream, anychip_binary_op op,
                             anychip_dtype dtype, int ndim, const int64_t *shape, void *out,
                             const void *a, const int64_t *a_strides, const void *b,
                             const int64_t *b_strides);
    /* out = op(x) over shape; COPY casts in_dtype to out_dtype */
    anychip_status (*unary)(int device, anychip_stream stream, anychip_unary_op op,
                            anychip_dtype out_dtype, anychip_dtype in_dtype, int ndim,
                            const int64_t *shape, void *out, const void *x,
                            const int64_t *x_strides);
    /* out[o, i] = op over r of x[o, r, i], x contiguous [outer, n, inner] */
    anychip_status (*reduce)(int device, anychip_stream stream, anychip_reduce_op op,
                             anychip_dtype out_dtype, anychip_dtype in_dtype, int64_t outer,
                             int64_t n, int64_t inner, void *out, const void *x);
    /* out[m, n] = a[m, k] @ b[k, n] */
    anychip_status (*gemm)(int device, anychip_stream stream, anychip_dtype dtype, int64_t m,
                           int64_t k, int64_t n, void *out, const void *a, int64_t a_stride0,
                           int64_t a_stride1, const void *b, int64_t b_stride0,
                           int64_t b_stride1);
    /* out[0:n] = value */
    anychip_status (*fill)(int device, anychip_stream stream, anychip_dtype dtype, int64_t n,
                           void *out, double fvalue, int64_t ivalue, int from_float);
} anychip_kernels;

/* flags */
#define ANYCHIP_PLUGIN_SIMULATED (1u << 0)  /* a stand-in on the host, not real hardware:
                                               listed and ordered with simulated chips */
#define ANYCHIP_PLUGIN_HOST_MEMORY (1u << 1) /* device memory is host memory: a pointer mem_alloc
                                               gives is a host address, which the host may read
                                               and write once the streams using it are done
                                               (torch.compile then runs the host's generated
                                               kernels on it; docs/torch.md) */

/* a communicator's bootstrap id: rank 0 makes it, anychip sends it to the other ranks */
#define ANYCHIP_UNIQUE_ID_BYTES 128
typedef struct anychip_unique_id {
    char internal[ANYCHIP_UNIQUE_ID_BYTES];
} anychip_unique_id;

typedef struct anychip_plugin {
    /* ---- header: set by anychip ---------------------------------------------------- */
    size_t struct_size;                   /* sizeof(anychip_plugin) as anychip knows it */
    /* ---- header: set by the plugin ----------------------------------------------------- */
    uint32_t major;                       /* ANYCHIP_PLUGIN_API_MAJOR the plugin was built with */
    uint32_t minor;                       /* ANYCHIP_PLUGIN_API_MINOR the plugin was built with */
    char device_type[ANYCHIP_DEVICE_TYPE_MAX];   /* backend name: [a-z][a-z0-9_]* ("mychip") */
    const char *plugin_version;           /* optional, free text ("1.2.0 (driver 5.1)") */
    uint32_t flags;                       /* ANYCHIP_PLUGIN_* flags */
    anychip_status oom_status;            /* code meaning "out of memory" (0: any mem_alloc failure) */
    anychip_status invalid_status;        /* code meaning "invalid argument" (0: none) */
    anychip_status timeout_status;        /* code meaning "timed out" (0: none) */

    /* ---- errors (optional) -------------------------------------------------------- */
    const char *(*get_error_string)(anychip_status status);  /* text of a code */
    const char *(*get_last_error)(void);  /* detail of this thread's last failure, or NULL */

    /* ---- devices ------------------------------------------------------------------ */
    anychip_status (*device_count)(int *count);                              /* required */
    anychip_status (*set_device)(int device);                                /* optional */
    anychip_status (*device_name)(int device, char *name, size_t len);       /* optional */
    anychip_status (*mem_info)(int device, size_t *free, size_t *total);     /* required */
    anychip_status (*device_synchronize)(int device);                        /* optional */

    /* ---- memory ------------------------------------------------------------------- */
    anychip_status (*mem_alloc)(int device, size_t nbytes, void **ptr);      /* required */
    anychip_status (*mem_free)(int device, void *ptr);                        /* required */

    /* ---- copies ------------------------------------------------------------------- */
    /* synchronous: returns when the copy is complete (required) */
    anychip_status (*copy)(int device, void *dst, const void *src, size_t nbytes,
                           anychip_copy_kind kind);
    /* enqueued on stream, returns at once (optional) */
    anychip_status (*copy_async)(int device, void *dst, const void *src, size_t nbytes,
                                 anychip_copy_kind kind, anychip_stream stream);
    /* device src_device -> device dst_device, enqueued on stream of src_device (optional) */
    anychip_status (*copy_peer)(int dst_device, void *dst, int src_device, const void *src,
                                size_t nbytes, anychip_stream stream);
    anychip_status (*fill)(int device, void *dst, int value, size_t nbytes);    /* optional */
    anychip_status (*fill_async)(int device, void *dst, int value, size_t nbytes,
                                 anychip_stream stream);                        /* optional */

    /* ---- streams ------------------------------------------------------------------ */
    anychip_status (*stream_create)(int device, anychip_stream *stream);     /* required */
    anychip_status (*stream_destroy)(int device, anychip_stream stream);     /* required */
    anychip_status (*stream_synchronize)(int device, anychip_stream stream); /* required */
    /* 0 when all its work is complete, not_ready_status when some is pending (optional) */
    anychip_status (*stream_query)(int device, anychip_stream stream);
    anychip_status (*stream_wait_event)(int device, anychip_stream stream,
                                        anychip_event event);               /* optional */

    /* ---- events (optional, all of create / destroy / record / synchronize or none) ------ */
    anychip_status (*event_create)(int device, anychip_event *event);
    anychip_status (*event_destroy)(int device, anychip_event event);
    anychip_status (*event_record)(int device, anychip_event event, anychip_stream stream);
    anychip_status (*event_synchronize)(int device, anychip_event event);
    /* 0 when the recorded work is complete, not_ready_status when pending (optional) */
    anychip_status (*event_query)(int device, anychip_event event);
    anychip_status (*event_elapsed_ms)(int device, float *ms, anychip_event start,
                                       anychip_event end);                  /* optional */
    /* what stream_query / event_query return for "not complete yet" (not a failure) */
    anychip_status not_ready_status;

    /* ---- collectives (optional, see the top of this file) ------------------------------ */
    uint32_t ccl_dtype_mask;              /* bit (1 << anychip_dtype): supported by reductions; 0 = all */
    uint32_t ccl_redop_mask;              /* bit (1 << anychip_redop): supported; 0 = all */
    anychip_status (*get_unique_id)(anychip_unique_id *id);
    anychip_status (*comm_init_rank)(int device, int nranks, const anychip_unique_id *id, int rank,
                                     anychip_comm *comm);
    anychip_status (*comm_destroy)(anychip_comm comm);
    anychip_status (*comm_abort)(anychip_comm comm);          /* optional: comm_destroy */
    /* the failure of enqueued work, 0 when none (optional: failures are not reported) */
    anychip_status (*comm_get_async_error)(anychip_comm comm, anychip_status *error);
    anychip_status (*all_reduce)(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_redop op, anychip_comm comm, anychip_stream stream);
    anychip_status (*broadcast)(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                int root, anychip_comm comm, anychip_stream stream);
    anychip_status (*reduce)(const void *send, void *recv, size_t count, anychip_dtype dtype,
                             anychip_redop op, int root, anychip_comm comm, anychip_stream stream);
    anychip_status (*all_gather)(const void *send, void *recv, size_t send_count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream);
    anychip_status (*reduce_scatter)(const void *send, void *recv, size_t recv_count,
                                     anychip_dtype dtype, anychip_redop op, anychip_comm comm,
                                     anychip_stream stream);
    anychip_status (*all_to_all)(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream);
    anychip_status (*send)(const void *send, size_t count, anychip_dtype dtype, int peer,
                           anychip_comm comm, anychip_stream stream);
    anychip_status (*recv)(void *recv, size_t count, anychip_dtype dtype, int peer,
                           anychip_comm comm, anychip_stream stream);
    anychip_status (*group_start)(void);
    anychip_status (*group_end)(void);

    /* ---- kernels (optional, minor 1, see the top of this file) ------------------------ */
    const anychip_kernels *kernels;

    /* ---- collectives, minor 2 (optional): per anychip_redop, the types it reduces; NULL = the
     * two masks decide alone (an array of ANYCHIP_REDOP_COUNT that lives as long as the library) */
    const uint32_t *ccl_op_dtype_masks;

    /* ---- collectives, minor 3 (optional): comm_init_rank whose communicator's ops wait at most
     * timeout_s seconds for their peers (see the top of this file) */
    anychip_status (*comm_init_rank_timeout)(int device, int nranks, const anychip_unique_id *id, int rank,
                                             double timeout_s, anychip_comm *comm);

    /* ---- growth ------------------------------------------------------------------- */
    void *reserved[ANYCHIP_PLUGIN_RESERVED - 3];
} anychip_plugin;

/* whether `field` lies inside the struct anychip passed (a newer plugin on an older core) */
#define ANYCHIP_PLUGIN_HAS(p, field) \
    (offsetof(anychip_plugin, field) + sizeof(((anychip_plugin *)0)->field) <= (p)->struct_size)

/* The kernel table a consumer may use (minor 1): the plugin's `kernels` when the plugin is of
 * minor 1 or later, the table's version is ANYCHIP_KERNELS_VERSION and its masks name only
 * plugin.h's dtypes; else NULL (every op then runs on the host). The Paddle bridge and the
 * PyTorch device decide through it; anychip's own loader applies the same rule. */
static inline const anychip_kernels *anychip_plugin_kernels(const anychip_plugin *p)
{
    const anychip_kernels *k = p->minor >= 1 && ANYCHIP_PLUGIN_HAS(p, kernels) ? p->kernels : NULL;
    if (!k || k->version != ANYCHIP_KERNELS_VERSION)
        return NULL;
    uint32_t used = k->binary_dtypes | k->unary_dtypes | k->reduce_dtypes | k->gemm_dtypes | k->fill_dtypes;
    return used & ~((1u << (ANYCHIP_BOOL + 1)) - 1) ? NULL : k;
}

/* Whether the plugin's collectives reduce `dtype` with `op` (else that op runs on the host
 * transport): both masks, and from minor 2 the op's own type mask. */
static inline int anychip_plugin_reduces(const anychip_plugin *p, anychip_dtype dtype, anychip_redop op)
{
    if ((unsigned)dtype > ANYCHIP_FLOAT64 || (unsigned)op >= ANYCHIP_REDOP_COUNT)
        return 0;
    if ((p->ccl_dtype_mask && !(p->ccl_dtype_mask & (1u << dtype))) ||
        (p->ccl_redop_mask && !(p->ccl_redop_mask & (1u << op))))
        return 0;
    const uint32_t *per_op = p->minor >= 2 && ANYCHIP_PLUGIN_HAS(p, ccl_op_dtype_masks) ? p->ccl_op_dtype_masks : NULL;
    return !per_op || (per_op[op] & (1u << dtype)) != 0;
}

/* The communicator init a consumer calls for a group whose ops may wait `timeout_s` seconds:
 * the plugin's comm_init_rank_timeout from minor 3, else NULL (call comm_init_rank; the
 * consumer's own watchdog then applies the timeout). */
typedef anychip_status (*anychip_comm_init_timeout_fn)(int, int, const anychip_unique_id *, int, double,
                                                       anychip_comm *);
static inline anychip_comm_init_timeout_fn anychip_plugin_comm_init_timeout(const anychip_plugin *p)
{
    return p->minor >= 3 && ANYCHIP_PLUGIN_HAS(p, comm_init_rank_timeout) ? p->comm_init_rank_timeout : NULL;
}

/* the one symbol a plugin exports */
typedef anychip_status (*anychip_plugin_init_fn)(anychip_plugin *plugin);

#if defined(__GNUC__)
#define ANYCHIP_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define ANYCHIP_PLUGIN_EXPORT
#endif

ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *plugin);

#ifdef __cplusplus
}
#endif

#endif /* ANYCHIP_PLUGIN_H */
