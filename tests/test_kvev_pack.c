/* KV-cache events (engine/core/kvev.h): the msgpack payload byte for byte
 * against golden bytes, and the publisher over real ZeroMQ sockets: the 3
 * frames of a batch, sequence numbers, replay from a sequence number, the
 * dedup of stores per medium, and the snapshot that replaces a queue that
 * overflowed.
 *
 * The golden bytes are python3-msgpack 1.0.3's packb(x, use_bin_type=True)
 * of the structures written beside them (an independent encoder), checked
 * by hand against the msgpack specification for the root store: 93 (array
 * of 3) cb 3ff8000000000000 (float 64 1.5) 91 98 (the event, 8 fields)
 * ab "BlockStored" 91 c4 20 <32 bytes> (one bin 8 hash) c0 (no parent)
 * 94 01 02 03 04 (tokens) 04 (block size) c0 (lora_id) a3 "GPU" c0 (lora_name)
 * 00 (data_parallel_rank). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "engine/core/kvev.h"
#include "mem.h"

static void hexify(const uint8_t *b, size_t n, char *out) {
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
    out[2 * n] = 0;
}

static struct kvev_event ev(uint8_t type, uint8_t medium, uint8_t h, int parent, uint32_t tenant,
                            uint32_t tok_off, uint32_t n_tokens) {
    struct kvev_event e = {.type = type,
                           .medium = medium,
                           .has_parent = parent >= 0,
                           .tenant = tenant,
                           .tok_off = tok_off,
                           .n_tokens = n_tokens};
    memset(e.hash, h, sizeof e.hash);
    if (parent >= 0)
        memset(e.parent, parent, sizeof e.parent);
    return e;
}

static void check_pack(const struct kvev_event *e, uint32_t n, const int32_t *tok,
                       const char *want) {
    struct kvev_batch b = {
        .events = e, .n_events = n, .tokens = tok, .ts = 1.5, .dp_rank = 0, .block_size = 4};
    struct kvev_buf out = {0};
    cr_assert_eq(kvev_pack_batch(&b, true, &out), 0);
    char *hex = malloc(2 * out.len + 1);
    hexify(out.data, out.len, hex);
    cr_expect_str_eq(hex, want);
    free(hex);
    mem_free(out.data);
}

#define A1 "c420a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
#define B1 "c420b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1"
#define B2 "c420b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"

/* [1.5, [["BlockStored", [a1*32], None, [1,2,3,4], 4, None, "GPU", None]], 0] */
Test(kvev_pack, root_store) {
    int32_t tok[] = {1, 2, 3, 4};
    struct kvev_event e[] = {ev(KVEV_STORED, KVEV_GPU, 0xa1, -1, 0, 0, 4)};
    check_pack(e, 1, tok,
               "93cb3ff80000000000009198ab426c6f636b53746f72656491" A1
               "c0940102030404c0a3475055c000");
}

/* Two stores chained on a1 (b2's parent is b1) merge into one event, tokens
 * concatenated, the tenant in extra_keys:
 * [1.5, [["BlockStored", [b1, b2], a1, [5,6,7,8,300,-1,70000,0], 4, None, "CPU", None,
 *   [["llmd.tenant", 7], ["llmd.tenant", 7]]]], 0] */
Test(kvev_pack, chained_store) {
    int32_t tok[] = {5, 6, 7, 8, 300, -1, 70000, 0};
    struct kvev_event e[] = {ev(KVEV_STORED, KVEV_CPU, 0xb1, 0xa1, 7, 0, 4),
                             ev(KVEV_STORED, KVEV_CPU, 0xb2, 0xb1, 7, 4, 4)};
    check_pack(e, 2, tok,
               "93cb3ff80000000000009199ab426c6f636b53746f72656492" B1 B2 A1
               "9805060708cd012cffce000111700004c0a3435055c09292ab6c6c6d642e74656e616e740792ab6c6c"
               "6d642e74656e616e740700");
}

/* [1.5, [["BlockRemoved", [a1, b1], "DISK"]], 0] */
Test(kvev_pack, remove) {
    struct kvev_event e[] = {ev(KVEV_REMOVED, KVEV_DISK, 0xa1, -1, 0, 0, 0),
                             ev(KVEV_REMOVED, KVEV_DISK, 0xb1, -1, 0, 0, 0)};
    check_pack(e, 2, NULL,
               "93cb3ff80000000000009193ac426c6f636b52656d6f76656492" A1 B1 "a44449534b00");
}

