/* llmd serve - the OpenAI-compatible HTTP server (engine/serve/http.h) as a
 * command: flags, signals, graceful shutdown. docs/serving.md.
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread (the mask is set
 * before any thread starts) and taken by sigtimedwait() here, so no handler
 * runs inside libmicrohttpd or the engine. The first one drains: /health
 * says "draining", new requests get 503, running ones finish within
 * --drain-timeout; a second one, or the deadline, cancels the rest. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/serve/http.h"
#include "engine/model/model_dummy.h"
#include "kernels/kern.h"
#include "llmd.h"
#include "llmd_cli.h"
#include "mem.h"

struct serve_opts {
    struct llmd_engine_config eng;
    struct http_config http;
    long drain_timeout_s;
    bool quiet;
    char *nvme_path; /* owned: PATH of --nvme-tier PATH[,BYTES] */
};

static void serve_usage(FILE *f) {
    fprintf(
        f,
        "usage: llmd serve -m MODEL [options]\n"
        "\n"
        "Serves MODEL over an OpenAI-compatible HTTP API: POST /v1/completions,\n"
        "POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics.\n"
        "SIGTERM or SIGINT drains, then exits 0. See docs/serving.md.\n"
        "\n"
        "  -m, --model PATH            GGUF file, or dummy:SHAPE[:TYPE[:ARCH]] (shapes: %s)\n"
        "      --host ADDR             numeric address to bind (default 127.0.0.1)\n"
        "      --port N                TCP port (default 8080; 0: any free port, printed)\n"
        "      --served-model-name S   the model's id in the API (default: the file name\n"
        "                              without .gguf)\n"
        "      --api-keys FILE         lines 'KEY TENANT [weight=N] [max_priority=N]\n"
        "                              [retention_pages=N]'; without it, no auth, tenant 0\n"
        "      --max-body B            largest request body (K/M suffixes; default 4M)\n"
        "      --chat-template T       chatml, llama2, llama3 or plain (default: detected\n"
        "                              from the GGUF's tokenizer.chat_template)\n"
        "      --max-connections N     open connections, one thread each (default 512)\n"
        "      --idle-timeout S        close idle connections after S seconds (default 120)\n"
        "      --drain-timeout S       on SIGTERM, let requests finish for S seconds\n"
        "                              (default 30), then cancel the rest\n"
        "      --no-vllm-metrics       leave the vllm:* gauges (for Kubernetes routers)\n"
        "                              out of /metrics\n"
        "      --admin-socket PATH     a Unix socket (mode 0600) for llmctl: stats, seqs,\n"
        "                              pages, config, drain\n"
        "  -c, --ctx N                 context length in tokens (default: the model's)\n"
        "      --max-seqs N            requests running at once (default 8)\n"
        "      --max-batched-tokens N  tokens per engine step (default 256)\n"
        "      --max-chunk-tokens N    prefill tokens of one request per step (default: no "
        "cap)\n"
        "      --max-queue-wait MS     refuse (429) requests predicted to wait longer\n"
        "                              (default 0: never refuse)\n"
        "      --kv-budget B           physical KV memory (default: max-seqs full contexts)\n"
        "      --page-size B           KV page size (default: 16 tokens' bytes, rounded up\n"
        "                              to whole tokens and 4 KiB host pages)\n"
        "      --kv-type T             f16 (default), f32, q8_0, q4_0 or fp8 (quantized:\n"
        "                              docs/kv-quant.md)\n"
        "      --device D              cpu (default), cuda or cuda:N, N 0..63 (`make cuda`)\n"
        "      --host-tier B           pinned host memory for cold KV pages (default 0: off)\n"
        "      --nvme-tier PATH[,B]    NVMe tier slot file (default size 4G; needs\n"
        "                              --host-tier); cached prefixes survive a restart\n"
        "      --offload-always        keep every cold page the tiers can hold (default:\n"
        "                              only where restoring beats recomputing)\n"
        "      --no-prefix-cache       do not reuse KV pages of earlier prompts\n"
        "      --no-map-ahead          map KV pages on the step's path, not ahead of need\n"
        "      --spec M                speculative decoding: ngram (prompt lookup, verified\n"
        "                              in the batched step; the same text per seed), draft\n"
        "                              (a draft model, --spec-model) or none (default); a\n"
        "                              request's \"speculative\": false opts out\n"
        "      --spec-tokens K         the longest draft, 1..32 (default 8)\n"
        "      --spec-model PATH       the draft model of --spec draft: a GGUF (or\n"
        "                              dummy:SHAPE[:TYPE[:ARCH]]) with the same vocabulary; CPU\n"
        "                              only\n"
        "      --prefix-secret FILE    the prefix-cache HMAC key (default: LLMD_PFX_SECRET,\n"
        "                              else with --nvme-tier PATH.key beside the tier,\n"
        "                              made on first use; else random per process)\n"
        "      --kv-events ENDPOINT    publish KV-cache events for KV-aware routers (vLLM's\n"
        "                              ZeroMQ format, docs/kv-events.md), e.g. tcp://*:5557\n"
        "                              (bound; tcp://HOST:PORT is connected to)\n"
        "      --kv-events-replay EP   answer replay requests on this ROUTER endpoint\n"
        "      --kv-events-topic T     the topic frame of every batch (default: empty)\n"
        "      --kv-events-no-token-ids  send empty token_ids (routers see hashes only)\n"
        "      --tokenizer-pre P       split text as pre-tokenizer P (gpt-2, llama-bpe,\n"
        "                              qwen2) instead of the file's tokenizer.ggml.pre\n"
        "  -t, --threads N             CPU threads, 1..256 (default: all online CPUs)\n"
        "  -q, --quiet                 no start-up and shutdown lines on stderr\n",
        model_dummy_shapes());
}

