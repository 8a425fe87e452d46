/* `llmd serve` as a command, through the build's own binary: start-up on
 * an ephemeral port, SIGTERM drains and exits 0 (under the ASan build a
 * leak makes that exit code non-zero), flag and start-up errors. */
#include "tests/lib/http_util.h"
#include "tests/lib/proc_util.h"

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
