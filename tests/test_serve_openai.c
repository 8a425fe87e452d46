/* A real client against the real server: OpenAI's official Node SDK (the
 * `openai` npm package, which `make deps-test` installs into build/npm)
 * runs tests/serve/openai_client.mjs against the build's `llmd serve`:
 * completions and chat completions, streamed and whole, logprobs, echo,
 * n > 1, a seed inside a busy batch, an unknown model.
 * The script checks what the SDK saw (streamed text = whole text, the 404
 * as NotFoundError); this test checks the script's summary and that the
 * greedy text equals `llmd generate` on the same prompt, context and KV
 * type. Without node or the SDK the test fails, naming `make deps-test`. */
#include "tests/lib/http_util.h"
#include "tests/lib/proc_util.h"

#define PROMPT "Once upon a time"
/* the server and `llmd generate` alike: the model's own context (no
 * warning), f32 KV (the references' numerics), one thread */
#define RUN_ARGS "--ctx 128 --kv-type f32 -t 1"

/* Fail with the set-up command unless node and the SDK are there. */
static void need_node_and_sdk(void) {
    const char *const argv[] = {"node", "--version", NULL};
    struct proc_out o;
    proc_run(argv, NULL, 0, &o);
    cr_assert_eq(o.code, 0, "node cannot run: run `make deps-test` (as root it installs it). %s",
                 o.err);
    proc_out_free(&o);
    const char *prefix = getenv("LLMD_NPM_PREFIX");
    char pkg[1024];
    snprintf(pkg, sizeof(pkg), "%s/node_modules/openai/package.json",
             prefix && *prefix ? prefix : "build/npm");
    cr_assert_eq(access(pkg, R_OK), 0,
                 "the openai npm package is not installed (%s missing): run `make deps-test`", pkg);
}

/* Greedy `llmd generate` of prompt for 16 tokens into out, without the
 * newline it ends with. */
static void generate(const char *prompt, char *out, size_t cap) {
    char llmd[512];
    snprintf(llmd, sizeof(llmd), "%s/llmd", serve_build_dir());
    const char *const argv[] = {llmd,        "generate", "-m", HT_MODEL,    "-p", prompt,  "-n",
                                "16",        "--temp",   "0",  "--no-echo", "-q", "--ctx", "128",
                                "--kv-type", "f32",      "-t", "1",         NULL};
    struct proc_out o;
    proc_run(argv, NULL, 0, &o);
    cr_assert_eq(o.code, 0, "llmd generate exit %d: %s", o.code, o.err);
    cr_assert_eq(o.err_len, 0, "llmd generate -q wrote on stderr: %s", o.err);
    cr_assert(o.out_len > 0 && o.out[o.out_len - 1] == '\n', "'%s'", o.out);
    o.out[o.out_len - 1] = '\0';
    snprintf(out, cap, "%s", o.out);
    proc_out_free(&o);
}

/* Run the script against p; returns its summary (caller decrefs). */
static json_t *run_client(const struct proc *p, struct proc_out *o) {
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/v1", p->port);
    const char *const argv[] = {"node", "tests/serve/openai_client.mjs", url, HT_NAME, PROMPT,
                                NULL};
    proc_run(argv, NULL, 0, o);
    json_error_t e;
    json_t *j = json_loads(o->out, 0, &e);
    cr_assert_not_null(j, "no JSON summary (exit %d, %s): '%s' stderr: '%s'", o->code, e.text,
                       o->out, o->err);
    return j;
}

static const char *str_at(json_t *j, const char *obj, const char *key) {
    json_t *v = json_object_get(obj ? json_object_get(j, obj) : j, key);
    cr_assert(json_is_string(v), "%s.%s is not a string", obj ? obj : "", key);
    return json_string_value(v);
}

static json_int_t usage_at(json_t *j, const char *obj, const char *key) {
    json_t *v = json_object_get(json_object_get(json_object_get(j, obj), "usage"), key);
    cr_assert(json_is_integer(v), "%s.usage.%s", obj, key);
    return json_integer_value(v);
}

