/*
 * What the anychip/plugin.h adapters over vendor APIs (acl/, xpu/, hip/) share: the calling
 * thread's pending error detail, the "make the device current" prologue of every entry, the
 * status check, every entry whose logic is the same over any API (the device count, memory,
 * copies, streams, events, the collectives), and the part of the table every adapter fills
 * the same way. An adapter keeps its API's calls and what is its own.
 *
 * An adapter defines, before including this header:
 *   ADAPTER_OK, ADAPTER_INVALID, ADAPTER_NO_DEVICE   its API's success, invalid-argument (also
 *                               a refused kernel's) and "no device" (a count of 0) statuses
 *   ADAPTER_GET_DEVICE(int *d)  the calling thread's current device, returning a status
 *   ADAPTER_SET_DEVICE(int d)   makes d current for the calling thread, returning a status
 *   ADAPTER_STREAM, ADAPTER_EVENT, ADAPTER_COMM      its API's stream, event and communicator types
 *   ADAPTER_DTYPE, ADAPTER_REDOP                     its collectives' data type and reduce op types
 *   KINDS[]                     its API's copy kinds for H2D, D2H and D2D, in plugin.h's order
 * and ADAPTER_<ENTRY>, its API's call behind each plugin.h entry this header writes, taking
 * the API's own types (the entry makes the device current, casts the handles, checks a copy's
 * kind, makes no call for zero bytes, and turns a collective's dtype and op into the API's):
 *   ADAPTER_DEVICE_COUNT(int *n)
 *   ADAPTER_MEM_ALLOC(void **ptr, size_t nbytes), ADAPTER_MEM_FREE(ptr)
 *   ADAPTER_COPY(dst, src, nbytes, kind), ADAPTER_COPY_ASYNC(dst, src, nbytes, kind, stream)
 *   ADAPTER_STREAM_CREATE(ADAPTER_STREAM *), ADAPTER_STREAM_DESTROY(s), ADAPTER_STREAM_SYNCHRONIZE(s),
 *   ADAPTER_STREAM_WAIT_EVENT(s, e)
 *   ADAPTER_EVENT_CREATE(ADAPTER_EVENT *), ADAPTER_EVENT_DESTROY(e), ADAPTER_EVENT_RECORD(e, s),
 *   ADAPTER_EVENT_SYNCHRONIZE(e), ADAPTER_EVENT_QUERY(e)
 *   ADAPTER_ALL_REDUCE(send, recv, count, type, op, comm, stream), ADAPTER_BROADCAST(send, recv,
 *   count, type, root, comm, stream), ADAPTER_REDUCE(send, recv, count, type, op, root, comm,
 *   stream), ADAPTER_ALL_GATHER(send, recv, send_count, type, comm, stream),
 *   ADAPTER_REDUCE_SCATTER(send, recv, recv_count, type, op, comm, stream),
 *   ADAPTER_ALL_TO_ALL(send, recv, count, type, comm, stream), ADAPTER_SEND(buf, count, type,
 *   peer, comm, stream), ADAPTER_RECV(buf, count, type, peer, comm, stream)
 *   ADAPTER_UNIQUE_ID (its unique id / root info type, whose bytes are `internal`),
 *   ADAPTER_GET_UNIQUE_ID(ADAPTER_UNIQUE_ID *), ADAPTER_COMM_INIT_RANK(ADAPTER_COMM *, nranks,
 *   const ADAPTER_UNIQUE_ID *, rank), ADAPTER_COMM_DESTROY(comm)
 *   ADAPTER_CCL_INVALID, ADAPTER_CCL_INTERNAL   its collective library's invalid-argument and
 *                               internal-error statuses
 * and, where the API has them (the optional entries are filled in only then):
 *   ADAPTER_DEVICE_SYNCHRONIZE(), ADAPTER_FILL(dst, value, nbytes),
 *   ADAPTER_FILL_ASYNC(dst, value, nbytes, stream), ADAPTER_STREAM_QUERY(s),
 *   ADAPTER_EVENT_ELAPSED_MS(float *ms, start, end)
 * After it, the adapter writes the entries declared below (static, with plugin.h's signatures)
 * and ccl_dtype / ccl_redop; its anychip_plugin_init calls adapter_fill() and then sets what is
 * its own (status codes, the other optional entries, the collective masks).
 *
 * Only the vendor's headers and anychip/plugin.h are needed: built with ANYCHIP_SIMULATOR the
 * adapter is compiled into the simulator library and also offers the simulator's tensor
 * kernels (csrc/sim/plugin_kernels.h); without it, it builds against the real SDK (README.md).
 */
