/*
 * anychip's Paddle CustomDevice provider: Paddle's InitPlugin (device_ext.h 0.1.1) over
 * one anychip/plugin.h backend, so that every C-level anychip backend is a Paddle device
 * type named "anychip_<backend>" (see docs/paddle.md, "Paddle on anychip").
 *
 * Paddle calls InitPlugin once per library and gives each library one device type, so a
 * build of the bridge (its units, bridge.h, each compiled with the same -D flags) serves one
 * plugin.h library, named at compile time:
 *   ANYCHIP_PADDLE_TARGET      the library's path, relative to the bridge's own directory
 *                              or absolute (a vendor's C plugin: `anychip plugin paddle`);
 *   ANYCHIP_PADDLE_SIMULATORS  a pattern (one %s) of the simulated chips' libraries: the
 *                              chip is the one ANYCHIP_PADDLE names (ascend, kunlun or
 *                              hygon), the simulated Ascend when it is unset.
 * Paddle's launcher takes the first device type it finds, so one simulated chip per
 * process is Paddle's device (ANYCHIP_PADDLE=none registers none). The bridge dlopens the
 * library and calls its anychip_plugin_init.
 *
 * The copy fence. Paddle issues synchronous copies (memory_copy_h2d / d2h / d2d, memset)
 * that expect to see the device's earlier asynchronous work, as CUDA's legacy-stream
 * cudaMemcpy does (it waits for every blocking stream). ACL's aclrtMemcpy, HIP's on a
 * non-blocking stream and most plugins' synchronous copies do not, and Paddle's
 * all_gather into a tensor list reads the gathered buffer with such copies before it
 * orders the compute stream after the collective's. So every stream the bridge created
 * carries a "pending" flag, set when async work (copies, fills, collectives) is enqueued
 * on it; a synchronous copy first synchronizes the pending streams of its device and
 * clears their flags. With nothing pending the fence costs one pass over a short list.
 *
 * Ordering (docs/paddle.md, "Ordering"): asynchronous H2D copies read a staging buffer of the
 * bridge's (Paddle may free the source at once), asynchronous D2H copies return complete,
 * work enqueued on a stream other than the device's last one first waits for that one (the
 * stream order: Paddle's allocator reuses memory across streams), and a free waits for the
 * device's pending streams (the fence).
 *
 * Collectives: the plugin's own (plugin.h's optional collectives), one communicator per
 * Paddle communicator. A plugin without them, in a build given ANYCHIP_PADDLE_CCL (the path
 * of anychip's libanychip_ccl), gets anychip's shared-memory engine: each op synchronizes
 * its stream, stages the data through host memory (device -> host, the engine between the
 * ranks of this machine, host -> device) and returns when done; send / recv between
 * group_start and group_end run together at group_end. Without either, no xccl entries.
 *
 * Kernels: built with ANYCHIP_PADDLE_KERNELS, the bridge links kernels.c, which registers
 * Paddle phi kernels built from the plugin's kernel table (plugin.h minor 1), per dtype its
 * masks allow, and profiler.c; kernels_throw.cc (C++) is linked beside them, and the C is
 * compiled with -fexceptions. Without ANYCHIP_PADDLE_KERNELS every op takes Paddle's CPU
 * fallback and anychip_paddle_kernel_note() says why (ANYCHIP_PADDLE_NO_KERNELS: the reason).
 *
 * This file: loading the plugin.h library, messages, the ANYCHIP_PADDLE_PROFILE counters and
 * InitPlugin, which has each unit fill its part of Paddle's function table.
 */
#include "bridge.h"

#if !defined(ANYCHIP_PADDLE_TARGET) && !defined(ANYCHIP_PADDLE_SIMULATORS)
#error "define ANYCHIP_PADDLE_TARGET (the plugin.h library, relative to this library's directory or absolute)"
#endif

anychip_plugin g_plugin;
char g_type[ANYCHIP_DEVICE_TYPE_MAX + 16];
char g_target[PATH_MAX];
void *g_lib;
int g_count;

/* ---- messages ------------------------------------------------------------------------- */

void say(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[anychip %s] %s\n", g_type[0] ? g_type : "paddle", line);
}

