/* req.h - the fields of one generation request, validated in one place for
 * `llmd serve` (an HTTP body) and `llmd batch` (a JSON line).
 *
 * Model: both take OpenAI's completion fields plus vLLM's extensions
 * (docs/serving.md "Request fields"), with the same meaning, the same ranges
 * and the same error for a bad value: an OpenAI error object (code, param,
 * message) that serve answers with 400 and batch writes into the line's
 * output. A field whose value would silently change the answer if ignored
 * (tools, best_of > n) is refused, naming it. Each caller
 * parses its own fields besides (serve: model, stream, messages; batch: id,
 * tenant) and picks the defaults of the rest by filling struct req_fields
 * before req_parse(). JSON null means "not given".
 *
 * Workflow:
 *   json_t *o = req_load(text, len, REQ_SRC_BODY, &err);   // NULL: err says why
 *   struct req_fields f = {.max_tokens = 16, ...defaults};
 *   req_parse(o, &opts, &f, &err);          // then the caller's own fields
 *   req_request(&f, tenant, ns, ns_len, &q); llmd_submit(e, &q, ...);
 *   req_fields_free(&f); json_decref(o);
 *
 * Threads: every function is reentrant; nothing is global. The header is
 * one of the two of engine/serve/ that tools/ may include (docs/architecture.md).
 */
#ifndef LLMD_REQ_H
#define LLMD_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "llmd.h"

#define REQ_MAX_STOP         8   /* llmd_request's limit (OpenAI allows 4) */
#define REQ_MAX_STOP_BYTES   256 /* one stop string; the engine holds back up to this */
#define REQ_MAX_SALT_BYTES   256
#define REQ_TENANT_MAX_BYTES 64   /* a tenant name (keys file, batch "tenant") */
#define REQ_MAX_LOGIT_BIAS   1024 /* logit_bias entries (OpenAI documents no limit) */
#define REQ_MAX_N            128  /* choices of one request ("n"; OpenAI's limit) */

/* An OpenAI-style error, {"message","type","param","code"}: every one of
 * req's is a client's mistake, type "invalid_request_error". */
struct req_err {
    const char *code; /* static: "invalid_type", "invalid_value", ... */
    char param[64];   /* the field; "": none (JSON null) */
    char message[320];
};

/* The validated fields. Owns every pointer; free with req_fields_free(). */
struct req_fields {
    char *prompt; /* [prompt_len] text, or NULL when ids are given or for chat */
    size_t prompt_len;
    int32_t *ids; /* [n_ids] token ids, no BOS added */
    uint32_t n_ids;
    char *stop[REQ_MAX_STOP];
    uint32_t n_stop;
    uint32_t max_tokens; /* 0: up to the context */
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed; /* choice i samples with seed + i (req_choice_seed) */
    uint32_t n;    /* choices, 1..REQ_MAX_N (0 before req_parse: 1); each is an engine
                    * request of its own on the same prompt, which the engine's prefix
                    * cache computes once (docs/serving.md "n") */
    int32_t priority;
    char *cache_salt; /* [cache_salt_len] or NULL */
    size_t cache_salt_len;
    uint8_t *ns; /* the prefix-cache namespace req_request() built; NULL: none */
    size_t ns_len;
    bool no_speculative;     /* "speculative": false (an llmd extension): no drafts for it */
    bool logprobs;           /* completions "logprobs": N, chat "logprobs": true */
    uint32_t top_logprobs;   /* alternatives a token, 0..LLMD_TOP_LOGPROBS_MAX */
    struct llmd_logprobs lp; /* with logprobs: what req_request() points the request's
                              * logprobs at (the engine fills it for each token) */
    bool echo;               /* completions "echo": true: the prompt comes first */
    bool prompt_only;        /* echo with max_tokens 0: the prompt alone (its logprobs) */
    float presence_penalty, frequency_penalty; /* -2..2; 0: off */
    float repetition_penalty;                  /* (0, 2]; 0 (not given) or 1: off */
    int32_t *bias_ids;                         /* [n_bias] logit_bias's token ids ... */
    float *bias;                               /* [n_bias] ... and biases, -100..100 */
    uint32_t n_bias;
    bool ignore_eos;                           /* vLLM's */
    int32_t stop_ids[LLMD_STOP_TOKEN_IDS_MAX]; /* [n_stop_ids] vLLM's stop_token_ids */
    uint32_t n_stop_ids;
};

