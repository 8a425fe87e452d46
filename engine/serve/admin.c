/* admin.c - the admin socket of `llmd serve`, for llmctl (see admin.h).
 *
 * A Unix stream socket (mode 0600; peers must run as the server's user or
 * root, checked with SO_PEERCRED) speaking newline-delimited JSON: one
 * request object a line, one answer object a line.
 *
 *   {"cmd":"stats"}                 engine and server counters
 *   {"cmd":"seqs"}                  the live requests (serve_loop_seqs)
 *   {"cmd":"pages"}                 the device pool map (llmd_pool_map), counts, tiers
 *   {"cmd":"pages","seq":ID}        the device pages of one running request
 *   {"cmd":"config"}                the server's configuration
 *   {"cmd":"tiers"}                 the KV tiers below the device: pages, moves, bandwidth
 *   {"cmd":"evictions","cursor":N}  the eviction log after N (llmd_evictions_read)
 *   {"cmd":"blocks"}                the block hashes each tier holds (llmd_kv_blocks): what
 *                                   the KV-cache events describe
 *   {"cmd":"purge","tenant":T}      drop tenant T's cached prefixes everywhere (a name
 *                                   of the keys file, or an engine id)
 *   {"cmd":"drain"}                 start draining (as SIGTERM does, without exiting)
 *   {"cmd":"drain","exit":true}     drain, then exit (the owner's shutdown callback)
 *
 * Answers are {"ok":true,...} or {"ok":false,"error":"..."}. Everything
 * comes from what include/llmd.h offers (llmd_stats, each request's
 * llmd_usage, llmd_evictions_read, llmd_tenant_purge; the last two run on
 * the engine thread between steps, serve_loop_call); a per-page map waits
 * for the engine's pool introspection.
 *
 * The engine is reached through the serve loop; what belongs to the front
 * end that owns the socket (its HTTP counters, its configuration, tenant
 * names, draining) through struct admin_ops. Nothing here knows HTTP.
 *
 * One thread accepts and serves one client at a time: admin traffic is a
 * few small requests, and one slow client is bounded by a 5 s receive
 * timeout. A pipe wakes the thread at shutdown.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/serve/admin.h"
#include "log.h"
#include "mem.h"

#define ADMIN_LINE_MAX  (64u << 10) /* bytes of one request line */
#define ADMIN_SEQS_MAX  4096        /* requests listed by "seqs" */
#define ADMIN_EVICT_MAX 4096        /* events returned by one "evictions" */

struct admin {
    struct serve_loop *loop; /* borrowed */
    struct admin_ops ops;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int fd;
    int wake[2]; /* a pipe: written once at stop */
    pthread_t thread;
};

/* --- commands ------------------------------------------------------------- */