enum {
    O_HOST = 256,
    O_PORT,
    O_NAME,
    O_KEYS,
    O_BODY,
    O_TMPL,
    O_CONN,
    O_IDLE,
    O_DRAIN,
    O_SEQS,
    O_BATCH,
    O_CHUNK,
    O_QWAIT,
    O_BUDGET,
    O_PAGE,
    O_KVT,
    O_NOPFX,
    O_NOAHEAD,
    O_SECRET,
    O_NOVLLM,
    O_ADMIN,
    O_HOSTTIER,
    O_NVME,
    O_ALWAYS,
    O_DEV,
    O_SPEC,
    O_SPECK,
    O_SPECM,
    O_KVEV,
    O_KVEVREP,
    O_KVEVTOPIC,
    O_KVEVNOTOK,
    O_PRE,
};

/* What option c takes, for its bad-value message. */
static const char *serve_want(int c) {
    switch (c) {
    case O_PORT:
        return "an integer 0..65535";
    case O_NAME:
        return "a name that is not empty";
    case O_BODY:
        return "a size of 64 bytes or more (K/M/G suffixes)";
    case O_TMPL:
        return "chatml, llama2, llama3 or plain";
    case O_CONN:
        return "an integer 1..65536";
    case O_IDLE:
        return "seconds, 1..86400";
    case O_DRAIN:
        return "seconds, 0..86400";
    case 'c':
        return "an integer 1..16777216";
    case O_SEQS:
        return "an integer 1..4096";
    case O_BATCH:
    case O_CHUNK:
        return "an integer 1..1048576";
    case O_QWAIT:
        return "milliseconds, 0..86400000";
    case O_KVT:
        return "f16, f32, q8_0, q4_0 or fp8";
    case O_DEV:
        return "cpu, cuda or cuda:N (N 0..63)";
    case O_NVME:
        return "PATH or PATH,SIZE (SIZE > 0 bytes, K/M/G suffixes)";
    case O_PRE:
        return CLI_PRE_WANT;
    case O_KVEV:
    case O_KVEVREP:
        return "a ZeroMQ endpoint, e.g. tcp://*:5557 or ipc:///run/llmd/kv";
    case 't':
        return "an integer 1..256";
    case O_SPEC:
        return CLI_SPEC_WANT;
    case O_SPECK:
        return CLI_SPEC_TOKENS;
    default:
        return "a size in bytes (K/M/G suffixes)";
    }
}

