/* llmd_cli.c - option parsing shared by the `llmd` subcommands (see
 * llmd_cli.h). The subcommands call these and llmd_main.c only dispatches
 * to them, so no subcommand calls back into the entry point.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <getopt.h>

#include "engine/model/tok.h"
#include "llmd.h"
#include "llmd_cli.h"
#include "mem.h"

bool cli_parse_size(const char *s, uint64_t *out) {
    /* a digit first: strtoull would skip blanks and wrap a "-" (" -1" read as 2^64 - 1) */
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return false;
    uint64_t mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    default:
        break;
    }
    if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end != '\0' || (v != 0 && mul > UINT64_MAX / v))
        return false;
    *out = (uint64_t)v * mul;
    return true;
}

bool cli_parse_long(const char *s, long min, long max, long *out) {
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, float *out) {
    errno = 0;
    char *end;
    float v = strtof(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v))
        return false;
    *out = v;
    return true;
}

bool cli_parse_device(const char *s, bool *cuda, int *index) {
    if (strcmp(s, "cpu") == 0) {
        *cuda = false;
        *index = 0;
        return true;
    }
    if (strncmp(s, "cuda", 4) != 0)
        return false;
    long n = 0;
    if (s[4] == ':' && !cli_parse_long(s + 5, 0, 63, &n))
        return false;
    if (s[4] != '\0' && s[4] != ':')
        return false;
    *cuda = true;
    *index = (int)n;
    return true;
}

const char *cli_opt_name(const struct option *opts, int c, int li) {
    static char buf[64];
    for (int i = 0; opts[i].name; i++)
        if ((li >= 0 && i == li) || (li < 0 && opts[i].val == c)) {
            snprintf(buf, sizeof(buf), "--%s", opts[i].name);
            return buf;
        }
    snprintf(buf, sizeof(buf), "-%c", c);
    return buf;
}

void cli_bad_value(const char *cmd, const struct option *opts, int c, int li, const char *arg,
                   const char *want) {
    fprintf(stderr, "%s: invalid value '%s' for %s: want %s\n", cmd, arg, cli_opt_name(opts, c, li),
            want);
}

void cli_engine_err(const char *cmd, const char *err, int rc) {
    if (!err || !err[0])
        err = strerror(rc < 0 ? -rc : rc);
    if (strncmp(err, "llmd: ", 6) == 0)
        err += 6;
    /* vmm's words ("ranges", "max_tokens") as the flags that lower the mapping count: the
     * budget does not, it bounds physical pages, not how many a range may map */
    fprintf(stderr, "%s: %s%s\n", cmd, err,
            strstr(err, "vm.max_map_count") ? " (options: --ctx, --max-seqs, --page-size)" : "");
}

/* b as a size flag takes it: the largest of G, M, K that divides it (1024-based, as
 * cli_parse_size reads them), else the bare number of bytes */
static const char *cli_size_str(uint64_t b, char *buf, size_t len) {
    static const char suf[] = "GMK";
    for (int i = 0; i < 3; i++) {
        uint64_t u = (uint64_t)1 << (10 * (3 - i));
        if (b >= u && b % u == 0) {
            snprintf(buf, len, "%" PRIu64 "%c", b / u, suf[i]);
            return buf;
        }
    }
    snprintf(buf, len, "%" PRIu64, b);
    return buf;
}

void cli_kv_caps_note(const char *cmd, uint64_t page_req, uint64_t page_bytes,
                      uint32_t tokens_per_page, uint64_t budget_req, uint64_t kv_pages,
                      uint32_t n_ctx, uint32_t max_seqs) {
    char req[32];
    if (page_req && page_bytes < page_req)
        fprintf(stderr,
                "%s: --page-size %s is more than a context of %u tokens can use; pages are "
                "%" PRIu64 " B (%u tokens)\n",
                cmd, cli_size_str(page_req, req, sizeof req), n_ctx, page_bytes, tokens_per_page);
    if (budget_req && page_bytes && budget_req > kv_pages * page_bytes &&
        budget_req - kv_pages * page_bytes >= page_bytes)
        fprintf(stderr,
                "%s: --kv-budget %s is more than %u sequence%s of %u tokens can use; the KV "
                "pool is %" PRIu64 " page%s of %" PRIu64 " B (%" PRIu64 " B)\n",
                cmd, cli_size_str(budget_req, req, sizeof req), max_seqs, max_seqs == 1 ? "" : "s",
                n_ctx, kv_pages, kv_pages == 1 ? "" : "s", page_bytes, kv_pages * page_bytes);
}

