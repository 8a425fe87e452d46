/* `llmd serve` as a command, through the build's own binary: start-up on
 * an ephemeral port, SIGTERM drains and exits 0 (under the ASan build a
 * leak makes that exit code non-zero), flag and start-up errors. */
#include <signal.h>
#include <sys/wait.h>

#include "http_test_util.h"

struct proc {
    pid_t pid;
    uint16_t port;
    int err_fd; /* its stderr */
};

/* Start `llmd serve ARGS` and read the port from its first stdout line. */
static void serve_start(struct proc *p, const char *args) {
    const char *build = getenv("LLMD_BUILD");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "exec %s/llmd serve %s", build ? build : "build/debug", args);
    int out[2], err[2];
    cr_assert_eq(pipe(out), 0);
    cr_assert_eq(pipe(err), 0);
    p->pid = fork();
    cr_assert_geq(p->pid, 0);
    if (p->pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    p->err_fd = err[0];
    char line[256];
    size_t n = 0;
    while (n < sizeof(line) - 1) {
        ssize_t k = read(out[0], line + n, 1);
        if (k <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(out[0]);
    const char *colon = strrchr(line, ':');
    cr_assert(strstr(line, "listening on http://127.0.0.1:") && colon, "start-up line: '%s'", line);
    p->port = (uint16_t)atoi(colon + 1);
}

/* Wait for the process; returns its exit code (128 + signal if killed). */
static int serve_wait(struct proc *p, char *err, size_t cap) {
    size_t n = 0;
    ssize_t k;
    while (n < cap - 1 && (k = read(p->err_fd, err + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    err[n] = '\0';
    close(p->err_fd);
    int st;
    cr_assert_eq(waitpid(p->pid, &st, 0), p->pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Run `llmd ARGS` to completion; its exit code, output in out. */
static int llmd_run(const char *args, char *out, size_t cap) {
    const char *build = getenv("LLMD_BUILD");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/llmd %s 2>&1", build ? build : "build/debug", args);
    FILE *f = popen(cmd, "r");
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(serve_cli, sigterm_drains_the_running_stream_and_exits_0, .timeout = 60) {
    struct proc p;
    serve_start(&p, "-m " HT_MODEL " --port 0 --ctx 512 -t 1 --kv-type f32");
    struct ht_resp r;
    ht_post(p.port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":8}", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    ht_free(&r);
    const char *b = "{\"prompt\":\"Once upon a time\",\"max_tokens\":480,\"stream\":true}";
    int fd = ht_send(p.port, "POST", "/v1/completions", NULL, b, strlen(b));
    char first[16];
    cr_assert_gt(recv(fd, first, sizeof(first), MSG_PEEK), 0); /* it runs */
    kill(p.pid, SIGTERM);
    ht_read(fd, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.body, "\"finish_reason\":\"length\""), "%.300s", r.body);
    cr_assert(strstr(r.body, "data: [DONE]"));
    ht_free(&r);
    char err[4096];
    int code = serve_wait(&p, err, sizeof(err));
    cr_assert_eq(code, 0, "exit %d: %s", code, err);
    cr_assert(strstr(err, "SIGTERM received") && strstr(err, "stopped"), "%s", err);
}

Test(serve_cli, drain_timeout_0_cancels_at_once, .timeout = 60) {
    struct proc p;
    serve_start(&p, "-m " HT_MODEL " --port 0 --ctx 512 -t 1 --drain-timeout 0 --max-seqs 1");
    const char *b = "{\"prompt\":\"Once upon a time\",\"max_tokens\":480,\"stream\":true}";
    int fds[4];
    for (int i = 0; i < 4; i++)
        fds[i] = ht_send(p.port, "POST", "/v1/completions", NULL, b, strlen(b));
    /* all four in the server (one running, three queued) before the signal */
    for (double t0 = ht_now(); ht_now() - t0 < 20;) {
        struct ht_resp m;
        ht_request(p.port, "GET", "/metrics", NULL, NULL, &m);
        bool all = strstr(m.body, "\nllmd_requests_waiting 3\n") != NULL;
        ht_free(&m);
        if (all)
            break;
        usleep(2000);
    }
    kill(p.pid, SIGINT);
    int cancelled = 0;
    for (int i = 0; i < 4; i++) {
        struct ht_resp r;
        ht_read(fds[i], &r);
        if (r.status == 200 && strstr(r.body, "\"code\":\"cancelled\""))
            cancelled++;
        else
            cr_assert(r.status == 200 || r.status == 503, "%d: %s", r.status, r.body);
        ht_free(&r);
    }
    cr_assert_gt(cancelled, 0);
    char err[4096];
    int code = serve_wait(&p, err, sizeof(err));
    cr_assert_eq(code, 0, "exit %d: %s", code, err);
    cr_assert(strstr(err, "cancelling"), "%s", err);
}

Test(serve_cli, flag_and_start_up_errors, .timeout = 60) {
    char out[8192];
    cr_assert_eq(llmd_run("serve", out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "-m MODEL is required"), "%s", out);
    cr_assert_eq(llmd_run("serve -m x --port 70000", out, sizeof(out)), 2);
    cr_assert(strstr(out, "invalid value '70000' for --port"), "%s", out);
    cr_assert_eq(llmd_run("serve -m x --max-body 1", out, sizeof(out)), 2);
    cr_assert_eq(llmd_run("serve --help", out, sizeof(out)), 0);
    cr_assert(strstr(out, "--api-keys") && strstr(out, "--drain-timeout"), "%s", out);
    cr_assert_eq(llmd_run("serve -m /nonexistent.gguf --port 0", out, sizeof(out)), 1, "%s", out);
    cr_assert_eq(
        llmd_run("serve -m " HT_MODEL " --port 0 --api-keys /nonexistent", out, sizeof(out)), 1,
        "%s", out);
    cr_assert(strstr(out, "--api-keys /nonexistent"), "%s", out);
    cr_assert_eq(llmd_run("serve -m " HT_MODEL " --port 0 --chat-template jinja", out, sizeof(out)),
                 1);
    cr_assert(strstr(out, "unknown chat template"), "%s", out);
    cr_assert_eq(llmd_run("serve -m " HT_MODEL " --host example.com", out, sizeof(out)), 1);
    cr_assert(strstr(out, "numeric"), "%s", out);

    /* a port in use */
    struct proc p;
    serve_start(&p, "-m " HT_MODEL " --port 0 -q");
    char args[256];
    snprintf(args, sizeof(args), "serve -m " HT_MODEL " --port %u", p.port);
    cr_assert_eq(llmd_run(args, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "cannot listen") && strstr(out, "in use"), "%s", out);
    kill(p.pid, SIGTERM);
    char err[1024];
    cr_assert_eq(serve_wait(&p, err, sizeof(err)), 0, "%s", err);
}
