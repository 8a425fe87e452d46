/* llmd eval - what each KV cache type costs in quality on a model and a
 * text: mean and worst KL divergence of the next-token distributions from
 * the f32 cache's, top-1 agreement, perplexity (engine/model/model_eval.h).
 * Prints a table (or JSON lines with --json); docs/kv-quant.md has the
 * figures it gave. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_dummy.h"
#include "engine/model/model_eval.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "llmd_cli.h"
#include "mem.h"

#define EVAL_MAX_TYPES 8

struct eval_opts {
    const char *model, *file, *types, *pre;
    long threads, window, max_tokens;
    bool json;
};

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: llmd eval -m MODEL -f TEXT [options]\n"
            "\n"
            "Runs TEXT through MODEL token by token with an f32 KV cache and with each KV\n"
            "type asked for, and prints per type: bytes a token, the mean and largest KL\n"
            "divergence of its next-token distributions from f32's (nats), how often its\n"
            "most likely token is f32's, and the perplexity of the text (meaningless for\n"
            "the random weights of dummy models: read KL and top-1 there).\n"
            "\n"
            "  -m, --model PATH       GGUF file, or dummy:SHAPE[:TYPE[:ARCH]] (shapes: %s)\n"
            "  -f, --file PATH        the text ('-' for stdin), up to 256 MiB\n"
            "  -k, --kv-types LIST    comma-separated, of %s (default f16,q8_0,q4_0,fp8)\n"
            "  -w, --window N         tokens a window, BOS included: a longer text is cut into\n"
            "                         windows that restart the cache (default: the model's\n"
            "                         context, at most 512)\n"
            "  -n, --max-tokens N     use at most the first N tokens of the text (default all)\n"
            "  -t, --threads N        CPU threads, 1..256 (default: all online CPUs)\n"
            "      --json             one JSON object a type instead of the table\n" CLI_PRE_HELP,
            model_dummy_shapes(), kv_dtype_names());
}

static const char *eval_want(int c) {
    switch (c) {
    case 'k':
        return "a comma-separated list of f32, f16, q8_0, q4_0, fp8 (at most 8)";
    case 'w':
        return "an integer 2..1048576";
    case 'n':
        return "an integer 1..16777216";
    case 'P':
        return CLI_PRE_WANT;
    default:
        return "an integer 1..256";
    }
}

/* "q8_0,q4_0" -> types[]; false on an unknown name, an empty item or too many. */
static bool eval_parse_types(const char *s, enum kv_dtype *types, uint32_t *n) {
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return false;
    strcpy(buf, s);
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == EVAL_MAX_TYPES || kv_dtype_parse(t, &types[*n]) < 0)
            return false;
        (*n)++;
    }
    return *n > 0 && s[0] != ',' && s[strlen(s) - 1] != ',' && !strstr(s, ",,");
}

static int eval_parse(int argc, char **argv, struct eval_opts *o, enum kv_dtype *types,
                      uint32_t *n_types) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"file", required_argument, 0, 'f'},
        {"kv-types", required_argument, 0, 'k'},
        {"window", required_argument, 0, 'w'},
        {"max-tokens", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"json", no_argument, 0, 'j'},
        {"tokenizer-pre", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (struct eval_opts){.types = "f16,q8_0,q4_0,fp8"};
    int c, li = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:f:k:w:n:t:h", opts, &li)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'f':
            o->file = optarg;
            break;
        case 'k':
            o->types = optarg;
            ok = eval_parse_types(optarg, types, n_types);
            break;
        case 'w':
            ok = cli_parse_long(optarg, 2, 1 << 20, &o->window);
            break;
        case 'n':
            ok = cli_parse_long(optarg, 1, 1 << 24, &o->max_tokens);
            break;
        case 't':
            ok = cli_parse_long(optarg, 1, 256, &o->threads);
            break;
        case 'j':
            o->json = true;
            break;
        case 'P':
            o->pre = optarg;
            ok = cli_parse_pre(optarg);
            break;
        case 'h':
            eval_usage(stdout);
            return 1;
        default:
            eval_usage(stderr);
            return -1;
        }
        if (!ok) {
            cli_bad_value("llmd eval", opts, c, li, optarg, eval_want(c));
            return -1;
        }
        li = -1;
    }
    if (optind != argc || !o->model || !o->file) {
        fprintf(stderr, "llmd eval: -m MODEL and -f TEXT are required (see --help)\n");
        return -1;
    }
    if (!eval_parse_types(o->types, types, n_types))
        return -1; /* the default: cannot fail */
    return 0;
}

