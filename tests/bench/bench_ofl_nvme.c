/* bench_ofl_nvme - write and read bandwidth of the NVMe tier (offload/ofl_nvme.h) against
 * fio on the same file system, in the same run.
 *
 * A round writes FILE_MIB of 2 MiB pages through a fresh tier with QD pages outstanding
 * (ofl_nvme_write: copy into a registered bounce buffer, xxh3, io_uring write_fixed; the
 * sources cycle over 64 MiB so the copy reads memory, not cache), then reads every page
 * back into page-aligned buffers (the I/O lands there directly, then the checksum is
 * verified), timed from the first submission to the last completion. The baseline is fio on a file
 * of the same size in the same directory: ioengine=io_uring, bs=2M, iodepth=QD, fixedbufs,
 * registerfiles, direct=1 when the tier found O_DIRECT usable (else buffered for both), rw=write
 * then rw=read; fio's own bw_bytes is used. Each round runs both, ofl first in even rounds and fio
 * first in odd ones; the figures are medians over the rounds (ROUNDS, fewer if the run nears its
 * time budget), and the ratio is the median of the per-round ratios: on a shared or virtual disk
 * whose speed drifts by 2x from one second to the next, a paired ratio is what stays stable. The
 * files are deleted after.
 *
 * The directory is $LLMD_BENCH_DIR (default build/): point it at the NVMe to measure.
 * Without fio the baseline is skipped and says why. Prints a table and writes
 * build/bench_ofl_nvme.json. Runs in about 30 s on a 1 GB/s disk, under 60 s by design.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "tests/bench/bench_util.h"
#include "mem.h"
#include "offload/ofl_nvme.h"

#define PAGE_BYTES ((uint32_t)2 << 20)
#define FILE_MIB   512u
#define N_PAGES    (FILE_MIB / 2u)
#define QD         32u
#define ROUNDS     7
#define SRC_PAGES  32u  /* 64 MiB of sources: more than the last-level cache */
#define BUDGET_S   42.0 /* no new round starts after this: the run stays under 60 s */

static char dir[512], tier_path[600], idx_path[620], fio_path[600], fio_out[600];

static const char *fs_name(const char *d) {
    struct statfs sf;
    if (statfs(d, &sf) != 0)
        return "?";
    switch ((unsigned long)sf.f_type) {
    case 0xEF53:
        return "ext4";
    case 0x58465342:
        return "xfs";
    case 0x9123683E:
        return "btrfs";
    case 0x01021994:
        return "tmpfs";
    case 0x2FC12FC1:
        return "zfs";
    case 0x794c7630:
        return "overlayfs";
    default:
        return "other";
    }
}

static void cleanup(void) {
    unlink(tier_path);
    unlink(idx_path);
    unlink(fio_path);
    unlink(fio_out);
}

static void fail(const char *what, int rc) {
    fprintf(stderr, "bench_ofl_nvme: %s: %s\n", what, strerror(-rc));
    cleanup();
    exit(1);
}

