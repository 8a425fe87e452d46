/* The prefix cache's page-hash chain, secret loading and model fingerprint:
 * chain values against an independent one-shot HMAC (RFC 2104 via OpenSSL's
 * HMAC()), what the chain depends on, the scope rule, and the errors. */
#include <fcntl.h>
#include <sys/stat.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/model/model_fp.h"
#include "tests/lib/pfx_util.h"

static struct vmm *v;
static struct pfx *p;
static struct pfx_config cfg;

static void setup(void) {
    v = vt_pool(8, 2, 8 * PT_TPP, false);
    pt_config(&cfg);
    p = pt_pfx(v, &cfg);
}

static void teardown(void) {
    pfx_destroy(p);
    vmm_destroy(v);
    cr_assert_eq(mem_bytes(MEM_PFX), 0, "pfx leaked %lu bytes", (unsigned long)mem_bytes(MEM_PFX));
}

TestSuite(pfx_hash, .init = setup, .fini = teardown);

/* HMAC-SHA256(key, parent || tokens LE || fp || ns), written out by hand. */
static void ref_page(const uint8_t *key, const uint8_t parent[32], const int32_t *tok,
                     const uint8_t fp[32], const char *ns, uint8_t out[32]) {
    uint8_t msg[32 + 4 * PT_TPP + 32 + 64];
    size_t n = 0;
    memcpy(msg, parent, 32);
    n += 32;
    for (int t = 0; t < PT_TPP; t++) {
        uint32_t x = (uint32_t)tok[t];
        for (int b = 0; b < 4; b++)
            msg[n++] = (uint8_t)(x >> (8 * b));
    }
    memcpy(msg + n, fp, 32);
    n += 32;
    memcpy(msg + n, ns, strlen(ns));
    n += strlen(ns);
    unsigned len = 0;
    cr_assert_not_null(HMAC(EVP_sha256(), key, 32, msg, n, out, &len));
    cr_assert_eq(len, 32);
}

static bool all_differ(const struct pfx_hash *a, const struct pfx_hash *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (memcmp(a[i].b, b[i].b, 32) == 0)
            return false;
    return true;
}

Test(pfx_hash, chain_matches_oneshot_hmac) {
    int32_t tok[2 * PT_TPP];
    for (int i = 0; i < 2 * PT_TPP; i++)
        tok[i] = i * 7919 - 100000; /* negative ids too: two's complement LE */
    struct pfx_ns ns = pt_ns("tenant-42");
    struct pfx_hash h[2];
    pt_chain(p, &ns, 1, tok, 2, h);
    uint8_t zero[32] = {0}, want0[32], want1[32];
    ref_page(cfg.secret, zero, tok, cfg.model_fp, "tenant-42", want0);
    ref_page(cfg.secret, want0, tok + PT_TPP, cfg.model_fp, "tenant-42", want1);
    cr_assert_arr_eq(h[0].b, want0, 32, "page 0");
    cr_assert_arr_eq(h[1].b, want1, 32, "page 1");
}

Test(pfx_hash, partial_page_not_hashed_and_extension_is_incremental) {
    int32_t tok[5 * PT_TPP];
    for (int i = 0; i < 5 * PT_TPP; i++)
        tok[i] = i;
    struct pfx_ns ns = pt_ns("t");
    struct pfx_hash whole[5], inc[5];
    uint32_t n = 0;
    cr_assert_eq(pfx_chain(p, &ns, 1, tok, 2 * PT_TPP + 63, inc, &n), 0);
    cr_assert_eq(n, 2, "a partial third page is not hashed");
    cr_assert_eq(pfx_chain(p, &ns, 1, tok, 5 * PT_TPP, inc, &n), 0);
    cr_assert_eq(n, 5);
    pt_chain(p, &ns, 1, tok, 5, whole);
    cr_assert_arr_eq(inc, whole, sizeof whole);
    cr_assert_eq(pfx_chain(p, &ns, 1, tok, 5 * PT_TPP, inc, &n), 0, "nothing new: no-op");
    cr_assert_eq(n, 5);
}

