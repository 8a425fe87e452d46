/* `llmd serve` end to end over loopback: completions and chat, streamed and
 * not, against the engine run directly (greedy output is the oracle);
 * usage, finish reasons, stop strings, /v1/models, /health, /metrics. */
#include <math.h>
#include <regex.h>

#include "tests/lib/http_util.h"

#define ONCE_JSON "\"Once upon a time\""

struct acc {
    char *out;
    size_t cap, len;
};

static void on_tok(void *u, uint64_t id, int32_t t, const char *s, size_t len, enum llmd_finish f) {
    (void)id, (void)t, (void)f;
    struct acc *a = u;
    cr_assert_lt(a->len + len, a->cap);
    memcpy(a->out + a->len, s, len);
    a->len += len;
}

/* The engine alone, greedy: the text of `prompt` for n tokens. */
static void engine_text(const char *prompt, uint32_t n, char *out, size_t cap) {
    struct llmd_engine_config ec = ht_engine_config();
    struct llmd_engine *e;
    char err[256];
    cr_assert_eq(llmd_engine_open(&ec, &e, err, sizeof(err)), 0, "%s", err);
    struct acc a = {out, cap, 0};
    struct llmd_request r = {.prompt = prompt,
                             .prompt_len = strlen(prompt),
                             .max_tokens = n,
                             .on_token = on_tok,
                             .user = &a};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    out[a.len] = '\0';
    llmd_engine_close(e);
}

static json_t *post_json(struct ht_server *t, const char *path, const char *body) {
    struct ht_resp r;
    ht_post(t->port, path, body, &r);
    cr_assert_eq(r.status, 200, "%s -> %d: %s", body, r.status, r.body);
    char ct[128];
    cr_assert_not_null(ht_header(&r, "Content-Type", ct, sizeof(ct)));
    cr_assert_str_eq(ct, "application/json");
    json_t *j = ht_json(&r);
    ht_free(&r);
    return j;
}

static int64_t usage(json_t *j, const char *k) {
    json_t *u = json_object_get(j, "usage");
    cr_assert(json_is_object(u), "no usage");
    if (strcmp(k, "cached_tokens") == 0)
        u = json_object_get(u, "prompt_tokens_details");
    cr_assert(json_is_integer(json_object_get(u, k)), "usage.%s", k);
    return json_integer_value(json_object_get(u, k));
}

static const char *choice_str(json_t *j, const char *k) {
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    if (strcmp(k, "content") == 0)
        c = json_object_get(c, "message");
    return json_string_value(json_object_get(c, k));
}

/* A streamed request: the concatenated text (completion text or chat
 * delta content), the last finish_reason, and the usage chunk if any. */
struct streamed {
    char text[8192];
    char finish[32];
    json_t *usage; /* caller decrefs */
    int n_events;
};

static void post_stream(struct ht_server *t, const char *path, const char *body,
                        struct streamed *s) {
    struct ht_resp r;
    ht_post(t->port, path, body, &r);
    cr_assert_eq(r.status, 200, "%d: %s", r.status, r.body);
    char ct[128];
    cr_assert_str_eq(ht_header(&r, "Content-Type", ct, sizeof(ct)), "text/event-stream");
    static json_t *ev[2048];
    bool done;
    size_t n = ht_sse(r.body, ev, 2048, &done);
    cr_assert(done, "no [DONE]: %s", r.body);
    memset(s, 0, sizeof(*s));
    s->n_events = (int)n;
    bool chat = strstr(path, "chat") != NULL;
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(json_string_value(json_object_get(ev[i], "object")),
                         chat ? "chat.completion.chunk" : "text_completion");
        json_t *ch = json_array_get(json_object_get(ev[i], "choices"), 0);
        if (!ch) { /* the usage chunk: choices [] */
            cr_assert_eq(i, n - 1, "usage chunk not last");
            s->usage = json_incref(json_object_get(ev[i], "usage"));
            continue;
        }
        json_t *txt = chat ? json_object_get(json_object_get(ch, "delta"), "content")
                           : json_object_get(ch, "text");
        if (chat && i == 0)
            cr_assert_str_eq(
                json_string_value(json_object_get(json_object_get(ch, "delta"), "role")),
                "assistant");
        if (json_is_string(txt))
            strcat(s->text, json_string_value(txt));
        json_t *f = json_object_get(ch, "finish_reason");
        if (json_is_string(f)) {
            cr_assert_eq(s->finish[0], '\0', "two finish reasons");
            snprintf(s->finish, sizeof(s->finish), "%s", json_string_value(f));
        }
    }
    for (size_t i = 0; i < n; i++)
        json_decref(ev[i]);
    ht_free(&r);
}

