/* llmd batch - many prompts through the serving engine at once (continuous
 * batching, prefix cache, offload tiers), offline: JSON lines in, JSON lines
 * out, a run summary on stderr. The tool for RAG-style offline jobs and for
 * checking what the KV tiers do across runs.
 *
 * Every non-blank input line gets exactly one output line, in input order,
 * whatever the others do: a line that is not JSON, or carries a bad field,
 * or that the engine refuses, gets {"id", "error": {...}} (serve's error
 * object, in the same words: the fields are validated by engine/serve/req.c,
 * as serve's are) and the rest run. The exit status says whether any line
 * failed (docs/serving.md, "llmd batch"). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/serve/req.h"
#include "llmd.h"
#include "llmd_cli.h"
#include "mem.h"

/* Tenants given by name get scheduler ids from here up, in order of first
 * appearance; integer tenants stay below. A named tenant's prefix-cache
 * namespace comes from its name, so it is the same whatever the order of
 * the lines and from one run to the next (an NVMe tier finds it again). */
#define BATCH_NAMED_TENANT0 0x80000000u

struct batch_req;

/* One choice of a line ("n": several, each an engine request of its own). */
struct batch_choice {
    struct batch_req *r; /* its line */
    char *text;          /* generated text, grown as tokens arrive */
    size_t n_text, cap_text;
    int32_t *tokens; /* [n_tokens] sampled ids (--token-ids) */
    uint32_t n_tokens, cap_tokens;
    struct req_lp_buf lp; /* "logprobs": the sampled tokens' records */
    struct llmd_usage usage;
    enum llmd_finish finish;
    uint64_t engine_id;
    bool submitted, done, oom;
};

struct batch_req {
    json_t *id; /* the line's "id" (owned), or NULL: its index */
    struct req_fields f;
    uint8_t *ns; /* [n_ns] a named tenant's namespace (owned), or NULL */
    size_t n_ns;
    bool want_tokens;
    struct llmd_engine *e;  /* for the tokens' bytes (logprobs) */
    struct batch_choice *c; /* [n_c] its choices (owned) */
    uint32_t n_c;
    bool submitted; /* every choice was */
    bool failed;    /* err holds why: the output line is an error */
    struct req_err err;
};

struct batch_opts {
    const char *model, *input, *output, *secret, *pre;
    long threads, ctx, max_seqs, max_batched, max_tokens;
    uint64_t kv_budget, page_bytes, host_tier, nvme_bytes;
    char *nvme_path; /* owned: PATH of --nvme-tier PATH[,BYTES] */
    bool offload_always, quiet, token_ids;
    enum llmd_kv_type kv_type;
    bool cuda;
    int cuda_index;
    int spec;               /* enum llmd_spec */
    long spec_tokens;       /* 0: the engine's default */
    const char *spec_model; /* --spec draft: the draft model; borrowed from argv */
};