static json_t *admin_stats(struct admin *a) {
    struct serve_metrics m;
    serve_loop_metrics(a->loop, &m);
    const struct llmd_stats *e = &m.engine;
    json_t *o = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
        "requests_waiting", (json_int_t)e->requests_waiting, "requests_running",
        (json_int_t)e->requests_running, "prompt_tokens_total", (json_int_t)e->prompt_tokens_total,
        "generated_tokens_total", (json_int_t)e->generated_tokens_total, "preemptions_total",
        (json_int_t)e->preemptions_total, "refusals_total", (json_int_t)e->refusals_total,
        "steps_total", (json_int_t)e->steps_total, "prefill_tokens_total",
        (json_int_t)e->prefill_tokens_total, "prefix_hit_tokens_total",
        (json_int_t)e->prefix_hit_tokens_total, "kv_pages_total", (json_int_t)e->kv_pages_total,
        "kv_pages_free", (json_int_t)e->kv_pages_free, "kv_pages_cached",
        (json_int_t)e->kv_pages_cached, "kv_page_bytes", (json_int_t)e->kv_page_bytes,
        "kv_pages_ahead", (json_int_t)e->kv_pages_ahead, "decode_map_waits_total",
        (json_int_t)e->decode_map_waits_total, "cpu_solo_periods_total",
        (json_int_t)e->cpu_solo_periods_total);
    if (o && e->kv_draft_token_bytes) { /* --spec draft: the draft model's share of the KV */
        json_object_set_new(o, "kv_draft_token_bytes",
                            json_integer((json_int_t)e->kv_draft_token_bytes));
        json_object_set_new(o, "kv_draft_bytes", json_integer((json_int_t)e->kv_draft_bytes));
    }
    json_t *srv = json_pack(
        "{s:I, s:b, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I}}", "requests_live", (json_int_t)m.live,
        "engine_broken", (int)m.broken, "refused_total", (json_int_t)m.refused_total,
        "rejected_total", (json_int_t)m.rejected_total, "finished_total", "stop",
        (json_int_t)(m.finished_total[LLMD_FINISH_STOP] + m.finished_total[LLMD_FINISH_EOS]),
        "length",
        (json_int_t)(m.finished_total[LLMD_FINISH_LENGTH] + m.finished_total[LLMD_FINISH_CONTEXT]),
        "kv_budget", (json_int_t)m.finished_total[LLMD_FINISH_KV_BUDGET], "abort",
        (json_int_t)m.finished_total[LLMD_FINISH_CANCELLED], "error",
        (json_int_t)m.finished_total[LLMD_FINISH_ERROR]);
    static const char *const hist[SERVE_HIST_N] = {"ttft", "itl", "e2e", "queue"};
    json_t *lat = json_object();
    for (int k = 0; lat && k < SERVE_HIST_N; k++) {
        const struct serve_hist *h = &m.hist[k];
        json_object_set_new(lat, hist[k],
                            json_pack("{s:I, s:f}", "count", (json_int_t)h->n, "mean_s",
                                      h->n ? h->sum / (double)h->n : 0.0));
    }
    /* speculative decoding: what was drafted and accepted, and how long
     * the accepted runs were (steps by accepted tokens, the non-zero ones) */
    json_t *len = json_object();
    for (int k = 0; len && k <= LLMD_SPEC_TOKENS_MAX; k++) {
        char key[16];
        snprintf(key, sizeof key, "%d", k);
        if (e->spec_accepted_len[k])
            json_object_set_new(len, key, json_integer((json_int_t)e->spec_accepted_len[k]));
    }
    json_t *spec = json_pack("{s:I, s:I, s:I, s:I, s:f, s:o}", "draft_tokens_total",
                             (json_int_t)e->spec_draft_tokens_total, "accepted_tokens_total",
                             (json_int_t)e->spec_accepted_tokens_total, "steps_total",
                             (json_int_t)e->spec_steps_total, "rollback_pages_total",
                             (json_int_t)e->spec_rollback_pages_total, "acceptance_rate",
                             e->spec_draft_tokens_total ? (double)e->spec_accepted_tokens_total /
                                                              (double)e->spec_draft_tokens_total
                                                        : 0.0,
                             "accepted_len", len);
    json_t *ans = json_pack("{s:b, s:o, s:o, s:o, s:o}", "ok", 1, "engine", o, "server", srv,
                            "latency", lat, "speculative", spec);
    if (ans && srv && a->ops.stats)
        a->ops.stats(a->ops.ctx, srv, ans);
    return ans;
}

static json_t *admin_seqs(struct admin *a) {
    struct serve_seq *q = mem_alloc(MEM_HTTP, ADMIN_SEQS_MAX * sizeof(*q));
    uint32_t n = 0, total = 0;
    if (!q)
        return NULL;
    if (serve_loop_seqs(a->loop, q, ADMIN_SEQS_MAX, &n, &total) < 0) {
        mem_free(q);
        return json_pack("{s:b, s:s}", "ok", 0, "error", "the server is shutting down");
    }
    json_t *arr = json_array();
    for (uint32_t i = 0; arr && i < n; i++)
        json_array_append_new(
            arr, json_pack("{s:I, s:I, s:i, s:s, s:I, s:I, s:I, s:f, s:f}", "id",
                           (json_int_t)q[i].id, "tenant", (json_int_t)q[i].tenant, "priority",
                           (int)q[i].priority, "state", q[i].queue_ns ? "running" : "waiting",
                           "prompt_tokens", (json_int_t)q[i].prompt_tokens, "cached_tokens",
                           (json_int_t)q[i].cached_tokens, "generated_tokens",
                           (json_int_t)q[i].generated_tokens, "age_s", (double)q[i].age_ns * 1e-9,
                           "queue_s", (double)q[i].queue_ns * 1e-9));
    mem_free(q);
    return json_pack("{s:b, s:I, s:o}", "ok", 1, "total", (json_int_t)total, "seqs", arr);
}

