/* Tests of the GGUF reader on the real files in ../shared/models: the
 * stories260K model in four tensor types and the two vocabulary files. */
#include <math.h>

#include "tests/lib/gguf_util.h"

static struct gguf *open_model(const char *name) {
    char path[256];
    fx_model(name, path, sizeof(path));
    struct gguf *g = NULL;
    char err[256];
    int rc = gguf_open(path, &g, err, sizeof(err));
    cr_assert_eq(rc, 0, "gguf_open(%s) = %d: %s", path, rc, err);
    return g;
}

static void expect_u32(const struct gguf *g, const char *key, uint32_t want) {
    uint32_t v = 0;
    int rc = gguf_get_u32(g, key, &v);
    cr_assert_eq(rc, 0, "%s: rc %d", key, rc);
    cr_assert_eq(v, want, "%s = %u, want %u", key, v, want);
}

static const struct gguf_tensor *expect_tensor(const struct gguf *g, const char *name,
                                               enum gguf_ttype type, uint64_t ne0, uint64_t ne1) {
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    cr_assert_not_null(t, "tensor %s not found", name);
    cr_assert(gguf_str_eq(t->name, name));
    cr_assert_eq(t->type, type, "%s type %s, want %s", name, gguf_type_name(t->type),
                 gguf_type_name(type));
    cr_assert_eq(t->ne[0], ne0, "%s ne[0] %lu want %lu", name, (unsigned long)t->ne[0],
                 (unsigned long)ne0);
    cr_assert_eq(t->ne[1], ne1, "%s ne[1] %lu want %lu", name, (unsigned long)t->ne[1],
                 (unsigned long)ne1);
    cr_assert_eq(t->bytes, gguf_type_bytes(type, ne0 * ne1), "%s bytes %lu", name,
                 (unsigned long)t->bytes);
    return t;
}

Test(gguf_real, f32_metadata) {
    uint64_t before = mem_bytes(MEM_GGUF);
    struct gguf *g = open_model("stories260K-f32.gguf");
    cr_assert_eq(gguf_version(g), 3);
    cr_assert_eq(gguf_n_tensors(g), 48, "n_tensors %lu", (unsigned long)gguf_n_tensors(g));
    cr_assert_eq(gguf_alignment(g), 32);
    expect_u32(g, "llama.block_count", 5);
    expect_u32(g, "llama.embedding_length", 64);
    expect_u32(g, "llama.context_length", 128);
    expect_u32(g, "llama.feed_forward_length", 172);
    expect_u32(g, "llama.attention.head_count", 8);
    expect_u32(g, "llama.attention.head_count_kv", 4);
    expect_u32(g, "tokenizer.ggml.bos_token_id", 1);

    struct gguf_str s;
    cr_assert_eq(gguf_get_str(g, "general.architecture", &s), 0);
    cr_assert(gguf_str_eq(s, "llama"), "architecture '%.*s'", (int)s.len, s.ptr);
    cr_assert_eq(gguf_get_str(g, "tokenizer.ggml.model", &s), 0);
    cr_assert(gguf_str_eq(s, "llama"));

    float eps = 0;
    cr_assert_eq(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    cr_assert_float_eq(eps, 1e-5f, 1e-12f, "eps %g", eps);

    uint64_t n = 0;
    const struct gguf_str *toks = NULL;
    cr_assert_eq(gguf_get_str_arr(g, "tokenizer.ggml.tokens", &n, &toks), 0);
    cr_assert_eq(n, 512, "tokens %lu", (unsigned long)n);
    cr_assert(gguf_str_eq(toks[1], "<s>"), "tokens[1] '%.*s'", (int)toks[1].len, toks[1].ptr);
    cr_assert(gguf_str_eq(toks[2], "</s>"));
    cr_assert(gguf_str_eq(toks[3], "<0x00>"));

    enum gguf_vtype et;
    const void *data;
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data), 0);
    cr_assert_eq(et, GGUF_VT_FLOAT32, "scores elem %s", gguf_vtype_name(et));
    cr_assert_eq(n, 512);
    float sc;
    memcpy(&sc, (const char *)data + 4 * 260, 4); /* pieces 259.. score 0, -1, ... */
    cr_assert_float_eq(sc, -1.0f, 0.0f, "scores[260] %g", sc);
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data), 0);
    cr_assert_eq(et, GGUF_VT_INT32);
    cr_assert_eq(n, 512);

    gguf_close(g);
    cr_assert_eq(mem_bytes(MEM_GGUF), before, "gguf leaked %lu bytes",
                 (unsigned long)(mem_bytes(MEM_GGUF) - before));
}

