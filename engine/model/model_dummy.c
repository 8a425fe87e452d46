/* model_dummy.c - random-weight Llama GGUF images (see model_dummy.h).
 *
 * Weight types follow llama-quantize (llama.cpp c392e50, src/llama-quant.cpp
 * llama_tensor_get_type, for the llama architecture without experts or an
 * importance matrix), so a dummy file is what quantizing its f32 twin would
 * give: the K mixes pick types per tensor, and rows that are not whole
 * blocks fall back as llama-quantize does, except that llmd has no q5_0,
 * q5_1 or iq4_nl (its first fallbacks for Q4_K, Q5_K and Q2_K/Q3_K), so those
 * rows become q8_0 (or f16 when not whole 32-blocks either,
 * llama-quantize's last resort).
 * Quantization is kern_quantize_row_* (ggml's reference quantizers).
 */
#include "engine/model/model_dummy.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "engine/model/gguf.h"
#include "engine/model/gguf_write.h"
#include "kernels/kern.h"
#include "mem.h"

struct dummy_shape {
    const char *name;
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
};

static const struct dummy_shape dummy_shapes[] = {
    {"tiny", 2, 64, 4, 2, 128, 512, 512},
    {"tiny-256", 4, 256, 4, 2, 768, 1024, 512},
    {"dummy-100m", 6, 512, 8, 4, 1376, 32000, 4096},
    {"dummy-1g", 16, 1536, 12, 4, 4096, 32000, 4096},
    {"llama3-8b-2l", 2, 4096, 32, 8, 14336, 128256, 8192},
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192},
};

const char *model_dummy_shapes(void) {
    return "tiny, tiny-256, dummy-100m, dummy-1g, llama3-8b-2l, llama3-8b";
}

/* splitmix64: a fast, seedable stream; quality is ample for random weights */
static uint64_t dummy_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a of a tensor name, so each tensor has its own stream */
static uint64_t dummy_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* What the spec's type names: one type for every matrix, or one of
 * llama-quantize's mixes (its ftype Q2_K, "Q2_K - Medium", which llmd calls
 * q2_k_m beside the q2_k of every matrix; Q3_K_M, Q4_K_M or Q5_K_M). */
enum dummy_mix { DUMMY_ONE, DUMMY_Q2_K_M, DUMMY_Q3_K_M, DUMMY_Q4_K_M, DUMMY_Q5_K_M };
struct dummy_types {
    enum gguf_ttype base; /* every matrix, or the mix's default type */
    enum dummy_mix mix;
};

static const struct {
    const char *name;
    enum gguf_ttype base;
    enum dummy_mix mix;
} dummy_type_names[] = {
    {"f32", GGUF_T_F32, DUMMY_ONE},        {"f16", GGUF_T_F16, DUMMY_ONE},
    {"q8_0", GGUF_T_Q8_0, DUMMY_ONE},      {"q4_0", GGUF_T_Q4_0, DUMMY_ONE},
    {"q2_k", GGUF_T_Q2_K, DUMMY_ONE},      {"q3_k", GGUF_T_Q3_K, DUMMY_ONE},
    {"q4_k", GGUF_T_Q4_K, DUMMY_ONE},      {"q5_k", GGUF_T_Q5_K, DUMMY_ONE},
    {"q6_k", GGUF_T_Q6_K, DUMMY_ONE},      {"q2_k_m", GGUF_T_Q2_K, DUMMY_Q2_K_M},
    {"q3_k_m", GGUF_T_Q3_K, DUMMY_Q3_K_M}, {"q4_k_m", GGUF_T_Q4_K, DUMMY_Q4_K_M},
    {"q5_k_m", GGUF_T_Q5_K, DUMMY_Q5_K_M},
};

static const char *const dummy_archs[] = {"llama",  "qwen2", "qwen3",
                                          "llama3", "phi3",  "mistral-swa"};
