/* http_server.c - libmicrohttpd set-up, routing, request bodies, errors and
 * shutdown for `llmd serve` (see engine/serve/http.h for the model).
 *
 * libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION
 * with an internal poll() listener), so a request thread may block: on the
 * engine thread's answer to its submission, on its request's condvar. That
 * costs a thread (and its mostly untouched stack) per connection; at the
 * hundreds of concurrent streams one CPU engine serves, it is the simplest
 * correct design. --max-connections bounds it.
 *
 * The access handler is called first with the headers only: routing,
 * method, authentication, Content-Length and draining are decided there, so
 * a refused request with a body is answered before its body is read
 * (libmicrohttpd then closes the connection). Then it is called with pieces
 * of the body, kept up to max_body_bytes, and last with none: the request
 * runs. A request without a body (the GET endpoints, most refusals of
 * them) is answered in that last call: libmicrohttpd closes the connection
 * after any answer queued before the request was read in full, and a
 * health checker or scraper should keep its connection.
 *
 * Every error is an OpenAI error object (http_err_json) with the status of
 * docs/serving.md; the server goes on serving whatever a client sends.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/serve/admin.h"
#include "engine/serve/http_impl.h"
#include "log.h"
#include "mem.h"

#define HTTP_DEFAULT_MAX_BODY (4ull << 20)
#define HTTP_DEFAULT_MAX_CONN 512
#define HTTP_DEFAULT_IDLE_S   120
#define HTTP_LISTEN_BACKLOG   511
#define HTTP_STOP_FLUSH_NS    (2ull * 1000 * 1000 * 1000) /* answers of cancelled requests */

enum http_route {
    HTTP_R_HEALTH = 1,
    HTTP_R_METRICS,
    HTTP_R_MODELS,
    HTTP_R_MODEL, /* /v1/models/{id} */
    HTTP_R_COMPLETIONS,
    HTTP_R_CHAT,
};

static uint64_t http_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- responses ------------------------------------------------------------ */

static enum MHD_Result http_send(struct http_server *s, struct MHD_Connection *c, unsigned status,
                                 const char *ctype, const char *body, size_t len,
                                 const struct http_err *e) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (e && e->status == 429) {
        char v[16];
        snprintf(v, sizeof(v), "%u", e->retry_after_s ? e->retry_after_s : 1);
        MHD_add_response_header(r, "Retry-After", v);
    }
    if (e && e->status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (e && e->allow)
        MHD_add_response_header(r, "Allow", e->allow);
    if (atomic_load(&s->draining)) /* send keep-alive clients to another replica */
        MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES)
        http_count_response(s, status);
    return ret;
}

/* Send j (consumed) as application/json. */
static enum MHD_Result http_send_json(struct http_server *s, struct MHD_Connection *c,
                                      unsigned status, json_t *j, const struct http_err *e) {
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body)
        return MHD_NO;
    enum MHD_Result ret = http_send(s, c, status, "application/json", body, strlen(body), e);
    free(body); /* jansson's allocator */
    return ret;
}

static enum MHD_Result http_send_err(struct http_server *s, struct MHD_Connection *c,
                                     const struct http_err *e) {
    return http_send_json(s, c, e->status, http_err_json(e), e);
}

/* --- GET endpoints --------------------------------------------------------- */

static enum MHD_Result http_health(struct http_server *s, struct MHD_Connection *c) {
    struct serve_metrics m;
    serve_loop_metrics(s->loop, &m);
    const char *st = m.broken ? "error" : atomic_load(&s->draining) ? "draining" : "ready";
    return http_send_json(s, c, strcmp(st, "ready") == 0 ? 200 : 503,
                          json_pack("{s:s}", "status", st), NULL);
}

static enum MHD_Result http_metrics(struct http_server *s, struct MHD_Connection *c) {
    struct serve_metrics m;
    uint64_t responses[HTTP_N_CODES];
    serve_loop_metrics(s->loop, &m);
    for (int i = 0; i < HTTP_N_CODES; i++)
        responses[i] = atomic_load(&s->responses[i]);
    struct http_buf b = {0};
    http_metrics_format(&b, &m, &s->info, s->model.name, responses, s->cfg.no_vllm_metrics);
    enum MHD_Result ret =
        b.oom ? MHD_NO
              : http_send(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.n, NULL);
    http_buf_free(&b);
    return ret;
}

