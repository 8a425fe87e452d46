/* http_openai.c - the OpenAI request and response bodies.
 *
 * Sources: the OpenAI API reference for /v1/completions and
 * /v1/chat/completions (the response and chunk objects, the error object).
 * The fields a request shares with `llmd batch` are validated by req.c
 * (strict where a wrong value would silently change the output: 400 naming
 * the parameter); this file adds serve's own (model, stream, messages) and
 * leaves fields nobody knows ignored, as vLLM does, so newer clients keep
 * working; JSON null means "not given", as in the OpenAI API.
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

/* A JSON string of len bytes (s may be NULL when len is 0: a chunk that
 * carries only logprobs); invalid UTF-8 (never expected from the engine,
 * which emits whole characters) becomes U+FFFD byte by byte. NULL: no
 * memory. */
static json_t *http_json_str(const char *s, size_t len) {
    json_t *j = json_stringn(len ? s : "", len);
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

void http_err_from_req(struct http_err *e, const struct req_err *re) {
    http_err_set(e, 400, re->code, re->param[0] ? re->param : NULL, "%s", re->message);
}

/* A message's content: a string, or an array of {"type":"text","text":...}
 * parts, joined. Only assistant turns may have null (or no) content, as in
 * OpenAI's API (one that called a tool has none). */
static int http_parse_content(json_t *msg, size_t i, const char *role, struct http_buf *b,
                              struct req_err *err) {
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu].content", i);
    json_t *c = json_object_get(msg, "content");
    if ((json_is_null(c) || !c) && strcmp(role, "assistant") != 0)
        return req_err_set(err, "missing_required_parameter", param,
                           "'%s' is required: only an assistant message may have no content",
                           param);
    if (json_is_null(c) || !c)
        return 0;
    if (json_is_string(c)) {
        http_buf_add(b, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        return req_err_type(err, param, "a string or an array of text parts");
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            return req_err_unsupported(err, param, "only text parts");
        if (!json_is_string(text))
            return req_err_type(err, param, "text parts with a string 'text'");
        http_buf_add(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

static int http_parse_messages(const struct http_model *m, json_t *o, struct http_gen *g,
                               struct req_err *err) {
    json_t *ms = req_get(o, "messages");
    if (!ms)
        return req_err_set(err, "missing_required_parameter", "messages",
                           "you must provide 'messages'");
    if (!json_is_array(ms))
        return req_err_type(err, "messages", "an array of messages");
    size_t n = json_array_size(ms);
    if (n == 0)
        return req_err_value(err, "messages", "must not be empty");
    if (n > UINT32_MAX)
        return req_err_value(err, "messages", "are too many");
    struct http_msg *msgs = mem_calloc(MEM_HTTP, n, sizeof(*msgs));
    struct http_buf *texts = mem_calloc(MEM_HTTP, n, sizeof(*texts));
    int rc = msgs && texts ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *msg = json_array_get(ms, i), *role = json_object_get(msg, "role");
        char param[48];
        snprintf(param, sizeof(param), "messages[%zu].role", i);
        if (!json_is_object(msg)) {
            snprintf(param, sizeof(param), "messages[%zu]", i);
            rc = req_err_type(err, param, "an object");
        } else if (!json_is_string(role)) {
            rc = req_err_type(err, param, "a string");
        } else if (strcmp(json_string_value(role), "system") == 0 ||
                   strcmp(json_string_value(role), "developer") == 0) {
            msgs[i].role = "system";
        } else if (strcmp(json_string_value(role), "user") == 0) {
            msgs[i].role = "user";
        } else if (strcmp(json_string_value(role), "assistant") == 0) {
            msgs[i].role = "assistant";
        } else {
            rc = req_err_unsupported(err, param, "roles are system, developer, user, assistant");
        }
        if (rc == 0)
            rc = http_parse_content(msg, i, msgs[i].role, &texts[i], err);
        if (rc == 0 && texts[i].oom)
            rc = -ENOMEM;
        if (rc == 0) {
            msgs[i].content = texts[i].p ? texts[i].p : "";
            msgs[i].len = texts[i].n;
        }
    }
    struct req_fields *f = &g->f;
    if (rc == 0)
        rc = http_chat_prompt(m, msgs, (uint32_t)n, &f->prompt, &f->prompt_len, &f->ids, &f->n_ids);
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

int http_gen_parse(const struct http_model *m, bool chat, const char *body, size_t len,
                   struct http_gen *g, struct http_err *err) {
    /* OpenAI's defaults; a missing seed is random */
    *g = (struct http_gen){.chat = chat,
                           .f = {.temperature = 1.0f,
                                 .top_p = 1.0f,
                                 .max_tokens = chat ? 0 : 16,
                                 .seed = http_rand64()}};
    struct req_err re;
    json_t *o = req_load(body, len, REQ_SRC_BODY, &re);
    if (!o) {
        http_err_from_req(err, &re);
        return -EINVAL;
    }
    int rc = 0;
    json_t *model = req_get(o, "model"), *v;
    if (model && !json_is_string(model)) {
        rc = req_err_type(&re, "model", "a string");
    } else if (model && strcmp(json_string_value(model), m->name) != 0) {
        http_err_set(err, 404, "model_not_found", "model",
                     "the model '%s' does not exist (this server serves '%s')",
                     json_string_value(model), m->name);
        json_decref(o);
        http_gen_free(g);
        return -EINVAL;
    }
    const struct req_opts opt = {.n_ctx = m->n_ctx, .n_vocab = m->n_vocab, .chat = chat};
    if (rc == 0)
        rc = req_parse(o, &opt, &g->f, &re);
    if (rc == 0)
        rc = req_bool(o, "stream", &g->stream, &re);
    if (rc == 0 && (v = req_get(o, "stream_options"))) {
        if (!json_is_object(v))
            rc = req_err_type(&re, "stream_options", "an object");
        else
            rc = req_bool(v, "include_usage", &g->include_usage, &re);
    }
    if (rc == 0 && chat)
        rc = http_parse_messages(m, o, g, &re);
    json_decref(o);
    if (rc == -ENOMEM)
        http_err_set(err, 500, "out_of_memory", NULL, "the server is out of memory");
    else if (rc < 0)
        http_err_from_req(err, &re);
    if (rc < 0)
        http_gen_free(g);
    return rc;
}

void http_gen_free(struct http_gen *g) {
    req_fields_free(&g->f);
    *g = (struct http_gen){0};
}

int http_gen_request(struct http_gen *g, uint32_t tenant, struct llmd_request *q) {
    return req_request(&g->f, tenant, NULL, 0, q);
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

/* OpenAI's usage object; with speculative decoding on for the request,
 * an llmd extension beside it: "speculative": {"draft_tokens": drafted and
 * verified, "accepted_tokens": of which accepted (and in
 * completion_tokens)}. */
static json_t *http_usage(const struct serve_progress *p) {
    json_t *u = json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)p->prompt_tokens,
                          "completion_tokens", (json_int_t)p->completion_tokens, "total_tokens",
                          (json_int_t)p->prompt_tokens + (json_int_t)p->completion_tokens,
                          "prompt_tokens_details", "cached_tokens", (json_int_t)p->cached_tokens);
    if (u && p->speculative &&
        json_object_set_new(u, "speculative",
                            json_pack("{s:I, s:I}", "draft_tokens",
                                      (json_int_t)p->spec_draft_tokens, "accepted_tokens",
                                      (json_int_t)p->spec_accepted_tokens)) < 0) {
        json_decref(u);
        return NULL;
    }
    return u;
}

/* A choice's "logprobs": JSON null when not asked; else the records
 * lp[0..n) in the endpoint's shape (req_lp_completion: the legacy arrays,
 * text_offset counting from *off; req_lp_chat: {"content": [...]}). */
static json_t *http_logprobs(const struct http_meta *m, const char *lp, size_t n, size_t *off) {
    if (!m->logprobs)
        return json_null();
    if (m->chat) {
        json_t *c = req_lp_chat(lp, n);
        return c ? json_pack("{s:o}", "content", c) : NULL;
    }
    json_t *o = json_object();
    if (o && req_lp_completion(o, lp, n, off) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *http_head(const struct http_meta *m, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object", object, "created",
                     (json_int_t)m->created, "model", m->model);
}

void http_usage_sum(const struct serve_progress *p, uint32_t n, struct serve_progress *out) {
    *out = n ? p[0] : (struct serve_progress){0};
    for (uint32_t i = 1; i < n; i++) {
        out->completion_tokens += p[i].completion_tokens;
        out->spec_draft_tokens += p[i].spec_draft_tokens;
        out->spec_accepted_tokens += p[i].spec_accepted_tokens;
        out->speculative |= p[i].speculative;
    }
}

/* Choice i of a whole answer. */
static json_t *http_choice_json(const struct http_meta *m, const struct http_choice *c,
                                uint32_t i) {
    const char *f = http_finish_reason(c->finish);
    size_t off = 0;
    if (m->chat)
        return json_pack("{s:I, s:{s:s, s:o}, s:o, s:s?}", "index", (json_int_t)i, "message",
                         "role", "assistant", "content", http_json_str(c->text, c->len), "logprobs",
                         http_logprobs(m, c->lp, c->n_lp, &off), "finish_reason", f);
    return json_pack("{s:I, s:o, s:o, s:s?}", "index", (json_int_t)i, "text",
                     http_json_str(c->text, c->len), "logprobs",
                     http_logprobs(m, c->lp, c->n_lp, &off), "finish_reason", f);
}

json_t *http_resp_full(const struct http_meta *m, const struct http_choice *c, uint32_t n,
                       const struct serve_progress *usage) {
    json_t *o = http_head(m, m->chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (uint32_t i = 0; o && choices && i < n; i++)
        if (json_array_append_new(choices, http_choice_json(m, &c[i], i)) < 0) {
            json_decref(choices);
            choices = NULL;
        }
    if (!o || !choices || json_object_set_new(o, "choices", choices) < 0 ||
        json_object_set_new(o, "usage", http_usage(usage)) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *http_resp_chunk(const struct http_meta *m, uint32_t index, const char *text, size_t len,
                        bool role, const char *finish, const char *lp, size_t n_lp,
                        size_t *text_offset) {
    size_t off0 = 0;
    if (!text_offset)
        text_offset = &off0;
    json_t *o = http_head(m, m->chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice;
    if (m->chat) {
        json_t *delta = json_object();
        if (delta && role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (delta && (len || role))
            json_object_set_new(delta, "content", http_json_str(text, len));
        choice = json_pack("{s:I, s:o, s:o, s:s?}", "index", (json_int_t)index, "delta", delta,
                           "logprobs", n_lp ? http_logprobs(m, lp, n_lp, text_offset) : json_null(),
                           "finish_reason", finish);
    } else {
        choice = json_pack("{s:I, s:o, s:o, s:s?}", "index", (json_int_t)index, "text",
                           http_json_str(text, len), "logprobs",
                           n_lp ? http_logprobs(m, lp, n_lp, text_offset) : json_null(),
                           "finish_reason", finish);
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