Test(gguf_real, getters_check_types_and_ranges) {
    struct gguf *g = open_model("stories260K-f32.gguf");
    uint32_t u32;
    uint64_t u64;
    int32_t i32;
    float f;
    bool b;
    struct gguf_str s;
    const struct gguf_str *items;
    enum gguf_vtype et;
    const void *data;
    /* 0xFFFFFFFF fits u32/u64 but not i32. */
    cr_assert_eq(gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &u32), 0);
    cr_assert_eq(u32, 0xFFFFFFFFu);
    cr_assert_eq(gguf_get_u64(g, "tokenizer.ggml.padding_token_id", &u64), 0);
    cr_assert_eq(u64, 0xFFFFFFFFu);
    cr_assert_eq(gguf_get_i32(g, "tokenizer.ggml.padding_token_id", &i32), -EINVAL);
    cr_assert_eq(gguf_get_i32(g, "llama.block_count", &i32), 0);
    cr_assert_eq(i32, 5);
    cr_assert_eq(gguf_get_u32(g, "no.such.key", &u32), -ENOENT);
    cr_assert_eq(gguf_get_u32(g, "llama.attention.layer_norm_rms_epsilon", &u32), -EINVAL);
    cr_assert_eq(gguf_get_f32(g, "llama.block_count", &f), -EINVAL);
    cr_assert_eq(gguf_get_bool(g, "llama.block_count", &b), -EINVAL);
    cr_assert_eq(gguf_get_str(g, "llama.block_count", &s), -EINVAL);
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &u64, &data), -EINVAL);
    cr_assert_eq(gguf_get_str_arr(g, "tokenizer.ggml.scores", &u64, &items), -EINVAL);
    cr_assert_eq(gguf_get_str_arr(g, "general.architecture", &u64, &items), -EINVAL);
    cr_assert_eq(gguf_get_type(g, "tokenizer.ggml.tokens", &et), 0);
    cr_assert_eq(et, GGUF_VT_ARRAY);
    cr_assert_eq(gguf_get_type(g, "nope", &et), -ENOENT);
    /* Every key is reachable by index and by name. */
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k;
        cr_assert_eq(gguf_kv_at(g, i, &k, &et), 0);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)k.len, k.ptr);
        enum gguf_vtype et2;
        cr_assert_eq(gguf_get_type(g, name, &et2), 0, "key %s", name);
        cr_assert_eq(et, et2, "key %s", name);
    }
    cr_assert_eq(gguf_kv_at(g, gguf_n_kv(g), &s, &et), -ENOENT);
    gguf_close(g);
}

Test(gguf_real, f32_tensors_match_llama2c_checkpoint) {
    struct gguf *g = open_model("stories260K-f32.gguf");
    const struct gguf_tensor *emb = expect_tensor(g, "token_embd.weight", GGUF_T_F32, 64, 512);
    cr_assert_eq(emb->n_dims, 2);
    cr_assert_eq(emb->ne[2], 1);
    cr_assert_eq(emb->ne[3], 1);
    expect_tensor(g, "blk.0.ffn_down.weight", GGUF_T_F32, 172, 64);
    expect_tensor(g, "blk.4.attn_k.weight", GGUF_T_F32, 64, 32);
    const struct gguf_tensor *norm = gguf_find_tensor(g, "output_norm.weight");
    cr_assert_not_null(norm);
    cr_assert_eq(norm->n_dims, 1);
    cr_assert_null(gguf_find_tensor(g, "blk.5.attn_q.weight"));
    cr_assert_null(gguf_find_tensor(g, "token_embd.weigh"));

    /* Every tensor by index is the one found by name, aligned, inside the file. */
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
        cr_assert_eq(gguf_find_tensor(g, name), t, "tensor %s", name);
        cr_assert_eq(t->offset % 32, 0, "tensor %s offset %lu", name, (unsigned long)t->offset);
    }
    cr_assert_null(gguf_tensor_at(g, 48));

    /* llama2.c's token_embedding[512][64] follows its 28-byte header. */
    char path[256];
    size_t len;
    float *bin = fx_read(fx_model("stories260K.bin", path, sizeof(path)), &len);
    float want, got;
    memcpy(&want, (char *)bin + 28, 4);
    memcpy(&got, emb->data, 4);
    cr_assert_eq(got, want, "first embedding value %g, want %g", got, want);
    cr_assert_eq(memcmp(emb->data, (char *)bin + 28, emb->bytes), 0,
                 "token_embd differs from llama2.c's token_embedding");
    mem_free(bin);
    gguf_close(g);
}