static void batch_usage(FILE *f) {
    fprintf(
        f,
        "usage: llmd batch -m MODEL [-i FILE] [-o FILE] [options]\n"
        "\n"
        "Reads one JSON object a line (FILE, or stdin; blank lines are skipped):\n"
        "{\"prompt\": TEXT or [token ids]} plus optional \"id\" (echoed), \"tenant\" (an\n"
        "integer 0..2147483647 or a name), \"cache_salt\", and the fields of `llmd serve`'s\n"
        "/v1/completions: \"max_tokens\", \"temperature\" (default 0: greedy), \"top_p\",\n"
        "\"top_k\", \"min_p\", \"seed\" (default 0), \"stop\", \"priority\", \"speculative\"\n"
        "(false: no speculative decoding for that line), \"n\", ...; a field llmd does\n"
        "not know is an error. Runs them all together and prints one JSON line per\n"
        "input line, in input order: {\"id\", \"text\", \"finish_reason\", \"prompt_tokens\",\n"
        "\"completion_tokens\", \"cached_tokens\", \"restored_tokens\"} (with \"n\" > 1 the\n"
        "choices in \"choices\": [{\"index\", \"text\", \"finish_reason\", "
        "\"completion_tokens\"}],\n"
        "choice i sampled with seed + i), or for a line that\n"
        "failed {\"id\", \"error\": {\"message\", \"type\", \"param\", \"code\"}}; the other "
        "lines\n"
        "still run. finish_reason \"kv_budget\" (the whole KV pool is full) also carries an\n"
        "error. With --spec each line (each choice, with \"n\" > 1) also has\n"
        "\"spec_draft_tokens\" and \"spec_accepted_tokens\". A summary (tokens, speed, prefix "
        "hits, tiers,\n"
        "speculation) goes to stderr.\n"
        "Exit status: 0 every line ran, 3 some lines failed (each has its error),\n"
        "1 the run itself failed (model, input, engine), 2 a usage error.\n"
        "\n"
        "  -m, --model PATH          GGUF file, or dummy:SHAPE[:TYPE[:ARCH]]\n"
        "  -i, --input FILE          JSON lines ('-' or absent: stdin), up to 1 GiB\n"
        "  -o, --output FILE         write the output lines there ('-' or absent: stdout)\n"
        "      --token-ids           add \"token_ids\": the sampled ids, to each line\n"
        "  -n, --max-tokens N        default per request, 1..16777216 (default 128)\n"
        "  -t, --threads N           CPU threads, 1..256 (default: all online CPUs)\n"
        "  -c, --ctx N               tokens per sequence (default: the model's)\n"
        "      --max-seqs N          sequences running at once, 1..4096 (default 8)\n"
        "      --max-batched-tokens N  tokens per step, >= --max-seqs (default 256)\n"
        "      --kv-budget BYTES     device KV pool (K/M/G; default: max-seqs full contexts)\n"
        "      --page-size BYTES     KV page size (K/M/G; default: 16 tokens' bytes, rounded\n"
        "                            up to whole tokens and 4 KiB host pages)\n"
        "      --kv-type T           f16 (default), f32, q8_0, q4_0 or fp8 (quantized:\n"
        "                            docs/kv-quant.md)\n"
        "      --device D            cpu (default), cuda or cuda:N, N 0..63 (`make cuda` build)\n"
        "      --host-tier BYTES     pinned host memory for cold KV pages (0 = off)\n"
        "      --nvme-tier PATH[,BYTES]  NVMe tier slot file (default size 4G; needs\n"
        "                            --host-tier); cached prefixes persist there across runs\n"
        "      --offload-always      keep every cold page the tiers hold (default: only\n"
        "                            where restoring beats recomputing, measured)\n"
        "      --prefix-secret FILE  prefix-cache key (64 hex digits; default:\n"
        "                            LLMD_PFX_SECRET, else with --nvme-tier the key file\n"
        "                            PATH.key beside the tier, made on first use; else\n"
        "                            random per run)\n"
        "      --spec M              speculative decoding: ngram (prompt lookup; the same\n"
        "                            text, per seed), draft (a draft model, --spec-model) or\n"
        "                            none (default)\n"
        "      --spec-tokens K       the longest draft, 1..32 (default 8)\n"
        "      --spec-model PATH     the draft model of --spec draft: a GGUF (or\n"
        "                            dummy:SHAPE[:TYPE[:ARCH]]) with the same vocabulary; CPU "
        "only\n"
        "      --tokenizer-pre P     split text as pre-tokenizer P (gpt-2, llama-bpe, qwen2)\n"
        "                            instead of the file's tokenizer.ggml.pre\n"
        "  -q, --quiet               no summary\n");
}

enum {
    O_SEQS = 256,
    O_BATCHED,
    O_BUDGET,
    O_HOST,
    O_NVME,
    O_ALWAYS,
    O_SECRET,
    O_KVT,
    O_DEV,
    O_IDS,
    O_SPEC,
    O_SPECK,
    O_SPECM,
    O_PRE,
    O_PAGE
};

/* What option c takes, for its bad-value message. */
static const char *batch_want(int c) {
    switch (c) {
    case 'n':
    case 'c':
        return "an integer 1..16777216";
    case 't':
        return "an integer 1..256";
    case O_SEQS:
        return "an integer 1..4096";
    case O_BATCHED:
        return "an integer 1..1048576";
    case O_NVME:
        return "PATH or PATH,SIZE (SIZE > 0 bytes, K/M/G suffixes)";
    case O_KVT:
        return "f16, f32, q8_0, q4_0 or fp8";
    case O_DEV:
        return "cpu, cuda or cuda:N (N 0..63)";
    case O_SPEC:
        return CLI_SPEC_WANT;
    case O_SPECK:
        return CLI_SPEC_TOKENS;
    case O_PRE:
        return CLI_PRE_WANT;
    default:
        return "a size in bytes (K/M/G suffixes)";
    }
}

static int batch_parse(int argc, char **argv, struct batch_opts *o) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"input", required_argument, 0, 'i'},
        {"output", required_argument, 0, 'o'},
        {"token-ids", no_argument, 0, O_IDS},
        {"max-tokens", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"ctx", required_argument, 0, 'c'},
        {"max-seqs", required_argument, 0, O_SEQS},
        {"max-batched-tokens", required_argument, 0, O_BATCHED},
        {"kv-budget", required_argument, 0, O_BUDGET},
        {"page-size", required_argument, 0, O_PAGE},
        {"host-tier", required_argument, 0, O_HOST},
        {"nvme-tier", required_argument, 0, O_NVME},
        {"offload-always", no_argument, 0, O_ALWAYS},
        {"prefix-secret", required_argument, 0, O_SECRET},
        {"kv-type", required_argument, 0, O_KVT},
        {"device", required_argument, 0, O_DEV},
        {"spec", required_argument, 0, O_SPEC},
        {"spec-tokens", required_argument, 0, O_SPECK},
        {"spec-model", required_argument, 0, O_SPECM},
        {"tokenizer-pre", required_argument, 0, O_PRE},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (struct batch_opts){.max_tokens = 128};
    int c, li = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:i:o:n:t:c:qh", opts, &li)) != -1) {
        bool ok = true;
        char *comma;
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'i':
            o->input = optarg;
            break;
        case 'o':
            o->output = optarg;
            break;
        case O_IDS:
            o->token_ids = true;
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
        case O_PAGE:
            ok = cli_parse_size(optarg, &o->page_bytes);
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
            ok = llmd_kv_type_parse(optarg, &o->kv_type) == 0;
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
            cli_bad_value("llmd batch", opts, c, li, optarg, batch_want(c));
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
    const char *why = cli_spec_check(o->spec, o->spec_tokens, o->spec_model);
    if (why) {
        fprintf(stderr, "llmd batch: %s\n", why);
        return CLI_USAGE;
    }
    if (!cli_check_batching("llmd batch", o->max_seqs, o->max_batched, o->spec))
        return CLI_USAGE;
    return CLI_OK;
}

