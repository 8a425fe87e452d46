/* proc_util.h - test helpers that run programs as processes: the
 * build's own `llmd serve` on an ephemeral port (its port read from the
 * start-up line on stdout), `llmd` commands to completion, and any program
 * by argv with stdin fed from a buffer and stdout and stderr captured apart
 * (node, promtool). The build is $LLMD_BUILD (default build/debug), so under
 * the ASan build a leak shows as a non-zero exit code. Assertions run on
 * the test's own thread only. */
#ifndef LLMD_TEST_SERVE_PROC_UTIL_H
#define LLMD_TEST_SERVE_PROC_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static inline const char *serve_build_dir(void) {
    const char *build = getenv("LLMD_BUILD");
    return build && *build ? build : "build/debug";
}

struct proc {
    pid_t pid;
    uint16_t port;
    int err_fd;     /* its stderr */
    char line[256]; /* its start-up line, "llmd serve: listening on http://HOST:PORT" */
};

/* Start `llmd serve ARGS` and read the port from its first stdout line. */
static inline void serve_start(struct proc *p, const char *args) {
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "exec %s/llmd serve %s", serve_build_dir(), args);
    int out[2], err[2];
    cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(err, O_CLOEXEC), 0);
    pid_t parent = getpid();
    p->pid = fork();
    cr_assert_geq(p->pid, 0);
    if (p->pid == 0) {
        /* a failed assertion ends the test process at once: the server
         * must not outlive it (the signal survives the exec) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(out[1], 1);
        dup2(err[1], 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    p->err_fd = err[0];
    char *line = p->line;
    size_t n = 0;
    while (n < sizeof(p->line) - 1) {
        ssize_t k = read(out[0], line + n, 1);
        if (k <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(out[0]);
    const char *colon = strrchr(line, ':');
    cr_assert(strstr(line, "listening on http://") && colon, "start-up line: '%s'", line);
    p->port = (uint16_t)atoi(colon + 1);
}

/* Wait for the process; returns its exit code (128 + signal if killed). */
static inline int serve_wait(struct proc *p, char *err, size_t cap) {
    size_t n = 0;
    ssize_t k;
    while (n < cap - 1 && (k = read(p->err_fd, err + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    err[n] = '\0';
    close(p->err_fd);
    int st;
    cr_assert_eq(waitpid(p->pid, &st, 0), p->pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* SIGTERM, then assert that the server drained and exited 0 (under the
 * ASan build: also without a leak). */
static inline void serve_stop(struct proc *p) {
    char err[8192];
    kill(p->pid, SIGTERM);
    int code = serve_wait(p, err, sizeof(err));
    cr_assert_eq(code, 0, "llmd serve exit %d: %s", code, err);
}

/* Run `llmd ARGS` to completion; its exit code, output in out. */
static inline int llmd_run(const char *args, char *out, size_t cap) {
    char cmd[4096];
    cr_assert_lt((size_t)snprintf(cmd, sizeof(cmd), "%s/llmd %s 2>&1", serve_build_dir(), args),
                 sizeof(cmd), "command too long: %s", args);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "popen: %s", cmd);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* What proc_run() saw: the exit code (127: the program could not be run,
 * 128 + signal if killed) and stdout and stderr, each NUL-terminated.
 * Free with proc_out_free(). */
struct proc_out {
    int code;
    char *out, *err;
    size_t out_len, err_len;
};

static inline void proc_out_free(struct proc_out *o) {
    free(o->out);
    free(o->err);
    o->out = o->err = NULL;
}

/* Append what fd has to *buf; false at end of file. */
static inline bool proc_drain(int fd, char **buf, size_t *len, size_t *cap) {
    if (*len + 4096 > *cap) {
        *cap = *cap * 2 + 4096;
        *buf = realloc(*buf, *cap);
        cr_assert_not_null(*buf);
    }
    ssize_t k = read(fd, *buf + *len, *cap - *len - 1);
    if (k < 0 && errno == EINTR)
        return true;
    if (k <= 0)
        return false;
    *len += (size_t)k;
    return true;
}

/* Run argv[0] (looked up in PATH) with `in` on its stdin, no shell; waits
 * for it. The environment is the test's. */
static inline void proc_run(const char *const argv[], const char *in, size_t in_len,
                            struct proc_out *o) {
    int pin[2], pout[2], perr[2];
    cr_assert_eq(pipe2(pin, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(pout, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(perr, O_CLOEXEC), 0);
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* as in serve_start() */
        if (getppid() != parent)
            _exit(127);
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        dup2(perr[1], 2);
        execvp(argv[0], (char *const *)argv);
        dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    /* never block on stdin while the child waits for its stdout to drain */
    fcntl(pin[1], F_SETFL, O_NONBLOCK);
    signal(SIGPIPE, SIG_IGN); /* a child that exits early: EPIPE, not death */
    memset(o, 0, sizeof(*o));
    size_t cap_out = 0, cap_err = 0, sent = 0;
    struct pollfd fds[3] = {{.fd = pout[0], .events = POLLIN},
                            {.fd = perr[0], .events = POLLIN},
                            {.fd = pin[1], .events = POLLOUT}};
    if (in_len == 0) {
        close(pin[1]);
        fds[2].fd = -1;
    }
    while (fds[0].fd >= 0 || fds[1].fd >= 0) {
        if (poll(fds, 3, -1) < 0) {
            cr_assert_eq(errno, EINTR, "poll: %s", strerror(errno));
            continue;
        }
        if (fds[0].revents && !proc_drain(fds[0].fd, &o->out, &o->out_len, &cap_out)) {
            close(fds[0].fd);
            fds[0].fd = -1;
        }
        if (fds[1].revents && !proc_drain(fds[1].fd, &o->err, &o->err_len, &cap_err)) {
            close(fds[1].fd);
            fds[1].fd = -1;
        }
        if (fds[2].fd >= 0 && fds[2].revents) {
            /* a child that stops reading (or exits): EPIPE or POLLERR, stop there */
            bool stop = !(fds[2].revents & POLLOUT);
            if (!stop) {
                ssize_t k = write(fds[2].fd, in + sent, in_len - sent);
                if (k > 0)
                    sent += (size_t)k;
                else
                    stop = errno != EAGAIN && errno != EINTR;
            }
            if (stop || sent == in_len) {
                close(fds[2].fd);
                fds[2].fd = -1;
            }
        }
    }
    if (fds[2].fd >= 0)
        close(fds[2].fd);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    o->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (!o->out)
        o->out = calloc(1, 1);
    if (!o->err)
        o->err = calloc(1, 1);
    o->out[o->out_len] = '\0';
    o->err[o->err_len] = '\0';
}

#endif /* LLMD_TEST_SERVE_PROC_UTIL_H */
