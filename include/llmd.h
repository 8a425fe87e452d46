/* llmd.h - the embedding API: one engine serving many requests at once.
 *
 * Model: an engine loads one model (GGUF path or "dummy:SHAPE"), keeps its
 * KV cache in vmm pages (one contiguous virtual range per running sequence),
 * and runs continuous batching: each llmd_engine_step() runs one flattened
 * forward pass over the decode tokens of running requests and prefill chunks
 * of new ones, chosen by the scheduler (per-tenant queues, weighted fair
 * sharing, admission by free KV pages, preemption by recompute). Greedy
 * output does not depend on what else was in the batch.
 *
 * Workflow:
 *   llmd_engine_open(&cfg, &e, err, sizeof err);
 *   llmd_submit(e, &req, &id, &retry_after);     // any number, between steps
 *   while (llmd_engine_step(e) > 0) {}           // tokens arrive in req.on_token
 *   llmd_engine_close(e);
 *
 * Thread safety: none yet. Every call on one engine comes from one thread
 * (the caller's serving loop); on_token runs on that thread, inside
 * llmd_engine_step() or llmd_cancel(), and must not call back into the
 * engine: llmd_submit(), llmd_cancel() and llmd_engine_step() called from
 * on_token return -EBUSY and change nothing (llmd_engine_close() from it is
 * undefined). Distinct engines are independent. Errors are 0 / -errno.
 */
#ifndef LLMD_H
#define LLMD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct llmd_engine;

/* The KV cache's element type (docs/kv-quant.md has the layouts and the
 * measured quality). Every type runs on the CPU and with the CUDA device;
 * the quantized ones on CUDA are compiled but not yet run on a GPU
 * (docs/kv-quant.md, "CUDA"). Bytes per element, scales included: */
enum llmd_kv_type {
    LLMD_KV_F16 = 0,  /* 2 */
    LLMD_KV_F32 = 1,  /* 4 */
    LLMD_KV_Q8_0 = 2, /* int8 + an f16 scale per 32 values (GGUF Q8_0): 1.0625 */
    LLMD_KV_Q4_0 = 3, /* 4-bit + an f16 scale per 32 (GGUF Q4_0) after a Hadamard rotation
                       * of each head: 0.5625 */
    LLMD_KV_FP8 = 4,  /* FP8 E4M3 + an f32 scale per token and head: 1 + 4 / head_dim */
};

/* "f16", "f32", "q8_0", "q4_0", "fp8" ("?" for another value). Static; any
 * thread. */
const char *llmd_kv_type_name(enum llmd_kv_type t);

/* The type llmd_kv_type_name() calls `name`. Returns 0, -EINVAL (unknown;
 * *out untouched). Any thread. */
int llmd_kv_type_parse(const char *name, enum llmd_kv_type *out);

/* Where the forward pass runs and the KV pages live. LLMD_DEVICE_CUDA needs a
 * `make cuda` build and an NVIDIA GPU with virtual memory management
 * (docs/cuda.md); llmd_engine_open() fails with -ENOTSUP, saying which is
 * missing, otherwise. */
enum llmd_device { LLMD_DEVICE_CPU = 0, LLMD_DEVICE_CUDA = 1 };

/* Speculative decoding (docs/engine.md): each decoding request proposes up
 * to spec_tokens tokens, the step verifies them in its one batched forward
 * pass and commits the longest prefix the model agrees with plus the
 * model's own next token. Lossless: greedy output is the same token ids as
 * without it; with temperature > 0 the output has the same distribution
 * (rejection sampling). LLMD_SPEC_NGRAM drafts by prompt lookup: the
 * tokens that followed the latest earlier occurrence of the request's last
 * few tokens in its own prompt and output. LLMD_SPEC_DRAFT drafts with a
 * second, smaller model of the same vocabulary (spec_model_path), greedily,
 * all speculating requests as one batch per draft position; its KV sits in
 * the target's pages, beside the target's KV of each token. */
enum llmd_spec { LLMD_SPEC_NONE = 0, LLMD_SPEC_NGRAM = 1, LLMD_SPEC_DRAFT = 2 };
#define LLMD_SPEC_TOKENS_MAX 32 /* the longest draft (spec_tokens) */

