/* The server's pure parts, without a socket: chat templates (detection,
 * rendering, special tokens as ids), request parsing corners, the keys
 * file and the metrics label escaping. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/serve/http_impl.h"
#include "engine/model/tok.h"
#include "mem.h"

static int collect(void *ctx, const char *text, size_t len, int sp) {
    struct http_buf *b = ctx;
    if (sp >= 0)
        http_buf_puts(b, "|"); /* mark the special tokens */
    http_buf_add(b, text, len);
    if (sp >= 0)
        http_buf_puts(b, "|");
    return 0;
}

static void render(enum http_tmpl t, const struct http_msg *m, uint32_t n, const char *want) {
    struct http_buf b = {0};
    cr_assert_eq(http_tmpl_render(t, m, n, collect, &b), 0);
    cr_assert_str_eq(b.p, want, "template %s: [%s]", http_tmpl_name(t), b.p);
    http_buf_free(&b);
}

static const struct http_msg conv[] = {
    {"system", "Be brief.", 9},
    {"user", "Hi", 2},
    {"assistant", "Hello!", 6},
    {"user", " How are you? ", 14},
};

Test(serve_chat, templates_are_detected_by_their_markers) {
    const char *chatml = "{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content}}"
                         "<|im_end|>\n{% endfor %}";
    const char *l3 = "{{ bos_token }}<|start_header_id|>{{ role }}<|end_header_id|>";
    const char *l2 = "{{ bos_token + '[INST] ' + content + ' [/INST]' }}";
    cr_assert_eq(http_tmpl_detect(chatml, strlen(chatml)), HTTP_TMPL_CHATML);
    cr_assert_eq(http_tmpl_detect(l3, strlen(l3)), HTTP_TMPL_LLAMA3);
    cr_assert_eq(http_tmpl_detect(l2, strlen(l2)), HTTP_TMPL_LLAMA2);
    cr_assert_eq(http_tmpl_detect("{{ messages }}", 14), HTTP_TMPL_PLAIN);
    cr_assert_eq(http_tmpl_detect(NULL, 0), HTTP_TMPL_PLAIN);
    enum http_tmpl t;
    cr_assert_eq(http_tmpl_from_name("llama3", &t), 0);
    cr_assert_eq(t, HTTP_TMPL_LLAMA3);
    cr_assert_eq(http_tmpl_from_name("jinja", &t), -EINVAL);
}