Test(serve_api, greedy_completion_equals_the_engine_alone, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    json_t *j = post_json(&t, "/v1/completions",
                          "{\"model\":\"" HT_NAME "\",\"prompt\":" ONCE_JSON
                          ",\"max_tokens\":32,\"temperature\":0}");
    char want[4096];
    engine_text("Once upon a time", 32, want, sizeof(want));
    cr_assert_str_eq(choice_str(j, "text"), want);
    /* llama2.c's reference continuation */
    cr_assert(strncmp(want, ", there was a little girl named Lily.", 37) == 0, "%s", want);
    cr_assert_str_eq(choice_str(j, "finish_reason"), "length");
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "text_completion");
    cr_assert_str_eq(json_string_value(json_object_get(j, "model")), HT_NAME);
    cr_assert(strncmp(json_string_value(json_object_get(j, "id")), "cmpl-", 5) == 0);
    cr_assert(json_is_integer(json_object_get(j, "created")));
    /* BOS + 4 tokens ("Once upon a time" in the stories vocabulary) */
    cr_assert_eq(usage(j, "prompt_tokens"), 5);
    cr_assert_eq(usage(j, "completion_tokens"), 32);
    cr_assert_eq(usage(j, "total_tokens"), 37);
    cr_assert_eq(usage(j, "cached_tokens"), 0);
    json_decref(j);
    ht_stop(&t);
}

Test(serve_api, streamed_text_equals_the_whole_answer, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    static const char *const params[] = {
        "\"temperature\":0,\"max_tokens\":40",
        "\"temperature\":0.9,\"seed\":42,\"max_tokens\":40",
        "\"temperature\":0.7,\"top_p\":0.9,\"seed\":7,\"max_tokens\":25,\"stop\":[\"\\n\"]",
    };
    for (size_t i = 0; i < sizeof(params) / sizeof(params[0]); i++) {
        char body[512];
        snprintf(body, sizeof(body), "{\"prompt\":" ONCE_JSON ",%s}", params[i]);
        json_t *j = post_json(&t, "/v1/completions", body);
        snprintf(body, sizeof(body),
                 "{\"prompt\":" ONCE_JSON
                 ",%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                 params[i]);
        struct streamed s;
        post_stream(&t, "/v1/completions", body, &s);
        cr_assert_str_eq(s.text, choice_str(j, "text"), "params %s", params[i]);
        cr_assert_str_eq(s.finish, choice_str(j, "finish_reason"));
        cr_assert_not_null(s.usage, "include_usage asked for a usage chunk");
        cr_assert_eq(json_integer_value(json_object_get(s.usage, "completion_tokens")),
                     usage(j, "completion_tokens"));
        cr_assert_eq(json_integer_value(json_object_get(s.usage, "prompt_tokens")),
                     usage(j, "prompt_tokens"));
        cr_assert_gt(s.n_events, 2);
        json_decref(s.usage);
        json_decref(j);
    }
    ht_stop(&t);
}

Test(serve_api, chat_is_the_plain_template_as_a_completion, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    const char *msgs =
        "\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Once upon \"},"
        "{\"type\":\"text\",\"text\":\"a time\"}]}]";
    char body[1024];
    snprintf(body, sizeof(body), "{%s,\"max_completion_tokens\":30,\"temperature\":0}", msgs);
    json_t *chat = post_json(&t, "/v1/chat/completions", body);
    cr_assert_str_eq(json_string_value(json_object_get(chat, "object")), "chat.completion");
    cr_assert(strncmp(json_string_value(json_object_get(chat, "id")), "chatcmpl-", 9) == 0);
    json_t *msg = json_object_get(json_array_get(json_object_get(chat, "choices"), 0), "message");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "role")), "assistant");
    /* stories260K has no chat template: "role: content\n" lines, then "assistant:" */
    json_t *comp = post_json(&t, "/v1/completions",
                             "{\"prompt\":\"system: Tell a story.\\nuser: Once upon a "
                             "time\\nassistant:\",\"max_tokens\":30,\"temperature\":0}");
    cr_assert_str_eq(choice_str(chat, "content"), choice_str(comp, "text"));
    cr_assert_eq(usage(chat, "prompt_tokens"), usage(comp, "prompt_tokens"));
    cr_assert_eq(usage(chat, "completion_tokens"), 30);

    snprintf(body, sizeof(body), "{%s,\"max_tokens\":30,\"temperature\":0,\"stream\":true}", msgs);
    struct streamed s;
    post_stream(&t, "/v1/chat/completions", body, &s);
    cr_assert_str_eq(s.text, choice_str(chat, "content"));
    cr_assert_str_eq(s.finish, "length");
    cr_assert_null(s.usage, "no include_usage, no usage chunk");
    json_decref(chat);
    json_decref(comp);
    ht_stop(&t);
}

