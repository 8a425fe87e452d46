/* KV-cache events end to end (issue 19 acceptance): an independent
 * subscriber (tests/serve/kv_events_sub.py: Python, Debian's python3-zmq and
 * python3-msgpack) decodes every event of a workload that fills the device
 * pool, spills to the host tier, demotes to and evicts from the NVMe tier,
 * restores, and purges a tenant; the per-tier block sets it rebuilds equal
 * what the engine reports (llmd_kv_blocks, what `llmctl blocks` prints),
 * before and after a flush to NVMe; a replay from sequence 0 returns the
 * same batches byte for byte; a restart publishes AllBlocksCleared first and
 * then the blocks the NVMe tier kept. stories260K, f32 KV (16 tokens a page). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OFFLOAD_TEST_OWN_ENGINE
#include "tests/lib/offload_util.h"

TestSuite(kv_events, .init = setup, .fini = teardown, .timeout = 240);

#define SUB_SCRIPT "tests/serve/kv_events_sub.py"

static char ep_pub[160], ep_rep[160];

static struct llmd_engine *open_events_engine(void) {
    snprintf(ep_pub, sizeof ep_pub, "ipc://%s/pub", dir);
    snprintf(ep_rep, sizeof ep_rep, "ipc://%s/rep", dir);
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = 4,
                                     .max_batched_tokens = 128,
                                     .kv_budget_bytes = 60ull * PAGE,
                                     .kv_type = LLMD_KV_F32,
                                     .prefix_secret = secret_path,
                                     .host_tier_bytes = 16ull * PAGE,
                                     .nvme_tier_path = nvme_path,
                                     .nvme_tier_bytes = 48ull * PAGE,
                                     .offload_always = 1,
                                     .kv_events_endpoint = ep_pub,
                                     .kv_events_replay_endpoint = ep_rep,
                                     .kv_events_topic = "kv@llmd"};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "open: %s", err);
    return e;
}

struct sub {
    pid_t pid;
    FILE *in, *out;
};

static struct sub sub_start(void) {
    int to[2], from[2];
    cr_assert_eq(pipe2(to, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(from, O_CLOEXEC), 0);
    pid_t parent = getpid();
    struct sub s = {.pid = fork()};
    cr_assert_geq(s.pid, 0);
    if (s.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(to[0], 0);
        dup2(from[1], 1);
        /* Debian's interpreter: python3-zmq and python3-msgpack live there */
        execl("/usr/bin/python3", "python3", SUB_SCRIPT, ep_pub, ep_rep, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    s.in = fdopen(to[1], "w");
    s.out = fdopen(from[0], "r");
    cr_assert(s.in && s.out);
    return s;
}

static json_t *sub_ask(struct sub *s, const char *cmd) {
    fprintf(s->in, "%s\n", cmd);
    fflush(s->in);
    static char line[1 << 22];
    cr_assert_not_null(fgets(line, sizeof line, s->out),
                       "the subscriber died on '%s' (its stderr is above)", cmd);
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    cr_assert_not_null(j, "subscriber answer: %s", je.text);
    return j;
}

static void sub_stop(struct sub *s) {
    fclose(s->in);
    fclose(s->out);
    int st;
    cr_assert_eq(waitpid(s->pid, &st, 0), s->pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "subscriber exit %d", st);
}

/* Step once (it flushes the last step's events into a batch), then wait
 * until the publisher's batch count stays put for 600 ms: NVMe writes finish
 * on their own thread and report as they land. Returns the count. */
