/* fuzz_ofl_index.c - libFuzzer target for the NVMe tier's index replay (built by
 * tests/fuzz/run.sh).
 *
 * Each input becomes an index file that a real tier (ofl_nvme_open, pread/pwrite mode, a
 * small data file in /dev/shm or /tmp) replays at open. Byte 0 picks the mode and the geometry
 * (slot size, 1..16 slots), byte 1 the model fingerprint:
 *  - raw mode: the rest is the index file as is (headers, torn tails, garbage);
 *  - structured mode: the rest is a header choice and 6-byte operations, each encoded as
 *    a valid record (ADD/DEL/unknown op, a hash from 16 ids so they collide, slot, tenant,
 *    length, this or another fingerprint), then an optional fault: a partial record
 *    appended, a byte flipped in record k, or the last record cut short. The expected
 *    live set is computed here, independently, and compared with the tier's (another
 *    model's ADD takes its slot from this model's entry there).
 * Properties, both modes: open succeeds; ofl_nvme_check holds; the index file is cut to
 * header + whole good records (what the stats report); a second open replays the same
 * entries with nothing torn or corrupt. A broken property calls abort().
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "offload/ofl_index.h"
#include "offload/ofl_nvme.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_ofl_index: %s:%d: %s\n", __FILE__, __LINE__, #x);                \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define N_IDS   16
#define MAX_OPS 4096

static char data_path[64], index_path[64];
static const uint32_t slot_sizes[8] = {1, 100, 4096, 4097, 8192, 12000, 16384, 20000};

static void cleanup(void) {
    unlink(data_path);
    unlink(index_path);
}

static void hash_of(uint32_t id, uint8_t h[OFL_HASH_BYTES]) {
    memset(h, 0x3c, OFL_HASH_BYTES);
    h[0] = (uint8_t)id;
    h[31] = (uint8_t)(id * 7);
}

static void write_file(const char *p, const uint8_t *b, size_t len) {
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    CHECK(write(fd, b, len) == (ssize_t)len);
    close(fd);
}

static uint64_t file_size(const char *p) {
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    return (uint64_t)sb.st_size;
}

/* The expected table: which id lives in which slot, or -1. */
struct model {
    int slot_of[N_IDS];
    int id_in[16];
};

static void model_apply(struct model *m, const struct ofl_index_rec *r, uint32_t id,
                        uint32_t n_slots, uint32_t slot_bytes, const uint8_t *fp) {
    if (r->op != OFL_INDEX_ADD && r->op != OFL_INDEX_DEL)
        return;
    if (r->slot >= n_slots || (r->op == OFL_INDEX_ADD && (r->len == 0 || r->len > slot_bytes)))
        return;
    if (memcmp(r->model_fp, fp, OFL_FP_BYTES) != 0) {
        /* another model's ADD takes its slot from whatever held it (its DEL touches only
         * its own entries) */
        if (r->op == OFL_INDEX_ADD && m->id_in[r->slot] >= 0) {
            m->slot_of[m->id_in[r->slot]] = -1;
            m->id_in[r->slot] = -1;
        }
        return;
    }
    if (r->op == OFL_INDEX_DEL) {
        if (m->slot_of[id] == (int)r->slot) {
            m->id_in[r->slot] = -1;
            m->slot_of[id] = -1;
        }
        return;
    }
    if (m->slot_of[id] >= 0)
        m->id_in[m->slot_of[id]] = -1;
    if (m->id_in[r->slot] >= 0)
        m->slot_of[m->id_in[r->slot]] = -1;
    m->slot_of[id] = (int)r->slot;
    m->id_in[r->slot] = (int)id;
}

static uint8_t *image;
static size_t image_cap;

static void image_put(size_t *len, const void *p, size_t k) {
    if (k == 0) /* image may still be NULL, and NULL + 0 is undefined */
        return;
    if (*len + k > image_cap) {
        image_cap = (*len + k) * 2;
        image = realloc(image, image_cap);
        CHECK(image);
    }
    memcpy(image + *len, p, k);
    *len += k;
}

/* Structured input -> index image in `image`; fills *m with the expected live set. */
static size_t build(const uint8_t *d, size_t size, uint32_t n_slots, uint32_t slot_bytes,
                    const uint8_t *fp, struct model *m) {
    size_t len = 0;
    uint8_t hdr[OFL_INDEX_HDR_BYTES], rec[OFL_INDEX_REC_BYTES];
    uint8_t hdr_mode = size ? d[0] % 4 : 0;
    d++, size -= size ? 1 : 0;
    if (hdr_mode == 0 || hdr_mode == 1) { /* valid; or valid for another slot size */
        ofl_index_hdr_encode(hdr_mode == 0 ? slot_bytes : slot_bytes + 1, hdr);
        image_put(&len, hdr, sizeof hdr);
    } else if (hdr_mode == 3) { /* torn header */
        ofl_index_hdr_encode(slot_bytes, hdr);
        image_put(&len, hdr, 50);
    }
    size_t n_ops = size / 6, extra = size % 6;
    if (n_ops > MAX_OPS)
        n_ops = MAX_OPS;
    size_t good = n_ops; /* records that replay: up to the first bad one */
    uint8_t fault = extra ? d[n_ops * 6] % 4 : 0;
    uint32_t fault_arg = extra > 1 ? d[n_ops * 6 + 1] : 0;
    if (n_ops && fault == 2)
        good = fault_arg % n_ops;
    if (n_ops && fault == 3)
        good = n_ops - 1;
    size_t rec_start = len;
    for (size_t i = 0; i < n_ops; i++) {
        const uint8_t *o = d + 6 * i;
        uint32_t id = o[1] % N_IDS;
        struct ofl_index_rec r = {
            .op = (uint8_t)(o[0] % 3 + 1), /* ADD, DEL, or 3: unknown */
            .slot = o[2] % 20u,            /* some past n_slots */
            .tenant = o[3],
            .len = (uint32_t)((uint64_t)o[4] * (slot_bytes + 1) / 200), /* 0 .. > slot_bytes */
            .csum = o[5],
        };
        hash_of(id, r.hash);
        memcpy(r.model_fp, fp, OFL_FP_BYTES);
        if (o[0] & 0x80)
            r.model_fp[0] ^= 1;
        ofl_index_rec_encode(&r, rec);
        image_put(&len, rec, sizeof rec);
        if (hdr_mode == 0 && i < good)
            model_apply(m, &r, id, n_slots, slot_bytes, fp);
    }
    if (fault == 1) { /* a partial record: a crash mid-append */
        memset(rec, 0x77, sizeof rec);
        image_put(&len, rec, 1 + fault_arg % 127);
    } else if (fault == 2 && n_ops) {
        image[rec_start + good * OFL_INDEX_REC_BYTES + (extra > 2 ? d[n_ops * 6 + 2] % 128 : 0)] ^=
            0x10;
    } else if (fault == 3 && n_ops) {
        len -= 1 + fault_arg % 127;
    }
    return len;
}