struct llmd_engine_config {
    const char *model;           /* GGUF path or "dummy:SHAPE[:TYPE]"; borrowed for open */
    int n_threads;               /* CPU threads; <= 0: all online CPUs */
    uint32_t n_ctx;              /* tokens per sequence; 0: the model's context_length */
    uint32_t max_seqs;           /* sequences running at once; 0: 8 */
    uint32_t max_batched_tokens; /* tokens per step; 0: 256 */
    uint32_t max_chunk_tokens;   /* prefill tokens of one request per step; 0: no cap */
    uint64_t kv_budget_bytes;    /* physical KV memory; 0: max_seqs full contexts */
    uint64_t page_bytes;         /* KV page size; 0: 16 tokens (rounded up, see vmm.h) */
    enum llmd_kv_type kv_type;   /* a value outside the enum: -EINVAL; a quantized type with
                                  * LLMD_DEVICE_CUDA and n_head_kv * head_dim > 12288:
                                  * -ENOTSUP (the CUDA store's row limit) */
    uint64_t max_queue_wait_ns;  /* refuse requests predicted to wait longer; 0: never */
    int no_prefix_cache;         /* 1: do not reuse KV pages of earlier prompts */
    const char *prefix_secret;   /* file with the prefix-cache HMAC key; NULL: the
                                  * LLMD_PFX_SECRET environment variable, else with an
                                  * NVMe tier the key file nvme_tier_path + ".key"
                                  * beside it (made on first use, mode 0600; refused
                                  * when group or others may read it), else a random
                                  * key per process (cached prefixes then do not
                                  * survive a restart) */
    /* Tiers below the device pool (docs/offload.md); need the prefix cache. */
    uint64_t host_tier_bytes;    /* pinned host memory for cold KV pages; 0: none */
    const char *nvme_tier_path;  /* slot file for the NVMe tier (its index is PATH.idx,
                                  * its default key PATH.key); NULL: none. Needs a host
                                  * tier. Cached prefixes survive a restart with the
                                  * same model, key and path. Borrowed for open. */
    uint64_t nvme_tier_bytes;    /* NVMe tier size; 0: 4 GiB */
    int offload_always;          /* 1: keep every cold page the tiers can hold; 0: only
                                  * where restoring beats recomputing (measured) */
    int no_map_ahead;            /* 1: no map-ahead thread: a decode token that starts a
                                  * new KV page maps it on the step's path (counted in
                                  * llmd_stats.decode_map_waits_total). 0 (default): a
                                  * background thread maps each decoding sequence's next
                                  * page and one spare ahead of need */
    enum llmd_device device;     /* LLMD_DEVICE_CPU (default) or LLMD_DEVICE_CUDA: weights
                                  * uploaded once, KV pages in CUDA VMM memory,
                                  * kv_budget_bytes then counts device memory */
    int device_index;            /* CUDA device ordinal (LLMD_DEVICE_CUDA) */
    enum llmd_spec spec;         /* LLMD_SPEC_NONE (default): no speculative decoding */
    uint32_t spec_tokens;        /* longest draft, 1..LLMD_SPEC_TOKENS_MAX; 0: 8; ignored
                                  * with LLMD_SPEC_NONE (a config may switch speculation
                                  * off and keep it; the CLIs refuse --spec-tokens alone,
                                  * a typing mistake there). Each
                                  * request's draft length adapts below it to how much
                                  * of its drafts the model accepts, down to 0 */
    int spec_fixed_len;          /* 1: every draft runs to spec_tokens when the text has
                                  * that many (no adaptation, no cost rule): for tests and
                                  * for measuring the policy against */
    const char *spec_model_path; /* LLMD_SPEC_DRAFT (required there, -EINVAL elsewhere):
                                  * the draft model, a GGUF path or "dummy:SHAPE[:TYPE]";
                                  * borrowed for open. Refused (-EINVAL, errbuf naming
                                  * the first difference) unless its vocabulary is the
                                  * target's: the same size, token strings and EOS. Its
                                  * KV takes kv_draft_token_bytes more of every token's
                                  * slot (the same KV type), so a page holds fewer
                                  * tokens. CPU only: -ENOTSUP with LLMD_DEVICE_CUDA */
    /* KV-cache events for KV-aware routers, in vLLM's format (docs/kv-events.md): every
     * block (full page) the device pool ("GPU"), the host tier ("CPU") or the NVMe tier
     * ("DISK") starts or stops holding, on a ZeroMQ PUB socket. Needs the prefix cache
     * (-EINVAL with no_prefix_cache). Strings borrowed for open. */
    const char *kv_events_endpoint;        /* NULL: none. Bound when it holds '*' or "::" or
                                            * is ipc:// or inproc://, else connected (as vLLM) */
    const char *kv_events_replay_endpoint; /* ROUTER (bound) answering replay requests from a
                                            * sequence number; NULL: none */
    const char *kv_events_topic;           /* first frame of each batch; NULL: "" */
    int kv_events_no_token_ids;            /* 1: token_ids empty (do not expose prompts) */
    const char *tokenizer_pre; /* split text with this pre-tokenizer ("gpt-2", "llama-bpe",
                                * "qwen2") instead of the file's tokenizer.ggml.pre: for a
                                * family llmd does not know by name that splits as one of
                                * those (docs/tokenizers.md). NULL: the file's; an unknown
                                * one is refused. Borrowed for open */
};

