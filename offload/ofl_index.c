/* ofl_index.c - the NVMe tier's append-only index file (see ofl_index.h).
 *
 * Layout, little-endian, fixed offsets (so a record written on one host replays on any):
 *   header  [0,8) "LLMDOFLI"  [8,12) version  [12,16) record bytes (128)  [16,20) slot_bytes
 *           [20,120) zero     [120,128) xxh3-64 of [0,120)
 *   record  [0,4) "OFLR"  [4,6) version  [6] op  [7] 0  [8,40) hash  [40,44) slot
 *           [44,48) tenant  [48,52) len  [52,56) 0  [56,64) data checksum  [64,96) model_fp
 *           [96,120) zero  [120,128) xxh3-64 of [0,120)
 * Reserved bytes are written as zero and not checked on read, so a later version may use
 * them without breaking an older reader (which still checks the record checksum).
 *
 * Crash safety: a record is 128 bytes and the file is a header plus whole records, so a
 * record never straddles a 4 KiB page; a crash mid-append leaves at worst one short or
 * garbled last record, which the checksum exposes. Replay stops at the first bad record
 * and cuts the file there: after a torn tail nothing is lost; after a bad record in the
 * middle (media corruption, or an earlier append that failed and could not be cut back)
 * the records after it are dropped too, because an index is only meaningful in order
 * (an ADD after a lost DEL would claim a slot twice). Dropped entries only cost a
 * recompute: the tier verifies every slot's data checksum on read.
 *
 * Appends are single write(2) calls on an O_APPEND descriptor; one that fails or comes
 * back short is undone with ftruncate to the last whole record, and if even that fails
 * the index refuses later appends (-EIO) rather than append after a torn record.
 */
#include "offload/ofl_index.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"
#include "mem.h"

#define IX_HDR_MAGIC   "LLMDOFLI"
#define IX_REC_MAGIC   0x524c464fu /* "OFLR" read as a little-endian u32 */
#define IX_CSUM_OFF    120         /* both checksums cover [0,120) */
#define IX_CHUNK_RECS  8192        /* records read per pread at open: 1 MiB, bounded memory */
#define IX_WRITE_BATCH 64          /* records encoded per write in a rewrite: 8 KiB */

struct ofl_index {
    int fd; /* O_RDWR|O_APPEND, flocked */
    char *path;
    uint64_t size; /* bytes: header + whole records, what the file holds */
    uint32_t slot_bytes;
    bool broken; /* an append could not be undone: refuse more */
};

/* ---- little-endian fields ---- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* ---- encode / decode ---- */

void ofl_index_rec_encode(const struct ofl_index_rec *r, uint8_t out[OFL_INDEX_REC_BYTES]) {
    memset(out, 0, OFL_INDEX_REC_BYTES);
    put_u32(out, IX_REC_MAGIC);
    put_u16(out + 4, OFL_INDEX_VERSION);
    out[6] = r->op;
    memcpy(out + 8, r->hash, OFL_HASH_BYTES);
    put_u32(out + 40, r->slot);
    put_u32(out + 44, r->tenant);
    put_u32(out + 48, r->len);
    put_u64(out + 56, r->csum);
    memcpy(out + 64, r->model_fp, OFL_FP_BYTES);
    put_u64(out + IX_CSUM_OFF, XXH3_64bits(out, IX_CSUM_OFF));
}

int ofl_index_rec_decode(const uint8_t in[OFL_INDEX_REC_BYTES], struct ofl_index_rec *r) {
    if (get_u32(in) != IX_REC_MAGIC || get_u64(in + IX_CSUM_OFF) != XXH3_64bits(in, IX_CSUM_OFF))
        return -EBADMSG;
    memset(r, 0, sizeof *r);
    r->op = in[6];
    memcpy(r->hash, in + 8, OFL_HASH_BYTES);
    r->slot = get_u32(in + 40);
    r->tenant = get_u32(in + 44);
    r->len = get_u32(in + 48);
    r->csum = get_u64(in + 56);
    memcpy(r->model_fp, in + 64, OFL_FP_BYTES);
    if (get_u16(in + 4) != OFL_INDEX_VERSION || (r->op != OFL_INDEX_ADD && r->op != OFL_INDEX_DEL))
        return -ENOTSUP;
    return 0;
}

