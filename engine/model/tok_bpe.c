/* tok_bpe.c - byte-level BPE, as llama.cpp's llm_tokenizer_bpe with the
 * "gpt-2", "llama-bpe" and "qwen2" pre-tokenizers (tok.h, enum tok_pre).
 *
 * Encoding runs in four steps (qwen2: the text NFC-normalised after step 1,
 * libunistring's u8_normalize, as its tokenizer.json's normalizer asks):
 *  1. Invalid UTF-8 is replaced: the text is decoded with llama.cpp's lenient
 *     decoder (unicode_cpts_from_utf8: a bad lead or truncated sequence
 *     becomes U+FFFD and one byte is consumed; overlong forms are accepted
 *     and re-encoded shortest) and re-encoded. Surrogates and code points
 *     above U+10FFFF, which llama.cpp passes through, become U+FFFD too:
 *     PCRE2 cannot match them. Only ill-formed input is affected.
 *  2. The GPT-2 pattern splits the text into words (PCRE2, UTF + UCP mode);
 *     `\s+(?!\S)` leaves the last space of a run to the next word. Text the
 *     pattern does not cover (none, in practice) becomes a word of its own,
 *     as in llama.cpp's regex splitter.
 *  3. Each byte of a word maps to one code point (GPT-2 bytes_to_unicode:
 *     printable Latin-1 bytes to themselves, the other 68 to U+0100..U+0143).
 *  4. Per word, adjacent symbols merge lowest merge rank first (ties: the
 *     leftmost) through the shared merge loop of tok.c; each final symbol is
 *     its token, or else each of its bytes as a one-byte token if one
 *     exists (llama.cpp drops bytes that have none).
 *
 * The compiled pattern is shared read-only; each tok_bpe_encode() call has
 * its own PCRE2 match data, so encoding is thread-safe. PCRE2 allocates
 * through mem.h (tag MEM_TOK) via a general context.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/model/tok_impl.h"

#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uninorm.h>

#include "log.h"
#include "mem.h"

/* The Split regexes of each family's tokenizer.json (pre_tokenizer), which
 * llama.cpp's llama-vocab.cpp uses too; PCRE2 in UTF + UCP mode reads
 * \\p{L}, \\p{N} and \\s as Unicode categories, as the Rust regex crate of
 * Hugging Face tokenizers does. */