/* Every tier's block hashes, taken on the engine thread between two steps. */
struct admin_blocks {
    uint8_t (*h[3])[32];
    int n[3];
};

static int admin_blocks_fn(struct llmd_engine *e, void *arg) {
    struct admin_blocks *x = arg;
    for (int t = 0; t < 3; t++) {
        int n = llmd_kv_blocks(e, (enum llmd_tier)t, NULL, 0);
        if (n < 0)
            return n;
        x->h[t] = mem_alloc(MEM_HTTP, (size_t)(n ? n : 1) * 32);
        if (!x->h[t])
            return -ENOMEM;
        x->n[t] = llmd_kv_blocks(e, (enum llmd_tier)t, x->h[t], (uint32_t)n);
    }
    return 0;
}

static json_t *admin_blocks(struct admin *a) {
    struct admin_blocks x = {0};
    int rc = serve_loop_call(a->loop, admin_blocks_fn, &x);
    json_t *ans = rc < 0 ? json_pack("{s:b, s:s}", "ok", 0, "error",
                                     rc == -ENOTSUP ? "the prefix cache is off" : strerror(-rc))
                         : json_pack("{s:b}", "ok", 1);
    static const char *const names[3] = {"device", "host", "nvme"};
    for (int t = 0; t < 3; t++) {
        json_t *arr = rc < 0 ? NULL : json_array();
        for (int i = 0; arr && i < x.n[t]; i++) {
            char hex[65];
            for (int b = 0; b < 32; b++)
                snprintf(hex + 2 * b, 3, "%02x", x.h[t][i][b]);
            json_array_append_new(arr, json_string(hex));
        }
        if (ans && arr)
            json_object_set_new(ans, names[t], arr);
        mem_free(x.h[t]);
    }
    return ans;
}

/* The pool map (or one sequence's pages), taken on the engine thread. */
struct admin_map {
    char *map;
    size_t len;
    uint64_t seq;
    bool one_seq;
    uint32_t *pages;
    int n_pages;
    struct llmd_stats st; /* taken with the map, so its page counts are the map's */
};

static int admin_map_fn(struct llmd_engine *e, void *arg) {
    struct admin_map *x = arg;
    if (x->one_seq) {
        x->n_pages = llmd_request_pages(e, x->seq, x->pages, (uint32_t)x->len);
        return 0;
    }
    int rc = llmd_pool_map(e, x->map, x->len);
    llmd_stats_get(e, &x->st); /* between the same two steps as the map */
    return rc;
}

