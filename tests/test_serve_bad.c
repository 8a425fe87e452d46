/* `llmd serve` refuses bad input with the right 4xx and an OpenAI error
 * object, and keeps serving: each bad request is followed by a good one.
 * Also API keys (401, tenants) and admission control (429, Retry-After). */
#include <pthread.h>
#include <sys/stat.h>

#include "tests/lib/http_util.h"

static void good_request(struct ht_server *t, const char *why) {
    struct ht_resp r;
    ht_post(t->port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":2}", &r);
    cr_assert_eq(r.status, 200, "after %s: %d %s", why, r.status, r.body);
    ht_free(&r);
}

struct bad_case {
    const char *path, *body;
    int status;
    const char *code, *param; /* param NULL: JSON null */
};

/* A long prompt: about 700 tokens, over the context of 512. */
static char *long_prompt_body(void) {
    static char body[8192];
    int n = snprintf(body, sizeof(body), "{\"prompt\":\"");
    for (int i = 0; i < 350; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "a b ");
    snprintf(body + n, sizeof(body) - (size_t)n, "\",\"max_tokens\":4}");
    return body;
}

static const struct bad_case cases[] = {
    {"/v1/completions", "{\"prompt\":", 400, "invalid_json", NULL},
    {"/v1/completions", "", 400, "invalid_json", NULL},
    {"/v1/completions", "{\"prompt\":\"a\",\"prompt\":\"b\"}", 400, "invalid_json", NULL},
    {"/v1/completions", "{\"prompt\":\"a\\u0000b\"}", 400, "invalid_json", NULL},
    {"/v1/completions", "[1,2]", 400, "invalid_type", NULL},
    {"/v1/completions", "{\"prompt\":\"\xff\xfe\"}", 400, "invalid_utf8", NULL},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", 400,
     "invalid_utf8", NULL},
    {"/v1/completions", "{\"prompt\":1}", 400, "invalid_type", "prompt"},
    {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 400, "invalid_type",
     "max_tokens"},
    {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":2.5}", 400, "invalid_type", "max_tokens"},
    {"/v1/completions", "{\"prompt\":\"a\",\"temperature\":\"hot\"}", 400, "invalid_type",
     "temperature"},
    {"/v1/completions", "{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "invalid_type", "stream"},
    {"/v1/completions", "{\"prompt\":\"a\",\"seed\":1.5}", 400, "invalid_type", "seed"},
    {"/v1/completions", "{\"prompt\":\"a\",\"priority\":\"high\"}", 400, "invalid_type",
     "priority"},
    {"/v1/completions", "{\"prompt\":\"a\",\"cache_salt\":5}", 400, "invalid_type", "cache_salt"},
    {"/v1/completions", "{\"prompt\":\"a\",\"stop\":[1]}", 400, "invalid_type", "stop"},
    {"/v1/completions", "{\"prompt\":\"a\",\"model\":7}", 400, "invalid_type", "model"},
    {"/v1/completions", "{}", 400, "missing_required_parameter", "prompt"},
    {"/v1/completions", "{\"prompt\":null}", 400, "missing_required_parameter", "prompt"},
    {"/v1/completions", "{\"prompt\":[]}", 400, "invalid_value", "prompt"},
    {"/v1/chat/completions", "{}", 400, "missing_required_parameter", "messages"},
    {"/v1/chat/completions", "{\"messages\":[]}", 400, "invalid_value", "messages"},
    {"/v1/chat/completions", "{\"messages\":[1]}", 400, "invalid_type", "messages[0]"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400,
     "unsupported_parameter", "messages[0].role"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     400, "unsupported_parameter", "messages[0].content"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
     "invalid_type", "messages[0].content"},
    /* regress: a user (or system) message without content was taken as "" (200) */
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\"}]}", 400,
     "missing_required_parameter", "messages[0].content"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"},{\"role\":\"user\","
     "\"content\":null}]}",
     400, "missing_required_parameter", "messages[1].content"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"system\",\"content\":null}]}", 400,
     "missing_required_parameter", "messages[0].content"},
    {"/v1/completions", "{\"prompt\":\"a\",\"model\":\"gpt-4\"}", 404, "model_not_found", "model"},
    {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "invalid_value", "max_tokens"},
    {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":-3}", 400, "invalid_value", "max_tokens"},
    {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":1000}", 400, "invalid_value",
     "max_tokens"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_completion_tokens\":0}", 400,
     "invalid_value", "max_completion_tokens"},
    {"/v1/completions", "{\"prompt\":\"a\",\"temperature\":3}", 400, "invalid_value",
     "temperature"},
    {"/v1/completions", "{\"prompt\":\"a\",\"top_p\":0}", 400, "invalid_value", "top_p"},
    {"/v1/completions",
     "{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\","
     "\"8\",\"9\"]}",
     400, "invalid_value", "stop"},
    {"/v1/completions", "{\"prompt\":\"a\",\"stop\":\"\"}", 400, "invalid_value", "stop"},
    {"/v1/completions", "{\"prompt\":\"a\",\"cache_salt\":\"\"}", 400, "invalid_value",
     "cache_salt"},
    {"/v1/completions", "{\"prompt\":[1,512]}", 400, "invalid_value", "prompt"},
    {"/v1/completions", "{\"prompt\":[-1]}", 400, "invalid_value", "prompt"},
    {"/v1/completions", "{\"prompt\":\"a\",\"n\":0}", 400, "invalid_value", "n"},
    {"/v1/completions", "{\"prompt\":\"a\",\"n\":129}", 400, "invalid_value", "n"},
    {"/v1/completions", "{\"prompt\":\"a\",\"n\":2.5}", 400, "invalid_type", "n"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":-1}", 400,
     "invalid_value", "n"},
    {"/v1/completions", "{\"prompt\":\"a\",\"n\":3,\"best_of\":2}", 400, "invalid_value",
     "best_of"},
    {"/v1/completions", "{\"prompt\":\"a\",\"best_of\":3}", 400, "unsupported_parameter",
     "best_of"},
    {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":21}", 400, "invalid_value", "logprobs"},
    {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":-1}", 400, "invalid_value", "logprobs"},
    {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":true}", 400, "invalid_type", "logprobs"},
    {"/v1/completions", "{\"prompt\":\"a\",\"top_logprobs\":2}", 400, "unsupported_parameter",
     "top_logprobs"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":3}", 400, "invalid_type",
     "logprobs"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}", 400,
     "invalid_value", "top_logprobs"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,"
     "\"top_logprobs\":21}",
     400, "invalid_value", "top_logprobs"},
    {"/v1/completions", "{\"prompt\":\"a\",\"echo\":\"yes\"}", 400, "invalid_type", "echo"},
    {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "invalid_value", "max_tokens"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"echo\":true}",
     400, "unsupported_parameter", "echo"},
    {"/v1/completions", "{\"prompt\":\"a\",\"presence_penalty\":2.5}", 400, "invalid_value",
     "presence_penalty"},
    {"/v1/completions", "{\"prompt\":\"a\",\"frequency_penalty\":\"x\"}", 400, "invalid_type",
     "frequency_penalty"},
    {"/v1/completions", "{\"prompt\":\"a\",\"repetition_penalty\":0}", 400, "invalid_value",
     "repetition_penalty"},
    {"/v1/completions", "{\"prompt\":\"a\",\"logit_bias\":{\"99999\":1}}", 400, "invalid_value",
     "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"x\"}}", 400, "invalid_type",
     "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", 400, "invalid_value",
     "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 400, "invalid_value",
     "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"a\",\"stop_token_ids\":[99999]}", 400, "invalid_value",
     "stop_token_ids"},
    {"/v1/completions", "{\"prompt\":\"a\",\"ignore_eos\":1}", 400, "invalid_type", "ignore_eos"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\"}]}",
     400, "unsupported_parameter", "tools"},
    {"/v1/chat/completions",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":{\"type\":"
     "\"json_object\"}}",
     400, "unsupported_parameter", "response_format"},
    {"/v1/completions", "{\"prompt\":[\"a\",\"b\"]}", 400, "unsupported_parameter", "prompt"},
    {"/v1/completions", "{\"prompt\":[1,99999]}", 400, "invalid_value", "prompt"},
    {"/v1/completions", "{\"prompt\":[1,-1]}", 400, "invalid_value", "prompt"},
};

