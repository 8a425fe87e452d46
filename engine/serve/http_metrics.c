/* http_metrics.c - GET /metrics in the Prometheus text exposition format
 * (version 0.0.4: "# HELP", "# TYPE", then `name{label="value"} value`
 * lines; histograms as cumulative _bucket{le=...}, _sum and _count).
 *
 * Two families of names: llmd's own (llmd_*), and the vLLM names that
 * Kubernetes LLM routers (Gateway API inference extension, llm-d, AIBrix)
 * scrape to pick a replica: vllm:num_requests_waiting,
 * vllm:num_requests_running, vllm:gpu_cache_usage_perc and its newer name
 * vllm:kv_cache_usage_perc, with vLLM's model_name label. ':' is legal in
 * Prometheus metric names, but promtool's linter reserves it for recording
 * rules (--no-vllm-metrics leaves them out). Their meaning here: waiting = queued in the
 * scheduler, running = holding a KV range, cache usage = the fraction of KV
 * pages held by running sequences (free and cached-but-evictable pages
 * count as available, as vLLM's free blocks do), whatever the device.
 *
 * Beside those gauges, what the routers' scorers read besides (the Gateway
 * API inference extension's metric flags: --cache-info-metric,
 * --lora-info-metric; llm-d's prefix scorers and KV-cache indexer), in the
 * formats of vLLM v1's PrometheusStatLogger, as read in vllm-project/vllm:
 * vllm/v1/metrics/loggers.py at 005a810bc40faa25b8870fbc8559c3462581eee3
 * and CacheConfig.metrics_info() in vllm/config/cache.py at
 * 002f10e0cfa1373a19a0d2756598a34b700d20e5: vllm:cache_config_info, an info gauge (always 1)
 * whose labels carry the CacheConfig fields llmd can answer truthfully,
 * each value as Python's str() writes it (True, None); vllm:lora_requests_info,
 * whose value is the Unix time of the scrape as vLLM's is the time of its
 * last update (routers take the newest series), with empty adapter lists
 * and max_lora 0 (llmd has no LoRA); and vLLM v1's prefix-cache counters
 * in tokens, vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total
 * (prometheus_client appends _total to a counter's name). vLLM adds an
 * engine label (the engine core's index) to its series; llmd has one
 * engine, and keeps model_name alone on them as on the four gauges above,
 * except in cache_config_info, where engine="0" is one of the info labels.
 * What vLLM cannot tell a router, the tiers below the device, is llmd's
 * own: llmd_kv_tier_capacity_pages{tier} next to llmd_kv_tier_pages{tier}.
 *
 * Everything comes from one serve_metrics snapshot, taken by the engine
 * thread after its last step, so the numbers agree with each other; the
 * configuration from llmd_engine_info, read once at start.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/serve/http_impl.h"

const unsigned http_codes[HTTP_N_CODES] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 0};

/* A label value with \, " and newline escaped, as the format requires. */
static void http_label(struct http_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            http_buf_printf(b, "\\%c", *s);
        else if (*s == '\n')
            http_buf_puts(b, "\\n");
        else
            http_buf_add(b, s, 1);
    }
}

static void http_family(struct http_buf *b, const char *name, const char *type, const char *help) {
    http_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void http_scalar(struct http_buf *b, const char *name, const char *type, const char *help,
                        unsigned long long v) {
    http_family(b, name, type, help);
    http_buf_printf(b, "%s %llu\n", name, v);
}

static void http_hist(struct http_buf *b, const char *name, const char *help,
                      const struct serve_hist *h, enum serve_hist_kind k) {
    uint32_t n;
    const double *le = serve_hist_bounds(k, &n);
    http_family(b, name, "histogram", help);
    unsigned long long cum = 0;
    for (uint32_t i = 0; i < n; i++) {
        cum += h->counts[i];
        http_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, le[i], cum);
    }
    cum += h->counts[n];
    http_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, cum, name,
                    h->sum, name, (unsigned long long)h->n);
}

/* vLLM-named gauge with its model_name label. */
static void http_vllm(struct http_buf *b, const char *name, const char *help, const char *model,
                      const char *fmt_value, double v) {
    http_family(b, name, "gauge", help);
    http_buf_printf(b, "%s{model_name=\"", name);
    http_label(b, model);
    http_buf_puts(b, "\"} ");
    http_buf_printf(b, fmt_value, v);
    http_buf_puts(b, "\n");
}