C_Status check(anychip_status rc, const char *what)
{
    if (rc == 0)
        return C_SUCCESS;
    const char *text = g_plugin.get_error_string ? g_plugin.get_error_string(rc) : NULL;
    const char *detail = g_plugin.get_last_error ? g_plugin.get_last_error() : NULL;
    say("%s failed: status %d%s%s%s", what, (int)rc, text ? " (" : "", text ? text : "", text ? ")" : "");
    if (detail)
        say("  %s", detail);
    return rc == g_plugin.invalid_status && g_plugin.invalid_status ? C_ERROR : C_FAILED;
}

/* ---- calls per entry; ANYCHIP_PADDLE_PROFILE=1: and host time, written to stderr at exit ---- */

static const char *const PROF_NAMES[PROF_N] = {"create_stream", "destroy_stream", "synchronize_stream", "query_stream", "synchronize_device", "create_event", "destroy_event", "record_event", "query_event", "synchronize_event", "stream_wait_event", "set_device", "get_device", "device_memory_allocate", "device_memory_deallocate", "sync_copy", "device_memory_set", "async_copy", "xccl_all_reduce", "xccl_broadcast", "xccl_all_gather", "h2d_staged", "h2d_direct", "d2h_enqueued", "d2h_direct", "order_wait", "order_idle"};
int g_prof;
atomic_ullong g_prof_calls[PROF_N];
static atomic_ullong g_prof_ns[PROF_N], g_prof_max[PROF_N];

/* How many times an entry ran (or a copy or the stream order went a way), for tests and tools:
 * anychip_paddle_calls("h2d_staged"); ~0 for a name the bridge does not count. The ways:
 *   h2d_staged    an asynchronous H2D copy from a staging buffer (work was pending before it)
 *   h2d_direct    an asynchronous H2D copy made at once (nothing pending before it on the device)
 *   d2h_enqueued  an asynchronous D2H copy enqueued, then its stream synchronized
 *   d2h_direct    an asynchronous D2H copy made at once (nothing pending before it)
 *   order_wait    a stream made to wait (an event) for the device's last stream
 *   order_idle    work moved to another stream while the last one was idle: no wait needed */
EXPORT unsigned long long anychip_paddle_calls(const char *name)
{
    for (int i = 0; i < PROF_N; i++)
        if (strcmp(PROF_NAMES[i], name) == 0)
            return atomic_load(&g_prof_calls[i]);
    return ~0ull;
}

void prof_add(int id, unsigned long long t0)
{
    unsigned long long dt = prof_now() - t0, max = atomic_load(&g_prof_max[id]);
    atomic_fetch_add(&g_prof_calls[id], 1);
    atomic_fetch_add(&g_prof_ns[id], dt);
    while (dt > max && !atomic_compare_exchange_weak(&g_prof_max[id], &max, dt))
        ;
}

static void prof_report(void)
{
    say("profile (pid %d): entry, calls, host us per call, max us", (int)getpid());
    for (int i = 0; i < PROF_N; i++) {
        unsigned long long n = atomic_load(&g_prof_calls[i]);
        if (n && i >= PROF_h2d_staged)    /* a way a copy or the stream order went: counted, not timed */
            say("  %-26s %10llu", PROF_NAMES[i], n);
        else if (n)
            say("  %-26s %10llu %10.2f %10.1f", PROF_NAMES[i], n, atomic_load(&g_prof_ns[i]) / 1e3 / (double)n,
                atomic_load(&g_prof_max[i]) / 1e3);
    }
}

/* ---- loading the plugin and InitPlugin ------------------------------------------------------------ */

#ifdef ANYCHIP_PADDLE_SIMULATORS
#include <dirent.h>

/* A C plugin's bridge (`anychip plugin paddle`: libanychip_<name>.so, not libanychip_sim*)
 * in the directory Paddle loaded this library from, its file name in `buf`; 0 when none. */
static int plugin_bridge_beside(char *buf, size_t len)
{
    Dl_info info;
    if (!dladdr((void *)plugin_bridge_beside, &info) || !info.dli_fname)
        return 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);   /* the path Paddle opened, not the real one */
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        found = strncmp(e->d_name, "libanychip_", 11) == 0 && strncmp(e->d_name, "libanychip_sim", 14) != 0 &&
                n > 3 && strcmp(e->d_name + n - 3, ".so") == 0;
        if (found)
            snprintf(buf, len, "%s", e->d_name);
    }
    closedir(d);
    return found;
}

/* set by InitPlugin: Paddle is loading this library (not a tool asking for its kernel table) */
static int g_paddle_loading;