void ofl_index_hdr_encode(uint32_t slot_bytes, uint8_t out[OFL_INDEX_HDR_BYTES]) {
    memset(out, 0, OFL_INDEX_HDR_BYTES);
    memcpy(out, IX_HDR_MAGIC, 8);
    put_u32(out + 8, OFL_INDEX_VERSION);
    put_u32(out + 12, OFL_INDEX_REC_BYTES);
    put_u32(out + 16, slot_bytes);
    put_u64(out + IX_CSUM_OFF, XXH3_64bits(out, IX_CSUM_OFF));
}

int ofl_index_hdr_decode(const uint8_t in[OFL_INDEX_HDR_BYTES], uint32_t *slot_bytes) {
    if (memcmp(in, IX_HDR_MAGIC, 8) != 0 ||
        get_u64(in + IX_CSUM_OFF) != XXH3_64bits(in, IX_CSUM_OFF))
        return -EBADMSG;
    if (get_u32(in + 8) != OFL_INDEX_VERSION || get_u32(in + 12) != OFL_INDEX_REC_BYTES)
        return -ENOTSUP;
    *slot_bytes = get_u32(in + 16);
    return 0;
}

size_t ofl_index_replay_recs(const uint8_t *recs, size_t n_recs, const struct ofl_index_geom *g,
                             ofl_index_apply_fn apply, void *ctx, struct ofl_index_replay *st) {
    for (size_t i = 0; i < n_recs; i++) {
        struct ofl_index_rec r;
        int rc = ofl_index_rec_decode(recs + i * OFL_INDEX_REC_BYTES, &r);
        if (rc == -EBADMSG)
            return i;
        st->n_records++;
        if (rc) {
            st->n_ignored_unknown++;
            continue;
        }
        if (r.slot >= g->n_slots ||
            (r.op == OFL_INDEX_ADD && (r.len == 0 || r.len > g->slot_bytes))) {
            st->n_ignored_geom++;
            continue;
        }
        if (memcmp(r.model_fp, g->model_fp, OFL_FP_BYTES) != 0)
            st->n_ignored_fp++;
        else
            st->n_applied++;
        if (apply)
            apply(ctx, &r);
    }
    return n_recs;
}

/* ---- the file ---- */

/* Write all of buf at the end of fd (O_APPEND). 0 or -errno; a short write that makes no
 * progress is -ENOSPC (what the kernel means when it stops early at a limit). */