/* vLLM-named counter with its model_name label. */
static void http_vllm_counter(struct http_buf *b, const char *name, const char *help,
                              const char *model, uint64_t v) {
    http_family(b, name, "counter", help);
    http_buf_printf(b, "%s{model_name=\"", name);
    http_label(b, model);
    http_buf_printf(b, "\"} %llu\n", (unsigned long long)v);
}

/* A {tier="host"} / {tier="nvme"} pair. */
static void http_tier_pair(struct http_buf *b, const char *name, const char *type, const char *help,
                           uint64_t host, uint64_t nvme) {
    http_family(b, name, type, help);
    http_buf_printf(b, "%s{tier=\"host\"} %llu\n%s{tier=\"nvme\"} %llu\n", name,
                    (unsigned long long)host, name, (unsigned long long)nvme);
}

/* The KV tiers below the device (docs/offload.md); zeros without them. */
static void http_tiers(struct http_buf *b, const struct llmd_stats *e,
                       const struct llmd_engine_info *in) {
    http_tier_pair(b, "llmd_kv_tier_pages", "gauge", "KV pages held by each tier below the device.",
                   e->host_tier_pages, e->nvme_tier_pages);
    http_tier_pair(b, "llmd_kv_tier_capacity_pages", "gauge",
                   "KV pages each tier below the device can hold (host: its budget in pages).",
                   in->host_tier_pages_max, in->nvme_tier_pages_max);
    http_scalar(b, "llmd_host_tier_bytes_used", "gauge", "Bytes of the host tier in use.",
                e->host_tier_bytes_used);
    http_tier_pair(b, "llmd_kv_spills_total", "counter", "KV pages moved down into each tier.",
                   e->spills_host_total, e->spills_nvme_total);
    http_tier_pair(b, "llmd_kv_restores_total", "counter", "KV pages brought back from each tier.",
                   e->restores_host_total, e->restores_nvme_total);
    http_tier_pair(b, "llmd_kv_spill_bytes_total", "counter", "Bytes written into each tier.",
                   e->spill_bytes_host_total, e->spill_bytes_nvme_total);
    http_tier_pair(b, "llmd_kv_restore_bytes_total", "counter", "Bytes read back from each tier.",
                   e->restore_bytes_host_total, e->restore_bytes_nvme_total);
    http_scalar(b, "llmd_restored_tokens_total", "counter",
                "Prompt tokens restored from a tier instead of prefilled.",
                e->restored_tokens_total);
    http_scalar(b, "llmd_offload_drops_total", "counter",
                "Cold KV pages no tier kept (recomputed when needed).", e->offload_drops_total);
    http_scalar(b, "llmd_offload_write_failures_total", "counter",
                "NVMe tier writes that failed or were short.", e->offload_write_failures_total);
    http_scalar(b, "llmd_offload_checksum_failures_total", "counter",
                "NVMe tier reads refused by their checksum.", e->offload_checksum_failures_total);
}

/* Speculative decoding (docs/engine.md); zeros without it. The acceptance
 * length histogram has one observation per decode step that verified a
 * draft: the draft tokens it accepted (le="0": none). */
static void http_spec(struct http_buf *b, const struct llmd_stats *e) {
    http_scalar(b, "llmd_spec_draft_tokens_total", "counter",
                "Speculative draft tokens proposed and verified.", e->spec_draft_tokens_total);
    http_scalar(b, "llmd_spec_accepted_tokens_total", "counter",
                "Draft tokens accepted by verification and returned.",
                e->spec_accepted_tokens_total);
    http_scalar(b, "llmd_spec_rollback_pages_total", "counter",
                "KV pages only rejected draft tokens had filled, returned to the pool.",
                e->spec_rollback_pages_total);
    static const uint32_t le[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
    const char *name = "llmd_spec_acceptance_length";
    http_family(b, name, "histogram",
                "Draft tokens accepted per verifying step (one observation a step and request).");
    unsigned long long cum = 0;
    uint32_t a = 0;
    for (size_t i = 0; i < sizeof(le) / sizeof(le[0]); i++) {
        for (; a <= le[i] && a <= LLMD_SPEC_TOKENS_MAX; a++)
            cum += e->spec_accepted_len[a];
        http_buf_printf(b, "%s_bucket{le=\"%u\"} %llu\n", name, le[i], cum);
    }
    http_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %llu\n%s_count %llu\n", name,
                    (unsigned long long)e->spec_steps_total, name,
                    (unsigned long long)e->spec_accepted_tokens_total, name,
                    (unsigned long long)e->spec_steps_total);
}