/* Open the tier over the data file and the index image on disk. An empty
 * index is a new tier, and a data file that holds bytes without an index is
 * refused untouched (-EEXIST: not a tier's, never overwritten): that is the
 * one failure expected, and NULL is returned for it. */
static struct ofl_nvme *open_tier(uint32_t n_slots, uint32_t slot_bytes, const uint8_t *fp) {
    struct ofl_nvme_config cfg = {
        .path = data_path,
        .index_path = index_path,
        .slot_bytes = slot_bytes,
        .queue_depth = 1,
        .direct = 0,
        .uring = 0,
    };
    uint32_t stride = (slot_bytes + 4095) / 4096 * 4096;
    cfg.bytes = (uint64_t)n_slots * stride;
    memcpy(cfg.model_fp, fp, OFL_FP_BYTES);
    /* A data file that is not new, so the index is trusted. */
    if (file_size(data_path) != cfg.bytes)
        CHECK(truncate(data_path, (off_t)cfg.bytes) == 0);
    struct ofl_nvme *n = NULL;
    char err[256] = "";
    int rc = ofl_nvme_open(&cfg, &n, err, sizeof err);
    /* the refused open removes the empty index it found (no PATH.idx left behind) */
    if (rc == -EEXIST && (access(index_path, F_OK) != 0 || file_size(index_path) == 0)) {
        CHECK(file_size(data_path) == cfg.bytes);
        return NULL;
    }
    if (rc) {
        fprintf(stderr, "fuzz_ofl_index: open: %d %s\n", rc, err);
        abort();
    }
    CHECK(ofl_nvme_check(n));
    return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    log_set_level(LOG_LEVEL_ERROR);
    /* tmpfs when there is one: every open and close fdatasyncs, which costs milliseconds
     * on a disk and nothing there. */
    struct stat sb;
    const char *d = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(data_path, sizeof data_path, "%s/fuzz_ofl_index.%d", d, (int)getpid());
    snprintf(index_path, sizeof index_path, "%s/fuzz_ofl_index.%d.idx", d, (int)getpid());
    write_file(data_path, (const uint8_t *)"x", 1);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    bool structured = data[0] & 1;
    uint32_t slot_bytes = slot_sizes[(data[0] >> 1) & 7];
    uint32_t n_slots = (uint32_t)(data[0] >> 4) + 1;
    uint8_t fp[OFL_FP_BYTES];
    memset(fp, data[1], sizeof fp);
    struct model m;
    memset(&m, 0xff, sizeof m);
    size_t len = 0;
    if (structured) {
        len = build(data + 2, size - 2, n_slots, slot_bytes, fp, &m);
    } else {
        image_put(&len, data + 2, size - 2);
    }
    write_file(index_path, image, len);

    struct ofl_nvme *n = open_tier(n_slots, slot_bytes, fp);
    if (!n)
        return 0;
    struct ofl_nvme_stats s;
    ofl_nvme_stats_get(n, &s);
    CHECK(s.index_bytes >= OFL_INDEX_HDR_BYTES);
    CHECK((s.index_bytes - OFL_INDEX_HDR_BYTES) % OFL_INDEX_REC_BYTES == 0);
    CHECK(file_size(index_path) == s.index_bytes);
    CHECK(s.entries <= n_slots);
    if (structured) {
        uint32_t want = 0;
        for (uint32_t id = 0; id < N_IDS; id++) {
            uint8_t h[OFL_HASH_BYTES];
            hash_of(id, h);
            want += m.slot_of[id] >= 0;
            CHECK(ofl_nvme_contains(n, h) == (m.slot_of[id] >= 0));
        }
        CHECK(s.entries == want);
    }
    uint64_t entries = s.entries;
    ofl_nvme_close(n);

    n = open_tier(n_slots, slot_bytes, fp);
    CHECK(n != NULL); /* the index now has at least its header */
    ofl_nvme_stats_get(n, &s);
    CHECK(s.entries == entries);
    CHECK(s.index_torn == 0 && s.index_corrupt == 0);
    ofl_nvme_close(n);
    return 0;
}
