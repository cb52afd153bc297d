/*
 * The Paddle bridge's devices (see bridge.h): the plugin's device list, the calling thread's
 * device, a device's init and deinit, and its memory figures.
 */
#include "bridge.h"

__thread int bridge_device;

C_Status bad_device(const C_Device d, const char *fn)
{
    if (!d || d->id < 0 || d->id >= g_count) {
        say("%s: device %d does not exist (%d device%s)", fn, d ? d->id : -1, g_count, g_count == 1 ? "" : "s");
        return C_ERROR;
    }
    return C_SUCCESS;
}

static C_Status initialize(void) { return C_SUCCESS; }
static C_Status finalize(void) { return C_SUCCESS; }

static C_Status set_device(const C_Device d)
{
    PROF(set_device);
    DEVICE(d);
    if (g_plugin.set_device)
        TRY(g_plugin.set_device(d->id), "set_device");
    bridge_device = d->id;
    return C_SUCCESS;
}

static C_Status init_device(const C_Device d) { return set_device(d); }

static C_Status get_device(const C_Device d)
{
    PROF(get_device);
    d->id = bridge_device;
    return C_SUCCESS;
}

static C_Status deinit_device(const C_Device d)
{
    DEVICE(d);
    staging_drain(d->id);
    return synchronize_device(d);
}

static C_Status get_device_count(size_t *count)
{
    *count = (size_t)g_count;
    return C_SUCCESS;
}

static C_Status get_device_list(size_t *devices)
{
    for (int i = 0; i < g_count; i++)
        devices[i] = (size_t)i;
    return C_SUCCESS;
}

static C_Status device_memory_stats(const C_Device d, size_t *total, size_t *free_bytes)
{
    DEVICE(d);
    return check(g_plugin.mem_info(d->id, free_bytes, total), "mem_info");
}

static C_Status device_min_chunk_size(const C_Device d, size_t *size)
{
    (void)d;
    *size = 512;
    return C_SUCCESS;
}

static C_Status bool_true(const C_Device d, _Bool *supported)
{
    (void)d;
    *supported = 1;
    return C_SUCCESS;
}

void fill_devices(C_DeviceInterface *i)
{
    i->initialize = initialize;
    i->finalize = finalize;
    i->init_device = init_device;
    i->set_device = set_device;
    i->get_device = get_device;
    i->deinit_device = deinit_device;
    i->get_device_count = get_device_count;
    i->get_device_list = get_device_list;
    i->device_memory_stats = device_memory_stats;
    i->device_min_chunk_size = device_min_chunk_size;
    i->is_float16_supported = bool_true;
    i->is_bfloat16_supported = bool_true;
}