#ifndef ANYCHIP_ADAPTERS_COMMON_H
#define ANYCHIP_ADAPTERS_COMMON_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "anychip/plugin.h"

#if !defined(ADAPTER_OK) || !defined(ADAPTER_INVALID) || !defined(ADAPTER_GET_DEVICE) || !defined(ADAPTER_SET_DEVICE) \
    || !defined(ADAPTER_STREAM) || !defined(ADAPTER_EVENT) || !defined(ADAPTER_COMM) || !defined(ADAPTER_DTYPE)
#error "define the API's statuses, device calls and handle types before adapters/common.h (see its top)"
#endif

static __thread int t_set;            /* this thread has made a device current through the adapter */
static __thread char t_error[512];    /* the detail of this thread's last refusal, until read */

/* keep a refusal's detail for get_last_error */
__attribute__((format(printf, 1, 2))) static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_error, sizeof t_error, fmt, ap);
    va_end(ap);
}

/* refuse with `code` (in sight of the caller's checks), keeping a detail for get_last_error */
#define fail(code, ...) (note(__VA_ARGS__), (anychip_status)(code))

/* the detail fail() kept, once (NULL when there is none): the start of every last_error */
static const char *pending_error(void)
{
    static __thread char copy[sizeof t_error];
    if (!t_error[0])
        return NULL;
    memcpy(copy, t_error, sizeof copy);
    t_error[0] = 0;
    return copy;
}

static anychip_status use(int device)
{
    /* The library's current device is the thread's, shared with every other caller of the
     * library in the process (anychip's runtime, the application): one may have changed it
     * since the adapter last set it, so the library is asked, not a copy of our own kept.
     * (Before this thread's first set, the library is not asked: ACL fails without one.) */
    int current = -1;
    if (t_set && ADAPTER_GET_DEVICE(&current) == ADAPTER_OK && current == device)
        return ADAPTER_OK;
    anychip_status rc = (anychip_status)ADAPTER_SET_DEVICE(device);
    if (rc == ADAPTER_OK)
        t_set = 1;
    return rc;
}

/* every entry on a device starts with it */
#define USE(device)                                  \
    do {                                             \
        anychip_status rc_ = use(device);            \
        if (rc_ != ADAPTER_OK)                       \
            return rc_;                              \
    } while (0)

#define CHECK(expr)                                  \
    do {                                             \
        anychip_status rc_ = (expr);                 \
        if (rc_ != 0)                                \
            return rc_;                              \
    } while (0)

/* plugin.h's copy kinds index the adapter's KINDS: anything past D2D is refused */
#define CHECK_COPY_KIND(kind, entry)                                                                        \
    do {                                                                                                    \
        if ((unsigned)(kind) > ANYCHIP_COPY_D2D)                                                            \
            return fail(ADAPTER_INVALID, "%s: kind %d is not H2D (0), D2H (1) or D2D (2)", entry, (int)(kind)); \
    } while (0)

/* ---- the entries each adapter writes ------------------------------------------------------ */

static const char *error_string(anychip_status status);
static const char *last_error(void);
static anychip_status device_name(int device, char *name, size_t len);
static anychip_status mem_info(int device, size_t *free_bytes, size_t *total);
static anychip_status copy_peer(int dst_device, void *dst, int src_device, const void *src, size_t nbytes,
                                anychip_stream stream);
static anychip_status comm_destroy(anychip_comm comm);
static anychip_status group_start(void);
static anychip_status group_end(void);
/* plugin.h's dtype and op as the API's, refusing (with fail) what it lacks */
static anychip_status ccl_dtype(anychip_dtype dtype, ADAPTER_DTYPE *out);
static anychip_status ccl_redop(anychip_redop op, ADAPTER_REDOP *out);

/* ---- the entries that are one call of the API ------------------------------------------- */

#define STREAM(stream) ((ADAPTER_STREAM)(stream))
#define EVENT(event) ((ADAPTER_EVENT)(event))

/* the body of an entry on a device: make it current, then return the API's call */
#define ON_DEVICE(device, call)                      \
    {                                                \
        USE(device);                                 \
        return (call);                               \
    }

static anychip_status set_device(int device) { return use(device); }

static anychip_status device_count(int *count)
{
    *count = 0;
    anychip_status rc = ADAPTER_DEVICE_COUNT(count);
    if (rc == ADAPTER_NO_DEVICE) {     /* no device is a count of 0, not a failure */
        *count = 0;
        return ADAPTER_OK;
    }
    return rc;
}

