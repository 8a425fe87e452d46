/* `llmd generate` end to end through the real binary (the build's own:
 * under the ASan build, a leak or an error makes the exit code non-zero,
 * so "exit code 1" here also means "no leak"). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "tests/lib/proc_util.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

struct out {
    int code;
    char text[16384]; /* stdout then stderr */
};

/* Run `llmd ARGS`, stdout then stderr into o->text (tests/lib/proc_util.h). */
static void llmd(struct out *o, const char *args) {
    o->code = llmd_run(args, o->text, sizeof(o->text));
}

/* Write `len` bytes of the f32 model to a temporary file, flipping byte
 * `flip` (if >= 0). Returns the path (static buffer). */
static const char *bad_copy(size_t len, long flip) {
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/llmd-bad-%d.gguf", getpid());
    FILE *in = fopen(F32, "rb");
    cr_assert_not_null(in, "missing %s", F32);
    char *buf = malloc(len ? len : 1);
    size_t got = fread(buf, 1, len, in);
    fclose(in);
    cr_assert_eq(got, len);
    if (flip >= 0)
        buf[flip] ^= 0x40;
    FILE *out = fopen(path, "wb");
    fwrite(buf, 1, len, out);
    fclose(out);
    free(buf);
    return path;
}

Test(cli_generate, greedy_run_prints_reference_ids, .timeout = 120) {
    struct out o;
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 16 --temp 0 --ctx 512 --kv-type "
             "f32 --ids -t 1");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    /* the first 16 of reference.jsonl's llama2.c greedy ids for this prompt */
    cr_assert(strstr(o.text, "ids: 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 "
                             "337\n"),
              "%s", o.text);
    cr_assert(strstr(o.text, "Once upon a time, there was a little girl named Lily."), "%s",
              o.text);
    cr_assert(strstr(o.text, "pages mapped"), "%s", o.text);
}

/* The greedy reference on every ISA level this CPU has (LLMD_ISA), and the
 * summary names the level that ran. f32 weights: the levels sum in the
 * same order for f32 rows up to AVX2 and may differ in the last bits above
 * it, which the greedy path of stories260K does not notice. */
Test(cli_generate, every_isa_level_prints_the_reference_ids, .timeout = 120) {
    for (int l = 0; l <= (int)kern_isa_max(); l++) {
        struct out o;
        char args[512];
        snprintf(args, sizeof(args),
                 "generate -m " F32 " -p 'Once upon a time' -n 16 --temp 0 --ctx 512 "
                 "--kv-type f32 --ids -t 1");
        setenv("LLMD_ISA", kern_isa_name((enum kern_isa)l), 1);
        llmd(&o, args);
        unsetenv("LLMD_ISA");
        cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
        cr_assert(strstr(o.text, "ids: 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 "
                                 "337\n"),
                  "isa %s: %s", kern_isa_name((enum kern_isa)l), o.text);
        char want[64];
        snprintf(want, sizeof(want), "isa %s (max %s", kern_isa_name((enum kern_isa)l),
                 kern_isa_name(kern_isa_max()));
        cr_assert(strstr(o.text, want), "'%s' in %s", want, o.text);
    }
}

/* The model line says how much the CPU kernels repacked at load (kern.h:
 * q4_0 (and q4_K, q5_K) from the avx2 level up, q8_0 and q6_K from avx512
 * up only) and how much the loader copied as it is (from avx2 up, every
 * matrix not packed: model.h), nothing at scalar, on every level this CPU
 * has; the ids do not change with the packing (nor, on these 8 tokens,
 * with q8_0's one sum a block from avx512 up). stories260K-q4_0 has 31
 * q4_0 matrices, 5 f16 and a q8_0 one; stories260K-q8_0 32 q8_0 and 5 f16. */