/* [1.5, [["AllBlocksCleared"]], 0] */
Test(kvev_pack, clear) {
    struct kvev_event e[] = {ev(KVEV_CLEARED, 0, 0, -1, 0, 0, 0)};
    check_pack(e, 1, NULL, "93cb3ff80000000000009191b0416c6c426c6f636b73436c656172656400");
}

/* What does not chain stays apart: a store whose parent is not the block
 * before it, another medium, another tenant; removals of two media. */
Test(kvev_pack, runs_split_where_they_must) {
    int32_t tok[16] = {0};
    struct kvev_event e[] = {
        ev(KVEV_STORED, KVEV_GPU, 0x01, -1, 0, 0, 4),
        ev(KVEV_STORED, KVEV_GPU, 0x02, 0x01, 0, 4, 4),
        ev(KVEV_STORED, KVEV_GPU, 0x03, 0x09, 0, 8, 4),  /* parent is not 0x02 */
        ev(KVEV_STORED, KVEV_CPU, 0x04, 0x03, 0, 12, 4), /* another medium */
        ev(KVEV_REMOVED, KVEV_GPU, 0x01, -1, 0, 16, 0),
        ev(KVEV_REMOVED, KVEV_CPU, 0x02, -1, 0, 16, 0)};
    struct kvev_batch b = {.events = e, .n_events = 6, .tokens = tok, .ts = 0, .block_size = 4};
    struct kvev_buf out = {0};
    cr_assert_eq(kvev_pack_batch(&b, true, &out), 0);
    /* [ts, [5 events], 0]: the events array header follows the 9-byte float */
    cr_assert_eq(out.data[0], 0x93);
    cr_assert_eq(out.data[10], 0x95, "events %02x", out.data[10]);
    mem_free(out.data);
}

/* token_ids off: the lists are empty, everything else is as before. */
Test(kvev_pack, no_token_ids) {
    int32_t tok[] = {1, 2, 3, 4};
    struct kvev_event e[] = {ev(KVEV_STORED, KVEV_GPU, 0xa1, -1, 0, 0, 4)};
    struct kvev_batch b = {.events = e, .n_events = 1, .tokens = tok, .ts = 1.5, .block_size = 4};
    struct kvev_buf out = {0};
    cr_assert_eq(kvev_pack_batch(&b, false, &out), 0);
    char hex[256];
    hexify(out.data, out.len, hex);
    cr_expect_str_eq(hex, "93cb3ff80000000000009198ab426c6f636b53746f72656491" A1
                          "c09004c0a3475055c000");
    mem_free(out.data);
}

/* ---- the publisher over sockets ---- */

struct sub {
    void *ctx, *sub;
};

static char ep_pub[128], ep_replay[128];

static void endpoints(const char *tag) {
    snprintf(ep_pub, sizeof ep_pub, "ipc:///tmp/llmd-kvev-%d-%s.pub", (int)getpid(), tag);
    snprintf(ep_replay, sizeof ep_replay, "ipc:///tmp/llmd-kvev-%d-%s.rep", (int)getpid(), tag);
}

static struct sub sub_open(void) {
    struct sub s = {.ctx = zmq_ctx_new()};
    s.sub = zmq_socket(s.ctx, ZMQ_SUB);
    cr_assert_eq(zmq_setsockopt(s.sub, ZMQ_SUBSCRIBE, "", 0), 0);
    int ms = 5000;
    zmq_setsockopt(s.sub, ZMQ_RCVTIMEO, &ms, sizeof ms);
    cr_assert_eq(zmq_connect(s.sub, ep_pub), 0);
    return s;
}

static void sub_close(struct sub *s) {
    zmq_close(s->sub);
    zmq_ctx_term(s->ctx);
}

