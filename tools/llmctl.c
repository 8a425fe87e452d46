/* llmctl - talk to a running `llmd serve` through its admin socket
 * (--admin-socket; engine/serve/admin.c has the protocol: one JSON request
 * a line, one JSON answer a line).
 *
 *   llmctl [-s SOCKET] [--json] stats | seqs | pages | tiers | config
 *   llmctl [-s SOCKET] evictions [--follow] | purge --tenant T | drain [--exit]
 *
 * The socket is -s, else $LLMD_ADMIN_SOCKET. Output is INFO-style
 * ("# section" then "key:value" lines; seqs as a table), or the answer
 * itself with --json. Exit codes: 0, 1 (no server, or it refused), 2
 * (usage). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void ctl_usage(FILE *f) {
    fprintf(f, "usage: llmctl [-s SOCKET] [--json] COMMAND\n"
               "\n"
               "Asks a running `llmd serve --admin-socket SOCKET` (default: $LLMD_ADMIN_SOCKET).\n"
               "\n"
               "commands:\n"
               "  stats          engine and server counters, latency means\n"
               "  seqs           the live requests: id, tenant, state, tokens, age\n"
               "  pages [--seq ID]  a map of the device KV pool, one character a page\n"
               "                 ('.' free, 'a' mapped ahead of need, 'M' mapped, '2'-'9'/'+'\n"
               "                 shared by that many, 'C' cached, 'S' spilling, 'R'\n"
               "                 restoring), counts, and the\n"
               "                 host and NVMe tiers' occupancy; --seq ID: one running\n"
               "                 request's pages in token order\n"
               "  tiers          the host and NVMe tiers: pages, spills, restores, bandwidth\n"
               "  blocks         the block hashes (hex) each tier holds: device, host, nvme;\n"
               "                 what a subscriber to the KV-cache events should hold\n"
               "  evictions [--follow]  the eviction log (spills, restores, drops, purges);\n"
               "                 --follow keeps printing new events until interrupted\n"
               "  purge --tenant T  drop tenant T's cached prefixes from every tier (a name\n"
               "                 of the server's keys file, or an engine tenant id; an id\n"
               "                 with nothing cached purges 0 pages, a name not in the\n"
               "                 keys file is an error)\n"
               "  config         the server's and the engine's configuration\n"
               "  drain [--exit] stop taking requests (health says draining); with --exit the\n"
               "                 server exits once running requests finished (its\n"
               "                 --drain-timeout applies)\n"
               "\n"
               "  -s, --socket PATH   the admin socket\n"
               "      --json          print the server's JSON answer\n");
}

/* Send one request line, read one answer line (caller frees). NULL on
 * failure, with the reason on stderr. */
static char *ctl_call(const char *path, const char *req) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "llmctl: %s: path too long\n", path);
        return NULL;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        fprintf(stderr,
                "llmctl: cannot connect to %s: %s (is `llmd serve --admin-socket` "
                "running?)\n",
                path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    size_t n = strlen(req);
    if (send(fd, req, n, MSG_NOSIGNAL) != (ssize_t)n || send(fd, "\n", 1, MSG_NOSIGNAL) != 1) {
        fprintf(stderr, "llmctl: %s: %s\n", path, strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                break;
            buf = nb;
        }
        ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
        if (k <= 0)
            break;
        len += (size_t)k;
        if (memchr(buf + len - (size_t)k, '\n', (size_t)k))
            break;
    }
    close(fd);
    buf[len] = '\0';
    if (!strchr(buf, '\n')) {
        fprintf(stderr, "llmctl: %s: no answer\n", path);
        free(buf);
        return NULL;
    }
    return buf;
}

/* "key:value" for scalars; a top-level object opens a "# key" section,
 * deeper ones prefix their keys ("finished_total_stop:3"). */
static void ctl_print_info(json_t *o, const char *prefix, int depth) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (depth == 0 && strcmp(k, "ok") == 0)
            continue;
        if (json_is_object(v)) {
            char sub[128] = "";
            if (depth == 0)
                printf("# %s\n", k);
            else
                snprintf(sub, sizeof(sub), "%s%s_", prefix, k);
            ctl_print_info(v, sub, depth + 1);
            continue;
        }
        printf("%s%s:", prefix, k);
        if (json_is_string(v))
            printf("%s\n", json_string_value(v));
        else if (json_is_integer(v))
            printf("%lld\n", (long long)json_integer_value(v));
        else if (json_is_real(v))
            printf("%.6g\n", json_real_value(v));
        else if (json_is_boolean(v))
            printf("%s\n", json_is_true(v) ? "true" : "false");
        else
            printf("-\n");
    }
}