Test(cli_generate, the_model_line_counts_the_packed_copies, .timeout = 120) {
    static const char *const files[] = {REF_MODELS "/stories260K-q4_0.gguf",
                                        REF_MODELS "/stories260K-q8_0.gguf"};
    /* [file][0: scalar, 1: avx2 and avx-vnni, 2: avx512 and amx] */
    static const char *const want[2][3] = {
        {"0.3 MB of weights, loaded in ", "0.3 MB of weights (+0.1 MB packed, +0.1 MB copied), ",
         "0.3 MB of weights (+0.1 MB packed, +0.1 MB copied), "},
        {"0.4 MB of weights, loaded in ", "0.4 MB of weights (+0.3 MB copied), loaded in ",
         "0.4 MB of weights (+0.2 MB packed, +0.1 MB copied), loaded in "},
    };
    for (int f = 0; f < 2; f++) {
        char ids0[256] = "";
        for (int l = 0; l <= (int)kern_isa_max(); l++) {
            struct out o;
            char args[512];
            snprintf(args, sizeof(args),
                     "generate -m %s -p 'Once upon a time' -n 8 --temp 0 --ids -t 1", files[f]);
            setenv("LLMD_ISA", kern_isa_name((enum kern_isa)l), 1);
            llmd(&o, args);
            unsetenv("LLMD_ISA");
            cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
            const char *w = want[f][l >= KERN_ISA_AVX512 ? 2 : l >= KERN_ISA_AVX2 ? 1 : 0];
            cr_assert(strstr(o.text, w), "%s at %s: '%s' in %s", files[f],
                      kern_isa_name((enum kern_isa)l), w, o.text);
            const char *ids = strstr(o.text, "ids:");
            cr_assert(ids, "%s", o.text);
            if (l == KERN_ISA_AVX2)
                snprintf(ids0, sizeof ids0, "%.*s", (int)strcspn(ids, "\n"), ids);
            else if (l > KERN_ISA_AVX2)
                cr_assert(strncmp(ids, ids0, strlen(ids0)) == 0, "%s at %s: %s vs %s", files[f],
                          kern_isa_name((enum kern_isa)l), ids, ids0);
        }
    }
    /* the engine's path (--spec) reads it from llmd_engine_info */
    if (kern_isa_max() < KERN_ISA_AVX2)
        return;
    struct out o;
    setenv("LLMD_ISA", "avx2", 1);
    llmd(&o, "generate -m " REF_MODELS "/stories260K-q4_0.gguf -p 'Once upon a time' -n 8 "
             "--temp 0 --spec ngram -t 1");
    unsetenv("LLMD_ISA");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "0.3 MB of weights (+0.1 MB packed, +0.1 MB copied), loaded in ") &&
                  strstr(o.text, "(the engine, for --spec)"),
              "%s", o.text);
}

/* The model line counts the file's matrices per type, the most common
 * first: tiny-256 q3_k_m is llama-quantize's Q3_K_M mix (docs/generate.md:
 * 4 layers of attn_q/k, ffn_gate/up in q3_K and the embedding, attn_v in
 * q5_K twice then q4_K, attn_output and ffn_down q4_K, the classifier
 * q6_K); on both paths (the engine's reads llmd_engine_info). */
Test(cli_generate, the_model_line_counts_the_matrices_per_type, .timeout = 60) {
    static const char *const cmds[] = {
        "generate -m dummy:tiny-256:q3_k_m -p 'Once upon a time' -n 4 --temp 0 -t 1",
        "generate -m dummy:tiny-256:q3_k_m -p 'Once upon a time' -n 4 --temp 0 -t 1 --spec "
        "ngram",
        "generate -m " REF_MODELS "/stories260K-q4_0.gguf -p 'Once upon a time' -n 4 --temp 0 "
        "-t 1",
    };
    static const char *const want[] = {"; matrices 17 q3_K, 10 q4_K, 2 q5_K, 1 q6_K\n",
                                       "; matrices 17 q3_K, 10 q4_K, 2 q5_K, 1 q6_K\n",
                                       "; matrices 31 q4_0, 5 f16, 1 q8_0\n"};
    for (int i = 0; i < 3; i++) {
        struct out o;
        llmd(&o, cmds[i]);
        cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
        cr_assert(strstr(o.text, want[i]), "'%s' not in %s", want[i], o.text);
    }
}

Test(cli_generate, zero_length_gguf_exits_1, .timeout = 60) {
    struct out o;
    char args[256];
    snprintf(args, sizeof(args), "generate -m %s -p hi", bad_copy(0, -1));
    llmd(&o, args);
    unlink(bad_copy(0, -1));
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd generate:") && strstr(o.text, "gguf"), "%s", o.text);
}

Test(cli_generate, truncated_gguf_exits_1, .timeout = 60) {
    static const size_t lens[] = {3, 24, 1000, 600000};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        struct out o;
        char args[256];
        snprintf(args, sizeof(args), "generate -m %s -p hi", bad_copy(lens[i], -1));
        llmd(&o, args);
        cr_assert_eq(o.code, 1, "truncated to %zu: exit %d: %s", lens[i], o.code, o.text);
        cr_assert(strstr(o.text, "gguf"), "%s", o.text);
    }
    unlink(bad_copy(0, -1));
}

Test(cli_generate, bit_flipped_gguf_exits_1, .timeout = 60) {
    /* byte 0: the magic; byte 4: the version; byte 8: the tensor count */
    static const long flips[] = {0, 4, 15, 23};
    for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
        struct out o;
        char args[256];
        snprintf(args, sizeof(args), "generate -m %s -p hi", bad_copy(1185376, flips[i]));
        llmd(&o, args);
        cr_assert_eq(o.code, 1, "flip at %ld: exit %d: %s", flips[i], o.code, o.text);
    }
    unlink(bad_copy(0, -1));
}