static volatile sig_atomic_t batch_interrupted;

static void batch_on_sigint(int sig) {
    (void)sig;
    batch_interrupted = 1;
}

/* Append n bytes to r's text; false (r->oom set) when out of memory. */
static bool batch_text_add(struct batch_choice *r, const char *text, size_t n) {
    if (r->n_text + n + 1 > r->cap_text) {
        size_t cap = (r->n_text + n + 1) * 2;
        char *t = r->text ? mem_realloc(r->text, cap) : mem_alloc(MEM_CLI, cap);
        if (!t)
            return !(r->oom = true);
        r->text = t;
        r->cap_text = cap;
    }
    memcpy(r->text + r->n_text, text, n);
    r->n_text += n;
    r->text[r->n_text] = '\0';
    return true;
}

static bool batch_token_add(struct batch_choice *r, int32_t token) {
    if (r->n_tokens == r->cap_tokens) {
        uint32_t cap = r->cap_tokens ? r->cap_tokens * 2 : 64;
        int32_t *t = r->tokens ? mem_realloc(r->tokens, cap * sizeof(*t))
                               : mem_alloc(MEM_CLI, cap * sizeof(*t));
        if (!t)
            return !(r->oom = true);
        r->tokens = t;
        r->cap_tokens = cap;
    }
    r->tokens[r->n_tokens++] = token;
    return true;
}

/* Choices that finished with tokens in the step being run (they ran in it,
 * and are no longer counted as running after it): the summary's peak. */
static uint64_t batch_step_finished;

static void batch_on_token(void *user, uint64_t id, int32_t token, const char *text,
                           size_t text_len, enum llmd_finish finish) {
    (void)id;
    struct batch_choice *r = user;
    if (!r->oom && text_len)
        batch_text_add(r, text, text_len);
    if (!r->oom && r->r->want_tokens && token >= 0) /* every sampled id, an EOS included */
        batch_token_add(r, token);
    /* an EOS has no text, and OpenAI lists no logprob for it; the engine
     * filled f.lp for this choice's token just before this call */
    if (!r->oom && r->r->f.logprobs && token >= 0 && finish != LLMD_FINISH_EOS &&
        req_lp_push(&r->lp, r->r->e, &r->r->f.lp) < 0)
        r->oom = true;
    if (finish != LLMD_FINISH_NONE) {
        r->finish = finish;
        r->done = true;
        if (finish != LLMD_FINISH_CANCELLED && finish != LLMD_FINISH_ERROR)
            batch_step_finished++;
    }
}

/* on_prompt (echo with logprobs): the prompt's records, before the tokens'. */
static void batch_on_prompt(void *user, uint64_t id, uint32_t pos, int32_t token,
                            const struct llmd_logprobs *lp) {
    (void)id, (void)pos;
    struct batch_choice *r = user;
    if (!r->oom &&
        (lp ? req_lp_push(&r->lp, r->r->e, lp) : req_lp_push_first(&r->lp, r->r->e, token)) < 0)
        r->oom = true;
}

static const char *batch_finish_name(enum llmd_finish f) {
    switch (f) {
    case LLMD_FINISH_LENGTH:
    case LLMD_FINISH_CONTEXT:
        return "length";
    case LLMD_FINISH_STOP:
    case LLMD_FINISH_EOS:
        return "stop";
    case LLMD_FINISH_KV_BUDGET:
        return "kv_budget";
    case LLMD_FINISH_CANCELLED:
        return "cancelled";
    default:
        return "error";
    }
}

/* Fail r with err (copied). */
static void batch_fail(struct batch_req *r, const struct req_err *err) {
    r->failed = true;
    r->err = *err;
}

/* One non-blank input line: its bytes (in the input buffer) and its line
 * number in the file, for messages. */
struct batch_line {
    const char *p;
    size_t len;
    size_t lineno;
};

/* The lines of buf[0..len), blank ones skipped, into *out (caller frees with
 * mem_free). A NUL byte does not end a line (the JSON parser refuses it).
 * Returns 0, -ENOMEM. */

