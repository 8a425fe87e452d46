/* Tests of the NVMe tier (offload/ofl_nvme.h) on real files under a mkdtemp directory in
 * /tmp, removed at the end of each test: round trips through every I/O path (io_uring +
 * O_DIRECT, buffered, pread/pwrite), checksum failures, restart and replay, fingerprints,
 * torn and corrupt indexes, LRU eviction, a full disk (a file-size limit, and a real full
 * tmpfs where the test may mount one), purge, back-pressure, injected I/O faults and
 * allocation failures. Each test is small: a few hundred KiB, well under a second. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"
#include "offload/ofl_nvme.h"

#define SLOT  16484u /* not a 4 KiB multiple: the stride is 20480 */
#define SPAGE 20480u

static char dir[64], path[128], ipath[160];

static void rm_tree(const char *d) {
    DIR *dp = opendir(d);
    if (!dp)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(dp))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        if (e->d_type == DT_DIR) {
            umount2(p, MNT_DETACH);
            rm_tree(p);
            rmdir(p);
        } else {
            unlink(p);
        }
    }
    closedir(dp);
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/llmd-ofl-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tier", dir);
    snprintf(ipath, sizeof ipath, "%s/tier.idx", dir);
    signal(SIGXFSZ, SIG_IGN); /* the tier's business is the errno, not the signal */
}

static void teardown(void) {
    rm_tree(dir);
    rmdir(dir);
}

TestSuite(ofl_nvme, .init = setup, .fini = teardown, .timeout = 60);

struct topt {
    uint32_t n_slots, slot_bytes, qd;
    uint8_t fp;
    int direct, uring;
    const char *path, *index_path;
};

static struct ofl_nvme_config tcfg(const struct topt *o) {
    struct ofl_nvme_config c = {
        .path = o->path ? o->path : path,
        .index_path = o->index_path,
        .slot_bytes = o->slot_bytes ? o->slot_bytes : SLOT,
        .queue_depth = o->qd,
        .direct = o->direct,
        .uring = o->uring,
    };
    uint32_t stride = (c.slot_bytes + 4095) / 4096 * 4096;
    c.bytes = (uint64_t)(o->n_slots ? o->n_slots : 16) * stride;
    memset(c.model_fp, o->fp ? o->fp : 0xa5, sizeof c.model_fp);
    return c;
}

static struct ofl_nvme *topen(const struct topt *o) {
    struct ofl_nvme_config c = tcfg(o);
    struct ofl_nvme *n = NULL;
    char err[256] = "";
    int rc = ofl_nvme_open(&c, &n, err, sizeof err);
    cr_assert_eq(rc, 0, "ofl_nvme_open: %d %s", rc, err);
    cr_assert(ofl_nvme_check(n));
    return n;
}

static void hash_of(uint32_t i, uint8_t h[OFL_HASH_BYTES]) {
    for (int k = 0; k < OFL_HASH_BYTES; k++)
        h[k] = (uint8_t)(i * 131u + (uint32_t)k * 7u + (i >> 8));
    memcpy(h, &i, sizeof i);
}

/* Page i: len bytes of a pattern only page i has. */
static void page_of(uint32_t i, uint8_t *p, uint32_t len) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);
    for (uint32_t k = 0; k < len; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[k] = (uint8_t)x;
    }
}

static uint32_t len_of(uint32_t i) {
    return SLOT - (i % 5) * 1000; /* varied lengths, some not 4 KiB multiples */
}

static struct ofl_nvme_stats tstats(struct ofl_nvme *n) {
    struct ofl_nvme_stats s;
    ofl_nvme_stats_get(n, &s);
    return s;
}

/* Poll until `want` completions arrived; they go to out[] (may be NULL). */
static void wait_n(struct ofl_nvme *n, uint32_t want, struct ofl_nvme_cpl *out) {
    struct ofl_nvme_cpl tmp[64];
    uint32_t got = 0;
    while (got < want) {
        int k = ofl_nvme_poll(n, tmp, 64, 2000);
        cr_assert_gt(k, 0, "poll: %d after %u of %u completions", k, got, want);
        for (int j = 0; j < k; j++, got++)
            if (out)
                out[got] = tmp[j];
    }
}

/* Write page i and wait for its completion; returns its rc. */
static int write_one(struct ofl_nvme *n, uint32_t i, uint32_t tenant) {
    uint8_t h[OFL_HASH_BYTES], buf[SLOT];
    hash_of(i, h);
    page_of(i, buf, len_of(i));
    int rc = ofl_nvme_write(n, h, tenant, buf, len_of(i), i);
    cr_assert_eq(rc, 0, "write page %u: %d", i, rc);
    struct ofl_nvme_cpl c;
    wait_n(n, 1, &c);
    cr_assert_eq(c.cookie, i);
    cr_assert_eq(c.op, OFL_NVME_WRITE);
    return c.rc;
}

/* Read page i into `got` (SPAGE bytes; NULL: a buffer on the stack, not 4 KiB aligned, so
 * through the bounce buffer); returns the completion's rc, and checks the bytes when it
 * is 0. */
static int read_into(struct ofl_nvme *n, uint32_t i, uint8_t *got) {
    uint8_t h[OFL_HASH_BYTES], want[SLOT], stack[SLOT + 1];
    uint32_t cap = got ? SPAGE : SLOT;
    if (!got)
        got = ((uintptr_t)stack & 4095) ? stack : stack + 1;
    hash_of(i, h);
    int rc = ofl_nvme_read(n, h, got, cap, 1000 + i);
    if (rc)
        return rc;
    struct ofl_nvme_cpl c;
    wait_n(n, 1, &c);
    cr_assert_eq(c.cookie, 1000 + i);
    cr_assert_eq(c.op, OFL_NVME_READ);
    if (c.rc == 0) {
        cr_assert_eq(c.len, len_of(i), "page %u len %u want %u", i, c.len, len_of(i));
        page_of(i, want, len_of(i));
        cr_assert(memcmp(got, want, len_of(i)) == 0, "page %u bytes differ", i);
    }
    return c.rc;
}

static int read_one(struct ofl_nvme *n, uint32_t i) {
    return read_into(n, i, NULL);
}

static bool has(struct ofl_nvme *n, uint32_t i) {
    uint8_t h[OFL_HASH_BYTES];
    hash_of(i, h);
    return ofl_nvme_contains(n, h);
}

