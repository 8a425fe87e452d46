/* http_impl.h - what the engine/http_*.c files share; not for users of
 * engine/serve/http.h.
 *
 *   http_server.c   libmicrohttpd setup, routing, bodies, errors, shutdown
 *   http_openai.c   request JSON -> struct http_gen; response JSON
 *   http_chat.c     chat templates: messages -> prompt text or token ids
 *   http_sse.c      `stream: true`: the Server-Sent Events content reader
 *   http_metrics.c  GET /metrics (Prometheus text format 0.0.4)
 *   http_auth.c     the API keys file: key -> tenant
 *   http_conn.c     per-connection: response counts, client gone
 *   http_buf.c      a growing byte buffer
 *
 * The admin socket (admin.c) is not HTTP and does not include this file:
 * http_server.c hands it a struct admin_ops.
 *
 * Threads: the parse/format functions are reentrant; struct http_model and
 * struct http_keys are immutable after start-up and read from every
 * connection thread at once.
 */
#ifndef LLMD_HTTP_IMPL_H
#define LLMD_HTTP_IMPL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/serve/http.h"
#include "engine/serve/req.h"
#include "engine/serve/serve_loop.h"
#include "llmd.h"

struct gguf;
struct tok;
struct MHD_Connection;
struct MHD_Daemon;
struct admin;

/* --- http_buf.c ----------------------------------------------------------- */

/* A growing byte buffer; `oom` sticks once an append failed (later appends
 * do nothing), so callers check once at the end. Always NUL-terminated
 * when p is not NULL. Free with http_buf_free(). */
struct http_buf {
    char *p;
    size_t n, cap; /* bytes */
    bool oom;
};

