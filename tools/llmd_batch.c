/* llmd batch - many prompts through the serving engine at once (continuous
 * batching, prefix cache, offload tiers), offline: JSON lines in, JSON lines
 * out, a run summary on stderr. The tool for RAG-style offline jobs and for
 * checking what the KV tiers do across runs. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmd.h"
#include "llmd_cli.h"
#include "mem.h"

#define BATCH_MAX_STOP 8

struct batch_req {
    json_t *in; /* the input line's object (owned) */
    char *text; /* generated text, grown as tokens arrive */
    size_t n_text, cap_text;
    const char *stop[BATCH_MAX_STOP];
    struct llmd_usage usage;
    enum llmd_finish finish;
    uint64_t id;
    bool done, failed;
};

struct batch_opts {
    const char *model, *input, *secret;
    long threads, ctx, max_seqs, max_batched, max_tokens;
    uint64_t kv_budget, host_tier, nvme_bytes;
    char *nvme_path; /* owned: PATH of --nvme-tier PATH[,BYTES] */
    bool offload_always, quiet;
    enum llmd_kv_type kv_type;
    bool cuda;
    int cuda_index;
};

static void batch_usage(FILE *f) {
    fprintf(
        f,
        "usage: llmd batch -m MODEL [-i FILE] [options]\n"
        "\n"
        "Reads one JSON object a line (FILE, or stdin): {\"prompt\": TEXT} plus optional\n"
        "\"id\", \"max_tokens\", \"temperature\", \"top_p\", \"top_k\", \"seed\", \"stop\"\n"
        "(string or array), \"tenant\" (integer) and \"priority\"; runs them all together\n"
        "and prints one JSON line each, in input order: {\"id\", \"text\", \"finish_reason\",\n"
        "\"prompt_tokens\", \"completion_tokens\", \"cached_tokens\", \"restored_tokens\"}.\n"
        "A summary (tokens, speed, prefix hits, spills/restores per tier) goes to stderr.\n"
        "\n"
        "  -m, --model PATH          GGUF file, or dummy:SHAPE[:TYPE]\n"
        "  -i, --input FILE          JSON lines ('-' or absent: stdin)\n"
        "  -n, --max-tokens N        default per request (default 128)\n"
        "  -t, --threads N           CPU threads (default: all online CPUs)\n"
        "  -c, --ctx N               tokens per sequence (default: the model's)\n"
        "      --max-seqs N          sequences running at once (default 8)\n"
        "      --max-batched-tokens N  tokens per step (default 256)\n"
        "      --kv-budget BYTES     device KV pool (K/M/G; default: max-seqs full contexts)\n"
        "      --kv-type T           f16 (default) or f32\n"
        "      --device D            cpu (default), cuda or cuda:N, N 0..63 (`make cuda` build)\n"
        "      --host-tier BYTES     pinned host memory for cold KV pages (0 = off)\n"
        "      --nvme-tier PATH[,BYTES]  NVMe tier slot file (default size 4G); cached\n"
        "                            prefixes persist there across runs\n"
        "      --offload-always      keep every cold page the tiers hold (default: only\n"
        "                            where restoring beats recomputing, measured)\n"
        "      --prefix-secret FILE  prefix-cache key (64 hex digits; default:\n"
        "                            LLMD_PFX_SECRET, else random per run, and then the\n"
        "                            NVMe tier's prefixes do not carry over to the next run)\n"
        "  -q, --quiet               no summary\n");
}

