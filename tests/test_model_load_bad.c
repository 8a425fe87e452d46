/* model_load() on structurally valid but semantically hostile GGUFs.
 *
 * Each file is built by gguf_writer from one small, valid Llama (8 wide, 2
 * layers, 2/1 heads, 16-wide FFN, 24 tokens) with one thing changed: a key
 * overridden or left out, a tensor left out or given another type or
 * shape. The load must fail with the right errno and a message that names
 * the key or tensor; the few legal oddities must load and run a forward
 * pass (ASan/UBSan check the kernels on them).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine/model/gguf_write.h"
#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "kernels/kern.h"
#include "mem.h"

#if defined(__SANITIZE_ADDRESS__)
#define MK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MK_ASAN 1
#endif
#endif

/* The model to write; zero fields take the defaults of mk_defaults(). */
struct mk {
    uint32_t n_embd, n_layer, n_ff, n_head, n_head_kv, n_rot, n_vocab;
    uint32_t n_tok;     /* tokenizer tokens; default n_vocab */
    uint32_t alignment; /* general.alignment; default 32 */
    const char *key;    /* set this key ... */
    enum gguf_vtype key_type;
    uint64_t key_u; /* ... to this integer (u32/u64/i32) ... */
    float key_f;    /* ... or float */
    const char *drop_key;
    const char *drop_tensor;
    const char *odd_tensor; /* give this tensor odd_type and odd_ne (odd_n_dims dims) */
    enum gguf_ttype odd_type;
    uint32_t odd_n_dims;
    uint64_t odd_ne[2];
    const char *pad_tensor; /* a 2-byte tensor added before this one (for alignment 1) */
    bool no_layers;         /* write no blk.* tensors */
};

static void mk_defaults(struct mk *o) {
    o->n_embd = o->n_embd ? o->n_embd : 8;
    o->n_layer = o->n_layer ? o->n_layer : 2;
    o->n_ff = o->n_ff ? o->n_ff : 16;
    o->n_head = o->n_head ? o->n_head : 2;
    o->n_head_kv = o->n_head_kv ? o->n_head_kv : 1;
    o->n_rot = o->n_rot ? o->n_rot : o->n_embd / o->n_head;
    o->n_vocab = o->n_vocab ? o->n_vocab : 24;
    o->n_tok = o->n_tok ? o->n_tok : o->n_vocab;
    o->alignment = o->alignment ? o->alignment : 32;
}

static bool mk_dropped(const struct mk *o, const char *key) {
    return o->drop_key && strcmp(o->drop_key, key) == 0;
}

static void mk_u32(struct gguf_writer *w, const struct mk *o, const char *key, uint32_t v) {
    if (!mk_dropped(o, key))
        cr_assert_eq(gguf_writer_set_u32(w, key, v), 0, "%s", key);
}

static void *mk_data[64];
static size_t mk_n_data;

