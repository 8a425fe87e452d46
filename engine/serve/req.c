/* req.c - one generation request's fields: JSON in, validated values or an
 * OpenAI error out (req.h). Shared by serve's bodies (http_openai.c) and
 * batch's lines (tools/llmd_batch.c), so a field means the same and is
 * refused in the same words in both.
 *
 * Sources: the OpenAI API reference for /v1/completions and
 * /v1/chat/completions (request fields, the error object) and vLLM's
 * extensions (top_k, min_p, priority, cache_salt), and llmd's own
 * "speculative" (false: no speculative decoding for it). Parsing is strict where a
 * wrong value would silently change the output (types, ranges, best_of > n,
 * tools: refused naming the parameter); whether a field
 * nobody knows is refused or ignored is the caller's choice (strict).
 * logprobs: the fields here, and the records (req_lp_*) both callers turn
 * into OpenAI's shapes, so serve's answer and batch's line agree.
 */
#include "engine/serve/req.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

/* --- errors --------------------------------------------------------------- */

int req_err_set(struct req_err *err, const char *code, const char *param, const char *fmt, ...) {
    err->code = code;
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

int req_err_type(struct req_err *err, const char *key, const char *what) {
    return req_err_set(err, "invalid_type", key, "'%s' must be %s", key, what);
}

int req_err_value(struct req_err *err, const char *key, const char *what) {
    return req_err_set(err, "invalid_value", key, "'%s' %s", key, what);
}

int req_err_unsupported(struct req_err *err, const char *key, const char *why) {
    return req_err_set(err, "unsupported_parameter", key, "'%s' is not supported: %s", key, why);
}

/* --- JSON ----------------------------------------------------------------- */

json_t *req_load(const char *text, size_t len, enum req_src src, struct req_err *err) {
    const char *what = src == REQ_SRC_LINE ? "line" : "request body";
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        if (json_error_code(&je) == json_error_invalid_utf8)
            req_err_set(err, "invalid_utf8", NULL, "the %s is not valid UTF-8 (near byte %d)", what,
                        je.position);
        else if (src == REQ_SRC_LINE) /* one line: its column says where */
            req_err_set(err, "invalid_json", NULL, "could not parse the JSON line: %s (column %d)",
                        je.text, je.column);
        else
            req_err_set(err, "invalid_json", NULL,
                        "could not parse the JSON body: %s (line %d, column %d)", je.text, je.line,
                        je.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        req_err_set(err, "invalid_type", NULL, "the %s must be a JSON object", what);
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *req_get(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* A number in [lo, hi] (absent: keep *out). */
static int req_num(json_t *o, const char *key, double lo, double hi, float *out,
                   struct req_err *err) {
    json_t *v = req_get(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return req_err_type(err, key, "a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return req_err_set(err, "invalid_value", key, "'%s' must be in [%g, %g]", key, lo, hi);
    *out = (float)d;
    return 0;
}

/* An integer in [lo, hi]; *given tells whether it was there. */
static int req_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                   bool *given, struct req_err *err) {
    json_t *v = req_get(o, key);
    if (given)
        *given = v != NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return req_err_type(err, key, "an integer");
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return req_err_set(err, "invalid_value", key, "'%s' must be in [%lld, %lld], not %lld", key,
                           lo, hi, x);
    *out = x;
    return 0;
}

int req_bool(json_t *o, const char *key, bool *out, struct req_err *err) {
    json_t *v = req_get(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return req_err_type(err, key, "a boolean");
    *out = json_is_true(v);
    return 0;
}

/* --- the fields ------------------------------------------------------------ */

/* Fields llmd knows (beyond the caller's own), for strict mode. */
static const char *const req_known[] = {"prompt",
                                        "max_tokens",
                                        "max_completion_tokens",
                                        "temperature",
                                        "top_p",
                                        "min_p",
                                        "top_k",
                                        "seed",
                                        "priority",
                                        "stop",
                                        "cache_salt",
                                        "speculative",
                                        "ignore_eos",
                                        "stop_token_ids",
                                        "user",
                                        "n",
                                        "best_of",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "repetition_penalty",
                                        "logprobs",
                                        "top_logprobs",
                                        "logit_bias",
                                        "echo",
                                        "suffix",
                                        "tools",
                                        "functions",
                                        "function_call",
                                        "audio",
                                        "prediction",
                                        "tool_choice",
                                        "response_format",
                                        NULL};

static bool req_in(const char *const *list, const char *key) {
    for (size_t i = 0; list && list[i]; i++)
        if (strcmp(list[i], key) == 0)
            return true;
    return false;
}

static int req_refuse_unknown(json_t *o, const struct req_opts *opt, struct req_err *err) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (req_in(req_known, key) || req_in(opt->own, key))
            continue;
        if (opt->chat ? strcmp(key, "prompt") == 0 : strcmp(key, "max_completion_tokens") == 0)
            return req_err_set(err, "unknown_parameter", key, "'%s' is not a field of a %s", key,
                               opt->chat ? "chat request" : "completion request");
        return req_err_set(err, "unknown_parameter", key,
                           "'%s' is not a request field llmd knows (a typo?)", key);
    }
    return 0;
}

/* Parameters llmd does not implement: refused rather than ignored, since
 * ignoring them would silently give a different answer. */
static int req_refuse_unsupported(json_t *o, struct req_err *err) {
    json_t *v;
    if (req_get(o, "suffix"))
        return req_err_unsupported(err, "suffix", "no insertion mode");
    static const char *const tools[] = {"tools", "functions", "function_call", "audio",
                                        "prediction"};
    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++)
        if (req_get(o, tools[i]))
            return req_err_unsupported(err, tools[i], "no tool calls, audio or predicted outputs");
    v = req_get(o, "tool_choice");
    if (v && !(json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
        return req_err_unsupported(err, "tool_choice", "no tool calls");
    v = req_get(o, "response_format");
    if (v) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return req_err_unsupported(err, "response_format", "only {\"type\": \"text\"}");
    }
    return 0;
}

static int req_parse_stop(json_t *o, struct req_fields *f, struct req_err *err) {
    json_t *v = req_get(o, "stop");
    if (!v)
        return 0;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > REQ_MAX_STOP)
            return req_err_set(err, "invalid_value", "stop", "at most %d stop strings, not %zu",
                               REQ_MAX_STOP, n);
    } else if (!json_is_string(v)) {
        return req_err_type(err, "stop", "a string or an array of strings");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(s))
            return req_err_type(err, "stop", "a string or an array of strings");
        size_t len = json_string_length(s);
        if (len == 0 || len > REQ_MAX_STOP_BYTES)
            return req_err_set(err, "invalid_value", "stop",
                               "stop strings must be 1 to %d bytes long", REQ_MAX_STOP_BYTES);
        if (!(f->stop[f->n_stop] = mem_strndup(MEM_HTTP, json_string_value(s), len)))
            return -ENOMEM;
        f->n_stop++;
    }
    return 0;
}

/* A token id of the vocabulary (opt->n_vocab; 0: not checked here, the
 * engine refuses it). */
static bool req_id_ok(const struct req_opts *opt, long long id) {
    return id >= 0 && id <= INT32_MAX && (opt->n_vocab == 0 || id < opt->n_vocab);
}

/* prompt: a string, or token ids (each in the vocabulary), or a
 * one-element array of either. */
static int req_parse_prompt(json_t *o, const struct req_opts *opt, struct req_fields *f,
                            struct req_err *err) {
    json_t *p = req_get(o, "prompt");
    if (!p)
        return req_err_set(err, "missing_required_parameter", "prompt",
                           "you must provide a 'prompt'");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* ["text"] or [[ids]] */
    if (json_is_string(p)) {
        f->prompt_len = json_string_length(p);
        f->prompt = mem_strndup(MEM_HTTP, json_string_value(p), f->prompt_len);
        return f->prompt ? 0 : -ENOMEM;
    }
    if (!json_is_array(p))
        return req_err_type(err, "prompt", "a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0)
        return req_err_value(err, "prompt", "must not be empty");
    if (n > UINT32_MAX)
        return req_err_value(err, "prompt", "is too long");
    for (size_t i = 0; i < n; i++)
        if (!json_is_integer(json_array_get(p, i))) {
            if (json_is_string(json_array_get(p, i)) || json_is_array(json_array_get(p, i)))
                return req_err_unsupported(err, "prompt",
                                           "one prompt per request (several prompts: several "
                                           "requests, or llmd batch)");
            return req_err_type(err, "prompt", "a string or an array of token ids");
        }
    f->ids = mem_alloc(MEM_HTTP, n * sizeof(*f->ids));
    if (!f->ids)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        long long id = json_integer_value(json_array_get(p, i));
        if (id < 0 || id > INT32_MAX)
            return req_err_set(err, "invalid_value", "prompt",
                               "'prompt' has token id %lld at position %zu: ids are 0 or more", id,
                               i);
        if (!req_id_ok(opt, id))
            return req_err_set(err, "invalid_value", "prompt",
                               "'prompt' has token id %lld at position %zu, outside the "
                               "vocabulary of %u tokens",
                               id, i, opt->n_vocab);
        f->ids[i] = (int32_t)id;
    }
    f->n_ids = (uint32_t)n;
    return 0;
}

static int req_parse_sampling(json_t *o, const struct req_opts *opt, struct req_fields *f,
                              struct req_err *err) {
    long long x;
    bool given;
    const char *mt = "max_tokens";
    if (opt->chat && req_get(o, "max_completion_tokens"))
        mt = "max_completion_tokens";
    if (req_int(o, mt, LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given) {
        if (x == 0 && f->echo) { /* the prompt alone: a log-likelihood */
            f->prompt_only = true;
            x = 1;
        }
        if (x < 1)
            return req_err_value(err, mt,
                                 opt->chat ? "must be at least 1"
                                           : "must be at least 1 (0 only with 'echo': true)");
        if (x > UINT32_MAX)
            return req_err_value(err, mt, "is too large");
        if (opt->n_ctx && x > opt->n_ctx)
            return req_err_set(err, "invalid_value", mt,
                               "'%s' is %lld, more than the context of %u tokens", mt, x,
                               opt->n_ctx);
        f->max_tokens = (uint32_t)x;
    }
    float top_p = f->top_p;
    if (req_num(o, "temperature", 0, 2, &f->temperature, err) < 0 ||
        req_num(o, "min_p", 0, 1, &f->min_p, err) < 0)
        return -EINVAL;
    if (req_num(o, "top_p", -INFINITY, INFINITY, &top_p, err) < 0)
        return -EINVAL;
    if (req_get(o, "top_p") && !(top_p > 0 && top_p <= 1)) /* 0 would keep no token */
        return req_err_value(err, "top_p", "must be in (0, 1]");
    f->top_p = top_p;
    if (req_int(o, "top_k", -1, INT32_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given)
        f->top_k = x > 0 ? (int)x : 0; /* -1 and 0: off */
    if (req_int(o, "seed", LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given)
        f->seed = (uint64_t)x;
    if (req_int(o, "n", LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given && (x < 1 || x > REQ_MAX_N))
        return req_err_set(err, "invalid_value", "n", "'n' must be 1 to %d (it is %lld)", REQ_MAX_N,
                           x);
    if (given)
        f->n = (uint32_t)x;
    if (f->n == 0)
        f->n = 1;
    /* best_of (completions): n choices of best_of, by their log-probability;
     * only best_of = n (every choice returned) */
    if (req_int(o, "best_of", LLONG_MIN, LLONG_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given && x < f->n)
        return req_err_set(err, "invalid_value", "best_of",
                           "'best_of' must be at least 'n' (%u); it is %lld", f->n, x);
    if (given && x != f->n)
        return req_err_unsupported(err, "best_of",
                                   "only best_of = n (no ranking of extra choices)");
    if (req_int(o, "priority", INT32_MIN, INT32_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given)
        f->priority = (int32_t)x;
    bool spec = !f->no_speculative;
    if (req_bool(o, "speculative", &spec, err) < 0)
        return -EINVAL;
    f->no_speculative = !spec;
    return 0;
}

/* Penalties (OpenAI's presence and frequency, -2..2; vLLM's repetition,
 * (0, 2]), logit_bias (OpenAI: {"token id": -100..100}), and vLLM's
 * ignore_eos and stop_token_ids. */
static int req_parse_logits(json_t *o, const struct req_opts *opt, struct req_fields *f,
                            struct req_err *err) {
    if (req_num(o, "presence_penalty", -2, 2, &f->presence_penalty, err) < 0 ||
        req_num(o, "frequency_penalty", -2, 2, &f->frequency_penalty, err) < 0 ||
        req_num(o, "repetition_penalty", -INFINITY, INFINITY, &f->repetition_penalty, err) < 0)
        return -EINVAL;
    if (req_get(o, "repetition_penalty") &&
        !(f->repetition_penalty > 0 && f->repetition_penalty <= 2))
        return req_err_value(err, "repetition_penalty", "must be in (0, 2] (1: off)");
    if (req_bool(o, "ignore_eos", &f->ignore_eos, err) < 0)
        return -EINVAL;
    json_t *v = req_get(o, "stop_token_ids");
    if (v) {
        if (!json_is_array(v))
            return req_err_type(err, "stop_token_ids", "an array of token ids");
        if (json_array_size(v) > LLMD_STOP_TOKEN_IDS_MAX)
            return req_err_set(err, "invalid_value", "stop_token_ids",
                               "at most %d stop token ids, not %zu", LLMD_STOP_TOKEN_IDS_MAX,
                               json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *x = json_array_get(v, i);
            if (!json_is_integer(x))
                return req_err_type(err, "stop_token_ids", "an array of token ids");
            if (!req_id_ok(opt, json_integer_value(x)))
                return req_err_set(err, "invalid_value", "stop_token_ids",
                                   "'stop_token_ids' has token id %lld, outside the vocabulary "
                                   "of %u tokens",
                                   (long long)json_integer_value(x), opt->n_vocab);
            f->stop_ids[f->n_stop_ids++] = (int32_t)json_integer_value(x);
        }
    }
    v = req_get(o, "logit_bias");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return req_err_type(err, "logit_bias", "an object of token ids (strings) to numbers");
    size_t n = json_object_size(v);
    if (n > REQ_MAX_LOGIT_BIAS)
        return req_err_set(err, "invalid_value", "logit_bias", "at most %d entries, not %zu",
                           REQ_MAX_LOGIT_BIAS, n);
    if (n == 0)
        return 0;
    f->bias_ids = mem_alloc(MEM_HTTP, n * sizeof(*f->bias_ids));
    f->bias = mem_alloc(MEM_HTTP, n * sizeof(*f->bias));
    if (!f->bias_ids || !f->bias)
        return -ENOMEM;
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        char *end;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || errno || !isdigit((unsigned char)key[0]))
            return req_err_set(
                err, "invalid_value", "logit_bias",
                "'logit_bias' keys must be token ids (decimal integers), not '%.64s'", key);
        if (!req_id_ok(opt, id))
            return req_err_set(err, "invalid_value", "logit_bias",
                               "'logit_bias' has token id %.64s, outside the vocabulary of %u "
                               "tokens",
                               key, opt->n_vocab);
        if (!json_is_number(x))
            return req_err_set(err, "invalid_type", "logit_bias",
                               "'logit_bias' values must be numbers (token id %.64s)", key);
        double b = json_number_value(x);
        if (!(b >= -100 && b <= 100))
            return req_err_set(err, "invalid_value", "logit_bias",
                               "'logit_bias' values must be in [-100, 100] (token id %.64s: %g)",
                               key, b);
        f->bias_ids[f->n_bias] = (int32_t)id;
        f->bias[f->n_bias++] = (float)b;
    }
    return 0;
}

/* Completions: "logprobs": N (0..20: the token's logprob and N alternatives;
 * false as absent). Chat: "logprobs": true, "top_logprobs": N (0..20, only
 * with logprobs true). OpenAI's API reference, both endpoints. */
static int req_parse_logprobs(json_t *o, const struct req_opts *opt, struct req_fields *f,
                              struct req_err *err) {
    long long x = 0;
    bool given;
    json_t *v = req_get(o, "logprobs");
    if (!opt->chat) {
        if (req_get(o, "top_logprobs"))
            return req_err_unsupported(err, "top_logprobs",
                                       "a chat field: a completion request asks for "
                                       "alternatives with 'logprobs': N");
        if (!v || json_is_false(v))
            return 0;
        if (!json_is_integer(v))
            return req_err_type(err, "logprobs", "an integer (0 to 20 alternatives)");
        if (req_int(o, "logprobs", 0, LLMD_TOP_LOGPROBS_MAX, &x, &given, err) < 0)
            return -EINVAL;
        f->logprobs = true;
        f->top_logprobs = (uint32_t)x;
        return 0;
    }
    bool on = false;
    if (req_bool(o, "logprobs", &on, err) < 0)
        return -EINVAL;
    if (req_int(o, "top_logprobs", 0, LLMD_TOP_LOGPROBS_MAX, &x, &given, err) < 0)
        return -EINVAL;
    if (given && !on)
        return req_err_value(err, "top_logprobs", "needs 'logprobs': true");
    f->logprobs = on;
    f->top_logprobs = (uint32_t)x;
    return 0;
}

/* echo (completions): the prompt comes back before the completion, with its
 * logprobs when logprobs are asked. Chat has no such field in OpenAI's API. */
static int req_parse_echo(json_t *o, const struct req_opts *opt, struct req_fields *f,
                          struct req_err *err) {
    json_t *v = req_get(o, "echo");
    if (v && opt->chat && !json_is_false(v))
        return req_err_unsupported(err, "echo", "a completions field (chat has no echo)");
    return opt->chat ? 0 : req_bool(o, "echo", &f->echo, err);
}

static int req_parse_salt(json_t *o, struct req_fields *f, struct req_err *err) {
    json_t *v = req_get(o, "cache_salt");
    if (!v)
        return 0;
    if (!json_is_string(v))
        return req_err_type(err, "cache_salt", "a string");
    size_t n = json_string_length(v);
    if (n == 0 || n > REQ_MAX_SALT_BYTES)
        return req_err_value(err, "cache_salt", "must be 1 to 256 bytes long");
    if (!(f->cache_salt = mem_strndup(MEM_HTTP, json_string_value(v), n)))
        return -ENOMEM;
    f->cache_salt_len = n;
    return 0;
}

int req_parse(json_t *o, const struct req_opts *opt, struct req_fields *f, struct req_err *err) {
    int rc = 0;
    if (opt->strict)
        rc = req_refuse_unknown(o, opt, err);
    if (rc == 0)
        rc = req_refuse_unsupported(o, err);
    if (rc == 0)
        rc = req_parse_echo(o, opt, f, err);
    if (rc == 0)
        rc = req_parse_sampling(o, opt, f, err);
    if (rc == 0)
        rc = req_parse_logprobs(o, opt, f, err);
    if (rc == 0)
        rc = req_parse_logits(o, opt, f, err);
    if (rc == 0)
        rc = req_parse_salt(o, f, err);
    if (rc == 0)
        rc = req_parse_stop(o, f, err);
    if (rc == 0 && !opt->chat)
        rc = req_parse_prompt(o, opt, f, err);
    if (rc < 0)
        req_fields_free(f);
    return rc;
}

void req_fields_free(struct req_fields *f) {
    mem_free(f->prompt);
    mem_free(f->ids);
    for (uint32_t i = 0; i < f->n_stop; i++)
        mem_free(f->stop[i]);
    mem_free(f->cache_salt);
    mem_free(f->ns);
    mem_free(f->bias_ids);
    mem_free(f->bias);
    *f = (struct req_fields){0};
}

int req_request(struct req_fields *f, uint32_t tenant, const void *tenant_ns, size_t n,
                struct llmd_request *q) {
    *q = (struct llmd_request){
        .prompt = f->prompt,
        .prompt_len = f->prompt_len,
        .prompt_ids = f->ids,
        .n_prompt_ids = f->n_ids,
        .max_tokens = f->max_tokens,
        .temperature = f->temperature,
        .top_k = f->top_k,
        .top_p = f->top_p,
        .min_p = f->min_p,
        .seed = f->seed,
        .stop = (const char *const *)f->stop,
        .n_stop = f->n_stop,
        .tenant = tenant,
        .priority = f->priority,
        .cache_ns = tenant_ns,
        .cache_ns_len = tenant_ns ? n : 0,
        .no_speculative = f->no_speculative,
        .logprobs = f->logprobs ? &f->lp : NULL,
        .top_logprobs = f->top_logprobs,
        .prompt_only = f->prompt_only,
        .presence_penalty = f->presence_penalty,
        .frequency_penalty = f->frequency_penalty,
        .repetition_penalty = f->repetition_penalty,
        .logit_bias_ids = f->bias_ids,
        .logit_bias = f->bias,
        .n_logit_bias = f->n_bias,
        .ignore_eos = f->ignore_eos,
        .stop_token_ids = f->stop_ids,
        .n_stop_token_ids = f->n_stop_ids,
    };
    if (!f->cache_salt)
        return 0;
    /* the tenant's own namespace (the engine's default: its id, 4 bytes
     * little-endian), narrowed by the salt: never another tenant's */
    uint8_t id[4] = {(uint8_t)tenant, (uint8_t)(tenant >> 8), (uint8_t)(tenant >> 16),
                     (uint8_t)(tenant >> 24)};
    if (!tenant_ns) {
        tenant_ns = id;
        n = sizeof id;
    }
    static const char sep[] = "\0cache_salt:";
    size_t n_sep = sizeof(sep) - 1;
    mem_free(f->ns);
    f->ns_len = n + n_sep + f->cache_salt_len;
    if (!(f->ns = mem_alloc(MEM_HTTP, f->ns_len)))
        return -ENOMEM;
    memcpy(f->ns, tenant_ns, n);
    memcpy(f->ns + n, sep, n_sep);
    memcpy(f->ns + n + n_sep, f->cache_salt, f->cache_salt_len);
    q->cache_ns = f->ns;
    q->cache_ns_len = f->ns_len;
    return 0;
}

void req_err_submit(struct req_err *err, int rc, const char *param, uint32_t prompt_tokens,
                    const struct llmd_engine_info *info) {
    if (rc == -EINVAL) {
        req_err_set(err, "invalid_value", param,
                    "the engine refused the request: no prompt tokens, a token id outside the "
                    "vocabulary, or an invalid sampling parameter");
        return;
    }
    if (rc != -E2BIG) {
        req_err_set(err, "engine_error", NULL, "the engine refused the request: %s", strerror(-rc));
        return;
    }
    char len[48] = "the prompt";
    if (prompt_tokens)
        snprintf(len, sizeof len, "the prompt is %u token%s", prompt_tokens,
                 prompt_tokens == 1 ? "" : "s");
    if (info && info->max_seq_tokens < info->n_ctx)
        req_err_set(err, "kv_budget", param,
                    "%s: it leaves no room for output in what the whole KV pool holds for one "
                    "sequence, %u token%s of the %u-token context (raise --kv-budget)",
                    len, info->max_seq_tokens, info->max_seq_tokens == 1 ? "" : "s", info->n_ctx);
    else
        req_err_set(err, "context_length_exceeded", param,
                    "%s: it leaves no room for output in the context of %u token%s (prompt and "
                    "output together; see --ctx)",
                    len, info ? info->n_ctx : 0, info && info->n_ctx == 1 ? "" : "s");
}

bool req_tenant_name_ok(const char *s, size_t len) {
    if (len == 0 || len > REQ_TENANT_MAX_BYTES)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && (s[i] == '\0' || !strchr("_.-", s[i])))
            return false;
    return true;
}

/* --- log-probabilities ----------------------------------------------------- */

/* A record: u8 n_top (REQ_LP_NONE: a token without a logprob, the prompt's
 * first), then 1 + n_top items (1 for REQ_LP_NONE) of {i32 token, f32
 * logprob, u16 n_bytes, the bytes}, host byte order (it never leaves the
 * process). */
#define REQ_LP_PIECE_BYTES 256 /* a token's bytes kept (a longer one is cut) */
#define REQ_LP_NONE        0xff

static void req_lp_put(struct req_lp_buf *b, const void *p, size_t n) {
    if (b->oom || n == 0) /* n 0: p and b->p may be NULL */
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 512;
        while (cap < b->n + n)
            cap *= 2;
        char *q = mem_realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void req_lp_put_item(struct req_lp_buf *b, const struct llmd_engine *e,
                            const struct llmd_token_logprob *t) {
    char piece[REQ_LP_PIECE_BYTES];
    size_t n = 0;
    int rc = llmd_token_bytes(e, t->token, piece, sizeof piece, &n);
    if (rc == -ENOSPC)
        n = sizeof piece;
    else if (rc < 0)
        n = 0;
    uint16_t n16 = (uint16_t)n;
    req_lp_put(b, &t->token, sizeof t->token);
    req_lp_put(b, &t->logprob, sizeof t->logprob);
    req_lp_put(b, &n16, sizeof n16);
    req_lp_put(b, piece, n);
}

int req_lp_push_first(struct req_lp_buf *b, const struct llmd_engine *e, int32_t token) {
    uint8_t none = REQ_LP_NONE;
    req_lp_put(b, &none, 1);
    req_lp_put_item(b, e, &(struct llmd_token_logprob){.token = token});
    return b->oom ? -ENOMEM : 0;
}

int req_lp_push(struct req_lp_buf *b, const struct llmd_engine *e, const struct llmd_logprobs *lp) {
    uint8_t n_top =
        (uint8_t)(lp->n_top < LLMD_TOP_LOGPROBS_MAX ? lp->n_top : LLMD_TOP_LOGPROBS_MAX);
    req_lp_put(b, &n_top, 1);
    req_lp_put_item(b, e, &lp->chosen);
    for (uint32_t k = 0; k < n_top; k++)
        req_lp_put_item(b, e, &lp->top[k]);
    return b->oom ? -ENOMEM : 0;
}

void req_lp_buf_free(struct req_lp_buf *b) {
    mem_free(b->p);
    *b = (struct req_lp_buf){0};
}

static bool req_lp_get(const char *buf, size_t n, size_t *off, void *p, size_t len) {
    if (n - *off < len)
        return false;
    memcpy(p, buf + *off, len);
    *off += len;
    return true;
}

static bool req_lp_get_item(const char *buf, size_t n, size_t *off, struct req_lp_item *it) {
    uint16_t n16;
    if (!req_lp_get(buf, n, off, &it->token, sizeof it->token) ||
        !req_lp_get(buf, n, off, &it->logprob, sizeof it->logprob) ||
        !req_lp_get(buf, n, off, &n16, sizeof n16) || n - *off < n16)
        return false;
    it->bytes = buf + *off;
    it->n_bytes = n16;
    *off += n16;
    return true;
}

bool req_lp_next(const char *buf, size_t n, size_t *off, struct req_lp_rec *out) {
    uint8_t n_top;
    if (*off >= n || !req_lp_get(buf, n, off, &n_top, 1) ||
        (n_top > LLMD_TOP_LOGPROBS_MAX && n_top != REQ_LP_NONE) ||
        !req_lp_get_item(buf, n, off, &out->chosen))
        return false;
    out->none = n_top == REQ_LP_NONE;
    if (out->none)
        n_top = 0;
    out->n_top = n_top;
    for (uint32_t k = 0; k < n_top; k++)
        if (!req_lp_get_item(buf, n, off, &out->top[k]))
            return false;
    return true;
}

/* A token's text as a JSON string: its bytes when they are valid UTF-8,
 * else OpenAI's form for a piece of a character, "bytes:\xNN..." */
static json_t *req_lp_token_str(const struct req_lp_item *it) {
    json_t *j = json_stringn(it->bytes, it->n_bytes);
    if (j)
        return j;
    char s[6 + 4 * REQ_LP_PIECE_BYTES + 1] = "bytes:";
    size_t at = 6;
    for (uint32_t i = 0; i < it->n_bytes; i++)
        at += (size_t)snprintf(s + at, sizeof s - at, "\\x%02x", (unsigned char)it->bytes[i]);
    return json_string(s);
}

static json_t *req_lp_bytes(const struct req_lp_item *it) {
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < it->n_bytes; i++)
        json_array_append_new(a, json_integer((unsigned char)it->bytes[i]));
    return a;
}

int req_lp_completion(json_t *lp, const char *buf, size_t n, size_t *text_offset) {
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    json_t *arr[4];
    for (int i = 0; i < 4; i++) {
        arr[i] = json_object_get(lp, keys[i]);
        if (!arr[i] && json_object_set_new(lp, keys[i], (arr[i] = json_array())) < 0)
            return -ENOMEM;
    }
    size_t off = 0;
    struct req_lp_rec rec;
    while (req_lp_next(buf, n, &off, &rec)) {
        json_t *top = json_object();
        for (uint32_t k = 0; top && k < rec.n_top; k++) {
            json_t *key = req_lp_token_str(&rec.top[k]);
            /* two ids with the same text: the more likely one is kept */
            if (key && !json_object_get(top, json_string_value(key)))
                json_object_set_new(top, json_string_value(key), json_real(rec.top[k].logprob));
            json_decref(key);
        }
        if (rec.none) { /* the prompt's first token: null, as OpenAI's echo */
            json_decref(top);
            top = json_null();
        }
        if (json_array_append_new(arr[0], req_lp_token_str(&rec.chosen)) < 0 ||
            json_array_append_new(arr[1], rec.none ? json_null() : json_real(rec.chosen.logprob)) <
                0 ||
            json_array_append_new(arr[2], top) < 0 ||
            json_array_append_new(arr[3], json_integer((json_int_t)*text_offset)) < 0)
            return -ENOMEM;
        *text_offset += rec.chosen.n_bytes;
    }
    return 0;
}

static json_t *req_lp_chat_item(const struct req_lp_item *it) {
    return json_pack("{s:o, s:f, s:o}", "token", req_lp_token_str(it), "logprob",
                     (double)it->logprob, "bytes", req_lp_bytes(it));
}

json_t *req_lp_chat(const char *buf, size_t n) {
    json_t *content = json_array();
    size_t off = 0;
    struct req_lp_rec rec;
    while (content && req_lp_next(buf, n, &off, &rec)) {
        json_t *item = req_lp_chat_item(&rec.chosen), *top = json_array();
        for (uint32_t k = 0; top && k < rec.n_top; k++)
            json_array_append_new(top, req_lp_chat_item(&rec.top[k]));
        if (!item || !top || json_object_set_new(item, "top_logprobs", top) < 0 ||
            json_array_append_new(content, item) < 0) {
            json_decref(content);
            return NULL;
        }
    }
    return content;
}

int req_ids_text(const struct llmd_engine *e, const int32_t *ids, uint32_t n, char **out,
                 size_t *n_out) {
    struct req_lp_buf b = {0};
    for (uint32_t i = 0; i < n; i++) {
        char piece[REQ_LP_PIECE_BYTES];
        size_t k = 0;
        int rc = llmd_token_bytes(e, ids[i], piece, sizeof piece, &k);
        if (rc == -ENOSPC)
            k = sizeof piece;
        else if (rc < 0)
            k = 0;
        req_lp_put(&b, piece, k);
    }
    req_lp_put(&b, "", 1); /* NUL, not counted */
    if (b.oom) {
        req_lp_buf_free(&b);
        return -ENOMEM;
    }
    *out = b.p;
    *n_out = b.n - 1;
    return 0;
}