static json_t *admin_pages(struct admin *a, json_t *req) {
    struct serve_metrics m;
    serve_loop_metrics(a->loop, &m);
    const struct llmd_stats *e = &m.engine;
    json_t *seq = json_object_get(req, "seq");
    struct admin_map x = {.len = e->kv_pages_total + e->kv_pages_total / 64 + 2};
    if (seq && (!json_is_integer(seq) || json_integer_value(seq) < 0))
        return json_pack("{s:b, s:s}", "ok", 0, "error", "\"seq\" must be a request id");
    x.one_seq = seq != NULL;
    x.seq = seq ? (uint64_t)json_integer_value(seq) : 0;
    if (x.one_seq)
        x.pages = mem_alloc(MEM_HTTP, x.len * sizeof(*x.pages));
    else
        x.map = mem_alloc(MEM_HTTP, x.len);
    if (!x.pages && !x.map)
        return NULL;
    int rc = serve_loop_call(a->loop, admin_map_fn, &x);
    json_t *ans = NULL;
    if (rc < 0) {
        ans = json_pack("{s:b, s:s}", "ok", 0, "error", strerror(-rc));
    } else if (x.one_seq && x.n_pages < 0) {
        ans = json_pack("{s:b, s:s}", "ok", 0, "error", "no running request with that id");
    } else if (x.one_seq) {
        json_t *arr = json_array();
        for (int i = 0; arr && i < x.n_pages && (size_t)i < x.len; i++)
            json_array_append_new(arr, json_integer(x.pages[i]));
        ans = json_pack("{s:b, s:I, s:I, s:o}", "ok", 1, "seq", (json_int_t)x.seq, "page_bytes",
                        (json_int_t)e->kv_page_bytes, "pages", arr);
    } else {
        ans = json_pack(
            "{s:b, s:{s:I, s:I, s:I, s:I, s:I}, s:s, s:{s:I, s:I}, s:{s:I}}", "ok", 1, "pages",
            "total", (json_int_t)x.st.kv_pages_total, "free", (json_int_t)x.st.kv_pages_free,
            "cached", (json_int_t)x.st.kv_pages_cached, "used",
            (json_int_t)(x.st.kv_pages_total - x.st.kv_pages_free - x.st.kv_pages_cached),
            "page_bytes", (json_int_t)e->kv_page_bytes, "map", x.map, "host", "pages",
            (json_int_t)e->host_tier_pages, "bytes_used", (json_int_t)e->host_tier_bytes_used,
            "nvme", "pages", (json_int_t)e->nvme_tier_pages);
        json_t *pg = ans ? json_object_get(ans, "pages") : NULL;
        if (pg && e->kv_draft_token_bytes) { /* every used page holds the draft's KV too */
            json_object_set_new(pg, "draft_token_bytes",
                                json_integer((json_int_t)e->kv_draft_token_bytes));
            json_object_set_new(pg, "draft_bytes", json_integer((json_int_t)x.st.kv_draft_bytes));
        }
    }
    mem_free(x.map);
    mem_free(x.pages);
    return ans;
}

static json_t *admin_tiers(struct admin *a) {
    struct serve_metrics m;
    serve_loop_metrics(a->loop, &m);
    const struct llmd_stats *e = &m.engine;
    return json_pack(
        "{s:b, s:{s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:I, s:I}, s:I, s:I, s:I, "
        "s:I, s:{s:f, s:f, s:f}}",
        "ok", 1, "host", "pages", (json_int_t)e->host_tier_pages, "bytes_used",
        (json_int_t)e->host_tier_bytes_used, "spills_total", (json_int_t)e->spills_host_total,
        "restores_total", (json_int_t)e->restores_host_total, "spill_bytes_total",
        (json_int_t)e->spill_bytes_host_total, "restore_bytes_total",
        (json_int_t)e->restore_bytes_host_total, "nvme", "pages", (json_int_t)e->nvme_tier_pages,
        "spills_total", (json_int_t)e->spills_nvme_total, "restores_total",
        (json_int_t)e->restores_nvme_total, "spill_bytes_total",
        (json_int_t)e->spill_bytes_nvme_total, "restore_bytes_total",
        (json_int_t)e->restore_bytes_nvme_total, "restored_tokens_total",
        (json_int_t)e->restored_tokens_total, "drops_total", (json_int_t)e->offload_drops_total,
        "write_failures_total", (json_int_t)e->offload_write_failures_total,
        "checksum_failures_total", (json_int_t)e->offload_checksum_failures_total, "measured",
        "host_bytes_per_s", e->host_tier_bw_bytes_per_s, "nvme_read_bytes_per_s",
        e->nvme_read_bw_bytes_per_s, "prefill_tokens_per_s", e->prefill_tokens_per_s);
}

struct admin_purge {
    uint32_t tenant;
    struct llmd_purge_counts counts;
};

static int admin_purge_fn(struct llmd_engine *e, void *arg) {
    struct admin_purge *p = arg;
    return llmd_tenant_purge(e, p->tenant, &p->counts);
}

