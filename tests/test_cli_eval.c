/* `llmd eval` through the real binary: the table and the JSON lines it
 * prints, and its refusals. The figures themselves are pinned by
 * test_model_kvquant.c; here the first 256 tokens keep it quick. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/lib/proc_util.h"
#include "tests/lib/ref_util.h"

#define F32  REF_MODELS "/stories260K-f32.gguf"
#define TEXT "tests/data/kv_eval_stories.txt"

struct out {
    int code;
    char text[16384]; /* stdout then stderr */
};

/* Run `llmd ARGS`, stdout then stderr into o->text (tests/lib/proc_util.h). */
static void llmd(struct out *o, const char *args) {
    o->code = llmd_run(args, o->text, sizeof(o->text));
}

Test(cli_eval, table_names_every_type, .timeout = 60) {
    struct out o;
    llmd(&o, "eval -m " F32 " -f " TEXT " -n 256 -t 1");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd eval: stories260K-f32, 256 tokens in windows of 128, 256 "
                             "predictions a type\n"),
              "%s", o.text);
    static const char *const rows[] = {"\nf32            1280            0            0  100.00%",
                                       "\nf16             640 ", "\nq8_0            384 ",
                                       "\nq4_0            192 ", "\nfp8             512 "};
    for (int i = 0; i < 5; i++)
        cr_assert(strstr(o.text, rows[i]), "no '%s' in:\n%s", rows[i] + 1, o.text);
}

Test(cli_eval, json_lines_one_a_type, .timeout = 60) {
    struct out o;
    llmd(&o, "eval -m " F32 " -f " TEXT " -n 200 -k q8_0,q8_0 --json -w 64");
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    const char *p = o.text;
    const char *want[] = {"f32", "q8_0", "q8_0"};
    double kl[3];
    for (int i = 0; i < 3; i++) {
        json_error_t e;
        json_t *j = json_loadb(p, strcspn(p, "\n"), 0, &e);
        cr_assert_not_null(j, "line %d: %s in %s", i, e.text, o.text);
        cr_assert_str_eq(json_string_value(json_object_get(j, "kv_type")), want[i]);
        cr_assert_eq(json_integer_value(json_object_get(j, "tokens")), 200);
        cr_assert_eq(json_integer_value(json_object_get(j, "window")), 64);
        cr_assert_eq(json_integer_value(json_object_get(j, "predictions")), 200);
        kl[i] = json_real_value(json_object_get(j, "kl_mean"));
        json_decref(j);
        p = strchr(p, '\n') + 1;
    }
    cr_assert_eq(*p, '\0', "three lines only: %s", o.text);
    cr_assert_eq(kl[0], 0);
    cr_assert(kl[1] > 0 && kl[1] == kl[2], "the same type twice gives the same KL: %g %g", kl[1],
              kl[2]);
}

Test(cli_eval, bad_input_is_refused, .timeout = 60) {
    struct out o;
    llmd(&o, "eval -m " F32 " -f " TEXT " -k q8_0,q5");
    cr_assert_eq(o.code, 2);
    cr_assert_str_eq(o.text, "llmd eval: invalid value 'q8_0,q5' for --kv-types: want a "
                             "comma-separated list of f32, f16, q8_0, q4_0, fp8 (at most 8)\n");
    llmd(&o, "eval -m " F32 " -f " TEXT " -k q8_0,");
    cr_assert_eq(o.code, 2, "%s", o.text);
    llmd(&o, "eval -m " F32);
    cr_assert_eq(o.code, 2);
    cr_assert(strstr(o.text, "-m MODEL and -f TEXT are required"), "%s", o.text);
    llmd(&o, "eval -m " F32 " -f /nonexistent.txt");
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.text, "cannot read /nonexistent.txt"), "%s", o.text);
    llmd(&o, "eval -m " F32 " -f " TEXT " -w 1000");
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.text, "window 1000, context 128"), "%s", o.text);
}