static anychip_status mem_alloc(int device, size_t nbytes, void **ptr)
    ON_DEVICE(device, ADAPTER_MEM_ALLOC(ptr, nbytes))
static anychip_status mem_free(int device, void *ptr)
    ON_DEVICE(device, ADAPTER_MEM_FREE(ptr))

/* (a copy or fill of zero bytes makes no call) */
static anychip_status copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind)
{
    USE(device);
    CHECK_COPY_KIND(kind, "copy");
    return nbytes ? ADAPTER_COPY(dst, src, nbytes, KINDS[kind]) : ADAPTER_OK;
}

static anychip_status copy_async(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind,
                                 anychip_stream stream)
{
    USE(device);
    CHECK_COPY_KIND(kind, "copy_async");
    return nbytes ? ADAPTER_COPY_ASYNC(dst, src, nbytes, KINDS[kind], STREAM(stream)) : ADAPTER_OK;
}

static anychip_status stream_create(int device, anychip_stream *stream)
    ON_DEVICE(device, ADAPTER_STREAM_CREATE((ADAPTER_STREAM *)stream))
static anychip_status stream_destroy(int device, anychip_stream stream)
    ON_DEVICE(device, ADAPTER_STREAM_DESTROY(STREAM(stream)))
static anychip_status stream_synchronize(int device, anychip_stream stream)
    ON_DEVICE(device, ADAPTER_STREAM_SYNCHRONIZE(STREAM(stream)))
static anychip_status stream_wait_event(int device, anychip_stream stream, anychip_event event)
    ON_DEVICE(device, ADAPTER_STREAM_WAIT_EVENT(STREAM(stream), EVENT(event)))

static anychip_status event_create(int device, anychip_event *event)
    ON_DEVICE(device, ADAPTER_EVENT_CREATE((ADAPTER_EVENT *)event))
static anychip_status event_destroy(int device, anychip_event event)
    ON_DEVICE(device, ADAPTER_EVENT_DESTROY(EVENT(event)))
static anychip_status event_record(int device, anychip_event event, anychip_stream stream)
    ON_DEVICE(device, ADAPTER_EVENT_RECORD(EVENT(event), STREAM(stream)))
static anychip_status event_synchronize(int device, anychip_event event)
    ON_DEVICE(device, ADAPTER_EVENT_SYNCHRONIZE(EVENT(event)))
static anychip_status event_query(int device, anychip_event event)
    ON_DEVICE(device, ADAPTER_EVENT_QUERY(EVENT(event)))

/* the optional ones, where the API has them: OPTIONAL_<ENTRY> is the entry, or NULL (anychip's
 * fallback serves) */
#ifdef ADAPTER_DEVICE_SYNCHRONIZE
static anychip_status device_synchronize(int device)
    ON_DEVICE(device, ADAPTER_DEVICE_SYNCHRONIZE())
#define OPTIONAL_DEVICE_SYNCHRONIZE device_synchronize
#else
#define OPTIONAL_DEVICE_SYNCHRONIZE NULL
#endif
#ifdef ADAPTER_FILL
static anychip_status fill(int device, void *dst, int value, size_t nbytes)
    ON_DEVICE(device, nbytes ? ADAPTER_FILL(dst, value, nbytes) : ADAPTER_OK)
#define OPTIONAL_FILL fill
#else
#define OPTIONAL_FILL NULL
#endif
#ifdef ADAPTER_FILL_ASYNC
static anychip_status fill_async(int device, void *dst, int value, size_t nbytes, anychip_stream stream)
    ON_DEVICE(device, nbytes ? ADAPTER_FILL_ASYNC(dst, value, nbytes, STREAM(stream)) : ADAPTER_OK)
#define OPTIONAL_FILL_ASYNC fill_async
#else
#define OPTIONAL_FILL_ASYNC NULL
#endif
#ifdef ADAPTER_STREAM_QUERY
static anychip_status stream_query(int device, anychip_stream stream)
    ON_DEVICE(device, ADAPTER_STREAM_QUERY(STREAM(stream)))
#define OPTIONAL_STREAM_QUERY stream_query
#else
#define OPTIONAL_STREAM_QUERY NULL
#endif
#ifdef ADAPTER_EVENT_ELAPSED_MS
static anychip_status event_elapsed_ms(int device, float *ms, anychip_event start, anychip_event end)
    ON_DEVICE(device, ADAPTER_EVENT_ELAPSED_MS(ms, EVENT(start), EVENT(end)))