static off_t file_size(const char *p) {
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0, "stat %s: %s", p, strerror(errno));
    return sb.st_size;
}

/* stderr capture, for the messages that must be logged (and logged once). */
struct cap {
    int saved;
    char file[200];
};

static void cap_start(struct cap *c) {
    fflush(stderr);
    snprintf(c->file, sizeof c->file, "%s/stderr", dir);
    int fd = open(c->file, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    c->saved = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* Stop capturing; returns how often `needle` was logged. */
static int cap_count(struct cap *c, const char *needle) {
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    static char text[65536];
    int fd = open(c->file, O_RDONLY);
    ssize_t k = read(fd, text, sizeof text - 1);
    close(fd);
    text[k > 0 ? k : 0] = 0;
    fputs(text, stderr); /* still shown in the test's output */
    int count = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        count++;
    return count;
}

/* ---- round trips ---- */

static void roundtrip(int direct, int uring) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 24, .direct = direct, .uring = uring});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.n_slots, 24);
    cr_assert_eq(s.slot_stride_bytes, SPAGE);
    cr_assert_eq(s.uring, uring != 0, "uring %d", (int)s.uring);
    if (direct == 0)
        cr_assert(!s.direct);
    if (uring && !s.fixed_buffers)
        cr_log_info("io_uring buffers not registered here");

    /* 20 writes in flight at once, then their completions in any order. */
    uint8_t h[OFL_HASH_BYTES], *buf = malloc(SLOT);
    for (uint32_t i = 0; i < 20; i++) {
        hash_of(i, h);
        page_of(i, buf, len_of(i));
        cr_assert_eq(ofl_nvme_write(n, h, 7, buf, len_of(i), i), 0, "write %u", i);
        memset(buf, 0xee, SLOT); /* src is the caller's again at once */
    }
    free(buf);
    struct ofl_nvme_cpl c[20];
    wait_n(n, 20, c);
    uint32_t seen = 0;
    for (int k = 0; k < 20; k++) {
        cr_assert_eq(c[k].rc, 0, "write %lu rc %d", (unsigned long)c[k].cookie, c[k].rc);
        cr_assert_eq(c[k].len, len_of((uint32_t)c[k].cookie));
        seen |= 1u << c[k].cookie;
    }
    cr_assert_eq(seen, (1u << 20) - 1);
    cr_assert(ofl_nvme_check(n));
    uint8_t *aligned = aligned_alloc(4096, SPAGE);
    for (uint32_t i = 0; i < 20; i++) {
        cr_assert(has(n, i), "page %u", i);
        cr_assert_eq(read_into(n, i, i % 2 ? aligned : NULL), 0, "read %u", i);
    }
    free(aligned);
    s = tstats(n);
    cr_assert_eq(s.writes_total, 20);
    cr_assert_eq(s.reads_total, 20);
    cr_assert_eq(s.entries, 20);
    cr_assert_eq(s.write_failures_total + s.read_failures_total + s.drops_total, 0);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < 20; i++)
        bytes += len_of(i);
    cr_assert_eq(s.bytes_written_total, bytes);
    cr_assert_eq(s.bytes_read_total, bytes);
    cr_assert_gt(s.busy_ns_total, 0);
    cr_assert(!has(n, 99));
    cr_assert_eq(read_one(n, 99), -ENOENT);
    char info[4096];
    cr_assert_eq(ofl_nvme_stats_format(n, info, sizeof info), 0);
    cr_assert(strstr(info, "ofl_nvme_entries:20\n"), "%s", info);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
}

Test(ofl_nvme, roundtrip_uring_direct_auto) {
    roundtrip(-1, -1);
}

Test(ofl_nvme, roundtrip_uring_buffered) {
    roundtrip(0, 1);
}

Test(ofl_nvme, roundtrip_pread_pwrite) {
    roundtrip(-1, 0);
}

Test(ofl_nvme, roundtrip_pread_pwrite_buffered) {
    roundtrip(0, 0);
}

Test(ofl_nvme, bad_arguments_take_nothing) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4});
    uint8_t h[OFL_HASH_BYTES], buf[SLOT + 1];
    hash_of(1, h);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 0, 0), -EINVAL);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, SLOT + 1, 0), -EINVAL);
    cr_assert_eq(write_one(n, 1, 0), 0);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 10, 0), -EEXIST);
    cr_assert_eq(ofl_nvme_read(n, h, buf, len_of(1) - 1, 0), -EINVAL);
    cr_assert_eq(ofl_nvme_poll(n, NULL, 1, 0), -EINVAL);
    struct ofl_nvme_cpl c;
    cr_assert_eq(ofl_nvme_poll(n, &c, 1, -1), 0, "nothing outstanding: no wait");
    cr_assert_eq(tstats(n).outstanding, 0);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    ofl_nvme_close(NULL);

    struct ofl_nvme_config cfg = tcfg(&(struct topt){.n_slots = 4});
    struct ofl_nvme *m = NULL;
    cfg.slot_bytes = 0;
    cr_assert_eq(ofl_nvme_open(&cfg, &m, NULL, 0), -EINVAL);
    cfg = tcfg(&(struct topt){.n_slots = 4});
    cfg.bytes = SPAGE - 1;
    cr_assert_eq(ofl_nvme_open(&cfg, &m, NULL, 0), -EINVAL);
    cfg = tcfg(&(struct topt){.n_slots = 4, .qd = 100000});
    cr_assert_eq(ofl_nvme_open(&cfg, &m, NULL, 0), -EINVAL);
    cr_assert_null(m);
}

/* ---- checksums ---- */

