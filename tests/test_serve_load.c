/* `llmd serve` under concurrency: clients that leave mid-stream give their
 * KV pages back; 64 concurrent streaming clients see no error but 429s;
 * draining lets running requests finish; stopping cancels the rest. */
#include <poll.h>
#include <pthread.h>

#include "tests/lib/http_util.h"

/* Close abruptly (RST) or politely (FIN). */
static void drop(int fd, bool reset) {
    if (reset) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    close(fd);
}

static double metric_value(const char *text, const char *key) {
    char pat[256];
    snprintf(pat, sizeof(pat), "\n%s ", key);
    const char *p = strstr(text, pat);
    cr_assert_not_null(p, "no metric %s", key);
    return strtod(p + strlen(pat), NULL);
}

static double scrape(struct ht_server *t, const char *key) {
    struct ht_resp r;
    ht_request(t->port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    char *m = malloc(r.len + 2);
    m[0] = '\n';
    memcpy(m + 1, r.body, r.len + 1);
    double v = metric_value(m, key);
    free(m);
    ht_free(&r);
    return v;
}

Test(serve_load, clients_that_leave_give_their_pages_back, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    enum { N = 100 };
    int fds[N];
    const char *stream = "{\"prompt\":\"Once upon a time\",\"max_tokens\":480,\"stream\":true}";
    const char *whole = "{\"prompt\":\"Once upon a time\",\"max_tokens\":480}";
    for (int i = 0; i < N; i++) {
        const char *b = i % 4 == 3 ? whole : stream;
        fds[i] = ht_send(t.port, "POST", "/v1/completions", NULL, b, strlen(b));
    }
    /* a quarter leave at once (queued, or waiting for a whole answer), the
     * rest after their first events; half with a reset, half politely */
    for (int i = 0; i < N; i++) {
        if (i % 4 == 0 || i % 4 == 3)
            drop(fds[i], i % 2);
    }
    /* the others, all at once: each leaves as soon as its first event came */
    struct pollfd pf[N];
    int left = 0;
    for (int i = 0; i < N; i++) {
        bool later = i % 4 == 1 || i % 4 == 2;
        pf[i] = (struct pollfd){.fd = later ? fds[i] : -1, .events = POLLIN};
        left += later;
    }
    double t0 = ht_now();
    while (left > 0 && ht_now() - t0 < 30) {
        cr_assert_geq(poll(pf, N, 1000), 0);
        for (int i = 0; i < N; i++) {
            char buf[4096];
            if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t k = recv(pf[i].fd, buf, sizeof(buf), 0);
            cr_assert_gt(k, 0, "stream %d ended before its first event", i);
            if (!memmem(buf, (size_t)k, "data: ", 6))
                continue; /* the headers alone */
            drop(pf[i].fd, i % 2);
            pf[i].fd = -1;
            left--;
        }
    }
    cr_assert_eq(left, 0, "%d streams sent no event in 30 s", left);
    struct llmd_stats st = ht_wait_idle(&t);
    cr_assert_eq(st.requests_running, 0);
    cr_assert_eq(st.requests_waiting, 0);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total,
                 "pages leaked: %lu free + %lu cached of %lu", (unsigned long)st.kv_pages_free,
                 (unsigned long)st.kv_pages_cached, (unsigned long)st.kv_pages_total);
    /* the streams that left after their first event were cancelled, not
     * run for their 480 tokens; a whole-answer request may finish before its
     * client is seen gone (it is looked at every 200 ms), and a request
     * dropped at once may never have been read at all */
    double abort = scrape(&t, "llmd_requests_total{finish_reason=\"abort\"}");
    double length = scrape(&t, "llmd_requests_total{finish_reason=\"length\"}");
    cr_assert_geq(abort, N / 2, "abort %g", abort);
    cr_assert_leq(length, N / 4, "length %g", length);
    struct ht_resp r;
    ht_post(t.port, "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":3}", &r);
    cr_assert_eq(r.status, 200);
    ht_free(&r);
    ht_stop(&t);
}