Test(serve_bad, each_bad_request_gets_its_error_and_the_server_goes_on, .timeout = 120) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    struct ht_resp r0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct bad_case *c = &cases[i];
        struct ht_resp r;
        ht_post(t.port, c->path, c->body, &r);
        ht_assert_error(&r, c->status, c->code);
        json_t *j = ht_json(&r);
        json_t *p = json_object_get(json_object_get(j, "error"), "param");
        if (c->param)
            cr_assert_str_eq(json_string_value(p), c->param, "case %zu: %s", i, r.body);
        else
            cr_assert(json_is_null(p), "case %zu: %s", i, r.body);
        json_decref(j);
        ht_free(&r);
        good_request(&t, c->body);
    }
    /* the words of a missing content; an assistant's may be null (a tool call's turn) */
    ht_post(t.port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\"}]}", &r0);
    cr_assert(strstr(r0.body, "\"message\":\"'messages[0].content' is required: only an "
                              "assistant message may have no content\""),
              "%s", r0.body);
    ht_free(&r0);
    ht_post(t.port, "/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
            "\"content\":null},{\"role\":\"user\",\"content\":\"go on\"}],\"max_tokens\":2}",
            &r0);
    cr_assert_eq(r0.status, 200, "%s", r0.body);
    ht_free(&r0);
    /* nesting deeper than jansson's 2048 levels */
    static char deep[8201]; /* NUL-terminated: static */
    memset(deep, '[', 4100);
    memset(deep + 4100, ']', 4100);
    ht_post(t.port, "/v1/completions", deep, &r0);
    ht_assert_error(&r0, 400, "invalid_json");
    ht_free(&r0);
    good_request(&t, "deep nesting");
    /* the prompt is longer than the context: the engine says -E2BIG */
    struct ht_resp r;
    ht_post(t.port, "/v1/completions", long_prompt_body(), &r);
    ht_assert_error(&r, 400, "context_length_exceeded");
    /* the words llmd batch uses: how long the prompt was, against what */
    cr_assert(strstr(r.body, "\"message\":\"the prompt is 702 tokens: it leaves no room for "
                             "output in the context of 512 tokens (prompt and output together; "
                             "see --ctx)\""),
              "%s", r.body);
    ht_free(&r);
    good_request(&t, "a long prompt");
    struct llmd_stats st = ht_wait_idle(&t);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    ht_stop(&t);
}

