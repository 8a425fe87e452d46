/* `llmd dummy` through the build's own binary: it writes a model that
 * loads, and its usage errors say what is wrong. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/proc_util.h"

struct out {
    int code;
    char text[8192]; /* stdout then stderr */
};

/* Run `llmd ARGS`, stdout then stderr into o->text (tests/lib/proc_util.h). */
static void llmd(struct out *o, const char *args) {
    o->code = llmd_run(args, o->text, sizeof(o->text));
}

/* regress: a stray argument said "--shape and --output are required",
 * though both were there. */
Test(cli_dummy, regress_an_extra_argument_is_named, .timeout = 60) {
    char path[64], args[256];
    snprintf(path, sizeof(path), "/tmp/llmd-dummy-%d.gguf", getpid());
    struct out o;
    snprintf(args, sizeof(args), "dummy --shape tiny --type q8_0 -o %s extra", path);
    llmd(&o, args);
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    cr_assert_str_eq(o.text, "llmd dummy: unexpected argument 'extra'\n");
    struct stat st;
    cr_assert_neq(stat(path, &st), 0, "nothing is written");
    llmd(&o, "dummy --shape tiny");
    cr_assert_eq(o.code, 2, "exit %d: %s", o.code, o.text);
    cr_assert(strstr(o.text, "llmd dummy: --shape and --output are required\n"), "%s", o.text);
    snprintf(args, sizeof(args), "dummy --shape tiny --type q8_0 -o %s", path);
    llmd(&o, args);
    cr_assert_eq(o.code, 0, "exit %d: %s", o.code, o.text);
    snprintf(args, sizeof(args), "generate -m %s -p hi -n 2 -q", path);
    llmd(&o, args);
    unlink(path);
    cr_assert_eq(o.code, 0, "the written model runs: exit %d: %s", o.code, o.text);
}