Test(pfx_hash, chain_depends_on_every_earlier_token) {
    int32_t tok[4 * PT_TPP];
    for (int i = 0; i < 4 * PT_TPP; i++)
        tok[i] = i;
    struct pfx_ns ns = pt_ns("t");
    struct pfx_hash a[4], b[4];
    pt_chain(p, &ns, 1, tok, 4, a);
    tok[0] = 1;
    pt_chain(p, &ns, 1, tok, 4, b);
    cr_assert(all_differ(a, b, 4), "token 0 changes every page's hash");
    tok[0] = 0;
    tok[2 * PT_TPP + 5] ^= 1;
    pt_chain(p, &ns, 1, tok, 4, b);
    cr_assert_arr_eq(a, b, 2 * sizeof a[0], "pages before the change keep their hash");
    cr_assert(all_differ(a + 2, b + 2, 2), "the changed page and every later one differ");
}

Test(pfx_hash, chain_depends_on_namespace_fingerprint_and_secret) {
    int32_t tok[3 * PT_TPP];
    for (int i = 0; i < 3 * PT_TPP; i++)
        tok[i] = i % 50;
    struct pfx_ns a = pt_ns("tenant-a"), b = pt_ns("tenant-b"), g = {0};
    struct pfx_hash ha[3], hb[3], hg[3], hx[3];
    pt_chain(p, &a, 1, tok, 3, ha);
    pt_chain(p, &b, 1, tok, 3, hb);
    pt_chain(p, &g, 1, tok, 3, hg);
    cr_assert(all_differ(ha, hb, 3), "namespace");
    cr_assert(all_differ(ha, hg, 3), "empty namespace is its own scope");

    struct pfx_config c2 = cfg;
    c2.model_fp[31] ^= 1;
    struct pfx *q = pt_pfx(v, &c2);
    pt_chain(q, &a, 1, tok, 3, hx);
    cr_assert(all_differ(ha, hx, 3), "fingerprint");
    pfx_destroy(q);

    c2 = cfg;
    c2.secret[0] ^= 0x80;
    q = pt_pfx(v, &c2);
    pt_chain(q, &a, 1, tok, 3, hx);
    cr_assert(all_differ(ha, hx, 3), "secret");
    pfx_destroy(q);

    q = pt_pfx(v, &cfg);
    pt_chain(q, &a, 1, tok, 3, hx);
    cr_assert_arr_eq(ha, hx, sizeof ha, "same inputs, another instance: same hashes");
    pfx_destroy(q);
}

Test(pfx_hash, scopes_narrow_at_page_boundaries) {
    /* Scope "org" ends at token 2*tpp + 5: pages 0 and 1 lie wholly inside it,
     * page 2 straddles the end and so belongs to the tenant's scope. */
    int32_t tok[4 * PT_TPP];
    for (int i = 0; i < 4 * PT_TPP; i++)
        tok[i] = 3 * i;
    struct pfx_ns sc[2] = {pt_ns("org"), pt_ns("tenant-a")};
    sc[0].end_tokens = 2 * PT_TPP + 5;
    struct pfx_ns org = pt_ns("org");
    struct pfx_hash h[4], ho[4];
    pt_chain(p, sc, 2, tok, 4, h);
    pt_chain(p, &org, 1, tok, 4, ho);
    cr_assert_arr_eq(h, ho, 2 * sizeof h[0], "pages 0-1 hash in the org scope");
    uint8_t want2[32], want3[32];
    ref_page(cfg.secret, ho[1].b, tok + 2 * PT_TPP, cfg.model_fp, "tenant-a", want2);
    ref_page(cfg.secret, want2, tok + 3 * PT_TPP, cfg.model_fp, "tenant-a", want3);
    cr_assert_arr_eq(h[2].b, want2, 32, "page 2 in the tenant scope, parent from org");
    cr_assert_arr_eq(h[3].b, want3, 32);

    sc[0].end_tokens = 2 * PT_TPP; /* exactly on a boundary: page 1 is the last org page */
    pt_chain(p, sc, 2, tok, 4, h);
    cr_assert_arr_eq(h[1].b, ho[1].b, 32);
    cr_assert_arr_eq(h[2].b, want2, 32);
}

