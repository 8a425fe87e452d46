/* kvev.h - KV-cache events: what the engine caches where, published to
 * KV-aware routers in vLLM's wire format (docs/kv-events.md).
 *
 * Model: every change of which tier holds a block (a full KV page, keyed by
 * its prefix-cache chain hash, pfx.h) is one event: BlockStored when a tier
 * starts holding it, BlockRemoved when it stops, AllBlocksCleared when the
 * publisher starts (a router then forgets what it knew of this engine).
 * Tiers are vLLM's "mediums": the device pool is "GPU" (on a CPU engine too:
 * it is the pool requests compute in), the host tier "CPU", the NVMe tier
 * "DISK". A table of the blocks some tier holds keeps each block's parent
 * hash, tokens and tenant, so a store into a lower tier carries what the
 * device store did (also after a gap no medium held it in: a demotion's NVMe
 * write lands after the host copy went; such entries are forgotten when the
 * table needs room), and an overflowed queue can be replaced by a snapshot.
 *
 * Wire (vLLM vllm/distributed/kv_events.py, ZmqEventPublisher): a ZeroMQ PUB
 * socket sends each batch as 3 frames: topic, an 8-byte big-endian sequence
 * number (0, 1, ...), a msgpack payload [ts, [events], data_parallel_rank];
 * a ROUTER socket answers a request (an 8-byte big-endian start sequence)
 * with every buffered batch from it, then (-1, empty). kvev_pack.c encodes.
 *
 * Workflow (the engine): kvev_open -> kvev_cleared (nothing persisted) or a
 * kvev_stored per persisted block -> kvev_stored/kvev_removed as tiers
 * change -> kvev_flush at the end of each step -> kvev_close.
 *
 * Thread safety: kvev_stored, kvev_removed, kvev_cleared, kvev_flush and
 * kvev_stats_get take one mutex and never block on I/O or on the network
 * (any thread: the engine's, the NVMe tier's under its own lock); one
 * thread of its own owns the sockets. Lock order: a tier's lock, then kvev's.
 */
#ifndef LLMD_KVEV_H
#define LLMD_KVEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvev;

#define KVEV_HASH_BYTES 32 /* = PFX_HASH_BYTES */

/* vLLM's `medium` of a block. */
enum kvev_medium {
    KVEV_GPU = 0, /* the device pool ("GPU" even on a CPU engine: docs/kv-events.md) */
    KVEV_CPU,     /* the host tier */
    KVEV_DISK,    /* the NVMe tier */
    KVEV_N_MEDIA,
};

enum kvev_type {
    KVEV_STORED = 0,
    KVEV_REMOVED,
    KVEV_CLEARED,
};

/* One block's event, as kvev_pack_batch() takes them. */
struct kvev_event {
    uint8_t type;   /* enum kvev_type */
    uint8_t medium; /* enum kvev_medium (not for KVEV_CLEARED) */
    bool has_parent;
    uint32_t tenant;   /* the entry's owner; 0 is the default tenant */
    uint32_t tok_off;  /* first token in the batch's token array */
    uint32_t n_tokens; /* 0 (unknown or not exported) or block_size */
    uint8_t hash[KVEV_HASH_BYTES];
    uint8_t parent[KVEV_HASH_BYTES]; /* valid when has_parent */
};

/* What kvev_pack_batch() encodes: events[0..n_events) in order, their
 * tokens in tokens[] (int32 token ids). Both borrowed. */
struct kvev_batch {
    const struct kvev_event *events;
    uint32_t n_events;
    const int32_t *tokens;
    double ts;           /* seconds since the epoch (vLLM: time.time()) */
    int32_t dp_rank;     /* data_parallel_rank: 0 for one engine */
    uint32_t block_size; /* tokens per block (page) */
};

struct kvev_buf {
    uint8_t *data; /* mem_alloc'd; caller frees with mem_free */
    size_t len, cap;
};

/* Encode b as vLLM's msgpack payload into out (appended; out->data may be
 * NULL and len 0 at first). The layout is msgspec's for vLLM's
 * array_like structs (the one llm-d's and AIBrix's consumers decode):
 *   [ts (float 64), [event...], dp_rank]
 *   event: ["BlockStored", [hash (bin 32)...], parent (bin 32 | nil),
 *           [token...], block_size, lora_id (nil), medium, lora_name (nil)
 *           (, extra_keys: [["llmd.tenant", tenant] | nil per block])]
 *        | ["BlockRemoved", [hash...], medium] | ["AllBlocksCleared"]
 * Runs of stores that chain (each block's parent the previous block, one
 * medium, one tenant) become one BlockStored, runs of removals of one medium
 * one BlockRemoved, as vLLM groups a request's blocks. extra_keys is given
 * only when a block of the event belongs to a tenant other than 0.
 * token_ids false sends empty token lists. Returns 0, -ENOMEM. Any thread:
 * pure. */
