/* tok.c - creation, SentencePiece (SPM) encoding, pieces and streaming.
 * The vocabulary's hash tables and the merge loop both encoders share are
 * in tok_vocab.c; GPT-2 BPE in tok_bpe.c. Calls go tok.c -> tok_bpe.c ->
 * tok_vocab.c and tok.c -> tok_vocab.c, never back.
 *
 * Design. A struct tok is built once and never changes: token texts are
 * borrowed views into the GGUF mapping, found by an open-addressing hash
 * table (tok_vocab.c). Every token's decoded piece
 * is computed at creation into one buffer, so tok_piece() and the stream
 * are a copy. Encoding allocates its own scratch, so any number of threads
 * may encode at once.
 *
 * SPM follows llama.cpp's llm_tokenizer_spm exactly: spaces become U+2581
 * and one U+2581 is prepended to non-empty text (add_space_prefix); the text
 * is split into UTF-8 symbols; a max-heap of adjacent pairs whose
 * concatenation is a token, ordered by that token's score and then by the
 * left position, merges pairs until none is left (stale heap entries are
 * recognised by their byte size and skipped). Each final symbol is its
 * token, or else one <0xNN> byte token per byte. llama.cpp's resegment()
 * also consults a map of merges, but a final symbol is either a merged one
 * (always a token) or an unmerged character, which never has an entry, so
 * that path cannot change the result and is left out. Each merge pushes at
 * most two pairs, so the heap holds < 3n entries: O(n log n) for n bytes.
 */
#include "engine/model/tok_impl.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/gguf.h"
#include "log.h"
#include "mem.h"

/* Inputs above this are refused with -ENOMEM: symbol indices are int32 and
 * the SPM text grows up to 3x when spaces become U+2581. */
#define TOK_MAX_INPUT_BYTES (512u << 20)

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* U+2581 */

