/* `llmd batch` end to end through the real binary: JSON lines in and out,
 * bad input refused clearly, and the NVMe tier carrying cached prefixes from
 * one process to the next (issue 5: "process 1 exits; process 2 ... prefills
 * at most one page's worth", read from the per-request counts it prints).
 * Under the ASan build a leak makes the exit code non-zero. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

struct out {
    int code;
    char text[65536]; /* stdout, then stderr when asked */
};

static void llmd(struct out *o, const char *args, bool with_stderr) {
    const char *build = getenv("LLMD_BUILD");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/llmd %s %s", build ? build : "build/debug", args,
             with_stderr ? "2>&1" : "2>/dev/null");
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(o->text, 1, sizeof o->text - 1, p);
    o->text[n] = '\0';
    int st = pclose(p);
    o->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char dir[64];

static void setup(void) {
    strcpy(dir, "/tmp/llmd-batch-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(cli_batch, .init = setup, .fini = teardown, .timeout = 120);

static void write_file(const char *name, const char *text, char *path, size_t len) {
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, 0600);
}

/* The JSON object of output line i (0-based); caller decrefs. */
static json_t *line(const char *text, int i) {
    const char *p = text;
    for (int k = 0; k < i && p; k++)
        p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
    cr_assert_not_null(p, "no line %d in: %s", i, text);
    json_error_t err;
    json_t *j = json_loadb(p, strcspn(p, "\n"), 0, &err);
    cr_assert_not_null(j, "line %d: %s", i, err.text);
    return j;
}

static long field(json_t *j, const char *k) {
    json_t *v = json_object_get(j, k);
    cr_assert(json_is_integer(v), "no integer %s", k);
    return (long)json_integer_value(v);
}

Test(cli_batch, prompts_in_json_lines_out_in_order) {
    char in[128], args[1024];
    write_file("in.jsonl",
               "{\"id\": \"a\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n"
               "\n"
               "{\"prompt\": \"Lily had a red ball\", \"max_tokens\": 5, \"temperature\": 0}\n",
               in, sizeof in);
    struct out o;
    snprintf(args, sizeof args, "batch -m %s -i %s --ctx 256", F32, in);
    llmd(&o, args, false);
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    json_t *a = line(o.text, 0), *b = line(o.text, 1);
    cr_assert_str_eq(json_string_value(json_object_get(a, "id")), "a");
    cr_assert_eq(field(a, "completion_tokens"), 8);
    cr_assert_str_eq(json_string_value(json_object_get(a, "finish_reason")), "length");
    cr_assert_eq(field(b, "id"), 1, "no id: the line's index");
    cr_assert_eq(field(b, "completion_tokens"), 5);
    cr_assert_gt(field(b, "prompt_tokens"), 3);
    /* greedy text equals llmd generate's for the same prompt */
    struct out g;
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 8 --temp 0 --ctx 256 --no-echo -q", F32);
    llmd(&g, args, false);
    cr_assert_eq(g.code, 0);
    g.text[strcspn(g.text, "\n")] = '\0'; /* generate ends its text with a newline */
    cr_assert_str_eq(json_string_value(json_object_get(a, "text")), g.text);
    json_decref(a);
    json_decref(b);
}

Test(cli_batch, bad_input_is_refused_with_the_line_number) {
    char in[128], args[1024];
    write_file("bad.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": 7}\n", in, sizeof in);
    struct out o;
    snprintf(args, sizeof args, "batch -m %s -i %s", F32, in);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "line 2: expected an object with a string \"prompt\""), "%s", o.text);
    write_file("bad2.jsonl", "{\"prompt\": \"ok\"\n", in, sizeof in);
    snprintf(args, sizeof args, "batch -m %s -i %s", F32, in);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.text, "line 1:"), "%s", o.text);
    write_file("bad3.jsonl", "{\"prompt\": \"ok\", \"tenant\": \"acme\"}\n", in, sizeof in);
    snprintf(args, sizeof args, "batch -m %s -i %s", F32, in);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.text, "request 1: \"tenant\" must be an integer id"), "%s", o.text);
    snprintf(args, sizeof args, "batch -m %s --nvme-tier %s/x.slots", F32, dir);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.text, "--nvme-tier needs --host-tier"), "%s", o.text);
    snprintf(args, sizeof args, "batch -m %s --host-tier 12Q", F32);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.text, "bad value for --host-tier: '12Q'"), "%s", o.text);
}

/* Two processes on one NVMe slot file: the second prefills at most a page
 * (16 tokens) plus its own question of the 400-token document the first
 * one left behind, and prints the same text as a run without any cache. */