Test(serve_api, stop_strings_finish_with_stop, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    json_t *j = post_json(&t, "/v1/completions",
                          "{\"prompt\":" ONCE_JSON ",\"max_tokens\":64,\"temperature\":0,"
                          "\"stop\":\" Lily\"}");
    cr_assert_str_eq(choice_str(j, "text"), ", there was a little girl named");
    cr_assert_str_eq(choice_str(j, "finish_reason"), "stop");
    json_decref(j);
    struct streamed s;
    post_stream(&t, "/v1/completions",
                "{\"prompt\":" ONCE_JSON ",\"max_tokens\":64,\"temperature\":0,"
                "\"stop\":[\"zzz\",\" Lily\"],\"stream\":true}",
                &s);
    cr_assert_str_eq(s.text, ", there was a little girl named");
    cr_assert_str_eq(s.finish, "stop");
    ht_stop(&t);
}

Test(serve_api, chat_without_max_tokens_runs_to_the_context, .timeout = 60) {
    struct llmd_engine_config ec = ht_engine_config();
    ec.n_ctx = 64;
    struct ht_server t;
    ht_start(&t, &ec, NULL);
    json_t *j = post_json(&t, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                          "\"temperature\":0}");
    cr_assert_str_eq(choice_str(j, "finish_reason"), "length");
    cr_assert_eq(usage(j, "prompt_tokens") + usage(j, "completion_tokens"), 64);
    json_decref(j);
    /* completions default to 16 tokens, as OpenAI's */
    j = post_json(&t, "/v1/completions", "{\"prompt\":\"Hi\"}");
    cr_assert_eq(usage(j, "completion_tokens"), 16);
    json_decref(j);
    ht_stop(&t);
}

Test(serve_api, token_id_prompts, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    /* BOS and "Once upon a time" as ids: the same as the text */
    json_t *a = post_json(&t, "/v1/completions",
                          "{\"prompt\":[1,403,407,261,378],\"max_tokens\":8,\"temperature\":0}");
    json_t *b = post_json(&t, "/v1/completions",
                          "{\"prompt\":[[1,403,407,261,378]],\"max_tokens\":8,\"temperature\":0}");
    json_t *c = post_json(&t, "/v1/completions",
                          "{\"prompt\":[" ONCE_JSON "],\"max_tokens\":8,\"temperature\":0}");
    cr_assert_eq(usage(a, "prompt_tokens"), 5);
    cr_assert_str_eq(choice_str(a, "text"), choice_str(b, "text"));
    cr_assert_str_eq(choice_str(a, "text"), choice_str(c, "text"));
    json_decref(a);
    json_decref(b);
    json_decref(c);
    /* an id the vocabulary lacks: named, with its place, before the engine
     * sees it (regress: "the engine refused the request: ... or an invalid
     * sampling parameter") */
    struct ht_resp r;
    ht_post(t.port, "/v1/completions", "{\"prompt\":[1,403,99999],\"max_tokens\":2}", &r);
    ht_assert_error(&r, 400, "invalid_value");
    cr_assert(strstr(r.body, "'prompt' has token id 99999 at position 2, outside the vocabulary "
                             "of 512 tokens"),
              "%s", r.body);
    ht_free(&r);
    ht_stop(&t);
}

/* Two full pages of prompt (16 tokens a page): the second request takes
 * them from the prefix cache; a cache_salt is its own namespace. */
