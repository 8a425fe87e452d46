/* http_openai.c - the OpenAI request and response bodies.
 *
 * Sources: the OpenAI API reference for /v1/completions and
 * /v1/chat/completions (request fields, the response and chunk objects,
 * the error object) and vLLM's extensions (top_k, min_p, priority,
 * cache_salt). Parsing is strict where a wrong value would silently change
 * the output (types, ranges, n > 1, penalties, logprobs, tools: 400 naming
 * the parameter) and lenient where it would not: unknown fields are
 * ignored, as vLLM does, so newer clients keep working; JSON null means
 * "not given", as in the OpenAI API.
 *
 * Defaults follow OpenAI: temperature 1, top_p 1, max_tokens 16 for
 * completions and up to the context for chat; a missing seed is random.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/serve/http_impl.h"
#include "mem.h"

#define HTTP_MAX_STOP_BYTES 256 /* one stop string; the engine holds back up to this */
#define HTTP_MAX_SALT_BYTES 256

void http_err_set(struct http_err *e, unsigned status, const char *code, const char *param,
                  const char *fmt, ...) {
    e->status = status;
    e->code = code;
    e->retry_after_s = 0;
    e->allow = NULL;
    switch (status) {
    case 401:
        e->type = "authentication_error";
        break;
    case 404:
        e->type = "invalid_request_error";
        break;
    case 429:
        e->type = "rate_limit_error";
        break;
    default:
        e->type = status >= 500 ? "server_error" : "invalid_request_error";
        break;
    }
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
}

/* A JSON string of len bytes; invalid UTF-8 (never expected from the
 * engine, which emits whole characters) becomes U+FFFD byte by byte. */
static json_t *http_json_str(const char *s, size_t len) {
    json_t *j = json_stringn(s, len);
    if (j || !s)
        return j;
    struct http_buf b = {0};
    for (size_t i = 0; i < len; i++) {
        json_t *one = json_stringn(s + i, 1);
        if (one)
            http_buf_add(&b, s + i, 1);
        else
            http_buf_add(&b, "\xef\xbf\xbd", 3);
        json_decref(one);
    }
    j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    http_buf_free(&b);
    return j;
}

json_t *http_err_json(const struct http_err *e) {
    return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type", e->type,
                     "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                     e->code ? json_string(e->code) : json_null());
}

/* --- parsing -------------------------------------------------------------- */

/* The value of key, NULL when absent or JSON null. */
static json_t *http_get(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int http_bad_type(struct http_err *err, const char *key, const char *what) {
    http_err_set(err, 400, "invalid_type", key, "'%s' must be %s", key, what);
    return -EINVAL;
}

static int http_bad_value(struct http_err *err, const char *key, const char *fmt_what) {
    http_err_set(err, 400, "invalid_value", key, "'%s' %s", key, fmt_what);
    return -EINVAL;
}

static int http_unsupported(struct http_err *err, const char *key, const char *why) {
    http_err_set(err, 400, "unsupported_parameter", key, "'%s' is not supported: %s", key, why);
    return -EINVAL;
}

/* A number in [lo, hi] (NULL: keep *out). */
static int http_num(json_t *o, const char *key, double lo, double hi, float *out,
                    struct http_err *err) {
    json_t *v = http_get(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return http_bad_type(err, key, "a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        http_err_set(err, 400, "invalid_value", key, "'%s' must be in [%g, %g]", key, lo, hi);
        return -EINVAL;
    }
    *out = (float)d;
    return 0;
}

/* An integer in [lo, hi]; *given tells whether it was there. */
static int http_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                    bool *given, struct http_err *err) {
    json_t *v = http_get(o, key);
    if (given)
        *given = v != NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return http_bad_type(err, key, "an integer");
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        http_err_set(err, 400, "invalid_value", key, "'%s' must be in [%lld, %lld], not %lld", key,
                     lo, hi, x);
        return -EINVAL;
    }
    *out = x;
    return 0;
}