enum llmd_finish {
    LLMD_FINISH_NONE = 0,  /* more tokens follow */
    LLMD_FINISH_LENGTH,    /* max_tokens reached */
    LLMD_FINISH_STOP,      /* a stop string matched; it is not in the text */
    LLMD_FINISH_EOS,       /* the model's end-of-sequence token, or one of the request's
                            * stop_token_ids (its text is not returned) */
    LLMD_FINISH_CONTEXT,   /* the context is full */
    LLMD_FINISH_CANCELLED, /* llmd_cancel() */
    LLMD_FINISH_ERROR,     /* the engine could not continue this request */
    LLMD_FINISH_KV_BUDGET, /* prompt + output reached what the whole KV pool holds
                            * (llmd_engine_info.max_seq_tokens), short of the context:
                            * kv_budget_bytes is smaller than one context. Not max_tokens
                            * and not the model's limit: raise the budget or ask for less */
};

/* One generated token: `text` is the UTF-8 the client may show now (whole
 * characters; bytes that may start a stop string are held back), borrowed
 * for the call. The last call for a request has finish != NONE (its token
 * may be -1 when nothing was sampled, e.g. on cancel). */
typedef void (*llmd_token_fn)(void *user, uint64_t id, int32_t token, const char *text,
                              size_t text_len, enum llmd_finish finish);

/* Log-probabilities of one sampled token (OpenAI's `logprobs`): natural logs
 * of the model's raw next-token distribution, log_softmax(logits) over the
 * whole vocabulary, before temperature, top-k/top-p/min-p and any other
 * processing (vLLM's default, "raw logprobs"), so they do not depend on the
 * sampling parameters; computed in double, stored as f32. Finite always: a
 * logprob below LLMD_LOGPROB_FLOOR (a -inf logit, or an underflow) reads as
 * the floor. top[] holds the n_top most likely tokens, most likely first,
 * equal logprobs by lower id; so top[0] is the greedy token, and a greedy
 * request's token has top[0]'s logprob, >= every other. */
#define LLMD_TOP_LOGPROBS_MAX 20       /* the most alternatives (OpenAI's limit) */
#define LLMD_LOGPROB_FLOOR    -9999.0f /* the smallest logprob reported */
struct llmd_token_logprob {
    int32_t token;
    float logprob; /* natural log, in [LLMD_LOGPROB_FLOOR, 0] */
};
struct llmd_logprobs {
    struct llmd_token_logprob chosen;                     /* the token sampled */
    uint32_t n_top;                                       /* the request's top_logprobs */
    struct llmd_token_logprob top[LLMD_TOP_LOGPROBS_MAX]; /* [n_top], most likely first */
};

/* The prompt's log-probabilities (OpenAI's `echo` with `logprobs`): called
 * once for each prompt position pos = 0 .. n_prompt - 1, in order, with lp
 * the logprobs (as llmd_logprobs above, the request's top_logprobs
 * alternatives) of prompt token `token` at pos given the tokens before it;
 * lp is NULL for position 0 (nothing precedes it). Borrowed for the call; on the
 * engine thread inside llmd_engine_step(), every one before the request's
 * first on_token; the rules of on_token apply (no call back into the
 * engine). */
typedef void (*llmd_prompt_fn)(void *user, uint64_t id, uint32_t pos, int32_t token,
                               const struct llmd_logprobs *lp);

/* Per-request counts, filled in by the engine as the request runs (at
 * admission and at every token); final when on_token reports a finish. */
struct llmd_usage {
    uint32_t prompt_tokens;        /* after tokenization, BOS included */
    uint32_t cached_tokens;        /* prompt tokens taken from the prefix cache at the
                                    * (last) admission, restored ones included */
    uint32_t restored_tokens;      /* of which brought back from a host/NVMe tier */
    uint32_t completion_tokens;    /* tokens generated (returned: what a finish inside a
                                    * verified run dropped is not counted) */
    uint32_t spec_draft_tokens;    /* speculative tokens proposed and verified */
    uint32_t spec_accepted_tokens; /* of which accepted and returned (in completion_tokens) */
    uint64_t queue_ns;             /* llmd_submit() to the first admission; 0 before it */
};

