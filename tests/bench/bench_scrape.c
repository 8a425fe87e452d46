/* bench_scrape - how long GET /metrics takes on a serving `llmd serve`, at
 * the rate a router scrapes it (the Gateway API inference extension polls
 * every 50 ms: 20 scrapes/s), while requests run.
 *
 * Usage: bench_scrape [-p PORT] [-r RATE] [-s SECONDS] [-m MODEL] [-c CLIENTS]
 *                     [-t THREADS]
 *   -p PORT     scrape a server already running on 127.0.0.1:PORT (its load
 *               from elsewhere, e.g. ../shared/tools/loadgen.py); without it,
 *               start `llmd serve -m MODEL --port 0` from this build
 *               (bench/../llmd) and load it with CLIENTS closed-loop clients,
 *               each sending streamed completions of 64 tokens, one after another
 *   -r RATE     scrapes a second (default 20), evenly spaced
 *   -s SECONDS  how long (default 10)
 *   -m MODEL    default dummy:dummy-100m:q8_0 (random weights, 6 layers)
 *   -c CLIENTS  default 4
 *   -t THREADS  the started server's forward-pass threads (`-t`; default:
 *               llmd's, every CPU)
 * Each scrape is one new connection (as Prometheus' scraper without
 * keep-alive): connect, request, the whole answer read. Prints the median,
 * p90, p99 and largest latency in ms, the page's bytes, and how many
 * completions the load finished meanwhile. A benchmark, not a test: it
 * asserts nothing. docs/benchmarks.md has the figures.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/bench/bench_util.h"

static int bs_connect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* One request on a new connection, the answer read to its end; returns the
 * bytes read (-1: no connection) and the status in *status. */
static long bs_request(uint16_t port, const char *method, const char *path, const char *body,
                       int *status) {
    int fd = bs_connect(port);
    if (fd < 0)
        return -1;
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, body ? strlen(body) : 0);
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n ||
        (body && send(fd, body, strlen(body), MSG_NOSIGNAL) != (ssize_t)strlen(body))) {
        close(fd);
        return -1;
    }
    static _Thread_local char buf[1 << 16];
    long total = 0;
    ssize_t k;
    *status = 0;
    while ((k = recv(fd, buf, sizeof(buf), 0)) > 0) {
        if (total == 0 && k > 12)
            *status = atoi(buf + 9);
        total += k;
    }
    close(fd);
    return total;
}

struct bs_load {
    uint16_t port;
    atomic_bool stop;
    atomic_long done, failed;
};

static void *bs_client(void *arg) {
    struct bs_load *l = arg;
    const char *body = "{\"prompt\":\"Once upon a time there was a little dog who liked to "
                       "run in the park\",\"max_tokens\":64,\"stream\":true,\"ignore_eos\":true}";
    while (!atomic_load(&l->stop)) {
        int st;
        long n = bs_request(l->port, "POST", "/v1/completions", body, &st);
        if (n > 0 && st == 200)
            atomic_fetch_add(&l->done, 1);
        else
            atomic_fetch_add(&l->failed, 1);
    }
    return NULL;
}

/* Start `llmd serve` next to this program's directory; its port from the
 * start-up line. */
static pid_t bs_serve(const char *argv0, const char *model, const char *threads, uint16_t *port) {
    char llmd[1024];
    const char *slash = strrchr(argv0, '/');
    snprintf(llmd, sizeof(llmd), "%.*s/../llmd", slash ? (int)(slash - argv0) : 1,
             slash ? argv0 : ".");
    int out[2];
    if (pipe(out) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(out[1], 1);
        close(out[0]);
        if (threads)
            execl(llmd, "llmd", "serve", "-m", model, "--port", "0", "-q", "--ctx", "512", "-t",
                  threads, (char *)NULL);
        else
            execl(llmd, "llmd", "serve", "-m", model, "--port", "0", "-q", "--ctx", "512",
                  (char *)NULL);
        fprintf(stderr, "bench_scrape: cannot run %s\n", llmd);
        _exit(127);
    }
    close(out[1]);
    char line[256];
    size_t n = 0;
    while (n < sizeof(line) - 1 && read(out[0], line + n, 1) == 1 && line[n] != '\n')
        n++;
    line[n] = '\0';
    close(out[0]);
    const char *colon = strrchr(line, ':');
    if (!strstr(line, "listening on") || !colon) {
        fprintf(stderr, "bench_scrape: llmd serve did not start: '%s'\n", line);
        return -1;
    }
    *port = (uint16_t)atoi(colon + 1);
    return pid;
}

