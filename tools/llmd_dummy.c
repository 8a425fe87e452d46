/* llmd dummy - write a random-weight model of a named shape as a GGUF file,
 * so that llmd and other engines can run on exactly the same weights. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/model_dummy.h"
#include "llmd_cli.h"

static void dummy_usage(FILE *f) {
    fprintf(f,
            "usage: llmd dummy --shape NAME [--type TYPE] [--arch ARCH] -o FILE.gguf\n"
            "\n"
            "Writes a model (Llama, or --arch) with random weights (uniform, seeded: the same "
            "shape and\n"
            "type give the same bytes) and a byte-by-byte SentencePiece tokenizer.\n"
            "  -s, --shape NAME   %s\n"
            "  -t, --type TYPE    %s\n"
            "                     (default f16; f32 for tiny); q2_k_m, q3_k_m, q4_k_m and\n"
            "                     q5_k_m are llama-quantize's Q2_K (\"Q2_K - Medium\"),\n"
            "                     Q3_K_M, Q4_K_M and Q5_K_M mixes;\n"
            "                     q2_k..q6_k put every matrix in that type; a K-quant\n"
            "                     matrix whose rows are not whole 256-blocks (all of\n"
            "                     tiny's) is written q8_0 instead (docs/generate.md)\n"
            "  -a, --arch ARCH    %s\n"
            "                     (default llama; qwen2: Q/K/V biases; qwen3: per-head Q/K\n"
            "                     norms, head_dim 2 n_embd / n_head; llama3: RoPE base\n"
            "                     500000 and Llama 3.1's rope_freqs.weight)\n"
            "  -o, --output FILE  where to write the GGUF\n",
            model_dummy_shapes(), model_dummy_types(), model_dummy_archs());
}

int cli_dummy(int argc, char **argv) {
    static const struct option opts[] = {
        {"shape", required_argument, 0, 's'},  {"type", required_argument, 0, 't'},
        {"output", required_argument, 0, 'o'}, {"arch", required_argument, 0, 'a'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    const char *shape = NULL, *type = NULL, *path = NULL, *arch = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "s:t:o:a:h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            shape = optarg;
            break;
        case 't':
            type = optarg;
            break;
        case 'o':
            path = optarg;
            break;
        case 'a':
            arch = optarg;
            break;
        case 'h':
            dummy_usage(stdout);
            return CLI_OK;
        default:
            dummy_usage(stderr);
            return CLI_USAGE;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "llmd dummy: unexpected argument '%s'\n", argv[optind]);
        return CLI_USAGE;
    }
    if (!shape || !path) {
        fprintf(stderr, "llmd dummy: --shape and --output are required\n");
        dummy_usage(stderr);
        return CLI_USAGE;
    }
    char spec[128], err[256] = "";
    snprintf(spec, sizeof(spec), "%s:%s%s%s", shape,
             type                         ? type
             : strcmp(shape, "tiny") == 0 ? "f32"
                                          : "f16",
             arch ? ":" : "", arch ? arch : "");
    int rc = model_dummy_write_file(spec, path, err, sizeof(err));
    if (rc < 0) {
        /* err starts with "dummy: " */
        fprintf(stderr, "llmd %s\n", err);
        return rc == -EINVAL && !strstr(err, "writing") ? CLI_USAGE : CLI_ERR;
    }
    fprintf(stderr, "llmd dummy: wrote %s to %s\n", spec, path);
    return CLI_OK;
}
