/* `llmd tokenize` and `llmd vocab` as a user runs them: stories260K's ids
 * of a prompt (its reference: BOS + " Once" " upon" " a" " time"), the
 * JSON form, --no-bos; every usage and file error with its exit code and
 * a message that names what is wrong. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/proc_util.h"
#include "tests/lib/ref_util.h"
#include "tests/lib/tok_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

static char dir[64], out[65536];

static void setup(void) {
    strcpy(dir, "/tmp/llmd-tokcli-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(cli_tokenize, .init = setup, .fini = teardown, .timeout = 60);

static const char *file(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

Test(cli_tokenize, a_prompts_ids_as_the_engine_sees_them) {
    cr_assert_eq(llmd_run("tokenize -m " F32 " -p 'Once upon a time'", out, sizeof out), 0, "%s",
                 out);
    cr_assert_str_eq(out, "1\t\"\"\n403\t\" Once\"\n407\t\" upon\"\n261\t\" a\"\n378\t\" time\"\n");
    cr_assert_eq(llmd_run("tokenize -m " F32 " --ids -p 'Once upon a time'", out, sizeof out), 0);
    cr_assert_str_eq(out, "[1, 403, 407, 261, 378]\n");
    cr_assert_eq(
        llmd_run("tokenize -m " F32 " --ids --no-bos -p 'Once upon a time'", out, sizeof out), 0);
    cr_assert_str_eq(out, "[403, 407, 261, 378]\n");
    char args[512];
    snprintf(args, sizeof args, "tokenize -m " F32 " --ids -f %s",
             file("p.txt", "Once upon a time"));
    cr_assert_eq(llmd_run(args, out, sizeof out), 0);
    cr_assert_str_eq(out, "[1, 403, 407, 261, 378]\n", "a file's bytes: the same");
    /* "<s>" in user text is text, not BOS */
    cr_assert_eq(llmd_run("tokenize -m " F32 " --ids --no-bos -p '<s>'", out, sizeof out), 0);
    cr_assert(!strstr(out, "[1]") && !strstr(out, "[1,"), "%s", out);
}

Test(cli_tokenize, usage_and_file_errors) {
    cr_assert_eq(llmd_run("tokenize -p x", out, sizeof out), 2);
    cr_assert(strstr(out, "-m and one of -p or -f are required"), "%s", out);
    cr_assert_eq(llmd_run("tokenize -m " F32 " -p x -f y", out, sizeof out), 2);
    cr_assert(strstr(out, "-p and -f exclude each other"), "%s", out);
    cr_assert_eq(llmd_run("tokenize -m " F32 " -f /tmp", out, sizeof out), 1);
    cr_assert(strstr(out, "cannot read /tmp: Is a directory"), "%s", out);
    /* dummy models as every other command takes them: byte tokens after BOS */
    cr_assert_eq(llmd_run("tokenize -m dummy:tiny --ids -p hi", out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "[1, 259, 107, 108]\n");
    cr_assert_eq(llmd_run("tokenize -m " F32 " -p x extra", out, sizeof out), 2);
    cr_assert(strstr(out, "unexpected argument 'extra'"), "%s", out);
    cr_assert_eq(llmd_run("tokenize -m /nonexistent.gguf -p x", out, sizeof out), 1);
    cr_assert(strstr(out, "/nonexistent.gguf"), "%s", out);
    cr_assert_eq(llmd_run("tokenize -m " F32 " -f /nonexistent.txt", out, sizeof out), 1);
    cr_assert(strstr(out, "cannot read /nonexistent.txt"), "%s", out);
    cr_assert_eq(llmd_run("tokenize -m " F32 " -f /dev/zero", out, sizeof out), 1);
    cr_assert(strstr(out, "/dev/zero is larger than 64 MiB, the most a text to tokenize may hold"),
              "%s", out);
    cr_assert_eq(llmd_run("tokenize --help", out, sizeof out), 0);
    cr_assert(strstr(out, "usage: llmd tokenize"), "%s", out);
}

/* A tokenizer.json of three tokens and one merge, pre-tokenized by split. */
static const char *tiny_json(const char *model_type, const char *split) {
    static char j[2048];
    snprintf(j, sizeof j,
             "{\"added_tokens\": [{\"id\": 3, \"content\": \"<|end|>\", \"special\": true}],"
             " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
             "\"Split\", \"pattern\": {\"Regex\": %s}}, {\"type\": \"ByteLevel\"}]},"
             " \"model\": {\"type\": \"%s\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2},"
             " \"merges\": [\"a b\"]}}",
             split, model_type);
    return j;
}

#define QWEN2_RE                                                                                   \
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "            \
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\""

Test(cli_tokenize, vocab_writes_what_tokenize_reads_and_refuses_what_it_cannot) {
    char args[1024], gg[256];
    snprintf(gg, sizeof gg, "%s/v.gguf", dir);
    snprintf(args, sizeof args, "vocab -i %s -o %s", file("t.json", tiny_json("BPE", QWEN2_RE)),
             gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "wrote 4 tokens, 1 merges (pre-tokenizer qwen2)"), "%s", out);
    snprintf(args, sizeof args, "tokenize -m %s --ids -p 'abba'", gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "[2, 1, 0]\n", "ab merged, then b, a");
    snprintf(args, sizeof args, "tokenize -m %s --ids -p '<|end|>'", gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 0, "%s", out);
    cr_assert(!strstr(out, "3"), "the special token from user text: %s", out);
    /* a regex llmd does not implement: refused, unless --pre says which */
    snprintf(args, sizeof args, "vocab -i %s -o %s",
             file("u.json", tiny_json("BPE", "\"\\\\w+|\\\\s+\"")), gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "is not one llmd implements (gpt-2, llama-bpe, qwen2); --pre NAME"), "%s",
              out);
    snprintf(args, sizeof args, "vocab -i %s/u.json --pre gpt-2 -o %s", dir, gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "vocab -i %s/u.json --pre bogus -o %s", dir, gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "'bogus'") && strstr(out, "gpt-2, llama-bpe or qwen2"), "%s", out);
    snprintf(args, sizeof args, "vocab -i %s -o %s",
             file("w.json", tiny_json("WordPiece", QWEN2_RE)), gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "model.type is 'WordPiece': only BPE"), "%s", out);
    snprintf(args, sizeof args, "vocab -i %s -o %s", file("bad.json", "{\"model\": "), gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "bad.json"), "%s", out);
    cr_assert_eq(llmd_run("vocab -o x.gguf", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--tokenizer and --output are required") && strstr(out, "usage:"), "%s",
              out);
    snprintf(args, sizeof args, "vocab -i %s -o %s", file("cfg.json", "{\"bos_token\": \"x\"}"),
             gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "has no \"model\" object: not a tokenizer.json"), "%s", out);
    /* an id far past the entries (gigabytes of padding) and an id given twice */
    snprintf(args, sizeof args, "vocab --pre gpt-2 -i %s -o %s",
             file("huge.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
                               "\"merges\": []}, \"added_tokens\": [{\"id\": 2147483646, "
                               "\"content\": \"x\", \"special\": true}]}"),
             gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "token id 2147483646 is far past the file's 3 tokens"), "%s", out);
    snprintf(args, sizeof args, "vocab --pre gpt-2 -i %s -o %s",
             file("dup.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, "
                              "\"merges\": []}}"),
             gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "gives id 0 to both 'a' and 'b'"), "%s", out);
    /* a vocabulary alone is no model: generate says what it is */
    snprintf(args, sizeof args, "vocab -i %s/t.json -o %s", dir, gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "generate -m %s -p x -n 1", gg);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "has no tensors: a vocabulary-only GGUF"), "%s", out);
}

