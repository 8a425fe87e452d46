/* http_util.h - test helpers for `llmd serve`: an in-process server on
 * an ephemeral loopback port, and a small HTTP/1.1 client over plain
 * sockets (one connection per request, "Connection: close", chunked
 * responses decoded; or several on one kept-alive connection), plus
 * Server-Sent Events parsing. */
#ifndef LLMD_TEST_HTTP_UTIL_H
#define LLMD_TEST_HTTP_UTIL_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "engine/serve/http.h"
#include "llmd.h"
#include "tests/lib/ref_util.h"

#define HT_MODEL REF_MODELS "/stories260K-f32.gguf"
#define HT_NAME  "stories260K-f32"

/* --- the server ----------------------------------------------------------- */

struct ht_server {
    struct http_server *s;
    uint16_t port;
};

/* The engine config every serve test starts from: stories260K, f32 KV (the
 * references' numerics), context 512, one thread. */
static inline struct llmd_engine_config ht_engine_config(void) {
    return (struct llmd_engine_config){
        .model = HT_MODEL, .n_threads = 1, .n_ctx = 512, .max_seqs = 8, .kv_type = LLMD_KV_F32};
}

/* Start a server; ec/hc NULL: the defaults above, no keys. */
static inline void ht_start(struct ht_server *t, const struct llmd_engine_config *ec,
                            const struct http_config *hc) {
    struct llmd_engine_config e0 = ht_engine_config();
    struct http_config h0 = {.model_path = HT_MODEL};
    if (!ec)
        ec = &e0;
    if (hc)
        h0 = *hc;
    if (!h0.model_path)
        h0.model_path = ec->model;
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(ec, &e, err, sizeof(err)), 0, "engine: %s", err);
    int rc = http_server_start(&h0, e, &t->s, err, sizeof(err));
    cr_assert_eq(rc, 0, "server: %d %s", rc, err);
    t->port = http_server_port(t->s);
    cr_assert_neq(t->port, 0);
}

static inline void ht_stop(struct ht_server *t) {
    http_server_stop(t->s);
    t->s = NULL;
}

/* --- the client ----------------------------------------------------------- */

struct ht_resp {
    int status;
    char head[8192]; /* the status line and headers */
    char *body;      /* decoded, NUL-terminated; free with ht_free() */
    size_t len;
};

static inline int ht_connect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect: %s", strerror(errno));
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static inline void ht_send_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return; /* the server may close early (413, 401): its answer tells */
        p += k;
        n -= (size_t)k;
    }
}

/* Send a request on a new connection; returns the fd, response unread. */
static inline int ht_send(uint16_t port, const char *method, const char *path, const char *headers,
                          const char *body, size_t body_len) {
    int fd = ht_connect(port);
    char head[4096];
    int n =
        snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s",
                 method, path, headers ? headers : "");
    if (body)
        n += snprintf(head + n, sizeof(head) - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    n += snprintf(head + n, sizeof(head) - (size_t)n, "\r\n");
    ht_send_all(fd, head, (size_t)n);
    if (body)
        ht_send_all(fd, body, body_len);
    return fd;
}

/* Decode a chunked body in place; returns the decoded length. */
static inline size_t ht_dechunk(char *b, size_t len) {
    size_t in = 0, out = 0;
    while (in < len) {
        char *end;
        unsigned long n = strtoul(b + in, &end, 16);
        char *crlf = strstr(end, "\r\n");
        if (!crlf || n == 0)
            break;
        in = (size_t)(crlf + 2 - b);
        if (in + n > len)
            n = len - in;
        memmove(b + out, b + in, n);
        out += n;
        in += n + 2;
    }
    b[out] = '\0';
    return out;
}

/* Read a whole response from fd (until the server closes) and close fd.
 * An incomplete response leaves status 0 and the raw bytes in body: no
 * assertion here, so client threads may call it (Criterion asserts only
 * on the test's own thread). */
static inline void ht_read(int fd, struct ht_resp *r) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    memset(r, 0, sizeof(*r));
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep) {
        r->body = buf;
        r->len = n;
        return;
    }
    size_t hl = (size_t)(sep - buf);
    memcpy(r->head, buf, hl < sizeof(r->head) - 1 ? hl : sizeof(r->head) - 1);
    r->status = atoi(buf + 9);
    r->len = n - hl - 4;
    r->body = malloc(r->len + 1);
    memcpy(r->body, sep + 4, r->len);
    r->body[r->len] = '\0';
    free(buf);
    if (strcasestr(r->head, "transfer-encoding: chunked"))
        r->len = ht_dechunk(r->body, r->len);
}

/* Send one request on the open connection fd, asking to keep it open. */
static inline void ht_send_on(int fd, const char *method, const char *path, const char *body) {
    char head[1024];
    int n = snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, path);
    if (body)
        n += snprintf(head + n, sizeof(head) - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
    n += snprintf(head + n, sizeof(head) - (size_t)n, "\r\n");
    ht_send_all(fd, head, (size_t)n);
    if (body)
        ht_send_all(fd, body, strlen(body));
}