static int serve_parse(int argc, char **argv, struct serve_opts *o) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},
        {"served-model-name", required_argument, 0, O_NAME},
        {"api-keys", required_argument, 0, O_KEYS},
        {"max-body", required_argument, 0, O_BODY},
        {"chat-template", required_argument, 0, O_TMPL},
        {"max-connections", required_argument, 0, O_CONN},
        {"idle-timeout", required_argument, 0, O_IDLE},
        {"drain-timeout", required_argument, 0, O_DRAIN},
        {"ctx", required_argument, 0, 'c'},
        {"max-seqs", required_argument, 0, O_SEQS},
        {"max-batched-tokens", required_argument, 0, O_BATCH},
        {"max-chunk-tokens", required_argument, 0, O_CHUNK},
        {"max-queue-wait", required_argument, 0, O_QWAIT},
        {"kv-budget", required_argument, 0, O_BUDGET},
        {"page-size", required_argument, 0, O_PAGE},
        {"kv-type", required_argument, 0, O_KVT},
        {"device", required_argument, 0, O_DEV},
        {"no-prefix-cache", no_argument, 0, O_NOPFX},
        {"no-map-ahead", no_argument, 0, O_NOAHEAD},
        {"spec", required_argument, 0, O_SPEC},
        {"spec-tokens", required_argument, 0, O_SPECK},
        {"spec-model", required_argument, 0, O_SPECM},
        {"prefix-secret", required_argument, 0, O_SECRET},
        {"no-vllm-metrics", no_argument, 0, O_NOVLLM},
        {"admin-socket", required_argument, 0, O_ADMIN},
        {"host-tier", required_argument, 0, O_HOSTTIER},
        {"nvme-tier", required_argument, 0, O_NVME},
        {"offload-always", no_argument, 0, O_ALWAYS},
        {"kv-events", required_argument, 0, O_KVEV},
        {"kv-events-replay", required_argument, 0, O_KVEVREP},
        {"kv-events-topic", required_argument, 0, O_KVEVTOPIC},
        {"kv-events-no-token-ids", no_argument, 0, O_KVEVNOTOK},
        {"tokenizer-pre", required_argument, 0, O_PRE},
        {"threads", required_argument, 0, 't'},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (struct serve_opts){.http = {.port = 8080}, .drain_timeout_s = 30};
    o->eng.kv_type = LLMD_KV_F16;
    long l;
    uint64_t u;
    int c, li = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:c:t:qh", opts, &li)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm':
            o->eng.model = o->http.model_path = optarg;
            break;
        case O_HOST:
            o->http.host = optarg;
            break;
        case O_PORT:
            ok = cli_parse_long(optarg, 0, 65535, &l);
            o->http.port = (uint16_t)l;
            break;
        case O_NAME:
            ok = optarg[0] != '\0';
            o->http.served_model_name = optarg;
            break;
        case O_KEYS:
            o->http.api_keys_path = optarg;
            break;
        case O_BODY:
            ok = cli_parse_size(optarg, &o->http.max_body_bytes) && o->http.max_body_bytes >= 64;
            break;
        case O_TMPL: /* a usage error, before anything loads */
            ok = http_chat_template_known(optarg);
            o->http.chat_template = optarg;
            break;
        case O_CONN:
            ok = cli_parse_long(optarg, 1, 65536, &l);
            o->http.max_connections = (uint32_t)l;
            break;
        case O_IDLE:
            ok = cli_parse_long(optarg, 1, 86400, &l);
            o->http.idle_timeout_s = (uint32_t)l;
            break;
        case O_DRAIN:
            ok = cli_parse_long(optarg, 0, 86400, &o->drain_timeout_s);
            break;
        case 'c':
            ok = cli_parse_long(optarg, 1, 1 << 24, &l);
            o->eng.n_ctx = (uint32_t)l;
            break;
        case O_SEQS:
            ok = cli_parse_long(optarg, 1, 4096, &l);
            o->eng.max_seqs = (uint32_t)l;
            break;
        case O_BATCH:
            ok = cli_parse_long(optarg, 1, 1 << 20, &l);
            o->eng.max_batched_tokens = (uint32_t)l;
            break;
        case O_CHUNK:
            ok = cli_parse_long(optarg, 1, 1 << 20, &l);
            o->eng.max_chunk_tokens = (uint32_t)l;
            break;
        case O_QWAIT:
            ok = cli_parse_long(optarg, 0, 86400000, &l);
            o->eng.max_queue_wait_ns = (uint64_t)l * 1000000u;
            break;
        case O_BUDGET:
            ok = cli_parse_size(optarg, &u);
            o->eng.kv_budget_bytes = u;
            break;
        case O_PAGE:
            ok = cli_parse_size(optarg, &u);
            o->eng.page_bytes = u;
            break;
        case O_KVT:
            ok = llmd_kv_type_parse(optarg, &o->eng.kv_type) == 0;
            break;
        case O_DEV: {
            bool cuda = false;
            ok = cli_parse_device(optarg, &cuda, &o->eng.device_index);
            o->eng.device = cuda ? LLMD_DEVICE_CUDA : LLMD_DEVICE_CPU;
            break;
        }
        case O_NOPFX:
            o->eng.no_prefix_cache = 1;
            break;
        case O_NOAHEAD:
            o->eng.no_map_ahead = 1;
            break;
        case O_SECRET:
            o->eng.prefix_secret = optarg;
            break;
        case O_NOVLLM:
            o->http.no_vllm_metrics = true;
            break;
        case O_ADMIN:
            o->http.admin_socket = optarg;
            break;
        case O_HOSTTIER:
            ok = cli_parse_size(optarg, &o->eng.host_tier_bytes);
            break;
        case O_NVME: {
            mem_free(o->nvme_path);
            o->nvme_path = mem_strdup(MEM_CLI, optarg);
            char *comma = o->nvme_path ? strrchr(o->nvme_path, ',') : NULL;
            if (comma) {
                *comma = '\0';
                ok = cli_parse_size(comma + 1, &o->eng.nvme_tier_bytes) &&
                     o->eng.nvme_tier_bytes > 0;
            }
            ok = ok && o->nvme_path && o->nvme_path[0] != '\0';
            o->eng.nvme_tier_path = o->nvme_path;
            break;
        }
        case O_ALWAYS:
            o->eng.offload_always = 1;
            break;
        case O_KVEV:
            o->eng.kv_events_endpoint = optarg;
            ok = optarg[0] != '\0';
            break;
        case O_KVEVREP:
            o->eng.kv_events_replay_endpoint = optarg;
            ok = optarg[0] != '\0';
            break;
        case O_KVEVTOPIC:
            o->eng.kv_events_topic = optarg;
            break;
        case O_KVEVNOTOK:
            o->eng.kv_events_no_token_ids = 1;
            break;
        case O_PRE:
            o->eng.tokenizer_pre = optarg;
            o->http.tokenizer_pre = optarg;
            ok = cli_parse_pre(optarg);
            break;
        case O_SPEC: {
            int m = 0;
            ok = cli_parse_spec(optarg, &m);
            o->eng.spec = (enum llmd_spec)m;
            break;
        }
        case O_SPECK:
            ok = cli_parse_long(optarg, 1, LLMD_SPEC_TOKENS_MAX, &l);
            o->eng.spec_tokens = (uint32_t)l;
            break;
        case O_SPECM:
            o->eng.spec_model_path = optarg;
            break;
        case 't':
            ok = cli_parse_long(optarg, 1, 256, &l);
            o->eng.n_threads = (int)l;
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'h':
            serve_usage(stdout);
            return 1;
        default:
            serve_usage(stderr);
            return -1;
        }
        if (!ok) {
            cli_bad_value("llmd serve", opts, c, li, optarg, serve_want(c));
            return -1;
        }
        li = -1;
    }
    if (optind != argc) {
        fprintf(stderr, "llmd serve: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->eng.model) {
        fprintf(stderr, "llmd serve: -m MODEL is required (see --help)\n");
        return -1;
    }
    if (o->nvme_path && !o->eng.host_tier_bytes) {
        fprintf(stderr, "llmd serve: --nvme-tier needs --host-tier too\n");
        return -1;
    }
    if (!o->eng.kv_events_endpoint && (o->eng.kv_events_replay_endpoint || o->eng.kv_events_topic ||
                                       o->eng.kv_events_no_token_ids)) {
        fprintf(stderr, "llmd serve: --kv-events-replay, --kv-events-topic and "
                        "--kv-events-no-token-ids go with --kv-events ENDPOINT\n");
        return -1;
    }
    if (o->eng.kv_events_endpoint && o->eng.no_prefix_cache) {
        fprintf(stderr, "llmd serve: --kv-events describes the prefix cache: it cannot go with "
                        "--no-prefix-cache\n");
        return -1;
    }
    const char *why = cli_spec_check(o->eng.spec, o->eng.spec_tokens, o->eng.spec_model_path);
    if (why) {
        fprintf(stderr, "llmd serve: %s\n", why);
        return -1;
    }
    if (!cli_check_batching("llmd serve", o->eng.max_seqs, o->eng.max_batched_tokens,
                            (int)o->eng.spec))
        return -1;
    return 0;
}

