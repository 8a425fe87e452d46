/* pfx_hash.c - the prefix cache's secret and its keyed page-hash chain.
 *
 * h_i = HMAC-SHA256(secret, h_{i-1} || tokens of page i || fp || namespace),
 * h_{-1} = 32 zero bytes. HMAC (RFC 2104) rather than a bare SHA-256 so that
 * hashes are worthless outside the deployment that holds the secret: one
 * cannot precompute the hash of a guessed prompt and probe an NVMe index or a
 * metrics label with it. Every field but the namespace has a fixed length
 * within one pool (32, 4*tpp, 32 bytes), and the namespace comes last, so
 * the concatenation is unambiguous without length prefixes.
 *
 * Tokens are hashed as int32 little-endian whatever the host, so hashes
 * written to an NVMe index stay valid on another machine with the same secret.
 *
 * OpenSSL 3's EVP_MAC: the keyed context is built once (the key schedule:
 * two SHA-256 blocks) and duplicated per chain call; each page re-inits it
 * with a NULL key, which reuses the schedule. The duplicate makes pfx_chain
 * safe from any thread.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "engine/core/pfx_impl.h"
#include "log.h"

#define PFX_TOK_CHUNK 256 /* tokens converted to LE per MAC update: 1 KiB of stack */

/* ---- the secret ---- */

