/* llmd vocab - a vocabulary-only GGUF from a Hugging Face tokenizer.json
 * (and its tokenizer_config.json), with the keys llama.cpp's converter
 * (convert_hf_to_gguf.py, "gpt2" vocabularies) writes for byte-level BPE
 * families: so that llmd's tokenizer can be checked against the model's
 * own tokenizer files (tests/test_tok_oracle.c) and `llmd tokenize` can
 * read any family's vocabulary without its weights.
 *
 * What it writes: general.architecture ("llama", or "qwen2" for the qwen2
 * pre-tokenizer), tokenizer.ggml.model "gpt2", tokenizer.ggml.pre (--pre,
 * else the name of the pre-tokenizer whose Split regex the file's is, to
 * the byte), tokens (model.vocab and added_tokens by id; an id neither
 * names becomes "[PADn]", type unused), token_type (normal; an added token
 * control when "special", else user-defined), merges ("a b", from strings
 * or pairs), bos/eos from the config's bos_token/eos_token, eot_token_id
 * and eom_token_id where the vocabulary has Llama 3's <|eot_id|> and
 * <|eom_id|> or ChatML's <|im_end|>, add_bos_token (the config's, else
 * whether the post-processor's template starts with the BOS), and the
 * chat_template. Only BPE models with byte-level pre-tokenization are
 * taken; anything else is refused saying what it is. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/gguf_write.h"
#include "engine/model/tok.h"
#include "llmd_cli.h"
#include "mem.h"

static void vocab_usage(FILE *f) {
    fprintf(f, "usage: llmd vocab -i tokenizer.json [-c tokenizer_config.json] [--pre NAME]\n"
               "                  -o FILE.gguf\n"
               "\n"
               "Writes a vocabulary-only GGUF (no tensors) from a Hugging Face byte-level BPE\n"
               "tokenizer, as llama.cpp's converter writes it; `llmd tokenize -m FILE.gguf`\n"
               "reads it.\n"
               "  -i, --tokenizer FILE  the tokenizer.json\n"
               "  -c, --config FILE     its tokenizer_config.json (BOS, EOS, add_bos_token,\n"
               "                        chat_template; without it: none of those)\n"
               "      --pre NAME        gpt-2, llama-bpe or qwen2 (default: the one whose\n"
               "                        Split regex the tokenizer's is)\n"
               "  -o, --output FILE     where to write the GGUF\n");
}

struct vocab {
    uint32_t n;
    const char **text; /* [n] borrowed from the JSON, or pad[] */
    size_t *len;
    int32_t *type;
    char (*pad)[24]; /* [n] "[PADn]" for ids nothing names */
};

static int vocab_err(const char *fmt, const char *what) {
    fprintf(stderr, "llmd vocab: ");
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    return CLI_ERR;
}

/* The Split regex of the pre-tokenizer, or NULL. A bare ByteLevel with
 * use_regex is GPT-2's own split: *gpt2 = true. */
static const char *vocab_split_regex(json_t *pre, bool *gpt2) {
    *gpt2 = false;
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (!type)
        return NULL;
    if (strcmp(type, "ByteLevel") == 0) {
        *gpt2 = json_is_true(json_object_get(pre, "use_regex"));
        return NULL;
    }
    if (strcmp(type, "Split") == 0)
        return json_string_value(json_object_get(json_object_get(pre, "pattern"), "Regex"));
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pre, "pretokenizers"), i, p) {
            const char *r = vocab_split_regex(p, gpt2);
            if (r || *gpt2)
                return r;
        }
    }
    return NULL;
}

/* A config token: "text" or {"content": "text"}; NULL if absent. */
static const char *vocab_cfg_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    return json_is_string(v) ? json_string_value(v)
                             : json_string_value(json_object_get(v, "content"));
}

static int32_t vocab_find(const struct vocab *v, const char *s) {
    size_t n = s ? strlen(s) : 0;
    for (uint32_t i = 0; s && i < v->n; i++)
        if (v->len[i] == n && memcmp(v->text[i], s, n) == 0)
            return (int32_t)i;
    return -1;
}

/* The model.vocab and added_tokens of tj (a BPE model: cli_vocab checked)
 * into v. Returns 0 or CLI_ERR (after the message). */