Test(gguf_real, f16_file_types) {
    struct gguf *g = open_model("stories260K-f16.gguf");
    expect_u32(g, "general.file_type", 1);
    expect_tensor(g, "token_embd.weight", GGUF_T_F16, 64, 512);
    expect_tensor(g, "blk.2.ffn_down.weight", GGUF_T_F16, 172, 64);
    expect_tensor(g, "output_norm.weight", GGUF_T_F32, 64, 1);
    expect_tensor(g, "blk.0.attn_norm.weight", GGUF_T_F32, 64, 1);
    cr_assert_eq(gguf_n_tensors(g), 48);
    gguf_close(g);
}

Test(gguf_real, q8_0_file_types) {
    struct gguf *g = open_model("stories260K-q8_0.gguf");
    expect_u32(g, "general.file_type", 7);
    const struct gguf_tensor *q = expect_tensor(g, "blk.0.attn_q.weight", GGUF_T_Q8_0, 64, 64);
    cr_assert_eq(q->bytes, 64 * 64 / 32 * 34, "Q8_0 is 34 bytes per 32 values");
    expect_tensor(g, "blk.0.ffn_down.weight", GGUF_T_F16, 172, 64);
    expect_tensor(g, "blk.0.ffn_gate.weight", GGUF_T_Q8_0, 64, 172);
    expect_tensor(g, "output_norm.weight", GGUF_T_F32, 64, 1);
    cr_assert_str_eq(gguf_type_name(q->type), "q8_0");
    gguf_close(g);
}

Test(gguf_real, q4_0_file_types) {
    struct gguf *g = open_model("stories260K-q4_0.gguf");
    expect_u32(g, "general.file_type", 2);
    const struct gguf_tensor *t = expect_tensor(g, "token_embd.weight", GGUF_T_Q4_0, 64, 512);
    cr_assert_eq(t->bytes, 64 * 512 / 32 * 18, "Q4_0 is 18 bytes per 32 values");
    expect_tensor(g, "output.weight", GGUF_T_Q8_0, 64, 512);
    expect_tensor(g, "blk.3.ffn_down.weight", GGUF_T_F16, 172, 64);
    expect_tensor(g, "blk.3.attn_v.weight", GGUF_T_Q4_0, 64, 32);
    gguf_close(g);
}

Test(gguf_real, gpt2_vocab_merges) {
    struct gguf *g = open_model("vocab/ggml-vocab-gpt-2.gguf");
    cr_assert_eq(gguf_n_tensors(g), 0);
    struct gguf_str s;
    cr_assert_eq(gguf_get_str(g, "tokenizer.ggml.model", &s), 0);
    cr_assert(gguf_str_eq(s, "gpt2"));
    uint64_t n_tok, n_merge;
    const struct gguf_str *toks, *merges;
    cr_assert_eq(gguf_get_str_arr(g, "tokenizer.ggml.tokens", &n_tok, &toks), 0);
    cr_assert_eq(n_tok, 50257, "gpt-2 tokens %lu", (unsigned long)n_tok);
    cr_assert(gguf_str_eq(toks[0], "!"));
    cr_assert_eq(gguf_get_str_arr(g, "tokenizer.ggml.merges", &n_merge, &merges), 0);
    cr_assert_eq(n_merge, 50000, "gpt-2 merges %lu", (unsigned long)n_merge);
    for (uint64_t i = 0; i < n_merge; i++)
        cr_assert(memchr(merges[i].ptr, ' ', merges[i].len), "merge %lu has no space",
                  (unsigned long)i);
    cr_assert_leq(gguf_data_offset(g), 1766807);
    gguf_close(g);
}