/* One request. A field left 0 (a zeroed struct) is "not set" and takes the
 * default noted; llmd serve, batch and generate take these fields with the
 * ranges of docs/serving.md ("Request fields", engine/serve/req.c), which
 * refuse an explicit 0 where it would read as something else (top_p,
 * max_tokens). */
struct llmd_request {
    const char *prompt; /* UTF-8 text (copied; BOS is added if the model wants it,
                         * so "" is the prompt BOS alone, as llama2.c) ... */
    size_t prompt_len;
    const int32_t *prompt_ids; /* ... or token ids (copied; no BOS is added) */
    uint32_t n_prompt_ids;
    uint32_t max_tokens; /* 0: up to the context limit */
    float temperature;   /* <= 0: greedy */
    int top_k;           /* 0: off */
    float top_p;         /* 0 or >= 1: off */
    float min_p;         /* 0: off */
    uint64_t seed;
    const char *const *stop; /* [n_stop] stop strings (copied), at most 8 */
    uint32_t n_stop;
    uint32_t tenant;      /* queue, fair share, and the prefix-cache namespace */
    int32_t priority;     /* higher runs first */
    const void *cache_ns; /* prefix-cache namespace bytes instead of the tenant's
                           * (copied): chosen by the SERVER (a shared scope both
                           * tenants opted into, or tenant + cache_salt), never
                           * taken from a client on trust */
    size_t cache_ns_len;
    llmd_token_fn on_token; /* required */
    void *user;
    struct llmd_usage *usage;       /* optional, caller-owned: filled as described above;
                                     * must stay valid until the final on_token */
    int no_speculative;             /* 1: never speculate for this request (an engine with
                                     * spec = LLMD_SPEC_NONE never does) */
    struct llmd_logprobs *logprobs; /* optional, caller-owned: when set, filled with the
                                     * token's log-probabilities before every on_token call
                                     * whose token is >= 0 (an EOS included), on the same
                                     * thread; read it inside on_token (the next call
                                     * overwrites it); must stay valid until the final
                                     * on_token. NULL: none computed (no cost) */
    uint32_t top_logprobs;          /* alternatives in logprobs->top[], 0..
                                     * LLMD_TOP_LOGPROBS_MAX (more: -EINVAL); needs logprobs
                                     * or on_prompt */
    llmd_prompt_fn on_prompt;       /* optional: the prompt's logprobs (above). Every prompt
                                     * position is computed for it: the request neither uses
                                     * nor fills the prefix cache. Costs a step's prefill
                                     * tokens * n_vocab * 4 bytes of logits, allocated at
                                     * the first such submission (-ENOMEM) */
    int prompt_only; /* 1: compute the prompt and sample nothing (a log-likelihood, with
                      * on_prompt): the one on_token call is the finish, token -1,
                      * LLMD_FINISH_LENGTH, completion_tokens 0; max_tokens is ignored */
    /* Logit processing before sampling (engine/model/smp.h has the order): the bias,
     * then the penalties. The logprobs stay the raw model's. NaN or infinite: -EINVAL. */
    float presence_penalty;        /* OpenAI's: a token generated before loses this; 0: off */
    float frequency_penalty;       /* OpenAI's: a token loses this times its generated count */
    float repetition_penalty;      /* vLLM's and llama.cpp's (CTRL), over the prompt's and the
                                    * generated tokens: a positive logit divided by it, a
                                    * negative one multiplied; 0 or 1: off; < 0: -EINVAL */
    const int32_t *logit_bias_ids; /* [n_logit_bias] token ids (copied; one outside the
                                    * vocabulary: -EINVAL) ... */
    const float *logit_bias;       /* [n_logit_bias] ... and what is added to their logits */
    uint32_t n_logit_bias;
    int ignore_eos;                /* 1: the model's EOS token does not end the request
                                    * (it is generated as a token with no text) */
    const int32_t *stop_token_ids; /* [n_stop_token_ids] (copied): sampling one ends the
                                    * request with LLMD_FINISH_EOS; at most
                                    * LLMD_STOP_TOKEN_IDS_MAX (more: -EINVAL) */
    uint32_t n_stop_token_ids;
};
#define LLMD_STOP_TOKEN_IDS_MAX 16

/* Can this build and machine run an engine on `device` (index: the CUDA
 * ordinal)? Cheap next to a model load (for CUDA: loads the driver, opens the
 * device, checks virtual memory management), so a caller can refuse a bad
 * --device before loading gigabytes. llmd_engine_open() calls it first.
 * Returns 0; -ENOTSUP (a build without CUDA, no driver, no device, no VMM:
 * errbuf says which), -EINVAL (an unknown device or ordinal). Any thread. */
