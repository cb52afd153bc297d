/*
 * Device memory: one arena per device, carved best-fit from a coalescing free list, with
 * a sorted table of live allocations that every copy is checked against; and tracked
 * page-locked host memory.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A device's arena starts as private memory with transparent huge pages (the fastest
 * for copies); make_shareable() turns it into a memfd mapping at the same addresses the
 * first time an allocation of the device is exported to another process. */
static sim_status ensure_arena(sim_device *d, int phys)
{
    if (d->base)
        return SIM_OK;
    if (G.capacity == 0)
        return SIM_OK;
    char *base = mmap(NULL, G.capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (base == MAP_FAILED)
        return sim_fail(SIM_E_OS, "cannot reserve %zu bytes of address space for device %d: %s",
                        G.capacity, sim_phys_to_logical(phys), strerror(errno));
    madvise(base, G.capacity, MADV_HUGEPAGE);
    d->frees = malloc(16 * sizeof *d->frees);
    d->allocs = malloc(16 * sizeof *d->allocs);
    if (!d->frees || !d->allocs) {
        munmap(base, G.capacity);
        free(d->frees);
        free(d->allocs);
        d->frees = NULL;
        d->allocs = NULL;
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    d->cap_frees = d->cap_allocs = 16;
    d->frees[0] = (sim_extent){0, G.capacity};
    d->nfrees = 1;
    d->nallocs = 0;
    d->used = 0;
    d->fd = -1;
    ASTORE(&d->base, base);
    return SIM_OK;
}

long sim_alloc_floor(const sim_device *d, size_t off)
{
    long lo = 0, hi = (long)d->nallocs - 1, ans = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if (d->allocs[mid].off <= off) {
            ans = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ans;
}

static void extent_insert(sim_device *d, size_t off, size_t size)
{
    size_t i = 0;
    {
        long lo = 0, hi = (long)d->nfrees - 1;
        size_t pos = d->nfrees;
        while (lo <= hi) {
            long mid = (lo + hi) / 2;
            if (d->frees[mid].off > off) {
                pos = (size_t)mid;
                hi = mid - 1;
            } else {
                lo = mid + 1;
            }
        }
        i = pos;
    }
    int merge_prev = i > 0 && d->frees[i - 1].off + d->frees[i - 1].size == off;
    int merge_next = i < d->nfrees && off + size == d->frees[i].off;
    if (merge_prev && merge_next) {
        d->frees[i - 1].size += size + d->frees[i].size;
        memmove(&d->frees[i], &d->frees[i + 1], (d->nfrees - i - 1) * sizeof *d->frees);
        d->nfrees--;
    } else if (merge_prev) {
        d->frees[i - 1].size += size;
    } else if (merge_next) {
        d->frees[i].off = off;
        d->frees[i].size += size;
    } else {
        /* the table was grown by the caller before anything changed */
        memmove(&d->frees[i + 1], &d->frees[i], (d->nfrees - i) * sizeof *d->frees);
        d->frees[i] = (sim_extent){off, size};
        d->nfrees++;
    }
}

sim_status sim_malloc(int phys, size_t nbytes, void **out)
{
    if (!out)
        return sim_fail(SIM_E_INVALID_VALUE, "the output pointer is NULL");
    sim_status st = sim_resolve_device(&phys);
    if (st != SIM_OK)
        return st;
    sim_device *d = &G.dev[phys];
    size_t need = round_up(nbytes ? nbytes : 1, SIM_ALIGN);
    if (nbytes > G.capacity || need < nbytes) {
        size_t used;
        pthread_mutex_lock(&d->lock);
        used = d->used;
        pthread_mutex_unlock(&d->lock);
        return sim_fail(SIM_E_OUT_OF_MEMORY, "out of device memory on device %d: requested %zu bytes, "
                        "%zu of %zu bytes free", sim_phys_to_logical(phys), nbytes, G.capacity - used, G.capacity);
    }
    pthread_mutex_lock(&d->lock);
    st = ensure_arena(d, phys);
    if (st != SIM_OK) {
        pthread_mutex_unlock(&d->lock);
        return st;
    }
    long best = -1;
    size_t largest = 0;
    for (size_t i = 0; i < d->nfrees; i++) {
        size_t sz = d->frees[i].size;
        if (sz > largest)
            largest = sz;
        if (sz >= need && (best < 0 || sz < d->frees[best].size))
            best = (long)i;
    }
    if (best < 0) {
        size_t used = d->used;
        pthread_mutex_unlock(&d->lock);
        return sim_fail(SIM_E_OUT_OF_MEMORY, "out of device memory on device %d: requested %zu bytes, "
                        "%zu of %zu bytes free (largest free block %zu bytes)",
                        sim_phys_to_logical(phys), nbytes, G.capacity - used, G.capacity, largest);
    }
    if (grow((void **)&d->allocs, &d->cap_allocs, d->nallocs + 1, sizeof *d->allocs)) {
        pthread_mutex_unlock(&d->lock);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory for the allocation table");
    }
    size_t off = d->frees[best].off;
    d->frees[best].off += need;
    d->frees[best].size -= need;
    if (d->frees[best].size == 0) {
        memmove(&d->frees[best], &d->frees[best + 1], (d->nfrees - (size_t)best - 1) * sizeof *d->frees);
        d->nfrees--;
    }
    long pos = sim_alloc_floor(d, off) + 1;
    memmove(&d->allocs[pos + 1], &d->allocs[pos], (d->nallocs - (size_t)pos) * sizeof *d->allocs);
    d->allocs[pos] = (sim_alloc){off, nbytes, need, new_id()};
    d->nallocs++;
    d->used += need;
    char *p = d->base + off;
    pthread_mutex_unlock(&d->lock);
    *out = p;
    return SIM_OK;
}

int sim_arena_of(const void *p)
{
    const char *c = p;
    for (int i = 0; i < G.nphys; i++) {
        const char *b = ALOAD(&G.dev[i].base);
        if (b && c >= b && c < b + G.capacity)
            return i;
    }
    return -1;
}

int sim_device_of(const void *ptr)
{
    int d = sim_arena_of(ptr);
    if (d >= 0)
        return d;
    pthread_mutex_lock(&G.import_lock);
    for (size_t i = 0; i < G.nimports; i++) {
        const sim_import *im = &G.imports[i];
        if ((const char *)ptr >= im->ptr && (const char *)ptr < im->ptr + im->size) {
            d = im->dev;
            break;
        }
    }
    pthread_mutex_unlock(&G.import_lock);
    return d;
}

sim_status sim_free(void *ptr)
{
    int phys = sim_arena_of(ptr);
    if (phys < 0)
        return sim_fail(SIM_E_BAD_FREE, "free of %p: not device memory of this simulator", ptr);
    sim_device *d = &G.dev[phys];
    /* exclusive against running ops, so no op is writing the block as it is released */
    pthread_rwlock_wrlock(&G.exec);
    pthread_mutex_lock(&d->lock);
    size_t off = (size_t)((char *)ptr - d->base);
    long i = sim_alloc_floor(d, off);
    if (i < 0 || d->allocs[i].off != off) {
        int inside = i >= 0 && off < d->allocs[i].off + d->allocs[i].rsize;
        pthread_mutex_unlock(&d->lock);
        pthread_rwlock_unlock(&G.exec);
        if (inside)
            return sim_fail(SIM_E_BAD_FREE, "free of %p: points %zu bytes into an allocation, not at its "
                            "start", ptr, off - d->allocs[i].off);
        return sim_fail(SIM_E_BAD_FREE, "free of %p: not a live allocation of device %d (already freed, "
                        "or never allocated)", ptr, sim_phys_to_logical(phys));
    }
    if (grow((void **)&d->frees, &d->cap_frees, d->nfrees + 1, sizeof *d->frees)) {
        pthread_mutex_unlock(&d->lock);
        pthread_rwlock_unlock(&G.exec);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory for the free list");
    }
    sim_alloc a = d->allocs[i];
    memmove(&d->allocs[i], &d->allocs[i + 1], (d->nallocs - (size_t)i - 1) * sizeof *d->allocs);
    d->nallocs--;
    d->used -= a.rsize;
    extent_insert(d, a.off, a.rsize);
    if (a.rsize >= SIM_PUNCH_MIN) {
        /* give whole pages back to the host; the next user sees zero pages */
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        size_t lo = round_up(a.off, pg), hi = (a.off + a.rsize) / pg * pg;
        if (hi > lo) {
            if (d->fd >= 0)
                fallocate(d->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)lo, (off_t)(hi - lo));
            else
                madvise(d->base + lo, hi - lo, MADV_DONTNEED);
        }
    }
    pthread_mutex_unlock(&d->lock);
    pthread_rwlock_unlock(&G.exec);
    return SIM_OK;
}

sim_status sim_mem_info(int phys, size_t *free_bytes, size_t *total_bytes)
{
    sim_status st = sim_resolve_device(&phys);
    if (st != SIM_OK)
        return st;
    sim_device *d = &G.dev[phys];
    pthread_mutex_lock(&d->lock);
    size_t used = d->used;
    pthread_mutex_unlock(&d->lock);
    if (free_bytes)
        *free_bytes = G.capacity - used;
    if (total_bytes)
        *total_bytes = G.capacity;
    return SIM_OK;
}

/* host "pinned" memory */
sim_status sim_host_alloc(size_t nbytes, void **out)
{
    if (!out)
        return sim_fail(SIM_E_INVALID_VALUE, "the output pointer is NULL");
    void *p = NULL;
    if (posix_memalign(&p, 4096, nbytes ? nbytes : 1) != 0)
        return sim_fail(SIM_E_HOST_ALLOC, "cannot allocate %zu bytes of host memory", nbytes);
    pthread_mutex_lock(&G.host_lock);
    int rc = map_put(&G.host_allocs, (uint64_t)(uintptr_t)p, (void *)(uintptr_t)(nbytes ? nbytes : 1));
    pthread_mutex_unlock(&G.host_lock);
    if (rc) {
        free(p);
        return sim_fail(SIM_E_HOST_ALLOC, "out of host memory");
    }
    *out = p;
    return SIM_OK;
}

int sim_host_mapped(const void *ptr, size_t n)
{
    static const size_t chunk = 4096;      /* pages per mincore call */
    unsigned char vec[4096];
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)ptr / (uintptr_t)page * (uintptr_t)page;
    uintptr_t end = (uintptr_t)ptr + (n ? n : 1);
    if (end < (uintptr_t)ptr)
        return 0;
    while (start < end) {
        size_t len = end - start;
        if (len > chunk * (size_t)page)
            len = chunk * (size_t)page;
        if (mincore((void *)start, len, vec) != 0)
            return 0;          /* ENOMEM: part of the range is not mapped */
        start += len;
    }
    return 1;
}

int sim_is_host_alloc(const void *ptr)
{
    uintptr_t a = (uintptr_t)ptr;
    int found = 0;
    pthread_mutex_lock(&G.host_lock);
    for (size_t i = 0; i < G.host_allocs.cap && !found; i++) {
        const map_slot *s = &G.host_allocs.slots[i];
        found = s->key && a >= s->key && a - s->key < (uintptr_t)s->val;
    }
    pthread_mutex_unlock(&G.host_lock);
    return found;
}

sim_status sim_host_free(void *ptr)
{
    pthread_mutex_lock(&G.host_lock);
    void *had = ptr ? map_del(&G.host_allocs, (uint64_t)(uintptr_t)ptr) : NULL;
    pthread_mutex_unlock(&G.host_lock);
    if (!had)
        return sim_fail(SIM_E_BAD_FREE, "host free of %p: not a live page-locked host allocation", ptr);
    free(ptr);
    return SIM_OK;
}

/* ========================================================================== */
/* range checks                                                               */
/* ========================================================================== */

sim_status sim_check_range(const void *p, size_t n, int want, sim_ref *ref, const char *what)
{
    const char *c = p;
    int phys = sim_arena_of(p);
    if (phys >= 0) {
        sim_device *d = &G.dev[phys];
        if (want == WANT_HOST)
            return sim_fail(SIM_E_DIRECTION, "the %s %p is device memory (device %d), but the copy kind says "
                            "host memory", what, p, sim_phys_to_logical(phys));
        pthread_mutex_lock(&d->lock);
        size_t off = (size_t)(c - d->base);
        long i = sim_alloc_floor(d, off);
        if (i < 0 || off >= d->allocs[i].off + d->allocs[i].size) {
            pthread_mutex_unlock(&d->lock);
            return sim_fail(SIM_E_OUT_OF_RANGE, "the %s %p is not inside a live allocation of device %d "
                            "(freed, or never allocated)", what, p, sim_phys_to_logical(phys));
        }
        sim_alloc a = d->allocs[i];
        pthread_mutex_unlock(&d->lock);
        if (off + n > a.off + a.size || off + n < off)
            return sim_fail(SIM_E_OUT_OF_RANGE, "the %s range of %zu bytes at offset %zu runs past the end of "
                            "its %zu-byte allocation on device %d", what, n, off - a.off, a.size,
                            sim_phys_to_logical(phys));
        *ref = (sim_ref){REF_DEV, phys, a.id};
        return SIM_OK;
    }
    int found = 0;
    sim_import im = {0};
    pthread_mutex_lock(&G.import_lock);
    for (size_t i = 0; i < G.nimports; i++) {
        if (c >= G.imports[i].map && c < G.imports[i].map + G.imports[i].map_len) {
            im = G.imports[i];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&G.import_lock);
    if (found) {
        if (want == WANT_HOST)
            return sim_fail(SIM_E_DIRECTION, "the %s %p is device memory opened from an IPC handle, but the copy "
                            "kind says host memory", what, p);
        if (c < im.ptr || c + n > im.ptr + im.size || c + n < c)
            return sim_fail(SIM_E_OUT_OF_RANGE, "the %s range of %zu bytes at %p runs outside the %zu-byte "
                            "allocation opened from an IPC handle", what, n, p, im.size);
        *ref = (sim_ref){REF_IMPORT, im.dev, im.id};
        return SIM_OK;
    }
    if (want == WANT_DEVICE)
        return sim_fail(SIM_E_DIRECTION, "the %s %p is not device memory of this simulator", what, p);
    for (int i = 0; i < G.nphys; i++) {
        const char *b = ALOAD(&G.dev[i].base);
        if (b && c < b && c + n > b)
            return sim_fail(SIM_E_OUT_OF_RANGE, "the host %s range of %zu bytes at %p runs into device memory",
                            what, n, p);
    }
    *ref = (sim_ref){REF_HOST, -1, 0};
    return SIM_OK;
}

int sim_ref_valid(const sim_ref *ref, const char *p, size_t n)
{
    if (ref->kind == REF_HOST)
        return 1;
    if (ref->kind == REF_DEV) {
        sim_device *d = &G.dev[ref->dev];
        int ok = 0;
        pthread_mutex_lock(&d->lock);
        if (d->base) {
            size_t off = (size_t)(p - d->base);
            long i = sim_alloc_floor(d, off);
            ok = i >= 0 && d->allocs[i].id == ref->id && off + n <= d->allocs[i].off + d->allocs[i].size;
        }
        pthread_mutex_unlock(&d->lock);
        return ok;
    }
    int ok = 0;
    pthread_mutex_lock(&G.import_lock);
    for (size_t i = 0; i < G.nimports; i++)
        if (G.imports[i].id == ref->id) {
            ok = 1;
            break;
        }
    pthread_mutex_unlock(&G.import_lock);
    return ok;
}

/* the parent's arenas are unmapped in the child; its tables are leaked on purpose */
void sim_memory_atfork_child(void)
{
    pthread_mutex_init(&G.host_lock, NULL);
    pthread_mutex_init(&G.import_lock, NULL);
    G.host_allocs = (ptr_map){0};
    G.imports = NULL;
    G.nimports = G.cap_imports = 0;
    for (int i = 0; i < SIM_MAX_DEVICES; i++) {
        sim_device *d = &G.dev[i];
        pthread_mutex_init(&d->lock, NULL);
        pthread_mutex_init(&d->streams_lock, NULL);
        if (d->base)
            munmap(d->base, G.capacity);
        if (d->fd >= 0)
            close(d->fd);
        d->base = NULL;
        d->fd = -1;
        d->used = 0;
        d->allocs = NULL;
        d->frees = NULL;
        d->nallocs = d->nfrees = d->cap_allocs = d->cap_frees = 0;
        d->streams = NULL;
        d->default_stream = NULL;
    }
}