/* One batch: its 3 frames; returns the payload length (payload in buf). */
static size_t recv_batch(void *sock, char *topic, uint64_t *seq, uint8_t *buf, size_t cap) {
    int n = zmq_recv(sock, topic, 63, 0);
    cr_assert_geq(n, 0, "no batch within 5 s: %s", zmq_strerror(zmq_errno()));
    topic[n] = 0;
    uint8_t s[8];
    cr_assert_eq(zmq_recv(sock, s, sizeof s, 0), 8);
    *seq = 0;
    for (int i = 0; i < 8; i++)
        *seq = *seq << 8 | s[i];
    int len = zmq_recv(sock, buf, cap, 0);
    cr_assert_gt(len, 0);
    int more;
    size_t ml = sizeof more;
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
    cr_assert_eq(more, 0, "a batch is 3 frames");
    return (size_t)len;
}

static struct kvev *pub_open(uint32_t max_queue) {
    struct kvev_config c = {.endpoint = ep_pub,
                            .replay_endpoint = ep_replay,
                            .topic = "kv@test",
                            .block_size = 4,
                            .max_queue = max_queue};
    struct kvev *k = NULL;
    char err[256] = "";
    cr_assert_eq(kvev_open(&c, &k, err, sizeof err), 0, "%s", err);
    return k;
}

/* A PUB/SUB join is asynchronous: publish a clear until one arrives. */
static void join(struct kvev *k, struct sub *s, uint64_t *seq) {
    int ms = 100;
    zmq_setsockopt(s->sub, ZMQ_RCVTIMEO, &ms, sizeof ms);
    char topic[64];
    uint8_t buf[256];
    for (int i = 0; i < 100; i++) {
        kvev_cleared(k);
        kvev_flush(k);
        if (zmq_recv(s->sub, topic, 63, 0) >= 0) {
            uint8_t sq[8];
            cr_assert_eq(zmq_recv(s->sub, sq, 8, 0), 8);
            cr_assert_gt(zmq_recv(s->sub, buf, sizeof buf, 0), 0);
            *seq = 0;
            for (int j = 0; j < 8; j++)
                *seq = *seq << 8 | sq[j];
            /* an earlier clear may still be on its way: take the last one */
            ms = 300;
            zmq_setsockopt(s->sub, ZMQ_RCVTIMEO, &ms, sizeof ms);
            while (zmq_recv(s->sub, topic, 63, 0) >= 0) {
                cr_assert_eq(zmq_recv(s->sub, sq, 8, 0), 8);
                cr_assert_gt(zmq_recv(s->sub, buf, sizeof buf, 0), 0);
                *seq = 0;
                for (int j = 0; j < 8; j++)
                    *seq = *seq << 8 | sq[j];
            }
            ms = 5000;
            zmq_setsockopt(s->sub, ZMQ_RCVTIMEO, &ms, sizeof ms);
            /* an empty flush restarts the publisher's idle clock: after the
             * drain above it is 300 ms old, and the publisher's next wake
             * (every 50 ms) would cut a test's first events into a batch of
             * their own before the test's flush (KVEV_IDLE_FLUSH_NS) */
            kvev_flush(k);
            return;
        }
    }
    cr_assert_fail("the subscriber never joined");
}

static uint8_t H[KVEV_HASH_BYTES];
static const uint8_t *hash(uint8_t b) {
    memset(H, b, sizeof H);
    return H;
}