int llmd_device_check(enum llmd_device device, int index, char *errbuf, size_t errlen);

/* Load the model and create the KV pool and scheduler. errbuf (may be NULL)
 * gets a one-line reason. Returns 0, -EINVAL (bad config or model file),
 * -ENOTSUP (unsupported model), -ENOENT, -ENOMEM. Caller closes with
 * llmd_engine_close(). */
int llmd_engine_open(const struct llmd_engine_config *cfg, struct llmd_engine **out, char *errbuf,
                     size_t errlen);

/* Finish nothing, free everything; pending requests get no callback. With an
 * NVMe tier, first what llmd_engine_flush() does. NULL ok. */
void llmd_engine_close(struct llmd_engine *e);

struct llmd_flush_counts {
    uint32_t written;    /* cached pages written to the NVMe tier by this flush */
    uint32_t present;    /* cached pages the tier held already (restored from it, or
                          * written earlier): nothing to write */
    uint32_t lost;       /* cached pages no tier kept: the tier's disk was full, or a
                          * write failed */
    uint64_t nvme_pages; /* pages the tier holds afterwards: what a restart can find */
};

/* With an NVMe tier: write every unreferenced cached KV page (the device
 * pool's and the host tier's) down to it and wait for the writes, whatever
 * the spill policy says (offload_always off drops a page whose restore is
 * measured slower than its recompute; here the alternative is losing it, and
 * the next run restores what it finds). The device's cached pages are
 * evicted; running requests keep theirs. llmd_engine_close() does the same;
 * call this first to learn what was written (*out, may be NULL). Returns 0,
 * -ENOTSUP (no NVMe tier), -EBUSY (called from on_token). Blocks on I/O. */
int llmd_engine_flush(struct llmd_engine *e, struct llmd_flush_counts *out);

/* What an open engine runs with, every default of the config resolved: the
 * values a user should be shown (a 0 in llmd_engine_config is never one). */
struct llmd_engine_info {
    uint32_t n_ctx;          /* tokens per sequence: the context */
    uint32_t n_ctx_train;    /* the model's context_length (what it was trained for; n_ctx
                              * may exceed it) */
    uint32_t max_seq_tokens; /* tokens one sequence can reach: n_ctx, or fewer when the
                              * whole KV pool holds fewer (LLMD_FINISH_KV_BUDGET) */
    uint32_t max_seqs, max_batched_tokens;
    uint32_t max_chunk_tokens;  /* 0: no cap */
    uint32_t tokens_per_page;   /* KV tokens in one page */
    uint64_t kv_token_bytes;    /* one token's K and V of every layer as stored: the token
                                 * stride (kv_type's layout, padded to 64 B); with a draft
                                 * model its KV too (kv_draft_token_bytes of it) */
    uint64_t page_bytes;        /* one KV page, as rounded (whole tokens, host pages) */
    uint64_t kv_pages;          /* pages in the pool */
    uint64_t kv_budget_bytes;   /* kv_pages * page_bytes: the physical KV memory */
    uint64_t max_queue_wait_ns; /* 0: never refuse */
    uint64_t host_tier_bytes;   /* 0: no host tier */
    uint64_t nvme_tier_bytes;   /* 0: no NVMe tier */
    /* KV pages each tier can hold (0: no such tier): the host tier's entries
     * (the budget asked for, in pages, plus one), or fewer when its region
     * (host_tier_bytes, rounded up to 2 MiB) fits fewer (an upper bound: the
     * allocator's rounding may fit fewer still); the NVMe tier's slots */
    uint64_t host_tier_pages_max, nvme_tier_pages_max;
    uint32_t n_vocab;
    uint32_t sliding_window; /* <arch>.attention.sliding_window: keys a query attends to,
                              * counting itself; 0: the whole context */
    int n_threads;           /* CPU threads of the forward pass */
    enum llmd_kv_type kv_type;
    enum llmd_device device;
    int device_index;
    int prefix_cache, map_ahead, offload_always; /* 1: on */
    enum llmd_spec spec;
    uint32_t spec_tokens;          /* the longest draft; 0 without speculation */
    const char *spec_model;        /* LLMD_SPEC_DRAFT: the draft model's name (its file name
                                    * without .gguf, or the dummy spec); valid until
                                    * llmd_engine_close(); NULL otherwise */
    uint64_t kv_draft_token_bytes; /* bytes of kv_token_bytes that hold the draft model's KV
                                    * (0: no draft model) */
    uint64_t spec_step_fixed_ns, spec_step_token_ns;   /* the draft-length policy's cost model:
                                                        * a step of n tokens takes fixed + n *
                                                        * token ns, probed at open and fitted
                                                        * to the steps since (0: none) */
    uint64_t spec_draft_fixed_ns, spec_draft_token_ns; /* LLMD_SPEC_DRAFT: the same for one
                                                        * pass of the draft model (0: none
                                                        * or not measured) */
    const char *prefix_key; /* the prefix-cache key's source: "file" (prefix_secret),
                             * "env" (LLMD_PFX_SECRET), "tier" (the key file beside
                             * the NVMe tier), "random", or "none" (no prefix cache);
                             * static */
    /* the model, as generate's summary names it */
    const char *model_name; /* its file name without .gguf, or the dummy spec; valid until
                             * llmd_engine_close() */
    uint32_t n_layer, n_embd, n_head, n_head_kv;
    uint64_t weight_bytes;    /* its weights as loaded (before any repacking) */
    uint64_t packed_bytes;    /* host memory of the copies the CPU kernels repack matrices
                               * into at load, beside the mapped weights (kernels/kern.h:
                               * q4_0, q4_K and q5_K at the avx2 and avx-vnni levels; q8_0,
                               * q4_0, q4_K, q5_K and q6_K at avx512 and amx); 0: none */
    const char *weight_types; /* the file's matrices (tensors of 2 or more dimensions)
                               * per type, most first: "17 q3_K, 10 q4_K, 1 q6_K"; valid
                               * until llmd_engine_close() */
    uint64_t copied_bytes;    /* host memory of the matrices the loader copies as they are
                               * (from the avx2 level up, every matrix it does not pack, onto
                               * huge pages, where the kernels read them faster than from
                               * the file's mapping; not the token embedding, whose rows are
                               * looked up from the file); 0: none */
};

