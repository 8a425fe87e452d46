/* http_auth.c - API keys: "Authorization: Bearer KEY" -> tenant.
 *
 * The keys file (docs/serving.md) has one key a line:
 *
 *   # KEY                 TENANT   [weight=N] [max_priority=N] [retention_pages=N]
 *   sk-acme-3f9a1c...     acme     weight=4 retention_pages=2000
 *   sk-acme-ci-77d0...    acme
 *   sk-globex-12ab...     globex   max_priority=0
 *
 * A tenant's options may be given on any of its lines; given twice they
 * must agree. Tenants get engine ids 1, 2, ... in order of first
 * appearance (0 is the tenant of a server without keys).
 *
 * Only the SHA-256 of each key is kept. A lookup hashes the presented key
 * and compares it with every entry with CRYPTO_memcmp, without an early
 * exit, so the time taken says nothing about which bytes matched.
 * The file should be readable by its owner only: a warning says so.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "engine/serve/http_impl.h"
#include "log.h"
#include "mem.h"

#define HTTP_KEY_MAX_BYTES  512
#define HTTP_TENANT_MAX_LEN REQ_TENANT_MAX_BYTES

struct http_tenant {
    char name[HTTP_TENANT_MAX_LEN + 1];
    uint32_t id;
    uint32_t weight; /* 0: not given (the engine's 1) */
    int32_t max_priority;
    bool has_max_priority;
    uint32_t retention_pages;
    bool has_retention;
};

struct http_key {
    uint8_t digest[32]; /* SHA-256 of the key */
    uint32_t tenant;    /* index into tenants[] */
};

struct http_keys {
    struct http_key *keys;
    uint32_t n_keys, cap_keys;
    struct http_tenant *tenants;
    uint32_t n_tenants, cap_tenants;
};

static int http_sha256(const void *s, size_t n, uint8_t out[32]) {
    unsigned int len = 0;
    return EVP_Digest(s, n, out, &len, EVP_sha256(), NULL) == 1 && len == 32 ? 0 : -EIO;
}

static int http_grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    uint32_t c = *cap ? *cap * 2 : 16;
    void *q = mem_realloc(*p, (size_t)c * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static int http_tenant_find(struct http_keys *k, const char *name, uint32_t *out) {
    for (uint32_t i = 0; i < k->n_tenants; i++)
        if (strcmp(k->tenants[i].name, name) == 0) {
            *out = i;
            return 0;
        }
    if (http_grow((void **)&k->tenants, &k->cap_tenants, k->n_tenants + 1, sizeof(*k->tenants)))
        return -ENOMEM;
    struct http_tenant *t = &k->tenants[k->n_tenants];
    *t = (struct http_tenant){.id = k->n_tenants + 1};
    snprintf(t->name, sizeof(t->name), "%s", name);
    *out = k->n_tenants++;
    return 0;
}

/* "name=value" of a line, applied to t. Returns 0, -EINVAL (err says why). */
static int http_tenant_opt(struct http_tenant *t, const char *opt, char *err, size_t errlen) {
    const char *eq = strchr(opt, '=');
    char *end;
    errno = 0;
    long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
    if (!eq || errno || end == eq + 1 || *end) {
        snprintf(err, errlen, "'%s' is not name=integer", opt);
        return -EINVAL;
    }
    size_t n = (size_t)(eq - opt);
    if (n == 6 && strncmp(opt, "weight", 6) == 0) {
        if (v < 1 || v > 1000000 || (t->weight && t->weight != v))
            goto bad;
        t->weight = (uint32_t)v;
    } else if (n == 12 && strncmp(opt, "max_priority", 12) == 0) {
        if (v < INT32_MIN || v > INT32_MAX || (t->has_max_priority && t->max_priority != v))
            goto bad;
        t->max_priority = (int32_t)v;
        t->has_max_priority = true;
    } else if (n == 15 && strncmp(opt, "retention_pages", 15) == 0) {
        if (v < 0 || v > UINT32_MAX || (t->has_retention && t->retention_pages != v))
            goto bad;
        t->retention_pages = (uint32_t)v;
        t->has_retention = true;
    } else {
        snprintf(err, errlen, "unknown option '%.*s' (weight, max_priority, retention_pages)",
                 (int)n, opt);
        return -EINVAL;
    }
    return 0;
bad:
    snprintf(err, errlen, "'%s': out of range, or not what an earlier line of tenant '%s' said",
             opt, t->name);
    return -EINVAL;
}

/* One non-comment line, split on blanks (modified in place). */
static int http_keys_line(struct http_keys *k, char *line, char *err, size_t errlen) {
    char *save = NULL, *key = strtok_r(line, " \t", &save), *name = strtok_r(NULL, " \t", &save);
    if (!key)
        return 0; /* blank */
    if (!name) {
        snprintf(err, errlen, "a key without a tenant");
        return -EINVAL;
    }
    if (strlen(key) > HTTP_KEY_MAX_BYTES) {
        snprintf(err, errlen, "the key is longer than %d bytes", HTTP_KEY_MAX_BYTES);
        return -EINVAL;
    }
    for (const char *c = key; *c; c++)
        if (!isgraph((unsigned char)*c)) {
            snprintf(err, errlen, "the key has a byte that is not printable ASCII");
            return -EINVAL;
        }
    if (!req_tenant_name_ok(name, strlen(name))) {
        snprintf(err, errlen, "tenant '%s': use 1 to %d of [A-Za-z0-9_.-]", name,
                 HTTP_TENANT_MAX_LEN);
        return -EINVAL;
    }
    uint32_t ti;
    uint8_t d[32];
    if (http_tenant_find(k, name, &ti) < 0 ||
        http_grow((void **)&k->keys, &k->cap_keys, k->n_keys + 1, sizeof(*k->keys)) < 0)
        return -ENOMEM;
    for (char *opt; (opt = strtok_r(NULL, " \t", &save));) {
        int rc = http_tenant_opt(&k->tenants[ti], opt, err, errlen);
        if (rc < 0)
            return rc;
    }
    if (http_sha256(key, strlen(key), d) < 0)
        return -EIO;
    for (uint32_t i = 0; i < k->n_keys; i++)
        if (CRYPTO_memcmp(k->keys[i].digest, d, 32) == 0) {
            snprintf(err, errlen, "the same key is listed twice");
            return -EINVAL;
        }
    memcpy(k->keys[k->n_keys].digest, d, 32);
    k->keys[k->n_keys++].tenant = ti;
    OPENSSL_cleanse(key, strlen(key));
    return 0;
}

int http_keys_load(const char *path, struct http_keys **out, char *errbuf, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        int rc = -errno;
        snprintf(errbuf, errlen, "llmd serve: --api-keys %s: %s", path, strerror(-rc));
        return rc;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        LOG_WARN("http", "%s is readable by others (mode %03o): chmod 600 it", path,
                 (unsigned)(st.st_mode & 0777));
    struct http_keys *k = mem_calloc(MEM_HTTP, 1, sizeof(*k));
    char *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;
    int rc = k ? 0 : -ENOMEM;
    char why[200] = "";
    while (rc == 0 && getline(&line, &cap, f) > 0) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        line[strcspn(line, "\r\n")] = '\0';
        rc = http_keys_line(k, line, why, sizeof(why));
    }
    if (line) {
        OPENSSL_cleanse(line, cap);
        free(line); /* getline's, not the funnel's */
    }
    if (rc == 0 && ferror(f))
        rc = -EIO;
    fclose(f);
    if (rc == 0 && k->n_keys == 0) {
        snprintf(why, sizeof(why), "no keys: every request would be refused");
        rc = -EINVAL;
        lineno = 0;
    }
    if (rc < 0) {
        if (rc == -EINVAL && lineno)
            snprintf(errbuf, errlen, "llmd serve: --api-keys %s line %u: %s", path, lineno, why);
        else if (rc == -EINVAL)
            snprintf(errbuf, errlen, "llmd serve: --api-keys %s: %s", path, why);
        else
            snprintf(errbuf, errlen, "llmd serve: --api-keys %s: %s", path, strerror(-rc));
        http_keys_destroy(k);
        return rc;
    }
    *out = k;
    return 0;
}

