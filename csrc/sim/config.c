/*
 * Configuration (ANYCHIP_SIM_* and the vendor's visibility variable), the calling
 * thread's current device, failure messages, and what happens in a forked child.
 */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_DEFAULT_DEVICES 8
#define SIM_DEFAULT_MEMORY (16ull << 30)
#define SIM_MIN_MEMORY (1ull << 20)         /* 1 MiB */
#define SIM_MAX_MEMORY (1ull << 40)         /* 1 TiB */
#define SIM_DEFAULT_SPIN_US 20
#define SIM_MAX_SPIN_US 1000000
/* A thread waiting for a stream or event spins this many times longer than a worker waiting
 * for work: a synchronize usually follows a kernel of some tens to hundreds of microseconds,
 * and a sleep costs a wake-up of about as much on a VM (CUDA's default schedule spins too). */
#define SIM_WAIT_SPIN_FACTOR 10

sim_globals G = {
    .init_lock = PTHREAD_MUTEX_INITIALIZER,
    .exec = PTHREAD_RWLOCK_INITIALIZER,
    .default_lock = PTHREAD_MUTEX_INITIALIZER,
    .reg_lock = PTHREAD_MUTEX_INITIALIZER,
    .host_lock = PTHREAD_MUTEX_INITIALIZER,
    .import_lock = PTHREAD_MUTEX_INITIALIZER,
};

__thread char t_msg[512];
static __thread int t_dev = -1;           /* current device (physical) */

unsigned anychip_sim_warned;

/* ========================================================================== */
/* errors                                                                     */
/* ========================================================================== */

static const char *const status_names[SIM_STATUS_COUNT] = {
    [SIM_OK] = "SIM_OK",
    [SIM_E_INVALID_VALUE] = "SIM_E_INVALID_VALUE",
    [SIM_E_INVALID_DEVICE] = "SIM_E_INVALID_DEVICE",
    [SIM_E_NO_DEVICE] = "SIM_E_NO_DEVICE",
    [SIM_E_NO_CONTEXT] = "SIM_E_NO_CONTEXT",
    [SIM_E_OUT_OF_MEMORY] = "SIM_E_OUT_OF_MEMORY",
    [SIM_E_HOST_ALLOC] = "SIM_E_HOST_ALLOC",
    [SIM_E_BAD_FREE] = "SIM_E_BAD_FREE",
    [SIM_E_OUT_OF_RANGE] = "SIM_E_OUT_OF_RANGE",
    [SIM_E_DIRECTION] = "SIM_E_DIRECTION",
    [SIM_E_INVALID_HANDLE] = "SIM_E_INVALID_HANDLE",
    [SIM_E_NOT_READY] = "SIM_E_NOT_READY",
    [SIM_E_NOT_RECORDED] = "SIM_E_NOT_RECORDED",
    [SIM_E_ASYNC_FAULT] = "SIM_E_ASYNC_FAULT",
    [SIM_E_NOT_SUPPORTED] = "SIM_E_NOT_SUPPORTED",
    [SIM_E_OS] = "SIM_E_OS",
    [SIM_E_BUSY] = "SIM_E_BUSY",
    [SIM_E_INVALID_STREAM] = "SIM_E_INVALID_STREAM",
    [SIM_E_TIMEOUT] = "SIM_E_TIMEOUT",
};

const char *sim_status_name(sim_status st)
{
    if ((unsigned)st < SIM_STATUS_COUNT && status_names[st])
        return status_names[st];
    return "SIM_E_UNKNOWN";
}

sim_status sim_fail(sim_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_msg, sizeof t_msg, fmt, ap);
    va_end(ap);
    return st;
}

const char *sim_last_message(void) { return t_msg; }
void sim_clear_message(void) { t_msg[0] = '\0'; }

/* ========================================================================== */
/* environment                                                                */
/* ========================================================================== */

/* A size: a decimal number (digits, optionally a fraction; no sign, exponent, "inf" or
 * "nan"), optional blanks, then an optional binary unit: K, M, G or T (times 2^10 ...
 * 2^40), each optionally followed by "i" and/or "B", or a lone "B"; case-insensitive;
 * blanks around the whole value are ignored. "17179869184", "16G", "16GiB", "512 MiB",
 * "1.5g". Returns the value in bytes (possibly fractional), or -1 when malformed. */