int kvev_pack_batch(const struct kvev_batch *b, bool token_ids, struct kvev_buf *out);

struct kvev_config {
    const char *endpoint;        /* PUB endpoint; bound when it holds '*' or "::" or is
                                  * ipc:// or inproc://, else connected (vLLM's rule:
                                  * bind stable, connect volatile). Borrowed for open */
    const char *replay_endpoint; /* ROUTER endpoint, always bound; NULL: no replay */
    const char *topic;           /* first frame of every batch; NULL: "" */
    uint32_t block_size;         /* tokens per block (page) */
    uint32_t buffer_steps;       /* batches kept for replay; 0: 10000 (vLLM's) */
    uint32_t max_queue;          /* events waiting to be sent before new ones are dropped
                                  * (the high-water mark); 0: 100000 (vLLM's) */
    uint32_t hwm;                /* ZMQ_SNDHWM of the PUB socket, in batches; 0: 100000 */
    bool no_token_ids;           /* true: every token_ids list is empty */
    int32_t dp_rank;             /* data_parallel_rank of every batch */
};

/* Open the sockets and start the publisher thread. cfg is copied (its
 * strings too). errbuf (may be NULL) says why on failure. Returns 0,
 * -EINVAL (no endpoint, block_size 0), -EADDRINUSE, -EPROTONOSUPPORT (an
 * endpoint ZeroMQ does not take), -ENOMEM, -EIO (another socket failure,
 * with ZeroMQ's message). */
int kvev_open(const struct kvev_config *cfg, struct kvev **out, char *errbuf, size_t errlen);

/* Send what is queued (bounded: 1 s), stop the thread, close the sockets,
 * free everything. NULL is a no-op. */
void kvev_close(struct kvev *k);

/* medium now holds block hash. parent (NULL: a root block) and
 * tokens[0..n_tokens) (NULL or n_tokens 0: reuse what an earlier store of
 * this block gave, or none) are borrowed for the call. A block a medium
 * holds already is not announced again. Never blocks. */
void kvev_stored(struct kvev *k, enum kvev_medium medium, const uint8_t hash[KVEV_HASH_BYTES],
                 const uint8_t parent[KVEV_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
                 uint32_t tenant);

/* medium no longer holds hash (a medium that did not hold it: nothing is
 * sent). Never blocks. */
void kvev_removed(struct kvev *k, enum kvev_medium medium, const uint8_t hash[KVEV_HASH_BYTES]);

/* Every medium is empty: AllBlocksCleared, and the block table is emptied.
 * Never blocks. */
void kvev_cleared(struct kvev *k);

/* End of a step: what was queued since the last flush becomes one batch and
 * the publisher thread is woken. (The thread also sends events left queued
 * for 100 ms, e.g. the NVMe tier's while the engine idles.) Never blocks. */
void kvev_flush(struct kvev *k);

struct kvev_stats {
    uint64_t events_total;          /* block events queued (a chained store of n blocks: n) */
    uint64_t dropped_events_total;  /* refused at max_queue; a snapshot replaced them */
    uint64_t batches_total;         /* batches sent (sequence numbers used) */
    uint64_t snapshots_total;       /* AllBlocksCleared + every held block, after a drop */
    uint64_t replay_requests_total; /* received; a malformed one is logged, unanswered */
    uint64_t blocks;                /* blocks some medium holds now */
    uint64_t queued_events;         /* waiting to be sent */
};

/* A snapshot of the counters. Any thread. */
void kvev_stats_get(struct kvev *k, struct kvev_stats *out);

/* True when medium holds hash, as the events told (tests). Any thread. */
bool kvev_holds(struct kvev *k, enum kvev_medium medium, const uint8_t hash[KVEV_HASH_BYTES]);

/* "GPU", "CPU", "DISK"; "?" out of range. Static. */
const char *kvev_medium_name(unsigned m);

#endif /* LLMD_KVEV_H */