Test(pfx_hash, chain_errors) {
    int32_t tok[2 * PT_TPP] = {0};
    struct pfx_hash h[2];
    struct pfx_ns sc[3] = {pt_ns("a"), pt_ns("b"), pt_ns("c")};
    uint32_t n = 0;
    cr_assert_eq(pfx_chain(p, sc, 0, tok, 2 * PT_TPP, h, &n), -EINVAL, "no scope");
    sc[0].end_tokens = 100;
    sc[1].end_tokens = 50;
    cr_assert_eq(pfx_chain(p, sc, 3, tok, 2 * PT_TPP, h, &n), -EINVAL, "scope widens");
    sc[1].end_tokens = 100;
    sc[2].end_tokens = 0; /* the last scope's end is ignored */
    cr_assert_eq(pfx_chain(p, sc, 3, tok, 2 * PT_TPP, h, &n), 0);
    n = 3;
    cr_assert_eq(pfx_chain(p, sc, 3, tok, 2 * PT_TPP, h, &n), -EINVAL, "n_out past the pages");
    cr_assert_eq(n, 3, "unchanged on error");
    n = 0;
    struct pfx_ns bad = {.bytes = NULL, .n_bytes = 4};
    cr_assert_eq(pfx_chain(p, &bad, 1, tok, 2 * PT_TPP, h, &n), -EINVAL, "NULL bytes");
    cr_assert_eq(n, 0);
}

/* ---- secret ---- */

static const char *hex64 = "000102030405060708090a0b0c0d0e0f101112131415161718191A1B1C1D1E1F";

static void write_file(const char *path, const void *buf, size_t len, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, buf, len), (ssize_t)len);
    close(fd);
}

Test(pfx_hash, secret_from_env_file_or_random) {
    uint8_t key[32], want[32];
    bool eph = true;
    for (int i = 0; i < 32; i++)
        want[i] = (uint8_t)i;

    setenv("LLMD_PFX_SECRET", hex64, 1);
    cr_assert_eq(pfx_secret_load(NULL, key, &eph), 0);
    cr_assert_arr_eq(key, want, 32, "env hex");
    cr_assert_not(eph);

    char dir[] = "/tmp/pfx_secret_XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/key", dir);
    char line[80];
    snprintf(line, sizeof line, "  %s\n", hex64);
    write_file(path, line, strlen(line), 0600);
    memset(key, 0, 32);
    cr_assert_eq(pfx_secret_load(path, key, &eph), 0, "a file wins over the env");
    cr_assert_arr_eq(key, want, 32, "file hex with whitespace");

    uint8_t raw[32];
    for (int i = 0; i < 32; i++)
        raw[i] = (uint8_t)(0xff - i);
    write_file(path, raw, 32, 0600);
    cr_assert_eq(pfx_secret_load(path, key, &eph), 0);
    cr_assert_arr_eq(key, raw, 32, "file of 32 raw bytes");

    write_file(path, "abcd\n", 5, 0600);
    cr_assert_eq(pfx_secret_load(path, key, &eph), -EINVAL, "short file");
    line[10] = 'g';
    write_file(path, line, strlen(line), 0600);
    cr_assert_eq(pfx_secret_load(path, key, &eph), -EINVAL, "not hex");
    unlink(path);
    cr_assert_eq(pfx_secret_load(path, key, &eph), -ENOENT, "a configured file must exist");
    rmdir(dir);

    setenv("LLMD_PFX_SECRET", "12", 1);
    cr_assert_eq(pfx_secret_load(NULL, key, &eph), -EINVAL, "short env");

    unsetenv("LLMD_PFX_SECRET");
    uint8_t k1[32], k2[32];
    cr_assert_eq(pfx_secret_load(NULL, k1, &eph), 0);
    cr_assert(eph, "random secret is ephemeral");
    cr_assert_eq(pfx_secret_load(NULL, k2, NULL), 0);
    cr_assert(memcmp(k1, k2, 32) != 0, "two random secrets differ");
}

/* The key file beside an NVMe tier: made on first use (64 hex digits, mode
 * 0600), the same key read back after; refused, never read or replaced, when
 * group or others may read it, when it is a symbolic link or a directory,
 * or when it holds no key. Then a good one works again. */