static int http_bool(json_t *o, const char *key, bool *out, struct http_err *err) {
    json_t *v = http_get(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return http_bad_type(err, key, "a boolean");
    *out = json_is_true(v);
    return 0;
}

/* Parameters llmd does not implement: refused rather than ignored, since
 * ignoring them would silently give a different answer. */
static int http_refuse_unsupported(json_t *o, bool chat, struct http_err *err) {
    long long x;
    bool given;
    if (http_int(o, "n", LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given && x != 1)
        return http_unsupported(err, "n", "only n = 1 (one choice per request)");
    if (http_int(o, "best_of", LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given && x != 1)
        return http_unsupported(err, "best_of", "only best_of = 1");
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        json_t *v = http_get(o, penalties[i]);
        if (v && !json_is_number(v))
            return http_bad_type(err, penalties[i], "a number");
        if (v && json_number_value(v) != 0)
            return http_unsupported(err, penalties[i], "only 0");
    }
    json_t *v = http_get(o, "repetition_penalty");
    if (v && (!json_is_number(v) || json_number_value(v) != 1))
        return http_unsupported(err, "repetition_penalty", "only 1");
    (void)chat; /* completions take a count, chat a boolean: only "none" either way */
    v = http_get(o, "logprobs");
    if (v && !json_is_false(v))
        return http_unsupported(err, "logprobs", "log probabilities are not returned");
    v = http_get(o, "top_logprobs");
    if (v && !(json_is_integer(v) && json_integer_value(v) == 0))
        return http_unsupported(err, "top_logprobs", "log probabilities are not returned");
    v = http_get(o, "logit_bias");
    if (v && !(json_is_object(v) && json_object_size(v) == 0))
        return http_unsupported(err, "logit_bias", "logit biases are not applied");
    v = http_get(o, "echo");
    if (v && !json_is_false(v))
        return http_unsupported(err, "echo", "the prompt is not echoed");
    if (http_get(o, "suffix"))
        return http_unsupported(err, "suffix", "no insertion mode");
    static const char *const tools[] = {"tools", "functions", "function_call", "audio",
                                        "prediction"};
    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++)
        if (http_get(o, tools[i]))
            return http_unsupported(err, tools[i], "no tool calls, audio or predicted outputs");
    v = http_get(o, "tool_choice");
    if (v && !(json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
        return http_unsupported(err, "tool_choice", "no tool calls");
    v = http_get(o, "response_format");
    if (v) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return http_unsupported(err, "response_format", "only {\"type\": \"text\"}");
    }
    return 0;
}

static int http_parse_stop(json_t *o, struct http_gen *g, struct http_err *err) {
    json_t *v = http_get(o, "stop");
    if (!v)
        return 0;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > HTTP_MAX_STOP) {
            http_err_set(err, 400, "invalid_value", "stop", "at most %d stop strings, not %zu",
                         HTTP_MAX_STOP, n);
            return -EINVAL;
        }
    } else if (!json_is_string(v)) {
        return http_bad_type(err, "stop", "a string or an array of strings");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(s))
            return http_bad_type(err, "stop", "a string or an array of strings");
        size_t len = json_string_length(s);
        if (len == 0 || len > HTTP_MAX_STOP_BYTES) {
            http_err_set(err, 400, "invalid_value", "stop",
                         "stop strings must be 1 to %d bytes long", HTTP_MAX_STOP_BYTES);
            return -EINVAL;
        }
        if (!(g->stop[g->n_stop] = mem_strndup(MEM_HTTP, json_string_value(s), len)))
            return -ENOMEM;
        g->n_stop++;
    }
    return 0;
}