static json_t *admin_purge(struct admin *a, json_t *req) {
    json_t *t = json_object_get(req, "tenant");
    struct admin_purge p = {0};
    if (json_is_integer(t) && json_integer_value(t) >= 0 && json_integer_value(t) <= UINT32_MAX)
        p.tenant = (uint32_t)json_integer_value(t);
    else if (!json_is_string(t))
        return json_pack("{s:b, s:s}", "ok", 0, "error",
                         "purge needs \"tenant\": a name of the keys file or an id");
    else if (!a->ops.tenant_id ||
             a->ops.tenant_id(a->ops.ctx, json_string_value(t), &p.tenant) < 0) {
        char msg[160]; /* a name is not an id: an unknown one is a mistake, not "0 pages" */
        snprintf(msg, sizeof(msg), "no tenant '%.100s' in the keys file", json_string_value(t));
        return json_pack("{s:b, s:s}", "ok", 0, "error", msg);
    }
    int rc = serve_loop_call(a->loop, admin_purge_fn, &p);
    if (rc < 0)
        return json_pack("{s:b, s:s}", "ok", 0, "error",
                         rc == -ENOTSUP ? "the prefix cache is off" : strerror(-rc));
    LOG_INFO("http", "admin socket: purged tenant %u (%u device, %u host, %u nvme pages)", p.tenant,
             p.counts.device_pages, p.counts.host_pages, p.counts.nvme_pages);
    return json_pack("{s:b, s:I, s:I, s:I, s:I}", "ok", 1, "tenant", (json_int_t)p.tenant,
                     "device_pages", (json_int_t)p.counts.device_pages, "host_pages",
                     (json_int_t)p.counts.host_pages, "nvme_pages",
                     (json_int_t)p.counts.nvme_pages);
}

struct admin_evict {
    uint64_t cursor, lost;
    struct llmd_eviction *ev;
    uint32_t max, n;
};

static int admin_evict_fn(struct llmd_engine *e, void *arg) {
    struct admin_evict *x = arg;
    x->n = llmd_evictions_read(e, &x->cursor, x->ev, x->max, &x->lost);
    return 0;
}

static const char *admin_tier_name(uint8_t t) {
    static const char *const names[] = {"device", "host", "nvme", "none"};
    return t < 4 ? names[t] : "?";
}

static json_t *admin_evictions(struct admin *a, json_t *req) {
    json_t *c = json_object_get(req, "cursor"), *mx = json_object_get(req, "max");
    struct admin_evict x = {.max = 256};
    if (json_is_integer(c) && json_integer_value(c) > 0)
        x.cursor = (uint64_t)json_integer_value(c);
    if (json_is_integer(mx) && json_integer_value(mx) > 0)
        x.max = json_integer_value(mx) < ADMIN_EVICT_MAX ? (uint32_t)json_integer_value(mx)
                                                         : ADMIN_EVICT_MAX;
    if (!(x.ev = mem_alloc(MEM_HTTP, x.max * sizeof(*x.ev))))
        return NULL;
    int rc = serve_loop_call(a->loop, admin_evict_fn, &x);
    json_t *arr = json_array();
    for (uint32_t i = 0; rc == 0 && arr && i < x.n; i++) {
        const struct llmd_eviction *v = &x.ev[i];
        char hash[17];
        for (int k = 0; k < 8; k++)
            snprintf(hash + 2 * k, 3, "%02x", v->hash[k]);
        json_array_append_new(
            arr, json_pack("{s:I, s:I, s:s, s:I, s:I, s:I, s:s, s:s, s:s}", "seq",
                           (json_int_t)v->seq, "time_ns", (json_int_t)v->time_ns, "hash", hash,
                           "page", v->page == UINT32_MAX ? (json_int_t)-1 : (json_int_t)v->page,
                           "tenant", (json_int_t)v->tenant, "bytes", (json_int_t)v->bytes, "from",
                           admin_tier_name(v->from), "to", admin_tier_name(v->to), "reason",
                           v->reason ? v->reason : "?"));
    }
    mem_free(x.ev);
    if (rc < 0) {
        json_decref(arr);
        return json_pack("{s:b, s:s}", "ok", 0, "error", "the server is shutting down");
    }
    return json_pack("{s:b, s:o, s:I, s:I}", "ok", 1, "events", arr, "cursor", (json_int_t)x.cursor,
                     "lost", (json_int_t)x.lost);
}

