/*
 * BKCL (Baidu Kunlun Communication Library, libbkcl.so), as called by Paddle and
 * other public call sites. BKCL's header is not public: the function names, argument
 * orders and enumerator names below are those the call sites use; the enum VALUES,
 * BKCL_UNIQUE_ID_BYTES and the exact parameter types are anychip's own choice (a
 * program built against the real bkcl.h must be rebuilt against the real library).
 *
 * Note the argument orders that differ from NCCL: the context comes first;
 * bkcl_all_gather and bkcl_all_to_all put the count before the receive buffer;
 * bkcl_send / bkcl_recv put the peer before the data type. BKCL has no int8 type
 * and no average reduce op.
 */
#ifndef ANYCHIP_BKCL_H
#define ANYCHIP_BKCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ANYCHIP-CDEF-BEGIN */
typedef void *XPUStream;

typedef enum {
    BKCL_SUCCESS = 0,
    BKCL_INVALID_ARGUMENT = 1,
    BKCL_RUNTIME_ERROR = 2,
    BKCL_SYSTEM_ERROR = 3,
    BKCL_INTERNAL_ERROR = 4
} BKCLResult_t;

typedef enum {
    BKCL_FLOAT = 0,
    BKCL_FLOAT16 = 1,
    BKCL_BFLOAT16 = 2,
    BKCL_FLOAT64 = 3,
    BKCL_UINT8 = 4,
    BKCL_INT32 = 5,
    BKCL_INT64 = 6
} BKCLDataType;

typedef enum {
    BKCL_ADD = 0,
    BKCL_PRODUCT = 1,
    BKCL_MIN = 2,
    BKCL_MAX = 3,
    BKCL_NUM_OPS = 4
} BKCLOp;

#define BKCL_UNIQUE_ID_BYTES 512
typedef struct {
    char internal[BKCL_UNIQUE_ID_BYTES];
} BKCLUniqueId;

typedef struct BKCLContext *BKCLContext_t;

BKCLResult_t bkcl_get_unique_id(BKCLUniqueId *uid);
BKCLResult_t bkcl_init_rank(BKCLContext_t *ctx, int rank, int nranks, const BKCLUniqueId *uid);
BKCLResult_t bkcl_destroy_context(BKCLContext_t ctx);
BKCLResult_t bkcl_comm_abort(BKCLContext_t ctx);
BKCLResult_t bkcl_comm_count(const BKCLContext_t ctx, int *count);
BKCLResult_t bkcl_comm_user_rank(const BKCLContext_t ctx, int *rank);

BKCLResult_t bkcl_all_reduce(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t count,
                             BKCLDataType datatype, BKCLOp op, XPUStream stream);
BKCLResult_t bkcl_broadcast(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t count,
                            BKCLDataType datatype, int root, XPUStream stream);
BKCLResult_t bkcl_reduce(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t count, BKCLDataType datatype,
                         BKCLOp op, int root, XPUStream stream);
BKCLResult_t bkcl_all_gather(BKCLContext_t ctx, const void *sendbuf, size_t sendcount, void *recvbuf,
                             BKCLDataType datatype, XPUStream stream);
BKCLResult_t bkcl_reduce_scatter(BKCLContext_t ctx, const void *sendbuf, void *recvbuf, size_t recvcount,
                                 BKCLDataType datatype, BKCLOp op, XPUStream stream);
BKCLResult_t bkcl_all_to_all(BKCLContext_t ctx, const void *sendbuf, size_t count, void *recvbuf,
                             BKCLDataType datatype, XPUStream stream);
/* unequal splits: counts and displacements in elements, one size_t per rank, in device
 * memory (as Paddle's AllToAllUnequalSplit passes them) */
BKCLResult_t bkcl_all_to_all_v(BKCLContext_t ctx, const void *sendbuf, const size_t *send_counts,
                               const size_t *send_displs, BKCLDataType send_type, void *recvbuf,
                               const size_t *recv_counts, const size_t *recv_displs, BKCLDataType recv_type,
                               XPUStream stream);
BKCLResult_t bkcl_send(BKCLContext_t ctx, const void *sendbuf, size_t count, int peer, BKCLDataType datatype,
                       XPUStream stream);
BKCLResult_t bkcl_recv(BKCLContext_t ctx, void *recvbuf, size_t count, int peer, BKCLDataType datatype,
                       XPUStream stream);
BKCLResult_t bkcl_group_start(void);
BKCLResult_t bkcl_group_end(void);

/* anychip simulator only (not a BKCL call): the first failure of work enqueued on
 * `ctx` (BKCL_SUCCESS when none), since BKCL publishes no such call. */
BKCLResult_t anychip_sim_bkcl_async_error(BKCLContext_t ctx, BKCLResult_t *error);

/* ANYCHIP-CDEF-END */

#ifdef __cplusplus
}
#endif
#endif /* ANYCHIP_BKCL_H */