static void eval_print(const struct eval_opts *o, const struct model *m, uint32_t n_ids,
                       uint32_t window, const struct model_eval_result *ref,
                       const struct model_eval_result *res, uint32_t n_types) {
    if (o->json) {
        for (uint32_t k = 0; k <= n_types; k++) {
            const struct model_eval_result *r = k ? &res[k - 1] : ref;
            printf("{\"model\":\"%s\",\"kv_type\":\"%s\",\"token_bytes\":%llu,\"tokens\":%u,"
                   "\"window\":%u,\"predictions\":%u,\"kl_mean\":%.6g,\"kl_max\":%.6g,"
                   "\"top1\":%.6f,\"ppl\":%.6g}\n",
                   m->name, kv_dtype_name(r->type), (unsigned long long)r->token_bytes, n_ids,
                   window, r->n_pred, r->kl_mean, r->kl_max, r->top1, r->ppl);
        }
        return;
    }
    printf("llmd eval: %s, %u tokens in windows of %u, %u predictions a type\n", m->name, n_ids,
           window, ref->n_pred);
    printf("%-7s %11s %12s %12s %8s %10s\n", "kv", "B a token", "KL mean", "KL max", "top-1",
           "ppl");
    for (uint32_t k = 0; k <= n_types; k++) {
        const struct model_eval_result *r = k ? &res[k - 1] : ref;
        printf("%-7s %11llu %12.3g %12.3g %7.2f%% %10.4f\n", kv_dtype_name(r->type),
               (unsigned long long)r->token_bytes, r->kl_mean, r->kl_max, 100 * r->top1, r->ppl);
    }
}

int cli_eval(int argc, char **argv) {
    struct eval_opts o;
    enum kv_dtype types[EVAL_MAX_TYPES];
    uint32_t n_types = 0;
    int rc = eval_parse(argc, argv, &o, types, &n_types);
    if (rc != 0)
        return rc > 0 ? CLI_OK : CLI_USAGE;
    char *text = NULL, err[512] = "";
    size_t len = 0;
    struct model *m = NULL;
    struct kern_pool *pool = NULL;
    int32_t *ids = NULL;
    int status = CLI_ERR;
    if ((rc = cli_read_file(o.file, CLI_EVAL_FILE_MAX, &text, &len)) < 0) {
        cli_read_file_err("llmd eval", "a text to score", o.file, CLI_EVAL_FILE_MAX, rc);
        goto done;
    }
    /* the pool first: it packs the model's matrices at load */
    if ((rc = kern_pool_create((int)o.threads, &pool)) < 0) {
        fprintf(stderr, "llmd eval: cannot start threads: %s\n", strerror(-rc));
        goto done;
    }
    if ((rc = model_load(
             o.model,
             &(struct model_load_opts){.quiet = true, .tokenizer_pre = o.pre, .pool = pool}, &m,
             err, sizeof err)) < 0) {
        fprintf(stderr, "llmd eval: %s\n", err[0] ? err : strerror(-rc));
        goto done;
    }
    size_t n_ids = 0;
    if ((rc = tok_encode_alloc(m->tok, text, len, false, 0, &ids, &n_ids)) < 0 || n_ids == 0) {
        fprintf(stderr, "llmd eval: cannot tokenize %s: %s\n", o.file,
                rc < 0 ? strerror(-rc) : "no tokens");
        goto done;
    }
    if (o.max_tokens && (size_t)o.max_tokens < n_ids)
        n_ids = (size_t)o.max_tokens;
    if (n_ids > UINT32_MAX) {
        fprintf(stderr, "llmd eval: %s is too long\n", o.file);
        goto done;
    }
    const uint32_t ctx = m->hp.n_ctx_train ? m->hp.n_ctx_train : 512;
    uint32_t window = o.window ? (uint32_t)o.window : ctx < 512 ? ctx : 512;
    struct model_eval_result ref, res[EVAL_MAX_TYPES];
    err[0] = '\0';
    if ((rc = model_eval_kv(m, pool, ids, (uint32_t)n_ids, window, types, n_types, &ref, res, err,
                            sizeof err)) < 0) {
        fprintf(stderr, "llmd eval: %s\n", err[0] ? err : strerror(-rc));
        goto done;
    }
    eval_print(&o, m, (uint32_t)n_ids, window, &ref, res, n_types);
    status = fflush(stdout) == 0 ? CLI_OK : CLI_ERR;
done:
    kern_pool_destroy(pool);
    mem_free(ids);
    model_free(m);
    mem_free(text);
    return status;
}