Test(cli_generate, prompt_longer_than_ctx_is_refused, .timeout = 60) {
    struct out o;
    llmd(&o, "generate -m " F32 " -p 'Once upon a time there was a big dog' --ctx 4");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "it leaves no room for output in the context of 4 tokens"), "%s",
              o.text);
    /* an empty prompt is BOS alone: the summary's singular */
    llmd(&o, "generate -m " F32 " -p '' -n 2");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd: prompt 1 token, prefill "), "%s", o.text);
    /* the singular where it is one */
    llmd(&o, "generate -m " F32 " -p 'Once' --ctx 1");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "the prompt is 2 tokens: it leaves no room for output in the context "
                             "of 1 token (prompt"),
              "%s", o.text);
}

/* A prompt exactly as long as --ctx leaves no room for a token, as in batch
 * and serve (the engine's rule), with or without --spec; one token shorter
 * gets one token. "Tom had a dog. The dog was big." is 14 tokens with BOS. */
Test(cli_generate, prompt_as_long_as_ctx_is_refused_as_batch_does, .timeout = 60) {
    static const char *const modes[] = {"", " --spec ngram"};
    for (int i = 0; i < 2; i++) {
        struct out o;
        char args[256];
        snprintf(args, sizeof args,
                 "generate -m " F32 " -p 'Tom had a dog. The dog was big.' --ctx 14 -n 5%s",
                 modes[i]);
        llmd(&o, args);
        cr_assert_eq(o.code, 1, "%s: exit %d: %s", modes[i], o.code, o.text);
        cr_assert(strstr(o.text, "the prompt is 14 tokens: it leaves no room for output in the "
                                 "context of 14 tokens"),
                  "%s: %s", modes[i], o.text);
        snprintf(args, sizeof args,
                 "generate -m " F32 " -p 'Tom had a dog. The dog was big.' --ctx 15 -n 5%s",
                 modes[i]);
        llmd(&o, args);
        cr_assert_eq(o.code, 0, "%s: exit %d: %s", modes[i], o.code, o.text);
        cr_assert(strstr(o.text, "generated 1 token, decode - (stop: "), "%s: %s", modes[i],
                  o.text);
    }
}

/* A budget under one context: the text up to it is printed, the summary
 * says kv_budget (as batch and serve do), the exit code is 1 and the reason
 * names the flag. A prompt larger than the whole pool is refused. */
Test(cli_generate, kv_budget_too_small_is_a_clear_error, .timeout = 60) {
    struct out o;
    /* one 20 KiB page holds 32 tokens of stories260K with an f16 KV: the
     * 5-token prompt leaves room for 27 */
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 64 --temp 0 --ctx 512 --kv-budget 10K");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "generated 27 tokens"), "%s", o.text);
    cr_assert(strstr(o.text, "(stop: kv_budget)"), "%s", o.text);
    cr_assert(strstr(o.text, "llmd generate: stopped after 27 tokens: the KV budget holds 32 "
                             "tokens of the 512-token context (raise --kv-budget)\n"),
              "%s", o.text);
    cr_assert(strstr(o.text, "Once upon a time, there was a little girl"), "the text: %s", o.text);
    llmd(&o, "generate -m " F32 " -p 'Once upon a time there was a little girl named Lily. She "
             "loved to play outside in the park with her dog' -n 4 --ctx 512 --kv-budget 10K");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "more than the KV budget holds (32 tokens): raise --kv-budget"), "%s",
              o.text);
    /* and a good run after the bad ones */
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 8 --temp 0 --ctx 512 --kv-budget 40K");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "(stop: length)"), "%s", o.text);
}

Test(cli_generate, usage_errors_exit_2, .timeout = 30) {
    struct out o;
    llmd(&o, "generate -p hi");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    llmd(&o, "generate -m x -p hi --top-p 7");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    llmd(&o, "frobnicate");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    llmd(&o, "generate --help");
    cr_assert_eq(o.code, 0);
    cr_assert(strstr(o.text, "--kv-budget"));
    cr_assert(
        strstr(o.text, "\nLLMD_ISA=scalar|avx2|avx-vnni|avx512|amx in the environment forces"),
        "%s", o.text);
}

Test(cli_generate, dummy_model_runs, .timeout = 60) {
    struct out o;
    /* one token per byte plus BOS and the dummy prefix: 34 tokens, more
     * than the prompt's 32 bytes (regress_dummy_long_prompt) */
    llmd(&o, "generate -m dummy:tiny -p 'Once upon a time there was a dog' -n 8 --seed 1");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "prompt 34 tokens"), "%s", o.text);
    cr_assert(strstr(o.text, "generated 8 tokens"), "%s", o.text);
}