static double parse_size(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    const char *p = s;
    double v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        v = v * 10 + (*p - '0');
    if (*p == '.') {
        double scale = 0.1;
        for (p++; *p >= '0' && *p <= '9'; p++, digits++, scale /= 10)
            v += (*p - '0') * scale;
    }
    if (!digits)
        return -1;
    while (*p == ' ' || *p == '\t')
        p++;
    static const char units[] = "kmgt";
    const char *u = *p ? strchr(units, *p | 0x20) : NULL;
    if (u) {
        for (long k = 0; k <= u - units; k++)
            v *= 1024;
        p++;
        if (*p == 'i' || *p == 'I')
            p++;
    }
    if (*p == 'b' || *p == 'B')
        p++;
    while (*p == ' ' || *p == '\t')
        p++;
    return *p ? -1 : v;
}

/* a whole decimal number within [lo, hi] (blanks around it ignored), or -1 */
static long parse_int(const char *s, long lo, long hi)
{
    char *end;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    while (*end == ' ' || *end == '\t')
        end++;
    return (*end || errno || v < lo || v > hi) ? -1 : v;
}

enum { WARN_DEVICES = 1u, WARN_MEMORY = 2u, WARN_SPIN = 4u };

struct flag_search { unsigned *flag; };

/* The first loaded object exporting anychip_sim_warned (every simulator library does;
 * this one at the latest) holds the process's record of warnings printed. */
static int find_warned_flag(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct flag_search *fs = data;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0;
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    fs->flag = dlsym(h, "anychip_sim_warned");
    dlclose(h);
    return fs->flag != NULL;
}

/* Print a configuration warning unless some simulator library of this process has. */
static void warn_once(unsigned bit, const char *var, const char *value, const char *want, const char *dflt)
{
    static unsigned *shared;
    if (!shared) {
        struct flag_search fs = {NULL};
        dl_iterate_phdr(find_warned_flag, &fs);
        shared = fs.flag ? fs.flag : &anychip_sim_warned;
    }
    if (__atomic_fetch_or(shared, bit, __ATOMIC_ACQ_REL) & bit)
        return;
    fprintf(stderr, "anychip simulator: ignoring %s=\"%s\": %s; using the default, %s\n", var, value, want, dflt);
}

/* A variable's value, NULL when it is unset or blank (as anychip/runtime/env.py reads it) */
static const char *env_value(const char *name)
{
    const char *s = getenv(name);
    if (!s)
        return NULL;
    for (const char *p = s; *p; p++)
        if (*p != ' ' && *p != '\t')
            return s;
    return NULL;
}

static void read_environment(void)
{
    G.nphys = SIM_DEFAULT_DEVICES;
    const char *s = env_value("ANYCHIP_SIM_DEVICES");
    if (s) {
        long v = parse_int(s, 0, SIM_MAX_DEVICES);
        if (v >= 0)
            G.nphys = (int)v;
        else
            warn_once(WARN_DEVICES, "ANYCHIP_SIM_DEVICES", s, "want a whole number of devices from 0 to 64", "8");
    }
    G.capacity = SIM_DEFAULT_MEMORY;
    s = env_value("ANYCHIP_SIM_MEMORY");
    if (s) {
        double v = parse_size(s);
        if (v >= (double)SIM_MIN_MEMORY && v <= (double)SIM_MAX_MEMORY)
            G.capacity = (size_t)v / SIM_ALIGN * SIM_ALIGN;
        else
            warn_once(WARN_MEMORY, "ANYCHIP_SIM_MEMORY", s,
                      v < 0 ? "want bytes, or a number with a unit K, M, G or T, from 1MiB to 1TiB (e.g. 16GiB)"
                            : "want from 1MiB to 1TiB of memory per device",
                      "16GiB");
    }
    long spin_us = SIM_DEFAULT_SPIN_US;
    s = env_value("ANYCHIP_SIM_SPIN_US");
    if (s) {
        long v = parse_int(s, 0, SIM_MAX_SPIN_US);
        if (v >= 0)
            spin_us = v;
        else
            warn_once(WARN_SPIN, "ANYCHIP_SIM_SPIN_US", s, "want a whole number of microseconds from 0 to 1000000",
                      "20");
    }
    G.spin_ns = (uint64_t)spin_us * 1000;
    G.wait_spin_ns = G.spin_ns * SIM_WAIT_SPIN_FACTOR;
}

