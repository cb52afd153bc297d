/*
 * @name@'s internal header: what the files of src/ share. Each file is compiled on its own and
 * linked into lib@name@.so:
 *   - @name@.c: the devices, their memory, streams and events, and anychip_plugin_init, which
 *     fills the plugin table (the library's one exported symbol);
 *   - kernels.c: the tensor kernels and their table, KERNELS;
@{collectives
 *   - collectives.c: the collective entries (set_collectives) and the stand-in library.
@}
 * Nothing declared here leaves the library (the visibility pragma below).
 */
#ifndef @NAME@_H
#define @NAME@_H

#include <anychip/plugin.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#pragma GCC visibility push(hidden)

/* ---- status codes (the plugin's own; error_string in @name@.c names them) ------------------ */
enum {
    S_OK = 0,
    S_INVALID = 1,          /* a bad argument */
    S_NO_MEMORY = 2,        /* the device is out of memory */
    S_BAD_POINTER = 3,      /* not memory of this device */
    S_NOT_READY = 4,        /* work still pending (stream_query / event_query) */
    S_BAD_DEVICE = 5,       /* no such device */
    S_SYSTEM = 6,           /* the host refused a thread, a lock or memory */
@{collectives
    S_TIMEOUT = 7,          /* a collective's peer did not answer in time (timeout_status) */
    S_PEER = 8,             /* a collective's peer exited, or called another op */
    S_ABORTED = 9,          /* the communicator was aborted */
@}
};

/* returns s, keeping the message as this thread's last error (get_last_error) */
anychip_status fail(anychip_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* a variable's value when it is a number in [lo, hi], else dflt */
long env_long(const char *name, long dflt, long lo, long hi);

/* ---- devices and their memory (@name@.c) ------------------------------------------------- */
#define MAX_DEVICES 64

typedef struct { uintptr_t base; size_t size; } allocation;

typedef struct device {
    pthread_mutex_t lock;
    size_t capacity, used;
    allocation *allocs;                 /* live allocations, unordered */
    size_t nallocs, cap;
    struct anychip_stream_s *streams;   /* live streams (device_synchronize) */
} device;

extern int ndevices;
device *get_device(int d);                                 /* NULL: no such device */
int valid_range(device *dev, const void *p, size_t n);     /* [p, p + n) in one live allocation */

#define DEVICE(var, d) \
    device *var = get_device(d); \
    if (!var) return fail(S_BAD_DEVICE, "device %d does not exist (there are %d)", (d), ndevices)

/* ---- streams: a worker thread running queued tasks in order (@name@.c) ------------------- */
typedef enum { T_COPY, T_FILL, T_RECORD, T_WAIT, T_KERNEL, T_HOST } task_kind;

struct kernel_call;                               /* a tensor kernel's arguments (kernels.c) */

typedef struct task {
    task_kind kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    anychip_event event;
    uint64_t generation;
    struct kernel_call *kernel;
    void (*host)(void *);       /* T_HOST: a function the worker calls, in order with the rest */
    void *arg;
    struct task *next;
} task;

struct anychip_stream_s {
    int device;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    task *head, *tail;
    uint64_t enqueued, completed;
    int stop;
    struct anychip_stream_s *next;      /* in the device's list */
};

anychip_status enqueue(anychip_stream s, task tmpl);      /* a copy of tmpl onto the stream */
anychip_status enqueue_event_task(anychip_stream s, task tmpl);  /* the same for a record or wait */
anychip_status copy_async(int d, void *dst, const void *src, size_t n, anychip_copy_kind kind, anychip_stream s);

/* ---- events (@name@.c) -------------------------------------------------------------------- */
struct anychip_event_s {
    int device;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t recorded;          /* generation of the last record */
    uint64_t completed;         /* generation the stream has reached */
    struct timespec when;       /* when the last completed record ran */
    int refs;                   /* the handle's, and one per queued record / wait */
};

/* drops one reference: the handle's (event_destroy) or a queued record's / wait's, which hold
 * the event until they have run; the last one frees it */
void event_release(struct anychip_event_s *e);

/* ---- tensor kernels (kernels.c) ---------------------------------------------------------- */
extern const anychip_kernels KERNELS;
void run_kernel(struct kernel_call *call);      /* on the stream's worker: runs it, then frees it */
extern const int64_t ITEM[ANYCHIP_BOOL + 1];    /* bytes of an element, in anychip_dtype order */
@{collectives
/* out = in[0] op in[1] op ... op in[n - 1], elementwise, as the kernels compute (the stand-in library's
 * reductions of float16, bfloat16 and averages) */
void reduce_elements(char *out, char *const *in, int n, size_t count, anychip_dtype t, anychip_binary_op op,
                     int average);

/* ---- collectives (collectives.c) --------------------------------------------------------- */
void set_collectives(anychip_plugin *p);
@}

#pragma GCC visibility pop

#endif