static void ctl_print_events(json_t *ans) {
    json_t *arr = json_object_get(ans, "events"), *e;
    size_t i;
    json_array_foreach(arr, i, e) {
        printf("%lld %.3f %-7s %s->%s page %lld tenant %lld bytes %lld hash %s\n",
               (long long)json_integer_value(json_object_get(e, "seq")),
               (double)json_integer_value(json_object_get(e, "time_ns")) * 1e-9,
               json_string_value(json_object_get(e, "reason")),
               json_string_value(json_object_get(e, "from")),
               json_string_value(json_object_get(e, "to")),
               (long long)json_integer_value(json_object_get(e, "page")),
               (long long)json_integer_value(json_object_get(e, "tenant")),
               (long long)json_integer_value(json_object_get(e, "bytes")),
               json_string_value(json_object_get(e, "hash")));
    }
    long long lost = (long long)json_integer_value(json_object_get(ans, "lost"));
    if (lost)
        printf("(%lld events overwritten before this read)\n", lost);
    fflush(stdout);
}

static void ctl_print_seqs(json_t *ans) {
    json_t *arr = json_object_get(ans, "seqs"), *s;
    size_t i;
    printf("%-20s %6s %5s %-7s %7s %7s %7s %9s %9s\n", "ID", "TENANT", "PRIO", "STATE", "PROMPT",
           "CACHED", "GEN", "AGE_S", "QUEUE_S");
    json_array_foreach(arr, i, s) {
        printf("%-20lld %6lld %5lld %-7s %7lld %7lld %7lld %9.3f %9.3f\n",
               (long long)json_integer_value(json_object_get(s, "id")),
               (long long)json_integer_value(json_object_get(s, "tenant")),
               (long long)json_integer_value(json_object_get(s, "priority")),
               json_string_value(json_object_get(s, "state")),
               (long long)json_integer_value(json_object_get(s, "prompt_tokens")),
               (long long)json_integer_value(json_object_get(s, "cached_tokens")),
               (long long)json_integer_value(json_object_get(s, "generated_tokens")),
               json_real_value(json_object_get(s, "age_s")),
               json_real_value(json_object_get(s, "queue_s")));
    }
    long long total = (long long)json_integer_value(json_object_get(ans, "total"));
    if ((size_t)total > json_array_size(arr))
        printf("(%lld live, %zu listed)\n", total, json_array_size(arr));
}

/* The pool map as the server drew it, then the counts; or one sequence's
 * pages. */
static void ctl_print_pages(json_t *ans) {
    json_t *pages = json_object_get(ans, "pages");
    if (json_is_array(pages)) {
        size_t i;
        json_t *p;
        printf("seq %lld: %zu pages of %lld bytes:",
               (long long)json_integer_value(json_object_get(ans, "seq")), json_array_size(pages),
               (long long)json_integer_value(json_object_get(ans, "page_bytes")));
        json_array_foreach(pages, i, p)
            printf("%s%lld", i % 16 ? " " : "\n  ", (long long)json_integer_value(p));
        printf("\n");
        return;
    }
    fputs(json_string_value(json_object_get(ans, "map")), stdout);
    json_object_del(ans, "map");
    ctl_print_info(ans, "", 0);
}

/* One line a block: its tier and hash. */
static void ctl_print_blocks(json_t *ans) {
    static const char *const tiers[] = {"device", "host", "nvme"};
    for (size_t t = 0; t < 3; t++) {
        json_t *arr = json_object_get(ans, tiers[t]), *h;
        size_t i;
        json_array_foreach(arr, i, h) printf("%-6s %s\n", tiers[t], json_string_value(h));
    }
    for (size_t t = 0; t < 3; t++)
        printf("%s%s %zu", t ? ", " : "# ", tiers[t],
               json_array_size(json_object_get(ans, tiers[t])));
    printf("\n");
}

/* Ask once and print the answer. Returns the exit code; *cursor (evictions)
 * moves past what was printed. */