/* one decimal id made only of digits, or -1 */
static int parse_id(const char *s, size_t len)
{
    if (len == 0 || len > 4)
        return -1;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static int listed(int id)
{
    for (int k = 0; k < G.nvis; k++)
        if (G.vis[k] == id)
            return 1;
    return 0;
}

/* ASCEND_RT_VISIBLE_DEVICES as CANN's runtime reads it (Runtime::GetVisibleDevices):
 * runs of digits separated by single commas; reading stops at any other character, at a
 * second comma in a row, or at an id beyond the last device. A value that does not
 * start with a digit, lists no usable id, repeats an id or is not in ascending order
 * rejects the whole setting: no device is usable (G.vis_error says why). */
static void visibility_acl(const char *p)
{
    const char *why = NULL;
    if (*p < '0' || *p > '9')
        why = "it must start with a device id";
    while (!why && *p >= '0' && *p <= '9') {
        size_t len = strspn(p, "0123456789");
        int id = parse_id(p, len);
        if (id < 0 || id >= G.nphys)
            break;
        if (listed(id))
            why = "an id is repeated";
        else if (G.nvis && id < G.vis[G.nvis - 1])
            why = "the ids must be in ascending order";
        else if (G.nvis < SIM_MAX_DEVICES)
            G.vis[G.nvis++] = id;
        p += len;
        if (*p != ',')
            break;
        p++;
    }
    if (!why && G.nvis == 0)
        why = "no listed id is a device";
    if (why) {
        G.nvis = 0;
        snprintf(G.vis_error, sizeof G.vis_error, "ASCEND_RT_VISIBLE_DEVICES=\"%.64s\" is rejected: %s "
                 "(ascending device ids from 0 to %d, separated by commas)", G.vis_value, why, G.nphys - 1);
    }
}

/* HIP's rule (ROCm clr, rocdevice.cpp): each comma-separated entry must be exactly the
 * decimal form of a device index below the device count (no blanks, no leading zeros);
 * the first entry that is not ends the list; a repeated index is skipped; devices are
 * numbered in list order. */
static void visibility_hip(const char *p)
{
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int id = parse_id(p, len);
        if (id < 0 || id >= G.nphys || (len > 1 && *p == '0'))
            break;
        if (!listed(id) && G.nvis < SIM_MAX_DEVICES)
            G.vis[G.nvis++] = id;
        if (!comma)
            break;
        p = comma + 1;
    }
}

/* CUDA's rule (XPU): ids in list order, blanks around an id ignored; reading stops at the
 * first invalid or repeated id; "" lists none. */
static void visibility_cuda(const char *p)
{
    while (*p && G.nvis < SIM_MAX_DEVICES) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *tok = p;
        while (len && *tok == ' ') { tok++; len--; }
        while (len && tok[len - 1] == ' ') len--;
        int id = parse_id(tok, len);
        if (id < 0 || id >= G.nphys || listed(id))
            break;
        G.vis[G.nvis++] = id;
        if (!comma)
            break;
        p = comma + 1;
    }
}

static void apply_visibility(const char *visible, int rule)
{
    G.nvis = 0;
    G.vis_error[0] = '\0';
    for (int i = 0; i < SIM_MAX_DEVICES; i++)
        G.phys_to_log[i] = -1;
    if (!visible) {
        for (int i = 0; i < G.nphys; i++)
            G.vis[G.nvis++] = i;
    } else {
        snprintf(G.vis_value, sizeof G.vis_value, "%s", visible);
        if (rule == SIM_VIS_ACL)
            visibility_acl(visible);
        else if (rule == SIM_VIS_HIP)
            visibility_hip(visible);
        else
            visibility_cuda(visible);
    }
    for (int i = 0; i < G.nvis; i++)
        G.phys_to_log[G.vis[i]] = i;
}

const char *sim_visibility_error(void) { return G.vis_error[0] ? G.vis_error : NULL; }

/* ========================================================================== */
/* start and fork                                                             */
/* ========================================================================== */

/* The child of fork() has none of the worker threads and must not write the parent's
 * device memory (the arenas may be shared mappings). It starts over with empty devices;
 * handles from before the fork are invalid there. */