Test(serve_bad, paths_methods_and_bodies, .timeout = 60) {
    struct ht_server t;
    struct http_config hc = {.max_body_bytes = 4096};
    ht_start(&t, NULL, &hc);
    struct ht_resp r;
    ht_request(t.port, "GET", "/v2/nothing", NULL, NULL, &r);
    ht_assert_error(&r, 404, "not_found");
    ht_free(&r);
    good_request(&t, "404");
    char v[64];
    ht_request(t.port, "GET", "/v1/completions", NULL, NULL, &r);
    ht_assert_error(&r, 405, "method_not_allowed");
    cr_assert_str_eq(ht_header(&r, "Allow", v, sizeof(v)), "POST");
    ht_free(&r);
    ht_request(t.port, "DELETE", "/health", NULL, NULL, &r);
    ht_assert_error(&r, 405, "method_not_allowed");
    cr_assert_str_eq(ht_header(&r, "Allow", v, sizeof(v)), "GET, HEAD");
    ht_free(&r);
    good_request(&t, "405");

    /* over --max-body with a Content-Length: refused before the body */
    static char big[6000];
    memset(big, ' ', sizeof(big) - 1);
    memcpy(big, "{\"prompt\":\"a\"}", 14);
    ht_post(t.port, "/v1/completions", big, &r);
    ht_assert_error(&r, 413, "request_too_large");
    ht_free(&r);
    good_request(&t, "413");

    /* ... and chunked, without one: refused once it passes the limit */
    int fd = ht_connect(t.port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n";
    ht_send_all(fd, head, strlen(head));
    for (int i = 0; i < 3; i++) {
        char chunk[2100];
        int n = snprintf(chunk, sizeof(chunk), "800\r\n");
        memset(chunk + n, ' ', 0x800);
        memcpy(chunk + n + 0x800, "\r\n", 2);
        ht_send_all(fd, chunk, (size_t)n + 0x800 + 2);
    }
    ht_send_all(fd, "0\r\n\r\n", 5);
    ht_read(fd, &r);
    ht_assert_error(&r, 413, "request_too_large");
    ht_free(&r);
    good_request(&t, "413 chunked");

    /* not HTTP at all */
    fd = ht_connect(t.port);
    ht_send_all(fd, "\x16\x03\x01 hello\r\n\r\n", 13);
    char buf[512];
    while (recv(fd, buf, sizeof(buf), 0) > 0)
        ;
    close(fd);
    good_request(&t, "garbage");
    ht_stop(&t);
}

/* libmicrohttpd closes a connection whose answer was queued before the
 * request was read in full: the GET endpoints and refusals of requests
 * without a body are answered once they are, so a health checker or a
 * scraper keeps one connection. A refusal before a body closes (the body
 * is never read). */
Test(serve_bad, get_answers_and_bodiless_refusals_keep_the_connection, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    static const struct {
        const char *method, *path, *body;
        int status;
        const char *want; /* in the body */
    } reqs[] = {
        {"GET", "/health", NULL, 200, "\"ready\""},
        {"GET", "/metrics", NULL, 200, "llmd_requests_total"},
        {"GET", "/v1/models", NULL, 200, "\"" HT_NAME "\""},
        {"GET", "/v1/models/" HT_NAME, NULL, 200, "\"max_model_len\":512"},
        {"GET", "/v1/models/nope", NULL, 404, "model_not_found"},
        {"HEAD", "/health", NULL, 200, ""},
        {"GET", "/v2/nothing", NULL, 404, "not_found"},
        {"DELETE", "/health", NULL, 405, "method_not_allowed"},
        {"GET", "/v1/completions", NULL, 405, "method_not_allowed"},
        {"POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 2}", 200,
         "\"completion_tokens\":2"},
        {"GET", "/health", NULL, 200, "\"ready\""},
    };
    int fd = ht_connect(t.port);
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        struct ht_resp r;
        ht_send_on(fd, reqs[i].method, reqs[i].path, reqs[i].body);
        cr_assert(ht_read_on(fd, &r, strcmp(reqs[i].method, "HEAD") == 0),
                  "%s %s: no whole response on the kept connection (%s)", reqs[i].method,
                  reqs[i].path, r.head);
        cr_assert_eq(r.status, reqs[i].status, "%s %s: %s", reqs[i].method, reqs[i].path, r.head);
        char v[32];
        cr_assert_null(ht_header(&r, "Connection", v, sizeof(v)), "%s %s: Connection: %s",
                       reqs[i].method, reqs[i].path, v);
        cr_assert(strstr(r.body, reqs[i].want), "%s %s: %s", reqs[i].method, reqs[i].path, r.body);
        ht_free(&r);
    }
    close(fd);

    /* a body refused before it is read: answered at once, and closed */
    fd = ht_connect(t.port);
    const char *head = "POST /v2/nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
    ht_send_all(fd, head, strlen(head));
    struct ht_resp r;
    ht_read(fd, &r); /* returns only when the server closes */
    ht_assert_error(&r, 404, "not_found");
    char v[32];
    cr_assert_str_eq(ht_header(&r, "Connection", v, sizeof(v)), "close");
    ht_free(&r);
    good_request(&t, "kept connections");
    ht_stop(&t);
}

