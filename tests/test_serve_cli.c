/* `llmd serve` as a command, through the build's own binary: start-up on
 * an ephemeral port, SIGTERM drains and exits 0 (under the ASan build a
 * leak makes that exit code non-zero), flag and start-up errors. */
#include "kernels/kern.h"
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
    /* generate's model line, with the file's matrix types (and from the
     * avx2 level up the matrices' copies: model.h) */
    cr_assert(strstr(err, kern_isa() >= KERN_ISA_AVX2
                              ? "llmd serve: model stories260K-f32: 5 layers, n_embd 64, heads "
                                "8/4, vocab 512, 1.2 MB of weights (+1.0 MB copied); matrices 37 "
                                "f32; threads "
                              : "llmd serve: model stories260K-f32: 5 layers, n_embd 64, heads "
                                "8/4, vocab 512, 1.2 MB of weights; matrices 37 f32; threads "),
              "%s", err);
    /* --ctx 512 over stories260K's 128, in generate's and batch's words */
    cr_assert(strstr(err, "llmd serve: warning: --ctx 512 exceeds the model's context_length 128; "
                          "quality past 128 tokens is not what the model was trained for\n"),
              "%s", err);
}

/* regress: `llmctl drain --exit` made serve log "SIGTERM received", though
 * nobody sent one (serve signals itself): it says where the exit came from.
 * A real SIGTERM still says so (above). */
Test(serve_cli, regress_drain_exit_is_logged_as_the_admin_sockets, .timeout = 60) {
    char sock[64], args[256], out[1024], err[4096];
    snprintf(sock, sizeof(sock), "/tmp/llmd-dx-%d.sock", getpid());
    struct proc p;
    snprintf(args, sizeof(args), "-m " HT_MODEL " --port 0 -t 1 --admin-socket %s", sock);
    serve_start(&p, args);
    snprintf(out, sizeof(out), "llmd serve: listening on http://127.0.0.1:%u", p.port);
    cr_assert_str_eq(p.line, out);
    snprintf(args, sizeof(args), "%s/llmctl -s %s drain --exit 2>&1", serve_build_dir(), sock);
    FILE *f = popen(args, "r");
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
    cr_assert(strstr(out, "exiting:true"), "%s", out);
    int code = serve_wait(&p, err, sizeof(err));
    cr_assert_eq(code, 0, "exit %d: %s", code, err);
    cr_assert(strstr(err, "llmd serve: drain --exit from the admin socket\n"), "%s", err);
    cr_assert_null(strstr(err, "SIGTERM"), "%s", err);
    cr_assert(strstr(err, "llmd serve: stopped\n"), "%s", err);
}

/* regress: a --kv-budget over what --max-seqs contexts can use was capped
 * in silence; the note is generate's and batch's. */
Test(serve_cli, regress_a_budget_over_the_contexts_is_named, .timeout = 60) {
    struct proc p;
    serve_start(&p, "-m " HT_MODEL " --port 0 -t 1 --ctx 128 --max-seqs 2 --kv-budget 1G");
    kill(p.pid, SIGTERM);
    char err[4096];
    int code = serve_wait(&p, err, sizeof(err));
    cr_assert_eq(code, 0, "exit %d: %s", code, err);
    cr_assert(strstr(err, "llmd serve: --kv-budget 1G is more than 2 sequences of 128 tokens can "
                          "use; the KV pool is 8 pages of 20480 B (163840 B)\n"),
              "%s", err);
}

/* regress: `--host ::1` printed "listening on http://::1:PORT", not a URL:
 * an IPv6 address goes in brackets. */
