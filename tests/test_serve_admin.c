/* The admin socket of `llmd serve` (engine/serve/admin.c) and llmctl:
 * newline-delimited JSON over a 0600 Unix socket. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "log.h"
#include "tests/lib/http_util.h"

static const char *sock_path(void) {
    static char p[64];
    snprintf(p, sizeof(p), "/tmp/llmd-admin-%d.sock", getpid());
    return p;
}

static atomic_int shutdown_calls;

static void on_shutdown(void *ctx) {
    (void)ctx;
    atomic_fetch_add(&shutdown_calls, 1);
}

static void start_admin(struct ht_server *t) {
    unlink(sock_path());
    struct http_config hc = {.admin_socket = sock_path(),
                             .admin_config = "{\"max_seqs\":8}",
                             .admin_shutdown = on_shutdown};
    ht_start(t, NULL, &hc);
}

static int admin_connect(void) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, sock_path());
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

/* Read one answer line from fd. */
static json_t *admin_read(int fd) {
    static char buf[1 << 16];
    size_t n = 0;
    while (n < sizeof(buf) - 1) {
        ssize_t k = recv(fd, buf + n, 1, 0);
        if (k <= 0 || buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    cr_assert_not_null(j, "answer not JSON: '%s'", buf);
    return j;
}

/* One request on its own connection. */
static json_t *admin(const char *line) {
    int fd = admin_connect();
    ht_send_all(fd, line, strlen(line));
    ht_send_all(fd, "\n", 1);
    json_t *j = admin_read(fd);
    close(fd);
    return j;
}

static json_int_t geti(json_t *j, const char *a, const char *b) {
    json_t *v = json_object_get(j, a);
    if (b)
        v = json_object_get(v, b);
    cr_assert(json_is_integer(v), "%s.%s", a, b ? b : "");
    return json_integer_value(v);
}

struct bg {
    uint16_t port;
    struct ht_resp r;
};

static void *bg_stream(void *arg) {
    struct bg *b = arg;
    ht_post(b->port, "/v1/completions",
            "{\"prompt\":\"Once upon a time\",\"max_tokens\":480,\"stream\":true}", &b->r);
    return NULL;
}

Test(serve_admin, stats_seqs_pages_config, .timeout = 60) {
    struct ht_server t;
    start_admin(&t);
    struct stat st;
    cr_assert_eq(stat(sock_path(), &st), 0);
    cr_assert(S_ISSOCK(st.st_mode));
    cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);

    json_t *j = admin("{\"cmd\":\"stats\"}");
    cr_assert(json_is_true(json_object_get(j, "ok")));
    cr_assert_gt(geti(j, "engine", "kv_pages_total"), 0);
    cr_assert_eq(geti(j, "server", "requests_live"), 0);
    json_decref(j);

    struct bg b = {.port = t.port};
    pthread_t th;
    pthread_create(&th, NULL, bg_stream, &b);
    while (http_server_live(t.s) == 0)
        usleep(1000);
    j = admin("{\"cmd\":\"seqs\"}");
    cr_assert_eq(geti(j, "total", NULL), 1);
    json_t *s = json_array_get(json_object_get(j, "seqs"), 0);
    cr_assert_eq(json_integer_value(json_object_get(s, "prompt_tokens")), 5);
    cr_assert_eq(json_integer_value(json_object_get(s, "tenant")), 0);
    cr_assert(json_is_string(json_object_get(s, "state")));
    long long seq_id = (long long)json_integer_value(json_object_get(s, "id"));
    bool running = strcmp(json_string_value(json_object_get(s, "state")), "running") == 0;
    json_decref(j);
    j = admin("{\"cmd\":\"pages\"}");
    json_t *p = json_object_get(j, "pages");
    cr_assert_eq(geti(j, "pages", "total"), json_integer_value(json_object_get(p, "free")) +
                                                json_integer_value(json_object_get(p, "cached")) +
                                                json_integer_value(json_object_get(p, "used")));
    /* the map: one character a page, 64 a line; its counts match */
    const char *map = json_string_value(json_object_get(j, "map"));
    cr_assert_not_null(map);
    long long n_free = 0, n_cached = 0, n_used = 0, n_chars = 0;
    for (const char *c = map; *c; c++) {
        if (*c == '\n')
            continue;
        n_chars++;
        n_free += *c == '.' || *c == 'a'; /* mapped ahead of need: counted as free */
        n_cached += *c == 'C';
        n_used += *c == 'M' || (*c >= '2' && *c <= '9') || *c == '+';
    }
    cr_assert_eq(n_chars, geti(j, "pages", "total"), "map: %s", map);
    cr_assert_eq(n_free, geti(j, "pages", "free"));
    cr_assert_eq(n_cached, geti(j, "pages", "cached"));
    cr_assert_eq(n_used, geti(j, "pages", "used"));
    json_decref(j);
    /* one sequence's pages: mapped ones, in the map */
    char q[128];
    snprintf(q, sizeof q, "{\"cmd\":\"pages\",\"seq\":%lld}", seq_id);
    j = admin(q);
    if (running && json_is_true(json_object_get(j, "ok"))) {
        json_t *arr = json_object_get(j, "pages");
        cr_assert_gt(json_array_size(arr), 0);
        cr_assert_eq(geti(j, "seq", NULL), seq_id);
    } else { /* finished between the two calls */
        cr_assert(json_is_string(json_object_get(j, "error")));
    }
    json_decref(j);
    j = admin("{\"cmd\":\"pages\",\"seq\":\"x\"}");
    cr_assert(json_is_false(json_object_get(j, "ok")));
    json_decref(j);
    pthread_join(th, NULL);
    cr_assert_eq(b.r.status, 200);
    ht_free(&b.r);
    j = admin("{\"cmd\":\"seqs\"}");
    cr_assert_eq(geti(j, "total", NULL), 0);
    json_decref(j);
    j = admin("{\"cmd\":\"stats\"}");
    cr_assert_eq(geti(json_object_get(j, "server"), "finished_total", "length"), 1);
    json_decref(j);

    j = admin("{\"cmd\":\"config\"}");
    cr_assert_eq(geti(j, "server", "port"), t.port);
    cr_assert_eq(geti(j, "engine", "max_seqs"), 8);
    cr_assert_str_eq(
        json_string_value(json_object_get(json_object_get(j, "server"), "served_model_name")),
        HT_NAME);
    json_decref(j);
    ht_stop(&t);
    cr_assert_neq(stat(sock_path(), &st), 0, "the socket is removed at stop");
}

Test(serve_admin, bad_requests_and_several_lines, .timeout = 60) {
    struct ht_server t;
    start_admin(&t);
    json_t *j = admin("not json");
    cr_assert(json_is_false(json_object_get(j, "ok")));
    cr_assert(json_is_string(json_object_get(j, "error")));
    json_decref(j);
    j = admin("{\"cmd\":\"purge\"}");
    cr_assert(json_is_false(json_object_get(j, "ok")));
    json_decref(j);
    /* several requests on one connection, answered in order */
    int fd = admin_connect();
    const char *two = "{\"cmd\":\"pages\"}\n{\"cmd\":\"config\"}\n";
    ht_send_all(fd, two, strlen(two));
    j = admin_read(fd);
    cr_assert_not_null(json_object_get(j, "pages"));
    json_decref(j);
    j = admin_read(fd);
    cr_assert_not_null(json_object_get(j, "server"));
    json_decref(j);
    close(fd);
    /* a line over 64 KiB: refused, and the connection closed */
    fd = admin_connect();
    static char big[70000];
    memset(big, ' ', sizeof(big));
    ht_send_all(fd, big, sizeof(big));
    j = admin_read(fd);
    cr_assert(json_is_false(json_object_get(j, "ok")));
    json_decref(j);
    close(fd);
    j = admin("{\"cmd\":\"stats\"}");
    cr_assert(json_is_true(json_object_get(j, "ok")), "the server goes on");
    json_decref(j);
    ht_stop(&t);
}

/* A request line may be 64 KiB (ADMIN_LINE_MAX) long; one byte more, and
 * no newline, is refused and the connection closed; the server goes on. */
Test(serve_admin, request_line_limit, .timeout = 60) {
    struct ht_server t;
    start_admin(&t);
    const size_t max = 64u << 10;
    char *line = malloc(max + 2);
    cr_assert_not_null(line);
    const char *head = "{\"cmd\":\"stats\"";
    memcpy(line, head, strlen(head));
    memset(line + strlen(head), ' ', max - strlen(head) - 1);
    line[max - 1] = '}';
    line[max] = '\n';
    int fd = admin_connect();
    ht_send_all(fd, line, max + 1);
    json_t *j = admin_read(fd);
    cr_assert(json_is_true(json_object_get(j, "ok")), "a line of exactly %zu bytes", max);
    cr_assert(json_is_object(json_object_get(j, "http_responses")), "the server's own fields");
    cr_assert(json_is_boolean(json_object_get(json_object_get(j, "server"), "draining")));
    json_decref(j);
    close(fd);

    line[max - 1] = ' ';
    line[max] = ' ';
    fd = admin_connect();
    ht_send_all(fd, line, max + 1);
    j = admin_read(fd);
    cr_assert(json_is_false(json_object_get(j, "ok")));
    cr_assert_str_eq(json_string_value(json_object_get(j, "error")), "request line too long");
    json_decref(j);
    char b;
    cr_assert_leq(recv(fd, &b, 1, 0), 0, "the connection is closed after the refusal");
    close(fd);
    free(line);
    j = admin("{\"cmd\":\"stats\"}");
    cr_assert(json_is_true(json_object_get(j, "ok")), "the server goes on");
    json_decref(j);
    ht_stop(&t);
}

Test(serve_admin, drain_and_drain_exit, .timeout = 60) {
    struct ht_server t;
    start_admin(&t);
    json_t *j = admin("{\"cmd\":\"drain\"}");
    cr_assert(json_is_true(json_object_get(j, "draining")));
    cr_assert(json_is_false(json_object_get(j, "exiting")));
    json_decref(j);
    cr_assert_eq(atomic_load(&shutdown_calls), 0);
    struct ht_resp r;
    ht_request(t.port, "GET", "/health", NULL, NULL, &r);
    cr_assert_eq(r.status, 503);
    ht_free(&r);
    j = admin("{\"cmd\":\"drain\",\"exit\":true}");
    cr_assert(json_is_true(json_object_get(j, "exiting")));
    json_decref(j);
    cr_assert_eq(atomic_load(&shutdown_calls), 1);
    ht_stop(&t);
}

Test(serve_admin, socket_path_cases, .timeout = 60) {
    /* a stale socket (its server gone) is replaced */
    unlink(sock_path());
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, sock_path());
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
    struct ht_server t;
    struct http_config hc = {.admin_socket = sock_path()};
    ht_start(&t, NULL, &hc);
    json_t *j = admin("{\"cmd\":\"stats\"}");
    cr_assert(json_is_true(json_object_get(j, "ok")));
    json_decref(j);
    /* a second server on the same live socket is refused */
    struct llmd_engine_config ec = ht_engine_config();
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&ec, &e, err, sizeof(err)), 0);
    struct http_config hc2 = {.model_path = HT_MODEL, .admin_socket = sock_path()};
    struct http_server *s2;
    cr_assert_eq(http_server_start(&hc2, e, &s2, err, sizeof(err)), -EADDRINUSE, "%s", err);
    ht_stop(&t);
    /* a regular file is never removed */
    FILE *f = fopen(sock_path(), "w");
    fclose(f);
    cr_assert_eq(llmd_engine_open(&ec, &e, err, sizeof(err)), 0);
    err[0] = '\0';
    cr_assert_eq(http_server_start(&hc2, e, &s2, err, sizeof(err)), -EEXIST);
    cr_assert(strstr(err, "not a socket"), "%s", err);
    unlink(sock_path());
}

