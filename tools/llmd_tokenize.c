/* llmd tokenize - a text's token ids as a model's tokenizer gives them to
 * the engine: user text (a special token's string, "<|eot_id|>", stays
 * text), BOS first only where the vocabulary says so (the same default as
 * generate's and serve's prompts). Reads only the GGUF's tokenizer keys, so
 * a vocabulary-only file (`llmd vocab`) does as well as a model. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/gguf.h"
#include "engine/model/model_dummy.h"
#include "engine/model/tok.h"
#include "llmd_cli.h"
#include "mem.h"

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: llmd tokenize -m MODEL.gguf (-p TEXT | -f FILE) [--ids] [--no-bos]\n"
               "\n"
               "Prints the token ids of TEXT (or FILE's bytes, '-': stdin) as the model's\n"
               "tokenizer encodes a prompt: one line a token, its id, a tab and its piece as\n"
               "a JSON-style quoted string; with --ids one JSON array of the ids instead.\n"
               "  -m, --model FILE   a GGUF model, a vocabulary alone (llmd vocab), or\n"
               "                     dummy:SHAPE[:TYPE[:ARCH]]\n"
               "  -p, --prompt TEXT  the text\n"
               "  -f, --file FILE    the text from a file, up to 64 MiB\n"
               "      --ids          one JSON array of ids on one line\n"
               "      --no-bos       no BOS even where the vocabulary adds one\n" CLI_PRE_HELP);
}

/* The piece as a quoted string: \" \\ \n \r \t, other bytes below 0x20 or
 * not in valid UTF-8 as \xNN (a byte token may hold half a character). */
static void tokenize_quote(FILE *out, const unsigned char *p, size_t n) {
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        size_t k = c < 0x80                ? 1
                   : c >= 0xC2 && c < 0xE0 ? 2
                   : c >= 0xE0 && c < 0xF0 ? 3
                   : c >= 0xF0 && c < 0xF5 ? 4
                                           : 0;
        bool whole = k > 0 && i + k <= n;
        for (size_t j = 1; whole && j < k; j++)
            whole = (p[i + j] & 0xC0) == 0x80;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c == '\r')
            fputs("\\r", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c < 0x20 || c == 0x7F || !whole)
            fprintf(out, "\\x%02x", c);
        else {
            fwrite(p + i, 1, k, out);
            i += k - 1;
        }
    }
    fputc('"', out);
}

int cli_tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},  {"ids", no_argument, 0, 'I'},
        {"no-bos", no_argument, 0, 'B'},      {"tokenizer-pre", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    const char *model = NULL, *prompt = NULL, *file = NULL, *pre = NULL;
    bool ids_only = false, no_bos = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'p':
            prompt = optarg;
            break;
        case 'f':
            file = optarg;
            break;
        case 'I':
            ids_only = true;
            break;
        case 'B':
            no_bos = true;
            break;
        case 'P':
            pre = optarg;
            if (!cli_parse_pre(optarg)) {
                fprintf(stderr, "llmd tokenize: invalid value '%s' for --tokenizer-pre: want %s\n",
                        optarg, CLI_PRE_WANT);
                return CLI_USAGE;
            }
            break;
        case 'h':
            tokenize_usage(stdout);
            return CLI_OK;
        default:
            tokenize_usage(stderr);
            return CLI_USAGE;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "llmd tokenize: unexpected argument '%s'\n", argv[optind]);
        return CLI_USAGE;
    }
    if (prompt && file) {
        fprintf(stderr, "llmd tokenize: -p and -f exclude each other: give the text one way\n");
        return CLI_USAGE;
    }
    if (!model || (!prompt && !file)) {
        fprintf(stderr, "llmd tokenize: -m and one of -p or -f are required\n");
        tokenize_usage(stderr);
        return CLI_USAGE;
    }
    char *text = NULL, err[512] = "";
    size_t len = prompt ? strlen(prompt) : 0;
    int rc;
    if (file && (rc = cli_read_file(file, CLI_PROMPT_FILE_MAX, &text, &len)) < 0) {
        cli_read_file_err("llmd tokenize", "a text to tokenize", file, CLI_PROMPT_FILE_MAX, rc);
        return CLI_ERR;
    }
    struct gguf *g = NULL;
    struct tok *t = NULL;
    int status = CLI_ERR;
    int32_t *ids = NULL;
    size_t n = 0;
    void *dummy = NULL; /* dummy:SPEC, as the other commands take it: its image in memory */
    size_t dummy_len = 0;
    if (strncmp(model, "dummy:", 6) == 0)
        rc = model_dummy_write_mem(model + 6, &dummy, &dummy_len, err, sizeof(err));
    else
        rc = 0;
    if (rc == 0)
        rc = dummy ? gguf_open_mem(dummy, dummy_len, &g, err, sizeof(err))
                   : gguf_open(model, &g, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "llmd tokenize: %s: %s\n", model, err[0] ? err : strerror(-rc));
        goto out;
    }
    if ((rc = tok_create_pre(g, pre, &t, err, sizeof(err))) < 0) {
        fprintf(stderr, "llmd tokenize: %s: %s\n", model, err[0] ? err : strerror(-rc));
        goto out;
    }
    if ((rc = tok_encode_alloc(t, prompt ? prompt : text, len, !no_bos && tok_add_bos_default(t), 0,
                               &ids, &n)) < 0) {
        fprintf(stderr, "llmd tokenize: %s\n", strerror(-rc));
        goto out;
    }
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        puts("]");
    } else {
        for (size_t i = 0; i < n; i++) {
            char piece[512];
            size_t pn = 0;
            tok_piece(t, ids[i], piece, sizeof(piece), &pn);
            printf("%d\t", ids[i]);
            tokenize_quote(stdout, (const unsigned char *)piece,
                           pn < sizeof(piece) ? pn : sizeof(piece));
            putchar('\n');
        }
    }
    status = fflush(stdout) == 0 ? CLI_OK : CLI_ERR;
out:
    mem_free(ids);
    tok_destroy(t);
    gguf_close(g);
    mem_free(dummy);
    mem_free(text);
    return status;
}
