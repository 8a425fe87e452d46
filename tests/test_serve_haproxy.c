/* Two `llmd serve` replicas behind HAProxy, as docs/serving.md ("Several
 * replicas") sets them up: tests/serve/haproxy_cfg.sh writes the
 * configuration (balance hdr(X-Prefix-Key), hash-type consistent, health
 * checks on /health, retries on 503 and refused connections). A RAG-shaped
 * workload (a few documents, each request one document's text and a short
 * question, X-Prefix-Key the document's id) must stay on one replica per
 * document, which then serves the document from its prefix cache; when one
 * replica is sent SIGTERM while requests go on, it drains, no request
 * fails (HAProxy retries what the draining replica refuses with 503 or
 * what finds it gone on the other), a long request it was running
 * finishes, and the other replica takes its documents over.
 *
 * Which replica answered comes from HAProxy (X-Served-By, its server name)
 * and is checked against each replica's own /metrics: its requests and
 * prefix hits. Skipped, with a message, only when there is no haproxy
 * (`make deps-test` installs it). */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/un.h>

#include "tests/lib/http_util.h"
#include "tests/lib/proc_util.h"

#define REPLICA_ARGS "-m " HT_MODEL " --port 0 -q --ctx 512 --kv-type f32 -t 1 --drain-timeout 20"
#define N_DOCS       6
#define N_ASK        3 /* requests per document before the drain */

/* A document of about 150 tokens, different for each d, and its question. */
static void doc_body(int d, int q, char *out, size_t cap) {
    static const char *const names[] = {"Lily", "Tom", "Sue", "Max", "Ben", "Amy", "Tim", "Zoe"};
    static const char *const things[] = {"ball", "kite", "cake", "dog", "boat", "tree"};
    int n = snprintf(out, cap, "{\"prompt\":\"Document %d. ", d);
    for (int s = 0; s < 8; s++)
        n += snprintf(out + n, cap - (size_t)n,
                      "Once upon a time %s had a big red %s and played with it in the park. ",
                      names[(d + s) % 8], things[(d * 3 + s) % 6]);
    snprintf(out + n, cap - (size_t)n,
             "Question %d: what did %s do?\",\"max_tokens\":4,\"temperature\":0}", q,
             names[(d + q) % 8]);
}

struct answer {
    int status;
    int replica;    /* 0 or 1: X-Served-By r0/r1; -1 none */
    int64_t cached; /* usage.prompt_tokens_details.cached_tokens */
    char body[256]; /* the start of a failed answer */
};

/* One request for document d through the proxy; no assertion (client
 * threads call it). */
static void ask(uint16_t port, int d, int q, struct answer *a) {
    char body[4096], hdr[64], who[32];
    doc_body(d, q, body, sizeof(body));
    snprintf(hdr, sizeof(hdr), "X-Prefix-Key: doc-%d\r\n", d);
    struct ht_resp r;
    ht_request(port, "POST", "/v1/completions", hdr, body, &r);
    memset(a, 0, sizeof(*a));
    a->status = r.status;
    a->replica = -1;
    if (ht_header(&r, "X-Served-By", who, sizeof(who)) && who[0] == 'r')
        a->replica = atoi(who + 1);
    json_error_t e;
    json_t *j = r.status == 200 ? json_loadb(r.body, r.len, 0, &e) : NULL;
    if (j)
        a->cached = json_integer_value(
            json_object_get(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"),
                            "cached_tokens"));
    else
        snprintf(a->body, sizeof(a->body), "%s", r.body ? r.body : "");
    json_decref(j);
    ht_free(&r);
}

/* The sum of a replica's series `key` prefix (all its labels). */
static double metric(uint16_t port, const char *key) {
    struct ht_resp r;
    ht_request(port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    double sum = 0;
    size_t n = strlen(key);
    for (const char *l = r.body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, key, n) == 0 && (l[n] == ' ' || l[n] == '{'))
            sum += strtod(strchr(l + n, ' ') + 1, NULL);
    ht_free(&r);
    return sum;
}

/* A loopback port nothing listens on now (HAProxy binds it next). */
static uint16_t free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* `show stat` on HAProxy's stats socket: does server rN's line say UP
 * (want_up) or DOWN? */