Test(serve_api, cached_tokens_and_cache_salt, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    const char *p = "\"prompt\":\"Once upon a time there was a big dog. The dog liked to run in "
                    "the park with his friend the cat, and they played all day long.\","
                    "\"max_tokens\":4,\"temperature\":0";
    char body[512];
    snprintf(body, sizeof(body), "{%s}", p);
    json_t *a = post_json(&t, "/v1/completions", body);
    json_t *b = post_json(&t, "/v1/completions", body);
    cr_assert_gt(usage(a, "prompt_tokens"), 33, "the prompt must span two pages");
    cr_assert_eq(usage(a, "cached_tokens"), 0);
    cr_assert_geq(usage(b, "cached_tokens"), 32);
    cr_assert_eq(usage(b, "cached_tokens") % 16, 0);
    cr_assert_str_eq(choice_str(a, "text"), choice_str(b, "text"));
    snprintf(body, sizeof(body), "{%s,\"cache_salt\":\"s1\"}", p);
    json_t *c = post_json(&t, "/v1/completions", body);
    json_t *d = post_json(&t, "/v1/completions", body);
    cr_assert_eq(usage(c, "cached_tokens"), 0, "a salt is a new namespace");
    cr_assert_geq(usage(d, "cached_tokens"), 32);
    cr_assert_str_eq(choice_str(a, "text"), choice_str(d, "text"));
    json_t *all[] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        json_decref(all[i]);
    ht_stop(&t);
}

Test(serve_api, models_and_model_not_found, .timeout = 60) {
    struct ht_server t;
    struct http_config hc = {.served_model_name = "tiny-stories"};
    ht_start(&t, NULL, &hc);
    struct ht_resp r;
    ht_request(t.port, "GET", "/v1/models", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    json_t *j = ht_json(&r);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(m, "id")), "tiny-stories");
    cr_assert_str_eq(json_string_value(json_object_get(m, "object")), "model");
    cr_assert_eq(json_integer_value(json_object_get(m, "max_model_len")), 512);
    json_decref(j);
    ht_free(&r);
    ht_request(t.port, "GET", "/v1/models/tiny-stories", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    ht_free(&r);
    ht_request(t.port, "GET", "/v1/models/gpt-4", NULL, NULL, &r);
    ht_assert_error(&r, 404, "model_not_found");
    ht_free(&r);
    ht_post(t.port, "/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"Hi\"}", &r);
    ht_assert_error(&r, 404, "model_not_found");
    ht_free(&r);
    json_t *ok = post_json(&t, "/v1/completions",
                           "{\"model\":\"tiny-stories\",\"prompt\":\"Hi\",\"max_tokens\":2}");
    cr_assert_str_eq(json_string_value(json_object_get(ok, "model")), "tiny-stories");
    json_decref(ok);
    ht_stop(&t);
}

Test(serve_api, health_ready_then_draining, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    struct ht_resp r;
    ht_request(t.port, "GET", "/health", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.body, "{\"status\":\"ready\"}");
    ht_free(&r);
    http_server_drain(t.s);
    ht_request(t.port, "GET", "/health", NULL, NULL, &r);
    cr_assert_eq(r.status, 503);
    cr_assert_str_eq(r.body, "{\"status\":\"draining\"}");
    ht_free(&r);
    ht_post(t.port, "/v1/completions", "{\"prompt\":\"Hi\"}", &r);
    ht_assert_error(&r, 503, "server_shutting_down");
    ht_free(&r);
    ht_stop(&t);
}

/* name{labels} value, or a comment: the exposition format's line grammar */
#define NAME   "[a-zA-Z_:][a-zA-Z0-9_:]*"
#define LABEL  "[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\""
#define SAMPLE "^" NAME "(\\{" LABEL "(," LABEL ")*\\})? [-+]?([0-9.]+([eE][-+]?[0-9]+)?|Inf|NaN)$"

/* The value of the sample line that starts with `key ` in text. */
static double metric(const char *text, const char *key) {
    char pat[256];
    snprintf(pat, sizeof(pat), "\n%s ", key);
    const char *p = strstr(text, pat);
    cr_assert_not_null(p, "no metric %s", key);
    return strtod(p + strlen(pat), NULL);
}