static json_t *http_model_json(struct http_server *s) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", s->model.name, "object", "model", "created",
                          (json_int_t)s->started, "owned_by", "llmd");
    if (o && s->model.n_ctx)
        json_object_set_new(o, "max_model_len", json_integer(s->model.n_ctx));
    return o;
}

static enum MHD_Result http_models(struct http_server *s, struct MHD_Connection *c,
                                   const char *id) {
    if (!id) {
        json_t *m = http_model_json(s);
        return http_send_json(
            s, c, 200, m ? json_pack("{s:s, s:[o]}", "object", "list", "data", m) : NULL, NULL);
    }
    if (strcmp(id, s->model.name) != 0) {
        struct http_err e;
        http_err_set(&e, 404, "model_not_found", "model", "the model '%s' does not exist", id);
        return http_send_err(s, c, &e);
    }
    return http_send_json(s, c, 200, http_model_json(s), NULL);
}

/* --- generation ----------------------------------------------------------- */

static void http_submit_err(const struct http_server *s, int rc, uint32_t retry_after_s,
                            uint32_t prompt_tokens, bool chat, struct http_err *e) {
    const char *what = chat ? "messages" : "prompt";
    struct req_err re;
    switch (rc) {
    case -EAGAIN:
        http_err_set(e, 429, "rate_limit_exceeded", NULL,
                     "the server is at capacity (predicted queue wait over its limit); retry "
                     "after %u s",
                     retry_after_s ? retry_after_s : 1);
        e->retry_after_s = retry_after_s ? retry_after_s : 1;
        break;
    case -E2BIG: /* the words batch uses too */
    case -EINVAL:
        req_err_submit(&re, rc, what, prompt_tokens, &s->info);
        http_err_from_req(e, &re);
        break;
    case -ESHUTDOWN:
        http_err_set(e, 503, "server_shutting_down", NULL, "the server is shutting down");
        break;
    case -ENOMEM:
        http_err_set(e, 503, "out_of_memory", NULL, "the server is out of memory");
        break;
    default:
        http_err_set(e, 500, "engine_error", NULL, "the engine cannot run requests: %s",
                     strerror(-rc));
        break;
    }
}

static void http_meta_init(struct http_server *s, struct http_meta *m, const struct http_gen *g) {
    uint64_t seq = atomic_fetch_add(&s->id_seq, 1);
    *m = (struct http_meta){.created = (long long)time(NULL),
                            .model = s->model.name,
                            .chat = g->chat,
                            .include_usage = g->include_usage,
                            .logprobs = g->f.logprobs};
    snprintf(m->id, sizeof(m->id), "%s-%016llx%08llx", g->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)s->id_salt, (unsigned long long)(seq & 0xffffffffu));
}

/* One choice being gathered for a non-streaming answer. */
struct http_full_choice {
    struct http_buf text, lp;
    struct serve_progress p;
};

/* Cancel every choice (the client left, or a later choice was refused). */
static void http_cancel_all(struct http_server *s, struct http_conn *hc) {
    for (uint32_t i = 0; i < hc->n_req; i++)
        serve_req_cancel(s->loop, hc->req[i]);
}

/* A non-streaming request: wait for the whole text of every choice,
 * answer once. */