#define OPTIONAL_EVENT_ELAPSED_MS event_elapsed_ms
#else
#define OPTIONAL_EVENT_ELAPSED_MS NULL
#endif

/* ---- the communicator: its id (anychip_unique_id holds the API's, whose bytes past it must
 * be zero) and its creation -------------------------------------------------------------------- */

#define COMM(comm) ((ADAPTER_COMM)(comm))

static anychip_status get_unique_id(anychip_unique_id *id)
{
    ADAPTER_UNIQUE_ID uid;
    memset(&uid, 0, sizeof uid);
    CHECK(ADAPTER_GET_UNIQUE_ID(&uid));
    _Static_assert(sizeof uid.internal >= sizeof id->internal, "the API's id is at least anychip_unique_id");
    for (size_t i = sizeof id->internal; i < sizeof uid.internal; i++)
        if (uid.internal[i])
            return fail(ADAPTER_CCL_INTERNAL, "get_unique_id: the library's id uses more than the %zu bytes of "
                                              "anychip_unique_id", sizeof id->internal);
    memcpy(id->internal, uid.internal, sizeof id->internal);
    return 0;
}

static anychip_status comm_init_rank(int device, int nranks, const anychip_unique_id *id, int rank,
                                     anychip_comm *comm)
{
    USE(device);
    ADAPTER_UNIQUE_ID uid;
    memset(&uid, 0, sizeof uid);
    memcpy(uid.internal, id->internal, sizeof id->internal);
    return ADAPTER_COMM_INIT_RANK((ADAPTER_COMM *)comm, nranks, &uid, rank);
}

/* plugin.h minor 3: no vendor collective library takes a timeout per communicator (HCCL's
 * HCCL_EXEC_TIMEOUT is the process's; BKCL, RCCL and NCCL's ncclConfig_t have none), so built
 * for the vendor's library the entry stays unset and anychip's watchdog applies a group's
 * timeout. Over the simulator's HCCL / BKCL / RCCL the communicator gets its own through
 * anychip_sim_ccl_init_timeout (anychip's extension, not a vendor call). */
#ifdef ANYCHIP_SIMULATOR
static anychip_status comm_init_rank_timeout(int device, int nranks, const anychip_unique_id *id, int rank,
                                             double timeout_s, anychip_comm *comm)
{
    if (!(timeout_s > 0))
        return fail(ADAPTER_CCL_INVALID, "comm_init_rank_timeout: timeout_s=%g; want seconds > 0", timeout_s);
    /* the init itself waits this long for the peers to join, and the communicator keeps it */
    if (anychip_sim_ccl_init_timeout(timeout_s) != 0)
        return fail(ADAPTER_CCL_INVALID, "comm_init_rank_timeout: %s", anychip_sim_last_error());
    anychip_status rc = comm_init_rank(device, nranks, id, rank, comm);
    anychip_sim_ccl_init_timeout(0);
    return rc;
}
#define OPTIONAL_COMM_INIT_RANK_TIMEOUT comm_init_rank_timeout
#else
#define OPTIONAL_COMM_INIT_RANK_TIMEOUT NULL
#endif

/* ---- the collectives: plugin.h's dtype and op as the API's, then its call -------------------- */

/* a reducing collective's dtype and op as the API's */
typedef struct ccl_types {
    ADAPTER_DTYPE type;
    ADAPTER_REDOP op;
} ccl_types;

static anychip_status ccl_types_of(anychip_dtype dtype, anychip_redop op, ccl_types *out)
{
    anychip_status rc = ccl_dtype(dtype, &out->type);
    return rc != 0 ? rc : ccl_redop(op, &out->op);
}

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    ccl_types a;
    CHECK(ccl_types_of(dtype, op, &a));
    return ADAPTER_ALL_REDUCE(send, recv, count, a.type, a.op, COMM(comm), STREAM(stream));
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype dtype, int root,
                                anychip_comm comm, anychip_stream stream)
{
    ADAPTER_DTYPE t;
    CHECK(ccl_dtype(dtype, &t));
    return ADAPTER_BROADCAST(send, recv, count, t, root, COMM(comm), STREAM(stream));
}

static anychip_status reduce(const void *send, void *recv, size_t count, anychip_dtype dtype, anychip_redop op,
                             int root, anychip_comm comm, anychip_stream stream)
{
    ccl_types a;
    CHECK(ccl_types_of(dtype, op, &a));
    return ADAPTER_REDUCE(send, recv, count, a.type, a.op, root, COMM(comm), STREAM(stream));
}