#define DUMMY_N_ARCH 6
#define DUMMY_SWA    32 /* phi3's sliding window, tokens */

const char *model_dummy_archs(void) {
    return "llama, qwen2, qwen3, llama3, phi3, mistral-swa";
}

/* Llama 3.1's RoPE scaling as its reference code defines it (Meta's
 * llama-models, apply_scaling: factor 8, low/high frequency factors 1 and
 * 4, original context 8192) and llama.cpp's converter stores it: per pair,
 * the factor its frequency is divided by (1 for short wavelengths, 8 for
 * long ones, a smooth blend between). */
static void dummy_llama3_freqs(float *ff, uint32_t n_rot, float base) {
    const double factor = 8, lo = 1, hi = 4, old_ctx = 8192;
    for (uint32_t i = 0; i < n_rot / 2; i++) {
        double freq = 1.0 / pow(base, 2.0 * i / n_rot), wavelen = 2 * M_PI / freq;
        if (wavelen < old_ctx / hi) {
            ff[i] = 1.0f;
        } else if (wavelen > old_ctx / lo) {
            ff[i] = (float)factor;
        } else {
            double smooth = (old_ctx / wavelen - lo) / (hi - lo);
            ff[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

/* The type named by t[0..tlen) (any case) into *types; false if none. */
static bool dummy_find_type(const char *t, size_t tlen, struct dummy_types *types) {
    for (size_t i = 0; i < sizeof(dummy_type_names) / sizeof(dummy_type_names[0]); i++)
        if (strlen(dummy_type_names[i].name) == tlen &&
            strncasecmp(t, dummy_type_names[i].name, tlen) == 0) {
            *types = (struct dummy_types){dummy_type_names[i].base, dummy_type_names[i].mix};
            return true;
        }
    return false;
}

static int dummy_parse(const char *spec, const struct dummy_shape **shape,
                       struct dummy_types *types, int *arch, char *errbuf, size_t errlen) {
    const char *colon = strchr(spec, ':');
    *arch = 0;
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    *shape = NULL;
    for (size_t i = 0; i < sizeof(dummy_shapes) / sizeof(dummy_shapes[0]); i++)
        if (strlen(dummy_shapes[i].name) == nlen && strncmp(dummy_shapes[i].name, spec, nlen) == 0)
            *shape = &dummy_shapes[i];
    if (!*shape) {
        snprintf(errbuf, errlen, "dummy: unknown shape '%.*s' (known: %s)", (int)nlen, spec,
                 model_dummy_shapes());
        return -EINVAL;
    }
    const char *t = colon ? colon + 1 : (strcmp((*shape)->name, "tiny") == 0 ? "f32" : "f16");
    const char *colon2 = strchr(t, ':'); /* SHAPE:TYPE:ARCH */
    size_t tlen = colon2 ? (size_t)(colon2 - t) : strlen(t);
    if (colon2) {
        *arch = -1;
        for (int a = 0; a < DUMMY_N_ARCH; a++)
            if (strcmp(colon2 + 1, dummy_archs[a]) == 0)
                *arch = a;
        if (*arch < 0) {
            snprintf(errbuf, errlen, "dummy: unknown architecture '%s' (%s)", colon2 + 1,
                     model_dummy_archs());
            return -EINVAL;
        }
    }
    if (dummy_find_type(t, tlen, types))
        return 0;
    snprintf(errbuf, errlen, "dummy: unknown weight type '%.*s' (%s)", (int)tlen, t,
             model_dummy_types());
    return -EINVAL;
}

const char *model_dummy_types(void) {
    return "f32, f16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, q2_k_m, q3_k_m, q4_k_m, q5_k_m";
}

/* llama-quantize's use_more_bits(i_layer, n_layers): the first and last
 * eighth of the layers and every third one between get more bits. */
static bool dummy_more_bits(uint32_t il, uint32_t n_layer) {
    return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

/* The type of matrix `kind` ("token_embd", "output", "attn_q", ...) of
 * layer il, rows of n_in. The mixes as llama_tensor_get_type for the llama
 * architecture (no experts, not 70B, not Falcon): output Q6_K; for Q4_K_M
 * and Q5_K_M attn_v and ffn_down Q6_K in the layers dummy_more_bits()
 * picks; for Q3_K_M attn_v Q5_K in layers 0-1 and Q4_K after, ffn_down
 * Q5_K in the first n_layer / 16 layers and Q4_K after, attn_output Q4_K;
 * for Q2_K attn_v Q4_K when n_gqa (query heads a KV head) >= 4, else
 * Q3_K, ffn_down and attn_output Q3_K; a fused attn_qkv (phi3) Q4_K, Q5_K
 * or Q6_K in Q3_K_M, Q4_K_M or Q5_K_M; everything else, the embedding
 * included, the mix's default type. Then the row fallback. */
static enum gguf_ttype dummy_wtype(const struct dummy_types *ty, const char *kind, uint32_t il,
                                   uint32_t n_layer, uint32_t n_gqa, uint32_t n_in) {
    enum gguf_ttype t = ty->base;
    if (ty->mix != DUMMY_ONE && strcmp(kind, "output") == 0) {
        t = n_in % 256 ? GGUF_T_Q8_0 : GGUF_T_Q6_K; /* ggml_blck_size of the K types = 256 */
    } else if (ty->mix == DUMMY_Q2_K_M) {
        if (strcmp(kind, "attn_v") == 0)
            t = n_gqa >= 4 ? GGUF_T_Q4_K : GGUF_T_Q3_K;
        else if (strcmp(kind, "ffn_down") == 0 || strcmp(kind, "attn_output") == 0)
            t = GGUF_T_Q3_K;
    } else if (ty->mix == DUMMY_Q3_K_M) {
        if (strcmp(kind, "attn_v") == 0)
            t = il < 2 ? GGUF_T_Q5_K : GGUF_T_Q4_K;
        else if (strcmp(kind, "ffn_down") == 0)
            t = il < n_layer / 16 ? GGUF_T_Q5_K : GGUF_T_Q4_K;
        else if (strcmp(kind, "attn_output") == 0)
            t = GGUF_T_Q4_K;
    } else if (ty->mix != DUMMY_ONE) {
        if ((strcmp(kind, "attn_v") == 0 || strcmp(kind, "ffn_down") == 0) &&
            dummy_more_bits(il, n_layer))
            t = GGUF_T_Q6_K;
    }
    if (strcmp(kind, "attn_qkv") == 0) /* after the rest, as llama_tensor_get_type's branch */
        t = ty->mix == DUMMY_Q3_K_M   ? GGUF_T_Q4_K
            : ty->mix == DUMMY_Q4_K_M ? GGUF_T_Q5_K
            : ty->mix == DUMMY_Q5_K_M ? GGUF_T_Q6_K
                                      : t;
    if (n_in % gguf_type_block(t) == 0)
        return t;
    /* llama-quantize: Q2_K, Q3_K -> iq4_nl, Q4_K -> q5_0, Q5_K -> q5_1, Q6_K -> q8_0, legacy
     * types (which it refuses) and then anything not of 32-blocks -> f16 */
    return n_in % 32 == 0 ? GGUF_T_Q8_0 : GGUF_T_F16;
}

int model_dummy_wtype(const char *type, const char *kind, uint32_t il, uint32_t n_layer,
                      uint32_t n_gqa, uint32_t n_in) {
    struct dummy_types ty;
    if (!dummy_find_type(type, strlen(type), &ty))
        return -1;
    return (int)dummy_wtype(&ty, kind, il, n_layer, n_gqa, n_in);
}

/* The tensors' data, owned until the image is written. */
struct dummy_build {
    struct gguf_writer *w;
    void **bufs;
    size_t n_bufs, cap_bufs;
    char **names; /* token strings */
    uint32_t n_names;
};

static int dummy_keep(struct dummy_build *b, void *p) {
    if (b->n_bufs == b->cap_bufs) {
        size_t cap = b->cap_bufs ? 2 * b->cap_bufs : 64;
        void **nb = mem_realloc(b->bufs, cap * sizeof(*nb));
        if (!nb)
            return -ENOMEM;
        b->bufs = nb;
        b->cap_bufs = cap;
    }
    b->bufs[b->n_bufs++] = p;
    return 0;
}

/* Add a tensor of shape {n_in, n_out} (n_out = 1 for vectors) of type
 * `type` (rows of whole blocks: dummy_wtype()) with values uniform in
 * +-scale (or all `fill` when scale is 0). */
static int dummy_tensor(struct dummy_build *b, const char *name, enum gguf_ttype type,
                        uint32_t n_in, uint32_t n_out, float scale, float fill, uint64_t seed) {
    uint64_t row_bytes = gguf_type_bytes(type, n_in);
    void *data = mem_alloc(MEM_MODEL, row_bytes * n_out);
    float *row = mem_alloc(MEM_MODEL, (size_t)n_in * sizeof(float));
    if (!data || !row || dummy_keep(b, data) < 0) {
        mem_free(data);
        mem_free(row);
        return -ENOMEM;
    }
    uint64_t s = seed ^ dummy_hash(name);
    for (uint32_t r = 0; r < n_out; r++) {
        for (uint32_t i = 0; i < n_in; i++) {
            double u = (double)(dummy_next(&s) >> 11) * (1.0 / 9007199254740992.0);
            row[i] = scale == 0.0f ? fill : (float)((2.0 * u - 1.0) * scale);
        }
        char *dst = (char *)data + r * row_bytes;
        switch (type) {
        case GGUF_T_F32:
            memcpy(dst, row, n_in * sizeof(float));
            break;
        case GGUF_T_F16:
            kern_f32_to_f16((uint16_t *)dst, row, (int)n_in);
            break;
        case GGUF_T_Q8_0:
            kern_quantize_row_q8_0(row, dst, (int)n_in);
            break;
        case GGUF_T_Q4_0:
            kern_quantize_row_q4_0(row, dst, (int)n_in);
            break;
        case GGUF_T_Q2_K:
            kern_quantize_row_q2_K(row, dst, (int)n_in);
            break;
        case GGUF_T_Q3_K:
            kern_quantize_row_q3_K(row, dst, (int)n_in);
            break;
        case GGUF_T_Q4_K:
            kern_quantize_row_q4_K(row, dst, (int)n_in);
            break;
        case GGUF_T_Q5_K:
            kern_quantize_row_q5_K(row, dst, (int)n_in);
            break;
        case GGUF_T_Q6_K:
            kern_quantize_row_q6_K(row, dst, (int)n_in);
            break;
        default: /* dummy_wtype() returns none other */
            break;
        }
    }
    mem_free(row);
    uint64_t ne[2] = {n_in, n_out};
    return gguf_writer_add_tensor(b->w, name, type, n_out == 1 ? 1 : 2, ne, data);
}

static int dummy_vocab(struct dummy_build *b, const struct dummy_shape *sh) {
    uint32_t n = sh->n_vocab;
    b->names = mem_calloc(MEM_MODEL, n, sizeof(char *));
    float *scores = mem_alloc(MEM_MODEL, n * sizeof(float));
    int32_t *types = mem_alloc(MEM_MODEL, n * sizeof(int32_t));
    if (!b->names || !scores || !types || dummy_keep(b, scores) < 0) {
        mem_free(scores);
        mem_free(types);
        return -ENOMEM;
    }
    if (dummy_keep(b, types) < 0) {
        mem_free(types);
        return -ENOMEM;
    }
    b->n_names = n;
    for (uint32_t i = 0; i < n; i++) {
        char s[32];
        if (i == 0)
            snprintf(s, sizeof(s), "<unk>");
        else if (i == 1)
            snprintf(s, sizeof(s), "<s>");
        else if (i == 2)
            snprintf(s, sizeof(s), "</s>");
        else if (i < 259)
            snprintf(s, sizeof(s), "<0x%02X>", i - 3);
        else if (i == 259)
            snprintf(s, sizeof(s), "\xe2\x96\x81"); /* "▁": a space is one token */
        else
            snprintf(s, sizeof(s), "\xe2\x96\x81w%u", i); /* "▁w<i>" */
        b->names[i] = mem_strdup(MEM_MODEL, s);
        if (!b->names[i])
            return -ENOMEM;
        scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    int rc;
    if ((rc = gguf_writer_set_str(b->w, "tokenizer.ggml.model", "llama")) ||
        (rc = gguf_writer_set_arr_str(b->w, "tokenizer.ggml.tokens", (const char *const *)b->names,
                                      NULL, n)) ||
        (rc = gguf_writer_set_arr(b->w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, n)) ||
        (rc = gguf_writer_set_arr(b->w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, n)) ||
        (rc = gguf_writer_set_u32(b->w, "tokenizer.ggml.bos_token_id", 1)) ||
        (rc = gguf_writer_set_u32(b->w, "tokenizer.ggml.eos_token_id", 2)) ||
        (rc = gguf_writer_set_u32(b->w, "tokenizer.ggml.unknown_token_id", 0)))
        return rc;
    return 0;
}

/* arch: 0 llama, 1 qwen2 (Q/K/V biases, uniform in +-0.5), 2 qwen3 (per-head
 * Q/K norms, uniform in +-1, and head_dim twice n_embd / n_head, through
 * qwen3.attention.key_length, so that the attention width is not n_embd),
 * 3 llama3: llama with Llama 3's RoPE base (500000) and 3.1's scaling
 * (rope_freqs.weight), 4 phi3: Q/K/V and gate/up fused (blk.N.attn_qkv,
 * blk.N.ffn_up of 2 * n_ff rows) and a sliding window of DUMMY_SWA tokens
 * on every layer (phi3.attention.sliding_window), 5 mistral-swa: llama with
 * that window (llama.attention.sliding_window, as Mistral 7B v0.1 had; a key
 * llama.cpp ignores on llama, so phi3 is the oracle's). */
static int dummy_build(struct dummy_build *b, const struct dummy_shape *sh,
                       const struct dummy_types *ty, int arch) {
    int rc;
    const uint64_t seed = 0x6c6c6d64; /* "llmd" */
    uint32_t hd = sh->n_embd / sh->n_head * (arch == 2 ? 2 : 1);
    const char *a = arch == 3 || arch == 5 ? "llama" : dummy_archs[arch];
    const float rope_base = arch == 3 ? 500000.0f : 10000.0f;
    char k[11][64];
    static const char *const suffix[11] = {
        "context_length",       "embedding_length",        "block_count",
        "feed_forward_length",  "attention.head_count",    "attention.head_count_kv",
        "rope.dimension_count", "rope.freq_base",          "attention.layer_norm_rms_epsilon",
        "attention.key_length", "attention.sliding_window"};
    for (int i = 0; i < 11; i++)
        snprintf(k[i], sizeof(k[i]), "%s.%s", a, suffix[i]);
    if ((rc = gguf_writer_create(&b->w)) ||
        (rc = gguf_writer_set_str(b->w, "general.architecture", a)) ||
        (rc = gguf_writer_set_str(b->w, "general.name", sh->name)) ||
        (rc = gguf_writer_set_u32(b->w, k[0], sh->n_ctx)) ||
        (rc = gguf_writer_set_u32(b->w, k[1], sh->n_embd)) ||
        (rc = gguf_writer_set_u32(b->w, k[2], sh->n_layer)) ||
        (rc = gguf_writer_set_u32(b->w, k[3], sh->n_ff)) ||
        (rc = gguf_writer_set_u32(b->w, k[4], sh->n_head)) ||
        (rc = gguf_writer_set_u32(b->w, k[5], sh->n_head_kv)) ||
        (rc = gguf_writer_set_u32(b->w, k[6], hd)) ||
        (rc = gguf_writer_set_f32(b->w, k[7], rope_base)) ||
        (rc = gguf_writer_set_f32(b->w, k[8], 1e-5f)) ||
        (arch == 2 && (rc = gguf_writer_set_u32(b->w, k[9], hd))) ||
        (arch == 2 && (rc = gguf_writer_set_u32(b->w, "qwen3.attention.value_length", hd))) ||
        ((arch == 4 || arch == 5) && (rc = gguf_writer_set_u32(b->w, k[10], DUMMY_SWA))) ||
        (rc = dummy_vocab(b, sh)))
        return rc;
    float s_embd = sqrtf(3.0f / (float)sh->n_embd), s_ff = sqrtf(3.0f / (float)sh->n_ff);
    uint32_t q_dim = sh->n_head * hd, kv_dim = sh->n_head_kv * hd, nl = sh->n_layer;
#define DUMMY_T(kind, il, n_in) dummy_wtype(ty, kind, il, nl, sh->n_head / sh->n_head_kv, n_in)
    if ((rc = dummy_tensor(b, "token_embd.weight", DUMMY_T("token_embd", 0, sh->n_embd), sh->n_embd,
                           sh->n_vocab, 1.0f, 0, seed)) ||
        (rc = dummy_tensor(b, "output_norm.weight", GGUF_T_F32, sh->n_embd, 1, 0, 1.0f, seed)) ||
        (rc = dummy_tensor(b, "output.weight", DUMMY_T("output", 0, sh->n_embd), sh->n_embd,
                           sh->n_vocab, s_embd, 0, seed)))
        return rc;
    if (arch == 3) {
        float *ff = mem_alloc(MEM_MODEL, hd / 2 * sizeof(float));
        if (!ff || dummy_keep(b, ff) < 0) {
            mem_free(ff);
            return -ENOMEM;
        }
        dummy_llama3_freqs(ff, hd, rope_base);
        if ((rc = gguf_writer_add_tensor(b->w, "rope_freqs.weight", GGUF_T_F32, 1,
                                         (const uint64_t[]){hd / 2}, ff)))
            return rc;
    }
    for (uint32_t il = 0; il < nl; il++) {
        char n[64];
#define DUMMY_NAME(suffix) (snprintf(n, sizeof(n), "blk.%u." suffix ".weight", il), n)
        /* phi3: Q/K/V in one matrix, gate and up in one; the others apart */
        bool fused = arch == 4;
        uint32_t qkv_rows = fused ? q_dim + 2 * kv_dim : q_dim,
                 up_rows = (fused ? 2 : 1) * sh->n_ff;
        if ((rc =
                 dummy_tensor(b, DUMMY_NAME("attn_norm"), GGUF_T_F32, sh->n_embd, 1, 0, 1, seed)) ||
            (rc = dummy_tensor(b, fused ? DUMMY_NAME("attn_qkv") : DUMMY_NAME("attn_q"),
                               DUMMY_T(fused ? "attn_qkv" : "attn_q", il, sh->n_embd), sh->n_embd,
                               qkv_rows, s_embd, 0, seed)) ||
            (!fused &&
             (rc = dummy_tensor(b, DUMMY_NAME("attn_k"), DUMMY_T("attn_k", il, sh->n_embd),
                                sh->n_embd, kv_dim, s_embd, 0, seed))) ||
            (!fused &&
             (rc = dummy_tensor(b, DUMMY_NAME("attn_v"), DUMMY_T("attn_v", il, sh->n_embd),
                                sh->n_embd, kv_dim, s_embd, 0, seed))) ||
            (rc = dummy_tensor(b, DUMMY_NAME("attn_output"), DUMMY_T("attn_output", il, q_dim),
                               q_dim, sh->n_embd, sqrtf(3.0f / (float)q_dim), 0, seed)) ||
            (rc = dummy_tensor(b, DUMMY_NAME("ffn_norm"), GGUF_T_F32, sh->n_embd, 1, 0, 1, seed)) ||
            (!fused &&
             (rc = dummy_tensor(b, DUMMY_NAME("ffn_gate"), DUMMY_T("ffn_gate", il, sh->n_embd),
                                sh->n_embd, sh->n_ff, s_embd, 0, seed))) ||
            (rc = dummy_tensor(b, DUMMY_NAME("ffn_up"), DUMMY_T("ffn_up", il, sh->n_embd),
                               sh->n_embd, up_rows, s_embd, 0, seed)) ||
            (rc = dummy_tensor(b, DUMMY_NAME("ffn_down"), DUMMY_T("ffn_down", il, sh->n_ff),
                               sh->n_ff, sh->n_embd, s_ff, 0, seed)))
            return rc;
        for (int j = 0; arch == 1 && j < 3; j++) { /* qwen2: f32 biases */
            snprintf(n, sizeof(n), "blk.%u.%s.bias", il,
                     (const char *[]){"attn_q", "attn_k", "attn_v"}[j]);
            if ((rc = dummy_tensor(b, n, GGUF_T_F32, j ? kv_dim : q_dim, 1, 0.5f, 0, seed)))
                return rc;
        }
        if (arch == 2 &&
            ((rc = dummy_tensor(b, DUMMY_NAME("attn_q_norm"), GGUF_T_F32, hd, 1, 1.0f, 0, seed)) ||
             (rc = dummy_tensor(b, DUMMY_NAME("attn_k_norm"), GGUF_T_F32, hd, 1, 1.0f, 0, seed))))
            return rc;
#undef DUMMY_NAME
    }
#undef DUMMY_T
    return 0;
}

static void dummy_free(struct dummy_build *b) {
    gguf_writer_destroy(b->w);
    for (size_t i = 0; i < b->n_bufs; i++)
        mem_free(b->bufs[i]);
    mem_free(b->bufs);
    for (uint32_t i = 0; b->names && i < b->n_names; i++)
        mem_free(b->names[i]);
    mem_free(b->names);
}

int model_dummy_write_mem(const char *spec, void **buf, size_t *len, char *errbuf, size_t errlen) {
    const struct dummy_shape *sh;
    struct dummy_types ty;
    int arch;
    int rc = dummy_parse(spec, &sh, &ty, &arch, errbuf, errlen);
    if (rc < 0)
        return rc;
    struct dummy_build b = {0};
    rc = dummy_build(&b, sh, &ty, arch);
    if (rc == 0)
        rc = gguf_writer_write_mem(b.w, buf, len);
    if (rc < 0)
        snprintf(errbuf, errlen, "dummy: building '%s' failed: %s", spec, strerror(-rc));
    dummy_free(&b);
    return rc;
}

int model_dummy_write_file(const char *spec, const char *path, char *errbuf, size_t errlen) {
    const struct dummy_shape *sh;
    struct dummy_types ty;
    int arch;
    int rc = dummy_parse(spec, &sh, &ty, &arch, errbuf, errlen);
    if (rc < 0)
        return rc;
    struct dummy_build b = {0};
    rc = dummy_build(&b, sh, &ty, arch);
    if (rc == 0)
        rc = gguf_writer_write_file(b.w, path);
    if (rc < 0)
        snprintf(errbuf, errlen, "dummy: writing '%s' to %s failed: %s", spec, path, strerror(-rc));
    dummy_free(&b);
    return rc;
}