Test(serve_api, metrics_parse_and_agree_with_the_requests, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    int64_t prompt = 0, gen = 0, itl = 0;
    for (int i = 0; i < 4; i++) {
        char body[256];
        snprintf(body, sizeof(body), "{\"prompt\":\"Once upon a time %d\",\"max_tokens\":%d}", i,
                 5 + i);
        json_t *j = post_json(&t, "/v1/completions", body);
        prompt += usage(j, "prompt_tokens");
        gen += usage(j, "completion_tokens");
        itl += usage(j, "completion_tokens") - 1;
        json_decref(j);
    }
    struct streamed s;
    post_stream(&t, "/v1/completions",
                "{\"prompt\":\"Hi\",\"max_tokens\":3,\"stream\":true,"
                "\"stream_options\":{\"include_usage\":true}}",
                &s);
    prompt += json_integer_value(json_object_get(s.usage, "prompt_tokens"));
    gen += 3;
    itl += 2;
    json_decref(s.usage);
    json_t *j =
        post_json(&t, "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":9,\"stop\":\"a\"}");
    prompt += usage(j, "prompt_tokens");
    gen += usage(j, "completion_tokens");
    itl += usage(j, "completion_tokens") - 1;
    const char *f = choice_str(j, "finish_reason");
    int n_stop = strcmp(f, "stop") == 0;
    json_decref(j);
    struct ht_resp r;
    ht_post(t.port, "/v1/completions", "{\"prompt\":1}", &r); /* a 400 */
    ht_free(&r);

    ht_request(t.port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    char ct[128];
    cr_assert_str_eq(ht_header(&r, "Content-Type", ct, sizeof(ct)),
                     "text/plain; version=0.0.4; charset=utf-8");
    regex_t re;
    cr_assert_eq(regcomp(&re, SAMPLE, REG_EXTENDED | REG_NOSUB), 0);
    char *save, *text = strdup(r.body);
    int lines = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lines++;
        if (line[0] == '#') {
            cr_assert(strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0, "%s",
                      line);
            continue;
        }
        cr_assert_eq(regexec(&re, line, 0, NULL, 0), 0, "not a sample line: '%s'", line);
    }
    regfree(&re);
    free(text);
    cr_assert_gt(lines, 100);
    char *m = malloc(r.len + 2); /* metric() looks for "\nname " */
    m[0] = '\n';
    memcpy(m + 1, r.body, r.len + 1);
    cr_assert_eq(metric(m, "llmd_requests_total{finish_reason=\"length\"}"), 6 - n_stop);
    cr_assert_eq(metric(m, "llmd_requests_total{finish_reason=\"stop\"}"), n_stop);
    cr_assert_eq(metric(m, "llmd_requests_total{finish_reason=\"abort\"}"), 0);
    cr_assert_eq(metric(m, "llmd_prompt_tokens_total"), (double)prompt);
    cr_assert_eq(metric(m, "llmd_generation_tokens_total"), (double)gen);
    cr_assert_eq(metric(m, "llmd_time_to_first_token_seconds_count"), 6);
    cr_assert_eq(metric(m, "llmd_e2e_request_latency_seconds_count"), 6);
    cr_assert_eq(metric(m, "llmd_request_queue_time_seconds_count"), 6);
    cr_assert_eq(metric(m, "llmd_inter_token_latency_seconds_count"), (double)itl);
    cr_assert_eq(metric(m, "llmd_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 6);
    cr_assert_eq(metric(m, "llmd_http_responses_total{code=\"200\"}"), 6);
    cr_assert_eq(metric(m, "llmd_http_responses_total{code=\"400\"}"), 1);
    cr_assert_eq(metric(m, "llmd_requests_running"), 0);
    cr_assert_eq(metric(m, "llmd_kv_pages{state=\"used\"}"), 0);
    cr_assert_eq(metric(m, "vllm:num_requests_waiting{model_name=\"" HT_NAME "\"}"), 0);
    cr_assert_eq(metric(m, "vllm:num_requests_running{model_name=\"" HT_NAME "\"}"), 0);
    cr_assert_eq(metric(m, "vllm:gpu_cache_usage_perc{model_name=\"" HT_NAME "\"}"), 0);
    cr_assert_eq(metric(m, "vllm:kv_cache_usage_perc{model_name=\"" HT_NAME "\"}"), 0);
    free(m);
    ht_free(&r);
    ht_stop(&t);
}

/* The logprobs of every choice chunk of a streamed answer, merged in the
 * whole answer's shape: completions' four arrays joined, chat's content
 * arrays joined. Caller decrefs. */
static json_t *stream_logprobs(struct ht_server *t, const char *path, const char *body) {
    struct ht_resp r;
    ht_post(t->port, path, body, &r);
    cr_assert_eq(r.status, 200, "%d: %s", r.status, r.body);
    static json_t *ev[2048];
    bool done;
    size_t n = ht_sse(r.body, ev, 2048, &done);
    cr_assert(done, "no [DONE]: %s", r.body);
    bool chat = strstr(path, "chat") != NULL;
    json_t *all = chat ? json_pack("{s:[]}", "content")
                       : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                                   "top_logprobs", "text_offset");
    for (size_t i = 0; i < n; i++) {
        json_t *lp =
            json_object_get(json_array_get(json_object_get(ev[i], "choices"), 0), "logprobs");
        if (json_is_object(lp)) {
            const char *k;
            json_t *v;
            json_object_foreach(lp, k, v) {
                cr_assert(json_is_array(json_object_get(all, k)), "key %s", k);
                json_array_extend(json_object_get(all, k), v);
            }
        }
        json_decref(ev[i]);
    }
    ht_free(&r);
    return all;
}

static void expect_same_numbers(json_t *a, json_t *b, const char *what) {
    cr_assert_eq(json_array_size(a), json_array_size(b), "%s", what);
    for (size_t i = 0; i < json_array_size(a); i++)
        cr_assert(fabs(json_number_value(json_array_get(a, i)) -
                       json_number_value(json_array_get(b, i))) < 1e-6,
                  "%s %zu", what, i);
}

Test(serve_api, completion_logprobs_whole_and_streamed, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    const char *body =
        "{\"prompt\":" ONCE_JSON ",\"max_tokens\":12,\"temperature\":0,\"logprobs\":3}";
    json_t *j = post_json(&t, "/v1/completions", body);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *toks = json_object_get(lp, "tokens"), *lps = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs"), *offs = json_object_get(lp, "text_offset");
    cr_assert_eq(json_array_size(toks), 12);
    char text[512] = "";
    for (size_t i = 0; i < 12; i++) {
        const char *tok = json_string_value(json_array_get(toks, i));
        double l = json_number_value(json_array_get(lps, i));
        json_t *top = json_array_get(tops, i);
        cr_assert_eq(json_integer_value(json_array_get(offs, i)), (json_int_t)strlen(text));
        strcat(text, tok);
        cr_assert_eq(json_object_size(top), 3, "token %zu: 3 alternatives", i);
        /* greedy: the chosen token is the most likely alternative */
        cr_assert_eq(json_number_value(json_object_get(top, tok)), l, "token %zu '%s'", i, tok);
        const char *k;
        json_t *v;
        json_object_foreach(top, k, v) cr_assert_geq(l, json_number_value(v), "%s vs %s", tok, k);
        cr_assert(l <= 0 && l > -9999.0, "%f", l);
    }
    cr_assert_str_eq(text, choice_str(j, "text"), "the tokens are the text");
    char sbody[512];
    snprintf(sbody, sizeof sbody, "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    json_t *s = stream_logprobs(&t, "/v1/completions", sbody);
    cr_assert(json_equal(json_object_get(s, "tokens"), toks));
    cr_assert(json_equal(json_object_get(s, "text_offset"), offs));
    expect_same_numbers(json_object_get(s, "token_logprobs"), lps, "streamed logprobs");
    json_decref(s);
    json_decref(j);
    /* no logprobs asked: null */
    j = post_json(&t, "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":2}");
    cr_assert(json_is_null(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs")));
    json_decref(j);
    ht_stop(&t);
}

Test(serve_api, chat_logprobs_whole_and_streamed, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],"
                       "\"max_tokens\":10,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}";
    json_t *j = post_json(&t, "/v1/chat/completions", body);
    json_t *content = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    cr_assert_eq(json_array_size(content), (size_t)usage(j, "completion_tokens"));
    char text[512] = "";
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *c = json_array_get(content, i), *top = json_object_get(c, "top_logprobs");
        const char *tok = json_string_value(json_object_get(c, "token"));
        json_t *bytes = json_object_get(c, "bytes");
        cr_assert_eq(json_array_size(bytes), strlen(tok));
        for (size_t b = 0; b < strlen(tok); b++)
            cr_assert_eq(json_integer_value(json_array_get(bytes, b)), (unsigned char)tok[b]);
        strcat(text, tok);
        cr_assert_eq(json_array_size(top), 2);
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(top, 0), "token")), tok);
        double l = json_number_value(json_object_get(c, "logprob"));
        cr_assert_eq(json_number_value(json_object_get(json_array_get(top, 0), "logprob")), l);
        cr_assert_geq(l, json_number_value(json_object_get(json_array_get(top, 1), "logprob")));
    }
    cr_assert_str_eq(text, choice_str(j, "content"), "the tokens are the content");
    char sbody[512];
    snprintf(sbody, sizeof sbody, "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    json_t *s = stream_logprobs(&t, "/v1/chat/completions", sbody);
    json_t *sc = json_object_get(s, "content");
    cr_assert_eq(json_array_size(sc), json_array_size(content));
    for (size_t i = 0; i < json_array_size(sc); i++)
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(sc, i), "token")),
                         json_string_value(json_object_get(json_array_get(content, i), "token")));
    json_decref(s);
    json_decref(j);
    ht_stop(&t);
}