static int batch_parse(int argc, char **argv, struct batch_opts *o) {
    enum { O_SEQS = 256, O_BATCHED, O_BUDGET, O_HOST, O_NVME, O_ALWAYS, O_SECRET, O_KVT, O_DEV };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"input", required_argument, 0, 'i'},
        {"max-tokens", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"ctx", required_argument, 0, 'c'},
        {"max-seqs", required_argument, 0, O_SEQS},
        {"max-batched-tokens", required_argument, 0, O_BATCHED},
        {"kv-budget", required_argument, 0, O_BUDGET},
        {"host-tier", required_argument, 0, O_HOST},
        {"nvme-tier", required_argument, 0, O_NVME},
        {"offload-always", no_argument, 0, O_ALWAYS},
        {"prefix-secret", required_argument, 0, O_SECRET},
        {"kv-type", required_argument, 0, O_KVT},
        {"device", required_argument, 0, O_DEV},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (struct batch_opts){.max_tokens = 128};
    int c, li = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:i:n:t:c:qh", opts, &li)) != -1) {
        bool ok = true;
        char *comma;
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'i':
            o->input = optarg;
            break;
        case 'n':
            ok = cli_parse_long(optarg, 1, 1 << 24, &o->max_tokens);
            break;
        case 't':
            ok = cli_parse_long(optarg, 1, 256, &o->threads);
            break;
        case 'c':
            ok = cli_parse_long(optarg, 1, 1 << 24, &o->ctx);
            break;
        case O_SEQS:
            ok = cli_parse_long(optarg, 1, 4096, &o->max_seqs);
            break;
        case O_BATCHED:
            ok = cli_parse_long(optarg, 1, 1 << 20, &o->max_batched);
            break;
        case O_BUDGET:
            ok = cli_parse_size(optarg, &o->kv_budget);
            break;
        case O_HOST:
            ok = cli_parse_size(optarg, &o->host_tier);
            break;
        case O_NVME:
            mem_free(o->nvme_path);
            o->nvme_path = mem_alloc(MEM_CLI, strlen(optarg) + 1);
            if (!o->nvme_path)
                return CLI_ERR;
            strcpy(o->nvme_path, optarg);
            if ((comma = strrchr(o->nvme_path, ',')) != NULL) {
                *comma = '\0';
                ok = cli_parse_size(comma + 1, &o->nvme_bytes) && o->nvme_bytes > 0;
            }
            ok = ok && o->nvme_path[0] != '\0';
            break;
        case O_ALWAYS:
            o->offload_always = true;
            break;
        case O_SECRET:
            o->secret = optarg;
            break;
        case O_KVT:
            ok = strcmp(optarg, "f16") == 0 || strcmp(optarg, "f32") == 0;
            o->kv_type = strcmp(optarg, "f32") == 0 ? LLMD_KV_F32 : LLMD_KV_F16;
            break;
        case O_DEV:
            ok = cli_parse_device(optarg, &o->cuda, &o->cuda_index);
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'h':
            batch_usage(stdout);
            return -1;
        default:
            batch_usage(stderr);
            return CLI_USAGE;
        }
        if (!ok) {
            fprintf(stderr, "llmd batch: bad value for %s: '%s'\n", cli_opt_name(opts, c, li),
                    optarg);
            return CLI_USAGE;
        }
        li = -1;
    }
    if (optind < argc) {
        fprintf(stderr, "llmd batch: unexpected argument '%s'\n", argv[optind]);
        return CLI_USAGE;
    }
    if (!o->model) {
        fprintf(stderr, "llmd batch: no model (-m PATH)\n");
        return CLI_USAGE;
    }
    if (o->nvme_path && !o->host_tier) {
        fprintf(stderr, "llmd batch: --nvme-tier needs --host-tier too\n");
        return CLI_USAGE;
    }
    return CLI_OK;
}

static volatile sig_atomic_t batch_interrupted;

static void batch_on_sigint(int sig) {
    (void)sig;
    batch_interrupted = 1;
}

static void batch_on_token(void *user, uint64_t id, int32_t token, const char *text,
                           size_t text_len, enum llmd_finish finish) {
    (void)id;
    (void)token;
    struct batch_req *r = user;
    if (text_len && !r->failed) {
        if (r->n_text + text_len + 1 > r->cap_text) {
            size_t cap = (r->n_text + text_len + 1) * 2;
            char *t = r->text ? mem_realloc(r->text, cap) : mem_alloc(MEM_CLI, cap);
            if (!t) {
                r->failed = true;
                return;
            }
            r->text = t;
            r->cap_text = cap;
        }
        memcpy(r->text + r->n_text, text, text_len);
        r->n_text += text_len;
        r->text[r->n_text] = '\0';
    }
    if (finish != LLMD_FINISH_NONE) {
        r->finish = finish;
        r->done = true;
    }
}

static const char *batch_finish_name(enum llmd_finish f) {
    switch (f) {
    case LLMD_FINISH_LENGTH:
    case LLMD_FINISH_CONTEXT:
        return "length";
    case LLMD_FINISH_STOP:
    case LLMD_FINISH_EOS:
        return "stop";
    case LLMD_FINISH_CANCELLED:
        return "cancelled";
    default:
        return "error";
    }
}

/* Read the JSON lines; *out gets the requests (caller frees). */
static int batch_read(const struct batch_opts *o, struct batch_req **out, size_t *n_out) {
    char *buf = NULL;
    size_t len = 0;
    int rc = cli_read_file(o->input ? o->input : "-", &buf, &len);
    if (rc < 0) {
        fprintf(stderr, "llmd batch: cannot read %s: %s\n", o->input ? o->input : "stdin",
                strerror(-rc));
        return CLI_ERR;
    }
    size_t n = 0, cap = 0, line = 0;
    struct batch_req *rq = NULL;
    int status = CLI_OK;
    for (char *p = buf, *nl; p && *p && status == CLI_OK; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        line++;
        if (strspn(p, " \t\r") >= l)
            continue; /* blank line */
        json_error_t jerr;
        json_t *j = json_loadb(p, l, 0, &jerr);
        if (!j || !json_is_object(j) || !json_is_string(json_object_get(j, "prompt"))) {
            fprintf(stderr, "llmd batch: line %zu: %s\n", line,
                    j ? "expected an object with a string \"prompt\"" : jerr.text);
            json_decref(j);
            status = CLI_ERR;
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            struct batch_req *t =
                rq ? mem_realloc(rq, cap * sizeof *rq) : mem_alloc(MEM_CLI, cap * sizeof *rq);
            if (!t) {
                json_decref(j);
                status = CLI_ERR;
                break;
            }
            rq = t;
        }
        rq[n++] = (struct batch_req){.in = j};
    }
    mem_free(buf);
    *out = rq;
    *n_out = n;
    return status;
}

