/* llmd - command-line entry point. Subcommands are added as they land. */
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: llmd <command> [options]\n"
               "\n"
               "commands:\n"
               "  generate   run one prompt through a GGUF model and print the text\n"
               "\n"
               "`llmd <command> --help` describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    fprintf(stderr, "llmd: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 1;
}