Test(kvev_pub, frames_seq_dedup_and_replay) {
    endpoints("a");
    struct kvev *k = pub_open(0);
    struct sub s = sub_open();
    uint64_t seq0;
    join(k, &s, &seq0);

    int32_t tok[4] = {10, 11, 12, 13};
    uint8_t root[KVEV_HASH_BYTES];
    memset(root, 0xa1, sizeof root);
    kvev_stored(k, KVEV_GPU, root, NULL, tok, 4, 0);
    kvev_stored(k, KVEV_GPU, root, NULL, tok, 4, 0);  /* held already: not again */
    kvev_stored(k, KVEV_CPU, root, NULL, NULL, 0, 0); /* tokens from the table */
    kvev_flush(k);
    kvev_removed(k, KVEV_GPU, root);
    kvev_removed(k, KVEV_DISK, root); /* DISK never held it: nothing */
    kvev_flush(k);
    cr_assert(kvev_holds(k, KVEV_CPU, root));
    cr_assert_not(kvev_holds(k, KVEV_GPU, root));

    char topic[64];
    uint8_t p1[512], p2[512];
    uint64_t sq;
    size_t n1 = recv_batch(s.sub, topic, &sq, p1, sizeof p1);
    cr_assert_str_eq(topic, "kv@test");
    cr_assert_eq(sq, seq0 + 1);
    /* two events: the GPU store and the CPU store with the same tokens */
    cr_assert_eq(p1[10], 0x92, "%02x", p1[10]);
    const uint8_t gpu_tail[] = {0x94, 10, 11, 12, 13, 0x04, 0xc0, 0xa3, 'G', 'P', 'U'};
    const uint8_t cpu_tail[] = {0x94, 10, 11, 12, 13, 0x04, 0xc0, 0xa3, 'C', 'P', 'U'};
    cr_assert(memmem(p1, n1, gpu_tail, sizeof gpu_tail) &&
              memmem(p1, n1, cpu_tail, sizeof cpu_tail));
    size_t n2 = recv_batch(s.sub, topic, &sq, p2, sizeof p2);
    cr_assert_eq(sq, seq0 + 2);
    cr_assert_eq(p2[10], 0x91, "one removal");
    const uint8_t rm[] = {0xa3, 'G', 'P', 'U', 0x00};
    cr_assert(memcmp(p2 + n2 - sizeof rm, rm, sizeof rm) == 0);

    /* replay from seq0 + 1: both batches again, byte for byte, then (-1, "") */
    void *d = zmq_socket(s.ctx, ZMQ_DEALER);
    int ms = 5000;
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &ms, sizeof ms);
    cr_assert_eq(zmq_connect(d, ep_replay), 0);
    uint8_t start[8] = {0};
    for (int i = 0; i < 8; i++)
        start[i] = (uint8_t)((seq0 + 1) >> (56 - 8 * i));
    cr_assert_eq(zmq_send(d, "", 0, ZMQ_SNDMORE), 0);
    cr_assert_eq(zmq_send(d, start, 8, 0), 8);
    const uint8_t *want[] = {p1, p2};
    size_t want_n[] = {n1, n2};
    for (int b = 0; b < 3; b++) {
        uint8_t e[8], buf[512];
        cr_assert_eq(zmq_recv(d, buf, sizeof buf, 0), 0, "empty delimiter");
        cr_assert_eq(zmq_recv(d, e, 8, 0), 8);
        int len = zmq_recv(d, buf, sizeof buf, 0);
        if (b == 2) {
            const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
            cr_assert(memcmp(e, end, 8) == 0 && len == 0, "end marker");
            break;
        }
        uint64_t got = 0;
        for (int i = 0; i < 8; i++)
            got = got << 8 | e[i];
        cr_assert_eq(got, seq0 + 1 + (uint64_t)b);
        cr_assert_eq((size_t)len, want_n[b]);
        cr_assert(memcmp(buf, want[b], want_n[b]) == 0, "replayed batch %d differs", b);
    }
    zmq_close(d);

    struct kvev_stats st;
    kvev_stats_get(k, &st);
    cr_assert_eq(st.replay_requests_total, 1);
    cr_assert_eq(st.blocks, 1, "the CPU copy");
    cr_assert_eq(st.dropped_events_total, 0);
    sub_close(&s);
    kvev_close(k);
    cr_assert_eq(mem_bytes(MEM_KVEV), 0);
}

/* A queue past max_queue drops, counts, and the next batch is a snapshot of
 * what is held: AllBlocksCleared and one store a block and medium. */
