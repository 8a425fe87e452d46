/* kvev.c - the KV-event queue, the table of held blocks, and the ZeroMQ
 * publisher thread (kvev.h; wire format: kvev_pack.c, docs/kv-events.md). */
#include "engine/core/kvev.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "log.h"
#include "mem.h"

#define KVEV_NIL           UINT32_MAX
#define KVEV_IDLE_FLUSH_NS 100000000ull /* events queued this long go out without a flush */
#define KVEV_POLL_MS       50
#define KVEV_MAX_CUTS      4096 /* step boundaries kept; more merge into one batch */

/* A block some medium holds, or held: one no medium holds keeps its parent
 * and tokens (its hash's, whatever tier stores it next: a demotion's NVMe
 * write lands after the host copy went) until the table needs its entry. */
struct kvev_blk {
    uint8_t hash[KVEV_HASH_BYTES];
    uint8_t parent[KVEV_HASH_BYTES];
    bool has_parent;
    bool known;    /* in a hash chain; false: on the free list */
    uint8_t media; /* bit m: medium m holds it */
    uint32_t tenant;
    uint32_t n_tokens;
    uint32_t next; /* hash chain, or the free list */
};

/* Events waiting to be sent: events[0..n) with their tokens, cut into
 * batches at cuts[0..n_cuts) (event indices, increasing). */
struct kvev_queue {
    struct kvev_event *ev;
    uint32_t n, cap;
    int32_t *tok;
    uint32_t n_tok, cap_tok;
    uint32_t cuts[KVEV_MAX_CUTS];
    uint32_t n_cuts;
};

struct kvev_replay {
    uint64_t seq;
    struct kvev_buf payload;
};

struct kvev {
    struct kvev_config cfg;
    char *endpoint, *replay_endpoint, *topic;
    pthread_mutex_t lock; /* everything below but the sockets and the replay ring */
    struct kvev_queue q;
    uint64_t last_flush_ns;
    bool overflow; /* events were dropped: the next batch is a snapshot */
    struct kvev_blk *blk;
    int32_t *blk_tok; /* [blk_cap][block_size], or NULL without token ids */
    uint32_t blk_cap, blk_n, blk_free;
    uint32_t *heads; /* [mask + 1] chain heads */
    uint32_t mask;
    struct kvev_stats c;
    bool lost_logged;
    /* the publisher thread's */
    void *zctx, *pub, *router;
    int efd;
    pthread_t thread;
    bool stop;             /* under lock */
    struct kvev_queue out; /* what the thread took to send */
    struct kvev_replay *ring;
    uint32_t ring_n, ring_head;
    uint64_t next_seq;
};