Test(ofl_nvme, flipped_byte_fails_checksum_and_drops_entry) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8});
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_eq(write_one(n, i, 1), 0);
    /* A fresh tier hands out slots 0, 1, 2, ...: page 2 is in slot 2. */
    int fd = open(path, O_RDWR);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, 2 * SPAGE + 100), 1);
    b ^= 0x40;
    cr_assert_eq(pwrite(fd, &b, 1, 2 * SPAGE + 100), 1);
    fsync(fd);
    close(fd);
    cr_assert_eq(read_one(n, 2), -EBADMSG);
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.checksum_failures_total, 1);
    cr_assert_eq(s.read_failures_total, 1);
    cr_assert_eq(s.drops_total, 1);
    /* the same through the direct-to-destination path */
    uint8_t *aligned = aligned_alloc(4096, SPAGE);
    fd = open(path, O_RDWR);
    cr_assert_eq(pread(fd, &b, 1, 3 * SPAGE + 5), 1);
    b ^= 0x01;
    cr_assert_eq(pwrite(fd, &b, 1, 3 * SPAGE + 5), 1);
    close(fd);
    cr_assert_eq(read_into(n, 3, aligned), -EBADMSG);
    free(aligned);
    cr_assert(!has(n, 3));
    s = tstats(n);
    cr_assert_eq(s.checksum_failures_total, 2);
    cr_assert(!has(n, 2));
    cr_assert_eq(read_one(n, 2), -ENOENT);
    for (uint32_t i = 0; i < 2; i++)
        cr_assert_eq(read_one(n, i), 0, "page %u", i);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8});
    cr_assert_eq(tstats(n).index_replayed, 2, "the drops reached the index");
    cr_assert(!has(n, 2) && !has(n, 3));
    ofl_nvme_close(n);
}

/* ---- restart and the index ---- */

static void append_bytes(const char *p, const void *b, size_t len) {
    int fd = open(p, O_WRONLY | O_APPEND);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, b, len), (ssize_t)len);
    close(fd);
}

Test(ofl_nvme, entries_survive_restart) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8});
    for (uint32_t i = 0; i < 8; i++)
        cr_assert_eq(write_one(n, i, i % 3), 0);
    uint8_t h[OFL_HASH_BYTES];
    hash_of(5, h);
    cr_assert_eq(ofl_nvme_drop(n, h), 0);
    cr_assert_eq(ofl_nvme_drop(n, h), -ENOENT);
    cr_assert_eq(tstats(n).removed_total, 1);
    ofl_nvme_close(n);

    n = topen(&(struct topt){.n_slots = 8});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.index_replayed, 7);
    cr_assert_eq(s.entries, 7);
    cr_assert_eq(s.index_torn + s.index_corrupt + s.index_ignored_fp, 0);
    for (uint32_t i = 0; i < 8; i++) {
        cr_assert_eq(has(n, i), i != 5, "page %u", i);
        cr_assert_eq(read_one(n, i), i != 5 ? 0 : -ENOENT, "page %u", i);
    }
    /* The slot of the dropped page is free again: one more page fits without eviction. */
    cr_assert_eq(write_one(n, 20, 0), 0);
    cr_assert_eq(tstats(n).evictions_total, 0);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
}

Test(ofl_nvme, other_fingerprint_is_ignored) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8, .fp = 1});
    for (uint32_t i = 0; i < 5; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8, .fp = 2});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.index_ignored_fp, 5);
    cr_assert_eq(s.entries, 0);
    cr_assert_eq(s.foreign_entries, 5);
    for (uint32_t i = 0; i < 5; i++)
        cr_assert(!has(n, i));
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    /* Ignored, not erased: the first model finds its entries again. */
    n = topen(&(struct topt){.n_slots = 8, .fp = 1});
    cr_assert_eq(tstats(n).entries, 5);
    cr_assert_eq(read_one(n, 3), 0);
    ofl_nvme_close(n);
}

/* regress: two models taking turns on one tier. Each run of one used to take the other's
 * slots as free and overwrite them while their index records stayed, so every later run
 * of the other found "checksum mismatch" instead of its pages. Now another model's entries
 * keep their slots: five alternating runs, each writing pages of its own, then each model
 * reads back everything it wrote, and nothing fails a checksum. */
Test(ofl_nvme, regress_alternating_models_keep_their_slots) {
    for (uint32_t run = 0; run < 5; run++) {
        uint8_t fp = run % 2 ? 2 : 1;
        uint32_t base = fp == 1 ? 0 : 100;                           /* each model's own pages */
        uint32_t mine = 2 * (run / 2), theirs = 2 * ((run + 1) / 2); /* 2 pages a run */
        struct ofl_nvme *n = topen(&(struct topt){.n_slots = 16, .fp = fp});
        struct ofl_nvme_stats s = tstats(n);
        cr_assert_eq(s.entries, mine, "run %u: own entries", run);
        cr_assert_eq(s.foreign_entries, theirs, "run %u: the other model's", run);
        for (uint32_t i = 0; i < mine; i++)
            cr_assert_eq(read_one(n, base + i), 0, "run %u: page %u", run, base + i);
        for (uint32_t i = mine; i < mine + 2; i++)
            cr_assert_eq(write_one(n, base + i, 0), 0, "run %u: page %u", run, base + i);
        s = tstats(n);
        cr_assert_eq(s.checksum_failures_total + s.read_failures_total + s.evictions_total, 0,
                     "run %u", run);
        cr_assert(ofl_nvme_check(n));
        ofl_nvme_close(n);
    }
}

/* A full tier evicts by one LRU over both models: another model's entries (older than
 * anything of this run) go first, each with a DEL record of its own fingerprint, so that
 * model's next run misses them instead of failing their checksums. */
Test(ofl_nvme, other_models_entries_are_evicted_least_recently_used_first) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4, .fp = 1});
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 4, .fp = 2});
    for (uint32_t i = 100; i < 103; i++) /* one free slot, then pages 0 and 1 go */
        cr_assert_eq(write_one(n, i, 0), 0);
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.evictions_total, 2);
    cr_assert_eq(s.entries, 3);
    cr_assert_eq(s.foreign_entries, 1);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 4, .fp = 1});
    s = tstats(n);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(s.foreign_entries, 3);
    cr_assert(!has(n, 0) && !has(n, 1));
    cr_assert_eq(read_one(n, 2), 0);
    cr_assert_eq(tstats(n).checksum_failures_total, 0);
    ofl_nvme_close(n);
}

/* Compaction at open rewrites the other model's entries too, with their fingerprints. */
Test(ofl_nvme, compaction_keeps_other_models_entries) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8, .fp = 2});
    for (uint32_t i = 100; i < 103; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8, .fp = 1});
    uint8_t h[OFL_HASH_BYTES];
    for (uint32_t i = 0; i < 600; i++) {
        cr_assert_eq(write_one(n, 1000 + i, 0), 0);
        hash_of(1000 + i, h);
        cr_assert_eq(ofl_nvme_drop(n, h), 0);
    }
    cr_assert_eq(write_one(n, 0, 0), 0);
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8, .fp = 1});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.index_compacted, 1);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(s.foreign_entries, 3);
    cr_assert_eq(s.index_bytes, 128 + 4 * 128);
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8, .fp = 2});
    cr_assert_eq(tstats(n).entries, 3);
    for (uint32_t i = 100; i < 103; i++)
        cr_assert_eq(read_one(n, i), 0, "page %u", i);
    ofl_nvme_close(n);
}