Test(kvev_pub, overflow_sends_a_snapshot) {
    endpoints("b");
    struct kvev *k = pub_open(4);
    struct sub s = sub_open();
    uint64_t seq0;
    join(k, &s, &seq0);
    for (uint8_t i = 1; i <= 10; i++)
        kvev_stored(k, KVEV_GPU, hash(i), NULL, NULL, 0, 0);
    for (uint8_t i = 1; i <= 3; i++)
        kvev_removed(k, KVEV_GPU, hash(i));
    kvev_stored(k, KVEV_DISK, hash(9), NULL, NULL, 0, 0);
    kvev_flush(k);
    struct kvev_stats st;
    kvev_stats_get(k, &st);
    /* 4 fit (or, had the thread taken a batch meanwhile, 4 more): the rest drop */
    cr_assert_geq(st.dropped_events_total, 6, "%lu", (unsigned long)st.dropped_events_total);
    char topic[64];
    uint8_t p[4096];
    uint64_t sq, want = seq0 + 1;
    size_t n;
    const uint8_t clr[] = {0x91, 0xb0, 'A', 'l', 'l'};
    for (;;) {
        n = recv_batch(s.sub, topic, &sq, p, sizeof p);
        cr_assert_eq(sq, want++, "no gap: the dropped events never took a number");
        if (memcmp(p + 11, clr, sizeof clr) == 0)
            break;
    }
    /* the clear, then blocks 4..10 on GPU and 9 on DISK: 9 events in the array.
     * Hashes are 0x04.. with no parents: nothing chains */
    cr_assert_eq(p[10], 0x99, "%02x", p[10]);
    size_t disk = 0;
    for (size_t i = 0; i + 5 <= n; i++)
        disk += memcmp(p + i,
                       "\xa4"
                       "DISK",
                       5) == 0;
    cr_assert_eq(disk, 1);
    kvev_stats_get(k, &st);
    cr_assert_eq(st.snapshots_total, 1);
    cr_assert_eq(st.blocks, 7);
    sub_close(&s);
    kvev_close(k);
    cr_assert_eq(mem_bytes(MEM_KVEV), 0);
}

Test(kvev_pub, bad_endpoints_are_refused) {
    struct kvev *k = NULL;
    char err[256] = "";
    struct kvev_config c = {.endpoint = "nonsense://x", .block_size = 4};
    cr_assert_lt(kvev_open(&c, &k, err, sizeof err), 0);
    cr_assert(strstr(err, "nonsense://x"), "%s", err);
    cr_assert_null(k);
    c.endpoint = NULL;
    cr_assert_eq(kvev_open(&c, &k, err, sizeof err), -EINVAL);
    c.endpoint = "tcp://*:5557";
    c.block_size = 0;
    cr_assert_eq(kvev_open(&c, &k, err, sizeof err), -EINVAL);
    cr_assert_eq(mem_bytes(MEM_KVEV), 0);
}

/* A replay of more batches than the ROUTER socket queues by default (its
 * send high-water mark, 1000 messages) to a client that reads after the
 * answer was sent: every batch and the end marker arrive. */
Test(kvev_pub, long_replay_is_not_cut) {
    endpoints("c");
    struct kvev *k = pub_open(0);
    enum { N = 3000 };
    uint8_t h[KVEV_HASH_BYTES] = {0};
    for (uint32_t i = 0; i < N; i++) {
        memcpy(h, &i, sizeof i);
        kvev_stored(k, KVEV_GPU, h, NULL, NULL, 0, 0);
        kvev_flush(k);
    }
    struct kvev_stats st;
    for (int i = 0; i < 500; i++) {
        kvev_stats_get(k, &st);
        if (st.batches_total == N)
            break;
        usleep(10000);
    }
    cr_assert_eq(st.batches_total, N);
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    int ms = 5000;
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &ms, sizeof ms);
    cr_assert_eq(zmq_connect(d, ep_replay), 0);
    uint8_t start[8] = {0};
    cr_assert_eq(zmq_send(d, "", 0, ZMQ_SNDMORE), 0);
    cr_assert_eq(zmq_send(d, start, 8, 0), 8);
    sleep(1); /* a client busy elsewhere: the answer waits in the sockets */
    uint32_t got = 0;
    for (;;) {
        uint8_t e[8], buf[512];
        cr_assert_eq(zmq_recv(d, buf, sizeof buf, 0), 0, "after %u batches: no answer", got);
        cr_assert_eq(zmq_recv(d, e, 8, 0), 8);
        int len = zmq_recv(d, buf, sizeof buf, 0);
        cr_assert_geq(len, 0);
        uint64_t seq = 0;
        for (int i = 0; i < 8; i++)
            seq = seq << 8 | e[i];
        if (seq == UINT64_MAX)
            break;
        cr_assert_eq(seq, got, "batch %u missing", got);
        got++;
    }
    cr_assert_eq(got, N);
    zmq_close(d);
    zmq_ctx_term(ctx);
    kvev_close(k);
    cr_assert_eq(mem_bytes(MEM_KVEV), 0);
}

