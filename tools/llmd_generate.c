/* llmd generate - one prompt through a model on the CPU, KV cache in vmm
 * pages; prints the text as it is generated and a summary on stderr.
 * With --spec the prompt runs through the serving engine (llmd.h) instead,
 * one sequence, which verifies drafts in its batched step: the same greedy
 * text, and the summary adds what was drafted and accepted. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_dummy.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "llmd.h"
#include "llmd_cli.h"
#include "mem.h"

struct gen_opts {
    const char *model, *prompt, *prompt_file;
    char *prompt_buf; /* owned: the contents of --file */
    long n_predict, threads, ctx, batch;
    uint64_t page_bytes, kv_budget;
    enum kv_dtype kv_type;
    struct smp_params smp;
    bool seed_set, print_ids, quiet, no_echo, cuda;
    int cuda_index;
    int spec;               /* enum llmd_spec */
    long spec_tokens;       /* 0: the engine's default */
    const char *spec_model; /* --spec draft: the draft model; borrowed from argv */
    const char *pre;        /* --tokenizer-pre; borrowed from argv */
};

static void gen_usage(FILE *f) {
    fprintf(
        f,
        "usage: llmd generate -m MODEL -p TEXT [options]\n"
        "\n"
        "Runs TEXT through MODEL on the CPU (or a GPU: --device cuda) and prints the\n"
        "continuation as it is "
        "generated; a summary (tokens, speeds, KV pages) goes to stderr.\n"
        "\n"
        "  -m, --model PATH     GGUF file (llama, qwen2, qwen3, phi3), or\n"
        "                       dummy:SHAPE[:TYPE[:ARCH]] for random weights (shapes: %s)\n"
        "  -p, --prompt TEXT    the prompt\n"
        "  -f, --file PATH      read the prompt from a file ('-' for stdin), up to 64 MiB\n"
        "  -n, --n-predict N    tokens to generate, 1..16777216 (default 128); stops early\n"
        "                       at EOS\n"
        "      --temp T         temperature 0..2 (default 0.8; 0 = greedy)\n"
        "      --top-k K        (default 40; 0 = off)\n"
        "      --top-p P        in (0, 1] (default 0.95; 1 = off)\n"
        "      --min-p P        0..1 (default 0.05; 0 = off)\n"
        "      --seed S         sampling seed, any 64-bit integer (a negative one as its\n"
        "                       two's complement, as serve's and batch's \"seed\"; default:\n"
        "                       random, printed)\n"
        "  -t, --threads N      CPU threads, 1..256 (default: all online CPUs)\n"
        "  -c, --ctx N          context length in tokens (default: the model's)\n"
        "  -b, --batch N        prefill chunk in tokens (default 256)\n"
        "      --page-size B    KV page size in bytes (K/M/G suffixes; default: 16 tokens'\n"
        "                       bytes); rounded up to whole tokens and 4 KiB host pages,\n"
        "                       and reported (stories260K, f16 KV: 32 tokens a page)\n"
        "      --kv-budget B    physical KV memory, allocated at start (default or 0: what\n"
        "                       --ctx needs; a smaller budget stops generation when full)\n"
        "      --kv-type T      f16 (default), f32, q8_0, q4_0 or fp8 (quantized:\n"
        "                       docs/kv-quant.md)\n"
        "      --device D       cpu (default), cuda or cuda:N (N 0..63): the forward pass and "
        "the KV\n"
        "                       pages on that GPU (a `make cuda` build)\n"
        "      --spec M         speculative decoding: ngram (drafts by prompt lookup, verified\n"
        "                       by the model: the same text per seed, often faster), draft\n"
        "                       (drafts by a smaller model, --spec-model) or none (default)\n"
        "      --spec-model PATH\n"
        "                       the draft model of --spec draft: a GGUF (or\n"
        "                       dummy:SHAPE[:TYPE[:ARCH]]) with the same vocabulary; CPU only\n"
        "      --spec-tokens K  the longest draft, 1..32 (default 8); each step's draft is\n"
        "                       as long as its recent acceptance pays for\n"
        "      --tokenizer-pre P\n"
        "                       split text as pre-tokenizer P (gpt-2, llama-bpe, qwen2)\n"
        "                       instead of the file's tokenizer.ggml.pre: for a family\n"
        "                       llmd does not know by name that splits as one of those\n"
        "      --ids            print the generated token ids on stderr\n"
        "      --no-echo        do not print the prompt before the continuation\n"
        "  -q, --quiet          no summary on stderr\n"
        "\n"
        "LLMD_ISA=scalar|avx2|avx-vnni|avx512|amx in the environment forces a lower kernel\n"
        "level than the CPU's best (the summary names the level in use).\n",
        model_dummy_shapes());
}

