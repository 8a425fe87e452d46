/* llmd - command-line entry point: dispatches to the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmd_cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: llmd <command> [options]\n"
               "\n"
               "commands:\n"
               "  generate   run one prompt through a model and print the text\n"
               "  dummy      write a random-weight model of a named shape as GGUF\n"
               "\n"
               "`llmd <command> --help` describes a command.\n");
}

bool cli_parse_size(const char *s, uint64_t *out) {
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return false;
    uint64_t mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    default:
        break;
    }
    if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end != '\0' || (v != 0 && mul > UINT64_MAX / v))
        return false;
    *out = (uint64_t)v * mul;
    return true;
}

bool cli_parse_long(const char *s, long min, long max, long *out) {
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, float *out) {
    errno = 0;
    char *end;
    float v = strtof(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v))
        return false;
    *out = v;
    return true;
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
    if (strcmp(argv[1], "generate") == 0)
        return cli_generate(argc - 1, argv + 1);
    if (strcmp(argv[1], "dummy") == 0)
        return cli_dummy(argc - 1, argv + 1);
    fprintf(stderr, "llmd: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