static int batch_split(const char *buf, size_t len, struct batch_line **out, size_t *n_out) {
    size_t n = 0, cap = 0, lineno = 0;
    struct batch_line *v = NULL;
    for (size_t at = 0; at < len;) {
        const char *p = buf + at, *nl = memchr(p, '\n', len - at);
        size_t l = nl ? (size_t)(nl - p) : len - at;
        at += l + 1;
        lineno++;
        size_t blank = 0;
        while (blank < l && strchr(" \t\r", p[blank]) && p[blank] != '\0')
            blank++;
        if (blank == l)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            struct batch_line *t =
                v ? mem_realloc(v, cap * sizeof(*v)) : mem_alloc(MEM_CLI, cap * sizeof(*v));
            if (!t) {
                mem_free(v);
                return -ENOMEM;
            }
            v = t;
        }
        v[n++] = (struct batch_line){p, l, lineno};
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* Named tenants seen so far: their scheduler ids are 0x80000000 + index. */
struct batch_tenants {
    char **names;
    uint32_t n, cap;
};

static int batch_tenant_named(struct batch_tenants *t, const char *name, uint32_t *id) {
    for (uint32_t i = 0; i < t->n; i++)
        if (strcmp(t->names[i], name) == 0) {
            *id = BATCH_NAMED_TENANT0 + i;
            return 0;
        }
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 8;
        char **v = t->names ? mem_realloc(t->names, cap * sizeof(*v))
                            : mem_alloc(MEM_CLI, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        t->names = v;
        t->cap = cap;
    }
    if (!(t->names[t->n] = mem_strdup(MEM_CLI, name)))
        return -ENOMEM;
    *id = BATCH_NAMED_TENANT0 + t->n++;
    return 0;
}

static void batch_tenants_free(struct batch_tenants *t) {
    for (uint32_t i = 0; i < t->n; i++)
        mem_free(t->names[i]);
    mem_free(t->names);
}

/* "tenant": absent (0), an integer id below 2^31, or a name; a name's
 * namespace ("\0tenant:" NAME, never 4 bytes long, so never an id's) goes
 * to r->ns. Returns 0, -EINVAL (err filled), -ENOMEM. */
static int batch_tenant(json_t *o, struct batch_tenants *ts, struct batch_req *r, uint32_t *tenant,
                        struct req_err *err) {
    json_t *v = req_get(o, "tenant");
    *tenant = 0;
    if (!v)
        return 0;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= (json_int_t)BATCH_NAMED_TENANT0)
            return req_err_set(err, "invalid_value", "tenant",
                               "'tenant' must be in [0, 2147483647], not %lld", (long long)x);
        *tenant = (uint32_t)x;
        return 0;
    }
    if (!json_is_string(v))
        return req_err_type(err, "tenant", "an integer id or a name");
    const char *name = json_string_value(v);
    if (!req_tenant_name_ok(name, json_string_length(v)))
        return req_err_value(err, "tenant",
                             "must be a name of 1 to 64 letters, digits, '_', '.' "
                             "or '-'");
    static const char pre[] = "\0tenant:";
    size_t n_pre = sizeof(pre) - 1, len = json_string_length(v);
    if (!(r->ns = mem_alloc(MEM_CLI, n_pre + len)))
        return -ENOMEM;
    memcpy(r->ns, pre, n_pre);
    memcpy(r->ns + n_pre, name, len);
    r->n_ns = n_pre + len;
    return batch_tenant_named(ts, name, tenant);
}

static const char *const batch_own_fields[] = {
    "id", "tenant", "model", "stream", "stream_options", "messages", NULL};

/* Fields of serve's requests that batch does not take: each refused saying why, not as a
 * typo. "stream": false (what every line is) passes. */
static int batch_refuse_serve_fields(json_t *in, struct req_err *err) {
    static const char *const why[][2] = {
        {"stream", "every line is answered whole"},
        {"stream_options", "every line is answered whole, with its usage"},
        {"model", "every line runs the -m model"},
        {"messages", "a line takes a 'prompt' (chat is serve's /v1/chat/completions)"},
    };
    for (size_t i = 0; i < sizeof(why) / sizeof(why[0]); i++) {
        json_t *v = req_get(in, why[i][0]);
        if (v && !(i == 0 && json_is_false(v)))
            return req_err_set(err, "unsupported_parameter", why[i][0],
                               "'%s' is not supported by llmd batch: %s", why[i][0], why[i][1]);
    }
    return 0;
}

/* Parse line `line` into r and submit it; what goes wrong is r's error,
 * never the batch's. Returns 0, or -EIO when the engine can run nothing
 * more (a step failed). */