/* The simulated chip ANYCHIP_PADDLE names (the first of them), NULL for none; `buf` holds the
 * name. Unset, the simulated Ascend -- unless Paddle loads this library beside a C plugin's
 * bridge: then that chip is the device the user chose, and Paddle's launcher, which takes the
 * first device type, must not run the job on a simulated chip instead (none is registered). */
static const char *chosen_simulator(char *buf, size_t len)
{
    static const char *const CHIPS[] = {"ascend", "kunlun", "hygon"};
    const char *v = getenv("ANYCHIP_PADDLE");
    if (!v) {
        char other[256];
        if (g_paddle_loading && plugin_bridge_beside(other, sizeof other)) {
            say("ANYCHIP_PADDLE is unset and the C plugin bridge %s lies beside this library: that plugin "
                "is Paddle's anychip device and no simulated chip is registered (ANYCHIP_PADDLE=ascend, "
                "kunlun or hygon registers one)", other);
            return NULL;
        }
        return "ascend";
    }
    for (const char *p = v; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',' && *end != ' ')
            end++;
        for (size_t i = 0; i < sizeof CHIPS / sizeof *CHIPS; i++)
            if ((size_t)(end - p) == strlen(CHIPS[i]) && strncasecmp(p, CHIPS[i], end - p) == 0) {
                snprintf(buf, len, "%s", CHIPS[i]);
                return buf;
            }
        if (end > p && !(end - p == 4 && strncasecmp(p, "none", 4) == 0))
            say("ANYCHIP_PADDLE=%s: %.*s is not a simulated chip (ascend, kunlun, hygon or none)", v,
                (int)(end - p), p);
        p = end;
    }
    return NULL;
}
#endif

int resolve(const char *path, char *out, size_t len)
{
    if (path[0] == '/') {
        snprintf(out, len, "%s", path);
        return 0;
    }
    Dl_info info;
    if (!dladdr((void *)resolve, &info) || !info.dli_fname) {
        say("cannot find this library's own path (dladdr)");
        return -1;
    }
    char dir[PATH_MAX];
    if (!realpath(info.dli_fname, dir))   /* a symlink to the bridge: the directory it lies in */
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    if ((size_t)snprintf(out, len, "%.*s/%s", PATH_MAX / 2, dir, path) >= len) {
        say("the path %s/%s is longer than %zu bytes", dir, path, len);
        return -1;
    }
    return 0;
}

static int load_target(void)
{
#ifdef ANYCHIP_PADDLE_SIMULATORS
    char chip[16], pattern[PATH_MAX];
    if (!chosen_simulator(chip, sizeof chip))
        return -1;
    const char *use = getenv("ANYCHIP_PADDLE") ? chip : "ascend";
    snprintf(pattern, sizeof pattern, ANYCHIP_PADDLE_SIMULATORS, use);
    const char *target = pattern;
#else
    const char *target = ANYCHIP_PADDLE_TARGET;
#endif
    if (resolve(target, g_target, sizeof g_target) != 0)
        return -1;
    void *lib = dlopen(g_target, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        Dl_info self;
        if (access(g_target, F_OK) != 0 && dladdr((void *)load_target, &self) && self.dli_fname)
            say("the anychip plugin %s is gone (its package uninstalled?): remove this bridge, %s, or rebuild it "
                "with `anychip plugin paddle NAME`", g_target, self.dli_fname);
        else
            say("cannot load the anychip plugin %s: %s", g_target, dlerror());
        return -1;
    }
    g_lib = lib;
    anychip_plugin_init_fn init = (anychip_plugin_init_fn)dlsym(lib, ANYCHIP_PLUGIN_INIT_SYMBOL);
    if (!init) {
        say("%s exports no %s (not an anychip/plugin.h library)", g_target, ANYCHIP_PLUGIN_INIT_SYMBOL);
        return -1;
    }
    memset(&g_plugin, 0, sizeof g_plugin);
    g_plugin.struct_size = sizeof g_plugin;
    anychip_status rc = init(&g_plugin);
    if (rc != 0) {
        say("%s: %s failed with status %d", g_target, ANYCHIP_PLUGIN_INIT_SYMBOL, (int)rc);
        return -1;
    }
    if (g_plugin.major != ANYCHIP_PLUGIN_API_MAJOR) {
        say("%s is built for plugin ABI %u.%u; this bridge implements %d.%d", g_target, g_plugin.major, g_plugin.minor,
            ANYCHIP_PLUGIN_API_MAJOR, ANYCHIP_PLUGIN_API_MINOR);
        return -1;
    }
    if (!g_plugin.device_count || !g_plugin.mem_info || !g_plugin.mem_alloc || !g_plugin.mem_free ||
        !g_plugin.copy || !g_plugin.stream_create || !g_plugin.stream_destroy || !g_plugin.stream_synchronize) {
        say("%s lacks a required plugin.h entry", g_target);
        return -1;
    }
    if (g_plugin.event_create && !(g_plugin.event_destroy && g_plugin.event_record && g_plugin.event_synchronize)) {
        say("%s sets event_create without event_destroy / record / synchronize", g_target);
        return -1;
    }
    char name[ANYCHIP_DEVICE_TYPE_MAX];
    memcpy(name, g_plugin.device_type, sizeof name);
    name[sizeof name - 1] = 0;
    snprintf(g_type, sizeof g_type, "anychip_%s", name);
    rc = g_plugin.device_count(&g_count);
    if (rc != 0) {
        check(rc, "device_count");
        return -1;
    }
    if (g_count > MAX_DEVICES)
        g_count = MAX_DEVICES;
    return 0;
}