enum req_src { REQ_SRC_BODY, REQ_SRC_LINE }; /* the words of req_load()'s messages */

/* Parse text[0..len) as one JSON object (duplicate keys refused, NUL in a
 * string refused, strict UTF-8). Returns the object (caller decrefs), or
 * NULL with *err filled: code "invalid_json", "invalid_utf8" or
 * "invalid_type" (valid JSON, not an object). */
json_t *req_load(const char *text, size_t len, enum req_src src, struct req_err *err);

struct req_opts {
    uint32_t n_ctx;         /* max_tokens above it is refused; 0: not checked */
    uint32_t n_vocab;       /* token ids (logit_bias, stop_token_ids) at or above it are
                             * refused naming the id; 0: not checked (the engine refuses) */
    bool chat;              /* a chat body: no "prompt" (the caller's "messages"), and
                             * max_completion_tokens wins over max_tokens */
    bool strict;            /* refuse fields nobody knows (code "unknown_parameter");
                             * false: ignore them, as vLLM does, so newer clients work */
    const char *const *own; /* NULL-terminated: the caller's own fields, known
                             * in strict mode; NULL: none */
};

/* Validate the shared fields of o into *f: what is absent or null keeps the
 * value the caller put there; prompt (not chat) is required. Returns 0,
 * -EINVAL with *err filled, or -ENOMEM (err not filled). On error f holds
 * nothing (it is freed and zeroed, defaults included). */
int req_parse(json_t *o, const struct req_opts *opt, struct req_fields *f, struct req_err *err);

void req_fields_free(struct req_fields *f);

/* The seed of choice i of n: seed + i (mod 2^64), so choice i of an n > 1
 * request samples exactly as a request of its own with that seed. */
static inline uint64_t req_choice_seed(const struct req_fields *f, uint32_t i) {
    return f->seed + i;
}

/* Fill q from f for the engine's tenant id `tenant`, whose prefix-cache
 * namespace is tenant_ns[0..n) (NULL: the engine's own, the id's 4 bytes
 * little-endian). With a cache_salt the namespace is the tenant's followed by
 * "\0cache_salt:" and the salt (built in f->ns): a salt narrows a tenant's
 * namespace and can never reach another tenant's. With f->logprobs,
 * q->logprobs is &f->lp. q borrows from f and tenant_ns. Returns 0, -ENOMEM. */
int req_request(struct req_fields *f, uint32_t tenant, const void *tenant_ns, size_t n,
                struct llmd_request *q);

/* The words of a refused llmd_submit() (its rc) for the field `param`
 * ("prompt", "messages"): -E2BIG says how long the prompt was (prompt_tokens,
 * 0: unknown) against the context or, when that is the smaller, the whole
 * KV pool (code "kv_budget": raise --kv-budget); -EINVAL a value the engine
 * refused. Other errors are the caller's (429, 503, 500). */
void req_err_submit(struct req_err *err, int rc, const char *param, uint32_t prompt_tokens,
                    const struct llmd_engine_info *info);

/* Error helpers for the callers' own fields, in the same words:
 * "'key' must be WHAT" (invalid_type), "'key' WHAT" (invalid_value),
 * "'key' is not supported: WHY" (unsupported_parameter). Each returns -EINVAL. */