static uint64_t kvev_now_ns(clockid_t clk) {
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the block table ---- */

static uint32_t kvev_home(const struct kvev *k, const uint8_t *hash) {
    uint32_t h;
    memcpy(&h, hash, sizeof h); /* an HMAC output: uniform already */
    return h & k->mask;
}

static uint32_t kvev_blk_find_locked(const struct kvev *k, const uint8_t *hash) {
    for (uint32_t i = k->heads ? k->heads[kvev_home(k, hash)] : KVEV_NIL; i != KVEV_NIL;
         i = k->blk[i].next)
        if (memcmp(k->blk[i].hash, hash, KVEV_HASH_BYTES) == 0)
            return i;
    return KVEV_NIL;
}

static int kvev_blk_grow_locked(struct kvev *k) {
    uint32_t cap = k->blk_cap ? k->blk_cap * 2 : 1024;
    size_t blk_bytes = (size_t)cap * sizeof(struct kvev_blk);
    struct kvev_blk *blk = k->blk ? mem_realloc(k->blk, blk_bytes) : mem_alloc(MEM_KVEV, blk_bytes);
    if (!blk)
        return -ENOMEM;
    k->blk = blk;
    if (!k->cfg.no_token_ids) {
        size_t bytes = (size_t)cap * k->cfg.block_size * sizeof(int32_t);
        int32_t *tok = k->blk_tok ? mem_realloc(k->blk_tok, bytes) : mem_alloc(MEM_KVEV, bytes);
        if (!tok)
            return -ENOMEM;
        k->blk_tok = tok;
    }
    uint32_t *heads = mem_alloc(MEM_KVEV, (size_t)cap * sizeof *heads);
    if (!heads)
        return -ENOMEM;
    mem_free(k->heads);
    k->heads = heads;
    k->mask = cap - 1;
    memset(heads, 0xff, (size_t)cap * sizeof *heads);
    for (uint32_t i = k->blk_cap; i < cap; i++)
        blk[i] = (struct kvev_blk){.next = i + 1 < cap ? i + 1 : k->blk_free};
    k->blk_free = k->blk_cap < cap ? k->blk_cap : k->blk_free;
    for (uint32_t i = 0; i < k->blk_cap; i++) {
        if (!blk[i].known)
            continue;
        uint32_t h = kvev_home(k, blk[i].hash);
        blk[i].next = heads[h];
        heads[h] = i;
    }
    /* free entries below the old cap keep their free-list links */
    k->blk_cap = cap;
    return 0;
}

static void kvev_blk_del_locked(struct kvev *k, uint32_t i);

/* The free list ran out: forget the blocks no medium holds, and grow when
 * that frees less than a quarter of the table (amortized O(1) an add). */
static int kvev_blk_room_locked(struct kvev *k) {
    uint32_t freed = 0;
    for (uint32_t i = 0; i < k->blk_cap; i++)
        if (k->blk[i].known && !k->blk[i].media) {
            kvev_blk_del_locked(k, i);
            freed++;
        }
    return freed >= k->blk_cap / 4 && freed ? 0 : kvev_blk_grow_locked(k);
}

static uint32_t kvev_blk_add_locked(struct kvev *k, const uint8_t *hash) {
    if (k->blk_free == KVEV_NIL && kvev_blk_room_locked(k) < 0 && k->blk_free == KVEV_NIL)
        return KVEV_NIL;
    uint32_t i = k->blk_free;
    k->blk_free = k->blk[i].next;
    struct kvev_blk *b = &k->blk[i];
    *b = (struct kvev_blk){.known = true};
    memcpy(b->hash, hash, KVEV_HASH_BYTES);
    uint32_t h = kvev_home(k, hash);
    b->next = k->heads[h];
    k->heads[h] = i;
    return i;
}

static void kvev_blk_del_locked(struct kvev *k, uint32_t i) {
    uint32_t *p = &k->heads[kvev_home(k, k->blk[i].hash)];
    while (*p != i)
        p = &k->blk[*p].next;
    *p = k->blk[i].next;
    k->blk_n -= k->blk[i].media != 0;
    k->blk[i].media = 0;
    k->blk[i].known = false;
    k->blk[i].next = k->blk_free;
    k->blk_free = i;
}

/* ---- the queue ---- */

/* Grow *arr (elements of `size` bytes, *cap of them) to hold `need`. */
static int kvev_grow(void **arr, uint32_t *cap, uint32_t need, size_t size, uint32_t first) {
    if (need <= *cap)
        return 0;
    uint32_t c = *cap ? *cap : first;
    while (c < need)
        c *= 2;
    void *p = *arr ? mem_realloc(*arr, (size_t)c * size) : mem_alloc(MEM_KVEV, (size_t)c * size);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = c;
    return 0;
}

static int kvev_q_reserve(struct kvev_queue *q, uint32_t n_ev, uint32_t n_tok) {
    void *ev = q->ev, *tok = q->tok;
    int rc = kvev_grow(&ev, &q->cap, q->n + n_ev, sizeof *q->ev, 256);
    q->ev = ev;
    if (rc == 0 && n_tok)
        rc = kvev_grow(&tok, &q->cap_tok, q->n_tok + n_tok, sizeof *q->tok, 1024);
    q->tok = tok;
    return rc;
}

static void kvev_q_free(struct kvev_queue *q) {
    mem_free(q->ev);
    mem_free(q->tok);
    *q = (struct kvev_queue){0};
}

/* Queue block i's event for `medium`; false when the queue is full. */
static bool kvev_q_push_locked(struct kvev *k, uint8_t type, unsigned medium, uint32_t i) {
    const struct kvev_blk *b = &k->blk[i];
    uint32_t n_tok = type == KVEV_STORED ? b->n_tokens : 0;
    if (k->overflow || k->q.n >= k->cfg.max_queue || kvev_q_reserve(&k->q, 1, n_tok) < 0) {
        k->overflow = true;
        k->c.dropped_events_total++;
        return false;
    }
    struct kvev_event *e = &k->q.ev[k->q.n++];
    *e = (struct kvev_event){.type = type,
                             .medium = (uint8_t)medium,
                             .has_parent = b->has_parent,
                             .tenant = b->tenant,
                             .tok_off = k->q.n_tok,
                             .n_tokens = n_tok};
    memcpy(e->hash, b->hash, KVEV_HASH_BYTES);
    memcpy(e->parent, b->parent, KVEV_HASH_BYTES);
    if (n_tok)
        memcpy(&k->q.tok[k->q.n_tok], &k->blk_tok[(size_t)i * k->cfg.block_size],
               n_tok * sizeof(int32_t));
    k->q.n_tok += n_tok;
    k->c.events_total++;
    return true;
}

static void kvev_lost_locked(struct kvev *k) {
    k->overflow = true; /* the snapshot will not have it either: say so once */
    k->c.dropped_events_total++;
    if (!k->lost_logged)
        LOG_WARN("kvev", "out of memory for the block table: routers may miss blocks");
    k->lost_logged = true;
}

void kvev_stored(struct kvev *k, enum kvev_medium medium, const uint8_t hash[KVEV_HASH_BYTES],
                 const uint8_t parent[KVEV_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
                 uint32_t tenant) {
    if (!k || (unsigned)medium >= KVEV_N_MEDIA)
        return;
    pthread_mutex_lock(&k->lock);
    uint32_t i = kvev_blk_find_locked(k, hash);
    if (i == KVEV_NIL) {
        i = kvev_blk_add_locked(k, hash);
        if (i == KVEV_NIL) {
            kvev_lost_locked(k);
            pthread_mutex_unlock(&k->lock);
            return;
        }
    }
    struct kvev_blk *b = &k->blk[i];
    if (medium == KVEV_GPU || !b->media)
        b->tenant = tenant; /* the engine's word; a lower tier may not know it */
    if (parent && !b->has_parent) {
        memcpy(b->parent, parent, KVEV_HASH_BYTES);
        b->has_parent = true;
    }
    if (tokens && n_tokens == k->cfg.block_size && !b->n_tokens && !k->cfg.no_token_ids) {
        memcpy(&k->blk_tok[(size_t)i * k->cfg.block_size], tokens, n_tokens * sizeof(int32_t));
        b->n_tokens = n_tokens;
    }
    if (!(b->media & (1u << medium))) {
        k->blk_n += !b->media;
        b->media |= (uint8_t)(1u << medium);
        kvev_q_push_locked(k, KVEV_STORED, medium, i);
    }
    pthread_mutex_unlock(&k->lock);
}

void kvev_removed(struct kvev *k, enum kvev_medium medium, const uint8_t hash[KVEV_HASH_BYTES]) {
    if (!k || (unsigned)medium >= KVEV_N_MEDIA)
        return;
    pthread_mutex_lock(&k->lock);
    uint32_t i = kvev_blk_find_locked(k, hash);
    if (i != KVEV_NIL && (k->blk[i].media & (1u << medium))) {
        k->blk[i].media &= (uint8_t) ~(1u << medium);
        kvev_q_push_locked(k, KVEV_REMOVED, medium, i);
        k->blk_n -= !k->blk[i].media; /* its entry stays, for a later store */
    }
    pthread_mutex_unlock(&k->lock);
}

void kvev_cleared(struct kvev *k) {
    if (!k)
        return;
    pthread_mutex_lock(&k->lock);
    for (uint32_t i = 0; i < k->blk_cap; i++)
        if (k->blk[i].known)
            kvev_blk_del_locked(k, i);
    if (!k->overflow && k->q.n < k->cfg.max_queue && kvev_q_reserve(&k->q, 1, 0) == 0) {
        k->q.ev[k->q.n++] = (struct kvev_event){.type = KVEV_CLEARED, .tok_off = k->q.n_tok};
        k->c.events_total++;
    } else {
        k->overflow = true; /* the snapshot starts with a clear */
    }
    pthread_mutex_unlock(&k->lock);
}

static void kvev_cut_locked(struct kvev *k) {
    uint32_t last = k->q.n_cuts ? k->q.cuts[k->q.n_cuts - 1] : 0;
    if (k->q.n == last)
        return;
    if (k->q.n_cuts == KVEV_MAX_CUTS)
        k->q.cuts[k->q.n_cuts - 1] = k->q.n; /* merge into the last batch */
    else
        k->q.cuts[k->q.n_cuts++] = k->q.n;
}

void kvev_flush(struct kvev *k) {
    if (!k)
        return;
    pthread_mutex_lock(&k->lock);
    bool any = k->q.n > (k->q.n_cuts ? k->q.cuts[k->q.n_cuts - 1] : 0) || k->overflow;
    kvev_cut_locked(k);
    k->last_flush_ns = kvev_now_ns(CLOCK_MONOTONIC);
    pthread_mutex_unlock(&k->lock);
    if (any) {
        uint64_t one = 1;
        ssize_t w = write(k->efd, &one, sizeof one); /* non-blocking; a full counter is awake */
        (void)w;
    }
}

void kvev_stats_get(struct kvev *k, struct kvev_stats *out) {
    pthread_mutex_lock(&k->lock);
    *out = k->c;
    out->blocks = k->blk_n;
    out->queued_events = k->q.n;
    pthread_mutex_unlock(&k->lock);
}

bool kvev_holds(struct kvev *k, enum kvev_medium medium, const uint8_t hash[KVEV_HASH_BYTES]) {
    pthread_mutex_lock(&k->lock);
    uint32_t i = kvev_blk_find_locked(k, hash);
    bool held = i != KVEV_NIL && (k->blk[i].media & (1u << medium));
    pthread_mutex_unlock(&k->lock);
    return held;
}

/* ---- the publisher thread ---- */

/* Move the batches due (cut, or idle past KVEV_IDLE_FLUSH_NS, or all at
 * `all`) from k->q into k->out; after an overflow, a snapshot of the table
 * instead of the queue. */
static void kvev_take(struct kvev *k, bool all) {
    struct kvev_queue *q = &k->q, *o = &k->out;
    o->n = o->n_tok = o->n_cuts = 0;
    pthread_mutex_lock(&k->lock);
    if (all || kvev_now_ns(CLOCK_MONOTONIC) - k->last_flush_ns > KVEV_IDLE_FLUSH_NS)
        kvev_cut_locked(k);
    if (k->overflow) {
        /* the table is right even where the queue lost events: send it whole */
        uint32_t n_ev = 1, n_tok = 0;
        for (uint32_t i = 0; i < k->blk_cap; i++)
            if (k->blk[i].media)
                for (unsigned m = 0; m < KVEV_N_MEDIA; m++)
                    if (k->blk[i].media & (1u << m)) {
                        n_ev++;
                        n_tok += k->blk[i].n_tokens;
                    }
        if (kvev_q_reserve(o, n_ev, n_tok) == 0) {
            o->ev[o->n++] = (struct kvev_event){.type = KVEV_CLEARED};
            for (uint32_t i = 0; i < k->blk_cap; i++) {
                const struct kvev_blk *b = &k->blk[i];
                for (unsigned m = 0; m < KVEV_N_MEDIA && b->media; m++) {
                    if (!(b->media & (1u << m)))
                        continue;
                    struct kvev_event *e = &o->ev[o->n++];
                    *e = (struct kvev_event){.type = KVEV_STORED,
                                             .medium = (uint8_t)m,
                                             .has_parent = b->has_parent,
                                             .tenant = b->tenant,
                                             .tok_off = o->n_tok,
                                             .n_tokens = b->n_tokens};
                    memcpy(e->hash, b->hash, KVEV_HASH_BYTES);
                    memcpy(e->parent, b->parent, KVEV_HASH_BYTES);
                    if (b->n_tokens)
                        memcpy(&o->tok[o->n_tok], &k->blk_tok[(size_t)i * k->cfg.block_size],
                               b->n_tokens * sizeof(int32_t));
                    o->n_tok += b->n_tokens;
                }
            }
            o->cuts[o->n_cuts++] = o->n;
            q->n = q->n_tok = q->n_cuts = 0;
            k->overflow = false;
            k->c.snapshots_total++;
        } /* else: no memory now; the next round tries again */
        pthread_mutex_unlock(&k->lock);
        return;
    }
    uint32_t take = q->n_cuts ? q->cuts[q->n_cuts - 1] : 0;
    if (take == 0 || kvev_q_reserve(o, take, take < q->n ? q->ev[take].tok_off : q->n_tok) < 0) {
        pthread_mutex_unlock(&k->lock);
        return;
    }
    uint32_t tok_take = take < q->n ? q->ev[take].tok_off : q->n_tok;
    memcpy(o->ev, q->ev, take * sizeof *q->ev);
    if (tok_take) /* no token ids: the arrays may be NULL */
        memcpy(o->tok, q->tok, tok_take * sizeof *q->tok);
    memcpy(o->cuts, q->cuts, q->n_cuts * sizeof *q->cuts);
    o->n = take;
    o->n_tok = tok_take;
    o->n_cuts = q->n_cuts;
    memmove(q->ev, q->ev + take, (q->n - take) * sizeof *q->ev);
    if (q->n_tok > tok_take)
        memmove(q->tok, q->tok + tok_take, (q->n_tok - tok_take) * sizeof *q->tok);
    q->n -= take;
    q->n_tok -= tok_take;
    q->n_cuts = 0;
    for (uint32_t j = 0; j < q->n; j++)
        q->ev[j].tok_off -= tok_take;
    pthread_mutex_unlock(&k->lock);
}

static void kvev_seq_bytes(uint64_t seq, uint8_t b[8]) {
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(seq >> (56 - 8 * i));
}

/* Pack, send and keep each batch k->out holds. */
static void kvev_send(struct kvev *k) {
    uint32_t from = 0;
    for (uint32_t c = 0; c < k->out.n_cuts; c++) {
        uint32_t to = k->out.cuts[c];
        struct kvev_batch b = {.events = k->out.ev + from,
                               .n_events = to - from,
                               .tokens = k->out.tok,
                               .ts = (double)kvev_now_ns(CLOCK_REALTIME) / 1e9,
                               .dp_rank = k->cfg.dp_rank,
                               .block_size = k->cfg.block_size};
        from = to;
        struct kvev_replay *slot = &k->ring[(k->ring_head + k->ring_n) % k->cfg.buffer_steps];
        if (k->ring_n == k->cfg.buffer_steps) {
            slot = &k->ring[k->ring_head];
            k->ring_head = (k->ring_head + 1) % k->cfg.buffer_steps;
            k->ring_n--;
        }
        slot->payload.len = 0;
        if (kvev_pack_batch(&b, !k->cfg.no_token_ids, &slot->payload) < 0) {
            pthread_mutex_lock(&k->lock);
            k->overflow = true; /* lost: a snapshot follows */
            k->c.dropped_events_total += b.n_events;
            pthread_mutex_unlock(&k->lock);
            continue;
        }
        slot->seq = k->next_seq++;
        k->ring_n++;
        uint8_t seq[8];
        kvev_seq_bytes(slot->seq, seq);
        /* PUB never blocks: past its high-water mark ZeroMQ drops the message */
        zmq_send(k->pub, k->topic, strlen(k->topic), ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->pub, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->pub, slot->payload.data, slot->payload.len, ZMQ_DONTWAIT);
        pthread_mutex_lock(&k->lock);
        k->c.batches_total++;
        pthread_mutex_unlock(&k->lock);
    }
}

/* One replay request on the ROUTER socket: [identity, "", start (8 bytes BE)]
 * answered with [identity, "", seq, payload] per kept batch from start on,
 * then [identity, "", -1, ""] (vLLM's _service_replay). */
static void kvev_replay(struct kvev *k) {
    zmq_msg_t part[4];
    int n = 0, more = 1;
    for (int i = 0; i < 4; i++)
        zmq_msg_init(&part[i]);
    while (more) {
        zmq_msg_t scratch, *m = n < 4 ? &part[n] : &scratch;
        if (m == &scratch)
            zmq_msg_init(&scratch);
        if (zmq_msg_recv(m, k->router, ZMQ_DONTWAIT) < 0) {
            if (m == &scratch)
                zmq_msg_close(&scratch);
            break;
        }
        more = zmq_msg_more(m);
        if (m == &scratch)
            zmq_msg_close(&scratch);
        n++;
    }
    pthread_mutex_lock(&k->lock);
    k->c.replay_requests_total++;
    pthread_mutex_unlock(&k->lock);
    if (n == 3 && zmq_msg_size(&part[2]) == 8) {
        const uint8_t *s = zmq_msg_data(&part[2]);
        uint64_t start = 0;
        for (int i = 0; i < 8; i++)
            start = start << 8 | s[i];
        const void *id = zmq_msg_data(&part[0]);
        size_t id_len = zmq_msg_size(&part[0]);
        for (uint32_t j = 0; j < k->ring_n; j++) {
            const struct kvev_replay *r = &k->ring[(k->ring_head + j) % k->cfg.buffer_steps];
            if (r->seq < start)
                continue;
            uint8_t seq[8];
            kvev_seq_bytes(r->seq, seq);
            zmq_send(k->router, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(k->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(k->router, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(k->router, r->payload.data, r->payload.len, ZMQ_DONTWAIT);
        }
        uint8_t end[8];
        memset(end, 0xff, sizeof end);
        zmq_send(k->router, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->router, end, sizeof end, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->router, "", 0, ZMQ_DONTWAIT);
    } else {
        LOG_WARN("kvev", "replay request of %d frames ignored (want identity, \"\", 8-byte seq)",
                 n);
    }
    for (int i = 0; i < 4; i++)
        zmq_msg_close(&part[i]);
}

static void *kvev_main(void *arg) {
    struct kvev *k = arg;
    for (;;) {
        zmq_pollitem_t it[2] = {{.fd = k->efd, .events = ZMQ_POLLIN},
                                {.socket = k->router, .events = ZMQ_POLLIN}};
        int rc = zmq_poll(it, k->router ? 2 : 1, KVEV_POLL_MS);
        if (rc > 0 && (it[0].revents & ZMQ_POLLIN)) {
            uint64_t v;
            ssize_t r = read(k->efd, &v, sizeof v);
            (void)r;
        }
        if (rc > 0 && k->router && (it[1].revents & ZMQ_POLLIN))
            kvev_replay(k);
        pthread_mutex_lock(&k->lock);
        bool stop = k->stop;
        pthread_mutex_unlock(&k->lock);
        kvev_take(k, stop);
        kvev_send(k);
        if (stop)
            return NULL;
    }
}

/* ---- open / close ---- */

static bool kvev_binds(const char *ep) {
    return strchr(ep, '*') || strstr(ep, "::") || strncmp(ep, "ipc://", 6) == 0 ||
           strncmp(ep, "inproc://", 9) == 0;
}

static int kvev_zmq_err(char *errbuf, size_t errlen, const char *what, const char *ep) {
    int e = zmq_errno();
    log_errbuf(errbuf, errlen, "kv events: %s %s: %s", what, ep, zmq_strerror(e));
    if (e == EADDRINUSE || e == EPROTONOSUPPORT || e == ENOMEM)
        return -e;
    return e == EINVAL ? -EINVAL : -EIO;
}

/* Everything k holds, from a kvev_open that failed at any point (what it
 * had not made yet is NULL, -1 or zero) or after the thread has stopped. */
static void kvev_free(struct kvev *k) {
    if (k->router)
        zmq_close(k->router);
    if (k->pub)
        zmq_close(k->pub);
    if (k->zctx)
        zmq_ctx_term(k->zctx);
    if (k->efd >= 0)
        close(k->efd);
    for (uint32_t i = 0; k->ring && i < k->cfg.buffer_steps; i++)
        mem_free(k->ring[i].payload.data);
    mem_free(k->ring);
    kvev_q_free(&k->q);
    kvev_q_free(&k->out);
    mem_free(k->heads);
    mem_free(k->blk);
    mem_free(k->blk_tok);
    mem_free(k->endpoint);
    mem_free(k->topic);
    mem_free(k->replay_endpoint);
    pthread_mutex_destroy(&k->lock);
    mem_free(k);
}

int kvev_open(const struct kvev_config *cfg, struct kvev **out, char *errbuf, size_t errlen) {
    if (!cfg || !out || !cfg->endpoint || !*cfg->endpoint || cfg->block_size == 0) {
        log_errbuf(errbuf, errlen, "kv events: an endpoint and a block size are required");
        return -EINVAL;
    }
    struct kvev *k = mem_calloc(MEM_KVEV, 1, sizeof *k);
    if (!k)
        return -ENOMEM;
    k->cfg = *cfg;
    k->cfg.buffer_steps = cfg->buffer_steps ? cfg->buffer_steps : 10000;
    k->cfg.max_queue = cfg->max_queue ? cfg->max_queue : 100000;
    k->cfg.hwm = cfg->hwm ? cfg->hwm : 100000;
    k->efd = -1;
    k->blk_free = KVEV_NIL;
    pthread_mutex_init(&k->lock, NULL);
    int rc = -ENOMEM;
    k->endpoint = mem_strdup(MEM_KVEV, cfg->endpoint);
    k->topic = mem_strdup(MEM_KVEV, cfg->topic ? cfg->topic : "");
    k->replay_endpoint = cfg->replay_endpoint ? mem_strdup(MEM_KVEV, cfg->replay_endpoint) : NULL;
    k->ring = mem_calloc(MEM_KVEV, k->cfg.buffer_steps, sizeof *k->ring);
    if (!k->endpoint || !k->topic || (cfg->replay_endpoint && !k->replay_endpoint) || !k->ring ||
        kvev_blk_grow_locked(k) < 0)
        goto fail;
    k->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (k->efd < 0) {
        rc = -errno;
        log_errbuf(errbuf, errlen, "kv events: eventfd: %s", strerror(errno));
        goto fail;
    }
    k->zctx = zmq_ctx_new();
    if (!k->zctx || !(k->pub = zmq_socket(k->zctx, ZMQ_PUB))) {
        rc = kvev_zmq_err(errbuf, errlen, "socket for", k->endpoint);
        goto fail;
    }
    int hwm = (int)(k->cfg.hwm > INT32_MAX ? INT32_MAX : k->cfg.hwm), linger = 1000;
    zmq_setsockopt(k->pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(k->pub, ZMQ_LINGER, &linger, sizeof linger);
    bool bind = kvev_binds(k->endpoint);
    if ((bind ? zmq_bind(k->pub, k->endpoint) : zmq_connect(k->pub, k->endpoint)) != 0) {
        rc = kvev_zmq_err(errbuf, errlen, bind ? "cannot bind" : "cannot connect to", k->endpoint);
        goto fail;
    }
    if (k->replay_endpoint) {
        if (!(k->router = zmq_socket(k->zctx, ZMQ_ROUTER))) {
            rc = kvev_zmq_err(errbuf, errlen, "socket for", k->replay_endpoint);
            goto fail;
        }
        zmq_setsockopt(k->router, ZMQ_LINGER, &linger, sizeof linger);
        /* one answer is up to buffer_steps + 1 messages; past its HWM (1000
         * by default) a ROUTER drops the rest, the end marker too */
        int rhwm = (int)(k->cfg.buffer_steps >= INT32_MAX ? INT32_MAX : k->cfg.buffer_steps + 1);
        zmq_setsockopt(k->router, ZMQ_SNDHWM, &rhwm, sizeof rhwm);
        if (zmq_bind(k->router, k->replay_endpoint) != 0) {
            rc = kvev_zmq_err(errbuf, errlen, "cannot bind", k->replay_endpoint);
            goto fail;
        }
    }
    k->last_flush_ns = kvev_now_ns(CLOCK_MONOTONIC);
    rc = pthread_create(&k->thread, NULL, kvev_main, k);
    if (rc) {
        rc = -rc;
        log_errbuf(errbuf, errlen, "kv events: thread: %s", strerror(-rc));
        goto fail;
    }
    LOG_INFO("kvev", "publishing KV-cache events on %s (%s)%s%s", k->endpoint,
             bind ? "bound" : "connected", k->replay_endpoint ? ", replay on " : "",
             k->replay_endpoint ? k->replay_endpoint : "");
    *out = k;
    return 0;
fail:
    kvev_free(k);
    return rc;
}

void kvev_close(struct kvev *k) {
    if (!k)
        return;
    pthread_mutex_lock(&k->lock);
    k->stop = true;
    pthread_mutex_unlock(&k->lock);
    uint64_t one = 1;
    ssize_t w = write(k->efd, &one, sizeof one);
    (void)w;
    pthread_join(k->thread, NULL);
    kvev_free(k); /* ZMQ_LINGER bounds how long what is queued may take */
}