static void mk_tensor(struct gguf_writer *w, const struct mk *o, const char *name,
                      enum gguf_ttype type, uint64_t n_in, uint64_t n_out) {
    if (o->drop_tensor && strcmp(o->drop_tensor, name) == 0)
        return;
    if (o->pad_tensor && strcmp(o->pad_tensor, name) == 0) {
        uint64_t one = 1;
        cr_assert_eq(gguf_writer_add_tensor(w, "pad", GGUF_T_F16, 1, &one, NULL), 0);
    }
    uint64_t ne[2] = {n_in, n_out};
    uint32_t n_dims = n_out ? 2 : 1;
    if (o->odd_tensor && strcmp(o->odd_tensor, name) == 0) {
        type = o->odd_type;
        n_dims = o->odd_n_dims;
        ne[0] = o->odd_ne[0];
        ne[1] = o->odd_ne[1];
    }
    /* small deterministic weights so the forward pass is not all zeros */
    uint64_t n = ne[0] * (n_dims == 2 ? ne[1] : 1);
    size_t bytes = gguf_type_bytes(type, n);
    unsigned char *data = NULL;
    const bool kq = type == GGUF_T_Q4_K || type == GGUF_T_Q5_K || type == GGUF_T_Q6_K;
    if ((type == GGUF_T_F32 || kq) && bytes) {
        float *f = mem_alloc(MEM_TEST, n * sizeof(float));
        cr_assert_not_null(f);
        for (uint64_t i = 0; i < n; i++)
            f[i] = n_dims == 1 ? 1.0f : (float)((i * 7919u) % 17) / 17.0f - 0.5f;
        data = (unsigned char *)f;
        if (kq) { /* quantized rows, as llama-quantize would write them */
            data = mem_alloc(MEM_TEST, bytes);
            cr_assert_not_null(data);
            if (type == GGUF_T_Q4_K)
                kern_quantize_row_q4_K(f, data, (int)n);
            else if (type == GGUF_T_Q5_K)
                kern_quantize_row_q5_K(f, data, (int)n);
            else
                kern_quantize_row_q6_K(f, data, (int)n);
            mem_free(f);
        }
    }
    cr_assert_eq(gguf_writer_add_tensor(w, name, type, n_dims, ne, data), 0, "add %s", name);
    if (data) {
        cr_assert_lt(mk_n_data, sizeof(mk_data) / sizeof(mk_data[0]));
        mk_data[mk_n_data++] = data; /* borrowed by the writer until the write */
    }
}

/* Build the GGUF image of o; caller frees with mem_free(). */
static void *mk_image(struct mk *o, size_t *len) {
    mk_defaults(o);
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_create(&w), 0);
    cr_assert_eq(gguf_writer_set_u32(w, "general.alignment", o->alignment), 0);
    if (!mk_dropped(o, "general.architecture"))
        cr_assert_eq(gguf_writer_set_str(w, "general.architecture", "llama"), 0);
    mk_u32(w, o, "llama.context_length", 64);
    mk_u32(w, o, "llama.embedding_length", o->n_embd);
    mk_u32(w, o, "llama.block_count", o->n_layer);
    mk_u32(w, o, "llama.feed_forward_length", o->n_ff);
    mk_u32(w, o, "llama.attention.head_count", o->n_head);
    mk_u32(w, o, "llama.attention.head_count_kv", o->n_head_kv);
    mk_u32(w, o, "llama.rope.dimension_count", o->n_rot);
    if (!mk_dropped(o, "llama.attention.layer_norm_rms_epsilon"))
        cr_assert_eq(gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), 0);

    /* SPM vocabulary: <unk> <s> </s>, then "a", "b", ... */
    char **toks = mem_calloc(MEM_TEST, o->n_tok, sizeof(*toks));
    cr_assert_not_null(toks);
    for (uint32_t i = 0; i < o->n_tok; i++) {
        char s[16];
        if (i < 3)
            snprintf(s, sizeof(s), "%s", (const char *[]){"<unk>", "<s>", "</s>"}[i]);
        else
            snprintf(s, sizeof(s), "t%u", i);
        toks[i] = mem_strdup(MEM_TEST, s);
    }
    if (!mk_dropped(o, "tokenizer.ggml.model"))
        cr_assert_eq(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"), 0);
    if (!mk_dropped(o, "tokenizer.ggml.tokens"))
        cr_assert_eq(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks,
                                             NULL, o->n_tok),
                     0);
    mk_u32(w, o, "tokenizer.ggml.bos_token_id", 1);
    mk_u32(w, o, "tokenizer.ggml.eos_token_id", 2);

    if (o->key) {
        int rc;
        if (o->key_type == GGUF_VT_FLOAT32)
            rc = gguf_writer_set_f32(w, o->key, o->key_f);
        else if (o->key_type == GGUF_VT_UINT64)
            rc = gguf_writer_set_u64(w, o->key, o->key_u);
        else if (o->key_type == GGUF_VT_STRING)
            rc = gguf_writer_set_str(w, o->key, "gpt-j");
        else
            rc = gguf_writer_set_u32(w, o->key, (uint32_t)o->key_u);
        cr_assert_eq(rc, 0, "override %s", o->key);
    }

    uint32_t hd = o->n_embd / o->n_head, q = o->n_head * hd, kv = o->n_head_kv * hd;
    mk_tensor(w, o, "token_embd.weight", GGUF_T_F32, o->n_embd, o->n_vocab);
    mk_tensor(w, o, "output_norm.weight", GGUF_T_F32, o->n_embd, 0);
    for (uint32_t il = 0; il < o->n_layer && !o->no_layers; il++) {
        char n[64];
#define MK_NAME(suffix) (snprintf(n, sizeof(n), "blk.%u." suffix ".weight", il), n)
        mk_tensor(w, o, MK_NAME("attn_norm"), GGUF_T_F32, o->n_embd, 0);
        mk_tensor(w, o, MK_NAME("attn_q"), GGUF_T_F32, o->n_embd, q);
        mk_tensor(w, o, MK_NAME("attn_k"), GGUF_T_F32, o->n_embd, kv);
        mk_tensor(w, o, MK_NAME("attn_v"), GGUF_T_F32, o->n_embd, kv);
        mk_tensor(w, o, MK_NAME("attn_output"), GGUF_T_F32, q, o->n_embd);
        mk_tensor(w, o, MK_NAME("ffn_norm"), GGUF_T_F32, o->n_embd, 0);
        mk_tensor(w, o, MK_NAME("ffn_gate"), GGUF_T_F32, o->n_embd, o->n_ff);
        mk_tensor(w, o, MK_NAME("ffn_up"), GGUF_T_F32, o->n_embd, o->n_ff);
        mk_tensor(w, o, MK_NAME("ffn_down"), GGUF_T_F32, o->n_ff, o->n_embd);
#undef MK_NAME
    }
    void *buf;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, len), 0);
    gguf_writer_destroy(w);
    while (mk_n_data)
        mem_free(mk_data[--mk_n_data]);
    for (uint32_t i = 0; i < o->n_tok; i++)
        mem_free(toks[i]);
    mem_free(toks);
    return buf;
}

