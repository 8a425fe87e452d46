/* ofl_log.c - the eviction log ring (ofl_log.h). */
#include "offload/ofl_log.h"

#include <errno.h>
#include <time.h>

#include "mem.h"

#define OFL_LOG_DEFAULT_CAP 4096

int ofl_log_init(struct ofl_log *l, uint32_t cap) {
    l->cap = cap ? cap : OFL_LOG_DEFAULT_CAP;
    l->next_seq = 1;
    l->ring = mem_calloc(MEM_OFL, l->cap, sizeof *l->ring);
    if (!l->ring)
        return -ENOMEM;
    pthread_mutex_init(&l->lock, NULL);
    return 0;
}

void ofl_log_fini(struct ofl_log *l) {
    if (!l->ring)
        return;
    pthread_mutex_destroy(&l->lock);
    mem_free(l->ring);
    l->ring = NULL;
}

void ofl_log_add(struct ofl_log *l, struct ofl_event ev) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ev.time_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    pthread_mutex_lock(&l->lock);
    ev.seq = l->next_seq++;
    l->ring[ev.seq % l->cap] = ev;
    pthread_mutex_unlock(&l->lock);
}

uint32_t ofl_log_read(struct ofl_log *l, uint64_t *cursor, struct ofl_event *out, uint32_t max,
                      uint64_t *lost) {
    uint32_t n = 0;
    pthread_mutex_lock(&l->lock);
    uint64_t last = l->next_seq - 1; /* newest event written */
    uint64_t oldest = last >= l->cap ? last - l->cap + 1 : 1;
    /* a cursor past the newest event is from an earlier log (the engine restarted and
     * numbers from 1 again): read this one from its start rather than nothing until
     * it catches up */
    uint64_t from = *cursor > last ? 1 : *cursor + 1;
    if (lost)
        *lost = from < oldest ? oldest - from : 0;
    if (from < oldest)
        from = oldest;
    for (uint64_t s = from; s <= last && n < max; s++)
        out[n++] = l->ring[s % l->cap];
    if (n)
        *cursor = out[n - 1].seq;
    else if (from > *cursor + 1)
        *cursor = from - 1; /* the lost ones are skipped, not reported twice */
    pthread_mutex_unlock(&l->lock);
    return n;
}

const char *ofl_tier_name(unsigned t) {
    static const char *const names[] = {"device", "host", "nvme", "none"};
    return t < sizeof names / sizeof names[0] ? names[t] : "?";
}

const char *ofl_reason_name(unsigned r) {
    static const char *const names[] = {"evict", "demote", "hit", "policy", "fault", "purge"};
    return r < sizeof names / sizeof names[0] ? names[r] : "?";
}
