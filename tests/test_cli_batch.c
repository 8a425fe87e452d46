/* `llmd batch` end to end through the real binary: JSON lines in and out,
 * one output line for every input line whatever the others do (a bad line
 * gets serve's error object and the rest run), the same field rules as
 * serve (checked against serve's own parser), cache_salt and named
 * tenants, and the NVMe tier carrying cached prefixes from one process to
 * the next (issue 5: "process 1 exits; process 2 ... prefills at most one
 * page's worth", read from the per-request counts it prints). Under the ASan
 * build a leak makes the exit code non-zero. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/serve/http_impl.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

struct out {
    int code;
    char text[65536]; /* stdout */
    char err[65536];  /* stderr */
};

static char dir[64];

/* Run `llmd ARGS`: stdout into o->text, stderr into o->err. */
static void llmd(struct out *o, const char *args) {
    const char *build = getenv("LLMD_BUILD");
    char cmd[4096], errpath[128];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "%s/llmd %s 2>%s", build ? build : "build/debug", args, errpath);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(o->text, 1, sizeof o->text - 1, p);
    o->text[n] = '\0';
    int st = pclose(p);
    o->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    FILE *f = fopen(errpath, "r");
    cr_assert_not_null(f);
    n = fread(o->err, 1, sizeof o->err - 1, f);
    o->err[n] = '\0';
    fclose(f);
}