static int batch_submit(struct llmd_engine *e, const struct batch_opts *o,
                        const struct llmd_engine_info *info, struct batch_tenants *ts,
                        const struct batch_line *line, struct batch_req *r) {
    struct req_err err;
    json_t *in = req_load(line->p, line->len, REQ_SRC_LINE, &err);
    if (!in) {
        batch_fail(r, &err);
        return 0;
    }
    json_t *id = req_get(in, "id");
    r->id = id ? json_incref(id) : NULL;
    r->want_tokens = o->token_ids;
    r->e = e;
    r->f = (struct req_fields){.max_tokens = (uint32_t)o->max_tokens, .top_p = 1.0f};
    const struct req_opts ro = {
        .n_ctx = info->n_ctx, .n_vocab = info->n_vocab, .strict = true, .own = batch_own_fields};
    uint32_t tenant = 0;
    struct llmd_request q;
    int rc = batch_tenant(in, ts, r, &tenant, &err);
    if (rc == 0)
        rc = batch_refuse_serve_fields(in, &err);
    if (rc == 0)
        rc = req_parse(in, &ro, &r->f, &err);
    if (rc == 0)
        rc = req_request(&r->f, tenant, r->ns, r->n_ns, &q);
    if (rc == 0 && !(r->c = mem_calloc(MEM_CLI, r->f.n, sizeof(*r->c))))
        rc = -ENOMEM;
    json_decref(in);
    if (rc == -ENOMEM)
        req_err_set(&err, "out_of_memory", NULL, "out of memory");
    if (rc < 0) {
        batch_fail(r, &err);
        return 0;
    }
    r->n_c = r->f.n;
    char *echo = NULL; /* the prompt's text, which an echo's text starts with */
    size_t n_echo = 0;
    if (r->f.echo && r->f.prompt) {
        echo = r->f.prompt;
        n_echo = r->f.prompt_len;
    } else if (r->f.echo && req_ids_text(e, r->f.ids, r->f.n_ids, &echo, &n_echo) < 0) {
        r->c[0].oom = true;
    }
    /* n choices: n requests of the one prompt, choice i with seed + i (as
     * serve does); the engine's prefix cache computes the prompt once */
    rc = 0;
    uint32_t k = 0;
    for (; k < r->n_c && rc == 0; k++) {
        struct batch_choice *c = &r->c[k];
        c->r = r;
        if (echo && !batch_text_add(c, echo, n_echo))
            c->oom = true;
        q.on_token = batch_on_token;
        q.user = c;
        q.on_prompt = r->f.echo && r->f.logprobs ? batch_on_prompt : NULL;
        q.usage = &c->usage;
        q.seed = req_choice_seed(&r->f, k);
        uint32_t retry = 0;
        /* admission control may refuse while the queue is long: run steps and retry */
        while ((rc = llmd_submit(e, &q, &c->engine_id, &retry)) == -EAGAIN)
            if (llmd_engine_step(e) < 0)
                break;
        c->submitted = rc == 0;
    }
    if (echo != r->f.prompt)
        mem_free(echo);
    if (rc == 0) {
        r->submitted = true;
        return 0;
    }
    /* one choice refused: the line is the error, its other choices stop */
    for (uint32_t i = 0; i < r->n_c; i++)
        if (r->c[i].submitted && !r->c[i].done)
            llmd_cancel(e, r->c[i].engine_id);
    req_err_submit(&err, rc, "prompt", r->c[k - 1].usage.prompt_tokens, info);
    if (rc == -ENOSPC)
        req_err_set(&err, "too_many_tenants", "tenant",
                    "the engine holds no more tenants (at most 64 at once)");
    batch_fail(r, &err);
    return rc == -EIO ? -EIO : 0;
}

/* After the run: a line one of whose choices did not finish cleanly gets
 * its error (the first such choice's). */
static void batch_finish_check(struct batch_req *r, const struct llmd_engine_info *info) {
    if (r->failed)
        return;
    struct req_err err;
    const struct batch_choice *c = NULL;
    for (uint32_t i = 0; r->submitted && i < r->n_c && !c; i++)
        if (r->c[i].oom || !r->c[i].done || r->c[i].finish == LLMD_FINISH_CANCELLED ||
            r->c[i].finish == LLMD_FINISH_ERROR || r->c[i].finish == LLMD_FINISH_KV_BUDGET)
            c = &r->c[i];
    if (!r->submitted) {
        req_err_set(&err, "engine_error", NULL,
                    "not run: the engine failed before this line was submitted");
    } else if (!c) {
        return;
    } else if (c->oom) {
        req_err_set(&err, "out_of_memory", NULL, "out of memory while collecting the output");
    } else if (!c->done || c->finish == LLMD_FINISH_CANCELLED) {
        req_err_set(&err, "cancelled", NULL, "the run was interrupted before this request ended");
    } else if (c->finish == LLMD_FINISH_ERROR) {
        req_err_set(&err, "engine_error", NULL, "the engine failed while running this request");
    } else {
        /* ran, but was cut short: the line keeps its text and says why */
        req_err_set(&err, "kv_budget", "max_tokens",
                    "stopped after %u tokens: the whole KV pool holds %u tokens for one sequence "
                    "(prompt and output) of the %u-token context (raise --kv-budget)",
                    c->usage.completion_tokens, info->max_seq_tokens, info->n_ctx);
        r->err = err;
        r->failed = true;
        return;
    }
    batch_fail(r, &err);
    r->submitted = false; /* the output line is the error alone */
}