static int pfx_hex_nibble(int c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Exactly 2*PFX_KEY_BYTES hex digits, optionally surrounded by whitespace. */
static int pfx_hex_key(const char *s, size_t len, uint8_t key[PFX_KEY_BYTES]) {
    while (len && isspace((unsigned char)*s))
        s++, len--;
    while (len && isspace((unsigned char)s[len - 1]))
        len--;
    if (len != 2 * PFX_KEY_BYTES)
        return -EINVAL;
    for (size_t i = 0; i < PFX_KEY_BYTES; i++) {
        int hi = pfx_hex_nibble(s[2 * i]), lo = pfx_hex_nibble(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* The key in the open file fd (64 hex digits or 32 raw bytes); closes fd. */
static int pfx_secret_read(int fd, const char *path, uint8_t key[PFX_KEY_BYTES]) {
    char buf[4 * PFX_KEY_BYTES];
    size_t len = 0;
    int rc = 0;
    while (len < sizeof buf) {
        ssize_t n = read(fd, buf + len, sizeof buf - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (rc == 0 && len == PFX_KEY_BYTES)
        memcpy(key, buf, PFX_KEY_BYTES); /* raw bytes */
    else if (rc == 0)
        rc = len < sizeof buf ? pfx_hex_key(buf, len, key) : -EINVAL;
    if (rc == -EINVAL)
        LOG_ERROR("pfx", "secret file %s: want 64 hex digits or 32 raw bytes", path);
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}

static int pfx_secret_file(const char *path, uint8_t key[PFX_KEY_BYTES]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & 077))
        LOG_WARN("pfx", "secret file %s may be read by group or others (mode %03o)", path,
                 (unsigned)(st.st_mode & 0777));
    return pfx_secret_read(fd, path, key);
}

/* Write a new random key to path, which must not exist: through a private
 * temporary file and link(), so a reader never sees half a key and of two
 * processes creating it at once one wins (-EEXIST for the other). */
static int pfx_keyfile_create(const char *path, uint8_t key[PFX_KEY_BYTES]) {
    char tmp[4096], hex[2 * PFX_KEY_BYTES + 2];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    if (RAND_bytes(key, PFX_KEY_BYTES) != 1)
        return -EIO;
    for (size_t i = 0; i < PFX_KEY_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
    hex[2 * PFX_KEY_BYTES] = '\n';
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    int rc = fd < 0 ? -errno : 0;
    if (rc == 0 && write(fd, hex, 2 * PFX_KEY_BYTES + 1) != 2 * PFX_KEY_BYTES + 1)
        rc = -EIO;
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (fd >= 0)
        close(fd);
    if (rc == 0 && link(tmp, path) != 0)
        rc = -errno;
    if (fd >= 0)
        unlink(tmp);
    OPENSSL_cleanse(hex, sizeof hex);
    return rc;
}

int pfx_secret_keyfile(const char *path, uint8_t key[PFX_KEY_BYTES], bool *created) {
    *created = false;
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0 && errno == ENOENT) {
            int rc = pfx_keyfile_create(path, key);
            if (rc == -EEXIST) /* another process made it first: read theirs */
                continue;
            *created = rc == 0;
            return rc;
        }
        if (fd < 0)
            return errno == ELOOP ? -EPERM : -errno; /* a symbolic link: refused */
        struct stat st;
        int rc = fstat(fd, &st) != 0 ? -errno : 0;
        if (rc == 0 && (!S_ISREG(st.st_mode) || (st.st_mode & 077)))
            rc = -EPERM;
        if (rc < 0) {
            close(fd);
            return rc;
        }
        return pfx_secret_read(fd, path, key);
    }
    return -EEXIST;
}

int pfx_secret_load(const char *path, uint8_t key[PFX_KEY_BYTES], bool *ephemeral) {
    if (ephemeral)
        *ephemeral = false;
    if (path)
        return pfx_secret_file(path, key);
    const char *env = getenv("LLMD_PFX_SECRET");
    if (env) {
        int rc = pfx_hex_key(env, strlen(env), key);
        if (rc)
            LOG_ERROR("pfx", "LLMD_PFX_SECRET: want 64 hex digits");
        return rc;
    }
    if (RAND_bytes(key, PFX_KEY_BYTES) != 1)
        return -EIO;
    if (ephemeral)
        *ephemeral = true;
    LOG_INFO("pfx", "no secret configured (file or LLMD_PFX_SECRET): using a random one, "
                    "so cached prefixes will not survive a restart");
    return 0;
}

/* ---- the hasher ---- */

int pfx_hasher_init(struct pfx_hasher *hs, const uint8_t key[PFX_KEY_BYTES],
                    const uint8_t fp[MODEL_FP_BYTES], uint32_t tpp) {
    memset(hs, 0, sizeof *hs);
    if (tpp == 0)
        return -EINVAL;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!mac)
        return -EIO;
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac); /* the context holds its own reference */
    if (!ctx)
        return -ENOMEM;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    if (EVP_MAC_init(ctx, key, PFX_KEY_BYTES, params) != 1) {
        EVP_MAC_CTX_free(ctx);
        return -EIO;
    }
    hs->proto = ctx;
    memcpy(hs->fp, fp, MODEL_FP_BYTES);
    hs->tpp = tpp;
    return 0;
}

void pfx_hasher_fini(struct pfx_hasher *hs) {
    EVP_MAC_CTX_free(hs->proto); /* cleanses the key schedule */
    memset(hs, 0, sizeof *hs);
}

/* The scope of page i: the first k whose end covers the page, else the last. */
static uint32_t pfx_ns_of_page(const struct pfx_ns *ns, uint32_t n_ns, uint64_t page_end) {
    uint32_t k = 0;
    while (k + 1 < n_ns && page_end > ns[k].end_tokens)
        k++;
    return k;
}

static int pfx_mac_tokens(EVP_MAC_CTX *c, const int32_t *tok, uint32_t n) {
    uint8_t le[PFX_TOK_CHUNK * 4];
    for (uint32_t i = 0; i < n; i += PFX_TOK_CHUNK) {
        uint32_t m = n - i < PFX_TOK_CHUNK ? n - i : PFX_TOK_CHUNK;
        for (uint32_t j = 0; j < m; j++) {
            uint32_t x = (uint32_t)tok[i + j];
            le[4 * j] = (uint8_t)x;
            le[4 * j + 1] = (uint8_t)(x >> 8);
            le[4 * j + 2] = (uint8_t)(x >> 16);
            le[4 * j + 3] = (uint8_t)(x >> 24);
        }
        if (EVP_MAC_update(c, le, 4 * (size_t)m) != 1)
            return -EIO;
    }
    return 0;
}

static int pfx_mac_page(EVP_MAC_CTX *c, const struct pfx_hasher *hs, const uint8_t parent[32],
                        const int32_t *tok, const struct pfx_ns *ns, struct pfx_hash *out) {
    size_t len = 0;
    if (EVP_MAC_init(c, NULL, 0, NULL) != 1 || EVP_MAC_update(c, parent, PFX_HASH_BYTES) != 1 ||
        pfx_mac_tokens(c, tok, hs->tpp) != 0 || EVP_MAC_update(c, hs->fp, MODEL_FP_BYTES) != 1 ||
        (ns->n_bytes && EVP_MAC_update(c, ns->bytes, ns->n_bytes) != 1) ||
        EVP_MAC_final(c, out->b, &len, sizeof out->b) != 1 || len != PFX_HASH_BYTES)
        return -EIO;
    return 0;
}

int pfx_hasher_chain(const struct pfx_hasher *hs, const struct pfx_ns *ns, uint32_t n_ns,
                     const int32_t *tokens, uint32_t n_tokens, struct pfx_hash *out,
                     uint32_t *n_out) {
    uint32_t n_pages = n_tokens / hs->tpp;
    if (n_ns == 0 || *n_out > n_pages || (n_pages && !tokens))
        return -EINVAL;
    for (uint32_t k = 0; k < n_ns; k++)
        if ((ns[k].n_bytes && !ns[k].bytes) ||
            (k > 0 && k + 1 < n_ns && ns[k].end_tokens < ns[k - 1].end_tokens))
            return -EINVAL; /* the last scope's end is ignored */
    if (*n_out == n_pages)
        return 0;
    EVP_MAC_CTX *c = EVP_MAC_CTX_dup(hs->proto);
    if (!c)
        return -ENOMEM;
    static const uint8_t zero[PFX_HASH_BYTES];
    int rc = 0;
    for (uint32_t i = *n_out; i < n_pages && rc == 0; i++) {
        const uint8_t *parent = i ? out[i - 1].b : zero;
        uint32_t k = pfx_ns_of_page(ns, n_ns, (uint64_t)(i + 1) * hs->tpp);
        rc = pfx_mac_page(c, hs, parent, tokens + (size_t)i * hs->tpp, &ns[k], &out[i]);
    }
    EVP_MAC_CTX_free(c);
    if (rc == 0)
        *n_out = n_pages;
    return rc;
}
