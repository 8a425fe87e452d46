/* GET /metrics of the real `llmd serve`, read by Prometheus' own checker
 * and counted against the requests sent. promtool (Debian's prometheus
 * package, installed by `make deps-test`) parses the page and lints it:
 * clean with --no-vllm-metrics; by default its only complaints are the
 * eight vLLM-compatible names, whose ':' its linter reserves for recording
 * rules (docs/serving.md, "promtool"). The names routers read besides the
 * four gauges (vllm:cache_config_info's labels, vllm:lora_requests_info,
 * the prefix-cache counters, the tiers' capacity) are checked against the
 * server's own llmd_* figures and its flags. The counters are checked through the
 * command and its defaults where test_serve_api.c checks the in-process
 * server: a stop string that surely matches, chat and streamed requests,
 * refused requests that must count nowhere but in their HTTP status, and
 * the prefix cache's tokens. */
#include <dirent.h>

#include "tests/lib/http_util.h"
#include "tests/lib/proc_util.h"

#define SERVE_ARGS "-m " HT_MODEL " --port 0 -q --ctx 128 --kv-type f32 -t 1"

/* Some of everything, so that every histogram has observations and
 * several status codes have counts: a completion, a streamed chat, a 404. */
static void some_traffic(uint16_t port) {
    struct ht_resp r;
    ht_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":6}", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    ht_free(&r);
    ht_post(port, "/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,"
            "\"stream\":true}",
            &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    ht_free(&r);
    ht_post(port, "/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"Hi\"}", &r);
    ht_assert_error(&r, 404, "model_not_found");
    ht_free(&r);
}

static void scrape(uint16_t port, struct ht_resp *r) {
    ht_request(port, "GET", "/metrics", NULL, NULL, r);
    cr_assert_eq(r->status, 200, "%s", r->body);
}

/* `promtool check metrics` on text; fails naming the set-up when promtool
 * is not there. */
static void promtool(const struct ht_resp *m, struct proc_out *o) {
    const char *const argv[] = {"promtool", "check", "metrics", NULL};
    proc_run(argv, m->body, m->len, o);
    cr_assert_neq(o->code, 127,
                  "promtool cannot run: run `make deps-test` (Debian package prometheus). %s",
                  o->err);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

Test(serve_metrics, promtool_is_clean_without_the_vllm_gauges, .timeout = 60) {
    struct proc p;
    serve_start(&p, SERVE_ARGS " --no-vllm-metrics");
    some_traffic(p.port);
    struct ht_resp m;
    scrape(p.port, &m);
    cr_assert_null(strstr(m.body, "vllm:"), "--no-vllm-metrics: %s", m.body);
    struct proc_out o;
    promtool(&m, &o);
    cr_assert_eq(o.code, 0, "promtool exit %d:\n%s%s", o.code, o.out, o.err);
    cr_assert_eq(o.out_len + o.err_len, 0, "promtool said:\n%s%s", o.out, o.err);
    proc_out_free(&o);
    ht_free(&m);
    serve_stop(&p);
}

/* Exit 3 is "lint problems only" (1 would be a page that does not parse),
 * and the problems are exactly the ':' of the eight vLLM names. */
Test(serve_metrics, promtool_flags_only_the_vllm_names, .timeout = 60) {
    struct proc p;
    serve_start(&p, SERVE_ARGS);
    some_traffic(p.port);
    struct ht_resp m;
    scrape(p.port, &m);
    struct proc_out o;
    promtool(&m, &o);
    cr_assert_eq(o.code, 3, "promtool exit %d (3: lint only, 1: parse error):\n%s%s", o.code, o.out,
                 o.err);
    cr_assert_eq(o.out_len, 0, "%s", o.out);
    static const char *const want[] = {
        "vllm:cache_config_info metric names should not contain ':'",
        "vllm:gpu_cache_usage_perc metric names should not contain ':'",
        "vllm:kv_cache_usage_perc metric names should not contain ':'",
        "vllm:lora_requests_info metric names should not contain ':'",
        "vllm:num_requests_running metric names should not contain ':'",
        "vllm:num_requests_waiting metric names should not contain ':'",
        "vllm:prefix_cache_hits_total metric names should not contain ':'",
        "vllm:prefix_cache_queries_total metric names should not contain ':'",
    };
    const size_t n_want = sizeof(want) / sizeof(want[0]);
    const char *got[16];
    size_t n = 0;
    char *save, *lines = strdup(o.err);
    for (char *l = strtok_r(lines, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cr_assert_lt(n, 16, "too many complaints:\n%s", o.err);
        got[n++] = l;
    }
    qsort(got, n, sizeof(got[0]), cmp_str);
    cr_assert_eq(n, n_want, "promtool complained %zu times:\n%s", n, o.err);
    for (size_t i = 0; i < n_want; i++)
        cr_assert_str_eq(got[i], want[i], "complaint '%s', want '%s'", got[i], want[i]);
    free(lines);
    proc_out_free(&o);
    ht_free(&m);
    serve_stop(&p);
}

/* --- counters -------------------------------------------------------------- */

/* The page as {"name{labels}": value}: every line a comment or a sample
 * whose value parses, each series once. Caller decrefs. */
static json_t *parse_metrics(const struct ht_resp *m) {
    json_t *all = json_object();
    char *text = strdup(m->body), *save;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (l[0] == '#')
            continue;
        char *sp = strrchr(l, ' '), *end;
        cr_assert_not_null(sp, "not a sample: '%s'", l);
        *sp = '\0';
        double v = strtod(sp + 1, &end);
        cr_assert(end > sp + 1 && *end == '\0', "value of '%s': '%s'", l, sp + 1);
        cr_assert_null(json_object_get(all, l), "%s twice", l);
        json_object_set_new(all, l, json_real(v));
    }
    free(text);
    return all;
}

static double series(json_t *all, const char *key) {
    json_t *v = json_object_get(all, key);
    cr_assert_not_null(v, "no series %s", key);
    return json_real_value(v);
}

static void want_series(json_t *all, const char *key, double want) {
    double got = series(all, key);
    cr_assert_eq(got, want, "%s is %g, want %g", key, got, want);
}

/* The usage of a whole answer, added to sums[prompt, completion, cached]. */
static json_t *post_ok(uint16_t port, const char *path, const char *body, int64_t sums[3]) {
    struct ht_resp r;
    ht_post(port, path, body, &r);
    cr_assert_eq(r.status, 200, "%s -> %d: %s", body, r.status, r.body);
    json_t *j = ht_json(&r);
    ht_free(&r);
    json_t *u = json_object_get(j, "usage");
    sums[0] += json_integer_value(json_object_get(u, "prompt_tokens"));
    sums[1] += json_integer_value(json_object_get(u, "completion_tokens"));
    sums[2] += json_integer_value(
        json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    return j;
}

static const char *finish_of(json_t *j) {
    return json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason"));
}

#define REQS "llmd_requests_total{finish_reason=\""
#define HTTP "llmd_http_responses_total{code=\""

Test(serve_metrics, counters_agree_with_the_requests_sent, .timeout = 60) {
    struct proc p;
    serve_start(&p, SERVE_ARGS);
    struct ht_resp m;
    scrape(p.port, &m); /* a fresh server counts nothing yet (this scrape: later) */
    json_t *before = parse_metrics(&m);
    ht_free(&m);
    static const char *const zero[] = {REQS "length\"}",
                                       REQS "stop\"}",
                                       "llmd_prompt_tokens_total",
                                       "llmd_generation_tokens_total",
                                       HTTP "200\"}",
                                       "llmd_steps_total",
                                       "llmd_decode_map_waits_total",
                                       "llmd_kv_pages_mapped_ahead"};
    for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++)
        want_series(before, zero[i], 0);
    json_decref(before);

    int64_t sums[3] = {0}; /* prompt, completion, cached tokens as reported */
    /* three that end by length, greedy; a prompt of three KV pages twice,
     * so the second takes two whole pages from the prefix cache */
    const char *lng = "{\"prompt\":\"Once upon a time there was a big dog. The dog liked to run "
                      "in the park with his friend the cat, and they played all day long.\","
                      "\"max_tokens\":5,\"temperature\":0}";
    const char *const bodies[3] = {lng, lng, "{\"prompt\":\"The cat\",\"max_tokens\":5}"};
    for (int i = 0; i < 3; i++) {
        json_t *j = post_ok(p.port, "/v1/completions", bodies[i], sums);
        cr_assert_str_eq(finish_of(j), "length", "request %d", i);
        json_decref(j);
    }
    cr_assert_geq(sums[2], 32, "the repeated prompt took no page from the cache");
    /* a chat, streamed: its usage from the usage chunk */
    struct ht_resp r;
    ht_post(p.port, "/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
            "\"max_tokens\":5,\"temperature\":0,\"stream\":true,"
            "\"stream_options\":{\"include_usage\":true}}",
            &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *ev[64];
    bool done;
    size_t n_ev = ht_sse(r.body, ev, 64, &done);
    cr_assert(done && n_ev > 2, "%s", r.body);
    json_t *u = json_object_get(ev[n_ev - 1], "usage");
    cr_assert(json_is_object(u), "no usage chunk: %s", r.body);
    sums[0] += json_integer_value(json_object_get(u, "prompt_tokens"));
    sums[1] += json_integer_value(json_object_get(u, "completion_tokens"));
    cr_assert_eq(json_integer_value(json_object_get(u, "completion_tokens")), 5);
    for (size_t i = 0; i < n_ev; i++)
        json_decref(ev[i]);
    ht_free(&r);
    /* one that surely ends on its stop string (greedy: ", there was a
     * little girl named Lily.") */
    json_t *j = post_ok(p.port, "/v1/completions",
                        "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0,"
                        "\"stop\":\" girl\"}",
                        sums);
    cr_assert_str_eq(finish_of(j), "stop");
    json_decref(j);
    /* refused before the engine: two 400s (one after tokenizing), a 404 */
    static const struct {
        const char *body, *code;
        int status;
    } bad[] = {
        {"{\"prompt\":\"Hi\",\"max_tokens\":0}", "invalid_value", 400},
        {NULL, "context_length_exceeded", 400},
        {"{\"model\":\"gpt-4\",\"prompt\":\"Hi\"}", "model_not_found", 404},
    };
    char huge[2048] = "{\"prompt\":\"";
    for (int i = 0; i < 50; i++) /* 200+ tokens: over --ctx 128 */
        strcat(huge, "Once upon a time ");
    strcat(huge, "\",\"max_tokens\":4}");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ht_post(p.port, "/v1/completions", bad[i].body ? bad[i].body : huge, &r);
        ht_assert_error(&r, bad[i].status, bad[i].code);
        ht_free(&r);
    }

    scrape(p.port, &m);
    json_t *all = parse_metrics(&m);
    want_series(all, REQS "length\"}", 4);
    want_series(all, REQS "stop\"}", 1);
    want_series(all, REQS "abort\"}", 0);
    want_series(all, REQS "error\"}", 0);
    want_series(all, "llmd_e2e_request_latency_seconds_count", 5);
    want_series(all, "llmd_prompt_tokens_total", (double)sums[0]);
    want_series(all, "llmd_generation_tokens_total", (double)sums[1]);
    /* every accepted prompt token was either taken from the cache or
     * computed once (nothing was preempted to compute it again) */
    want_series(all, "llmd_prefix_hit_tokens_total", (double)sums[2]);
    want_series(all, "llmd_preemptions_total", 0);
    want_series(all, "llmd_prefill_tokens_total", (double)(sums[0] - sums[2]));
    /* every request looked its whole prompt up once (none was preempted),
     * and vLLM's names count the same tokens */
    want_series(all, "llmd_prefix_query_tokens_total", (double)sums[0]);
    want_series(all, "vllm:prefix_cache_queries_total{model_name=\"" HT_NAME "\"}",
                (double)sums[0]);
    want_series(all, "vllm:prefix_cache_hits_total{model_name=\"" HT_NAME "\"}", (double)sums[2]);
    /* five answers and the first scrape; the refusals by status only */
    want_series(all, HTTP "200\"}", 6);
    want_series(all, HTTP "400\"}", 2);
    want_series(all, HTTP "404\"}", 1);
    want_series(all, HTTP "other\"}", 0);
    want_series(all, "llmd_requests_running", 0);
    want_series(all, "llmd_requests_waiting", 0);
    /* map-ahead runs beside the steps (how many waited depends on timing),
     * and nothing stays mapped ahead once every request ended */
    series(all, "llmd_cpu_solo_periods_total"); /* present (its value follows the machine's load) */
    double waits = series(all, "llmd_decode_map_waits_total"),
           steps = series(all, "llmd_steps_total");
    cr_assert(steps > 0 && waits <= steps, "%g decode map waits in %g steps", waits, steps);
    want_series(all, "llmd_kv_pages_mapped_ahead", 0);
    /* the KV type and its bytes a token (stories260K, f32: 5 x 2 x 128) */
    want_series(all, "llmd_kv_token_bytes", 1280);
    want_series(all, "llmd_kv_cache_info{kv_type=\"f32\"}", 1);
    json_decref(all);
    ht_free(&m);
    serve_stop(&p);
}

/* --- what routers read besides ------------------------------------------------ */

/* The one series of family `name` in the page: its labels into labels (the
 * text between the braces), its value returned. */
static double only_series(json_t *all, const char *name, char *labels, size_t cap) {
    const char *key, *found = NULL;
    json_t *v;
    size_t n = strlen(name);
    json_object_foreach(all, key, v) {
        if (strncmp(key, name, n) == 0 && key[n] == '{') {
            cr_assert_null(found, "%s twice: %s and %s", name, found, key);
            found = key;
        }
    }
    cr_assert_not_null(found, "no series of %s", name);
    size_t len = strlen(found + n + 1);
    cr_assert(len > 0 && found[n + len] == '}', "%s", found);
    snprintf(labels, cap, "%.*s", (int)(len - 1), found + n + 1);
    return json_real_value(json_object_get(all, found));
}

/* vllm:cache_config_info's labels are the pool's geometry as the llmd_*
 * gauges report it, and the tiers' capacities are their sizes in pages:
 * stories260K with f32 KV is 1280 bytes a token, so a page of 16 tokens is
 * 20480 bytes, a 2 MiB host tier (its region: 2 MiB aligned) 102 pages
 * and a 4 MiB NVMe tier 204 slots (20480 is a multiple of 4 KiB: no
 * padding). */
Test(serve_metrics, cache_config_info_and_tier_capacity, .timeout = 60) {
    char dir[] = "/tmp/llmd-metrics-XXXXXX", args[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(args, sizeof(args), SERVE_ARGS " --host-tier 2M --nvme-tier %s/kv.slots,4M", dir);
    struct proc p;
    serve_start(&p, args);
    some_traffic(p.port);
    struct ht_resp m;
    scrape(p.port, &m);
    json_t *all = parse_metrics(&m);
    double page = series(all, "llmd_kv_page_bytes"), tok = series(all, "llmd_kv_token_bytes");
    double pages = series(all, "llmd_kv_pages{state=\"free\"}") +
                   series(all, "llmd_kv_pages{state=\"cached\"}") +
                   series(all, "llmd_kv_pages{state=\"used\"}");
    cr_assert_eq(page, 20480, "page bytes %g", page);
    cr_assert_eq(tok, 1280);
    char want[1024], got[1024];
    snprintf(want, sizeof(want),
             "block_size=\"%.0f\",cache_dtype=\"float32\",enable_prefix_caching=\"True\","
             "is_attention_free=\"False\",kv_cache_memory_bytes=\"%.0f\","
             "kv_offloading_size=\"0.001953125\",num_cpu_blocks=\"102\",num_gpu_blocks=\"%.0f\","
             "sliding_window=\"None\",engine=\"0\"",
             page / tok, pages * page, pages);
    double v = only_series(all, "vllm:cache_config_info", got, sizeof(got));
    cr_assert_str_eq(got, want);
    cr_assert_eq(v, 1);
    want_series(all, "llmd_kv_tier_capacity_pages{tier=\"host\"}", 102);
    want_series(all, "llmd_kv_tier_capacity_pages{tier=\"nvme\"}", 204);
    /* no LoRA; the value is the time of the scrape, as vLLM's is of its
     * last update */
    v = only_series(all, "vllm:lora_requests_info", got, sizeof(got));
    cr_assert_str_eq(got, "max_lora=\"0\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"");
    double now = (double)time(NULL);
    cr_assert(v > now - 60 && v < now + 60, "lora_requests_info %f, now %f", v, now);
    json_decref(all);
    ht_free(&m);
    serve_stop(&p);
    /* the slot file and what the tier keeps beside it (index, key) */
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (de->d_name[0] != '.')
            unlink(path);
    }
    closedir(d);
    cr_assert_eq(rmdir(dir), 0, "%s: %s", dir, strerror(errno));
}

/* Without the prefix cache nothing is looked up, the info says so, and the
 * tiers (none) hold nothing; a q8_0 KV is named as llmd names it (vLLM has
 * no such type). */
Test(serve_metrics, no_prefix_cache_no_queries, .timeout = 60) {
    struct proc p;
    serve_start(&p, "-m " HT_MODEL " --port 0 -q --ctx 128 --kv-type q8_0 -t 1 --no-prefix-cache");
    some_traffic(p.port);
    struct ht_resp m;
    scrape(p.port, &m);
    json_t *all = parse_metrics(&m);
    cr_assert_gt(series(all, "llmd_prompt_tokens_total"), 0);
    want_series(all, "llmd_prefix_query_tokens_total", 0);
    want_series(all, "vllm:prefix_cache_queries_total{model_name=\"" HT_NAME "\"}", 0);
    want_series(all, "vllm:prefix_cache_hits_total{model_name=\"" HT_NAME "\"}", 0);
    want_series(all, "llmd_kv_tier_capacity_pages{tier=\"host\"}", 0);
    want_series(all, "llmd_kv_tier_capacity_pages{tier=\"nvme\"}", 0);
    char got[1024];
    only_series(all, "vllm:cache_config_info", got, sizeof(got));
    cr_assert(strstr(got, "cache_dtype=\"q8_0\",enable_prefix_caching=\"False\","), "%s", got);
    cr_assert(strstr(got, "kv_offloading_size=\"None\",num_cpu_blocks=\"0\","), "%s", got);
    json_decref(all);
    ht_free(&m);
    serve_stop(&p);
}

/* Scrape until series key reaches at least min (the publisher thread sends
 * batches after the engine queues them: within about 150 ms when idle,
 * docs/kv-events.md), for at most 5 s; the last page parsed. */
static json_t *scrape_until(uint16_t port, const char *key, double min) {
    for (int i = 0;; i++) {
        struct ht_resp m;
        scrape(port, &m);
        json_t *all = parse_metrics(&m);
        ht_free(&m);
        if (series(all, key) >= min || i == 100)
            return all;
        json_decref(all);
        usleep(50000);
    }
}

/* KV-cache events and a sliding window: on the mistral-swa dummy (a
 * 32-token window, pages of 16 tokens) with --kv-events, one long greedy
 * completion lets go of the pages behind the window, and the prompt's
 * whole page is announced. No subscriber is connected: a PUB socket
 * without one drops what it is sent (ZeroMQ), which the engine does not
 * see and must not count as dropped; its queue never filled. Before the
 * request the publisher has sent its AllBlocksCleared (one event, one
 * batch, sent by its own thread soon after start-up) and nothing else. */
Test(serve_metrics, kv_events_and_window_pages, .timeout = 60) {
    char dir[] = "/tmp/llmd-kvev-XXXXXX", args[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(args, sizeof(args),
             "-m dummy:tiny:f32:mistral-swa --port 0 -q --ctx 256 --kv-type f32 -t 1 "
             "--kv-events ipc://%s/ev",
             dir);
    struct proc p;
    serve_start(&p, args);
    json_t *all = scrape_until(p.port, "llmd_kv_event_batches_total", 1);
    want_series(all, "llmd_kv_events_total", 1);
    want_series(all, "llmd_kv_event_batches_total", 1);
    want_series(all, "llmd_kv_window_dropped_pages_total", 0);
    char got[1024];
    only_series(all, "vllm:cache_config_info", got, sizeof(got));
    cr_assert(strstr(got, ",sliding_window=\"32\","), "%s", got);
    json_decref(all);

    int64_t sums[3] = {0};
    json_t *j =
        post_ok(p.port, "/v1/completions",
                "{\"prompt\":\"Once upon a time\",\"max_tokens\":160,\"temperature\":0}", sums);
    json_decref(j);
    /* the KV holds every token but the last one returned; at most
     * ceil(32 / 16) + 2 of its pages stay mapped (docs/generate.md) */
    int64_t kv_tokens = sums[0] + sums[1] - 1, pages = (kv_tokens + 15) / 16;
    cr_assert_gt(kv_tokens, 96, "%lld tokens: too few to leave the window", (long long)kv_tokens);
    all = scrape_until(p.port, "llmd_kv_event_batches_total", 2);
    double dropped = series(all, "llmd_kv_window_dropped_pages_total");
    cr_assert(dropped >= (double)(pages - 4) && dropped < (double)pages, "%g pages dropped of %lld",
              dropped, (long long)pages);
    /* AllBlocksCleared, then at least the prompt's whole page stored */
    double ev = series(all, "llmd_kv_events_total"),
           batches = series(all, "llmd_kv_event_batches_total");
    cr_assert(ev >= 2 && batches >= 2 && batches <= ev, "%g events in %g batches", ev, batches);
    want_series(all, "llmd_kv_events_dropped_total", 0);
    json_decref(all);
    serve_stop(&p);
    char ev_path[512];
    snprintf(ev_path, sizeof(ev_path), "%s/ev", dir);
    unlink(ev_path);
    cr_assert_eq(rmdir(dir), 0, "%s: %s", dir, strerror(errno));
}