struct client {
    uint16_t port;
    double until;
    int ok, refused, bad;
    char why[256];
};

/* Stream requests back to back until `until`; every answer is a complete
 * stream ending in [DONE], or a 429 with Retry-After. */
static void *client_main(void *arg) {
    struct client *c = arg;
    unsigned n = 0;
    while (ht_now() < c->until) {
        char body[256];
        snprintf(body, sizeof(body),
                 "{\"prompt\":\"Once upon a time %u\",\"max_tokens\":%u,\"stream\":true,"
                 "\"temperature\":0.8,\"seed\":%u}",
                 n, 8 + n % 24, n);
        n++;
        struct ht_resp r;
        ht_post(c->port, "/v1/completions", body, &r);
        char v[32];
        if (r.status == 429 && ht_header(&r, "Retry-After", v, sizeof(v)) && atoi(v) >= 1) {
            c->refused++;
        } else if (r.status == 200 && r.len > 6 &&
                   strcmp(r.body + r.len - 14, "data: [DONE]\n\n") == 0 &&
                   strstr(r.body, "\"finish_reason\":\"length\"")) {
            c->ok++;
        } else {
            c->bad++;
            snprintf(c->why, sizeof(c->why), "%d: %.200s", r.status, r.body);
        }
        ht_free(&r);
        if (r.status == 429)
            usleep(20000);
    }
    return NULL;
}

/* The load: 200 concurrent streaming clients for 30 s, back to back
 * on loopback; no answer but 200 or 429 + Retry-After, no page leaked. The
 * ASan build runs the same paths for 10 s (the suite's time budget). */
#if defined(__SANITIZE_ADDRESS__)
#define LOAD_SECONDS 10.0
#else
#define LOAD_SECONDS 30.0
#endif
Test(serve_load, two_hundred_streaming_clients_for_thirty_seconds, .timeout = 180) {
    struct llmd_engine_config ec = ht_engine_config();
    ec.max_seqs = 16;
    ec.max_queue_wait_ns = 200 * 1000000ull; /* some 429s under this load */
    struct ht_server t;
    ht_start(&t, &ec, NULL);
    enum { N = 200 };
    static struct client cl[N];
    pthread_t th[N];
    double until = ht_now() + LOAD_SECONDS;
    for (int i = 0; i < N; i++) {
        cl[i] = (struct client){.port = t.port, .until = until};
        cr_assert_eq(pthread_create(&th[i], NULL, client_main, &cl[i]), 0);
    }
    int ok = 0, refused = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(cl[i].bad, 0, "client %d: %s", i, cl[i].why);
        ok += cl[i].ok;
        refused += cl[i].refused;
    }
    cr_assert_gt(ok, N, "only %d streams completed", ok);
    struct llmd_stats st = ht_wait_idle(&t);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    cr_assert_eq(st.refusals_total, (uint64_t)refused);
    cr_assert_eq(scrape(&t, "llmd_requests_total{finish_reason=\"length\"}"), ok);
    cr_assert_eq(scrape(&t, "llmd_http_responses_total{code=\"429\"}"), refused);
    cr_log_info("%d streams, %d refused", ok, refused);
    ht_stop(&t);
}