static anychip_status all_gather(const void *send, void *recv, size_t send_count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    ADAPTER_DTYPE t;
    CHECK(ccl_dtype(dtype, &t));
    return ADAPTER_ALL_GATHER(send, recv, send_count, t, COMM(comm), STREAM(stream));
}

static anychip_status reduce_scatter(const void *send, void *recv, size_t recv_count, anychip_dtype dtype,
                                     anychip_redop op, anychip_comm comm, anychip_stream stream)
{
    ccl_types a;
    CHECK(ccl_types_of(dtype, op, &a));
    return ADAPTER_REDUCE_SCATTER(send, recv, recv_count, a.type, a.op, COMM(comm), STREAM(stream));
}

static anychip_status all_to_all(const void *send, void *recv, size_t count, anychip_dtype dtype,
                                 anychip_comm comm, anychip_stream stream)
{
    ADAPTER_DTYPE t;
    CHECK(ccl_dtype(dtype, &t));
    return ADAPTER_ALL_TO_ALL(send, recv, count, t, COMM(comm), STREAM(stream));
}

static anychip_status send(const void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    ADAPTER_DTYPE t;
    CHECK(ccl_dtype(dtype, &t));
    return ADAPTER_SEND(buf, count, t, peer, COMM(comm), STREAM(stream));
}

static anychip_status recv(void *buf, size_t count, anychip_dtype dtype, int peer, anychip_comm comm,
                           anychip_stream stream)
{
    ADAPTER_DTYPE t;
    CHECK(ccl_dtype(dtype, &t));
    return ADAPTER_RECV(buf, count, t, peer, COMM(comm), STREAM(stream));
}

#ifdef ANYCHIP_SIMULATOR
#define KERNEL_FAILED ADAPTER_INVALID
#include "sim/plugin_kernels.h"       /* the simulator's tensor kernels as plugin.h's kernel table */
#endif

/* plugin.h's version, the adapter's names and the entries above, in plugin.h's order;
 * ADAPTER_INVALID when the caller's table is older (smaller) than this header's */
static anychip_status adapter_fill(anychip_plugin *p, const char *device_type, const char *version)
{
    if (p->struct_size < sizeof *p)
        return ADAPTER_INVALID;
    p->major = ANYCHIP_PLUGIN_API_MAJOR;
    p->minor = ANYCHIP_PLUGIN_API_MINOR;
    snprintf(p->device_type, sizeof p->device_type, "%s", device_type);
    p->plugin_version = version;
#ifdef ANYCHIP_SIMULATOR
    p->flags = ANYCHIP_PLUGIN_SIMULATED | ANYCHIP_PLUGIN_HOST_MEMORY;   /* the simulator's arenas are mmap()ed host memory */
    p->kernels = &SIM_KERNELS;
#endif
    p->get_error_string = error_string;
    p->get_last_error = last_error;
    p->device_count = device_count;
    p->set_device = set_device;
    p->device_name = device_name;
    p->mem_info = mem_info;
    p->device_synchronize = OPTIONAL_DEVICE_SYNCHRONIZE;
    p->mem_alloc = mem_alloc;
    p->mem_free = mem_free;
    p->copy = copy;
    p->copy_async = copy_async;
    p->copy_peer = copy_peer;
    p->fill = OPTIONAL_FILL;
    p->fill_async = OPTIONAL_FILL_ASYNC;
    p->stream_create = stream_create;
    p->stream_destroy = stream_destroy;
    p->stream_synchronize = stream_synchronize;
    p->stream_query = OPTIONAL_STREAM_QUERY;
    p->stream_wait_event = stream_wait_event;
    p->event_create = event_create;
    p->event_destroy = event_destroy;
    p->event_record = event_record;
    p->event_synchronize = event_synchronize;
    p->event_query = event_query;
    p->event_elapsed_ms = OPTIONAL_EVENT_ELAPSED_MS;
    p->get_unique_id = get_unique_id;
    p->comm_init_rank = comm_init_rank;
    p->comm_init_rank_timeout = OPTIONAL_COMM_INIT_RANK_TIMEOUT;
    p->comm_destroy = comm_destroy;
    p->all_reduce = all_reduce;
    p->broadcast = broadcast;
    p->reduce = reduce;
    p->all_gather = all_gather;
    p->reduce_scatter = reduce_scatter;
    p->all_to_all = all_to_all;
    p->send = send;
    p->recv = recv;
    p->group_start = group_start;
    p->group_end = group_end;
    return ADAPTER_OK;
}

#endif