/* echo: the prompt's text and logprobs come first (the first token's null);
 * max_tokens 0 scores the prompt alone. Scoring prompt + completion gives
 * the completion's tokens the logprobs they had when generated. */
Test(serve_api, echo_scores_the_prompt, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    json_t *g = post_json(&t, "/v1/completions",
                          "{\"prompt\":" ONCE_JSON ",\"max_tokens\":4,\"temperature\":0,"
                          "\"logprobs\":1,\"echo\":true}");
    const char *text = choice_str(g, "text");
    cr_assert(strncmp(text, "Once upon a time", 16) == 0, "%s", text);
    json_t *lp = json_object_get(json_array_get(json_object_get(g, "choices"), 0), "logprobs");
    json_t *toks = json_object_get(lp, "tokens"), *lps = json_object_get(lp, "token_logprobs");
    cr_assert_eq(json_array_size(toks), 5 + 4, "BOS + 4 prompt tokens, 4 generated");
    cr_assert(json_is_null(json_array_get(lps, 0)), "the first token has no logprob");
    cr_assert(json_is_null(json_array_get(json_object_get(lp, "top_logprobs"), 0)));

    /* the whole text as a prompt, scored alone */
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":0,\"echo\":true,\"logprobs\":0}",
             text);
    json_t *s = post_json(&t, "/v1/completions", body);
    cr_assert_str_eq(choice_str(s, "text"), text, "max_tokens 0: the prompt alone");
    cr_assert_eq(usage(s, "completion_tokens"), 0);
    cr_assert_eq(usage(s, "prompt_tokens"), 9);
    json_t *sl = json_object_get(json_array_get(json_object_get(s, "choices"), 0), "logprobs");
    cr_assert(json_equal(json_object_get(sl, "tokens"), toks), "the same tokens");
    json_t *slps = json_object_get(sl, "token_logprobs");
    cr_assert(json_is_null(json_array_get(slps, 0)));
    for (size_t i = 1; i < 9; i++)
        cr_assert(fabs(json_number_value(json_array_get(slps, i)) -
                       json_number_value(json_array_get(lps, i))) < 1e-4,
                  "token %zu: scored %f, generated %f", i,
                  json_number_value(json_array_get(slps, i)),
                  json_number_value(json_array_get(lps, i)));

    /* streamed: the prompt's text first, the same records in the end */
    snprintf(body, sizeof body,
             "{\"prompt\":" ONCE_JSON ",\"max_tokens\":4,\"temperature\":0,\"logprobs\":1,"
             "\"echo\":true,\"stream\":true}");
    struct streamed st;
    post_stream(&t, "/v1/completions", body, &st);
    cr_assert_str_eq(st.text, text);
    json_t *sa = stream_logprobs(&t, "/v1/completions", body);
    cr_assert(json_equal(json_object_get(sa, "tokens"), toks));
    cr_assert(json_equal(json_object_get(sa, "text_offset"), json_object_get(lp, "text_offset")));
    json_decref(sa);

    /* scored alone, streamed: a chunk of logprobs and no text, then the
     * finish and [DONE] (a text-less chunk once ended the stream early) */
    snprintf(body, sizeof body,
             "{\"prompt\":\"%s\",\"max_tokens\":0,\"echo\":true,\"logprobs\":0,"
             "\"stream\":true}",
             text);
    post_stream(&t, "/v1/completions", body, &st);
    cr_assert_str_eq(st.text, text);
    sa = stream_logprobs(&t, "/v1/completions", body);
    cr_assert(json_equal(json_object_get(sa, "tokens"), toks), "the same tokens, streamed");
    json_decref(sa);
    json_decref(s);
    json_decref(g);

    /* a token-id prompt echoes the ids' text; no logprobs asked: null */
    g = post_json(&t, "/v1/completions",
                  "{\"prompt\":[1,403,407],\"max_tokens\":1,\"temperature\":0,\"echo\":true}");
    cr_assert(strncmp(choice_str(g, "text"), " Once upon", 10) == 0, "%s", choice_str(g, "text"));
    cr_assert(json_is_null(
        json_object_get(json_array_get(json_object_get(g, "choices"), 0), "logprobs")));
    json_decref(g);
    ht_stop(&t);
}