static volatile sig_atomic_t gen_interrupted;

static void gen_on_sigint(int sig) {
    (void)sig;
    gen_interrupted = 1;
}

static double gen_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The decode rate of n_gen tokens whose last n_gen - 1 took t seconds
 * (the first comes from the prefill's logits): "N tok/s", or "-" when no
 * decode step ran. */
static void gen_decode_rate(char *buf, size_t cap, size_t n_gen, double t) {
    if (n_gen > 1 && t > 0)
        snprintf(buf, cap, "%.1f tok/s", (double)(n_gen - 1) / t);
    else
        snprintf(buf, cap, "-");
}

enum {
    O_TEMP = 256,
    O_TOPK,
    O_TOPP,
    O_MINP,
    O_SEED,
    O_PAGE,
    O_BUDGET,
    O_KVT,
    O_IDS,
    O_NOECHO,
    O_DEV,
    O_SPEC,
    O_SPECK,
    O_SPECM,
    O_PRE
};

/* A seed as serve's and batch's "seed" field takes it (engine/serve/req.c): any
 * integer an int64 or a uint64 holds, a negative one as its two's complement. */
static bool gen_parse_seed(const char *s, uint64_t *out) {
    errno = 0;
    char *end;
    if (s[0] == '-') {
        long long v = strtoll(s, &end, 10);
        *out = (uint64_t)v;
    } else {
        *out = strtoull(s, &end, 10);
    }
    return errno == 0 && end != s && *end == '\0';
}

/* What option c takes, for its bad-value message. */
static const char *gen_want(int c) {
    switch (c) {
    case 'n':
        return "an integer 1..16777216";
    case 't':
        return "an integer 1..256";
    case 'c':
        return "an integer 1..16777216";
    case 'b':
        return "an integer 1..65536";
    case O_TEMP:
        return "a number 0..2";
    case O_TOPK:
        return "an integer 0..16777216";
    case O_TOPP:
        return "a number in (0, 1]";
    case O_MINP:
        return "a number 0..1";
    case O_SEED:
        return "an integer, -9223372036854775808..18446744073709551615";
    case O_KVT:
        return "f16, f32, q8_0, q4_0 or fp8";
    case O_PRE:
        return CLI_PRE_WANT;
    case O_DEV:
        return "cpu, cuda or cuda:N (N 0..63)";
    case O_SPEC:
        return CLI_SPEC_WANT;
    case O_SPECK:
        return CLI_SPEC_TOKENS;
    default:
        return "a size in bytes (K/M/G suffixes)";
    }
}

static int gen_parse(int argc, char **argv, struct gen_opts *o) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"n-predict", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"ctx", required_argument, 0, 'c'},
        {"batch", required_argument, 0, 'b'},
        {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},
        {"seed", required_argument, 0, O_SEED},
        {"page-size", required_argument, 0, O_PAGE},
        {"kv-budget", required_argument, 0, O_BUDGET},
        {"kv-type", required_argument, 0, O_KVT},
        {"ids", no_argument, 0, O_IDS},
        {"device", required_argument, 0, O_DEV},
        {"spec", required_argument, 0, O_SPEC},
        {"spec-tokens", required_argument, 0, O_SPECK},
        {"spec-model", required_argument, 0, O_SPECM},
        {"tokenizer-pre", required_argument, 0, O_PRE},
        {"no-echo", no_argument, 0, O_NOECHO},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (struct gen_opts){.n_predict = 128, .threads = 0, .batch = 256, .kv_type = KV_F16};
    o->smp = (struct smp_params){
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 0};
    long l;
    int c, li = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:n:t:c:b:qh", opts, &li)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'p':
            o->prompt = optarg;
            break;
        case 'f':
            o->prompt_file = optarg;
            break;
        case 'n':
            ok = cli_parse_long(optarg, 1, 1 << 24, &o->n_predict);
            break;
        case 't':
            ok = cli_parse_long(optarg, 1, 256, &o->threads);
            break;
        case 'c':
            ok = cli_parse_long(optarg, 1, 1 << 24, &o->ctx);
            break;
        case 'b':
            ok = cli_parse_long(optarg, 1, 1 << 16, &o->batch);
            break;
        case O_TEMP:
            /* the ranges of serve's and batch's request fields (engine/serve/req.c) */
            ok = cli_parse_float(optarg, &o->smp.temperature) && o->smp.temperature >= 0 &&
                 o->smp.temperature <= 2;
            break;
        case O_TOPK:
            ok = cli_parse_long(optarg, 0, 1 << 24, &l);
            o->smp.top_k = (int)l;
            break;
        case O_TOPP:
            /* 0 would keep one token here and mean "off" in llmd.h: refused, as serve does */
            ok = cli_parse_float(optarg, &o->smp.top_p) && o->smp.top_p > 0 && o->smp.top_p <= 1;
            break;
        case O_MINP:
            ok = cli_parse_float(optarg, &o->smp.min_p) && o->smp.min_p >= 0 && o->smp.min_p <= 1;
            break;
        case O_SEED:
            ok = gen_parse_seed(optarg, &o->smp.seed);
            o->seed_set = true;
            break;
        case O_PAGE:
            ok = cli_parse_size(optarg, &o->page_bytes);
            break;
        case O_BUDGET:
            ok = cli_parse_size(optarg, &o->kv_budget);
            break;
        case O_KVT:
            ok = kv_dtype_parse(optarg, &o->kv_type) == 0;
            break;
        case O_DEV:
            ok = cli_parse_device(optarg, &o->cuda, &o->cuda_index);
            break;
        case O_SPEC:
            ok = cli_parse_spec(optarg, &o->spec);
            break;
        case O_SPECK:
            ok = cli_parse_long(optarg, 1, LLMD_SPEC_TOKENS_MAX, &o->spec_tokens);
            break;
        case O_SPECM:
            o->spec_model = optarg;
            break;
        case O_PRE:
            o->pre = optarg;
            ok = cli_parse_pre(optarg);
            break;
        case O_IDS:
            o->print_ids = true;
            break;
        case O_NOECHO:
            o->no_echo = true;
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'h':
            gen_usage(stdout);
            return 1;
        default:
            gen_usage(stderr);
            return -1;
        }
        if (!ok) {
            cli_bad_value("llmd generate", opts, c, li, optarg, gen_want(c));
            return -1;
        }
        li = -1;
    }
    if (optind != argc) {
        fprintf(stderr, "llmd generate: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->prompt && o->prompt_file) {
        fprintf(stderr, "llmd generate: -p TEXT and -f FILE exclude each other: give one prompt\n");
        return -1;
    }
    if (!o->model || (!o->prompt && !o->prompt_file)) {
        fprintf(stderr, "llmd generate: -m MODEL and one of -p TEXT or -f FILE are required (see "
                        "--help)\n");
        return -1;
    }
    const char *why = cli_spec_check(o->spec, o->spec_tokens, o->spec_model);
    if (why) {
        fprintf(stderr, "llmd generate: %s\n", why);
        return -1;
    }
    if (o->threads > sysconf(_SC_NPROCESSORS_ONLN))
        fprintf(stderr, "llmd generate: warning: %ld threads on %ld online CPUs will be slow\n",
                o->threads, sysconf(_SC_NPROCESSORS_ONLN));
    if (!o->seed_set)
        o->smp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return 0;
}