Test(gguf_real, llama_spm_vocab) {
    struct gguf *g = open_model("vocab/ggml-vocab-llama-spm.gguf");
    uint64_t n;
    const struct gguf_str *toks;
    cr_assert_eq(gguf_get_str_arr(g, "tokenizer.ggml.tokens", &n, &toks), 0);
    cr_assert_eq(n, 32000, "llama tokens %lu", (unsigned long)n);
    cr_assert(gguf_str_eq(toks[1], "<s>"));
    gguf_close(g);
}

/* Every allocation of open fails once in turn: each failure is -ENOMEM
 * with nothing left behind, and the open after the hook succeeds. */
Test(gguf_real, open_survives_each_failed_allocation) {
    char path[256];
    fx_model("stories260K-f32.gguf", path, sizeof(path));
    uint64_t before = mem_bytes(MEM_GGUF), c0 = mem_calls();
    struct gguf *g;
    cr_assert_eq(gguf_open(path, &g, NULL, 0), 0);
    uint64_t n_calls = mem_calls() - c0;
    gguf_close(g);
    cr_assert_geq(n_calls, 5);
    for (uint64_t k = 1; k <= n_calls; k++) {
        char err[256];
        g = NULL;
        mem_fail_nth(k);
        int rc = gguf_open(path, &g, err, sizeof(err));
        mem_fail_nth(0);
        cr_assert_eq(rc, -ENOMEM, "allocation %lu: rc %d", (unsigned long)k, rc);
        cr_assert_null(g);
        cr_assert(strstr(err, "out of memory"), "allocation %lu: '%s'", (unsigned long)k, err);
        cr_assert_eq(mem_bytes(MEM_GGUF), before, "allocation %lu leaked", (unsigned long)k);
    }
}

Test(gguf_real, open_errors) {
    struct gguf *g = (struct gguf *)0x1;
    char err[256];
    cr_assert_eq(gguf_open(FX_MODELS "no-such-file.gguf", &g, err, sizeof(err)), -ENOENT);
    cr_assert(strstr(err, "no-such-file.gguf"), "'%s'", err);
    cr_assert_eq(g, (struct gguf *)0x1, "*out untouched on error");
    char tmp[] = "/tmp/llmd-gguf-empty-XXXXXX";
    int fd = mkstemp(tmp);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(gguf_open(tmp, &g, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "empty"), "'%s'", err);
    unlink(tmp);
    cr_assert_eq(gguf_open("/tmp", &g, err, sizeof(err)), -EINVAL);
    cr_assert_eq(gguf_open(FX_MODELS "stories260K.bin", &g, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "magic"), "'%s'", err);
}

Test(gguf_real, type_tables) {
    cr_assert_str_eq(gguf_type_name((enum gguf_ttype)12), "q4_K");
    cr_assert_str_eq(gguf_type_name(GGUF_T_BF16), "bf16");
    cr_assert_str_eq(gguf_type_name((enum gguf_ttype)1000), "?");
    cr_assert_str_eq(gguf_vtype_name(GGUF_VT_STRING), "string");
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q8_0, 64), 68);
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q4_0, 64), 36);
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q4_0, 48), 0, "not whole blocks");
    cr_assert_eq(gguf_type_bytes(GGUF_T_F32, 3), 12);
    cr_assert_eq(gguf_type_bytes(GGUF_T_BF16, 3), 6);
    cr_assert_eq(gguf_type_bytes(GGUF_T_F32, UINT64_MAX / 2), 0, "overflow");
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q4_K, 512), 288);
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q5_K, 256), 176);
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q6_K, 256), 210);
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q6_K, 288), 0, "not whole super-blocks");
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q3_K, 768), 330);
    cr_assert_eq(gguf_type_block(GGUF_T_Q3_K), 256);
    cr_assert_eq(gguf_type_block(GGUF_T_Q5_K), 256);
    cr_assert_eq(gguf_type_bytes((enum gguf_ttype)6, 256), 0, "q5_0: a type llmd does not load");
    cr_assert_eq(gguf_type_bytes(GGUF_T_Q2_K, 512), 168);
    cr_assert_eq(gguf_type_block(GGUF_T_Q8_0), 32);
    cr_assert_eq(gguf_type_block(GGUF_T_F16), 1);
}
