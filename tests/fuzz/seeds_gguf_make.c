/* seeds_gguf_make.c - writes the hand-made seeds in tests/fuzz/seeds_gguf/
 * with the GGUF writer: small files (< 2 KB) that still reach every branch
 * of a successful open, which the large real models make slow to explore.
 * Not built by make; regenerate with
 *   cc -D_GNU_SOURCE -I. -Iinclude tests/fuzz/seeds_gguf_make.c \
 *      engine/model/gguf*.c include/mem.c include/log.c -lm -o /tmp/mk && /tmp/mk
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/model/gguf_write.h"

#define DIR "tests/fuzz/seeds_gguf/"

static void check(int rc, const char *what) {
    if (rc) {
        fprintf(stderr, "%s: %d\n", what, rc);
        exit(1);
    }
}

int main(void) {
    static uint8_t data[4096];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 13 + 5);
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81the", "a b"};
    static const float scores[] = {0, -1, -2, -3, -4};
    static const int32_t types[] = {2, 3, 3, 1, 1};
    static const uint8_t bools[] = {1, 0};
    static const double f64s[] = {1e-5, 10000.0};
    uint64_t ne1[] = {8}, ne2[] = {32, 2}, ne3[] = {4, 2, 2}, ne4[] = {64, 1, 1, 2};

    struct gguf_writer *w;
    check(gguf_writer_create(&w), "create");
    check(gguf_writer_write_file(w, DIR "empty.bin"), "empty");
    check(gguf_writer_set_str(w, "general.architecture", "llama"), "arch");
    check(gguf_writer_set_u32(w, "llama.block_count", 1), "u32");
    check(gguf_writer_set_i32(w, "x.i32", -5), "i32");
    check(gguf_writer_set_u64(w, "x.u64", 1ull << 40), "u64");
    check(gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), "f32");
    check(gguf_writer_set_bool(w, "x.bool", true), "bool");
    check(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 5), "tokens");
    check(gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 5), "scores");
    check(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 5), "types");
    check(gguf_writer_set_arr(w, "x.bools", GGUF_VT_BOOL, bools, 2), "bools");
    check(gguf_writer_set_arr(w, "x.f64s", GGUF_VT_FLOAT64, f64s, 2), "f64s");
    check(gguf_writer_write_file(w, DIR "meta.bin"), "meta");
    check(gguf_writer_add_tensor(w, "token_embd.weight", GGUF_T_F32, 1, ne1, data), "t1");
    check(gguf_writer_add_tensor(w, "blk.0.attn_q.weight", GGUF_T_Q8_0, 2, ne2, data), "t2");
    check(gguf_writer_add_tensor(w, "blk.0.ffn_down.weight", GGUF_T_F16, 3, ne3, data), "t3");
    check(gguf_writer_add_tensor(w, "blk.0.ffn_up.weight", GGUF_T_Q4_0, 4, ne4, data), "t4");
    check(gguf_writer_add_tensor(w, "output.weight", GGUF_T_BF16, 1, ne1, data), "t5");
    check(gguf_writer_write_file(w, DIR "model.bin"), "model");
    check(gguf_writer_set_u32(w, "general.alignment", 64), "align");
    check(gguf_writer_write_file(w, DIR "model_align64.bin"), "model64");
    gguf_writer_destroy(w);
    return 0;
}