/* Everything one run owns, freed in one place. */
struct gen_run {
    struct model *m;
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
    struct smp *smp;
    int32_t *ids;
    float *logits;
    uint32_t seq;
    bool seq_open;
};

static void gen_run_free(struct gen_run *r) {
    if (r->seq_open)
        kv_seq_close(r->kv, r->seq);
    mem_free(r->logits);
    mem_free(r->ids);
    smp_destroy(r->smp);
    model_ctx_destroy(r->ctx);
    kv_cache_destroy(r->kv);
    kern_pool_destroy(r->pool);
    model_free(r->m);
}

/* Write the text of one token, complete UTF-8 only. */
static void gen_emit(const struct tok *t, struct tok_stream *ts, int32_t id) {
    char buf[256];
    size_t n = 0;
    if (tok_stream_push(t, ts, id, buf, sizeof(buf), &n) == 0 && n > 0) {
        fwrite(buf, 1, n, stdout);
        fflush(stdout);
    }
}

/* A prompt of n_prompt tokens that fills the context of n_ctx (plain and
 * --spec alike; batch and serve word it as req_err_submit does). */
static void gen_no_room(size_t n_prompt, uint32_t n_ctx) {
    fprintf(stderr,
            "llmd generate: the prompt is %zu token%s: it leaves no room for output in the "
            "context of %u token%s (prompt and output together; raise --ctx)\n",
            n_prompt, n_prompt == 1 ? "" : "s", n_ctx, n_ctx == 1 ? "" : "s");
}