/* Write buf to a temporary file, model_load() it and remove the file (the
 * mapping outlives the name). */
static int mk_load_buf(const void *buf, size_t len, struct model **m, char *err, size_t errlen) {
    char path[] = "/tmp/llmd-bad-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    ssize_t n = write(fd, buf, len);
    close(fd);
    if (n != (ssize_t)len)
        unlink(path);
    cr_assert_eq(n, (ssize_t)len);
    err[0] = '\0';
    int rc = model_load(path, &(struct model_load_opts){.quiet = true}, m, err, errlen);
    unlink(path);
    return rc;
}

static int mk_load(struct mk o, struct model **m, char *err, size_t errlen) {
    size_t len;
    void *buf = mk_image(&o, &len);
    int rc = mk_load_buf(buf, len, m, err, errlen);
    mem_free(buf);
    return rc;
}

/* The load fails with want and a message containing each of the words. */
#define expect_fail(o, want, ...)                                                                  \
    do {                                                                                           \
        struct model *m_ = NULL;                                                                   \
        char err_[512];                                                                            \
        int rc_ = mk_load((o), &m_, err_, sizeof(err_));                                           \
        cr_assert_eq(rc_, (want), "rc %d, want %d (%s)", rc_, (want), err_);                       \
        cr_assert_null(m_);                                                                        \
        const char *words_[] = {__VA_ARGS__};                                                      \
        for (size_t i_ = 0; i_ < sizeof(words_) / sizeof(words_[0]); i_++)                         \
            cr_assert(strstr(err_, words_[i_]), "message '%s' does not name '%s'", err_,           \
                      words_[i_]);                                                                 \
        for (int t_ = MEM_GGUF; t_ <= MEM_MODEL; t_++)                                             \
            cr_assert_eq(mem_bytes(t_), 0, "%s bytes left after a failed load", mem_tag_name(t_)); \
    } while (0)