static bool ht_starts(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Run llmctl ARGS; its exit code, output in out. */
static int llmctl(const char *args, char *out, size_t cap) {
    const char *build = getenv("LLMD_BUILD");
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/llmctl %s 2>&1", build ? build : "build/debug", args);
    FILE *f = popen(cmd, "r");
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(serve_admin, llmctl_commands, .timeout = 60) {
    struct ht_server t;
    start_admin(&t);
    char out[16384], args[256];
    snprintf(args, sizeof(args), "-s %s stats", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "# engine\n") && strstr(out, "\nkv_pages_total:"), "%s", out);
    cr_assert(strstr(out, "finished_total_length:0"), "%s", out);
    snprintf(args, sizeof(args), "-s %s seqs", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strncmp(out, "ID ", 3) == 0, "%s", out);
    snprintf(args, sizeof(args), "-s %s --json pages", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"page_bytes\": 20480"), "%s", out);
    snprintf(args, sizeof(args), "-s %s config", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "served_model_name:" HT_NAME), "%s", out);
    snprintf(args, sizeof(args), "-s %s drain", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "draining:true"), "%s", out);
    snprintf(args, sizeof(args), "-s %s stats --exit", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 2, "%s", out);
    cr_assert_eq(llmctl("-s /nonexistent.sock stats", out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "cannot connect"), "%s", out);
    cr_assert_eq(llmctl("frob", out, sizeof(out)), 2, "%s", out);
    /* regress: "llmctl: purge: purge needs --tenant T, alone" said purge twice */
    snprintf(args, sizeof(args), "-s %s purge", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 2, "%s", out);
    cr_assert(ht_starts(out, "llmctl: purge: needs --tenant T\nusage:"), "%s", out);
    snprintf(args, sizeof(args), "-s %s stats --tenant 1", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 2, "%s", out);
    cr_assert(ht_starts(out, "llmctl: stats: --tenant goes with purge\nusage:"), "%s", out);
    /* an id is a tenant whatever it has cached: nothing is 0 pages, and a success; a name
     * that the keys file lacks is an error (a typo purges nothing) */
    snprintf(args, sizeof(args), "-s %s purge --tenant 99", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert_str_eq(out, "tenant:99\ndevice_pages:0\nhost_pages:0\nnvme_pages:0\n");
    snprintf(args, sizeof(args), "-s %s purge --tenant nobody", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 1, "%s", out);
    cr_assert_str_eq(out, "llmctl: no tenant 'nobody' in the keys file\n");
    ht_stop(&t);
}