static int gen_main(const struct gen_opts *o, struct gen_run *r) {
    char err[512] = "";
    double t0 = gen_now();
    int rc = 0;
    if (o->cuda &&
        (rc = llmd_device_check(LLMD_DEVICE_CUDA, o->cuda_index, err, sizeof(err))) < 0) {
        cli_engine_err("llmd generate", err, rc); /* "--device cuda:N: why", before the load */
        return CLI_ERR;
    }
    /* the pool first: it packs the model's matrices at load */
    if ((rc = kern_pool_create((int)o->threads, &r->pool)) < 0) {
        fprintf(stderr, "llmd generate: setup failed: %s\n", strerror(-rc));
        return CLI_ERR;
    }
    rc = model_load(
        o->model,
        &(struct model_load_opts){
            .quiet = o->quiet, .no_pack = o->cuda, .tokenizer_pre = o->pre, .pool = r->pool},
        &r->m, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "llmd generate: %s\n", err);
        return CLI_ERR;
    }
    const struct model_hparams *hp = &r->m->hp;
    uint32_t n_ctx = o->ctx > 0 ? (uint32_t)o->ctx : hp->n_ctx_train;
    cli_ctx_note("llmd generate", n_ctx, hp->n_ctx_train);

    size_t n_prompt = 0;
    r->logits = mem_alloc(MEM_CLI, (size_t)hp->n_vocab * sizeof(float));
    rc = tok_encode_alloc(r->m->tok, o->prompt, strlen(o->prompt), tok_add_bos_default(r->m->tok),
                          (size_t)o->n_predict, &r->ids, &n_prompt);
    if (!r->logits || rc == -ENOMEM) {
        fprintf(stderr, "llmd generate: out of memory\n");
        return CLI_ERR;
    }
    if (rc < 0 || n_prompt == 0) {
        fprintf(stderr, "llmd generate: cannot tokenize the prompt: %s\n",
                rc < 0 ? strerror(-rc) : "no tokens");
        return CLI_ERR;
    }
    if (n_prompt >= n_ctx) { /* the engine's rule (llmd_submit: -E2BIG), batch's and serve's */
        gen_no_room(n_prompt, n_ctx);
        return CLI_ERR;
    }
    struct kv_config kc = {.dtype = o->kv_type,
                           .n_ctx = n_ctx,
                           .n_seqs = 1,
                           .page_bytes = o->page_bytes,
                           .budget_bytes = o->kv_budget,
                           .device = o->cuda ? KV_DEV_CUDA : KV_DEV_HOST,
                           .cuda_ordinal = o->cuda_index};
    if ((rc = kv_cache_create(hp, &kc, &r->kv, err, sizeof(err))) < 0) {
        /* the flags that can help: the mapping limit grows with the context over the page,
         * whatever the budget */
        fprintf(stderr, "llmd generate: KV cache: %s%s\n", err[0] ? err : strerror(-rc),
                rc == -ENOTSUP                    ? ""
                : strstr(err, "vm.max_map_count") ? " (options: --ctx, --page-size)"
                                                  : " (options: --ctx, --page-size, --kv-budget)");
        return CLI_ERR;
    }
    {
        struct vmm_stats vs;
        vmm_stats_get(r->kv->vmm, &vs);
        cli_kv_caps_note("llmd generate", o->page_bytes, vs.page_bytes,
                         vmm_tokens_per_page(r->kv->vmm), o->kv_budget, vs.n_pages, n_ctx, 1);
    }
    if ((rc = model_ctx_create(r->m, r->pool, (uint32_t)o->batch, &r->ctx)) < 0) {
        fprintf(stderr, "llmd generate: setup failed: %s\n", strerror(-rc));
        return CLI_ERR;
    }
    if (o->cuda &&
        (rc = model_ctx_use_cuda(r->ctx, r->kv, o->cuda_index, 1, err, sizeof(err))) < 0) {
        fprintf(stderr, "llmd generate: --device cuda: %s\n", err[0] ? err : strerror(-rc));
        return CLI_ERR;
    }
    if ((rc = smp_create(&o->smp, hp->n_vocab, &r->smp)) < 0 ||
        (rc = kv_seq_open(r->kv, &r->seq)) < 0) {
        fprintf(stderr, "llmd generate: setup failed: %s\n", strerror(-rc));
        return CLI_ERR;
    }
    r->seq_open = true;
    double t_load = gen_now() - t0;
    /* tokens the whole pool holds: a budget under one context ends the
     * run early, which llmd batch and serve report as "kv_budget" too */
    uint64_t pool_tokens = (uint64_t)vmm_n_pages(r->kv->vmm) * vmm_tokens_per_page(r->kv->vmm);
    if (n_prompt > pool_tokens) {
        fprintf(stderr,
                "llmd generate: the prompt is %zu tokens, more than the KV budget holds (%llu "
                "tokens): raise --kv-budget\n",
                n_prompt, (unsigned long long)pool_tokens);
        return CLI_ERR;
    }

    if (!o->no_echo) {
        fputs(o->prompt, stdout);
        fflush(stdout);
    }
    /* prefill in chunks of --batch tokens */
    double t1 = gen_now();
    for (size_t pos = 0; pos < n_prompt; pos += (size_t)o->batch) {
        uint32_t n =
            (uint32_t)(n_prompt - pos < (size_t)o->batch ? n_prompt - pos : (size_t)o->batch);
        bool last = pos + n == n_prompt;
        if ((rc = kv_seq_reserve(r->kv, r->seq, (uint32_t)pos + n)) < 0 ||
            (rc = model_forward(r->ctx, r->kv, r->seq, r->ids + pos, n, (uint32_t)pos,
                                last ? r->logits : NULL)) < 0) {
            fprintf(stderr, "\nllmd generate: prefill failed at token %zu: %s\n", pos,
                    strerror(-rc));
            return CLI_ERR;
        }
    }
    double t_prefill = gen_now() - t1;

    /* decode */
    struct tok_stream ts;
    tok_stream_init(&ts);
    const char *stop = "length";
    bool kv_full = false;
    size_t n_gen = 0, pos = n_prompt;
    double t2 = gen_now();
    while (n_gen < (size_t)o->n_predict) {
        if (gen_interrupted) {
            stop = "interrupted";
            break;
        }
        int32_t id = smp_sample(r->smp, r->logits);
        r->ids[pos] = id;
        n_gen++;
        if (tok_is_eog(r->m->tok, id)) { /* the EOS, <|eot_id|>, <|im_end|>, ... */
            stop = "eos";
            break;
        }
        gen_emit(r->m->tok, &ts, id);
        if (n_gen == (size_t)o->n_predict)
            break;
        if (pos + 1 >= n_ctx) {
            stop = "context";
            break;
        }
        if (pos + 1 >= pool_tokens) { /* prompt + output fill the pool, as in the engine */
            stop = "kv_budget";       /* the text so far is printed, then the summary */
            kv_full = true;
            break;
        }
        if ((rc = kv_seq_reserve(r->kv, r->seq, (uint32_t)pos + 1)) < 0 ||
            (rc = model_forward(r->ctx, r->kv, r->seq, &r->ids[pos], 1, (uint32_t)pos, r->logits)) <
                0) {
            fprintf(stderr, "\nllmd generate: decode failed at position %zu: %s\n", pos,
                    strerror(-rc));
            return CLI_ERR;
        }
        pos++;
    }
    double t_decode = gen_now() - t2;
    char tail[32];
    size_t nt = 0;
    if (tok_stream_flush(&ts, tail, sizeof(tail), &nt) == 0 && nt)
        fwrite(tail, 1, nt, stdout);
    fputc('\n', stdout);
    fflush(stdout);

    if (o->print_ids) {
        fprintf(stderr, "ids:");
        for (size_t i = 0; i < n_gen; i++)
            fprintf(stderr, " %d", r->ids[n_prompt + i]);
        fprintf(stderr, "\n");
    }
    if (!o->quiet) {
        struct vmm_stats vs;
        vmm_stats_get(r->kv->vmm, &vs);
        char packed[64];
        cli_packed(packed, sizeof packed, r->m->packed_bytes, r->m->copied_bytes);
        fprintf(stderr,
                "llmd: model %s: %u layers, n_embd %u, heads %u/%u, vocab %u, %.1f MB of "
                "weights%s, loaded in %.2f s; matrices %s\n",
                r->m->name, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_vocab,
                (double)r->m->weight_bytes / 1e6, packed, t_load, r->m->wtypes);
        char isa[96];
        kern_isa_describe(isa, sizeof(isa));
        char rate[64];
        gen_decode_rate(rate, sizeof rate, n_gen, t_decode);
        fprintf(stderr,
                "llmd: prompt %zu token%s, prefill %.1f tok/s; generated %zu token%s, "
                "decode %s (stop: %s), %s %d, isa %s\n",
                n_prompt, n_prompt == 1 ? "" : "s", (double)n_prompt / t_prefill, n_gen,
                n_gen == 1 ? "" : "s", rate, stop, o->cuda ? "cuda device" : "threads",
                o->cuda ? o->cuda_index : kern_pool_n_threads(r->pool), isa);
        fprintf(stderr,
                "llmd: KV %s, %llu B a token (the stride), page %llu B (%u tokens), pages mapped "
                "%llu of %llu, ctx %u, seed %llu\n",
                kv_dtype_name(o->kv_type), (unsigned long long)vs.token_bytes,
                (unsigned long long)vs.page_bytes, vmm_tokens_per_page(r->kv->vmm),
                (unsigned long long)vs.pages_mapped, (unsigned long long)vs.n_pages, n_ctx,
                (unsigned long long)o->smp.seed);
    }
    if (kv_full) {
        fprintf(stderr,
                "llmd generate: stopped after %zu tokens: the KV budget holds %llu tokens of the "
                "%u-token context (raise --kv-budget)\n",
                n_gen, (unsigned long long)pool_tokens, n_ctx);
        return CLI_ERR;
    }
    return CLI_OK;
}