int req_err_type(struct req_err *err, const char *key, const char *what);
int req_err_value(struct req_err *err, const char *key, const char *what);
int req_err_unsupported(struct req_err *err, const char *key, const char *why);
/* Any code, param (NULL: none) and message. Returns -EINVAL. */
int req_err_set(struct req_err *err, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The value of key, NULL when absent or JSON null. */
json_t *req_get(json_t *o, const char *key);
/* A boolean field: 0 (absent: *out kept), -EINVAL (not a boolean). */
int req_bool(json_t *o, const char *key, bool *out, struct req_err *err);

/* --- log-probabilities: a request's tokens, recorded on the engine thread
 * (from llmd_request.logprobs, inside on_token) and turned into OpenAI's JSON
 * on another. Records go into a byte buffer, so a caller hands them across
 * threads as it hands text. A buffer is owned by one thread at a time. */
struct req_lp_buf {
    char *p; /* [n] records; caller frees with req_lp_buf_free() */
    size_t n, cap;
    bool oom; /* a push failed: records are missing */
};

/* Append lp (the chosen token and its n_top alternatives, with each token's
 * bytes from llmd_token_bytes(), cut at 256) to b. Call where e may be
 * used: the engine thread, e.g. inside on_token. Returns 0, -ENOMEM (b->oom
 * set; b keeps the whole records before). */
int req_lp_push(struct req_lp_buf *b, const struct llmd_engine *e, const struct llmd_logprobs *lp);
/* Append the prompt's first token, which has no logprob (llmd_prompt_fn's
 * position 0): JSON null in the shapes below. Same rules as req_lp_push(). */
int req_lp_push_first(struct req_lp_buf *b, const struct llmd_engine *e, int32_t token);
void req_lp_buf_free(struct req_lp_buf *b);

/* One decoded record; bytes point into the buffer (valid while it is). */
struct req_lp_item {
    int32_t token;
    float logprob;
    const char *bytes; /* [n_bytes] the token's bytes (may cut a UTF-8 character) */
    uint32_t n_bytes;
};
struct req_lp_rec {
    struct req_lp_item chosen;
    bool none; /* no logprob (the prompt's first token): chosen.logprob means nothing */
    uint32_t n_top;
    struct req_lp_item top[LLMD_TOP_LOGPROBS_MAX];
};

/* The record at buf[*off] of buf[0..n) into *out, moving *off past it.
 * Returns false at the end (or a cut record). */
bool req_lp_next(const char *buf, size_t n, size_t *off, struct req_lp_rec *out);

/* The legacy completions shape (OpenAI's /v1/completions "logprobs"): appends
 * each record of buf[0..n) to lp's arrays "tokens" (strings), "token_logprobs"
 * (numbers), "top_logprobs" ({token: logprob} objects; two alternatives with
 * the same text keep the more likely; both null for a record without a
 * logprob) and "text_offset" (*text_offset, which
 * then grows by the token's bytes: byte offsets into the text), creating
 * them when absent. A token whose bytes are not whole UTF-8 is written
 * "bytes:\xNN..." as OpenAI does. Returns 0, -ENOMEM. */
int req_lp_completion(json_t *lp, const char *buf, size_t n, size_t *text_offset);

/* The chat shape (OpenAI's choices[].logprobs.content): a new array of
 * {token, logprob, bytes: [ints], top_logprobs: [{token, logprob, bytes}]},
 * one per record. NULL on no memory. */
json_t *req_lp_chat(const char *buf, size_t n);

/* The text of token ids[0..n) (echo of a token-id prompt): their bytes
 * (llmd_token_bytes) joined, NUL-terminated, into *out (caller frees with
 * mem_free()), *n_out bytes without the NUL. Call where e may be used (its
 * thread). Returns 0, -ENOMEM. */
int req_ids_text(const struct llmd_engine *e, const int32_t *ids, uint32_t n, char **out,
                 size_t *n_out);

/* A tenant name: 1..REQ_TENANT_MAX_BYTES of [A-Za-z0-9_.-]. */
bool req_tenant_name_ok(const char *s, size_t len);

#endif /* LLMD_REQ_H */