/* Load o and run a 3-token prefill plus one decode step. */
static void expect_runs(struct mk o) {
    struct model *m = NULL;
    char err[512];
    int rc = mk_load(o, &m, err, sizeof(err));
    cr_assert_eq(rc, 0, "load: %d %s", rc, err);
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
    uint32_t seq;
    cr_assert_eq(kern_pool_create(1, &pool), 0);
    struct kv_config kc = {.dtype = KV_F16, .n_ctx = 8, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err)), 0, "kv: %s", err);
    cr_assert_eq(model_ctx_create(m, pool, 4, &ctx), 0);
    cr_assert_eq(kv_seq_open(kv, &seq), 0);
    float *logits = mem_alloc(MEM_TEST, m->hp.n_vocab * sizeof(float));
    int32_t ids[3] = {1, 3, (int32_t)m->hp.n_vocab - 1};
    cr_assert_eq(kv_seq_reserve(kv, seq, 4), 0);
    cr_assert_eq(model_forward(ctx, kv, seq, ids, 3, 0, logits), 0);
    cr_assert_eq(model_forward(ctx, kv, seq, ids + 1, 1, 3, logits), 0);
    for (uint32_t i = 0; i < m->hp.n_vocab; i++)
        cr_assert(logits[i] == logits[i], "logit %u is NaN", i);
    mem_free(logits);
    kv_seq_close(kv, seq);
    model_ctx_destroy(ctx);
    kv_cache_destroy(kv);
    kern_pool_destroy(pool);
    model_free(m);
}

Test(model_load_bad, baseline_loads_and_runs) {
    expect_runs((struct mk){0});
}

/* ---- hyperparameters ---- */

Test(model_load_bad, head_count_kv_zero_is_einval) {
    expect_fail(((struct mk){.key = "llama.attention.head_count_kv", .key_u = 0}), -EINVAL,
                "head_count_kv");
}

Test(model_load_bad, head_count_kv_not_dividing_is_einval) {
    expect_fail(((struct mk){.n_embd = 12, .n_head = 3, .n_head_kv = 2}), -EINVAL, "head_count_kv");
}

Test(model_load_bad, head_count_kv_above_head_count_is_einval) {
    expect_fail(((struct mk){.key = "llama.attention.head_count_kv", .key_u = 4}), -EINVAL,
                "head_count_kv");
}

Test(model_load_bad, n_rot_odd_is_einval) {
    expect_fail(((struct mk){.n_rot = 3}), -EINVAL, "rope.dimension_count");
}

Test(model_load_bad, n_rot_over_head_dim_is_einval) {
    expect_fail(((struct mk){.n_rot = 6}), -EINVAL, "rope.dimension_count");
}

Test(model_load_bad, block_count_2pow31_is_einval) {
    expect_fail(((struct mk){.key = "llama.block_count", .key_u = 1u << 31}), -EINVAL,
                "llama.block_count", "limit");
}

Test(model_load_bad, embedding_length_1_disagrees_with_heads) {
    expect_fail(((struct mk){.key = "llama.embedding_length", .key_u = 1}), -EINVAL,
                "embedding_length");
}

Test(model_load_bad, embedding_length_disagreeing_with_token_embd_names_it) {
    expect_fail(((struct mk){.key = "llama.embedding_length", .key_u = 16}), -EINVAL,
                "token_embd.weight");
}

Test(model_load_bad, feed_forward_length_disagreeing_names_the_tensor) {
    expect_fail(((struct mk){.key = "llama.feed_forward_length", .key_u = 32}), -EINVAL,
                "blk.0.ffn_gate.weight");
}

Test(model_load_bad, missing_required_key_names_it) {
    expect_fail(((struct mk){.drop_key = "llama.feed_forward_length"}), -EINVAL,
                "llama.feed_forward_length");
}