/* regress: a request whose line has no newline before the client closes
 * its side (`printf '{"cmd":"stats"}' | nc -U SOCKET`) got no answer. */
Test(serve_admin, regress_a_last_line_without_newline_is_answered_at_eof, .timeout = 60) {
    struct ht_server t;
    start_admin(&t);
    int fd = admin_connect();
    const char *req = "{\"cmd\":\"tiers\"}\n{\"cmd\":\"stats\"}";
    ht_send_all(fd, req, strlen(req));
    cr_assert_eq(shutdown(fd, SHUT_WR), 0);
    json_t *j = admin_read(fd);
    cr_assert(json_is_object(json_object_get(j, "host")), "the first line's answer");
    json_decref(j);
    j = admin_read(fd);
    cr_assert(json_is_true(json_object_get(j, "ok")));
    cr_assert_eq(geti(j, "server", "requests_live"), 0, "the last line's answer");
    json_decref(j);
    close(fd);
    ht_stop(&t);
}

/* regress: routine admin actions were logged as warnings ("llmd: http:
 * warn: admin socket: drain"): they are info, not shown by default. */
Test(serve_admin, regress_routine_admin_actions_are_logged_at_info, .timeout = 60) {
    struct ht_server t;
    start_admin(&t);
    char path[64];
    snprintf(path, sizeof(path), "/tmp/llmd-admin-log-%d", getpid());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    dup2(fd, 2);
    close(fd);
    enum log_level old = log_get_level();
    log_set_level(LOG_LEVEL_INFO);
    json_decref(admin("{\"cmd\":\"purge\",\"tenant\":3}"));
    json_decref(admin("{\"cmd\":\"drain\"}"));
    log_set_level(old);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char text[4096];
    FILE *f = fopen(path, "r");
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(path);
    cr_assert(strstr(text, "llmd: http: info: admin socket: purged tenant 3 (0 device, 0 host, 0 "
                           "nvme pages)\n"),
              "%s", text);
    cr_assert(strstr(text, "llmd: http: info: admin socket: drain\n"), "%s", text);
    cr_assert_null(strstr(text, "warn"), "%s", text);
    ht_stop(&t);
}