Test(serve_chat, each_family_renders_a_conversation) {
    render(HTTP_TMPL_PLAIN, conv, 4,
           "system: Be brief.\nuser: Hi\nassistant: Hello!\nuser:  How are you? \nassistant:");
    render(HTTP_TMPL_CHATML, conv, 4,
           "|<|im_start|>|system\nBe brief.|<|im_end|>|\n|<|im_start|>|user\nHi|<|im_end|>|\n"
           "|<|im_start|>|assistant\nHello!|<|im_end|>|\n|<|im_start|>|user\n How are you? "
           "|<|im_end|>|\n|<|im_start|>|assistant\n");
    render(HTTP_TMPL_LLAMA3, conv, 4,
           "|<|start_header_id|>|system|<|end_header_id|>|\n\nBe brief.|<|eot_id|>|"
           "|<|start_header_id|>|user|<|end_header_id|>|\n\nHi|<|eot_id|>|"
           "|<|start_header_id|>|assistant|<|end_header_id|>|\n\nHello!|<|eot_id|>|"
           "|<|start_header_id|>|user|<|end_header_id|>|\n\nHow are you?|<|eot_id|>|"
           "|<|start_header_id|>|assistant|<|end_header_id|>|\n\n");
    render(HTTP_TMPL_LLAMA2, conv, 4,
           "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! |</s>||<s>|"
           "[INST]  How are you?  [/INST]");
    /* corners: a system message alone; two user turns in a row */
    render(HTTP_TMPL_LLAMA2, conv, 1, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n [/INST]");
    const struct http_msg two[] = {{"user", "a", 1}, {"user", "b", 1}};
    render(HTTP_TMPL_LLAMA2, two, 2, "[INST] a [/INST][INST] b [/INST]");
}

/* A tiny SentencePiece-style vocabulary with chatml's markers as tokens. */
Test(serve_chat, special_markers_become_single_tokens) {
    static const char *const texts[] = {"<unk>",      "<s>",
                                        "</s>",       "<|im_start|>",
                                        "<|im_end|>", "\xe2\x96\x81",
                                        "a",          "b",
                                        "u",          "s",
                                        "e",          "r",
                                        "\n",         "i",
                                        "t",          "n",
                                        "o",          "m"};
    enum { NT = sizeof(texts) / sizeof(texts[0]) };
    struct tok_str ts[NT];
    int32_t types[NT];
    for (int i = 0; i < NT; i++) {
        ts[i] = (struct tok_str){texts[i], strlen(texts[i])};
        types[i] = i <= 4 ? TOK_TYPE_CONTROL : TOK_TYPE_NORMAL;
    }
    struct tok_vocab v = {.kind = TOK_SPM,
                          .n_tokens = NT,
                          .tokens = ts,
                          .types = types,
                          .bos = 1,
                          .eos = 2,
                          .unk = 0,
                          .add_bos = 1};
    struct http_model m = {.tmpl = HTTP_TMPL_CHATML};
    cr_assert_eq(tok_create_vocab(&v, &m.tok, NULL, 0), 0);
    for (int sp = 0; sp < HTTP_SP_N; sp++)
        m.special[sp] = -1;
    m.special[HTTP_SP_IM_START] = 3;
    m.special[HTTP_SP_IM_END] = 4;
    const struct http_msg msg[] = {{"user", "ab", 2}};
    char *text;
    size_t len;
    int32_t *ids;
    uint32_t n;
    cr_assert_eq(http_chat_prompt(&m, msg, 1, &text, &len, &ids, &n), 0);
    cr_assert_null(text);
    /* BOS, <|im_start|>, "user\nab", <|im_end|>, "\n", <|im_start|>, "assistant\n" */
    cr_assert_eq(ids[0], 1, "BOS first");
    cr_assert_eq(ids[1], 3);
    int n_start = 0, n_end = 0;
    for (uint32_t i = 0; i < n; i++) {
        n_start += ids[i] == 3;
        n_end += ids[i] == 4;
    }
    cr_assert_eq(n_start, 2);
    cr_assert_eq(n_end, 1);
    cr_assert_eq(ids[n - 1] == 3, false, "the assistant header follows the last marker");
    mem_free(ids);
    /* without a tokenizer the same prompt goes as text */
    struct tok *t = m.tok;
    m.tok = NULL;
    cr_assert_eq(http_chat_prompt(&m, msg, 1, &text, &len, &ids, &n), 0);
    cr_assert_null(ids);
    cr_assert_str_eq(text, "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n");
    mem_free(text);
    tok_destroy(t);
}

static int parse(bool chat, const char *body, struct http_gen *g, struct http_err *e) {
    static struct http_model m = {.name = "m", .n_ctx = 100};
    return http_gen_parse(&m, chat, body, strlen(body), g, e);
}

Test(serve_chat, parsing_defaults_and_nulls) {
    struct http_gen g;
    struct http_err e;
    cr_assert_eq(parse(false,
                       "{\"prompt\":\"x\",\"temperature\":null,\"stop\":null,"
                       "\"user\":\"u\",\"unknown_field\":{\"a\":1},\"n\":1}",
                       &g, &e),
                 0, "%s", e.message);
    cr_assert_eq(g.f.max_tokens, 16, "completions default to 16 tokens");
    cr_assert_float_eq(g.f.temperature, 1.0f, 1e-6);
    cr_assert_float_eq(g.f.top_p, 1.0f, 1e-6);
    cr_assert_eq(g.f.n_stop, 0);
    cr_assert_eq(g.stream, false);
    http_gen_free(&g);
    cr_assert_eq(parse(true,
                       "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
                       "{\"role\":\"user\",\"content\":\"u\"},"
                       "{\"role\":\"assistant\",\"content\":null}],"
                       "\"max_tokens\":5,\"max_completion_tokens\":7,\"top_k\":-1,\"seed\":-1,"
                       "\"priority\":-3,\"stop\":[\"a\",\"b\"],\"tool_choice\":\"none\","
                       "\"response_format\":{\"type\":\"text\"},\"logprobs\":false}",
                       &g, &e),
                 0, "%s", e.message);
    cr_assert_eq(g.f.max_tokens, 7, "max_completion_tokens wins");
    cr_assert_eq(g.f.top_k, 0);
    cr_assert_eq(g.f.seed, UINT64_MAX);
    cr_assert_eq(g.f.priority, -3);
    cr_assert_eq(g.f.n_stop, 2);
    cr_assert_str_eq(g.f.prompt, "system: d\nuser: u\nassistant: \nassistant:");
    http_gen_free(&g);
    /* max_tokens is checked against the context */
    cr_assert_eq(parse(false, "{\"prompt\":\"x\",\"max_tokens\":101}", &g, &e), -EINVAL);
    cr_assert_str_eq(e.param, "max_tokens");
    cr_assert_eq(parse(false, "{\"prompt\":\"x\",\"max_tokens\":100}", &g, &e), 0);
    http_gen_free(&g);
}

Test(serve_chat, cache_salt_namespace_starts_with_the_tenant) {
    struct http_gen g;
    struct http_err e;
    cr_assert_eq(parse(false, "{\"prompt\":\"x\",\"cache_salt\":\"s\"}", &g, &e), 0);
    struct llmd_request q;
    cr_assert_eq(http_gen_request(&g, 0x01020304, &q), 0);
    cr_assert_eq(q.tenant, 0x01020304);
    cr_assert_eq(q.cache_ns_len, 4 + 12 + 1);
    const uint8_t *ns = q.cache_ns;
    cr_assert(ns[0] == 4 && ns[1] == 3 && ns[2] == 2 && ns[3] == 1, "tenant little-endian");
    cr_assert_eq(memcmp(ns + 4, "\0cache_salt:s", 13), 0);
    http_gen_free(&g);
    cr_assert_eq(parse(false, "{\"prompt\":\"x\"}", &g, &e), 0);
    cr_assert_eq(http_gen_request(&g, 7, &q), 0);
    cr_assert_null(q.cache_ns, "no salt: the engine's tenant namespace");
    http_gen_free(&g);
}

Test(serve_chat, parse_failures_leak_nothing) {
    uint64_t before = mem_bytes(MEM_HTTP);
    static const char *const bodies[] = {
        "{\"prompt\":\"x\",\"stop\":[\"a\",\"\"]}", "{\"prompt\":[1,2,-5]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\"}]}",
        "{\"prompt\":\"x\",\"cache_salt\":\"s\",\"stop\":7}"};
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        struct http_gen g;
        struct http_err e;
        cr_assert_eq(parse(strstr(bodies[i], "messages") != NULL, bodies[i], &g, &e), -EINVAL);
        cr_assert_eq(e.status, 400);
    }
    cr_assert_eq(mem_bytes(MEM_HTTP), before);
    /* and under allocation failures: every one is a clean -ENOMEM or success */
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
                       "\"content\":[{\"type\":\"text\",\"text\":\"u\"}]}],\"stop\":[\"a\",\"b\"],"
                       "\"cache_salt\":\"c\"}";
    for (uint64_t nth = 1; nth < 40; nth++) {
        struct http_gen g;
        struct http_err e;
        mem_fail_nth(nth);
        int rc = parse(true, body, &g, &e);
        mem_fail_nth(0);
        cr_assert(rc == 0 || rc == -ENOMEM, "nth %lu: %d", (unsigned long)nth, rc);
        if (rc == 0) {
            struct llmd_request q;
            http_gen_request(&g, 1, &q);
            http_gen_free(&g);
        } else {
            cr_assert_eq(e.status, 500);
        }
        cr_assert_eq(mem_bytes(MEM_HTTP), before, "nth %lu leaked", (unsigned long)nth);
    }
}