/* One round through the tier: write then read all pages. Bytes/s into *w_bw, *r_bw. */
static void round_ofl(uint8_t *src, uint8_t *dst, bool *direct, char *io, size_t io_len,
                      double *w_bw, double *r_bw, double *call_us) {
    cleanup();
    struct ofl_nvme_config cfg = {
        .path = tier_path,
        .bytes = (uint64_t)FILE_MIB << 20,
        .slot_bytes = PAGE_BYTES,
        .queue_depth = QD,
        .direct = -1,
        .uring = -1,
    };
    memset(cfg.model_fp, 0x42, sizeof cfg.model_fp);
    struct ofl_nvme *n;
    char err[256];
    int rc = ofl_nvme_open(&cfg, &n, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench_ofl_nvme: open %s: %s\n", tier_path, err);
        cleanup();
        exit(1);
    }
    struct ofl_nvme_stats s;
    ofl_nvme_stats_get(n, &s);
    *direct = s.direct;
    snprintf(io, io_len, "%s",
             s.uring ? (s.fixed_buffers ? "io_uring+fixed" : "io_uring") : "pread/pwrite");
    struct ofl_nvme_cpl c[QD];
    uint8_t h[OFL_HASH_BYTES] = {0};
    uint32_t done = 0;

    double t0 = bench_now(), in_call = 0;
    for (uint32_t i = 0; i < N_PAGES; i++) {
        memcpy(h, &i, sizeof i);
        for (;;) {
            double a = bench_now();
            rc = ofl_nvme_write(n, h, 0, src + (size_t)(i % SRC_PAGES) * PAGE_BYTES, PAGE_BYTES, i);
            if (rc != -EAGAIN) {
                in_call += bench_now() - a;
                break;
            }
            int k = ofl_nvme_poll(n, c, QD, -1);
            for (int j = 0; j < k; j++, done++)
                if (c[j].rc)
                    fail("write completion", c[j].rc);
        }
        if (rc)
            fail("ofl_nvme_write", rc);
    }
    while (done < N_PAGES) {
        int k = ofl_nvme_poll(n, c, QD, -1);
        for (int j = 0; j < k; j++, done++)
            if (c[j].rc)
                fail("write completion", c[j].rc);
    }
    *w_bw = (double)N_PAGES * PAGE_BYTES / (bench_now() - t0);
    *call_us = in_call / N_PAGES * 1e6;

    /* Reads: each of the QD destination buffers is reused once its completion is in. */
    uint32_t free_dst[QD], n_free = QD;
    for (uint32_t k = 0; k < QD; k++)
        free_dst[k] = k;
    done = 0;
    t0 = bench_now();
    for (uint32_t i = 0; i < N_PAGES; i++) {
        while (n_free == 0) {
            int k = ofl_nvme_poll(n, c, QD, -1);
            for (int j = 0; j < k; j++, done++) {
                if (c[j].rc)
                    fail("read completion", c[j].rc);
                free_dst[n_free++] = (uint32_t)c[j].cookie;
            }
        }
        uint32_t d = free_dst[--n_free];
        memcpy(h, &i, sizeof i);
        rc = ofl_nvme_read(n, h, dst + (size_t)d * PAGE_BYTES, PAGE_BYTES, d);
        if (rc)
            fail("ofl_nvme_read", rc);
    }
    while (done < N_PAGES) {
        int k = ofl_nvme_poll(n, c, QD, -1);
        for (int j = 0; j < k; j++, done++)
            if (c[j].rc)
                fail("read completion", c[j].rc);
    }
    *r_bw = (double)N_PAGES * PAGE_BYTES / (bench_now() - t0);
    ofl_nvme_close(n);
    unlink(tier_path);
    unlink(idx_path);
}

/* fio's bw_bytes of the "read" or "write" section of its JSON output, or -1. */
static double fio_bw(const char *section) {
    FILE *f = fopen(fio_out, "r");
    if (!f)
        return -1;
    static char text[1 << 16];
    size_t k = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[k] = 0;
    char key[32];
    snprintf(key, sizeof key, "\"%s\" : {", section);
    const char *p = strstr(text, key);
    p = p ? strstr(p, "\"bw_bytes\"") : NULL;
    p = p ? strchr(p, ':') : NULL;
    return p ? strtod(p + 1, NULL) : -1;
}

/* One fio job; bytes/s or -1 (the reason goes to why). */
static double run_fio(const char *rw, bool direct, char *why, size_t why_len) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "fio --name=bench --filename='%s' --size=%uM --bs=2M --iodepth=%u "
             "--ioengine=io_uring --fixedbufs --registerfiles --direct=%d --rw=%s "
             "--output-format=json --output='%s' >/dev/null 2>&1",
             fio_path, FILE_MIB, QD, direct ? 1 : 0, rw, fio_out);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(why, why_len, "fio exited with status %d (io_uring engine unavailable?)", rc);
        return -1;
    }
    double bw = fio_bw(rw);
    if (bw <= 0)
        snprintf(why, why_len, "could not read bw_bytes from fio's JSON output");
    return bw;
}