static void setup(void) {
    strcpy(dir, "/tmp/llmd-batch-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(cli_batch, .init = setup, .fini = teardown, .timeout = 120);

static void write_file(const char *name, const char *text, char *path, size_t len) {
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, 0600);
}

/* `llmd batch -m F32 -i (input) EXTRA` */
static void batch(struct out *o, const char *input, const char *extra) {
    char in[128], args[1024];
    write_file("in.jsonl", input, in, sizeof in);
    snprintf(args, sizeof args, "batch -m %s -i %s %s", F32, in, extra);
    llmd(o, args);
}

static size_t n_lines(const char *text) {
    size_t n = 0;
    for (const char *p = text; (p = strchr(p, '\n')); p++)
        n++;
    return n;
}

/* The JSON object of output line i (0-based); caller decrefs. */
static json_t *line(const char *text, int i) {
    const char *p = text;
    for (int k = 0; k < i && p; k++)
        p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
    cr_assert(p && *p, "no line %d in: %s", i, text);
    json_error_t err;
    json_t *j = json_loadb(p, strcspn(p, "\n"), 0, &err);
    cr_assert_not_null(j, "line %d: %s", i, err.text);
    return j;
}

static long field(json_t *j, const char *k) {
    json_t *v = json_object_get(j, k);
    cr_assert(json_is_integer(v), "no integer %s", k);
    return (long)json_integer_value(v);
}

static const char *str(json_t *j, const char *k) {
    json_t *v = json_object_get(j, k);
    cr_assert(json_is_string(v), "no string %s", k);
    return json_string_value(v);
}

/* Line i is exactly the error {id, error: {message, type, param, code}}. */
static void expect_error_line(const char *text, int i, const char *id_json, const char *code,
                              const char *param, const char *message) {
    json_t *j = line(text, i), *e = json_object_get(j, "error");
    char *id = json_dumps(json_object_get(j, "id"), JSON_ENCODE_ANY | JSON_COMPACT);
    cr_assert_str_eq(id, id_json, "line %d", i);
    free(id);
    cr_assert_eq(json_object_size(j), 2, "line %d has only id and error: %s", i, text);
    cr_assert_eq(json_object_size(e), 4, "line %d", i);
    cr_assert_str_eq(str(e, "code"), code, "line %d", i);
    cr_assert_str_eq(str(e, "type"), "invalid_request_error", "line %d", i);
    if (param)
        cr_assert_str_eq(str(e, "param"), param, "line %d", i);
    else
        cr_assert(json_is_null(json_object_get(e, "param")), "line %d", i);
    cr_assert_str_eq(str(e, "message"), message, "line %d: '%s', want '%s'", i, str(e, "message"),
                     message);
    json_decref(j);
}

/* Line i ran: it has a text and no error; returns its completion_tokens. */
static long expect_ran(const char *text, int i, const char *id_json) {
    json_t *j = line(text, i);
    cr_assert_null(json_object_get(j, "error"), "line %d: %s", i, text);
    char *id = json_dumps(json_object_get(j, "id"), JSON_ENCODE_ANY | JSON_COMPACT);
    cr_assert_str_eq(id, id_json, "line %d", i);
    free(id);
    str(j, "text");
    long n = field(j, "completion_tokens");
    json_decref(j);
    return n;
}

Test(cli_batch, prompts_in_json_lines_out_in_order) {
    char in[128], args[1024];
    write_file("in.jsonl",
               "{\"id\": \"a\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n"
               "\n"
               "{\"prompt\": \"Lily had a red ball\", \"max_tokens\": 5, \"temperature\": 0}\n",
               in, sizeof in);
    struct out o;
    snprintf(args, sizeof args, "batch -m %s -i %s --ctx 256", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    json_t *a = line(o.text, 0), *b = line(o.text, 1);
    cr_assert_str_eq(json_string_value(json_object_get(a, "id")), "a");
    cr_assert_eq(field(a, "completion_tokens"), 8);
    cr_assert_str_eq(json_string_value(json_object_get(a, "finish_reason")), "length");
    cr_assert_eq(field(b, "id"), 1, "no id: the line's index");
    cr_assert_eq(field(b, "completion_tokens"), 5);
    cr_assert_gt(field(b, "prompt_tokens"), 3);
    /* greedy text equals llmd generate's for the same prompt */
    struct out g;
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 8 --temp 0 --ctx 256 --no-echo -q", F32);
    llmd(&g, args);
    cr_assert_eq(g.code, 0);
    g.text[strcspn(g.text, "\n")] = '\0'; /* generate ends its text with a newline */
    cr_assert_str_eq(json_string_value(json_object_get(a, "text")), g.text);
    json_decref(a);
    json_decref(b);
}

/* One bad line used to lose the whole batch: exit 1 and no output at all.
 * Now every non-blank line gets one output line, in input order: the bad
 * ones an error object saying why (on stderr too, with the file's line
 * number), the good ones - including those after the bad ones - their text;
 * the exit status is 3. */
Test(cli_batch, a_bad_line_gets_its_error_and_every_other_line_runs) {
    struct out o;
    batch(&o,
          "{\"id\": \"a\", \"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n"
          "not json\n"
          "{\"id\": \"b\", \"prompt\": 7}\n"
          "\n"
          "{\"id\": \"c\", \"max_tokens\": 4}\n"
          "[\"an array\"]\n"
          "{\"id\": \"d\", \"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n",
          "--kv-type f32 --token-ids");
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    cr_assert_eq(n_lines(o.text), 6, "one line per non-blank input line: %s", o.text);
    cr_assert_eq(expect_ran(o.text, 0, "\"a\""), 4);
    expect_error_line(o.text, 1, "1", "invalid_json", NULL,
                      "could not parse the JSON line: '[' or '{' expected near 'not' (column 3)");
    expect_error_line(o.text, 2, "\"b\"", "invalid_type", "prompt",
                      "'prompt' must be a string or an array of token ids");
    expect_error_line(o.text, 3, "\"c\"", "missing_required_parameter", "prompt",
                      "you must provide a 'prompt'");
    expect_error_line(o.text, 4, "4", "invalid_type", NULL, "the line must be a JSON object");
    cr_assert_eq(expect_ran(o.text, 5, "\"d\""), 4);
    /* the good lines are exactly what a batch of them alone gives */
    json_t *d = line(o.text, 5);
    cr_assert_str_eq(str(d, "text"), ", there was a");
    char *ids = json_dumps(json_object_get(d, "token_ids"), JSON_COMPACT);
    cr_assert_str_eq(ids, "[432,383,286,261]", "the ids llmd generate --ids prints");
    free(ids);
    json_decref(d);
    cr_assert(strstr(o.err, "llmd batch: line 2: could not parse the JSON line"), "%s", o.err);
    cr_assert(strstr(o.err, "llmd batch: line 5: you must provide a 'prompt'"), "%s", o.err);
    cr_assert(strstr(o.err, "llmd batch: 6 lines (4 failed)"), "%s", o.err);
    /* all good: exit 0 */
    batch(&o, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 2}\n", "-q");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    cr_assert_eq(expect_ran(o.text, 0, "0"), 2);
}

/* batch and serve share one parser (engine/serve/req.c): each bad field
 * value gets, in the line, exactly the error serve answers with 400 - the
 * code, the param and the words, checked here against serve's own parser -
 * and the good line after each still runs. batch also refuses fields
 * nobody knows, naming them, where serve ignores them (as vLLM does). */
Test(cli_batch, fields_are_refused_as_serve_refuses_them) {
    static const char *const bad[] = {
        "\"max_tokens\": -3",
        "\"max_tokens\": \"5\"",
        "\"max_tokens\": 2.5",
        "\"max_tokens\": 0",
        "\"max_tokens\": 129",
        "\"temperature\": -0.5",
        "\"temperature\": \"hot\"",
        "\"top_p\": 1.5",
        "\"top_p\": 0",
        "\"min_p\": 2",
        "\"top_k\": -2",
        "\"seed\": 1.5",
        "\"priority\": \"high\"",
        "\"stop\": 5",
        "\"stop\": [\"a\", 1]",
        "\"stop\": \"\"",
        "\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]",
        "\"cache_salt\": \"\"",
        "\"cache_salt\": 5",
        "\"n\": 0",
        "\"n\": 129",
        "\"n\": 2, \"best_of\": 1",
        "\"logprobs\": 21",
        "\"logprobs\": \"3\"",
        "\"top_logprobs\": 2",
        "\"presence_penalty\": 3",
        "\"repetition_penalty\": 0",
        "\"logit_bias\": {\"99999\": 1}",
        "\"logit_bias\": {\"1\": \"x\"}",
        "\"logit_bias\": [1]",
        "\"stop_token_ids\": [-1]",
        "\"ignore_eos\": \"yes\"",
        "\"echo\": 1",
        "\"max_tokens\": 0",
        "\"tools\": []",
    };
    enum { N = sizeof(bad) / sizeof(bad[0]) };
    static char input[16384];
    size_t at = 0;
    for (size_t i = 0; i < N; i++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"prompt\": \"Once\", %s}\n{\"prompt\": \"Once\", \"max_tokens\": "
                               "1}\n",
                               bad[i]);
    at += (size_t)snprintf(input + at, sizeof input - at,
                           "{\"prompt\": \"Once\", \"colour\": \"blue\"}\n"
                           "{\"prompt\": \"Once\", \"max_tokens\": 1}\n");
    struct out o;
    batch(&o, input, "-q");
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    cr_assert_eq(n_lines(o.text), 2 * N + 2, "%s", o.text);
    static struct http_model m = {.name = "m", .n_ctx = 128, .n_vocab = 512}; /* stories260K's */
    for (size_t i = 0; i < N; i++) {
        char body[512], idx[16];
        snprintf(body, sizeof body, "{\"prompt\": \"Once\", %s}", bad[i]);
        struct http_gen g;
        struct http_err e;
        cr_assert_eq(http_gen_parse(&m, false, body, strlen(body), &g, &e), -EINVAL, "%s", body);
        cr_assert_eq(e.status, 400, "%s", body);
        snprintf(idx, sizeof idx, "%zu", 2 * i);
        expect_error_line(o.text, (int)(2 * i), idx, e.code, e.param[0] ? e.param : NULL,
                          e.message);
        snprintf(idx, sizeof idx, "%zu", 2 * i + 1);
        cr_assert_eq(expect_ran(o.text, (int)(2 * i + 1), idx), 1, "after %s", bad[i]);
    }
    char idx[16];
    snprintf(idx, sizeof idx, "%d", 2 * N);
    expect_error_line(o.text, 2 * N, idx, "unknown_parameter", "colour",
                      "'colour' is not a request field llmd knows (a typo?)");
    snprintf(idx, sizeof idx, "%d", 2 * N + 1);
    cr_assert_eq(expect_ran(o.text, 2 * N + 1, idx), 1);
    /* a key twice is refused by both (serve says "body", batch "line") */
    batch(&o, "{\"prompt\": \"x\", \"prompt\": \"y\"}\n{\"prompt\": \"Once\", \"max_tokens\": 1}\n",
          "-q");
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    expect_error_line(o.text, 0, "0", "invalid_json", NULL,
                      "could not parse the JSON line: duplicate object key near '\"prompt\"' "
                      "(column 24)");
    cr_assert_eq(expect_ran(o.text, 1, "1"), 1);
    /* serve ignores that one: documented, so newer clients keep working */
    struct http_gen g;
    struct http_err e;
    const char *body = "{\"prompt\": \"Once\", \"colour\": \"blue\"}";
    cr_assert_eq(http_gen_parse(&m, false, body, strlen(body), &g, &e), 0);
    http_gen_free(&g);
}

/* regress: "stream" got "'stream' is not a request field llmd knows (a
 * typo?)": serve's fields that batch does not take say so, and why;
 * "stream": false (what every line is) runs. */
Test(cli_batch, regress_serve_fields_batch_does_not_take_say_why) {
    struct out o;
    batch(&o,
          "{\"prompt\": \"Once\", \"stream\": true}\n"
          "{\"prompt\": \"Once\", \"stream\": false, \"max_tokens\": 1}\n"
          "{\"prompt\": \"Once\", \"stream_options\": {\"include_usage\": true}}\n"
          "{\"prompt\": \"Once\", \"model\": \"stories\"}\n"
          "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
          "-q");
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    expect_error_line(o.text, 0, "0", "unsupported_parameter", "stream",
                      "'stream' is not supported by llmd batch: every line is answered whole");
    cr_assert_eq(expect_ran(o.text, 1, "1"), 1);
    expect_error_line(o.text, 2, "2", "unsupported_parameter", "stream_options",
                      "'stream_options' is not supported by llmd batch: every line is answered "
                      "whole, with its usage");
    expect_error_line(o.text, 3, "3", "unsupported_parameter", "model",
                      "'model' is not supported by llmd batch: every line runs the -m model");
    expect_error_line(o.text, 4, "4", "unsupported_parameter", "messages",
                      "'messages' is not supported by llmd batch: a line takes a 'prompt' (chat "
                      "is serve's /v1/chat/completions)");
}

/* --page-size, as generate and serve take it (the mapping-limit refusal
 * told batch users to "use a bigger page size", a flag batch lacked), and
 * that refusal names batch's flags that lower it, not --kv-budget. */
Test(cli_batch, regress_page_size_and_the_mapping_limit) {
    /* 28 tokens: the second line shares the first's one full page of 16 (f32 KV, 20 KiB
     * pages by default), and nothing in pages of 32 */
    const char *two = "{\"prompt\": \"The little dog ran to the big red barn and saw a cat. "
                      "The little dog ran.\", \"max_tokens\": 1}\n"
                      "{\"prompt\": \"The little dog ran to the big red barn and saw a cat. "
                      "The little dog ran.\", \"max_tokens\": 1}\n";
    struct out o;
    batch(&o, two, "-q --kv-type f32 --max-seqs 1");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    json_t *j = line(o.text, 1);
    cr_assert_eq(field(j, "cached_tokens"), 16, "%s", o.text);
    json_decref(j);
    batch(&o, two, "-q --kv-type f32 --max-seqs 1 --page-size 40K");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    j = line(o.text, 1);
    cr_assert_eq(field(j, "cached_tokens"), 0, "pages of 32 tokens: %s", o.text);
    json_decref(j);
    batch(&o, "", "--page-size 12Q");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.err);
    cr_assert_str_eq(o.err, "llmd batch: invalid value '12Q' for --page-size: want a size in bytes "
                            "(K/M/G suffixes)\n");
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    long limit = 0;
    if (f) {
        if (fscanf(f, "%ld", &limit) != 1)
            limit = 0;
        fclose(f);
    }
    if (limit <= 0 || limit > 400000)
        cr_skip_test("vm.max_map_count %ld: 2^24 tokens in 32-token pages fit", limit);
    batch(&o, "{\"prompt\": \"Once\"}\n", "-c 16777216 --max-seqs 1");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.err);
    cr_assert(strstr(o.err, "fewer max_tokens (options: --ctx, --max-seqs, --page-size)\n"), "%s",
              o.err);
}