static void atfork_child(void)
{
    sim_exec_lock_init();
    pthread_mutex_init(&G.default_lock, NULL);
    sim_handles_atfork_child();
    sim_memory_atfork_child();
}

void sim_core_init(const char *visible, int rule)
{
    if (ALOAD(&G.initialized))
        return;
    pthread_mutex_lock(&G.init_lock);
    if (!G.initialized) {
        read_environment();
        for (int i = 0; i < SIM_MAX_DEVICES; i++) {
            pthread_mutex_init(&G.dev[i].lock, NULL);
            pthread_mutex_init(&G.dev[i].streams_lock, NULL);
            G.dev[i].fd = -1;
        }
        apply_visibility(visible, rule);
        sim_exec_lock_init();
        pthread_atfork(NULL, NULL, atfork_child);
        ASTORE(&G.initialized, 1);
    }
    pthread_mutex_unlock(&G.init_lock);
}

/* Frees take the exec lock for writing; prefer them, so a steady flow of copies on many
 * streams cannot keep a free waiting. No thread ever takes the read side twice. */
void sim_exec_lock_init(void)
{
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&G.exec, &attr);
    pthread_rwlockattr_destroy(&attr);
}

/* ========================================================================== */
/* devices                                                                    */
/* ========================================================================== */

void sim_set_require_current(int yes) { G.require_current = yes; }
void sim_set_sync_waits_default(int yes) { G.sync_no_default_wait = !yes; }
void sim_set_legacy_null_stream(int yes) { ASTORE(&G.legacy_null_stream, yes); }
int sim_visible_count(void) { return G.nvis; }
int sim_physical_count(void) { return G.nphys; }
size_t sim_capacity(void) { return G.capacity; }

int sim_logical_to_phys(int logical)
{
    return (logical >= 0 && logical < G.nvis) ? G.vis[logical] : -1;
}

int sim_phys_to_logical(int phys)
{
    return (phys >= 0 && phys < SIM_MAX_DEVICES) ? G.phys_to_log[phys] : -1;
}

sim_status sim_set_current(int logical)
{
    if (G.nvis == 0)
        return sim_fail(SIM_E_NO_DEVICE, "no simulated device is visible (check the visibility variable "
                                          "and ANYCHIP_SIM_DEVICES)");
    if (logical < 0 || logical >= G.nvis)
        return sim_fail(SIM_E_INVALID_DEVICE, "device %d does not exist: %d device(s) visible", logical, G.nvis);
    t_dev = G.vis[logical];
    return SIM_OK;
}

sim_status sim_current_phys(int *phys)
{
    if (t_dev < 0) {
        if (G.require_current)
            return sim_fail(SIM_E_NO_CONTEXT, "no device is set on this thread (call the set-device API first)");
        if (G.nvis == 0)
            return sim_fail(SIM_E_NO_DEVICE, "no simulated device is visible");
        t_dev = G.vis[0];
    }
    *phys = t_dev;
    return SIM_OK;
}

sim_status sim_current_logical(int *logical)
{
    int phys = -1;
    sim_status st = sim_current_phys(&phys);
    if (st == SIM_OK)
        *logical = sim_phys_to_logical(phys);
    return st;
}

sim_status sim_resolve_device(int *phys)
{
    if (*phys == SIM_CURRENT)
        return sim_current_phys(phys);
    if (*phys < 0 || *phys >= G.nphys)
        return sim_fail(SIM_E_INVALID_DEVICE, "bad device");
    return SIM_OK;
}

int sim_current_raw(void) { return t_dev; }
void sim_clear_current(void) { t_dev = -1; }

/* ========================================================================== */
/* exported controls                                                          */
/* ========================================================================== */

const char *anychip_sim_last_error(void) { return t_msg; }
const char *anychip_sim_status_string(int status) { return sim_status_name((sim_status)status); }

int anychip_sim_config(int *physical_devices, int *visible_devices, uint64_t *capacity)
{
    if (!ALOAD(&G.initialized))
        return sim_fail(SIM_E_NO_DEVICE, "the simulator is not initialized yet (call a vendor API first)");
    if (physical_devices)
        *physical_devices = G.nphys;
    if (visible_devices)
        *visible_devices = G.nvis;
    if (capacity)
        *capacity = G.capacity;
    return SIM_OK;
}

int anychip_sim_physical_device(int logical) { return sim_logical_to_phys(logical); }
