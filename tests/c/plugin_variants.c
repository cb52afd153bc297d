/*
 * Test plugins: the device `anychip plugin new` generates, changed in one way each.
 *
 * Built by tests/test_cplugin.py with
 *   -DTEMPLATE_SOURCE="\"<rendered project>/src/<name>.c\"" -DNAME="\"<backend name>\"" -DVARIANT_<X>
 * VARIANT_GOOD            the template as it is
 * VARIANT_NO_INIT         exports no anychip_plugin_init
 * VARIANT_MAJOR2          claims plugin ABI 2.0
 * VARIANT_MISSING         leaves the required mem_alloc and copy unset
 * VARIANT_INIT_FAIL       anychip_plugin_init fails, with a detail
 * VARIANT_EVENTS_PARTIAL  sets three of the four event entries
 * VARIANT_MINIMAL         only the required entries: every fallback of the core is used
 * VARIANT_CCL_SELF        collectives that are real for groups of one rank (refused for more)
 * VARIANT_CCL_NOOP        collectives that report success and move no data
 */
#define anychip_plugin_init template_plugin_init
#include TEMPLATE_SOURCE

#include <unistd.h>
#undef anychip_plugin_init

#if defined(VARIANT_CCL_SELF) || defined(VARIANT_CCL_NOOP)
struct anychip_comm_s { int device, nranks, rank; };

static size_t dtype_size(anychip_dtype t) {
    static const size_t sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
    return (unsigned)t < 8 ? sizes[t] : 0;
}

static anychip_status get_unique_id(anychip_unique_id *id) {
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s-%d", NAME, (int)getpid());
    return S_OK;
}

static anychip_status comm_init_rank(int d, int nranks, const anychip_unique_id *id, int rank, anychip_comm *out) {
    (void)id;
#ifdef VARIANT_CCL_SELF
    if (nranks != 1) return fail(S_INVALID, "these test collectives serve groups of one rank, not %d", nranks);
#endif
    anychip_comm c = malloc(sizeof *c);
    if (!c) return fail(S_SYSTEM, "out of host memory");
    *c = (struct anychip_comm_s){d, nranks, rank};
    *out = c;
    return S_OK;
}

static anychip_status comm_destroy(anychip_comm c) {
    free(c);
    return S_OK;
}

/* one rank: every op's result is its input (an enqueued device-to-device copy) */
static anychip_status self_copy(anychip_comm c, const void *send, void *recv, size_t bytes, anychip_stream s) {
#ifdef VARIANT_CCL_NOOP
    (void)c; (void)send; (void)recv; (void)bytes; (void)s;
    return S_OK;                                      /* success, and no data moved */
#else
    if (send == recv || bytes == 0) return S_OK;
    return copy_async(c->device, recv, send, bytes, ANYCHIP_COPY_D2D, s);
#endif
}

static anychip_status all_reduce(const void *send, void *recv, size_t count, anychip_dtype t, anychip_redop op,
                                 anychip_comm c, anychip_stream s) {
    (void)op;
    return self_copy(c, send, recv, count * dtype_size(t), s);
}

static anychip_status broadcast(const void *send, void *recv, size_t count, anychip_dtype t, int root,
                                anychip_comm c, anychip_stream s) {
    if (root != 0) return fail(S_INVALID, "broadcast: root %d of a group of one", root);
    return self_copy(c, send, recv, count * dtype_size(t), s);
}

static anychip_status all_gather(const void *send, void *recv, size_t count, anychip_dtype t, anychip_comm c,
                                 anychip_stream s) {
    return self_copy(c, send, recv, count * dtype_size(t), s);
}
#endif

ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p);

#ifndef VARIANT_NO_INIT
ANYCHIP_PLUGIN_EXPORT anychip_status anychip_plugin_init(anychip_plugin *p) {
    anychip_status rc = template_plugin_init(p);
    if (rc) return rc;
    snprintf(p->device_type, sizeof p->device_type, "%s", NAME);
#if defined(VARIANT_MAJOR2)
    p->major = 2;
    p->minor = 3;
#elif defined(VARIANT_MISSING)
    p->mem_alloc = NULL;
    p->copy = NULL;
#elif defined(VARIANT_INIT_FAIL)
    return fail(S_SYSTEM, "no %s driver: /dev/%s0 does not exist", NAME, NAME);
#elif defined(VARIANT_EVENTS_PARTIAL)
    p->event_record = NULL;
#elif defined(VARIANT_MINIMAL)
    p->set_device = NULL; p->device_name = NULL; p->device_synchronize = NULL;
    p->copy_async = NULL; p->copy_peer = NULL; p->fill = NULL; p->fill_async = NULL;
    p->stream_query = NULL; p->stream_wait_event = NULL;
    p->event_create = NULL; p->event_destroy = NULL; p->event_record = NULL; p->event_synchronize = NULL;
    p->event_query = NULL; p->event_elapsed_ms = NULL;
    p->get_error_string = NULL; p->get_last_error = NULL;
#elif defined(VARIANT_CCL_SELF) || defined(VARIANT_CCL_NOOP)
    p->get_unique_id = get_unique_id;
    p->comm_init_rank = comm_init_rank;
    p->comm_destroy = comm_destroy;
    p->all_reduce = all_reduce;
    p->broadcast = broadcast;
    p->all_gather = all_gather;
#endif
    return S_OK;
}
#endif