static json_t *admin_config(struct admin *a) {
    json_t *ans = a->ops.config ? a->ops.config(a->ops.ctx) : json_object();
    if (ans)
        json_object_set_new(ans, "ok", json_true());
    return ans;
}

static json_t *admin_drain(struct admin *a, json_t *req) {
    bool exit_after = json_is_true(json_object_get(req, "exit"));
    if (exit_after && !a->ops.shutdown)
        return json_pack("{s:b, s:s}", "ok", 0, "error", "this server cannot be told to exit");
    if (!a->ops.drain)
        return json_pack("{s:b, s:s}", "ok", 0, "error", "this server cannot drain");
    uint64_t live = a->ops.drain(a->ops.ctx);
    LOG_INFO("http", "admin socket: drain%s", exit_after ? " and exit" : "");
    if (exit_after)
        a->ops.shutdown(a->ops.ctx);
    return json_pack("{s:b, s:b, s:b, s:I}", "ok", 1, "draining", 1, "exiting", (int)exit_after,
                     "live", (json_int_t)live);
}

/* The answer to one request line (never NULL unless out of memory). */
static json_t *admin_answer(struct admin *a, const char *line, size_t len) {
    json_error_t je;
    json_t *req = json_loadb(line, len, 0, &je), *ans;
    const char *cmd = json_string_value(json_object_get(req, "cmd"));
    if (!cmd)
        ans = json_pack("{s:b, s:s}", "ok", 0, "error",
                        "a request is one JSON object a line: {\"cmd\":\"stats\"}");
    else if (strcmp(cmd, "stats") == 0)
        ans = admin_stats(a);
    else if (strcmp(cmd, "seqs") == 0)
        ans = admin_seqs(a);
    else if (strcmp(cmd, "pages") == 0)
        ans = admin_pages(a, req);
    else if (strcmp(cmd, "config") == 0)
        ans = admin_config(a);
    else if (strcmp(cmd, "drain") == 0)
        ans = admin_drain(a, req);
    else if (strcmp(cmd, "tiers") == 0)
        ans = admin_tiers(a);
    else if (strcmp(cmd, "purge") == 0)
        ans = admin_purge(a, req);
    else if (strcmp(cmd, "evictions") == 0)
        ans = admin_evictions(a, req);
    else if (strcmp(cmd, "blocks") == 0)
        ans = admin_blocks(a);
    else
        ans = json_pack("{s:b, s:s}", "ok", 0, "error",
                        "unknown command (stats, seqs, pages, tiers, evictions, blocks, purge, "
                        "config, drain)");
    json_decref(req);
    return ans;
}

/* --- the socket ----------------------------------------------------------- */

static bool admin_peer_ok(int c) {
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return false;
    return cr.uid == 0 || cr.uid == getuid();
}

static bool admin_send(int c, json_t *ans) {
    char *s = ans ? json_dumps(ans, JSON_COMPACT) : NULL;
    json_decref(ans);
    if (!s)
        s = strdup("{\"ok\":false,\"error\":\"out of memory\"}");
    bool ok = s != NULL;
    size_t n = s ? strlen(s) : 0, off = 0;
    while (ok && off < n) {
        ssize_t k = send(c, s + off, n - off, MSG_NOSIGNAL);
        ok = k > 0;
        off += k > 0 ? (size_t)k : 0;
    }
    ok = ok && send(c, "\n", 1, MSG_NOSIGNAL) == 1;
    free(s); /* jansson's or strdup's */
    return ok;
}

/* Serve one client until it closes, times out or sends too long a line. A last line
 * without its newline is answered when the client closes its side (EOF). */