static uint64_t quiesce(struct llmd_engine *e) {
    cr_assert_geq(llmd_engine_step(e), 0);
    uint64_t last = UINT64_MAX;
    for (int stable = 0, i = 0; stable < 4; i++) {
        cr_assert_lt(i, 200, "events never settled");
        struct timespec ts = {0, 150 * 1000 * 1000};
        nanosleep(&ts, NULL);
        cr_assert_geq(llmd_engine_step(e), 0); /* reaps NVMe completions, flushes */
        uint64_t n = stats(e).kv_event_batches_total;
        stable = n == last ? stable + 1 : 0;
        last = n;
    }
    return last;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The engine's blocks of `tier`, as sorted hex strings, against the
 * subscriber's array (sorted too). Returns the count. */
static size_t expect_tier(struct llmd_engine *e, enum llmd_tier tier, json_t *got,
                          const char *name) {
    int n = llmd_kv_blocks(e, tier, NULL, 0);
    cr_assert_geq(n, 0);
    uint8_t(*h)[32] = malloc((size_t)(n ? n : 1) * 32);
    cr_assert_eq(llmd_kv_blocks(e, tier, h, (uint32_t)n), n);
    char **hex = malloc((size_t)(n ? n : 1) * sizeof *hex);
    for (int i = 0; i < n; i++) {
        hex[i] = malloc(65);
        for (int b = 0; b < 32; b++)
            sprintf(hex[i] + 2 * b, "%02x", h[i][b]);
    }
    qsort(hex, (size_t)n, sizeof *hex, cmp_str);
    cr_assert_eq(json_array_size(got), (size_t)n,
                 "%s: the subscriber holds %zu blocks, the engine %d", name, json_array_size(got),
                 n);
    for (int i = 0; i < n; i++) {
        cr_assert_str_eq(json_string_value(json_array_get(got, (size_t)i)), hex[i],
                         "%s block %d differs", name, i);
        free(hex[i]);
    }
    free(hex);
    free(h);
    return (size_t)n;
}

static void expect_all(struct llmd_engine *e, json_t *ans, size_t *n) {
    json_t *bad = json_object_get(ans, "bad");
    cr_assert_eq(json_array_size(bad), 0, "subscriber: %s",
                 json_string_value(json_array_get(bad, 0)));
    n[0] = expect_tier(e, LLMD_TIER_DEVICE, json_object_get(ans, "GPU"), "device");
    n[1] = expect_tier(e, LLMD_TIER_HOST, json_object_get(ans, "CPU"), "host");
    n[2] = expect_tier(e, LLMD_TIER_NVME, json_object_get(ans, "DISK"), "nvme");
}

static void sync_and_expect(struct llmd_engine *e, struct sub *s, size_t *n) {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "sync %llu", (unsigned long long)quiesce(e));
    json_t *ans = sub_ask(s, cmd);
    cr_assert_str_eq(json_string_value(json_object_get(ans, "first")), "AllBlocksCleared");
    expect_all(e, ans, n);
    json_decref(ans);
}

enum { N_JOBS = 24 };

/* 24 requests over 4 shared 192-token prefixes, two tenants, in waves of 8
 * (4 running at once) so prefixes are evicted, spilled and restored. */
static void make_jobs(struct job *j) {
    for (int i = 0; i < N_JOBS; i++) {
        memset(&j[i], 0, sizeof j[i]);
        fill(j[i].prompt, 0, 192, 100 + (unsigned)(i % 4));
        j[i].n_prompt = 192 + 8 + (uint32_t)(i * 7 % 33);
        fill(j[i].prompt, 192, j[i].n_prompt, 500 + (unsigned)i);
        j[i].max_tokens = 12;
        j[i].tenant = 1 + (uint32_t)(i % 2);
    }
}

static void run(struct llmd_engine *e) {
    int live, steps = 0;
    while ((live = llmd_engine_step(e)) > 0)
        cr_assert_lt(++steps, 100000, "no progress");
    cr_assert_eq(live, 0, "step: %d", live);
}