static const char *const PRE_PATTERN[TOK_PRE_N] = {
    [TOK_PRE_GPT2] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+"
                     "| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    [TOK_PRE_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                       "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TOK_PRE_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

static const char *const tok_pre_names[TOK_PRE_N] = {"gpt-2", "llama-bpe", "qwen2"};

int tok_pre_parse(const char *name, size_t n, enum tok_pre *out) {
    for (int i = 0; i < TOK_PRE_N; i++)
        if (strlen(tok_pre_names[i]) == n && memcmp(tok_pre_names[i], name, n) == 0) {
            *out = (enum tok_pre)i;
            return 0;
        }
    return -ENOENT;
}

const char *tok_pre_name(enum tok_pre p) {
    return (unsigned)p < TOK_PRE_N ? tok_pre_names[p] : "?";
}

const char *tok_pre_pattern(enum tok_pre p) {
    return (unsigned)p < TOK_PRE_N ? PRE_PATTERN[p] : NULL;
}

/* Code points of the byte mapping: 0..255 and 256..323. */
#define BPE_N_CP 324

struct tok_bpe_re {
    pcre2_general_context *gctx;
    pcre2_code *code;
    uint8_t enc[256][2];   /* UTF-8 of the code point byte b maps to */
    uint8_t enc_len[256];  /* 1 or 2 */
    int16_t dec[BPE_N_CP]; /* code point -> byte, -1 if unmapped */
};

static void *re_malloc(PCRE2_SIZE n, void *ud) {
    (void)ud;
    return mem_alloc(MEM_TOK, n);
}

static void re_free(void *p, void *ud) {
    (void)ud;
    mem_free(p);
}

static size_t utf8_put(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static void byte_map_build(struct tok_bpe_re *re) {
    uint32_t extra = 0;
    for (int i = 0; i < BPE_N_CP; i++)
        re->dec[i] = -1;
    for (uint32_t b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        uint32_t cp = keep ? b : 256 + extra++;
        re->enc_len[b] = (uint8_t)utf8_put(cp, re->enc[b]);
        re->dec[cp] = (int16_t)b;
    }
}

int tok_bpe_init(struct tok *t, char *errbuf, size_t errlen) {
    struct tok_bpe_re *re = mem_calloc(MEM_TOK, 1, sizeof(*re));
    if (!re)
        return -ENOMEM;
    t->re = re;
    byte_map_build(re);
    re->gctx = pcre2_general_context_create(re_malloc, re_free, NULL);
    pcre2_compile_context *cctx = re->gctx ? pcre2_compile_context_create(re->gctx) : NULL;
    if (!cctx)
        return -ENOMEM;
    int err;
    PCRE2_SIZE err_off;
    re->code = pcre2_compile((PCRE2_SPTR)PRE_PATTERN[t->pre], PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP, &err, &err_off, cctx);
    pcre2_compile_context_free(cctx);
    if (!re->code) {
        if (err == PCRE2_ERROR_HEAPLIMIT || err == PCRE2_ERROR_NOMEMORY)
            return -ENOMEM;
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(err, msg, sizeof(msg));
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "%s pre-tokenizer regex: %s at %zu", tok_pre_name(t->pre),
                     (char *)msg, (size_t)err_off);
        return -ENOMEM; /* the pattern is fixed: only resources can fail */
    }
    return 0;
}

void tok_bpe_fini(struct tok *t) {
    struct tok_bpe_re *re = t->re;
    if (!re)
        return;
    pcre2_code_free(re->code);
    pcre2_general_context_free(re->gctx);
    mem_free(re);
    t->re = NULL;
}

/* Step 1: llama.cpp's lenient decode, re-encoded; out has 3 * n bytes. */
static size_t sanitize(const uint8_t *s, size_t n, uint8_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t m = 0;
        uint32_t cp = 0;
        if (c < 0x80) {
            m = 1, cp = c;
        } else if ((c & 0x40) == 0) {
            m = 0; /* stray continuation byte */
        } else if ((c & 0x20) == 0) {
            m = 2, cp = c & 0x1Fu;
        } else if ((c & 0x10) == 0) {
            m = 3, cp = c & 0x0Fu;
        } else if ((c & 0x08) == 0) {
            m = 4, cp = c & 0x07u;
        }
        if (m > n - i)
            m = 0;
        for (size_t j = 1; j < m; j++) {
            if ((s[i + j] & 0xC0) != 0x80) {
                m = 0;
                break;
            }
            cp = cp << 6 | (s[i + j] & 0x3Fu);
        }
        if (m == 0) {
            m = 1;
            cp = 0xFFFD;
        }
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            cp = 0xFFFD;
        k += utf8_put(cp, out + k);
        i += m;
    }
    return k;
}

/* Steps 3 and 4 for one word; wbuf has room for 2 * len bytes. */
static int word_encode(const struct tok *t, struct tok_work *w, const uint8_t *word, size_t len,
                       char *wbuf, struct tok_out *o) {
    const struct tok_bpe_re *re = t->re;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        memcpy(wbuf + n, re->enc[word[i]], re->enc_len[word[i]]);
        n += re->enc_len[word[i]];
    }
    if (t->ignore_merges) { /* llama-bpe: a word that is a token is that token */
        int32_t id = tok_lookup(t, wbuf, n);
        if (id >= 0 && t->type[id] == TOK_TYPE_NORMAL) {
            tok_out_push(o, id);
            return 0;
        }
    }
    int rc = tok_work_merge(t, w, wbuf, n);
    for (int32_t i = 0; !rc && n && i != -1; i = w->sym[i].next) {
        const struct tok_sym *s = &w->sym[i];
        int32_t id = tok_lookup(t, wbuf + s->off, s->n);
        if (id >= 0) {
            tok_out_push(o, id);
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++) {
            id = tok_lookup(t, wbuf + s->off + j, 1);
            if (id >= 0)
                tok_out_push(o, id);
        }
    }
    return rc;
}