static const char *write_file(const char *text) {
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/llmd-keys-unit-%d.txt", getpid());
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    chmod(path, 0600);
    return path;
}

Test(serve_chat, keys_file_lookup) {
    const char *path = write_file("k1 acme weight=3\nk2 globex\n  k3\tacme  retention_pages=7 \n");
    struct http_keys *k;
    char err[256];
    cr_assert_eq(http_keys_load(path, &k, err, sizeof(err)), 0, "%s", err);
    unlink(path);
    uint32_t t = 99;
    cr_assert_eq(http_keys_lookup(k, "Bearer k1", &t), 0);
    cr_assert_eq(t, 1);
    cr_assert_eq(http_keys_lookup(k, "Bearer k2", &t), 0);
    cr_assert_eq(t, 2);
    cr_assert_eq(http_keys_lookup(k, "Bearer k3", &t), 0);
    cr_assert_eq(t, 1, "k3 is acme's");
    cr_assert_eq(http_keys_lookup(k, "Bearer  k1 ", &t), 0, "blanks around the key");
    cr_assert_eq(http_keys_lookup(k, "Bearer k4", &t), -EACCES);
    cr_assert_eq(http_keys_lookup(k, "k1", &t), -EACCES);
    cr_assert_eq(http_keys_lookup(k, NULL, &t), -EACCES);
    cr_assert_eq(http_keys_lookup(k, "Bearer ", &t), -EACCES);
    http_keys_destroy(k);
    path = write_file("k1 acme\nk2 acme weight=x\n");
    cr_assert_eq(http_keys_load(path, &k, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "line 2"), "%s", err);
    unlink(path);
}

Test(serve_chat, metrics_escape_label_values) {
    struct serve_metrics m = {0};
    m.engine.kv_pages_total = 4;
    m.engine.kv_pages_free = 1;
    m.engine.kv_pages_cached = 1;
    uint64_t resp[HTTP_N_CODES] = {0};
    struct llmd_engine_info in = {0};
    struct http_buf b = {0};
    http_metrics_format(&b, &m, &in, "we\"ird\\na\nme", resp, false);
    cr_assert(strstr(b.p, "vllm:num_requests_running{model_name=\"we\\\"ird\\\\na\\nme\"} 0\n"),
              "%s", b.p);
    cr_assert(strstr(b.p, "\nvllm:gpu_cache_usage_perc{model_name=\"we\\\"ird\\\\na\\nme\"} "
                          "0.500000\n"));
    cr_assert(strstr(b.p, "\nllmd_kv_pages{state=\"used\"} 2\n"));
    http_buf_free(&b);
    http_metrics_format(&b, &m, &in, "m", resp, true);
    cr_assert_null(strstr(b.p, "vllm:"), "--no-vllm-metrics");
    cr_assert(strstr(b.p, "\nllmd_kv_pages{state=\"used\"} 2\n"));
    http_buf_free(&b);
}