Test(serve_openai, sdk_completions_and_chat_equal_llmd_generate, .timeout = 90) {
    need_node_and_sdk();
    struct proc p;
    serve_start(&p, "-m " HT_MODEL " --port 0 -q " RUN_ARGS);
    struct proc_out o;
    json_t *s = run_client(&p, &o);
    char *dump = json_dumps(s, JSON_COMPACT);
    cr_assert_eq(o.code, 0, "the client failed (exit %d): %s\nstderr: %s", o.code, dump, o.err);
    cr_assert(json_is_true(json_object_get(s, "ok")), "%s", dump);
    cr_assert_eq(json_array_size(json_object_get(s, "mismatches")), 0, "%s", dump);
    cr_assert(strncmp(str_at(s, NULL, "sdk_version"), "4.", 2) == 0, "%s", dump);
    json_t *models = json_object_get(s, "models");
    cr_assert_eq(json_array_size(models), 1, "%s", dump);
    cr_assert_str_eq(json_string_value(json_array_get(models, 0)), HT_NAME);

    /* the completion: llmd generate's text, to the byte, streamed and not */
    char want[4096];
    generate(PROMPT, want, sizeof(want));
    cr_assert_str_eq(str_at(s, "completion", "text"), want);
    cr_assert_str_eq(str_at(s, "completion", "stream_text"), want);
    /* llama2.c's reference continuation: not an empty or garbled match */
    cr_assert(strncmp(want, ", there was a little girl named Lily.", 37) == 0, "%s", want);
    cr_assert_str_eq(str_at(s, "completion", "finish_reason"), "length");
    cr_assert_eq(usage_at(s, "completion", "prompt_tokens"), 5); /* BOS + 4 */
    cr_assert_eq(usage_at(s, "completion", "completion_tokens"), 16);

    /* the chat: stories260K has no template, so `plain`: the completion of
     * "user: PROMPT\nassistant:" (docs/serving.md) */
    generate("user: " PROMPT "\nassistant:", want, sizeof(want));
    cr_assert_str_eq(str_at(s, "chat", "text"), want);
    cr_assert_str_eq(str_at(s, "chat", "stream_text"), want);
    cr_assert_str_eq(str_at(s, "chat", "finish_reason"), "length");
    cr_assert_eq(usage_at(s, "chat", "completion_tokens"), 16);

    /* logprobs: the same greedy text, one logprob a token, streamed and not
     * (the script checked tokens = text, greedy = the top alternative) */
    static const char *const lp_kinds[] = {"completion_logprobs", "chat_logprobs"};
    for (int k = 0; k < 2; k++) {
        cr_assert_str_eq(str_at(s, lp_kinds[k], "text"),
                         str_at(s, k ? "chat" : "completion", "text"), "%s", dump);
        json_t *x = json_object_get(s, lp_kinds[k]);
        cr_assert_eq(json_integer_value(json_object_get(x, "n_logprobs")), 16, "%s", dump);
        cr_assert_eq(json_integer_value(json_object_get(x, "stream_n_logprobs")), 16, "%s", dump);
    }

    /* echo, max_tokens 0: the prompt scored, BOS + 4 tokens */
    cr_assert_str_eq(str_at(s, "echo", "text"), PROMPT, "%s", dump);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(s, "echo"), "n_logprobs")), 5,
                 "%s", dump);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(s, "echo"), "completion_tokens")), 0,
        "%s", dump);

    /* n choices (the script compared each with its own seed's request and
     * the streamed ones with the whole): the prompt counted once */
    static const char *const n_kinds[] = {"completion_n3", "chat_n2"};
    for (int k = 0; k < 2; k++) {
        json_t *x = json_object_get(s, n_kinds[k]);
        cr_assert_eq(json_integer_value(json_object_get(x, "n_choices")), 3 - k, "%s", dump);
        cr_assert_eq(usage_at(s, n_kinds[k], "prompt_tokens"),
                     usage_at(s, k ? "chat" : "completion", "prompt_tokens"), "%s", dump);
        json_int_t ct = usage_at(s, n_kinds[k], "completion_tokens");
        cr_assert(ct >= 3 - k && ct <= 16 * (3 - k), "%s", dump);
    }
    cr_assert_str_eq(str_at(s, "seed_in_batch", "busy"), str_at(s, "seed_in_batch", "alone"));

    /* an unknown model: the SDK's NotFoundError, whole, streamed, retrieve */
    json_t *nf = json_object_get(s, "not_found");
    cr_assert_eq(json_array_size(nf), 3, "%s", dump);
    for (size_t i = 0; i < 3; i++) {
        json_t *c = json_array_get(nf, i);
        cr_assert_str_eq(str_at(c, NULL, "error"), "NotFoundError", "%s", dump);
        cr_assert_eq(json_integer_value(json_object_get(c, "status")), 404, "%s", dump);
    }
    free(dump);
    json_decref(s);
    proc_out_free(&o);
    serve_stop(&p);
}

/* The script itself says where the SDK should come from when it is not
 * there: the test's own check is not the only one that does. */
Test(serve_openai, a_missing_sdk_names_make_deps_test, .timeout = 30) {
    need_node_and_sdk();
    setenv("LLMD_NPM_PREFIX", "/nonexistent/llmd-npm", 1);
    struct proc p = {.port = 1}; /* never reached: the script stops first */
    struct proc_out o;
    json_t *s = run_client(&p, &o);
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.out);
    cr_assert(json_is_false(json_object_get(s, "ok")), "%s", o.out);
    cr_assert(strstr(str_at(s, NULL, "error"), "run `make deps-test`"), "%s", o.out);
    json_decref(s);
    proc_out_free(&o);
}