/* gguf.h: integer getters accept any integer type whose value fits */
Test(model_load_bad, u64_block_count_that_fits_loads) {
    expect_runs((struct mk){.key = "llama.block_count", .key_type = GGUF_VT_UINT64, .key_u = 2});
}

Test(model_load_bad, u64_block_count_past_u32_names_key) {
    expect_fail(((struct mk){.key = "llama.block_count",
                             .key_type = GGUF_VT_UINT64,
                             .key_u = (1ull << 32) + 2}),
                -EINVAL, "llama.block_count");
}

Test(model_load_bad, architecture_other_than_llama_is_enotsup) {
    expect_fail(((struct mk){.key = "general.architecture", .key_type = GGUF_VT_STRING}), -ENOTSUP,
                "gpt-j");
}

Test(model_load_bad, infinite_rms_eps_is_einval) {
    expect_fail(((struct mk){.key = "llama.attention.layer_norm_rms_epsilon",
                             .key_type = GGUF_VT_FLOAT32,
                             .key_f = __builtin_inff()}),
                -EINVAL, "layer_norm_rms_epsilon");
}

Test(model_load_bad, nan_rope_freq_base_is_einval) {
    expect_fail(((struct mk){.key = "llama.rope.freq_base",
                             .key_type = GGUF_VT_FLOAT32,
                             .key_f = __builtin_nanf("")}),
                -EINVAL, "rope.freq_base");
}

Test(model_load_bad, block_count_past_the_tensors_names_first_missing_block) {
    expect_fail(((struct mk){.key = "llama.block_count", .key_u = 3}), -EINVAL, "blk.2.");
}

Test(model_load_bad, head_dim_over_kernel_limit_is_rejected) {
    /* 1 head of 512: the attention kernel keeps head_dim <= 256 on the stack */
    expect_fail(((struct mk){.n_embd = 512, .n_head = 1, .n_layer = 1, .n_rot = 2}), -ENOTSUP,
                "head_dim");
}

Test(model_load_bad, huge_layer_count_fails_on_tensors_without_huge_alloc) {
#ifndef MK_ASAN
    /* Without ASan (which reserves terabytes of shadow) cap the address
     * space, so a multi-GiB allocation made before the tensors are
     * checked turns into -ENOMEM and fails the test. */
    struct rlimit rl = {.rlim_cur = 1ull << 30, .rlim_max = RLIM_INFINITY};
    getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = 1ull << 30;
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
#endif
    /* 4096 layers of width 32768 and no layer tensors: f32 copies of
     * every norm would be 1 GiB */
    expect_fail(((struct mk){.n_embd = 32768,
                             .n_head = 128,
                             .n_rot = 256,
                             .n_layer = 4096,
                             .n_ff = 1,
                             .n_vocab = 4,
                             .no_layers = true}),
                -EINVAL, "blk.0.");
}

/* ---- tensors ---- */

Test(model_load_bad, missing_tensor_names_it) {
    expect_fail(((struct mk){.drop_tensor = "blk.1.ffn_down.weight"}), -EINVAL,
                "blk.1.ffn_down.weight");
}

Test(model_load_bad, missing_output_norm_names_it) {
    expect_fail(((struct mk){.drop_tensor = "output_norm.weight"}), -EINVAL, "output_norm.weight");
}

Test(model_load_bad, transposed_matrix_names_it) {
    expect_fail(((struct mk){.odd_tensor = "blk.0.attn_output.weight",
                             .odd_type = GGUF_T_F32,
                             .odd_n_dims = 2,
                             .odd_ne = {8, 4}}),
                -EINVAL, "blk.0.attn_output.weight");
}

Test(model_load_bad, matrix_as_vector_names_it) {
    expect_fail(((struct mk){.odd_tensor = "blk.0.attn_q.weight",
                             .odd_type = GGUF_T_F32,
                             .odd_n_dims = 1,
                             .odd_ne = {64, 0}}),
                -EINVAL, "blk.0.attn_q.weight");
}