/* 200 streams open at once, read by one poll() loop: every one completes. */
Test(serve_load, two_hundred_concurrent_streams, .timeout = 120) {
    struct llmd_engine_config ec = ht_engine_config();
    ec.max_seqs = 32;
    struct ht_server t;
    ht_start(&t, &ec, NULL);
    enum { N = 200 };
    static struct pollfd pf[N];
    static char *got[N];
    static size_t n_got[N];
    for (int i = 0; i < N; i++) {
        char b[160];
        snprintf(b, sizeof(b),
                 "{\"prompt\":\"Once upon a time %d\",\"max_tokens\":12,\"stream\":true}", i);
        pf[i] = (struct pollfd){
            .fd = ht_send(t.port, "POST", "/v1/completions", NULL, b, strlen(b)), .events = POLLIN};
        got[i] = malloc(1 << 16);
        n_got[i] = 0;
    }
    uint64_t peak = 0;
    int open = N;
    double t0 = ht_now();
    while (open > 0 && ht_now() - t0 < 60) {
        uint64_t live = http_server_live(t.s);
        peak = live > peak ? live : peak;
        cr_assert_geq(poll(pf, N, 1000), 0);
        for (int i = 0; i < N; i++) {
            if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t k = recv(pf[i].fd, got[i] + n_got[i], (1 << 16) - 1 - n_got[i], 0);
            if (k > 0) {
                n_got[i] += (size_t)k;
                continue;
            }
            close(pf[i].fd);
            pf[i].fd = -1;
            open--;
        }
    }
    cr_assert_eq(open, 0, "%d streams still open after 60 s", open);
    for (int i = 0; i < N; i++) {
        got[i][n_got[i]] = '\0';
        cr_assert(strncmp(got[i], "HTTP/1.1 200", 12) == 0, "stream %d: %.200s", i, got[i]);
        cr_assert(strstr(got[i], "data: [DONE]"), "stream %d unfinished", i);
        free(got[i]);
    }
    cr_assert_gt(peak, 100, "only %lu requests were live at once", (unsigned long)peak);
    struct llmd_stats st = ht_wait_idle(&t);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    ht_stop(&t);
}

struct long_stream {
    uint16_t port;
    bool stream;
    struct ht_resp r;
};

static void *long_main(void *arg) {
    struct long_stream *s = arg;
    ht_post(s->port, "/v1/completions",
            s->stream ? "{\"prompt\":\"Once upon a time\",\"max_tokens\":480,\"stream\":true}"
                      : "{\"prompt\":\"Once upon a time\",\"max_tokens\":480}",
            &s->r);
    return NULL;
}

Test(serve_load, drain_finishes_running_requests, .timeout = 60) {
    struct ht_server t;
    ht_start(&t, NULL, NULL);
    enum { N = 6 };
    struct long_stream ls[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        ls[i] = (struct long_stream){.port = t.port, .stream = i % 2};
        pthread_create(&th[i], NULL, long_main, &ls[i]);
    }
    while (http_server_live(t.s) < N)
        usleep(1000);
    http_server_drain(t.s);
    struct ht_resp r;
    ht_post(t.port, "/v1/completions", "{\"prompt\":\"Hi\"}", &r);
    ht_assert_error(&r, 503, "server_shutting_down");
    ht_free(&r);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(ls[i].r.status, 200, "%d: %s", ls[i].r.status, ls[i].r.body);
        if (ls[i].stream)
            cr_assert(strstr(ls[i].r.body, "data: [DONE]"), "stream %d not finished", i);
        ht_free(&ls[i].r);
    }
    cr_assert_eq(http_server_live(t.s), 0);
    ht_stop(&t);
}

Test(serve_load, stop_cancels_what_still_runs, .timeout = 60) {
    struct llmd_engine_config ec = ht_engine_config();
    ec.max_seqs = 2; /* the rest wait in the queue */
    struct ht_server t;
    ht_start(&t, &ec, NULL);
    enum { N = 8 };
    struct long_stream ls[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        ls[i] = (struct long_stream){.port = t.port, .stream = i % 2};
        pthread_create(&th[i], NULL, long_main, &ls[i]);
    }
    while (http_server_live(t.s) < N)
        usleep(1000);
    ht_stop(&t);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (ls[i].stream) {
            /* headers were sent: the stream ends with an error event */
            cr_assert_eq(ls[i].r.status, 200);
            cr_assert(strstr(ls[i].r.body, "\"error\""), "stream %d: %.300s", i, ls[i].r.body);
            cr_assert_null(strstr(ls[i].r.body, "[DONE]"));
        } else {
            ht_assert_error(&ls[i].r, 503, "cancelled");
        }
        ht_free(&ls[i].r);
    }
}