static json_t *batch_err_json(const struct req_err *e) {
    return json_pack("{s:s, s:s, s:o, s:s}", "message", e->message, "type",
                     strcmp(e->code, "engine_error") == 0 || strcmp(e->code, "out_of_memory") == 0
                         ? "server_error"
                         : "invalid_request_error",
                     "param", e->param[0] ? json_string(e->param) : json_null(), "code", e->code);
}

/* The line's usage into o: the prompt once (choice 0's prompt, cached and
 * restored tokens), and completion_tokens (the choices' sum). */
static void batch_usage_json(json_t *o, const struct batch_req *r) {
    uint64_t sum = 0;
    for (uint32_t i = 0; i < r->n_c; i++)
        sum += r->c[i].usage.completion_tokens;
    json_object_set_new(o, "prompt_tokens", json_integer(r->c[0].usage.prompt_tokens));
    json_object_set_new(o, "completion_tokens", json_integer((json_int_t)sum));
    json_object_set_new(o, "cached_tokens", json_integer(r->c[0].usage.cached_tokens));
    json_object_set_new(o, "restored_tokens", json_integer(r->c[0].usage.restored_tokens));
}

/* The fields of one choice's output into o: text, finish_reason, then
 * (flat, n = 1) the line's usage or (in "choices") its completion_tokens,
 * and with --spec, --token-ids and logprobs theirs. Returns 0, -ENOMEM. */
