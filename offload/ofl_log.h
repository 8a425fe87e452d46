/* ofl_log.h - the eviction log: a bounded in-memory ring of every spill,
 * restore, drop and purge of a KV page, for `llmctl evictions` and tests.
 *
 * Model: a ring of `cap` events; each event gets a sequence number from 1
 * up, never reused. Readers keep a cursor (the last sequence number they
 * saw) and read forward; when the writer laps them, the events they missed
 * are counted as lost, never returned twice. Events carry wall-clock time so
 * operators can match them with other logs.
 *
 * Thread safety: one mutex; ofl_log_add() from the engine thread and
 * ofl_log_read() from any thread (the admin socket's) at once. No I/O.
 */
#ifndef LLMD_OFL_LOG_H
#define LLMD_OFL_LOG_H

#include <pthread.h>
#include <stdint.h>

/* Where a page is: the device pool and the tiers below it. */
enum ofl_tier {
    OFL_TIER_DEVICE = 0,
    OFL_TIER_HOST,
    OFL_TIER_NVME,
    OFL_TIER_NONE, /* dropped: its tokens are recomputed when needed */
};

/* Why a page moved. */
enum ofl_reason {
    OFL_REASON_EVICT = 0, /* device pool short of pages: a cold cached page goes down */
    OFL_REASON_DEMOTE,    /* a tier full: its least recently used page goes down */
    OFL_REASON_HIT,       /* a request's prefix needs it: restored to the device */
    OFL_REASON_POLICY,    /* recomputing it is cheaper than keeping it lower */
    OFL_REASON_FAULT,     /* a failed or short write, a checksum mismatch, a full disk */
    OFL_REASON_PURGE,     /* the operator purged its tenant */
};

struct ofl_event {
    uint64_t seq;     /* 1, 2, ... */
    uint64_t time_ns; /* CLOCK_REALTIME */
    uint8_t hash[8];  /* first bytes of the page's chain hash */
    uint32_t page;    /* device page (UINT32_MAX when it was not on the device) */
    uint32_t tenant;  /* the entry's owner */
    uint32_t bytes;   /* bytes moved (0 for a drop or purge) */
    uint8_t from, to; /* enum ofl_tier */
    uint8_t reason;   /* enum ofl_reason */
};

struct ofl_log {
    pthread_mutex_t lock;
    struct ofl_event *ring; /* [cap] */
    uint32_t cap;
    uint64_t next_seq; /* sequence number of the next event */
};

/* Embed-style: init a log of cap events (0: 4096). Returns 0, -ENOMEM. */
int ofl_log_init(struct ofl_log *l, uint32_t cap);
void ofl_log_fini(struct ofl_log *l);

/* Append one event (seq and time_ns are filled in). Any thread. */
void ofl_log_add(struct ofl_log *l, struct ofl_event ev);

/* Copy up to max events with seq > *cursor, oldest first, into out, and
 * move *cursor to the last one copied. *lost (may be NULL) gets how many
 * events after *cursor were overwritten before this read. Returns the
 * number copied. Start with *cursor = 0; a cursor past the newest event (kept
 * from an earlier log) reads as 0. Any thread. */
uint32_t ofl_log_read(struct ofl_log *l, uint64_t *cursor, struct ofl_event *out, uint32_t max,
                      uint64_t *lost);

/* "device", "host", "nvme", "none"; "evict", "demote", "hit", "policy",
 * "fault", "purge". Static strings; "?" for out-of-range values. */
const char *ofl_tier_name(unsigned t);
const char *ofl_reason_name(unsigned r);

#endif /* LLMD_OFL_LOG_H */