Test(pfx_hash, tier_key_file_is_made_once_and_guarded) {
    char dir[] = "/tmp/pfx_keyfile_XXXXXX", path[64], link_path[80];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/kv.slots.key", dir);
    uint8_t k1[32], k2[32];
    bool created = false;
    cr_assert_eq(pfx_secret_keyfile(path, k1, &created), 0);
    cr_assert(created, "the first use makes it");
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
    cr_assert_eq(st.st_size, 65, "64 hex digits and a newline");
    char text[80] = "";
    int fd = open(path, O_RDONLY);
    cr_assert_eq(read(fd, text, sizeof text - 1), 65);
    close(fd);
    for (int i = 0; i < 32; i++) {
        char want[3];
        snprintf(want, sizeof want, "%02x", k1[i]);
        cr_assert(text[2 * i] == want[0] && text[2 * i + 1] == want[1], "digit pair %d", i);
    }
    cr_assert_eq(pfx_secret_keyfile(path, k2, &created), 0);
    cr_assert_not(created, "the second use reads it");
    cr_assert_arr_eq(k2, k1, 32, "the same key across runs");

    cr_assert_eq(chmod(path, 0640), 0);
    cr_assert_eq(pfx_secret_keyfile(path, k2, &created), -EPERM, "group may read it");
    cr_assert_eq(chmod(path, 0604), 0);
    cr_assert_eq(pfx_secret_keyfile(path, k2, &created), -EPERM, "others may read it");
    cr_assert_eq(chmod(path, 0600), 0);
    snprintf(link_path, sizeof link_path, "%s/other.key", dir);
    cr_assert_eq(symlink(path, link_path), 0);
    cr_assert_eq(pfx_secret_keyfile(link_path, k2, &created), -EPERM, "a symbolic link");
    unlink(link_path);
    cr_assert_eq(mkdir(link_path, 0700), 0);
    cr_assert_eq(pfx_secret_keyfile(link_path, k2, &created), -EPERM, "a directory");
    rmdir(link_path);
    write_file(link_path, "not a key\n", 10, 0600);
    cr_assert_eq(pfx_secret_keyfile(link_path, k2, &created), -EINVAL, "not a key");
    cr_assert_not(created);
    unlink(link_path);
    memset(k2, 0, sizeof k2);
    cr_assert_eq(pfx_secret_keyfile(path, k2, &created), 0, "the good one still works");
    cr_assert_arr_eq(k2, k1, 32);
    unlink(path);
    rmdir(dir);
}

/* ---- model fingerprint ---- */

Test(pfx_hash, fingerprint_covers_bytes_split_and_dtype) {
    static uint8_t w[3][4096];
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < 4096; i++)
            w[b][i] = (uint8_t)(i * 31 + b);
    const void *bufs[3] = {w[0], w[1], w[2]};
    size_t lens[3] = {4096, 4096, 4096};
    uint8_t a[32], b[32];
    model_fingerprint(bufs, lens, 3, 1, a);
    model_fingerprint(bufs, lens, 3, 1, b);
    cr_assert_arr_eq(a, b, 32, "deterministic");
    model_fingerprint(bufs, lens, 3, 0, b);
    cr_assert(memcmp(a, b, 32) != 0, "kv dtype");
    w[2][4095] ^= 1;
    model_fingerprint(bufs, lens, 3, 1, b);
    cr_assert(memcmp(a, b, 32) != 0, "last byte");
    w[2][4095] ^= 1;
    size_t moved[3] = {4095, 4097, 4096}; /* same bytes (w is contiguous), another split */
    const void *mb[3] = {w[0], w[0] + 4095, w[2]};
    model_fingerprint(mb, moved, 3, 1, b);
    cr_assert(memcmp(a, b, 32) != 0, "buffer boundaries count");
    cr_assert(memcmp(a, a + 16, 16) != 0, "two seeds, two halves");
}

/* ---- pfx_chain from many threads at once ---- */

#define CT_THREADS 4
#define CT_PAGES   32

struct ct_arg {
    int32_t *tok;
    struct pfx_hash want[CT_PAGES];
    int bad;
};

static void *ct_run(void *arg) {
    struct ct_arg *a = arg;
    struct pfx_ns ns = pt_ns("t");
    for (int rep = 0; rep < 20; rep++) {
        struct pfx_hash h[CT_PAGES];
        uint32_t n = 0;
        if (pfx_chain(p, &ns, 1, a->tok, CT_PAGES * PT_TPP, h, &n) || n != CT_PAGES ||
            memcmp(h, a->want, sizeof h))
            a->bad++;
    }
    return NULL;
}

Test(pfx_hash, chain_is_safe_from_many_threads) {
    static int32_t tok[CT_THREADS][CT_PAGES * PT_TPP];
    static struct ct_arg args[CT_THREADS];
    struct pfx_ns ns = pt_ns("t");
    pthread_t th[CT_THREADS];
    for (int i = 0; i < CT_THREADS; i++) {
        for (int t = 0; t < CT_PAGES * PT_TPP; t++)
            tok[i][t] = t * (i + 1);
        args[i].tok = tok[i];
        pt_chain(p, &ns, 1, tok[i], CT_PAGES, args[i].want);
    }
    for (int i = 0; i < CT_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, ct_run, &args[i]), 0);
    for (int i = 0; i < CT_THREADS; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].bad, 0, "thread %d: %d wrong chains", i, args[i].bad);
    }
}