Test(serve_cli, regress_an_ipv6_listen_address_is_printed_in_brackets, .timeout = 60) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool v6 = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0)
        close(fd);
    if (!v6)
        cr_skip_test("no IPv6 loopback here");
    struct proc p;
    serve_start(&p, "-m " HT_MODEL " --host ::1 --port 0 -t 1 -q");
    char want[128];
    snprintf(want, sizeof(want), "llmd serve: listening on http://[::1]:%u", p.port);
    cr_assert_str_eq(p.line, want);
    serve_stop(&p);
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
    /* the message says what the flag takes: no "see --help for the range" */
    cr_assert_str_eq(out, "llmd serve: invalid value '70000' for --port: want an integer "
                          "0..65535\n");
    cr_assert_eq(llmd_run("serve -m x --max-body 1", out, sizeof(out)), 2);
    cr_assert_str_eq(out, "llmd serve: invalid value '1' for --max-body: want a size of 64 bytes "
                          "or more (K/M/G suffixes)\n");
    /* the flags the user typed, not the engine's config fields */
    cr_assert_eq(llmd_run("serve -m x --max-seqs 300", out, sizeof(out)), 2);
    cr_assert_str_eq(out, "llmd serve: --max-batched-tokens (256, the default) must be >= "
                          "--max-seqs (300): every running sequence needs a token in each step\n");
    cr_assert_eq(llmd_run("serve -m x --kv-type int4", out, sizeof(out)), 2);
    cr_assert_str_eq(out, "llmd serve: invalid value 'int4' for --kv-type: want f16, f32, q8_0, "
                          "q4_0 or fp8\n");
    /* an unknown template is a usage error, before the model loads */
    cr_assert_eq(llmd_run("serve -m /nonexistent.gguf --chat-template jinja", out, sizeof(out)), 2,
                 "%s", out);
    cr_assert_str_eq(out, "llmd serve: invalid value 'jinja' for --chat-template: want chatml, "
                          "llama2, llama3 or plain\n");
    /* an engine error once, not "llmd serve: llmd: ..." */
    cr_assert_eq(llmd_run("serve -m " HT_MODEL " --port 0 --prefix-secret /nonexistent/key", out,
                          sizeof(out)),
                 1);
    cr_assert(strstr(out, "llmd serve: prefix-cache secret /nonexistent/key: No such file or "
                          "directory\n"),
              "%s", out);
    cr_assert_null(strstr(out, "llmd serve: llmd"), "%s", out);
    cr_assert_eq(llmd_run("serve --help", out, sizeof(out)), 0);
    cr_assert(strstr(out, "--api-keys") && strstr(out, "--drain-timeout"), "%s", out);
    cr_assert_eq(llmd_run("serve -m /nonexistent.gguf --port 0", out, sizeof(out)), 1, "%s", out);
    cr_assert_eq(
        llmd_run("serve -m " HT_MODEL " --port 0 --api-keys /nonexistent", out, sizeof(out)), 1,
        "%s", out);
    cr_assert(strstr(out, "--api-keys /nonexistent"), "%s", out);
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

/* `llmctl config` shows what the engine runs with, every default resolved:
 * it used to print 0 for each field left to its default. The L2 the
 * products block for comes from LLMD_L2_KIB here (the child inherits it). */