static void tok_err(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void tok_err(char *errbuf, size_t errlen, const char *fmt, ...) {
    if (!errbuf || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

/* ---- pieces ----------------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, or -1. */
static int byte_token_value(struct tok_str s) {
    if (s.len != 6 || memcmp(s.ptr, "<0x", 3) != 0 || s.ptr[5] != '>')
        return -1;
    int hi = hexval(s.ptr[3]), lo = hexval(s.ptr[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Decoded piece of token id into out (room for text[id].len bytes: no
 * piece is longer than its token text). Returns its length. */
static size_t piece_make(const struct tok *t, uint32_t id, char *out) {
    struct tok_str s = t->text[id];
    switch (t->type[id]) {
    case TOK_TYPE_USER_DEFINED:
        memcpy(out, s.ptr, s.len);
        return s.len;
    case TOK_TYPE_NORMAL:
        if (t->kind == TOK_BPE)
            return tok_bpe_decode(t, s.ptr, s.len, out);
        {
            size_t n = 0;
            for (size_t i = 0; i < s.len;) {
                if (s.len - i >= 3 && memcmp(s.ptr + i, SPM_SPACE, 3) == 0) {
                    out[n++] = ' ';
                    i += 3;
                } else {
                    out[n++] = s.ptr[i++];
                }
            }
            return n;
        }
    case TOK_TYPE_BYTE: {
        int b = t->kind == TOK_SPM ? byte_token_value(s) : -1;
        if (b < 0)
            return 0;
        out[0] = (char)b;
        return 1;
    }
    default: /* control, unknown, unused, undefined: llama.cpp prints nothing */
        return 0;
    }
}

static int pieces_build(struct tok *t) {
    size_t total = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        total += t->text[id].len;
    if (total > UINT32_MAX)
        return -EINVAL;
    t->pieces = mem_alloc(MEM_TOK, total + 1);
    t->piece_off = mem_alloc(MEM_TOK, ((size_t)t->n_vocab + 1) * sizeof(*t->piece_off));
    if (!t->pieces || !t->piece_off)
        return -ENOMEM;
    uint32_t off = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = off;
        off += (uint32_t)piece_make(t, id, t->pieces + off);
    }
    t->piece_off[t->n_vocab] = off;
    return 0;
}

/* ---- creation --------------------------------------------------------- */

static int check_id(int32_t id, uint32_t n, const char *what, char *errbuf, size_t errlen) {
    if (id >= -1 && (id < 0 || (uint32_t)id < n))
        return 0;
    tok_err(errbuf, errlen, "%s %d out of range (n_vocab %u)", what, id, n);
    return -EINVAL;
}

/* An SPM byte token's text must be "<0xNN>": it decodes to that byte, and
 * byte fallback looks the byte up by that text, so any other text would
 * decode to nothing and leave the byte without its token. BPE vocabularies keep
 * their bytes in the byte-level alphabet and are not checked. The message
 * names the token and, for a file, the offset of its string. */
static void byte_token_refuse(const struct tok_vocab *v, uint32_t i, char *errbuf, size_t errlen) {
    char shown[20];
    size_t k = 0;
    for (size_t j = 0; j < v->tokens[i].len && k + 4 < sizeof(shown); j++) {
        unsigned char ch = (unsigned char)v->tokens[i].ptr[j];
        shown[k++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (k < v->tokens[i].len)
        k += (size_t)snprintf(shown + k, sizeof(shown) - k, "...");
    shown[k] = '\0';
    uint64_t at = v->file ? gguf_offset_of(v->file, v->tokens[i].ptr) : UINT64_MAX;
    if (at != UINT64_MAX && at >= 8) /* the string starts with its u64 length */
        tok_err(errbuf, errlen,
                "tokenizer.ggml.tokens[%u] at offset %llu: byte token '%s' is not <0xNN> with "
                "two hex digits",
                i, (unsigned long long)(at - 8), shown);
    else
        tok_err(errbuf, errlen,
                "tokenizer.ggml.tokens[%u]: byte token '%s' is not <0xNN> with two hex digits", i,
                shown);
}

enum tok_type tok_token_type(const struct tok *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_vocab ? (enum tok_type)t->type[id] : TOK_TYPE_UNDEFINED;
}

struct tok_str tok_token_text(const struct tok *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_vocab ? t->text[id] : (struct tok_str){NULL, 0};
}

static void tok_eog_init(struct tok *t);

int tok_create_vocab(const struct tok_vocab *v, struct tok **out, char *errbuf, size_t errlen) {
    if (v->n_tokens == 0 || v->n_tokens > INT32_MAX || !v->tokens) {
        tok_err(errbuf, errlen, "tokenizer.ggml.tokens: %u tokens", v->n_tokens);
        return -EINVAL;
    }
    if (v->kind == TOK_BPE && (!v->merges && v->n_merges)) {
        tok_err(errbuf, errlen, "tokenizer.ggml.merges: missing");
        return -EINVAL;
    }
    int rc = check_id(v->bos, v->n_tokens, "bos_token_id", errbuf, errlen);
    rc = rc ? rc : check_id(v->eos, v->n_tokens, "eos_token_id", errbuf, errlen);
    rc = rc ? rc : check_id(v->unk, v->n_tokens, "unknown_token_id", errbuf, errlen);
    if (rc)
        return rc;

    struct tok *t = mem_calloc(MEM_TOK, 1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    rc = -ENOMEM;
    t->kind = v->kind;
    t->n_vocab = v->n_tokens;
    t->bos = v->bos;
    t->eos = v->eos;
    t->unk = v->unk;
    t->add_bos = t->bos >= 0 && (v->add_bos < 0 ? v->kind == TOK_SPM : v->add_bos != 0);
    t->add_space_prefix = v->kind == TOK_SPM && v->add_space_prefix;
    t->pre = v->kind == TOK_BPE && v->pre < TOK_PRE_N ? v->pre : TOK_PRE_GPT2;
    t->ignore_merges = v->kind == TOK_BPE && t->pre == TOK_PRE_LLAMA3;
    t->nfc = v->kind == TOK_BPE && t->pre == TOK_PRE_QWEN2;
    t->text = mem_alloc(MEM_TOK, (size_t)t->n_vocab * sizeof(*t->text));
    t->score = mem_calloc(MEM_TOK, t->n_vocab, sizeof(*t->score));
    t->type = mem_alloc(MEM_TOK, t->n_vocab);
    if (!t->text || !t->score || !t->type)
        goto fail;
    memcpy(t->text, v->tokens, (size_t)t->n_vocab * sizeof(*t->text));
    if (v->scores)
        memcpy(t->score, v->scores, (size_t)t->n_vocab * sizeof(*t->score));
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        int32_t ty = v->types ? v->types[i] : TOK_TYPE_NORMAL;
        if (ty < TOK_TYPE_UNDEFINED || ty > TOK_TYPE_BYTE) {
            tok_err(errbuf, errlen, "tokenizer.ggml.token_type[%u] = %d unknown", i, ty);
            rc = -EINVAL;
            goto fail;
        }
        t->type[i] = (uint8_t)ty;
        if (t->kind == TOK_SPM && ty == TOK_TYPE_BYTE && byte_token_value(t->text[i]) < 0) {
            byte_token_refuse(v, i, errbuf, errlen);
            rc = -EINVAL;
            goto fail;
        }
    }
    rc = tok_vocab_index(t);
    if (rc)
        goto fail;
    if (t->kind == TOK_SPM) {
        /* llama.cpp byte_to_token: "<0xNN>", else the one-byte token;
         * where it would throw we use the unknown token, or drop the byte. */
        for (int b = 0; b < 256; b++) {
            char buf[7];
            snprintf(buf, sizeof(buf), "<0x%02X>", b);
            char c = (char)b;
            int32_t id = tok_lookup(t, buf, 6);
            if (id < 0)
                id = tok_lookup(t, &c, 1);
            t->byte_tok[b] = id >= 0 ? id : t->unk;
        }
    } else {
        rc = tok_merges_index(t, v->merges, v->n_merges);
        rc = rc ? rc : tok_bpe_init(t, errbuf, errlen);
        if (rc)
            goto fail;
    }
    tok_eog_init(t);
    rc = pieces_build(t);
    if (rc) {
        tok_err(errbuf, errlen, "tokenizer.ggml.tokens: %s",
                rc == -ENOMEM ? "out of memory" : "texts over 4 GiB");
        goto fail;
    }
    *out = t;
    return 0;
fail:
    if (rc == -ENOMEM)
        tok_err(errbuf, errlen, "tokenizer: out of memory");
    tok_destroy(t);
    return rc;
}

void tok_destroy(struct tok *t) {
    if (!t)
        return;
    if (t->kind == TOK_BPE)
        tok_bpe_fini(t);
    mem_free(t->piece_off);
    mem_free(t->pieces);
    mem_free(t->mht);
    mem_free(t->merges);
    mem_free(t->ht);
    mem_free(t->type);
    mem_free(t->score);
    mem_free(t->text);
    mem_free(t);
}

enum tok_kind tok_kind(const struct tok *t) {
    return t->kind;
}

uint32_t tok_n_vocab(const struct tok *t) {
    return t->n_vocab;
}

static void tok_eog_add(struct tok *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_vocab || t->n_eog == TOK_EOG_MAX || tok_is_eog(t, id))
        return;
    t->eog[t->n_eog++] = id;
}

/* The EOS, then the control tokens that spell an end-of-turn marker. */
static void tok_eog_init(struct tok *t) {
    static const char *const marks[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>",
                                        "<|end_of_text|>"};
    t->n_eog = 0;
    tok_eog_add(t, t->eos);
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
        int32_t id = tok_lookup(t, marks[i], strlen(marks[i]));
        if (id >= 0 && t->type[id] == TOK_TYPE_CONTROL)
            tok_eog_add(t, id);
    }
}

uint32_t tok_eog(const struct tok *t, int32_t ids[TOK_EOG_MAX]) {
    memcpy(ids, t->eog, t->n_eog * sizeof(*ids));
    return t->n_eog;
}

bool tok_is_eog(const struct tok *t, int32_t id) {
    for (uint32_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

int32_t tok_bos(const struct tok *t) {
    return t->bos;
}

int32_t tok_eos(const struct tok *t) {
    return t->eos;
}

bool tok_add_bos_default(const struct tok *t) {
    return t->add_bos;
}

/* ---- the GGUF adapter ------------------------------------------------- */

/* An optional special-token id: absent -> def, 0xFFFFFFFF -> -1. */
static int gguf_id(const struct gguf *g, const char *key, int32_t def, int32_t *id, char *errbuf,
                   size_t errlen) {
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == -ENOENT) {
        *id = def;
        return 0;
    }
    if (rc || (v > INT32_MAX && v != UINT32_MAX)) {
        tok_err(errbuf, errlen, "%s: not a token id", key);
        return -EINVAL;
    }
    *id = v == UINT32_MAX ? -1 : (int32_t)v;
    return 0;
}

/* An optional numeric array of n elements of type want (or want2). */
static int gguf_num_arr(const struct gguf *g, const char *key, enum gguf_vtype want,
                        enum gguf_vtype want2, uint64_t n, const void **data, char *errbuf,
                        size_t errlen) {
    enum gguf_vtype et;
    uint64_t len;
    int rc = gguf_get_arr(g, key, &et, &len, data);
    if (rc == -ENOENT) {
        *data = NULL;
        return 0;
    }
    if (rc || (et != want && et != want2) || len != n) {
        tok_err(errbuf, errlen, "%s: want %llu elements of type %d", key, (unsigned long long)n,
                (int)want);
        return -EINVAL;
    }
    return 0;
}

static struct tok_str *str_views(const struct gguf_str *s, uint64_t n) {
    struct tok_str *v = mem_alloc(MEM_TOK, (size_t)n * sizeof(*v) + 1);
    if (v)
        for (uint64_t i = 0; i < n; i++)
            v[i] = (struct tok_str){s[i].ptr, (size_t)s[i].len};
    return v;
}

static int gguf_bool_opt(const struct gguf *g, const char *key, int *out, char *errbuf,
                         size_t errlen) {
    bool b;
    int rc = gguf_get_bool(g, key, &b);
    if (rc == -ENOENT)
        return 0;
    if (rc) {
        tok_err(errbuf, errlen, "%s: not a bool", key);
        return -EINVAL;
    }
    *out = b;
    return 0;
}

int tok_create(const struct gguf *g, struct tok **out, char *errbuf, size_t errlen) {
    return tok_create_pre(g, NULL, out, errbuf, errlen);
}

int tok_create_pre(const struct gguf *g, const char *pre_name, struct tok **out, char *errbuf,
                   size_t errlen) {
    struct tok_vocab v = {.bos = -1, .eos = -1, .unk = -1, .add_bos = -1};
    struct gguf_str model;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model)) {
        tok_err(errbuf, errlen, "tokenizer.ggml.model: missing or not a string");
        return -EINVAL;
    }
    if (gguf_str_eq(model, "llama")) {
        v.kind = TOK_SPM;
    } else if (gguf_str_eq(model, "gpt2")) {
        v.kind = TOK_BPE;
    } else {
        tok_err(errbuf, errlen, "tokenizer.ggml.model '%.*s' not supported", (int)model.len,
                model.ptr);
        return -ENOTSUP;
    }
    if (pre_name && v.kind != TOK_BPE) {
        tok_err(errbuf, errlen,
                "a pre-tokenizer was given ('%s'), but the vocabulary is SentencePiece "
                "(tokenizer.ggml.model 'llama'), which has none",
                pre_name);
        return -EINVAL;
    }
    if (pre_name && tok_pre_parse(pre_name, strlen(pre_name), &v.pre) < 0) {
        tok_err(errbuf, errlen, "unknown pre-tokenizer '%s' (gpt-2, llama-bpe, qwen2)", pre_name);
        return -EINVAL;
    }
    if (v.kind == TOK_BPE && pre_name) {
        struct gguf_str pre = {0};
        gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        LOG_WARN("tok", "tokenizer.ggml.pre '%.*s' overridden: splitting text as %s",
                 pre.len > 64 ? 64 : (int)pre.len, pre.ptr ? pre.ptr : "", tok_pre_name(v.pre));
    } else if (v.kind == TOK_BPE) {
        /* each family splits text its own way: a pre-tokenizer llmd does not
         * implement is refused rather than replaced by another */
        struct gguf_str pre;
        int rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (rc == -ENOENT) {
            LOG_WARN("tok", "tokenizer.ggml.pre missing: using the gpt-2 pre-tokenizer");
        } else if (rc) {
            tok_err(errbuf, errlen, "tokenizer.ggml.pre: not a string");
            return -EINVAL;
        } else if (tok_pre_parse(pre.ptr, pre.len, &v.pre) < 0) {
            tok_err(errbuf, errlen,
                    "tokenizer.ggml.pre '%.*s' is not a pre-tokenizer llmd implements (gpt-2, "
                    "llama-bpe, qwen2): the prompts would be split wrongly (if the family "
                    "splits text as one of those, say which with --tokenizer-pre)",
                    pre.len > 64 ? 64 : (int)pre.len, pre.ptr);
            return -ENOTSUP;
        }
    }

    const struct gguf_str *toks;
    uint64_t n;
    if (gguf_get_str_arr(g, "tokenizer.ggml.tokens", &n, &toks) || n == 0 || n > INT32_MAX) {
        tok_err(errbuf, errlen, "tokenizer.ggml.tokens: missing, empty or not strings");
        return -EINVAL;
    }
    v.n_tokens = (uint32_t)n;

    const void *scores_raw, *types_raw;
    const struct gguf_str *merges = NULL;
    uint64_t n_merges = 0;
    int rc = gguf_num_arr(g, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, GGUF_VT_FLOAT32, n,
                          &scores_raw, errbuf, errlen);
    rc = rc ? rc
            : gguf_num_arr(g, "tokenizer.ggml.token_type", GGUF_VT_INT32, GGUF_VT_UINT32, n,
                           &types_raw, errbuf, errlen);
    if (!rc && v.kind == TOK_BPE &&
        (gguf_get_str_arr(g, "tokenizer.ggml.merges", &n_merges, &merges) ||
         n_merges > INT32_MAX)) {
        tok_err(errbuf, errlen, "tokenizer.ggml.merges: missing or not strings");
        rc = -EINVAL;
    }
    /* llama.cpp's defaults when the keys are absent: 1/2/0 for SPM. */
    bool spm = v.kind == TOK_SPM;
    rc = rc ? rc
            : gguf_id(g, "tokenizer.ggml.bos_token_id", spm && n > 1 ? 1 : -1, &v.bos, errbuf,
                      errlen);
    rc = rc ? rc
            : gguf_id(g, "tokenizer.ggml.eos_token_id", spm && n > 2 ? 2 : -1, &v.eos, errbuf,
                      errlen);
    rc = rc ? rc
            : gguf_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, &v.unk, errbuf, errlen);
    int space_prefix = spm;
    rc = rc ? rc : gguf_bool_opt(g, "tokenizer.ggml.add_bos_token", &v.add_bos, errbuf, errlen);
    rc = rc ? rc
            : gguf_bool_opt(g, "tokenizer.ggml.add_space_prefix", &space_prefix, errbuf, errlen);
    if (rc)
        return rc;
    v.add_space_prefix = space_prefix;

    /* Numeric arrays in the mapping may be unaligned: copy them out. */
    struct tok_str *tv = str_views(toks, n);
    struct tok_str *mv = str_views(merges, n_merges);
    float *sc = scores_raw ? mem_alloc(MEM_TOK, n * sizeof(float)) : NULL;
    int32_t *ty = types_raw ? mem_alloc(MEM_TOK, n * sizeof(int32_t)) : NULL;
    if (!tv || !mv || (scores_raw && !sc) || (types_raw && !ty)) {
        tok_err(errbuf, errlen, "tokenizer: out of memory");
        rc = -ENOMEM;
        goto done;
    }
    if (sc)
        memcpy(sc, scores_raw, n * sizeof(float));
    if (ty)
        memcpy(ty, types_raw, n * sizeof(int32_t));
    v.tokens = tv;
    v.file = g;
    v.scores = sc;
    v.types = ty;
    v.merges = mv;
    v.n_merges = (uint32_t)n_merges;
    int32_t eot = -1, eom = -1; /* optional: end-of-generation tokens besides the EOS */
    rc = gguf_id(g, "tokenizer.ggml.eot_token_id", -1, &eot, errbuf, errlen);
    rc = rc ? rc : gguf_id(g, "tokenizer.ggml.eom_token_id", -1, &eom, errbuf, errlen);
    rc = rc ? rc : check_id(eot, v.n_tokens, "eot_token_id", errbuf, errlen);
    rc = rc ? rc : check_id(eom, v.n_tokens, "eom_token_id", errbuf, errlen);
    rc = rc ? rc : tok_create_vocab(&v, out, errbuf, errlen);
    if (rc == 0) {
        tok_eog_add(*out, eot);
        tok_eog_add(*out, eom);
    }
done:
    mem_free(ty);
    mem_free(sc);
    mem_free(mv);
    mem_free(tv);
    return rc;
}

/* ---- encoding --------------------------------------------------------- */

static int spm_encode(const struct tok *t, const char *text, size_t len, struct tok_out *o) {
    if (len == 0)
        return 0; /* no dummy prefix for empty text (llama.cpp) */
    char *buf = mem_alloc(MEM_TOK, 3 * len + 3);
    if (!buf)
        return -ENOMEM;
    size_t n = 0;
    if (t->add_space_prefix) {
        memcpy(buf, SPM_SPACE, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, SPM_SPACE, 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }
    struct tok_work w = {0};
    int rc = tok_work_merge(t, &w, buf, n);
    for (int32_t i = 0; !rc && i != -1; i = w.sym[i].next) {
        const struct tok_sym *s = &w.sym[i];
        int32_t id = tok_lookup(t, buf + s->off, s->n);
        if (id >= 0) {
            tok_out_push(o, id);
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++) {
            int32_t b = t->byte_tok[(uint8_t)buf[s->off + j]];
            if (b >= 0)
                tok_out_push(o, b);
        }
    }
    tok_work_fini(&w);
    mem_free(buf);
    return rc;
}

int tok_encode(const struct tok *t, const char *text, size_t len, bool add_bos, int32_t *ids,
               size_t cap, size_t *n_ids) {
    assert(t && (text || len == 0) && (ids || cap == 0) && n_ids);
    if (len > TOK_MAX_INPUT_BYTES)
        return -ENOMEM;
    struct tok_out o = {ids, cap, 0};
    if (add_bos && t->bos >= 0)
        tok_out_push(&o, t->bos);
    int rc = t->kind == TOK_SPM ? spm_encode(t, text, len, &o) : tok_bpe_encode(t, text, len, &o);
    if (rc)
        return rc;
    *n_ids = o.n;
    return o.n > cap ? -ENOSPC : 0;
}

int tok_piece(const struct tok *t, int32_t id, char *buf, size_t cap, size_t *n) {
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return -EINVAL;
    size_t len = t->piece_off[id + 1] - t->piece_off[id];
    memcpy(buf, t->pieces + t->piece_off[id], len < cap ? len : cap);
    *n = len;
    return len > cap ? -ENOSPC : 0;
}

/* ---- streaming -------------------------------------------------------- */

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

struct emit {
    char *out;
    size_t cap, n;
};

static void emit(struct emit *e, const void *p, size_t n) {
    if (e->n + n <= e->cap)
        memcpy(e->out + e->n, p, n);
    e->n += n;
}

void tok_stream_init(struct tok_stream *s) {
    memset(s, 0, sizeof(*s));
}

/* Byte k of pending ++ piece. */
static uint8_t byte_at(const uint8_t *a, size_t na, const uint8_t *b, size_t k) {
    return k < na ? a[k] : b[k - na];
}

/* Valid range of the second byte after lead c and the sequence length
 * (Unicode Table 3-7, well-formed UTF-8); 0 if c cannot start one. */
static size_t utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0)
            *lo = 0xA0;
        if (c == 0xED)
            *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0)
            *lo = 0x90;
        if (c == 0xF4)
            *hi = 0x8F;
        return 4;
    }
    return 0;
}