/* the path of the plugin.h library this copy serves, and its Paddle device type (for tools) */
EXPORT const char *anychip_paddle_target(void) { return g_target; }
EXPORT const char *anychip_paddle_device_type(void) { return g_type; }

/* the plugin, loaded once per process: by InitPlugin, or by a tool asking for the kernel table */
static pthread_once_t g_target_once = PTHREAD_ONCE_INIT;
static int g_target_ok;

static void load_target_once(void) { g_target_ok = load_target() == 0; }

int target_ready(void)
{
    pthread_once(&g_target_once, load_target_once);
    return g_target_ok;
}

#ifndef ANYCHIP_PADDLE_KERNELS
/* why this bridge registers no kernels (`anychip info`): it was built without the kernel layer */
#ifndef ANYCHIP_PADDLE_NO_KERNELS
#define ANYCHIP_PADDLE_NO_KERNELS "the bridge was built without its kernel layer"
#endif
EXPORT const char *anychip_paddle_kernel_note(void) { return ANYCHIP_PADDLE_NO_KERNELS; }
#endif

EXPORT void InitPlugin(struct CustomRuntimeParams *params)
{
    if (!params || params->size < sizeof *params || !params->interface ||
        params->interface->size < sizeof(C_DeviceInterface)) {
        say("InitPlugin: Paddle passed structs of %zu / %zu bytes; this bridge is built for %zu / %zu "
            "(device_ext.h %d.%d.%d)", params ? params->size : 0,
            params && params->interface ? params->interface->size : 0, sizeof *params, sizeof(C_DeviceInterface),
            ANYCHIP_PADDLE_RUNTIME_MAJOR, ANYCHIP_PADDLE_RUNTIME_MINOR, ANYCHIP_PADDLE_RUNTIME_PATCH);
        return;
    }
    const char *prof = getenv("ANYCHIP_PADDLE_PROFILE");
    g_prof = prof && strcmp(prof, "1") == 0;
    if (g_prof)
        atexit(prof_report);
    params->version.major = ANYCHIP_PADDLE_RUNTIME_MAJOR;
    params->version.minor = ANYCHIP_PADDLE_RUNTIME_MINOR;
    params->version.patch = ANYCHIP_PADDLE_RUNTIME_PATCH;
#ifdef ANYCHIP_PADDLE_SIMULATORS
    g_paddle_loading = 1;
#endif
    if (!target_ready())
        return;                           /* device_type stays NULL: Paddle skips the library */
    params->device_type = g_type;
    params->sub_device_type = g_type + strlen("anychip_");

    C_DeviceInterface *i = params->interface;
    fill_devices(i);
    fill_streams(i);
    fill_memory(i);
    fill_collectives(i);
#ifdef ANYCHIP_PADDLE_KERNELS
    register_kernels();                   /* the device's phi kernels, from the plugin's kernel table */
#ifndef ANYCHIP_PADDLE_VIEWS_ONLY
    fill_profiler(i);                     /* Paddle's profiler: the kernels and copies on its timeline */
#endif
#endif
}