static void admin_client(struct admin *a, int c) {
    char *in = mem_alloc(MEM_HTTP, ADMIN_LINE_MAX + 1);
    size_t n = 0; /* bytes in `in` */
    if (!in) {
        admin_send(c, NULL); /* "out of memory" */
        return;
    }
    for (;;) {
        char *nl;
        while (n && (nl = memchr(in, '\n', n))) {
            size_t len = (size_t)(nl - in);
            bool ok = admin_send(c, admin_answer(a, in, len));
            memmove(in, nl + 1, n - len - 1);
            n -= len + 1;
            if (!ok)
                goto out;
        }
        if (n == ADMIN_LINE_MAX + 1) { /* full, no newline: a line over ADMIN_LINE_MAX */
            admin_send(c, json_pack("{s:b, s:s}", "ok", 0, "error", "request line too long"));
            goto out;
        }
        ssize_t k = recv(c, in + n, ADMIN_LINE_MAX + 1 - n, 0);
        if (k == 0 && n > 0) /* `printf '{"cmd":"stats"}' | nc -U` ends without one */
            admin_send(c, admin_answer(a, in, n));
        if (k <= 0)
            goto out;
        n += (size_t)k;
    }
out:
    mem_free(in);
}

static void *admin_main(void *arg) {
    struct admin *a = arg;
    for (;;) {
        struct pollfd pf[2] = {{.fd = a->fd, .events = POLLIN},
                               {.fd = a->wake[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[1].revents)
            break;
        if (!(pf[0].revents & POLLIN))
            continue;
        int c = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        struct timeval tv = {.tv_sec = 5};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (admin_peer_ok(c))
            admin_client(a, c);
        else
            LOG_WARN("http", "admin socket: refused a client of another user");
        close(c);
    }
    return NULL;
}

/* Bind path as a 0600 socket, replacing a stale one (nobody listening). */
static int admin_bind(struct admin *a, char *errbuf, size_t errlen) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, a->path, sizeof(sa.sun_path));
    struct stat st;
    if (lstat(a->path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(errbuf, errlen, "llmd serve: --admin-socket %s exists and is not a socket",
                     a->path);
            return -EEXIST;
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            snprintf(errbuf, errlen, "llmd serve: --admin-socket %s: another server listens there",
                     a->path);
            return -EADDRINUSE;
        }
        unlink(a->path); /* stale: its server is gone */
    }
    a->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (a->fd < 0)
        return -errno;
    mode_t old = umask(077); /* no window where the socket is open to others */
    int rc = bind(a->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
    umask(old);
    if (rc == 0 && (chmod(a->path, 0600) < 0 || listen(a->fd, 8) < 0))
        rc = -errno;
    if (rc < 0)
        snprintf(errbuf, errlen, "llmd serve: --admin-socket %s: %s", a->path, strerror(-rc));
    return rc;
}

int admin_start(const char *path, struct serve_loop *loop, const struct admin_ops *ops,
                struct admin **out, char *errbuf, size_t errlen) {
    struct admin *a = mem_calloc(MEM_HTTP, 1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->loop = loop;
    a->ops = *ops;
    a->fd = a->wake[0] = a->wake[1] = -1;
    int rc;
    if (strlen(path) >= sizeof(a->path)) {
        snprintf(errbuf, errlen, "llmd serve: --admin-socket %s: longer than %zu bytes", path,
                 sizeof(a->path) - 1);
        rc = -ENAMETOOLONG;
        goto fail;
    }
    strcpy(a->path, path);
    if ((rc = admin_bind(a, errbuf, errlen)) < 0)
        goto fail;
    if (pipe2(a->wake, O_CLOEXEC) < 0) {
        rc = -errno;
        goto fail_unlink;
    }
    if ((rc = -pthread_create(&a->thread, NULL, admin_main, a)) < 0)
        goto fail_unlink;
    *out = a;
    return 0;
fail_unlink:
    unlink(a->path);
fail:
    if (rc < 0 && errbuf && !errbuf[0])
        snprintf(errbuf, errlen, "llmd serve: --admin-socket %s: %s", path, strerror(-rc));
    for (int i = 0; i < 2; i++)
        if (a->wake[i] >= 0)
            close(a->wake[i]);
    if (a->fd >= 0)
        close(a->fd);
    mem_free(a);
    return rc;
}

void admin_stop(struct admin *a) {
    if (!a)
        return;
    ssize_t w = write(a->wake[1], "x", 1);
    (void)w; /* a pipe with room: cannot fail */
    pthread_join(a->thread, NULL);
    close(a->wake[0]);
    close(a->wake[1]);
    close(a->fd);
    unlink(a->path);
    mem_free(a);
}