/* regress: a --page-size or --kv-budget over what --max-seqs contexts can
 * use was capped in silence; the note is generate's and serve's. */
Test(cli_batch, regress_a_page_or_budget_over_the_contexts_is_named) {
    struct out o;
    batch(&o, "{\"prompt\": \"Once\", \"max_tokens\": 2}\n",
          "-q --max-seqs 2 --page-size 10M --kv-budget 1G");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    cr_assert_eq(n_lines(o.text), 1, "%s", o.text);
    cr_assert_str_eq(o.err, "llmd batch: --page-size 10M is more than a context of 128 tokens can "
                            "use; pages are 81920 B (128 tokens)\n"
                            "llmd batch: --kv-budget 1G is more than 2 sequences of 128 tokens "
                            "can use; the KV pool is 2 pages of 81920 B (163840 B)\n");
    batch(&o, "{\"prompt\": \"Once\", \"max_tokens\": 2}\n", "-q --kv-budget 100K");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    cr_assert_str_eq(o.err, "");
}

/* regress: a --ctx over the model's context_length (stories260K: 128) got
 * generate's warning but none from batch (nor from generate --spec, which
 * runs the engine): the same flag says the same thing in each command. */
Test(cli_batch, regress_a_ctx_over_the_models_context_is_warned) {
    struct out o;
    batch(&o, "{\"prompt\": \"Once\", \"max_tokens\": 2}\n", "-q --ctx 512");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    cr_assert_str_eq(o.err, "llmd batch: warning: --ctx 512 exceeds the model's context_length "
                            "128; quality past 128 tokens is not what the model was trained for\n");
    batch(&o, "{\"prompt\": \"Once\", \"max_tokens\": 2}\n", "-q --ctx 128");
    cr_assert_str_eq(o.err, "");
}

/* A refused or cut-short request says why in its line, not only on stderr
 * (a pipeline drops stderr): a prompt longer than the context, one larger
 * than the whole KV pool, and one the pool ends mid-decode (finish_reason
 * kv_budget, never "length", with its text and an error object). */