static enum MHD_Result http_wait_full(struct http_server *s, struct MHD_Connection *c,
                                      struct http_conn *hc, const struct http_meta *meta) {
    uint32_t n = hc->n_req, left = n;
    struct http_full_choice *ch = mem_calloc(MEM_HTTP, n, sizeof(*ch));
    bool *done = mem_calloc(MEM_HTTP, n, sizeof(*done));
    struct http_choice *out = mem_calloc(MEM_HTTP, n, sizeof(*out));
    struct serve_progress *prog = mem_calloc(MEM_HTTP, n, sizeof(*prog));
    char *buf = NULL;
    size_t cap = 0, k;
    enum MHD_Result ret = MHD_NO;
    struct http_err e;
    bool oom = !ch || !done || !out || !prog;
    for (uint32_t i = 0; !oom && i < n; i++) /* echo: the prompt first */
        http_buf_add(&ch[i].text, meta->echo, meta->n_echo);
    while (!oom && left > 0) {
        uint32_t i = 0;
        if (serve_req_wait_any(s->loop, hc->req, done, n, HTTP_POLL_NS, &i) == -ETIMEDOUT) {
            if (!http_client_gone(c))
                continue;
            http_cancel_all(s, hc);
            goto out; /* nobody to answer */
        }
        serve_req_wait(s->loop, hc->req[i], 0, &buf, &cap, &k, &ch[i].p);
        http_buf_add(&ch[i].text, buf, k);
        if (meta->logprobs) { /* the records of the text so far (all of them at the finish) */
            serve_req_take_lp(s->loop, hc->req[i], &buf, &cap, &k);
            http_buf_add(&ch[i].lp, buf, k);
        }
        if (ch[i].p.finish != LLMD_FINISH_NONE) {
            done[i] = true;
            left--;
        }
    }
    enum llmd_finish bad = LLMD_FINISH_NONE; /* a choice without a finish reason */
    for (uint32_t i = 0; !oom && i < n; i++) {
        oom |= ch[i].text.oom || ch[i].lp.oom;
        out[i] = (struct http_choice){.text = ch[i].text.p ? ch[i].text.p : "",
                                      .len = ch[i].text.n,
                                      .lp = ch[i].lp.p,
                                      .n_lp = ch[i].lp.n,
                                      .finish = ch[i].p.finish};
        prog[i] = ch[i].p;
        if (!http_finish_reason(ch[i].p.finish) && bad != LLMD_FINISH_ERROR)
            bad = ch[i].p.finish;
    }
    if (oom) {
        http_cancel_all(s, hc);
        http_err_set(&e, 500, "out_of_memory", NULL, "the server is out of memory");
        ret = http_send_err(s, c, &e);
    } else if (bad == LLMD_FINISH_NONE) {
        struct serve_progress usage;
        http_usage_sum(prog, n, &usage);
        ret = http_send_json(s, c, 200, http_resp_full(meta, out, n, &usage), NULL);
    } else if (bad == LLMD_FINISH_CANCELLED) {
        http_err_set(&e, 503, "cancelled", NULL,
                     "the request was cancelled (the server is shutting down)");
        ret = http_send_err(s, c, &e);
    } else {
        http_err_set(&e, 500, "engine_error", NULL, "the engine failed while running this request");
        ret = http_send_err(s, c, &e);
    }
out:
    for (uint32_t i = 0; ch && i < n; i++) {
        http_buf_free(&ch[i].text);
        http_buf_free(&ch[i].lp);
    }
    mem_free(buf);
    mem_free(ch);
    mem_free(done);
    mem_free(out);
    mem_free(prog);
    return ret;
}

/* The marker that asks serve_req_submit() for the prompt's logprobs: the
 * loop puts its own callback in its place, so this never runs. */
static void http_prompt_wanted(void *user, uint64_t id, uint32_t pos, int32_t token,
                               const struct llmd_logprobs *lp) {
    (void)user, (void)id, (void)pos, (void)token, (void)lp;
}

struct http_echo_ids {
    const int32_t *ids;
    uint32_t n;
    char *text;
    size_t len;
};

/* On the engine thread: the text of a token-id prompt, for echo. */
static int http_echo_ids(struct llmd_engine *e, void *arg) {
    struct http_echo_ids *x = arg;
    return req_ids_text(e, x->ids, x->n, &x->text, &x->len);
}

/* meta->echo for an echo request: the prompt's text as sent, or the text
 * of its token ids. Returns 0, -ENOMEM, -ESHUTDOWN. */
static int http_echo_text(struct http_server *s, const struct http_gen *g, struct http_meta *m) {
    if (!g->f.echo)
        return 0;
    if (g->f.prompt) {
        m->echo = mem_strndup(MEM_HTTP, g->f.prompt, g->f.prompt_len);
        m->n_echo = g->f.prompt_len;
        return m->echo ? 0 : -ENOMEM;
    }
    struct http_echo_ids x = {.ids = g->f.ids, .n = g->f.n_ids};
    int rc = serve_loop_call(s->loop, http_echo_ids, &x);
    m->echo = x.text;
    m->n_echo = x.len;
    return rc;
}

