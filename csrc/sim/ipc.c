/*
 * Inter-process memory handles: the first export of a device moves its arena into a
 * memfd at the same addresses; another process maps an allocation from it and copies
 * accept that range as device memory (the simulated CUDA IPC / HCCS peer access).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Move the arena's pages into a memfd mapped over the same address range, keeping the
 * contents of live allocations. Caller holds G.exec for writing and d->lock, so no op,
 * allocation or free runs meanwhile. */
static sim_status make_shareable(sim_device *d, int phys)
{
    if (d->fd >= 0)
        return SIM_OK;
    char name[64];
    snprintf(name, sizeof name, "anychip-sim-dev%d", phys);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return sim_fail(SIM_E_NOT_SUPPORTED, "device memory cannot be shared here: memfd_create: %s",
                        strerror(errno));
    if (ftruncate(fd, (off_t)G.capacity) != 0) {
        int err = errno;
        close(fd);
        return sim_fail(SIM_E_OS, "cannot size the shared arena: %s", strerror(err));
    }
    for (size_t i = 0; i < d->nallocs; i++) {
        size_t off = d->allocs[i].off, left = d->allocs[i].rsize;
        while (left) {
            ssize_t w = pwrite(fd, d->base + off, left, (off_t)off);
            if (w <= 0) {
                int err = errno;
                close(fd);
                return sim_fail(SIM_E_OS, "cannot move device memory into the shared arena: %s", strerror(err));
            }
            off += (size_t)w;
            left -= (size_t)w;
        }
    }
    void *m = mmap(d->base, G.capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0);
    if (m == MAP_FAILED) {
        int err = errno;
        close(fd);
        return sim_fail(SIM_E_OS, "cannot map the shared arena: %s", strerror(err));
    }
    d->fd = fd;
    return SIM_OK;
}

sim_status sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *h)
{
    if (!h || !devptr)
        return sim_fail(SIM_E_INVALID_VALUE, "NULL argument");
    int phys = sim_arena_of(devptr);
    if (phys < 0)
        return sim_fail(SIM_E_INVALID_VALUE, "%p is not device memory allocated by this process", devptr);
    sim_device *d = &G.dev[phys];
    /* making the arena shareable excludes running ops (G.exec for writing); once it is,
     * d->lock alone keeps the table and the descriptor steady for the lookup */
    pthread_mutex_lock(&d->lock);
    int exclusive = d->fd < 0;
    if (exclusive) {
        pthread_mutex_unlock(&d->lock);
        pthread_rwlock_wrlock(&G.exec);
        pthread_mutex_lock(&d->lock);
    }
    size_t off = (size_t)((const char *)devptr - d->base);
    long i = sim_alloc_floor(d, off);
    if (i < 0 || off >= d->allocs[i].off + d->allocs[i].rsize) {
        pthread_mutex_unlock(&d->lock);
        if (exclusive)
            pthread_rwlock_unlock(&G.exec);
        return sim_fail(SIM_E_INVALID_VALUE, "%p is not inside a live allocation", devptr);
    }
    sim_alloc a = d->allocs[i];
    sim_status st = exclusive ? make_shareable(d, phys) : SIM_OK;
    int fd = d->fd;
    pthread_mutex_unlock(&d->lock);
    if (exclusive)
        pthread_rwlock_unlock(&G.exec);
    if (st != SIM_OK)
        return st;
    memset(h, 0, sizeof *h);
    h->magic = ANYCHIP_SIM_IPC_MAGIC;
    h->version = 1;
    h->pid = (int32_t)getpid();
    h->fd = fd;
    h->device = phys;
    h->offset = a.off;
    h->size = a.size;
    h->alloc_id = a.id;
    return SIM_OK;
}

sim_status sim_ipc_open(int fd, const anychip_sim_ipc_handle *h, void **devptr)
{
    if (!h || !devptr)
        return sim_fail(SIM_E_INVALID_VALUE, "NULL argument");
    if (h->magic != ANYCHIP_SIM_IPC_MAGIC || h->version != 1)
        return sim_fail(SIM_E_INVALID_VALUE, "not an anychip simulator IPC handle");
    int own = 0;
    if (fd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return sim_fail(SIM_E_OS, "cannot open %s: %s (is the exporting process alive?)", path,
                            strerror(errno));
        own = 1;
    }
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t moff = (size_t)h->offset / pg * pg;
    size_t len = round_up((size_t)h->offset + (size_t)(h->size ? h->size : 1) - moff, pg);
    char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)moff);
    int err = errno;
    if (own)
        close(fd);
    if (map == MAP_FAILED)
        return sim_fail(SIM_E_OS, "cannot map the shared allocation: %s", strerror(err));
    pthread_mutex_lock(&G.import_lock);
    if (grow((void **)&G.imports, &G.cap_imports, G.nimports + 1, sizeof *G.imports)) {
        pthread_mutex_unlock(&G.import_lock);
        munmap(map, len);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    sim_import *im = &G.imports[G.nimports++];
    im->map = map;
    im->map_len = len;
    im->ptr = map + (h->offset - moff);
    im->size = (size_t)h->size;
    im->dev = h->device;
    im->id = new_id();
    *devptr = im->ptr;
    pthread_mutex_unlock(&G.import_lock);
    return SIM_OK;
}

sim_status sim_ipc_close(void *devptr)
{
    pthread_rwlock_wrlock(&G.exec);
    pthread_mutex_lock(&G.import_lock);
    sim_import im = {0};
    int found = 0;
    for (size_t i = 0; i < G.nimports; i++) {
        if (G.imports[i].ptr == devptr) {
            im = G.imports[i];
            G.imports[i] = G.imports[--G.nimports];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&G.import_lock);
    if (found)
        munmap(im.map, im.map_len);
    pthread_rwlock_unlock(&G.exec);
    if (!found)
        return sim_fail(SIM_E_INVALID_VALUE, "%p was not opened from an IPC handle", devptr);
    return SIM_OK;
}

int anychip_sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *handle)
{
    return sim_ipc_get_handle(devptr, handle);
}

int anychip_sim_ipc_open(const anychip_sim_ipc_handle *handle, void **devptr)
{
    return sim_ipc_open(-1, handle, devptr);
}

int anychip_sim_ipc_open_fd(int fd, const anychip_sim_ipc_handle *handle, void **devptr)
{
    if (fd < 0)
        return sim_fail(SIM_E_INVALID_VALUE, "bad file descriptor %d", fd);
    return sim_ipc_open(fd, handle, devptr);
}

int anychip_sim_ipc_close(void *devptr) { return sim_ipc_close(devptr); }