/* The value a queued SIGTERM carries when it is `llmctl drain --exit`'s. */
#define SERVE_ADMIN_EXIT 0x6c6d6478 /* "lmdx" */

/* `llmctl drain --exit`, from the admin thread: the signal path drains. The
 * SIGTERM is queued with a value of ours, so the log can tell it from one
 * sent by someone else. */
static void serve_admin_shutdown(void *ctx) {
    (void)ctx;
    sigqueue(getpid(), SIGTERM, (union sigval){.sival_int = SERVE_ADMIN_EXIT});
}

/* The engine's configuration as JSON, for `llmctl config`: what it runs
 * with (llmd_engine_info), every default resolved; null where there is no
 * limit. Caller frees with free(); NULL on no memory. */
static char *serve_config_json(const struct serve_opts *o, const struct llmd_engine_info *in) {
    json_t *j = json_pack(
        "{s:i, s:I, s:I, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:s, s:I, s:o, s:b, s:b, s:s, s:I, "
        "s:s?, "
        "s:I, s:b, s:I, s:s, s:i, s:s, s:s, s:I, s:s}",
        "n_threads", in->n_threads, "n_ctx", (json_int_t)in->n_ctx, "max_seq_tokens",
        (json_int_t)in->max_seq_tokens, "max_seqs", (json_int_t)in->max_seqs, "max_batched_tokens",
        (json_int_t)in->max_batched_tokens, "max_chunk_tokens",
        in->max_chunk_tokens ? json_integer(in->max_chunk_tokens) : json_null(), "kv_budget_bytes",
        (json_int_t)in->kv_budget_bytes, "kv_pages", (json_int_t)in->kv_pages, "page_bytes",
        (json_int_t)in->page_bytes, "tokens_per_page", (json_int_t)in->tokens_per_page, "kv_type",
        llmd_kv_type_name(in->kv_type), "kv_token_bytes", (json_int_t)in->kv_token_bytes,
        "max_queue_wait_ms",
        in->max_queue_wait_ns ? json_integer((json_int_t)(in->max_queue_wait_ns / 1000000u))
                              : json_null(),
        "prefix_cache", in->prefix_cache != 0, "map_ahead", in->map_ahead != 0, "prefix_key",
        in->prefix_key, "host_tier_bytes", (json_int_t)in->host_tier_bytes, "nvme_tier_path",
        o->eng.nvme_tier_path, "nvme_tier_bytes", (json_int_t)in->nvme_tier_bytes, "offload_always",
        in->offload_always != 0, "drain_timeout_s", (json_int_t)o->drain_timeout_s, "device",
        in->device == LLMD_DEVICE_CUDA ? "cuda" : "cpu", "device_index", in->device_index, "isa",
        kern_isa_name(kern_isa()), "isa_max", kern_isa_name(kern_isa_max()), "l2_bytes",
        (json_int_t)kern_cache_l2(), "l2_source", kern_cache_l2_source());
    const char *spec = in->spec == LLMD_SPEC_NGRAM   ? "ngram"
                       : in->spec == LLMD_SPEC_DRAFT ? "draft"
                                                     : "none";
    if (j && json_object_set_new(j, "spec", json_string(spec)) == 0) {
        json_object_set_new(j, "spec_tokens", json_integer((json_int_t)in->spec_tokens));
        json_object_set_new(j, "spec_model",
                            in->spec_model ? json_string(in->spec_model) : json_null());
        json_object_set_new(j, "weight_types", json_string(in->weight_types));
        json_object_set_new(j, "kv_draft_token_bytes",
                            json_integer((json_int_t)in->kv_draft_token_bytes));
    }
    if (j) {
        const struct llmd_engine_config *ec = &o->eng;
        json_object_set_new(j, "kv_events",
                            ec->kv_events_endpoint ? json_string(ec->kv_events_endpoint)
                                                   : json_null());
        json_object_set_new(j, "kv_events_replay",
                            ec->kv_events_replay_endpoint
                                ? json_string(ec->kv_events_replay_endpoint)
                                : json_null());
        json_object_set_new(j, "kv_events_topic",
                            json_string(ec->kv_events_topic ? ec->kv_events_topic : ""));
        json_object_set_new(j, "kv_events_token_ids", json_boolean(!ec->kv_events_no_token_ids));
    }
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

static double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Drain: wait for running requests up to the deadline or a second signal. */
static void serve_drain(struct http_server *s, const sigset_t *set, const struct serve_opts *o) {
    http_server_drain(s);
    if (!o->quiet)
        fprintf(stderr,
                "llmd serve: draining %llu requests (up to %ld s; signal again to stop "
                "now)\n",
                (unsigned long long)http_server_live(s), o->drain_timeout_s);
    double deadline = serve_now() + (double)o->drain_timeout_s;
    while (http_server_live(s) > 0 && serve_now() < deadline) {
        struct timespec ts = {.tv_nsec = 100 * 1000 * 1000};
        if (sigtimedwait(set, NULL, &ts) > 0)
            break;
    }
    uint64_t left = http_server_live(s);
    if (!o->quiet && left)
        fprintf(stderr, "llmd serve: cancelling %llu requests\n", (unsigned long long)left);
}

static int serve_main(struct serve_opts *o);

int cli_serve(int argc, char **argv) {
    struct serve_opts o;
    int rc = serve_parse(argc, argv, &o);
    if (rc == 0)
        rc = serve_main(&o);
    else
        rc = rc > 0 ? CLI_OK : CLI_USAGE;
    mem_free(o.nvme_path);
    return rc;
}

static int serve_main(struct serve_opts *o) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread: they inherit it */
    signal(SIGPIPE, SIG_IGN);

    char err[512] = "";
    struct llmd_engine *e;
    struct http_server *s;
    int rc = llmd_engine_open(&o->eng, &e, err, sizeof(err));
    if (rc < 0) {
        cli_engine_err("llmd serve", err, rc);
        return CLI_ERR;
    }
    struct llmd_engine_info info;
    llmd_engine_info_get(e, &info); /* before the engine thread owns e */
    if (!o->quiet) {                /* generate's model line, less the load time */
        char packed[64], isa[96];
        cli_packed(packed, sizeof packed, info.packed_bytes, info.copied_bytes);
        kern_isa_describe(isa, sizeof(isa));
        fprintf(stderr,
                "llmd serve: model %s: %u layers, n_embd %u, heads %u/%u, vocab %u, %.1f MB of "
                "weights%s; matrices %s; threads %d, isa %s\n",
                info.model_name, info.n_layer, info.n_embd, info.n_head, info.n_head_kv,
                info.n_vocab, (double)info.weight_bytes / 1e6, packed, info.weight_types,
                info.n_threads, isa);
    }
    cli_ctx_note("llmd serve", info.n_ctx, info.n_ctx_train);
    cli_kv_caps_note("llmd serve", o->eng.page_bytes, info.page_bytes, info.tokens_per_page,
                     o->eng.kv_budget_bytes, info.kv_pages, info.n_ctx, info.max_seqs);
    char *config = serve_config_json(o, &info); /* NULL: `llmctl config` shows {} */
    o->http.admin_config = config;
    o->http.admin_shutdown = serve_admin_shutdown;
    if ((rc = http_server_start(&o->http, e, &s, err, sizeof(err))) < 0) {
        /* its messages start with "llmd serve: " already */
        fprintf(stderr, "%s\n", err[0] ? err : strerror(-rc));
        free(config);
        return CLI_ERR;
    }
    /* one line on stdout, for scripts and tests that start it on port 0; an
     * IPv6 address in brackets, as a URL needs it */
    const char *host = o->http.host ? o->http.host : "127.0.0.1";
    bool v6 = strchr(host, ':') != NULL;
    printf("llmd serve: listening on http://%s%s%s:%u\n", v6 ? "[" : "", host, v6 ? "]" : "",
           http_server_port(s));
    fflush(stdout);
    siginfo_t si;
    int sig;
    while ((sig = sigwaitinfo(&set, &si)) < 0)
        ;
    bool by_admin = sig == SIGTERM && si.si_code == SI_QUEUE && si.si_pid == getpid() &&
                    si.si_value.sival_int == SERVE_ADMIN_EXIT;
    if (!o->quiet)
        fprintf(stderr, "llmd serve: %s\n",
                by_admin        ? "drain --exit from the admin socket"
                : sig == SIGINT ? "SIGINT received"
                                : "SIGTERM received");
    serve_drain(s, &set, o);
    http_server_stop(s);
    free(config); /* jansson's */
    if (!o->quiet)
        fprintf(stderr, "llmd serve: stopped\n");
    return CLI_OK;
}