Test(cli_generate, prompt_from_a_file, .timeout = 60) {
    char path[64], args[256];
    snprintf(path, sizeof(path), "/tmp/llmd-prompt-%d.txt", getpid());
    FILE *f = fopen(path, "w");
    fputs("Once upon a time", f);
    fclose(f);
    struct out o;
    snprintf(args, sizeof(args),
             "generate -m " F32 " -f %s -n 4 --temp 0 --ctx 512 --kv-type f32 --ids", path);
    llmd(&o, args);
    unlink(path);
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "ids: 432 383 286 261\n"), "%s", o.text);
}

/* A prompt file is read up to 64 MiB and no further: one of exactly 64 MiB
 * is read whole (its zeros then fail as a NUL byte), one byte more is
 * refused with the cap, and an endless stream stops there, not when
 * memory runs out. */
Test(cli_generate, regress_a_prompt_file_over_64_mib_is_refused, .timeout = 60) {
    char path[64], args[256];
    snprintf(path, sizeof(path), "/tmp/llmd-big-%d.txt", getpid());
    struct out o;
    snprintf(args, sizeof(args), "generate -m dummy:tiny -f %s -n 1", path);
    for (int over = 0; over <= 1; over++) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        cr_assert_eq(ftruncate(fileno(f), ((off_t)64 << 20) + over), 0);
        fclose(f);
        llmd(&o, args);
        cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
        cr_assert(strstr(o.text, over ? "is larger than 64 MiB, the most a prompt may hold"
                                      : "contains a NUL byte"),
                  "%zu bytes over: %s", (size_t)over, o.text);
    }
    unlink(path);
    llmd(&o, "generate -m dummy:tiny -f - -n 1 < /dev/zero");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd generate: stdin is larger than 64 MiB"), "%s", o.text);
}

Test(cli_generate, bad_values_name_their_option, .timeout = 30) {
    struct out o;
    llmd(&o, "generate -m x -p hi --top-p 1.5");
    cr_assert_eq(o.code, 2);
    /* what the flag takes, in the message: no "see --help for the range" */
    cr_assert_str_eq(o.text,
                     "llmd generate: invalid value '1.5' for --top-p: want a number in (0, 1]\n");
    llmd(&o, "generate -m x -p hi --temp -1");
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.text, "for --temp"), "%s", o.text);
    llmd(&o, "generate -m x -p hi -t 0");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd generate: invalid value '0' for --threads: want an integer "
                             "1..256\n");
    llmd(&o, "generate -m x -p hi --page-size 12Q");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd generate: invalid value '12Q' for --page-size: want a size in "
                             "bytes (K/M/G suffixes)\n");
    /* regress: strtoull skips blanks and wraps a minus: ' -1' ran as 2^64 - 1 bytes */
    llmd(&o, "generate -m x -p hi --kv-budget ' -1'");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd generate: invalid value ' -1' for --kv-budget: want a size in "
                             "bytes (K/M/G suffixes)\n");
    /* the ranges serve and batch give the same request fields: top_p 0 (one
     * token here, "off" in llmd.h), a temperature over 2, zero tokens */
    llmd(&o, "generate -m x -p hi --top-p 0");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd generate: invalid value '0' for --top-p: want a number in (0, "
                             "1]\n");
    llmd(&o, "generate -m x -p hi --temp 2.5");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd generate: invalid value '2.5' for --temp: want a number 0..2\n");
    llmd(&o, "generate -m x -p hi -n 0");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd generate: invalid value '0' for --n-predict: want an integer "
                             "1..16777216\n");
    /* and a good run after the bad ones */
    llmd(&o, "generate -m " F32 " -p 'Once' -n 2 --temp 0 -q");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
}

/* --kv-type: every type runs and the summary names it with its bytes a
 * token (stories260K: 5 layers x K and V of 4 heads x 8, padded to 64 B);
 * an unknown type is a usage error that lists the types. */
Test(cli_generate, kv_types_run_and_the_summary_names_them, .timeout = 60) {
    static const char *const want[] = {
        "llmd: KV f32, 1280 B a token (the stride), page 20480 B (16 tokens)",
        "llmd: KV f16, 640 B a token (the stride), page 20480 B (32 tokens)",
        "llmd: KV q8_0, 384 B a token (the stride), page 12288 B (32 tokens)",
        "llmd: KV q4_0, 192 B a token (the stride), page 12288 B (64 tokens)",
        "llmd: KV fp8, 512 B a token (the stride), page 8192 B (16 tokens)",
    };
    static const char *const types[] = {"f32", "f16", "q8_0", "q4_0", "fp8"};
    struct out o;
    char args[256];
    for (int i = 0; i < 5; i++) {
        snprintf(args, sizeof args,
                 "generate -m " F32 " -p 'Once upon a time' -n 6 --temp 0 --ctx 128 --kv-type %s "
                 "--ids",
                 types[i]);
        llmd(&o, args);
        cr_assert_eq(o.code, 0, "%s: exit %d: %s", types[i], o.code, o.text);
        cr_assert(strstr(o.text, want[i]), "%s: no '%s' in:\n%s", types[i], want[i], o.text);
        /* the first greedy tokens do not depend on the cache's precision */
        cr_assert(strstr(o.text, "ids: 432 383 286 261"), "%s: %s", types[i], o.text);
    }
    llmd(&o, "generate -m x -p hi --kv-type q4");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd generate: invalid value 'q4' for --kv-type: want f16, f32, "
                             "q8_0, q4_0 or fp8\n");
}