/* A demotion from the host tier to NVMe: the CPU copy goes (no medium holds
 * the block while the write is in flight), then the write lands and the
 * DISK store comes without parent or tokens (the NVMe tier keeps neither).
 * It carries what the device store gave, as every store to a lower tier. */
Test(kvev_pub, store_after_a_gap_keeps_parent_and_tokens) {
    endpoints("d");
    struct kvev *k = pub_open(0);
    struct sub s = sub_open();
    uint64_t seq0;
    join(k, &s, &seq0);
    int32_t tok[4] = {20, 21, 22, 23};
    uint8_t parent[KVEV_HASH_BYTES], blk[KVEV_HASH_BYTES];
    memset(parent, 0xa1, sizeof parent);
    memset(blk, 0xb1, sizeof blk);
    kvev_stored(k, KVEV_GPU, blk, parent, tok, 4, 0);
    kvev_stored(k, KVEV_CPU, blk, NULL, NULL, 0, 0); /* spilled */
    kvev_removed(k, KVEV_GPU, blk);
    kvev_removed(k, KVEV_CPU, blk); /* demoted: the NVMe write is in flight */
    kvev_flush(k);
    struct kvev_stats st;
    kvev_stats_get(k, &st);
    cr_assert_eq(st.blocks, 0, "no medium holds it");
    kvev_stored(k, KVEV_DISK, blk, NULL, NULL, 0, 0); /* the write landed */
    kvev_flush(k);
    kvev_stats_get(k, &st);
    cr_assert_eq(st.blocks, 1);
    char topic[64];
    uint8_t p[512];
    uint64_t sq;
    size_t n = 0;
    /* The two flushes give two batches, unless the publisher's idle cut
     * (KVEV_IDLE_FLUSH_NS, counted from join's last flush) took the first
     * events before the flush did, on a loaded machine: so read batches,
     * in sequence, up to the one with the DISK store. */
    for (uint64_t want_sq = seq0 + 1;; want_sq++) {
        n = recv_batch(s.sub, topic, &sq, p, sizeof p);
        cr_assert_eq(sq, want_sq);
        if (memmem(p, n, "DISK", 4))
            break;
        cr_assert_lt(want_sq, seq0 + 5, "no DISK store in 5 batches");
    }
    /* ["BlockStored", [blk], parent, [20..23], 4, nil, "DISK", nil] */
    const uint8_t want[] = {0x94, 20, 21, 22, 23, 0x04, 0xc0, 0xa4, 'D', 'I', 'S', 'K', 0xc0};
    cr_assert(memmem(p, n, want, sizeof want), "the DISK store lost the tokens");
    cr_assert(memmem(p, n, parent, sizeof parent), "the DISK store lost the parent");
    sub_close(&s);
    kvev_close(k);
    cr_assert_eq(mem_bytes(MEM_KVEV), 0);
}

/* Entries of blocks no medium holds are reused when the table is out of
 * room (and it grows only when few are): the held blocks stay found and
 * the count stays right. */
Test(kvev_pub, table_reuses_what_no_medium_holds) {
    endpoints("e");
    struct kvev *k = pub_open(1u << 20);
    uint8_t h[KVEV_HASH_BYTES] = {0};
    for (uint32_t i = 0; i < 20000; i++) {
        memcpy(h, &i, sizeof i);
        kvev_stored(k, KVEV_GPU, h, NULL, NULL, 0, 0);
        if (i >= 100) {
            uint32_t old = i - 100;
            memcpy(h, &old, sizeof old);
            kvev_removed(k, KVEV_GPU, h);
        }
        if (i % 256 == 0)
            kvev_flush(k);
    }
    struct kvev_stats st;
    kvev_stats_get(k, &st);
    cr_assert_eq(st.blocks, 100);
    for (uint32_t i = 0; i < 20000; i++) {
        memcpy(h, &i, sizeof i);
        cr_assert_eq(kvev_holds(k, KVEV_GPU, h), i >= 19900, "block %u", i);
    }
    kvev_close(k);
    cr_assert_eq(mem_bytes(MEM_KVEV), 0);
}