Test(model_load_bad, bf16_matrix_is_enotsup) {
    expect_fail(((struct mk){.odd_tensor = "blk.1.ffn_up.weight",
                             .odd_type = GGUF_T_BF16,
                             .odd_n_dims = 2,
                             .odd_ne = {8, 16}}),
                -ENOTSUP, "blk.1.ffn_up.weight", "bf16");
}

Test(model_load_bad, q8_0_norm_is_enotsup) {
    expect_fail(((struct mk){.n_embd = 32,
                             .n_head = 2,
                             .odd_tensor = "blk.0.ffn_norm.weight",
                             .odd_type = GGUF_T_Q8_0,
                             .odd_n_dims = 1,
                             .odd_ne = {32, 0}}),
                -ENOTSUP, "blk.0.ffn_norm.weight");
}

Test(model_load_bad, norm_of_wrong_length_names_it) {
    expect_fail(((struct mk){.odd_tensor = "blk.0.attn_norm.weight",
                             .odd_type = GGUF_T_F32,
                             .odd_n_dims = 1,
                             .odd_ne = {7, 0}}),
                -EINVAL, "blk.0.attn_norm.weight");
}

Test(model_load_bad, norm_as_matrix_names_it) {
    expect_fail(((struct mk){.odd_tensor = "output_norm.weight",
                             .odd_type = GGUF_T_F32,
                             .odd_n_dims = 2,
                             .odd_ne = {8, 1}}),
                -EINVAL, "output_norm.weight");
}

Test(model_load_bad, f16_norm_loads_and_runs) {
    expect_runs((struct mk){.odd_tensor = "blk.1.attn_norm.weight",
                            .odd_type = GGUF_T_F16,
                            .odd_n_dims = 1,
                            .odd_ne = {8, 0}});
}

/* Patch the type field of blk.0.attn_v.weight (written as q8_0 [32, 16])
 * to `type` and load: the gguf writer refuses what the reader must. */
static int mk_load_patched_type(uint32_t type, char *err, size_t errlen) {
    struct mk o = {.n_embd = 32,
                   .n_head = 2,
                   .odd_tensor = "blk.0.attn_v.weight",
                   .odd_type = GGUF_T_Q8_0,
                   .odd_n_dims = 2,
                   .odd_ne = {32, 16}};
    size_t len;
    unsigned char *buf = mk_image(&o, &len);
    const char *name = "blk.0.attn_v.weight";
    unsigned char *p = memmem(buf, len, name, strlen(name));
    cr_assert_not_null(p);
    size_t type_off = (size_t)(p - buf) + strlen(name) + 4 + 2 * 8;
    uint32_t was;
    memcpy(&was, buf + type_off, 4);
    cr_assert_eq(was, GGUF_T_Q8_0);
    memcpy(buf + type_off, &type, 4);
    struct model *m = NULL;
    int rc = mk_load_buf(buf, len, &m, err, errlen);
    mem_free(buf);
    cr_assert_null(m);
    return rc;
}

/* A q5_0 tensor (type 6): ggml knows it, llmd's GGUF reader does not. */
Test(model_load_bad, q5_0_tensor_is_rejected_by_name_of_type) {
    char err[512];
    int rc = mk_load_patched_type(6, err, sizeof(err));
    cr_assert(rc == -EINVAL || rc == -ENOTSUP, "rc %d (%s)", rc, err);
    cr_assert(strstr(err, "q5_0"), "message '%s' does not name q5_0", err);
}

/* A q4_K tensor whose rows (32) are not whole super-blocks of 256: refused
 * with the tensor's name, its shape and the block size (llama-quantize
 * would have written such rows in another type). */
Test(model_load_bad, q4_K_rows_not_of_256_name_tensor_shape_and_block) {
    char err[512];
    int rc = mk_load_patched_type(12, err, sizeof(err));
    cr_assert_eq(rc, -EINVAL, "rc %d (%s)", rc, err);
    cr_assert(strstr(err, "blk.0.attn_v.weight") && strstr(err, "shape [32, 16]") &&
                  strstr(err, "256, the block size of q4_K"),
              "message '%s'", err);
}