/* Fill *out. Same thread rule as llmd_stats_get. */
void llmd_engine_info_get(const struct llmd_engine *e, struct llmd_engine_info *out);

/* Queue a request. *id names it in callbacks and llmd_cancel(). Returns 0,
 * -EINVAL (bad fields, no prompt tokens, no on_token), -E2BIG (the prompt
 * leaves no room for a token: it is llmd_engine_info.max_seq_tokens or longer,
 * so it does not fit the context, or the whole KV pool when that is smaller),
 * -EAGAIN (refused by admission control: retry after *retry_after_s seconds;
 * HTTP 429), -ENOMEM, -EBUSY (called from on_token), -EIO (a step failed: the
 * engine runs nothing more). No callback on failure; r->usage, when given,
 * then holds only prompt_tokens (0 when the prompt was never tokenized), so a
 * caller can say how long a refused prompt was.
 * n samples of one prompt (OpenAI's n): submit n requests with seeds
 * seed, seed + 1, ...; with the prefix cache on, the later ones wait until
 * the first has cached the prompt's full pages and share them (each
 * computes its partial last page: docs/prefix-cache.md "Holds"). */
int llmd_submit(struct llmd_engine *e, const struct llmd_request *r, uint64_t *id,
                uint32_t *retry_after_s);

/* Cancel a queued or running request: its pages return to the pool now and
 * on_token is called once with LLMD_FINISH_CANCELLED. Returns 0, -ENOENT,
 * -EBUSY (called from on_token). */
int llmd_cancel(struct llmd_engine *e, uint64_t id);

/* The bytes of vocabulary token `token` as the model's text has them (an SPM
 * word boundary as ' ', a byte token <0xNN> as the byte NN, so a piece may
 * be part of a UTF-8 character; control tokens such as EOS as ""): what
 * OpenAI's logprobs call a token's `bytes`. Writes min(cap, *n) bytes, no
 * NUL; *n is the piece's length, also on -ENOSPC. Returns 0, -EINVAL (token
 * outside the vocabulary), -ENOSPC (cap too small). Reads only the immutable
 * vocabulary: any thread, and from on_token. */
int llmd_token_bytes(const struct llmd_engine *e, int32_t token, char *buf, size_t cap, size_t *n);

/* Set a tenant's share of prefill tokens (weight >= 1; weighted fair
 * queuing by deficit round robin) and its priority ceiling (requests'
 * priorities are capped at it). Tenants not set get weight 1 and no
 * ceiling. Takes effect at the next step. Returns 0, -EINVAL (weight 0),
 * -ENOSPC (too many tenants), -ENOMEM. */
int llmd_tenant_set(struct llmd_engine *e, uint32_t tenant, uint32_t weight, int32_t max_priority);

/* Keep at most max_pages cached prefix pages of `tenant` (its least recently
 * used unreferenced pages are evicted first when it inserts past the limit;
 * UINT32_MAX: no limit, the default). Returns 0, -ENOTSUP (prefix cache off),
 * -ENOSPC (too many tenants), -ENOMEM. */
