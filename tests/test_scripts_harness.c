/* The suite's own shell scripts, run on scratch trees under /tmp:
 * tests/layers.sh (the layer rules make test checks) on a throwaway git
 * repository that holds a copy of it, so its file list and include rules
 * are tried on files made to break them; tests/run.sh on fake test
 * binaries (shell scripts), for its time limit. Each test removes its tree. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static void setup(void) {
    strcpy(dir, "/tmp/llmd-scripts-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Run `sh -c CMD` in dir: stdout and stderr together into out; returns the exit code. */
static int run_in_dir(const char *cmd, char *out, size_t len) {
    char full[2048];
    snprintf(full, sizeof full, "cd '%s' && { %s; } 2>&1", dir, cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void put(const char *rel, const char *text) {
    char path[256], cmd[512];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    cr_assert_eq(system(cmd), 0);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

TestSuite(layers_sh, .init = setup, .fini = teardown, .timeout = 60);

/* A repository with the script and one good file: tracked, includes what
 * engine/serve may (a quoted model header, system headers). */
static void layers_repo(void) {
    char cmd[512], out[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/tests' && cp tests/layers.sh '%s/tests/'", dir, dir);
    cr_assert_eq(system(cmd), 0);
    put("engine/serve/ok.c", "#include <stdio.h>\n#include \"engine/model/gguf.h\"\n");
    put(".gitignore", "ignored.c\n");
    cr_assert_eq(run_in_dir("git init -q . && git add tests engine .gitignore", out, sizeof out), 0,
                 "%s", out);
    cr_assert_eq(run_in_dir("tests/layers.sh", out, sizeof out), 0, "%s", out);
}

/* regress: layers.sh read only `git ls-files`, so a new file nobody had
 * added yet broke the rules unseen. Untracked files are checked; ignored
 * ones are not. */
Test(layers_sh, regress_an_untracked_file_is_checked) {
    layers_repo();
    char out[4096];
    put("engine/serve/ignored.c", "#include \"engine/core/sched.h\"\n");
    cr_assert_eq(run_in_dir("tests/layers.sh", out, sizeof out), 0, "ignored: %s", out);
    put("engine/serve/new.c", "#include \"engine/core/sched.h\"\n");
    cr_assert_eq(run_in_dir("tests/layers.sh", out, sizeof out), 1, "%s", out);
    cr_assert_str_eq(out, "layers: engine/serve/new.c includes \"engine/core/sched.h\" "
                          "(engine/core/sched.h): engine/serve may include only: engine/serve "
                          "include engine/model/gguf.h engine/model/tok.h\n");
}

/* regress: only quoted includes were read, so `#include <engine/core/sched.h>`
 * (which compiles through -I.) passed. An angle include that names a folder
 * of the repository is held to the same table; system headers are not. */
Test(layers_sh, regress_an_angle_include_of_a_repository_folder_is_checked) {
    layers_repo();
    char out[4096];
    put("engine/serve/angle.c", "#include <pthread.h>\n#include <engine/core/sched.h>\n"
                                "  #  include <tests/lib/ref_util.h>\n");
    cr_assert_eq(run_in_dir("git add engine && tests/layers.sh", out, sizeof out), 1, "%s", out);
    cr_assert_str_eq(out, "layers: engine/serve/angle.c includes <engine/core/sched.h> "
                          "(engine/core/sched.h): engine/serve may include only: engine/serve "
                          "include engine/model/gguf.h engine/model/tok.h\n"
                          "layers: engine/serve/angle.c includes <tests/lib/ref_util.h> "
                          "(tests/lib/ref_util.h): engine/serve may include only: engine/serve "
                          "include engine/model/gguf.h engine/model/tok.h\n");
}

TestSuite(run_sh, .init = setup, .fini = teardown, .timeout = 60);

/* The command that runs this tree's tests/run.sh from dir, without make test's count file
 * (its figures would be added to the suite's). */
static const char *run_sh(void) {
    static char cmd[600];
    char cwd[512];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(cmd, sizeof cmd, "env -u LLMD_TEST_COUNTS '%s/tests/run.sh'", cwd);
    return cmd;
}

/* regress: LLMD_TEST_TIMEOUT=0 removed the limit without a word (timeout(1)
 * takes 0 as none) and -1 or abc were reported as a failed test (rc=125).
 * Each is now a usage error that names the variable, before any test runs. */
Test(run_sh, regress_a_bad_time_limit_is_a_usage_error) {
    const char *bad[] = {"0", "-1", "abc", "1.5", "00"};
    put("never", "#!/bin/sh\necho ran\n");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char cmd[1024], out[4096], want[256];
        snprintf(cmd, sizeof cmd, "chmod +x never && LLMD_TEST_TIMEOUT='%s' %s ./never", bad[i],
                 run_sh());
        cr_assert_eq(run_in_dir(cmd, out, sizeof out), 2, "%s: %s", bad[i], out);
        snprintf(want, sizeof want,
                 "run.sh: LLMD_TEST_TIMEOUT must be a positive whole number of seconds, "
                 "not '%s'\n",
                 bad[i]);
        cr_assert_str_eq(out, want);
    }
}

/* regress: a binary killed at the limit printed a blank line where its
 * output should be (Criterion reports at the end, so there often is none):
 * it is named, with the end of its output or "(no output before the limit)". */
Test(run_sh, regress_a_timed_out_binary_is_named_with_the_end_of_its_output) {
    put("silent", "#!/bin/sh\nexec sleep 30\n");
    put("talks", "#!/bin/sh\necho 'first line'\necho 'last line'\nexec sleep 30\n");
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "chmod +x silent talks && LLMD_TEST_TIMEOUT=1 %s ./silent ./talks",
             run_sh());
    cr_assert_eq(run_in_dir(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "./silent: timed out after 1 s (LLMD_TEST_TIMEOUT); the end of its "
                          "output:\n(no output before the limit)\n"),
              "%s", out);
    cr_assert(strstr(out, "./talks: timed out after 1 s (LLMD_TEST_TIMEOUT); the end of its "
                          "output:\nfirst line\nlast line\n"),
              "%s", out);
    cr_assert(strstr(out, "bad: ./silent (timed out after 1 s)\nbad: ./talks (timed out after 1 "
                          "s)\n0 passed, 2 failed\n"),
              "%s", out);
}
