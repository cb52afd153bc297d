/* Allocator statistics, as PyTorch's DeviceStats: one Stat (current, peak,
 * allocated, freed) per kind and per pool ("all", small, large). Every change
 * goes through update_stat_array, which updates the pool and "all" together.
 * The names (anychip/runtime/alloc_stats.py) follow the order of the enums. */
#ifndef ANYCHIP_ALLOC_STATS_H
#define ANYCHIP_ALLOC_STATS_H

enum stat_kind {
    K_ALLOCATION, K_SEGMENT, K_ACTIVE, K_INACTIVE_SPLIT, K_ALLOCATED_BYTES,
    K_RESERVED_BYTES, K_ACTIVE_BYTES, K_INACTIVE_SPLIT_BYTES, K_REQUESTED_BYTES, NKIND
};
enum stat_pool { P_ALL, P_SMALL, P_LARGE, NPOOL };

typedef struct {
    long long current, peak, allocated, freed;   /* allocated / freed: totals since the last reset */
} Stat;

typedef Stat StatArray[NPOOL];

typedef struct {
    StatArray kind[NKIND];
} DeviceStats;

static inline void stat_increase(Stat *s, long long n)
{
    s->current += n;
    s->allocated += n;
    if (s->current > s->peak)
        s->peak = s->current;
}

static inline void stat_decrease(Stat *s, long long n)
{
    s->current -= n;
    s->freed += n;
}

/* Change statistic `kind` of the small (or large) pool and of "all" by delta. */
static inline void update_stat_array(DeviceStats *st, int kind, int small, long long delta)
{
    Stat *pool = &st->kind[kind][small ? P_SMALL : P_LARGE], *all = &st->kind[kind][P_ALL];
    if (delta > 0) {
        stat_increase(pool, delta);
        stat_increase(all, delta);
    } else if (delta < 0) {
        stat_decrease(pool, -delta);
        stat_decrease(all, -delta);
    }
}

static inline void reset_peaks(DeviceStats *st)
{
    for (int k = 0; k < NKIND; k++)
        for (int p = 0; p < NPOOL; p++)
            st->kind[k][p].peak = st->kind[k][p].current;
}

static inline void reset_accumulated(DeviceStats *st)
{
    for (int k = 0; k < NKIND; k++)
        for (int p = 0; p < NPOOL; p++)
            st->kind[k][p].allocated = st->kind[k][p].freed = 0;
}

#endif