/* The logit fields over HTTP: a bias of 100 on "\n" forces it; a stop
 * token id ends the answer with "stop" and without its text. */
Test(serve_api, logit_bias_and_stop_token_ids, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    json_t *j = post_json(&t, "/v1/completions",
                          "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0,"
                          "\"logit_bias\":{\"13\":100},\"presence_penalty\":0.5,"
                          "\"repetition_penalty\":1.1}");
    cr_assert_str_eq(choice_str(j, "text"), "\n\n\n");
    json_decref(j);
    /* ", there" is greedy's start: stop at " there" (383) */
    j = post_json(&t, "/v1/completions",
                  "{\"prompt\":" ONCE_JSON ",\"max_tokens\":8,\"temperature\":0,"
                  "\"stop_token_ids\":[383]}");
    cr_assert_str_eq(choice_str(j, "text"), ",");
    cr_assert_str_eq(choice_str(j, "finish_reason"), "stop");
    cr_assert_eq(usage(j, "completion_tokens"), 2);
    json_decref(j);
    ht_stop(&t);
}

/* issue 18, n > 1: four choices of one 300-token prompt prefill it once
 * (the three held back behind the first share its 18 full pages and
 * compute their own 12-token partial page: the counters say so), usage
 * counts the prompt once, and choice i equals a request of its own with
 * seed + i. */
