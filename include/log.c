/* log.c - leveled diagnostics on stderr (see include/log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int log_level = -1; /* -1: not yet read from LLMD_LOG */

static const char *const log_names[] = {"error", "warn", "info", "debug"};

enum log_level log_get_level(void) {
    int l = atomic_load(&log_level);
    if (l >= 0)
        return (enum log_level)l;
    l = LOG_LEVEL_WARN;
    const char *env = getenv("LLMD_LOG");
    for (int i = 0; env && i <= LOG_LEVEL_DEBUG; i++)
        if (strcmp(env, log_names[i]) == 0)
            l = i;
    atomic_store(&log_level, l);
    return (enum log_level)l;
}

void log_set_level(enum log_level level) {
    atomic_store(&log_level, (int)level);
}

void log_msg(enum log_level level, const char *module, const char *fmt, ...) {
    if ((int)level > (int)log_get_level())
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "llmd: %s: %s: %s\n", module, log_names[level], line);
}

void log_errbuf(char *buf, size_t len, const char *fmt, ...) {
    if (!buf || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}