/* --device: "cuda" in a build without CUDA is a clear runtime error (exit 1)
 * naming the build that has it; a malformed value is a usage error. */
Test(cli_generate, device_cuda_without_cuda_build_says_how_to_get_it, .timeout = 60) {
    struct out o;
    llmd(&o, "generate -m " F32 " -p 'Once' -n 4 --temp 0 --device cuda");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "make cuda"), "%s", o.text);
    cr_assert(strncmp(o.text, "llmd generate: --device cuda:0: ", 32) == 0, "one prefix: %s",
              o.text);
    llmd(&o, "generate -m " F32 " -p 'Once' -n 4 --device cuda:1");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    llmd(&o, "generate -m " F32 " -p 'Once' -n 4 --device gpu");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "--device"), "%s", o.text);
    llmd(&o, "generate -m " F32 " -p 'Once' -n 4 --device cuda:x");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 8 --temp 0 --ctx 512 --kv-type f32 "
             "--ids -t 1 --device cpu");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "ids: 432 383 286 261 376 298 315 421"), "%s", o.text);
}

/* `make run` (tools/run_main.sh) runs the reference model without a warning
 * about a --ctx the user never typed: it used to add --ctx 512 and so open
 * with generate's "exceeds the model's context_length" line. */
Test(cli_generate, make_run_opens_without_a_warning, .timeout = 60) {
    struct out o;
    const char *build = getenv("LLMD_BUILD");
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "tools/run_main.sh %s/llmd '' 'Once upon a time' 8 2>&1",
             build ? build : "build/debug");
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(o.text, 1, sizeof(o.text) - 1, p);
    o.text[n] = '\0';
    cr_assert_eq(pclose(p), 0, "%s", o.text);
    cr_assert(strncmp(o.text, "Once upon a time, there was a little girl", 41) == 0, "%s", o.text);
    cr_assert_null(strstr(o.text, "warning"), "%s", o.text);
    cr_assert(strstr(o.text, "generated 8 tokens"), "%s", o.text);
}

/* regress: -p with -f said "-m MODEL and one of -p TEXT or -f FILE are
 * required", though both were given: they exclude each other. */
Test(cli_generate, regress_prompt_and_file_exclude_each_other, .timeout = 30) {
    struct out o;
    llmd(&o, "generate -m " F32 " -p hi -f /nonexistent");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    cr_assert_str_eq(o.text, "llmd generate: -p TEXT and -f FILE exclude each other: give one "
                             "prompt\n");
    llmd(&o, "generate -m " F32);
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "one of -p TEXT or -f FILE are required"), "%s", o.text);
}

/* regress: --seed -1 was refused while serve's and batch's "seed": -1 is a
 * seed (engine/serve/req.c: any 64-bit integer, a negative one as its two's
 * complement, llmd.h's uint64_t). Now the same here: -1 is seed 2^64-1,
 * the same text; a suffix ("1K", which --seed took as 1024) is refused. */
Test(cli_generate, regress_seed_takes_what_the_seed_field_takes, .timeout = 60) {
    struct out a, b;
    llmd(&a, "generate -m " F32 " -p 'Once upon a time' -n 12 --temp 1 --seed -1 --ids -t 1");
    cr_assert_eq(a.code, 0, "exit %d: %s", a.code, a.text);
    cr_assert(strstr(a.text, ", seed 18446744073709551615\n"), "%s", a.text);
    llmd(&b, "generate -m " F32 " -p 'Once upon a time' -n 12 --temp 1 --seed "
             "18446744073709551615 --ids -t 1");
    cr_assert_eq(b.code, 0, "exit %d: %s", b.code, b.text);
    const char *ia = strstr(a.text, "ids:"), *ib = strstr(b.text, "ids:");
    cr_assert(ia && ib, "%s", a.text);
    cr_assert_eq(strcspn(ia, "\n"), strcspn(ib, "\n"));
    cr_assert(strncmp(ia, ib, strcspn(ia, "\n")) == 0, "%s\n%s", a.text, b.text);
    llmd(&a, "generate -m " F32 " -p hi --seed 1K");
    cr_assert_eq(a.code, 2, "exit %d: %s", a.code, a.text);
    cr_assert_str_eq(a.text, "llmd generate: invalid value '1K' for --seed: want an integer, "
                             "-9223372036854775808..18446744073709551615\n");
    llmd(&a, "generate -m " F32 " -p hi --seed -9223372036854775809");
    cr_assert_eq(a.code, 2, "exit %d: %s", a.code, a.text);
}