void http_buf_add(struct http_buf *b, const void *s, size_t n);
void http_buf_puts(struct http_buf *b, const char *s);
void http_buf_printf(struct http_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void http_buf_free(struct http_buf *b);

/* --- errors --------------------------------------------------------------- */

/* An OpenAI-style error: {"error":{"message","type","param","code"}}. */
struct http_err {
    unsigned status;  /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... */
    const char *code; /* NULL: JSON null */
    char param[64];   /* "": JSON null */
    char message[320];
    uint32_t retry_after_s; /* 429: the Retry-After header, seconds (>= 1) */
    const char *allow;      /* 405: the Allow header */
};

/* Fill e: status, code (static or NULL), param (NULL: none), message. */
void http_err_set(struct http_err *e, unsigned status, const char *code, const char *param,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* --- the model as the API sees it ------------------------------------------ */

enum http_tmpl { HTTP_TMPL_PLAIN = 0, HTTP_TMPL_LLAMA2, HTTP_TMPL_CHATML, HTTP_TMPL_LLAMA3 };

/* Special tokens the templates use, looked up in the vocabulary. */
enum http_special {
    HTTP_SP_BOS_TEXT = 0, /* "<s>" */
    HTTP_SP_EOS_TEXT,     /* "</s>" */
    HTTP_SP_IM_START,     /* "<|im_start|>" */
    HTTP_SP_IM_END,       /* "<|im_end|>" */
    HTTP_SP_HDR_START,    /* "<|start_header_id|>" */
    HTTP_SP_HDR_END,      /* "<|end_header_id|>" */
    HTTP_SP_EOT,          /* "<|eot_id|>" */
    HTTP_SP_N,
};

struct http_model {
    char *name;                 /* served model name, owned */
    uint32_t n_ctx;             /* the engine's context, tokens; 0: not checked (tests) */
    uint32_t n_vocab;           /* the engine's vocabulary; 0: ids not checked (tests) */
    enum http_tmpl tmpl;        /* the chat template family */
    struct gguf *gguf;          /* the model file, for tok; NULL for dummy models */
    struct tok *tok;            /* encodes chat prompts with special tokens; may be NULL */
    int32_t special[HTTP_SP_N]; /* vocabulary ids, -1: not a single token (sent as text) */
};

/* Fill m from the config (see struct http_config); n_ctx stays 0 for the
 * caller to set (the engine's context). Returns 0, -EINVAL (an
 * unknown template name), -ENOMEM; a model file that cannot be read for
 * its template is only a warning (the engine already loaded it). */
int http_model_init(struct http_model *m, const struct http_config *cfg, char *errbuf,
                    size_t errlen);
void http_model_fini(struct http_model *m);

/* --- http_chat.c ---------------------------------------------------------- */

/* The template family of a Jinja chat template, by its markers: "<|im_start|>"
 * chatml, "<|start_header_id|>" llama3, "[INST]" llama2, else (or NULL)
 * plain. */
enum http_tmpl http_tmpl_detect(const char *tmpl, size_t len);
const char *http_tmpl_name(enum http_tmpl t);
/* Returns 0 or -EINVAL (unknown name). */
int http_tmpl_from_name(const char *name, enum http_tmpl *out);
/* The vocabulary text of special token sp ("<|im_start|>"). Static. */
const char *http_special_text(enum http_special sp);

struct http_msg {
    const char *role; /* "system", "user" or "assistant" (borrowed) */
    const char *content;
    size_t len; /* bytes of content */
};

/* Called for each piece of a rendered prompt, in order: text, or a special
 * token (sp >= 0, text its vocabulary form). Returns 0 or -errno to stop. */
typedef int (*http_emit_fn)(void *ctx, const char *text, size_t len, int sp);

/* Render messages in template t, ending with the assistant's turn opened.
 * Returns 0 or what emit returned. */
int http_tmpl_render(enum http_tmpl t, const struct http_msg *msgs, uint32_t n, http_emit_fn emit,
                     void *ctx);

/* The prompt of a chat request: text (plain template, or no tokenizer) in
 * *text, or token ids (specials as single tokens, BOS first when the model
 * wants it) in *ids; the other is NULL. Caller frees with mem_free().
 * Returns 0, -ENOMEM. */
int http_chat_prompt(const struct http_model *m, const struct http_msg *msgs, uint32_t n,
                     char **text, size_t *text_len, int32_t **ids, uint32_t *n_ids);

/* --- http_openai.c -------------------------------------------------------- */

/* One validated generation request: the fields batch shares (req.h; for
 * chat, f.prompt or f.ids is the rendered conversation) and serve's own.
 * Owns every pointer. */
struct http_gen {
    bool chat, stream, include_usage;
    struct req_fields f;
};

/* Parse and validate a /v1/completions (chat false) or /v1/chat/completions
 * body: model, stream and messages here, the rest through req_parse() (fields
 * llmd does not know are ignored, as vLLM does). Returns 0, or -EINVAL with
 * *err filled (400 with the parameter, or 404 model_not_found), or -ENOMEM
 * (err filled: 500). On error g holds nothing. */
int http_gen_parse(const struct http_model *m, bool chat, const char *body, size_t len,
                   struct http_gen *g, struct http_err *err);
void http_gen_free(struct http_gen *g);

/* Fill q from g for `tenant`: the namespace is the tenant alone, or the
 * tenant and cache_salt (req_request()). q borrows from g. Returns 0,
 * -ENOMEM. */
int http_gen_request(struct http_gen *g, uint32_t tenant, struct llmd_request *q);

/* e from a req.h error: status 400, type invalid_request_error. */
void http_err_from_req(struct http_err *e, const struct req_err *re);

/* What every response of one request shares. */
struct http_meta {
    char id[48];       /* "cmpl-..." or "chatcmpl-..." */
    long long created; /* Unix seconds */
    const char *model; /* borrowed */
    bool chat;
    bool include_usage; /* stream_options.include_usage */
    bool logprobs;      /* the request asked for log-probabilities */
    char *echo;         /* [n_echo] completions' echo: the prompt's text, before the
                         * completion's (NUL-terminated); NULL: no echo. Owned by the
                         * meta's last holder (http_sse_start() takes it) */
    size_t n_echo;
};

/* "stop" (EOS, stop string), "length" (max_tokens, context), "kv_budget"
 * (the whole KV pool is smaller than the context and the request reached it),
 * NULL otherwise. */
const char *http_finish_reason(enum llmd_finish f);

/* One choice of a whole answer: its text, its log-probability records
 * lp[0..n_lp) (serve_req_take_lp(); shown as its "logprobs" when
 * m->logprobs, else null) and how it finished. Borrowed. */
struct http_choice {
    const char *text;
    size_t len;
    const char *lp;
    size_t n_lp;
    enum llmd_finish finish;
};

/* The usage of the n choices of one prompt, as OpenAI counts it: the
 * prompt once (choice 0's prompt_tokens and cached_tokens), completion and
 * speculative tokens summed over the choices. */
void http_usage_sum(const struct serve_progress *p, uint32_t n, struct serve_progress *out);

/* The whole answer of a non-streaming request: choices c[0..n) with
 * "index" 0..n-1, and usage. NULL on no memory. */
json_t *http_resp_full(const struct http_meta *m, const struct http_choice *c, uint32_t n,
                       const struct serve_progress *usage);
/* One SSE chunk object for choice `index`: text (may be empty), the
 * assistant role (chat's first chunk of a choice), finish_reason (NULL:
 * JSON null), and the records lp[0..n_lp) of the tokens since the choice's
 * last chunk as "logprobs" (null when none; a completion's text_offset
 * counts on from *text_offset, which grows; NULL: from 0). NULL on no
 * memory. */
json_t *http_resp_chunk(const struct http_meta *m, uint32_t index, const char *text, size_t len,
                        bool role, const char *finish, const char *lp, size_t n_lp,
                        size_t *text_offset);
/* The usage-only chunk (stream_options.include_usage). */
json_t *http_resp_usage_chunk(const struct http_meta *m, const struct serve_progress *p);
/* {"error":{...}} for e. */
json_t *http_err_json(const struct http_err *e);

/* --- http_auth.c ---------------------------------------------------------- */

struct http_keys;

/* Parse the keys file (docs/serving.md): lines "KEY TENANT [weight=N]
 * [max_priority=N] [retention_pages=N]", '#' comments. Tenants get ids 1,
 * 2, ... in order of first appearance. Returns 0, -ENOENT/-EACCES (open),
 * -EINVAL (errbuf names the line), -ENOMEM. Caller frees with
 * http_keys_destroy(). */
int http_keys_load(const char *path, struct http_keys **out, char *errbuf, size_t errlen);
void http_keys_destroy(struct http_keys *k);

/* Give the engine every tenant's weight, priority ceiling and retention.
 * Before the engine thread starts. Returns 0 or the engine's -errno. */
int http_keys_apply(const struct http_keys *k, struct llmd_engine *e, char *errbuf, size_t errlen);

/* The tenant of an "Authorization" header value ("Bearer KEY"; NULL when
 * absent). Compares digests in constant time. Returns 0, -EACCES (missing,
 * malformed or unknown key). */
int http_keys_lookup(const struct http_keys *k, const char *authorization, uint32_t *tenant);

/* The engine id of tenant `name` of the keys file. Returns 0, -ENOENT. */
int http_keys_tenant_id(const struct http_keys *k, const char *name, uint32_t *tenant);

/* --- http_metrics.c ------------------------------------------------------- */

/* Response counters by status, for llmd_http_responses_total. */
enum { HTTP_N_CODES = 10 };
extern const unsigned http_codes[HTTP_N_CODES]; /* the statuses counted; the last: others */

/* The /metrics text of m and the engine's configuration info (borrowed) into
 * b; the vllm:* names unless no_vllm. */
void http_metrics_format(struct http_buf *b, const struct serve_metrics *m,
                         const struct llmd_engine_info *info, const char *model,
                         const uint64_t responses[HTTP_N_CODES], bool no_vllm);

/* --- http_server.c / http_sse.c -------------------------------------------- */

struct http_server {
    struct http_config cfg; /* strings borrowed from the caller's config */
    struct MHD_Daemon *d;
    struct serve_loop *loop;
    struct http_keys *keys; /* NULL: no authentication */
    struct admin *admin;    /* NULL: no admin socket (admin.h) */
    struct http_model model;
    struct llmd_engine_info info; /* the engine's, read at start */
    uint16_t port;
    long long started; /* Unix seconds, the models' "created" */
    atomic_bool draining;
    atomic_uint_fast64_t active; /* requests between their headers and their completion */
    atomic_uint_fast64_t id_seq;
    uint64_t id_salt;
    atomic_uint_fast64_t responses[HTTP_N_CODES];
};

/* One HTTP request on a connection (MHD's con_cls). */
struct http_conn {
    int route;
    uint64_t arrival_ns;
    uint32_t tenant;
    bool answered; /* a response is queued */
    bool too_big;  /* the body passed max_body_bytes */
    bool refused;  /* refusal is answered when the request is read in full */
    struct http_err refusal;
    char *body; /* [n_body] */
    size_t n_body, cap_body;
    struct serve_req **req; /* [n_req] the choices: the connection's references, put
                             * when it completes */
    uint32_t n_req;
};

/* http_conn.c: count one response of `status` (any thread). */
void http_count_response(struct http_server *s, unsigned status);

/* True when the client has closed its end of connection c (a peek at the
 * socket; pipelined data counts as alive). */
bool http_client_gone(struct MHD_Connection *c);

/* Answer the choices r[0..n) (r[1..n) wake r[0]: serve_req_wake_with) as
 * one SSE stream on c, their chunks interleaved as their text comes; the
 * reader takes its own references (the caller keeps its own). m is
 * copied, and its echo taken (freed here also on failure).
 * Returns MHD_YES/MHD_NO as enum MHD_Result does. */
int http_sse_start(struct http_server *s, struct MHD_Connection *c, struct serve_req *const *r,
                   uint32_t n, const struct http_meta *m);

/* How long a blocked request thread sleeps between checks of its client. */
#define HTTP_POLL_NS (200ull * 1000 * 1000)

#endif /* LLMD_HTTP_IMPL_H */