Test(cli_batch, refusals_and_the_kv_budget_say_why_in_the_line) {
    static char input[8192];
    size_t at = 0;
    at += (size_t)snprintf(input + at, sizeof input - at, "{\"id\": \"long\", \"prompt\": \"");
    for (int i = 0; i < 40; i++) /* 160+ tokens: over the 128-token context */
        at += (size_t)snprintf(input + at, sizeof input - at, "the dog ran to ");
    at += (size_t)snprintf(input + at, sizeof input - at,
                           "\"}\n{\"prompt\": \"Once\", \"max_tokens\": 1}\n");
    struct out o;
    batch(&o, input, "-q");
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    json_t *j = line(o.text, 0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", str(json_object_get(j, "error"), "message"));
    json_decref(j);
    cr_assert(strstr(msg, " tokens: it leaves no room for output in the context of 128 tokens "
                          "(prompt and output together; see --ctx)"),
              "%s", msg);
    expect_error_line(o.text, 0, "\"long\"", "context_length_exceeded", "prompt", msg);
    cr_assert_eq(expect_ran(o.text, 1, "1"), 1);

    /* a 10 KiB budget is one page of 32 tokens (f16) in the 128-token context */
    batch(&o,
          "{\"id\": 1, \"prompt\": \"Once upon a time there was a little girl named Lily. She "
          "loved to play outside in the park with her dog\"}\n"
          "{\"id\": 2, \"prompt\": \"Once upon\", \"max_tokens\": 60}\n"
          "{\"id\": 3, \"prompt\": \"Once upon\", \"max_tokens\": 3}\n",
          "-q --kv-budget 10K");
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    expect_error_line(o.text, 0, "1", "kv_budget", "prompt",
                      "the prompt is 34 tokens: it leaves no room for output in what the whole KV "
                      "pool holds for one sequence, 32 tokens of the 128-token context (raise "
                      "--kv-budget)");
    j = line(o.text, 1);
    cr_assert_str_eq(str(j, "finish_reason"), "kv_budget");
    cr_assert_eq(field(j, "prompt_tokens") + field(j, "completion_tokens"), 32);
    cr_assert_str_eq(str(j, "text"), " a time, there was a little girl named Lily. She loved to "
                                     "play outside in the park.");
    json_t *e = json_object_get(j, "error");
    cr_assert_str_eq(str(e, "code"), "kv_budget");
    cr_assert_str_eq(str(e, "param"), "max_tokens");
    cr_assert_str_eq(str(e, "message"),
                     "stopped after 29 tokens: the whole KV pool holds 32 tokens for one sequence "
                     "(prompt and output) of the 128-token context (raise --kv-budget)");
    json_decref(j);
    j = line(o.text, 2);
    cr_assert_str_eq(str(j, "finish_reason"), "length");
    cr_assert_null(json_object_get(j, "error"));
    json_decref(j);
}

/* cache_salt and tenants narrow the prefix cache as serve's do: the same
 * 2-page prompt hits only within one (tenant, salt); a tenant is an
 * integer id or a name. One request at a time, so each finds what the
 * earlier ones of its namespace cached. cache_salt used to be ignored: cross-salt hits. */
Test(cli_batch, cache_salt_and_tenant_names_keep_caches_apart) {
    const char *doc = "Once upon a time there was a little girl named Lily. She loved to play "
                      "outside in the park with her dog";
    struct {
        const char *extra;
        long cached;
    } want[] = {
        {"", 0},                                               /* tenant 0, no salt */
        {", \"cache_salt\": \"s1\"", 0},                       /* tenant 0 narrowed by s1 */
        {", \"cache_salt\": \"s1\"", 32},                      /* the same again: hits */
        {", \"cache_salt\": \"s2\"", 0},                       /* another salt */
        {"", 32},                                              /* tenant 0 alone still hits */
        {", \"tenant\": \"acme\"", 0},                         /* a named tenant */
        {", \"tenant\": \"acme\"", 32},                        /* ... its own pages */
        {", \"tenant\": \"globex\"", 0},                       /* another name */
        {", \"tenant\": 7", 0},                                /* an integer tenant */
        {", \"tenant\": \"acme\", \"cache_salt\": \"s1\"", 0}, /* acme + s1 is not 0 + s1 */
        {", \"tenant\": \"acme\", \"cache_salt\": \"s1\"", 32},
        {", \"tenant\": \"no spaces\"", -1}, /* refused */
        {", \"tenant\": -1", -2},            /* refused */
        {", \"tenant\": 7", 32},             /* and the rest goes on */
    };
    enum { N = sizeof(want) / sizeof(want[0]) };
    static char input[8192];
    size_t at = 0;
    for (int i = 0; i < N; i++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"prompt\": \"%s\", \"max_tokens\": 1%s}\n", doc, want[i].extra);
    struct out o;
    /* the pool is one context: 512 tokens hold every namespace's 2 pages */
    batch(&o, input, "-q --kv-type f32 --max-seqs 1 --ctx 512");
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    for (int i = 0; i < N; i++) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", i);
        if (want[i].cached == -1) {
            expect_error_line(o.text, i, idx, "invalid_value", "tenant",
                              "'tenant' must be a name of 1 to 64 letters, digits, '_', '.' or "
                              "'-'");
            continue;
        }
        if (want[i].cached == -2) {
            expect_error_line(o.text, i, idx, "invalid_value", "tenant",
                              "'tenant' must be in [0, 2147483647], not -1");
            continue;
        }
        expect_ran(o.text, i, idx);
        json_t *j = line(o.text, i);
        cr_assert_eq(field(j, "cached_tokens"), want[i].cached, "line %d (%s): %s", i,
                     want[i].extra, o.text);
        json_decref(j);
    }
}