int main(int argc, char **argv) {
    int port = 0, clients = 4;
    double rate = 20, seconds = 10;
    const char *model = "dummy:dummy-100m:q8_0", *threads = NULL;
    int c;
    while ((c = getopt(argc, argv, "p:r:s:m:c:t:")) != -1) {
        if (c == 'p')
            port = atoi(optarg);
        else if (c == 'r')
            rate = atof(optarg);
        else if (c == 's')
            seconds = atof(optarg);
        else if (c == 'm')
            model = optarg;
        else if (c == 'c')
            clients = atoi(optarg);
        else if (c == 't')
            threads = optarg;
        else {
            fprintf(stderr, "usage: bench_scrape [-p PORT] [-r RATE] [-s SECONDS] [-m MODEL] "
                            "[-c CLIENTS] [-t THREADS]\n");
            return 2;
        }
    }
    if (rate <= 0 || seconds <= 0 || clients < 0 || clients > 64 || port < 0 || port > 65535) {
        fprintf(stderr, "bench_scrape: bad value\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    pid_t server = 0;
    uint16_t p = (uint16_t)port;
    if (!port && (server = bs_serve(argv[0], model, threads, &p)) < 0)
        return 1;
    struct bs_load load = {.port = p};
    pthread_t th[64];
    int n_th = port ? 0 : clients;
    for (int i = 0; i < n_th; i++)
        pthread_create(&th[i], NULL, bs_client, &load);
    /* the load running before the first scrape */
    while (n_th && atomic_load(&load.done) + atomic_load(&load.failed) < (long)n_th)
        usleep(10000);

    int n_max = (int)(rate * seconds) + 1, n = 0, failed = 0;
    double *lat = malloc((size_t)n_max * sizeof(*lat)), t0 = bench_now();
    long bytes = 0, done0 = atomic_load(&load.done);
    for (int i = 0; i < n_max - 1; i++) {
        double due = t0 + i / rate, now = bench_now();
        if (due > now)
            usleep((useconds_t)((due - now) * 1e6));
        double a = bench_now();
        int st;
        long got = bs_request(p, "GET", "/metrics", NULL, &st);
        double b = bench_now();
        if (got <= 0 || st != 200) {
            failed++;
            continue;
        }
        bytes = got;
        lat[n++] = (b - a) * 1e3;
    }
    double wall = bench_now() - t0;
    long done = atomic_load(&load.done) - done0;
    atomic_store(&load.stop, true);
    for (int i = 0; i < n_th; i++)
        pthread_join(th[i], NULL);
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
    }
    if (n == 0) {
        fprintf(stderr, "bench_scrape: no scrape answered\n");
        return 1;
    }
    double med = bench_median(lat, n); /* sorts lat */
    printf("bench_scrape: %d scrapes of /metrics in %.1f s (%.1f/s), %d failed, %ld bytes a page\n",
           n, wall, n / wall, failed, bytes);
    printf("  latency ms: median %.3f  p90 %.3f  p99 %.3f  max %.3f\n", med, lat[(n * 90) / 100],
           lat[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1], lat[n - 1]);
    if (n_th)
        printf("  load: %s, %d closed-loop clients, %ld streamed completions of 64 tokens "
               "finished meanwhile (%ld failed)\n",
               model, n_th, done, atomic_load(&load.failed));
    free(lat);
    return 0;
}