/* vm.max_map_count, or 0 when it cannot be read. */
static long max_map_count(void) {
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    long v = 0;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

/* regress: the mapping-limit refusal suggested --kv-budget, which cannot
 * help (the worst case is every page of the context mapped, whatever the
 * budget): only the flags that lower it. Another KV error keeps all three. */
Test(cli_generate, regress_the_mapping_limit_names_the_flags_that_help, .timeout = 60) {
    long limit = max_map_count();
    if (limit <= 0 || limit > 400000)
        cr_skip_test("vm.max_map_count %ld: 2^24 tokens in 32-token pages fit", limit);
    struct out o;
    llmd(&o, "generate -m " F32 " -p hi -c 16777216 --kv-budget 1M -q");
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "vm.max_map_count"), "%s", o.text);
    cr_assert(strstr(o.text, "fewer max_tokens (options: --ctx, --page-size)\n"), "%s", o.text);
}

/* regress: --help said the default page is 16 tokens; it is 16 tokens'
 * bytes rounded up (stories260K with f16 KV: 32 tokens), as the summary
 * shows. */
Test(cli_generate, regress_help_says_what_the_default_page_holds, .timeout = 60) {
    struct out o;
    llmd(&o, "generate --help");
    cr_assert_eq(o.code, 0);
    cr_assert(strstr(o.text, "default: 16 tokens'\n                       bytes); rounded up to "
                             "whole tokens and 4 KiB host pages,\n                       and "
                             "reported (stories260K, f16 KV: 32 tokens a page)\n"),
              "%s", o.text);
    llmd(&o, "generate -m " F32 " -p hi -n 1");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "KV f16, 640 B a token (the stride), page 20480 B (32 tokens)"), "%s",
              o.text);
}

/* regress: a --page-size or --kv-budget over what the context can use was
 * capped in silence (99999G ran with 80 KiB pages). Now a note names the
 * flag and what it got, on the single-sequence path and the engine's
 * (--spec); rounding up a page or down to whole pages is no cap. */
Test(cli_generate, regress_a_page_or_budget_over_the_context_is_named, .timeout = 60) {
    struct out o;
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 4 --temp 0 --page-size 99999G");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd generate: --page-size 99999G is more than a context of 128 "
                             "tokens can use; pages are 81920 B (128 tokens)\n"),
              "%s", o.text);
    cr_assert(strstr(o.text, "Once upon a time, there was"), "%s", o.text);
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 4 --temp 0 --kv-budget 100G");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd generate: --kv-budget 100G is more than 1 sequence of 128 "
                             "tokens can use; the KV pool is 4 pages of 20480 B (81920 B)\n"),
              "%s", o.text);
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 4 --temp 0 --spec ngram --page-size 1M "
             "--kv-budget 1000000");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd generate: --page-size 1M is more than a context of 128 tokens "
                             "can use; pages are 81920 B (128 tokens)\n"),
              "%s", o.text);
    cr_assert(strstr(o.text, "llmd generate: --kv-budget 1000000 is more than 1 sequence of "
                             "128 tokens can use; the KV pool is 1 page of 81920 B (81920 B)\n"),
              "%s", o.text);
    /* regress: 81921..82559 B (under a token past the context) escaped the cap and
     * gave 100 KiB pages, more than 82560 B gave */
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 4 --temp 0 --page-size 81921");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd generate: --page-size 81921 is more than a context of 128 "
                             "tokens can use; pages are 81920 B (128 tokens)\n"),
              "%s", o.text);
    llmd(&o, "generate -m " F32 " -p 'Once upon a time' -n 4 --temp 0 --page-size 1 "
             "--kv-budget 30000");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert_null(strstr(o.text, "can use"), "%s", o.text);
    cr_assert(strstr(o.text, "page 20480 B (32 tokens), pages mapped 1 of 1"), "%s", o.text);
}

/* --spec ngram: the prompt runs through the engine, which verifies drafts;
 * greedy ids are those of the plain run, and the summary says what was
 * drafted. Bad values name the flag; --spec-tokens alone is a usage error. */