/* An index from before: a model's ADD into a slot another model's ADD still claimed (no
 * DEL between). The later ADD wins the slot; the earlier entry is gone, not read. */
Test(ofl_nvme, later_add_of_another_model_supersedes_the_slot) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4, .fp = 1});
    cr_assert_eq(write_one(n, 0, 0), 0);
    cr_assert_eq(write_one(n, 1, 0), 0);
    ofl_nvme_close(n);
    /* find page 0's slot in the index, and claim it for model 2 */
    uint8_t rec[128], h[OFL_HASH_BYTES];
    struct ofl_index_rec r;
    int fd = open(ipath, O_RDONLY);
    cr_assert_eq(pread(fd, rec, 128, 128), 128);
    close(fd);
    cr_assert_eq(ofl_index_rec_decode(rec, &r), 0);
    hash_of(0, h);
    cr_assert(memcmp(r.hash, h, OFL_HASH_BYTES) == 0);
    hash_of(100, r.hash);
    memset(r.model_fp, 2, OFL_FP_BYTES);
    ofl_index_rec_encode(&r, rec);
    append_bytes(ipath, rec, sizeof rec);
    n = topen(&(struct topt){.n_slots = 4, .fp = 1});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(s.foreign_entries, 1);
    cr_assert(!has(n, 0));
    cr_assert_eq(read_one(n, 1), 0);
    ofl_nvme_close(n);
}
Test(ofl_nvme, other_geometry_is_ignored) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8});
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    /* A smaller tier: slots 4 and 5 are gone, their entries with them; the data file is
     * cut, and the index compacted so that they stay gone. */
    n = topen(&(struct topt){.n_slots = 4});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.entries, 4);
    cr_assert_eq(s.index_ignored_geom, 2);
    cr_assert_eq(s.index_compacted, 1);
    cr_assert_eq(read_one(n, 3), 0);
    cr_assert(!has(n, 4));
    cr_assert_eq(file_size(path), 4 * SPAGE);
    ofl_nvme_close(n);
    /* Grown again: the cut entries do not come back (they used to, and then failed their
     * checksums when read); the others still read. */
    n = topen(&(struct topt){.n_slots = 8});
    s = tstats(n);
    cr_assert_eq(s.entries, 4);
    cr_assert_eq(s.index_ignored_geom, 0);
    for (uint32_t i = 0; i < 6; i++) {
        cr_assert_eq(has(n, i), i < 4, "page %u", i);
        cr_assert_eq(read_one(n, i), i < 4 ? 0 : -ENOENT, "page %u", i);
    }
    cr_assert_eq(tstats(n).checksum_failures_total, 0);
    ofl_nvme_close(n);
    /* Another slot size: every record is ignored and the index restarts. */
    n = topen(&(struct topt){.n_slots = 4, .slot_bytes = 8192});
    s = tstats(n);
    cr_assert_eq(s.entries, 0);
    cr_assert_eq(s.index_ignored_geom, 4);
    cr_assert_eq(s.index_bytes, 128);
    ofl_nvme_close(n);
}

Test(ofl_nvme, torn_index_tail_is_ignored_and_cut) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8});
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    off_t good = file_size(ipath);
    cr_assert_eq(good, 128 + 6 * 128);

    /* Half of a valid record, as a crash mid-append leaves it. */
    uint8_t rec[128];
    int fd = open(ipath, O_RDONLY);
    cr_assert_eq(pread(fd, rec, 128, 128), 128);
    close(fd);
    append_bytes(ipath, rec, 64);
    struct cap c;
    cap_start(&c);
    n = topen(&(struct topt){.n_slots = 8});
    cr_assert_eq(cap_count(&c, "torn last record"), 1);
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.index_torn, 1);
    cr_assert_eq(s.entries, 6);
    cr_assert_eq(file_size(ipath), good, "cut back to the last good record");
    ofl_nvme_close(n);

    /* A whole record of garbage at the end. */
    memset(rec, 0x5a, sizeof rec);
    append_bytes(ipath, rec, sizeof rec);
    n = topen(&(struct topt){.n_slots = 8});
    s = tstats(n);
    cr_assert_eq(s.index_torn, 1);
    cr_assert_eq(s.entries, 6);
    cr_assert_eq(file_size(ipath), good);
    /* and appends go on after it */
    cr_assert_eq(write_one(n, 6, 0), 0);
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8});
    s = tstats(n);
    cr_assert_eq(s.index_torn, 0);
    cr_assert_eq(s.entries, 7);
    cr_assert_eq(read_one(n, 6), 0);
    ofl_nvme_close(n);
}

Test(ofl_nvme, corrupt_index_record_stops_replay_there) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8});
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    /* Flip a byte in record 2 of 6: records 0 and 1 are kept, 2..5 dropped. */
    int fd = open(ipath, O_RDWR);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, 128 + 2 * 128 + 50), 1);
    b ^= 1;
    cr_assert_eq(pwrite(fd, &b, 1, 128 + 2 * 128 + 50), 1);
    close(fd);
    struct cap c;
    cap_start(&c);
    n = topen(&(struct topt){.n_slots = 8});
    cr_assert_eq(cap_count(&c, "corrupt record 2 of 6"), 1);
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.index_corrupt, 4);
    cr_assert_eq(s.entries, 2);
    cr_assert_eq(file_size(ipath), 128 + 2 * 128);
    cr_assert_eq(read_one(n, 1), 0);
    cr_assert(!has(n, 2));
    /* The slots of the lost entries are free for new pages. */
    for (uint32_t i = 10; i < 16; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    cr_assert_eq(tstats(n).evictions_total, 0);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
}

