/*
 * Handles: streams and events are handed out as opaque values (a never reused id and a
 * type tag) and looked up in one registry on every call, so a destroyed or made-up
 * handle is an error, never a crash. Also the small containers the core uses.
 */
#include "internal.h"

#include <stdlib.h>

/* open-addressing map: linear probing, deletion by backward shift (no tombstones) */

static inline size_t map_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

void *map_get(const ptr_map *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = map_hash(key) & mask;; i = (i + 1) & mask) {
        if (m->slots[i].key == key)
            return m->slots[i].val;
        if (m->slots[i].key == 0)
            return NULL;
    }
}

int map_put(ptr_map *m, uint64_t key, void *val)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        map_slot *ns = calloc(ncap, sizeof *ns);
        if (!ns)
            return -1;
        for (size_t j = 0; j < m->cap; j++) {
            if (!m->slots[j].key)
                continue;
            size_t i = map_hash(m->slots[j].key) & (ncap - 1);
            while (ns[i].key)
                i = (i + 1) & (ncap - 1);
            ns[i] = m->slots[j];
        }
        free(m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    size_t mask = m->cap - 1, i = map_hash(key) & mask;
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & mask;
    if (!m->slots[i].key)
        m->n++;
    m->slots[i].key = key;
    m->slots[i].val = val;
    return 0;
}

void *map_del(ptr_map *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1, i = map_hash(key) & mask;
    while (m->slots[i].key != key) {
        if (!m->slots[i].key)
            return NULL;
        i = (i + 1) & mask;
    }
    void *val = m->slots[i].val;
    /* backward-shift the following cluster */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->slots[j].key)
            break;
        size_t home = map_hash(m->slots[j].key) & mask;
        /* can the entry at j move to the hole at i? (is home cyclically outside (i, j]) */
        int movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].key = 0;
    m->slots[i].val = NULL;
    m->n--;
    return val;
}

int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

int sim_registry_add(uint64_t handle, void *obj)
{
    pthread_mutex_lock(&G.reg_lock);
    int rc = map_put(&G.registry, handle, obj);
    pthread_mutex_unlock(&G.reg_lock);
    return rc;
}

static void take_ref(void *obj, unsigned tag)
{
    if (tag == TAG_STREAM)
        __atomic_add_fetch(&((sim_stream *)obj)->refs, 1, __ATOMIC_RELAXED);
    else
        sim_event_ref(obj);
}

void *sim_registry_get(void *handle, unsigned tag)
{
    uint64_t key = (uint64_t)(uintptr_t)handle;
    if ((key & 0xFu) != tag)
        return NULL;
    pthread_mutex_lock(&G.reg_lock);
    void *obj = map_get(&G.registry, key);
    if (obj)
        take_ref(obj, tag);
    pthread_mutex_unlock(&G.reg_lock);
    return obj;
}

void *sim_registry_take(void *handle, unsigned tag)
{
    uint64_t key = (uint64_t)(uintptr_t)handle;
    if ((key & 0xFu) != tag)
        return NULL;
    pthread_mutex_lock(&G.reg_lock);
    void *obj = map_del(&G.registry, key);
    pthread_mutex_unlock(&G.reg_lock);
    return obj;
}

/* the parent's objects are leaked on purpose: their threads do not exist in the child */
void sim_handles_atfork_child(void)
{
    pthread_mutex_init(&G.reg_lock, NULL);
    G.registry = (ptr_map){0};
}