/* --spec: the prompt through the engine, one sequence. */
struct gen_eng {
    const struct gen_opts *o;
    double t_first, t_last; /* CLOCK_MONOTONIC of the first and the last token */
    enum llmd_finish finish;
    int32_t *ids; /* [n_predict] the generated ids, for --ids */
    uint32_t n;
};

static void gen_eng_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                          enum llmd_finish finish) {
    (void)id;
    struct gen_eng *g = user;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (token >= 0 && finish != LLMD_FINISH_CANCELLED) {
        g->t_last = gen_now();
        if (g->n == 0)
            g->t_first = g->t_last;
        if (g->n < (uint32_t)g->o->n_predict)
            g->ids[g->n++] = token;
    }
    g->finish = finish;
}

static const char *gen_finish_name(enum llmd_finish f) {
    switch (f) {
    case LLMD_FINISH_LENGTH:
        return "length";
    case LLMD_FINISH_EOS:
        return "eos";
    case LLMD_FINISH_CONTEXT:
        return "context";
    case LLMD_FINISH_KV_BUDGET:
        return "kv_budget";
    case LLMD_FINISH_CANCELLED:
        return "interrupted";
    default:
        return "error";
    }
}

static int gen_engine_main(const struct gen_opts *o) {
    char err[512] = "";
    double t0 = gen_now();
    struct llmd_engine_config cfg = {
        .model = o->model,
        .n_threads = (int)o->threads,
        .n_ctx = (uint32_t)o->ctx,
        .max_seqs = 1,
        .max_batched_tokens = (uint32_t)o->batch,
        .kv_budget_bytes = o->kv_budget,
        .page_bytes = o->page_bytes,
        .no_prefix_cache = 1,
        .device = o->cuda ? LLMD_DEVICE_CUDA : LLMD_DEVICE_CPU,
        .device_index = o->cuda_index,
        .spec = (enum llmd_spec)o->spec,
        .spec_tokens = (uint32_t)o->spec_tokens,
        .spec_model_path = o->spec_model,
        .tokenizer_pre = o->pre,
    };
    /* the engine's enum for the type --kv-type parsed: the two share the names */
    if (llmd_kv_type_parse(kv_dtype_name(o->kv_type), &cfg.kv_type) != 0) {
        fprintf(stderr, "llmd generate: --kv-type %s is not a type the engine takes\n",
                kv_dtype_name(o->kv_type));
        return CLI_ERR;
    }
    struct llmd_engine *e;
    int rc = llmd_engine_open(&cfg, &e, err, sizeof err);
    if (rc < 0) {
        cli_engine_err("llmd generate", err, rc);
        return CLI_ERR;
    }
    {
        struct llmd_engine_info in;
        llmd_engine_info_get(e, &in);
        cli_ctx_note("llmd generate", in.n_ctx, in.n_ctx_train);
        cli_kv_caps_note("llmd generate", o->page_bytes, in.page_bytes, in.tokens_per_page,
                         o->kv_budget, in.kv_pages, in.n_ctx, in.max_seqs);
    }
    double t_load = gen_now() - t0;
    struct gen_eng g = {.o = o, .ids = mem_alloc(MEM_CLI, (size_t)o->n_predict * sizeof(int32_t))};
    struct llmd_usage u = {0};
    struct llmd_request q = {.prompt = o->prompt,
                             .prompt_len = strlen(o->prompt),
                             .max_tokens = (uint32_t)o->n_predict,
                             .temperature = o->smp.temperature,
                             .top_k = o->smp.top_k,
                             .top_p = o->smp.top_p,
                             .min_p = o->smp.min_p,
                             .seed = o->smp.seed,
                             .on_token = gen_eng_token,
                             .user = &g,
                             .usage = &u};
    uint64_t id = 0;
    if (!g.ids) {
        fprintf(stderr, "llmd generate: out of memory for %ld token ids (lower -n)\n",
                o->n_predict);
        llmd_engine_close(e);
        return CLI_ERR;
    }
    if ((rc = llmd_submit(e, &q, &id, NULL)) < 0) {
        struct llmd_engine_info in;
        llmd_engine_info_get(e, &in);
        if (rc == -E2BIG && in.max_seq_tokens < in.n_ctx) /* batch's and serve's words */
            fprintf(stderr,
                    "llmd generate: the prompt is %u token%s: it leaves no room for output in "
                    "what the whole KV pool holds for one sequence, %u token%s of the %u-token "
                    "context (raise --kv-budget)\n",
                    u.prompt_tokens, u.prompt_tokens == 1 ? "" : "s", in.max_seq_tokens,
                    in.max_seq_tokens == 1 ? "" : "s", in.n_ctx);
        else if (rc == -E2BIG)
            gen_no_room(u.prompt_tokens, in.n_ctx);
        else
            fprintf(stderr, "llmd generate: cannot submit the prompt: %s\n", strerror(-rc));
        llmd_engine_close(e);
        mem_free(g.ids);
        return CLI_ERR;
    }
    if (!o->no_echo) {
        fputs(o->prompt, stdout);
        fflush(stdout);
    }
    double t1 = gen_now();
    int live;
    while ((live = llmd_engine_step(e)) > 0)
        if (gen_interrupted && g.finish == LLMD_FINISH_NONE)
            llmd_cancel(e, id);
    fputc('\n', stdout);
    fflush(stdout);
    if (o->print_ids) {
        fprintf(stderr, "ids:");
        for (uint32_t i = 0; i < g.n; i++)
            fprintf(stderr, " %d", g.ids[i]);
        fprintf(stderr, "\n");
    }
    struct llmd_stats st;
    struct llmd_engine_info in;
    llmd_stats_get(e, &st);
    llmd_engine_info_get(e, &in);
    if (!o->quiet) {
        double t_prefill = g.n ? g.t_first - t1 : gen_now() - t1, t_decode = g.t_last - g.t_first;
        char isa[96];
        kern_isa_describe(isa, sizeof(isa));
        char packed[64];
        cli_packed(packed, sizeof packed, in.packed_bytes, in.copied_bytes);
        fprintf(stderr,
                "llmd: model %s: %u layers, n_embd %u, heads %u/%u, vocab %u, %.1f MB of "
                "weights%s%s%s, loaded in %.2f s (the engine, for --spec); matrices %s\n",
                in.model_name, in.n_layer, in.n_embd, in.n_head, in.n_head_kv, in.n_vocab,
                (double)in.weight_bytes / 1e6, packed, in.spec_model ? "; draft model " : "",
                in.spec_model ? in.spec_model : "", t_load, in.weight_types);
        char rate[64];
        gen_decode_rate(rate, sizeof rate, u.completion_tokens, t_decode);
        fprintf(stderr,
                "llmd: prompt %u token%s, prefill %.1f tok/s; generated %u token%s, decode %s "
                "(stop: %s), threads %d, isa %s\n",
                u.prompt_tokens, u.prompt_tokens == 1 ? "" : "s",
                t_prefill > 0 ? u.prompt_tokens / t_prefill : 0.0, u.completion_tokens,
                u.completion_tokens == 1 ? "" : "s", rate, gen_finish_name(g.finish), in.n_threads,
                isa);
        uint64_t steps = st.spec_steps_total;
        fprintf(stderr,
                "llmd: speculative decoding (%s%s, up to %u token%s): %u drafted, %u accepted "
                "(%.0f%%), %.2f accepted per verifying step, %llu step%s for %u token%s; the "
                "step's cost model %.1f us + %.1f us a token\n",
                in.spec_model ? "draft model " : "ngram", in.spec_model ? in.spec_model : "",
                in.spec_tokens, in.spec_tokens == 1 ? "" : "s", u.spec_draft_tokens,
                u.spec_accepted_tokens,
                u.spec_draft_tokens ? 100.0 * u.spec_accepted_tokens / u.spec_draft_tokens : 0.0,
                steps ? (double)st.spec_accepted_tokens_total / (double)steps : 0.0,
                (unsigned long long)st.steps_total, st.steps_total == 1 ? "" : "s",
                u.completion_tokens, u.completion_tokens == 1 ? "" : "s",
                in.spec_step_fixed_ns / 1e3, in.spec_step_token_ns / 1e3);
        if (in.spec_model)
            fprintf(stderr, "llmd: the draft model's pass: %.1f us + %.1f us a token\n",
                    in.spec_draft_fixed_ns / 1e3, in.spec_draft_token_ns / 1e3);
        fprintf(stderr,
                "llmd: KV %s, %llu B a token (the stride), page %llu B (%u tokens), %llu page%s, "
                "ctx %u, seed %llu\n",
                llmd_kv_type_name(in.kv_type), (unsigned long long)in.kv_token_bytes,
                (unsigned long long)in.page_bytes, in.tokens_per_page,
                (unsigned long long)in.kv_pages, in.kv_pages == 1 ? "" : "s", in.n_ctx,
                (unsigned long long)o->smp.seed);
        if (in.kv_draft_token_bytes)
            fprintf(stderr, "llmd: the draft model's KV: %llu B of each token's %llu B\n",
                    (unsigned long long)in.kv_draft_token_bytes,
                    (unsigned long long)in.kv_token_bytes);
    }
    llmd_engine_close(e);
    mem_free(g.ids);
    if (live < 0 || g.finish == LLMD_FINISH_ERROR) {
        fprintf(stderr, "llmd generate: the engine failed: %s\n", strerror(live < 0 ? -live : EIO));
        return CLI_ERR;
    }
    if (g.finish == LLMD_FINISH_KV_BUDGET) {
        fprintf(stderr,
                "llmd generate: stopped after %u tokens: the KV budget holds %u tokens of the "
                "%u-token context (raise --kv-budget)\n",
                u.completion_tokens, in.max_seq_tokens, in.n_ctx);
        return CLI_ERR;
    }
    return CLI_OK;
}