Test(ofl_nvme, index_is_compacted_at_open) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8});
    uint8_t h[OFL_HASH_BYTES];
    for (uint32_t i = 0; i < 600; i++) {
        cr_assert_eq(write_one(n, 100 + i, 0), 0);
        hash_of(100 + i, h);
        cr_assert_eq(ofl_nvme_drop(n, h), 0);
    }
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    cr_assert_eq(file_size(ipath), 128 + 1204 * 128);
    n = topen(&(struct topt){.n_slots = 8});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.index_compacted, 1);
    cr_assert_eq(s.entries, 4);
    cr_assert_eq(s.index_bytes, 128 + 4 * 128);
    cr_assert_eq(file_size(ipath), 128 + 4 * 128);
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8});
    cr_assert_eq(tstats(n).entries, 4);
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_eq(read_one(n, i), 0);
    ofl_nvme_close(n);
}

Test(ofl_nvme, new_data_file_drops_index_entries) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8});
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_close(n);
    cr_assert_eq(unlink(path), 0);
    n = topen(&(struct topt){.n_slots = 8});
    cr_assert_eq(tstats(n).entries, 0);
    cr_assert(!has(n, 0));
    ofl_nvme_close(n);
}

Test(ofl_nvme, second_open_of_the_same_tier_is_refused) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4});
    struct ofl_nvme_config cfg = tcfg(&(struct topt){.n_slots = 4});
    struct ofl_nvme *m = NULL;
    char err[256];
    cr_assert_eq(ofl_nvme_open(&cfg, &m, err, sizeof err), -EBUSY, "%s", err);
    ofl_nvme_close(n);
}

/* ---- space ---- */

Test(ofl_nvme, full_tier_evicts_least_recently_used) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4});
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    cr_assert_eq(read_one(n, 0), 0); /* 0 becomes the most recently used */
    cr_assert_eq(write_one(n, 4, 0), 0);
    cr_assert_eq(write_one(n, 5, 0), 0);
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.evictions_total, 2);
    cr_assert_eq(s.drops_total, 2);
    cr_assert_eq(s.entries, 4);
    bool want[6] = {true, false, false, true, true, true};
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(has(n, i), want[i], "page %u", i);
    for (uint32_t i = 0; i < 6; i++)
        if (want[i])
            cr_assert_eq(read_one(n, i), 0, "page %u", i);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 4});
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(has(n, i), want[i], "after reopen: page %u", i);
    ofl_nvme_close(n);
}

/* Disk full through RLIMIT_FSIZE (SIGXFSZ ignored): a write past the limit fails with
 * EFBIG, which io_uring and pwrite both honour. 10 writes go out at once into slots
 * 0..9 with the limit at 6 slots: 4 fail, the message comes once. */
static void disk_full_by_rlimit(int uring) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 16, .uring = uring});
    struct rlimit old, lim = {.rlim_cur = 6 * SPAGE, .rlim_max = RLIM_INFINITY};
    getrlimit(RLIMIT_FSIZE, &old);
    lim.rlim_max = old.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    struct cap c;
    cap_start(&c);
    uint8_t h[OFL_HASH_BYTES], buf[SLOT];
    for (uint32_t i = 0; i < 10; i++) {
        hash_of(i, h);
        page_of(i, buf, len_of(i));
        cr_assert_eq(ofl_nvme_write(n, h, 0, buf, len_of(i), i), 0);
    }
    struct ofl_nvme_cpl cpl[10];
    wait_n(n, 10, cpl);
    int n_ok = 0, n_full = 0;
    for (int k = 0; k < 10; k++) {
        cr_assert(cpl[k].rc == 0 || cpl[k].rc == -ENOSPC, "rc %d", cpl[k].rc);
        n_ok += cpl[k].rc == 0;
        n_full += cpl[k].rc == -ENOSPC;
        cr_assert_eq(cpl[k].rc == 0, cpl[k].cookie < 6, "page %lu rc %d",
                     (unsigned long)cpl[k].cookie, cpl[k].rc);
    }
    cr_assert_eq(n_ok, 6);
    cr_assert_eq(n_full, 4);
    hash_of(50, h);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 100, 50), -ENOSPC);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 100, 50), -ENOSPC);
    cr_assert_eq(cap_count(&c, "disk full"), 1, "logged once");
    struct ofl_nvme_stats s = tstats(n);
    cr_assert(s.disk_full);
    cr_assert_eq(s.disk_full_total, 4);
    cr_assert_eq(s.write_failures_total, 4);
    cr_assert_eq(s.drops_total, 4);
    cr_assert_eq(s.enospc_refused_total, 2);
    cr_assert_eq(s.entries, 6);
    for (uint32_t i = 0; i < 10; i++)
        cr_assert_eq(read_one(n, i), i < 6 ? 0 : -ENOENT, "page %u", i);
    cr_assert_eq(tstats(n).outstanding, 0);
    cr_assert(ofl_nvme_check(n));
    setrlimit(RLIMIT_FSIZE, &old);
    ofl_nvme_close(n);
}

Test(ofl_nvme, disk_full_by_file_size_limit_uring) {
    disk_full_by_rlimit(1);
}

Test(ofl_nvme, disk_full_by_file_size_limit_pwrite) {
    disk_full_by_rlimit(0);
}

/* A real full file system: a tmpfs of 10 slot strides in a private mount namespace (root
 * only; the test is skipped elsewhere). The 48-slot tier cannot be preallocated: it stays
 * sparse, and writes fill the tmpfs until one fails with ENOSPC. The index lives outside. */
Test(ofl_nvme, disk_full_on_a_small_tmpfs) {
    char mnt[128];
    snprintf(mnt, sizeof mnt, "%s/mnt", dir);
    cr_assert_eq(mkdir(mnt, 0700), 0);
    if (geteuid() != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=200k") != 0)
        cr_skip_test("cannot mount a tmpfs here (needs root and a mount namespace): %s",
                     strerror(errno));
    char dpath[160];
    snprintf(dpath, sizeof dpath, "%s/tier", mnt);
    struct cap c;
    cap_start(&c);
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 48, .path = dpath, .index_path = ipath});
    struct ofl_nvme_stats s = tstats(n);
    cr_assert(s.sparse, "a 960 KiB file cannot be preallocated in 200 KiB");
    /* The write that meets the end of the space comes back short (the kernel writes what
     * fits); the tier learns why from its tail and reports -ENOSPC. An -EIO is allowed once
     * in case the tail write finds room after all. */
    uint32_t i = 0, ok = 0, n_short = 0;
    int rc = 0;
    for (; i < 48 && rc != -ENOSPC; i++) {
        rc = write_one(n, i, 0);
        cr_assert(rc == 0 || rc == -ENOSPC || (rc == -EIO && n_short++ == 0), "page %u: rc %d", i,
                  rc);
        ok += rc == 0;
    }
    cr_assert_eq(rc, -ENOSPC, "page %u: rc %d after %u written", i - 1, rc, ok);
    cr_assert_gt(ok, 0);
    uint8_t h[OFL_HASH_BYTES], buf[16];
    hash_of(99, h);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, sizeof buf, 0), -ENOSPC);
    cr_assert_eq(cap_count(&c, "disk full"), 1);
    s = tstats(n);
    cr_assert(s.disk_full);
    cr_assert_eq(s.disk_full_total, 1);
    cr_assert_eq(s.write_failures_total, 1 + n_short);
    cr_assert_eq(s.entries, ok);
    for (uint32_t k = 0; k < ok; k++)
        cr_assert_eq(read_one(n, k), 0, "page %u", k);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    umount2(mnt, MNT_DETACH);
}