/* --tokenizer-pre: a file whose tokenizer.ggml.pre llmd does not know is
 * refused, naming the flag; with it, tokenize (and every command that loads
 * a model: generate, batch, serve, eval) splits as the pre named; a name
 * llmd does not know is a usage error. */
Test(cli_tokenize, tokenizer_pre_overrides_an_unknown_pre) {
    struct tt_gguf b;
    static const char *const toks[] = {"a", "b", "ab"};
    static const char *const merges[] = {"a b"};
    tt_gguf_init(&b);
    tt_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tt_kv_str(&b, "tokenizer.ggml.pre", "deepseek-llm");
    tt_kv_strs(&b, "tokenizer.ggml.tokens", toks, 3);
    tt_kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
    tt_gguf_finish(&b);
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/deepseek.gguf", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b.buf, 1, b.len, f), b.len);
    fclose(f);
    snprintf(args, sizeof args, "tokenize -m %s --ids -p abba", path);
    cr_assert_eq(llmd_run(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "'deepseek-llm' is not a pre-tokenizer llmd implements") &&
                  strstr(out, "--tokenizer-pre"),
              "%s", out);
    snprintf(args, sizeof args, "tokenize -m %s --ids -p abba --tokenizer-pre qwen2", path);
    cr_assert_eq(llmd_run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[2, 1, 0]\n"), "ab merged, then b, a: %s", out);
    cr_assert(strstr(out, "overridden"), "the override is logged: %s", out);
    snprintf(args, sizeof args, "tokenize -m %s -p abba --tokenizer-pre bogus", path);
    cr_assert_eq(llmd_run(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "'bogus' for --tokenizer-pre: want gpt-2, llama-bpe or qwen2"), "%s",
              out);
    /* the same check in the other commands, before any model loads */
    static const char *const cmds[] = {"generate", "batch", "serve", "eval"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "%s -m %s --tokenizer-pre bogus", cmds[i], path);
        cr_assert_eq(llmd_run(args, out, sizeof out), 2, "%s: %s", cmds[i], out);
        cr_assert(strstr(out, "want gpt-2, llama-bpe or qwen2"), "%s: %s", cmds[i], out);
    }
    /* and the engine takes it: generate on a stories260K file is refused (SentencePiece) */
    cr_assert_eq(llmd_run("generate -m " F32 " -p x -n 1 --tokenizer-pre gpt-2", out, sizeof out),
                 1, "%s", out);
    cr_assert(strstr(out, "SentencePiece"), "%s", out);
}