static int ix_write_all(int fd, const uint8_t *buf, size_t len) {
    while (len) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -ENOSPC;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Read exactly len bytes at off; 0, -EIO (file shorter than said), -errno. */
static int ix_pread_all(int fd, uint8_t *buf, size_t len, uint64_t off) {
    while (len) {
        ssize_t r = pread(fd, buf, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -EIO;
        buf += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Truncate to `bytes` and make that durable before anything is appended after it. */
static int ix_cut(struct ofl_index *ix, uint64_t bytes) {
    if (ftruncate(ix->fd, (off_t)bytes) != 0)
        return -errno;
    ix->size = bytes;
    if (fdatasync(ix->fd) != 0)
        return -errno;
    return 0;
}

/* Start the file afresh: an empty file with a header for slot_bytes. */
static int ix_reset(struct ofl_index *ix) {
    uint8_t hdr[OFL_INDEX_HDR_BYTES];
    int rc = ix_cut(ix, 0);
    if (rc)
        return rc;
    ofl_index_hdr_encode(ix->slot_bytes, hdr);
    rc = ix_write_all(ix->fd, hdr, sizeof hdr);
    if (rc)
        return rc;
    ix->size = OFL_INDEX_HDR_BYTES;
    return fdatasync(ix->fd) != 0 ? -errno : 0;
}

/* Replay the records after the header, cutting the file at the first bad one. */
static int ix_replay_file(struct ofl_index *ix, uint64_t file_bytes, const struct ofl_index_geom *g,
                          ofl_index_apply_fn apply, void *ctx, struct ofl_index_replay *st) {
    uint64_t n_whole = (file_bytes - OFL_INDEX_HDR_BYTES) / OFL_INDEX_REC_BYTES;
    uint64_t end = OFL_INDEX_HDR_BYTES + n_whole * OFL_INDEX_REC_BYTES;
    size_t chunk = n_whole < IX_CHUNK_RECS ? (size_t)n_whole : IX_CHUNK_RECS;
    uint8_t *buf = mem_alloc(MEM_OFL, chunk * OFL_INDEX_REC_BYTES);
    if (!buf)
        return -ENOMEM;
    int rc = 0;
    uint64_t done = 0, bad_at = UINT64_MAX;
    while (done < n_whole) {
        size_t n = n_whole - done < chunk ? (size_t)(n_whole - done) : chunk;
        uint64_t off = OFL_INDEX_HDR_BYTES + done * OFL_INDEX_REC_BYTES;
        rc = ix_pread_all(ix->fd, buf, n * OFL_INDEX_REC_BYTES, off);
        if (rc)
            goto out;
        size_t k = ofl_index_replay_recs(buf, n, g, apply, ctx, st);
        done += k;
        if (k < n) {
            bad_at = done;
            break;
        }
    }
    if (bad_at != UINT64_MAX && bad_at + 1 < n_whole) {
        st->n_corrupt = n_whole - bad_at;
        LOG_WARN("ofl",
                 "index %s: corrupt record %" PRIu64 " of %" PRIu64
                 "; replay stops there and the %" PRIu64 " records from it on are dropped",
                 ix->path, bad_at, n_whole, n_whole - bad_at);
    } else if (bad_at != UINT64_MAX || end < file_bytes) {
        st->torn = true;
        LOG_WARN("ofl", "index %s: torn last record (%" PRIu64 " bytes) ignored and cut off",
                 ix->path, file_bytes - (OFL_INDEX_HDR_BYTES + done * OFL_INDEX_REC_BYTES));
    }
    uint64_t good = OFL_INDEX_HDR_BYTES + done * OFL_INDEX_REC_BYTES;
    ix->size = good;
    if (good < file_bytes)
        rc = ix_cut(ix, good);
out:
    mem_free(buf);
    return rc;
}

int ofl_index_open(const char *path, const struct ofl_index_geom *g, ofl_index_apply_fn apply,
                   void *ctx, struct ofl_index **out, struct ofl_index_replay *st, char *errbuf,
                   size_t errlen) {
    struct ofl_index_replay local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    *out = NULL;
    int rc = -ENOMEM;
    struct ofl_index *ix = mem_calloc(MEM_OFL, 1, sizeof *ix);
    if (!ix)
        goto fail;
    ix->fd = -1;
    ix->slot_bytes = g->slot_bytes;
    ix->path = mem_strdup(MEM_OFL, path);
    if (!ix->path)
        goto fail;
    ix->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (ix->fd < 0) {
        rc = -errno;
        log_errbuf(errbuf, errlen, "index %s: open: %s", path, strerror(-rc));
        goto fail;
    }
    if (flock(ix->fd, LOCK_EX | LOCK_NB) != 0) {
        rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        log_errbuf(errbuf, errlen, "index %s: %s", path,
                   rc == -EBUSY ? "in use by another process" : strerror(-rc));
        goto fail;
    }
    struct stat sb;
    if (fstat(ix->fd, &sb) != 0) {
        rc = -errno;
        log_errbuf(errbuf, errlen, "index %s: fstat: %s", path, strerror(-rc));
        goto fail;
    }
    uint64_t file_bytes = (uint64_t)sb.st_size;
    st->fresh = file_bytes == 0;
    uint8_t hdr[OFL_INDEX_HDR_BYTES];
    uint32_t file_slot_bytes = 0;
    int hrc = -EBADMSG;
    if (file_bytes >= OFL_INDEX_HDR_BYTES) {
        rc = ix_pread_all(ix->fd, hdr, sizeof hdr, 0);
        if (rc) {
            log_errbuf(errbuf, errlen, "index %s: read: %s", path, strerror(-rc));
            goto fail;
        }
        hrc = ofl_index_hdr_decode(hdr, &file_slot_bytes);
    }
    if (hrc == 0 && file_slot_bytes == g->slot_bytes) {
        rc = ix_replay_file(ix, file_bytes, g, apply, ctx, st);
    } else {
        if (file_bytes > 0) {
            st->reset = true;
            if (hrc == 0) {
                st->n_ignored_geom = (file_bytes - OFL_INDEX_HDR_BYTES) / OFL_INDEX_REC_BYTES;
                LOG_WARN("ofl",
                         "index %s: written for %u-byte slots, not %u: its %" PRIu64
                         " records are ignored and the index restarts",
                         path, file_slot_bytes, g->slot_bytes, st->n_ignored_geom);
            } else {
                LOG_WARN("ofl", "index %s: header %s (%" PRIu64 " bytes): the index restarts", path,
                         file_bytes < OFL_INDEX_HDR_BYTES ? "torn" : "unreadable", file_bytes);
            }
        }
        rc = ix_reset(ix);
    }
    if (rc) {
        log_errbuf(errbuf, errlen, "index %s: %s", path, strerror(-rc));
        goto fail;
    }
    st->good_bytes = ix->size;
    *out = ix;
    return 0;

fail:
    if (ix) {
        if (ix->fd >= 0)
            close(ix->fd);
        mem_free(ix->path);
        mem_free(ix);
    }
    return rc;
}

int ofl_index_append(struct ofl_index *ix, const uint8_t *recs, size_t n_recs) {
    if (ix->broken)
        return -EIO;
    if (n_recs == 0)
        return 0;
    int rc = ix_write_all(ix->fd, recs, n_recs * OFL_INDEX_REC_BYTES);
    if (rc == 0) {
        ix->size += (uint64_t)n_recs * OFL_INDEX_REC_BYTES;
        return 0;
    }
    if (ftruncate(ix->fd, (off_t)ix->size) != 0) {
        ix->broken = true;
        LOG_ERROR("ofl",
                  "index %s: an append failed (%s) and could not be cut back (%s): no more "
                  "appends until reopen",
                  ix->path, strerror(-rc), strerror(errno));
    }
    return rc;
}

int ofl_index_sync(struct ofl_index *ix) {
    return fdatasync(ix->fd) != 0 ? -errno : 0;
}

/* Directory part of path ("." when there is none), into buf. */
static void ix_dirname(const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else if (slash == path)
        snprintf(buf, len, "/");
    else
        snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

int ofl_index_rewrite(struct ofl_index *ix, ofl_index_next_fn next, void *ctx) {
    size_t plen = strlen(ix->path);
    int rc = -ENOMEM, fd = -1;
    char *tmp = mem_alloc(MEM_OFL, plen + 5);
    uint8_t *buf = mem_alloc(MEM_OFL, (size_t)IX_WRITE_BATCH * OFL_INDEX_REC_BYTES);
    if (!tmp || !buf)
        goto out;
    memcpy(tmp, ix->path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        rc = -errno;
        goto out;
    }
    ofl_index_hdr_encode(ix->slot_bytes, buf);
    rc = ix_write_all(fd, buf, OFL_INDEX_HDR_BYTES);
    uint64_t size = OFL_INDEX_HDR_BYTES;
    bool more = true;
    while (rc == 0 && more) {
        size_t n = 0;
        struct ofl_index_rec r;
        while (n < IX_WRITE_BATCH && (more = next(ctx, &r)))
            ofl_index_rec_encode(&r, buf + n++ * OFL_INDEX_REC_BYTES);
        rc = ix_write_all(fd, buf, n * OFL_INDEX_REC_BYTES);
        size += (uint64_t)n * OFL_INDEX_REC_BYTES;
    }
    if (rc == 0 && fdatasync(fd) != 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, ix->path) != 0)
        rc = -errno;
    if (rc)
        goto out;
    char dir[4096];
    ix_dirname(ix->path, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (fsync(dfd) != 0)
            LOG_WARN("ofl", "index %s: fsync of %s: %s", ix->path, dir, strerror(errno));
        close(dfd);
    }
    close(ix->fd);
    ix->fd = fd;
    ix->size = size;
    ix->broken = false;
    fd = -1;
out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    mem_free(buf);
    mem_free(tmp);
    return rc;
}

uint64_t ofl_index_bytes(const struct ofl_index *ix) {
    return ix->size;
}

void ofl_index_close(struct ofl_index *ix) {
    if (!ix)
        return;
    if (fdatasync(ix->fd) != 0)
        LOG_WARN("ofl", "index %s: fdatasync: %s", ix->path, strerror(errno));
    close(ix->fd);
    mem_free(ix->path);
    mem_free(ix);
}