/* A block device: a loop device over a file in the test directory (root only; skipped
 * elsewhere). LO_FLAGS_AUTOCLEAR detaches it when the last descriptor closes, so a crashed
 * test leaves nothing behind. Returns the loop fd (kept open by the test) or -1. */
static int loop_attach(const char *file, char *dev, size_t dev_len) {
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    int back = open(file, O_RDWR | O_CLOEXEC);
    int fd = -1;
    for (int tries = 0; ctl >= 0 && back >= 0 && tries < 8 && fd < 0; tries++) {
        int nr = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (nr < 0)
            break;
        snprintf(dev, dev_len, "/dev/loop%d", nr);
        fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd >= 0 && ioctl(fd, LOOP_SET_FD, back) != 0) { /* taken meanwhile: retry */
            close(fd);
            fd = -1;
        }
    }
    if (fd >= 0) {
        struct loop_info64 li = {.lo_flags = LO_FLAGS_AUTOCLEAR};
        ioctl(fd, LOOP_SET_STATUS64, &li);
    }
    if (back >= 0)
        close(back);
    if (ctl >= 0)
        close(ctl);
    return fd;
}

Test(ofl_nvme, block_device_roundtrip_restart_and_purge) {
    char img[160], dev[64];
    snprintf(img, sizeof img, "%s/disk.img", dir);
    int fd = open(img, O_RDWR | O_CREAT, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 8 * SPAGE), 0);
    close(fd);
    int loop = geteuid() == 0 ? loop_attach(img, dev, sizeof dev) : -1;
    if (loop < 0)
        cr_skip_test("no loop device here (needs root and /dev/loop-control)");
    struct topt o = {.n_slots = 8, .path = dev, .index_path = ipath};
    struct ofl_nvme *n = topen(&o);
    cr_assert(!tstats(n).sparse);
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(write_one(n, i, i % 2 + 1), 0);
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(read_one(n, i), 0);
    ofl_nvme_close(n);
    n = topen(&o);
    cr_assert_eq(tstats(n).entries, 6);
    uint32_t np;
    cr_assert_eq(ofl_nvme_purge_tenant(n, 1, &np), 0);
    cr_assert_eq(np, 3);
    cr_assert_eq(read_one(n, 1), 0);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    /* the purged pages are gone from the device itself */
    uint8_t *all = malloc(8 * SPAGE), want[512];
    fd = open(dev, O_RDONLY);
    cr_assert_eq(pread(fd, all, 8 * SPAGE, 0), 8 * SPAGE);
    close(fd);
    for (uint32_t i = 0; i < 6; i++) {
        page_of(i, want, sizeof want);
        cr_assert_eq(memmem(all, 8 * SPAGE, want, sizeof want) != NULL, i % 2 == 1, "page %u", i);
    }
    free(all);
    /* a tier larger than the device is refused */
    struct ofl_nvme_config cfg =
        tcfg(&(struct topt){.n_slots = 9, .path = dev, .index_path = ipath});
    struct ofl_nvme *m = NULL;
    cr_assert_eq(ofl_nvme_open(&cfg, &m, NULL, 0), -EINVAL);
    close(loop);
}

/* ---- purge ---- */

/* True when the data file holds the first 512 bytes of page i anywhere. */
static bool file_has_page(uint32_t i) {
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    off_t size = file_size(path);
    uint8_t *all = malloc((size_t)size), want[512];
    cr_assert_eq(pread(fd, all, (size_t)size, 0), size);
    close(fd);
    page_of(i, want, sizeof want);
    bool found = memmem(all, (size_t)size, want, sizeof want) != NULL;
    free(all);
    return found;
}

Test(ofl_nvme, purge_removes_a_tenant_and_clears_its_slots) {
    log_set_level(LOG_LEVEL_INFO);
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 12});
    for (uint32_t i = 0; i < 8; i++)
        cr_assert_eq(write_one(n, i, i % 2 ? 2 : 1), 0); /* tenant 1: even pages */
    for (uint32_t i = 0; i < 8; i++)
        cr_assert(file_has_page(i), "page %u written", i);
    struct cap c;
    cap_start(&c);
    uint32_t n_purged = 99;
    cr_assert_eq(ofl_nvme_purge_tenant(n, 1, &n_purged), 0);
    cr_assert_eq(cap_count(&c, "purged tenant 1: 4 entries"), 1);
    cr_assert_eq(n_purged, 4);
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.purged_total, 4);
    cr_assert_eq(s.entries, 4);
    for (uint32_t i = 0; i < 8; i++) {
        cr_assert_eq(has(n, i), i % 2 == 1, "page %u", i);
        cr_assert_eq(file_has_page(i), i % 2 == 1, "page %u on disk", i);
    }
    for (uint32_t i = 1; i < 8; i += 2)
        cr_assert_eq(read_one(n, i), 0);
    cr_assert_eq(ofl_nvme_purge_tenant(n, 1, &n_purged), 0);
    cr_assert_eq(n_purged, 0);
    cr_assert(ofl_nvme_check(n));
    /* The freed slots take new pages without eviction. */
    for (uint32_t i = 20; i < 28; i++)
        cr_assert_eq(write_one(n, i, 3), 0);
    cr_assert_eq(tstats(n).evictions_total, 0, "12 slots: 4 kept, 8 free after the purge");
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 12});
    for (uint32_t i = 0; i < 8; i += 2)
        cr_assert(!has(n, i), "page %u came back", i);
    cr_assert_eq(tstats(n).entries, 12);
    ofl_nvme_close(n);
}