static enum MHD_Result http_generate(struct http_server *s, struct MHD_Connection *c,
                                     struct http_conn *hc) {
    struct http_err e;
    struct http_gen g;
    bool chat = hc->route == HTTP_R_CHAT;
    if (hc->too_big) {
        http_err_set(&e, 413, "request_too_large", NULL, "the request body is over %llu bytes",
                     (unsigned long long)s->cfg.max_body_bytes);
        return http_send_err(s, c, &e);
    }
    if (http_gen_parse(&s->model, chat, hc->body ? hc->body : "", hc->n_body, &g, &e) < 0)
        return http_send_err(s, c, &e);
    struct llmd_request q;
    struct http_meta meta;
    uint32_t retry = 0, prompt_tokens = 0;
    http_meta_init(s, &meta, &g);
    int rc = http_gen_request(&g, hc->tenant, &q);
    if (rc == 0 && g.f.echo && g.f.logprobs)
        q.on_prompt = http_prompt_wanted;
    if (rc == 0)
        rc = http_echo_text(s, &g, &meta);
    /* n choices: n requests of the one prompt, choice i with seed + i; the
     * engine's prefix cache computes the prompt once (its holds) */
    if (rc == 0 && !(hc->req = mem_calloc(MEM_HTTP, g.f.n, sizeof(*hc->req))))
        rc = -ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < g.f.n; i++) {
        q.seed = req_choice_seed(&g.f, i);
        rc = serve_req_submit(s->loop, &q, hc->arrival_ns, &hc->req[i], &retry, &prompt_tokens);
        if (rc == 0 && i > 0)
            serve_req_wake_with(s->loop, hc->req[i], hc->req[0]);
        if (rc == 0)
            hc->n_req++;
    }
    bool stream = g.stream;
    http_gen_free(&g);
    if (rc < 0) {
        http_cancel_all(s, hc); /* the choices submitted before the one refused */
        mem_free(meta.echo);
        http_submit_err(s, rc, retry, prompt_tokens, chat, &e);
        return http_send_err(s, c, &e);
    }
    if (stream)
        return http_sse_start(s, c, hc->req, hc->n_req, &meta);
    enum MHD_Result ret = http_wait_full(s, c, hc, &meta);
    mem_free(meta.echo);
    return ret;
}

/* --- libmicrohttpd callbacks ---------------------------------------------- */

/* The route of (url, method), or 0 with e filled (404, 405). *id: the
 * {id} of /v1/models/{id}. */
static int http_route(const char *url, const char *method, const char **id, struct http_err *e) {
    static const struct {
        const char *path;
        int route;
        bool post;
    } routes[] = {
        {"/health", HTTP_R_HEALTH, false},           {"/metrics", HTTP_R_METRICS, false},
        {"/v1/models", HTTP_R_MODELS, false},        {"/v1/completions", HTTP_R_COMPLETIONS, true},
        {"/v1/chat/completions", HTTP_R_CHAT, true},
    };
    *id = NULL;
    int route = 0;
    bool post = false;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strcmp(url, routes[i].path) == 0) {
            route = routes[i].route;
            post = routes[i].post;
        }
    if (!route && strncmp(url, "/v1/models/", 11) == 0 && url[11]) {
        route = HTTP_R_MODEL;
        *id = url + 11;
    }
    if (!route) {
        http_err_set(e, 404, "not_found", NULL, "no such endpoint: %s %s", method, url);
        return 0;
    }
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (post ? strcmp(method, "POST") != 0 : !get) {
        http_err_set(e, 405, "method_not_allowed", NULL, "%s %s: method not allowed (use %s)",
                     method, url, post ? "POST" : "GET");
        e->allow = post ? "POST" : "GET, HEAD";
        return 0;
    }
    return route;
}

/* True when the request announces no body (no Transfer-Encoding, no
 * Content-Length or 0): the whole request has been read with its headers. */
static bool http_no_body(struct MHD_Connection *c) {
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return !MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) &&
           (!cl || strcmp(cl, "0") == 0);
}