static int batch_submit(struct llmd_engine *e, const struct batch_opts *o, struct batch_req *r,
                        size_t idx) {
    json_t *in = r->in, *v;
    const char *prompt = json_string_value(json_object_get(in, "prompt"));
    struct llmd_request q = {
        .prompt = prompt,
        .prompt_len = json_string_length(json_object_get(in, "prompt")),
        .max_tokens = (uint32_t)o->max_tokens,
        .temperature = 0.0f,
        .on_token = batch_on_token,
        .user = r,
        .usage = &r->usage,
    };
    if ((v = json_object_get(in, "max_tokens")) && json_is_integer(v) && json_integer_value(v) > 0)
        q.max_tokens = (uint32_t)json_integer_value(v);
    if ((v = json_object_get(in, "temperature")) && json_is_number(v))
        q.temperature = (float)json_number_value(v);
    if ((v = json_object_get(in, "top_p")) && json_is_number(v))
        q.top_p = (float)json_number_value(v);
    if ((v = json_object_get(in, "top_k")) && json_is_integer(v))
        q.top_k = (int)json_integer_value(v);
    if ((v = json_object_get(in, "seed")) && json_is_integer(v))
        q.seed = (uint64_t)json_integer_value(v);
    if ((v = json_object_get(in, "tenant"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > UINT32_MAX) {
            fprintf(stderr, "llmd batch: request %zu: \"tenant\" must be an integer id\n", idx + 1);
            r->failed = r->done = true;
            r->finish = LLMD_FINISH_ERROR;
            return -EINVAL;
        }
        q.tenant = (uint32_t)json_integer_value(v);
    }
    if ((v = json_object_get(in, "priority")) && json_is_integer(v))
        q.priority = (int32_t)json_integer_value(v);
    if ((v = json_object_get(in, "stop"))) {
        if (json_is_string(v)) {
            r->stop[q.n_stop++] = json_string_value(v);
        } else if (json_is_array(v)) {
            size_t i;
            json_t *s;
            json_array_foreach(v, i, s) if (json_is_string(s) && q.n_stop < BATCH_MAX_STOP)
                r->stop[q.n_stop++] = json_string_value(s);
        }
        q.stop = r->stop;
    }
    uint32_t retry = 0;
    int rc;
    /* admission control may refuse while the queue is long: run steps and retry */
    while ((rc = llmd_submit(e, &q, &r->id, &retry)) == -EAGAIN)
        if (llmd_engine_step(e) < 0)
            break;
    if (rc < 0) {
        fprintf(stderr, "llmd batch: request %zu refused: %s\n", idx + 1,
                rc == -E2BIG ? "the prompt does not fit the context (see --ctx, --kv-budget)"
                             : strerror(-rc));
        r->failed = true;
        r->done = true;
        r->finish = LLMD_FINISH_ERROR;
    }
    return rc;
}

static void batch_print(const struct batch_req *r, size_t idx) {
    json_t *id = json_object_get(r->in, "id");
    json_t *o = json_object();
    json_object_set_new(o, "id", id ? json_incref(id) : json_integer((json_int_t)idx));
    json_object_set_new(o, "text", json_stringn(r->text ? r->text : "", r->n_text));
    json_object_set_new(o, "finish_reason", json_string(batch_finish_name(r->finish)));
    json_object_set_new(o, "prompt_tokens", json_integer(r->usage.prompt_tokens));
    json_object_set_new(o, "completion_tokens", json_integer(r->usage.completion_tokens));
    json_object_set_new(o, "cached_tokens", json_integer(r->usage.cached_tokens));
    json_object_set_new(o, "restored_tokens", json_integer(r->usage.restored_tokens));
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s) {
        puts(s);
        free(s);
    }
    json_decref(o);
}