static int batch_choice_json(json_t *o, const struct batch_req *r, const struct batch_choice *c,
                             bool spec) {
    json_object_set_new(o, "text", json_stringn(c->text ? c->text : "", c->n_text));
    json_object_set_new(o, "finish_reason", json_string(batch_finish_name(c->finish)));
    if (r->n_c == 1)
        batch_usage_json(o, r);
    else
        json_object_set_new(o, "completion_tokens", json_integer(c->usage.completion_tokens));
    if (spec) {
        json_object_set_new(o, "spec_draft_tokens", json_integer(c->usage.spec_draft_tokens));
        json_object_set_new(o, "spec_accepted_tokens", json_integer(c->usage.spec_accepted_tokens));
    }
    if (r->want_tokens) {
        json_t *ids = json_array();
        for (uint32_t i = 0; ids && i < c->n_tokens; i++)
            json_array_append_new(ids, json_integer(c->tokens[i]));
        json_object_set_new(o, "token_ids", ids);
    }
    if (r->f.logprobs) { /* /v1/completions' shape, as serve answers it */
        json_t *lp = json_object();
        size_t off = 0;
        if (lp && req_lp_completion(lp, c->lp.p, c->lp.n, &off) < 0) {
            json_decref(lp);
            lp = NULL;
        }
        if (!lp || json_object_set_new(o, "logprobs", lp) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* Write r's output line to out: one choice flat, n > 1 as "choices" (each
 * with its index) and the line's usage, the prompt counted once (choice
 * 0's prompt, cached and restored tokens) and completion tokens summed.
 * Returns 0 or -EIO (write error) / -ENOMEM. */
static int batch_print(FILE *out, const struct batch_req *r, size_t idx, bool spec) {
    json_t *o = json_object();
    if (!o)
        return -ENOMEM;
    json_object_set_new(o, "id", r->id ? json_incref(r->id) : json_integer((json_int_t)idx));
    int rc = 0;
    if (r->submitted && r->n_c == 1) {
        rc = batch_choice_json(o, r, &r->c[0], spec);
    } else if (r->submitted) {
        json_t *arr = json_array();
        for (uint32_t i = 0; arr && rc == 0 && i < r->n_c; i++) {
            json_t *c = json_pack("{s:I}", "index", (json_int_t)i);
            rc = c ? batch_choice_json(c, r, &r->c[i], spec) : -ENOMEM;
            if (rc == 0 && json_array_append_new(arr, c) < 0)
                rc = -ENOMEM;
        }
        if (!arr || json_object_set_new(o, "choices", arr) < 0)
            rc = -ENOMEM;
        batch_usage_json(o, r);
    }
    if (r->failed)
        json_object_set_new(o, "error", batch_err_json(&r->err));
    char *s = rc == 0 ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (!s)
        return -ENOMEM;
    rc = fputs(s, out) < 0 || fputc('\n', out) == EOF ? -EIO : 0;
    free(s); /* jansson's */
    return rc;
}

static void batch_summary(struct llmd_engine *e, size_t n, size_t n_failed, double secs,
                          uint64_t peak_running, const struct llmd_flush_counts *fc) {
    struct llmd_stats s;
    llmd_stats_get(e, &s);
    struct llmd_engine_info in;
    llmd_engine_info_get(e, &in);
    fprintf(stderr,
            "llmd batch: %zu line%s (%zu failed), %" PRIu64 " prompt + %" PRIu64
            " generated tokens in %.2f s (%.1f tok/s generated; every choice counts its prompt)\n"
            "  prefill %" PRIu64 " tokens, prefix hits %" PRIu64 " tokens (%" PRIu64
            " restored from tiers), %" PRIu64 " preemptions\n",
            n, n == 1 ? "" : "s", n_failed, s.prompt_tokens_total, s.generated_tokens_total, secs,
            secs > 0 ? (double)s.generated_tokens_total / secs : 0.0, s.prefill_tokens_total,
            s.prefix_hit_tokens_total, s.restored_tokens_total, s.preemptions_total);
    fprintf(stderr,
            "  KV %s, %" PRIu64 " B a token, %" PRIu64 " page%s of %" PRIu64 " B; at most %" PRIu64
            " sequence%s running at once (%.1f tok/s in all)\n",
            llmd_kv_type_name(in.kv_type), in.kv_token_bytes, in.kv_pages,
            in.kv_pages == 1 ? "" : "s", in.page_bytes, peak_running, peak_running == 1 ? "" : "s",
            secs > 0 ? (double)(s.prefill_tokens_total + s.generated_tokens_total) / secs : 0.0);
    if (in.spec_model)
        fprintf(stderr, "  draft model %s: %" PRIu64 " B of each token's KV\n", in.spec_model,
                in.kv_draft_token_bytes);
    if (s.spec_steps_total)
        fprintf(stderr,
                "  speculative: %" PRIu64 " drafted, %" PRIu64 " accepted (%.0f%%), %.2f accepted "
                "per verifying step, %" PRIu64 " steps\n",
                s.spec_draft_tokens_total, s.spec_accepted_tokens_total,
                100.0 * (double)s.spec_accepted_tokens_total / (double)s.spec_draft_tokens_total,
                (double)s.spec_accepted_tokens_total / (double)s.spec_steps_total, s.steps_total);
    else if (in.spec != LLMD_SPEC_NONE) { /* say why there is nothing to count */
        fprintf(stderr,
                "  speculative: nothing drafted: no draft found, or none worth its cost to the "
                "length policy (a step of n tokens: %.1f us + n * %.1f us",
                in.spec_step_fixed_ns / 1e3, in.spec_step_token_ns / 1e3);
        if (in.spec_model)
            fprintf(stderr, "; a draft pass: %.1f us + n * %.1f us", in.spec_draft_fixed_ns / 1e3,
                    in.spec_draft_token_ns / 1e3);
        fprintf(stderr, ")\n");
    }
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
    if (fc) { /* what really reached the disk, not what was meant to */
        char lost[96] = "";
        if (fc->lost)
            snprintf(lost, sizeof lost, ", %u lost (the disk is full, or a write failed)",
                     fc->lost);
        fprintf(stderr,
                "  at exit: %u cached pages written to the NVMe tier, %u already there%s; it holds "
                "%" PRIu64 " pages for the next run\n",
                fc->written, fc->present, lost, fc->nvme_pages);
    }
}

/* Run every line to its output; returns the exit status. */
static int batch_run(const struct batch_opts *o, struct llmd_engine *e, struct batch_line *lines,
                     struct batch_req *rq, size_t n, FILE *out) {
    struct llmd_engine_info info;
    llmd_engine_info_get(e, &info);
    struct batch_tenants ts = {0};
    int status = CLI_OK, rc = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = batch_submit(e, o, &info, &ts, &lines[i], &rq[i]);
    /* Ctrl-C: cancel what is left, print what finished, and close the
     * engine properly (an NVMe tier gets the cached pages) */
    struct sigaction sa = {.sa_handler = batch_on_sigint}, old_sa;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    /* sequences running at once: those running after each step, and those
     * the step finished (a line that ends in its prefill step included) */
    uint64_t peak = 0;
    while (rc == 0 && !batch_interrupted &&
           (batch_step_finished = 0, rc = llmd_engine_step(e)) >= 0) {
        struct llmd_stats st;
        llmd_stats_get(e, &st);
        uint64_t ran = st.requests_running + batch_step_finished;
        peak = ran > peak ? ran : peak;
        if (rc == 0)
            break;
        rc = 0;
    }
    if (batch_interrupted) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++)
            for (uint32_t k = 0; rq[i].submitted && k < rq[i].n_c; k++)
                if (!rq[i].c[k].done && llmd_cancel(e, rq[i].c[k].engine_id) == 0)
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
    size_t n_failed = 0;
    for (size_t i = 0; i < n; i++) {
        batch_finish_check(&rq[i], &info);
        if (rq[i].failed) {
            n_failed++;
            if (!o->quiet)
                fprintf(stderr, "llmd batch: line %zu: %s\n", lines[i].lineno, rq[i].err.message);
        }
        if (batch_print(out, &rq[i], i, info.spec != LLMD_SPEC_NONE) < 0 && status != CLI_ERR) {
            fprintf(stderr, "llmd batch: cannot write %s: %s\n", o->output ? o->output : "stdout",
                    strerror(errno ? errno : EIO));
            status = CLI_ERR;
        }
    }
    if (n_failed && status == CLI_OK)
        status = CLI_PARTIAL;
    /* the NVMe tier gets the cached pages now (close would), so the summary
     * can say what was written */
    struct llmd_flush_counts fc;
    bool flushed = info.nvme_tier_bytes && llmd_engine_flush(e, &fc) == 0;
    if (!o->quiet)
        batch_summary(e, n, n_failed,
                      (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
                      peak, flushed ? &fc : NULL);
    batch_tenants_free(&ts);
    return status;
}

int cli_batch(int argc, char **argv) {
    struct batch_opts o;
    int rc = batch_parse(argc, argv, &o);
    if (rc != CLI_OK) {
        mem_free(o.nvme_path);
        return rc < 0 ? CLI_OK : rc;
    }
    struct batch_line *lines = NULL;
    struct batch_req *rq = NULL;
    size_t n = 0;
    struct llmd_engine *e = NULL;
    FILE *out = stdout;
    char *buf = NULL;
    size_t len = 0;
    int status = CLI_ERR;
    if ((rc = cli_read_file(o.input ? o.input : "-", CLI_BATCH_FILE_MAX, &buf, &len)) < 0) {
        cli_read_file_err("llmd batch", "a batch", o.input ? o.input : "-", CLI_BATCH_FILE_MAX, rc);
        goto done;
    }
    if (batch_split(buf, len, &lines, &n) < 0 ||
        (n && !(rq = mem_calloc(MEM_CLI, n, sizeof(*rq))))) {
        fprintf(stderr, "llmd batch: out of memory\n");
        goto done;
    }
    if (o.output && strcmp(o.output, "-") != 0 && !(out = fopen(o.output, "w"))) {
        fprintf(stderr, "llmd batch: cannot write %s: %s\n", o.output, strerror(errno));
        out = stdout;
        goto done;
    }
    struct llmd_engine_config cfg = {
        .model = o.model,
        .n_threads = (int)o.threads,
        .n_ctx = (uint32_t)o.ctx,
        .max_seqs = (uint32_t)o.max_seqs,
        .max_batched_tokens = (uint32_t)o.max_batched,
        .kv_budget_bytes = o.kv_budget,
        .page_bytes = o.page_bytes,
        .host_tier_bytes = o.host_tier,
        .nvme_tier_path = o.nvme_path,
        .nvme_tier_bytes = o.nvme_bytes,
        .offload_always = o.offload_always,
        .prefix_secret = o.secret,
        .kv_type = o.kv_type,
        .device = o.cuda ? LLMD_DEVICE_CUDA : LLMD_DEVICE_CPU,
        .device_index = o.cuda_index,
        .spec = (enum llmd_spec)o.spec,
        .spec_tokens = (uint32_t)o.spec_tokens,
        .spec_model_path = o.spec_model,
        .tokenizer_pre = o.pre,
    };
    char err[512] = "";
    if ((rc = llmd_engine_open(&cfg, &e, err, sizeof err)) < 0) {
        cli_engine_err("llmd batch", err, rc);
        goto done;
    }
    {
        struct llmd_engine_info in;
        llmd_engine_info_get(e, &in);
        cli_ctx_note("llmd batch", in.n_ctx, in.n_ctx_train);
        cli_kv_caps_note("llmd batch", o.page_bytes, in.page_bytes, in.tokens_per_page, o.kv_budget,
                         in.kv_pages, in.n_ctx, in.max_seqs);
    }
    status = batch_run(&o, e, lines, rq, n, out);
    if (fflush(out) != 0 || ferror(out)) {
        fprintf(stderr, "llmd batch: cannot write %s: %s\n", o.output ? o.output : "stdout",
                strerror(errno ? errno : EIO));
        status = CLI_ERR;
    }
done:
    llmd_engine_close(e); /* with an NVMe tier: cached prefixes go down to it */
    if (out != stdout && fclose(out) != 0 && status != CLI_ERR) {
        fprintf(stderr, "llmd batch: cannot write %s: %s\n", o.output, strerror(errno));
        status = CLI_ERR;
    }
    for (size_t i = 0; rq && i < n; i++) {
        json_decref(rq[i].id);
        req_fields_free(&rq[i].f);
        mem_free(rq[i].ns);
        for (uint32_t k = 0; k < rq[i].n_c; k++) {
            req_lp_buf_free(&rq[i].c[k].lp);
            mem_free(rq[i].c[k].text);
            mem_free(rq[i].c[k].tokens);
        }
        mem_free(rq[i].c);
    }
    mem_free(rq);
    mem_free(lines);
    mem_free(buf);
    mem_free(o.nvme_path);
    return status;
}
