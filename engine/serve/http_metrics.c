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
 * Everything comes from one serve_metrics snapshot, taken by the engine
 * thread after its last step, so the numbers agree with each other.
 */
#include <stdio.h>
#include <string.h>

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

/* A {tier="host"} / {tier="nvme"} pair. */
static void http_tier_pair(struct http_buf *b, const char *name, const char *type, const char *help,
                           uint64_t host, uint64_t nvme) {
    http_family(b, name, type, help);
    http_buf_printf(b, "%s{tier=\"host\"} %llu\n%s{tier=\"nvme\"} %llu\n", name,
                    (unsigned long long)host, name, (unsigned long long)nvme);
}

/* The KV tiers below the device (docs/offload.md); zeros without them. */
static void http_tiers(struct http_buf *b, const struct llmd_stats *e) {
    http_tier_pair(b, "llmd_kv_tier_pages", "gauge", "KV pages held by each tier below the device.",
                   e->host_tier_pages, e->nvme_tier_pages);
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

void http_metrics_format(struct http_buf *b, const struct serve_metrics *m, const char *model,
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
    http_tiers(b, e);
    http_spec(b, e);

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
}