int llmd_tenant_retention(struct llmd_engine *e, uint32_t tenant, uint32_t max_pages);

/* Run one step: plan, run the batch, sample, call on_token. Returns the
 * number of requests still queued or running (0: idle), or -errno when the
 * step could not run (the requests in it were finished with
 * LLMD_FINISH_ERROR), -EBUSY when called from on_token. */
int llmd_engine_step(struct llmd_engine *e);

struct llmd_stats {
    uint64_t requests_waiting, requests_running;
    uint64_t prompt_tokens_total, generated_tokens_total;
    uint64_t preemptions_total, refusals_total, steps_total;
    uint64_t prefill_tokens_total;    /* prompt tokens computed (recompute included) */
    uint64_t prefix_hit_tokens_total; /* prompt tokens taken from the prefix cache */
    /* tokens looked up in the prefix cache: at each admission (again after a
     * preemption) of a request that uses it, its tokens to compute; the
     * denominator of prefix_hit_tokens_total */
    uint64_t prefix_query_tokens_total;
    uint64_t kv_pages_total, kv_pages_cached, kv_page_bytes;
    uint64_t kv_token_bytes;         /* constant: llmd_engine_info.kv_token_bytes */
    uint64_t kv_draft_token_bytes;   /* constant: llmd_engine_info.kv_draft_token_bytes */
    uint64_t kv_draft_bytes;         /* gauge: the draft model's share of the pages in use
                                      * (mapped or cached): their token slots times
                                      * kv_draft_token_bytes (0 without a draft model) */
    uint64_t kv_type;                /* constant: the enum llmd_kv_type in use */
    uint64_t kv_pages_free;          /* free, counting the pages mapped ahead (they hold no token
                                      * and are taken back as soon as a sequence needs one) */
    uint64_t kv_pages_ahead;         /* gauge: pages mapped ahead of need, of kv_pages_free */
    uint64_t decode_map_waits_total; /* steps in which some decode token's KV grow had to
                                      * map a page itself (map-ahead off, behind, or the
                                      * pool short); steps_total is the denominator */
    /* tiers below the device (all 0 without them) */
    uint64_t restored_tokens_total; /* prompt tokens restored from a tier, not prefilled */
    uint64_t host_tier_pages, host_tier_bytes_used, nvme_tier_pages;
    uint64_t spills_host_total, spills_nvme_total;     /* pages moved down into each tier */
    uint64_t restores_host_total, restores_nvme_total; /* pages brought back from each */
    uint64_t spill_bytes_host_total, spill_bytes_nvme_total;
    uint64_t restore_bytes_host_total, restore_bytes_nvme_total;
    uint64_t offload_drops_total;             /* cold pages no tier kept (recomputed) */
    uint64_t offload_write_failures_total;    /* NVMe writes failed or short */
    uint64_t offload_checksum_failures_total; /* NVMe reads refused by the checksum */
    double host_tier_bw_bytes_per_s, nvme_read_bw_bytes_per_s, prefill_tokens_per_s;
    /* speculative decoding (all 0 without it) */
    uint64_t spec_steps_total;           /* decode entries that carried a draft */
    uint64_t spec_draft_tokens_total;    /* draft tokens verified */
    uint64_t spec_accepted_tokens_total; /* of which accepted and returned */
    uint64_t spec_rollback_pages_total;  /* KV pages that only rejected draft tokens had
                                          * filled, returned to the pool by the rollback */
    uint64_t spec_accepted_len[LLMD_SPEC_TOKENS_MAX + 1]; /* verifications by the draft
                                                           * tokens they accepted */
    /* KV-cache events (all 0 without them) */
    uint64_t kv_events_total;               /* block events queued */
    uint64_t kv_events_dropped_total;       /* refused past the queue's high-water mark (a
                                             * snapshot of every held block replaced them) */
    uint64_t kv_event_batches_total;        /* batches published (sequence numbers used) */
    uint64_t kv_window_dropped_pages_total; /* pages a sliding window's front let go: the
                                             * oldest pages of a sequence no later token
                                             * attends to, unmapped from its range */
    uint64_t cpu_solo_periods_total;        /* times the CPU thread pool went single-threaded for a
                                             * while because its own thread kept being preempted
                                             * (more runnable threads than CPUs; kernels/kern.h) */
};

void llmd_stats_get(const struct llmd_engine *e, struct llmd_stats *out);