Test(ofl_nvme, purge_covers_writes_in_flight) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8, .direct = 0});
    uint8_t h[OFL_HASH_BYTES], buf[SLOT];
    for (uint32_t i = 0; i < 6; i++) {
        hash_of(i, h);
        page_of(i, buf, len_of(i));
        cr_assert_eq(ofl_nvme_write(n, h, 1, buf, len_of(i), i), 0);
    }
    uint32_t n_purged = 0;
    cr_assert_eq(ofl_nvme_purge_tenant(n, 1, &n_purged), 0);
    cr_assert_eq(n_purged, 6);
    struct ofl_nvme_cpl cpl[6];
    wait_n(n, 6, cpl);
    for (int k = 0; k < 6; k++)
        cr_assert(cpl[k].rc == 0 || cpl[k].rc == -ENOENT, "rc %d", cpl[k].rc);
    for (uint32_t i = 0; i < 6; i++) {
        cr_assert(!has(n, i));
        cr_assert(!file_has_page(i), "page %u still on disk", i);
    }
    cr_assert_eq(tstats(n).write_failures_total, 0, "a purged write is not a failed one");
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 8});
    cr_assert_eq(tstats(n).entries, 0);
    ofl_nvme_close(n);
}

/* ---- back-pressure and faults ---- */

Test(ofl_nvme, eagain_when_every_bounce_buffer_is_out) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8, .qd = 2});
    uint8_t h[OFL_HASH_BYTES], buf[SLOT];
    for (uint32_t i = 0; i < 2; i++) {
        hash_of(i, h);
        cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 100, i), 0);
    }
    hash_of(2, h);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 100, 2), -EAGAIN);
    cr_assert_eq(tstats(n).outstanding, 2);
    struct ofl_nvme_cpl c;
    cr_assert_eq(ofl_nvme_poll(n, &c, 1, -1), 1);
    cr_assert_eq(c.rc, 0);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 100, 2), 0);
    wait_n(n, 2, NULL);
    /* reads are limited the same way */
    hash_of(0, h);
    cr_assert_eq(ofl_nvme_read(n, h, buf, sizeof buf, 0), 0);
    cr_assert_eq(ofl_nvme_read(n, h, buf + 8192, sizeof buf - 8192, 1), 0);
    cr_assert_eq(ofl_nvme_read(n, h, buf, sizeof buf, 2), -EAGAIN);
    wait_n(n, 2, NULL);
    cr_assert_eq(tstats(n).outstanding, 0);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
}

Test(ofl_nvme, eagain_when_every_slot_is_being_written) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 2, .qd = 4});
    uint8_t h[OFL_HASH_BYTES], buf[64] = {1};
    hash_of(0, h);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, sizeof buf, 0), 0);
    hash_of(1, h);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, sizeof buf, 1), 0);
    /* Both slots are PENDING or VALID now; if both writes are still in flight there is
     * nothing to evict. Either way nothing is lost. */
    hash_of(2, h);
    int rc = ofl_nvme_write(n, h, 0, buf, sizeof buf, 2);
    cr_assert(rc == 0 || rc == -EAGAIN, "rc %d", rc);
    wait_n(n, rc == 0 ? 3 : 2, NULL);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
}

static void write_fault(int uring, int direct, int res, int want) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4, .uring = uring, .direct = direct});
    cr_assert_eq(write_one(n, 0, 0), 0);
    ofl_nvme_fault_inject(n, OFL_NVME_WRITE, 2, res);
    cr_assert_eq(write_one(n, 1, 0), 0);
    cr_assert_eq(write_one(n, 2, 0), want, "fault %d", res);
    cr_assert_eq(write_one(n, 3, 0), 0, "fires once");
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.write_failures_total, 1);
    cr_assert_eq(s.drops_total, 1);
    cr_assert_eq(s.entries, 3);
    cr_assert(!has(n, 2));
    cr_assert_eq(read_one(n, 2), -ENOENT);
    /* the failed write's slot is free again: no eviction for the next page */
    cr_assert_eq(write_one(n, 4, 0), 0);
    cr_assert_eq(tstats(n).evictions_total, 0);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
    n = topen(&(struct topt){.n_slots = 4});
    cr_assert(!has(n, 2), "no index record for a failed write");
    cr_assert_eq(tstats(n).entries, 4);
    ofl_nvme_close(n);
}

Test(ofl_nvme, short_write_drops_entry) {
    write_fault(-1, -1, 4096, -EIO);
}

Test(ofl_nvme, failed_write_drops_entry) {
    write_fault(-1, -1, -EIO, -EIO);
}

/* A write that fails for a reason other than a full disk says why, once: a tier whose
 * every write fails (a file made immutable under it: EPERM) was silent but for counters. */
Test(ofl_nvme, failed_write_is_logged_once_with_its_reason) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4});
    struct cap c;
    cap_start(&c);
    for (uint32_t i = 0; i < 3; i++) {
        ofl_nvme_fault_inject(n, OFL_NVME_WRITE, 1, -EPERM);
        cr_assert_eq(write_one(n, i, 0), -EIO);
    }
    int logged = cap_count(&c, "failed (Operation not permitted): entry dropped");
    cr_assert_eq(logged, 1, "logged %d times", logged);
    cr_assert_eq(tstats(n).write_failures_total, 3);
    ofl_nvme_close(n);
}

Test(ofl_nvme, failed_write_drops_entry_pwrite_buffered) {
    write_fault(0, 0, -EIO, -EIO);
}

Test(ofl_nvme, read_faults_drop_entry) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4});
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(write_one(n, i, 0), 0);
    ofl_nvme_fault_inject(n, OFL_NVME_READ, 1, -EIO);
    cr_assert_eq(read_one(n, 0), -EIO);
    ofl_nvme_fault_inject(n, OFL_NVME_READ, 1, 4096);
    cr_assert_eq(read_one(n, 1), -EIO, "short read");
    cr_assert_eq(read_one(n, 2), 0);
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.read_failures_total, 2);
    cr_assert_eq(s.checksum_failures_total, 0);
    cr_assert_eq(s.entries, 1);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
}