static int vocab_tokens(json_t *tj, struct vocab *v) {
    json_t *model = json_object_get(tj, "model"), *voc = json_object_get(model, "vocab");
    json_t *added = json_object_get(tj, "added_tokens");
    if (!json_is_object(voc) || json_object_size(voc) == 0)
        return vocab_err("%s: no model.vocab object", "tokenizer.json");
    json_int_t max = -1;
    const char *key;
    json_t *val;
    size_t i;
    json_object_foreach(voc, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= INT32_MAX)
            return vocab_err("model.vocab['%s'] is not a token id", key);
        if (json_integer_value(val) > max)
            max = json_integer_value(val);
    }
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX || !json_is_string(json_object_get(val, "content")))
            return vocab_err("%s: an added token without an id or content", "tokenizer.json");
        if (json_integer_value(id) > max)
            max = json_integer_value(id);
    }
    /* ids are dense but for padding: one far past the entries would make a
     * table of gigabytes of "[PADn]" (a broken or hostile file) */
    size_t n_entries = json_object_size(voc) + json_array_size(added);
    if ((uint64_t)max >= (uint64_t)n_entries * 2 + 4096) {
        fprintf(stderr,
                "llmd vocab: token id %lld is far past the file's %zu tokens: not a vocabulary "
                "llmd takes\n",
                (long long)max, n_entries);
        return CLI_ERR;
    }
    v->n = (uint32_t)max + 1;
    v->text = mem_calloc(MEM_CLI, v->n, sizeof(*v->text));
    v->len = mem_calloc(MEM_CLI, v->n, sizeof(*v->len));
    v->type = mem_calloc(MEM_CLI, v->n, sizeof(*v->type));
    v->pad = mem_calloc(MEM_CLI, v->n, sizeof(*v->pad));
    if (!v->text || !v->len || !v->type || !v->pad)
        return vocab_err("%s", "out of memory");
    json_object_foreach(voc, key, val) {
        uint32_t id = (uint32_t)json_integer_value(val);
        if (v->text[id]) {
            fprintf(stderr, "llmd vocab: model.vocab gives id %u to both '%s' and '%s'\n", id,
                    v->text[id], key);
            return CLI_ERR;
        }
        v->text[id] = key;
        v->len[id] = strlen(key);
        v->type[id] = TOK_TYPE_NORMAL;
    }
    json_array_foreach(added, i, val) {
        uint32_t id = (uint32_t)json_integer_value(json_object_get(val, "id"));
        json_t *c = json_object_get(val, "content");
        v->text[id] = json_string_value(c);
        v->len[id] = json_string_length(c);
        v->type[id] = json_is_true(json_object_get(val, "special")) ? TOK_TYPE_CONTROL
                                                                    : TOK_TYPE_USER_DEFINED;
    }
    for (uint32_t k = 0; k < v->n; k++)
        if (!v->text[k]) {
            snprintf(v->pad[k], sizeof(v->pad[k]), "[PAD%u]", k);
            v->text[k] = v->pad[k];
            v->len[k] = strlen(v->pad[k]);
            v->type[k] = TOK_TYPE_UNUSED;
        }
    return 0;
}

/* model.merges as "a b" strings (written as strings or as pairs) into *out
 * (caller frees each and the array). Returns 0 or CLI_ERR. */
static int vocab_merges(json_t *tj, char ***out, uint64_t *n_out) {
    json_t *m = json_object_get(json_object_get(tj, "model"), "merges");
    size_t n = json_array_size(m), i;
    char **v = mem_calloc(MEM_CLI, n ? n : 1, sizeof(*v));
    if (!v)
        return vocab_err("%s", "out of memory");
    *out = v;
    *n_out = n;
    json_t *x;
    json_array_foreach(m, i, x) {
        const char *a = json_string_value(x), *b = NULL;
        if (!a && json_array_size(x) == 2) {
            a = json_string_value(json_array_get(x, 0));
            b = json_string_value(json_array_get(x, 1));
        }
        if (!a || (!b && json_is_array(x)))
            return vocab_err("%s: a merge that is neither \"a b\" nor [a, b]", "model.merges");
        size_t len = strlen(a) + (b ? strlen(b) + 1 : 0) + 1;
        if (!(v[i] = mem_alloc(MEM_CLI, len)))
            return vocab_err("%s", "out of memory");
        snprintf(v[i], len, b ? "%s %s" : "%s", a, b ? b : "");
    }
    return 0;
}