Test(cli_generate, spec_gives_the_same_ids_and_says_what_it_drafted, .timeout = 120) {
    struct out plain, spec;
    const char *p = "'The cat was very happy. The cat was very happy. The cat'";
    char args[512];
    snprintf(args, sizeof args, "generate -m %s -p %s -n 40 --temp 0 --ids --no-echo", F32, p);
    llmd(&plain, args);
    cr_assert_eq(plain.code, 0, "exit %d: %s", plain.code, plain.text);
    snprintf(args, sizeof args,
             "generate -m %s -p %s -n 40 --temp 0 --ids --no-echo --spec ngram --spec-tokens 6",
             F32, p);
    llmd(&spec, args);
    cr_assert_eq(spec.code, 0, "exit %d: %s", spec.code, spec.text);
    const char *a = strstr(plain.text, "ids:"), *b = strstr(spec.text, "ids:");
    cr_assert(a && b, "%s\n---\n%s", plain.text, spec.text);
    cr_assert_eq(strcspn(a, "\n"), strcspn(b, "\n"));
    cr_assert(strncmp(a, b, strcspn(a, "\n")) == 0, "%s\n---\n%s", plain.text, spec.text);
    /* the text before the ids is the same too */
    cr_assert(strncmp(plain.text, spec.text, (size_t)(a - plain.text)) == 0, "%s\n---\n%s",
              plain.text, spec.text);
    cr_assert(strstr(spec.text, "speculative decoding (ngram, up to 6 tokens):"), "%s", spec.text);
    cr_assert(strstr(spec.text, "(stop: length)"), "%s", spec.text);
    /* the model line of the plain path, from llmd_engine_info (its matrices
     * copied from the avx2 level up: model.h) */
    const char *line = kern_isa() >= KERN_ISA_AVX2
                           ? "llmd: model stories260K-f32: 5 layers, n_embd 64, heads 8/4, vocab "
                             "512, 1.2 MB of weights (+1.0 MB copied), loaded in "
                           : "llmd: model stories260K-f32: 5 layers, n_embd 64, heads 8/4, vocab "
                             "512, 1.2 MB of weights, loaded in ";
    cr_assert(strstr(spec.text, line), "%s", spec.text);
    cr_assert(strstr(plain.text, line), "%s", plain.text);
    /* the engine's path warns of a --ctx over the model's as the plain one
     * does (it said nothing), and one token is a token */
    snprintf(args, sizeof args,
             "generate -m %s -p %s -n 4 --temp 0 --no-echo --ctx 512 --spec ngram --spec-tokens 1",
             F32, p);
    llmd(&spec, args);
    cr_assert_eq(spec.code, 0, "exit %d: %s", spec.code, spec.text);
    cr_assert(strstr(spec.text, "llmd generate: warning: --ctx 512 exceeds the model's "
                                "context_length 128;"),
              "%s", spec.text);
    cr_assert(strstr(spec.text, "speculative decoding (ngram, up to 1 token):"), "%s", spec.text);
    llmd(&spec, "generate -m x -p hi --spec medusa");
    cr_assert_eq(spec.code, 2);
    cr_assert_str_eq(
        spec.text, "llmd generate: invalid value 'medusa' for --spec: want ngram, draft or none\n");
    llmd(&spec, "generate -m x -p hi --spec ngram --spec-tokens 33");
    cr_assert_eq(spec.code, 2);
    cr_assert_str_eq(spec.text, "llmd generate: invalid value '33' for --spec-tokens: want an "
                                "integer 1..32\n");
    llmd(&spec, "generate -m x -p hi --spec-tokens 4");
    cr_assert_eq(spec.code, 2);
    cr_assert_str_eq(spec.text,
                     "llmd generate: --spec-tokens needs --spec ngram or --spec draft\n");
}

/* Sampled text is the same with --spec as without, to the byte: the seed
 * draws the same ids (smp_verify), and an answer that ends inside a UTF-8
 * character ends with U+FFFD on both paths (a fresh-eyes run: the engine's
 * path dropped the held bytes, the plain path printed U+FFFD). The random
 * dummy model samples byte tokens; at seed 3 its last token is the first
 * byte of a character with -n 120, 128 and 160 in ggml's AVX2 order (the
 * avx2 and avx-vnni levels), with -n 100, 128 and 160 in the one-sum order
 * (avx512, amx) and with -n 100 and 136 in the portable order (scalar: the
 * suite run with LLMD_ISA=scalar found no cut answer among 120, 128 and
 * 160). */
Test(cli_generate, regress_sampled_text_with_spec_is_the_plain_text, .timeout = 120) {
    const char *p = "'abc abc abc abc abc abc abc abc abc abc abc abc abc abc'";
    static const char *const modes[] = {"", " --spec ngram --spec-tokens 8",
                                        " --spec draft --spec-model dummy:tiny-256:q4_k_m"};
    static struct out o[3];
    int ended_cut = 0;
    static const int ns[] = {100, 120, 128, 136, 160};
    for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
        for (int m = 0; m < 3; m++) {
            const int n = ns[ni];
            char args[512];
            snprintf(args, sizeof args,
                     "generate -m dummy:tiny-256:q4_k_m -p %s -n %d -c 256 --seed 3 --temp 0.7 "
                     "--no-echo -q%s",
                     p, n, modes[m]);
            llmd(&o[m], args);
            cr_assert_eq(o[m].code, 0, "%s: exit %d: %s", args, o[m].code, o[m].text);
            if (m == 0) {
                size_t len = strlen(o[0].text);
                ended_cut += len >= 4 && strcmp(o[0].text + len - 4, "\xef\xbf\xbd\n") == 0;
            } else {
                cr_assert_str_eq(o[m].text, o[0].text, "-n %d%s", n, modes[m]);
            }
        }
    cr_assert_gt(ended_cut, 0, "some answer ends inside a character");
}