void http_keys_destroy(struct http_keys *k) {
    if (!k)
        return;
    if (k->keys)
        OPENSSL_cleanse(k->keys, (size_t)k->n_keys * sizeof(*k->keys));
    mem_free(k->keys);
    mem_free(k->tenants);
    mem_free(k);
}

int http_keys_apply(const struct http_keys *k, struct llmd_engine *e, char *errbuf, size_t errlen) {
    for (uint32_t i = 0; i < k->n_tenants; i++) {
        const struct http_tenant *t = &k->tenants[i];
        int rc = 0;
        if (t->weight || t->has_max_priority)
            rc = llmd_tenant_set(e, t->id, t->weight ? t->weight : 1,
                                 t->has_max_priority ? t->max_priority : INT32_MAX);
        if (rc == 0 && t->has_retention)
            rc = llmd_tenant_retention(e, t->id, t->retention_pages);
        if (rc < 0) {
            snprintf(errbuf, errlen, "llmd serve: tenant '%s': %s%s", t->name, strerror(-rc),
                     rc == -ENOTSUP ? " (retention_pages needs the prefix cache)" : "");
            return rc;
        }
    }
    return 0;
}

int http_keys_tenant_id(const struct http_keys *k, const char *name, uint32_t *tenant) {
    for (uint32_t i = 0; i < k->n_tenants; i++)
        if (strcmp(k->tenants[i].name, name) == 0) {
            *tenant = k->tenants[i].id;
            return 0;
        }
    return -ENOENT;
}

int http_keys_lookup(const struct http_keys *k, const char *authorization, uint32_t *tenant) {
    static const char bearer[] = "Bearer ";
    if (!authorization || strncasecmp(authorization, bearer, sizeof(bearer) - 1) != 0)
        return -EACCES;
    const char *key = authorization + sizeof(bearer) - 1;
    while (*key == ' ')
        key++;
    size_t n = strlen(key);
    while (n && (key[n - 1] == ' ' || key[n - 1] == '\t'))
        n--;
    uint8_t d[32];
    if (n == 0 || n > HTTP_KEY_MAX_BYTES || http_sha256(key, n, d) < 0)
        return -EACCES;
    int found = -1;
    for (uint32_t i = 0; i < k->n_keys; i++) { /* no early exit: constant time in the match */
        int eq = CRYPTO_memcmp(k->keys[i].digest, d, 32) == 0;
        found = eq ? (int)k->keys[i].tenant : found;
    }
    if (found < 0)
        return -EACCES;
    *tenant = k->tenants[found].id;
    return 0;
}