/* cached_tokens of a two-page prompt sent with this key (and text). */
static int64_t cached_with(struct ht_server *t, const char *key, int variant) {
    char hdr[128], body[512];
    snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s\r\n", key);
    snprintf(body, sizeof(body),
             "{\"prompt\":\"Once upon a time %d there was a big dog. The dog liked to run in "
             "the park with his friend the cat, and they played all day long.\","
             "\"max_tokens\":2}",
             variant);
    struct ht_resp r;
    ht_request(t->port, "POST", "/v1/completions", key ? hdr : NULL, body, &r);
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    json_t *j = ht_json(&r);
    int64_t c = json_integer_value(json_object_get(
        json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
    json_decref(j);
    ht_free(&r);
    return c;
}

Test(serve_admin, purge_a_tenant_by_name, .timeout = 60) {
    char keys[64];
    snprintf(keys, sizeof(keys), "/tmp/llmd-admin-keys-%d", getpid());
    FILE *f = fopen(keys, "w");
    fputs("ka acme\nkg globex\n", f);
    fclose(f);
    chmod(keys, 0600);
    unlink(sock_path());
    struct ht_server t;
    struct http_config hc = {.admin_socket = sock_path(), .api_keys_path = keys};
    ht_start(&t, NULL, &hc);
    unlink(keys);
    cr_assert_eq(cached_with(&t, "ka", 0), 0);
    cr_assert_eq(cached_with(&t, "ka", 0), 32);
    cr_assert_eq(cached_with(&t, "kg", 0), 0);
    json_t *j = admin("{\"cmd\":\"purge\",\"tenant\":\"acme\"}");
    cr_assert(json_is_true(json_object_get(j, "ok")), "%s", json_dumps(j, 0));
    cr_assert_eq(geti(j, "tenant", NULL), 1);
    cr_assert_geq(geti(j, "device_pages", NULL), 2);
    json_decref(j);
    cr_assert_eq(cached_with(&t, "ka", 0), 0, "acme's prefix is gone");
    cr_assert_eq(cached_with(&t, "kg", 0), 32, "globex keeps its own");
    j = admin("{\"cmd\":\"purge\",\"tenant\":\"initech\"}");
    cr_assert(json_is_false(json_object_get(j, "ok")));
    json_decref(j);
    j = admin("{\"cmd\":\"purge\"}");
    cr_assert(json_is_false(json_object_get(j, "ok")));
    json_decref(j);
    ht_stop(&t);
}

/* A host tier under a 10-page device budget: cold prefixes spill and come
 * back, and the eviction log says so, read forward with a cursor. */
Test(serve_admin, tiers_and_the_eviction_log, .timeout = 60) {
    unlink(sock_path());
    struct llmd_engine_config ec = ht_engine_config();
    ec.kv_budget_bytes = 10 * 20480;
    ec.host_tier_bytes = 1 << 20;
    ec.offload_always = 1;
    struct ht_server t;
    struct http_config hc = {.admin_socket = sock_path()};
    ht_start(&t, &ec, &hc);
    for (int i = 0; i < 8; i++)
        cached_with(&t, NULL, i);
    cr_assert_eq(cached_with(&t, NULL, 0), 32, "restored from the host tier");
    json_t *j = admin("{\"cmd\":\"tiers\"}");
    json_int_t spills = geti(json_object_get(j, "host"), "spills_total", NULL);
    cr_assert_gt(spills, 0);
    cr_assert_gt(geti(json_object_get(j, "host"), "restores_total", NULL), 0);
    json_decref(j);
    j = admin("{\"cmd\":\"evictions\",\"max\":3}");
    json_t *ev = json_object_get(j, "events");
    cr_assert_eq(json_array_size(ev), 3);
    json_int_t cursor = geti(j, "cursor", NULL);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(ev, 2), "seq")), cursor);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 0), "from")), "device");
    json_decref(j);
    char req[128];
    snprintf(req, sizeof(req), "{\"cmd\":\"evictions\",\"cursor\":%lld}", (long long)cursor);
    j = admin(req);
    ev = json_object_get(j, "events");
    cr_assert_gt(json_array_size(ev), 0);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(ev, 0), "seq")), cursor + 1,
                 "read forward, nothing twice");
    json_decref(j);
    struct ht_resp r;
    ht_request(t.port, "GET", "/metrics", NULL, NULL, &r);
    char want[64];
    snprintf(want, sizeof(want), "\nllmd_kv_spills_total{tier=\"host\"} %lld\n", (long long)spills);
    cr_assert(strstr(r.body, want), "%s", want);
    ht_free(&r);
    char out[16384], args[256];
    snprintf(args, sizeof(args), "-s %s evictions", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "device->host"), "%s", out);
    snprintf(args, sizeof(args), "-s %s tiers", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "# host\n") && strstr(out, "spills_total:"), "%s", out);
    snprintf(args, sizeof(args), "-s %s purge --tenant 0", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "device_pages:"), "%s", out);
    snprintf(args, sizeof(args), "-s %s purge", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 2, "%s", out);
    ht_stop(&t);
}