int tok_stream_push(const struct tok *t, struct tok_stream *s, int32_t id, char *out, size_t cap,
                    size_t *n_out) {
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return -EINVAL;
    const uint8_t *p = (const uint8_t *)t->pieces + t->piece_off[id];
    size_t np = s->n_pending, total = np + (t->piece_off[id + 1] - t->piece_off[id]);
    struct emit e = {out, cap, 0};
    size_t i = 0;
    while (i < total) {
        uint8_t c = byte_at(s->pending, np, p, i);
        uint8_t lo, hi;
        size_t need = c < 0x80 ? 1 : utf8_lead(c, &lo, &hi);
        if (need == 0) {
            emit(&e, REPLACEMENT, 3);
            i++;
            continue;
        }
        size_t j = 1;
        for (; j < need && i + j < total; j++) {
            uint8_t d = byte_at(s->pending, np, p, i + j);
            if (d < (j == 1 ? lo : 0x80) || d > (j == 1 ? hi : 0xBF))
                break;
        }
        if (j == need) {
            for (size_t k = 0; k < need; k++) {
                uint8_t d = byte_at(s->pending, np, p, i + k);
                emit(&e, &d, 1);
            }
            i += need;
        } else if (i + j == total) {
            break; /* a valid but incomplete tail: hold it back */
        } else {
            emit(&e, REPLACEMENT, 3); /* maximal subpart of a bad sequence */
            i += j;
        }
    }
    *n_out = e.n;
    if (e.n > cap)
        return -ENOSPC;
    uint8_t tail[4];
    size_t n_tail = total - i;
    assert(n_tail <= 3);
    for (size_t k = 0; k < n_tail; k++)
        tail[k] = byte_at(s->pending, np, p, i + k);
    memcpy(s->pending, tail, n_tail);
    s->n_pending = (uint32_t)n_tail;
    return 0;
}

int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *n_out) {
    *n_out = s->n_pending ? 3 : 0;
    if (!s->n_pending)
        return 0;
    if (cap < 3)
        return -ENOSPC;
    memcpy(out, REPLACEMENT, 3);
    s->n_pending = 0;
    return 0;
}

int tok_encode_alloc(const struct tok *t, const char *text, size_t len, bool add_bos, size_t extra,
                     int32_t **ids, size_t *n_ids) {
    size_t cap = len + 8, n = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (cap > SIZE_MAX / sizeof(int32_t) - extra)
            return -ENOMEM;
        int32_t *buf = mem_alloc(MEM_TOK, (cap + extra) * sizeof(int32_t));
        if (!buf)
            return -ENOMEM;
        int rc = tok_encode(t, text, len, add_bos, buf, cap, &n);
        if (rc == 0) {
            *ids = buf;
            *n_ids = n;
            return 0;
        }
        mem_free(buf);
        if (rc != -ENOSPC)
            return rc;
        cap = n; /* what tok_encode said it needs: the second try fits */
    }
    return -ENOMEM;
}