static void batch_summary(struct llmd_engine *e, size_t n, double secs) {
    struct llmd_stats s;
    llmd_stats_get(e, &s);
    fprintf(stderr,
            "llmd batch: %zu requests, %" PRIu64 " prompt + %" PRIu64
            " generated tokens in %.2f s (%.1f tok/s generated)\n"
            "  prefill %" PRIu64 " tokens, prefix hits %" PRIu64 " tokens (%" PRIu64
            " restored from tiers), %" PRIu64 " preemptions\n",
            n, s.prompt_tokens_total, s.generated_tokens_total, secs,
            secs > 0 ? (double)s.generated_tokens_total / secs : 0.0, s.prefill_tokens_total,
            s.prefix_hit_tokens_total, s.restored_tokens_total, s.preemptions_total);
    if (s.host_tier_bw_bytes_per_s > 0)
        fprintf(stderr,
                "  host tier: %" PRIu64 " spills (%.1f MiB), %" PRIu64
                " restores (%.1f MiB), %" PRIu64 " pages held\n"
                "  nvme tier: %" PRIu64 " spills (%.1f MiB), %" PRIu64
                " restores (%.1f MiB), %" PRIu64 " pages held\n"
                "  drops %" PRIu64 ", write failures %" PRIu64 ", checksum failures %" PRIu64 "\n",
                s.spills_host_total, (double)s.spill_bytes_host_total / (1 << 20),
                s.restores_host_total, (double)s.restore_bytes_host_total / (1 << 20),
                s.host_tier_pages, s.spills_nvme_total,
                (double)s.spill_bytes_nvme_total / (1 << 20), s.restores_nvme_total,
                (double)s.restore_bytes_nvme_total / (1 << 20), s.nvme_tier_pages,
                s.offload_drops_total, s.offload_write_failures_total,
                s.offload_checksum_failures_total);
    if (s.nvme_read_bw_bytes_per_s > 0 && s.kv_pages_cached)
        fprintf(stderr, "  at exit: %" PRIu64 " cached device pages go down to the NVMe tier\n",
                s.kv_pages_cached);
}

int cli_batch(int argc, char **argv) {
    struct batch_opts o;
    int rc = batch_parse(argc, argv, &o);
    if (rc != CLI_OK) {
        mem_free(o.nvme_path);
        return rc < 0 ? CLI_OK : rc;
    }
    struct batch_req *rq = NULL;
    size_t n = 0;
    struct llmd_engine *e = NULL;
    int status = batch_read(&o, &rq, &n);
    if (status != CLI_OK)
        goto out;
    struct llmd_engine_config cfg = {
        .model = o.model,
        .n_threads = (int)o.threads,
        .n_ctx = (uint32_t)o.ctx,
        .max_seqs = (uint32_t)o.max_seqs,
        .max_batched_tokens = (uint32_t)o.max_batched,
        .kv_budget_bytes = o.kv_budget,
        .host_tier_bytes = o.host_tier,
        .nvme_tier_path = o.nvme_path,
        .nvme_tier_bytes = o.nvme_bytes,
        .offload_always = o.offload_always,
        .prefix_secret = o.secret,
        .kv_type = o.kv_type,
        .device = o.cuda ? LLMD_DEVICE_CUDA : LLMD_DEVICE_CPU,
        .device_index = o.cuda_index,
    };
    char err[512] = "";
    if ((rc = llmd_engine_open(&cfg, &e, err, sizeof err)) < 0) {
        fprintf(stderr, "%s%s\n",
                strncmp(err, "llmd", 4) == 0 ? "" : "llmd batch: ", err[0] ? err : strerror(-rc));
        status = CLI_ERR;
        goto out;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n; i++)
        if (batch_submit(e, &o, &rq[i], i) < 0)
            status = CLI_ERR;
    /* Ctrl-C: cancel what is left, print what finished, and close the
     * engine properly (an NVMe tier gets the cached pages) */
    struct sigaction sa = {.sa_handler = batch_on_sigint}, old_sa;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    while (!batch_interrupted && (rc = llmd_engine_step(e)) > 0) {
    }
    if (batch_interrupted) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++)
            if (!rq[i].done && llmd_cancel(e, rq[i].id) == 0)
                left++;
        fprintf(stderr, "llmd batch: interrupted: %zu unfinished requests cancelled\n", left);
        status = CLI_ERR;
        rc = 0;
    }
    sigaction(SIGINT, &old_sa, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc < 0) {
        fprintf(stderr, "llmd batch: the engine failed: %s\n", strerror(-rc));
        status = CLI_ERR;
    }
    for (size_t i = 0; i < n; i++)
        batch_print(&rq[i], i);
    if (!o.quiet)
        batch_summary(e, n,
                      (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
out:
    llmd_engine_close(e); /* with an NVMe tier: cached prefixes go down to it */
    for (size_t i = 0; i < n; i++) {
        json_decref(rq[i].in);
        mem_free(rq[i].text);
    }
    mem_free(rq);
    mem_free(o.nvme_path);
    return status;
}