/* --spec draft: the greedy ids of the plain run, drafted by the q8_0 copy
 * of the model; the summary names the draft and its share of the KV. */
Test(cli_generate, spec_draft_gives_the_same_ids_and_names_the_draft, .timeout = 120) {
    struct out plain, spec;
    char args[512];
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 40 --temp 0 --ids", F32);
    llmd(&plain, args);
    cr_assert_eq(plain.code, 0, "exit %d: %s", plain.code, plain.text);
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 40 --temp 0 --ids --spec draft "
             "--spec-model " REF_MODELS "/stories260K-q8_0.gguf --spec-tokens 4",
             F32);
    llmd(&spec, args);
    cr_assert_eq(spec.code, 0, "exit %d: %s", spec.code, spec.text);
    const char *a = strstr(plain.text, "ids:"), *b = strstr(spec.text, "ids:");
    cr_assert(a && b, "%s\n---\n%s", plain.text, spec.text);
    cr_assert(strncmp(a, b, strcspn(a, "\n") + 1) == 0, "%s\n---\n%s", plain.text, spec.text);
    cr_assert(strstr(spec.text, "speculative decoding (draft model stories260K-q8_0, up to 4 "
                                "tokens):"),
              "%s", spec.text);
    cr_assert(strstr(spec.text, "the draft model's KV: 640 B of each token's 1280 B"), "%s",
              spec.text);
}

/* The draft-model flags are checked alike by generate, batch and serve:
 * the same message after the command's name, exit 2 (usage); a draft of
 * another vocabulary is refused by all three naming the first difference. */
Test(cli_generate, spec_draft_flags_say_the_same_in_every_command, .timeout = 60) {
    static const char *const cmds[] = {"generate -p hi", "batch -i /dev/null", "serve --port 0"};
    static const struct {
        const char *flags, *msg;
        int code;
    } cases[] = {
        {"--spec draft",
         ": --spec draft needs --spec-model PATH (a GGUF with the model's "
         "vocabulary)\n",
         2},
        {"--spec-model x.gguf", ": --spec-model needs --spec draft\n", 2},
        {"--spec ngram --spec-model x.gguf", ": --spec-model needs --spec draft\n", 2},
        {"--spec draft --spec-model dummy:tiny",
         ": --spec-model dummy:tiny: token 259 is '\\xe2\\x96\\x81' there and "
         "'\\xe2\\x96\\x81t' in the target\n",
         1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t k = 0; k < 3; k++) {
            struct out o;
            char args[512], want[512];
            snprintf(args, sizeof args, "%s -m %s %s", cmds[k], F32, cases[c].flags);
            llmd(&o, args);
            size_t name = strcspn(cmds[k], " ");
            snprintf(want, sizeof want, "llmd %.*s%s", (int)name, cmds[k], cases[c].msg);
            cr_assert_eq(o.code, cases[c].code, "%s: exit %d: %s", args, o.code, o.text);
            cr_assert(strstr(o.text, want), "%s: no '%s' in:\n%s", args, want, o.text);
        }
}

/* regress: with --spec the engine path took --kv-type as f16 unless it was
 * f32 (the summary said "KV f32" for q4_0). Now the engine gets the type:
 * the summary names it, and greedy ids equal the plain q4_0 run's. */
Test(cli_generate, regress_spec_keeps_the_kv_type, .timeout = 60) {
    struct out plain, spec;
    const char *args = "generate -m " F32 " -p 'The cat sat. The cat sat. The cat' -n 30 --temp 0 "
                       "--ids --no-echo -t 1 --kv-type q4_0";
    char cmd[512];
    llmd(&plain, args);
    cr_assert_eq(plain.code, 0, "exit %d: %s", plain.code, plain.text);
    snprintf(cmd, sizeof cmd, "%s --spec ngram", args);
    llmd(&spec, cmd);
    cr_assert_eq(spec.code, 0, "exit %d: %s", spec.code, spec.text);
    cr_assert(strstr(spec.text, "llmd: KV q4_0, 192 B a token (the stride), page 12288 B (64 "
                                "tokens)"),
              "%s", spec.text);
    const char *a = strstr(plain.text, "ids:"), *b = strstr(spec.text, "ids:");
    cr_assert(a && b, "%s\n---\n%s", plain.text, spec.text);
    cr_assert_eq(strcspn(a, "\n"), strcspn(b, "\n"));
    cr_assert(strncmp(a, b, strcspn(a, "\n")) == 0, "%s\n---\n%s", plain.text, spec.text);
}