/* -o FILE gets the lines (stdout nothing); an unwritable one is a run error. */
Test(cli_batch, output_file_and_token_ids) {
    char in[128], outp[128], args[1024];
    write_file("in.jsonl",
               "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n{\"prompt\": 1}\n", in,
               sizeof in);
    snprintf(outp, sizeof outp, "%s/out.jsonl", dir);
    struct out o;
    snprintf(args, sizeof args, "batch -m %s -i %s -o %s --kv-type f32 --token-ids -q", F32, in,
             outp);
    llmd(&o, args);
    cr_assert_eq(o.code, 3, "exit %d: %s", o.code, o.err);
    cr_assert_str_eq(o.text, "", "stdout stays empty with -o");
    FILE *f = fopen(outp, "r");
    cr_assert_not_null(f);
    static char got[4096];
    got[fread(got, 1, sizeof got - 1, f)] = '\0';
    fclose(f);
    cr_assert_str_eq(got,
                     "{\"id\":0,\"text\":\", there was a\",\"finish_reason\":\"length\","
                     "\"prompt_tokens\":5,\"completion_tokens\":4,\"cached_tokens\":0,"
                     "\"restored_tokens\":0,\"token_ids\":[432,383,286,261]}\n"
                     "{\"id\":1,\"error\":{\"message\":\"'prompt' must be a string or an array of "
                     "token ids\",\"type\":\"invalid_request_error\",\"param\":\"prompt\","
                     "\"code\":\"invalid_type\"}}\n");
    snprintf(args, sizeof args, "batch -m %s -i %s -o %s/no/such/dir/out.jsonl", F32, in, dir);
    llmd(&o, args);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.err);
    cr_assert(strstr(o.err, "llmd batch: cannot write ") && strstr(o.err, "No such file"), "%s",
              o.err);
}

Test(cli_batch, flag_errors) {
    struct out o;
    char args[1024];
    snprintf(args, sizeof args, "batch -m %s --nvme-tier %s/x.slots", F32, dir);
    llmd(&o, args);
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.err, "--nvme-tier needs --host-tier"), "%s", o.err);
    /* and --help says so (serve's did, batch's did not) */
    llmd(&o, "batch --help");
    cr_assert_eq(o.code, 0, "%s", o.err);
    cr_assert(strstr(o.text, "--nvme-tier PATH[,BYTES]  NVMe tier slot file (default size 4G; "
                             "needs\n                            --host-tier)"),
              "%s", o.text);
    snprintf(args, sizeof args, "batch -m %s --host-tier 12Q", F32);
    llmd(&o, args);
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.err, "llmd batch: invalid value '12Q' for --host-tier: want a size in "
                            "bytes (K/M/G suffixes)\n");
    /* the flags the user typed, not the engine's config fields */
    snprintf(args, sizeof args, "batch -m %s --max-seqs 16 --max-batched-tokens 8", F32);
    llmd(&o, args);
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.err, "llmd batch: --max-batched-tokens (8) must be >= --max-seqs (16): "
                            "every running sequence needs a token in each step\n");
    /* an engine error once, not "llmd batch: llmd: ..." */
    batch(&o, "{\"prompt\": \"Once\"}\n", "--prefix-secret /nonexistent/key");
    cr_assert_eq(o.code, 1);
    cr_assert_str_eq(o.err, "llmd batch: prefix-cache secret /nonexistent/key: No such file or "
                            "directory\n");
    cr_assert_str_eq(o.text, "");
    /* an unknown KV type is refused, not taken for f16 */
    snprintf(args, sizeof args, "batch -m %s --kv-type f8", F32);
    llmd(&o, args);
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.err, "llmd batch: invalid value 'f8' for --kv-type: want f16, f32, q8_0, "
                            "q4_0 or fp8\n");
    /* and a good run after */
    batch(&o, "{\"prompt\": \"Once\", \"max_tokens\": 1}\n", "-q");
    cr_assert_eq(o.code, 0, "%s", o.err);
}

/* Two processes on one NVMe slot file: the second prefills at most a page
 * (16 tokens) plus its own question of the 400-token document the first
 * one left behind, and prints the same text as a run without any cache. */