/* Read one response with a Content-Length from fd, leaving fd open; no
 * body after a HEAD (head_only). Returns false, r->status 0, when the
 * server closed or sent no Content-Length. */
static inline bool ht_read_on(int fd, struct ht_resp *r, bool head_only) {
    memset(r, 0, sizeof(*r));
    size_t n = 0;
    char *sep = NULL;
    while (!sep) {
        if (n == sizeof(r->head) - 1)
            return false;
        ssize_t k = recv(fd, r->head + n, 1, 0); /* byte by byte: leave the body in the socket */
        if (k <= 0)
            return false;
        n++;
        sep = n >= 4 ? strstr(r->head + n - 4, "\r\n\r\n") : NULL;
    }
    *sep = '\0';
    const char *cl = strcasestr(r->head, "\r\nContent-Length:");
    if (!cl)
        return false;
    size_t len = head_only ? 0 : strtoull(cl + 17, NULL, 10);
    r->body = malloc(len + 1);
    while (r->len < len) {
        ssize_t k = recv(fd, r->body + r->len, len - r->len, 0);
        if (k <= 0)
            return false;
        r->len += (size_t)k;
    }
    r->body[len] = '\0';
    r->status = atoi(r->head + 9);
    return true;
}

static inline void ht_request(uint16_t port, const char *method, const char *path,
                              const char *headers, const char *body, struct ht_resp *r) {
    ht_read(ht_send(port, method, path, headers, body, body ? strlen(body) : 0), r);
}

static inline void ht_post(uint16_t port, const char *path, const char *body, struct ht_resp *r) {
    ht_request(port, "POST", path, NULL, body, r);
}

static inline void ht_free(struct ht_resp *r) {
    free(r->body);
    r->body = NULL;
}

/* The value of header `name` (case-insensitive) into out, or NULL. */
static inline const char *ht_header(const struct ht_resp *r, const char *name, char *out,
                                    size_t cap) {
    const char *p = r->head;
    size_t nl = strlen(name);
    while ((p = strstr(p, "\r\n"))) {
        p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t k = strcspn(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)k, v);
            return out;
        }
    }
    return NULL;
}

static inline json_t *ht_json(const struct ht_resp *r) {
    json_error_t e;
    json_t *j = json_loadb(r->body, r->len, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): '%s'", e.text, r->body);
    return j;
}

/* Assert an OpenAI error object with this status and code (test thread). */
static inline void ht_assert_error(const struct ht_resp *r, int status, const char *code) {
    cr_assert_eq(r->status, status, "status %d, want %d: %s", r->status, status, r->body);
    json_t *j = ht_json(r);
    json_t *e = json_object_get(j, "error");
    cr_assert(json_is_object(e), "no error object: %s", r->body);
    cr_assert(json_is_string(json_object_get(e, "message")), "%s", r->body);
    cr_assert(json_is_string(json_object_get(e, "type")), "%s", r->body);
    cr_assert(json_object_get(e, "param") != NULL, "no param key: %s", r->body);
    cr_assert(json_object_get(e, "code") != NULL, "no code key: %s", r->body);
    if (code)
        cr_assert_str_eq(json_string_value(json_object_get(e, "code")), code, "%s", r->body);
    json_decref(j);
}

/* The events of an SSE body: each `data:` payload that is JSON goes into
 * ev[] (caller decrefs); *done tells whether `data: [DONE]` ended it. */
static inline size_t ht_sse(const char *body, json_t **ev, size_t max, bool *done) {
    size_t n = 0;
    *done = false;
    const char *p = body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        cr_assert(!*done, "an event after [DONE]");
        if (len == 6 && strncmp(p, "[DONE]", 6) == 0) {
            *done = true;
        } else {
            json_error_t e;
            json_t *j = json_loadb(p, len, 0, &e);
            cr_assert_not_null(j, "event not JSON: '%.*s'", (int)len, p);
            cr_assert_lt(n, max);
            ev[n++] = j;
        }
        p += len;
    }
    return n;
}

static inline double ht_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait (up to 30 s) until the engine runs and queues nothing. 10 s was
 * too short under ASan on 2 vCPUs shared with another test run: a
 * whole-answer request dropped by its client can run its 480 tokens
 * before the disconnect is seen (test_serve_load), and did. */
static inline struct llmd_stats ht_wait_idle(struct ht_server *t) {
    struct llmd_stats st;
    double t0 = ht_now();
    do {
        http_server_stats(t->s, &st);
        if (st.requests_running == 0 && st.requests_waiting == 0 && http_server_live(t->s) == 0)
            break;
        usleep(10000);
    } while (ht_now() - t0 < 30);
    return st;
}

#endif /* LLMD_TEST_HTTP_UTIL_H */