static bool server_is(const char *sock, int n, bool want_up) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return false;
    }
    const char cmd[] = "show stat\n";
    ht_send_all(fd, cmd, sizeof(cmd) - 1);
    char buf[16384];
    size_t len = 0;
    ssize_t k;
    while (len < sizeof(buf) - 1 && (k = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
        len += (size_t)k;
    close(fd);
    buf[len] = '\0';
    char line[16];
    snprintf(line, sizeof(line), "\nllmd,r%d,", n);
    const char *l = strstr(buf, line);
    if (!l)
        return false;
    const char *end = strchr(l + 1, '\n');
    char row[2048];
    snprintf(row, sizeof(row), "%.*s", end ? (int)(end - l) : (int)strlen(l), l);
    return strstr(row, want_up ? ",UP," : ",DOWN,") != NULL;
}

/* Poll cond for up to `s` seconds. */
#define WAIT_FOR(cond, s, ...)                                                                     \
    do {                                                                                           \
        double t0_ = ht_now();                                                                     \
        while (!(cond)) {                                                                          \
            cr_assert_lt(ht_now() - t0_, (s), __VA_ARGS__);                                        \
            usleep(20000);                                                                         \
        }                                                                                          \
    } while (0)

struct client {
    uint16_t port;
    int doc;
    int n;
    atomic_int *done; /* answers so far, over every client */
    struct answer a[16];
};

static void *client_run(void *arg) {
    struct client *c = arg;
    for (int i = 0; i < c->n; i++) {
        ask(c->port, c->doc, 100 + i, &c->a[i]);
        atomic_fetch_add(c->done, 1);
    }
    return NULL;
}

struct long_req {
    uint16_t port;
    int status, replica;
    char body[256];
};

/* Sixteen choices of 400 tokens for document 0: the drained replica is
 * still running it when the drain starts, and must finish it. */
static void *long_run(void *arg) {
    struct long_req *l = arg;
    char who[32];
    struct ht_resp r;
    ht_request(l->port, "POST", "/v1/completions", "X-Prefix-Key: doc-0\r\n",
               "{\"prompt\":\"Once upon a time\",\"n\":16,\"max_tokens\":400,"
               "\"ignore_eos\":true,\"temperature\":0}",
               &r);
    l->status = r.status;
    l->replica =
        ht_header(&r, "X-Served-By", who, sizeof(who)) && who[0] == 'r' ? atoi(who + 1) : -1;
    snprintf(l->body, sizeof(l->body), "%s", r.status == 200 ? "" : r.body ? r.body : "");
    ht_free(&r);
    return NULL;
}

Test(serve_haproxy, documents_stick_and_a_drained_replica_loses_no_request, .timeout = 90) {
    /* in PATH, or where Debian puts it (outside a user's PATH) */
    const char *hx_bin = "haproxy";
    const char *vargv[] = {hx_bin, "-v", NULL};
    struct proc_out o;
    proc_run(vargv, NULL, 0, &o);
    proc_out_free(&o);
    if (o.code == 127) {
        vargv[0] = hx_bin = "/usr/sbin/haproxy";
        proc_run(vargv, NULL, 0, &o);
        proc_out_free(&o);
    }
    if (o.code == 127) { /* tests/run.sh shows the SKIP line */
        fprintf(stderr, "SKIP: serve_haproxy: haproxy is not installed, the multi-replica test "
                        "did not run (`make deps-test` installs Debian's haproxy)\n");
        cr_skip_test("haproxy is not installed");
    }

    struct proc rep[2];
    for (int i = 0; i < 2; i++)
        serve_start(&rep[i], REPLICA_ARGS);
    char dir[] = "/tmp/llmd-haproxy-XXXXXX", cfg[512], sock[512], b0[32], b1[32], pbuf[8];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cfg, sizeof(cfg), "%s/haproxy.cfg", dir);
    snprintf(sock, sizeof(sock), "%s/haproxy.sock", dir);
    uint16_t port = free_port();
    snprintf(pbuf, sizeof(pbuf), "%u", port);
    snprintf(b0, sizeof(b0), "127.0.0.1:%u", rep[0].port);
    snprintf(b1, sizeof(b1), "127.0.0.1:%u", rep[1].port);
    const char *const gargv[] = {"tests/serve/haproxy_cfg.sh", dir, pbuf, b0, b1, NULL};
    proc_run(gargv, NULL, 0, &o);
    cr_assert_eq(o.code, 0, "haproxy_cfg.sh: %s", o.err);
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fwrite(o.out, 1, o.out_len, f);
    fclose(f);
    proc_out_free(&o);

    pid_t parent = getpid(), hx = fork();
    cr_assert_geq(hx, 0);
    if (hx == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* as serve_start(): never outlive the test */
        if (getppid() != parent)
            _exit(127);
        execlp(hx_bin, "haproxy", "-db", "-q", "-f", cfg, (char *)NULL);
        _exit(127);
    }
    WAIT_FOR(server_is(sock, 0, true) && server_is(sock, 1, true), 15,
             "HAProxy did not see both replicas up (%s)", cfg);

    /* documents stick: every request for one document on one replica, and
     * each after the first takes the document from that replica's cache */
    int home[N_DOCS], n_home[2] = {0, 0};
    for (int d = 0; d < N_DOCS; d++) {
        home[d] = -1;
        for (int q = 0; q < N_ASK; q++) {
            struct answer a;
            ask(port, d, q, &a);
            cr_assert_eq(a.status, 200, "doc %d question %d: %d %s", d, q, a.status, a.body);
            cr_assert(a.replica == 0 || a.replica == 1, "doc %d: no X-Served-By", d);
            if (q == 0)
                home[d] = a.replica;
            cr_assert_eq(a.replica, home[d], "doc %d went to r%d, then r%d", d, home[d], a.replica);
            if (q > 0)
                cr_assert_geq(a.cached, 128, "doc %d question %d: %lld cached tokens", d, q,
                              (long long)a.cached);
        }
        n_home[home[d]]++;
    }
    cr_log_info("documents per replica: r0 %d, r1 %d", n_home[0], n_home[1]);
    /* the replicas' own counters agree: their requests, and prefix hits on
     * each that has a document */
    for (int i = 0; i < 2; i++) {
        double reqs = metric(rep[i].port, "llmd_requests_total");
        cr_assert_eq(reqs, n_home[i] * N_ASK, "r%d finished %g requests, HAProxy sent it %d", i,
                     reqs, n_home[i] * N_ASK);
        double hits = metric(rep[i].port, "vllm:prefix_cache_hits_total");
        if (n_home[i])
            cr_assert_geq(hits, 128.0 * n_home[i] * (N_ASK - 1), "r%d: %g hit tokens", i, hits);
        else
            cr_assert_eq(hits, 0);
    }

    /* drain the home of document 0 while it runs a long request (16
     * choices of 400 tokens) and new ones for its documents keep coming */
    int gone = home[0], other = 1 - gone, n_docs_gone = 0;
    double other_reqs = metric(rep[other].port, "llmd_requests_total");
    struct long_req lr = {.port = port};
    pthread_t lth;
    cr_assert_eq(pthread_create(&lth, NULL, long_run, &lr), 0);
    WAIT_FOR(metric(rep[gone].port, "llmd_requests_running") > 0, 30,
             "the long request never ran on r%d", gone);
    kill(rep[gone].pid, SIGTERM);
    /* it says so on /health (HAProxy's check takes it out of the pool) */
    struct ht_resp h = {0};
    WAIT_FOR((ht_free(&h), ht_request(rep[gone].port, "GET", "/health", NULL, NULL, &h),
              h.status == 503),
             10, "r%d /health: %d %s", gone, h.status, h.body);
    cr_assert(strstr(h.body, "\"draining\""), "%s", h.body);
    ht_free(&h);
    atomic_int done = 0;
    struct client cl[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        /* document 0 and another of the same replica when it has one */
        int d = 0;
        for (int k = 1; i == 1 && k < N_DOCS; k++)
            if (home[k] == gone) {
                d = k;
                break;
            }
        cl[i] = (struct client){.port = port, .doc = d, .n = 12, .done = &done};
        cr_assert_eq(pthread_create(&th[i], NULL, client_run, &cl[i]), 0);
    }
    pthread_join(lth, NULL);
    cr_assert_eq(lr.status, 200, "the long request during the drain: %d %s", lr.status, lr.body);
    cr_assert_eq(lr.replica, gone, "the long request ran on r%d", lr.replica);
    char err[8192];
    int code = serve_wait(&rep[gone], err, sizeof(err));
    cr_assert_eq(code, 0, "the drained replica exited %d: %s", code, err);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    int moved = 0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < cl[i].n; k++) {
            const struct answer *a = &cl[i].a[k];
            cr_assert_eq(a->status, 200, "doc %d request %d during the drain: %d %s", cl[i].doc, k,
                         a->status, a->body);
            cr_assert(a->replica == 0 || a->replica == 1);
            moved += a->replica == other;
        }
    cr_log_info("during the drain: %d of %d requests answered by the other replica", moved,
                cl[0].n + cl[1].n);
    WAIT_FOR(server_is(sock, gone, false), 10, "HAProxy still has r%d up", gone);

    /* the other replica now serves the drained one's documents, from its
     * cache after the first time */
    double hits0 = metric(rep[other].port, "vllm:prefix_cache_hits_total");
    for (int d = 0; d < N_DOCS; d++) {
        if (home[d] != gone)
            continue;
        n_docs_gone++;
        for (int q = 0; q < 2; q++) {
            struct answer a;
            ask(port, d, 200 + q, &a);
            cr_assert_eq(a.status, 200, "doc %d after the drain: %d %s", d, a.status, a.body);
            cr_assert_eq(a.replica, other, "doc %d after the drain went to r%d", d, a.replica);
            if (q > 0) /* the first may be its first there (the drain's clients asked for two) */
                cr_assert_geq(a.cached, 128, "doc %d: %lld cached tokens on r%d", d,
                              (long long)a.cached, other);
        }
    }
    double hits1 = metric(rep[other].port, "vllm:prefix_cache_hits_total");
    cr_assert_geq(hits1 - hits0, 128.0 * n_docs_gone, "r%d: %g hit tokens after the drain", other,
                  hits1 - hits0);
    /* and it counted every answer HAProxy says it gave */
    double other_now = metric(rep[other].port, "llmd_requests_total");
    cr_assert_eq(other_now - other_reqs, moved + 2 * n_docs_gone, "r%d finished %g, sent %d", other,
                 other_now - other_reqs, moved + 2 * n_docs_gone);

    kill(hx, SIGTERM);
    int st;
    cr_assert_eq(waitpid(hx, &st, 0), hx);
    serve_stop(&rep[other]);
    unlink(sock);
    unlink(cfg);
    cr_assert_eq(rmdir(dir), 0, "%s: %s", dir, strerror(errno));
}