/* Whether the post-processor's single-sequence template starts with bos. */
static bool vocab_post_bos(json_t *tj, const char *bos) {
    json_t *pp = json_object_get(tj, "post_processor");
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pp, "processors"), i, p) {
            const char *t = json_string_value(json_object_get(p, "type"));
            if (t && strcmp(t, "TemplateProcessing") == 0)
                pp = p;
        }
    }
    json_t *first = json_array_get(json_object_get(pp, "single"), 0);
    const char *id =
        json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
    return bos && id && strcmp(id, bos) == 0;
}

static int vocab_write(const char *path, const struct vocab *v, char **merges, uint64_t n_merges,
                       enum tok_pre pre, json_t *cfg, bool add_bos) {
    struct gguf_writer *w;
    if (gguf_writer_create(&w) < 0)
        return vocab_err("%s", "out of memory");
    int rc =
        gguf_writer_set_str(w, "general.architecture", pre == TOK_PRE_QWEN2 ? "qwen2" : "llama");
    rc = rc ? rc : gguf_writer_set_str(w, "general.name", "vocab");
    rc = rc ? rc : gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    rc = rc ? rc : gguf_writer_set_str(w, "tokenizer.ggml.pre", tok_pre_name(pre));
    rc = rc ? rc : gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->text, v->len, v->n);
    rc =
        rc ? rc : gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->type, v->n);
    rc = rc ? rc
            : gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, NULL,
                                      n_merges);
    const char *ids[][2] = {{"tokenizer.ggml.bos_token_id", vocab_cfg_token(cfg, "bos_token")},
                            {"tokenizer.ggml.eos_token_id", vocab_cfg_token(cfg, "eos_token")}};
    for (size_t i = 0; rc == 0 && i < 2; i++) {
        int32_t id = vocab_find(v, ids[i][1]);
        if (id >= 0)
            rc = gguf_writer_set_u32(w, ids[i][0], (uint32_t)id);
    }
    int32_t eot = vocab_find(v, "<|eot_id|>");
    if (eot < 0)
        eot = vocab_find(v, "<|im_end|>");
    int32_t eom = vocab_find(v, "<|eom_id|>");
    if (rc == 0 && eot >= 0)
        rc = gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
    if (rc == 0 && eom >= 0)
        rc = gguf_writer_set_u32(w, "tokenizer.ggml.eom_token_id", (uint32_t)eom);
    rc = rc ? rc : gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    const char *tmpl = json_string_value(json_object_get(cfg, "chat_template"));
    if (rc == 0 && tmpl)
        rc = gguf_writer_set_str(w, "tokenizer.chat_template", tmpl);
    if (rc == 0 && (rc = gguf_writer_write_file(w, path)) < 0) {
        fprintf(stderr, "llmd vocab: cannot write %s: %s\n", path, strerror(-rc));
        gguf_writer_destroy(w);
        return CLI_ERR;
    }
    gguf_writer_destroy(w);
    return rc ? vocab_err("%s", "out of memory") : CLI_OK;
}