Test(cli_batch, nvme_tier_carries_a_prefix_to_the_next_process) {
    /* 400 tokens of document: a fixed string the tokenizer splits finely */
    char doc[4096] = "";
    for (int i = 0; i < 20; i++) /* 20 tokens each */
        strcat(doc, "The little dog ran to the big red barn and saw a cat. ");
    static char json1[8192], json2[8192];
    snprintf(json1, sizeof json1,
             "{\"prompt\": \"%s Where did the dog run?\", \"max_tokens\": 12}\n", doc);
    snprintf(json2, sizeof json2,
             "{\"prompt\": \"%s What did the dog see?\", \"max_tokens\": 12}\n", doc);
    char in1[128], in2[128], secret[128], args[2048];
    write_file("q1.jsonl", json1, in1, sizeof in1);
    write_file("q2.jsonl", json2, in2, sizeof in2);
    write_file("secret", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
               secret, sizeof secret);
    const char *common = "--ctx 512 --kv-type f32 --host-tier 4M --offload-always";
    struct out o1, o2, plain;
    snprintf(args, sizeof args,
             "batch -m %s -i %s %s --nvme-tier %s/kv.slots,32M --prefix-secret %s", F32, in1,
             common, dir, secret);
    llmd(&o1, args, false);
    cr_assert_eq(o1.code, 0, "process 1: %s", o1.text);
    snprintf(args, sizeof args,
             "batch -m %s -i %s %s --nvme-tier %s/kv.slots,32M --prefix-secret %s", F32, in2,
             common, dir, secret);
    llmd(&o2, args, false);
    cr_assert_eq(o2.code, 0, "process 2: %s", o2.text);
    snprintf(args, sizeof args, "batch -m %s -i %s --ctx 512", F32, in2);
    llmd(&plain, args, false);
    cr_assert_eq(plain.code, 0);
    json_t *a = line(o1.text, 0), *b = line(o2.text, 0), *c = line(plain.text, 0);
    long prompt = field(b, "prompt_tokens"), cached = field(b, "cached_tokens");
    cr_assert_gt(field(a, "prompt_tokens"), 400, "the document must be 400+ tokens");
    cr_assert_eq(field(a, "restored_tokens"), 0, "process 1 starts empty");
    cr_assert_eq(field(b, "restored_tokens"), cached, "process 2's hit came from NVMe");
    cr_assert_geq(cached, 384, "process 2 restored %ld of %ld prompt tokens", cached, prompt);
    cr_assert_str_eq(json_string_value(json_object_get(b, "text")),
                     json_string_value(json_object_get(c, "text")),
                     "restored pages changed the text");
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

/* --nvme-tier pointed at a file that is not a tier (a typo): refused, the
 * file left as it was, no index left behind. The tier used to cut it to the
 * tier's size and write slots over it. A directory leaves no index either. */
Test(cli_batch, nvme_tier_refuses_to_overwrite_a_file_that_is_not_a_tier) {
    char in[128], precious[128], args[1024], idx[160];
    write_file("in.jsonl", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n", in,
               sizeof in);
    static char text[300000];
    for (size_t i = 0; i + 1 < sizeof text; i++)
        text[i] = (char)('a' + i % 26);
    write_file("precious.txt", text, precious, sizeof precious);
    struct out o;
    snprintf(args, sizeof args, "batch -m %s -i %s --host-tier 1M --nvme-tier %s,1M", F32, in,
             precious);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "not overwriting it"), "%s", o.text);
    struct stat sb;
    cr_assert_eq(stat(precious, &sb), 0);
    cr_assert_eq(sb.st_size, (off_t)sizeof text - 1, "the file was cut to %ld bytes",
                 (long)sb.st_size);
    FILE *f = fopen(precious, "r");
    cr_assert_not_null(f);
    static char back[sizeof text];
    cr_assert_eq(fread(back, 1, sizeof back, f), sizeof text - 1);
    fclose(f);
    cr_assert_arr_eq(back, text, sizeof text - 1, "the file was overwritten");
    snprintf(idx, sizeof idx, "%s.idx", precious);
    cr_assert_neq(stat(idx, &sb), 0, "an index was left behind");
    /* a directory: refused, no index left either */
    snprintf(args, sizeof args, "batch -m %s -i %s --host-tier 1M --nvme-tier %s,1M", F32, in, dir);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    snprintf(idx, sizeof idx, "%s.idx", dir);
    cr_assert_neq(stat(idx, &sb), 0, "an index was left behind");
}

/* An NVMe tier smaller than one slot is refused with the size it needs
 * (it said "bad config: 1 bytes make 0 slots of 20480"). */
Test(cli_batch, nvme_tier_smaller_than_a_page_says_how_much) {
    char in[128], args[1024];
    write_file("in.jsonl", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n", in,
               sizeof in);
    struct out o;
    snprintf(args, sizeof args,
             "batch -m %s -i %s --kv-type f32 --host-tier 1M --nvme-tier %s/kv.slots,20479", F32,
             in, dir);
    llmd(&o, args, true);
    cr_assert_eq(o.code, 1, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "kv.slots: 20479 bytes hold no slot of 20480 bytes"), "%s", o.text);
    cr_assert(strstr(o.text, "give at least 20480"), "%s", o.text);
}
