/* ofl_index.h - the NVMe tier's append-only index file: which slot holds which page.
 *
 * Model: a 128-byte file header (magic, version, slot_bytes) followed by fixed-size
 * 128-byte little-endian records, each ADD (hash, slot, tenant, len, data checksum,
 * model fingerprint) or DEL (hash, slot), each closed by an xxh3-64 of its first 120
 * bytes. Records are only ever appended; the live set is the result of replaying them
 * in order. A record that was torn by a crash mid-append (short, or with a bad record
 * checksum) ends the replay and is cut off the file; so is everything after a corrupt
 * record in the middle, since nothing after it can be trusted to be in order.
 *
 * Workflow: ofl_index_open (replays into the caller's callback, truncates a torn tail)
 * -> ofl_index_append (batches of encoded records) -> ofl_index_sync -> ofl_index_close;
 * ofl_index_rewrite compacts to the live set (temp file + rename).
 *
 * Thread safety: the encode/decode/replay functions are pure and reentrant. A struct
 * ofl_index is not thread-safe: its owner (ofl_nvme) serializes the calls. Every file
 * call blocks on I/O.
 */
#ifndef LLMD_OFL_INDEX_H
#define LLMD_OFL_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OFL_HASH_BYTES      32
#define OFL_FP_BYTES        32
#define OFL_INDEX_REC_BYTES 128 /* divides 4096: a record never straddles a page */
#define OFL_INDEX_HDR_BYTES 128
#define OFL_INDEX_VERSION   1

enum ofl_index_op { OFL_INDEX_ADD = 1, OFL_INDEX_DEL = 2 };

/* One record, decoded. */
struct ofl_index_rec {
    uint8_t op; /* enum ofl_index_op */
    uint8_t hash[OFL_HASH_BYTES];
    uint32_t slot;   /* slot index in the data file */
    uint32_t tenant; /* ADD only; 0 in a DEL */
    uint32_t len;    /* payload bytes, 1..slot_bytes; ADD only */
    uint64_t csum;   /* xxh3-64 of the payload; ADD only */
    uint8_t model_fp[OFL_FP_BYTES];
};

/* What a replay accepts: records outside this geometry are ignored (counted); records of
 * another fingerprint are not this model's entries, but they still hold their slots, so
 * they go to the apply callback too (counted apart: see ofl_index_replay_recs). */
struct ofl_index_geom {
    uint32_t slot_bytes; /* payload bytes per slot; a header with another value resets the file */
    uint32_t n_slots;    /* slots in the data file; an ADD/DEL for slot >= n_slots is ignored */
    uint8_t model_fp[OFL_FP_BYTES];
};

/* What a replay found. */
struct ofl_index_replay {
    uint64_t n_records;         /* well-formed records read */
    uint64_t n_applied;         /* records of g's fingerprint handed to the apply callback */
    uint64_t n_ignored_fp;      /* records of another model fingerprint (handed to apply too) */
    uint64_t n_ignored_geom;    /* bad slot or length, or the whole file under another slot_bytes */
    uint64_t n_ignored_unknown; /* good checksum but an unknown version or op (a newer writer) */
    uint64_t n_corrupt;         /* records dropped after a bad record in the middle, the bad one
                                 * included */
    uint64_t good_bytes;        /* header + whole good records: the file's length after open */
    bool torn;                  /* the last record was short or bad and was cut off */
    bool reset; /* header missing, corrupt or of another slot_bytes: file restarted */
    bool fresh; /* the file was absent or empty: a new index */
};

/* Called once per accepted record, in file order. ctx is the caller's. */
typedef void (*ofl_index_apply_fn)(void *ctx, const struct ofl_index_rec *r);

/* Encode r into out[0..128), the record checksum included. Never fails. */
void ofl_index_rec_encode(const struct ofl_index_rec *r, uint8_t out[OFL_INDEX_REC_BYTES]);

/* Decode in[0..128) into *r. Returns 0, -EBADMSG (bad magic or record checksum: torn or
 * corrupt), -ENOTSUP (checksum good but version or op unknown: skip it). Pure. */
int ofl_index_rec_decode(const uint8_t in[OFL_INDEX_REC_BYTES], struct ofl_index_rec *r);

/* Encode the file header for slot_bytes into out[0..128). */
void ofl_index_hdr_encode(uint32_t slot_bytes, uint8_t out[OFL_INDEX_HDR_BYTES]);

/* Decode a header: *slot_bytes is set on success. Returns 0, -EBADMSG (bad magic or
 * checksum), -ENOTSUP (another version). Pure. */
int ofl_index_hdr_decode(const uint8_t in[OFL_INDEX_HDR_BYTES], uint32_t *slot_bytes);

/* Replay n_recs whole records at recs[0..n_recs*128): each good record of g's geometry
 * goes to apply (may be NULL), whatever its fingerprint: one of another model is not an
 * entry of g's, but the slot it names is that model's, and one index (one slot file) may
 * serve several models in turn; apply tells them apart by r->model_fp. The counters of
 * *st are incremented (n_applied for g's fingerprint, n_ignored_fp for the others). Stops
 * at the first record that fails ofl_index_rec_decode with -EBADMSG and returns its
 * position (n_recs when all were good). Pure apart from apply. */
size_t ofl_index_replay_recs(const uint8_t *recs, size_t n_recs, const struct ofl_index_geom *g,
                             ofl_index_apply_fn apply, void *ctx, struct ofl_index_replay *st);

struct ofl_index;

/* Open (creating if absent) the index file at path, take an exclusive flock on it, and
 * replay it through apply. A torn or corrupt tail is cut off (LOG_WARN); a header that is
 * missing, corrupt or of another slot_bytes restarts the file (LOG_WARN, counted in
 * n_ignored_geom). *st (may be NULL) gets what the replay found. path and g are borrowed.
 * On success *out owns the index: close it with ofl_index_close(). Returns 0, -EBUSY
 * (another process holds the index), -ENOMEM, -errno of open/read/write/ftruncate (errbuf,
 * may be NULL, says which). Blocks on I/O. */
int ofl_index_open(const char *path, const struct ofl_index_geom *g, ofl_index_apply_fn apply,
                   void *ctx, struct ofl_index **out, struct ofl_index_replay *st, char *errbuf,
                   size_t errlen);

/* Append n_recs encoded records (recs[0..n_recs*128)) with one write. On a failed or short
 * write the file is cut back to its last whole record, so a later append cannot leave a bad
 * record in the middle. Returns 0, -errno of write (-ENOSPC, -EFBIG, -EIO). Blocks. */
int ofl_index_append(struct ofl_index *ix, const uint8_t *recs, size_t n_recs);

/* fdatasync the index. Returns 0 or -errno. Blocks. */
int ofl_index_sync(struct ofl_index *ix);

/* Fills *r with the next record of a rewrite; returns true, or false when done. */
typedef bool (*ofl_index_next_fn)(void *ctx, struct ofl_index_rec *r);

/* Replace the file by a header and the records next() yields, written to path + ".tmp",
 * fdatasynced, then renamed over the index (and the directory fsynced), so a crash leaves
 * either the old or the new file. Returns 0, -ENOMEM, -errno; on failure the old file is
 * still in use. Blocks. */
int ofl_index_rewrite(struct ofl_index *ix, ofl_index_next_fn next, void *ctx);

/* Length of the file in bytes: header + whole records. */
uint64_t ofl_index_bytes(const struct ofl_index *ix);

/* fdatasync and close; NULL is a no-op. */
void ofl_index_close(struct ofl_index *ix);

#endif /* LLMD_OFL_INDEX_H */