Test(cli_batch, nvme_tier_carries_a_prefix_to_the_next_process) {
    /* 400 tokens of document: a fixed string the tokenizer splits finely */
    char doc[4096] = "";
    for (int i = 0; i < 20; i++) /* 20 tokens each */
        strcat(doc, "The little dog ran to the big red barn and saw a cat. ");
    static char json1[8192], json2[8192];
    snprintf(json1, sizeof json1,
             "{\"prompt\": \"%s Where did the dog run?\", \"max_tokens\": 12}\n", doc);
    snprintf(json2, sizeof json2,
             "{\"prompt\": \"%s What did the dog see?\", \"max_tokens\": 12}\n", doc);
    char in1[128], in2[128], secret[128], args[2048];
    write_file("q1.jsonl", json1, in1, sizeof in1);
    write_file("q2.jsonl", json2, in2, sizeof in2);
    write_file("secret", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
               secret, sizeof secret);
    const char *common = "--ctx 512 --kv-type f32 --host-tier 4M --offload-always";
    struct out o1, o2, plain;
    snprintf(args, sizeof args,
             "batch -m %s -i %s %s --nvme-tier %s/kv.slots,32M --prefix-secret %s", F32, in1,
             common, dir, secret);
    llmd(&o1, args);
    cr_assert_eq(o1.code, 0, "process 1: %s", o1.text);
    snprintf(args, sizeof args,
             "batch -m %s -i %s %s --nvme-tier %s/kv.slots,32M --prefix-secret %s", F32, in2,
             common, dir, secret);
    llmd(&o2, args);
    cr_assert_eq(o2.code, 0, "process 2: %s", o2.text);
    snprintf(args, sizeof args, "batch -m %s -i %s --ctx 512", F32, in2);
    llmd(&plain, args);
    cr_assert_eq(plain.code, 0);
    json_t *a = line(o1.text, 0), *b = line(o2.text, 0), *c = line(plain.text, 0);
    long prompt = field(b, "prompt_tokens"), cached = field(b, "cached_tokens");
    cr_assert_gt(field(a, "prompt_tokens"), 400, "the document must be 400+ tokens");
    cr_assert_eq(field(a, "restored_tokens"), 0, "process 1 starts empty");
    cr_assert_eq(field(b, "restored_tokens"), cached, "process 2's hit came from NVMe");
    cr_assert_geq(cached, 384, "process 2 restored %ld of %ld prompt tokens", cached, prompt);
    cr_assert_str_eq(json_string_value(json_object_get(b, "text")),
                     json_string_value(json_object_get(c, "text")),
                     "restored pages changed the text");
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

/* With only --host-tier and --nvme-tier (no --prefix-secret, no
 * --offload-always), a second run restores what the first left: the first
 * makes the key file beside the tier (mode 0600) and its exit flush writes
 * the cached pages whatever the spill policy measured, saying exactly how
 * many. Each run used to draw a random key, so nothing was ever found, and
 * the exit line announced pages the policy then dropped. A key file others
 * may read is refused; once fixed, the tier works again. */
Test(cli_batch, nvme_tier_survives_a_restart_with_the_default_flags) {
    const char *doc = "The little dog ran to the big red barn and saw a cat. The little dog ran "
                      "to the big red barn and saw a cat. The little dog ran to the big red barn "
                      "and saw a cat. The little dog ran to the big red barn and saw a cat.";
    char input[1024], tier[128], key[160];
    snprintf(input, sizeof input, "{\"prompt\": \"%s\", \"max_tokens\": 8}\n", doc);
    snprintf(tier, sizeof tier, "--host-tier 4M --nvme-tier %s/kv.slots,32M", dir);
    snprintf(key, sizeof key, "%s/kv.slots.key", dir);
    struct out o1, o2, o3;
    batch(&o1, input, tier);
    cr_assert_eq(o1.code, 0, "run 1: %s", o1.err);
    struct stat st;
    cr_assert_eq(stat(key, &st), 0, "no key file beside the tier");
    cr_assert_eq(st.st_mode & 0777, 0600, "key file mode %o", st.st_mode & 0777);
    cr_assert(strstr(o1.err, "  at exit: 2 cached pages written to the NVMe tier, 0 already there; "
                             "it holds 2 pages for the next run\n"),
              "%s", o1.err);
    batch(&o2, input, tier);
    cr_assert_eq(o2.code, 0, "run 2: %s", o2.err);
    json_t *a = line(o1.text, 0), *b = line(o2.text, 0);
    cr_assert_eq(field(a, "restored_tokens"), 0);
    cr_assert_eq(field(b, "prompt_tokens"), 81);
    cr_assert_eq(field(b, "restored_tokens"), 64, "run 2: %s", o2.text);
    cr_assert_eq(field(b, "cached_tokens"), 64);
    cr_assert_str_eq(str(b, "text"), str(a, "text"), "restored pages changed the text");
    json_decref(a);
    json_decref(b);
    cr_assert(strstr(o2.err, "  at exit: 0 cached pages written to the NVMe tier, 2 already there; "
                             "it holds 2 pages for the next run\n"),
              "%s", o2.err);
    cr_assert_eq(chmod(key, 0644), 0);
    batch(&o3, input, tier);
    cr_assert_eq(o3.code, 1, "exit %d: %s", o3.code, o3.err);
    cr_assert_str_eq(o3.text, "");
    cr_assert(strstr(o3.err, "kv.slots.key (beside the NVMe tier): group or others may read it, "
                             "or it is not a regular file: chmod 600 it (or give "
                             "--prefix-secret)"),
              "%s", o3.err);
    cr_assert_eq(chmod(key, 0600), 0);
    batch(&o3, input, tier);
    cr_assert_eq(o3.code, 0, "exit %d: %s", o3.code, o3.err);
    b = line(o3.text, 0);
    cr_assert_eq(field(b, "restored_tokens"), 64, "after the fix: %s", o3.text);
    json_decref(b);
}

/* regress: two models (f32 and q8_0 weights: two fingerprints) taking turns
 * on one slot file. Each run took the other model's slots as free and wrote
 * over them, so from the third run on every restore failed ("slot 3: checksum
 * mismatch: entry dropped") and nothing was restored. Another model's entries
 * now keep their slots: runs 3, 4 and 5 restore the story's 2 pages. */
Test(cli_batch, regress_models_taking_turns_on_one_nvme_tier_keep_their_pages) {
    const char *doc = "The little dog ran to the big red barn and saw a cat. The little dog ran "
                      "to the big red barn and saw a cat. The little dog ran to the big red barn "
                      "and saw a cat. The little dog ran to the big red barn and saw a cat.";
    char input[1024], in[128], args[1024];
    snprintf(input, sizeof input, "{\"prompt\": \"%s\", \"max_tokens\": 8}\n", doc);
    write_file("in.jsonl", input, in, sizeof in);
    for (int run = 0; run < 5; run++) {
        const char *m = run % 2 ? REF_MODELS "/stories260K-q8_0.gguf" : F32;
        snprintf(args, sizeof args, "batch -m %s -i %s --host-tier 16M --nvme-tier %s/t.slots,64M",
                 m, in, dir);
        struct out o;
        llmd(&o, args);
        cr_assert_eq(o.code, 0, "run %d: %s", run + 1, o.err);
        cr_assert_null(strstr(o.err, "checksum mismatch"), "run %d: %s", run + 1, o.err);
        cr_assert(strstr(o.err, "drops 0, write failures 0, checksum failures 0\n"), "run %d: %s",
                  run + 1, o.err);
        json_t *j = line(o.text, 0);
        cr_assert_eq(field(j, "restored_tokens"), run < 2 ? 0 : 64, "run %d: %s", run + 1, o.text);
        json_decref(j);
    }
}

/* --nvme-tier pointed at a file that is not a tier (a typo): refused, the
 * file left as it was, no index left behind. The tier used to cut it to the
 * tier's size and write slots over it. A directory leaves no index either. */
Test(cli_batch, nvme_tier_refuses_to_overwrite_a_file_that_is_not_a_tier) {
    char in[128], precious[128], args[1024], idx[160];
    write_file("in.jsonl", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n", in,
               sizeof in);
    static char text[300000];
    for (size_t i = 0; i + 1 < sizeof text; i++)
        text[i] = (char)('a' + i % 26);
    write_file("precious.txt", text, precious, sizeof precious);
    struct out o;
    snprintf(args, sizeof args, "batch -m %s -i %s --host-tier 1M --nvme-tier %s,1M", F32, in,
             precious);
    llmd(&o, args);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.err);
    cr_assert(strstr(o.err, "not overwriting it"), "%s", o.err);
    struct stat sb;
    cr_assert_eq(stat(precious, &sb), 0);
    cr_assert_eq(sb.st_size, (off_t)sizeof text - 1, "the file was cut to %ld bytes",
                 (long)sb.st_size);
    FILE *f = fopen(precious, "r");
    cr_assert_not_null(f);
    static char back[sizeof text];
    cr_assert_eq(fread(back, 1, sizeof back, f), sizeof text - 1);
    fclose(f);
    cr_assert_arr_eq(back, text, sizeof text - 1, "the file was overwritten");
    snprintf(idx, sizeof idx, "%s.idx", precious);
    cr_assert_neq(stat(idx, &sb), 0, "an index was left behind");
    /* a directory: refused, no index left either */
    snprintf(args, sizeof args, "batch -m %s -i %s --host-tier 1M --nvme-tier %s,1M", F32, in, dir);
    llmd(&o, args);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.err);
    snprintf(idx, sizeof idx, "%s.idx", dir);
    cr_assert_neq(stat(idx, &sb), 0, "an index was left behind");
}

