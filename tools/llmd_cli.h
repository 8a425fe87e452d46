/* llmd_cli.h - the `llmd` command's subcommands (llmd_<name>.c, dispatched by
 * llmd_main.c) and the option parsing they share (llmd_cli.c). */
#ifndef LLMD_CLI_H
#define LLMD_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Exit codes: 0 success, 1 runtime error (bad model file, out of memory,
 * context overflow), 2 usage error, 3 (batch) the run went through but some
 * lines failed: each has its error in the output. */
enum { CLI_OK = 0, CLI_ERR = 1, CLI_USAGE = 2, CLI_PARTIAL = 3 };

int cli_generate(int argc, char **argv);
int cli_dummy(int argc, char **argv);
int cli_batch(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_vocab(int argc, char **argv);
int cli_tokenize(int argc, char **argv);

/* For the model line: " (+N.N MB packed)" when packed_bytes > 0 (the CPU
 * kernels' repacked copies), " (+N.N MB copied)" when copied_bytes > 0 (the
 * matrices copied as they are), both as " (+N.N MB packed, +M.M MB
 * copied)", else "". A buffer of 64 bytes holds any of them. */
void cli_packed(char *buf, size_t cap, uint64_t packed_bytes, uint64_t copied_bytes);

/* "4096", "64K", "2M", "1G", "2MiB" -> bytes. false on a malformed value. */
bool cli_parse_size(const char *s, uint64_t *out);
/* A decimal integer in [min, max]. */
bool cli_parse_long(const char *s, long min, long max, long *out);
bool cli_parse_float(const char *s, float *out);
/* "cpu", "cuda" or "cuda:N" (N a device ordinal, 0..63) -> *cuda and *index
 * (0 for "cuda"). false on anything else. */
bool cli_parse_device(const char *s, bool *cuda, int *index);

/* --spec's value: "ngram" (prompt lookup), "draft" (a draft model,
 * --spec-model) or "none" -> *out (an enum llmd_spec, as int so that this
 * header needs no llmd.h). false on anything else. */
bool cli_parse_spec(const char *s, int *out);
#define CLI_SPEC_WANT "ngram, draft or none"

/* --tokenizer-pre NAME, the same in generate, batch, serve, eval and
 * tokenize: a pre-tokenizer llmd implements (tok_pre_parse). */
bool cli_parse_pre(const char *s);
#define CLI_PRE_WANT "gpt-2, llama-bpe or qwen2"
#define CLI_PRE_HELP                                                                               \
    "      --tokenizer-pre P  split text as pre-tokenizer P (gpt-2, llama-bpe, qwen2) instead\n"   \
    "                         of the file's tokenizer.ggml.pre: for a family llmd does not\n"      \
    "                         know by name that splits text as one of those\n"

/* The speculative-decoding options together (spec: an enum llmd_spec;
 * spec_tokens: --spec-tokens, 0 when not given; spec_model: --spec-model,
 * NULL when not given): NULL when they fit, else what is wrong, without
 * the command's name (a static string), the same for generate, batch and
 * serve. Pure. */
const char *cli_spec_check(int spec, long spec_tokens, const char *spec_model);
#define CLI_SPEC_TOKENS "an integer 1..32" /* --spec-tokens: LLMD_SPEC_TOKENS_MAX */

struct option;
/* "--name" of the option getopt_long just returned (c, and its long index
 * li or -1), for error messages. */
const char *cli_opt_name(const struct option *opts, int c, int li);

/* "CMD: invalid value 'ARG' for --name: want WANT" on stderr: every bad
 * flag value says what the flag takes, so no message sends the user to
 * --help for a range. cmd is "llmd serve" etc. */
void cli_bad_value(const char *cmd, const struct option *opts, int c, int li, const char *arg,
                   const char *want);

/* The engine's errbuf (or strerror(-rc) when empty) on stderr as
 * "CMD: reason", without the library's own "llmd: " prefix. A refusal over
 * vm.max_map_count adds the flags of batch and serve that lower it. */
void cli_engine_err(const char *cmd, const char *err, int rc);

/* A note on stderr when --page-size or --kv-budget asked for more than the
 * engine can use and got less: a page is capped at one context (a range
 * never holds more tokens), the pool at every sequence's full context. The
 * requests are the flags' values in bytes (0: not given); the rest is what
 * the engine reports (llmd_engine_info, or kv's own vmm for generate).
 * Rounding (a page up to whole tokens, the budget down to whole pages) is
 * not a cap and prints nothing. */
void cli_kv_caps_note(const char *cmd, uint64_t page_req, uint64_t page_bytes,
                      uint32_t tokens_per_page, uint64_t budget_req, uint64_t kv_pages,
                      uint32_t n_ctx, uint32_t max_seqs);

/* A warning on stderr when the context (--ctx, or n_ctx as resolved)
 * exceeds the model's context_length (n_ctx_train): the model runs, but
 * past its training context its output is not what it was trained for.
 * The same words in generate, batch and serve. */
void cli_ctx_note(const char *cmd, uint32_t n_ctx, uint32_t n_ctx_train);

/* --max-batched-tokens must be >= --max-seqs (0: the engine's defaults, 256
 * and 8): checked with the flags' names before the engine, whose message
 * names config fields, sees them. false (after the message) when not. With
 * speculation on (spec: enum llmd_spec) a budget of --max-seqs exactly is
 * allowed but leaves no token for a draft while every sequence decodes:
 * a warning says so (batch and serve; generate runs one sequence). */
bool cli_check_batching(const char *cmd, long max_seqs, long max_batched, int spec);

/* The most each command reads from a file or stdin. A prompt of a full
 * 1M-token context is ~4 MiB of text; a JSON-lines batch holds many. */
#define CLI_PROMPT_FILE_MAX ((size_t)64 << 20)
#define CLI_EVAL_FILE_MAX   ((size_t)256 << 20)
#define CLI_BATCH_FILE_MAX  ((size_t)1 << 30)

/* Read a whole file ("-" = stdin) of at most max bytes into a
 * NUL-terminated buffer of at most max + 2 bytes; the caller frees it with
 * mem_free(). Returns 0 or -errno: -EFBIG when the file or stream holds
 * more than max bytes (it stops reading at max + 1, so /dev/zero or an
 * endless pipe is refused, not read until memory runs out). */
int cli_read_file(const char *path, size_t max, char **out, size_t *len);

/* cli_read_file()'s rc on stderr as "CMD: cannot read PATH: reason", or for -EFBIG "CMD: PATH is
 * larger than N MiB, the most WHAT may hold"; PATH "-" is named stdin. */
void cli_read_file_err(const char *cmd, const char *what, const char *path, size_t max, int rc);

#endif /* LLMD_CLI_H */