/* --- API keys -------------------------------------------------------------- */

static const char *write_keys(const char *text) {
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/llmd-keys-%d.txt", getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, 0600);
    return path;
}

/* cached_tokens of a two-page prompt sent with this Authorization header. */
static int64_t cached_with(struct ht_server *t, const char *auth) {
    struct ht_resp r;
    char hdr[128];
    snprintf(hdr, sizeof(hdr), "Authorization: %s\r\n", auth);
    ht_request(t->port, "POST", "/v1/completions", hdr,
               "{\"prompt\":\"Once upon a time there was a big dog. The dog liked to run in the "
               "park with his friend the cat, and they played all day long.\",\"max_tokens\":2}",
               &r);
    cr_assert_eq(r.status, 200, "%s: %d %s", auth, r.status, r.body);
    json_t *j = ht_json(&r);
    int64_t c = json_integer_value(json_object_get(
        json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
    json_decref(j);
    ht_free(&r);
    return c;
}

Test(serve_bad, api_keys_map_to_tenants_and_refuse_strangers, .timeout = 60) {
    const char *path = write_keys("# test keys\n"
                                  "key-a1 acme weight=2\n"
                                  "key-a2 acme   # a second key of the same tenant\n"
                                  "\n"
                                  "key-b globex max_priority=0 retention_pages=100\n");
    struct ht_server t;
    struct http_config hc = {.api_keys_path = path};
    ht_start(&t, NULL, &hc);
    unlink(path);
    static const char *const refused[] = {
        NULL, "Authorization: Bearer nope\r\n", "Authorization: Basic a2V5LWEx\r\n",
        "Authorization: Bearer \r\n", "Authorization: Bearer key-a1x\r\n"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        struct ht_resp r;
        ht_request(t.port, "POST", "/v1/completions", refused[i], "{\"prompt\":\"a\"}", &r);
        ht_assert_error(&r, 401, "invalid_api_key");
        char v[64];
        cr_assert_str_eq(ht_header(&r, "WWW-Authenticate", v, sizeof(v)), "Bearer");
        ht_free(&r);
    }
    struct ht_resp r;
    ht_request(t.port, "GET", "/v1/models", NULL, NULL, &r);
    ht_assert_error(&r, 401, "invalid_api_key");
    ht_free(&r);
    /* probes and scrapes need no key */
    ht_request(t.port, "GET", "/health", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    ht_free(&r);
    ht_request(t.port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    ht_free(&r);
    ht_request(t.port, "GET", "/v1/models", "Authorization: Bearer key-b\r\n", NULL, &r);
    cr_assert_eq(r.status, 200);
    ht_free(&r);

    /* the tenant namespaces the prefix cache: acme's two keys share it,
     * globex does not see acme's pages */
    cr_assert_eq(cached_with(&t, "Bearer key-a1"), 0);
    cr_assert_eq(cached_with(&t, "Bearer key-a2"), 32);
    cr_assert_eq(cached_with(&t, "bearer key-a1"), 32, "the scheme is case-insensitive");
    cr_assert_eq(cached_with(&t, "Bearer key-b"), 0);
    cr_assert_eq(cached_with(&t, "Bearer key-b"), 32);
    ht_stop(&t);
}

Test(serve_bad, bad_keys_files_are_refused_at_start, .timeout = 60) {
    static const char *const files[] = {
        "",                                     /* no keys */
        "lonely-key\n",                         /* no tenant */
        "k1 acme weight=0\n",                   /* out of range */
        "k1 acme colour=blue\n",                /* unknown option */
        "k1 acme weight=2\nk2 acme weight=3\n", /* disagree */
        "k1 acme\nk1 globex\n",                 /* a key twice */
        "k1 bad/name\n",                        /* tenant charset */
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        const char *path = write_keys(files[i]);
        struct llmd_engine_config ec = ht_engine_config();
        struct llmd_engine *e;
        char err[512] = "";
        cr_assert_eq(llmd_engine_open(&ec, &e, err, sizeof(err)), 0);
        struct http_config hc = {.model_path = HT_MODEL, .api_keys_path = path};
        struct http_server *s;
        int rc = http_server_start(&hc, e, &s, err, sizeof(err));
        cr_assert_eq(rc, -EINVAL, "file %zu: rc %d", i, rc);
        cr_assert(strstr(err, "--api-keys"), "file %zu: %s", i, err);
        unlink(path);
    }
}

/* --- admission control ------------------------------------------------------ */

struct shot {
    uint16_t port;
    int status;
    char retry_after[16];
    bool stream;
};

static void *shoot(void *arg) {
    struct shot *s = arg;
    struct ht_resp r;
    ht_post(s->port, "/v1/completions",
            s->stream ? "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"stream\":true}"
                      : "{\"prompt\":\"Once upon a time\",\"max_tokens\":60}",
            &r);
    s->status = r.status;
    if (!ht_header(&r, "Retry-After", s->retry_after, sizeof(s->retry_after)))
        s->retry_after[0] = '\0';
    if (r.status == 429 && !strstr(r.body, "\"code\":\"rate_limit_exceeded\""))
        s->status = -429; /* not the error object: the test thread fails it */
    ht_free(&r);
    return NULL;
}

Test(serve_bad, admission_refusal_is_429_with_retry_after, .timeout = 60) {
    /* 12 pages of 16 tokens, 2 sequences, a 1 ms queue limit: a burst of
     * 65-token requests cannot all wait */
    struct llmd_engine_config ec = ht_engine_config();
    ec.max_seqs = 2;
    ec.kv_budget_bytes = 12 * 20480;
    ec.max_queue_wait_ns = 1000000;
    struct ht_server t;
    ht_start(&t, &ec, NULL);
    good_request(&t, "warm-up (the scheduler measures its page rate)");
    enum { N = 24 };
    struct shot shots[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        shots[i] = (struct shot){.port = t.port, .stream = i % 2};
        pthread_create(&th[i], NULL, shoot, &shots[i]);
    }
    int n429 = 0, n200 = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (shots[i].status == 429) {
            n429++;
            cr_assert_geq(atoi(shots[i].retry_after), 1, "Retry-After '%s'", shots[i].retry_after);
        } else {
            cr_assert_eq(shots[i].status, 200, "request %d: %d", i, shots[i].status);
            n200++;
        }
    }
    cr_assert_gt(n429, 0, "nothing was refused");
    cr_assert_gt(n200, 0, "nothing was served");
    struct llmd_stats st = ht_wait_idle(&t);
    cr_assert_eq(st.refusals_total, (uint64_t)n429);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    good_request(&t, "429s");
    ht_stop(&t);
}

/* --- a KV pool smaller than one context --------------------------------------- */

/* A request that reaches what the whole pool holds ends with finish_reason
 * "kv_budget", streamed or not, counted apart in /metrics; it used to say
 * "length", as if max_tokens had been reached. A short one after it is
 * "length" again. */
Test(serve_bad, kv_budget_is_its_own_finish_reason, .timeout = 60) {
    struct llmd_engine_config ec = ht_engine_config();
    ec.kv_budget_bytes = 20480; /* one page: 16 tokens of prompt + output */
    struct ht_server t;
    ht_start(&t, &ec, NULL);
    struct ht_resp r;
    ht_post(t.port, "/v1/completions", "{\"prompt\":\"Once upon\",\"max_tokens\":40}", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = ht_json(&r);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *u = json_object_get(j, "usage");
    cr_assert_str_eq(json_string_value(json_object_get(c0, "finish_reason")), "kv_budget", "%s",
                     r.body);
    cr_assert_eq(json_integer_value(json_object_get(u, "prompt_tokens")) +
                     json_integer_value(json_object_get(u, "completion_tokens")),
                 16, "%s", r.body);
    json_decref(j);
    ht_free(&r);
    ht_post(t.port, "/v1/completions",
            "{\"prompt\":\"Once upon\",\"max_tokens\":40,\"stream\":true}", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert(strstr(r.body, "\"finish_reason\":\"kv_budget\""), "%s", r.body);
    ht_free(&r);
    /* a prompt the pool cannot hold, though the context could: kv_budget */
    ht_post(t.port, "/v1/completions",
            "{\"prompt\":\"Once upon a time there was a little girl named Lily. She loved to "
            "play\"}",
            &r);
    ht_assert_error(&r, 400, "kv_budget");
    cr_assert(strstr(r.body, "the prompt is 20 tokens: it leaves no room for output in what the "
                             "whole KV pool holds for one sequence, 16 tokens of the 512-token "
                             "context (raise --kv-budget)"),
              "%s", r.body);
    cr_assert(strstr(r.body, "\"param\":\"prompt\""), "%s", r.body);
    ht_free(&r);
    ht_post(t.port, "/v1/completions", "{\"prompt\":\"Once upon\",\"max_tokens\":2}", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert(strstr(r.body, "\"finish_reason\":\"length\""), "%s", r.body);
    ht_free(&r);
    ht_wait_idle(&t);
    ht_request(t.port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert(strstr(r.body, "\nllmd_requests_total{finish_reason=\"kv_budget\"} 2\n"), "%s",
              r.body);
    cr_assert(strstr(r.body, "\nllmd_requests_total{finish_reason=\"length\"} 1\n"), "%s", r.body);
    ht_free(&r);
    ht_stop(&t);
}