/* True for the routes whose body is read: the POST endpoints. */
static bool http_route_has_body(int route) {
    return route == HTTP_R_COMPLETIONS || route == HTTP_R_CHAT;
}

/* The first call for a request: its headers. Answers at once what can be
 * answered without the body. */
static enum MHD_Result http_on_headers(struct http_server *s, struct MHD_Connection *c,
                                       struct http_conn *hc, const char *url, const char *method) {
    struct http_err e;
    const char *id;
    hc->route = http_route(url, method, &id, &e);
    if (!hc->route)
        goto refuse;
    if (s->keys && strncmp(url, "/v1/", 4) == 0 &&
        http_keys_lookup(s->keys, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
                         &hc->tenant) < 0) {
        http_err_set(&e, 401, "invalid_api_key", NULL,
                     "a valid API key is required: Authorization: Bearer KEY");
        goto refuse;
    }
    if (!http_route_has_body(hc->route))
        return MHD_YES; /* a GET endpoint: answered in the last call (http_answer) */
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
        http_err_set(&e, 413, "request_too_large", NULL, "the request body is over %llu bytes",
                     (unsigned long long)s->cfg.max_body_bytes);
        goto refuse;
    }
    if (atomic_load(&s->draining)) {
        http_err_set(&e, 503, "server_shutting_down", NULL,
                     "the server is draining: it takes no new requests");
        goto refuse;
    }
    return MHD_YES; /* the body comes next */
refuse:
    if (http_no_body(c)) {
        hc->refusal = e; /* answered in the last call: the connection stays open */
        hc->refused = true;
        return MHD_YES;
    }
    hc->answered = true;
    return http_send_err(s, c, &e);
}

/* The last call for a request, with all of it read: answer it. */
static enum MHD_Result http_answer(struct http_server *s, struct MHD_Connection *c,
                                   struct http_conn *hc, const char *url, const char *method) {
    hc->answered = true;
    const char *id;
    struct http_err e;
    if (hc->refused)
        return http_send_err(s, c, &hc->refusal);
    switch (hc->route) {
    case HTTP_R_HEALTH:
        return http_health(s, c);
    case HTTP_R_METRICS:
        return http_metrics(s, c);
    case HTTP_R_MODELS:
    case HTTP_R_MODEL:
        http_route(url, method, &id, &e); /* the route of the first call, and its id */
        return http_models(s, c, id);
    default:
        return http_generate(s, c, hc);
    }
}

static enum MHD_Result http_on_request(void *cls, struct MHD_Connection *c, const char *url,
                                       const char *method, const char *version, const char *upload,
                                       size_t *upload_size, void **con_cls) {
    (void)version;
    struct http_server *s = cls;
    struct http_conn *hc = *con_cls;
    if (!hc) {
        if (!(hc = mem_calloc(MEM_HTTP, 1, sizeof(*hc))))
            return MHD_NO;
        hc->arrival_ns = http_now();
        *con_cls = hc;
        atomic_fetch_add(&s->active, 1);
        return http_on_headers(s, c, hc, url, method);
    }
    if (*upload_size) { /* a piece of the body */
        size_t n = *upload_size;
        *upload_size = 0;
        if (hc->answered || hc->too_big || !http_route_has_body(hc->route))
            return MHD_YES; /* a body nobody reads is not kept */
        if (hc->n_body + n > s->cfg.max_body_bytes) {
            hc->too_big = true; /* chunked uploads: no Content-Length to refuse early */
            mem_free(hc->body);
            hc->body = NULL;
            hc->n_body = hc->cap_body = 0;
            return MHD_YES;
        }
        if (hc->n_body + n > hc->cap_body) {
            size_t cap = hc->cap_body ? hc->cap_body : 4096;
            while (cap < hc->n_body + n)
                cap *= 2;
            char *p = mem_realloc(hc->body, cap);
            if (!p)
                return MHD_NO;
            hc->body = p;
            hc->cap_body = cap;
        }
        memcpy(hc->body + hc->n_body, upload, n);
        hc->n_body += n;
        return MHD_YES;
    }
    if (hc->answered)
        return MHD_YES;
    return http_answer(s, c, hc, url, method);
}