/* K-quant matrices load and run, the embedding too (its rows go through
 * kern_dequant_row) and the classifier tied to it (no output.weight). */
Test(model_load_bad, k_quant_matrices_and_embedding_load_and_run) {
    expect_runs((struct mk){.n_embd = 256,
                            .n_ff = 512,
                            .n_head = 2,
                            .odd_tensor = "token_embd.weight",
                            .odd_type = GGUF_T_Q6_K,
                            .odd_n_dims = 2,
                            .odd_ne = {256, 24}});
    expect_runs((struct mk){.n_embd = 256,
                            .n_ff = 512,
                            .n_head = 2,
                            .odd_tensor = "blk.1.ffn_down.weight",
                            .odd_type = GGUF_T_Q5_K,
                            .odd_n_dims = 2,
                            .odd_ne = {512, 256}});
    expect_runs((struct mk){.n_embd = 256,
                            .n_ff = 512,
                            .n_head = 2,
                            .odd_tensor = "blk.0.attn_q.weight",
                            .odd_type = GGUF_T_Q4_K,
                            .odd_n_dims = 2,
                            .odd_ne = {256, 256}});
}

Test(model_load_bad, regress_unaligned_tensor_data_is_einval) {
    /* general.alignment 1 (a 2-byte tensor before attn_norm shifts the rest
     * too) leaves f32 tensors at offsets that are not a multiple of 4: this
     * used to load and hand the kernels misaligned float pointers (UBSan:
     * misaligned load in rmsnorm). The first misaligned tensor is named. */
    expect_fail(((struct mk){.alignment = 1, .pad_tensor = "blk.0.attn_norm.weight"}), -EINVAL,
                ".weight' (f32) starts at file offset", "general.alignment 1");
}

Test(model_load_bad, alignment_8_loads_and_runs) {
    /* the smallest alignment the GGUF spec allows; the pad tensor shifts
     * the rest by 8 */
    expect_runs((struct mk){.alignment = 8, .pad_tensor = "blk.0.attn_norm.weight"});
}

Test(model_load_bad, tiny_but_legal_shapes_run) {
    /* 2 wide, one head of 2, 1-wide FFN, 4 tokens */
    expect_runs((struct mk){.n_embd = 2, .n_head = 1, .n_head_kv = 1, .n_ff = 1, .n_vocab = 4});
}

Test(model_load_bad, odd_head_dim_without_rope_runs) {
    /* head_dim 3 with rope on 2 of its dims: legal, exercises kernel tails */
    expect_runs((struct mk){.n_embd = 9, .n_head = 3, .n_head_kv = 3, .n_rot = 2, .n_ff = 5});
}

Test(model_load_bad, group_of_16_heads_per_kv_head_runs) {
    expect_runs((struct mk){.n_embd = 64, .n_head = 16, .n_head_kv = 1, .n_layer = 1});
}

/* ---- tokenizer ---- */

Test(model_load_bad, vocab_size_mismatch_is_einval) {
    expect_fail(((struct mk){.n_tok = 20}), -EINVAL, "tokenizer", "token_embd.weight");
}

Test(model_load_bad, token_id_past_vocab_names_key) {
    expect_fail(((struct mk){.key = "tokenizer.ggml.eos_token_id", .key_u = 1000}), -EINVAL,
                "eos_token_id");
}

Test(model_load_bad, missing_tokenizer_tokens_names_key) {
    expect_fail(((struct mk){.drop_key = "tokenizer.ggml.tokens"}), -EINVAL,
                "tokenizer.ggml.tokens");
}

Test(model_load_bad, missing_tokenizer_model_names_key) {
    expect_fail(((struct mk){.drop_key = "tokenizer.ggml.model"}), -EINVAL, "tokenizer.ggml.model");
}