int cli_generate(int argc, char **argv) {
    struct gen_opts o;
    int rc = gen_parse(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? CLI_OK : CLI_USAGE;
    if (o.prompt_file) {
        size_t len;
        rc = cli_read_file(o.prompt_file, CLI_PROMPT_FILE_MAX, &o.prompt_buf, &len);
        if (rc < 0) {
            cli_read_file_err("llmd generate", "a prompt", o.prompt_file, CLI_PROMPT_FILE_MAX, rc);
            return CLI_ERR;
        }
        if (strlen(o.prompt_buf) != len) {
            fprintf(stderr, "llmd generate: %s contains a NUL byte\n", o.prompt_file);
            mem_free(o.prompt_buf);
            return CLI_ERR;
        }
        o.prompt = o.prompt_buf;
    }
    /* Ctrl-C ends generation at the next token and still prints the summary */
    struct sigaction sa = {.sa_handler = gen_on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    struct gen_run r = {0};
    if (o.spec != LLMD_SPEC_NONE) {
        rc = gen_engine_main(&o);
    } else {
        rc = gen_main(&o, &r);
        gen_run_free(&r);
    }
    mem_free(o.prompt_buf);
    if (rc == CLI_OK && gen_interrupted)
        rc = 128 + SIGINT;
    return rc;
}