int cli_vocab(int argc, char **argv) {
    static const struct option opts[] = {
        {"tokenizer", required_argument, 0, 'i'},
        {"config", required_argument, 0, 'c'},
        {"pre", required_argument, 0, 'P'},
        {"output", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *in = NULL, *cfg_path = NULL, *pre_name = NULL, *out = NULL;
    int c, li = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "i:c:o:h", opts, &li)) != -1) {
        switch (c) {
        case 'i':
            in = optarg;
            break;
        case 'c':
            cfg_path = optarg;
            break;
        case 'P':
            pre_name = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'h':
            vocab_usage(stdout);
            return CLI_OK;
        default:
            vocab_usage(stderr);
            return CLI_USAGE;
        }
    }
    enum tok_pre pre = TOK_PRE_GPT2;
    if (pre_name && tok_pre_parse(pre_name, strlen(pre_name), &pre) < 0) {
        cli_bad_value("llmd vocab", opts, 'P', -1, pre_name, "gpt-2, llama-bpe or qwen2");
        return CLI_USAGE;
    }
    if (optind != argc) {
        fprintf(stderr, "llmd vocab: unexpected argument '%s'\n", argv[optind]);
        return CLI_USAGE;
    }
    if (!in || !out) {
        fprintf(stderr, "llmd vocab: --tokenizer and --output are required\n");
        vocab_usage(stderr);
        return CLI_USAGE;
    }
    json_error_t je;
    json_t *tj = json_load_file(in, JSON_REJECT_DUPLICATES, &je), *cfg = NULL;
    if (!tj) {
        if (je.line < 0) /* not read at all: jansson's text names the file */
            fprintf(stderr, "llmd vocab: %s\n", je.text);
        else
            fprintf(stderr, "llmd vocab: %s: not a tokenizer.json llmd can read: %s (line %d)\n",
                    in, je.text, je.line);
        return CLI_ERR;
    }
    if (!json_is_object(json_object_get(tj, "model"))) {
        fprintf(stderr,
                "llmd vocab: %s has no \"model\" object: not a tokenizer.json (-i takes the "
                "tokenizer.json, -c its tokenizer_config.json)\n",
                in);
        json_decref(tj);
        return CLI_ERR;
    }
    /* reals for integers: model_max_length may be 1e30, past any integer */
    if (cfg_path && !(cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je))) {
        if (je.line < 0)
            fprintf(stderr, "llmd vocab: %s\n", je.text);
        else
            fprintf(stderr, "llmd vocab: %s: %s (line %d)\n", cfg_path, je.text, je.line);
        json_decref(tj);
        return CLI_ERR;
    }
    int rc = CLI_OK;
    const char *mt = json_string_value(json_object_get(json_object_get(tj, "model"), "type"));
    if (!mt || strcmp(mt, "BPE") != 0) /* before the split: its regex is beside the point */
        rc = vocab_err("model.type is '%s': only BPE tokenizers are taken", mt ? mt : "none");
    if (rc == CLI_OK && !pre_name) { /* the split, to the byte: a near miss is another tokenizer */
        bool gpt2;
        const char *re = vocab_split_regex(json_object_get(tj, "pre_tokenizer"), &gpt2);
        bool found = gpt2;
        for (int p = 0; re && !found && p < TOK_PRE_N; p++)
            if (strcmp(re, tok_pre_pattern((enum tok_pre)p)) == 0) {
                pre = (enum tok_pre)p;
                found = true;
            }
        if (!found) {
            fprintf(stderr,
                    "llmd vocab: %s: its pre-tokenizer %s%s%s is not one llmd implements "
                    "(gpt-2, llama-bpe, qwen2); --pre NAME overrides, if you know it is one\n",
                    in, re ? "regex '" : "(no Split regex)", re ? re : "", re ? "'" : "");
            rc = CLI_ERR;
        }
    }
    struct vocab v = {0};
    char **merges = NULL;
    uint64_t n_merges = 0;
    if (rc == CLI_OK)
        rc = vocab_tokens(tj, &v);
    if (rc == CLI_OK)
        rc = vocab_merges(tj, &merges, &n_merges);
    if (rc == CLI_OK) {
        json_t *ab = json_object_get(cfg, "add_bos_token");
        bool add_bos = json_is_boolean(ab) ? json_is_true(ab)
                                           : vocab_post_bos(tj, vocab_cfg_token(cfg, "bos_token"));
        rc = vocab_write(out, &v, merges, n_merges, pre, cfg, add_bos);
    }
    if (rc == CLI_OK)
        fprintf(stderr, "llmd vocab: wrote %u tokens, %llu merges (pre-tokenizer %s) to %s\n", v.n,
                (unsigned long long)n_merges, tok_pre_name(pre), out);
    for (uint64_t i = 0; merges && i < n_merges; i++)
        mem_free(merges[i]);
    mem_free(merges);
    mem_free(v.text);
    mem_free(v.len);
    mem_free(v.type);
    mem_free(v.pad);
    json_decref(cfg);
    json_decref(tj);
    return rc;
}