/* An NVMe tier smaller than one slot is refused with the size it needs
 * (it said "bad config: 1 bytes make 0 slots of 20480"). */
Test(cli_batch, nvme_tier_smaller_than_a_page_says_how_much) {
    char in[128], args[1024];
    write_file("in.jsonl", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n", in,
               sizeof in);
    struct out o;
    snprintf(args, sizeof args,
             "batch -m %s -i %s --kv-type f32 --host-tier 1M --nvme-tier %s/kv.slots,20479", F32,
             in, dir);
    llmd(&o, args);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.err);
    cr_assert(strstr(o.err, "kv.slots: 20479 bytes hold no slot of 20480 bytes"), "%s", o.err);
    cr_assert(strstr(o.err, "give at least 20480"), "%s", o.err);
}

/* A quantized cache in batch: the summary names the type, its bytes a token
 * and how many sequences ran at once (4 prompts, --max-seqs 4: all four). */
Test(cli_batch, kv_type_in_the_summary) {
    struct out o;
    batch(&o,
          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4, \"temperature\": 0}\n"
          "{\"prompt\": \"The cat\", \"max_tokens\": 4, \"temperature\": 0}\n"
          "{\"prompt\": \"A dog\", \"max_tokens\": 4, \"temperature\": 0}\n"
          "{\"prompt\": \"Lily\", \"max_tokens\": 4, \"temperature\": 0}\n",
          "--kv-type q4_0 --max-seqs 4 --ctx 128");
    cr_assert_eq(o.code, 0, "%s", o.err);
    cr_assert_eq(n_lines(o.text), 4, "%s", o.text);
    cr_assert(strstr(o.err, "  KV q4_0, 192 B a token, "), "%s", o.err);
    cr_assert(strstr(o.err, "; at most 4 sequences running at once"), "%s", o.err);
    /* lines that end in their prefill step ran too (the count read after
     * each step said 0) */
    batch(&o,
          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1}\n"
          "{\"prompt\": \"The cat\", \"max_tokens\": 1}\n"
          "{\"prompt\": \"A dog\", \"max_tokens\": 1}\n",
          "--max-seqs 4 --ctx 128");
    cr_assert_eq(o.code, 0, "%s", o.err);
    cr_assert(strstr(o.err, "; at most 3 sequences running at once"), "%s", o.err);
}

/* --spec ngram: every line's text is the plain run's, each has the counts
 * of its drafts ("speculative": false: none), and the flags refuse bad
 * values by name. */
Test(cli_batch, spec_keeps_the_text_and_counts_the_drafts) {
    char in[128], args[1024];
    write_file("in.jsonl",
               "{\"prompt\": \"The cat was very happy. The cat was very happy. The cat\", "
               "\"max_tokens\": 40}\n"
               "{\"prompt\": \"Tom had a dog. The dog was big. Tom had a dog.\", \"max_tokens\": "
               "30}\n"
               "{\"prompt\": \"Tom had a dog. The dog was big. Tom had a dog.\", \"max_tokens\": "
               "30, \"speculative\": false}\n",
               in, sizeof in);
    struct out plain, spec;
    snprintf(args, sizeof args, "batch -m %s -i %s --ctx 256", F32, in);
    llmd(&plain, args);
    cr_assert_eq(plain.code, 0, "exit %d: %s", plain.code, plain.err);
    snprintf(args, sizeof args, "batch -m %s -i %s --ctx 256 --spec ngram --spec-tokens 5", F32,
             in);
    llmd(&spec, args);
    cr_assert_eq(spec.code, 0, "exit %d: %s", spec.code, spec.err);
    for (int i = 0; i < 3; i++) {
        json_t *a = line(plain.text, i), *b = line(spec.text, i);
        cr_assert_str_eq(str(b, "text"), str(a, "text"), "line %d", i);
        cr_assert_eq(field(b, "completion_tokens"), field(a, "completion_tokens"));
        cr_assert_null(json_object_get(a, "spec_draft_tokens"), "no counts without --spec");
        long d = field(b, "spec_draft_tokens"), acc = field(b, "spec_accepted_tokens");
        cr_assert_leq(acc, d, "line %d", i);
        if (i == 2)
            cr_assert_eq(d, 0, "the line that opted out drafted %ld", d);
        json_decref(a);
        json_decref(b);
    }
    struct out o;
    snprintf(args, sizeof args, "batch -m %s -i %s --spec 1", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.err, "invalid value '1' for --spec: want ngram, draft or none"), "%s",
              o.err);
    snprintf(args, sizeof args, "batch -m %s -i %s --spec ngram --spec-tokens 0", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.err, "for --spec-tokens: want an integer 1..32"), "%s", o.err);
    snprintf(args, sizeof args, "batch -m %s -i %s --spec-tokens 3", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.err, "--spec-tokens needs --spec ngram"), "%s", o.err);
    write_file("bad.jsonl", "{\"prompt\": \"x\", \"speculative\": 0}\n", in, sizeof in);
    snprintf(args, sizeof args, "batch -m %s -i %s --spec ngram", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 3, "%s", o.err);
    expect_error_line(o.text, 0, "0", "invalid_type", "speculative",
                      "'speculative' must be a boolean");
    /* a step budget of --max-seqs runs, but leaves drafts no room at full load: said once */
    write_file("ok.jsonl", "{\"prompt\": \"Tom had a dog.\", \"max_tokens\": 3}\n", in, sizeof in);
    snprintf(args, sizeof args,
             "batch -m %s -i %s --spec ngram --max-seqs 2 --max-batched-tokens 2", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 0, "%s", o.err);
    cr_assert(strstr(o.err, "llmd batch: warning: drafts ride in the step budget, and "
                            "--max-batched-tokens 2 leaves none for them while all 2 sequences "
                            "decode"),
              "%s", o.err);
    snprintf(args, sizeof args, "batch -m %s -i %s --max-seqs 2 --max-batched-tokens 2", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 0, "%s", o.err);
    cr_assert_null(strstr(o.err, "drafts ride"), "no speculation, no warning: %s", o.err);
    cr_assert_null(strstr(o.err, "speculative:"), "%s", o.err);
    /* one token, from the prefill: nothing to draft, and the summary says so */
    write_file("one.jsonl", "{\"prompt\": \"Tom had a dog.\", \"max_tokens\": 1}\n", in, sizeof in);
    snprintf(args, sizeof args, "batch -m %s -i %s --spec ngram", F32, in);
    llmd(&o, args);
    cr_assert_eq(o.code, 0, "%s", o.err);
    cr_assert(strstr(o.err, "  speculative: nothing drafted: no draft found, or none worth its "
                            "cost to the length policy (a step of n tokens: "),
              "%s", o.err);
}