Test(ofl_nvme, drop_during_read_and_write) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 4});
    cr_assert_eq(write_one(n, 0, 0), 0);
    uint8_t h[OFL_HASH_BYTES], buf[SLOT];
    hash_of(0, h);
    cr_assert_eq(ofl_nvme_read(n, h, buf, sizeof buf, 0), 0);
    cr_assert_eq(ofl_nvme_drop(n, h), 0);
    struct ofl_nvme_cpl c;
    wait_n(n, 1, &c);
    cr_assert(c.rc == 0 || c.rc == -ENOENT, "rc %d", c.rc);
    hash_of(1, h);
    page_of(1, buf, 100);
    cr_assert_eq(ofl_nvme_write(n, h, 0, buf, 100, 1), 0);
    cr_assert_eq(ofl_nvme_drop(n, h), 0);
    wait_n(n, 1, &c);
    cr_assert_eq(c.rc, -ENOENT, "a dropped write completes with -ENOENT");
    cr_assert_eq(tstats(n).write_failures_total, 0);
    cr_assert(!has(n, 1));
    cr_assert_eq(tstats(n).entries, 0);
    cr_assert(ofl_nvme_check(n));
    ofl_nvme_close(n);
}

static int count_fds(void) {
    int k = 0;
    DIR *d = opendir("/proc/self/fd");
    while (d && readdir(d))
        k++;
    if (d)
        closedir(d);
    return k;
}

/* Fail each allocation of ofl_nvme_open in turn, until one open succeeds: each failure is
 * -ENOMEM and leaves no memory or descriptor behind. */
static void open_fails_cleanly(const struct ofl_nvme_config *c) {
    struct ofl_nvme_config cfg = *c;
    uint64_t base = mem_bytes(MEM_OFL);
    int fds = count_fds();
    uint64_t nth;
    for (nth = 1; nth < 64; nth++) {
        struct ofl_nvme *n = NULL;
        mem_fail_nth(nth);
        int rc = ofl_nvme_open(&cfg, &n, NULL, 0);
        mem_fail_nth(0);
        if (rc == 0) {
            cr_assert(ofl_nvme_check(n));
            cr_assert_eq(write_one(n, (uint32_t)nth, 0), 0);
            ofl_nvme_close(n);
            break;
        }
        cr_assert_eq(rc, -ENOMEM, "nth %lu: rc %d", (unsigned long)nth, rc);
        cr_assert_null(n);
        cr_assert_eq(mem_bytes(MEM_OFL), base, "nth %lu leaked %lu bytes", (unsigned long)nth,
                     (unsigned long)(mem_bytes(MEM_OFL) - base));
        cr_assert_eq(count_fds(), fds, "nth %lu leaked a descriptor", (unsigned long)nth);
    }
    cr_assert_gt(nth, 5, "open makes several allocations");
    cr_assert_eq(mem_bytes(MEM_OFL), base);
    cr_assert_eq(count_fds(), fds);
}

Test(ofl_nvme, open_fails_cleanly_on_each_allocation) {
    struct ofl_nvme_config cfg = tcfg(&(struct topt){.n_slots = 8});
    open_fails_cleanly(&cfg);
}

/* The same over an index that holds another model's entries (their fingerprints are kept
 * in a table the replay grows). */
Test(ofl_nvme, open_over_other_models_entries_fails_cleanly_on_each_allocation) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 8, .fp = 2});
    cr_assert_eq(write_one(n, 100, 0), 0);
    ofl_nvme_close(n);
    struct ofl_nvme_config cfg = tcfg(&(struct topt){.n_slots = 8, .fp = 1});
    open_fails_cleanly(&cfg);
    n = topen(&(struct topt){.n_slots = 8, .fp = 2});
    cr_assert_eq(read_one(n, 100), 0);
    ofl_nvme_close(n);
}

/* ---- threads ---- */

struct writer_arg {
    struct ofl_nvme *n;
    uint32_t first;
};

static void *writer(void *p) {
    struct writer_arg *a = p;
    uint8_t h[OFL_HASH_BYTES], buf[SLOT];
    static uint8_t sink[2][SLOT]; /* reads land here; only the tier thread writes it */
    uint8_t *rd = sink[a->first ? 1 : 0];
    for (uint32_t i = a->first; i < a->first + 150; i++) {
        hash_of(i, h);
        page_of(i, buf, 4096);
        int rc;
        while ((rc = ofl_nvme_write(a->n, h, i % 4, buf, 4096, i)) == -EAGAIN)
            sched_yield();
        if (rc != 0)
            return (void *)(intptr_t)rc;
        if (i % 3 == 0 && ofl_nvme_read(a->n, h, rd, SLOT, i) == -EAGAIN)
            sched_yield();
    }
    return NULL;
}

static volatile int poll_stop;

static void *poller(void *p) {
    struct ofl_nvme *n = p;
    struct ofl_nvme_cpl c[16];
    while (!poll_stop || tstats(n).outstanding)
        for (int k = ofl_nvme_poll(n, c, 16, 10), j = 0; j < k; j++)
            if (c[j].rc != 0 && c[j].rc != -ENOENT)
                return (void *)(intptr_t)c[j].rc;
    return NULL;
}

Test(ofl_nvme, writers_readers_poller_and_purge_race_safely) {
    struct ofl_nvme *n = topen(&(struct topt){.n_slots = 32, .qd = 8});
    pthread_t w[2], pt;
    struct writer_arg a[2] = {{n, 0}, {n, 1000}};
    cr_assert_eq(pthread_create(&pt, NULL, poller, n), 0);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(pthread_create(&w[k], NULL, writer, &a[k]), 0);
    for (int k = 0; k < 5; k++) {
        uint32_t np;
        cr_assert_eq(ofl_nvme_purge_tenant(n, (uint32_t)k % 4, &np), 0);
        cr_assert(ofl_nvme_check(n));
    }
    void *ret;
    for (int k = 0; k < 2; k++) {
        pthread_join(w[k], &ret);
        cr_assert_null(ret, "writer %d: rc %d", k, (int)(intptr_t)ret);
    }
    poll_stop = 1;
    pthread_join(pt, &ret);
    cr_assert_null(ret, "completion rc %d", (int)(intptr_t)ret);
    cr_assert(ofl_nvme_check(n));
    struct ofl_nvme_stats s = tstats(n);
    cr_assert_eq(s.writes_total, 300);
    cr_assert_eq(s.write_failures_total + s.read_failures_total, 0);
    uint32_t live = 0;
    for (uint32_t i = 0; i < 1150; i++)
        live += has(n, i);
    cr_assert_eq(live, s.entries);
    ofl_nvme_close(n);
}