static size_t utf8_char_len(const uint8_t *s, size_t n) {
    size_t k = s[0] < 0xC0 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
    return k < n ? k : n;
}

int tok_bpe_encode(const struct tok *t, const char *text, size_t len, struct tok_out *o) {
    if (len == 0)
        return 0;
    const struct tok_bpe_re *re = t->re;
    uint8_t *clean = mem_alloc(MEM_TOK, 3 * len);
    char *wbuf = mem_alloc(MEM_TOK, 6 * len);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re->code, re->gctx);
    struct tok_work w = {0};
    int rc = clean && wbuf && md ? 0 : -ENOMEM;
    size_t n = rc ? 0 : sanitize((const uint8_t *)text, len, clean);
    if (!rc && t->nfc && n) {
        uint8_t *nfc;
        /* NFC may grow the text (by at most 3x, Unicode's bound) */
        size_t nn = 0;
        nfc = u8_normalize(UNINORM_NFC, clean, n, NULL, &nn);
        if (!nfc) {
            rc = -ENOMEM;
        } else if (nn > 3 * len) { /* grown past the buffers: the word buffer is 2x */
            mem_free(clean);
            mem_free(wbuf);
            clean = mem_alloc(MEM_TOK, nn);
            wbuf = mem_alloc(MEM_TOK, 2 * nn);
            rc = clean && wbuf ? 0 : -ENOMEM;
        }
        if (!rc) {
            memcpy(clean, nfc, nn);
            n = nn;
        }
        free(nfc); /* libunistring's malloc */
    }
    for (size_t off = 0; !rc && off < n;) {
        int m = pcre2_match(re->code, clean, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t start = n, end = n;
        if (m >= 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            start = ov[0];
            end = ov[1];
        } else if (m != PCRE2_ERROR_NOMATCH) {
            /* Out of memory or a PCRE2 resource limit on absurd input. */
            if (m != PCRE2_ERROR_NOMEMORY && m != PCRE2_ERROR_HEAPLIMIT)
                LOG_WARN("tok", "%s pre-tokenizer: pcre2_match error %d", tok_pre_name(t->pre), m);
            rc = -ENOMEM;
            break;
        }
        if (start > off)
            rc = word_encode(t, &w, clean + off, start - off, wbuf, o);
        if (end == start && start < n) /* an empty match: never with this pattern */
            end = start + utf8_char_len(clean + start, n - start);
        if (!rc && end > start)
            rc = word_encode(t, &w, clean + start, end - start, wbuf, o);
        off = end;
    }
    tok_work_fini(&w);
    pcre2_match_data_free(md);
    mem_free(wbuf);
    mem_free(clean);
    return rc;
}

size_t tok_bpe_decode(const struct tok *t, const char *s, size_t n, char *out) {
    const struct tok_bpe_re *re = t->re;
    const uint8_t *p = (const uint8_t *)s;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t m = utf8_char_len(p + i, n - i);
        uint32_t cp = m == 1 ? p[i] : m == 2 ? (p[i] & 0x1Fu) << 6 | (p[i + 1] & 0x3Fu) : BPE_N_CP;
        if (cp < BPE_N_CP && re->dec[cp] >= 0) {
            out[k++] = (char)re->dec[cp];
        } else {
            memcpy(out + k, p + i, m); /* outside the mapping: keep its UTF-8 */
            k += m;
        }
        i += m;
    }
    return k;
}