Test(serve_api, n_choices_prefill_the_prompt_once, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    char ids[4096];
    size_t k = (size_t)snprintf(ids, sizeof(ids), "[1");
    for (int i = 1; i < 300; i++)
        k += (size_t)snprintf(ids + k, sizeof(ids) - k, ",%d", 3 + (i * 37) % 500);
    snprintf(ids + k, sizeof(ids) - k, "]");
    char body[8192];
    struct llmd_stats s0, s1;
    http_server_stats(t.s, &s0);
    snprintf(body, sizeof(body),
             "{\"prompt\":%s,\"n\":4,\"max_tokens\":8,\"temperature\":1,\"seed\":5}", ids);
    json_t *all = post_json(&t, "/v1/completions", body);
    http_server_stats(t.s, &s1);
    cr_assert_eq(s1.prefill_tokens_total - s0.prefill_tokens_total, 300 + 3 * 12, "prefilled %lu",
                 (unsigned long)(s1.prefill_tokens_total - s0.prefill_tokens_total));
    cr_assert_eq(s1.prefix_hit_tokens_total - s0.prefix_hit_tokens_total, 3 * 288);
    json_t *choices = json_object_get(all, "choices");
    cr_assert_eq(json_array_size(choices), 4);
    cr_assert_eq(usage(all, "prompt_tokens"), 300);
    cr_assert_eq(usage(all, "completion_tokens"), 4 * 8);
    for (int i = 0; i < 4; i++) {
        json_t *c = json_array_get(choices, (size_t)i);
        cr_assert_eq(json_integer_value(json_object_get(c, "index")), i);
        cr_assert_str_eq(json_string_value(json_object_get(c, "finish_reason")), "length");
        snprintf(body, sizeof(body),
                 "{\"prompt\":%s,\"max_tokens\":8,\"temperature\":1,\"seed\":%d}", ids, 5 + i);
        json_t *one = post_json(&t, "/v1/completions", body);
        cr_assert_str_eq(json_string_value(json_object_get(c, "text")), choice_str(one, "text"),
                         "choice %d", i);
        json_decref(one);
    }
    json_decref(all);
    struct llmd_stats st = ht_wait_idle(&t);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    ht_stop(&t);
}

/* A client that leaves a streamed n = 3 request after its first event
 * cancels all three choices, and every page comes back. */
Test(serve_api, n_choices_are_all_cancelled_when_the_client_leaves, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    const char *b = "{\"prompt\":\"Once upon a time\",\"n\":3,\"max_tokens\":480,\"stream\":true,"
                    "\"temperature\":1,\"seed\":1}";
    int fd = ht_send(t.port, "POST", "/v1/completions", NULL, b, strlen(b));
    char buf[4096];
    size_t got = 0;
    while (!memmem(buf, got, "data: ", 6)) {
        ssize_t n = recv(fd, buf + got, sizeof(buf) - got, 0);
        cr_assert_gt(n, 0, "the stream ended before its first event");
        got += (size_t)n;
        cr_assert_lt(got, sizeof(buf));
    }
    close(fd);
    struct llmd_stats st = ht_wait_idle(&t);
    cr_assert_eq(st.requests_running + st.requests_waiting, 0);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    struct ht_resp r;
    ht_request(t.port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(metric(r.body, "llmd_requests_total{finish_reason=\"abort\"}"), 3, "%s", r.body);
    cr_assert_eq(metric(r.body, "llmd_requests_total{finish_reason=\"length\"}"), 0,
                 "a choice ran to its end");
    ht_free(&r);
    ht_stop(&t);
}