/* KV-cache events (docs/kv-events.md) and the pages a sliding window let
 * go (docs/generate.md); zeros without them. */
static void http_kv_events(struct http_buf *b, const struct llmd_stats *e) {
    http_scalar(b, "llmd_kv_events_total", "counter",
                "KV block events (stored, removed, cleared) queued for the publisher.",
                e->kv_events_total);
    http_scalar(b, "llmd_kv_events_dropped_total", "counter",
                "KV block events refused past the queue's high-water mark (a snapshot of every "
                "held block replaced them).",
                e->kv_events_dropped_total);
    http_scalar(b, "llmd_kv_event_batches_total", "counter",
                "KV event batches published (sequence numbers used).", e->kv_event_batches_total);
    http_scalar(b, "llmd_kv_window_dropped_pages_total", "counter",
                "KV pages behind every layer's sliding window, unmapped from their sequence.",
                e->kv_window_dropped_pages_total);
}

/* vLLM's cache_dtype for a KV type: its own word where vLLM has the type
 * (llmd's fp8 is E4M3), llmd's name where it has none. */
static const char *http_vllm_dtype(enum llmd_kv_type t) {
    switch (t) {
    case LLMD_KV_F16:
        return "float16";
    case LLMD_KV_F32:
        return "float32";
    case LLMD_KV_FP8:
        return "fp8_e4m3";
    default:
        return llmd_kv_type_name(t);
    }
}

/* A float as Python's str() writes it: the shortest digits that read back
 * as v, "8.0" for a whole number (below 1e16, where Python switches to an
 * exponent). */