Test(kv_events, subscriber_rebuilds_every_tier) {
    static struct job j[N_JOBS];
    make_jobs(j);
    struct llmd_engine *e = open_events_engine();
    struct sub s = sub_start();
    size_t n[3];
    for (int w = 0; w < N_JOBS; w += 8) {
        for (int i = w; i < w + 8; i++)
            submit(e, &j[i]);
        run(e);
        if (w == 8) { /* tenant 2 leaves every tier: its removals */
            struct llmd_purge_counts pc;
            cr_assert_eq(llmd_tenant_purge(e, 2, &pc), 0);
            cr_assert_gt(pc.device_pages + pc.host_pages + pc.nvme_pages, 0, "nothing purged");
        }
    }
    struct llmd_stats st = stats(e);
    cr_assert_gt(st.spills_host_total, 0, "the workload must spill");
    cr_assert_gt(st.spills_nvme_total, 0, "and demote to NVMe");
    cr_assert_gt(st.restores_host_total + st.restores_nvme_total, 0, "and restore");
    sync_and_expect(e, &s, n);
    cr_log_info("device %zu host %zu nvme %zu blocks; %lu events in %lu batches", n[0], n[1], n[2],
                (unsigned long)stats(e).kv_events_total,
                (unsigned long)stats(e).kv_event_batches_total);
    cr_assert_gt(n[0], 0);
    cr_assert_gt(n[1] + n[2], 0);
    cr_assert_eq(stats(e).kv_events_dropped_total, 0);

    /* a flush moves the device's cached blocks down: the sets follow */
    struct llmd_flush_counts fc;
    cr_assert_eq(llmd_engine_flush(e, &fc), 0);
    sync_and_expect(e, &s, n);
    cr_assert_gt(n[2], 0, "the NVMe tier holds what was flushed");

    /* replay from 0: every batch again, the same bytes */
    json_t *r = sub_ask(&s, "replay");
    cr_assert(json_is_true(json_object_get(r, "same")), "a replayed batch differs");
    cr_assert_eq((uint64_t)json_integer_value(json_object_get(r, "replayed")),
                 stats(e).kv_event_batches_total);
    json_decref(r);
    sub_stop(&s);
    llmd_engine_close(e);

    /* restart on the same NVMe tier: a clear first, then what it kept */
    e = open_events_engine();
    s = sub_start();
    uint64_t kept = (uint64_t)llmd_kv_blocks(e, LLMD_TIER_NVME, NULL, 0);
    cr_assert_gt(kept, 0, "the NVMe tier kept nothing across the restart");
    sync_and_expect(e, &s, n);
    cr_assert_eq(n[0] + n[1], 0);
    cr_assert_eq(n[2], kept);
    /* and the run goes on: a restored prefix is a device block again */
    submit(e, &j[0]);
    run(e);
    sync_and_expect(e, &s, n);
    cr_assert_gt(n[0], 0);
    sub_stop(&s);
    llmd_engine_close(e);
}

/* Token ids off: the stores carry none; the sets are the same. */
Test(kv_events, token_ids_can_be_kept_private) {
    static struct job j[N_JOBS];
    make_jobs(j);
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .kv_type = LLMD_KV_F32,
                                     .prefix_secret = secret_path,
                                     .kv_events_endpoint = ep_pub,
                                     .kv_events_replay_endpoint = ep_rep,
                                     .kv_events_no_token_ids = 1};
    snprintf(ep_pub, sizeof ep_pub, "ipc://%s/pub", dir);
    snprintf(ep_rep, sizeof ep_rep, "ipc://%s/rep", dir);
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    struct sub s = sub_start();
    for (int i = 0; i < 4; i++)
        submit(e, &j[i]);
    run(e);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "sync %llu", (unsigned long long)quiesce(e));
    json_t *ans = sub_ask(&s, cmd);
    size_t n[3];
    expect_all(e, ans, n);
    cr_assert_gt(n[0], 0);
    cr_assert_eq(json_integer_value(json_object_get(ans, "stores_with_tokens")), 0);
    json_decref(ans);
    sub_stop(&s);
    llmd_engine_close(e);
}

Test(kv_events, need_the_prefix_cache_and_a_real_endpoint) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 1,
                                     .n_ctx = 256,
                                     .no_prefix_cache = 1,
                                     .kv_events_endpoint = "tcp://*:0"};
    struct llmd_engine *e = NULL;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "prefix cache"), "%s", err);
    cfg.no_prefix_cache = 0;
    cfg.kv_events_endpoint = "bogus://here";
    cr_assert_lt(llmd_engine_open(&cfg, &e, err, sizeof err), 0);
    cr_assert(strstr(err, "bogus://here"), "%s", err);
    cr_assert_null(e);
}