/* Wait until the background work the last step posted (the map-ahead
 * thread's mappings) is done. Steps never need it; tests and benchmarks call
 * it between steps to make a run's counters deterministic. Same thread rule
 * as llmd_engine_step. */
void llmd_engine_sync(struct llmd_engine *e);

/* Walk the engine's invariants: the KV pool's (vmm_check), the scheduler's
 * (sched_check), and that no sequence maps fewer pages than it needs.
 * Returns 1 when they hold, 0 (after logging the first violation) when not.
 * O(pages + requests); for tests. Same thread rule as llmd_engine_step. */
int llmd_engine_check(const struct llmd_engine *e);

/* The device KV pool as text, one character a page, 64 a line, each line
 * ending in '\n': '.' free, 'a' mapped ahead of need by the map-ahead thread
 * (no token in it yet; kv_pages_free counts it), 'M' mapped by one
 * sequence, '2'..'9' shared by that many, '+' more, 'C' cached (prefix
 * cache, unmapped), 'S' spilling, 'R' restoring. NUL-terminated in buf[len]. Returns 0, -ENOSPC
 * (truncated; n_pages + n_pages/64 + 1 bytes always suffice). Same thread rule as llmd_stats_get.
 */
int llmd_pool_map(const struct llmd_engine *e, char *buf, size_t len);

/* The device pages of running request `id`'s sequence, in token order:
 * pages[0..min(n, max)); returns n (>= 0), -ENOENT (not running: waiting,
 * finished or unknown). With a sliding window the pages its front left
 * read UINT32_MAX. Same thread rule as llmd_stats_get. */
int llmd_request_pages(const struct llmd_engine *e, uint64_t id, uint32_t *pages, uint32_t max);

struct llmd_purge_counts {
    uint32_t device_pages; /* cached pages dropped from the device pool's index */
    uint32_t host_pages;   /* host-tier copies zeroed and freed */
    uint32_t nvme_pages;   /* NVMe slots punched or zeroed */
};

/* Remove every cached prefix page of `tenant` from the device pool and every
 * tier below it: no later lookup of its prompts hits, its NVMe slots no
 * longer hold its data, and each page goes to the eviction log. Pages still
 * mapped by its running requests stay readable by them only; its requests
 * alive at the call (running or waiting) add nothing more to the cache, and
 * waiting requests drop pinned hits on purged pages (they prefill those
 * instead). Returns 0,
 * -ENOTSUP (prefix cache off), -EBUSY (called from on_token). */
int llmd_tenant_purge(struct llmd_engine *e, uint32_t tenant, struct llmd_purge_counts *out);

enum llmd_tier { LLMD_TIER_DEVICE = 0, LLMD_TIER_HOST, LLMD_TIER_NVME, LLMD_TIER_NONE };

/* The chain hashes (32 bytes each: the prefix cache's block hashes, the
 * KV-cache events' block_hashes) of every block `tier` holds: the first
 * min(n, max) in hashes[] (NULL with max 0 to count). Returns n (>= 0),
 * -EINVAL (not DEVICE, HOST or NVME), -ENOTSUP (the prefix cache is off). Same thread
 * rule as llmd_stats_get. */
int llmd_kv_blocks(const struct llmd_engine *e, enum llmd_tier tier, uint8_t (*hashes)[32],
                   uint32_t max);

/* One move of a KV page between tiers (spill, restore, drop, purge). */
struct llmd_eviction {
    uint64_t seq;     /* 1, 2, ...: the read cursor */
    uint64_t time_ns; /* CLOCK_REALTIME */
    uint8_t hash[8];  /* first bytes of the page's prefix hash */
    uint32_t page;    /* device page, or UINT32_MAX */
    uint32_t tenant;
    uint32_t bytes;     /* bytes copied (0 for a drop or a purge; an NVMe purge is one
                         * event for all of the tenant's slots, hash 0) */
    uint8_t from, to;   /* enum llmd_tier; to = NONE: dropped */
    const char *reason; /* "evict", "demote", "hit", "policy", "fault", "purge"; static */
};

/* Read the eviction log forward from *cursor (0 at first): up to max events
 * newer than it, oldest first; *cursor moves past them. A cursor past the
 * newest event (kept across an engine restart, whose log numbers from 1
 * again) reads as 0. *lost (may be NULL)
 * gets how many events the ring overwrote before this read. Returns the
 * count (0 without tiers). The ONE call that any thread may make while
 * another drives the engine (it takes the log's own lock). */
uint32_t llmd_evictions_read(struct llmd_engine *e, uint64_t *cursor, struct llmd_eviction *out,
                             uint32_t max, uint64_t *lost);

#ifdef __cplusplus
}
#endif

#endif /* LLMD_H */