Test(serve_cli, llmctl_config_shows_effective_values, .timeout = 60) {
    char sock[64], args[256], out[8192];
    snprintf(sock, sizeof(sock), "/tmp/llmd-cfg-%d.sock", getpid());
    struct proc p;
    snprintf(args, sizeof(args), "-m " HT_MODEL " --port 0 -t 1 -q --admin-socket %s", sock);
    setenv("LLMD_L2_KIB", "768", 1);
    serve_start(&p, args);
    unsetenv("LLMD_L2_KIB");
    snprintf(args, sizeof(args), "%s/llmctl -s %s config 2>&1", serve_build_dir(), sock);
    FILE *f = popen(args, "r");
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
    static const char *const want[] = {
        "\nn_threads:1\n",
        "\nn_ctx:128\n",
        "\nmax_seq_tokens:128\n",
        "\nmax_seqs:8\n",
        "\nmax_batched_tokens:256\n",
        "\nmax_chunk_tokens:-\n",
        "\nkv_budget_bytes:655360\n",
        "\nkv_pages:32\n",
        "\npage_bytes:20480\n",
        "\ntokens_per_page:32\n",
        "\nkv_type:f16\n",
        "\nkv_token_bytes:640\n",
        "\nprefix_key:random\n",
        "\nhost_tier_bytes:0\n",
        "\nn_ctx:128\n",
        "\nweight_types:37 f32\n", /* stories260K-f32: 5 x 7 + embedding + classifier */
        "\nl2_bytes:786432\n",
        "\nl2_source:LLMD_L2_KIB\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_assert(strstr(out, want[i]), "no '%s' in:\n%s", want[i] + 1, out);
    kill(p.pid, SIGTERM);
    char err[1024];
    cr_assert_eq(serve_wait(&p, err, sizeof(err)), 0, "%s", err);
}

/* --spec draft through the server: llmctl config names the method and the
 * draft, and each token's KV holds the draft's 640 B after the target's
 * (the model drafts for itself here). */
Test(serve_cli, llmctl_config_shows_the_draft_model, .timeout = 60) {
    char sock[64], args[512], out[8192];
    snprintf(sock, sizeof(sock), "/tmp/llmd-cfgd-%d.sock", getpid());
    struct proc p;
    snprintf(args, sizeof(args),
             "-m " HT_MODEL
             " --port 0 -t 1 -q --admin-socket %s --spec draft --spec-model " HT_MODEL,
             sock);
    serve_start(&p, args);
    snprintf(args, sizeof(args), "%s/llmctl -s %s config 2>&1", serve_build_dir(), sock);
    FILE *f = popen(args, "r");
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
    static const char *const want[] = {"\nspec:draft\n", "\nspec_model:", "\nspec_tokens:8\n",
                                       "\nkv_draft_token_bytes:640\n", "\nkv_token_bytes:1280\n"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_assert(strstr(out, want[i]), "no '%s' in:\n%s", want[i] + 1, out);
    kill(p.pid, SIGTERM);
    char err[1024];
    cr_assert_eq(serve_wait(&p, err, sizeof(err)), 0, "%s", err);
}

/* A quantized cache through the server: a completion runs, and /metrics and
 * llmctl config name the type and its bytes a token (stories260K q4_0: 5 x
 * 2 x 18 B, padded to 192). */
Test(serve_cli, kv_type_q4_0_serves_and_says_so, .timeout = 60) {
    char sock[64], args[256], out[8192];
    snprintf(sock, sizeof(sock), "/tmp/llmd-kvq-%d.sock", getpid());
    struct proc p;
    snprintf(args, sizeof(args),
             "-m " HT_MODEL " --port 0 -t 1 -q --ctx 256 --kv-type q4_0 --admin-socket %s", sock);
    serve_start(&p, args);
    struct ht_resp r;
    ht_post(p.port, "/v1/completions",
            "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0}", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert(strstr(r.body, "\"completion_tokens\":6"), "%s", r.body);
    ht_free(&r);
    ht_request(p.port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert(strstr(r.body, "\nllmd_kv_cache_info{kv_type=\"q4_0\"} 1\n"), "%s", r.body);
    cr_assert(strstr(r.body, "\nllmd_kv_token_bytes 192\n"), "%s", r.body);
    ht_free(&r);
    snprintf(args, sizeof(args), "%s/llmctl -s %s config 2>&1", serve_build_dir(), sock);
    FILE *f = popen(args, "r");
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
    cr_assert(strstr(out, "\nkv_type:q4_0\n") && strstr(out, "\nkv_token_bytes:192\n"), "%s", out);
    kill(p.pid, SIGTERM);
    char err[1024];
    cr_assert_eq(serve_wait(&p, err, sizeof(err)), 0, "%s", err);
}

/* --kv-events: the flags that need it are refused without it, and with the
 * prefix cache off; an endpoint ZeroMQ refuses is a start-up error naming
 * it; with it, llmctl config shows the endpoints and the topic. */
Test(serve_cli, kv_events_flags, .timeout = 60) {
    char out[8192], args[512], sock[64];
    cr_assert_eq(llmd_run("serve -m x --kv-events-topic t", out, sizeof(out)), 2);
    cr_assert(strstr(out, "go with --kv-events ENDPOINT"), "%s", out);
    cr_assert_eq(llmd_run("serve -m x --kv-events-no-token-ids", out, sizeof(out)), 2);
    cr_assert_eq(
        llmd_run("serve -m x --kv-events ipc:///tmp/x --no-prefix-cache", out, sizeof(out)), 2);
    cr_assert(strstr(out, "--no-prefix-cache"), "%s", out);
    cr_assert_eq(llmd_run("serve -m x --kv-events ''", out, sizeof(out)), 2);
    cr_assert_eq(llmd_run("serve -m " HT_MODEL " --port 0 --kv-events nope://x", out, sizeof(out)),
                 1);
    cr_assert(strstr(out, "nope://x"), "%s", out);
    snprintf(sock, sizeof(sock), "/tmp/llmd-kvev-%d.sock", getpid());
    struct proc p;
    snprintf(args, sizeof(args),
             "-m " HT_MODEL
             " --port 0 -t 1 -q --admin-socket %s --kv-events ipc:///tmp/llmd-kvev-%d "
             "--kv-events-replay ipc:///tmp/llmd-kvev-%d.rep --kv-events-topic kv "
             "--kv-events-no-token-ids",
             sock, getpid(), getpid());
    serve_start(&p, args);
    snprintf(args, sizeof(args), "%s/llmctl -s %s config 2>&1", serve_build_dir(), sock);
    FILE *f = popen(args, "r");
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
    char want[128];
    snprintf(want, sizeof(want), "\nkv_events:ipc:///tmp/llmd-kvev-%d\n", getpid());
    cr_assert(strstr(out, want), "no '%s' in:\n%s", want + 1, out);
    cr_assert(strstr(out, "\nkv_events_topic:kv\n") && strstr(out, "\nkv_events_token_ids:false\n"),
              "%s", out);
    kill(p.pid, SIGTERM);
    char err[1024];
    cr_assert_eq(serve_wait(&p, err, sizeof(err)), 0, "%s", err);
}