/* blocks: every tier's hashes (llmd_kv_blocks), the JSON and llmctl's lines;
 * counts equal the pool's cached + mapped-and-sealed pages and the host
 * tier's pages, and a purge empties them. */
Test(serve_admin, blocks_lists_every_tier, .timeout = 60) {
    unlink(sock_path());
    struct llmd_engine_config ec = ht_engine_config();
    ec.kv_budget_bytes = 10 * 20480;
    ec.host_tier_bytes = 1 << 20;
    ec.offload_always = 1;
    struct ht_server t;
    struct http_config hc = {.admin_socket = sock_path()};
    ht_start(&t, &ec, &hc);
    for (int i = 0; i < 8; i++)
        cached_with(&t, NULL, i);
    json_t *j = admin("{\"cmd\":\"blocks\"}");
    cr_assert(json_is_true(json_object_get(j, "ok")));
    json_t *dev = json_object_get(j, "device"), *host = json_object_get(j, "host");
    cr_assert_gt(json_array_size(dev), 0);
    cr_assert_gt(json_array_size(host), 0, "the small pool spilled");
    cr_assert_eq(json_array_size(json_object_get(j, "nvme")), 0);
    const char *h0 = json_string_value(json_array_get(dev, 0));
    cr_assert_eq(strlen(h0), 64);
    cr_assert_eq(strspn(h0, "0123456789abcdef"), 64, "%s", h0);
    json_t *tiers = admin("{\"cmd\":\"tiers\"}");
    cr_assert_eq((json_int_t)json_array_size(host),
                 geti(json_object_get(tiers, "host"), "pages", NULL));
    json_decref(tiers);
    char out[1 << 16], args[256], want[96];
    snprintf(args, sizeof(args), "-s %s blocks", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    snprintf(want, sizeof(want), "device %s\n", h0);
    cr_assert(strstr(out, want), "%s", out);
    snprintf(want, sizeof(want), "# device %zu, host %zu, nvme 0\n", json_array_size(dev),
             json_array_size(host));
    cr_assert(strstr(out, want), "want '%s' in %s", want, out);
    json_decref(j);
    snprintf(args, sizeof(args), "-s %s purge --tenant 0", sock_path());
    cr_assert_eq(llmctl(args, out, sizeof(out)), 0, "%s", out);
    j = admin("{\"cmd\":\"blocks\"}");
    cr_assert_eq(json_array_size(json_object_get(j, "device")), 0);
    cr_assert_eq(json_array_size(json_object_get(j, "host")), 0);
    json_decref(j);
    ht_stop(&t);
}