static void http_pyfloat(struct http_buf *b, double v) {
    char s[40];
    if (v == (double)(long long)v && v > -1e16 && v < 1e16) {
        http_buf_printf(b, "%.0f.0", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(s, sizeof s, "%.*g", p, v);
        if (strtod(s, NULL) == v)
            break;
    }
    http_buf_puts(b, s);
}

/* vllm:cache_config_info and vllm:lora_requests_info (see the top). */
static void http_vllm_info(struct http_buf *b, const struct llmd_engine_info *in) {
    http_family(b, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    http_buf_printf(b,
                    "vllm:cache_config_info{block_size=\"%u\",cache_dtype=\"%s\","
                    "enable_prefix_caching=\"%s\",is_attention_free=\"False\","
                    "kv_cache_memory_bytes=\"%llu\",",
                    in->tokens_per_page, http_vllm_dtype(in->kv_type),
                    in->prefix_cache ? "True" : "False", (unsigned long long)in->kv_budget_bytes);
    if (in->host_tier_bytes) {
        http_buf_puts(b, "kv_offloading_size=\"");
        http_pyfloat(b, (double)in->host_tier_bytes / (double)(1ull << 30));
        http_buf_puts(b, "\",");
    } else {
        http_buf_puts(b, "kv_offloading_size=\"None\",");
    }
    http_buf_printf(b, "num_cpu_blocks=\"%llu\",num_gpu_blocks=\"%llu\",",
                    (unsigned long long)in->host_tier_pages_max, (unsigned long long)in->kv_pages);
    if (in->sliding_window)
        http_buf_printf(b, "sliding_window=\"%u\",", in->sliding_window);
    else
        http_buf_puts(b, "sliding_window=\"None\",");
    http_buf_puts(b, "engine=\"0\"} 1\n");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    http_family(b, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    http_buf_printf(b,
                    "vllm:lora_requests_info{max_lora=\"0\",waiting_lora_adapters=\"\","
                    "running_lora_adapters=\"\"} %.3f\n",
                    (double)now.tv_sec + (double)now.tv_nsec * 1e-9);
}

void http_metrics_format(struct http_buf *b, const struct serve_metrics *m,
                         const struct llmd_engine_info *info, const char *model,
                         const uint64_t responses[HTTP_N_CODES], bool no_vllm) {
    const struct llmd_stats *e = &m->engine;
    http_hist(b, "llmd_time_to_first_token_seconds",
              "Time from the request's arrival to its first output token.",
              &m->hist[SERVE_HIST_TTFT], SERVE_HIST_TTFT);
    http_hist(b, "llmd_inter_token_latency_seconds",
              "Time between consecutive output tokens of a request (one observation a token).",
              &m->hist[SERVE_HIST_ITL], SERVE_HIST_ITL);
    http_hist(b, "llmd_e2e_request_latency_seconds",
              "Time from the request's arrival to its last token, finished requests.",
              &m->hist[SERVE_HIST_E2E], SERVE_HIST_E2E);
    http_hist(b, "llmd_request_queue_time_seconds",
              "Time from submission to the request's first admission by the scheduler.",
              &m->hist[SERVE_HIST_QUEUE], SERVE_HIST_QUEUE);

    http_family(b, "llmd_requests_total", "counter",
                "Requests finished, by finish_reason (stop: EOS or a stop string; length: "
                "max_tokens or the context; kv_budget: the whole KV pool; abort: cancelled; "
                "error).");
    static const struct {
        const char *label;
        enum llmd_finish f[2];
    } reasons[] = {{"stop", {LLMD_FINISH_STOP, LLMD_FINISH_EOS}},
                   {"length", {LLMD_FINISH_LENGTH, LLMD_FINISH_CONTEXT}},
                   {"kv_budget", {LLMD_FINISH_KV_BUDGET, LLMD_FINISH_KV_BUDGET}},
                   {"abort", {LLMD_FINISH_CANCELLED, LLMD_FINISH_CANCELLED}},
                   {"error", {LLMD_FINISH_ERROR, LLMD_FINISH_ERROR}}};
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++) {
        uint64_t v = m->finished_total[reasons[i].f[0]];
        if (reasons[i].f[1] != reasons[i].f[0])
            v += m->finished_total[reasons[i].f[1]];
        http_buf_printf(b, "llmd_requests_total{finish_reason=\"%s\"} %llu\n", reasons[i].label,
                        (unsigned long long)v);
    }
    http_scalar(b, "llmd_prompt_tokens_total", "counter",
                "Prompt tokens of every request the engine accepted.", e->prompt_tokens_total);
    http_scalar(b, "llmd_generation_tokens_total", "counter", "Output tokens sampled.",
                e->generated_tokens_total);
    http_scalar(b, "llmd_prefix_hit_tokens_total", "counter",
                "Prompt tokens taken from the prefix cache instead of computed.",
                e->prefix_hit_tokens_total);
    http_scalar(b, "llmd_prefix_query_tokens_total", "counter",
                "Tokens looked up in the prefix cache, at each admission of a request that uses "
                "it (again after a preemption).",
                e->prefix_query_tokens_total);
    http_scalar(b, "llmd_prefill_tokens_total", "counter",
                "Prompt tokens computed, recomputation after preemption included.",
                e->prefill_tokens_total);
    http_scalar(b, "llmd_refusals_total", "counter",
                "Requests refused by admission control (HTTP 429).", e->refusals_total);
    http_scalar(b, "llmd_preemptions_total", "counter",
                "Running requests preempted to free KV pages.", e->preemptions_total);
    http_scalar(b, "llmd_steps_total", "counter", "Engine steps run.", e->steps_total);
    http_scalar(b, "llmd_decode_map_waits_total", "counter",
                "Engine steps in which a decode token's KV grow mapped a page itself (map-ahead "
                "off, behind, or the pool short); divide by llmd_steps_total for the share.",
                e->decode_map_waits_total);
    http_scalar(b, "llmd_cpu_solo_periods_total", "counter",
                "Times the CPU thread pool ran single-threaded for a while because its own thread "
                "kept being preempted (more runnable threads than CPUs: a busy neighbour).",
                e->cpu_solo_periods_total);
    http_family(b, "llmd_http_responses_total", "counter",
                "HTTP responses by status code (\"other\": statuses not listed).");
    for (int i = 0; i < HTTP_N_CODES; i++) {
        if (http_codes[i])
            http_buf_printf(b, "llmd_http_responses_total{code=\"%u\"} %llu\n", http_codes[i],
                            (unsigned long long)responses[i]);
        else
            http_buf_printf(b, "llmd_http_responses_total{code=\"other\"} %llu\n",
                            (unsigned long long)responses[i]);
    }

    http_scalar(b, "llmd_requests_running", "gauge", "Requests holding a KV range.",
                e->requests_running);
    http_scalar(b, "llmd_requests_waiting", "gauge", "Requests queued for admission.",
                e->requests_waiting);
    uint64_t used = e->kv_pages_total - e->kv_pages_free - e->kv_pages_cached;
    http_family(b, "llmd_kv_pages", "gauge",
                "KV pages by state: free, cached (an unreferenced prefix, evictable), used.");
    http_buf_printf(b, "llmd_kv_pages{state=\"free\"} %llu\n",
                    (unsigned long long)e->kv_pages_free);
    http_buf_printf(b, "llmd_kv_pages{state=\"cached\"} %llu\n",
                    (unsigned long long)e->kv_pages_cached);
    http_buf_printf(b, "llmd_kv_pages{state=\"used\"} %llu\n", (unsigned long long)used);
    http_scalar(b, "llmd_kv_page_bytes", "gauge", "Bytes of one KV page.", e->kv_page_bytes);
    http_scalar(b, "llmd_kv_token_bytes", "gauge",
                "Bytes of one token's K and V over all layers as stored (the KV type's layout, "
                "padded to 64 B).",
                e->kv_token_bytes);
    if (e->kv_draft_token_bytes) {
        http_scalar(b, "llmd_kv_draft_token_bytes", "gauge",
                    "Bytes of each token's KV that hold the draft model's (--spec draft).",
                    e->kv_draft_token_bytes);
        http_scalar(b, "llmd_kv_draft_bytes", "gauge",
                    "The draft model's share of the KV pages in use (mapped or cached), bytes.",
                    e->kv_draft_bytes);
    }
    http_family(b, "llmd_kv_cache_info", "gauge", "The KV cache's element type (always 1).");
    http_buf_printf(b, "llmd_kv_cache_info{kv_type=\"%s\"} 1\n",
                    llmd_kv_type_name((enum llmd_kv_type)e->kv_type));
    http_scalar(b, "llmd_kv_pages_mapped_ahead", "gauge",
                "KV pages mapped ahead of need by the map-ahead thread (counted as free above).",
                e->kv_pages_ahead);
    http_scalar(b, "llmd_engine_healthy", "gauge", "0 once an engine step failed, else 1.",
                m->broken ? 0 : 1);
    http_tiers(b, e, info);
    http_spec(b, e);
    http_kv_events(b, e);

    if (no_vllm)
        return;
    double usage = e->kv_pages_total ? (double)used / (double)e->kv_pages_total : 0;
    http_vllm(b, "vllm:num_requests_running", "Requests running (vLLM-compatible name).", model,
              "%.0f", (double)e->requests_running);
    http_vllm(b, "vllm:num_requests_waiting", "Requests waiting (vLLM-compatible name).", model,
              "%.0f", (double)e->requests_waiting);
    http_vllm(b, "vllm:gpu_cache_usage_perc",
              "Fraction (0..1) of KV pages in use by running requests (vLLM-compatible name).",
              model, "%.6f", usage);
    http_vllm(b, "vllm:kv_cache_usage_perc",
              "Fraction (0..1) of KV pages in use by running requests (vLLM-compatible name).",
              model, "%.6f", usage);
    http_vllm_counter(b, "vllm:prefix_cache_queries_total",
                      "Prefix cache queries, in terms of number of queried tokens.", model,
                      e->prefix_query_tokens_total);
    http_vllm_counter(b, "vllm:prefix_cache_hits_total",
                      "Prefix cache hits, in terms of number of cached tokens.", model,
                      e->prefix_hit_tokens_total);
    http_vllm_info(b, info);
}