/* "logprobs": N gives serve's /v1/completions shape in the line; the values
 * do not depend on N or on the line's neighbours. */
Test(cli_batch, logprobs_in_the_completions_shape) {
    struct out o;
    batch(&o,
          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4, \"logprobs\": 2}\n"
          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4, \"logprobs\": 0}\n"
          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n",
          "-q");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    json_t *a = line(o.text, 0), *b = line(o.text, 1), *c = line(o.text, 2);
    json_t *la = json_object_get(a, "logprobs"), *lb = json_object_get(b, "logprobs");
    static const char *const want[] = {",", " there", " was", " a"};
    json_t *toks = json_object_get(la, "tokens");
    cr_assert_eq(json_array_size(toks), 4, "%s", o.text);
    for (size_t i = 0; i < 4; i++) {
        cr_assert_str_eq(json_string_value(json_array_get(toks, i)), want[i]);
        double l = json_number_value(json_array_get(json_object_get(la, "token_logprobs"), i));
        json_t *top = json_array_get(json_object_get(la, "top_logprobs"), i);
        cr_assert_eq(json_object_size(top), 2);
        cr_assert_eq(json_number_value(json_object_get(top, want[i])), l, "greedy is the top");
        cr_assert_eq(json_number_value(json_array_get(json_object_get(lb, "token_logprobs"), i)), l,
                     "token %zu: the same with no alternatives", i);
        cr_assert_eq(json_object_size(json_array_get(json_object_get(lb, "top_logprobs"), i)), 0);
        cr_assert_eq(json_integer_value(json_array_get(json_object_get(la, "text_offset"), i)),
                     (json_int_t)(i == 0   ? 0
                                  : i == 1 ? 1
                                  : i == 2 ? 7
                                           : 11));
    }
    cr_assert_null(json_object_get(c, "logprobs"), "not asked: no key");
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

/* "echo": true: the prompt's text first, and with logprobs its records (the
 * first token's null); max_tokens 0 scores the prompt alone. */
Test(cli_batch, echo_and_prompt_scoring) {
    struct out o;
    batch(&o,
          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 0, \"echo\": true, \"logprobs\": 1}\n"
          "{\"prompt\": [1, 403, 407], \"max_tokens\": 2, \"echo\": true}\n",
          "-q");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    json_t *a = line(o.text, 0), *b = line(o.text, 1);
    cr_assert_str_eq(str(a, "text"), "Once upon a time");
    cr_assert_eq(field(a, "completion_tokens"), 0);
    cr_assert_str_eq(str(a, "finish_reason"), "length");
    json_t *lps = json_object_get(json_object_get(a, "logprobs"), "token_logprobs");
    cr_assert_eq(json_array_size(lps), 5, "%s", o.text);
    cr_assert(json_is_null(json_array_get(lps, 0)));
    for (size_t i = 1; i < 5; i++) {
        double l = json_number_value(json_array_get(lps, i));
        cr_assert(l < 0 && l > -20, "token %zu: %f", i, l);
    }
    cr_assert(strncmp(str(b, "text"), " Once upon", 10) == 0, "%s", str(b, "text"));
    cr_assert_eq(field(b, "completion_tokens"), 2);
    json_decref(a);
    json_decref(b);
}

/* n > 1 in a line: "choices" in index order, choice i equal to the line
 * alone with seed + i, the prompt counted once and the completion tokens
 * summed; the prompt (300 ids) prefilled once for its four choices, as
 * the summary's prefill count says (300 + 3 x 12). (issue 18) */
Test(cli_batch, n_choices_in_a_line) {
    static char ids[4096], input[32768];
    size_t k = (size_t)snprintf(ids, sizeof ids, "[1");
    for (int i = 1; i < 300; i++)
        k += (size_t)snprintf(ids + k, sizeof ids - k, ",%d", 3 + (i * 41) % 500);
    snprintf(ids + k, sizeof ids - k, "]");
    size_t at = (size_t)snprintf(input, sizeof input,
                                 "{\"prompt\": %s, \"n\": 4, \"max_tokens\": 6, \"temperature\": "
                                 "1, \"seed\": 9}\n",
                                 ids);
    struct out o;
    batch(&o, input, "--ctx 512");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.err);
    cr_assert(strstr(o.err, "prefill 336 tokens, prefix hits 864 tokens"), "%s", o.err);
    json_t *all = line(o.text, 0);
    json_t *ch = json_object_get(all, "choices");
    cr_assert_eq(json_array_size(ch), 4, "%s", o.text);
    cr_assert_eq(field(all, "prompt_tokens"), 300);
    cr_assert_eq(field(all, "completion_tokens"), 24);
    cr_assert_null(json_object_get(all, "text"), "no flat text beside choices");
    at = 0;
    for (int i = 0; i < 4; i++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"prompt\": %s, \"max_tokens\": 6, \"temperature\": 1, "
                               "\"seed\": %d}\n",
                               ids, 9 + i);
    static struct out one;
    batch(&one, input, "-q --ctx 512");
    cr_assert_eq(one.code, 0, "exit %d: %s", one.code, one.err);
    for (int i = 0; i < 4; i++) {
        json_t *c = json_array_get(ch, (size_t)i), *l = line(one.text, i);
        cr_assert_eq(field(c, "index"), i);
        cr_assert_eq(field(c, "completion_tokens"), 6);
        cr_assert_str_eq(str(c, "finish_reason"), "length");
        cr_assert_str_eq(str(c, "text"), str(l, "text"), "choice %d", i);
        json_decref(l);
    }
    json_decref(all);
}