/* prompt: a string, or token ids, or a one-element array of either. */
static int http_parse_prompt(json_t *o, struct http_gen *g, struct http_err *err) {
    json_t *p = http_get(o, "prompt");
    if (!p) {
        http_err_set(err, 400, "missing_required_parameter", "prompt",
                     "you must provide a 'prompt'");
        return -EINVAL;
    }
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* ["text"] or [[ids]] */
    if (json_is_string(p)) {
        g->prompt_len = json_string_length(p);
        g->prompt = mem_strndup(MEM_HTTP, json_string_value(p), g->prompt_len);
        return g->prompt ? 0 : -ENOMEM;
    }
    if (!json_is_array(p))
        return http_bad_type(err, "prompt", "a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0)
        return http_bad_value(err, "prompt", "must not be empty");
    if (n > UINT32_MAX)
        return http_bad_value(err, "prompt", "is too long");
    for (size_t i = 0; i < n; i++)
        if (!json_is_integer(json_array_get(p, i))) {
            if (json_is_string(json_array_get(p, i)) || json_is_array(json_array_get(p, i)))
                return http_unsupported(err, "prompt", "one prompt per request (n = 1)");
            return http_bad_type(err, "prompt", "a string or an array of token ids");
        }
    g->ids = mem_alloc(MEM_HTTP, n * sizeof(*g->ids));
    if (!g->ids)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        long long id = json_integer_value(json_array_get(p, i));
        if (id < 0 || id > INT32_MAX)
            return http_bad_value(err, "prompt", "has a token id out of range");
        g->ids[i] = (int32_t)id;
    }
    g->n_ids = (uint32_t)n;
    return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":...}
 * parts, joined. Assistant turns may have null content. */
static int http_parse_content(json_t *msg, size_t i, struct http_buf *b, struct http_err *err) {
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu].content", i);
    json_t *c = json_object_get(msg, "content");
    if (json_is_null(c) || !c)
        return 0;
    if (json_is_string(c)) {
        http_buf_add(b, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        return http_bad_type(err, param, "a string or an array of text parts");
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            return http_unsupported(err, param, "only text parts");
        if (!json_is_string(text))
            return http_bad_type(err, param, "text parts with a string 'text'");
        http_buf_add(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

static int http_parse_messages(const struct http_model *m, json_t *o, struct http_gen *g,
                               struct http_err *err) {
    json_t *ms = http_get(o, "messages");
    if (!ms) {
        http_err_set(err, 400, "missing_required_parameter", "messages",
                     "you must provide 'messages'");
        return -EINVAL;
    }
    if (!json_is_array(ms))
        return http_bad_type(err, "messages", "an array of messages");
    size_t n = json_array_size(ms);
    if (n == 0)
        return http_bad_value(err, "messages", "must not be empty");
    if (n > UINT32_MAX)
        return http_bad_value(err, "messages", "are too many");
    struct http_msg *msgs = mem_calloc(MEM_HTTP, n, sizeof(*msgs));
    struct http_buf *texts = mem_calloc(MEM_HTTP, n, sizeof(*texts));
    int rc = msgs && texts ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *msg = json_array_get(ms, i), *role = json_object_get(msg, "role");
        char param[48];
        snprintf(param, sizeof(param), "messages[%zu].role", i);
        if (!json_is_object(msg)) {
            snprintf(param, sizeof(param), "messages[%zu]", i);
            rc = http_bad_type(err, param, "an object");
        } else if (!json_is_string(role)) {
            rc = http_bad_type(err, param, "a string");
        } else if (strcmp(json_string_value(role), "system") == 0 ||
                   strcmp(json_string_value(role), "developer") == 0) {
            msgs[i].role = "system";
        } else if (strcmp(json_string_value(role), "user") == 0) {
            msgs[i].role = "user";
        } else if (strcmp(json_string_value(role), "assistant") == 0) {
            msgs[i].role = "assistant";
        } else {
            rc = http_unsupported(err, param, "roles are system, developer, user, assistant");
        }
        if (rc == 0)
            rc = http_parse_content(msg, i, &texts[i], err);
        if (rc == 0 && texts[i].oom)
            rc = -ENOMEM;
        if (rc == 0) {
            msgs[i].content = texts[i].p ? texts[i].p : "";
            msgs[i].len = texts[i].n;
        }
    }
    if (rc == 0)
        rc = http_chat_prompt(m, msgs, (uint32_t)n, &g->prompt, &g->prompt_len, &g->ids, &g->n_ids);
    for (size_t i = 0; texts && i < n; i++)
        http_buf_free(&texts[i]);
    mem_free(texts);
    mem_free(msgs);
    return rc;
}

static uint64_t http_rand64(void) {
    static atomic_uint_fast64_t ctr;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
                 (uint64_t)atomic_fetch_add(&ctr, 0x9e3779b97f4a7c15ull);
    /* splitmix64's finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int http_parse_sampling(const struct http_model *m, json_t *o, struct http_gen *g,
                               struct http_err *err) {
    long long x;
    bool given;
    const char *mt = "max_tokens";
    if (g->chat && http_get(o, "max_completion_tokens"))
        mt = "max_completion_tokens";
    if (http_int(o, mt, LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given) {
        if (x < 1)
            return http_bad_value(err, mt, "must be at least 1");
        if (x > UINT32_MAX)
            return http_bad_value(err, mt, "is too large");
        if (m->n_ctx && x > m->n_ctx) {
            http_err_set(err, 400, "invalid_value", mt,
                         "'%s' is %lld, more than the context of %u tokens", mt, x, m->n_ctx);
            return -EINVAL;
        }
        g->max_tokens = (uint32_t)x;
    }
    if (http_num(o, "temperature", 0, 2, &g->temperature, err) < 0 ||
        http_num(o, "top_p", 0, 1, &g->top_p, err) < 0 ||
        http_num(o, "min_p", 0, 1, &g->min_p, err) < 0)
        return -EINVAL;
    if (http_get(o, "top_p") && g->top_p <= 0)
        return http_bad_value(err, "top_p", "must be in (0, 1]");
    if (http_int(o, "top_k", -1, INT32_MAX, &x, &given, err) < 0)
        return -EINVAL;
    g->top_k = given && x > 0 ? (int)x : 0;
    g->seed = http_rand64();
    if (http_int(o, "seed", LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given)
        g->seed = (uint64_t)x;
    if (http_int(o, "priority", INT32_MIN, INT32_MAX, &x, &given, err) < 0)
        return -EINVAL;
    g->priority = given ? (int32_t)x : 0;
    return 0;
}

int http_gen_parse(const struct http_model *m, bool chat, const char *body, size_t len,
                   struct http_gen *g, struct http_err *err) {
    *g = (struct http_gen){
        .chat = chat, .temperature = 1.0f, .top_p = 1.0f, .max_tokens = chat ? 0 : 16};
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        if (json_error_code(&je) == json_error_invalid_utf8)
            http_err_set(err, 400, "invalid_utf8", NULL,
                         "the request body is not valid UTF-8 (near byte %d)", je.position);
        else
            http_err_set(err, 400, "invalid_json", NULL,
                         "could not parse the JSON body: %s (line %d, column %d)", je.text, je.line,
                         je.column);
        return -EINVAL;
    }
    int rc = 0;
    json_t *model = http_get(o, "model"), *v;
    if (!json_is_object(o)) {
        http_err_set(err, 400, "invalid_type", NULL, "the request body must be a JSON object");
        rc = -EINVAL;
    } else if (model && !json_is_string(model)) {
        rc = http_bad_type(err, "model", "a string");
    } else if (model && strcmp(json_string_value(model), m->name) != 0) {
        http_err_set(err, 404, "model_not_found", "model",
                     "the model '%s' does not exist (this server serves '%s')",
                     json_string_value(model), m->name);
        rc = -EINVAL;
    }
    if (rc == 0)
        rc = http_refuse_unsupported(o, chat, err);
    if (rc == 0)
        rc = http_bool(o, "stream", &g->stream, err);
    if (rc == 0 && (v = http_get(o, "stream_options"))) {
        if (!json_is_object(v))
            rc = http_bad_type(err, "stream_options", "an object");
        else
            rc = http_bool(v, "include_usage", &g->include_usage, err);
    }
    if (rc == 0)
        rc = http_parse_sampling(m, o, g, err);
    if (rc == 0 && (v = http_get(o, "cache_salt"))) {
        if (!json_is_string(v))
            rc = http_bad_type(err, "cache_salt", "a string");
        else if (json_string_length(v) == 0 || json_string_length(v) > HTTP_MAX_SALT_BYTES)
            rc = http_bad_value(err, "cache_salt", "must be 1 to 256 bytes long");
        else if (!(g->cache_salt =
                       mem_strndup(MEM_HTTP, json_string_value(v), json_string_length(v))))
            rc = -ENOMEM;
        else
            g->cache_salt_len = json_string_length(v);
    }
    if (rc == 0)
        rc = http_parse_stop(o, g, err);
    if (rc == 0)
        rc = chat ? http_parse_messages(m, o, g, err) : http_parse_prompt(o, g, err);
    json_decref(o);
    if (rc == -ENOMEM)
        http_err_set(err, 500, "out_of_memory", NULL, "the server is out of memory");
    if (rc < 0)
        http_gen_free(g);
    return rc;
}

void http_gen_free(struct http_gen *g) {
    mem_free(g->prompt);
    mem_free(g->ids);
    for (uint32_t i = 0; i < g->n_stop; i++)
        mem_free(g->stop[i]);
    mem_free(g->cache_salt);
    mem_free(g->ns);
    *g = (struct http_gen){0};
}

int http_gen_request(struct http_gen *g, uint32_t tenant, struct llmd_request *q) {
    *q = (struct llmd_request){
        .prompt = g->prompt,
        .prompt_len = g->prompt_len,
        .prompt_ids = g->ids,
        .n_prompt_ids = g->n_ids,
        .max_tokens = g->max_tokens,
        .temperature = g->temperature,
        .top_k = g->top_k,
        .top_p = g->top_p,
        .min_p = g->min_p,
        .seed = g->seed,
        .stop = (const char *const *)g->stop,
        .n_stop = g->n_stop,
        .tenant = tenant,
        .priority = g->priority,
    };
    if (!g->cache_salt)
        return 0;
    /* the tenant's own namespace (the engine's default: its id, 4 bytes
     * little-endian), narrowed by the salt: never another tenant's */
    static const char sep[] = "\0cache_salt:";
    size_t n_sep = sizeof(sep) - 1;
    g->ns_len = 4 + n_sep + g->cache_salt_len;
    if (!(g->ns = mem_alloc(MEM_HTTP, g->ns_len)))
        return -ENOMEM;
    for (int i = 0; i < 4; i++)
        g->ns[i] = (uint8_t)(tenant >> (8 * i));
    memcpy(g->ns + 4, sep, n_sep);
    memcpy(g->ns + 4 + n_sep, g->cache_salt, g->cache_salt_len);
    q->cache_ns = g->ns;
    q->cache_ns_len = g->ns_len;
    return 0;
}

/* --- responses ------------------------------------------------------------ */

const char *http_finish_reason(enum llmd_finish f) {
    switch (f) {
    case LLMD_FINISH_STOP:
    case LLMD_FINISH_EOS:
        return "stop";
    case LLMD_FINISH_LENGTH:
    case LLMD_FINISH_CONTEXT:
        return "length";
    case LLMD_FINISH_KV_BUDGET: /* not OpenAI's: told apart from max_tokens on purpose */
        return "kv_budget";
    default:
        return NULL;
    }
}

static json_t *http_usage(const struct serve_progress *p) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)p->prompt_tokens,
                     "completion_tokens", (json_int_t)p->completion_tokens, "total_tokens",
                     (json_int_t)p->prompt_tokens + (json_int_t)p->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", (json_int_t)p->cached_tokens);
}

static json_t *http_head(const struct http_meta *m, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object", object, "created",
                     (json_int_t)m->created, "model", m->model);
}

