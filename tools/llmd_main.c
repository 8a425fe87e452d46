/* llmd - command-line entry point: dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "llmd_cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: llmd <command> [options]\n"
               "\n"
               "commands:\n"
               "  generate   run one prompt through a model and print the text\n"
               "  batch      run many prompts (JSON lines) together: continuous batching,\n"
               "             prefix cache, host/NVMe KV tiers\n"
               "  dummy      write a random-weight model of a named shape as GGUF\n"
               "  eval       what each KV cache type costs in quality: KL from f32, top-1,\n"
               "             perplexity over a text\n"
               "  serve      serve a model over an OpenAI-compatible HTTP API\n"
               "  tokenize   a text's token ids, as a model's tokenizer splits it\n"
               "  vocab      a vocabulary-only GGUF from a Hugging Face tokenizer.json\n"
               "\n"
               "`llmd <command> --help` describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_OK;
    }
    /* getopt prints argv[0] in its messages: name the subcommand fully */
    if (strcmp(argv[1], "generate") == 0) {
        argv[1] = (char *)"llmd generate";
        return cli_generate(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "batch") == 0) {
        argv[1] = (char *)"llmd batch";
        return cli_batch(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "serve") == 0) {
        argv[1] = (char *)"llmd serve";
        return cli_serve(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "eval") == 0) {
        argv[1] = (char *)"llmd eval";
        return cli_eval(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "tokenize") == 0) {
        argv[1] = (char *)"llmd tokenize";
        return cli_tokenize(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "vocab") == 0) {
        argv[1] = (char *)"llmd vocab";
        return cli_vocab(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "dummy") == 0) {
        argv[1] = (char *)"llmd dummy";
        return cli_dummy(argc - 1, argv + 1);
    }
    fprintf(stderr, "llmd: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