static int ctl_once(const char *path, const char *cmd, const char *req, bool as_json,
                    uint64_t *cursor) {
    char *line = ctl_call(path, req);
    if (!line)
        return 1;
    json_error_t je;
    json_t *ans = json_loads(line, JSON_DISABLE_EOF_CHECK, &je);
    free(line);
    if (!ans) {
        fprintf(stderr, "llmctl: the server's answer is not JSON: %s\n", je.text);
        return 1;
    }
    int rc = 0;
    if (!json_is_true(json_object_get(ans, "ok"))) {
        fprintf(stderr, "llmctl: %s\n", json_string_value(json_object_get(ans, "error")));
        rc = 1;
    } else if (as_json) {
        char *s = json_dumps(ans, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    } else if (strcmp(cmd, "seqs") == 0) {
        ctl_print_seqs(ans);
    } else if (strcmp(cmd, "evictions") == 0) {
        ctl_print_events(ans);
    } else if (strcmp(cmd, "pages") == 0) {
        ctl_print_pages(ans);
    } else if (strcmp(cmd, "blocks") == 0) {
        ctl_print_blocks(ans);
    } else {
        ctl_print_info(ans, "", 0);
    }
    if (rc == 0 && cursor)
        *cursor = (uint64_t)json_integer_value(json_object_get(ans, "cursor"));
    json_decref(ans);
    return rc;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"socket", required_argument, 0, 's'}, {"json", no_argument, 0, 'j'},
        {"exit", no_argument, 0, 'x'},         {"follow", no_argument, 0, 'f'},
        {"tenant", required_argument, 0, 't'}, {"seq", required_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    const char *path = getenv("LLMD_ADMIN_SOCKET"), *tenant = NULL, *seq = NULL;
    bool as_json = false, do_exit = false, follow = false;
    int c;
    while ((c = getopt_long(argc, argv, "s:t:fh", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            path = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'x':
            do_exit = true;
            break;
        case 'f':
            follow = true;
            break;
        case 't':
            tenant = optarg;
            break;
        case 'q':
            seq = optarg;
            break;
        case 'h':
            ctl_usage(stdout);
            return 0;
        default:
            ctl_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        ctl_usage(stderr);
        return 2;
    }
    const char *cmd = argv[optind];
    static const char *const cmds[] = {"stats",  "seqs",  "pages",  "tiers", "evictions",
                                       "blocks", "purge", "config", "drain"};
    bool known = false;
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        known |= strcmp(cmd, cmds[i]) == 0;
    const char *bad = !known                                    ? "unknown command"
                      : do_exit && strcmp(cmd, "drain") != 0    ? "--exit goes with drain"
                      : follow && strcmp(cmd, "evictions") != 0 ? "--follow goes with evictions"
                      : seq && strcmp(cmd, "pages") != 0        ? "--seq goes with pages"
                      : tenant && strcmp(cmd, "purge") != 0     ? "--tenant goes with purge"
                      : !tenant && strcmp(cmd, "purge") == 0    ? "needs --tenant T"
                                                                : NULL;
    if (bad) {
        fprintf(stderr, "llmctl: %s: %s\n", cmd, bad);
        ctl_usage(stderr);
        return 2;
    }
    if (!path) {
        fprintf(stderr, "llmctl: no socket: give -s PATH or set LLMD_ADMIN_SOCKET\n");
        return 2;
    }
    json_t *req = json_pack("{s:s}", "cmd", cmd);
    if (do_exit)
        json_object_set_new(req, "exit", json_true());
    if (tenant) { /* a number is an engine id, anything else a name of the keys file */
        char *end;
        long long id = strtoll(tenant, &end, 10);
        json_object_set_new(req, "tenant",
                            *end || end == tenant || id < 0 ? json_string(tenant)
                                                            : json_integer(id));
    }
    if (seq) {
        char *end;
        long long id = strtoll(seq, &end, 10);
        if (*end || end == seq || id < 0) {
            fprintf(stderr, "llmctl: --seq wants a request id (llmctl seqs lists them): '%s'\n",
                    seq);
            json_decref(req);
            return 2;
        }
        json_object_set_new(req, "seq", json_integer(id));
    }
    uint64_t cursor = 0;
    int rc;
    for (;;) {
        json_object_set_new(req, "cursor", json_integer((json_int_t)cursor));
        char *line = json_dumps(req, JSON_COMPACT);
        rc = ctl_once(path, cmd, line, as_json, strcmp(cmd, "evictions") == 0 ? &cursor : NULL);
        free(line);
        if (rc || !follow)
            break;
        usleep(500 * 1000); /* a poll, not a stream: the log is a ring the server keeps */
    }
    json_decref(req);
    return rc;
}