static void http_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
    (void)c;
    struct http_server *s = cls;
    struct http_conn *hc = *con_cls;
    if (!hc)
        return;
    for (uint32_t i = 0; i < hc->n_req; i++) {
        /* aborted, failed write, timeout, shutdown: nobody reads the rest */
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            serve_req_cancel(s->loop, hc->req[i]);
        serve_req_put(s->loop, hc->req[i]);
    }
    mem_free(hc->req);
    mem_free(hc->body);
    mem_free(hc);
    *con_cls = NULL;
    atomic_fetch_sub(&s->active, 1);
}

static void http_on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    LOG_INFO("http", "libmicrohttpd: %s", line); /* mostly clients sending garbage */
}

/* --- start / stop --------------------------------------------------------- */

/* Bind and listen on host:port ourselves, so a failure has its errno. */
static int http_listen(const char *host, uint16_t port, int *fd_out, uint16_t *port_out, bool *v6,
                       char *errbuf, size_t errlen) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0) {
        snprintf(errbuf, errlen, "llmd serve: --host %s: %s (give a numeric address)", host,
                 gai_strerror(gai));
        return -EINVAL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rc = 0;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, HTTP_LISTEN_BACKLOG) < 0)
        rc = -errno;
    *v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (rc == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
        rc = -errno;
    if (rc < 0) {
        snprintf(errbuf, errlen, "llmd serve: cannot listen on %s:%u: %s", host, port,
                 strerror(-rc));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

/* --- the admin socket's view of the server (struct admin_ops) -------------- */

static void http_admin_stats(void *ctx, json_t *server, json_t *answer) {
    struct http_server *s = ctx;
    json_object_set_new(server, "draining", json_boolean(atomic_load(&s->draining)));
    json_t *http = json_object();
    for (int i = 0; http && i < HTTP_N_CODES; i++) {
        char code[16];
        snprintf(code, sizeof(code), "%u", http_codes[i]);
        json_object_set_new(http, http_codes[i] ? code : "other",
                            json_integer((json_int_t)atomic_load(&s->responses[i])));
    }
    json_object_set_new(answer, "http_responses", http);
}

static json_t *http_admin_config(void *ctx) {
    const struct http_server *s = ctx;
    const struct http_config *c = &s->cfg;
    json_t *srv = json_pack(
        "{s:s, s:i, s:s, s:s, s:s, s:b, s:I, s:i, s:i, s:i, s:s?, s:b}", "host", c->host, "port",
        (int)s->port, "model", c->model_path, "served_model_name", s->model.name, "chat_template",
        http_tmpl_name(s->model.tmpl), "api_keys", c->api_keys_path != NULL, "max_body_bytes",
        (json_int_t)c->max_body_bytes, "max_connections", (int)c->max_connections, "idle_timeout_s",
        (int)c->idle_timeout_s, "n_ctx", (int)s->model.n_ctx, "admin_socket", c->admin_socket,
        "vllm_metrics", !c->no_vllm_metrics);
    json_error_t je;
    json_t *eng = c->admin_config ? json_loads(c->admin_config, 0, &je) : json_object();
    if (!eng)
        eng = json_string(c->admin_config);
    return json_pack("{s:o, s:o}", "server", srv, "engine", eng);
}

static int http_admin_tenant_id(void *ctx, const char *name, uint32_t *tenant) {
    const struct http_server *s = ctx;
    return s->keys ? http_keys_tenant_id(s->keys, name, tenant) : -ENOENT;
}

static uint64_t http_admin_drain(void *ctx) {
    struct http_server *s = ctx;
    http_server_drain(s);
    return http_server_live(s);
}

static void http_admin_shutdown(void *ctx) {
    struct http_server *s = ctx;
    s->cfg.admin_shutdown(s->cfg.admin_ctx);
}

int http_server_start(const struct http_config *cfg, struct llmd_engine *e,
                      struct http_server **out, char *errbuf, size_t errlen) {
    int rc = -ENOMEM, fd = -1;
    bool v6 = false;
    struct http_server *s = mem_calloc(MEM_HTTP, 1, sizeof(*s));
    if (!s) {
        snprintf(errbuf, errlen, "llmd serve: out of memory");
        goto fail;
    }
    s->cfg = *cfg;
    if (!s->cfg.host)
        s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_body_bytes)
        s->cfg.max_body_bytes = HTTP_DEFAULT_MAX_BODY;
    if (!s->cfg.max_connections)
        s->cfg.max_connections = HTTP_DEFAULT_MAX_CONN;
    if (!s->cfg.idle_timeout_s)
        s->cfg.idle_timeout_s = HTTP_DEFAULT_IDLE_S;
    s->started = (long long)time(NULL);
    if (getrandom(&s->id_salt, sizeof(s->id_salt), 0) != sizeof(s->id_salt))
        s->id_salt = (uint64_t)s->started ^ ((uint64_t)getpid() << 32);
    if (!cfg->model_path) {
        snprintf(errbuf, errlen, "llmd serve: no model given");
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = http_model_init(&s->model, cfg, errbuf, errlen)) < 0)
        goto fail;
    /* before the engine thread owns e: the limits requests are checked against */
    llmd_engine_info_get(e, &s->info);
    s->model.n_ctx = s->info.n_ctx;
    s->model.n_vocab = s->info.n_vocab;
    if (cfg->api_keys_path &&
        ((rc = http_keys_load(cfg->api_keys_path, &s->keys, errbuf, errlen)) < 0 ||
         (rc = http_keys_apply(s->keys, e, errbuf, errlen)) < 0))
        goto fail;
    if ((rc = http_listen(s->cfg.host, cfg->port, &fd, &s->port, &v6, errbuf, errlen)) < 0)
        goto fail;
    rc = serve_loop_create(e, &s->loop);
    e = NULL; /* the loop owns it now, even on failure */
    if (rc < 0) {
        snprintf(errbuf, errlen, "llmd serve: cannot start the engine thread: %s", strerror(-rc));
        goto fail;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(
        flags, 0, NULL, NULL, http_on_request, s, MHD_OPTION_EXTERNAL_LOGGER, http_on_log, s,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.idle_timeout_s, MHD_OPTION_END);
    if (!s->d) {
        snprintf(errbuf, errlen, "llmd serve: libmicrohttpd did not start (see its message)");
        rc = -EIO;
        goto fail;
    }
    const struct admin_ops ops = {
        .ctx = s,
        .stats = http_admin_stats,
        .config = http_admin_config,
        .tenant_id = http_admin_tenant_id,
        .drain = http_admin_drain,
        .shutdown = cfg->admin_shutdown ? http_admin_shutdown : NULL,
    };
    if (cfg->admin_socket &&
        (rc = admin_start(cfg->admin_socket, s->loop, &ops, &s->admin, errbuf, errlen)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    llmd_engine_close(e);
    http_server_stop(s);
    return rc;
}

uint16_t http_server_port(const struct http_server *s) {
    return s->port;
}

void http_server_drain(struct http_server *s) {
    atomic_store(&s->draining, true);
}

uint64_t http_server_live(struct http_server *s) {
    return serve_loop_live(s->loop);
}

void http_server_stats(struct http_server *s, struct llmd_stats *out) {
    struct serve_metrics m;
    serve_loop_metrics(s->loop, &m);
    *out = m.engine;
}

void http_server_stop(struct http_server *s) {
    if (!s)
        return;
    atomic_store(&s->draining, true);
    admin_stop(s->admin); /* first: it reads everything below */
    if (s->d) {           /* no new connections */
        MHD_socket fd = MHD_quiesce_daemon(s->d);
        if (fd != MHD_INVALID_SOCKET)
            close(fd);
    }
    /* cancel: request threads blocked on a request answer it (503, or an
     * error event). MHD_stop_daemon() shuts every socket down at once, so
     * give those answers a moment to leave first; a client that does not
     * read its answer is bounded by HTTP_STOP_FLUSH_NS */
    if (s->loop)
        serve_loop_close(s->loop);
    for (uint64_t t0 = http_now(); atomic_load(&s->active) && http_now() - t0 < HTTP_STOP_FLUSH_NS;)
        usleep(5000);
    if (s->d)
        MHD_stop_daemon(s->d);
    serve_loop_destroy(s->loop);
    http_keys_destroy(s->keys);
    http_model_fini(&s->model);
    mem_free(s);
}
