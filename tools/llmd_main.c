/* llmd - command-line entry point: dispatches to the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <getopt.h>

#include "llmd_cli.h"
#include "mem.h"

static void usage(FILE *f) {
    fprintf(f, "usage: llmd <command> [options]\n"
               "\n"
               "commands:\n"
               "  generate   run one prompt through a model and print the text\n"
               "  batch      run many prompts (JSON lines) together: continuous batching,\n"
               "             prefix cache, host/NVMe KV tiers\n"
               "  dummy      write a random-weight model of a named shape as GGUF\n"
               "  serve      serve a model over an OpenAI-compatible HTTP API\n"
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

bool cli_parse_device(const char *s, bool *cuda, int *index) {
    if (strcmp(s, "cpu") == 0) {
        *cuda = false;
        *index = 0;
        return true;
    }
    if (strncmp(s, "cuda", 4) != 0)
        return false;
    long n = 0;
    if (s[4] == ':' && !cli_parse_long(s + 5, 0, 63, &n))
        return false;
    if (s[4] != '\0' && s[4] != ':')
        return false;
    *cuda = true;
    *index = (int)n;
    return true;
}

const char *cli_opt_name(const struct option *opts, int c, int li) {
    static char buf[64];
    for (int i = 0; opts[i].name; i++)
        if ((li >= 0 && i == li) || (li < 0 && opts[i].val == c)) {
            snprintf(buf, sizeof(buf), "--%s", opts[i].name);
            return buf;
        }
    snprintf(buf, sizeof(buf), "-%c", c);
    return buf;
}

int cli_read_file(const char *path, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *buf = mem_alloc(MEM_CLI, cap);
    int rc = 0;
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        char *nb = mem_realloc(buf, cap * 2);
        if (!nb) {
            mem_free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (!buf)
        rc = -ENOMEM;
    else if (ferror(f))
        rc = -EIO;
    if (f != stdin)
        fclose(f);
    if (rc < 0) {
        mem_free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
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
    if (strcmp(argv[1], "dummy") == 0) {
        argv[1] = (char *)"llmd dummy";
        return cli_dummy(argc - 1, argv + 1);
    }
    fprintf(stderr, "llmd: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