json_t *http_resp_full(const struct http_meta *m, const char *text, size_t len,
                       const struct serve_progress *p) {
    const char *f = http_finish_reason(p->finish);
    json_t *o = http_head(m, m->chat ? "chat.completion" : "text_completion");
    json_t *choice = m->chat ? json_pack("{s:i, s:{s:s, s:o}, s:n, s:s?}", "index", 0, "message",
                                         "role", "assistant", "content", http_json_str(text, len),
                                         "logprobs", "finish_reason", f)
                             : json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "text",
                                         http_json_str(text, len), "logprobs", "finish_reason", f);
    if (!o || !choice) {
        json_decref(o);
        json_decref(choice);
        return NULL;
    }
    if (json_object_set_new(o, "choices", json_pack("[o]", choice)) < 0 ||
        json_object_set_new(o, "usage", http_usage(p)) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *http_resp_chunk(const struct http_meta *m, const char *text, size_t len, bool role,
                        const char *finish) {
    json_t *o = http_head(m, m->chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice;
    if (m->chat) {
        json_t *delta = json_object();
        if (delta && role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (delta && (len || role))
            json_object_set_new(delta, "content", http_json_str(text, len));
        choice = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "delta", delta, "logprobs",
                           "finish_reason", finish);
    } else {
        choice = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "text", http_json_str(text, len),
                           "logprobs", "finish_reason", finish);
    }
    if (!o || !choice) {
        json_decref(o);
        json_decref(choice);
        return NULL;
    }
    if (json_object_set_new(o, "choices", json_pack("[o]", choice)) < 0 ||
        (m->include_usage && json_object_set_new(o, "usage", json_null()) < 0)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *http_resp_usage_chunk(const struct http_meta *m, const struct serve_progress *p) {
    json_t *o = http_head(m, m->chat ? "chat.completion.chunk" : "text_completion");
    if (!o || json_object_set_new(o, "choices", json_array()) < 0 ||
        json_object_set_new(o, "usage", http_usage(p)) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}