void cli_packed(char *buf, size_t cap, uint64_t packed_bytes, uint64_t copied_bytes) {
    if (packed_bytes && copied_bytes)
        snprintf(buf, cap, " (+%.1f MB packed, +%.1f MB copied)", (double)packed_bytes / 1e6,
                 (double)copied_bytes / 1e6);
    else if (packed_bytes || copied_bytes)
        snprintf(buf, cap, " (+%.1f MB %s)", (double)(packed_bytes + copied_bytes) / 1e6,
                 packed_bytes ? "packed" : "copied");
    else if (cap)
        buf[0] = '\0';
}

void cli_ctx_note(const char *cmd, uint32_t n_ctx, uint32_t n_ctx_train) {
    if (n_ctx_train && n_ctx > n_ctx_train)
        fprintf(stderr,
                "%s: warning: --ctx %u exceeds the model's context_length %u; quality past %u "
                "tokens is not what the model was trained for\n",
                cmd, n_ctx, n_ctx_train, n_ctx_train);
}

bool cli_check_batching(const char *cmd, long max_seqs, long max_batched, int spec) {
    long seqs = max_seqs ? max_seqs : 8, batched = max_batched ? max_batched : 256;
    if (batched == seqs && spec != LLMD_SPEC_NONE)
        fprintf(stderr,
                "%s: warning: drafts ride in the step budget, and --max-batched-tokens %ld "
                "leaves none for them while all %ld sequences decode: speculation runs only "
                "when fewer do (raise --max-batched-tokens above --max-seqs)\n",
                cmd, batched, seqs);
    if (batched >= seqs)
        return true;
    fprintf(stderr,
            "%s: --max-batched-tokens (%ld%s) must be >= --max-seqs (%ld%s): every running "
            "sequence needs a token in each step\n",
            cmd, batched, max_batched ? "" : ", the default", seqs,
            max_seqs ? "" : ", the default");
    return false;
}

int cli_read_file(const char *path, size_t max, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return -errno;
    /* The buffer never grows past max + 2: max + 1 bytes read is the
     * proof of a file over the cap (a stream such as /dev/zero or `yes`
     * has no size to stat), and one more holds the NUL. */
    size_t cap = max + 2 < (size_t)1 << 16 ? max + 2 : (size_t)1 << 16, n = 0;
    char *buf = mem_alloc(MEM_CLI, cap);
    int rc = buf ? 0 : -ENOMEM;
    while (rc == 0) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n > max) {
            rc = -EFBIG;
            break;
        }
        if (n < cap - 1)
            break;
        size_t ncap = cap > (max + 2) / 2 ? max + 2 : cap * 2;
        char *nb = mem_realloc(buf, ncap);
        if (!nb) {
            rc = -ENOMEM;
            break;
        }
        buf = nb;
        cap = ncap;
    }
    if (rc == 0 && ferror(f))
        rc = errno ? -errno : -EIO; /* a directory reads as EISDIR */
    if (f != stdin)
        fclose(f);
    if (rc < 0) {
        mem_free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

void cli_read_file_err(const char *cmd, const char *what, const char *path, size_t max, int rc) {
    if (rc == -EFBIG)
        fprintf(stderr, "%s: %s is larger than %zu MiB, the most %s may hold\n", cmd,
                strcmp(path, "-") == 0 ? "stdin" : path, max >> 20, what);
    else
        fprintf(stderr, "%s: cannot read %s: %s\n", cmd, strcmp(path, "-") == 0 ? "stdin" : path,
                strerror(-rc));
}

_Static_assert(LLMD_SPEC_TOKENS_MAX == 32, "CLI_SPEC_TOKENS says 1..32");

const char *cli_spec_check(int spec, long spec_tokens, const char *spec_model) {
    if (spec_tokens && spec == LLMD_SPEC_NONE)
        return "--spec-tokens needs --spec ngram or --spec draft";
    if (spec == LLMD_SPEC_DRAFT && !spec_model)
        return "--spec draft needs --spec-model PATH (a GGUF with the model's vocabulary)";
    if (spec_model && spec != LLMD_SPEC_DRAFT)
        return "--spec-model needs --spec draft";
    return NULL;
}

bool cli_parse_pre(const char *s) {
    enum tok_pre p;
    return tok_pre_parse(s, strlen(s), &p) == 0;
}

bool cli_parse_spec(const char *s, int *out) {
    if (strcmp(s, "ngram") == 0)
        *out = LLMD_SPEC_NGRAM;
    else if (strcmp(s, "draft") == 0)
        *out = LLMD_SPEC_DRAFT;
    else if (strcmp(s, "none") == 0)
        *out = LLMD_SPEC_NONE;
    else
        return false;
    return true;
}
