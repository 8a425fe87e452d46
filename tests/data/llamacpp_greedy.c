/* llamacpp_greedy.c - greedy token ids from llama.cpp, for test data.
 *
 * Not part of the build: it links against a llama.cpp build (the oracle,
 * never vendored). It prints, for each prompt, one JSON line with the
 * prompt's ids (llama_tokenize with add_special = true, parse_special =
 * false: BOS and the SentencePiece dummy prefix, as llmd's tok_encode),
 * the first n_gen greedy ids (argmax over the logits, the lowest id on a
 * tie) and the smallest top-2 logit margin seen. The whole prompt is one
 * batch, then one token per step, on one thread, KV cache in f32 (what
 * llmd's reference tests use), n_ctx 512: the settings of the driver that
 * made ../shared/models/reference.jsonl's llama.cpp lines (described in its
 * README; that driver is not in the tree, this one is written to match it).
 *
 * Build (llama.cpp c392e50 in $LC, built with cmake into $LC/build):
 *   cc -O2 -o llamacpp_greedy tests/data/llamacpp_greedy.c -I$LC/include \
 *      -I$LC/ggml/include -L$LC/build/bin -Wl,-rpath,$LC/build/bin -lllama -lggml
 * Run: llamacpp_greedy MODEL.gguf N_GEN PROMPT...
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf N_GEN PROMPT...\n", argv[0]);
        return 2;
    }
    const int n_gen = atoi(argv[2]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (int p = 3; p < argc; p++) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 512;
        cp.n_batch = 512;
        cp.n_threads = cp.n_threads_batch = 1;
        cp.type_k = cp.type_v = GGML_TYPE_F32;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "cannot create a context\n");
            return 1;
        }
        llama_token ids[512];
        int n = llama_tokenize(vocab, argv[p], (int)strlen(argv[p]), ids, 512, true, false);
        if (n < 0 || n + n_gen > 512) {
            fprintf(stderr, "prompt %d: %d tokens\n", p - 2, n);
            return 1;
        }
        printf("{\"prompt\": ");
        json_str(argv[p]);
        printf(", \"prompt_ids\": [");
        for (int i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", ids[i]);
        printf("], \"greedy_ids\": [");
        struct llama_batch b = llama_batch_get_one(ids, n);
        double min_margin = INFINITY;
        for (int g = 0; g < n_gen; g++) {
            if (llama_decode(ctx, b)) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            const float *lg = llama_get_logits_ith(ctx, -1);
            int best = 0;
            for (int i = 1; i < n_vocab; i++)
                if (lg[i] > lg[best])
                    best = i;
            float second = -INFINITY;
            for (int i = 0; i < n_vocab; i++)
                if (i != best && lg[i] > second)
                    second = lg[i];
            if (lg[best] - second < min_margin)
                min_margin = lg[best] - second;
            printf("%s%d", g ? ", " : "", best);
            ids[n + g] = best;
            b = llama_batch_get_one(&ids[n + g], 1);
        }
        printf("], \"min_top2_margin\": %.6g}\n", min_margin);
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