int main(void) {
    const char *env = getenv("LLMD_BENCH_DIR");
    snprintf(dir, sizeof dir, "%s", env && *env ? env : "build");
    mkdir(dir, 0755);
    snprintf(tier_path, sizeof tier_path, "%s/bench_ofl_nvme.tier", dir);
    snprintf(idx_path, sizeof idx_path, "%s.idx", tier_path);
    snprintf(fio_path, sizeof fio_path, "%s/bench_ofl_nvme.fio", dir);
    snprintf(fio_out, sizeof fio_out, "%s/bench_ofl_nvme.fio.json", dir);

    uint8_t *src = mem_alloc(MEM_MISC, (size_t)SRC_PAGES * PAGE_BYTES);
    /* Page-aligned destinations, as a host tier's pinned pages are: reads land there
     * directly. */
    uint8_t *dst_mem = mem_alloc(MEM_MISC, (size_t)QD * PAGE_BYTES + 4096);
    uint8_t *dst = (uint8_t *)(((uintptr_t)dst_mem + 4095) & ~(uintptr_t)4095);
    if (!src || !dst_mem) {
        fprintf(stderr, "bench_ofl_nvme: out of memory\n");
        return 1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)SRC_PAGES * PAGE_BYTES / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(src + 8 * i, &x, 8);
    }
    memset(dst, 0, (size_t)QD * PAGE_BYTES);

    bool have_fio = system("fio --version >/dev/null 2>&1") == 0;
    char why[256] = "fio is not installed (apt-get install fio)";
    double ow[ROUNDS], orr[ROUNDS], fw[ROUNDS], fr[ROUNDS], rw_ratio[ROUNDS], rr_ratio[ROUNDS];
    double wcall[ROUNDS]; /* us the caller spends in one ofl_nvme_write (the page copy) */
    bool direct = false;
    char io[32] = "";
    int rounds = 0;
    double start = bench_now();
    while (rounds < ROUNDS && (rounds < 3 || bench_now() - start < BUDGET_S)) {
        int r = rounds;
        if (r % 2 == 0 || !have_fio)
            round_ofl(src, dst, &direct, io, sizeof io, &ow[r], &orr[r], &wcall[r]);
        if (have_fio) {
            if (r == 0)
                round_ofl(src, dst, &direct, io, sizeof io, &ow[r], &orr[r],
                          &wcall[r]); /* warm, and
                                       * learn direct */
            unlink(fio_path);
            fw[r] = run_fio("write", direct, why, sizeof why);
            fr[r] = fw[r] > 0 ? run_fio("read", direct, why, sizeof why) : -1;
            have_fio = fw[r] > 0 && fr[r] > 0;
            unlink(fio_path);
        }
        if (r % 2 == 1 && have_fio)
            round_ofl(src, dst, &direct, io, sizeof io, &ow[r], &orr[r], &wcall[r]);
        if (have_fio) {
            rw_ratio[r] = ow[r] / fw[r];
            rr_ratio[r] = orr[r] / fr[r];
        }
        rounds++;
    }
    cleanup();
    mem_free(src);
    mem_free(dst_mem);

    char per_round[ROUNDS * 64] = "";
    for (int r = 0; r < rounds; r++)
        snprintf(per_round + strlen(per_round), sizeof per_round - strlen(per_round),
                 "%s[%.0f, %.0f, %.0f, %.0f]", r ? ", " : "", ow[r] / 1e6, orr[r] / 1e6,
                 have_fio ? fw[r] / 1e6 : 0, have_fio ? fr[r] / 1e6 : 0);
    double q_w = have_fio ? bench_median(rw_ratio, rounds) : 0;
    double q_r = have_fio ? bench_median(rr_ratio, rounds) : 0;
    double m_ow = bench_median(ow, rounds) / 1e6, m_or = bench_median(orr, rounds) / 1e6;
    double m_call = bench_median(wcall, rounds);
    double m_fw = have_fio ? bench_median(fw, rounds) / 1e6 : 0;
    double m_fr = have_fio ? bench_median(fr, rounds) / 1e6 : 0;
    printf("bench_ofl_nvme: %s (%s), %u MiB file, 2 MiB pages, QD %u, %s, %s; median of %d "
           "rounds, %.0f s\n",
           dir, fs_name(dir), FILE_MIB, QD, direct ? "O_DIRECT" : "buffered", io, rounds,
           bench_now() - start);
    printf("%-10s %12s %12s\n", "", "write MB/s", "read MB/s");
    printf("%-10s %12.0f %12.0f\n", "ofl_nvme", m_ow, m_or);
    printf("caller time in ofl_nvme_write: %.0f us a page (copy into the bounce buffer)\n", m_call);
    if (have_fio) {
        printf("%-10s %12.0f %12.0f\n", "fio", m_fw, m_fr);
        printf("%-10s %12.2f %12.2f   (median of per-round ofl/fio)\n", "ratio", q_w, q_r);
    } else {
        printf("fio baseline skipped: %s\n", why);
    }
    FILE *f = fopen("build/bench_ofl_nvme.json", "w");
    if (f) {
        fprintf(f,
                "{\"dir\": \"%s\", \"fs\": \"%s\", \"file_mib\": %u, \"page_bytes\": %u, "
                "\"qd\": %u, \"direct\": %s, \"io\": \"%s\", \"rounds\": %d,\n"
                " \"ofl_write_mb_s\": %.1f, \"ofl_read_mb_s\": %.1f, \"fio\": %s, "
                "\"fio_write_mb_s\": %.1f, \"fio_read_mb_s\": %.1f,\n"
                " \"write_ratio\": %.3f, \"read_ratio\": %.3f, \"write_call_us\": %.1f,\n"
                " \"rounds_ofl_w_ofl_r_fio_w_fio_r_mb_s\": [%s]}\n",
                dir, fs_name(dir), FILE_MIB, PAGE_BYTES, QD, direct ? "true" : "false", io, rounds,
                m_ow, m_or, have_fio ? "true" : "false", m_fw, m_fr, q_w, q_r, m_call, per_round);
        fclose(f);
        printf("wrote build/bench_ofl_nvme.json\n");
    }
    return 0;
}
